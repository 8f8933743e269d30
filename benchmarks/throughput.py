"""Training and evaluation throughput of keras-txl on the peer benchmark's configuration.

Mirrors `shared/bench/bench_hf_torch.py` (Hugging Face PyTorch TransfoXL): vocab 256, plain
softmax, d_model 256, 8 heads x 32, d_inner 1024, 6 layers, segment 128, memory 128, batch 8,
dropout 0.1, Adam lr 2.5e-4, 2 threads, 3 warm-up + 10 timed steps, memory carried between
steps. Training is the library's own training step (`keras_txl.training.loop.Trainer`, the memory kept
as loop state on the device); evaluation is the library's evaluation step
(`keras_txl.training.loop.make_eval_step`: per-token NLL of the targets, the memory carried as its
key/value cache). Also measures this machine's fp32 matmul peak (`benchmarks/hostinfo.py`) and reports MFU against
it; the JSON line's `host` block names the CPU, its ISA (and any `ONEDNN_MAX_CPU_ISA` cap) and cores.

Prints one JSON line (the reference's keys plus `mfu`, `matmul_peak_gflops` ...) and a table.

    python benchmarks/throughput.py [--jit] [--precision mixed_bfloat16] [--threads 2]
"""

import argparse
import json
import os
import platform
import resource
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu import forward_flops_per_token  # noqa: E402  (one FLOP model for both)
from hostinfo import host_block  # noqa: E402
from hostinfo import host_line  # noqa: E402
from steps import time_eval_steps  # noqa: E402
from steps import time_train_steps  # noqa: E402
from xla_isa_cap import cap_xla_kernels  # noqa: E402

BATCH, SEGMENT, MEMORY = 8, 128, 128
WARMUP, TIMED = 3, 10
CONFIG = dict(
    vocabulary_size=256, num_layers=6, hidden_dim=256, num_heads=8, head_dim=32,
    intermediate_dim=1024, segment_length=SEGMENT, memory_length=MEMORY, clamp_length=-1,
    same_length=False, pre_layer_norm=False, untie_relative_bias=True, dropout=0.1,
    attention_dropout=0.0,
)


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jit", action="store_true", help="XLA-compile the training step")
    parser.add_argument("--eval-jit", default="auto", choices=["auto", "on", "off"],
                        help="XLA for the evaluation step (default: the library's "
                             "`make_eval_step` default, auto)")
    parser.add_argument("--precision", default="float32",
                        choices=["float32", "mixed_bfloat16", "auto"],
                        help="auto: keras_txl.host.auto_precision() (bf16 only where the "
                             "effective ISA has AVX512_BF16 or AMX)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-peak", action="store_true", help="skip the matmul peak")
    args = parser.parse_args(argv)
    requested = args.precision
    if args.precision == "auto":
        from keras_txl.host import auto_precision

        args.precision = auto_precision()

    import numpy as np
    import tensorflow as tf

    cap_xla_kernels()  # XLA's kernels under the oneDNN cap in force (xla_isa_cap.py)

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)

    import keras_txl
    rss_after_import = peak_rss_mb()  # the framework's own footprint
    from keras_txl.training.config import TrainConfig
    from keras_txl.training.loop import Trainer
    from keras_txl.training.loop import eval_jit_compile

    config = keras_txl.TransformerXLConfig(**CONFIG)
    train_config = TrainConfig(batch_size=BATCH, learning_rate=2.5e-4, warmup_steps=0,
                               steps=WARMUP + TIMED, clip_norm=0.25,
                               jit_compile=args.jit, precision=args.precision)
    trainer = Trainer(config, train_config, tf.distribute.get_strategy(), verbose=False)
    model = trainer.model
    steps = WARMUP + TIMED
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, size=(BATCH, steps * SEGMENT + 1)).astype("int32")
    tokens_per_step = BATCH * SEGMENT

    # 1. training: the library's step, memory carried as loop state.
    times, losses = time_train_steps(tf, trainer, data, SEGMENT, steps)
    train_times = times[WARMUP:]
    rss_after_train = peak_rss_mb()

    # 2. evaluation: per-token NLL of the targets, memory carried, with the
    # library's evaluation step (the memory key/value cache carried).
    eval_jit = {"auto": "auto", "on": True, "off": False}[args.eval_jit]
    eval_jit = eval_jit_compile(model, eval_jit)
    times = time_eval_steps(tf, model, data, SEGMENT, steps, eval_jit)
    eval_first_s = times[0]  # tracing (and XLA compilation) included
    eval_times = times[WARMUP:]

    peak_rss = peak_rss_mb()  # before the matmul peak's own tensors
    host = host_block(tf, peak=not args.no_peak)
    peak = None if args.no_peak else host["matmul_peak_gflops"]["float32"]
    flops = forward_flops_per_token(CONFIG)
    train_tps = tokens_per_step * TIMED / sum(train_times)
    eval_tps = tokens_per_step * TIMED / sum(eval_times)
    median = lambda ts: sorted(ts)[len(ts) // 2]  # noqa: E731
    result = dict(
        bench="keras_txl_cpu",
        train_tokens_per_s=round(train_tps, 1),
        eval_tokens_per_s=round(eval_tps, 1),
        peak_rss_mb=round(peak_rss, 1),
        peak_rss_mb_after_train=round(rss_after_train, 1),
        rss_mb_after_import=round(rss_after_import, 1),
        train_tokens_per_s_from_median_step=round(tokens_per_step / median(train_times), 1),
        eval_tokens_per_s_from_median_step=round(tokens_per_step / median(eval_times), 1),
        mfu=None if peak is None else round(3 * flops * train_tps / (peak * 1e9), 4),
        eval_mfu=None if peak is None else round(flops * eval_tps / (peak * 1e9), 4),
        matmul_peak_gflops=None if peak is None else round(peak, 1),
        forward_gflop_per_token=round(flops / 1e9, 6),
        train_step_s=[round(t, 4) for t in train_times],
        eval_step_s=[round(t, 4) for t in eval_times],
        train_loss_first_last=[round(losses[0], 4), round(losses[-1], 4)],
        tokens_per_step=tokens_per_step, warmup_steps=WARMUP, timed_steps=TIMED,
        eval_first_step_s=round(eval_first_s, 3),
        jit_compile=args.jit, eval_jit_compile=eval_jit,
        precision=args.precision, precision_requested=requested,
        threads=args.threads,
        n_params=model.count_params(), config=CONFIG, tensorflow=tf.__version__,
        python=sys.version.split()[0], cpu_count=os.cpu_count(), machine=platform.machine(),
        host=host,
    )
    print(json.dumps(result))
    rows = [("train tokens/s", result["train_tokens_per_s"]),
            ("eval tokens/s", result["eval_tokens_per_s"]),
            ("train tokens/s (median step)", result["train_tokens_per_s_from_median_step"]),
            ("eval tokens/s (median step)", result["eval_tokens_per_s_from_median_step"]),
            ("peak RSS MB", result["peak_rss_mb"]), ("train MFU", result["mfu"]),
            ("matmul peak GFLOP/s", result["matmul_peak_gflops"])]
    width = max(len(r[0]) for r in rows)
    print(host_line(host), file=sys.stderr)
    print("\n".join(f"{name:<{width}}  {value}" for name, value in rows), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
