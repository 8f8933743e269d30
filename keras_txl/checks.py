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


def finite_float32(name, value, hint=""):
    """`value` as a float32 NumPy array with no NaN or Inf *after* the cast
    (a float64 1e300 is finite before it and Inf after)."""
    array = np.asarray(value)
    if array.dtype.kind != "f":
        raise ValueError(f"`{name}` must be a float array, received dtype {array.dtype}.")
    with np.errstate(over="ignore"):
        array = array.astype(np.float32)
    if not np.all(np.isfinite(array)):
        raise ValueError(
            f"`{name}` contains NaN or Inf values (as float32)" + (f"; {hint}" if hint else ".")
        )
    return array
