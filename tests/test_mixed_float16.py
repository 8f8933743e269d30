"""mixed_float16 with dynamic loss scaling, in both loops, and where XLA compiles.

The loss scaling is Keras' `LossScaleOptimizer` (the custom loop calls its
`scale_loss` and `apply_gradients`); these tests check the loops around it:
losses close to float32's, skipped updates that are not bad steps, a
checkpointed loss scale that makes a resume exact, the clear errors.
"""

import logging
from functools import partial

import keras
import numpy as np
import pytest
import tensorflow as tf
from testing import tiny_config

from keras_txl.host import gpu_auto_precision
from keras_txl.training.checkpoint import CheckpointManager
from keras_txl.training.config import TrainConfig
from keras_txl.training.fit import train_with_fit
from keras_txl.training.loop import Trainer
from keras_txl.training.optimizers import FusedAdam
from keras_txl.training.optimizers import setup_model_and_optimizer
from keras_txl.training.strategy import all_gpu_devices
from keras_txl.training.strategy import jit_compile_scope
from keras_txl.training.strategy import strategy_jit_scope

V = 40
# Dropout off: float32 and float16 runs then differ only by rounding.
model_config = partial(tiny_config, vocabulary_size=V, hidden_dim=16, intermediate_dim=32,
                       segment_length=8, memory_length=8, dropout=0.0, init_std=0.02)

# How close mixed_float16 losses stay to float32's. float16 keeps 11 significant
# bits (relative rounding 2**-11 = 4.9e-4) in every matmul and activation of 2
# layers; over 6 Adam steps at lr 3e-3 those differences reach the weights too.
# The loss (~3.7 nats, ln 40) is computed in float32 from float32 log-probs. A
# relative 2e-3 is four float16 roundings: far above float32 noise (1e-7), far
# below what a wrong gradient scale would do (an update 32768x off, or none).
FLOAT16_RTOL = 2e-3


def train_config(**changes):
    base = dict(batch_size=4, steps=6, learning_rate=3e-3, warmup_steps=2,
                log_every=1, checkpoint_every=0, clip_norm=0.25)
    base.update(changes)
    return TrainConfig(**base)


def corpus(n=3000, seed=0):
    return np.random.default_rng(seed).integers(0, V, n).astype("int32")


def default_strategy():
    return tf.distribute.get_strategy()


def make_trainer(strategy=None, workdir=None, **changes):
    """A quiet Trainer of the tiny model with `train_config(**changes)`, under the
    default strategy unless one is given."""
    return Trainer(model_config(), train_config(**changes), strategy or default_strategy(),
                   workdir=workdir, verbose=False)


def test_custom_loop_mixed_float16_trains_close_to_float32():
    tokens = corpus()
    f32 = make_trainer().train(tokens)
    trainer = make_trainer(precision="mixed_float16")
    assert isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer)
    assert trainer.model.backbone.blocks[0].compute_dtype == "float16"
    f16 = trainer.train(tokens)
    assert np.all(np.isfinite(f16))
    np.testing.assert_allclose(f16, f32, rtol=FLOAT16_RTOL)
    # Every update was applied (no overflow at 2**15 here), the memory is float32.
    assert int(trainer.optimizer.iterations.numpy()) == 6
    assert trainer.loss_scale_skips == 0
    assert trainer.memory_numpy().dtype == np.float32
    assert trainer.history[-1]["loss_scale"] == 32768.0


def test_fit_mixed_float16_wraps_fused_adam_and_trains_close_to_float32():
    tokens = corpus()
    _, f32 = train_with_fit(model_config(), train_config(loop="fit", steps=4),
                            default_strategy(), tokens, verbose=0)
    model, f16 = train_with_fit(
        model_config(), train_config(loop="fit", steps=4, precision="mixed_float16"),
        default_strategy(), tokens, verbose=0)
    optimizer = model.optimizer
    # Ours, not one Keras made: compile keeps a LossScaleOptimizer as it is.
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    assert isinstance(optimizer.inner_optimizer, FusedAdam)
    assert optimizer.inner_optimizer.global_clipnorm == 0.25
    assert int(optimizer.iterations.numpy()) == 4
    # Keras logs the per-epoch mean of the unscaled loss.
    np.testing.assert_allclose(f16.history["loss"], f32.history["loss"],
                               rtol=FLOAT16_RTOL)
    # And Keras' train step does scale the loss: at 2**22 the float16
    # gradients overflow (they fit from 2**18 here), the first updates are
    # skipped and the scale halves each time.
    model, _ = train_with_fit(
        model_config(), train_config(loop="fit", steps=4, precision="mixed_float16",
                                     initial_loss_scale=2.0**22),
        default_strategy(), tokens, verbose=0)
    applied = int(model.optimizer.iterations.numpy())
    assert applied < 4
    assert float(model.optimizer.dynamic_scale.numpy()) == 2.0 ** (22 - (4 - applied))


def test_loss_scale_optimizer_clips_the_unscaled_gradients():
    # The wrapped FusedAdam sees gradients divided by the scale, so its
    # global_clipnorm acts on the true gradients: one step with scaled
    # gradients equals one step of the bare optimizer with unscaled ones
    # (the set-up's wrapping: tested above and in the fit test).
    gradient = np.full((3, 4), 5.0, "float32")  # norm 17.3, clipped to 0.25
    results = []
    for scale in (1024.0, None):
        variable = keras.Variable(np.ones((3, 4), "float32"))
        optimizer = FusedAdam(0.1, global_clipnorm=0.25)
        if scale:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=scale)
        optimizer.apply_gradients([(tf.constant(gradient * (scale or 1.0)), variable)])
        results.append(variable.numpy())
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6)
    assert not np.allclose(results[0], 1.0)
    # Without the unscaling the clipped step would be the same (clipping
    # hides the scale) but Adam's epsilon would not: check the unclipped
    # update is the bare one too.
    small = np.full((3, 4), 1e-3, "float32")
    results = []
    for scale in (1024.0, None):
        variable = keras.Variable(np.ones((3, 4), "float32"))
        optimizer = FusedAdam(0.1, epsilon=1e-3)
        if scale:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=scale)
        optimizer.apply_gradients([(tf.constant(small * (scale or 1.0)), variable)])
        results.append(variable.numpy())
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6)


def test_huge_loss_scale_skips_updates_then_recovers(caplog):
    # 2**100 * gradients overflow float32 (and float16): the scaler skips the
    # update and halves the scale until it fits; those steps are not bad
    # steps (on_non_finite="stop" does not trip) and the weights do not move.
    tokens = corpus()
    trainer = make_trainer(precision="mixed_float16", initial_loss_scale=2.0**100, steps=1,
                           warmup_steps=0)
    before = [v.numpy() for v in trainer.model.trainable_variables]
    with caplog.at_level(logging.INFO, logger="keras_txl.training.loop"):
        losses = trainer.train(tokens, steps=1)
    assert np.isfinite(losses).all()
    assert trainer.loss_scale_skips == 1
    assert float(trainer.optimizer.dynamic_scale.numpy()) == 2.0**99
    assert int(trainer.optimizer.iterations.numpy()) == 0
    for a, b in zip(before, trainer.model.trainable_variables):
        np.testing.assert_array_equal(a, b.numpy())
    assert "overflowed at loss scale 1.26765e+30" in caplog.text
    # It keeps halving until the gradients fit, then the updates go through.
    trainer = make_trainer(precision="mixed_float16", initial_loss_scale=2.0**100, steps=120,
                           warmup_steps=0)
    losses = trainer.train(tokens)
    assert np.isfinite(losses).all()
    skips = trainer.loss_scale_skips
    scale = float(trainer.optimizer.dynamic_scale.numpy())
    # float16 gradients (max 65504) of a loss scaled by 2**k fit from k ~ 20.
    assert 60 < skips < 100
    assert scale == 2.0 ** (100 - skips)
    assert int(trainer.optimizer.iterations.numpy()) == 120 - skips
    assert trainer.history[-1]["loss_scale_skips"] == skips
    assert not np.array_equal(before[0], trainer.model.trainable_variables[0].numpy())


def test_a_non_finite_loss_under_loss_scaling_is_still_a_bad_step(tmp_path):
    trainer = make_trainer(workdir=str(tmp_path), precision="mixed_float16", steps=6,
                           checkpoint_every=2)
    trainer.train(corpus(), steps=2)
    scale = float(trainer.optimizer.dynamic_scale.numpy())
    counter = int(trainer.optimizer.step_counter.numpy())
    kernel = trainer.model.backbone.blocks[0].output_dense.kernel
    kernel.assign(np.full(kernel.shape, np.nan, "float32"))
    with pytest.raises(FloatingPointError, match="Non-finite loss .* at step 3.*ckpt-00000002"):
        trainer.train(corpus())
    # The guard puts back the scaler's state (its skip would have halved it).
    assert float(trainer.optimizer.dynamic_scale.numpy()) == scale
    assert int(trainer.optimizer.step_counter.numpy()) == counter
    assert int(trainer.optimizer.iterations.numpy()) == 2


def test_resume_with_mixed_float16_gives_the_same_losses(tmp_path):
    # A scale that overflows for the first steps (here the float16
    # gradients fit from 2**18): the resume must carry the scaler's halved
    # scale and its counter, or the steps after it differ.
    tokens = corpus()
    cfg = dict(steps=6, checkpoint_every=3, precision="mixed_float16",
               initial_loss_scale=2.0**20)
    straight_trainer = make_trainer(workdir=str(tmp_path / "a"), **cfg)
    straight = straight_trainer.train(tokens)
    first = make_trainer(workdir=str(tmp_path / "b"), **cfg)
    first.train(tokens, steps=3)
    assert 0 < first.loss_scale_skips < 3  # some skipped, some applied
    saved, _ = CheckpointManager.read(str(tmp_path / "b" / "checkpoints" / "ckpt-00000003"))
    assert float(saved["loss_scale/dynamic_scale"]) == float(
        first.optimizer.dynamic_scale.numpy())
    second = make_trainer(workdir=str(tmp_path / "b"), **cfg)
    assert second.restore() == 3
    assert second.loss_scale_skips == first.loss_scale_skips
    resumed = second.train(tokens)
    np.testing.assert_array_equal(resumed, straight[3:])
    assert float(second.optimizer.dynamic_scale.numpy()) == float(
        straight_trainer.optimizer.dynamic_scale.numpy())
    for a, b in zip(second.model.trainable_variables,
                    straight_trainer.model.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_bad_combinations_are_refused_clearly():
    with pytest.raises(ValueError, match=r"`initial_loss_scale`=1024.0 is used only with "
                       r"precision='mixed_float16'.*received precision='float32'"):
        TrainConfig(initial_loss_scale=1024.0)
    with pytest.raises(ValueError, match="`initial_loss_scale` must be a finite number > 0"):
        TrainConfig(precision="mixed_float16", initial_loss_scale=0.0)
    with pytest.raises(ValueError, match="`initial_loss_scale` must be a finite number > 0"):
        TrainConfig(precision="mixed_float16", initial_loss_scale=float("inf"))
    with pytest.raises(ValueError, match="precision='mixed_float16' is not for TPUs.*"
                       "precision='mixed_bfloat16'"):
        TrainConfig(precision="mixed_float16", strategy="tpu")
    # "auto" may pick mixed_float16 on a GPU: its scale setting is accepted.
    TrainConfig(precision="auto", initial_loss_scale=1024.0)


def test_precision_without_loss_scaling_has_no_scaler():
    for precision in ("float32", "mixed_bfloat16"):
        _, optimizer = setup_model_and_optimizer(
            model_config(), train_config(precision=precision), default_strategy())
        assert isinstance(optimizer, FusedAdam)


@pytest.mark.parametrize("capability, expected", [
    ((9, 0), "mixed_bfloat16"), ((8, 0), "mixed_bfloat16"), ((8, 6), "mixed_bfloat16"),
    ((7, 5), "mixed_float16"), ((7, 0), "mixed_float16"), ((6, 1), "float32"),
    (None, "float32"),
])
def test_auto_precision_on_a_gpu_follows_its_compute_capability(capability, expected):
    assert gpu_auto_precision(capability) == expected


def test_xla_scope_follows_the_replicas_devices():
    gpus = ["/job:localhost/replica:0/task:0/device:GPU:0",
            "/job:localhost/replica:0/task:0/device:GPU:1"]
    cpus = ["/job:localhost/replica:0/task:0/device:CPU:0",
            "/job:localhost/replica:0/task:0/device:CPU:1"]
    workers = ["/job:worker/replica:0/task:0/device:GPU:0",
               "/job:worker/replica:0/task:1/device:GPU:0"]
    assert all_gpu_devices(gpus) and not all_gpu_devices(cpus)
    assert not all_gpu_devices([gpus[0], cpus[1]]) and not all_gpu_devices([])
    assert jit_compile_scope("mirrored", gpus) == "replica"
    assert jit_compile_scope("multi_worker", workers) == "replica"
    assert jit_compile_scope("mirrored", cpus) == "none"
    assert jit_compile_scope("mirrored", [gpus[0], cpus[1]]) == "none"
    assert jit_compile_scope("multi_worker", ["/job:worker/task:0/device:CPU:0"]) == "none"
    assert jit_compile_scope("default", ()) == "step"
    assert jit_compile_scope("tpu", ["/job:worker/task:0/device:TPU:0"]) == "step"
    assert strategy_jit_scope(default_strategy()) == "step"


def test_jit_is_left_off_under_mirrored_on_cpu_with_the_warning(caplog):
    from testing import mirrored_strategy

    with caplog.at_level(logging.WARNING, logger="keras_txl.training.loop"):
        trainer = make_trainer(mirrored_strategy(), jit_compile=True)
    assert trainer.jit_scope == "none"
    assert "jit_compile is not used under MirroredStrategy on CPU" in caplog.text


def test_mirrored_mixed_float16_first_steps_equal_the_default_strategy():
    # The scaler's apply under MirroredStrategy (Keras merges to cross-replica
    # context to decide the skip) with the loop's sum-then-clip: the same
    # losses as one device, an overflowing first step skipped on both.
    from testing import mirrored_strategy

    tokens = corpus()
    cfg = dict(steps=3, precision="mixed_float16", initial_loss_scale=2.0**19)
    default = make_trainer(**cfg)
    one = default.train(tokens)
    two = make_trainer(mirrored_strategy(), **cfg)
    losses = two.train(tokens)
    np.testing.assert_allclose(losses, one, rtol=1e-5)
    assert two.loss_scale_skips == default.loss_scale_skips >= 1
    assert float(two.optimizer.dynamic_scale.numpy()) == float(
        default.optimizer.dynamic_scale.numpy())


def test_skip_mode_bad_steps_leave_the_loss_scale_alone():
    trainer = make_trainer(precision="mixed_float16", steps=4, on_non_finite="skip")
    trainer.train(corpus(), steps=2)
    before = [v.numpy() for v in trainer.optimizer.variables]
    kernel = trainer.model.backbone.blocks[0].output_dense.kernel
    kernel.assign(np.full(kernel.shape, np.nan, "float32"))
    losses = trainer.train(corpus())
    assert np.isnan(losses).all() and len(losses) == 2
    # The scaler skipped both updates (NaN gradients) and its scale and
    # counter were put back: the optimizer state is as before the bad steps.
    for a, b in zip(before, trainer.optimizer.variables):
        np.testing.assert_array_equal(a, b.numpy())
    assert trainer.loss_scale_skips == 0


def test_overflow_counts_as_a_bad_step_only_once_the_scale_is_at_most_one():
    trainer = make_trainer(precision="mixed_float16")
    inf, nan = float("inf"), float("nan")
    assert not trainer._is_bad_step(3.0, inf, (32768.0, 0))  # the scaler's business
    assert trainer._is_bad_step(3.0, inf, (1.0, 0))
    assert trainer._is_bad_step(nan, inf, (32768.0, 0))
    assert trainer._is_bad_step(3.0, inf, None)  # no loss scaling (float32)
    assert not trainer._is_bad_step(3.0, 0.5, (32768.0, 0))


def load_gpu_benchmark():
    import importlib.util

    from testing import REPO

    spec = importlib.util.spec_from_file_location("gpu_benchmark", REPO / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_benchmark_peaks_precisions_and_arguments():
    gpu = load_gpu_benchmark()
    assert gpu.lookup_peaks("NVIDIA H100 80GB HBM3")["matched"] == "H100"
    assert gpu.lookup_peaks("NVIDIA A100-SXM4-80GB")["matched"] == "A100"
    assert gpu.lookup_peaks("NVIDIA A10G")["matched"] == "A10"
    v100 = gpu.lookup_peaks("Tesla V100-SXM2-16GB")
    assert v100["float16"] == 125.0 and v100["bfloat16"] is None
    assert gpu.lookup_peaks("some other accelerator") is None
    assert [gpu.peak_dtype(p, False) for p in gpu.PRECISIONS] == [
        "float32", "bfloat16", "float16"]
    assert gpu.peak_dtype("float32", True) == "tf32"
    args = gpu.parse([])
    assert args.precisions == list(gpu.PRECISIONS) and args.batch == 60
    with pytest.raises(SystemExit):
        gpu.parse(["--precision", "float32,float8"])
    with pytest.raises(SystemExit):
        gpu.parse(["--allow-cpu"])  # wt103_base on a CPU: refused
    assert gpu.parse(["--allow-cpu", "--preset", "tiny"]).allow_cpu


@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
def test_a_mixed_precision_model_evaluates_with_other_settings(precision):
    # evaluate(memory_length=...) copies the model under the float32 global
    # policy: the copy's dropout sublayers must follow the copy's policy (they
    # did not, and their float32 output met float16 hidden states).
    from keras_txl.training.loop import evaluate

    trainer = make_trainer(precision=precision, steps=2)
    trainer.train(corpus())
    same = evaluate(trainer.model, corpus(200))
    shorter = evaluate(trainer.model, corpus(200), memory_length=4)
    assert np.isfinite([same["loss"], shorter["loss"]]).all()


def test_the_replica_xla_step_traces_the_optimizer_update_outside_the_compiled_function(
        monkeypatch):
    # On GPUs ("replica" scope) the forward and backward passes are compiled per
    # replica, the update is not: Keras' step counter is an ONLY_FIRST_REPLICA
    # variable whose update merge_calls, which a compiled replica function
    # cannot do (RuntimeError "merge_call called while defining a new graph",
    # seen on an H100). Tracing is checked here with the GPU test of
    # tensorflow's mirrored_run faked on one CPU replica; the compiled function
    # then fails only where XLA compiles the CPU's collective, which it cannot
    # (tests/test_gpu.py runs the step on a GPU).
    from tensorflow.python.distribute import mirrored_run
    from tensorflow.python.distribute import mirrored_strategy as tf_mirrored

    import keras_txl.training.strategy as strategy_module

    for module in (mirrored_run, tf_mirrored):
        monkeypatch.setattr(module, "_is_gpu_device", lambda device: True)
    monkeypatch.setattr(strategy_module, "all_gpu_devices", lambda devices: True)
    trainer = make_trainer(tf.distribute.MirroredStrategy(["/cpu:0"]), steps=2,
                           jit_compile=True)
    assert trainer.jit_scope == "replica"
    with pytest.raises(tf.errors.OpError, match="Only compiling NCCL/auto collective"):
        trainer.train(corpus())


def test_gpu_benchmark_merges_saved_runs_and_goes_on_past_a_failed_one(tmp_path):
    import json

    from testing import REPO

    gpu = load_gpu_benchmark()
    # The H100 runs of 2026-11-25 (ours and the reference were measured in
    # separate invocations): the medians and ratios come from their lines.
    files = sorted(str(p) for p in (REPO / "benchmarks" / "results").glob("gpu_h100_*.jsonl"))
    records = [json.loads(line) for f in files for line in open(f)]
    runs = gpu.read_runs(files, ["mixed_bfloat16", "float32"], list(gpu.FRAMEWORKS))
    assert sum(len(v) for v in runs.values()) == len(records) == 6
    medians, ratios = gpu.summarize(runs, {"mixed_bfloat16": 989.4, "float32": 66.9}, 1e9)
    by_run = {r["run"]: r for r in records}
    ours, theirs = by_run["keras-xla mixed_bfloat16"], by_run["torch-compiled mixed_bfloat16"]
    assert medians["keras-xla mixed_bfloat16"]["train_tokens_per_s"] == ours["train_tokens_per_s"]
    assert ratios["keras-xla mixed_bfloat16 / torch-compiled"]["eval_tokens_per_s"] == round(
        ours["eval_tokens_per_s"] / theirs["eval_tokens_per_s"], 3)
    assert medians["keras-xla mixed_bfloat16"]["train_mfu"] == round(
        3 * 1e9 * ours["train_tokens_per_s"] / 989.4e12, 4)
    assert "keras float32" not in medians  # not measured: no row, no ratio
    # The H200's runs of 2026-11-26: two rounds of fp32 XLA and torch.compile, whose
    # medians are the means of their two runs, rounded.
    files = sorted(str(p) for p in (REPO / "benchmarks" / "results").glob(
        "gpu_h200_2026-11-26_*.jsonl"))
    runs = gpu.read_runs(files, ["mixed_bfloat16", "float32"], list(gpu.FRAMEWORKS))
    medians, ratios = gpu.summarize(runs, {"mixed_bfloat16": 989.4, "float32": 66.9}, 1e9)
    pair = runs[("keras-xla", "float32")]
    assert medians["keras-xla float32"]["rounds"] == len(pair) == 2
    assert medians["keras-xla float32"]["matmul_tflops_measured"] == round(
        (pair[0]["matmul_tflops_measured"] + pair[1]["matmul_tflops_measured"]) / 2, 3)
    assert medians["keras-xla float32"]["train_tokens_per_s"] == round(
        (pair[0]["train_tokens_per_s"] + pair[1]["train_tokens_per_s"]) / 2, 3)
    # A run that fails is reported and the others go on.
    failed = gpu.run_child("false", "keras", "float32", [], str(tmp_path / "none.npy"))
    assert failed["error"].startswith("exited with 1")
