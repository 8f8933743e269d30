#!/usr/bin/env python3
"""The reference (Hugging Face PyTorch TransfoXL) under `torch.compile`: same config, same protocol.

`shared/bench/bench_hf_torch.py` measures the reference in eager mode. This measures the same
model under `torch.compile` (inductor by default), so that keras-txl is compared with the
strongest CPU peer. Nothing of the protocol is copied: the configuration, batch, segment and
memory lengths, threads, seed, warm-up and timed step counts, the version shim and the RSS
measure are the shared script's own (loaded with importlib from `--reference-script`). The
steps are the shared script's too: training = zero_grad, forward with labels and memory,
backward, Adam step; evaluation = eval mode, no grad, labels given, memory carried.

Compilation happens in the warm-up steps (one graph for the first step without memory, one
with memory; again for evaluation, whose mode differs) and is excluded from the timed steps,
as the warm-up is in the eager script. It is reported: the warm-up step times and
`*_compile_s` = warm-up time minus warm-up steps x the median timed step. Inductor on CPU
needs a C++ compiler (gcc / g++).

Prints one JSON line (the shared script's keys, plus the compile times, graph-break counts
and a `host` block with PyTorch's measured matmul peak):

    ../peer-venv/bin/python benchmarks/bench_hf_torch_compiled.py [--mode max-autotune]
        [--warmup 3 --timed 10] [--no-peak]
"""

import argparse
import importlib.util
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(HERE, "..", "..", "shared", "bench", "bench_hf_torch.py")


def load_reference(path):
    """The shared eager script as a module (its main() is not run)."""
    if not os.path.exists(path):
        raise SystemExit(f"bench_hf_torch_compiled.py: the reference script {path!r} does not "
                         "exist (pass --reference-script)")
    spec = importlib.util.spec_from_file_location("bench_hf_torch", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def graph_counters(torch):
    """(graph breaks, unique graphs) counted by dynamo so far, where it exposes them."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None, None
    return sum(counters["graph_break"].values()), counters["stats"].get("unique_graphs")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reference-script", default=REFERENCE)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--mode", default=None,
                        help="torch.compile mode (default, reduce-overhead, max-autotune)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="warm-up steps (default: the reference's; >= 2 keeps both "
                             "compilations out of the timed steps)")
    parser.add_argument("--timed", type=int, default=None,
                        help="timed steps (default: the reference's)")
    parser.add_argument("--no-peak", action="store_true", help="skip the matmul peak")
    args = parser.parse_args(argv)

    ref = load_reference(os.path.abspath(args.reference_script))
    torch, transformers = ref.torch, ref.transformers
    warmup = ref.WARMUP if args.warmup is None else args.warmup
    timed = ref.TIMED if args.timed is None else args.timed
    if warmup < 2 or timed < 1:
        parser.error("--warmup must be >= 2 (both graphs compile there) and --timed >= 1")

    torch.set_num_threads(ref.THREADS)
    shim = ref._install_shim_if_needed()
    torch.manual_seed(ref.SEED)
    eager = ref.TransfoXLLMHeadModel(ref.TransfoXLConfig(**ref.CONFIG))
    n_params = sum(p.numel() for p in eager.parameters())
    model = torch.compile(eager, backend=args.backend, mode=args.mode)
    steps = warmup + timed
    data = torch.randint(0, ref.CONFIG["vocab_size"], (ref.BATCH, steps * ref.TGT_LEN),
                         generator=torch.Generator().manual_seed(1))
    tokens_per_step = ref.BATCH * ref.TGT_LEN
    T = ref.TGT_LEN

    # 1. training (the reference's step, the model compiled)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=2.5e-4)
    mems = None
    train_times, train_losses = [], []
    for k in range(steps):
        x = data[:, k * T:(k + 1) * T]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = model(input_ids=x, labels=x, mems=mems)
        out.loss.backward()
        opt.step()
        mems = out.mems
        dt = time.perf_counter() - t0
        train_losses.append(float(out.loss))
        train_times.append(dt)
    rss_after_train = ref._peak_rss_mb()

    # 2. evaluation with memory
    model.eval()
    mems = None
    eval_times = []
    with torch.no_grad():
        for k in range(steps):
            x = data[:, k * T:(k + 1) * T]
            t0 = time.perf_counter()
            out = model(input_ids=x, labels=x, mems=mems)
            mems = out.mems
            eval_times.append(time.perf_counter() - t0)
    peak_rss = ref._peak_rss_mb()  # before the matmul peak's own tensors
    graph_breaks, unique_graphs = graph_counters(torch)

    sys.path.insert(0, HERE)
    from hostinfo import host_block

    host = host_block(torch, peak=not args.no_peak)
    median = lambda ts: sorted(ts)[len(ts) // 2]  # noqa: E731
    train_warm, train_timed = train_times[:warmup], train_times[warmup:]
    eval_warm, eval_timed = eval_times[:warmup], eval_times[warmup:]
    res = dict(
        bench="hf_torch_transfo_xl_cpu_compiled",
        train_tokens_per_s=round(tokens_per_step * timed / sum(train_timed), 1),
        eval_tokens_per_s=round(tokens_per_step * timed / sum(eval_timed), 1),
        peak_rss_mb=round(peak_rss, 1),
        peak_rss_mb_after_train=round(rss_after_train, 1),
        train_tokens_per_s_from_median_step=round(tokens_per_step / median(train_timed), 1),
        eval_tokens_per_s_from_median_step=round(tokens_per_step / median(eval_timed), 1),
        train_step_s=[round(t, 4) for t in train_timed],
        eval_step_s=[round(t, 4) for t in eval_timed],
        train_warmup_step_s=[round(t, 3) for t in train_warm],
        eval_warmup_step_s=[round(t, 3) for t in eval_warm],
        train_compile_s=round(sum(train_warm) - warmup * median(train_timed), 2),
        eval_compile_s=round(sum(eval_warm) - warmup * median(eval_timed), 2),
        graph_breaks=graph_breaks, unique_graphs=unique_graphs,
        compile=dict(backend=args.backend, mode=args.mode or "default"),
        train_loss_first_last=[round(train_losses[0], 4), round(train_losses[-1], 4)],
        tokens_per_step=tokens_per_step, warmup_steps=warmup, timed_steps=timed,
        batch=ref.BATCH, tgt_len=ref.TGT_LEN, mem_len=ref.MEM_LEN, n_params=n_params,
        threads=torch.get_num_threads(), optimizer="Adam(lr=2.5e-4)",
        eval_mode="no_grad, labels given (per-token NLL), memory carried",
        config=ref.CONFIG, transformers=transformers.__version__, torch=torch.__version__,
        pos_seq_shim=shim, python=sys.version.split()[0], cpu_count=os.cpu_count(),
        machine=platform.machine(), reference_script=os.path.abspath(args.reference_script),
        host=host,
    )
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
