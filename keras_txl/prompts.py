"""Checking and packing `generate()`'s prompts (strings or token ids).

Every form of prompt goes through the same checks before anything is
traced: strings are tokenized, ids must be integers in [0, V), keras-hub's
dict of "token_ids" and "padding_mask" must have a mask of the same shape
that is a prefix of ones in every row (prompts start at position 0 and are
right-padded), and `max_length` must hold the longest prompt.
"""

import numbers

import numpy as np
import tensorflow as tf

from keras_txl.checks import positive_int
from keras_txl.tokenizers import text_bytes

# How many values of a bad mask row an error shows.
_SHOWN = 16


def _tokenize_one(tokenizer, text):
    return np.asarray(tokenizer.tokenize(tf.constant(text)), "int32")


def _as_host(value):
    """A tensor as NumPy (a ragged tensor as nested lists); others as they
    are."""
    if isinstance(value, tf.RaggedTensor):
        return value.to_list()
    if tf.is_tensor(value):
        return value.numpy()
    return value


def _shown(row):
    values = [int(v) for v in row[:_SHOWN]]
    return str(values)[:-1] + (", ...]" if len(row) > _SHOWN else "]")


def _dict_rows(inputs):
    """keras-hub's {"token_ids", "padding_mask"} as one id row per prompt
    (its masked prefix), and the dict's padded length."""
    if set(inputs) - {"token_ids", "padding_mask"} or "token_ids" not in inputs:
        raise ValueError(
            "`inputs` as a dict must hold 'token_ids' and optionally "
            f"'padding_mask', received keys {sorted(map(str, inputs))}."
        )
    try:
        token_ids = np.asarray(_as_host(inputs["token_ids"]))
    except ValueError:  # NumPy: "inhomogeneous shape" (a ragged tensor's rows)
        raise ValueError(
            "`inputs['token_ids']` must be a dense (batch, length) array, its rows "
            "right-padded and `padding_mask` saying where; received rows of "
            "different lengths (pass them as a list of id lists instead).") from None
    if token_ids.dtype.kind not in "iu":
        raise ValueError(
            "`inputs['token_ids']` must hold integer token ids, received "
            f"dtype {token_ids.dtype}."
        )
    if token_ids.ndim != 2 or 0 in token_ids.shape:
        raise ValueError(
            "`inputs['token_ids']` must have shape (batch, length) with "
            f"batch and length >= 1, received shape {token_ids.shape}."
        )
    if "padding_mask" in inputs:
        mask = np.asarray(_as_host(inputs["padding_mask"]))
        if mask.shape != token_ids.shape:
            raise ValueError(
                "`inputs['padding_mask']` must have the shape of "
                f"`inputs['token_ids']` {token_ids.shape}, received shape "
                f"{mask.shape}."
            )
        if mask.dtype.kind in "iu" and np.isin(mask, (0, 1)).all():
            mask = mask.astype(bool)
        elif mask.dtype != bool:
            raise ValueError(
                "`inputs['padding_mask']` must be bool (or integers 0 and 1), "
                f"received dtype {mask.dtype}"
                + (" with other values" if mask.dtype.kind in "iu" else "") + "."
            )
    else:
        mask = np.ones(token_ids.shape, bool)
    lengths = mask.sum(axis=1)
    prefix = np.arange(mask.shape[1])[None, :] < lengths[:, None]
    bad = np.flatnonzero(np.any(mask != prefix, axis=1) | (lengths == 0))
    if bad.size:
        row = int(bad[0])
        raise ValueError(
            f"`inputs['padding_mask']` row {row} must be a prefix of ones "
            "(each prompt starts at position 0, holds at least one token and "
            f"is right-padded), received {_shown(mask[row].astype(int))}."
        )
    rows = [token_ids[i, :n] for i, n in enumerate(lengths)]
    return rows, token_ids.shape[1]


def _is_id(value):
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(
        value, (bool, np.bool_)
    )


def _empty(inputs):
    """What an empty `inputs` is, for the error ("an empty list", "an empty
    string tensor of shape (0,)")."""
    if isinstance(inputs, tf.RaggedTensor):
        return f"an empty ragged tensor of shape {tuple(inputs.shape)}"
    if tf.is_tensor(inputs):
        return f"an empty {inputs.dtype.name} tensor of shape {tuple(inputs.shape)}"
    if isinstance(inputs, np.ndarray):
        return f"an empty array of shape {inputs.shape}"
    return f"an empty {type(inputs).__name__}"


def _prompt_list(inputs):
    """`inputs` (not a dict) as (list of prompts, scalar)."""
    inputs = _as_host(inputs)
    if isinstance(inputs, np.ndarray):
        if inputs.ndim == 0:
            inputs = inputs.item()
        elif inputs.dtype.kind in "SUO" or inputs.ndim == 2:
            inputs = list(inputs)
    scalar = isinstance(inputs, (str, bytes))
    prompts = [inputs] if scalar else inputs
    if not isinstance(prompts, (list, tuple)):
        raise ValueError(
            "`inputs` must be a string, a list of strings, a list of lists "
            "of token ids, a dict of 'token_ids' and 'padding_mask', a "
            "string tensor or a tf.data.Dataset of those, received "
            f"{type(inputs).__name__}"
            + (f" of shape {inputs.shape}" if hasattr(inputs, "shape") else "")
            + "."
        )
    return prompts, scalar


def normalize_prompts(inputs, preprocessor, max_length, vocabulary_size):
    """Checks `generate()`'s prompts and packs them, right-padded.

    Args:
        inputs: a string, a list of strings (or bytes), a list of lists of
            int ids, a 2-D int array, a string tensor (rank 0 or 1), a
            ragged tensor of ids, or keras-hub's dict of "token_ids" (B, S)
            int and "padding_mask" (B, S) bool or 0/1 (each row a prefix of
            ones; the padding's values are not read).
        preprocessor: the model's preprocessor or None (strings need one).
        max_length: int or None. The packed length: None is the
            preprocessor's `sequence_length`, or S for a dict.
        vocabulary_size: int. Ids must be in [0, vocabulary_size).

    Returns:
        `(batch, kind, scalar)`: batch = {"token_ids" (B, S) int32,
        "padding_mask" (B, S) bool} with S = `max_length`; kind "strings"
        or "ids"; scalar True for a single string prompt.
    """
    default_length = None
    if isinstance(inputs, dict):
        rows, default_length = _dict_rows(inputs)
        names = [f"inputs['token_ids'][{i}]" for i in range(len(rows))]
        kind, scalar = "ids", False
    else:
        prompts, scalar = _prompt_list(inputs)
        if not prompts:
            raise ValueError(f"`inputs` is {_empty(inputs)}: give at least one prompt.")
        prompts = [_as_host(p) for p in prompts]
        if all(isinstance(p, (str, bytes)) for p in prompts):
            if preprocessor is None:
                raise ValueError(
                    "`inputs` are strings but the model has no preprocessor to "
                    "tokenize them: attach a TransformerXLCausalLMPreprocessor or "
                    "pass token ids."
                )
            # Bytes go to the tokenizer as they are (the byte tokenizer takes
            # any; the others read bytes that are not UTF-8 as U+FFFD);
            # strings by the tokenizers' surrogate rule, so a lone
            # surrogate is an error naming the prompt, not TensorFlow's.
            texts = [text_bytes(p, f"inputs[{i}]") for i, p in enumerate(prompts)]
            rows = [_tokenize_one(preprocessor.tokenizer, t) for t in texts]
            kind = "strings"
        elif all(
            isinstance(p, (list, tuple, np.ndarray))
            and getattr(p, "ndim", 1) == 1 and len(p) > 0
            and all(_is_id(i) for i in p)
            for p in prompts
        ):
            rows = [[int(i) for i in p] for p in prompts]
            kind = "ids"
        else:
            bad = next(
                (p for p in prompts if not isinstance(p, (str, bytes, list, tuple, np.ndarray))),
                None,
            )
            if bad is not None:
                found = f"an element of type {type(bad).__name__}"
                if _is_id(bad):
                    found += " (one prompt of ids is a list inside the list: [[1, 2, 3]])"
            elif any(isinstance(p, (str, bytes)) for p in prompts):
                found = "strings mixed with id lists"
            elif any(len(p) and all(isinstance(_as_host(i), (str, bytes)) for i in p)
                     for p in prompts):
                # [["a", "b"]] or a 2-D string tensor: was "an empty list or
                # a list holding something else than int ids".
                found = ("a batch of strings nested one level too deep (a list of lists "
                         "of strings, or a string tensor of rank 2): pass one string per "
                         'prompt, ["a prompt", "another"]')
            else:
                found = "an empty list or a list holding something else than int ids"
            raise ValueError(
                "`inputs` must be all strings or all non-empty lists of int token "
                f"ids; received {found}."
            )
        names = [f"inputs[{i}]" for i in range(len(rows))]
    for name, row in zip(names, rows):
        if len(row) == 0:
            raise ValueError(
                f"`{name}` is empty after tokenization: every prompt needs "
                "at least one token."
            )
        if isinstance(row, np.ndarray):
            low, high = int(row.min()), int(row.max())
        else:  # Python ints (any size: checked before a NumPy cast)
            low, high = min(row), max(row)
        if low < 0 or high >= vocabulary_size:
            raise ValueError(
                f"`{name}` holds token ids outside [0, vocabulary_size="
                f"{vocabulary_size}), received values in [{low}, {high}]."
            )
    lengths = [len(row) for row in rows]
    longest = max(lengths)
    if max_length is None:
        max_length = default_length or getattr(preprocessor, "sequence_length", None)
        if max_length is None:
            raise ValueError("`max_length` is needed when the model has no preprocessor.")
    max_length = positive_int("max_length", max_length)
    if max_length < longest:
        raise ValueError(
            f"`max_length`={max_length} is shorter than the longest prompt "
            f"({longest} tokens, prompt {int(np.argmax(lengths))}); "
            "it counts the prompt and the continuation together."
        )
    pad = 0
    if preprocessor is not None:
        pad = getattr(preprocessor.tokenizer, "pad_token_id", None) or 0
    token_ids = np.full((len(rows), max_length), pad, "int32")
    mask = np.zeros((len(rows), max_length), bool)
    for i, row in enumerate(rows):
        token_ids[i, : len(row)] = np.asarray(row, "int64")
        mask[i, : len(row)] = True
    return {"token_ids": token_ids, "padding_mask": mask}, kind, scalar
