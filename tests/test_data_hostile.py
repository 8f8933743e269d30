"""Hostile corpora and workdirs for data preparation: edits hidden from the
quick check, long lines joined by any whitespace, damaged shards of an
unfinished split, text that is not UTF-8 in TFDS, empty splits, and the
wording of the errors."""

import dataclasses
import fcntl
import functools
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from testing import REPO

from keras_txl.cli import main
from keras_txl.tokenizers import UNICODE_WHITESPACE
from keras_txl.tokenizers import build_tokenizer
from keras_txl.training import corpora
from keras_txl.training import shards
from keras_txl.training.corpora import load_corpus
from keras_txl.training.corpora import open_corpus_source
from keras_txl.training.run import WorkdirLock
from keras_txl.training.run import prepare_data

WORDS = ["the", "cat", "Sat", "on", "a", "mat", "naïve", "日本", "é", "x", "ab,c"]
SEPARATORS = [c for c in UNICODE_WHITESPACE if c != "\n"]


def write_corpus(folder, seed=0, lines=(120, 12, 12), sep=" "):
    rng = np.random.default_rng(seed)
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in zip(("train", "valid", "test"), lines):
        text = "\n".join(sep.join(rng.choice(WORDS, size=rng.integers(1, 14)))
                         for _ in range(n)) + "\n"
        (folder / f"{split}.txt").write_bytes(text.encode())
    return str(folder)


def data_files(workdir):
    data = pathlib.Path(workdir) / "data"
    return {str(p.relative_to(data)): p.read_bytes()
            for p in sorted(data.rglob("*")) if p.is_file() and p.name != "source.json"}


# --- 1. an edit hidden from size and mtime --------------------------------
def test_an_edit_with_size_and_mtime_set_back_is_noticed(tmp_path, capsys):
    folder = pathlib.Path(write_corpus(tmp_path / "c"))
    workdir = tmp_path / "w"
    flags = ["--data", str(folder), "--tokenizer", "word", "--shard-tokens", "1024"]
    assert main(["prepare", "--workdir", str(workdir), *flags]) == 0
    before = data_files(workdir)
    # A moved workdir and a copied corpus (new ctime and inode, same
    # content): compared by content, reused.
    moved = tmp_path / "moved"
    shutil.move(str(workdir), str(moved))
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)  # copy2: the same mtimes
    assert main(["prepare", "--workdir", str(moved), "--data", str(copy),
                 "--tokenizer", "word"]) == 0
    assert data_files(moved) == before
    # The same size, the mtime set back: the ctime gives the edit away.
    path = copy / "train.txt"
    info = path.stat()
    path.write_bytes(path.read_bytes().replace(b"cat", b"dog"))
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert path.stat().st_size == info.st_size
    capsys.readouterr()
    assert main(["prepare", "--workdir", str(moved), "--data", str(copy)]) == 2
    assert "has different content" in capsys.readouterr().err
    assert data_files(moved) == before


# --- 2. long lines are cut only where the tokenizer allows ----------------
@functools.cache
def tokenizers():
    """One tokenizer of each kind, fitted on text with every separator."""
    rng = np.random.default_rng(0)
    text = "".join(
        rng.choice(WORDS) + (rng.choice(SEPARATORS) if rng.random() < 0.4 else " ")
        + ("\n" if rng.random() < 0.1 else "") for _ in range(1500))
    return {
        "word": build_tokenizer("word", text),
        "char": build_tokenizer("char", text),
        "byte": build_tokenizer("byte"),
        "sentencepiece": build_tokenizer("sentencepiece", text, vocabulary_size=60,
                                         num_threads=1),
        "wordpiece": build_tokenizer("wordpiece", text, vocabulary_size=80),
    }


def chunked_ids(tokenizer, pieces):
    # One batched call (the same ids as `encode`, piece by piece).
    ragged = tokenizer.tokenize(pieces)
    return np.concatenate([row.numpy() for row in ragged] + [np.zeros(0, np.int32)])


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=40),
       separators=st.lists(st.sampled_from(SEPARATORS + ["\n", "  ", "\r\n"]),
                           min_size=1, max_size=40),
       chunk_bytes=st.integers(1, 24))
def test_chunks_give_the_ids_of_the_whole_text_for_every_kind(
        tmp_path, words, separators, chunk_bytes):
    """Random words joined by random whitespace (multi-byte, CR, runs),
    read in tiny chunks: every tokenizer kind gets the ids of the whole.
    (Found U+1680 joining words for wordpiece, which first cut there.)"""
    text = "".join(w + separators[i % len(separators)] for i, w in enumerate(words))
    folder = tmp_path / f"c{chunk_bytes}"
    folder.mkdir(exist_ok=True)
    (folder / "train.txt").write_bytes(text.encode())
    for split in ("valid", "test"):
        (folder / f"{split}.txt").write_bytes(b"x\n")
    whole = load_corpus(str(folder), char_symbols=False).train
    source = open_corpus_source(str(folder), chunk_bytes=chunk_bytes, char_symbols=False)
    for kind, tokenizer in tokenizers().items():
        pieces = [t for t, _ in source.chunks("train", kind=kind)]
        assert "".join(pieces) == whole
        np.testing.assert_array_equal(chunked_ids(tokenizer, pieces),
                                      tokenizer.encode(whole), err_msg=kind)


def test_a_long_line_joined_by_ideographic_spaces_keeps_its_word_ids(tmp_path):
    # The probe's case, smaller: one 300 KB line of words joined by U+3000.
    rng = np.random.default_rng(1)
    line = "\u3000".join(rng.choice(["日本", "cat", "naïve"], size=30_000)) + "\n"
    path = tmp_path / "c"
    path.mkdir()
    (path / "train.txt").write_bytes(line.encode() * 2)
    for split in ("valid", "test"):
        (path / f"{split}.txt").write_bytes(b"cat\n")
    whole = load_corpus(str(path)).train
    word = build_tokenizer("word", whole)
    source = open_corpus_source(str(path), chunk_bytes=16 << 10)
    pieces = [t for t, _ in source.chunks("train", kind="word")]
    assert len(pieces) > 10
    assert max(len(p.encode()) for p in pieces) <= 32 << 10  # still cut: bounded
    ids = np.concatenate([word.encode(p) for p in pieces])
    np.testing.assert_array_equal(ids, word.encode(whole))
    assert word.unk_id not in ids


def test_a_line_with_no_place_to_cut_grows_then_is_refused(tmp_path):
    path = tmp_path / "c"
    path.mkdir()
    # A space 3000 bytes into a line: past the soft limit, within the hard one.
    (path / "train.txt").write_bytes(b"a" * 3000 + b" " + b"b" * 2000 + b"\n")
    (path / "valid.txt").write_bytes(b"c" * 9000 + b"\n")
    (path / "test.txt").write_bytes(b"d\n")
    with mock.patch.object(corpora, "_MAX_SENTENCE_BYTES", 4096):
        source = open_corpus_source(str(path), chunk_bytes=64)
        pieces = [t for t, _ in source.chunks("train", kind="word")]
        assert pieces == ["a" * 3000, " " + "b" * 2000 + "\n"]
        with pytest.raises(ValueError, match=r"valid.txt: the line at byte 0 .* no place "
                           r"to cut it .*word tokenizer.*--tokenizer char or byte"):
            list(source.chunks("valid", kind="word"))
        with pytest.raises(ValueError, match="double_eos"):
            list(source.chunks("train", kind="word", double_eos=True))
        # The char tokenizer cuts anywhere: bounded chunks.
        assert max(len(t) for t, _ in source.chunks("valid", kind="char")) <= 128


# --- 3. a resumed split re-checks what it recorded ------------------------
class Stop(Exception):
    pass


def test_a_resumed_preparation_re_encodes_a_damaged_recorded_shard(tmp_path):
    folder = write_corpus(tmp_path / "c", lines=(600, 12, 12))
    prepare_data(folder, str(tmp_path / "straight"), "word", shard_tokens=1024)
    straight = data_files(tmp_path / "straight")

    def stop_at(n):
        def after_shard(number):
            if number == n:
                raise Stop
        return after_shard

    for damage in ("flip", "delete"):
        workdir = tmp_path / damage
        with pytest.raises(Stop):
            prepare_data(folder, str(workdir), "word", shard_tokens=1024,
                         after_shard=stop_at(3))
        shard = workdir / "data" / "train" / "shard-00001.bin"
        if damage == "flip":
            data = bytearray(shard.read_bytes())
            data[10:12] = bytes([data[10] ^ 0xFF, data[11] ^ 0xFF])
            shard.write_bytes(bytes(data))
        else:
            shard.unlink()
        _, splits = prepare_data(folder, str(workdir), "word", shard_tokens=1024)
        splits["train"].verify()
        assert data_files(workdir) == straight


def test_the_stream_hash_is_never_taken_over_a_changed_shard(tmp_path):
    path = tmp_path / "s.bin"
    path.write_bytes(np.arange(10, dtype="<u2").tobytes())
    good = shards.tokens_sha256([str(path)], "<u2")
    from keras_txl.io import sha256_file

    recorded = sha256_file(str(path))
    assert shards.tokens_sha256([str(path)], "<u2", expected=[recorded]) == good
    path.write_bytes(np.arange(1, 11, dtype="<u2").tobytes())
    with pytest.raises(ValueError, match="changed after it was written"):
        shards.tokens_sha256([str(path)], "<u2", expected=[recorded])


def test_a_missing_shard_is_said_to_be_missing(tmp_path):
    folder = write_corpus(tmp_path / "c")
    _, splits = prepare_data(folder, str(tmp_path / "w"), "word", shard_tokens=1024)
    os.remove(splits["valid"]._paths[0])
    with pytest.raises(ValueError, match=r"shard-00000.bin is missing \(listed in"):
        shards.ShardedTokens(splits["valid"].folder)


# --- 4. TFDS text that is not UTF-8; TFDS errors in flags -------------------
def test_tfds_text_that_is_not_utf8_is_refused(tmp_path, capsys):
    import tensorflow as tf
    import tensorflow_datasets as tfds

    data_dir = tmp_path / "tfds"
    lines = {"train": [b"hello world", b"hello world \xff\xfe bad bytes"],
             "validation": [b"fine"], "test": [b"fine"]}
    tfds.dataset_builders.store_as_tfds_dataset(
        name="hostile_bytes", version="1.0.0",
        features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
        split_datasets={s: tf.data.Dataset.from_tensor_slices(v).map(
            lambda line: {"text": line}) for s, v in lines.items()},
        data_dir=str(data_dir), disable_shuffling=True)
    message = r"'hostile_bytes' split 'train': example 1 .* not valid UTF-8 .*byte 12"
    with pytest.raises(ValueError, match=message):
        load_corpus("tfds:hostile_bytes", data_dir=str(data_dir))
    workdir = tmp_path / "w"
    assert main(["prepare", "--data", "tfds:hostile_bytes", "--data-dir", str(data_dir),
                 "--workdir", str(workdir), "--tokenizer", "byte"]) == 2
    err = capsys.readouterr().err
    assert "example 1" in err and "not valid UTF-8" in err
    assert not (workdir / "tokenizer").exists()
    # Errors from the CLI name its flags; a --data-dir that does not exist is said.
    missing = tmp_path / "nowhere"
    assert main(["prepare", "--data", "tfds:hostile_bytes", "--data-dir", str(missing),
                 "--workdir", str(workdir)]) == 2
    assert f"--data-dir '{missing}' does not exist" in capsys.readouterr().err
    assert main(["prepare", "--data", "tfds:not_a_dataset_xyz", "--data-dir",
                 str(data_dir), "--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert "--download" in err and "--data-dir" in err and "download=True" not in err


def test_tfds_text_with_a_nul_byte_is_refused_as_in_a_file(tmp_path, capsys):
    # A NUL byte in a file corpus is refused, naming the file and the byte; the
    # same byte in a TFDS example (a binary feature, UTF-16 text stored as bytes)
    # was tokenized in silence.
    import tensorflow as tf
    import tensorflow_datasets as tfds

    data_dir = tmp_path / "tfds"
    lines = {"train": [b"hello world", b"hello world", "hi\n".encode("utf-16-le")],
             "validation": [b"fine"], "test": [b"fine \x00 here"]}
    tfds.dataset_builders.store_as_tfds_dataset(
        name="nul_bytes", version="1.0.0",
        features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
        split_datasets={s: tf.data.Dataset.from_tensor_slices(v).map(
            lambda line: {"text": line}) for s, v in lines.items()},
        data_dir=str(data_dir), disable_shuffling=True)
    with pytest.raises(ValueError, match=r"'nul_bytes' split 'train': example 2 \(counting "
                       r"from 0\) holds a NUL byte \(at byte 1 of the example: "
                       r"b'h\\x00i\\x00.*UTF-16"):
        load_corpus("tfds:nul_bytes", data_dir=str(data_dir))
    source = open_corpus_source("tfds:nul_bytes", data_dir=str(data_dir))
    with pytest.raises(ValueError, match=r"split 'test': example 0 .* NUL byte \(at byte 5 "):
        list(source.chunks("test"))
    workdir = tmp_path / "w"
    assert main(["prepare", "--data", "tfds:nul_bytes", "--data-dir", str(data_dir),
                 "--workdir", str(workdir), "--tokenizer", "byte"]) == 2
    err = capsys.readouterr().err
    assert "example 2 (counting from 0) holds a NUL byte (at byte 1" in err
    assert not (workdir / "tokenizer").exists()


# --- 5. empty splits, and an unfinished preparation ------------------------
def test_an_empty_split_is_refused_before_any_work(tmp_path, capsys):
    folder = pathlib.Path(write_corpus(tmp_path / "c"))
    workdir = tmp_path / "w"
    valid = (folder / "valid.txt").read_bytes()
    for content, split in ((b"", "valid"), (" \n\t\r\n\u3000\n".encode(), "valid")):
        (folder / f"{split}.txt").write_bytes(content)
        assert main(["prepare", "--data", str(folder), "--workdir", str(workdir)]) == 2
        err = capsys.readouterr().err
        assert f"the {split} split of --data {folder} is empty" in err
        assert f"{folder / 'valid.txt'} holds no text" in err
        assert not (workdir / "tokenizer").exists()
        assert not (workdir / "data" / "train").exists()
    (folder / "valid.txt").write_bytes(valid)
    assert main(["prepare", "--data", str(folder), "--workdir", str(workdir)]) == 0


def test_an_unfinished_preparation_does_not_block_the_corrected_corpus(tmp_path, capsys):
    folder = pathlib.Path(write_corpus(tmp_path / "c", seed=0))
    workdir = str(tmp_path / "w")

    def stop(number):
        raise Stop

    with pytest.raises(Stop):
        prepare_data(str(folder), workdir, "word", shard_tokens=1024, after_shard=stop)
    corrected = write_corpus(tmp_path / "fixed", seed=5)
    for split in ("train", "valid", "test"):
        shutil.copy(pathlib.Path(corrected) / f"{split}.txt", folder / f"{split}.txt")
    prepare_data(str(folder), workdir, "word", shard_tokens=1024)
    prepare_data(corrected, str(tmp_path / "straight"), "word", shard_tokens=1024)
    assert data_files(workdir) == data_files(tmp_path / "straight")
    assert ((pathlib.Path(workdir) / "tokenizer" / "tokenizer.json").read_bytes()
            == (tmp_path / "straight" / "tokenizer" / "tokenizer.json").read_bytes())
    # Finished: now other content is refused again.
    other = write_corpus(tmp_path / "other", seed=9)
    with pytest.raises(ValueError, match="has different content"):
        prepare_data(other, workdir, "word")


# --- 6. the workdir lock names the command ---------------------------------
def test_the_workdir_lock_names_the_command_holding_it(tmp_path, capsys):
    folder = write_corpus(tmp_path / "c")
    workdir = tmp_path / "w"
    workdir.mkdir()
    with WorkdirLock(str(workdir), command="txl prepare"):
        assert main(["prepare", "--data", folder, "--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert f"in use by another `txl prepare` (pid {os.getpid()}" in err
    assert "use another --workdir" in err
    # A lock file of an older version holds the pid alone.
    (workdir / "train.lock").write_text("4242")
    with open(workdir / "train.lock") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        assert main(["prepare", "--data", folder, "--workdir", str(workdir)]) == 2
    assert "in use by another txl process (pid 4242" in capsys.readouterr().err


# --- 6. tokenizer flags, vocabulary files, TFDS flags (twenty-first session) --
def test_vocabulary_flags_that_cannot_apply_are_refused_never_recorded(tmp_path, capsys):
    # A workdir whose tokenizer has no record of its options (no source.json)
    # took --vocab-size 5 --min-freq 3 without applying them and recorded them
    # as applied; `txl train --workdir W` without --data ignored them too.
    folder = write_corpus(tmp_path / "c")
    workdir = tmp_path / "w"
    assert main(["prepare", "--data", folder, "--workdir", str(workdir)]) == 0
    built = json.loads((workdir / "data" / "source.json").read_text())["tokenizer"]
    capsys.readouterr()
    # Without --data: the recorded options are compared too.
    with pytest.raises(ValueError, match=r"built with --tokenizer word and no vocabulary "
                                         r"flag .*asks for --vocab-size 5"):
        prepare_data(None, str(workdir), vocabulary={"vocab_size": 5})
    (workdir / "data" / "source.json").unlink()
    assert main(["prepare", "--data", folder, "--workdir", str(workdir),
                 "--vocab-size", "5", "--min-freq", "3"]) == 2
    err = capsys.readouterr().err
    assert "already has a tokenizer" in err and "no record of the options" in err
    assert "--vocab-size 5" in err
    assert not (workdir / "data" / "source.json").exists()
    # Without the flags it prepares again, recording what the tokenizer is.
    assert main(["prepare", "--data", folder, "--workdir", str(workdir)]) == 0
    assert json.loads((workdir / "data" / "source.json").read_text())["tokenizer"] == built
    # A --vocabulary-file gives the vocabulary: a size or frequency cannot apply.
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("<eos>\n<unk>\nthe\ncat\n")
    capsys.readouterr()
    assert main(["prepare", "--data", folder, "--workdir", str(tmp_path / "v"),
                 "--vocabulary-file", str(vocab), "--vocab-size", "3"]) == 2
    assert "--vocabulary-file gives the vocabulary; --vocab-size" in capsys.readouterr().err
    # An edited vocabulary file is not the one the tokenizer was built from.
    flags = ["prepare", "--data", folder, "--workdir", str(tmp_path / "v"),
             "--vocabulary-file", str(vocab)]
    assert main(flags) == 0
    assert main(flags) == 0
    vocab.write_text("<eos>\n<unk>\nthe\ncat\nmat\n")
    capsys.readouterr()
    assert main(flags) == 2
    assert "changed since" in capsys.readouterr().err
    # Without the flag too (a corpus's own vocabulary file, e.g. LM1B's
    # 1b_word_vocab.txt, is never given as a flag).
    assert main(flags[:-2]) == 2
    assert "The vocabulary file" in capsys.readouterr().err


def test_a_char_vocabulary_file_holds_the_space_and_the_newline(tmp_path, capsys):
    # Every line's first field was the token: the space and the newline could
    # not be written, so a char vocabulary file lost them (a quarter of the
    # text read as <unk>), and export_vocabulary's own file was refused.
    from keras_txl.tokenizers import export_vocabulary
    from keras_txl.tokenizers import load_tokenizer

    folder = write_corpus(tmp_path / "c")
    text = (pathlib.Path(folder) / "train.txt").read_text()
    characters = sorted(set(text))
    assert " " in characters and "\n" in characters
    vocab = tmp_path / "chars.txt"
    vocab.write_text("<unk>\n" + "".join(
        ("\\n" if c == "\n" else c) + "\n" for c in characters), encoding="utf-8")
    workdir = tmp_path / "w"
    assert main(["prepare", "--data", folder, "--workdir", str(workdir), "--tokenizer",
                 "char", "--vocabulary-file", str(vocab)]) == 0
    tokenizer = load_tokenizer(workdir / "tokenizer")
    assert tokenizer.get_vocabulary() == ["<unk>", *characters]
    assert tokenizer.decode(tokenizer.encode(text)) == text
    # The file export_vocabulary writes reads back to the same vocabulary.
    exported = export_vocabulary(tokenizer, tmp_path / "exported") / "vocabulary.txt"
    capsys.readouterr()
    assert main(["prepare", "--data", folder, "--workdir", str(tmp_path / "w2"),
                 "--tokenizer", "char", "--vocabulary-file", str(exported)]) == 0
    assert load_tokenizer(tmp_path / "w2" / "tokenizer").get_vocabulary() == \
        tokenizer.get_vocabulary()


def test_a_byte_order_mark_is_not_text(tmp_path, capsys):
    # Notepad's UTF-8 starts with U+FEFF: it became part of the first word
    # ("\ufeffthe" beside "the"), and a BOM-only split was not "empty".
    folder = pathlib.Path(write_corpus(tmp_path / "c"))
    plain = {s: (folder / f"{s}.txt").read_bytes() for s in ("train", "valid", "test")}
    for split, data in plain.items():
        (folder / f"{split}.txt").write_bytes(b"\xef\xbb\xbf" + data)
    corpus = load_corpus(str(folder))
    assert corpus.train == plain["train"].decode() and "\ufeff" not in corpus.valid
    (folder / "valid.txt").write_bytes(b"\xef\xbb\xbf\r\n")
    assert main(["prepare", "--data", str(folder), "--workdir", str(tmp_path / "w")]) == 2
    assert "the valid split of --data" in capsys.readouterr().err


def _bom_free_and_bom_corpora(tmp_path):
    """A single file and a split folder, each written plain and with a byte
    order mark in front of every file; every text holds a U+FEFF inside (a
    zero-width no-break space: text). The single file's valid part (cut
    90/5/5 from the bytes after the mark) starts with one."""
    rng = np.random.default_rng(3)
    words = " ".join(rng.choice(WORDS, size=400)).encode()
    text = words[:600] + b"\n" + words[600:900] + " x\ufeffy \n".encode() + words[900:]
    text += b"\n" * (17 - len(text) % 20)  # the old 90/5/5 cut of text+BOM differed
    held = len(text) // 20
    train = len(text) - 2 * held
    text = text[:train] + "\ufeff".encode() + text[train + 3:]
    assert len(text) % 20 >= 17 and (len(text) + 3) // 20 != len(text) // 20
    out = {}
    for name, bom in (("plain", b""), ("bom", b"\xef\xbb\xbf")):
        single = tmp_path / name / "book.txt"
        single.parent.mkdir()
        single.write_bytes(bom + text)
        folder = tmp_path / name / "splits"
        write_corpus(folder)
        for split in ("train", "valid", "test"):
            path = folder / f"{split}.txt"
            path.write_bytes(bom + path.read_bytes() + " a\ufeffb\n".encode())
        out[name] = {"single": single, "splits": folder}
    return out, text


def test_a_byte_order_mark_is_dropped_at_the_start_of_a_single_file_too(tmp_path):
    # A single text file (and a raw text8) is read byte for byte: its byte
    # order mark was kept as text, so the char tokenizer learnt a "\ufeff"
    # token and the word tokenizer "\ufeffthe" beside "the", and the 90/5/5
    # cut counted its 3 bytes: the file gave other splits than without it.
    corpora_, text = _bom_free_and_bom_corpora(tmp_path)
    single = load_corpus(corpora_["bom"]["single"])
    plain = load_corpus(corpora_["plain"]["single"])
    for split in ("train", "valid", "test"):
        assert single.split(split) == plain.split(split)
    assert single.train == text[:len(single.train.encode())].decode()
    assert not single.train.startswith("\ufeff") and single.valid.startswith("\ufeff")
    assert "x\ufeffy" in single.train  # a U+FEFF inside the text is text
    folder = load_corpus(corpora_["bom"]["splits"])
    assert all(folder.split(s).endswith("a\ufeffb\n") and folder.split(s)[0] != "\ufeff"
               for s in ("train", "valid", "test"))
    # The same tokens (and vocabulary) from both, for char and word, in
    # chunks of every size.
    for layout in ("single", "splits"):
        for kind in ("char", "word"):
            got = {}
            for name in ("plain", "bom"):
                tokenizer, splits = prepare_data(
                    str(corpora_[name][layout]), str(tmp_path / f"w-{layout}-{kind}-{name}"),
                    kind, shard_tokens=1024)
                got[name] = (tokenizer.get_vocabulary(),
                             {s: np.asarray(t).tolist() for s, t in splits.items()})
            assert got["bom"] == got["plain"], (layout, kind)
            inside = {"single": "x\ufeffy", "splits": "a\ufeffb"}[layout]
            assert ("\ufeff" if kind == "char" else inside) in got["bom"][0]
            assert not any(t.startswith("\ufeff") for t in got["bom"][0] if len(t) > 1)
    source = open_corpus_source(corpora_["bom"]["single"], chunk_bytes=1)
    assert "".join(t for t, _ in source.chunks("train", kind="char")) == plain.train
    # A file holding only a byte order mark is empty; the raw enwik8 is bytes: kept.
    (tmp_path / "only.txt").write_bytes(b"\xef\xbb\xbf")
    with pytest.raises(ValueError, match=r"only\.txt is empty \(it holds only a byte order mark\)"):
        load_corpus(tmp_path / "only.txt")
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "enwik8").write_bytes(b"\xef\xbb\xbf" + b"ab" * 30)
    assert load_corpus(tmp_path / "e").train.startswith("\ufeffab")
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "text8").write_bytes(b"\xef\xbb\xbf" + b" ab cd" * 30)
    assert load_corpus(tmp_path / "t").train.startswith(" ab cd")


def test_a_workdir_of_text_rules_2_from_a_file_with_a_byte_order_mark_is_refused(tmp_path):
    # Rules 2 kept a single file's byte order mark: shards prepared by them
    # hold other tokens than this version encodes from that file (refused),
    # and the same as before from a file without one (kept).
    corpora_, text = _bom_free_and_bom_corpora(tmp_path)
    assert corpora.TEXT_RULES == 3

    def rules2_text(path):
        data = path.read_bytes()
        held = len(data) // 20
        cuts = (0, len(data) - 2 * held, len(data) - held, len(data))
        return {split: data[cuts[i]:cuts[i + 1]].decode("utf-8", "surrogateescape")
                for i, split in enumerate(("train", "valid", "test"))}

    for name in ("bom", "plain"):
        path = corpora_[name]["single"]
        workdir = str(tmp_path / f"w-{name}")
        _, before = prepare_data(str(path), workdir, "char", shard_tokens=1024)
        keys = {s: t.key for s, t in before.items()}
        old_text = rules2_text(path)
        meta = as_an_older_version_left_it(workdir, path, old_text, rules=2)
        assert meta["text_rules"] == 2
        if name == "bom":
            assert old_text["train"].startswith("\ufeff")
            old = data_files(workdir)
            with pytest.raises(ValueError, match=r"older keras-txl, which read text by other "
                               r"rules \(version 2; this one reads by version 3, where a byte "
                               r"order mark at the start of a single file is dropped.*\): its "
                               r"train, valid, test shards hold other tokens"):
                prepare_data(str(path), workdir)
            assert data_files(workdir) == old
            refused = json.loads((pathlib.Path(workdir) / "data" / "source.json").read_text())
            assert refused["text_rules"] == 2
            assert refused["text_rules_refused"]["text_rules"] == 3
        else:
            _, after = prepare_data(str(path), workdir)
            assert {s: t.key for s, t in after.items()} == keys
            assert json.loads((pathlib.Path(workdir) / "data" / "source.json")
                              .read_text())["text_rules"] == 3


def test_a_symbol_file_with_a_byte_order_mark_is_detected_as_symbols(tmp_path):
    # The detection read the mark as part of the first symbol ("\ufeff60"):
    # an enwik8/text8 folder saved with one was read as plain words, with an
    # <eos> per line and the vocabulary of train only, in silence.
    for name, line in (("enwik8", b"60 104 101 32 99 97 116\n"), ("text8", b"a b c _ d e f\n")):
        plain, bom = tmp_path / f"{name}-plain", tmp_path / f"{name}-bom"
        for folder, mark in ((plain, b""), (bom, b"\xef\xbb\xbf")):
            folder.mkdir()
            for split in ("train", "valid", "test"):
                (folder / f"{split}.txt").write_bytes(mark + line * 20)
        assert load_corpus(bom) == dataclasses.replace(load_corpus(plain), name=bom.name,
                                                       source=str(bom))
        assert load_corpus(bom).layout == "char-symbols"
        _, expected = prepare_data(str(plain), str(tmp_path / f"w-{name}-plain"),
                                   shard_tokens=1024)
        _, got = prepare_data(str(bom), str(tmp_path / f"w-{name}-bom"), shard_tokens=1024)
        for split in ("train", "valid", "test"):
            assert np.asarray(got[split]).tolist() == np.asarray(expected[split]).tolist()
    # A workdir of text rules 2, which read that folder as the splits layout:
    # refused as such (the same bytes), not as "different content".
    bom = tmp_path / "enwik8-bom"
    workdir = tmp_path / "w-old"
    prepare_data(str(bom), str(workdir), tfds={"char_symbols": False}, shard_tokens=1024)
    meta = json.loads((workdir / "data" / "source.json").read_text())
    assert meta["identity"]["layout"] == "splits"
    words = load_corpus(bom, char_symbols=False)
    as_an_older_version_left_it(str(workdir), bom, {s: words.split(s) for s in corpora.SPLITS},
                                rules=2)
    with pytest.raises(ValueError, match=r"older keras-txl, which read text by other rules "
                       r"\(version 2; this one reads by version 3, .*\): it read --data "
                       r".*enwik8-bom as the 'splits' layout, this one reads it as "
                       r"'char-symbols', so its shards hold other tokens .*new --workdir"):
        prepare_data(str(bom), str(workdir))


def test_a_byte_order_mark_in_a_vocabulary_file_is_not_a_token(tmp_path):
    # Notepad's UTF-8 file starts with U+FEFF: it became part of the first
    # token, so "the" read as <unk> everywhere (or <eos> was "missing").
    from keras_txl.training.vocab import build_streaming_tokenizer
    from keras_txl.training.vocab import read_vocabulary_file

    for kind, lines in (("word", ["the", "<eos>", "<unk>", "cat"]),
                        ("char", ["a", "<unk>", " ", "\\n"])):
        path = tmp_path / f"{kind}.txt"
        path.write_bytes(("\ufeff" + "\r\n".join(lines) + "\r\n").encode())
        tokens = read_vocabulary_file(path, kind)
        assert tokens == [("\n" if t == "\\n" else t) for t in lines]
    tokenizer = build_streaming_tokenizer("word", [], vocabulary_file=str(tmp_path / "word.txt"))
    assert tokenizer.encode("the cat\n").tolist() == [0, 3, 1]


def test_tfds_text_feature_and_splits_from_the_command_line(tmp_path, capsys):
    # A TFDS dataset with no validation split, or two text features, could
    # not be used from `txl` at all: the errors asked for Python arguments.
    import tensorflow as tf
    import tensorflow_datasets as tfds

    data_dir = tmp_path / "tfds"
    lines = {"train": [f"line {i} of the text" for i in range(40)],
             "test": ["the test text", "and more"]}
    tfds.dataset_builders.store_as_tfds_dataset(
        name="two_features", version="1.0.0",
        features=tfds.features.FeaturesDict({"title": tfds.features.Text(),
                                             "body": tfds.features.Text()}),
        split_datasets={s: tf.data.Dataset.from_tensor_slices(v).map(
            lambda line: {"title": "t", "body": line}) for s, v in lines.items()},
        data_dir=str(data_dir), disable_shuffling=True)
    base = ["prepare", "--data", "tfds:two_features", "--data-dir", str(data_dir),
            "--workdir", str(tmp_path / "w"), "--tokenizer", "char"]
    assert main(base) == 2
    err = capsys.readouterr().err
    assert "pass --tfds-text-feature NAME" in err and "text_feature=" not in err
    assert main(base + ["--tfds-text-feature", "body"]) == 2
    err = capsys.readouterr().err
    assert "no split found for ['valid']" in err and "--tfds-split valid=NAME" in err
    assert main(base + ["--tfds-text-feature", "body",
                        "--tfds-split", "valid=train[-10%:]"]) == 0
    from keras_txl.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(tmp_path / "w" / "tokenizer")
    valid = shards.ShardedTokens(tmp_path / "w" / "data" / "valid")
    expected = "".join(line + "\n" for line in lines["train"][-4:])
    assert tokenizer.decode(np.asarray(valid)) == expected
    for bad, message in ((["--tfds-split", "dev=test"], "SPLIT=TFDS_SPLIT"),
                         (["--tfds-split", "valid=test", "--tfds-split", "valid=train"],
                          "gives valid twice")):
        assert main(base + ["--tfds-text-feature", "body", *bad]) == 2
        assert message in capsys.readouterr().err
    assert main(["prepare", "--data", write_corpus(tmp_path / "c"), "--workdir",
                 str(tmp_path / "x"), "--tfds-split", "valid=test"]) == 2
    assert "--tfds-split applies to --data tfds:NAME only" in capsys.readouterr().err


@pytest.mark.parametrize("flag", [["--data-dir", "tfds_data"], ["--download"]])
def test_tfds_flags_with_a_local_corpus_are_refused(tmp_path, capsys, flag):
    # --data-dir and --download were ignored in silence for a folder or a
    # file: a user who meant a TFDS dataset trained on something else.
    folder = write_corpus(tmp_path / "c")
    for command, more in (("prepare", []), ("train", ["--preset", "tiny"])):
        workdir = tmp_path / f"w-{command}"
        assert main([command, "--data", folder, "--workdir", str(workdir), *more,
                     *flag]) == 2
        err = capsys.readouterr().err
        assert f"{flag[0]} applies to --data tfds:NAME only" in err
        assert folder in err
        assert not (workdir / "data").exists() and not (workdir / "tokenizer").exists()


def test_a_vocabulary_file_of_another_text_is_said_at_preparation(tmp_path, caplog):
    # A fixed vocabulary (or a tokenizer) made for another text turned most
    # of the corpus into <unk> shards in silence; training then learnt <unk>.
    folder = write_corpus(tmp_path / "c")
    vocabulary = tmp_path / "other_vocab.txt"
    vocabulary.write_text("<eos>\n<unk>\nthe\ndog\nran\n")
    with caplog.at_level("WARNING", logger="keras_txl.training.run"):
        tokenizer, splits = prepare_data(folder, str(tmp_path / "w"), "word",
                                         tokenizer_options={"vocabulary_file": str(vocabulary)})
    ids = np.asarray(splits["train"])
    share = np.mean(ids == tokenizer.unk_id)
    assert 0.5 < share < 1
    said = [r.getMessage() for r in caplog.records if "<unk>" in r.getMessage()]
    assert len(said) == 3, said  # one per split
    assert f"{100 * share:.1f}% of the {ids.size} tokens of the train split" in said[0]
    assert str(vocabulary) in said[0]
    # A vocabulary counted on the corpus itself says nothing.
    caplog.clear()
    with caplog.at_level("WARNING", logger="keras_txl.training.run"):
        prepare_data(folder, str(tmp_path / "w2"), "word")
    assert not [r for r in caplog.records if "<unk>" in r.getMessage()]


def test_a_corpus_that_changes_while_it_is_prepared_is_not_used(tmp_path):
    # A corpus still being copied in (or a log still written) when `txl
    # prepare` started: the shards held text that the recorded sha256 did
    # not, and the run trained on them.
    folder = pathlib.Path(write_corpus(tmp_path / "c", lines=(400, 12, 12)))
    workdir = str(tmp_path / "w")

    def append_once(number, done=[]):  # noqa: B006 (once per test)
        if not done:
            done.append(number)
            with open(folder / "valid.txt", "a") as handle:
                handle.write("the cat appended while prepared\n")

    with pytest.raises(ValueError, match="changed while it was prepared") as error:
        prepare_data(str(folder), workdir, "word", shard_tokens=1024,
                     after_shard=append_once)
    assert str(folder / "valid.txt") in str(error.value)
    assert not shards.is_complete(os.path.join(workdir, "data", "valid"))
    # The next run prepares the corpus as it now is.
    tokenizer, splits = prepare_data(str(folder), workdir, "word", shard_tokens=1024)
    corpus = load_corpus(str(folder))
    for split in ("train", "valid", "test"):
        np.testing.assert_array_equal(np.asarray(splits[split]),
                                      tokenizer.encode(corpus.split(split)))
    # A touch during the preparation (same content) is no change.
    touched = str(tmp_path / "w2")

    def touch(number):
        os.utime(folder / "test.txt")

    prepare_data(str(folder), touched, "word", shard_tokens=1024, after_shard=touch)
    assert all(shards.is_complete(os.path.join(touched, "data", s))
               for s in ("train", "valid", "test"))
    # Finished shards reused by a run during which the corpus changes hold
    # the recorded text: kept, and the next run compares the corpus again.
    write_split = shards.write_split

    def reuse_then_edit(folder_, *args, **kwargs):
        result = write_split(folder_, *args, **kwargs)
        if folder_.endswith("test"):
            with open(folder / "test.txt", "a") as handle:
                handle.write("an edit during a reusing run\n")
        return result

    with mock.patch.object(shards, "write_split", reuse_then_edit):
        prepare_data(str(folder), touched, "word")
    with pytest.raises(ValueError, match="has different content"):
        prepare_data(str(folder), touched, "word")


@pytest.mark.parametrize("damage", ["source_list", "index_list", "source_folder",
                                    "valid_missing"])
def test_damaged_workdir_records_are_named(tmp_path, damage):
    # A JSON list or a folder in place of source.json/index.json raised
    # AttributeError/IsADirectoryError; a missing split said "no prepared
    # data yet".
    folder = write_corpus(tmp_path / "c")
    workdir = tmp_path / "w"
    prepare_data(folder, str(workdir))
    data = workdir / "data"
    if damage == "source_list":
        (data / "source.json").write_text("[]")
        expected = r"source.json is a JSON list, not an object; delete it"
    elif damage == "index_list":
        (data / "valid" / "index.json").write_text("[]")
        expected = r"index.json is a JSON list, not an object; delete .*valid"
    elif damage == "source_folder":
        (data / "source.json").unlink()
        (data / "source.json").mkdir()
        expected = r"source.json is not a readable file"
    else:
        shutil.rmtree(data / "valid")
        expected = r"no complete prepared data \(.*valid missing or unfinished\)"
    with pytest.raises(ValueError, match=expected):
        prepare_data(None, str(workdir))


def test_sentencepiece_below_three_pieces_is_a_clear_error():
    with pytest.raises(ValueError, match=r"`vocabulary_size`=1 .*too small.*3 or more"):
        build_tokenizer("sentencepiece", "some text here\n", vocabulary_size=1)


def test_a_fifo_as_the_corpus_is_named_as_such(tmp_path):
    fifo = tmp_path / "corpus"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="is neither a regular file nor a folder"):
        open_corpus_source(str(fifo))
    with pytest.raises(ValueError, match="does not exist"):
        open_corpus_source(str(tmp_path / "missing"))


def test_a_corpus_path_that_does_not_exist_says_a_glob_is_not_expanded(tmp_path):
    write_corpus(tmp_path / "corpus")
    pattern = str(tmp_path / "corpus" / "*.txt")  # quoted: no shell expanded it
    with pytest.raises(ValueError, match=r"the corpus path does not exist\. It is not "
                       r"expanded as a pattern: pass the folder"):
        prepare_data(pattern, str(tmp_path / "work"), "word")
    with pytest.raises(ValueError, match=r"does not exist\.$"):
        prepare_data(str(tmp_path / "nope"), str(tmp_path / "work"), "word")
    assert not (tmp_path / "work" / "data").exists()


def test_char_symbols_overrides_the_symbol_file_detection(tmp_path, capsys):
    # Space-separated Chinese characters look like text8's symbols: read as
    # symbols by default (no <eos>, vocabulary of every split); `--char-symbols
    # no` reads them as words of any text, with <eos>.
    folder = tmp_path / "zh"
    folder.mkdir()
    lines = ["我 们 是 学 生", "他 们 是 老 师", "你 好 吗"] * 40
    for split, count in (("train", 100), ("valid", 10), ("test", 10)):
        (folder / f"{split}.txt").write_text("\n".join(lines[:count]) + "\n", encoding="utf-8")
    layouts = {}
    for choice in ("auto", "no"):
        workdir = tmp_path / choice
        assert main(["prepare", "--data", str(folder), "--workdir", str(workdir),
                     "--char-symbols", choice]) == 0
        source = json.loads((workdir / "data" / "source.json").read_text())
        layouts[choice] = json.dumps(source)
        tokenizer = load_tokenizer_of(workdir)
        has_eos = "<eos>" in tokenizer.get_vocabulary()
        assert has_eos == (choice == "no"), choice
    assert '"char-symbols"' in layouts["auto"] and '"char-symbols"' not in layouts["no"]
    capsys.readouterr()
    assert main(["prepare", "--data", "tfds:lm1b", "--workdir", str(tmp_path / "t"),
                 "--char-symbols", "yes"]) == 2
    assert "--char-symbols yes applies to a --data folder of train.txt" in (
        capsys.readouterr().err)
    assert main(["prepare", "--data", str(folder / "train.txt"), "--workdir",
                 str(tmp_path / "f"), "--char-symbols", "yes"]) == 2
    assert "char_symbols=True applies to train.txt/valid.txt/test.txt folders" in (
        capsys.readouterr().err)


def load_tokenizer_of(workdir):
    from keras_txl.tokenizers import load_tokenizer

    return load_tokenizer(str(workdir / "tokenizer"))


# --- 7. probes of the data area (shards, lock) -------------------------------
def flip_one_byte(path, at=3):
    data = bytearray(pathlib.Path(path).read_bytes())
    data[at] ^= 1
    pathlib.Path(path).write_bytes(bytes(data))


def test_a_shard_changed_after_preparation_is_never_read_in_silence(tmp_path):
    # The index's sha256s were checked by `txl prepare`/`train` only: a split
    # opened otherwise (`txl recl` reads the workdir's test split, the Python
    # API) read a shard altered since (same size, other bytes) in silence.
    folder = write_corpus(tmp_path / "c")
    workdir = tmp_path / "w"
    _, splits = prepare_data(folder, str(workdir), "word")
    test = splits["test"].folder
    good = np.asarray(shards.ShardedTokens(test))
    flip_one_byte(os.path.join(test, "shard-00000.bin"))
    opened = shards.ShardedTokens(test)  # opening reads only the index
    message = r"shard .*test/shard-00000\.bin does not match its sha256 in index\.json"
    with pytest.raises(ValueError, match=message):
        opened.read(0, 1)
    with pytest.raises(ValueError, match=message):
        np.asarray(shards.ShardedTokens(test))
    from keras_txl.training import recl

    with pytest.raises(ValueError, match=message):
        recl.load_tokens(str(workdir))
    flip_one_byte(os.path.join(test, "shard-00000.bin"))  # restored: read again
    np.testing.assert_array_equal(np.asarray(shards.ShardedTokens(test)), good)


def test_prepare_data_takes_the_workdir_lock_as_txl_prepare_does(tmp_path):
    # The Python API took no lock: a second process preparing the same
    # workdir wrote the same source.json, tokenizer and progress.json.
    folder = write_corpus(tmp_path / "c")
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "train.lock").write_text("4242 txl prepare")
    with open(workdir / "train.lock") as held:  # another process's lock
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(ValueError, match=r"w is in use by another `txl prepare` "
                                             r"\(pid 4242, lock .*train\.lock\)"):
            prepare_data(folder, str(workdir), "word")
        assert not (workdir / "data").exists()
    _, splits = prepare_data(folder, str(workdir), "word")
    assert len(splits["train"]) > 0
    assert (workdir / "train.lock").read_text() == f"{os.getpid()} prepare_data"
    # Then held by this API: `txl prepare` is refused naming it.
    with WorkdirLock(str(workdir), command="prepare_data"):
        assert main(["prepare", "--data", folder, "--workdir", str(workdir)]) == 2


# --- 8. every line ends with <eos>, as the reference reads files ---------------
def reference_symbols(paths, eos, double_eos=False):
    """The official `vocabulary.py`: each file read line by line (universal
    newlines), each line `line.strip().split()` then `<eos>` (or `<S> ... <S>`)."""
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                words = line.strip().split()
                out += [eos, *words, eos] if double_eos else [*words, eos]
    return out


def test_a_last_line_without_newline_gets_its_eos_in_memory_and_in_shards(tmp_path):
    # A file without a final newline lost the <eos> of its last line (the
    # reference adds one to every line it reads), and LM1B's training files were
    # joined so that one file's last line ran into the next file's first.
    folder = tmp_path / "c"
    folder.mkdir()
    files = {"train": b"a b\nc d", "valid": b"a\r\nb  c\r\nd", "test": b"a\n\n"}
    for split, data in files.items():
        (folder / f"{split}.txt").write_bytes(data)
    corpus = load_corpus(folder)
    assert (corpus.train, corpus.valid, corpus.test) == ("a b\nc d\n", "a\nb  c\nd\n", "a\n\n")
    for chunk_bytes in (1, 2, 3, 5, 64):
        stream = open_corpus_source(folder, chunk_bytes=chunk_bytes)
        for split in ("train", "valid", "test"):
            assert "".join(t for t, _ in stream.chunks(split)) == corpus.split(split)
    tokenizer, splits = prepare_data(str(folder), str(tmp_path / "w"), "word")
    words = tokenizer.vocabulary
    for split in ("train", "valid", "test"):
        expected = reference_symbols([folder / f"{split}.txt"], "<eos>")
        assert [words[i] for i in tokenizer.encode(corpus.split(split))] == expected
        assert [words[i] for i in np.asarray(splits[split])] == expected

    from testing import write_lm1b_release

    release = write_lm1b_release(tmp_path / "lm1b", train=("a b .\nc d", "e f .\n"),
                                 heldout=("a z .", "c c .\n"))
    corpus = load_corpus(release)
    assert corpus.train == "a b .\nc d\ne f .\n" and corpus.valid == "a z .\n"
    tokenizer, splits = prepare_data(str(release), str(tmp_path / "w2"))
    words = tokenizer.vocabulary
    eos = words[tokenizer.eos_id]
    train_files = sorted((release / "training-monolingual.tokenized.shuffled").iterdir())
    expected = reference_symbols(train_files, eos, double_eos=True)
    assert [words[i] for i in tokenizer.encode(corpus.train)] == expected
    assert [words[i] for i in np.asarray(splits["train"])] == expected


def test_an_index_whose_tokens_sha256_does_not_match_its_shards_is_refused(tmp_path):
    # The index's tokens_sha256 (the key checkpoints record) was taken on
    # trust: shards copied in from another preparation with their sha256s, or
    # a key edited by hand, gave a key that is not the tokens' own.
    folder = write_corpus(tmp_path / "c")
    workdir = tmp_path / "w"
    _, splits = prepare_data(folder, str(workdir), "word")
    valid = pathlib.Path(splits["valid"].folder)
    test = pathlib.Path(splits["test"].folder)
    good_key = shards.ShardedTokens(valid).key
    assert good_key == "tokens-sha256:" + json.loads(
        (valid / "index.json").read_text())["tokens_sha256"]
    # The test split's shards, with their index entries, under valid's key.
    index = json.loads((valid / "index.json").read_text())
    other = json.loads((test / "index.json").read_text())
    for shard in other["shards"]:
        shutil.copy(test / shard["file"], valid / shard["file"])
    index.update(shards=other["shards"], num_tokens=other["num_tokens"],
                 max_id=other["max_id"])
    (valid / "index.json").write_text(json.dumps(index))
    message = (r"valid/index\.json: its tokens_sha256 .* is not the sha256 of the "
               r"tokens its shards hold")
    opened = shards.ShardedTokens(valid)
    opened.read(0, 1)  # the shards themselves match their own sha256s
    with pytest.raises(ValueError, match=message):
        opened.key  # noqa: B018 (the property checks)
    with pytest.raises(ValueError, match=message):
        shards.ShardedTokens(valid).verify()
    with pytest.raises(ValueError, match=message):
        prepare_data(folder, str(workdir), "word")


def write_tiny_shards(folder, tokens, shard_tokens):
    """A finished split of `tokens` cut into shards of `shard_tokens` (the
    index written directly: no fsync per shard)."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True)
    listed, paths = [], []
    for number, start in enumerate(range(0, len(tokens), shard_tokens)):
        data = np.asarray(tokens[start:start + shard_tokens], "<u2").tobytes()
        path = folder / f"shard-{number:05d}.bin"
        path.write_bytes(data)
        paths.append(path)
        listed.append({"file": path.name, "tokens": len(data) // 2,
                       "sha256": hashlib.sha256(data).hexdigest(), "max_id": 0})
    index = {"format": shards.FORMAT, "key": "k", "dtype": "<u2",
             "num_tokens": len(tokens), "max_id": int(max(tokens)),
             "tokens_sha256": shards.tokens_sha256(paths, "<u2"), "shards": listed}
    (folder / "index.json").write_text(json.dumps(index))
    return str(folder)


def test_thousands_of_shards_do_not_run_out_of_file_descriptors(tmp_path):
    # One descriptor stayed open per shard read: a small --shard-tokens on a
    # large corpus ran into `ulimit -n` (often 1024) with "Too many open files".
    tokens = np.arange(3000) % 50_000
    folder = write_tiny_shards(tmp_path / "s", tokens, 2)  # 1500 shards
    script = f"""
import os, resource, sys
import numpy as np
from keras_txl.training import shards
open_now = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 100, open_now + 100))
tokens = shards.ShardedTokens({folder!r})
got = np.asarray(tokens)
again = tokens.read_windows([0, 1000, 2990], 9)
print("OK", got.tolist() == (np.arange(3000) % 50_000).tolist(), again[1, 0])
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": "",
                                                     "PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["OK", "True", "1000"]
    # Shards already hashed are not hashed again when their file is reopened.
    opened = shards.ShardedTokens(folder)
    with mock.patch.object(hashlib, "file_digest", wraps=hashlib.file_digest) as hashed:
        np.asarray(opened)
        assert hashed.call_count == 1500
        np.testing.assert_array_equal(np.asarray(opened), tokens)
        assert hashed.call_count == 1500
    assert len(opened._fds) <= shards.MAX_OPEN_SHARDS


def test_a_nul_byte_in_a_text_corpus_is_refused_naming_the_file_and_byte(tmp_path, capsys):
    # NUL bytes were read as word characters: a binary file, or a UTF-16 file
    # (valid UTF-8 with a NUL after every ASCII letter), given by mistake was
    # tokenized in silence.
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "train.txt").write_bytes(b"a b\n" * 40 + b"c\x00d\n")
    (folder / "valid.txt").write_bytes(b"a\n")
    (folder / "test.txt").write_bytes("a b\n".encode("utf-16-le"))
    message = r"train\.txt holds a NUL byte \(at byte 161\)"
    with pytest.raises(ValueError, match=message):
        load_corpus(folder)
    with pytest.raises(ValueError, match=message):
        list(open_corpus_source(folder, chunk_bytes=8).chunks("train"))
    with pytest.raises(ValueError, match=r"test\.txt holds a NUL byte \(at byte 1\).*UTF-16"):
        list(open_corpus_source(folder).chunks("test"))
    assert main(["prepare", "--data", str(folder), "--workdir", str(tmp_path / "w")]) == 2
    assert "train.txt holds a NUL byte (at byte 161)" in capsys.readouterr().err
    assert not (tmp_path / "w" / "tokenizer").exists()
    single = tmp_path / "book.txt"
    single.write_bytes(b"x y z\n" * 10 + b"\x00")
    with pytest.raises(ValueError, match=r"book\.txt holds a NUL byte \(at byte 60\)"):
        load_corpus(single)
    # The raw enwik8 is bytes for the byte tokenizer: a NUL there is data.
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "enwik8").write_bytes(b"\x00ab" * 20)
    assert load_corpus(tmp_path / "e").train.startswith("\x00ab")


def as_an_older_version_left_it(workdir, folder, rules1_text, rules=1):
    """Rewrites a workdir prepared now as keras-txl with text rules `rules`
    left it: source.json and the key with that "text_rules" (none for 1),
    and the shards of `rules1_text` (split -> the text those rules read)
    under that key."""
    from keras_txl.tokenizers import load_tokenizer

    data = pathlib.Path(workdir) / "data"
    meta = json.loads((data / "source.json").read_text())
    meta.pop("text_rules", None)
    if rules != 1:
        meta["text_rules"] = rules
    fields = {k: meta[k] for k in ("sha256", "identity", "tokenizer_sha256",
                                   "shard_tokens", "dtype", "text_rules") if k in meta}
    meta["key"] = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    tokenizer = load_tokenizer(os.path.join(workdir, "tokenizer"))
    for split, text in rules1_text.items():
        shutil.rmtree(data / split)
        shards.write_split(str(data / split), lambda cursor, text=text: [(text, 1)],
                           tokenizer.encode, key=meta["key"], dtype=meta["dtype"],
                           shard_tokens=meta["shard_tokens"])
    (data / "source.json").write_text(json.dumps(meta))
    return meta


def test_shards_of_older_text_rules_are_noticed_never_reused_in_silence(tmp_path, capsys):
    # The rules that read a corpus changed (a last line without a newline got
    # its <eos>), but a workdir prepared before kept its shards: its key held
    # the source and the tokenizer, not how text is read, so `txl prepare` and
    # `txl train` reused shards that the same corpus no longer gives.
    folder = tmp_path / "c"
    write_corpus(folder)
    (folder / "valid.txt").write_bytes((folder / "valid.txt").read_bytes().rstrip(b"\n"))
    workdir = str(tmp_path / "w")
    prepare_data(str(folder), workdir, "word", shard_tokens=1024)
    now = data_files(workdir)
    read = {s: (folder / f"{s}.txt").read_text() for s in ("train", "valid", "test")}
    as_an_older_version_left_it(workdir, folder, read)  # valid: rules 1, no last <eos>
    old = data_files(workdir)
    assert old != now
    # Without --data: refused, saying to pass it.
    with pytest.raises(ValueError, match=r"encoded under the text rules of an older "
                       rf"keras-txl \(version 1; this one reads text by version {corpora.TEXT_RULES}\).*"
                       rf"Pass --data {folder} "):
        prepare_data(None, workdir)
    # With it: encoded again, other tokens in valid: refused, the workdir as it was.
    with pytest.raises(ValueError, match=r"older keras-txl, which read text by other "
                       r"rules \(version 1; .*its valid shards hold other tokens .*"
                       r"train in a new --workdir"):
        prepare_data(str(folder), workdir)
    assert data_files(workdir) == old
    assert main(["prepare", "--data", str(folder), "--workdir", workdir]) == 2
    assert "its valid shards hold other tokens" in capsys.readouterr().err
    # A corpus whose files end with newlines reads the same by both rules: the
    # old shards are kept (the same tokens) and recorded under the current rules.
    folder2 = tmp_path / "c2"
    write_corpus(folder2, seed=1)
    workdir2 = str(tmp_path / "w2")
    _, before = prepare_data(str(folder2), workdir2, "word", shard_tokens=1024)
    keys = {s: t.key for s, t in before.items()}
    as_an_older_version_left_it(
        workdir2, folder2, {s: (folder2 / f"{s}.txt").read_text() for s in keys})
    # A run killed while it replaced them: train moved aside, not yet replaced.
    check = pathlib.Path(workdir2) / "data" / ".text-rules-check"
    check.mkdir()
    os.replace(pathlib.Path(workdir2) / "data" / "train", check / "old-train")
    _, after = prepare_data(str(folder2), workdir2)
    assert {s: t.key for s, t in after.items()} == keys
    assert not (pathlib.Path(workdir2) / "data" / ".text-rules-check").exists()
    meta = json.loads((pathlib.Path(workdir2) / "data" / "source.json").read_text())
    assert meta["text_rules"] == corpora.TEXT_RULES and meta["finished"]
    # txl eval / recl without --data score the workdir's test shards: refused
    # while they are of older rules, read once they were checked.
    from keras_txl.training.run import check_workdir_tokens

    with pytest.raises(ValueError, match=r"data was encoded under the text rules of an "
                       r"older keras-txl \(version 1; .*its test tokens may not be .*"
                       rf"txl prepare --data {folder} --workdir {workdir}"):
        check_workdir_tokens(workdir, "test", "model", "", "")
    check_workdir_tokens(workdir2, "test", "model", "", "")
    # Now current: reused without encoding anything, with and without --data.
    written = []
    _, again = prepare_data(str(folder2), workdir2, after_shard=written.append)
    assert written == [] and {s: t.key for s, t in again.items()} == keys
    _, again = prepare_data(None, workdir2)
    assert {s: t.key for s, t in again.items()} == keys


def test_an_unfinished_preparation_of_older_text_rules_starts_over(tmp_path):
    folder = tmp_path / "c"
    write_corpus(folder)
    (folder / "train.txt").write_bytes((folder / "train.txt").read_bytes().rstrip(b"\n"))
    workdir = tmp_path / "w"
    prepare_data(str(folder), str(workdir), "word", shard_tokens=1024)
    as_an_older_version_left_it(str(workdir), folder, {"train": (folder / "train.txt").read_text()})
    data = workdir / "data"
    meta = json.loads((data / "source.json").read_text())
    meta["finished"] = False
    (data / "source.json").write_text(json.dumps(meta))
    shutil.rmtree(data / "test")  # killed before the last split
    _, splits = prepare_data(str(folder), str(workdir))
    fresh_tokenizer, fresh = prepare_data(str(folder), str(tmp_path / "fresh"), "word",
                                          shard_tokens=1024)
    for split in ("train", "valid", "test"):
        assert np.array_equal(np.asarray(splits[split]), np.asarray(fresh[split]))
    assert np.asarray(splits["train"])[-1] == fresh_tokenizer.eos_id


def test_a_refused_text_rules_recheck_is_recorded_and_not_encoded_again(tmp_path, capsys):
    # A finished workdir of older text rules whose tokens differ was refused
    # only after the whole corpus was encoded again, and nothing recorded
    # that: every later run encoded it all again to refuse it again.
    folder = tmp_path / "c"
    write_corpus(folder)
    (folder / "valid.txt").write_bytes((folder / "valid.txt").read_bytes().rstrip(b"\n"))
    workdir = str(tmp_path / "w")
    prepare_data(str(folder), workdir, "word", shard_tokens=1024)
    read = {s: (folder / f"{s}.txt").read_text() for s in ("train", "valid", "test")}
    as_an_older_version_left_it(workdir, folder, read)
    old = data_files(workdir)
    message = (r"older keras-txl, which read text by other rules \(version 1; .*its valid "
               r"shards hold other tokens .*train in a new --workdir")
    written = []
    with pytest.raises(ValueError, match=message) as first:
        prepare_data(str(folder), workdir, after_shard=written.append)
    assert written  # the first run encodes the corpus to compare
    meta = json.loads((pathlib.Path(workdir) / "data" / "source.json").read_text())
    assert meta["text_rules_refused"]["text_rules"] == corpora.TEXT_RULES
    assert meta["text_rules_refused"]["splits"] == ["valid"]
    assert "text_rules" not in meta  # still the older version's record otherwise
    # Later runs with the same source: the same refusal, nothing encoded.
    written.clear()
    with pytest.raises(ValueError, match=message) as again:
        prepare_data(str(folder), workdir, after_shard=written.append)
    assert written == [] and str(again.value) == str(first.value)
    assert data_files(workdir) == old
    assert main(["prepare", "--data", str(folder), "--workdir", workdir]) == 2
    assert "its valid shards hold other tokens" in capsys.readouterr().err
    assert not (pathlib.Path(workdir) / "data" / ".text-rules-check").exists()
    # A changed source is not refused by the record: it goes through the
    # source check (other content for a finished workdir: refused as such).
    (folder / "test.txt").write_text((folder / "test.txt").read_text() + "more words\n")
    with pytest.raises(ValueError, match=r"has different content"):
        prepare_data(str(folder), workdir, after_shard=written.append)
    assert written == []


def test_a_recorded_text_rules_refusal_belongs_to_the_tokenizer_it_was_made_with(tmp_path):
    # The recorded refusal was keyed on the corpus and the old shards only:
    # after the workdir's tokenizer was replaced, or with other tokenizer
    # flags, the run still said the text-rules refusal (made with the old
    # tokenizer) instead of what is wrong now, which a run without the record
    # says.
    folder = tmp_path / "c"
    write_corpus(folder)
    (folder / "valid.txt").write_bytes((folder / "valid.txt").read_bytes().rstrip(b"\n"))
    read = {s: (folder / f"{s}.txt").read_text() for s in ("train", "valid", "test")}
    workdir = tmp_path / "w"
    prepare_data(str(folder), str(workdir), "word", shard_tokens=1024)
    as_an_older_version_left_it(str(workdir), folder, read)
    with pytest.raises(ValueError, match=r"its valid shards hold other tokens"):
        prepare_data(str(folder), str(workdir))
    assert "text_rules_refused" in json.loads((workdir / "data" / "source.json").read_text())
    # Other tokenizer flags or kind: said as such, as without the record.
    with pytest.raises(ValueError, match=r"tokenizer was built with --tokenizer word and no "
                       r"vocabulary flag .*this run asks for --vocab-size 5\."):
        prepare_data(str(folder), str(workdir), vocabulary={"vocab_size": 5})
    with pytest.raises(ValueError, match=r"already has a word tokenizer; --tokenizer char "
                       r"does not match it"):
        prepare_data(str(folder), str(workdir), "char")
    # The workdir's tokenizer replaced: the record is not about this one.
    other = tmp_path / "other"
    prepare_data(str(folder), str(other), "word", vocabulary={"vocab_size": 8})
    saved = workdir / "saved-tokenizer"
    os.replace(workdir / "tokenizer", saved)
    shutil.copytree(other / "tokenizer", workdir / "tokenizer")
    written = []
    with pytest.raises(ValueError, match=r"tokenizer changed since .*data was encoded with it"):
        prepare_data(str(folder), str(workdir), after_shard=written.append)
    assert written == []
    # Restored: the recorded refusal again, at once.
    shutil.rmtree(workdir / "tokenizer")
    os.replace(saved, workdir / "tokenizer")
    with pytest.raises(ValueError, match=r"its valid shards hold other tokens"):
        prepare_data(str(folder), str(workdir), after_shard=written.append)
    assert written == []


def test_prepare_data_names_its_own_tfds_arguments_not_the_cli_flags(tmp_path, capsys):
    # The Python `prepare_data` said "pass --data-dir", "--download",
    # "--tfds-text-feature NAME": flags of a command line its caller never used.
    import tensorflow as tf
    import tensorflow_datasets as tfds

    data_dir = tmp_path / "tfds"
    lines = {"train": [f"line {i} of the text" for i in range(40)], "test": ["the test"]}
    tfds.dataset_builders.store_as_tfds_dataset(
        name="two_texts", version="1.0.0",
        features=tfds.features.FeaturesDict({"title": tfds.features.Text(),
                                             "body": tfds.features.Text()}),
        split_datasets={s: tf.data.Dataset.from_tensor_slices(v).map(
            lambda line: {"title": "t", "body": line}) for s, v in lines.items()},
        data_dir=str(data_dir), disable_shuffling=True)
    workdir = str(tmp_path / "w")
    cases = [
        (dict(data_dir=str(tmp_path / "nowhere")),
         rf"data_dir='{tmp_path / 'nowhere'}' does not exist: .*\(or download=True "),
        (dict(data_dir=str(data_dir), source="tfds:no_such_dataset_xyz"),
         r"pass the data_dir given to build_local_tfds; for a catalog dataset pass "
         r"download=True"),
        (dict(data_dir=str(data_dir)),
         r"pass tfds=\{'text_feature': NAME\}\.$"),
        (dict(data_dir=str(data_dir), tfds={"text_feature": "nope"}),
         r"one of \['\w+', '\w+'\]\. Received: tfds=\{'text_feature': 'nope'\}\.$"),
        (dict(data_dir=str(data_dir), tfds={"text_feature": "body"}),
         r"no split found for \['valid'\]\. Pass tfds=\{'split_names': \{'valid': NAME\}\}"),
    ]
    for kwargs, message in cases:
        source = kwargs.pop("source", "tfds:two_texts")
        with pytest.raises(ValueError, match=message) as error:
            prepare_data(source, workdir, **kwargs)
        assert "--" not in str(error.value)
    # The command line still names its flags, for the text feature too.
    assert main(["prepare", "--data", "tfds:two_texts", "--data-dir", str(data_dir),
                 "--workdir", workdir, "--tfds-text-feature", "nope"]) == 2
    assert "Received: --tfds-text-feature nope." in capsys.readouterr().err
    _, splits = prepare_data("tfds:two_texts", workdir, "char", data_dir=str(data_dir),
                             tfds={"text_feature": "body",
                                   "split_names": {"valid": "train[-10%:]"}})
    assert len(splits["valid"]) == len("".join(f"line {i} of the text\n" for i in range(36, 40)))


def test_a_crlf_file_keeps_its_carriage_returns_with_sentencepiece(tmp_path):
    # A single file is read byte for byte, so a CRLF file's lines end in
    # "\r". SentencePiece's trainer drops a sentence's trailing "\r", so the
    # model never learnt it and every line of the shards ended in <unk>.
    text = "".join(f"line {i} of the book, said the cat\r\n" for i in range(300))
    book = tmp_path / "book.txt"
    book.write_bytes(text.encode())
    tokenizer, splits = prepare_data(str(book), str(tmp_path / "w"), "sentencepiece",
                                     vocabulary={"vocab_size": 60})
    train = np.asarray(splits["train"])
    assert int(np.count_nonzero(train == tokenizer.unk_id)) == 0
    assert tokenizer.decode(train) == load_corpus(book).train
    assert tokenizer.decode(tokenizer.encode("the cat\r\nsaid\r\r\n")) == "the cat\r\nsaid\r\r\n"
    # Text without a "\r" trains the same model as before (no extra piece).
    plain = build_tokenizer("sentencepiece", [text.replace("\r", "")], vocabulary_size=60)
    assert "\r" not in plain.get_vocabulary()


def test_sentencepiece_trains_on_lines_longer_than_its_sentence_limit(tmp_path):
    # SentencePiece's trainer skips sentences longer than max_sentence_length
    # (64 KiB): a file of one long line (text8, a CR-only file) left it
    # nothing and it failed in C++ (`RuntimeError: INTERNAL: ...
    # [!sentences_.empty()]`); a corpus of a few long lines trained on the
    # short ones only. Long lines are cut at spaces for the trainer.
    text = "".join(f"line {i} of the book, said the cat " for i in range(3000))
    book = tmp_path / "book.txt"
    book.write_bytes(text.encode())  # 98 KB, no newline
    tokenizer, splits = prepare_data(str(book), str(tmp_path / "w"), "sentencepiece",
                                     vocabulary={"vocab_size": 60})
    train = np.asarray(splits["train"])
    assert int(np.count_nonzero(train == tokenizer.unk_id)) == 0
    assert tokenizer.decode(train) == load_corpus(book).train
    assert set(text) - {" "} <= set(tokenizer.get_vocabulary())
    # Cut before a space: pieces start with one ("▁1..."), none ends with it.
    pieces = [p for p in tokenizer.get_vocabulary() if len(p) > 1 and p[0] != "<"]
    assert pieces and all(p.startswith("▁") and not p.endswith("▁") for p in pieces)
    # A line with no space to cut at is cut between characters, never inside one.
    dense = "日本語のテキスト" * 4000  # 96 KB of three-byte characters
    tokenizer = build_tokenizer("sentencepiece", [dense], vocabulary_size=30)
    assert tokenizer.decode(tokenizer.encode(dense)) == dense


def test_tfds_arguments_with_a_local_corpus_are_refused_in_python_too(tmp_path):
    # The command line refuses --data-dir & co. with a folder or a file, but
    # load_corpus, open_corpus_source and prepare_data ignored them in
    # silence: a caller who meant a TFDS dataset got the local files.
    folder = write_corpus(tmp_path / "c")
    book = tmp_path / "book.txt"
    book.write_text("some text\n" * 100)
    for source in (folder, str(book)):
        for call in (load_corpus, open_corpus_source):
            for kwargs, named in ((dict(data_dir=str(tmp_path)), "data_dir"),
                                  (dict(download=True), "download"),
                                  (dict(text_feature="text"), "text_feature"),
                                  (dict(split_names={"valid": "test"}), "split_names")):
                with pytest.raises(ValueError, match=rf"^`{named}` applies to 'tfds:NAME' "
                                   rf"sources only \(source '{source}' is not one\): "
                                   "leave it out"):
                    call(source, **kwargs)
        with pytest.raises(ValueError, match=r"`max_examples` applies to 'tfds:NAME'"):
            load_corpus(source, max_examples=3)
    workdir = tmp_path / "w"
    with pytest.raises(ValueError, match=r"^`data_dir` applies to 'tfds:NAME' sources only"):
        prepare_data(folder, str(workdir), data_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"^`tfds=\{'split_names': ...\}` applies to "
                       r"'tfds:NAME' sources only"):
        prepare_data(folder, str(workdir), tfds={"split_names": {"valid": "test"}})
    assert not (workdir / "data").exists() and not (workdir / "tokenizer").exists()
    # Defaults, and char_symbols (a folder's option), are fine.
    assert load_corpus(folder, data_dir=None, download=False, char_symbols=False).train
    prepare_data(folder, str(workdir), "word", tfds={"char_symbols": False})


def test_prepare_data_checks_its_tfds_dict(tmp_path):
    # prepare_data(tfds=...) passed the dict on as keyword arguments: a
    # misspelt key was a TypeError about open_corpus_source, a function the
    # caller never called, and a list one about `**`.
    folder = write_corpus(tmp_path / "c")
    workdir = str(tmp_path / "w")
    for tfds, message in (
            ({"feature": "text"}, r"^`tfds` takes the keys \['char_symbols', 'split_names', "
                                  r"'text_feature'\]\. Received unknown key\(s\) \['feature'\]\.$"),
            ({"max_examples": 3}, r"unknown key\(s\) \['max_examples'\]"),
            (["text_feature"], r"^`tfds` must be a dict .*Received type list\.$")):
        with pytest.raises(ValueError, match=message):
            prepare_data(folder, workdir, tfds=tfds)
    assert not (tmp_path / "w" / "data").exists()


def test_a_tokenizer_deleted_after_preparation_is_noticed(tmp_path):
    # Deleting the workdir's tokenizer after a finished preparation made the
    # next run with --data build another one in silence (with the corpus's
    # default options: 13 tokens instead of the 8 asked for) and replace every
    # finished shard, which checkpoints had been trained on.
    folder = write_corpus(tmp_path / "c")
    workdir = tmp_path / "w"
    prepare_data(folder, str(workdir), "word", vocabulary={"vocab_size": 8},
                 shard_tokens=1024)
    before = data_files(workdir)
    shutil.rmtree(workdir / "tokenizer")
    message = (rf"^{workdir / 'tokenizer'} is missing, but {workdir / 'data'} was encoded "
               r"with the tokenizer that was there: restore it .* or delete "
               rf"{workdir / 'data'} too to prepare again")
    written = []
    for kwargs in ({}, {"vocabulary": {"vocab_size": 8}}):
        with pytest.raises(ValueError, match=message):
            prepare_data(folder, str(workdir), after_shard=written.append, **kwargs)
    assert written == [] and data_files(workdir) == before
    assert not (workdir / "tokenizer").exists()
    # Deleting the data too starts over, as the message says.
    shutil.rmtree(workdir / "data")
    tokenizer, _ = prepare_data(folder, str(workdir), vocabulary={"vocab_size": 8})
    assert tokenizer.vocabulary_size() == 8


def test_a_wordpiece_vocabulary_larger_than_asked_is_said(caplog):
    # bert_vocab_from_dataset keeps every character (and its "##" form)
    # whatever vocab_size asks: --vocab-size 8 gave 36 tokens in silence, and
    # the docstring said the result could only be smaller.
    text = "the quick brown fox jumps over the lazy dog\n" * 20
    with caplog.at_level("WARNING"):
        tokenizer = build_tokenizer("wordpiece", [text], vocabulary_size=8)
    size = tokenizer.vocabulary_size()
    assert size > 8
    assert (f"the wordpiece vocabulary has {size} tokens, more than vocabulary_size=8"
            in caplog.text)
    caplog.clear()
    with caplog.at_level("WARNING"):
        build_tokenizer("wordpiece", [text], vocabulary_size=size + 50)
    assert "more than vocabulary_size" not in caplog.text


def test_a_tfds_version_after_the_name_is_a_version_not_a_config(tmp_path):
    # TFDS writes a pinned version as NAME:VERSION ("lm1b:1.1.0"), but
    # "tfds:NAME:X" always read X as a config: "tfds:mine:1.0.0" looked for
    # a config "1.0.0" and said the dataset was not found.
    import tensorflow as tf
    import tensorflow_datasets as tfds

    data_dir = tmp_path / "tfds"
    lines = {"train": [b"hello world"] * 5, "validation": [b"fine"], "test": [b"good"]}
    tfds.dataset_builders.store_as_tfds_dataset(
        name="pinned", version="1.0.0",
        features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
        split_datasets={s: tf.data.Dataset.from_tensor_slices(v).map(
            lambda line: {"text": line}) for s, v in lines.items()},
        data_dir=str(data_dir), disable_shuffling=True)
    for spec in ("tfds:pinned", "tfds:pinned:1.0.0", "tfds:pinned:1.*.*"):
        assert load_corpus(spec, data_dir=str(data_dir)).test == "good\n"
    assert corpora._parse_tfds_name("wiki40b:en:1.3.0") == "wiki40b/en:1.3.0"
    assert corpora._parse_tfds_name("wiki40b:en") == "wiki40b/en"
    assert corpora._parse_tfds_name("wiki40b/en:1.3.0") == "wiki40b/en:1.3.0"
    with pytest.raises(ValueError, match=r"TFDS dataset 'pinned:2\.0\.0' was not found"):
        load_corpus("tfds:pinned:2.0.0", data_dir=str(data_dir))


def test_prepare_data_names_shard_tokens_as_its_argument(tmp_path, capsys):
    # prepare_data(shard_tokens=10) said "--shard-tokens must be at least
    # 1024": a flag of the command line, not the argument the caller passed.
    folder = write_corpus(tmp_path / "c")
    for value, message in ((0, r"^`shard_tokens` must be a positive integer \(tokens per "
                               r"shard file\)\. Received: shard_tokens=0\.$"),
                           (True, r"^`shard_tokens` must be a positive integer .*"
                                  r"Received: shard_tokens=True\.$"),
                           (10, r"^`shard_tokens` must be at least 1024 .*Received: "
                                r"shard_tokens=10\. The default is 67108864\.$")):
        with pytest.raises(ValueError, match=message):
            prepare_data(folder, str(tmp_path / "w"), shard_tokens=value)
    assert main(["prepare", "--data", folder, "--workdir", str(tmp_path / "w"),
                 "--shard-tokens", "10"]) == 2
    assert "--shard-tokens must be at least 1024" in capsys.readouterr().err


def test_sentencepiece_says_that_its_space_symbol_in_text_decodes_as_a_space(caplog):
    # SentencePiece writes a space as U+2581 ("▁"), so the character itself
    # (block drawings, sparklines) decodes as a space: text changed in
    # silence.
    text = "snake▁case and a▁b with spaces\n" * 50
    with caplog.at_level("WARNING"):
        tokenizer = build_tokenizer("sentencepiece", [text], vocabulary_size=40)
    assert tokenizer.decode(tokenizer.encode("a▁b")) == "a b"
    assert ("the text holds U+2581 ('▁') 100 times: SentencePiece writes a space so, "
            "and decodes it as one") in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        build_tokenizer("sentencepiece", [text.replace("▁", "_")], vocabulary_size=40)
    assert "U+2581" not in caplog.text
