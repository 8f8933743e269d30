"""TFLite export (builtin ops only, fixed B and T) and a LiteRT runner.

`export_tflite` writes a fixed-shape SavedModel to a temporary folder and
converts it with `tf.lite.TFLiteConverter.from_saved_model` using
`TFLITE_BUILTINS` only: no Flex (SELECT_TF_OPS) ops, which the LiteRT
interpreter here cannot run (shared/TF_NOTES.md section 5). The converted
model is checked for custom/Flex operators before it is written.

Two variants:
- stateless: signatures `serving_default`, `score`, `next_token`, with the
  memory passed in and returned, as in the SavedModel;
- stateful (`stateful=True`): the memory lives in a resource variable
  inside the model; `serving_default(token_ids)`, `score(token_ids,
  targets)`, `next_token(token_ids)` read and update it and `reset()`
  zeroes it.

A model with `empty_memory="masked"` (`signatures.masked_memory`) also
carries the memory's validity, `memory_mask` (B, M) bool: beside the
memory in and out of the stateless signatures, and in a second resource
variable of the stateful model (all False after `reset()` and at load:
an empty memory's slots are masked).

`export_tflite_variants` converts one SavedModel to several quantizations
(float32, float16 weights, dynamic-range int8). Beside each .tflite file go
`config.json` (the model config), `<stem>.json` (shapes, signatures,
quantization), `tokenizer/` when given and, for a model with a
preprocessor, the tokenizer's vocabulary for the app (`write_vocabulary`:
LiteRT has no tensorflow-text ops, so the TFLite model keeps id-level
signatures and the app tokenizes with this file).

`TFLiteRunner` and `run_tflite` need only `ai_edge_litert` and numpy (no
TensorFlow import), so they run on a device-like Python too. The raw
LiteRT signature runners check dtypes but resize inputs to whatever shape
they are given, and nothing checks ids in the graph (the converter drops
assertions: an out-of-range id fails inside GATHER, or is silently clipped
with adaptive embeddings). `TFLiteRunner` checks names, dtypes, shapes, id
ranges and memory values first and raises `ValueError`.

Shape legend: B batch, T segment, L num_layers, M memory_length,
D hidden_dim, V vocabulary_size.
"""

from __future__ import annotations

import filecmp
import json
import logging
import os
import tempfile

import numpy as np

from keras_txl import checks
from keras_txl.export.signatures import LOG_PROBS
from keras_txl.export.signatures import MEMORY
from keras_txl.export.signatures import MEMORY_MASK
from keras_txl.export.signatures import NEXT_TOKEN
from keras_txl.export.signatures import NLL
from keras_txl.export.signatures import RESET
from keras_txl.export.signatures import SCORE
from keras_txl.export.signatures import SERVING_DEFAULT
from keras_txl.export.signatures import TARGETS
from keras_txl.export.signatures import TOKEN_IDS
from keras_txl.safe_files import atomic_write_bytes
from keras_txl.safe_files import remove_stale_temporaries
from keras_txl.safe_files import temporary_prefix

QUANTIZATIONS = ("none", "float16", "dynamic_int8")
VOCABULARY_FILE = "vocabulary.json"
VOCABULARY_INFO_FILE = "vocabulary_info.json"

logger = logging.getLogger(__name__)


# --- conversion -------------------------------------------------------------


def convert_saved_model(
    saved_model_dir: str, signature_keys, quantize: str = "none"
) -> bytes:
    """Converts a SavedModel to a TFLite flatbuffer with builtin ops only.

    Args:
        saved_model_dir: str.
        signature_keys: list of signature names to keep.
        quantize: "none" (float32), "float16" (float16 weights) or
            "dynamic_int8" (int8 weights, dynamic-range activations).

    Returns:
        bytes.

    Raises:
        ValueError: unknown `quantize`, or the model needs non-builtin ops.
    """
    import tensorflow as tf

    if quantize not in QUANTIZATIONS:
        raise ValueError(
            f"`quantize` must be one of {QUANTIZATIONS}, received {quantize!r}."
        )
    converter = tf.lite.TFLiteConverter.from_saved_model(
        saved_model_dir, signature_keys=list(signature_keys)
    )
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if quantize != "none":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if quantize == "float16":
        converter.target_spec.supported_types = [tf.float16]
    content = converter.convert()
    assert_builtin_only(content)
    return content


def tflite_operators(model_content: bytes) -> list:
    """Operator names used by a TFLite model, sorted.

    Builtins by name ("FULLY_CONNECTED"); custom ops as "CUSTOM:<code>"
    (Flex ops are "CUSTOM:Flex<TFOp>").
    """
    from ai_edge_litert import schema_py_generated as schema

    names = {
        value: key
        for key, value in vars(schema.BuiltinOperator).items()
        if not key.startswith("_")
    }
    model = schema.Model.GetRootAsModel(model_content, 0)
    out = set()
    for i in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(i)
        # Codes >= 127 live in BuiltinCode; older ones in the deprecated byte.
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        if builtin == schema.BuiltinOperator.CUSTOM:
            custom = code.CustomCode()
            out.add("CUSTOM:" + (custom.decode() if custom else "?"))
        else:
            out.add(names.get(builtin, str(builtin)))
    return sorted(out)


def assert_builtin_only(model_content: bytes) -> None:
    """Raises ValueError if the model has custom or Flex operators."""
    custom = [op for op in tflite_operators(model_content) if op.startswith("CUSTOM:")]
    if custom:
        raise ValueError(
            f"The TFLite model uses non-builtin operators {custom}; the LiteRT "
            "interpreter cannot run Flex ops here. Use ops with builtin "
            "TFLite kernels."
        )


def _write_bytes(path, data):
    atomic_write_bytes(path, data, make_parents=True)


def _tflite_saved_model(model, directory, batch_size, segment_length, stateful):
    """Writes the fixed-shape SavedModel that is converted; returns the
    signature names."""
    import tensorflow as tf

    from keras_txl.export import saved_model
    from keras_txl.export import signatures as sig

    if stateful:
        config = model.txl_config
        memory = tf.Variable(
            tf.zeros(sig.memory_shape(config, batch_size), tf.float32),
            trainable=False, name="memory",
        )
        variables = [memory]
        memory_mask = None
        if sig.masked_memory(config):
            # All False: the memory is empty (masked) until the first call.
            memory_mask = tf.Variable(
                tf.zeros(sig.memory_mask_shape(config, batch_size), tf.bool),
                trainable=False, name="memory_mask",
            )
            variables.append(memory_mask)
        functions = sig.stateful_signature_functions(
            model, memory, batch_size, segment_length,
            memory_mask_variable=memory_mask,
        )
        archive = saved_model.build_archive(model, functions, variables)
    else:
        functions = sig.signature_functions(
            model, batch_size, segment_length, checks=False,
            names=sig.TFLITE_SIGNATURES,
        )
        archive = saved_model.build_archive(model, functions)
    archive.write_out(directory, verbose=False)
    return tuple(functions)


def _vocabulary_list(tokenizer):
    """The tokens in id order (`get_vocabulary()` is a list, or a
    token -> id dict for keras-hub's byte tokenizer)."""
    vocabulary = tokenizer.get_vocabulary()
    if isinstance(vocabulary, dict):
        tokens = [None] * len(vocabulary)
        for token, index in vocabulary.items():
            tokens[int(index)] = token
        return tokens
    return [str(token) for token in vocabulary]


def write_vocabulary(tokenizer, directory: str) -> list:
    """Writes the tokenizer's vocabulary beside a TFLite model, for the app.

    A keras-txl tokenizer layer writes its own files
    (`keras_txl.tokenizers.export_vocabulary`: `vocabulary.txt`,
    `tokenizer_info.json`, and `vocabulary.spm` for SentencePiece); any
    other keras-hub tokenizer gets
    `vocabulary.json` (a JSON array: token i at index i, so any character,
    newlines and control bytes included, survives) and
    `vocabulary_info.json` ({"kind", "vocabulary_size", "end_token_id",
    "unknown_token_id", "pad_token_id"}; null where the tokenizer has none).

    Returns:
        list of the paths written.
    """
    from keras_txl.tokenizers import TransformerXLTokenizer
    from keras_txl.tokenizers import export_vocabulary

    if isinstance(tokenizer, TransformerXLTokenizer):
        before = set(os.listdir(directory))
        folder = export_vocabulary(tokenizer, directory)
        return sorted(str(folder / name) for name in set(os.listdir(folder)) - before
                      or ("vocabulary.txt", "tokenizer_info.json"))
    tokens = _vocabulary_list(tokenizer)
    size = tokenizer.vocabulary_size
    size = int(size() if callable(size) else size)
    if len(tokens) != size:
        raise ValueError(
            f"The tokenizer's get_vocabulary() holds {len(tokens)} tokens but "
            f"its vocabulary_size is {size}."
        )

    def token_id(*names):
        for name in names:
            value = getattr(tokenizer, name, None)
            if value is not None:
                return int(value)
        return None

    info = {
        "kind": type(tokenizer).__name__,
        "vocabulary_size": size,
        "vocabulary_file": VOCABULARY_FILE,
        "end_token_id": token_id("end_token_id"),
        "unknown_token_id": token_id("unknown_token_id", "unk_token_id"),
        "pad_token_id": token_id("pad_token_id"),
    }
    paths = []
    for name, content in ((VOCABULARY_FILE, tokens), (VOCABULARY_INFO_FILE, info)):
        path = os.path.join(directory, name)
        _write_bytes(path, (json.dumps(content, ensure_ascii=False, indent=None
                                       if name == VOCABULARY_FILE else 2)
                            + "\n").encode("utf-8"))
        paths.append(path)
    return paths


def side_file_names() -> tuple:
    """The names a TFLite export may write beside its .tflite files (the
    model's config, its tokenizer folder, the app's vocabulary files): no
    TFLite file's `<stem>.json`, and no SavedModel folder in the same
    `--out`, may take one of them."""
    from keras_txl.export.saved_model import CONFIG_FILE
    from keras_txl.export.saved_model import TOKENIZER_DIR
    from keras_txl.tokenizers import EXPORT_INFO_FILE
    from keras_txl.tokenizers import EXPORT_VOCABULARY_FILE
    from keras_txl.tokenizers import SENTENCEPIECE_ASSET

    return (CONFIG_FILE, TOKENIZER_DIR, EXPORT_VOCABULARY_FILE, EXPORT_INFO_FILE,
            SENTENCEPIECE_ASSET, VOCABULARY_FILE, VOCABULARY_INFO_FILE)


def _check_stems(out_paths):
    reserved = side_file_names()
    for path in out_paths.values():
        record = os.path.splitext(os.path.basename(path))[0] + ".json"
        if record in reserved:
            raise ValueError(
                f"The TFLite file {path} would write its export record to {record}, "
                f"one of the side files written beside it ({', '.join(reserved)}): "
                "name the file otherwise (`txl export --name`).")


def check_tflite_targets(out_paths):
    """A folder where a TFLite file or its export record goes is refused
    before anything is converted or written: it was an "[Errno 21] Is a
    directory" after the conversion (minutes), and with `txl export
    --format all --overwrite` after the SavedModel and the side files had
    been written."""
    for path in out_paths.values():
        stem = os.path.splitext(os.path.basename(path))[0]
        record = os.path.join(os.path.dirname(os.path.abspath(path)), f"{stem}.json")
        for target, what in ((path, "the TFLite file"), (record, "its export record")):
            if os.path.isdir(target):
                raise ValueError(
                    f"{target} is a folder, where {what} of {path} goes: refusing to "
                    "write over it, also with overwrite. Move it away, or name the "
                    "file otherwise (`txl export --name` or --out).")


def check_tflite_export(model, out_paths: dict, *, batch_size: int, segment_length: int,
                        stateful: bool = False, tokenizer_dir: str | None = None) -> None:
    """What `export_tflite_variants` refuses before it converts, checked
    without writing anything: a stateless model without memory, shapes
    beyond the caps, a file name whose record would replace a side file,
    and a folder holding another model's side files. `txl export --format
    all` calls it before the SavedModel is written, so that a refused
    TFLite export leaves no half-done export behind."""
    from keras_txl.export import saved_model

    checks.positive_int("batch_size", batch_size, allow_none=False)
    checks.positive_int("segment_length", segment_length, allow_none=False)
    _check_not_quantized(model)
    model = float32_model(saved_model.pure_model(model))
    _check_memory(model, stateful)
    _check_sizes(model.txl_config, batch_size, segment_length)
    _check_stems(out_paths)
    check_tflite_targets(out_paths)
    with tempfile.TemporaryDirectory(prefix="txl-tflite-check-") as tmp:
        _stage_side_files(model, tmp, tokenizer_dir)
        for directory in sorted({os.path.dirname(os.path.abspath(p))
                                 for p in out_paths.values()}):
            _check_side_files(tmp, directory)


def _check_sizes(config, batch_size, segment_length):
    """A TFLite model's fixed shapes within the SavedModel's default caps
    (a memory of `signatures.MAX_MEMORY_BYTES`, a call's activations of
    `MAX_REQUEST_BYTES`), before anything is allocated: a stateful model's
    memory variable is allocated while tracing (--batch-size 10**8 ran out
    of memory in TensorFlow), and the model runs on a device."""
    from keras_txl.export import signatures as sig

    memory = 4 * batch_size * config.num_layers * config.memory_length * config.hidden_dim
    activations = sig.request_bytes(config, batch_size, segment_length)
    for what, needed, most in (("memory", memory, sig.MAX_MEMORY_BYTES),
                               ("activations of one call", activations,
                                sig.MAX_REQUEST_BYTES)):
        if needed > most:
            raise ValueError(
                f"batch_size={batch_size} (--batch-size) and segment_length="
                f"{segment_length} (--segment-length) give the TFLite model "
                f"{needed / (1 << 30):.1f} GiB of {what}, more than "
                f"{most / (1 << 30):g} GiB: export a smaller batch or segment.")


def _check_memory(model, stateful):
    if not stateful and model.txl_config.memory_length == 0:
        # The memory input would be (B, L, 0, D): LiteRT refuses a tensor
        # with a 0-size dimension when the model runs ("Invalid tensor
        # size"), so the file would convert and never run.
        raise ValueError(
            "A stateless TFLite model needs memory_length >= 1 (its memory "
            "input and output would have a 0-size dimension, which LiteRT "
            "cannot run); this model has memory_length=0. Export it with "
            "stateful=True (`--stateful`), or with a memory (--memory-length)."
        )


def export_tflite_variants(
    model,
    out_paths: dict,
    *,
    batch_size: int,
    segment_length: int,
    stateful: bool = False,
    tokenizer_dir: str | None = None,
) -> dict:
    """Like `export_tflite` for several quantizations from one SavedModel.

    Args:
        out_paths: `{quantize: path}`, e.g. `{"none": "txl.tflite",
            "float16": "txl-float16.tflite"}`.
        Others: as for `export_tflite`.

    Returns:
        `out_paths`.
    """
    from keras_txl.export import saved_model

    checks.positive_int("batch_size", batch_size, allow_none=False)
    checks.positive_int("segment_length", segment_length, allow_none=False)
    unknown = sorted(set(out_paths) - set(QUANTIZATIONS))
    if unknown or not out_paths:
        raise ValueError(
            f"`quantize` must be one of {QUANTIZATIONS}, received "
            f"{unknown or 'nothing'}."
        )
    _check_not_quantized(model)
    model = float32_model(saved_model.pure_model(model))
    _check_memory(model, stateful)
    _check_sizes(model.txl_config, batch_size, segment_length)
    _check_stems(out_paths)
    check_tflite_targets(out_paths)
    directories = sorted({os.path.dirname(os.path.abspath(p)) for p in out_paths.values()})
    for directory in directories:
        os.makedirs(directory, exist_ok=True)
        remove_stale_temporaries(directory)
    # The SavedModel converted is as big as the model: staged in the output
    # folder under a name the next export there removes if this one is killed.
    with tempfile.TemporaryDirectory(dir=directories[0],
                                     prefix=temporary_prefix("tflite")) as tmp:
        # The side files first (cheap), so a folder holding another model's
        # is refused before the conversion (minutes), and nothing is written.
        side = os.path.join(tmp, "side")
        _stage_side_files(model, side, tokenizer_dir)
        for directory in directories:
            _check_side_files(side, directory)
        names = _tflite_saved_model(
            _id_level(model), os.path.join(tmp, "model"), batch_size, segment_length,
            stateful)
        contents = {
            q: convert_saved_model(os.path.join(tmp, "model"), names, q)
            for q in out_paths
        }
        for directory in directories:
            _copy_side_files(side, directory)
    config = json.loads(model.txl_config.to_json())
    for quantize, path in out_paths.items():
        _write_bytes(path, contents[quantize])
        info = saved_model.export_info(
            model, batch_size=batch_size, segment_length=segment_length,
            stateful=stateful, names=names, quantize=quantize,
            tflite_file=os.path.basename(path), config=config,
        )
        directory = os.path.dirname(os.path.abspath(path))
        stem = os.path.splitext(os.path.basename(path))[0]
        _write_bytes(os.path.join(directory, f"{stem}.json"),
                     (json.dumps(info, indent=2, sort_keys=True) + "\n").encode())
        # DEBUG: a library call returns its paths; `txl export` prints them.
        logger.debug(
            "TFLite model written to %s: %d bytes, quantize=%s, stateful=%s",
            path, len(contents[quantize]), quantize, stateful,
        )
    return out_paths


def _stage_side_files(model, staging, tokenizer_dir):
    """What goes beside the .tflite files, written into `staging`:
    config.json, tokenizer/ (when given) and the app's vocabulary files."""
    from keras_txl.export import saved_model

    saved_model.write_side_files(staging, model, tokenizer_dir=tokenizer_dir)
    tokenizer = getattr(getattr(model, "preprocessor", None), "tokenizer", None)
    if tokenizer is not None:
        write_vocabulary(tokenizer, staging)


def _staged_files(staging):
    for root, _, files in os.walk(staging):
        for name in files:
            yield os.path.relpath(os.path.join(root, name), staging)


def _check_side_files(staging, directory):
    """Refuses a folder whose config.json, tokenizer/ or vocabulary files
    belong to another model or tokenizer.

    Several TFLite files share their folder's side files (the quantizations
    and variants of one model do). Overwriting them for another model would
    leave the first model's .tflite beside a config and vocabulary that are
    not its own, which an app would read without knowing.
    """
    from keras_txl.export.saved_model import TOKENIZER_DIR

    differing = sorted(
        rel for rel in _staged_files(staging)
        if os.path.isfile(os.path.join(directory, rel))
        and not filecmp.cmp(os.path.join(staging, rel), os.path.join(directory, rel),
                            shallow=False)
    )
    theirs = os.path.join(directory, TOKENIZER_DIR)
    if os.path.isdir(theirs) and os.path.isdir(os.path.join(staging, TOKENIZER_DIR)):
        ours = set(_staged_files(os.path.join(staging, TOKENIZER_DIR)))
        differing += sorted(
            os.path.join(TOKENIZER_DIR, rel) for rel in _staged_files(theirs)
            if rel not in ours)
    if differing:
        raise ValueError(
            f"The folder {directory} already holds {', '.join(differing)} of another "
            "model or tokenizer, which a TFLite export writes beside its .tflite "
            "file for the app: overwriting them would leave the models already "
            "there with side files that are not theirs. Export into another "
            "folder (`txl export --out`), or remove that model's files first."
        )


def _copy_side_files(staging, directory):
    for rel in _staged_files(staging):
        with open(os.path.join(staging, rel), "rb") as f:
            _write_bytes(os.path.join(directory, rel), f.read())


def _id_level(model):
    """`model` without its preprocessor, for the TFLite conversion: the
    TFLite signatures take ids, and a tokenizer tracked with the model
    brings its lookup tables (HashTableV2, not a builtin op: the char and
    word tokenizers' exports failed in the converter). The vocabulary
    travels beside the .tflite file instead (`write_vocabulary`)."""
    if getattr(model, "preprocessor", None) is None:
        return model
    copy = type(model)(model.txl_config, dtype=model.dtype_policy.name)
    copy.assign_weights_from(model)
    return copy


def _check_not_quantized(model):
    """A model quantized in Keras (`model.quantize("int8")`, "int4",
    "float8"), refused by name: its int8 kernels reached the converter as a
    `tfl.fully_connected` of int8 operands, hundreds of lines of MLIR
    (with a preprocessor, "assign_weights_from() needs a model with the
    same architecture" from the id-level copy). Its dequantized kernels
    would not give its outputs (Keras' int8 layers quantize their inputs
    too), so there is nothing exact to export."""
    layers = getattr(model, "_flatten_layers", None)
    if layers is None:
        return
    quantized = [layer for layer in layers(include_self=False)
                 if getattr(getattr(layer, "dtype_policy", None), "quantization_mode", None)]
    if not quantized:
        return
    modes = sorted({layer.dtype_policy.quantization_mode for layer in quantized})
    names = [getattr(layer, "path", layer.name) for layer in quantized]
    shown = names[:4] + (["..."] if len(names) > 4 else [])
    raise ValueError(
        f"TFLite export of a model quantized in Keras (model.quantize({modes[0]!r}): "
        f"{len(names)} layers in {', '.join(modes)} mode, {shown}) is not supported: "
        "TFLite's builtin kernels and converter take the float graph. Export the float "
        "model with `quantize=\"dynamic_int8\"` (TFLite's own int8 weights; `txl export "
        "--quantize dynamic_int8`) or \"float16\"; the Keras-quantized model itself "
        "exports as a SavedModel (`export_saved_model`, `--format saved_model`), whose "
        "signatures give its outputs.")


def float32_model(model):
    """`model`, or a float32 copy of a mixed-precision one.

    TFLite's builtin kernels compute in float32 (its float16 and int8
    variants are quantizations of a float32 graph, `quantize=`); a
    bfloat16 graph would need TF Select ops, which the builtin-only
    conversion refuses with hundreds of lines of MLIR. A mixed-precision
    model's variables are float32 already, so the copy holds the same
    weights and computes in float32."""
    policy = model.dtype_policy
    if policy.compute_dtype == "float32":
        return model
    if policy.variable_dtype != "float32":
        raise ValueError(
            f"TFLite export needs float32 weights; this model's dtype policy is "
            f"{policy.name!r} (variables in {policy.variable_dtype}). Rebuild it "
            'with dtype="float32" and its weights first.'
        )
    logger.info("TFLite computes in float32: exporting a float32 copy of the %s "
                "model (same float32 weights).", policy.name)
    copy = type(model)(model.txl_config, preprocessor=model.preprocessor, dtype="float32")
    copy.assign_weights_from(model)
    return copy


def export_tflite(
    model,
    out_path: str,
    *,
    batch_size: int,
    segment_length: int,
    quantize: str = "none",
    stateful: bool = False,
    tokenizer_dir: str | None = None,
) -> str:
    """Converts `model` to a builtin-only TFLite file with fixed B and T.

    Also writes, in the folder of `out_path`, `config.json` (the model
    config), `<stem>.json` (shapes, signatures, quantization) and
    `tokenizer/` if given.

    Args:
        model: `TransformerXLCausalLM`.
        out_path: str. The .tflite file.
        batch_size: int. B, fixed.
        segment_length: int. T, fixed.
        quantize: "none", "float16" or "dynamic_int8".
        stateful: bool. Memory in a resource variable (signatures without
            `memory`, plus `reset`).
        tokenizer_dir: str or None.

    Returns:
        str. `out_path`.

    Raises:
        ValueError: bad arguments or non-builtin ops after conversion.
    """
    if quantize not in QUANTIZATIONS:
        raise ValueError(
            f"`quantize` must be one of {QUANTIZATIONS}, received {quantize!r}."
        )
    export_tflite_variants(
        model, {quantize: out_path}, batch_size=batch_size,
        segment_length=segment_length, stateful=stateful,
        tokenizer_dir=tokenizer_dir,
    )
    return out_path


# --- running -----------------------------------------------------------------


class TFLiteRunner:
    """Runs an exported TFLite model through `ai_edge_litert` with checks.

    Works with both variants. `step(token_ids)` keeps the memory between
    calls (in Python for the stateless model, inside the model for the
    stateful one) and `reset()` starts a new text. A model exported with
    `empty_memory="masked"` takes and returns a `memory_mask` (B, M) bool
    beside the memory (`memory_mask_shape` is then set, else None): the
    runner carries it with the memory (`self.memory_mask`), all False
    after `reset()`.

    Args:
        model_path: str, or pass `model_content` (bytes) instead.
        num_threads: int or None.
        use_xnnpack: bool. False runs the builtin kernels without the
            default XNNPACK delegate.

    Example:
    ```python
    runner = TFLiteRunner("txl.tflite")
    runner.reset()
    for segment in segments:            # each (B, T) int32
        log_probs = runner.step(segment)
    ```
    """

    def __init__(
        self, model_path=None, *, model_content=None, num_threads=None,
        use_xnnpack=True,
    ):
        from ai_edge_litert.interpreter import Interpreter
        from ai_edge_litert.interpreter import OpResolverType

        if (model_path is None) == (model_content is None):
            raise ValueError("Pass exactly one of `model_path` or `model_content`.")
        kwargs = {}
        if not use_xnnpack:
            kwargs["experimental_op_resolver_type"] = (
                OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
            )
        what = ("`model_content`" if model_path is None
                else f"`model_path` {os.fspath(model_path)!r}")
        try:
            self.interpreter = Interpreter(
                model_path=model_path, model_content=model_content,
                num_threads=num_threads, **kwargs,
            )
        except ValueError as error:  # LiteRT names neither the file nor the argument
            raise ValueError(
                f"{what} is not a TFLite model (LiteRT: {error}); pass a .tflite file "
                "that export_tflite or `txl export --format tflite` wrote."
            ) from None
        self.signature_names = sorted(self.interpreter.get_signature_list())
        if SERVING_DEFAULT not in self.signature_names:
            raise ValueError(
                f"{what}: not a keras-txl TFLite model: no {SERVING_DEFAULT!r} "
                f"signature (found {self.signature_names})."
            )
        self._runners = {
            n: self.interpreter.get_signature_runner(n) for n in self.signature_names
        }
        self._inputs = {
            n: {k: (tuple(int(d) for d in v["shape"]), np.dtype(v["dtype"]))
                for k, v in r.get_input_details().items()}
            for n, r in self._runners.items()
        }
        self.stateful = RESET in self.signature_names
        outputs = self._runners[SERVING_DEFAULT].get_output_details()
        self.batch_size, self.segment_length, self.vocabulary_size = (
            int(d) for d in outputs[LOG_PROBS]["shape"]
        )
        if self.stateful:
            reset = self._runners[RESET].get_output_details()
            shape = reset[MEMORY]["shape"]
            mask = reset[MEMORY_MASK]["shape"] if MEMORY_MASK in reset else None
        else:
            shape = self._inputs[SERVING_DEFAULT][MEMORY][0]
            mask = self._inputs[SERVING_DEFAULT].get(MEMORY_MASK, (None,))[0]
        self.memory_shape = tuple(int(d) for d in shape)
        # (B, M) when the model carries the memory's validity, else None.
        self.memory_mask_shape = (None if mask is None
                                  else tuple(int(d) for d in mask))
        self.memory = None
        self.memory_mask = None

    def input_details(self, signature_name: str) -> dict:
        """`{input: (shape, numpy dtype)}` of a signature."""
        self._check_signature(signature_name)
        return dict(self._inputs[signature_name])

    def _check_signature(self, name):
        if name not in self._runners:
            raise ValueError(
                f"Unknown signature {name!r}; this model has {self.signature_names}."
            )

    def _prepare(self, signature_name, name, value, shape, dtype):
        array = np.asarray(value)
        if dtype.kind == "b":
            if array.dtype.kind != "b":
                # 0/1 or a float mask is refused rather than cast, as the
                # Keras model refuses it.
                raise ValueError(
                    f"`{name}` must be a bool array of shape {shape}, True where "
                    "a memory slot holds real memory (pass the memory_mask "
                    "returned with the memory), received dtype "
                    f"{array.dtype.name}."
                )
        elif dtype.kind in "iu":
            if array.dtype.kind not in "iu":
                raise ValueError(
                    f"`{name}` must be an integer array ({dtype.name}), received "
                    f"dtype {array.dtype.name}."
                )
        elif array.dtype.kind != "f":
            raise ValueError(
                f"`{name}` must be a float array ({dtype.name}), received "
                f"dtype {array.dtype.name}."
            )
        if array.shape != shape:
            raise ValueError(
                f"`{name}` must have shape {shape} for this TFLite model "
                f"(B and T are fixed at export), received {array.shape}."
            )
        if name in (TOKEN_IDS, TARGETS) and array.size and (
            array.min() < 0 or array.max() >= self.vocabulary_size
        ):
            raise ValueError(
                f"`{name}` must be in [0, vocabulary_size={self.vocabulary_size}), "
                f"received values in [{array.min()}, {array.max()}]."
            )
        if name == MEMORY:
            # Checked after the cast: a float64 1e39 is finite before it and
            # Inf after.
            return np.ascontiguousarray(checks.finite_float32(
                "memory", array, hint="pass the memory returned by the previous "
                "call or initial_memory()."))
        return np.ascontiguousarray(array, dtype=dtype)

    def run(self, signature_name: str, **inputs) -> dict:
        """Runs one signature after checking every input.

        Raises:
            ValueError: unknown signature, missing/extra inputs, wrong dtype
                or shape, ids outside [0, V), non-finite memory.
        """
        self._check_signature(signature_name)
        expected = self._inputs[signature_name]
        missing = sorted(set(expected) - set(inputs))
        extra = sorted(set(inputs) - set(expected))
        if missing or extra:
            raise ValueError(
                f"Signature {signature_name!r} takes inputs {sorted(expected)}; "
                f"missing {missing}, unexpected {extra}."
            )
        feed = {
            k: self._prepare(signature_name, k, v, *expected[k])
            for k, v in inputs.items()
        }
        out = self._runners[signature_name](**feed)
        return {k: np.array(v, copy=True) for k, v in out.items()}

    # --- memory-carrying helpers -------------------------------------------
    def initial_memory(self) -> np.ndarray:
        """Zeros of the model's (B, L, M, D)."""
        return np.zeros(self.memory_shape, np.float32)

    def initial_memory_mask(self):
        """All False of the model's (B, M) (an empty memory's slots are
        masked), or None for a model without a memory mask."""
        if self.memory_mask_shape is None:
            return None
        return np.zeros(self.memory_mask_shape, bool)

    def reset(self):
        """Start a new text: zero the memory and, for a masked model, mask
        every slot (Python-side or in the model)."""
        if self.stateful:
            self.run(RESET)
            self.memory = self.memory_mask = None
        else:
            self.memory = self.initial_memory()
            self.memory_mask = self.initial_memory_mask()

    def _call(self, signature_name, inputs, output):
        if self.stateful:
            return self.run(signature_name, **inputs)[output]
        if self.memory is None:
            self.reset()
        state = {MEMORY: self.memory}
        if self.memory_mask_shape is not None:
            state[MEMORY_MASK] = self.memory_mask
        out = self.run(signature_name, **state, **inputs)
        self.memory = out[MEMORY]
        self.memory_mask = out.get(MEMORY_MASK)
        return out[output]

    def step(self, token_ids) -> np.ndarray:
        """(B, T, V) log-probs of one segment; the memory is carried."""
        return self._call(SERVING_DEFAULT, {TOKEN_IDS: token_ids}, LOG_PROBS)

    def score(self, token_ids, targets) -> np.ndarray:
        """(B, T) NLL of `targets`; the memory is carried."""
        return self._call(SCORE, {TOKEN_IDS: token_ids, TARGETS: targets}, NLL)

    def next_token(self, token_ids) -> np.ndarray:
        """(B, V) log-probs of the token after the segment; memory carried."""
        return self._call(NEXT_TOKEN, {TOKEN_IDS: token_ids}, LOG_PROBS)


def run_tflite(model_path: str, token_ids, *, num_threads=None) -> np.ndarray:
    """Log-probs of a long (B, n*T) id array, segment by segment.

    Starts from zero memory (`reset`), feeds the n segments of the model's
    fixed T in order with the memory carried, and concatenates the results.

    Returns:
        (B, n*T, V) float32.
    """
    runner = TFLiteRunner(model_path, num_threads=num_threads)
    token_ids = np.asarray(token_ids)
    T = runner.segment_length
    if token_ids.ndim != 2 or not token_ids.shape[1] or token_ids.shape[1] % T:
        raise ValueError(
            f"`token_ids` must be (batch, n * segment_length), n >= 1 segments of "
            f"the model's segment_length={T}, received shape {token_ids.shape}."
        )
    runner.reset()
    pieces = [
        runner.step(token_ids[:, s : s + T]) for s in range(0, token_ids.shape[1], T)
    ]
    return np.concatenate(pieces, axis=1)
