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


# Measured ms per training step on 2 shared CPU cores (see docs/training.md
# "Which preset"): the presets' own batch and segment sizes, default loop.
_PRESET_CPU_MS = {"tiny": "~55 ms/step (300 steps: ~20 s)", "char_small": "~1.3 s/step (4000 steps: ~1.5 h)"}


def _presets_epilog():
    """`txl train --help`'s table of presets: size, and time per step."""
    from keras_txl.config import TransformerXLConfig
    from keras_txl.presets import PRESETS

    lines = ["presets (parameters; time per training step on 2 shared CPU cores, measured):"]
    for name, preset in PRESETS.items():
        model = dict(preset["model"])
        try:
            size = f"{TransformerXLConfig.from_dict(model).num_parameters() / 1e6:.2f}M"
        except (ValueError, TypeError):
            size = "?"
        train = preset["train"]
        timing = _PRESET_CPU_MS.get(name, "not measured (accelerator scale)")
        lines.append(
            f"  {name:<13} {size:>8}  batch {train['batch_size']}, "
            f"segment {model.get('segment_length')}, steps {train['steps']}: "
            f"{timing}"
        )
    lines.append("A first run: --preset tiny (learns in about 20 s of CPU).")
    return "\n".join(lines)


def build_parser():
    parser = argparse.ArgumentParser(prog="txl", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model in a workdir (resumes if present)",
                       epilog=_presets_epilog(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
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
    _add_checkpoint_argument(p)

    p = sub.add_parser("export", help="export SavedModel / TFLite")
    try:
        from keras_txl.export import cli as export_cli

        export_cli.add_arguments(p)
    except ImportError:  # pragma: no cover - export/ is part of the package
        export_cli = None
    _add_checkpoint_argument(p)

    p = sub.add_parser(
        "generate", help="sample text (or ids) with the memory, streamed",
        description="Feeds the prompt in segments to fill the memory, then "
        "samples one token at a time and prints each as it comes.",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--workdir", default=None,
                        help="training run; its model is WORKDIR/model/")
    source.add_argument("--from-hf", dest="from_hf", default=None, metavar="DIR",
                        help="Hugging Face TransfoXL folder (no tokenizer: "
                        "use --prompt-ids)")
    source.add_argument("--saved-model", dest="saved_model", default=None,
                        metavar="DIR", help="exported SavedModel (version "
                        "folder or its base); uses its next_token signature")
    source.add_argument("--tflite", default=None, metavar="FILE",
                        help="exported stateless .tflite file")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", default=None, help="prompt text")
    prompt.add_argument("--prompt-ids", dest="prompt_ids", default=None,
                        metavar="IDS", help="comma-separated prompt ids; the "
                        "output is then ids too")
    _add_checkpoint_argument(p)
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=1.0,
                   help="0 is greedy decoding (default 1.0)")
    p.add_argument("--top-k", dest="top_k", type=int, default=0,
                   help="sample among the k most likely (0: all)")
    p.add_argument("--top-p", dest="top_p", type=float, default=1.0,
                   help="nucleus sampling threshold (1: all)")
    p.add_argument("--seed", type=int, default=None,
                   help="same seed, same output")
    p.add_argument("--no-cache", dest="use_cache", action="store_false",
                   help="Keras sources: recompute the memory keys/values at "
                   "every step (the reference path; same output, slower)")
    p.add_argument("--segment-length", dest="segment_length", type=int,
                   default=None, help="prompt chunk length (default: the "
                   "model's segment length)")
    p.add_argument("--schedule", choices=("token", "segment"), default=None,
                   help="token: new tokens one at a time (default); segment: "
                   "as in training, re-running the current segment (the "
                   "only choice for a TFLite model exported with T > 1)")

    p = sub.add_parser(
        "attention", help="attention heatmaps, score terms and loss by "
        "position (PNG)",
        description="Runs a text through a trained model and draws, for the "
        "chosen layers/heads, the attention over memory + segment, the "
        "score terms (a), (b), (d) of the paper, and the loss per position "
        "with and without memory.",
    )
    p.add_argument("--workdir", required=True,
                   help="training run; its model is WORKDIR/model/")
    p.add_argument("--text", required=True, metavar="FILE", help="a text file")
    p.add_argument("--out", required=True, help="output folder for the PNGs")
    p.add_argument("--layers", default="0", help="comma-separated layers "
                   "(default 0; 'all' for every layer)")
    p.add_argument("--heads", default="0", help="comma-separated heads "
                   "(default 0; 'all' for every head)")
    p.add_argument("--segment", type=int, default=None,
                   help="which segment to picture (default: the first one "
                   "with a full memory)")
    p.add_argument("--max-segments", dest="max_segments", type=int, default=64,
                   help="segments used for the loss-by-position plot")

    p = sub.add_parser("demo", help="the README's first command: train, eval, "
                       "export and generate on an offline corpus")
    p.add_argument("--workdir", default="runs/demo")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--learning-rate", dest="learning_rate", type=float, default=2e-3)
    p.add_argument("--max-chars", dest="max_chars", type=int, default=3_000_000)
    p.add_argument("--prompt", default="Return the ")
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=200)

    p = sub.add_parser(
        "recl", help="relative effective context length of a group of "
        "trained models (the paper's Appendix C)",
        description="Scores every model on the same target tokens with "
        "only c tokens of context, for each c of --contexts, and reports "
        "RECL per model for each r (training/recl.py).",
    )
    _add_data_arguments(p)
    p.add_argument("--workdirs", nargs="+", required=True,
                   metavar="[NAME=]WORKDIR", help="trained runs (a group)")
    p.add_argument("--split", default="test", choices=["train", "valid", "test"])
    p.add_argument("--r", nargs="+", type=float, default=[0.1, 0.5, 1.0],
                   help="fractions of hardest tokens (default 0.1 0.5 1.0)")
    p.add_argument("--contexts", nargs="+", type=int,
                   default=[16, 32, 64, 96, 128, 160, 192, 256, 320, 384],
                   help="context lengths c, walked in increasing order")
    p.add_argument("--targets", type=int, default=2000,
                   help="target tokens, spread evenly over the split")
    p.add_argument("--memory-length", dest="memory_length", type=int,
                   default=None, help="evaluation memory of the models that "
                   "have one (default: their training memory)")
    p.add_argument("--segment-length", dest="segment_length", type=int,
                   default=None, help="default: each model's own")
    p.add_argument("--max-window", dest="max_window", type=int, default=None,
                   help="longest window a model without memory reads "
                   "(default: its segment length)")
    p.add_argument("--batch-size", dest="batch_size", type=int, default=64)
    p.add_argument("--threshold", type=float, default=0.01)
    p.add_argument("--hard-set", dest="hard_set", default="current",
                   choices=["current", "initial"],
                   help="top-r tokens at each step's short context (paper) "
                   "or fixed at the shortest one")
    p.add_argument("--out", default=None, help="write the full result JSON "
                   "(and the loss tables as NAME_losses.npz)")
    return parser


def _add_checkpoint_argument(p):
    p.add_argument(
        "--checkpoint", default=None, metavar="CKPT",
        help="with --workdir: use this checkpoint (folder, name such as "
        "ckpt-00001800, or step) instead of WORKDIR/model/; without it the "
        "newest of the model folder and the newest intact checkpoint is used",
    )


def _workdir_model_dir(args):
    """The model folder for `--workdir` (WORKDIR/model, or one written from
    the chosen or newest checkpoint into a temporary folder)."""
    if getattr(args, "checkpoint", None) is not None and not args.workdir:
        raise ValueError("--checkpoint needs --workdir.")
    import atexit
    import shutil
    import tempfile

    from keras_txl.training.checkpoint import materialize_model_folder

    out = tempfile.mkdtemp(prefix="txl-model-")
    atexit.register(shutil.rmtree, out, True)
    return materialize_model_folder(args.workdir, args.checkpoint,
                                    out=os.path.join(out, "model"))


def _parse_ids(text, name):
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise ValueError(
            f"{name} must be comma-separated integers, received {text!r}."
        ) from None


def _generation_source(args):
    """(backend, tokenizer folder or None) for `txl generate`."""
    if args.checkpoint is not None and not args.workdir:
        raise ValueError("--checkpoint needs --workdir.")
    from keras_txl import generation
    from keras_txl import io

    if args.workdir or args.from_hf:
        if args.workdir:
            model_dir = _workdir_model_dir(args)
            if not os.path.isfile(os.path.join(model_dir, io.CONFIG_FILE)):
                raise ValueError(
                    f"No model in {model_dir}/ (expected {io.CONFIG_FILE} and "
                    f"{io.WEIGHTS_FILE} written by training)."
                )
            model = io.load_pretrained(model_dir)
        else:
            from keras_txl.hf_checkpoint import load_hf_checkpoint

            model_dir = args.from_hf
            model = load_hf_checkpoint(model_dir)
        backend = generation.KerasBackend(model, use_cache=args.use_cache)
        return backend, io.tokenizer_directory(model_dir)
    from keras_txl.export.generation import SavedModelBackend
    from keras_txl.export.generation import TFLiteBackend

    if args.saved_model:
        backend = SavedModelBackend(args.saved_model)
        return backend, backend.tokenizer_dir
    backend = TFLiteBackend.from_file(args.tflite)
    return backend, backend.tokenizer_dir


def _generate(args):
    import time

    from keras_txl.generation import TextStream
    from keras_txl.generation import generate_iter

    backend, tokenizer_dir = _generation_source(args)
    tokenizer = None
    if args.prompt is not None:
        if tokenizer_dir is None:
            raise ValueError(
                "this model has no tokenizer (none was saved or exported with "
                "it); pass the prompt as ids with --prompt-ids 1,2,3."
            )
        from keras_txl.tokenizers import load_tokenizer

        tokenizer = load_tokenizer(tokenizer_dir)
        tokenizer.check_model_vocabulary(backend.vocabulary_size)
        prompt_ids = tokenizer.encode(args.prompt)
        if len(prompt_ids) == 0:
            raise ValueError("--prompt encodes to no tokens; give some text.")
    else:
        prompt_ids = _parse_ids(args.prompt_ids, "--prompt-ids")
    tokens = generate_iter(
        backend, prompt_ids, args.max_new_tokens, temperature=args.temperature,
        top_k=args.top_k, top_p=args.top_p, seed=args.seed,
        segment_length=args.segment_length, schedule=args.schedule,
    )
    out = sys.stdout
    start, count = time.perf_counter(), 0
    if tokenizer is not None:
        stream = TextStream(tokenizer, prompt_ids)
        out.write(args.prompt)
        out.flush()
        for token in tokens:
            out.write(stream.add(token))
            out.flush()
            count += 1
        out.write(stream.finish() + "\n")
    else:
        separator = ""
        for token in tokens:
            out.write(f"{separator}{token}")
            out.flush()
            separator, count = " ", count + 1
        out.write("\n")
    out.flush()
    seconds = time.perf_counter() - start
    logging.getLogger("txl.generate").info(
        "%d tokens in %.2fs (%.1f tokens/s, first-call tracing included)",
        count, seconds, count / seconds if seconds else 0.0,
    )
    return 0


def _attention(args):
    from keras_txl import insight
    from keras_txl import io

    model_dir = os.path.join(args.workdir, "model")
    if not os.path.isfile(os.path.join(model_dir, io.CONFIG_FILE)):
        raise ValueError(f"No model in {model_dir}/ (train first).")
    tokenizer_dir = io.tokenizer_directory(model_dir)
    if tokenizer_dir is None:
        raise ValueError(f"No tokenizer/ in {model_dir}: cannot read --text.")
    if not os.path.isfile(args.text):
        raise ValueError(f"--text {args.text!r} is not a file.")
    from keras_txl.tokenizers import load_tokenizer

    model = io.load_pretrained(model_dir)
    tokenizer = load_tokenizer(tokenizer_dir)
    tokenizer.check_model_vocabulary(model.txl_config.vocabulary_size)
    with open(args.text, encoding="utf-8") as f:
        ids = tokenizer.encode(f.read())
    cfg = model.txl_config

    def choose(text, count, name):
        if text == "all":
            return list(range(count))
        values = _parse_ids(text, f"--{name}")
        bad = [v for v in values if not 0 <= v < count]
        if bad or not values:
            raise ValueError(
                f"--{name} must be in [0, {count}), received {text!r}."
            )
        return values

    paths = insight.attention_report(
        model, ids, args.out,
        layers=choose(args.layers, cfg.num_layers, "layers"),
        heads=choose(args.heads, cfg.num_heads, "heads"),
        segment=args.segment, max_segments=args.max_segments,
        token_labels=[tokenizer.decode([i]) for i in range(cfg.vocabulary_size)],
    )
    for path in paths:
        print(path)
    return 0


def _demo(args):
    """Train a small model on the offline stdlib-docstring corpus, evaluate,
    export and generate: the README's first command."""
    import time

    from keras_txl.training.corpora import prepare_stdlib_docs
    from keras_txl.training.run import eval_main
    from keras_txl.training.run import train_main

    start = time.time()
    corpus_dir = os.path.join(args.workdir, "corpus")
    prepare_stdlib_docs(corpus_dir, max_chars=args.max_chars)
    print(f"[demo] corpus: Python standard library docstrings -> {corpus_dir}")

    class TrainArgs:
        pass

    t = TrainArgs()
    t.preset, t.config, t.data = "tiny", None, corpus_dir
    t.set = ["dropout=0.1", f"learning_rate={args.learning_rate}", "warmup_steps=100",
             "log_every=250", "checkpoint_every=1000"]
    t.workdir, t.tokenizer, t.data_dir, t.download = args.workdir, "byte", None, False
    t.segment_length, t.memory_length = None, None
    t.batch_size, t.steps, t.strategy, t.loop = None, args.steps, None, None
    t.jit_compile, t.precision, t.progress = False, None, False
    train_main(t)
    print(f"[demo] trained in {time.time() - start:.0f}s")

    e = TrainArgs()
    e.workdir, e.data, e.split, e.data_dir, e.download = args.workdir, None, "test", None, False
    e.batch_size, e.segment_length, e.clamp_length = 1, None, None
    e.memory_length, e.same_length, e.max_segments = 96, False, 0
    print("[demo] test set, memory 96 (3x the training memory):")
    eval_main(e)

    from keras_txl.export.saved_model import export_saved_model
    from keras_txl.export.tflite import export_tflite
    from keras_txl.io import load_pretrained

    model = load_pretrained(os.path.join(args.workdir, "model"))
    out = os.path.join(args.workdir, "export")
    path = export_saved_model(model, out, tokenizer_dir=os.path.join(
        args.workdir, "model", "tokenizer"))
    print(f"[demo] SavedModel: {path}")
    tfl = export_tflite(model, os.path.join(out, "txl.tflite"), batch_size=1,
                        segment_length=model.txl_config.segment_length)
    print(f"[demo] TFLite: {tfl}")

    from keras_txl.generation import generate_text

    text = generate_text(os.path.join(args.workdir, "model"), args.prompt,
                         max_new_tokens=args.max_new_tokens, temperature=0.8, top_k=20,
                         seed=0)
    print("[demo] sample:")
    print(text)
    print(f"[demo] done in {time.time() - start:.0f}s")
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
    from keras_txl import require_tensorflow

    require_tensorflow()  # every command runs a model: say which wheel is missing
    try:
        if args.command == "train":
            from keras_txl.training.run import train_main

            return train_main(args)
        if args.command == "eval":
            from keras_txl.training.run import eval_main

            return eval_main(args)
        if args.command == "export":
            from keras_txl.export import cli as export_cli

            if args.workdir:
                # export reads WORKDIR/model: hand it a workdir whose model
                # folder is the chosen or newest checkpoint's.
                model_dir = _workdir_model_dir(args)
                args.workdir = os.path.dirname(model_dir)
            elif args.checkpoint is not None:
                raise ValueError("--checkpoint needs --workdir.")
            return export_cli.run(args)
        if args.command == "generate":
            return _generate(args)
        if args.command == "attention":
            return _attention(args)
        if args.command == "demo":
            return _demo(args)
        if args.command == "recl":
            from keras_txl.training.recl import recl_main

            return recl_main(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"txl {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before training's own handler is installed
        print(f"txl {args.command}: interrupted.", file=sys.stderr)
        return 130
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
