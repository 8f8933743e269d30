"""Tests for training/corpora.py."""

import collections
import io
import re
import string
import zipfile

import numpy as np
import pytest
from testing import write_lm1b_release

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
    # The reference's order: '<eos>', then the words by count, ties first
    # seen, the text's '<unk>' among them.
    assert tokenizer.vocabulary[:4] == ["<eos>", "=", "Valkyria", "the"]
    assert tokenizer.unk_id == tokenizer.vocabulary.index("<unk>") == 4
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
    assert corpus.tokenizer_options == {"add_eos": False, "unk_token": None,
                                        "reference_specials": True}
    assert corpus.vocabulary_splits == corpora.SPLITS
    tokenizer = corpus.build_tokenizer()
    assert tokenizer.eos_id is None
    assert corpus.build_tokenizer("word").eos_id is None
    assert corpus.build_tokenizer("word", add_eos=True).eos_id == 0
    # The reference's vocabulary: the symbols alone, no '<unk>' first.
    assert tokenizer.vocabulary[: len(symbols)] == list(symbols)
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
    # A split "missing" as a file but there as something else is said so.
    (partial / "test.txt").mkdir()
    with pytest.raises(ValueError, match=re.escape(
            f"is missing {partial / 'test.txt'} (a folder, not a file).")):
        corpora.load_corpus(partial)
    (partial / "test.txt").rmdir()
    (partial / "test.txt").symlink_to(tmp_path / "gone.txt")
    with pytest.raises(ValueError, match=re.escape(
            f"is missing {partial / 'test.txt'} (a symbolic link to "
            f"'{tmp_path / 'gone.txt'}', which does not exist).")):
        corpora.open_corpus_source(partial)

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
    # A file cut short (a writer killed over a matching manifest) is not
    # reused: the sizes the manifest records no longer hold.
    whole = (first / "valid.txt").read_bytes()
    (first / "valid.txt").write_bytes(whole[: len(whole) // 2])
    corpora.prepare_stdlib_docs(first, max_chars=60_000)
    assert (first / "valid.txt").read_bytes() == whole


def test_stdlib_docs_edited_with_the_same_size_is_written_again(tmp_path):
    # The manifest's sizes cannot see an edit that keeps the size (a typo
    # fixed, a flipped byte): the files are the docstrings, by content.
    first = corpora.prepare_stdlib_docs(tmp_path / "a", max_chars=60_000)
    whole = (first / "train.txt").read_bytes()
    edited = whole.replace(b"the", b"THE", 1)
    assert edited != whole and len(edited) == len(whole)
    (first / "train.txt").write_bytes(edited)
    corpora.prepare_stdlib_docs(first, max_chars=60_000)
    assert (first / "train.txt").read_bytes() == whole
    # An untouched folder is still reused as it is.
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


# === Reading files: UTF-8, newlines, long lines ===

# Words with multi-byte characters and runs of spaces: a text8-like line.
_LINE_WORDS = ["the", "cat", "naïve", "日本語", "é", "x", "über", "a"]


def _long_line(words, seed=0):
    rng = np.random.default_rng(seed)
    seps = rng.choice([" ", " ", " ", "  ", "\t "], size=words)
    picked = rng.choice(_LINE_WORDS, size=words)
    return " " + "".join(w + s for w, s in zip(picked, seps))


def _streamed(source, split):
    return [text for text, _ in source.chunks(split)]


def test_invalid_utf8_is_refused_in_every_text_layout(tmp_path):
    # The same bytes, one invalid byte at 5000, as a single file, as a
    # folder's train.txt and as a raw text8 file: the same refusal, naming
    # the file and the byte, at any chunk size.
    data = bytearray(("word " * 2400).encode())
    data[5000:5002] = b"\xff\xfe"
    single = tmp_path / "book.txt"
    single.write_bytes(bytes(data))
    folder = _write_splits(tmp_path / "folder", TXT, ["", "valid\n", "test\n"])
    (folder / "train.txt").write_bytes(bytes(data))
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "text8").write_bytes(bytes(data))
    for source, path in ((single, single), (folder, folder / "train.txt"),
                         (tmp_path / "raw", tmp_path / "raw" / "text8")):
        message = re.escape(f"{path} is not valid UTF-8 text (near byte 5000)")
        with pytest.raises(ValueError, match=message):
            corpora.load_corpus(source, char_symbols=False)
        for chunk_bytes in (7, 100, 1 << 22):
            stream = corpora.open_corpus_source(source, chunk_bytes=chunk_bytes)
            with pytest.raises(ValueError, match=message):
                _streamed(stream, "train")
    # A byte corpus (the raw enwik8 file, byte tokenizer) keeps any bytes.
    (tmp_path / "bytes").mkdir()
    (tmp_path / "bytes" / "enwik8").write_bytes(bytes(data))
    corpus = corpora.load_corpus(tmp_path / "bytes")
    byte = corpus.build_tokenizer()
    ids = np.concatenate([byte.encode(corpus.split(s)) for s in corpora.SPLITS])
    assert bytes(ids.astype(np.uint8)) == bytes(data)


def test_txl_prepare_refuses_invalid_utf8_in_a_single_file(tmp_path, capsys):
    from keras_txl.cli import main

    path = tmp_path / "book.txt"
    path.write_bytes(b"when here b" + b"\xff\xfe(" + b" bad words\n" * 300)
    assert main(["prepare", "--data", str(path), "--workdir", str(tmp_path / "w")]) == 2
    assert f"{path} is not valid UTF-8 text (near byte 11)" in capsys.readouterr().err
    assert not (tmp_path / "w" / "tokenizer").exists()


def test_a_character_cut_by_the_raw_split_is_counted_as_encode_reads_it(tmp_path):
    # The 90% cut of a raw text file falls inside "é": each side keeps its
    # bytes (surrogateescape), and the streamed char vocabulary counts them as
    # the tokenizer does (U+FFFD), not as "?".
    from keras_txl.training.vocab import build_streaming_tokenizer

    data = ("ab cd\n" * 107 + " é" * 100).encode()
    train, _, _ = corpora.standard_split_sizes(len(data))
    assert data[train - 1:train + 1] == "é".encode()
    path = tmp_path / "book.txt"
    path.write_bytes(data)
    corpus = corpora.load_corpus(path)
    assert corpus.train.endswith("\udcc3") and corpus.valid.startswith("\udca9")
    streamed = build_streaming_tokenizer(
        "char", (t for t, _ in corpora.open_corpus_source(path, chunk_bytes=8).chunks("train")))
    fitted = tokenizers.build_tokenizer("char", corpus.train)
    assert streamed.vocabulary == fitted.vocabulary
    assert "?" not in streamed.vocabulary


def test_newlines_folders_universal_single_files_byte_exact(tmp_path):
    # Text files of a folder: "\r\n" and a lone "\r" are "\n", whatever the
    # chunking (a chunk never ends between "\r" and "\n"). A single file (and
    # raw enwik8/text8) is read byte for byte: "\r" is kept. docs/data.md says so.
    text = ("one two\r\nthree\rfour\r\n" + _long_line(300).replace(" ", "\r\n", 7)
            + "\r" + _long_line(300) + "\r\n")
    folder = _write_splits(tmp_path / "c", TXT, ["", "v\n", "t\n"])
    (folder / "train.txt").write_bytes(text.encode())
    expected = text.replace("\r\n", "\n").replace("\r", "\n")
    assert corpora.load_corpus(folder).train == expected
    for chunk_bytes in range(1, 40):
        stream = corpora.open_corpus_source(folder, chunk_bytes=chunk_bytes)
        pieces = _streamed(stream, "train")
        assert "".join(pieces) == expected, chunk_bytes
    single = tmp_path / "crlf.txt"
    single.write_bytes(text.encode())
    corpus = corpora.load_corpus(single)
    assert corpus.train + corpus.valid + corpus.test == text
    docs = (corpora.pathlib.Path(__file__).parents[1] / "docs" / "data.md").read_text()
    assert "Text files in a folder are read as UTF-8 with universal newlines" in docs
    assert "A single file" in docs and "byte for byte" in docs


@pytest.mark.parametrize("layout", ["folder", "text8", "single"])
def test_a_long_line_is_cut_in_bounded_chunks_with_the_same_tokens(tmp_path, layout):
    line = _long_line(2500)  # about 12 KB on one line, as text8 is
    if layout == "folder":
        source = _write_splits(tmp_path / "c", TXT, [line + "\n", "cat\n", "é\n"])
    elif layout == "text8":
        (tmp_path / "t8").mkdir()
        (tmp_path / "t8" / "text8").write_bytes(line.encode())
        source = tmp_path / "t8"
    else:
        source = tmp_path / "line.txt"
        source.write_bytes(line.encode())
    corpus = corpora.load_corpus(source, char_symbols=False)
    word = tokenizers.build_tokenizer("word", corpus.train)
    char = tokenizers.build_tokenizer("char", corpus.train)
    for chunk_bytes in (64, 1000):
        stream = corpora.open_corpus_source(source, chunk_bytes=chunk_bytes,
                                            char_symbols=False)
        pieces = _streamed(stream, "train")
        assert "".join(pieces) == corpus.train
        assert len(pieces) > len(corpus.train.encode()) // (2 * chunk_bytes)
        assert max(len(p.encode("utf-8", "surrogateescape")) for p in pieces) <= 2 * chunk_bytes
        # Cut at whitespace: the same words and characters as the whole line,
        # across every cut.
        for tokenizer in (word, char):
            np.testing.assert_array_equal(
                np.concatenate([tokenizer.encode(p) for p in pieces]),
                tokenizer.encode(corpus.train))
        # Resuming at any cursor gives the rest.
        chunks = list(stream.chunks("train"))
        middle = len(chunks) // 2
        assert list(stream.chunks("train", chunks[middle][1])) == chunks[middle + 1:]


def test_a_long_line_without_spaces_is_cut_at_character_boundaries(tmp_path):
    line = "日本語é" * 1500 + "\n"
    folder = _write_splits(tmp_path / "c", TXT, [line, "v\n", "t\n"])
    char = tokenizers.build_tokenizer("char", line)
    stream = corpora.open_corpus_source(folder, chunk_bytes=64)
    pieces = _streamed(stream, "train")
    assert "".join(pieces) == line
    assert max(len(p.encode()) for p in pieces) <= 128
    np.testing.assert_array_equal(
        np.concatenate([char.encode(p) for p in pieces]), char.encode(line))


def test_lm1b_as_the_reference_getdata_script_lays_it_out(tmp_path, caplog):
    # getdata.sh: one-billion-words/ holds the extracted release, valid.txt and
    # test.txt (copies of held-out shard 0) and 1b_word_vocab.txt. That folder
    # was refused ("missing train.txt"), and the release folder inside it lost
    # the vocabulary file beside it: the vocabulary was counted instead, in silence.
    folder = tmp_path / "one-billion-words"
    release = write_lm1b_release(folder / "1-billion-word-language-modeling-benchmark-r13output")
    for name in ("valid.txt", "test.txt"):
        (folder / name).write_text("a z .\n")
    vocabulary = folder / "1b_word_vocab.txt"
    vocabulary.write_text("<S>\n<UNK>\n.\na\nb\nc\n")
    for source in (folder, release):
        corpus = corpora.load_corpus(source)
        assert corpus.layout == "lm1b"
        assert corpus.train == "a b .\nb c .\n"
        assert corpus.valid == corpus.test == "a z .\n"
        assert corpus.tokenizer_options == {"double_eos": True,
                                            "vocabulary_file": str(vocabulary)}
    # Without the vocabulary file the counted vocabulary is said.
    vocabulary.unlink()
    with caplog.at_level("WARNING", logger="keras_txl.training.corpora"):
        corpus = corpora.load_corpus(folder)
    assert corpus.tokenizer_options == {"double_eos": True}
    assert "no 1b_word_vocab.txt" in caplog.text and "--vocabulary-file" in caplog.text


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_a_damaged_zip_is_an_error_naming_it(tmp_path, capsys, compression):
    # A flipped byte in text8.zip raised zipfile's "Bad CRC-32" (stored) or
    # zlib.error (deflated) from inside a read: a traceback from txl prepare.
    from keras_txl.cli import main

    text = b"".join(b"%d anarchism originated as a term of abuse " % i for i in range(400))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as archive:
        archive.writestr("text8", text)
    data = bytearray(buffer.getvalue())
    data[len(data) // 3] ^= 0x55  # inside the member's data
    folder = tmp_path / "text8"
    folder.mkdir()
    (folder / "text8.zip").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"text8\.zip is damaged: its member 'text8'"):
        corpora.load_corpus(folder)
    assert main(["prepare", "--data", str(folder), "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert "text8.zip is damaged" in err and "Traceback" not in err


def test_a_downloaded_wikitext_zip_or_its_parent_folder_says_what_to_pass(tmp_path):
    # wikitext-103-v1.zip was told to "contain a file named 'wikitext-103-v1'",
    # and the folder it was unzipped in had "no known layout", without a word
    # about the wikitext-103/ folder inside it.
    names = ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens")
    inner = _write_splits(tmp_path / "data" / "wikitext-103", names,
                          [" = A = \n the cat \n"] * 3)
    (tmp_path / "data" / "README").write_text("downloads")
    with pytest.raises(ValueError, match=re.escape(
            f"Its subfolder {inner} has one: pass that folder.")):
        corpora.load_corpus(tmp_path / "data")
    archive = tmp_path / "wikitext-103-v1.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        for name in names:
            handle.write(inner / name, f"wikitext-103/{name}")
    with pytest.raises(ValueError, match="holds a corpus folder .*unzip it and pass"):
        corpora.load_corpus(archive)
    assert corpora.load_corpus(inner).layout == "wikitext"


def test_tfds_errors_without_a_data_dir_say_the_default_not_none():
    # Without --data-dir the errors read "is not prepared in --data-dir None"
    # (and data_dir=None from Python): as if None had been passed as the folder.
    tfds = pytest.importorskip("tensorflow_datasets")
    for names, flag in ((corpora._TFDS_FLAGS, "--data-dir"), (corpora._TFDS_ARGUMENTS, "data_dir")):
        with pytest.raises(ValueError) as error:
            corpora._tfds_builder(tfds, "lm1b", None, False, names)
        message = str(error.value)
        assert "None" not in message, message
        assert f"TFDS's default data_dir (no {flag} given)" in message, message
        assert "(looked in " in message and "lm1b" in message, message
        with pytest.raises(ValueError) as error:
            corpora._tfds_builder(tfds, "no_such_corpus_xyz", None, False, names)
        message = str(error.value)
        assert "None" not in message and f"TFDS's default data_dir (no {flag} given)" in message, message


def _official_symbol_ids(folder):
    """The ids the reference code gives the symbol files of `folder`, as its
    `vocabulary.py` builds them for enwik8/text8 (`get_lm_corpus`: no
    special tokens; `count_file` on all three splits, whitespace-split
    lines; `build_vocab`: `Counter.most_common`; `encode_file` with
    `ordered=True, add_eos=False`)."""
    counter = collections.Counter()
    lines = {}
    for split in corpora.SPLITS:
        with open(folder / f"{split}.txt", encoding="utf-8") as handle:
            lines[split] = [line.strip().split() for line in handle]
        for symbols in lines[split]:
            counter.update(symbols)
    idx2sym = [symbol for symbol, _ in counter.most_common()]
    sym2idx = {symbol: index for index, symbol in enumerate(idx2sym)}
    return idx2sym, {s: [sym2idx[t] for line in lines[s] for t in line] for s in lines}


def _assert_reference_ids(corpus, folder, workdir, vocabulary, ids):
    """`corpus`'s tokenizer, and `txl prepare`'s streamed vocabulary and
    shards of `folder`, give the reference's `vocabulary` and `ids` (per
    split); returns the tokenizer."""
    from keras_txl.training.run import prepare_data

    tokenizer = corpus.build_tokenizer()
    assert tokenizer.vocabulary == vocabulary
    for split in corpora.SPLITS:
        assert tokenizer.encode(corpus.split(split)).tolist() == ids[split]
    prepared, shards = prepare_data(str(folder), str(workdir))
    assert prepared.vocabulary == vocabulary
    for split in corpora.SPLITS:
        assert np.asarray(shards[split]).tolist() == ids[split]
    return tokenizer


def _official_prep(folder, data, dataset):
    """`prep_enwik8.py` / `prep_text8.py` on `data` (bytes / str), with the
    last `len(data) // 20` for test and the same before it for valid (their
    5M of 100M)."""
    folder.mkdir()
    n = len(data) // 20
    parts = {"train": data[: -2 * n], "valid": data[-2 * n : -n], "test": data[-n:]}
    for split, part in parts.items():
        if dataset == "enwik8":
            text = " ".join(str(c) if c != ord("\n") else "\n" for c in part)
        else:
            text = " ".join("_" if c == " " else c for c in part.strip())
        (folder / f"{split}.txt").write_text(text, encoding="utf-8")
    return folder


@pytest.mark.parametrize("dataset", ["enwik8", "text8"])
def test_symbol_files_get_the_reference_ids_and_vocabulary(tmp_path, dataset):
    # The reference vocabulary of the official symbol files has no special
    # token (204 symbols for enwik8, 27 for text8). Was: '<unk>' at id 0
    # before the symbols, every id one above the reference's and a vocabulary
    # one larger than the official models'.
    rng = np.random.default_rng(0)
    if dataset == "enwik8":
        alphabet = list(b"aaaabbbcd <>&\n") + [0xC3, 0xA9]
        data = bytes(rng.choice(alphabet, size=3000).tolist())
    else:
        data = "".join(rng.choice(list("aaaabbbcdefg   "), size=3000).tolist())
    folder = _official_prep(tmp_path / dataset, data, dataset)
    vocabulary, ids = _official_symbol_ids(folder)
    corpus = corpora.load_corpus(folder)
    assert corpus.layout == "char-symbols"
    tokenizer = _assert_reference_ids(corpus, folder, tmp_path / "w", vocabulary, ids)
    assert tokenizer.unk_id is None and tokenizer.eos_id is None
    # A vocabulary cut by the caller needs an id for the symbols left out:
    # '<unk>', last, the other ids unchanged.
    cut = corpus.build_tokenizer(max_size=4)
    assert cut.vocabulary == vocabulary[:3] + ["<unk>"] and cut.unk_id == 3
    with pytest.raises(ValueError, match=r"no unknown token .*unk_token=None"):
        corpus.build_tokenizer(max_size=4, unk_token=None)


def _official_wikitext_ids(folder):
    """The ids the reference code gives a WikiText folder (`get_lm_corpus`
    for wt103/wt2: `special=['<eos>']`; `count_file` of the train split;
    `build_vocab`: '<eos>', then `Counter.most_common`, '<unk>' a word of
    the text like any other; `encode_file` with `ordered=True`, an '<eos>'
    after every line)."""
    def lines(split):
        with open(folder / f"wiki.{split}.tokens", encoding="utf-8") as handle:
            return [line.strip().split() for line in handle]

    counter = collections.Counter()
    for symbols in lines("train"):
        counter.update(symbols)
    idx2sym = ["<eos>"] + [symbol for symbol, _ in counter.most_common()]
    sym2idx = {symbol: index for index, symbol in enumerate(idx2sym)}
    ids = {s: [sym2idx[t] for line in lines(s) for t in line + ["<eos>"]]
           for s in corpora.SPLITS}
    return idx2sym, ids


def test_wikitext_gets_the_reference_ids(tmp_path):
    # WikiText's text holds '<unk>' (the tokens it replaced); the reference
    # vocabulary is '<eos>', then the words by count with '<unk>' at its
    # count's rank. Was: '<unk>' at id 1, so every word counted more often
    # than '<unk>' had an id one above the reference's.
    names = ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens")
    train = (" = Valkyria = \n \n the game <unk> is a the the of of <unk> , . \n"
             " the cat , . \n") * 3
    folder = _write_splits(tmp_path / "wikitext-103", names,
                           [train, " the <unk> game . \n", " of the cat \n"])
    vocabulary, ids = _official_wikitext_ids(folder)
    assert vocabulary.index("<unk>") == 3
    corpus = corpora.load_corpus(folder)
    tokenizer = _assert_reference_ids(corpus, folder, tmp_path / "w", vocabulary, ids)
    assert (tokenizer.eos_id, tokenizer.unk_id) == (0, 3)
    # Text without '<unk>' (the reference would have no unknown word): the
    # other ids are the reference's and '<unk>' comes last, also when a
    # --vocab-size cuts the vocabulary.
    plain = _write_splits(tmp_path / "plain", names, ["b a b\n", "a\n", "c\n"])
    tokenizer = corpora.load_corpus(plain).build_tokenizer()
    assert tokenizer.vocabulary == ["<eos>", "b", "a", "<unk>"]
    assert tokenizer.encode("c\n").tolist() == [3, 0]
    cut = corpora.load_corpus(plain).build_tokenizer(max_size=3)
    assert cut.vocabulary == ["<eos>", "b", "<unk>"]


def test_small_files_are_joined_into_chunks(tmp_path):
    # An LM1B folder of many small training files was read one chunk per
    # file, each chunk one tokenizer call: 20,000 one-line files took over
    # ten minutes to prepare (about 30 s now). The files' texts are joined
    # up to chunk_bytes, with the same ids and cursors that resume exactly.
    lines = [f"sentence {i} of {'x' * (i % 7)} .\n" for i in range(300)]
    root = write_lm1b_release(tmp_path / "lm1b", train=lines)
    stream = corpora.open_corpus_source(root)
    chunks = list(stream.chunks("train"))
    assert len(chunks) == 1 and chunks[0][0] == "".join(lines)
    assert chunks[0][1] == [len(lines) - 1, len(lines[-1])]
    small = corpora.open_corpus_source(root, chunk_bytes=100)
    chunks = list(small.chunks("train"))
    assert "".join(text for text, _ in chunks) == "".join(lines)
    assert 20 < len(chunks) < 150
    assert max(len(text.encode()) for text, _ in chunks) <= 100
    for middle in (1, len(chunks) // 2, len(chunks) - 1):
        assert list(small.chunks("train", chunks[middle - 1][1])) == chunks[middle:]
    word = tokenizers.build_tokenizer("word", "".join(lines))
    np.testing.assert_array_equal(
        np.concatenate([word.encode(text) for text, _ in chunks]),
        word.encode("".join(lines)))


@pytest.mark.parametrize("what", ["folder", "broken link"])
def test_an_lm1b_training_name_that_is_no_file_is_named(tmp_path, what):
    # Every news.en-* of the training folder is read: a folder or a broken
    # symbolic link of that name was a bare IsADirectoryError /
    # FileNotFoundError from inside the chunk reader.
    root = write_lm1b_release(tmp_path / "lm1b")
    odd = root / "training-monolingual.tokenized.shuffled" / "news.en-extra"
    if what == "folder":
        odd.mkdir()
        why = "is a folder"
    else:
        odd.symlink_to(tmp_path / "gone")
        why = "is a symbolic link to .*gone', which does not exist"
    with pytest.raises(ValueError, match=rf"news.en-extra {why}, but every news.en-\* in "
                                         r".* is read as a training file .*move it out"):
        corpora.open_corpus_source(root)
