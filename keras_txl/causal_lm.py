"""`TransformerXLCausalLM`: the Keras model users train, save and export.

Shape legend: B batch, T segment, L num_layers, M memory_length,
D hidden_dim, V vocabulary_size.
"""

import copy
import dataclasses
import math
import numbers
import os
import warnings

import keras
import numpy as np
import tensorflow as tf
from keras import ops
from keras import tree
from keras.src.utils import tracking
from keras_hub.models import CausalLM
from keras_hub.samplers import Sampler

from keras_txl import checks
from keras_txl import folders
from keras_txl.adaptive import AdaptiveSoftmax
from keras_txl.backbone import SubclassedModelType
from keras_txl.backbone import TransformerXLBackbone
from keras_txl.causal_lm_preprocessor import TransformerXLCausalLMPreprocessor
from keras_txl.causal_lm_preprocessor import shuffle_in
from keras_txl.config import TransformerXLConfig
from keras_txl.decoding import clamp_top_k
from keras_txl.decoding import decode_loop
from keras_txl.decoding import initial_cache
from keras_txl.decoding import mask_after_stop
from keras_txl.decoding import stop_token_id_tuple
from keras_txl.memory import update_memory_mask

# initial_memory() refuses to allocate more than this by default (4 GiB).
MAX_INITIAL_MEMORY_BYTES = 4 << 30

# generate() refuses a longer max_length: it allocates (batch, max_length)
# buffers up front and runs one step per position, while the model's state
# is its fixed-size memory, so a longer text is generated in pieces
# (`memory=` / `return_memory=True`) at the same cost per token.
MAX_GENERATE_LENGTH = 1 << 20


def sum_over_replicas(value):
    """`value` summed over the replicas of the `tf.distribute` replica
    context it runs in (one step of `fit` / `evaluate` under
    MirroredStrategy); as it is outside one, or with one replica."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value
    return context.all_reduce(tf.distribute.ReduceOp.SUM, value)


def replicas_in_sync():
    """The replicas a loss's value is one share of: the strategy's, as
    Keras' `scale_loss_for_distribution` divides by."""
    return tf.distribute.get_strategy().num_replicas_in_sync


class TokenMeanReduction:
    """A Keras loss's "mean_with_sample_weight" reduction over tokens, for
    `TokenCrossEntropy` and `keras_txl.training.metrics.TokenNLL`.

    The per-token losses' weighted sum over the weights' sum (the
    preprocessor's padding mask, or the user's `sample_weight`); a weight
    per row, (batch,), counts for each of the row's positions. Without
    weights it is the mean over every position (`ignore_class` positions
    left out of the count too).

    Under a `tf.distribute` strategy each replica's value is its share of
    the global batch's mean: its own weighted sum over the weights' sum of
    all the replicas, so the replicas' gradients add up to those of the
    same global batch on one device. Keras' reduction divides each
    replica's own mean by the number of replicas instead: with padding or
    weights that differed between the replicas, a replica of two real
    tokens moved the weights as much as one of a thousand.
    """

    def __call__(self, y_true, y_pred, sample_weight=None):
        if sample_weight is not None:
            sample_weight = TokenCrossEntropy.token_weights(sample_weight, y_true)
        if self.reduction != "mean_with_sample_weight":
            return super().__call__(y_true, y_pred, sample_weight)
        with keras.name_scope(self.name):
            weights = self.counted_weights(y_true, sample_weight)
            losses = self.call(ops.convert_to_tensor(y_true, dtype=self.dtype),
                               ops.convert_to_tensor(y_pred, dtype=self.dtype))
            total = ops.sum(ops.cast(losses, "float32") * weights)
            count = sum_over_replicas(ops.sum(weights))
            # Already each replica's share: Keras' own losses divide by the
            # number of replicas here, this count holds all of them.
            return ops.cast(ops.divide_no_nan(total, count), self.dtype)

    def counted_weights(self, y_true, sample_weight=None):
        """The float32 (batch, T) weight of each target in the mean: the
        `sample_weight` (ones without it), 0 where `ignore_class` is."""
        y_true = tf.convert_to_tensor(y_true)
        if sample_weight is None:
            weights = tf.ones(tf.shape(y_true), tf.float32)
        else:
            weights = TokenCrossEntropy.token_weights(sample_weight, y_true)
        ignore_class = getattr(self, "_fn_kwargs", {}).get("ignore_class")
        if ignore_class is not None:
            weights = weights * tf.cast(
                tf.not_equal(y_true, tf.cast(ignore_class, y_true.dtype)), tf.float32)
        return weights


@keras.saving.register_keras_serializable(package="keras_txl")
class TokenCrossEntropy(TokenMeanReduction, keras.losses.SparseCategoricalCrossentropy):
    """The mean cross-entropy over the tokens that count: `compile`'s
    default loss (the reduction: `TokenMeanReduction`, also under a
    `tf.distribute` strategy).

    keras-hub's default divides the weighted sum by every position of the
    batch, padding included: on padded strings the loss (and `exp(loss)`,
    the perplexity) came out far below the mean NLL of the real tokens, and
    each batch's step shrank with its padding. Here the sum is divided by
    the sum of the weights (the preprocessor's padding mask, or the user's
    `sample_weight`); a weight per row, (batch,), counts for each of the
    row's positions. Without weights it is the mean over every position.
    """

    def __init__(self, from_logits=True, name="token_cross_entropy", **kwargs):
        kwargs.setdefault("reduction", "mean_with_sample_weight")
        super().__init__(from_logits=from_logits, name=name, **kwargs)

    @staticmethod
    def token_weights(sample_weight, y_true):
        """`sample_weight` (batch,) or (batch, T) as float32 (batch, T),
        the shape of the targets `y_true` (in the graph the weights' rank
        may be unknown)."""
        y_true = tf.convert_to_tensor(y_true)
        sample_weight = tf.cast(sample_weight, tf.float32)
        rows = tf.reshape(sample_weight, tf.stack([tf.shape(y_true)[0], -1]))
        return tf.broadcast_to(rows, tf.shape(y_true))


class TokenWeightedLoss(keras.metrics.Mean):
    """`compile`'s "loss" tracker (what `fit`'s History, its progress bar
    and `evaluate` report): the mean of the batches' losses, each weighted
    by the number of tokens its loss is the mean over.

    Keras' train and test steps weight each batch by its rows: with a loss
    that divides by the weights (`TokenCrossEntropy`'s, on padded strings
    or with a `sample_weight`), a batch of one real token counted as much
    as a full one, and the epoch's loss was not the mean NLL of its tokens.
    `TransformerXLCausalLM.compute_loss` gives the batch's count, which the
    step's `update_state` that follows uses instead of the rows (the rows
    when no count came from the same graph: a `compute_loss` overridden
    without calling this one)."""

    def __init__(self, name="loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self._count = None

    def next_count(self, count):
        self._count = count

    def update_state(self, values, sample_weight=None):
        count, self._count = self._count, None
        if count is not None and getattr(count, "graph", None) is getattr(
                values, "graph", None):
            sample_weight = count
        return super().update_state(values, sample_weight=sample_weight)


class ResetMemory(keras.callbacks.Callback):
    """Zeroes a stateful model's memory at each epoch start (the ordered
    segments start again from the beginning of every stream) and around
    evaluation and prediction (so validation starts clean and does not leak
    into training)."""

    def on_epoch_begin(self, epoch, logs=None):
        self.model.reset_memory()

    def on_test_begin(self, logs=None):
        self.model.reset_memory()

    def on_test_end(self, logs=None):
        self.model.reset_memory()

    def on_predict_begin(self, logs=None):
        self.model.reset_memory()

    def on_predict_end(self, logs=None):
        self.model.reset_memory()


def _as_text(value):
    """A detokenized string (tf scalar, bytes or str) as a Python str."""
    if tf.is_tensor(value):
        value = value.numpy()
    if isinstance(value, np.ndarray):
        value = value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _holds_strings(x):
    """A list/tuple/array/tensor of strings (not a dataset)."""
    if isinstance(x, (str, bytes)):
        return True
    if isinstance(x, (list, tuple)):
        return bool(x) and all(isinstance(v, (str, bytes)) for v in x)
    if isinstance(x, np.ndarray):
        return x.dtype.kind in "USO" and x.size > 0 and isinstance(
            x.flat[0], (str, bytes))
    return tf.is_tensor(x) and x.dtype == tf.string


def _is_string_spec(spec):
    """True for a dataset element of strings (a tensor spec of tf.string)."""
    return isinstance(spec, tf.TensorSpec) and spec.dtype == tf.string


def _no_targets_with_texts(y, what):
    """Ordered segments of a dataset of strings are their own targets: a
    `y` given with them would be dropped."""
    if y is not None:
        raise ValueError(
            f"`y` must be None when {what} reads a tf.data.Dataset of strings "
            "(its ordered segments hold the targets, the next tokens), received "
            f"{type(y).__name__}."
        )


def _reads_strings(x):
    """Strings, or a tf.data.Dataset of strings."""
    return _holds_strings(x) or (isinstance(x, tf.data.Dataset)
                                 and _is_string_spec(x.element_spec))


def _check_rectangular(name, value, hint):
    """Refuses by name a Python list (or tuple) of rows of different
    lengths, before Keras' data adapter says only "Can't convert
    non-rectangular Python sequence to Tensor"."""
    if not isinstance(value, (list, tuple)) or _holds_strings(value):
        return
    try:
        ragged = np.asarray(value).dtype == object
    except ValueError:  # NumPy: "inhomogeneous shape"
        ragged = True
    if ragged:
        lengths = [len(row) if isinstance(row, (list, tuple, np.ndarray)) else "a number"
                   for row in value[:8]]
        more = ", ..." if len(value) > 8 else ""
        raise ValueError(
            f"`{name}` must be rectangular, every row of the same length, received "
            f"a {type(value).__name__} of {len(value)} rows of lengths "
            f"{', '.join(map(str, lengths))}{more}. {hint}")


_IDS_HINT = ("Pad the rows to one length (with a `sample_weight` of 0 on the "
             "padding), or pass prompts of any lengths to generate().")
_TARGETS_HINT = "The targets have the shape of the ids, (batch, segment_length)."
_WEIGHTS_HINT = ("Give one weight per row, (batch,), or one per token, "
                 "(batch, segment_length).")


def _check_in_memory_data(x=None, y=None, sample_weight=None):
    """Ragged Python lists among `fit` / `evaluate` / `predict`'s `x` (or
    its "token_ids"), `y` and `sample_weight`, refused by name."""
    ids, name = x, "x"
    if isinstance(x, dict):
        ids, name = x.get("token_ids"), "x['token_ids']"
    for value, name, hint in ((ids, name, _IDS_HINT), (y, "y", _TARGETS_HINT),
                              (sample_weight, "sample_weight", _WEIGHTS_HINT)):
        _check_rectangular(name, value, hint)


def _concrete_array(value):
    """A list/tuple (not of strings), numpy array or eager tensor as a numpy
    array, whose shape and values can be checked before Keras reads them;
    None for anything else (a dataset, a generator, a symbolic tensor)."""
    if isinstance(value, (list, tuple)):
        return None if _holds_strings(value) else np.asarray(value)
    if isinstance(value, (tf.RaggedTensor, tf.SparseTensor)) or not _is_concrete(value):
        return None
    return np.asarray(value)


def _check_targets_and_weights(x, y, sample_weight, vocabulary_size, token_loss,
                               ignore_class=None, names=("x", "y", "sample_weight")):
    """`fit` / `evaluate`'s in-memory `y` and `sample_weight` against the
    ids `x`: refused by name where Keras failed later in the graph or
    used them wrongly in silence.

    `y` (when `token_loss`, a loss of token ids: the model's own, or a
    sparse cross-entropy): x's shape, whole numbers, in [0, V) (or the
    loss's `ignore_class`). `sample_weight`: numbers, finite, one per row
    or per token."""
    x_name, y_name, w_name = names
    ids = _concrete_array(x.get("token_ids") if isinstance(x, dict) else x)
    shape = tuple(ids.shape) if ids is not None and ids.ndim == 2 else None
    targets = _concrete_array(y) if token_loss else None
    if targets is not None:
        if shape is not None and tuple(targets.shape) != shape:
            raise ValueError(
                f"`{y_name}` must hold the target id of each position of `{x_name}`, "
                f"of its shape {shape} (batch, segment_length); received shape "
                f"{tuple(targets.shape)}.")
        whole = targets.dtype.kind in "iu" or (
            targets.dtype.kind == "f" and bool(np.all(np.isfinite(targets)))
            and bool(np.all(targets == np.round(targets))))
        if not whole:
            raise ValueError(
                f"`{y_name}` must hold integer token ids, received dtype "
                f"{targets.dtype} (a float target was cut to an integer in silence).")
        counted = targets if ignore_class is None else targets[targets != ignore_class]
        if counted.size and (counted.min() < 0 or counted.max() >= vocabulary_size):
            raise ValueError(
                f"`{y_name}` must be token ids in [0, vocabulary_size={vocabulary_size})"
                + ("" if ignore_class is None else f" or the loss's ignore_class={ignore_class}")
                + f", received values in [{counted.min()}, {counted.max()}].")
    weights = _concrete_array(sample_weight) if y is not None else None
    if weights is not None:
        if weights.dtype.kind not in "biuf":
            raise ValueError(
                f"`{w_name}` must hold numbers (a float or int weight, or a bool "
                f"mask), received dtype {weights.dtype}.")
        if shape is not None:
            rows, positions = shape
            allowed = ((rows,), (rows, 1), (rows, positions), (rows, positions, 1))
            if tuple(weights.shape) not in allowed:
                raise ValueError(
                    f"`{w_name}` must hold one weight per row, ({rows},), or one per "
                    f"token, {shape}, as `{x_name}`; received shape "
                    f"{tuple(weights.shape)}.")
        if weights.dtype.kind == "f" and not np.all(np.isfinite(weights)):
            raise ValueError(
                f"`{w_name}` must be finite: a NaN or infinite weight makes the "
                "loss and every weight after the step NaN; received "
                f"{weights[~np.isfinite(weights)][0]}.")


def _check_targets_given(x, y, name="x"):
    """Token ids `fit` / `evaluate` read without their targets (the next
    token of each position), refused by name: TensorFlow failed in the
    loss with "None values not supported." Strings make their own; a
    generator or a Keras PyDataset cannot be looked into."""
    if y is not None or x is None or _reads_strings(x):
        return
    hint = ("`model.preprocessor(texts)` returns x, y and sample_weight; "
            "`preprocessor.ordered_segments(texts, batch_size)` and "
            "`keras_txl.training.data.lm_dataset` give (x, y) batches")
    if isinstance(x, tf.data.Dataset):
        spec = x.element_spec
        if isinstance(spec, tuple):
            if len(spec) != 1:
                return
            spec = spec[0]
        if _is_string_spec(spec):
            return
        raise ValueError(
            f"`{name}` is a tf.data.Dataset of token ids without targets: its "
            "elements must be (x, y) or (x, y, sample_weight), y the next token "
            f"of each position ({hint}); received elements of {spec}.")
    if isinstance(x, (dict, list, np.ndarray)) or tf.is_tensor(x):
        raise ValueError(
            f"`y` must hold the targets when `{name}` is token ids: the next "
            f"token of each position, of the ids' shape ({hint}); received y=None.")


def _check_batched_texts(x, name="x"):
    """A tf.data.Dataset of single strings (rank 0) given to a model
    without state, where each string is one sample: refused by name, as
    Keras reads a dataset's elements as batches (single strings failed
    with "Cannot take the length of shape with unknown rank")."""
    if not isinstance(x, tf.data.Dataset):
        return
    spec = x.element_spec
    if isinstance(spec, tuple) and spec:
        spec = spec[0]
    if _is_string_spec(spec) and spec.shape.rank == 0:
        raise ValueError(
            f"`{name}` is a tf.data.Dataset of single strings, but Keras reads a "
            "dataset's elements as batches (each string is one sample of a model "
            f"without state): batch it, `{name}.batch(batch_size)`.")


def _check_validation_data(validation):
    if isinstance(validation, tuple) and 2 <= len(validation) <= 3:
        for i, value in enumerate(validation):
            hint = (_IDS_HINT, _TARGETS_HINT, _WEIGHTS_HINT)[i]
            _check_rectangular(f"validation_data[{i}]", value, hint)


def _nothing_made_by_the_preprocessor(**given):
    """The preprocessor makes the targets and the weights of strings:
    keras-hub dropped a `y` or `sample_weight` given with them in silence."""
    for name, value in given.items():
        if value is not None:
            raise ValueError(
                f"`{name}` must be None when the model reads strings: the "
                "preprocessor makes the targets (the next tokens) and the "
                "weights (1 on real tokens, 0 on padding) of each string, and "
                f"would drop the given `{name}`. To weight tokens or pass "
                "targets, give token ids (`model.preprocessor(texts)` returns "
                "x, y and sample_weight to edit).")


def check_preprocessor(preprocessor, vocabulary_size, loaded=False):
    """A preprocessor whose tokenizer fits a model of `vocabulary_size`.

    Args:
        loaded: bool. The tokenizer's vocabulary must be there (after a
            preset's assets are read); otherwise a tokenizer still waiting
            for its assets (keras-hub builds the task first) passes.
    """
    tokenizer = getattr(preprocessor, "tokenizer", None)
    if tokenizer is None:
        raise ValueError(
            "`preprocessor` has no tokenizer; a TransformerXLCausalLM needs a "
            "TransformerXLCausalLMPreprocessor with one."
        )
    size = tokenizer.vocabulary_size
    try:
        size = size() if callable(size) else size
    except (ValueError, AttributeError, TypeError, RuntimeError):
        size = None
    if size is None:
        if loaded:
            raise ValueError(
                "`preprocessor`: its tokenizer has no vocabulary (its asset "
                "files were not read)."
            )
        return
    if int(size) != int(vocabulary_size):
        raise ValueError(
            f"`preprocessor`: its tokenizer has a vocabulary of {size} tokens "
            f"but the model was built for vocabulary_size={vocabulary_size}; "
            "the tokenizer belongs to another model."
        )


def _is_concrete(x):
    """True for numpy arrays and eager tensors: values can be checked now."""
    if isinstance(x, np.ndarray):
        return True
    if isinstance(x, (keras.Variable, keras.KerasTensor)):
        return False
    return (
        tf.is_tensor(x)
        and not isinstance(x, tf.Variable)
        and not tf.is_symbolic_tensor(x)
    )


def _xla_cannot_reach_the_replicas(strategy):
    """A Mirrored / MultiWorkerMirrored strategy of several replicas, one
    of them not a GPU: an XLA-compiled replica function there cannot read
    the other replicas' variables (shared/TF_NOTES.md section 2)."""
    mirrored = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)
    if not isinstance(strategy, mirrored) or strategy.num_replicas_in_sync < 2:
        return False
    return not all((tf.DeviceSpec.from_string(d).device_type or "").upper() == "GPU"
                   for d in strategy.extended.worker_devices)


SAMPLERS = ("greedy", "top_k", "top_p", "random", "beam")


def _has_own_loop(sampler):
    """True for a sampler that runs its own loop (beam search, or a custom
    sampler overriding `__call__`) instead of choosing one token a step."""
    return type(sampler).__call__ is not Sampler.__call__


def check_sampler(sampler):
    """Refuses, by name, a keras-hub sampler `generate()` cannot run, before
    anything is traced: contrastive search, `BeamSampler` with
    `return_all_beams=True` (generate returns one sequence per prompt), and
    a `k` or `num_beams` that is not a positive integer."""
    from keras_hub.samplers import BeamSampler
    from keras_hub.samplers import ContrastiveSampler
    from keras_hub.samplers import TopKSampler
    from keras_hub.samplers import TopPSampler

    name = type(sampler).__name__
    if isinstance(sampler, ContrastiveSampler):
        raise ValueError(
            f"`sampler`: {name} (contrastive search) compares the hidden "
            "states of the whole sequence, which Transformer-XL's sliding "
            "memory does not keep; use 'greedy', 'top_k', 'top_p', 'random' "
            "or 'beam'."
        )
    if isinstance(sampler, BeamSampler):
        if sampler.return_all_beams:
            raise ValueError(
                f"`sampler`: {name}(return_all_beams=True) is not supported: "
                "generate() returns one sequence per prompt; use "
                "BeamSampler(return_all_beams=False), which returns the best beam."
            )
        checks.positive_int(f"sampler ({name}) num_beams", sampler.num_beams)
    if isinstance(sampler, TopKSampler) or (
        isinstance(sampler, TopPSampler) and sampler.k is not None
    ):
        # A k above the vocabulary is clamped to it (`clamp_top_k`).
        checks.positive_int(f"sampler ({name}) k", sampler.k)
    if isinstance(sampler, TopPSampler):
        p = _setting_value(sampler.p)
        if (isinstance(p, bool) or not isinstance(p, numbers.Real)
                or not 0 < p <= 1):
            raise ValueError(
                f"`sampler ({name}) p` must be in (0, 1] (1 keeps every "
                f"token), received p={p!r}."
            )
        if p < checks.FLOAT32_TINY:  # 0 in float32, where it is compared
            raise ValueError(
                f"`sampler ({name}) p` must be in (0, 1] and at least "
                f"{checks.FLOAT32_TINY:g}, the smallest float32 above 0, received p={p!r}."
            )
    # The log-probs are divided by the temperature: 0 gives NaN/Inf
    # probabilities, a negative one favours the least likely tokens.
    temperature = _setting_value(getattr(sampler, "temperature", 1.0))
    checks.finite_number(
        f"sampler ({name}) temperature", temperature,
        expected="a finite number > 0 (use 'greedy' for temperature 0)",
    )
    if temperature > checks.FLOAT32_MAX:  # Inf in float32, where logits are divided by it
        raise ValueError(
            f"`sampler ({name}) temperature` must be a finite number > 0 and at most "
            f"{checks.FLOAT32_MAX:g}, the largest float32, received "
            f"temperature={temperature!r}."
        )
    if not temperature >= checks.GREEDY_BELOW_TEMPERATURE:
        # Below it keras-hub's softmax(logits / T) gives NaN under XLA.
        raise ValueError(
            f"`sampler ({name}) temperature` must be a finite number >= "
            f"{checks.GREEDY_BELOW_TEMPERATURE:g} (use 'greedy' for temperature 0, the "
            f"limit), received temperature={temperature!r}."
        )


def _setting_value(value):
    """A sampler setting as a number: a scalar variable (as `generate_ids`
    keeps the temperature and p, so that another value needs no new trace)
    read as its float value; anything else as it is."""
    if isinstance(value, tf.Variable) and value.shape.rank == 0 and value.dtype.is_floating:
        return float(value.numpy())
    return value


def sampler_object(sampler):
    """A sampler name (one of `SAMPLERS`) as keras-hub's sampler; a
    `keras_hub.samplers.Sampler` as it is; a ValueError naming `sampler`
    for anything else (for keras-hub's "contrastive", the reason
    `check_sampler` gives its sampler)."""
    if isinstance(sampler, str) and sampler == "contrastive":
        from keras_hub.samplers import ContrastiveSampler

        check_sampler(ContrastiveSampler())
    if isinstance(sampler, str) and sampler not in SAMPLERS:
        raise ValueError(
            f"`sampler` must be one of {list(SAMPLERS)} or a "
            f"keras_hub.samplers.Sampler, received sampler={sampler!r}."
        )
    if not isinstance(sampler, (str, Sampler)):
        raise ValueError(
            "`sampler` must be a sampler name or a "
            f"keras_hub.samplers.Sampler, received {type(sampler).__name__}."
        )
    if isinstance(sampler, str):
        from keras_hub.samplers import get

        sampler = get(sampler)
    return sampler


def check_reads_log_probs(name, values):
    """Refuses, naming `name`, a loss or metric that reads the model's
    outputs as probabilities: a cross-entropy with `from_logits=False`, as
    Keras' string names (`"sparse_categorical_crossentropy"`) and
    keras-hub's `Perplexity()` default to. On log-probabilities it clipped
    them to its epsilon and reported a made-up value (3.43 for a mean NLL
    of 3.90; a perplexity of V), and such a loss trained on near-zero
    gradients, in silence."""
    if isinstance(values, str) and values == "auto":
        return
    for value in tree.flatten(values):
        if isinstance(value, str):
            if "crossentropy" not in value.lower():
                continue
            what = repr(value)
        elif getattr(value, "from_logits", None) is False:
            what = f"{type(value).__name__}(from_logits=False)"
        else:
            continue
        raise ValueError(
            f"`{name}`: {what} reads the model's outputs as probabilities, but a "
            "TransformerXLCausalLM returns log-probabilities (use them as logits): "
            f"pass from_logits=True (e.g. keras.losses.SparseCategoricalCrossentropy("
            "from_logits=True), keras_hub.metrics.Perplexity(from_logits=True))"
            + (", or loss='auto' (TokenCrossEntropy)." if name == "loss" else ".")
        )


def _saved_settings(preset):
    """What a local preset folder says of its statefulness: task.json's
    "stateful"/"batch_size" and the rows of the memory its task weights
    hold (None without one; a task.json edited to stateful=True has none)."""
    import json

    import h5py

    settings = {"stateful": False, "batch_size": None, "memory_rows": None}
    try:
        with open(os.path.join(preset, "task.json")) as f:
            config = json.load(f).get("config", {})
        settings["stateful"] = bool(config.get("stateful", False))
        settings["batch_size"] = config.get("batch_size")
    except (OSError, ValueError, AttributeError):
        pass  # keras-hub reports a missing or unreadable task.json
    try:
        with h5py.File(os.path.join(preset, "task.weights.h5"), "r") as f:
            variables = f.get("vars")
            if variables is not None and len(variables):
                settings["memory_rows"] = int(variables["0"].shape[0])
    except (OSError, KeyError, ValueError, IndexError):
        pass
    return settings


@keras.saving.register_keras_serializable(package="keras_txl")
class TransformerXLCausalLM(CausalLM, metaclass=SubclassedModelType):
    """Transformer-XL language model with explicit or stateful memory.

    A `keras_hub.models.CausalLM`: `from_preset` / `save_to_preset`,
    `compile(sampler=...)` and `generate(["prompt", ...], max_length=...)`
    work as for every keras-hub causal LM, with keras-hub's samplers and
    the memory's key/value window as the sampler's cache
    (`keras_txl.decoding`). On top of that:

    - `call_with_memory(token_ids, memory)` is pure: it returns the
      log-probs and the new memory and touches no state;
    - with `stateful=True` the memory lives in a non-trainable variable of
      shape (batch_size, L, M, D) that each call reads and overwrites (like
      a stateful Keras RNN): the batch size is fixed, feed segments in
      order with `fit(shuffle=False)` and call `reset_memory()` between
      unrelated texts. Under a `tf.distribute` strategy `batch_size` is the
      per-replica batch and every replica keeps its own memory. `fit()` on
      a `tf.data.Dataset` of strings cuts them into ordered segments
      (`TransformerXLCausalLMPreprocessor.ordered_segments`), so the memory
      is carried across them;
    - `build_cache` / `call_with_cache`: the memory key/value cache.

    Args:
        backbone: `TransformerXLBackbone`; or (as before keras-hub) a
            `TransformerXLConfig` or its dict, from which one is built.
        preprocessor: `TransformerXLCausalLMPreprocessor` or None. Needed
            for string inputs to `generate()` and `fit()`.
        stateful: bool. Keep the memory in a variable across calls.
        batch_size: int. Batch each call sees; required when stateful.

    Call arguments:
        token_ids: (B, T) int tensor, or keras-hub's dict with a
            "token_ids" entry.
        training: bool.

    Returns:
        (B, T, V) float32 log-probabilities (usable as logits: keras-hub's
        default loss, `from_logits=True`, gives the same cross-entropy).

    Example:
    ```python
    causal_lm = keras_txl.TransformerXLCausalLM.from_preset("runs/demo/model")
    causal_lm.compile(sampler="greedy")
    causal_lm.generate(["The history of", "In 1999 ,"], max_length=40)

    config = keras_txl.TransformerXLConfig.from_preset("tiny")
    model = keras_txl.TransformerXLCausalLM(config)
    out = model.call_with_memory(np.zeros((2, 8), "int32"))
    out = model.call_with_memory(next_ids, out["memory"])
    ```

    Reference:
        Dai et al., 2019, arXiv:1901.02860.
    """

    backbone_cls = TransformerXLBackbone
    preprocessor_cls = TransformerXLCausalLMPreprocessor

    def __init__(self, backbone=None, preprocessor=None, stateful=False,
                 batch_size=None, compile=True, **kwargs):
        if "config" in kwargs:  # the keyword of keras-txl before keras-hub
            if backbone is not None:
                raise ValueError("Pass either `backbone` or `config`, not both.")
            backbone = kwargs.pop("config")
        if isinstance(backbone, (TransformerXLConfig, dict)):
            backbone = TransformerXLBackbone(
                backbone, dtype=kwargs.get("dtype"), name="backbone"
            )
        if not isinstance(backbone, TransformerXLBackbone):
            raise ValueError(
                "`backbone` must be a TransformerXLBackbone (or a "
                "TransformerXLConfig or its dict), received "
                f"{type(backbone).__name__}."
            )
        stateful = checks.boolean("stateful", stateful)
        if stateful:
            if (isinstance(batch_size, bool)
                    or not isinstance(batch_size, numbers.Integral)
                    or batch_size <= 0):
                raise ValueError(
                    "A stateful TransformerXLCausalLM needs a fixed positive "
                    f"integer `batch_size`, received batch_size={batch_size!r}."
                )
            batch_size = int(batch_size)
        kwargs.setdefault("dtype", backbone.dtype_policy)
        super().__init__(compile=False, **kwargs)
        self.backbone = backbone
        self.preprocessor = preprocessor
        if preprocessor is not None:
            check_preprocessor(preprocessor, backbone.config.vocabulary_size)
        config = backbone.config
        self.stateful = stateful
        self.batch_size = batch_size
        self.softmax = AdaptiveSoftmax(
            config, dtype=self.dtype_policy, name="softmax"
        )
        self.softmax.build()
        self.memory = None
        if stateful:
            # ON_READ + ONLY_FIRST_REPLICA: each replica keeps its own copy
            # under MirroredStrategy (shared/TF_NOTES.md section 2).
            self.memory = keras.Variable(
                initializer="zeros",
                shape=self.memory_shape(batch_size),
                dtype="float32",
                trainable=False,
                synchronization="on_read",
                aggregation="only_first_replica",
                name="memory",
            )
        self.built = True
        if compile:
            self.compile()

    @property
    def txl_config(self):
        """The `TransformerXLConfig` of the backbone."""
        return self.backbone.config

    # --- memory -----------------------------------------------------------
    def memory_shape(self, batch_size):
        cfg = self.txl_config
        return (batch_size, cfg.num_layers, cfg.memory_length, cfg.hidden_dim)

    def initial_memory(self, batch_size, max_bytes=MAX_INITIAL_MEMORY_BYTES):
        """All-zero memory (B, L, M, D) float32 for the first segment.

        Args:
            batch_size: int >= 1 (NumPy integers too).
            max_bytes: int. Refuse a memory larger than this (default 4 GiB),
                so one call cannot allocate hundreds of GB.
        """
        batch_size = checks.positive_int("batch_size", batch_size)
        shape = self.memory_shape(batch_size)
        size = 4 * math.prod(shape)
        if size > max_bytes:
            raise ValueError(
                f"initial_memory(batch_size={batch_size}) would allocate "
                f"{size} bytes for a memory of shape {shape}, more than "
                f"max_bytes={max_bytes}; use a smaller batch or raise max_bytes."
            )
        return ops.zeros(shape, dtype="float32")

    def reset_memory(self):
        """Zero the stateful memory (start of a new text or epoch)."""
        if not self.stateful:
            raise ValueError(
                "reset_memory() needs a model built with stateful=True; this "
                "model takes the memory as an argument of call_with_memory()."
            )
        self.memory.assign(ops.zeros(self.memory.shape, dtype="float32"))

    # --- validation -------------------------------------------------------
    def _check_token_ids(self, token_ids, name="token_ids"):
        cfg = self.txl_config
        if isinstance(token_ids, (tf.RaggedTensor, tf.SparseTensor)):
            raise ValueError(
                f"`{name}` must be a dense integer tensor of shape (batch, "
                f"segment_length), received a {type(token_ids).__name__} (pad the "
                "rows, or pass prompts of any lengths to generate()).")
        if not (tf.is_tensor(token_ids) or isinstance(token_ids, keras.KerasTensor)):
            try:
                array = np.asarray(token_ids)
            except ValueError:  # NumPy: "inhomogeneous shape" (ragged rows)
                array = None
            if array is None or array.dtype == object:
                raise ValueError(
                    f"`{name}` must be an integer array of shape "
                    "(batch, segment_length), every row of the same length; "
                    "received rows of different lengths or non-numbers (pad "
                    "the rows, or pass prompts of any lengths to generate())."
                )
            token_ids = array
        dtype = str(token_ids.dtype.name if hasattr(token_ids.dtype, "name")
                    else token_ids.dtype)
        if "int" not in dtype:
            raise ValueError(
                f"`{name}` must be an integer tensor (int32 or int64) of "
                f"shape (batch, segment_length), received dtype {dtype}."
            )
        rank_message = f"`{name}` must have rank 2, (batch, segment_length)"
        if isinstance(token_ids.shape, tf.TensorShape) and token_ids.shape.rank is None:
            # Unknown rank (a traced step fed by a dataset of unknown
            # shape): checked at run time, then given rank 2 for tracing.
            # The reshape succeeds for any rank (a rank-2 tensor keeps its
            # shape), so the assert is the op that fails: Grappler's
            # constant folding would report a failing op ordered after it
            # (tf.ensure_shape) first.
            with tf.control_dependencies([
                tf.debugging.assert_rank(token_ids, 2, message=rank_message)
            ]):
                token_ids = tf.identity(token_ids)
            columns = tf.concat([tf.shape(token_ids), [1, 1]], 0)[1]
            token_ids = tf.reshape(token_ids, tf.stack([-1, columns]))
        shape = tuple(token_ids.shape)
        if len(shape) != 2:
            raise ValueError(f"{rank_message}, received shape {shape}.")
        if shape[1] == 0:
            raise ValueError(
                f"`{name}` must hold at least one position per row, "
                f"received shape {shape} (segment_length 0)."
            )
        if shape[0] == 0:
            raise ValueError(
                f"`{name}` must hold at least one row, received shape "
                f"{shape} (batch 0)."
            )
        if _is_concrete(token_ids):
            values = np.asarray(token_ids)
            if values.size and (
                values.min() < 0 or values.max() >= cfg.vocabulary_size
            ):
                raise ValueError(
                    f"`{name}` must be in [0, vocabulary_size="
                    f"{cfg.vocabulary_size}), received values in "
                    f"[{values.min()}, {values.max()}]."
                )
            return ops.convert_to_tensor(values.astype("int32"))
        token_ids = ops.cast(token_ids, "int32")
        if tf.is_tensor(token_ids):
            # Graph mode: checked at run time (a no-op under XLA).
            with tf.control_dependencies([
                tf.debugging.assert_non_negative(
                    token_ids, message=f"`{name}` must be >= 0"
                ),
                tf.debugging.assert_less(
                    token_ids, tf.constant(cfg.vocabulary_size, tf.int32),
                    message=f"`{name}` must be < vocabulary_size="
                    f"{cfg.vocabulary_size}",
                ),
            ]):
                token_ids = tf.identity(token_ids)
        return token_ids

    def _check_memory(self, memory, token_ids):
        cfg = self.txl_config
        if not (tf.is_tensor(memory) or isinstance(memory, keras.KerasTensor)
                or isinstance(memory, tf.Variable)):
            memory = np.asarray(memory)
        dtype = str(memory.dtype.name if hasattr(memory.dtype, "name")
                    else memory.dtype)
        if "float" not in dtype:
            raise ValueError(
                f"`memory` must be a float tensor, received dtype {dtype}."
            )
        shape = tuple(memory.shape)
        expected = (cfg.num_layers, cfg.memory_length, cfg.hidden_dim)
        if len(shape) != 4 or any(
            s is not None and s != e for s, e in zip(shape[1:], expected)
        ):
            raise ValueError(
                "`memory` must have shape (batch, num_layers, memory_length, "
                f"hidden_dim) = (batch, {expected[0]}, {expected[1]}, "
                f"{expected[2]}), received shape {shape}."
            )
        batch = token_ids.shape[0]
        if shape[0] is not None and batch is not None and shape[0] != batch:
            raise ValueError(
                f"`memory` has batch size {shape[0]} but `token_ids` has batch "
                f"size {batch}; pass the memory returned for this batch."
            )
        if _is_concrete(memory):
            # Checked after the cast: a float64 1e300 is finite before it.
            values = checks.finite_float32(
                "memory", memory,
                "pass the memory returned by the previous segment or zeros.",
            )
            return ops.convert_to_tensor(values)
        memory = ops.cast(memory, "float32")
        if tf.is_tensor(memory) and tf.is_tensor(token_ids) and not isinstance(
            memory, keras.Variable
        ):
            # Graph mode: the batch and the values are only known at run
            # time (a no-op under XLA).
            with tf.control_dependencies([
                tf.debugging.assert_equal(
                    tf.shape(memory)[0], tf.shape(token_ids)[0],
                    message="`memory` must have the same batch size as "
                    "`token_ids`",
                ),
                tf.debugging.assert_all_finite(
                    memory, "`memory` contains NaN or Inf values"
                ),
            ]):
                memory = tf.identity(memory)
        return memory

    def _check_memory_mask(self, memory_mask, batch):
        """`memory_mask` as a (batch, memory_length) bool tensor; a
        ValueError naming it for another dtype or shape. `batch` is the
        ids' batch (an int, or None where unknown)."""
        memory_length = self.txl_config.memory_length
        expected = (
            "a bool array of shape (batch, memory_length) = "
            f"({'batch' if batch is None else batch}, {memory_length}), True "
            "where a memory slot holds real memory"
        )
        if not (tf.is_tensor(memory_mask) or isinstance(memory_mask, keras.KerasTensor)
                or isinstance(memory_mask, tf.Variable)):
            try:
                memory_mask = np.asarray(memory_mask)
            except ValueError:
                raise ValueError(
                    f"`memory_mask` must be {expected}; received ragged rows."
                ) from None
        dtype = str(getattr(memory_mask.dtype, "name", memory_mask.dtype))
        if dtype != "bool":
            # A float or 0/1 mask is refused rather than cast: a soft mask
            # (0.5) has no meaning here.
            raise ValueError(
                f"`memory_mask` must be {expected}; received dtype {dtype}."
            )
        shape = memory_mask.shape
        if isinstance(shape, tf.TensorShape):
            shape = None if shape.rank is None else tuple(shape.as_list())
        else:
            shape = tuple(shape)
        if shape is None or len(shape) != 2 or (
            shape[1] is not None and shape[1] != memory_length
        ) or (shape[0] is not None and batch is not None and shape[0] != batch):
            raise ValueError(
                f"`memory_mask` must be {expected}; received shape {shape}."
            )
        if isinstance(memory_mask, np.ndarray):
            return ops.convert_to_tensor(memory_mask)
        return memory_mask

    def _memory_mask_for(self, memory, memory_mask, batch, required=False):
        """The checked mask of a memory given by the caller, or None (every
        slot real: the explicit memory of the training loops, the stateful
        model and the exports, which start from zeros). `required`
        (generate's continuation): with `empty_memory="masked"` a memory
        returned by `generate` has unfilled slots that are zero vectors;
        without the mask they would count as real memory, and a text
        continued from it would differ from the same text in one call."""
        if memory_mask is not None:
            return self._check_memory_mask(memory_mask, batch)
        if (required and memory is not None and self.txl_config.empty_memory == "masked"
                and self.txl_config.memory_length > 0):
            raise ValueError(
                "`memory_mask` is required with `memory` for a model with "
                "empty_memory='masked': pass the validity returned with the "
                "memory (the third value of generate(..., return_memory=True), "
                "call_with_memory's out['memory_mask']), or "
                "np.ones((batch, memory_length), bool) if every slot holds "
                "real memory."
            )
        return None

    def _check_cache(self, cache, token_ids):
        """A cache from `build_cache` (or a previous `call_with_cache`) for
        the batch of `token_ids`; a ValueError naming `cache` otherwise."""
        cfg = self.txl_config
        layers = cfg.num_layers
        structure = (
            "the dict returned by build_cache() or by the previous "
            f"call_with_cache() (\"keys\" and \"values\": {layers} per-layer "
            "tensors each)"
        )
        if not isinstance(cache, dict):
            raise ValueError(
                f"`cache` must be {structure}, received {type(cache).__name__}."
            )
        missing = [k for k in ("keys", "values") if k not in cache]
        if missing:
            raise ValueError(
                f"`cache` must be {structure}; it lacks {missing} (received "
                f"keys {sorted(cache)})."
            )
        for key in ("keys", "values"):
            entry = cache[key]
            if not isinstance(entry, (tuple, list)) or len(entry) != layers:
                raise ValueError(
                    f"`cache[{key!r}]` must hold one tensor per layer "
                    f"({layers}), received {type(entry).__name__}"
                    + (f" of length {len(entry)}" if isinstance(entry, (tuple, list)) else "")
                    + "."
                )
        heads, head_dim = cfg.num_heads, cfg.resolved_head_dim
        for key, expected in (("keys", (heads, head_dim, cfg.memory_length)),
                              ("values", (heads, cfg.memory_length, head_dim))):
            for layer, tensor in enumerate(cache[key]):
                shape = tuple(getattr(tensor, "shape", ()) or ())
                if len(shape) != 4 or any(
                        got is not None and got != want
                        for got, want in zip(shape[1:], expected)):
                    raise ValueError(
                        f"`cache[{key!r}][{layer}]` has shape {shape}, expected "
                        f"(batch, {', '.join(map(str, expected))}) for this model "
                        f"(num_heads={heads}, head_dim={head_dim}, memory_length="
                        f"{cfg.memory_length}): build the cache with this model's "
                        "build_cache().")
        rows = cache["keys"][0].shape[0]
        batch = token_ids.shape[0]
        if rows is not None and batch is not None and rows != batch:
            raise ValueError(
                f"`cache` was built for a batch of {rows} rows but `token_ids` "
                f"has {batch}; build the cache for this batch "
                "(build_cache(memory) with this batch's memory, or "
                f"build_cache(batch_size={batch}))."
            )

    # --- forward ----------------------------------------------------------
    def call_with_memory(
        self, token_ids, memory=None, training=False, return_hidden=False,
        memory_mask=None,
    ):
        """Pure forward pass over one segment.

        Args:
            token_ids: (B, T) int tensor, ids in [0, vocabulary_size).
            memory: (B, L, M, D) float tensor or None (all-zero memory).
            training: bool. Dropout on.
            return_hidden: bool. Also return the final hidden states.
            memory_mask: (B, M) bool or None: which memory slots are real
                (see `TransformerXLBackbone`). With it, or with
                `empty_memory="masked"` and no memory, the result also holds
                the next "memory_mask".

        Returns:
            dict with "log_probs" (B, T, V) float32 and "memory"
            (B, L, M, D) float32 (and "hidden" (B, T, D), "memory_mask"
            (B, M) bool).

        Raises:
            ValueError: on ids out of range, wrong dtype/rank, memory of the
                wrong shape, batch or dtype, a memory_mask that is not
                (B, M) bool, or (with `empty_memory="masked"`) a memory
                without its memory_mask.
        """
        training = checks.boolean("training", training)
        return_hidden = checks.boolean("return_hidden", return_hidden)
        token_ids = self._check_token_ids(token_ids)
        if memory is not None:
            memory = self._check_memory(memory, token_ids)
        memory_mask = self._memory_mask_for(memory, memory_mask, token_ids.shape[0])
        return self._forward(token_ids, memory, training, return_hidden, memory_mask)

    def score(self, token_ids, padding_mask=None, scoring_mode="logits",
              layer_intercept_fn=None, target_ids=None):
        """keras-hub's `CausalLM.score` (as `GPT2CausalLM`'s and
        `GemmaCausalLM`'s): the scores of each token of `token_ids`, read
        from a zero memory (`call_with_memory` scores a segment after a
        memory).

        Args:
            token_ids: (B, T) int, e.g. the ids `generate` returned.
            padding_mask: (B, T) or None. As in keras-hub it changes no
                score: attention is causal, so the padding at the end of
                a row is never attended to by the tokens before it.
            scoring_mode: "logits" or "loss".
            layer_intercept_fn: None or `fn(x, index)` returning x: called
                on the (B, T, D) embeddings (index -1) and each block's
                output (0-based index), its result used in their place.
            target_ids: (B, T) int target of each position (required with
                "loss"), e.g. `ops.roll(token_ids, -1, axis=1)`.

        Returns:
            "logits": (B, T, V) float32 log-probabilities (a softmax of
            them gives the same probabilities as of logits); "loss":
            (B, T) float32 negative log-likelihood of each target.
        """
        if scoring_mode not in ("logits", "loss"):
            raise ValueError(
                "`scoring_mode` must be 'logits' or 'loss', received "
                f"scoring_mode={scoring_mode!r}.")
        if scoring_mode == "loss" and target_ids is None:
            raise ValueError(
                "`target_ids` must be given with scoring_mode='loss': the "
                "(batch, segment_length) id each position's loss is scored "
                "against, e.g. keras.ops.roll(token_ids, -1, axis=1).")
        if layer_intercept_fn is not None and not callable(layer_intercept_fn):
            raise ValueError(
                "`layer_intercept_fn` must be None or a function fn(x, index) "
                f"returning x, received {type(layer_intercept_fn).__name__}.")
        token_ids = self._check_token_ids(token_ids)
        if padding_mask is not None:
            shape = tuple(ops.shape(padding_mask))
            if shape != tuple(token_ids.shape):
                raise ValueError(
                    "`padding_mask` must have the (batch, segment_length) shape of "
                    f"`token_ids`, {tuple(token_ids.shape)}, received shape {shape}.")
        hidden, _ = self.backbone(
            token_ids, None, training=False,
            memory_mask=self.backbone.resolve_memory_mask(
                None, None, ops.shape(token_ids)[0]),
            layer_intercept_fn=layer_intercept_fn)
        if scoring_mode == "logits":
            return self.log_probs_from_hidden(hidden)
        target_ids = self._check_targets(target_ids, tuple(token_ids.shape), "token_ids")
        return self.nll_from_hidden(hidden, target_ids)

    def _forward(self, token_ids, memory, training=False, return_hidden=False,
                 memory_mask=None):
        """`call_with_memory` on checked arguments."""
        memory_mask = self.backbone.resolve_memory_mask(
            memory, memory_mask, ops.shape(token_ids)[0]
        ) if memory_mask is not None or memory is None else None
        hidden, new_memory = self.backbone(
            token_ids, memory, training=training, memory_mask=memory_mask
        )
        log_probs = self.log_probs_from_hidden(hidden)
        out = {"log_probs": log_probs, "memory": new_memory}
        if return_hidden:
            out["hidden"] = hidden
        if memory_mask is not None:
            out["memory_mask"] = update_memory_mask(
                memory_mask, ops.shape(token_ids)[1], self.txl_config.memory_length
            )
        return out

    def build_cache(self, memory=None, batch_size=1, segment_length=1,
                    memory_mask=None, keep_memory=True):
        """A memory key/value cache for fast decoding (see `call_with_cache`).

        Args:
            memory: (B, L, M, D) float tensor (e.g. the memory after the
                prompt), or None for an empty memory of `batch_size` rows
                (zeros, or masked slots with `empty_memory="masked"`).
            batch_size: int. Used when `memory` is None.
            segment_length: int. T of the coming calls (1 to decode).
            memory_mask: (B, M) bool validity of the memory's slots, or None.
            keep_memory: bool. Whether the cache also carries the memory, so
                that `call_with_cache` returns the new memory; evaluation
                passes False (less to copy per segment; see
                `TransformerXLBackbone.build_cache`).

        Returns:
            dict of per-layer tensors (see
            `TransformerXLBackbone.build_cache`).
        """
        if not isinstance(keep_memory, (bool, np.bool_)):
            raise ValueError(
                "`keep_memory` must be True or False. Received: "
                f"keep_memory={keep_memory!r}.")
        segment_length = checks.positive_int("segment_length", segment_length)
        if memory is None:
            batch_size = checks.positive_int("batch_size", batch_size)
            if memory_mask is not None:
                memory_mask = self._check_memory_mask(memory_mask, batch_size)
            memory_mask = self.backbone.resolve_memory_mask(
                None, memory_mask, batch_size
            )
            memory = self.initial_memory(batch_size)
        else:
            if not (tf.is_tensor(memory) or isinstance(memory, (keras.KerasTensor, tf.Variable))):
                memory = np.asarray(memory)
            rows = memory.shape[0] if len(memory.shape) else None
            ids = np.zeros((rows or 1, 1), "int32")
            memory = self._check_memory(memory, ids)
            memory_mask = self._memory_mask_for(memory, memory_mask, rows)
        return self.backbone.build_cache(memory, segment_length, memory_mask,
                                         bool(keep_memory))

    def call_with_cache(self, token_ids, cache, targets=None):
        """Inference over one segment with the memory key/value cache.

        Same values as `call_with_memory(token_ids, cache["memory"])`, but
        only the T new positions are projected in each layer: decoding one
        token costs O(M) per layer instead of re-projecting the M memory
        positions and the position matrix.

        Args:
            token_ids: (B, T) int tensor.
            cache: dict from `build_cache` or a previous call.
            targets: optional (B, T) int tensor: then "nll" (B, T) float32,
                the targets' negative log-likelihood (`nll_from_hidden`),
                replaces "log_probs".

        Returns:
            dict with "log_probs" (B, T, V) float32 (or "nll"), "cache" (the
            slid cache) and, if the cache keeps the memory (`build_cache`'s
            `keep_memory`), "memory" (B, L, M, D) float32 (the new memory).
        """
        token_ids = self._check_token_ids(token_ids)
        self._check_cache(cache, token_ids)
        if targets is not None:
            targets = self._check_targets(targets, tuple(token_ids.shape), "token_ids")
        hidden, new_cache = self.backbone.call_with_cache(token_ids, cache)
        out = {"cache": new_cache}
        if "memory" in new_cache:
            out["memory"] = self.backbone.stack_memory(new_cache)
        if targets is None:
            out["log_probs"] = self.log_probs_from_hidden(hidden)
        else:
            embedding = self.backbone.token_embedding
            out["nll"] = self.softmax.nll(hidden, targets, embedding.tables,
                                          embedding.projections)
        return out

    def log_probs_from_hidden(self, hidden):
        """(B, T, D) hidden states -> (B, T, V) float32 log-probabilities."""
        embedding = self.backbone.token_embedding
        return self.softmax(hidden, embedding.tables, embedding.projections)

    def nll_from_hidden(self, hidden, targets):
        """(B, T, D) hidden states, (B, T) int targets -> (B, T) float32 NLL.

        `-log_probs_from_hidden(hidden)[..., targets]` without the (B, T, V)
        log-probs: a tail cluster of the adaptive softmax is computed only
        for the tokens whose target is in it (`AdaptiveSoftmax.nll`). The
        training and evaluation steps use it; with a large vocabulary the
        full log-probs would not fit (9.6 GB at WikiText-103's batch 60).
        """
        targets = self._check_targets(targets, tuple(hidden.shape)[:-1], "hidden")
        embedding = self.backbone.token_embedding
        return self.softmax.nll(hidden, targets, embedding.tables, embedding.projections)

    def _check_targets(self, targets, expected, against):
        """`targets` as token ids (int, rank 2, in [0, V)) of `expected`'s
        (B, T) shape, where both are known."""
        targets = self._check_token_ids(targets, "targets")
        shape = tuple(targets.shape)
        if any(a is not None and b is not None and a != b
               for a, b in zip(shape, expected)):
            raise ValueError(
                f"`targets` must have the (batch, segment_length) shape of "
                f"`{against}`, {expected}, received shape {shape}."
            )
        return targets

    def _check_full_batch(self, token_ids):
        """A stateful model's memory has `batch_size` rows: every batch must
        be full (Keras' predict and fit hand over a short last batch)."""
        message = (
            f"A stateful TransformerXLCausalLM built with batch_size="
            f"{self.batch_size} needs every batch to hold exactly "
            f"{self.batch_size} rows (its memory has {self.batch_size}); "
            "drop or pad the short last batch, e.g. pass a number of rows "
            "that is a multiple of the batch size"
        )
        batch = token_ids.shape[0] if hasattr(token_ids, "shape") else None
        if batch is not None and batch != self.batch_size:
            raise ValueError(f"{message}; received a batch of {batch}.")
        if batch is None and tf.is_tensor(token_ids):
            # Unknown until run time (a traced predict/fit step).
            with tf.control_dependencies([tf.debugging.assert_equal(
                tf.shape(token_ids)[0], self.batch_size, message=message,
            )]):
                token_ids = tf.identity(token_ids)
        return token_ids

    def _check_no_padding(self, token_ids, padding_mask):
        """A stateful model's memory continues each row's text into the next
        batch: padding would go into it as if it were text (the next batch's
        log-probs then came out up to 6 nats off on a tiny model). keras-hub's
        preprocessor pads each string to `sequence_length`; ordered segments
        (`preprocessor.ordered_segments`, what `fit` and `evaluate` cut a
        dataset of strings into) have none."""
        message = (
            "A stateful TransformerXLCausalLM reads contiguous text (its memory "
            "carries each row into the next batch), but this batch holds padding "
            "(`padding_mask` false somewhere): pass a tf.data.Dataset of strings "
            "(fit and evaluate cut it into ordered segments), or "
            "`preprocessor.ordered_segments(...)`, or use a model without state"
        )
        if not tf.is_tensor(padding_mask) and not isinstance(padding_mask, tf.Variable):
            if not np.all(np.asarray(padding_mask)):
                raise ValueError(message + ".")
            return token_ids
        with tf.control_dependencies([tf.debugging.assert_equal(
            tf.reduce_all(tf.cast(padding_mask, tf.bool)), True, message=message,
        )]):
            return tf.identity(token_ids)

    def _stateful_rows(self, x):
        """The number of rows of `fit`/`evaluate`/`predict` data whose size
        is known before Keras takes it (arrays, tensors, lists, a dict's
        "token_ids"), or None (a dataset, a generator)."""
        if isinstance(x, (tuple, list)) and x and isinstance(x[0], dict):
            x = x[0]
        if isinstance(x, dict):
            x = x.get("token_ids")
        if isinstance(x, (list, tuple)):
            return len(x)
        shape = getattr(x, "shape", None)
        if shape is None or isinstance(x, tf.data.Dataset):
            return None
        if isinstance(shape, tf.TensorShape):
            return None if shape.rank in (None, 0) else shape[0]
        return shape[0] if len(shape) else None

    def _check_stateful_data(self, x, batch_size, verb, name="x"):
        """Refuses, before Keras builds its data adapter, data that would
        give a stateful model a batch other than its global batch
        (`batch_size` rows per replica under a `tf.distribute` strategy);
        returns the batch size to hand to Keras (the global one, for arrays
        and lists). Batches only known in the graph meet the run-time
        assert of `_check_full_batch`."""
        if not self.stateful:
            return batch_size
        if _holds_strings(x):
            # keras-hub would cut each string to sequence_length (padding a
            # short one) and the memory would run on from one unrelated row
            # to the next.
            raise ValueError(
                f"A stateful TransformerXLCausalLM {verb} text as ordered segments: "
                "pass the strings as a tf.data.Dataset (fit and evaluate cut it into "
                "ordered segments, its `batch_size` streams carried by the memory), "
                "or `preprocessor.ordered_segments(...)`; a list or array of strings "
                "would be cut into unrelated rows."
            )
        replicas = self.distribute_strategy.num_replicas_in_sync
        expected = self.batch_size * replicas
        per_replica = (f" ({self.batch_size} per replica x {replicas} replicas)"
                       if replicas > 1 else "")
        what = (f"A stateful TransformerXLCausalLM built with batch_size="
                f"{self.batch_size} {verb} in batches of exactly {expected} "
                f"rows{per_replica}")
        if isinstance(x, tf.data.Dataset):
            if shuffle_in(x):
                # Each row's memory would run on into an unrelated segment.
                raise ValueError(
                    f"`{name}` is a shuffled tf.data.Dataset (a `shuffle()` in its "
                    "pipeline), but a stateful TransformerXLCausalLM carries each "
                    "row's memory into the next batch: pass the batches in order "
                    "(`keras_txl.training.data.lm_dataset`, "
                    "`preprocessor.ordered_segments`)."
                )
            spec = x.element_spec
            if isinstance(spec, tuple) and spec:
                spec = spec[0]
            if isinstance(spec, dict):
                spec = spec.get("token_ids")
            if isinstance(spec, tf.TensorSpec) and spec.dtype != tf.string:
                rank = spec.shape.rank
                if rank is not None and rank < 2:
                    raise ValueError(
                        f"{what}; the dataset's elements are single rows of shape "
                        f"{tuple(spec.shape)}, not (batch, segment_length) batches. "
                        f"Batch it with `.batch({expected}, drop_remainder=True)`."
                    )
                if rank is not None and rank >= 1 and spec.shape[0] is not None \
                        and spec.shape[0] != expected:
                    raise ValueError(
                        f"{what}; the dataset's batches hold {spec.shape[0]}. "
                        f"Batch it with `.batch({expected}, drop_remainder=True)`."
                    )
            return batch_size
        step = expected if batch_size is None else batch_size
        rows = self._stateful_rows(x)
        if step != expected or (rows is not None and rows % step):
            received = "" if rows is None else f"{rows} rows with "
            raise ValueError(
                f"{what}; received {received}batch_size={step}. Pass a multiple "
                f"of {expected} rows (drop or pad the last batch)."
            )
        return expected

    def _check_stateful_fit(self, x, batch_size, kwargs):
        """`fit` options that would break a stateful model's ordered rows:
        Keras shuffles arrays by default (each row's memory then ran on into
        an unrelated segment, in silence), so `shuffle` defaults to False
        and True is refused; a `validation_split` must leave both parts whole
        batches (a short last batch failed in the graph). Updates `kwargs`."""
        shuffle = kwargs.get("shuffle")
        if shuffle is not None and shuffle is not False:
            raise ValueError(
                "`shuffle` must be False for a stateful TransformerXLCausalLM: its "
                "memory carries each row from one batch to the next, so the "
                f"batches must come in order; received shuffle={shuffle!r}.")
        kwargs["shuffle"] = False
        split = kwargs.get("validation_split")
        rows = self._stateful_rows(x)
        if split and rows is not None:
            # Keras' split: the last rows, from floor(rows * (1 - split)).
            train = int(math.floor(rows * (1.0 - split)))
            if train % batch_size or (rows - train) % batch_size:
                raise ValueError(
                    f"`validation_split`={split!r} cuts {rows} rows into {train} "
                    f"for training and {rows - train} for validation, but a "
                    f"stateful TransformerXLCausalLM built with batch_size="
                    f"{self.batch_size} reads batches of exactly {batch_size} "
                    f"rows: pick a split that leaves multiples of {batch_size} "
                    "on both sides, or pass `validation_data`.")

    def predict(self, x, batch_size=None, *args, **kwargs):
        """keras `predict`; for the stateful model a `tf.data.Dataset` of
        strings is cut into ordered segments, as `fit` and `evaluate` do,
        and read from a zeroed memory (zeroed again after): the result is
        the log-probs of those segments, (num_batches * B, T, V), batch k's
        row b being segment k of stream b
        (`preprocessor.ordered_segments(texts, B)` gives the same inputs).
        On ids the stateful model is a stateful Keras RNN: its memory runs
        on from the previous call (`reset_memory()` first to start a text
        over), as in `evaluate` and `fit` on ids."""
        self._check_preprocessor_for(x, "predict()")
        if self.stateful and isinstance(x, tf.data.Dataset) and _is_string_spec(
                x.element_spec):
            segments = self._ordered_segments(x, "predict()").map(
                lambda inputs, targets: inputs)
            kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), ResetMemory()]
            return keras.Model.predict(self, segments, None, *args, **kwargs)
        if not self.stateful:
            _check_batched_texts(x)
        _check_in_memory_data(x)
        batch_size = self._check_stateful_data(x, batch_size, "predicts")
        return super().predict(x, batch_size, *args, **kwargs)

    def evaluate(self, x=None, y=None, batch_size=None, *args, **kwargs):
        """keras `evaluate`; for the stateful model a `tf.data.Dataset` of
        strings is cut into ordered segments, as `fit` does, and read from
        a zeroed memory (zeroed again after)."""
        self._check_preprocessor_for(x, "evaluate()")
        if self.stateful and isinstance(x, tf.data.Dataset) and _is_string_spec(
                x.element_spec):
            _no_targets_with_texts(y, "evaluate()")
            x = self._ordered_segments(x, "evaluate()")
            kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), ResetMemory()]
            return keras.Model.evaluate(self, x, None, None, *args, **kwargs)
        if not self.stateful:
            _check_batched_texts(x)
        if _reads_strings(x):
            _nothing_made_by_the_preprocessor(sample_weight=kwargs.get("sample_weight"))
        _check_in_memory_data(x, y, kwargs.get("sample_weight"))
        self._check_fit_data(x, y, kwargs.get("sample_weight"))
        batch_size = self._check_stateful_data(x, batch_size, "evaluates")
        return super().evaluate(x, y, batch_size, *args, **kwargs)

    def _check_fit_data(self, x, y, sample_weight, validation=None):
        """`_check_targets_and_weights` for `fit` / `evaluate`'s data and a
        `validation_data` tuple, with the compiled loss's settings."""
        losses = [v for v in tree.flatten(getattr(self, "loss", None)) if v is not None]
        token_loss = len(losses) == 1 and isinstance(
            losses[0], (TokenMeanReduction, keras.losses.SparseCategoricalCrossentropy))
        ignore_class = getattr(losses[0], "_fn_kwargs", {}).get("ignore_class") \
            if token_loss else None
        checked = [((x, y, sample_weight), ("x", "y", "sample_weight"))]
        if losses:
            _check_targets_given(x, y)
            if isinstance(validation, tf.data.Dataset):
                _check_targets_given(validation, None, "validation_data")
        if isinstance(validation, tuple) and 2 <= len(validation) <= 3:
            given = (*validation, None)[:3]
            checked.append((given, tuple(f"validation_data[{i}]" for i in range(3))))
        for (ids, targets, weights), names in checked:
            _check_targets_and_weights(
                ids, targets, weights, self.txl_config.vocabulary_size, token_loss,
                ignore_class, names)

    def _check_preprocessor_for(self, x, what):
        """Strings need the preprocessor: without one keras-hub said "Calling
        a model directly ... Use `model.predict(x)`" to a `predict` call."""
        if self.preprocessor is None and _reads_strings(x):
            raise ValueError(
                f"{what} on strings needs a preprocessor (a "
                "TransformerXLCausalLMPreprocessor with the model's tokenizer, "
                "`preprocessor=` of the constructor); this model has none. Pass "
                "token ids, or load the model with its tokenizer (a preset folder).")

    def _ordered_segments(self, x, what):
        """A dataset of strings as the stateful model's ordered segments."""
        if self.preprocessor is None:
            raise ValueError(
                f"{what} on a dataset of strings needs a preprocessor (a "
                "TransformerXLCausalLMPreprocessor with the model's tokenizer); "
                "this model has none."
            )
        if x.element_spec.shape.rank == 1:  # batched strings: the same text in order
            x = x.unbatch()
        replicas = self.distribute_strategy.num_replicas_in_sync
        return self.preprocessor.ordered_segments(x, self.batch_size * replicas)

    def call(self, token_ids, training=False):
        padding_mask = None
        if isinstance(token_ids, dict):  # keras-hub's preprocessor output
            if "token_ids" not in token_ids:
                raise ValueError(
                    "A dict input must hold \"token_ids\" (and optionally "
                    "\"padding_mask\"), as keras-hub's preprocessor outputs; received "
                    f"keys {sorted(token_ids)}.")
            padding_mask = token_ids.get("padding_mask")
            token_ids = token_ids["token_ids"]
        if not self.stateful:
            return self.call_with_memory(token_ids, None, training)["log_probs"]
        if padding_mask is not None:
            token_ids = self._check_no_padding(token_ids, padding_mask)
        token_ids = self._check_token_ids(token_ids)
        token_ids = self._check_full_batch(token_ids)
        memory = ops.cast(self.memory, "float32")
        dynamic = token_ids.shape[0] is None and tf.is_tensor(token_ids)
        if dynamic:
            # The assert of `_check_full_batch` is ordered before the ops
            # that read the ids, but Grappler's constant folding reports a
            # clash of a short batch with the variable's static batch (a
            # ConcatOp, reshape or loss-shape error) before it runs. Every
            # shape below is made valid for any batch (rows of the memory
            # repeated or cut), so the assert is the one op that fails.
            batch = tf.shape(token_ids)[0]
            memory = tf.gather(memory, tf.range(batch) % self.batch_size)
        # The stateful memory counts as real memory in every slot (it is
        # zeros after reset_memory(), as in the official code).
        out = self._forward(token_ids, memory, training)
        new_memory = out["memory"]
        if dynamic:
            new_memory = tf.gather(new_memory, tf.range(self.batch_size) % batch)
        self.memory.assign(new_memory)
        return out["log_probs"]

    def compute_output_spec(self, token_ids, training=False):
        if isinstance(token_ids, dict):
            token_ids = token_ids["token_ids"]
        shape = tuple(token_ids.shape)
        return keras.KerasTensor(
            (*shape, self.txl_config.vocabulary_size), dtype="float32"
        )

    # --- evaluation settings ---------------------------------------------
    def with_settings(self, stateful=False, batch_size=None, **changes):
        """A copy with other memory_length / clamp_length / same_length...

        Weights do not depend on those settings (the paper evaluates with a
        longer memory than it trains with); the copy shares no variables. A
        field the weights were trained with (`keras_txl.config.TRAINED_FIELDS`:
        widths, `pre_layer_norm`, `layer_norm_epsilon`, ...) may be repeated,
        not changed.
        """
        self.txl_config.check_trained_fields(changes, "this model's config")
        config = self.txl_config.replace(**changes)
        dtype = self.dtype_policy
        # A model quantized in place (`quantize`) keeps float policies at the
        # top and its layers' modes in keras-hub's policy map: the copy is
        # built quantized from that map (its int8 kernels would not fit a
        # float copy).
        saved = self.backbone.get_config().get("dtype")
        if isinstance(saved, dict) and saved.get("class_name") == "DTypePolicyMap":
            dtype = keras.dtype_policies.deserialize(saved)
        clone = TransformerXLCausalLM(
            config, preprocessor=self.preprocessor, stateful=stateful,
            batch_size=batch_size, dtype=dtype,
        )
        clone.assign_weights_from(self)
        return clone

    def model_weights(self):
        """All weights but the stateful memory, in a fixed order."""
        return [
            w for w in self.weights
            if w is not self.memory
        ]

    def assign_weights_from(self, other):
        """Copies the weights of a model with the same architecture.

        The memory variable (if any) is left alone, so a stateful model can
        take the weights of a pure one and the other way round. The LoRA
        adapters of `other` (`backbone.enable_lora`) are added to this
        model first, with their rank and layers, so a copy adapts as it does.
        """
        lora = getattr(other.backbone, "_lora_target_names", None)
        if lora is not None and getattr(self.backbone, "_lora_target_names", None) is None:
            self.backbone.enable_lora(other.backbone._lora_rank, target_layer_names=lora)
        source, target = other.model_weights(), self.model_weights()
        if len(source) != len(target) or any(
            tuple(a.shape) != tuple(b.shape) for a, b in zip(source, target)
        ):
            raise ValueError(
                "assign_weights_from() needs a model with the same "
                "architecture; the weight shapes differ."
            )
        for s, t in zip(source, target):
            t.assign(s)

    # --- keras-hub: presets -------------------------------------------------
    def save_to_preset(self, preset_dir, max_shard_size=10):
        """keras-hub's `save_to_preset`, written atomically, with a
        `manifest.json`, and a mixed-precision model saved as its float32
        weights.

        The preset is written beside `preset_dir` under a temporary name and
        renamed into place (`keras_txl.folders.write_preset`): a killed save
        leaves the previous preset, never half of one. `preset_dir` must be
        new, an empty folder or a keras-hub preset (replaced; its README.md
        is kept): a folder holding other files is refused, not deleted.

        keras-hub's loader reads a plain float dtype in the preset's config
        as "the weights' dtype" and builds the model in the loading
        process's policy (or its `dtype=` argument), but cannot read a mixed
        policy's name ("Invalid dtype: mixed_bfloat16"): a model trained in
        `mixed_bfloat16` or `mixed_float16` would leave a preset nothing
        loads. Its variables are float32 anyway, so the preset says so, and
        is loaded in whatever precision the user asks for
        (`from_preset(..., dtype="mixed_bfloat16")`).
        """
        policy = self.dtype_policy
        if (policy.quantization_mode is None
                and policy.compute_dtype != policy.variable_dtype):
            copy = TransformerXLCausalLM(
                self.txl_config, preprocessor=self.preprocessor,
                dtype=policy.variable_dtype, stateful=self.stateful,
                batch_size=self.batch_size if self.stateful else None,
            )
            copy.assign_weights_from(self)
            if self.stateful:  # the memory too, as the model's own save would
                copy.memory.assign(ops.cast(self.memory, copy.memory.dtype))
            return copy.save_to_preset(preset_dir, max_shard_size=max_shard_size)
        def write(staging):
            CausalLM.save_to_preset(self, staging, max_shard_size=max_shard_size)
            # Last: the sizes and sha256s a loader checks (`folders.verify_manifest`).
            folders.write_manifest(staging)

        folders.write_preset(preset_dir, write)

    @classmethod
    def from_preset(cls, preset, load_weights=True, limits=None, **kwargs):
        """keras-hub's `from_preset`, with a local folder checked first.

        A local preset folder's config must be a TransformerXLBackbone's
        within `limits` (see `keras_txl.limits`), its weights file and, when
        it has a preprocessor, its tokenizer must be there, all before a
        layer is built; the tokenizer's vocabulary must match the model's.
        `hf://` and `kaggle://` handles go to keras-hub; an `hf://` preset
        that is not in the Hugging Face cache fails at once, by name, when
        the Hub cannot be reached or `HF_HUB_OFFLINE` is set
        (`folders.check_hf_handle`) instead of after huggingface_hub's
        retries, and a `kaggle://` one when Kaggle cannot be reached
        (`folders.check_kaggle_handle`, unless a versioned handle is in the
        kagglehub cache).

        Args:
            preset: a local preset folder or a keras-hub handle.
            load_weights: bool.
            limits: None, a dict or a `keras_txl.limits.Limits`.
            stateful, batch_size: as for the constructor; by default those
                the preset was saved with (its task.json), and `stateful=True`
                alone takes a stateful preset's `batch_size`. The weights are
                loaded into the model the files hold, which then gets
                these settings (`with_settings`, as `load_preset` does).
            **kwargs: `TransformerXLConfig` fields, evaluation settings
                (`memory_length`, `clamp_length`, `same_length`, `dropout`,
                ...) that override the preset's, as for `load_pretrained`
                (a field the weights were trained with may be repeated, not
                changed); the rest is passed to keras-hub (e.g. `dtype`).
        """
        fields = {field.name for field in dataclasses.fields(TransformerXLConfig)}
        changes = {key: kwargs.pop(key) for key in list(kwargs) if key in fields}
        stateful = kwargs.pop("stateful", None)
        batch_size = kwargs.pop("batch_size", None)
        if stateful is not None:
            stateful = checks.boolean("stateful", stateful)
        if folders.is_local_preset(preset):
            preset = os.fspath(preset)
            folders.check_preset_folder(preset, limits)
            # (After the checks: task.json and task.weights.h5 are then
            # bounded, regular files.)
            saved = _saved_settings(preset)
            if stateful is None:
                stateful, batch_size = saved["stateful"], saved["batch_size"]
            elif stateful and batch_size is None and saved["stateful"]:
                # The preset's own batch: stateful=True alone was refused
                # ("needs a fixed positive integer `batch_size`") although
                # the preset says which.
                batch_size = saved["batch_size"]
            # Built as the weights files hold it (a stateful preset's task
            # weights include its memory), then given the settings asked for.
            kwargs["stateful"], kwargs["batch_size"] = saved["memory_rows"] is not None, saved["memory_rows"]
            if not any(os.path.lexists(os.path.join(preset, name)) for name in (
                    folders.PRESET_TASK_FILE, folders.PRESET_TOKENIZER_FILE)):
                # A backbone's preset (`TransformerXLBackbone.save_to_preset`):
                # no tokenizer to build a preprocessor from (keras-hub would
                # call the preprocessor's constructor without one); the model
                # reads token ids.
                kwargs.setdefault("preprocessor", None)
            model = folders.load_preset_folder(
                super().from_preset, preset, load_weights=load_weights, **kwargs)
            if stateful != model.stateful or (stateful and batch_size != model.batch_size):
                model = model.with_settings(stateful=stateful, batch_size=batch_size)
        else:
            model = folders.load_preset_handle(
                super().from_preset, preset, load_weights=load_weights, **kwargs)
            if stateful is not None and (
                stateful != model.stateful
                or (stateful and batch_size != model.batch_size)
            ):
                model = model.with_settings(stateful=stateful, batch_size=batch_size)
        if changes:
            # keras-hub passed them to the constructor, which refused them
            # ("Unrecognized keyword arguments"): a copy with the settings,
            # the preset's trained fields checked by `with_settings`.
            model.txl_config.check_trained_fields(changes, f"the preset {preset!r}")
            model = model.with_settings(stateful=model.stateful,
                                        batch_size=model.batch_size, **changes)
        if model.preprocessor is not None:
            check_preprocessor(
                model.preprocessor, model.txl_config.vocabulary_size, loaded=True
            )
        return model

    # --- keras-hub: compile, generate, fit ---------------------------------
    @property
    def sampler(self):
        """The sampler `generate()` uses (None before `compile`)."""
        return getattr(self, "_sampler", None)

    @sampler.setter
    def sampler(self, sampler):
        # keras-hub's `compile` turns a name into a sampler; assigned
        # directly (`model.sampler = "greedy"`), the string reached
        # generate() and failed with an AttributeError. And the compiled
        # generate function kept the sampler it was traced with: a new one
        # was ignored in silence until the next compile().
        self._sampler = None if sampler is None else sampler_object(sampler)
        self.generate_function = None

    def compile(self, optimizer="auto", loss="auto", *, weighted_metrics="auto",
                sampler="top_k", **kwargs):
        """keras-hub's `CausalLM.compile`, with the sampler checked here.

        Args:
            sampler: a keras-hub sampler name (one of `SAMPLERS`) or a
                `keras_hub.samplers.Sampler`, used by `generate()`. Refused
                here: contrastive search, `BeamSampler(return_all_beams=True)`
                and a `k` / `num_beams` that is not a positive integer
                (`check_sampler`); a top-k `k` above the vocabulary keeps
                every id (`keras_txl.decoding.clamp_top_k`).
            loss: "auto" (default) is `TokenCrossEntropy`: the mean
                cross-entropy over the tokens whose weight counts (padding
                of strings excluded from the sum and from the count).
                The outputs are log-probabilities: a cross-entropy loss or
                metric must take them as logits (`from_logits=True`);
                one that reads probabilities (Keras' string names such as
                "sparse_categorical_crossentropy", keras-hub's
                `Perplexity()`) is refused (`check_reads_log_probs`).
            jit_compile: as in Keras ("auto" by default). For `generate()`,
                "auto" means XLA (see `generate_jit_compile`); `fit` keeps
                Keras' own resolution (off on a CPU-only host). Under a
                MirroredStrategy with a CPU replica, `fit`, `evaluate` and
                `predict` run without XLA, with a warning, as `txl train`
                does: XLA cannot reach the other replicas' variables there.
            Other arguments: as `keras_hub.models.CausalLM.compile`.
        """
        jit_compile = kwargs.get("jit_compile", "auto")
        if jit_compile not in ("auto", True, False):
            raise ValueError(
                "`jit_compile` must be 'auto', True or False, received "
                f"jit_compile={jit_compile!r}."
            )
        self._generate_jit = jit_compile
        if jit_compile is True and _xla_cannot_reach_the_replicas(self.distribute_strategy):
            # The first step failed with "Trying to access resource
            # .../replica_1/... located in device CPU:1 from device CPU:0".
            warnings.warn(
                "jit_compile=True is not used by fit/evaluate/predict under "
                f"{type(self.distribute_strategy).__name__} with a CPU replica: XLA "
                "cannot reach the other replicas' variables there (it is used when "
                "every replica is a GPU); generate() still uses it.", stacklevel=2)
            kwargs["jit_compile"] = False
        if "steps_per_execution" in kwargs:
            # 0 failed at the first fit/evaluate with "range() arg 3 must not
            # be zero"; a float or a negative number later still.
            kwargs["steps_per_execution"] = checks.positive_int(
                "steps_per_execution", kwargs["steps_per_execution"])
        sampler = sampler_object(sampler)
        check_sampler(sampler)
        check_reads_log_probs("loss", loss)
        check_reads_log_probs("metrics", kwargs.get("metrics"))
        check_reads_log_probs("weighted_metrics", weighted_metrics)
        if isinstance(loss, str) and loss == "auto":
            loss = TokenCrossEntropy()
        super().compile(
            optimizer=optimizer, loss=loss, weighted_metrics=weighted_metrics,
            sampler=sampler, **kwargs,
        )
        # The tokens a batch's loss is the mean over: the weights' sum for
        # a loss that divides by it, every position for Keras' default.
        # (`self.loss`: Keras keeps the previous loss when `loss` is None.)
        losses = [v for v in tree.flatten(getattr(self, "loss", None)) if v is not None]
        self._loss_divides_by_weights = len(losses) == 1 and getattr(
            losses[0], "reduction", None) == "mean_with_sample_weight"
        # Untracked, as Keras' compile assigns its own tracker: tracked, each
        # compile added one more "loss" to `metrics` (and to evaluate's list).
        with tracking.DotNotTrackScope():
            self._loss_tracker = TokenWeightedLoss(name="loss")

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None,
                     training=True):
        """Keras' `compute_loss`; also hands the "loss" tracker the number
        of tokens the batch's loss is the mean over (`TokenWeightedLoss`):
        the weights' sum for a loss that divides by it (the default
        `TokenCrossEntropy`), every position otherwise.

        Under a `tf.distribute` strategy `TokenCrossEntropy` (any
        `TokenMeanReduction`) gives each replica its share of the global batch's mean (its sum over the
        weights of all replicas), which the tracker counts with an even
        share of the global batch's tokens; a loss of Keras' own gives each
        replica's mean, counted with the replica's own tokens. Either way
        the replicas' sums add up to the global batch's token mean."""
        loss = super().compute_loss(x, y, y_pred, sample_weight, training=training)
        tracker = getattr(self, "_loss_tracker", None)
        if isinstance(tracker, TokenWeightedLoss) and y is not None:
            losses = [v for v in tree.flatten(getattr(self, "loss", None)) if v is not None]
            if (len(losses) == 1 and isinstance(losses[0], TokenMeanReduction)
                    and losses[0].reduction == "mean_with_sample_weight"):
                weights = losses[0].counted_weights(y, sample_weight)
                count = sum_over_replicas(ops.sum(weights)) / replicas_in_sync()
            elif sample_weight is not None and self._loss_divides_by_weights:
                count = ops.sum(TokenCrossEntropy.token_weights(sample_weight, y))
            else:
                count = ops.cast(ops.size(y), "float32")
            tracker.next_count(count)
        return loss

    def get_compile_config(self):
        """Keras' compile config and the sampler, so that a `.keras` file
        reloads compiled as saved (Keras skips `compile_from_config` for a
        custom `compile`: the sampler went back to top-k and the optimizer
        and loss were lost, with a warning)."""
        config = super().get_compile_config()
        if config and getattr(self, "sampler", None) is not None:
            import keras_hub

            config = dict(config)
            config["sampler"] = keras_hub.samplers.serialize(self.sampler)
            config["jit_compile"] = getattr(self, "_generate_jit", "auto")
        return config

    def compile_from_config(self, config):
        import keras_hub

        config = dict(config)
        sampler = config.pop("sampler", None)
        config = keras.saving.deserialize_keras_object(config)
        if sampler is not None:
            config["sampler"] = keras_hub.samplers.deserialize(sampler)
        self.compile(**config)
        if getattr(self, "optimizer", None) is not None and self.built:
            self.optimizer.build(self.trainable_variables)  # its variables load next

    def generate_jit_compile(self):
        """Whether `generate()`'s compiled function uses XLA: as given to
        `compile(jit_compile=...)`, or for "auto" on, except for a bfloat16
        model on a CPU-only host.

        Keras resolves "auto" to off on a CPU-only host, for the training
        step, where XLA is slower. A decoding step is many small ops, which
        XLA fuses: on a 2-core Xeon `generate` was 1.3x-1.5x faster at batch
        1, 2.2x-2.4x at batch 8 and 1.6x-2.1x at batch 32 under XLA
        (docs/benchmarks.md, "Generation"). XLA's CPU backend lacks oneDNN's
        bf16 kernels, so a bfloat16 model stays in graph mode there.
        """
        value = getattr(self, "_generate_jit", "auto")
        if value != "auto":
            return bool(value)
        on_cpu = not tf.config.list_logical_devices("GPU")
        return not (on_cpu and self.compute_dtype == "bfloat16")

    def make_generate_function(self):
        """keras-hub's compiled generation function, XLA per
        `generate_jit_compile` (keras-hub follows Keras' `jit_compile`)."""
        if self.generate_function is not None:
            return self.generate_function
        if self.run_eagerly:
            return super().make_generate_function()
        self.generate_function = tf.function(
            self.generate_step, jit_compile=self.generate_jit_compile()
        )
        return self.generate_function

    def generate_step(self, inputs, stop_token_ids=None):
        """One batch of generation (compiled by `make_generate_function`).

        Args:
            inputs: dict with "token_ids" (B, S) int and "padding_mask"
                (B, S) bool, prompts right-padded to the length S to
                generate up to; optionally "memory" (B, L, M, D) to continue
                from and its "memory_mask" (B, M).
            stop_token_ids: tuple of ints or None.

        Returns:
            dict: "token_ids", "padding_mask" (True up to each row's stop
            token or the end), "memory" after the whole sequence.
        """
        checks.memory_for_generation(self.txl_config.memory_length)
        sampler = clamp_top_k(self.sampler, self.txl_config.vocabulary_size)
        if _has_own_loop(sampler):
            # Beam search keeps several hypotheses per row: keras-hub's own
            # loop, with the memory window as its cache (no memory out).
            return self._generate_with_sampler_loop(inputs, stop_token_ids, sampler)

        def choose(log_probs):
            return sampler.get_next_token(sampler.compute_probabilities(log_probs))

        return decode_loop(
            self, inputs["token_ids"], inputs["padding_mask"], choose,
            memory=inputs.get("memory"), memory_mask=inputs.get("memory_mask"),
            stop_token_ids=stop_token_ids,
        )

    def _generate_with_sampler_loop(self, inputs, stop_token_ids, sampler=None):
        """Samplers with their own loop (beam search): the memory's
        key/value window is the sampler's cache, fed one token per step
        from position 0, as `decode_loop` does."""
        sampler = self.sampler if sampler is None else sampler
        check_sampler(sampler)  # also when assigned without compile()
        prompt_ids = ops.cast(inputs["token_ids"], "int32")
        padding_mask = ops.cast(inputs["padding_mask"], "bool")
        # keras-hub's loop ends once every row holds a stop token outside
        # its prompt. The padding must not count as one (a word tokenizer
        # pads with its <eos>): it holds -1, which is never fed (position
        # i is fed only after it is written) and is no stop token.
        token_ids = ops.where(padding_mask, prompt_ids, -1)
        cache = initial_cache(
            self, ops.shape(token_ids)[0], inputs.get("memory"),
            inputs.get("memory_mask"),
        )
        positions = cache.pop("positions", None)
        # Whether each hypothesis met NaN or +Inf log-probabilities (as
        # `decode_loop`'s "finite"): carried in the cache, which the sampler
        # repeats and reorders with its beams.
        cache["finite"] = ops.ones((ops.shape(token_ids)[0],), "bool")

        from keras_hub.samplers import BeamSampler

        beams = sampler.num_beams if isinstance(sampler, BeamSampler) else None
        vocabulary_size = self.txl_config.vocabulary_size

        def forced(log_probs, prompt, index):
            """Beam search over the continuation only, each row as alone.

            keras-hub's beam loop ranks the beams at every position from
            `index` on, then writes the prompt's own token where the mask
            is set: started at position 1 (every row fed from its first
            token), the prompt's positions were ranked over tokens never
            placed, leaving duplicate beams with made-up scores. And it
            goes on extending the beams of a row whose beams have all
            stopped while other rows run, so a batch ranked differently
            than each prompt alone. Here a prompt position, and every
            position of a finished row, gets all its probability on the
            token it will hold (the prompt's, or a stop token): each beam
            keeps its score and no beam is replaced.

            Returns the log-probs and the (B * beams,) bool of the rows
            whose beams have all stopped (their log-probs are not used)."""
            mask = ops.repeat(padding_mask, beams, axis=0)  # as BeamSampler's beams
            in_prompt = mask[:, index]
            token = ops.where(in_prompt, prompt[:, index], 0)
            force = in_prompt
            row_done = ops.zeros_like(in_prompt)
            if stop_token_ids:
                written = ops.logical_and(
                    ops.arange(ops.shape(prompt)[1]) < index, ops.logical_not(mask))
                hits = ops.equal(prompt, stop_token_ids[0])
                for stop in stop_token_ids[1:]:
                    hits = ops.logical_or(hits, ops.equal(prompt, stop))
                stopped = ops.any(ops.logical_and(hits, written), axis=1)
                row_done = ops.all(ops.reshape(stopped, (-1, beams)), axis=1)
                row_done = ops.repeat(row_done, beams, axis=0)
                token = ops.where(in_prompt, token, stop_token_ids[0])
                force = ops.logical_or(force, row_done)
            one_hot = ops.one_hot(ops.maximum(token, 0), vocabulary_size) > 0.5
            pinned = ops.where(one_hot, 0.0, -1e9)
            return ops.where(force[:, None], pinned, log_probs), row_done

        def next(prompt, cache, index):
            fed = ops.slice(prompt, [0, index - 1], [ops.shape(prompt)[0], 1])
            step_cache = dict(cache)
            finite = step_cache.pop("finite")
            if positions is not None:
                step_cache["positions"] = positions
            hidden, new_cache = self.backbone.call_with_cache(fed, step_cache)
            new_cache.pop("positions", None)
            log_probs = self.log_probs_from_hidden(hidden)[:, 0]
            # -Inf is a valid log-probability; NaN and +Inf are not.
            bad = ops.any(ops.logical_or(
                ops.isnan(log_probs), ops.equal(log_probs, float("inf"))), axis=-1)
            if beams is not None:
                log_probs, row_done = forced(log_probs, prompt, index)
                bad = ops.logical_and(bad, ops.logical_not(row_done))
                # Every beam of a row carries the row's flag: reordering
                # the beams cannot drop it.
                bad = ops.repeat(
                    ops.any(ops.reshape(bad, (-1, beams)), axis=1), beams, axis=0)
            new_cache["finite"] = ops.logical_and(finite, ops.logical_not(bad))
            return log_probs, hidden[:, 0], new_cache

        # The sampler returns only the tokens: its loop's last state (with
        # the "finite" flags) is read as its `run_loop` returns it.
        final = []
        run_loop = sampler.run_loop

        def recording_run_loop(*args, **kwargs):
            outputs = run_loop(*args, **kwargs)
            final.append(outputs)
            return outputs

        sampler = copy.copy(sampler)
        sampler.run_loop = recording_run_loop
        token_ids = sampler(
            next=next, prompt=token_ids, cache=cache, index=1, mask=padding_mask,
            stop_token_ids=stop_token_ids, model=self,
        )
        keep = mask_after_stop(token_ids, padding_mask, stop_token_ids)
        # Positions never written (the loop ended early, every row past a
        # stop token) get their padding back; `keep` leaves them out.
        out = {
            "token_ids": ops.where(token_ids < 0, prompt_ids, token_ids),
            "padding_mask": keep,
        }
        caches = [x for outputs in final for x in outputs
                  if isinstance(x, dict) and "finite" in x]
        if caches:  # (B * beams,) flags, equal within a row
            out["finite"] = ops.all(
                ops.reshape(caches[-1]["finite"], (ops.shape(prompt_ids)[0], -1)),
                axis=1)
        return out

    def _resolve_stop_token_ids(self, stop_token_ids):
        """`generate()`'s `stop_token_ids` as a tuple of ids in [0, V) or
        None: "auto" is the tokenizer's `end_token_id` (None without a
        preprocessor), an int is a one-element tuple."""
        vocabulary_size = self.txl_config.vocabulary_size
        if isinstance(stop_token_ids, str) and stop_token_ids == "auto":
            end = None if self.preprocessor is None else getattr(
                self.preprocessor.tokenizer, "end_token_id", None
            )
            return None if end is None else (int(end),)
        return stop_token_id_tuple(stop_token_ids, vocabulary_size, allow_auto=True)

    def generate(self, inputs, max_length=None, stop_token_ids="auto",
                 strip_prompt=False, memory=None, return_memory=False,
                 memory_mask=None):
        """Generates continuations of a batch of prompts (keras-hub's API).

        Every argument is checked before anything is traced (`ValueError`
        naming it).

        Args:
            inputs: one batch of prompts of any lengths: a string, a list
                of strings, a string tensor (rank 0 or 1), a list of lists
                of token ids (or a 2-D int array, a ragged int tensor), or
                keras-hub's dict of "token_ids" (B, S) int and
                "padding_mask" (B, S) bool or 0/1, each row's mask a prefix
                of ones (prompts right-padded); or a `tf.data.Dataset` of
                such batches (generated batch by batch, the results
                concatenated). Ids must be in [0, vocabulary_size).
            max_length: int. Length of prompt plus continuation; None is
                the preprocessor's `sequence_length` (for a dict: its
                padded length S). Must be at least the longest prompt's
                length and at most `MAX_GENERATE_LENGTH` (2**20; continue a
                longer text with `memory=`). A dict's prompts are re-packed
                to it.
            stop_token_ids: "auto" (the tokenizer's `end_token_id` when it
                has one), None, an id, or a tuple of ids in [0, V).
            strip_prompt: bool. Return only the continuations.
            memory: (B, L, M, D) float memory to continue from (e.g. from
                an earlier call with `return_memory=True`), or None. Not
                with a dataset (one memory cannot follow every batch).
            return_memory: bool. Also return the memory after each row's
                whole sequence. Not with a dataset, nor with a sampler that
                runs its own loop (beam search returns no memory).
            memory_mask: (B, M) bool validity of `memory`'s slots. Required
                with `memory` when the config has `empty_memory="masked"`
                (pass the one returned with the memory); refused otherwise
                unless given with a memory.

        Returns:
            Strings for string prompts (a string for a single one), lists of
            token ids for id prompts; with `return_memory`, a pair
            `(outputs, memory)`, or, when the memory has a validity mask
            (`empty_memory="masked"`, or a `memory_mask` passed in), a
            triple `(outputs, memory, memory_mask)`, the mask to pass back with
            the memory so that a text continued in pieces equals the text
            generated in one call.
        """
        from keras_txl.prompts import normalize_prompts

        strip_prompt = checks.boolean("strip_prompt", strip_prompt)
        return_memory = checks.boolean("return_memory", return_memory)
        checks.memory_for_generation(self.txl_config.memory_length)
        if memory_mask is not None and memory is None:
            raise ValueError(
                "`memory_mask` is the validity of `memory`'s slots: pass it "
                "with the memory it came with (memory=...)."
            )
        if (isinstance(max_length, numbers.Integral)
                and not isinstance(max_length, bool)
                and max_length > MAX_GENERATE_LENGTH):
            raise ValueError(
                f"`max_length` must be at most {MAX_GENERATE_LENGTH} (2**20), "
                f"received max_length={max_length}: the (batch, max_length) "
                "buffers are allocated up front; generate a longer text in "
                "pieces, passing the memory of one call to the next "
                "(return_memory=True, memory=...)."
            )
        if self.stateful:
            raise ValueError(
                "generate() runs on a model built with stateful=False (its "
                "memory is the sampler's cache): use "
                "`model.with_settings(stateful=False)`."
            )
        stop_token_ids = self._resolve_stop_token_ids(stop_token_ids)
        if getattr(self, "sampler", None) is None:  # built with compile=False
            raise ValueError(
                "generate() needs a sampler: call "
                "`model.compile(sampler='greedy')` (or another sampler) first."
            )
        check_sampler(self.sampler)
        if return_memory and _has_own_loop(self.sampler):
            raise ValueError(
                f"`return_memory=True` is not supported with the sampler "
                f"{type(self.sampler).__name__}: it runs its own loop over "
                "several hypotheses per prompt and returns no memory. Use "
                "return_memory=False, or compile with a sampler that picks "
                "one token a step ('greedy', 'top_k', 'top_p', 'random')."
            )
        if isinstance(inputs, tf.data.Dataset):
            if memory is not None or return_memory:
                raise ValueError(
                    "`memory` and `return_memory` are not supported with a "
                    "tf.data.Dataset of prompts (one memory cannot follow "
                    "its batches): iterate over the dataset and call "
                    "generate() on each batch to pass or receive a memory."
                )
            results = []
            for batch in inputs:
                out = self.generate(batch, max_length, stop_token_ids, strip_prompt)
                # A dataset of single strings gives one string per element.
                if isinstance(out, str):
                    results.append(out)
                else:
                    results.extend(out)
            return results
        batch, kind, scalar = normalize_prompts(
            inputs, self.preprocessor, max_length,
            self.txl_config.vocabulary_size,
        )
        if memory is not None:
            memory = self._check_memory(memory, batch["token_ids"])
            memory_mask = self._memory_mask_for(
                memory, memory_mask, batch["token_ids"].shape[0], required=True
            )
            batch["memory"] = memory
            if memory_mask is not None:
                batch["memory_mask"] = memory_mask
        generate_function = self.make_generate_function()
        outputs = generate_function(batch, stop_token_ids=stop_token_ids)
        if "finite" in outputs:  # absent from a custom sampler's own loop
            bad = np.flatnonzero(~np.asarray(outputs["finite"]))
            if bad.size:
                raise ValueError(
                    "The model returned NaN or +Inf log-probabilities for "
                    f"rows {bad.tolist()[:16]} of the batch; check its weights, "
                    "the memory it was given, and for float16 an overflow."
                )
        prompt_mask = np.asarray(batch["padding_mask"])
        token_ids = np.asarray(outputs["token_ids"])
        keep = np.asarray(outputs["padding_mask"])
        if strip_prompt:
            keep = np.logical_and(keep, np.logical_not(prompt_mask))
        rows = [ids[mask] for ids, mask in zip(token_ids, keep)]
        if kind == "strings":
            detokenize = self.preprocessor.tokenizer.detokenize
            result = [
                _as_text(detokenize(tf.constant(row, tf.int32))) for row in rows
            ]
        else:
            result = [row.astype("int32") for row in rows]
        if scalar:
            result = result[0]
        if return_memory:
            if "memory_mask" in outputs:
                return result, outputs["memory"], outputs["memory_mask"]
            return result, outputs["memory"]
        return result

    def fit(self, x=None, y=None, batch_size=None, **kwargs):
        """keras `fit`; a `tf.data.Dataset` of strings is cut into ordered
        segments for the stateful model, so the memory is carried across
        them (see `TransformerXLCausalLMPreprocessor.ordered_segments`);
        for a model without state each string is one sample, as in
        keras-hub (and as a list of strings is).

        Under a `tf.distribute` strategy the stateful model's `batch_size`
        is each replica's: the ordered segments are cut into
        `batch_size * num_replicas_in_sync` streams, the rows of each
        replica's memory."""
        if kwargs.get("class_weight") is not None:
            # Keras weighs classes for one label per sample: on (batch,
            # segment_length) targets it failed in the graph.
            raise ValueError(
                "`class_weight` is not supported: the targets are (batch, "
                "segment_length) token ids, and Keras' class weights take one "
                "label per sample. Pass `sample_weight` with token ids instead "
                "(one weight per row, (batch,), or per token, (batch, "
                "segment_length)); received class_weight of "
                f"{type(kwargs['class_weight']).__name__}.")
        validation = kwargs.get("validation_data")
        if isinstance(validation, (list, tuple)) and _holds_strings(validation):
            # Keras reads a list or tuple as (x, y, sample_weight): three
            # strings became a rank-0 x, four an unknown format. Strings are
            # never targets nor weights: they are the texts.
            kwargs["validation_data"] = (list(validation),)
        if kwargs.get("validation_split") and isinstance(x, (list, tuple)) and _holds_strings(x):
            # Keras splits arrays only ("`validation_split` is only supported
            # for Tensors or NumPy arrays"): the same strings as one.
            x = np.asarray(x)
        self._check_preprocessor_for(x, "fit()")
        if (
            isinstance(x, tf.data.Dataset)
            and _is_string_spec(x.element_spec)
            and self.stateful
        ):
            _no_targets_with_texts(y, "fit()")
            for steps in ("steps_per_epoch", "validation_steps"):
                if self.stateful and kwargs.get(steps) is not None:
                    # Keras keeps the data iterator across epochs when the
                    # steps are given, while the memory restarts at each
                    # epoch (and validation) start: epoch 2 read the middle
                    # of every stream from a zero memory.
                    raise ValueError(
                        f"`{steps}` must be None when a stateful model fits a "
                        "dataset of strings: an epoch (and a validation) is one "
                        "pass over the ordered segments, whose memory restarts "
                        "with it; a shorter pass would go on mid-stream from a "
                        f"zeroed memory. Received {steps}={kwargs[steps]!r}; to "
                        "train on part of the data, give fit() fewer texts "
                        "(`dataset.take(n)`).")
            if kwargs.get("shuffle"):
                raise ValueError(
                    "`shuffle` must be False for ordered segments: the "
                    "memory carries each row's text from one batch to the next."
                )
            kwargs["shuffle"] = False
            kwargs["callbacks"] = [
                *(kwargs.get("callbacks") or []), ResetMemory()
            ]
            x = self._ordered_segments(x, "fit()")
            validation = kwargs.get("validation_data")
            if self.stateful and validation is not None:
                if not (isinstance(validation, tf.data.Dataset)
                        and _is_string_spec(validation.element_spec)):
                    raise ValueError(
                        "`validation_data` must be a tf.data.Dataset of strings too "
                        "when a stateful model fits one (it is cut into ordered "
                        "segments the same way), received "
                        f"{type(validation).__name__}."
                    )
                kwargs["validation_data"] = self._ordered_segments(
                    validation, "validation")
            return keras.Model.fit(self, x, **kwargs)
        if not self.stateful:
            _check_batched_texts(x)
            _check_batched_texts(kwargs.get("validation_data"), "validation_data")
        if _reads_strings(x):
            _nothing_made_by_the_preprocessor(sample_weight=kwargs.get("sample_weight"))
        _check_in_memory_data(x, y, kwargs.get("sample_weight"))
        _check_validation_data(kwargs.get("validation_data"))
        self._check_fit_data(x, y, kwargs.get("sample_weight"), kwargs.get("validation_data"))
        batch_size = self._check_stateful_data(x, batch_size, "fits")
        if self.stateful:
            self._check_stateful_fit(x, batch_size, kwargs)
        validation = kwargs.get("validation_data")
        if self.stateful and validation is not None:
            data = validation[0] if isinstance(validation, tuple) else validation
            self._check_stateful_data(data, kwargs.get("validation_batch_size"),
                                      "evaluates", "validation_data")
            if not isinstance(data, tf.data.Dataset):
                kwargs.setdefault("validation_batch_size", self._check_stateful_data(
                    data, kwargs.get("validation_batch_size"), "evaluates"))
        return super().fit(x, y, batch_size=batch_size, **kwargs)

    def preprocess_samples(self, x, y=None, sample_weight=None):
        # keras-hub maps the preprocessor over every batch `fit`, `evaluate`
        # and `predict` read, and its tokenizer refuses token ids: a model
        # with a preprocessor (every preset's) could not read ids, ordered
        # segments included. Only strings are preprocessed; ids (a tensor,
        # an array, keras-hub's dict) go to the model as they are.
        if not any(_holds_strings(leaf) for leaf in tf.nest.flatten(x)):
            if sample_weight is not None and y is not None:
                # A weight per row counts for each of its positions: the
                # loss and the weighted metrics see one (batch, T) shape
                # (a (batch,) weight failed in the loss, and weights of both
                # ranks in one model reached the metrics with unknown rank).
                sample_weight = TokenCrossEntropy.token_weights(sample_weight, y)
            return keras.utils.pack_x_y_sample_weight(x, y, sample_weight)
        # keras-hub's preprocessor makes the targets (the next tokens) and
        # the weights (the padding mask) of strings and dropped these in
        # silence.
        _nothing_made_by_the_preprocessor(y=y, sample_weight=sample_weight)
        return super().preprocess_samples(x, y, sample_weight)

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Keras 3 builds a model made under a tf.distribute strategy from
        # the MEAN of the replicas' first batches (`strategy.reduce`), which
        # turns int token ids into floats and fails on a bool mask. Build
        # from the first replica's own batch instead: its dtypes and its
        # per-replica shape are what every step sees.
        strategy = getattr(self, "_distribute_strategy", None)
        if iterator is not None and strategy is not None:
            for _, _, batches in iterator:
                batch = next(batches)
                break
            else:
                batch = None
            if batch is not None:
                data_batch = tf.nest.map_structure(
                    lambda v: strategy.experimental_local_results(v)[0]
                    if isinstance(v, tf.distribute.DistributedValues) else v,
                    batch)
                iterator = None
        return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)

    def get_config(self):
        config = super().get_config()  # backbone, preprocessor, name
        config.update(stateful=self.stateful, batch_size=self.batch_size)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if "backbone" in config and isinstance(config["backbone"], dict):
            config["backbone"] = keras.layers.deserialize(config["backbone"])
        if "preprocessor" in config and isinstance(config["preprocessor"], dict):
            config["preprocessor"] = keras.layers.deserialize(config["preprocessor"])
        return cls(**config)
