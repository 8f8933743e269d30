"""The `txl` command: prepare, train, eval, export, generate, serve-client, attention, demo, recl.

Each subcommand imports `training/` or `export/` lazily, so `txl --help`
is fast and the model package does not depend on them. Runs are quiet by
default: our own progress on stderr, results on stdout, TensorFlow's logs
only with `txl -v` (see `keras_txl/console.py`).
"""

import argparse
import json
import logging
import os
import sys

from keras_txl.sources import PRESET_HELP
from keras_txl.sources import check_vocabulary_file
from keras_txl.sources import preset_model

logger = logging.getLogger("txl")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with `(default: X)`, except where there is
    no value to show (None, "", an empty list, a switch): those options say
    in their help what happens without them. (argparse's own formatter
    would print "(default: None)", and "(default: True)" for --no-warmup.)"""

    def _get_help_string(self, action):
        default = action.default
        if action.nargs == 0 or default is None or default in ("", []):
            return action.help
        if isinstance(default, str) and default != default.strip():
            return action.help + " (default: %(default)r)"  # show the spaces
        return super()._get_help_string(action)


class _TableHelpFormatter(_HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """`_HelpFormatter` that prints the description and epilog as written."""


def _int_flag(flag, low, high=None):
    """An argparse `type` for a flag that takes an integer in [low, high]
    (no bound above when `high` is None): a bad value is named by its flag
    at once, before TensorFlow loads or the data is prepared."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            expected = f"in [{low}, {high}]" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(
                f"{flag} must be an integer {expected}, received {text!r}")
        return value
    return parse


def _positive_int_flag(flag):
    """An argparse `type` for a flag that takes an integer >= 1."""
    return _int_flag(flag, 1)


def _count_flag(flag):
    """A step or batch count: TrainConfig's range."""
    from keras_txl.training.config import MAX_COUNT

    return _int_flag(flag, 1, MAX_COUNT)


def _positive_seconds_flag(flag):
    """An argparse `type` for a flag that takes a finite number of seconds > 0."""
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(
                f"{flag} must be a number of seconds > 0, received {text!r}")
        return value
    return parse


def _add_data_arguments(p, without):
    p.add_argument("--data", default=None,
                   help="corpus: a folder, a text file, or tfds:NAME[:CONFIG] "
                   f"(default: {without})")
    p.add_argument("--data-dir", dest="data_dir", default=None,
                   help="TFDS data_dir, where prepared datasets live (default: "
                   "TFDS's own, ~/tensorflow_datasets)")
    p.add_argument("--download", action="store_true",
                   help="TFDS: download and prepare if missing (needs internet)")
    p.add_argument("--char-symbols", dest="char_symbols", choices=("auto", "yes", "no"),
                   default="auto",
                   help="a train.txt/valid.txt/test.txt folder of symbols separated "
                   "by spaces (enwik8's byte values, text8's characters) is read the "
                   "official way: no <eos>, the vocabulary counted on every split. "
                   "auto: when the start of train.txt looks like that; "
                   "no: as words of any text (e.g. Chinese characters separated by "
                   "spaces, with <eos>); yes: as symbols")
    p.add_argument("--tfds-text-feature", dest="tfds_text_feature", default=None,
                   metavar="NAME",
                   help="TFDS: the feature holding the text (default: the known "
                   "datasets' own, or the dataset's only text feature)")
    p.add_argument("--tfds-split", dest="tfds_split", action="append", default=None,
                   metavar="SPLIT=TFDS_SPLIT",
                   help="TFDS: the TFDS split read as train, valid or test, slicing "
                   "allowed (e.g. valid=train[-2%%:] for a dataset without a "
                   "validation split); repeatable (default: train, validation, test)")


def _add_vocabulary_arguments(p):
    """The tokenizer-building flags of `txl prepare` and `txl train`
    (used when the workdir has no tokenizer yet; a contradicting value for
    an existing one is an error)."""
    p.add_argument("--vocab-size", dest="vocab_size", type=int, default=None,
                   help="vocabulary size, special tokens included: word/char "
                   "keep the most frequent tokens, sentencepiece/wordpiece "
                   "train to this size (default: every token seen; 8000 for "
                   "subwords)")
    p.add_argument("--min-freq", dest="min_freq", type=int, default=None,
                   help="word/char: leave out tokens seen fewer times (default: 1)")
    p.add_argument("--lower-case", dest="lower_case", action="store_true",
                   default=None, help="word/wordpiece: lower-case the text")
    p.add_argument("--vocabulary-file", dest="vocabulary_file", default=None,
                   help="word/char: a fixed vocabulary, one token per line "
                   "(LM1B's 1b_word_vocab.txt: <S> and <UNK> are its "
                   "end-of-sentence and unknown tokens); default: counted "
                   "on the corpus (an LM1B folder's own 1b_word_vocab.txt)")
    p.add_argument("--shard-tokens", dest="shard_tokens", type=int, default=None,
                   help="tokens per shard file (default: 67108864)")


def _add_prepare_command(add_command):
    p = add_command(
        "prepare", "tokenize a corpus once into WORKDIR/data shards",
        description="Builds the tokenizer (vocabulary counted in bounded "
        "memory) and writes each split as token shards in WORKDIR/data, "
        "with progress on stderr. A killed run resumes where it stopped. "
        "`txl train`/`eval` use the shards (and prepare them when missing). "
        "Prints a JSON line: tokens and shards per split.")
    _add_data_arguments(p, "required")
    p.add_argument("--workdir", required=True, help="run folder: tokenizer/, data/")
    p.add_argument("--tokenizer", default=None,
                   choices=["char", "byte", "word", "sentencepiece", "wordpiece"],
                   help="default: the corpus's own, as in the reference code "
                   "(see txl train --help)")
    _add_vocabulary_arguments(p)


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
    parser = argparse.ArgumentParser(
        prog="txl", description=__doc__.split("\n")[0],
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="debug logging, and TensorFlow's own logs")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add_command(name, help, description=None, epilog=None):
        # An epilog is a table: kept as written.
        formatter = _HelpFormatter if epilog is None else _TableHelpFormatter
        return sub.add_parser(name, help=help, description=description or help,
                              epilog=epilog, formatter_class=formatter)

    p = add_command("train", "train a model in a workdir (resumes if present)",
                    epilog=_presets_epilog())
    _add_data_arguments(p, "a resumed run's encoded splits, WORKDIR/data/")
    p.add_argument("--workdir", required=True,
                   help="run folder: config, tokenizer, checkpoints, model/")
    p.add_argument("--preset", default=None,
                   help="model/training preset name (keras_txl/presets.py); "
                   "this or --config is required")
    p.add_argument("--config", default=None,
                   help="JSON config file: a model dict, or "
                   '{"model": ..., "train": ..., "eval": ...}')
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value (repeatable); prefix "
                   "model./train./eval.")
    p.add_argument("--steps", type=_count_flag("--steps"), default=None,
                   help="optimizer steps (default: from --preset/--config)")
    p.add_argument("--batch-size", dest="batch_size", type=_count_flag("--batch-size"),
                   default=None,
                   help="global batch, all replicas (default: from --preset/--config)")
    p.add_argument("--segment-length", dest="segment_length",
                   type=_int_flag("--segment-length", 1),
                   default=None, help="tokens per segment (default: from --preset/--config)")
    p.add_argument("--memory-length", dest="memory_length",
                   type=_int_flag("--memory-length", 0),
                   default=None, help="memory per layer (default: from --preset/--config)")
    p.add_argument("--tokenizer", default=None,
                   choices=["char", "byte", "word", "sentencepiece", "wordpiece"],
                   help="default: the corpus's own, as in the reference code: "
                   "byte for raw enwik8; char for text8, other single text "
                   "files, wiki.*.raw and tfds:tiny_shakespeare; word for "
                   "wiki.*.tokens, train/valid/test.txt folders, other tfds: "
                   "data and symbol files. Results name bits per token by "
                   "what a token is: bpc (char, byte, symbol files), "
                   "bits_per_word, bits_per_token (subwords)")
    p.add_argument("--strategy", default=None,
                   choices=["default", "mirrored", "multi_worker", "tpu"],
                   help="distribution strategy (default: the config's, "
                   "else default)")
    p.add_argument("--tpu", default="", help="TPU name or address (strategy tpu)")
    p.add_argument("--cluster-timeout", dest="cluster_timeout",
                   type=_positive_seconds_flag("--cluster-timeout"), default=None,
                   metavar="SECONDS",
                   help="strategy multi_worker: how long each task waits for "
                   "all tasks of TF_CONFIG to join before it stops with an error "
                   "(default: 600)")
    p.add_argument("--loop", default=None, choices=["custom", "fit"],
                   help="custom: tf.function step under strategy.run; fit: "
                   "Keras fit with the stateful model (default: the config's, "
                   "else custom)")
    p.add_argument("--jit-compile", dest="jit_compile",
                   action=argparse.BooleanOptionalAction, default=None,
                   help="compile the training step with XLA (default: the "
                   "config's, else auto: on GPUs and TPUs, not on CPUs, where "
                   "it is slower)")
    p.add_argument("--precision", default=None,
                   choices=["float32", "mixed_bfloat16", "mixed_float16",
                            "auto"],
                   help="mixed_float16 trains with dynamic loss scaling; "
                   "auto: mixed_bfloat16 only where bf16 is known to pay "
                   "(AMX CPUs, GPUs from compute capability 8.0), "
                   "mixed_float16 on GPUs of compute capability 7.x, else "
                   "float32 (default: the config's, else float32); "
                   "the memory stays float32")
    p.add_argument("--progress", action="store_true", help="show a progress bar")
    _add_vocabulary_arguments(p)
    _add_prepare_command(add_command)

    p = add_command("eval", "evaluate a trained model: loss, ppl and bits per "
                    "token (bpc for char/byte models)")
    _add_data_arguments(p, "the split the run encoded, WORKDIR/data/")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--workdir", help="training run; its model is WORKDIR/model/")
    _add_preset_argument(source)
    _add_official_arguments(p, source)
    p.add_argument("--protocol", default=None,
                   choices=("paper", *_PROTOCOLS),
                   help="the paper's evaluation settings (segment, memory, "
                   "clamp length, same_length) of a dataset; 'paper': the "
                   "dataset of --from-official's corpus-info.json")
    p.add_argument("--split", default="test", choices=["train", "valid", "test"],
                   help="which split")
    # Without a flag (or --protocol): with --workdir, the setting of the run's
    # final evaluation (WORKDIR/eval_config.json), else the model's own.
    recorded = "with --workdir, that of txl train's final evaluation, else "
    p.add_argument("--batch-size", dest="batch_size", type=_int_flag("--batch-size", 1),
                   default=None, help="parallel streams the split is cut into "
                   f"(default: {recorded}1)")
    p.add_argument("--segment-length", dest="segment_length",
                   type=_int_flag("--segment-length", 1),
                   default=None, help=f"default: {recorded}the model's")
    p.add_argument("--memory-length", dest="memory_length",
                   type=_int_flag("--memory-length", 0),
                   default=None, help=f"test-time memory (default: {recorded}the model's)")
    p.add_argument("--clamp-length", dest="clamp_length",
                   type=_int_flag("--clamp-length", -1), default=None,
                   help="largest relative distance encoded (default: "
                   f"{recorded}the model's; -1: none)")
    p.add_argument("--same-length", dest="same_length", action=argparse.BooleanOptionalAction,
                   default=None, help="every position attends to the same number of keys "
                   f"(default: {recorded}the model's setting)")
    p.add_argument("--max-segments", dest="max_segments",
                   type=_int_flag("--max-segments", 0), default=0,
                   help="stop after this many segments (0: the whole split)")
    _add_checkpoint_argument(p)

    p = add_command(
        "export", "export SavedModel (TF Serving) and/or TFLite",
        description="Exports a trained model. The SavedModel takes any batch "
        "and segment length (unless --saved-model-batch-size/"
        "--saved-model-segment-length fix them); the TFLite model has fixed "
        "shapes (--batch-size, --segment-length). Prints the paths written.",
    )
    try:
        from keras_txl.export import cli as export_cli

        export_cli.add_arguments(p)
    except ImportError:  # pragma: no cover - export/ is part of the package
        export_cli = None
    _add_checkpoint_argument(p)

    p = add_command(
        "generate", "sample text (or ids) with the memory, streamed",
        description="A Keras model (--workdir, --from-preset, --from-hf, "
        "--from-official) "
        "generates with keras-hub's compiled loop (model.generate; the prompt "
        "fed one token at a time) and prints the continuation when done; a "
        "SavedModel with a generate signature decodes in its graph. With "
        "--no-cache, --schedule or --segment-length, and for other exports, "
        "the host loop feeds the prompt in segments, then samples one token "
        "at a time and prints each as it comes. The prompt is printed as the "
        "model received it (characters the tokenizer does not know are named "
        "in a warning).",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--workdir", default=None,
                        help="training run; its model is WORKDIR/model/")
    _add_preset_argument(source)
    source.add_argument("--from-hf", dest="from_hf", default=None, metavar="DIR",
                        help="Hugging Face TransfoXL folder (no tokenizer: "
                        "use --prompt-ids)")
    _add_official_arguments(p, source)
    source.add_argument("--saved-model", dest="saved_model", default=None,
                        metavar="DIR", help="exported SavedModel (version "
                        "folder or its base); --prompt decodes with its "
                        "generate signature when it has one (at most the "
                        "caps recorded in its export.json), else, and with "
                        "--prompt-ids, --schedule or --segment-length, with "
                        "the host loop over its next_token signature")
    source.add_argument("--tflite", default=None, metavar="FILE",
                        help="exported stateless .tflite file")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", default=None, help="prompt text")
    prompt.add_argument("--prompt-ids", dest="prompt_ids", default=None,
                        metavar="IDS", help="comma-separated prompt ids; the "
                        "output is then ids too")
    _add_checkpoint_argument(p)
    _add_sampling_arguments(p, max_new_tokens=200, temperature=1.0, seed=None)
    p.add_argument("--no-cache", dest="use_cache", action="store_false",
                   help="Keras sources: decode with the host loop, recomputing "
                   "the memory keys/values at every step (the reference path; "
                   "slower). Greedy output is the same; sampled output for a "
                   "--seed differs from model.generate's (another loop draws "
                   "other random numbers), and is the same run after run")
    p.add_argument("--segment-length", dest="segment_length", type=int,
                   default=None, help="--schedule token: prompt chunk "
                   "length (default 1, the prompt fed one token at a time as "
                   "model.generate does); --schedule segment: the segment "
                   "length (default: the model's)")
    p.add_argument("--schedule", choices=("token", "segment"), default=None,
                   help="token: new tokens one at a time (default); segment: "
                   "as in training, re-running the current segment (the "
                   "only choice for a TFLite model exported with T > 1)")
    p.add_argument("--memory-length", dest="memory_length", type=int, default=None,
                   metavar="N", help="Keras sources: generate with a memory of N "
                   "positions (default: the model's; the weights do not depend on "
                   "it). Generation reads its context through the memory, so a "
                   "model trained with --memory-length 0 needs one")

    p = add_command(
        "serve-client", "ask a TF Serving deployment for text (its "
        "generate signature)",
        description="Sends the prompts to a TF Serving deployment of a "
        "SavedModel exported with a tokenizer (its `generate` signature: "
        "the whole continuation in one request) over REST or gRPC, and "
        "prints one JSON line per prompt: {\"prompt\", \"text\"} (text "
        "is the continuation).",
    )
    p.add_argument("mode", choices=["generate"], help="what to ask for")
    server = p.add_mutually_exclusive_group(required=True)
    server.add_argument("--rest", default=None, metavar="URL",
                        help="REST root, e.g. http://localhost:8501")
    server.add_argument("--grpc", default=None, metavar="HOST:PORT",
                        help="gRPC target, e.g. localhost:8500")
    p.add_argument("--model-name", dest="model_name", default="txl",
                   help="TF Serving's MODEL_NAME")
    p.add_argument("--prompt", action="append", required=True,
                   help="prompt text (repeatable: one batch)")
    _add_sampling_arguments(p, max_new_tokens=50, temperature=0.0, seed=0)
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds for the whole request")

    p = add_command(
        "attention", "attention heatmaps, score terms and loss by "
        "position (PNG)",
        description="Runs a text through a trained model and draws, for the "
        "chosen layers/heads, the attention over memory + segment, the "
        "score terms (a), (b), (d) of the paper, and the loss per position "
        "with and without memory.",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--workdir", default=None,
                        help="training run; its model is WORKDIR/model/")
    _add_preset_argument(source)
    p.add_argument("--text", required=True, metavar="FILE", help="a text file")
    p.add_argument("--out", required=True, help="output folder for the PNGs")
    p.add_argument("--layers", default="0", help="comma-separated layers "
                   "('all' for every layer)")
    p.add_argument("--heads", default="0", help="comma-separated heads "
                   "('all' for every head)")
    p.add_argument("--segment", type=int, default=None,
                   help="which segment to picture (default: the first one "
                   "with a full memory)")
    p.add_argument("--max-segments", dest="max_segments", type=int, default=64,
                   help="segments used for the loss-by-position plot (>= 1)")

    p = add_command(
        "demo", "the README's first command: train, eval, export and "
        "generate on an offline corpus",
        description="Writes a corpus of the Python standard library's "
        "docstrings (offline), trains the byte-level `tiny` preset on it, "
        "evaluates the test split with a memory 3x the training one, "
        "exports a SavedModel and a TFLite model into WORKDIR/export/ and "
        "samples text.",
    )
    p.add_argument("--workdir", default="runs/demo", help="run folder")
    p.add_argument("--steps", type=int, default=3000, help="training steps")
    p.add_argument("--learning-rate", dest="learning_rate", type=float,
                   default=2e-3, help="peak learning rate")
    p.add_argument("--max-chars", dest="max_chars", type=int, default=3_000_000,
                   help="size of the docstring corpus, in characters")
    p.add_argument("--prompt", default="Return the ", help="text to continue")
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int,
                   default=200, help="bytes to sample")

    p = add_command(
        "recl", "relative effective context length of a group of "
        "trained models (the paper's Appendix C)",
        description="Scores every model on the same target tokens with "
        "only c tokens of context, for each c of --contexts, and reports "
        "RECL per model for each r (training/recl.py).",
    )
    _add_data_arguments(p, "the first workdir's encoded split, WORKDIR/data/")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--workdirs", nargs="+", default=None,
                        metavar="[NAME=]WORKDIR", help="trained runs (a group)")
    source.add_argument("--from-preset", dest="from_preset", nargs="+", default=None,
                        metavar="[NAME=]DIR|HANDLE",
                        help="saved models (a group), each " + PRESET_HELP
                        + " (the first one's tokenizes --data, which is required)")
    p.add_argument("--split", default="test", choices=["train", "valid", "test"],
                   help="which split the target tokens come from")
    p.add_argument("--r", nargs="+", type=float, default=[0.1, 0.5, 1.0],
                   help="fractions of hardest tokens")
    p.add_argument("--contexts", nargs="+", type=int,
                   default=[16, 32, 64, 96, 128, 160, 192, 256, 320, 384],
                   help="context lengths c, walked in increasing order")
    p.add_argument("--targets", type=_positive_int_flag("--targets"), default=2000,
                   help="target tokens, spread evenly over the split")
    p.add_argument("--memory-length", dest="memory_length", type=int,
                   default=None, help="evaluation memory of the models that "
                   "have one (default: their training memory)")
    p.add_argument("--segment-length", dest="segment_length", type=int,
                   default=None, help="default: each model's own")
    p.add_argument("--max-window", dest="max_window", type=int, default=None,
                   help="longest window a model without memory reads "
                   "(default: its segment length)")
    p.add_argument("--batch-size", dest="batch_size", type=int, default=64,
                   help="windows scored at once")
    p.add_argument("--threshold", type=float, default=0.01,
                   help="relative gain below which a longer context no "
                   "longer counts")
    p.add_argument("--hard-set", dest="hard_set", default="current",
                   choices=["current", "initial"],
                   help="top-r tokens at each step's short context (paper) "
                   "or fixed at the shortest one")
    p.add_argument("--out", default=None, help="write the full result JSON "
                   "(and the loss tables as NAME_losses.npz); default: only "
                   "the summary on stdout")
    return parser


# === --from-preset (keras_txl/sources.py) ===
def _add_preset_argument(source):
    source.add_argument("--from-preset", dest="from_preset", default=None,
                        metavar="DIR|HANDLE", help=PRESET_HELP)


# === --from-official (keras_txl/official_checkpoint.py) ===
_PROTOCOLS = ("wt103", "enwik8", "text8", "lm1b")  # presets.EVAL_PROTOCOLS


def _add_official_arguments(parser, source):
    source.add_argument(
        "--from-official", dest="from_official", default=None, metavar="DIR",
        help="official TF release: checkpoint folder with corpus-info.json "
        "(docs/official_checkpoints.md)")
    parser.add_argument(
        "--vocabulary-file", dest="vocabulary_file", default=None,
        metavar="FILE", help="with --from-official: its symbols, one per "
        "line (needed for text)")


def _protocol(args, dataset=None):
    """The EVAL_PROTOCOLS name --protocol asks for (None without it)."""
    name = getattr(args, "protocol", None)
    if name != "paper":
        return name
    choices = f"--protocol {{{','.join(_PROTOCOLS)}}}"
    if not getattr(args, "from_official", None):
        raise ValueError(
            "--protocol paper takes the dataset from --from-official's "
            f"corpus-info.json; with --workdir or --from-preset, name the dataset: "
            f"{choices}."
        )
    if dataset not in _PROTOCOLS:
        found = ("names no dataset" if dataset is None
                 else f"names the dataset {dataset!r}, which has no paper protocol")
        raise ValueError(
            f"--protocol paper: the corpus-info.json of --from-official "
            f"{found}; name one instead: {choices}."
        )
    return dataset


def _official_model(args):
    """(model, tokenizer or None) of --from-official. The paper's protocol
    of its dataset applies unless --protocol names another."""
    from keras_txl.official_checkpoint import load_official_checkpoint
    from keras_txl.official_checkpoint import official_dataset

    dataset = official_dataset(args.from_official,
                               for_tokenizer=args.vocabulary_file is not None)
    preset = _protocol(args, dataset) or (
        dataset if dataset in _PROTOCOLS else None)
    model = load_official_checkpoint(
        args.from_official, preset=preset,
        vocabulary_file=args.vocabulary_file)
    tokenizer = None
    if args.vocabulary_file is not None:
        from keras_txl.tokenizers import official_tokenizer

        tokenizer = official_tokenizer(model.vocabulary, dataset)
    return model, tokenizer


def _eval(args):
    """`txl eval`: a training run (training/run.py), --from-preset or
    --from-official."""
    if args.checkpoint is not None and not args.workdir:
        raise ValueError("--checkpoint needs --workdir.")
    from keras_txl.training.run import tfds_options

    # The corpus flags, checked whatever the source: without --data, --workdir
    # scores its prepared split and they were dropped in silence.
    tfds_options(args)
    if args.from_official is None and args.protocol is not None:
        from keras_txl.presets import eval_protocol

        # Below the flags, above the run's recorded evaluation settings.
        args.protocol_name = _protocol(args)
        args.protocol_settings = eval_protocol(args.protocol_name)
        if args.from_preset is not None:  # no recorded settings: below the flags only
            for key in ("segment_length", "memory_length", "clamp_length", "same_length"):
                if getattr(args, key) is None:
                    setattr(args, key, args.protocol_settings[key])
    if args.workdir is not None:
        from keras_txl.training.run import eval_main

        _check_eval_size(args)
        return eval_main(args)
    import json
    import tempfile

    from keras_txl.training.loop import evaluate
    from keras_txl.training.run import bits_named
    from keras_txl.training.run import effective_eval_settings
    from keras_txl.training.run import encode_split_to_shards
    from keras_txl.training.run import tfds_options
    from keras_txl.training.run import warn_unknown_tokens

    if args.from_preset is not None:
        model, tokenizer = _preset_eval_model(args)
    else:
        model, tokenizer = _official_model(args)
        if not args.data or tokenizer is None:
            raise ValueError("--from-official needs --data (the corpus to score) "
                             "and --vocabulary-file (to tokenize it).")
    # Streamed into temporary shards (any size; the LM1B folder's held-out
    # shard 0 as the reference evaluates it).
    scratch = tempfile.TemporaryDirectory(prefix="txl-eval-")
    tokens = encode_split_to_shards(args.data, args.split, tokenizer, scratch.name,
                                    data_dir=args.data_dir, download=args.download,
                                    tfds=tfds_options(args))
    kwargs = {"batch_size": args.batch_size or 1}
    for key in ("segment_length", "memory_length", "clamp_length", "same_length"):
        if getattr(args, key) is not None:
            kwargs[key] = getattr(args, key)
    try:
        result = evaluate(model, tokens, max_segments=args.max_segments or 0,
                          unknown_id=tokenizer.unk_id, **kwargs)
    finally:
        tokens.close()
        scratch.cleanup()
    warn_unknown_tokens(result.pop("unknown_tokens", 0), result["tokens"], args.data,
                        tokenizer)
    print(json.dumps({"split": args.split, **bits_named(result, tokenizer),
                      "settings": {**effective_eval_settings(model.txl_config, kwargs,
                                                             args.max_segments or 0),
                                   "dtype": model.dtype_policy.name}}))
    return 0


def _preset_eval_model(args):
    """(model, tokenizer) of `txl eval --from-preset`: --data is required (a
    preset holds no prepared splits) and so is the preset's tokenizer; the
    evaluation memory is bounded as for --workdir."""
    from keras_txl.causal_lm import MAX_INITIAL_MEMORY_BYTES
    from keras_txl.tokenizers import load_tokenizer

    if not args.data:
        raise ValueError(
            "--from-preset needs --data (the corpus to score): a preset holds no "
            "prepared splits (those are a training run's, --workdir).")
    _check_lengths(args, {"segment_length": args.segment_length,
                          "memory_length": args.memory_length})
    model, tokenizer_dir = preset_model(args.from_preset, args.vocabulary_file)
    if tokenizer_dir is None:
        raise ValueError(
            f"--from-preset {args.from_preset!r} has no tokenizer (no tokenizer.json "
            "and assets/tokenizer/, e.g. a backbone's preset): --data cannot be "
            "tokenized. Save the model with its tokenizer (keras_txl.io.save_preset("
            "model, folder, tokenizer=...)).")
    tokenizer = load_tokenizer(tokenizer_dir)
    tokenizer.check_model_vocabulary(model.txl_config.vocabulary_size)
    config = model.txl_config
    M = args.memory_length if args.memory_length is not None else config.memory_length
    B = args.batch_size or 1
    memory = 4 * B * config.num_layers * M * config.hidden_dim
    if memory > MAX_INITIAL_MEMORY_BYTES:
        raise ValueError(
            f"--memory-length {M} with --batch-size {B} needs a "
            f"memory of {memory / 2**30:.1f} GiB (batch x {config.num_layers} layers "
            f"x {M} x hidden {config.hidden_dim}, float32), more than the "
            f"{MAX_INITIAL_MEMORY_BYTES // 2**30} GiB one evaluation may hold: "
            "lower --memory-length or --batch-size.")
    return model, tokenizer


def _add_sampling_arguments(p, max_new_tokens, temperature, seed):
    """--max-new-tokens, --temperature, --top-k, --top-p, --seed (`txl
    generate` and `txl serve-client generate`, with their own defaults)."""
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int,
                   default=max_new_tokens,
                   help="tokens to generate per prompt")
    p.add_argument("--temperature", type=float, default=temperature,
                   help="0 is greedy decoding")
    p.add_argument("--top-k", dest="top_k", type=int, default=0,
                   help="sample among the k most likely (0: all)")
    p.add_argument("--top-p", dest="top_p", type=float, default=1.0,
                   help="nucleus sampling threshold (1: all)")
    p.add_argument("--seed", type=int, default=seed,
                   help="same seed and flags, same output" + (
                       " (none: a random one)" if seed is None else ""))


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
    return materialize_model_folder(args.workdir, getattr(args, "checkpoint", None),
                                    out=os.path.join(out, "model"))


def _parse_ids(text, name):
    items = text.replace(" ", "").split(",")
    try:
        if "" in items:  # "1,,2" or "1,2,": a lost id, not a separator
            raise ValueError
        return [int(x) for x in items]
    except ValueError:
        raise ValueError(
            f"{name} must be comma-separated integers such as 1,2,3 (no "
            f"empty item), received {text!r}."
        ) from None


def _with_generation_memory(model, memory_length):
    """`model` with a memory of --memory-length positions, refused with the
    flag named when that memory alone passes what one call may hold (it
    ended in TensorFlow's ResourceExhaustedError traceback)."""
    from keras_txl.causal_lm import MAX_INITIAL_MEMORY_BYTES

    config = model.txl_config
    memory = 4 * config.num_layers * memory_length * config.hidden_dim
    if memory > MAX_INITIAL_MEMORY_BYTES:
        raise ValueError(
            f"--memory-length {memory_length} needs a memory of {memory / 2**30:.1f} GiB "
            f"per prompt ({config.num_layers} layers x {memory_length} x hidden "
            f"{config.hidden_dim}, float32), more than the "
            f"{MAX_INITIAL_MEMORY_BYTES // 2**30} GiB one call may hold: lower "
            "--memory-length.")
    return model.with_settings(memory_length=memory_length)


def _generation_source(args):
    """(backend, tokenizer folder or `Tokenizer` or None) for `txl generate`."""
    if args.checkpoint is not None and not args.workdir:
        raise ValueError("--checkpoint needs --workdir.")
    from keras_txl import generation
    from keras_txl import io

    memory_length = getattr(args, "memory_length", None)
    if memory_length is not None:
        if memory_length < 1:
            raise ValueError(f"--memory-length must be >= 1, received {memory_length}.")
        _check_lengths(args, {"memory_length": memory_length})
        if not (args.from_official or args.workdir or args.from_hf or args.from_preset):
            raise ValueError(
                "--memory-length applies to Keras sources (--workdir, --from-preset, "
                "--from-hf, --from-official); an export's memory length was fixed when "
                "it was exported (txl export --memory-length N).")
    if args.from_official:
        model, tokenizer = _official_model(args)
        if memory_length is not None:
            model = _with_generation_memory(model, memory_length)
        return generation.KerasBackend(model, use_cache=args.use_cache), tokenizer
    if args.from_preset:
        model, tokenizer_dir = preset_model(args.from_preset, args.vocabulary_file)
        if memory_length is not None:
            model = _with_generation_memory(model, memory_length)
        return generation.KerasBackend(model, use_cache=args.use_cache), tokenizer_dir
    if args.workdir or args.from_hf:
        if args.workdir:
            model_dir = _workdir_model_dir(args)
            if not os.path.isfile(os.path.join(model_dir, io.CONFIG_FILE)):
                raise ValueError(
                    f"No model in {model_dir}/ (expected the preset "
                    "written by training: config.json and its weights)."
                )
            model = io.load_pretrained(model_dir)
        else:
            from keras_txl.hf_checkpoint import load_hf_checkpoint

            model_dir = args.from_hf
            model = load_hf_checkpoint(model_dir)
        if memory_length is not None:
            model = _with_generation_memory(model, memory_length)
        backend = generation.KerasBackend(model, use_cache=args.use_cache)
        return backend, io.tokenizer_directory(model_dir)
    from keras_txl.export.generation import SavedModelBackend
    from keras_txl.export.generation import TFLiteBackend

    if args.saved_model:
        backend = SavedModelBackend(args.saved_model)
        return backend, backend.tokenizer_dir
    if os.path.isdir(args.tflite):
        found = sorted(f for f in os.listdir(args.tflite) if f.endswith(".tflite"))
        raise ValueError(
            f"--tflite {args.tflite!r} is a folder: pass the .tflite file "
            + (f"(it holds {', '.join(found)})." if found
               else "(this folder holds none).")
        )
    if not os.path.isfile(args.tflite):
        raise ValueError(f"--tflite {args.tflite!r} does not exist.")
    from keras_txl import console

    # LiteRT prints "INFO: Created TensorFlow Lite XNNPACK delegate" from C++
    # on the first invoke: make that invoke here, hidden unless -v.
    with console.native_stderr_hidden(not getattr(args, "verbose", False)):
        try:
            backend = TFLiteBackend.from_file(args.tflite)
        except ValueError as error:  # the runner names `model_path`: say the flag
            text = str(error).replace(f"`model_path` {args.tflite!r}", f"--tflite {args.tflite!r}")
            raise ValueError(text) from None
        import numpy as np

        backend.run(np.zeros((1, backend.segment_length), np.int32),
                    backend.initial_state())
    return backend, backend.tokenizer_dir


def encode_prompt(tokenizer, prompt):
    """(ids, the text the model receives) for a prompt, with one warning
    that names the characters the tokenizer does not know (they would
    otherwise become `<unk>`, or U+FFFD for bytes, in silence)."""
    unknown = tokenizer.unknown_characters(prompt)
    ids = tokenizer.encode(prompt)
    received = tokenizer.decode(ids)
    if unknown:
        if tokenizer.unk_id is not None:
            becomes = f"the model receives {tokenizer.decode([tokenizer.unk_id])} for each"
        else:  # bytes: the raw bytes of text that was not UTF-8
            becomes = "the model receives their raw bytes, shown as U+FFFD"
        logger.warning(
            "the prompt has %d character(s) the %s tokenizer does not know: "
            "%s; %s.", len(unknown), tokenizer.kind,
            " ".join(repr(c) for c in unknown), becomes,
        )
    elif received.split() != prompt.split():  # not just spacing, which words drop
        logger.warning(
            "the %s tokenizer does not keep the prompt exactly; the model "
            "receives %r.", tokenizer.kind, received,
        )
    return ids, received


def _uses_generate_signature(args):
    """Whether `txl generate` decodes with a SavedModel's `generate`
    signature (if the export has one): text in, no host-loop flags."""
    return (args.saved_model is not None and args.prompt is not None
            and args.schedule is None and args.segment_length is None)


def _generate_caps(args):
    """The `generate_caps` a SavedModel export recorded in its export.json
    (max_new_tokens, max_prompt_tokens), or None."""
    from keras_txl.export import serving

    info_path = os.path.join(serving.resolve_version_dir(args.saved_model),
                             serving.ASSETS_EXTRA, "export.json")
    if not os.path.isfile(info_path):
        return None
    try:
        with open(info_path, encoding="utf-8") as f:
            caps = json.load(f).get("generate_caps")
    except (ValueError, AttributeError):
        return None  # the backend names a damaged export when it loads it
    return caps if isinstance(caps, dict) else None


# The Python arguments the library's checks name, and the `txl` flags that set them.
_FLAGS = {"temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p",
          "seed": "--seed", "segment_length": "--segment-length",
          "max_new_tokens": "--max-new-tokens", "timeout": "--timeout",
          "url": "--rest", "target": "--grpc", "model_name": "--model-name",
          "prompts": "--prompt", "segment": "--segment"}


def _said_by_flag(error, names):
    """`error` (a library check's ValueError, which names Python arguments:
    "`top_k` must be ..., received top_k=-1") with the arguments of `names`
    said as the flags that set them ("--top-k must be ..., received --top-k -1")."""
    text = str(error)
    for name in names:
        flag = _FLAGS[name]
        text = text.replace(f"`{name}`", flag).replace(f"received {name}=", f"received {flag} ")
        text = text.replace(f"Received: {name}=", f"Received: {flag} ")
    return ValueError(text)


def _max_new_tokens_error(args, high, why, hint=""):
    return ValueError(
        f"--max-new-tokens (`max_new_tokens`) must be an integer in [1, "
        f"{high}]{why}, received {args.max_new_tokens}{hint}."
    )


def _check_generate_arguments(args):
    """`txl generate`'s numbers, checked before a model is read or anything
    is printed. Returns the SavedModel's generate caps (or None)."""
    from keras_txl import checks
    from keras_txl.causal_lm import MAX_GENERATE_LENGTH
    from keras_txl.generation import check_sampling
    from keras_txl.generation import check_seed

    try:
        check_sampling(args.temperature, args.top_k, args.top_p)
        check_seed(args.seed)
        if args.segment_length is not None:
            checks.positive_int("segment_length", args.segment_length)
    except ValueError as error:
        raise _said_by_flag(error, ("temperature", "top_k", "top_p", "seed",
                                    "segment_length")) from None
    # One bound for every source: model.generate allocates (batch, prompt +
    # new tokens) buffers up front and refuses more than MAX_GENERATE_LENGTH
    # in one call; the host loops keep to the same rule.
    if not 1 <= args.max_new_tokens <= MAX_GENERATE_LENGTH - 1:
        raise _max_new_tokens_error(
            args, MAX_GENERATE_LENGTH - 1,
            f" (one call generates at most {MAX_GENERATE_LENGTH} = 2**20 "
            "tokens, the prompt's included)")
    caps = _generate_caps(args) if _uses_generate_signature(args) else None
    if caps and args.max_new_tokens > caps.get("max_new_tokens", float("inf")):
        raise _max_new_tokens_error(
            args, caps["max_new_tokens"],
            " with this SavedModel's generate signature (the cap its "
            "export.json records)", "; for more, pass --schedule token: the "
            "host loop over next_token has no such cap")
    return caps


def _check_schedule(args, backend):
    """--schedule and --segment-length against a model exported with a
    fixed segment length (named by flag, before any output)."""
    fixed = getattr(backend, "segment_length", None)
    if fixed is None:
        return
    if args.segment_length is not None and args.segment_length != fixed:
        raise ValueError(
            f"--segment-length {args.segment_length}: this model was exported "
            f"with a fixed segment length of {fixed}; omit --segment-length, "
            f"or export with --segment-length {args.segment_length}."
        )
    if args.schedule == "token" and fixed != 1:
        raise ValueError(
            f"--schedule token feeds one token at a time, but this model "
            f"takes exactly {fixed} tokens per call: pass --schedule segment "
            "(or omit --schedule), or export with --segment-length 1."
        )


def _generate(args):
    import time

    from keras_txl.generation import TextStream
    from keras_txl.generation import generate_iter

    caps = _check_generate_arguments(args)
    backend, tokenizer_dir = _generation_source(args)
    config = getattr(backend, "config", None)
    if config is not None:
        from keras_txl import checks

        checks.memory_for_generation(
            config.memory_length,
            how="pass --memory-length N" if getattr(backend, "model", None) is not None
            else "export the model again with txl export --memory-length N")
    _check_schedule(args, backend)
    tokenizer = None
    if args.prompt is not None:
        if tokenizer_dir is None:
            raise ValueError(
                "this model has no tokenizer (none was saved or exported with "
                "it; --from-official takes --vocabulary-file); pass the "
                "prompt as ids with --prompt-ids 1,2,3."
            )
        if isinstance(tokenizer_dir, str):
            from keras_txl.tokenizers import load_tokenizer

            tokenizer = load_tokenizer(tokenizer_dir)
        else:
            tokenizer = tokenizer_dir  # --from-official: built in memory
        tokenizer.check_model_vocabulary(backend.vocabulary_size)
        prompt_ids, received = encode_prompt(tokenizer, args.prompt)
        if len(prompt_ids) == 0:
            raise ValueError("--prompt encodes to no tokens; give some text.")
    else:
        prompt_ids = _parse_ids(args.prompt_ids, "--prompt-ids")
        size = backend.vocabulary_size
        outside = [i for i in prompt_ids if not 0 <= i < size]
        if outside:
            raise ValueError(f"--prompt-ids must be ids in [0, {size}) (the model's "
                             f"vocabulary), received {outside[:5]}.")
    from keras_txl.causal_lm import MAX_GENERATE_LENGTH

    if len(prompt_ids) + args.max_new_tokens > MAX_GENERATE_LENGTH:
        raise ValueError(
            f"the prompt ({len(prompt_ids)} tokens) and --max-new-tokens "
            f"{args.max_new_tokens} come to more than the "
            f"{MAX_GENERATE_LENGTH} (2**20) tokens of one call: shorten "
            "the prompt or lower --max-new-tokens."
        )
    start = time.perf_counter()
    model = getattr(backend, "model", None)  # a Keras source
    if (tokenizer is not None and getattr(backend, "has_generate", False)
            and _uses_generate_signature(args)):
        # A SavedModel exported with its tokenizer: its `generate`
        # signature decodes the whole continuation in the graph.
        cap = (caps or {}).get("max_prompt_tokens")
        if cap is not None and len(prompt_ids) > cap:
            raise ValueError(
                f"--prompt holds {len(prompt_ids)} tokens, more than the "
                f"{cap} this SavedModel's generate signature takes (the cap "
                "its export.json records): shorten it, or pass --schedule "
                "token to decode with the host loop over next_token."
            )
        # The ids, decoded like every other source's (the signature's
        # `texts` decode the continuation alone: a word tokenizer's would
        # lose the space after the prompt).
        (new_ids,) = backend.generate_ids(
            [args.prompt], args.max_new_tokens, temperature=args.temperature,
            top_k=args.top_k, top_p=args.top_p, seed=args.seed)
        tokens = iter(new_ids.tolist())
    elif (model is not None and args.use_cache and args.schedule is None
            and args.segment_length is None):
        # keras-hub's compiled loop (model.generate): the whole continuation
        # in one tf.function, printed when it is done.
        from keras_txl.generation import generate_ids

        (new,) = generate_ids(
            model, [prompt_ids], args.max_new_tokens,
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            seed=args.seed,
        )
        tokens = iter(new.tolist())
    else:
        tokens = generate_iter(
            backend, prompt_ids, args.max_new_tokens,
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            seed=args.seed, segment_length=args.segment_length,
            schedule=args.schedule,
        )
    out = sys.stdout
    count = 0  # the clock started before generation (a lazy loop runs below)
    if tokenizer is not None:
        stream = TextStream(tokenizer, prompt_ids)
        out.write(received)  # what the model reads, not what was typed
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


def _serve_client(args):
    """`txl serve-client generate`: one request, one JSON line per prompt."""
    from keras_txl.export.serving_client import ServingError
    from keras_txl.export.serving_client import TXLServingClient

    try:
        if args.rest:
            client = TXLServingClient.rest(args.rest, args.model_name,
                                           timeout=args.timeout)
        else:
            client = TXLServingClient.grpc(args.grpc, args.model_name,
                                           timeout=args.timeout)
    except ValueError as error:
        raise _said_by_flag(error, ("url", "target", "model_name", "timeout")) from None
    with client:
        try:
            texts, _ = client.generate(
                args.prompt, args.max_new_tokens, temperature=args.temperature,
                top_k=args.top_k, top_p=args.top_p, seed=args.seed,
            )
        except ValueError as error:  # an argument, checked before anything is sent
            raise _said_by_flag(error, ("prompts", "max_new_tokens", "temperature",
                                        "top_k", "top_p", "seed")) from None
        except ServingError as e:
            where = f"--rest {args.rest!r}" if args.rest else f"--grpc {args.grpc!r}"
            # status None: no answer came (unreachable, timed out).
            said = "" if e.status is None else "the server answered: "
            raise ValueError(f"{where}: {said}{e}") from e
    ids = client.token_ids or [None] * len(texts)
    for prompt, text, row in zip(args.prompt, texts, ids):
        line = {"prompt": prompt, "text": text}
        if row is not None:  # exact where the text may not be (a cut character)
            line["token_ids"] = row.tolist()
        print(json.dumps(line, ensure_ascii=False))
    return 0


def _attention(args):
    from keras_txl import insight
    from keras_txl import io

    if not os.path.isfile(args.text):
        raise ValueError(f"--text {args.text!r} is not a file.")
    if args.from_preset is not None:
        model, tokenizer_dir = preset_model(args.from_preset)
        if tokenizer_dir is None:
            raise ValueError(
                f"--from-preset {args.from_preset!r} has no tokenizer (no tokenizer.json "
                "and assets/tokenizer/, e.g. a backbone's preset): cannot read --text.")
    else:
        # The newest of WORKDIR/model and its checkpoints, as for txl eval/generate
        # (and a model folder given as --workdir named as such).
        model_dir = _workdir_model_dir(args)
        tokenizer_dir = io.tokenizer_directory(model_dir)
        if tokenizer_dir is None:
            raise ValueError(f"No tokenizer/ in {model_dir}: cannot read --text.")
        model = io.load_pretrained(model_dir)
    from keras_txl.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    tokenizer.check_model_vocabulary(model.txl_config.vocabulary_size)
    with open(args.text, encoding="utf-8-sig") as f:  # a leading BOM is no text
        ids = tokenizer.encode(f.read())
    if len(ids) < 2:
        raise ValueError(
            f"--text {args.text!r} encodes to {len(ids)} token(s) with the model's "
            f"{tokenizer.kind} tokenizer; the pictures need at least 2 (a segment "
            "and the loss of its next token): give a longer text.")
    if tokenizer.unk_id is not None:
        import numpy as np

        from keras_txl.training.run import warn_unknown_tokens

        warn_unknown_tokens(int(np.count_nonzero(np.asarray(ids) == tokenizer.unk_id)),
                            len(ids), args.text, tokenizer, flag="--text",
                            consequence="the pictures show the model reading that token, "
                            "not this text")
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

    layers = choose(args.layers, cfg.num_layers, "layers")
    heads = choose(args.heads, cfg.num_heads, "heads")
    try:
        paths = insight.attention_report(
            model, ids, args.out, layers=layers, heads=heads,
            segment=args.segment, max_segments=args.max_segments,
            token_labels=[tokenizer.decode([i]) for i in range(cfg.vocabulary_size)],
        )
    except ValueError as error:
        raise _said_by_flag(error, ("segment",)) from None
    for path in paths:
        print(path)
    return 0


def _demo(args):
    """Train a small model on the offline stdlib-docstring corpus, evaluate,
    export and generate: the README's first command."""
    import time

    start = time.time()
    from keras_txl.training.run import WorkdirLock
    from keras_txl.training.run import writable_workdir

    writable_workdir(args.workdir)  # a file there: said as txl train says it
    # Held from before the corpus is written to the end (training, eval and
    # export all write in the workdir): a second demo, train or prepare on
    # it is refused before it writes anything.
    with WorkdirLock(args.workdir, command="txl demo"):
        return _demo_locked(args, start)


def _demo_locked(args, start):
    import time

    from keras_txl.presets import PRESETS
    from keras_txl.training.corpora import prepare_stdlib_docs
    from keras_txl.training.run import eval_main
    from keras_txl.training.run import train_main

    corpus_dir = os.path.join(args.workdir, "corpus")
    prepare_stdlib_docs(corpus_dir, max_chars=args.max_chars)
    print(f"[demo] corpus: Python standard library docstrings -> {corpus_dir}")

    # The commands are built by the `txl` parser itself, so they are exactly
    # what `txl train` / `txl eval` would run.
    parser = build_parser()
    train_memory = PRESETS["tiny"]["model"]["memory_length"]
    evaluation = PRESETS["tiny"]["eval"]
    # One validation, at the end, with the evaluation settings: the trainer's
    # final evaluation is the one `txl train` prints as its JSON line.
    print(f"[demo] training (memory {train_memory}); at the end, validation with the "
          f"preset's evaluation settings (memory {evaluation['memory_length']}, "
          f"same_length {evaluation['same_length']}): the 'eval step' log line and "
          "the JSON line, whose 'settings' say so.")
    train_main(parser.parse_args([
        "train", "--data", corpus_dir, "--workdir", args.workdir,
        "--preset", "tiny", "--tokenizer", "byte", "--steps", str(args.steps),
        "--set", "dropout=0.1", "--set", f"learning_rate={args.learning_rate}",
        "--set", f"warmup_steps={min(100, args.steps)}", "--set", "log_every=250",
        "--set", f"checkpoint_every={min(1000, args.steps)}",
    ]), workdir_locked=True)
    print(f"[demo] trained in {time.time() - start:.0f}s")

    print(f"[demo] test set, with the same evaluation settings (memory "
          f"{evaluation['memory_length']}: {evaluation['memory_length'] // train_memory}x "
          "the training memory):")
    eval_argv = ["eval", "--workdir", args.workdir, "--split", "test",
                 "--memory-length", str(evaluation["memory_length"])]
    eval_main(parser.parse_args(
        eval_argv + (["--same-length"] if evaluation["same_length"] else [])))

    from keras_txl.export.saved_model import export_saved_model
    from keras_txl.export.tflite import export_tflite
    from keras_txl.io import load_pretrained
    from keras_txl.io import tokenizer_directory

    model = load_pretrained(os.path.join(args.workdir, "model"))
    out = os.path.join(args.workdir, "export")
    # Both exports carry the tokenizer, as `txl export` writes them: `txl
    # generate --saved-model/--tflite` then take text prompts.
    tokenizer_dir = tokenizer_directory(os.path.join(args.workdir, "model"))
    path = export_saved_model(model, out, tokenizer_dir=tokenizer_dir, overwrite=True)
    print(f"[demo] SavedModel (any batch and segment length): {path}")
    T = model.txl_config.segment_length
    tfl = export_tflite(model, os.path.join(out, "txl.tflite"), batch_size=1,
                        segment_length=T, tokenizer_dir=tokenizer_dir)
    print(f"[demo] TFLite (batch 1, segment length {T}): {tfl}")

    from keras_txl.generation import generate_text
    from keras_txl.io import tokenizer_directory
    from keras_txl.tokenizers import load_tokenizer

    model_dir = os.path.join(args.workdir, "model")
    _, received = encode_prompt(
        load_tokenizer(tokenizer_directory(model_dir)), args.prompt)
    text = generate_text(model_dir, args.prompt,
                         max_new_tokens=args.max_new_tokens, temperature=0.8, top_k=20,
                         seed=0)
    print("[demo] sample:")
    print(received + text[len(args.prompt):])
    print(f"[demo] done in {time.time() - start:.0f}s")
    return 0


def _check_text_file(path, flag):
    """A ValueError naming `flag` unless `path` is a UTF-8 text file (read
    in pieces: an LM1B vocabulary is 10 MB)."""
    import codecs

    if os.path.isdir(path):
        raise ValueError(f"{flag} {path!r} is a folder: pass a text file.")
    if not os.path.isfile(path):
        raise ValueError(f"{flag} {path!r} does not exist.")
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                # The decoder's positions count from the bytes it holds: the
                # undecoded tail of the last piece, then this one.
                start = offset - (len(e.object) - len(chunk))
                byte = e.object[e.start:e.start + 1].hex()
                raise ValueError(
                    f"{flag} {path!r} is not UTF-8 text: byte 0x{byte} at "
                    f"offset {start + e.start} ({e.reason})."
                ) from None
            if not chunk:
                return
            offset += len(chunk)


def _check_workdir_folder(args):
    """--workdir that is a file: named as such (not "not writable", or
    "no model in FILE/model/: train first"); --out of `txl attention` too."""
    path = getattr(args, "workdir", None)
    if args.command == "demo":
        path = None  # said by writable_workdir, as txl train's was
    if path and os.path.lexists(path) and not os.path.isdir(path):
        if args.command in ("train", "prepare"):
            raise ValueError(
                f"--workdir {path!r} is a file: it must be a folder (new or "
                "existing) for the run."
            )
        raise ValueError(
            f"--workdir {path!r} is a file: pass a training run's folder (the "
            "--workdir of txl train).")
    out = getattr(args, "out", None)
    if args.command == "attention" and os.path.lexists(out) and not os.path.isdir(out):
        raise ValueError(
            f"--out {out!r} is a file: it must be a folder (new or existing) for "
            "the pictures.")


def _flag_or_config(args, name):
    """How the user set a training size: its flag, or the config."""
    if getattr(args, name, None) is not None:
        return f"--{name.replace('_', '-')} {getattr(args, name)}"
    return f"{name} (from --preset/--config/--set)"


def _check_lengths(args, lengths):
    """segment/memory lengths within `Limits.max_sequence_length` (the
    bound of loaded models) before a model is built: 2,000,000 would
    otherwise crash TensorFlow's kernels (a segfault, no message)."""
    from keras_txl.limits import ENVIRONMENT_VARIABLE
    from keras_txl.limits import resolve_limits

    limit = resolve_limits().max_sequence_length
    for name, value in lengths.items():
        if value is not None and value > limit:
            raise ValueError(
                f"{_flag_or_config(args, name)} exceeds the limit "
                f"max_sequence_length={limit} of keras_txl.limits; pass a "
                f"smaller value (or raise the limit with {ENVIRONMENT_VARIABLE}="
                f"'{{\"max_sequence_length\": ...}}')."
            )


def _physical_memory_bytes():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _check_train_size(args):
    """`txl train`'s lengths and the bytes one step holds, checked before
    anything is built. Also --strategy tpu without a TPU to connect to."""
    import dataclasses

    from keras_txl.causal_lm import MAX_INITIAL_MEMORY_BYTES
    from keras_txl.config import TransformerXLConfig
    from keras_txl.training import run

    # The same resolution train_main makes (its log lines said once, there).
    quiet, run.logger.disabled = run.logger.disabled, True
    try:
        model, train, _, _ = run.resolve_configs(
            args.preset, args.config, args.set,
            {"segment_length": args.segment_length,
             "memory_length": args.memory_length, "batch_size": args.batch_size,
             "steps": args.steps, "strategy": args.strategy, "loop": args.loop,
             "jit_compile": args.jit_compile, "precision": args.precision},
        )
    finally:
        run.logger.disabled = quiet
    # Given for a strategy that does not read it: refused, not dropped.
    for flag, value, strategy in (("--tpu", args.tpu, "tpu"),
                                  ("--cluster-timeout", args.cluster_timeout, "multi_worker")):
        if value and train.strategy != strategy:
            how = ("--strategy" if args.strategy is not None
                   else "the strategy of --preset/--config/--set")
            raise ValueError(
                f"{flag} applies to --strategy {strategy}, and this run's strategy is "
                f"{train.strategy!r} ({how}): leave {flag} out, or pass --strategy "
                f"{strategy}.")
    if train.strategy == "tpu" and not args.tpu and not any(
            os.environ.get(v) for v in ("TPU_NAME", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS",
                                        "TPU_CONFIG")):
        raise ValueError(
            "--strategy tpu needs --tpu: the TPU's name or grpc:// address "
            "('local' on a TPU VM), or the TPU_NAME environment variable."
        )
    defaults = {f.name: f.default for f in dataclasses.fields(TransformerXLConfig)}
    size = {k: model.get(k, defaults.get(k)) for k in (
        "segment_length", "memory_length", "num_layers", "hidden_dim", "num_heads")}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
               for v in size.values() if v is not None):
        return  # the model config names its own bad field when it is built
    _check_lengths(args, {k: size[k] for k in ("segment_length", "memory_length")})
    if train.strategy != "default" or None in size.values():
        return  # the batch is split over devices this cannot count yet
    B, T, M = train.batch_size, size["segment_length"], size["memory_length"]
    L, D, H = size["num_layers"], size["hidden_dim"], size["num_heads"]
    memory = 4 * B * L * M * D
    # A lower bound of what the memory adds to one step, kept for the
    # backward pass, per layer: attention scores and probabilities over
    # the memory's keys (B, H, T, M), the memory input and its keys and
    # values (B, M, D). (A long segment meets the corpus's own size check
    # first: it needs segment_length + 1 tokens per stream.)
    step = 4 * L * (2 * B * H * T * M + 3 * B * M * D)
    import tensorflow as tf

    # On a CPU all of it is in the host's memory (a GPU has its own).
    ram = None if tf.config.list_physical_devices("GPU") else _physical_memory_bytes()
    flags = (f"{_flag_or_config(args, 'memory_length')}, "
             f"{_flag_or_config(args, 'segment_length')} and "
             f"{_flag_or_config(args, 'batch_size')}")
    if memory > MAX_INITIAL_MEMORY_BYTES:
        raise ValueError(
            f"{flags} need a memory of {memory / 2**30:.1f} GiB (batch {B} x "
            f"{L} layers x {M} x hidden {D}, float32), more than the "
            f"{MAX_INITIAL_MEMORY_BYTES // 2**30} GiB one device may hold "
            "(as for txl eval): lower --memory-length or --batch-size."
        )
    if ram is not None and memory + step > ram:
        raise ValueError(
            f"{flags} need at least {(memory + step) / 2**30:.1f} GiB per "
            f"step on this CPU (the memory, and per layer the attention "
            f"scores and probabilities over it, batch {B} x {H} heads x {T} x "
            f"{M}), "
            f"more than this host's {ram / 2**30:.1f} GiB: lower "
            "--segment-length, --memory-length or --batch-size."
        )


def _check_eval_size(args):
    """`txl eval --workdir`'s memory before the model is read (the model's
    own check names an argument no flag sets)."""
    from keras_txl.causal_lm import MAX_INITIAL_MEMORY_BYTES
    from keras_txl.training.run import resolve_eval_settings

    _check_lengths(args, {"segment_length": args.segment_length,
                          "memory_length": args.memory_length})
    try:
        with open(os.path.join(args.workdir, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        L, D = int(config["num_layers"]), int(config["hidden_dim"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # not a training run's folder: the loader says what is wrong
    # A damaged eval_config.json is named here, before the model is read.
    settings, _ = resolve_eval_settings(args, config)
    try:
        M, B = int(settings["memory_length"]), int(settings["batch_size"])
    except (ValueError, TypeError):
        return
    memory = 4 * B * L * M * D
    if memory > MAX_INITIAL_MEMORY_BYTES:
        raise ValueError(
            f"--memory-length {M} with --batch-size {B} needs a "
            f"memory of {memory / 2**30:.1f} GiB (batch x {L} layers x {M} x "
            f"hidden {D}, float32), more than the "
            f"{MAX_INITIAL_MEMORY_BYTES // 2**30} GiB one evaluation may hold: "
            "lower --memory-length or --batch-size."
        )


def _check_demo_arguments(args):
    """`txl demo`'s numbers, named by flag before the corpus is written: a bad
    --max-new-tokens was found after training, evaluation and export."""
    import math

    from keras_txl.causal_lm import MAX_GENERATE_LENGTH
    from keras_txl.training.config import MAX_COUNT

    for flag, value, high in (("--steps", args.steps, MAX_COUNT),
                              ("--max-chars", args.max_chars, None),
                              ("--max-new-tokens", args.max_new_tokens,
                               MAX_GENERATE_LENGTH - 1)):
        if value < 1 or (high is not None and value > high):
            expected = f"in [1, {high}]" if high is not None else ">= 1"
            raise ValueError(f"{flag} must be an integer {expected}, received {value}.")
    if not (math.isfinite(args.learning_rate) and args.learning_rate > 0):
        raise ValueError(
            f"--learning-rate must be a finite number > 0, received {args.learning_rate}.")


def _check_paths(args):
    """Paths and counts every command takes, named by flag before anything
    is loaded."""
    if args.command in ("eval", "generate", "export"):
        check_vocabulary_file(args)  # --from-official's alone
    if getattr(args, "vocabulary_file", None) is not None:
        _check_text_file(args.vocabulary_file, "--vocabulary-file")
    _check_workdir_folder(args)
    if args.command == "demo":
        _check_demo_arguments(args)
    if args.command == "attention":
        if args.max_segments < 1:
            raise ValueError(
                f"--max-segments must be a positive integer, received "
                f"{args.max_segments}."
            )
        _check_text_file(args.text, "--text")


# The flags that take a path (or several): a leading ~ is the home folder.
_PATH_FLAGS = ("data", "data_dir", "workdir", "workdirs", "config", "vocabulary_file",
               "from_preset", "from_hf", "from_official", "saved_model", "tflite",
               "text", "out", "checkpoint")


def _expand_home(args):
    """`~/...` in the path flags, as the shell would have expanded it: the
    shell does not in `--workdir=~/runs/x` (after '=') or in quotes, and the
    run went to a folder named '~' in the current one."""
    for name in _PATH_FLAGS:
        value = getattr(args, name, None)
        if isinstance(value, str) and value.startswith("~"):
            setattr(args, name, os.path.expanduser(value))
        elif isinstance(value, list):
            setattr(args, name, [_expand_spec(v) for v in value])


def _expand_spec(value):
    """`[NAME=]PATH` of --workdirs/--from-preset with PATH's ~ expanded."""
    if not isinstance(value, str):
        return value
    name, sep, path = value.rpartition("=") if "=~" in value else ("", "", value)
    return f"{name}{sep}{os.path.expanduser(path)}" if path.startswith("~") else value


def _check_flags(parser, argv):
    """Exits with the command's usage when a `--flag` of `argv` is none of its
    command's (nor a prefix argparse resolves), naming the closest one: argparse
    says "txl: error: unrecognized arguments" under the top-level usage, or
    first reports a required option the typo was meant to be."""
    import difflib

    command = []
    for index, token in enumerate(argv):
        if token == "--":
            return
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is not None and token in sub.choices:
            parser = sub.choices[token]
            command.append(token)
            continue
        if not token.startswith("--") or not command:
            continue
        name = token.split("=", 1)[0]
        flags = [f for a in parser._actions for f in a.option_strings if f.startswith("--")]
        if name in flags or any(f.startswith(name) for f in flags):
            continue
        if index and argv[index - 1] in flags and not name[2:3].isalpha():
            continue  # a value that looks like a flag (e.g. --prompt "--")
        meant = difflib.get_close_matches(name, flags, n=1, cutoff=0.6)
        hint = f" (did you mean {meant[0]}?)" if meant else ""
        parser.error(f"unrecognized argument {name}{hint}")


def main(argv=None):
    parser = build_parser()
    _check_flags(parser, sys.argv[1:] if argv is None else list(argv))
    args = parser.parse_args(argv)
    _expand_home(args)
    from keras_txl import console

    console.configure_logging(args.verbose)
    from keras_txl import require_tensorflow

    # Every command runs a model: say which wheel is missing. Loading
    # TensorFlow prints C++ lines before its logging is set up, past
    # TF_CPP_MIN_LOG_LEVEL: hidden unless -v (shown if the import fails).
    try:
        try:
            with console.native_stderr_hidden(not args.verbose):
                require_tensorflow()
        except ImportError as e:  # a wheel or add-on missing: the message says which
            raise ValueError(str(e)) from e
        _check_paths(args)
        if args.command == "train":
            from keras_txl.training.run import train_main

            _check_train_size(args)
            return train_main(args)
        if args.command == "prepare":
            from keras_txl.training.run import prepare_main

            return prepare_main(args)
        if args.command == "eval":
            return _eval(args)
        if args.command == "export":
            from keras_txl.export import cli as export_cli

            export_cli.check_arguments(args)  # bad flags before any model is read
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
        if args.command == "serve-client":
            return _serve_client(args)
        if args.command == "attention":
            return _attention(args)
        if args.command == "demo":
            return _demo(args)
        if args.command == "recl":
            from keras_txl.training.recl import recl_main

            return recl_main(args)
    except (ValueError, OSError) as e:
        # OSError: a path that is a file where a folder belongs, a folder
        # where a file does, no permission, no space left: the message
        # names the path; a traceback would bury it.
        print(f"txl {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before training's own handler is installed
        print(f"txl {args.command}: interrupted.", file=sys.stderr)
        return 130
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
