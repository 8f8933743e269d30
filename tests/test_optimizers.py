"""FusedAdam (TensorFlow's fused kernel) against Keras' own Adam."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from testing import mirrored_strategy

from keras_txl.training.optimizers import FusedAdam
from keras_txl.training.schedules import learning_rate_schedule


def _run(optimizer_cls, strategy, steps=5):
    rng = np.random.default_rng(0)
    start = [rng.normal(size=s).astype("float32") for s in [(4, 3), (3,)]]
    grads = [[rng.normal(size=w.shape).astype("float32") * (k + 1) for w in start]
             for k in range(steps)]
    with strategy.scope():
        variables = [keras.Variable(w) for w in start]
        optimizer = optimizer_cls(
            learning_rate_schedule(1e-2, 2, steps, 0.1), beta_1=0.8, beta_2=0.95, epsilon=1e-6
        )
        optimizer.build(variables)

    @tf.function
    def step(g):
        def replica_fn(g):
            # Every replica holds the full gradient; Keras sums over replicas.
            r = tf.distribute.get_replica_context().num_replicas_in_sync
            optimizer.apply_gradients(zip([x / r for x in g], variables))
        strategy.run(replica_fn, args=(g,))

    for g in grads:
        step([tf.constant(x) for x in g])
    slots = [v.numpy() for v in optimizer.variables if "iteration" not in v.path]
    return [v.numpy() for v in variables], slots, int(optimizer.iterations.numpy())


@pytest.mark.parametrize("use_mirrored", [False, True])
def test_fused_adam_equals_keras_adam(use_mirrored):
    strategy = mirrored_strategy() if use_mirrored else tf.distribute.get_strategy()
    fused, fused_slots, fused_steps = _run(FusedAdam, strategy)
    keras_adam, keras_slots, keras_steps = _run(keras.optimizers.Adam, strategy)
    assert fused_steps == keras_steps == 5
    for a, b in zip(fused + fused_slots, keras_adam + keras_slots):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    # And it moved: not a no-op.
    assert not np.allclose(fused[0], np.random.default_rng(0).normal(size=(4, 3)))


def test_fused_adam_variables_match_keras_adam_names():
    variables = [keras.Variable(np.zeros((2, 2), "float32"), name="w")]
    a, b = FusedAdam(1e-3), keras.optimizers.Adam(1e-3)
    a.build(variables)
    b.build(variables)
    # Same slots in the same order (checkpoints store them by position);
    # the optimizer prefix is Keras' "adam", uniquified per instance.
    def names(opt):
        return [v.path.split("/", 1)[1] for v in opt.variables]

    assert names(a) == names(b) == ["iteration", "learning_rate", "w_momentum", "w_velocity"]
    assert a.name.startswith("adam")


def test_amsgrad_falls_back_to_the_keras_update():
    start = np.ones((3,), "float32")
    results = []
    for cls in (FusedAdam, keras.optimizers.Adam):
        w = keras.Variable(start)
        opt = cls(0.1, amsgrad=True)
        for k in range(3):
            opt.apply_gradients([(tf.constant([1.0, -2.0, 0.5]) * (k + 1), w)])
        results.append(w.numpy())
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6)
