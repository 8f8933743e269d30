"""The custom loop, the fit path, checkpoints and evaluation, in-process."""

import math
import os
from functools import partial

import numpy as np
import pytest
import tensorflow as tf
from testing import chain_segments
from testing import mirrored_strategy
from testing import tiny_config

import keras_txl
from keras_txl.training.checkpoint import CheckpointManager
from keras_txl.training.config import TrainConfig
from keras_txl.training.data import batchify
from keras_txl.training.fit import train_with_fit
from keras_txl.training.loop import Trainer
from keras_txl.training.loop import evaluate

V = 40


# The toolkit's tiny model, wider and with the library's dropout and
# initial scale for training.
model_config = partial(tiny_config, vocabulary_size=V, hidden_dim=16, intermediate_dim=32,
                       segment_length=8, memory_length=8, dropout=0.1, init_std=0.02)


def train_config(**changes):
    base = dict(batch_size=4, steps=6, learning_rate=3e-3, warmup_steps=2,
                log_every=1, checkpoint_every=0, clip_norm=0.25)
    base.update(changes)
    return TrainConfig(**base)


def corpus(n=3000, seed=0):
    return np.random.default_rng(seed).integers(0, V, n).astype("int32")


def mirrored():
    return mirrored_strategy()


def test_mirrored_first_steps_equal_the_default_strategy():
    # Same global batch; each replica carries its own half of the memory;
    # clipping is active (0.25). Dropout is off: each replica draws its own
    # masks, so with dropout the runs are equal in distribution only.
    tokens = corpus()
    cfg = model_config(dropout=0.0)
    default = Trainer(cfg, train_config(steps=3), tf.distribute.get_strategy(),
                      verbose=False).train(tokens)
    two = Trainer(cfg, train_config(steps=3), mirrored(), verbose=False)
    losses = two.train(tokens)
    np.testing.assert_allclose(losses, default, rtol=1e-5)
    assert two.memory_numpy().shape == (4, 2, 8, 16)


def test_batch_must_divide_over_replicas_and_corpus_must_be_long_enough():
    with pytest.raises(ValueError, match="batch_size=3 is not divisible by the 2 replicas"):
        Trainer(model_config(), train_config(batch_size=3), mirrored(), verbose=False)
    trainer = Trainer(model_config(), train_config(), tf.distribute.get_strategy(),
                      verbose=False)
    with pytest.raises(ValueError, match="8 per stream for batch_size=4, but "
                       "segment_length=8 needs at least 9"):
        trainer.train(corpus(33))
    with pytest.raises(ValueError, match="empty"):
        trainer.train(np.zeros((0,), "int32"))


def test_resume_gives_the_same_losses_as_an_uninterrupted_run(tmp_path):
    tokens = corpus()
    cfg = train_config(steps=6, checkpoint_every=3)
    straight = Trainer(model_config(), cfg, tf.distribute.get_strategy(),
                       workdir=str(tmp_path / "a"), verbose=False).train(tokens)
    first = Trainer(model_config(), cfg, tf.distribute.get_strategy(),
                    workdir=str(tmp_path / "b"), verbose=False)
    first.train(tokens, steps=3)
    # A new process would start here: a fresh trainer restores step 3.
    second = Trainer(model_config(), cfg, tf.distribute.get_strategy(),
                     workdir=str(tmp_path / "b"), verbose=False)
    assert second.restore() == 3
    resumed = second.train(tokens)
    np.testing.assert_allclose(resumed, straight[3:], rtol=1e-6)
    manager = CheckpointManager(str(tmp_path / "b" / "checkpoints"), keep=3)
    assert [os.path.basename(p) for p in manager.checkpoints()] == [
        "ckpt-00000003", "ckpt-00000006"]
    assert os.path.exists(tmp_path / "b" / "model" / "model.weights.h5")


def test_checkpoint_of_another_config_is_refused(tmp_path):
    tokens = corpus()
    Trainer(model_config(), train_config(steps=2), tf.distribute.get_strategy(),
            workdir=str(tmp_path), verbose=False).train(tokens)
    other = Trainer(model_config(intermediate_dim=24), train_config(steps=2),
                    tf.distribute.get_strategy(), workdir=str(tmp_path), verbose=False)
    with pytest.raises(ValueError, match="another model config"):
        other.restore()


def test_keep_last_checkpoints_and_ignore_half_written_ones(tmp_path):
    trainer = Trainer(model_config(), train_config(steps=5, checkpoint_every=1,
                                                   keep_checkpoints=2),
                      tf.distribute.get_strategy(), workdir=str(tmp_path), verbose=False)
    trainer.train(corpus())
    manager = trainer.checkpoints
    assert [os.path.basename(p) for p in manager.checkpoints()] == [
        "ckpt-00000004", "ckpt-00000005"]
    # A writer killed before state.json: the folder is not a checkpoint.
    os.makedirs(os.path.join(manager.directory, "ckpt-00000009"))
    assert os.path.basename(manager.latest()) == "ckpt-00000005"
    os.remove(os.path.join(manager.directory, "latest.json"))
    assert os.path.basename(manager.latest()) == "ckpt-00000005"


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    trainer = Trainer(model_config(), train_config(steps=6, checkpoint_every=2),
                      tf.distribute.get_strategy(), workdir=str(tmp_path), verbose=False)
    trainer.train(corpus(), steps=2)
    kernel = trainer.model.backbone.blocks[0].output_dense.kernel
    kernel.assign(np.full(kernel.shape, np.nan, "float32"))
    with pytest.raises(FloatingPointError, match="Non-finite loss .* at step 3.*ckpt-00000002"):
        trainer.train(corpus())
    assert os.path.basename(trainer.checkpoints.latest()) == "ckpt-00000002"


def test_skip_mode_keeps_training_after_a_bad_step():
    trainer = Trainer(model_config(), train_config(steps=4, on_non_finite="skip"),
                      tf.distribute.get_strategy(), verbose=False)
    trainer.train(corpus(), steps=1)
    table = trainer.model.backbone.token_embedding.tables[0]
    good = table.numpy()
    table.assign(np.where(np.arange(V)[:, None] == 0, np.inf, good).astype("float32"))
    losses = trainer.train(corpus(), steps=2)
    assert not math.isfinite(losses[-1])
    # A zero update: the weights other than the poisoned row stay finite.
    assert np.isfinite(trainer.model.backbone.blocks[0].output_dense.kernel.numpy()).all()


def copy_task(num_blocks, T, seed):
    """Random blocks of length T each followed by an exact copy: the copy of
    a block sits in the next segment, so only the memory can predict it."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(1, V, size=(num_blocks, T))
    return np.concatenate([np.concatenate([b, b]) for b in blocks]).astype("int32")


def test_memory_beats_no_memory_on_dependencies_across_segments():
    T, B = 8, 8
    cfg = model_config(segment_length=T, memory_length=T, dropout=0.0,
                       hidden_dim=32, intermediate_dim=64)
    # 60 block pairs per stream: the B streams stay aligned with segments.
    trainer = Trainer(cfg, train_config(batch_size=B, steps=400, learning_rate=5e-3,
                                        warmup_steps=20, log_every=1000),
                      tf.distribute.get_strategy(), verbose=False)
    trainer.train(copy_task(B * 60, T, seed=1))
    test = copy_task(64, T, seed=2)
    with_memory = evaluate(trainer.model, test)
    without = evaluate(trainer.model, test, reset_every_segment=True)
    assert with_memory["tokens"] == without["tokens"] == len(test) - 1
    # Half of the tokens are copies of the previous segment: only a model
    # that reads its memory can predict them (measured: 2.90 vs 4.16 nats).
    assert with_memory["loss"] < without["loss"] - 0.5, (with_memory, without)


def test_evaluate_with_a_longer_memory_and_other_settings():
    model = keras_txl.TransformerXLCausalLM(model_config(dropout=0.0))
    tokens = corpus(500)
    base = evaluate(model, tokens, batch_size=2)
    longer = evaluate(model, tokens, batch_size=2, memory_length=24, clamp_length=10,
                      same_length=True, segment_length=4)
    assert base["tokens"] == longer["tokens"] == 2 * 249
    assert math.isfinite(longer["loss"]) and longer["loss"] != base["loss"]
    assert base["bpc"] == pytest.approx(base["loss"] / math.log(2))
    assert model.txl_config.memory_length == 8  # the model itself is untouched
    with pytest.raises(ValueError, match="segment_length` must be a positive integer"):
        evaluate(model, tokens, segment_length=0)
    # The last token is only a target: still checked, with the argument named.
    bad = tokens.copy()
    bad[-1] = V
    with pytest.raises(ValueError, match=r"`tokens` must be ids in \[0, 40\).*found 40"):
        evaluate(model, bad)
    with pytest.raises(ValueError, match="`tokens` must be a 1-D array of integer"):
        evaluate(model, tokens.reshape(2, -1))
    with pytest.raises(TypeError, match="`reuse` must be a dict"):
        evaluate(model, tokens, reuse=[])


def _evaluate_by_recomputing_the_memory(model, tokens, batch_size, T, reset=False):
    # The plain way: call_with_memory on every segment, memory carried.
    streams = batchify(tokens, batch_size)
    chain = chain_segments(model, streams[:, :-1], T, carry_memory=not reset)
    y = streams[:, 1:]
    nll = -np.take_along_axis(chain.log_probs, y[..., None], -1)
    return nll.sum(dtype=np.float64) / y.size, y.size


@pytest.mark.parametrize("attention_type,pre_ln,reset", [
    ("relative", False, False), ("relative", True, False),
    ("vanilla", False, False), ("relative", False, True),
])
def test_evaluate_with_the_cache_equals_recomputing_the_memory(attention_type, pre_ln, reset):
    # 203 tokens in 2 streams of 101: 12 segments of 8 then a shorter one.
    model = keras_txl.TransformerXLCausalLM(model_config(
        dropout=0.0, attention_type=attention_type, pre_layer_norm=pre_ln))
    tokens = corpus(203, seed=5)
    result = evaluate(model, tokens, batch_size=2, reset_every_segment=reset)
    expected, count = _evaluate_by_recomputing_the_memory(model, tokens, 2, 8, reset)
    assert result["tokens"] == count == 200
    np.testing.assert_allclose(result["loss"], expected, rtol=2e-6)


def test_evaluate_under_xla_equals_recomputing_the_memory_and_auto_follows_the_keys(
        monkeypatch):
    import keras_txl.training.loop as loop
    from keras_txl.training.loop import EVAL_JIT_MIN_KEYS
    from keras_txl.training.loop import eval_jit_compile

    tokens = corpus(203, seed=5)
    # The plain softmax, and the adaptive one with masked empty memory slots.
    for changes in ({}, {"cutoffs": (10, 20), "div_val": 2, "empty_memory": "masked"}):
        model = keras_txl.TransformerXLCausalLM(model_config(dropout=0.0, **changes))
        result = evaluate(model, tokens, batch_size=2, jit_compile=True)
        expected, count = _evaluate_by_recomputing_the_memory(model, tokens, 2, 8)
        assert result["tokens"] == count == 200
        np.testing.assert_allclose(result["loss"], expected, rtol=1e-5, err_msg=str(changes))
    model = keras_txl.TransformerXLCausalLM(model_config(dropout=0.0))
    # "auto" on a CPU with AVX-512: graph mode for this short memory, XLA from
    # EVAL_JIT_MIN_KEYS keys; with Eigen's kernels (oneDNN off) XLA at any length.
    monkeypatch.setattr(loop, "xla_evaluation_pays", lambda: False)
    assert eval_jit_compile(model) is False
    long = keras_txl.TransformerXLCausalLM(model_config(
        dropout=0.0, memory_length=EVAL_JIT_MIN_KEYS - 8))
    assert eval_jit_compile(long) is True
    assert eval_jit_compile(long, False) is False
    monkeypatch.setattr(loop, "xla_evaluation_pays", lambda: True)
    assert eval_jit_compile(model) is True
    assert eval_jit_compile(model, False) is False
    with pytest.raises(ValueError, match="`jit_compile` must be 'auto', True or False"):
        evaluate(model, tokens, jit_compile="yes")


def _xla_compiled_calls(graph):
    return [op for op in graph.get_operations()
            if op.type in ("StatefulPartitionedCall", "PartitionedCall")
            and op.get_attr("_XlaMustCompile")]


@pytest.mark.parametrize("pre_ln", [False, True])
def test_the_evaluation_step_fuses_its_element_wise_kernels_and_nothing_else_does(pre_ln):
    # Graph-mode evaluation: each layer norm (with the residual sum in front
    # of it) and each layer's masked scores are one XLA-compiled call, three
    # per layer, and the result is the plain path's; the whole step under
    # XLA has no nested ones, and the model traced outside the evaluation
    # step (as exports trace it) none.
    from keras_txl.training.loop import make_eval_step

    model = keras_txl.TransformerXLCausalLM(model_config(dropout=0.0, pre_layer_norm=pre_ln))
    cfg = model.txl_config
    tokens = corpus(2 * 8 + 1, seed=3)
    x, y = tf.constant(tokens[None, :16].reshape(2, 8)), tf.constant(tokens[None, 1:17].reshape(2, 8))
    cache = model.build_cache(batch_size=2, segment_length=8)
    step = make_eval_step(model, jit_compile=False)
    graph = step.get_concrete_function(x, y, cache).graph
    # Two norms per layer (pre-LN: the segment's and the feed-forward's; the
    # memory's keys are cached) and the scores.
    assert len(_xla_compiled_calls(graph)) == 3 * cfg.num_layers
    nll, _ = step(x, y, cache)
    expected = model.call_with_cache(x, cache)["log_probs"].numpy()
    expected = -np.take_along_axis(expected, y.numpy()[..., None], -1)[..., 0]
    np.testing.assert_allclose(nll.numpy(), expected, atol=1e-5)
    whole = make_eval_step(model, jit_compile=True)
    assert not _xla_compiled_calls(whole.get_concrete_function(x, y, cache).graph)
    plain = tf.function(model.call_with_cache).get_concrete_function(x, cache)
    assert not _xla_compiled_calls(plain.graph)


@pytest.mark.parametrize("use_mirrored", [False, True])
def test_periodic_evaluation_reuses_one_compiled_step(use_mirrored):
    # Three evaluations during training: the evaluation step is traced once
    # (plus once for the last, shorter segment) and sees the current weights.
    strategy = mirrored() if use_mirrored else tf.distribute.get_strategy()
    trainer = Trainer(model_config(), train_config(steps=6, eval_every=2), strategy,
                      verbose=False)
    valid = corpus(150, seed=4)  # 149 targets: 18 segments of 8 and one of 5
    trainer.train(corpus(), valid_tokens=valid)
    evaluations = [h for h in trainer.history if h.get("split") == "valid"]
    assert [h["step"] for h in evaluations] == [2, 4, 6]
    (source, eval_model, step), = trainer._eval_reuse.values()
    assert eval_model is trainer.model
    assert step.experimental_get_tracing_count() == 2
    # The last result is the model's current loss on the split.
    fresh = evaluate(trainer.model, valid)
    assert evaluations[-1]["loss"] == pytest.approx(fresh["loss"], rel=1e-5)
    assert len({round(h["loss"], 6) for h in evaluations}) == 3


def test_evaluate_reuse_with_other_settings_follows_the_weights():
    model = keras_txl.TransformerXLCausalLM(model_config(dropout=0.0))
    tokens = corpus(300, seed=6)
    reuse = {}
    first = evaluate(model, tokens, memory_length=16, reuse=reuse)
    for w in model.model_weights():
        w.assign(w.numpy() * 0.5)
    second = evaluate(model, tokens, memory_length=16, reuse=reuse)
    (source, copy, step), = reuse.values()
    assert source is model
    assert copy is not model and copy.txl_config.memory_length == 16
    assert step.experimental_get_tracing_count() == 2  # full + last short segment
    assert second["loss"] != first["loss"]
    assert second["loss"] == pytest.approx(evaluate(model, tokens, memory_length=16)["loss"],
                                           rel=1e-6)


@pytest.mark.parametrize("use_mirrored", [False, True])
def test_fit_trains_the_stateful_model(tmp_path, use_mirrored):
    strategy = mirrored() if use_mirrored else tf.distribute.get_strategy()
    tokens = corpus(4000)
    model, history = train_with_fit(
        model_config(dropout=0.0), train_config(steps=30, learning_rate=1e-2),
        strategy, tokens, valid_tokens=corpus(600, seed=3),
        workdir=str(tmp_path), verbose=0)
    assert set(history.history) >= {"loss", "ppl", "bpc", "val_loss", "val_ppl"}
    assert history.history["ppl"][-1] == pytest.approx(math.exp(history.history["loss"][-1]), rel=1e-4)
    assert os.path.exists(tmp_path / "model" / "model.weights.h5")
    assert os.path.basename(CheckpointManager(str(tmp_path / "checkpoints")).latest()) == "ckpt-00000030"


@pytest.mark.parametrize("changes", [{}, {"cutoffs": (10, 20), "div_val": 2}])
def test_xla_compiled_train_step_matches_the_graph_step(changes):
    # The TPU path compiles the step with XLA and needs static shapes; on
    # the default strategy the same step must compile and agree (with an
    # adaptive softmax too: its tails' rows in static buckets under XLA).
    tokens = corpus()
    cfg = model_config(dropout=0.0, **changes)
    plain = Trainer(cfg, train_config(steps=3), tf.distribute.get_strategy(),
                    verbose=False).train(tokens)
    xla = Trainer(cfg, train_config(steps=3, jit_compile=True),
                  tf.distribute.get_strategy(), verbose=False)
    np.testing.assert_allclose(xla.train(tokens), plain, rtol=1e-4)


@pytest.mark.parametrize("changes, empty_shape", [
    # cutoffs[-1] == V, as the official data_utils writes for some vocabularies:
    # a cluster of no tokens.
    ({"cutoffs": (10, V), "div_val": 2}, (0, 4)),
    # E // div_val**i == 0, as the official code builds it: its tokens embed to
    # zero and score by their bias.
    ({"cutoffs": (10, 20, 30), "div_val": 4, "embedding_dim": 16}, (10, 0)),
])
def test_an_empty_or_zero_wide_last_cluster_trains_evaluates_and_generates(
        changes, empty_shape, tmp_path):
    # Their (.., 0) and 0-deep matmuls aborted the process inside oneDNN in
    # graph mode; their unreached weights had None gradients in the custom loop.
    cfg = model_config(dropout=0.0, **changes)
    tokens = corpus(2000)
    # The custom loop in graph mode (XLA, which does not run these products
    # through oneDNN, trained them before).
    losses = Trainer(cfg, train_config(steps=3), tf.distribute.get_strategy(),
                     verbose=False).train(tokens)
    assert np.isfinite(losses).all()
    model, history = train_with_fit(cfg, train_config(steps=4), tf.distribute.get_strategy(),
                                    tokens, workdir=str(tmp_path), verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    last_table = model.backbone.token_embedding.tables[-1]
    assert tuple(last_table.shape) == empty_shape
    result = evaluate(model, tokens[:203], batch_size=2)
    expected, _ = _evaluate_by_recomputing_the_memory(model, tokens[:203], 2, 8)
    np.testing.assert_allclose(result["loss"], expected, rtol=1e-5)
    from keras_txl.generation import generate_ids

    out = generate_ids(model.with_settings(stateful=False), [[1, 2, 3]], 5, seed=0)
    assert out[0].shape == (5,) and out[0].max() < V
