"""Peak RSS of a long evaluation: flat as the number of segments grows.

Runs `keras_txl.training.loop.evaluate` over N segments (memory carried, a long test-time memory)
in a fresh process for each N, and reports each process's peak resident set size. A leak
per segment (a retrace, a growing Python list of tensors, the memory round-tripping to the
host and piling up) would show as RSS growing with N.

    python benchmarks/eval_memory.py [--segments 50 500] [--memory-length 512]

Prints one JSON line (with the `host` block of `benchmarks/hostinfo.py`, measured in a
process of its own) and a table.
"""

import argparse
import json
import os
import resource
import subprocess
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hostinfo import host_block_in  # noqa: E402
from hostinfo import host_line  # noqa: E402


def child(segments, memory_length, segment_length):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.path.insert(0, HERE)
    import time

    import numpy as np

    import keras_txl
    from keras_txl.training.loop import evaluate

    config = keras_txl.TransformerXLConfig.from_preset(
        "char_small", memory_length=memory_length, dropout=0.0)
    model = keras_txl.TransformerXLCausalLM(config)
    tokens = np.random.default_rng(0).integers(
        0, 256, size=segments * segment_length + 1).astype("int32")
    start = time.perf_counter()
    result = evaluate(model, tokens, batch_size=1, segment_length=segment_length)
    seconds = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"segments": segments, "tokens": result["tokens"],
                      "peak_rss_mb": round(rss, 1), "seconds": round(seconds, 2)}))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--segments", type=int, nargs="+", default=[50, 500])
    parser.add_argument("--memory-length", dest="memory_length", type=int, default=512)
    parser.add_argument("--segment-length", dest="segment_length", type=int, default=128)
    parser.add_argument("--no-peak", action="store_true", help="skip the matmul peak")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        child(args.child, args.memory_length, args.segment_length)
        return 0
    runs = []
    for n in args.segments:
        out = subprocess.run(
            [sys.executable, __file__, "--child", str(n), "--memory-length",
             str(args.memory_length), "--segment-length", str(args.segment_length)],
            check=True, capture_output=True, text=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    growth = runs[-1]["peak_rss_mb"] / runs[0]["peak_rss_mb"]
    # The host, with TensorFlow's matmul peak, measured in a process of its own.
    host = host_block_in(sys.executable, "tensorflow", peak=not args.no_peak)
    print(json.dumps({"bench": "eval_peak_rss", "memory_length": args.memory_length,
                      "segment_length": args.segment_length, "runs": runs,
                      "rss_ratio_last_to_first": round(growth, 3), "host": host}))
    print(host_line(host), file=sys.stderr)
    for r in runs:
        print(f"{r['segments']:>6} segments  {r['tokens']:>8} tokens  "
              f"peak RSS {r['peak_rss_mb']:>8.1f} MB  {r['seconds']:>7.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
