"""The training run's reliability, in-process: checksummed checkpoints and
the fallback to the newest intact one, overflowing metrics, the non-finite
guard's last good state, resume checks, the data cache key, the workdir
lock, short runs of a preset, the progress display."""

import io
import json
import logging
import math
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from testing import REPO

import keras_txl
from keras_txl.cli import main
from keras_txl.training.checkpoint import CheckpointError
from keras_txl.training.checkpoint import CheckpointManager
from keras_txl.training.config import TrainConfig
from keras_txl.training.loop import Trainer
from keras_txl.training.loop import perplexity
from keras_txl.training.progress import TrainingProgress
from keras_txl.training.run import WorkdirLock
from keras_txl.training.run import prepare_data
from keras_txl.training.run import resolve_configs

V = 40


def model_config(**changes):
    base = dict(vocabulary_size=V, num_layers=2, hidden_dim=16, num_heads=2,
                intermediate_dim=32, segment_length=8, memory_length=8, dropout=0.1)
    return keras_txl.TransformerXLConfig(**{**base, **changes})


def train_config(**changes):
    base = dict(batch_size=4, steps=6, learning_rate=3e-3, warmup_steps=2,
                log_every=1, checkpoint_every=2, clip_norm=0.25)
    return TrainConfig(**{**base, **changes})


def corpus(n=3000):
    return np.random.default_rng(0).integers(0, V, n).astype("int32")


def trainer(workdir, **changes):
    return Trainer(model_config(), train_config(**changes), tf.distribute.get_strategy(),
                   workdir=str(workdir), verbose=False)


def weights(model):
    return {w.path: w.numpy().copy() for w in model.model_weights()}


def reseal(path):
    """A checkpoint's manifest rewritten for its files as they are now (a
    test that edits a checkpoint on purpose)."""
    import hashlib

    manifest_path = os.path.join(path, "manifest.json")
    manifest = json.load(open(manifest_path))
    for name in manifest["files"]:
        data = open(os.path.join(path, name), "rb").read()
        manifest["files"][name] = {"bytes": len(data),
                                   "sha256": hashlib.sha256(data).hexdigest()}
    json.dump(manifest, open(manifest_path, "w"))


def flip_byte(path, offset_from_end=100):
    data = bytearray(open(path, "rb").read())
    data[-offset_from_end] ^= 0xFF
    open(path, "wb").write(bytes(data))


# --- checkpoints: checksums, fallback, files named ------------------------
def test_damaged_checkpoints_are_named_and_the_newest_intact_one_is_used(tmp_path, caplog):
    run = trainer(tmp_path)
    run.train(corpus())  # checkpoints 2, 4, 6
    manager = run.checkpoints
    names = [os.path.basename(p) for p in manager.checkpoints()]
    assert names == ["ckpt-00000002", "ckpt-00000004", "ckpt-00000006"]
    ckpt6, ckpt4, ckpt2 = manager.checkpoints()[::-1]
    manifest = json.load(open(os.path.join(ckpt6, "manifest.json")))
    assert set(manifest["files"]) == {"state.safetensors", "state.json"}
    assert len(manifest["files"]["state.safetensors"]["sha256"]) == 64

    # A flipped byte in the tensor data: refused, naming the file.
    flip_byte(os.path.join(ckpt6, "state.safetensors"))
    with pytest.raises(CheckpointError, match=r"ckpt-00000006/state.safetensors is "
                       r"corrupted: its sha256 does not match"):
        CheckpointManager.read(ckpt6)
    # A truncated file: refused too.
    tensors4 = os.path.join(ckpt4, "state.safetensors")
    os.truncate(tensors4, os.path.getsize(tensors4) // 2)
    with pytest.raises(CheckpointError, match=r"ckpt-00000004/state.safetensors is "
                       r"truncated or damaged: \d+ bytes, the manifest says \d+"):
        CheckpointManager.read(ckpt4)

    # Resuming falls back to the newest intact one, with a warning naming both.
    resumed = trainer(tmp_path)
    with caplog.at_level(logging.WARNING):
        assert resumed.restore() == 2
    assert "ckpt-00000006/state.safetensors" in caplog.text
    assert "Falling back to" in caplog.text and "ckpt-00000002" in caplog.text

    # Every checkpoint damaged: the error names the newest one's file.
    open(os.path.join(ckpt2, "state.json"), "w").write("{not json")
    with pytest.raises(CheckpointError, match="ckpt-00000006/state.safetensors"):
        trainer(tmp_path).restore()


def test_a_damaged_model_folder_falls_back_to_the_newest_intact_checkpoint(tmp_path, caplog):
    import shutil

    from keras_txl.training.checkpoint import materialize_model_folder
    from keras_txl.training.checkpoint import workdir_model_source

    run = trainer(tmp_path, steps=2)
    run.train(corpus())  # checkpoint 2 and the model folder, the same weights
    trained = weights(run.model)
    model_dir = str(tmp_path / "model")
    assert workdir_model_source(str(tmp_path)) == ("model", model_dir)
    data = bytearray(open(os.path.join(model_dir, "model.weights.h5"), "rb").read())
    data[len(data) // 2] ^= 0x01  # same size: only the manifest's sha256 tells
    open(os.path.join(model_dir, "model.weights.h5"), "wb").write(bytes(data))
    with caplog.at_level(logging.WARNING):
        kind, path = workdir_model_source(str(tmp_path))
    assert (kind, os.path.basename(path)) == ("checkpoint", "ckpt-00000002")
    assert "model.weights.h5 does not match the sha256" in caplog.text
    assert "using the newest intact checkpoint" in caplog.text
    folder = materialize_model_folder(str(tmp_path), out=str(tmp_path / "out"))
    loaded = keras_txl.load_pretrained(folder)
    for name, value in weights(loaded).items():
        np.testing.assert_array_equal(value, trained[name])
    # Without a checkpoint to fall back to, the damage is the error.
    shutil.rmtree(tmp_path / "checkpoints")
    with pytest.raises(ValueError, match="model.weights.h5 does not match the sha256"):
        workdir_model_source(str(tmp_path))


def test_a_model_weights_file_that_is_no_regular_file_is_named(tmp_path, caplog):
    # workdir_model_source tested os.path.isfile: a FIFO (or a link to
    # /dev/zero) as WORKDIR/model/model.weights.h5 read as "No model in
    # .../model/ ... train first", or the checkpoint was used in silence.
    import shutil

    from keras_txl.training.checkpoint import workdir_model_source

    run = trainer(tmp_path, steps=2)
    run.train(corpus())
    path = tmp_path / "model" / "model.weights.h5"
    path.unlink()
    os.mkfifo(path)
    with caplog.at_level(logging.WARNING):
        kind, found = workdir_model_source(str(tmp_path))
    assert (kind, os.path.basename(found)) == ("checkpoint", "ckpt-00000002")
    assert "model.weights.h5' is a FIFO" in caplog.text
    shutil.rmtree(tmp_path / "checkpoints")
    with pytest.raises(ValueError, match=r"The weights file '.*/model/model.weights.h5' is a FIFO"):
        workdir_model_source(str(tmp_path))
    path.unlink()
    path.symlink_to("/dev/zero")
    with pytest.raises(ValueError, match=r"model.weights.h5' is a character device"):
        workdir_model_source(str(tmp_path))


@pytest.mark.parametrize("name", ["manifest.json", "state.json", "state.safetensors"])
def test_a_checkpoint_file_that_is_a_fifo_is_named_not_read_forever(tmp_path, name):
    # CheckpointManager opened manifest.json and state.json with open():
    # a FIFO there blocked a resume (or txl eval --workdir) forever.
    import signal

    from keras_txl.training.checkpoint import CheckpointError
    from keras_txl.training.checkpoint import CheckpointManager

    run = trainer(tmp_path, steps=2)
    run.train(corpus())
    path = run.checkpoints.latest()
    os.remove(os.path.join(path, name))
    os.mkfifo(os.path.join(path, name))

    def hung(*args):
        raise TimeoutError(f"reading the checkpoint blocked on the FIFO {name}")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        with pytest.raises(CheckpointError, match=rf"{name}' is a FIFO \(named pipe\)"):
            CheckpointManager.read(path)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_an_invalid_state_json_names_its_file(tmp_path):
    run = trainer(tmp_path, steps=2)
    run.train(corpus())
    path = run.checkpoints.latest()
    os.remove(os.path.join(path, "manifest.json"))
    # Written with a manifest (its tensors file says so): deleting the
    # manifest does not turn verification off.
    with pytest.raises(CheckpointError, match=r"ckpt-00000002 has no manifest.json, "
                       "which it was written with"):
        CheckpointManager.read(path)
    # An older, unverifiable one (no such mark) loads with a warning; its
    # state.json is still read with care.
    from safetensors.numpy import save_file

    tensors_path = os.path.join(path, "state.safetensors")
    from keras_txl.weights_file import read_safetensors

    save_file(read_safetensors(tensors_path), tensors_path)
    open(os.path.join(path, "state.json"), "w").write("{\"step\": ")
    with pytest.raises(CheckpointError, match=r"ckpt-00000002/state.json is not "
                       r"valid JSON"):
        CheckpointManager.read(path)


def test_nan_weights_are_never_checkpointed_nor_loaded_as_good(tmp_path):
    run = trainer(tmp_path, steps=2)
    run.train(corpus())
    kernel = run.model.backbone.blocks[0].output_dense.kernel
    kernel.assign(np.full(kernel.shape, np.nan, "float32"))
    with pytest.raises(FloatingPointError, match="Not writing checkpoint 3: the "
                       "weights, the optimizer's state or the memory hold NaN/Inf"):
        run.checkpoints.save(3, run.model, run.optimizer, None, {})
    kernel.assign(np.zeros(kernel.shape, "float32"))
    memory = np.full(run.model.memory_shape(2), np.inf, "float32")
    with pytest.raises(FloatingPointError, match=r"hold NaN/Inf \(\['memory'\]"):
        run.checkpoints.save(3, run.model, run.optimizer, memory, {})
    # A poisoned checkpoint written by an older version (no manifest check
    # could catch it): refused as "not a good checkpoint".
    from safetensors.numpy import save_file

    path = run.checkpoints.latest()
    tensors, _ = CheckpointManager.read(path)
    name = next(n for n in tensors if n.startswith("model/"))
    tensors[name] = np.full_like(tensors[name], np.nan)
    save_file(tensors, os.path.join(path, "state.safetensors"))
    os.remove(os.path.join(path, "manifest.json"))
    with pytest.raises(CheckpointError, match="holds NaN/Inf values.*not a good "
                       "checkpoint"):
        CheckpointManager.read(path)
    # A poisoned memory is refused too (a resume would diverge at once and
    # blame the learning rate), and so are weights of an integer dtype.
    tensors[name] = np.zeros_like(tensors[name])
    tensors["memory"] = np.full((1, 2, 3), np.nan, "float32")
    save_file(tensors, os.path.join(path, "state.safetensors"))
    with pytest.raises(CheckpointError, match=r"NaN/Inf values \(\['memory'\]"):
        CheckpointManager.read(path)
    del tensors["memory"]
    tensors[name] = tensors[name].astype("int32")
    save_file(tensors, os.path.join(path, "state.safetensors"))
    with pytest.raises(CheckpointError, match=f"{name} \\(int32\\): weights and memory "
                       "must be one of float16"):
        CheckpointManager.read(path)


def test_a_manifest_of_the_wrong_shape_is_a_checkpoint_error(tmp_path):
    # A CheckpointError (not an AttributeError) is what lets a resume fall
    # back to the previous checkpoint.
    run = trainer(tmp_path, steps=2)
    run.train(corpus())
    path = run.checkpoints.latest()
    manifest = os.path.join(path, "manifest.json")
    for files in (["state.safetensors"], {"state.safetensors": "abc", "state.json": 1}):
        with open(manifest, "w") as f:
            json.dump({"format": "keras-txl-ckpt/2", "step": 2, "files": files}, f)
        with pytest.raises(CheckpointError, match="manifest.json is not valid"):
            CheckpointManager.verify(path)


# --- the non-finite guard -------------------------------------------------
def test_overflowing_perplexity_is_inf_not_an_error():
    assert perplexity(88.0) == pytest.approx(math.exp(88.0))
    assert perplexity(4.6e7) == math.inf and perplexity(100.0) == math.inf
    assert math.isnan(perplexity(float("nan")))


def test_a_huge_learning_rate_logs_inf_perplexity_and_stops_with_its_last_good_state(
        tmp_path):
    run = trainer(tmp_path, learning_rate=1e3, warmup_steps=0, steps=40,
                  checkpoint_every=0)
    try:
        run.train(corpus())
        stopped = None
    except FloatingPointError as e:
        stopped = str(e)
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    huge = [r for r in rows if r["loss"] > 88.8]
    assert huge, "the loss never exceeded exp's float32 range: the test lost its point"
    assert all(r["ppl"] == math.inf for r in huge)
    if stopped is not None:  # diverged to NaN: a checkpoint of the last good step
        assert "The last good checkpoint is" in stopped, stopped
        tensors, state = CheckpointManager.read(run.checkpoints.latest())
        assert state["step"] == run.step


def test_the_guard_writes_the_state_before_the_bad_step(tmp_path):
    run = trainer(tmp_path, steps=8, checkpoint_every=0)
    run.train(corpus(), steps=3)
    before = weights(run.model)
    before_iterations = int(run.optimizer.iterations.numpy())
    real_step = run._train_step
    run._train_step = lambda x, y, memory: real_step(x, y, memory * np.nan)
    with pytest.raises(FloatingPointError, match=r"at step 4; stopping. The last good "
                       r"checkpoint is .*ckpt-00000003 \(step 3\)"):
        run.train(corpus())
    tensors, state = CheckpointManager.read(run.checkpoints.latest())
    assert state["step"] == 3
    for name, value in before.items():
        np.testing.assert_allclose(tensors[f"model/{name}"], value, rtol=1e-5,
                                   atol=1e-7, err_msg=name)
    assert int(run.optimizer.iterations.numpy()) == before_iterations


# --- resuming -------------------------------------------------------------
def test_resume_with_another_batch_size_is_refused(tmp_path):
    trainer(tmp_path, steps=2).train(corpus())
    with pytest.raises(ValueError, match="written with batch_size=4; resuming with "
                       "batch_size=2 would restart the memory.*--batch-size 4"):
        Trainer(model_config(), train_config(batch_size=2), tf.distribute.get_strategy(),
                workdir=str(tmp_path), verbose=False).restore()


def test_a_resume_logs_each_step_once_and_says_what_longer_steps_do(tmp_path, caplog):
    run = trainer(tmp_path, steps=6, checkpoint_every=4)
    run.train(corpus())  # checkpoints 4 and 6, metrics rows 1..6
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]
    with caplog.at_level(logging.WARNING):
        again = Trainer(model_config(), train_config(steps=8, checkpoint_every=4),
                        tf.distribute.get_strategy(), workdir=str(tmp_path), verbose=False)
        assert again.restore() == 6
    assert "schedule of 6 steps; this run has steps=8" in caplog.text
    assert "Pass --steps 6 to keep the original schedule" in caplog.text
    again.train(corpus())
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows if r["split"] == "train"] == list(range(1, 9))


def test_rows_logged_after_the_restored_checkpoint_are_dropped(tmp_path):
    run = trainer(tmp_path, steps=6, checkpoint_every=4)
    run.train(corpus(), steps=5)  # checkpoints 4 and 5, rows 1..5
    import shutil

    shutil.rmtree(os.path.join(run.checkpoints.directory, "ckpt-00000005"))  # killed
    again = trainer(tmp_path, steps=6, checkpoint_every=4)
    assert again.restore() == 4
    again.train(corpus())
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]


# --- the data cache, the workdir ------------------------------------------
def write_corpus(folder, seed):
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    for split, n in (("train", 400), ("valid", 60), ("test", 60)):
        words = ["".join(rng.choice(list("abcdefg"), size=4)) for _ in range(n)]
        open(os.path.join(folder, f"{split}.txt"), "w").write(" ".join(words) + "\n")
    return str(folder)


def test_a_changed_corpus_or_tokenizer_is_refused(tmp_path):
    first = write_corpus(tmp_path / "a", 0)
    other = write_corpus(tmp_path / "b", 1)
    workdir = str(tmp_path / "w")
    os.makedirs(workdir)
    tokenizer, splits = prepare_data(first, workdir, "char")
    # The same corpus (even a moved copy) reuses the cache; no --data too.
    import shutil

    shutil.copytree(first, tmp_path / "copy")
    _, again = prepare_data(str(tmp_path / "copy"), workdir, "char")
    np.testing.assert_array_equal(again["train"], splits["train"])
    _, cached = prepare_data(None, workdir, "char")
    np.testing.assert_array_equal(cached["valid"], splits["valid"])
    with pytest.raises(ValueError, match=r"was prepared from .*/a'; --data .*/b' has "
                       "different content.*new --workdir"):
        prepare_data(other, workdir, "char")
    with pytest.raises(ValueError, match=r"--data .*nope.*does not exist"):
        prepare_data(str(tmp_path / "nope"), workdir, "char")
    with open(os.path.join(workdir, "tokenizer", "tokenizer.json"), "a") as f:
        f.write(" ")
    with pytest.raises(ValueError, match="tokenizer changed since .*data was encoded"):
        prepare_data(first, workdir, "char")


@pytest.mark.parametrize("recorded", [True, False])
def test_eval_refuses_workdir_tokens_of_another_tokenizer_than_the_models(
        tmp_path, capsys, monkeypatch, recorded):
    # After `rm -r W/data W/tokenizer` and `txl prepare` from another corpus
    # (what the "different content" error suggests), `txl eval --workdir W`
    # scored the old model on ids of the new tokenizer: a perplexity, exit 0.
    import shutil

    from keras_txl.training import loop

    if not recorded:  # a checkpoint of an earlier version: no tokenizer sha256
        monkeypatch.setattr(loop, "tokenizer_record", lambda tokenizer: {})
    workdir = str(tmp_path / "w")
    assert main(["train", "--data", write_corpus(tmp_path / "a", 0), "--workdir", workdir,
                 "--preset", "tiny", "--tokenizer", "char", "--batch-size", "2",
                 "--segment-length", "8", "--memory-length", "8", "--steps", "2",
                 "--set", "eval_every=0", "--set", "eval_max_segments=1"]) == 0
    evaluate = ["eval", "--workdir", workdir, "--split", "valid", "--batch-size", "1",
                "--max-segments", "2"]
    for extra in ([], ["--checkpoint", "2"]):  # the model folder, a checkpoint
        capsys.readouterr()
        assert main(evaluate + extra) == 0
        assert json.loads(capsys.readouterr().out)["tokens"] > 0
    shutil.rmtree(os.path.join(workdir, "data"))
    shutil.rmtree(os.path.join(workdir, "tokenizer"))
    other = tmp_path / "b"
    other.mkdir()
    for split in ("train", "valid", "test"):  # other characters: another vocabulary
        (other / f"{split}.txt").write_text("xyz uvw " * 40 + "\n")
    assert main(["prepare", "--data", str(other), "--workdir", workdir,
                 "--tokenizer", "char"]) == 0
    capsys.readouterr()
    assert main(evaluate) == 2
    assert re.search(r"data was encoded with a char tokenizer of \d+ tokens .*not with the "
                     r"model's own .*Pass --data", capsys.readouterr().err)
    message = ("was trained with another tokenizer than" if recorded
               else "was trained on other tokens than")
    for extra in (["--checkpoint", "2"], ["--checkpoint", "2", "--data", str(other)]):
        # A checkpoint holds no tokenizer: the workdir's new one is not its own,
        # with or without --data (which was encoded with the new tokenizer).
        assert main(evaluate + extra) == 2
        assert message in capsys.readouterr().err
    assert main(["generate", "--workdir", workdir, "--checkpoint", "2", "--prompt", "xy",
                 "--max-new-tokens", "2"]) == 2
    assert message in capsys.readouterr().err
    # The prepared data's own tokenizer replaced since: nothing says what made it.
    shutil.rmtree(os.path.join(workdir, "tokenizer"))
    assert main(evaluate) == 2
    assert "is missing or changed since" in capsys.readouterr().err


LOCK_HOLDER = """
import sys, time
from keras_txl.training.run import WorkdirLock
with WorkdirLock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(60)
"""


def test_a_second_train_on_a_busy_workdir_is_refused(tmp_path, capsys):
    data = write_corpus(tmp_path / "data", 0)
    workdir = tmp_path / "w"
    workdir.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(workdir)],
                              env=env, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"locked"
        argv = ["train", "--data", data, "--workdir", str(workdir), "--preset", "tiny",
                "--tokenizer", "char", "--steps", "1", "--batch-size", "2",
                "--segment-length", "8", "--memory-length", "8"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"is in use by another `txl train` (pid {holder.pid}" in err
        assert not (workdir / "metrics.jsonl").exists()
    finally:
        holder.kill()
        holder.wait()
    # The lock dies with its process: no stale lock.
    with WorkdirLock(str(workdir)):
        pass


def test_an_unwritable_workdir_is_a_clear_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    argv = ["train", "--data", str(tmp_path), "--workdir", str(blocker / "w"),
            "--preset", "tiny", "--steps", "1"]
    assert main(argv) == 2
    assert "is not writable" in capsys.readouterr().err


def test_a_short_run_of_a_preset_scales_its_warmup_or_names_the_flag():
    _, cfg, _, _ = resolve_configs("tiny", flags={"steps": 10})
    assert (cfg.steps, cfg.warmup_steps) == (10, 1)
    with pytest.raises(ValueError, match=r"`warmup_steps`=20 exceeds `steps`=10: pass "
                       r"--set warmup_steps=N with N <= 10"):
        resolve_configs("tiny", overrides=["warmup_steps=20"], flags={"steps": 10})


def test_train_help_lists_the_presets_with_size_and_time():
    out = subprocess.run([sys.executable, "-m", "keras_txl", "train", "--help"],
                         capture_output=True, text=True, env={
                             **os.environ, "PYTHONPATH": str(REPO)}, check=True).stdout
    assert "tiny" in out and "char_small" in out and "wt103_large" in out
    assert "ms/step" in out and "5.19M" in out


# --- the progress display -------------------------------------------------
def test_progress_prints_log_lines_above_one_bar_with_the_current_loss():
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120, color_system=None)
    log = logging.getLogger("keras_txl.training.loop")
    with TrainingProgress(10, console=console) as progress:
        progress.update(3, 2.3456, 1e-3, 256)
        log.warning("step 3 | loss 2.3456")
        time.sleep(0.2)
        progress.update(4, 1.2345, 5e-4, 256)
    text = buffer.getvalue()
    assert "loss 1.2345 | lr 5.00e-04" in text and "tok/s" in text
    # The log line is printed on its own line, not glued onto the bar.
    assert any(line.rstrip().endswith("step 3 | loss 2.3456") for line in
               text.replace("\r", "\n").splitlines())
    # Without a terminal: no bar at all.
    plain = io.StringIO()
    with TrainingProgress(10, console=Console(file=plain)) as progress:
        progress.update(3, 2.0, 1e-3, 256)
    assert plain.getvalue() == ""


def test_a_checkpoints_model_config_is_checked_like_a_model_folders(tmp_path):
    from keras_txl.training.checkpoint import model_from_checkpoint

    run = trainer(tmp_path, steps=2)
    run.train(corpus())
    path = run.checkpoints.latest()
    state_path = os.path.join(path, "state.json")
    state = json.load(open(state_path))
    good = dict(state["model_config"])
    for change, message in (({"memory_length": 5_000_000}, "exceeds the limit"),
                            ({"vocabulary_size": good["vocabulary_size"] + 1},
                             "has shape .* but the model_config in .*state.json needs")):
        state["model_config"] = {**good, **change}
        with open(state_path, "w") as f:
            json.dump(state, f)
        reseal(path)  # edited by hand: the manifest follows
        with pytest.raises(CheckpointError, match=message):
            model_from_checkpoint(path)


@pytest.mark.parametrize("when", ["periodic", "final"])
def test_a_signal_during_an_evaluation_stops_it_after_the_segment(tmp_path, monkeypatch, when):
    # SIGINT/SIGTERM were only read after training steps: an evaluation over
    # a large validation split ran to its end (and the final one then exited 0).
    import signal

    from keras_txl.training import loop
    from keras_txl.training.loop import EvaluationStopped
    from keras_txl.training.loop import TrainingInterrupted

    real, segments = loop.evaluate, []

    def evaluate_with_a_signal(model, tokens, stop=None, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, as eval starts

        def counted_stop():
            segments.append(1)
            return stop()
        return real(model, tokens, stop=counted_stop, **kwargs)

    monkeypatch.setattr(loop, "evaluate", evaluate_with_a_signal)
    run = trainer(tmp_path, steps=4, eval_every=2 if when == "periodic" else 0)
    with pytest.raises(TrainingInterrupted, match="Stopped on SIGINT after step "
                       f"{2 if when == 'periodic' else 4} of 4"):
        run.train(corpus(), valid_tokens=corpus(4000))
    assert len(segments) == 1  # of the hundreds in the split
    assert run.checkpoints.latest().endswith(f"ckpt-{run.step:08d}")
    assert not [h for h in run.history if h.get("split") == "valid"]
    # evaluate() itself, asked to stop:
    with pytest.raises(EvaluationStopped, match="after 8 tokens"):
        real(run.model, corpus(400), segment_length=8, stop=lambda: True)
    with pytest.raises(TypeError, match="`stop` must be None or a callable"):
        real(run.model, corpus(400), stop=True)
    with pytest.raises(ValueError, match=r"`unknown_id` must be None or an id in \[0, "):
        real(run.model, corpus(400), unknown_id=-1)


@pytest.mark.parametrize("training_loop", ["custom", "fit"])
def test_txl_train_evaluates_the_validation_split_once_at_the_end(
        tmp_path, monkeypatch, capsys, caplog, training_loop):
    # The custom loop's trainer evaluated the split after its last step, then
    # `txl train` evaluated it again (outside any signal handler) for what it
    # printed. Now the trainer's final evaluation uses the eval settings over
    # the whole split and is the one printed; with `fit` (whose validation is
    # Keras') the final one can be stopped by a signal like training.
    import signal

    from testing import write_word_corpus

    from keras_txl.training import loop

    (tmp_path / "corpus").mkdir()
    corpus_dir = write_word_corpus(tmp_path / "corpus", train_words=400, eval_words=60)
    real, calls = loop.evaluate, []

    def counted(model, tokens, stop=None, **kwargs):
        calls.append(kwargs)
        return real(model, tokens, stop=stop, **kwargs)

    monkeypatch.setattr(loop, "evaluate", counted)
    argv = ["train", "--data", str(corpus_dir), "--workdir", str(tmp_path / "run"),
            "--preset", "tiny", "--tokenizer", "char", "--batch-size", "2",
            "--segment-length", "8", "--memory-length", "8", "--steps", "3",
            "--loop", training_loop, "--set", "eval_every=0", "--set", "eval.memory_length=16"]
    if training_loop == "custom":  # fit refuses it: only the custom loop reads it
        argv += ["--set", "eval_max_segments=2"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(calls) == 1, calls
    assert calls[0]["memory_length"] == 16 and calls[0].get("max_segments", 0) == 0
    assert printed["settings"]["memory_length"] == 16 and "step" not in printed
    if training_loop == "custom":
        logged = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
        final = [r for r in logged if r.get("split") == "valid"]
        assert len(final) == 1 and final[0]["loss"] == printed["loss"]
        return

    def stopped(model, tokens, stop=None, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(model, tokens, stop=stop, **kwargs)

    monkeypatch.setattr(loop, "evaluate", stopped)
    argv[argv.index("--steps") + 1] = "4"
    assert main(argv) == 143
    assert "Stopped on SIGTERM during the final evaluation" in caplog.text


# --- the training CLI under hostile use (twenty-first session) --------------
def test_a_stale_latest_json_or_a_file_in_a_checkpoints_place_costs_nothing(tmp_path, caplog):
    # latest.json is rewritten after the checkpoint's rename: a kill in
    # between left it naming the one before, and resume, eval and export used
    # that older one in silence. A file named like the newest checkpoint made
    # every later save of that step fail.
    run = trainer(tmp_path)
    run.train(corpus())  # checkpoints 2, 4, 6
    manager = run.checkpoints
    pointer = os.path.join(manager.directory, "latest.json")
    with open(pointer, "w") as f:
        json.dump({"name": "ckpt-00000004", "step": 4}, f)
    assert os.path.basename(manager.latest()) == "ckpt-00000006"
    assert trainer(tmp_path).restore() == 6
    import shutil

    shutil.rmtree(os.path.join(manager.directory, "ckpt-00000006"))
    with open(os.path.join(manager.directory, "ckpt-00000006"), "w") as f:
        f.write("junk")
    again = trainer(tmp_path)
    assert again.restore() == 4
    with caplog.at_level(logging.WARNING):
        again.train(corpus())
    assert "ckpt-00000006 is not a checkpoint folder: replacing it" in caplog.text
    assert os.path.basename(manager.latest()) == "ckpt-00000006"
    assert CheckpointManager.read(manager.latest())[1]["step"] == 6


def test_a_finished_run_is_not_rewritten_and_a_failing_final_evaluation_costs_nothing(
        tmp_path, caplog, monkeypatch):
    from keras_txl.training import loop

    run = trainer(tmp_path, steps=4, checkpoint_every=2)
    run.train(corpus())
    newest = run.checkpoints.latest()
    before = open(os.path.join(newest, "state.json"), "rb").read()
    # Asked for fewer steps than reached: said, and nothing is rewritten (it
    # stored steps=3 into the step-4 checkpoint and said the schedule was
    # "stretched").
    short = trainer(tmp_path, steps=3, checkpoint_every=2)
    with caplog.at_level(logging.WARNING):
        assert short.restore() == 4
        short.train(corpus())
    assert "is at step 4, and this run has steps=3: nothing to train" in caplog.text
    assert "stretched" not in caplog.text
    assert open(os.path.join(newest, "state.json"), "rb").read() == before
    # Trained on to a step whose checkpoint the loop writes itself: the
    # model folder follows (it is not left at the step before).
    longer = trainer(tmp_path, steps=6, checkpoint_every=2)
    assert longer.restore() == 4
    longer.train(corpus())
    folder = keras_txl.load_pretrained(str(tmp_path / "model"))
    for a, b in zip(folder.get_weights(), longer.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    # The final evaluation fails (a setting the split cannot take): the
    # trained steps are on disk already (it ran before the checkpoint).
    def failing(*args, **kwargs):
        raise ValueError("the evaluation failed")

    fresh = tmp_path / "fresh"
    monkeypatch.setattr(loop, "evaluate", failing)
    with pytest.raises(ValueError, match="the evaluation failed"):
        trainer(fresh, steps=3, checkpoint_every=2).train(corpus(), corpus(400))
    manager = CheckpointManager(str(fresh / "checkpoints"))
    assert os.path.basename(manager.latest()) == "ckpt-00000003"
    assert (fresh / "model" / "config.json").is_file()


def test_set_and_config_values_are_checked_before_training(tmp_path, capsys):
    # `--set steps` and `--set model.` were IndexErrors; eval.* values were
    # checked only after the last step; cutoffs=5 / tie_projections=7 were
    # TypeErrors after the data was prepared.
    for overrides, message in (
            (["steps"], "--set takes KEY=VALUE"),
            (["model."], "--set takes KEY=VALUE"),
            (["eval.memory_length=-5"], '"eval" memory_length must be an integer >= 0'),
            (["eval.batch_size=0"], '"eval" batch_size must be an integer >= 1')):
        with pytest.raises(ValueError, match=re.escape(message)):
            resolve_configs("tiny", None, overrides)
    assert resolve_configs("tiny", None, [" steps=3"])[1].steps == 3
    # An evaluation memory given as 0 is no memory (it fell back to the model's).
    from keras_txl.training.run import _eval_kwargs

    evaluation = resolve_configs("tiny", None, ["eval.memory_length=0"])[2]
    assert _eval_kwargs(evaluation)["memory_length"] == 0
    assert "segment_length" not in _eval_kwargs({"segment_length": 0})
    base = dict(vocabulary_size=50, num_layers=1, hidden_dim=8, num_heads=2,
                intermediate_dim=8)
    for changes, message in (({"cutoffs": 5}, "`cutoffs` must be a list"),
                             ({"cutoffs": None}, "`cutoffs` must be a list"),
                             ({"tie_projections": 7}, "`tie_projections` must be a list")):
        with pytest.raises(ValueError, match=message):
            keras_txl.TransformerXLConfig(**base, **changes)
    corpus_dir = write_corpus(tmp_path / "c", 0)
    assert main(["train", "--data", corpus_dir, "--workdir", str(tmp_path / "w"),
                 "--preset", "tiny", "--steps", "1", "--set", "eval.segment_length=-3"]) == 2
    assert '"eval" segment_length must be an integer >= 0' in capsys.readouterr().err
    assert not (tmp_path / "w" / "checkpoints").exists()


def test_a_memory_of_another_shape_is_said_when_a_pass_resumes_without_it(tmp_path, caplog):
    # A multi-worker checkpoint holds only the chief's rows: resumed in one
    # process, the memory went to zeros in silence and the losses changed.
    run = trainer(tmp_path, steps=3, checkpoint_every=3)
    run.train(corpus())
    latest = run.checkpoints.latest()
    tensors, state = CheckpointManager.read(latest)
    assert state["data"]["segment"] != 0  # mid-pass
    run.checkpoints.save(3, run.model, run.optimizer, tensors["memory"][:2], state)
    with caplog.at_level(logging.WARNING):
        assert trainer(tmp_path, steps=3, checkpoint_every=3).restore() == 3
    assert re.search(r"holds a memory of shape \(2, .*this run needs a memory of shape "
                     r"\(4, .*continues from a zero memory", caplog.text)


def test_bad_sizes_are_named_by_flag_before_the_data_is_prepared(tmp_path, capsys):
    # --segment-length 0 or --set num_layers=0 failed only after the corpus was
    # tokenized and encoded into the new workdir (data/, tokenizer/ left
    # behind); --steps 0 named `steps`, after TensorFlow had loaded.
    corpus_dir = write_corpus(tmp_path / "c", 0)
    base = ["train", "--data", corpus_dir, "--preset", "tiny", "--steps", "1"]
    for flags, message in ((["--steps", "0"], "--steps must be an integer in [1, 2147483647], "
                            "received '0'"),
                           (["--steps", "-3"], "--steps must be an integer in [1, "),
                           (["--batch-size", "0"], "--batch-size must be an integer in [1, "),
                           (["--segment-length", "0"], "--segment-length must be an integer "
                            ">= 1, received '0'"),
                           (["--memory-length", "-1"], "--memory-length must be an integer "
                            ">= 0, received '-1'"),
                           (["--steps", "x"], "--steps must be an integer in [1, ")):
        workdir = tmp_path / f"w{flags[1]}"
        with pytest.raises(SystemExit) as stop:
            main(base + ["--workdir", str(workdir)] + flags)
        assert stop.value.code == 2
        assert message in capsys.readouterr().err, flags
        assert not workdir.exists()
    for flags, message in ((["--set", "num_layers=0"], "`num_layers` must be a positive integer"),
                           (["--set", "dropout=1.5"], "`dropout` must be in [0, 1)"),
                           (["--set", "cutoffs=[5,3]"], "`cutoffs` must be strictly increasing"),
                           (["--set", "vocabulary_size=5", "--set", "cutoffs=[6]"],
                            "`cutoffs` must lie in (0, vocabulary_size=5]")):
        workdir = tmp_path / "w"
        assert main(base + ["--workdir", str(workdir)] + flags) == 2
        assert message in capsys.readouterr().err, flags
        assert not (workdir / "data").exists() and not (workdir / "tokenizer").exists()
    # Cutoffs are checked against the tokenizer's vocabulary once it is known.
    assert resolve_configs("tiny", None, ["cutoffs=[300]"])[0]["cutoffs"] == [300]



def test_a_full_disk_anywhere_in_a_run_names_the_file_and_the_intact_checkpoint(
        tmp_path, monkeypatch):
    # A full disk while creating the checkpoint's temporary folder, appending
    # to metrics.jsonl or writing the model folder ended `txl train` with a
    # bare "[Errno 28] No space left on device": no file, no checkpoint named.
    import builtins
    import errno
    import tempfile

    from keras_txl.training import loop

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    real_open = builtins.open

    def full_metrics(path, mode="r", *args, **kwargs):
        if str(path).endswith("metrics.jsonl") and "a" in mode:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *args, **kwargs)

    run = trainer(tmp_path, steps=2, checkpoint_every=2)
    run.train(corpus())
    intact = str(tmp_path / "checkpoints" / "ckpt-00000002")
    for name, target, fake, message in (
            ("folder", (tempfile, "mkdtemp"), no_space,
             f"Writing checkpoint {tmp_path / 'checkpoints' / 'ckpt-00000004'} failed "
             "([Errno 28] No space left on device); the previous checkpoint is intact."),
            ("metrics", (builtins, "open"), full_metrics,
             f"Writing {tmp_path / 'metrics.jsonl'} failed at step 3 (No space left on "
             f"device); the newest checkpoint, {intact} (step 2), is intact: free some "
             "space and resume with the same `txl train` command."),
            ("model", (loop, "save_preset"), no_space,
             f"Writing the model folder {tmp_path / 'model'} failed at step 4 (No space left "
             f"on device); the newest checkpoint, {tmp_path / 'checkpoints' / 'ckpt-00000004'}"
             " (step 4), is intact: free some space and resume with the same `txl train` "
             "command.")):
        again = trainer(tmp_path, steps=4, checkpoint_every=2)
        assert again.restore() == 2
        with monkeypatch.context() as patch:
            patch.setattr(*target, fake)
            with pytest.raises(OSError) as error:
                again.train(corpus())
        assert str(error.value) == message, name
        manager = CheckpointManager(str(tmp_path / "checkpoints"))
        assert manager.newest_intact(warn=False)[0] == manager.latest()
        if name != "model":
            assert os.path.basename(manager.latest()) == "ckpt-00000002"
        assert not [f for f in os.listdir(tmp_path / "checkpoints") if ".tmp-" in f]
        if name == "model":  # the previous model folder stays as it was
            assert (tmp_path / "model" / "config.json").is_file()


def test_a_read_only_checkpoints_folder_is_refused_before_any_step(tmp_path, capsys,
                                                                   monkeypatch):
    # A workdir whose checkpoints/ could not be written (another user's run,
    # a read-only copy) trained until its first checkpoint (checkpoint_every
    # steps, or the whole run) and lost those steps. Root ignores permissions,
    # so the folder's refusal is simulated.
    import builtins
    import errno

    corpus_dir = write_corpus(tmp_path / "c", 0)
    workdir = tmp_path / "w"
    argv = ["train", "--data", corpus_dir, "--workdir", str(workdir), "--preset", "tiny",
            "--batch-size", "2", "--segment-length", "8", "--memory-length", "8",
            "--set", "log_every=1"]
    assert main(argv + ["--steps", "1"]) == 0
    capsys.readouterr()
    rows = (workdir / "metrics.jsonl").read_text()
    folder = str(workdir / "checkpoints")
    real_open = builtins.open

    def read_only(path, mode="r", *args, **kwargs):
        if str(path).startswith(folder + os.sep) and mode != "r" and "r" not in mode:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", read_only)
    assert main(argv + ["--steps", "3"]) == 2
    err = capsys.readouterr().err
    assert (f"txl train: error: --workdir {str(workdir)!r}: its checkpoints folder {folder} "
            "is not writable (Permission denied)") in err, err
    assert (workdir / "metrics.jsonl").read_text() == rows
    assert sorted(os.listdir(folder)) == ["ckpt-00000001", "latest.json"]


def test_a_resume_where_auto_picks_another_precision_says_so(tmp_path, caplog, monkeypatch):
    # precision="auto" follows the host: a checkpoint trained in float32 and
    # resumed where "auto" picks mixed_bfloat16 (or back) changed what its
    # steps compute in without a word, since both records said "auto".
    from keras_txl.training import optimizers

    run = trainer(tmp_path, steps=2, precision="auto")
    run.train(corpus())
    trained_in = run.model.dtype_policy.name
    state = CheckpointManager.read(run.checkpoints.latest())[1]
    assert state["precision"] == trained_in == optimizers.resolve_precision("auto")
    with caplog.at_level(logging.WARNING):
        assert trainer(tmp_path, steps=4, precision="auto").restore() == 2
    assert "'auto' picks" not in caplog.text
    other = "float32" if trained_in != "float32" else "mixed_bfloat16"
    monkeypatch.setattr(optimizers, "auto_precision", lambda: other)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert trainer(tmp_path, steps=4, precision="auto").restore() == 2
    assert (f"was trained in {trained_in} (precision='auto' on the host that trained it); "
            f"on this host 'auto' picks {other}, so the resumed steps compute in {other}. "
            f"Pass --precision {trained_in}") in caplog.text
