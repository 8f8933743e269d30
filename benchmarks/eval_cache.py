"""The evaluation step with and without the memory in its key/value cache.

`make_eval_step` carries a key/value cache from segment to segment. A cache from
`build_cache(keep_memory=True)` (what generation uses, so that it can return the memory)
also slides the memory itself, each layer's (B, M, D) float32 states, through every step;
evaluation's own cache (`keras_txl.training.loop.eval_cache`, `keep_memory=False`) holds
the keys and values alone. This times the library's evaluation step with each cache, at
the Table 9 model of `eval_speedup.py` (4 layers, d 256, T 128, batch 1) and the memory
lengths given, alternating the two in every round (medians of `--rounds` rounds, each the
median of `--steps` steps), and checks that both give the same NLL.

Prints one JSON line with the host block, then a table.

    python benchmarks/eval_cache.py [--memory 1800,2800,3800] [--precision auto]
        [--rounds 9] [--steps 15] [--jit auto|on|off]
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# hostinfo imports keras_txl (its host module) before TensorFlow, as users do.
from hostinfo import host_block  # noqa: E402
from hostinfo import host_line  # noqa: E402
from xla_isa_cap import cap_xla_kernels  # noqa: E402

CACHES = ("keep_memory", "eval_cache")


def parse_lengths(text):
    try:
        lengths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        lengths = []
    return lengths if lengths and min(lengths) >= 1 else None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memory", default="1800,2800,3800",
                        help="comma-separated memory lengths M")
    parser.add_argument("--segment", type=int, default=128, help="T")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256, help="d (heads of 32)")
    parser.add_argument("--precision", default="auto",
                        choices=("float32", "mixed_bfloat16", "auto"))
    parser.add_argument("--jit", default="auto", choices=("auto", "on", "off"),
                        help="the step's jit_compile (auto: as evaluation picks it)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=15, help="timed steps per round")
    parser.add_argument("--threads", type=int, default=2,
                        help="intra- and inter-op threads (0: leave TensorFlow's setting)")
    parser.add_argument("--no-peak", action="store_true", help="skip the matmul peak")
    args = parser.parse_args(argv)
    lengths = parse_lengths(args.memory)
    if lengths is None:
        parser.error("--memory must be comma-separated positive integers, e.g. 1800,2800; "
                     f"received {args.memory!r}")
    for flag, value in (("--segment", args.segment), ("--batch", args.batch),
                        ("--layers", args.layers), ("--rounds", args.rounds),
                        ("--steps", args.steps)):
        if value < 1:
            parser.error(f"{flag} must be >= 1; received {value}")
    if args.hidden < 32 or args.hidden % 32:
        parser.error(f"--hidden must be a positive multiple of 32; received {args.hidden}")

    import keras
    import numpy as np
    import tensorflow as tf

    cap_xla_kernels()  # XLA's kernels under the oneDNN cap in force (xla_isa_cap.py)

    from keras_txl import TransformerXLCausalLM
    from keras_txl import TransformerXLConfig
    from keras_txl import host
    from keras_txl.training.loop import eval_cache
    from keras_txl.training.loop import eval_jit_compile
    from keras_txl.training.loop import make_eval_step

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    precision = host.auto_precision() if args.precision == "auto" else args.precision
    keras.config.set_dtype_policy(precision)
    keras.utils.set_random_seed(0)
    B, T = args.batch, args.segment
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 256, size=(B, T + 1)).astype("int32")
    x, y = tf.constant(ids[:, :T]), tf.constant(ids[:, 1:])
    jit = {"auto": "auto", "on": True, "off": False}[args.jit]
    results = []
    for M in lengths:
        model = TransformerXLCausalLM(TransformerXLConfig(
            vocabulary_size=256, cutoffs=(), num_layers=args.layers, hidden_dim=args.hidden,
            num_heads=args.hidden // 32, head_dim=32, intermediate_dim=4 * args.hidden,
            dropout=0.0, memory_length=M, segment_length=T))
        step = make_eval_step(model, jit_compile=jit)
        memory = tf.random.normal(model.memory_shape(B))
        caches = {"keep_memory": model.build_cache(memory, segment_length=T),
                  "eval_cache": eval_cache(model, B, T, memory=memory)}
        first = {name: step(x, y, cache)[0].numpy() for name, cache in caches.items()}

        def round_of(name, steps):
            cache, times = caches[name], []
            for _ in range(steps):
                start = time.perf_counter()
                nll, cache = step(x, y, cache)
                nll.numpy()
                times.append(time.perf_counter() - start)
            return statistics.median(times)

        for name in CACHES:
            round_of(name, 2)
        seconds = {name: [] for name in CACHES}
        for r in range(args.rounds):
            for name in (CACHES if r % 2 == 0 else CACHES[::-1]):
                seconds[name].append(round_of(name, args.steps))
        row = dict(memory=M, keys=M + T, jit_compile=eval_jit_compile(model, jit),
                   nll_max_difference=float(np.abs(first["keep_memory"]
                                                   - first["eval_cache"]).max()))
        for name in CACHES:
            row[f"{name}_ms_per_token"] = round(
                1e3 * statistics.median(seconds[name]) / (B * T), 4)
            row[f"{name}_ms_per_token_rounds"] = [round(1e3 * s / (B * T), 4)
                                                  for s in seconds[name]]
        row["speedup"] = round(row["keep_memory_ms_per_token"]
                               / row["eval_cache_ms_per_token"], 3)
        results.append(row)
    block = host_block(tf, peak=not args.no_peak)
    print(json.dumps(dict(bench="eval_cache", precision=precision, batch=B, segment=T,
                          layers=args.layers, hidden=args.hidden, rounds=args.rounds,
                          steps=args.steps, results=results, host=block)))
    print(host_line(block))
    print(f"{precision}, {args.layers} layers, d {args.hidden}, batch {B}, T {T}; medians of "
          f"{args.rounds} alternating rounds of {args.steps} steps")
    print("| M | XLA | ms/token, cache keeping the memory | ms/token, eval_cache | speed-up |"
          " NLL max difference |")
    print("|---:|---|---:|---:|---:|---:|")
    for row in results:
        print(f"| {row['memory']:,} | {row['jit_compile']} | "
              f"{row['keep_memory_ms_per_token']:.4f} | {row['eval_cache_ms_per_token']:.4f} | "
              f"{row['speedup']:.3f}x | {row['nll_max_difference']:.1e} |")


if __name__ == "__main__":
    main()
