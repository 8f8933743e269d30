"""Model configuration: one frozen dataclass, strict JSON round trip, presets.

The fields of `TransformerXLConfig` are exactly the constructor arguments of
`TransformerXLCausalLM` (besides `stateful`/`batch_size`), so a config file
rebuilds its own model.
"""

import dataclasses
import json
import math
import numbers
import os
from typing import Any

SAME_LENGTH_CONVENTIONS = ("official_tf", "pytorch")
ATTENTION_TYPES = ("relative", "vanilla")
EMPTY_MEMORY = ("zeros", "masked")
# Kept in step with keras_txl.position_encoding.FREQUENCY_DTYPES (not
# imported: this module needs no Keras).
POSITION_FREQUENCY_DTYPES = ("float32", "float16", "bfloat16")


def _python_number(value):
    """NumPy integer/float scalars as `int`/`float`; anything else as is."""
    if isinstance(value, bool) or type(value) in (int, float):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return value


def shown(value, items=5, chars=200):
    """`value` as an error message shows it: its repr, abbreviated when long
    (a list or tuple of more than 2 * `items` items as its first `items`,
    "..." and its length; any other repr cut after `chars` characters), so
    a hostile value (100,000 cutoffs) gives a message of a few lines, not
    of megabytes."""
    if isinstance(value, (list, tuple)) and len(value) > 2 * items:
        head = ", ".join(shown(v, items, chars) for v in value[:items])
        left, right = "[]" if isinstance(value, list) else "()"
        return f"{left}{head}, ...{right} ({len(value)} items)"
    if isinstance(value, (list, tuple)):
        text = ", ".join(shown(v, items, chars) for v in value)
        left, right = "[]" if isinstance(value, list) else "()"
        return left + text + ("," if len(value) == 1 and right == ")" else "") + right
    text = repr(value)
    if len(text) > chars:
        return f"{text[:chars]}... ({len(text)} characters)"
    return text


# The fields that decide the function a model's weights compute: their
# shapes, and the settings that change the numbers but no shape. Loading a
# model (`load_pretrained`, `load_hf_checkpoint`) or copying it
# (`with_settings`) may repeat them, not change them; the other fields are
# settings of evaluation or training.
TRAINED_FIELDS = (
    "vocabulary_size", "num_layers", "hidden_dim", "num_heads", "head_dim",
    "intermediate_dim", "embedding_dim", "cutoffs", "div_val",
    "tie_projections", "tie_embeddings", "project_same_dim",
    "untie_relative_bias", "pre_layer_norm", "layer_norm_epsilon",
    "attention_type", "same_length_convention", "position_frequency_dtype",
)


@dataclasses.dataclass(frozen=True)
class TransformerXLConfig:
    """Hyper-parameters of a Transformer-XL language model.

    Names follow Keras/keras-hub; the paper's and the official code's names
    are given in brackets.
    """

    # Number of token ids; ids are in [0, vocabulary_size). [n_token]
    vocabulary_size: int
    # Number of decoder blocks. [n_layer]
    num_layers: int
    # Width of the residual stream. [d_model]
    hidden_dim: int
    # Number of attention heads. [n_head]
    num_heads: int
    # Width of the feed-forward inner layer. [d_inner]
    intermediate_dim: int
    # Width of one head; None means hidden_dim // num_heads. [d_head]
    head_dim: int | None = None
    # Width of the (first) embedding table; None means hidden_dim. [d_embed]
    embedding_dim: int | None = None
    # Adaptive input/softmax cluster boundaries, strictly increasing,
    # each in (0, vocabulary_size); () means one plain softmax. [cutoffs]
    cutoffs: tuple = ()
    # Embedding width of cluster i is embedding_dim // div_val**i (0 allowed,
    # as in the official code: those tokens score by their bias). [div_val]
    div_val: int = 1
    # Per cluster (head first): share the softmax projection with the input
    # embedding's projection. None = the paper's "all but first". [tie_projs]
    tie_projections: tuple | None = None
    # Output tables are the input embedding tables. [tie_weight]
    tie_embeddings: bool = True
    # With div_val > 1, give a cluster whose width equals hidden_dim a
    # projection anyway (HF/PyTorch always do; the official TF code with
    # proj_same_dim=False does not). [proj_same_dim]
    project_same_dim: bool = True
    # Training segment length; the model itself runs any length. [tgt_len]
    segment_length: int = 128
    # Cached positions per layer; 0 disables the recurrence. [mem_len]
    memory_length: int = 128
    # Relative distances above this are clamped; <= 0 disables. [clamp_len]
    clamp_length: int = -1
    # Every query sees the same number of keys. [same_length]
    same_length: bool = False
    # "official_tf": a query sees M+1 keys (the TF code behind the paper's
    # numbers); "pytorch": M keys (PyTorch and Hugging Face).
    same_length_convention: str = "official_tf"
    # Memory slots not yet filled (a first segment with no memory given):
    # "zeros" attends to M zero vectors like real memory (the official TF
    # code and Hugging Face; the default, for parity); "masked" attends to
    # none of them (the PyTorch reference's empty memory), so a row's result
    # does not depend on how its text was cut into segments while the text
    # fits in the memory.
    empty_memory: str = "zeros"
    # Pre-LN blocks instead of the paper's post-LN. [pre_lnorm]
    pre_layer_norm: bool = False
    # Separate u/v biases per layer instead of shared ones. [untie_r]
    untie_relative_bias: bool = False
    # "relative" is Transformer-XL; "vanilla" uses absolute sinusoid
    # positions per segment and no relative terms (the paper's baseline).
    attention_type: str = "relative"
    # The precision the sinusoid frequencies 1 / 10000^(2k / hidden_dim) are
    # rounded to before the sinusoids are computed (in float32). "float32":
    # the exact ones, as the official code and any model trained in float32.
    # "float16"/"bfloat16": a Hugging Face checkpoint saved in that precision
    # stores its inv_freq buffer rounded, and transformers computes with the
    # rounded values; load_hf_checkpoint sets this from the buffer.
    position_frequency_dtype: str = "float32"
    # Dropout on embeddings, R, attention output, FFN and final output.
    dropout: float = 0.1
    # Dropout on attention probabilities. [dropatt]
    attention_dropout: float = 0.0
    # LayerNorm epsilon: 1e-5 in PyTorch/HF, 1e-12 in the official TF code.
    layer_norm_epsilon: float = 1e-5
    # Normal(0, init_std) for kernels, tables and u/v biases.
    init_std: float = 0.02
    # Normal(0, projection_init_std) for the adaptive projections.
    projection_init_std: float = 0.01

    def __post_init__(self):
        # Normalise containers so JSON lists and tuples compare equal.
        for name in ("cutoffs", "tie_projections"):
            value = getattr(self, name)
            if value is None and name == "tie_projections":
                continue
            if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
                expected = ("a list of increasing ints below vocabulary_size ([] for a "
                            "plain softmax)" if name == "cutoffs" else
                            "a list of booleans, one per tail cluster, or null")
                raise ValueError(f"`{name}` must be {expected}. Received: "
                                 f"{name}={shown(value)}.")
            object.__setattr__(self, name, tuple(value))
        # NumPy scalars (np.int64(2), np.float32(0.1)) are numbers like
        # Python's: store them as Python numbers (JSON cannot write them).
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, tuple):
                object.__setattr__(
                    self, field.name, tuple(_python_number(v) for v in value)
                )
            else:
                object.__setattr__(self, field.name, _python_number(value))
        self.validate()

    # --- derived values -------------------------------------------------
    @property
    def resolved_embedding_dim(self) -> int:
        return self.hidden_dim if self.embedding_dim is None else self.embedding_dim

    @property
    def resolved_head_dim(self) -> int:
        if self.head_dim is None:
            return self.hidden_dim // self.num_heads
        return self.head_dim

    @property
    def num_clusters(self) -> int:
        """Number of tail clusters (0 for a plain softmax)."""
        return len(self.cutoffs)

    @property
    def cluster_bounds(self) -> list:
        """[(start, end)] for the head shortlist and each tail cluster."""
        edges = [0, *self.cutoffs, self.vocabulary_size]
        return [(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]

    @property
    def resolved_tie_projections(self) -> tuple:
        if self.tie_projections is None:
            return (False,) + (True,) * self.num_clusters
        return self.tie_projections

    def cluster_embedding_dim(self, i: int) -> int:
        if self.div_val == 1:
            return self.resolved_embedding_dim
        return self.resolved_embedding_dim // (self.div_val**i)

    def cluster_has_projection(self, i: int) -> bool:
        """Whether cluster i maps between its width and hidden_dim."""
        width = self.cluster_embedding_dim(i)
        if self.div_val == 1:
            return width != self.hidden_dim
        return self.project_same_dim or width != self.hidden_dim

    def num_parameters(self) -> int:
        """Trainable parameters, counted from the shapes (no model built)."""
        D, E = self.hidden_dim, self.resolved_embedding_dim
        NH = self.num_heads * self.resolved_head_dim
        V = self.vocabulary_size
        if self.div_val == 1:
            tables = V * E
            projections = D * E if E != D else 0
        else:
            tables = projections = 0
            for i, (start, end) in enumerate(self.cluster_bounds):
                width = self.cluster_embedding_dim(i)
                tables += (end - start) * width
                if self.cluster_has_projection(i):
                    projections += width * D
        block = 5 * NH * D + 4 * D  # qkv (3), r, o; two LayerNorms
        block += 2 * D * self.intermediate_dim + self.intermediate_dim + D
        if self.attention_type == "vanilla":
            block -= NH * D  # no position projection
        biases = 0
        if self.attention_type == "relative":
            biases = 2 * NH * (self.num_layers if self.untie_relative_bias else 1)
        softmax = V + self.num_clusters * (self.cluster_embedding_dim(0) + 1)
        ties = self.resolved_tie_projections
        for i in range(self.num_clusters + 1):
            if self.cluster_has_projection(i) and not ties[i]:
                softmax += self.cluster_embedding_dim(i) * D
        if not self.tie_embeddings:
            softmax += tables
        return tables + projections + self.num_layers * block + biases + softmax

    # --- validation -----------------------------------------------------
    def validate(self) -> None:
        def positive(name):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(
                    f"`{name}` must be a positive integer, received "
                    f"{name}={shown(value)}."
                )

        for name in (
            "vocabulary_size",
            "num_layers",
            "hidden_dim",
            "num_heads",
            "intermediate_dim",
            "div_val",
            "segment_length",
        ):
            positive(name)
        if self.embedding_dim is not None:
            positive("embedding_dim")
        if self.head_dim is not None:
            positive("head_dim")
        elif self.hidden_dim % self.num_heads:
            raise ValueError(
                f"`hidden_dim`={self.hidden_dim} must be divisible by "
                f"`num_heads`={self.num_heads} when `head_dim` is not given; "
                "set head_dim explicitly or change one of them."
            )
        for name in ("memory_length", "clamp_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(
                    f"`{name}` must be an integer, received {name}={shown(value)}."
                )
        if self.clamp_length < -1:
            # The reference clamps only for clamp_len > 0: any other value
            # meant "none", so a typo such as -5 passed for a clamp in silence.
            raise ValueError(
                "`clamp_length` must be -1 (no clamping), 0 (no clamping, as the "
                "reference reads it) or a positive distance, received "
                f"clamp_length={self.clamp_length}."
            )
        if self.memory_length < 0:
            raise ValueError(
                "`memory_length` must be >= 0 (0 disables the recurrence), "
                f"received memory_length={self.memory_length}."
            )
        if self.hidden_dim % 2:
            raise ValueError(
                "`hidden_dim` must be even (the sinusoid position encoding "
                f"has sin and cos halves), received hidden_dim={self.hidden_dim}."
            )
        # Every float field: a finite real number, not a bool (NaN passes
        # `value <= 0` and a NaN epsilon makes every output NaN).
        for name, expected, valid in (
            ("dropout", "in [0, 1), a finite number", lambda v: 0.0 <= v < 1.0),
            ("attention_dropout", "in [0, 1), a finite number",
             lambda v: 0.0 <= v < 1.0),
            ("layer_norm_epsilon", "a positive, finite number (> 0)", lambda v: v > 0),
            ("init_std", "a positive, finite number (> 0)", lambda v: v > 0),
            ("projection_init_std", "a positive, finite number (> 0)",
             lambda v: v > 0),
        ):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or not valid(value)):
                raise ValueError(
                    f"`{name}` must be {expected}, received {name}={shown(value)}."
                )
        for name in ("same_length", "pre_layer_norm", "untie_relative_bias",
                     "tie_embeddings", "project_same_dim"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"`{name}` must be a bool, received "
                    f"{name}={shown(getattr(self, name))}."
                )
        if self.same_length_convention not in SAME_LENGTH_CONVENTIONS:
            raise ValueError(
                "`same_length_convention` must be one of "
                f"{SAME_LENGTH_CONVENTIONS}, received "
                f"{shown(self.same_length_convention)}."
            )
        if self.attention_type not in ATTENTION_TYPES:
            raise ValueError(
                f"`attention_type` must be one of {ATTENTION_TYPES}, received "
                f"{shown(self.attention_type)}."
            )
        cutoffs = self.cutoffs
        if any(not isinstance(c, int) or isinstance(c, bool) for c in cutoffs):
            raise ValueError(
                f"`cutoffs` must be integers, received cutoffs={shown(list(cutoffs))}."
            )
        if list(cutoffs) != sorted(set(cutoffs)):
            raise ValueError(
                "`cutoffs` must be strictly increasing, received "
                f"cutoffs={shown(list(cutoffs))}."
            )
        # The last cutoff may equal the vocabulary size: an empty last
        # cluster, which the official code and transformers build (their
        # data_utils give [..., V] for a vocabulary of V) and checkpoints
        # can hold; it only takes its share of the head's softmax.
        if cutoffs and (cutoffs[0] <= 0 or cutoffs[-1] > self.vocabulary_size):
            raise ValueError(
                "`cutoffs` must lie in (0, vocabulary_size="
                f"{self.vocabulary_size}] (the last may equal it: an empty last cluster), "
                f"received cutoffs={shown(list(cutoffs))}."
            )
        # A cluster may be 0 wide (E // div_val**i rounds to 0), as in the
        # official code and transformers, whose checkpoints can hold one: its
        # tokens embed to zero and score by their bias alone.
        if self.tie_projections is not None:
            if len(self.tie_projections) != len(cutoffs) + 1 or any(
                not isinstance(t, bool) for t in self.tie_projections
            ):
                raise ValueError(
                    "`tie_projections` must be None or one bool per cluster "
                    f"(len(cutoffs) + 1 = {len(cutoffs) + 1}), received "
                    f"{shown(list(self.tie_projections))}."
                )

        if self.position_frequency_dtype not in POSITION_FREQUENCY_DTYPES:
            raise ValueError(
                "`position_frequency_dtype` must be one of "
                f"{list(POSITION_FREQUENCY_DTYPES)}, received "
                f"position_frequency_dtype={shown(self.position_frequency_dtype)}."
            )
        if self.empty_memory not in EMPTY_MEMORY:
            raise ValueError(
                f"`empty_memory` must be one of {list(EMPTY_MEMORY)}, received "
                f"empty_memory={shown(self.empty_memory)}."
            )

    # --- serialisation --------------------------------------------------
    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["cutoffs"] = list(self.cutoffs)
        if self.tie_projections is not None:
            out["tie_projections"] = list(self.tie_projections)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "TransformerXLConfig":
        if not isinstance(data, dict):
            raise ValueError(
                f"A config must be a dict, received {type(data).__name__}."
            )
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ValueError(
                f"Unknown config key(s) {shown(unknown)}. Valid keys: {names}."
            )
        required = [
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.name not in data
        ]
        if required:
            raise ValueError(f"Missing required config key(s) {required}.")
        return cls(**data)

    def to_json(self, path: str | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True)
        if path is not None:
            with open(path, "w") as f:
                f.write(text + "\n")
        return text

    @classmethod
    def from_json(cls, text_or_path: str | os.PathLike) -> "TransformerXLConfig":
        """A config from JSON text (an object) or from a file holding it."""
        if not isinstance(text_or_path, (str, os.PathLike)):
            raise ValueError(
                "`text_or_path` must be JSON text or the path of a JSON file, "
                f"received {type(text_or_path).__name__}."
            )
        text = text_or_path
        # JSON text starts with "{" (a config) or "[" (refused by from_dict
        # with its type, rather than opened as a file name).
        if isinstance(text, os.PathLike) or not text.lstrip().startswith(("{", "[")):
            with open(text_or_path) as f:
                text = f.read()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"Config is not valid JSON: {e}") from None
        return cls.from_dict(data)

    def check_trained_fields(self, changes: dict, source: str) -> None:
        """A ValueError naming the first of `changes` that changes one of
        `TRAINED_FIELDS` of this config (read from `source`)."""
        for key in TRAINED_FIELDS:
            if key not in changes:
                continue
            value, fixed = changes[key], getattr(self, key)
            if value == fixed or (isinstance(fixed, tuple) and isinstance(
                    value, (list, tuple)) and tuple(value) == fixed):
                continue
            raise ValueError(
                f"`{key}`={shown(value)} contradicts {source}, which has "
                f"{key}={shown(fixed)} (the weights were trained so, and hold no "
                "sign of another value): leave it out. Evaluation settings "
                "(memory_length, clamp_length, same_length, segment_length, "
                "dropout, ...) can be changed."
            )

    def replace(self, **changes: Any) -> "TransformerXLConfig":
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise ValueError(
                f"Unknown config key(s) {shown(unknown)}. Valid keys: {sorted(names)}."
            )
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_preset(cls, name: str, **changes: Any) -> "TransformerXLConfig":
        from keras_txl.presets import PRESETS

        if name not in PRESETS:
            raise ValueError(
                f"Unknown preset {shown(name)}. Available: {sorted(PRESETS)}."
            )
        return cls.from_dict(PRESETS[name]["model"]).replace(**changes)
