"""Decoding speed of keras-txl with and without the memory key/value cache.

A small model (vocab 256, 4 layers, d_model 256, 4 heads x 64, d_inner
1024, random weights), batch 1. For each memory length (256 and 512) and
each path (`use_cache` False / True): a 128-token prompt fills the memory
(one segment), then N tokens are generated greedily one at a time
(`keras_txl.generation.generate_iter`, the library's own loop, host
round-trip per token included). Tracing is excluded (a warm-up generation
first). Per-token times are taken between consecutive tokens and averaged
over windows of 100 tokens: with Transformer-XL's fixed-size memory the
cost per token must stay flat as the text grows (100 -> N tokens).

Prints one JSON line (with the `host` block of `benchmarks/hostinfo.py`) and a table.

    python benchmarks/generation_speed.py [--tokens 1000] [--memory 256,512]
        [--jit] [--threads 2]
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hostinfo import host_block  # noqa: E402
from hostinfo import host_line  # noqa: E402

PROMPT = 128
WINDOW = 100
CONFIG = dict(
    vocabulary_size=256, num_layers=4, hidden_dim=256, num_heads=4,
    head_dim=64, intermediate_dim=1024, segment_length=PROMPT, dropout=0.0,
)


def timed_generation(backend, prompt, tokens):
    """(new ids, per-token seconds) of one greedy generation."""
    from keras_txl.generation import generate_iter

    ids, times = [], []
    start = time.perf_counter()
    for token in generate_iter(backend, prompt, tokens, temperature=0):
        now = time.perf_counter()
        ids.append(token)
        times.append(now - start)
        start = now
    return ids, times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--memory", default="256,512")
    parser.add_argument("--jit", action="store_true", help="XLA-compile steps")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-peak", action="store_true", help="skip the matmul peak")
    args = parser.parse_args(argv)

    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import keras

    from keras_txl import TransformerXLCausalLM
    from keras_txl import TransformerXLConfig
    from keras_txl.generation import KerasBackend

    keras.utils.set_random_seed(0)
    prompt = np.random.default_rng(0).integers(0, 256, PROMPT).astype("int32")
    results = []
    for memory_length in [int(m) for m in args.memory.split(",")]:
        config = TransformerXLConfig(**CONFIG, memory_length=memory_length)
        model = TransformerXLCausalLM(config)
        generated = {}
        for use_cache in (False, True):
            backend = KerasBackend(model, use_cache=use_cache,
                                   jit_compile=args.jit)
            timed_generation(backend, prompt, 8)  # traces
            ids, times = timed_generation(backend, prompt, args.tokens)
            generated[use_cache] = ids
            decode = np.asarray(times[1:])  # times[0] is the prompt
            windows = [
                1000 * float(np.mean(decode[s:s + WINDOW]))
                for s in range(0, len(decode), WINDOW)
            ]
            results.append({
                "memory_length": memory_length,
                "cache": use_cache,
                "tokens": args.tokens,
                "tokens_per_second": float(len(decode) / decode.sum()),
                "ms_per_token": 1000 * float(np.mean(decode)),
                "ms_per_token_median": 1000 * float(np.median(decode)),
                "ms_per_token_by_window": windows,
                "prompt_ms": 1000 * times[0],
            })
        same = generated[False] == generated[True]
        for r in results[-2:]:
            r["same_tokens_as_uncached"] = same
    for memory_length in sorted({r["memory_length"] for r in results}):
        pair = {r["cache"]: r for r in results
                if r["memory_length"] == memory_length}
        pair[True]["speedup"] = (pair[True]["tokens_per_second"]
                                 / pair[False]["tokens_per_second"])
    host = host_block(tf, peak=not args.no_peak)
    report = {
        "benchmark": "generation_speed",
        "model": CONFIG,
        "prompt_tokens": PROMPT,
        "jit_compile": args.jit,
        "threads": args.threads,
        "cpu": host["cpu"],
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "results": results,
        "host": host,
    }
    print(json.dumps(report))
    print()
    print(host_line(host))
    print(f"{'memory':>6} {'cache':>5} {'tok/s':>8} {'ms/tok':>7} "
          f"{'median':>7} {'speedup':>7} {'same':>5}  ms/token per 100-token "
          "window (1st .. last)")
    for r in results:
        windows = " ".join(f"{w:.2f}" for w in r["ms_per_token_by_window"])
        speedup = f"{r['speedup']:.2f}x" if "speedup" in r else ""
        print(f"{r['memory_length']:>6} {str(r['cache']):>5} "
              f"{r['tokens_per_second']:>8.1f} {r['ms_per_token']:>7.2f} "
              f"{r['ms_per_token_median']:>7.2f} {speedup:>7} "
              f"{str(r['same_tokens_as_uncached']):>5}  {windows}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
