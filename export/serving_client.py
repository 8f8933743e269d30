"""Client for a TF Serving deployment of an exported keras-txl model.

TF Serving is stateless, so the Transformer-XL memory travels with every
request: `TXLServingClient` sends `token_ids` with the memory returned by
the previous call and keeps the new one.

```python
client = TXLServingClient.rest("http://localhost:8501", model_name="txl")
client.reset(batch_size=1)                 # memory = initial_memory(1)
for segment in segments:                   # each (1, T) ints
    log_probs = client.step(segment)       # (1, T, V); memory carried
client = TXLServingClient.grpc("localhost:8500", model_name="txl")
texts, memory = client.generate(["Once upon"], max_new_tokens=50)
texts, memory = client.generate([" and"], 50, memory=memory)   # continues
```

A model exported with `empty_memory="masked"` carries the memory's
validity, `memory_mask` (B, M) bool, beside every memory (its
`initial_memory` returns one): the client learns that from the server's
answers and carries `client.memory_mask` with `client.memory`.

`generate` calls the text-level signatures (`generate`, or
`generate_from_memory` with a memory), which SavedModels of models with a
preprocessor have: strings travel as JSON strings (REST) or DT_STRING
tensors (gRPC), the whole continuation comes back in one answer.

Transports:
- `RestTransport`: `POST /v1/models/<name>[/versions/<v>]:predict` with the
  columnar body `{"signature_name", "inputs": {...}}` (form="inputs") or the
  row body `{"signature_name", "instances": [{...}, ...]}`
  (form="instances"; possible because the memory is batch-first). Uses the
  standard library only: no TensorFlow import.
- `GrpcTransport`: `tensorflow_serving.apis` `PredictionServiceStub.Predict`
  (imports TensorFlow for the `TensorProto` helpers).

The memory of a real model is large (B * L * M * D float32 each way per
call): prefer gRPC, whose binary tensors are ~4x smaller than JSON text.
"""

from __future__ import annotations

import http.client
import json
import math
import numbers
import socket
import threading
import time
import urllib.parse

import numpy as np

from keras_txl import checks
from keras_txl.export.signatures import BATCH_SIZE
from keras_txl.export.signatures import GENERATE
from keras_txl.export.signatures import GENERATE_FROM_MEMORY
from keras_txl.export.signatures import INITIAL_MEMORY
from keras_txl.export.signatures import LENGTHS
from keras_txl.export.signatures import LOG_PROBS
from keras_txl.export.signatures import MAX_NEW_TOKENS
from keras_txl.export.signatures import MEMORY
from keras_txl.export.signatures import MEMORY_MASK
from keras_txl.export.signatures import NEXT_TOKEN
from keras_txl.export.signatures import NLL
from keras_txl.export.signatures import PROMPTS
from keras_txl.export.signatures import SCORE
from keras_txl.export.signatures import SEED
from keras_txl.export.signatures import SERVING_DEFAULT
from keras_txl.export.signatures import TARGETS
from keras_txl.export.signatures import TEMPERATURE
from keras_txl.export.signatures import TEXTS
from keras_txl.export.signatures import TOKEN_IDS
from keras_txl.export.signatures import TOP_K
from keras_txl.export.signatures import TOP_P


def serving_apis(module):
    """`tensorflow_serving.apis.<module>`, or an ImportError saying how to install it.

    tensorflow-serving-api is installed `--no-deps` beside tensorflow-cpu
    (it names the CUDA `tensorflow` wheel as a dependency), so a
    `pip install 'keras-txl[cpu]'` does not bring it.
    """
    import importlib

    try:
        return importlib.import_module(f"tensorflow_serving.apis.{module}")
    except ImportError as error:
        raise ImportError(
            "TF Serving requests and warm-up records need tensorflow-serving-api "
            "2.21. With the tensorflow-cpu wheel install it without its "
            "dependencies (they name the CUDA `tensorflow` wheel): "
            "`pip install --no-deps 'tensorflow-serving-api>=2.21,<2.22'`. See "
            "the README, 'Installing'."
        ) from error

REST_FORMS = ("inputs", "instances")
# Matches keras_txl.export.serving.GRPC_OPTIONS (not imported: it pulls in TF).
_GRPC_MAX_MESSAGE_BYTES = 1 << 30
# Errors that mean "the request did not get through": retried when asked.
_CONNECTION_ERRORS = (ConnectionError, http.client.RemoteDisconnected,
                      socket.gaierror)


class ServingError(RuntimeError):
    """The server rejected, failed or garbled a request, or could not be reached.

    `status` is the HTTP status or the gRPC status code name (None when no
    answer came); the underlying exception, if any, is `__cause__`.
    """

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


def _as_numpy(value, name="output"):
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as e:  # ragged lists, odd objects
        raise ServingError(
            f"The server's `{name}` is not a rectangular numeric array: {e}"
        ) from e
    if array.dtype.kind in "USO" and array.size and all(
        isinstance(x, (str, bytes)) for x in array.flat
    ):
        # Strings: JSON strings (REST) or DT_STRING bytes (gRPC), as str.
        return np.vectorize(
            lambda x: x.decode("utf-8", errors="replace")
            if isinstance(x, bytes) else x, otypes=[object],
        )(array)
    if array.dtype.kind == "f":
        return array.astype(np.float32)
    if array.dtype.kind not in "iub":
        raise ServingError(
            f"The server's `{name}` is not numeric (dtype {array.dtype})."
        )
    return array


def _text(array):
    """An array of str/bytes as an object array of str (JSON strings)."""
    return np.vectorize(
        lambda x: x.decode("utf-8") if isinstance(x, bytes) else str(x),
        otypes=[object],
    )(array)


def _short(text, limit=500):
    text = str(text)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


# --- REST ---------------------------------------------------------------------


def encode_rest_request(signature_name: str, inputs: dict, form: str = "inputs") -> dict:
    """The JSON body of a TF Serving `:predict` request.

    Args:
        signature_name: str.
        inputs: `{input: array-like}`.
        form: "inputs" (columnar) or "instances" (row: one object per batch
            element; every input needs the batch as its first dimension).
    """
    if form not in REST_FORMS:
        raise ValueError(f"`form` must be one of {REST_FORMS}, received {form!r}.")
    arrays = {k: np.asarray(v) for k, v in inputs.items()}
    arrays = {
        k: (_text(v) if v.dtype.kind in "OSU" else v) for k, v in arrays.items()
    }
    if form == "inputs":
        return {
            "signature_name": signature_name,
            "inputs": {k: v.tolist() for k, v in arrays.items()},
        }
    sizes = {v.shape[0] if v.ndim else None for v in arrays.values()}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(
            "The row form needs every input to have the same first (batch) "
            f"dimension; received shapes { {k: v.shape for k, v in arrays.items()} }."
        )
    (batch,) = sizes
    return {
        "signature_name": signature_name,
        "instances": [
            {k: v[i].tolist() for k, v in arrays.items()} for i in range(batch)
        ],
    }


def decode_rest_response(body, form: str, output_names=None) -> dict:
    """A `:predict` JSON response -> `{output: ndarray}` (floats as float32).

    TF Serving drops the output name when a signature has one output; pass
    `output_names` to name it.

    Raises:
        ServingError: an error answer, or a body that is not TF Serving's
            response shape.
    """
    if not isinstance(body, dict):
        raise ServingError(
            f"The server answered a JSON {type(body).__name__}, expected an "
            f"object: {_short(json.dumps(body))}"
        )
    if "error" in body:
        raise ServingError(_short(body["error"]))
    key = "outputs" if form == "inputs" else "predictions"
    if key not in body:
        raise ServingError(
            f"The server's answer has no {key!r} (keys {sorted(body)[:10]}): "
            "not a TF Serving :predict response."
        )
    if form == "inputs":
        outputs = body["outputs"]
        if not isinstance(outputs, dict):
            outputs = {(output_names or ["outputs"])[0]: outputs}
        return {k: _as_numpy(v, k) for k, v in outputs.items()}
    rows = body["predictions"]
    if not isinstance(rows, list):
        raise ServingError(
            f"The server's 'predictions' is a {type(rows).__name__}, expected "
            "a list of rows."
        )
    if rows and all(isinstance(r, dict) for r in rows):
        names = list(rows[0])
        if any(sorted(r) != sorted(names) for r in rows):
            raise ServingError("The server's rows do not all have the same outputs.")
        return {k: _as_numpy([r[k] for r in rows], k) for k in names}
    name = (output_names or ["predictions"])[0]
    return {name: _as_numpy(rows, name)}


_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1


class RestTransport:
    """TF Serving's REST API (port 8501 by default).

    Every failure is a `ServingError` with the cause attached: no answer,
    a closed connection, an HTTP error, a body that is not JSON or not TF
    Serving's response shape, or the deadline.

    Args:
        url: str. Server root, e.g. "http://localhost:8501".
        model_name: str.
        version: int or None (latest).
        form: "inputs" or "instances".
        timeout: float. Seconds for the whole call (connecting, sending,
            waiting and reading the answer, and any retries): a deadline,
            not a per-read timeout, so a server that drips bytes cannot
            hold a call longer.
        retries: int >= 0. Further attempts after a connection error (no
            answer: refused, reset, closed); HTTP errors are not retried.
        backoff: float. Seconds before the first retry, doubled after each.
        max_response_bytes: int. Larger answers are refused.
    """

    def __init__(self, url="http://localhost:8501", model_name="txl", *,
                 version=None, form="inputs", timeout=60.0, retries=0,
                 backoff=0.5, max_response_bytes=_GRPC_MAX_MESSAGE_BYTES):
        if form not in REST_FORMS:
            raise ValueError(f"`form` must be one of {REST_FORMS}, received {form!r}.")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                "`url` must be an http:// or https:// server root such as "
                f"'http://localhost:8501', received {url!r}."
            )
        _check_number("timeout", timeout, positive=True, most=MAX_TIMEOUT_SECONDS)
        _check_number("backoff", backoff)
        checks.positive_int("max_response_bytes", max_response_bytes)
        if (isinstance(retries, bool) or not isinstance(retries, numbers.Integral)
                or retries < 0):
            raise ValueError(
                f"`retries` must be an integer >= 0. Received: retries={retries!r}."
            )
        _check_model_name(model_name)
        self.url = url.rstrip("/")
        self.model_name = model_name
        self.version = version
        self.form = form
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.max_response_bytes = int(max_response_bytes)

    @property
    def model_url(self):
        url = f"{self.url}/v1/models/{self.model_name}"
        if self.version is not None:
            url += f"/versions/{int(self.version)}"
        return url

    def _attempt(self, url, data, deadline):
        """One HTTP exchange -> (status, body bytes); raises on no answer."""
        parts = urllib.parse.urlsplit(url)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("deadline reached before sending")
        connection_class = (http.client.HTTPSConnection
                            if parts.scheme == "https" else http.client.HTTPConnection)
        connection = connection_class(parts.hostname, parts.port, timeout=remaining)
        expired = threading.Event()
        sockets = []

        def expire():
            # The socket timeout bounds each read, not the call: at the
            # deadline, shut the socket down so a blocked read returns.
            # (HTTPConnection drops its `sock` once the answer says the
            # connection will close, so the socket is kept here.)
            expired.set()
            for sock in sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        timer = threading.Timer(remaining, expire)
        timer.daemon = True
        timer.start()
        try:
            connection.connect()  # bounded by the socket timeout (remaining)
            sockets.append(connection.sock)
            if expired.is_set():
                expire()
            path = parts.path + (f"?{parts.query}" if parts.query else "")
            connection.request(
                "GET" if data is None else "POST", path or "/", body=data,
                headers={"Content-Type": "application/json"},
            )
            response = connection.getresponse()
            payload = response.read(self.max_response_bytes + 1)
            status = response.status
        except (OSError, http.client.HTTPException) as e:
            if expired.is_set():
                raise TimeoutError("deadline reached") from e
            raise
        finally:
            timer.cancel()
            connection.close()
        if expired.is_set():
            raise TimeoutError("deadline reached")
        return status, payload

    def _request(self, url, body=None):
        data = None if body is None else json.dumps(body).encode()
        deadline = time.monotonic() + self.timeout
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                status, payload = self._attempt(url, data, deadline)
                break
            except TimeoutError as e:
                raise ServingError(
                    f"No complete answer from {url} within timeout="
                    f"{self.timeout:g} s (a deadline for the whole call)."
                ) from e
            except (OSError, http.client.HTTPException) as e:
                retry = (isinstance(e, _CONNECTION_ERRORS)
                         and attempt < self.retries
                         and time.monotonic() + delay < deadline)
                if not retry:
                    tries = f" after {attempt + 1} attempts" if attempt else ""
                    raise ServingError(
                        f"Cannot reach {url}{tries}: {type(e).__name__}: {e}"
                    ) from e
                time.sleep(delay)
                delay *= 2
        if len(payload) > self.max_response_bytes:
            raise ServingError(
                f"The answer from {url} is larger than max_response_bytes="
                f"{self.max_response_bytes}.", status=status,
            )
        text = payload.decode("utf-8", errors="replace")
        try:
            parsed = json.loads(text) if text.strip() else None
            error = None
        except (ValueError, RecursionError) as e:
            # RecursionError: arrays nested past Python's recursion limit
            # (no TF Serving answer is), which escaped as such.
            parsed, error = None, e
        if status >= 400:
            message = text.strip() or "(empty body)"
            if isinstance(parsed, dict) and "error" in parsed:
                message = parsed["error"]
            raise ServingError(f"HTTP {status}: {_short(message)}", status=status) from error
        if parsed is None:
            raise ServingError(
                f"HTTP {status} from {url} with "
                + (f"a body that is not JSON: {_short(text)!r}" if error else "an empty body"),
                status=status,
            ) from error
        if not isinstance(parsed, dict):
            raise ServingError(
                f"HTTP {status} from {url}: expected a JSON object, received a "
                f"JSON {type(parsed).__name__}: {_short(text)}", status=status,
            )
        return parsed

    def status(self) -> dict:
        """`GET /v1/models/<name>`: the model version status."""
        return self._request(self.model_url)

    def predict(self, signature_name, inputs, output_names=None, form=None):
        form = form or self.form
        body = encode_rest_request(signature_name, inputs, form)
        response = self._request(self.model_url + ":predict", body)
        return decode_rest_response(response, form, output_names)

    def close(self):
        pass


# The longest wait a timeout may ask for: Python's locks and sockets refuse
# more (OverflowError), and gRPC's deadline overflows just above it.
MAX_TIMEOUT_SECONDS = min(threading.TIMEOUT_MAX, 1e9)


def _check_number(name, value, positive=False, most=None):
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value) or value < 0 or (positive and value == 0)
            or (most is not None and value > most)):
        expected = "a finite number > 0" if positive else "a finite number >= 0"
        if most is not None:
            expected += f" and <= {most:g}"
        raise ValueError(f"`{name}` must be {expected}. Received: {name}={value!r}.")


def _check_model_name(model_name):
    """The served model's name, which goes into the REST URL's path
    (`/v1/models/NAME`) and the gRPC request: `a/b` or `a?b` reached
    another URL than the model's, and the server answered about that."""
    if (not isinstance(model_name, str) or not model_name
            or any(c in model_name for c in "/?#%") or model_name != model_name.strip()
            or any(c.isspace() for c in model_name)):
        raise ValueError(
            "`model_name` must be the served model's name (TF Serving's --model_name: no "
            f"'/', '?', '#', '%' or spaces). Received: model_name={model_name!r}.")


def _check_grpc_target(target):
    """HOST:PORT: without a port gRPC connects to 443, where no TF Serving
    listens by default (its gRPC port is 8500), and the call then failed
    as UNAVAILABLE after the whole timeout."""
    if not isinstance(target, str) or ":" not in target or target.endswith(":"):
        raise ValueError(
            "`target` must be HOST:PORT, such as 'localhost:8500' (TF Serving's gRPC "
            "port is 8500 by default; without a port gRPC would connect to 443). "
            f"Received: target={target!r}.")


# --- gRPC -----------------------------------------------------------------------


class GrpcTransport:
    """TF Serving's gRPC `PredictionService` (port 8500 by default).

    Args:
        target: str. "host:port".
        model_name: str.
        version: int or None (latest).
        timeout: float. Seconds for the whole call, retries included (gRPC
            deadlines are whole-call deadlines).
        channel: an existing `grpc.Channel` to use instead of `target`.
        retries: int >= 0. Further attempts when the server is UNAVAILABLE.
        backoff: float. Seconds before the first retry, doubled after each.
    """

    def __init__(self, target="localhost:8500", model_name="txl", *,
                 version=None, timeout=60.0, channel=None, retries=0,
                 backoff=0.5):
        import grpc

        _check_model_name(model_name)
        if channel is None:
            _check_grpc_target(target)
        _check_number("timeout", timeout, positive=True, most=MAX_TIMEOUT_SECONDS)
        _check_number("backoff", backoff)
        if (isinstance(retries, bool) or not isinstance(retries, numbers.Integral)
                or retries < 0):
            raise ValueError(
                f"`retries` must be an integer >= 0. Received: retries={retries!r}."
            )
        self.retries = int(retries)
        self.backoff = float(backoff)

        prediction_service_pb2_grpc = serving_apis("prediction_service_pb2_grpc")
        self.model_name = model_name
        self.version = version
        self.timeout = timeout
        self._own_channel = channel is None
        self.channel = channel or grpc.insecure_channel(
            target,
            options=[
                ("grpc.max_send_message_length", _GRPC_MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", _GRPC_MAX_MESSAGE_BYTES),
            ],
        )
        self.stub = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)

    def make_request(self, signature_name, inputs):
        import tensorflow as tf

        predict_pb2 = serving_apis("predict_pb2")

        request = predict_pb2.PredictRequest()
        request.model_spec.name = self.model_name
        request.model_spec.signature_name = signature_name
        if self.version is not None:
            request.model_spec.version.value = int(self.version)
        for name, value in inputs.items():
            request.inputs[name].CopyFrom(tf.make_tensor_proto(np.asarray(value)))
        return request

    def predict(self, signature_name, inputs, output_names=None, form=None):
        import grpc
        import tensorflow as tf

        request = self.make_request(signature_name, inputs)
        deadline = time.monotonic() + self.timeout
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                response = self.stub.Predict(
                    request, timeout=max(deadline - time.monotonic(), 1e-3)
                )
                break
            except grpc.RpcError as e:
                code = e.code()
                if (code == grpc.StatusCode.UNAVAILABLE and attempt < self.retries
                        and time.monotonic() + delay < deadline):
                    time.sleep(delay)  # no connection yet: retry after a pause
                    delay *= 2
                    continue
                raise ServingError(
                    f"gRPC {code.name}: {e.details()}", status=code.name
                ) from e
        try:
            return {k: _as_numpy(tf.make_ndarray(v), k)
                    for k, v in response.outputs.items()}
        except (TypeError, ValueError) as e:
            raise ServingError(f"The server's gRPC answer cannot be decoded: {e}") from e

    def close(self):
        if self._own_channel:
            self.channel.close()


# --- the memory-carrying client --------------------------------------------------


class TXLServingClient:
    """Calls the exported signatures and carries the memory between calls.

    Args:
        transport: `RestTransport` or `GrpcTransport` (anything with
            `predict(signature_name, inputs, output_names=None, form=None)`).
    """

    def __init__(self, transport):
        self.transport = transport
        self.memory = None
        # The memory's (B, M) bool validity, for a model exported with
        # empty_memory="masked" (its answers carry one); else None.
        self.memory_mask = None
        # The new ids of the last `generate`, one array per prompt: exact
        # where the text is not (a continuation may end inside a character).
        self.token_ids = None
        # V, learnt from the first log-probs answer: later ones must agree.
        self.vocabulary_size = None

    @classmethod
    def rest(cls, url="http://localhost:8501", model_name="txl", **kwargs):
        return cls(RestTransport(url, model_name, **kwargs))

    @classmethod
    def grpc(cls, target="localhost:8500", model_name="txl", **kwargs):
        return cls(GrpcTransport(target, model_name, **kwargs))

    def reset(self, batch_size: int = 1) -> np.ndarray:
        """New texts: memory = the server's `initial_memory(batch_size)`
        (and memory_mask, all False, when the model has one).

        Always sent in the columnar form (the scalar input has no batch
        dimension, so it has no row form).
        """
        batch_size = checks.positive_int("batch_size", batch_size)
        if batch_size > _INT32_MAX:
            raise ValueError(f"`batch_size` must be at most {_INT32_MAX} (int32). "
                             f"Received: batch_size={batch_size!r}.")
        out = self.transport.predict(
            INITIAL_MEMORY, {BATCH_SIZE: np.int32(batch_size)},
            output_names=[MEMORY], form="inputs",
        )
        memory = self._checked_memory(out, INITIAL_MEMORY, batch_size, None)
        self.memory_mask = self._checked_mask(out, INITIAL_MEMORY, memory, MEMORY_MASK in out)
        self.memory = memory
        self.vocabulary_size = None  # the server's model may have been replaced
        return self.memory

    def _checked_mask(self, out, signature_name, memory, required):
        """The server's new memory_mask (B, M) bool for `memory` (the
        checked new memory), or None for a model without one."""
        if not required:
            return None
        where = f"The server's `{signature_name}` answer"
        if MEMORY_MASK not in out:
            raise ServingError(
                f"{where} has no `{MEMORY_MASK}` output (outputs {sorted(out)}), "
                "though this model's memory carries one; the client's memory "
                "is unchanged."
            )
        mask = np.asarray(out[MEMORY_MASK])
        expected = (memory.shape[0], memory.shape[2])
        if mask.dtype != bool or mask.shape != expected:
            raise ServingError(
                f"{where} has a `{MEMORY_MASK}` of shape {mask.shape} and dtype "
                f"{mask.dtype}, expected bool of shape {expected}; the client's "
                "memory is unchanged."
            )
        return mask

    def _checked_memory(self, out, signature_name, batch, previous):
        """The server's new memory, checked before it replaces the client's."""
        where = f"The server's `{signature_name}` answer"
        if MEMORY not in out:
            raise ServingError(
                f"{where} has no `{MEMORY}` output (outputs {sorted(out)}); "
                "the client's memory is unchanged."
            )
        memory = out[MEMORY]
        if memory.size == 0 and memory.ndim < 4 and isinstance(self.transport, RestTransport):
            # JSON has no way to write a (B, L, 0, D) tensor: TF Serving
            # answers [[[], []]], whose D is lost, and could not read it back.
            raise ServingError(
                f"{where} has a `{MEMORY}` of shape {memory.shape}: the model was "
                "exported with memory_length=0, whose empty memory JSON cannot carry "
                "(its last dimension is lost). Use gRPC "
                "(TXLServingClient.grpc, txl serve-client --grpc) for it, or export "
                "with a memory (txl export --memory-length N).")
        expected = ((batch, *previous.shape[1:]) if previous is not None
                    else f"({batch}, num_layers, memory_length, hidden_dim)")
        if (memory.dtype.kind != "f" or memory.ndim != 4 or memory.shape[0] != batch
                or (previous is not None and memory.shape != previous.shape)):
            raise ServingError(
                f"{where} has a `{MEMORY}` of shape {memory.shape} and dtype "
                f"{memory.dtype}, expected float32 of shape {expected}; the "
                "client's memory is unchanged."
            )
        if not np.all(np.isfinite(memory)):
            raise ServingError(
                f"{where} has NaN or Inf in `{MEMORY}`; the client's memory is "
                "unchanged."
            )
        return memory.astype(np.float32, copy=False)

    def _token_array(self, name, value):
        array = np.asarray(value)
        if array.dtype.kind not in "iu" or array.ndim != 2:
            raise ValueError(
                f"`{name}` must be a 2-D integer array (batch, segment_length), "
                f"received dtype {array.dtype.name} and shape {array.shape}."
            )
        if array.size and (int(array.min()) < 0 or int(array.max()) > np.iinfo(np.int32).max):
            # astype(int32) would wrap 2**32 + 3 to 3: a valid-looking id the
            # server's range check cannot refuse.
            raise ValueError(
                f"`{name}` must hold token ids in [0, vocabulary_size), received "
                f"values in [{int(array.min())}, {int(array.max())}]."
            )
        return array.astype(np.int32)

    def _call(self, signature_name, inputs, output):
        token_ids = inputs[TOKEN_IDS]
        if self.memory is None:
            self.reset(batch_size=token_ids.shape[0])
        batch = self.memory.shape[0]
        if batch != token_ids.shape[0]:
            raise ValueError(
                f"`token_ids` has batch size {token_ids.shape[0]} but the memory "
                f"holds {batch} rows; call reset(batch_size=...)."
            )
        state = {MEMORY: self.memory}
        if self.memory_mask is not None:
            state[MEMORY_MASK] = self.memory_mask
        out = self.transport.predict(
            signature_name, {**inputs, **state},
            output_names=[output, MEMORY],
        )
        if output not in out:
            raise ServingError(
                f"The server's `{signature_name}` answer has no `{output}` output "
                f"(outputs {sorted(out)}); the client's memory is unchanged."
            )
        result = self._checked_output(
            out[output], signature_name, output, (batch, token_ids.shape[1]))
        memory = self._checked_memory(out, signature_name, batch, self.memory)
        self.memory_mask = self._checked_mask(
            out, signature_name, memory, self.memory_mask is not None)
        self.memory = memory
        if output == LOG_PROBS:
            self.vocabulary_size = result.shape[-1]
        return result

    def _checked_output(self, result, signature_name, output, batch_and_length):
        """The answer's `log_probs` / `nll`, checked against what was sent:
        `serving_default` (B, T, V), `next_token` (B, V), `score` (B, T)
        float, no NaN, V the same as in the previous answers."""
        batch, length = batch_and_length
        V = self.vocabulary_size if self.vocabulary_size is not None else "V"
        expected = {SERVING_DEFAULT: (batch, length, V), NEXT_TOKEN: (batch, V),
                    SCORE: (batch, length)}[signature_name]
        fits = (result.dtype.kind == "f" and result.ndim == len(expected)
                and all(e == "V" or n == e for n, e in zip(result.shape, expected)))
        if not fits or np.isnan(result).any():
            shape = "(" + ", ".join(str(e) for e in expected) + ")"
            raise ServingError(
                f"The server's `{signature_name}` answer has `{output}` of shape "
                f"{result.shape} and dtype {result.dtype}"
                + (" with NaN" if fits else "")
                + f", expected float values of shape {shape} without NaN; the "
                "client's memory is unchanged."
            )
        return result

    def step(self, token_ids) -> np.ndarray:
        """`serving_default`: (B, T, V) log-probs; the memory is carried."""
        ids = self._token_array(TOKEN_IDS, token_ids)
        return self._call(SERVING_DEFAULT, {TOKEN_IDS: ids}, LOG_PROBS)

    def score(self, token_ids, targets) -> np.ndarray:
        """`score`: (B, T) NLL of `targets`; the memory is carried."""
        ids = self._token_array(TOKEN_IDS, token_ids)
        targets = self._token_array(TARGETS, targets)
        return self._call(SCORE, {TOKEN_IDS: ids, TARGETS: targets}, NLL)

    def next_token(self, token_ids) -> np.ndarray:
        """`next_token`: (B, V) log-probs of the next token; memory carried."""
        ids = self._token_array(TOKEN_IDS, token_ids)
        return self._call(NEXT_TOKEN, {TOKEN_IDS: ids}, LOG_PROBS)

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_k=0,
                 top_p=1.0, seed=0, memory=None, memory_mask=None):
        """The server's `generate` signature: whole continuations, one call.

        Args:
            prompts: list of str (at least one character each).
            max_new_tokens: int >= 1 (the server caps it, 1024 by default).
            temperature: float >= 0; 0 is greedy.
            top_k: int >= 0 (0: all ids). top_p: float in (0, 1] (1: all).
            seed: int in [0, 2**63 - 1]. The same request with the same seed gives the same
                texts.
            memory: (B, L, M, D) float array to continue from (a memory a
                previous `generate` returned), or None (a new text). With
                a memory, `generate_from_memory` is called.

        Returns:
            `(texts, memory)`: list of B str (the continuations) and the
            (B, L, M, D) float32 memory after each prompt and its
            continuation (also kept as `self.memory`, so `step` /
            `next_token` / another `generate(memory=client.memory)` go on
            from it; a masked model's `memory_mask` is kept as
            `self.memory_mask`). The continuations' ids are kept as `self.token_ids`
            (B int32 arrays): a text is decoded from its ids, and one that
            stops inside a multi-byte character (a byte or subword
            tokenizer) ends in U+FFFD where the ids are exact.

        Raises:
            ValueError: bad arguments (before anything is sent).
            ServingError: the server refused or failed the request, or
                answered something else than the signature's outputs.
        """
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (list, tuple)):
            raise ValueError(
                "`prompts` must be a list of strings, received "
                f"{type(prompts).__name__}."
            )
        if not prompts or not all(isinstance(p, str) and p for p in prompts):
            raise ValueError(
                "`prompts` must be a non-empty list of non-empty strings, "
                f"received {_short(repr(prompts), 200)}."
            )
        for index, prompt in enumerate(prompts):
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError as error:
                # Lone surrogates (e.g. undecodable bytes of a shell argument
                # read with surrogateescape) are not text: gRPC cannot send
                # them and REST would send escapes the server drops.
                raise ValueError(
                    f"`prompts`[{index}] is not valid Unicode text (a lone surrogate "
                    f"{prompt[error.start]!r} at character {error.start}): pass UTF-8 "
                    "text.") from None
        max_new_tokens = checks.positive_int("max_new_tokens", max_new_tokens)
        _check_number("temperature", temperature)
        top_k = checks.non_negative_int("top_k", top_k)
        if (isinstance(top_p, bool) or not isinstance(top_p, numbers.Real)
                or not 0 < top_p <= 1):
            raise ValueError(
                f"`top_p` must be in (0, 1] (1 keeps every token). Received: "
                f"top_p={top_p!r}."
            )
        if top_p < checks.FLOAT32_TINY:  # sent as float32, where it is 0
            raise ValueError(
                "`top_p` must be in (0, 1] (1 keeps every token) and at least "
                f"{checks.FLOAT32_TINY:g}, the smallest float32 above 0. Received: "
                f"top_p={top_p!r}."
            )
        # The signature refuses a negative seed (`seed` must be in [0, 2**63 - 1]):
        # refused here, before the request, as generate_ids and
        # SavedModelBackend refuse it, not as the server's error.
        if (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)
                or not 0 <= seed <= _INT64_MAX):
            raise ValueError(
                f"`seed` must be an integer in [0, 2**63 - 1 = {_INT64_MAX}]. "
                f"Received: seed={seed!r}.")
        # The signature's inputs are int32 / int64 / float32: np.int32(2**40)
        # is an OverflowError and np.float32(1e300) is inf.
        for name, value, high in (("max_new_tokens", max_new_tokens, _INT32_MAX),
                                  ("top_k", top_k, _INT32_MAX)):
            if value > high:
                raise ValueError(f"`{name}` must be at most {high} (int32). Received: "
                                 f"{name}={value!r}.")
        if abs(float(temperature)) > float(np.finfo(np.float32).max):
            raise ValueError(f"`temperature` must fit in float32. Received: "
                             f"temperature={temperature!r}.")
        batch = len(prompts)
        inputs = {
            # Bytes for gRPC's DT_STRING; the REST encoder sends str.
            PROMPTS: np.array(list(prompts), dtype=object),
            MAX_NEW_TOKENS: np.int32(max_new_tokens),
            TEMPERATURE: np.float32(temperature),
            TOP_K: np.int32(top_k),
            TOP_P: np.float32(top_p),
            SEED: np.int64(seed),
        }
        signature = GENERATE
        previous = None
        if memory is not None:
            previous = np.asarray(memory)
            if (previous.dtype.kind != "f" or previous.ndim != 4
                    or previous.shape[0] != batch):
                raise ValueError(
                    "`memory` must be a float array (batch, num_layers, "
                    f"memory_length, hidden_dim) with batch {batch} (one row "
                    f"per prompt), received dtype {previous.dtype} and shape "
                    f"{previous.shape}."
                )
            # Checked as the float32 it is sent as: a float64 1e39 is finite
            # before the cast and Inf after.
            previous = checks.finite_float32(
                "memory", previous, hint="pass the memory a previous generate "
                "returned (client.memory).")
            if memory_mask is None and memory is self.memory:
                memory_mask = self.memory_mask  # the client's own memory's
            if memory_mask is None and self.memory_mask is not None:
                raise ValueError(
                    "`memory_mask` is required with `memory` for this model "
                    "(exported with empty_memory='masked'): pass the "
                    "client.memory_mask returned with that memory, or "
                    f"np.ones(({batch}, {previous.shape[2]}), bool) if every "
                    "slot holds real memory.")
            inputs[MEMORY] = previous
            if memory_mask is not None:
                mask = np.asarray(memory_mask)
                if mask.dtype != bool or mask.shape != (batch, previous.shape[2]):
                    raise ValueError(
                        "`memory_mask` must be a bool array of shape (batch, "
                        f"memory_length) = ({batch}, {previous.shape[2]}), True "
                        "where a memory slot holds real memory; received dtype "
                        f"{mask.dtype} and shape {mask.shape}.")
                inputs[MEMORY_MASK] = mask
            signature = GENERATE_FROM_MEMORY
        elif memory_mask is not None:
            raise ValueError(
                "`memory_mask` goes with a `memory`: without one `generate` "
                "starts from the empty memory.")
        out = self.transport.predict(
            signature, inputs,
            output_names=[TEXTS, MEMORY, TOKEN_IDS, LENGTHS, MEMORY_MASK],
            form="inputs",
        )
        texts = out.get(TEXTS)
        if texts is None or texts.shape != (batch,) or texts.dtype != object:
            raise ServingError(
                f"The server's `{signature}` answer has no `{TEXTS}` of "
                f"{batch} strings (outputs {sorted(out)}); the client's "
                "memory is unchanged."
            )
        if LENGTHS in out and np.asarray(out[LENGTHS]).shape != (batch,):
            raise ServingError(
                f"The server's `{signature}` answer has `{LENGTHS}` of shape "
                f"{np.asarray(out[LENGTHS]).shape}, expected ({batch},)."
            )
        ids, lengths = out.get(TOKEN_IDS), out.get(LENGTHS)
        if ids is not None and lengths is not None:
            ids, lengths = np.asarray(ids), np.asarray(lengths)
            if (ids.ndim != 2 or ids.shape[0] != batch or ids.dtype.kind not in "iu"
                    or lengths.dtype.kind not in "iu" or np.any(lengths < 0)
                    or np.any(lengths > ids.shape[1])):
                raise ServingError(
                    f"The server's `{signature}` answer has `{TOKEN_IDS}` of shape "
                    f"{ids.shape} ({ids.dtype}) and `{LENGTHS}` {lengths.tolist()}, "
                    f"expected ({batch}, N) ids and lengths in [0, N].")
            token_ids = [ids[row, :lengths[row]].astype(np.int32) for row in range(batch)]
        else:
            token_ids = None
        new_memory = self._checked_memory(out, signature, batch, previous)
        # The answer of a masked model carries the new memory's mask.
        self.memory_mask = self._checked_mask(
            out, signature, new_memory, MEMORY_MASK in out or MEMORY_MASK in inputs)
        self.memory = new_memory
        self.token_ids = token_ids
        return [str(t) for t in texts], self.memory

    def close(self):
        self.transport.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
