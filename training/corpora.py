"""Language-model corpora as three text splits: train, valid and test.

`load_corpus(source)` returns a `Corpus` from:

- a folder holding `train.txt`, `valid.txt` and `test.txt`;
- a folder in one of the paper's layouts, detected from the file names:
  - WikiText-103 (or -2): `wiki.train.tokens`, `wiki.valid.tokens`,
    `wiki.test.tokens` (or the `.raw` variants);
  - enwik8/text8 as written by the official prep scripts: `train.txt`,
    `valid.txt`, `test.txt` holding space-separated symbols (a byte value
    per symbol for enwik8, a character per symbol for text8). Detected by
    looking at the start of `train.txt`; force it with `char_symbols`;
  - the raw `enwik8` or `text8` file (or `enwik8.zip` / `text8.zip`),
    split the standard way (see `standard_split_sizes`);
- the official LM1B folder (`training-monolingual.tokenized.shuffled/`,
  `heldout-monolingual.tokenized.shuffled/`): train on every `news.en-*`
  file in sorted order, valid and test on held-out shard 0; or the
  `one-billion-words/` folder of the reference `getdata.sh` holding it;
- a single text file, split like a raw enwik8/text8 file;
- TFDS, as `"tfds:NAME"` or `"tfds:NAME:CONFIG"` (e.g. `"tfds:lm1b"`,
  `"tfds:wiki40b:en"`), read in stored order;
- the offline demo corpus written by `prepare_stdlib_docs(folder)` (a
  `train.txt`/`valid.txt`/`test.txt` folder built from the docstrings of
  the Python standard library: real English text on any machine).

`build_local_tfds(name, folder, data_dir)` stores a local corpus as a TFDS
dataset with its line order kept, so that the TFDS path works offline.

Every split is one string. The files of a folder are read as UTF-8 with
universal newlines; a single file (and raw enwik8/text8) is read byte for
byte, cut at byte positions, and must be UTF-8 too, except the raw enwik8,
which is read as bytes for the byte tokenizer (see `CorpusSource`). A byte
order mark at the start of a file is not text: dropped (the cut of a single
file is of the bytes after it), except in the raw enwik8.
Each `Corpus` also names the tokenizer the reference code uses for it
(`tokenizer_kind`, `tokenizer_options`) and the splits its vocabulary is
counted on (`vocabulary_splits`: train only for WikiText-103, all three for
enwik8/text8, as in the official `data_utils.py`).
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import re
import sys
import sysconfig
import warnings
import zipfile
import zlib
from typing import Iterator
from typing import Mapping

import numpy as np

from keras_txl.safe_files import atomic_write_bytes

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_STDLIB_DOCS_CHARS",
    "SPLITS",
    "TEXT_RULES",
    "TEXT_RULES_CHANGES",
    "Corpus",
    "CorpusSource",
    "build_local_tfds",
    "load_corpus",
    "open_corpus_source",
    "prepare_stdlib_docs",
    "standard_split_sizes",
    "stdlib_docstrings",
]

SPLITS = ("train", "valid", "test")
# The version of the rules that turn a corpus's bytes into the text the
# tokenizer encodes (line ends, a byte order mark, the newline given to a last
# line without one, ...). Prepared shards record it (`txl prepare`'s
# `data/source.json` and the key of every split's index.json), so shards
# encoded under other rules are noticed, never reused in silence. Raise it with
# any change that can change the text read from the same bytes.
#   1: (not recorded) before 2.
#   2: a last line without a newline is given one (its <eos>).
#   3: a byte order mark at the start of a single text file (and a raw text8)
#      is dropped, as it was at the start of every file of a folder, and the
#      file is split 90/5/5 by the bytes after it; a train.txt of symbols
#      (enwik8/text8 prepared) that starts with one is detected as symbols.
TEXT_RULES = 3
# What each version changed, for the messages that refuse shards of an older one.
TEXT_RULES_CHANGES = {
    2: "a last line without a newline gets its <eos>",
    3: ("a byte order mark at the start of a single file is dropped, and a "
        "train.txt of symbols starting with one is read as symbols"),
}
_BOM = b"\xef\xbb\xbf"
_TEXT_FILES = {split: f"{split}.txt" for split in SPLITS}
_WIKITEXT_FILES = {split: f"wiki.{split}.tokens" for split in SPLITS}
_WIKITEXT_RAW_FILES = {split: f"wiki.{split}.raw" for split in SPLITS}
_RAW_NAMES = ("enwik8", "text8")

# Raw enwik8/text8 are 100M bytes: 90M train, 5M valid, 5M test.
_STANDARD_SIZE = 100_000_000
_STANDARD_HELD_OUT = 5_000_000

# How much of train.txt is looked at to detect space-separated symbols.
_SYMBOL_SAMPLE_CHARS = 1 << 16
_SYMBOL_MIN_COUNT = 16

DEFAULT_STDLIB_DOCS_CHARS = 3_000_000
_STDLIB_MANIFEST = "stdlib_docs.json"
_STDLIB_SKIP_DIRS = {
    "site-packages",
    "dist-packages",
    "__pycache__",
    "test",
    "tests",
    "idle_test",
}

# Text feature of the TFDS datasets used for language modelling.
_TFDS_TEXT_FEATURES = {
    "lm1b": "text",
    "pg19": "book_text",
    "tiny_shakespeare": "text",
    "wiki40b": "text",
    "wikipedia": "text",
    "c4": "text",
    "imdb_reviews": "text",
}
# TFDS datasets without a validation split: held-out halves of "test".
_TFDS_SPLIT_DEFAULTS = {
    "lm1b": {"train": "train", "valid": "test[:50%]", "test": "test[50%:]"},
}
_TFDS_CHAR_DATASETS = {"tiny_shakespeare"}


# === Corpus ===


@dataclasses.dataclass(frozen=True)
class Corpus:
    """A corpus as three text splits.

    Args:
        train: str. Training text.
        valid: str. Validation text.
        test: str. Test text.
        name: str. Short name (folder or dataset name).
        layout: str. Where it came from: `"splits"`, `"char-symbols"`,
            `"wikitext"`, `"wikitext-raw"`, `"enwik8"`, `"text8"`,
            `"raw-file"` or `"tfds"`.
        source: str. Path or `tfds:` name it was loaded from.
        char_symbols: bool. True if the text is space-separated symbols
            (prepared enwik8/text8); tokenize it with the `word` tokenizer
            and `add_eos=False`, as the reference code does.
        tokenizer_kind: str. Tokenizer kind the reference code uses here.
        tokenizer_options: dict. Options for `build_tokenizer` with it.
        vocabulary_splits: tuple of str. Splits the vocabulary is built on.
    """

    train: str = dataclasses.field(repr=False)
    valid: str = dataclasses.field(repr=False)
    test: str = dataclasses.field(repr=False)
    name: str = ""
    layout: str = "splits"
    source: str = ""
    char_symbols: bool = False
    tokenizer_kind: str = "word"
    tokenizer_options: Mapping = dataclasses.field(default_factory=dict)
    vocabulary_splits: tuple = ("train",)

    def split(self, name: str) -> str:
        """The text of split `name` (`"train"`, `"valid"` or `"test"`)."""
        aliases = {"validation": "valid", "dev": "valid"}
        key = aliases.get(name, name)
        if key not in SPLITS:
            raise ValueError(
                f"`name` must be one of {SPLITS}. Received: name={name!r}."
            )
        return getattr(self, key)

    def vocabulary_texts(self) -> list[str]:
        """The texts to build the vocabulary on (`vocabulary_splits`)."""
        return [self.split(name) for name in self.vocabulary_splits]

    def build_tokenizer(self, kind: str | None = None, **options):
        """Fits a tokenizer on `vocabulary_texts()`.

        Args:
            kind: str or None. Tokenizer kind; None means
                `tokenizer_kind`. For that kind, `tokenizer_options` are
                used unless `options` override them.
            **options: Options for `keras_txl.tokenizers.build_tokenizer`.

        Returns:
            A `keras_txl.tokenizers.Tokenizer`.
        """
        from keras_txl import tokenizers

        if kind is None or kind == self.tokenizer_kind:
            kind = self.tokenizer_kind
            options = unknown_token_if_cut({**self.tokenizer_options, **options}, options)
        return tokenizers.build_tokenizer(
            kind, self.vocabulary_texts(), **options
        )

    def __repr__(self):
        sizes = ", ".join(
            f"{split}={len(getattr(self, split)):,} chars" for split in SPLITS
        )
        return (
            f"Corpus(name={self.name!r}, layout={self.layout!r}, {sizes}, "
            f"char_symbols={self.char_symbols})"
        )


# The symbol files of enwik8/text8 (after the official prep scripts) read as
# the reference `data_utils.py` reads them: whitespace-split symbols, the
# newlines dropped, and a vocabulary of the symbols alone, by decreasing
# count, with no `<eos>` and no `<unk>`, so the ids (and the vocabulary
# size: 204 for enwik8, 27 for text8) are the reference's.
_SYMBOL_OPTIONS = {"add_eos": False, "unk_token": None, "reference_specials": True}
# WikiText (`wiki.*.tokens`) as the reference reads WikiText-103/2: '<eos>'
# first, then the words by count, the '<unk>' of its text at its count's rank.
_WIKITEXT_OPTIONS = {"reference_specials": True}


def unknown_token_if_cut(options: Mapping, asked: Mapping) -> dict:
    """`options` (a corpus's own, merged with those `asked`) with an
    `<unk>` token (last in the vocabulary) where the corpus's own have none
    (`unk_token=None`, the official enwik8/text8 symbols) but `asked` cuts
    the vocabulary (`max_size`, `min_freq`, `--vocab-size`, `--min-freq`):
    the symbols left out need an id to be read as. An `unk_token` asked
    for is kept."""
    options = dict(options)
    cut = asked.get("max_size") is not None or (asked.get("min_freq") or 1) > 1
    if (cut and "unk_token" in options and options["unk_token"] is None
            and "unk_token" not in asked):
        from keras_txl.tokenizers import UNK_TOKEN

        options["unk_token"] = UNK_TOKEN
    return options


def _check_splits(corpus: Corpus, where: Mapping[str, str]) -> Corpus:
    for split in SPLITS:
        if not getattr(corpus, split).strip():
            raise ValueError(
                f"the {split} split is empty: {where[split]} holds no text. "
                "Every split needs some text."
            )
    return corpus


# === Raw files and standard splits ===


def standard_split_sizes(total: int) -> tuple[int, int, int]:
    """Sizes `(train, valid, test)` of the standard enwik8/text8 split.

    The official prep scripts keep the last 5M bytes for test and the 5M
    before them for valid; enwik8 and text8 are 100M bytes, hence
    90M/5M/5M. Files smaller than 100M are split in the same proportions,
    90%/5%/5% (valid and test get `total // 20` each, train the rest).

    Args:
        total: int. Size of the file (bytes) or text (characters).

    Returns:
        A tuple `(train, valid, test)` of sizes that add up to `total`.

    Raises:
        ValueError: if `total < 20`, too small to give each split data.

    Example:

    >>> standard_split_sizes(100_000_000)
    (90000000, 5000000, 5000000)
    >>> standard_split_sizes(1000)
    (900, 50, 50)
    """
    if total < 20:
        raise ValueError(
            f"a corpus of {total} bytes is too small to split 90%/5%/5%: "
            "need at least 20."
        )
    held_out = _STANDARD_HELD_OUT if total >= _STANDARD_SIZE else total // 20
    return total - 2 * held_out, held_out, held_out


# === Folders ===


def _looks_like_symbols(path: pathlib.Path) -> bool:
    """True if the start of `path` is space-separated single symbols."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        sample = handle.read(_SYMBOL_SAMPLE_CHARS)
    # A byte order mark is not text (dropped when read): not part of the
    # first symbol.
    sample = sample.removeprefix("\ufeff")
    symbols = sample.split()
    if len(sample) == _SYMBOL_SAMPLE_CHARS and len(symbols) > 1:
        symbols = symbols[:-1]  # the last one may be cut
    if len(symbols) < _SYMBOL_MIN_COUNT:
        return False  # too little to tell; pass char_symbols=True
    if all(len(symbol) == 1 for symbol in symbols):  # text8: characters
        return True
    # enwik8: decimal byte values
    return all(
        symbol.isdigit() and len(symbol) <= 3 and int(symbol) < 256
        for symbol in symbols
    )


def _complete_layout(folder, files: Mapping[str, str]):
    paths = {split: folder / name for split, name in files.items()}
    present = [split for split, path in paths.items() if path.is_file()]
    if not present:
        return None
    absent = [paths[split] for split in SPLITS if split not in present]
    if absent:
        # Not a file: say what is there instead (a folder, a broken link).
        what = [f"{path} (a folder, not a file)" if path.is_dir()
                else f"{path} (a symbolic link to {os.readlink(path)!r}, which does "
                "not exist)" if path.is_symlink() and not path.exists()
                else f"{path} (not a regular file)" if os.path.lexists(path)
                else str(path) for path in absent]
        raise ValueError(
            f"corpus folder {folder} has {files[present[0]]} but is missing "
            f"{', '.join(what)}."
        )
    return paths


def _wikitext_layout(folder: pathlib.Path, char_symbols):
    """`(paths, layout, kind)` of a WikiText folder (tokenized or raw), or
    None; shared by `load_corpus` and the streaming `open_corpus_source`."""
    for files, layout, kind in (
        (_WIKITEXT_FILES, "wikitext", "word"),
        (_WIKITEXT_RAW_FILES, "wikitext-raw", "char"),
    ):
        paths = _complete_layout(folder, files)
        if paths is not None:
            if char_symbols:
                raise ValueError(
                    "char_symbols=True applies to train.txt/valid.txt/"
                    f"test.txt folders, but {folder} holds {layout} files."
                )
            return paths, layout, kind
    return None


def load_corpus(
    source,
    *,
    char_symbols: bool | None = None,
    data_dir=None,
    download: bool = False,
    text_feature: str | None = None,
    split_names: Mapping[str, str] | None = None,
    max_examples: int | None = None,
) -> Corpus:
    """Loads a corpus as three text splits.

    Args:
        source: str or path-like. A folder (layouts in the module
            docstring), a single text file (split 90/5/5 like a raw
            enwik8/text8 file), or `"tfds:NAME[:CONFIG]"`.
        char_symbols: bool or None. For `train.txt`/`valid.txt`/`test.txt`
            folders: True if the files hold space-separated symbols
            (enwik8/text8 prepared by the official scripts), False if plain
            text, None to detect it from the start of `train.txt`.
        data_dir: str, path-like or None. TFDS only: where the dataset is
            (or will be) prepared; None is the TFDS default
            (`~/tensorflow_datasets`).
        download: bool. TFDS only: download and prepare the dataset if it
            is not prepared in `data_dir` (needs internet).
        text_feature: str or None. TFDS only: the feature holding the text.
            None picks it for the known datasets (`book_text` for pg19,
            `text` for lm1b, wiki40b, tiny_shakespeare ...) or takes the only
            text feature.
        split_names: dict or None. TFDS only: TFDS split for each of
            `"train"`, `"valid"`, `"test"` (slicing allowed, e.g.
            `"test[:50%]"`). By default `train`, `validation` and `test`;
            lm1b, which has no validation split, uses the two halves of
            `test`.
        max_examples: int or None. TFDS only: read at most this many
            examples per split (pg19 and wiki40b are large).

    Returns:
        A `Corpus`.

    Raises:
        ValueError: if the folder or a file is missing, the layout is not
            recognized, a split is empty, or the TFDS dataset is unknown or
            not prepared.

    Example:

    >>> corpus = load_corpus(prepare_stdlib_docs("/tmp/stdlib_docs"))
    >>> corpus.layout
    'splits'
    """
    if isinstance(source, str) and source.startswith("tfds:"):
        return _load_tfds(
            source[len("tfds:") :],
            data_dir=data_dir,
            download=download,
            text_feature=text_feature,
            split_names=split_names,
            max_examples=max_examples,
        )
    # The layouts are decided once, by the streaming reader: this reads its
    # chunks whole (every file as UTF-8 with universal newlines, raw files
    # byte for byte), so both give the same text by construction.
    _refuse_tfds_arguments(source, {"max_examples": max_examples}, {})
    stream = open_corpus_source(source, char_symbols=char_symbols, data_dir=data_dir,
                                download=download, text_feature=text_feature,
                                split_names=split_names)
    texts = {split: "".join(text for text, _ in stream.chunks(split, kind="byte"))
             for split in SPLITS}
    logger.info("%s: %s layout, splits of %d/%d/%d characters", stream.source,
                stream.layout, *(len(texts[split]) for split in SPLITS))
    corpus = Corpus(
        **texts, name=stream.name, layout=stream.layout, source=stream.source,
        char_symbols=stream.char_symbols, tokenizer_kind=stream.tokenizer_kind,
        tokenizer_options=stream.tokenizer_options,
        vocabulary_splits=stream.vocabulary_splits,
    )
    return _check_splits(corpus, stream.split_origins())


# === TFDS ===


def _import_tfds():
    try:
        import tensorflow_datasets as tfds
    except ImportError as error:
        raise ValueError(
            "loading 'tfds:' corpora needs tensorflow-datasets and "
            f"importlib_resources: pip install tensorflow-datasets "
            f"importlib_resources ({error})."
        ) from None
    return tfds


def _parse_tfds_name(spec: str) -> str:
    # "NAME", "NAME:CONFIG", "NAME[:CONFIG]:VERSION" or TFDS's own
    # "NAME/CONFIG[:VERSION]".
    if not spec or spec.startswith((":", "/")):
        raise ValueError(
            "a TFDS source must be 'tfds:NAME' or 'tfds:NAME:CONFIG'. "
            f"Received: 'tfds:{spec}'."
        )
    # A last part that looks like a version ("1.0.0", "1.*.*") is the
    # version, as TFDS writes it ("lm1b:1.1.0"), not a config.
    head, sep, last = spec.rpartition(":")
    version = None
    if sep and re.fullmatch(r"\d+\.(\d+|\*)\.(\d+|\*)", last):
        spec, version = head, last
    if "/" not in spec and ":" in spec:
        name, config = spec.split(":", 1)
        spec = f"{name}/{config}"
    return f"{spec}:{version}" if version else spec


# How the TFDS arguments are named in errors: the Python ones (of
# `load_corpus`/`open_corpus_source`, or of `prepare_data`, which takes
# `text_feature` and `split_names` in its `tfds` dict), or the CLI's flags.
# "given" spells a `text_feature` that was passed.
_TFDS_ARGUMENTS = {"download": "download=True", "data_dir": "data_dir=",
                   "text_feature": "text_feature=...",
                   "split_names": "split_names={'valid': ...}",
                   "given": "text_feature={!r}"}
_TFDS_PREPARE_DATA = {"download": "download=True", "data_dir": "data_dir=",
                      "text_feature": "tfds={'text_feature': NAME}",
                      "split_names": "tfds={'split_names': {'valid': NAME}}",
                      "given": "tfds={{'text_feature': {!r}}}"}
_TFDS_FLAGS = {"download": "--download", "data_dir": "--data-dir ",
               "text_feature": "--tfds-text-feature NAME",
               "split_names": "--tfds-split valid=NAME",
               "given": "--tfds-text-feature {}"}
_TFDS_NAMES = {False: _TFDS_ARGUMENTS, True: _TFDS_FLAGS, "prepare_data": _TFDS_PREPARE_DATA}
# The TFDS arguments as a local corpus (folder or file) refuses them.
_TFDS_ONLY = {False: {"data_dir": "`data_dir`", "download": "`download`",
                      "text_feature": "`text_feature`", "split_names": "`split_names`"},
              True: {"data_dir": "--data-dir", "download": "--download",
                     "text_feature": "--tfds-text-feature", "split_names": "--tfds-split"},
              "prepare_data": {"data_dir": "`data_dir`", "download": "`download`",
                               "text_feature": "`tfds={'text_feature': ...}`",
                               "split_names": "`tfds={'split_names': ...}`"}}


def _refuse_tfds_arguments(source, given, names):
    """A local corpus given TFDS-only arguments (`given`: name -> value, the
    ones not at their defaults): a ValueError naming them, never ignored."""
    given = [names.get(name, f"`{name}`") for name, value in given.items()
             if value is not None and value is not False]
    if given:
        verb = "applies" if len(given) == 1 else "apply"
        raise ValueError(
            f"{' and '.join(given)} {verb} to 'tfds:NAME' sources only (source "
            f"{str(source)!r} is not one): leave {'it' if len(given) == 1 else 'them'} out.")


def _tfds_builder(tfds, name: str, data_dir, download: bool, names=None):
    names = names or _TFDS_ARGUMENTS
    flag = names["data_dir"].strip(" =")
    where = (f"{names['data_dir']}{str(data_dir)!r}" if data_dir
             else f"TFDS's default data_dir (no {flag} given)")
    if data_dir and not download and not os.path.isdir(data_dir):
        raise ValueError(
            f"{names['data_dir']}{str(data_dir)!r} does not exist: pass the folder the "
            f"TFDS dataset {name!r} was prepared in (or {names['download']} to download "
            "and prepare it there).")
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as error:  # DatasetNotFoundError, bad config, ...
        first_line = str(error).strip().splitlines()[0] if str(error) else ""
        raise ValueError(
            f"TFDS dataset {name!r} was not found in the TFDS catalog or in "
            f"{where} ({type(error).__name__}: {first_line}). Check the "
            "name (e.g. 'tfds:lm1b', 'tfds:wiki40b:en'); for a local dataset "
            f"pass the {flag} given to build_local_tfds; for a "
            f"catalog dataset pass {names['download']} (needs internet)."
        ) from None
    if not builder.is_prepared():
        if not download:
            raise ValueError(
                f"TFDS dataset {name!r} is not prepared in {where} (looked in "
                f"{builder.data_dir}). Pass {names['download']} to download and "
                f"prepare it (needs internet), or the {flag} "
                "where it was prepared."
            )
        logger.info("Downloading and preparing TFDS dataset %s", name)
        try:
            builder.download_and_prepare()
        except Exception as error:
            raise ValueError(
                f"could not download and prepare TFDS dataset {name!r} into "
                f"{where}: {type(error).__name__}: {error}"
            ) from error
    return builder


def _tfds_text_feature(builder, text_feature, names=None) -> str:
    names = names or _TFDS_ARGUMENTS
    features = builder.info.features
    keys = list(features.keys()) if hasattr(features, "keys") else []
    if text_feature is not None:
        if text_feature not in keys:
            raise ValueError(
                f"`text_feature` must be a feature of TFDS dataset "
                f"{builder.name!r}: one of {keys}. Received: "
                f"{names['given'].format(text_feature)}."
            )
        return text_feature
    known = _TFDS_TEXT_FEATURES.get(builder.name)
    if known in keys:
        return known
    text_keys = [key for key in keys if type(features[key]).__name__ == "Text"]
    if len(text_keys) == 1:
        return text_keys[0]
    # A local copy in a known format (PG-19's book_text beside its title).
    named = [key for key in ("book_text", "text") if key in text_keys]
    if len(named) == 1:
        return named[0]
    raise ValueError(
        f"cannot tell which feature of TFDS dataset {builder.name!r} holds "
        f"the text (features: {keys}); pass {names['text_feature']}."
    )


def _tfds_split_names(builder, split_names, names_of=None) -> dict:
    names_of = names_of or _TFDS_ARGUMENTS
    available = list(builder.info.splits.keys())
    if split_names is not None:
        unknown = sorted(set(split_names) - set(SPLITS))
        if unknown:
            raise ValueError(
                f"`split_names` keys must be among {SPLITS}. Received "
                f"unknown keys {unknown}."
            )
    names = dict(_TFDS_SPLIT_DEFAULTS.get(builder.name, {}))
    for split, candidates in (
        ("train", ("train",)),
        ("valid", ("validation", "valid", "dev")),
        ("test", ("test",)),
    ):
        if split not in names:
            found = [name for name in candidates if name in available]
            if found:
                names[split] = found[0]
    names.update(split_names or {})
    missing = [split for split in SPLITS if split not in names]
    if missing:
        raise ValueError(
            f"TFDS dataset {builder.name!r} has splits {available}; no split "
            f"found for {missing}. Pass {names_of['split_names']} (TFDS "
            "slicing such as 'train[-1%:]' is allowed)."
        )
    return names


def _read_tfds_text(tfds, builder, split, feature, max_examples) -> str:
    # Files in order, one at a time: the stored example order is kept
    # (it is the corpus order for datasets built with disable_shuffling).
    read_config = tfds.ReadConfig(interleave_cycle_length=1)
    try:
        dataset = builder.as_dataset(
            split=split, shuffle_files=False, read_config=read_config
        )
    except Exception as error:  # e.g. a bad split name or slice
        raise ValueError(
            f"cannot read split {split!r} of TFDS dataset {builder.name!r}: "
            f"{type(error).__name__}: {error}"
        ) from None
    if max_examples is not None:
        dataset = dataset.take(max_examples)
    dataset = dataset.map(lambda example: example[feature]).batch(1024)
    pieces = []
    for batch in dataset.as_numpy_iterator():
        for value in batch.tolist():
            text = _tfds_text(value, builder.name, split, len(pieces))
            pieces.append(text if text.endswith("\n") else text + "\n")
    return "".join(pieces)


def _tfds_text(value: bytes, name: str, split: str, example: int) -> str:
    """One TFDS example's text, which must be UTF-8 text with no NUL byte, as
    every text corpus (`CorpusSource._decode`)."""
    where = f"TFDS dataset {name!r} split {split!r}: example {example} (counting from 0)"
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{where} is not valid UTF-8 text (byte {error.start} of the example: "
            f"{value[max(0, error.start - 8):error.start + 8]!r}). Text corpora must be "
            "UTF-8; fix the dataset (or its source) and prepare it again.") from None
    nul = value.find(b"\0")
    if nul >= 0:
        raise ValueError(
            f"{where} holds a NUL byte (at byte {nul} of the example: "
            f"{value[max(0, nul - 8):nul + 8]!r}): it is not text but binary data, or text "
            "stored as UTF-16. Text corpora must be UTF-8 text; fix the dataset (or its "
            "source) and prepare it again.")
    return text


def _load_tfds(
    spec, *, data_dir, download, text_feature, split_names, max_examples
) -> Corpus:
    if max_examples is not None and (
        isinstance(max_examples, bool)
        or not isinstance(max_examples, int)
        or max_examples < 1
    ):
        raise ValueError(
            "`max_examples` must be a positive integer or None. Received: "
            f"max_examples={max_examples!r}."
        )
    tfds = _import_tfds()
    name = _parse_tfds_name(spec)
    builder = _tfds_builder(tfds, name, data_dir, download)
    feature = _tfds_text_feature(builder, text_feature)
    names = _tfds_split_names(builder, split_names)
    texts = [
        _read_tfds_text(tfds, builder, names[split], feature, max_examples)
        for split in SPLITS
    ]
    kind = "char" if builder.name in _TFDS_CHAR_DATASETS else "word"
    corpus = Corpus(
        *texts,
        name=name,
        layout="tfds",
        source=f"tfds:{spec}",
        tokenizer_kind=kind,
    )
    where = {split: f"TFDS {name!r} split {names[split]!r}" for split in SPLITS}
    return _check_splits(corpus, where)


def build_local_tfds(
    name: str,
    folder,
    data_dir,
    *,
    version: str = "1.0.0",
    char_symbols: bool | None = None,
) -> str:
    """Stores a local corpus as a TFDS dataset, one example per line.

    Uses `tfds.dataset_builders.store_as_tfds_dataset` with
    `disable_shuffling=True`, so the examples keep the line order (TFDS
    reorders them otherwise). Splits are named `train`, `validation` and
    `test`; the feature is `text`. Afterwards
    `load_corpus(f"tfds:{name}", data_dir=data_dir)` reads it back, also in
    a new process: each split then equals the original text, with a final
    newline added if it had none. If the dataset already exists in
    `data_dir` at this version, TFDS keeps the existing data.

    Args:
        name: str. Dataset name: lower case letters, digits and `_`,
            starting with a letter, not a TFDS catalog name.
        folder: str or path-like. A corpus folder or file `load_corpus`
            reads (any local layout).
        data_dir: str or path-like. TFDS data directory to write to.
        version: str. Dataset version, `"MAJOR.MINOR.PATCH"`.
        char_symbols: bool or None. As in `load_corpus`.

    Returns:
        str. The source to pass to `load_corpus`: `"tfds:NAME"`.

    Raises:
        ValueError: for an invalid or catalog name or an unreadable folder.
    """
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(
            "`name` must be lower case letters, digits and underscores, "
            f"starting with a letter. Received: name={name!r}."
        )
    if not re.fullmatch(r"\d+\.\d+\.\d+", str(version)):
        raise ValueError(
            f"`version` must look like '1.0.0'. Received: version={version!r}."
        )
    tfds = _import_tfds()
    if name in tfds.list_builders(with_community_datasets=False):
        raise ValueError(
            f"name={name!r} is a TFDS catalog dataset; pick another name for "
            "a local corpus."
        )
    import tensorflow as tf

    corpus = load_corpus(folder, char_symbols=char_symbols)

    def lines(text: str) -> list[bytes]:
        if text.endswith("\n"):
            text = text[:-1]
        return [line.encode("utf-8", "replace") for line in text.split("\n")]

    split_datasets = {
        tfds_split: tf.data.Dataset.from_tensor_slices(
            lines(corpus.split(split))
        ).map(lambda line: {"text": line})
        for tfds_split, split in (
            ("train", "train"),
            ("validation", "valid"),
            ("test", "test"),
        )
    }
    tfds.dataset_builders.store_as_tfds_dataset(
        name=name,
        version=str(version),
        features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
        split_datasets=split_datasets,
        data_dir=os.fspath(data_dir),
        description=f"Local text corpus from {folder}, one line per example.",
        disable_shuffling=True,
    )
    logger.info("Stored %s as TFDS dataset %s in %s", folder, name, data_dir)
    return f"tfds:{name}"


# === The standard-library docstring corpus ===


def _stdlib_files(root: pathlib.Path) -> list[pathlib.Path]:
    files = []
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = [
            name
            for name in subdirectories
            if name not in _STDLIB_SKIP_DIRS and not name.startswith(".")
        ]
        files.extend(
            pathlib.Path(directory, name)
            for name in names
            if name.endswith(".py")
        )
    return sorted(files, key=lambda path: path.relative_to(root).as_posix())


_DOC_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
_BLOCK_FIELDS = ("body", "handlers", "orelse", "finalbody", "cases")


def _doc_nodes(node) -> Iterator[ast.AST]:
    """Modules, classes and functions under `node`, in source order.

    Only statement blocks are visited (definitions cannot hide inside
    expressions), which is much faster than `ast.walk`.
    """
    if isinstance(node, _DOC_NODES):
        yield node
    for field in _BLOCK_FIELDS:
        block = getattr(node, field, None)
        if isinstance(block, list):
            for child in block:
                yield from _doc_nodes(child)


_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _clean_docstring(text: str) -> str:
    """Drops doctest examples and control characters; trims whitespace."""
    kept, in_example = [], False
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped.startswith(">>>"):
            in_example = True
            continue
        if in_example:
            if stripped:
                continue  # continuation or expected output
            in_example = False
        kept.append(_CONTROL_CHARS.sub("", line).rstrip().expandtabs(4))
    text = "\n".join(kept).strip()
    return re.sub(r"\n{3,}", "\n\n", text)


def stdlib_docstrings(max_chars: int | None = None) -> Iterator[str]:
    """Docstrings of the Python standard library, deterministically.

    Walks `sysconfig.get_paths()["stdlib"]`, skipping `site-packages` and
    test folders, reads the `.py` files in sorted path order, parses each
    with `ast` (files that do not parse are skipped) and yields the module,
    class and function docstrings in source order, cleaned with
    `inspect.cleandoc` rules, without doctest examples, each only the first
    time it appears.

    Args:
        max_chars: int or None. Stop before the total length (counting one
            blank line between docstrings) would exceed this.

    Yields:
        str. One cleaned docstring.
    """
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise ValueError(f"the standard library folder {root} does not exist.")
    seen: set = set()
    total = 0
    for path in _stdlib_files(root):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # invalid escapes etc.
                tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError, OSError):
            continue
        for node in _doc_nodes(tree):
            docstring = ast.get_docstring(node, clean=True)
            if not docstring:
                continue
            docstring = _clean_docstring(docstring)
            if not docstring or docstring in seen:
                continue
            size = len(docstring) + 2
            if max_chars is not None and total + size > max_chars:
                return
            seen.add(docstring)
            total += size
            yield docstring


def prepare_stdlib_docs(
    folder, max_chars: int = DEFAULT_STDLIB_DOCS_CHARS
) -> pathlib.Path:
    """Writes the standard-library docstring corpus to `folder`.

    An offline demo corpus of real English text that exists wherever
    Python does: the docstrings from `stdlib_docstrings(max_chars)`, each
    followed by a blank line, cut into `train.txt`, `valid.txt` and
    `test.txt` at the docstring boundaries nearest to 90% and 95% of the
    characters. The files depend only on the Python installation and
    `max_chars` (about 1.7M characters exist in CPython 3.11, so the
    default cap of 3M takes all of them). A `stdlib_docs.json` manifest
    records how they were made and each file's size and sha256; if it
    matches, the files are reused (an edited file is written again).

    Args:
        folder: str or path-like. Output folder, created if needed.
        max_chars: int. Cap on the total number of characters.

    Returns:
        The folder, as a `pathlib.Path`; `load_corpus(folder)` reads it.

    Raises:
        ValueError: if `max_chars` is too small to hold three docstrings.

    Example:

    >>> folder = prepare_stdlib_docs("/tmp/stdlib_docs", max_chars=200_000)
    >>> sorted(p.name for p in folder.glob("*.txt"))
    ['test.txt', 'train.txt', 'valid.txt']
    """
    if (
        isinstance(max_chars, bool)
        or not isinstance(max_chars, int)
        or max_chars < 1
    ):
        raise ValueError(
            "`max_chars` must be a positive integer. Received: "
            f"max_chars={max_chars!r}."
        )
    folder = pathlib.Path(folder)
    manifest = {
        "source": "docstrings of the Python standard library",
        "python": sys.version.split()[0],
        "implementation": sys.implementation.name,
        "stdlib": sysconfig.get_paths()["stdlib"],
        "max_chars": max_chars,
    }
    manifest_path = folder / _STDLIB_MANIFEST
    if manifest_path.is_file() and all(
        (folder / name).is_file() for name in _TEXT_FILES.values()
    ):
        try:
            written = json.loads(manifest_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            written = {}
        sizes = written.get("bytes") or {}
        digests = written.get("sha256") or {}
        # Sizes first (cheap), then the content: an edit that keeps the
        # size (a typo fixed, a flipped byte) is written over, not reused.
        if {key: written.get(key) for key in manifest} == manifest and all(
            sizes.get(split) == (folder / name).stat().st_size
            for split, name in _TEXT_FILES.items()
        ) and all(
            digests.get(split)
            == hashlib.sha256((folder / name).read_bytes()).hexdigest()
            for split, name in _TEXT_FILES.items()
        ):
            logger.info("Reusing the stdlib docstring corpus in %s", folder)
            return folder

    docstrings = [doc + "\n\n" for doc in stdlib_docstrings(max_chars)]
    total = sum(map(len, docstrings))
    count = len(docstrings)
    if count < 3:
        raise ValueError(
            f"max_chars={max_chars} is too small: it holds {count} "
            f"docstring(s) ({total} characters), but train, valid and test "
            "need one each. Use a larger max_chars (e.g. 10000 or more)."
        )
    # Cut at the docstring boundaries nearest to 90% and 95% of the
    # characters, leaving at least one docstring in each split.
    ends = np.cumsum([len(doc) for doc in docstrings])
    first = int(np.argmin(np.abs(ends - 0.90 * total))) + 1
    second = int(np.argmin(np.abs(ends - 0.95 * total))) + 1
    first = min(max(first, 1), count - 2)
    second = min(max(second, first + 1), count - 1)
    splits = {
        "train": docstrings[:first],
        "valid": docstrings[first:second],
        "test": docstrings[second:],
    }
    folder.mkdir(parents=True, exist_ok=True)
    # The manifest goes first and comes back last, each file written whole
    # (a killed writer leaves no manifest, so the next call writes again),
    # and it records each file's size, checked before reuse.
    manifest_path.unlink(missing_ok=True)
    sizes, sizes_bytes, digests = {}, {}, {}
    for split, name in _TEXT_FILES.items():
        text = "".join(splits[split])
        data = text.encode("utf-8")
        atomic_write_bytes(folder / name, data)
        sizes[split], sizes_bytes[split] = len(text), len(data)
        digests[split] = hashlib.sha256(data).hexdigest()
    manifest["chars"] = sizes
    manifest["bytes"] = sizes_bytes
    manifest["sha256"] = digests
    manifest["docstrings"] = len(docstrings)
    atomic_write_bytes(manifest_path, (json.dumps(manifest, indent=2) + "\n").encode("utf-8"))
    logger.info(
        "Wrote %d stdlib docstrings (%d characters) to %s",
        len(docstrings),
        total,
        folder,
    )
    return folder


# === Streaming sources (bounded memory) ===

# Bytes read per chunk before cutting at the next newline.
DEFAULT_CHUNK_BYTES = 4 << 20
# A chunk is extended by at most min(chunk_bytes, this) bytes to end at a
# newline. A longer line is cut inside, where the tokenizer gives the same
# ids on both sides (`_cut_places`), so a chunk holds about chunk_bytes +
# 1 MiB, also on a single-line corpus such as text8.
_MAX_LINE_BYTES = 1 << 20
# Where a line holds no such place (LM1B's `double_eos`: "<S> words <S>" per
# line, where any cut would add two <S>; a word tokenizer on a line without
# whitespace), the chunk grows up to this far past chunk_bytes to reach one;
# past it, the line is refused rather than cut inexactly.
_MAX_SENTENCE_BYTES = 64 << 20
# Bytes read at a time while looking for the end of a line.
_READ_BYTES = 1 << 20

# FastWordpieceTokenizer splits words at ASCII whitespace only (without
# `lower_case`, U+00A0, U+3000 and the like join words; measured).
_WORDPIECE_SEPARATORS = (b" ", b"\t", b"\x0b", b"\x0c", b"\r")
# SentencePiece (identity normalization, no dummy prefix) starts a piece at
# every space and at no other whitespace: a tab or U+3000 may sit inside a piece.
_SPACE = (b" ",)


def _cut_places(kind: str | None, double_eos: bool) -> tuple:
    """Where a chunk may end inside a line for tokenizer `kind`: `(separators,
    anywhere)`: before the last of `separators`, else (with `anywhere`) at
    any character boundary, else nowhere (the chunk grows). `kind=None`:
    before a space, where every kind gives the same ids, else anywhere (exact
    for `char` and `byte` only: callers that encode pass their kind)."""
    if double_eos:
        return (), False  # "<S> words <S>" per line: a cut would add two <S>
    if kind is None or kind in ("char", "byte"):
        return _SPACE, True  # char, byte: any boundary; a space gives tidier chunks
    if kind == "word":
        # Its own whitespace but "\n", which chunks already end after, as
        # bytes (a chunk is cut in bytes; a UTF-8 separator cannot start
        # inside another character). Imported here: this module reads
        # corpora without TensorFlow, which the tokenizers import.
        from keras_txl.tokenizers import UNICODE_WHITESPACE

        return tuple(c.encode() for c in UNICODE_WHITESPACE if c != "\n"), False
    if kind == "wordpiece":
        return _WORDPIECE_SEPARATORS, False
    return _SPACE, False  # sentencepiece, and any kind not known here


def _character_boundary(block) -> int:
    """The last UTF-8 character boundary of `block`: its end, or the start of
    a last character that is not complete."""
    end = len(block)
    for back in range(1, min(4, end) + 1):
        byte = block[end - back]
        if byte < 0x80:
            return end  # ASCII: a boundary after it
        if byte >= 0xC0:  # the lead byte of the last character
            needed = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return end if back >= needed else end - back
    return end


def _long_line_cut(block, start: int, places: tuple, *, universal_newlines: bool):
    """Where to end a chunk inside `block`, a window of a line too long to
    extend to its end, or None if `block[start:]` (the bytes not searched
    before) holds no place to do so: after the last line end (a lone `"\r"`
    too, for text read with universal newlines); else before the last of
    `places` (see `_cut_places`), where the tokenizer's ids are the same on
    both sides; else, where `places` allows it anywhere, at the last UTF-8
    character boundary.
    Never between a `"\r"` and a `"\n"` that may follow it."""
    low = max(0, start - 4)  # a separator may straddle `start`
    cut = block.rfind(b"\n", low) + 1
    if universal_newlines:  # a "\r" at the very end may be half of "\r\n"
        cut = max(cut, block.rfind(b"\r", low, len(block) - 1) + 1)
    if cut > 0:
        return cut
    separators, anywhere = places
    cut = max((block.rfind(sep, max(low, 1)) for sep in separators), default=-1)
    if cut > 0:
        return cut
    if not anywhere:
        return None
    cut = _character_boundary(block)
    if universal_newlines and cut > 1 and block[cut - 1] == 0x0D:
        cut -= 1  # keep a final "\r" for the next chunk
    return cut if cut > 0 else len(block)


@dataclasses.dataclass(frozen=True)
class _FilePart:
    path: str
    start: int = 0
    stop: int | None = None  # None: to the end of the file


class CorpusSource:
    """A corpus that is read in chunks, never as a whole.

    What `load_corpus` returns as three strings, `open_corpus_source`
    returns as three streams: `chunks(split)` yields pieces of text of about
    `chunk_bytes` that each end after a newline, together with a cursor from
    which `chunks(split, cursor)` resumes. A line that does not end within
    `min(chunk_bytes, 1 MiB)` bytes past `chunk_bytes` is cut inside, only
    where the tokenizer the chunks are for (`chunks(..., kind=)`) gives the
    same ids on both sides: before any of its whitespace for `word` (every
    `UNICODE_WHITESPACE` character, multi-byte ones included) and
    `wordpiece`, before a space for `sentencepiece`, at any UTF-8 character
    boundary for `char` and `byte`, nowhere with `double_eos`. A line with
    no such place grows its chunk until one comes, up to 64 MiB, and is
    refused past that. Concatenated, the chunks are the split's text as
    `load_corpus` reads it; encoded one by one with that tokenizer they give
    the same token ids as the whole text (the tokenizers encode line by
    line).

    Text files (`errors="strict"`) must be UTF-8 and hold no NUL byte
    (a binary or UTF-16 file): anything else is a ValueError naming the
    file and the byte. With `universal_newlines`
    (the files of a folder) `"\r\n"` and a lone `"\r"` are read as `"\n"`;
    a raw file cut into three (a single file, `text8`) keeps every byte, and
    the bytes of a character that the cut falls inside stay on each side
    (as `surrogateescape` stand-ins). A text file's byte order mark (U+FEFF
    at its first byte) is dropped; a U+FEFF elsewhere is text. With
    `universal_newlines` every file
    is read as lines, as the reference `vocabulary.py` reads it: a last line
    without a newline is given one (its `<eos>`), so it never runs into the
    first line of the next file (LM1B's training files). A raw `enwik8` (`errors=
    "surrogateescape"`) may hold any bytes: the byte tokenizer encodes them
    back exactly.

    Attributes as in `Corpus`: `name`, `layout`, `source`, `char_symbols`,
    `tokenizer_kind`, `tokenizer_options`, `vocabulary_splits`.
    """

    def __init__(self, *, name, layout, source, parts=None, tfds_spec=None,
                 char_symbols=False, tokenizer_kind="word",
                 tokenizer_options=None, vocabulary_splits=("train",),
                 errors="strict", chunk_bytes=DEFAULT_CHUNK_BYTES,
                 data_dir=None, text_feature=None, split_names=None,
                 universal_newlines=True):
        if errors not in ("strict", "surrogateescape"):
            raise ValueError("`errors` must be 'strict' (text) or 'surrogateescape' "
                             f"(bytes). Received: errors={errors!r}.")
        self.name = name
        self.layout = layout
        self.source = source
        self.char_symbols = char_symbols
        self.tokenizer_kind = tokenizer_kind
        self.tokenizer_options = dict(tokenizer_options or {})
        self.vocabulary_splits = tuple(vocabulary_splits)
        self.chunk_bytes = chunk_bytes
        self._parts = parts or {}
        self._errors = errors
        self._universal_newlines = bool(universal_newlines)
        self._cut_characters: dict = {}
        self._tfds = tfds_spec
        self._data_dir = data_dir
        self._text_feature = text_feature
        self._split_names = split_names

    def __repr__(self):
        return (f"CorpusSource(name={self.name!r}, layout={self.layout!r}, "
                f"source={self.source!r})")

    # --- identity ---

    def files(self) -> list[str]:
        """Every file the splits are read from (sorted, unique)."""
        if self._tfds is not None:
            builder = self._tfds["builder"]
            root = os.fspath(builder.data_path)
            return sorted(
                os.path.join(d, n) for d, _, names in os.walk(root) for n in names
            )
        return sorted({part.path for parts in self._parts.values() for part in parts})

    def split_origins(self) -> dict:
        """{split: where its text comes from}, for messages: the file, or the
        file and the part of it (a raw file cut into three), or the TFDS split."""
        if self._tfds is not None:
            return {split: f"{self.source} split {self._tfds['splits'][split]!r}"
                    for split in SPLITS}
        out = {}
        for split in SPLITS:
            names = []
            for part in self._parts[split]:
                whole = part.start == 0 and part.stop is None
                names.append(part.path if whole else f"{part.path} ({split} part)")
            out[split] = ", ".join(names)
        return out

    def stat_key(self) -> list:
        """`[[path, size, mtime_ns, ctime_ns, inode], ...]` of `files()`: a
        cheap check that nothing changed (a changed one is then compared by
        content). Size and mtime can be set back after an edit (`touch -d`);
        the ctime (set by the kernel on every write, rename or `touch`) and
        the inode (a file replaced by another) cannot."""
        out = []
        for path in self.files():
            info = os.stat(path)
            out.append([os.path.abspath(path), info.st_size, info.st_mtime_ns,
                        info.st_ctime_ns, info.st_ino])
        return out

    def content_sha256(self) -> str:
        """sha256 over the bytes each split is read from (ranges of files,
        or a TFDS dataset's files), in bounded memory. A moved copy of a
        corpus has the same one."""
        digest = hashlib.sha256()
        if self._tfds is not None:
            digest.update(json.dumps(self.identity()).encode())
            root = os.fspath(self._tfds["builder"].data_path)
            for path in self.files():
                digest.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as handle:
                    for block in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(block)
            return digest.hexdigest()
        for split in SPLITS:
            digest.update(split.encode() + b"\0")
            for part in self._parts[split]:
                digest.update(os.path.basename(part.path).encode() + b"\0")
                for block in self._read_part(part, 0):
                    digest.update(block)
        return digest.hexdigest()

    def identity(self) -> dict:
        """What, besides the bytes, decides the text: layout and options."""
        out = {"layout": self.layout, "char_symbols": self.char_symbols}
        if self._tfds is not None:
            out.update(tfds=self._tfds["name"], feature=self._tfds["feature"],
                       splits=self._tfds["splits"],
                       version=str(self._tfds["builder"].info.version))
        return out

    # --- reading ---

    def _read_part(self, part: _FilePart, offset: int):
        """Yields the bytes of `part` from `offset`, in 1 MiB blocks."""
        with _open_binary(part.path) as handle:
            handle.seek(part.start + offset)
            left = None if part.stop is None else part.stop - part.start - offset
            while left is None or left > 0:
                block = handle.read(1 << 20 if left is None else min(1 << 20, left))
                if not block:
                    return
                if left is not None:
                    left -= len(block)
                yield block

    def chunks(self, split: str, cursor=None, *, kind: str | None = None,
               double_eos: bool | None = None) -> Iterator[tuple[str, list]]:
        """Yields `(text, cursor_after)` for split `split` from `cursor`.

        Args:
            split: str. `"train"`, `"valid"` or `"test"`.
            cursor: list or None. A cursor yielded before (resume there),
                or None for the start.
            kind: str or None. The tokenizer kind the chunks are encoded
                with: a line too long for one chunk is cut only where this
                kind gives the same ids on both sides (a line with no such
                place grows the chunk, up to 64 MiB, then is refused). None:
                before a space (the same ids for every kind), else at any
                character boundary (the same ids for `char` and `byte`
                only). A resumed read must pass the same.
            double_eos: bool or None. The word tokenizer's `double_eos`
                (no cut inside a line at all); None: the corpus's own.
        """
        if split not in SPLITS:
            raise ValueError(f"`split` must be one of {SPLITS}. Received: split={split!r}.")
        if self._tfds is not None:
            yield from self._tfds_chunks(split, cursor)
            return
        if double_eos is None:
            double_eos = (kind in (None, self.tokenizer_kind)
                          and bool(self.tokenizer_options.get("double_eos", False)))
        # Pieces shorter than a chunk (the small files of a folder, one
        # piece each) are joined up to `chunk_bytes`: each is encoded with
        # one call, and thousands of small files were thousands of calls.
        # Joined pieces give the ids they give one by one (each ends after
        # a newline or at a place to cut), and a window starts at the
        # cursor it resumes from, so a resumed read gives the same chunks.
        pending, pending_bytes, pending_after = [], 0, None
        for text, after, length in self._file_chunks(split, cursor, kind, double_eos):
            if pending and pending_bytes + length > self.chunk_bytes:
                yield "".join(pending), pending_after
                pending, pending_bytes = [], 0
            pending.append(text)
            pending_bytes += length
            pending_after = after
        if pending:
            yield "".join(pending), pending_after

    def _file_chunks(self, split, cursor, kind, double_eos):
        """The pieces `chunks` joins: `(text, cursor_after, bytes)`, one
        file's text at a time."""
        places = _cut_places(kind, bool(double_eos))
        part_index, offset = cursor or (0, 0)
        parts = self._parts[split]
        size = self.chunk_bytes
        soft = size + max(4, min(size, _MAX_LINE_BYTES))
        if places == ((), False):
            soft = size + _MAX_SENTENCE_BYTES
        hard = size + _MAX_SENTENCE_BYTES
        while part_index < len(parts):
            part = parts[part_index]
            with _open_binary(part.path) as handle:
                handle.seek(part.start + offset)
                left = None if part.stop is None else part.stop - part.start - offset
                window, ended = bytearray(), left == 0
                while True:
                    # `size` bytes, then on to the first newline after them,
                    # reading up to `soft` bytes; past it, on to the first
                    # place where the line may be cut, up to `hard` bytes.
                    cut, scan, searched = None, size - 1, 0
                    while cut is None:
                        if len(window) < size:
                            want = size
                        else:
                            want = min(soft if len(window) < soft else hard,
                                       len(window) + _READ_BYTES)
                        if not ended and len(window) < want:
                            count = want - len(window)
                            if left is not None:
                                count = min(count, left)
                            data = handle.read(count)
                            if left is not None:
                                left -= len(data)
                            ended = len(data) < count or left == 0
                            window += data
                        if len(window) < size:
                            cut = len(window) if ended else None
                            continue
                        newline = window.find(b"\n", scan)
                        scan = len(window)
                        if newline >= 0:
                            cut = newline + 1
                        elif ended:
                            cut = len(window)
                        elif len(window) >= soft:
                            cut = _long_line_cut(
                                window, searched, places,
                                universal_newlines=self._universal_newlines)
                            searched = len(window)
                            if cut is None and len(window) >= hard:
                                raise self._uncuttable(part, part.start + offset, kind,
                                                       double_eos, len(window))
                    if not cut:
                        break
                    block = bytes(window[:cut])
                    del window[:cut]
                    position = part.start + offset
                    offset += cut
                    text = self._decode(block, part, position)
                    if self._universal_newlines and text and not text.endswith("\n"):
                        # A text file is lines: its last line ends there even
                        # without a newline, as the reference reads files
                        # (an <eos> for it; never run into the next file).
                        if not ended and not window:
                            # The end of the file? Read on, as the next chunk
                            # would (at most `size` bytes: the same chunks).
                            count = size if left is None else min(size, left)
                            data = handle.read(count)
                            if left is not None:
                                left -= len(data)
                            ended = len(data) < count or left == 0
                            window += data
                        if ended and not window:
                            text += "\n"
                    yield text, [part_index, offset], cut
            part_index, offset = part_index + 1, 0

    def _uncuttable(self, part, position, kind, double_eos, length) -> ValueError:
        if double_eos:
            why = ("with double_eos every line is one sentence, \"<S> words <S>\": a cut "
                   "inside it would add two <S>")
        elif kind in ("word", "wordpiece"):
            why = f"the {kind} tokenizer would read a word cut in two as two words"
        else:
            why = (f"the {kind} tokenizer starts its pieces only at a space, so a cut "
                   "elsewhere could change them")
        return ValueError(
            f"{part.path}: the line at byte {position} runs on for more than "
            f"{length:,} bytes with no place to cut it into chunks ({why}). Break the "
            "line (newlines, or spaces between words), or use a tokenizer that can cut "
            "anywhere (--tokenizer char or byte).")

    def _decode(self, block: bytes, part: _FilePart, position: int) -> str:
        """The text of `block`, the bytes of `part` from file offset
        `position` (see the class docstring for the rules)."""
        if self._errors == "surrogateescape":
            return block.decode("utf-8", "surrogateescape")
        nul = block.find(b"\0")
        if nul >= 0:
            # Valid UTF-8, but no text: a binary file, or UTF-16 text (a NUL
            # after every ASCII character), given by mistake.
            raise ValueError(
                f"{part.path} holds a NUL byte (at byte {position + nul}): it is not "
                "text but a binary file, or text saved as UTF-16 (save it as UTF-8). "
                "Text corpora must be UTF-8 text; only a raw `enwik8` file (or "
                "enwik8.zip) is read as bytes, for the byte tokenizer.")
        low, high = 0, len(block)
        # A raw file cut at byte positions: the part of a character that a
        # cut falls inside is kept as bytes (not an error) on each side.
        if part.start and position < part.start + 3 and max(block[:3], default=0) >= 0x80:
            _, end = self._cut_character(part.path, part.start)
            low = min(high, max(0, end - position))
        if (part.stop is not None and position + len(block) > part.stop - 3
                and max(block[-3:], default=0) >= 0x80):
            lead, _ = self._cut_character(part.path, part.stop)
            high = min(high, max(low, lead - position))
        try:
            text = block[low:high].decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{part.path} is not valid UTF-8 text (near byte "
                f"{position + low + error.start}). Text corpora must be UTF-8; "
                "only a raw `enwik8` file (or enwik8.zip) is read as bytes, for "
                "the byte tokenizer."
            ) from None
        if low or high < len(block):
            text = (block[:low].decode("utf-8", "surrogateescape") + text
                    + block[high:].decode("utf-8", "surrogateescape"))
        if position == 0 and text.startswith("\ufeff"):
            # A text file's byte order mark (Notepad writes one) is not text:
            # it would glue itself to the first word (a folder's file, or a
            # single file, whose split sizes leave it out: `_raw_source`).
            text = text[1:]
        if self._universal_newlines and "\r" in text:
            # Text files: universal newlines, as read_text does. A chunk
            # never ends between "\r" and "\n".
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        return text

    def _cut_character(self, path: str, at: int) -> tuple[int, int]:
        """`(start, end)` of the valid UTF-8 character of `path` that byte
        offset `at` falls strictly inside, else `(at, at)`."""
        key = (path, at)
        if key not in self._cut_characters:
            first = max(0, at - 3)
            with _open_binary(path) as handle:
                handle.seek(first)
                around = handle.read(at + 3 - first)
            found = (at, at)
            for lead in range(at - 1, first - 1, -1):
                byte = around[lead - first]
                if 0x80 <= byte < 0xC0:
                    continue  # a continuation byte: the lead is further back
                if byte >= 0xC0:
                    size = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
                    piece = around[lead - first:lead - first + size]
                    if lead + size > at and len(piece) == size:
                        try:
                            piece.decode("utf-8")
                            found = (lead, lead + size)
                        except UnicodeDecodeError:
                            pass
                break
            self._cut_characters[key] = found
        return self._cut_characters[key]

    def _tfds_chunks(self, split, cursor):
        import tensorflow as tf

        tfds = _import_tfds()
        spec = self._tfds
        done = int(cursor[1]) if cursor else 0
        read_config = tfds.ReadConfig(interleave_cycle_length=1)
        dataset = spec["builder"].as_dataset(
            split=spec["splits"][split], shuffle_files=False, read_config=read_config
        )
        feature = spec["feature"]
        dataset = dataset.map(lambda example: example[feature])
        if done:
            dataset = dataset.skip(done)
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
        pieces, size = [], 0
        for value in dataset.as_numpy_iterator():
            text = _tfds_text(value, spec["name"], spec["splits"][split], done)
            pieces.append(text if text.endswith("\n") else text + "\n")
            size += len(value)
            done += 1
            if size >= self.chunk_bytes:
                yield "".join(pieces), [0, done]
                pieces, size = [], 0
        if pieces:
            yield "".join(pieces), [0, done]


class _open_binary:
    """`open(path, "rb")`, or the one member of a `.zip` (seekable)."""

    def __init__(self, path):
        self.path = path
        self._archive = None

    def __enter__(self):
        if self.path.endswith(".zip"):
            member = pathlib.Path(self.path).stem
            self._handle = _ZipMember(self.path, member)
            self._archive = self._handle.guard(zipfile.ZipFile, self.path)
            try:
                self._handle.handle = self._handle.guard(self._archive.open, member)
            except BaseException:
                self._archive.close()
                raise
        else:
            self._handle = open(self.path, "rb")
        return self._handle

    def __exit__(self, *exc):
        self._handle.close()
        if self._archive is not None:
            self._archive.close()
        return False


class _ZipMember:
    """A zip member's reader whose damage (a bad CRC, a broken deflate
    stream, a cut file) is a ValueError naming the archive, not zlib's or
    zipfile's own error from deep inside a read."""

    def __init__(self, path, member):
        self.path, self.member, self.handle = path, member, None

    def guard(self, call, *args):
        try:
            return call(*args)
        except (zipfile.BadZipFile, zlib.error, EOFError) as error:
            raise ValueError(
                f"{self.path} is damaged: its member {self.member!r} cannot be read "
                f"({type(error).__name__}: {error}). Download it again (or unzip "
                "a good copy and pass the file)."
            ) from None

    def read(self, size=-1):
        return self.guard(self.handle.read, size)

    def seek(self, offset, whence=0):
        return self.guard(self.handle.seek, offset, whence)

    def close(self):
        if self.handle is not None:
            self.handle.close()


def _zip_member_size(path: pathlib.Path) -> int:
    member = path.stem
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            if member not in names:
                if any(pathlib.PurePosixPath(name).name in _LAYOUT_MARKS
                       or pathlib.PurePosixPath(name).name.startswith("wiki.")
                       for name in names):  # e.g. wikitext-103-v1.zip
                    raise ValueError(
                        f"{path} holds a corpus folder ({names[:5]}), not one raw "
                        f"file named {member!r}: unzip it and pass the folder it makes.")
                raise ValueError(
                    f"{path} must contain a file named {member!r}; it holds {names[:5]}."
                )
            return archive.getinfo(member).file_size
    except zipfile.BadZipFile:
        raise ValueError(f"{path} is not a valid zip file.") from None


def _raw_source(path: pathlib.Path, layout: str, **common) -> CorpusSource:
    total = _zip_member_size(path) if path.suffix == ".zip" else path.stat().st_size
    # A text file's byte order mark is not text (dropped when read, see
    # `_decode`): the 90/5/5 split is of the bytes after it, so the file
    # gives the same splits as without it. The raw enwik8 is bytes: kept.
    bom = 0
    if layout != "enwik8" and total >= len(_BOM):
        with _open_binary(str(path)) as handle:
            bom = len(_BOM) if handle.read(len(_BOM)) == _BOM else 0
    if total - bom == 0:
        raise ValueError(f"corpus file {path} is empty"
                         + (" (it holds only a byte order mark)." if bom else "."))
    train, valid, _ = standard_split_sizes(total - bom)
    cuts = (0, bom + train, bom + train + valid, total)
    # Cuts are at byte positions (as in the prep scripts) and may fall inside a UTF-8
    # character: its bytes stay on each side (surrogateescape), and the byte tokenizer
    # encodes them back exactly. Raw files keep every byte ("\r" included); only the
    # raw enwik8, the byte-level corpus, may hold bytes that are not UTF-8.
    parts = {split: [_FilePart(str(path), cuts[i], cuts[i + 1])]
             for i, split in enumerate(SPLITS)}
    if layout == "enwik8":
        kind, vocabulary, errors = "byte", SPLITS, "surrogateescape"
    else:
        kind, errors = "char", "strict"
        vocabulary = SPLITS if layout == "text8" else ("train",)
    return CorpusSource(
        name=path.stem if path.suffix == ".zip" else path.name, layout=layout,
        source=str(path), parts=parts, tokenizer_kind=kind,
        vocabulary_splits=vocabulary, errors=errors, universal_newlines=False,
        **common)


_LM1B_FOLDER = "1-billion-word-language-modeling-benchmark-r13output"
_LM1B_VOCABULARY = "1b_word_vocab.txt"


def _lm1b_source(folder: pathlib.Path, **common):
    """The official LM1B layout (`1-billion-word-language-modeling-benchmark-
    r13output`): train on every `news.en-*` file in sorted order; valid and
    test are held-out shard 0, as the reference `data_utils.py` does. Also
    the folder the reference `getdata.sh` makes, `one-billion-words/`: that
    folder extracted in it, with `1b_word_vocab.txt` beside it (and copies
    of held-out shard 0 as `valid.txt`/`test.txt`, not read)."""
    root = folder
    if (not (folder / "training-monolingual.tokenized.shuffled").is_dir()
            and (folder / _LM1B_FOLDER).is_dir()):
        root = folder / _LM1B_FOLDER
    train_dir = root / "training-monolingual.tokenized.shuffled"
    heldout = (root / "heldout-monolingual.tokenized.shuffled"
               / "news.en.heldout-00000-of-00050")
    if not train_dir.is_dir() or not heldout.is_file():
        return None
    train = sorted(str(p) for p in train_dir.glob("news.en-*"))
    if not train:
        raise ValueError(f"{train_dir} holds no news.en-* training files.")
    for path in train:
        if not os.path.isfile(path):
            if os.path.islink(path) and not os.path.exists(path):
                why = f"a symbolic link to {os.readlink(path)!r}, which does not exist"
            elif os.path.isdir(path):
                why = "a folder"
            else:
                why = "not a regular file"
            raise ValueError(
                f"{path} is {why}, but every news.en-* in {train_dir} is read as a "
                "training file of the LM1B layout: move it out of that folder.")
    parts = {"train": [_FilePart(p) for p in train],
             "valid": [_FilePart(str(heldout))], "test": [_FilePart(str(heldout))]}
    options = {"double_eos": True}
    # getdata.sh downloads the vocabulary beside the extracted folder.
    places = (root, root.parent)
    vocab = next((place / _LM1B_VOCABULARY for place in places
                  if (place / _LM1B_VOCABULARY).is_file()), None)
    if vocab is not None:
        options["vocabulary_file"] = str(vocab)
    else:
        logger.warning(
            "%s: no %s in %s: the vocabulary is counted on the training files, "
            "not the paper's fixed one (pass --vocabulary-file to use it).",
            folder, _LM1B_VOCABULARY, " or ".join(str(place) for place in places))
    return CorpusSource(name=folder.name, layout="lm1b", source=str(folder),
                        parts=parts, tokenizer_kind="word",
                        tokenizer_options=options, **common)


def open_corpus_source(
    source,
    *,
    char_symbols: bool | None = None,
    data_dir=None,
    download: bool = False,
    text_feature: str | None = None,
    split_names: Mapping[str, str] | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    cli_flags: bool | str = False,
) -> CorpusSource:
    """Opens a corpus for streaming: the layouts of `load_corpus`, read in
    chunks (see `CorpusSource`), plus the official LM1B folder layout.

    Args:
        source, char_symbols, data_dir, download, text_feature, split_names:
            as in `load_corpus`.
        chunk_bytes: int. Bytes per chunk (before cutting at a newline).
        cli_flags: bool or "prepare_data". True: errors name the flags
            (`--data-dir`, `--download`, `--tfds-text-feature`, `--tfds-split`;
            for `txl prepare`/`train`/`eval`) instead of `data_dir=`,
            `download=True`, `text_feature=`, `split_names=`;
            "prepare_data": the arguments of `prepare_data` (its `tfds` dict).

    Returns:
        A `CorpusSource`.
    """
    from keras_txl import checks

    chunk_bytes = checks.positive_int("chunk_bytes", chunk_bytes)
    common = {"chunk_bytes": chunk_bytes}
    if isinstance(source, str) and source.startswith("tfds:"):
        tfds = _import_tfds()
        name = _parse_tfds_name(source[len("tfds:"):])
        if cli_flags not in _TFDS_NAMES:
            raise ValueError(f"`cli_flags` must be True, False or 'prepare_data'. "
                             f"Received: cli_flags={cli_flags!r}.")
        named = _TFDS_NAMES[cli_flags]
        builder = _tfds_builder(tfds, name, data_dir, download, named)
        feature = _tfds_text_feature(builder, text_feature, named)
        names = _tfds_split_names(builder, split_names, named)
        kind = "char" if builder.name in _TFDS_CHAR_DATASETS else "word"
        options = {"double_eos": True} if builder.name == "lm1b" else {}
        if builder.name == "lm1b" and split_names is None:
            logger.warning(
                "tfds:lm1b: TFDS's test split holds all 50 held-out shards in "
                "its stored order; the paper evaluates on held-out shard 0. For "
                "comparable perplexities pass the official LM1B folder as --data.")
        return CorpusSource(
            name=name, layout="tfds", source=source, tokenizer_kind=kind,
            tokenizer_options=options,
            tfds_spec={"name": name, "builder": builder, "feature": feature,
                       "splits": names}, **common)
    if not isinstance(source, (str, os.PathLike)):
        raise ValueError(
            "`source` must be a folder, a file or 'tfds:NAME'. Received "
            f"type {type(source).__name__}."
        )
    _refuse_tfds_arguments(
        source, {"data_dir": data_dir, "download": download, "text_feature": text_feature,
                 "split_names": split_names}, _TFDS_ONLY.get(cli_flags, _TFDS_ONLY[False]))
    path = pathlib.Path(source).expanduser()
    if path.is_file():
        if char_symbols:
            raise ValueError(
                "char_symbols=True applies to train.txt/valid.txt/test.txt "
                f"folders, but {path} is a single file."
            )
        stem = path.stem if path.suffix == ".zip" else path.name
        return _raw_source(path, stem if stem in _RAW_NAMES else "raw-file", **common)
    if not path.is_dir():
        what = ("is neither a regular file nor a folder (a FIFO, a device or a socket)"
                if os.path.exists(path) else "does not exist")
        raise ValueError(
            f"corpus path {path} {what} (expected a folder, a file or 'tfds:NAME')."
        )
    lm1b = _lm1b_source(path, **common)
    if lm1b is not None:
        return lm1b
    found = _wikitext_layout(path, char_symbols)
    if found is not None:
        paths, layout, kind = found
        return CorpusSource(
            name=path.name, layout=layout, source=str(path),
            parts={s: [_FilePart(str(paths[s]))] for s in SPLITS},
            tokenizer_kind=kind,
            tokenizer_options=dict(_WIKITEXT_OPTIONS) if layout == "wikitext" else {},
            **common)
    paths = _complete_layout(path, _TEXT_FILES)
    if paths is not None:
        parts = {s: [_FilePart(str(paths[s]))] for s in SPLITS}
        if char_symbols is None:
            char_symbols = _looks_like_symbols(paths["train"])
        if char_symbols:
            return CorpusSource(
                name=path.name, layout="char-symbols", source=str(path),
                parts=parts, char_symbols=True, tokenizer_kind="word",
                tokenizer_options=dict(_SYMBOL_OPTIONS), vocabulary_splits=SPLITS,
                **common)
        return CorpusSource(name=path.name, layout="splits", source=str(path),
                            parts=parts, **common)
    for name in _RAW_NAMES:
        for candidate in (path / name, path / f"{name}.zip"):
            if candidate.is_file():
                if char_symbols:
                    raise ValueError(
                        "char_symbols=True applies to train.txt/valid.txt/"
                        f"test.txt folders, but {path} holds the raw "
                        f"{candidate.name}."
                    )
                return _raw_source(candidate, name, **common)
    inside = _corpus_subfolders(path)
    raise ValueError(
        f"corpus folder {path} has no known layout. Expected train.txt, "
        "valid.txt and test.txt; or wiki.{train,valid,test}.tokens "
        "(WikiText); or a raw enwik8 / text8 file (or .zip); or the LM1B "
        "folder (training-monolingual.tokenized.shuffled/ and "
        "heldout-monolingual.tokenized.shuffled/)."
        + (f" Its subfolder {inside[0]} has one: pass that folder." if inside else "")
    )


# A file (or folder) that marks a corpus layout, for the hint of an error.
_LAYOUT_MARKS = ("train.txt", "wiki.train.tokens", "wiki.train.raw", "enwik8",
                 "enwik8.zip", "text8", "text8.zip",
                 "training-monolingual.tokenized.shuffled")


def _corpus_subfolders(path: pathlib.Path) -> list:
    """The subfolders of `path` holding a corpus layout (an unzipped
    `wikitext-103-v1.zip` makes `wikitext-103/` inside the folder given)."""
    try:
        subfolders = sorted(p for p in path.iterdir() if p.is_dir())
    except OSError:
        return []
    return [str(p) for p in subfolders
            if any((p / mark).exists() for mark in _LAYOUT_MARKS)]
