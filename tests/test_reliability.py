"""Faults and untrusted files: killed checkpoint writes, a full disk, no
pickle anywhere, Keras safe mode."""

import errno
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
from testing import REPO

import keras_txl
from keras_txl.training.checkpoint import CheckpointManager

WRITER = r"""
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np, keras_txl
from keras_txl.training.checkpoint import CheckpointManager
config = keras_txl.TransformerXLConfig(vocabulary_size=2000, num_layers=4, hidden_dim=256,
                                       num_heads=4, intermediate_dim=1024, memory_length=8)
model = keras_txl.TransformerXLCausalLM(config)
manager = CheckpointManager(sys.argv[1], keep=2)
print("ready", flush=True)
step = 0
while True:
    step += 1
    for w in model.model_weights():  # every weight holds the step number
        w.assign(np.full(w.shape, float(step), "float32"))
    manager.save(step, model, None, np.full((1, 2), float(step), "float32"), {"n": step})
"""


def test_sigkill_during_checkpoint_writes_never_leaves_a_bad_checkpoint(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    directory = tmp_path / "checkpoints"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    rng = np.random.default_rng(0)
    for round_ in range(3):
        process = subprocess.Popen([sys.executable, str(script), str(directory)], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert process.stdout.readline().strip() == b"ready"
        time.sleep(0.3 + rng.uniform(0, 1.5))  # somewhere inside a write
        process.send_signal(signal.SIGKILL)
        process.wait()
        latest = CheckpointManager(str(directory)).latest()
        if latest is None:
            continue
        tensors, state = CheckpointManager.read(latest)
        step = state["step"]
        assert state["n"] == step
        checked = [n for n in tensors if n.startswith("model/") or n == "memory"]
        assert len(checked) > 20
        for name in checked:
            assert np.all(tensors[name] == float(step)), (round_, name)


def test_a_killed_writers_temporary_files_are_removed_by_the_next_write(tmp_path):
    # A SIGKILL runs no cleanup: a killed TFLite export or manifest write
    # left its `.tmp-` file (as big as the model) beside the final name for
    # good. The next atomic write to that folder removes this host's dead
    # processes' temporaries, files and folders, and leaves a live process's,
    # another host's and names keras-txl does not make.
    import socket

    from keras_txl.safe_files import atomic_write_bytes
    from keras_txl.safe_files import temporary_prefix

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead, host = int(gone.stdout), socket.gethostname()
    stale_file = tmp_path / f".tmp-{dead}@{host}-k3x_9q"
    stale_folder = tmp_path / f".tmp-preset-{dead}@{host}-a1b2c3"
    kept = [tmp_path / f"{temporary_prefix()}live01",  # this (live) process
            tmp_path / f".tmp-{dead}@not-{host}-zz9",  # another host's
            tmp_path / ".tmp-abc123",  # not one of ours (no pid@host)
            tmp_path / "notes.txt"]
    stale_file.write_bytes(b"x" * 1000)
    (stale_folder / "assets").mkdir(parents=True)
    for path in kept:
        path.write_text("keep")
    atomic_write_bytes(str(tmp_path / "new" / "model.tflite"), b"abc", make_parents=True)
    assert (tmp_path / "new" / "model.tflite").read_bytes() == b"abc"
    atomic_write_bytes(str(tmp_path / "model.tflite"), b"def")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [p.name for p in kept] + ["new", "model.tflite"])
    assert (tmp_path / "model.tflite").read_bytes() == b"def"
    assert [p.name for p in (tmp_path / "new").iterdir()] == ["model.tflite"]

    # The checkpoint folder's own leftovers (a killed `latest.json` write is
    # a file, which the prune's rmtree skipped) go at the next save.
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    (checkpoints / ".tmp-old_latest").write_text("{}")
    (checkpoints / ".ckpt-00000001.tmp-x").mkdir()
    model = keras_txl.TransformerXLCausalLM(keras_txl.TransformerXLConfig.from_preset("tiny"))
    CheckpointManager(str(checkpoints)).save(2, model, None, None, {})
    assert sorted(p.name for p in checkpoints.iterdir()) == ["ckpt-00000002", "latest.json"]


def test_a_full_disk_is_reported_and_the_previous_checkpoint_stays(tmp_path, monkeypatch):
    model = keras_txl.TransformerXLCausalLM(keras_txl.TransformerXLConfig.from_preset(
        "tiny", vocabulary_size=50))
    manager = CheckpointManager(str(tmp_path), keep=3)
    manager.save(1, model, None, None, {})

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("keras_txl.training.checkpoint.os.fsync", no_space)
    with pytest.raises(OSError, match="ckpt-00000002 failed .*No space left on device.*"
                       "previous checkpoint is intact"):
        manager.save(2, model, None, None, {})
    monkeypatch.undo()
    assert os.path.basename(manager.latest()) == "ckpt-00000001"
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000001", "latest.json"]


SOURCE_DIRS = ("keras_txl", "training", "export", "benchmarks")


def test_no_pickle_anywhere_in_the_library():
    pattern = re.compile(r"\bimport pickle\b|\bpickle\.load|allow_pickle\s*=\s*True|"
                         r"torch\.load|joblib|dill\b|cloudpickle")
    offenders = []
    for folder in SOURCE_DIRS:
        for path in pathlib.Path(REPO, folder).rglob("*.py"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, offenders


def test_keras_files_load_in_safe_mode_and_tampered_ones_are_refused(tmp_path):
    model = keras_txl.TransformerXLCausalLM(keras_txl.TransformerXLConfig.from_preset(
        "tiny", vocabulary_size=50))
    path = tmp_path / "model.keras"
    model.save(str(path))
    assert isinstance(keras.models.load_model(str(path)), keras_txl.TransformerXLCausalLM)
    # A model file that smuggles code (a Lambda) is refused in safe mode.
    evil = keras.Sequential([keras.Input((2,)), keras.layers.Lambda(lambda x: x * 2)])
    evil_path = tmp_path / "evil.keras"
    evil.save(str(evil_path))
    with pytest.raises(ValueError, match="safe_mode"):
        keras.models.load_model(str(evil_path))


def test_corrupted_model_folder_weights_are_a_clear_error(tmp_path):
    model = keras_txl.TransformerXLCausalLM(keras_txl.TransformerXLConfig.from_preset(
        "tiny", vocabulary_size=50))
    folder = keras_txl.save_pretrained(model, str(tmp_path / "m"))
    weights = pathlib.Path(folder, "model.safetensors")
    data = bytearray(weights.read_bytes())
    data[:8] = (10**12).to_bytes(8, "little")  # header length far past the end
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="truncated or corrupted"):
        keras_txl.load_pretrained(folder)
    pathlib.Path(folder, "config.json").write_text(json.dumps({"vocabulary_size": 5}))
    with pytest.raises(ValueError, match="Missing required config key"):
        keras_txl.load_pretrained(folder)
