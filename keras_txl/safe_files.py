"""Opening files of an untrusted model folder: regular files, bounded JSON.

- `open_regular_file` refuses FIFOs, devices, sockets and folders before
  reading (opening a FIFO for reading would block until a writer comes). It
  opens with `O_NONBLOCK` and checks the open descriptor, so a file swapped
  for a FIFO between a check and the open cannot block either. Symlinks
  are followed (hub caches are made of them).
- `read_json` bounds the size and the nesting depth before `json.loads`,
  which recurses and raises `RecursionError` at ~1000 levels.
- `resolve_inside` refuses file names in a config that leave its folder
  (`../../etc/passwd`, absolute paths). The check is on the name, not on
  where a symlink points: a hub cache's files are symlinks into `blobs/`.
- `default_mode` is the mode a file or folder written under a temporary
  name gets before it is renamed into place.

Writing, atomically: `atomic_write_bytes` writes a file under a temporary
name beside it, fsyncs and renames it into place. Every temporary name
keras-txl writes (`temporary_prefix`) carries the writer's pid and host, so
`remove_stale_temporaries` can tell a killed writer's leftovers (a SIGKILL
runs no cleanup; a TFLite model or a checkpoint is as big as the model)
from a running writer's, and removes them the next time that folder is
written.
"""

import json
import logging
import os
import re
import shutil
import socket
import stat
import tempfile

import numpy as np

from keras_txl.limits import resolve_limits

logger = logging.getLogger("keras_txl")


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def default_mode(directory=False):
    """0o755 / 0o644 under the process umask: what a plain `mkdir` or
    `open(..., "w")` would give. `tempfile` creates 0o700 / 0o600, which a
    server running as another user (e.g. in a container) cannot read."""
    return (0o777 if directory else 0o666) & ~_umask()


_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def file_kind(mode):
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def folder_path(value, name="directory"):
    """`value` as a str path, or a TypeError naming the argument (os.fspath's
    own message names neither it nor what was expected)."""
    if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)):
        raise TypeError(
            f"`{name}` must be a folder path (str or os.PathLike), received "
            f"{type(value).__name__} {value!r}."
        )
    return os.fspath(value)


def open_regular_file(path, what="file"):
    """`path` opened for binary reading, or a ValueError if it is no regular file.

    Args:
        path: str or path-like.
        what: str. Named in the message ("weights file", "config.json").
    """
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise ValueError(f"No {what} at {path!r}.") from None
    except IsADirectoryError:
        raise ValueError(
            f"The {what} {path!r} is a directory; expected a regular file."
        ) from None
    except OSError as e:
        raise ValueError(f"Cannot open the {what} {path!r}: {e}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(
                f"The {what} {path!r} is {file_kind(mode)}; only regular files "
                "(or symlinks to them) are read."
            )
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path, max_bytes, what="file", limit_name=None):
    """The bytes of a regular file of at most `max_bytes`, else a ValueError."""
    with open_regular_file(path, what) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(max_bytes + 1) if size <= max_bytes else b""
    if size > max_bytes or len(data) > max_bytes:
        hint = f" (limit {limit_name})" if limit_name else ""
        raise ValueError(
            f"The {what} {os.fspath(path)!r} has {max(size, len(data))} bytes, "
            f"more than the {max_bytes} allowed{hint}."
        )
    return data


def json_depth(data, chunk_size=1 << 20):
    """The deepest nesting of `[`/`{` in JSON bytes (brackets inside strings
    count too, which can only overestimate).

    A vectorised scan in chunks: `json.loads` recurses once per level and a
    Python loop over megabytes of text takes seconds.
    """
    deepest, depth = 0, 0
    for start in range(0, len(data), chunk_size):
        chunk = np.frombuffer(data, np.uint8, min(chunk_size, len(data) - start),
                              start)
        steps = ((chunk == 0x5B) | (chunk == 0x7B)).astype(np.int32)
        steps -= ((chunk == 0x5D) | (chunk == 0x7D)).astype(np.int32)
        running = np.cumsum(steps, dtype=np.int64) + depth
        if running.size:
            deepest = max(deepest, int(running.max()))
            depth = int(running[-1])
    return deepest


def parse_json(data, source, limits=None):
    """JSON bytes -> Python, with the depth bounded first; ValueError if invalid."""
    limits = resolve_limits(limits)
    depth = json_depth(data)
    if depth > limits.max_json_depth:
        raise ValueError(
            f"{source} is nested {depth} levels deep, more than the "
            f"{limits.max_json_depth} allowed (limit max_json_depth): not a "
            "keras-txl file."
        )
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{source} is not valid JSON: {e}") from None
    except ValueError as e:
        # An integer of more digits than Python converts (4300 by default):
        # its message named neither the file nor the cause.
        raise ValueError(
            f"{source} could not be read as JSON: {e} (a number no keras-txl "
            "file holds: a damaged or hostile file?)"
        ) from None


def read_json(path, limits=None, what=None):
    """A JSON file of a model folder, size and depth bounded; ValueError if bad."""
    limits = resolve_limits(limits)
    what = what or os.path.basename(os.fspath(path))
    data = read_bytes(path, limits.max_json_bytes, what, "max_json_bytes")
    return parse_json(data, os.fspath(path), limits)


def resolve_inside(directory, name, what="file name"):
    """`directory/name` for a `name` read from a config; it must stay inside.

    Raises:
        ValueError: `name` is not a non-empty string, is absolute, or has
            `..` components that leave `directory`.
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ValueError(
            f"The {what} must be a non-empty file name inside "
            f"{os.fspath(directory)!r}, received {name!r}."
        )
    normal = os.path.normpath(name)
    if (os.path.isabs(name) or os.path.isabs(normal) or normal == os.pardir
            or normal.startswith(os.pardir + os.sep)
            or (os.altsep and normal.startswith(os.pardir + os.altsep))):
        raise ValueError(
            f"The {what} {name!r} leaves the folder {os.fspath(directory)!r}; "
            "only names inside the folder are read."
        )
    return os.path.join(os.fspath(directory), normal)


def temporary_prefix(tag=""):
    """`.tmp-[TAG-]PID@HOST-`: the prefix of every temporary file or folder
    keras-txl writes beside its final name (TAG: digits, letters, `_` or
    `.`, e.g. a SavedModel's version)."""
    tag = f"{tag}-" if tag != "" else ""
    return f".tmp-{tag}{os.getpid()}@{socket.gethostname()}-"


# `tempfile`'s random suffix is made of lower-case letters, digits and "_":
# the host (which may hold "-") runs up to the last "-".
_TEMPORARY = re.compile(r"^\.tmp-(?:[A-Za-z0-9_.]+-)?(\d+)@(.+)-[a-z0-9_]+$")


def left_by_a_killed_process(name):
    """Whether the file name `name` is a temporary (`temporary_prefix`) of a
    process of this host that is gone; another host's, a live process's and
    names not made by `temporary_prefix` are not."""
    match = _TEMPORARY.match(name)
    if not match or match.group(2) != socket.gethostname():
        return False
    try:
        os.kill(int(match.group(1)), 0)
        return False  # alive (or the pid reused: left alone)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError, ValueError):
        return False  # a live process of another user, or no such pid


def remove_stale_temporaries(directory):
    """Removes the temporary files and folders in `directory` (not below)
    that a process of this host left when it was killed; another host's,
    a live process's and names not made by `temporary_prefix` are left
    alone. Returns the paths removed."""
    try:
        entries = os.listdir(directory)
    except OSError:
        return []
    removed = []
    for entry in entries:
        if not left_by_a_killed_process(entry):
            continue
        path = os.path.join(directory, entry)
        logger.warning("Removing %s, left by a keras-txl process that was killed.", path)
        if remove_path(path):
            removed.append(path)
    return removed


def remove_path(path):
    """Removes a file, a link or a folder (with what it holds) at `path`;
    returns whether it is gone. A link is removed, never followed."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.remove(path)
        except OSError:
            pass
    return not os.path.lexists(path)


def atomic_write_bytes(path, data, make_parents=False):
    """Writes `data` to `path` whole or not at all: a temporary file beside
    it (`temporary_prefix`), fsynced, given `default_mode`, renamed. A
    killed earlier writer's temporaries in that folder are removed first.

    Args:
        path: str. The file to write (replaced if present).
        data: bytes.
        make_parents: bool. Create the missing folders above `path`.
    """
    directory = os.path.dirname(os.path.abspath(path))
    if make_parents:
        os.makedirs(directory, exist_ok=True)
    remove_stale_temporaries(directory)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=temporary_prefix())
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, default_mode())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
