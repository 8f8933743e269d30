"""Pure helpers for the segment-level recurrence: masks and memory update.

Shape legend: B batch, T segment length, M memory length, K = M + T keys,
L layers, D hidden_dim.
"""

import operator

from keras import ops


def attention_mask(
    segment_length,
    memory_length,
    same_length=False,
    same_length_convention="official_tf",
):
    """Boolean (T, K) matrix, True where query i may attend to key j.

    Keys are `[memory ; segment]`. Query i sits at key position M + i, so the
    causal rule is `j <= M + i`. With `same_length`, every query sees the
    same number of keys:
      - "official_tf": keys `[i, M + i]`, M + 1 of them (the official TF code
        that produced the paper's results);
      - "pytorch": keys `(i, M + i]`, M of them (PyTorch / Hugging Face). With
        M == 0 this blocks every key and the attention becomes uniform, as in
        Hugging Face.
    """
    query = ops.arange(segment_length)[:, None]  # (T, 1)
    key = ops.arange(segment_length + memory_length)[None, :]  # (1, K)
    allowed = key <= query + memory_length
    if same_length:
        if same_length_convention == "official_tf":
            allowed = ops.logical_and(allowed, key >= query)
        elif same_length_convention == "pytorch":
            allowed = ops.logical_and(allowed, key > query)
        else:
            raise ValueError(
                "`same_length_convention` must be 'official_tf' or 'pytorch', "
                f"received {same_length_convention!r}."
            )
    return allowed  # (T, K)


def update_memory(previous_memory, layer_input, memory_length):
    """New memory of one layer: the last M positions of [old memory ; input].

    The result is cut from the graph (paper eq. in section 3.2:
    `SG(h_{tau}^{n-1})`): no gradient flows into an older segment.

    Args:
        previous_memory: (B, M_old, D) tensor.
        layer_input: (B, T, D) tensor, the input of this layer in the segment.
        memory_length: int, M.

    Returns:
        (B, M, D) tensor.
    """
    if memory_length == 0:
        return previous_memory[:, :0, :]  # (B, 0, D)
    layer_input = ops.cast(layer_input, previous_memory.dtype)
    return ops.stop_gradient(
        last_of_joined(previous_memory, layer_input, memory_length)
    )  # (B, M, D)


def last_of_joined(old, new, length, axis=1, joined=None):
    """The last `length` positions of `concatenate([old, new], axis)`,
    without copying what is dropped.

    With the new part's length T known when tracing, T >= length takes
    them from `new` alone (`new` itself when T == length: no copy at all).
    Otherwise they are cut from `joined`, the join when the caller has it
    already; else T < length joins only the kept tail of `old`, and with T
    unknown the join is made and cut. `old` and `new` together must hold
    at least `length` positions.
    """
    if isinstance(length, bool) or not _is_integer(length) or length < 0:
        raise ValueError(
            f"`length` must be a non-negative int. Received: length={length!r}.")
    new_length = new.shape[axis]
    if new_length is not None and new_length >= length:
        if new_length == length:
            return new
        return last_positions(new, length, axis)
    if joined is not None:
        return last_positions(joined, length, axis)
    if new_length is not None:
        if old.shape[axis] != length - new_length:
            old = last_positions(old, length - new_length, axis)
        return ops.concatenate([old, new], axis=axis)
    return last_positions(ops.concatenate([old, new], axis=axis), length, axis)


def _is_integer(value):
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def last_positions(window, length, axis=1):
    """The last `length` > 0 positions of `window` on `axis` (by default
    `window[:, -length:]` for (B, K, ...) tensors).

    A `slice` (a contiguous copy per row) rather than a strided slice,
    which is markedly slower on CPU for the same bytes.
    """
    shape = ops.shape(window)
    start = [0] * len(window.shape)
    start[axis] = shape[axis] - length
    size = list(shape)
    size[axis] = length
    return ops.slice(window, start, size)


def zero_memory(batch_size, num_layers, memory_length, hidden_dim):
    """All-zero memory of full length, (B, L, M, D) float32.

    What the official TF code and Hugging Face feed to the first segment.
    """
    return ops.zeros(
        (batch_size, num_layers, memory_length, hidden_dim), dtype="float32"
    )


def memory_attention_mask(attention_mask, memory_mask):
    """Per-row attention mask with invalid memory slots blocked.

    Args:
        attention_mask: (T, K) bool, from `attention_mask`.
        memory_mask: (B, M) bool, True where a memory slot holds real memory
            (the PyTorch reference's empty memory: slots not yet filled are
            not attended, instead of attending to zero vectors).

    Returns:
        (B, T, K) bool.
    """
    memory_mask = ops.cast(memory_mask, "bool")
    segment_length = ops.shape(attention_mask)[0]
    segment = ops.ones((ops.shape(memory_mask)[0], segment_length), "bool")
    keys = ops.concatenate([memory_mask, segment], axis=1)  # (B, K)
    return ops.logical_and(attention_mask[None], keys[:, None, :])


def update_memory_mask(memory_mask, segment_length, memory_length):
    """The (B, M) validity after a segment of T real positions: the last M
    of `[memory_mask ; T x True]`, as `update_memory` slides the memory."""
    memory_mask = ops.cast(memory_mask, "bool")
    if memory_length == 0:
        return memory_mask
    segment = ops.ones((ops.shape(memory_mask)[0], segment_length), "bool")
    return last_positions(
        ops.concatenate([memory_mask, segment], axis=1), memory_length
    )
