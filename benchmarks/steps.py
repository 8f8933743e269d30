"""The timed loops shared by `throughput.py` (CPU) and `gpu.py`: the library's own training
step and evaluation step over consecutive segments of one token array, memory carried.

Each returns the wall time of every step, the first ones included (the caller splits
warm-up from timed steps); a step's time ends when its result is on the host.
"""

import time


def segments(tf, data, segment_length, steps):
    """(x, y) tensors of `steps` consecutive segments of a (B, steps * T + 1) array."""
    T = segment_length
    for k in range(steps):
        yield (tf.constant(data[:, k * T:(k + 1) * T]),
               tf.constant(data[:, k * T + 1:(k + 1) * T + 1]))


def time_train_steps(tf, trainer, data, segment_length, steps):
    """`(seconds per step, losses)` of `trainer`'s training step (`Trainer._train_step`,
    the memory carried as loop state, as `Trainer.fit` runs it)."""
    times, losses = [], []
    memory = trainer.memory
    for x, y in segments(tf, data, segment_length, steps):
        t0 = time.perf_counter()
        loss, _, memory = trainer._train_step(x, y, memory)
        losses.append(float(loss))  # waits for the step
        times.append(time.perf_counter() - t0)
    return times, losses


def time_eval_steps(tf, model, data, segment_length, steps, jit_compile):
    """Seconds per step of the library's evaluation step (`make_eval_step`: per-token NLL
    of the targets, the memory carried as its key/value cache); the first step includes
    tracing (and XLA compilation)."""
    from keras_txl.training.loop import eval_cache
    from keras_txl.training.loop import make_eval_step

    eval_step = make_eval_step(model, jit_compile=jit_compile)
    cache = eval_cache(model, data.shape[0], segment_length)
    times = []
    for x, y in segments(tf, data, segment_length, steps):
        t0 = time.perf_counter()
        nll, cache = eval_step(x, y, cache)
        nll.numpy()
        times.append(time.perf_counter() - t0)
    return times
