"""Vocabularies counted over a corpus larger than memory.

`keras_txl.tokenizers.build_tokenizer(kind, texts)` needs the training text
as strings. `build_streaming_tokenizer(kind, chunks, **options)` takes an
iterable of text chunks instead (`CorpusSource.chunks`), keeps only the
count table (one entry per distinct word or character, never the text),
and builds the same tokenizer: the `word` and `char` vocabularies follow
the tokenizers' own rule (special tokens, then tokens by decreasing count,
ties in order of first appearance; `max_size` counts the specials,
`min_freq` drops rare ones), tested equal to `build_tokenizer`'s.

`sentencepiece` and `wordpiece` train on text: they get the first
`sample_bytes` of it (all of it for a corpus smaller than that).
`byte` has nothing to count.
"""

import logging

from keras_txl import tokenizers
from keras_txl.tokenizers import select_vocabulary

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_SAMPLE_BYTES",
    "build_streaming_tokenizer",
    "count_tokens",
    "read_vocabulary_file",
]

# The tokenizers' special tokens (constants there today; kept here too so
# that a rewrite of keras_txl/tokenizers.py that drops them changes nothing).
EOS_TOKEN = getattr(tokenizers, "EOS_TOKEN", "<eos>")
UNK_TOKEN = getattr(tokenizers, "UNK_TOKEN", "<unk>")

# Text the subword trainers see at most.
DEFAULT_SAMPLE_BYTES = 256 << 20
_LOG_EVERY_CHARS = 256 << 20


def count_tokens(kind, chunks, *, lower_case=False):
    """Counts words (`kind="word"`) or characters (`"char"`) over chunks.

    Each chunk is counted by `keras_txl.tokenizers.add_token_counts`, the
    counting step of the tokenizers' own `fit`: the same whitespace split
    and the same reading of bytes that are not UTF-8 (the bytes of a
    character cut by a raw file's split, kept as surrogateescape stand-ins,
    count as U+FFFD, as `encode` reads them).

    Args:
        kind: str. `"word"` (whitespace-split, as `WordTokenizer`) or
            `"char"` (Unicode characters, as `CharTokenizer`).
        chunks: iterable of str. The text, in order, in pieces that end
            after a newline or at a word boundary.
        lower_case: bool. `word` only: count lower-cased words.

    Returns:
        A dict token -> count in order of first appearance.
    """
    if kind not in ("word", "char"):
        raise ValueError(f"`kind` must be 'word' or 'char'. Received: kind={kind!r}.")
    counts: dict = {}
    seen = next_log = 0
    for text in chunks:
        tokenizers.add_token_counts(counts, kind, text, lower_case=lower_case)
        seen += len(text)
        if seen >= next_log:
            logger.info("vocabulary: %.0fM characters counted, %d distinct %ss",
                        seen / 1e6, len(counts), kind)
            next_log = seen + _LOG_EVERY_CHARS
    return counts


def read_vocabulary_file(path, kind="word"):
    """Tokens of a vocabulary file, one per line, in bounded memory besides
    the vocabulary itself.

    `word`: the first field of each line, as the reference `Vocab` reads
    `1b_word_vocab.txt` (a count may follow). `char`: a line holding one
    character is that character, the space included, and the two
    characters `\\n` are the newline and `\\r` the carriage return (as
    `export_vocabulary` writes them);
    a longer line is read by its first field, an empty line skipped. A
    "\\r" before a line's newline is the line ending, not part of it, and
    a byte order mark at the start of the file is not part of the first
    token.
    """
    tokens = []
    try:
        with open(path, encoding="utf-8", newline="\n") as handle:
            for number, line in enumerate(handle):
                raw = line[:-1] if line.endswith("\n") else line
                if number == 0 and raw.startswith("\ufeff"):
                    # A byte order mark (an editor's, on Windows) is not
                    # part of the first token.
                    raw = raw[1:]
                if raw.endswith("\r") and len(raw) > 1:
                    raw = raw[:-1]
                if kind == "char" and (len(raw) == 1 or raw in ("\\n", "\\r")):
                    tokens.append({"\\n": "\n", "\\r": "\r"}.get(raw, raw))
                    continue
                fields = raw.split()
                if fields:
                    tokens.append(fields[0])
    except OSError as error:
        raise ValueError(
            f"--vocabulary-file {path!r} cannot be read ({error.strerror or error})."
        ) from None
    except UnicodeDecodeError as error:
        raise ValueError(
            f"--vocabulary-file {path!r} is not valid UTF-8 text (near byte "
            f"{error.start}).") from None
    if not tokens:
        raise ValueError(f"--vocabulary-file {path!r} holds no tokens.")
    return tokens


def _word_from_file(path, options):
    vocabulary = read_vocabulary_file(path)
    double_eos = bool(options.get("double_eos", False))
    # The official LM1B vocabulary: <S> ends (and starts) every sentence,
    # <UNK> is the unknown word.
    if "<S>" in vocabulary and "<UNK>" in vocabulary:
        eos, unk = "<S>", "<UNK>"
    else:
        eos = options.get("eos_token", EOS_TOKEN)
        unk = options.get("unk_token", UNK_TOKEN)
        if unk is None and UNK_TOKEN in vocabulary:
            # A symbol corpus (no unknown token of its own) with a vocabulary
            # that has one: unknown symbols are read as it.
            unk = UNK_TOKEN
    return tokenizers.WordTokenizer(
        vocabulary, add_eos=options.get("add_eos", True),
        lower_case=options.get("lower_case", False), unk_token=unk,
        eos_token=eos, double_eos=double_eos)


_WORD_FIT = ("max_size", "min_freq", "add_eos", "lower_case", "unk_token", "eos_token",
             "reference_specials")
_CHAR_FIT = ("max_size", "min_freq", "unk_token")


def build_streaming_tokenizer(kind, chunks, *, sample_bytes=DEFAULT_SAMPLE_BYTES, **options):
    """Builds a tokenizer from text chunks in bounded memory.

    Args:
        kind: str. `"word"`, `"char"`, `"byte"`, `"sentencepiece"` or
            `"wordpiece"`.
        chunks: iterable of str (consumed once; not read for `byte` or a
            `vocabulary_file`).
        sample_bytes: int. Subword kinds: train on at most this many bytes.
        **options: the kind's `fit` options (`max_size`, `min_freq`,
            `lower_case`, `add_eos`, `vocabulary_size`, ...), plus
            `double_eos` and `vocabulary_file` for `word`.

    Returns:
        A `keras_txl.tokenizers` tokenizer, as `build_tokenizer` would
        build it on the concatenated chunks.
    """
    options = dict(options)
    if kind == "byte":
        return tokenizers.build_tokenizer("byte")
    if kind == "word":
        vocabulary_file = options.pop("vocabulary_file", None)
        double_eos = options.pop("double_eos", False)
        if vocabulary_file:
            return _word_from_file(vocabulary_file, {**options, "double_eos": double_eos})
        unknown = sorted(set(options) - set(_WORD_FIT))
        if unknown:
            raise ValueError(f"tokenizer kind 'word' does not take the option(s) "
                             f"{unknown}. Valid options: {list(_WORD_FIT)}.")
        add_eos = options.get("add_eos", True)
        unk = options.get("unk_token", UNK_TOKEN)
        eos = options.get("eos_token", EOS_TOKEN)
        counts = count_tokens("word", chunks, lower_case=options.get("lower_case", False))
        if not counts:
            raise ValueError("the vocabulary splits hold no words to build a vocabulary from.")
        if options.get("reference_specials", False):
            vocabulary = tokenizers.select_reference_vocabulary(
                counts, add_eos=add_eos, eos_token=eos, unk_token=unk,
                max_size=options.get("max_size"), min_freq=options.get("min_freq", 1))
        else:
            vocabulary = select_vocabulary(
                [eos, unk] if add_eos else [unk], counts,
                max_size=options.get("max_size"), min_freq=options.get("min_freq", 1))
        logger.info("word vocabulary: %d distinct words, %d tokens kept",
                    len(counts), len(vocabulary))
        return tokenizers.WordTokenizer(
            vocabulary, add_eos=add_eos, lower_case=options.get("lower_case", False),
            unk_token=unk, eos_token=eos, double_eos=double_eos)
    if kind == "char":
        if options.get("vocabulary_file"):
            vocabulary = read_vocabulary_file(options.pop("vocabulary_file"), "char")
            return tokenizers.CharTokenizer(vocabulary, unk_token=options.get(
                "unk_token", UNK_TOKEN))
        unknown = sorted(set(options) - set(_CHAR_FIT))
        if unknown:
            raise ValueError(f"tokenizer kind 'char' does not take the option(s) "
                             f"{unknown}. Valid options: {list(_CHAR_FIT)}.")
        unk = options.get("unk_token", UNK_TOKEN)
        counts = count_tokens("char", chunks)
        if not counts or all(not c.strip() for c in counts):
            raise ValueError("the vocabulary splits hold no text to build a vocabulary from.")
        vocabulary = select_vocabulary([unk], counts, max_size=options.get("max_size"),
                                       min_freq=options.get("min_freq", 1))
        logger.info("char vocabulary: %d characters seen, %d kept",
                    len(counts), len(vocabulary) - 1)
        return tokenizers.CharTokenizer(vocabulary, unk_token=unk)
    if kind in ("sentencepiece", "wordpiece"):
        pieces, size = [], 0
        for text in chunks:
            pieces.append(text)
            size += len(text.encode("utf-8", "replace"))
            if size >= sample_bytes:
                logger.warning("%s: training on the first %d MB of the vocabulary "
                               "splits (sample_bytes)", kind, size // 10**6)
                break
        return tokenizers.build_tokenizer(kind, ["".join(pieces)], **options)
    raise ValueError(
        "`kind` must be one of 'char', 'byte', 'word', 'sentencepiece', "
        f"'wordpiece'. Received: kind={kind!r}."
    )
