"""What a model folder is, checked before anything is built from it.

Shared by `keras_txl.io` (which loads every layout) and
`TransformerXLCausalLM.from_preset` (keras-hub presets): the layout of a
folder, its config within `keras_txl.limits`, and the files keras-hub will
read, present and bounded.
"""

import copy
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time

from keras_txl.config import TransformerXLConfig
from keras_txl.config import shown
from keras_txl.limits import check_config
from keras_txl.safe_files import atomic_write_bytes
from keras_txl.safe_files import default_mode
from keras_txl.safe_files import folder_path
from keras_txl.safe_files import open_regular_file
from keras_txl.safe_files import read_json
from keras_txl.safe_files import remove_stale_temporaries
from keras_txl.safe_files import resolve_inside
from keras_txl.safe_files import temporary_prefix

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_DIR = "tokenizer"
# keras-hub's preset files (keras_hub.src.utils.preset_utils).
PRESET_WEIGHTS_FILE = "model.weights.h5"
PRESET_TASK_FILE = "task.json"
PRESET_TOKENIZER_FILE = "tokenizer.json"
PRESET_PREPROCESSOR_FILE = "preprocessor.json"
# keras-hub's sharded weights (`save_to_preset(..., max_shard_size=...)`): an
# index naming the `model_NNNNN.weights.h5` shards, in place of the one file.
PRESET_SHARD_INDEX = "model.weights.json"
# The size and sha256 of every file of a model folder keras-txl wrote.
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "keras-txl-model-folder"
_LOADED = re.compile(r"[^/]+\.(json|h5|safetensors)|(assets|tokenizer)/.+")
# Keys of a keras-hub backbone config that are not TransformerXLConfig fields.
_LAYER_KEYS = ("name", "trainable", "dtype")

logger = logging.getLogger(__name__)


def folder_format(directory, limits=None):
    """"keras-hub", "keras-txl" or "hugging-face": the layout of a folder.

    Raises:
        ValueError: no folder, or no readable `config.json` holding a JSON
            object in it.
    """
    directory = folder_path(directory)
    if not os.path.isdir(directory):
        raise ValueError(f"{directory!r} is not a folder (a model preset was expected).")
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.lexists(path):
        raise ValueError(
            f"No {CONFIG_FILE} in {directory!r}: not a model folder (a keras-hub "
            "preset, a keras-txl folder or a Hugging Face TransfoXL folder)."
        )
    data = read_json(path, limits)
    if not isinstance(data, dict):
        raise ValueError(
            f"{path} must be a JSON object (a keras-hub backbone config, a keras-txl "
            "TransformerXLConfig or a Hugging Face TransfoXL config), received "
            f"{type(data).__name__}: not a model folder's config."
        )
    if "class_name" in data and "config" in data:
        return "keras-hub"
    if data.get("model_type") == "transfo-xl" or "n_token" in data or "d_model" in data:
        return "hugging-face"
    return "keras-txl"


# What `txl train` writes in a workdir beside its model folder (whose
# config.json is the run's model config, and holds no weights).
_WORKDIR_MARKERS = ("train_config.json", "checkpoints")


def refuse_training_workdir(directory):
    """A ValueError naming the model folder when the loaders are given a
    `txl train` workdir (no weights file of its own, what train writes
    beside model/) instead of its model folder."""
    directory = folder_path(directory)
    weights = (WEIGHTS_FILE, PRESET_WEIGHTS_FILE, PRESET_SHARD_INDEX)
    if any(os.path.lexists(os.path.join(directory, name)) for name in weights):
        return
    if not any(os.path.lexists(os.path.join(directory, name)) for name in _WORKDIR_MARKERS):
        return
    model = os.path.join(directory, "model")
    if os.path.isdir(model):
        advice = (f"pass its model folder, {model!r} (`txl eval/generate/export --workdir "
                  f"{directory}` read it).")
    else:
        advice = (f"it has no model yet (no {model!r}): train first (`txl train --workdir "
                  f"{directory}`).")
    raise ValueError(
        f"{directory!r} is a training workdir (txl train), not a model folder: {advice}")


def load_config(directory, limits=None):
    """The checked `TransformerXLConfig` of a model folder.

    `config.json` must be a regular file of bounded size and depth, and the
    config must stay within `limits` (see `keras_txl.limits`).
    """
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.lexists(path):
        raise ValueError(
            f"No {CONFIG_FILE} in {directory!r}: not a keras-txl model folder."
        )
    data = read_json(path, limits)
    if isinstance(data, dict) and "class_name" in data and "config" in data:
        data = preset_fields(data, path)
    try:
        config = TransformerXLConfig.from_dict(data)
    except (TypeError, ValueError) as error:
        # The config's own message names the field, not the file.
        raise ValueError(f"{path}: {error}") from None
    check_config(config, limits, source=path)
    return config


def preset_fields(data, path):
    """The TransformerXLConfig fields of a keras-hub backbone config; its
    layer keys (name, trainable, dtype), which Keras and keras-hub read with
    errors that name neither the file nor, for a dtype that is no policy's
    config, the field, are checked here."""
    if data.get("class_name") != "TransformerXLBackbone":
        raise ValueError(
            f"{path} describes a {data.get('class_name')!r}, not a "
            "TransformerXLBackbone: not a keras-txl preset."
        )
    if not isinstance(data.get("config"), dict):
        raise ValueError(
            f"{path}: its \"config\" must be a JSON object of the backbone's "
            f"arguments, received {type(data.get('config')).__name__}: a damaged preset?"
        )
    _check_layer_keys(data["config"], path)
    fields = {k: v for k, v in data["config"].items() if k not in _LAYER_KEYS}
    fields.update(fields.pop("config", None) or {})  # keras-txl 0.1 nesting
    return fields


def _check_layer_keys(config, path):
    name, trainable = config.get("name", "backbone"), config.get("trainable", True)
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(
            f"{path}: \"name\" must be a non-empty string without \"/\", received "
            f"name={name!r}."
        )
    if not isinstance(trainable, bool):
        raise ValueError(
            f"{path}: \"trainable\" must be true or false, received trainable={trainable!r}."
        )
    # keras-hub reads a saved dtype as a serialized policy,
    # `{"class_name": ..., "config": {"name": "float32"}}`, or its absence.
    dtype = config.get("dtype")
    policy = dtype.get("config") if isinstance(dtype, dict) else None
    if (isinstance(policy, dict) and dtype.get("class_name") == "DTypePolicyMap"
            and dtype.get("module") == "keras.dtype_policies"
            and isinstance(policy.get("policy_map"), dict)):
        return  # a quantized model's (`quantize`), which keras-hub loads as it is
    if dtype is not None and not (isinstance(policy, dict)
                                  and isinstance(policy.get("name"), str)):
        raise ValueError(
            f"{path}: \"dtype\" must be a serialized Keras dtype policy "
            '({"class_name": "DTypePolicy", "config": {"name": "float32"}, ...}) '
            f"or absent, received dtype={dtype!r}."
        )


def sha256_file(path):
    """The hex sha256 of a file's bytes, read in blocks."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _folder_files(directory):
    """Relative paths of the files under `directory` a loader reads: the
    top level's JSON, HDF5 and safetensors files and everything under
    `assets/` (keras-hub's tokenizer files) or `tokenizer/` (a keras-txl
    folder's). Other files (a README, a hub cache's dot-files, the user's
    notes) are neither recorded nor checked."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            relative = os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/")
            if relative != MANIFEST_FILE and _LOADED.fullmatch(relative):
                found.append(relative)
    return found


def sha256_tree(path):
    """sha256 over a file, or over a folder's files (names and contents,
    in sorted order): what a workdir records of its tokenizer folder."""
    digest = hashlib.sha256()
    if os.path.isfile(path):
        files = [(os.path.basename(path), path)]
    else:
        files = []
        for root, dirs, names in os.walk(path):
            dirs.sort()
            for name in sorted(names):
                full = os.path.join(root, name)
                files.append((os.path.relpath(full, path), full))
    for name, full in files:
        digest.update(name.encode() + b"\0")
        with open(full, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def write_manifest(directory):
    """Writes `directory/manifest.json`: the size and sha256 of every file
    of the folder, so a loader notices a damaged or changed file (keras-hub
    presets and safetensors carry no checksum of their own). Written last
    and atomically; the folder's files must be complete."""
    files = {}
    for relative in _folder_files(directory):
        path = os.path.join(directory, relative)
        files[relative] = {"bytes": os.path.getsize(path), "sha256": sha256_file(path)}
    data = json.dumps({"format": MANIFEST_FORMAT, "files": files}, indent=1) + "\n"
    atomic_write_bytes(os.path.join(directory, MANIFEST_FILE), data.encode("utf-8"))


# The sha256s this process has checked, by file: `{real path: (stat key,
# sha256)}`. A model folder is verified more than once per load
# (`TransformerXLCausalLM.from_preset` checks it, then keras-hub's loader
# reads the weights through `TransformerXLBackbone.load_weights`, which
# checks again); a file whose device, inode, size, mtime and ctime are those
# it had when it matched is not read again. Any write changes the ctime
# (which, unlike the mtime, cannot be set back), a replacement the inode.
# As git does for its index, a file changed less than `_RACY_SECONDS` before
# it was hashed is not remembered: a later write within the same tick of
# the file system's clock (coarse; whole seconds on some file systems) could
# leave the same ctime.
_VERIFIED = {}
_RACY_SECONDS = 2.0


def _stat_key(path):
    stat = os.stat(path)
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def verify_manifest(directory, limits=None):
    """Checks a model folder against its `manifest.json`.

    Returns False for a folder without one (written by hand, by keras-hub's
    own `save_to_preset` or before keras-txl wrote manifests: nothing to
    check against), True when every listed file has its recorded size and
    sha256 and no unlisted file would be read.

    Raises:
        ValueError: naming the file that is missing, changed or unlisted,
            or the manifest if it is not one.
    """
    directory = os.fspath(directory)
    path = os.path.join(directory, MANIFEST_FILE)
    if not os.path.lexists(path):
        return False
    data = read_json(path, limits)
    files = data.get("files") if isinstance(data, dict) else None
    if (not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT
            or not isinstance(files, dict) or not all(
                isinstance(entry, dict) and isinstance(entry.get("bytes"), int)
                and isinstance(entry.get("sha256"), str) for entry in files.values())):
        raise ValueError(
            f"{path} is not a keras-txl manifest (expected {{\"format\": "
            f"\"{MANIFEST_FORMAT}\", \"files\": {{name: {{\"bytes\", \"sha256\"}}}}}})."
        )
    for relative, entry in sorted(files.items()):
        file = resolve_inside(directory, relative, f"file listed in {path}")
        if not os.path.lexists(file):
            raise ValueError(
                f"{file} is listed in {path} but missing: an incomplete copy of the folder?"
            )
        open_regular_file(file, f"file listed in {path}").close()  # not a FIFO, a device
        size = os.path.getsize(file)
        if size != entry["bytes"]:
            raise ValueError(
                f"{file} has {size} bytes, {path} says {entry['bytes']}: a truncated, "
                "damaged or changed file."
            )
        real, key = os.path.realpath(file), _stat_key(file)
        if _VERIFIED.get(real) == (key, entry["sha256"]):
            continue  # matched already, unchanged since
        started = time.time_ns()
        if sha256_file(file) != entry["sha256"]:
            raise ValueError(
                f"{file} does not match the sha256 in {path}: a damaged or changed "
                "file (written again without its manifest?)."
            )
        if key[-1] < started - _RACY_SECONDS * 1e9:
            _VERIFIED[real] = (key, entry["sha256"])
    unlisted = [name for name in _folder_files(directory) if name not in files]
    if unlisted:
        raise ValueError(
            f"{os.path.join(directory, unlisted[0])} is not listed in {path}: a file "
            "added after the folder was written would be loaded unchecked. Remove it, "
            f"or remove {MANIFEST_FILE} to load the folder without checksums."
        )
    return True


def check_preset_files(directory, limits):
    """Everything keras-hub will read, present and bounded, before loading,
    and matching the folder's manifest where it has one."""
    weights = os.path.join(directory, PRESET_WEIGHTS_FILE)
    index = os.path.join(directory, PRESET_SHARD_INDEX)
    if not os.path.lexists(weights):
        if not os.path.lexists(index):
            raise ValueError(
                f"The preset {directory!r} has no {PRESET_WEIGHTS_FILE} (its "
                f"weights) nor {PRESET_SHARD_INDEX} (the index of its weight "
                "shards): an incomplete copy?"
            )
        _check_shard_index(directory, index, limits)
    for name in sorted(os.listdir(directory)):
        # h5py would block on a FIFO and read a device as a file.
        if name.endswith(".weights.h5"):
            open_regular_file(os.path.join(directory, name), "weights file").close()
    for name in (PRESET_TASK_FILE, PRESET_PREPROCESSOR_FILE, PRESET_TOKENIZER_FILE):
        path = os.path.join(directory, name)
        if os.path.lexists(path):
            read_json(path, limits)
    if os.path.lexists(os.path.join(directory, PRESET_PREPROCESSOR_FILE)) and not (
        os.path.lexists(os.path.join(directory, PRESET_TOKENIZER_FILE))
    ):
        raise ValueError(
            f"The preset {directory!r} has a {PRESET_PREPROCESSOR_FILE} but no "
            f"{PRESET_TOKENIZER_FILE}: its tokenizer is missing."
        )
    task = os.path.join(directory, PRESET_TASK_FILE)
    if os.path.lexists(task):
        _check_task(task, load_config(directory, limits), limits)
    else:  # keras-hub builds the preprocessor from preprocessor.json
        preprocessor = os.path.join(directory, PRESET_PREPROCESSOR_FILE)
        if os.path.lexists(preprocessor):
            _check_task_preprocessor(read_json(preprocessor, limits), preprocessor)
    # Last: the specific checks above name what is wrong with a hand-made
    # or foreign folder; this one names a damaged or changed file.
    verify_manifest(directory, limits)


def _check_shard_index(directory, index, limits):
    """A sharded preset's index (keras-hub reads it when there is no
    `model.weights.h5`): a JSON object whose "weight_map" names, for each
    layer, shard files that are inside the folder, present and regular."""
    data = read_json(index, limits)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    names = set()
    for value in (weight_map.values() if isinstance(weight_map, dict) else ()):
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(name, str) for name in values):
            weight_map = None
            break
        names.update(values)
    if not names:
        raise ValueError(
            f"{index} is not an index of weight shards (a JSON object whose "
            '"weight_map" maps each layer to its shard files): a damaged preset?'
        )
    for name in sorted(names):
        path = resolve_inside(directory, name, f"shard named in {index}")
        if not os.path.lexists(path):
            raise ValueError(
                f"{index} names the weight shard {name!r}, which is not in the "
                f"preset {directory!r}: an incomplete copy?"
            )
        open_regular_file(path, "weights file").close()


def check_preset_weights(directory):
    """Every dataset in the preset's weights files must be floating point:
    Keras casts what it loads to the variable's dtype, which turns an int
    or bool tensor (a damaged or foreign file) into weights in silence."""
    import h5py

    from keras_txl.checks import WEIGHT_DTYPES

    allowed = set(WEIGHT_DTYPES)
    if saved_quantized(directory):
        allowed.add("int8")  # a quantized model's kernels (int4 ones packed in int8)
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".weights.h5"):
            continue
        path = os.path.join(directory, name)
        bad = []

        def visit(key, item, bad=bad):
            # (an optimizer's step counter is an integer by design)
            if (isinstance(item, h5py.Dataset) and not key.startswith("optimizer/")
                    and _stored_dtype(item) not in allowed):
                bad.append(f"{key} ({_stored_dtype(item)})")

        try:
            with h5py.File(path, "r") as handle:
                handle.visititems(visit)
        # h5py raises RuntimeError, KeyError or ValueError, not only
        # OSError, for a damaged symbol table or object header.
        except (OSError, RuntimeError, KeyError, ValueError) as error:
            raise ValueError(
                f"Could not read the preset {directory!r}: {path}: {error} (a "
                "missing, truncated or corrupted file?)") from None
        if bad:
            raise ValueError(
                f"{path}: {', '.join(bad[:3])}: a weight must be one of "
                f"{', '.join(WEIGHT_DTYPES)} (a damaged or foreign file?)."
            )


def _stored_dtype(dataset):
    """The dtype name of an HDF5 dataset Keras wrote: HDF5 has no bfloat16,
    so Keras stores one as 2-byte opaque data with the attribute
    dtype="bfloat16" (read back as bfloat16 by its loader)."""
    import numpy as np

    dtype = np.dtype(dataset.dtype)
    if dtype.kind == "V" and dtype.itemsize == 2 and dataset.attrs.get("dtype") == "bfloat16":
        return "bfloat16"
    return dtype.name


def saved_quantized(directory):
    """The serialized `DTypePolicyMap` a quantized model's preset holds as
    its dtype in `config.json` (as `quantize` leaves it), or None."""
    data = read_json(os.path.join(directory, CONFIG_FILE))
    dtype = data.get("config", {}).get("dtype") if isinstance(data, dict) else None
    if isinstance(dtype, dict) and dtype.get("class_name") == "DTypePolicyMap":
        return dtype
    return None


def saved_mixed_policy(directory):
    """The mixed policy's name (e.g. "mixed_bfloat16") a preset's
    `config.json` holds as its dtype, or None (read after `load_config`
    checked the file)."""
    data = read_json(os.path.join(directory, CONFIG_FILE))
    dtype = data.get("config", {}).get("dtype") if isinstance(data, dict) else None
    name = dtype.get("config", {}).get("name") if isinstance(dtype, dict) else dtype
    return name if isinstance(name, str) and name.startswith("mixed_") else None


def _check_task(path, config, limits):
    """keras-hub builds the task from `task.json`'s own copy of the backbone
    config, not from `config.json` (whose config `load_config` checked
    against the limits): the two must describe the same model, and a
    stateful task's memory must stay within the limits too."""
    from keras_txl.limits import resolve_limits

    data = read_json(path, limits)
    task = data.get("config") if isinstance(data, dict) else None
    backbone = task.get("backbone") if isinstance(task, dict) else None
    if not isinstance(backbone, dict) or not isinstance(backbone.get("config"), dict):
        raise ValueError(
            f"{path} holds no backbone config (a keras-hub task config with "
            '{"config": {"backbone": {...}}} was expected): a damaged preset?'
        )
    try:
        task_config = TransformerXLConfig.from_dict(preset_fields(backbone, path))
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: its backbone config is not valid: {error}") from None
    if task_config != config:
        theirs, ours = task_config.to_dict(), config.to_dict()
        field = next(k for k in ours if ours[k] != theirs.get(k))
        raise ValueError(
            f"{path} describes another model than {CONFIG_FILE} beside it "
            f"({field}={shown(theirs.get(field))} there, {shown(ours[field])} in "
            f"{CONFIG_FILE}): a damaged or hand-edited preset."
        )
    _check_task_preprocessor(task.get("preprocessor"), path)
    if task.get("stateful"):
        batch_size = task.get("batch_size")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(
                f"{path}: a stateful task needs a positive integer batch_size, "
                f"received batch_size={batch_size!r}."
            )
        size = batch_size * config.num_layers * config.memory_length * config.hidden_dim
        limit = resolve_limits(limits).max_parameters
        if size > limit:
            raise ValueError(
                f"{path}: the stateful task's memory would hold {size} numbers "
                f"(batch_size={batch_size}), more than the limit max_parameters="
                f"{limit} (keras_txl.limits)."
            )




def _check_task_preprocessor(preprocessor, path):
    """task.json's preprocessor (and its tokenizer), or preprocessor.json's
    in a preset without a task, which keras-hub builds from there: null, or
    Keras serializations of keras-txl classes that build. Another class, or
    a damaged entry, failed inside Keras with a TypeError naming neither
    the file nor the entry ("TransformerXLCausalLM could not be
    deserialized properly")."""
    if preprocessor is None:
        return
    config = preprocessor.get("config") if isinstance(preprocessor, dict) else None
    tokenizer = config.get("tokenizer") if isinstance(config, dict) else None
    for key, entry in (("preprocessor", preprocessor), ("preprocessor's tokenizer", tokenizer)):
        module = entry.get("module") if isinstance(entry, dict) else None
        if (not isinstance(module, str) or not module.startswith("keras_txl.")
                or not isinstance(entry.get("class_name"), str)
                or not isinstance(entry.get("config"), dict)):
            found = (f"module={module!r}, class_name={entry.get('class_name')!r}"
                     if isinstance(entry, dict) else f"{type(entry).__name__} {entry!r:.80}")
            raise ValueError(
                f"{path}: its {key} must be a serialized keras-txl layer "
                '({"module": "keras_txl....", "class_name": ..., "config": {...}}), '
                f"received {found}: a damaged or hand-edited preset?"
            )
    # keras-hub builds it inside its loader, where the constructor's error
    # (`sequence_length` must be a positive integer, an unknown keyword)
    # named an argument the user never passed, not the file it came from.
    # Built here without its vocabulary (`load_preset_assets` reads that).
    import keras

    try:
        keras.saving.deserialize_keras_object(copy.deepcopy(preprocessor))
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"{path}: its preprocessor cannot be built from it: {error} "
            "(a damaged or hand-edited preset?)"
        ) from None


HF_PREFIX = "hf://"


def check_hf_handle(preset):
    """Fails fast, naming the cause, where keras-hub's download of an `hf://`
    preset would not: `huggingface_hub` retries a file missing from its
    cache for ~25 s on a network error before keras-hub reports "Preset ...
    has no config.json" (the same words it uses offline, with
    `HF_HUB_OFFLINE` set). A preset in the Hugging Face cache is left to
    keras-hub (`huggingface_hub` uses the cached files when the Hub cannot
    be reached), as is every error the Hub itself answers (a repository
    that is missing, private or gated): only the reachability of the Hub
    is checked here, with one request of `huggingface_hub`'s own, without
    its retries.
    """
    try:
        import huggingface_hub
        from huggingface_hub import constants
        from huggingface_hub.errors import HfHubHTTPError
    except ImportError:
        return  # keras-hub says what to install
    repo_id = preset[len(HF_PREFIX):]
    try:
        cached = huggingface_hub.try_to_load_from_cache(repo_id, CONFIG_FILE)
    except Exception:  # not a repository id: keras-hub names the handle's form
        return
    if isinstance(cached, str):
        return
    where = f"the Hugging Face cache ({constants.HF_HUB_CACHE})"
    if huggingface_hub.is_offline_mode():
        raise ValueError(
            f"`preset` {preset!r} is not in {where}, and HF_HUB_OFFLINE is set: "
            "nothing can be downloaded. Download it where there is network access "
            "(unset HF_HUB_OFFLINE there) and pass its local folder, or copy that "
            "cache here."
        )
    try:
        huggingface_hub.get_hf_file_metadata(
            huggingface_hub.hf_hub_url(repo_id, CONFIG_FILE),
            timeout=constants.HF_HUB_ETAG_TIMEOUT,
        )
    except HfHubHTTPError:
        return  # the Hub answered: keras-hub reports what it said
    except Exception as error:  # no connection, a timeout: not the Hub's answer
        raise ValueError(
            f"Could not reach the Hugging Face Hub ({constants.ENDPOINT}) to "
            f"download `preset` {preset!r} ({type(error).__name__}: {error}), and it "
            f"is not in {where}. Without network access, download the preset where "
            "there is one and pass its local folder (set HF_HUB_OFFLINE=1 to use "
            "only the cache without trying the network)."
        ) from None


def is_local_preset(preset):
    """True when `preset` is a local folder (checked before keras-hub reads
    it), False for a keras-hub handle; a file is refused, naming its folder,
    and so is a path that leads to no folder (a dangling symbolic link, a
    link loop, a FIFO, or a missing path that no keras-hub handle can be:
    a `pathlib.Path`, or a str with a folder separator and no `scheme://`),
    which keras-hub reported as "Unknown preset identifier" with a list of
    handle forms."""
    if not isinstance(preset, (str, os.PathLike)):
        return False
    path = os.fspath(preset)
    if os.path.isfile(path):
        raise ValueError(
            f"`preset` must be a preset folder, received the file "
            f"{path!r}; pass its folder "
            f"{os.path.dirname(path) or '.'!r}."
        )
    if os.path.isdir(path):
        return True
    if os.path.lexists(path):
        if os.path.islink(path):
            what = "a symbolic link that leads to no folder (dangling, or a loop of links)"
        else:
            what = f"{_kind_of(path)}, not a folder"
        raise ValueError(f"`preset` {path!r} is {what}: pass a preset folder.")
    if isinstance(preset, os.PathLike) or (
            "://" not in path and (os.sep in path or path.startswith(("~", ".")))):
        raise ValueError(
            f"`preset` {path!r}: no such folder (a local preset folder was expected"
            + (f"; ~ is not expanded: pass {os.path.expanduser(path)!r}" if path.startswith("~")
               else "") + ")."
        )
    return False


def _kind_of(path):
    from keras_txl.safe_files import file_kind

    return file_kind(os.stat(path).st_mode)


def check_preset_folder(preset, limits=None):
    """A local keras-hub preset of a TransformerXLBackbone, its config within
    `limits` and every file keras-hub will read present, regular and
    bounded (`check_preset_files`), before a layer is built."""
    refuse_training_workdir(preset)
    layout = folder_format(preset, limits)
    if layout != "keras-hub":
        raise ValueError(
            f"`preset`: {preset!r} is a {layout} folder, not a keras-hub "
            f"preset; load it with keras_txl.load_pretrained({preset!r})."
        )
    load_config(preset, limits)
    check_preset_files(preset, limits)


def load_preset_folder(load, preset, load_weights=True, **kwargs):
    """`load(preset, load_weights=load_weights, **kwargs)` (keras-hub's
    `from_preset` of a task or backbone class) on a folder that
    `check_preset_folder` admitted: its weights checked to be floating point
    before, finite after, and keras-hub's errors naming the preset."""
    import keras

    from keras_txl.checks import finite_weights

    check_preset_weights(preset)
    if kwargs.get("dtype") is None and saved_mixed_policy(preset):
        # Written before presets held float32 (`save_to_preset`):
        # keras-hub cannot read the mixed policy's name; resolve it
        # as it resolves a float dtype, to the current policy.
        kwargs["dtype"] = keras.config.dtype_policy()
    quantized = saved_quantized(preset)
    if kwargs.get("dtype") is None and quantized is not None:
        # keras-hub's backbone loader replaces the saved dtype with the
        # `dtype` argument even when that is None: a quantized backbone was
        # built without its quantized layers, and its weights did not load.
        kwargs["dtype"] = keras.dtype_policies.deserialize(copy.deepcopy(quantized))
    try:
        model = load(preset, load_weights=load_weights, **kwargs)
    except (OSError, KeyError) as error:
        raise ValueError(
            f"Could not read the preset {preset!r}: {error} (a missing, "
            "truncated or corrupted file?)"
        ) from None
    except ValueError as error:
        if "could not be loaded" not in str(error):
            raise
        # Keras names the layer, not the file (a shape or a variable
        # count that differs from what config.json builds).
        files = sorted(n for n in os.listdir(preset) if n.endswith(".weights.h5"))
        raise ValueError(
            f"The preset {preset!r}: the weights in {' and '.join(files)} "
            "are not those of the model its config.json describes "
            f"(another model's weights, or a damaged file). Keras: {error}"
        ) from None
    if load_weights:
        finite_weights(model, f"The preset {preset!r}")
    return model


def load_preset_handle(load, preset, load_weights=True, **kwargs):
    """`load(preset, ...)` (keras-hub's `from_preset`) for what is no local
    folder: a keras-txl architecture's name is refused, an `hf://` handle
    is checked first (`check_hf_handle`), and a download's failure is a
    ValueError naming the handle."""
    from keras_txl.presets import PRESETS

    if isinstance(preset, str) and preset in PRESETS:
        # keras-hub would say "Unknown preset identifier": these are
        # architectures, with no weights to load.
        raise ValueError(
            f"`preset` {preset!r} is a keras-txl architecture (a "
            "TransformerXLConfig preset), not a folder of weights: build it "
            f"with TransformerXLCausalLM(TransformerXLConfig.from_preset({preset!r})), "
            "or pass a preset folder (save_preset / txl train's WORKDIR/model)."
        )
    if isinstance(preset, str) and preset.startswith(HF_PREFIX):
        check_hf_handle(preset)
    if isinstance(preset, str) and preset.startswith(KAGGLE_PREFIX):
        check_kaggle_handle(preset)
    try:
        return load(preset, load_weights=load_weights, **kwargs)
    except (OSError, ValueError) as error:  # ConnectionError, requests' errors
        if not (isinstance(preset, str) and "://" in preset):
            raise
        raise ValueError(
            f"Could not load the preset {preset!r}: {type(error).__name__}: "
            f"{error}. keras-hub downloads hf:// and kaggle:// handles; "
            "without network access, download the preset where there is "
            "one and pass its local folder."
        ) from error


KAGGLE_PREFIX = "kaggle://"
# How long the reachability probe of Kaggle may take, name resolution included.
KAGGLE_PROBE_SECONDS = 10.0


def check_kaggle_handle(preset):
    """Fails fast, naming the cause, where keras-hub's download of a
    `kaggle://` preset would not: kagglehub asks the Kaggle API once per
    file keras-hub reads (each a name lookup, and a connection without a
    timeout), so an offline or unreachable Kaggle took tens of seconds, or
    hung, before an error that named the API call. A versioned handle in
    the kagglehub cache is left to keras-hub (kagglehub reads it without
    the network), as is every answer of Kaggle itself (a missing or gated
    model): only Kaggle's reachability is checked here, with one request
    bounded by `KAGGLE_PROBE_SECONDS`."""
    import threading

    try:
        import requests
        from kagglehub.cache import Cache
        from kagglehub.config import get_cache_folder
        from kagglehub.handle import parse_model_handle
        from kagglesdk.kaggle_env import get_endpoint
        from kagglesdk.kaggle_env import get_env
    except ImportError:
        return  # keras-hub says what to install
    try:
        handle = parse_model_handle(preset[len(KAGGLE_PREFIX):])
        endpoint = get_endpoint(get_env())
    except Exception:  # not a model handle: keras-hub names the handle's form
        return
    cache = Cache()
    if handle.is_versioned() and cache.load_from_cache(handle, CONFIG_FILE):
        return
    failure = []

    def probe():
        try:
            requests.head(endpoint, timeout=(5, 5), allow_redirects=False)
        except Exception as error:  # no connection, a timeout: not Kaggle's answer
            failure.append(f"{type(error).__name__}: {error}")

    thread = threading.Thread(target=probe, daemon=True)  # a name lookup has no timeout
    thread.start()
    thread.join(KAGGLE_PROBE_SECONDS)
    if thread.is_alive():
        failure.append(f"no answer within {KAGGLE_PROBE_SECONDS:g} s")
    if failure:
        if handle.is_versioned():
            cached = f"it is not in the kagglehub cache ({cache.get_path(handle)})"
        else:
            cached = ("a handle without a version (…/variant/N) is looked up online even "
                      f"when cached (kagglehub cache: {get_cache_folder()})")
        raise ValueError(
            f"Could not reach Kaggle ({endpoint}) to download `preset` {preset!r} "
            f"({failure[0]}), and {cached}. Without network access, download the "
            "preset where there is one and pass its local folder."
        )


def model_weights_file(directory):
    """The weights file of a model folder (a preset's `model.weights.h5` or a
    keras-txl folder's `model.safetensors`), or None when it has neither.

    Raises:
        ValueError: naming the file, when it is there but no regular file (a
            FIFO, a device, a folder, a dangling link), as the loaders refuse
            it: not "no model".
    """
    for name in (PRESET_WEIGHTS_FILE, WEIGHTS_FILE):
        path = os.path.join(directory, name)
        if os.path.lexists(path):
            open_regular_file(path, "weights file").close()
            return path
    return None


# === Writing a preset folder whole ===


# The staging folders `write_preset` is writing in this thread: a part's
# `save_to_preset` called on one (keras-hub's `Task.save_to_preset` saves its
# backbone and preprocessor into the task's folder) writes there directly.
_STAGING = threading.local()


def _staging_folders():
    if not hasattr(_STAGING, "folders"):
        _STAGING.folders = set()
    return _STAGING.folders


def write_preset(directory, write, check=None, keep=None):
    """Writes a model folder with `write(folder)` beside `directory`, under a
    temporary name, then renames it into place (`TransformerXLCausalLM.
    save_to_preset`, hence `save_preset`, `save_pretrained` and the parts'
    `save_preset_part`): a killed or failed writer leaves the previous folder
    (or nothing), never half of one.

    `directory` must be one `check` admits (default `check_replaceable`: new,
    an empty folder or a keras-hub preset), which is replaced; its model
    card (`README.md`) is kept unless `write` wrote one, and so are the
    entries (top-level names) for which `keep(name)` is true, copied into
    the new folder before `write` runs.
    """
    directory = os.path.abspath(os.fspath(directory))
    (check or check_replaceable)(directory)
    parent = os.path.dirname(directory)
    _make_parent(directory, parent)
    remove_stale_temporaries(parent)
    staging = tempfile.mkdtemp(dir=parent, prefix=temporary_prefix("preset"))
    writing = _staging_folders()
    try:
        os.chmod(staging, default_mode(directory=True))
        if keep is not None and os.path.isdir(directory):
            for name in sorted(os.listdir(directory)):
                if name != _MODEL_CARD and keep(name):
                    _copy_entry(os.path.join(directory, name), os.path.join(staging, name), directory)
        writing.add(staging)
        try:
            write(staging)
        finally:
            writing.discard(staging)
        card = os.path.join(directory, _MODEL_CARD)
        if os.path.isfile(card) and not os.path.lexists(os.path.join(staging, _MODEL_CARD)):
            shutil.copy2(card, os.path.join(staging, _MODEL_CARD))
        _replace_directory(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory


def _copy_entry(source, target, directory):
    """Copies a file or a folder of the preset `directory` (its regular
    files, read as `open_regular_file` reads them: a FIFO or a device is
    refused, not read forever; a symbolic link to a folder is refused, as a
    link loop would recurse without end)."""
    if os.path.isdir(source):
        if os.path.islink(source):
            raise ValueError(
                f"{source} is a symbolic link to a folder: a save into the preset "
                f"{directory!r} copies its files and folders, not links to folders."
            )
        os.mkdir(target)
        os.chmod(target, default_mode(directory=True))
        for name in sorted(os.listdir(source)):
            _copy_entry(os.path.join(source, name), os.path.join(target, name), directory)
        return
    with open_regular_file(source, "preset file") as reader:
        with open(target, "wb") as writer:
            shutil.copyfileobj(reader, writer, 1 << 20)
    os.chmod(target, default_mode())


# What each part's keras-hub `save_to_preset` writes into a preset folder,
# replacing the previous part's files (sharded weights and their index too:
# keras-hub loads `model.weights.json` first when there is one).
BACKBONE_ENTRIES = re.compile(
    r"config\.json|metadata\.json|model\.weights\.(h5|json)|model_\d+\.weights\.h5")
TOKENIZER_ENTRIES = re.compile(r"tokenizer\.json|assets")
PREPROCESSOR_ENTRIES = re.compile(r"preprocessor\.json|tokenizer\.json|assets")


def save_preset_part(directory, write, entries, config=None):
    """keras-hub's `save_to_preset` of a part of a preset (a backbone, a
    preprocessor, a tokenizer: `write(folder)`), written as
    `TransformerXLCausalLM.save_to_preset` writes a whole one: the preset
    is copied beside `directory` under a temporary name without the part's
    previous files (`entries`, a compiled pattern of top-level names), the
    part written there with a new `manifest.json`, and the folder renamed
    into place (`write_preset`). A failed or killed save leaves the previous
    folder as it was; the other parts' files are kept, as keras-hub keeps
    them. Called on a folder `write_preset` is writing (keras-hub's
    `save_task` saves its backbone and preprocessor so), the part is
    written there directly.

    `directory` must be new, an empty folder or a keras-hub preset folder of
    a TransformerXLBackbone (or of a tokenizer or preprocessor alone).

    `config`: a backbone's `TransformerXLConfig`. A whole model's task files
    (`task.json`, `task.weights.h5`) hold their own copy of the previous
    backbone's config, which a loader checks against `config.json`: kept
    when it is `config`, removed (with a warning) when it is another one,
    since the folder would not load.
    """
    directory = folder_path(directory, "preset_dir")
    if os.path.abspath(directory) in _staging_folders():
        write(directory)
        return directory
    if config is not None:
        stale = _stale_task(directory, config)
        if stale is not None:
            stale, state = stale
            # A stateful task's settings are not in the kept files: say them,
            # or a later from_preset loads a model without state in silence.
            lost = ("" if state is None else
                    f" It was stateful ({state}): load the new preset with "
                    f"from_preset(..., {state}) to get a stateful model again.")
            logger.warning(
                "%s: removed task.json and task.weights.h5, the previous model's task (its "
                "backbone had %s): the preset would not load with this backbone's config.%s "
                "The tokenizer and preprocessor are kept; save the whole model "
                "(causal_lm.save_to_preset) to write a task again.",
                directory, stale, lost)
            entries = re.compile(f"(?:{entries.pattern})|{TASK_ENTRIES.pattern}")

    def staged(staging):
        write(staging)
        write_manifest(staging)

    return write_preset(
        directory, staged, check=check_replaceable_part,
        keep=lambda name: name != MANIFEST_FILE and not entries.fullmatch(name))


# A whole model's task files (keras-hub's `save_task`), beside its backbone's.
TASK_ENTRIES = re.compile(r"task\.json|task\.weights\.h5")


def _stale_task(directory, config):
    """How the previous task of the preset `directory` differs from a
    backbone of `config` saved there ("num_layers=2, not 3") and the
    task's state ("stateful=True, batch_size=4", or None for a task without
    state), or None when it holds no task or the task's backbone config is
    `config`. A task.json that cannot be read or holds no valid backbone
    config is stale too."""
    path = os.path.join(directory, PRESET_TASK_FILE)
    if not os.path.isdir(directory) or not os.path.lexists(path):
        return None
    state = None
    try:
        data = read_json(path)
        task = data["config"]
        if isinstance(task, dict) and task.get("stateful") is True:
            state = f"stateful=True, batch_size={task.get('batch_size')!r}"
        backbone = task["backbone"]
        theirs = TransformerXLConfig.from_dict(preset_fields(backbone, path))
    except (AttributeError, TypeError, ValueError, KeyError) as error:
        return f"a config that cannot be read: {error}", state
    if theirs == config:
        return None
    old, new = theirs.to_dict(), config.to_dict()
    field = next(k for k in new if new[k] != old.get(k))
    return f"{field}={shown(old.get(field))}, not {field}={shown(new[field])}", state


def _make_parent(directory, parent):
    """Creates `parent`, or a ValueError naming the file in its way
    (os.makedirs' FileExistsError / NotADirectoryError names neither)."""
    try:
        os.makedirs(parent, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocking = parent  # the nearest existing path above: not a folder
        while not os.path.lexists(blocking):
            blocking = os.path.dirname(blocking)
        kind = "a symbolic link" if os.path.islink(blocking) else "a file"
        raise ValueError(
            f"`directory` {directory!r} cannot be created: {blocking!r} is {kind}, not "
            "a folder. Pass a path whose parent folders are folders (or missing)."
        ) from None


# keras-hub's model card: not read by a loader, the user's, kept by a save.
_MODEL_CARD = "README.md"
# What keras-hub writes into a preset folder (keras_hub.src.utils.preset_utils:
# its config, task, preprocessor, tokenizer and metadata JSON files, weights,
# sharded weights and their index, assets, model card).
_PRESET_ENTRY = re.compile(
    r"(config|task|preprocessor|tokenizer|metadata|model\.weights)\.json"
    r"|(model|task)\.weights\.h5|model_\d+\.weights\.h5|assets|README\.md|manifest\.json"
)
# What a tokenizer's or preprocessor's `save_to_preset` leaves in a folder
# without a backbone (`save_preset_part`: with its manifest).
_PART_ENTRY = re.compile(
    r"(tokenizer|preprocessor|metadata|manifest)\.json|assets|README\.md")


def _entries_to_replace(directory, expected, alternative):
    """The entries of the folder `directory` that a save would replace
    ([] when it is missing or empty); a ValueError when it is a file or a
    symbolic link, which a save never replaces (`expected`: what it should
    be, `alternative`: the third thing a save may replace)."""
    if not os.path.lexists(directory):
        return []
    if os.path.islink(directory) or not os.path.isdir(directory):
        kind = "a symbolic link" if os.path.islink(directory) else "a file"
        raise ValueError(
            f"`directory` {directory!r} is {kind}, not {expected}: refusing to "
            f"replace it. Pass a new folder, an empty one or {alternative}."
        )
    return os.listdir(directory)


def check_replaceable(directory, part=False):
    """`save_preset` replaces `directory` only when nothing would be lost:
    when it is missing, an empty folder or a keras-hub preset: of a
    TransformerXLBackbone, or a preset part without a `config.json` (a
    tokenizer's or preprocessor's alone, as their `save_to_preset` write
    one), which a whole model's save replaces as a part's save adds to it.
    With `part` (`check_replaceable_part`), any keras-hub preset files
    without a `config.json` are admitted (a part's save keeps the others)."""
    entries = _entries_to_replace(directory, "a preset folder", "an existing preset")
    if not entries:
        return
    try:
        layout = folder_format(directory)
    except ValueError:
        layout = None
    others = sorted(e for e in entries if not _PRESET_ENTRY.fullmatch(e))
    if not others and not os.path.lexists(os.path.join(directory, CONFIG_FILE)):
        # A whole save replaces every file: only a tokenizer's or
        # preprocessor's (a lone model.weights.h5 may be the user's).
        if part or all(_PART_ENTRY.fullmatch(e) for e in entries):
            return
    if layout != "keras-hub" or others:
        others = others or sorted(entries)
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise ValueError(
            f"`directory` {directory!r} holds files that are not a keras-hub preset "
            f"({shown}): refusing to replace it. Pass a new folder, an empty one or "
            "an existing preset."
        )
    backbone = read_json(os.path.join(directory, CONFIG_FILE)).get("class_name")
    if backbone != "TransformerXLBackbone":
        # Another architecture's preset (a GPT-2 one downloaded there): its
        # weights are the user's, not a previous save of this model.
        raise ValueError(
            f"`directory` {directory!r} is a keras-hub preset of another model "
            f"({backbone!r}, not 'TransformerXLBackbone'): refusing to replace it. "
            "Pass a new folder, an empty one or a Transformer-XL preset."
        )


def check_replaceable_part(directory):
    """`check_replaceable` for a part's save (`save_preset_part`)."""
    check_replaceable(directory, part=True)


# What `save_pretrained` writes into a keras-txl weights folder.
_WEIGHTS_FOLDER_ENTRY = re.compile(
    r"config\.json|model\.safetensors|manifest\.json|tokenizer|README\.md")


def check_replaceable_weights_folder(directory):
    """`save_pretrained` replaces `directory` only when nothing would be lost:
    when it is missing, an empty folder or a keras-txl weights folder."""
    entries = _entries_to_replace(directory, "a folder", "a keras-txl weights folder")
    if not entries:
        return
    try:
        layout = folder_format(directory)
    except ValueError:
        layout = None if os.path.lexists(os.path.join(directory, CONFIG_FILE)) else "none"
    if layout != "keras-txl" and layout != "none":
        # Another library's folder would lose its config.json (and a Hugging
        # Face folder its model.safetensors): refused, as `save_preset` does.
        what = {"keras-hub": "a keras-hub preset", "hugging-face":
                "a Hugging Face TransfoXL checkpoint"}.get(layout, "a config.json "
                                                           "that is not keras-txl's")
        raise ValueError(
            f"`directory` {directory!r} holds {what}: refusing to write a keras-txl "
            "weights folder over it. Pass a new folder, an empty one or a keras-txl "
            "weights folder (`save_preset` writes keras-hub presets)."
        )
    others = sorted(e for e in entries if not _WEIGHTS_FOLDER_ENTRY.fullmatch(e))
    if layout == "none" or others:
        others = others or sorted(entries)
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise ValueError(
            f"`directory` {directory!r} holds files that are not a keras-txl weights "
            f"folder ({shown}): refusing to replace it. Pass a new folder, an empty "
            "one or a keras-txl weights folder."
        )


def _replace_directory(new, target):
    """Moves folder `new` to `target`, replacing what is there."""
    old = None
    if os.path.lexists(target):
        old = tempfile.mkdtemp(dir=os.path.dirname(target),
                               prefix=temporary_prefix("old_preset"))
        os.rmdir(old)
        os.replace(target, old)
    os.replace(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
