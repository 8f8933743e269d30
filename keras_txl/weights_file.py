"""Reading weights files: safetensors only, never pickle."""

import os


def read_safetensors(path):
    """`{name: np.ndarray}` of a safetensors file (no pickle), or a ValueError naming it."""
    try:
        from safetensors.numpy import load_file
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise ImportError("Reading checkpoints needs `safetensors`.") from e
    if not os.path.exists(path):
        raise ValueError(f"No weights file at {path!r}.")
    try:
        return load_file(path)
    except Exception as e:  # safetensors raises its own error types
        raise ValueError(
            f"Could not read {path!r} as safetensors (truncated or corrupted "
            f"file?): {e}"
        ) from None
