"""A demanding Keras user's `fit` / `evaluate` on `TransformerXLCausalLM`:
the options Keras offers beyond a plain fit either work as for any Keras
model or are refused by name, never used wrongly in silence."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from testing import random_ids
from testing import tiny_config

from keras_txl import TransformerXLCausalLM


def stateful_model(batch_size=2):
    keras.utils.set_random_seed(0)
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=31), stateful=True,
                                  batch_size=batch_size)
    model.compile(optimizer=keras.optimizers.SGD(0.1), weighted_metrics=None)
    return model


def test_a_stateful_model_fits_arrays_in_order_and_refuses_shuffle():
    # Keras shuffles arrays by default: each row's memory ran on into an
    # unrelated segment, in silence. The rows now come in order, as a
    # model that is fed them one batch at a time sees them.
    x = random_ids((8, 4), 31, seed=1)
    y = random_ids((8, 4), 31, seed=2)
    fitted = stateful_model()
    loss = fitted.fit(x, y, batch_size=2, epochs=1, verbose=0).history["loss"][0]
    by_hand = stateful_model()
    losses = [by_hand.train_on_batch(x[i:i + 2], y[i:i + 2], return_dict=True)["loss"]
              for i in range(0, 8, 2)]
    np.testing.assert_allclose(loss, np.mean(losses), rtol=1e-5)
    np.testing.assert_allclose(fitted.memory.numpy(), by_hand.memory.numpy(), atol=1e-6)
    for shuffle in (True, "batch"):
        with pytest.raises(ValueError, match=r"`shuffle` must be False for a stateful"):
            fitted.fit(x, y, batch_size=2, shuffle=shuffle, verbose=0)


def test_a_stateful_model_refuses_a_validation_split_that_cuts_a_batch():
    # 6 rows split 0.5 left 3 and 3: a short batch failed in the graph.
    model = stateful_model()
    x, y = random_ids((6, 4), 31, seed=1), random_ids((6, 4), 31, seed=2)
    with pytest.raises(ValueError, match=r"`validation_split`=0.5 cuts 6 rows into 3 "
                                         r"for training and 3 for validation"):
        model.fit(x, y, batch_size=2, validation_split=0.5, verbose=0)
    x, y = random_ids((8, 4), 31, seed=1), random_ids((8, 4), 31, seed=2)
    history = model.fit(x, y, batch_size=2, validation_split=0.5, verbose=0).history
    assert np.isfinite(history["val_loss"][0])


def byte_model(**kwargs):
    from keras_txl.causal_lm_preprocessor import TransformerXLCausalLMPreprocessor
    from keras_txl.tokenizers import ByteTokenizer

    keras.utils.set_random_seed(0)
    preprocessor = TransformerXLCausalLMPreprocessor(ByteTokenizer(), sequence_length=16)
    return TransformerXLCausalLM(tiny_config(vocabulary_size=256), preprocessor=preprocessor,
                                 **kwargs)


def test_the_loss_on_padded_strings_is_the_mean_nll_of_the_real_tokens():
    # keras-hub's default divided by every position, padding included:
    # evaluate() said 2.25 where the real tokens' mean NLL was 5.75.
    model = byte_model()
    model.compile(optimizer=keras.optimizers.SGD(0.0))
    texts = ["hi", "a much longer text here ok", "abc", "xyz 123"]
    x, y, weights = model.preprocessor(texts)
    weights = np.asarray(weights, "float64")
    assert weights.sum() < weights.size / 2  # mostly padding
    log_probs = model.predict(x, verbose=0)
    nll = -np.take_along_axis(log_probs, np.asarray(y)[..., None], -1)[..., 0]
    expected = (nll * weights).sum() / weights.sum()
    evaluated = model.evaluate(texts, batch_size=4, verbose=0, return_dict=True)["loss"]
    np.testing.assert_allclose(evaluated, expected, rtol=1e-5)
    fitted = model.fit(texts, batch_size=4, verbose=0).history["loss"][0]
    np.testing.assert_allclose(fitted, expected, rtol=1e-5)


def test_sample_weight_per_row_or_per_token_weights_the_mean_nll():
    # A weight per row, (batch,), failed in the graph; a weight per token
    # was divided by every position.
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=31))
    model.compile(optimizer=keras.optimizers.SGD(0.0))
    x, y = random_ids((6, 4), 31, seed=1), random_ids((6, 4), 31, seed=2)
    log_probs = model.predict(x, verbose=0)
    nll = -np.take_along_axis(log_probs, y[..., None], -1)[..., 0].astype("float64")
    rows = np.array([1.0, 0.0, 2.0, 0.0, 0.0, 1.0])
    tokens = np.zeros((6, 4))
    tokens[:, :3] = 1.0
    for weights, full in ((rows, rows[:, None] * np.ones((6, 4))), (tokens, tokens)):
        loss = model.evaluate(x, y, sample_weight=weights, batch_size=6, verbose=0,
                              return_dict=True)["loss"]
        np.testing.assert_allclose(loss, (nll * full).sum() / full.sum(), rtol=1e-5)
    loss = model.evaluate(x, y, batch_size=6, verbose=0, return_dict=True)["loss"]
    np.testing.assert_allclose(loss, nll.mean(), rtol=1e-5)


def test_class_weight_and_weights_or_targets_given_with_strings_are_refused_by_name():
    # class_weight failed in the graph (Keras weighs one label per sample);
    # a y or sample_weight given with strings was dropped in silence by the
    # preprocessor, which makes both from the text.
    model = byte_model()
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    texts = ["some text here", "and another one"]
    ids = random_ids((2, 16), 256, seed=1)
    for x, y in ((ids, ids), (texts, None)):
        with pytest.raises(ValueError, match=r"`class_weight` is not supported"):
            model.fit(x, y, class_weight={0: 2.0}, batch_size=2, verbose=0)
    for call in (model.fit, model.evaluate):
        with pytest.raises(ValueError, match=r"`y` must be None when the model reads strings"):
            call(texts, ids, batch_size=2, verbose=0)
        with pytest.raises(ValueError,
                           match=r"`sample_weight` must be None when the model reads strings"):
            call(texts, sample_weight=np.array([1.0, 0.0]), batch_size=2, verbose=0)


@pytest.mark.parametrize("drop_remainder", [True, False])
def test_ordered_segments_say_how_many_batches_they_hold(drop_remainder):
    # Their count was unknown to tf.data: Keras warned "Your input ran out
    # of data; interrupting training" at every epoch of a stateful fit on
    # strings, and its progress bar had no total.
    import tensorflow as tf

    model = byte_model(stateful=True, batch_size=2)
    for length in range(20, 30):  # every remainder of a 4-token segment
        texts = tf.data.Dataset.from_tensor_slices(["x" * length, "y" * 7])
        segments = model.preprocessor.ordered_segments(texts, 2, 4, drop_remainder)
        assert int(segments.cardinality()) == len(list(segments))
    model.compile(optimizer=keras.optimizers.SGD(0.1), weighted_metrics=None)
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(tf.data.Dataset.from_tensor_slices(["hello world, one long text"] * 4),
                  epochs=2, verbose=0)
    assert not [w for w in caught if "ran out of data" in str(w.message)]


def weighted_nll_reference(model, x, y, weights):
    """The mean NLL over the tokens, each weighted, and the weighted
    accuracy, from the model's log-probs (by hand, in float64)."""
    log_probs = np.asarray(model.predict(x, batch_size=len(x), verbose=0), "float64")
    y = np.asarray(y)
    nll = -np.take_along_axis(log_probs, y[..., None], -1)[..., 0]
    hits = log_probs.argmax(-1) == y
    return (nll * weights).sum() / weights.sum(), (hits * weights).sum() / weights.sum()


def test_the_reported_loss_is_the_token_weighted_mean_over_the_batches():
    # Keras weighted each batch's loss by its rows: with padding or a
    # sample_weight, a batch of one real token counted as much as a full
    # one, and the epoch's (and evaluate's) loss was not the mean NLL of the
    # weighted tokens (3.86 where the tokens said 3.72).
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=31))
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    # Keras keeps the compiled loss (TokenCrossEntropy) when `loss` is None.
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss=None)
    x, y = random_ids((6, 4), 31, seed=1), random_ids((6, 4), 31, seed=2)
    rows = np.array([1.0, 0.0, 2.0, 0.0, 0.0, 5.0])
    tokens = np.zeros((6, 4))
    tokens[0, :1] = tokens[3:, :] = 1.0
    # One "loss" however often the model was compiled (in its constructor too).
    assert model.metrics_names == ["loss", "compile_metrics"]
    assert len(model.evaluate(x, y, batch_size=2, verbose=0)) == 2
    for weights, full in ((rows, rows[:, None] * np.ones((6, 4))), (tokens, tokens)):
        loss, accuracy = weighted_nll_reference(model, x, y, full)
        for logs in (model.evaluate(x, y, sample_weight=weights, batch_size=2, verbose=0,
                                    return_dict=True),
                     {k: v[0] for k, v in model.fit(x, y, sample_weight=weights,
                                                    batch_size=2, verbose=0).history.items()}):
            np.testing.assert_allclose(logs["loss"], loss, rtol=1e-5)
            np.testing.assert_allclose(logs["sparse_categorical_accuracy"], accuracy,
                                       rtol=1e-5)


def test_the_reported_loss_weights_padded_strings_and_each_replica_by_their_tokens():
    from testing import mirrored_strategy

    # Padded strings, in batches of different padding.
    strings = byte_model()
    strings.compile(optimizer=keras.optimizers.SGD(0.0))
    texts = ["hi", "a much longer text here ok", "abc", "xyz 123 4567 89"]
    x, y, weights = strings.preprocessor(texts)
    loss, _ = weighted_nll_reference(strings, x, y, np.asarray(weights, "float64"))
    np.testing.assert_allclose(strings.evaluate(texts, batch_size=2, verbose=0,
                                                return_dict=True)["loss"], loss, rtol=1e-5)
    np.testing.assert_allclose(strings.fit(texts, batch_size=2, verbose=0,
                                           shuffle=False).history["loss"][0], loss, rtol=1e-5)
    # Each replica's batch has its own weights: their sums add up.
    strategy = mirrored_strategy()
    with strategy.scope():
        mirrored = TransformerXLCausalLM(tiny_config(vocabulary_size=31))
        mirrored.compile(optimizer=keras.optimizers.SGD(0.0))
    x, y = random_ids((8, 4), 31, seed=1), random_ids((8, 4), 31, seed=2)
    rows = np.array([1.0, 0.0, 0.0, 0.0, 3.0, 1.0, 0.0, 1.0])
    loss, _ = weighted_nll_reference(mirrored, x, y, rows[:, None] * np.ones((8, 4)))
    np.testing.assert_allclose(mirrored.evaluate(x, y, sample_weight=rows, batch_size=4,
                                                 verbose=0, return_dict=True)["loss"],
                               loss, rtol=1e-5)


@pytest.mark.parametrize("data", ["token_weights", "token_nll", "padded_strings",
                                  "partial_last_batch"])
def test_a_mirrored_step_on_uneven_padding_equals_the_one_device_step(data):
    # Each replica's loss was its own token mean over the replicas: the
    # gradient the mean of the replicas' means, so a replica of 2 real
    # tokens counted as much as one of 12 (the weights moved 0.43 apart
    # from the one-device step on the same global batch). The replicas now
    # divide by the global batch's weight sum.
    from testing import mirrored_strategy

    from keras_txl.training.metrics import TokenNLL

    loss = TokenNLL() if data == "token_nll" else "auto"  # `txl train --loop fit`'s
    if data == "partial_last_batch":
        # No weights: 5 rows in batches of 4, the last one split 1 / 0 over
        # the replicas (its one row's gradient was halved: 0.35 apart).
        fit_args = (random_ids((5, 6), 31, seed=1), random_ids((5, 6), 31, seed=2))
        kwargs = dict(batch_size=4)

        def model_fn():
            return TransformerXLCausalLM(tiny_config(vocabulary_size=31))
    elif data != "padded_strings":
        x, y = random_ids((4, 6), 31, seed=1), random_ids((4, 6), 31, seed=2)
        weights = np.ones((4, 6), "float32")
        weights[0, 1:] = 0.0  # replica 0 (rows 0-1): 2 tokens; replica 1: 12
        weights[1, 1:] = 0.0
        fit_args = (x, y)
        kwargs = dict(sample_weight=weights, batch_size=4)

        def model_fn():
            return TransformerXLCausalLM(tiny_config(vocabulary_size=31))
    else:
        # Replica 0 gets the two short texts, replica 1 the two long ones.
        x = ["hi", "ab", "a much longer text here ok", "xyz 123 4567 89 10"]
        fit_args = (x,)
        kwargs = dict(batch_size=4)
        model_fn = byte_model
    results, initial = [], None
    for strategy in (tf.distribute.get_strategy(), mirrored_strategy()):
        with strategy.scope():
            model = model_fn()
            model.compile(optimizer=keras.optimizers.SGD(1.0), loss=loss,
                          weighted_metrics=["accuracy"])
        initial = initial or model.get_weights()
        model.set_weights(initial)
        logs = {k: v[0] for k, v in model.fit(*fit_args, **kwargs, epochs=1, verbose=0,
                                               shuffle=False).history.items()}
        results.append((model.get_weights(), logs))
    (one, one_logs), (two, two_logs) = results
    assert max(np.abs(a - b).max() for a, b in zip(one, two)) < 1e-6
    # The reported loss and the weighted metric are the global batch's too.
    assert one_logs.keys() == two_logs.keys() == {"loss", "accuracy"}
    for key in one_logs:
        np.testing.assert_allclose(two_logs[key], one_logs[key], rtol=1e-5)


def test_losses_and_metrics_that_read_probabilities_are_refused_by_name():
    # The model returns log-probabilities: Keras' string names and keras-hub's
    # Perplexity() read them as probabilities (from_logits=False), clipped
    # them and reported 3.43 for a mean NLL of 3.90, or a perplexity of V,
    # and such a loss trained on near-zero gradients, in silence.
    import keras_hub

    model = TransformerXLCausalLM(tiny_config(vocabulary_size=31))
    for kwargs, message in (
            (dict(loss="sparse_categorical_crossentropy"),
             r"`loss`: 'sparse_categorical_crossentropy' reads the model's outputs as "
             r"probabilities.*from_logits=True.*loss='auto'"),
            (dict(loss=[keras.losses.SparseCategoricalCrossentropy()]),
             r"`loss`: SparseCategoricalCrossentropy\(from_logits=False\)"),
            (dict(metrics=["accuracy", "sparse_categorical_crossentropy"]),
             r"`metrics`: 'sparse_categorical_crossentropy'"),
            (dict(weighted_metrics=[keras_hub.metrics.Perplexity()]),
             r"`weighted_metrics`: Perplexity\(from_logits=False\)")):
        with pytest.raises(ValueError, match=message):
            model.compile(optimizer=keras.optimizers.SGD(0.0), **kwargs)
    # The same with from_logits=True: the numbers of the log-probs.
    model.compile(optimizer=keras.optimizers.SGD(0.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"],
                  weighted_metrics=[keras_hub.metrics.Perplexity(from_logits=True)])
    x, y = random_ids((4, 4), 31, seed=1), random_ids((4, 4), 31, seed=2)
    loss, accuracy = weighted_nll_reference(model, x, y, np.ones((4, 4)))
    logs = model.evaluate(x, y, batch_size=4, verbose=0, return_dict=True)
    np.testing.assert_allclose([logs["loss"], logs["perplexity"], logs["accuracy"]],
                               [loss, np.exp(loss), accuracy], rtol=1e-5)


def test_the_training_loss_and_bits_metric_weigh_each_token_by_its_sample_weight():
    # BitsPerCharacter ignored a weighted metric's sample_weight (the padding
    # counted as text), and TokenNLL divided the weighted sum by every position.
    from keras_txl.training.metrics import BitsPerCharacter
    from keras_txl.training.metrics import TokenNLL

    model = TransformerXLCausalLM(tiny_config(vocabulary_size=31))
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss=TokenNLL(),
                  metrics=[BitsPerCharacter(name="all_bpc")],
                  weighted_metrics=[BitsPerCharacter()])
    x, y = random_ids((6, 4), 31, seed=1), random_ids((6, 4), 31, seed=2)
    rows = np.array([1.0, 0.0, 2.0, 0.0, 0.0, 5.0])
    tokens = np.zeros((6, 4))
    tokens[0, :1] = tokens[3:, :] = 1.0
    everything, _ = weighted_nll_reference(model, x, y, np.ones((6, 4)))
    for weights, full in ((rows, rows[:, None] * np.ones((6, 4))), (tokens, tokens)):
        loss, _ = weighted_nll_reference(model, x, y, full)
        logs = model.evaluate(x, y, sample_weight=weights, batch_size=2, verbose=0,
                              return_dict=True)
        np.testing.assert_allclose([logs["loss"], logs["bpc"], logs["all_bpc"]],
                                   [loss, loss / np.log(2), everything / np.log(2)],
                                   rtol=1e-5)


def test_steps_per_execution_must_be_a_positive_integer_and_runs_the_same_steps():
    # 0 failed at the first evaluate with "range() arg 3 must not be zero".
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=31))
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=r"`steps_per_execution` must be a positive "
                                             rf"integer. Received: steps_per_execution={bad!r}"):
            model.compile(optimizer=keras.optimizers.SGD(0.0), steps_per_execution=bad)
    model.compile(optimizer=keras.optimizers.SGD(0.0), steps_per_execution=2)
    x, y = random_ids((6, 4), 31, seed=1), random_ids((6, 4), 31, seed=2)
    rows = np.array([1.0, 0.0, 2.0, 0.0, 0.0, 5.0])
    loss, _ = weighted_nll_reference(model, x, y, rows[:, None] * np.ones((6, 4)))
    logs = model.evaluate(x, y, sample_weight=rows, batch_size=2, verbose=0, return_dict=True)
    np.testing.assert_allclose(logs["loss"], loss, rtol=1e-5)


def test_strings_without_a_preprocessor_are_refused_by_name():
    # keras-hub answered predict(["abc"]) with "Calling a model directly ...
    # Use `model.predict(x)` ... instead", to a model without a tokenizer.
    import tensorflow as tf

    model = TransformerXLCausalLM(tiny_config(vocabulary_size=31))
    model.compile(optimizer=keras.optimizers.SGD(0.0))
    texts = ["abc", "def"]
    for what, call in (("predict", lambda x: model.predict(x, verbose=0)),
                       ("evaluate", lambda x: model.evaluate(x, verbose=0)),
                       ("fit", lambda x: model.fit(x, verbose=0))):
        for x in (texts, np.array(texts), tf.data.Dataset.from_tensor_slices(texts).batch(2)):
            with pytest.raises(ValueError, match=rf"{what}\(\) on strings needs a "
                                                 r"preprocessor .* this model has none"):
                call(x)


def test_ragged_lists_are_refused_by_name_before_keras_reads_them():
    # Keras said only "Can't convert non-rectangular Python sequence to
    # Tensor", naming neither the argument nor the rows.
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=31))
    model.compile(optimizer=keras.optimizers.SGD(0.0))
    ragged, rows = [[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5, 6]]
    lengths = r"a list of 2 rows of lengths 3, 2\."
    for call, name in ((lambda: model.predict(ragged, verbose=0), "x"),
                       (lambda: model.predict({"token_ids": ragged}, verbose=0),
                        r"x\['token_ids'\]"),
                       (lambda: model.evaluate(ragged, rows, verbose=0), "x"),
                       (lambda: model.fit(rows, ragged, verbose=0), "y"),
                       (lambda: model.evaluate(rows, rows, sample_weight=ragged, verbose=0),
                        "sample_weight"),
                       (lambda: model.fit(rows, rows, validation_data=(rows, ragged),
                                          verbose=0), r"validation_data\[1\]")):
        with pytest.raises(ValueError, match=rf"`{name}` must be rectangular, every row of "
                                             rf"the same length, received {lengths}"):
            call()
    with pytest.raises(ValueError, match=r"`sample_weight` must be rectangular.*lengths 3, "
                                         r"a number\. Give one weight per row"):
        model.fit(rows, rows, sample_weight=[[1, 1, 1], 1], verbose=0)
    # generate() pads prompts of any lengths itself.
    assert [len(row) for row in model.generate(ragged, max_length=5)] == [5, 5]
    np.testing.assert_allclose(
        model.evaluate(rows, rows, verbose=0), model.evaluate(np.array(rows), np.array(rows),
                                                              verbose=0))


def test_targets_and_weights_of_the_wrong_shape_or_dtype_are_refused_by_name():
    # Each failed late in the graph ("Incompatible shapes: [4,5] vs. [4,6]",
    # "Dimensions 4 and 3 are not compatible", "Cannot take the length of
    # shape with unknown rank", "Cast string to float is not supported") or
    # was used in silence: float targets cut to integers, a NaN weight made
    # the loss NaN.
    from keras_txl.causal_lm import TokenCrossEntropy

    model = TransformerXLCausalLM(tiny_config(vocabulary_size=31))
    model.compile(optimizer=keras.optimizers.SGD(0.0))
    x, y = random_ids((4, 6), 31, seed=1), random_ids((4, 6), 31, seed=2)
    for kwargs, message in (
            (dict(y=y[:, :5]), r"`{y}` must hold the target id of each position of `{x}`, of "
                               r"its shape \(4, 6\) \(batch, segment_length\); received shape "
                               r"\(4, 5\)"),
            (dict(y=y[:3]), r"`{y}` .* received shape \(3, 6\)"),
            (dict(y=y[..., None]), r"`{y}` .* received shape \(4, 6, 1\)"),
            (dict(y=y + 0.5), r"`{y}` must hold integer token ids, received dtype float64"),
            (dict(y=y + 31), r"`{y}` must be token ids in \[0, vocabulary_size=31\), received "
                             r"values in \[3\d, \d\d\]"),
            (dict(y=y, sample_weight=np.ones((4, 5))),
             r"`{w}` must hold one weight per row, \(4,\), or one per token, \(4, 6\), as "
             r"`{x}`; received shape \(4, 5\)"),
            (dict(y=y, sample_weight=np.ones(3)), r"`{w}` .* received shape \(3,\)"),
            (dict(y=y, sample_weight=np.ones((4, 12))), r"`{w}` .* received shape \(4, 12\)"),
            (dict(y=y, sample_weight=np.full((4, 6), "a")),
             r"`{w}` must hold numbers .* received dtype <U1"),
            (dict(y=y, sample_weight=np.array([1.0, np.nan, 1.0, 1.0])),
             r"`{w}` must be finite.*received nan")):
        with pytest.raises(ValueError, match=message.format(x="x", y="y", w="sample_weight")):
            model.evaluate(x, batch_size=4, verbose=0, **kwargs)
        validation = (x, kwargs["y"], kwargs.get("sample_weight"))
        with pytest.raises(ValueError, match=message.format(
                x=r"validation_data\[0\]", y=r"validation_data\[1\]",
                w=r"validation_data\[2\]")):
            model.fit(x, y, verbose=0, validation_data=validation[:2 + ("sample_weight" in kwargs)])
    # Whole-number floats, bool masks, weights per row or per token (with
    # a trailing 1) are taken; so is the loss's ignore_class outside [0, V).
    for weights in (np.ones((4, 1)), np.ones((4, 6, 1)), np.ones((4, 6), bool)):
        model.evaluate(x, y.astype("float32"), sample_weight=weights, verbose=0)
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss=TokenCrossEntropy(ignore_class=-100))
    masked = np.where(np.arange(6) < 2, -100, y)
    loss = model.evaluate(x, masked, verbose=0, return_dict=True)["loss"]
    expected, _ = weighted_nll_reference(model, x, y, np.ones((4, 6)) * (np.arange(6) >= 2))
    np.testing.assert_allclose(loss, expected, rtol=1e-5)


def test_jit_compile_under_mirrored_cpu_replicas_fits_without_xla_with_a_warning():
    # The first step failed: "Trying to access resource .../replica_1/...
    # located in device CPU:1 from device CPU:0" (XLA cannot reach the
    # other replicas' variables on CPUs; `txl train` already turns it off).
    from testing import mirrored_strategy

    x, y = random_ids((4, 6), 31, seed=1), random_ids((4, 6), 31, seed=2)
    with mirrored_strategy().scope():
        model = TransformerXLCausalLM(tiny_config(vocabulary_size=31))
        with pytest.warns(UserWarning, match=r"jit_compile=True is not used by fit/evaluate/"
                                             r"predict under MirroredStrategy with a CPU replica"):
            model.compile(optimizer=keras.optimizers.SGD(0.1), jit_compile=True)
    assert model.jit_compile is False and model.generate_jit_compile() is True
    one = TransformerXLCausalLM(tiny_config(vocabulary_size=31))
    one.compile(optimizer=keras.optimizers.SGD(0.1), jit_compile=True)
    one.set_weights(model.get_weights())
    for trained in (model, one):
        trained.fit(x, y, batch_size=4, verbose=0)
    for a, b in zip(model.get_weights(), one.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)
