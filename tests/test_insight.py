"""Insight pictures: `txl attention` writes valid PNGs of the expected size;
the numbers behind them are right on small hand-checked cases."""

import json
import os
import struct
from functools import partial

import numpy as np
import pytest
from testing import tiny_config

from keras_txl import TransformerXLCausalLM
from keras_txl import insight
from keras_txl.cli import main

TEXT = "the cat sat on the mat. " * 6


# The toolkit's tiny model with adaptive input and softmax, T = M = 8.
tiny = partial(tiny_config, adaptive=True, segment_length=8, memory_length=8)


def png_size(path):
    """(width, height) of a PNG, after checking it decodes completely."""
    from PIL import Image

    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert head[12:16] == b"IHDR"
    with Image.open(path) as image:
        image.load()  # decodes every chunk (checks CRCs and the data)
        assert image.size == struct.unpack(">II", head[16:24])
        return image.size


def expected_size(kind):
    width, height = insight.FIGURE_SIZES[kind]
    return round(width * insight.DPI), round(height * insight.DPI)


def test_txl_attention_writes_the_pictures(tmp_path, capsys):
    from keras_txl.io import save_pretrained
    from keras_txl.tokenizers import CharTokenizer

    tokenizer = CharTokenizer.fit([TEXT])
    config = tiny(vocabulary_size=tokenizer.vocabulary_size())
    save_pretrained(TransformerXLCausalLM(config), str(tmp_path / "run" / "model"),
                    tokenizer=tokenizer)
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    out = tmp_path / "pictures"
    assert main(["attention", "--workdir", str(tmp_path / "run"), "--text",
                 str(text), "--out", str(out), "--layers", "0,1", "--heads",
                 "1"]) == 0
    printed = capsys.readouterr().out.split()
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([
        "attention_layer0_head1.png", "attention_layer1_head1.png",
        "distance_layer0.png", "distance_layer1.png",
        "loss_by_position.png", "insight.json",
    ])
    assert sorted(printed) == sorted(str(out / name) for name in names)
    for name in names:
        if name.startswith("attention_"):
            assert png_size(out / name) == expected_size("head")
        elif name.startswith("distance_"):
            assert png_size(out / name) == expected_size("distance")
        elif name == "loss_by_position.png":
            assert png_size(out / name) == expected_size("loss")
    summary = json.loads((out / "insight.json").read_text())
    # 143 inputs -> 17 segments of 8; the first is left out of the means.
    assert summary["num_segments"] == 16 and summary["segment"] == 1
    assert len(summary["loss_with_memory"]) == 8
    assert np.all(np.isfinite(summary["loss_without_memory"]))
    # A byte order mark before the text is not read as text.
    bom = tmp_path / "bom.txt"
    bom.write_bytes(b"\xef\xbb\xbf" + TEXT.encode("utf-8"))
    assert main(["attention", "--workdir", str(tmp_path / "run"), "--text", str(bom),
                 "--out", str(tmp_path / "bom_pictures"), "--layers", "0,1", "--heads",
                 "1"]) == 0
    capsys.readouterr()
    assert json.loads((tmp_path / "bom_pictures" / "insight.json").read_text()) == summary

    assert main(["attention", "--workdir", str(tmp_path / "run"), "--text",
                 str(text), "--out", str(out), "--heads", "2"]) == 2
    assert "--heads must be in [0, 2)" in capsys.readouterr().err


def test_segment_attention_probabilities_and_terms():
    model = TransformerXLCausalLM(tiny(memory_length=5))
    ids = np.arange(40) % 11
    details = insight.segment_attention(model, ids)
    assert details["segment"] == 1  # the first with a full memory (5 <= 8)
    probabilities = details["probabilities"]
    assert probabilities.shape == (2, 2, 8, 13)
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, atol=1e-5)
    assert not np.any(probabilities[..., ~details["mask"]])
    np.testing.assert_array_equal(details["keys"], np.r_[ids[3:8], ids[8:16]])
    for name in ("term_a", "term_b", "term_d"):
        assert details[name].shape == probabilities.shape
    # (d) depends only on the distance i - j: constant along diagonals.
    term_d = details["term_d"][0, 0]
    np.testing.assert_allclose(term_d[1, 1:], term_d[0, :-1], atol=1e-6)
    # Segment 0 has no text in memory yet.
    first = insight.segment_attention(model, ids, segment=0)
    assert np.all(first["keys"][:5] == -1)
    with pytest.raises(ValueError, match="segment"):
        insight.segment_attention(model, ids, segment=5)


def test_by_distance_on_a_hand_computed_case():
    # T=2 queries, M=1: query i sits at key 1 + i; distance = 1 + i - j.
    values = np.array([[[1.0, 2.0, 99.0], [3.0, 4.0, 5.0]]])  # (N=1, T, K)
    mask = np.array([[True, True, False], [True, True, True]])
    out = insight.by_distance(values, mask, memory_length=1)
    # d=0: (0,1)=2, (1,2)=5; d=1: (0,0)=1, (1,1)=4; d=2: (1,0)=3.
    np.testing.assert_allclose(out, [[3.5, 2.5, 3.0]])


def test_loss_by_position_without_memory_is_the_same_model_with_m_0():
    ids = np.arange(50) % 11
    model = TransformerXLCausalLM(tiny(memory_length=0))
    losses = insight.loss_by_position(model, ids)
    assert losses["with_memory"].shape == (8,) and losses["num_segments"] == 5
    np.testing.assert_allclose(losses["with_memory"],
                               losses["without_memory"], atol=1e-5)


def test_pictures_of_a_vanilla_model(tmp_path):
    model = TransformerXLCausalLM(tiny(attention_type="vanilla"))
    paths = insight.attention_report(model, np.arange(30) % 11, str(tmp_path),
                                     layers=[1], heads=[0, 1])
    assert len(paths) == 5  # 2 heads, 1 distance view, 1 loss, the json
    for path in paths[:-1]:
        png_size(path)
    with pytest.raises(ValueError, match="layers"):
        insight.attention_report(model, np.arange(30) % 11, str(tmp_path),
                                 layers=[2])


def test_a_picture_that_fails_midway_leaves_the_previous_one(tmp_path, monkeypatch):
    # savefig wrote into the picture's own path: a run killed while drawing
    # left a cut PNG in place of the previous one.
    from matplotlib.figure import Figure

    model = TransformerXLCausalLM(tiny())
    paths = insight.attention_report(model, np.arange(30) % 11, str(tmp_path))
    before = {p: open(p, "rb").read() for p in paths}
    original = Figure.savefig

    def cut(self, target, **kwargs):
        original(self, target, **kwargs)
        if hasattr(target, "truncate"):
            target.truncate(100)
        else:
            with open(target, "r+b") as f:
                f.truncate(100)
        raise KeyboardInterrupt("killed while drawing")

    monkeypatch.setattr(Figure, "savefig", cut)
    with pytest.raises(KeyboardInterrupt):
        insight.attention_report(model, (np.arange(30) + 1) % 11, str(tmp_path))
    assert {p: open(p, "rb").read() for p in paths} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        os.path.basename(p) for p in paths)  # no temporary left


def _char_run(tmp_path):
    from keras_txl.io import save_pretrained
    from keras_txl.tokenizers import CharTokenizer

    tokenizer = CharTokenizer.fit([TEXT])
    config = tiny(vocabulary_size=tokenizer.vocabulary_size())
    save_pretrained(TransformerXLCausalLM(config), str(tmp_path / "run" / "model"),
                    tokenizer=tokenizer)
    return str(tmp_path / "run")


def test_txl_attention_refuses_a_text_too_short_to_picture_before_writing(
        tmp_path, capsys):
    # An empty text was "`token_ids` is empty" (no flag named); a one-token text
    # wrote the attention PNGs, then failed on the loss: a half-written --out.
    run = _char_run(tmp_path)
    for name, text in (("empty", ""), ("one", "t")):
        path = tmp_path / f"{name}.txt"
        path.write_text(text)
        out = tmp_path / f"out_{name}"
        assert main(["attention", "--workdir", run, "--text", str(path),
                     "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"--text {str(path)!r} encodes to {len(text)} token(s)" in err
        assert not out.exists()
    # The API writes nothing either (a bad segment, a text of one token).
    model = TransformerXLCausalLM(tiny(vocabulary_size=13))
    for ids, segment in (([3], None), (np.arange(30) % 13, 9)):
        with pytest.raises(ValueError):
            insight.attention_report(model, ids, str(tmp_path / "api"), segment=segment)
        assert not (tmp_path / "api").exists()


def test_txl_attention_warns_when_the_text_is_mostly_unknown(tmp_path, capsys, caplog):
    # eval --data warns from 1 % of <unk>; the pictures of a text the tokenizer
    # never saw were drawn over <unk> in silence.
    run = _char_run(tmp_path)
    path = tmp_path / "unknown.txt"
    path.write_text("xyz qwk " * 4 + TEXT[:40])
    with caplog.at_level("WARNING"):
        assert main(["attention", "--workdir", run, "--text", str(path),
                     "--out", str(tmp_path / "out")]) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert f"of the 72 scored tokens of --text {path} are <unk>" in warnings[0]
    assert "the pictures show the model reading that token" in warnings[0]
    caplog.clear()
    path.write_text(TEXT)
    with caplog.at_level("WARNING"):
        assert main(["attention", "--workdir", run, "--text", str(path),
                     "--out", str(tmp_path / "out")]) == 0
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
