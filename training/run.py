"""`txl train` / `txl eval` / `txl demo`: corpora -> tokenizer -> model -> training.

A workdir holds everything of a run:

    workdir/
      config.json          the model config (TransformerXLConfig)
      train_config.json    the training config
      eval_config.json     the settings of `txl train`'s final evaluation, in full
                           (what `txl eval --workdir` evaluates with by default)
      tokenizer/           the tokenizer, fitted on the training split
      data/{split}/        the encoded splits as token shards (training/shards.py)
      data/source.json     what the shards were made from (source path; each file's
                           size, mtime, ctime and inode, and content sha256;
                           tokenizer kind, options and sha256): a changed --data is refused
      checkpoints/ckpt-*   atomic, checksummed checkpoints (+ latest.json)
      train.lock           held by the running `txl train` or `txl prepare`
      model/               the latest model folder (config, safetensors,
                           tokenizer): what eval, export and generate read
      tensorboard/, metrics.jsonl
"""

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import sys

import numpy as np

from keras_txl import TransformerXLConfig
from keras_txl.folders import sha256_tree
from keras_txl.presets import PRESETS
from keras_txl.safe_files import default_mode
from keras_txl.training.config import TrainConfig
from keras_txl.training.config import parse_override

logger = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")


# The sections of a `--config` file, and the settings of its "eval" one:
# how `txl train` evaluates at the end. Left out, each is the model's own
# (the values below); given, it is used as given: memory_length 0 is an
# evaluation without memory, segment_length 0 and clamp_length -1 the
# model's own.
CONFIG_SECTIONS = ("model", "train", "eval")
EVAL_DEFAULTS = {"segment_length": 0, "memory_length": 0, "clamp_length": -1,
                 "same_length": False, "batch_size": 1}
_CONFIG_MAX_BYTES = 16 << 20
# `txl train` records in the workdir every setting its final evaluation runs
# with (the model's own filled in), and `txl eval --workdir` defaults to
# them: without flags it gives the number `txl train` printed.
EVAL_CONFIG_FILE = "eval_config.json"
EVAL_SETTING_KEYS = ("segment_length", "memory_length", "clamp_length", "same_length",
                     "batch_size")


def _unknown_keys(where, what, data, known):
    """Refuses keys of `data` not in `known`, naming each (with the
    nearest known key) and listing the known ones."""
    import difflib

    unknown = sorted(set(data) - set(known), key=str)
    if not unknown:
        return
    named = []
    for key in unknown:
        near = difflib.get_close_matches(str(key), list(known), n=1)
        named.append(f"{key!r} (did you mean {near[0]!r}?)" if near else repr(key))
    raise ValueError(f"{where}: unknown {what} {', '.join(named)}. Valid: {sorted(known)}.")


def _check_eval_section(where, evaluation):
    """The types and ranges of a --config file's "eval" settings."""
    lowest = {"segment_length": 0, "memory_length": 0, "clamp_length": -1, "batch_size": 1}
    for key, value in evaluation.items():
        if key == "same_length":
            if not isinstance(value, bool):
                raise ValueError(f'{where}: "eval" {key} must be true or false. '
                                 f"Received: {value!r}.")
        elif isinstance(value, bool) or not isinstance(value, int) or value < lowest[key]:
            raise ValueError(f'{where}: "eval" {key} must be an integer >= '
                             f"{lowest[key]}. Received: {value!r}.")


def read_config_file(path):
    """`--config FILE` as `(model, train, eval)` dicts.

    The file is a JSON object: a model config (the keys of
    `TransformerXLConfig`, as `WORKDIR/config.json`; or a keras-hub preset's
    `config.json`, as `WORKDIR/model/config.json`), or sections
    `{"model": {...}, "train": {...}, "eval": {...}}` ("model" required;
    "train": `TrainConfig` keys; "eval": the keys of `EVAL_DEFAULTS`).
    An unknown section or key, and every problem reading the file, is a
    ValueError naming --config and the path.
    """
    where = f"--config {path!r}"
    if os.path.isdir(path):
        raise ValueError(f"{where} is a folder: pass a JSON file (a model config, or "
                         '{"model": ..., "train": ..., "eval": ...}).')
    try:
        with open(path, "rb") as handle:
            raw = handle.read(_CONFIG_MAX_BYTES + 1)
    except FileNotFoundError:
        raise ValueError(f"{where}: no such file.") from None
    except OSError as error:
        raise ValueError(f"{where} cannot be read ({error.strerror or error}).") from None
    if len(raw) > _CONFIG_MAX_BYTES:
        raise ValueError(f"{where} is larger than {_CONFIG_MAX_BYTES >> 20} MB: "
                         "not a config file.")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{where} is not UTF-8 text (byte 0x{raw[error.start]:02x} at offset "
            f"{error.start}): expected a JSON file.") from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as error:
        detail = (f"{error.msg} at line {error.lineno} column {error.colno}"
                  if isinstance(error, json.JSONDecodeError) else str(error))
        raise ValueError(f"{where} is not valid JSON: {detail}.") from None
    shape = ('a model config {"num_layers": ..., ...}, or sections '
             '{"model": {...}, "train": {...}, "eval": {...}}')
    if not isinstance(data, dict):
        kind = {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
            type(data), "number")
        raise ValueError(f"{where} holds a JSON {kind}; expected an object: {shape}.")
    model_keys = [f.name for f in dataclasses.fields(TransformerXLConfig)]
    if "class_name" in data and "config" in data:
        # A keras-hub preset's config.json (WORKDIR/model/config.json): its
        # backbone's fields, as a model folder is read.
        from keras_txl.folders import preset_fields

        data = preset_fields(data, where)
    if not set(data) & set(CONFIG_SECTIONS):
        _unknown_keys(f'{where} (read as a model config: it has no "model" section)',
                      "model config key(s)", data, model_keys)
        return dict(data), {}, {}
    _unknown_keys(where, "section(s)", data, CONFIG_SECTIONS)
    if "model" not in data:
        raise ValueError(
            f'{where} has the section(s) {sorted(data)} but no "model" section: '
            f"expected {shape}.")
    for name in data:
        if not isinstance(data[name], dict):
            raise ValueError(f'{where}: the "{name}" section must be a JSON object. '
                             f"Received: {data[name]!r}.")
    _unknown_keys(where, 'key(s) in "model"', data["model"], model_keys)
    _unknown_keys(where, 'key(s) in "train"', data.get("train", {}),
                  [f.name for f in dataclasses.fields(TrainConfig)])
    _unknown_keys(where, 'key(s) in "eval"', data.get("eval", {}), EVAL_DEFAULTS)
    _check_eval_section(where, data.get("eval", {}))
    return dict(data["model"]), dict(data.get("train", {})), dict(data.get("eval", {}))


def resolve_configs(preset=None, config_path=None, overrides=(), flags=None):
    """Builds (model dict, TrainConfig, eval settings, explicit model keys).

    Order: preset (or a --config file: a model config, or sections
    "model"/"train"/"eval", see `read_config_file`), then `--set
    key=value` overrides (a key may be prefixed `model.`, `train.` or
    `eval.`; unprefixed keys go to whichever config has them), then the
    plain flags.
    """
    model, train, evaluation = {}, {}, {}
    from_preset = False
    if preset and config_path:
        # One would be dropped in silence (the file's model, with the
        # default training settings, not the preset's).
        raise ValueError(
            f"--preset {preset!r} and --config {config_path!r} both give the whole "
            "configuration: pass one (change single values with --set key=value)."
        )
    if config_path:
        model, train, evaluation = read_config_file(config_path)
    elif preset:
        if preset not in PRESETS:
            raise ValueError(f"Unknown preset {preset!r}. Available: {sorted(PRESETS)}.")
        model = dict(PRESETS[preset]["model"])
        train = dict(PRESETS[preset]["train"])
        evaluation = dict(PRESETS[preset]["eval"])
        from_preset = True
    else:
        raise ValueError("Give --preset NAME or --config FILE.json.")
    # Train settings asked for (the --config file's, --set, flags), not a
    # preset's or the defaults.
    chosen = set() if from_preset else set(train)
    model_fields = {f.name: (model.get(f.name, f.default)
                             if f.default is not dataclasses.MISSING else model.get(f.name, 0))
                    for f in dataclasses.fields(TransformerXLConfig)}
    train_fields = {**TrainConfig().to_dict(), **train}
    eval_fields = {**EVAL_DEFAULTS, **evaluation}
    explicit = set()
    for text in overrides:
        key, equals, raw = text.partition("=")
        key = key.strip()
        scope, _, name = key.rpartition(".")
        if not equals or not name:
            raise ValueError(
                f"--set takes KEY=VALUE (e.g. --set dropout=0.2, --set "
                f"eval.memory_length=640), received {text!r}.")
        targets = {"model": (model_fields, model), "train": (train_fields, train),
                   "eval": (eval_fields, evaluation)}
        if scope:
            if scope not in targets:
                raise ValueError(f"--set {key}: prefix must be model., train. or eval.")
            fields, target = targets[scope]
        elif name in model_fields:
            fields, target = model_fields, model
        elif name in train_fields:
            fields, target = train_fields, train
        else:
            raise ValueError(
                f"Unknown key {name!r} in --set. Model keys: {sorted(model_fields)}; "
                f"train keys: {sorted(train_fields)}."
            )
        key, value = parse_override(f"{name}={raw}", fields)
        target[key] = value
        fields[key] = value
        if target is model:
            explicit.add(key)
        elif target is train:
            explicit.add(f"train.{key}")
            chosen.add(key)
    for name, value in (flags or {}).items():
        if value is None:
            continue
        if name in ("segment_length", "memory_length"):
            model[name] = value
            explicit.add(name)
        elif name in ("batch_size", "steps", "strategy", "loop", "jit_compile",
                      "precision", "learning_rate", "log_every", "checkpoint_every",
                      "eval_every"):
            train[name] = value
            chosen.add(name)
    # The final evaluation's settings, checked before any step is trained
    # (a bad one failed after the last step, --set ones were not checked).
    _check_eval_section("the eval settings (--config \"eval\", --set eval.*)",
                        evaluation)
    model.setdefault("vocabulary_size", 256)
    steps = train.get("steps", TrainConfig.steps)
    warmup = train.get("warmup_steps", 0)
    if from_preset and "train.warmup_steps" not in explicit and warmup > steps:
        # A short run of a preset: scale its warm-up rather than refuse.
        train["warmup_steps"] = steps // 10
        logger.info(
            "The preset's warmup_steps=%d exceeds steps=%d: using "
            "warmup_steps=%d (a tenth of the run, rounded down; pass --set "
            "warmup_steps=N to choose).", warmup, steps, train["warmup_steps"],
        )
    train_config = TrainConfig.from_dict(train)
    check_model_settings(model, explicit)
    for name, what in (("eval_every", "no validation runs before the final one"),
                       ("checkpoint_every", "no checkpoint is written before the last one")):
        value = getattr(train_config, name)
        if name in chosen and value > train_config.steps:
            # Harmless, but not what was asked for: said, not refused.
            logger.warning(
                "%s=%d is larger than steps=%d: %s (at step %d). Pass --set %s=N with "
                "N <= %d to have them during the run.", name, value, train_config.steps,
                what, train_config.steps, name, train_config.steps)
    return model, train_config, evaluation, explicit


def check_model_settings(model, explicit):
    """The model settings' types and ranges, checked before the data is
    prepared (a bad one failed only after the corpus was tokenized and
    encoded into the workdir). The vocabulary size is the tokenizer's
    unless set, so cutoffs are checked against it once it is known
    (`match_vocabulary`); here only against a set one."""
    probe = dict(model)
    if "vocabulary_size" not in explicit:
        cutoffs = probe.get("cutoffs") or ()
        try:
            top = max((int(c) for c in cutoffs), default=0) + 1
        except (TypeError, ValueError):
            top = 0  # the config names the bad cutoffs
        probe["vocabulary_size"] = max(top, 256)
    TransformerXLConfig.from_dict(probe)


# What decides the shards besides the source and the tokenizer: changing
# one of these starts them over. (How text is read from the corpus's bytes has
# its own version, `corpora.TEXT_RULES`: see `_prepare_data`.)
DATA_FORMAT = "keras-txl-data/2"
# A split's shards encoded again to compare them with the shards of an older
# TEXT_RULES (`_prepare_data`), in WORKDIR/data/.
_RULES_CHECK = ".text-rules-check"


def _read_meta(meta_path):
    if not os.path.lexists(meta_path):
        return None
    why = None
    try:
        with open(meta_path) as f:
            meta = json.load(f)
        if not isinstance(meta, dict):
            why = f"a JSON {type(meta).__name__}, not an object"
    except ValueError as e:
        why = f"not valid JSON ({e})"
    except OSError as e:
        why = f"not a readable file ({e.strerror})"
    if why:
        raise ValueError(f"{meta_path} is {why}; delete it and the data folder to "
                         "prepare the data again.")
    return meta


def _verified(folder):
    """The finished shards of `folder`, each checked against its sha256 in
    the index (a bit flipped since they were written is an error, not a
    silently wrong token): streamed, about 1 s per GB."""
    from keras_txl.training import shards

    tokens = shards.ShardedTokens(folder)
    tokens.verify()
    return tokens


def _where(source):
    return source if source.startswith("tfds:") else os.path.abspath(source)


def _finished(meta, data_cache):
    """True once the workdir's preparation has finished (every split written),
    in this run or any before it: a tokenizer and shards that may have been
    trained on."""
    if meta.get("finished"):
        return True
    from keras_txl.training import shards

    return meta.get("key") is not None and all(
        shards.is_complete(os.path.join(data_cache, s), meta["key"]) for s in SPLITS)


def _check_source(workdir, meta, corpus_source, data_cache, stat):
    """Compares `--data` with what the workdir's data was made from.

    Returns the content sha256, or None when the content differs but the
    workdir's preparation never finished and built its own tokenizer: that
    tokenizer and the partial shards came from a corpus no run could train
    on (e.g. a preparation that stopped at an empty or broken split), so the
    caller prepares again rather than refusing the corrected corpus.
    Refuses other content otherwise. The quick check compares `stat`
    (size, mtime, ctime and inode of every file): a ctime or inode that
    changed (an edit with its mtime set back, a moved or copied corpus)
    falls to the content."""
    from keras_txl.training.corpora import TEXT_RULES

    identity = corpus_source.identity()
    if meta.get("stat") == stat and meta.get("identity") == identity:
        return meta.get("sha256")
    logger.info("%s: files changed (size, times or inode) since %s; comparing contents",
                corpus_source.source, data_cache)
    sha = corpus_source.content_sha256()
    if sha == meta.get("sha256") and meta.get("identity") == identity:
        return sha
    if meta.get("built_tokenizer") and not _finished(meta, data_cache):
        logger.warning("%s holds an unfinished preparation from other content (%s): "
                       "preparing --data %s from the start.", data_cache,
                       meta.get("source"), corpus_source.source)
        return None
    where = _where(corpus_source.source)
    old_rules = meta.get("text_rules", 1)
    old_layout = (meta.get("identity") or {}).get("layout")
    if (sha == meta.get("sha256") and old_rules != TEXT_RULES
            and old_layout != identity.get("layout")):
        # The same bytes, read as another layout by this version's text
        # rules (a symbol file starting with a byte order mark): not other
        # content, and no recheck can keep shards of another layout.
        raise ValueError(_rules_refusal_message(
            workdir, data_cache, os.path.join(workdir, "tokenizer"), old_rules, None,
            corpus_source.source, layouts=(old_layout, identity.get("layout"))))
    reading = _reading_flags(meta.get("identity"), identity, sha == meta.get("sha256"))
    if reading is not None:
        # The same corpus read another way (by a flag): not other content.
        was, now = reading
        raise ValueError(
            f"{workdir} was prepared from {meta.get('source')!r} read with {was}; this "
            f"run reads --data {where!r} with {now}. Its tokenizer and prepared shards "
            f"belong to that reading, and so do the checkpoints and model trained on "
            f"them: pass {was} (or leave the flag out if it was the default), or train "
            "in a new --workdir.")
    raise ValueError(
        f"{workdir} was prepared from {meta.get('source')!r}; --data "
        f"{where!r} has different content. Its tokenizer and prepared shards belong to "
        f"the old corpus, and so do the checkpoints and model trained on them: train "
        f"in a new --workdir (or, to start this one over, delete {data_cache}, "
        f"{os.path.join(workdir, 'tokenizer')} and its checkpoints/ and model/)."
    )


def _reading_flags(old, new, same_bytes):
    """(the flags the workdir's corpus was read with, this run's) when the
    identities differ only in what `--char-symbols` (on the same bytes,
    `same_bytes`), `--tfds-text-feature` and `--tfds-split` set, else None
    (a TFDS dataset read with other flags gives other content)."""
    if not isinstance(old, dict) or old == new:
        return None
    keys = {k for k in {*old, *new} if old.get(k) != new.get(k)}
    if "char_symbols" in keys:
        if not same_bytes:
            return None  # other files as well
        keys.discard("layout")  # splits <-> char-symbols: the flag's doing
    if not keys or not keys <= {"char_symbols", "feature", "splits"}:
        return None

    def flags(identity):
        words = []
        for key in sorted(keys):
            value = identity.get(key)
            if key == "char_symbols":
                words.append(f"--char-symbols {'yes' if value else 'no'}")
            elif key == "feature":
                words.append(f"--tfds-text-feature {value}")
            elif isinstance(value, dict):
                words += [f"--tfds-split {k}={v}" for k, v in sorted(value.items())]
        return " ".join(words)

    return flags(old), flags(new)


def _discard_unfinished(data_cache, tokenizer_dir):
    """Removes what an unfinished preparation wrote: its shards, its
    source.json and the tokenizer it built."""
    import shutil

    for split in SPLITS:
        shutil.rmtree(os.path.join(data_cache, split), ignore_errors=True)
        old = os.path.join(data_cache, f"{split}.npy")
        if os.path.exists(old):
            os.remove(old)
    shutil.rmtree(os.path.join(data_cache, _RULES_CHECK), ignore_errors=True)
    shutil.rmtree(tokenizer_dir, ignore_errors=True)
    meta_path = os.path.join(data_cache, "source.json")
    if os.path.exists(meta_path):
        os.remove(meta_path)


def _check_text(corpus_source, source):
    """Refuses a split with no text (empty, or whitespace only) before any
    work is done: reads each split up to its first chunk with a word in it."""
    origins = None
    for split in SPLITS:
        if any(not text.isspace() for text, _ in corpus_source.chunks(split, kind="byte")
               if text):
            continue
        origins = origins or corpus_source.split_origins()
        raise ValueError(
            f"the {split} split of --data {source} is empty: {origins[split]} holds no "
            "text (nothing, or only whitespace). Every split needs some text.")


def _save_tokenizer_atomically(tokenizer, tokenizer_dir):
    import shutil
    import tempfile

    parent = os.path.dirname(os.path.abspath(tokenizer_dir)) or "."
    os.makedirs(parent, exist_ok=True)
    for name in os.listdir(parent):  # left by a run killed while saving
        if name.startswith(".tokenizer-"):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    tmp = tempfile.mkdtemp(prefix=".tokenizer-", dir=parent)
    os.chmod(tmp, default_mode(directory=True))
    tokenizer.save(tmp)
    if os.path.isdir(tokenizer_dir):  # an unfinished one (no tokenizer.json)
        shutil.rmtree(tokenizer_dir)
    os.replace(tmp, tokenizer_dir)


# A tokenizer option and the `txl prepare`/`train` flag that sets it.
_OPTION_FLAGS = {"max_size": "--vocab-size", "vocabulary_size": "--vocab-size",
                 "min_freq": "--min-freq", "lower_case": "--lower-case",
                 "vocabulary_file": "--vocabulary-file"}


def _as_flags(kind, options):
    """Tokenizer `kind` and `options` as the flags that ask for them
    (options with no flag, e.g. a corpus's own `double_eos`, as
    `name=value`)."""
    words = [f"--tokenizer {kind}"] if kind else []
    for name, value in sorted(options.items()):
        flag = _OPTION_FLAGS.get(name)
        if flag == "--lower-case":
            words.append(flag if value else "no --lower-case")
        elif flag:
            words.append(f"{flag} {value}")
        else:
            words.append(f"{name}={value!r}")
    return " ".join(words)


def _check_tokenizer_options(workdir, meta, kind, options, built_kind=None):
    """Explicit options (--vocab-size, --min-freq, ...) that contradict the
    ones the workdir's tokenizer was built with are an error, said in
    flags; so are any options where the workdir does not record how its
    tokenizer was built (no `data/source.json` of this version): they could
    not be applied, and recording them would say they were."""
    if not options:
        return
    built = (meta.get("tokenizer") if isinstance(meta, dict) else None) or {}
    if not built:
        raise ValueError(
            f"{workdir} already has a tokenizer ({os.path.join(workdir, 'tokenizer')}) "
            f"but no record of the options it was built with "
            f"({os.path.join(workdir, 'data', 'source.json')} is missing or of an older "
            f"version); this run asks for {_as_flags(kind, options)}, which cannot be "
            "applied to it: run without these flags, use a new --workdir, or delete "
            f"{os.path.join(workdir, 'tokenizer')} and {os.path.join(workdir, 'data')} "
            "to build them again."
        )
    old = built.get("options", {})
    old_kind = built.get("kind") or built_kind
    differ = {k: v for k, v in options.items() if old.get(k) != v}
    if differ or (kind and old_kind not in (None, kind)):
        had = _as_flags(old_kind, old)
        if not old:
            had += (" and no vocabulary flag (no --vocab-size, --min-freq, "
                    "--lower-case or --vocabulary-file)")
        raise ValueError(
            f"{workdir}'s tokenizer was built with {had}; this run asks for "
            f"{_as_flags(kind, options)}. Its shards belong to that tokenizer: "
            "run without these flags (or with the ones it was built with), use a "
            f"new --workdir, or delete {os.path.join(workdir, 'tokenizer')} and "
            f"{os.path.join(workdir, 'data')} to build them again."
        )


def _check_vocabulary_file(workdir, meta):
    """The vocabulary file the workdir's tokenizer was built from (a
    --vocabulary-file, or a corpus's own such as LM1B's 1b_word_vocab.txt)
    must hold what it held then: the tokenizer and its shards have the old
    vocabulary."""
    built = (meta.get("tokenizer") if isinstance(meta, dict) else None) or {}
    path = (built.get("options") or {}).get("vocabulary_file")
    recorded = built.get("vocabulary_file_sha256")
    if path and recorded and os.path.isfile(path) and sha256_tree(path) != recorded:
        raise ValueError(
            f"The vocabulary file {path} changed since {workdir}'s tokenizer was built "
            "from it: the tokenizer and its shards hold the old vocabulary. Restore the "
            f"file, use a new --workdir, or delete {os.path.join(workdir, 'tokenizer')} "
            f"and {os.path.join(workdir, 'data')} to build them again."
        )


def _tokenizer_record(kind, options):
    """What source.json records of how the tokenizer was built: its kind,
    its options and the sha256 of a vocabulary file among them."""
    record = {"kind": kind, "options": options}
    if options.get("vocabulary_file") and os.path.isfile(options["vocabulary_file"]):
        record["vocabulary_file_sha256"] = sha256_tree(options["vocabulary_file"])
    return record


def _build_tokenizer(build, kind, corpus_source, options):
    """`build(kind, texts, **options)` on the vocabulary splits; a counted
    vocabulary left with only its special tokens (every word `<unk>`: a
    --min-freq above every count) is refused, naming --min-freq and the
    counts."""
    from keras_txl.training.vocab import EOS_TOKEN
    from keras_txl.training.vocab import UNK_TOKEN

    def texts():
        return (text for split in corpus_source.vocabulary_splits
                for text, _ in corpus_source.chunks(
                    split, kind=kind, double_eos=bool(options.get("double_eos", False))))

    counted = kind in ("word", "char") and not options.get("vocabulary_file")
    specials = [options.get("unk_token", UNK_TOKEN)]
    if kind == "word" and options.get("add_eos", True):
        specials.insert(0, options.get("eos_token", EOS_TOKEN))
    try:
        tokenizer = build(kind, texts(), **options)
    except Exception:
        # A char vocabulary of <unk> alone fails in the tokenizer's lookup
        # table: say why when a --min-freq above every count is the cause.
        message = (_specials_only(kind, texts(), options, specials, corpus_source,
                                  min_freq_only=True)
                   if counted and options.get("min_freq", 1) > 1 else None)
        if message is None:
            raise
        raise ValueError(message) from None
    if counted and set(tokenizer.vocabulary) <= set(specials):
        message = _specials_only(kind, texts(), options, specials, corpus_source)
        raise ValueError(message or (
            f"the {kind} vocabulary holds only the special tokens {specials}: every "
            f"{kind} of the text would be {specials[-1]}."))
    return tokenizer


def _specials_only(kind, texts, options, specials, corpus_source, min_freq_only=False):
    """Why a counted vocabulary kept nothing but `specials` (a second pass
    over the text: only on this error), or None when --min-freq is not
    the cause (and, with `min_freq_only`, when the text holds no token)."""
    from keras_txl.training.vocab import count_tokens

    what = "word" if kind == "word" else "character"
    splits = "+".join(corpus_source.vocabulary_splits)
    extra = {"lower_case": bool(options.get("lower_case"))} if kind == "word" else {}
    counts = {token: n for token, n in count_tokens(kind, texts, **extra).items()
              if token not in specials}
    min_freq = options.get("min_freq", 1)
    if not counts:
        if min_freq_only:
            return None
        return (f"the {splits} text holds no {what} besides the special tokens "
                f"{specials}: a vocabulary of those alone reads every {what} as "
                f"{specials[-1]}.")
    top_token, top = max(counts.items(), key=lambda item: item[1])
    if top >= min_freq:
        return None
    return (f"--min-freq {min_freq} keeps no {what}: the most frequent {what} of the "
            f"{splits} text, {top_token!r}, occurs {top} times ({len(counts)} distinct "
            f"{what}s, {sum(counts.values())} in all), so the vocabulary would hold only "
            f"the special tokens {specials} and read every {what} as {specials[-1]}. "
            f"Pass --min-freq {top} or less.")


def tfds_options(args):
    """`--tfds-text-feature`, `--tfds-split SPLIT=TFDS_SPLIT` and
    `--char-symbols yes|no` as the `text_feature`/`split_names`/
    `char_symbols` arguments of `open_corpus_source` (only those given)."""
    out = {}
    feature = getattr(args, "tfds_text_feature", None)
    if feature is not None:
        out["text_feature"] = feature
    pairs = getattr(args, "tfds_split", None) or []
    names = {}
    for pair in pairs:
        split, sep, name = pair.partition("=")
        split, name = split.strip(), name.strip()
        if not sep or split not in SPLITS or not name:
            raise ValueError(
                f"--tfds-split takes SPLIT=TFDS_SPLIT with SPLIT one of {list(SPLITS)} "
                f"(e.g. valid=train[-2%:]). Received: {pair!r}.")
        if split in names and names[split] != name:
            raise ValueError(f"--tfds-split gives {split} twice: {names[split]!r} and "
                             f"{name!r}.")
        names[split] = name
    if names:
        out["split_names"] = names
    data = getattr(args, "data", None)
    symbols = getattr(args, "char_symbols", "auto") or "auto"
    if symbols != "auto":
        if str(data or "").startswith("tfds:") or not data:
            raise ValueError(
                f"--char-symbols {symbols} applies to a --data folder of train.txt/"
                f"valid.txt/test.txt ({f'--data {data!r} is not one' if data else 'there is no --data'}): "
                "leave it out.")
        # The symbol-file detection, overridden (`open_corpus_source`'s
        # `char_symbols`): a folder or file of another layout refuses it.
        symbols_option = {"char_symbols": symbols == "yes"}
    else:
        symbols_option = {}
    if not str(data or "").startswith("tfds:"):
        # Given with a folder or a file, these would be ignored in silence.
        given = sorted({"text_feature": "--tfds-text-feature",
                        "split_names": "--tfds-split"}[k] for k in out)
        if getattr(args, "data_dir", None) is not None:
            given.append("--data-dir")
        if getattr(args, "download", False):
            given.append("--download")
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            what = f"--data {data!r} is not one" if data else "there is no --data"
            raise ValueError(f"{' and '.join(given)} {verb} to --data tfds:NAME only "
                             f"({what}): leave {'it' if len(given) == 1 else 'them'} out.")
    return {**out, **symbols_option}


def vocabulary_flags(args):
    """The tokenizer flags of `txl prepare`/`train` that were given, as a
    dict for `prepare_data(vocabulary=...)`."""
    out = {}
    for name in ("vocab_size", "min_freq", "lower_case", "vocabulary_file"):
        value = getattr(args, name, None)
        if value is not None:
            out[name] = value
    if "vocabulary_file" in out:
        out["vocabulary_file"] = os.path.abspath(out["vocabulary_file"])
    return out


def _kind_options(kind, flags):
    """`--vocab-size` & co. as the options of tokenizer `kind`."""
    flags = dict(flags)
    if not flags:
        return {}
    if kind == "byte":
        raise ValueError(
            f"--tokenizer byte has a fixed vocabulary of 256: it takes none of "
            f"{sorted('--' + k.replace('_', '-') for k in flags)}.")
    options = {}
    size = flags.pop("vocab_size", None)
    for name in ("vocab_size", "min_freq"):
        value = size if name == "vocab_size" else flags.get(name)
        if value is not None and (isinstance(value, bool) or value < 1):
            raise ValueError(f"--{name.replace('_', '-')} must be a positive "
                             f"integer. Received: {value!r}.")
    if kind in ("word", "char"):
        if size is not None:
            options["max_size"] = size
        if "min_freq" in flags:
            options["min_freq"] = flags.pop("min_freq")
        if "lower_case" in flags:
            if kind == "char":
                raise ValueError("--lower-case applies to word and wordpiece tokenizers, "
                                 "not char.")
            options["lower_case"] = flags.pop("lower_case")
        if "vocabulary_file" in flags:
            counted = [flag for flag, given in (("--vocab-size", size is not None),
                                                ("--min-freq", "min_freq" in options))
                       if given]
            if counted:
                raise ValueError(
                    f"--vocabulary-file gives the vocabulary; {' and '.join(counted)} "
                    "would size a counted one and cannot apply to it: pass one or "
                    "the other.")
            path = flags.pop("vocabulary_file")
            if not os.path.isfile(path):
                raise ValueError(f"--vocabulary-file {path!r} does not exist.")
            options["vocabulary_file"] = path
    else:  # sentencepiece, wordpiece
        if size is not None:
            options["vocabulary_size"] = size
        if kind == "wordpiece" and "lower_case" in flags:
            options["lower_case"] = flags.pop("lower_case")
    if flags:
        raise ValueError(
            f"--tokenizer {kind} does not take "
            f"{', '.join('--' + k.replace('_', '-') for k in sorted(flags))}.")
    return options


def prepare_main(args):
    """`txl prepare`: the tokenizer and the shards, nothing else. Prints a
    JSON line; returns 0."""
    if not args.data:
        raise ValueError("txl prepare needs --data (the corpus to prepare).")
    writable_workdir(args.workdir)
    with WorkdirLock(args.workdir, command="txl prepare"):
        tokenizer, splits = _prepare_data(
            args.data, args.workdir, args.tokenizer, args.data_dir, args.download,
            vocabulary=vocabulary_flags(args), shard_tokens=args.shard_tokens,
            tfds=tfds_options(args), cli_flags=True)

    print(json.dumps({
        "workdir": args.workdir, "tokenizer": tokenizer.get_config().get("kind"),
        "vocabulary_size": tokenizer.vocabulary_size(),
        "splits": {s: {"tokens": len(t), "shards": len(t.index["shards"])}
                   for s, t in splits.items()}}))
    return 0


# The keys of `prepare_data(tfds=...)`: the arguments of `open_corpus_source`
# that `tfds_options` gives from the flags.
_TFDS_KEYS = ("text_feature", "split_names", "char_symbols")


def prepare_data(source, workdir, tokenizer_kind=None, data_dir=None, download=False,
                 write=True, tokenizer_options=None, shard_tokens=None,
                 after_shard=None, vocabulary=None, tfds=None):
    """Prepares (or reuses) the workdir's tokenizer and token shards.

    Holds the workdir's lock (`WorkdirLock`, `train.lock`, as `txl prepare`
    and `txl train` do) while it writes there: a second preparation of the
    same workdir, from this API or the CLI, is refused naming the one
    holding it, instead of both writing the same `source.json`, tokenizer
    and `progress.json` (their shards would interleave). Nothing is locked
    when nothing is written (`write=False`, or no `source`).

    The corpus is streamed in chunks: the vocabulary is counted and each
    split is encoded into `WORKDIR/data/{split}/` shards in bounded memory
    (`training/shards.py`); a killed preparation resumes where it stopped.
    `WORKDIR/data/source.json` keys the shards: the source (path; size,
    mtime, ctime and inode; the content sha256), the tokenizer's kind, options and
    files' sha256, and the version of the text rules (`corpora.TEXT_RULES`:
    shards of older rules are encoded again and kept only if the tokens are
    the same). A different `--data` (by content) or a changed
    tokenizer is refused with a message, unless the workdir's preparation
    never finished (see `_check_source`). A split with no text is refused
    before anything is written.

    Args:
        source: str or None. `--data`; None reuses the prepared shards.
        workdir: str. The run folder.
        tokenizer_kind: str or None. None: the corpus's own kind.
        data_dir, download: TFDS options (see `load_corpus`).
        tfds: dict or None. More TFDS options: `text_feature`,
            `split_names` (see `load_corpus`; `tfds_options(args)`), and
            `char_symbols` for a folder of symbol files; other keys are a
            ValueError.
        write: bool. False for a non-chief worker: nothing is written in
            the workdir; shards missing there are prepared in a private
            temporary folder.
        tokenizer_options: dict or None. Options of the tokenizer
            (`max_size`, `min_freq`, `vocabulary_size`, `lower_case`,
            `vocabulary_file`, ...).
        vocabulary: dict or None. The CLI's flags (`vocab_size`,
            `min_freq`, `lower_case`, `vocabulary_file`), mapped to the
            options of the tokenizer kind.
        shard_tokens: int or None. Tokens per shard (default
            `shards.DEFAULT_SHARD_TOKENS`).
        after_shard: callable or None. Called after every shard is
            recorded (tests).

    Returns:
        `(tokenizer, {split: ShardedTokens})` (or int32 arrays for an old
        workdir holding only `data/{split}.npy` and no --data).
    """
    if tfds is not None:
        if not isinstance(tfds, dict):
            raise ValueError("`tfds` must be a dict of `text_feature`, `split_names` and "
                             f"`char_symbols`, or None. Received type {type(tfds).__name__}.")
        unknown = sorted(set(tfds) - set(_TFDS_KEYS), key=str)
        if unknown:
            raise ValueError(f"`tfds` takes the keys {sorted(_TFDS_KEYS)}. Received unknown "
                             f"key(s) {unknown}.")
    arguments = dict(tokenizer_kind=tokenizer_kind, data_dir=data_dir, download=download,
                     write=write, tokenizer_options=tokenizer_options,
                     shard_tokens=shard_tokens, after_shard=after_shard,
                     vocabulary=vocabulary, tfds=tfds)
    if not write or source is None:
        return _prepare_data(source, workdir, **arguments)
    os.makedirs(workdir, exist_ok=True)
    with WorkdirLock(workdir, command="prepare_data"):
        return _prepare_data(source, workdir, **arguments)


def _prepare_data(source, workdir, tokenizer_kind=None, data_dir=None, download=False,
                  write=True, tokenizer_options=None, shard_tokens=None,
                  after_shard=None, vocabulary=None, tfds=None, cli_flags=False):
    """`prepare_data` in a workdir whose lock the caller holds (or that it
    does not write). `cli_flags`: the TFDS errors name the flags of `txl`
    (True) rather than the arguments of `prepare_data`.
    """
    from keras_txl.tokenizers import load_tokenizer
    from keras_txl.training import shards
    from keras_txl.training.corpora import TEXT_RULES
    from keras_txl.training.corpora import open_corpus_source
    from keras_txl.training.corpora import unknown_token_if_cut
    from keras_txl.training.vocab import build_streaming_tokenizer

    # The flag from `txl`, the argument from the Python API.
    named, given = (("--shard-tokens", f"{shard_tokens!r}") if cli_flags
                    else ("`shard_tokens`", f"shard_tokens={shard_tokens!r}"))
    if shard_tokens is not None and (isinstance(shard_tokens, bool)
                                     or not isinstance(shard_tokens, int) or shard_tokens < 1):
        raise ValueError(
            f"{named} must be a positive integer (tokens per shard file). "
            f"Received: {given}.")
    if shard_tokens is not None and shard_tokens < shards.MIN_SHARD_TOKENS:
        raise ValueError(
            f"{named} must be at least {shards.MIN_SHARD_TOKENS} (tokens per "
            f"shard file; each shard is a file written and fsynced on its own). "
            f"Received: {given}. The default is {shards.DEFAULT_SHARD_TOKENS}.")
    tokenizer_options = dict(tokenizer_options or {})
    tokenizer_dir = os.path.join(workdir, "tokenizer")
    data_cache = os.path.join(workdir, "data")
    meta_path = os.path.join(data_cache, "source.json")
    meta = _read_meta(meta_path)
    if meta is not None and meta.get("format") != DATA_FORMAT:
        meta = None  # an older workdir's cache: prepared again below
    # Shards encoded under older text rules (no "text_rules": version 1): the
    # same corpus may give other tokens now.
    old_rules = None
    if meta is not None and meta.get("text_rules", 1) != TEXT_RULES:
        old_rules = meta.get("text_rules", 1)
    recheck = False  # encode again beside them and compare (below)
    refused_splits = None  # a recorded refusal of that comparison that applies
    corpus_source = sha = stat = None
    use_workdir_tokenizer = True
    if source is not None:
        if not source.startswith("tfds:") and not os.path.exists(source):
            hint = ""
            if any(c in source for c in "*?["):
                # No shell expanded it (quoted, or nothing matched); a glob
                # is not a corpus layout this reads.
                hint = (" It is not expanded as a pattern: pass the folder that holds "
                        "the corpus's train/valid/test files, or one text file.")
            raise ValueError(f"--data {source!r}: the corpus path does not exist.{hint}")
        corpus_source = open_corpus_source(
            source, data_dir=data_dir, download=download,
            cli_flags=True if cli_flags else "prepare_data", **(tfds or {}))
        logger.info("Corpus: %r", corpus_source)
        # Before anything is written: a split with no text would otherwise
        # fail only after the tokenizer and the train shards.
        _check_text(corpus_source, source)
        # Taken before the content is hashed: an edit during the hashing
        # changes it, and the next run compares the content again.
        stat = corpus_source.stat_key()
        if meta is not None:
            sha = _check_source(workdir, meta, corpus_source, data_cache, stat)
            if sha is not None and old_rules is not None:
                if _finished(meta, data_cache):
                    # Shards that may have been trained on: kept if the
                    # current rules give the same tokens, else refused.
                    refused = meta.get("text_rules_refused")
                    if (isinstance(refused, dict) and refused.get("key")
                            == _rules_refusal_key(meta, sha, corpus_source, tokenizer_dir)):
                        # Compared before, by a run of these rules, from
                        # this content, with this tokenizer: refused again
                        # without encoding it (after the tokenizer checks
                        # below, which say other flags first).
                        refused_splits = refused.get("splits") or []
                    recheck = write
                    logger.warning(
                        "%s was encoded under the text rules of an older keras-txl "
                        "(version %s, now %s): encoding --data %s again to compare.",
                        data_cache, old_rules, TEXT_RULES, source)
                elif meta.get("built_tokenizer"):
                    logger.warning(
                        "%s holds an unfinished preparation under the text rules of an "
                        "older keras-txl (version %s, now %s): preparing --data %s from "
                        "the start.", data_cache, old_rules, TEXT_RULES, source)
                    sha = None  # as an unfinished preparation of other content
            if sha is None:  # an unfinished preparation from other content
                if write:
                    _discard_unfinished(data_cache, tokenizer_dir)
                else:
                    use_workdir_tokenizer = False
                meta = None
    tokenizer = None
    if use_workdir_tokenizer and os.path.exists(os.path.join(tokenizer_dir, "tokenizer.json")):
        tokenizer = load_tokenizer(tokenizer_dir)
        kind = tokenizer.get_config().get("kind", tokenizer_kind)
        if tokenizer_kind and kind != tokenizer_kind:
            raise ValueError(
                f"{workdir} already has a {kind} tokenizer; "
                f"--tokenizer {tokenizer_kind} does not match it (use a new workdir)."
            )
        _check_tokenizer_options(
            workdir, meta, tokenizer_kind,
            {**tokenizer_options, **_kind_options(kind, vocabulary or {})}, kind)
        _check_vocabulary_file(workdir, meta)
        if (meta is not None and meta.get("tokenizer_sha256") is not None
                and meta["tokenizer_sha256"] != sha256_tree(tokenizer_dir)):
            raise ValueError(
                f"{tokenizer_dir} changed since {data_cache} was encoded with it: "
                "delete the data folder to re-encode, or restore the tokenizer."
            )
    elif (use_workdir_tokenizer and source is not None and meta is not None
          and meta.get("tokenizer_sha256") and _finished(meta, data_cache)):
        # Deleted after a finished preparation: building another one would
        # replace every shard (and the tokens checkpoints were trained on).
        raise ValueError(
            f"{tokenizer_dir} is missing, but {data_cache} was encoded with the "
            "tokenizer that was there: restore it (the shards, and the checkpoints "
            f"and model trained on them, belong to it), or delete {data_cache} too to "
            "prepare again with a new one.")
    if refused_splits is not None:
        raise ValueError(_rules_refusal_message(
            workdir, data_cache, tokenizer_dir, old_rules, refused_splits, source))
    if source is None:
        if old_rules is not None and tokenizer is not None:
            raise ValueError(
                f"{workdir}'s shards were encoded under the text rules of an older "
                f"keras-txl (version {old_rules}; this one reads text by version "
                f"{TEXT_RULES}), so they may hold other tokens than this version encodes "
                f"from the same corpus. Pass --data {meta.get('source')} (the corpus "
                "they were prepared from) once: they are encoded again and kept if the "
                "tokens are the same, else the run says what to do.")
        if meta is not None and tokenizer is not None and all(
                shards.is_complete(os.path.join(data_cache, s), meta["key"]) for s in SPLITS):
            recorded = meta.get("shard_tokens")
            if shard_tokens is not None and shard_tokens != recorded:
                # Cutting the shards again reads the corpus: without it the
                # flag was dropped in silence.
                raise ValueError(
                    f"{named} {shard_tokens}: {data_cache}'s shards hold {recorded} tokens "
                    f"each, and cutting them again encodes the corpus: pass --data "
                    f"{meta.get('source')} (the corpus they were prepared from) with it, "
                    f"or leave {named} out.")
            logger.info("No --data: using the shards prepared from %s.", meta.get("source"))
            return tokenizer, {s: _verified(os.path.join(data_cache, s)) for s in SPLITS}
        cached = [os.path.join(data_cache, f"{s}.npy") for s in SPLITS]
        if tokenizer is not None and all(os.path.exists(p) for p in cached):
            logger.warning("%s holds token arrays of an older version and no "
                           "source.json: cannot check where they come from.", data_cache)
            return tokenizer, {s: np.load(p) for s, p in zip(SPLITS, cached)}
        missing = [] if tokenizer is not None else [f"no {tokenizer_dir}"]
        if meta is None:
            missing.append(f"no {meta_path} of this version")
        else:
            missing += [f"{os.path.join(data_cache, s)} missing or unfinished"
                        for s in SPLITS if not shards.is_complete(
                            os.path.join(data_cache, s), meta.get("key"))]
        raise ValueError(f"--data is needed: {workdir} has no complete prepared data "
                         f"({'; '.join(missing) or 'nothing prepared yet'}).")
    if meta is None and tokenizer is not None and os.path.isdir(data_cache) and write:
        logger.warning("%s has no source.json of this version: preparing its "
                       "shards again from --data %s.", data_cache, source)
    kind = tokenizer_kind or (tokenizer.get_config().get("kind") if tokenizer else None) \
        or corpus_source.tokenizer_kind
    options = dict(corpus_source.tokenizer_options) if kind == corpus_source.tokenizer_kind else {}
    asked = {**tokenizer_options, **_kind_options(kind, vocabulary or {})}
    options = unknown_token_if_cut({**options, **asked}, asked)
    if tokenizer is not None and (meta or {}).get("tokenizer"):
        # A reused tokenizer is recorded as it was built, not as asked.
        options = dict(meta["tokenizer"].get("options") or {})
    # Whether this workdir's tokenizer was built by its own preparation (and
    # may be rebuilt while that preparation is unfinished) or was there before.
    built_tokenizer = (meta or {}).get("built_tokenizer", tokenizer is None)
    if sha is None:
        sha = corpus_source.content_sha256()
        if write:  # before the tokenizer: a kill in between cannot mix corpora
            from keras_txl.io import atomic_write_bytes

            os.makedirs(data_cache, exist_ok=True)
            atomic_write_bytes(meta_path, json.dumps({
                "format": DATA_FORMAT, "text_rules": TEXT_RULES,
                "source": _where(source), "key": None,
                "stat": stat, "sha256": sha, "identity": corpus_source.identity(),
                "built_tokenizer": built_tokenizer, "finished": False,
                "tokenizer": _tokenizer_record(kind, options)}, indent=2).encode())
    private = None
    tokenizer_reused = tokenizer is not None
    if tokenizer is None:
        logger.info("Building the %s vocabulary on %s (streamed)", kind,
                    "+".join(corpus_source.vocabulary_splits))
        tokenizer = _build_tokenizer(build_streaming_tokenizer, kind, corpus_source, options)
        if write:
            _save_tokenizer_atomically(tokenizer, tokenizer_dir)
        else:
            import tempfile

            private = tempfile.mkdtemp(prefix="txl-worker-data-")
            tokenizer_dir = os.path.join(private, "tokenizer")
            tokenizer.save(tokenizer_dir)
    tokenizer_sha = sha256_tree(tokenizer_dir)
    shard_tokens = (shard_tokens or (meta or {}).get("shard_tokens")
                    or shards.DEFAULT_SHARD_TOKENS)
    size = tokenizer.vocabulary_size()
    key_fields = {"sha256": sha, "identity": corpus_source.identity(),
                  "text_rules": TEXT_RULES,
                  "tokenizer_sha256": tokenizer_sha, "shard_tokens": shard_tokens,
                  "dtype": shards.dtype_for(size)}
    key = hashlib.sha256(json.dumps(key_fields, sort_keys=True).encode()).hexdigest()
    # The same content from another path keeps the name it was prepared from.
    first_source = (meta or {}).get("source") or _where(source)
    new_meta = {"format": DATA_FORMAT, "source": first_source, "stat": stat, "key": key,
                "built_tokenizer": built_tokenizer,
                "finished": meta is not None and _finished(meta, data_cache),
                "tokenizer": ((meta or {}).get("tokenizer") if tokenizer_reused
                              else None) or _tokenizer_record(kind, options),
                **key_fields}
    target = data_cache
    if not write:
        if meta is not None and meta.get("key") == key and all(
                shards.is_complete(os.path.join(data_cache, s), key) for s in SPLITS):
            return tokenizer, {s: _verified(os.path.join(data_cache, s)) for s in SPLITS}
        import atexit
        import shutil
        import tempfile

        private = private or tempfile.mkdtemp(prefix="txl-worker-data-")
        atexit.register(shutil.rmtree, private, True)
        target = os.path.join(private, "data")
        logger.info("Non-chief worker: preparing its own copy of the shards in %s", target)
    else:
        os.makedirs(data_cache, exist_ok=True)
        # Under recheck the old record stays until the comparison is done: a
        # kill or a refusal leaves the workdir as the older version left it.
        if not recheck and (meta is None or any(meta.get(k) != new_meta[k]
                                                for k in new_meta)):
            from keras_txl.io import atomic_write_bytes

            atomic_write_bytes(meta_path, json.dumps(new_meta, indent=2).encode())
        for name in SPLITS:  # token arrays of an older version
            old = os.path.join(data_cache, f"{name}.npy")
            if os.path.exists(old):
                os.remove(old)
    # Long lines are cut only where this tokenizer gives the same ids on both sides.
    cut_for = {"kind": tokenizer.kind,
               "double_eos": bool(tokenizer.get_config().get("double_eos", False))}
    # A vocabulary not counted on this text (a --vocabulary-file, or a
    # tokenizer the workdir held before this preparation): say how much of
    # each split it reads as unknown, as `txl eval --data` does.
    foreign = options.get("vocabulary_file") or (
        tokenizer_dir if tokenizer_reused and not built_tokenizer else None)
    unk_id = tokenizer.unk_id if foreign else None
    out, encoded = {}, []
    folders = {split: os.path.join(target, _RULES_CHECK, split) if recheck
               else os.path.join(target, split) for split in SPLITS}
    for split in SPLITS:
        folder = folders[split]
        if write and os.path.isfile(os.path.join(folder, shards.INDEX)) and \
                not shards.is_complete(folder, key):
            import shutil

            shutil.rmtree(folder)  # made under another key: source.json allowed it
        if not shards.is_complete(folder, key):
            encoded.append(split)  # read from the corpus in this run
        seen = {"tokens": 0, "unknown": 0}

        def encode(text, seen=seen):
            ids = tokenizer.encode(text)
            if unk_id is not None:
                seen["tokens"] += ids.size
                seen["unknown"] += int(np.count_nonzero(ids == unk_id))
            return ids

        out[split] = shards.write_split(
            folder,
            lambda cursor, split=split: corpus_source.chunks(split, cursor, **cut_for),
            encode, key=key, dtype=shards.dtype_for(size), split=split,
            shard_tokens=shard_tokens, after_shard=after_shard)
        if seen["tokens"] and seen["unknown"] / seen["tokens"] >= UNKNOWN_WARNING_SHARE:
            logger.warning(
                "%.1f%% of the %d tokens of the %s split of --data %s are %s: the %s "
                "vocabulary of %s was not made for this text, and a model trained on "
                "these shards learns to predict %s. Check it is the right vocabulary.",
                100 * seen["unknown"] / seen["tokens"], seen["tokens"], split, source,
                tokenizer.decode([unk_id]), tokenizer.kind, foreign,
                tokenizer.decode([unk_id]))
        if not len(out[split]):
            raise ValueError(
                f"the {split} split of --data {source} is empty: it holds no "
                "tokens. Every split needs some text.")
        logger.info("%s: %d tokens in %d shards", split, len(out[split]),
                    len(out[split].index["shards"]))
    now = corpus_source.stat_key()
    if now != stat:
        # Changed while it was read (a copy still being written, a log
        # appended to): the shards encoded in this run may hold text the
        # recorded sha256 does not (shards reused from before hold the
        # recorded text; the next run compares the corpus again). A touch
        # (same content) only updates the record.
        if corpus_source.content_sha256() == sha:
            new_meta["stat"] = now
        elif encoded:
            import shutil

            for split in encoded:
                shutil.rmtree(folders[split], ignore_errors=True)
            before = {entry[0]: entry for entry in stat}
            changed = [entry[0] for entry in now if before.pop(entry[0], None) != entry]
            changed += list(before)  # removed since
            raise ValueError(
                f"--data {source} changed while it was prepared ({', '.join(changed)}): "
                "its shards could mix the old and the new text, so they were removed. "
                "Run again once the corpus no longer changes (a copy still being "
                "written?).")
    if recheck:
        out = _adopt_rechecked(workdir, data_cache, tokenizer_dir, out, old_rules, source,
                               meta, _rules_refusal_key(meta, sha, corpus_source,
                                                        tokenizer_dir))
    if write and (recheck or not new_meta["finished"] or new_meta["stat"] != stat):
        from keras_txl.io import atomic_write_bytes

        atomic_write_bytes(meta_path, json.dumps({**new_meta, "finished": True},
                                                 indent=2).encode())
    return tokenizer, out


def _rules_refusal_key(meta, sha, corpus_source, tokenizer_dir):
    """What a refused text-rules comparison is recorded under (source.json's
    `text_rules_refused`): the current rules, the corpus's content and
    identity, the older shards' key (their tokenizer and shard size), and
    the sha256 of the workdir's tokenizer files the comparison encoded with
    (None when there are none). Any of them changed, the record does not
    apply: the usual checks run (a replaced tokenizer is said as such) and
    the comparison is made again."""
    from keras_txl.training.corpora import TEXT_RULES

    tokenizer = (sha256_tree(tokenizer_dir)
                 if os.path.isfile(os.path.join(tokenizer_dir, "tokenizer.json")) else None)
    fields = {"text_rules": TEXT_RULES, "sha256": sha, "identity": corpus_source.identity(),
              "shards_key": meta.get("key"), "tokenizer_sha256": tokenizer}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _rules_refusal_message(workdir, data_cache, tokenizer_dir, old_rules, differ, source,
                           layouts=None):
    """`differ`: the splits whose tokens differ; or `layouts`, (the layout
    the workdir read the corpus as, the one this version reads)."""
    from keras_txl.training.corpora import TEXT_RULES
    from keras_txl.training.corpora import TEXT_RULES_CHANGES

    # What changed since the workdir's version (an unknown version: all of it).
    changes = [change for version, change in sorted(TEXT_RULES_CHANGES.items())
               if not isinstance(old_rules, int) or version > old_rules] \
        or list(TEXT_RULES_CHANGES.values())
    return (
        f"{workdir} was prepared by an older keras-txl, which read text by other "
        f"rules (version {old_rules}; this one reads by version {TEXT_RULES}, "
        f"where {'; and '.join(changes)}): "
        + (f"it read --data {_where(source)} as the {layouts[0]!r} layout, this one reads "
           f"it as {layouts[1]!r}, so its shards hold other tokens than this version "
           "encodes from it." if layouts else
           f"its {', '.join(differ)} shards hold other tokens than this version encodes "
           f"from --data {_where(source)}.")
        + " Its tokenizer and shards, and the "
        "checkpoints and model trained on them, belong to the old reading: train in "
        f"a new --workdir (or, to start this one over, delete {data_cache}, "
        f"{tokenizer_dir} and its checkpoints/ and model/; or keep using this "
        "workdir with the older keras-txl).")


def _adopt_rechecked(workdir, data_cache, tokenizer_dir, rechecked, old_rules, source,
                     meta, refusal_key):
    """Compares the shards encoded again under the current text rules
    (`rechecked`, in `data/.text-rules-check/`) with the finished shards of
    an older version: the same tokens replace them (the tokens key, which
    checkpoints record, is unchanged); other tokens are refused, leaving the
    old shards as they were and the older record with only the refusal
    added (`text_rules_refused`, under `refusal_key`): a later run from the
    same content is refused at once instead of encoding it all again."""
    import shutil

    from keras_txl.training import shards
    from keras_txl.training.corpora import TEXT_RULES

    check = os.path.join(data_cache, _RULES_CHECK)
    try:
        differ = []
        for split, new in rechecked.items():
            if not os.path.lexists(os.path.join(data_cache, split)):
                # Nothing to compare (deleted, or moved aside by a run killed
                # while it replaced them below): encoded as a missing split is.
                continue
            old = shards.ShardedTokens(os.path.join(data_cache, split))
            content = shards.tokens_sha256(
                old._paths, old.dtype, expected=[s["sha256"] for s in old.index["shards"]])
            if content != new.index["tokens_sha256"]:
                differ.append(split)
    except Exception:
        shutil.rmtree(check, ignore_errors=True)
        raise
    if differ:
        from keras_txl.io import atomic_write_bytes

        shutil.rmtree(check, ignore_errors=True)
        atomic_write_bytes(os.path.join(data_cache, "source.json"), json.dumps({
            **meta, "text_rules_refused": {"key": refusal_key, "text_rules": TEXT_RULES,
                                           "splits": differ}}, indent=2).encode())
        raise ValueError(_rules_refusal_message(
            workdir, data_cache, tokenizer_dir, old_rules, differ, source))
    out = {}
    for split in rechecked:
        folder = os.path.join(data_cache, split)
        if os.path.lexists(folder):  # moved aside, not deleted: a kill never
            # leaves a split half removed (a missing one is encoded again)
            os.replace(folder, os.path.join(check, f"old-{split}"))
        os.replace(os.path.join(check, split), folder)
        out[split] = shards.ShardedTokens(folder)
    shutil.rmtree(check, ignore_errors=True)
    logger.info("%s: the text rules of this version give the same tokens; shards "
                "recorded under them.", data_cache)
    return out


def match_vocabulary(model_dict, tokenizer, explicit):
    """The model's vocabulary is the tokenizer's, unless set explicitly."""
    size = tokenizer.vocabulary_size()
    if "vocabulary_size" in explicit:
        tokenizer.check_model_vocabulary(model_dict["vocabulary_size"])
    else:
        model_dict["vocabulary_size"] = size
    cutoffs = [c for c in model_dict.get("cutoffs", ()) if c < size]
    if list(cutoffs) != list(model_dict.get("cutoffs", ())):
        raise ValueError(
            f"The preset's cutoffs {list(model_dict['cutoffs'])} do not fit the "
            f"tokenizer's vocabulary of {size}: set --set cutoffs=[...] below {size} "
            "or cutoffs=[]."
        )
    return TransformerXLConfig.from_dict(model_dict)


class WorkdirLock:
    """An exclusive lock on `workdir/train.lock` (fcntl.flock, released by
    the OS when the process dies, so a killed run never leaves a stale
    lock). A second `txl train` or `txl prepare` on the same workdir is
    refused, naming the command that holds it (`command`, written in the
    lock file with the pid)."""

    def __init__(self, workdir, command="txl train"):
        self.path = os.path.join(workdir, "train.lock")
        self.command = command
        self._file = None

    def __enter__(self):
        import fcntl

        self._file = open(self.path, "a+")
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            owner, _, holder = self._file.read().strip().partition(" ")
            self._file.close()
            self._file = None
            holder = f"`{holder}`" if holder else "txl process"
            where = ("train in another --workdir" if self.command == "txl train"
                     else "use another --workdir")
            raise ValueError(
                f"{os.path.dirname(self.path)} is in use by another {holder} "
                f"(pid {owner or 'unknown'}, lock {self.path}). Wait for it to finish, "
                f"stop it, or {where}."
            ) from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"{os.getpid()} {self.command}")
        self._file.flush()
        return self

    def __exit__(self, *exc):
        if self._file is not None:
            self._file.close()  # closing releases the flock
            self._file = None
        return False


def _probe_write(folder):
    """Writes and removes a small file in `folder` (an OSError if it cannot)."""
    probe = os.path.join(folder, f".write-test-{os.getpid()}")
    with open(probe, "w") as f:
        f.write("ok")
    os.remove(probe)


def writable_workdir(workdir):
    """Creates `workdir` and checks it is writable: a clear error instead
    of an OSError traceback halfway through the run."""
    try:
        os.makedirs(workdir, exist_ok=True)
        _probe_write(workdir)
    except OSError as e:
        raise ValueError(
            f"--workdir {workdir!r} is not writable ({e.strerror or e}): "
            "training writes its checkpoints, tokenizer and metrics there. "
            "Pass a writable folder."
        ) from None
    # A resumed run's checkpoints folder too: one that cannot be written
    # (another user's, a read-only copy) failed only at the first
    # checkpoint, losing the steps trained until then.
    folder = os.path.join(workdir, "checkpoints")
    if os.path.isdir(folder):
        try:
            _probe_write(folder)
        except OSError as e:
            raise ValueError(
                f"--workdir {workdir!r}: its checkpoints folder {folder} is not "
                f"writable ({e.strerror or e}): the run would stop at its first "
                "checkpoint, losing the steps trained until then. Make it writable, "
                "or train in a new --workdir."
            ) from None


def train_main(args, workdir_locked=False):
    """`txl train`: returns the exit code (0 done, 1 stopped by the
    non-finite guard, 130/143 stopped by SIGINT/SIGTERM).

    `workdir_locked`: the caller already holds the workdir's `WorkdirLock`
    (`txl demo`, which holds it from before it writes its corpus)."""
    writable_workdir(args.workdir)
    return _train(args, workdir_locked)


def _train(args, workdir_locked=False):
    import contextlib

    from keras_txl.training.strategy import CLUSTER_TIMEOUT_S
    from keras_txl.training.strategy import get_strategy
    from keras_txl.training.strategy import is_chief

    model_dict, train_config, eval_settings, explicit = resolve_configs(
        args.preset, args.config, args.set,
        {"segment_length": args.segment_length, "memory_length": args.memory_length,
         "batch_size": args.batch_size, "steps": args.steps, "strategy": args.strategy,
         "loop": args.loop, "jit_compile": args.jit_compile,
         "precision": args.precision},
    )
    strategy = get_strategy(train_config.strategy, getattr(args, "tpu", ""),
                            getattr(args, "cluster_timeout", None) or CLUSTER_TIMEOUT_S)
    chief = is_chief(strategy)
    # One writer per workdir: the chief holds the lock for the whole run.
    locked = chief and not workdir_locked
    with WorkdirLock(args.workdir) if locked else contextlib.nullcontext():
        return _train_locked(args, strategy, chief, model_dict, train_config,
                             eval_settings, explicit)


def _train_locked(args, strategy, chief, model_dict, train_config,
                  eval_settings, explicit):
    from keras_txl.training.fit import train_with_fit
    from keras_txl.training.loop import EvaluationStopped
    from keras_txl.training.loop import StopOnSignals
    from keras_txl.training.loop import Trainer
    from keras_txl.training.loop import TrainingInterrupted
    from keras_txl.training.loop import evaluate

    tokenizer, splits = _prepare_data(  # the chief holds the workdir's lock
        args.data, args.workdir, args.tokenizer, args.data_dir, args.download,
        write=chief, vocabulary=vocabulary_flags(args),
        shard_tokens=getattr(args, "shard_tokens", None), tfds=tfds_options(args),
        cli_flags=True,
    )
    model_config = match_vocabulary(model_dict, tokenizer, explicit)
    logger.info("Model: %s (%d parameters)", model_config, model_config.num_parameters())
    logger.info("Training: %s", train_config)
    tokenizer_dir = os.path.join(args.workdir, "tokenizer")
    eval_kwargs = _eval_kwargs(eval_settings)
    # Stated whole in the JSON line, and recorded for `txl eval --workdir`
    # (before training: an interrupted run's is there too).
    final_settings = effective_eval_settings(model_config, eval_kwargs)
    if chief:
        write_eval_config(args.workdir, final_settings)
    try:
        if train_config.loop == "fit":
            # Keras prints its progress to stdout, which holds the result.
            with contextlib.redirect_stdout(sys.stderr):
                model, _ = train_with_fit(
                    model_config, train_config, strategy, splits["train"], splits["valid"],
                    workdir=args.workdir, tokenizer=tokenizer_dir,
                    verbose=1 if args.progress else 2)
        else:
            trainer = Trainer(model_config, train_config, strategy,
                              workdir=args.workdir, tokenizer=tokenizer_dir,
                              verbose=args.progress)
            trainer.restore()
            # The trainer's last evaluation is the final one, over the whole
            # split with the eval settings (one pass, cut short by a signal).
            trainer.train(splits["train"], splits["valid"], eval_settings=None,
                          final_eval_settings=eval_kwargs)
            model = trainer.model
    except TrainingInterrupted as stop:
        logger.warning(
            "Stopped on %s after step %d of %d. Checkpoint: %s; model "
            "folder: %s (txl eval/generate/export --workdir %s use it). "
            "Resume with the same `txl train` command.", stop.signal_name,
            stop.step, stop.total, stop.checkpoint,
            os.path.join(args.workdir, "model"), args.workdir,
        )
        return 130 if stop.signal_name == "SIGINT" else 143
    except FloatingPointError as e:
        logger.error("txl train: %s", e)
        return 1
    except Exception as e:  # noqa: BLE001 - only a lost MultiWorker peer is said here
        lost = _lost_peer(strategy, e)
        if lost is None:
            raise
        # TensorFlow's coordination service found a task that stopped sending
        # heartbeats (~10 s); its message is a page of graph-execution text.
        logger.error(
            "txl train: a task of the MultiWorker cluster stopped (%s). Start every "
            "task again with the same `txl train` command: training resumes from the "
            "newest checkpoint in %s.", lost, os.path.join(args.workdir, "checkpoints"))
        return 1
    if train_config.loop == "fit":
        # Keras validated with the training settings; the final evaluation
        # uses the eval settings, and a signal stops it like training's.
        with StopOnSignals() as signals:
            try:
                result = evaluate(model, splits["valid"], stop=lambda: signals.received,
                                  **eval_kwargs)
            except EvaluationStopped:
                logger.warning(
                    "Stopped on %s during the final evaluation; the model folder %s "
                    "and the checkpoints are complete (txl eval --workdir %s evaluates "
                    "again).", signals.received, os.path.join(args.workdir, "model"),
                    args.workdir)
                return 130 if signals.received == "SIGINT" else 143
        result = bits_named(result, tokenizer)
    else:
        result = {k: v for k, v in trainer.final_eval.items() if k != "step"}
    # The precision it computed in: a mixed-precision run's final evaluation
    # is in it, `txl eval` reads the model folder in float32.
    result = {"split": "valid", **result,
              "settings": {**final_settings, "dtype": model.dtype_policy.name}}
    print(json.dumps(result))
    return 0


def _lost_peer(strategy, error):
    """What TensorFlow said when a MultiWorker step failed because another
    task died ("/job:worker/replica:0/task:1 stopped sending heartbeats"), or
    None for any other error."""
    import re

    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) or not isinstance(
            error, (tf.errors.UnavailableError, tf.errors.AbortedError,
                    tf.errors.CancelledError, tf.errors.DeadlineExceededError)):
        return None
    text = str(error)
    # Two forms, measured: the service's heartbeat verdict ("... unhealthy
    # (stopped sending heartbeats):\n/job:worker/replica:0/task:1\n") and a
    # collective cut mid-transfer ("Collective ops is aborted by:
    # recvmsg:Connection reset by peer ... from remote target
    # /job:worker/replica:0/task:1").
    tasks = re.findall(r"/job:(\w+)/replica:\d+/task:(\d+)\s*\n", text)
    tasks += re.findall(r"remote target /job:(\w+)/replica:\d+/task:(\d+)", text)
    named = ", ".join(dict.fromkeys(f"{job} {task}" for job, task in tasks))
    reason = re.search(r"aborted by: ([^\n]+)", text)
    reason = reason.group(1).strip().rstrip(":")[:200] if reason else (
        f"{type(error).__name__}: {text.strip().splitlines()[0][:200]}")
    return f"{named} stopped answering: {reason}" if named else reason


def effective_eval_settings(model_config, kwargs, max_segments=0):
    """Every setting `evaluate(model, tokens, **kwargs)` runs with, in the
    order of `EVAL_SETTING_KEYS` (+ max_segments): those of `kwargs`, the
    model's own for the others, one stream by default. What the JSON
    lines of `txl train` and `txl eval` state."""
    own = {key: getattr(model_config, key) for key in EVAL_SETTING_KEYS if key != "batch_size"}
    own["batch_size"] = 1
    return {**{key: kwargs.get(key, own[key]) for key in EVAL_SETTING_KEYS},
            "max_segments": max_segments}


def write_eval_config(workdir, settings):
    """WORKDIR/eval_config.json: the settings of `txl train`'s final evaluation."""
    from keras_txl.safe_files import atomic_write_bytes

    recorded = {key: settings[key] for key in EVAL_SETTING_KEYS}
    atomic_write_bytes(os.path.join(workdir, EVAL_CONFIG_FILE),
                       (json.dumps(recorded, indent=2) + "\n").encode(), make_parents=True)


def recorded_eval_settings(workdir):
    """The settings WORKDIR/eval_config.json records (`write_eval_config`),
    or {} when there is none (a run of an older keras-txl). A damaged file
    is refused, naming it, rather than evaluated around in silence."""
    path = os.path.join(workdir, EVAL_CONFIG_FILE)
    if not os.path.isfile(path):
        return {}
    remedy = ("delete it (txl eval then uses the model's own settings) or run `txl train` "
              "again to write it")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.loads(f.read(_CONFIG_MAX_BYTES + 1))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is not the JSON `txl train` writes ({e}): {remedy}.") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object of evaluation settings, "
                         f"received {type(data).__name__}: {remedy}.")
    data = {key: data[key] for key in EVAL_SETTING_KEYS if key in data}
    _check_eval_section(path, data)
    if data.get("segment_length") == 0:
        data.pop("segment_length")  # 0: the model's own
    return data


def resolve_eval_settings(args, model_settings):
    """`txl eval --workdir`'s settings and where each comes from: its flag;
    else --protocol's (`args.protocol_settings`, set by the CLI); else the
    run's final evaluation (WORKDIR/eval_config.json); else the model's
    own (`model_settings`: a config or config dict), and one stream.

    Returns (settings, sources): dicts by `EVAL_SETTING_KEYS`.
    """
    recorded = recorded_eval_settings(args.workdir)
    protocol = getattr(args, "protocol_settings", None) or {}
    settings, sources = {}, {}
    for key in EVAL_SETTING_KEYS:
        flag = getattr(args, key, None)
        if flag is not None:
            value, source = flag, "--" + key.replace("_", "-")
        elif key in protocol:
            value, source = protocol[key], f"--protocol {args.protocol_name}"
        elif key in recorded:
            value, source = recorded[key], f"{EVAL_CONFIG_FILE}: txl train's final evaluation"
        elif key == "batch_size":
            value, source = 1, "default"
        else:
            value = (model_settings.get(key) if isinstance(model_settings, dict)
                     else getattr(model_settings, key))
            source = "the model's"
        settings[key], sources[key] = value, source
    return settings, sources


def _eval_kwargs(settings, **overrides):
    out = {}
    for key in ("segment_length", "memory_length", "clamp_length", "same_length",
                "batch_size"):
        value = overrides.get(key, settings.get(key))
        # segment_length 0 is "the model's own"; a memory_length given as 0
        # is an evaluation without memory (it was dropped for the model's).
        if value is None or (key == "segment_length" and value == 0
                             and key not in overrides):
            continue
        out[key] = value
    return out


def eval_main(args):
    from keras_txl.io import load_pretrained
    from keras_txl.io import tokenizer_directory
    from keras_txl.tokenizers import load_tokenizer
    from keras_txl.training.checkpoint import model_from_checkpoint
    from keras_txl.training.checkpoint import workdir_model_source
    from keras_txl.training.loop import evaluate

    kind, source = workdir_model_source(args.workdir, getattr(args, "checkpoint", None))
    if kind == "model":
        model = load_pretrained(source)
        tokenizer_dir = tokenizer_directory(source) or os.path.join(source, "tokenizer")
    else:
        from keras_txl.training.checkpoint import check_checkpoint_tokenizer

        check_checkpoint_tokenizer(source, args.workdir)
        model = model_from_checkpoint(source)
        tokenizer_dir = os.path.join(args.workdir, "tokenizer")
    import tempfile

    scratch = tempfile.TemporaryDirectory(prefix="txl-eval-")
    tokenizer = None
    if args.data:
        tokenizer = load_tokenizer(tokenizer_dir)
        tokenizer.check_model_vocabulary(model.txl_config.vocabulary_size)
        tokens = encode_split_to_shards(args.data, args.split, tokenizer, scratch.name,
                                        data_dir=args.data_dir, download=args.download,
                                        tfds=tfds_options(args))
    else:
        tokens = workdir_split(args.workdir, args.split)
        check_workdir_tokens(args.workdir, args.split, kind, source, tokenizer_dir)
    kwargs, sources = resolve_eval_settings(args, model.txl_config)
    logger.info("Evaluation settings: %s.", ", ".join(
        f"{key} {value} ({sources[key]})" for key, value in kwargs.items()))
    unknown_id = None if tokenizer is None else tokenizer.unk_id
    try:
        result = evaluate(model, tokens, max_segments=args.max_segments or 0,
                          unknown_id=unknown_id, **kwargs)
    finally:
        if hasattr(tokens, "close"):
            tokens.close()
        scratch.cleanup()
    warn_unknown_tokens(result.pop("unknown_tokens", 0), result["tokens"], args.data,
                        tokenizer)
    has_tokenizer = os.path.isfile(os.path.join(tokenizer_dir, "tokenizer.json"))
    result = bits_named(result, load_tokenizer(tokenizer_dir) if has_tokenizer else None)
    print(json.dumps({"split": args.split, **result, "settings": {**effective_eval_settings(
        model.txl_config, kwargs, args.max_segments or 0), "dtype": model.dtype_policy.name}}))
    return 0


# Above this share of <unk> targets, `txl eval --data` says so.
UNKNOWN_WARNING_SHARE = 0.01


def warn_unknown_tokens(unknown, tokens, data, tokenizer, flag="--data",
                        consequence="the perplexity says little about the model on this text"):
    """Warns when many of the `tokens` read from `flag` `data` are the
    tokenizer's unknown token: a text the tokenizer was not fitted on
    (another language or corpus) gives a perplexity (or pictures, `txl
    attention --text`) that measures the tokenizer, not the model."""
    if tokens and unknown / tokens >= UNKNOWN_WARNING_SHARE:
        logger.warning(
            "%.1f%% of the %d scored tokens of %s %s are %s (unknown to the "
            "%s tokenizer): %s.",
            100 * unknown / tokens, tokens, flag, data, tokenizer.decode([tokenizer.unk_id]),
            tokenizer.kind, consequence)


def workdir_split(workdir, split):
    """The prepared tokens of `split` in `workdir`: its shards
    (`data/{split}/`), or the `data/{split}.npy` array of an older version."""
    from keras_txl.training import shards

    folder = os.path.join(workdir, "data", split)
    if shards.is_complete(folder):
        return _verified(folder)
    old = os.path.join(workdir, "data", f"{split}.npy")
    if os.path.exists(old):
        return np.load(old)
    raise ValueError(
        f"{workdir} has no prepared {split} split ({folder} is missing or "
        "unfinished): pass --data, or run `txl prepare` with this --workdir.")


def check_workdir_tokens(workdir, split, model_kind, model_source, tokenizer_dir):
    """Refuses to score the model on the workdir's prepared tokens when they
    were encoded by another tokenizer than the model's: the ids would be
    read as other tokens and the perplexity would be a number about
    nothing. (The workdir's data can be prepared again, e.g. from another
    corpus once the old data and tokenizer are deleted, while the model
    folder and checkpoints stay.)

    Checks that the workdir's tokenizer is the one `data/source.json` says
    encoded the shards, and that the model folder's tokenizer is that same
    tokenizer (by `tokenizer_fingerprint`: the folder holds a keras-hub
    copy). A checkpoint is checked against the workdir's tokenizer when it
    is loaded (`checkpoint.check_checkpoint_tokenizer`).
    """
    from keras_txl.tokenizers import load_tokenizer
    from keras_txl.tokenizers import tokenizer_fingerprint

    data_cache = os.path.join(workdir, "data")
    data_tokenizer = os.path.join(workdir, "tokenizer")
    remedy = (f"Pass --data to encode the {split} split with the model's tokenizer, or "
              f"prepare {data_cache} again with it.")
    meta = _read_meta(os.path.join(data_cache, "source.json"))
    from keras_txl.training.corpora import TEXT_RULES

    if (isinstance(meta, dict) and meta.get("format") == DATA_FORMAT
            and meta.get("text_rules", 1) != TEXT_RULES):
        raise ValueError(
            f"{data_cache} was encoded under the text rules of an older keras-txl "
            f"(version {meta.get('text_rules', 1)}; this one reads text by version "
            f"{TEXT_RULES}), so its {split} tokens may not be what this version encodes "
            f"from the corpus. Pass --data to encode the {split} split by this version's "
            f"rules, or run `txl prepare --data {meta.get('source')} --workdir {workdir}` "
            "once to check the shards (kept if the tokens are the same).")
    recorded = meta.get("tokenizer_sha256") if isinstance(meta, dict) else None
    if recorded is not None and (not os.path.isdir(data_tokenizer)
                                 or recorded != sha256_tree(data_tokenizer)):
        raise ValueError(
            f"{data_tokenizer} is missing or changed since {data_cache} was encoded with "
            f"it: nothing says which tokenizer made the prepared {split} tokens. {remedy}")
    if model_kind == "model":
        if not (os.path.isdir(tokenizer_dir) and os.path.isdir(data_tokenizer)):
            return
        theirs, ours = load_tokenizer(data_tokenizer), load_tokenizer(tokenizer_dir)
        if tokenizer_fingerprint(theirs) != tokenizer_fingerprint(ours):
            raise ValueError(
                f"{data_cache} was encoded with a {theirs.kind} tokenizer of "
                f"{theirs.vocabulary_size()} tokens ({data_tokenizer}), not with the "
                f"model's own ({ours.kind}, {ours.vocabulary_size()} tokens, "
                f"{tokenizer_dir}): the model would read its ids as other tokens. {remedy}")
        return
    # A checkpoint: `check_checkpoint_tokenizer` (eval_main, when loading it).


def encode_split_to_shards(source, split, tokenizer, folder, data_dir=None,
                           download=False, tfds=None):
    """One split of `source` encoded with `tokenizer` into shards in
    `folder` (streamed, bounded memory); returns its `ShardedTokens`."""
    from keras_txl.training import shards
    from keras_txl.training.corpora import open_corpus_source

    aliases = {"validation": "valid", "dev": "valid"}
    split = aliases.get(split, split)
    corpus_source = open_corpus_source(source, data_dir=data_dir, download=download,
                                       cli_flags=True, **(tfds or {}))
    cut_for = {"kind": tokenizer.kind,
               "double_eos": bool(tokenizer.get_config().get("double_eos", False))}
    out = shards.write_split(
        os.path.join(folder, split),
        lambda cursor: corpus_source.chunks(split, cursor, **cut_for),
        tokenizer.encode, key="eval", dtype=shards.dtype_for(tokenizer.vocabulary_size()),
        split=split)
    if not len(out):
        raise ValueError(f"the {split} split of --data {source} holds no tokens.")
    return out


def bits_named(result, tokenizer):
    """`result` with its "bpc" renamed after what a token is (the
    tokenizer's `bits_metric`): "bpc" only for characters and bytes,
    "bits_per_word" for a word-level run, "bits_per_token" for subwords
    (and when the tokenizer is unknown: None)."""
    name = "bits_per_token" if tokenizer is None else tokenizer.bits_metric
    return {(name if key == "bpc" else key): value for key, value in result.items()}
