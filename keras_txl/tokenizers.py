"""Tokenizers for language-model corpora, built on tensorflow-text.

Every tokenizer turns a whole document (or a whole corpus split) into one
1-D stream of int32 ids and back, and has the same small interface:

- `encode(text) -> np.ndarray` (int32, shape `(N,)`);
- `decode(ids) -> str`;
- `vocabulary_size` (int), `eos_id` / `unk_id` (int or None);
- `save(directory)`, which writes plain files (`tokenizer.json`, plus a
  `vocab.txt` or a `sentencepiece.model`; never pickle), read back by
  `load_tokenizer(directory)`;
- `check_model_vocabulary(vocabulary_size)`, which raises a `ValueError`
  when a model was built for a different vocabulary.

`build_tokenizer(kind, texts, **options)` fits one on training text. Kinds:

- `"char"`: Unicode characters (`tensorflow_text.UnicodeCharTokenizer`).
  The vocabulary is `<unk>` followed by the characters of the training text
  in decreasing frequency. Lossless for characters seen in training.
- `"byte"`: UTF-8 bytes, a fixed vocabulary of 256. Lossless for any text.
- `"word"`: WikiText-103 style. Lines are split on whitespace
  (`tensorflow_text.WhitespaceTokenizer`) and every newline becomes
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

Reference: Dai et al., "Transformer-XL", arXiv:1901.02860, section 4, and
the official `vocabulary.py` (frequency order, specials first).
"""

from __future__ import annotations

import inspect
import io
import json
import logging
import numbers
import os
import pathlib
from typing import Iterable

import numpy as np
import tensorflow as tf

from keras_txl import checks
from keras_txl import safe_files
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
    "UNK_TOKEN",
    "ByteTokenizer",
    "CharTokenizer",
    "OfficialSymbolTokenizer",
    "SentencePieceTokenizer",
    "Tokenizer",
    "WordPieceTokenizer",
    "WordTokenizer",
    "build_tokenizer",
    "load_tokenizer",
    "official_tokenizer",
]

TOKENIZER_FILE = "tokenizer.json"
VOCABULARY_FILE = "vocab.txt"
SENTENCEPIECE_FILE = "sentencepiece.model"
FORMAT_VERSION = 1
UNK_TOKEN = "<unk>"
EOS_TOKEN = "<eos>"
BYTE_VOCABULARY_SIZE = 256

# Text is tokenized in pieces of about this many characters, cut after a
# newline, so that a large corpus never becomes one huge tensor.
_CHUNK_CHARS = 1 << 22


# === Helpers ===


def _utf8(text: str) -> bytes:
    # "replace" turns lone surrogates into "?" instead of failing; every
    # other character is encoded exactly.
    return text.encode("utf-8", "replace")


def _check_text(text) -> str:
    if not isinstance(text, str):
        raise ValueError(
            "`text` must be a str (a whole document or corpus split). "
            f"Received type {type(text).__name__}."
        )
    return text


def _as_texts(texts) -> list[str]:
    if isinstance(texts, str):
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
    return texts


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


def _split_lines(chunk: str) -> tf.Tensor:
    # (num_lines,) string; k newlines give k + 1 lines, the last possibly ""
    return tf.strings.split(tf.constant(_utf8(chunk)), sep="\n")


def _append_eos(lines_ids: tf.RaggedTensor, eos_id: int) -> np.ndarray:
    """Flattens `(lines, None)` ids with `eos_id` after all but the last."""
    rows = lines_ids.nrows()
    eos = tf.RaggedTensor.from_tensor(
        tf.fill(tf.stack([rows, 1]), tf.cast(eos_id, lines_ids.dtype))
    )
    flat = tf.concat([lines_ids, eos], axis=1).flat_values.numpy()
    return flat[:-1]  # a newline follows every line but the last


def _wrap_lines(lines_ids: tf.RaggedTensor, eos_id: int, ends_with_newline: bool) -> np.ndarray:
    """Flattens `(lines, None)` ids with `eos_id` before and after every line.

    The official LM1B stream (`add_double_eos`): each line of the file is
    `<S> words <S>`. The empty piece after a final newline is no line.
    """
    if ends_with_newline:
        lines_ids = lines_ids[:-1]
    rows = lines_ids.nrows()
    eos = tf.RaggedTensor.from_tensor(
        tf.fill(tf.stack([rows, 1]), tf.cast(eos_id, lines_ids.dtype))
    )
    return tf.concat([eos, lines_ids, eos], axis=1).flat_values.numpy()


def _frequency_order(counts: dict) -> list:
    # `counts` is in order of first appearance; a stable sort by decreasing
    # count keeps that order among ties (like Counter.most_common).
    return sorted(counts, key=counts.get, reverse=True)


def _add_counts(counts: dict, values: tf.Tensor) -> None:
    unique, _, count = tf.unique_with_counts(values)
    for token, number in zip(unique.numpy().tolist(), count.numpy().tolist()):
        counts[token] = counts.get(token, 0) + number


def _select_vocabulary(
    specials: list[str],
    ordered: list[str],
    counts: dict,
    max_size,
    min_freq,
) -> list[str]:
    if max_size is not None:
        if (
            isinstance(max_size, bool)
            or not isinstance(max_size, numbers.Integral)
            or max_size <= len(specials)
        ):
            raise ValueError(
                "`max_size` is the total vocabulary size including the "
                f"special tokens {specials}, so it must be an integer > "
                f"{len(specials)}. Received: max_size={max_size!r}."
            )
    if (
        isinstance(min_freq, bool)
        or not isinstance(min_freq, numbers.Integral)
        or min_freq < 1
    ):
        raise ValueError(
            "`min_freq` must be a positive integer. Received: "
            f"min_freq={min_freq!r}."
        )
    vocabulary = list(specials)
    special_set = set(specials)
    for token in ordered:
        if max_size is not None and len(vocabulary) >= max_size:
            break
        if counts[token] < min_freq:
            break
        if token not in special_set:
            vocabulary.append(token)
    return vocabulary


def _check_vocabulary(vocabulary, required: dict) -> list[str]:
    if isinstance(vocabulary, str):
        raise ValueError(
            "`vocabulary` must be a list of str tokens, not a single str."
        )
    vocabulary = list(vocabulary)
    for index, token in enumerate(vocabulary):
        if not isinstance(token, str) or not token:
            raise ValueError(
                "`vocabulary` must hold non-empty str tokens. Received "
                f"{token!r} at index {index}."
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


def _rows_between(ids: np.ndarray, eos_id: int) -> tf.RaggedTensor:
    """Groups ids into lines separated by `eos_id` (dropped)."""
    is_eos = ids == eos_id
    row_of_token = np.cumsum(is_eos) - is_eos  # eos before each token
    keep = ~is_eos
    return tf.RaggedTensor.from_value_rowids(
        tf.constant(ids[keep], tf.int32),
        tf.constant(row_of_token[keep], tf.int64),
        nrows=int(is_eos.sum()) + 1,
    )


def _write_json(path: pathlib.Path, data: dict) -> None:
    path.write_text(
        json.dumps(data, indent=2, ensure_ascii=False) + "\n",
        encoding="utf-8",
    )


def _write_vocabulary(path: pathlib.Path, vocabulary: list[str]) -> None:
    for token in vocabulary:
        if "\n" in token or "\r" in token:
            raise ValueError(
                f"token {token!r} contains a line break and cannot be "
                f"written to {path}, one token per line."
            )
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        handle.write("\n".join(vocabulary) + "\n")


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


# === Tokenizers ===


class Tokenizer:
    """Base class: the interface shared by all tokenizers.

    Subclasses set `kind`, implement `encode`, `decode`,
    `vocabulary_size`, `get_config` and the class methods `fit` and
    `_from_directory`, and may write extra files in `_save_files`.
    """

    kind = ""

    def encode(self, text: str) -> np.ndarray:
        """Token ids of `text`, a whole document, as int32 `(N,)`."""
        raise NotImplementedError

    def decode(self, ids) -> str:
        """Text of the token ids `ids` (1-D)."""
        raise NotImplementedError

    @property
    def vocabulary_size(self) -> int:
        """int. Number of token ids; ids are in `[0, vocabulary_size)`."""
        raise NotImplementedError

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

    def unknown_characters(self, text: str) -> list[str]:
        """The distinct characters of `text` that do not reach a model as
        themselves (they become `<unk>` or U+FFFD), in order of first
        appearance. Empty for kinds whose unknown pieces are words or
        subwords (compare `decode(encode(text))` with `text` for those)."""
        _check_text(text)
        return []

    def get_config(self) -> dict:
        """JSON-serializable settings: `kind` and the kind's options."""
        return {"kind": self.kind}

    def check_model_vocabulary(self, vocabulary_size: int) -> None:
        """Checks that a model's vocabulary matches this tokenizer.

        Args:
            vocabulary_size: int. The model's `vocabulary_size`.

        Raises:
            ValueError: if it differs from `self.vocabulary_size`.
        """
        if vocabulary_size != self.vocabulary_size:
            raise ValueError(
                f"the tokenizer (kind={self.kind!r}) has vocabulary_size="
                f"{self.vocabulary_size}, but the model has vocabulary_size="
                f"{vocabulary_size!r}; they must be equal. Build the model "
                f"with vocabulary_size={self.vocabulary_size} or load the "
                "tokenizer the model was trained with."
            )

    def save(self, directory) -> pathlib.Path:
        """Writes the tokenizer to `directory` as plain files.

        Args:
            directory: str or path-like. Created if needed.

        Returns:
            The directory, as a `pathlib.Path`.
        """
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        data = {
            "format_version": FORMAT_VERSION,
            "kind": self.kind,
            "vocabulary_size": self.vocabulary_size,
            **self.get_config(),
        }
        data.update(self._save_files(directory))
        _write_json(directory / TOKENIZER_FILE, data)
        logger.info("Saved %r to %s", self, directory)
        return directory

    def _save_files(self, directory: pathlib.Path) -> dict:
        return {}

    def __repr__(self):
        options = ", ".join(
            f"{key}={value!r}"
            for key, value in self.get_config().items()
            if key not in ("kind", "vocabulary")
        )
        options = ", " + options if options else ""
        return (
            f"{type(self).__name__}(vocabulary_size={self.vocabulary_size}"
            f"{options})"
        )


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes: ids 0-255, nothing to fit, lossless.

    `encode` uses the `surrogateescape` error handler, so text decoded from
    arbitrary bytes that way (as `corpora` does for raw enwik8) encodes to
    exactly the original bytes. `decode` replaces invalid UTF-8 (which a
    model may generate) with U+FFFD.

    Example:

    >>> tokenizer = ByteTokenizer()
    >>> tokenizer.encode("hé").tolist()
    [104, 195, 169]
    """

    kind = "byte"

    @classmethod
    def fit(cls, texts=None):
        """Returns a `ByteTokenizer`; `texts` is ignored (fixed vocabulary)."""
        return cls()

    @classmethod
    def _from_directory(cls, directory, config):
        return cls()

    @property
    def vocabulary_size(self) -> int:
        return BYTE_VOCABULARY_SIZE

    @property
    def unit(self) -> str:
        return "character"

    def unknown_characters(self, text: str) -> list[str]:
        # Every character is bytes here, except the lone surrogates that
        # stand for bytes which are not UTF-8 (text read with
        # `surrogateescape`, e.g. a prompt typed in a Latin-1 terminal):
        # the model gets those bytes, and they decode as U+FFFD.
        return list(dict.fromkeys(
            c for c in _check_text(text) if "\ud800" <= c <= "\udfff"
        ))

    def encode(self, text: str) -> np.ndarray:
        data = _check_text(text).encode("utf-8", "surrogateescape")
        return np.frombuffer(data, dtype=np.uint8).astype(np.int32)

    def decode(self, ids) -> str:
        array = _ids_array(ids, BYTE_VOCABULARY_SIZE)
        return array.astype(np.uint8).tobytes().decode("utf-8", "replace")


class CharTokenizer(Tokenizer):
    """Unicode characters, with a vocabulary fitted on training text.

    Characters are split with `tensorflow_text.UnicodeCharTokenizer` and
    mapped to ids with a `tf.lookup.StaticHashTable`; characters not in the
    vocabulary map to `<unk>` (id 0), which decodes as the string `<unk>`.

    Args:
        vocabulary: list of str. `unk_token` followed by single characters;
            the list index is the id.
        unk_token: str. The unknown token, which must be in `vocabulary`.

    Example:

    >>> tokenizer = CharTokenizer.fit(["abba"])
    >>> tokenizer.encode("abc").tolist()   # <unk>=0, a/b tie: "a" first
    [1, 2, 0]
    """

    kind = "char"

    def __init__(self, vocabulary, unk_token: str = UNK_TOKEN):
        vocabulary = _check_vocabulary(vocabulary, {"unknown": unk_token})
        for index, token in enumerate(vocabulary):
            if token != unk_token and len(token) != 1:
                raise ValueError(
                    "a char vocabulary must hold single characters besides "
                    f"unk_token={unk_token!r}. Received {token!r} at index "
                    f"{index}."
                )
        self._vocabulary = vocabulary
        self._unk_token = unk_token
        self._unk_id = vocabulary.index(unk_token)
        self._id_to_token = np.array(vocabulary, dtype=object)
        self._known = frozenset(vocabulary) - {unk_token}
        chars = [
            (ord(token), index)
            for index, token in enumerate(vocabulary)
            if token != unk_token
        ]
        keys = tf.constant([c for c, _ in chars], tf.int64)
        values = tf.constant([i for _, i in chars], tf.int64)
        self._table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(keys, values),
            default_value=self._unk_id,
        )
        self._splitter = tf_text.UnicodeCharTokenizer()

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
        splitter = tf_text.UnicodeCharTokenizer()
        for text in _as_texts(texts):
            for chunk in _line_chunks(text):
                _add_counts(counts, splitter.tokenize(_utf8(chunk)))
        # Code points -> characters; U+FFFD stands for invalid input.
        counts = {chr(point): number for point, number in counts.items()}
        vocabulary = _select_vocabulary(
            [unk_token], _frequency_order(counts), counts, max_size, min_freq
        )
        tokenizer = cls(vocabulary, unk_token=unk_token)
        logger.info(
            "char vocabulary: %d characters seen, %d kept",
            len(counts),
            len(vocabulary) - 1,
        )
        return tokenizer

    @classmethod
    def _from_directory(cls, directory, config):
        return cls(config["vocabulary"], unk_token=config["unk_token"])

    @property
    def vocabulary(self) -> list[str]:
        """list of str. The token of each id."""
        return list(self._vocabulary)

    @property
    def vocabulary_size(self) -> int:
        return len(self._vocabulary)

    @property
    def unk_id(self) -> int:
        return self._unk_id

    @property
    def unit(self) -> str:
        return "character"

    def unknown_characters(self, text: str) -> list[str]:
        # Characters not in the vocabulary become <unk>; a lone surrogate
        # is never itself in it (it is encoded as "?", see `_utf8`).
        known = self._known
        return list(dict.fromkeys(
            c for c in _check_text(text)
            if c not in known or "\ud800" <= c <= "\udfff"
        ))

    def get_config(self) -> dict:
        # The characters may include "\n", so they live in the JSON file.
        return {
            **super().get_config(),
            "unk_token": self._unk_token,
            "vocabulary": self.vocabulary,
        }

    def encode(self, text: str) -> np.ndarray:
        pieces = []
        for chunk in _line_chunks(_check_text(text)):
            points = self._splitter.tokenize(_utf8(chunk))  # (n,) int32
            ids = self._table.lookup(tf.cast(points, tf.int64))
            pieces.append(ids.numpy().astype(np.int32))
        if not pieces:
            return np.zeros([0], np.int32)
        return np.concatenate(pieces)

    def decode(self, ids) -> str:
        array = _ids_array(ids, self.vocabulary_size)
        return "".join(self._id_to_token[array].tolist())


class WordTokenizer(Tokenizer):
    """Whitespace-split words with `<eos>` for newlines (WikiText-103).

    Lines are split on Unicode whitespace with
    `tensorflow_text.WhitespaceTokenizer` and words are looked up in a
    `tf.lookup.StaticHashTable` (unknown words map to `<unk>`). With
    `add_eos=True` each newline of the text is an `<eos>` id; `decode` joins
    the words of a line with single spaces and ends lines with `"\\n"`, so
    it restores whitespace-normalized text exactly. With `add_eos=False`
    newlines are dropped, as the reference code does for the
    space-separated enwik8/text8 symbol files.

    Args:
        vocabulary: list of str. Tokens; the list index is the id. Must
            contain `unk_token` (and `eos_token` when `add_eos`).
        add_eos: bool. Whether newlines become `eos_token`.
        lower_case: bool. Lower-case the text before the lookup.
        unk_token: str or None. Token for words not in the vocabulary;
            None (a vocabulary without one, as some official releases
            have) makes `encode` raise on an unknown word.
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

    def __init__(
        self,
        vocabulary,
        *,
        add_eos: bool = True,
        lower_case: bool = False,
        unk_token: str = UNK_TOKEN,
        eos_token: str = EOS_TOKEN,
        double_eos: bool = False,
    ):
        required = {} if unk_token is None else {"unknown": unk_token}
        if add_eos:
            required["end-of-line"] = eos_token
        elif double_eos:
            raise ValueError("`double_eos=True` needs `add_eos=True`.")
        vocabulary = _check_vocabulary(vocabulary, required)
        self._vocabulary = vocabulary
        self._add_eos = bool(add_eos)
        self._double_eos = bool(double_eos)
        self._lower_case = bool(lower_case)
        self._unk_token = unk_token
        self._eos_token = eos_token
        self._unk_id = None if unk_token is None else vocabulary.index(unk_token)
        self._eos_id = vocabulary.index(eos_token) if add_eos else None
        self._id_to_token = np.array(vocabulary, dtype=object)
        self._table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant([_utf8(token) for token in vocabulary]),
                tf.range(len(vocabulary), dtype=tf.int64),
            ),
            default_value=-1 if self._unk_id is None else self._unk_id,
        )
        self._splitter = tf_text.WhitespaceTokenizer()

    def _words(self, lines: tf.Tensor) -> tf.RaggedTensor:
        if self._lower_case:
            lines = tf.strings.lower(lines, encoding="utf-8")
        return self._splitter.tokenize(lines)  # (lines, None) string

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
    ):
        """Builds a frequency-ordered vocabulary from `texts`.

        The vocabulary is the special tokens (`eos_token`, `unk_token`, or
        only `unk_token` when `add_eos=False`), then the words in
        decreasing count, ties in order of first appearance. A word equal
        to a special token (WikiText-103 contains `<unk>`) takes the
        special token's id.

        Args:
            texts: str or iterable of str. Training text.
            max_size: int or None. Total vocabulary size limit including the
                special tokens; the rarest words are left out.
            min_freq: int. Words seen fewer times are left out.
            add_eos: bool. See the class.
            lower_case: bool. See the class.
            unk_token: str. See the class.
            eos_token: str. See the class.

        Returns:
            A `WordTokenizer`.
        """
        splitter = tf_text.WhitespaceTokenizer()
        counts: dict = {}
        for text in _as_texts(texts):
            for chunk in _line_chunks(text):
                lines = _split_lines(chunk)
                if lower_case:
                    lines = tf.strings.lower(lines, encoding="utf-8")
                _add_counts(counts, splitter.tokenize(lines).flat_values)
        counts = {
            token.decode("utf-8"): number for token, number in counts.items()
        }
        specials = [eos_token, unk_token] if add_eos else [unk_token]
        vocabulary = _select_vocabulary(
            specials, _frequency_order(counts), counts, max_size, min_freq
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

    @classmethod
    def _from_directory(cls, directory, config):
        return cls(
            _read_vocabulary(
                _file_in(directory, config["vocabulary_file"], "vocabulary_file")
            ),
            add_eos=config["add_eos"],
            lower_case=config["lower_case"],
            unk_token=config["unk_token"],
            eos_token=config["eos_token"],
            double_eos=config.get("double_eos", False),
        )

    def _save_files(self, directory):
        _write_vocabulary(directory / VOCABULARY_FILE, self._vocabulary)
        return {"vocabulary_file": VOCABULARY_FILE}

    @property
    def vocabulary(self) -> list[str]:
        """list of str. The token of each id."""
        return list(self._vocabulary)

    @property
    def vocabulary_size(self) -> int:
        return len(self._vocabulary)

    @property
    def eos_id(self) -> int | None:
        return self._eos_id

    @property
    def unk_id(self) -> int | None:
        return self._unk_id

    @property
    def unit(self) -> str:
        # Without <eos> this is the reference's setting for the enwik8/text8
        # symbol files, where a "word" is one character (or byte).
        return "word" if self._add_eos else "character"

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "add_eos": self._add_eos,
            "lower_case": self._lower_case,
            "unk_token": self._unk_token,
            "eos_token": self._eos_token,
            "double_eos": self._double_eos,
        }

    def encode(self, text: str) -> np.ndarray:
        pieces = []
        for chunk in _line_chunks(_check_text(text)):
            words = self._words(_split_lines(chunk))
            ids = tf.ragged.map_flat_values(self._table.lookup, words)
            if self._unk_id is None:
                unknown = ids.flat_values.numpy() < 0
                if unknown.any():
                    word = words.flat_values.numpy()[unknown][0]
                    raise ValueError(
                        f"word {word.decode('utf-8')!r} is not in the "
                        "vocabulary, which has no unknown token."
                    )
            if self._double_eos:
                pieces.append(_wrap_lines(ids, self._eos_id, chunk.endswith("\n")))
            elif self._add_eos:
                pieces.append(_append_eos(ids, self._eos_id))
            else:
                pieces.append(ids.flat_values.numpy())
        if not pieces:
            return np.zeros([0], np.int32)
        return np.concatenate(pieces).astype(np.int32)

    def decode(self, ids) -> str:
        tokens = self._id_to_token[_ids_array(ids, self.vocabulary_size)]
        if not self._add_eos:
            return " ".join(tokens.tolist())
        lines, words = [], []
        for token in tokens.tolist():
            if token == self._eos_token:
                lines.append(" ".join(words))
                words = []
            else:
                words.append(token)
        lines.append(" ".join(words))
        return "\n".join(lines)


class SentencePieceTokenizer(Tokenizer):
    """SentencePiece subwords, applied with tensorflow-text.

    Each line is tokenized with `tensorflow_text.SentencepieceTokenizer`
    and every newline becomes the model's end-of-sentence id. Models built
    by `fit` use identity normalization, keep whitespace as is and add no
    dummy prefix, so decoding is exact for characters the model covers
    (`tensorflow_text`'s detokenizer drops the leading spaces of a line when
    the model adds a dummy prefix, which the `sentencepiece` package does
    not).

    `tf.random.set_seed` (called by `keras.utils.set_random_seed`) deletes
    the resource behind an eager `SentencepieceTokenizer`; this class
    rebuilds the op when that happens.

    Args:
        model_proto: bytes. A serialized SentencePiece model; it must have
            an end-of-sentence piece (used for newlines).

    Example:

    >>> tokenizer = SentencePieceTokenizer.fit(text, vocabulary_size=500)
    >>> tokenizer.decode(tokenizer.encode(text)) == text
    True
    """

    kind = "sentencepiece"

    def __init__(self, model_proto: bytes):
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
        self._tokenizer = self._new_tf_tokenizer()

    def _new_tf_tokenizer(self):
        return tf_text.SentencepieceTokenizer(
            model=self._model_proto, out_type=tf.int32
        )

    def _call(self, method: str, values):
        try:
            return getattr(self._tokenizer, method)(values)
        except tf.errors.NotFoundError:
            # The op's resource lives in the eager kernel cache, which
            # tf.random.set_seed (and keras.utils.set_random_seed) clears:
            # the old handle then points at nothing. Rebuild it once.
            logger.debug("Rebuilding the SentencePiece op after a reset")
            self._tokenizer = self._new_tf_tokenizer()
            return getattr(self._tokenizer, method)(values)

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
        num_threads: int | None = None,
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
            max_sentence_length: int. Longer lines (in bytes) are skipped
                during training.
            num_threads: int or None. Training threads; default all CPUs.

        Returns:
            A `SentencePieceTokenizer`.
        """
        import sentencepiece

        checks.positive_int("vocabulary_size", vocabulary_size)
        model_types = ("unigram", "bpe", "char", "word")
        if model_type not in model_types:
            raise ValueError(
                f"`model_type` must be one of {model_types}. Received: "
                f"model_type={model_type!r}."
            )
        lines = [
            line
            for text in _as_texts(texts)
            for line in text.split("\n")
            if line.strip()
        ]
        model = io.BytesIO()
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(lines),
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
            num_threads=int(num_threads or os.cpu_count() or 1),
            minloglevel=2,
        )
        tokenizer = cls(model.getvalue())
        logger.info(
            "sentencepiece (%s): %d lines, %d pieces",
            model_type,
            len(lines),
            tokenizer.vocabulary_size,
        )
        return tokenizer

    @classmethod
    def _from_directory(cls, directory, config):
        path = _file_in(directory, config["model_file"], "model_file")
        return cls(_read_tokenizer_file(path, "SentencePiece model"))

    def _save_files(self, directory):
        (directory / SENTENCEPIECE_FILE).write_bytes(self._model_proto)
        return {"model_file": SENTENCEPIECE_FILE}

    @property
    def model_proto(self) -> bytes:
        """bytes. The serialized SentencePiece model."""
        return self._model_proto

    @property
    def vocabulary_size(self) -> int:
        return self._size

    @property
    def eos_id(self) -> int:
        return self._eos_id

    @property
    def unk_id(self) -> int | None:
        return self._unk_id

    def encode(self, text: str) -> np.ndarray:
        pieces = []
        for chunk in _line_chunks(_check_text(text)):
            ids = self._call("tokenize", _split_lines(chunk))
            pieces.append(_append_eos(ids, self._eos_id))
        if not pieces:
            return np.zeros([0], np.int32)
        return np.concatenate(pieces).astype(np.int32)

    def decode(self, ids) -> str:
        array = _ids_array(ids, self.vocabulary_size)
        lines = self._call("detokenize", _rows_between(array, self._eos_id))
        return "\n".join(line.decode("utf-8") for line in lines.numpy())


class WordPieceTokenizer(Tokenizer):
    """WordPiece subwords (BERT style), applied with tensorflow-text.

    Lines are normalized with `tensorflow_text.FastBertNormalizer` (lower
    case, accents stripped) when `lower_case=True`, then split on whitespace
    and punctuation and into word pieces by
    `tensorflow_text.FastWordpieceTokenizer`; each newline becomes `<eos>`.
    `decode` joins words with single spaces (so `"a, b"` comes back as
    `"a , b"`): the round trip is not exact.

    Args:
        vocabulary: list of str. Tokens; continuation pieces start with
            `suffix_indicator`. Must contain `unk_token` and `eos_token`.
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

    def __init__(
        self,
        vocabulary,
        *,
        lower_case: bool = True,
        suffix_indicator: str = "##",
        unk_token: str = UNK_TOKEN,
        eos_token: str = EOS_TOKEN,
    ):
        vocabulary = _check_vocabulary(
            vocabulary, {"unknown": unk_token, "end-of-line": eos_token}
        )
        self._vocabulary = vocabulary
        self._lower_case = bool(lower_case)
        self._suffix_indicator = suffix_indicator
        self._unk_token = unk_token
        self._eos_token = eos_token
        self._unk_id = vocabulary.index(unk_token)
        self._eos_id = vocabulary.index(eos_token)
        self._normalizer = (
            tf_text.FastBertNormalizer(lower_case_nfd_strip_accents=True)
            if lower_case
            else None
        )
        self._tokenizer = tf_text.FastWordpieceTokenizer(
            vocab=vocabulary,
            suffix_indicator=suffix_indicator,
            unknown_token=unk_token,
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
        `vocabulary_size` on a small corpus.

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
        lines = [
            _utf8(line)
            for text in _as_texts(texts)
            for line in text.split("\n")
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
        return cls(
            vocabulary,
            lower_case=lower_case,
            unk_token=unk_token,
            eos_token=eos_token,
        )

    @classmethod
    def _from_directory(cls, directory, config):
        return cls(
            _read_vocabulary(
                _file_in(directory, config["vocabulary_file"], "vocabulary_file")
            ),
            lower_case=config["lower_case"],
            suffix_indicator=config["suffix_indicator"],
            unk_token=config["unk_token"],
            eos_token=config["eos_token"],
        )

    def _save_files(self, directory):
        _write_vocabulary(directory / VOCABULARY_FILE, self._vocabulary)
        return {"vocabulary_file": VOCABULARY_FILE}

    @property
    def vocabulary(self) -> list[str]:
        """list of str. The token of each id."""
        return list(self._vocabulary)

    @property
    def vocabulary_size(self) -> int:
        return len(self._vocabulary)

    @property
    def eos_id(self) -> int:
        return self._eos_id

    @property
    def unk_id(self) -> int:
        return self._unk_id

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "lower_case": self._lower_case,
            "suffix_indicator": self._suffix_indicator,
            "unk_token": self._unk_token,
            "eos_token": self._eos_token,
        }

    def encode(self, text: str) -> np.ndarray:
        pieces = []
        for chunk in _line_chunks(_check_text(text)):
            lines = _split_lines(chunk)
            if self._normalizer is not None:
                lines = self._normalizer.normalize(lines)
            ids = self._tokenizer.tokenize(lines)  # (lines, None) int32
            pieces.append(_append_eos(ids, self._eos_id))
        if not pieces:
            return np.zeros([0], np.int32)
        return np.concatenate(pieces).astype(np.int32)

    def decode(self, ids) -> str:
        array = _ids_array(ids, self.vocabulary_size)
        lines = self._tokenizer.detokenize(_rows_between(array, self._eos_id))
        return "\n".join(line.decode("utf-8") for line in lines.numpy())




class OfficialSymbolTokenizer(Tokenizer):
    """The symbols of the official enwik8 and text8 releases.

    The official preprocessing writes enwik8 as the decimal values of its
    UTF-8 bytes (`prep_enwik8.py`: "60 109 101 ...") and text8 as its
    characters with "_" for a space (`prep_text8.py`), separated by spaces;
    `data_utils.py` then drops the newlines (no `<eos>` for these
    datasets). This tokenizer applies the same steps to raw text, so its
    ids are the ids the official models were trained and evaluated on. The
    official vocabularies have no unknown symbol: a symbol outside the
    vocabulary raises a `ValueError`.

    Args:
        vocabulary: list of str. The release's symbols in id order (see
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

    def __init__(self, vocabulary, dataset: str):
        if dataset not in self.DATASETS:
            raise ValueError(
                f"`dataset` must be one of {self.DATASETS}, received "
                f"dataset={dataset!r}."
            )
        vocabulary = _check_vocabulary(vocabulary, {})
        for index, token in enumerate(vocabulary):
            if dataset == "enwik8" and not (
                token.isdigit() and 0 <= int(token) < 256
            ):
                raise ValueError(
                    "an enwik8 vocabulary holds byte values 0-255 written in "
                    f"decimal. Received {token!r} at index {index}."
                )
            if dataset == "text8" and len(token) != 1:
                raise ValueError(
                    "a text8 vocabulary holds single characters. Received "
                    f"{token!r} at index {index}."
                )
        self._vocabulary = vocabulary
        self._dataset = dataset
        self._ids = {token: index for index, token in enumerate(vocabulary)}

    @classmethod
    def fit(cls, texts, *, dataset: str):
        """A vocabulary of the symbols of `texts` in decreasing frequency
        (the official order; ties by first appearance)."""
        counts: dict = {}
        for text in _as_texts(texts):
            for symbol in cls._symbols_of(text, dataset):
                counts[symbol] = counts.get(symbol, 0) + 1
        return cls(_frequency_order(counts), dataset)

    @staticmethod
    def _symbols_of(text: str, dataset: str) -> list:
        if dataset == "enwik8":
            data = text.encode("utf-8", "surrogateescape")
            return [str(byte) for byte in data if byte != 10]
        return ["_" if c == " " else c for c in text if c != "\n"]

    @classmethod
    def _from_directory(cls, directory, config):
        return cls(config["vocabulary"], config["dataset"])

    @property
    def vocabulary(self) -> list[str]:
        """list of str. The symbol of each id."""
        return list(self._vocabulary)

    @property
    def vocabulary_size(self) -> int:
        return len(self._vocabulary)

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "dataset": self._dataset,
            "vocabulary": self.vocabulary,
        }

    def encode(self, text: str) -> np.ndarray:
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
        tokens = [self._vocabulary[i] for i in _ids_array(ids, self.vocabulary_size)]
        if self._dataset == "enwik8":
            data = bytes(int(token) for token in tokens)
            return data.decode("utf-8", "replace")
        return "".join(" " if token == "_" else token for token in tokens)


def official_tokenizer(vocabulary, dataset: str) -> Tokenizer:
    """The tokenizer of an official Transformer-XL release.

    Args:
        vocabulary: list of str. The release's symbols in id order.
        dataset: str. "wt103", "lm1b", "enwik8" or "text8" (the `dataset`
            of its `corpus-info.json`).

    Returns:
        wt103: a `WordTokenizer` with `<eos>` for newlines and `<unk>`;
        lm1b: a `WordTokenizer` writing each line as `<S> words <S>` (the
        official `add_double_eos`) and mapping unknown words to `<UNK>`;
        enwik8 / text8: an `OfficialSymbolTokenizer`.
    """
    vocabulary = list(vocabulary)
    if dataset in OfficialSymbolTokenizer.DATASETS:
        return OfficialSymbolTokenizer(vocabulary, dataset)
    if dataset == "wt103":
        unk = UNK_TOKEN if UNK_TOKEN in vocabulary else None
        return WordTokenizer(vocabulary, unk_token=unk, eos_token=EOS_TOKEN)
    if dataset == "lm1b":
        unk = "<UNK>" if "<UNK>" in vocabulary else None
        return WordTokenizer(vocabulary, unk_token=unk, eos_token="<S>", double_eos=True)
    raise ValueError(
        "`dataset` must be one of ('wt103', 'lm1b', 'enwik8', 'text8'), "
        f"received dataset={dataset!r}."
    )


# === Building and loading ===

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


def _tokenizer_class(kind) -> type:
    if kind not in _TOKENIZERS:
        raise ValueError(
            f"`kind` must be one of {TOKENIZER_KINDS}. Received: kind={kind!r}."
        )
    return _TOKENIZERS[kind]


def build_tokenizer(kind: str, texts=None, **options) -> Tokenizer:
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
        A `Tokenizer`.

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


def load_tokenizer(directory, limits=None) -> Tokenizer:
    """Reads a tokenizer written by `Tokenizer.save`.

    Args:
        directory: str or path-like. Holds `tokenizer.json` (which names the
            kind) and the kind's vocabulary or model file, which must lie
            inside the folder.
        limits: bounds on tokenizer.json (see `keras_txl.limits`).

    Returns:
        The `Tokenizer`, which encodes exactly like the saved one.

    Raises:
        ValueError: if the directory or a file is missing or invalid.
    """
    directory = pathlib.Path(directory)
    path = directory / TOKENIZER_FILE
    if not os.path.lexists(path):
        raise ValueError(
            f"no tokenizer in {directory}: {path} does not exist. Save one "
            "with tokenizer.save(directory)."
        )
    config = safe_files.read_json(path, limits)
    if not isinstance(config, dict) or "kind" not in config:
        raise ValueError(f"{path} must be a JSON object with a 'kind' key.")
    version = config.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{path} has format_version={version!r}; this version of "
            f"keras-txl reads format_version={FORMAT_VERSION}."
        )
    try:
        kind = config["kind"]
        cls = _LOADABLE[kind] if kind in _LOADABLE else _tokenizer_class(kind)
        tokenizer = cls._from_directory(directory, config)
    except KeyError as error:
        raise ValueError(f"{path} is missing the key {error}.") from None
    expected = config.get("vocabulary_size")
    if expected is not None and expected != tokenizer.vocabulary_size:
        raise ValueError(
            f"{path} says vocabulary_size={expected}, but the files in "
            f"{directory} give {tokenizer.vocabulary_size}."
        )
    return tokenizer
