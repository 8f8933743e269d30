"""`txl train` / `txl eval` end to end, in separate processes: SIGKILL and
resume, two MultiWorkerMirrored workers on 127.0.0.1, the CLI errors."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from testing import REPO
from testing import free_ports

from keras_txl.cli import main

TEXT = (
    "It was the best of times, it was the worst of times, it was the age of "
    "wisdom, it was the age of foolishness, it was the epoch of belief, it was "
    "the epoch of incredulity, it was the season of Light, it was the season of "
    "Darkness, it was the spring of hope, it was the winter of despair.\n"
)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    words = TEXT.split()
    lines = [" ".join(rng.choice(words, size=12)) for _ in range(900)]
    (folder / "train.txt").write_text("\n".join(lines[:800]) + "\n")
    (folder / "valid.txt").write_text("\n".join(lines[800:850]) + "\n")
    (folder / "test.txt").write_text("\n".join(lines[850:]) + "\n")
    return folder


def train_command(corpus, workdir, *extra):
    return [sys.executable, "-m", "keras_txl", "train", "--data", str(corpus),
            "--workdir", str(workdir), "--preset", "tiny", "--tokenizer", "char",
            "--batch-size", "4", "--segment-length", "16", "--memory-length", "16",
            "--set", "log_every=1", *extra]


def env():
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO),
            "CUDA_VISIBLE_DEVICES": ""}


def losses(workdir):
    """step -> loss of the train records (the last record wins per step)."""
    out = {}
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            if record["split"] == "train":
                out[record["step"]] = record["loss"]
    return out


def test_sigkill_during_training_then_resume_gives_the_same_losses(corpus_dir, tmp_path):
    extra = ["--steps", "160", "--set", "checkpoint_every=20"]
    straight = tmp_path / "straight"
    subprocess.run(train_command(corpus_dir, straight, *extra), env=env(), check=True,
                   capture_output=True, timeout=300)
    killed = tmp_path / "killed"
    process = subprocess.Popen(train_command(corpus_dir, killed, *extra), env=env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = killed / "checkpoints" / "ckpt-00000040" / "state.json"
    deadline = time.time() + 240
    while not marker.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert marker.exists(), "the run ended before its second checkpoint"
    done = max(losses(killed))
    assert done < 160, "the kill came too late to test a resume"
    subprocess.run(train_command(corpus_dir, killed, *extra), env=env(), check=True,
                   capture_output=True, timeout=300)
    reference, resumed = losses(straight), losses(killed)
    assert sorted(resumed) == list(range(1, 161))
    # Every step after the restored checkpoint equals the uninterrupted run.
    restored = max(s for s in range(20, done + 1, 20))
    for step in range(restored + 1, 161):
        assert resumed[step] == pytest.approx(reference[step], rel=1e-6), step


def start_two_workers(corpus, workdir, extra, stdout):
    """Two `txl train --strategy multi_worker` processes of one local cluster."""
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]}
    processes = []
    for index in range(2):
        worker_env = {**env(), "TF_CONFIG": json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}})}
        processes.append(subprocess.Popen(
            train_command(corpus, workdir, *extra, "--strategy", "multi_worker"),
            env=worker_env, stdout=stdout, stderr=subprocess.PIPE))
    return processes


def test_two_workers_with_multi_worker_mirrored_match_one_process(corpus_dir, tmp_path):
    extra = ["--steps", "3", "--set", "dropout=0.0", "--set", "checkpoint_every=0",
             "--set", "warmup_steps=1"]
    single = tmp_path / "single"
    subprocess.run(train_command(corpus_dir, single, *extra), env=env(), check=True,
                   capture_output=True, timeout=300)
    workdir = tmp_path / "multi"
    processes = start_two_workers(corpus_dir, workdir, extra, subprocess.PIPE)
    outputs = [p.communicate(timeout=300) for p in processes]
    for p, (_, err) in zip(processes, outputs):
        assert p.returncode == 0, err.decode()[-3000:]
    # Worker 0 is the chief: it alone wrote the metrics and the model.
    multi = losses(workdir)
    assert sorted(multi) == [1, 2, 3]
    np.testing.assert_allclose([multi[s] for s in (1, 2, 3)],
                               [losses(single)[s] for s in (1, 2, 3)], rtol=1e-5)
    assert (workdir / "model" / "model.weights.h5").exists()


def test_a_multi_worker_task_that_dies_stops_the_others_with_a_clear_error(corpus_dir,
                                                                          tmp_path):
    # TensorFlow's coordination service notices the dead task (heartbeats);
    # the step's UnavailableError was a page-long traceback.
    workdir = tmp_path / "multi"
    chief, other = start_two_workers(corpus_dir, workdir, ["--steps", "100000", "--set",
                                                           "warmup_steps=1"],
                                     subprocess.DEVNULL)
    metrics = workdir / "metrics.jsonl"
    deadline = time.time() + 240

    def steps_logged():  # the records of the chief's first steps, line by line
        return metrics.read_text().count('"split": "train"') if metrics.exists() else 0

    while steps_logged() < 2:
        assert chief.poll() is None and other.poll() is None, chief.stderr.read().decode()
        assert time.time() < deadline, "no training step in 240 s"
        time.sleep(0.1)
    other.send_signal(signal.SIGKILL)
    other.wait()
    try:
        _, err = chief.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        chief.kill()
        raise AssertionError("the chief went on waiting for a dead worker") from None
    err = err.decode()
    assert chief.returncode == 1, err[-3000:]
    assert "txl train: a task of the MultiWorker cluster stopped (worker 1 stopped answering: " in err
    assert ". Start every task again with the same `txl train` command: training resumes " in err
    assert "Traceback" not in err, err[-3000:]


def test_eval_prints_json_with_the_test_time_settings(corpus_dir, tmp_path, capsys):
    workdir = tmp_path / "run"
    assert main(["train", "--data", str(corpus_dir), "--workdir", str(workdir),
                 "--preset", "tiny", "--tokenizer", "char", "--steps", "2",
                 "--batch-size", "4", "--segment-length", "8",
                 "--set", "warmup_steps=1"]) == 0
    capsys.readouterr()
    assert main(["eval", "--workdir", str(workdir), "--data", str(corpus_dir),
                 "--split", "test", "--memory-length", "24", "--clamp-length", "10",
                 "--same-length"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # Every setting the evaluation ran with: the flags, and the segment length of
    # the run's final evaluation (the tiny preset's, recorded in the workdir).
    assert result["settings"] == {"segment_length": 32, "memory_length": 24,
                                  "clamp_length": 10, "same_length": True,
                                  "batch_size": 1, "max_segments": 0, "dtype": "float32"}
    assert result["tokens"] > 0 and result["bpc"] == pytest.approx(result["loss"] / np.log(2))


def test_eval_without_flags_reproduces_the_final_evaluation_of_train(corpus_dir, tmp_path,
                                                                     capsys, caplog):
    # `txl train` ends with the preset's evaluation settings (memory 96, same_length);
    # `txl eval --workdir` used the model's training ones (segment 8, memory 32) and
    # printed another loss for the same model and split, its settings saying only
    # {"batch_size": 1}.
    workdir = tmp_path / "run"
    assert main(["train", "--data", str(corpus_dir), "--workdir", str(workdir),
                 "--preset", "tiny", "--tokenizer", "char", "--steps", "2",
                 "--batch-size", "4", "--segment-length", "8",
                 "--set", "warmup_steps=1"]) == 0
    trained = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    complete = {"segment_length": 32, "memory_length": 96, "clamp_length": -1,
                "same_length": True, "batch_size": 1, "max_segments": 0, "dtype": "float32"}
    assert trained["settings"] == complete
    assert json.loads((workdir / "eval_config.json").read_text()) == {
        k: v for k, v in complete.items() if k not in ("max_segments", "dtype")}
    caplog.set_level("INFO")
    assert main(["eval", "--workdir", str(workdir), "--split", "valid"]) == 0
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert evaluated["settings"] == trained["settings"]
    assert evaluated["tokens"] == trained["tokens"]
    assert evaluated["loss"] == pytest.approx(trained["loss"], rel=1e-5)
    assert "memory_length 96 (eval_config.json: txl train's final evaluation)" in caplog.text
    # Flags still win, and are said to.
    assert main(["eval", "--workdir", str(workdir), "--split", "valid",
                 "--memory-length", "0", "--no-same-length", "--batch-size", "2"]) == 0
    flagged = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert flagged["settings"] == {**complete, "memory_length": 0, "same_length": False,
                                   "batch_size": 2}
    assert flagged["loss"] != pytest.approx(trained["loss"], rel=1e-5)
    assert "memory_length 0 (--memory-length)" in caplog.text
    # A damaged record is named, not evaluated around.
    (workdir / "eval_config.json").write_text('{"memory_length": -5}')
    assert main(["eval", "--workdir", str(workdir), "--split", "valid"]) == 2
    err = capsys.readouterr().err
    assert f'{workdir / "eval_config.json"}: "eval" memory_length must be an integer >= 0' in err


def test_the_json_lines_name_the_precision_the_evaluation_computed_in(corpus_dir, tmp_path,
                                                                       capsys):
    # A mixed-precision run evaluates at the end in bf16; `txl eval` reads its model
    # folder in float32: two numbers, and before, nothing in the lines said why.
    workdir = tmp_path / "bf16"
    assert main(["train", "--data", str(corpus_dir), "--workdir", str(workdir),
                 "--preset", "tiny", "--tokenizer", "char", "--steps", "2",
                 "--batch-size", "4", "--segment-length", "8", "--precision", "mixed_bfloat16",
                 "--set", "warmup_steps=1"]) == 0
    trained = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert trained["settings"]["dtype"] == "mixed_bfloat16"
    assert main(["eval", "--workdir", str(workdir), "--split", "valid"]) == 0
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert evaluated["settings"] == {**trained["settings"], "dtype": "float32"}


def test_the_fit_loop_keeps_stdout_for_the_result(corpus_dir, tmp_path, capsys):
    # Keras prints its progress to stdout; `txl train` prints one JSON result there.
    assert main(["train", "--data", str(corpus_dir), "--workdir", str(tmp_path / "fit"),
                 "--preset", "tiny", "--tokenizer", "char", "--steps", "2", "--loop", "fit",
                 "--batch-size", "4", "--segment-length", "8",
                 "--set", "warmup_steps=1"]) == 0
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    assert json.loads(lines[0])["split"] == "valid"
    assert "loss:" in err  # Keras' epoch line, on stderr


@pytest.mark.parametrize("args, message", [
    (["--data", "{missing}"], "does not exist|not found|No such|no corpus"),
    (["--set", "hidden_size=3"], "Unknown key 'hidden_size'"),
    (["--set", "num_layers=two"], "expected an integer"),
    (["--batch-size", "3", "--strategy", "mirrored"], "not divisible by the 2 replicas"),
    (["--segment-length", "100000"], "needs at least 100001 per stream"),
    (["--set", "vocabulary_size=7"], "vocabulary"),
])
def test_cli_errors_are_clear(corpus_dir, tmp_path, capsys, args, message):
    argv = ["train", "--data", str(corpus_dir), "--workdir", str(tmp_path / "w"),
            "--preset", "tiny", "--tokenizer", "char", "--steps", "1",
            "--set", "warmup_steps=0"]
    argv += [a.replace("{missing}", str(tmp_path / "nope")) for a in args]
    assert main(argv) == 2
    assert __import__("re").search(message, capsys.readouterr().err), message
