"""Checks in the right place (issue 18, items 6 and 8): after the float32
cast, before NumPy's sampler, NumPy scalars as numbers, bools not; bounded
initial memories, a full batch for a stateful predict, batch 0 in the
SavedModel."""

import numpy as np
import pytest
import tensorflow as tf

from keras_txl import generation
from keras_txl.causal_lm import TransformerXLCausalLM
from keras_txl.config import TransformerXLConfig
from keras_txl.export import saved_model

B, T, L, M, D, V = 2, 3, 2, 4, 8, 11


def tiny(**changes):
    return TransformerXLConfig(vocabulary_size=V, num_layers=L, hidden_dim=D, num_heads=2,
                               intermediate_dim=16, memory_length=M, segment_length=T,
                               dropout=0.0, **changes)


@pytest.fixture(scope="module")
def model():
    return TransformerXLCausalLM(tiny())


def test_memory_is_checked_after_the_float32_cast(model):
    ids = np.zeros((B, T), np.int32)
    memory = np.full((B, L, M, D), 1e300)  # finite as float64, Inf as float32
    with pytest.raises(ValueError, match=r"`memory` contains NaN or Inf values \(as float32\)"):
        model.call_with_memory(ids, memory)
    out = model.call_with_memory(ids, np.full((B, L, M, D), 0.5))  # float64 is fine
    assert out["memory"].dtype == "float32"


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=float("nan")), r"`temperature` must be a finite number >= 0 "
                                     r"\(0 is greedy\). Received: temperature=nan"),
    (dict(temperature=float("inf")), "`temperature` must be a finite number"),
    (dict(temperature=True), "Received: temperature=True"),
    (dict(temperature=-0.5), "Received: temperature=-0.5"),
    (dict(top_k=True), "`top_k` must be an integer >= 0"),
    (dict(top_p=np.nan), r"`top_p` must be in \(0, 1\]"),
    (dict(max_new_tokens=True), "`max_new_tokens` must be an integer >= 0, received "
                                "max_new_tokens=True"),
    (dict(max_new_tokens=2.0), "`max_new_tokens` must be an integer"),
    (dict(prompt_ids=[[1, 2], [3, 4]]), r"`prompt_ids` must be a 1-D sequence of token ids "
                                        r"\(one text\), received shape \(2, 2\)"),
    (dict(initial_memory=np.full((1, L, M, D), np.nan)),
     "`initial_memory` contains NaN or Inf values"),
    (dict(initial_memory=np.full((1, L, M, D), 1e300)), r"NaN or Inf values \(as float32\)"),
    (dict(initial_memory=np.zeros((2, L, M, D), np.float32)),
     r"`initial_memory` must have shape .* = \(1, 2, 4, 8\) .* received shape \(2, 2, 4, 8\)"),
])
def test_generate_rejects_bad_arguments_early(model, kwargs, message):
    arguments = {"prompt_ids": [1, 2, 3], "max_new_tokens": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        generation.generate(model, **arguments)


def test_numpy_scalars_are_numbers(model):
    ids = generation.generate(model, np.array([1, 2, 3]), np.int64(3),
                              temperature=np.float32(0.7), top_k=np.int64(5),
                              top_p=np.float32(0.9), seed=0)
    plain = generation.generate(model, [1, 2, 3], 3, temperature=0.7, top_k=5,
                                top_p=float(np.float32(0.9)), seed=0)
    np.testing.assert_array_equal(ids, plain)
    assert generation.check_sampling(np.float64(0), np.int32(0), np.float32(1)) == (0.0, 0, 1.0)
    stateful = TransformerXLCausalLM(tiny(), stateful=True, batch_size=np.int64(2))
    assert stateful.memory.shape == (2, L, M, D)
    assert model.initial_memory(np.int64(2)).shape == (2, L, M, D)


def test_the_sampler_reports_nan_log_probs_itself():
    for temperature in (0, 1.0):
        sampler = generation.sampler_from_options(temperature, seed=0)
        with pytest.raises(ValueError, match="NaN or \\+Inf log-probabilities"):
            generation.sample_next(np.array([0.0, np.nan, -1.0]), sampler)
    sampler = generation.sampler_from_options(1.0, seed=0)
    assert generation.sample_next(np.array([-np.inf, 0.0]), sampler) == 1


def test_initial_memory_is_bounded(model):
    with pytest.raises(ValueError, match=r"initial_memory\(batch_size=100000000\) would "
                       r"allocate 25600000000 bytes .* more than max_bytes=4294967296"):
        model.initial_memory(10**8)
    assert model.initial_memory(64, max_bytes=64 * 4 * L * M * D).shape == (64, L, M, D)
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="`batch_size` must be a positive integer"):
            model.initial_memory(bad)


def test_a_stateful_predict_needs_full_batches(model):
    stateful = TransformerXLCausalLM(tiny(), stateful=True, batch_size=B)
    stateful.assign_weights_from(model)
    ids = np.random.default_rng(0).integers(0, V, (2 * B, T)).astype(np.int32)
    with pytest.raises(ValueError, match=r"batch_size=2 predicts in batches of exactly 2 "
                       r"rows; received 3 rows .* Pass a multiple of 2 rows"):
        stateful.predict(ids[:3], verbose=0)
    with pytest.raises(ValueError, match="received 4 rows with batch_size=4"):
        stateful.predict(ids, batch_size=4, verbose=0)
    with pytest.raises(ValueError, match="needs every batch to hold exactly 2 rows .* "
                       "received a batch of 1"):
        stateful(ids[:1])
    # Full batches: the same as two chained pure calls.
    stateful.reset_memory()
    got = stateful.predict(ids, verbose=0)
    first = model.call_with_memory(ids[:B])
    second = model.call_with_memory(ids[B:], first["memory"])
    np.testing.assert_allclose(got[:B], first["log_probs"], atol=1e-5)
    np.testing.assert_allclose(got[B:], second["log_probs"], atol=1e-5)


def test_dynamic_batch_saved_model_rejects_batch_0_and_huge_memories(model, tmp_path):
    version_dir = saved_model.export_saved_model(model, str(tmp_path), warmup=False)
    loaded = tf.saved_model.load(version_dir).signatures
    empty = tf.zeros((0, T), tf.int32)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"`token_ids` must hold at least one row \(batch size >= 1\)"):
        loaded["serving_default"](token_ids=empty, memory=tf.zeros((0, L, M, D)))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"`batch_size` must be <= 16777216: one row of memory is 256 "
                       r"bytes .* max_memory_bytes=4294967296"):
        loaded["initial_memory"](batch_size=tf.constant(10**8))
    memory = loaded["initial_memory"](batch_size=tf.constant(B))["memory"]
    out = loaded["serving_default"](token_ids=tf.ones((B, T), tf.int32), memory=memory)
    assert out["memory"].shape == (B, L, M, D)


def test_a_config_takes_numpy_scalars_and_writes_python_numbers():
    numpy_config = TransformerXLConfig(
        vocabulary_size=np.int64(V), num_layers=np.int32(L), hidden_dim=D, num_heads=2,
        intermediate_dim=16, dropout=np.float32(0.25), cutoffs=(np.int64(5),))
    plain = TransformerXLConfig(vocabulary_size=V, num_layers=L, hidden_dim=D, num_heads=2,
                                intermediate_dim=16, dropout=0.25, cutoffs=(5,))
    assert numpy_config == plain and numpy_config.to_json() == plain.to_json()
    assert type(numpy_config.num_layers) is int and type(numpy_config.cutoffs[0]) is int
    with pytest.raises(ValueError, match="`num_layers` must be a positive integer, received "
                       "num_layers=True"):
        plain.replace(num_layers=True)
