"""`get_strategy(name)`: the tf.distribute strategy for a run."""

import logging

import tensorflow as tf

logger = logging.getLogger(__name__)


# Seconds a MultiWorker task waits for every task of TF_CONFIG to join.
CLUSTER_TIMEOUT_S = 600.0


def get_strategy(name: str = "default", tpu: str = "",
                 cluster_timeout: float = CLUSTER_TIMEOUT_S):
    """Returns a strategy.

    Args:
        name: "default", "mirrored" (all local devices; on a CPU-only machine
            with logical CPUs configured, those), "multi_worker" (reads
            TF_CONFIG) or "tpu" (connects to `tpu`, e.g. "local" or a name).
        cluster_timeout: "multi_worker" only: the seconds to wait for every
            task of TF_CONFIG to join; past them the strategy is an error
            naming the tasks that did not (TensorFlow waited forever).
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
        from keras_txl.checks import finite_number

        cluster_timeout = finite_number("cluster_timeout", cluster_timeout,
                                        expected="a number of seconds > 0")
        if cluster_timeout <= 0:
            raise ValueError("`cluster_timeout` must be a number of seconds > 0. "
                             f"Received: cluster_timeout={cluster_timeout!r}.")
        where = _tf_config_task()
        leader = None
        try:
            leader = _configure_cluster_deadline(cluster_timeout)
            return tf.distribute.MultiWorkerMirroredStrategy()
        except tf.errors.DeadlineExceededError as error:
            missing = _stragglers(str(error))
            if missing:
                what = f"{', '.join(missing)} did not join"
            elif leader and "RegisterTask" in str(error):
                what = f"the cluster's leader, {leader}, did not answer"
            else:
                what = "not every task of TF_CONFIG joined"
            raise ValueError(
                f"--strategy multi_worker ({where}): {what}"
                f" within --cluster-timeout {cluster_timeout:g} s; start every "
                "task of TF_CONFIG's cluster, or wait longer with --cluster-timeout."
            ) from None
        except (ValueError, KeyError, tf.errors.OpError) as error:
            # TensorFlow's own messages ("Could not start gRPC server", "task_id
            # 5 exceeds ...") name neither TF_CONFIG nor the address.
            raise ValueError(
                f"--strategy multi_worker could not start from TF_CONFIG ({where}): "
                f"{_first_line(error)}") from None
    if name == "tpu":
        _check_tpu_addresses(tpu)
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
        except (ValueError, RuntimeError, tf.errors.OpError) as error:
            raise ValueError(
                f"--strategy tpu found no TPU at --tpu {tpu or 'local'!r}: "
                f"{_first_line(error)}") from None
        return tf.distribute.TPUStrategy(resolver)
    raise ValueError(
        "`strategy` must be one of 'default', 'mirrored', 'multi_worker', "
        f"'tpu', received {name!r}."
    )


# Seconds a plain TCP connect to a --tpu grpc:// address may take.
TPU_CONNECT_TIMEOUT_S = 30.0


def _check_tpu_addresses(tpu, timeout=None):
    """Tries each `grpc://HOST:PORT` of `tpu` (comma-separated) with a TCP connect.

    TensorFlow's `initialize_tpu_system` waits without a deadline for an address that
    does not answer (measured with TF 2.21: a refused port on 127.0.0.1 still hung
    past 60 s, and SIGTERM did not stop it), so a mistyped address would hang the run.
    Names ("local", a Cloud TPU name) are left to the resolver.
    """
    import socket

    timeout = TPU_CONNECT_TIMEOUT_S if timeout is None else timeout
    for entry in str(tpu).split(","):
        entry = entry.strip()
        if not entry.startswith("grpc://"):
            continue
        host, sep, port = entry[len("grpc://"):].rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"--tpu {tpu!r}: expected grpc://HOST:PORT (e.g. grpc://10.0.0.2:8470), "
                f"received {entry!r}.")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                pass
        except OSError as error:
            raise ValueError(
                f"--strategy tpu found no TPU at --tpu {tpu!r}: {host}:{port} did not "
                f"accept a connection within {timeout:g} s ({error or type(error).__name__})."
                " TensorFlow would wait for it forever.") from None


def _configure_cluster_deadline(seconds):
    """Sets up TensorFlow's coordination service the way
    MultiWorkerMirroredStrategy would (same leader, same coordinated jobs;
    it leaves an already configured service alone), with a deadline for the
    cluster to form.

    Why by hand: the strategy configures the service with no deadline, and
    `configure_coordination_service` cannot ask for the one that works. Its
    `cluster_register_timeout_in_ms` alone was not enforced here (a worker
    whose peer never started still waited after the deadline, in
    `TFE_EnableCollectiveOps`); with the config's `cluster_register_with_barrier`
    set, every task waits at a registration barrier with that deadline and
    fails with DeadlineExceededError naming the tasks that did not arrive.
    A peer that dies after joining is found by the service's heartbeats
    (about 10 s, measured) either way.

    Returns the leader task ("worker 0"), or None where nothing was set up.
    """
    import re

    from tensorflow.python.eager import context

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    cluster = resolver.cluster_spec()
    jobs = [job for job in ("chief", "worker") if job in cluster.jobs]
    if resolver.task_type not in jobs or context.context().coordination_service:
        return None  # the strategy's own rules: nothing to coordinate, or done
    try:
        from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2 as pb
    except ImportError:  # another TensorFlow layout: keep TensorFlow's (no deadline)
        logger.warning("This TensorFlow has no coordination config where keras-txl "
                       "looks for it: --cluster-timeout is not applied.")
        return None
    from tensorflow.python.distribute import multi_worker_util

    leader = multi_worker_util.coordination_leader(cluster)  # the strategy's choice
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=leader,
        coordinated_jobs=[pb.CoordinatedJob(name=job, num_tasks=cluster.num_tasks(job))
                          for job in jobs],
        cluster_register_timeout_in_ms=int(seconds * 1000),
    )
    config = getattr(context.context(), "_coordination_service_config", None)
    if config is None or not hasattr(config, "cluster_register_with_barrier"):
        logger.warning("This TensorFlow's coordination service takes no registration "
                       "barrier: --cluster-timeout may not be applied.")
        return None
    config.cluster_register_with_barrier = True
    job, task = re.search(r"/job:(\w+)/replica:\d+/task:(\d+)", leader).groups()
    return f"{job} {task}"


def _stragglers(message):
    """The tasks a registration barrier's DeadlineExceededError names as
    timed out ("/job:worker/replica:0/task:1" -> "worker 1"): the lines
    after "timed out task names:", up to the first empty one."""
    import re

    tail = message.split("timed out task names:", 1)
    names = tail[1].split("\n\n", 1)[0] if len(tail) > 1 else ""
    found = re.findall(r"/job:(\w+)/replica:\d+/task:(\d+)", names)
    return list(dict.fromkeys(f"{job} {task}" for job, task in found))


def _first_line(error):
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:400]


def _tf_config_task():
    """This worker's task and address in TF_CONFIG, for messages; a
    ValueError naming TF_CONFIG when it is not a JSON object (TensorFlow
    says only "Expecting value: line 1 column 13")."""
    import json
    import os

    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return "not set: one worker"
    try:
        config = json.loads(raw)
        if not isinstance(config, dict):
            raise ValueError(f"a JSON {type(config).__name__}, not an object")
    except ValueError as error:
        raise ValueError(
            f"TF_CONFIG is not valid JSON ({error}): expected "
            '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", '
            '"index": 0}}.') from None
    task = config.get("task") or {}
    kind, index = task.get("type"), task.get("index")
    try:
        address = config["cluster"][kind][index]
    except (KeyError, IndexError, TypeError):
        address = "no such address in its cluster"
    return f"task {kind!r} {index!r} at {address}"


def is_chief(strategy) -> bool:
    """Only the chief writes files (checkpoints, logs, exports)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return True
    return resolver.task_type in ("chief", None) or (
        resolver.task_type == "worker" and resolver.task_id == 0
    )


def all_gpu_devices(devices) -> bool:
    """True when every device name in `devices` is a GPU (and there is one).

    `devices`: device strings such as "/job:localhost/replica:0/task:0/
    device:GPU:0" (a strategy's `extended.worker_devices`).
    """
    devices = list(devices)
    return bool(devices) and all(
        (tf.DeviceSpec.from_string(d).device_type or "").upper() == "GPU"
        for d in devices
    )


def jit_compile_scope(strategy_kind: str, devices) -> str:
    """Where the training step is XLA-compiled with `jit_compile=True`.

    A pure function of the strategy's kind and its replicas' devices (so it
    is testable without the hardware):

    - "step": the whole step, `strategy.run` included (the default strategy,
      one device; TPUStrategy, whose step XLA compiles anyway);
    - "replica": the function passed to `strategy.run`, once per replica.
      Mirrored and MultiWorkerMirrored on GPUs only: TensorFlow then drops
      `merge_call` inside the compiled function and all-reduces with NCCL
      collectives (`MirroredStrategy._use_merge_call`: "only ... when XLA
      is used to compile the `fn` passed to `strategy.run` and all devices
      are GPU"); Keras' `fit` compiles at the same place;
    - "none": Mirrored or MultiWorkerMirrored with a CPU replica, where XLA
      cannot reach the other replicas' variables (shared/TF_NOTES.md
      section 2).

    Args:
        strategy_kind: "default", "mirrored", "multi_worker" or "tpu"
            (`TrainConfig.strategy`; `strategy_kind_of(strategy)`).
        devices: the replicas' device strings.
    """
    if strategy_kind in ("mirrored", "multi_worker"):
        return "replica" if all_gpu_devices(devices) else "none"
    return "step"


def resolve_jit_compile(jit_compile, strategy) -> bool:
    """`TrainConfig.jit_compile` (True, False or "auto") for a live strategy.

    "auto" is XLA where the step runs on accelerators: a TPUStrategy; Mirrored
    or MultiWorkerMirrored whose replicas are all GPUs; the default strategy
    where TensorFlow sees a GPU (its ops go to the first one). On CPUs it is
    off: XLA made the CPU training step slower (docs/benchmarks.md), while on
    an H100 it trained 2.35x faster than graph mode.
    """
    if jit_compile != "auto":
        return bool(jit_compile)
    kind = strategy_kind_of(strategy)
    if kind == "tpu":
        return True
    if kind in ("mirrored", "multi_worker"):
        return all_gpu_devices(strategy.extended.worker_devices)
    return bool(tf.config.list_logical_devices("GPU"))


def strategy_kind_of(strategy) -> str:
    """The `jit_compile_scope` kind of a strategy object."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "multi_worker"
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        return "mirrored"
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return "tpu"
    return "default"


def strategy_jit_scope(strategy) -> str:
    """`jit_compile_scope` of a live strategy (its `extended.worker_devices`)."""
    kind = strategy_kind_of(strategy)
    devices = (strategy.extended.worker_devices
               if kind in ("mirrored", "multi_worker") else ())
    return jit_compile_scope(kind, devices)
