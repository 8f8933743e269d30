"""Sinusoid position encodings (paper section 3.3, the matrix R).

Shape legend: K = key length (memory + segment), D = hidden_dim.
"""

import numpy as np
from keras import ops

# The precisions the frequencies may be rounded to (`position_frequency_dtype`).
FREQUENCY_DTYPES = ("float32", "float16", "bfloat16")


def rounded_frequencies(hidden_dim, dtype):
    """`1 / 10000^(2k / D)` in float32, then rounded to `dtype` (float16 or
    bfloat16, to nearest, ties to even), as float32 NumPy values: the
    frequencies of a transformers checkpoint saved in that precision, whose
    `inv_freq` buffer transformers loads back into float32 and computes with.

    The float32 values are PyTorch's `1 / (10000 ** (arange(0., D, 2.) / D))`
    as closely as NumPy gets: the exponents divided in float32, the power
    rounded from float64, the reciprocal in float32. An ulp of float32 away
    from PyTorch's, a value next to a float16/bfloat16 midpoint rounds the
    other way: so for 3 of the 4,096 (D, dtype) pairs with D <= 4096 (D
    above 3,400, float16), 50 with a float32 power, 274 from float64.
    """
    exponents = np.arange(0, hidden_dim, 2, dtype=np.float32) / np.float32(hidden_dim)
    powers = (10000.0 ** exponents.astype(np.float64)).astype(np.float32)
    values = np.float32(1.0) / powers
    if dtype == "float16":
        return values.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        # The top 16 bits of the float32, rounded to nearest even (positive,
        # finite values: no sign, NaN or overflow to care for).
        bits = values.view(np.uint32).astype(np.uint64)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.astype(np.uint32).view(np.float32)
    raise ValueError(
        f"`dtype` must be 'float16' or 'bfloat16', received dtype={dtype!r}."
    )


def inverse_frequencies(hidden_dim, dtype="float32"):
    """`1 / 10000^(2k / D)` for k = 0..D/2-1, float32, as the official code;
    with `dtype` "float16"/"bfloat16", those values rounded to it (a
    half-precision transformers checkpoint's; `rounded_frequencies`), a
    constant in float32."""
    if dtype != "float32":
        return ops.convert_to_tensor(rounded_frequencies(hidden_dim, dtype))
    exponents = ops.arange(0, hidden_dim, 2, dtype="float32") / hidden_dim
    return 1.0 / ops.power(10000.0, exponents)  # (D/2,)


def sinusoid_embedding(positions, hidden_dim, frequency_dtype="float32"):
    """Sinusoids of `positions` (float32, (K,)) as `[sin | cos]` halves.

    The halves are concatenated, not interleaved, as in the official code.
    `frequency_dtype`: see `inverse_frequencies`.
    """
    angles = ops.einsum(
        "k,f->kf", ops.cast(positions, "float32"),
        inverse_frequencies(hidden_dim, frequency_dtype),
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


def relative_position_embedding(key_length, hidden_dim, clamp_length=-1,
                                frequency_dtype="float32"):
    """The matrix R of the paper: (K, D) float32, row c = distance K-1-c."""
    return sinusoid_embedding(
        relative_positions(key_length, clamp_length), hidden_dim, frequency_dtype
    )


def absolute_position_embedding(length, hidden_dim, frequency_dtype="float32"):
    """Sinusoids of positions 0..T-1: the vanilla Transformer baseline."""
    return sinusoid_embedding(
        ops.arange(0, length, dtype="float32"), hidden_dim, frequency_dtype
    )
