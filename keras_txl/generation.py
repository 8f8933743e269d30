"""Sampling with the memory: the prompt fills it, then one token at a time.

The prompt is fed in segments of `segment_length`; each new token is then
fed alone with the memory, so the cost per new token depends on the
memory length, not on how much was generated. Works with any callable that
maps `(token_ids (1, T), memory) -> (log_probs (1, T, V), memory)`: the
Keras model, an exported SavedModel or a TFLite model.
"""

import numpy as np
import tensorflow as tf


def sample_next(log_probs, rng, temperature=1.0, top_k=0, top_p=1.0):
    """One id from a (V,) log-prob vector; temperature 0 is greedy."""
    log_probs = np.asarray(log_probs, dtype=np.float64)
    if temperature < 0:
        raise ValueError(f"`temperature` must be >= 0, received {temperature}.")
    if top_k < 0:
        raise ValueError(f"`top_k` must be >= 0, received {top_k}.")
    if not 0 < top_p <= 1:
        raise ValueError(f"`top_p` must be in (0, 1], received {top_p}.")
    if temperature == 0:
        return int(np.argmax(log_probs))
    logits = log_probs / temperature
    if top_k:
        kth = np.sort(logits)[-min(top_k, logits.size)]
        logits = np.where(logits >= kth, logits, -np.inf)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    if top_p < 1:
        order = np.argsort(-probs)
        cumulative = np.cumsum(probs[order])
        keep = order[: int(np.searchsorted(cumulative, top_p) + 1)]
        mask = np.zeros_like(probs)
        mask[keep] = 1
        probs = probs * mask / (probs * mask).sum()
    return int(rng.choice(probs.size, p=probs))


def keras_step_fn(model):
    """(ids, memory) -> (log_probs, memory) for a TransformerXLCausalLM."""

    @tf.function
    def step(token_ids, memory):
        out = model.call_with_memory(token_ids, memory)
        return out["log_probs"], out["memory"]

    return step


def generate(model, prompt_ids, max_new_tokens, temperature=1.0, top_k=0,
             top_p=1.0, seed=None, step_fn=None, initial_memory=None,
             segment_length=None, on_token=None):
    """Generates `max_new_tokens` ids after `prompt_ids`.

    Args:
        model: `TransformerXLCausalLM` (or None with `step_fn` and
            `initial_memory`).
        prompt_ids: 1-D ints, at least one.
        max_new_tokens: int.
        temperature, top_k, top_p: sampling; temperature 0 is greedy.
        seed: int. Same seed, same tokens.
        step_fn: optional `(ids (1,T), memory) -> (log_probs, memory)`.
        initial_memory: the memory to start from (default zeros).
        segment_length: prompt chunk length (default the model's).
        on_token: optional callback called with each new id (streaming).

    Returns:
        np.ndarray of the new ids.
    """
    prompt = np.asarray(prompt_ids, dtype=np.int32).reshape(-1)
    if prompt.size == 0:
        raise ValueError("`prompt_ids` must hold at least one token.")
    if max_new_tokens < 0:
        raise ValueError(f"`max_new_tokens` must be >= 0, received {max_new_tokens}.")
    if step_fn is None:
        step_fn = keras_step_fn(model)
    if initial_memory is None:
        initial_memory = model.initial_memory(1)
    if segment_length is None:
        segment_length = model.txl_config.segment_length
    rng = np.random.default_rng(seed)
    memory = initial_memory
    log_probs = None
    for start in range(0, prompt.size, segment_length):
        chunk = prompt[None, start : start + segment_length]
        log_probs, memory = step_fn(tf.constant(chunk), memory)
    new = []
    for _ in range(max_new_tokens):
        token = sample_next(np.asarray(log_probs)[0, -1], rng, temperature, top_k, top_p)
        new.append(token)
        if on_token is not None:
            on_token(token)
        log_probs, memory = step_fn(tf.constant([[token]], dtype=tf.int32), memory)
    return np.asarray(new, dtype=np.int32)


def generate_text(model_dir, prompt, max_new_tokens=200, **kwargs):
    """Loads a model folder and its tokenizer, returns prompt + continuation."""
    from keras_txl.io import load_pretrained
    from keras_txl.io import tokenizer_directory
    from training.tokenizers import load_tokenizer

    model = load_pretrained(model_dir)
    directory = tokenizer_directory(model_dir)
    if directory is None:
        raise ValueError(f"No tokenizer/ folder in {model_dir!r}.")
    tokenizer = load_tokenizer(directory)
    tokenizer.check_model_vocabulary(model.txl_config.vocabulary_size)
    ids = generate(model, tokenizer.encode(prompt), max_new_tokens, **kwargs)
    return prompt + tokenizer.decode(ids)
