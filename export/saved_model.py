"""Export a `TransformerXLCausalLM` as a TF Serving SavedModel.

Layout written by `export_saved_model(model, out_dir, name="txl", version=1)`:

    <out_dir>/txl/1/saved_model.pb, variables/     the four signatures
    <out_dir>/txl/1/assets.extra/config.json       the model config
    <out_dir>/txl/1/assets.extra/export.json       shapes, signatures, versions
    <out_dir>/txl/1/assets.extra/tokenizer/        the tokenizer folder, if any
    <out_dir>/txl/1/assets.extra/tf_serving_warmup_requests

`<out_dir>/txl` is TF Serving's model base path. The version folder is
built under a temporary name and renamed when complete, so a server that
polls the base path never loads a half-written version.

Signatures: see `export/signatures.py` (serving_default, initial_memory,
score, next_token; batch-first memory (B, L, M, D)). A model with a
preprocessor (a tokenizer whose tokenize/detokenize are graph ops) also
gets `generate` and `generate_from_memory`: strings in, continuations and
the new memory out, the whole decoding loop inside the graph.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile

import keras
import tensorflow as tf

from keras_txl import checks
from keras_txl.export import serving
from keras_txl.export import signatures as sig
from keras_txl.folders import PRESET_TOKENIZER_FILE
from keras_txl.safe_files import default_mode
from keras_txl.safe_files import left_by_a_killed_process
from keras_txl.safe_files import remove_path
from keras_txl.safe_files import remove_stale_temporaries
from keras_txl.safe_files import temporary_prefix

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
EXPORT_INFO_FILE = "export.json"
TOKENIZER_DIR = "tokenizer"






def pure_model(model):
    """`model`, or a non-stateful copy of it (signatures never use the
    stateful memory variable, and it must not be saved with them)."""
    if not hasattr(model, "call_with_memory") or not hasattr(model, "txl_config"):
        raise ValueError(
            "Expected a keras_txl.TransformerXLCausalLM, received "
            f"{type(model).__name__}."
        )
    if getattr(model, "stateful", False):
        return model.with_settings(stateful=False)
    return model


def build_archive(model, functions: dict, variables=None):
    """A `keras.export.ExportArchive` with one endpoint per signature.

    Args:
        model: the Keras model whose variables the functions use.
        functions: `{name: (fn, [TensorSpec])}` from `export/signatures.py`.
        variables: optional list of extra `tf.Variable`s (the stateful
            memory) to save with the model.
    """
    archive = keras.export.ExportArchive()
    archive.track(model)
    if variables:
        archive.add_variable_collection("state", list(variables))
    for name, (function, specs) in functions.items():
        archive.add_endpoint(name, function, input_signature=specs)
    return archive


def write_side_files(directory, model, *, tokenizer_dir=None, info=None):
    """config.json (+ export.json, tokenizer/) into `directory`."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, CONFIG_FILE), "w") as f:
        f.write(model.txl_config.to_json() + "\n")
    if info is not None:
        with open(os.path.join(directory, EXPORT_INFO_FILE), "w") as f:
            json.dump(info, f, indent=2, sort_keys=True)
            f.write("\n")
    if tokenizer_dir is not None:
        if not os.path.isdir(tokenizer_dir):
            raise ValueError(
                f"`tokenizer_dir`={tokenizer_dir!r} is not a folder."
            )
        target = os.path.join(directory, TOKENIZER_DIR)
        if os.path.isfile(os.path.join(tokenizer_dir, CONFIG_FILE)):
            # A whole model preset (`txl train`'s WORKDIR/model holds its
            # tokenizer beside the weights): only the tokenizer's own files
            # (keras-hub's tokenizer.json and assets/tokenizer/) belong in
            # the export, not the model's weights.
            os.makedirs(target, exist_ok=True)
            shutil.copy2(os.path.join(tokenizer_dir, PRESET_TOKENIZER_FILE), target)
            assets = os.path.join(tokenizer_dir, "assets", "tokenizer")
            if os.path.isdir(assets):
                shutil.copytree(assets, os.path.join(target, "assets", "tokenizer"),
                                dirs_exist_ok=True)
        else:
            shutil.copytree(tokenizer_dir, target, dirs_exist_ok=True)


def _json_table(table):
    return {
        name: {
            part: {k: {"dtype": d, "shape": list(s)} for k, (d, s) in io.items()}
            for part, io in entry.items()
        }
        for name, entry in table.items()
    }


def export_info(model, *, batch_size, segment_length, stateful=False,
                names=None, **extra):
    """The export.json manifest: shapes, signatures and versions."""
    import keras_txl

    config = model.txl_config
    table = sig.signature_table(
        config, batch_size, segment_length, stateful=stateful,
        names=names,
    )
    if sig.masked_memory(config):
        # What a client must send with every memory (the signatures take
        # and return it; the stateful TFLite model keeps it inside).
        extra = {
            "memory_mask_layout": "(batch, memory_length) bool, True where a "
            "memory slot holds real memory (empty_memory='masked': "
            "initial_memory's slots are all False)",
            "memory_mask_shape": list(sig.memory_mask_shape(config, batch_size)),
            **extra,
        }
    return {
        "format": "keras-txl",
        "keras_txl_version": keras_txl.__version__,
        "tensorflow_version": tf.__version__,
        "keras_version": keras.__version__,
        "batch_size": batch_size,
        "segment_length": segment_length,
        "memory_layout": "(batch, num_layers, memory_length, hidden_dim)",
        "memory_shape": list(sig.memory_shape(model.txl_config, batch_size)),
        "signatures": _json_table(table),
        **extra,
    }


def has_generate(model):
    """True when `model` has a preprocessor with a tokenizer and a memory:
    its SavedModel then gets the text-level `generate` signatures. Their
    loop reads the context through the memory (one token per step), so a
    model with memory_length=0 gets none (`keras_txl.checks.
    memory_for_generation`), with a warning."""
    preprocessor = getattr(model, "preprocessor", None)
    if getattr(preprocessor, "tokenizer", None) is None:
        return False
    if model.txl_config.memory_length == 0:
        logger.warning(
            "No generate signatures: this model has memory_length=0, and generation "
            "reads its context through the memory (each new token would see only "
            "itself). Export with a memory (txl export --memory-length N, or "
            "model.with_settings(memory_length=N)) to get them.")
        return False
    return True


def write_saved_model(
    model,
    directory,
    *,
    batch_size=None,
    segment_length=None,
    checks=True,
    names=sig.SAVED_MODEL_SIGNATURES,
    generate=None,
    max_request_bytes=None,
):
    """Writes the bare SavedModel (no side files) to `directory`.

    Args:
        generate: bool or None. Add the `generate` signatures (None: when
            the model has a preprocessor).
        max_request_bytes: int or None. The most one call may allocate
            (see `export_saved_model`); None: the defaults.
    """
    caps = {} if max_request_bytes is None else {
        "max_memory_bytes": max_request_bytes, "max_request_bytes": max_request_bytes}
    functions = sig.signature_functions(
        model, batch_size, segment_length, checks=checks, names=names, **caps
    )
    if generate is None:
        generate = has_generate(model)
    if generate:
        functions.update(sig.generate_functions(model))
    build_archive(model, functions).write_out(directory, verbose=False)
    return directory


def export_saved_model(
    model,
    out_dir: str,
    *,
    name: str = "txl",
    version: int = 1,
    batch_size: int | None = None,
    segment_length: int | None = None,
    tokenizer_dir: str | None = None,
    warmup: bool = True,
    overwrite: bool = False,
    max_request_bytes: int | None = None,
) -> str:
    """Exports `model` to `<out_dir>/<name>/<version>/` for TF Serving.

    Args:
        model: `TransformerXLCausalLM` (a stateful one is exported through
            a pure copy).
        out_dir: str. Parent of the model base path.
        name: str. Model name: the base path folder and TF Serving's
            `MODEL_NAME`.
        version: int > 0. Version folder.
        batch_size: int or None. Fix B in every signature; None = dynamic.
        segment_length: int or None. Fix T; None = dynamic.
        tokenizer_dir: str or None. Tokenizer folder copied to
            `assets.extra/tokenizer/`.
        warmup: bool. Write `assets.extra/tf_serving_warmup_requests`.
        overwrite: bool. Replace an existing version folder.
        max_request_bytes: int or None. The most one call of the id-level
            signatures may allocate: `initial_memory`'s memory, and the
            activations of `serving_default`/`score`/`next_token`
            (`signatures.request_bytes`, quadratic in the segment length);
            a larger request is refused before anything is allocated.
            None: 4 GiB of memory and 16 GiB of activations.

    Returns:
        str. The version folder.

    Raises:
        ValueError: bad arguments, or the version exists and not overwrite.
    """
    model = pure_model(model)
    if (not isinstance(name, str) or not name or os.sep in name or "\x00" in name
            or name in (".", "..")):
        raise ValueError(f"`name` must be a plain folder name, received {name!r}.")
    if tokenizer_dir is not None and not os.path.isdir(tokenizer_dir):
        # Before the (slow) tracing and before anything is written.
        raise ValueError(f"`tokenizer_dir`={tokenizer_dir!r} is not a folder.")
    checks.positive_int("version", version, allow_none=False)
    checks.positive_int("max_request_bytes", max_request_bytes, allow_none=True)
    if version >= 2**63:
        raise ValueError(
            f"`version` must be below 2**63 (TF Serving reads version folders as "
            f"int64 and would never serve this one), received {version}.")
    checks.positive_int("batch_size", batch_size, allow_none=True)
    checks.positive_int("segment_length", segment_length, allow_none=True)
    base = os.path.join(out_dir, name)
    final = os.path.join(base, str(version))
    check_version_path(base, final)
    if os.path.exists(final) and not overwrite:
        raise ValueError(
            f"{final} already exists; export a new `version` (TF Serving "
            "serves the highest) or pass overwrite=True."
        )
    os.makedirs(base, exist_ok=True)
    restore_moved_aside_versions(base)
    remove_stale_temporaries(base)
    # Not a number, so TF Serving ignores it while it is being written; the
    # writer's process and host in the name, so a later export can tell a
    # killed one's leftovers from a running one's.
    staging = tempfile.mkdtemp(prefix=temporary_prefix(version), dir=base)
    old = None  # the version being replaced, while it is moved aside
    try:
        generate = has_generate(model)
        write_saved_model(
            model, staging, batch_size=batch_size, segment_length=segment_length,
            generate=generate, max_request_bytes=max_request_bytes,
        )
        extra = os.path.join(staging, serving.ASSETS_EXTRA)
        names = sig.SAVED_MODEL_SIGNATURES + (
            sig.GENERATE_SIGNATURES if generate else ()
        )
        info = export_info(
            model, batch_size=batch_size, segment_length=segment_length,
            names=names, model_name=name, version=version,
            request_caps={
                "max_memory_bytes": max_request_bytes or sig.MAX_MEMORY_BYTES,
                "max_request_bytes": max_request_bytes or sig.MAX_REQUEST_BYTES},
            **({"generate_caps": {
                "max_new_tokens": sig.MAX_NEW_TOKENS_CAP,
                "max_prompt_tokens": sig.MAX_PROMPT_TOKENS,
                "max_batch_size": sig.MAX_GENERATE_BATCH,
            }} if generate else {}),
        )
        write_side_files(extra, model, tokenizer_dir=tokenizer_dir, info=info)
        if warmup:
            prompt = serving.WARMUP_PROMPT
            if generate:
                prompt = serving.warmup_prompt(model.preprocessor.tokenizer)
                if prompt is None:
                    # A warm-up request that fails keeps TF Serving from
                    # loading the version: none for these signatures.
                    logger.warning(
                        "No warm-up requests for the generate signatures: the "
                        "tokenizer reads neither %r nor the text of its first "
                        "ids.", serving.WARMUP_PROMPT)
            inputs = serving.warmup_inputs(
                model.txl_config, batch_size, segment_length,
                generate=generate and prompt is not None,
                prompt=prompt or serving.WARMUP_PROMPT,
            )
            requests = [
                serving.make_predict_request(name, signature, values)
                for signature, values in inputs.items()
            ]
            serving.write_warmup_file(
                os.path.join(extra, serving.WARMUP_FILE), requests
            )
        os.chmod(staging, default_mode(directory=True))
        if os.path.lexists(final):
            # The old version moves aside (a non-numeric name, which TF
            # Serving ignores) and the new one takes its name at once: a
            # server polling the base path never finds the version missing
            # or half there. A failed rename below puts the old version
            # back; a kill in between leaves it under a name the next export
            # renames back (`restore_moved_aside_versions`).
            old = tempfile.mkdtemp(prefix=temporary_prefix(f"{version}{OLD_TAG}"), dir=base)
            os.rmdir(old)
            os.rename(final, old)
        os.rename(staging, final)
        moved, old = old, None
        if moved is not None:
            remove_path(moved)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if old is not None and not os.path.lexists(final):
            try:
                os.rename(old, final)
            except OSError:
                logger.error("The previous version %s is in %s: the export failed "
                             "before the new one was in place.", final, old)
        raise
    logger.debug("SavedModel written to %s", final)  # `txl export` prints it
    return final


# The tag of the temporary name an overwritten version is moved aside to.
OLD_TAG = "_old"
_MOVED_ASIDE = re.compile(r"^\.tmp-(\d+)" + OLD_TAG + "-")


def restore_moved_aside_versions(base: str) -> list:
    """Renames back the versions an export killed while overwriting them
    left aside: `.tmp-<version>_old-...` of a dead process of this host,
    when no folder `<version>` took its place (the kill came between moving
    the old version aside and renaming the new one in). Returns the versions
    restored. Run before `remove_stale_temporaries`, which would delete them."""
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        return []
    restored = []
    for entry in entries:
        match = _MOVED_ASIDE.match(entry)
        if not match or not left_by_a_killed_process(entry):
            continue
        final = os.path.join(base, str(int(match.group(1))))
        if os.path.lexists(final):
            continue  # the new version is in place: a leftover
        try:
            os.rename(os.path.join(base, entry), final)
        except OSError:
            continue
        logger.warning("Restored %s, moved aside by an export that was killed "
                       "while overwriting it.", final)
        restored.append(final)
    return restored


def check_version_path(base: str, final: str, flags=("`version`", "`name`")) -> None:
    """A ValueError, before anything is written, when the model base path
    `base` or the version `final` is a file or a symbolic link.

    An export writes version folders only: `overwrite` moved a file (or a
    link) at the version aside under a `.tmp-` name and left it there (it
    removed the old version as a folder), and a file at the base path was
    an "[Errno 17] File exists" after the model was traced. `flags`: the
    names of the version and the model name for the message (the CLI's
    `--version` and `--name`).
    """
    for path, flag in ((base, flags[1]), (final, flags[0])):
        if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
            kind = "a symbolic link" if os.path.islink(path) else "a file"
            what = "version" if path == final else "model base path"
            raise ValueError(
                f"{path} is {kind}, not a SavedModel {what} folder: refusing to "
                f"write over it, also with overwrite. Move it away, or choose "
                f"another {flag}.")


def load_config(version_dir: str):
    """The `TransformerXLConfig` saved with an export."""
    from keras_txl.config import TransformerXLConfig

    path = os.path.join(version_dir, serving.ASSETS_EXTRA, CONFIG_FILE)
    if not os.path.exists(path):
        raise ValueError(f"No {path}: not a keras-txl SavedModel export.")
    return TransformerXLConfig.from_json(path)
