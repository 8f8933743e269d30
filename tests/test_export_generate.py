"""The SavedModel `generate` signatures: text in, text out, the loop in the graph.

A tiny byte-level model with a preprocessor (keras-hub's ByteTokenizer:
tokenize/detokenize are graph ops) is exported once. Greedy decoding of a
batch of prompts of 5, 17 and 40 tokens through `model.generate` equals
each prompt alone, and equals the `generate` signature run in a fresh
Python process (TensorFlow only), tokens, texts and memory. Sampling is
deterministic for a seed; bad requests fail with messages naming the input.
"""

import json
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import serving_doubles
import tensorflow as tf
from testing import byte_causal_lm

from keras_txl import generation
from keras_txl.export import saved_model
from keras_txl.export import serving
from keras_txl.export import signatures as sig

# Token lengths 5, 17 and 40 (one byte per character).
PROMPTS = ["Hello", "The quick brown f", "Transformer-XL keeps a memory of the pas"]
NEW = 12


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    keras.utils.set_random_seed(0)
    model = byte_causal_lm()
    tmp = tmp_path_factory.mktemp("generate")
    from keras_txl.tokenizers import ByteTokenizer

    ByteTokenizer().save(tmp / "tokenizer")  # what `txl generate` encodes with
    version_dir = saved_model.export_saved_model(
        model, str(tmp / "models"), tokenizer_dir=str(tmp / "tokenizer"))
    return model, version_dir, tmp


def ids_of(text):
    return list(text.encode("utf-8"))


def call(signature, prompts, max_new_tokens=NEW, memory=None, **options):
    inputs = serving.generate_request(prompts, max_new_tokens, **options)
    if memory is not None:
        inputs[sig.MEMORY] = np.asarray(memory, np.float32)
    out = signature(**{k: tf.constant(v) for k, v in inputs.items()})
    return {k: v.numpy() for k, v in out.items()}


def alone(model, text, max_new_tokens=NEW, memory=None):
    """(new ids, memory) of `model.generate` on one prompt, greedy."""
    ids = ids_of(text)
    new, memory = model.generate(
        [ids], max_length=len(ids) + max_new_tokens, strip_prompt=True,
        memory=memory, return_memory=True,
    )
    return np.asarray(new[0]), np.asarray(memory)[0]


FRESH = r"""
import json, sys
import numpy as np
import tensorflow as tf

job = json.loads(sys.argv[1])
generate = tf.saved_model.load(job["saved_model"]).signatures["generate"]
out = generate(
    prompts=tf.constant(job["prompts"]),
    max_new_tokens=tf.constant(job["max_new_tokens"], tf.int32),
    temperature=tf.constant(0.0), top_k=tf.constant(0, tf.int32),
    top_p=tf.constant(1.0), seed=tf.constant(0, tf.int64))
out = {k: v.numpy() for k, v in out.items()}
texts = [t.decode("utf-8") for t in out.pop("texts")]
np.savez(job["output"], **out)
print("REPORT " + json.dumps({"keras_txl_imported": "keras_txl" in sys.modules,
                              "texts": texts}))
"""


def test_greedy_batch_equals_each_prompt_alone_and_a_fresh_process(exported):
    model, version_dir, tmp = exported
    model.compile(sampler="greedy")
    assert [len(ids_of(p)) for p in PROMPTS] == [5, 17, 40]
    # In process: the batch (every row decoded up to the longest prompt
    # + NEW) against each prompt alone.
    longest = max(len(ids_of(p)) for p in PROMPTS)
    batch = model.generate([ids_of(p) for p in PROMPTS],
                           max_length=longest + NEW, strip_prompt=True)
    singles = [alone(model, p) for p in PROMPTS]
    for row, (new, _) in zip(batch, singles):
        assert len(new) == NEW
        np.testing.assert_array_equal(np.asarray(row)[:NEW], new)
    assert len({tuple(new) for new, _ in singles}) > 1  # not one constant row
    # The SavedModel, in a fresh interpreter that never imports keras_txl.
    job = {"saved_model": version_dir, "prompts": PROMPTS,
           "max_new_tokens": NEW, "output": str(tmp / "fresh.npz")}
    proc = subprocess.run(
        [sys.executable, "-c", FRESH, json.dumps(job)], cwd=tmp,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.split("REPORT ")[-1])
    assert report["keras_txl_imported"] is False
    served = np.load(job["output"])
    np.testing.assert_array_equal(served["lengths"], [NEW] * 3)
    tokenizer = model.preprocessor.tokenizer
    for b, (new, memory) in enumerate(singles):
        np.testing.assert_array_equal(served["token_ids"][b], new)
        assert report["texts"][b] == tokenizer.detokenize(new.tolist())
        np.testing.assert_allclose(served["memory"][b], memory, atol=1e-5)
    difference = max(np.abs(served["memory"][b] - m).max()
                     for b, (_, m) in enumerate(singles))
    print(f"max |memory(signature) - memory(generate)| = {difference:.2e}")


def test_generate_from_memory_continues_like_generate_with_memory(exported):
    model, version_dir, _ = exported
    model.compile(sampler="greedy")
    signatures = tf.saved_model.load(version_dir).signatures
    first = call(signatures[sig.GENERATE], PROMPTS[:2], 6)
    second = call(signatures[sig.GENERATE_FROM_MEMORY], [" and", " then"],
                  5, memory=first[sig.MEMORY])
    for b, (text, earlier) in enumerate(zip(PROMPTS[:2], first[sig.MEMORY])):
        _, memory = alone(model, text, 6)
        np.testing.assert_allclose(earlier, memory, atol=1e-5)
        new, memory = alone(model, [" and", " then"][b], 5, memory=memory[None])
        np.testing.assert_array_equal(second[sig.TOKEN_IDS][b], new)
        np.testing.assert_allclose(second[sig.MEMORY][b], memory, atol=1e-5)


def test_sampling_is_seeded_and_greedy_at_temperature_zero(exported):
    _, version_dir, _ = exported
    generate = tf.saved_model.load(version_dir).signatures[sig.GENERATE]
    greedy = call(generate, PROMPTS)[sig.TOKEN_IDS]
    sampled = {
        seed: call(generate, PROMPTS, temperature=1.0, seed=seed)[sig.TOKEN_IDS]
        for seed in (1, 2)
    }
    np.testing.assert_array_equal(
        call(generate, PROMPTS, temperature=1.0, seed=1)[sig.TOKEN_IDS], sampled[1]
    )
    assert not np.array_equal(sampled[1], sampled[2])
    assert not np.array_equal(sampled[1], greedy)
    # top_k=1 and a tiny top_p keep only the most likely id: greedy.
    for options in ({"top_k": 1}, {"top_p": 1e-6}):
        np.testing.assert_array_equal(
            call(generate, PROMPTS, temperature=1.5, seed=3, **options)[sig.TOKEN_IDS],
            greedy,
        )
    # top_k=3: every sampled id is one of the 3 most likely at its step,
    # checked on the first step (whose distribution does not depend on it).
    first = call(generate, PROMPTS, 1, temperature=5.0, seed=4, top_k=3)
    log_probs = _next_log_probs(version_dir, PROMPTS)
    for b, row in enumerate(log_probs):
        assert first[sig.TOKEN_IDS][b, 0] in np.argsort(-row)[:3]


def _next_log_probs(version_dir, prompts):
    """(B, V) log-probs after each prompt fed one token at a time."""
    signatures = tf.saved_model.load(version_dir).signatures
    rows = []
    for text in prompts:
        memory = tf.zeros(sig.memory_shape(_config(version_dir), 1))
        for token in ids_of(text):
            out = signatures[sig.NEXT_TOKEN](
                token_ids=tf.constant([[token]], tf.int32), memory=memory)
            memory = out[sig.MEMORY]
        rows.append(out[sig.LOG_PROBS].numpy()[0])
    return np.stack(rows)


def _config(version_dir):
    return saved_model.load_config(version_dir)


@pytest.mark.parametrize("options, prompts, message", [
    ({"max_new_tokens": 0}, PROMPTS, "`max_new_tokens` must be >= 1"),
    ({"max_new_tokens": sig.MAX_NEW_TOKENS_CAP + 1}, PROMPTS,
     f"`max_new_tokens` must be <= {sig.MAX_NEW_TOKENS_CAP}"),
    ({}, ["fine", ""], "every prompt must tokenize to at least one token"),
    ({}, [], "`prompts` must hold at least one prompt"),
    ({"top_p": 1.5}, PROMPTS, r"`top_p` must be in \(0, 1\]"),
    ({"top_p": 0.0}, PROMPTS, r"`top_p` must be in \(0, 1\]"),
    ({"temperature": -1.0}, PROMPTS, "`temperature` must be >= 0"),
    ({"temperature": float("nan")}, PROMPTS, "`temperature` must be finite"),
    ({"top_k": -1}, PROMPTS, "`top_k` must be >= 0"),
])
def test_bad_requests_fail_with_the_input_named(exported, options, prompts, message):
    _, version_dir, _ = exported
    predictor = serving_doubles.SavedModelPredictor(version_dir)
    inputs = serving.generate_request(prompts, options.pop("max_new_tokens", 4), **options)
    if not prompts:
        inputs[sig.PROMPTS] = np.zeros((0,), object)
    with pytest.raises(serving_doubles.PredictError, match=message):
        predictor.predict(sig.GENERATE, inputs)


def test_memory_of_another_shape_or_batch_is_refused(exported):
    _, version_dir, _ = exported
    predictor = serving_doubles.SavedModelPredictor(version_dir)
    config = _config(version_dir)
    inputs = serving.generate_request(PROMPTS, 2)
    inputs[sig.MEMORY] = np.zeros(sig.memory_shape(config, 2), np.float32)
    with pytest.raises(serving_doubles.PredictError, match="same batch size"):
        predictor.predict(sig.GENERATE_FROM_MEMORY, inputs)
    inputs[sig.MEMORY] = np.full(sig.memory_shape(config, 3), np.nan, np.float32)
    with pytest.raises(serving_doubles.PredictError, match="NaN or Inf"):
        predictor.predict(sig.GENERATE_FROM_MEMORY, inputs)


def test_signatures_manifest_and_warmup_include_generate(exported):
    _, version_dir, _ = exported
    config = _config(version_dir)
    loaded = tf.saved_model.load(version_dir).signatures
    table = sig.signature_table(config, names=sig.SAVED_MODEL_SIGNATURES
                                + sig.GENERATE_SIGNATURES)
    assert sorted(loaded) == sorted(table)
    for name in sig.GENERATE_SIGNATURES:
        specs = loaded[name].structured_input_signature[1]
        assert {k: (s.dtype.name, tuple(s.shape)) for k, s in specs.items()} == {
            k: (d, tuple(shape)) for k, (d, shape) in table[name]["inputs"].items()
        }
        outputs = loaded[name].structured_outputs
        assert {k: (s.dtype.name, tuple(s.shape)) for k, s in outputs.items()} == {
            k: (d, tuple(shape)) for k, (d, shape) in table[name]["outputs"].items()
        }
    with open(os.path.join(version_dir, serving.ASSETS_EXTRA, "export.json")) as f:
        info = json.load(f)
    assert set(sig.GENERATE_SIGNATURES) <= set(info["signatures"])
    assert info["generate_caps"]["max_new_tokens"] == sig.MAX_NEW_TOKENS_CAP
    replayed = dict(serving_doubles.replay_warmup(version_dir))
    assert set(replayed) == set(table)
    assert replayed[sig.GENERATE][sig.TEXTS].shape == (1,)
    assert replayed[sig.GENERATE][sig.LENGTHS].tolist() == [4]


def test_a_model_without_preprocessor_has_no_generate_signature(tmp_path):
    model = byte_causal_lm(preprocessor=False)
    with pytest.raises(ValueError, match="need a model with a preprocessor"):
        sig.generate_functions(model)
    path = saved_model.export_saved_model(model, str(tmp_path), warmup=False)
    assert sorted(tf.saved_model.load(path).signatures) == sorted(
        sig.SAVED_MODEL_SIGNATURES)


def test_rows_stop_at_the_end_token_each_with_its_own_memory():
    """With a tokenizer `end_token_id`, each row stops after it (kept), its
    memory covering up to it: the batch equals each prompt alone."""
    keras.utils.set_random_seed(0)
    model = byte_causal_lm()
    model.compile(sampler="greedy")
    free = [alone(model, p, 8)[0] for p in PROMPTS]
    stop = int(free[1][3])  # the 4th new token of the second prompt
    from keras_txl.causal_lm_preprocessor import TransformerXLCausalLMPreprocessor
    from keras_txl.tokenizers import ByteTokenizer

    # A byte tokenizer whose end token is that byte.
    stopping = type("StoppingByteTokenizer", (ByteTokenizer,), {"end_token_id": stop})()
    model.preprocessor = TransformerXLCausalLMPreprocessor(stopping, sequence_length=8)
    function, specs = sig.generate_functions(model, names=(sig.GENERATE,))[sig.GENERATE]
    served = call(tf.function(function, input_signature=specs), PROMPTS, 8)
    for b, text in enumerate(PROMPTS):
        new, memory = alone(model, text, 8)  # model.generate stops there too
        hits = [i for i, token in enumerate(free[b]) if token == stop]
        expected = hits[0] + 1 if hits else 8
        assert served[sig.LENGTHS][b] == len(new) == expected
        np.testing.assert_array_equal(served[sig.TOKEN_IDS][b, :expected], new)
        assert not served[sig.TOKEN_IDS][b, expected:].any()
        np.testing.assert_allclose(served[sig.MEMORY][b], memory, atol=1e-5)
    assert served[sig.LENGTHS][1] <= 4


def test_generate_signature_starts_a_masked_model_from_masked_slots(tmp_path):
    # `generate` has no memory input: the loop starts from the model's own
    # empty memory, masked slots with empty_memory="masked", as Keras does
    # (the docs said it attended to zero slots once exported).
    keras.utils.set_random_seed(0)
    model = byte_causal_lm(empty_memory="masked")
    version_dir = saved_model.export_saved_model(model, str(tmp_path / "models"))
    generate = tf.saved_model.load(version_dir).signatures["generate"]
    zeros = model.with_settings(empty_memory="zeros")
    for keras_model in (model, zeros):
        keras_model.compile(sampler="greedy")

    def greedy(keras_model, text):
        ids = ids_of(text)
        return np.asarray(keras_model.generate([ids], max_length=len(ids) + NEW,
                                               strip_prompt=True)[0])

    differs = False
    for text in PROMPTS[:2]:
        out = call(generate, [text])
        expected = greedy(model, text)
        np.testing.assert_array_equal(out[sig.TOKEN_IDS][0], expected)
        differs |= not np.array_equal(greedy(zeros, text), expected)
    assert differs  # the masked slots matter for these weights


def test_txl_generate_uses_the_generate_signature_of_a_saved_model(exported, capsys):
    from keras_txl.cli import main

    model, version_dir, _ = exported
    model.compile(sampler="greedy")
    code = main(["generate", "--saved-model", version_dir, "--prompt", PROMPTS[1],
                 "--max-new-tokens", "9", "--temperature", "0"])
    assert code == 0
    new, _ = alone(model, PROMPTS[1], 9)
    expected = PROMPTS[1] + model.preprocessor.tokenizer.detokenize(new.tolist())
    assert capsys.readouterr().out == expected + "\n"


@pytest.mark.parametrize("kind", ["sentencepiece", "wordpiece"])
def test_a_subword_tokenizer_generates_from_a_saved_model_after_a_seed_reset(tmp_path, kind):
    """The generate signature holds the tokenizer's graph ops: greedy text from
    the reloaded SavedModel, after keras.utils.set_random_seed (which deleted
    the eager SentencePiece resource a traced graph had captured), equals
    model.generate's."""
    import tensorflow_text  # noqa: F401 - registers the tokenizer ops to load
    from testing import BYTE

    from keras_txl import TransformerXLCausalLM
    from keras_txl import TransformerXLConfig
    from keras_txl.causal_lm_preprocessor import TransformerXLCausalLMPreprocessor
    from keras_txl.tokenizers import build_tokenizer

    text = "the quick brown fox jumps over the lazy dog\n" * 40 + "a memory of the past\n" * 20
    tokenizer = build_tokenizer(kind, text, vocabulary_size=60)
    keras.utils.set_random_seed(0)
    config = TransformerXLConfig.from_dict(
        {**BYTE, "vocabulary_size": tokenizer.vocabulary_size()})
    model = TransformerXLCausalLM(config, preprocessor=TransformerXLCausalLMPreprocessor(
        tokenizer, sequence_length=config.segment_length))
    model.compile(sampler="greedy")
    prompts = ["the quick", "a memory of"]
    expected = [str(model.generate(p, max_length=len(tokenizer.encode(p)) + 5,
                                   strip_prompt=True)) for p in prompts]
    path = saved_model.export_saved_model(model, str(tmp_path), warmup=False)
    keras.utils.set_random_seed(1)
    generate = tf.saved_model.load(path).signatures["generate"]
    served = call(generate, prompts, 5, temperature=0.0, top_k=0)
    assert [t.decode() for t in served[sig.TEXTS]] == expected
    assert served[sig.LENGTHS].tolist() == [5, 5] and all(expected)


def test_the_generate_signature_refuses_non_finite_log_probs():
    # As Keras' generate: tokens chosen from NaN log-probabilities (argmax
    # gives the last id) are an INVALID_ARGUMENT, not texts.
    model = byte_causal_lm()
    model.set_weights([np.full_like(w, np.nan) for w in model.get_weights()])
    generate, specs = sig.generate_functions(model, names=(sig.GENERATE,))[sig.GENERATE]
    function = tf.function(generate, input_signature=specs)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="NaN or \\+Inf log-probabilities"):
        function(**serving.generate_request(["ab"], 3))


def test_the_generate_signature_refuses_a_negative_seed_like_the_python_paths(exported):
    # generate_ids and SavedModelBackend refuse seed < 0; the signature took
    # it and drew tokens from it.
    model, version_dir, _ = exported
    generate = tf.saved_model.load(version_dir).signatures[sig.GENERATE]
    inputs = {k: tf.constant(v) for k, v in serving.generate_request(PROMPTS, 3).items()}
    for seed in (-1, -(2**63)):
        inputs[sig.SEED] = tf.constant(seed, tf.int64)
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"`seed` must be in \[0, 2\*\*63 - 1\]"):
            generate(**inputs)
    inputs[sig.SEED] = tf.constant(2**63 - 1, tf.int64)  # the top of the range is fine
    assert generate(**inputs)[sig.TOKEN_IDS].shape == (len(PROMPTS), 3)
    with pytest.raises(ValueError, match="`seed`"):
        generation.generate_ids(model, [[1, 2]], 3, seed=-1)


def test_request_options_are_used_only_after_their_checks(exported):
    """The graph runs an op once its inputs are there: an option read by an
    op outside the checks' control dependencies races them. tf.range(
    max_new_tokens) did: max_new_tokens=-1 failed now and then in Range
    ("Requires start <= limit"), and 2**31 - 1 allocated 8 GB before the
    cap refused the request."""
    model, version_dir, _ = exported
    function, specs = sig.generate_functions(model)[sig.GENERATE]
    graph = tf.function(function).get_concrete_function(*specs).graph
    for name in (sig.MAX_NEW_TOKENS, sig.TEMPERATURE, sig.TOP_K, sig.TOP_P, sig.SEED):
        for op in graph.get_operation_by_name(name).outputs[0].consumers():
            checked = op.name.startswith(("assert_", "VerifyFinite/"))
            gated = op.type == "Identity" and op.control_inputs
            assert checked or gated, f"{name} is read by {op.type} {op.name} unchecked"
    predictor = serving_doubles.SavedModelPredictor(version_dir)
    for _ in range(20):
        with pytest.raises(serving_doubles.PredictError,
                           match="`max_new_tokens` must be >= 1"):
            predictor.predict(sig.GENERATE, serving.generate_request(PROMPTS, -1))


def test_the_warmup_prompt_is_one_the_tokenizer_reads(tmp_path):
    """TF Serving does not load a version whose warm-up request fails. The
    generate requests sent "Hello", which the official text8 symbols
    (lower-case letters and "_", no unknown symbol) refuse: an export of
    the text8 release could not be served."""
    from testing import tiny_config

    import keras_txl
    from keras_txl.causal_lm_preprocessor import TransformerXLCausalLMPreprocessor
    from keras_txl.tokenizers import official_tokenizer

    tokenizer = official_tokenizer(list("abcdefghijklmnopqrstuvwxyz") + ["_"], "text8")
    with pytest.raises(tf.errors.InvalidArgumentError, match="not in the text8 vocabulary"):
        tokenizer.tokenize(tf.constant([serving.WARMUP_PROMPT]))
    prompt = serving.warmup_prompt(tokenizer)
    assert prompt and tokenizer.tokenize(tf.constant([prompt])).row_lengths()[0] > 0
    assert serving.warmup_prompt(byte_causal_lm().preprocessor.tokenizer) == "Hello"
    keras.utils.set_random_seed(0)
    model = keras_txl.TransformerXLCausalLM(
        tiny_config(vocabulary_size=27, memory_length=6),
        preprocessor=TransformerXLCausalLMPreprocessor(tokenizer, sequence_length=8))
    version_dir = saved_model.export_saved_model(model, str(tmp_path))
    replayed = dict(serving_doubles.replay_warmup(version_dir))
    assert set(sig.GENERATE_SIGNATURES) <= set(replayed)
    assert replayed[sig.GENERATE][sig.LENGTHS].tolist() == [4]
    # The same continuation as the model's own greedy generate.
    model.compile(sampler="greedy")
    ids = tokenizer.tokenize(tf.constant([prompt])).to_list()[0]
    new = model.generate([ids], max_length=len(ids) + 4, strip_prompt=True)
    assert replayed[sig.GENERATE][sig.TOKEN_IDS].tolist() == np.asarray(new).tolist()


def test_the_backend_checks_a_generate_request_before_casting_it(exported):
    # SavedModelBackend.generate_texts("Hello", ...) generated five one-letter
    # prompts; 2.5 new tokens or top_k=2.5 were cut to 2, and a seed past
    # int64 or a top_k past int32 was numpy's OverflowError.
    from keras_txl.export.generation import SavedModelBackend

    _, version_dir, _ = exported
    backend = SavedModelBackend(version_dir)
    assert backend.max_new_tokens == sig.MAX_NEW_TOKENS_CAP  # from its export.json
    for prompts in ("Hello", b"Hello", [], ["a", 3], None):
        with pytest.raises(ValueError, match=r"`prompts` must be a non-empty list of strings \(or a "
                                             r"1-D array or string tensor of them\), received "
                                             f"{re.escape(repr(prompts))}"):
            backend.generate_texts(prompts, 2)
    for options, message in [
        ({"max_new_tokens": 2.5}, "`max_new_tokens` must be a positive integer"),
        ({"max_new_tokens": 2**31},
         f"`max_new_tokens` must be <= {sig.MAX_NEW_TOKENS_CAP} .* received max_new_tokens=2147"),
        ({"max_new_tokens": sig.MAX_NEW_TOKENS_CAP + 1},
         f"`max_new_tokens` must be <= {sig.MAX_NEW_TOKENS_CAP} \\(the cap of this export's "
         "generate signature\\)"),
        ({"top_k": 2.5}, "`top_k` must be an integer >= 0"),
        ({"top_p": True}, r"`top_p` must be in \(0, 1\]"),
        ({"temperature": "0.5"}, "`temperature` must be a finite number"),
        ({"seed": 2**64}, r"`seed` must be None or an integer in \[0, 2\*\*63 - 1"),
        ({"seed": 1.5}, r"`seed` must be None or an integer"),
    ]:
        with pytest.raises(ValueError, match=message):
            backend.generate_ids(PROMPTS[:1], **{"max_new_tokens": 2, **options})
    # A top_k past int32 keeps every id, as top_k = V (the signature clamps it).
    options = dict(temperature=1.0, seed=3)
    np.testing.assert_array_equal(
        backend.generate_ids(PROMPTS[:1], 4, top_k=2**40, **options)[0],
        backend.generate_ids(PROMPTS[:1], 4, top_k=256, **options)[0])


def test_the_backend_takes_prompts_as_a_1d_array_or_string_tensor(exported):
    # A 1-D numpy array of strings (what a DataFrame column gives) was refused
    # as "not a list of strings", though model.generate takes one.
    from keras_txl.export.generation import SavedModelBackend

    _, version_dir, _ = exported
    backend = SavedModelBackend(version_dir)
    expected = backend.generate_texts(PROMPTS[:2], 3)
    for prompts in (np.array(PROMPTS[:2]), np.array(PROMPTS[:2], dtype=object),
                    np.array([p.encode() for p in PROMPTS[:2]]), tf.constant(PROMPTS[:2])):
        assert backend.generate_texts(prompts, 3) == expected
        for a, b in zip(backend.generate_ids(prompts, 3), backend.generate_ids(PROMPTS[:2], 3)):
            np.testing.assert_array_equal(a, b)
    for prompts in (np.array("Hello"), np.array([PROMPTS[:2]]), np.array([], str),
                    np.array([1, 2]), tf.constant("Hello")):
        with pytest.raises(ValueError, match="`prompts` must be a non-empty list of strings"):
            backend.generate_texts(prompts, 2)


def test_the_backend_names_an_empty_prompt_and_too_many_prompts(exported):
    # Both were the signature's InvalidArgumentError, a graph error with the
    # message buried in "Detected at node assert_positive_3/..." lines.
    from keras_txl.export.generation import SavedModelBackend

    _, version_dir, _ = exported
    backend = SavedModelBackend(version_dir)
    with pytest.raises(ValueError, match=r"`prompts`\[1\] is empty: every prompt needs at least "
                                         "one token"):
        backend.generate_texts(["a", ""], 2)
    many = ["a"] * (sig.MAX_GENERATE_BATCH + 1)
    with pytest.raises(ValueError, match=f"`prompts` may hold at most {sig.MAX_GENERATE_BATCH} "
                                         f"prompts per request .* received {len(many)}"):
        backend.generate_ids(many, 1)
    assert backend.max_batch_size == sig.MAX_GENERATE_BATCH  # from its export.json


def test_a_prompt_with_surrogateescape_bytes_generates_as_from_keras(exported, capsys):
    # A shell argument that is not UTF-8 reaches Python as surrogateescape
    # surrogates. `txl generate --saved-model` warned that "the model receives
    # their raw bytes", then failed with the UnicodeEncodeError of
    # generate_request ("surrogates not allowed"), while --from-preset generated.
    from keras_txl.cli import main
    from keras_txl.export.generation import SavedModelBackend

    model, version_dir, _ = exported
    model.compile(sampler="greedy")
    backend = SavedModelBackend(version_dir)
    prompt = "caf\udce9 ol\udcff"  # the bytes b"caf\xe9 ol\xff", Latin-1
    raw = prompt.encode("utf-8", "surrogateescape")
    (new,) = backend.generate_ids([prompt], 6)
    np.testing.assert_array_equal(new, backend.generate_ids([raw], 6)[0])
    expected = model.generate([list(raw)], max_length=len(raw) + 6, strip_prompt=True)[0]
    np.testing.assert_array_equal(new, expected)
    assert backend.generate_texts([prompt], 6) == backend.generate_texts([raw], 6)
    code = main(["generate", "--saved-model", version_dir, "--prompt", prompt,
                 "--max-new-tokens", "6", "--temperature", "0"])
    assert code == 0
    text = model.preprocessor.tokenizer.detokenize(list(raw) + expected.tolist())
    assert capsys.readouterr().out == text + "\n"
    # Any other lone surrogate stands for no byte: refused by name.
    with pytest.raises(ValueError, match=r"`prompts\[1\]` holds the lone surrogate '\\ud800' "
                                         r"\(U\+D800\) at position 1"):
        backend.generate_texts(["ok", "a\ud800"], 2)


def test_the_backend_names_a_prompt_past_the_token_cap(exported):
    # A prompt of more tokens than the export's generate_caps (4096) was the
    # signature's InvalidArgumentError, "Graph execution error: ... Detected
    # at node assert_less_equal_3/...", though `txl generate` checks the cap.
    from keras_txl.export.generation import SavedModelBackend

    _, version_dir, _ = exported
    backend = SavedModelBackend(version_dir)
    long = "a" * (sig.MAX_PROMPT_TOKENS + 1)  # one byte token per character
    with pytest.raises(ValueError, match=rf"`prompts`\[1\] holds {sig.MAX_PROMPT_TOKENS + 1} "
                                         rf"tokens, more than the {sig.MAX_PROMPT_TOKENS} "
                                         "this export's generate signature takes"):
        backend.generate_ids(["ok", long], 1)
    assert len(backend.generate_ids([long[1:]], 1)[0]) == 1  # the cap itself is taken
    assert backend.max_prompt_tokens == sig.MAX_PROMPT_TOKENS  # from its export.json


def test_the_backend_names_a_prompt_that_tokenizes_to_nothing(tmp_path):
    # "   " is not empty, but a word tokenizer makes no token of it: the
    # signature's "every prompt must tokenize to at least one token" came back
    # as a graph error ("Detected at node assert_positive_3/...").
    from testing import tiny_config

    from keras_txl import TransformerXLCausalLM
    from keras_txl.causal_lm_preprocessor import TransformerXLCausalLMPreprocessor
    from keras_txl.export.generation import SavedModelBackend
    from keras_txl.tokenizers import WordTokenizer

    tokenizer = WordTokenizer(["<eos>", "<unk>", "the", "cat", "sat", "on", "mat", "a"])
    tokenizer.save(tmp_path / "tokenizer")
    keras.utils.set_random_seed(0)
    model = TransformerXLCausalLM(
        tiny_config(vocabulary_size=tokenizer.vocabulary_size()),
        preprocessor=TransformerXLCausalLMPreprocessor(tokenizer, sequence_length=8))
    path = saved_model.export_saved_model(model, str(tmp_path / "models"), warmup=False,
                                          tokenizer_dir=str(tmp_path / "tokenizer"))
    backend = SavedModelBackend(path)
    with pytest.raises(ValueError, match=r"`prompts`\[1\] tokenizes to no token: every prompt "
                                         "needs at least one token to continue"):
        backend.generate_texts(["the cat", "   "], 2)
    assert len(backend.generate_ids(["the cat"], 2)[0]) == 2
