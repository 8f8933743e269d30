"""TransformerXLConfig: validation, JSON round trip, presets."""

import json

import pytest
from testing import tiny_config

import keras_txl
from keras_txl import TransformerXLConfig
from keras_txl.presets import PRESETS


def test_json_round_trip(tmp_path):
    config = tiny_config(cutoffs=[5, 8], div_val=2, tie_projections=[False, True, False])
    path = tmp_path / "config.json"
    config.to_json(str(path))
    assert TransformerXLConfig.from_json(str(path)) == config
    assert TransformerXLConfig.from_json(config.to_json()) == config
    assert json.loads(path.read_text())["cutoffs"] == [5, 8]


def test_unknown_keys_are_named():
    with pytest.raises(ValueError, match=r"Unknown config key\(s\) \['d_model'\]"):
        TransformerXLConfig.from_dict({**tiny_config().to_dict(), "d_model": 8})
    with pytest.raises(ValueError, match="Unknown config key"):
        tiny_config().replace(mem_len=3)


def test_missing_keys_are_named():
    data = tiny_config().to_dict()
    del data["num_heads"]
    with pytest.raises(ValueError, match=r"Missing required config key\(s\) \['num_heads'\]"):
        TransformerXLConfig.from_dict(data)


@pytest.mark.parametrize("changes, message", [
    ({"hidden_dim": 30, "num_heads": 4}, "hidden_dim`=30 must be divisible by `num_heads`=4"),
    ({"hidden_dim": 7, "head_dim": 2}, "hidden_dim` must be even"),
    ({"num_layers": -1}, "num_layers` must be a positive integer"),
    ({"vocabulary_size": 0}, "vocabulary_size` must be a positive integer"),
    ({"memory_length": -2}, "memory_length` must be >= 0"),
    ({"clamp_length": -5}, r"clamp_length` must be -1 \(no clamping\).*clamp_length=-5"),
    ({"dropout": 1.5}, r"dropout` must be in \[0, 1\)"),
    ({"cutoffs": [8, 5]}, "strictly increasing"),
    ({"cutoffs": [5, 12]}, r"must lie in \(0, vocabulary_size=11\] \(the last may equal"),
    ({"cutoffs": [0, 5]}, r"must lie in \(0, vocabulary_size=11\]"),
    ({"cutoffs": [5], "tie_projections": [True]}, "one bool per cluster"),
    ({"same_length_convention": "hf"}, "same_length_convention"),
    ({"attention_type": "shaw"}, "attention_type"),
    ({"layer_norm_epsilon": 0}, "layer_norm_epsilon` must be a positive"),
    ({"same_length": "yes"}, "same_length` must be a bool"),
])
def test_bad_values_name_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**changes)


def test_a_last_cluster_zero_wide_builds_as_in_the_official_code(tmp_path):
    # E // div_val**i rounds to 0 for the last cluster (16 // 4**3): the
    # official TF code and transformers build such a model (a [V_i, 0]
    # table, its tokens embed to zero and score by their bias alone), so
    # their checkpoints exist; the config refused it ("empty embedding").
    import keras
    import numpy as np

    config = tiny_config(vocabulary_size=40, cutoffs=[8, 16, 24], div_val=4,
                         embedding_dim=16, init_std=0.3)
    assert [config.cluster_embedding_dim(i) for i in range(4)] == [16, 4, 1, 0]
    model = keras_txl.TransformerXLCausalLM(config)
    assert tuple(model.backbone.token_embedding.tables[3].shape) == (16, 0)
    model.softmax.bias.assign(np.random.default_rng(0).normal(size=40).astype("float32"))
    ids = np.arange(32, dtype="int32").reshape(2, 16) + 8
    out = model.call_with_memory(ids)
    log_probs = out["log_probs"].numpy()
    np.testing.assert_allclose(np.exp(log_probs).sum(-1), 1.0, atol=1e-5)
    # Within the 0-wide cluster only the bias tells tokens apart.
    bias = model.softmax.bias.numpy()[24:]
    tail = log_probs[..., 24:]
    np.testing.assert_allclose(tail - tail[..., :1], np.broadcast_to(bias - bias[0], tail.shape),
                               atol=1e-5)
    # The 0-wide cluster's tokens embed to zero: token 30 and 31 give the
    # same output at the first position.
    a = model.call_with_memory(np.array([[30, 5]], "int32"))["log_probs"].numpy()
    b = model.call_with_memory(np.array([[31, 5]], "int32"))["log_probs"].numpy()
    np.testing.assert_allclose(a, b, atol=1e-6)
    path = str(tmp_path / "model.keras")
    model.save(path)
    again = keras.models.load_model(path)
    np.testing.assert_allclose(again.call_with_memory(ids)["log_probs"].numpy(), log_probs, atol=1e-6)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid(name):
    config = TransformerXLConfig.from_preset(name)
    assert TransformerXLConfig.from_dict(config.to_dict()) == config


def test_paper_presets_hold_the_paper_hyper_parameters():
    large = TransformerXLConfig.from_preset("wt103_large")
    assert (large.num_layers, large.hidden_dim, large.num_heads, large.head_dim,
            large.intermediate_dim, large.div_val) == (18, 1024, 16, 64, 4096, 4)
    assert large.cutoffs == (20000, 40000, 200000)
    # The Hugging Face state dict of this model has 285,205,322 unique
    # parameters (shared/REFERENCE.md section 3).
    assert large.num_parameters() == 285_205_322
    enwik8 = TransformerXLConfig.from_preset("enwik8_large")
    assert (enwik8.num_layers, enwik8.hidden_dim, enwik8.num_heads) == (24, 1024, 8)
    assert enwik8.vocabulary_size == 204 and not enwik8.cutoffs
    assert PRESETS["enwik8_large"]["eval"]["memory_length"] == 3800


def test_unknown_preset():
    with pytest.raises(ValueError, match="Unknown preset 'gpt2'"):
        TransformerXLConfig.from_preset("gpt2")


@pytest.mark.parametrize("changes", [
    {},
    {"cutoffs": [5, 8], "div_val": 2},
    {"cutoffs": [5, 8], "div_val": 1, "embedding_dim": 6},
    {"cutoffs": [5], "div_val": 2, "tie_embeddings": False,
     "tie_projections": [False, False], "untie_relative_bias": True},
    {"attention_type": "vanilla"},
    {"cutoffs": [5, 8], "div_val": 2, "project_same_dim": False},
])
def test_parameter_count_matches_the_built_model(changes):
    config = tiny_config(**changes)
    model = keras_txl.TransformerXLCausalLM(config)
    assert model.count_params() == config.num_parameters()
