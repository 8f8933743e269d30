"""The keras-hub model family: base classes, batched generation, the
memory validity option, fit from strings, presets and bad input."""

import os
import re

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf
from testing import random_ids
from testing import tiny_config

import keras_txl
from keras_txl import TransformerXLBackbone
from keras_txl import TransformerXLCausalLM
from keras_txl.causal_lm_preprocessor import TransformerXLCausalLMPreprocessor
from keras_txl.generation import KerasBackend
from keras_txl.generation import generate as host_generate
from keras_txl.training.data import lm_dataset

LENGTHS = (5, 17, 40)


def generation_model(**overrides):
    """A model whose memory (48) holds the longest prompt (40)."""
    keras.utils.set_random_seed(0)
    config = tiny_config(
        vocabulary_size=31, memory_length=48, segment_length=8, **overrides
    )
    model = TransformerXLCausalLM(config)
    model.compile(sampler="greedy")
    return model


def prompts(vocabulary_size=31):
    return [list(random_ids((n,), vocabulary_size, seed=n)) for n in LENGTHS]


def byte_preprocessor(sequence_length=8):
    from keras_txl.tokenizers import ByteTokenizer

    return TransformerXLCausalLMPreprocessor(ByteTokenizer(), sequence_length=sequence_length)


def test_the_family_is_built_on_keras_hub_base_classes():
    model = generation_model()
    assert isinstance(model, keras_hub.models.CausalLM)
    assert isinstance(model.backbone, keras_hub.models.Backbone)
    assert isinstance(byte_preprocessor(), keras_hub.models.CausalLMPreprocessor)
    # keras-hub style config: the hyper-parameters flat, and back.
    config = model.backbone.get_config()
    assert config["memory_length"] == 48 and "config" not in config
    clone = TransformerXLBackbone.from_config(config)
    assert clone.config == model.backbone.config


def test_a_batch_of_prompts_equals_each_prompt_alone_and_the_host_loop():
    model = generation_model()
    batch = model.generate(prompts(), max_length=60, stop_token_ids=None)
    for prompt, row in zip(prompts(), batch):
        assert len(row) == 60
        np.testing.assert_array_equal(row[: len(prompt)], prompt)
        alone = model.generate([prompt], max_length=60, stop_token_ids=None)[0]
        np.testing.assert_array_equal(row, alone)
        # The host loop of keras_txl.generation, one token at a time.
        host = host_generate(
            KerasBackend(model), np.asarray(prompt), 60 - len(prompt),
            temperature=0, segment_length=1,
        )
        np.testing.assert_array_equal(row[len(prompt):], host)


def test_generate_uses_xla_unless_compiled_without_it_and_both_give_the_same_tokens():
    model = generation_model()  # compile(sampler="greedy"): jit_compile "auto"
    assert model.generate_jit_compile() is True
    if not tf.config.list_logical_devices("GPU"):
        assert model.jit_compile is False  # fit keeps Keras' CPU default
    xla = model.generate(prompts(), max_length=60, stop_token_ids=None)
    model.compile(sampler="greedy", jit_compile=False)
    assert model.generate_jit_compile() is False
    graph = model.generate(prompts(), max_length=60, stop_token_ids=None)
    np.testing.assert_array_equal(xla, graph)
    model.compile(sampler="greedy", jit_compile=True)
    assert model.generate_jit_compile() is True
    with pytest.raises(ValueError, match="`jit_compile` must be 'auto', True or False"):
        model.compile(sampler="greedy", jit_compile="yes")


def test_the_returned_memory_continues_the_text():
    model = generation_model()
    first = prompts()[0]
    out, memory = model.generate([first], max_length=12, stop_token_ids=None,
                                 return_memory=True)
    assert memory.shape == (1, 2, 48, 8)
    more = [3, 4, 5]
    continued = model.generate([more], max_length=10, stop_token_ids=None,
                               memory=memory)[0]
    whole = model.generate([list(out[0]) + more], max_length=19,
                           stop_token_ids=None)[0]
    np.testing.assert_array_equal(continued[3:7], whole[15:19])


def test_a_row_stops_at_its_stop_token_and_the_others_go_on():
    model = generation_model()
    free = model.generate(prompts(), max_length=60, stop_token_ids=None)
    stop = int(free[0][5])  # the first token row 0 generates
    stopped, memory = model.generate(prompts(), max_length=60,
                                     stop_token_ids=(stop,), return_memory=True)
    assert len(stopped[0]) == 6 and stopped[0][-1] == stop
    for prompt, row, free_row in zip(prompts(), stopped, free):
        # Each row is the free row cut after its first generated stop token.
        np.testing.assert_array_equal(row, free_row[: len(row)])
        generated = list(row[len(prompt):])
        if len(row) < 60:
            assert generated[-1] == stop and stop not in generated[:-1]
        else:
            assert stop not in generated
    # Row 0's memory is the memory after its 6 tokens, fed alone.
    _, alone = model.generate([list(stopped[0])], max_length=6,
                              stop_token_ids=None, return_memory=True)
    np.testing.assert_allclose(np.asarray(memory)[0], np.asarray(alone)[0], atol=1e-6)


def test_keras_hub_samplers_work_and_seeded_sampling_repeats():
    model = generation_model()
    model.compile(sampler="beam")
    beams = model.generate(prompts(), max_length=45, stop_token_ids=None)
    for prompt, row in zip(prompts(), beams):
        assert len(row) == 45
        np.testing.assert_array_equal(row[: len(prompt)], prompt)
    runs = []
    for _ in range(2):
        model.compile(sampler=keras_hub.samplers.TopKSampler(k=5, seed=7))
        runs.append(model.generate(prompts(), max_length=50, stop_token_ids=None))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_masked_empty_memory_makes_chunking_irrelevant():
    # With empty_memory="masked", a text fed as one segment or in pieces
    # (the memory and its validity carried) gives the same log-probs while
    # the text fits in the memory; with zero memory it does not.
    keras.utils.set_random_seed(3)
    masked = TransformerXLCausalLM(tiny_config(memory_length=12, empty_memory="masked"))
    zeros = TransformerXLCausalLM(tiny_config(memory_length=12))
    zeros.set_weights(masked.get_weights())
    ids = random_ids((2, 12))
    for model, equal in ((masked, True), (zeros, False)):
        whole = model.call_with_memory(ids)["log_probs"]
        first = model.call_with_memory(ids[:, :5])
        second = model.call_with_memory(
            ids[:, 5:], first["memory"], memory_mask=first.get("memory_mask")
        )
        pieces = np.concatenate([first["log_probs"], second["log_probs"]], axis=1)
        close = np.allclose(whole, pieces, atol=1e-5)
        assert close == equal, model.txl_config.empty_memory
    # Masked slots are not attended at all: the first segment equals a
    # model without memory.
    no_memory = TransformerXLCausalLM(tiny_config(memory_length=0))
    no_memory.set_weights(masked.get_weights())
    np.testing.assert_allclose(
        masked.call_with_memory(ids)["log_probs"],
        no_memory.call_with_memory(ids)["log_probs"], atol=1e-5,
    )


def test_fit_on_strings_carries_the_memory_like_the_ordered_id_pipeline():
    texts = ["hello world\n", "the quick brown fox jumps\n", "over the lazy dog " * 5]
    ids = np.frombuffer("".join(texts).encode(), np.uint8).astype("int32")
    config = tiny_config(vocabulary_size=256, segment_length=8, memory_length=8)
    losses = []
    for source in ("strings", "ids"):
        keras.utils.set_random_seed(5)
        model = TransformerXLCausalLM(
            config, preprocessor=byte_preprocessor(), stateful=True, batch_size=3
        )
        model.compile(optimizer=keras.optimizers.SGD(0.1), weighted_metrics=None)
        if source == "strings":
            history = model.fit(tf.data.Dataset.from_tensor_slices(texts), epochs=2, verbose=0)
        else:
            model.reset_memory()
            history = keras.Model.fit(
                model, lm_dataset(ids, 3, 8), epochs=2, verbose=0, shuffle=False,
                callbacks=[__import__("keras_txl.causal_lm", fromlist=["x"]).ResetMemory()],
            )
        losses.append(history.history["loss"])
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)


def test_a_stateful_model_validates_and_evaluates_strings_as_ordered_segments():
    # validation_data of strings crashed with keras-hub's "calling a model
    # directly" message; evaluate() on strings scored padded samples with
    # the memory carried. Both read the ordered segments from a zeroed
    # memory now: with a learning rate of 0, the validation loss equals the
    # training loss of the same text, and evaluate() (batched or not) too.
    texts = ["hello world, this is one long text that continues",
             "and here is the second long stream of text ok"] * 2
    data = tf.data.Dataset.from_tensor_slices(texts)
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=256, segment_length=8,
                                              memory_length=8),
                                  preprocessor=byte_preprocessor(), stateful=True,
                                  batch_size=2)
    model.compile(optimizer=keras.optimizers.SGD(0.0), weighted_metrics=None)
    history = model.fit(data, epochs=1, verbose=0, validation_data=data).history
    np.testing.assert_allclose(history["val_loss"], history["loss"], rtol=1e-5)
    model.memory.assign(tf.ones_like(model.memory))  # evaluate starts from zeros anyway
    for texts_data in (data, data.batch(3)):
        loss = model.evaluate(texts_data, verbose=0, return_dict=True)["loss"]
        np.testing.assert_allclose(loss, history["loss"][0], rtol=1e-5)
    with pytest.raises(ValueError, match="`validation_data` must be a tf.data.Dataset of "
                                         "strings too"):
        model.fit(data, validation_data=(np.zeros((2, 8), "int32"),) * 2, verbose=0)


def test_a_stateful_model_reading_strings_refuses_y_and_keeps_positional_arguments():
    # fit/evaluate on a dataset of strings dropped `y` in silence, and
    # evaluate/predict handed their positional arguments to Keras one slot
    # early (verbose became y or batch_size).
    data = tf.data.Dataset.from_tensor_slices(
        ["hello world, this is one long text that continues",
         "and here is the second long stream of text ok"])
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=256, segment_length=8,
                                              memory_length=8),
                                  preprocessor=byte_preprocessor(), stateful=True,
                                  batch_size=2)
    model.compile(optimizer=keras.optimizers.SGD(0.0), weighted_metrics=None)
    for call in (model.fit, model.evaluate):
        with pytest.raises(ValueError, match="`y` must be None when .* strings"):
            call(data, np.zeros((2, 8), "int32"), verbose=0)
    # Keras keeps the iterator across epochs when steps are given, while the
    # memory restarts each epoch: epoch 2 read mid-stream from a zero memory.
    for steps in ("steps_per_epoch", "validation_steps"):
        with pytest.raises(ValueError, match=rf"`{steps}` must be None when a stateful "
                                             rf"model fits a dataset of strings"):
            model.fit(data, validation_data=data, verbose=0, **{steps: 1})
    expected = model.evaluate(data, verbose=0)
    np.testing.assert_allclose(model.evaluate(data, None, None, 0), expected, rtol=1e-6)
    np.testing.assert_array_equal(model.predict(data, None, 0),
                                  model.predict(data, verbose=0))


def test_a_stateful_model_predicts_strings_as_ordered_segments():
    # predict() on a dataset of strings padded each string into its own row
    # (refused by the padding assert, or unrelated rows run on through the
    # memory); it reads the ordered segments from a zeroed memory now, like
    # evaluate: the same log-probs as carrying the memory by hand.
    texts = ["hello world, this is one long text that continues",
             "and here is the second long stream of text ok"]
    data = tf.data.Dataset.from_tensor_slices(texts)
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=256, segment_length=8,
                                              memory_length=8),
                                  preprocessor=byte_preprocessor(), stateful=True,
                                  batch_size=2)
    model.memory.assign(tf.ones_like(model.memory))  # predict starts from zeros
    predicted = model.predict(data, verbose=0)
    np.testing.assert_array_equal(model.memory.numpy(), 0.0)  # and ends there
    expected, memory = [], None
    for inputs, _ in model.preprocessor.ordered_segments(data, 2):
        out = model.call_with_memory(inputs, memory)
        expected.append(out["log_probs"])
        memory = out["memory"]
    assert len(expected) >= 2  # a second batch, which reads the first's memory
    expected = np.concatenate(expected)
    assert predicted.shape == expected.shape == (len(expected), 8, 256)
    np.testing.assert_allclose(predicted, expected, atol=1e-5)
    np.testing.assert_array_equal(model.predict(data, verbose=0), predicted)


def test_a_model_with_a_preprocessor_reads_token_ids_as_without_one():
    # keras-hub maps the preprocessor over everything fit/evaluate/predict
    # read, and the tokenizer refused ids with a traceback: a preset's model
    # could not train on ids, nor on the ordered segments the library's
    # messages point to. Ids now go to the model as they are.
    texts = tf.data.Dataset.from_tensor_slices(
        ["hello world, this is one long text that continues",
         "and here is the second long stream of text ok"])
    config = tiny_config(vocabulary_size=256, segment_length=8, memory_length=8)
    results = []
    for preprocessor in (byte_preprocessor(), None):
        keras.utils.set_random_seed(3)
        model = TransformerXLCausalLM(config, preprocessor=preprocessor,
                                      stateful=True, batch_size=2)
        model.compile(optimizer=keras.optimizers.SGD(0.1), weighted_metrics=None)
        segments = byte_preprocessor().ordered_segments(texts, 2)
        model.reset_memory()
        loss = model.fit(segments, epochs=1, verbose=0, shuffle=False).history["loss"]
        model.reset_memory()
        evaluated = model.evaluate(segments, verbose=0, return_dict=True)["loss"]
        model.reset_memory()
        predicted = model.predict(segments.map(lambda x, y: x), verbose=0)
        inputs, targets = next(iter(segments))
        model.reset_memory()
        arrays = model.evaluate(inputs.numpy(), targets.numpy(), batch_size=2,
                                verbose=0, return_dict=True)["loss"]
        results.append((loss, evaluated, predicted, arrays))
    for got, expected in zip(*results):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_shuffled_data_is_refused_where_the_memory_carries_rows(tmp_path):
    # ordered_segments reads the texts once per stream: a shuffle drawing a
    # new order at every pass gave each row another order (texts repeated
    # in several rows, others lost); shuffled id batches ran each row's
    # memory on into unrelated segments. Both passed in silence.
    texts = [chr(ord("a") + i) * 5 for i in range(20)]
    preprocessor = byte_preprocessor(sequence_length=4)
    data = tf.data.Dataset.from_tensor_slices(texts)
    with pytest.raises(ValueError, match="`texts` are shuffled anew at every pass"):
        preprocessor.ordered_segments(data.shuffle(20), 4)
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text("some text in a file\n" * 4)
    lines = tf.data.TextLineDataset(tf.data.Dataset.list_files(str(tmp_path / "*.txt")))
    model = TransformerXLCausalLM(
        tiny_config(vocabulary_size=256, segment_length=4, memory_length=4),
        preprocessor=preprocessor, stateful=True, batch_size=2)
    model.compile(optimizer="sgd", weighted_metrics=None)
    with pytest.raises(ValueError, match="`texts` are shuffled anew"):
        model.fit(lines, verbose=0)  # list_files shuffles by default
    # A fixed order (reshuffle_each_iteration=False) is one order: every
    # text lands in exactly one stream.
    fixed = preprocessor.ordered_segments(
        data.shuffle(20, seed=1, reshuffle_each_iteration=False), 4,
        drop_remainder=False)
    batches = list(fixed.as_numpy_iterator())
    rows = np.concatenate([x for x, _ in batches] + [batches[-1][1][:, -1:]], axis=1)
    streams = "".join(bytes(row.astype("uint8")).decode() for row in rows)
    assert sorted(streams) == sorted("".join(texts))  # 100 tokens, 4 x 25
    # Id batches of a stateful model: any shuffle, named by argument.
    ids = lm_dataset(np.arange(200) % 256, 2, 4)
    before = model.memory.numpy().copy()
    for call, kwargs, name in (
        (model.fit, {"x": ids.shuffle(8)}, "`x`"),
        (model.fit, {"x": ids, "validation_data": ids.shuffle(8)}, "`validation_data`"),
        (model.evaluate, {"x": ids.shuffle(8, reshuffle_each_iteration=False)}, "`x`"),
        (model.predict, {"x": ids.map(lambda x, y: x).shuffle(8)}, "`x`"),
    ):
        with pytest.raises(ValueError, match=f"{name} is a shuffled tf.data.Dataset"):
            call(verbose=0, **kwargs)
    np.testing.assert_array_equal(model.memory.numpy(), before)


def test_a_stateful_model_refuses_padding_into_its_memory():
    # keras-hub's preprocessor pads each string; in a stateful model the
    # padding became the memory the next batch read (log-probs 6 nats off).
    preprocessor = byte_preprocessor()
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=256, segment_length=8,
                                              memory_length=8),
                                  preprocessor=preprocessor, stateful=True, batch_size=2)
    x, _, _ = preprocessor(["ab", "cd"])
    before = model.memory.numpy().copy()
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError),
                       match="this batch holds padding"):
        model(x)
    np.testing.assert_array_equal(model.memory.numpy(), before)
    full, _, _ = preprocessor(["abcdefghijkl", "mnopqrstuvwx"])  # no padding: read
    assert bool(tf.reduce_all(full["padding_mask"]))
    model(full)
    # Padded rows in a dataset of preprocessed batches meet the run-time assert.
    model.preprocessor = None
    padded = tf.data.Dataset.from_tensors(x)
    with pytest.raises(tf.errors.InvalidArgumentError, match="this batch holds padding"):
        model.predict(padded, verbose=0)


def test_bad_generate_input_is_named():
    model = generation_model()
    model.preprocessor = None
    with pytest.raises(ValueError, match="empty list"):
        model.generate([], max_length=10)
    with pytest.raises(ValueError, match="`inputs`"):
        model.generate([1.5, 2.5], max_length=10)
    with pytest.raises(ValueError, match="`inputs`"):
        model.generate([[1, 2], "text"], max_length=10)
    with pytest.raises(ValueError, match="no preprocessor"):
        model.generate(["text"], max_length=10)
    with pytest.raises(ValueError, match="`max_length`=8 is shorter than the longest prompt"):
        model.generate(prompts(), max_length=8)
    with pytest.raises(ValueError, match="vocabulary_size=31"):
        model.generate([[1, 40]], max_length=8)
    with pytest.raises(ValueError, match="`sampler` must be one of"):
        model.compile(sampler="nucleus")


def test_a_tokenizer_of_another_vocabulary_is_refused():
    with pytest.raises(ValueError, match="vocabulary of 256 tokens .* vocabulary_size=31"):
        TransformerXLCausalLM(tiny_config(vocabulary_size=31), preprocessor=byte_preprocessor())


def test_fit_on_a_dataset_of_strings_without_state_takes_each_string_as_a_sample():
    # keras-hub's way, and the same as fit() on the list of those strings.
    texts = ["some text here", "and another one", "a third", "the fourth one"]
    losses = []
    for data in (texts, tf.data.Dataset.from_tensor_slices(texts).batch(2)):
        keras.utils.set_random_seed(0)
        model = TransformerXLCausalLM(tiny_config(vocabulary_size=256),
                                      preprocessor=byte_preprocessor())
        model.compile(optimizer=keras.optimizers.SGD(0.1))
        losses.append(model.fit(data, batch_size=None if len(losses) else 2, epochs=2,
                                shuffle=False, verbose=0).history["loss"])
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    bare = TransformerXLCausalLM(tiny_config(vocabulary_size=256))
    with pytest.raises(ValueError, match="needs a preprocessor"):
        bare.fit(tf.data.Dataset.from_tensor_slices(texts))


def test_fit_under_mirrored_strategy_builds_from_int_ids_and_gives_each_replica_its_rows():
    # Keras 3 built a distributed model from the replicas' MEAN batch (int
    # ids turned float, bool masks failed); a stateful model's batch_size is
    # each replica's, so ordered segments need batch_size x replicas streams.
    from testing import mirrored_strategy

    strategy = mirrored_strategy()
    ids = random_ids((4, 9), 256)
    with strategy.scope():
        model = TransformerXLCausalLM(tiny_config(vocabulary_size=256))
        model.compile(optimizer="adam")
    history = model.fit(ids[:, :-1], ids[:, 1:], batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    with strategy.scope():
        stateful = TransformerXLCausalLM(
            tiny_config(vocabulary_size=256), preprocessor=byte_preprocessor(),
            stateful=True, batch_size=2)
        stateful.compile(optimizer="adam")
    texts = tf.data.Dataset.from_tensor_slices(["hello world, the quick brown fox"] * 4)
    history = stateful.fit(texts, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    with strategy.scope():
        strings = TransformerXLCausalLM(tiny_config(vocabulary_size=256),
                                        preprocessor=byte_preprocessor())
        strings.compile(optimizer="adam")
    history = strings.fit(["hello world", "the quick brown fox"], batch_size=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()


# --- presets ----------------------------------------------------------------------


def word_preset(tmp_path, vocabulary=("<eos>", "<unk>", "the", "cat", "sat")):
    from keras_txl.tokenizers import WordTokenizer

    keras.utils.set_random_seed(0)
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=len(vocabulary)))
    folder = tmp_path / "preset"
    keras_txl.save_preset(model, str(folder), tokenizer=WordTokenizer(list(vocabulary)))
    return model, folder


def test_a_preset_round_trips_config_weights_tokenizer_and_preprocessor(tmp_path):
    model, folder = word_preset(tmp_path)
    for name in ("config.json", "model.weights.h5", "task.json", "preprocessor.json",
                 "tokenizer.json", "assets/tokenizer/vocabulary.txt"):
        assert (folder / name).is_file(), name
    loaded = TransformerXLCausalLM.from_preset(str(folder))
    assert loaded.txl_config == model.txl_config
    for a, b in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    ids = random_ids((2, 6), 5)
    np.testing.assert_array_equal(
        loaded.call_with_memory(ids)["log_probs"], model.call_with_memory(ids)["log_probs"])
    assert loaded.preprocessor.tokenizer.get_vocabulary() == ["<eos>", "<unk>", "the", "cat", "sat"]
    # keras-hub's own entry points read the same folder.
    assert isinstance(keras_hub.models.CausalLM.from_preset(str(folder)), TransformerXLCausalLM)
    assert isinstance(keras_hub.models.Backbone.from_preset(str(folder)), TransformerXLBackbone)
    # load_pretrained reads presets too, with its settings.
    stateful = keras_txl.load_pretrained(str(folder), stateful=True, batch_size=2,
                                         memory_length=9)
    assert stateful.stateful and stateful.txl_config.memory_length == 9
    # Strings in, strings out: the word tokenizer's <eos> is the stop token.
    loaded.compile(sampler="greedy")
    texts = loaded.generate(["the cat", "sat"], max_length=8)
    assert texts[0].startswith("the cat") and texts[1].startswith("sat")


def test_a_preset_missing_its_tokenizer_is_refused_by_name(tmp_path):
    _, folder = word_preset(tmp_path)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="tokenizer.json: its tokenizer is missing"):
        TransformerXLCausalLM.from_preset(str(folder))
    _, folder = word_preset(tmp_path / "b")
    (folder / "assets" / "tokenizer" / "vocabulary.txt").unlink()
    with pytest.raises(ValueError, match="vocabulary.txt"):
        TransformerXLCausalLM.from_preset(str(folder))


def test_a_preset_whose_tokenizer_has_another_vocabulary_is_refused(tmp_path):
    _, folder = word_preset(tmp_path)
    (folder / "assets" / "tokenizer" / "vocabulary.txt").write_text(
        "<eos>\n<unk>\nthe\ncat\nsat\ndog\n")
    # The manifest save_preset wrote notices the edit; without it (a folder
    # put together by hand) the vocabulary check names the mismatch.
    with pytest.raises(ValueError, match=r"vocabulary.txt has \d+ bytes, .*manifest.json says"):
        TransformerXLCausalLM.from_preset(str(folder))
    (folder / "manifest.json").unlink()
    with pytest.raises(ValueError, match="vocabulary of 6 tokens .* vocabulary_size=5"):
        TransformerXLCausalLM.from_preset(str(folder))


def test_a_hostile_preset_config_is_refused_before_building(tmp_path):
    import json

    _, folder = word_preset(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["config"]["num_layers"] = 100_000
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="num_layers"):
        TransformerXLCausalLM.from_preset(str(folder))
    config["class_name"] = "GPT2Backbone"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="not a TransformerXLBackbone"):
        TransformerXLCausalLM.from_preset(str(folder))
    _, folder = word_preset(tmp_path / "b")
    (folder / "model.weights.h5").unlink()
    with pytest.raises(ValueError, match="model.weights.h5"):
        TransformerXLCausalLM.from_preset(str(folder))
    _, folder = word_preset(tmp_path / "c")
    data = (folder / "model.weights.h5").read_bytes()
    (folder / "model.weights.h5").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"model.weights.h5 has \d+ bytes, .*manifest.json says"):
        TransformerXLCausalLM.from_preset(str(folder))
    (folder / "manifest.json").unlink()
    with pytest.raises(ValueError, match="Could not read the preset"):
        TransformerXLCausalLM.from_preset(str(folder))


@pytest.mark.parametrize("field, value, message", [
    ("num_layers", -1, r"`num_layers` must be a positive integer, received num_layers=-1"),
    ("hidden_dim", "8", r"`hidden_dim` must be a positive integer, received hidden_dim='8'"),
    ("dropout", None, r"`dropout` must be in \[0, 1\)"),
    ("vocabulary_size", "missing", r"Missing required config key\(s\) \['vocabulary_size'\]"),
    ("attention_heads", 4, r"Unknown config key\(s\) \['attention_heads'\]"),
    # The layer keys: Keras' and keras-hub's own errors named no file (a
    # dtype given as a plain string was an AttributeError in keras-hub).
    ("name", 5, r'"name" must be a non-empty string without "/", received name=5'),
    ("trainable", "no", r'"trainable" must be true or false'),
    ("dtype", "float32", r'"dtype" must be a serialized Keras dtype policy .* '
                         r"received dtype='float32'"),
    ("dtype", {"module": "os", "class_name": "system", "config": {}}, r'"dtype" must be'),
])
def test_a_wrong_field_in_a_preset_config_is_named_with_its_file(tmp_path, field, value,
                                                                 message):
    import json

    _, folder = word_preset(tmp_path)
    (folder / "manifest.json").unlink()  # a hand-edited preset
    for name, nested in (("config.json", ()), ("task.json", ("backbone",))):
        data = json.loads((folder / name).read_text())
        config = data["config"]
        for key in nested:
            config = config[key]["config"]
        if value == "missing":
            del config[field]
        else:
            config[field] = value
        (folder / name).write_text(json.dumps(data))
    path = os.path.join(str(folder), "config.json")
    for load in (TransformerXLCausalLM.from_preset, keras_txl.load_pretrained):
        with pytest.raises(ValueError, match=re.escape(path) + ": .*" + message):
            load(str(folder))


def test_backbone_from_preset_checks_the_folder_as_the_causal_lm_does(tmp_path):
    # TransformerXLBackbone.from_preset was keras-hub's own loader: no
    # limits, no JSON bounds, and a config naming another class_name (with
    # keras-txl's registered_name) loaded.
    import json

    model = TransformerXLCausalLM(tiny_config())
    ids = random_ids((2, 4))
    for folder, save in ((tmp_path / "task", model.save_to_preset),
                         (tmp_path / "backbone", model.backbone.save_to_preset)):
        save(str(folder))
        loaded = TransformerXLBackbone.from_preset(str(folder))
        assert isinstance(loaded, TransformerXLBackbone)
        for a, b in zip(model.backbone.weights, loaded.weights):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        np.testing.assert_array_equal(keras.tree.flatten(loaded(ids))[0],
                                      keras.tree.flatten(model.backbone(ids))[0])
        with pytest.raises(ValueError, match="exceeds the limit max_parameters=10"):
            TransformerXLBackbone.from_preset(str(folder), limits={"max_parameters": 10})
    folder = tmp_path / "task"
    with pytest.raises(ValueError, match="must be a preset folder, received the file"):
        TransformerXLBackbone.from_preset(str(folder / "config.json"))
    with pytest.raises(ValueError, match="'tiny' is a keras-txl architecture"):
        TransformerXLBackbone.from_preset("tiny")
    data = json.loads((folder / "config.json").read_text())
    data["class_name"] = "GPT2Backbone"
    (folder / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="describes a 'GPT2Backbone', not a TransformerXLBackbone"):
        TransformerXLBackbone.from_preset(str(folder))
    (folder / "config.json").write_text('{"a":' * 1000 + "1" + "}" * 1000)
    with pytest.raises(ValueError, match="more than the 64 allowed"):
        TransformerXLBackbone.from_preset(str(folder))
    weights = tmp_path / "backbone" / "model.weights.h5"
    weights.unlink()
    weights.symlink_to("/dev/zero")
    with pytest.raises(ValueError, match="model.weights.h5' is a character device"):
        TransformerXLBackbone.from_preset(str(tmp_path / "backbone"))


def test_from_preset_on_other_folders_says_what_to_use(tmp_path):
    model = TransformerXLCausalLM(tiny_config())
    keras_txl.save_pretrained(model, str(tmp_path / "weights"))
    with pytest.raises(ValueError, match="keras-txl folder, not a keras-hub preset"):
        TransformerXLCausalLM.from_preset(str(tmp_path / "weights"))
    # An architecture name (the README's `tiny`) is not a preset of weights.
    with pytest.raises(ValueError, match=r"'tiny' is a keras-txl architecture .*"
                       r"TransformerXLConfig.from_preset\('tiny'\)"):
        TransformerXLCausalLM.from_preset("tiny")


def test_a_kaggle_handle_without_network_fails_at_once(tmp_path, monkeypatch):
    # kagglehub asked the Kaggle API once per file keras-hub reads, each
    # connection without a timeout: ~35 s offline before an error.
    import time

    import kagglehub
    from kagglesdk import kaggle_env

    monkeypatch.setenv("KAGGLEHUB_CACHE", str(tmp_path / "kaggle"))
    monkeypatch.setenv("KAGGLE_API_ENVIRONMENT", "TEST")
    monkeypatch.setitem(kaggle_env._env_to_endpoint, kaggle_env.KaggleEnv.TEST,
                        "http://127.0.0.1:9")  # a refused port, no network
    downloads = []
    monkeypatch.setattr(kagglehub, "model_download", lambda *a, **k: downloads.append(a))
    for handle in ("kaggle://someone/txl/keras/tiny", "kaggle://someone/txl/keras/tiny/2"):
        start = time.monotonic()
        for load in (TransformerXLCausalLM.from_preset, TransformerXLBackbone.from_preset):
            with pytest.raises(ValueError, match=re.escape(
                    f"Could not reach Kaggle (http://127.0.0.1:9) to download `preset` "
                    f"'{handle}' (ConnectionError")):
                load(handle)
        assert time.monotonic() - start < 10
    assert downloads == []  # failed before kagglehub's first request


def test_an_hf_handle_without_network_fails_at_once_and_a_cached_one_loads(
        tmp_path, monkeypatch):
    # No network: huggingface_hub retried each file missing from its cache
    # for ~25 s, then keras-hub said "Preset ... has no config.json", as it
    # did at once with HF_HUB_OFFLINE set. The Hub is made unreachable here
    # (a refused local port), the cache a temporary folder.
    import shutil
    import time

    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        "http://127.0.0.1:9/{repo_id}/resolve/{revision}/{filename}")
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"Could not reach the Hugging Face Hub "
                       r"\(http://127.0.0.1:9\) to download `preset` 'hf://someone/txl' "
                       r"\(.*\), and it is not in the Hugging Face cache"):
        TransformerXLCausalLM.from_preset("hf://someone/txl")
    assert time.monotonic() - started < 5
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match=r"'hf://someone/txl' is not in the Hugging Face "
                       r"cache \(.*hub\), and HF_HUB_OFFLINE is set"):
        TransformerXLCausalLM.from_preset("hf://someone/txl")
    # A preset in the cache loads, offline or with the Hub unreachable.
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=256),
                                  preprocessor=byte_preprocessor())
    ids = random_ids((1, 6), 256)
    model.save_to_preset(str(tmp_path / "preset"))
    repo = tmp_path / "hub" / "models--someone--txl"
    shutil.copytree(tmp_path / "preset", repo / "snapshots" / ("0" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    for offline in (True, False):
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
        started = time.monotonic()
        loaded = TransformerXLCausalLM.from_preset("hf://someone/txl")
        assert time.monotonic() - started < 15
        np.testing.assert_array_equal(loaded.call_with_memory(ids)["log_probs"],
                                      model.call_with_memory(ids)["log_probs"])


@pytest.mark.parametrize("imports", [
    # `import keras_txl` alone, before and after Keras: its modules are
    # deferred, yet Keras and keras-hub find the classes by registered name.
    "import keras_txl, keras_hub",
    "import keras_hub, keras_txl",
    # keras-hub first imported from inside one of keras-txl's own modules.
    "import keras_txl.tokenizers, keras_hub",
])
def test_keras_and_keras_hubs_own_loaders_find_the_classes_in_a_fresh_process(
        tmp_path, imports):
    import subprocess
    import sys

    model, folder = word_preset(tmp_path)
    model.save(str(tmp_path / "model.keras"))
    code = (
        f"{imports}\nimport keras\n"
        f"m = keras_hub.models.CausalLM.from_preset({str(folder)!r})\n"
        "m.compile(sampler='greedy')\n"
        f"b = keras_hub.models.Backbone.from_preset({str(folder)!r})\n"
        f"k = keras.models.load_model({str(tmp_path / 'model.keras')!r})\n"
        "print(type(m).__name__, type(m.preprocessor.tokenizer).__name__,"
        " m.generate(['the cat'], max_length=6)[0].startswith('the cat'),"
        " type(b).__name__, type(k).__name__)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-5:] == [
        "TransformerXLCausalLM", "WordTokenizer", "True", "TransformerXLBackbone",
        "TransformerXLCausalLM"]


def test_importing_keras_txl_alone_still_loads_no_keras():
    import subprocess
    import sys

    # The registration waits for Keras: `txl --help` and the serving client
    # import keras_txl and its light modules without TensorFlow.
    code = ("import sys, keras_txl, keras_txl.host, keras_txl.checks\n"
            "print(sorted(m.split('.')[0] for m in sys.modules\n"
            "             if m.split('.')[0] in ('keras', 'keras_hub', 'tensorflow')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-1] == "[]"


def test_a_backbones_preset_loads_as_a_causal_lm(tmp_path):
    # TransformerXLBackbone.save_to_preset writes config.json and the weights
    # alone: loading it as a CausalLM was a TypeError inside keras-hub
    # ("TransformerXLCausalLMPreprocessor.__init__() missing ... 'tokenizer'").
    keras.utils.set_random_seed(0)
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=256))
    ids = random_ids((2, 6), 256)
    expected = model.call_with_memory(ids)["log_probs"]
    folder = tmp_path / "backbone"
    model.backbone.save_to_preset(str(folder))
    for load in (TransformerXLCausalLM.from_preset, keras_txl.load_pretrained):
        loaded = load(str(folder))
        assert loaded.preprocessor is None
        np.testing.assert_array_equal(loaded.call_with_memory(ids)["log_probs"], expected)
    with pytest.raises(ValueError, match=r"has no tokenizer.json to build a "
                       r"TransformerXLCausalLMPreprocessor from"):
        keras_hub.models.CausalLM.from_preset(str(folder))
    # With its tokenizer beside it, keras-hub's own loader builds the preprocessor.
    byte_preprocessor().tokenizer.save_to_preset(str(folder))
    for load in (TransformerXLCausalLM.from_preset, keras_hub.models.CausalLM.from_preset):
        loaded = load(str(folder))
        assert loaded.preprocessor.tokenizer.vocabulary_size() == 256
        np.testing.assert_array_equal(loaded.call_with_memory(ids)["log_probs"], expected)


def test_keras_hubs_own_loaders_check_the_manifest_too(tmp_path):
    # keras_hub.models.CausalLM.from_preset never calls
    # TransformerXLCausalLM.from_preset: the backbone's load_weights checks.
    _, folder = word_preset(tmp_path)
    path = folder / "model.weights.h5"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    for load in (keras_hub.models.CausalLM.from_preset, keras_hub.models.Backbone.from_preset):
        with pytest.raises(ValueError, match=r"model.weights.h5 does not match the sha256 in "
                                             r".*manifest.json"):
            load(str(folder))


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_a_mixed_precision_model_saves_a_preset_that_loads(tmp_path, policy):
    # keras-hub cannot read a mixed policy's name in a preset's config
    # ("Invalid dtype"): the preset holds the float32 weights, and loads in
    # the loader's policy or the one asked for.
    keras.config.set_dtype_policy(policy)
    try:
        model = TransformerXLCausalLM(tiny_config(vocabulary_size=256), preprocessor=byte_preprocessor())
    finally:
        keras.config.set_dtype_policy("float32")
    folder = str(tmp_path / "preset")
    keras_txl.save_preset(model, folder)
    for loaded in (TransformerXLCausalLM.from_preset(folder), keras_txl.load_pretrained(folder),
                   keras_hub.models.CausalLM.from_preset(folder)):
        assert loaded.dtype_policy.name == "float32"
        for a, b in zip(loaded.get_weights(), model.get_weights()):
            np.testing.assert_array_equal(a, b)
    again = TransformerXLCausalLM.from_preset(folder, dtype=policy)
    assert again.dtype_policy.name == policy
    ids = random_ids((1, 6), 256)
    np.testing.assert_array_equal(again.call_with_memory(ids)["log_probs"],
                                  model.call_with_memory(ids)["log_probs"])
    # A folder written before this fix (its config names the mixed policy,
    # and it has no manifest) loads in the current policy too.
    import json

    (tmp_path / "preset" / "manifest.json").unlink()
    for name in ("config.json", "task.json"):
        path = tmp_path / "preset" / name
        path.write_text(path.read_text().replace('"name": "float32"', f'"name": "{policy}"'))
    assert json.loads((tmp_path / "preset" / "config.json").read_text())["config"]["dtype"][
        "config"]["name"] == policy
    assert TransformerXLCausalLM.from_preset(folder).dtype_policy.name == "float32"


def test_a_bfloat16_model_saves_a_preset_that_loads(tmp_path):
    # keras-hub loads a preset in bfloat16 (`dtype="bfloat16"`); Keras stores
    # bfloat16 weights as 2-byte opaque HDF5 data marked dtype="bfloat16",
    # which the weights check read as "void16" and refused.
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=256), preprocessor=byte_preprocessor())
    model.save_to_preset(str(tmp_path / "f32"))
    half = TransformerXLCausalLM.from_preset(str(tmp_path / "f32"), dtype="bfloat16")
    assert half.dtype_policy.name == "bfloat16"
    folder = str(tmp_path / "bf16")
    half.save_to_preset(folder)
    rounded = [np.asarray(w, "float32") for w in half.get_weights()]
    for loaded in (TransformerXLCausalLM.from_preset(folder), keras_txl.load_pretrained(folder)):
        for a, b in zip(loaded.get_weights(), rounded):
            np.testing.assert_array_equal(np.asarray(a, "float32"), b)
    again = TransformerXLCausalLM.from_preset(folder, dtype="bfloat16")
    ids = random_ids((1, 6), 256)
    np.testing.assert_array_equal(again.call_with_memory(ids)["log_probs"],
                                  half.call_with_memory(ids)["log_probs"])
    # An integer tensor is still refused.
    import h5py

    with h5py.File(tmp_path / "bf16" / "model.weights.h5", "r+") as f:
        name = next(k for k in _datasets(f) if f[k].attrs.get("dtype") == "bfloat16")
        data = f[name][()]
        del f[name]
        f[name] = np.zeros(data.shape, "int16")
        f[name].attrs["dtype"] = "bfloat16"
    (tmp_path / "bf16" / "manifest.json").unlink()
    with pytest.raises(ValueError, match=r"\(int16\): a weight must be one of"):
        TransformerXLCausalLM.from_preset(folder)


def test_a_quantized_model_saves_a_preset_that_loads(tmp_path):
    # `quantize("int8")` leaves a DTypePolicyMap as the dtype and int8
    # kernels: save_to_preset wrote them (keras-hub's CausalLM.from_preset
    # loads such a preset), but TransformerXLCausalLM.from_preset refused its
    # config.json ("dtype" must be a serialized Keras dtype policy) and its
    # int8 weights, and the backbone loaded unquantized (keras-hub's backbone
    # loader drops the saved dtype): "expected 2 variables, but received 0".
    keras.utils.set_random_seed(0)
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=31, hidden_dim=16,
                                              intermediate_dim=32))
    model.quantize("int8")
    ids = random_ids((2, 8), 31)
    expected = model.call_with_memory(ids)
    folder = tmp_path / "preset"
    model.save_to_preset(str(folder))
    for load in (TransformerXLCausalLM.from_preset, keras_hub.models.CausalLM.from_preset):
        loaded = load(str(folder))
        assert loaded.backbone.blocks[0].intermediate_dense.quantization_mode == "int8"
        np.testing.assert_array_equal(loaded.call_with_memory(ids)["log_probs"],
                                      expected["log_probs"])
    backbone = TransformerXLBackbone.from_preset(str(folder))
    assert backbone.blocks[0].output_dense.quantization_mode == "int8"
    np.testing.assert_array_equal(backbone(ids)[0], model.backbone(ids)[0])


def test_a_model_quantized_in_place_copies_with_other_settings():
    # with_settings built a float copy of a model quantized by `quantize`
    # (its policies stay float at the top): "assign_weights_from() needs a
    # model with the same architecture; the weight shapes differ".
    keras.utils.set_random_seed(0)
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=31, hidden_dim=16,
                                              intermediate_dim=32))
    model.quantize("int8")
    ids = random_ids((2, 8), 31)
    stateful = model.with_settings(stateful=True, batch_size=2)
    assert stateful.backbone.blocks[1].output_dense.quantization_mode == "int8"
    np.testing.assert_array_equal(stateful(ids), model.call_with_memory(ids)["log_probs"])
    # Another evaluation memory, the same quantized weights.
    longer = model.with_settings(memory_length=8)
    for a, b in zip(longer.model_weights(), model.model_weights()):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def test_a_stateful_mixed_precision_model_saves_a_preset_keras_hub_loads(tmp_path):
    # The float32 rewrite skipped stateful models: their preset named the
    # mixed policy and keras-hub's loader refused it ("Invalid dtype").
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=256), stateful=True,
                                  batch_size=2, dtype="mixed_bfloat16")
    model(random_ids((2, 4), 256))  # a memory that is not zeros
    folder = str(tmp_path / "preset")
    model.save_to_preset(folder)
    assert model.dtype_policy.name == "mixed_bfloat16"  # the model itself is unchanged
    for loaded in (keras_hub.models.CausalLM.from_preset(folder),
                   TransformerXLCausalLM.from_preset(folder)):
        assert (loaded.stateful, loaded.batch_size) == (True, 2)
        assert loaded.dtype_policy.name == "float32"
        for a, b in zip(loaded.model_weights(), model.model_weights()):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        np.testing.assert_array_equal(loaded.memory.numpy(), model.memory.numpy())


def test_save_preset_replaces_only_a_preset(tmp_path):
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=256), preprocessor=byte_preprocessor())
    keeper = tmp_path / "notes.txt"
    keeper.write_text("precious")
    with pytest.raises(ValueError, match="is a file, not a preset folder: refusing"):
        keras_txl.save_preset(model, str(keeper))
    assert keeper.read_text() == "precious"
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "important.txt").write_text("x")
    with pytest.raises(ValueError, match=r"holds files that are not a keras-hub preset "
                       r"\(important.txt\)"):
        keras_txl.save_preset(model, str(folder))
    assert (folder / "important.txt").read_text() == "x"
    # A preset (and an empty folder) is replaced; files added to a preset
    # are not lost either.
    preset = tmp_path / "preset"
    keras_txl.save_preset(model, str(preset))
    keras_txl.save_preset(model, str(preset))
    (tmp_path / "empty").mkdir()
    keras_txl.save_preset(model, str(tmp_path / "empty"))
    assert (tmp_path / "empty" / "config.json").is_file()
    (preset / "notes.md").write_text("mine")
    with pytest.raises(ValueError, match=r"\(notes.md\)"):
        keras_txl.save_preset(model, str(preset))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "notes.txt", "preset", "work"]
    # Written under temporary names, the folder and its files still get the
    # modes a plain mkdir / open would (0o755 / 0o644 under the umask).
    mask = os.umask(0)
    os.umask(mask)
    assert (preset.stat().st_mode & 0o777) == 0o777 & ~mask
    keras_txl.save_pretrained(model, str(tmp_path / "weights"))
    assert ((tmp_path / "weights" / "model.safetensors").stat().st_mode & 0o777) == 0o666 & ~mask


def test_a_save_to_preset_killed_midway_leaves_the_previous_preset(tmp_path, monkeypatch):
    # keras-hub's save_to_preset writes into the folder file by file: killed
    # after the weights, a preset without a manifest (keras-hub's own, or an
    # older keras-txl's) loaded the new weights with the old tokenizer files.
    import json

    from keras_hub.src.utils import preset_utils

    old = TransformerXLCausalLM(tiny_config(vocabulary_size=256), preprocessor=byte_preprocessor())
    ids = random_ids((1, 6), 256)
    expected = old.call_with_memory(ids)["log_probs"]
    folder = tmp_path / "preset"
    old.save_to_preset(str(folder))
    (folder / "manifest.json").unlink()
    keras.utils.set_random_seed(1)
    new = TransformerXLCausalLM(tiny_config(vocabulary_size=256, init_std=0.5),
                                preprocessor=byte_preprocessor(sequence_length=5))

    def killed(self, *args, **kwargs):
        raise KeyboardInterrupt("killed while writing")

    for name in ("save_preprocessor", "save_backbone", "save_task"):
        with monkeypatch.context() as patch:
            patch.setattr(preset_utils.KerasPresetSaver, name, killed)
            for target in (folder, tmp_path / "new"):
                with pytest.raises(KeyboardInterrupt):
                    new.save_to_preset(str(target))
        loaded = TransformerXLCausalLM.from_preset(str(folder))
        np.testing.assert_array_equal(loaded.call_with_memory(ids)["log_probs"], expected)
        saved = json.loads((folder / "preprocessor.json").read_text())
        assert saved["config"]["sequence_length"] == 8  # the old one, whole
        assert sorted(p.name for p in tmp_path.iterdir()) == ["preset"]
    new.save_to_preset(str(folder))  # and a complete save replaces it
    np.testing.assert_array_equal(
        TransformerXLCausalLM.from_preset(str(folder)).call_with_memory(ids)["log_probs"],
        new.call_with_memory(ids)["log_probs"])
    assert TransformerXLCausalLM.from_preset(str(folder)).preprocessor.sequence_length == 5


def test_a_parts_save_to_preset_is_atomic_and_checked(tmp_path, monkeypatch):
    # TransformerXLBackbone's (and the preprocessor's and tokenizer's)
    # save_to_preset were keras-hub's own: written file by file into the
    # folder (a failure after config.json left the new config beside the old
    # weights) and without a manifest (a changed byte loaded in silence).
    import json

    keras.utils.set_random_seed(0)
    old = TransformerXLCausalLM(tiny_config(vocabulary_size=256))
    ids = random_ids((1, 6), 256)

    def outputs(backbone):
        return keras.tree.flatten(backbone(ids))[0]

    folder = tmp_path / "preset"
    old.backbone.save_to_preset(str(folder))
    byte_preprocessor().save_to_preset(str(folder))  # keras-hub's way to add one
    assert json.loads((folder / "manifest.json").read_text())["files"].keys() >= {
        "config.json", "model.weights.h5", "preprocessor.json", "tokenizer.json"}
    before = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    keras.utils.set_random_seed(1)
    new = TransformerXLCausalLM(tiny_config(vocabulary_size=256, num_layers=3, init_std=0.5))

    def failing(self, *args, **kwargs):
        raise OSError("No space left on device")

    for save in (lambda: new.backbone.save_to_preset(str(folder)),
                 lambda: byte_preprocessor(sequence_length=5).save_to_preset(str(folder)),
                 lambda: byte_preprocessor().tokenizer.save_to_preset(str(folder))):
        with monkeypatch.context() as patch:
            # After config.json is written (the backbone), or the preprocessor's JSON.
            patch.setattr(TransformerXLBackbone, "save_weights", failing)
            patch.setattr(keras_txl.tokenizers.ByteTokenizer, "save_assets", failing)
            with pytest.raises(OSError, match="No space left"):
                save()
        after = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
        assert after == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["preset"]
    # A complete save replaces the backbone and keeps the preprocessor; keras-hub's
    # own loaders read it, and a changed byte is found.
    new.backbone.save_to_preset(str(folder))
    for load in (keras_hub.models.Backbone.from_preset, TransformerXLBackbone.from_preset):
        np.testing.assert_array_equal(outputs(load(str(folder))), outputs(new.backbone))
    loaded = keras_hub.models.CausalLM.from_preset(str(folder))
    assert loaded.preprocessor.sequence_length == 8
    np.testing.assert_array_equal(loaded.call_with_memory(ids)["log_probs"],
                                  new.call_with_memory(ids)["log_probs"])
    path = folder / "model.weights.h5"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"model.weights.h5 does not match the sha256"):
        keras_hub.models.Backbone.from_preset(str(folder))
    # The tokenizer first, then the backbone: both kept.
    other = tmp_path / "other"
    byte_preprocessor().tokenizer.save_to_preset(str(other))
    old.backbone.save_to_preset(str(other))
    loaded = keras_hub.models.CausalLM.from_preset(str(other))
    assert loaded.preprocessor.tokenizer.vocabulary_size() == 256
    np.testing.assert_array_equal(outputs(loaded.backbone), outputs(old.backbone))
    # Saved again as shards, the previous unsharded weights (which keras-hub
    # loads first) are gone; and a task's save still writes one manifest.
    new.backbone.save_to_preset(str(other), max_shard_size=1e-5)
    assert not (other / "model.weights.h5").exists() and (other / "model.weights.json").exists()
    np.testing.assert_array_equal(
        outputs(keras_hub.models.Backbone.from_preset(str(other))), outputs(new.backbone))
    old.save_to_preset(str(other))
    np.testing.assert_array_equal(
        outputs(TransformerXLCausalLM.from_preset(str(other)).backbone), outputs(old.backbone))
    # What a part's save copies is read as a loader reads it: a FIFO is named.
    (other / "metadata.json").unlink()
    os.mkfifo(other / "metadata.json")
    with pytest.raises(ValueError, match=r"The preset file '.*/metadata.json' is a FIFO"):
        byte_preprocessor().tokenizer.save_to_preset(str(other))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "preset"]


def test_a_sharded_preset_loads_and_its_shards_are_checked(tmp_path):
    # save_to_preset(..., max_shard_size=...) writes model.weights.json and
    # model_NNNNN.weights.h5 shards: keras-txl's own loaders refused the
    # preset it had just written ("has no model.weights.h5 (its weights):
    # an incomplete copy?"); keras-hub's loaded it.
    import json

    keras.utils.set_random_seed(0)
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=256))
    ids = random_ids((1, 6), 256)
    expected = model.call_with_memory(ids)["log_probs"]
    folder = tmp_path / "sharded"
    model.save_to_preset(str(folder), max_shard_size=1e-5)
    assert not (folder / "model.weights.h5").exists()
    shards = sorted(p.name for p in folder.glob("model_*.weights.h5"))
    assert len(shards) > 1
    for load in (TransformerXLCausalLM.from_preset, keras_txl.load_pretrained,
                 keras_hub.models.CausalLM.from_preset):
        np.testing.assert_array_equal(load(str(folder)).call_with_memory(ids)["log_probs"], expected)
    backbone = TransformerXLBackbone.from_preset(str(folder))
    np.testing.assert_array_equal(keras.tree.flatten(backbone(ids))[0],
                                  keras.tree.flatten(model.backbone(ids))[0])
    # A changed shard is found by keras-hub's own loader too.
    path = folder / shards[-1]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    for load in (TransformerXLCausalLM.from_preset, keras_hub.models.CausalLM.from_preset):
        with pytest.raises(ValueError, match=rf"{shards[-1]} does not match the sha256"):
            load(str(folder))
    # Without a manifest: a missing shard, a name leaving the folder, a FIFO.
    (folder / "manifest.json").unlink()
    path.unlink()
    with pytest.raises(ValueError, match=rf"model.weights.json names the weight shard "
                                         rf"'{shards[-1]}', which is not in the preset"):
        TransformerXLCausalLM.from_preset(str(folder))
    os.mkfifo(path)
    with pytest.raises(ValueError, match=rf"{shards[-1]}' is a FIFO"):
        TransformerXLCausalLM.from_preset(str(folder))
    index = json.loads((folder / "model.weights.json").read_text())
    index["weight_map"]["/vars"] = ["../../etc/passwd"]
    (folder / "model.weights.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"'../../etc/passwd' leaves the folder"):
        TransformerXLCausalLM.from_preset(str(folder))
    (folder / "model.weights.json").write_text('{"weight_map": {}}')
    with pytest.raises(ValueError, match=r"model.weights.json is not an index of weight shards"):
        TransformerXLCausalLM.from_preset(str(folder))
    (folder / "model.weights.json").unlink()
    with pytest.raises(ValueError, match=r"has no model.weights.h5 \(its weights\) nor "
                                         r"model.weights.json"):
        TransformerXLCausalLM.from_preset(str(folder))


def test_replacing_a_preset_keeps_its_model_card(tmp_path):
    # README.md (keras-hub's model card) is admitted in a preset folder, and
    # was deleted with the old preset when a save replaced it.
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=256), preprocessor=byte_preprocessor())
    folder = tmp_path / "preset"
    keras_txl.save_preset(model, str(folder))
    (folder / "README.md").write_text("# My model")
    keras_txl.save_preset(model, str(folder))
    model.save_to_preset(str(folder))
    assert (folder / "README.md").read_text() == "# My model"
    TransformerXLCausalLM.from_preset(str(folder))  # not in the manifest, not checked


def test_a_preset_of_another_model_is_not_replaced(tmp_path):
    # save_preset / save_to_preset replaced any keras-hub preset: a GPT-2
    # preset downloaded into the folder was deleted without a word.
    import json

    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(
        {"module": "keras_hub.src.models.gpt2.gpt2_backbone", "class_name": "GPT2Backbone",
         "config": {}, "registered_name": "keras_hub>GPT2Backbone"}))
    (folder / "model.weights.h5").write_bytes(b"not ours")
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=256), preprocessor=byte_preprocessor())
    for save in (lambda: keras_txl.save_preset(model, str(folder)),
                 lambda: model.save_to_preset(str(folder))):
        with pytest.raises(ValueError, match=r"is a keras-hub preset of another model "
                                             r"\('GPT2Backbone', not 'TransformerXLBackbone'\)"):
            save()
    assert (folder / "model.weights.h5").read_bytes() == b"not ours"


def test_a_whole_save_replaces_a_folder_holding_only_a_tokenizer_or_preprocessor(tmp_path):
    # A tokenizer's (or preprocessor's) save_to_preset writes a folder without
    # a config.json, to which a backbone's save adds; the whole model's save
    # (and save_preset) refused it: "holds files that are not a keras-hub
    # preset (assets, manifest.json, tokenizer.json)".
    keras.utils.set_random_seed(0)
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=256),
                                  preprocessor=byte_preprocessor(sequence_length=5))
    ids = random_ids((1, 6), 256)
    parts = {"tokenizer": lambda folder: byte_preprocessor().tokenizer.save_to_preset(folder),
             "preprocessor": lambda folder: byte_preprocessor().save_to_preset(folder)}
    saves = {"save_to_preset": lambda folder: model.save_to_preset(folder),
             "save_preset": lambda folder: keras_txl.save_preset(model, folder)}
    for part_name, part in parts.items():
        for save_name, save in saves.items():
            folder = tmp_path / f"{part_name}_{save_name}"
            part(str(folder))
            assert "config.json" not in os.listdir(folder)
            save(str(folder))
            loaded = TransformerXLCausalLM.from_preset(str(folder))
            assert loaded.preprocessor.sequence_length == 5
            np.testing.assert_array_equal(loaded.call_with_memory(ids)["log_probs"],
                                          model.call_with_memory(ids)["log_probs"])
    # A folder holding a lone weights file (a user's save_weights) is still refused.
    folder = tmp_path / "weights"
    folder.mkdir()
    (folder / "model.weights.h5").write_bytes(b"the user's")
    for save in saves.values():
        with pytest.raises(ValueError, match=r"holds files that are not a keras-hub preset "
                                             r"\(model.weights.h5\): refusing to replace it"):
            save(str(folder))
    assert (folder / "model.weights.h5").read_bytes() == b"the user's"


def test_a_backbone_save_over_a_task_preset_of_another_config_drops_the_task(tmp_path, caplog):
    # backbone.save_to_preset over a whole model's preset kept task.json and
    # task.weights.h5 (as keras-hub does): with another config the folder
    # then failed to load ("task.json describes another model than
    # config.json beside it"). The task files are the old backbone's: they
    # are dropped, with a warning, and kept when the config is the same.
    import logging

    keras.utils.set_random_seed(0)
    old = TransformerXLCausalLM(tiny_config(vocabulary_size=256),
                                preprocessor=byte_preprocessor(sequence_length=5))
    ids = random_ids((1, 6), 256)
    folder = tmp_path / "preset"
    old.save_to_preset(str(folder))
    assert {"task.json", "task.weights.h5"} <= set(os.listdir(folder))
    # The same config, other weights: the task files are kept, the new weights load.
    keras.utils.set_random_seed(1)
    same = TransformerXLCausalLM(tiny_config(vocabulary_size=256))
    with caplog.at_level(logging.WARNING, logger="keras_txl"):
        same.backbone.save_to_preset(str(folder))
    assert not [r for r in caplog.records if "task" in r.getMessage()]
    assert {"task.json", "task.weights.h5"} <= set(os.listdir(folder))
    for load in (TransformerXLCausalLM.from_preset, keras_hub.models.CausalLM.from_preset):
        loaded = load(str(folder))
        assert loaded.preprocessor.sequence_length == 5
        np.testing.assert_array_equal(loaded.call_with_memory(ids)["log_probs"],
                                      same.call_with_memory(ids)["log_probs"])
    # Another config: the task files are dropped, the folder loads the new backbone.
    other = TransformerXLCausalLM(tiny_config(vocabulary_size=256, num_layers=3))
    with caplog.at_level(logging.WARNING, logger="keras_txl"):
        other.backbone.save_to_preset(str(folder))
    assert "task.json" not in os.listdir(folder) and "task.weights.h5" not in os.listdir(folder)
    (message,) = [r.getMessage() for r in caplog.records if "task.json" in r.getMessage()]
    assert "num_layers=3" in message and "num_layers=2" in message and "removed" in message
    for load in (TransformerXLCausalLM.from_preset, keras_hub.models.CausalLM.from_preset):
        loaded = load(str(folder))
        assert loaded.preprocessor.sequence_length == 5  # preprocessor.json is kept
        np.testing.assert_array_equal(loaded.call_with_memory(ids)["log_probs"],
                                      other.call_with_memory(ids)["log_probs"])
    # A task.json that cannot be read is dropped too (the folder would not load).
    old.save_to_preset(str(folder))
    (folder / "task.json").write_text("[]")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="keras_txl"):
        old.backbone.save_to_preset(str(folder))
    assert "task.json" not in os.listdir(folder)
    assert any("a config that cannot be read" in r.getMessage() for r in caplog.records)
    np.testing.assert_array_equal(
        TransformerXLCausalLM.from_preset(str(folder)).call_with_memory(ids)["log_probs"],
        old.call_with_memory(ids)["log_probs"])


def test_a_dropped_stateful_task_names_the_settings_it_held(tmp_path, caplog):
    # The warning named the backbone's changed field but not that the task
    # it removed was stateful: a later from_preset loaded a model without
    # state, and nothing said which settings to pass to get it back.
    import logging

    keras.utils.set_random_seed(0)
    old = TransformerXLCausalLM(tiny_config(vocabulary_size=256), stateful=True, batch_size=3)
    folder = tmp_path / "preset"
    old.save_to_preset(str(folder))
    other = TransformerXLCausalLM(tiny_config(vocabulary_size=256, num_layers=3))
    with caplog.at_level(logging.WARNING, logger="keras_txl"):
        other.backbone.save_to_preset(str(folder))
    (message,) = [r.getMessage() for r in caplog.records if "task.json" in r.getMessage()]
    assert "stateful=True, batch_size=3" in message
    assert "from_preset(..., stateful=True, batch_size=3)" in message
    loaded = TransformerXLCausalLM.from_preset(str(folder), stateful=True, batch_size=3)
    assert loaded.stateful and loaded.batch_size == 3 and loaded.txl_config.num_layers == 3
    # A task without state held no such settings: none are named.
    plain = TransformerXLCausalLM(tiny_config(vocabulary_size=256))
    plain.save_to_preset(str(folder))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="keras_txl"):
        other.backbone.save_to_preset(str(folder))
    (message,) = [r.getMessage() for r in caplog.records if "task.json" in r.getMessage()]
    assert "stateful=" not in message


def test_a_preset_task_config_must_match_its_config(tmp_path):
    # keras-hub builds the model from task.json's copy of the backbone config,
    # not from config.json (the one checked against the limits).
    import json

    _, folder = word_preset(tmp_path)
    task = json.loads((folder / "task.json").read_text())
    task["config"]["backbone"]["config"]["memory_length"] = 2_000_000
    (folder / "task.json").write_text(json.dumps(task))
    with pytest.raises(ValueError, match="task.json describes another model than config.json "
                       r"beside it \(memory_length=2000000 there, 4 in config.json\)"):
        TransformerXLCausalLM.from_preset(str(folder))
    task["config"]["backbone"] = []
    (folder / "task.json").write_text(json.dumps(task))
    with pytest.raises(ValueError, match="task.json holds no backbone config"):
        TransformerXLCausalLM.from_preset(str(folder))
    _, folder = word_preset(tmp_path / "b")
    task = json.loads((folder / "task.json").read_text())
    task["config"].update(stateful=True, batch_size=10**9)
    (folder / "task.json").write_text(json.dumps(task))
    with pytest.raises(ValueError, match="stateful task's memory .* max_parameters"):
        TransformerXLCausalLM.from_preset(str(folder))


@pytest.mark.parametrize("entry, says", [
    ({"module": "os", "class_name": "system", "config": "touch pwned"},
     r"its preprocessor must be a serialized keras-txl layer .*received module='os', "
     r"class_name='system'"),
    ("text", r"its preprocessor must be .*received str 'text'"),
    ({"module": "keras_txl.causal_lm_preprocessor", "class_name": "TransformerXLCausalLMPreprocessor",
      "config": {"tokenizer": {"module": "builtins", "class_name": "eval", "config": {}}}},
     r"its preprocessor's tokenizer must be .*received module='builtins', class_name='eval'"),
])
def test_a_preset_task_preprocessor_of_another_class_is_named(tmp_path, entry, says):
    # keras-hub builds the preprocessor from task.json: another class there
    # failed inside Keras with "TypeError: <class 'keras_txl.causal_lm.
    # TransformerXLCausalLM'> could not be deserialized properly", no file named.
    import json

    _, folder = word_preset(tmp_path)
    (folder / "manifest.json").unlink()  # a foreign folder (a changed file is found by it)
    task = json.loads((folder / "task.json").read_text())
    task["config"]["preprocessor"] = entry
    (folder / "task.json").write_text(json.dumps(task))
    for load in (TransformerXLCausalLM.from_preset, keras_txl.load_pretrained):
        with pytest.raises(ValueError, match=r"task.json: " + says):
            load(str(folder))
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("change, says", [
    (dict(sequence_length=0), r"`sequence_length` must be a positive integer"),
    (dict(add_start_token=True), r"`add_start_token=True`, but the 'word' tokenizer has no"),
    (dict(bogus=1), r"Unrecognized keyword arguments .*'bogus'"),
])
@pytest.mark.parametrize("name", ["task.json", "preprocessor.json"])
def test_a_preset_preprocessor_config_the_constructor_refuses_names_its_file(
        tmp_path, name, change, says):
    # keras-hub builds the preprocessor from task.json (preprocessor.json
    # without one): the constructor's error named the argument, not the
    # file it came from (the user never passed sequence_length=0).
    import json

    _, folder = word_preset(tmp_path)
    (folder / "manifest.json").unlink()  # a hand-edited folder
    if name == "preprocessor.json":
        (folder / "task.json").unlink()
        (folder / "task.weights.h5").unlink()
    data = json.loads((folder / name).read_text())
    entry = data["config"]["preprocessor"] if name == "task.json" else data
    entry["config"].update(change)
    (folder / name).write_text(json.dumps(data))
    for load in (TransformerXLCausalLM.from_preset, keras_txl.load_pretrained):
        with pytest.raises(ValueError, match=re.escape(name) + r": its preprocessor cannot be built "
                           r"from it: " + says):
            load(str(folder))


@pytest.mark.parametrize("damage", ["nan", "int", "shape"])
def test_a_preset_with_non_finite_or_integer_weights_is_refused(tmp_path, damage):
    import h5py

    _, folder = word_preset(tmp_path)
    (folder / "manifest.json").unlink()  # a foreign folder, no checksums to go by
    with h5py.File(folder / "model.weights.h5", "r+") as f:
        key = next(k for k in _datasets(f) if "output_dense" in k)
        value = f[key][()]
        del f[key]
        if damage == "nan":
            value[0] = np.nan
            f[key] = value
        elif damage == "int":
            f[key] = value.astype("int32")
        else:  # another model's tensor: Keras named the layer, not the file
            f[key] = np.concatenate([value, value])
    expected = {"nan": "the loaded weights hold NaN or Inf",
                "int": rf"{key} \(int32\): a weight must be one of",
                "shape": r"the weights in model.weights.h5 and task.weights.h5 are not "
                         "those of the model its config.json describes"}[damage]
    for load in (TransformerXLCausalLM.from_preset, keras_txl.load_pretrained):
        with pytest.raises(ValueError, match=expected):
            load(str(folder))


def _datasets(handle):
    import h5py

    found = []
    handle.visititems(lambda k, v: found.append(k) if isinstance(v, h5py.Dataset) else None)
    return found


def test_enable_lora_adapts_the_feed_forward_layers_and_their_weights_round_trip(tmp_path):
    # keras-hub's default LoRA names (query_dense, value_dense, ...) match no
    # layer here (the attention keeps q/k/v in one fused weight):
    # `enable_lora(2)` froze every layer and adapted none, in silence (the
    # relative biases alone still trained), and `save_lora_weights` then
    # said "There are no lora-enabled layers in this model".
    keras.utils.set_random_seed(0)
    config = tiny_config(vocabulary_size=31)
    model = TransformerXLCausalLM(config)
    base = model.get_weights()
    backbone = model.backbone
    assert backbone.default_lora_layer_names() == ["intermediate_dense", "output_dense"]
    backbone.enable_lora(2)
    # Keras' Dense.enable_lora: the adapters, and the layer's bias, train.
    trainable = [w.path.split("/")[-2:] for w in backbone.trainable_weights]
    assert sorted({leaf for _, leaf in trainable}) == ["bias", "lora_kernel_a", "lora_kernel_b"]
    assert {layer for layer, _ in trainable} == {"intermediate_dense", "output_dense"}
    assert len(trainable) == 3 * 2 * config.num_layers
    ids = random_ids((2, 8), 31)
    frozen = [w.numpy() for w in backbone.non_trainable_weights]
    model.compile(optimizer=keras.optimizers.Adam(0.05))
    model.fit(ids, ids, epochs=3, verbose=0)
    for before, after in zip(frozen, backbone.non_trainable_weights):
        np.testing.assert_array_equal(before, after.numpy())
    adapted = model.call_with_memory(ids)["log_probs"]
    # A copy with other settings (`with_settings`, exports) adapts as it does.
    stateful = model.with_settings(stateful=True, batch_size=2)
    np.testing.assert_allclose(stateful(ids), adapted, atol=1e-5)
    fresh = TransformerXLCausalLM(config)
    fresh.set_weights(base)
    assert np.abs(fresh.call_with_memory(ids)["log_probs"] - adapted).max() > 1e-3
    # keras-hub's LoRA files: the adapters alone, onto the same base weights.
    backbone.save_lora_weights(str(tmp_path / "adapters.lora.h5"))
    trained = {w.path: w for w in model.weights}
    for w in fresh.weights:  # the biases and the task's head trained too
        w.assign(trained[w.path])
    fresh.backbone.load_lora_weights(str(tmp_path / "adapters.lora.h5"))
    np.testing.assert_allclose(fresh.call_with_memory(ids)["log_probs"], adapted, atol=1e-5)
    # Names that match no layer with LoRA are refused before anything is frozen.
    other = TransformerXLCausalLM(config)
    with pytest.raises(ValueError, match=r"`target_layer_names`=\['query_dense'\] name no layer .*"
                       r"\['intermediate_dense', 'output_dense'\]"):
        other.backbone.enable_lora(2, target_layer_names=["query_dense"])
    assert len(other.backbone.trainable_weights) == len(other.backbone.weights)
    with pytest.raises(ValueError, match="`rank` must be a positive integer"):
        other.backbone.enable_lora(0)


def test_a_keras_file_reloads_compiled_as_saved(tmp_path):
    # Keras skips compile_from_config for a custom compile(): a reloaded
    # model sampled with the default top-k (not the saved beam search) and
    # had lost its optimizer and loss, with only a warning.
    import warnings

    model = TransformerXLCausalLM(tiny_config(vocabulary_size=256, segment_length=8,
                                              memory_length=8),
                                  preprocessor=byte_preprocessor())
    model.compile(sampler=keras_hub.samplers.BeamSampler(num_beams=2),
                  optimizer=keras.optimizers.SGD(0.1), weighted_metrics=None)
    model.fit(["some text to fit on", "and another one"], epochs=1, verbose=0)
    expected = model.generate(["Hello", "abc def"], max_length=20)
    model.save(tmp_path / "m.keras")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*compile.*")
        loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert isinstance(loaded.sampler, keras_hub.samplers.BeamSampler)
    assert loaded.sampler.num_beams == 2
    assert isinstance(loaded.optimizer, keras.optimizers.SGD)
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert loaded.generate(["Hello", "abc def"], max_length=20) == expected


def test_another_keras_hub_model_in_the_process_leaves_transformer_xl_working(tmp_path):
    # Building a functional keras-hub model makes Keras rewrite the bases of
    # keras-hub's shared Backbone and Task classes to Functional
    # (keras-team/keras#17270): every Transformer-XL model, built before or
    # after, then failed ("missing 'inputs' and 'outputs'", "no attribute
    # '_inputs'"). A fresh process, since the rewrite lasts for the process.
    import subprocess
    import sys

    code = f"""
import numpy as np, keras, keras_hub, keras_txl
from keras_txl import TransformerXLCausalLM, TransformerXLBackbone
from keras_txl.tokenizers import ByteTokenizer
from keras.src.models.functional import Functional
config = dict(vocabulary_size=256, num_layers=1, hidden_dim=8, num_heads=2,
              intermediate_dim=16, segment_length=4, memory_length=4, dropout=0.0)
model = TransformerXLCausalLM(config)
ids = np.arange(8, dtype="int32").reshape(2, 4)
before = model.call_with_memory(ids)["log_probs"].numpy()
folder = {str(tmp_path / "txl")!r}
keras_txl.save_preset(model, folder, tokenizer=ByteTokenizer())
gpt2 = keras_hub.models.GPT2Backbone(vocabulary_size=10, num_layers=1, num_heads=2,
    hidden_dim=8, intermediate_dim=16, max_sequence_length=8)
keras_hub.models.GPT2CausalLM(gpt2)
gpt2.save_to_preset({str(tmp_path / "gpt2")!r})
keras_hub.models.Backbone.from_preset({str(tmp_path / "gpt2")!r})
assert not isinstance(model, Functional) and not isinstance(model.backbone, Functional)
np.testing.assert_array_equal(model.call_with_memory(ids)["log_probs"].numpy(), before)
np.testing.assert_array_equal(model.predict(ids, verbose=0), before)
for load in (TransformerXLCausalLM.from_preset, keras_hub.models.CausalLM.from_preset):
    loaded = load(folder)
    np.testing.assert_array_equal(loaded.call_with_memory(ids)["log_probs"].numpy(), before)
TransformerXLBackbone(config)
assert len(model.layers) == 2 and model.count_params() == loaded.count_params()
assert type(gpt2).__mro__[:3] == (keras_hub.models.GPT2Backbone, keras_hub.models.Backbone,
                                  Functional)
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-1] == "ok"


def test_a_start_or_end_token_the_tokenizer_lacks_is_refused_not_skipped(tmp_path):
    # keras-hub's packer adds nothing for a token id of None: add_start_token
    # (no kind has a start token) and add_end_token on a kind without <eos>
    # were accepted and silently did nothing.
    from keras_txl.tokenizers import ByteTokenizer
    from keras_txl.tokenizers import WordTokenizer

    for tokenizer, flag in ((ByteTokenizer(), "add_start_token"),
                            (ByteTokenizer(), "add_end_token"),
                            (WordTokenizer(["<eos>", "<unk>", "a"]), "add_start_token")):
        with pytest.raises(ValueError, match=f"`{flag}=True`, but the '\\w+' tokenizer"):
            TransformerXLCausalLMPreprocessor(tokenizer, sequence_length=4, **{flag: True})
    word = WordTokenizer(["<eos>", "<unk>", "a"])
    preprocessor = TransformerXLCausalLMPreprocessor(word, sequence_length=4, add_end_token=True)
    x, y, weight = preprocessor(["a a"])
    assert x["token_ids"].numpy().tolist() == [[2, 2, 0, 0]]
    assert x["padding_mask"].numpy().tolist() == [[True, True, True, False]]
    # A config whose tokenizer has no vocabulary yet (a preset's, before its
    # assets load) still deserializes; the check runs when it is built.
    clone = TransformerXLCausalLMPreprocessor.from_config(preprocessor.get_config())
    word.save_assets(str(tmp_path))
    clone.tokenizer.load_assets(str(tmp_path))
    assert clone(["a a"])[0]["token_ids"].numpy().tolist() == [[2, 2, 0, 0]]


@pytest.mark.parametrize("flag", ["add_start_token", "add_end_token"])
@pytest.mark.parametrize("value", ["False", "no", 0, None])
def test_a_start_or_end_token_flag_that_is_not_a_bool_is_refused(flag, value):
    # add_end_token="False" (a config read as text) is truthy: the <eos> was
    # appended to every sample in silence, and 0 or None meant False.
    from keras_txl.tokenizers import WordTokenizer

    word = WordTokenizer(["<eos>", "<unk>", "a"])
    with pytest.raises(ValueError, match=f"`{flag}` must be True or False. Received: {flag}={value!r}"):
        TransformerXLCausalLMPreprocessor(word, sequence_length=4, **{flag: value})
    # NumPy booleans are booleans.
    preprocessor = TransformerXLCausalLMPreprocessor(word, sequence_length=4, add_end_token=np.bool_(True))
    assert preprocessor.add_end_token is True


@pytest.mark.parametrize("sampler", ["contrastive", keras_hub.samplers.ContrastiveSampler()])
def test_contrastive_search_is_refused_by_name_or_instance_saying_why(sampler):
    # keras_hub.samplers.get("contrastive") exists: the name was refused as
    # an unknown one ("must be one of ['greedy', ...]"), the instance with
    # the reason.
    model = generation_model()
    with pytest.raises(ValueError, match=r"ContrastiveSampler \(contrastive search\) compares the "
                       r"hidden states of the whole sequence"):
        model.compile(sampler=sampler)
    with pytest.raises(ValueError, match=r"contrastive search"):
        model.sampler = sampler  # the name at once, an instance at generate()
        model.generate([[1, 2]], max_length=4)


@pytest.mark.parametrize("inputs", [[["ab", "c"]], tf.constant([["ab"], ["c"]]), np.array([["ab"]])])
def test_strings_nested_one_level_too_deep_are_named_as_such(inputs):
    # A list of lists of strings (or a rank-2 string tensor) was refused as
    # "an empty list or a list holding something else than int ids".
    from testing import byte_causal_lm

    model = byte_causal_lm()
    model.compile(sampler="greedy")
    with pytest.raises(ValueError, match=r"received a batch of strings nested one level too deep "
                       r"\(a list of lists of strings, or a string tensor of rank 2\)"):
        model.generate(inputs, max_length=6)


def test_from_preset_stateful_alone_takes_a_stateful_presets_batch_size(tmp_path):
    # from_preset(folder, stateful=True) on a preset saved stateful with
    # batch_size=2 said "needs a fixed positive integer `batch_size`",
    # although the preset says which.
    keras.utils.set_random_seed(0)
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=31), stateful=True, batch_size=2)
    ids = random_ids((2, 4), 31)
    model(ids)  # a memory to carry
    folder = tmp_path / "preset"
    model.save_to_preset(str(folder))
    loaded = TransformerXLCausalLM.from_preset(str(folder), stateful=True)
    assert loaded.stateful and loaded.batch_size == 2
    np.testing.assert_array_equal(loaded.memory.numpy(), model.memory.numpy())
    np.testing.assert_array_equal(loaded(ids), model(ids))


@pytest.mark.parametrize("count", [2, 3, 4])
def test_validation_data_given_as_a_list_of_strings_is_validated_as_those_texts(count):
    # Keras reads a list as the tuple (x, y, sample_weight): three strings
    # became x="..." (rank 0, "must have a batch dimension"), four failed
    # with "Data is expected to be in format `x`, `(x,)`, ...". A list of
    # strings is the texts, as evaluate() reads it.
    texts = ["some text here", "and another one", "a third", "the fourth one"]
    validation = texts[:count]
    keras.utils.set_random_seed(0)
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=256),
                                  preprocessor=byte_preprocessor())
    model.compile(optimizer=keras.optimizers.SGD(0.0))
    history = model.fit(texts, batch_size=2, epochs=1, shuffle=False, verbose=0,
                        validation_data=validation).history
    expected = model.evaluate(validation, batch_size=2, verbose=0)[0]
    np.testing.assert_allclose(history["val_loss"][0], expected, rtol=1e-6)
    history = model.fit(texts, batch_size=2, epochs=1, shuffle=False, verbose=0,
                        validation_data=tuple(validation)).history
    np.testing.assert_allclose(history["val_loss"][0], expected, rtol=1e-6)


def test_from_preset_takes_evaluation_settings_as_load_pretrained_does(tmp_path):
    # keras-hub's Backbone.from_preset merges config keywords into the
    # config; the task's from_preset passed them to the constructor, which
    # refused them ("Unrecognized keyword arguments ... {'memory_length': 7}"),
    # although load_pretrained(preset, memory_length=...) takes them.
    model, folder = word_preset(tmp_path)
    ids = random_ids((2, 6), 5)
    for stateful in (False, True):
        loaded = TransformerXLCausalLM.from_preset(
            str(folder), memory_length=7, clamp_length=5, dropout=0.25,
            **({"stateful": True, "batch_size": 2} if stateful else {}))
        assert loaded.stateful is stateful
        config = loaded.txl_config
        assert (config.memory_length, config.clamp_length, config.dropout) == (7, 5, 0.25)
        assert config == model.txl_config.replace(memory_length=7, clamp_length=5, dropout=0.25)
        assert loaded.preprocessor.tokenizer.get_vocabulary()[:2] == ["<eos>", "<unk>"]
        expected = model.with_settings(memory_length=7, clamp_length=5, dropout=0.25)
        np.testing.assert_array_equal(loaded.call_with_memory(ids)["log_probs"],
                                      expected.call_with_memory(ids)["log_probs"])
    with pytest.raises(ValueError, match=r"`hidden_dim`=16 contradicts .*hidden_dim=8"):
        TransformerXLCausalLM.from_preset(str(folder), hidden_dim=16)


def test_score_gives_keras_hubs_logits_and_losses_with_its_layer_hook():
    # GPT2CausalLM and GemmaCausalLM have keras-hub's score(); ours had
    # none (AttributeError).
    model = generation_model()
    ids = np.stack([random_ids((10,), 31, seed=1), random_ids((10,), 31, seed=2)])
    expected = np.asarray(model.call_with_memory(ids)["log_probs"])
    logits = np.asarray(model.score(ids, padding_mask=np.ones((2, 10), bool)))
    np.testing.assert_allclose(logits, expected, rtol=1e-6, atol=1e-6)
    targets = np.roll(ids, -1, axis=1)
    losses = np.asarray(model.score(ids, scoring_mode="loss", target_ids=targets))
    picked = -np.take_along_axis(expected, targets[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(losses, picked, rtol=1e-5, atol=1e-5)
    # The hook: every activation in order; what it returns goes on.
    seen = []
    same = model.score(ids, layer_intercept_fn=lambda x, i: seen.append(i) or x)
    assert seen == [-1] + list(range(model.txl_config.num_layers))
    np.testing.assert_allclose(np.asarray(same), expected, rtol=1e-6, atol=1e-6)
    changed = model.score(ids, layer_intercept_fn=lambda x, i: x * 0 if i == 0 else x)
    assert np.abs(np.asarray(changed) - expected).max() > 1e-3
    # keras-hub's example: gradients of the losses with respect to the embeddings.
    embeddings = {}

    def watch(x, i):
        if i == -1:
            tape.watch(x)
            embeddings["x"] = x
        return x

    with tf.GradientTape() as tape:
        total = tf.reduce_sum(model.score(ids, scoring_mode="loss", target_ids=targets,
                                          layer_intercept_fn=watch))
    gradient = tape.gradient(total, embeddings["x"])
    assert gradient.shape == (2, 10, model.txl_config.hidden_dim)
    assert np.abs(gradient.numpy()).max() > 0
    for kwargs, message in (
            ({"scoring_mode": "probs"}, "`scoring_mode` must be 'logits' or 'loss'"),
            ({"scoring_mode": "loss"}, "`target_ids` must be given with scoring_mode='loss'"),
            ({"scoring_mode": "loss", "target_ids": targets[:, :4]},
             r"`targets` must have the \(batch, segment_length\) shape"),
            ({"padding_mask": np.ones((2, 3), bool)}, "`padding_mask` must have the"),
            ({"layer_intercept_fn": 3}, "`layer_intercept_fn` must be None or a function")):
        with pytest.raises(ValueError, match=message):
            model.score(ids, **kwargs)


def test_token_ids_without_targets_are_refused_naming_y():
    # Ids (the preprocessor's dict, an array, a dataset of them) without
    # their targets failed deep in the loss with TensorFlow's "None values
    # not supported."
    texts = ["some text here", "and another one", "a third", "the fourth one"]
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=256),
                                  preprocessor=byte_preprocessor())
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    x, y, w = model.preprocessor(texts)
    for call in (model.fit, model.evaluate):
        for data in (x, x["token_ids"], np.asarray(x["token_ids"])):
            with pytest.raises(ValueError, match="`y` must hold the targets"):
                call(data, verbose=0)
        for data in (tf.data.Dataset.from_tensor_slices(x).batch(2),
                     tf.data.Dataset.from_tensor_slices((x["token_ids"],)).batch(2)):
            with pytest.raises(ValueError, match=r"elements must be \(x, y\)"):
                call(data, verbose=0)
    with pytest.raises(ValueError, match=r"`validation_data` .*elements must be \(x, y\)"):
        model.fit(x, y, validation_data=tf.data.Dataset.from_tensor_slices(x).batch(2),
                  verbose=0)
    # With them (and strings, which make their own) it trains as before.
    model.fit(x, y, sample_weight=w, batch_size=2, verbose=0)
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(2), verbose=0)
    model.fit(texts, batch_size=2, verbose=0)


def test_an_unbatched_dataset_of_strings_is_refused_saying_batch_it():
    # Without state each string is one sample: single strings failed with
    # "Cannot take the length of shape with unknown rank" (fit, evaluate)
    # or a rank error on a (8,) token_ids (predict).
    texts = ["some text here", "and another one", "a third"]
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=256),
                                  preprocessor=byte_preprocessor())
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    single = tf.data.Dataset.from_tensor_slices(texts)
    for call in (model.fit, model.evaluate, model.predict):
        for data in (single, single.map(lambda t: (t,))):
            with pytest.raises(ValueError, match=r"`x` is a tf.data.Dataset of single "
                                                 r"strings.*\.batch\(batch_size\)"):
                call(data, verbose=0)
    with pytest.raises(ValueError, match=r"`validation_data` is a tf.data.Dataset of single"):
        model.fit(single.batch(2), validation_data=single, verbose=0)
    assert model.predict(single.batch(2), verbose=0).shape == (3, 8, 256)


def test_validation_split_takes_a_list_of_strings_as_an_array_of_them():
    # Keras' split takes arrays only: a list of strings failed with
    # "`validation_split` is only supported for Tensors or NumPy arrays",
    # the same strings as an array passed.
    texts = ["some text here", "and another one", "a third", "the fourth one", "fifth"]
    histories = []
    for data in (texts, np.asarray(texts)):
        keras.utils.set_random_seed(0)
        model = TransformerXLCausalLM(tiny_config(vocabulary_size=256),
                                      preprocessor=byte_preprocessor())
        model.compile(optimizer=keras.optimizers.SGD(0.1))
        histories.append(model.fit(data, validation_split=0.4, batch_size=2, epochs=2,
                                   verbose=0).history)
    for key in ("loss", "val_loss"):
        np.testing.assert_allclose(histories[0][key], histories[1][key], rtol=1e-6)
