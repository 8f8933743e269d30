"""Plot a run's learning curve from its `metrics.jsonl` (train loss and validation bpc).

    python benchmarks/learning_curve.py runs/char_small --out docs/char_small_curve.png

Prints one JSON line (the validation points) and a Markdown table.
"""

import argparse
import json
import math
import os
import sys


def read_metrics(workdir):
    train, valid = [], []
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            (train if record["split"] == "train" else valid).append(record)
    return train, valid


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdir")
    parser.add_argument("--out", required=True, help="PNG path")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    train, valid = read_metrics(args.workdir)
    if not train:
        raise SystemExit(f"no train records in {args.workdir}/metrics.jsonl")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.plot([r["step"] for r in train], [r["loss"] / math.log(2) for r in train],
            label="train (bits/token, running window)", color="tab:blue", alpha=0.6)
    if valid:
        ax.plot([r["step"] for r in valid], [r["bpc"] for r in valid], "o-",
                label="validation bpc", color="tab:red")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("bits per character (byte)")
    ax.set_title(args.title or os.path.basename(os.path.normpath(args.workdir)))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out)
    points = [{"step": r["step"], "bpc": round(r["bpc"], 4), "tokens": r["tokens"]} for r in valid]
    print(json.dumps({"workdir": args.workdir, "valid": points}))
    print("| step | validation bpc |\n|---:|---:|")
    for p in points:
        print(f"| {p['step']} | {p['bpc']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
