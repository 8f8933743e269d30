"""`--loop fit`: exactly `steps` steps, an exact resume, the custom loop's
resume checks; and the custom loop changes nothing on disk before them."""

import json
import os
import shutil
from functools import partial

import numpy as np
import pytest
import tensorflow as tf
from safetensors.numpy import load_file
from testing import mirrored_strategy
from testing import tiny_config

from keras_txl.training.checkpoint import CheckpointManager
from keras_txl.training.config import TrainConfig
from keras_txl.training.fit import fit_calls
from keras_txl.training.fit import train_with_fit
from keras_txl.training.loop import Trainer

V = 40
# With dropout: a resume must also restore the dropout generators' state.
model_config = partial(tiny_config, vocabulary_size=V, hidden_dim=16, intermediate_dim=32,
                       segment_length=8, memory_length=8, dropout=0.1, init_std=0.02)


def train_config(**changes):
    base = dict(batch_size=4, steps=17, learning_rate=3e-3, warmup_steps=2,
                log_every=1, checkpoint_every=5, keep_checkpoints=10, clip_norm=0.25)
    base.update(changes)
    return TrainConfig(**base)


def corpus(n=240, seed=0):
    # 240 tokens, batch 4: streams of 60, (60 - 1) // 8 = 7 segments a pass.
    return np.random.default_rng(seed).integers(0, V, n).astype("int32")


VALID = corpus(100, seed=5)


def steps_of(workdir):
    manager = CheckpointManager(os.path.join(workdir, "checkpoints"))
    return [int(os.path.basename(p).split("-")[1]) for p in manager.checkpoints()]


def tensors(workdir, step):
    return load_file(os.path.join(workdir, "checkpoints", f"ckpt-{step:08d}",
                                  "state.safetensors"))


def killed_after(source, step, workdir):
    """`workdir` as a run killed right after writing checkpoint `step` left it."""
    os.makedirs(os.path.join(workdir, "checkpoints"))
    name = f"ckpt-{step:08d}"
    shutil.copytree(os.path.join(source, "checkpoints", name),
                    os.path.join(workdir, "checkpoints", name))
    shutil.copy(os.path.join(source, "config.json"), workdir)


def snapshot(folder):
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = (f.read(), os.stat(path).st_mtime_ns)
    return out


def test_fit_calls_split_the_steps_into_passes():
    # (initial_epoch, epochs, steps_per_epoch, start_segment): 17 steps are
    # two passes of 7 and a third one stopped after 3.
    assert fit_calls(0, 17, 7) == [(0, 2, 7, 0), (2, 3, 3, 0)]
    assert fit_calls(0, 14, 7) == [(0, 2, 7, 0)]
    # Resumed inside a pass: first the rest of it, from the restored segment.
    assert fit_calls(5, 17, 7) == [(0, 1, 2, 5), (1, 2, 7, 0), (2, 3, 3, 0)]
    assert fit_calls(15, 17, 7) == [(2, 3, 2, 1)]
    assert fit_calls(3, 5, 7) == [(0, 1, 2, 3)]
    assert fit_calls(17, 17, 7) == fit_calls(20, 17, 7) == []


@pytest.mark.parametrize("use_mirrored", [False, True])
def test_fit_runs_exactly_steps_and_resumes_where_it_stopped(tmp_path, use_mirrored):
    strategy = mirrored_strategy() if use_mirrored else tf.distribute.get_strategy()
    valid = None if use_mirrored else VALID  # (a validation: one more trace)
    straight = str(tmp_path / "straight")
    model, history = train_with_fit(model_config(), train_config(), strategy, corpus(),
                                    valid_tokens=valid, workdir=straight, verbose=0)
    # 17 steps = passes of 7, 7 and 3, not 3 whole passes.
    assert steps_of(straight) == [5, 10, 15, 17]
    assert int(model.optimizer.iterations.numpy()) == 17
    assert len(history.history["loss"]) == 3
    if valid is not None:  # at the end of every pass, the last one partial
        assert len(history.history["val_loss"]) == 3
    with open(os.path.join(straight, "checkpoints", "ckpt-00000017", "state.json")) as f:
        state = json.load(f)
    assert state["data"]["segment"] == 17 % 7 and state["data"]["train_tokens"] == 240
    # Every replica's memory: (B, L, M, D), not only the first replica's rows.
    assert tensors(straight, 17)["memory"].shape == (4, 2, 8, 16)
    assert np.abs(tensors(straight, 17)["memory"][2:]).max() > 0
    # Killed after step 5 (inside the first pass) or 15 (inside the last):
    # the resumed run reads the same batches with the same memory, weights,
    # Adam and dropout state, so every later checkpoint is bit-identical.
    for stop in ((5, 15) if not use_mirrored else (5,)):
        resumed = str(tmp_path / f"resumed-{stop}")
        killed_after(straight, stop, resumed)
        model, history = train_with_fit(model_config(), train_config(), strategy, corpus(),
                                        valid_tokens=valid, workdir=resumed, verbose=0)
        assert steps_of(resumed) == [s for s in (5, 10, 15, 17) if s >= stop]
        assert int(model.optimizer.iterations.numpy()) == 17
        for step in steps_of(resumed)[1:]:
            want, got = tensors(straight, step), tensors(resumed, step)
            assert sorted(got) == sorted(want)
            for key in want:
                np.testing.assert_array_equal(got[key], want[key], err_msg=f"{key} at {step}")
        # One epoch per pass left, the resumed one included, each validated.
        assert len(history.history["loss"]) == 3 - stop // 7
        if valid is not None:
            assert len(history.history["val_loss"]) == 3 - stop // 7


def test_fit_refuses_the_resumes_the_custom_loop_refuses(tmp_path):
    workdir = str(tmp_path)
    train_with_fit(model_config(), train_config(steps=5), tf.distribute.get_strategy(),
                   corpus(), workdir=workdir, verbose=0)
    before = snapshot(workdir)
    refusals = [
        (dict(), dict(batch_size=2), corpus(),
         r"ckpt-00000005 was written with batch_size=4; resuming with batch_size=2 "
         r"would restart the memory and the position in the text. Resume with "
         r"--batch-size 4"),
        (dict(dropout=0.3, segment_length=6), dict(), corpus(),
         r"ckpt-00000005 was written for another model config: dropout 0.1 -> 0.3, "
         r"segment_length 8 -> 6 \(checkpoint -> this run\)"),
        (dict(), dict(), corpus(300),
         r"ckpt-00000005 was written while reading a train split of 240 tokens .* "
         r"this run's has 300"),
    ]
    for model_changes, train_changes, tokens, message in refusals:
        with pytest.raises(ValueError, match=message):
            train_with_fit(model_config(**model_changes), train_config(steps=9, **train_changes),
                           tf.distribute.get_strategy(), tokens, workdir=workdir, verbose=0)
        assert snapshot(workdir) == before  # not even config.json rewritten


def test_a_refused_custom_loop_resume_leaves_metrics_untouched(tmp_path):
    workdir = str(tmp_path)
    cfg = train_config(steps=6, checkpoint_every=3)
    Trainer(model_config(), cfg, tf.distribute.get_strategy(), workdir=workdir,
            verbose=False).train(corpus())
    shutil.rmtree(os.path.join(workdir, "checkpoints", "ckpt-00000006"))  # killed
    metrics = os.path.join(workdir, "metrics.jsonl")
    with open(metrics, "rb") as f:
        logged = f.read()
    again = Trainer(model_config(), cfg, tf.distribute.get_strategy(), workdir=workdir,
                    verbose=False)
    assert again.restore() == 3
    with pytest.raises(ValueError, match="train split of 240 tokens"):
        again.train(corpus(300))  # another train split: refused
    with open(metrics, "rb") as f:
        assert f.read() == logged  # rows 4..6 still there
    # (With the right split the rows after step 3 are dropped, then logged
    # again: tests/test_run_reliability.py.)


def test_the_custom_loop_names_the_model_config_keys_that_differ(tmp_path):
    Trainer(model_config(), train_config(steps=2, checkpoint_every=2),
            tf.distribute.get_strategy(), workdir=str(tmp_path), verbose=False).train(corpus())
    other = Trainer(model_config(dropout=0.2, memory_length=16), train_config(steps=2),
                    tf.distribute.get_strategy(), workdir=str(tmp_path), verbose=False)
    with pytest.raises(ValueError, match=r"another model config: dropout 0.1 -> 0.2, "
                       r"memory_length 8 -> 16 \(checkpoint -> this run\)\. Pass the "
                       r"checkpoint's values to resume it, or train in a new --workdir"):
        other.restore()


def test_a_fit_resume_drops_the_metrics_rows_logged_after_its_checkpoint(tmp_path):
    # A custom-loop run logged steps 6-8 after its step-5 checkpoint, then
    # was killed; resumed with --loop fit (which logs no rows) they stayed,
    # showing steps the resumed state never trained.
    workdir = str(tmp_path / "w")
    train_with_fit(model_config(), train_config(steps=5), tf.distribute.get_strategy(),
                   corpus(), workdir=workdir, verbose=0)
    rows = [{"step": s, "loss": 1.0} for s in range(1, 9)] + [{"step": 8, "split": "valid"}]
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    train_with_fit(model_config(), train_config(steps=6), tf.distribute.get_strategy(),
                   corpus(), workdir=workdir, verbose=0)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        steps = [json.loads(line)["step"] for line in f]
    assert steps == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("loop", ["custom", "fit"])
def test_ids_out_of_the_vocabulary_are_refused_before_any_step(tmp_path, loop):
    # Both loops check the splits first, naming the argument and the range:
    # inside the compiled step an id >= V fails as a graph assertion's
    # traceback, and a bad validation split only after training to the
    # first evaluation.
    V = model_config().vocabulary_size
    bad_train = corpus()
    bad_train[17] = V
    bad_valid = corpus(seed=1)
    bad_valid[3] = -1
    cases = [(bad_train, None, rf"`train_tokens` must be ids in \[0, {V}\).*found {V}"),
             (corpus(), bad_valid, rf"`valid_tokens` must be ids in \[0, {V}\).*found -1"),
             (corpus().astype("float32"), None, r"`train_tokens` must be a 1-D array of "
              r"integer token ids, received shape \(240,\) and dtype float32")]
    for train, valid, message in cases:
        workdir = str(tmp_path / str(len(os.listdir(tmp_path))))
        with pytest.raises(ValueError, match=message):
            if loop == "fit":
                train_with_fit(model_config(), train_config(steps=2),
                               tf.distribute.get_strategy(), train, valid, workdir=workdir,
                               verbose=0)
            else:
                Trainer(model_config(), train_config(steps=2), tf.distribute.get_strategy(),
                        workdir=workdir).train(train, valid)
        assert not os.path.exists(os.path.join(workdir, "checkpoints")) or not os.listdir(
            os.path.join(workdir, "checkpoints"))


def test_a_full_disk_at_the_fit_loops_model_folder_names_it_and_the_checkpoint(
        tmp_path, monkeypatch):
    # Was a bare "[Errno 28] No space left on device", as in the custom loop.
    import errno

    from keras_txl.training import fit

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fit, "save_preset", no_space)
    with pytest.raises(OSError) as error:
        train_with_fit(model_config(), train_config(steps=2, checkpoint_every=0),
                       tf.distribute.get_strategy(), corpus(), workdir=str(tmp_path),
                       verbose=0)
    checkpoint = tmp_path / "checkpoints" / "ckpt-00000002"
    assert str(error.value) == (
        f"Writing the model folder {tmp_path / 'model'} failed at step 2 (No space left on "
        f"device); the newest checkpoint, {checkpoint} (step 2), is intact: free some space "
        "and resume with the same `txl train` command.")
    assert (checkpoint / "state.json").is_file()
