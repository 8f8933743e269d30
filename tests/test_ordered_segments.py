"""The one ordered-segment pipeline: per input pipeline (custom loop), distributed."""

import re

import numpy as np
import pytest
import tensorflow as tf
from testing import mirrored_strategy

from keras_txl.training import data


def _batches(dataset):
    return [(x, y) for x, y in dataset.as_numpy_iterator()]


@pytest.mark.parametrize("pipeline, pipelines, replicas", [
    (0, 1, 1), (0, 1, 4), (1, 2, 4), (0, 2, 2), (1, 2, 2),
])
def test_each_input_pipeline_gets_its_replicas_rows_in_replica_order(pipeline, pipelines,
                                                                     replicas):
    # Pipeline p of P (a worker) feeds replicas [p*R/P, (p+1)*R/P); replica
    # r must get rows [r*B/R, (r+1)*B/R) of every global batch.
    tokens = np.arange(1000)
    batch, T = 8, 6
    full = _batches(data.lm_dataset(tokens, batch, T))
    context = tf.distribute.InputContext(
        num_input_pipelines=pipelines, input_pipeline_id=pipeline,
        num_replicas_in_sync=replicas)
    mine = _batches(data.lm_dataset(tokens, batch, T, input_context=context))
    local = replicas // pipelines
    assert len(mine) == len(full) * local
    layout = data.LMBatches(1000, batch, T, num_replicas=replicas)
    for step, (x, y) in enumerate(full):
        for k in range(local):
            start, stop = layout.replica_rows(pipeline * local + k)
            got_x, got_y = mine[step * local + k]
            np.testing.assert_array_equal(got_x, x[start:stop])
            np.testing.assert_array_equal(got_y, y[start:stop])


def test_input_pipeline_resumes_and_repeats_like_the_global_batches():
    tokens = np.arange(1000)
    context = tf.distribute.InputContext(2, 1, 4)
    full = _batches(data.lm_dataset(tokens, 8, 6, input_context=context))
    steps = data.LMBatches(1000, 8, 6).steps_per_epoch  # 20
    # Resuming at global step 45 of a repeated stream: epoch 2, segment 5.
    resumed = data.lm_dataset(tokens, 8, 6, input_context=context, repeat=True,
                              start_segment=45)
    taken = _batches(resumed.take(2 * (steps - 5) + 4))
    expected = full[2 * 5:] + full[:4]
    assert len(taken) == len(expected)
    for (x, y), (ex, ey) in zip(taken, expected):
        np.testing.assert_array_equal(x, ex)
        np.testing.assert_array_equal(y, ey)


def test_distributed_lm_dataset_under_mirrored_equals_the_global_split():
    strategy = mirrored_strategy()
    tokens = np.random.default_rng(1).integers(0, 50, 2000)
    full = _batches(data.lm_dataset(tokens, 8, 5))
    distributed = data.distributed_lm_dataset(strategy, tokens, 8, 5, repeat=True,
                                              start_segment=3)
    layout = data.LMBatches(2000, 8, 5, num_replicas=2)
    for step, (x, y) in zip(range(3, 7), distributed):
        xs = strategy.experimental_local_results(x)
        ys = strategy.experimental_local_results(y)
        for replica in range(2):
            start, stop = layout.replica_rows(replica)
            np.testing.assert_array_equal(xs[replica].numpy(), full[step][0][start:stop])
            np.testing.assert_array_equal(ys[replica].numpy(), full[step][1][start:stop])


@pytest.mark.parametrize("call, message", [
    (lambda: data.lm_dataset(np.arange(100), 4, 5, num_replicas=3,
                             input_context=tf.distribute.InputContext(1, 0, 2)),
     "num_replicas=3 contradicts the input context, which has 2 replicas"),
    (lambda: data.distributed_lm_dataset(mirrored_strategy(), np.arange(1000), 3, 5),
     "batch_size=3 must be divisible by num_replicas=2"),
    (lambda: data.distributed_lm_dataset(tf.distribute.get_strategy(), np.arange(30), 4, 8,
                                         name="The train split"),
     "The train split has 30 tokens: 7 per stream for batch_size=4, but "
     "segment_length=8 needs at least 9 per stream"),
    (lambda: data.distributed_lm_dataset(tf.distribute.get_strategy(), np.arange(1000), 4, 10,
                                         start_segment=30),
     "start_segment=30 is past the end of the data: one epoch has 24 segments"),
    (lambda: data.distributed_lm_dataset(tf.distribute.get_strategy(), np.arange(1000), 4, 10,
                                         num_replicas=2),
     "takes `num_replicas` from the strategy"),
    (lambda: data.LMBatches(0, 4, 8, name="The valid split"),
     "The valid split is empty (0 tokens)."),
])
def test_errors_name_the_argument(call, message):
    with pytest.raises((ValueError, TypeError), match=re.escape(message)):
        call()


def test_evaluate_reads_the_pipeline_and_names_its_errors():
    import keras_txl
    from keras_txl.training.loop import evaluate

    model = keras_txl.TransformerXLCausalLM(keras_txl.TransformerXLConfig(
        vocabulary_size=11, num_layers=2, hidden_dim=16, num_heads=2,
        intermediate_dim=32, segment_length=4, memory_length=4, dropout=0.0))
    tokens = np.random.default_rng(2).integers(0, 11, 43)
    # 2 streams of 21: 5 segments of 4 targets each, every target once.
    assert evaluate(model, tokens, batch_size=2)["tokens"] == 2 * 20
    first_two = evaluate(model, tokens, batch_size=2, max_segments=2)
    assert first_two["tokens"] == 2 * 2 * 4
    assert first_two["loss"] == pytest.approx(
        evaluate(model, tokens[:2 * 21][np.r_[0:9, 21:30]], batch_size=2)["loss"], rel=1e-6)
    with pytest.raises(ValueError, match=re.escape(
            "The evaluation text has 3 tokens: 1 per stream for batch_size=2, but "
            "drop_remainder=False needs at least 2 per stream")):
        evaluate(model, tokens[:3], batch_size=2)
    with pytest.raises(ValueError, match=re.escape(
            "`max_segments` must be an integer >= 0 (0: the whole text), received "
            "max_segments=-1")):
        evaluate(model, tokens, max_segments=-1)
