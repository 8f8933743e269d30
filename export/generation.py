"""Generation backends for exported models: the sampling loop's view of them.

`keras_txl.generation.generate` / `generate_iter` drive any object with
`segment_length`, `vocabulary_size`, `masked`,
`initial_state(memory=None, memory_mask=None)` and
`run(token_ids, state, position=-1) -> (log_probs (V,), new_state)`. These two
run what `txl export` writes, through the export contract of
`keras_txl.export.signatures`:

- `SavedModelBackend(path)`: a SavedModel's `next_token` signature (and
  `serving_default` to read a non-last position of a segment).
- `TFLiteBackend(runner)`: a stateless TFLite model (fixed B and T), the same
  signatures, run by `keras_txl.export.tflite.TFLiteRunner`.

`tflite_generate` is what an app does with a TFLite model exported with
T = 1: a host loop over the LiteRT interpreter, one token per call with the
memory fed back. (LiteRT has no tensorflow-text ops and no while-loop over
a string tokenizer, so the TFLite model keeps id-level signatures; the
Keras model and the SavedModel decode in the graph instead.) Fed one token
at a time from an empty memory, it gives the tokens of
`TransformerXLCausalLM.generate` (greedy: the same ids).

An export of a model with `empty_memory="masked"` takes a `memory_mask`
(B, M) bool with every memory (its signature lists it): the backends then
carry `{"memory", "memory_mask"}` as their state, starting from masked
slots (all False) as `KerasBackend` does, and `tflite_generate` takes and
returns the mask with the memory, as `model.generate` does.
"""

import json
import os

import numpy as np
import tensorflow as tf

from keras_txl import checks
from keras_txl import register_text_ops
from keras_txl.config import TransformerXLConfig
from keras_txl.export import serving
from keras_txl.export import signatures as sig
from keras_txl.export.tflite import TFLiteRunner


def one_row_memory(memory, row_shape, batch):
    """A checked (1, L, M, D) memory (`checks.one_text_memory`) repeated over
    the exported model's fixed batch."""
    return np.repeat(checks.one_text_memory("memory", memory, row_shape), batch, 0)


def one_row_memory_mask(memory_mask, memory_length, batch):
    """A checked (1, M) bool memory mask (`checks.one_text_memory_mask`:
    0/1 or float masks are refused, not cast, as the Keras model refuses
    them) repeated over the exported model's fixed batch."""
    return np.repeat(
        checks.one_text_memory_mask("memory_mask", memory_mask, memory_length), batch, 0)


def _initial_mask(memory, memory_length, batch, memory_mask=None):
    """The mask of a state that starts from `memory` with its (1, M)
    `memory_mask` (None: every slot real) or from the empty memory (every
    slot masked), as `KerasBackend`."""
    if memory is not None and memory_mask is not None:
        return one_row_memory_mask(memory_mask, memory_length, batch)
    return np.full((batch, memory_length), memory is not None, bool)


def _shown(value, limit=80):
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _prompt_list(prompts):
    """`prompts` as a non-empty list of str/bytes: a list or tuple of them,
    or a 1-D numpy array or string tensor of them (as `model.generate` takes
    a rank-1 string tensor); ValueError naming `prompts` for anything else
    (one string is refused: it is not read as one prompt per character)."""
    given = prompts
    if tf.is_tensor(prompts) and prompts.dtype == tf.string and prompts.shape.rank == 1:
        prompts = prompts.numpy()
    if isinstance(prompts, np.ndarray) and prompts.ndim == 1:
        prompts = prompts.tolist()
    if (not isinstance(prompts, (list, tuple)) or not prompts
            or not all(isinstance(p, (str, bytes)) for p in prompts)):
        raise ValueError(
            "`prompts` must be a non-empty list of strings (or a 1-D array or "
            f"string tensor of them), received {_shown(given)}.")
    return list(prompts)


class SavedModelBackend:
    """Runs an exported SavedModel through its `next_token` signature.

    Args:
        path: str. The version folder (`<out>/txl/1`) or the model base
            folder (`<out>/txl`, its highest version is used).

    Attributes:
        directory: the version folder.
        config: the `TransformerXLConfig` exported with it.
        tokenizer_dir: `assets.extra/tokenizer` if exported, else None.
    """

    def __init__(self, path):
        self.directory = serving.resolve_version_dir(path)
        extra = os.path.join(self.directory, serving.ASSETS_EXTRA)
        config_path = os.path.join(extra, "config.json")
        if not os.path.isfile(config_path):
            raise ValueError(
                f"No {config_path}: not a keras-txl SavedModel export."
            )
        self.config = TransformerXLConfig.from_json(config_path)
        self.vocabulary_size = self.config.vocabulary_size
        info = {}
        info_path = os.path.join(extra, "export.json")
        if os.path.isfile(info_path):
            with open(info_path) as f:
                info = json.load(f)
        self.batch_size = info.get("batch_size") or 1
        self.segment_length = info.get("segment_length")
        # The `generate` signature's caps (export.json), None if unrecorded.
        self.max_new_tokens = (info.get("generate_caps") or {}).get("max_new_tokens")
        self.max_batch_size = (info.get("generate_caps") or {}).get("max_batch_size")
        self.max_prompt_tokens = (info.get("generate_caps") or {}).get("max_prompt_tokens")
        self._tokenizer = None  # loaded on first use, to count a prompt's tokens
        tokenizer = os.path.join(extra, "tokenizer")
        self.tokenizer_dir = tokenizer if os.path.isdir(tokenizer) else None
        register_text_ops()  # its text signatures may use tensorflow-text's ops
        self._module = tf.saved_model.load(self.directory)
        missing = [n for n in (sig.NEXT_TOKEN, sig.SERVING_DEFAULT)
                   if n not in self._module.signatures]
        if missing:
            raise ValueError(
                f"The SavedModel in {self.directory} has no {missing} "
                f"signature(s) (found {sorted(self._module.signatures)})."
            )
        self._next_token = self._module.signatures[sig.NEXT_TOKEN]
        self._serving_default = self._module.signatures[sig.SERVING_DEFAULT]
        self._generate = self._module.signatures.get(sig.GENERATE)
        # The export's own signature says whether the memory travels with
        # its validity (a model with empty_memory="masked").
        self.masked = (sig.MEMORY_MASK
                       in self._next_token.structured_input_signature[1])

    @property
    def has_generate(self):
        """True when the export has the text-level `generate` signature
        (the model was exported with a preprocessor)."""
        return self._generate is not None

    def generate_texts(self, prompts, max_new_tokens, temperature=0.0,
                       top_k=0, top_p=1.0, seed=0):
        """The continuations of `prompts` (list of str, or a 1-D array or
        string tensor of them) by the `generate`
        signature: the whole loop in the graph, one call. Each is decoded
        alone (a word tokenizer's continuation has no leading space: to
        print it after its prompt, decode `generate_ids`' ids with it)."""
        out = self._call_generate(prompts, max_new_tokens, temperature, top_k, top_p, seed)
        return [t.decode("utf-8", errors="replace")
                for t in out[sig.TEXTS].numpy()]

    def generate_ids(self, prompts, max_new_tokens, temperature=0.0,
                     top_k=0, top_p=1.0, seed=0):
        """The new token ids of `prompts` (list of str) by the `generate`
        signature, one int32 array per prompt (up to its stop token)."""
        out = self._call_generate(prompts, max_new_tokens, temperature, top_k, top_p, seed)
        lengths = out[sig.LENGTHS].numpy()
        return [ids[:length] for ids, length in zip(out[sig.TOKEN_IDS].numpy(), lengths)]

    def _check_prompt_tokens(self, prompts):
        """Each prompt's tokens, counted with the export's own tokenizer as
        `txl generate` counts them: at least one (a word tokenizer makes
        none of "   ") and at most the export's prompt cap (`generate_caps`).
        Either was the signature's assertion in a graph error. Unchecked
        without an exported tokenizer (the signature still refuses them)."""
        if self.tokenizer_dir is None:
            return
        if self._tokenizer is None:
            from keras_txl.tokenizers import load_tokenizer

            self._tokenizer = load_tokenizer(self.tokenizer_dir)
        for index, prompt in enumerate(prompts):  # bytes, as text_bytes gave them
            count = len(self._tokenizer.encode(prompt.decode("utf-8", "surrogateescape")))
            if count == 0:
                raise ValueError(
                    f"`prompts`[{index}] tokenizes to no token: every prompt needs at "
                    f"least one token to continue, received {_shown(prompt)}.")
            if self.max_prompt_tokens and count > self.max_prompt_tokens:
                raise ValueError(
                    f"`prompts`[{index}] holds {count} tokens, more than the "
                    f"{self.max_prompt_tokens} this export's generate signature takes "
                    "(the cap its export.json records): shorten it, or continue a longer "
                    "text with the id-level loop over next_token.")

    def _call_generate(self, prompts, max_new_tokens, temperature, top_k, top_p, seed):
        from keras_txl.export.serving import generate_request

        if not self.has_generate:
            raise ValueError(
                f"The SavedModel in {self.directory} has no "
                f"{sig.GENERATE!r} signature (export a model with a "
                "preprocessor); use the id-level loop instead."
            )
        from keras_txl.generation import check_sampling
        from keras_txl.generation import check_seed

        # Checked here, before the numpy casts of `generate_request`: a
        # string was read as one prompt per character, 2.5 new tokens or
        # top_k=2.5 cut to 2, and a seed or length past the int dtypes was
        # numpy's OverflowError.
        prompts = _prompt_list(prompts)
        # As the tokenizers read a str (`text_bytes`): U+DC80-U+DCFF, what
        # surrogateescape makes of a byte that is not UTF-8 (a shell
        # argument), are that byte, as for a Keras model; any other lone
        # surrogate is a ValueError naming the prompt. generate_request's
        # strict encode was a UnicodeEncodeError ("surrogates not allowed").
        from keras_txl.tokenizers import text_bytes

        prompts = [text_bytes(p, f"prompts[{i}]") for i, p in enumerate(prompts)]
        # What the signature would refuse with an assertion buried in a
        # graph error, said here by name.
        empty = [i for i, p in enumerate(prompts) if not p]
        if empty:
            raise ValueError(
                f"`prompts`[{empty[0]}] is empty: every prompt needs at least one token "
                "to continue.")
        if self.max_batch_size and len(prompts) > self.max_batch_size:
            raise ValueError(
                f"`prompts` may hold at most {self.max_batch_size} prompts per request (the "
                f"cap of this export's generate signature), received {len(prompts)}: "
                "split them into several calls.")
        self._check_prompt_tokens(prompts)
        max_new_tokens = checks.positive_int("max_new_tokens", max_new_tokens)
        # The export's cap; unrecorded, the int32 of the request (the
        # signature refuses more than its own cap).
        cap = self.max_new_tokens or 2**31 - 1
        if max_new_tokens > cap:
            raise ValueError(
                f"`max_new_tokens` must be <= {cap} (the cap of this export's "
                f"generate signature), received max_new_tokens={max_new_tokens}.")
        temperature, top_k, top_p = check_sampling(temperature, top_k, top_p)
        top_k = min(top_k, self.vocabulary_size)  # as the signature clamps it
        seed = check_seed(seed)
        if seed is None:  # as the host loop: a new seed each call
            seed = int(np.random.default_rng().integers(2**62))
        inputs = generate_request(prompts, max_new_tokens, temperature,
                                  top_k, top_p, seed)
        return self._generate(**{k: tf.constant(v) for k, v in inputs.items()})

    def initial_state(self, memory=None, memory_mask=None):
        """The memory (a tensor), or for a masked export `{"memory",
        "memory_mask"}`: masked slots from the empty memory, from a given
        memory those its (1, M) `memory_mask` says (every slot real without
        one), as `KerasBackend`."""
        cfg = self.config
        given = memory
        if memory is None:
            memory = np.zeros(
                (1, cfg.num_layers, cfg.memory_length, cfg.hidden_dim),
                np.float32,
            )
        memory = tf.convert_to_tensor(one_row_memory(
            memory, (cfg.num_layers, cfg.memory_length, cfg.hidden_dim), self.batch_size))
        if not self.masked:
            return memory
        return {sig.MEMORY: memory, sig.MEMORY_MASK: tf.constant(
            _initial_mask(given, cfg.memory_length, self.batch_size, memory_mask))}

    def run(self, token_ids, state, position=-1):
        token_ids = np.repeat(np.asarray(token_ids, np.int32), self.batch_size, 0)
        last = position in (-1, token_ids.shape[1] - 1)
        signature = self._next_token if last else self._serving_default
        inputs = dict(state) if self.masked else {sig.MEMORY: state}
        out = signature(**{sig.TOKEN_IDS: tf.constant(token_ids), **inputs})
        log_probs = out[sig.LOG_PROBS].numpy()[0]  # (V,) or (T, V)
        if not last:
            log_probs = log_probs[position]
        if self.masked:
            return log_probs, {sig.MEMORY: out[sig.MEMORY],
                               sig.MEMORY_MASK: out[sig.MEMORY_MASK]}
        return log_probs, out[sig.MEMORY]


class TFLiteBackend:
    """Runs a stateless TFLite export (fixed B and T) with the memory.

    Args:
        runner: an `keras_txl.export.tflite.TFLiteRunner` (or an object with its
            `run(signature, **inputs)`, `batch_size`, `segment_length`,
            `vocabulary_size`, `memory_shape` and `stateful`).

    A model exported with T = 1 runs the "token" schedule through
    `next_token`; one with T > 1 runs the "segment" schedule, padding the
    current segment to T and reading the log-probs of its last real
    position from `serving_default`.
    """

    def __init__(self, runner):
        if getattr(runner, "stateful", False):
            raise ValueError(
                "Generation needs the stateless TFLite model (memory in and "
                "out): the stateful one cannot re-run a partial segment. "
                "Export without --stateful."
            )
        self.runner = runner
        self.batch_size = runner.batch_size
        self.segment_length = runner.segment_length
        self.vocabulary_size = runner.vocabulary_size
        self.memory_shape = tuple(runner.memory_shape)
        mask_shape = getattr(runner, "memory_mask_shape", None)
        self.memory_mask_shape = None if mask_shape is None else tuple(mask_shape)
        self.masked = self.memory_mask_shape is not None
        self.tokenizer_dir = None

    @classmethod
    def from_file(cls, path, num_threads=None):
        """Opens a .tflite file written by `txl export --format tflite`.

        The tokenizer exported beside the file, if any, is in
        `tokenizer_dir`.
        """
        if not os.path.isfile(path):
            raise ValueError(f"No TFLite file {path!r}.")
        backend = cls(TFLiteRunner(path, num_threads=num_threads))
        tokenizer = os.path.join(os.path.dirname(os.path.abspath(path)),
                                 "tokenizer")
        backend.tokenizer_dir = tokenizer if os.path.isdir(tokenizer) else None
        return backend

    def initial_state(self, memory=None, memory_mask=None):
        """As `SavedModelBackend.initial_state` (a dict for a masked model)."""
        given = memory
        if memory is None:
            memory = np.zeros(self.memory_shape, np.float32)
        else:
            memory = one_row_memory(memory, self.memory_shape[1:], self.batch_size)
        if self.memory_mask_shape is None:
            return memory
        return {sig.MEMORY: memory, sig.MEMORY_MASK: _initial_mask(
            given, self.memory_mask_shape[1], self.batch_size, memory_mask)}

    def run(self, token_ids, state, position=-1):
        token_ids = np.repeat(np.asarray(token_ids, np.int32), self.batch_size, 0)
        if token_ids.shape[1] != self.segment_length:
            raise ValueError(
                f"This TFLite model takes segments of exactly "
                f"{self.segment_length} tokens, received {token_ids.shape[1]}."
            )
        last = position in (-1, token_ids.shape[1] - 1)
        signature = sig.NEXT_TOKEN if last else sig.SERVING_DEFAULT
        masked = self.memory_mask_shape is not None
        inputs = dict(state) if masked else {sig.MEMORY: state}
        out = self.runner.run(signature, **{sig.TOKEN_IDS: token_ids, **inputs})
        log_probs = out[sig.LOG_PROBS][0]  # (V,) or (T, V)
        if not last:
            log_probs = log_probs[position]
        if masked:
            return log_probs, {sig.MEMORY: out[sig.MEMORY],
                               sig.MEMORY_MASK: out[sig.MEMORY_MASK]}
        return log_probs, out[sig.MEMORY]


def tflite_generate(model, prompt_ids, max_new_tokens, temperature=0.0,
                    top_k=0, top_p=1.0, seed=None, stop_token_ids=None,
                    memory=None, on_token=None, memory_mask=None):
    """Decodes with a stateless TFLite model of T = 1, token by token.

    Args:
        model: a `TFLiteRunner`, or the path of a .tflite file exported
            with `--segment-length 1` (stateless).
        prompt_ids: 1-D ints in [0, V), at least one.
        max_new_tokens: int >= 0.
        temperature, top_k, top_p, seed: as
            `keras_txl.generation.sampler_from_options` (a keras-hub
            sampler; temperature 0: greedy).
        stop_token_ids: None, an id or a tuple of ids in [0, V) that end
            the continuation (kept).
        memory: (1, L, M, D) memory to start from, or None (the empty
            memory: zeros, and masked slots for a model exported with
            `empty_memory="masked"`).
        on_token: callable or None, called with each new id.
        memory_mask: (1, M) bool validity of `memory`'s slots. Required
            with `memory` for a model whose signatures take a
            `memory_mask` (pass the one returned with the memory, as to
            `model.generate`); refused for any other model.

    Returns:
        `(new ids int32 array, memory (1, L, M, D))`: the memory after the
        prompt and every new id (the last one fed too), to continue from.
        For a model with a memory mask, a triple `(ids, memory,
        memory_mask (1, M) bool)`, as `model.generate(...,
        return_memory=True)` returns.

    Raises:
        ValueError: a stateful model, T != 1, bad prompt or settings, a
            memory without its mask (masked model), or a mask for a model
            that takes none.
    """
    from keras_txl.decoding import stop_token_id_tuple
    from keras_txl.generation import check_max_new_tokens
    from keras_txl.generation import check_sampling
    from keras_txl.generation import sample_next
    from keras_txl.generation import sampler_from_options

    runner = TFLiteRunner(model) if isinstance(model, str) else model
    if getattr(runner, "stateful", False) or runner.segment_length != 1:
        raise ValueError(
            "tflite_generate needs a stateless TFLite model exported with "
            f"--segment-length 1 (this one: segment_length="
            f"{runner.segment_length}, stateful={runner.stateful})."
        )
    temperature, top_k, top_p = check_sampling(temperature, top_k, top_p)
    prompt = np.asarray(prompt_ids)
    if prompt.ndim == 1 and prompt.size == 0:
        # np.asarray([]) is float64: said as what it is, not as its dtype.
        raise ValueError("`prompt_ids` is empty: it must hold at least one token id.")
    if prompt.ndim != 1 or prompt.dtype.kind not in "iu":
        raise ValueError(
            "`prompt_ids` must be a non-empty 1-D sequence of int ids, "
            f"received shape {prompt.shape} and dtype {prompt.dtype}."
        )
    # Before anything runs, by this function's name: an id past int32 was
    # numpy's OverflowError after the ids before it had run.
    low, high = int(prompt.min()), int(prompt.max())
    if low < 0 or high >= runner.vocabulary_size:
        raise ValueError(
            f"`prompt_ids` must hold ids in [0, vocabulary_size={runner.vocabulary_size}), "
            f"received values in [{low}, {high}].")
    max_new_tokens = check_max_new_tokens(max_new_tokens, prompt.size)
    if on_token is not None and not callable(on_token):
        # Checked before anything runs, not at the first new id.
        raise ValueError(
            "`on_token` must be None or a callable taking each new id, "
            f"received {type(on_token).__name__}.")
    # An id was a TypeError ("'int' object is not iterable"), an id outside
    # the vocabulary never stopped anything, in silence.
    stops = set(stop_token_id_tuple(stop_token_ids, runner.vocabulary_size) or ())
    batch = runner.batch_size
    mask_shape = getattr(runner, "memory_mask_shape", None)
    if mask_shape is None and memory_mask is not None:
        raise ValueError(
            "`memory_mask` is only for a model exported with "
            "empty_memory='masked' (its signatures take a memory_mask); this "
            "model counts every memory slot as real: pass memory alone.")
    if memory is None and memory_mask is not None:
        raise ValueError(
            "`memory_mask` goes with a `memory`: without one the generation "
            "starts from the empty memory (every slot masked).")
    if mask_shape is not None and memory is not None and memory_mask is None:
        raise ValueError(
            "`memory_mask` is required with `memory` for this model (exported "
            "with empty_memory='masked'): pass the mask returned with the "
            "memory (tflite_generate's third value), or "
            f"np.ones((1, {mask_shape[1]}), bool) if every slot holds real memory.")
    state = {sig.MEMORY: np.zeros(runner.memory_shape, np.float32) if memory is None
             else one_row_memory(memory, tuple(runner.memory_shape)[1:], batch)}
    if mask_shape is not None:
        state[sig.MEMORY_MASK] = (
            np.zeros(mask_shape, bool) if memory is None
            else one_row_memory_mask(memory_mask, mask_shape[1], batch))
    sampler = sampler_from_options(temperature, top_k, top_p, seed)

    def feed(token, state):
        ids = np.full((batch, 1), int(token), np.int32)  # every row the same
        out = runner.run(sig.NEXT_TOKEN, **{sig.TOKEN_IDS: ids, **state})
        return out[sig.LOG_PROBS][0], {k: out[k] for k in state}

    for token in prompt:
        log_probs, state = feed(token, state)
    new = []
    for _ in range(max_new_tokens):
        token = sample_next(log_probs, sampler)
        new.append(token)
        if on_token is not None:
            on_token(token)
        log_probs, state = feed(token, state)  # the memory covers it too
        if token in stops:
            break
    if mask_shape is not None:
        return (np.asarray(new, np.int32), state[sig.MEMORY][:1],
                state[sig.MEMORY_MASK][:1])
    return np.asarray(new, np.int32), state[sig.MEMORY][:1]
