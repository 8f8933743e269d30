"""Generation speed: batched compiled `generate` vs the host loop vs Hugging Face.

Tokens/s of **new** tokens (batch x new tokens / wall time of the whole
call, prompt included, tracing excluded by a warm-up call) for:

- `compiled`: `TransformerXLCausalLM.generate` (keras-hub's compiled
  `generate_step`: `keras_txl.decoding.decode_loop` in one `tf.function`,
  greedy sampler), batch 1, 8 and 32, with `jit_compile` False and True;
- `host loop`: the loop `txl generate` used before keras-hub
  (`keras_txl.generation.generate` with `KerasBackend(use_cache=True)`:
  one compiled step per token, NumPy sampling on the host), batch 1;
- `hf`: Hugging Face's PyTorch `TransfoXLLMHeadModel.generate` (greedy,
  its `mems` carried from step to step), batch 1, 8 and 32, run in the
  peer virtualenv (`--peer-python`) in its own process.

Same model size for all (random weights): vocabulary 256, 4 layers,
d_model 256, 4 heads x 64, d_inner 1024, memory 128; prompts of
`--prompt` random tokens, `--tokens` new tokens. Each measurement is the
median of `--repeats` calls. Prints one JSON line per measurement, a JSON
summary with the `host` block (`benchmarks/hostinfo.py`) and a table.

    python benchmarks/generation_speed.py [--tokens 64] [--prompt 32]
        [--batches 1,8,32] [--repeats 3] [--peer-python ../peer-venv/bin/python]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from hostinfo import host_block  # noqa: E402
from hostinfo import host_line  # noqa: E402
from xla_isa_cap import cap_xla_kernels  # noqa: E402

MODEL = dict(
    vocabulary_size=256, num_layers=4, hidden_dim=256, num_heads=4,
    head_dim=64, intermediate_dim=1024, memory_length=128,
    segment_length=128, dropout=0.0,
)

# Runs in the peer virtualenv (torch + transformers 4.37.2).
PEER = r"""
import json, statistics, sys, time, warnings
warnings.simplefilter("ignore")
import torch
from transformers import TransfoXLConfig, TransfoXLLMHeadModel

job = json.loads(sys.argv[1])
torch.set_num_threads(job["threads"])
torch.manual_seed(0)
m = job["model"]
model = TransfoXLLMHeadModel(TransfoXLConfig(
    vocab_size=m["vocabulary_size"], cutoffs=[], div_val=1,
    d_model=m["hidden_dim"], d_embed=m["hidden_dim"], n_head=m["num_heads"],
    d_head=m["head_dim"], d_inner=m["intermediate_dim"], n_layer=m["num_layers"],
    mem_len=m["memory_length"], tgt_len=m["segment_length"], clamp_len=-1,
    same_length=False, dropout=0.0, dropatt=0.0, eos_token_id=None)).eval()
for batch in job["batches"]:
    ids = torch.randint(0, m["vocabulary_size"], (batch, job["prompt"]),
                        generator=torch.Generator().manual_seed(1))
    def run(n):
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=n, min_new_tokens=n,
                                  do_sample=False, pad_token_id=0)
    run(2)  # warm-up
    times = []
    for _ in range(job["repeats"]):
        start = time.perf_counter()
        out = run(job["tokens"])
        times.append(time.perf_counter() - start)
    assert out.shape == (batch, job["prompt"] + job["tokens"]), out.shape
    print(json.dumps({"path": "hf", "batch": batch, "jit_compile": None,
                      "seconds": times,
                      "tokens_per_second": batch * job["tokens"] / statistics.median(times),
                      "torch": torch.__version__}), flush=True)
"""


def measure(call, repeats):
    call()  # tracing / warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per row")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens per row")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--peer-python", dest="peer_python", default=None,
                        help="python of the Hugging Face venv (torch, "
                        "transformers 4.37.2); omitted: no hf rows")
    parser.add_argument("--no-peak", action="store_true", help="skip the matmul peak")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]

    import numpy as np
    import tensorflow as tf

    cap_xla_kernels()  # XLA's kernels under the oneDNN cap in force (xla_isa_cap.py)

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import keras

    from keras_txl import TransformerXLCausalLM
    from keras_txl import TransformerXLConfig
    from keras_txl.generation import KerasBackend
    from keras_txl.generation import generate as host_generate

    keras.utils.set_random_seed(0)
    model = TransformerXLCausalLM(TransformerXLConfig(**MODEL))
    rng = np.random.default_rng(1)
    length = args.prompt + args.tokens
    results = []

    def record(path, batch, jit_compile, times, same=None):
        row = {"path": path, "batch": batch, "jit_compile": jit_compile,
               "seconds": times,
               "tokens_per_second": batch * args.tokens / statistics.median(times)}
        if same is not None:
            row["same_tokens_as_host_loop"] = same
        results.append(row)
        print(json.dumps(row), flush=True)

    # The old host loop, batch 1 (one prompt at a time is all it can do).
    prompt = rng.integers(0, 256, (max(batches), args.prompt)).astype("int32")
    backend = KerasBackend(model, use_cache=True)
    host_ids = host_generate(backend, prompt[0], args.tokens, temperature=0)
    record("host loop", 1, False, measure(
        lambda: host_generate(backend, prompt[0], args.tokens, temperature=0),
        args.repeats))

    for jit_compile in (False, True):
        model.compile(sampler="greedy", jit_compile=jit_compile)
        for batch in batches:
            rows = [list(row) for row in prompt[:batch]]
            out = model.generate(rows, max_length=length, strip_prompt=True)
            same = bool(np.array_equal(out[0], host_ids))
            record("compiled", batch, jit_compile, measure(
                lambda rows=rows: model.generate(rows, max_length=length),
                args.repeats), same)

    if args.peer_python:
        job = {"model": MODEL, "batches": batches, "prompt": args.prompt,
               "tokens": args.tokens, "repeats": args.repeats,
               "threads": args.threads}
        proc = subprocess.run([args.peer_python, "-c", PEER, json.dumps(job)],
                              capture_output=True, text=True)
        if proc.returncode:
            print(proc.stderr[-2000:], file=sys.stderr)
        for line in proc.stdout.splitlines():
            row = json.loads(line)
            results.append(row)
            print(line, flush=True)

    host = host_block(tf, peak=not args.no_peak)
    print(json.dumps({
        "benchmark": "generation_speed", "model": MODEL, "prompt_tokens": args.prompt,
        "new_tokens": args.tokens, "repeats": args.repeats, "threads": args.threads,
        "load_average": os.getloadavg(), "tensorflow": tf.__version__,
        "keras": keras.__version__, "results": results, "host": host,
    }))
    print()
    print(host_line(host))
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"{'path':<10} {'jit':>5} {'batch':>5} {'new tok/s':>10} {'median s':>9}")
    for r in results:
        jit = "" if r["jit_compile"] is None else str(r["jit_compile"])
        print(f"{r['path']:<10} {jit:>5} {r['batch']:>5} "
              f"{r['tokens_per_second']:>10.1f} {statistics.median(r['seconds']):>9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
