"""Corpora of any size: streamed sources, streaming vocabularies, token
shards (written once, resumable after SIGKILL, keyed by source and
tokenizer) and the ordered batches read from them."""

import json
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from testing import REPO
from testing import free_ports
from testing import write_lm1b_release

from keras_txl.cli import main
from keras_txl.tokenizers import build_tokenizer
from keras_txl.training import corpora
from keras_txl.training import shards
from keras_txl.training.corpora import load_corpus
from keras_txl.training.corpora import open_corpus_source
from keras_txl.training.data import distributed_lm_dataset
from keras_txl.training.data import lm_dataset
from keras_txl.training.vocab import build_streaming_tokenizer

WORDS = ["the", "cat", "Sat", "on", "a", "mat", "naïve", "日本", "é", "x"]


def write_corpus(folder, seed=0, lines=(400, 40, 40), newline="\n"):
    rng = np.random.default_rng(seed)
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in zip(("train", "valid", "test"), lines):
        text = newline.join(" ".join(rng.choice(WORDS, size=rng.integers(1, 14)))
                            for _ in range(n)) + newline
        (folder / f"{split}.txt").write_bytes(text.encode())
    return str(folder)


def env():
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO),
            "CUDA_VISIBLE_DEVICES": ""}


# --- streamed sources ------------------------------------------------------
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_chunks_concatenate_to_the_loaded_text(tmp_path, newline):
    folder = write_corpus(tmp_path / "c", newline=newline)
    corpus = load_corpus(folder)
    source = open_corpus_source(folder, chunk_bytes=100)
    for split in ("train", "valid", "test"):
        # load_corpus joins the reader's chunks: check it against Python's own
        # reading of the file (UTF-8, universal newlines).
        assert corpus.split(split) == pathlib.Path(folder, f"{split}.txt").read_text(
            encoding="utf-8")
        pieces = list(source.chunks(split))
        assert len(pieces) > 1 or split != "train"
        assert "".join(text for text, _ in pieces) == corpus.split(split)
        assert all(text.endswith("\n") for text, _ in pieces)
        # Resuming from any cursor gives the rest.
        middle = len(pieces) // 2
        rest = list(source.chunks(split, pieces[middle][1]))
        assert rest == pieces[middle + 1:]


def test_raw_file_chunks_keep_every_byte_and_long_lines_are_cut(tmp_path, monkeypatch):
    # One long line of multi-byte characters: cut at a character boundary.
    path = tmp_path / "raw.txt"
    path.write_bytes(("日本é" * 3000).encode() + b"\r\nend\r\n" + b"x y\n" * 40)
    monkeypatch.setattr(corpora, "_MAX_LINE_BYTES", 64)
    source = open_corpus_source(str(path), chunk_bytes=50)
    corpus = load_corpus(str(path))
    data = path.read_bytes()
    train_size, valid_size, _ = corpora.standard_split_sizes(len(data))
    cuts = (0, train_size, train_size + valid_size, len(data))
    for i, split in enumerate(("train", "valid", "test")):
        # The standard byte cuts, every byte kept (no newline translation).
        assert corpus.split(split) == data[cuts[i]:cuts[i + 1]].decode(
            "utf-8", "surrogateescape")
        pieces = [text for text, _ in source.chunks(split)]
        assert "".join(pieces) == corpus.split(split)
    assert max(len(t.encode("utf-8", "surrogateescape")) for t, _ in source.chunks("train")) <= 114
    char = build_tokenizer("char", corpus.train)
    np.testing.assert_array_equal(
        np.concatenate([char.encode(t) for t, _ in source.chunks("train")]),
        char.encode(corpus.train))


# --- streaming vocabularies -----------------------------------------------
@pytest.mark.parametrize("kind,options", [
    ("word", {}),
    ("word", {"max_size": 7, "min_freq": 2}),
    ("word", {"lower_case": True, "add_eos": False}),
    ("char", {}),
    ("char", {"max_size": 5}),
    ("byte", {}),
])
def test_streaming_vocabulary_equals_build_tokenizer(tmp_path, kind, options):
    folder = write_corpus(tmp_path / "c")
    text = load_corpus(folder).train
    source = open_corpus_source(folder, chunk_bytes=64)  # many chunks
    streamed = build_streaming_tokenizer(
        kind, (t for t, _ in source.chunks("train")), **options)
    reference = build_tokenizer(kind, text, **options)
    def options(tokenizer):  # the layer's name is Keras' per-process counter
        return {k: v for k, v in tokenizer.get_config().items() if k != "name"}

    assert options(streamed) == options(reference)
    if kind != "byte":
        assert streamed.vocabulary == reference.vocabulary
    np.testing.assert_array_equal(streamed.encode(text), reference.encode(text))


def test_streaming_vocabulary_errors_name_the_option(tmp_path):
    chunks = ["a b\n"]
    with pytest.raises(ValueError, match=r"max_size.*--vocab-size.*> 2"):
        build_streaming_tokenizer("word", iter(chunks), max_size=2)
    with pytest.raises(ValueError, match=r"min_freq.*--min-freq"):
        build_streaming_tokenizer("char", iter(chunks), min_freq=0)


# --- shards and the ordered batches ---------------------------------------
def batches(dataset):
    return [(x.numpy(), y.numpy()) for x, y in dataset]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for (x1, y1), (x2, y2) in zip(a, b):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)


def make_shards(tmp_path, tokens, shard_tokens, dtype="<i4"):
    pieces = np.array_split(tokens, 7)  # chunks of the "source"

    def chunks(cursor):
        start = cursor[1] if cursor else 0
        for i in range(start, len(pieces)):
            yield pieces[i], [0, i + 1]

    return shards.write_split(str(tmp_path / "s"), chunks, lambda ids: ids, key="k",
                              dtype=dtype, shard_tokens=shard_tokens)


def test_shards_give_the_batches_of_the_in_memory_array(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 60000, size=5000).astype(np.int32)
    sharded = make_shards(tmp_path, tokens, shard_tokens=300, dtype="<u2")
    assert len(sharded.index["shards"]) > 5  # windows cross shard ends
    np.testing.assert_array_equal(np.asarray(sharded), tokens)
    for kwargs in ({}, {"drop_remainder": False}, {"start_segment": 7},
                   {"num_replicas": 2}):
        assert_same_batches(batches(lm_dataset(sharded, 4, 23, **kwargs)),
                            batches(lm_dataset(tokens, 4, 23, **kwargs)))
    repeat = lm_dataset(sharded, 4, 23, repeat=True, start_segment=100).take(60)
    assert_same_batches(batches(repeat), batches(
        lm_dataset(tokens, 4, 23, repeat=True, start_segment=100).take(60)))
    # Per input pipeline (one per worker): disjoint rows, as from the array.
    for pipeline in range(2):
        context = tf.distribute.InputContext(
            num_input_pipelines=2, input_pipeline_id=pipeline, num_replicas_in_sync=4)
        got = batches(lm_dataset(sharded, 8, 16, input_context=context))
        want = batches(lm_dataset(tokens, 8, 16, input_context=context))
        assert_same_batches(got, want)
    distributed = distributed_lm_dataset(tf.distribute.get_strategy(), sharded, 4, 23)
    assert_same_batches(batches(distributed), batches(lm_dataset(tokens, 4, 23)))


def test_a_damaged_or_unfinished_split_is_refused(tmp_path):
    tokens = np.arange(1000, dtype=np.int32)
    sharded = make_shards(tmp_path, tokens, shard_tokens=300)
    with open(sharded._paths[1], "ab") as f:
        f.write(b"\0\0\0\0")
    with pytest.raises(ValueError, match="damaged"):
        shards.ShardedTokens(sharded.folder)
    os.remove(os.path.join(sharded.folder, "index.json"))
    with pytest.raises(ValueError, match="no finished shards.*txl prepare"):
        shards.ShardedTokens(sharded.folder)


@pytest.mark.parametrize("edit,why", [
    (lambda index: index.pop("shards"), '"shards" is NoneType, expected a list'),
    (lambda index: index.update(shards=5), '"shards" is int, expected a list'),
    (lambda index: index.update(dtype="zz"), '"dtype" is \'zz\', expected "<u2" or "<i4"'),
    (lambda index: index.pop("dtype"), '"dtype" is None'),
    (lambda index: index["shards"][1].update(tokens="300"), "shard 1 is {"),
    (lambda index: index["shards"][0].pop("file"), "shard 0 is {"),
    (lambda index: index["shards"][2].update(tokens=-1), "shard 2 is {"),
])
def test_an_index_edited_into_another_shape_is_named(tmp_path, edit, why):
    # A hand-edited index.json failed with a bare KeyError or TypeError
    # ('shards', "'int' object is not iterable", "data type 'zz' not understood").
    sharded = make_shards(tmp_path, np.arange(1000, dtype=np.int32), shard_tokens=300)
    path = os.path.join(sharded.folder, "index.json")
    with open(path) as f:
        index = json.load(f)
    edit(index)
    with open(path, "w") as f:
        json.dump(index, f)
    with pytest.raises(ValueError) as raised:
        shards.ShardedTokens(sharded.folder)
    assert str(raised.value).startswith(f"{path} is not an index of shards: {why}")
    assert str(raised.value).endswith(f"Delete {sharded.folder} and prepare again.")


# --- kill and resume ------------------------------------------------------
KILLER = """
import os, signal, sys
from keras_txl.training import corpora, shards, vocab
opened = corpora.open_corpus_source
# Small chunks: kills land inside shards and inside the vocabulary count.
corpora.open_corpus_source = lambda *a, **k: opened(*a, **{**k, "chunk_bytes": 2048})
point, n = sys.argv[1], int(sys.argv[2])
calls = [0]
def kill():
    calls[0] += 1
    if calls[0] >= n:
        os.kill(os.getpid(), signal.SIGKILL)
if point == "vocab":
    count = vocab.count_tokens
    def counting(kind, chunks, **kw):
        def gen():
            for c in chunks:
                kill()
                yield c
        return count(kind, gen(), **kw)
    vocab.count_tokens = counting
else:
    write = shards.write_split
    def writing(folder, chunks, encode, **kw):
        if point == "after-shard":
            kw["after_shard"] = lambda i: kill()
            return write(folder, chunks, encode, **kw)
        def encoding(text):  # mid-shard: the .tmp file is half written
            kill()
            return encode(text)
        return write(folder, chunks, encoding, **kw)
    shards.write_split = writing
from keras_txl.cli import main
sys.exit(main(sys.argv[3:]))
"""


def shard_files(workdir):
    data = pathlib.Path(workdir) / "data"
    return {str(p.relative_to(data)): p.read_bytes()
            for p in sorted(data.rglob("*")) if p.is_file() and p.name != "source.json"}


@pytest.mark.parametrize("command,point,n", [
    ("prepare", "after-shard", 2),
    ("prepare", "mid-shard", 5),
    ("prepare", "vocab", 3),
    ("train", "mid-shard", 9),
])
def test_sigkill_during_preparation_then_again_gives_the_same_shards(
        tmp_path, command, point, n):
    folder = write_corpus(tmp_path / "c", lines=(3000, 100, 100))
    flags = ["--data", folder, "--tokenizer", "word", "--shard-tokens", "2000"]
    assert main(["prepare", "--workdir", str(tmp_path / "straight"), *flags]) == 0
    straight = shard_files(tmp_path / "straight")
    assert len([k for k in straight if k.startswith("train/shard-")]) > 3
    workdir = str(tmp_path / "killed")
    argv = [command, "--workdir", workdir, *flags]
    if command == "train":
        argv += ["--preset", "tiny", "--steps", "1", "--batch-size", "2",
                 "--segment-length", "8", "--memory-length", "8"]
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    killed = subprocess.run([sys.executable, str(script), point, str(n), *argv],
                            env=env(), capture_output=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    assert shard_files(workdir) != straight
    again = subprocess.run([sys.executable, "-m", "keras_txl", *argv], env=env(),
                           capture_output=True, timeout=300)
    assert again.returncode == 0, again.stderr.decode()[-2000:]
    assert shard_files(workdir) == straight


# --- stale data -----------------------------------------------------------
def test_another_data_in_the_same_workdir_is_refused(tmp_path, capsys):
    first = write_corpus(tmp_path / "a", seed=0)
    other = write_corpus(tmp_path / "b", seed=1)
    workdir = str(tmp_path / "w")
    assert main(["prepare", "--data", first, "--workdir", workdir]) == 0
    before = shard_files(workdir)
    capsys.readouterr()
    for argv in (["prepare", "--data", other, "--workdir", workdir],
                 ["train", "--data", other, "--workdir", workdir, "--preset", "tiny",
                  "--steps", "1"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "was prepared from" in err and "has different content" in err
        assert "new --workdir" in err
    # The same path edited in place: size or mtime changed, content compared.
    path = pathlib.Path(first) / "valid.txt"
    path.write_text(path.read_text() + "one more line\n")
    assert main(["prepare", "--data", first, "--workdir", workdir]) == 2
    assert "has different content" in capsys.readouterr().err
    path.write_text(path.read_text()[: -len("one more line\n")])
    # Restored content (new mtime): reused, nothing rewritten.
    assert main(["prepare", "--data", first, "--workdir", workdir]) == 0
    assert shard_files(workdir) == before
    # Other tokenizer options than the workdir's tokenizer was built with.
    assert main(["prepare", "--data", first, "--workdir", workdir,
                 "--vocab-size", "5"]) == 2
    assert "--workdir" in capsys.readouterr().err
    assert main(["prepare", "--data", first, "--workdir", workdir,
                 "--tokenizer", "char"]) == 2
    assert "does not match" in capsys.readouterr().err


def test_vocabulary_flags_reach_the_tokenizer(tmp_path, capsys):
    folder = write_corpus(tmp_path / "c")
    workdir = tmp_path / "w"
    assert main(["prepare", "--data", folder, "--workdir", str(workdir),
                 "--vocab-size", "6", "--lower-case"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["vocabulary_size"] == 6
    config = json.loads((workdir / "tokenizer" / "tokenizer.json").read_text())
    assert config["config"]["lower_case"] is True
    assert main(["prepare", "--data", folder, "--workdir", str(tmp_path / "b"),
                 "--tokenizer", "byte", "--vocab-size", "6"]) == 2
    assert "fixed vocabulary" in capsys.readouterr().err
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("<S>\n<UNK>\nthe 10\ncat\n")
    assert main(["prepare", "--data", folder, "--workdir", str(tmp_path / "v"),
                 "--vocabulary-file", str(vocab)]) == 0
    config = json.loads((tmp_path / "v" / "tokenizer" / "tokenizer.json").read_text())
    assert config["config"]["eos_token"] == "<S>" and config["config"]["unk_token"] == "<UNK>"


# --- a PG-19-format TFDS dataset -------------------------------------------
def build_books(data_dir, count=6):
    import tensorflow_datasets as tfds

    rng = np.random.default_rng(3)
    books = {}
    for split, n in (("train", count), ("validation", 2), ("test", 2)):
        books[split] = [
            "\n".join(" ".join(rng.choice(WORDS, size=10)) for _ in range(60 + 7 * i))
            for i in range(n)]
    features = tfds.features.FeaturesDict({
        "book_title": tfds.features.Text(), "book_id": tf.int32,
        "publication_date": tfds.features.Text(), "url": tfds.features.Text(),
        "book_text": tfds.features.Text()})
    split_datasets = {
        split: tf.data.Dataset.from_tensor_slices({
            "book_title": [f"Book {i}" for i in range(len(texts))],
            "book_id": list(range(len(texts))),
            "publication_date": ["1900"] * len(texts),
            "url": ["http://example.invalid"] * len(texts),
            "book_text": texts})
        for split, texts in books.items()}
    tfds.dataset_builders.store_as_tfds_dataset(
        name="pg19_sample", version="1.0.0", features=features,
        split_datasets=split_datasets, data_dir=str(data_dir), disable_shuffling=True)
    return books


def test_a_pg19_format_tfds_dataset_trains_and_evaluates_book_by_book(tmp_path, capsys):
    data_dir = tmp_path / "tfds"
    books = build_books(data_dir)
    workdir = tmp_path / "w"
    flags = ["--data", "tfds:pg19_sample", "--data-dir", str(data_dir)]
    assert main(["train", *flags, "--workdir", str(workdir), "--preset", "tiny",
                 "--tokenizer", "word", "--steps", "2", "--batch-size", "2",
                 "--segment-length", "16", "--memory-length", "16",
                 "--shard-tokens", "1024"]) == 0
    from keras_txl.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(workdir / "tokenizer")
    train = shards.ShardedTokens(workdir / "data" / "train")
    # Book after book, in stored order, each ending with a newline.
    expected = np.concatenate([tokenizer.encode(book + "\n") for book in books["train"]])
    np.testing.assert_array_equal(np.asarray(train), expected)
    assert len(train.index["shards"]) > 1
    capsys.readouterr()
    assert main(["eval", "--workdir", str(workdir), *flags, "--split", "test",
                 "--batch-size", "2"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    test_tokens = sum(tokenizer.encode(b + "\n").size for b in books["test"])
    assert result["tokens"] == (test_tokens // 2 - 1) * 2
    assert np.isfinite(result["loss"])


def test_a_checkpoint_of_another_train_split_is_refused(tmp_path, capsys):
    workdir = str(tmp_path / "w")
    small = ["--preset", "tiny", "--tokenizer", "char", "--batch-size", "2",
             "--segment-length", "8", "--memory-length", "8", "--set", "checkpoint_every=1"]
    assert main(["train", "--data", write_corpus(tmp_path / "a", lines=(300, 40, 40)),
                 "--workdir", workdir, "--steps", "1", *small]) == 0
    state = json.loads(next((pathlib.Path(workdir) / "checkpoints").glob("ckpt-*"))
                       .joinpath("state.json").read_text())
    assert state["data"]["segment"] == 1 and state["data"]["streams"] == 2
    # Data and tokenizer removed by hand, another corpus: the checkpoint's
    # position belongs to the old text.
    import shutil

    shutil.rmtree(os.path.join(workdir, "data"))
    capsys.readouterr()
    assert main(["train", "--data", write_corpus(tmp_path / "b", seed=1, lines=(500, 40, 40)),
                 "--workdir", workdir, "--steps", "2", *small]) == 2
    assert "was written while reading a train split" in capsys.readouterr().err


def test_the_tokens_key_depends_on_the_tokens_not_on_the_shards(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 1000, size=5000).astype(np.int32)
    keys = {(size, dtype): make_shards(tmp_path / f"{size}{dtype}", tokens, size, dtype).key
            for size in (300, 700, 5000) for dtype in ("<u2", "<i4")}
    assert len(set(keys.values())) == 1
    import hashlib

    stream = hashlib.sha256(tokens.astype("<i4").tobytes()).hexdigest()
    index = json.loads((tmp_path / "300<u2" / "s" / "index.json").read_text())
    assert index["tokens_sha256"] == stream
    assert keys[300, "<u2"] == f"tokens-sha256:{stream}"
    changed = tokens.copy()
    changed[4321] += 1
    assert make_shards(tmp_path / "other", changed, 300).key != keys[300, "<u2"]


def test_re_sharding_a_trained_workdir_keeps_the_resume_exact(tmp_path, capsys):
    folder = write_corpus(tmp_path / "c", lines=(600, 40, 40))
    # A constant learning rate: 2 steps then 3 follow the 3-step run exactly.
    common = ["--preset", "tiny", "--tokenizer", "char", "--batch-size", "2",
              "--segment-length", "8", "--memory-length", "8", "--set", "dropout=0.0",
              "--set", "checkpoint_every=1", "--set", "log_every=1",
              "--set", "warmup_steps=0", "--set", "min_lr_ratio=1.0"]
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    assert main(["train", "--data", folder, "--workdir", straight, "--steps", "3",
                 *common]) == 0
    assert main(["train", "--data", folder, "--workdir", resumed, "--steps", "2",
                 *common]) == 0
    train = pathlib.Path(resumed) / "data" / "train"
    assert len(shards.ShardedTokens(train).index["shards"]) == 1
    before = np.asarray(shards.ShardedTokens(train))
    # The same tokens cut into other shards: the checkpoint's position holds.
    assert main(["prepare", "--data", folder, "--workdir", resumed,
                 "--shard-tokens", "1024"]) == 0
    assert len(shards.ShardedTokens(train).index["shards"]) > 5
    np.testing.assert_array_equal(np.asarray(shards.ShardedTokens(train)), before)
    capsys.readouterr()
    assert main(["train", "--workdir", resumed, "--steps", "3", *common]) == 0, \
        capsys.readouterr().err[-2000:]
    reference, losses = train_losses(straight), train_losses(resumed)
    assert sorted(losses) == [1, 2, 3]
    for step in (1, 2, 3):
        assert losses[step] == pytest.approx(reference[step], rel=1e-6), step


def test_shard_tokens_without_data_on_a_prepared_workdir_is_refused(tmp_path, capsys):
    # Without --data the prepared shards were used as they were, and the
    # --shard-tokens given was dropped in silence.
    folder = write_corpus(tmp_path / "c")
    workdir = str(tmp_path / "w")
    assert main(["prepare", "--data", folder, "--workdir", workdir,
                 "--shard-tokens", "1024"]) == 0
    capsys.readouterr()
    train = pathlib.Path(workdir) / "data" / "train"
    before = shards.ShardedTokens(train).index["shards"]
    assert main(["train", "--workdir", workdir, "--preset", "tiny", "--steps", "1",
                 "--shard-tokens", "2048"]) == 2
    err = capsys.readouterr().err
    assert (f"txl train: error: --shard-tokens 2048: {workdir}/data's shards hold 1024 "
            f"tokens each, and cutting them again encodes the corpus: pass --data "
            f"{os.path.abspath(folder)} (the corpus they were prepared from) with it, or "
            "leave --shard-tokens out.") in err, err
    assert shards.ShardedTokens(train).index["shards"] == before
    assert not (pathlib.Path(workdir) / "checkpoints").exists()
    # The recorded value, or none, reads the shards as they are.
    from keras_txl.training.run import prepare_data

    for value in (None, 1024):
        _, splits = prepare_data(None, workdir, shard_tokens=value)
        assert splits["train"].index["shards"] == before


def test_the_same_corpus_read_with_another_char_symbols_names_the_flag(tmp_path, capsys):
    # It said "--data ... has different content" of the very same files.
    folder = write_corpus(tmp_path / "c")
    workdir = str(tmp_path / "w")
    assert main(["prepare", "--data", folder, "--workdir", workdir]) == 0
    capsys.readouterr()
    assert main(["prepare", "--data", folder, "--workdir", workdir,
                 "--char-symbols", "yes"]) == 2
    err = capsys.readouterr().err
    assert (f"read with --char-symbols no; this run reads --data "
            f"{os.path.abspath(folder)!r} with --char-symbols yes. Its tokenizer and "
            "prepared shards belong to that reading") in err, err
    assert "pass --char-symbols no (or leave the flag out if it was the default)" in err
    assert "different content" not in err
    # Other bytes as well: other content, said as before.
    with open(os.path.join(folder, "valid.txt"), "a") as f:
        f.write("one more line\n")
    assert main(["prepare", "--data", folder, "--workdir", workdir,
                 "--char-symbols", "yes"]) == 2
    assert "has different content" in capsys.readouterr().err


def test_tokenizer_flags_other_than_the_workdirs_are_said_in_flags(tmp_path, capsys):
    folder = write_corpus(tmp_path / "c")
    workdir = str(tmp_path / "w")
    assert main(["prepare", "--data", folder, "--workdir", workdir,
                 "--vocab-size", "6", "--min-freq", "2"]) == 0
    capsys.readouterr()
    assert main(["prepare", "--data", folder, "--workdir", workdir,
                 "--vocab-size", "10"]) == 2
    err = capsys.readouterr().err
    assert ("tokenizer was built with --tokenizer word --vocab-size 6 --min-freq 2; "
            "this run asks for --vocab-size 10.") in err
    assert "None" not in err and "max_size" not in err
    other = str(tmp_path / "plain")
    assert main(["prepare", "--data", folder, "--workdir", other]) == 0
    capsys.readouterr()
    assert main(["prepare", "--data", folder, "--workdir", other, "--tokenizer", "word",
                 "--lower-case"]) == 2
    err = capsys.readouterr().err
    assert "built with --tokenizer word and no vocabulary flag" in err
    assert "this run asks for --tokenizer word --lower-case." in err


@pytest.mark.parametrize("kind,what", [("word", "word"), ("char", "character")])
def test_a_min_freq_that_keeps_only_the_special_tokens_is_refused(
        tmp_path, capsys, kind, what):
    folder = write_corpus(tmp_path / "c")
    text = (pathlib.Path(folder) / "train.txt").read_text()
    import collections

    counts = collections.Counter(text.split() if kind == "word" else text)
    top = max(counts.values())
    workdir = str(tmp_path / "w")
    assert main(["prepare", "--data", folder, "--workdir", workdir, "--tokenizer", kind,
                 "--min-freq", str(top + 1)]) == 2
    err = capsys.readouterr().err
    assert f"txl prepare: error: --min-freq {top + 1} keeps no {what}" in err
    assert f"occurs {top} times ({len(counts)} distinct {what}s" in err
    assert f"Pass --min-freq {top} or less." in err
    assert not os.path.exists(os.path.join(workdir, "tokenizer"))
    # The count it names works, in the same workdir.
    assert main(["prepare", "--data", folder, "--workdir", workdir, "--tokenizer", kind,
                 "--min-freq", str(top)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["vocabulary_size"] > (2 if kind == "word" else 1)


def test_a_changed_shard_byte_is_detected(tmp_path, capsys):
    folder = write_corpus(tmp_path / "c")
    workdir = tmp_path / "w"
    assert main(["prepare", "--data", folder, "--workdir", str(workdir)]) == 0
    shard = workdir / "data" / "valid" / "shard-00000.bin"
    data = bytearray(shard.read_bytes())
    data[3] ^= 1
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    for argv in (["prepare", "--data", folder, "--workdir", str(workdir)],
                 ["train", "--workdir", str(workdir), "--preset", "tiny", "--steps", "1"]):
        assert main(argv) == 2
        assert "does not match its sha256" in capsys.readouterr().err


def test_the_lm1b_folder_follows_the_reference_protocol(tmp_path, capsys):
    root = write_lm1b_release(tmp_path / "1-billion-word-language-modeling-benchmark-r13output",
                              train=("a b .\nc a .\n", "b c .\n"),
                              heldout=("a z .\n", "c c c c .\n"))
    (root / "1b_word_vocab.txt").write_text("<S>\t0\n<UNK>\t0\n.\t9\na\t5\nb\t4\nc\t3\n")
    workdir = tmp_path / "w"
    assert main(["prepare", "--data", str(root), "--workdir", str(workdir)]) == 0
    from keras_txl.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(workdir / "tokenizer")
    assert tokenizer.vocabulary == ["<S>", "<UNK>", ".", "a", "b", "c"]
    data = {s: np.asarray(shards.ShardedTokens(workdir / "data" / s)).tolist()
            for s in ("train", "valid", "test")}
    # Files in sorted order, every sentence <S> words <S>; held-out shard 0.
    assert data["train"] == [0, 3, 4, 2, 0, 0, 5, 3, 2, 0, 0, 4, 5, 2, 0]
    assert data["valid"] == data["test"] == [0, 3, 1, 2, 0]
    # load_corpus reads the same layout through the same reader: train files in
    # sorted order, held-out shard 0 for valid and test, the reference's options.
    corpus = load_corpus(root)
    assert corpus.layout == "lm1b"
    assert corpus.train == "a b .\nc a .\nb c .\n"
    assert corpus.valid == corpus.test == "a z .\n"
    assert corpus.tokenizer_options == {"double_eos": True,
                                        "vocabulary_file": str(root / "1b_word_vocab.txt")}


def train_losses(workdir):
    out = {}
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            if record["split"] == "train":
                out[record["step"]] = record["loss"]
    return out


def test_two_workers_read_disjoint_streams_of_the_prepared_shards(tmp_path):
    folder = write_corpus(tmp_path / "c", lines=(600, 40, 40))
    command = [sys.executable, "-m", "keras_txl", "train", "--preset", "tiny",
               "--batch-size", "4", "--segment-length", "16", "--memory-length", "16",
               "--steps", "3", "--set", "dropout=0.0", "--set", "checkpoint_every=0",
               "--set", "warmup_steps=1", "--set", "log_every=1"]
    workdirs = {name: tmp_path / name for name in ("single", "multi")}
    for workdir in workdirs.values():  # prepared once, small shards
        assert main(["prepare", "--data", folder, "--workdir", str(workdir),
                     "--tokenizer", "char", "--shard-tokens", "1024"]) == 0
    before = shard_files(workdirs["multi"])
    subprocess.run([*command, "--workdir", str(workdirs["single"])], env=env(),
                   check=True, capture_output=True, timeout=300)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]}
    processes = [subprocess.Popen(
        [*command, "--workdir", str(workdirs["multi"]), "--strategy", "multi_worker"],
        env={**env(), "TF_CONFIG": json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}})},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE) for index in range(2)]
    outputs = [p.communicate(timeout=300) for p in processes]
    for p, (_, err) in zip(processes, outputs):
        assert p.returncode == 0, err.decode()[-3000:]
    # Both workers used the workdir's shards (no --data, nothing re-prepared).
    assert shard_files(workdirs["multi"]) == before
    single, multi = train_losses(workdirs["single"]), train_losses(workdirs["multi"])
    assert sorted(multi) == [1, 2, 3]
    np.testing.assert_allclose([multi[s] for s in (1, 2, 3)],
                               [single[s] for s in (1, 2, 3)], rtol=1e-5)


def test_fit_and_evaluate_read_the_same_data_from_shards_as_from_an_array(tmp_path):
    from testing import mirrored_strategy
    from testing import tiny_config

    from keras_txl.training.config import TrainConfig
    from keras_txl.training.fit import train_with_fit
    from keras_txl.training.loop import evaluate

    tokens = np.random.default_rng(0).integers(0, 40, 3000).astype(np.int32)
    valid = np.random.default_rng(1).integers(0, 40, 700).astype(np.int32)
    sharded = make_shards(tmp_path, tokens, shard_tokens=500)
    valid_sharded = make_shards(tmp_path / "v", valid, shard_tokens=200)
    config = tiny_config(vocabulary_size=40, hidden_dim=16, intermediate_dim=32,
                         segment_length=8, memory_length=8, dropout=0.0)
    train = TrainConfig(batch_size=4, steps=5, learning_rate=3e-3, warmup_steps=1,
                        log_every=1, checkpoint_every=0)
    histories, models = [], []
    for data, held_out in ((tokens, valid), (sharded, valid_sharded)):
        model, history = train_with_fit(config, train, mirrored_strategy(), data,
                                        valid_tokens=held_out, verbose=0)
        histories.append(history.history)
        models.append(model)
    np.testing.assert_allclose(histories[1]["loss"], histories[0]["loss"], rtol=1e-6)
    np.testing.assert_allclose(histories[1]["val_loss"], histories[0]["val_loss"], rtol=1e-6)
    a = evaluate(models[0], valid, batch_size=2)
    b = evaluate(models[0], valid_sharded, batch_size=2)
    assert a == b


def test_hostile_inputs_get_clear_errors(tmp_path, capsys):
    folder = pathlib.Path(write_corpus(tmp_path / "c"))
    workdir = str(tmp_path / "w")
    for flags, message in ((["--shard-tokens", "0"], "--shard-tokens must be a positive"),
                           (["--shard-tokens", "1"], "--shard-tokens must be at least 1024"),
                           (["--shard-tokens", "1023"], "Received: 1023"),
                           (["--vocab-size", "-3"], "--vocab-size must be a positive"),
                           (["--min-freq", "0"], "--min-freq must be a positive"),
                           (["--tokenizer", "char", "--lower-case"], "--lower-case applies")):
        assert main(["prepare", "--data", str(folder), "--workdir", workdir, *flags]) == 2
        assert message in capsys.readouterr().err
    (folder / "valid.txt").write_bytes(b"fine\n\xff\xfe broken\n")
    assert main(["prepare", "--data", str(folder), "--workdir", workdir]) == 2
    err = capsys.readouterr().err
    assert "valid.txt is not valid UTF-8" in err
    (folder / "valid.txt").write_bytes(b"")
    assert main(["prepare", "--data", str(folder), "--workdir", str(tmp_path / "w2")]) == 2
    assert "the valid split" in capsys.readouterr().err
