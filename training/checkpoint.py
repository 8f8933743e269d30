"""Atomic checkpoints: model + optimizer + RNG + memory + data position.

A checkpoint is a folder `ckpt-00001234/` holding `state.safetensors` (all
tensors) and `state.json` (step, data position, configs). It is written
under a temporary name and renamed into place, then `latest.json` is
replaced atomically: a run killed at any moment leaves either the previous
checkpoint or the new one, never a half-written one under a final name.
Only the last `keep` checkpoints are kept. No pickle anywhere.
"""

import json
import logging
import os
import re
import shutil
import tempfile

import numpy as np

from keras_txl.io import atomic_write_bytes

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^ckpt-(\d{8})$")


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json_atomic(path, data):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write_bytes(path, json.dumps(data, indent=2, sort_keys=True).encode())


def rng_variables(model):
    """Variables of the model that are neither weights nor memory: the
    dropout seed generators (saved so a resumed run draws the same masks)."""
    weights = {id(w) for w in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def collect_tensors(model, optimizer):
    tensors = {}
    for w in model.model_weights():
        tensors[f"model/{w.path}"] = np.asarray(w.numpy())
    for i, v in enumerate(rng_variables(model)):
        tensors[f"rng/{i:04d}"] = np.asarray(v.numpy())
    if optimizer is not None:
        for i, v in enumerate(optimizer.variables):
            tensors[f"optimizer/{i:04d}"] = np.asarray(v.numpy())
    return tensors


def assign_tensors(tensors, model, optimizer, source="checkpoint"):
    def put(variable, key):
        if key not in tensors:
            raise ValueError(
                f"{source}: missing {key!r}; the checkpoint comes from another "
                "model or optimizer configuration."
            )
        value = tensors[key]
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(
                f"{source}: {key!r} has shape {tuple(value.shape)}, the model "
                f"needs {tuple(variable.shape)}: a checkpoint from another config?"
            )
        variable.assign(value)

    for w in model.model_weights():
        put(w, f"model/{w.path}")
    for i, v in enumerate(rng_variables(model)):
        put(v, f"rng/{i:04d}")
    if optimizer is not None:
        for i, v in enumerate(optimizer.variables):
            put(v, f"optimizer/{i:04d}")


class CheckpointManager:
    """Writes, lists, prunes and restores checkpoints in `directory`."""

    def __init__(self, directory, keep=3):
        self.directory = directory
        self.keep = keep
        os.makedirs(directory, exist_ok=True)

    def checkpoints(self):
        """Complete checkpoints, oldest first."""
        found = []
        for name in os.listdir(self.directory):
            match = _NAME.match(name)
            path = os.path.join(self.directory, name)
            if match and os.path.exists(os.path.join(path, "state.json")):
                found.append((int(match.group(1)), path))
        return [p for _, p in sorted(found)]

    def latest(self):
        """Path of the newest complete checkpoint, or None."""
        pointer = os.path.join(self.directory, "latest.json")
        if os.path.exists(pointer):
            try:
                with open(pointer) as f:
                    path = os.path.join(self.directory, json.load(f)["name"])
                if os.path.exists(os.path.join(path, "state.json")):
                    return path
            except (ValueError, KeyError, OSError):
                logger.warning("Ignoring unreadable %s.", pointer)
        found = self.checkpoints()
        return found[-1] if found else None

    def save(self, step, model, optimizer, memory, state):
        """Writes checkpoint `step`. `memory` is a numpy array or None."""
        from safetensors.numpy import save as to_bytes

        tensors = collect_tensors(model, optimizer)
        if memory is not None:
            tensors["memory"] = np.ascontiguousarray(memory, dtype=np.float32)
        name = f"ckpt-{step:08d}"
        final = os.path.join(self.directory, name)
        tmp = tempfile.mkdtemp(dir=self.directory, prefix=f".{name}.tmp-")
        try:
            with open(os.path.join(tmp, "state.safetensors"), "wb") as f:
                f.write(to_bytes(tensors, metadata={"format": "keras-txl-ckpt"}))
                f.flush()
                os.fsync(f.fileno())
            # state.json last: its presence marks a complete checkpoint.
            with open(os.path.join(tmp, "state.json"), "w") as f:
                json.dump({**state, "step": step}, f, indent=2, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            if os.path.exists(final):
                shutil.rmtree(final)
            os.replace(tmp, final)
            _fsync_dir(self.directory)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise OSError(
                f"Writing checkpoint {final} failed ({e}); the previous "
                "checkpoint is intact."
            ) from e
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        write_json_atomic(
            os.path.join(self.directory, "latest.json"), {"name": name, "step": step}
        )
        self._prune()
        return final

    def _prune(self):
        for path in self.checkpoints()[: -self.keep]:
            shutil.rmtree(path, ignore_errors=True)
        for name in os.listdir(self.directory):  # leftovers of killed writes
            if name.startswith(".ckpt-") or name.startswith(".tmp-"):
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)

    @staticmethod
    def read(path):
        """(tensors, state) of the checkpoint at `path`."""
        from keras_txl.weights_file import read_safetensors

        with open(os.path.join(path, "state.json")) as f:
            state = json.load(f)
        tensors = read_safetensors(os.path.join(path, "state.safetensors"))
        return tensors, state
