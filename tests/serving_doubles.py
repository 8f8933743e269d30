"""Loopback stand-ins for TF Serving: test doubles, not library code.

`tensorflow_model_server` cannot be installed on the development machines,
so the client (`keras_txl.export.serving_client`) is tested end to end
against these stand-ins. They decode requests the way TF Serving does (REST
`:predict` with the columnar "inputs" and the row "instances" forms; gRPC
`PredictionService/Predict`), call the exported SavedModel signature and
answer in TF Serving's response shapes, on 127.0.0.1 only.
"""

from __future__ import annotations

import http.server
import json
import logging
import os
import re
import threading

import numpy as np
import tensorflow as tf

from keras_txl import register_text_ops
from keras_txl.export import signatures as sig
from keras_txl.export.serving import ASSETS_EXTRA
from keras_txl.export.serving import GRPC_OPTIONS
from keras_txl.export.serving import WARMUP_FILE
from keras_txl.export.serving import read_warmup_file
from keras_txl.export.serving import resolve_version_dir
from keras_txl.export.serving_client import serving_apis

logger = logging.getLogger(__name__)


class PredictError(ValueError):
    """A request the model cannot run: bad signature, inputs, shapes, ids."""


def replay_warmup(version_dir: str, predictor=None) -> list:
    """Runs every warm-up record against the SavedModel, as TF Serving does.

    Returns:
        `[(signature_name, {output: ndarray}), ...]` in file order.

    Raises:
        PredictError: a record does not run.
    """
    predictor = predictor or SavedModelPredictor(version_dir)
    path = os.path.join(version_dir, ASSETS_EXTRA, WARMUP_FILE)
    results = []
    for request in read_warmup_file(path):
        name = request.model_spec.signature_name or sig.SERVING_DEFAULT
        inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
        results.append((name, predictor.predict(name, inputs)))
    return results


class SavedModelPredictor:
    """Calls the signatures of an exported SavedModel with numpy inputs.

    What TF Serving does with a decoded request: look up the signature,
    check the input names, run it, return the named outputs.

    Args:
        path: str. A version folder or a base path with numbered versions
            (the highest is loaded).
    """

    def __init__(self, path: str):
        self.version_dir = resolve_version_dir(path)
        name = os.path.basename(os.path.normpath(self.version_dir))
        self.version = int(name) if name.isdigit() else None
        register_text_ops()
        self._loaded = tf.saved_model.load(self.version_dir)
        self.signatures = dict(self._loaded.signatures)

    def input_specs(self, signature_name: str) -> dict:
        """`{input: tf.TensorSpec}` of one signature."""
        function = self._signature(signature_name)
        return dict(function.structured_input_signature[1])

    def output_specs(self, signature_name: str) -> dict:
        return dict(self._signature(signature_name).structured_outputs)

    def _signature(self, name):
        if name not in self.signatures:
            raise PredictError(
                f"Serving signature name: \"{name}\" not found in signature def; "
                f"available: {sorted(self.signatures)}."
            )
        return self.signatures[name]

    def predict(self, signature_name: str, inputs: dict) -> dict:
        """Runs one signature.

        Args:
            signature_name: str.
            inputs: `{input: array-like}`. Dtypes must match the signature
                (as with TF Serving's gRPC API).

        Returns:
            `{output: np.ndarray}`.

        Raises:
            PredictError: unknown signature, missing or extra inputs, wrong
                dtypes or shapes, ids out of range (the model's message).
        """
        function = self._signature(signature_name)
        expected = self.input_specs(signature_name)
        missing = sorted(set(expected) - set(inputs))
        extra = sorted(set(inputs) - set(expected))
        if missing or extra:
            raise PredictError(
                f"Signature {signature_name!r} takes inputs {sorted(expected)}; "
                f"missing {missing}, unexpected {extra}."
            )
        tensors = {}
        for name, value in inputs.items():
            value = np.asarray(value)
            want = expected[name].dtype.as_numpy_dtype
            if value.dtype != want:
                raise PredictError(
                    f"Input {name!r} of signature {signature_name!r} must be "
                    f"{np.dtype(want).name}, received {value.dtype.name}."
                )
            tensors[name] = tf.constant(value)
        try:
            outputs = function(**tensors)
        except (tf.errors.OpError, TypeError, ValueError) as e:
            message = getattr(e, "message", None) or str(e)
            raise PredictError(_first_lines(message)) from None
        return {k: v.numpy() for k, v in outputs.items()}


def _first_lines(message, limit=600):
    # Drop TF's "Graph execution error: Detected at node ..." preamble but
    # keep the assertion text, which is what the user needs.
    text = " ".join(line.strip() for line in message.splitlines() if line.strip())
    text = re.sub(r"Graph execution error:\s*", "", text)
    text = re.sub(r"Detected at node \S+ defined at \(most recent call last\):"
                  r"\s*<stack traces unavailable>\s*", "", text)
    return text[:limit]


# --- REST (TF Serving's JSON API) -------------------------------------------


def _json_to_array(value, dtype, name):
    dtype = np.dtype(dtype)
    if dtype.kind == "O":  # DT_STRING: JSON strings, or {"b64": ...} objects
        return _json_to_strings(value, name)
    try:
        array = np.asarray(value)
    except ValueError:
        array = None
    if array is None or array.dtype == object:
        raise PredictError(
            f"Input {name!r}: the JSON value is not a rectangular array of "
            "numbers (ragged lists?)."
        )
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        if array.size and array.dtype.kind not in "iub":
            raise PredictError(
                f"Input {name!r} is {dtype.name}; the JSON holds non-integer "
                "numbers."
            )
        info = np.iinfo(dtype)
        if array.size and (array.min() < info.min or array.max() > info.max):
            raise PredictError(
                f"Input {name!r}: values do not fit in {dtype.name}."
            )
    elif array.size and array.dtype.kind not in "iubf":
        raise PredictError(f"Input {name!r}: expected numbers.")
    return array.astype(dtype)


def _json_to_strings(value, name):
    import base64

    def one(item):
        if isinstance(item, str):
            return item.encode("utf-8")
        if isinstance(item, dict) and set(item) == {"b64"}:
            return base64.b64decode(item["b64"])
        raise PredictError(
            f"Input {name!r} is a string tensor: expected JSON strings (or "
            f'{{"b64": ...}} objects), received {type(item).__name__}.'
        )

    if isinstance(value, list):
        if any(isinstance(v, list) for v in value):
            raise PredictError(f"Input {name!r}: expected a list of strings.")
        return np.array([one(v) for v in value], dtype=object).reshape(len(value))
    return np.array(one(value), dtype=object)


def _jsonable(array):
    """An output as JSON: strings as JSON strings (TF Serving does so for
    valid UTF-8), numbers as lists."""
    if array.dtype == object:
        return np.vectorize(
            lambda x: x.decode("utf-8") if isinstance(x, bytes) else x,
            otypes=[object],
        )(array).tolist()
    return array.tolist()


def decode_rest_request(body: dict, input_dtypes: dict) -> tuple:
    """A `:predict` JSON body -> (signature_name, {input: ndarray}, form).

    Args:
        body: the decoded JSON object.
        input_dtypes: `{input: numpy dtype}` of the requested signature
            (JSON numbers carry no dtype; TF Serving takes the signature's).

    Returns:
        `(signature_name, inputs, form)` with form "inputs" (columnar) or
        "instances" (row).
    """
    if not isinstance(body, dict):
        raise PredictError("The request body must be a JSON object.")
    has_rows, has_columns = "instances" in body, "inputs" in body
    if has_rows == has_columns:
        raise PredictError(
            'Request must have exactly one of "instances" (row format) or '
            '"inputs" (columnar format).'
        )
    names = sorted(input_dtypes)
    if has_columns:
        values = body["inputs"]
        if not isinstance(values, dict):
            if len(names) != 1:
                raise PredictError(
                    f'"inputs" must name the inputs {names} of this signature.'
                )
            values = {names[0]: values}
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise PredictError(f"Unknown input(s) {unknown}; expected {names}.")
        inputs = {
            k: _json_to_array(v, input_dtypes[k], k) for k, v in values.items()
        }
        return body.get("signature_name", sig.SERVING_DEFAULT), inputs, "inputs"
    rows = body["instances"]
    if not isinstance(rows, list) or not rows:
        raise PredictError('"instances" must be a non-empty list.')
    if all(isinstance(r, dict) for r in rows):
        keys = set(rows[0])
        if any(set(r) != keys for r in rows):
            raise PredictError("Every instance must have the same inputs.")
        unknown = sorted(keys - set(names))
        if unknown:
            raise PredictError(f"Unknown input(s) {unknown}; expected {names}.")
        columns = {k: [r[k] for r in rows] for k in keys}
    elif len(names) == 1:
        columns = {names[0]: rows}
    else:
        raise PredictError(
            f"Each instance must be an object naming the inputs {names}."
        )
    inputs = {
        k: _json_to_array(v, input_dtypes[k], k) for k, v in columns.items()
    }
    return body.get("signature_name", sig.SERVING_DEFAULT), inputs, "instances"


def encode_rest_response(outputs: dict, form: str) -> dict:
    """Named outputs -> TF Serving's JSON response for that request form.

    Columnar: `{"outputs": {name: value}}`, or `{"outputs": value}` for a
    single output. Row: `{"predictions": [{name: row}, ...]}`, or
    `{"predictions": [row, ...]}` for a single output; every output must
    then share the batch dimension.
    """
    if form == "inputs":
        if len(outputs) == 1:
            return {"outputs": _jsonable(next(iter(outputs.values())))}
        return {"outputs": {k: _jsonable(v) for k, v in outputs.items()}}
    sizes = {v.shape[0] if v.ndim else None for v in outputs.values()}
    if len(sizes) != 1 or None in sizes:
        raise PredictError(
            "The row format needs every output to share the batch dimension; "
            "use the columnar format (\"inputs\")."
        )
    (batch,) = sizes
    if len(outputs) == 1:
        return {"predictions": _jsonable(next(iter(outputs.values())))}
    columns = {k: _jsonable(v) for k, v in outputs.items()}
    return {
        "predictions": [
            {k: v[i] for k, v in columns.items()} for i in range(batch)
        ]
    }


_PREDICT_PATH = re.compile(
    r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?:predict$"
)
_STATUS_PATH = re.compile(
    r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?$"
)


def _rest_handler(predictor, model_name):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # noqa: A002 - base signature
            logger.debug("rest stand-in: " + format, *args)

        def _reply(self, status, payload):
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _check_model(self, match):
            if match.group("name") != model_name:
                self._reply(404, {"error": f"Servable not found for request: "
                                           f"Latest({match.group('name')})"})
                return False
            version = match.group("version")
            if version is not None and int(version) != predictor.version:
                self._reply(404, {"error": f"Servable not found for request: "
                                           f"Specific({model_name}, {version})"})
                return False
            return True

        def do_GET(self):  # noqa: N802 - http.server naming
            match = _STATUS_PATH.match(self.path)
            if not match:
                return self._reply(404, {"error": "Malformed request: GET " + self.path})
            if self._check_model(match):
                self._reply(200, {"model_version_status": [{
                    "version": str(predictor.version), "state": "AVAILABLE",
                    "status": {"error_code": "OK", "error_message": ""},
                }]})

        def do_POST(self):  # noqa: N802 - http.server naming
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            match = _PREDICT_PATH.match(self.path)
            if not match:
                return self._reply(404, {"error": "Malformed request: POST " + self.path})
            if not self._check_model(match):
                return
            try:
                try:
                    body = json.loads(raw)
                except ValueError as e:
                    raise PredictError(f"JSON Parse error: {e}") from None
                name = (body.get("signature_name") if isinstance(body, dict)
                        else None) or sig.SERVING_DEFAULT
                specs = predictor.input_specs(name)
                dtypes = {k: s.dtype.as_numpy_dtype for k, s in specs.items()}
                name, inputs, form = decode_rest_request(body, dtypes)
                outputs = predictor.predict(name, inputs)
                payload = encode_rest_response(outputs, form)
            except PredictError as e:
                return self._reply(400, {"error": str(e)})
            self._reply(200, payload)

    return Handler


# --- gRPC ---------------------------------------------------------------------


def _grpc_servicer(predictor, model_name):
    import grpc

    predict_pb2 = serving_apis("predict_pb2")
    prediction_service_pb2_grpc = serving_apis("prediction_service_pb2_grpc")

    class Servicer(prediction_service_pb2_grpc.PredictionServiceServicer):
        def Predict(self, request, context):  # noqa: N802 - gRPC naming
            spec = request.model_spec
            if spec.name != model_name or (
                spec.HasField("version") and spec.version.value != predictor.version
            ):
                context.abort(
                    grpc.StatusCode.NOT_FOUND,
                    f"Servable not found for request: {spec.name}",
                )
            name = spec.signature_name or sig.SERVING_DEFAULT
            try:
                inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
                outputs = predictor.predict(name, inputs)
            except PredictError as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            response = predict_pb2.PredictResponse()
            response.model_spec.name = model_name
            response.model_spec.signature_name = name
            if predictor.version is not None:
                response.model_spec.version.value = predictor.version
            wanted = set(request.output_filter) or set(outputs)
            for key, value in outputs.items():
                if key in wanted:
                    response.outputs[key].CopyFrom(tf.make_tensor_proto(value))
            return response

    return Servicer()


class StandInServer:
    """TF-Serving-shaped REST and gRPC endpoints on 127.0.0.1, in-process.

    Backed by `SavedModelPredictor`. Ports 0 pick free ports; read
    `rest_url` and `grpc_target` after `start()`. Use as a context manager.

    Args:
        model_path: str. Version folder or model base path.
        model_name: str. The name in request URLs and `model_spec.name`.
        rest_port, grpc_port: int, or None to skip that endpoint.

    Example:
    ```python
    with StandInServer("exports/txl") as server:
        client = TXLServingClient.rest(server.rest_url)
        client.reset(batch_size=1)
        log_probs = client.step([[1, 2, 3]])
    ```
    """

    HOST = "127.0.0.1"

    def __init__(self, model_path, model_name="txl", rest_port=0, grpc_port=0):
        self.predictor = SavedModelPredictor(model_path)
        self.model_name = model_name
        self._rest_port, self._grpc_port = rest_port, grpc_port
        self._http = self._thread = self._grpc = None
        self.rest_url = self.grpc_target = None

    def start(self):
        if self._rest_port is not None:
            self._http = http.server.ThreadingHTTPServer(
                (self.HOST, self._rest_port),
                _rest_handler(self.predictor, self.model_name),
            )
            self._http.daemon_threads = True
            self._thread = threading.Thread(
                target=self._http.serve_forever, kwargs={"poll_interval": 0.05},
                name="txl-rest-stand-in", daemon=True,
            )
            self._thread.start()
            self.rest_url = f"http://{self.HOST}:{self._http.server_address[1]}"
        if self._grpc_port is not None:
            from concurrent import futures

            import grpc

            prediction_service_pb2_grpc = serving_apis("prediction_service_pb2_grpc")

            self._grpc = grpc.server(
                futures.ThreadPoolExecutor(max_workers=2), options=GRPC_OPTIONS
            )
            prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
                _grpc_servicer(self.predictor, self.model_name), self._grpc
            )
            port = self._grpc.add_insecure_port(f"{self.HOST}:{self._grpc_port}")
            self._grpc.start()
            self.grpc_target = f"{self.HOST}:{port}"
        return self

    def stop(self):
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._thread.join(timeout=5)
            self._http = None
        if self._grpc is not None:
            self._grpc.stop(grace=0.5).wait(timeout=5)
            self._grpc = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
