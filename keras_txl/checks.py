"""Argument checks shared by the model, training and export code.

Each raises a `ValueError` that names the argument, the expected value and
what was received. NumPy integer and float scalars count as numbers; `bool`
does not.
"""

import math
import numbers

import numpy as np


def positive_int(name, value, allow_none=False):
    """`value` as an `int` >= 1 (or None, where `allow_none`)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        expected = "a positive integer" + (" or None" if allow_none else "")
        raise ValueError(
            f"`{name}` must be {expected}. Received: {name}={value!r}"
            + ("" if isinstance(value, numbers.Number) else f" of type {type(value).__name__}")
            + "."
        )
    return int(value)


def non_negative_int(name, value):
    """`value` as an `int` >= 0 (NumPy integers too; not `bool`)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(
            f"`{name}` must be an integer >= 0. Received: {name}={value!r}"
            + ("" if isinstance(value, numbers.Number) else f" of type {type(value).__name__}")
            + "."
        )
    return int(value)


def finite_number(name, value, minimum=None, maximum=None, expected=None):
    """`value` as a finite `float` in [minimum, maximum] (NumPy scalars too;
    not `bool`, NaN or Inf)."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value)
            or (minimum is not None and value < minimum)
            or (maximum is not None and value > maximum)):
        if expected is None:
            bounds = [f">= {minimum}" if minimum is not None else "",
                      f"<= {maximum}" if maximum is not None else ""]
            expected = " and ".join(b for b in bounds if b)
            expected = "a finite number" + (f" {expected}" if expected else "")
        raise ValueError(
            f"`{name}` must be {expected}. Received: {name}={value!r}"
            + ("" if isinstance(value, numbers.Number) else f" of type {type(value).__name__}")
            + "."
        )
    return float(value)


def boolean(name, value):
    """`value` as a `bool` (NumPy booleans too); a ValueError naming it for
    anything else: a string such as "no" is truthy and would silently mean
    True."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(
            f"`{name}` must be True or False. Received: {name}={value!r}"
            f" of type {type(value).__name__}."
        )
    return bool(value)


# Float dtypes a memory may come in (a bfloat16 or float16 model's outputs,
# a float64 NumPy array): cast to float32.
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def finite_float32(name, value, hint=""):
    """`value` as a float32 NumPy array with no NaN or Inf *after* the cast
    (a float64 1e300 is finite before it and Inf after). Any of
    `FLOAT_DTYPES` is accepted and cast."""
    array = np.asarray(value)
    if array.dtype.kind != "f" and array.dtype.name not in FLOAT_DTYPES:
        raise ValueError(
            f"`{name}` must be a float array ({', '.join(FLOAT_DTYPES)}), "
            f"received dtype {array.dtype}."
        )
    with np.errstate(over="ignore"):
        array = array.astype(np.float32)
    if not np.all(np.isfinite(array)):
        raise ValueError(
            f"`{name}` contains NaN or Inf values (as float32)" + (f"; {hint}" if hint else ".")
        )
    return array


# Temperatures below this decode greedily: the limit of T -> 0, which
# keras-hub's softmax(logits / T) misses under XLA (T = 1e-9 gave NaN
# probabilities there, and the last id was drawn); above it the
# distribution is already all on the argmax but for ties within ~1e-5 nats.
GREEDY_BELOW_TEMPERATURE = 1e-6

# The samplers and the SavedModel's `generate` compute in float32: a
# temperature above FLOAT32_MAX is Inf there, a top_p below
# FLOAT32_TINY is 0.
FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY = float(np.finfo(np.float32).smallest_subnormal)


def one_text_memory(name, value, row_shape):
    """A (1, L, M, D) memory to continue one text from (generation decodes
    one text): float32 with no NaN/Inf after the cast, of exactly that
    shape, or a ValueError naming `name` (a memory of several rows was cut
    to its first in silence)."""
    array = finite_float32(name, value, "pass a memory returned by the model "
                           "(e.g. after a prompt) or None.")
    expected = (1, *tuple(row_shape))
    if array.shape != expected:
        raise ValueError(
            f"`{name}` must have shape (1, num_layers, memory_length, hidden_dim) = "
            f"{expected} (generation decodes one text), received shape {array.shape}."
        )
    return array


def one_text_memory_mask(name, value, memory_length):
    """A (1, M) bool validity of a memory's slots to continue one text from,
    or a ValueError naming `name` (0/1 or float masks are refused, not cast:
    a soft mask has no meaning)."""
    try:
        array = np.asarray(value)
    except ValueError:  # ragged rows
        array = np.asarray(value, dtype=object)
    expected = (1, memory_length)
    if array.dtype != bool or array.shape != expected:
        raise ValueError(
            f"`{name}` must be a bool array of shape (1, memory_length) = "
            f"{expected} (generation decodes one text), True where a memory slot "
            "holds real memory: pass the one returned with the memory. Received "
            f"dtype {array.dtype} and shape {array.shape}."
        )
    return array


# The dtypes a stored weight may have: it is cast to the variable's dtype on
# load, which is exact for these and silently wrong for integers or booleans.
WEIGHT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def loaded_weight(name, value, source):
    """A weight array read from a file, checked before it is used.

    `value` must have a floating dtype (`WEIGHT_DTYPES`: an int or bool
    tensor where a weight belongs is a damaged or foreign file, and casting
    it would change the model's outputs without a word) and hold no NaN or
    Inf. `name` is the tensor's name in the file, `source` the file (both go
    into the error). Returns `value` as a NumPy array."""
    array = np.asarray(value)
    if array.dtype.name not in WEIGHT_DTYPES:
        raise ValueError(
            f"{source}: tensor {name!r} has dtype {array.dtype.name}; a weight must "
            f"be one of {', '.join(WEIGHT_DTYPES)} (a damaged or foreign file?)."
        )
    if not np.all(np.isfinite(array.astype(np.float32, copy=False))):
        raise ValueError(
            f"{source}: tensor {name!r} holds NaN or Inf values; refusing to load "
            "non-finite weights (a diverged run or a damaged file?)."
        )
    return array


def finite_weights(model, source):
    """Raises a `ValueError` naming `source` and the first weights of
    `model` (after loading) that hold NaN or Inf."""
    bad = [w.path for w in model.weights
           if w.dtype != "bool" and not np.all(np.isfinite(np.asarray(w.numpy(), np.float32)))]
    if bad:
        raise ValueError(
            f"{source}: the loaded weights hold NaN or Inf values ({', '.join(bad[:3])}"
            + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
            + "); refusing to use non-finite weights (a diverged run or a damaged file?)."
        )


def memory_for_generation(memory_length, how="`model.with_settings(memory_length=N)`"):
    """Generation reads its context through the memory, one token per step
    (the key/value cache of the last M positions): with M = 0 every new
    token would see only itself, and the prompt would be read for nothing.
    A ValueError saying so; `how` names the way to give the model a memory."""
    if memory_length == 0:
        raise ValueError(
            "Generation reads the context through the memory, one token per step, "
            "and this model has memory_length=0: each new token would see only "
            f"itself. Generate with a memory instead: {how}, e.g. N = the segment "
            "length or longer (the weights do not depend on it)."
        )
