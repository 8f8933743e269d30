"""The bfloat16 evaluation step with its weights cast every step, or stored in bfloat16.

Under `mixed_bfloat16` the weights are float32 variables that every evaluation step casts
to bfloat16 before its matmuls. This asks whether casting them once per evaluation would
pay: it times the library's evaluation step (`make_eval_step`, `eval_cache`) for a model
under `mixed_bfloat16` and for the same weights in a model under the `"bfloat16"` policy
(weights stored in bfloat16, nothing to cast), alternating the two in every round (medians
of `--rounds` rounds, each the median of `--steps` steps), and reports the largest
difference of their per-token NLL. The config is `throughput.py`'s (6 layers, d 256,
T = M = 128, batch 8) unless changed.

Prints one JSON line with the host block, then a table.

    python benchmarks/eval_weight_casts.py [--rounds 8] [--steps 20]
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
from throughput import BATCH  # noqa: E402
from throughput import CONFIG  # noqa: E402
from xla_isa_cap import cap_xla_kernels  # noqa: E402

POLICIES = ("mixed_bfloat16", "bfloat16")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--memory", type=int, default=CONFIG["memory_length"],
                        help="memory length M (Table 9's A = 800: --memory 672 --layers 4 --batch 1)")
    parser.add_argument("--layers", type=int, default=CONFIG["num_layers"])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--threads", type=int, default=2,
                        help="intra- and inter-op threads (0: leave TensorFlow's setting)")
    parser.add_argument("--no-peak", action="store_true", help="skip the matmul peak")
    args = parser.parse_args(argv)
    for flag, value in (("--batch", args.batch), ("--rounds", args.rounds),
                        ("--steps", args.steps),
                        ("--memory", args.memory), ("--layers", args.layers)):
        if value < 1:
            parser.error(f"{flag} must be >= 1; received {value}")

    import keras
    import numpy as np
    import tensorflow as tf

    cap_xla_kernels()  # XLA's kernels under the oneDNN cap in force (xla_isa_cap.py)

    from keras_txl import TransformerXLCausalLM
    from keras_txl import TransformerXLConfig
    from keras_txl.training.loop import eval_cache
    from keras_txl.training.loop import make_eval_step

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    config = TransformerXLConfig(**{**CONFIG, "memory_length": args.memory,
                                    "num_layers": args.layers})
    B, T = args.batch, config.segment_length
    rng = np.random.default_rng(0)
    ids = rng.integers(0, config.vocabulary_size, size=(B, T + 1)).astype("int32")
    x, y = tf.constant(ids[:, :T]), tf.constant(ids[:, 1:])
    models = {}
    previous = keras.config.dtype_policy()
    try:
        for policy in POLICIES:
            keras.config.set_dtype_policy(policy)
            keras.utils.set_random_seed(0)
            models[policy] = TransformerXLCausalLM(config)
            models[policy](x)  # builds the weights
    finally:
        keras.config.set_dtype_policy(previous)
    for source, target in zip(models[POLICIES[0]].weights, models[POLICIES[1]].weights):
        target.assign(tf.cast(source, target.dtype))
    steps = {p: make_eval_step(m) for p, m in models.items()}
    caches = {p: eval_cache(m, B) for p, m in models.items()}
    nll = {}
    for p in POLICIES:  # trace, then fill the memory
        for _ in range(3):
            out, caches[p] = steps[p](x, y, caches[p])
        nll[p] = out.numpy()

    def round_of(policy):
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            out, caches[policy] = steps[policy](x, y, caches[policy])
            out.numpy()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    seconds = {p: [] for p in POLICIES}
    for r in range(args.rounds):
        for p in (POLICIES if r % 2 == 0 else POLICIES[::-1]):
            seconds[p].append(round_of(p))
    ms = {p: round(1e3 * statistics.median(seconds[p]), 2) for p in POLICIES}
    result = dict(
        bench="eval_weight_casts", batch=B, segment=T, memory=config.memory_length,
        layers=config.num_layers, rounds=args.rounds,
        steps=args.steps, ms_per_step=ms,
        ms_per_step_rounds={p: [round(1e3 * s, 2) for s in seconds[p]] for p in POLICIES},
        stored_bfloat16_speedup=round(ms[POLICIES[0]] / ms[POLICIES[1]], 3),
        nll_max_difference=float(np.abs(nll[POLICIES[0]] - nll[POLICIES[1]]).max()),
        host=host_block(tf, peak=not args.no_peak))
    print(json.dumps(result))
    print(host_line(result["host"]))
    print(f"evaluation step, batch {B}, T {T}, M {config.memory_length}, "
          f"{config.num_layers} layers; medians of {args.rounds} alternating rounds "
          f"of {args.steps} steps")
    print("| weights | ms per step | rounds |")
    print("|---|---:|---|")
    for p, label in zip(POLICIES, ("float32, cast every step (mixed_bfloat16)",
                                   "stored in bfloat16 (bfloat16 policy)")):
        rounds = ", ".join(f"{v:.1f}" for v in result["ms_per_step_rounds"][p])
        print(f"| {label} | {ms[p]:.1f} | {rounds} |")
    print(f"stored bfloat16 / cast every step: {result['stored_bfloat16_speedup']:.3f}x; "
          f"NLL max difference {result['nll_max_difference']:.1e}")


if __name__ == "__main__":
    main()
