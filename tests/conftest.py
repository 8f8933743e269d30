"""Test set-up: TF backend, quiet logs, two logical CPUs for MirroredStrategy.

Only pytest's hooks and fixtures live here; the helpers tests import are in
`testing.py` (`from testing import ...`).
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest  # noqa: E402

from keras_txl.host import prefer_tensorflow_onednn  # noqa: E402

# Before TensorFlow, as in a user's script that imports keras_txl first: TensorFlow's
# oneDNN kernels on where its own default leaves them off. (Importing keras_txl already
# did it; the call keeps the order explicit.)
prefer_tensorflow_onednn()

import tensorflow as tf  # noqa: E402

# Must happen before TF initialises its devices: two logical CPUs let the
# MirroredStrategy tests run on one machine (`testing.mirrored_strategy`).
# The default strategy uses one.
_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
)


@pytest.fixture(autouse=True)
def _seed():
    import keras

    keras.utils.set_random_seed(0)
    yield
