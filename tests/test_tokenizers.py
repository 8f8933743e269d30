"""Tests for training/tokenizers.py."""

import json
import re

import numpy as np
import pytest

from keras_txl import tokenizers

# Training text: real sentences, with repeated spaces, an empty line,
# indentation and a few non-ASCII characters.
PARAGRAPHS = [
    "Transformer-XL carries a memory of hidden states from one segment to "
    "the next.",
    "The memory is not trained: gradients stop at the segment boundary.",
    "Relative positions let the model reuse states computed for an earlier "
    "segment.",
    "  Indented line, with  two spaces, and the café's crème brûlée.",
    "",
    "Return the number of tokens in the stream, or raise ValueError.",
    "The quick brown fox jumps over the lazy dog; the dog sleeps.",
]
TEXT = "\n".join(PARAGRAPHS * 6) + "\n"
NORMALIZED = "the memory is not the model\n\nthe lazy dog\nthe fox"

SMALL_OPTIONS = {
    "char": {},
    "byte": {},
    "word": {},
    "sentencepiece": {"vocabulary_size": 120},
    "wordpiece": {"vocabulary_size": 150},
}
# keras-hub's layout: tokenizer.json plus assets/tokenizer/<files>.
SAVED_FILES = {
    "char": {"tokenizer.json", "assets/tokenizer/vocabulary.json"},
    "byte": {"tokenizer.json"},
    "word": {"tokenizer.json", "assets/tokenizer/vocabulary.txt"},
    "sentencepiece": {"tokenizer.json", "assets/tokenizer/vocabulary.spm"},
    "wordpiece": {"tokenizer.json", "assets/tokenizer/vocabulary.txt"},
}


@pytest.fixture(scope="module")
def fitted():
    return {
        kind: tokenizers.build_tokenizer(kind, TEXT, **options)
        for kind, options in SMALL_OPTIONS.items()
    }


@pytest.mark.parametrize("kind", tokenizers.TOKENIZER_KINDS)
def test_save_load_gives_identical_ids(kind, fitted, tmp_path):
    tokenizer = fitted[kind]
    ids = tokenizer.encode(TEXT)
    assert ids.dtype == np.int32 and ids.ndim == 1 and ids.size > 0
    assert 0 <= ids.min() and ids.max() < tokenizer.vocabulary_size()

    tokenizer.save(tmp_path / "tok")
    files = {
        path.relative_to(tmp_path / "tok").as_posix()
        for path in (tmp_path / "tok").rglob("*")
        if path.is_file()
    }
    assert files == SAVED_FILES[kind]
    config = json.loads((tmp_path / "tok" / "tokenizer.json").read_text())
    assert config["registered_name"].startswith("keras_txl>")
    assert config["kind"] == kind
    assert config["vocabulary_size"] == tokenizer.vocabulary_size()

    loaded = tokenizers.load_tokenizer(tmp_path / "tok")
    assert type(loaded) is type(tokenizer)
    assert loaded.vocabulary_size() == tokenizer.vocabulary_size()
    assert loaded.get_config() == tokenizer.get_config()
    assert loaded.kind == loaded.get_config()["kind"] == kind
    np.testing.assert_array_equal(loaded.encode(TEXT), ids)
    assert loaded.decode(ids) == tokenizer.decode(ids)


@pytest.mark.parametrize("kind", ["char", "byte", "sentencepiece"])
def test_lossless_kinds_round_trip_exactly(kind, fitted):
    tokenizer = fitted[kind]
    assert tokenizer.decode(tokenizer.encode(TEXT)) == TEXT
    # Leading spaces, empty lines, no final newline.
    sample = "  the memory\n\n   is  not trained"
    assert tokenizer.decode(tokenizer.encode(sample)) == sample
    assert tokenizer.encode("").shape == (0,)
    assert tokenizer.decode([]) == ""


def test_word_round_trips_whitespace_normalized_text(fitted):
    tokenizer = fitted["word"]
    assert tokenizer.decode(tokenizer.encode(NORMALIZED)) == NORMALIZED
    # Spacing is normalized, line structure kept.
    assert tokenizer.decode(tokenizer.encode("  the   dog \n")) == "the dog\n"


def test_word_vocabulary_is_frequency_ordered_with_specials_first():
    tokenizer = tokenizers.build_tokenizer("word", ["b a b\nc b a\n", "d\n"])
    # b: 3, a: 2, then c and d once each, in order of first appearance.
    assert tokenizer.vocabulary == ["<eos>", "<unk>", "b", "a", "c", "d"]
    assert (tokenizer.eos_id, tokenizer.unk_id) == (0, 1)
    # One <eos> per newline; unknown words -> <unk>.
    assert tokenizer.encode("a zebra b\nd\n").tolist() == [3, 1, 2, 0, 5, 0]
    assert tokenizer.decode([3, 1, 2, 0, 5, 0]) == "a <unk> b\nd\n"
    # No final newline (a prompt): no final <eos>.
    assert tokenizer.encode("a b").tolist() == [3, 2]


def test_word_vocabulary_options():
    text = "b a b\nc b a\n<unk> <unk> <unk> <unk>\n"
    full = tokenizers.build_tokenizer("word", text)
    # The corpus's own <unk> (WikiText-103 has it) is the special token.
    assert full.vocabulary == ["<eos>", "<unk>", "b", "a", "c"]
    assert full.encode("<unk>\n").tolist() == [1, 0]
    capped = tokenizers.build_tokenizer("word", text, max_size=4)
    assert capped.vocabulary == ["<eos>", "<unk>", "b", "a"]
    frequent = tokenizers.build_tokenizer("word", text, min_freq=3)
    assert frequent.vocabulary == ["<eos>", "<unk>", "b"]
    lower = tokenizers.build_tokenizer(
        "word", "The the THE cat\n", lower_case=True
    )
    assert lower.vocabulary == ["<eos>", "<unk>", "the", "cat"]
    assert lower.encode("CAT The\n").tolist() == [3, 2, 0]


def test_word_without_eos_drops_newlines_like_the_char_symbol_setting():
    tokenizer = tokenizers.build_tokenizer(
        "word", "a n a r c h y _ a\n", add_eos=False
    )
    assert tokenizer.vocabulary == ["<unk>", "a", "n", "r", "c", "h", "y", "_"]
    assert tokenizer.eos_id is None
    assert tokenizer.encode("a n\na").tolist() == [1, 2, 1]
    assert tokenizer.decode([1, 2, 1]) == "a n a"


def test_char_vocabulary_and_unknown_characters():
    tokenizer = tokenizers.build_tokenizer("char", ["abba\n", "é"])
    # <unk>, then a/b (2 each, a first seen), then "\n" and "é" (1 each).
    assert tokenizer.vocabulary == ["<unk>", "a", "b", "\n", "é"]
    assert tokenizer.encode("abé\nz").tolist() == [1, 2, 4, 3, 0]
    assert tokenizer.decode([1, 2, 0]) == "ab<unk>"
    capped = tokenizers.build_tokenizer("char", "aaab", max_size=2)
    assert capped.vocabulary == ["<unk>", "a"]


def test_byte_tokenizer_is_fixed_and_lossless():
    tokenizer = tokenizers.build_tokenizer("byte")
    assert tokenizer.vocabulary_size() == 256
    assert tokenizer.encode("hé").tolist() == [104, 195, 169]
    text = "naïve 日本語 🙂\n"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    # Invalid UTF-8 (a model may generate it) decodes with U+FFFD.
    assert tokenizer.decode([104, 195]) == "h\ufffd"
    # Text decoded with surrogateescape (raw enwik8 cut inside a character)
    # encodes back to the exact bytes.
    raw = "é".encode()[:1].decode("utf-8", "surrogateescape")
    assert tokenizer.encode(raw).tolist() == [195]


def test_sentencepiece_matches_the_sentencepiece_package(fitted):
    import sentencepiece

    tokenizer = fitted["sentencepiece"]
    assert tokenizer.vocabulary_size() <= 120
    assert (tokenizer.eos_id, tokenizer.unk_id) == (0, 1)
    processor = sentencepiece.SentencePieceProcessor()
    processor.LoadFromSerializedProto(tokenizer.model_proto)
    line = PARAGRAPHS[0]
    assert tokenizer.encode(line).tolist() == processor.encode(line)
    ids = tokenizer.encode(TEXT)
    assert int(np.sum(ids == tokenizer.eos_id)) == TEXT.count("\n")


def test_sentencepiece_survives_set_random_seed(fitted):
    # keras.utils.set_random_seed -> tf.random.set_seed clears the eager
    # kernel cache, which deletes tensorflow-text's SentencePiece resource.
    import keras

    tokenizer = fitted["sentencepiece"]
    before = tokenizer.encode(TEXT)
    keras.utils.set_random_seed(1)
    np.testing.assert_array_equal(tokenizer.encode(TEXT), before)
    assert tokenizer.decode(before) == TEXT


def test_wordpiece_lowercases_and_splits_punctuation(fitted):
    tokenizer = fitted["wordpiece"]
    assert tokenizer.vocabulary[:2] == ["<eos>", "<unk>"]
    assert any(token.startswith("##") for token in tokenizer.vocabulary)
    ids = tokenizer.encode("The Memory, the DOG.\nthe fox")
    assert int(np.sum(ids == tokenizer.eos_id)) == 1
    assert tokenizer.decode(ids) == "the memory , the dog .\nthe fox"


@pytest.mark.parametrize("kind", ["char", "word", "sentencepiece", "wordpiece"])
def test_chunked_encoding_matches_one_piece(kind, fitted, monkeypatch):
    tokenizer = fitted[kind]
    whole = tokenizer.encode(TEXT)
    monkeypatch.setattr(tokenizers, "_CHUNK_CHARS", 50)
    assert len(list(tokenizers._line_chunks(TEXT))) > 10
    np.testing.assert_array_equal(tokenizer.encode(TEXT), whole)


def test_check_model_vocabulary(fitted):
    tokenizer = fitted["word"]
    tokenizer.check_model_vocabulary(tokenizer.vocabulary_size())
    size = tokenizer.vocabulary_size()
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"the tokenizer (kind='word') has vocabulary_size={size}, but the "
            f"model has vocabulary_size={size + 1}; they must be equal"
        ),
    ):
        tokenizer.check_model_vocabulary(size + 1)
    with pytest.raises(ValueError, match="vocabulary_size=256, but the model"):
        fitted["byte"].check_model_vocabulary(260)


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: tokenizers.build_tokenizer("bpe", "text"),
            "`kind` must be one of ('char', 'byte', 'word', 'sentencepiece', "
            "'wordpiece'). Received: kind='bpe'",
        ),
        (
            lambda: tokenizers.build_tokenizer("word", "text", max_sise=10),
            "tokenizer kind 'word' does not take the option(s) ['max_sise']",
        ),
        (
            lambda: tokenizers.build_tokenizer("char", ["  ", "\n"]),
            "`texts` holds no text to build a vocabulary from",
        ),
        (
            lambda: tokenizers.build_tokenizer("word", None),
            "`texts` must be a str or an iterable of str with the training "
            "text. Received: texts=None",
        ),
        (
            lambda: tokenizers.build_tokenizer("word", "a b", max_size=2),
            "it must be an integer > 2. Received: max_size=2",
        ),
        (
            lambda: tokenizers.build_tokenizer(
                "sentencepiece", "a b", model_type="wordpiece"
            ),
            "`model_type` must be one of ('unigram', 'bpe', 'char', 'word'). "
            "Received: model_type='wordpiece'",
        ),
        (
            lambda: tokenizers.ByteTokenizer().decode([1, 256]),
            "`ids` must be in [0, vocabulary_size=256). Received values in "
            "[1, 256]",
        ),
        (
            lambda: tokenizers.ByteTokenizer().encode(b"bytes"),
            "`text` must be a str",
        ),
        (
            lambda: tokenizers.WordTokenizer(["<eos>", "a"]),
            "`vocabulary` must contain the unknown token '<unk>'",
        ),
        (
            lambda: tokenizers.CharTokenizer(["<unk>", "ab"]),
            "a char vocabulary must hold single characters besides "
            "unk_token='<unk>'. Received 'ab' at index 1",
        ),
        (
            lambda: tokenizers.SentencePieceTokenizer(b"not a model"),
            "`model_proto` is not a valid SentencePiece model",
        ),
    ],
)
def test_errors(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


def test_load_errors_name_the_path(tmp_path, fitted):
    with pytest.raises(
        ValueError, match=re.escape(f"no tokenizer in {tmp_path}")
    ):
        tokenizers.load_tokenizer(tmp_path)
    fitted["word"].save(tmp_path / "word")
    vocabulary = tmp_path / "word" / "assets" / "tokenizer" / "vocabulary.txt"
    vocabulary.write_text("<eos>\n<unk>\nonly\n")
    with pytest.raises(
        ValueError, match=r"says vocabulary_size=\d+, but the files in"
    ):
        tokenizers.load_tokenizer(tmp_path / "word")
    # A tokenizer.json of the old layout without its version.
    (tmp_path / "word" / "tokenizer.json").write_text('{"kind": "word"}')
    with pytest.raises(ValueError, match="format_version=None"):
        tokenizers.load_tokenizer(tmp_path / "word")
