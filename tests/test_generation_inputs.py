"""`generate()`'s inputs and options are checked before anything is traced,
whatever form they come in (lists, keras-hub's id dict, string tensors,
datasets), and every generation path follows one rule for top-k and seeds."""

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf
from testing import byte_causal_lm
from testing import tiny_config

from keras_txl import TransformerXLCausalLM
from keras_txl import generation
from keras_txl.causal_lm_preprocessor import TransformerXLCausalLMPreprocessor
from keras_txl.cli import main

V = 11  # tiny_config's vocabulary


def id_model(**overrides):
    """The tiny model (V 11), no preprocessor, greedy."""
    keras.utils.set_random_seed(0)
    model = TransformerXLCausalLM(tiny_config(memory_length=8, **overrides))
    model.compile(sampler="greedy")
    return model


def byte_model():
    """A byte-level model with a preprocessor (strings in, strings out)."""
    keras.utils.set_random_seed(0)
    model = byte_causal_lm(memory_length=8)
    model.compile(sampler="greedy")
    return model


WORDS = ["<eos>", "<unk>", "the", "cat", "sat", "on", "mat", "a"]


def word_model():
    """A word-level model: its tokenizer pads with its end token (both 0)."""
    from keras_txl.tokenizers import WordTokenizer

    keras.utils.set_random_seed(0)
    preprocessor = TransformerXLCausalLMPreprocessor(WordTokenizer(WORDS), sequence_length=8)
    model = TransformerXLCausalLM(tiny_config(vocabulary_size=len(WORDS)),
                                  preprocessor=preprocessor)
    tokenizer = preprocessor.tokenizer
    assert tokenizer.pad_token_id == tokenizer.end_token_id == 0
    return model


# === keras-hub's dict of token_ids and padding_mask ===


IDS = np.array([[1, 2, 3, 0], [4, 5, 0, 0]], "int32")
MASK = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)


@pytest.mark.parametrize("inputs, message", [
    ({"token_ids": [[11, 2, 0]], "padding_mask": [[1, 1, 0]]},
     r"`inputs\['token_ids'\]\[0\]` holds token ids outside \[0, vocabulary_size=11\), "
     r"received values in \[2, 11\]"),
    ({"token_ids": [[-1, 2, 0]], "padding_mask": [[1, 1, 0]]},
     r"outside \[0, vocabulary_size=11\), received values in \[-1, 2\]"),
    ({"token_ids": [[1.7, 2.0, 0.0]], "padding_mask": [[1, 1, 0]]},
     r"`inputs\['token_ids'\]` must hold integer token ids, received dtype float64"),
    ({"token_ids": IDS, "padding_mask": np.ones((2, 3), bool)},
     r"`inputs\['padding_mask'\]` must have the shape of `inputs\['token_ids'\]` "
     r"\(2, 4\), received shape \(2, 3\)"),
    ({"token_ids": IDS, "padding_mask": [[1, 0, 1, 0], [1, 1, 0, 0]]},
     r"`inputs\['padding_mask'\]` row 0 must be a prefix of ones .* received \[1, 0, 1, 0\]"),
    ({"token_ids": IDS, "padding_mask": [[1, 1, 1, 0], [0, 0, 0, 0]]},
     r"row 1 must be a prefix of ones \(each prompt starts at position 0, holds at least one"),
    ({"token_ids": IDS, "padding_mask": [[2, 1, 1, 0], [1, 1, 0, 0]]},
     r"`inputs\['padding_mask'\]` must be bool \(or integers 0 and 1\)"),
    ({"token_ids": IDS[0], "padding_mask": MASK[0]},
     r"`inputs\['token_ids'\]` must have shape \(batch, length\)"),
    ({"token_ids": IDS, "mask": MASK}, r"received keys \['mask', 'token_ids'\]"),
])
def test_a_dict_of_ids_is_checked_like_a_list_of_ids(inputs, message):
    model = id_model()
    with pytest.raises(ValueError, match=message):
        model.generate(inputs, stop_token_ids=None)


def test_a_dict_of_ids_generates_like_the_same_list_and_honours_max_length():
    model = id_model()
    as_list = model.generate([[1, 2, 3], [4, 5]], max_length=4, stop_token_ids=None)
    as_dict = model.generate({"token_ids": IDS, "padding_mask": MASK}, stop_token_ids=None)
    # The padding's values are not read; an int 0/1 mask is a bool mask.
    other_padding = model.generate(
        {"token_ids": np.where(MASK, IDS, 7), "padding_mask": MASK.astype("int64")},
        stop_token_ids=None)
    for a, b, c in zip(as_list, as_dict, other_padding):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    # max_length re-packs the prompts (it was silently ignored).
    longer = model.generate({"token_ids": IDS, "padding_mask": MASK}, max_length=9,
                            stop_token_ids=None)
    assert [len(row) for row in longer] == [9, 9]
    for row, prompt in zip(longer, model.generate([[1, 2, 3], [4, 5]], max_length=9,
                                                  stop_token_ids=None)):
        np.testing.assert_array_equal(row, prompt)
    with pytest.raises(ValueError, match=r"`max_length`=2 is shorter than the longest prompt"):
        model.generate({"token_ids": IDS, "padding_mask": MASK}, max_length=2)
    # Without a padding_mask every position is the prompt.
    full = model.generate({"token_ids": IDS}, max_length=6, stop_token_ids=None)
    np.testing.assert_array_equal(full[1][:4], IDS[1])


def test_list_prompts_refuse_huge_and_float_ids_by_name():
    model = id_model()
    with pytest.raises(ValueError, match=r"`inputs\[0\]` holds token ids outside"):
        model.generate([[2**70]], max_length=3)
    with pytest.raises(ValueError, match=r"`inputs` must be all strings or all non-empty lists"):
        model.generate([[1.0, 2.0]], max_length=3)
    with pytest.raises(ValueError, match=r"a list inside the list"):
        model.generate([1, 2, 3], max_length=5)


# === Beam search with a tokenizer that pads with its end token ===


def test_beam_search_generates_when_the_padding_is_the_stop_token():
    model = word_model()
    prompts = [[2, 3], [4, 5, 7]]  # "the cat", "sat on a"
    model.compile(sampler="greedy")
    greedy = model.generate(prompts, max_length=8, strip_prompt=True)
    assert all(len(row) > 1 for row in greedy)
    model.compile(sampler="beam")
    beams = model.generate(prompts, max_length=8, strip_prompt=True)
    # It used to stop at once on the padding (<eos>) and return only it.
    assert all(len(row) > 1 for row in beams), beams
    texts = model.generate(["the cat"], max_length=8)
    assert len(texts[0].split()) > 2, texts
    # One beam is greedy search.
    model.compile(sampler=keras_hub.samplers.BeamSampler(num_beams=1))
    for a, b in zip(model.generate(prompts, max_length=8, strip_prompt=True), greedy):
        np.testing.assert_array_equal(a, b)


def test_beam_search_on_a_peaked_model_equals_greedy_and_stops_at_the_stop_token():
    model = word_model()
    # Peaked: a larger (tied) embedding scales the logits; the most likely
    # id then has a probability above 0.99 at each step.
    table = model.backbone.token_embedding.weights[0]
    table.assign(table * 10.0)
    prompts = [[2, 3], [4]]
    model.compile(sampler="greedy")
    greedy = model.generate(prompts, max_length=8)  # stops at <eos> = padding
    model.compile(sampler="beam")
    beams = model.generate(prompts, max_length=8)
    for a, b in zip(beams, greedy):
        np.testing.assert_array_equal(a, b)
    # A stop token ends a row after it (kept), never inside the prompt.
    stop = int(greedy[0][2])
    stopped = model.generate(prompts, max_length=8, stop_token_ids=stop)
    assert list(stopped[0]) == list(greedy[0][:3])


def textbook_beam_search(model, prompt, max_length, beams):
    """Beam search over the continuation of one prompt, each hypothesis
    scored by `call_with_memory` on its whole prefix."""
    hyps = [(0.0, list(prompt))]
    for _ in range(max_length - len(prompt)):
        candidates = []
        for score, seq in hyps:
            log_probs = np.asarray(model.call_with_memory(
                np.array([seq], "int32"))["log_probs"])[0, -1]
            for token in np.argsort(-log_probs)[:beams]:
                candidates.append((score + float(log_probs[token]), seq + [int(token)]))
        candidates.sort(key=lambda c: -c[0])
        hyps = candidates[:beams]
    return hyps[0][1]


@pytest.mark.parametrize("case", ["long_prompt", "stop_token"])
def test_beam_search_is_a_beam_search_over_the_continuation_alone(case):
    # keras-hub's beam loop, started at position 1, ranked the beams at the
    # prompt's positions over tokens never placed (duplicate beams, made-up
    # scores: the 6-token prompt below gave a sequence 0.25 nats less likely
    # than beam search finds), and kept extending a finished row's beams
    # while other rows ran (with the stop token below, the prompt [4, 7] gave
    # [4, 7, 1] in the batch and [4, 7, 7, 1] alone).
    from keras_txl import TransformerXLConfig

    vocabulary, seed, lengths, draw, stop = {
        "long_prompt": (256, 2, (1, 2, 6), 256, ()),
        "stop_token": (11, 3, (1, 3, 5, 2), 0, (1,))}[case]
    keras.utils.set_random_seed(seed)
    model = TransformerXLCausalLM(TransformerXLConfig(
        vocabulary_size=vocabulary, num_layers=2, hidden_dim=32, num_heads=2, head_dim=16,
        intermediate_dim=64, segment_length=32, memory_length=32, dropout=0.0,
        init_std=0.3, projection_init_std=0.3,
        empty_memory="masked" if case == "long_prompt" else "zeros"))
    model.compile(sampler=keras_hub.samplers.BeamSampler(num_beams=3))
    rs = np.random.RandomState(draw)
    prompts = [[int(t) for t in rs.randint(0, vocabulary, n)] for n in lengths]
    max_length = 12 if case == "long_prompt" else 16
    batch = model.generate(prompts, max_length=max_length, stop_token_ids=stop or None)
    for prompt, row in zip(prompts, batch):
        if case == "long_prompt":
            expected = textbook_beam_search(model, prompt, max_length, 3)
        else:  # the README's promise: a batch gives each prompt's tokens alone
            expected = [int(t) for t in model.generate(
                [prompt], max_length=max_length, stop_token_ids=stop)[0]]
        assert [int(t) for t in row] == expected, (prompt, row, expected)


# === Datasets and string tensors ===


def test_datasets_and_string_tensors_are_generated_like_lists():
    model = byte_model()
    texts = ["abc", "de", "f"]
    expected = model.generate(texts, max_length=6)
    batched = tf.data.Dataset.from_tensor_slices(texts).batch(2)
    assert model.generate(batched, max_length=6) == expected
    single = tf.data.Dataset.from_tensor_slices(texts)  # one string per element
    assert model.generate(single, max_length=6) == expected
    assert model.generate(tf.constant(texts[:2]), max_length=6) == expected[:2]
    assert model.generate(tf.constant("abc"), max_length=6) == expected[0]
    assert model.generate(np.array(texts), max_length=6) == expected
    ids = {"token_ids": np.array([[97, 98, 99], [100, 101, 0], [102, 0, 0]]),
           "padding_mask": np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0]], bool)}
    by_dict = model.generate(tf.data.Dataset.from_tensor_slices(ids).batch(2), max_length=6)
    by_list = model.generate([[97, 98, 99], [100, 101], [102]], max_length=6)
    assert len(by_dict) == 3
    for a, b in zip(by_dict, by_list):
        np.testing.assert_array_equal(a, b)
    # One memory cannot follow a dataset's batches: refused by name.
    for kwargs in ({"return_memory": True}, {"memory": np.zeros((2, 2, 8, 32), "float32")}):
        with pytest.raises(ValueError, match=r"`memory` and `return_memory` are not supported "
                                             r"with a tf.data.Dataset"):
            model.generate(batched, max_length=6, **kwargs)


def test_empty_prompt_tensors_and_arrays_are_named_as_what_they_are():
    # An empty string tensor was reported as "`inputs` is an empty list".
    model = byte_model()
    for inputs, found in [(tf.constant([], tf.string), r"an empty string tensor of shape \(0,\)"),
                          (np.array([], str), r"an empty array of shape \(0,\)"),
                          (np.zeros((0, 3), "int32"), r"an empty array of shape \(0, 3\)"),
                          (tf.zeros((0, 2), tf.int32), r"an empty int32 tensor of shape \(0, 2\)"),
                          (tf.ragged.constant([[1]])[:0], r"an empty ragged tensor of shape \(0, None\)"),
                          ([], "an empty list"), ((), "an empty tuple")]:
        with pytest.raises(ValueError, match=rf"`inputs` is {found}: give at least one prompt\."):
            model.generate(inputs, max_length=6)


def test_bytes_and_surrogate_escaped_prompts_reach_the_tokenizer_as_bytes():
    model = byte_model()
    # Bytes that are not UTF-8 are byte tokens for a byte-level model, and a
    # str holding them as surrogate escapes (os.fsdecode's) is the same prompt.
    raw = b"\xff\xfeab"
    expected = model.generate([[255, 254, 97, 98]], max_length=6)[0]
    texts = model.generate([raw], max_length=6)
    assert texts[0].startswith("\ufffd\ufffdab")
    assert model.generate(raw.decode("utf-8", "surrogateescape"), max_length=6) == texts[0]
    assert texts[0] == model.preprocessor.tokenizer.decode(expected)
    # Any other lone surrogate is named with its prompt, before TensorFlow sees it.
    with pytest.raises(ValueError, match=r"`inputs\[1\]` holds the lone surrogate '\\ud800'"):
        model.generate(["ok", "a\ud800"], max_length=6)


# === Samplers generate() cannot run ===


def test_samplers_generate_cannot_run_are_refused_by_name():
    model = byte_model()
    with pytest.raises(ValueError, match=r"`sampler`: ContrastiveSampler"):
        model.compile(sampler=keras_hub.samplers.ContrastiveSampler(k=3))
    with pytest.raises(ValueError, match=r"BeamSampler\(return_all_beams=True\) is not supported"):
        model.compile(sampler=keras_hub.samplers.BeamSampler(return_all_beams=True))
    with pytest.raises(ValueError, match=r"sampler \(TopKSampler\) k"):
        model.compile(sampler=keras_hub.samplers.TopKSampler(k=0))
    model.compile(sampler="beam")
    with pytest.raises(ValueError, match=r"`return_memory=True` is not supported with the "
                                         r"sampler BeamSampler"):
        model.generate(["abc"], max_length=6, return_memory=True)
    # A memory in still works with beam search.
    out = model.generate(["abc"], max_length=6, memory=np.zeros((1, 2, 8, 32), "float32"))
    assert out[0].startswith("abc")
    model.sampler = keras_hub.samplers.ContrastiveSampler(k=3)  # without compile()
    with pytest.raises(ValueError, match=r"`sampler`: ContrastiveSampler"):
        model.generate(["abc"], max_length=6)
    bare = TransformerXLCausalLM(tiny_config(), compile=False)
    with pytest.raises(ValueError, match=r"generate\(\) needs a sampler"):
        bare.generate([[1, 2]], max_length=4)


# === stop_token_ids ===


def test_stop_token_ids_take_an_int_and_refuse_ids_outside_the_vocabulary():
    model = id_model()
    free = model.generate([[1, 2, 3]], max_length=10, stop_token_ids=None)[0]
    stop = int(free[3])
    as_int = model.generate([[1, 2, 3]], max_length=10, stop_token_ids=stop)[0]
    as_tuple = model.generate([[1, 2, 3]], max_length=10, stop_token_ids=(stop,))[0]
    np.testing.assert_array_equal(as_int, as_tuple)
    np.testing.assert_array_equal(as_int, free[:4])
    np.testing.assert_array_equal(
        model.generate([[1, 2, 3]], max_length=10, stop_token_ids=np.int64(stop))[0], as_int)
    for bad in ((10**6,), 11, (-1,), "eos", (1.0,), True, [[1]]):
        with pytest.raises(ValueError, match=r"`stop_token_ids` must be .* in \[0, "
                                             r"vocabulary_size=11\)"):
            model.generate([[1, 2, 3]], max_length=10, stop_token_ids=bad)


# === top_k above the vocabulary, seeds ===


def test_top_k_above_the_vocabulary_keeps_every_id_on_every_path():
    model = id_model()
    options = dict(temperature=1.0, seed=5)
    clamped = generation.generate_ids(model, [[1, 2]], 6, top_k=1000, **options)[0]
    whole = generation.generate_ids(model, [[1, 2]], 6, top_k=V, **options)[0]
    np.testing.assert_array_equal(clamped, whole)
    host = generation.generate(model, [1, 2], 6, top_k=1000, segment_length=1, **options)
    np.testing.assert_array_equal(
        host, generation.generate(model, [1, 2], 6, top_k=V, segment_length=1, **options))
    # A sampler built without the vocabulary size (as tflite_generate does).
    log_probs = np.log(np.full(V, 1.0 / V))
    sampler = generation.sampler_from_options(top_k=1000, seed=1)
    assert 0 <= generation.sample_next(log_probs, sampler) < V
    assert sampler.k == 1000  # the caller's sampler is left as it was
    assert generation.sampler_from_options(top_k=1000, vocabulary_size=V).k == V
    runs = []
    for k in (1000, V):
        model.compile(sampler=keras_hub.samplers.TopKSampler(k=k, seed=3))
        runs.append(model.generate([[1, 2]], max_length=8, stop_token_ids=None)[0])
    np.testing.assert_array_equal(*runs)


def test_an_out_of_range_seed_is_named():
    model = id_model()
    message = r"`seed` must be None or an integer in \[0, 2\*\*63 - 1"
    for seed in (2**70, 2**63, -1, 1.5, True):
        with pytest.raises(ValueError, match=message):
            generation.generate_ids(model, [[1, 2]], 3, top_k=3, seed=seed)
        with pytest.raises(ValueError, match=message):
            generation.generate(model, [1, 2], 3, seed=seed)
    assert generation.sampler_from_options(seed=2**63 - 1).seed == 2**63 - 1


def test_generate_iter_checks_its_arguments_when_called():
    model = id_model()
    # Checked at the call, not at the first next(): a caller may print the
    # prompt right after it.
    with pytest.raises(ValueError, match="`segment_length` must be a positive integer"):
        generation.generate_iter(model, [1, 2], 3, segment_length=0)
    with pytest.raises(ValueError, match="`seed`"):
        generation.generate_iter(model, [1, 2], 3, seed=2**64)


def test_generate_ids_errors_name_its_own_arguments():
    # Out-of-range ids and a too-long request were reported by
    # model.generate under its names (`inputs[0]`, `max_length`), which
    # generate_ids does not have; a model of another kind was an
    # AttributeError.
    model = id_model()
    with pytest.raises(ValueError, match=r"`prompts\[1\]` holds token ids outside "
                                         r"\[0, vocabulary_size=11\).*\[-1, 30\]"):
        generation.generate_ids(model, [[1, 2], [30, -1]], 3, temperature=0)
    with pytest.raises(ValueError, match=r"`max_new_tokens` must be at most 1048573"):
        generation.generate_ids(model, [[1, 2, 3]], 2**20 - 2, temperature=0)
    with pytest.raises(ValueError, match="`model` must be a keras_txl.TransformerXLCausalLM"):
        generation.generate_ids(object(), [[1, 2]], 3)


def test_generate_ids_takes_a_2d_id_array_like_its_rows_as_lists():
    # model.generate takes a (batch, length) int array (and tensor);
    # generate_ids refused it ("non-empty list ..., received ndarray").
    model = id_model()
    rows = [[1, 2, 3], [4, 5, 6]]
    expected = generation.generate_ids(model, rows, 3, temperature=0.7, seed=5)
    for prompts in (np.array(rows), np.array(rows, "uint8"), tf.constant(rows)):
        got = generation.generate_ids(model, prompts, 3, temperature=0.7, seed=5)
        assert len(got) == 2
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)
    # Other ranks, dtypes and empty arrays are refused by name, like
    # model.generate refuses a 1-D array (one prompt is prompts[None]).
    for prompts, found in [(np.array([1, 2, 3]), r"shape \(3,\) and dtype int64"),
                           (np.ones((1, 1, 2), int), r"shape \(1, 1, 2\)"),
                           (np.zeros((0, 3), int), r"shape \(0, 3\)"),
                           (np.ones((2, 2)), "dtype float64")]:
        with pytest.raises(ValueError, match=r"`prompts` as an array must have shape \(batch, length\) "
                                             r"of int ids.*" + found):
            generation.generate_ids(model, prompts, 3)


def test_generate_ids_says_how_to_pass_one_prompt_given_a_flat_list():
    # [1, 2, 3] was "`prompts[0]` must be a non-empty 1-D sequence of int
    # ids, received shape ()": right, but not what to do (model.generate's
    # message for the same list says it).
    model = id_model()
    with pytest.raises(ValueError, match=r"`prompts\[0\]` must be a non-empty 1-D sequence of "
                                         r"int ids, received shape \(\).*one prompt of ids is a "
                                         r"list inside the list: \[\[1, 2, 3\]\]"):
        generation.generate_ids(model, [1, 2, 3], 2)


# === txl generate ===


@pytest.fixture(scope="module")
def char_workdir(tmp_path_factory):
    """A training-run folder with a char tokenizer (a, b, c, space, newline)."""
    from testing import write_char_run

    return write_char_run(tmp_path_factory.mktemp("char_run"))


@pytest.mark.parametrize("flags, message", [
    # Named by the flag that set them, not by the Python argument.
    (["--segment-length", "0"], "--segment-length must be a positive integer"),
    (["--seed", "99999999999999999999999"], r"--seed must be None or an integer in \[0, 2\*\*63"),
    (["--top-k", "-1"], "--top-k must be"),
    (["--max-new-tokens", "-2"], "`max_new_tokens`"),
])
def test_txl_generate_reports_bad_arguments_before_any_output(char_workdir, capsys, flags,
                                                              message):
    workdir, _ = char_workdir
    argv = ["generate", "--workdir", str(workdir), "--prompt", "abc", *flags]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "Traceback" not in captured.err
    assert len(captured.err.strip().splitlines()) == 1, captured.err
    assert __import__("re").search(message, captured.err), captured.err


@pytest.mark.parametrize("extra", [[], ["--segment-length", "1"]])
def test_txl_generate_clamps_top_k_to_the_vocabulary(char_workdir, capsys, extra):
    workdir, vocabulary_size = char_workdir
    outputs = []
    for k in ("1000", str(vocabulary_size)):
        argv = ["generate", "--workdir", str(workdir), "--prompt", "abc", "--top-k", k,
                "--seed", "4", "--max-new-tokens", "6", *extra]
        assert main(argv) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[0].startswith("abc")


@pytest.mark.parametrize("temperature", [1e-10, 1e-7])
def test_a_tiny_temperature_decodes_greedily(temperature):
    # keras-hub's softmax(logits / T) gave NaN under XLA at T = 1e-9 and the
    # last id was drawn (`txl generate --temperature 1e-10` wrote it forever);
    # the limit of T -> 0 is greedy decoding.
    model = id_model()
    greedy = generation.generate_ids(model, [[1, 2], [3]], 6, temperature=0)
    for top_k in (0, 5):
        tiny = generation.generate_ids(model, [[1, 2], [3]], 6, temperature=temperature,
                                       top_k=top_k, seed=1)
        for a, b in zip(tiny, greedy):
            np.testing.assert_array_equal(a, b)
    assert isinstance(generation.sampler_from_options(temperature),
                      keras_hub.samplers.GreedySampler)
    assert isinstance(generation.sampler_from_options(1e-5), keras_hub.samplers.RandomSampler)


def count_traces(model):
    """A list that grows by one each time `model.generate_step` is traced."""
    traces = []
    step = model.generate_step

    def counting_step(*args, **kwargs):
        traces.append(1)
        return step(*args, **kwargs)

    model.generate_step = counting_step
    return traces


def test_generate_ids_reuses_its_trace_and_draws_as_a_new_sampler():
    # Each call made a new tf.function: a loop over generate_ids retraced
    # (and XLA-compiled) the whole decoding loop at every call.
    model = id_model()
    model.compile(sampler="greedy", jit_compile=False)  # graph mode: faster to trace
    traces = count_traces(model)
    prompts = [[1, 2, 3], [4]]

    def reference(**options):
        """A new sampler and a new function, as every call built before."""
        model.compile(sampler=generation.sampler_from_options(vocabulary_size=V, **options),
                      jit_compile=False)
        out = model.generate(prompts, max_length=8, stop_token_ids=None, strip_prompt=True)
        return [np.asarray(row)[:5] for row in out]

    greedy = [generation.generate_ids(model, prompts, 5, temperature=0) for _ in range(3)]
    assert len(traces) == 1
    sampled = {seed: [generation.generate_ids(model, prompts, 5, top_k=4, seed=seed)
                      for _ in range(2)] for seed in (1, 2)}
    again = generation.generate_ids(model, prompts, 5, top_k=4, seed=1)
    assert len(traces) == 2  # one per sampler setting, whatever the seed
    free = [generation.generate_ids(model, prompts, 5, temperature=3.0, seed=None)
            for _ in range(4)]
    assert len(traces) == 3
    for out in greedy:
        for a, b in zip(out, reference(temperature=0)):
            np.testing.assert_array_equal(a, b)
    for seed, outs in sampled.items():
        for out in outs + ([again] if seed == 1 else []):
            for a, b in zip(out, reference(top_k=4, seed=seed)):
                np.testing.assert_array_equal(a, b)
    assert not all(np.array_equal(a[0], b[0]) for a, b in zip(sampled[1], sampled[2]))
    # seed=None draws anew at every call, not the first call's tokens again.
    assert len({tuple(np.concatenate(out)) for out in free}) > 1
    # Another XLA setting is another function.
    model.compile(sampler="greedy", jit_compile=True)
    count = len(traces)
    for _ in range(2):
        generation.generate_ids(model, prompts, 5, temperature=0)
    assert len(traces) == count + 1


def test_generate_ids_needs_no_new_trace_for_another_temperature_batch_or_length():
    # The temperature (and top-p's p) was part of the kept function's key and
    # every shape was traced anew: a server sweeping temperatures or batch
    # sizes retraced the whole decoding loop at each new value (5-9 s a call
    # under XLA on a 2-layer toy model).
    model = id_model()
    model.compile(sampler="greedy", jit_compile=False)
    traces = count_traces(model)

    def reference(prompts, n, **options):
        """A new sampler and a new function."""
        model.compile(sampler=generation.sampler_from_options(vocabulary_size=V, **options),
                      jit_compile=False)
        out = model.generate(prompts, max_length=max(map(len, prompts)) + n,
                             stop_token_ids=None, strip_prompt=True)
        return [np.asarray(row)[:n] for row in out]

    calls = [([[1, 2, 3], [4]], 5, dict(temperature=0.7, seed=3)),
             ([[1, 2, 3], [4]], 5, dict(temperature=1.6, seed=3)),
             ([[1, 2, 3], [4]], 5, dict(temperature=0.2, seed=3)),
             ([[1, 2], [4], [5, 6, 7]], 5, dict(temperature=1.6, seed=3)),
             ([[1, 2], [4], [5, 6, 7], [8]], 5, dict(temperature=0.9, seed=3)),
             ([[1, 2, 3, 4], [4]], 7, dict(temperature=0.9, seed=3))]
    outputs = [generation.generate_ids(model, p, n, **o) for p, n, o in calls]
    # One trace, then one per newly relaxed dimension (batch, length): none
    # for a temperature.
    assert len(traces) <= 3
    topp = [generation.generate_ids(model, [[1, 2, 3], [4]], 5, top_p=p, temperature=1.5, seed=2)
            for p in (0.9, 0.5, 0.99)]
    assert len(traces) <= 4
    count = len(traces)
    for (prompts, n, options), out in zip(calls, outputs):
        for a, b in zip(out, reference(prompts, n, **options)):
            np.testing.assert_array_equal(a, b)
    for p, out in zip((0.9, 0.5, 0.99), topp):
        for a, b in zip(out, reference([[1, 2, 3], [4]], 5, top_p=p, temperature=1.5, seed=2)):
            np.testing.assert_array_equal(a, b)
    assert len(traces) > count  # the references trace: the counter counts
    # The temperatures were not all the same draws.
    assert not all(np.array_equal(a, b) for a, b in zip(outputs[0], outputs[1]))


def test_sampling_values_that_float32_cannot_hold_are_refused_on_every_path():
    # The samplers and the SavedModel compute in float32. A temperature of
    # 1e39 (finite in Python) passed check_sampling, then generate_ids
    # failed naming its own "sampler (RandomSampler) temperature=inf", the
    # host loop and tflite_generate sampled with it, and compile() took a
    # RandomSampler(temperature=1e39); top_p=1e-300 became p=0.0 ("must be in
    # (0, 1], received p=0.0") in generate_ids and greedy in the host loop.
    from keras_hub.samplers import RandomSampler
    from keras_hub.samplers import TopPSampler

    model = id_model()
    temperature = r"`temperature` must be a finite number >= 0 \(0 is greedy\) and at most " \
                  r"3\.40282e\+38, the largest float32 .* received temperature=1e\+39"
    top_p = r"`top_p` must be in \(0, 1\] \(1 keeps every token\) and at least 1\.4013e-45, " \
            r"the smallest float32 above 0 .* received top_p=1e-300"
    for options, message in (({"temperature": 1e39}, temperature),
                             ({"temperature": 1.0, "top_p": 1e-300}, top_p)):
        with pytest.raises(ValueError, match=message):
            generation.generate_ids(model, [[1, 2]], 2, seed=0, **options)
        with pytest.raises(ValueError, match=message):
            generation.generate(model, [1, 2], 2, seed=0, **options)
        with pytest.raises(ValueError, match=message):
            generation.sampler_from_options(seed=0, **options)
    with pytest.raises(ValueError, match=r"`sampler \(RandomSampler\) temperature` must be a "
                                         r"finite number > 0 .* at most 3\.40282e\+38"):
        model.compile(sampler=RandomSampler(temperature=1e39))
    with pytest.raises(ValueError, match=r"`sampler \(TopPSampler\) p` must be in \(0, 1\] .* "
                                         r"at least 1\.4013e-45"):
        model.compile(sampler=TopPSampler(p=1e-300))
    # The float32 limits themselves are valid.
    limit = float(np.finfo(np.float32).max)
    tiny = float(np.finfo(np.float32).smallest_subnormal)
    assert generation.check_sampling(limit, 0, tiny) == (limit, 0, tiny)
