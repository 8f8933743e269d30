"""Reading weights files: safetensors only, never pickle.

A safetensors file is an 8-byte little-endian header length, a JSON header
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{...}}` and the tensor bytes. `read_safetensors_header` reads and checks
the header alone (regular file, bounded size and depth, known dtypes,
offsets that fit the file and the shapes), so a file's names and shapes can
be compared with what the model needs before any tensor is allocated: the
safetensors library checks the same only while it loads everything.
"""

import math
import os
import struct

from keras_txl.limits import resolve_limits
from keras_txl.safe_files import open_regular_file
from keras_txl.safe_files import parse_json

# safetensors dtype -> bytes per element.
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}


def _corrupt(path, reason):
    return ValueError(
        f"Could not read {path!r} as safetensors (truncated or corrupted "
        f"file?): {reason}"
    )


def read_safetensors_header(path, limits=None):
    """`{name: (shape, dtype)}` of a safetensors file, read without its data.

    Args:
        path: str. The file (a symlink to one is fine).
        limits: see `keras_txl.limits.resolve_limits` (`max_header_bytes`,
            `max_json_depth`, `max_tensors`).

    Returns:
        dict of name -> (tuple of ints, safetensors dtype string such as
        "F32").

    Raises:
        ValueError: not a regular file, or a header that is too big, too
            deep, or inconsistent with itself or the file's size.
    """
    limits = resolve_limits(limits)
    path = os.fspath(path)
    with open_regular_file(path, "weights file") as f:
        file_size = os.fstat(f.fileno()).st_size
        prefix = f.read(8)
        if len(prefix) < 8:
            raise _corrupt(path, f"the file has {file_size} bytes, no header.")
        (header_size,) = struct.unpack("<Q", prefix)
        if header_size > limits.max_header_bytes:
            raise _corrupt(
                path, f"the header claims {header_size} bytes, more than the "
                f"{limits.max_header_bytes} allowed (limit max_header_bytes).",
            )
        if 8 + header_size > file_size:
            raise _corrupt(
                path, f"the header claims {header_size} bytes but the file "
                f"has {file_size}.",
            )
        raw = f.read(header_size)
    header = parse_json(raw, f"the safetensors header of {path!r}", limits)
    if not isinstance(header, dict):
        raise _corrupt(path, "the header is not a JSON object.")
    header.pop("__metadata__", None)
    if len(header) > limits.max_tensors:
        raise _corrupt(
            path, f"{len(header)} tensors, more than the {limits.max_tensors} "
            "allowed (limit max_tensors).",
        )
    data_size = file_size - 8 - header_size
    out = {}
    for name, entry in header.items():
        try:
            dtype, shape = entry["dtype"], entry["shape"]
            begin, end = entry["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise _corrupt(
                path, f"tensor {name!r} needs dtype, shape and two "
                "data_offsets.",
            ) from None
        if dtype not in DTYPE_SIZES:
            raise _corrupt(
                path, f"tensor {name!r} has the unknown dtype {dtype!r}; "
                f"expected one of {sorted(DTYPE_SIZES)}.",
            )
        if not isinstance(shape, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0
            for s in shape
        ):
            raise _corrupt(
                path, f"tensor {name!r} has the shape {shape!r}; expected a "
                "list of integers >= 0.",
            )
        if not all(isinstance(o, int) and not isinstance(o, bool)
                   for o in (begin, end)) or not 0 <= begin <= end <= data_size:
            raise _corrupt(
                path, f"tensor {name!r} has data_offsets {[begin, end]} "
                f"outside the {data_size} data bytes of the file.",
            )
        if end - begin != math.prod(shape) * DTYPE_SIZES[dtype]:
            raise _corrupt(
                path, f"tensor {name!r} of shape {tuple(shape)} and dtype "
                f"{dtype} needs {math.prod(shape) * DTYPE_SIZES[dtype]} bytes, "
                f"its data_offsets give {end - begin}.",
            )
        out[name] = (tuple(shape), dtype)
    return out


def check_tensor_names(path, header, expected, source="the config"):
    """Raises a ValueError unless `header` holds exactly `expected`'s names
    and shapes.

    Args:
        path: str. Named in the message.
        header: from `read_safetensors_header`.
        expected: `{name: shape}` or `{name: (shape, dtype)}` with a
            safetensors dtype string ("F32") to require.
        source: str. Where `expected` comes from, for the message.
    """
    missing = sorted(set(expected) - set(header))
    unexpected = sorted(set(header) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"{path}: the tensors do not match {source} (missing "
            f"{missing[:5]}{' ...' if len(missing) > 5 else ''}, unexpected "
            f"{unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}): a "
            "checkpoint from another config?"
        )
    for name, want in expected.items():
        shape, dtype = header[name]
        want_dtype = None
        if (len(want) == 2 and isinstance(want[1], str)):
            want, want_dtype = want
        if tuple(shape) != tuple(want):
            raise ValueError(
                f"{path}: tensor {name!r} has shape {tuple(shape)}, {source} "
                f"needs {tuple(want)}: a checkpoint from another config?"
            )
        if want_dtype is not None and dtype != want_dtype:
            raise ValueError(
                f"{path}: tensor {name!r} has dtype {dtype}, {source} needs "
                f"{want_dtype}."
            )


def read_safetensors(path, expected=None, limits=None):
    """`{name: np.ndarray}` of a safetensors file (no pickle), or a ValueError naming it.

    The header is read and checked first (see `read_safetensors_header`);
    with `expected`, its names and shapes must match before any tensor is
    read, so a wrong or hostile file costs no memory.

    Args:
        path: str.
        expected: optional `{name: shape}` or `{name: (shape, dtype)}`.
        limits: see `keras_txl.limits.resolve_limits`.
    """
    try:
        from safetensors.numpy import load_file
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise ImportError("Reading checkpoints needs `safetensors`.") from e
    header = read_safetensors_header(path, limits)
    if expected is not None:
        check_tensor_names(path, header, expected)
    try:
        return load_file(path)
    except Exception as e:  # safetensors raises its own error types
        raise _corrupt(path, e) from None
