"""`TransformerXLCausalLMPreprocessor`: strings in, token ids out, in the graph.

keras-hub's `CausalLMPreprocessor` with Transformer-XL's conventions: no
start token (the model's context is its memory, not a `<bos>`), no end
token added by default (the word tokenizers already turn each newline into
`<eos>`), and one more way to read text besides keras-hub's independent
samples: `ordered_segments`, the paper's ordered batching for the stateful
model, so `fit()` on strings carries the memory across segments.
"""

import keras
import numpy as np
import tensorflow as tf
from keras_hub.models import CausalLMPreprocessor

# The tokenizer layers a preset's preprocessor names are registered with the
# preprocessor (keras-hub's own `CausalLM.from_preset` deserializes them).
from keras_txl import tokenizers  # noqa: F401
from keras_txl.backbone import TransformerXLBackbone
from keras_txl.checks import boolean
from keras_txl.checks import positive_int
from keras_txl.limits import ENVIRONMENT_VARIABLE
from keras_txl.limits import resolve_limits


def shuffle_in(dataset):
    """How a `tf.data` pipeline shuffles: "reshuffles" (a `shuffle` that
    draws another order at every pass, the default, which
    `Dataset.list_files` also uses), "shuffles" (a fixed order, with
    `reshuffle_each_iteration=False`) or None, found by walking its input
    datasets (those made inside a mapped function are not seen)."""
    found, pending, seen = None, [dataset], set()
    while pending:
        node = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if hasattr(node, "_reshuffle_each_iteration"):  # shuffle_op._ShuffleDataset
            if node._reshuffle_each_iteration in (None, True):
                return "reshuffles"
            found = "shuffles"
        try:
            pending.extend(node._inputs())
        except (AttributeError, NotImplementedError, TypeError):
            pass
        # A file reader (TextLineDataset, ...) over a dataset of file names
        # lists no inputs; its reader dataset reads them.
        if isinstance(getattr(node, "_impl", None), tf.data.Dataset):
            pending.append(node._impl)
    return found


def _sequence_length(value, allow_none=False):
    """`value` as a positive int no larger than `Limits.max_sequence_length`
    (or None, where `allow_none`). The packer fills a `(batch,
    sequence_length)` array: a typo such as 10**12 was a MemoryError from
    inside keras-hub (or, below that, the process killed for memory).
    The bound is not the model's `segment_length`: a Transformer-XL reads
    longer inputs segment by segment with its memory, so no model limit
    applies; it is the library's bound on any length (`keras_txl.limits`),
    the one a loaded config's `segment_length` and `memory_length` have,
    and is raised the same way."""
    value = positive_int("sequence_length", value, allow_none=allow_none)
    limit = resolve_limits().max_sequence_length
    if value is not None and value > limit:
        raise ValueError(
            f"`sequence_length` must be at most {limit} (the limit "
            f"max_sequence_length: each row is packed to this many ids). "
            f"Received: sequence_length={value}. For a longer one, set "
            f"{ENVIRONMENT_VARIABLE}='{{\"max_sequence_length\": ...}}'."
        )
    return value


@keras.saving.register_keras_serializable(package="keras_txl")
class TransformerXLCausalLMPreprocessor(CausalLMPreprocessor):
    """Tokenizes and packs text for `TransformerXLCausalLM`.

    Called on a batch of strings it returns keras-hub's
    `({"token_ids", "padding_mask"}, labels, sample_weight)` for
    independent samples of `sequence_length` tokens; `generate_preprocess`
    / `generate_postprocess` serve `generate()`; `ordered_segments` cuts a
    stream of texts into the ordered `(inputs, targets)` segments of the
    paper for the stateful model.

    Args:
        tokenizer: a `keras_txl.tokenizers.TransformerXLTokenizer`.
        sequence_length: int. Segment length T of training samples.
        add_start_token: bool. Default False (Transformer-XL has none):
            True is a ValueError for a tokenizer without a start token
            (every keras-txl kind), which would add nothing in silence.
        add_end_token: bool. Default False. True appends the tokenizer's
            `end_token_id` (`<eos>`); a ValueError for a kind without one
            (`byte`, `char`, `official_symbols`). Both flags must be bools
            (a string such as "False" is refused, not read as True).

    Example:
    ```python
    preprocessor = TransformerXLCausalLMPreprocessor(tokenizer, sequence_length=64)
    x, y, sample_weight = preprocessor(["a line of text", "another"])
    segments = preprocessor.ordered_segments(tf.data.Dataset.from_tensor_slices(texts), 8)
    ```
    """

    backbone_cls = TransformerXLBackbone

    @classmethod
    def _add_missing_kwargs(cls, loader, kwargs):
        """keras-hub's loaders build the preprocessor of a preset without a
        `preprocessor.json` (a backbone's, or one with its tokenizer alone)
        from the preset's tokenizer: keras-hub finds none for a class with no
        single `tokenizer_cls` and called the constructor without one (a
        TypeError)."""
        from keras_hub.src.utils.preset_utils import check_file_exists

        if "tokenizer" not in kwargs:
            if not check_file_exists(loader.preset, "tokenizer.json"):
                raise ValueError(
                    f"The preset {loader.preset!r} has no tokenizer.json to build a "
                    "TransformerXLCausalLMPreprocessor from (a backbone's preset, "
                    "from TransformerXLBackbone.save_to_preset?): load it with "
                    "keras_txl.TransformerXLCausalLM.from_preset, which builds the "
                    "model without a preprocessor, or TransformerXLBackbone.from_preset."
                )
            kwargs["tokenizer"] = loader.load_tokenizer(tokenizers.TransformerXLTokenizer)
        return super()._add_missing_kwargs(loader, kwargs)

    def save_to_preset(self, preset_dir):
        """keras-hub's `save_to_preset` (`preprocessor.json` and the
        tokenizer's files), written atomically with a `manifest.json` into
        the preset, as `TransformerXLBackbone.save_to_preset` writes
        (`keras_txl.folders.save_preset_part`)."""
        from keras_txl import folders

        folders.save_preset_part(
            preset_dir, lambda folder: CausalLMPreprocessor.save_to_preset(self, folder),
            folders.PREPROCESSOR_ENTRIES)

    def __init__(self, tokenizer, sequence_length=128, add_start_token=False,
                 add_end_token=False, **kwargs):
        if tokenizer is None or not hasattr(tokenizer, "detokenize"):
            raise ValueError(
                "`tokenizer` must be a keras-txl tokenizer layer (with "
                f"tokenize/detokenize), received {type(tokenizer).__name__}."
            )
        sequence_length = _sequence_length(sequence_length)
        # keras-hub's packer reads them as truthy: add_end_token="False" (a
        # config read as text) appended <eos> to every sample in silence.
        add_start_token = boolean("add_start_token", add_start_token)
        add_end_token = boolean("add_end_token", add_end_token)
        super().__init__(
            tokenizer, sequence_length=sequence_length,
            add_start_token=add_start_token, add_end_token=add_end_token,
            **kwargs,
        )
        self._check_special_tokens(ready=False)

    def _check_special_tokens(self, ready=True):
        """A ValueError for `add_start_token` / `add_end_token` when the
        tokenizer has no such token (keras-hub's packer would add nothing).
        `ready=False`: a tokenizer whose vocabulary is not loaded yet (a
        preset's, before `load_preset_assets`) is checked in `build`."""
        for flag, attribute in (("add_start_token", "start_token_id"),
                                ("add_end_token", "end_token_id")):
            if not getattr(self, flag):
                continue
            try:
                token_id = getattr(self.tokenizer, attribute, None)
            except ValueError:
                if ready:
                    raise
                continue
            if token_id is None:
                kind = getattr(self.tokenizer, "kind", type(self.tokenizer).__name__)
                raise ValueError(
                    f"`{flag}=True`, but the {kind!r} tokenizer has no such "
                    f"token ({attribute} is None), so nothing would be "
                    f"added. Pass {flag}=False"
                    + (" (Transformer-XL has no start token: its context is "
                       "the memory)." if flag == "add_start_token" else
                       " or use a kind with <eos> (word, sentencepiece, "
                       "wordpiece).")
                )

    def build(self, input_shape):
        self._check_special_tokens()
        super().build(input_shape)

    # keras-hub reads `sequence_length or self.sequence_length`: a 0 was the
    # default length in silence, and a negative one (or one set later)
    # packed every text to nothing.
    @property
    def sequence_length(self):
        return self._sequence_length

    @sequence_length.setter
    def sequence_length(self, value):
        CausalLMPreprocessor.sequence_length.fset(self, _sequence_length(value))

    def call(self, x, y=None, sample_weight=None, sequence_length=None):
        sequence_length = _sequence_length(sequence_length, allow_none=True)
        return super().call(
            x, y=y, sample_weight=sample_weight, sequence_length=sequence_length
        )

    def generate_preprocess(self, x, sequence_length=None):
        sequence_length = _sequence_length(sequence_length, allow_none=True)
        return super().generate_preprocess(x, sequence_length=sequence_length)

    def ordered_segments(self, texts, batch_size, sequence_length=None,
                         drop_remainder=True):
        """The paper's ordered batches of a dataset of texts, in the graph.

        The texts are tokenized in order into one stream, which is split
        into `batch_size` contiguous streams of `N // batch_size` tokens
        (the last `N % batch_size` dropped); batch k holds segment k of
        every stream: `inputs[b] = stream_b[kT:(k+1)T]`, `targets[b] =
        stream_b[kT+1:(k+1)T+1]`. The same layout as
        `keras_txl.training.data.lm_dataset`, so the memory a stateful
        model carries from one batch to the next belongs to the same text.

        The stream is read twice (once to count its tokens, once per row
        to cut it), never held in memory.

        Args:
            texts: `tf.data.Dataset` of scalar strings, in order; one that
                reshuffles at every pass is refused (`shuffle_in`).
            batch_size: int. Number of streams B.
            sequence_length: int. Segment length T (this preprocessor's
                when None).
            drop_remainder: bool. Drop the last, shorter segment.

        Returns:
            `tf.data.Dataset` of `(inputs (B, T) int32, targets (B, T)
            int32)`.
        """
        batch_size = positive_int("batch_size", batch_size)
        length = _sequence_length(
            self.sequence_length if sequence_length is None else sequence_length
        )
        if not isinstance(texts, tf.data.Dataset) or texts.element_spec != tf.TensorSpec([], tf.string):
            raise ValueError(
                "`texts` must be a tf.data.Dataset of scalar strings, "
                f"received {getattr(texts, 'element_spec', type(texts).__name__)}."
            )
        if shuffle_in(texts) == "reshuffles":
            # Each stream reads the texts again: every row would cut
            # another order (texts repeated in several rows, others lost).
            raise ValueError(
                "`texts` are shuffled anew at every pass (a `shuffle()` with "
                "reshuffle_each_iteration=True, the default, or "
                "`Dataset.list_files` without shuffle=False): ordered segments "
                "read the texts once per stream, so the streams would cut "
                "different orders. Pass the texts in order, or shuffle them with "
                "reshuffle_each_iteration=False."
            )
        tokenizer = self.tokenizer
        tokens = texts.map(
            lambda text: tf.cast(tokenizer.tokenize(text), tf.int32)
        ).unbatch()
        total = int(tokens.reduce(np.int64(0), lambda count, _: count + 1))
        per_stream = total // batch_size
        if per_stream < 2:
            raise ValueError(
                f"`texts` hold {total} tokens: too few for batch_size="
                f"{batch_size} streams of at least 2 tokens."
            )
        segments = (per_stream - 1) // length
        if drop_remainder and segments == 0:
            raise ValueError(
                f"`texts` hold {total} tokens: each of the batch_size="
                f"{batch_size} streams has {per_stream}, fewer than "
                f"sequence_length + 1 = {length + 1}."
            )

        def stream(row):
            tokens_of_row = tokens.skip(row * per_stream).take(per_stream)
            # Windows of T + 1 tokens every T: inputs and shifted targets.
            windows = tokens_of_row.window(length + 1, shift=length, drop_remainder=drop_remainder)
            return windows.flat_map(lambda w: w.batch(length + 1))

        rows = tuple(stream(row) for row in range(batch_size))
        batches = tf.data.Dataset.zip(rows).map(lambda *row: tf.stack(row))
        batches = batches.filter(lambda window: tf.shape(window)[1] > 1)
        # The filter hides the count from tf.data: Keras then warned "Your
        # input ran out of data; interrupting training" at the end of every
        # epoch and showed no total. Windows start every T tokens and keep
        # T + 1 of them (drop_remainder) or at least 2.
        count = segments if drop_remainder else (per_stream - 2) // length + 1
        batches = batches.apply(tf.data.experimental.assert_cardinality(count))
        return batches.map(
            lambda window: (window[:, :-1], window[:, 1:])
        ).prefetch(tf.data.AUTOTUNE)

