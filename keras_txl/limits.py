"""Bounds on what an untrusted model folder may ask for, checked before building.

A `config.json` from elsewhere can ask for `hidden_dim=10**9` (a raw
out-of-memory error deep in TensorFlow) or `num_layers=100000` (minutes of
building); a weights file can claim tensors of terabytes. Every loader of
files (`load_pretrained`, `load_hf_checkpoint`, `read_safetensors`,
`load_tokenizer`) checks these bounds first and raises a `ValueError` that
names the field, its value and the limit, and how to raise it.

The defaults are far above every published Transformer-XL (the largest, on
One Billion Word, has 24 layers, hidden_dim 1280 and ~0.8e9 parameters).
Override them:

- per call: `load_pretrained(path, limits={"max_num_layers": 2048})`
  (also `load_hf_checkpoint`, `read_safetensors`, `load_tokenizer`);
- per process: the environment variable `KERAS_TXL_LIMITS`, a JSON object,
  e.g. `KERAS_TXL_LIMITS='{"max_parameters": 20000000000}'`.

A call's `limits` win over the environment, which wins over the defaults.
"""

import dataclasses
import json
import os

ENVIRONMENT_VARIABLE = "KERAS_TXL_LIMITS"


@dataclasses.dataclass(frozen=True)
class Limits:
    """Upper bounds on a loaded model; see the module docstring."""

    # Decoder blocks (building a block costs ~50 ms even when tiny).
    max_num_layers: int = 512
    # Attention heads per block.
    max_num_heads: int = 1024
    # hidden_dim, embedding_dim and head_dim.
    max_hidden_dim: int = 65536
    # Width of the feed-forward inner layer.
    max_intermediate_dim: int = 262144
    # Token ids (the largest real vocabulary, WT103, has 267,735).
    max_vocabulary_size: int = 1 << 24
    # memory_length, segment_length and |clamp_length|.
    max_sequence_length: int = 1 << 20
    # Trainable parameters of the config (float32: 4 bytes each).
    max_parameters: int = 4_000_000_000
    # Size of a JSON file read from a model folder (config, tokenizer).
    max_json_bytes: int = 16 << 20
    # Nesting depth of such a JSON file (and of a safetensors header).
    max_json_depth: int = 64
    # Size of a safetensors header (the JSON before the tensor data).
    max_header_bytes: int = 16 << 20
    # Number of tensors in a weights file.
    max_tensors: int = 100_000
    # Size of a tokenizer vocabulary or SentencePiece model file.
    max_tokenizer_bytes: int = 1 << 30

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(
                    f"Limit `{field.name}` must be a positive integer, "
                    f"received {field.name}={value!r}."
                )


def _environment_overrides():
    text = os.environ.get(ENVIRONMENT_VARIABLE)
    if not text:
        return {}
    try:
        overrides = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{ENVIRONMENT_VARIABLE} must be a JSON object such as "
            f'\'{{"max_num_layers": 2048}}\', received {text!r}: {e}'
        ) from None
    if not isinstance(overrides, dict):
        raise ValueError(
            f"{ENVIRONMENT_VARIABLE} must be a JSON object such as "
            f'\'{{"max_num_layers": 2048}}\', received {text!r}.'
        )
    return overrides


def resolve_limits(limits=None):
    """The `Limits` in force: defaults < `KERAS_TXL_LIMITS` < `limits`.

    Args:
        limits: None, a `Limits`, or a dict of overrides
            (`{"max_num_layers": 2048}`).
    """
    if isinstance(limits, Limits):
        return limits
    if limits is not None and not isinstance(limits, dict):
        raise ValueError(
            "`limits` must be None, a keras_txl.limits.Limits or a dict such "
            f"as {{'max_num_layers': 2048}}, received {type(limits).__name__}."
        )
    overrides = {**_environment_overrides(), **(limits or {})}
    names = [f.name for f in dataclasses.fields(Limits)]
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise ValueError(f"Unknown limit(s) {unknown}. Valid limits: {names}.")
    return Limits(**overrides)


def _exceeds(what, value, limit_name, limit):
    return ValueError(
        f"{what}={value} exceeds the limit {limit_name}={limit} for loaded "
        f"models. If the model is trusted, raise it: pass "
        f"limits={{'{limit_name}': ...}} or set {ENVIRONMENT_VARIABLE}="
        f"'{{\"{limit_name}\": ...}}'."
    )


def check_config(config, limits=None, source="config.json"):
    """Raises a ValueError if `config` asks for more than `limits` allow.

    Args:
        config: `TransformerXLConfig` (already validated).
        limits: as for `resolve_limits`.
        source: str. Named in the message (the file the config came from).
    """
    limits = resolve_limits(limits)
    bounds = [
        ("num_layers", "max_num_layers"),
        ("num_heads", "max_num_heads"),
        ("hidden_dim", "max_hidden_dim"),
        ("embedding_dim", "max_hidden_dim"),
        ("head_dim", "max_hidden_dim"),
        ("intermediate_dim", "max_intermediate_dim"),
        ("vocabulary_size", "max_vocabulary_size"),
        ("memory_length", "max_sequence_length"),
        ("segment_length", "max_sequence_length"),
        ("clamp_length", "max_sequence_length"),
    ]
    for field, limit_name in bounds:
        value = getattr(config, field)
        limit = getattr(limits, limit_name)
        if value is not None and abs(value) > limit:
            raise _exceeds(f"{source}: {field}", value, limit_name, limit)
    parameters = config.num_parameters()
    if parameters > limits.max_parameters:
        raise _exceeds(
            f"{source}: the config's parameter count", parameters,
            "max_parameters", limits.max_parameters,
        )
    return limits
