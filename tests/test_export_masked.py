"""Exports of a model with `empty_memory="masked"`: the memory's validity
travels as `memory_mask` (B, M) bool beside every memory.

A tiny byte-level model with M = 8 is exported once (SavedModel with the
`generate` signatures, stateless and stateful TFLite). Three segments of
3 tokens chained from `initial_memory` (the text shorter than M for two of
them) equal Keras' `call_with_memory` chained from `memory=None`, masks
included; an export that counted every slot as real (what the signatures
did before they had a mask) gives other numbers. A zeros model's
signatures have no mask.
"""

import json
import os
import re
import types

import keras
import numpy as np
import pytest
import serving_doubles
import tensorflow as tf
from testing import byte_causal_lm
from testing import tiny_config

from keras_txl.export import saved_model
from keras_txl.export import serving
from keras_txl.export import signatures as sig
from keras_txl.export import tflite
from keras_txl.export.generation import SavedModelBackend
from keras_txl.export.generation import TFLiteBackend
from keras_txl.export.generation import tflite_generate
from keras_txl.export.serving_client import ServingError
from keras_txl.export.serving_client import TXLServingClient

B, T, SEGMENTS, M = 2, 3, 3, 8


def keras_chain(model, ids):
    """Per segment, Keras' outputs chained from `memory=None` (masked
    slots), with the targets' nll and the last position's log-probs."""
    memory = memory_mask = None
    targets = np.roll(ids, -1, axis=1)
    results = []
    for s in range(ids.shape[1] // T):
        cut = slice(s * T, (s + 1) * T)
        out = model.call_with_memory(ids[:, cut], memory, memory_mask=memory_mask)
        log_probs = np.asarray(out["log_probs"])
        memory, memory_mask = out["memory"], out["memory_mask"]
        results.append(dict(
            log_probs=log_probs, next=log_probs[:, -1],
            nll=-np.take_along_axis(log_probs, targets[:, cut, None], -1)[..., 0],
            memory=np.asarray(memory), memory_mask=np.asarray(memory_mask)))
    return results


@pytest.fixture(scope="module")
def masked(tmp_path_factory):
    keras.utils.set_random_seed(0)
    tmp = tmp_path_factory.mktemp("masked")
    model = byte_causal_lm(empty_memory="masked", memory_length=M)
    version_dir = saved_model.export_saved_model(model, str(tmp / "models"))
    paths = {"stateless": str(tmp / "tfl" / "txl.tflite"),
             "stateful": str(tmp / "tfl" / "txl-stateful.tflite"),
             "token": str(tmp / "tfl" / "txl-token.tflite")}
    tflite.export_tflite(model, paths["stateless"], batch_size=B, segment_length=T)
    tflite.export_tflite(model, paths["stateful"], batch_size=B, segment_length=T,
                         stateful=True)
    tflite.export_tflite(model, paths["token"], batch_size=1, segment_length=1)
    ids = np.random.default_rng(0).integers(0, 256, (B, SEGMENTS * T)).astype(np.int32)
    return types.SimpleNamespace(
        model=model, version_dir=version_dir, paths=paths, ids=ids, tmp=tmp,
        signatures=tf.saved_model.load(version_dir).signatures,
        reference=keras_chain(model, ids),
    )


def segment(masked, s):
    return masked.ids[:, s * T:(s + 1) * T]


def test_an_all_valid_memory_gives_other_numbers(masked):
    # What the signatures computed before they carried a mask: the zeros of
    # initial_memory counted as M real slots.
    old = masked.model.call_with_memory(segment(masked, 0), np.zeros((B, 2, M, 32), np.float32))
    assert np.abs(np.asarray(old["log_probs"])
                  - masked.reference[0]["log_probs"]).max() > 1e-2


def test_saved_model_chain_from_initial_memory_matches_keras(masked):
    signatures = masked.signatures
    start = signatures["initial_memory"](batch_size=tf.constant(B, tf.int32))
    np.testing.assert_array_equal(start["memory"], np.zeros((B, 2, M, 32)))
    np.testing.assert_array_equal(start["memory_mask"], np.zeros((B, M), bool))
    state = {"memory": start["memory"], "memory_mask": start["memory_mask"]}
    targets = np.roll(masked.ids, -1, axis=1)
    for s, ref in enumerate(masked.reference):
        ids = tf.constant(segment(masked, s))
        served = signatures["serving_default"](token_ids=ids, **state)
        scored = signatures["score"](
            token_ids=ids, targets=tf.constant(targets[:, s * T:(s + 1) * T]), **state)
        following = signatures["next_token"](token_ids=ids, **state)
        np.testing.assert_allclose(served["log_probs"], ref["log_probs"], atol=1e-5)
        np.testing.assert_allclose(scored["nll"], ref["nll"], atol=1e-5)
        np.testing.assert_allclose(following["log_probs"], ref["next"], atol=1e-5)
        for out in (served, scored, following):
            assert out["memory_mask"].dtype == tf.bool
            np.testing.assert_array_equal(out["memory_mask"], ref["memory_mask"])
            np.testing.assert_allclose(out["memory"], ref["memory"], atol=1e-5)
        state = {"memory": served["memory"], "memory_mask": served["memory_mask"]}
    # Fewer tokens than M so far, then more: both kinds of mask were met.
    assert not masked.reference[1]["memory_mask"].all()
    assert masked.reference[2]["memory_mask"].all()


def test_signatures_table_and_export_json_describe_the_mask(masked):
    config = masked.model.txl_config
    table = sig.signature_table(config, names=sig.SAVED_MODEL_SIGNATURES
                                + sig.GENERATE_SIGNATURES)
    mask = ("bool", (None, M))
    for name in (sig.SERVING_DEFAULT, sig.SCORE, sig.NEXT_TOKEN):
        assert table[name]["inputs"][sig.MEMORY_MASK] == mask
    for name in table:
        assert table[name]["outputs"][sig.MEMORY_MASK] == mask
    assert table[sig.GENERATE_FROM_MEMORY]["inputs"][sig.MEMORY_MASK] == mask
    assert sig.MEMORY_MASK not in table[sig.GENERATE]["inputs"]
    # The loaded SavedModel has exactly the table's inputs and outputs.
    for name, entry in table.items():
        function = masked.signatures[name]
        inputs = {k: (v.dtype.name, tuple(v.shape.as_list()))
                  for k, v in function.structured_input_signature[1].items()}
        outputs = {k: (v.dtype.name, tuple(v.shape.as_list()))
                   for k, v in function.structured_outputs.items()}
        assert inputs == entry["inputs"], name
        assert outputs == entry["outputs"], name
    with open(os.path.join(masked.version_dir, "assets.extra", "export.json")) as f:
        info = json.load(f)
    assert info["memory_mask_shape"] == [None, M]
    assert info["signatures"]["serving_default"]["inputs"]["memory_mask"] == {
        "dtype": "bool", "shape": [None, M]}
    # The stateful TFLite table keeps the mask inside; reset returns it.
    stateful = sig.signature_table(config, 2, 3, stateful=True)
    assert stateful[sig.RESET]["outputs"][sig.MEMORY_MASK] == ("bool", (2, M))
    assert sig.MEMORY_MASK not in stateful[sig.SERVING_DEFAULT]["inputs"]


def test_a_zeros_model_has_no_mask_anywhere():
    for config in (tiny_config(memory_length=6),
                   tiny_config(memory_length=0, empty_memory="masked")):
        assert not sig.masked_memory(config)
        assert sig.MEMORY_MASK not in sig.input_specs(config)
        for stateful in (False, True):
            table = sig.signature_table(config, stateful=stateful)
            assert "memory_mask" not in json.dumps(saved_model._json_table(table))
        assert "memory_mask" not in json.dumps(
            saved_model._json_table(sig.generate_signature_table(config)))
    # The shipped table of a zeros model, as before.
    config = tiny_config(memory_length=6)
    assert sig.signature_table(config)["serving_default"] == {
        "inputs": {"token_ids": ("int32", (None, None)),
                   "memory": ("float32", (None, 2, 6, 8))},
        "outputs": {"log_probs": ("float32", (None, None, 11)),
                    "memory": ("float32", (None, 2, 6, 8))}}


BAD_MASKS = {
    "wrong_M": ("serving_default", np.zeros((B, M - 1), bool), "Shape of tensor memory_mask"),
    "rank_1": ("score", np.zeros((M,), bool), "Shape of tensor memory_mask"),
    "wrong_batch": ("next_token", np.zeros((B + 1, M), bool),
                    "`memory_mask` and `token_ids` must have the same batch size"),
    # The signature wrapper checks dtypes before the graph runs: its own
    # message names the input's position, and the dtype expected.
    "float": ("serving_default", np.zeros((B, M), np.float32),
              "expected to be a bool tensor but is a float tensor"),
    "int": ("next_token", np.zeros((B, M), np.int32),
            "expected to be a bool tensor but is a int32 tensor"),
}


@pytest.mark.parametrize("case", sorted(BAD_MASKS))
def test_saved_model_refuses_a_bad_mask(masked, case):
    name, mask, pattern = BAD_MASKS[case]
    inputs = dict(token_ids=tf.constant(segment(masked, 0)),
                  memory=tf.zeros((B, 2, M, 32)))
    if name == "score":
        inputs["targets"] = tf.constant(segment(masked, 1))
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(pattern)):
        masked.signatures[name](**inputs, memory_mask=tf.constant(mask))
    with pytest.raises(TypeError, match="memory_mask"):  # a missing mask
        masked.signatures[name](**inputs)


def test_generate_then_generate_from_memory_match_keras(masked):
    model = masked.model
    model.compile(sampler="greedy")
    prompts, more, new = ["Hi!", "Yes"], [" a", "b!"], 3

    def call(name, texts, **state):
        inputs = serving.generate_request(texts, new)
        out = masked.signatures[name](
            **{k: tf.constant(v) for k, v in inputs.items()},
            **{k: tf.constant(v) for k, v in state.items()})
        return {k: v.numpy() for k, v in out.items()}

    first = call(sig.GENERATE, prompts)
    second = call(sig.GENERATE_FROM_MEMORY, more, memory=first["memory"],
                  memory_mask=first["memory_mask"])
    # Keras, batched (prompts of one length: a greedy batch is each alone).
    tokens, memory, mask = model.generate(
        [list(p.encode()) for p in prompts], max_length=len(prompts[0]) + new,
        strip_prompt=True, return_memory=True)
    np.testing.assert_array_equal(first["token_ids"], np.asarray(tokens))
    np.testing.assert_array_equal(first["memory_mask"], np.asarray(mask))
    np.testing.assert_allclose(first["memory"], np.asarray(memory), atol=1e-5)
    assert not np.asarray(mask).all()  # fewer than M tokens: masked slots left
    tokens, memory, mask = model.generate(
        [list(p.encode()) for p in more], max_length=len(more[0]) + new,
        strip_prompt=True, memory=memory, memory_mask=mask, return_memory=True)
    np.testing.assert_array_equal(second["token_ids"], np.asarray(tokens))
    np.testing.assert_array_equal(second["memory_mask"], np.asarray(mask))
    np.testing.assert_allclose(second["memory"], np.asarray(memory), atol=1e-5)
    # Continued as if every slot were real (no mask), the memory differs.
    all_valid = model.generate(
        [list(p.encode()) for p in more], max_length=len(more[0]) + new,
        strip_prompt=True, memory=first["memory"], memory_mask=np.ones((2, M), bool),
        return_memory=True)
    assert np.abs(np.asarray(all_valid[1]) - second["memory"]).max() > 1e-3
    # The mask's batch must be the prompts'.
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="`memory_mask` and `prompts` must have the same batch"):
        call(sig.GENERATE_FROM_MEMORY, more, memory=first["memory"],
             memory_mask=first["memory_mask"][:1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="memory_mask"):
        call(sig.GENERATE_FROM_MEMORY, more, memory=first["memory"],
             memory_mask=first["memory_mask"][:, 1:])


def test_warmup_requests_carry_the_mask_and_replay(masked):
    results = dict(serving_doubles.replay_warmup(masked.version_dir))
    for name in (sig.SERVING_DEFAULT, sig.SCORE, sig.NEXT_TOKEN,
                 sig.GENERATE, sig.GENERATE_FROM_MEMORY, sig.INITIAL_MEMORY):
        assert results[name][sig.MEMORY_MASK].dtype == bool
    requests = serving.read_warmup_file(os.path.join(
        masked.version_dir, "assets.extra", serving.WARMUP_FILE))
    sent = {r.model_spec.signature_name: r for r in requests}
    mask = tf.make_ndarray(sent[sig.SERVING_DEFAULT].inputs[sig.MEMORY_MASK])
    np.testing.assert_array_equal(mask, np.zeros((1, M), bool))


@pytest.mark.parametrize("variant", ["stateless", "stateful"])
def test_tflite_runner_chain_matches_keras(masked, variant):
    runner = tflite.TFLiteRunner(masked.paths[variant])
    assert runner.memory_mask_shape == (B, M)
    targets = np.roll(masked.ids, -1, axis=1)
    for method in ("step", "score", "next_token"):
        runner.reset()
        if variant == "stateless":
            np.testing.assert_array_equal(runner.memory_mask, np.zeros((B, M), bool))
        for s, ref in enumerate(masked.reference):
            args = [segment(masked, s)]
            if method == "score":
                args.append(targets[:, s * T:(s + 1) * T])
            got = getattr(runner, method)(*args)
            want = {"step": ref["log_probs"], "score": ref["nll"],
                    "next_token": ref["next"]}[method]
            np.testing.assert_allclose(got, want, atol=1e-5)
            if variant == "stateless":
                np.testing.assert_array_equal(runner.memory_mask, ref["memory_mask"])
                np.testing.assert_allclose(runner.memory, ref["memory"], atol=1e-5)
    if variant == "stateful":
        out = runner.run("reset")
        np.testing.assert_array_equal(out["memory_mask"], np.zeros((B, M), bool))
        np.testing.assert_array_equal(out["memory"], np.zeros((B, 2, M, 32)))
        # After reset, the first segment again sees masked slots only.
        np.testing.assert_allclose(runner.step(segment(masked, 0)),
                                   masked.reference[0]["log_probs"], atol=1e-5)


def test_tflite_runner_refuses_a_bad_mask(masked):
    runner = tflite.TFLiteRunner(masked.paths["stateless"])
    good = dict(token_ids=segment(masked, 0), memory=np.zeros((B, 2, M, 32), np.float32))
    for mask, pattern in ((np.zeros((B, M), np.int32), "`memory_mask` must be a bool array"),
                          (np.zeros((B, M), np.float32), "`memory_mask` must be a bool array"),
                          (np.zeros((B, M - 1), bool), "`memory_mask` must have shape (2, 8)"),
                          (np.zeros((B + 1, M), bool), "`memory_mask` must have shape (2, 8)")):
        with pytest.raises(ValueError, match=re.escape(pattern)):
            runner.run("serving_default", **good, memory_mask=mask)
    with pytest.raises(ValueError, match=r"missing \['memory_mask'\]"):
        runner.run("serving_default", **good)
    out = runner.run("serving_default", **good, memory_mask=np.zeros((B, M), bool))
    np.testing.assert_allclose(out["log_probs"], masked.reference[0]["log_probs"], atol=1e-5)


def test_tflite_generate_and_backends_start_from_masked_slots(masked):
    from keras_txl.generation import generate

    model = masked.model
    model.compile(sampler="greedy")
    prompt, more, new = list(b"Hello"), list(b" you"), 6
    tokens, memory, mask = model.generate(
        [prompt], max_length=len(prompt) + new, strip_prompt=True, return_memory=True)
    runner = tflite.TFLiteRunner(masked.paths["token"])
    got, got_memory, got_mask = tflite_generate(runner, prompt, new, temperature=0)
    np.testing.assert_array_equal(got, np.asarray(tokens[0]))
    np.testing.assert_array_equal(got_mask, np.asarray(mask))
    np.testing.assert_allclose(got_memory, np.asarray(memory), atol=1e-5)
    # Continued with its memory and mask, as model.generate continues.
    tokens, memory, mask = model.generate(
        [more], max_length=len(more) + new, strip_prompt=True, memory=memory,
        memory_mask=mask, return_memory=True)
    got, got_memory, got_mask = tflite_generate(
        runner, more, new, temperature=0, memory=got_memory, memory_mask=got_mask)
    np.testing.assert_array_equal(got, np.asarray(tokens[0]))
    np.testing.assert_array_equal(got_mask, np.asarray(mask))
    with pytest.raises(ValueError, match="`memory_mask` is required with `memory`"):
        tflite_generate(runner, more, 2, memory=got_memory)
    with pytest.raises(ValueError, match="`memory_mask` must be a bool array"):
        tflite_generate(runner, more, 2, memory=got_memory,
                        memory_mask=got_mask.astype(np.int32))
    # The host loop over the exported backends: the Keras model's tokens.
    expected = generate(model, prompt, new, temperature=0)
    # ... and from a partly empty memory with its mask (the host loop's
    # `initial_memory` took no mask: its unfilled slots counted as real).
    _, memory, mask = model.generate([prompt[:2]], max_length=3, return_memory=True)
    assert not np.asarray(mask).all()
    continued = generate(model, more, new, temperature=0, initial_memory=memory,
                         initial_memory_mask=mask)
    for backend in (SavedModelBackend(masked.version_dir), TFLiteBackend(runner)):
        np.testing.assert_array_equal(generate(backend, prompt, new, temperature=0),
                                      expected)
        np.testing.assert_array_equal(generate(
            backend, more, new, temperature=0, initial_memory=memory,
            initial_memory_mask=mask), continued)
    stateless = TFLiteBackend(tflite.TFLiteRunner(masked.paths["stateless"]))
    np.testing.assert_array_equal(
        generate(stateless, prompt, new, temperature=0, schedule="segment"),
        generate(model, prompt, new, temperature=0, schedule="segment",
                 segment_length=T))


@pytest.fixture(scope="module")
def server(masked):
    with serving_doubles.StandInServer(os.path.dirname(masked.version_dir)) as running:
        yield running


@pytest.mark.parametrize("kind", ["rest-inputs", "rest-instances", "grpc"])
def test_client_carries_the_mask(masked, server, kind):
    client = {
        "rest-inputs": lambda: TXLServingClient.rest(server.rest_url, "txl"),
        "rest-instances": lambda: TXLServingClient.rest(server.rest_url, "txl",
                                                        form="instances"),
        "grpc": lambda: TXLServingClient.grpc(server.grpc_target, "txl"),
    }[kind]()
    with client:
        client.reset(batch_size=B)
        np.testing.assert_array_equal(client.memory_mask, np.zeros((B, M), bool))
        for s, ref in enumerate(masked.reference):
            log_probs = client.step(segment(masked, s))
            np.testing.assert_allclose(log_probs, ref["log_probs"], atol=1e-5)
            np.testing.assert_array_equal(client.memory_mask, ref["memory_mask"])
        # generate, then generate_from_memory with the client's own memory.
        texts, memory = client.generate(["Hi", "Yes!"], 4)
        assert client.memory_mask.dtype == bool and not client.memory_mask.all()
        direct = server.predictor.predict(sig.GENERATE, serving.generate_request(
            ["Hi", "Yes!"], 4))
        np.testing.assert_array_equal(client.memory_mask, direct[sig.MEMORY_MASK])
        more, _ = client.generate([" a", "b"], 4, memory=memory)
        direct = server.predictor.predict(sig.GENERATE_FROM_MEMORY, {
            **serving.generate_request([" a", "b"], 4), sig.MEMORY: direct[sig.MEMORY],
            sig.MEMORY_MASK: direct[sig.MEMORY_MASK]})
        assert more == [t.decode() for t in direct[sig.TEXTS]]
        np.testing.assert_array_equal(client.memory_mask, direct[sig.MEMORY_MASK])
        # Another memory of this model needs its mask.
        with pytest.raises(ValueError, match="`memory_mask` is required with `memory`"):
            client.generate(["x", "y"], 2, memory=np.array(client.memory))
        with pytest.raises(ValueError, match="`memory_mask` must be a bool array"):
            client.generate(["x", "y"], 2, memory=np.array(client.memory),
                            memory_mask=np.ones((B, M), np.int32))
        # The server refuses a mask of another batch, naming it.
        with pytest.raises(ServingError, match="memory_mask"):
            client.transport.predict(sig.SERVING_DEFAULT, {
                sig.TOKEN_IDS: segment(masked, 0), sig.MEMORY: client.memory,
                sig.MEMORY_MASK: np.zeros((B + 1, M), bool)}, form="inputs")
