"""The set-up both training loops share: the schedule, the optimizer, the precision."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_txl
from keras_txl.training.config import TrainConfig
from keras_txl.training.optimizers import FusedAdam
from keras_txl.training.optimizers import setup_model_and_optimizer
from keras_txl.training.schedules import learning_rate_schedule


def official_schedule(step, peak, warmup, total, min_ratio):
    """The official code's schedule (train_gpu.py), in float64.

    Linear warm-up `peak * step / warmup`, then
    `tf.train.cosine_decay(peak, step - warmup, total - warmup, alpha=min_ratio)`,
    which holds the floor once `step - warmup` passes the decay steps.
    """
    if step < warmup:
        return peak * step / warmup
    decay = max(total - warmup, 1)
    progress = min(step - warmup, decay) / decay
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return peak * ((1.0 - min_ratio) * cosine + min_ratio)


@pytest.mark.parametrize("peak, warmup, total, min_ratio", [
    (2.5e-4, 0, 200, 0.004),    # no warm-up, the GPU runs' floor
    (2.5e-4, 20, 200, 0.004),   # warm-up
    (1.0, 10, 110, 0.1),
    (1e-3, 7, 50, 0.0),         # down to zero
    (1e-3, 0, 40, 1.0),         # a constant rate
    (0.5, 30, 30, 0.01),        # warm-up over every step: then the floor
])
def test_keras_cosine_decay_is_the_official_schedule_at_every_step(peak, warmup, total,
                                                                   min_ratio):
    schedule = learning_rate_schedule(peak, warmup, total, min_ratio)
    assert isinstance(schedule, keras.optimizers.schedules.CosineDecay)
    steps = np.arange(total + 25)  # past the end too: held at the floor
    ours = np.array([float(schedule(int(s))) for s in steps])
    expected = np.array([official_schedule(int(s), peak, warmup, total, min_ratio)
                         for s in steps])
    # float32 arithmetic against float64: a few ulp of the peak (near the
    # floor, 1 + cos(.) cancels, so the relative error there is larger).
    np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-7 * peak)
    assert ours[0] == (0.0 if warmup else pytest.approx(peak))
    assert ours[-1] == pytest.approx(peak * min_ratio, rel=1e-6)


def test_schedule_landmarks_and_a_graph_step():
    schedule = learning_rate_schedule(1.0, warmup_steps=10, total_steps=110, min_ratio=0.1)
    graph = tf.function(lambda s: schedule(s))  # as the optimizer calls it
    values = [float(graph(tf.constant(s))) for s in (5, 10, 60, 110, 500)]
    np.testing.assert_allclose(values, [0.5, 1.0, 0.1 + 0.9 * 0.5, 0.1, 0.1], rtol=1e-6)


def test_schedule_rejects_a_warmup_past_the_end():
    with pytest.raises(ValueError, match="0 <= warmup_steps <= total_steps.*"
                       "warmup_steps=20, total_steps=10"):
        learning_rate_schedule(1e-3, 20, 10)


MODEL = dict(vocabulary_size=11, num_layers=2, hidden_dim=16, num_heads=2,
             intermediate_dim=32, segment_length=4, memory_length=4)


def test_setup_builds_model_and_fused_adam_from_the_config():
    config = keras_txl.TransformerXLConfig(**MODEL)
    train = TrainConfig(learning_rate=1e-3, warmup_steps=3, steps=20, min_lr_ratio=0.1,
                        clip_norm=0.5, adam_epsilon=1e-6, seed=3)
    strategy = tf.distribute.get_strategy()
    model, optimizer = setup_model_and_optimizer(config, train, strategy)
    assert isinstance(optimizer, FusedAdam) and optimizer.built
    assert optimizer.global_clipnorm == 0.5 and optimizer.epsilon == 1e-6
    schedule = optimizer._learning_rate  # the CosineDecay handed to Keras
    assert float(schedule(3)) == pytest.approx(1e-3)
    assert float(schedule(20)) == pytest.approx(1e-4)
    # The custom loop clips the summed gradients itself.
    _, unclipped = setup_model_and_optimizer(config, train, strategy, clip_gradients=False)
    assert unclipped.global_clipnorm is None
    # clip_norm=0 disables clipping in the optimizer too.
    _, none = setup_model_and_optimizer(config, train.replace(clip_norm=0.0), strategy)
    assert none.global_clipnorm is None
    # The seed fixes the initial weights: the same config gives the same model.
    again, _ = setup_model_and_optimizer(config, train, strategy)
    for a, b in zip(model.trainable_variables, again.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    other, _ = setup_model_and_optimizer(config, train.replace(seed=4), strategy)
    assert not np.array_equal(model.trainable_variables[0].numpy(),
                              other.trainable_variables[0].numpy())


def test_setup_precision_policy_is_used_for_the_model_then_restored():
    config = keras_txl.TransformerXLConfig(**MODEL)
    train = TrainConfig(precision="mixed_bfloat16", steps=10)
    assert keras.mixed_precision.global_policy().name == "float32"
    model, optimizer = setup_model_and_optimizer(config, train, tf.distribute.get_strategy())
    assert keras.mixed_precision.global_policy().name == "float32"
    assert model.dtype_policy.name == "mixed_bfloat16"
    assert model.backbone.blocks[0].compute_dtype == "bfloat16"
    # Variables stay float32, and there is no loss scaling (bfloat16 has
    # float32's exponent range).
    assert {v.dtype for v in model.trainable_variables} == {"float32"}
    assert not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    # The policy is restored even when building fails.
    with pytest.raises(ValueError, match="no_such_argument"):
        setup_model_and_optimizer(config, train, tf.distribute.get_strategy(),
                                  no_such_argument=1)
    assert keras.mixed_precision.global_policy().name == "float32"


@pytest.mark.parametrize("host_choice", ["mixed_bfloat16", "float32"])
def test_precision_auto_follows_the_host(monkeypatch, host_choice):
    from keras_txl.training import optimizers

    # The host's answer (keras_txl.host.auto_precision reads /proc/cpuinfo and
    # the ISA caps; tests/test_host.py covers it) decides "auto" on a CPU.
    monkeypatch.setattr(optimizers, "auto_precision", lambda: host_choice)
    assert optimizers.resolve_precision("auto") == host_choice
    assert optimizers.resolve_precision("float32") == "float32"
    config = keras_txl.TransformerXLConfig(**MODEL)
    model, _ = setup_model_and_optimizer(config, TrainConfig(precision="auto", steps=10),
                                         tf.distribute.get_strategy())
    assert model.dtype_policy.name == host_choice
    assert {v.dtype for v in model.trainable_variables} == {"float32"}


def test_precision_must_be_a_known_policy():
    with pytest.raises(ValueError, match=r"`precision` must be one of \('float32', "
                       r"'mixed_bfloat16', 'mixed_float16', 'auto'\), received 'float16'"):
        TrainConfig(precision="float16", steps=10)


STRATEGY_ERRORS = r"""
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
from keras_txl.training.strategy import get_strategy
out = []
for name, tpu, tf_config in json.loads(sys.argv[1]):
    if tf_config is None:
        os.environ.pop("TF_CONFIG", None)
    else:
        os.environ["TF_CONFIG"] = tf_config
    try:
        get_strategy(name, tpu)
        out.append("no error")
    except ValueError as error:
        out.append(str(error))
print("RESULT " + json.dumps(out))
"""


def test_strategy_errors_name_tf_config_and_the_tpu():
    # TensorFlow's own: "Expecting value: line 1 column 13", "The `task_id` 5
    # exceeds ...", and for --strategy tpu a NotFoundError traceback.
    import json
    import subprocess
    import sys

    from testing import REPO

    cases = [["multi_worker", "", '{"cluster": '],
             ["multi_worker", "", json.dumps({"cluster": {"worker": ["127.0.0.1:1"]},
                                              "task": {"type": "worker", "index": 5}})],
             ["tpu", "local", None]]
    done = subprocess.run([sys.executable, "-c", STRATEGY_ERRORS, json.dumps(cases)],
                          capture_output=True, text=True, timeout=240,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, done.stderr[-3000:]
    bad_json, bad_index, no_tpu = json.loads(line[-1][len("RESULT "):])
    assert bad_json.startswith("TF_CONFIG is not valid JSON")
    assert "could not start from TF_CONFIG (task 'worker' 5" in bad_index
    assert "exceeds the maximum id" in bad_index
    assert no_tpu.startswith("--strategy tpu found no TPU at --tpu 'local'")


CLUSTER_DEADLINE = r"""
import json, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
os.environ["TF_CONFIG"] = sys.argv[1]
from keras_txl.training.strategy import get_strategy
started = time.monotonic()
try:
    get_strategy("multi_worker", "", cluster_timeout=3)
    print("RESULT " + json.dumps(["no error", 0]))
except ValueError as error:
    print("RESULT " + json.dumps([str(error), time.monotonic() - started]))
"""


def test_a_multi_worker_task_whose_peers_never_start_stops_with_an_error():
    # TensorFlow's coordination service waited forever (past 150 s measured)
    # for a task of TF_CONFIG that never started, in the strategy's constructor.
    import json
    import subprocess
    import sys

    from testing import REPO
    from testing import free_ports

    ports = free_ports(4)
    runs = []
    for index, pair in ((0, ports[:2]), (1, ports[2:])):  # the other one never starts
        tf_config = json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in pair]},
                                "task": {"type": "worker", "index": index}})
        runs.append(subprocess.Popen(
            [sys.executable, "-c", CLUSTER_DEADLINE, tf_config], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
            env={**__import__("os").environ, "PYTHONPATH": str(REPO)}))
    results = []
    for run in runs:
        try:
            out, err = run.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            run.kill()
            raise AssertionError("a MultiWorker task waited past --cluster-timeout") from None
        line = [x for x in out.splitlines() if x.startswith("RESULT ")]
        assert line, err[-3000:]
        results.append(json.loads(line[-1][len("RESULT "):]))
    (chief_message, chief_s), (worker_message, worker_s) = results
    assert chief_message == (
        f"--strategy multi_worker (task 'worker' 0 at 127.0.0.1:{ports[0]}): worker 1 did "
        "not join within --cluster-timeout 3 s; start every task of TF_CONFIG's cluster, "
        "or wait longer with --cluster-timeout.")
    assert worker_message.startswith(
        f"--strategy multi_worker (task 'worker' 1 at 127.0.0.1:{ports[3]}): the cluster's "
        "leader, worker 0, did not answer within --cluster-timeout 3 s")
    assert chief_s < 60 and worker_s < 60
    from keras_txl.training.strategy import get_strategy

    for bad in (0, -1, float("nan"), "10"):
        with pytest.raises(ValueError, match=r"`cluster_timeout` must be a number of seconds > 0"):
            get_strategy("multi_worker", cluster_timeout=bad)


def test_a_tpu_address_that_does_not_answer_is_an_error_not_a_hang():
    # TensorFlow's initialize_tpu_system waited past 60 s on a refused local port.
    import socket
    import time

    from keras_txl.training.strategy import _check_tpu_addresses
    from keras_txl.training.strategy import get_strategy

    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(ValueError, match=rf"found no TPU at --tpu 'grpc://127.0.0.1:{port}': "
                                         rf"127.0.0.1:{port} did not accept a connection"):
        get_strategy("tpu", f"grpc://127.0.0.1:{port}")
    assert time.monotonic() - started < 20
    with pytest.raises(ValueError, match=r"expected grpc://HOST:PORT .*received 'grpc://tpu-host'"):
        get_strategy("tpu", "grpc://tpu-host")
    with pytest.raises(ValueError, match=r"received 'grpc://h:99999'"):
        _check_tpu_addresses("grpc://h:99999")
    with socket.socket() as server:  # one that answers passes the check
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        _check_tpu_addresses(f"grpc://127.0.0.1:{server.getsockname()[1]}", timeout=5)
    _check_tpu_addresses("local")  # names are the resolver's
