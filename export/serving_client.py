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
```

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

import json
import urllib.error
import urllib.request

import numpy as np

from keras_txl.export.signatures import BATCH_SIZE
from keras_txl.export.signatures import INITIAL_MEMORY
from keras_txl.export.signatures import LOG_PROBS
from keras_txl.export.signatures import MEMORY
from keras_txl.export.signatures import NEXT_TOKEN
from keras_txl.export.signatures import NLL
from keras_txl.export.signatures import SCORE
from keras_txl.export.signatures import SERVING_DEFAULT
from keras_txl.export.signatures import TARGETS
from keras_txl.export.signatures import TOKEN_IDS


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


class ServingError(RuntimeError):
    """The server rejected or failed a request; `status` is the HTTP status
    or the gRPC status code name."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


def _as_numpy(value):
    array = np.asarray(value)
    if array.dtype.kind == "f":
        return array.astype(np.float32)
    return array


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


def decode_rest_response(body: dict, form: str, output_names=None) -> dict:
    """A `:predict` JSON response -> `{output: ndarray}` (floats as float32).

    TF Serving drops the output name when a signature has one output; pass
    `output_names` to name it.
    """
    if "error" in body:
        raise ServingError(body["error"])
    if form == "inputs":
        outputs = body["outputs"]
        if not isinstance(outputs, dict):
            outputs = {(output_names or ["outputs"])[0]: outputs}
        return {k: _as_numpy(v) for k, v in outputs.items()}
    rows = body["predictions"]
    if rows and all(isinstance(r, dict) for r in rows):
        return {k: _as_numpy([r[k] for r in rows]) for k in rows[0]}
    return {(output_names or ["predictions"])[0]: _as_numpy(rows)}


class RestTransport:
    """TF Serving's REST API (port 8501 by default).

    Args:
        url: str. Server root, e.g. "http://localhost:8501".
        model_name: str.
        version: int or None (latest).
        form: "inputs" or "instances".
        timeout: float. Seconds per request.
    """

    def __init__(self, url="http://localhost:8501", model_name="txl", *,
                 version=None, form="inputs", timeout=60.0):
        if form not in REST_FORMS:
            raise ValueError(f"`form` must be one of {REST_FORMS}, received {form!r}.")
        self.url = url.rstrip("/")
        self.model_name = model_name
        self.version = version
        self.form = form
        self.timeout = timeout

    @property
    def model_url(self):
        url = f"{self.url}/v1/models/{self.model_name}"
        if self.version is not None:
            url += f"/versions/{int(self.version)}"
        return url

    def _request(self, url, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            url, data=data, method="GET" if data is None else "POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            try:
                message = json.loads(text).get("error", text)
            except ValueError:
                message = text
            raise ServingError(f"HTTP {e.code}: {message}", status=e.code) from None
        except urllib.error.URLError as e:
            raise ServingError(f"Cannot reach {url}: {e.reason}") from None

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


# --- gRPC -----------------------------------------------------------------------


class GrpcTransport:
    """TF Serving's gRPC `PredictionService` (port 8500 by default).

    Args:
        target: str. "host:port".
        model_name: str.
        version: int or None (latest).
        timeout: float. Seconds per call.
        channel: an existing `grpc.Channel` to use instead of `target`.
    """

    def __init__(self, target="localhost:8500", model_name="txl", *,
                 version=None, timeout=60.0, channel=None):
        import grpc

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
        try:
            response = self.stub.Predict(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise ServingError(
                f"gRPC {e.code().name}: {e.details()}", status=e.code().name
            ) from None
        return {k: _as_numpy(tf.make_ndarray(v)) for k, v in response.outputs.items()}

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

    @classmethod
    def rest(cls, url="http://localhost:8501", model_name="txl", **kwargs):
        return cls(RestTransport(url, model_name, **kwargs))

    @classmethod
    def grpc(cls, target="localhost:8500", model_name="txl", **kwargs):
        return cls(GrpcTransport(target, model_name, **kwargs))

    def reset(self, batch_size: int = 1) -> np.ndarray:
        """New texts: memory = the server's `initial_memory(batch_size)`.

        Always sent in the columnar form (the scalar input has no batch
        dimension, so it has no row form).
        """
        if not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
            raise ValueError(f"`batch_size` must be a positive int, received {batch_size!r}.")
        out = self.transport.predict(
            INITIAL_MEMORY, {BATCH_SIZE: np.int32(batch_size)},
            output_names=[MEMORY], form="inputs",
        )
        self.memory = out[MEMORY]
        return self.memory

    def _token_array(self, name, value):
        array = np.asarray(value)
        if array.dtype.kind not in "iu" or array.ndim != 2:
            raise ValueError(
                f"`{name}` must be a 2-D integer array (batch, segment_length), "
                f"received dtype {array.dtype.name} and shape {array.shape}."
            )
        return array.astype(np.int32)

    def _call(self, signature_name, inputs, output):
        token_ids = inputs[TOKEN_IDS]
        if self.memory is None:
            self.reset(batch_size=token_ids.shape[0])
        if self.memory.shape[0] != token_ids.shape[0]:
            raise ValueError(
                f"`token_ids` has batch size {token_ids.shape[0]} but the memory "
                f"holds {self.memory.shape[0]} rows; call reset(batch_size=...)."
            )
        out = self.transport.predict(
            signature_name, {**inputs, MEMORY: self.memory},
            output_names=[output, MEMORY],
        )
        self.memory = out[MEMORY]
        return out[output]

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

    def close(self):
        self.transport.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
