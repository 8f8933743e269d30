"""The REST serving client against hostile servers (issue 18, item 5): every
failure is a ServingError with its cause, the timeout is a deadline for the
whole call, answers are checked before they replace the client's memory, and
connection errors can be retried with back-off."""

import http.client
import http.server
import json
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from testing import REPO

from keras_txl.export.serving_client import RestTransport
from keras_txl.export.serving_client import ServingError
from keras_txl.export.serving_client import TXLServingClient

L, M, D, V = 1, 2, 2, 3


class HostileServer:
    """A loopback HTTP server whose answers are set per test (`mode`)."""

    def __init__(self):
        self.mode = "good"
        self.requests = 0
        self.fail_first = 0  # close the first N connections without answering
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status, body):
                data = body if isinstance(body, bytes) else body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):  # noqa: N802 - http.server naming
                owner.requests += 1
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if owner.requests <= owner.fail_first:
                    self.close_connection = True
                    return  # no answer: the client sees the connection closed
                owner.answer(self, request)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, handler, request):
        inputs = request["inputs"]
        if request["signature_name"] == "initial_memory":
            batch = inputs["batch_size"]
            handler._send(200, json.dumps({"outputs": np.zeros((batch, L, M, D)).tolist()}))
            return
        ids = np.asarray(inputs["token_ids"])
        memory = np.asarray(inputs["memory"]) + 1.0
        outputs = {"log_probs": np.full((*ids.shape, V), -1.0).tolist(),
                   "memory": memory.tolist()}
        mode = self.mode
        if mode == "good":
            handler._send(200, json.dumps({"outputs": outputs}))
        elif mode == "invalid_json":
            handler._send(200, '{"outputs": [1, 2')
        elif mode == "empty":
            handler._send(200, "")
        elif mode == "deep_json":  # nested past Python's recursion limit
            handler._send(200, '{"outputs": ' + "[" * 100_000 + "]" * 100_000 + "}")
        elif mode == "list":
            handler._send(200, "[1, 2, 3]")
        elif mode == "500_list":
            handler._send(500, "[1, 2, 3]")
        elif mode == "no_memory":
            handler._send(200, json.dumps({"outputs": {"log_probs": outputs["log_probs"]}}))
        elif mode == "ragged":
            handler._send(200, json.dumps({"outputs": {"log_probs": [[1], [1, 2]],
                                                       "memory": outputs["memory"]}}))
        elif mode == "string_log_probs":
            outputs["log_probs"] = np.full((*ids.shape, V), "x").tolist()
            handler._send(200, json.dumps({"outputs": outputs}))
        elif mode == "short_log_probs":  # one position fewer than sent
            outputs["log_probs"] = np.full((ids.shape[0], ids.shape[1] - 1, V), -1.0).tolist()
            handler._send(200, json.dumps({"outputs": outputs}))
        elif mode == "other_vocabulary":  # V changed between two answers
            outputs["log_probs"] = np.full((*ids.shape, V + 1), -1.0).tolist()
            handler._send(200, json.dumps({"outputs": outputs}))
        elif mode == "bad_memory_shape":
            outputs["memory"] = np.zeros((ids.shape[0], L, M + 1, D)).tolist()
            handler._send(200, json.dumps({"outputs": outputs}))
        elif mode == "nan_memory":
            handler._send(200, json.dumps({"outputs": outputs}).replace("1.0", "NaN", 1))
        elif mode == "close":
            handler.close_connection = True
        elif mode == "drip":
            handler.send_response(200)
            handler.send_header("Content-Length", "100")
            handler.end_headers()
            for _ in range(100):  # one byte every 0.5 s: 50 s in all
                try:
                    handler.wfile.write(b" ")
                    handler.wfile.flush()
                except OSError:  # the client gave up: stop
                    return
                time.sleep(0.5)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server():
    with HostileServer() as server:
        yield server


BAD_ANSWERS = {
    "invalid_json": (r"HTTP 200 .* a body that is not JSON", json.JSONDecodeError),
    "empty": (r"HTTP 200 .* an empty body", None),
    # Was Python's RecursionError, not a ServingError.
    "deep_json": (r"HTTP 200 .* a body that is not JSON", RecursionError),
    "list": (r"expected a JSON object, received a JSON list", None),
    "500_list": (r"HTTP 500: \[1, 2, 3\]", None),
    "no_memory": (r"has no `memory` output .* memory is unchanged", None),
    "ragged": (r"`log_probs` is not a rectangular numeric array", ValueError),
    "bad_memory_shape": (r"`memory` of shape \(2, 1, 3, 2\) .* expected float32 of "
                         r"shape \(2, 1, 2, 2\); the client's memory is unchanged", None),
    "nan_memory": (r"NaN", None),
    "string_log_probs": (r"`log_probs` of shape \(2, 3, 3\) and dtype object, expected "
                         r"float values of shape \(2, 3, 3\)", None),
    "short_log_probs": (r"`log_probs` of shape \(2, 2, 3\) .* expected float values "
                        r"of shape \(2, 3, 3\) without NaN; the client's memory is "
                        r"unchanged", None),
    "other_vocabulary": (r"`log_probs` of shape \(2, 3, 4\) .* shape \(2, 3, 3\)", None),
    "close": (r"Cannot reach .*RemoteDisconnected", http.client.RemoteDisconnected),
}


@pytest.mark.parametrize("mode", sorted(BAD_ANSWERS))
def test_every_bad_answer_is_a_serving_error_and_keeps_the_memory(server, mode):
    message, cause = BAD_ANSWERS[mode]
    client = TXLServingClient.rest(server.url, "txl", timeout=10)
    ids = np.zeros((2, 3), np.int32)
    np.testing.assert_array_equal(client.step(ids), np.full((2, 3, V), -1.0))
    before = client.memory.copy()
    np.testing.assert_array_equal(before, np.ones((2, L, M, D)))
    server.mode = mode
    with pytest.raises(ServingError, match=message) as info:
        client.step(ids)
    if cause is not None:
        assert isinstance(info.value.__cause__, cause), repr(info.value.__cause__)
    if mode in ("500_list", "close"):
        assert info.value.status == (500 if mode == "500_list" else None)
    np.testing.assert_array_equal(client.memory, before)
    server.mode = "good"  # the client goes on from the memory it kept
    client.step(ids)
    np.testing.assert_array_equal(client.memory, before + 1)


def test_the_timeout_is_a_deadline_for_the_whole_call(server):
    server.mode = "drip"
    client = TXLServingClient.rest(server.url, "txl", timeout=2)
    client.reset(batch_size=1)
    start = time.monotonic()
    with pytest.raises(ServingError, match=r"within timeout=2 s \(a deadline") as info:
        client.step(np.zeros((1, 2), np.int32))
    elapsed = time.monotonic() - start
    assert 1.9 < elapsed < 3.5, elapsed
    assert isinstance(info.value.__cause__, TimeoutError)
    np.testing.assert_array_equal(client.memory, np.zeros((1, L, M, D)))


def test_connection_errors_are_retried_with_backoff_when_asked(server):
    server.fail_first = 2
    start = time.monotonic()
    client = TXLServingClient.rest(server.url, "txl", retries=2, backoff=0.2)
    client.reset(batch_size=1)
    assert server.requests == 3
    assert time.monotonic() - start >= 0.2 + 0.4  # two pauses, doubled
    server.requests, server.fail_first = 0, 1
    with pytest.raises(ServingError, match="Cannot reach") as info:
        TXLServingClient.rest(server.url, "txl").reset(batch_size=1)  # retries=0
    assert isinstance(info.value.__cause__, ConnectionError)
    assert server.requests == 1
    # Nobody listening: refused, retried, then reported with the count.
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(ServingError, match=r"after 3 attempts: ConnectionRefusedError"):
        RestTransport(f"http://127.0.0.1:{port}", retries=2, backoff=0.01).status()


def test_transport_and_reset_arguments_are_checked():
    for kwargs, message in (
        ({"timeout": 0}, "`timeout` must be a finite number > 0"),
        ({"timeout": float("nan")}, "`timeout` must be"),
        # Python's timers overflowed (REST: OverflowError traceback) and gRPC's
        # deadline failed every call at once.
        ({"timeout": 1e10}, r"`timeout` must be a finite number > 0 and <= 1e\+09"),
        ({"retries": -1}, "`retries` must be an integer >= 0"),
        ({"retries": True}, "`retries` must be an integer >= 0"),
        ({"backoff": -1.0}, "`backoff` must be a finite number >= 0"),
    ):
        with pytest.raises(ValueError, match=message):
            RestTransport("http://127.0.0.1:1", **kwargs)
    with pytest.raises(ValueError, match="`url` must be an http"):
        RestTransport("localhost:8501")
    client = TXLServingClient.rest("http://127.0.0.1:1")
    for bad in (0, True, 1.5, "2"):
        with pytest.raises(ValueError, match="`batch_size` must be a positive integer"):
            client.reset(batch_size=bad)


def test_the_rest_client_needs_no_tensorflow():
    code = ("import sys, keras_txl.export.serving_client as c; "
            "c.RestTransport('http://127.0.0.1:1'); "
            "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                         timeout=60)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]


def test_ids_outside_int32_are_refused_not_wrapped():
    # astype(int32) would send 2**32 + 3 as 3, an id the server cannot refuse.
    class Recording:
        sent = []

        def predict(self, signature_name, inputs, output_names=None, form=None):
            self.sent.append(inputs)
            raise AssertionError("nothing may be sent")

    client = TXLServingClient(Recording())
    client.memory = np.zeros((1, L, M, D), np.float32)
    for ids in (np.array([[2**32 + 3]], np.int64), np.array([[2**63 + 1]], np.uint64),
                np.array([[-1]], np.int64)):
        with pytest.raises(ValueError, match=r"`token_ids` must hold token ids in "
                                             r"\[0, vocabulary_size\), received values"):
            client.step(ids)
    assert Recording.sent == []


def test_generate_and_reset_numbers_must_fit_their_wire_types():
    class Refusing:
        def predict(self, *args, **kwargs):
            raise AssertionError("nothing may be sent")

    client = TXLServingClient(Refusing())
    for kwargs, message in (
        ({"top_k": 2**40}, r"`top_k` must be at most 2147483647 \(int32\)"),
        ({"max_new_tokens": 2**40}, r"`max_new_tokens` must be at most 2147483647"),
        ({"seed": 2**64}, r"`seed` must be an integer in \[0, 2\*\*63 - 1 = 9223372036854775807\]"),
        ({"temperature": 1e300}, r"`temperature` must fit in float32"),
    ):
        args = {"max_new_tokens": 4, **kwargs}
        with pytest.raises(ValueError, match=message):
            client.generate(["a prompt"], **args)
    with pytest.raises(ValueError, match=r"`batch_size` must be at most 2147483647"):
        client.reset(batch_size=2**40)


def test_generate_refuses_a_negative_seed_before_sending():
    # The signature refuses it (`seed` must be in [0, 2**63 - 1]), as
    # generate_ids and SavedModelBackend do before any request; the client
    # sent seed=-1 and the server's error came back as a ServingError.
    class Refusing:
        def predict(self, *args, **kwargs):
            raise AssertionError("nothing may be sent")

    client = TXLServingClient(Refusing())
    for seed in (-1, -(2**63), np.int64(-5)):
        with pytest.raises(ValueError, match=r"`seed` must be an integer in \[0, 2\*\*63 - 1 = "
                                             r"9223372036854775807\]\. Received: seed="):
            client.generate(["a prompt"], 4, temperature=0.8, seed=seed)


def test_generate_refuses_a_top_p_that_is_0_in_float32_before_sending():
    # np.float32(1e-300) is 0.0: the client sent top_p=0 and the server's
    # "`top_p` must be in (0, 1]" came back as a ServingError, for a value
    # the client had just accepted as in (0, 1].
    class Refusing:
        def predict(self, *args, **kwargs):
            raise AssertionError("nothing may be sent")

    client = TXLServingClient(Refusing())
    with pytest.raises(ValueError, match=r"`top_p` must be in \(0, 1\] \(1 keeps every token\) "
                                         r"and at least 1\.4013e-45, the smallest float32 above 0\. "
                                         r"Received: top_p=1e-300"):
        client.generate(["a prompt"], 4, temperature=0.8, top_p=1e-300)


def test_an_empty_memory_over_rest_is_said_not_misread():
    # A model exported with memory_length=0 answers [[[], []]] over REST: the
    # (B, L, 0, D) memory's last dimension is lost in JSON, and the client's
    # shape check said only "shape (1, 2, 0)".
    from keras_txl.export.serving_client import decode_rest_response

    class EmptyMemory(RestTransport):
        def predict(self, signature_name, inputs, output_names=None, form=None):
            return decode_rest_response({"outputs": {"memory": [[[], []]]}}, "inputs")

    client = TXLServingClient(EmptyMemory("http://127.0.0.1:1"))
    with pytest.raises(ServingError, match="exported with memory_length=0.*Use gRPC"):
        client.reset(batch_size=1)
    assert client.memory is None


def test_a_grpc_target_without_a_port_and_a_model_name_that_is_no_name_are_refused():
    # `--grpc localhost` connected to port 443 and failed as UNAVAILABLE after
    # the whole timeout; `--model-name a/b` went into the REST URL's path.
    from keras_txl.export.serving_client import GrpcTransport

    for target in ("localhost", "127.0.0.1", "localhost:", 8500):
        with pytest.raises(ValueError, match=r"`target` must be HOST:PORT, such as "
                           r"'localhost:8500' .*Received: target="):
            GrpcTransport(target)
    GrpcTransport("127.0.0.1:1", timeout=1).close()
    for name in ("a/b", "a?b", "", " txl", "my model", None):
        with pytest.raises(ValueError, match=r"`model_name` must be the served model's name"):
            RestTransport("http://127.0.0.1:1", name)
        with pytest.raises(ValueError, match=r"`model_name` must be the served model's name"):
            GrpcTransport("127.0.0.1:1", name)
    assert RestTransport("http://127.0.0.1:1", "txl-v2.small_1").model_name == "txl-v2.small_1"
