"""Hostile inputs and damaged files for keras_txl/tokenizers.py."""

import json
import re
import resource
import signal

import numpy as np
import pytest

from keras_txl import tokenizers

SMALL = ["<eos>", "<unk>", "a", "b"]
LARGE = ["<eos>", "<unk>"] + [f"word{i}" for i in range(200)]


def _write_limited(max_bytes, write):
    """Runs `write()` as on a disk that takes no file past `max_bytes`
    (RLIMIT_FSIZE: a write past it fails with EFBIG, as ENOSPC would)."""
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, old_limit[1]))
        try:
            write()
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
    finally:
        signal.signal(signal.SIGXFSZ, old_handler)


@pytest.mark.parametrize("kind", ["word", "char"])
def test_a_save_that_fails_mid_write_keeps_the_previous_tokenizer(kind, tmp_path):
    # A disk that fills up during `save` over an existing tokenizer: every
    # file must be the old one or the new one, never a cut vocabulary.
    if kind == "word":
        old = tokenizers.WordTokenizer(SMALL)
        new = tokenizers.WordTokenizer(LARGE)
    else:
        old = tokenizers.CharTokenizer(["<unk>", "a", "b"])
        new = tokenizers.CharTokenizer(["<unk>"] + [chr(0x4E00 + i) for i in range(300)])
    folder = tmp_path / "tokenizer"
    old.save(folder)
    before = {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    with pytest.raises(OSError):
        _write_limited(200, lambda: new.save(folder))
    after = {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert after == before
    loaded = tokenizers.load_tokenizer(folder)
    assert loaded.get_vocabulary() == old.get_vocabulary()
    assert not [p for p in folder.rglob(".tmp-*")]


def test_export_vocabulary_that_fails_mid_write_leaves_no_cut_file(tmp_path):
    tokenizers.export_vocabulary(tokenizers.WordTokenizer(SMALL), tmp_path / "app")
    before = (tmp_path / "app" / "vocabulary.txt").read_bytes()
    with pytest.raises(OSError):
        _write_limited(
            100,
            lambda: tokenizers.export_vocabulary(
                tokenizers.WordTokenizer(LARGE), tmp_path / "app"
            ),
        )
    assert (tmp_path / "app" / "vocabulary.txt").read_bytes() == before


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_a_vocabulary_file_cut_short_is_an_error_on_load(cut, tmp_path):
    # The last word losing letters keeps the count of tokens (and the
    # vocabulary_size tokenizer.json records): it loaded as another word.
    tokenizer = tokenizers.WordTokenizer(["<eos>", "<unk>", "a", "word"])
    tokenizer.save(tmp_path / "tok")
    vocabulary = tmp_path / "tok" / "assets" / "tokenizer" / "vocabulary.txt"
    vocabulary.write_bytes(vocabulary.read_bytes()[:-cut])
    with pytest.raises(ValueError, match=r"vocabulary.txt does not have the sha256"):
        tokenizers.load_tokenizer(tmp_path / "tok")


def test_assets_of_another_save_beside_an_old_tokenizer_json_are_an_error(tmp_path):
    # A save killed between its assets and tokenizer.json: the old settings
    # with the new vocabulary of the same size loaded as a third tokenizer.
    tokenizers.WordTokenizer(["<eos>", "<unk>", "a", "b"]).save(tmp_path / "old")
    tokenizers.WordTokenizer(["<eos>", "<unk>", "b", "a"]).save(tmp_path / "new")
    asset = "assets/tokenizer/vocabulary.txt"
    (tmp_path / "old" / asset).write_bytes((tmp_path / "new" / asset).read_bytes())
    with pytest.raises(ValueError, match="cut short, changed, or written by another save"):
        tokenizers.load_tokenizer(tmp_path / "old")


@pytest.mark.parametrize("digests", [["x"], {"other.txt": "0"}, {}])
def test_a_bad_assets_sha256_entry_is_an_error(digests, tmp_path):
    tokenizers.WordTokenizer(SMALL).save(tmp_path / "tok")
    path = tmp_path / "tok" / "tokenizer.json"
    data = json.loads(path.read_text())
    data["assets_sha256"] = digests
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="must record under 'assets_sha256'"):
        tokenizers.load_tokenizer(tmp_path / "tok")


def test_a_tokenizer_json_without_digests_still_loads(tmp_path):
    # keras-hub's own preset saver and earlier keras-txl write none.
    tokenizer = tokenizers.WordTokenizer(SMALL)
    tokenizer.save(tmp_path / "tok")
    path = tmp_path / "tok" / "tokenizer.json"
    data = json.loads(path.read_text())
    assert set(data["assets_sha256"]) == {"vocabulary.txt"}
    del data["assets_sha256"]
    path.write_text(json.dumps(data))
    loaded = tokenizers.load_tokenizer(tmp_path / "tok")
    np.testing.assert_array_equal(loaded.encode("a b\n"), tokenizer.encode("a b\n"))


# === Vocabulary entries no text can give ===


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: tokenizers.WordTokenizer(["<eos>", "<unk>", "a b"]),
         "Received 'a b' at index 2, with ' '"),
        (lambda: tokenizers.WordTokenizer(["<eos>", "<unk>", "new\u3000york"]),
         "Received 'new\\u3000york' at index 2, with '\\u3000'"),
        (lambda: tokenizers.WordTokenizer(["<eos>", "<unk>", "a\nb"]),
         "Received 'a\\nb' at index 2, with '\\n'"),
        (lambda: tokenizers.WordTokenizer(["<e os>", "<unk>"], eos_token="<e os>"),
         "Received '<e os>' at index 0, with ' '"),
        (lambda: tokenizers.WordTokenizer(["<unk>", "a\xa0b"], add_eos=False),
         "Received 'a\\xa0b' at index 1, with '\\xa0'"),
        (lambda: tokenizers.WordPieceTokenizer(["<eos>", "<unk>", "a\tb"]),
         "Received 'a\\tb' at index 2, with '\\t'"),
    ],
)
def test_word_vocabularies_refuse_tokens_with_whitespace(make, message):
    # Text is split at whitespace: such a token held an id no text got
    # (and "a\nb" was written as two lines of vocabulary.txt).
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        make()
    assert "must not contain whitespace" in str(error.value)


def test_a_lower_case_word_vocabulary_refuses_upper_case_words():
    with pytest.raises(
        ValueError,
        match=re.escape("`vocabulary` must hold lower-case words. Received 'The' at index 2"),
    ):
        tokenizers.WordTokenizer(["<eos>", "<UNK>", "The"], lower_case=True, unk_token="<UNK>")
    # The special tokens are not looked up: upper case is fine for them.
    tokenizer = tokenizers.WordTokenizer(["<EOS>", "<UNK>", "the"], lower_case=True,
                                         unk_token="<UNK>", eos_token="<EOS>")
    assert tokenizer.encode("The cat\n").tolist() == [2, 1, 0]
    # What fit builds with lower_case always passes.
    fitted = tokenizers.WordTokenizer.fit("The CAT İstanbul\n", lower_case=True)
    assert fitted.decode(fitted.encode("THE cat\n")) == "the cat\n"


@pytest.mark.parametrize("cls", [tokenizers.WordTokenizer, tokenizers.WordPieceTokenizer])
def test_the_unknown_and_end_of_line_tokens_must_differ(cls):
    # Unknown words became line ends: WordTokenizer(["<eos>", "a"],
    # unk_token="<eos>").decode(encode("a b")) was "a\n".
    with pytest.raises(ValueError, match=re.escape(
            "`unk_token` and `eos_token` must differ: unknown words would become "
            "line ends. Received: unk_token='<eos>', eos_token='<eos>'")):
        cls(["<eos>", "a"], unk_token="<eos>")
    if cls is tokenizers.WordTokenizer:  # no line ends, no clash
        assert cls(["<eos>", "a"], unk_token="<eos>", add_eos=False).encode("a b").tolist() == [1, 0]


@pytest.mark.parametrize("vocabulary", [
    {"<eos>": 0, "<unk>": 1, "b": 3, "a": 2},
    {"<eos>", "<unk>", "a"},
    frozenset({"<eos>", "<unk>", "a"}),
])
def test_a_vocabulary_mapping_or_set_is_refused(vocabulary):
    # A {token: id} mapping gave the ids of its keys' order (here "b"
    # became 2), a set those of an arbitrary order.
    with pytest.raises(ValueError, match="must be a list of str tokens in id order"):
        tokenizers.WordTokenizer(vocabulary)
    with pytest.raises(ValueError, match="must be a list of str tokens in id order"):
        tokenizers.CharTokenizer(vocabulary if isinstance(vocabulary, dict) else {"<unk>", "a"})


@pytest.mark.parametrize("vocabulary, bad", [
    (["7", "007"], "'007' at index 1"),
    (["32", "٣"], "'٣' at index 1"),
    (["²"], "'²' at index 0"),
    (["256"], "'256' at index 0"),
    (["+5"], "'+5' at index 0"),
])
def test_enwik8_symbols_are_byte_values_as_the_official_data_writes_them(vocabulary, bad):
    # "007" beside "7" failed in a tf.lookup FailedPreconditionError; "٣"
    # was byte 3 for tokenize but not for encode.
    with pytest.raises(ValueError, match=re.escape(bad)) as error:
        tokenizers.OfficialSymbolTokenizer(vocabulary, "enwik8")
    assert "written in decimal without leading zeros" in str(error.value)


def test_an_enwik8_vocabulary_with_the_newline_symbol_still_loads():
    # A vocabulary counted on enwik8 text that kept its newlines holds "10":
    # the official preparation drops them, so the id is unused, not wrong.
    tokenizer = tokenizers.OfficialSymbolTokenizer(["10", "32", "97"], "enwik8")
    np.testing.assert_array_equal(tokenizer.encode("a a\n"), [2, 1, 2])


@pytest.mark.parametrize("vocabulary, bad", [
    (["a", " "], "' ' at index 1"),
    (["\n", "a"], "'\\n' at index 0"),
    (["ab"], "'ab' at index 0"),
])
def test_text8_symbols_are_characters_as_the_official_data_writes_them(vocabulary, bad):
    # " " beside "_": every space was "_", so " " was never given (and
    # "\n" is dropped from the text).
    with pytest.raises(ValueError, match=re.escape(bad)) as error:
        tokenizers.OfficialSymbolTokenizer(vocabulary, "text8")
    assert "with '_' for a space and no newline" in str(error.value)


# === The preprocessor's sequence_length ===


def _preprocessor(sequence_length=4):
    from keras_txl.causal_lm_preprocessor import TransformerXLCausalLMPreprocessor

    tokenizer = tokenizers.WordTokenizer(["<eos>", "<unk>", "a", "b", "c"])
    return TransformerXLCausalLMPreprocessor(tokenizer, sequence_length=sequence_length)


@pytest.mark.parametrize("value", [0, -3, 2.0, True])
def test_a_bad_sequence_length_per_call_is_an_error_not_the_default(value):
    # keras-hub reads `sequence_length or self.sequence_length`: 0 packed
    # to the preprocessor's length in silence, -3 to an empty (1, 0) batch.
    import tensorflow as tf

    preprocessor = _preprocessor()
    message = "`sequence_length` must be a positive integer or None"
    with pytest.raises(ValueError, match=re.escape(message)):
        preprocessor.generate_preprocess(["a b"], sequence_length=value)
    with pytest.raises(ValueError, match=re.escape(message)):
        preprocessor(["a b"], sequence_length=value)
    texts = tf.data.Dataset.from_tensor_slices(["a b c a b c a b c"])
    with pytest.raises(ValueError, match="`sequence_length` must be a positive integer"):
        preprocessor.ordered_segments(texts, 1, sequence_length=value)
    # None is the preprocessor's own; a good value is taken.
    assert preprocessor.generate_preprocess(["a b"])["token_ids"].shape == (1, 4)
    assert preprocessor.generate_preprocess(["a b"], sequence_length=3)["token_ids"].shape == (1, 3)
    x, _, _ = preprocessor(["a b c a"], sequence_length=2)
    assert x["token_ids"].numpy().tolist() == [[2, 3]]


@pytest.mark.parametrize("value", [0, -5, None, 1.5])
def test_setting_a_bad_sequence_length_is_an_error(value):
    # The setter took anything; a negative length then packed every text
    # to nothing.
    preprocessor = _preprocessor()
    with pytest.raises(ValueError, match="`sequence_length` must be a positive integer"):
        preprocessor.sequence_length = value
    assert preprocessor.sequence_length == 4
    preprocessor.sequence_length = 2
    x, _, _ = preprocessor(["a b c"])
    assert x["token_ids"].numpy().tolist() == [[2, 3]]


# === Inputs of tokenize ===


@pytest.fixture(scope="module")
def every_kind():
    return {
        kind: tokenizers.build_tokenizer(
            kind, "the cat sat\nthe dog\n",
            **({"vocabulary_size": 40} if kind in ("sentencepiece", "wordpiece") else {}))
        for kind in tokenizers.TOKENIZER_KINDS
    }


@pytest.mark.parametrize("kind", tokenizers.TOKENIZER_KINDS)
def test_an_empty_batch_tokenizes_to_an_empty_ragged_batch(kind, every_kind):
    # It was "`inputs` must be a string tensor ... Received: float32": an
    # empty list has no dtype, and TensorFlow guesses float32.
    tokenizer = every_kind[kind]
    for empty in ([], (), np.array([], dtype="<U1")):
        ids = tokenizer.tokenize(empty)
        assert ids.shape.as_list() == [0, None] and ids.dtype.name == "int32"
        assert tokenizer.detokenize(ids).numpy().tolist() == []


def test_an_object_array_of_str_is_read_like_a_list_of_str():
    # pandas gives object arrays: TensorFlow's strict conversion failed on a
    # surrogateescape byte with "must be a string tensor ... Received: ndarray".
    tokenizer = tokenizers.ByteTokenizer()
    texts = ["h\u00e9", "\udcff!"]
    ids = tokenizer.tokenize(np.array(texts, dtype=object))
    assert ids.to_list() == tokenizer.tokenize(texts).to_list() == [[104, 195, 169], [255, 33]]
    with pytest.raises(ValueError, match=re.escape("`inputs[1]` holds the lone surrogate")):
        tokenizer.tokenize(np.array(["a", "\ud800"], dtype=object))
    with pytest.raises(ValueError, match="must be a string tensor"):
        tokenizer.tokenize(np.array([None, "a"], dtype=object))


def test_a_char_vocabulary_of_crlf_text_is_exported_and_read_back(tmp_path):
    # CRLF text gives a char vocabulary a "\r": export_vocabulary (and so
    # the TFLite export of such a model) failed with "token '\r' contains a
    # line break".
    from keras_txl.training.vocab import read_vocabulary_file

    tokenizer = tokenizers.CharTokenizer.fit("ab\r\ncd\r\n")
    assert "\r" in tokenizer.vocabulary
    folder = tokenizers.export_vocabulary(tokenizer, tmp_path / "app")
    lines = (folder / "vocabulary.txt").read_bytes().decode("utf-8").split("\n")[:-1]
    assert len(lines) == tokenizer.vocabulary_size()
    assert lines[tokenizer.token_to_id("\r")] == "\\r"
    assert lines[tokenizer.token_to_id("\n")] == "\\n"
    assert read_vocabulary_file(folder / "vocabulary.txt", "char") == tokenizer.vocabulary


def test_id_to_token_refuses_a_bool():
    # True was id 1 ('<unk>'): a mask passed for an id.
    tokenizer = tokenizers.WordTokenizer(SMALL)
    for bad in (True, False, 2.0, -1, 4):
        with pytest.raises(ValueError, match=re.escape(f"`id` must be an int in [0, 4). Received: id={bad!r}.")):
            tokenizer.id_to_token(bad)
    assert tokenizer.id_to_token(np.int64(2)) == "a"


def test_a_wordpiece_vocabulary_learned_on_text_with_unicode_spaces_loads():
    # The learner's BERT split keeps U+1680 inside words; the vocabulary
    # check refused the piece it learned. Words are split as tokenize splits.
    text = "\n".join(["the\u1680cat sat\u3000on the\u2028mat"] * 20)
    tokenizer = tokenizers.WordPieceTokenizer.fit(text, vocabulary_size=40)
    assert not any(set(token) & set(tokenizers.UNICODE_WHITESPACE)
                   for token in tokenizer.get_vocabulary())
    ids = tokenizer.encode("the cat sat on the mat")
    np.testing.assert_array_equal(tokenizer.encode(text.split("\n")[0]), ids)
    assert tokenizer.unk_id not in ids


@pytest.mark.parametrize("token,normalized", [
    ("Hello", "hello"), ("##S", "s"), ("é", "e"), ("straße", "strasse"), ("\u0301", ""),
])
def test_a_lower_case_wordpiece_vocabulary_warns_of_pieces_no_text_gives(token, normalized,
                                                                         caplog):
    # The text is normalized (FastBertNormalizer: lower case, NFD, accents
    # stripped) before the lookup: such a piece held an id no text got, and
    # "Hello world" read as [UNK] world in silence. A warning, not an error:
    # stock uncased BERT vocabularies hold such pieces (and [CLS]-style
    # reserved tokens, not warned of), and lower_case=False would be wrong there.
    vocabulary = ["<eos>", "<unk>", "world", token, "[CLS]", "[unused0]"]
    with caplog.at_level("WARNING", logger="keras_txl.tokenizers"):
        tokenizer = tokenizers.WordPieceTokenizer(vocabulary, lower_case=True)
    warned = [r.getMessage() for r in caplog.records if "WordPiece vocabulary" in r.getMessage()]
    assert len(warned) == 1
    assert "1 piece(s) change under the normalizer" in warned[0]
    assert f"{token!r} (index 3) -> {normalized!r}. For a cased vocabulary" in warned[0]
    assert "CLS" not in warned[0] and "unused0" not in warned[0]
    assert tokenizer.encode("world").tolist() == [2]
    caplog.clear()
    with caplog.at_level("WARNING", logger="keras_txl.tokenizers"):
        cased = tokenizers.WordPieceTokenizer(vocabulary, lower_case=False)
    assert cased.unk_id == 1 and not caplog.records
    # The specials are inserted, not looked up: upper case is fine for them.
    tokenizer = tokenizers.WordPieceTokenizer(
        ["<EOS>", "[UNK]", "hello", "world"], lower_case=True, unk_token="[UNK]",
        eos_token="<EOS>")
    assert tokenizer.encode("Héllo World\n").tolist() == [2, 3, 0]
    # What fit learns with lower_case=True loads (normalized pieces only).
    text = "\n".join(["Héllo Wörld straße İstanbul ﬁne naïve 한국어 ΣΊΣΥΦΟΣ ½ café"] * 30)
    fitted = tokenizers.WordPieceTokenizer.fit(text, vocabulary_size=200)
    again = tokenizers.WordPieceTokenizer(fitted.get_vocabulary(), lower_case=True)
    assert again.encode(text).tolist() == fitted.encode(text).tolist()


def test_a_sequence_length_past_the_limit_is_a_clear_error(monkeypatch):
    # No upper bound: 2**32 + 4 was a MemoryError from inside keras-hub's
    # packer (and a smaller typo could have the process killed for memory).
    import tensorflow as tf

    from keras_txl.causal_lm_preprocessor import TransformerXLCausalLMPreprocessor

    limit = 1 << 20  # keras_txl.limits.Limits.max_sequence_length
    message = f"`sequence_length` must be at most {limit} (the limit max_sequence_length"
    tokenizer = tokenizers.ByteTokenizer()
    for build in (lambda n: TransformerXLCausalLMPreprocessor(tokenizer, sequence_length=n),
                  lambda n: setattr(_preprocessor(), "sequence_length", n),
                  lambda n: _preprocessor()(["a b"], sequence_length=n),
                  lambda n: _preprocessor().generate_preprocess(["a b"], sequence_length=n),
                  lambda n: _preprocessor().ordered_segments(
                      tf.data.Dataset.from_tensor_slices(["a b c"]), 1, sequence_length=n)):
        with pytest.raises(ValueError, match=re.escape(message) + r".*"
                           r"Received: sequence_length=4294967300\..*KERAS_TXL_LIMITS"):
            build(2**32 + 4)
    # At the limit it packs; the limit is raised as every other one.
    x = TransformerXLCausalLMPreprocessor(tokenizer, sequence_length=limit).generate_preprocess(
        ["ab"])
    assert x["token_ids"].shape == (1, limit)
    monkeypatch.setenv("KERAS_TXL_LIMITS", '{"max_sequence_length": 2000000}')
    assert TransformerXLCausalLMPreprocessor(
        tokenizer, sequence_length=limit + 1).sequence_length == limit + 1


def test_byte_token_to_id_is_the_byte_encode_gives_and_id_to_token_reads_back():
    # token_to_id read a character as Latin-1: token_to_id("é") was 233,
    # which no text holding "é" gets (its UTF-8 is 195, 169), and
    # id_to_token(233) was "é", which encodes to two other ids.
    tokenizer = tokenizers.ByteTokenizer()
    for byte in range(256):
        token = tokenizer.id_to_token(byte)
        assert tokenizer.encode(token).tolist() == [byte]
        assert tokenizer.token_to_id(token) == byte
    assert tokenizer.get_vocabulary()[233] == tokenizer.id_to_token(233) == "\udce9"
    assert tokenizer.token_to_id("a") == 97
    for token, ids in (("é", [195, 169]), ("\xff", [195, 191]), ("€", [226, 130, 172])):
        with pytest.raises(ValueError, match=re.escape(
                f"Received: token={token!r} ({token!r} is {len(ids)} bytes in UTF-8: "
                f"encode() gives {ids}). Use encode() for text.")):
            tokenizer.token_to_id(token)
    for bad in ("", "ab", "\ud800", 97, None):
        with pytest.raises(ValueError, match="`token` must be one byte of the byte tokenizer"):
            tokenizer.token_to_id(bad)
