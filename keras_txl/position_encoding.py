"""Sinusoid position encodings (paper section 3.3, the matrix R).

Shape legend: K = key length (memory + segment), D = hidden_dim.
"""

from keras import ops


def inverse_frequencies(hidden_dim):
    """`1 / 10000^(2k / D)` for k = 0..D/2-1, float32, as the official code."""
    exponents = ops.arange(0, hidden_dim, 2, dtype="float32") / hidden_dim
    return 1.0 / ops.power(10000.0, exponents)  # (D/2,)


def sinusoid_embedding(positions, hidden_dim):
    """Sinusoids of `positions` (float32, (K,)) as `[sin | cos]` halves.

    The halves are concatenated, not interleaved, as in the official code.
    """
    angles = ops.einsum(
        "k,f->kf", ops.cast(positions, "float32"), inverse_frequencies(hidden_dim)
    )  # (K, D/2)
    return ops.concatenate([ops.sin(angles), ops.cos(angles)], axis=-1)  # (K, D)


def relative_positions(key_length, clamp_length=-1):
    """Relative distances `K-1, ..., 1, 0` (float32), optionally clamped.

    Column c of the raw position scores holds distance K-1-c; the relative
    shift then aligns distance (M + i - j) with query i and key j.
    """
    positions = ops.arange(key_length - 1, -1, -1, dtype="float32")  # (K,)
    if clamp_length is not None and clamp_length > 0:
        positions = ops.minimum(positions, float(clamp_length))
    return positions


def relative_position_embedding(key_length, hidden_dim, clamp_length=-1):
    """The matrix R of the paper: (K, D) float32, row c = distance K-1-c."""
    return sinusoid_embedding(
        relative_positions(key_length, clamp_length), hidden_dim
    )


def absolute_position_embedding(length, hidden_dim):
    """Sinusoids of positions 0..T-1: the vanilla Transformer baseline."""
    return sinusoid_embedding(ops.arange(0, length, dtype="float32"), hidden_dim)
