"""Fault injection: `txl train` under random SIGKILLs, with the newest
checkpoint truncated or byte-flipped between runs. Every run must end with
the weights of an uninterrupted run, or stop with an error naming the
damaged file; never with silently different weights."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from testing import REPO
from testing import write_word_corpus

from keras_txl.cli import main

STEPS = 36
TRIALS = 4  # killed runs, each followed by a fault; then one run to the end


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return write_word_corpus(tmp_path_factory.mktemp("corpus"), eval_words=30)



def model_tensors(folder):
    """{weight path: value} of the model preset in `folder`."""
    import keras_txl

    model = keras_txl.load_pretrained(str(folder))
    return {w.path: w.numpy() for w in model.model_weights()}

def command(corpus, workdir):
    return [sys.executable, "-m", "keras_txl", "train", "--data", str(corpus),
            "--workdir", str(workdir), "--preset", "tiny", "--tokenizer", "char",
            "--batch-size", "2", "--segment-length", "8", "--memory-length", "8",
            "--steps", str(STEPS), "--set", "log_every=1",
            "--set", "checkpoint_every=3"]


def env():
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)}


def train_rows(workdir):
    path = os.path.join(workdir, "metrics.jsonl")
    rows = []
    if os.path.exists(path):
        for line in open(path):
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut by the kill
            if record.get("split") == "train":
                rows.append(record["step"])
    return rows


def newest_checkpoint(workdir):
    folder = os.path.join(workdir, "checkpoints")
    names = sorted(n for n in os.listdir(folder) if n.startswith("ckpt-")) if \
        os.path.isdir(folder) else []
    return os.path.join(folder, names[-1]) if names else None


def test_random_kills_truncations_and_byte_flips_never_change_the_result(
        corpus_dir, tmp_path):
    straight = tmp_path / "straight"
    assert main(command(corpus_dir, straight)[3:]) == 0  # in-process: one start less
    reference = model_tensors(straight / "model")

    workdir = tmp_path / "faulted"
    rng = np.random.default_rng(2024)  # fixed: the same fault times every run
    events = []
    for trial in range(TRIALS + 1):
        last = max(train_rows(workdir), default=0)
        process = subprocess.Popen(command(corpus_dir, workdir), env=env(),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if trial < TRIALS:  # the last run goes to the end
            target = last + int(rng.integers(1, 10))
            deadline = time.time() + 120
            while (max(train_rows(workdir), default=0) < target
                   and process.poll() is None and time.time() < deadline):
                time.sleep(0.01)
            process.send_signal(signal.SIGKILL)
        _, err = process.communicate(timeout=300)
        err = err.decode()
        if process.returncode == 2:
            # Refused: the error must name a damaged file of the workdir; the
            # user deletes that checkpoint and trains again.
            assert "Checkpoint file" in err and str(workdir) in err, err[-2000:]
            damaged = err.split("Checkpoint file ", 1)[1].split()[0]
            events.append(("refused", damaged))
            shutil.rmtree(os.path.dirname(damaged))
            continue
        assert process.returncode in (0, -signal.SIGKILL), err[-3000:]
        newest = newest_checkpoint(workdir)
        fault = str(rng.choice(["truncate", "flip"])) if trial < TRIALS else "none"
        if newest is not None and fault != "none":
            target_file = os.path.join(newest, "state.safetensors")
            size = os.path.getsize(target_file)
            if fault == "truncate":
                os.truncate(target_file, int(size * rng.uniform(0.1, 0.95)))
            else:
                data = bytearray(open(target_file, "rb").read())
                data[int(rng.integers(0, size))] ^= 0x5A
                open(target_file, "wb").write(bytes(data))
        events.append((trial, process.returncode, max(train_rows(workdir), default=0),
                       fault, os.path.basename(newest or "-")))

    print(f"\n[fault injection] (trial, exit code, last logged step, fault, "
          f"checkpoint hit): {events}")
    assert process.returncode == 0, (events, err[-3000:])
    kills = [e for e in events if len(e) == 5 and e[1] == -signal.SIGKILL]
    faults = {e[3] for e in events if len(e) == 5 and e[4] != "-"}
    assert kills and {"truncate", "flip"} <= faults, events  # the seed hit both
    final = model_tensors(workdir / "model")
    assert sorted(final) == sorted(reference)
    for name, value in reference.items():
        np.testing.assert_allclose(final[name], value, rtol=1e-5, atol=1e-6,
                                   err_msg=f"{name} after {events}")
    # Each step is in metrics.jsonl once, however often it was replayed.
    assert train_rows(workdir) == list(range(1, STEPS + 1)), events
