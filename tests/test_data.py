"""Tests for training/data.py: ordered Transformer-XL batches."""

import re

import numpy as np
import pytest
import tensorflow as tf
from testing import mirrored_strategy

from keras_txl.training import data


def _batches(dataset):
    return [(x, y) for x, y in dataset.as_numpy_iterator()]


def test_batchify_makes_contiguous_streams_and_drops_remainder():
    streams = data.batchify(np.arange(11), 3)
    assert streams.dtype == np.int32
    np.testing.assert_array_equal(streams, [[0, 1, 2], [3, 4, 5], [6, 7, 8]])


def test_targets_are_inputs_shifted_and_rows_continue_across_batches():
    # Token value == position in the corpus, so continuity is arithmetic.
    batch_size, segment_length, num_tokens = 4, 10, 1003
    batches = _batches(
        data.lm_dataset(np.arange(num_tokens), batch_size, segment_length)
    )
    per_stream = num_tokens // batch_size  # 250
    assert len(batches) == (per_stream - 1) // segment_length == 24
    for step, (inputs, targets) in enumerate(batches):
        assert inputs.shape == targets.shape == (batch_size, segment_length)
        assert inputs.dtype == targets.dtype == np.int32
        starts = np.arange(batch_size) * per_stream + step * segment_length
        np.testing.assert_array_equal(inputs[:, 0], starts)
        np.testing.assert_array_equal(targets, inputs + 1)
        if step:
            previous_inputs, previous_targets = batches[step - 1]
            # Row b of step k+1 starts right after row b of step k ends.
            np.testing.assert_array_equal(
                inputs[:, 0], previous_inputs[:, -1] + 1
            )
            np.testing.assert_array_equal(inputs[:, 0], previous_targets[:, -1])


def test_rows_read_each_stream_in_order_with_random_tokens():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50, size=999)
    streams = data.batchify(tokens, 3)
    batches = _batches(data.lm_dataset(tokens, 3, 7))
    inputs = np.concatenate([x for x, _ in batches], axis=1)
    targets = np.concatenate([y for _, y in batches], axis=1)
    used = len(batches) * 7
    np.testing.assert_array_equal(inputs, streams[:, :used])
    np.testing.assert_array_equal(targets, streams[:, 1 : used + 1])


def test_without_drop_remainder_every_stream_token_is_a_target_once():
    tokens = np.arange(1000)
    dataset = data.lm_dataset(tokens, 4, 10, drop_remainder=False)
    assert dataset.element_spec[0].shape.as_list() == [4, None]
    batches = _batches(dataset)
    assert len(batches) == 25
    assert batches[-1][0].shape == (4, 9)  # 249 targets = 24 * 10 + 9
    targets = np.concatenate([y for _, y in batches], axis=1)
    np.testing.assert_array_equal(targets, data.batchify(tokens, 4)[:, 1:])
    layout = data.LMBatches(1000, 4, 10, drop_remainder=False)
    assert layout.steps_per_epoch == 25
    assert layout.tokens_per_epoch == targets.size == 4 * 249


def test_layout_numbers():
    layout = data.LMBatches(
        num_tokens=1003, batch_size=4, segment_length=10, num_replicas=2
    )
    assert layout.tokens_per_stream == 250
    assert layout.steps_per_epoch == 24
    assert layout.tokens_per_epoch == 24 * 10 * 4
    assert layout.rows_per_replica == 2
    assert layout.replica_rows(0) == (0, 2)
    assert layout.replica_rows(1) == (2, 4)
    assert data.num_segments(1003, 4, 10) == 24
    assert data.num_segments(1003, 4, 10, drop_remainder=False) == 25
    assert data.num_segments(4 * 11, 4, 10) == 1  # 11 per stream: just one
    dataset = data.lm_dataset(np.arange(1003), 4, 10)
    assert int(dataset.cardinality()) == 24


def test_start_segment_equals_skipping():
    tokens = np.random.default_rng(1).integers(0, 100, size=2000)
    full = _batches(data.lm_dataset(tokens, 4, 8))
    resumed = _batches(data.lm_dataset(tokens, 4, 8, start_segment=40))
    assert len(full) == 62 and len(resumed) == 22
    for (x, y), (rx, ry) in zip(full[40:], resumed):
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)


def test_repeat_wraps_to_segment_zero_and_start_is_taken_modulo():
    tokens = np.arange(400)
    full = _batches(data.lm_dataset(tokens, 2, 10))  # 19 steps
    assert len(full) == 19
    # A resumed run may pass its global step: 19 + 17 -> segment 17.
    dataset = data.lm_dataset(tokens, 2, 10, repeat=True, start_segment=36)
    assert int(dataset.cardinality()) == tf.data.INFINITE_CARDINALITY
    taken = _batches(dataset.take(4))
    expected = [full[17], full[18], full[0], full[1]]
    for (x, y), (ex, ey) in zip(taken, expected):
        np.testing.assert_array_equal(x, ex)
        np.testing.assert_array_equal(y, ey)


def test_mirrored_strategy_gives_each_replica_its_row_block_every_step():
    # The session's one MirroredStrategy (a second one can abort the first's
    # all-reduces): two logical CPUs, set up by conftest.py.
    strategy = mirrored_strategy()
    assert strategy.num_replicas_in_sync == 2
    batch_size, segment_length = 8, 5
    layout = data.LMBatches(2000, batch_size, segment_length, num_replicas=2)
    tokens = np.arange(2000)
    dataset = data.lm_dataset(
        tokens, batch_size, segment_length, num_replicas=2
    )
    global_batches = _batches(dataset)
    distributed = strategy.experimental_distribute_dataset(dataset)

    @tf.function
    def first_tokens(inputs, targets):
        def replica_fn(x, y):
            return x[:, 0], y[:, -1]

        return strategy.run(replica_fn, args=(inputs, targets))

    previous_last = None
    for step, (inputs, targets) in enumerate(distributed):
        if step == 4:
            break
        global_inputs, global_targets = global_batches[step]
        local_inputs = strategy.experimental_local_results(inputs)
        local_targets = strategy.experimental_local_results(targets)
        firsts, lasts = first_tokens(inputs, targets)
        firsts = strategy.experimental_local_results(firsts)
        lasts = strategy.experimental_local_results(lasts)
        for replica in range(2):
            start, stop = layout.replica_rows(replica)
            np.testing.assert_array_equal(
                local_inputs[replica].numpy(), global_inputs[start:stop]
            )
            np.testing.assert_array_equal(
                local_targets[replica].numpy(), global_targets[start:stop]
            )
            # Replica r always holds streams [r*B/R, (r+1)*B/R), in order.
            stream_starts = np.arange(start, stop) * 250
            np.testing.assert_array_equal(
                firsts[replica].numpy(),
                stream_starts + step * segment_length,
            )
            if previous_last is not None:
                np.testing.assert_array_equal(
                    firsts[replica].numpy(), previous_last[replica]
                )
        previous_last = [last.numpy() for last in lasts]
    assert previous_last is not None


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: data.lm_dataset(np.arange(1000), 32, 64),
            "corpus has 1000 tokens: 31 per stream for batch_size=32, but "
            "segment_length=64 needs at least 65 per stream",
        ),
        (
            lambda: data.lm_dataset(np.arange(1000), 10, 4, num_replicas=4),
            "batch_size=10 must be divisible by num_replicas=4",
        ),
        (
            lambda: data.lm_dataset(np.arange(1000), 4, 10, start_segment=24),
            "start_segment=24 is past the end of the data: one epoch has 24 "
            "segments",
        ),
        (
            lambda: data.lm_dataset(np.arange(1000), 4, 10, start_segment=-1),
            "`start_segment` must be a non-negative integer. Received: "
            "start_segment=-1",
        ),
        (
            lambda: data.lm_dataset(np.arange(1000), 0, 10),
            "`batch_size` must be a positive integer. Received: "
            "batch_size=0",
        ),
        (
            lambda: data.lm_dataset(np.arange(1000), 4, 2.5),
            "`segment_length` must be a positive integer. Received: "
            "segment_length=2.5",
        ),
        (
            lambda: data.lm_dataset(np.zeros((10, 10), np.int32), 2, 2),
            "`token_ids` must be a 1-D sequence",
        ),
        (
            lambda: data.lm_dataset(np.linspace(0, 1, 100), 2, 2),
            "`token_ids` must hold integers. Received dtype float64",
        ),
        (
            # A padding or "no token" value: on a GPU the embedding lookup
            # would read zeros for it in silence.
            lambda: data.lm_dataset(np.array([5, 3, -1, 2] * 10), 2, 2),
            "`token_ids` must be token ids, >= 0 (they index the vocabulary). "
            "Received token_ids[2]=-1",
        ),
        (
            lambda: data.batchify([1, 2, 3], 4),
            "corpus has 3 tokens, fewer than batch_size=4",
        ),
        (
            lambda: data.lm_dataset([1, 2, 3, 4], 4, 8, drop_remainder=False),
            "corpus has 4 tokens: 1 per stream for batch_size=4, but "
            "drop_remainder=False needs at least 2 per stream",
        ),
        (
            lambda: data.LMBatches(100, 4, 5, num_replicas=2).replica_rows(2),
            "`replica_id` must be an integer in [0, num_replicas=2). "
            "Received: replica_id=2",
        ),
    ],
)
def test_errors_name_the_numbers(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()
