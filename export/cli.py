"""`txl export`: SavedModel (TF Serving layout) and/or TFLite from a model.

    txl export --workdir runs/demo --format all --out exports
    txl export --from-hf path/to/transfo-xl --format tflite --out exports \\
        --batch-size 1 --segment-length 32 --quantize float16

Sources: `--workdir DIR` (the training run's latest model folder,
`DIR/model/`, written by `save_pretrained`), `--from-hf DIR` (a Hugging
Face TransfoXL folder) or `--from-official DIR` (an official TF release,
`docs/official_checkpoints.md`; `--vocabulary-file` adds its tokenizer).
Outputs under `--out`:

    <out>/<name>/<version>/          SavedModel (format saved_model or all)
    <out>/<name>[-<quantize>].tflite stateless TFLite (format tflite or all)
    <out>/<name>[-<quantize>]-stateful.tflite   with --stateful
    <out>/config.json                beside the TFLite files

`add_arguments(parser)` fills an argparse (sub)parser; `run(args)` returns
the exit code (0 ok, 2 bad input). The `txl` entry point wires them in.
"""

from __future__ import annotations

import argparse
import logging
import os

logger = logging.getLogger(__name__)

FORMATS = ("saved_model", "tflite", "all")


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the `txl export` options to `parser`."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--workdir",
        help="training run folder; its model is read from WORKDIR/model/",
    )
    source.add_argument(
        "--from-hf", dest="from_hf", metavar="DIR",
        help="Hugging Face TransfoXL folder (config.json + weights)",
    )
    source.add_argument(
        "--from-official", dest="from_official", metavar="DIR",
        help="official TF release (checkpoint + corpus-info.json), with the "
        "paper's evaluation settings of its dataset",
    )
    parser.add_argument(
        "--vocabulary-file", dest="vocabulary_file", metavar="FILE",
        default=None, help="with --from-official: its symbols, one per line "
        "(exported as the tokenizer)",
    )
    parser.add_argument(
        "--format", choices=FORMATS, default="saved_model",
        help="what to write (default: saved_model)",
    )
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument(
        "--name", default="txl",
        help="model name: SavedModel base folder and TFLite file stem "
        "(default: txl)",
    )
    parser.add_argument(
        "--version", type=int, default=1,
        help="SavedModel version folder (default: 1)",
    )
    parser.add_argument(
        "--batch-size", dest="batch_size", type=int, default=None,
        help="fixed batch size; SavedModel default dynamic, TFLite default 1",
    )
    parser.add_argument(
        "--segment-length", dest="segment_length", type=int, default=None,
        help="fixed segment length; SavedModel default dynamic, TFLite "
        "default the model's segment_length",
    )
    parser.add_argument(
        "--memory-length", dest="memory_length", type=int, default=None,
        help="export with another memory length (the weights do not depend "
        "on it; the paper evaluates with a longer memory)",
    )
    parser.add_argument(
        "--quantize", choices=("none", "float16", "dynamic_int8"),
        default="none", help="TFLite weight quantization (default: none)",
    )
    parser.add_argument(
        "--stateful", action="store_true",
        help="TFLite: keep the memory inside the model (signatures without "
        "memory, plus reset)",
    )
    parser.add_argument(
        "--no-warmup", dest="warmup", action="store_false",
        help="do not write the TF Serving warm-up requests",
    )
    parser.add_argument(
        "--overwrite", action="store_true",
        help="replace an existing SavedModel version folder",
    )
    return parser


def _fail(message):
    logger.error("txl export: %s", message)
    return 2


def _load(args):
    """(model, tokenizer_dir) from --workdir or --from-hf."""
    import keras_txl
    from keras_txl import io

    if getattr(args, "from_official", None) is not None:
        return _load_official(args)
    if args.workdir is not None:
        model_dir = os.path.join(args.workdir, "model")
        if not os.path.isfile(os.path.join(model_dir, io.CONFIG_FILE)):
            raise ValueError(
                f"No model in {model_dir}/ (expected {io.CONFIG_FILE} and "
                f"{io.WEIGHTS_FILE} written by training). Train first, or "
                "pass --from-hf for a Hugging Face checkpoint."
            )
        model = keras_txl.load_pretrained(model_dir)
        return model, io.tokenizer_directory(model_dir)
    if not os.path.isdir(args.from_hf):
        raise ValueError(f"--from-hf {args.from_hf!r} is not a folder.")
    model = keras_txl.load_hf_checkpoint(args.from_hf)
    return model, io.tokenizer_directory(args.from_hf)


def _load_official(args):
    """(model, tokenizer_dir) of an official release. The tokenizer (from
    --vocabulary-file) goes to a temporary folder that `run` removes."""
    import tempfile

    from keras_txl.official_checkpoint import load_official_checkpoint
    from keras_txl.official_checkpoint import official_dataset
    from keras_txl.presets import EVAL_PROTOCOLS

    dataset = official_dataset(args.from_official)
    model = load_official_checkpoint(
        args.from_official,
        preset=dataset if dataset in EVAL_PROTOCOLS else None,
        vocabulary_file=args.vocabulary_file,
    )
    if args.vocabulary_file is None:
        return model, None
    from keras_txl.tokenizers import official_tokenizer

    directory = tempfile.mkdtemp(prefix="txl-official-tokenizer-")
    args.temporary_dir = directory
    official_tokenizer(model.vocabulary, dataset).save(directory)
    return model, directory


def tflite_file_name(name, quantize="none", stateful=False):
    """`<name>[-<quantize>][-stateful].tflite`."""
    stem = name if quantize == "none" else f"{name}-{quantize}"
    return stem + ("-stateful" if stateful else "") + ".tflite"


def run(args: argparse.Namespace) -> int:
    """Runs `txl export`; returns the process exit code."""
    for option in ("batch_size", "segment_length", "version"):
        value = getattr(args, option)
        if value is not None and value <= 0:
            return _fail(f"--{option.replace('_', '-')} must be positive, "
                         f"received {value}.")
    if args.memory_length is not None and args.memory_length < 0:
        return _fail(f"--memory-length must be >= 0, received {args.memory_length}.")
    try:
        return _run(args)
    finally:
        if getattr(args, "temporary_dir", None):
            import shutil

            shutil.rmtree(args.temporary_dir, ignore_errors=True)


def _run(args):
    try:
        model, tokenizer_dir = _load(args)
    except ValueError as e:
        return _fail(str(e))
    if args.memory_length is not None:
        model = model.with_settings(memory_length=args.memory_length)
    written = []
    try:
        if args.format in ("saved_model", "all"):
            from keras_txl.export.saved_model import export_saved_model

            written.append(export_saved_model(
                model, args.out, name=args.name, version=args.version,
                batch_size=args.batch_size, segment_length=args.segment_length,
                tokenizer_dir=tokenizer_dir, warmup=args.warmup,
                overwrite=args.overwrite,
            ))
        if args.format in ("tflite", "all"):
            from keras_txl.export.tflite import export_tflite

            path = os.path.join(
                args.out, tflite_file_name(args.name, args.quantize, args.stateful)
            )
            written.append(export_tflite(
                model, path, batch_size=args.batch_size or 1,
                segment_length=args.segment_length
                or model.txl_config.segment_length,
                quantize=args.quantize, stateful=args.stateful,
                tokenizer_dir=tokenizer_dir,
            ))
    except ValueError as e:
        return _fail(str(e))
    for path in written:
        logger.info("txl export: wrote %s", path)
    return 0


def main(argv=None) -> int:
    """Stand-alone entry point: `python -m keras_txl.export.cli ...`."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = add_arguments(argparse.ArgumentParser(prog="txl export"))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
