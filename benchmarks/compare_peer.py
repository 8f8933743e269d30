"""Runs keras-txl's throughput benchmark and the reference's, eager and compiled, alternately.

The machines are shared and noisy, so one run of each says little: this runs
`benchmarks/throughput.py` (ours, each given configuration) and the peers, the Hugging Face
PyTorch TransfoXL in its own virtualenv: eager (`shared/bench/bench_hf_torch.py`) and under
`torch.compile` (`benchmarks/bench_hf_torch_compiled.py`, the same config and protocol), one
after the other, `--rounds` times (>= 5 for a measurement), each in a fresh process. It
reports per metric the median over rounds and the ratios of medians: ours against each peer
and against the best peer (per metric: the fastest, or the smallest memory). It also measures
each framework's resident memory right after import (in a separate process) and the peak
above it.

`--isa avx2` caps every process at AVX2 (`ONEDNN_MAX_CPU_ISA=AVX2` for TensorFlow's oneDNN
kernels; `ATEN_CPU_CAPABILITY=avx2` for PyTorch's ATen kernels, and `MKL_ENABLE_INSTRUCTIONS=AVX2`
because PyTorch's fp32 CPU matmuls are MKL's, which ATen's variable does not cap); `--isa
native` (the default) removes those variables. The JSON line's `host` block (CPU, ISA, cap,
cores, each framework's matmul peak measured in its own venv under the same cap) says which.

Peak resident memory has two parts that behave differently. Anonymous memory is what the
process allocated. File-backed memory is the frameworks' shared-library pages the process
touched: the kernel maps a faulting page's neighbours too, but only those already in the
page cache, so this part moves by tens of MB with what the page cache happens to hold
(both frameworks' libraries are ~1 GB). So before every run the libraries of the venv
about to run are read once (the same worst case for both), and while it runs this script
samples the child's `/proc/<pid>/status` every 10 ms and reports the peak of each part
(`sampled_peak_anon_mb`, `sampled_peak_file_mb`) beside the child's own `peak_rss_mb`.

Prints one JSON line (host, all runs, medians, ratios) and a table.

    python benchmarks/compare_peer.py --peer-python ../peer-venv/bin/python \\
        --rounds 5 --ours "" --ours "--precision mixed_bfloat16" [--isa avx2] \\
        [--peers eager --peers compiled]
"""

import argparse
import getpass
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from hostinfo import host_block_in  # noqa: E402
from hostinfo import host_line  # noqa: E402

METRICS = (
    "train_tokens_per_s", "train_tokens_per_s_from_median_step",
    "eval_tokens_per_s", "eval_tokens_per_s_from_median_step", "peak_rss_mb",
)
SAMPLED = {"RssAnon": "sampled_peak_anon_mb", "RssFile": "sampled_peak_file_mb"}


def site_packages(python):
    code = "import json, site; print(json.dumps(site.getsitepackages()))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def shared_libraries(folders):
    for folder in folders:
        for root, _, names in os.walk(folder):
            for name in names:
                if name.endswith(".so") or ".so." in name:
                    yield os.path.join(root, name)


def warm_page_cache(paths):
    """Reads each file once, so the page cache holds all of it."""
    buffer = bytearray(8 << 20)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buffer):
                pass


def sample_rss(pid, peaks, done, interval=0.01):
    """Keeps the largest RssAnon / RssFile (MB) of process `pid` in `peaks`."""
    path = f"/proc/{pid}/status"
    while not done.is_set():
        try:
            with open(path) as f:
                for line in f:
                    key = line.split(":", 1)[0]
                    if key in peaks:
                        peaks[key] = max(peaks[key], int(line.split()[1]) / 1024.0)
        except (FileNotFoundError, ProcessLookupError):
            return
        done.wait(interval)


def run_json(command, env=None):
    """Runs `command`; returns the last JSON line of its stdout, with sampled peaks."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)
    peaks, done = dict.fromkeys(SAMPLED, 0.0), threading.Event()
    sampler = threading.Thread(target=sample_rss, args=(process.pid, peaks, done))
    sampler.start()
    out, err = process.communicate()
    done.set()
    sampler.join()
    if process.returncode:
        raise RuntimeError(f"{command} exited with {process.returncode}:\n{err[-2000:]}")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"no JSON line from {command}:\n{out[-2000:]}")
    result = json.loads(lines[-1])
    result.update({SAMPLED[k]: round(v, 1) for k, v in peaks.items()})
    return result


IMPORT_PROBES = {
    # What each process has resident once its framework is imported, before any work.
    "reference": "import resource, torch, transformers; "
                 "from transformers import TransfoXLLMHeadModel; "
                 "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)",
    "keras-txl": "import os; os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3'); "
                 "import resource, sys; sys.path.insert(0, {root!r}); "
                 # keras_txl loads lazily (PEP 562): name a model class to import TF/Keras.
                 "from keras_txl import TransformerXLCausalLM; "
                 "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)",
}


def import_rss_mb(python, probe, env=None):
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True,
                         env=env)
    return float(out.stdout.strip().splitlines()[-1])


ISA_CAPS = {
    # --isa -> the environment of every child process (None: the variable is removed).
    # DNNL_MAX_CPU_ISA is oneDNN's older name for ONEDNN_MAX_CPU_ISA: never inherited.
    "native": {"ONEDNN_MAX_CPU_ISA": None, "DNNL_MAX_CPU_ISA": None,
               "ATEN_CPU_CAPABILITY": None, "MKL_ENABLE_INSTRUCTIONS": None},
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": None,
             "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}
PEERS = {"eager": "reference (eager)", "compiled": "reference (torch.compile)"}
# Per metric, which peer is the strongest: the largest throughput, the smallest memory.
SMALLER_IS_BETTER = ("peak_rss_mb", "sampled_peak_anon_mb", "sampled_peak_file_mb",
                     "peak_rss_above_import_mb")
COMPILE_KEYS = ("train_compile_s", "eval_compile_s")


def child_env(isa):
    env = dict(os.environ)
    for name, value in ISA_CAPS[isa].items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    # Inductor's compiled kernels are cached on disk keyed without the ISA cap:
    # kernels built for AVX-512 were reused under ATEN_CPU_CAPABILITY=avx2 and
    # crashed (SIGSEGV, out-of-bounds indices). One cache per level.
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
            tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}_{isa}")
    return env


def ratio(a, b):
    return round(a / b, 3) if b else None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peer-python", required=True,
                        help="python of the virtualenv with torch + transformers")
    parser.add_argument("--peer-script",
                        default=os.path.join(HERE, "..", "..", "shared", "bench",
                                             "bench_hf_torch.py"),
                        help="the eager reference script")
    parser.add_argument("--compiled-peer-script",
                        default=os.path.join(HERE, "bench_hf_torch_compiled.py"))
    parser.add_argument("--compiled-args", default="",
                        help="extra arguments of the compiled peer (e.g. '--mode max-autotune')")
    parser.add_argument("--peers", action="append", choices=sorted(PEERS), default=None,
                        help="peers to run (repeatable; default: eager and compiled)")
    parser.add_argument("--ours", action="append", default=None,
                        help="arguments of one throughput.py configuration "
                             "(repeatable; default: fp32 graph mode)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="alternating rounds (>= 5 for a measurement; fewer: a smoke run)")
    parser.add_argument("--isa", choices=sorted(ISA_CAPS), default="native",
                        help="avx2: cap both frameworks at AVX2; native: no cap")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if not os.path.exists(args.peer_script):
        parser.error(f"--peer-script {args.peer_script!r} does not exist")
    peers = list(dict.fromkeys(args.peers or ["eager", "compiled"]))
    if "compiled" in peers and not os.path.exists(args.compiled_peer_script):
        parser.error(f"--compiled-peer-script {args.compiled_peer_script!r} does not exist")
    if args.rounds < 5:
        print(f"compare_peer: {args.rounds} round(s) < 5: a smoke run, not a measurement",
              file=sys.stderr)
    env = child_env(args.isa)
    configs = args.ours or [""]
    commands = {}
    for peer in peers:
        if peer == "eager":
            commands[PEERS[peer]] = [args.peer_python, args.peer_script]
        else:
            commands[PEERS[peer]] = [args.peer_python, args.compiled_peer_script, "--no-peak",
                                     *shlex.split(args.compiled_args)]
    peer_names = list(commands)
    for extra in configs:
        name = "keras-txl " + (extra.strip() or "(fp32)")
        commands[name] = [sys.executable, os.path.join(HERE, "throughput.py"),
                          "--no-peak", *shlex.split(extra)]
    ours_names = [n for n in commands if n not in peer_names]
    libraries = {
        python: sorted(shared_libraries(site_packages(python)))
        for python in {args.peer_python, sys.executable}
    }
    metrics = (*METRICS, *SAMPLED.values())
    runs = {name: [] for name in commands}
    started = time.time()
    for round_index in range(args.rounds):
        for name, command in commands.items():  # alternate, every round
            warm_page_cache(libraries[command[0]])
            result = run_json(command, env)
            run = {k: result[k] for k in metrics}
            run.update({k: result[k] for k in COMPILE_KEYS if k in result})
            if name in ours_names:
                # How ours evaluated, and whether XLA's own kernels were held to the
                # cap (benchmarks/xla_isa_cap.py): a capped run whose XLA kernels
                # were not is no measurement of that ISA level.
                run["eval_jit_compile"] = result.get("eval_jit_compile")
                cap = result.get("host", {}).get("xla_kernels_cap") or {}
                run["xla_kernels_capped"] = cap.get("applied") if cap.get("cap") else None
            run["load_average_1m"] = round(os.getloadavg()[0], 2)
            runs[name].append(run)
            print(f"round {round_index + 1}/{args.rounds} {name}: "
                  + ", ".join(f"{k}={v}" for k, v in run.items()), file=sys.stderr)
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in metrics}
               for name, rs in runs.items()}
    # The frameworks' own footprint, and the peak above it (the work's memory).
    root = os.path.dirname(HERE)
    warm_page_cache(libraries[args.peer_python])
    reference_import = import_rss_mb(args.peer_python, IMPORT_PROBES["reference"], env)
    warm_page_cache(libraries[sys.executable])
    ours_import = import_rss_mb(sys.executable, IMPORT_PROBES["keras-txl"].format(root=root), env)
    for name, m in medians.items():
        m["import_rss_mb"] = reference_import if name in peer_names else ours_import
        m["peak_rss_above_import_mb"] = round(m["peak_rss_mb"] - m["import_rss_mb"], 1)
    # The host, once per run: the CPU and cap, and each framework's matmul peak measured
    # in its own venv under the same environment as the runs.
    host = {"isa_option": args.isa,
            "keras-txl": host_block_in(sys.executable, "tensorflow", env),
            "reference": host_block_in(args.peer_python, "torch", env)}
    compared = (*metrics, "peak_rss_above_import_mb")
    best_peer = {}
    for k in compared:
        pick = min if k in SMALLER_IS_BETTER else max
        best_peer[k] = pick(peer_names, key=lambda n, k=k: medians[n][k])
    ratios = {name: {peer: {k: ratio(medians[name][k], medians[peer][k]) for k in compared}
                     for peer in peer_names}
              for name in ours_names}
    ratios_best = {name: {k: ratio(medians[name][k], medians[best_peer[k]][k]) for k in compared}
                   for name in ours_names}
    compile_medians = {name: {k: statistics.median(r[k] for r in runs[name])
                              for k in COMPILE_KEYS if k in runs[name][0]}
                       for name in peer_names}
    print(json.dumps({"bench": "compare_peer", "rounds": args.rounds,
                      "measurement": args.rounds >= 5, "isa": args.isa,
                      "seconds": round(time.time() - started), "host": host,
                      "medians": medians, "best_peer": best_peer,
                      "ratios_to_best_peer": ratios_best, "ratios_to_each_peer": ratios,
                      "peer_compile_s_medians": compile_medians, "runs": runs}))
    print(host_line(host["keras-txl"]), file=sys.stderr)
    print(host_line(host["reference"]), file=sys.stderr)
    print(f"--isa {args.isa}; medians of {args.rounds} alternating rounds; ours: (ratio to "
          "the best peer of that column)", file=sys.stderr)
    columns = (*metrics, "import_rss_mb", "peak_rss_above_import_mb")
    header = f"{'run':<42}" + "".join(f"{k[:26]:>28}" for k in columns)
    lines = [header]
    for name, m in medians.items():
        cells = []
        for k in columns:
            cell = f"{m[k]:.0f}"
            if name in ours_names and k in ratios_best[name]:
                cell += f" ({ratios_best[name][k]:.2f}x)"
            cells.append(f"{cell:>28}")
        lines.append(f"{name:<42}" + "".join(cells))
    lines.append("")
    keys = ("train_tokens_per_s", "eval_tokens_per_s", "peak_rss_mb")
    lines.append(f"{'ratios to each peer':<70}" + "".join(f"{k:>28}" for k in keys))
    for name in ours_names:
        for peer in peer_names:
            lines.append(f"{name + ' / ' + peer:<70}"[:70]
                         + "".join(f"{ratios[name][peer][k]:>28.2f}" for k in keys))
    print("\n".join(lines), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
