"""The accelerator path on an NVIDIA GPU: equal results, not speed.

Skipped where TensorFlow sees no GPU (CI's hosts); run them on a GPU host with
`NVIDIA_TF32_OVERRIDE=0 pytest tests/test_gpu.py` (float32 matmuls stay float32,
so the float32 comparisons hold to 1e-5). They check what the CPU suite cannot:

- the training step XLA-compiles per replica under `MirroredStrategy` over GPUs
  (`jit_compile_scope` "replica", no warning) and gives the default strategy's
  losses;
- mixed_float16 with loss scaling and mixed_bfloat16 train on the GPU close to
  float32, XLA-compiled or not;
- evaluation on the GPU (graph mode with its XLA-fused element-wise kernels, and
  whole-step XLA) equals the CPU's;
- `precision="auto"` follows the GPU's compute capability.
"""

import logging
from functools import partial

import numpy as np
import pytest
import tensorflow as tf
from testing import tiny_config

import keras_txl

GPUS = tf.config.list_physical_devices("GPU")
pytestmark = pytest.mark.skipif(not GPUS, reason="TensorFlow sees no GPU")

V = 40
model_config = partial(tiny_config, vocabulary_size=V, hidden_dim=16, intermediate_dim=32,
                       segment_length=8, memory_length=8, dropout=0.0, init_std=0.02)
# As tests/test_mixed_float16.py: four float16 roundings over 6 Adam steps.
HALF_RTOL = {"mixed_float16": 2e-3, "mixed_bfloat16": 2e-2}


@pytest.fixture(autouse=True)
def _no_tf32():
    # TensorFlow runs float32 matmuls as TF32 on Ampere and newer by default
    # (10-bit mantissa): the float32 comparisons below need true float32.
    previous = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    yield
    tf.config.experimental.enable_tensor_float_32_execution(previous)


def corpus(n=3000, seed=0):
    return np.random.default_rng(seed).integers(0, V, n).astype("int32")


def trainer(strategy=None, model_changes=None, **changes):
    from keras_txl.training.config import TrainConfig
    from keras_txl.training.loop import Trainer

    base = dict(batch_size=4, steps=6, learning_rate=3e-3, warmup_steps=2, log_every=1,
                checkpoint_every=0, clip_norm=0.25)
    base.update(changes)
    return Trainer(model_config(**(model_changes or {})), TrainConfig(**base),
                   strategy or tf.distribute.get_strategy(), verbose=False)


def gpu_mirrored():
    """One MirroredStrategy over every GPU for the session (see testing.mirrored_strategy)."""
    if not _MIRRORED:
        _MIRRORED.append(tf.distribute.MirroredStrategy(
            [f"/gpu:{i}" for i in range(len(GPUS))]))
    return _MIRRORED[0]


_MIRRORED = []


def test_the_model_runs_on_the_gpu():
    model = keras_txl.TransformerXLCausalLM(model_config())
    model(np.zeros((2, 8), "int32"))
    assert "GPU" in model.trainable_variables[0].value.device.upper()


def test_mirrored_on_gpus_xla_compiles_per_replica_and_equals_the_default_strategy(caplog):
    tokens = corpus()
    one = trainer(steps=3, jit_compile=True)
    assert one.jit_scope == "step"
    expected = one.train(tokens)
    with caplog.at_level(logging.WARNING, logger="keras_txl.training.loop"):
        mirrored = trainer(gpu_mirrored(), steps=3, jit_compile=True)
    assert mirrored.jit_scope == "replica"
    assert "jit_compile is not used" not in caplog.text
    losses = mirrored.train(tokens)
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    # And both equal the step that is not compiled.
    np.testing.assert_allclose(trainer(steps=3).train(tokens), expected, rtol=1e-5)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
def test_half_precision_trains_on_the_gpu_close_to_float32(precision, jit):
    tokens = corpus()
    f32 = trainer(jit_compile=jit).train(tokens)
    half = trainer(jit_compile=jit, precision=precision)
    losses = half.train(tokens)
    assert np.all(np.isfinite(losses))
    np.testing.assert_allclose(losses, f32, rtol=HALF_RTOL[precision])
    assert int(half.optimizer.iterations.numpy()) == 6
    assert half.memory_numpy().dtype == np.float32
    if precision == "mixed_float16":
        assert half.loss_scale_skips == 0
        assert half.history[-1]["loss_scale"] == 32768.0


@pytest.mark.parametrize("jit", [False, True])
def test_evaluation_on_the_gpu_equals_the_cpu(jit):
    from keras_txl.training.loop import evaluate

    tokens = corpus(403, seed=3)
    changes = {"cutoffs": (10, 20), "div_val": 2}
    with tf.device("/CPU:0"):
        cpu_model = keras_txl.TransformerXLCausalLM(model_config(**changes))
        cpu_model(np.zeros((1, 8), "int32"))
        expected = evaluate(cpu_model, tokens, batch_size=2, jit_compile=False)
    gpu_model = keras_txl.TransformerXLCausalLM(model_config(**changes))
    gpu_model(np.zeros((1, 8), "int32"))
    gpu_model.set_weights(cpu_model.get_weights())
    assert "GPU" in gpu_model.trainable_variables[0].value.device.upper()
    result = evaluate(gpu_model, tokens, batch_size=2, jit_compile=jit)
    assert result["tokens"] == expected["tokens"] == 400
    np.testing.assert_allclose(result["loss"], expected["loss"], rtol=1e-5)


@pytest.mark.parametrize("tails", ["buckets", "chunks"])
def test_xla_training_on_the_gpu_equals_graph_mode_with_an_adaptive_softmax(tails, monkeypatch):
    # Under XLA the tail clusters' rows are static: small tails in buckets
    # (nested conds), large ones in chunks (a while loop with a run-time trip
    # count); here every tail takes the path named.
    from keras_txl import adaptive

    if tails == "chunks":
        monkeypatch.setattr(adaptive, "_BUCKETED_LOGITS_MAX", -1)
    tokens = corpus()
    changes = {"cutoffs": (10, 20), "div_val": 2}
    expected = trainer(model_changes=changes).train(tokens)
    losses = trainer(model_changes=changes, jit_compile=True).train(tokens)
    np.testing.assert_allclose(losses, expected, rtol=1e-5)


def test_auto_precision_follows_this_gpus_compute_capability():
    from keras_txl.host import gpu_auto_precision
    from keras_txl.training.optimizers import resolve_precision

    capability = tf.config.experimental.get_device_details(GPUS[0]).get("compute_capability")
    assert resolve_precision("auto") == gpu_auto_precision(capability)
