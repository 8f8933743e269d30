"""Giving the memory that compiling a step freed back to the operating system.

Tracing a `tf.function`, optimizing its graph (grappler) and instantiating its
kernels allocate and free tens of MB of small C++ and Python objects. glibc
keeps what was freed in its malloc arenas, where it stays resident until the
process ends: on the throughput benchmark's training step that is ~60 MB that
no later step uses. `malloc_trim(0)` hands the free pages of every arena (not
only the top of the heap) back to the operating system.

`CompiledFunction` is `tf.function` plus that call, made once after each new
trace (the first call, a new input shape), never per step. The training step,
the evaluation step and generation's steps are `CompiledFunction`s.

Tensors are not affected: TensorFlow's CPU allocator keeps them in its own pool
(oneDNN's BFC allocator), which this does not touch.
"""

import ctypes
import ctypes.util

import tensorflow as tf


def _load_malloc_trim():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)  # glibc only (not musl, macOS)
    if trim is not None:
        trim.argtypes = [ctypes.c_size_t]
        trim.restype = ctypes.c_int
    return trim


_MALLOC_TRIM = _load_malloc_trim()


def release_free_memory():
    """Returns the C heap's free pages to the operating system.

    Calls glibc's `malloc_trim(0)`: every malloc arena's whole free pages are
    given back (`madvise(MADV_DONTNEED)`), so they stop counting in the
    process's resident set. Memory in use is not touched. A no-op where the C
    library has no `malloc_trim` (macOS, Windows, musl).

    Returns:
        bool. True if memory was given back.
    """
    if _MALLOC_TRIM is None:
        return False
    return bool(_MALLOC_TRIM(0))


class CompiledFunction:
    """A `tf.function` that releases the tracing's freed memory after a trace.

    Behaves as `tf.function(python_function, **kwargs)` when called. After a
    call that traced (the first call, or a new input signature),
    `release_free_memory()` runs once; calls that reuse a trace cost nothing
    more.

    Args:
        python_function: the function to compile.
        **kwargs: passed to `tf.function` (`jit_compile`, `reduce_retracing`,
            `input_signature`, ...).

    Example:
    ```python
    step = CompiledFunction(train_step_fn, jit_compile=False)
    loss = step(x, y)  # traced, run, then the tracing's scratch is released
    loss = step(x, y)  # the same trace: a plain call
    ```
    """

    def __init__(self, python_function, **kwargs):
        self.function = tf.function(python_function, **kwargs)
        self._traces_seen = 0

    def __call__(self, *args, **kwargs):
        outputs = self.function(*args, **kwargs)
        traces = self.function.experimental_get_tracing_count()
        if traces != self._traces_seen:
            self._traces_seen = traces
            release_free_memory()
        return outputs

    def experimental_get_tracing_count(self):
        """How many times the function has been traced (as `tf.function`)."""
        return self.function.experimental_get_tracing_count()

    def get_concrete_function(self, *args, **kwargs):
        """The concrete function for these inputs (as `tf.function`)."""
        return self.function.get_concrete_function(*args, **kwargs)
