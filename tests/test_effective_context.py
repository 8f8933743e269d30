"""How far back information flows through the segment-level recurrence.

A token d positions before the current one can change the current
log-probs iff d <= `recurrence_reach(L, M, T, i)` (i the index of the
current token in its segment). The memory is stop-gradient, so gradients
cannot show this across segments; the probe perturbs tokens instead,
on tiny models with random weights, and compares the changed set with the
closed form, exactly (beyond the bound nothing changes, bit for bit).
"""

import numpy as np
import pytest
from testing import tiny_config

from keras_txl import TransformerXLCausalLM
from keras_txl.training.recl import perturbation_reach
from keras_txl.training.recl import recurrence_reach


def model_for(layers, memory, segment, same_length=False, convention="official_tf"):
    config = tiny_config(
        vocabulary_size=16, num_layers=layers, hidden_dim=16,
        intermediate_dim=32, segment_length=segment, memory_length=memory,
        same_length=same_length, same_length_convention=convention,
        init_std=0.5,
    )
    return TransformerXLCausalLM(config)


TOKENS = np.random.default_rng(0).integers(0, 16, size=72).astype(np.int32)
TOLERANCE = 1e-5  # max |delta log p|; within the bound changes are >= 1e-3 here


def test_short_last_segment_is_padded():
    # The text may end at the probed position: the probe pads the segment.
    model = model_for(3, 4, 4)
    _, reach = perturbation_reach(model, TOKENS[:49], 48, 40)
    assert reach == recurrence_reach(3, 4, 4, 0)


def test_closed_form():
    # M = T: d_max = i + L * M.
    assert recurrence_reach(3, 4, 4, 0) == 12
    assert recurrence_reach(3, 4, 4, 3) == 15
    # M < T and M > T: each extra layer steps back T * ceil(M / T).
    assert recurrence_reach(2, 3, 4, 0) == 3 + 4
    assert recurrence_reach(2, 6, 4, 1) == 1 + 6 + 8
    # same_length: exactly M per layer (official TF, M + 1 keys) or M - 1.
    assert recurrence_reach(3, 4, 4, 2, same_length=True) == 12
    assert recurrence_reach(3, 4, 4, 2, True, "pytorch") == 9
    # No memory: the segment only.
    assert recurrence_reach(5, 0, 4, 2) == 2
    with pytest.raises(ValueError, match="position"):
        recurrence_reach(2, 4, 4, 4)


@pytest.mark.parametrize("layers, memory, segment, same_length, positions", [
    (3, 4, 4, False, (0, 3)),   # M = T: i + L * M
    (2, 3, 4, False, (0, 2)),   # M < T
    (2, 6, 4, False, (1,)),     # M > T
    (3, 4, 4, True, (0, 3)),    # same_length: L * M whatever i
    (2, 0, 4, False, (3,)),     # no recurrence
])
def test_perturbation_reach_matches_the_bound(layers, memory, segment,
                                              same_length, positions):
    model = model_for(layers, memory, segment, same_length)
    for i in positions:
        position = 48 + i  # 12 segments of history: far beyond any bound
        bound = recurrence_reach(layers, memory, segment, i, same_length)
        changes, reach = perturbation_reach(model, TOKENS, position, 40,
                                            tolerance=TOLERANCE)
        assert reach == bound, (i, bound, changes)
        # Every token within the bound changes the log-probs, nothing beyond
        # does (exactly 0 on the machine this was written on; the tolerance
        # leaves room for 1-ulp noise from other kernels).
        assert np.all(changes[:bound + 1] > TOLERANCE)
        assert np.all(changes[bound + 1:] <= TOLERANCE)


def test_gradient_probe_inside_one_segment_stops_at_the_memory():
    # Inside a segment the gradient sees the same causal structure; across
    # segments it is zero by construction (stop-gradient memory), which is
    # why the probe above perturbs tokens instead.
    import tensorflow as tf

    model = model_for(2, 4, 4)
    memory = model.call_with_memory(TOKENS[None, :4])["memory"]
    memory = tf.Variable(memory)
    ids = tf.constant(TOKENS[None, 4:8])
    with tf.GradientTape() as tape:
        tape.watch(memory)
        hidden, _ = model.backbone(ids, memory)
        target = tf.reduce_sum(model.log_probs_from_hidden(hidden)[0, 1])
    grad = tape.gradient(target, memory)
    assert grad is None or float(tf.reduce_max(tf.abs(grad))) == 0.0
