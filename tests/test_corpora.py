"""Tests for training/corpora.py."""

import collections
import io
import re
import string
import zipfile

import numpy as np
import pytest

from keras_txl import tokenizers
from keras_txl.training import corpora


def _write_splits(folder, names, texts):
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in zip(names, texts):
        (folder / name).write_text(text, encoding="utf-8")
    return folder


TXT = ("train.txt", "valid.txt", "test.txt")


def test_text_splits_folder(tmp_path):
    texts = ["the cat sat\non a mat\n", "valid line\n", "test line\n"]
    corpus = corpora.load_corpus(_write_splits(tmp_path / "c", TXT, texts))
    assert (corpus.train, corpus.valid, corpus.test) == tuple(texts)
    assert corpus.layout == "splits" and not corpus.char_symbols
    assert corpus.split("validation") == corpus.valid
    assert corpus.vocabulary_texts() == [texts[0]]
    assert "train=21 chars" in repr(corpus)


def test_wikitext_layout(tmp_path):
    names = ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens")
    texts = [
        " = Valkyria = \n\n the <unk> game @-@ play \n",
        " = V = \n",
        " = T = \n",
    ]
    corpus = corpora.load_corpus(_write_splits(tmp_path / "wt", names, texts))
    assert corpus.layout == "wikitext"
    assert corpus.train == texts[0]
    assert (corpus.tokenizer_kind, corpus.vocabulary_splits) == (
        "word",
        ("train",),
    )
    tokenizer = corpus.build_tokenizer()
    assert tokenizer.vocabulary[:2] == ["<eos>", "<unk>"]
    assert "=" == tokenizer.vocabulary[2]  # most frequent word
    # One <eos> per line, as the reference code.
    assert int(np.sum(tokenizer.encode(corpus.train) == 0)) == 3


@pytest.mark.parametrize(
    "texts, symbols",
    [
        # text8 as written by prep_text8.py: characters, "_" for spaces.
        # Counted on all splits: a, i and _ three times each.
        (
            ["a n a r c h i s m _ o r i g i n a t e d\n", "a _ b\n", "c _ d\n"],
            "ai_n",
        ),
        # enwik8 as written by prep_enwik8.py: byte values, newline kept.
        # 105 four times, then 60, 97 and 32 twice (first-seen order).
        (
            [
                "60 109 101 100 105 \n 97 119 105 107 105 32 110 105 32 116 "
                "120 \n",
                "60 62\n",
                "97\n",
            ],
            ["105", "60", "97", "32"],
        ),
    ],
)
def test_char_symbol_files_are_detected(tmp_path, texts, symbols):
    corpus = corpora.load_corpus(_write_splits(tmp_path / "s", TXT, texts))
    assert corpus.layout == "char-symbols" and corpus.char_symbols
    assert corpus.tokenizer_options == {"add_eos": False}
    assert corpus.vocabulary_splits == corpora.SPLITS
    tokenizer = corpus.build_tokenizer()
    assert tokenizer.eos_id is None
    assert corpus.build_tokenizer("word").eos_id is None
    assert corpus.build_tokenizer("word", add_eos=True).eos_id == 0
    assert tokenizer.vocabulary[1 : 1 + len(symbols)] == list(symbols)
    # Spaces separate symbols; newlines are dropped (add_eos=False).
    ids = tokenizer.encode(corpus.train)
    assert len(ids) == len(corpus.train.split())
    # Forcing plain text.
    plain = corpora.load_corpus(tmp_path / "s", char_symbols=False)
    assert plain.layout == "splits" and not plain.char_symbols


def test_plain_english_is_not_taken_for_symbols(tmp_path):
    texts = ["a b c d e f g\nthe cat sat on a mat\n", "x\n", "y\n"]
    corpus = corpora.load_corpus(_write_splits(tmp_path / "p", TXT, texts))
    assert corpus.layout == "splits"


def test_standard_split_sizes():
    assert corpora.standard_split_sizes(100_000_000) == (
        90_000_000,
        5_000_000,
        5_000_000,
    )
    # Larger files keep 5M + 5M held out at the end (prep_enwik8.py).
    assert corpora.standard_split_sizes(100_000_010) == (
        90_000_010,
        5_000_000,
        5_000_000,
    )
    assert corpora.standard_split_sizes(1000) == (900, 50, 50)
    assert corpora.standard_split_sizes(1019) == (919, 50, 50)
    with pytest.raises(ValueError, match="a corpus of 19 bytes is too small"):
        corpora.standard_split_sizes(19)


def test_raw_text8_is_split_90_5_5(tmp_path):
    text = "".join(string.ascii_lowercase[i % 26] for i in range(2000))
    (tmp_path / "text8").write_text(text)
    corpus = corpora.load_corpus(tmp_path)
    assert corpus.layout == "text8"
    assert corpus.train == text[:1800]
    assert corpus.valid == text[1800:1900]
    assert corpus.test == text[1900:]
    assert corpus.tokenizer_kind == "char"


def test_raw_enwik8_zip_keeps_exact_bytes(tmp_path):
    # Multi-byte characters, so the cuts fall inside some of them.
    data = ("<page>naïve – 日本語 ü\n" * 100).encode("utf-8")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("enwik8", data)
    (tmp_path / "enwik8.zip").write_bytes(buffer.getvalue())
    corpus = corpora.load_corpus(tmp_path)
    assert corpus.layout == "enwik8" and corpus.tokenizer_kind == "byte"
    train, valid, _ = corpora.standard_split_sizes(len(data))
    tokenizer = corpus.build_tokenizer()
    ids = np.concatenate(
        [tokenizer.encode(corpus.split(split)) for split in corpora.SPLITS]
    )
    assert ids.tolist() == list(data)
    assert len(tokenizer.encode(corpus.train)) == train
    assert len(tokenizer.encode(corpus.valid)) == valid


def test_single_file_is_split_like_raw(tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("x" * 100)
    corpus = corpora.load_corpus(path)
    assert corpus.layout == "raw-file"
    assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (
        90,
        5,
        5,
    )


def test_folder_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(
        ValueError, match=re.escape(f"corpus path {missing} does not exist")
    ):
        corpora.load_corpus(missing)

    (tmp_path / "empty_folder").mkdir()
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"corpus folder {tmp_path / 'empty_folder'} has no known layout"
        ),
    ):
        corpora.load_corpus(tmp_path / "empty_folder")

    partial = _write_splits(tmp_path / "partial", TXT[:2], ["a\n", "b\n"])
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"corpus folder {partial} has train.txt but is missing "
            f"{partial / 'test.txt'}"
        ),
    ):
        corpora.load_corpus(partial)

    hollow = _write_splits(tmp_path / "hollow", TXT, ["a\n", " \n\n", "c\n"])
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"the valid split is empty: {hollow / 'valid.txt'} holds no text"
        ),
    ):
        corpora.load_corpus(hollow)

    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(
        ValueError,
        match=re.escape(f"corpus file {tmp_path / 'empty.txt'} is empty"),
    ):
        corpora.load_corpus(tmp_path / "empty.txt")

    wiki = _write_splits(
        tmp_path / "wiki",
        ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens"),
        ["a\n", "b\n", "c\n"],
    )
    with pytest.raises(ValueError, match="char_symbols=True applies to"):
        corpora.load_corpus(wiki, char_symbols=True)

    bad = _write_splits(tmp_path / "bad", TXT, ["a\n", "b\n", "c\n"])
    (bad / "test.txt").write_bytes(b"ok \xff\n")
    with pytest.raises(
        ValueError,
        match=re.escape(f"{bad / 'test.txt'} is not valid UTF-8 text"),
    ):
        corpora.load_corpus(bad, char_symbols=False)


# === TFDS ===


def test_local_tfds_round_trip_keeps_line_order(tmp_path):
    # 300 numbered lines: TFDS's default shuffling would reorder them.
    train = "".join(f"line {i} of the training text\n" for i in range(300))
    texts = [train, "valid one\n\nvalid three\n", "test ü\n"]
    folder = _write_splits(tmp_path / "corpus", TXT, texts)
    data_dir = tmp_path / "tfds"
    source = corpora.build_local_tfds("keras_txl_test_corpus", folder, data_dir)
    assert source == "tfds:keras_txl_test_corpus"
    assert (data_dir / "keras_txl_test_corpus" / "1.0.0").is_dir()
    corpus = corpora.load_corpus(source, data_dir=data_dir)
    assert (corpus.train, corpus.valid, corpus.test) == tuple(texts)
    assert corpus.layout == "tfds" and corpus.name == "keras_txl_test_corpus"
    head = corpora.load_corpus(source, data_dir=data_dir, max_examples=2)
    assert head.train == "line 0 of the training text\n" + (
        "line 1 of the training text\n"
    )
    assert head.valid == "valid one\n\n"
    swapped = corpora.load_corpus(
        source,
        data_dir=data_dir,
        split_names={"valid": "test", "test": "validation"},
    )
    assert (swapped.valid, swapped.test) == (texts[2], texts[1])
    with pytest.raises(
        ValueError,
        match=re.escape(
            "`text_feature` must be a feature of TFDS dataset "
            "'keras_txl_test_corpus': one of ['text']. Received: "
            "text_feature='book_text'"
        ),
    ):
        corpora.load_corpus(source, data_dir=data_dir, text_feature="book_text")
    with pytest.raises(ValueError, match="unknown keys \\['dev'\\]"):
        corpora.load_corpus(source, data_dir=data_dir, split_names={"dev": "x"})


def test_tfds_errors_mention_data_dir_and_download(tmp_path):
    with pytest.raises(ValueError) as error:
        corpora.load_corpus("tfds:no_such_corpus_xyz", data_dir=tmp_path)
    message = str(error.value)
    assert "'no_such_corpus_xyz' was not found" in message
    assert f"data_dir='{tmp_path}'" in message and "download=True" in message
    assert len(message) < 600  # not the list of all 400+ datasets

    # A catalog dataset that is not prepared: no download attempted.
    with pytest.raises(ValueError) as error:
        corpora.load_corpus("tfds:lm1b", data_dir=tmp_path)
    message = str(error.value)
    assert f"'lm1b' is not prepared in data_dir='{tmp_path}'" in message
    assert "Pass download=True" in message

    with pytest.raises(ValueError, match="is not prepared"):
        corpora.load_corpus("tfds:wiki40b:en", data_dir=tmp_path)
    with pytest.raises(ValueError, match="must be 'tfds:NAME'"):
        corpora.load_corpus("tfds:")
    with pytest.raises(ValueError, match="is a TFDS catalog dataset"):
        corpora.build_local_tfds("lm1b", tmp_path, tmp_path)
    with pytest.raises(ValueError, match="Received: name='My-Corpus'"):
        corpora.build_local_tfds("My-Corpus", tmp_path, tmp_path)


# === The standard-library docstring corpus ===


@pytest.fixture(scope="module")
def stdlib_folder(tmp_path_factory):
    return corpora.prepare_stdlib_docs(tmp_path_factory.mktemp("stdlib"))


def test_stdlib_docs_is_real_english(stdlib_folder):
    corpus = corpora.load_corpus(stdlib_folder)
    assert corpus.layout == "splits" and not corpus.char_symbols
    text = corpus.train + corpus.valid + corpus.test
    assert len(text) > 100_000
    letters = sum(ch in string.ascii_letters for ch in text) / len(text)
    ascii_share = sum(ord(ch) < 128 for ch in text) / len(text)
    assert letters > 0.6 and ascii_share > 0.99
    words = collections.Counter(text.split())
    assert words.most_common(1)[0][0] == "the"
    assert {"a", "is", "to", "of", "and"} <= set(dict(words.most_common(10)))
    # About 90/5/5 by characters, cut at docstring boundaries.
    assert 0.88 < len(corpus.train) / len(text) < 0.92
    assert 0.03 < len(corpus.valid) / len(text) < 0.07
    assert corpus.train.endswith("\n\n") and corpus.valid.endswith("\n\n")


def test_stdlib_docs_is_deterministic(stdlib_folder, tmp_path):
    first = corpora.prepare_stdlib_docs(tmp_path / "a", max_chars=60_000)
    second = corpora.prepare_stdlib_docs(tmp_path / "b", max_chars=60_000)
    for name in TXT:
        assert (first / name).read_bytes() == (second / name).read_bytes()
    small = "".join((first / name).read_text() for name in TXT)
    assert 50_000 < len(small) <= 60_000
    # The first docstrings of the default build are the same ones.
    full = "".join((stdlib_folder / name).read_text() for name in TXT)
    assert full.startswith(small)
    # A second call with the same settings reuses the files.
    mtime = (first / "train.txt").stat().st_mtime_ns
    corpora.prepare_stdlib_docs(first, max_chars=60_000)
    assert (first / "train.txt").stat().st_mtime_ns == mtime


def test_stdlib_docs_errors(tmp_path):
    with pytest.raises(
        ValueError, match=re.escape("max_chars=300 is too small")
    ):
        corpora.prepare_stdlib_docs(tmp_path, max_chars=300)
    with pytest.raises(ValueError, match="Received: max_chars=0"):
        corpora.prepare_stdlib_docs(tmp_path, max_chars=0)


def test_stdlib_docs_through_a_tokenizer(stdlib_folder):
    corpus = corpora.load_corpus(stdlib_folder)
    tokenizer = tokenizers.build_tokenizer("word", corpus.train, max_size=5000)
    assert tokenizer.vocabulary[2] == "the"
    ids = tokenizer.encode(corpus.valid)
    assert np.mean(ids == tokenizer.unk_id) < 0.2
