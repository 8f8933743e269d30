"""Evaluation speed-up of Transformer-XL over a vanilla Transformer (the paper's Table 9).

The vanilla Transformer evaluated as Al-Rfou et al. (2018) do: every predicted token gets a
fresh window of the A tokens before it, so each token costs one forward pass over A tokens
(only the last position's softmax is needed). Transformer-XL reuses its memory: a segment of
T tokens with a memory of M = A - T cached states (every token attends to at most A keys)
costs one forward pass of T tokens (the library's evaluation step: the memory is carried as its
key/value cache); per token, that time / T. Same model size for both
(default: 4 layers, d 256, 8 heads x 32, d_inner 1024, byte vocabulary 256), batch 1,
random weights (speed does not depend on them), fp32 (`--precision mixed_bfloat16` or `auto`
runs both models under that Keras policy instead). The vanilla forward runs in graph mode
(XLA was slower for it: 596 against 481 ms per token at A = 2,800); XL runs the evaluation
step as the library compiles it (`make_eval_step`'s default, "auto": XLA from 512 keys on;
`--xl-jit on|off` forces it). `--jit` XLA-compiles both.

Also times XL with M = A (the paper's "attention length" is the memory length, T = 128:
enwik8 evaluates with T = 128, M = 3,800) and prints the ratio of counted matmul FLOPs.

Each of `--runs` runs times the vanilla window (median of `--repeats` passes) and then the XL
segment (median of `--xl-repeats`); the reported ratio is the median of the runs' ratios.
Prints one JSON line (`speedup`: attention length -> measured ratio; `host`: the CPU, its ISA
and TensorFlow's matmul peak, `benchmarks/hostinfo.py`) and a table;
`--plot PATH` draws measured, FLOP-predicted and the paper's ratios.

    python benchmarks/eval_speedup.py [--lengths 800 1800 2800 3800] [--segment 128]
        [--runs 3] [--repeats 5] [--jit] [--precision float32] [--plot docs/eval_speedup.png]
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hostinfo import host_block  # noqa: E402
from hostinfo import host_line  # noqa: E402
from xla_isa_cap import cap_xla_kernels  # noqa: E402

PAPER = {800: 363, 1800: 773, 2800: 1409, 3800: 1874}
MODEL = dict(vocabulary_size=256, num_layers=4, hidden_dim=256, num_heads=8, head_dim=32,
             intermediate_dim=1024, dropout=0.0, attention_dropout=0.0)


def forward_flops(cfg, queries, keys, relative, scored, cached=False):
    """Matmul FLOPs of one forward pass: `queries` new tokens attending to `keys` keys
    (multiply-add = 2); `scored` positions go through the softmax layer. With `cached`,
    the memory's keys/values and `W_R R` come from the key/value cache (only the new
    positions are projected)."""
    projected = queries if cached else keys
    D, L = cfg["hidden_dim"], cfg["num_layers"]
    I, V = cfg["intermediate_dim"], cfg["vocabulary_size"]
    NH = cfg["num_heads"] * cfg["head_dim"]
    per_layer = (
        2 * queries * D * NH  # q
        + 2 * projected * D * 2 * NH  # k, v (the paper's code re-projects the memory)
        + 2 * queries * keys * NH * (2 if relative else 1)  # content (+ position) scores
        + 2 * queries * keys * NH  # weighted values
        + 2 * queries * NH * D  # output projection
        + 2 * 2 * queries * D * I  # feed-forward
    )
    if relative and not cached:
        per_layer += 2 * keys * D * NH  # W_R R over the key positions
    return L * per_layer + 2 * scored * D * V


def median_seconds(fn, args, warmup, repeats):
    for _ in range(warmup):
        fn(*args).numpy()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args).numpy()  # waits for the result
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=sorted(PAPER))
    parser.add_argument("--segment", type=int, default=128, help="XL segment length T")
    parser.add_argument("--layers", type=int, default=MODEL["num_layers"])
    parser.add_argument("--hidden", type=int, default=MODEL["hidden_dim"])
    parser.add_argument("--repeats", type=int, default=5, help="timed vanilla passes")
    parser.add_argument("--xl-repeats", type=int, default=20, help="timed XL segments")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3,
                        help="alternating vanilla/XL runs; the median ratio is reported")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--jit", action="store_true", help="XLA-compile both forwards")
    parser.add_argument("--xl-jit", default="auto", choices=["auto", "on", "off"],
                        help="XLA for XL's evaluation step (default: the library's, auto)")
    parser.add_argument("--precision", default="float32",
                        choices=["float32", "mixed_bfloat16", "auto"],
                        help="both models' Keras policy (auto: keras_txl.host.auto_precision())")
    parser.add_argument("--plot", default=None, help="write a PNG here")
    parser.add_argument("--no-peak", action="store_true", help="skip the matmul peak")
    args = parser.parse_args(argv)
    if args.precision == "auto":
        from keras_txl.host import auto_precision

        args.precision = auto_precision()

    import numpy as np
    import tensorflow as tf

    cap_xla_kernels()  # XLA's kernels under the oneDNN cap in force (xla_isa_cap.py)

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import keras

    from keras_txl import TransformerXLCausalLM
    from keras_txl import TransformerXLConfig
    from keras_txl.training.loop import eval_cache
    from keras_txl.training.loop import eval_jit_compile
    from keras_txl.training.loop import make_eval_step

    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy(args.precision)
    cfg = dict(MODEL, num_layers=args.layers, hidden_dim=args.hidden,
               num_heads=args.hidden // 32, head_dim=32, intermediate_dim=4 * args.hidden)
    T = args.segment
    vanilla = TransformerXLCausalLM(TransformerXLConfig(
        **cfg, attention_type="vanilla", memory_length=0, segment_length=T))
    rng = np.random.default_rng(0)

    @tf.function(jit_compile=args.jit, reduce_retracing=True)
    def vanilla_token(ids):
        # One Al-Rfou prediction: the whole window, the softmax at its last position.
        hidden, _ = vanilla.backbone(ids, None, training=False)
        return vanilla.log_probs_from_hidden(hidden[:, -1:])

    rows = []
    for A in args.lengths:
        ids = tf.constant(rng.integers(0, 256, size=(1, A)), tf.int32)
        row = {"attention_length": A}
        steps = {}
        for label, memory in (("", A - T), ("_memory_equals_attention", A)):
            xl = TransformerXLCausalLM(TransformerXLConfig(
                **cfg, attention_type="relative", memory_length=memory, segment_length=T))

            # The library's evaluation step: every position scored, the memory
            # carried as its key/value cache (the new cache is an output too).
            xl_jit = True if args.jit else {"auto": "auto", "on": True,
                                            "off": False}[args.xl_jit]
            xl_jit = eval_jit_compile(xl, xl_jit)
            eval_step = make_eval_step(xl, jit_compile=xl_jit)
            row[f"xl_jit_compile{label}"] = xl_jit

            def xl_segment(ids, targets, cache, eval_step=eval_step):
                nll, new_cache = eval_step(ids, targets, cache)
                return nll  # (the new cache is computed: it is an output)

            seg = tf.constant(rng.integers(0, 256, size=(1, T + 1)), tf.int32)
            cache = eval_cache(xl, 1, T, memory=tf.random.normal(xl.memory_shape(1)))
            steps[label] = (xl_segment, (seg[:, :T], seg[:, 1:], cache))
            row[f"xl_memory{label}"] = memory
            flops_v = forward_flops(cfg, A, A, relative=False, scored=1)
            flops_x = forward_flops(cfg, T, memory + T, relative=True, scored=T,
                                    cached=True) / T
            row[f"flop_ratio{label}"] = flops_v / flops_x
        # Runs alternate vanilla and XL so that load from other processes hits
        # both alike; each run gives a ratio, the median ratio is reported.
        vanilla_runs, xl_runs = [], {label: [] for label in steps}
        for run in range(args.runs):
            warm = args.warmup if run == 0 else 1
            vanilla_runs.append(median_seconds(vanilla_token, (ids,), warm, args.repeats)[0])
            for label, (fn, inputs) in steps.items():
                xl_runs[label].append(
                    median_seconds(fn, inputs, warm + 1, args.xl_repeats)[0] / T)
        row["vanilla_ms_per_token"] = 1000 * statistics.median(vanilla_runs)
        row["vanilla_ms_per_token_runs"] = [round(1000 * t, 2) for t in vanilla_runs]
        for label, per_token in xl_runs.items():
            ratios = [v / x for v, x in zip(vanilla_runs, per_token)]
            row[f"xl_ms_per_token{label}"] = 1000 * statistics.median(per_token)
            row[f"speedup{label}"] = statistics.median(ratios)
            row[f"speedup{label}_runs"] = [round(r, 1) for r in ratios]
        rows.append(row)
        print(f"A={A}: vanilla {row['vanilla_ms_per_token']:.1f} ms/token, XL "
              f"{row['xl_ms_per_token']:.3f} ms/token -> {row['speedup']:.0f}x "
              f"(runs {row['speedup_runs']})", file=sys.stderr, flush=True)

    host = host_block(tf, peak=not args.no_peak)
    result = {
        "bench": "eval_speedup",
        "speedup": {str(r["attention_length"]): round(r["speedup"], 1) for r in rows},
        "speedup_runs": {str(r["attention_length"]): r["speedup_runs"] for r in rows},
        "speedup_memory_equals_attention": {
            str(r["attention_length"]): round(r["speedup_memory_equals_attention"], 1)
            for r in rows},
        "flop_ratio": {str(r["attention_length"]): round(r["flop_ratio"], 1) for r in rows},
        "paper": {str(k): v for k, v in PAPER.items() if k in args.lengths},
        "vanilla_ms_per_token": {str(r["attention_length"]): round(r["vanilla_ms_per_token"], 2)
                                 for r in rows},
        "xl_ms_per_token": {str(r["attention_length"]): round(r["xl_ms_per_token"], 4)
                            for r in rows},
        "xl_jit_compile": {str(r["attention_length"]): r["xl_jit_compile"] for r in rows},
        "model": cfg, "segment_length": T, "batch": 1, "jit": args.jit,
        "precision": args.precision,
        "threads": args.threads, "repeats": args.repeats, "xl_repeats": args.xl_repeats,
        "runs": args.runs,
        "machine": platform.processor() or platform.machine(),
        "tensorflow": tf.__version__,
        "host": host,
    }
    print(json.dumps(result))
    print(f"\n{host_line(host)}; {args.precision}")
    print(f"\n| attention length A | vanilla ms/token | XL ms/token (M = A - {T}) | XL step "
          f"| speed-up | speed-up, M = A | FLOP ratio | paper |")
    print("|---:|---:|---:|---|---:|---:|---:|---:|")
    for r in rows:
        A = r["attention_length"]
        mode = "XLA" if r["xl_jit_compile"] else "graph"
        print(f"| {A:,} | {r['vanilla_ms_per_token']:.1f} | {r['xl_ms_per_token']:.3f} | {mode} "
              f"| {r['speedup']:,.0f}x | {r['speedup_memory_equals_attention']:,.0f}x "
              f"| {r['flop_ratio']:,.0f}x | {PAPER.get(A, '-')}x |")

    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        lengths = [r["attention_length"] for r in rows]
        fig, ax = plt.subplots(figsize=(6.5, 4), dpi=120)
        ax.plot(lengths, [r["speedup"] for r in rows], "o-",
                label=f"measured, CPU (T={T}, M=A-T)")
        ax.plot(lengths, [r["flop_ratio"] for r in rows], "s--", alpha=0.7,
                label="ratio of matmul FLOPs")
        paper = [(a, PAPER[a]) for a in lengths if a in PAPER]
        if paper:
            ax.plot(*zip(*paper), "^:", color="black", label="paper, Table 9 (GPU)")
        ax.set_xlabel("attention length A (tokens)")
        ax.set_ylabel("vanilla time / XL time, per token")
        ax.set_title(f"Evaluation speed-up ({cfg['num_layers']} layers, d {cfg['hidden_dim']})")
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
        ax.legend()
        fig.tight_layout()
        os.makedirs(os.path.dirname(os.path.abspath(args.plot)), exist_ok=True)
        fig.savefig(args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
