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
    # Everything but the layer's name, which is saved as one name per kind.
    assert {**loaded.get_config(), "name": None} == {**tokenizer.get_config(), "name": None}
    assert loaded.name == config["config"]["name"] == f"{kind}_tokenizer"
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


@pytest.mark.parametrize("kind", tokenizers.TOKENIZER_KINDS)
def test_leading_and_only_blank_lines_survive_decoding(kind, fitted):
    # tf.strings.reduce_join of a ragged tensor drops the separators after a
    # row's leading empty strings; the texts of each kind's lines must not.
    tokenizer = fitted[kind]
    texts = ["\nthe dog", "\n\n", "\n\nthe fox\n\nthe dog\n", "the dog\n", "\n", ""]
    for text in texts:
        assert tokenizer.decode(tokenizer.encode(text)) == text, text
    batch = tokenizer.detokenize(tokenizer.tokenize(texts)).numpy()
    assert [text.decode("utf-8") for text in batch] == texts
    # The ids of a continuation that starts at a newline (generation's).
    eos = tokenizer.encode("\n")
    dog = tokenizer.encode("the dog")
    assert tokenizer.decode(np.concatenate([eos, eos, dog])) == "\n\nthe dog"


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
    # Traced (tf.function, a tf.data map) after a reset, before any eager
    # call: the graph captured the deleted resource (NotFoundError), and a
    # graph traced before a reset failed after it.
    import tensorflow as tf

    keras.utils.set_random_seed(2)
    lines = tf.constant(TEXT.split("\n")[:3])
    traced = tf.function(lambda x: tokenizer.tokenize(x))
    expected = tokenizer.tokenize(lines).to_list()
    keras.utils.set_random_seed(3)
    assert traced(lines).to_list() == expected
    keras.utils.set_random_seed(4)
    assert traced(lines).to_list() == expected
    mapped = tf.data.Dataset.from_tensor_slices(lines).map(tokenizer.tokenize)
    assert [list(x) for x in mapped.as_numpy_iterator()] == expected
    back = tf.function(lambda x: tokenizer.detokenize(x))(tokenizer.tokenize(lines))
    assert [t.decode() for t in back.numpy()] == [t.decode() for t in lines.numpy()]


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
    with pytest.raises(ValueError, match=r"vocabulary.txt does not have the sha256"):
        tokenizers.load_tokenizer(tmp_path / "word")
    # Without the sha256s (a keras-hub preset's tokenizer.json), the size.
    config = json.loads((tmp_path / "word" / "tokenizer.json").read_text())
    del config["assets_sha256"]
    (tmp_path / "word" / "tokenizer.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match=r"says vocabulary_size=\d+, but the files in"
    ):
        tokenizers.load_tokenizer(tmp_path / "word")
    # A tokenizer.json of the old layout without its version.
    (tmp_path / "word" / "tokenizer.json").write_text('{"kind": "word"}')
    with pytest.raises(ValueError, match="format_version=None"):
        tokenizers.load_tokenizer(tmp_path / "word")


# === Keras layer: graph tokenize/detokenize, keras-hub API and files ===

import keras  # noqa: E402
import keras_hub  # noqa: E402
import tensorflow as tf  # noqa: E402

# Newlines, an empty line, characters outside the vocabularies, the empty
# string, non-ASCII text, no final newline, and whitespace that is not ASCII
# (no-break, ideographic and em spaces, a line separator) with a CRLF.
SAMPLES = [
    "the memory is not trained\n\nthe lazy dog\n",
    "",
    "  zebra ☃ café\n\n   x",
    "日本語 🙂 naïve",
    TEXT[:400],
    "the\u00a0lazy\u3000dog\u2028the\u2003fox\u0085\u001cmemory \r\nthe",
]
# The official text8 vocabulary has no unknown symbol: text it covers.
OFFICIAL_TEXT = "anarchy originated as a term\nof abuse first used"
OFFICIAL_SAMPLES = ["anarchy as a term\nof", "", "abuse first used", "a"]
LAYER_KINDS = (*tokenizers.TOKENIZER_KINDS, "official_symbols")


@pytest.fixture(scope="module")
def layers(fitted):
    official = tokenizers.OfficialSymbolTokenizer.fit(
        OFFICIAL_TEXT, dataset="text8"
    )
    return {**fitted, "official_symbols": official}


def samples_for(kind):
    return OFFICIAL_SAMPLES if kind == "official_symbols" else SAMPLES


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_tokenize_in_dataset_map_and_tf_function_equals_encode(kind, layers):
    tokenizer = layers[kind]
    texts = samples_for(kind)
    expected = [tokenizer.encode(text) for text in texts]

    dataset = tf.data.Dataset.from_tensor_slices(texts).map(tokenizer)
    for got, want in zip(dataset, expected):
        assert got.dtype == tf.int32
        np.testing.assert_array_equal(got.numpy(), want)

    scalar = tf.function(tokenizer.tokenize)
    batch = tf.function(
        tokenizer.tokenize,
        input_signature=[tf.TensorSpec([None], tf.string)],
    )
    ragged = batch(tf.constant(texts))
    for index, (text, want) in enumerate(zip(texts, expected)):
        np.testing.assert_array_equal(scalar(tf.constant(text)).numpy(), want)
        np.testing.assert_array_equal(ragged[index].numpy(), want)


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_batched_tokenize_is_ragged_with_the_rows_of_each_alone(kind, layers):
    tokenizer = layers[kind]
    texts = samples_for(kind)[:3]
    batch = tokenizer(texts)
    assert isinstance(batch, tf.RaggedTensor)
    assert batch.dtype == tf.int32 and batch.shape[0] == 3
    for row, text in zip(batch, texts):
        alone = tokenizer.tokenize(text)
        assert alone.shape.rank == 1
        np.testing.assert_array_equal(row.numpy(), alone.numpy())


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_detokenize_inverts_tokenize_like_decode(kind, layers):
    tokenizer = layers[kind]
    texts = samples_for(kind)
    for text in texts:
        expected = tokenizer.decode(tokenizer.encode(text))
        got = tokenizer.detokenize(tokenizer.tokenize(text))
        assert got.shape.rank == 0
        assert got.numpy().decode("utf-8") == expected
    batch = tokenizer.detokenize(tokenizer.tokenize(texts))
    assert [t.decode("utf-8") for t in batch.numpy()] == [
        tokenizer.decode(tokenizer.encode(text)) for text in texts
    ]
    # Dense ids of one length work too.
    ids = tokenizer.encode(texts[0])
    dense = tokenizer.detokenize(np.stack([ids, ids]))
    assert dense.numpy()[1].decode("utf-8") == tokenizer.decode(ids)
    graph = tf.function(tokenizer.detokenize)(tf.ragged.constant([ids]))
    assert graph.numpy()[0].decode("utf-8") == tokenizer.decode(ids)


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_keras_hub_api(kind, layers):
    tokenizer = layers[kind]
    assert isinstance(tokenizer, keras_hub.tokenizers.Tokenizer)
    assert isinstance(tokenizer, keras.layers.Layer)
    from keras_txl.backbone import TransformerXLBackbone

    assert tokenizer.backbone_cls is TransformerXLBackbone
    vocabulary = tokenizer.get_vocabulary()
    assert len(vocabulary) == tokenizer.vocabulary_size()
    assert tokenizer.end_token_id == tokenizer.eos_id
    assert tokenizer.start_token_id is None
    assert tokenizer.pad_token_id == (tokenizer.eos_id or 0)
    last = tokenizer.vocabulary_size() - 1
    assert tokenizer.token_to_id(tokenizer.id_to_token(last)) == last
    with pytest.raises(ValueError, match=r"`id` must be an int in \[0, "):
        tokenizer.id_to_token(last + 1)


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_keras_serialization_with_assets(kind, layers, tmp_path):
    tokenizer = layers[kind]
    config = keras.saving.serialize_keras_object(tokenizer)
    assert "vocabulary" not in config["config"]
    assert "model_proto" not in config["config"]
    restored = keras.saving.deserialize_keras_object(config)
    assert type(restored) is type(tokenizer)
    tokenizer.save_assets(str(tmp_path))
    restored.load_assets(str(tmp_path))
    assert restored.get_config() == tokenizer.get_config()
    text = samples_for(kind)[0]
    np.testing.assert_array_equal(restored.encode(text), tokenizer.encode(text))


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_keras_hub_from_preset_reads_a_saved_tokenizer(kind, layers, tmp_path):
    tokenizer = layers[kind]
    folder = tmp_path / "preset"
    tokenizer.save(folder)
    # The minimal config.json a keras-hub preset needs to name its backbone.
    (folder / "config.json").write_text(json.dumps({
        "module": "keras_txl.backbone",
        "class_name": "TransformerXLBackbone",
        "config": {},
        "registered_name": "keras_txl>TransformerXLBackbone",
    }))
    loaded = keras_hub.tokenizers.Tokenizer.from_preset(str(folder))
    assert type(loaded) is type(tokenizer)
    for text in samples_for(kind):
        np.testing.assert_array_equal(
            loaded.tokenize(text).numpy(), tokenizer.encode(text)
        )


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_tokenizer_inside_a_saved_model(kind, layers, tmp_path):
    tokenizer = layers[kind]
    module = tf.Module()
    module.tokenizer = tokenizer
    module.serve = tf.function(
        lambda texts: tokenizer(texts).to_tensor(default_value=-1),
        input_signature=[tf.TensorSpec([None], tf.string)],
    )
    tf.saved_model.save(module, str(tmp_path / "saved"))
    del module
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    texts = samples_for(kind)
    padded = loaded.serve(tf.constant(texts)).numpy()
    for row, text in zip(padded, texts):
        np.testing.assert_array_equal(row[row >= 0], tokenizer.encode(text))


def write_old_layout(tokenizer, directory):
    """What keras-txl wrote before the keras-hub layout (format_version 1)."""
    directory.mkdir(parents=True)
    config = tokenizer.get_config()
    data = {
        "format_version": 1,
        "kind": tokenizer.kind,
        "vocabulary_size": tokenizer.vocabulary_size(),
        **{
            key: value for key, value in config.items()
            if key not in ("name", "trainable", "dtype", "config_file")
        },
    }
    if tokenizer.kind in ("char", "official_symbols"):
        data["vocabulary"] = tokenizer.get_vocabulary()
    elif tokenizer.kind == "sentencepiece":
        (directory / "sentencepiece.model").write_bytes(tokenizer.model_proto)
        data["model_file"] = "sentencepiece.model"
    elif tokenizer.kind != "byte":
        (directory / "vocab.txt").write_text(
            "\n".join(tokenizer.get_vocabulary()) + "\n"
        )
        data["vocabulary_file"] = "vocab.txt"
    (directory / "tokenizer.json").write_text(json.dumps(data))


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_the_old_layout_is_still_read(kind, layers, tmp_path):
    tokenizer = layers[kind]
    write_old_layout(tokenizer, tmp_path / "old")
    loaded = tokenizers.load_tokenizer(tmp_path / "old")
    assert type(loaded) is type(tokenizer)
    assert loaded.get_config() == {
        **tokenizer.get_config(), "name": loaded.name
    }
    text = samples_for(kind)[0]
    np.testing.assert_array_equal(loaded.encode(text), tokenizer.encode(text))


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_export_vocabulary_for_an_app(kind, layers, tmp_path):
    tokenizer = layers[kind]
    folder = tokenizers.export_vocabulary(tokenizer, tmp_path / "app")
    lines = (folder / "vocabulary.txt").read_text(encoding="utf-8")
    lines = lines.split("\n")[:-1]
    assert len(lines) == tokenizer.vocabulary_size()
    info = json.loads((folder / "tokenizer_info.json").read_text())
    assert info["kind"] == tokenizer.kind
    assert info["vocabulary_size"] == tokenizer.vocabulary_size()
    assert (info["eos_id"], info["unk_id"]) == (tokenizer.eos_id, tokenizer.unk_id)
    assert info["pad_id"] == tokenizer.pad_token_id
    if kind == "byte":
        assert info["newline"] == "byte" and lines[10] == "10"
    elif kind == "char":
        assert info["newline"] == "character"
        assert lines[tokenizer.token_to_id("\n")] == "\\n"
    elif kind == "official_symbols":
        assert info["newline"] == "dropped"
        assert lines == tokenizer.get_vocabulary()
    else:
        assert info["newline"] == "eos"
        assert lines[tokenizer.eos_id] == "<eos>"
    assert (folder / "vocabulary.spm").exists() == (kind == "sentencepiece")


def test_word_tokenize_matches_encode_for_lm1b_and_without_eos():
    lm1b = tokenizers.official_tokenizer(["<S>", "<UNK>", "a", "b"], "lm1b")
    plain = tokenizers.build_tokenizer("word", "a b\n", add_eos=False)
    for tokenizer in (lm1b, plain):
        for text in ("a b\n\nb", "", "a\n", "a zebra\n\n"):
            np.testing.assert_array_equal(
                tokenizer.tokenize(text).numpy(), tokenizer.encode(text)
            )
            assert tokenizer.detokenize(tokenizer.tokenize(text)).numpy(
            ).decode() == tokenizer.decode(tokenizer.encode(text))


@pytest.mark.parametrize(
    "inputs, message",
    [
        (123, "`inputs` must be a string tensor"),
        ([1, 2], "`inputs` must be a string tensor"),
        (tf.constant([[b"a"]]), "`inputs` must be a scalar string or a 1-D"),
    ],
)
def test_tokenize_errors_name_the_argument(inputs, message, fitted):
    with pytest.raises(ValueError, match=re.escape(message)):
        fitted["word"].tokenize(inputs)


def test_detokenize_errors_name_the_argument(fitted):
    with pytest.raises(ValueError, match="`inputs` must be integer token ids"):
        fitted["word"].detokenize(["a"])


def test_an_unknown_word_without_unk_fails_in_the_graph_too():
    tokenizer = tokenizers.official_tokenizer(["<eos>", "a"], "wt103")
    with pytest.raises(ValueError, match="'zebra' is not in the vocabulary"):
        tokenizer.encode("a zebra")
    with pytest.raises(tf.errors.InvalidArgumentError, match="not in the"):
        tokenizer.tokenize("a zebra")


def test_a_tokenizer_without_its_assets_says_so(fitted, tmp_path):
    empty = tokenizers.WordTokenizer()
    with pytest.raises(ValueError, match="has no vocabulary yet"):
        empty.encode("a")
    fitted["sentencepiece"].save(tmp_path / "sp")
    (tmp_path / "sp" / "assets" / "tokenizer" / "vocabulary.spm").unlink()
    with pytest.raises(
        ValueError, match=r"has no assets/tokenizer/vocabulary.spm"
    ):
        tokenizers.load_tokenizer(tmp_path / "sp")


def test_load_errors_for_foreign_classes_and_large_vocabularies(
    fitted, tmp_path
):
    fitted["word"].save(tmp_path / "word")
    size = fitted["word"].vocabulary_size()
    with pytest.raises(
        ValueError,
        match=rf"vocabulary_size={size}, which exceeds the limit "
        r"max_vocabulary_size=3",
    ):
        tokenizers.load_tokenizer(
            tmp_path / "word", limits={"max_vocabulary_size": 3}
        )
    path = tmp_path / "word" / "tokenizer.json"
    data = json.loads(path.read_text())
    data["registered_name"] = "keras_hub>BertTokenizer"
    path.write_text(json.dumps(data))
    with pytest.raises(
        ValueError, match="registered_name='keras_hub>BertTokenizer'"
    ):
        tokenizers.load_tokenizer(tmp_path / "word")
    data["registered_name"] = "keras_txl>WordTokenizer"
    data["config"]["bogus"] = 1
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="has invalid 'config'"):
        tokenizers.load_tokenizer(tmp_path / "word")


def test_a_kind_that_contradicts_the_class_is_an_error(fitted, tmp_path):
    fitted["word"].save(tmp_path / "word")
    path = tmp_path / "word" / "tokenizer.json"
    data = json.loads(path.read_text())
    data["config"]["kind"] = "char"
    path.write_text(json.dumps(data))
    with pytest.raises(
        ValueError,
        match=re.escape("`kind` of a WordTokenizer must be 'word'. "
                        "Received: kind='char'"),
    ):
        tokenizers.load_tokenizer(tmp_path / "word")


# === Unicode whitespace, lone surrogates, ids out of range ===

# Bytes that are not UTF-8: a lone continuation byte, a cut 3-byte
# character, a Latin-1 byte, an encoded surrogate (CESU-8), an overlong
# "/" and a value past U+10FFFF.
INVALID_UTF8 = [b"\x80", b"\xe6\x97", b"caf\xe9", b"\xed\xa0\x80", b"\xc0\xaf",
                b"\xe0\x80\xaf", b"\xf4\x90\x80\x80"]


def test_unicode_whitespace_is_what_str_isspace_says():
    spaces = [chr(c) for c in range(0x110000) if chr(c).isspace()]
    assert tokenizers.UNICODE_WHITESPACE == "".join(spaces)


def test_word_tokenizer_splits_at_every_unicode_whitespace():
    # The probe's case: U+00A0 was split inside its UTF-8 bytes.
    tokenizer = tokenizers.WordTokenizer(["<eos>", "<unk>", "the", "cat"])
    assert tokenizer.encode("the\u00a0cat").tolist() == [2, 3]
    assert tokenizer.decode(tokenizer.encode("the\u00a0cat")) == "the cat"
    fitted = tokenizers.WordTokenizer.fit("the\u00a0cat sat\n")
    assert fitted.vocabulary == ["<eos>", "<unk>", "the", "cat", "sat"]

    # Every whitespace character between words, twice (runs too); "\n"
    # still ends a line (one <eos>), every other character only separates.
    spaces = tokenizers.UNICODE_WHITESPACE
    text = "".join(f"w{i}{c}{c}" for i, c in enumerate(spaces)) + "end\n"
    tokenizer = tokenizers.WordTokenizer.fit(text)
    lines = text.split("\n")
    words = [word for line in lines for word in line.split()]
    assert tokenizer.vocabulary == ["<eos>", "<unk>", *words]
    ids = tokenizer.encode(text)
    assert int(np.sum(ids == tokenizer.eos_id)) == text.count("\n") == 3
    assert tokenizer.unk_id not in ids.tolist()
    assert tokenizer.decode(ids) == "\n".join(" ".join(line.split()) for line in lines)
    # The graph path gives the same ids: eager, tf.function, tf.data.
    np.testing.assert_array_equal(tokenizer.tokenize(text).numpy(), ids)
    np.testing.assert_array_equal(
        tf.function(tokenizer.tokenize)(tf.constant(text)).numpy(), ids
    )
    (mapped,) = tf.data.Dataset.from_tensors(text).map(tokenizer)
    np.testing.assert_array_equal(mapped.numpy(), ids)
    # The public counting step (for corpora counted in chunks) agrees.
    assert tokenizers.add_token_counts({}, "word", text) == dict.fromkeys(words, 1)


def test_word_tokenizer_reads_bytes_that_are_not_utf8_as_u_fffd():
    # Raw bytes in a string tensor, and the same bytes as surrogateescape
    # text: no word holds part of a UTF-8 sequence, and fit agrees.
    raw = b" ".join(INVALID_UTF8) + b"\n"
    text = raw.decode("utf-8", "surrogateescape")
    tokenizer = tokenizers.WordTokenizer.fit(text)
    for word in tokenizer.vocabulary:
        word.encode("utf-8")  # valid text
    assert set(tokenizer.vocabulary[2:]) == set(raw.decode("utf-8", "replace").split())
    ids = tokenizer.encode(text)
    assert tokenizer.unk_id not in ids.tolist()
    np.testing.assert_array_equal(tokenizer.tokenize(tf.constant(raw)).numpy(), ids)
    np.testing.assert_array_equal(tokenizer.tokenize(text).numpy(), ids)
    assert tokenizer.decode(ids) == raw.decode("utf-8", "replace")


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_a_lone_surrogate_is_an_error_naming_the_argument(kind, layers, monkeypatch):
    tokenizer = layers[kind]
    message = (
        "`{}` holds the lone surrogate '\\ud800' (U+D800) at position {}, "
        "which is not encodable as UTF-8"
    )
    for call in (tokenizer.encode, tokenizer.unknown_characters):
        with pytest.raises(ValueError, match=re.escape(message.format("text", 1))):
            call("a\ud800b")
    with pytest.raises(ValueError, match=re.escape(message.format("inputs", 1))):
        tokenizer.tokenize("a\ud800b")
    with pytest.raises(ValueError, match=re.escape(message.format("inputs[1]", 0))):
        tokenizer.tokenize(["a", "\ud800"])
    # The position is the one in the whole text, which encode cuts in pieces.
    monkeypatch.setattr(tokenizers, "_CHUNK_CHARS", 8)
    text = "a\n" * 20 + "\ud800"
    with pytest.raises(ValueError, match=re.escape(message.format("text", 40))):
        tokenizer.encode(text)


@pytest.mark.parametrize("kind", ["char", "word", "sentencepiece", "wordpiece"])
def test_fit_rejects_a_lone_surrogate_naming_the_text(kind):
    with pytest.raises(
        ValueError,
        match=re.escape("`texts[1]` holds the lone surrogate '\\udfff' (U+DFFF) "
                        "at position 1"),
    ):
        tokenizers.build_tokenizer(
            kind, ["the cat sat\n", "a\udfffb\n"], **SMALL_OPTIONS[kind]
        )


def test_surrogateescape_bytes_are_bytes_for_every_tokenizer(fitted):
    # U+DC80-U+DCFF stand for the bytes 0x80-0xFF (text decoded with
    # surrogateescape): encode, tokenize and unknown_characters agree.
    text = "caf\udce9 x\udce6\udc97\n"
    escapes = ["\udce9", "\udce6", "\udc97"]
    byte = fitted["byte"]
    assert byte.encode(text).tolist() == list(text.encode("utf-8", "surrogateescape"))
    assert byte.unknown_characters(text) == escapes
    assert byte.decode(byte.encode(text)) == "caf\ufffd x\ufffd\n"
    assert fitted["char"].unknown_characters(text) == [
        c for c in dict.fromkeys(text) if c not in fitted["char"].vocabulary
    ]
    assert set(escapes) <= set(fitted["char"].unknown_characters(text))
    for kind, tokenizer in fitted.items():
        np.testing.assert_array_equal(
            tokenizer.tokenize(text).numpy(), tokenizer.encode(text), err_msg=kind
        )
    # Fitted on such text, the char and word vocabularies hold U+FFFD
    # (never a surrogate), and encode uses it.
    char = tokenizers.build_tokenizer("char", text)
    assert "\ufffd" in char.vocabulary and char.unk_id not in char.encode(text)
    word = tokenizers.build_tokenizer("word", text)
    assert "caf\ufffd" in word.vocabulary and word.unk_id not in word.encode(text)
    with pytest.raises(ValueError, match="no lone surrogates"):
        tokenizers.CharTokenizer(["<unk>", "\udce9"])


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_detokenize_rejects_ids_out_of_range(kind, layers):
    tokenizer = layers[kind]
    size = tokenizer.vocabulary_size()
    expected = f"`inputs` must be token ids in [0, vocabulary_size={size})"
    for ids, low, high in (([1, size], 1, size), ([-1, 0], -1, 0),
                           ([[0], [size + 5, 1]], 0, size + 5)):
        with pytest.raises(
            ValueError,
            match=re.escape(f"{expected}. Received values in [{low}, {high}]"),
        ):
            tokenizer.detokenize(ids)
    # int64 ids are checked before the cast to int32 (2**32 + 1 is not 1).
    with pytest.raises(ValueError, match=re.escape(expected)):
        tokenizer.detokenize(np.array([2**32 + 1], np.int64))
    # In a graph the ids are not known: an assertion with the same words.
    # (An eager call first: the autouse seed fixture deleted the
    # SentencePiece op's resource, which only an eager call rebuilds.)
    assert tokenizer.detokenize([0, size - 1]).shape == ()
    graph = tf.function(
        tokenizer.detokenize, input_signature=[tf.TensorSpec([None], tf.int32)]
    )
    assert graph(tf.constant([0])).shape == ()
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(expected)):
        graph(tf.constant([0, size]))


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_detokenize_of_no_ids_is_empty_text(kind, layers):
    tokenizer = layers[kind]
    assert tokenizer.detokenize([]).numpy() == b""
    assert tokenizer.detokenize(()).numpy() == b""
    assert tokenizer.detokenize([[], []]).numpy().tolist() == [b"", b""]
    assert tokenizer.decode([]) == ""
    # A float tensor is still not ids, even an empty one.
    with pytest.raises(ValueError, match="must be integer token ids"):
        tokenizer.detokenize(tf.zeros([0], tf.float32))


@pytest.mark.parametrize("kind", ["char", "word"])
def test_a_min_freq_that_keeps_no_token_is_refused_by_fit(kind):
    # A vocabulary of the special tokens alone read everything as unknown (and
    # the char tokenizer's empty lookup table failed inside TensorFlow).
    with pytest.raises(ValueError, match=r"`min_freq` \(--min-freq\) 100 keeps no token: "
                       r"the most frequent one, .* occurs 2 times.*Pass min_freq=2 or less"):
        tokenizers.build_tokenizer(kind, ["abc abc\n"], min_freq=100)


def test_the_fingerprint_is_the_same_across_folder_layouts_and_names_its_argument(tmp_path):
    # What `txl eval` compares: a workdir tokenizer and the model folder's
    # keras-hub copy hold other files but the same ids.
    import keras_txl
    from keras_txl.io import save_preset
    from keras_txl.tokenizers import WordTokenizer
    from keras_txl.tokenizers import load_tokenizer
    from keras_txl.tokenizers import tokenizer_fingerprint

    tokenizer = WordTokenizer(["<eos>", "<unk>", "a", "b"])
    tokenizer.save(tmp_path / "tokenizer")
    model = keras_txl.TransformerXLCausalLM(keras_txl.TransformerXLConfig(
        vocabulary_size=4, num_layers=1, hidden_dim=8, num_heads=2, intermediate_dim=8))
    save_preset(model, str(tmp_path / "model"), tokenizer=str(tmp_path / "tokenizer"))
    same = tokenizer_fingerprint(load_tokenizer(tmp_path / "tokenizer"))
    assert tokenizer_fingerprint(load_tokenizer(tmp_path / "model")) == same
    assert tokenizer_fingerprint(WordTokenizer(["<eos>", "<unk>", "b", "a"])) != same
    with pytest.raises(ValueError, match="`tokenizer` must be a keras-txl"):
        tokenizer_fingerprint("not a tokenizer")


def test_sentencepiece_gives_the_same_model_whatever_the_cpu_count(monkeypatch):
    # SentencePiece's model depends on its num_threads (each thread sums
    # its share of the lines): a default of os.cpu_count() made the same
    # corpus give other pieces, ids and fingerprint on another machine.
    import random

    rng = random.Random(0)
    words = [f"w{i}" for i in range(300)] + ["é", "👍", "a\u0301"]
    text = "\n".join(
        " ".join(rng.choice(words) for _ in range(12)) for _ in range(400)
    )
    models = []
    for cpus in (1, 8):
        monkeypatch.setattr("os.cpu_count", lambda cpus=cpus: cpus)
        models.append(tokenizers.build_tokenizer(
            "sentencepiece", text, vocabulary_size=200).model_proto)
    assert models[0] == models[1]
    with pytest.raises(ValueError, match="`num_threads` must be a positive integer"):
        tokenizers.build_tokenizer("sentencepiece", text, num_threads=0)


def test_special_tokens_typed_in_the_text(fitted):
    # docs/data.md: only the word kind reads "<eos>"/"<unk>" from text (as
    # the reference vocabulary.py); a literal <eos> is then a line break.
    text = "the <eos> <unk> dog"
    word = fitted["word"]
    ids = word.encode(text).tolist()
    assert ids[1:3] == [word.eos_id, word.unk_id]
    assert word.decode(ids) == "the\n<unk> dog"
    for kind in ("sentencepiece", "wordpiece"):
        tokenizer = fitted[kind]
        assert tokenizer.eos_id not in tokenizer.encode(text).tolist()
