"""Test set-up: TF backend, quiet logs, two logical CPUs for MirroredStrategy."""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pathlib  # noqa: E402

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

# Must happen before TF initialises its devices: two logical CPUs let the
# MirroredStrategy tests run on one machine. The default strategy uses one.
_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
)

REPO = pathlib.Path(__file__).resolve().parents[1]
# Reference outputs of Hugging Face's TransfoXL, shipped with the repository so every
# clone runs the parity tests (copied from ../shared/fixtures; see each README.md).
FIXTURES = REPO / "tests" / "fixtures"


@pytest.fixture(autouse=True)
def _seed():
    import keras

    keras.utils.set_random_seed(0)
    yield


_MIRRORED = []


def mirrored_strategy():
    """One MirroredStrategy over the two logical CPUs for the whole session.

    Several MirroredStrategy objects in one process can reuse collective
    instance keys and abort each other's all-reduces ("Shape mismatch in
    the collective instance"), so tests share this one.
    """
    if not _MIRRORED:
        devices = [d.name for d in tf.config.list_logical_devices("CPU")[:2]]
        _MIRRORED.append(tf.distribute.MirroredStrategy(devices))
    return _MIRRORED[0]
