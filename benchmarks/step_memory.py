"""Peak memory of keras-txl's training and evaluation steps, counted by TensorFlow's allocator.

On a GPU, `benchmarks/gpu.py` reports `tf.config.experimental.get_memory_info("GPU:0")`'s
peak: the bytes of live tensors, from TensorFlow's BFC allocator. TensorFlow's CPU
allocator keeps no such count unless it is the BFC allocator too
(`TF_CPU_ALLOCATOR_USE_BFC=true`, read when TensorFlow starts; this script sets it), and
then the same figure can be measured on a CPU host, at the GPU benchmark's own
configuration (default: `wt103_base`, batch 60, T = M = 150, Zipf tokens as gpu.py draws
them, the same protocol: the training steps, then the evaluation steps in the same process,
with the weights and the optimizer's slots live). The kernels differ from a GPU's (oneDNN's
against cuDNN/cuBLAS scratch), what the graph keeps alive does not: an H200's
fp32 evaluation peak was 9,396 MB where this script measured 9,583-9,619 on a CPU.

Reports the allocator's bytes after the model and its optimizer are built, the peak of a
training step and of an evaluation step above zero (each the largest after the first step,
as gpu.py's), what an evaluation step leaves held (its cache), and the median seconds of
the steps; one JSON line, then a table. Slow on a CPU at the default size (a training
step of wt103_base at batch 60 takes ~15 s on 2 cores): it measures memory, not speed.

    python benchmarks/step_memory.py [--preset wt103_base] [--batch 60] [--segment 150]
        [--memory 150] [--precision float32] [--train-steps 3] [--eval-steps 3] [--jit]
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"  # before TensorFlow starts
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hostinfo import host_block  # noqa: E402
from hostinfo import host_line  # noqa: E402
from xla_isa_cap import cap_xla_kernels  # noqa: E402

MIB = 2**20


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="wt103_base")
    parser.add_argument("--batch", type=int, default=60)
    parser.add_argument("--segment", type=int, default=150, help="T")
    parser.add_argument("--memory", type=int, default=150, help="M")
    parser.add_argument("--layers", type=int, default=None,
                        help="override the preset's number of layers")
    parser.add_argument("--precision", default="float32",
                        choices=["float32", "mixed_bfloat16", "auto"])
    parser.add_argument("--train-steps", type=int, default=3,
                        help="training steps before the evaluation (0: none, as a "
                             "fresh model; no optimizer slots then)")
    parser.add_argument("--eval-steps", type=int, default=3)
    parser.add_argument("--jit", action="store_true",
                        help="both steps XLA-compiled (gpu.py's keras-xla)")
    args = parser.parse_args(argv)
    for name, least in dict(batch=1, segment=1, memory=0, train_steps=0,
                            eval_steps=2).items():
        if getattr(args, name) < least:
            parser.error(f"--{name.replace('_', '-')} must be >= {least}, "
                         f"received {getattr(args, name)}")
    if args.layers is not None and args.layers < 1:
        parser.error(f"--layers must be >= 1, received {args.layers}")
    return args


def main(argv=None):
    args = parse(argv)
    import tensorflow as tf
    from gpu import make_tokens
    from steps import segments

    cap_xla_kernels()  # XLA's kernels under the oneDNN cap in force (xla_isa_cap.py)

    from keras_txl.config import TransformerXLConfig
    from keras_txl.training.config import TrainConfig
    from keras_txl.training.loop import Trainer

    changes = dict(segment_length=args.segment, memory_length=args.memory)
    if args.layers:
        changes["num_layers"] = args.layers
    config = TransformerXLConfig.from_preset(args.preset, **changes)
    B, T = args.batch, args.segment
    data = make_tokens(config.to_dict(), B, max(args.train_steps, args.eval_steps), "zipf")

    def used():
        return tf.config.experimental.get_memory_info("CPU:0")["current"]

    def peak():
        return tf.config.experimental.get_memory_info("CPU:0")["peak"]

    train_config = TrainConfig(batch_size=B, learning_rate=2.5e-4, warmup_steps=0,
                               steps=max(args.train_steps, 1), clip_norm=0.25,
                               jit_compile=args.jit, precision=args.precision)
    trainer = Trainer(config, train_config, tf.distribute.get_strategy(), verbose=False)
    model = trainer.model
    built = used()
    if not built:
        sys.exit("step_memory.py: TensorFlow's CPU allocator counts no bytes: TensorFlow was "
                 "started before TF_CPU_ALLOCATOR_USE_BFC=true was set. Run the script as a "
                 "process of its own.")
    train_peaks, train_times = [], []
    memory = trainer.memory
    for x, y in segments(tf, data, T, args.train_steps):
        tf.config.experimental.reset_memory_stats("CPU:0")
        t0 = time.perf_counter()
        loss, _, memory = trainer._train_step(x, y, memory)
        float(loss)
        train_times.append(time.perf_counter() - t0)
        train_peaks.append(peak())
    del memory
    before_eval = used()
    # gpu.py's evaluation loop (steps.time_eval_steps), with each step's peak read.
    eval_peaks, eval_times, held = [], [], []
    from keras_txl.training.loop import eval_cache
    from keras_txl.training.loop import make_eval_step

    step = make_eval_step(model, jit_compile=args.jit)
    cache = eval_cache(model, B, T)
    cache_built = used()
    for x, y in segments(tf, data, T, args.eval_steps):
        tf.config.experimental.reset_memory_stats("CPU:0")
        t0 = time.perf_counter()
        nll, cache = step(x, y, cache)
        nll.numpy()
        eval_times.append(time.perf_counter() - t0)
        eval_peaks.append(peak())
        held.append(used() - before_eval)
    host = host_block(tf, peak=False)
    result = dict(
        benchmark="step_memory", host=host, preset=args.preset, batch=B, segment=T,
        memory=args.memory, layers=config.num_layers, precision=args.precision,
        jit_compile=args.jit, params=model.count_params(),
        built_mib=round(built / MIB, 3), cache_built_mib=round((cache_built - before_eval) / MIB, 3),
        train_peak_mib=(round(max(train_peaks[1:] or train_peaks) / MIB, 3)
                        if train_peaks else None),
        train_first_peak_mib=round(train_peaks[0] / MIB, 3) if train_peaks else None,
        eval_peak_mib=round(max(eval_peaks[1:]) / MIB, 3),
        eval_first_peak_mib=round(eval_peaks[0] / MIB, 3),
        eval_held_mib=[round(h / MIB, 3) for h in held],
        train_step_s=round(statistics.median(train_times[1:] or train_times), 3)
        if train_times else None,
        eval_step_s=round(statistics.median(eval_times[1:]), 3),
    )
    print(json.dumps(result))
    print(host_line(host))
    print(f"{args.preset}, batch {B}, T {T}, M {args.memory}, {config.num_layers} layers, "
          f"{args.precision}{', XLA' if args.jit else ', graph mode'}; MiB counted by "
          "TensorFlow's BFC allocator")
    print("| weights + optimizer | training step peak | evaluation step peak "
          "| cache held after a step | train / eval step s |")
    print("|---:|---:|---:|---:|---:|")
    train_peak = result["train_peak_mib"]
    print(f"| {result['built_mib']:,.0f} | {f'{train_peak:,.0f}' if train_peak else '-'} "
          f"| {result['eval_peak_mib']:,.0f} | {result['eval_held_mib'][-1]:,.0f} "
          f"| {result['train_step_s'] or '-'} / {result['eval_step_s']} |")
    return result


if __name__ == "__main__":
    main()
