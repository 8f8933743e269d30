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
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"
LOCAL_FIXTURES = REPO / "tests" / "fixtures"


def pytest_addoption(parser):
    parser.addoption(
        "--run-large", action="store_true", default=False,
        help="also run tests marked `large` (slow)",
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "large: slow test, run with --run-large")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-large"):
        return
    skip = pytest.mark.skip(reason="slow: run with --run-large")
    for item in items:
        if "large" in item.keywords:
            item.add_marker(skip)


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
