"""`get_strategy(name)`: the tf.distribute strategy for a run."""

import logging

import tensorflow as tf

logger = logging.getLogger(__name__)


def get_strategy(name: str = "default", tpu: str = ""):
    """Returns a strategy.

    Args:
        name: "default", "mirrored" (all local devices; on a CPU-only machine
            with logical CPUs configured, those), "multi_worker" (reads
            TF_CONFIG) or "tpu" (connects to `tpu`, e.g. "local" or a name).
    """
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in gpus] or [
            d.name for d in tf.config.list_logical_devices("CPU")
        ]
        return tf.distribute.MirroredStrategy(devices)
    if name == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    raise ValueError(
        "`strategy` must be one of 'default', 'mirrored', 'multi_worker', "
        f"'tpu', received {name!r}."
    )


def is_chief(strategy) -> bool:
    """Only the chief writes files (checkpoints, logs, exports)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return True
    return resolver.task_type in ("chief", None) or (
        resolver.task_type == "worker" and resolver.task_id == 0
    )
