"""Hostile inputs and damaged files for keras_txl/tokenizers.py."""

import json
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
