"""The paper's learning-rate schedule: linear warm-up, then cosine decay."""

import math

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_txl")
class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """`lr(step)`: linear from 0 to `peak` over `warmup_steps`, then cosine
    down to `peak * min_ratio` at `total_steps` (held there afterwards).

    As the official code: `lr = peak * step / warmup` during warm-up, then
    `min + (peak - min) * 0.5 * (1 + cos(pi * (step - warmup) / (total - warmup)))`.
    """

    def __init__(self, peak, warmup_steps, total_steps, min_ratio=0.004):
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.min_ratio = float(min_ratio)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        peak, warmup = self.peak, float(self.warmup_steps)
        floor = peak * self.min_ratio
        decay = max(float(self.total_steps - self.warmup_steps), 1.0)
        progress = ops.clip((step - warmup) / decay, 0.0, 1.0)
        cosine = floor + (peak - floor) * 0.5 * (1.0 + ops.cos(math.pi * progress))
        if self.warmup_steps > 0:
            warm = peak * step / warmup
            return ops.where(step < warmup, warm, cosine)
        return cosine

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps, "min_ratio": self.min_ratio}
