"""What a model folder is, checked before anything is built from it.

Shared by `keras_txl.io` (which loads every layout) and
`TransformerXLCausalLM.from_preset` (keras-hub presets): the layout of a
folder, its config within `keras_txl.limits`, and the files keras-hub will
read, present and bounded.
"""

import os

from keras_txl.config import TransformerXLConfig
from keras_txl.limits import check_config
from keras_txl.safe_files import read_json

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_DIR = "tokenizer"
# keras-hub's preset files (keras_hub.src.utils.preset_utils).
PRESET_WEIGHTS_FILE = "model.weights.h5"
PRESET_TASK_FILE = "task.json"
PRESET_TOKENIZER_FILE = "tokenizer.json"
PRESET_PREPROCESSOR_FILE = "preprocessor.json"
# Keys of a keras-hub backbone config that are not TransformerXLConfig fields.
_LAYER_KEYS = ("name", "trainable", "dtype")


def folder_format(directory, limits=None):
    """"keras-hub", "keras-txl" or "hugging-face": the layout of a folder.

    Raises:
        ValueError: no folder or no readable `config.json` in it.
    """
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise ValueError(f"{directory!r} is not a folder (a model preset was expected).")
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.lexists(path):
        raise ValueError(
            f"No {CONFIG_FILE} in {directory!r}: not a model folder (a keras-hub "
            "preset, a keras-txl folder or a Hugging Face TransfoXL folder)."
        )
    data = read_json(path, limits)
    if isinstance(data, dict) and "class_name" in data and "config" in data:
        return "keras-hub"
    if isinstance(data, dict) and (
        data.get("model_type") == "transfo-xl" or "n_token" in data or "d_model" in data
    ):
        return "hugging-face"
    return "keras-txl"


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
        data = _preset_fields(data, path)
    config = TransformerXLConfig.from_dict(data)
    check_config(config, limits, source=path)
    return config


def _preset_fields(data, path):
    """The TransformerXLConfig fields of a keras-hub backbone config."""
    if data.get("class_name") != "TransformerXLBackbone" or not isinstance(
        data.get("config"), dict
    ):
        raise ValueError(
            f"{path} describes a {data.get('class_name')!r}, not a "
            "TransformerXLBackbone: not a keras-txl preset."
        )
    fields = {k: v for k, v in data["config"].items() if k not in _LAYER_KEYS}
    fields.update(fields.pop("config", None) or {})  # keras-txl 0.1 nesting
    return fields


def check_preset_files(directory, limits):
    """Everything keras-hub will read, present and bounded, before loading."""
    weights = os.path.join(directory, PRESET_WEIGHTS_FILE)
    if not os.path.isfile(weights):
        raise ValueError(
            f"The preset {directory!r} has no {PRESET_WEIGHTS_FILE} (its "
            "weights): an incomplete copy?"
        )
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


def check_preset_weights(directory):
    """Every dataset in the preset's weights files must be floating point:
    Keras casts what it loads to the variable's dtype, which turns an int
    or bool tensor (a damaged or foreign file) into weights in silence."""
    import h5py
    import numpy as np

    from keras_txl.checks import WEIGHT_DTYPES

    for name in sorted(os.listdir(directory)):
        if not name.endswith(".weights.h5"):
            continue
        path = os.path.join(directory, name)
        bad = []

        def visit(key, item, bad=bad):
            # (an optimizer's step counter is an integer by design)
            if (isinstance(item, h5py.Dataset) and not key.startswith("optimizer/")
                    and np.dtype(item.dtype).name not in WEIGHT_DTYPES):
                bad.append(f"{key} ({np.dtype(item.dtype).name})")

        try:
            with h5py.File(path, "r") as handle:
                handle.visititems(visit)
        except OSError as error:
            raise ValueError(
                f"Could not read the preset {directory!r}: {path}: {error} (a "
                "missing, truncated or corrupted file?)") from None
        if bad:
            raise ValueError(
                f"{path}: {', '.join(bad[:3])}: a weight must be one of "
                f"{', '.join(WEIGHT_DTYPES)} (a damaged or foreign file?)."
            )


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
        task_config = TransformerXLConfig.from_dict(_preset_fields(backbone, path))
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: its backbone config is not valid: {error}") from None
    if task_config != config:
        theirs, ours = task_config.to_dict(), config.to_dict()
        field = next(k for k in ours if ours[k] != theirs.get(k))
        raise ValueError(
            f"{path} describes another model than {CONFIG_FILE} beside it "
            f"({field}={theirs.get(field)!r} there, {ours[field]!r} in "
            f"{CONFIG_FILE}): a damaged or hand-edited preset."
        )
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




def model_weights_file(directory):
    """The weights file of a model folder (a preset's `model.weights.h5` or a
    keras-txl folder's `model.safetensors`), or None."""
    for name in (PRESET_WEIGHTS_FILE, WEIGHTS_FILE):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    return None
