"""TransformerXLCausalLM: pure vs stateful, gradients, errors, saving, XLA,
mixed precision, distribution."""

from functools import partial

import keras
import numpy as np
import pytest
import tensorflow as tf
from testing import chain_segments
from testing import mirrored_strategy
from testing import random_ids
from testing import run_model_saving_test
from testing import tiny_config

import keras_txl
from keras_txl import TransformerXLCausalLM

B, T, M, V = 2, 4, 4, 11


# The toolkit's tiny model (V 11, 2 layers, D 8, T = M = 4) with adaptive
# input and softmax.
tiny = partial(tiny_config, adaptive=True)


def segments(n=3, seed=0):
    """n segments (B, T) of one random text."""
    return np.split(random_ids((B, n * T), V, seed), n, axis=1)


CONFIG_VARIANTS = {
    "post_ln": {},
    "pre_ln": {"pre_layer_norm": True},
    "same_length_tf": {"same_length": True, "same_length_convention": "official_tf"},
    "same_length_pt": {"same_length": True, "same_length_convention": "pytorch"},
    "vanilla": {"attention_type": "vanilla"},
    "memory_0": {"memory_length": 0},
    "clamp_1": {"clamp_length": 1, "untie_relative_bias": True},
    "plain_softmax": {"cutoffs": (), "div_val": 1},
}


@pytest.mark.parametrize("variant", sorted(CONFIG_VARIANTS))
def test_stateful_model_equals_chained_pure_calls(variant):
    config = tiny(**CONFIG_VARIANTS[variant])
    pure = TransformerXLCausalLM(config)
    stateful = TransformerXLCausalLM(config, stateful=True, batch_size=B)
    stateful.assign_weights_from(pure)
    segs = segments()
    chain = chain_segments(pure, np.concatenate(segs, 1), T)
    for seg, out in zip(segs, chain.outputs):
        np.testing.assert_allclose(stateful(seg).numpy(), out["log_probs"], atol=1e-6)
        np.testing.assert_allclose(stateful.memory.numpy(), out["memory"], atol=1e-6)
    log_probs = out["log_probs"]
    np.testing.assert_allclose(np.exp(log_probs).sum(-1), 1.0, atol=1e-5)
    stateful.reset_memory()
    assert not np.any(stateful.memory.numpy())
    np.testing.assert_allclose(stateful(segs[0]).numpy(),
                               pure.call_with_memory(segs[0])["log_probs"].numpy(),
                               atol=1e-6)


@pytest.mark.parametrize("variant", ["post_ln", "same_length_tf", "vanilla", "pre_ln"])
def test_changing_a_future_token_never_changes_earlier_log_probs(variant):
    model = TransformerXLCausalLM(tiny(**CONFIG_VARIANTS[variant]))
    memory = model.call_with_memory(segments(1)[0])["memory"]
    seg = segments(1, seed=5)[0]
    base = model.call_with_memory(seg, memory)["log_probs"].numpy()
    for t in range(T):
        changed = seg.copy()
        changed[:, t] = (changed[:, t] + 1) % V
        other = model.call_with_memory(changed, memory)["log_probs"].numpy()
        np.testing.assert_allclose(other[:, :t], base[:, :t], atol=1e-6)
        assert np.abs(other[:, t:] - base[:, t:]).max() > 1e-4


def test_memory_carries_information_and_zero_length_memory_does_not():
    with_memory = TransformerXLCausalLM(tiny())
    a, b = segments(2)
    m1 = with_memory.call_with_memory(a)["memory"]
    m2 = with_memory.call_with_memory(b)["memory"]
    out1 = with_memory.call_with_memory(b, m1)["log_probs"].numpy()
    out2 = with_memory.call_with_memory(b, m2)["log_probs"].numpy()
    assert np.abs(out1 - out2).max() > 1e-3
    # The memory is the last M inputs of each layer: layer 0 = embeddings.
    embedded = with_memory.backbone.token_embedding(b).numpy()
    np.testing.assert_allclose(m2.numpy()[:, 0], embedded[:, -M:], atol=1e-6)
    no_memory = TransformerXLCausalLM(tiny(memory_length=0))
    out = no_memory.call_with_memory(a)
    assert tuple(out["memory"].shape) == (B, 2, 0, 8)
    again = no_memory.call_with_memory(a, out["memory"])["log_probs"].numpy()
    np.testing.assert_allclose(again, out["log_probs"].numpy(), atol=1e-6)


def test_no_gradient_flows_into_the_memory():
    model = TransformerXLCausalLM(tiny())
    a, b = segments(2)
    memory = tf.Variable(model.call_with_memory(a)["memory"])
    with tf.GradientTape() as tape:
        out = model.call_with_memory(b, memory, training=True)
        loss = -tf.reduce_mean(out["log_probs"])
    grads = tape.gradient(loss, [memory] + model.trainable_variables)
    assert grads[0] is None
    assert all(g is not None for g in grads[1:])
    with tf.GradientTape() as tape:
        out = model.call_with_memory(b, memory)
        new_memory_sum = tf.reduce_sum(out["memory"])
    assert all(g is None for g in tape.gradient(new_memory_sum, model.trainable_variables))


@pytest.mark.parametrize("ids, message", [
    (np.full((B, T), V, "int32"), r"must be in \[0, vocabulary_size=11\), received values in \[11, 11\]"),
    (np.full((B, T), -1, "int64"), r"must be in \[0, vocabulary_size=11\)"),
    (np.zeros((B, T), "float32"), "integer tensor .* received dtype float32"),
    (np.zeros((B, T, 1), "int32"), r"rank 2, \(batch, segment_length\), received shape \(2, 4, 1\)"),
    (np.zeros((B,), "int32"), "rank 2"),
    (np.zeros((B, 0), "int32"), "segment_length 0"),
])
def test_bad_token_ids(ids, message):
    model = TransformerXLCausalLM(tiny())
    with pytest.raises(ValueError, match=message):
        model.call_with_memory(ids)
    with pytest.raises(ValueError, match=message):
        model.call_with_memory(tf.constant(ids))


def test_out_of_range_ids_fail_inside_tf_function_too():
    model = TransformerXLCausalLM(tiny())
    fn = tf.function(lambda ids: model.call_with_memory(ids)["log_probs"])
    with pytest.raises(tf.errors.InvalidArgumentError, match="vocabulary_size=11"):
        fn(tf.fill((B, T), V))


def test_call_with_cache_targets_give_the_picked_log_probs_and_bad_targets_are_named():
    model = TransformerXLCausalLM(tiny())
    a, b = segments(2)
    cache = model.build_cache(model.call_with_memory(a)["memory"], segment_length=T)
    log_probs = model.call_with_cache(b, cache)["log_probs"].numpy()
    targets = random_ids((B, T), V, seed=5)
    nll = model.call_with_cache(b, cache, targets=targets)["nll"].numpy()
    expected = -np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(nll, expected, rtol=1e-6, atol=1e-6)
    for bad, message in [
            (np.full((B, T), V), r"`targets` must be in \[0, vocabulary_size=11\)"),
            (np.zeros((B, T), "float32"), "`targets` must be an integer tensor"),
            (np.zeros((B, T - 1), "int32"),
             r"`targets` must have the \(batch, segment_length\) shape of `token_ids`, "
             r"\(2, 4\), received shape \(2, 3\)")]:
        with pytest.raises(ValueError, match=message):
            model.call_with_cache(b, cache, targets=bad)
    hidden = tf.zeros((B, T, 8))
    with pytest.raises(ValueError, match=r"shape of `hidden`, \(2, 4\), received shape \(1, 4\)"):
        model.nll_from_hidden(hidden, np.zeros((1, T), "int32"))
    fn = tf.function(lambda h, y: model.nll_from_hidden(h, y))
    with pytest.raises(tf.errors.InvalidArgumentError, match="`targets` must be >= 0"):
        fn(hidden, tf.fill((B, T), -1))


@pytest.mark.parametrize("memory, message", [
    (np.zeros((B, 2, M + 1, 8), "float32"), r"\(batch, 2, 4, 8\), received shape \(2, 2, 5, 8\)"),
    (np.zeros((B, 3, M, 8), "float32"), "received shape"),
    (np.zeros((2, M, 8), "float32"), "received shape"),
    (np.zeros((B + 1, 2, M, 8), "float32"), "batch size 3 but `token_ids` has batch size 2"),
    (np.zeros((B, 2, M, 8), "int32"), "float tensor, received dtype int32"),
    (np.full((B, 2, M, 8), np.nan, "float32"), "NaN or Inf"),
])
def test_bad_memory(memory, message):
    model = TransformerXLCausalLM(tiny())
    with pytest.raises(ValueError, match=message):
        model.call_with_memory(segments(1)[0], memory)


def test_memory_batch_and_values_are_checked_inside_tf_function_too():
    model = TransformerXLCausalLM(tiny())
    fn = tf.function(lambda ids, mem: model.call_with_memory(ids, mem)["log_probs"])
    spec_ids = tf.TensorSpec((None, T), tf.int32)
    spec_mem = tf.TensorSpec((None, 2, M, 8), tf.float32)
    traced = fn.get_concrete_function(spec_ids, spec_mem)
    ids = tf.constant(segments(1)[0])
    with pytest.raises(tf.errors.InvalidArgumentError, match="same batch size"):
        traced(ids, tf.zeros((B + 1, 2, M, 8)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN or Inf"):
        traced(ids, tf.fill((B, 2, M, 8), np.inf))
    assert traced(ids, tf.zeros((B, 2, M, 8))).shape == (B, T, V)


def test_stateful_needs_a_batch_size_and_pure_model_has_no_reset():
    with pytest.raises(ValueError, match="fixed positive integer `batch_size`"):
        TransformerXLCausalLM(tiny(), stateful=True)
    with pytest.raises(ValueError, match="stateful=True"):
        TransformerXLCausalLM(tiny()).reset_memory()


@pytest.mark.parametrize("stateful", [False, True])
def test_keras_save_and_load_round_trip(stateful):
    # .keras (safe mode) and save_pretrained: same class, config and weights,
    # the same log-probs and memory over the chained segments; a stateful
    # model's non-zero memory is saved and restored by .keras too.
    model = TransformerXLCausalLM(tiny(), stateful=stateful, batch_size=B)
    segs = segments()
    if stateful:
        model(segs[0])
    run_model_saving_test(model, np.concatenate(segs[1:], 1))


def test_xla_compiled_forward_matches_eager():
    model = TransformerXLCausalLM(tiny(same_length=True))
    fn = tf.function(lambda ids, mem: model.call_with_memory(ids, mem), jit_compile=True)
    ids = np.concatenate(segments(), 1)
    compiled = chain_segments(lambda seg, mem: fn(tf.constant(seg), mem), ids, T,
                              memory=model.initial_memory(B))
    eager = chain_segments(model, ids, T)
    for got, expected in zip(compiled.outputs, eager.outputs):
        np.testing.assert_allclose(got["log_probs"], expected["log_probs"], atol=1e-5)
        np.testing.assert_allclose(got["memory"], expected["memory"], atol=1e-5)


def test_mixed_bfloat16_keeps_log_probs_and_memory_in_float32():
    reference = TransformerXLCausalLM(tiny())
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = TransformerXLCausalLM(tiny())
    finally:
        keras.mixed_precision.set_global_policy("float32")
    model.assign_weights_from(reference)
    assert model.backbone.blocks[0].attention.compute_dtype == "bfloat16"
    ids = np.concatenate(segments(), 1)
    outs = chain_segments(model, ids, T).outputs
    ref_outs = chain_segments(reference, ids, T).outputs
    for out, ref in zip(outs, ref_outs):
        assert out["log_probs"].dtype == np.float32
        assert out["memory"].dtype == np.float32
        np.testing.assert_allclose(np.exp(out["log_probs"]).sum(-1), 1.0, atol=1e-4)
        # bf16 has 8 bits of mantissa: close, not equal.
        np.testing.assert_allclose(out["log_probs"], ref["log_probs"], atol=0.15)
        assert np.abs(out["log_probs"] - ref["log_probs"]).max() > 0


def test_with_settings_keeps_weights_and_changes_memory_length():
    model = TransformerXLCausalLM(tiny())
    longer = model.with_settings(memory_length=8, clamp_length=3, same_length=True)
    assert longer.txl_config.memory_length == 8
    out = longer.call_with_memory(segments(1)[0])
    assert tuple(out["memory"].shape) == (B, 2, 8, 8)
    # With a memory-0 copy both run the same math on the first segment only
    # if the zero memory is empty: compare weights instead.
    for a, b in zip(model.trainable_variables, longer.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_trained_field_may_be_repeated_not_changed_on_copy_or_load(tmp_path):
    # Same shapes, another function: pre_layer_norm=True or another epsilon
    # over these weights computed something the model was never trained to.
    from keras_txl.io import load_pretrained
    from keras_txl.io import save_pretrained

    model = TransformerXLCausalLM(tiny())
    for change in (dict(pre_layer_norm=True), dict(layer_norm_epsilon=1e-12),
                   dict(attention_type="vanilla"), dict(num_heads=4, head_dim=4)):
        key = next(iter(change))
        with pytest.raises(ValueError, match=rf"`{key}`=.* contradicts this model's config, "
                                             rf"which has {key}="):
            model.with_settings(**change)
    save_pretrained(model, tmp_path / "m")
    with pytest.raises(ValueError, match=r"`pre_layer_norm`=True contradicts .*config.json"):
        load_pretrained(tmp_path / "m", pre_layer_norm=True)
    same = load_pretrained(tmp_path / "m", pre_layer_norm=False, cutoffs=list(model.txl_config.cutoffs),
                           memory_length=6, dropout=0.0)
    assert same.txl_config.memory_length == 6
    ids = segments(1)[0]
    np.testing.assert_allclose(same.call_with_memory(ids)["log_probs"],
                               model.with_settings(memory_length=6, dropout=0.0)
                               .call_with_memory(ids)["log_probs"], atol=1e-6)


def test_each_replica_keeps_its_own_memory_under_mirrored_strategy():
    strategy = mirrored_strategy()
    assert strategy.num_replicas_in_sync == 2, "conftest configures two logical CPUs"
    config = tiny()
    reference = TransformerXLCausalLM(config)
    with strategy.scope():
        model = TransformerXLCausalLM(config, stateful=True, batch_size=1)
        model.assign_weights_from(reference)

    @tf.function
    def step(ids):
        return strategy.run(lambda x: model(x), args=(ids,))

    segs = segments()
    # Rows in order; each global batch (B, T) is split by rows over replicas.
    dataset = tf.data.Dataset.from_tensor_slices(np.concatenate(segs)).batch(B)
    dist = iter(strategy.experimental_distribute_dataset(dataset))
    expected = chain_segments(reference, np.concatenate(segs, 1), T)
    for out in expected.outputs:
        result = step(next(dist))
        got = np.concatenate([r.numpy() for r in strategy.experimental_local_results(result)])
        np.testing.assert_allclose(got, out["log_probs"], atol=1e-5)
    memory = expected.memory
    def replica_copies():
        return [v.numpy() for v in strategy.experimental_local_results(model.memory.value)]

    copies = replica_copies()
    np.testing.assert_allclose(np.concatenate(copies), memory.numpy(), atol=1e-5)
    assert np.abs(copies[0] - copies[1]).max() > 1e-3  # the replicas differ
    with strategy.scope():
        model.reset_memory()
    assert all(not np.any(copy) for copy in replica_copies())


def test_save_pretrained_round_trip_and_mismatched_config(tmp_path):
    model = TransformerXLCausalLM(tiny())
    keras_txl.save_pretrained(model, str(tmp_path / "m"))
    loaded = keras_txl.load_pretrained(str(tmp_path / "m"))
    seg = segments(1)[0]
    np.testing.assert_array_equal(loaded.call_with_memory(seg)["log_probs"].numpy(),
                                  model.call_with_memory(seg)["log_probs"].numpy())
    longer = keras_txl.load_pretrained(str(tmp_path / "m"), memory_length=9)
    assert longer.txl_config.memory_length == 9
    other = TransformerXLCausalLM(tiny(intermediate_dim=12))
    keras_txl.save_pretrained(other, str(tmp_path / "other"))
    (tmp_path / "m" / "model.safetensors").write_bytes(
        (tmp_path / "other" / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match="another config"):
        keras_txl.load_pretrained(str(tmp_path / "m"))
    assert not [p for p in (tmp_path / "m").iterdir() if p.name.startswith(".tmp-")]


def test_a_sampler_assigned_by_name_or_after_generate_is_the_one_used():
    # `model.sampler = "greedy"` (without compile, as keras-hub users do)
    # reached generate() as a string and failed with an AttributeError; and a
    # sampler assigned after a generate() was ignored in silence: the
    # compiled generate function kept the one it was traced with.
    import keras_hub

    bare = TransformerXLCausalLM(tiny(), compile=False)
    bare.sampler = "greedy"
    assert isinstance(bare.sampler, keras_hub.samplers.GreedySampler)
    model = TransformerXLCausalLM(tiny())
    model.compile(sampler=keras_hub.samplers.RandomSampler(seed=1, temperature=1e3),
                  jit_compile=False)
    prompt = np.array([[1, 2, 3]])
    # The argmax chain, by hand: one token a step, the memory carried.
    greedy, memory = list(prompt[0]), None
    for t in range(9):
        out = model.call_with_memory(np.array([[greedy[t]]]), memory)
        memory = out["memory"]
        if t + 1 == len(greedy):
            greedy.append(int(np.argmax(out["log_probs"][0, -1])))
    assert not np.array_equal(model.generate(prompt, max_length=10, stop_token_ids=None)[0],
                              greedy)
    model.sampler = "greedy"
    np.testing.assert_array_equal(
        model.generate(prompt, max_length=10, stop_token_ids=None)[0], greedy)
    for bad, message in (("nucleus", r"`sampler` must be one of \['greedy'"),
                         (3, r"`sampler` must be a sampler name .* received int")):
        with pytest.raises(ValueError, match=message):
            model.sampler = bad
    model.sampler = None
    with pytest.raises(ValueError, match=r"generate\(\) needs a sampler"):
        model.generate(prompt, max_length=4)
