"""TF Serving side: warm-up records, the version layout, the `docker run` line.

The in-process stand-ins for the server that the client is tested against
live with the tests (`tests/serving_doubles.py`): production serving is the
`tensorflow/serving` image (`docker_run_command`, docs/export.md).

Warm-up: TF Serving replays `<version>/assets.extra/tf_serving_warmup_requests`
(a TFRecord file of `PredictionLog` protos) when it loads a version, so the
first real request does not pay for graph initialisation.
"""

from __future__ import annotations

import logging
import os
import shlex

import numpy as np
import tensorflow as tf

from keras_txl.export import signatures as sig
from keras_txl.export.serving_client import serving_apis

logger = logging.getLogger(__name__)

WARMUP_FILE = "tf_serving_warmup_requests"
ASSETS_EXTRA = "assets.extra"
# TF Serving's own server accepts messages up to 2 GiB; gRPC's default is
# 4 MiB, too small for the memory of a real model.
GRPC_MAX_MESSAGE_BYTES = 1 << 30
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", GRPC_MAX_MESSAGE_BYTES),
]



def docker_run_command(
    model_base_path: str, model_name: str = "txl", image: str = "tensorflow/serving"
) -> str:
    """The `docker run` line that serves `<model_base_path>/<version>/`.

    `model_base_path` is the folder that holds the numbered versions, i.e.
    `<out_dir>/<name>` of `export_saved_model`.
    """
    source = os.path.abspath(model_base_path)
    # Quoted for the shell where needed (a folder with a space or a quote);
    # a plain path comes out as typed.
    return shlex.join([
        "docker", "run", "-p", "8501:8501", "-p", "8500:8500",
        "--mount", f"type=bind,source={source},target=/models/{model_name}",
        "-e", f"MODEL_NAME={model_name}", "-t", image,
    ])


# --- warm-up ---------------------------------------------------------------


WARMUP_PROMPT = "Hello"


def warmup_prompt(tokenizer, limit: int = 256):
    """A prompt for the `generate` warm-up requests that `tokenizer`
    turns into at least one token without an error, or None.

    TF Serving does not load a version whose warm-up request fails, and
    "Hello" is no text for every tokenizer: the official text8 symbols have
    no capital letters and no unknown symbol, so tokenizing it raises. Then
    the text of one of the first `limit` ids is tried, id by id.
    """
    def candidates():
        yield WARMUP_PROMPT
        for token_id in range(min(int(tokenizer.vocabulary_size()), limit)):
            try:
                text = tokenizer.detokenize(tf.constant([[token_id]], tf.int32))
            except (tf.errors.OpError, ValueError, TypeError):
                continue
            text = np.asarray(text).reshape(-1)[0]
            yield text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)

    for prompt in candidates():
        if not prompt.strip():
            continue
        try:
            tokens = tokenizer.tokenize(tf.constant([prompt]))
        except (tf.errors.OpError, ValueError, TypeError):
            continue
        if int(tokens.row_lengths()[0]) > 0:
            return prompt
    return None


def warmup_inputs(
    config, batch_size: int | None = None, segment_length: int | None = None,
    generate: bool = False, prompt: str = WARMUP_PROMPT,
) -> dict:
    """`{signature: {input: ndarray}}`: one small request per signature.

    B is the fixed batch size or 1; T is the fixed segment length or the
    config's training segment length. Ids are `arange(T) % V`, the memory
    is zeros (and, where the signature table has a `memory_mask` input, the
    mask is all False: an empty memory of a masked model). With
    `generate`, also the text signatures: one prompt (`prompt`, by default
    "Hello"; `warmup_prompt` finds one the model's tokenizer reads), 4 new
    tokens, greedy, seed 0.
    """
    B = batch_size or 1
    T = segment_length or config.segment_length
    ids = np.tile(np.arange(T) % config.vocabulary_size, (B, 1)).astype(np.int32)
    targets = np.roll(ids, -1, axis=1)
    memory = np.zeros(sig.memory_shape(config, B), np.float32)
    inputs = {
        sig.SERVING_DEFAULT: {sig.TOKEN_IDS: ids, sig.MEMORY: memory},
        sig.INITIAL_MEMORY: {sig.BATCH_SIZE: np.array(B, np.int32)},
        sig.SCORE: {sig.TOKEN_IDS: ids, sig.TARGETS: targets, sig.MEMORY: memory},
        sig.NEXT_TOKEN: {sig.TOKEN_IDS: ids, sig.MEMORY: memory},
    }
    if generate:
        request = generate_request([prompt], 4)
        inputs[sig.GENERATE] = request
        inputs[sig.GENERATE_FROM_MEMORY] = {
            **request,
            sig.MEMORY: np.zeros(sig.memory_shape(config, 1), np.float32),
        }
    table = sig.signature_table(config, B, T, names=tuple(inputs))
    for name, values in inputs.items():
        if sig.MEMORY_MASK in table[name]["inputs"]:
            rows = values[sig.MEMORY].shape[0]
            values[sig.MEMORY_MASK] = np.zeros(
                sig.memory_mask_shape(config, rows), bool)
    return inputs


def generate_request(prompts, max_new_tokens, temperature=0.0, top_k=0,
                     top_p=1.0, seed=0) -> dict:
    """The inputs of a `generate` request as typed numpy values (the
    signature's dtypes: TF Serving's gRPC API does not convert)."""
    return {
        sig.PROMPTS: np.asarray(
            [p.encode("utf-8") if isinstance(p, str) else p for p in prompts],
            dtype=object,
        ),
        sig.MAX_NEW_TOKENS: np.array(max_new_tokens, np.int32),
        sig.TEMPERATURE: np.array(temperature, np.float32),
        sig.TOP_K: np.array(top_k, np.int32),
        sig.TOP_P: np.array(top_p, np.float32),
        sig.SEED: np.array(seed, np.int64),
    }


def make_predict_request(model_name, signature_name, inputs, version=None):
    """A `tensorflow_serving.apis.predict_pb2.PredictRequest`."""
    predict_pb2 = serving_apis("predict_pb2")

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = signature_name
    if version is not None:
        request.model_spec.version.value = int(version)
    for name, value in inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(np.asarray(value)))
    return request


def write_warmup_file(path: str, requests) -> str:
    """Writes `PredictRequest`s as a TFRecord of `PredictionLog` protos."""
    prediction_log_pb2 = serving_apis("prediction_log_pb2")

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for request in requests:
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request)
            )
            writer.write(log.SerializeToString())
    return path


def read_warmup_file(path: str) -> list:
    """The `PredictRequest`s of a warm-up file, in order."""
    prediction_log_pb2 = serving_apis("prediction_log_pb2")
    if not os.path.isfile(path):
        # TensorFlow's reader raised FailedPreconditionError from deep inside.
        where = os.path.join(path, "assets.extra", WARMUP_FILE)
        hint = f": the version folder's is {where}" if os.path.isfile(where) else ""
        raise ValueError(f"`path` {path!r} is not a warm-up file{hint}.")

    requests = []
    for record in tf.data.TFRecordDataset(path):
        log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        if not log.HasField("predict_log"):
            raise ValueError(
                f"{path}: warm-up record of kind {log.WhichOneof('log_type')!r}; "
                "only predict_log records are written by keras-txl."
            )
        requests.append(log.predict_log.request)
    return requests


def resolve_version_dir(path: str) -> str:
    """A version folder, or the highest numbered version under a base path."""
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return path
    # As TF Serving reads a base path: folders named by an int64 (ASCII
    # digits; "02" is version 2), the highest served.
    versions = [
        (int(n), n) for n in os.listdir(path)
        if n.isascii() and n.isdigit() and int(n) < 2**63 and os.path.exists(
            os.path.join(path, n, "saved_model.pb")
        )
    ] if os.path.isdir(path) else []
    if not versions:
        raise ValueError(
            f"{path!r} is not a SavedModel: expected saved_model.pb in it or in a "
            "numbered version folder under it (<base>/<version>/saved_model.pb, as "
            "txl export --format saved_model writes <out>/<name>/<version>/)."
        )
    return os.path.join(path, max(versions)[1])
