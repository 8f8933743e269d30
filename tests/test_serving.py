"""TF Serving client: REST (both forms) and gRPC against loopback stand-ins.

No `tensorflow_model_server` binary exists on these machines, so the
client's requests go to the test double `serving_doubles.StandInServer`
(127.0.0.1, free ports), which decodes them as TF Serving does and calls
the exported SavedModel. Every result is compared with the direct signature call and
with `call_with_memory`. The warm-up records are replayed against the
SavedModel and sent as-is through the gRPC stub.
"""

import json
import types
import urllib.request

import keras
import numpy as np
import pytest
import serving_doubles
import tensorflow as tf
from testing import chain_segments
from testing import tiny_config

import keras_txl
from keras_txl.export import saved_model
from keras_txl.export import serving
from keras_txl.export import signatures as sig
from keras_txl.export.serving_client import GrpcTransport
from keras_txl.export.serving_client import RestTransport
from keras_txl.export.serving_client import ServingError
from keras_txl.export.serving_client import TXLServingClient
from keras_txl.export.serving_client import decode_rest_response
from keras_txl.export.serving_client import encode_rest_request

B, T, SEGMENTS = 2, 4, 3
L, M, D, V = 2, 6, 8, 11


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    keras.utils.set_random_seed(0)
    tmp = tmp_path_factory.mktemp("serving")
    model = keras_txl.TransformerXLCausalLM(tiny_config(memory_length=M))
    assert model.memory_shape(B) == (B, L, M, D)
    version_dir = saved_model.export_saved_model(model, str(tmp / "models"))
    ids = np.random.default_rng(1).integers(0, V, (B, SEGMENTS * T)).astype(np.int32)
    server = serving_doubles.StandInServer(str(tmp / "models" / "txl")).start()
    # Direct signature calls: the numbers every transport must reproduce.
    signatures = server.predictor.signatures
    memory = tf.zeros((B, L, M, D))
    direct = []
    targets = np.roll(ids, -1, axis=1)
    for s in range(SEGMENTS):
        cut = slice(s * T, (s + 1) * T)
        step = {k: v.numpy() for k, v in signatures["serving_default"](
            token_ids=tf.constant(ids[:, cut]), memory=memory).items()}
        step["nll"] = signatures["score"](
            token_ids=tf.constant(ids[:, cut]), targets=tf.constant(targets[:, cut]),
            memory=memory)["nll"].numpy()
        step["next"] = signatures["next_token"](
            token_ids=tf.constant(ids[:, cut]), memory=memory)["log_probs"].numpy()
        direct.append(step)
        memory = tf.constant(step["memory"])
    keras_out = [out["log_probs"] for out in chain_segments(model, ids, T).outputs]
    yield types.SimpleNamespace(
        model=model, version_dir=version_dir, ids=ids, targets=targets,
        server=server, direct=direct, keras=keras_out,
    )
    server.stop()


def _clients(deployed):
    return {
        "rest-inputs": TXLServingClient.rest(deployed.server.rest_url, "txl"),
        "rest-instances": TXLServingClient.rest(
            deployed.server.rest_url, "txl", form="instances", version=1),
        "grpc": TXLServingClient.grpc(deployed.server.grpc_target, "txl"),
    }


@pytest.mark.parametrize("kind", ["rest-inputs", "rest-instances", "grpc"])
def test_client_carries_memory_and_matches_direct_call(deployed, kind):
    client = _clients(deployed)[kind]
    with client:
        memory = client.reset(batch_size=B)
        np.testing.assert_array_equal(memory, np.zeros((B, L, M, D)))
        for s in range(SEGMENTS):
            cut = slice(s * T, (s + 1) * T)
            log_probs = client.step(deployed.ids[:, cut])
            assert log_probs.dtype == np.float32 and log_probs.shape == (B, T, V)
            direct = deployed.direct[s]
            np.testing.assert_allclose(log_probs, direct["log_probs"], atol=1e-6, rtol=0)
            np.testing.assert_allclose(client.memory, direct["memory"], atol=1e-6, rtol=0)
            np.testing.assert_allclose(log_probs, deployed.keras[s], atol=1e-5, rtol=0)
        client.reset(batch_size=B)
        for s in range(SEGMENTS):
            cut = slice(s * T, (s + 1) * T)
            nll = client.score(deployed.ids[:, cut], deployed.targets[:, cut])
            np.testing.assert_allclose(nll, deployed.direct[s]["nll"], atol=1e-6, rtol=0)
        client.reset(batch_size=B)
        for s in range(SEGMENTS):
            cut = slice(s * T, (s + 1) * T)
            following = client.next_token(deployed.ids[:, cut])
            np.testing.assert_allclose(following, deployed.direct[s]["next"], atol=1e-6, rtol=0)


def test_rest_bodies_have_tf_serving_shapes(deployed):
    ids = deployed.ids[:, :T]
    memory = np.zeros((B, L, M, D), np.float32)
    columnar = encode_rest_request("score", {"token_ids": ids, "memory": memory})
    assert columnar["signature_name"] == "score"
    assert np.array_equal(columnar["inputs"]["token_ids"], ids)
    rows = encode_rest_request("serving_default", {"token_ids": ids, "memory": memory},
                               form="instances")
    assert len(rows["instances"]) == B
    assert np.asarray(rows["instances"][1]["token_ids"]).tolist() == ids[1].tolist()
    assert np.asarray(rows["instances"][0]["memory"]).shape == (L, M, D)
    # The server-side decoder gives back the same arrays for both forms.
    dtypes = {"token_ids": np.int32, "memory": np.float32}
    for body, form in ((json.loads(json.dumps(columnar)), "inputs"),
                       (json.loads(json.dumps(rows)), "instances")):
        body = dict(body, signature_name="serving_default")
        name, inputs, got_form = serving_doubles.decode_rest_request(body, dtypes)
        assert (name, got_form) == ("serving_default", form)
        assert inputs["token_ids"].dtype == np.int32
        np.testing.assert_array_equal(inputs["token_ids"], ids)
        np.testing.assert_array_equal(inputs["memory"], memory)
    # Responses: named outputs, and TF Serving's unnamed single output.
    outputs = {"nll": np.ones((B, T), np.float32), "memory": memory}
    for form in ("inputs", "instances"):
        body = json.loads(json.dumps(serving_doubles.encode_rest_response(outputs, form)))
        decoded = decode_rest_response(body, form)
        assert sorted(decoded) == ["memory", "nll"]
        np.testing.assert_array_equal(decoded["nll"], outputs["nll"])
    single = serving_doubles.encode_rest_response({"memory": memory}, "inputs")
    assert isinstance(single["outputs"], list)
    assert decode_rest_response(single, "inputs", ["memory"])["memory"].shape == memory.shape
    with pytest.raises(ValueError, match="same first"):
        encode_rest_request("initial_memory", {"batch_size": np.int32(2)}, form="instances")


def test_status_and_raw_http(deployed):
    status = RestTransport(deployed.server.rest_url, "txl").status()
    assert status["model_version_status"][0]["state"] == "AVAILABLE"
    assert status["model_version_status"][0]["version"] == "1"
    # A hand-written TF Serving request, as curl would send it.
    body = {"signature_name": "next_token",
            "inputs": {"token_ids": deployed.ids[:, :T].tolist(),
                       "memory": np.zeros((B, L, M, D)).tolist()}}
    request = urllib.request.Request(
        deployed.server.rest_url + "/v1/models/txl:predict",
        data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.loads(response.read())
    assert sorted(answer["outputs"]) == ["log_probs", "memory"]
    np.testing.assert_allclose(
        answer["outputs"]["log_probs"], deployed.direct[0]["next"], atol=1e-6)


def test_errors_come_back_as_serving_errors(deployed):
    url, target = deployed.server.rest_url, deployed.server.grpc_target
    rest, grpc_ = RestTransport(url, "txl"), GrpcTransport(target, "txl")
    good = {"token_ids": deployed.ids[:, :T], "memory": np.zeros((B, L, M, D), np.float32)}
    bad_memory = dict(good, memory=np.zeros((B, L, M - 1, D), np.float32))
    for transport in (rest, grpc_):
        with pytest.raises(ServingError, match="Shape of tensor memory"):
            transport.predict("serving_default", bad_memory)
        with pytest.raises(ServingError, match="vocabulary_size=11"):
            transport.predict("serving_default", dict(good, token_ids=good["token_ids"] + V))
        with pytest.raises(ServingError, match="not found"):
            transport.predict("generate", good)
        with pytest.raises(ServingError, match=r"missing \['memory'\]"):
            transport.predict("serving_default", {"token_ids": good["token_ids"]})
    with pytest.raises(ServingError, match="must be int32, received float32") as info:
        grpc_.predict("serving_default", dict(good, token_ids=good["token_ids"].astype(np.float32)))
    assert info.value.status == "INVALID_ARGUMENT"
    with pytest.raises(ServingError, match="non-integer") as info:
        rest.predict("serving_default", dict(good, token_ids=good["token_ids"] + 0.5))
    assert info.value.status == 400
    with pytest.raises(ServingError, match="Servable not found") as info:
        RestTransport(url, "other").predict("serving_default", good)
    assert info.value.status == 404
    with pytest.raises(ServingError, match="NOT_FOUND"):
        GrpcTransport(target, "txl", version=2).predict("serving_default", good)
    grpc_.close()
    client = TXLServingClient(rest)
    client.reset(batch_size=1)
    with pytest.raises(ValueError, match="call reset"):
        client.step(deployed.ids[:, :T])
    with pytest.raises(ValueError, match="2-D integer array"):
        client.step(deployed.ids[0, :T].astype(np.float32))
    # The server still answers correctly afterwards.
    client.reset(batch_size=B)
    np.testing.assert_allclose(
        client.step(deployed.ids[:, :T]), deployed.direct[0]["log_probs"], atol=1e-6)


def test_warmup_records_replay(deployed):
    path = f"{deployed.version_dir}/assets.extra/{serving.WARMUP_FILE}"
    requests = serving.read_warmup_file(path)
    assert [r.model_spec.signature_name for r in requests] == list(sig.SAVED_MODEL_SIGNATURES)
    with pytest.raises(ValueError, match=r"is not a warm-up file: the version folder's is "
                                         r".*assets.extra/tf_serving_warmup_requests"):
        serving.read_warmup_file(deployed.version_dir)  # was TF's FailedPreconditionError
    assert {r.model_spec.name for r in requests} == {"txl"}
    replayed = serving_doubles.replay_warmup(deployed.version_dir, deployed.server.predictor)
    assert [name for name, _ in replayed] == list(sig.SAVED_MODEL_SIGNATURES)
    table = sig.signature_table(deployed.model.txl_config)
    for (name, outputs), request in zip(replayed, requests):
        assert sorted(outputs) == sorted(table[name]["outputs"])
        for key, value in outputs.items():
            assert np.all(np.isfinite(value))
            want = table[name]["outputs"][key][1]
            assert len(value.shape) == len(want)
            assert all(w is None or w == g for w, g in zip(want, value.shape))
        inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
        if name == "serving_default":
            ref = deployed.model.call_with_memory(inputs["token_ids"], inputs["memory"])
            np.testing.assert_allclose(outputs["log_probs"], ref["log_probs"], atol=1e-5)
    # The very same protos through a real PredictionServiceStub.
    grpc_ = GrpcTransport(deployed.server.grpc_target, "txl")
    for (name, outputs), request in zip(replayed, requests):
        response = grpc_.stub.Predict(request, timeout=30)
        assert response.model_spec.signature_name == name
        assert response.model_spec.version.value == 1
        for key, value in outputs.items():
            np.testing.assert_array_equal(tf.make_ndarray(response.outputs[key]), value)
    grpc_.close()


def test_docker_command_serves_the_given_folder(tmp_path, monkeypatch):
    # Read back the way a shell reads it: the folder is bound (made absolute)
    # at the model name TF Serving serves, whatever the folder is called.
    import shlex

    monkeypatch.chdir(tmp_path)
    for folder, name in (("exports/txl", "txl"), ("my exports/lm's", "lm")):
        argv = shlex.split(serving.docker_run_command(folder, model_name=name))
        assert argv[:2] == ["docker", "run"] and argv[-1] == "tensorflow/serving"
        assert {"8501:8501", "8500:8500"} <= {argv[i + 1] for i, a in enumerate(argv) if a == "-p"}
        mount = dict(part.split("=", 1) for part in argv[argv.index("--mount") + 1].split(","))
        assert mount == {"type": "bind", "source": str(tmp_path / folder),
                         "target": f"/models/{name}"}
        assert argv[argv.index("-e") + 1] == f"MODEL_NAME={name}"


# === Text in, text out: the `generate` signatures over REST and gRPC ===

# Non-ASCII prompts: the strings must round-trip as JSON strings (REST) and
# DT_STRING tensors (gRPC).
TEXT_PROMPTS = ["Héllo", "naïve café ☕", "Transformer-XL"]


@pytest.fixture(scope="module")
def deployed_text(tmp_path_factory):
    from testing import byte_causal_lm

    keras.utils.set_random_seed(0)
    tmp = tmp_path_factory.mktemp("serving_text")
    saved_model.export_saved_model(byte_causal_lm(), str(tmp / "models"))
    server = serving_doubles.StandInServer(str(tmp / "models" / "txl")).start()
    yield server
    server.stop()


def _direct_generate(server, name, prompts, max_new_tokens, memory=None, **options):
    inputs = serving.generate_request(prompts, max_new_tokens, **options)
    if memory is not None:
        inputs[sig.MEMORY] = memory
    return server.predictor.predict(name, inputs)


@pytest.mark.parametrize("kind", ["rest", "grpc"])
def test_client_generate_matches_the_signature_and_continues(deployed_text, kind):
    server = deployed_text
    client = (TXLServingClient.rest(server.rest_url, "txl") if kind == "rest"
              else TXLServingClient.grpc(server.grpc_target, "txl"))
    with client:
        texts, memory = client.generate(TEXT_PROMPTS, 6)
        direct = _direct_generate(server, sig.GENERATE, TEXT_PROMPTS, 6)
        assert texts == [t.decode("utf-8") for t in direct[sig.TEXTS]]
        assert all(isinstance(t, str) for t in texts)
        np.testing.assert_allclose(memory, direct[sig.MEMORY], atol=1e-6, rtol=0)
        assert client.memory is memory
        # The exact new ids, which the texts are decoded from.
        assert [ids.tolist() for ids in client.token_ids] == [
            row[:n].tolist() for row, n in zip(direct[sig.TOKEN_IDS], direct[sig.LENGTHS])]
        # Continue from the memory: generate_from_memory.
        more, memory = client.generate(["!", " é", "."], 4, memory=memory,
                                       temperature=0.9, top_k=20, seed=7)
        direct = _direct_generate(server, sig.GENERATE_FROM_MEMORY, ["!", " é", "."],
                                  4, memory=direct[sig.MEMORY], temperature=0.9,
                                  top_k=20, seed=7)
        assert more == [t.decode("utf-8") for t in direct[sig.TEXTS]]
        np.testing.assert_allclose(memory, direct[sig.MEMORY], atol=1e-6, rtol=0)
        # The server's own checks come back as ServingErrors naming the input.
        with pytest.raises(ServingError, match="max_new_tokens"):
            client.generate(["a"], sig.MAX_NEW_TOKENS_CAP + 1)
        with pytest.raises(ServingError, match="same batch size"):
            client.transport.predict(sig.GENERATE_FROM_MEMORY, {
                **serving.generate_request(["a"], 2),
                sig.MEMORY: np.zeros((2, *memory.shape[1:]), np.float32)})


def test_client_generate_checks_its_arguments_before_sending(deployed_text):
    client = TXLServingClient.rest(deployed_text.rest_url, "txl")
    for kwargs, message in [
        ({"prompts": "one string"}, "list of strings"),
        ({"prompts": []}, "non-empty list"),
        ({"prompts": ["a", ""]}, "non-empty strings"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"seed": 1.5}, "seed"),
        ({"memory": np.zeros((2, 2, 48, 32), np.float32)}, "batch 1"),
        # Finite as float64, Inf as the float32 sent: was sent anyway.
        ({"memory": np.full((1, 2, 48, 32), 1e39)},
         r"`memory` contains NaN or Inf values \(as float32\)"),
        # An undecodable shell argument (surrogateescape) is not text.
        ({"prompts": ["ok", "bad \udcff"]}, r"`prompts`\[1\] is not valid Unicode"),
    ]:
        arguments = {"prompts": ["a"], "max_new_tokens": 2, **kwargs}
        with pytest.raises(ValueError, match=message):
            client.generate(**arguments)
    assert client.memory is None


@pytest.mark.parametrize("kind", ["rest", "grpc"])
def test_txl_serve_client_generate_prints_one_json_line_per_prompt(
        deployed_text, kind, capsys):
    from keras_txl.cli import main

    server = ["--rest", deployed_text.rest_url] if kind == "rest" else [
        "--grpc", deployed_text.grpc_target]
    code = main(["serve-client", "generate", *server, "--prompt", TEXT_PROMPTS[0],
                 "--prompt", TEXT_PROMPTS[1], "--max-new-tokens", "5"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    direct = _direct_generate(deployed_text, sig.GENERATE, TEXT_PROMPTS[:2], 5)
    assert [json.loads(line) for line in lines] == [
        {"prompt": p, "text": t.decode("utf-8"), "token_ids": ids[:n].tolist()}
        for p, t, ids, n in zip(TEXT_PROMPTS[:2], direct[sig.TEXTS],
                                direct[sig.TOKEN_IDS], direct[sig.LENGTHS])
    ]
    code = main(["serve-client", "generate", *server, "--prompt", "a",
                 "--max-new-tokens", str(sig.MAX_NEW_TOKENS_CAP + 1)])
    assert code == 2
    assert "max_new_tokens" in capsys.readouterr().err
