"""The in-graph decoding loop: batched prompts, the memory's key/value cache.

`decode_loop` is the one loop behind `TransformerXLCausalLM.generate()`
(keras-hub samplers choose each token) and the SavedModel `generate`
signature (a seeded, stateless choice per request). It runs inside a
`tf.function` (XLA-compilable: every tensor keeps its shape from step to
step).

How a batch of prompts of different lengths is decoded. Prompts are
right-padded to one length S, as keras-hub's preprocessors pack them, and
every row is fed one token per step from position 0, the model's memory
cache sliding by one each step: at step i each row feeds its token i-1,
keeps its own prompt token i where it has one and otherwise writes the
token chosen from the log-probabilities. So every row is processed exactly
as it would be alone (same cache states, same keys; only the batch's other
rows differ), and generating a batch equals generating each prompt alone.
Feeding the prompt one token at a time is also what a token-by-token
TFLite model does, so the two agree under either `empty_memory` setting
(a prompt fed as one segment sees M zero vectors at every position; fed
one token at a time, the zero vectors leave the window as the prompt
enters it).

A row that writes a stop token (after its prompt) stops: its stop token
is fed once more, so the returned memory covers the whole row, and its
cache is then frozen. The loop ends when every row has stopped or the
length S is reached.

Shape legend: B batch, S padded length, L num_layers, M memory_length,
D hidden_dim, V vocabulary_size.
"""

import copy
import numbers

from keras import ops
from keras import tree

from keras_txl.memory import zero_memory


def clamp_top_k(sampler, vocabulary_size):
    """`sampler`, or a shallow copy of it with `k = vocabulary_size` when it
    is a keras-hub `TopKSampler` / `TopPSampler` whose `k` is larger than
    the vocabulary (top-k over more ids than there are keeps them all, as
    the SavedModel's `generate` signature does; `ops.top_k` would fail).
    The copy shares the sampler's seed generator: it draws what the
    sampler would."""
    from keras_hub.samplers import TopKSampler
    from keras_hub.samplers import TopPSampler

    k = getattr(sampler, "k", None)
    if (isinstance(sampler, (TopKSampler, TopPSampler))
            and isinstance(k, numbers.Integral) and k > vocabulary_size):
        sampler = copy.copy(sampler)
        sampler.k = int(vocabulary_size)
    return sampler


def stop_token_id_tuple(stop_token_ids, vocabulary_size, allow_auto=False):
    """`stop_token_ids` (None, an id, or a list, tuple or 1-D array of ids
    in [0, vocabulary_size)) as a tuple of ints, or None for None or no
    ids; a ValueError naming it otherwise (`allow_auto`: the message lists
    "auto", which the caller resolved before)."""
    import numpy as np

    if stop_token_ids is None:
        return None
    if isinstance(stop_token_ids, (numbers.Integral, np.integer)):
        ids = (stop_token_ids,)
    elif isinstance(stop_token_ids, (list, tuple)) or (
        isinstance(stop_token_ids, np.ndarray) and stop_token_ids.ndim == 1
    ):
        ids = tuple(stop_token_ids)
    else:
        ids = None
    if ids is None or not all(
        isinstance(i, (numbers.Integral, np.integer))
        and not isinstance(i, (bool, np.bool_))
        and 0 <= i < vocabulary_size
        for i in ids
    ):
        allowed = '"auto", None' if allow_auto else "None"
        raise ValueError(
            f"`stop_token_ids` must be {allowed}, an id or a tuple of "
            f"ids in [0, vocabulary_size={vocabulary_size}), received "
            f"stop_token_ids={stop_token_ids!r}."
        )
    return tuple(int(i) for i in ids) or None


def stop_mask(token_ids, stop_token_ids):
    """(B,) bool: `token_ids` (B,) is one of `stop_token_ids` (a tuple)."""
    hit = ops.zeros_like(token_ids, "bool")
    for stop in stop_token_ids:
        hit = ops.logical_or(hit, ops.equal(token_ids, stop))
    return hit


def initial_cache(model, batch_size, memory=None, memory_mask=None):
    """The key/value cache for one-token steps from `memory`, or from an
    empty memory of `batch_size` rows (zeros, or masked slots with
    `empty_memory="masked"`). Works on symbolic batch sizes."""
    backbone = model.backbone
    config = model.txl_config
    if memory is None:
        memory_mask = backbone.resolve_memory_mask(None, memory_mask, batch_size)
        memory = zero_memory(
            batch_size, config.num_layers, config.memory_length, config.hidden_dim
        )
    return backbone.build_cache(memory, segment_length=1, memory_mask=memory_mask)


def mask_after_stop(token_ids, padding_mask, stop_token_ids):
    """(B, S) bool: True up to each row's first stop token after its prompt
    (included), everywhere without stop tokens."""
    length = ops.shape(token_ids)[1]
    if not stop_token_ids:
        return ops.ones_like(token_ids, "bool")
    hits = ops.zeros_like(token_ids, "bool")
    for stop in stop_token_ids:
        hits = ops.logical_or(hits, ops.equal(token_ids, stop))
    hits = ops.logical_and(hits, ops.logical_not(ops.cast(padding_mask, "bool")))
    first = ops.cast(ops.argmax(ops.cast(hits, "int32"), axis=1), "int32")
    last = ops.where(ops.any(hits, axis=1), first, length - 1)
    return ops.arange(length)[None, :] <= last[:, None]


def decode_loop(model, token_ids, padding_mask, choose, memory=None,
                memory_mask=None, stop_token_ids=None, max_lengths=None,
                choose_with_index=False):
    """Fills the padding after each prompt with chosen tokens.

    Args:
        model: `TransformerXLCausalLM`.
        token_ids: (B, S) int32, prompts right-padded to S.
        padding_mask: (B, S) bool, True on prompt tokens (each row's prompt
            is a prefix: at least one token).
        choose: function `(log_probs (B, V) float32) -> (B,) int` picking
            the next token of every row (a keras-hub sampler's
            `get_next_token(compute_probabilities(...))`, or a seeded
            stateless draw).
        memory: (B, L, M, D) float32 memory to continue from, or None.
        memory_mask: (B, M) bool validity of `memory`'s slots, or None.
        stop_token_ids: tuple of ints or None.
        max_lengths: (B,) int or None: each row's length limit (prompt plus
            new tokens, at most S); None: S for every row. A row stops at
            its limit as at a stop token (its memory covers up to it).
        choose_with_index: bool. Call `choose(log_probs, index)` with the
            () int32 position being written (a stateless sampler folds it
            into its seed: the step is not otherwise visible to `choose`).

    Returns:
        dict: "token_ids" (B, S) int32 (prompts and chosen tokens),
        "padding_mask" (B, S) bool (True up to each row's last token, its
        stop token included), "memory" (B, L, M, D) float32 after feeding
        every row's tokens up to its last, "finite" (B,) bool (False for a
        row that met NaN or +Inf log-probabilities: its tokens and memory
        are garbage) and "memory_mask" (B, M) bool when the memory has a
        validity mask.
    """
    token_ids = ops.cast(token_ids, "int32")
    padding_mask = ops.cast(padding_mask, "bool")
    batch_size, length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
    backbone = model.backbone
    cache = initial_cache(model, batch_size, memory, memory_mask)
    # W_R R is the same for every step: a constant, not a loop variable.
    positions = cache.pop("positions", None)
    last = ops.full((batch_size,), length - 1, "int32")  # each row's last token
    if max_lengths is not None:
        last = ops.minimum(last, ops.cast(max_lengths, "int32") - 1)
    stops = tuple(stop_token_ids or ())

    def cond(index, token_ids, cache, last, finite):
        return ops.logical_and(
            index <= length, ops.any(index - 1 <= last)
        )

    def body(index, token_ids, cache, last, finite):
        fed = ops.slice(token_ids, [0, index - 1], [batch_size, 1])  # (B, 1)
        step_cache = dict(cache)
        if positions is not None:
            step_cache["positions"] = positions
        hidden, new_cache = backbone.call_with_cache(fed, step_cache)
        new_cache.pop("positions", None)
        active = index - 1 <= last  # (B,) rows still feeding

        def keep_active(new, old):
            shape = [-1] + [1] * (len(new.shape) - 1)
            return ops.where(ops.reshape(active, shape), new, old)

        new_cache = tree.map_structure(keep_active, new_cache, cache)
        # Position `index` (the last step only feeds: nothing to write).
        write = ops.minimum(index, length - 1)
        log_probs = model.log_probs_from_hidden(hidden)[:, 0]  # (B, V)
        # -Inf is a valid log-probability (an impossible id); NaN and +Inf
        # are not (NaN weights, a float16 overflow).
        bad = ops.logical_or(ops.isnan(log_probs), ops.equal(log_probs, float("inf")))
        finite = ops.logical_and(
            finite, ops.logical_not(ops.logical_and(active, ops.any(bad, axis=-1))))
        chosen = ops.cast(
            choose(log_probs, write) if choose_with_index else choose(log_probs),
            "int32",
        )
        in_prompt = ops.take(padding_mask, write, axis=1)
        current = ops.take(token_ids, write, axis=1)
        # A row writes position `index` until it has written a stop token
        # (then `last` < index: it only feeds that stop token).
        writing = ops.logical_and(
            # index <= last: nothing is written past a row's limit (its
            # max length or its stop token).
            ops.logical_and(index < length, index <= last),
            ops.logical_not(in_prompt),
        )
        column = ops.where(writing, chosen, current)
        token_ids = ops.slice_update(token_ids, [0, write], column[:, None])
        if stops:
            stopped = ops.logical_and(writing, stop_mask(column, stops))
            last = ops.where(stopped, write, last)
        return index + 1, token_ids, new_cache, last, finite

    index = ops.convert_to_tensor(1, "int32")
    finite = ops.ones((batch_size,), "bool")
    _, token_ids, cache, last, finite = ops.while_loop(
        cond, body, (index, token_ids, cache, last, finite),
        maximum_iterations=length,
    )
    out = {
        "token_ids": token_ids,
        "padding_mask": ops.arange(length)[None, :] <= last[:, None],
        "memory": backbone.stack_memory(cache),
        "finite": finite,
    }
    if "memory_mask" in cache:
        out["memory_mask"] = cache["memory_mask"]
    return out
