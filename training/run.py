"""`txl train` / `txl eval` / `txl demo`: corpora -> tokenizer -> model -> training.

A workdir holds everything of a run:

    workdir/
      config.json          the model config (TransformerXLConfig)
      train_config.json    the training config
      tokenizer/           the tokenizer, fitted on the training split
      data/{split}.npy     the encoded splits (a cache)
      checkpoints/ckpt-*   atomic checkpoints (+ latest.json)
      model/               the latest model folder (config, safetensors,
                           tokenizer): what eval, export and generate read
      tensorboard/, metrics.jsonl
"""

import dataclasses
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


def resolve_configs(preset=None, config_path=None, overrides=(), flags=None):
    """Builds (model dict, TrainConfig, eval settings, explicit model keys).

    Order: preset (or --config JSON with optional "model"/"train"/"eval"
    parts, or a plain model dict), then `--set key=value` overrides (a key
    may be prefixed `model.`, `train.` or `eval.`; unprefixed keys go to
    whichever config has them), then the plain flags.
    """
    model, train, evaluation = {}, {}, {}
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
    tokenizer = None
    if os.path.exists(os.path.join(tokenizer_dir, "tokenizer.json")):
        tokenizer = load_tokenizer(tokenizer_dir)
        if tokenizer_kind and tokenizer.get_config().get("kind", tokenizer_kind) != tokenizer_kind:
            raise ValueError(
                f"{workdir} already has a {tokenizer.get_config().get('kind')} tokenizer; "
                f"--tokenizer {tokenizer_kind} does not match it (use a new workdir)."
            )
        cached = [os.path.join(data_cache, f"{s}.npy") for s in SPLITS]
        if all(os.path.exists(p) for p in cached):
            return tokenizer, {s: np.load(p) for s, p in zip(SPLITS, cached)}
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
    for s, tokens in splits.items():
        logger.info("%s: %d tokens", s, len(tokens))
    return tokenizer, splits


def match_vocabulary(model_dict, tokenizer, explicit):
    """The model's vocabulary is the tokenizer's, unless set explicitly."""
    size = tokenizer.vocabulary_size
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


def train_main(args):
    from keras_txl.training.fit import train_with_fit
    from keras_txl.training.loop import Trainer
    from keras_txl.training.loop import evaluate
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
    os.makedirs(args.workdir, exist_ok=True)
    tokenizer, splits = prepare_data(
        args.data, args.workdir, args.tokenizer, args.data_dir, args.download,
        write=chief,
    )
    model_config = match_vocabulary(model_dict, tokenizer, explicit)
    logger.info("Model: %s (%d parameters)", model_config, model_config.num_parameters())
    logger.info("Training: %s", train_config)
    tokenizer_dir = os.path.join(args.workdir, "tokenizer")
    eval_kwargs = _eval_kwargs(eval_settings)
    if train_config.loop == "fit":
        model, history = train_with_fit(
            model_config, train_config, strategy, splits["train"], splits["valid"],
            workdir=args.workdir, tokenizer=tokenizer_dir, verbose=1 if args.progress else 2)
        result = evaluate(model, splits["valid"], **eval_kwargs)
    else:
        trainer = Trainer(model_config, train_config, strategy,
                          workdir=args.workdir, tokenizer=tokenizer_dir,
                          verbose=args.progress)
        trainer.restore()
        trainer.train(splits["train"], splits["valid"], eval_settings=None)
        result = evaluate(trainer.model, splits["valid"], **eval_kwargs)
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
    from keras_txl.tokenizers import load_tokenizer
    from keras_txl.training.loop import evaluate

    model_dir = os.path.join(args.workdir, "model")
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        raise ValueError(f"No trained model in {model_dir} (run `txl train` first).")
    model = load_pretrained(model_dir)
    tokenizer_dir = os.path.join(model_dir, "tokenizer")
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
