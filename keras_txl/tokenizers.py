"""Tokenizers for language-model corpora: keras-hub layers on tensorflow-text.

Every tokenizer is a Keras layer, a `keras_hub.tokenizers.Tokenizer`
(through `TransformerXLTokenizer`), that travels inside a saved model:

- `tokenize(inputs)` (also `tokenizer(inputs)`): a string scalar gives 1-D
  int32 ids, a `(B,)` batch a `tf.RaggedTensor` `(B, None)`; graph ops
  only (tf.strings, tensorflow-text, tf.lookup), so it runs in
  `tf.data.Dataset.map`, a `tf.function` and a SavedModel;
- `detokenize(ids)`: the inverse, 1-D ids to a string scalar, `(B, N)`
  (dense or ragged) to `(B,)` strings; ids outside
  `[0, vocabulary_size())` are a `ValueError` (in a graph, where they are
  not known, a failed `tf.debugging` assertion with the same words), and
  `[]` gives `""`;
- keras-hub's `vocabulary_size()` (a method), `get_vocabulary()`,
  `id_to_token`, `token_to_id`, `end_token_id`, `start_token_id`,
  `pad_token_id`, `save_assets` / `load_assets`, `get_config`.

For whole documents or corpus splits (eager, numpy):

- `encode(text) -> np.ndarray` (int32, shape `(N,)`), cut into pieces at
  newlines so that a corpus never becomes one huge tensor; equal to
  `tokenize(text)`;
- `decode(ids) -> str`;
- `eos_id` / `unk_id` (int or None), `unit`, `bits_metric`,
  `unknown_characters(text)`;
- `check_model_vocabulary(vocabulary_size)`, which raises a `ValueError`
  when a model was built for a different vocabulary;
- `save(directory)`, which writes keras-hub's preset layout:
  `tokenizer.json` (the layer's Keras serialization) and
  `assets/tokenizer/` (`vocabulary.txt`, `vocabulary.json` or
  `vocabulary.spm`; never pickle). `load_tokenizer(directory)` reads it
  with bounded sizes; so does `keras_hub.tokenizers.Tokenizer.from_preset`
  in a folder that also holds the backbone's `config.json` (without the
  size bounds and the class allow-list: use `load_tokenizer` for folders
  from elsewhere).
  `load_tokenizer` also reads the OLD keras-txl layout (`tokenizer.json`
  with `kind` and `format_version: 1`, plus `vocab.txt` or
  `sentencepiece.model`) that earlier runs and shipped fixtures have; that
  layout is read-only: `save` writes only the keras-hub one.
- `export_vocabulary(tokenizer, path)` writes the vocabulary (one token a
  line, in id order) and a JSON sidecar for an app beside a TFLite model,
  which takes ids (LiteRT has no tensorflow-text ops).

`build_tokenizer(kind, texts, **options)` fits one on training text. Kinds:

- `"char"`: Unicode characters (`tensorflow_text.UnicodeCharTokenizer`).
  The vocabulary is `<unk>` followed by the characters of the training text
  in decreasing frequency. Lossless for characters seen in training.
- `"byte"`: UTF-8 bytes, a fixed vocabulary of 256 (keras-hub's
  `ByteTokenizer` in the graph). Lossless for any text.
- `"word"`: WikiText-103 style. Lines are split at runs of Unicode
  whitespace (`UNICODE_WHITESPACE`: every character `str.isspace()`
  accepts, as `str.split()`; tf.strings ops) and every newline becomes
  `<eos>`; words are looked up in a `tf.lookup.StaticHashTable`. The
  vocabulary is `<eos>`, `<unk>`, then the words in decreasing frequency
  (ties in order of first appearance), as the adaptive softmax cutoffs
  require. `add_eos=False` drops newlines instead (the reference code's
  enwik8/text8 setting for space-separated symbol files).
- `"sentencepiece"`: a SentencePiece model trained offline with the
  `sentencepiece` package and applied with
  `tensorflow_text.SentencepieceTokenizer`. Trained with identity
  normalization, whitespace kept as is and no dummy prefix, so
  `decode(encode(x)) == x` for text made of characters seen in training
  (always, with `byte_fallback=True`).
- `"wordpiece"`: a vocabulary learned with tensorflow-text's
  `bert_vocab_from_dataset` and applied with
  `tensorflow_text.FastWordpieceTokenizer` (after `FastBertNormalizer` when
  `lower_case=True`). Lossy: case, accents and spacing around punctuation
  are not kept.

`official_tokenizer(vocabulary, dataset)` builds the tokenizer of an
official TF release from its vocabulary file (`docs/official_checkpoints.md`):
a `word` tokenizer for wt103/lm1b, an `OfficialSymbolTokenizer` (enwik8
byte values, text8 characters, as the official prep scripts write them)
otherwise.

Newlines: for `word`, `sentencepiece` and `wordpiece`, each `"\\n"` in the
text becomes one `<eos>` id and `decode` turns it back into `"\\n"`. For a
file that ends with a newline this is the reference "one `<eos>` per line";
a prompt without a final newline gets no `<eos>`.

Lone surrogates (U+D800-U+DFFF, which a Python str may hold), one rule for
every tokenizer and for `encode`, `tokenize`, `fit` and
`unknown_characters` alike: U+DC80-U+DCFF stand for the bytes 0x80-0xFF
(text decoded with `errors="surrogateescape"`, as `corpora` reads raw
enwik8): the byte tokenizer encodes those bytes, and the other kinds read
them as U+FFFD, the character of bytes that are not UTF-8 (one per
maximal invalid sequence; SentencePiece's op one per byte); the char and
word `fit` count what `encode` gives. Any other lone surrogate has no
UTF-8 bytes: a `ValueError` names the argument and the position.

Reference: Dai et al., "Transformer-XL", arXiv:1901.02860, section 4, and
the official `vocabulary.py` (frequency order, specials first).
"""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import logging
import numbers
import os
import pathlib
import re
from collections.abc import Mapping
from collections.abc import Set
from typing import Iterable

import keras
import keras_hub
import numpy as np
import tensorflow as tf

from keras_txl import checks
from keras_txl import safe_files
from keras_txl.backbone import TransformerXLBackbone
from keras_txl.limits import resolve_limits

try:
    import tensorflow_text as tf_text
except ImportError as error:
    raise ImportError(
        "The tokenizers need tensorflow-text 2.21. With the tensorflow-cpu "
        "wheel install it without its dependencies (it names the CUDA "
        "`tensorflow` wheel, which would be put over tensorflow-cpu): "
        "`pip install --no-deps 'tensorflow-text>=2.21,<2.22'` (in a "
        "checkout: `pip install --no-deps -r requirements-tf-addons.txt`). "
        "See the README, 'Installing'."
    ) from error

logger = logging.getLogger(__name__)

__all__ = [
    "BYTE_VOCABULARY_SIZE",
    "EOS_TOKEN",
    "TOKENIZER_FILE",
    "TOKENIZER_KINDS",
    "UNICODE_WHITESPACE",
    "UNK_TOKEN",
    "ByteTokenizer",
    "CharTokenizer",
    "OfficialSymbolTokenizer",
    "SentencePieceTokenizer",
    "Tokenizer",
    "TransformerXLTokenizer",
    "WordPieceTokenizer",
    "WordTokenizer",
    "add_token_counts",
    "build_tokenizer",
    "export_vocabulary",
    "load_tokenizer",
    "official_tokenizer",
    "select_vocabulary",
]

TOKENIZER_FILE = "tokenizer.json"
# keras-hub's layout: assets beside tokenizer.json, in assets/tokenizer/.
ASSET_DIR = os.path.join("assets", "tokenizer")
VOCABULARY_FILE_NAME = "vocabulary.txt"  # word, wordpiece (as keras-hub)
VOCABULARY_JSON = "vocabulary.json"  # char, official symbols ("\\n" is one)
SENTENCEPIECE_ASSET = "vocabulary.spm"  # as keras-hub
# Written as a top-level key of tokenizer.json in keras-hub's layout.
FORMAT_VERSION = 2
# Top-level key of tokenizer.json: {asset file name: sha256 of its bytes},
# checked by `load_tokenizer` (absent in a keras-hub preset's tokenizer.json
# and in files of keras-txl before it).
ASSETS_SHA256_KEY = "assets_sha256"
# The old keras-txl layout (read only).
OLD_FORMAT_VERSION = 1
VOCABULARY_FILE = "vocab.txt"
SENTENCEPIECE_FILE = "sentencepiece.model"
# For export_vocabulary.
EXPORT_VOCABULARY_FILE = "vocabulary.txt"
EXPORT_INFO_FILE = "tokenizer_info.json"
UNK_TOKEN = "<unk>"
EOS_TOKEN = "<eos>"
BYTE_VOCABULARY_SIZE = 256

# Text is tokenized in pieces of about this many characters, cut after a
# newline, so that a large corpus never becomes one huge tensor.
_CHUNK_CHARS = 1 << 22


# === Helpers ===


# What `str.isspace()` says is whitespace (what `str.split()` splits on):
# `[chr(c) for c in range(0x110000) if chr(c).isspace()]` (tested). The
# word tokenizer splits words at runs of these; "\n" ends a line first.
UNICODE_WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)
# RE2 patterns (code points) for the graph ops: the whitespace that
# `tf.strings.split` does not split at (all but " \t\n\v\f\r"), a line
# without it that is valid UTF-8, which the word split takes as it is, and
# a valid UTF-8 line (RE2 compiles a negated class to the byte ranges of
# UTF-8 proper: no surrogates, overlong forms or values past U+10FFFF;
# tested).
_OTHER_WHITESPACE = "".join(
    f"\\x{{{ord(c):x}}}" for c in UNICODE_WHITESPACE if c not in " \t\n\v\f\r"
)
_PLAIN_LINE = f"(?s)[^{_OTHER_WHITESPACE}\\x{{d800}}-\\x{{dfff}}]*"
_OTHER_WHITESPACE = f"[{_OTHER_WHITESPACE}]"
_VALID_LINE = "(?s)[^\\x{d800}-\\x{dfff}]*"
# Lone surrogates that are not `surrogateescape` stand-ins for a byte
# (U+DC80-U+DCFF): they are no text and have no UTF-8 bytes.
_WHITESPACE = re.compile(f"[{re.escape(UNICODE_WHITESPACE)}]")
_NOT_ENCODABLE = re.compile("[\ud800-\udc7f\udd00-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_BYTE_ESCAPE = re.compile("[\udc80-\udcff]")


def _surrogate_error(name: str, char: str, position: int) -> ValueError:
    return ValueError(
        f"`{name}` holds the lone surrogate {char!r} (U+{ord(char):04X}) at "
        f"position {position}, which is not encodable as UTF-8. Lone "
        "surrogates are accepted only in U+DC80-U+DCFF, where they stand "
        "for the bytes 0x80-0xFF of text decoded with "
        "errors='surrogateescape'."
    )


def _check_surrogates(text: str, name: str) -> str:
    """The rule of every tokenizer for lone surrogates (U+D800-U+DFFF).

    U+DC80-U+DCFF are what `bytes.decode("utf-8", "surrogateescape")`
    makes of a byte that is not UTF-8 (a corpus cut inside a character, a
    Latin-1 terminal): they stand for that byte, 0x80-0xFF, in `encode`,
    `tokenize` and `fit` alike. Any other lone surrogate is a ValueError
    naming the argument and the position. (`_utf8` applies the same rule
    while it encodes.)
    """
    if not text.isascii():
        match = _NOT_ENCODABLE.search(text)
        if match is not None:
            raise _surrogate_error(name, match.group(), match.start())
    return text


def _utf8(text: str, name: str = "text", offset: int = 0) -> bytes:
    """The UTF-8 bytes of `text`, by the rule of `_check_surrogates`: a
    surrogate U+DC80-U+DCFF becomes its byte 0x80-0xFF, which is not UTF-8
    (the graph ops of the char and word tokenizers read such bytes as
    U+FFFD, one for each maximal invalid sequence, as
    `bytes.decode("utf-8", "replace")` does); another lone surrogate is a
    ValueError naming `name` and the position (plus `offset`, for a piece
    of a longer text)."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as error:
        raise _surrogate_error(
            name, text[error.start], offset + error.start
        ) from None


def text_bytes(text: str, name: str = "text") -> bytes:
    """The bytes the tokenizers read for `text` (a str, by the surrogate
    rule of `_utf8`; bytes as they are): what a caller hands to
    `tokenize` so that a lone surrogate is an error naming `name`."""
    return text if isinstance(text, bytes) else _utf8(text, name)


def _as_valid_text(text: str, name: str = "text") -> str:
    """`text` as the graph ops read its bytes: each maximal sequence of
    surrogateescape bytes that is not UTF-8 as one U+FFFD (other lone
    surrogates: the ValueError of `_utf8`)."""
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    return _utf8(text, name).decode("utf-8", "replace")


def _check_text(text, name: str = "text") -> str:
    """`text` if it is a str, else a ValueError. Lone surrogates are
    checked where the text is encoded (`_utf8`) or by `_check_surrogates`."""
    if not isinstance(text, str):
        raise ValueError(
            f"`{name}` must be a str (a whole document or corpus split). "
            f"Received type {type(text).__name__}."
        )
    return text


def _as_texts(texts) -> list[tuple[str, str]]:
    """The training texts as (argument name, text) pairs: `texts` for a
    single str, else `texts[i]` (the name errors give)."""
    single = isinstance(texts, str)
    if single:
        texts = [texts]
    if texts is None:
        raise ValueError(
            "`texts` must be a str or an iterable of str with the training "
            "text. Received: texts=None."
        )
    try:
        texts = list(texts)
    except TypeError:
        raise ValueError(
            "`texts` must be a str or an iterable of str. Received type "
            f"{type(texts).__name__}."
        ) from None
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(
                f"`texts` must contain only str. Received type "
                f"{type(text).__name__} at index {index}."
            )
    if not any(text.strip() for text in texts):
        raise ValueError(
            "`texts` holds no text to build a vocabulary from. Received "
            f"{len(texts)} text(s) with {sum(map(len, texts))} characters, "
            "all whitespace."
        )
    return [
        ("texts" if single else f"texts[{index}]", text)
        for index, text in enumerate(texts)
    ]


def _line_chunks(text: str, size: int | None = None) -> Iterable[str]:
    """Yields consecutive pieces of `text`, each ending after a newline.

    Only the last piece may lack the final newline. A single line longer
    than `size` (default `_CHUNK_CHARS`) is kept whole.
    """
    size = size or _CHUNK_CHARS
    start, length = 0, len(text)
    while start < length:
        stop = start + size
        if stop >= length:
            yield text[start:]
            return
        cut = text.rfind("\n", start, stop)
        if cut < 0:
            cut = text.find("\n", stop)
            if cut < 0:
                yield text[start:]
                return
        yield text[start : cut + 1]
        start = cut + 1


def _frequency_order(counts: dict) -> list:
    # `counts` is in order of first appearance; a stable sort by decreasing
    # count keeps that order among ties (like Counter.most_common).
    return sorted(counts, key=counts.get, reverse=True)


def _add_counts(counts: dict, values: tf.Tensor) -> None:
    unique, _, count = tf.unique_with_counts(values)
    for token, number in zip(unique.numpy().tolist(), count.numpy().tolist()):
        counts[token] = counts.get(token, 0) + number


def add_token_counts(counts: dict, kind: str, text: str, *, lower_case: bool = False) -> dict:
    """Counts the words or characters of `text` into `counts`, in place.

    The counting step of `WordTokenizer.fit` (`kind="word"`: words as
    `WordTokenizer.tokenize` splits them, lower-cased with `lower_case`)
    and `CharTokenizer.fit` (`kind="char"`: characters as
    `CharTokenizer.tokenize` reads them; a byte that is not UTF-8 counts
    as U+FFFD), for a corpus counted chunk by chunk (chunks that end after
    a newline or at a word boundary).

    Args:
        counts: dict str -> int, in order of first appearance (the order
            `select_vocabulary` breaks ties with). Updated in place.
        kind: str. `"word"` or `"char"`.
        text: str. Lone surrogates: as `encode` (U+DC80-U+DCFF are the
            bytes 0x80-0xFF, others a ValueError).
        lower_case: bool. `"word"` only.

    Returns:
        `counts`.
    """
    if kind not in ("word", "char"):
        raise ValueError(
            f"`kind` must be 'word' or 'char'. Received: kind={kind!r}."
        )
    return _count_tokens(counts, kind, _check_text(text), lower_case, "text")


def _count_tokens(counts, kind, text, lower_case, name):
    offset = 0
    for chunk in _line_chunks(text):
        data = tf.constant(_utf8(chunk, name, offset))
        offset += len(chunk)
        chunk_counts: dict = {}
        if kind == "word":
            lines = tf.strings.split(data, sep="\n")
            _add_counts(chunk_counts, _split_words(lines, lower_case).flat_values)
            tokens = (token.decode("utf-8") for token in chunk_counts)
        else:
            _add_counts(chunk_counts, tf_text.UnicodeCharTokenizer().tokenize(data))
            tokens = (chr(point) for point in chunk_counts)
        for token, number in zip(tokens, chunk_counts.values()):
            counts[token] = counts.get(token, 0) + number
    return counts


def select_vocabulary(specials, counts: dict, *, max_size=None, min_freq=1) -> list[str]:
    """`specials`, then the tokens of `counts` by decreasing count (ties: first
    appearance, the reference `vocabulary.py` order), at most `max_size` in
    all (the CLI's `--vocab-size`), each seen `min_freq` times or more
    (`--min-freq`). The one selection rule of `fit` and of the training
    package's streaming vocabulary."""
    if max_size is not None and (
        isinstance(max_size, bool)
        or not isinstance(max_size, numbers.Integral)
        or max_size <= len(specials)
    ):
        raise ValueError(
            "`max_size` (--vocab-size) is the total vocabulary size including "
            f"the special tokens {list(specials)}, so it must be an integer > "
            f"{len(specials)}. Received: max_size={max_size!r}."
        )
    if isinstance(min_freq, bool) or not isinstance(min_freq, numbers.Integral) or min_freq < 1:
        raise ValueError(
            "`min_freq` (--min-freq) must be a positive integer. Received: "
            f"min_freq={min_freq!r}."
        )
    vocabulary = list(specials)
    special_set = set(specials)
    for token in _frequency_order(counts):
        if max_size is not None and len(vocabulary) >= max_size:
            break
        if counts[token] < min_freq:
            break
        if token not in special_set:
            vocabulary.append(token)
    if len(vocabulary) == len(specials) and any(t not in special_set for t in counts):
        top = next(t for t in _frequency_order(counts) if t not in special_set)
        raise ValueError(
            f"`min_freq` (--min-freq) {min_freq} keeps no token: the most frequent "
            f"one, {top!r}, occurs {counts[top]} times, so the vocabulary would hold "
            f"only {list(specials)} and read everything as unknown. Pass "
            f"min_freq={counts[top]} or less."
        )
    return vocabulary


def select_reference_vocabulary(counts: dict, *, add_eos: bool, eos_token: str, unk_token,
                                max_size=None, min_freq=1) -> list[str]:
    """The word vocabulary of the reference `vocabulary.py` for the official
    datasets (`reference_specials=True`): only `eos_token` first (with
    `add_eos`; enwik8/text8's symbols have no special at all), then the
    tokens by decreasing count, `unk_token` among them where the text holds
    it (WikiText's `<unk>` takes its count's rank), else last. So the ids
    are the reference's. `unk_token=None` (the official enwik8/text8
    vocabulary, which has no unknown symbol): a `max_size` or `min_freq`
    that leaves a token out is a ValueError, as no id could stand for it."""
    specials = [eos_token] if add_eos else []
    vocabulary = select_vocabulary(specials, counts, max_size=max_size, min_freq=min_freq)
    if unk_token is None:
        left_out = [t for t in counts if t not in set(vocabulary)]
        if left_out:
            raise ValueError(
                f"`max_size`/`min_freq` (--vocab-size/--min-freq) leave out {len(left_out)} of "
                f"the {len(counts)} symbols (the first: {left_out[0]!r}), but this vocabulary "
                "has no unknown token to read them as (unk_token=None: the official "
                "enwik8/text8 vocabulary has none, and every symbol gets an id). Leave both "
                "out, or pass unk_token='<unk>'.")
        return vocabulary
    if unk_token not in vocabulary:
        if max_size is not None and len(vocabulary) >= max_size:
            vocabulary = vocabulary[: max_size - 1]
        vocabulary.append(unk_token)
    return vocabulary


def _check_vocabulary(vocabulary, required: dict) -> list[str]:
    if isinstance(vocabulary, str):
        raise ValueError(
            "`vocabulary` must be a list of str tokens, not a single str."
        )
    if isinstance(vocabulary, (Mapping, Set)):
        # A {token: id} mapping (a Hugging Face vocab.json) or a set: the
        # ids would be the keys' order, not the mapping's.
        raise ValueError(
            "`vocabulary` must be a list of str tokens in id order (the "
            "index is the id), not a "
            f"{type(vocabulary).__name__}. For a {{token: id}} mapping pass "
            "`sorted(mapping, key=mapping.get)`."
        )
    vocabulary = list(vocabulary)
    for index, token in enumerate(vocabulary):
        if not isinstance(token, str) or not token:
            raise ValueError(
                "`vocabulary` must hold non-empty str tokens. Received "
                f"{token!r} at index {index}."
            )
        if any("\ud800" <= c <= "\udfff" for c in token):
            raise ValueError(
                "`vocabulary` must hold tokens encodable as UTF-8 (no lone "
                f"surrogates U+D800-U+DFFF). Received {token!r} at index "
                f"{index}."
            )
    if len(set(vocabulary)) != len(vocabulary):
        seen, duplicates = set(), []
        for token in vocabulary:
            if token in seen:
                duplicates.append(token)
            seen.add(token)
        raise ValueError(
            "`vocabulary` must not repeat tokens. Received duplicates: "
            f"{duplicates[:10]}."
        )
    for name, token in required.items():
        if token not in vocabulary:
            raise ValueError(
                f"`vocabulary` must contain the {name} token {token!r}. "
                f"Received a vocabulary of {len(vocabulary)} tokens without "
                "it."
            )
    return vocabulary


def _check_words(vocabulary: list[str], specials, lower_case: bool) -> None:
    """Every token of a vocabulary looked up after a split at whitespace
    must be something that split can give: no `UNICODE_WHITESPACE` in it
    (the special tokens too: they are typed in text and written one a
    line) and, with `lower_case`, no token the lower-casing changes (but
    the special tokens, which are not looked up). Such a token would hold
    an id that no text ever gets."""
    for index, token in enumerate(vocabulary):
        match = _WHITESPACE.search(token)
        if match is not None:
            raise ValueError(
                "`vocabulary` tokens must not contain whitespace (text is "
                f"split at it, so no word holds any). Received {token!r} at "
                f"index {index}, with {match.group()!r}."
            )
    if lower_case and vocabulary:
        lowered = tf.strings.lower(
            [_utf8(token) for token in vocabulary], encoding="utf-8"
        ).numpy()
        for index, (token, low) in enumerate(zip(vocabulary, lowered)):
            if token not in specials and low.decode("utf-8") != token:
                raise ValueError(
                    "with `lower_case=True` the text is lower-cased before the "
                    "lookup, so `vocabulary` must hold lower-case words. "
                    f"Received {token!r} at index {index}."
                )


def _check_distinct_specials(unk_token, eos_token) -> None:
    if unk_token is not None and unk_token == eos_token:
        raise ValueError(
            "`unk_token` and `eos_token` must differ: unknown words would "
            f"become line ends. Received: unk_token={unk_token!r}, "
            f"eos_token={eos_token!r}."
        )


def _ids_array(ids, vocabulary_size: int) -> np.ndarray:
    array = np.asarray(ids)
    if array.ndim == 0:
        array = array.reshape(1)
    if array.ndim != 1:
        raise ValueError(
            f"`ids` must be a 1-D sequence of token ids. Received shape "
            f"{array.shape}."
        )
    if array.size == 0:
        return array.astype(np.int64)
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(
            f"`ids` must be integers. Received dtype {array.dtype}."
        )
    low, high = int(array.min()), int(array.max())
    if low < 0 or high >= vocabulary_size:
        raise ValueError(
            f"`ids` must be in [0, vocabulary_size={vocabulary_size}). "
            f"Received values in [{low}, {high}]."
        )
    return array.astype(np.int64)


def _write_file(path: pathlib.Path, data: bytes) -> None:
    """Writes `path` whole or not at all (`safe_files.atomic_write_bytes`):
    a save killed or out of disk space mid-write leaves the previous file,
    never a truncated vocabulary that reads as a smaller one."""
    safe_files.atomic_write_bytes(os.fspath(path), data)


def _write_json(path: pathlib.Path, data: dict) -> None:
    _write_file(
        path,
        (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8"),
    )


def _write_vocabulary(path: pathlib.Path, vocabulary: list[str]) -> None:
    for token in vocabulary:
        if "\n" in token or "\r" in token:
            raise ValueError(
                f"token {token!r} contains a line break and cannot be "
                f"written to {path}, one token per line."
            )
    _write_file(path, ("\n".join(vocabulary) + "\n").encode("utf-8"))


def _file_in(directory: pathlib.Path, name, key: str) -> pathlib.Path:
    """`directory/name` for a file name read from tokenizer.json; it must
    stay inside the folder (symlinks are followed: hub caches use them)."""
    return pathlib.Path(
        safe_files.resolve_inside(directory, name, f"`{key}` of tokenizer.json")
    )


def _read_tokenizer_file(path: pathlib.Path, what: str) -> bytes:
    """A regular file of bounded size (limit max_tokenizer_bytes)."""
    if not os.path.lexists(path):
        raise ValueError(f"{what} {path} does not exist.")
    limit = resolve_limits().max_tokenizer_bytes
    return safe_files.read_bytes(path, limit, what, "max_tokenizer_bytes")


def _read_vocabulary(path: pathlib.Path) -> list[str]:
    data = _read_tokenizer_file(path, "vocabulary file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"vocabulary file {path} is not UTF-8: {error}") from None
    if text.endswith("\n"):
        text = text[:-1]
    return text.split("\n") if text else []


# --- Graph helpers (tf.strings / tensorflow-text only: they run in
# tf.data, tf.function and a SavedModel) ---


def _string_input(inputs):
    """`inputs` as a tf.string tensor of rank 0 or 1, else a ValueError.

    Python str become UTF-8 by the rule of `_check_surrogates` (as in
    `encode`), not by TensorFlow's strict conversion.
    """
    if isinstance(inputs, np.ndarray) and inputs.dtype.kind in "UO":
        # str items (of an object array too: pandas' strings) by the rule
        # below, not by TensorFlow's strict conversion.
        inputs = inputs.tolist()
    if isinstance(inputs, (list, tuple)) and not inputs:
        # An empty batch: no dtype to convert by (it would be float32).
        inputs = tf.zeros([0], tf.string)
    if isinstance(inputs, str):
        inputs = _utf8(inputs, "inputs")
    elif isinstance(inputs, (list, tuple)) and any(
        isinstance(item, str) for item in inputs
    ):
        inputs = [
            _utf8(item, f"inputs[{index}]")
            if isinstance(item, str) else item
            for index, item in enumerate(inputs)
        ]
    if isinstance(inputs, (tf.Tensor, tf.RaggedTensor)):
        tensor = inputs
    else:
        try:
            tensor = tf.convert_to_tensor(inputs)
        except (TypeError, ValueError):
            tensor = None
    if tensor is None or tensor.dtype != tf.string:
        received = getattr(tensor, "dtype", None) or type(inputs).__name__
        raise ValueError(
            "`inputs` must be a string tensor (a str, a list of str or a "
            f"tf.string tensor of rank 0 or 1). Received: {received}."
        )
    if isinstance(tensor, tf.RaggedTensor) or tensor.shape.rank not in (0, 1):
        raise ValueError(
            "`inputs` must be a scalar string or a 1-D batch of strings. "
            f"Received shape {tensor.shape}."
        )
    return tensor


def _id_input(inputs, vocabulary_size: int):
    """`inputs` as int32 ids of rank 1 or 2 (ragged) and its rank.

    An empty Python list (or a list of empty lists) has no dtype: it is
    ids. Ids outside [0, vocabulary_size) are a ValueError when they are
    known (eager, or constants in a graph), else a tf.debugging assertion
    with the same words fails when the graph runs.
    """
    if not isinstance(inputs, (tf.Tensor, tf.RaggedTensor)):
        try:
            if (
                isinstance(inputs, (list, tuple))
                and inputs
                and isinstance(inputs[0], (list, tuple, np.ndarray))
            ):
                inputs = tf.ragged.constant(inputs)
                if inputs.flat_values.shape[0] == 0:
                    inputs = tf.cast(inputs, tf.int32)
            elif isinstance(inputs, (list, tuple)) and not inputs:
                inputs = tf.zeros([0], tf.int32)
            else:
                inputs = tf.convert_to_tensor(inputs)
        except (TypeError, ValueError) as error:
            raise ValueError(
                "`inputs` must be integer token ids of shape (N,) or (B, N). "
                f"Received a {type(inputs).__name__} that cannot be converted "
                f"to one: {error}"
            ) from None
    if not inputs.dtype.is_integer:
        raise ValueError(
            f"`inputs` must be integer token ids. Received dtype "
            f"{inputs.dtype.name}."
        )
    rank = inputs.shape.rank
    if rank not in (1, 2):
        raise ValueError(
            "`inputs` must be ids of shape (N,) or (B, N). Received shape "
            f"{inputs.shape}."
        )
    ragged = isinstance(inputs, tf.RaggedTensor)
    values = inputs.flat_values if ragged else inputs
    expected = f"`inputs` must be token ids in [0, vocabulary_size={vocabulary_size})"
    known = tf.get_static_value(values)
    if known is not None:
        if known.size and (known.min() < 0 or known.max() >= vocabulary_size):
            raise ValueError(
                f"{expected}. Received values in [{known.min()}, {known.max()}]."
            )
    else:
        wide = tf.cast(values, tf.int64)
        checks = [
            tf.debugging.assert_non_negative(wide, message=expected),
            tf.debugging.assert_less(
                wide, tf.constant(vocabulary_size, tf.int64), message=expected
            ),
        ]
        with tf.control_dependencies(checks):
            values = tf.identity(values)
        inputs = inputs.with_flat_values(values) if ragged else values
    if rank == 1:
        inputs = tf.expand_dims(inputs, 0)
    if not isinstance(inputs, tf.RaggedTensor):
        inputs = tf.RaggedTensor.from_tensor(inputs)
    return tf.cast(inputs, tf.int32), rank


def _over_batch(function, inputs):
    """Runs `function` on a (B,) batch; a scalar goes through as (1,)."""
    inputs = _string_input(inputs)
    if inputs.shape.rank == 0:
        return function(tf.expand_dims(inputs, 0))[0]
    return function(inputs)


def _with_eos(line_ids, eos_id, double_eos=False):
    """`(B, lines, None)` ids -> `(B, None)`: `eos_id` between lines.

    `double_eos`: every line is written `eos words eos` (the official LM1B
    stream) and nothing is dropped; else an `eos_id` follows every line
    but the last of each text (one per newline).
    """
    lines = line_ids.values  # (all lines, None)
    count = lines.nrows()
    eos = tf.RaggedTensor.from_row_lengths(
        tf.fill([count], tf.cast(eos_id, lines.dtype)),
        tf.ones([count], lines.row_splits.dtype),
    )  # (all lines, 1)
    pieces = [eos, lines, eos] if double_eos else [lines, eos]
    texts = line_ids.with_values(tf.concat(pieces, axis=1)).merge_dims(1, 2)
    return texts if double_eos else texts[:, :-1]


def _fix_lines(lines, plain_pattern: str, fix):
    """(N,) lines with `fix` applied to those that do not fully match
    `plain_pattern` (few, in a corpus: the common case costs one scan)."""
    plain = tf.strings.regex_full_match(lines, plain_pattern)
    where = tf.where(tf.logical_not(plain))  # (K, 1)
    return tf.tensor_scatter_nd_update(
        lines, where, fix(tf.gather_nd(lines, where))
    )


def _as_utf8(lines):
    """Bytes that are not UTF-8 as U+FFFD, one per maximal invalid
    sequence (as `bytes.decode(..., "replace")`); identity on UTF-8."""
    return tf.strings.unicode_transcode(
        lines, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
    )


def _split_words(lines, lower_case=False):
    """(N,) lines -> (N, None) words: the word tokenizer's one split rule.

    Words are split at runs of `UNICODE_WHITESPACE` (every character
    `str.isspace()` accepts; `tensorflow_text.WhitespaceTokenizer` splits
    inside the UTF-8 bytes of U+00A0 or U+3000 and keeps U+001C-U+001F
    inside words). Bytes that are not UTF-8 are read as U+FFFD first, so
    no word holds a partial UTF-8 sequence.
    """
    lines = _fix_lines(
        lines,
        _PLAIN_LINE,
        lambda other: tf.strings.regex_replace(
            _as_utf8(other), _OTHER_WHITESPACE, " "
        ),
    )
    if lower_case:
        lines = tf.strings.lower(lines, encoding="utf-8")
    # Left: ASCII whitespace, which `tf.strings.split` with sep=None splits
    # at (runs of " \t\n\v\f\r", no empty words).
    return tf.strings.split(lines)


def _split_documents(documents, drop_final_empty_line=False):
    """(B,) strings -> (B, lines) strings, split at each newline."""
    lines = tf.strings.split(documents, sep="\n")
    if drop_final_empty_line:
        # LM1B: the empty piece after a final newline (or of an empty
        # text) is no line.
        lengths = lines.row_lengths()
        position = tf.ragged.range(lengths)
        last = tf.equal(position, tf.expand_dims(lengths - 1, 1))
        empty = tf.equal(lines, "")
        lines = tf.ragged.boolean_mask(
            lines, tf.logical_not(tf.logical_and(last, empty))
        )
    return lines


def _lines_between_eos(ids, eos_id):
    """`(B, None)` ids -> (`(lines, None)` ids without eos, lines per text).

    Every text has one line more than it has `eos_id`s.
    """
    values = ids.values
    is_eos = tf.cast(tf.equal(values, eos_id), tf.int64)
    eos_per_text = tf.reduce_sum(ids.with_values(is_eos), axis=1)  # (B,)
    text_of_token = ids.value_rowids()
    eos_before = tf.cumsum(is_eos, exclusive=True) - tf.gather(
        tf.cumsum(eos_per_text, exclusive=True), text_of_token
    )  # eos tokens before each token within its text
    lines_per_text = eos_per_text + 1
    line_of_token = (
        tf.gather(tf.cumsum(lines_per_text, exclusive=True), text_of_token)
        + eos_before
    )
    keep = tf.equal(is_eos, 0)
    lines = tf.RaggedTensor.from_value_rowids(
        tf.boolean_mask(values, keep),
        tf.boolean_mask(line_of_token, keep),
        nrows=tf.reduce_sum(lines_per_text),
    )
    return lines, lines_per_text


def _ragged_join(strings, separator):
    """`(B, None)` strings -> (B,) strings, each row joined by `separator`.

    `tf.strings.reduce_join` of a ragged tensor (unsorted_segment_join in
    TF 2.21) drops the separators after a row's leading empty strings:
    `["", "a"]` joins to "a", not "\\na", which lost a text's leading blank
    lines. So the separator goes onto every element but a row's last, and
    the join adds none.
    """
    lengths = strings.row_lengths()
    position = tf.ragged.range(lengths)
    last = tf.equal(position, tf.expand_dims(lengths - 1, 1)).flat_values
    values = strings.flat_values
    values = tf.where(last, values, tf.strings.join([values, separator]))
    return tf.strings.reduce_join(strings.with_flat_values(values), axis=1)


def _join_lines(line_texts, lines_per_text):
    """(lines,) strings and lines per text -> (B,) texts joined by "\\n"."""
    texts = tf.RaggedTensor.from_row_lengths(line_texts, lines_per_text)
    return _ragged_join(texts, "\n")


def _strings_table(tokens, default):
    """A `StaticHashTable` from str token to its index (int64)."""
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant([_utf8(token) for token in tokens], tf.string),
            tf.range(len(tokens), dtype=tf.int64),
        ),
        default_value=default,
    )


def _write_json_list(path: pathlib.Path, tokens: list[str]) -> None:
    _write_file(path, json.dumps(tokens, ensure_ascii=False).encode("utf-8"))


def _read_json_list(path: pathlib.Path) -> list[str]:
    data = _read_tokenizer_file(path, "vocabulary file")
    limits = resolve_limits()
    tokens = safe_files.parse_json(data, os.fspath(path), limits)
    if not isinstance(tokens, list):
        raise ValueError(
            f"vocabulary file {path} must hold a JSON list of str tokens. "
            f"Received a JSON {type(tokens).__name__}."
        )
    return tokens


def _asset(directory, name) -> pathlib.Path:
    """`directory/name` for a tokenizer asset, which must stay inside."""
    return pathlib.Path(
        safe_files.resolve_inside(directory, name, "tokenizer asset")
    )


# === Tokenizers ===


@keras.saving.register_keras_serializable(package="keras_txl")
class TransformerXLTokenizer(keras_hub.tokenizers.Tokenizer):
    """Base class of the keras-txl tokenizers: a keras-hub `Tokenizer`.

    A Keras layer that travels inside a saved model. `tokenize` (also
    `__call__`) and `detokenize` use only graph ops (tf.strings,
    tensorflow-text, tf.lookup), so they run in `tf.data`, `tf.function`
    and a SavedModel:

    - `tokenize(inputs)`: a string scalar gives 1-D int32 ids; a `(B,)`
      batch gives a `tf.RaggedTensor` `(B, None)` int32.
    - `detokenize(inputs)`: 1-D ids give a string scalar; `(B, N)` ids
      (dense or ragged) give `(B,)` strings. Ids outside
      `[0, vocabulary_size())` are a `ValueError` (a failed assertion in
      a graph).

    The convenience API for whole documents and corpora (eager, numpy):
    `encode(text) -> np.ndarray` (cut into pieces at newlines, so a corpus
    never becomes one huge tensor), `decode(ids) -> str`, `eos_id`,
    `unk_id`, `unit`, `bits_metric`, `unknown_characters(text)`,
    `check_model_vocabulary(vocabulary_size)` and `save(directory)` (read
    back with `load_tokenizer`).

    keras-hub's API: `vocabulary_size()` (a method), `get_vocabulary()`,
    `id_to_token(id)`, `token_to_id(token)`, `end_token_id` (`<eos>`, or
    None for kinds without one), `start_token_id` (None), `pad_token_id`
    (`<eos>` where the kind has one, else 0: padded positions are masked,
    and a real token keeps the embedding lookup in range), `save_assets` /
    `load_assets` and `get_config` (without the vocabulary, which lives in
    the assets; `vocabulary=None` then `load_assets`, as keras-hub does).

    Subclasses set `kind` and implement `_tokenize_batch` (`(B,)` strings
    to ragged ids), `_detokenize_batch`, `vocabulary_size` and
    `get_vocabulary`; they may override `encode`/`decode`.

    Example:

    >>> tokenizer = WordTokenizer(["<eos>", "<unk>", "a", "b"])
    >>> tokenizer("a b\\nb").numpy().tolist()
    [2, 3, 0, 3]
    >>> dataset = tf.data.Dataset.from_tensor_slices(["a", "b c"])
    >>> [ids.numpy().tolist() for ids in dataset.map(tokenizer)]
    [[2], [3, 1]]
    >>> tokenizer.detokenize([2, 3, 0, 3]).numpy()
    b'a b\\nb'

    Reference: Dai et al., "Transformer-XL", arXiv:1901.02860, section 4
    (word, character and byte-level benchmarks).
    """

    kind = ""
    backbone_cls = TransformerXLBackbone
    # Names of the files `save_assets` writes (keras-hub's `file_assets`).
    asset_files = ()

    def __init__(self, **kwargs):
        kind = kwargs.pop("kind", self.kind)
        if kind != self.kind:
            raise ValueError(
                f"`kind` of a {type(self).__name__} must be {self.kind!r}. "
                f"Received: kind={kind!r}."
            )
        kwargs.setdefault("dtype", "int32")
        super().__init__(**kwargs)
        self.file_assets = list(self.asset_files)

    # --- keras-hub API ---

    def tokenize(self, inputs):
        self._check_ready()
        return _over_batch(self._tokenize_batch, inputs)

    def detokenize(self, inputs):
        self._check_ready()
        ids, rank = _id_input(inputs, self.vocabulary_size())
        texts = self._detokenize_batch(ids)
        return texts[0] if rank == 1 else texts

    def call(self, inputs):
        return self.tokenize(inputs)

    def compute_output_spec(self, inputs):
        # (N,) ids for a scalar string, (B, None) for a batch.
        rank = len(getattr(inputs, "shape", ()) or ())
        return keras.KerasTensor([None] * (rank + 1), dtype="int32")

    def get_vocabulary(self) -> list[str]:
        raise NotImplementedError

    def id_to_token(self, id) -> str:
        vocabulary = self.get_vocabulary()
        if isinstance(id, bool) or not isinstance(id, numbers.Integral) or not (
            0 <= id < len(vocabulary)
        ):
            raise ValueError(
                f"`id` must be an int in [0, {len(vocabulary)}). Received: "
                f"id={id!r}."
            )
        return vocabulary[id]

    def token_to_id(self, token) -> int:
        vocabulary = self.get_vocabulary()
        if token not in vocabulary:
            raise ValueError(
                f"`token` {token!r} is not in the vocabulary of "
                f"{len(vocabulary)} tokens."
            )
        return vocabulary.index(token)

    @property
    def end_token_id(self):
        return self.eos_id

    @property
    def start_token_id(self):
        return None

    @property
    def pad_token_id(self) -> int:
        return 0 if self.eos_id is None else self.eos_id

    def save_assets(self, dir_path):
        pass

    def load_assets(self, dir_path):
        pass

    def save_to_preset(self, preset_dir):
        """keras-hub's `save_to_preset` (`tokenizer.json` and the assets),
        written atomically with a `manifest.json` into the preset, as
        `TransformerXLBackbone.save_to_preset` writes
        (`keras_txl.folders.save_preset_part`)."""
        from keras_txl import folders

        folders.save_preset_part(
            preset_dir,
            lambda folder: keras_hub.tokenizers.Tokenizer.save_to_preset(self, folder),
            folders.TOKENIZER_ENTRIES)

    def load_preset_assets(self, preset):
        # keras-hub's version needs at least one asset file (the byte
        # tokenizer has none).
        if self.file_assets:
            super().load_preset_assets(preset)

    def get_config(self) -> dict:
        config = super().get_config()
        config["kind"] = self.kind
        return config

    # --- keras-txl API ---

    def _check_ready(self):
        pass

    def _tokenize_batch(self, texts):
        raise NotImplementedError

    def _detokenize_batch(self, ids):
        raise NotImplementedError

    def _tokenize_text(self, text: str, offset: int = 0) -> np.ndarray:
        """Eager ids of one piece of text, which starts at `offset` of
        the `text` given to `encode`."""
        data = tf.constant([_utf8(text, "text", offset)])
        return self._tokenize_batch(data)[0].numpy()

    def encode(self, text: str) -> np.ndarray:
        """Token ids of `text`, a whole document, as int32 `(N,)`.

        The text is cut after newlines into pieces of about 4M characters,
        each tokenized alone: the ids equal `tokenize(text)`.
        """
        self._check_ready()
        pieces, offset = [], 0
        for chunk in _line_chunks(_check_text(text)):
            pieces.append(self._tokenize_text(chunk, offset))
            offset += len(chunk)
        if not pieces:
            return np.zeros([0], np.int32)
        return np.concatenate(pieces).astype(np.int32)

    def decode(self, ids) -> str:
        """Text of the token ids `ids` (1-D)."""
        self._check_ready()
        array = _ids_array(ids, self.vocabulary_size())
        text = self._detokenize_batch(
            tf.RaggedTensor.from_tensor(tf.constant(array[None], tf.int32))
        )[0]
        return text.numpy().decode("utf-8", "replace")

    @property
    def eos_id(self) -> int | None:
        """int or None. Id of `<eos>` (a newline), if the kind has one."""
        return None

    @property
    def unk_id(self) -> int | None:
        """int or None. Id of `<unk>`, if the kind has one."""
        return None

    @property
    def unit(self) -> str:
        """str. What one token stands for, to name bits per token in
        reports: `"character"` (bpc; a byte counts as one, as for enwik8),
        `"word"` or `"token"` (subwords)."""
        return "token"

    @property
    def bits_metric(self) -> str:
        """str. The name of the mean NLL in bits for this kind: `"bpc"`
        only when a token is a character (or byte), else
        `"bits_per_word"` or `"bits_per_token"`."""
        return "bpc" if self.unit == "character" else f"bits_per_{self.unit}"

    @property
    def newline_handling(self) -> str:
        """str. How a newline of the text reaches the model (for apps)."""
        return "eos" if self.eos_id is not None else "dropped"

    def unknown_characters(self, text: str) -> list[str]:
        """The distinct characters of `text` that do not reach a model as
        themselves (they become `<unk>` or U+FFFD), in order of first
        appearance. Empty for kinds whose unknown pieces are words or
        subwords (compare `decode(encode(text))` with `text` for those).

        A lone surrogate outside U+DC80-U+DCFF (which stand for bytes that
        are not UTF-8) is the ValueError `encode` raises."""
        _check_surrogates(_check_text(text), "text")
        return []

    def check_model_vocabulary(self, vocabulary_size: int) -> None:
        """Checks that a model's vocabulary matches this tokenizer.

        Args:
            vocabulary_size: int. The model's `vocabulary_size`.

        Raises:
            ValueError: if it differs from `self.vocabulary_size()`.
        """
        size = self.vocabulary_size()
        if vocabulary_size != size:
            raise ValueError(
                f"the tokenizer (kind={self.kind!r}) has vocabulary_size="
                f"{size}, but the model has vocabulary_size="
                f"{vocabulary_size!r}; they must be equal. Build the model "
                f"with vocabulary_size={size} or load the tokenizer the "
                "model was trained with."
            )

    def save(self, directory) -> pathlib.Path:
        """Writes the tokenizer as keras-hub writes one inside a preset.

        `directory/tokenizer.json` is the Keras serialization of the layer
        (as `keras_hub`'s preset saver writes it, plus the informative
        keys `kind`, `vocabulary_size` and `format_version`, which Keras
        ignores) and `directory/assets/tokenizer/` holds the vocabulary or
        SentencePiece model. `keras_hub.tokenizers.Tokenizer.from_preset`
        reads it when the folder also has the backbone's `config.json`;
        `load_tokenizer(directory)` reads it alone.

        Args:
            directory: str or path-like. Created if needed.

        Returns:
            The directory, as a `pathlib.Path`.
        """
        directory = pathlib.Path(directory)
        assets = directory / ASSET_DIR
        assets.mkdir(parents=True, exist_ok=True)
        data = keras.saving.serialize_keras_object(self)
        for key in ("build_config", "compile_config"):
            data.pop(key, None)
        # One name per kind, not Keras' per-process counter ("word_tokenizer_3"):
        # the same tokenizer always writes the same bytes (data caches are
        # keyed by them).
        data["config"]["name"] = f"{self.kind}_tokenizer"
        data.update(
            {
                "kind": self.kind,
                "vocabulary_size": self.vocabulary_size(),
                "format_version": FORMAT_VERSION,
            }
        )
        # The assets first, each written whole, then tokenizer.json with
        # their sha256s: a save that dies between the two leaves the old
        # tokenizer.json, whose sha256s `load_tokenizer` finds do not match.
        self.save_assets(str(assets))
        data[ASSETS_SHA256_KEY] = {
            name: hashlib.sha256((assets / name).read_bytes()).hexdigest()
            for name in self.file_assets
        }
        _write_json(directory / TOKENIZER_FILE, data)
        logger.info("Saved %r to %s", self, directory)
        return directory

    def __repr__(self):
        options = ", ".join(
            f"{key}={value!r}"
            for key, value in self.get_config().items()
            if key not in _KERAS_CONFIG_KEYS
        )
        options = ", " + options if options else ""
        return (
            f"{type(self).__name__}(vocabulary_size={self.vocabulary_size()}"
            f"{options})"
        )


# Keys of a Layer's config that say nothing about the tokenizer.
_KERAS_CONFIG_KEYS = ("name", "trainable", "dtype", "config_file", "kind")

# Kept for code that names the old base class.
Tokenizer = TransformerXLTokenizer


class _VocabularyTokenizer(TransformerXLTokenizer):
    """A tokenizer whose vocabulary is a list of str (in the assets)."""

    asset_files = (VOCABULARY_JSON,)

    def __init__(self, vocabulary=None, **kwargs):
        super().__init__(**kwargs)
        self._vocabulary = None
        if vocabulary is not None:
            self.set_vocabulary(vocabulary)

    def set_vocabulary(self, vocabulary):
        """Sets the vocabulary (list of str) and builds the lookup ops."""
        vocabulary = self._validate(vocabulary)
        self._vocabulary = vocabulary
        # Detokenize: id -> token string.
        self._tokens = tf.constant([_utf8(t) for t in vocabulary], tf.string)
        self._build_tables(vocabulary)

    def _validate(self, vocabulary):
        raise NotImplementedError

    def _build_tables(self, vocabulary):
        raise NotImplementedError

    def _check_ready(self):
        if self._vocabulary is None:
            raise ValueError(
                f"this {type(self).__name__} has no vocabulary yet: pass "
                "`vocabulary` or call `load_assets(dir_path)`."
            )

    def get_vocabulary(self) -> list[str]:
        self._check_ready()
        return list(self._vocabulary)

    @property
    def vocabulary(self) -> list[str]:
        """list of str. The token of each id."""
        return self.get_vocabulary()

    def vocabulary_size(self) -> int:
        self._check_ready()
        return len(self._vocabulary)

    def save_assets(self, dir_path):
        _write_json_list(
            pathlib.Path(dir_path) / self.asset_files[0], self.get_vocabulary()
        )

    def load_assets(self, dir_path):
        path = _asset(dir_path, self.asset_files[0])
        if path.suffix == ".json":
            self.set_vocabulary(_read_json_list(path))
        else:
            self.set_vocabulary(_read_vocabulary(path))


@keras.saving.register_keras_serializable(package="keras_txl")
class ByteTokenizer(TransformerXLTokenizer):
    """UTF-8 bytes: ids 0-255, nothing to fit, lossless.

    `encode` and `tokenize` use the `surrogateescape` error handler, so
    text decoded from arbitrary bytes that way (as `corpora` does for raw
    enwik8) encodes to exactly the original bytes: a lone surrogate
    U+DC80-U+DCFF is the byte 0x80-0xFF. Any other lone surrogate has no
    bytes and is a `ValueError` (as for every tokenizer). `decode` (and
    `detokenize`) replace invalid UTF-8, which a model may generate, with
    U+FFFD. Token i (`id_to_token(i)`, `get_vocabulary()[i]`) is the one
    character `encode` reads as byte i: ASCII below 128, U+DC80-U+DCFF
    above; `token_to_id` takes those only (`"é"` is two bytes: a
    ValueError naming them, not keras-hub's Latin-1 id 233).

    `tokenize`/`detokenize` use the same ops as keras-hub's
    `ByteTokenizer` but not the class: its eager calls give Python lists
    for a batch (not a `tf.RaggedTensor`), and its `detokenize` drops byte
    0, which here is a byte like any other.

    Example:

    >>> tokenizer = ByteTokenizer()
    >>> tokenizer.encode("hé").tolist()
    [104, 195, 169]
    """

    kind = "byte"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # Detokenize: id -> its byte.
        self._bytes = tf.constant(
            [bytes([byte]) for byte in range(BYTE_VOCABULARY_SIZE)]
        )

    @classmethod
    def fit(cls, texts=None):
        """Returns a `ByteTokenizer`; `texts` is ignored (fixed vocabulary)."""
        return cls()

    def vocabulary_size(self) -> int:
        return BYTE_VOCABULARY_SIZE

    def get_vocabulary(self) -> list[str]:
        # Token i is the one-character text that `encode` reads as byte i:
        # the ASCII character below 128, and above it the `surrogateescape`
        # stand-in U+DC80-U+DCFF (a byte >= 0x80 is no character on its
        # own). Not chr(i), keras-hub's Latin-1 naming: "é" would be id 233,
        # which no text holding "é" gets (its UTF-8 is 195, 169).
        return [chr(byte) if byte < 0x80 else chr(0xDC00 + byte)
                for byte in range(BYTE_VOCABULARY_SIZE)]

    def token_to_id(self, token) -> int:
        if isinstance(token, str) and len(token) == 1:
            code = ord(token)
            if code < 0x80:
                return code
            if 0xDC80 <= code <= 0xDCFF:
                return code - 0xDC00
        detail = ""
        if isinstance(token, str) and token and not _SURROGATE.search(token):
            data = token.encode("utf-8")
            detail = (f" ({token!r} is {len(data)} byte{'s' if len(data) > 1 else ''} "
                      f"in UTF-8: encode() gives {list(data)})")
        raise ValueError(
            "`token` must be one byte of the byte tokenizer: an ASCII character "
            "(ids 0-127) or U+DC80-U+DCFF, the stand-in for the byte 0x80-0xFF "
            "(ids 128-255, as `id_to_token` gives them). Received: "
            f"token={token!r}{detail}. Use encode() for text."
        )

    @property
    def unit(self) -> str:
        return "character"

    @property
    def newline_handling(self) -> str:
        return "byte"

    def unknown_characters(self, text: str) -> list[str]:
        # Every character is bytes here, except the lone surrogates
        # U+DC80-U+DCFF that stand for bytes which are not UTF-8 (text read
        # with `surrogateescape`, e.g. a prompt typed in a Latin-1
        # terminal): the model gets those bytes, and they decode as U+FFFD.
        # Other lone surrogates raise a ValueError, as `encode` does.
        text = _check_surrogates(_check_text(text), "text")
        if text.isascii():
            return []
        return list(dict.fromkeys(_BYTE_ESCAPE.findall(text)))

    def _tokenize_batch(self, texts):
        values = tf.ragged.map_flat_values(
            tf.io.decode_raw, tf.strings.bytes_split(texts), tf.uint8
        )  # (B, None, 1)
        return tf.cast(values.merge_dims(1, 2), tf.int32)

    def _detokenize_batch(self, ids):
        data = tf.ragged.map_flat_values(tf.gather, self._bytes, ids)
        return tf.strings.unicode_transcode(
            tf.strings.reduce_join(data, axis=1),
            "UTF-8",
            "UTF-8",
            errors="replace",
        )

    def encode(self, text: str) -> np.ndarray:
        data = _utf8(_check_text(text))
        return np.frombuffer(data, dtype=np.uint8).astype(np.int32)

    def decode(self, ids) -> str:
        array = _ids_array(ids, BYTE_VOCABULARY_SIZE)
        return array.astype(np.uint8).tobytes().decode("utf-8", "replace")


@keras.saving.register_keras_serializable(package="keras_txl")
class CharTokenizer(_VocabularyTokenizer):
    """Unicode characters, with a vocabulary fitted on training text.

    Characters are split with `tensorflow_text.UnicodeCharTokenizer` and
    mapped to ids with a `tf.lookup.StaticHashTable`; characters not in the
    vocabulary map to `<unk>` (id 0), which decodes as the string `<unk>`.
    Hand-written rather than keras-hub's `UnicodeCodepointTokenizer`, whose
    ids are the code points themselves: this vocabulary is frequency
    ordered (the adaptive softmax's clusters) with an `<unk>`.

    Args:
        vocabulary: list of str, or None (then `load_assets`). `unk_token`
            followed by single characters; the list index is the id.
        unk_token: str. The unknown token, which must be in `vocabulary`.

    Example:

    >>> tokenizer = CharTokenizer.fit(["abba"])
    >>> tokenizer.encode("abc").tolist()   # <unk>=0, a/b tie: "a" first
    [1, 2, 0]
    """

    kind = "char"

    def __init__(self, vocabulary=None, unk_token: str = UNK_TOKEN, **kwargs):
        self._unk_token = unk_token
        self._splitter = tf_text.UnicodeCharTokenizer()
        super().__init__(vocabulary, **kwargs)

    def _validate(self, vocabulary):
        unk_token = self._unk_token
        vocabulary = _check_vocabulary(vocabulary, {"unknown": unk_token})
        for index, token in enumerate(vocabulary):
            if token != unk_token and len(token) != 1:
                raise ValueError(
                    "a char vocabulary must hold single characters besides "
                    f"unk_token={unk_token!r}. Received {token!r} at index "
                    f"{index}."
                )
        return vocabulary

    def _build_tables(self, vocabulary):
        self._unk_id = vocabulary.index(self._unk_token)
        self._known = frozenset(vocabulary) - {self._unk_token}
        chars = [
            (ord(token), index)
            for index, token in enumerate(vocabulary)
            if token != self._unk_token
        ]
        self._table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant([c for c, _ in chars], tf.int64),
                tf.constant([i for _, i in chars], tf.int64),
            ),
            default_value=self._unk_id,
        )

    @classmethod
    def fit(
        cls,
        texts,
        *,
        max_size: int | None = None,
        min_freq: int = 1,
        unk_token: str = UNK_TOKEN,
    ):
        """Builds the vocabulary from `texts`.

        Args:
            texts: str or iterable of str. Training text.
            max_size: int or None. Total vocabulary size limit, including
                `<unk>`; the rarest characters are left out.
            min_freq: int. Characters seen fewer times are left out.
            unk_token: str. The unknown token.

        Returns:
            A `CharTokenizer`.
        """
        counts: dict = {}
        for name, text in _as_texts(texts):
            _count_tokens(counts, "char", text, False, name)
        vocabulary = select_vocabulary(
            [unk_token], counts, max_size=max_size, min_freq=min_freq
        )
        tokenizer = cls(vocabulary, unk_token=unk_token)
        logger.info(
            "char vocabulary: %d characters seen, %d kept",
            len(counts),
            len(vocabulary) - 1,
        )
        return tokenizer

    @property
    def unk_id(self) -> int:
        self._check_ready()
        return self._unk_id

    @property
    def unit(self) -> str:
        return "character"

    @property
    def newline_handling(self) -> str:
        return "character"

    def unknown_characters(self, text: str) -> list[str]:
        # Characters not in the vocabulary become <unk>. A vocabulary holds
        # no surrogates: a surrogateescape byte U+DC80-U+DCFF reaches the
        # model as U+FFFD (or <unk>), and other lone surrogates raise a
        # ValueError, as `encode` does.
        self._check_ready()
        known = self._known
        return list(dict.fromkeys(
            c for c in _check_surrogates(_check_text(text), "text")
            if c not in known
        ))

    def get_config(self) -> dict:
        return {**super().get_config(), "unk_token": self._unk_token}

    def _tokenize_batch(self, texts):
        points = self._splitter.tokenize(texts)  # (B, None) int32
        ids = tf.ragged.map_flat_values(
            self._table.lookup, tf.cast(points, tf.int64)
        )
        return tf.cast(ids, tf.int32)

    def _detokenize_batch(self, ids):
        tokens = tf.ragged.map_flat_values(tf.gather, self._tokens, ids)
        return tf.strings.reduce_join(tokens, axis=1)


@keras.saving.register_keras_serializable(package="keras_txl")
class WordTokenizer(_VocabularyTokenizer):
    """Whitespace-split words with `<eos>` for newlines (WikiText-103).

    Lines end at `"\\n"` and are split into words at runs of Unicode
    whitespace (`UNICODE_WHITESPACE`, what `str.split()` splits at: U+00A0,
    U+3000, U+2028 and the rest, not only ASCII; the `"\\r"` of a CRLF
    too) with tf.strings ops, the same in `fit`, `encode` and the graph.
    Words are looked up in a
    `tf.lookup.StaticHashTable` (unknown words map to `<unk>`). With
    `add_eos=True` each newline of the text is an `<eos>` id; `decode` joins
    the words of a line with single spaces and ends lines with `"\\n"`, so
    it restores whitespace-normalized text exactly. With `add_eos=False`
    newlines are dropped, as the reference code does for the
    space-separated enwik8/text8 symbol files.

    Hand-written rather than keras-hub's `WordPieceTokenizer` (whose
    vocabulary lookup is similar): newlines become `<eos>` ids, unknown
    words whole `<unk>`s, and the vocabulary keeps the frequency order the
    adaptive softmax's clusters need.

    Args:
        vocabulary: list of str, or None (then `load_assets`). Tokens; the
            list index is the id. Must contain `unk_token` (and
            `eos_token` when `add_eos`).
        add_eos: bool. Whether newlines become `eos_token`.
        lower_case: bool. Lower-case the text before the lookup.
        unk_token: str or None. Token for words not in the vocabulary;
            None (a vocabulary without one, as some official releases
            have) makes `encode` raise on an unknown word (`tokenize`
            fails with an `InvalidArgumentError`).
        eos_token: str. End-of-line token.
        double_eos: bool. Write every line as `eos words eos` (the official
            LM1B stream, `add_double_eos`) instead of `words eos`.

    Example:

    >>> tokenizer = WordTokenizer.fit("b a b\\n")
    >>> tokenizer.vocabulary
    ['<eos>', '<unk>', 'b', 'a']
    >>> tokenizer.encode("a b c\\n").tolist()
    [3, 2, 1, 0]
    """

    kind = "word"
    asset_files = (VOCABULARY_FILE_NAME,)

    def __init__(
        self,
        vocabulary=None,
        *,
        add_eos: bool = True,
        lower_case: bool = False,
        unk_token: str | None = UNK_TOKEN,
        eos_token: str = EOS_TOKEN,
        double_eos: bool = False,
        **kwargs,
    ):
        if double_eos and not add_eos:
            raise ValueError("`double_eos=True` needs `add_eos=True`.")
        if add_eos:
            _check_distinct_specials(unk_token, eos_token)
        self._add_eos = bool(add_eos)
        self._double_eos = bool(double_eos)
        self._lower_case = bool(lower_case)
        self._unk_token = unk_token
        self._eos_token = eos_token
        super().__init__(vocabulary, **kwargs)

    def _validate(self, vocabulary):
        required = {} if self._unk_token is None else {
            "unknown": self._unk_token
        }
        if self._add_eos:
            required["end-of-line"] = self._eos_token
        vocabulary = _check_vocabulary(vocabulary, required)
        _check_words(vocabulary, set(required.values()), self._lower_case)
        return vocabulary

    def _build_tables(self, vocabulary):
        self._unk_id = (
            None if self._unk_token is None
            else vocabulary.index(self._unk_token)
        )
        self._eos_id = (
            vocabulary.index(self._eos_token) if self._add_eos else None
        )
        self._table = _strings_table(
            vocabulary, -1 if self._unk_id is None else self._unk_id
        )

    @classmethod
    def fit(
        cls,
        texts,
        *,
        max_size: int | None = None,
        min_freq: int = 1,
        add_eos: bool = True,
        lower_case: bool = False,
        unk_token: str = UNK_TOKEN,
        eos_token: str = EOS_TOKEN,
        reference_specials: bool = False,
    ):
        """Builds a frequency-ordered vocabulary from `texts`.

        The vocabulary is the special tokens (`eos_token`, `unk_token`, or
        only `unk_token` when `add_eos=False`), then the words in
        decreasing count, ties in order of first appearance. A word equal
        to a special token (WikiText-103 contains `<unk>`) takes the
        special token's id. With `reference_specials=True` (the corpora's
        `wikitext` and `char-symbols` layouts) the order is the reference
        `vocabulary.py`'s for the official datasets instead: see
        `select_reference_vocabulary`.

        Args:
            texts: str or iterable of str. Training text.
            max_size: int or None. Total vocabulary size limit including the
                special tokens; the rarest words are left out.
            min_freq: int. Words seen fewer times are left out.
            add_eos: bool. See the class.
            lower_case: bool. See the class.
            unk_token: str. See the class.
            eos_token: str. See the class.
            reference_specials: bool. Order the specials as the reference
                code does for the official datasets (`<eos>` alone first,
                `<unk>` at its count's rank, or last when the text has
                none; no specials without `add_eos`), so the ids are its
                ids. `unk_token=None` then gives no unknown token at all
                (the official enwik8/text8 vocabulary).

        Returns:
            A `WordTokenizer`.
        """
        counts: dict = {}
        for name, text in _as_texts(texts):
            _count_tokens(counts, "word", text, lower_case, name)
        if reference_specials:
            vocabulary = select_reference_vocabulary(
                counts, add_eos=add_eos, eos_token=eos_token,
                unk_token=unk_token, max_size=max_size, min_freq=min_freq,
            )
        else:
            specials = [eos_token, unk_token] if add_eos else [unk_token]
            vocabulary = select_vocabulary(
                specials, counts, max_size=max_size, min_freq=min_freq
            )
        logger.info(
            "word vocabulary: %d distinct words, %d tokens kept",
            len(counts),
            len(vocabulary),
        )
        return cls(
            vocabulary,
            add_eos=add_eos,
            lower_case=lower_case,
            unk_token=unk_token,
            eos_token=eos_token,
        )

    def save_assets(self, dir_path):
        _write_vocabulary(
            pathlib.Path(dir_path) / VOCABULARY_FILE_NAME,
            self.get_vocabulary(),
        )

    @property
    def eos_id(self) -> int | None:
        self._check_ready()
        return self._eos_id

    @property
    def unk_id(self) -> int | None:
        self._check_ready()
        return self._unk_id

    @property
    def unit(self) -> str:
        # Without <eos> this is the reference's setting for the enwik8/text8
        # symbol files, where a "word" is one character (or byte).
        return "word" if self._add_eos else "character"

    @property
    def newline_handling(self) -> str:
        if self._double_eos:
            return "double_eos"
        return "eos" if self._add_eos else "dropped"

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "add_eos": self._add_eos,
            "lower_case": self._lower_case,
            "unk_token": self._unk_token,
            "eos_token": self._eos_token,
            "double_eos": self._double_eos,
        }

    def _word_ids(self, texts):
        """(B,) strings -> (words, ids), each (B, lines, None)."""
        lines = _split_documents(texts, drop_final_empty_line=self._double_eos)
        words = lines.with_values(_split_words(lines.values, self._lower_case))
        ids = tf.ragged.map_flat_values(self._table.lookup, words)
        return words, tf.cast(ids, tf.int32)

    def _tokenize_batch(self, texts):
        _, ids = self._word_ids(texts)
        if self._unk_id is None:
            check = tf.debugging.assert_non_negative(
                ids.flat_values,
                message="a word is not in the vocabulary, which has no "
                "unknown token",
            )
            with tf.control_dependencies([check]):
                ids = tf.identity(ids)
        if self._add_eos:
            return _with_eos(ids, self._eos_id, self._double_eos)
        return ids.merge_dims(1, 2)

    def _tokenize_text(self, text, offset=0):
        if self._unk_id is None:
            words, ids = self._word_ids(
                tf.constant([_utf8(text, "text", offset)])
            )
            unknown = ids.flat_values.numpy() < 0
            if unknown.any():
                word = words.flat_values.numpy()[unknown][0]
                raise ValueError(
                    f"word {word.decode('utf-8')!r} is not in the "
                    "vocabulary, which has no unknown token."
                )
        return super()._tokenize_text(text, offset)

    def _detokenize_batch(self, ids):
        if not self._add_eos:
            tokens = tf.ragged.map_flat_values(tf.gather, self._tokens, ids)
            return _ragged_join(tokens, " ")
        lines, lines_per_text = _lines_between_eos(ids, self._eos_id)
        words = tf.ragged.map_flat_values(tf.gather, self._tokens, lines)
        line_texts = _ragged_join(words, " ")
        return _join_lines(line_texts, lines_per_text)


def _training_sentences(line: str, limit: int) -> list:
    """`line` in pieces of at most `limit` UTF-8 bytes for SentencePiece's
    trainer: each cut is before the last space that fits (a piece then
    starts with the space, as SentencePiece's pieces "▁word" do), else
    after the last whole character that fits."""
    if len(line) * 4 <= limit or len(line.encode("utf-8")) <= limit:
        return [line]
    out, start = [], 0
    while start < len(line):
        window = line[start:start + limit]  # at least `limit` bytes, or the rest
        data = window.encode("utf-8")
        if len(data) <= limit and start + len(window) == len(line):
            out.append(window)
            break
        # Whole characters (one, if even one does not fit: skipped then).
        window = data[:limit].decode("utf-8", "ignore") or window[0]
        cut = window.rfind(" ")
        if cut <= 0:
            cut = len(window)
        out.append(window[:cut])
        start += cut
    return out


@keras.saving.register_keras_serializable(package="keras_txl")
class SentencePieceTokenizer(TransformerXLTokenizer):
    """SentencePiece subwords, applied with tensorflow-text.

    Each line is tokenized with `tensorflow_text.SentencepieceTokenizer`
    and every newline becomes the model's end-of-sentence id. Models built
    by `fit` use identity normalization, keep whitespace as is and add no
    dummy prefix, so decoding is exact for characters the model covers
    (`tensorflow_text`'s detokenizer drops the leading spaces of a line when
    the model adds a dummy prefix, which the `sentencepiece` package does
    not). keras-hub's `SentencePieceTokenizer` wraps the same op but has no
    notion of lines: this class adds the newline-as-`<eos>` step, and
    stores the model as keras-hub does (`assets/tokenizer/vocabulary.spm`).

    `tf.random.set_seed` (called by `keras.utils.set_random_seed`) deletes
    the resource behind an eager `SentencepieceTokenizer`; this class
    rebuilds the op when that happens.

    Args:
        model_proto: bytes, or None (then `load_assets`). A serialized
            SentencePiece model; it must have an end-of-sentence piece
            (used for newlines).

    Example:

    >>> tokenizer = SentencePieceTokenizer.fit(text, vocabulary_size=500)
    >>> tokenizer.decode(tokenizer.encode(text)) == text
    True
    """

    kind = "sentencepiece"
    asset_files = (SENTENCEPIECE_ASSET,)

    def __init__(self, model_proto=None, **kwargs):
        super().__init__(**kwargs)
        self._model_proto = None
        if model_proto is not None:
            self.set_proto(model_proto)

    def set_proto(self, model_proto):
        """Sets the SentencePiece model (bytes) and builds the op."""
        import sentencepiece

        if not isinstance(model_proto, (bytes, bytearray)):
            raise ValueError(
                "`model_proto` must be the bytes of a SentencePiece model. "
                f"Received type {type(model_proto).__name__}."
            )
        model_proto = bytes(model_proto)
        processor = sentencepiece.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(model_proto)
        except (RuntimeError, OSError) as error:
            raise ValueError(
                "`model_proto` is not a valid SentencePiece model "
                f"({len(model_proto)} bytes): {error}"
            ) from None
        if processor.eos_id() < 0:
            raise ValueError(
                "the SentencePiece model has no end-of-sentence piece "
                "(eos_id=-1), which this tokenizer needs for newlines. "
                "Train it with eos_id >= 0."
            )
        self._model_proto = model_proto
        self._size = int(processor.GetPieceSize())
        self._eos_id = int(processor.eos_id())
        unk = int(processor.unk_id())
        self._unk_id = unk if unk >= 0 else None
        self._pieces = [
            processor.IdToPiece(index) for index in range(self._size)
        ]
        self._tokenizer = self._new_tf_tokenizer()

    def _new_tf_tokenizer(self):
        return tf_text.SentencepieceTokenizer(
            model=self._model_proto, out_type=tf.int32
        )

    def _call(self, method: str, values):
        if not tf.executing_eagerly():
            # Traced (tf.function, tf.data's map): the op is built inside the
            # graph. A handle to the eager resource would be captured, and
            # tf.random.set_seed deletes that resource for good (below).
            return getattr(self._new_tf_tokenizer(), method)(values)
        try:
            return getattr(self._tokenizer, method)(values)
        except tf.errors.NotFoundError:
            # The op's resource lives in the eager kernel cache, which
            # tf.random.set_seed (and keras.utils.set_random_seed) clears:
            # the old handle then points at nothing. Rebuild it once.
            logger.debug("Rebuilding the SentencePiece op after a reset")
            self._tokenizer = self._new_tf_tokenizer()
            return getattr(self._tokenizer, method)(values)

    def _check_ready(self):
        if self._model_proto is None:
            raise ValueError(
                "this SentencePieceTokenizer has no model yet: pass "
                "`model_proto` or call `load_assets(dir_path)`."
            )

    @classmethod
    def fit(
        cls,
        texts,
        *,
        vocabulary_size: int = 8000,
        model_type: str = "unigram",
        character_coverage: float = 1.0,
        byte_fallback: bool = False,
        max_sentence_length: int = 1 << 16,
        num_threads: int = 16,
    ):
        """Trains a SentencePiece model offline on the lines of `texts`.

        Pieces: `<eos>` (id 0), `<unk>` (id 1), then the learned pieces.
        `hard_vocab_limit=False`, so on a small corpus the vocabulary may
        come out smaller than `vocabulary_size` instead of failing.

        Args:
            texts: str or iterable of str. Training text; each non-empty
                line is one training sentence.
            vocabulary_size: int. Target number of pieces.
            model_type: str. `"unigram"`, `"bpe"`, `"char"` or `"word"`.
            character_coverage: float. Share of characters covered; the
                rest become `<unk>`.
            byte_fallback: bool. Encode uncovered characters as UTF-8 byte
                pieces, so that every text round-trips (adds 256 pieces).
            max_sentence_length: int. The trainer skips longer sentences
                (in UTF-8 bytes), so a longer line is cut into sentences of
                at most this many bytes, before a space where there is one
                (or between two characters), and trained on.
            num_threads: int. Training threads. The model depends on it
                (SentencePiece's trainer sums over each thread's share of
                the lines), so the default is a fixed 16 (SentencePiece's
                own), not the machine's CPU count: the same text gives the
                same model, ids and fingerprint on every machine.

        Returns:
            A `SentencePieceTokenizer`.
        """
        import sentencepiece

        checks.positive_int("vocabulary_size", vocabulary_size)
        checks.positive_int("num_threads", num_threads)
        if vocabulary_size < 3:
            # SentencePiece fails in a C++ assertion below its two special
            # pieces and one of text.
            raise ValueError(
                f"`vocabulary_size`={vocabulary_size} (--vocab-size) is too small: "
                "SentencePiece needs <eos>, <unk> and at least one piece of text; "
                "pass a vocabulary_size of 3 or more (in practice thousands).")
        model_types = ("unigram", "bpe", "char", "word")
        if model_type not in model_types:
            raise ValueError(
                f"`model_type` must be one of {model_types}. Received: "
                f"model_type={model_type!r}."
            )
        # Surrogateescape bytes (see `_check_surrogates`) are not UTF-8:
        # the trainer gets them as U+FFFD (the op reads each such byte as
        # U+FFFD).
        checks.positive_int("max_sentence_length", max_sentence_length)
        # The trainer skips a sentence longer than max_sentence_length: a
        # long line (text8 is one line) is cut into sentences short enough.
        lines = [
            piece
            for name, text in _as_texts(texts)
            for line in _as_valid_text(text, name).split("\n")
            if line.strip()
            for piece in _training_sentences(line, int(max_sentence_length))
        ]
        spaces = sum(line.count("\u2581") for line in lines)
        if spaces:
            logger.warning(
                "the text holds U+2581 ('\u2581') %d times: SentencePiece writes a space "
                "so, and decodes it as one, so that character does not come back from "
                "decode (a space does). Replace it in the corpus to keep it apart.", spaces)
        # SentencePiece's trainer drops the "\r" that ends a sentence (a
        # CRLF line), so a text whose lines end so would never learn it and
        # encode every line end as <unk>: "\r" is then a piece of its own.
        extra = {"user_defined_symbols": ["\r"]} if any(
            line.endswith("\r") for line in lines) else {}
        model = io.BytesIO()
        try:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=iter(lines),
                **extra,
                model_writer=model,
                vocab_size=int(vocabulary_size),
                model_type=model_type,
                character_coverage=float(character_coverage),
                byte_fallback=bool(byte_fallback),
                hard_vocab_limit=False,
                normalization_rule_name="identity",
                remove_extra_whitespaces=False,
                add_dummy_prefix=False,
                eos_id=0,
                unk_id=1,
                bos_id=-1,
                pad_id=-1,
                eos_piece=EOS_TOKEN,
                unk_piece=UNK_TOKEN,
                max_sentence_length=int(max_sentence_length),
                num_threads=int(num_threads),
                minloglevel=2,
            )
        except RuntimeError as error:
            # SentencePiece needs a piece for every character it covers (plus
            # <eos> and <unk>) and says so in a C++ assertion.
            match = re.search(r"smaller than required_chars\. (\d+) vs (\d+)",
                              str(error))
            if match is None:
                raise
            need = int(match.group(2))
            raise ValueError(
                f"`vocabulary_size`={vocabulary_size} (--vocab-size) is too "
                f"small for this text: SentencePiece needs at least {need} "
                "pieces (one per character it covers, plus <eos> and <unk>); "
                f"pass a vocabulary_size of {need} or more."
            ) from None
        tokenizer = cls(model.getvalue())
        logger.info(
            "sentencepiece (%s): %d lines, %d pieces",
            model_type,
            len(lines),
            tokenizer.vocabulary_size(),
        )
        return tokenizer

    def save_assets(self, dir_path):
        self._check_ready()
        _write_file(pathlib.Path(dir_path) / SENTENCEPIECE_ASSET, self._model_proto)

    def load_assets(self, dir_path):
        path = _asset(dir_path, SENTENCEPIECE_ASSET)
        self.set_proto(_read_tokenizer_file(path, "SentencePiece model"))

    @property
    def model_proto(self) -> bytes:
        """bytes. The serialized SentencePiece model."""
        self._check_ready()
        return self._model_proto

    def vocabulary_size(self) -> int:
        self._check_ready()
        return self._size

    def get_vocabulary(self) -> list[str]:
        self._check_ready()
        return list(self._pieces)

    @property
    def eos_id(self) -> int:
        self._check_ready()
        return self._eos_id

    @property
    def unk_id(self) -> int | None:
        self._check_ready()
        return self._unk_id

    def _tokenize_batch(self, texts):
        lines = _split_documents(texts)  # (B, lines)
        ids = lines.with_values(self._call("tokenize", lines.values))
        return _with_eos(ids, self._eos_id)

    def _detokenize_batch(self, ids):
        lines, lines_per_text = _lines_between_eos(ids, self._eos_id)
        return _join_lines(self._call("detokenize", lines), lines_per_text)


@keras.saving.register_keras_serializable(package="keras_txl")
class WordPieceTokenizer(_VocabularyTokenizer):
    """WordPiece subwords (BERT style), applied with tensorflow-text.

    Lines are normalized with `tensorflow_text.FastBertNormalizer` (lower
    case, accents stripped) when `lower_case=True`, then split on whitespace
    and punctuation and into word pieces by
    `tensorflow_text.FastWordpieceTokenizer`; each newline becomes `<eos>`.
    `decode` joins words with single spaces (so `"a, b"` comes back as
    `"a , b"`): the round trip is not exact. Not keras-hub's
    `WordPieceTokenizer`: its own pre-splitting gives other ids than the
    vocabularies this kind has always produced, and it has no `<eos>` for
    newlines.

    Args:
        vocabulary: list of str, or None (then `load_assets`). Tokens;
            continuation pieces start with `suffix_indicator`. Must contain
            `unk_token` and `eos_token`.
        lower_case: bool. Normalize as uncased BERT does.
        suffix_indicator: str. Prefix of word-continuation pieces.
        unk_token: str. Token for words that cannot be split.
        eos_token: str. End-of-line token.

    Example:

    >>> tokenizer = WordPieceTokenizer.fit(text, vocabulary_size=500)
    >>> tokenizer.decode(tokenizer.encode("Hello, World"))
    'hello , world'
    """

    kind = "wordpiece"
    asset_files = (VOCABULARY_FILE_NAME,)

    def __init__(
        self,
        vocabulary=None,
        *,
        lower_case: bool = True,
        suffix_indicator: str = "##",
        unk_token: str = UNK_TOKEN,
        eos_token: str = EOS_TOKEN,
        **kwargs,
    ):
        _check_distinct_specials(unk_token, eos_token)
        self._lower_case = bool(lower_case)
        self._suffix_indicator = suffix_indicator
        self._unk_token = unk_token
        self._eos_token = eos_token
        self._normalizer = (
            tf_text.FastBertNormalizer(lower_case_nfd_strip_accents=True)
            if lower_case
            else None
        )
        super().__init__(vocabulary, **kwargs)

    def _validate(self, vocabulary):
        vocabulary = _check_vocabulary(
            vocabulary,
            {"unknown": self._unk_token, "end-of-line": self._eos_token},
        )
        # The pieces of words split at whitespace (the specials included:
        # `vocabulary.txt` holds one token a line).
        _check_words(vocabulary, (), False)
        if self._normalizer is not None:
            self._check_normalized(vocabulary)
        return vocabulary

    def _check_normalized(self, vocabulary):
        """With `lower_case`, pieces are looked up in normalized text: a
        piece the normalizer changes ("Hello", "é", "ß") is in no such
        text, and its id is never given (the text reads as `[UNK]` or other
        pieces). Said in a warning, not refused: a stock uncased BERT
        vocabulary holds a few such pieces and its `[CLS]`-style reserved
        tokens (left out of the warning), and the alternative a refusal
        would point to, `lower_case=False`, would look up cased text in an
        uncased vocabulary. The specials are inserted, not looked up."""
        indicator = self._suffix_indicator
        bodies = [
            token[len(indicator):] if indicator and token.startswith(indicator) else token
            for token in vocabulary
        ]
        normalized = self._normalizer.normalize(
            tf.constant([_utf8(body) for body in bodies], tf.string)
        ).numpy()
        specials = {self._unk_token, self._eos_token}
        unreachable = [
            (index, token, low.decode("utf-8"))
            for index, (token, body, low) in enumerate(zip(vocabulary, bodies, normalized))
            if token not in specials and low.decode("utf-8") != body
            and not re.fullmatch(r"\[[A-Za-z0-9_]+\]", token)
        ]
        if unreachable:
            shown = ", ".join(f"{token!r} (index {index}) -> {low!r}"
                              for index, token, low in unreachable[:5])
            logger.warning(
                "WordPiece vocabulary with lower_case=True: %d piece(s) change under "
                "the normalizer (lower case, accents stripped: tensorflow-text's "
                "FastBertNormalizer), so no text gives them and their ids are never "
                "produced: %s%s. For a cased vocabulary pass lower_case=False.",
                len(unreachable), shown, " ..." if len(unreachable) > 5 else "")

    def _build_tables(self, vocabulary):
        self._unk_id = vocabulary.index(self._unk_token)
        self._eos_id = vocabulary.index(self._eos_token)
        self._tokenizer = tf_text.FastWordpieceTokenizer(
            vocab=vocabulary,
            suffix_indicator=self._suffix_indicator,
            unknown_token=self._unk_token,
            no_pretokenization=False,
            support_detokenization=True,
            token_out_type=tf.int32,
        )

    @classmethod
    def fit(
        cls,
        texts,
        *,
        vocabulary_size: int = 8000,
        lower_case: bool = True,
        unk_token: str = UNK_TOKEN,
        eos_token: str = EOS_TOKEN,
    ):
        """Learns a WordPiece vocabulary offline with tensorflow-text.

        Uses `tensorflow_text.tools.wordpiece_vocab.bert_vocab_from_dataset`
        over the non-empty lines of `texts`, with `eos_token` and
        `unk_token` reserved at ids 0 and 1. The result may be smaller than
        `vocabulary_size` on a small corpus, and larger (with a warning)
        when the text has many distinct characters: the learner keeps every
        character and its `##` form whatever the size.

        Args:
            texts: str or iterable of str. Training text.
            vocabulary_size: int. Target vocabulary size.
            lower_case: bool. See the class.
            unk_token: str. See the class.
            eos_token: str. See the class.

        Returns:
            A `WordPieceTokenizer`.
        """
        from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset as vocab_learner

        checks.positive_int("vocabulary_size", vocabulary_size)
        # Bytes that are not UTF-8 (surrogateescape, `_check_surrogates`)
        # are U+FFFD for the learner, as `tokenize` reads them. Words are
        # split at every `UNICODE_WHITESPACE` character, as `tokenize`
        # splits them: the learner's BERT split keeps some (U+1680) inside
        # words, and would learn pieces no text gets.
        lines = [
            _WHITESPACE.sub(" ", line).encode("utf-8")
            for name, text in _as_texts(texts)
            for line in _as_valid_text(text, name).split("\n")
            if line.strip()
        ]
        dataset = tf.data.Dataset.from_tensor_slices(lines).batch(1024)
        vocabulary = vocab_learner.bert_vocab_from_dataset(
            dataset,
            vocab_size=int(vocabulary_size),
            reserved_tokens=[eos_token, unk_token],
            bert_tokenizer_params={"lower_case": bool(lower_case)},
        )
        logger.info(
            "wordpiece vocabulary: %d lines, %d tokens",
            len(lines),
            len(vocabulary),
        )
        if len(vocabulary) > vocabulary_size:
            logger.warning(
                "the wordpiece vocabulary has %d tokens, more than vocabulary_size=%d: "
                "bert_vocab_from_dataset keeps every character of the text, and its "
                "\"##\" form, whatever the size asked. The model's vocabulary_size "
                "must be %d.", len(vocabulary), vocabulary_size, len(vocabulary))
        return cls(
            vocabulary,
            lower_case=lower_case,
            unk_token=unk_token,
            eos_token=eos_token,
        )

    def save_assets(self, dir_path):
        _write_vocabulary(
            pathlib.Path(dir_path) / VOCABULARY_FILE_NAME,
            self.get_vocabulary(),
        )

    @property
    def eos_id(self) -> int:
        self._check_ready()
        return self._eos_id

    @property
    def unk_id(self) -> int:
        self._check_ready()
        return self._unk_id

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "lower_case": self._lower_case,
            "suffix_indicator": self._suffix_indicator,
            "unk_token": self._unk_token,
            "eos_token": self._eos_token,
        }

    def _tokenize_batch(self, texts):
        lines = _split_documents(texts)  # (B, lines)
        # Bytes that are not UTF-8 as U+FFFD: no piece holds part of a
        # character (identity for UTF-8 text).
        values = _fix_lines(lines.values, _VALID_LINE, _as_utf8)
        if self._normalizer is not None:
            values = self._normalizer.normalize(values)
        ids = lines.with_values(self._tokenizer.tokenize(values))
        return _with_eos(ids, self._eos_id)

    def _detokenize_batch(self, ids):
        lines, lines_per_text = _lines_between_eos(ids, self._eos_id)
        return _join_lines(self._tokenizer.detokenize(lines), lines_per_text)


@keras.saving.register_keras_serializable(package="keras_txl")
class OfficialSymbolTokenizer(_VocabularyTokenizer):
    """The symbols of the official enwik8 and text8 releases.

    The official preprocessing writes enwik8 as the decimal values of its
    UTF-8 bytes (`prep_enwik8.py`: "60 109 101 ...") and text8 as its
    characters with "_" for a space (`prep_text8.py`), separated by spaces;
    `data_utils.py` then drops the newlines (no `<eos>` for these
    datasets). This tokenizer applies the same steps to raw text, so its
    ids are the ids the official models were trained and evaluated on. The
    official vocabularies have no unknown symbol: a symbol outside the
    vocabulary raises a `ValueError` in `encode` (an `InvalidArgumentError`
    in `tokenize`).

    Args:
        vocabulary: list of str, or None (then `load_assets`). The
            release's symbols in id order (see
            `docs/official_checkpoints.md`): decimal byte values for
            enwik8, single characters for text8.
        dataset: str. "enwik8" or "text8".

    Example:

    >>> tokenizer = OfficialSymbolTokenizer(["_", "a", "b"], "text8")
    >>> tokenizer.encode("ab a").tolist()
    [1, 2, 0, 1]
    """

    kind = "official_symbols"
    # enwik8's symbols are bytes, text8's characters: bits per character.
    unit = "character"
    DATASETS = ("enwik8", "text8")

    def __init__(self, vocabulary=None, dataset: str = None, **kwargs):
        if dataset not in self.DATASETS:
            raise ValueError(
                f"`dataset` must be one of {self.DATASETS}, received "
                f"dataset={dataset!r}."
            )
        self._dataset = dataset
        self._splitter = tf_text.UnicodeCharTokenizer()
        super().__init__(vocabulary, **kwargs)

    def _validate(self, vocabulary):
        vocabulary = _check_vocabulary(vocabulary, {})
        # Each symbol as `_symbols_of` writes it (one spelling per byte):
        # another spelling ("007", "٣") is an id no text gets, and "7" beside
        # "007" two ids for one byte. "10", the newline, which the official
        # data drops, is allowed: a vocabulary counted on text that kept its
        # newlines (another preparation's checkpoint) holds it, unused here.
        for index, token in enumerate(vocabulary):
            if self._dataset == "enwik8" and token not in _BYTE_SYMBOLS:
                raise ValueError(
                    "an enwik8 vocabulary holds byte values 0-255 written in "
                    f"decimal without leading zeros. Received {token!r} at "
                    f"index {index}."
                )
            if self._dataset == "text8" and (
                len(token) != 1 or token in " \n"
            ):
                raise ValueError(
                    "a text8 vocabulary holds single characters, with '_' "
                    "for a space and no newline (the official data drops "
                    f"it). Received {token!r} at index {index}."
                )
        return vocabulary

    def _build_tables(self, vocabulary):
        self._ids = {token: index for index, token in enumerate(vocabulary)}
        if self._dataset == "enwik8":
            keys = [int(token) for token in vocabulary]
            # Detokenize: id -> its byte.
            self._symbols = tf.constant([bytes([k]) for k in keys], tf.string)
        else:
            keys = [ord(token) for token in vocabulary]
            self._symbols = tf.constant(
                [_utf8(" " if t == "_" else t) for t in vocabulary], tf.string
            )
        self._table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(keys, tf.int64),
                tf.range(len(keys), dtype=tf.int64),
            ),
            default_value=-1,
        )

    @classmethod
    def fit(cls, texts, *, dataset: str):
        """A vocabulary of the symbols of `texts` in decreasing frequency
        (the official order; ties by first appearance)."""
        counts: dict = {}
        for name, text in _as_texts(texts):
            for symbol in cls._symbols_of(text, dataset, name):
                counts[symbol] = counts.get(symbol, 0) + 1
        return cls(_frequency_order(counts), dataset)

    @staticmethod
    def _symbols_of(text: str, dataset: str, name: str = "text") -> list:
        # Lone surrogates by the rule of `_check_surrogates`: bytes that are
        # not UTF-8 are read as `tokenize` reads them.
        if dataset == "enwik8":
            return [str(byte) for byte in _utf8(text, name) if byte != 10]
        return [
            "_" if c == " " else c
            for c in _as_valid_text(text, name) if c != "\n"
        ]

    @property
    def newline_handling(self) -> str:
        return "dropped"

    def get_config(self) -> dict:
        return {**super().get_config(), "dataset": self._dataset}

    def _tokenize_batch(self, texts):
        if self._dataset == "enwik8":
            keys = tf.ragged.map_flat_values(
                tf.io.decode_raw, tf.strings.bytes_split(texts), tf.uint8
            )  # (B, None, 1)
            keys = tf.cast(keys.merge_dims(1, 2), tf.int64)
        else:
            keys = tf.cast(self._splitter.tokenize(texts), tf.int64)
            keys = tf.ragged.map_flat_values(
                tf.where, tf.equal(keys, ord(" ")), tf.constant(ord("_"), tf.int64), keys
            )
        keys = tf.ragged.boolean_mask(keys, tf.not_equal(keys, 10))
        ids = tf.ragged.map_flat_values(self._table.lookup, keys)
        check = tf.debugging.assert_non_negative(
            ids.flat_values,
            message=f"a symbol is not in the {self._dataset} vocabulary",
        )
        with tf.control_dependencies([check]):
            return tf.cast(ids, tf.int32)

    def _detokenize_batch(self, ids):
        symbols = tf.ragged.map_flat_values(tf.gather, self._symbols, ids)
        texts = tf.strings.reduce_join(symbols, axis=1)
        if self._dataset == "enwik8":
            texts = tf.strings.unicode_transcode(
                texts, "UTF-8", "UTF-8", errors="replace"
            )
        return texts

    def encode(self, text: str) -> np.ndarray:
        self._check_ready()
        symbols = self._symbols_of(_check_text(text), self._dataset)
        try:
            ids = [self._ids[symbol] for symbol in symbols]
        except KeyError as error:
            raise ValueError(
                f"symbol {error.args[0]!r} is not in the {self._dataset} "
                "vocabulary (the official vocabularies have no unknown "
                "symbol)."
            ) from None
        return np.asarray(ids, dtype=np.int32)

    def decode(self, ids) -> str:
        self._check_ready()
        tokens = [
            self._vocabulary[i]
            for i in _ids_array(ids, self.vocabulary_size())
        ]
        if self._dataset == "enwik8":
            data = bytes(int(token) for token in tokens)
            return data.decode("utf-8", "replace")
        return "".join(" " if token == "_" else token for token in tokens)


# enwik8's symbols: the decimal values of bytes, as prep_enwik8.py writes them.
_BYTE_SYMBOLS = frozenset(str(byte) for byte in range(BYTE_VOCABULARY_SIZE))

# The datasets of the official releases, whose tokenizer `official_tokenizer` builds.
# The released ones, then those the official data_utils.py also prepares.
OFFICIAL_DATASETS = ("wt103", "lm1b", "enwik8", "text8", "wt2", "ptb")


def official_tokenizer(vocabulary, dataset: str) -> TransformerXLTokenizer:
    """The tokenizer of an official Transformer-XL release.

    Args:
        vocabulary: list of str. The release's symbols in id order.
        dataset: str. "wt103", "lm1b", "enwik8" or "text8" (the `dataset`
            of its `corpus-info.json`), or "wt2" / "ptb", which the official
            `data_utils.py` prepares too (no released model).

    Returns:
        wt103, wt2: a `WordTokenizer` with `<eos>` for newlines and `<unk>`;
        ptb: the same, lower-casing the text (`Vocab(lower_case=True)`);
        lm1b: a `WordTokenizer` writing each line as `<S> words <S>` (the
        official `add_double_eos`) and mapping unknown words to `<UNK>`;
        enwik8 / text8: an `OfficialSymbolTokenizer`.
    """
    vocabulary = list(vocabulary)
    if dataset in OfficialSymbolTokenizer.DATASETS:
        return OfficialSymbolTokenizer(vocabulary, dataset)
    if dataset in ("wt103", "wt2", "ptb"):
        unk = UNK_TOKEN if UNK_TOKEN in vocabulary else None
        return WordTokenizer(vocabulary, unk_token=unk, eos_token=EOS_TOKEN,
                             lower_case=dataset == "ptb")
    if dataset == "lm1b":
        unk = "<UNK>" if "<UNK>" in vocabulary else None
        return WordTokenizer(
            vocabulary, unk_token=unk, eos_token="<S>", double_eos=True
        )
    raise ValueError(
        f"`dataset` must be one of {OFFICIAL_DATASETS}, received dataset={dataset!r}."
    )


# === Building, loading and exporting ===

_TOKENIZERS = {
    cls.kind: cls
    for cls in (
        CharTokenizer,
        ByteTokenizer,
        WordTokenizer,
        SentencePieceTokenizer,
        WordPieceTokenizer,
    )
}
TOKENIZER_KINDS = tuple(_TOKENIZERS)
# Kinds that are read back but not fitted by `build_tokenizer`.
_LOADABLE = {**_TOKENIZERS, OfficialSymbolTokenizer.kind: OfficialSymbolTokenizer}
# The classes a tokenizer.json may name (an allow-list: a folder from
# elsewhere never makes Keras import or build anything else).
_REGISTERED = {
    keras.saving.get_registered_name(cls): cls for cls in _LOADABLE.values()
}


def _tokenizer_class(kind) -> type:
    if kind not in _TOKENIZERS:
        raise ValueError(
            f"`kind` must be one of {TOKENIZER_KINDS}. Received: kind={kind!r}."
        )
    return _TOKENIZERS[kind]


def build_tokenizer(kind: str, texts=None, **options) -> TransformerXLTokenizer:
    """Fits a tokenizer of the given kind on training text.

    Args:
        kind: str. One of `"char"`, `"byte"`, `"word"`, `"sentencepiece"`,
            `"wordpiece"`.
        texts: str or iterable of str. Training text (not needed for
            `"byte"`). Build word vocabularies on the training split only,
            as for WikiText-103.
        **options: Options of the kind's `fit` method, e.g. `max_size` and
            `min_freq` for `"word"`, `vocabulary_size` for the subword
            kinds.

    Returns:
        A `TransformerXLTokenizer`.

    Raises:
        ValueError: for an unknown kind, an option the kind does not take,
            or no training text.

    Example:

    >>> tokenizer = build_tokenizer("word", "the cat\\nthe dog\\n")
    >>> tokenizer.vocabulary[:3]
    ['<eos>', '<unk>', 'the']
    """
    cls = _tokenizer_class(kind)
    parameters = inspect.signature(cls.fit).parameters
    accepted = [name for name in parameters if name != "texts"]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"tokenizer kind {kind!r} does not take the option(s) {unknown}. "
            f"Valid options: {accepted}."
        )
    if kind == "byte":
        return cls.fit(texts)
    return cls.fit(texts, **options)


def _load_keras_hub_layout(directory, path, data):
    name = data.get("registered_name")
    if name not in _REGISTERED:
        raise ValueError(
            f"{path} names the class registered_name={name!r}; a keras-txl "
            f"tokenizer is one of {sorted(_REGISTERED)}."
        )
    config = data.get("config")
    if not isinstance(config, dict):
        raise ValueError(
            f"{path} must hold the tokenizer's settings as a JSON object "
            f"under 'config'. Received: {type(config).__name__}."
        )
    cls = _REGISTERED[name]
    # Ids are int32: a serialized dtype policy from the file is not built.
    config = {k: v for k, v in config.items() if k != "dtype"}
    try:
        tokenizer = cls.from_config(config)
    except (TypeError, ValueError) as error:
        # Keras rejects unknown keyword arguments with a ValueError.
        raise ValueError(f"{path} has invalid 'config': {error}") from None
    assets = directory / ASSET_DIR
    for file_name in tokenizer.file_assets:
        if not os.path.lexists(assets / file_name):
            raise ValueError(
                f"the tokenizer in {directory} has no {ASSET_DIR}/"
                f"{file_name}: the {tokenizer.kind} tokenizer needs it."
            )
    _check_asset_digests(path, assets, tokenizer.file_assets, data)
    tokenizer.load_assets(str(assets))
    return tokenizer


def _check_asset_digests(path, assets, file_names, data):
    """The asset files must have the sha256s tokenizer.json records (when
    it records them): a vocabulary cut short, edited or left by another
    save is a ValueError, not a different tokenizer."""
    digests = data.get(ASSETS_SHA256_KEY)
    if digests is None:
        return
    if not isinstance(digests, dict) or set(digests) != set(file_names):
        raise ValueError(
            f"{path} must record under {ASSETS_SHA256_KEY!r} the sha256 of "
            f"each of {list(file_names)}. Received: {digests!r:.200}."
        )
    for name in file_names:
        file = _asset(assets, name)
        actual = hashlib.sha256(
            _read_tokenizer_file(file, "tokenizer asset")
        ).hexdigest()
        if actual != digests[name]:
            raise ValueError(
                f"{file} does not have the sha256 {path} records for it "
                f"({actual} instead of {digests[name]!r:.80}): the file was "
                "cut short, changed, or written by another save. Save the "
                "tokenizer again."
            )


def _load_old_layout(directory, path, config):
    version = config.get("format_version")
    if version != OLD_FORMAT_VERSION:
        raise ValueError(
            f"{path} has format_version={version!r}; this version of "
            f"keras-txl reads format_version={OLD_FORMAT_VERSION} (and "
            "keras-hub's layout)."
        )
    kind = config["kind"]
    cls = _LOADABLE[kind] if kind in _LOADABLE else _tokenizer_class(kind)
    if cls is ByteTokenizer:
        return cls()
    if cls is CharTokenizer:
        return cls(config["vocabulary"], unk_token=config["unk_token"])
    if cls is OfficialSymbolTokenizer:
        return cls(config["vocabulary"], config["dataset"])
    if cls is SentencePieceTokenizer:
        model = _file_in(directory, config["model_file"], "model_file")
        return cls(_read_tokenizer_file(model, "SentencePiece model"))
    vocabulary = _read_vocabulary(
        _file_in(directory, config["vocabulary_file"], "vocabulary_file")
    )
    if cls is WordTokenizer:
        return cls(
            vocabulary,
            add_eos=config["add_eos"],
            lower_case=config["lower_case"],
            unk_token=config["unk_token"],
            eos_token=config["eos_token"],
            double_eos=config.get("double_eos", False),
        )
    return cls(
        vocabulary,
        lower_case=config["lower_case"],
        suffix_indicator=config["suffix_indicator"],
        unk_token=config["unk_token"],
        eos_token=config["eos_token"],
    )


# Config keys that name the layer or its files, not what it does.
_NOT_BEHAVIOUR = ("name", "trainable", "dtype", "config_file")


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of what decides a tokenizer's ids: its class, its config
    (without the layer's name and file names), its vocabulary and, for
    SentencePiece, its model. Equal for the same tokenizer saved in a
    keras-txl folder and in a keras-hub preset, whose files differ."""
    import hashlib

    if not isinstance(tokenizer, TransformerXLTokenizer):
        raise ValueError(
            "`tokenizer` must be a keras-txl TransformerXLTokenizer. "
            f"Received type {type(tokenizer).__name__}.")
    config = {k: v for k, v in tokenizer.get_config().items() if k not in _NOT_BEHAVIOUR}
    digest = hashlib.sha256(json.dumps(
        [type(tokenizer).__name__, config], sort_keys=True, default=repr).encode())
    for token in tokenizer.get_vocabulary():
        digest.update(token.encode("utf-8", "surrogatepass") + b"\0")
    proto = getattr(tokenizer, "_model_proto", None)
    if proto:
        digest.update(proto)
    return digest.hexdigest()


def load_tokenizer(directory, limits=None) -> TransformerXLTokenizer:
    """Reads a tokenizer written by `TransformerXLTokenizer.save`.

    Reads keras-hub's layout (`tokenizer.json` naming a registered
    keras-txl class, plus `assets/tokenizer/`) and, read-only, the old
    keras-txl layout (`tokenizer.json` with `kind` and
    `format_version: 1`, plus `vocab.txt` or `sentencepiece.model`).
    Only keras-txl tokenizer classes are built, every file must be a
    regular file inside the folder (symlinks are followed: hub caches use
    them), and sizes are bounded by `limits`.

    Args:
        directory: str or path-like. The tokenizer's folder.
        limits: bounds on tokenizer.json and the vocabulary size (see
            `keras_txl.limits`).

    Returns:
        The `TransformerXLTokenizer`, which encodes exactly like the saved
        one.

    Raises:
        ValueError: if the directory or a file is missing or invalid, names
            an unknown class or kind, or the vocabulary exceeds
            `max_vocabulary_size`.
    """
    directory = pathlib.Path(directory)
    path = directory / TOKENIZER_FILE
    if not os.path.lexists(path):
        raise ValueError(
            f"no tokenizer in {directory}: {path} does not exist. Save one "
            "with tokenizer.save(directory)."
        )
    resolved = resolve_limits(limits)
    data = safe_files.read_json(path, limits)
    if not isinstance(data, dict) or not (
        "kind" in data or "registered_name" in data
    ):
        raise ValueError(
            f"{path} must be a JSON object with a 'registered_name' (keras-hub"
            " layout) or a 'kind' key (old keras-txl layout)."
        )
    try:
        if "registered_name" in data:
            tokenizer = _load_keras_hub_layout(directory, path, data)
        else:
            tokenizer = _load_old_layout(directory, path, data)
    except KeyError as error:
        raise ValueError(f"{path} is missing the key {error}.") from None
    size = tokenizer.vocabulary_size()
    if size > resolved.max_vocabulary_size:
        raise ValueError(
            f"the tokenizer in {directory} has vocabulary_size={size}, "
            f"which exceeds the limit max_vocabulary_size="
            f"{resolved.max_vocabulary_size}."
        )
    expected = data.get("vocabulary_size")
    if expected is not None and expected != size:
        raise ValueError(
            f"{path} says vocabulary_size={expected}, but the files in "
            f"{directory} give {size}."
        )
    return tokenizer


_LINE_BREAK_NAMES = {"\n": "\\n", "\r": "\\r"}


def export_vocabulary(tokenizer, path) -> pathlib.Path:
    """Writes a tokenizer's vocabulary for an app beside a TFLite model.

    LiteRT has no tensorflow-text ops, so TFLite models take token ids and
    the app tokenizes. This writes, into the folder `path`:

    - `vocabulary.txt`: one token per line, line i = id i (UTF-8; lines
      end at `"\\n"` only). A token that is itself a newline or carriage
      return (a char vocabulary) is written as the two characters `\\n` or
      `\\r`; the byte kind writes the decimal byte
      values 0-255 (its id is the byte value);
    - `vocabulary.spm`: the SentencePiece model, for that kind (apps apply
      it with the SentencePiece library, then the newline rule below);
    - `tokenizer_info.json`: `kind`, `vocabulary_size`, `eos_id`,
      `unk_id`, `pad_id`, `newline` (how a newline of the text becomes
      ids: `"eos"` one `eos_id` per newline, `"double_eos"` every line
      written as `eos words eos`, `"character"` the newline's own id,
      `"dropped"`, or `"byte"` byte 10) and `lower_case` where the kind
      has it.

    Args:
        tokenizer: `TransformerXLTokenizer`.
        path: str or path-like. A folder, created if needed.

    Returns:
        The folder, as a `pathlib.Path`.
    """
    if not isinstance(tokenizer, TransformerXLTokenizer):
        raise ValueError(
            "`tokenizer` must be a keras-txl TransformerXLTokenizer. "
            f"Received type {type(tokenizer).__name__}."
        )
    directory = pathlib.Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    newline = tokenizer.newline_handling
    if isinstance(tokenizer, ByteTokenizer):
        tokens = [str(byte) for byte in range(BYTE_VOCABULARY_SIZE)]
    else:
        # A newline or carriage-return token (char and text8 vocabularies:
        # CRLF text has "\r") as two characters: one token a line.
        tokens = [
            _LINE_BREAK_NAMES.get(token, token)
            for token in tokenizer.get_vocabulary()
        ]
    _write_vocabulary(directory / EXPORT_VOCABULARY_FILE, tokens)
    if isinstance(tokenizer, SentencePieceTokenizer):
        _write_file(directory / SENTENCEPIECE_ASSET, tokenizer.model_proto)
    info = {
        "kind": tokenizer.kind,
        "vocabulary_size": tokenizer.vocabulary_size(),
        "eos_id": tokenizer.eos_id,
        "unk_id": tokenizer.unk_id,
        "pad_id": tokenizer.pad_token_id,
        "newline": newline,
    }
    config = tokenizer.get_config()
    for key in ("lower_case", "dataset", "eos_token", "unk_token"):
        if key in config:
            info[key] = config[key]
    _write_json(directory / EXPORT_INFO_FILE, info)
    return directory
