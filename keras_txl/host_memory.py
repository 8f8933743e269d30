"""Giving back the memory that loading TensorFlow and compiling a step leave resident.

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

Loading TensorFlow leaves a second kind of resident memory: the pages of its
shared libraries that the dynamic linker and the static initializers read once
(`libtensorflow_cc.so.2` alone is 788 MB, with a 78 MB string table of symbol
names and 18 MB of relocations). They are clean file-backed pages, never
needed again, yet they stay mapped: ~300 MB of the process's resident set
right after `import tensorflow`, measured (all of PyTorch's libraries come to
~110 MB at the peer benchmark's peak). The kernel drops mapped pages only under memory pressure, and until then they
count in the resident set, in the container's memory and in Kubernetes'
working set. `release_library_pages()` asks the kernel to reclaim them now
(`madvise(MADV_PAGEOUT)`, Linux 5.4+); a page that is used again is read back
from the file on its next access, so nothing changes but the resident set.
It runs once, when this module is imported: with TensorFlow, by the first
use of a public `keras_txl` name that needs it, or by the training loop,
`fit` or generation, whichever comes first. Set `KERAS_TXL_RELEASE_LIBRARY_PAGES=0` to keep those pages
mapped.
"""

import ctypes
import ctypes.util
import errno
import os

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

# <sys/mman.h>: MADV_PAGEOUT reclaims the range's pages (Linux 5.4). Clean
# file-backed pages are dropped and read back from the file when touched
# again; anonymous ones (a library's relocated data) go to swap, or stay where
# there is none: the advice never changes what memory holds.
_MADV_PAGEOUT = 21
_ENV_SWITCH = "KERAS_TXL_RELEASE_LIBRARY_PAGES"


def _load_madvise():
    name = ctypes.util.find_library("c")
    if name is None or not os.path.exists("/proc/self/maps"):
        return None
    try:
        libc = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    madvise = getattr(libc, "madvise", None)
    if madvise is not None:
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        madvise.restype = ctypes.c_int
    return madvise


_MADVISE = _load_madvise()


def library_directories():
    """Where the extension libraries `release_library_pages()` acts on live.

    The site-packages directory that holds TensorFlow: TensorFlow's own
    libraries, and those of the packages installed beside it (NumPy, h5py,
    tensorflow-text, ...). The Python interpreter and the system's libraries
    are left alone.
    """
    return [os.path.dirname(os.path.dirname(os.path.realpath(tf.__file__)))]


def _resident_file_bytes():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssFile:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def release_library_pages(directories=None):
    """Lets the kernel reclaim the mapped library pages this process touched.

    Advises `MADV_PAGEOUT` on every read-only or executable private file
    mapping under `directories`: the kernel drops the resident pages of those
    files from this process (and from the page cache), and reads a page back
    from its file the next time it is used. What memory holds does not
    change; the resident set loses the pages that loading and compiling read
    once. Pages that another process maps too are kept (the kernel leaves
    shared pages alone), as are those of files the process may not write
    (Linux refuses the advice for them, e.g. a system-wide install used by
    another user). A no-op off Linux or before 5.4.

    Args:
        directories: list of str, existing directories whose files are
            released (default `library_directories()`).

    Returns:
        int. How many bytes the process's file-backed resident set shrank.

    Raises:
        ValueError: `directories` is not a list of existing directories (a
            single string would otherwise be read letter by letter).
    """
    if directories is None:
        directories = library_directories()
    if isinstance(directories, (str, bytes, os.PathLike)) or not all(
            isinstance(d, (str, os.PathLike)) for d in directories):
        raise ValueError(
            "`directories` must be a list of directory paths (str), e.g. "
            f"[{library_directories()[0]!r}]. Received: directories={directories!r}.")
    missing = [str(d) for d in directories if not os.path.isdir(d)]
    if missing:
        raise ValueError(
            f"`directories` must name existing directories; not found: {missing}.")
    if _MADVISE is None:
        return 0
    prefixes = tuple(os.path.join(os.path.realpath(d), "") for d in directories)
    ranges = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            # address, perms, offset, dev, inode, path: private (p) and not
            # writable (r--p, r-xp); writable data pages are never advised.
            if len(fields) < 6 or fields[1] not in ("r--p", "r-xp"):
                continue
            if not fields[5].rstrip("\n").startswith(prefixes):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end - start))
    before = _resident_file_bytes()
    for start, length in ranges:
        if _MADVISE(start, length, _MADV_PAGEOUT) != 0:
            if ctypes.get_errno() == errno.EINVAL:  # a kernel older than 5.4
                return 0
    return max(0, before - _resident_file_bytes())


def _library_release_enabled():
    return os.environ.get(_ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def release_free_memory():
    """Returns the C heap's free pages to the operating system.

    Calls glibc's `malloc_trim(0)`: every malloc arena's whole free pages are
    given back (`madvise(MADV_DONTNEED)`), so they stop counting in the
    process's resident set. Memory in use is not touched. A no-op where the C
    library has no `malloc_trim` (macOS, Windows, musl). TensorFlow's library
    pages are not released here (`release_library_pages` does that once, at
    import): a trace's code is mostly the next trace's too, and reading it
    back after every trace made a test run of many traces 27 % slower.

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


# Importing TensorFlow read its libraries' symbol tables and relocations and
# ran their static initializers: ~300 MB that no later work uses. How many
# bytes that released (None where switched off).
RELEASED_AT_IMPORT = release_library_pages() if _library_release_enabled() else None
