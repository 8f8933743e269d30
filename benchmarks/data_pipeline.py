"""Data preparation and input streaming at corpus sizes beyond memory.

For each corpus size (default 0.5 GB and 2 GB) this generates a word corpus
under /tmp (`train.txt` of that size, Zipf-distributed words over 100,000
distinct ones, lines of 5-40 words; `valid.txt`/`test.txt` of 20 KB) and
measures, each in a fresh child process whose peak RSS is read from
`os.wait4` (`ru_maxrss` of that process alone):

- `txl prepare --tokenizer word --vocab-size 8000`: wall time, throughput
  (MB of source text per second, vocabulary counting + encoding + writing
  the shards + the source's sha256) and peak RSS;
- the input pipeline alone: `lm_dataset` over the train shards, for the
  `tiny` preset's batch (B 22, T 64) and `wt103_base`'s (B 60, T 150),
  batches per second and tokens per second, peak RSS;
- `txl train --preset tiny` for 40 steps from the shards: peak RSS, and the
  training step's tokens/s (the need the pipeline must meet).

Peak RSS must not grow with the corpus size; throughput on a shared machine
is noisy (the host block gives the load average). The corpora are deleted
afterwards. Prints one JSON line per measurement and a table.

    python benchmarks/data_pipeline.py                  # 0.5 GB and 2 GB
    python benchmarks/data_pipeline.py --sizes-gb 0.05  # a quick check
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hostinfo import host_block  # noqa: E402
from hostinfo import host_line  # noqa: E402

BLOCK_BYTES = 4 << 20
VOCAB_WORDS = 100_000

PIPELINE = """
import faulthandler, json, os, sys, time
faulthandler.dump_traceback_later(900, exit=True)  # never hang the benchmark
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(2)
from keras_txl.training.data import lm_dataset, LMBatches
from keras_txl.training.shards import ShardedTokens
tokens = ShardedTokens(sys.argv[1])
B, T, steps = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
epoch = LMBatches(len(tokens), B, T).steps_per_epoch
# Start half-way through: a resumed run's position, read by offset.
it = iter(lm_dataset(tokens, B, T, repeat=True, start_segment=epoch // 2))
for _ in range(20):
    next(it)
start = time.perf_counter()
for _ in range(steps):
    x, y = next(it)
seconds = time.perf_counter() - start
# Drop the iterator before exit: one whose prefetched tf.numpy_function
# calls are still pending at interpreter shutdown can hang there.
del it
print(json.dumps({"batches_per_s": steps / seconds, "tokens_per_s": steps * B * T / seconds,
                  "segments_per_epoch": epoch}), flush=True)
os._exit(0)
"""


def generate_corpus(folder, size_bytes, seed=0):
    """train.txt of `size_bytes` (Zipf words), valid/test of 20 KB."""
    import numpy as np

    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlucmfwypvbgkqjxz"))
    lengths = rng.integers(2, 10, size=VOCAB_WORDS)
    words = np.array(["".join(rng.choice(letters, size=n)) for n in lengths])

    def block(nbytes):
        out, size = [], 0
        while size < nbytes:
            ids = np.minimum(rng.zipf(1.2, size=rng.integers(5, 40)) - 1, VOCAB_WORDS - 1)
            line = " ".join(words[ids].tolist()) + "\n"
            out.append(line)
            size += len(line)
        return "".join(out).encode()

    os.makedirs(folder, exist_ok=True)
    blocks = [block(BLOCK_BYTES) for _ in range(8)]
    written = 0
    with open(os.path.join(folder, "train.txt"), "wb") as f:
        index = 0
        while written < size_bytes:
            data = blocks[index % len(blocks)]
            f.write(data)
            written += len(data)
            index += 1
    for split in ("valid", "test"):
        with open(os.path.join(folder, f"{split}.txt"), "wb") as f:
            f.write(block(20_000))
    return written


def run_measured(command, env=None):
    """Runs `command` in a child and returns (seconds, peak RSS MB, stdout)."""
    start = time.perf_counter()
    out_file = tempfile.TemporaryFile(mode="w+")
    err_file = tempfile.TemporaryFile(mode="w+")
    process = subprocess.Popen(command, stdout=out_file, stderr=err_file, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    out_file.seek(0)
    err_file.seek(0)
    out, err = out_file.read(), err_file.read()
    if process.returncode:
        raise RuntimeError(f"{command} exited with {process.returncode}:\n{err[-3000:]}")
    return seconds, usage.ru_maxrss / 1024, out  # ru_maxrss is in KB on Linux


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-gb", type=float, nargs="+", default=[0.5, 2.0],
                        help="train.txt sizes to generate, in GB (10^9 bytes)")
    parser.add_argument("--tmp", default=tempfile.gettempdir(),
                        help="where the corpora and workdirs go (deleted after)")
    parser.add_argument("--pipeline-steps", type=int, default=300,
                        help="batches timed for the input pipeline")
    parser.add_argument("--train-steps", type=int, default=40,
                        help="steps of `txl train --preset tiny`")
    args = parser.parse_args(argv)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(2)
    host = host_block(tf, peak=False)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT,
           "CUDA_VISIBLE_DEVICES": ""}
    txl = [sys.executable, "-m", "keras_txl"]
    rows = []
    for size_gb in args.sizes_gb:
        root = tempfile.mkdtemp(prefix="txl-bench-data-", dir=args.tmp)
        try:
            corpus, workdir = os.path.join(root, "corpus"), os.path.join(root, "run")
            start = time.perf_counter()
            size = generate_corpus(corpus, int(size_gb * 1e9))
            generated = time.perf_counter() - start
            seconds, rss, out = run_measured(
                [*txl, "prepare", "--data", corpus, "--workdir", workdir,
                 "--tokenizer", "word", "--vocab-size", "8000"], env=env)
            prepared = json.loads(out.strip().splitlines()[-1])
            record = {"benchmark": "data_pipeline", "what": "prepare", "corpus_gb": size / 1e9,
                      "seconds": round(seconds, 1), "mb_per_s": round(size / 1e6 / seconds, 1),
                      "peak_rss_mb": round(rss), "train_tokens": prepared["splits"]["train"]["tokens"],
                      "shards": prepared["splits"]["train"]["shards"],
                      "generate_seconds": round(generated, 1), "host": host}
            print(json.dumps(record), flush=True)
            rows.append(record)
            for preset, (B, T) in (("tiny", (22, 64)), ("wt103_base", (60, 150))):
                seconds, rss, out = run_measured(
                    [sys.executable, "-c", PIPELINE, os.path.join(workdir, "data", "train"),
                     str(B), str(T), str(args.pipeline_steps)], env=env)
                result = json.loads(out.strip().splitlines()[-1])
                record = {"benchmark": "data_pipeline", "what": f"pipeline {preset} B{B} T{T}",
                          "corpus_gb": size / 1e9, "peak_rss_mb": round(rss),
                          "tokens_per_s": round(result["tokens_per_s"]),
                          "batches_per_s": round(result["batches_per_s"], 1), "host": host}
                print(json.dumps(record), flush=True)
                rows.append(record)
            try:
                seconds, rss, out = run_measured(
                    [*txl, "train", "--workdir", workdir, "--preset", "tiny", "--steps",
                     str(args.train_steps), "--set", "log_every=10",
                     "--set", "checkpoint_every=0"], env=env)
            except RuntimeError as error:
                print(json.dumps({"benchmark": "data_pipeline", "what": "train tiny",
                                  "error": str(error)[-2000:]}), flush=True)
                continue
            with open(os.path.join(workdir, "metrics.jsonl")) as f:
                train = [json.loads(line) for line in f]
            speeds = [r["tokens_per_s"] for r in train if r.get("split") == "train"][1:]
            record = {"benchmark": "data_pipeline", "what": "train tiny (from shards)",
                      "corpus_gb": size / 1e9, "peak_rss_mb": round(rss),
                      "tokens_per_s": round(sorted(speeds)[len(speeds) // 2]) if speeds else None,
                      "seconds": round(seconds, 1), "host": host}
            print(json.dumps(record), flush=True)
            rows.append(record)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    print()
    print(host_line(host))
    print(f"| {'corpus':>7} | {'what':<28} | {'MB/s':>6} | {'tokens/s':>10} | {'peak RSS':>9} |")
    print(f"|{'-' * 9}|{'-' * 30}|{'-' * 8}|{'-' * 12}|{'-' * 11}|")
    for r in rows:
        mbs = f"{r['mb_per_s']:.1f}" if "mb_per_s" in r else ""
        tps = f"{r['tokens_per_s']:,}" if r.get("tokens_per_s") else ""
        print(f"| {r['corpus_gb']:5.2f}GB | {r['what']:<28} | {mbs:>6} | {tps:>10} | "
              f"{r['peak_rss_mb']:>6} MB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
