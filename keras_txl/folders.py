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




def model_weights_file(directory):
    """The weights file of a model folder (a preset's `model.weights.h5` or a
    keras-txl folder's `model.safetensors`), or None."""
    for name in (PRESET_WEIGHTS_FILE, WEIGHTS_FILE):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    return None
