"""One-GPU throughput of keras-txl and the PyTorch reference (eager and torch.compile).

A GPU-sized configuration (default: the `wt103_base` preset, 16 layers, d 410, adaptive
softmax over 267,735 words, batch 60, T = M = 150, dropout 0.1), three frameworks at each
precision of `--precision` (default float32, mixed_bfloat16, mixed_float16), each run in a
fresh process, alternating for `--rounds` rounds:

- keras-txl: the library's own training step (`keras_txl.training.loop.Trainer`, memory
  carried as loop state, Adam, clip 0.25; mixed_float16 with Keras' LossScaleOptimizer)
  and evaluation step (`make_eval_step`, the memory carried as its key/value cache), as
  `benchmarks/throughput.py` does on the CPU: `keras` in graph mode (`tf.function`),
  `keras-xla` with both steps XLA-compiled (`jit_compile=True`);
- the reference, Hugging Face `TransfoXLLMHeadModel` on `cuda`, eager; the protocol of
  `shared/bench/bench_hf_torch.py` (forward with labels and memory, backward, Adam;
  evaluation without grad, memory carried), mixed precisions through `torch.autocast`
  (float16 with `torch.amp.GradScaler`);
- the same under `torch.compile` (compile time in the warm-up steps, reported apart).

Reported per run (one JSON line each, then a summary JSON line and a table on stderr that
names the GPU and the host): training and evaluation tokens/s (summed timed steps and
median step), MFU = model FLOPs / (time x the GPU's dense data-sheet peak of the precision
used: bf16, fp16, or fp32 / TF32 for float32 with `--tf32`), MFU against the matmul rate
measured in the run's process (an 8192^3 matmul in its dtype) and peak GPU memory
(TensorFlow's allocator peak; `torch.cuda.max_memory_allocated`). Model FLOPs per token:
the matmuls of one forward pass (x3 for training), the adaptive softmax counted as the
work the targets need (the head for every token, a tail cluster only for the targets in
it). The tokens follow a Zipf law over the vocabulary (`--data uniform` for uniform), the
same tokens for all runs.

The peaks come from the device name (H100 SXM / PCIe / NVL, H200, A100, A10, V100, T4),
or `--peak-tflops`. With no GPU visible the script stops with a message and exit status
3; `--dry-run` prints the resolved plan without a GPU, and `--allow-cpu --preset tiny`
runs every child on the CPU (the same code; a smoke test, not a benchmark; the
reference's mixed-precision runs are left out there: its adaptive softmax fails under
CPU autocast).

    python benchmarks/gpu.py --peer-python ../peer-venv-cuda/bin/python
        [--precision float32,mixed_bfloat16,mixed_float16] [--tf32] [--rounds 3]
        [--preset wt103_base --batch 60 --segment 150 --memory 150]
        [--frameworks keras,keras-xla,torch-eager,torch-compiled] [--peak-tflops 989]
    python benchmarks/gpu.py --merge ours.jsonl peers.jsonl [same configuration options]

A run that fails (out of memory, a compiler error) is reported with its error and the
others go on (exit status 1 at the end). `--merge` runs nothing: it summarises the per-run
JSON lines that earlier invocations printed (say, the reference measured while ours was
being installed), for the configuration its options give.

Needs the CUDA builds: keras-txl[cuda] here, a CUDA torch + transformers==4.37.2 in the peer's
venv (the CPU-only torch wheel of `make bench` cannot run it).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

REFERENCE = os.path.join(ROOT, "..", "shared", "bench", "bench_hf_torch.py")
FRAMEWORKS = ("keras", "keras-xla", "torch-eager", "torch-compiled")
OURS = ("keras", "keras-xla")  # keras-txl in graph mode (tf.function) and XLA-compiled
EXIT_NO_GPU = 3  # apart from argparse's 2

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")

# Dense (no sparsity) peaks in TFLOP/s from NVIDIA's data sheets; "tf32" is float32 on
# the tensor cores, "float32" the plain FP32 units; "float16" is the fp16 tensor-core
# rate (equal to bf16's from Ampere on; Volta and Turing have no bf16: None). Matched on
# the device name, in order ("A100" before "A10").
GPU_PEAKS = (
    ("H200 NVL", {"bfloat16": 835.5, "float16": 835.5, "tf32": 417.5, "float32": 60.0}),
    ("H200", {"bfloat16": 989.4, "float16": 989.4, "tf32": 494.7, "float32": 66.9}),  # SXM
    ("H100 NVL", {"bfloat16": 835.5, "float16": 835.5, "tf32": 417.5, "float32": 60.0}),
    ("H100 PCIE", {"bfloat16": 756.5, "float16": 756.5, "tf32": 378.0, "float32": 51.2}),
    ("H100", {"bfloat16": 989.4, "float16": 989.4, "tf32": 494.7,
              "float32": 66.9}),  # SXM (HBM3)
    ("A100", {"bfloat16": 312.0, "float16": 312.0, "tf32": 156.0, "float32": 19.5}),
    ("A10", {"bfloat16": 125.0, "float16": 125.0, "tf32": 62.5, "float32": 31.2}),
    ("V100", {"bfloat16": None, "float16": 125.0, "tf32": None, "float32": 15.7}),  # SXM2
    ("T4", {"bfloat16": None, "float16": 65.0, "tf32": None, "float32": 8.1}),
)


def lookup_peaks(device_name):
    """{dtype: dense TFLOP/s} for a device name like 'NVIDIA H100 80GB HBM3', or None."""
    name = (device_name or "").upper().replace("-", " ")
    for key, peaks in GPU_PEAKS:
        if key in name:
            return dict(peaks, matched=key)
    return None


def peak_dtype(precision, tf32):
    """The peak a run is measured against: its matmuls' dtype."""
    if precision == "mixed_bfloat16":
        return "bfloat16"
    if precision == "mixed_float16":
        return "float16"
    return "tf32" if tf32 else "float32"


def matmul_dtype(dtype):
    """The dtype a measured matmul peak multiplies in (tf32 is float32 on tensor cores)."""
    return "float32" if dtype == "tf32" else dtype


def torch_cuda_matmul_tflops(torch, dtype, n=8192, repeats=20):
    """Measured matmul rate of PyTorch on the GPU (best of 3 bursts), TFLOP/s."""
    kind = getattr(torch, dtype)
    a = torch.randn(n, n, device="cuda").to(kind)
    b = torch.randn(n, n, device="cuda").to(kind)
    best = 0.0
    for _ in range(4):  # the first burst warms up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(repeats):
            torch.mm(a, b)
        torch.cuda.synchronize()
        best = max(best, 2 * n**3 * repeats / (time.perf_counter() - t0) / 1e12)
    return best


def list_gpus():
    """[(name, memory MiB, driver)] from nvidia-smi; [] where it is missing or lists none."""
    if not shutil.which("nvidia-smi"):
        return []
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
         "--format=csv,noheader,nounits"], capture_output=True, text=True)
    if out.returncode:
        return []
    gpus = []
    for line in out.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            gpus.append({"name": parts[0], "memory_mib": parts[1], "driver": parts[2]})
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return []
    return gpus


def refuse(message):
    print(f"gpu.py: {message}\nThis benchmark runs on a host with one NVIDIA GPU. On a CPU "
          "host use `make bench` (benchmarks/compare_peer.py).", file=sys.stderr)
    sys.exit(EXIT_NO_GPU)


# --- the configuration ---------------------------------------------------------------
def resolve_config(args):
    """The model configuration (a dict of TransformerXLConfig fields), without TensorFlow."""
    from keras_txl.config import TransformerXLConfig

    changes = dict(segment_length=args.segment, memory_length=args.memory)
    config = TransformerXLConfig.from_preset(args.preset, **changes)
    return config.to_dict()


def hf_config(cfg):
    """The same model as a transformers.TransfoXLConfig dict."""
    return dict(
        vocab_size=cfg["vocabulary_size"], cutoffs=list(cfg["cutoffs"]), div_val=cfg["div_val"],
        d_model=cfg["hidden_dim"], d_embed=cfg["embedding_dim"] or cfg["hidden_dim"],
        n_head=cfg["num_heads"], d_head=cfg["head_dim"] or cfg["hidden_dim"] // cfg["num_heads"],
        d_inner=cfg["intermediate_dim"], n_layer=cfg["num_layers"], tgt_len=cfg["segment_length"],
        mem_len=cfg["memory_length"], clamp_len=cfg["clamp_length"],
        same_length=cfg["same_length"], pre_lnorm=cfg["pre_layer_norm"],
        untie_r=cfg["untie_relative_bias"], attn_type=0, dropout=cfg["dropout"],
        dropatt=cfg["attention_dropout"], layer_norm_epsilon=cfg["layer_norm_epsilon"],
    )


def cluster_fractions(cfg, targets):
    """Fraction of `targets` in the head and in each tail cluster of the adaptive softmax."""
    import numpy as np

    bounds = [0, *cfg["cutoffs"], cfg["vocabulary_size"]]
    targets = np.asarray(targets).ravel()
    return [float(np.mean((targets >= lo) & (targets < hi)))
            for lo, hi in zip(bounds[:-1], bounds[1:])]


def forward_flops_per_token(cfg, fractions=None):
    """Matmul FLOPs of one forward pass per token (multiply-add = 2), the softmax included.

    Adaptive softmax: the head (shortlist + one logit per tail cluster) for every token, a
    tail cluster's logits (and its projection) only for the targets in it (`fractions`,
    from `cluster_fractions`); an implementation that computes every tail for every token
    does more work than is counted.
    """
    D, L, I, V = cfg["hidden_dim"], cfg["num_layers"], cfg["intermediate_dim"], cfg["vocabulary_size"]
    NH = cfg["num_heads"] * (cfg["head_dim"] or D // cfg["num_heads"])
    T, M = cfg["segment_length"], cfg["memory_length"]
    K = T + M
    per_layer = (
        2 * D * NH  # q
        + 2 * D * 2 * NH * K / T  # k, v over memory + segment
        + 2 * D * NH * K / T  # W_R R (once per segment)
        + 3 * 2 * K * NH  # content scores, position scores, weighted values
        + 2 * NH * D  # output projection
        + 2 * 2 * D * I  # feed-forward
    )
    cutoffs = list(cfg.get("cutoffs", ()))
    if not cutoffs:
        return L * per_layer + 2 * D * V
    E = cfg["embedding_dim"] or D
    bounds = [0, *cutoffs, V]
    fractions = fractions or [1.0] + [0.0] * len(cutoffs)
    softmax = 0.0
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        d_i = E // (cfg["div_val"] ** i)
        projection = 2 * D * d_i if d_i != D else 0
        if i == 0:
            softmax += projection + 2 * d_i * (hi - lo + len(cutoffs))
        else:
            softmax += fractions[i] * (projection + 2 * d_i * (hi - lo))
    return L * per_layer + softmax


def make_tokens(cfg, batch, steps, kind, seed=1):
    """(batch, steps * T + 1) int32 tokens: Zipf over the vocabulary ids, or uniform."""
    import numpy as np

    rng = np.random.default_rng(seed)
    V, n = cfg["vocabulary_size"], steps * cfg["segment_length"] + 1
    if kind == "uniform":
        return rng.integers(0, V, size=(batch, n)).astype("int32")
    p = 1.0 / np.arange(1, V + 1)
    return rng.choice(V, size=(batch, n), p=p / p.sum()).astype("int32")


def median(values):
    return sorted(values)[len(values) // 2]


def step_report(prefix, tokens_per_step, warm, timed):
    return {
        f"{prefix}_tokens_per_s": round(tokens_per_step * len(timed) / sum(timed), 1),
        f"{prefix}_tokens_per_s_from_median_step": round(tokens_per_step / median(timed), 1),
        f"{prefix}_step_s": [round(t, 4) for t in timed],
        f"{prefix}_warmup_step_s": [round(t, 3) for t in warm],
        f"{prefix}_compile_s": round(sum(warm) - len(warm) * median(timed), 2),
    }


# --- the children ------------------------------------------------------------------
def child_keras(args, cfg, data, jit):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus and not args.allow_cpu:
        refuse("TensorFlow sees no GPU (a CUDA build is needed: pip install 'keras-txl[cuda]').")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    tf.config.experimental.enable_tensor_float_32_execution(args.tf32)
    from keras_txl.config import TransformerXLConfig
    from keras_txl.training.config import TrainConfig
    from keras_txl.training.loop import Trainer

    device = "GPU:0" if gpus else None
    memory_mb = (lambda: tf.config.experimental.get_memory_info(device)["peak"] / 2**20) \
        if device else (lambda: None)
    from hostinfo import tf_matmul_peak_gflops
    from steps import time_eval_steps
    from steps import time_train_steps

    # The matmul rate this GPU reaches in this run's dtype (tiny on a CPU smoke run).
    matmul_tflops = tf_matmul_peak_gflops(
        tf, n=8192 if gpus else 256, repeats=20 if gpus else 2,
        dtype=matmul_dtype(peak_dtype(args.precision, args.tf32))) / 1e3
    if device:
        tf.config.experimental.reset_memory_stats(device)
    B, T = args.batch, cfg["segment_length"]
    steps = args.warmup + args.timed
    train_config = TrainConfig(batch_size=B, learning_rate=2.5e-4, warmup_steps=0, steps=steps,
                               clip_norm=0.25, jit_compile=jit, precision=args.precision)
    trainer = Trainer(TransformerXLConfig.from_dict(cfg), train_config,
                      tf.distribute.get_strategy(), verbose=False)
    model = trainer.model
    times, losses = time_train_steps(tf, trainer, data, T, steps)
    train_memory = memory_mb()
    if device:
        tf.config.experimental.reset_memory_stats(device)
    eval_times = time_eval_steps(tf, model, data, T, steps, jit)
    scaler = trainer.loss_scaler
    result = dict(framework="keras-txl", precision=args.precision, tensorflow=tf.__version__,
                  matmul_tflops_measured=round(matmul_tflops, 3),
                  loss_scale_final=(float(scaler.dynamic_scale.numpy()) if scaler else None),
                  device=(tf.config.experimental.get_device_details(gpus[0]).get("device_name")
                          if gpus else "cpu"),
                  n_params=model.count_params(), train_loss_first_last=[losses[0], losses[-1]],
                  train_peak_memory_mb=train_memory, eval_peak_memory_mb=memory_mb(),
                  jit_compile=jit)
    result.update(step_report("train", B * T, times[:args.warmup], times[args.warmup:]))
    result.update(step_report("eval", B * T, eval_times[:args.warmup], eval_times[args.warmup:]))
    return result


def child_torch(args, cfg, data, compiled):
    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        refuse(f"PyTorch sees no GPU (torch {torch.__version__}, CUDA build: "
               f"{torch.version.cuda or 'no'}; the peer venv needs a CUDA torch).")
    import transformers
    from transformers import TransfoXLConfig
    from transformers import TransfoXLLMHeadModel

    if os.path.exists(REFERENCE):  # the shared script's shim for transformers >= 4.38
        import importlib.util

        spec = importlib.util.spec_from_file_location("bench_hf_torch", REFERENCE)
        reference = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(reference)
        shim = reference._install_shim_if_needed()
    else:
        shim = None
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.manual_seed(0)
    eager = TransfoXLLMHeadModel(TransfoXLConfig(**hf_config(cfg))).to(device)
    n_params = sum(p.numel() for p in eager.parameters())
    model = torch.compile(eager) if compiled else eager
    autocast_dtype = {"mixed_bfloat16": torch.bfloat16,
                      "mixed_float16": torch.float16}.get(args.precision)
    mixed = autocast_dtype is not None
    # float16: dynamic loss scaling, as keras-txl's LossScaleOptimizer.
    scaler = torch.amp.GradScaler(device, enabled=args.precision == "mixed_float16")
    matmul_tflops = (torch_cuda_matmul_tflops(
        torch, matmul_dtype(peak_dtype(args.precision, args.tf32))) if cuda else None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    B, T = args.batch, cfg["segment_length"]
    steps = args.warmup + args.timed
    ids = torch.from_numpy(data.astype("int64")).to(device)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def memory_mb():
        return torch.cuda.max_memory_allocated() / 2**20 if cuda else None

    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=2.5e-4)
    mems, times, losses = None, [], []
    for k in range(steps):
        x = ids[:, k * T:(k + 1) * T]
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=autocast_dtype, enabled=mixed):
            out = model(input_ids=x, labels=x, mems=mems)
        scaler.scale(out.loss).backward()
        scaler.step(opt)
        scaler.update()
        mems = out.mems
        losses.append(float(out.loss))  # waits for the step
        times.append(time.perf_counter() - t0)
    train_memory = memory_mb()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    model.eval()
    mems, eval_times = None, []
    with torch.no_grad():
        for k in range(steps):
            x = ids[:, k * T:(k + 1) * T]
            sync()
            t0 = time.perf_counter()
            with torch.autocast(device, dtype=autocast_dtype, enabled=mixed):
                out = model(input_ids=x, labels=x, mems=mems)
            mems = out.mems
            sync()
            eval_times.append(time.perf_counter() - t0)
    result = dict(framework="torch", precision=args.precision, torch=torch.__version__,
                  matmul_tflops_measured=(round(matmul_tflops, 3) if matmul_tflops else None),
                  loss_scale_final=(float(scaler.get_scale()) if scaler.is_enabled() else None),
                  transformers=transformers.__version__, compiled=compiled, pos_seq_shim=shim,
                  device=torch.cuda.get_device_name(0) if cuda else "cpu", n_params=n_params,
                  train_loss_first_last=[losses[0], losses[-1]],
                  train_peak_memory_mb=train_memory, eval_peak_memory_mb=memory_mb())
    if compiled:
        try:
            from torch._dynamo.utils import counters

            result["graph_breaks"] = sum(counters["graph_break"].values())
            result["unique_graphs"] = counters["stats"].get("unique_graphs")
        except ImportError:
            pass
    result.update(step_report("train", B * T, times[:args.warmup], times[args.warmup:]))
    result.update(step_report("eval", B * T, eval_times[:args.warmup], eval_times[args.warmup:]))
    return result


# --- the parent ----------------------------------------------------------------------
def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="wt103_base")
    parser.add_argument("--batch", type=int, default=60)
    parser.add_argument("--segment", type=int, default=150, help="T")
    parser.add_argument("--memory", type=int, default=150, help="M")
    parser.add_argument("--precision", default=",".join(PRECISIONS),
                        help=f"comma-separated, of {', '.join(PRECISIONS)}: each framework "
                             "runs at each (mixed_float16 with dynamic loss scaling: Keras' "
                             "LossScaleOptimizer, torch's GradScaler)")
    parser.add_argument("--tf32", action="store_true",
                        help="float32 matmuls on the tensor cores (TF32) in both frameworks; "
                             "MFU then against the TF32 peak")
    parser.add_argument("--jit", action="store_true",
                        help="shorthand: keras-txl's runs XLA-compiled (keras-xla for keras)")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                        help=f"comma-separated, of {', '.join(FRAMEWORKS)}")
    parser.add_argument("--peer-python", default=sys.executable,
                        help="python of a venv with a CUDA torch and transformers==4.37.2")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timed", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data", choices=["zipf", "uniform"], default="zipf")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="dense peak TFLOP/s for every precision (default: looked up "
                             "per precision from the device name)")
    parser.add_argument("--device-name", default=None,
                        help="with --dry-run: the GPU whose peaks to look up")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the resolved plan (config, FLOPs, peaks) and exit; no GPU")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="run the children on a CPU host, with --preset tiny or "
                             "char_small only: proves the script end to end (the same code "
                             "as on a GPU); its figures are not a benchmark")
    parser.add_argument("--merge", nargs="+", metavar="JSONL", default=None,
                        help="run nothing: summarise the per-run JSON lines these files "
                             "hold (earlier runs' stdout, e.g. ours and the reference "
                             "measured in separate invocations) with this configuration")
    parser.add_argument("--child", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    parser.add_argument("--data-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    def listed(flag, text, allowed):
        items = [f.strip() for f in text.split(",") if f.strip()]
        unknown = sorted(set(items) - set(allowed))
        if unknown or not items:
            parser.error(f"{flag}: unknown {unknown or text!r}; choose from "
                         f"{', '.join(allowed)}")
        return list(dict.fromkeys(items))

    args.frameworks = listed("--frameworks", args.frameworks, FRAMEWORKS)
    if args.jit:
        args.frameworks = list(dict.fromkeys(
            "keras-xla" if f == "keras" else f for f in args.frameworks))
    args.precisions = listed("--precision", args.precision, PRECISIONS)
    args.precision = args.precisions[0]  # a child runs one
    if args.child and len(args.precisions) != 1:
        parser.error("--child runs one --precision")
    minimum = dict(batch=1, segment=1, memory=0, warmup=2, timed=1, rounds=1)
    for name, least in minimum.items():
        if getattr(args, name) < least:
            parser.error(f"--{name} must be >= {least}")
    if args.peak_tflops is not None and args.peak_tflops <= 0:
        parser.error("--peak-tflops must be > 0")
    if args.allow_cpu and args.preset not in CPU_PRESETS:
        parser.error(f"--allow-cpu runs a CPU smoke test of --preset {' or '.join(CPU_PRESETS)}"
                     f" only, received --preset {args.preset}")
    return args


CPU_PRESETS = ("tiny", "char_small")


def run_child(python, framework, precision, argv, data_file):
    """One run in a fresh process: its result dict, or {"error": ...} if it failed.

    A run that fails (an out-of-memory, a compiler error in one framework) is
    reported and the others go on; a child that finds no GPU stops the benchmark.
    """
    command = [python, os.path.abspath(__file__), *argv, "--precision", precision,
               "--child", framework, "--data-file", data_file]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode == EXIT_NO_GPU:
        sys.stderr.write(out.stderr)
        sys.exit(EXIT_NO_GPU)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not lines:
        return {"error": f"exited with {out.returncode}: {out.stderr[-3000:]}"}
    return json.loads(lines[-1])


def run_label(framework, precision):
    return f"{framework} {precision}"


def read_runs(paths, precisions, frameworks):
    """{(framework, precision): [result, ...]} from files of per-run JSON lines."""
    runs = {(f, p): [] for p in precisions for f in frameworks}
    labels = {run_label(*key): key for key in runs}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                record = json.loads(line)
                key = labels.get(record.get("run")) if record.get("bench") == "gpu" else None
                if key and "error" not in record:
                    runs[key].append(record)
    return runs


def summarize(runs, peak, flops):
    """Medians per run (tokens/s, MFU, memory) and keras-txl's ratios to each peer."""
    keys = ("train_tokens_per_s", "train_tokens_per_s_from_median_step", "eval_tokens_per_s",
            "eval_tokens_per_s_from_median_step", "train_peak_memory_mb", "eval_peak_memory_mb",
            "train_compile_s", "eval_compile_s", "matmul_tflops_measured")
    medians = {}
    for (framework, precision), results in runs.items():
        if not results:
            continue
        # Rounded: the median of an even count is a mean (42.5545 + 42.867 would print
        # 42.710499999999996).
        m = {k: round(statistics.median(r[k] for r in results), 3)
             if results[0].get(k) is not None else None for k in keys}
        m["rounds"] = len(results)
        if peak.get(precision):
            m["train_mfu"] = round(3 * flops * m["train_tokens_per_s"]
                                   / (peak[precision] * 1e12), 4)
            m["eval_mfu"] = round(flops * m["eval_tokens_per_s"] / (peak[precision] * 1e12), 4)
        if m["matmul_tflops_measured"]:
            measured = m["matmul_tflops_measured"] * 1e12
            m["train_mfu_vs_measured"] = round(3 * flops * m["train_tokens_per_s"] / measured, 4)
            m["eval_mfu_vs_measured"] = round(flops * m["eval_tokens_per_s"] / measured, 4)
        medians[run_label(framework, precision)] = m
    ratios = {}
    for (framework, precision) in runs:
        ours = medians.get(run_label(framework, precision))
        if framework not in OURS or not ours:
            continue
        for peer, peer_precision in runs:
            theirs = medians.get(run_label(peer, peer_precision))
            if peer in OURS or peer_precision != precision or not theirs:
                continue
            ratios[f"{run_label(framework, precision)} / {peer}"] = {
                k: round(ours[k] / theirs[k], 3)
                for k in ("train_tokens_per_s", "eval_tokens_per_s",
                          "train_peak_memory_mb", "eval_peak_memory_mb")
                if ours[k] and theirs[k]}
    return medians, ratios


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    cfg = resolve_config(args)
    if args.child:
        import numpy as np
        from hostinfo import host_block

        data = np.load(args.data_file)
        if args.child in OURS:
            result = child_keras(args, cfg, data, jit=args.child == "keras-xla")
        else:
            result = child_torch(args, cfg, data, compiled=args.child == "torch-compiled")
        # The host each run measured on: merged runs name theirs.
        host = host_block(None)
        result["host"] = {"cpu": host["cpu"], "cores": host["cores"], "gpus": list_gpus()}
        print(json.dumps(result))
        return 0

    from hostinfo import host_block

    dtypes = {p: peak_dtype(p, args.tf32) for p in args.precisions}
    steps = args.warmup + args.timed
    data = make_tokens(cfg, args.batch, steps, args.data)
    fractions = cluster_fractions(cfg, data[:, 1:])
    flops = forward_flops_per_token(cfg, fractions)
    merged = read_runs(args.merge, args.precisions, args.frameworks) if args.merge else None
    if args.dry_run or merged is not None:
        gpus = []
        device_name = args.device_name or next(
            (r["device"] for results in (merged or {}).values() for r in results), None)
    else:
        gpus = list_gpus()
        device_name = gpus[0]["name"] if gpus else None
    peaks = lookup_peaks(device_name)
    peak = {p: args.peak_tflops or (peaks or {}).get(d) for p, d in dtypes.items()}
    plan = {"bench": "gpu", "preset": args.preset, "batch": args.batch, "config": cfg,
            "hf_config": hf_config(cfg), "precisions": args.precisions, "tf32": args.tf32,
            "peak_dtype": dtypes, "device": device_name, "peaks_tflops": peaks,
            "peak_tflops_used": peak, "frameworks": args.frameworks, "rounds": args.rounds,
            "warmup_steps": args.warmup, "timed_steps": args.timed, "data": args.data,
            "peer_python": args.peer_python,
            "cluster_fractions": [round(f, 4) for f in fractions],
            "forward_gflop_per_token": round(flops / 1e9, 4),
            "cpu_smoke_test": bool(args.allow_cpu and not gpus and merged is None)}
    if args.dry_run:
        plan["dry_run"] = True
        print(json.dumps(plan))
        return 0
    if merged is None and not gpus and not args.allow_cpu:
        refuse("no GPU visible (nvidia-smi is missing or lists no GPU, or "
               "CUDA_VISIBLE_DEVICES hides them).")
    missing = [p for p, value in peak.items() if value is None]
    if missing and device_name:
        print(f"gpu.py: no data-sheet peak known for {device_name!r} at {missing}; MFU "
              "against the data sheet is left out there (give --peak-tflops); MFU against "
              "the measured matmul rate is reported", file=sys.stderr)
    failed = []
    started = time.time()
    if merged is not None:
        runs, skipped = merged, []
        plan["merged_from"] = args.merge
    else:
        runs, skipped = collect_runs(args, argv, gpus, data, failed)
    plan["skipped_runs"] = skipped
    medians, ratios = summarize(runs, peak, flops)
    host = host_block(None)
    host["gpus"] = gpus
    if merged is not None:
        # The runs' own host (where they recorded it), not the one merging.
        recorded = [r["host"] for results in runs.values() for r in results if r.get("host")]
        host = dict(recorded[0]) if recorded else {"cpu": "not recorded", "cores": "?",
                                                   "gpus": []}
        gpus = host["gpus"]
    plan.update(host=host, medians=medians, ratios_keras_to=ratios, failed_runs=failed,
                runs={run_label(*key): value for key, value in runs.items()},
                seconds=round(time.time() - started))
    print(json.dumps(plan))
    print_table(args, cfg, gpus, device_name, dtypes, peak, host, medians, ratios, failed,
                merged is not None)
    return 1 if failed else 0


def collect_runs(args, argv, gpus, data, failed):
    """Every (framework, precision) run, `args.rounds` alternating rounds, in fresh
    processes; one JSON line each on stdout as it ends. Failed runs go to `failed`."""
    pythons = {"keras": sys.executable, "keras-xla": sys.executable,
               "torch-eager": args.peer_python, "torch-compiled": args.peer_python}
    runs = {(f, p): [] for p in args.precisions for f in args.frameworks}
    skipped = []
    if not gpus:
        # CPU smoke test: Hugging Face's TransfoXL head fails under CPU autocast
        # ("Index put requires the source and destination dtypes match"): the reference
        # runs in float32 there (on a GPU, autocast keeps its log-softmax in float32).
        skipped = [run_label(*k) for k in runs if k[0] not in OURS and k[1] != "float32"]
        runs = {k: v for k, v in runs.items() if run_label(*k) not in skipped}
        if skipped:
            print(f"gpu.py: CPU smoke test, not run: {', '.join(skipped)} (the reference's "
                  "adaptive softmax fails under CPU autocast)", file=sys.stderr)
    # A child's own argv: this run's, less the options only the parent reads.
    child_argv = []
    skip = 0
    for i, item in enumerate(argv):
        if skip:
            skip -= 1
            continue
        if item in ("--precision", "--frameworks"):
            skip = 1
            continue
        if item.startswith(("--precision=", "--frameworks=")):
            continue
        child_argv.append(item)
    with tempfile.TemporaryDirectory() as tmp:
        data_file = os.path.join(tmp, "tokens.npy")
        import numpy as np

        np.save(data_file, data)
        for round_index in range(args.rounds):
            for framework, precision in runs:
                label = run_label(framework, precision)
                result = run_child(pythons[framework], framework, precision, child_argv,
                                   data_file)
                # One JSON line per run, as it finishes.
                print(json.dumps({"bench": "gpu", "run": label, "round": round_index + 1,
                                  **result}), flush=True)
                if "error" in result:
                    failed.append({"run": label, "round": round_index + 1,
                                   "error": result["error"][-600:]})
                    print(f"round {round_index + 1}/{args.rounds} {label}: FAILED, "
                          f"{result['error'][-600:]}", file=sys.stderr)
                    continue
                runs[framework, precision].append(result)
                print(f"round {round_index + 1}/{args.rounds} {label}: train "
                      f"{result['train_tokens_per_s']} tok/s, eval {result['eval_tokens_per_s']}"
                      f" tok/s, memory {result['train_peak_memory_mb']} / "
                      f"{result['eval_peak_memory_mb']} MB", file=sys.stderr, flush=True)
    return runs, skipped


def print_table(args, cfg, gpus, device_name, dtypes, peak, host, medians, ratios, failed,
                merged):
    """The human-readable summary on stderr: the GPU and host, one row per run, ratios."""
    gpu_text = ", ".join(f"{g['name']} ({g['memory_mib']} MiB, driver {g['driver']})" for g in gpus)
    if merged:
        gpu_text = f"{gpu_text or device_name} (merged runs)"
    peaks_text = ", ".join(f"{dtypes[p]} {peak[p]}" for p in args.precisions)
    print(f"GPU: {gpu_text or 'none (CPU smoke test: not a benchmark)'}; data-sheet peaks "
          f"TFLOP/s: {peaks_text}; CPU: {host['cpu']}, {host['cores']} cores",
          file=sys.stderr)
    rounds = max((m["rounds"] for m in medians.values()), default=0)
    print(f"{args.preset}, batch {args.batch}, T {cfg['segment_length']}, M "
          f"{cfg['memory_length']}{', TF32' if args.tf32 else ''}; medians of up to "
          f"{rounds} rounds", file=sys.stderr)
    header = ("run", "rounds", "train tok/s", "eval tok/s", "train MFU", "eval MFU",
              "matmul TFLOP/s measured", "train MFU vs measured", "train MB", "eval MB",
              "warm-up extra s (compile)")

    def mb(value):
        return "-" if value is None else f"{value:,.0f}"

    def cell(value):
        return "-" if value is None else str(value)

    print("| " + " | ".join(header) + " |", file=sys.stderr)
    print("|---" * len(header) + "|", file=sys.stderr)
    for label, m in medians.items():
        compile_s = (m["train_compile_s"] or 0) + (m["eval_compile_s"] or 0)
        cells = [label, str(m["rounds"]), f"{m['train_tokens_per_s']:,.0f}",
                 f"{m['eval_tokens_per_s']:,.0f}",
                 cell(m.get("train_mfu")), cell(m.get("eval_mfu")),
                 cell(m["matmul_tflops_measured"]), cell(m.get("train_mfu_vs_measured")),
                 mb(m["train_peak_memory_mb"]), mb(m["eval_peak_memory_mb"]),
                 f"{compile_s:.1f}"]
        print("| " + " | ".join(cells) + " |", file=sys.stderr)
    for label, r in ratios.items():
        print(f"{label}: " + ", ".join(f"{k} {v}x" for k, v in r.items()), file=sys.stderr)
    for f in failed:
        print(f"FAILED {f['run']} (round {f['round']})", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
