"""Training configuration: a frozen dataclass with strict overrides.

`--set key=value` on the command line is parsed against the field types;
unknown keys and wrong types are errors that name the field.
"""

import dataclasses
import json
import math
from typing import Any

LOOPS = ("custom", "fit")
STRATEGIES = ("default", "mirrored", "multi_worker", "tpu")
NON_FINITE = ("stop", "skip")


PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16", "auto")
# Settings only the custom loop reads, with their defaults: `loop="fit"`
# refuses other values (they were ignored in silence).
FIT_IGNORES = {"eval_every": 0, "eval_max_segments": 0, "on_non_finite": "stop",
               "report_bpc": False}
# Fields that take true, false or "auto".
BOOL_OR_AUTO = ("jit_compile",)

# Keras' LossScaleOptimizer default: 2**15, halved on every step whose
# gradients overflow, doubled after 2,000 finite steps in a row.
DEFAULT_INITIAL_LOSS_SCALE = 32768.0

# Integer fields and their lowest value. The highest is MAX_COUNT: step
# counts meet TensorFlow as int32/float32 (the cosine schedule, tf.summary
# steps), and a count past it is a typo, not a run (2**31 steps of 1 ms
# are 25 days); 99999999999999999999 would otherwise die as a TypeError
# deep in Keras' CosineDecay.
COUNTS = {"batch_size": 1, "steps": 1, "log_every": 1, "keep_checkpoints": 1,
          "warmup_steps": 0, "eval_every": 0, "checkpoint_every": 0,
          "eval_max_segments": 0, "seed": 0}
MAX_COUNT = 2**31 - 1
# keras.utils.set_random_seed seeds NumPy, which takes seeds below 2**32.
MAX_SEED = 2**32 - 1
# Float fields: (lowest, lowest excluded, highest or None). Every one must
# also be finite.
FLOATS = {"learning_rate": (0.0, True, None), "min_lr_ratio": (0.0, False, 1.0),
          "clip_norm": (0.0, False, None), "adam_epsilon": (0.0, True, None),
          "initial_loss_scale": (0.0, True, None)}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How to train and evaluate (the model itself is a TransformerXLConfig)."""

    # Global batch (all replicas together); rows are parallel text streams.
    batch_size: int = 8
    # Peak learning rate of Adam.
    learning_rate: float = 2.5e-4
    # Linear warm-up steps, then cosine decay to min_lr_ratio * peak.
    warmup_steps: int = 0
    # Total optimizer steps (the cosine ends here).
    steps: int = 1000
    # Final learning rate as a fraction of the peak (0.004 GPU, 0.01 TPU).
    min_lr_ratio: float = 0.004
    # Global-norm gradient clipping (the paper's 0.25); 0 disables.
    clip_norm: float = 0.25
    # Adam epsilon (the official code uses TF's 1e-8).
    adam_epsilon: float = 1e-8
    # Steps between log lines / TensorBoard scalars.
    log_every: int = 50
    # Steps between validation runs (0: only at the end).
    eval_every: int = 0
    # Segments of the validation split used by in-training evaluation
    # (0: the whole split).
    eval_max_segments: int = 0
    # Steps between checkpoints (0: only at the end).
    checkpoint_every: int = 500
    # Checkpoints kept on disk.
    keep_checkpoints: int = 3
    # "custom": tf.function step run by strategy.run; "fit": Keras fit.
    loop: str = "custom"
    # Distribution strategy.
    strategy: str = "default"
    # Compile the training step with XLA: True, False, or "auto": where the
    # step runs on GPUs or TPUs (on an H100 XLA trained wt103_base 2.35x
    # faster than graph mode), not on CPUs (there it was slower: 2,424
    # against 2,959 tok/s). Never under Mirrored with CPU replicas.
    jit_compile: Any = "auto"
    # "float32", "mixed_bfloat16", "mixed_float16" (with dynamic loss
    # scaling), or "auto": on a CPU mixed_bfloat16 with AMX or on an AMD
    # Zen 4 / Zen 5 (keras_txl.host.auto_precision), else float32; on a GPU by compute
    # capability (keras_txl.host.gpu_auto_precision).
    precision: str = "float32"
    # mixed_float16 only: the first loss scale of Keras' LossScaleOptimizer
    # (dynamic: halved on overflow, doubled after 2,000 good steps).
    initial_loss_scale: float = DEFAULT_INITIAL_LOSS_SCALE
    # On a NaN/Inf loss: "stop" (keep the last good checkpoint) or "skip"
    # the update.
    on_non_finite: str = "stop"
    # Seed for initialisation and dropout.
    seed: int = 0
    # Report bits per character instead of perplexity in the log line.
    report_bpc: bool = False

    def __post_init__(self):
        for name, low in COUNTS.items():
            value = getattr(self, name)
            high = MAX_SEED if name == "seed" else MAX_COUNT
            if (not isinstance(value, int) or isinstance(value, bool)
                    or not low <= value <= high):
                raise ValueError(
                    f"`{name}` must be an integer in [{low}, {high}], "
                    f"received {value!r}."
                )
        for name, (low, low_open, high) in FLOATS.items():
            value = getattr(self, name)
            # One rule for every float, whatever its spelling: JSON's 1e400
            # and Infinity arrive as inf, NaN as nan (which passes every
            # comparison written as `not x < 0`).
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value)
                    or (value <= low if low_open else value < low)
                    or (high is not None and value > high)):
                bounds = f"{'>' if low_open else '>='} {low:g}"
                if high is not None:
                    bounds = f"in [{low:g}, {high:g}]"
                raise ValueError(
                    f"`{name}` must be a finite number {bounds}, received "
                    f"{value!r}."
                )
        for field in dataclasses.fields(self):
            if field.type in (bool, "bool") and not isinstance(getattr(self, field.name), bool):
                # A --config file's "report_bpc": "no" is truthy.
                raise ValueError(
                    f"`{field.name}` must be true or false, received "
                    f"{getattr(self, field.name)!r}.")
        if self.warmup_steps > self.steps:
            raise ValueError(
                f"`warmup_steps`={self.warmup_steps} exceeds `steps`={self.steps}: "
                f"pass --set warmup_steps=N with N <= {self.steps} (0 for none), "
                f"or --steps {self.warmup_steps} or more."
            )
        for name, allowed in (("loop", LOOPS), ("strategy", STRATEGIES),
                              ("on_non_finite", NON_FINITE),
                              ("precision", PRECISIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"`{name}` must be one of {allowed}, received "
                    f"{getattr(self, name)!r}."
                )
        if not (self.jit_compile is True or self.jit_compile is False
                or self.jit_compile == "auto"):
            raise ValueError(
                f"`jit_compile` must be true, false or 'auto', received "
                f"{self.jit_compile!r}."
            )
        scale = self.initial_loss_scale
        if (scale != DEFAULT_INITIAL_LOSS_SCALE
                and self.precision in ("float32", "mixed_bfloat16")):
            raise ValueError(
                f"`initial_loss_scale`={scale!r} is used only with "
                f"precision='mixed_float16' (or 'auto' where it picks it), "
                f"received precision={self.precision!r}: drop the setting, "
                "or pass --precision mixed_float16."
            )
        if self.loop == "fit":
            if self.strategy == "multi_worker":
                # Refused here, before a task waits for its cluster.
                raise ValueError(
                    "loop='fit' (--loop fit) does not run under strategy='multi_worker': "
                    "Keras 3's fit is broken there (tensorflow/tensorflow#72388). Use "
                    "--loop custom with --strategy multi_worker."
                )
            ignored = [f"{name}={getattr(self, name)!r}" for name in FIT_IGNORES
                       if getattr(self, name) != FIT_IGNORES[name]]
            if ignored:
                raise ValueError(
                    f"loop='fit' (--loop fit) does not read {', '.join(ignored)}: only "
                    "the custom loop does (Keras' fit validates the whole validation "
                    "split after each pass over the text, and logs through Keras). "
                    "Drop them, or train with --loop custom."
                )
        if self.precision == "mixed_float16" and self.strategy == "tpu":
            raise ValueError(
                "precision='mixed_float16' is not for TPUs (they compute "
                "bfloat16, and XLA on TPU has no float16 matmuls worth the "
                "loss scaling): use precision='mixed_bfloat16' with "
                "strategy='tpu'."
            )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrainConfig":
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ValueError(f"Unknown train config key(s) {unknown}. Valid keys: {names}.")
        return cls(**data)

    def replace(self, **changes: Any) -> "TrainConfig":
        return self.from_dict({**self.to_dict(), **changes})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


def parse_override(text: str, fields: dict) -> tuple:
    """`key=value` -> (key, typed value), checked against `fields` types.

    `fields` maps names to their current values (used for the type).
    """
    if "=" not in text:
        raise ValueError(f"--set expects key=value, received {text!r}.")
    key, raw = text.split("=", 1)
    key = key.strip()
    if key not in fields:
        raise ValueError(f"Unknown key {key!r} in --set. Valid keys: {sorted(fields)}.")
    current = fields[key]
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    if key in BOOL_OR_AUTO:
        if not (isinstance(value, bool) or value == "auto"):
            raise ValueError(f"--set {key}: expected true, false or auto, received {raw!r}.")
    elif isinstance(current, bool):
        if not isinstance(value, bool):
            raise ValueError(f"--set {key}: expected true/false, received {raw!r}.")
    elif isinstance(current, int) and not isinstance(current, bool):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"--set {key}: expected an integer, received {raw!r}.")
    elif isinstance(current, float):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"--set {key}: expected a number, received {raw!r}.")
        value = float(value)
    elif isinstance(current, (list, tuple)):
        if not isinstance(value, list):
            raise ValueError(f"--set {key}: expected a JSON list, received {raw!r}.")
    elif isinstance(current, str):
        value = raw
    return key, value
