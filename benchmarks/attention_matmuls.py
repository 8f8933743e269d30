"""The attention's batched matmuls alone, as TensorFlow runs them on this host.

Times the two batched products of one attention layer of the throughput benchmark's
configuration (`benchmarks/throughput.py`: batch 8, 8 heads x 32, T = M = 128, so K = 256
keys): the scores (B*N matrices of (T x H) x (H x K)) and the mixing ((T x K) x (K x H)),
and for comparison one dense product (the feed-forward's (B*T x D) x (D x 4D)),
in graph mode (oneDNN's `_MklBatchMatMulV2`, or Eigen's loop of one gemm per matrix where
TensorFlow's oneDNN kernels are off) and XLA-compiled. This is the product behind the
AVX2 EPYC Zen 3's slow training (docs/benchmarks.md). The host block records whether
TensorFlow's oneDNN kernels are on (`tensorflow_onednn`, TensorFlow's own answer), so
compare:

    TF_ENABLE_ONEDNN_OPTS=0 ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/attention_matmuls.py
    TF_ENABLE_ONEDNN_OPTS=1 ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/attention_matmuls.py

Prints one JSON line (median ms per call of each product and mode, GFLOP/s, the host
block) and a table.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# hostinfo imports keras_txl (its host module) before TensorFlow, as users do.
from hostinfo import host_block  # noqa: E402
from hostinfo import host_line  # noqa: E402
from xla_isa_cap import cap_xla_kernels  # noqa: E402


def median_ms(fn, args, calls):
    for _ in range(5):
        fn(*args).numpy()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(*args).numpy()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--queries", type=int, default=128, help="T")
    parser.add_argument("--keys", type=int, default=256, help="K = M + T")
    parser.add_argument("--hidden", type=int, default=256, help="D (the dense product)")
    parser.add_argument("--inner", type=int, default=1024,
                        help="the feed-forward's inner width (the dense product)")
    parser.add_argument("--calls", type=int, default=50, help="timed calls (median)")
    parser.add_argument("--threads", type=int, default=2,
                        help="intra- and inter-op threads (0: leave TensorFlow's setting)")
    parser.add_argument("--no-peak", action="store_true", help="skip the matmul peak")
    args = parser.parse_args(argv)

    import tensorflow as tf

    cap_xla_kernels()  # XLA's kernels under the oneDNN cap in force (xla_isa_cap.py)

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    b, n, h, t, k = args.batch, args.heads, args.head_dim, args.queries, args.keys
    q = tf.random.normal([b, n, t, h])
    keys = tf.random.normal([b, n, h, k])
    probs = tf.nn.softmax(tf.random.normal([b, n, t, k]))
    values = tf.random.normal([b, n, k, h])
    # The feed-forward's first product, for the dense rate beside the batched one.
    inputs = tf.random.normal([b * t, args.hidden])
    kernel = tf.random.normal([args.hidden, args.inner])
    batched = 2 * b * n * t * h * k  # the same for both attention products
    results = {}
    for product, operands, flops in (("scores", (q, keys), batched),
                                     ("mixing", (probs, values), batched),
                                     ("dense", (inputs, kernel),
                                      2 * b * t * args.hidden * args.inner)):
        for mode, jit in (("graph", False), ("xla", True)):
            fn = tf.function(lambda x, y: tf.matmul(x, y), jit_compile=jit)
            ms = median_ms(fn, operands, args.calls)
            results[f"{product}_{mode}"] = {"ms": round(ms, 3),
                                            "gflops": round(flops / ms / 1e6, 1)}
    host = host_block(tf, peak=not args.no_peak)
    print(json.dumps(dict(bench="attention_matmuls", shape=dict(
        batch=b, heads=n, head_dim=h, queries=t, keys=k), calls=args.calls,
        results=results, host=host)))
    print(host_line(host))
    print(f"tensorflow_onednn: {host['tensorflow_onednn']}; {b * n} matrices of "
          f"({t} x {h}) x ({h} x {k}) and ({t} x {k}) x ({k} x {h}); dense "
          f"({b * t} x {args.hidden}) x ({args.hidden} x {args.inner})")
    print(f"{'product':<10}{'mode':<8}{'ms (median)':>14}{'GFLOP/s':>10}")
    for name, r in results.items():
        product, mode = name.split("_")
        print(f"{product:<10}{mode:<8}{r['ms']:>14.3f}{r['gflops']:>10.1f}")


if __name__ == "__main__":
    main()
