"""Argument checks shared by the model, training and export code.

Each raises a `ValueError` that names the argument, the expected value and
what was received. NumPy integer scalars count as integers; `bool` does not.
"""

import numbers


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
