"""The paper's learning-rate schedule: linear warm-up, then cosine decay.

It is Keras' own `keras.optimizers.schedules.CosineDecay`, whose warm-up
form computes exactly the official code's schedule (`train_gpu.py`:
`lr = peak * step / warmup` while `step < warmup`, then
`tf.train.cosine_decay(peak, step - warmup, total - warmup,
alpha=min_lr_ratio)`, held at `peak * min_lr_ratio` after `total`).
`tests/test_training_setup.py` compares it with that formula at every
step.
"""

import keras


def learning_rate_schedule(peak, warmup_steps, total_steps, min_ratio=0.004):
    """`CosineDecay` with linear warm-up, in the official code's terms.

    `lr(step)` rises linearly from 0 to `peak` over `warmup_steps`, then
    follows a cosine from `peak` down to `peak * min_ratio` at
    `total_steps`, and stays there.

    Args:
        peak: float > 0. The learning rate after warm-up.
        warmup_steps: int >= 0. Steps of linear warm-up (0: none).
        total_steps: int >= warmup_steps. The step where the cosine ends.
        min_ratio: float in [0, 1]. The final rate as a fraction of `peak`
            (Keras' `alpha`).

    Returns:
        A `keras.optimizers.schedules.CosineDecay`.

    Example:

    >>> schedule = learning_rate_schedule(1.0, 10, 110, 0.1)
    >>> [round(float(schedule(s)), 4) for s in (5, 10, 60, 110, 500)]
    [0.5, 1.0, 0.55, 0.1, 0.1]
    """
    warmup_steps = int(warmup_steps)
    total_steps = int(total_steps)
    if warmup_steps < 0 or total_steps < warmup_steps:
        raise ValueError(
            "Need 0 <= warmup_steps <= total_steps. Received: "
            f"warmup_steps={warmup_steps}, total_steps={total_steps}."
        )
    # CosineDecay refuses decay_steps=0 (all steps are warm-up): one step of
    # "decay" then gives the floor from step warmup + 1 on, as the official
    # formula does.
    decay_steps = max(total_steps - warmup_steps, 1)
    if warmup_steps == 0:
        # No warm-up branch: its step / warmup_steps would be 0 / 0.
        return keras.optimizers.schedules.CosineDecay(
            initial_learning_rate=float(peak),
            decay_steps=decay_steps,
            alpha=float(min_ratio),
        )
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0,
        decay_steps=decay_steps,
        alpha=float(min_ratio),
        warmup_target=float(peak),
        warmup_steps=warmup_steps,
    )

