"""The adaptive softmax's training loss alone: graph mode, XLA, and XLA as it was.

Times one forward and backward pass of `AdaptiveSoftmax.nll` (the training and evaluation
loss of keras-txl's steps: the head for every token, a tail cluster only for the tokens
whose target is in it) over `--rows` tokens of a preset's softmax (default `wt103_base`:
267,735 words, cutoffs 20,000 / 40,000 / 200,000, d 410), Zipf-distributed targets as
`benchmarks/gpu.py` draws them, in three modes:

- `graph`: `tf.function`; a tail's rows are the exact dynamic rows (`tf.where`);
- `xla`: `jit_compile=True`, what keras-txl does: a tail's rows in the smallest of six static
  buckets that holds them (n, n/2, ..., n/32 rows, picked at run time) while its every-row
  logits (n x V_i) stay within `_BUCKETED_LOGITS_MAX` (2**28), else in static chunks (n/32
  rows, at least 64) by a loop that runs as often as the rows need;
- `xla_chunks`: `jit_compile=True`, every tail in chunks;
- `xla_every_row`: `jit_compile=True` with the dynamic rows, as before both: XLA pads
  `tf.where` to its bound, so every tail is computed for every token.

Reports per mode the median ms of a pass, tokens/s, and the logits computed per token
(the work the matmuls do), with the host block; one JSON line, then a table.

`--eval-memory M` also times the whole model's XLA-compiled evaluation step
(`make_eval_step(jit_compile=True)`, what "auto" runs for long memories: batch
`--eval-batch`, T = `--eval-segment`, M cached states; the model at the preset's size,
random weights) in each XLA mode of `--modes`, as `eval_xla`, `eval_xla_chunks` and
`eval_xla_every_row` (median of the steps after the first two).

    python benchmarks/adaptive_nll.py [--preset wt103_base] [--rows 1024] [--calls 10]
        [--vocabulary-size V --cutoffs C1,C2 --hidden-dim D] [--modes graph,xla,xla_chunks,xla_every_row]
"""

import argparse
import contextlib
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

MODES = ("graph", "xla", "xla_chunks", "xla_every_row")


def logits_per_token(cfg, targets, mode):
    """Logit columns computed per token: the head, plus each tail for the rows it runs on."""
    import numpy as np

    from keras_txl import adaptive

    n = targets.size
    bounds = [0, *cfg.cutoffs, cfg.vocabulary_size]
    total = n * (cfg.cutoffs[0] + len(cfg.cutoffs))
    for lo, hi in zip(bounds[1:-1], bounds[2:]):
        count = int(np.sum((targets >= lo) & (targets < hi)))
        chunk = adaptive._chunk_rows(n)
        chunked = -(-count // chunk) * chunk
        bucket = next(c for c in adaptive._capacities(n) if c >= count)
        bucketed = n * (hi - lo) <= adaptive._BUCKETED_LOGITS_MAX
        rows = {"graph": count, "xla_every_row": n, "xla_chunks": chunked,
                "xla": bucket if bucketed else chunked}[mode]
        total += rows * (hi - lo)
    return total / n


@contextlib.contextmanager
def rows_as(adaptive, mode):
    """Trace the loss with a tail's rows as `mode` takes them (patches adaptive's switches)."""
    static, budget = adaptive._tails_in_static_rows, adaptive._BUCKETED_LOGITS_MAX
    if mode.endswith("xla_every_row"):  # the dynamic rows under XLA: every row
        adaptive._tails_in_static_rows = lambda: False
    elif mode.endswith("xla_chunks"):
        adaptive._BUCKETED_LOGITS_MAX = -1
    try:
        yield
    finally:
        adaptive._tails_in_static_rows, adaptive._BUCKETED_LOGITS_MAX = static, budget


def time_eval_step(tf, np, adaptive, cfg, args, modes):
    """The model's XLA evaluation step in each XLA mode of `--modes`."""
    from steps import time_eval_steps

    from keras_txl import TransformerXLCausalLM

    B, T, steps = args.eval_batch, args.eval_segment, args.eval_steps
    config = cfg.replace(segment_length=T, memory_length=args.eval_memory)
    model = TransformerXLCausalLM(config)
    p = 1.0 / np.arange(1, cfg.vocabulary_size + 1)
    data = np.random.default_rng(2).choice(
        cfg.vocabulary_size, size=(B, steps * T + 1), p=p / p.sum()).astype("int32")
    model(data[:, :T])  # builds the weights: the first calls below time tracing and compiling
    results = {}
    for mode in [f"eval_{m}" for m in modes if m != "graph"]:
        with rows_as(adaptive, mode):
            times = time_eval_steps(tf, model, data, T, steps, True)
        ms = float(np.median(times[2:])) * 1e3
        results[mode] = dict(ms=round(ms, 2), tokens_per_s=round(B * T / ms * 1e3, 1),
                             first_call_s=round(times[0], 2), loss=None,
                             logits_per_token=None, batch=B, segment=T,
                             memory=args.eval_memory)
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="wt103_base")
    parser.add_argument("--vocabulary-size", type=int, default=None, help="override the preset's")
    parser.add_argument("--cutoffs", default=None, help="override the preset's: e.g. 200,400")
    parser.add_argument("--hidden-dim", type=int, default=None, help="override the preset's")
    parser.add_argument("--num-layers", type=int, default=None,
                        help="override the preset's (the evaluation step's model only)")
    parser.add_argument("--rows", type=int, default=1024, help="tokens per pass")
    parser.add_argument("--calls", type=int, default=10, help="timed passes (median)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--eval-memory", type=int, default=0,
                        help="M of the evaluation step's timing (0: not timed)")
    parser.add_argument("--eval-segment", type=int, default=128, help="its T")
    parser.add_argument("--eval-batch", type=int, default=1, help="its batch")
    parser.add_argument("--eval-steps", type=int, default=6, help="its steps (2 warm-up)")
    parser.add_argument("--threads", type=int, default=2,
                        help="intra- and inter-op threads (0: leave TensorFlow's setting)")
    parser.add_argument("--no-peak", action="store_true", help="skip the matmul peak")
    args = parser.parse_args(argv)
    for flag, value, least in (("--rows", args.rows, 1), ("--calls", args.calls, 1),
                               ("--eval-memory", args.eval_memory, 0),
                               ("--eval-segment", args.eval_segment, 1),
                               ("--eval-batch", args.eval_batch, 1),
                               ("--eval-steps", args.eval_steps, 3),
                               ("--num-layers", args.num_layers, 1)):
        if value is not None and value < least:
            parser.error(f"{flag} must be >= {least}; received {value}")
    if args.cutoffs is not None and not all(
            c.strip().isdigit() for c in args.cutoffs.split(",")):
        parser.error("--cutoffs must be comma-separated positive integers, e.g. 200,400; "
                     f"received {args.cutoffs!r}")
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown or not modes:
        parser.error(f"--modes must name some of {', '.join(MODES)}; received {args.modes!r}")

    import numpy as np
    import tensorflow as tf

    cap_xla_kernels()  # XLA's kernels under the oneDNN cap in force (xla_isa_cap.py)

    from keras_txl import adaptive
    from keras_txl.config import TransformerXLConfig

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    changes = {k: v for k, v in dict(
        vocabulary_size=args.vocabulary_size, hidden_dim=args.hidden_dim,
        num_layers=args.num_layers,
        cutoffs=tuple(int(c) for c in args.cutoffs.split(",")) if args.cutoffs else None,
    ).items() if v is not None}
    cfg = TransformerXLConfig.from_preset(args.preset, **changes)
    if not cfg.cutoffs:
        parser.error(f"--preset {args.preset!r} has no adaptive softmax (no cutoffs)")
    embedding, softmax = adaptive.AdaptiveEmbedding(cfg), adaptive.AdaptiveSoftmax(cfg)
    embedding.build()
    softmax.build()
    rng = np.random.default_rng(1)
    p = 1.0 / np.arange(1, cfg.vocabulary_size + 1)  # Zipf, as benchmarks/gpu.py
    targets = rng.choice(cfg.vocabulary_size, size=args.rows, p=p / p.sum()).astype("int32")
    hidden = tf.constant(rng.normal(size=(1, args.rows, cfg.hidden_dim)).astype("float32"))
    target_tensor = tf.constant(targets[None])
    weights = [*embedding.trainable_weights, *softmax.trainable_weights]

    def loss_and_grads(hidden, targets):
        with tf.GradientTape() as tape:
            tape.watch(hidden)
            loss = tf.reduce_mean(softmax.nll(hidden, targets, embedding.tables,
                                              embedding.projections))
        return loss, tape.gradient(loss, [hidden, *weights])

    results = {}
    for mode in modes:
        fn = tf.function(loss_and_grads, jit_compile=mode != "graph")
        with rows_as(adaptive, mode):
            start = time.perf_counter()
            loss = float(fn(hidden, target_tensor)[0])
            first = time.perf_counter() - start
        fn(hidden, target_tensor)[0].numpy()
        times = []
        for _ in range(args.calls):
            start = time.perf_counter()
            fn(hidden, target_tensor)[0].numpy()
            times.append(time.perf_counter() - start)
        ms = sorted(times)[len(times) // 2] * 1e3
        results[mode] = dict(ms=round(ms, 2), tokens_per_s=round(args.rows / ms * 1e3, 1),
                             first_call_s=round(first, 2), loss=round(loss, 5),
                             logits_per_token=round(logits_per_token(cfg, targets, mode)))
    if args.eval_memory:
        results.update(time_eval_step(tf, np, adaptive, cfg, args, modes))
    fractions = [float(np.mean((targets >= lo) & (targets < hi))) for lo, hi in
                 zip([0, *cfg.cutoffs], [*cfg.cutoffs, cfg.vocabulary_size])]
    host = host_block(tf, peak=not args.no_peak)
    print(json.dumps(dict(bench="adaptive_nll", preset=args.preset, rows=args.rows,
                          vocabulary_size=cfg.vocabulary_size, cutoffs=list(cfg.cutoffs),
                          hidden_dim=cfg.hidden_dim, calls=args.calls,
                          cluster_fractions=[round(f, 4) for f in fractions],
                          capacities=adaptive._capacities(args.rows),
                          chunk_rows=adaptive._chunk_rows(args.rows),
                          bucketed_logits_max=adaptive._BUCKETED_LOGITS_MAX, results=results,
                          host=host)))
    print(host_line(host))
    print(f"{args.preset}: {cfg.vocabulary_size:,} words, cutoffs {list(cfg.cutoffs)}, "
          f"{args.rows} tokens; targets per cluster {[round(f, 3) for f in fractions]}")
    print(f"{'mode':<19}{'ms (median)':>12}{'tokens/s':>12}{'logits/token':>14}"
          f"{'first call s':>14}")
    for mode, r in results.items():
        logits = f"{r['logits_per_token']:,}" if r["logits_per_token"] else "-"
        print(f"{mode:<19}{r['ms']:>12.2f}{r['tokens_per_s']:>12,.0f}{logits:>14}"
              f"{r['first_call_s']:>14.2f}")
    if args.eval_memory:
        print(f"eval_*: the model's XLA evaluation step, batch {args.eval_batch}, "
              f"T {args.eval_segment}, M {args.eval_memory}")


if __name__ == "__main__":
    main()
