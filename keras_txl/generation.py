"""Sampling with the memory, on the Keras model or an exported one.

Keras models generate through keras-hub: `generate_ids` / `generate_text`
map temperature, top-k, top-p and seed to a keras-hub sampler
(`sampler_from_options`) and call `TransformerXLCausalLM.generate`, the
compiled, batched loop (`keras_txl.decoding`). The host loop below (one
compiled step per token, the same keras-hub samplers) remains for exported models that
only have id-level signatures (a TFLite model; a SavedModel without the
`generate` signature) and for `txl generate`'s streaming.

One sampling loop (`generate` / `generate_iter`) drives any of three
backends through the same small interface:

- `KerasBackend(model, use_cache=True)`: a `TransformerXLCausalLM`. With
  `use_cache` each step goes through `call_with_cache`, which keeps the
  projected keys/values of the memory (and `W_R R`) between steps and
  projects only the new position; `use_cache=False` re-runs
  `call_with_memory` (the reference path). Both give the same log-probs.
- `keras_txl.export.generation.SavedModelBackend(path)`: an exported
  SavedModel, through its `next_token(token_ids, memory) -> {log_probs
  (B, V), memory}` signature.
- `keras_txl.export.generation.TFLiteBackend(runner)`: a stateless TFLite
  model through the same `next_token` signature (or `serving_default` for a
  padded segment). Both live with the export code: the model package never
  imports it.

Two schedules decide which tokens each call sees:

- "token" (the default): the prompt is fed one token at a time (as
  `model.generate` feeds it, so greedy decoding gives its tokens), or in
  chunks of `segment_length` when one is given, to fill the memory, then
  every new token is fed alone with the memory. The cost per new token depends on the memory length M,
  not on how much has been generated. Needs a backend that accepts any
  segment length, or one fixed at T = 1.
- "segment": tokens are grouped in segments of T as in training and
  evaluation; each step re-runs the current, partly filled segment (padded
  to T for a fixed-shape TFLite model; causal masking makes the padding
  invisible) with the memory of the completed segments, and the memory
  advances only when a segment is full. The only schedule a TFLite model
  exported with a fixed T > 1 can run.

Greedy decoding (temperature 0) gives the same tokens on every backend
under the same schedule. Sampling is deterministic for a given seed.

Shape legend: B batch (1 here), T segment, L num_layers, M memory_length,
D hidden_dim, V vocabulary_size.
"""

import logging
import numbers

import numpy as np
import tensorflow as tf

from keras_txl import checks
from keras_txl.checks import GREEDY_BELOW_TEMPERATURE
from keras_txl.host_memory import CompiledFunction

logger = logging.getLogger(__name__)

SCHEDULES = ("token", "segment")

# Seeds are int64 (keras' SeedGenerator state, the SavedModel's `seed`).
MAX_SEED = 2**63 - 1


# === Sampling ===


def check_seed(seed):
    """`seed` as an int in [0, MAX_SEED], or None; ValueError naming it."""
    if seed is None:
        return None
    if (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)
            or not 0 <= seed <= MAX_SEED):
        raise ValueError(
            f"`seed` must be None or an integer in [0, 2**63 - 1 = {MAX_SEED}], "
            f"received seed={seed!r}."
        )
    return int(seed)


def check_sampling(temperature=1.0, top_k=0, top_p=1.0):
    """The checked `(temperature, top_k, top_p)`; ValueError outside their range.

    NumPy scalars count as numbers; `bool`, NaN and Inf do not. A `top_k`
    above the vocabulary is valid: it keeps every id (the samplers clamp it
    to the vocabulary size, as the SavedModel's `generate` signature does).
    """
    temperature = checks.finite_number(
        "temperature", temperature, minimum=0,
        expected="a finite number >= 0 (0 is greedy)",
    )
    if temperature > checks.FLOAT32_MAX:
        # Inf in float32, where the samplers and the SavedModel divide by it.
        raise ValueError(
            "`temperature` must be a finite number >= 0 (0 is greedy) and at most "
            f"{checks.FLOAT32_MAX:g}, the largest float32 (the samplers divide by it in "
            f"float32, where it is Inf), received temperature={temperature!r}."
        )
    try:
        top_k = checks.non_negative_int("top_k", top_k)
    except ValueError:
        raise ValueError(
            "`top_k` must be an integer >= 0 (0 keeps every token), received "
            f"top_k={top_k!r}."
        ) from None
    if (isinstance(top_p, bool) or not isinstance(top_p, numbers.Real)
            or not 0 < top_p <= 1):
        raise ValueError(
            f"`top_p` must be in (0, 1] (1 keeps every token), received "
            f"top_p={top_p!r}."
        )
    if top_p < checks.FLOAT32_TINY:
        # 0 in float32, where the samplers and the SavedModel compare with it.
        raise ValueError(
            "`top_p` must be in (0, 1] (1 keeps every token) and at least "
            f"{checks.FLOAT32_TINY:g}, the smallest float32 above 0 (the samplers "
            f"compare with it in float32, where it is 0), received top_p={top_p!r}."
        )
    return temperature, top_k, float(top_p)


# How to go past `check_max_new_tokens`' cap, said in its error.
IN_PIECES = (
    "Generate a longer text in pieces, each continuing from the memory of the one "
    "before: model.generate(..., return_memory=True), then memory= (and memory_mask=); "
    "the host loop's initial_memory= (and initial_memory_mask=); tflite_generate returns "
    "its memory for its memory=."
)


def check_max_new_tokens(max_new_tokens, prompt_length, minimum=0):
    """`max_new_tokens` as an int, checked before anything runs.

    One cap for every entry point, `model.generate`'s: the prompt and the new
    tokens of one call come to at most `MAX_GENERATE_LENGTH` (2**20), as
    `generate_ids` and `txl generate` refuse more. Without it, the host loops
    (`generate`, `generate_iter`, `tflite_generate`) ran for as long as asked,
    2**40 steps in effect forever. ValueError naming the argument and the
    limit, and how to generate a longer text.
    """
    from keras_txl.causal_lm import MAX_GENERATE_LENGTH

    if (isinstance(max_new_tokens, (bool, np.bool_))
            or not isinstance(max_new_tokens, numbers.Integral)
            or max_new_tokens < minimum):
        raise ValueError(
            f"`max_new_tokens` must be an integer >= {minimum}, received "
            f"max_new_tokens={max_new_tokens!r}."
        )
    max_new_tokens = int(max_new_tokens)
    limit = MAX_GENERATE_LENGTH - int(prompt_length)
    if max_new_tokens > limit:
        raise ValueError(
            f"`max_new_tokens` must be at most {max(limit, 0)}: the prompt "
            f"({prompt_length} tokens) and the new tokens come to more than the "
            f"{MAX_GENERATE_LENGTH} (MAX_GENERATE_LENGTH, 2**20) tokens of one call; "
            f"received max_new_tokens={max_new_tokens}. {IN_PIECES}"
        )
    return max_new_tokens


def sample_next(log_probs, sampler):
    """One id from a (V,) vector of log-probabilities, chosen by a keras-hub
    sampler (see `sampler_from_options`): the host loops below (exported
    models, the "segment" schedule) pick tokens as `model.generate` does.

    Args:
        log_probs: (V,) array.
        sampler: a `keras_hub.samplers.Sampler` (greedy: argmax, first index
            on ties).

    Returns:
        int.
    """
    from keras_txl.decoding import clamp_top_k

    log_probs = np.asarray(log_probs, dtype=np.float32).reshape(1, -1)
    if np.isnan(log_probs).any() or not (log_probs < np.inf).all():
        raise ValueError(
            "The model returned NaN or +Inf log-probabilities; check its "
            "weights and the memory it was given."
        )
    sampler = clamp_top_k(sampler, log_probs.shape[-1])
    probabilities = sampler.compute_probabilities(log_probs)
    return int(np.asarray(sampler.get_next_token(probabilities))[0])


# === Backends ===
#
# A backend has `vocabulary_size`, `segment_length` (None: any T, or the T
# fixed at export), `masked` (its memory carries a validity mask:
# `empty_memory="masked"`), `initial_state(memory=None, memory_mask=None)`
# and `run(token_ids (1, T) int32, state, position=-1) -> (log_probs (V,),
# new_state)`, the log-probs of the token after `position`. The state is
# opaque to the loop (a memory, or a memory plus its cache).


class KerasBackend:
    """Runs a `TransformerXLCausalLM`, with or without the memory cache.

    Args:
        model: `TransformerXLCausalLM`.
        use_cache: bool. Decode through `call_with_cache` (projected memory
            keys/values kept between steps) instead of `call_with_memory`.
        jit_compile: bool. XLA-compile the step functions.

    Example:
    ```python
    backend = KerasBackend(model, use_cache=True)
    ids = generate(backend, prompt_ids, 50, temperature=0)
    ```
    """

    segment_length = None

    def __init__(self, model, use_cache=True, jit_compile=False):
        if not hasattr(model, "call_with_memory"):
            raise ValueError(
                "KerasBackend needs a keras_txl.TransformerXLCausalLM, "
                f"received {type(model).__name__}."
            )
        self.model = model
        self.use_cache = checks.boolean("use_cache", use_cache)
        self.config = model.txl_config
        self.vocabulary_size = self.config.vocabulary_size
        self.masked = (self.config.empty_memory == "masked"
                       and self.config.memory_length > 0)
        # Decoding steps (T = 1) get their own trace with static shapes, so
        # the cached `W_R R` (built for K = M + 1) is used; other lengths
        # (prompt chunks, partial segments) share a shape-relaxed trace.
        self._forward = CompiledFunction(
            self._forward_fn, jit_compile=jit_compile, reduce_retracing=True
        )
        self._cached_step = CompiledFunction(self._cached_fn, jit_compile=jit_compile)
        self._cached = CompiledFunction(
            self._cached_fn, jit_compile=jit_compile, reduce_retracing=True
        )
        self._build = CompiledFunction(self._build_fn, jit_compile=jit_compile)
        self.num_traces = 0

    def _forward_fn(self, token_ids, memory, memory_mask=None):
        self.num_traces += 1  # Python side effect: runs once per trace
        out = self.model.call_with_memory(token_ids, memory, memory_mask=memory_mask)
        return out["log_probs"][0], out["memory"], out.get("memory_mask")

    def _build_fn(self, memory, memory_mask=None):
        return self.model.build_cache(memory, memory_mask=memory_mask)

    def _cached_fn(self, token_ids, cache):
        self.num_traces += 1
        out = self.model.call_with_cache(token_ids, cache)
        return out["log_probs"][0], out["cache"]

    def initial_state(self, memory=None, memory_mask=None):
        # With empty_memory="masked" the slots of an empty memory are masked
        # (as model.generate does); a memory given here counts as real in
        # every slot unless its (1, M) `memory_mask` says otherwise.
        masked = self.masked
        if memory is None:
            memory = self.model.initial_memory(1)
            if masked:
                memory_mask = tf.zeros((1, self.config.memory_length), tf.bool)
        elif masked and memory_mask is None:
            memory_mask = tf.ones((1, self.config.memory_length), tf.bool)
        if memory_mask is not None:
            memory_mask = tf.convert_to_tensor(memory_mask, tf.bool)
        return {"memory": tf.convert_to_tensor(memory, tf.float32),
                "memory_mask": memory_mask, "cache": None}

    def prepare(self, state):
        """The state with its cache built (before re-running partial
        segments against the same memory)."""
        if self.use_cache and state["cache"] is None:
            state = {"memory": state["memory"],
                     "memory_mask": state.get("memory_mask"),
                     "cache": self._build(state["memory"], state.get("memory_mask"))}
        return state

    def run(self, token_ids, state, position=-1):
        token_ids = tf.convert_to_tensor(token_ids, tf.int32)
        if not self.use_cache:
            log_probs, memory, memory_mask = self._forward(
                token_ids, state["memory"], state.get("memory_mask")
            )
            return log_probs.numpy()[position], {
                "memory": memory, "memory_mask": memory_mask, "cache": None}
        cache = state["cache"]
        if cache is None:
            cache = self._build(state["memory"], state.get("memory_mask"))
        step = self._cached_step if token_ids.shape[1] == 1 else self._cached
        log_probs, cache = step(token_ids, cache)
        # The memory stays inside the cache (stacked only on request).
        return log_probs.numpy()[position], {"memory": None, "cache": cache}


def as_backend(model, use_cache=True):
    """`model` if it is a backend, else a `KerasBackend` around it."""
    if hasattr(model, "run") and hasattr(model, "initial_state"):
        return model
    return KerasBackend(model, use_cache=use_cache)


# === The sampling loop ===


def _resolve_schedule(backend, schedule, segment_length):
    fixed = backend.segment_length
    if schedule is None:
        schedule = "segment" if fixed is not None and fixed > 1 else "token"
        if schedule == "segment":
            logger.info(
                "The model takes exactly %d tokens per call: decoding with "
                "the 'segment' schedule (export with --segment-length 1 "
                "for one token per step).", fixed,
            )
    if schedule not in SCHEDULES:
        raise ValueError(
            f"`schedule` must be one of {SCHEDULES}, received {schedule!r}."
        )
    if fixed is not None:
        if segment_length is not None and segment_length != fixed:
            raise ValueError(
                f"This model was exported with a fixed segment length of "
                f"{fixed}; received segment_length={segment_length}. Omit "
                "it or export with --segment-length "
                f"{segment_length}."
            )
        if schedule == "token" and fixed != 1:
            raise ValueError(
                f"The 'token' schedule feeds one token at a time, but this "
                f"model takes exactly {fixed} tokens per call. Use "
                "schedule='segment', or export with --segment-length 1."
            )
        segment_length = fixed
    if segment_length is None and schedule == "token":
        # The prompt one token at a time, as model.generate and the
        # SavedModel's generate signature feed it: fed as one chunk it sees
        # more of the empty memory's slots, and other greedy tokens.
        segment_length = 1
    elif segment_length is None:
        config = getattr(backend, "config", None)
        segment_length = config.segment_length if config is not None else 1
    if (not isinstance(segment_length, int) or isinstance(segment_length, bool)
            or segment_length <= 0):
        raise ValueError(
            "`segment_length` must be a positive integer, received "
            f"segment_length={segment_length!r}."
        )
    return schedule, segment_length


def _check_initial_memory(backend, memory):
    """(1, L, M, D) float32 with no NaN/Inf after the cast, or ValueError."""
    config = getattr(backend, "config", None)
    if config is not None:
        return checks.one_text_memory(
            "initial_memory", memory,
            (config.num_layers, config.memory_length, config.hidden_dim))
    memory = checks.finite_float32(
        "initial_memory", memory,
        "pass a memory returned by the model (e.g. after a prompt) or None.",
    )
    if memory.ndim != 4 or memory.shape[0] != 1:
        raise ValueError(
            "`initial_memory` must have shape (1, num_layers, memory_length, "
            f"hidden_dim) (generate decodes one text), received shape {memory.shape}."
        )
    return memory


def _check_initial_memory_mask(backend, memory, memory_mask):
    """The (1, M) bool mask of `memory` for a backend whose memory carries
    one (`empty_memory="masked"`), None for the others; ValueError naming
    `initial_memory_mask` when it is missing, stray or malformed (as
    `model.generate`'s `memory_mask`)."""
    masked = bool(getattr(backend, "masked", False))
    if memory_mask is not None and memory is None:
        raise ValueError(
            "`initial_memory_mask` is the validity of `initial_memory`'s slots: "
            "pass it with the memory it came with (initial_memory=...)."
        )
    if memory is None:
        return None
    memory_length = memory.shape[2]
    if not masked:
        if memory_mask is not None:
            raise ValueError(
                "`initial_memory_mask` is only for a model with "
                "empty_memory='masked'; this model counts every memory slot "
                "as real: pass initial_memory alone."
            )
        return None
    if memory_mask is None:
        raise ValueError(
            "`initial_memory_mask` is required with `initial_memory` for a "
            "model with empty_memory='masked': pass the validity returned "
            "with the memory (the third value of model.generate(..., "
            "return_memory=True), call_with_memory's out['memory_mask']), or "
            f"np.ones((1, {memory_length}), bool) if every slot holds real "
            "memory."
        )
    return checks.one_text_memory_mask(
        "initial_memory_mask", memory_mask, memory_length)


def generate_iter(model, prompt_ids, max_new_tokens, temperature=1.0,
                  top_k=0, top_p=1.0, seed=None, segment_length=None,
                  schedule=None, use_cache=True, initial_memory=None,
                  initial_memory_mask=None):
    """An iterator over the new ids, one by one (see `generate` for the
    arguments).

    Every argument is checked here, when it is called, before the first id
    is asked for: a caller can print the prompt after this call knowing the
    arguments are good (`txl generate` does).
    """
    use_cache = checks.boolean("use_cache", use_cache)  # "no" is not False
    backend = as_backend(model, use_cache=use_cache)
    temperature, top_k, top_p = check_sampling(temperature, top_k, top_p)
    seed = check_seed(seed)
    prompt = np.asarray(prompt_ids)
    if prompt.ndim != 1:
        raise ValueError(
            "`prompt_ids` must be a 1-D sequence of token ids (one text), "
            f"received shape {prompt.shape}."
        )
    if prompt.size == 0:
        raise ValueError("`prompt_ids` must hold at least one token id.")
    if prompt.dtype.kind not in "iu":
        raise ValueError(
            f"`prompt_ids` must be integers, received dtype {prompt.dtype}."
        )
    vocabulary_size = backend.vocabulary_size
    if prompt.min() < 0 or prompt.max() >= vocabulary_size:
        raise ValueError(
            f"`prompt_ids` must be in [0, vocabulary_size={vocabulary_size}), "
            f"received values in [{prompt.min()}, {prompt.max()}]."
        )
    max_new_tokens = check_max_new_tokens(max_new_tokens, prompt.size)
    config = getattr(backend, "config", None)
    if config is not None:
        checks.memory_for_generation(config.memory_length)
    if initial_memory is not None:
        initial_memory = _check_initial_memory(backend, initial_memory)
    initial_memory_mask = _check_initial_memory_mask(
        backend, initial_memory, initial_memory_mask)
    schedule, length = _resolve_schedule(backend, schedule, segment_length)
    prompt = prompt.astype(np.int32)
    sampler = sampler_from_options(temperature, top_k, top_p, seed,
                                   vocabulary_size=vocabulary_size)
    return _generate_tokens(backend, prompt, max_new_tokens, sampler,
                            schedule, length, initial_memory, initial_memory_mask)


def _generate_tokens(backend, prompt, max_new_tokens, sampler, schedule,
                     length, initial_memory, initial_memory_mask=None):
    """`generate_iter`'s loop, on checked arguments."""
    if initial_memory_mask is None:
        state = backend.initial_state(initial_memory)
    else:
        state = backend.initial_state(initial_memory, memory_mask=initial_memory_mask)
    fixed = backend.segment_length

    def pick(log_probs):
        return sample_next(log_probs, sampler)

    if schedule == "token":
        for start in range(0, prompt.size, length):
            log_probs, state = backend.run(
                prompt[None, start:start + length], state
            )
        for i in range(max_new_tokens):
            token = pick(log_probs)
            yield token
            if i + 1 < max_new_tokens:  # the last token needs no forward
                log_probs, state = backend.run(
                    np.array([[token]], np.int32), state
                )
        return

    # "segment": the memory advances only at segment boundaries.
    prepare = getattr(backend, "prepare", lambda state: state)

    def run_partial(segment):
        n = len(segment)
        ids = np.asarray(segment, np.int32)
        if fixed is not None and n < fixed:
            ids = np.concatenate([ids, np.zeros(fixed - n, np.int32)])
        log_probs, _ = backend.run(ids[None], state, position=n - 1)
        return log_probs

    full = (prompt.size // length) * length
    log_probs = None
    for start in range(0, full, length):
        log_probs, state = backend.run(prompt[None, start:start + length], state)
    state = prepare(state)
    partial = [int(i) for i in prompt[full:]]
    if partial:
        log_probs = run_partial(partial)
    for i in range(max_new_tokens):
        token = pick(log_probs)
        yield token
        if i + 1 == max_new_tokens:
            break
        partial.append(token)
        if len(partial) == length:
            log_probs, state = backend.run(np.asarray([partial], np.int32), state)
            state = prepare(state)
            partial = []
        else:
            log_probs = run_partial(partial)


def generate(model, prompt_ids, max_new_tokens, temperature=1.0, top_k=0,
             top_p=1.0, seed=None, on_token=None, segment_length=None,
             schedule=None, use_cache=True, initial_memory=None,
             initial_memory_mask=None):
    """Generates `max_new_tokens` ids after `prompt_ids`.

    Args:
        model: `TransformerXLCausalLM`, or a backend (`KerasBackend`,
            `SavedModelBackend`, `TFLiteBackend`).
        prompt_ids: 1-D ints in [0, V), at least one.
        max_new_tokens: int >= 0.
        temperature: float >= 0. 0 is greedy decoding.
        top_k: int >= 0. Sample among the k most likely ids (0: all).
        top_p: float in (0, 1]. Nucleus sampling (1: all).
        seed: int or None. The same seed gives the same ids.
        on_token: callable or None, called with each new id as soon as it
            is chosen (streaming).
        segment_length: int or None. Prompt chunk ("token" schedule;
            default 1, as `model.generate`) or segment ("segment" schedule;
            default the model's `segment_length`) length; the T a TFLite
            model was exported with, if fixed.
        schedule: "token", "segment" or None (see the module docstring;
            None: "segment" only for a fixed T > 1).
        use_cache: bool. With a Keras model, decode with the memory
            key/value cache (same log-probs, faster).
        initial_memory: (1, L, M, D) memory to start from, or None (the
            empty memory: zeros, masked slots with `empty_memory="masked"`).
        initial_memory_mask: (1, M) bool validity of `initial_memory`'s
            slots. Required with `initial_memory` for a model with
            `empty_memory="masked"` (pass the one returned with the memory,
            as to `model.generate(memory=..., memory_mask=...)`); refused
            for any other model.

    Returns:
        np.ndarray of int32, the new ids.

    Raises:
        ValueError: empty or out-of-range prompt, bad sampling settings, a
            schedule the backend cannot run, or an initial memory without
            its mask (masked model).

    Example:
    ```python
    ids = generate(model, tokenizer.encode("The "), 100, temperature=0.8,
                   top_k=40, seed=0, on_token=print)
    ```
    """
    if on_token is not None and not callable(on_token):
        # Checked before anything runs, not at the first new id.
        raise ValueError(
            "`on_token` must be None or a callable taking each new id, "
            f"received {type(on_token).__name__}."
        )
    new = []
    for token in generate_iter(
        model, prompt_ids, max_new_tokens, temperature=temperature,
        top_k=top_k, top_p=top_p, seed=seed, segment_length=segment_length,
        schedule=schedule, use_cache=use_cache, initial_memory=initial_memory,
        initial_memory_mask=initial_memory_mask,
    ):
        new.append(token)
        if on_token is not None:
            on_token(token)
    return np.asarray(new, dtype=np.int32)


# === keras-hub generation (compiled, batched) ===


def sampler_from_options(temperature=1.0, top_k=0, top_p=1.0, seed=None,
                         vocabulary_size=None):
    """The keras-hub sampler for `txl generate`'s options.

    temperature 0 (or below `GREEDY_BELOW_TEMPERATURE`): `GreedySampler`;
    top_p < 1: `TopPSampler(p, k=top_k or
    None)`; top_k > 0: `TopKSampler(k)`; otherwise `RandomSampler`; each
    with `temperature` and `seed` (a new sampler with the same seed draws
    the same tokens). `seed`: None or an int in [0, 2**63 - 1].

    `vocabulary_size`: int or None. A `top_k` above it is clamped to it
    (every id kept). Without it the sampler keeps `top_k`, and
    `model.generate` / `sample_next` clamp it to the log-probs' width.
    """
    from keras_hub import samplers

    temperature, top_k, top_p = check_sampling(temperature, top_k, top_p)
    seed = check_seed(seed)
    if vocabulary_size is not None:
        top_k = min(top_k, checks.positive_int("vocabulary_size", vocabulary_size))
    if temperature < GREEDY_BELOW_TEMPERATURE:
        return samplers.GreedySampler()
    if top_p < 1:
        return samplers.TopPSampler(p=top_p, k=top_k or None, seed=seed,
                                    temperature=temperature)
    if top_k:
        return samplers.TopKSampler(k=top_k, seed=seed, temperature=temperature)
    return samplers.RandomSampler(seed=seed, temperature=temperature)


def generate_ids(model, prompts, max_new_tokens, temperature=1.0, top_k=0,
                 top_p=1.0, seed=None):
    """New ids for a batch of id prompts, by `model.generate` (compiled).

    Args:
        model: `TransformerXLCausalLM` (not stateful).
        prompts: list of 1-D int sequences (any lengths, at least one id,
            each in [0, vocabulary_size)), or a 2-D int array or tensor
            (batch, length), each row one prompt (as `model.generate`).
        max_new_tokens: int >= 1. Every row gets this many (fewer after a
            stop token of the model's tokenizer).
        temperature, top_k, top_p, seed: see `sampler_from_options`.

    Returns:
        list of int32 arrays, the new ids of each prompt.
    """
    if not hasattr(model, "txl_config") or not hasattr(model, "generate"):
        raise ValueError(
            "`model` must be a keras_txl.TransformerXLCausalLM, received "
            f"{type(model).__name__}."
        )
    max_new_tokens = checks.positive_int("max_new_tokens", max_new_tokens)
    if tf.is_tensor(prompts) and not isinstance(prompts, tf.RaggedTensor):
        prompts = np.asarray(prompts)
    if isinstance(prompts, np.ndarray):
        # As model.generate takes it: one prompt per row.
        if prompts.ndim != 2 or prompts.dtype.kind not in "iu" or 0 in prompts.shape:
            raise ValueError(
                "`prompts` as an array must have shape (batch, length) of int ids "
                "with batch and length >= 1, one prompt per row (one prompt: "
                f"prompts[None]); received shape {prompts.shape} and dtype {prompts.dtype}."
            )
        prompts = list(prompts)
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError(
            "`prompts` must be a non-empty list of id sequences, received "
            f"{type(prompts).__name__}."
        )
    rows = []
    for i, prompt in enumerate(prompts):
        array = np.asarray(prompt)
        if array.ndim != 1 or array.dtype.kind not in "iu" or array.size == 0:
            hint = (" (one prompt of ids is a list inside the list: [[1, 2, 3]])"
                    if array.ndim == 0 and array.dtype.kind in "iu" else "")
            raise ValueError(
                f"`prompts[{i}]` must be a non-empty 1-D sequence of int ids, "
                f"received shape {array.shape} and dtype {array.dtype}{hint}."
            )
        rows.append([int(t) for t in array])
    # Checked here, by this function's names (model.generate would name
    # its own `inputs` and `max_length`).
    vocabulary_size = model.txl_config.vocabulary_size
    for i, row in enumerate(rows):
        if min(row) < 0 or max(row) >= vocabulary_size:
            raise ValueError(
                f"`prompts[{i}]` holds token ids outside [0, vocabulary_size="
                f"{vocabulary_size}), received values in [{min(row)}, {max(row)}]."
            )
    longest = max(len(r) for r in rows)
    check_max_new_tokens(max_new_tokens, longest, minimum=1)
    sampler = sampler_from_options(temperature, top_k, top_p, seed,
                                   vocabulary_size=vocabulary_size)
    sampler, function, remember = _generate_ids_function(model, sampler)
    # Not `model.compile(sampler=...)`: that would also replace the user's
    # optimizer (and its state), loss and metrics. keras-hub's generate
    # reads `model.sampler` when it traces `generate_function`; both are
    # swapped for this call and put back.
    previous = (getattr(model, "sampler", None), getattr(model, "generate_function", None))
    model.sampler, model.generate_function = sampler, function
    try:
        outputs = model.generate(
            rows, max_length=longest + max_new_tokens,
            strip_prompt=True,
        )
        remember(model.generate_function)
    finally:
        model.sampler, model.generate_function = previous
    return [np.asarray(out, np.int32)[:max_new_tokens] for out in outputs]


# Compiled generate functions `generate_ids` keeps per model, one per
# sampler setting (the most recently used ones).
GENERATE_IDS_FUNCTIONS = 8

# Sampler settings read by the trace as variables (float32, as the logits
# they divide or the probabilities they cut): not part of the function's key.
_SAMPLER_VARIABLES = ("temperature", "p")


def _generate_ids_function(model, sampler):
    """`(sampler, function, remember)` for one `generate_ids` call.

    A new tf.function per call retraced (and XLA-compiled) the whole
    decoding loop every time: about 1.7 s a call on a 2-layer toy model,
    whatever its shapes. The function traced for a sampler setting (class,
    temperature, k, p; not the seed) is kept on the model with the sampler
    it captured, whose seed generator is set to the state of the new
    `sampler` (from its seed, or a random one for `seed=None`): the draws
    are those of a new sampler, as before, and calls with equal shapes
    reuse the trace. `remember(function)` stores the function once traced.
    """
    key = (
        type(sampler).__name__,
        tuple(sorted((k, repr(v)) for k, v in sampler.get_config().items()
                     if k not in ("seed",) + _SAMPLER_VARIABLES)),
        model.generate_jit_compile(),
        bool(model.run_eagerly),
    )
    functions = model.__dict__.get("_generate_ids_functions")
    if functions is None:
        # Past Keras' and TensorFlow's attribute tracking: neither the
        # samplers' seed states nor the functions are the model's.
        functions = {}
        object.__setattr__(model, "_generate_ids_functions", functions)
    kept = functions.pop(key, None)
    if kept is not None:
        kept_sampler, function = kept
        fresh = getattr(sampler, "seed_generator", None)
        if fresh is not None:
            kept_sampler.seed_generator.state.assign(fresh.state.value)
        for name in _SAMPLER_VARIABLES:
            if hasattr(kept_sampler, name):
                getattr(kept_sampler, name).assign(float(getattr(sampler, name)))
        sampler = kept_sampler
    else:
        # The temperature and top-p's p become variables the trace reads,
        # so another value is an assignment, not another trace; the batch
        # and the lengths are relaxed to unknown sizes after a second shape.
        for name in _SAMPLER_VARIABLES:
            value = getattr(sampler, name, None)
            if isinstance(value, numbers.Real):
                setattr(sampler, name, tf.Variable(float(value), dtype=tf.float32,
                                                   trainable=False, name=name))
        function = None
        if not model.run_eagerly:
            function = tf.function(model.generate_step,
                                   jit_compile=model.generate_jit_compile(),
                                   reduce_retracing=True)

    def remember(traced):
        if traced is None:
            return
        functions[key] = (sampler, traced)
        while len(functions) > GENERATE_IDS_FUNCTIONS:
            functions.pop(next(iter(functions)))

    return sampler, function, remember


# === Text ===


class TextStream:
    """Turns ids into text pieces as they come, for streaming output.

    Decoding ids one at a time is wrong for many tokenizers (words need
    spaces between them, a UTF-8 character may span several byte ids), so
    each new id re-decodes the continuation (with the prompt before it)
    and returns the part not returned yet, holding back a trailing
    incomplete character.

    Args:
        tokenizer: object with `decode(ids) -> str`.
        prompt_ids: the ids before the continuation.
    """

    def __init__(self, tokenizer, prompt_ids=()):
        self.tokenizer = tokenizer
        self.prompt_ids = [int(i) for i in prompt_ids]
        self._prefix = tokenizer.decode(self.prompt_ids) if self.prompt_ids else ""
        self.ids = []
        self.text = ""

    def _decode(self):
        full = self.tokenizer.decode(self.prompt_ids + self.ids)
        if full.startswith(self._prefix):
            return full[len(self._prefix):]
        return self.tokenizer.decode(self.ids)

    def add(self, token):
        """The new text after `token` (may be "")."""
        self.ids.append(int(token))
        text = self._decode().rstrip("\ufffd")
        if not text.startswith(self.text):
            text = self.text  # a re-segmentation: never unprint
        piece, self.text = text[len(self.text):], text
        return piece

    def finish(self):
        """What is left (a trailing replacement character, if any)."""
        text = self._decode()
        piece = text[len(self.text):] if text.startswith(self.text) else ""
        self.text += piece
        return piece


def generate_text(model_dir, prompt, max_new_tokens=200, temperature=1.0,
                  top_k=0, top_p=1.0, seed=None):
    """Loads a model folder and its tokenizer, returns prompt + continuation.

    Generates with `model.generate` (keras-hub's compiled loop, the prompt
    fed one token at a time; see `generate_ids`).

    Args:
        model_dir: str. A folder written by `save_pretrained` with a
            `tokenizer/` inside.
        prompt: str.
        max_new_tokens: int >= 1.
        temperature, top_k, top_p, seed: see `sampler_from_options`.
    """
    from keras_txl.io import load_pretrained
    from keras_txl.io import tokenizer_directory
    from keras_txl.tokenizers import load_tokenizer

    # Before the model is read (a prompt has at least one token); with the
    # prompt's length again in `generate_ids`.
    check_max_new_tokens(max_new_tokens, 1, minimum=1)
    model = load_pretrained(model_dir)
    directory = tokenizer_directory(model_dir)
    if directory is None:
        raise ValueError(f"No tokenizer/ folder in {model_dir!r}.")
    tokenizer = load_tokenizer(directory)
    tokenizer.check_model_vocabulary(model.txl_config.vocabulary_size)
    prompt_ids = tokenizer.encode(prompt)
    if len(prompt_ids) == 0:
        raise ValueError("`prompt` encodes to no tokens; give some text.")
    (new,) = generate_ids(model, [prompt_ids], max_new_tokens,
                          temperature=temperature, top_k=top_k, top_p=top_p,
                          seed=seed)
    stream = TextStream(tokenizer, prompt_ids)
    for token in new:
        stream.add(token)
    stream.finish()
    return prompt + stream.text
