"""RECL (the paper's Appendix C) on loss curves worked out by hand, the
context-truncated losses on tiny random models, and `txl recl`."""

import json
import math

import numpy as np
import pytest
from testing import chain_segments
from testing import tiny_config

from keras_txl import TransformerXLCausalLM
from keras_txl.io import save_pretrained
from keras_txl.training.recl import context_losses
from keras_txl.training.recl import context_segments
from keras_txl.training.recl import hard_token_set
from keras_txl.training.recl import recl_table
from keras_txl.training.recl import recurrence_reach
from keras_txl.training.recl import relative_effective_context_length
from keras_txl.training.recl import relative_gains
from keras_txl.training.recl import spread_targets


def curve(*values, tokens=1):
    """(len(values), tokens) table: every token has the same loss curve."""
    return np.repeat(np.asarray(values, dtype=float)[:, None], tokens, axis=1)


# --- RECL on synthetic loss tables ----------------------------------------
def test_single_model_stops_where_the_curve_flattens():
    out = relative_effective_context_length(
        {"m": curve(2.0, 1.5, 1.2, 1.2, 1.0)}, [8, 16, 32, 64, 128]
    )["m"]
    # gains: 1 - e^-0.5, 1 - e^-0.3, 0 -> stop at 32 (the later drop at 128
    # is never reached: the walk stops at the first small gain).
    assert out["recl"] == 32 and not out["capped"]
    np.testing.assert_allclose(
        out["gains"][:3], [1 - math.exp(-0.5), 1 - math.exp(-0.3), 0.0]
    )


def test_group_baseline_is_the_best_short_context_loss():
    contexts = [10, 20, 30, 40]
    losses = {"a": curve(2.0, 1.5, 1.2, 1.2), "b": curve(1.8, 1.8, 1.8, 1.8)}
    out = relative_effective_context_length(losses, contexts)
    # b(10) = 1.8: a gains 1 - e^-0.3 twice, then nothing.
    assert out["a"]["recl"] == 30
    assert out["b"]["recl"] == 10
    np.testing.assert_allclose(out["a"]["gains"][0], 1 - math.exp(-0.3))


def test_a_model_bad_at_short_context_earns_nothing_for_catching_up():
    # "late" improves by a full nat, but only up to the group's baseline:
    # its ECL would be 200, its RECL is 100 (the point of Appendix C).
    losses = {"late": curve(3.0, 2.0), "early": curve(2.0, 2.0)}
    out = relative_effective_context_length(losses, [100, 200])
    assert out["late"]["recl"] == 100 and out["early"]["recl"] == 100
    alone = relative_effective_context_length({"late": curve(3.0, 2.0)}, [100, 200])
    assert alone["late"]["recl"] == 200 and alone["late"]["capped"]


def test_top_r_hard_tokens():
    # Token 0 is hard (5.0) and keeps gaining 0.1 nat per step; nine easy
    # tokens stay at 1.0.
    table = np.ones((4, 10))
    table[:, 0] = [5.0, 4.9, 4.8, 4.8]
    contexts = [1, 2, 3, 4]
    r01 = relative_effective_context_length({"m": table}, contexts, r=0.1)["m"]
    r10 = relative_effective_context_length({"m": table}, contexts, r=1.0)["m"]
    # r = 0.1 keeps token 0 only: gain 1 - e^-0.1 = 0.095, twice, then 0.
    assert r01["recl"] == 3
    # r = 1.0 averages the 0.1 nat over 10 tokens: 1 - e^-0.01 < 0.01.
    assert r10["gains"][0] == pytest.approx(1 - math.exp(-0.01))
    assert r10["recl"] == 1
    table_all = recl_table({"m": table}, contexts, ratios=(0.1, 0.5, 1.0))
    assert [table_all["m"][r]["recl"] for r in (0.1, 0.5, 1.0)] == [3, 3, 1]


def test_hard_set_follows_the_current_short_context():
    # Token a is the hardest at c0, token b at c1 (the paper picks the
    # top-r set from b(c, t) of each step's short context c).
    table = np.array([[3.0, 2.0], [1.0, 2.0], [1.0, 1.5]])  # (contexts, tokens)
    contexts = [1, 2, 3]
    current = relative_effective_context_length(
        {"m": table}, contexts, r=0.5, hard_set="current")["m"]
    initial = relative_effective_context_length(
        {"m": table}, contexts, r=0.5, hard_set="initial")["m"]
    np.testing.assert_allclose(
        current["gains"], [1 - math.exp(-2.0), 1 - math.exp(-0.5)])
    assert current["recl"] == 3 and current["capped"]
    np.testing.assert_allclose(initial["gains"], [1 - math.exp(-2.0), 0.0])
    assert initial["recl"] == 2 and not initial["capped"]


def test_vanilla_like_curve_has_its_window_as_recl():
    # A fixed-window model stops improving at its window (Table 8: the
    # Transformer's RECL is its training length, 128).
    contexts = [32, 64, 96, 128, 160, 192]
    xl = curve(2.0, 1.8, 1.7, 1.6, 1.55, 1.5)
    vanilla = curve(2.0, 1.8, 1.7, 1.65, 1.65, 1.65)
    out = relative_effective_context_length({"xl": xl, "vanilla": vanilla}, contexts)
    assert out["vanilla"]["recl"] == 128
    assert out["xl"]["recl"] == 192 and out["xl"]["capped"]


def test_threshold_is_inclusive():
    gain = 0.01
    loss = curve(1.0, 1.0 + math.log(1 - gain))  # exactly a 1% gain
    out = relative_effective_context_length({"m": loss}, [1, 2], threshold=gain)
    assert out["m"]["gains"][0] == pytest.approx(gain)
    assert out["m"]["recl"] == 2


def test_hard_token_set_counts_and_ties():
    baseline = np.array([1.0, 3.0, 3.0, 0.5, 2.0])
    assert list(hard_token_set(baseline, 0.2)) == [1]
    assert list(hard_token_set(baseline, 0.4)) == [1, 2]
    assert list(hard_token_set(baseline, 0.5)) == [1, 2, 4]  # ceil(2.5)
    assert list(hard_token_set(baseline, 1.0)) == [0, 1, 2, 3, 4]
    assert list(hard_token_set(baseline, 0.01)) == [1]  # at least one


@pytest.mark.parametrize("kwargs, message", [
    (dict(contexts=[8]), "at least two"),
    (dict(contexts=[16, 8]), "strictly increasing"),
    (dict(losses={"m": np.ones((3, 4))}), "shape"),
    (dict(losses={"m": np.ones((2, 4)), "n": np.ones((2, 5))}), "same tokens"),
    (dict(losses={"m": np.array([[1.0], [np.nan]])}), "NaN"),
    (dict(r=0.0), "r"),
    (dict(hard_set="best"), "hard_set"),
])
def test_errors(kwargs, message):
    args = dict(losses={"m": np.ones((2, 4))}, contexts=[8, 16])
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        relative_gains(**args)


def test_context_segments_and_targets():
    assert context_segments(70, 32) == [6, 32, 32]
    assert context_segments(64, 32) == [32, 32]
    assert context_segments(5, 32) == [5]
    targets = spread_targets(100, 10, 40)
    assert targets.min() == 40 and targets.max() == 99 and len(targets) == 10
    assert len(spread_targets(50, 100, 40)) == 10  # capped by what exists
    with pytest.raises(ValueError, match="no target"):
        spread_targets(40, 10, 40)


# --- context-truncated losses on tiny random models ----------------------
def tiny(memory_length, attention_type="relative", layers=2, segment=4):
    return TransformerXLCausalLM(tiny_config(
        hidden_dim=16, intermediate_dim=32, num_layers=layers,
        segment_length=segment, memory_length=memory_length,
        attention_type=attention_type,
    ))


TOKENS = np.random.default_rng(3).integers(0, 11, size=80).astype(np.int32)


def test_context_losses_match_manual_segment_reading():
    model = tiny(memory_length=3)
    targets = np.array([30, 41, 57])
    context = 10  # segments [2, 4, 4]
    got = context_losses(model, TOKENS, targets, context)
    for k, t in enumerate(targets):
        window = TOKENS[t - context:t][None, :]
        log_probs = chain_segments(model, window, [2, 4, 4]).log_probs
        expected = -float(log_probs[0, -1, TOKENS[t]])
        assert got[k] == pytest.approx(expected, abs=1e-5)


def test_no_memory_is_a_sliding_window_capped_at_the_segment():
    model = tiny(memory_length=0, attention_type="vanilla")
    targets = np.arange(20, 30)
    at_3 = context_losses(model, TOKENS, targets, 3)
    window = np.stack([TOKENS[t - 3:t] for t in targets])
    log_probs = model.call_with_memory(window)["log_probs"].numpy()
    np.testing.assert_allclose(
        at_3, -log_probs[np.arange(10), -1, TOKENS[targets]], atol=1e-5)
    # Longer contexts change nothing beyond the window T = 4 (c = 4 .. 12).
    at_4 = context_losses(model, TOKENS, targets, 4)
    np.testing.assert_allclose(context_losses(model, TOKENS, targets, 12), at_4,
                               atol=1e-6)
    assert np.abs(at_4 - at_3).max() > 1e-4


def test_xl_losses_stop_changing_beyond_the_recurrence_reach():
    # L = 2, M = T = 4: the scored token (index T - 1) reaches
    # 3 + 4 + 4 = 11 tokens back, so every c >= 12 gives the same loss
    # and c = 11 does not.
    model = tiny(memory_length=4)
    reach = recurrence_reach(2, 4, 4, position=3)
    assert reach == 11
    targets = np.arange(40, 60)
    beyond = context_losses(model, TOKENS, targets, reach + 1)
    np.testing.assert_allclose(context_losses(model, TOKENS, targets, 28),
                               beyond, atol=1e-6)
    assert np.abs(context_losses(model, TOKENS, targets, reach) - beyond).max() > 1e-5


def test_context_losses_checks_targets():
    with pytest.raises(ValueError, match="context"):
        context_losses(tiny(0), TOKENS, np.array([2]), 5)


# --- txl recl ---------------------------------------------------------------
def test_txl_recl_command(tmp_path, capsys):
    from keras_txl.cli import main

    workdirs = []
    for name, model in (("xl", tiny(4)), ("vanilla", tiny(0, "vanilla"))):
        workdir = tmp_path / name
        save_pretrained(model, str(workdir / "model"))
        (workdir / "data").mkdir()
        np.save(workdir / "data" / "test.npy", TOKENS)
        workdirs.append(str(workdir))
    out = tmp_path / "recl.json"
    code = main(["recl", "--workdirs", *workdirs, "--contexts", "2", "4", "8",
                 "--targets", "16", "--r", "0.5", "1.0", "--out", str(out)])
    assert code == 0
    line = capsys.readouterr().out.splitlines()[0]
    printed = json.loads(line)
    assert set(printed) >= {"xl", "vanilla", "contexts", "targets"}
    assert printed["contexts"] == [2, 4, 8] and printed["targets"] == 16
    full = json.loads(out.read_text())
    assert set(full["recl"]["xl"]) == {"0.5", "1.0"}
    assert all(v in (2, 4, 8) for v in full["recl"]["vanilla"].values())
    assert len(full["mean_bpc"]["xl"]) == 3
    losses = np.load(tmp_path / "recl_losses.npz")
    assert losses["xl"].shape == (3, 16)
    # Same name twice is an error naming the fix.
    code = main(["recl", "--workdirs", workdirs[0], workdirs[0]])
    assert code == 2
    assert "NAME=PATH" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--batch-size", "-1"], "--batch-size must be a positive integer, received -1"),
    (["--batch-size", "0"], "--batch-size must be a positive integer, received 0"),
    (["--threshold", "nan"], "--threshold must be a relative gain in [0, 1)"),
    (["--threshold", "-0.5"], "--threshold must be a relative gain in [0, 1)"),
    (["--segment-length", "0"], "--segment-length must be a positive integer"),
    (["--max-window", "-4"], "--max-window must be a positive integer"),
    (["--memory-length", "-2"], "--memory-length must be an integer >= 0"),
    (["--contexts", "0", "8"], "--contexts must be context lengths >= 1"),
    (["--contexts", "8", "8"], "--contexts must be at least two different"),
    (["--r", "0"], "--r must be fractions in (0, 1]"),
    (["--r", "0.5", "nan"], "--r must be fractions in (0, 1]"),
    # Found when the result was written, after every loss table.
    (["--out", "{tmp}/no_such_folder/recl.json"], "no_such_folder does not exist"),
    (["--out", "{tmp}"], "is a folder: pass the result file's name"),
])
def test_txl_recl_names_a_bad_flag_before_reading_anything(tmp_path, capsys, flags,
                                                          message):
    # A --batch-size below 1 scored no window and gave RECL from np.empty's
    # bytes; NaN thresholds capped every model; --segment-length 0 meant the
    # default; a bad --r or --contexts was found after minutes of scoring.
    from keras_txl.cli import main

    missing = str(tmp_path / "never_read")
    flags = [flag.replace("{tmp}", str(tmp_path)) for flag in flags]
    assert main(["recl", "--workdirs", missing, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "never_read" not in err


def test_context_losses_refuses_a_batch_that_scores_nothing():
    model = tiny(memory_length=3)
    targets = np.array([30, 41])
    for batch_size in (0, -1):
        with pytest.raises(ValueError, match="`batch_size` must be a positive integer"):
            context_losses(model, TOKENS, targets, 8, batch_size=batch_size)
    with pytest.raises(ValueError, match="`segment_length` must be a positive integer"):
        context_losses(model, TOKENS, targets, 8, segment_length=0)
    with pytest.raises(ValueError, match="`threshold` must be a finite number"):
        relative_effective_context_length({"m": curve(2.0, 1.0)}, [8, 16],
                                          threshold=float("nan"))
