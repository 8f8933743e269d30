"""Checking and packing `generate()`'s prompts (strings or token ids)."""

import numpy as np
import tensorflow as tf

from keras_txl.checks import positive_int


def _tokenize_one(tokenizer, text):
    return np.asarray(tokenizer.tokenize(tf.constant(text)), "int32")


def normalize_prompts(inputs, preprocessor, max_length, vocabulary_size):
    """Checks `generate()`'s prompts and packs them, right-padded.

    Returns:
        `(batch, kind, scalar)`: batch = {"token_ids" (B, S) int32,
        "padding_mask" (B, S) bool} with S = `max_length`; kind "strings"
        or "ids"; scalar True for a single string prompt.
    """
    if isinstance(inputs, dict):
        if set(inputs) - {"token_ids", "padding_mask"} or "token_ids" not in inputs:
            raise ValueError(
                "`inputs` as a dict must hold 'token_ids' and 'padding_mask', "
                f"received keys {sorted(inputs)}."
            )
        token_ids = np.asarray(inputs["token_ids"])
        mask = np.asarray(inputs.get("padding_mask", np.ones_like(token_ids, bool)), bool)
        if token_ids.ndim != 2 or not mask[:, 0].all():
            raise ValueError(
                "`inputs['token_ids']` must be (batch, length) with every "
                "prompt starting at position 0 and at least one token."
            )
        return {"token_ids": token_ids.astype("int32"), "padding_mask": mask}, "ids", False
    scalar = isinstance(inputs, (str, bytes))
    prompts = [inputs] if scalar else inputs
    if isinstance(prompts, np.ndarray):
        prompts = list(prompts)
    if not isinstance(prompts, (list, tuple)):
        raise ValueError(
            "`inputs` must be a string, a list of strings or a list of lists "
            f"of token ids, received {type(inputs).__name__}."
        )
    if not prompts:
        raise ValueError("`inputs` is an empty list: give at least one prompt.")
    if all(isinstance(p, (str, bytes)) for p in prompts):
        if preprocessor is None:
            raise ValueError(
                "`inputs` are strings but the model has no preprocessor to "
                "tokenize them: attach a TransformerXLCausalLMPreprocessor or "
                "pass token ids."
            )
        texts = [p.decode("utf-8") if isinstance(p, bytes) else p for p in prompts]
        rows = [_tokenize_one(preprocessor.tokenizer, t) for t in texts]
        kind = "strings"
    elif all(
        isinstance(p, (list, tuple, np.ndarray)) and len(p) > 0 and all(
            isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in p
        )
        for p in prompts
    ):
        rows = [np.asarray(p, "int64") for p in prompts]
        kind = "ids"
    else:
        bad = next(
            type(p).__name__ for p in prompts
            if not isinstance(p, (str, bytes, list, tuple, np.ndarray))
        ) if any(not isinstance(p, (str, bytes, list, tuple, np.ndarray)) for p in prompts) else "mixed"
        raise ValueError(
            "`inputs` must be all strings or all non-empty lists of int token "
            f"ids; received an element of type {bad}."
        )
    for i, row in enumerate(rows):
        if row.size == 0:
            raise ValueError(
                f"`inputs[{i}]` is empty after tokenization: every prompt needs "
                "at least one token."
            )
        if row.min() < 0 or row.max() >= vocabulary_size:
            raise ValueError(
                f"`inputs[{i}]` holds token ids outside [0, vocabulary_size="
                f"{vocabulary_size})."
            )
    longest = max(row.size for row in rows)
    if max_length is None:
        max_length = getattr(preprocessor, "sequence_length", None)
        if max_length is None:
            raise ValueError("`max_length` is needed when the model has no preprocessor.")
    max_length = positive_int("max_length", max_length)
    if max_length < longest:
        raise ValueError(
            f"`max_length`={max_length} is shorter than the longest prompt "
            f"({longest} tokens, prompt {int(np.argmax([r.size for r in rows]))}); "
            "it counts the prompt and the continuation together."
        )
    pad = 0
    if preprocessor is not None:
        pad = getattr(preprocessor.tokenizer, "pad_token_id", None) or 0
    token_ids = np.full((len(rows), max_length), pad, "int32")
    mask = np.zeros((len(rows), max_length), bool)
    for i, row in enumerate(rows):
        token_ids[i, : row.size] = row
        mask[i, : row.size] = True
    return {"token_ids": token_ids, "padding_mask": mask}, kind, scalar
