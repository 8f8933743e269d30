"""The test toolkit itself (tests/testing.py): each check fails on the fault it
is there to catch, and the segment chain runs the model as a hand loop does."""

import keras
import numpy as np
import pytest
from testing import chain_segments
from testing import random_ids
from testing import run_layer_test
from testing import run_model_saving_test
from testing import signature_reference
from testing import tiny_config

from keras_txl import TransformerXLCausalLM


@keras.saving.register_keras_serializable(package="keras_txl_tests")
class Scale(keras.layers.Layer):
    """y = x @ kernel * factor: a minimal layer to break on purpose."""

    def __init__(self, units, factor=1.0, forget_factor=False, unused_weight=False, **kwargs):
        super().__init__(**kwargs)
        self.units, self.factor = units, factor
        self.forget_factor, self.unused_weight = forget_factor, unused_weight

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], self.units))
        if self.unused_weight:
            self.spare = self.add_weight(shape=(self.units,))

    def call(self, x):
        return keras.ops.matmul(x, self.kernel) * self.factor

    def get_config(self):
        config = super().get_config()
        config.update(units=self.units, forget_factor=self.forget_factor,
                      unused_weight=self.unused_weight)
        if not self.forget_factor:
            config["factor"] = self.factor
        return config


X = np.arange(6, dtype="float32").reshape(2, 3)


def test_run_layer_test_passes_a_correct_layer():
    layer = run_layer_test(Scale, {"units": 4, "factor": 2.0}, X, (2, 4), 1, 12)
    assert layer.built


@pytest.mark.parametrize("kwargs, wrong, message", [
    ({}, {"expected_output_shape": (2, 5)}, "output shapes"),
    ({}, {"expected_num_trainable_weights": 2}, "1 trainable weights .*, expected 2"),
    ({}, {"expected_num_parameters": 13}, "12 parameters, expected 13"),
    # get_config() that leaves out an argument: the revived layer differs.
    ({"forget_factor": True}, {}, "after the from_config round trip"),
    # A weight no output depends on.
    ({"unused_weight": True}, {"expected_num_trainable_weights": 2,
                               "expected_num_parameters": 16}, "no gradient reaches"),
])
def test_run_layer_test_catches(kwargs, wrong, message):
    expected = dict(expected_output_shape=(2, 4), expected_num_trainable_weights=1,
                    expected_num_parameters=12)
    expected.update(wrong)
    with pytest.raises(AssertionError, match=message):
        run_layer_test(Scale, {"units": 4, "factor": 2.0, **kwargs}, X, **expected)


def test_run_layer_test_needs_a_registered_class():
    # A class Keras cannot find by name cannot come back from a .keras file.
    class Unregistered(Scale):
        pass

    with pytest.raises(TypeError, match="Could not locate class 'Unregistered'"):
        run_layer_test(Unregistered, {"units": 4}, X, (2, 4), 1, 12)


def test_tiny_config_defaults_and_overrides():
    plain, adaptive = tiny_config(), tiny_config(adaptive=True)
    assert (plain.vocabulary_size, plain.num_layers, plain.hidden_dim, plain.segment_length,
            plain.memory_length, plain.dropout) == (11, 2, 8, 4, 4, 0.0)
    assert plain.cutoffs == () and adaptive.cutoffs == (5,) and adaptive.div_val == 2
    # Overrides win over the adaptive defaults, and are checked like any config.
    assert tiny_config(adaptive=True, cutoffs=(), div_val=1) == plain
    with pytest.raises(ValueError, match=r"Unknown config key\(s\) \['mem_len'\]"):
        tiny_config(mem_len=3)


def test_chain_segments_equals_a_hand_loop_and_carries_the_memory():
    model = TransformerXLCausalLM(tiny_config(adaptive=True))
    ids = random_ids((2, 10))  # segments of 4, 4 and 2
    chain = chain_segments(model, ids, 4)
    assert [s.shape[1] for s in chain.segments] == [4, 4, 2] and len(chain) == 3
    memory, pieces = None, []
    for start in (0, 4, 8):
        out = model.call_with_memory(ids[:, start:start + 4], memory)
        memory = out["memory"]
        pieces.append(out["log_probs"].numpy())
    np.testing.assert_array_equal(chain.log_probs, np.concatenate(pieces, 1))
    np.testing.assert_array_equal(chain.memories[-1], memory.numpy())
    np.testing.assert_array_equal(chain.memory, memory)
    # Explicit lengths, and the same chain without the recurrence differs.
    again = chain_segments(model, ids, [4, 4, 2])
    np.testing.assert_array_equal(again.log_probs, chain.log_probs)
    alone = chain_segments(model, ids, 4, carry_memory=False)
    np.testing.assert_array_equal(alone.log_probs[:, :4], chain.log_probs[:, :4])
    assert np.abs(alone.log_probs[:, 4:] - chain.log_probs[:, 4:]).max() > 1e-3
    # Any callable with the call_with_memory contract, extra outputs kept.
    hidden = chain_segments(lambda x, m: model.call_with_memory(x, m, return_hidden=True), ids, 4)
    assert hidden.outputs[0]["hidden"].shape == (2, 4, 8)


@pytest.mark.parametrize("segment_length, message", [
    (0, "`segment_length` must be a positive integer, received 0"),
    ([4, 4], r"sum to the 10 positions of `ids`, received \[4, 4\]"),
    ([4, 0, 6], "positive lengths"),
])
def test_chain_segments_rejects_bad_segment_lengths(segment_length, message):
    model = TransformerXLCausalLM(tiny_config())
    with pytest.raises(ValueError, match=message):
        chain_segments(model, random_ids((2, 10)), segment_length)
    with pytest.raises(ValueError, match=r"`ids` must be \(batch, length\)"):
        chain_segments(model, random_ids(10), 4)


def test_signature_reference_scores_the_next_token():
    model = TransformerXLCausalLM(tiny_config())
    ids = random_ids((2, 8))
    reference = signature_reference(model, ids, 4)
    log_probs = chain_segments(model, ids, 4).log_probs
    # Position t of segment 1 scores the id at t + 1; the last position of
    # the text scores the first id (np.roll), as the export tests do.
    assert reference[1]["nll"][0, 0] == -log_probs[0, 4, ids[0, 5]]
    assert reference[1]["nll"][1, 3] == -log_probs[1, 7, ids[1, 0]]
    np.testing.assert_array_equal(reference[0]["next"], log_probs[:, 3])


def test_run_model_saving_test_catches_a_weight_lost_on_reload(monkeypatch):
    import keras_txl

    load = keras_txl.load_pretrained

    def lossy(*args, **kwargs):  # a reload that drops one output bias
        model = load(*args, **kwargs)
        model.softmax.bias.assign(np.ones(model.softmax.bias.shape, "float32"))
        return model

    monkeypatch.setattr(keras_txl, "load_pretrained", lossy)
    model = TransformerXLCausalLM(tiny_config())
    with pytest.raises(AssertionError, match="pretrained: softmax/bias"):
        run_model_saving_test(model, random_ids((2, 8)))
