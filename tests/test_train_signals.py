"""`txl train` stopped by SIGINT (Ctrl-C) and SIGTERM mid-run, then
`txl eval`, `generate` and `export` on its workdir, and a resume."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from testing import REPO
from testing import write_word_corpus

from keras_txl.cli import main


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return write_word_corpus(tmp_path_factory.mktemp("corpus"), eval_words=40)


def command(corpus, workdir):
    return [sys.executable, "-m", "keras_txl", "train", "--data", str(corpus),
            "--workdir", str(workdir), "--preset", "tiny", "--tokenizer", "char",
            "--batch-size", "2", "--segment-length", "8", "--memory-length", "8",
            "--steps", "100000", "--set", "log_every=1",
            "--set", "checkpoint_every=0"]


def logged_steps(workdir):
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    steps = []
    for line in open(path):
        try:
            steps.append(json.loads(line)["step"])
        except ValueError:
            pass  # a line being written
    return steps


def run_until(corpus, workdir, after_step, signum):
    """Starts `txl train`, sends `signum` once step `after_step` is logged;
    returns (exit code, stderr, last logged step)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(command(corpus, workdir), env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while (max(logged_steps(workdir), default=0) < after_step
           and process.poll() is None and time.time() < deadline):
        time.sleep(0.05)
    process.send_signal(signum)
    _, err = process.communicate(timeout=120)
    return process.returncode, err.decode(), max(logged_steps(workdir))


def test_sigint_and_sigterm_stop_with_a_checkpoint_then_eval_generate_export(
        corpus_dir, tmp_path, capsys):
    workdir = tmp_path / "run"
    code, err, step = run_until(corpus_dir, workdir, 3, signal.SIGINT)
    assert code == 130, err[-3000:]
    assert "KeyboardInterrupt" not in err and "Traceback" not in err
    assert f"Stopped on SIGINT after step {step} of 100000" in err
    assert "Resume with the same `txl train` command" in err
    first = workdir / "checkpoints" / f"ckpt-{step:08d}"
    assert (first / "manifest.json").exists()
    assert (workdir / "model" / "model.weights.h5").exists()

    # The stopped run's model serves every command.
    capsys.readouterr()
    assert main(["eval", "--workdir", str(workdir), "--max-segments", "2"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tokens"] > 0
    assert main(["generate", "--workdir", str(workdir), "--prompt", "it was",
                 "--max-new-tokens", "4", "--seed", "0"]) == 0
    assert capsys.readouterr().out.startswith("it was")
    exported = tmp_path / "exported"
    assert main(["export", "--workdir", str(workdir), "--out", str(exported),
                 "--no-warmup"]) == 0
    assert (exported / "txl" / "1" / "saved_model.pb").exists()

    # The same command resumes; SIGTERM stops it the same way.
    code, err, step2 = run_until(corpus_dir, workdir, step + 3, signal.SIGTERM)
    assert code == 143, err[-3000:]
    assert f"Resumed from {first} at step {step}." in err
    assert f"Stopped on SIGTERM after step {step2} of 100000" in err
    assert sorted(logged_steps(workdir)) == list(range(1, step2 + 1))

    # Without a model folder the newest checkpoint is used; --checkpoint
    # picks another one (by step).
    shutil.rmtree(workdir / "model")
    capsys.readouterr()
    assert main(["eval", "--workdir", str(workdir), "--max-segments", "2"]) == 0
    newest = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(["eval", "--workdir", str(workdir), "--max-segments", "2",
                 "--checkpoint", str(step)]) == 0
    older = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert newest["loss"] != older["loss"]
    assert main(["generate", "--workdir", str(workdir), "--checkpoint", str(step),
                 "--prompt", "it", "--max-new-tokens", "2"]) == 0
    assert main(["eval", "--workdir", str(workdir), "--checkpoint", "999999"]) == 2
    assert "--checkpoint '999999': no such checkpoint" in capsys.readouterr().err


def test_sigint_stops_the_fit_loop_after_a_step_with_a_checkpoint(corpus_dir, tmp_path):
    """`--loop fit` stops the same way: after the current step, a checkpoint and
    the model folder, exit 130, no traceback."""
    workdir = tmp_path / "fit"
    argv = [a if a != "checkpoint_every=0" else "checkpoint_every=2"
            for a in command(corpus_dir, workdir)] + ["--loop", "fit"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    checkpoints = workdir / "checkpoints"
    deadline = time.time() + 240
    while (not list(checkpoints.glob("ckpt-*/manifest.json")) and process.poll() is None
           and time.time() < deadline):
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    err = err.decode()
    assert process.returncode == 130, err[-3000:]
    assert "KeyboardInterrupt" not in err and "Traceback" not in err
    step = int(err.split("Stopped on SIGINT after step ")[1].split()[0])
    assert step >= 2
    assert (checkpoints / f"ckpt-{step:08d}" / "manifest.json").exists()
    assert (workdir / "model" / "model.weights.h5").exists()


BLOCKED_STEP = """
import sys
import tensorflow as tf
from keras_txl.training.loop import StopOnSignals
queue = tf.queue.FIFOQueue(1, tf.float32)
with StopOnSignals():
    print("blocked", flush=True)
    queue.dequeue()  # blocks in C++ forever, like a collective with a lost peer
print("not reached", flush=True)
"""


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_second_signal_exits_while_a_step_is_blocked_in_tensorflow(signum, code):
    """Python runs its handlers only between bytecodes of the main thread: the
    first signal waits for the blocked op, the second exits at once."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, "-c", BLOCKED_STEP], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert process.stdout.readline() == b"blocked\n"
        time.sleep(0.5)
        process.send_signal(signum)
        time.sleep(1.5)
        assert process.poll() is None  # the first one only asks to stop after the step
        process.send_signal(signum)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == code
    assert b"not reached" not in out
    name = signal.Signals(signum).name
    assert f"{name} again: exiting now, without waiting for the current step".encode() in err


def test_stop_on_signals_gives_the_wakeup_fd_back():
    from keras_txl.training.loop import StopOnSignals

    before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before)
    handler = signal.getsignal(signal.SIGINT)
    with StopOnSignals():
        assert signal.getsignal(signal.SIGINT) is not handler
        inside = signal.set_wakeup_fd(-1)
        signal.set_wakeup_fd(inside)
        assert inside >= 0 and inside != before
    assert signal.getsignal(signal.SIGINT) is handler
    after = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(after)
    assert after == before
