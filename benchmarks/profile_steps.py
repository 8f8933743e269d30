"""Where a step's time goes: TensorFlow's profiler, op time summed by op type.

Profiles the library's training step (`keras_txl.training.loop.Trainer`) and evaluation step
(`make_eval_step`, the memory key/value cache carried) on the throughput benchmark's
configuration (`benchmarks/throughput.py`: 6 layers, d 256, 8 heads x 32, T = M = 128,
batch 8), or the evaluation step alone at a long memory (`--memory 3672 --batch 1
--layers 4`, the Table 9 shape). Run it natively and under `ONEDNN_MAX_CPU_ISA=AVX2` to see
what costs more on an AVX2 host:

    python benchmarks/profile_steps.py
    ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/profile_steps.py
    python benchmarks/profile_steps.py --steps eval --memory 3672 --batch 1 --layers 4
    python benchmarks/profile_steps.py --precision mixed_bfloat16

Op time is the kernels' own time on their threads: with 2 inter-op threads two kernels can
run at once, so the sum per step can exceed the step's wall time (both are printed).
XLA-compiled calls (the evaluation's fused kernels, `keras_txl.fusion`, or a whole XLA
step) count as op type `XlaExecutable`. The matmuls' own op time is summed too
(`matmul_ms_per_step`), with the tokens/s the step could reach if every other op were
free (`tokens_per_s_matmuls_only`): the bound the matmuls, as oneDNN runs them there,
put on the step.
Prints one JSON line (`ms_per_step` and `op_ms_per_step` by op type for each step, the
`host` block) and a table per step.
"""

import argparse
import collections
import glob
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hostinfo import host_block  # noqa: E402
from hostinfo import host_line  # noqa: E402
from throughput import CONFIG  # noqa: E402
from xla_isa_cap import cap_xla_kernels  # noqa: E402

# The profiler's event for one run of an XLA executable, and the op type it is
# reported as.
XLA_EVENT = "CpuExecutable::ExecuteAsyncOnStream"
XLA_TYPE = "XlaExecutable"


def matmul_ms(op_ms):
    """Op time of the matmul kernels (oneDNN's fused and batched ones
    included) in an {op type: ms} dict."""
    return sum(ms for op, ms in op_ms.items() if "MatMul" in op.rsplit(":", 1)[-1])


def op_times(tf, logdir, steps, by_name=False):
    """{op type: ms per step} from the profile written under `logdir`
    ({"op name:op type": ms per step} with `by_name`)."""
    # The profiler's own protobuf: no TensorBoard plug-in needed to read it.
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    path = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)[0]
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    by_type = collections.Counter()
    for plane in space.planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                name = names[event.metadata_id]
                if name == XLA_EVENT:
                    # An XLA-compiled call (the evaluation's fused kernels, or a
                    # whole XLA step): its time is kernel time too, but its event
                    # has no "op_name:OpType" name.
                    name = f"xla:{XLA_TYPE}"
                # Kernel events are "op_name:OpType"; host bookkeeping is not.
                op_type = name.rsplit(":", 1)[-1]
                if ":" not in name or "::" in name or " " in op_type or not op_type:
                    continue
                key = name if by_name else op_type
                by_type[key] += event.duration_ps / 1e9 / steps
    return dict(by_type.most_common())


def profile(tf, name, run_step, warmup, steps, by_name=False):
    for _ in range(warmup):
        run_step()
    start = time.perf_counter()
    for _ in range(steps):
        run_step()
    wall_ms = 1000 * (time.perf_counter() - start) / steps
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        for _ in range(steps):
            run_step()
        tf.profiler.experimental.stop()
        times = op_times(tf, logdir, steps, by_name)
    return {"step": name, "ms_per_step": round(wall_ms, 2),
            "op_ms_per_step": {k: round(v, 3) for k, v in times.items()},
            "op_ms_total": round(sum(times.values()), 2),
            "matmul_ms_per_step": round(matmul_ms(times), 2)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", choices=["both", "train", "eval"], default="both")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--memory", type=int, default=CONFIG["memory_length"])
    parser.add_argument("--layers", type=int, default=CONFIG["num_layers"])
    parser.add_argument("--repeats", type=int, default=10, help="profiled steps")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top", type=int, default=12, help="op types in the table")
    parser.add_argument("--no-peak", action="store_true", help="skip the matmul peak")
    parser.add_argument("--by-name", action="store_true",
                        help="sum op time by op name (which Cast, which AddV2), not by op type")
    parser.add_argument("--precision", default="float32",
                        choices=["float32", "mixed_bfloat16", "auto"],
                        help="the model's precision (auto: keras_txl.host.auto_precision())")
    args = parser.parse_args(argv)
    if args.precision == "auto":
        from keras_txl.host import auto_precision

        args.precision = auto_precision()

    import numpy as np
    import tensorflow as tf

    cap_xla_kernels()  # XLA's kernels under the oneDNN cap in force (xla_isa_cap.py)

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import keras_txl
    from keras_txl.training.config import TrainConfig
    from keras_txl.training.loop import Trainer
    from keras_txl.training.loop import eval_cache
    from keras_txl.training.loop import make_eval_step

    cfg = dict(CONFIG, memory_length=args.memory, num_layers=args.layers)
    T, B = cfg["segment_length"], args.batch
    rng = np.random.default_rng(0)
    x = tf.constant(rng.integers(0, cfg["vocabulary_size"], size=(B, T)), tf.int32)
    y = tf.constant(rng.integers(0, cfg["vocabulary_size"], size=(B, T)), tf.int32)
    results = []
    if args.steps in ("both", "train"):
        trainer = Trainer(keras_txl.TransformerXLConfig(**cfg),
                          TrainConfig(batch_size=B, learning_rate=2.5e-4, warmup_steps=0,
                                      steps=1000, clip_norm=0.25,
                                      precision=args.precision),
                          tf.distribute.get_strategy(), verbose=False)
        state = {"memory": trainer.memory}

        def train_step():
            loss, _, state["memory"] = trainer._train_step(x, y, state["memory"])
            float(loss)

        results.append(profile(tf, "train", train_step, 3, args.repeats, args.by_name))
        model = trainer.model
    else:
        import keras

        keras.config.set_dtype_policy(args.precision)
        model = keras_txl.TransformerXLCausalLM(keras_txl.TransformerXLConfig(**cfg))
    if args.steps in ("both", "eval"):
        eval_step = make_eval_step(model)
        state = {"cache": eval_cache(model, B, T)}

        def evaluation_step():
            nll, state["cache"] = eval_step(x, y, state["cache"])
            nll.numpy()

        results.append(profile(tf, "eval", evaluation_step, 3, args.repeats,
                               args.by_name))

    for r in results:
        r["tokens_per_s"] = round(B * T / r["ms_per_step"] * 1000)
        if r["matmul_ms_per_step"]:
            r["tokens_per_s_matmuls_only"] = round(B * T / r["matmul_ms_per_step"] * 1000)
    host = host_block(tf, peak=not args.no_peak)
    print(json.dumps({"bench": "profile_steps", "config": cfg, "batch": B,
                      "precision": args.precision,
                      "repeats": args.repeats, "threads": args.threads,
                      "steps": results, "host": host}))
    print(host_line(host))
    for r in results:
        print(f"\n{r['step']} step: {r['ms_per_step']:.1f} ms wall, "
              f"{r['op_ms_total']:.1f} ms of op time (B {B}, T {T}, M {args.memory}, "
              f"{args.layers} layers, {args.precision})")
        print("| op type | ms per step | share of op time |")
        print("|---|---:|---:|")
        for op, ms in list(r["op_ms_per_step"].items())[:args.top]:
            print(f"| {op} | {ms:.2f} | {100 * ms / r['op_ms_total']:.0f} % |")
        if r["matmul_ms_per_step"]:
            # What bounds the step: even with every other op free (and no two
            # kernels overlapping), the matmuls as they ran here take this long.
            print(f"matmuls: {r['matmul_ms_per_step']:.1f} ms of op time per step; "
                  f"if every other op were free: at most {r['tokens_per_s_matmuls_only']:,.0f} "
                  f"tok/s (the step ran {r['tokens_per_s']:,.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
