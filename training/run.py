"""`txl train` / `txl eval` / `txl demo`: corpora -> tokenizer -> model -> training.

A workdir holds everything of a run:

    workdir/
      config.json          the model config (TransformerXLConfig)
      train_config.json    the training config
      tokenizer/           the tokenizer, fitted on the training split
      data/{split}.npy     the encoded splits (a cache)
      data/source.json     what the cache was made from (corpus sha256,
                           tokenizer sha256): a changed --data is refused
      checkpoints/ckpt-*   atomic, checksummed checkpoints (+ latest.json)
      train.lock           held by the running `txl train` (one per workdir)
      model/               the latest model folder (config, safetensors,
                           tokenizer): what eval, export and generate read
      tensorboard/, metrics.jsonl
"""

import dataclasses
import hashlib
import json
import logging
import os

import numpy as np

from keras_txl import TransformerXLConfig
from keras_txl.presets import PRESETS
from keras_txl.training.config import TrainConfig
from keras_txl.training.config import parse_override

logger = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")


def _atomic_save_npy(path, array):
    tmp = f"{path}.tmp-{os.getpid()}.npy"
    np.save(tmp, array)
    os.replace(tmp, path)


def _sha256_tree(path):
    """sha256 over a file, or over a folder's files (names and contents,
    in sorted order)."""
    digest = hashlib.sha256()
    if os.path.isfile(path):
        files = [(os.path.basename(path), path)]
    else:
        files = []
        for root, dirs, names in os.walk(path):
            dirs.sort()
            for name in sorted(names):
                full = os.path.join(root, name)
                files.append((os.path.relpath(full, path), full))
    for name, full in files:
        digest.update(name.encode() + b"\0")
        with open(full, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def source_fingerprint(source, data_dir=None):
    """{"source", "sha256"} of `--data`: the content of a file or folder
    (so a moved copy matches and an edited file does not), or the TFDS
    name and data_dir."""
    if source.startswith("tfds:"):
        key = f"{source}|{os.path.abspath(data_dir) if data_dir else ''}"
        return {"source": source, "sha256": hashlib.sha256(key.encode()).hexdigest()}
    if not os.path.exists(source):
        raise ValueError(f"--data {source!r}: the corpus path does not exist.")
    return {"source": os.path.abspath(source), "sha256": _sha256_tree(source)}


def _check_cache(workdir, meta, fingerprint, tokenizer_dir):
    """Refuses a data cache made from another corpus or tokenizer."""
    if fingerprint is not None and fingerprint["sha256"] != meta.get("sha256"):
        raise ValueError(
            f"{workdir} was prepared from {meta.get('source')!r}; --data "
            f"{fingerprint['source']!r} has different content. Its tokenizer "
            "and cached token arrays belong to the old corpus: train in a new "
            f"--workdir (or delete {os.path.join(workdir, 'data')} and "
            f"{os.path.join(workdir, 'tokenizer')} to start over)."
        )
    tokenizer_sha = _sha256_tree(tokenizer_dir)
    if meta.get("tokenizer_sha256") not in (None, tokenizer_sha):
        raise ValueError(
            f"{tokenizer_dir} changed since {os.path.join(workdir, 'data')} was "
            "encoded with it: delete the data folder to re-encode, or restore "
            "the tokenizer."
        )


def resolve_configs(preset=None, config_path=None, overrides=(), flags=None):
    """Builds (model dict, TrainConfig, eval settings, explicit model keys).

    Order: preset (or --config JSON with optional "model"/"train"/"eval"
    parts, or a plain model dict), then `--set key=value` overrides (a key
    may be prefixed `model.`, `train.` or `eval.`; unprefixed keys go to
    whichever config has them), then the plain flags.
    """
    model, train, evaluation = {}, {}, {}
    from_preset = False
    if config_path:
        with open(config_path) as f:
            data = json.load(f)
        if "model" in data:
            model, train = dict(data["model"]), dict(data.get("train", {}))
            evaluation = dict(data.get("eval", {}))
        else:
            model = data
    elif preset:
        if preset not in PRESETS:
            raise ValueError(f"Unknown preset {preset!r}. Available: {sorted(PRESETS)}.")
        model = dict(PRESETS[preset]["model"])
        train = dict(PRESETS[preset]["train"])
        evaluation = dict(PRESETS[preset]["eval"])
        from_preset = True
    else:
        raise ValueError("Give --preset NAME or --config FILE.json.")
    model_fields = {f.name: (model.get(f.name, f.default)
                             if f.default is not dataclasses.MISSING else model.get(f.name, 0))
                    for f in dataclasses.fields(TransformerXLConfig)}
    train_fields = {**TrainConfig().to_dict(), **train}
    eval_fields = {"segment_length": 0, "memory_length": 0, "clamp_length": -1,
                   "same_length": False, "batch_size": 1, **evaluation}
    explicit = set()
    for text in overrides:
        key = text.split("=", 1)[0]
        scope, _, name = key.rpartition(".")
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
        key, value = parse_override(f"{name}={text.split('=', 1)[1]}", fields)
        target[key] = value
        fields[key] = value
        if target is model:
            explicit.add(key)
        elif target is train:
            explicit.add(f"train.{key}")
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
    model.setdefault("vocabulary_size", 256)
    steps = train.get("steps", TrainConfig.steps)
    warmup = train.get("warmup_steps", 0)
    if from_preset and "train.warmup_steps" not in explicit and warmup > steps:
        # A short run of a preset: scale its warm-up rather than refuse.
        train["warmup_steps"] = steps // 10
        logger.info(
            "The preset's warmup_steps=%d exceeds steps=%d: using "
            "warmup_steps=%d (a tenth of the run; pass --set warmup_steps=N "
            "to choose).", warmup, steps, train["warmup_steps"],
        )
    return model, TrainConfig.from_dict(train), evaluation, explicit


def prepare_data(source, workdir, tokenizer_kind=None, data_dir=None, download=False,
                 write=True, tokenizer_options=None):
    """Loads the corpus, fits (or reloads) the tokenizer, encodes the splits.

    Returns (tokenizer, {split: int32 array}).
    """
    from keras_txl.tokenizers import load_tokenizer
    from keras_txl.training.corpora import load_corpus

    tokenizer_dir = os.path.join(workdir, "tokenizer")
    data_cache = os.path.join(workdir, "data")
    meta_path = os.path.join(data_cache, "source.json")
    fingerprint = source_fingerprint(source, data_dir) if source else None
    meta = None
    if os.path.exists(meta_path):
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except ValueError as e:
            raise ValueError(f"{meta_path} is not valid JSON ({e}); delete it "
                             "and the data folder to re-encode.") from None
    tokenizer = None
    if os.path.exists(os.path.join(tokenizer_dir, "tokenizer.json")):
        tokenizer = load_tokenizer(tokenizer_dir)
        if tokenizer_kind and tokenizer.get_config().get("kind", tokenizer_kind) != tokenizer_kind:
            raise ValueError(
                f"{workdir} already has a {tokenizer.get_config().get('kind')} tokenizer; "
                f"--tokenizer {tokenizer_kind} does not match it (use a new workdir)."
            )
        if meta is not None:
            _check_cache(workdir, meta, fingerprint, tokenizer_dir)
        cached = [os.path.join(data_cache, f"{s}.npy") for s in SPLITS]
        if all(os.path.exists(p) for p in cached):
            if meta is None:
                logger.warning(
                    "%s has no source.json (an older workdir): cannot check that "
                    "its cached token arrays come from --data %r.", data_cache, source)
            elif fingerprint is None:
                logger.info("No --data: using the token arrays cached from %s.",
                            meta.get("source"))
            return tokenizer, {s: np.load(p) for s, p in zip(SPLITS, cached)}
    if source is None:
        raise ValueError(f"--data is needed: {workdir} has no cached data yet.")
    corpus = load_corpus(source, data_dir=data_dir, download=download)
    logger.info("Corpus: %r", corpus)
    if tokenizer is None:
        if tokenizer_kind:
            tokenizer = corpus.build_tokenizer(tokenizer_kind, **(tokenizer_options or {}))
        else:
            tokenizer = corpus.build_tokenizer(**(tokenizer_options or {}))
        if write:
            tokenizer.save(tokenizer_dir)
    splits = {s: np.asarray(tokenizer.encode(corpus.split(s)), dtype=np.int32) for s in SPLITS}
    if write:
        os.makedirs(data_cache, exist_ok=True)
        for s, tokens in splits.items():
            _atomic_save_npy(os.path.join(data_cache, f"{s}.npy"), tokens)
        from keras_txl.io import atomic_write_bytes

        atomic_write_bytes(meta_path, json.dumps(
            {**fingerprint, "tokenizer_sha256": _sha256_tree(tokenizer_dir)},
            indent=2).encode())
    for s, tokens in splits.items():
        logger.info("%s: %d tokens", s, len(tokens))
    return tokenizer, splits


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
    lock). A second `txl train` on the same workdir is refused."""

    def __init__(self, workdir):
        self.path = os.path.join(workdir, "train.lock")
        self._file = None

    def __enter__(self):
        import fcntl

        self._file = open(self.path, "a+")
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            owner = self._file.read().strip() or "unknown"
            self._file.close()
            self._file = None
            raise ValueError(
                f"{os.path.dirname(self.path)} is in use by another `txl train` "
                f"(pid {owner}, lock {self.path}). Wait for it to finish, stop "
                "it, or train in another --workdir."
            ) from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(str(os.getpid()))
        self._file.flush()
        return self

    def __exit__(self, *exc):
        if self._file is not None:
            self._file.close()  # closing releases the flock
            self._file = None
        return False


def _writable_workdir(workdir):
    """Creates `workdir` and checks it is writable: a clear error instead
    of an OSError traceback halfway through the run."""
    try:
        os.makedirs(workdir, exist_ok=True)
        probe = os.path.join(workdir, f".write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise ValueError(
            f"--workdir {workdir!r} is not writable ({e.strerror or e}): "
            "training writes its checkpoints, tokenizer and metrics there. "
            "Pass a writable folder."
        ) from None


def train_main(args):
    """`txl train`: returns the exit code (0 done, 1 stopped by the
    non-finite guard, 130/143 stopped by SIGINT/SIGTERM)."""
    _writable_workdir(args.workdir)
    return _train(args)


def _train(args):
    import contextlib

    from keras_txl.training.strategy import get_strategy
    from keras_txl.training.strategy import is_chief

    model_dict, train_config, eval_settings, explicit = resolve_configs(
        args.preset, args.config, args.set,
        {"segment_length": args.segment_length, "memory_length": args.memory_length,
         "batch_size": args.batch_size, "steps": args.steps, "strategy": args.strategy,
         "loop": args.loop, "jit_compile": args.jit_compile or None,
         "precision": args.precision},
    )
    strategy = get_strategy(train_config.strategy, getattr(args, "tpu", ""))
    chief = is_chief(strategy)
    # One writer per workdir: the chief holds the lock for the whole run.
    with WorkdirLock(args.workdir) if chief else contextlib.nullcontext():
        return _train_locked(args, strategy, chief, model_dict, train_config,
                             eval_settings, explicit)


def _train_locked(args, strategy, chief, model_dict, train_config,
                  eval_settings, explicit):
    from keras_txl.training.fit import train_with_fit
    from keras_txl.training.loop import Trainer
    from keras_txl.training.loop import TrainingInterrupted
    from keras_txl.training.loop import evaluate

    tokenizer, splits = prepare_data(
        args.data, args.workdir, args.tokenizer, args.data_dir, args.download,
        write=chief,
    )
    model_config = match_vocabulary(model_dict, tokenizer, explicit)
    logger.info("Model: %s (%d parameters)", model_config, model_config.num_parameters())
    logger.info("Training: %s", train_config)
    tokenizer_dir = os.path.join(args.workdir, "tokenizer")
    eval_kwargs = _eval_kwargs(eval_settings)
    try:
        if train_config.loop == "fit":
            model, _ = train_with_fit(
                model_config, train_config, strategy, splits["train"], splits["valid"],
                workdir=args.workdir, tokenizer=tokenizer_dir,
                verbose=1 if args.progress else 2)
        else:
            trainer = Trainer(model_config, train_config, strategy,
                              workdir=args.workdir, tokenizer=tokenizer_dir,
                              verbose=args.progress)
            trainer.restore()
            trainer.train(splits["train"], splits["valid"], eval_settings=None)
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
    result = evaluate(model, splits["valid"], **eval_kwargs)
    result = {"split": "valid", **bits_named(result, tokenizer), "settings": eval_kwargs}
    print(json.dumps(result))
    return 0


def _eval_kwargs(settings, **overrides):
    out = {}
    for key in ("segment_length", "memory_length", "clamp_length", "same_length",
                "batch_size"):
        value = overrides.get(key, settings.get(key))
        if value is None or (key in ("segment_length", "memory_length") and value == 0
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
        model = model_from_checkpoint(source)
        tokenizer_dir = os.path.join(args.workdir, "tokenizer")
    if args.data:
        from keras_txl.training.corpora import load_corpus

        tokenizer = load_tokenizer(tokenizer_dir)
        tokenizer.check_model_vocabulary(model.txl_config.vocabulary_size)
        corpus = load_corpus(args.data, data_dir=args.data_dir, download=args.download)
        tokens = np.asarray(tokenizer.encode(corpus.split(args.split)), dtype=np.int32)
    else:
        tokens = np.load(os.path.join(args.workdir, "data", f"{args.split}.npy"))
    kwargs = {"batch_size": args.batch_size}
    for key in ("segment_length", "memory_length", "clamp_length"):
        value = getattr(args, key)
        if value is not None:
            kwargs[key] = value
    if args.same_length:
        kwargs["same_length"] = True
    result = evaluate(model, tokens, max_segments=args.max_segments or 0, **kwargs)
    has_tokenizer = os.path.isfile(os.path.join(tokenizer_dir, "tokenizer.json"))
    result = bits_named(result, load_tokenizer(tokenizer_dir) if has_tokenizer else None)
    print(json.dumps({"split": args.split, **result, "settings": kwargs}))
    return 0


def bits_named(result, tokenizer):
    """`result` with its "bpc" renamed after what a token is (the
    tokenizer's `bits_metric`): "bpc" only for characters and bytes,
    "bits_per_word" for a word-level run, "bits_per_token" for subwords
    (and when the tokenizer is unknown: None)."""
    name = "bits_per_token" if tokenizer is None else tokenizer.bits_metric
    return {(name if key == "bpc" else key): value for key, value in result.items()}
