"""A model folder: `config.json` + `model.safetensors` (+ `tokenizer/`).

The portable, pickle-free format that training writes, and that export,
evaluation and generation read. Weight names are the Keras variable paths
(`backbone/block_0/attention/qkv_kernel`, ...). Files are written to a
temporary name and renamed, so a killed writer never leaves a half file
under the final name.
"""

import math
import os
import shutil
import tempfile

import numpy as np

from keras_txl.config import TransformerXLConfig
from keras_txl.limits import check_config
from keras_txl.safe_files import read_json

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_DIR = "tokenizer"


def atomic_write_bytes(path, data):
    """Writes `data` to a temporary file beside `path`, fsyncs, renames."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def save_pretrained(model, directory, tokenizer=None):
    """Writes `model` (and optionally its tokenizer) to `directory`.

    Args:
        model: `TransformerXLCausalLM`.
        directory: str. Created if needed.
        tokenizer: optional object with `save(directory)`, or a path to an
            existing tokenizer folder to copy.
    """
    from safetensors.numpy import save

    os.makedirs(directory, exist_ok=True)
    tensors = {w.path: np.ascontiguousarray(w.numpy()) for w in model.model_weights()}
    atomic_write_bytes(
        os.path.join(directory, WEIGHTS_FILE),
        save(tensors, metadata={"format": "keras-txl"}),
    )
    atomic_write_bytes(
        os.path.join(directory, CONFIG_FILE),
        (model.txl_config.to_json() + "\n").encode(),
    )
    if tokenizer is not None:
        target = os.path.join(directory, TOKENIZER_DIR)
        if isinstance(tokenizer, (str, os.PathLike)):
            if os.path.abspath(tokenizer) != os.path.abspath(target):
                shutil.copytree(tokenizer, target, dirs_exist_ok=True)
        else:
            tokenizer.save(target)
    return directory


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
    config = TransformerXLConfig.from_dict(read_json(path, limits))
    check_config(config, limits, source=path)
    return config


def load_pretrained(directory, stateful=False, batch_size=None, limits=None,
                    **changes):
    """Rebuilds a `TransformerXLCausalLM` saved by `save_pretrained`.

    Nothing is built or allocated before the config is within `limits` and
    the weights file's header (names, shapes, dtypes, offsets) matches it.

    Args:
        directory: str.
        stateful, batch_size: as for `TransformerXLCausalLM`.
        limits: None, a dict or a `keras_txl.limits.Limits`: bounds on what
            the folder may ask for (see docs/reliability.md).
        **changes: config overrides that do not change weight shapes
            (memory_length, clamp_length, same_length, dropout, ...).

    Raises:
        ValueError: missing files, a truncated/corrupted weights file,
            weights that do not fit the config, or a config beyond limits.
    """
    from keras_txl.causal_lm import TransformerXLCausalLM
    from keras_txl.weights_file import check_tensor_names
    from keras_txl.weights_file import read_safetensors
    from keras_txl.weights_file import read_safetensors_header

    config = load_config(directory, limits)
    if changes:
        config = config.replace(**changes)
        check_config(config, limits, source="the overrides")
    weights_path = os.path.join(directory, WEIGHTS_FILE)
    header = read_safetensors_header(weights_path, limits)
    # Before building: the file may hold no more values than the config has
    # parameters (exact names and shapes need the built model's paths).
    values = sum(math.prod(shape) for shape, _ in header.values())
    if values > config.num_parameters():
        raise ValueError(
            f"{weights_path}: the tensors hold {values} values, but "
            f"{CONFIG_FILE} has {config.num_parameters()} parameters: weights "
            "of another config?"
        )
    model = TransformerXLCausalLM(config, stateful=stateful, batch_size=batch_size)
    expected = {w.path: w for w in model.model_weights()}
    check_tensor_names(
        f"{directory}", header,
        {name: tuple(w.shape) for name, w in expected.items()}, CONFIG_FILE,
    )
    tensors = read_safetensors(weights_path, limits=limits)
    for name, variable in expected.items():
        variable.assign(tensors.pop(name))
    return model


def tokenizer_directory(directory):
    """The tokenizer folder saved beside a model, or None."""
    path = os.path.join(directory, TOKENIZER_DIR)
    return path if os.path.isdir(path) else None
