"""Every public layer and model of `keras_txl.__all__` through the toolkit:
config round trip, same outputs with the same weights, weight and parameter
counts (computed here by hand from the shapes, or from the config's
`num_parameters()`), a gradient for every weight; saving and LiteRT export
round trips of the causal LM."""

import numpy as np
import pytest
from testing import random_ids
from testing import run_layer_test
from testing import run_litert_export_test
from testing import run_model_saving_test
from testing import tiny_config

import keras_txl
from keras_txl import AdaptiveEmbedding
from keras_txl import AdaptiveSoftmax
from keras_txl import RelativeMultiHeadAttention
from keras_txl import TransformerXLBackbone
from keras_txl import TransformerXLBlock
from keras_txl import TransformerXLCausalLM
from keras_txl.memory import attention_mask
from keras_txl.position_encoding import relative_position_embedding

B, T, M = 2, 4, 4
V, L, D, N, H, I = 11, 2, 8, 2, 4, 16  # the tiny config's sizes
# By hand, for the adaptive tiny config (cutoffs (5,), div_val 2: a head of 5
# ids at width 8 and a tail of 6 ids at width 4, each projected to D = 8).
EMBEDDING_PARAMS = (5 * 8 + 6 * 4) + (8 * D + 4 * D)  # tables + projections
# Output bias (V), the tail cluster's logit (kernel E_0 + bias 1) and the
# head's untied projection (8 x D); the tail's projection is tied.
SOFTMAX_PARAMS = V + (8 + 1) + 8 * D
ATTENTION_PARAMS = D * 3 * N * H + D * N * H + N * H * D  # qkv, W_R, output
BLOCK_PARAMS = (ATTENTION_PARAMS + 2 * D  # attention LayerNorm
                + D * I + I + I * D + D  # the two dense layers
                + 2 * D)  # feed-forward LayerNorm
BIAS_PARAMS = 2 * N * H  # u and v, shared by the layers


def test_the_public_names_are_the_ones_tested_here():
    # A new public layer or model needs a run_layer_test here.
    import keras

    layers = {name for name in keras_txl.__all__
              if isinstance(getattr(keras_txl, name), type)
              and issubclass(getattr(keras_txl, name), keras.layers.Layer)}
    assert layers == {"AdaptiveEmbedding", "AdaptiveSoftmax", "RelativeMultiHeadAttention",
                      "TransformerXLBlock", "TransformerXLBackbone", "TransformerXLCausalLM",
                      "TransformerXLCausalLMPreprocessor"}


def test_hand_counts_agree_with_the_config_formula():
    # The two independent counts used below agree for the whole model.
    total = EMBEDDING_PARAMS + L * BLOCK_PARAMS + BIAS_PARAMS + SOFTMAX_PARAMS
    assert total == tiny_config(adaptive=True).num_parameters() == 1524


@pytest.mark.parametrize("adaptive, weights, parameters", [
    (True, 4, EMBEDDING_PARAMS),
    (False, 1, V * D),  # one table, width D: no projection
])
def test_adaptive_embedding(adaptive, weights, parameters):
    run_layer_test(
        AdaptiveEmbedding, {"config": tiny_config(adaptive=adaptive)},
        random_ids((B, T)), expected_output_shape=(B, T, D),
        expected_num_trainable_weights=weights, expected_num_parameters=parameters,
    )


@pytest.mark.parametrize("changes, weights, parameters", [
    ({}, 4, SOFTMAX_PARAMS),
    # Untied tables and projections: the softmax owns both tables and
    # both projections too.
    ({"tie_embeddings": False, "tie_projections": (False, False)}, 7,
     V + (8 + 1) + (8 * D + 4 * D) + (5 * 8 + 6 * 4)),
    ({"cutoffs": (), "div_val": 1}, 1, V),  # a plain softmax: the bias only
])
def test_adaptive_softmax(changes, weights, parameters):
    config = tiny_config(adaptive=True, **changes)
    embedding = AdaptiveEmbedding(config)
    embedding.build()
    hidden = np.random.default_rng(1).normal(size=(B, T, D)).astype("float32")
    run_layer_test(
        AdaptiveSoftmax, {"config": config},
        (hidden, embedding.tables, embedding.projections),
        expected_output_shape=(B, T, V),
        expected_num_trainable_weights=weights, expected_num_parameters=parameters,
    )


def _attention_inputs(seed=2):
    rng = np.random.default_rng(seed)
    normal = lambda *shape: rng.normal(size=shape).astype("float32")  # noqa: E731
    return dict(
        memory=normal(B, M, D),
        position_embedding=np.asarray(relative_position_embedding(M + T, D)),
        content_bias=normal(N, H), position_bias=normal(N, H),
        attention_mask=np.asarray(attention_mask(T, M)),
    ), normal(B, T, D)


@pytest.mark.parametrize("relative, weights, parameters", [
    (True, 3, ATTENTION_PARAMS),
    (False, 2, ATTENTION_PARAMS - D * N * H),  # no W_R
])
def test_relative_multi_head_attention(relative, weights, parameters):
    inputs, query = _attention_inputs()
    if not relative:  # no position terms: R, u and v are not passed
        inputs = dict(memory=inputs["memory"], attention_mask=inputs["attention_mask"])
    call = {"query": query, **inputs}
    run_layer_test(
        RelativeMultiHeadAttention,
        {"num_heads": N, "head_dim": H, "relative": relative,
         "kernel_initializer": "random_normal"},
        call, expected_output_shape=(B, T, D),
        expected_num_trainable_weights=weights, expected_num_parameters=parameters,
    )


@pytest.mark.parametrize("pre_layer_norm", [False, True])
def test_transformer_xl_block(pre_layer_norm):
    inputs, hidden = _attention_inputs(3)
    run_layer_test(
        TransformerXLBlock,
        {"num_heads": N, "head_dim": H, "intermediate_dim": I,
         "pre_layer_norm": pre_layer_norm, "layer_norm_epsilon": 1e-6},
        {"hidden": hidden, **inputs}, expected_output_shape=(B, T, D),
        # Attention (3), two LayerNorms (2 each), two dense layers (2 each).
        expected_num_trainable_weights=11, expected_num_parameters=BLOCK_PARAMS,
    )


@pytest.mark.parametrize("changes, weights, parameters", [
    ({}, 4 + L * 11 + 2, EMBEDDING_PARAMS + L * BLOCK_PARAMS + BIAS_PARAMS),
    # Per-layer u and v: the same two weights, L times the size.
    ({"untie_relative_bias": True}, 4 + L * 11 + 2,
     EMBEDDING_PARAMS + L * BLOCK_PARAMS + L * BIAS_PARAMS),
    # Vanilla attention: no W_R, no u and v.
    ({"attention_type": "vanilla"}, 4 + L * 10,
     EMBEDDING_PARAMS + L * (BLOCK_PARAMS - D * N * H)),
])
def test_transformer_xl_backbone(changes, weights, parameters):
    config = tiny_config(adaptive=True, **changes)
    memory = np.random.default_rng(4).normal(size=(B, L, M, D)).astype("float32")
    run_layer_test(
        TransformerXLBackbone, {"config": config},
        {"token_ids": random_ids((B, T)), "memory": memory},
        expected_output_shape=((B, T, D), (B, L, M, D)),
        expected_num_trainable_weights=weights, expected_num_parameters=parameters,
    )


@pytest.mark.parametrize("changes, weights", [
    # Embedding (4), blocks (11 each), u and v, softmax (4).
    ({}, 4 + L * 11 + 2 + 4),
    # The softmax owns its two tables too.
    ({"tie_embeddings": False}, 4 + L * 11 + 2 + 6),
    # One table; the softmax has its bias only.
    ({"cutoffs": (), "div_val": 1}, 1 + L * 11 + 2 + 1),
    # No W_R per block, no u and v.
    ({"attention_type": "vanilla", "pre_layer_norm": True}, 4 + L * 10 + 4),
])
def test_transformer_xl_causal_lm(changes, weights):
    config = tiny_config(adaptive=True, **changes)
    run_layer_test(
        TransformerXLCausalLM, {"config": config}, random_ids((B, T)),
        expected_output_shape=(B, T, V),
        expected_num_trainable_weights=weights,
        expected_num_parameters=config.num_parameters(),
    )


@pytest.mark.parametrize("stateful", [False, True])
def test_causal_lm_saving_round_trips(stateful):
    model = TransformerXLCausalLM(tiny_config(adaptive=True), stateful=stateful,
                                  batch_size=B)
    ids = random_ids((B, 3 * T))
    if stateful:
        model(ids[:, :T])  # a non-zero memory is saved in the .keras file
        assert np.abs(model.memory.numpy()).max() > 0
    reloaded = run_model_saving_test(model, ids)
    assert set(reloaded) == {"pretrained", "keras"}


def test_causal_lm_runs_the_same_in_litert():
    # M > T: each memory mixes two segments. (The stateful variant and the
    # quantized ones are in test_export_tflite.py.)
    model = TransformerXLCausalLM(tiny_config(adaptive=True, memory_length=6))
    errors = run_litert_export_test(model, random_ids((B, 3 * T)))
    assert set(errors) == {"log_probs", "memory"}
    assert max(errors.values()) < 1e-4
