"""Runs keras-txl's throughput benchmark and the reference's alternately; medians and ratios.

The machines are shared and noisy, so one run of each says little: this runs
`benchmarks/throughput.py` (ours, each given configuration) and
`shared/bench/bench_hf_torch.py` (Hugging Face PyTorch TransfoXL, in its own
virtualenv) one after the other, `--rounds` times, each in a fresh process,
and reports per metric the median over rounds and the ratio of medians. It also measures
each framework's resident memory right after import (in a separate process) and the peak
above it.

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
import time

HERE = os.path.dirname(os.path.abspath(__file__))
METRICS = (
    "train_tokens_per_s", "train_tokens_per_s_from_median_step",
    "eval_tokens_per_s", "eval_tokens_per_s_from_median_step", "peak_rss_mb",
)


def run_json(command):
    """Runs `command`, returns the last JSON line of its stdout."""
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"no JSON line from {command}:\n{out[-2000:]}")
    return json.loads(lines[-1])


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
    runs = {name: [] for name in commands}
    started = time.time()
    for round_index in range(args.rounds):
        for name, command in commands.items():  # alternate, every round
            result = run_json(command)
            runs[name].append({k: result[k] for k in METRICS})
            print(f"round {round_index + 1}/{args.rounds} {name}: "
                  + ", ".join(f"{k}={result[k]}" for k in METRICS), file=sys.stderr)
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in METRICS}
               for name, rs in runs.items()}
    # The frameworks' own footprint, and the peak above it (the work's memory).
    root = os.path.dirname(HERE)
    baseline = {
        "reference": import_rss_mb(args.peer_python, IMPORT_PROBES["reference"]),
        "keras-txl": import_rss_mb(sys.executable,
                                   IMPORT_PROBES["keras-txl"].format(root=root)),
    }
    for name, m in medians.items():
        m["import_rss_mb"] = baseline["reference" if name == "reference" else "keras-txl"]
        m["peak_rss_above_import_mb"] = round(m["peak_rss_mb"] - m["import_rss_mb"], 1)
    reference = medians["reference"]
    ratios = {name: {k: round(m[k] / reference[k], 3)
                     for k in (*METRICS, "peak_rss_above_import_mb")}
              for name, m in medians.items() if name != "reference"}
    print(json.dumps({"bench": "compare_peer", "rounds": args.rounds,
                      "seconds": round(time.time() - started), "medians": medians,
                      "ratios_to_reference": ratios, "runs": runs}))
    columns = (*METRICS, "import_rss_mb", "peak_rss_above_import_mb")
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
