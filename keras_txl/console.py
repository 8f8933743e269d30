"""Quiet command-line runs: TensorFlow's own logs only with `txl -v`.

TensorFlow talks from three places, and each needs its own switch:

- its C++ core logs through absl, filtered by `TF_CPP_MIN_LOG_LEVEL`, which
  is read once, when the library loads (so it is set before any import);
- its Python side logs to the `tensorflow` and `absl` loggers;
- the TFLite converter's MLIR passes write to the process's file
  descriptor 2 from C++ ("Ignored output_format.", "MLIR V1 optimization
  pass is not enabled", ...), past both of the above. No setting reaches
  them, so `native_stderr_hidden()` points descriptor 2 at a temporary file
  for the duration of a block and shows what was caught only if the block
  fails (what the converter said may explain the failure).

This module imports nothing heavy: the CLI calls `configure_logging` before
TensorFlow is loaded.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile

# Python loggers that carry TensorFlow's own messages, and ours.
TENSORFLOW_LOGGERS = ("tensorflow", "absl")
OUR_LOGGERS = ("keras_txl", "txl")


def configure_logging(verbose: bool = False) -> None:
    """Our INFO lines on stderr; TensorFlow's logs only when `verbose`.

    A `TF_CPP_MIN_LOG_LEVEL` already in the environment wins (a user who
    sets it means it).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if verbose else "3")
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # -v: our DEBUG lines and TensorFlow's INFO, not every library's DEBUG
    # (h5py, matplotlib, ... say a lot there).
    for name in OUR_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.NOTSET)
    for name in TENSORFLOW_LOGGERS:
        logging.getLogger(name).setLevel(
            logging.NOTSET if verbose else logging.ERROR
        )


@contextlib.contextmanager
def native_stderr_hidden(hide: bool = True):
    """Catches everything written to file descriptor 2 inside the block.

    On success it is dropped; if the block raises, it is written to stderr
    before the exception goes on. Python's own `sys.stderr` writes inside
    the block are caught too (they end on the same descriptor).

    Args:
        hide: bool. False makes this a no-op (`txl -v`).
    """
    if not hide:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    failed = True
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
            failed = False
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if failed:
                sink.seek(0)
                caught = sink.read().decode("utf-8", "replace")
                if caught:
                    sys.stderr.write(caught)
                    sys.stderr.flush()
