"""`txl export`: SavedModel (TF Serving layout) and/or TFLite from a model.

    txl export --workdir runs/demo --format all --out exports
    txl export --from-hf path/to/transfo-xl --format tflite --out exports \\
        --batch-size 1 --segment-length 32 --quantize float16

The SavedModel takes any batch size and segment length (TF Serving batches
requests of any shape; a text's last segment is shorter), unless
`--saved-model-batch-size` / `--saved-model-segment-length` fix them.
TFLite needs fixed shapes: `--batch-size` (default 1) and
`--segment-length` (default the model's) are the TFLite model's; with
`--format saved_model` they are an error, not silently ignored.

Sources: `--workdir DIR` (the training run's latest model folder,
`DIR/model/`, written by `save_pretrained`), `--from-preset DIR|HANDLE`
(a saved keras-hub preset or keras-txl weights folder, or a keras-hub
handle, with its tokenizer), `--from-hf DIR` (a Hugging
Face TransfoXL folder) or `--from-official DIR` (an official TF release,
`docs/official_checkpoints.md`; `--vocabulary-file` adds its tokenizer).
Outputs under `--out`:

    <out>/<name>/<version>/          SavedModel (format saved_model or all)
    <out>/<name>[-<quantize>].tflite stateless TFLite (format tflite or all)
    <out>/<name>[-<quantize>]-stateful.tflite   with --stateful
    <out>/config.json                beside the TFLite files

`add_arguments(parser)` fills an argparse (sub)parser; `run(args)` writes,
prints the paths written (one a line, on stdout) and returns 0, or raises
`ValueError` for bad input, which `txl` reports as `txl export: error: ...`
(exit code 2), like its other commands.
"""

from __future__ import annotations

import argparse
import math
import os

FORMATS = ("saved_model", "tflite", "all")


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the `txl export` options to `parser`."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--workdir",
        help="training run folder; its model is read from WORKDIR/model/",
    )
    from keras_txl.sources import PRESET_HELP

    source.add_argument(
        "--from-preset", dest="from_preset", metavar="DIR|HANDLE",
        help=PRESET_HELP + " and exported with the model",
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
        help="what to write",
    )
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument(
        "--name", default="txl",
        help="model name: SavedModel base folder and TFLite file stem",
    )
    parser.add_argument(
        "--version", type=int, default=1,
        help="SavedModel version folder",
    )
    parser.add_argument(
        "--batch-size", dest="batch_size", type=int, default=None,
        help="the TFLite model's fixed batch size (default: 1)",
    )
    parser.add_argument(
        "--segment-length", dest="segment_length", type=int, default=None,
        help="the TFLite model's fixed segment length (default: the "
        "model's segment_length)",
    )
    parser.add_argument(
        "--saved-model-batch-size", dest="saved_model_batch_size", type=int,
        default=None, help="fix the SavedModel's batch size (default: any)",
    )
    parser.add_argument(
        "--saved-model-segment-length", dest="saved_model_segment_length",
        type=int, default=None,
        help="fix the SavedModel's segment length (default: any)",
    )
    parser.add_argument(
        "--memory-length", dest="memory_length", type=int, default=None,
        help="export with another memory length (the weights do not depend "
        "on it; the paper evaluates with a longer memory)",
    )
    parser.add_argument(
        "--quantize", choices=("none", "float16", "dynamic_int8"),
        default="none", help="TFLite weight quantization",
    )
    parser.add_argument(
        "--stateful", action="store_true",
        help="TFLite: keep the memory inside the model (signatures without "
        "memory, plus reset)",
    )
    parser.add_argument(
        "--max-request-gib", dest="max_request_gib", type=float, default=None,
        help="SavedModel: the most one request may allocate, in GiB: "
        "initial_memory's memory and the activations of a segment, which grow "
        "with its length squared (default: 4 for the memory, 16 for a segment)",
    )
    parser.add_argument(
        "--no-warmup", dest="warmup", action="store_false",
        help="do not write the TF Serving warm-up requests",
    )
    parser.add_argument(
        "--overwrite", action="store_true",
        help="replace an existing SavedModel version folder or TFLite file",
    )
    return parser


def _load(args):
    """(model, tokenizer_dir) from --workdir, --from-preset, --from-hf or
    --from-official."""
    import keras_txl
    from keras_txl import io

    if getattr(args, "from_official", None) is not None:
        return _load_official(args)
    if getattr(args, "from_preset", None) is not None:
        from keras_txl.sources import preset_model

        return preset_model(args.from_preset, args.vocabulary_file)
    if args.workdir is not None:
        model_dir = os.path.join(args.workdir, "model")
        if not os.path.isfile(os.path.join(model_dir, io.CONFIG_FILE)):
            raise ValueError(
                f"No model in {model_dir}/ (expected the preset "
                "written by training: config.json and its weights). Train first, or "
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

    dataset = official_dataset(args.from_official,
                               for_tokenizer=args.vocabulary_file is not None)
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


def check_arguments(args):
    """Raises ValueError for options that are out of range, or given for a
    format that is not written."""
    from keras_txl.sources import check_vocabulary_file

    check_vocabulary_file(args)  # --from-official's alone
    for option in ("batch_size", "segment_length", "saved_model_batch_size",
                   "saved_model_segment_length", "version"):
        value = getattr(args, option)
        if value is not None and value <= 0:
            raise ValueError(f"--{option.replace('_', '-')} must be positive, "
                             f"received {value}.")
    gib = args.max_request_gib
    if gib is not None and not (math.isfinite(gib) and gib * (1 << 30) >= 1):
        raise ValueError(f"--max-request-gib must be a positive number of GiB, "
                         f"received {gib}.")
    if gib is not None and args.format == "tflite":
        raise ValueError("--max-request-gib applies to the SavedModel, and --format "
                         "tflite writes none (a TFLite model's shapes are fixed).")
    if args.version >= 2**63:
        raise ValueError(
            f"--version must be below 2**63 (TF Serving reads version folders as "
            f"int64 and would never serve this one), received {args.version}.")
    if args.memory_length is not None and args.memory_length < 0:
        raise ValueError(
            f"--memory-length must be >= 0, received {args.memory_length}.")
    if (args.memory_length == 0 and args.format in ("tflite", "all")
            and not args.stateful):
        raise ValueError(
            "--memory-length 0 gives a stateless TFLite model a memory input with "
            "a 0-size dimension, which LiteRT cannot run: pass --stateful, "
            "--format saved_model, or a --memory-length >= 1.")
    name = args.name
    if (not name or name in (".", "..") or "\x00" in name or os.sep in name
            or (os.altsep and os.altsep in name)):
        # The SavedModel's folder and the TFLite files' stem: inside --out.
        raise ValueError(
            f"--name must be a plain name (no path separators, not . or ..), "
            f"received {name!r}: the exports are written inside --out.")
    from keras_txl.export.tflite import side_file_names

    side = side_file_names()
    clash = (args.format in ("tflite", "all") and os.path.splitext(tflite_file_name(
        name, args.quantize, args.stateful))[0] + ".json" in side) or (
        args.format == "all" and name in side)
    if clash:
        # A TFLite export writes these beside its .tflite file; its own
        # record (<name>.json) or the SavedModel's folder would replace one.
        raise ValueError(
            f"--name {name!r} would collide with the files a TFLite export writes "
            f"beside the model in --out ({', '.join(side)}): choose another name.")
    if os.path.lexists(args.out) and not os.path.isdir(args.out):
        raise ValueError(
            f"--out {args.out!r} is a file: it must be a folder (new or existing) "
            "for the exports.")
    _check_writable(args.out)
    # Shapes meant for one format and given with the other are refused, not
    # dropped: the user expected them to fix something.
    if args.format == "saved_model":
        given = [f"--{o.replace('_', '-')}" for o in ("batch_size", "segment_length")
                 if getattr(args, o) is not None]
        if given:
            raise ValueError(
                f"{' and '.join(given)} {'fixes' if len(given) == 1 else 'fix'} "
                "the TFLite model's shapes, and "
                "--format saved_model writes none. The SavedModel takes any "
                "batch and segment length; to fix them, pass "
                "--saved-model-batch-size / --saved-model-segment-length.")
        given = [flag for flag, on in (("--quantize " + args.quantize,
                                        args.quantize != "none"),
                                       ("--stateful", args.stateful)) if on]
        if given:
            raise ValueError(
                f"{' and '.join(given)} "
                f"{'applies' if len(given) == 1 else 'apply'} to the TFLite "
                "model, and --format saved_model writes none: pass --format "
                "tflite (or all), or drop the flag.")
    if args.format == "tflite":
        given = [f"--{o.replace('_', '-')}"
                 for o in ("saved_model_batch_size", "saved_model_segment_length")
                 if getattr(args, o) is not None]
        if given:
            raise ValueError(
                f"{' and '.join(given)} "
                f"{'applies' if len(given) == 1 else 'apply'} to the SavedModel, and "
                "--format tflite writes none; the TFLite shapes are "
                "--batch-size and --segment-length.")
    # What would be replaced, refused before anything is loaded or written
    # (with --format all, a half-done export is worse than none).
    if args.format in ("saved_model", "all"):
        from keras_txl.export.saved_model import check_version_path

        base = os.path.join(args.out, args.name)
        check_version_path(base, os.path.join(base, str(args.version)),
                           flags=("--version", "--name or --out"))
    if args.format in ("tflite", "all"):
        from keras_txl.export.tflite import check_tflite_targets

        check_tflite_targets({args.quantize: os.path.join(
            args.out, tflite_file_name(args.name, args.quantize, args.stateful))})
    if not args.overwrite:
        targets = []
        if args.format in ("saved_model", "all"):
            targets.append(os.path.join(args.out, args.name, str(args.version)))
        if args.format in ("tflite", "all"):
            targets.append(os.path.join(
                args.out, tflite_file_name(args.name, args.quantize, args.stateful)))
        existing = [t for t in targets if os.path.lexists(t)]
        if existing:
            # A version is the SavedModel's: the TFLite file is named without it.
            version = ("--version (TF Serving serves the highest), "
                       if args.format != "tflite" and existing[0] == targets[0] else "")
            raise ValueError(
                f"{' and '.join(existing)} already "
                f"{'exists' if len(existing) == 1 else 'exist'}: pass --overwrite to "
                f"replace, or choose another {version}--name or --out.")


def _check_writable(out):
    """A clear error naming --out when the exports cannot be written there
    (a read-only file system or folder), before any model is loaded."""
    import tempfile

    existing = os.path.abspath(out)
    while not os.path.isdir(existing):
        if os.path.lexists(existing) and existing != os.path.abspath(out):
            # Folders cannot be made inside a file: named here, not as an
            # "[Errno 20] Not a directory" once the model has been loaded.
            raise ValueError(
                f"--out {out!r} is inside {existing!r}, which is a file: --out "
                "must be a folder (new or existing) for the exports.")
        existing = os.path.dirname(existing)
    try:
        # A probe file, not os.access: that answers for the mode bits, not
        # for a read-only mount or what root may do.
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        where = "" if existing == os.path.abspath(out) else f" (in {existing!r})"
        raise ValueError(
            f"--out {out!r} is not writable{where}: {e.strerror or e}. Pass a "
            "folder the exports can be written to.") from None


def run(args: argparse.Namespace) -> int:
    """Runs `txl export` and prints the paths written; returns 0.

    Raises:
        ValueError: bad arguments, no model at the source, an existing
            version without --overwrite, or a failed conversion.
    """
    check_arguments(args)
    try:
        return _run(args)
    finally:
        if getattr(args, "temporary_dir", None):  # --from-official's tokenizer
            import shutil

            shutil.rmtree(args.temporary_dir, ignore_errors=True)


def _run(args):
    model, tokenizer_dir = _load(args)
    if args.memory_length is not None:
        model = model.with_settings(memory_length=args.memory_length)
    path = os.path.join(args.out, tflite_file_name(args.name, args.quantize, args.stateful))
    if args.format == "all":
        # What the TFLite export would refuse, before the SavedModel is
        # written: a half-done export is worse than none.
        from keras_txl.export.tflite import check_tflite_export

        check_tflite_export(model, {args.quantize: path}, batch_size=args.batch_size or 1,
                            segment_length=args.segment_length
                            or model.txl_config.segment_length,
                            stateful=args.stateful, tokenizer_dir=tokenizer_dir)
    if args.format in ("saved_model", "all"):
        from keras_txl.export.saved_model import export_saved_model

        print(export_saved_model(
            model, args.out, name=args.name, version=args.version,
            batch_size=args.saved_model_batch_size,
            segment_length=args.saved_model_segment_length,
            tokenizer_dir=tokenizer_dir, warmup=args.warmup,
            overwrite=args.overwrite,
            max_request_bytes=(None if args.max_request_gib is None
                               else int(args.max_request_gib * (1 << 30))),
        ), flush=True)
    if args.format in ("tflite", "all"):
        from keras_txl.export.tflite import export_tflite

        print(export_tflite(
            model, path, batch_size=args.batch_size or 1,
            segment_length=args.segment_length
            or model.txl_config.segment_length,
            quantize=args.quantize, stateful=args.stateful,
            tokenizer_dir=tokenizer_dir,
        ), flush=True)
    return 0
