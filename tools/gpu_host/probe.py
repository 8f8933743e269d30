"""On the GPU machine: does TensorFlow see the GPU, multiply on it, XLA-compile there?

Prints one JSON line: TensorFlow's version and import time, the GPUs, a float32 matmul's
device and its largest error against float64 (TF32 off), an XLA-compiled call, a bf16
matmul, and where DeepCopy runs.
"""

import json
import time

t0 = time.time()
import tensorflow as tf  # noqa: E402  (timed)

report = {"tf": tf.__version__, "import_s": round(time.time() - t0, 1)}
gpus = tf.config.list_physical_devices("GPU")
report["gpus"] = [g.name for g in gpus]
if gpus:
    tf.config.experimental.set_memory_growth(gpus[0], True)
    report["details"] = tf.config.experimental.get_device_details(gpus[0])
    tf.config.experimental.enable_tensor_float_32_execution(False)
    a = tf.random.normal((2048, 2048))
    b = tf.random.normal((2048, 2048))
    product = tf.matmul(a, b)
    report["matmul_device"] = product.device
    reference = a.numpy().astype("float64") @ b.numpy().astype("float64")
    report["matmul_max_error"] = float(abs(product.numpy() - reference).max())
    xla = tf.function(lambda x, y: tf.nn.softmax(tf.matmul(x, y)) * 2.0, jit_compile=True)
    report["xla_sum"] = float(tf.reduce_sum(xla(a, b)).numpy())  # 2 x 2048 rows
    half = tf.matmul(tf.cast(a, tf.bfloat16), tf.cast(b, tf.bfloat16))
    report["bf16_device"] = half.device
    # Graph mode copies the value cache with DeepCopy (relative_attention._own_buffer): it
    # must have a GPU kernel for both dtypes, or the placer would move it to the CPU.
    tf.config.set_soft_device_placement(False)
    for dtype in (tf.float32, tf.bfloat16):
        copy = tf.function(lambda x: tf.raw_ops.DeepCopy(x=x) * 2)
        try:
            with tf.device("/GPU:0"):
                out = copy(tf.cast(a, dtype))
            report[f"deepcopy_{dtype.name}"] = out.device
        except Exception as error:  # noqa: BLE001  (reported, not raised)
            report[f"deepcopy_{dtype.name}"] = f"{type(error).__name__}: {error}"[:300]
print(json.dumps(report, default=str))
