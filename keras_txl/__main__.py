"""The `txl` command: train, eval, export, generate, demo.

Each subcommand imports `training/` or `export/` lazily, so `txl --help`
is fast and the model package does not depend on them.
"""

import argparse
import logging
import os
import sys


def _add_data_arguments(p):
    p.add_argument("--data", help="corpus folder, text file, or tfds:NAME[:CONFIG]")
    p.add_argument("--data-dir", dest="data_dir", default=None,
                   help="TFDS data_dir (where prepared datasets live)")
    p.add_argument("--download", action="store_true",
                   help="TFDS: download and prepare if missing (needs internet)")


def build_parser():
    parser = argparse.ArgumentParser(prog="txl", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model in a workdir (resumes if present)")
    _add_data_arguments(p)
    p.add_argument("--workdir", required=True)
    p.add_argument("--preset", default=None, help="model/training preset name")
    p.add_argument("--config", default=None, help="JSON config file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value (repeatable); prefix model./train./eval.")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--batch-size", dest="batch_size", type=int, default=None,
                   help="global batch (all replicas)")
    p.add_argument("--segment-length", dest="segment_length", type=int, default=None)
    p.add_argument("--memory-length", dest="memory_length", type=int, default=None)
    p.add_argument("--tokenizer", default=None,
                   choices=["char", "byte", "word", "sentencepiece", "wordpiece"])
    p.add_argument("--strategy", default=None,
                   choices=["default", "mirrored", "multi_worker", "tpu"])
    p.add_argument("--tpu", default="", help="TPU name or address (strategy tpu)")
    p.add_argument("--loop", default=None, choices=["custom", "fit"])
    p.add_argument("--jit-compile", dest="jit_compile", action="store_true")
    p.add_argument("--precision", default=None, choices=["float32", "mixed_bfloat16"])
    p.add_argument("--progress", action="store_true", help="show a progress bar")

    p = sub.add_parser("eval", help="evaluate a trained model (ppl / bpc)")
    _add_data_arguments(p)
    p.add_argument("--workdir", required=True)
    p.add_argument("--split", default="test", choices=["train", "valid", "test"])
    p.add_argument("--batch-size", dest="batch_size", type=int, default=1)
    p.add_argument("--segment-length", dest="segment_length", type=int, default=None)
    p.add_argument("--memory-length", dest="memory_length", type=int, default=None)
    p.add_argument("--clamp-length", dest="clamp_length", type=int, default=None)
    p.add_argument("--same-length", dest="same_length", action="store_true")
    p.add_argument("--max-segments", dest="max_segments", type=int, default=0)

    p = sub.add_parser("export", help="export SavedModel / TFLite")
    try:
        from export import cli as export_cli

        export_cli.add_arguments(p)
    except ImportError:  # pragma: no cover - export/ is part of the package
        export_cli = None

    p = sub.add_parser("generate", help="sample text with the memory")
    p.add_argument("--workdir", default=None)
    p.add_argument("--from-hf", dest="from_hf", default=None)
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", dest="top_k", type=int, default=0)
    p.add_argument("--top-p", dest="top_p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)

    p = sub.add_parser("demo", help="the README's first command: train, eval, "
                       "export and generate on an offline corpus")
    p.add_argument("--workdir", default="runs/demo")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--learning-rate", dest="learning_rate", type=float, default=2e-3)
    p.add_argument("--max-chars", dest="max_chars", type=int, default=3_000_000)
    p.add_argument("--prompt", default="Return the ")
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=200)
    return parser


def _generate(args):
    from keras_txl.generation import generate_text

    if not args.workdir:
        raise ValueError("txl generate needs --workdir (a trained run).")
    model_dir = os.path.join(args.workdir, "model")

    text = generate_text(model_dir, args.prompt, max_new_tokens=args.max_new_tokens,
                         temperature=args.temperature, top_k=args.top_k,
                         top_p=args.top_p, seed=args.seed)
    print(text)
    return 0


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        if args.command == "train":
            from training.run import train_main

            return train_main(args)
        if args.command == "eval":
            from training.run import eval_main

            return eval_main(args)
        if args.command == "export":
            from export import cli as export_cli

            return export_cli.run(args)
        if args.command == "generate":
            return _generate(args)
        if args.command == "demo":
            from training.run import demo_main

            return demo_main(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"txl {args.command}: error: {e}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
