"""Runs keras-txl's throughput benchmark and the reference's alternately; medians and ratios.

The machines are shared and noisy, so one run of each says little: this runs
`benchmarks/throughput.py` (ours, each given configuration) and
`shared/bench/bench_hf_torch.py` (Hugging Face PyTorch TransfoXL, in its own
virtualenv) one after the other, `--rounds` times, each in a fresh process,
and reports per metric the median over rounds and the ratio of medians. It also measures
each framework's resident memory right after import (in a separate process) and the peak
above it.

Peak resident memory has two parts that behave differently. Anonymous memory is what the
process allocated. File-backed memory is the frameworks' shared-library pages the process
touched: the kernel maps a faulting page's neighbours too, but only those already in the
page cache, so this part moves by tens of MB with what the page cache happens to hold
(both frameworks' libraries are ~1 GB). So before every run the libraries of the venv
about to run are read once (the same worst case for both), and while it runs this script
samples the child's `/proc/<pid>/status` every 10 ms and reports the peak of each part
(`sampled_peak_anon_mb`, `sampled_peak_file_mb`) beside the child's own `peak_rss_mb`.

Prints one JSON line (all runs, medians, ratios) and a table.

    python benchmarks/compare_peer.py --peer-python ../peer-venv/bin/python \\
        --rounds 5 --ours "" --ours "--precision mixed_bfloat16"
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
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


def run_json(command):
    """Runs `command`; returns the last JSON line of its stdout, with sampled peaks."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
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
                 "import resource, sys; sys.path.insert(0, {root!r}); import keras_txl; "
                 "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)",
}


def import_rss_mb(python, probe):
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peer-python", required=True,
                        help="python of the virtualenv with torch + transformers")
    parser.add_argument("--peer-script",
                        default=os.path.join(HERE, "..", "..", "shared", "bench",
                                             "bench_hf_torch.py"))
    parser.add_argument("--ours", action="append", default=None,
                        help="arguments of one throughput.py configuration "
                             "(repeatable; default: fp32 graph mode)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if not os.path.exists(args.peer_script):
        parser.error(f"--peer-script {args.peer_script!r} does not exist")
    configs = args.ours or [""]
    commands = {"reference": [args.peer_python, args.peer_script]}
    for extra in configs:
        name = "keras-txl " + (extra.strip() or "(fp32)")
        commands[name] = [sys.executable, os.path.join(HERE, "throughput.py"),
                          "--no-peak", *shlex.split(extra)]
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
            result = run_json(command)
            runs[name].append({k: result[k] for k in metrics})
            print(f"round {round_index + 1}/{args.rounds} {name}: "
                  + ", ".join(f"{k}={result[k]}" for k in metrics), file=sys.stderr)
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in metrics}
               for name, rs in runs.items()}
    # The frameworks' own footprint, and the peak above it (the work's memory).
    root = os.path.dirname(HERE)
    warm_page_cache(libraries[args.peer_python])
    reference_import = import_rss_mb(args.peer_python, IMPORT_PROBES["reference"])
    warm_page_cache(libraries[sys.executable])
    baseline = {
        "reference": reference_import,
        "keras-txl": import_rss_mb(sys.executable,
                                   IMPORT_PROBES["keras-txl"].format(root=root)),
    }
    for name, m in medians.items():
        m["import_rss_mb"] = baseline["reference" if name == "reference" else "keras-txl"]
        m["peak_rss_above_import_mb"] = round(m["peak_rss_mb"] - m["import_rss_mb"], 1)
    reference = medians["reference"]
    ratios = {name: {k: round(m[k] / reference[k], 3)
                     for k in (*metrics, "peak_rss_above_import_mb")}
              for name, m in medians.items() if name != "reference"}
    print(json.dumps({"bench": "compare_peer", "rounds": args.rounds,
                      "seconds": round(time.time() - started), "medians": medians,
                      "ratios_to_reference": ratios, "runs": runs}))
    columns = (*metrics, "import_rss_mb", "peak_rss_above_import_mb")
    header = f"{'run':<42}" + "".join(f"{k[:26]:>28}" for k in columns)
    lines = [header]
    for name, m in medians.items():
        cells = []
        for k in columns:
            cell = f"{m[k]:.0f}"
            if name != "reference" and k in ratios[name]:
                cell += f" ({ratios[name][k]:.2f}x)"
            cells.append(f"{cell:>28}")
        lines.append(f"{name:<42}" + "".join(cells))
    print("\n".join(lines), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
