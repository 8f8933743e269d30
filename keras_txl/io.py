"""A model folder: `config.json` + `model.safetensors` (+ `tokenizer/`).

The portable, pickle-free format that training writes, and that export,
evaluation and generation read. Weight names are the Keras variable paths
(`backbone/block_0/attention/qkv_kernel`, ...). Files are written to a
temporary name and renamed, so a killed writer never leaves a half file
under the final name.
"""

import os
import shutil
import tempfile

import numpy as np

from keras_txl.config import TransformerXLConfig

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


def load_config(directory):
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.exists(path):
        raise ValueError(
            f"No {CONFIG_FILE} in {directory!r}: not a keras-txl model folder."
        )
    return TransformerXLConfig.from_json(path)


def load_pretrained(directory, stateful=False, batch_size=None, **changes):
    """Rebuilds a `TransformerXLCausalLM` saved by `save_pretrained`.

    Args:
        directory: str.
        stateful, batch_size: as for `TransformerXLCausalLM`.
        **changes: config overrides that do not change weight shapes
            (memory_length, clamp_length, same_length, dropout, ...).

    Raises:
        ValueError: missing files, a truncated/corrupted weights file, or
            weights that do not fit the config.
    """
    from keras_txl.causal_lm import TransformerXLCausalLM
    from keras_txl.weights_file import read_safetensors

    config = load_config(directory)
    if changes:
        config = config.replace(**changes)
    tensors = read_safetensors(os.path.join(directory, WEIGHTS_FILE))
    model = TransformerXLCausalLM(config, stateful=stateful, batch_size=batch_size)
    expected = {w.path: w for w in model.model_weights()}
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"{directory}: weights do not match config.json (missing "
            f"{missing[:5]}, unexpected {unexpected[:5]}): a checkpoint from "
            "another config?"
        )
    for name, variable in expected.items():
        value = tensors[name]
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(
                f"{directory}: weight {name!r} has shape {tuple(value.shape)}, "
                f"the config needs {tuple(variable.shape)}: a checkpoint from "
                "another config?"
            )
        variable.assign(value)
    return model


def tokenizer_directory(directory):
    """The tokenizer folder saved beside a model, or None."""
    path = os.path.join(directory, TOKENIZER_DIR)
    return path if os.path.isdir(path) else None
