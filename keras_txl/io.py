"""Model folders: keras-hub presets, keras-txl weight folders, both checked.

Two layouts, one loader (`load_pretrained`, which `txl eval|generate|export`
and `TransformerXLCausalLM.from_preset` use):

- a **keras-hub preset** (`save_preset`, what `txl train` writes as
  `workdir/model/`): `config.json` (the serialized
  `TransformerXLBackbone`), `model.weights.h5`, `task.json`,
  `task.weights.h5`, `preprocessor.json`, `tokenizer.json` and
  `assets/tokenizer/`, `metadata.json`: keras-hub's own format, read by
  `keras_hub.models.CausalLM.from_preset` too;
- a **keras-txl weights folder** (`save_pretrained`): `config.json` (the
  `TransformerXLConfig`) + `model.safetensors` (+ `tokenizer/`): no HDF5,
  no code, the tensors' names, shapes and offsets checked against the
  config before anything is read; training checkpoints use it.

Hugging Face TransfoXL folders load through `hf_checkpoint`. Whatever the
layout, the config is checked against `keras_txl.limits` before any layer
is built. Weight names are the Keras variable paths
(`backbone/block_0/attention/qkv_kernel`, ...). Files are written to a
temporary name and renamed, so a killed writer never leaves a half file
under the final name.
"""

import math
import os

import numpy as np

from keras_txl import checks
from keras_txl.checks import loaded_weight
from keras_txl.folders import CONFIG_FILE
from keras_txl.folders import PRESET_TOKENIZER_FILE
from keras_txl.folders import TOKENIZER_DIR
from keras_txl.folders import WEIGHTS_FILE
from keras_txl.folders import check_replaceable
from keras_txl.folders import check_replaceable_weights_folder
from keras_txl.folders import folder_format
from keras_txl.folders import load_config
from keras_txl.folders import refuse_training_workdir
from keras_txl.folders import sha256_file  # noqa: F401 (shards, checkpoints)
from keras_txl.folders import verify_manifest
from keras_txl.folders import write_manifest
from keras_txl.folders import write_preset
from keras_txl.limits import check_config
from keras_txl.safe_files import atomic_write_bytes
from keras_txl.safe_files import folder_path


def save_pretrained(model, directory, tokenizer=None):
    """Writes `model` (and optionally its tokenizer) to `directory`.

    Args:
        model: `TransformerXLCausalLM`.
        directory: str. Written beside itself under a temporary name, then
            renamed into place (`keras_txl.folders.write_preset`): a failed
            or killed save leaves the previous folder whole. It must be new,
            an empty folder or a keras-txl weights folder (replaced; its
            README.md is kept): another library's model (a Hugging Face
            checkpoint, a keras-hub preset) or other files are refused, not
            overwritten.
        tokenizer: optional keras-txl tokenizer (`keras_txl.tokenizers`),
            or the path of a folder holding one (a tokenizer folder or a
            preset: `load_tokenizer` reads it), written as `tokenizer/`. Its
            vocabulary must have the model's size, as every loader requires:
            checked before anything is written.
    """
    from safetensors.numpy import save

    directory = folder_path(directory)
    if tokenizer is not None:
        tokenizer = _model_tokenizer(tokenizer, model.txl_config.vocabulary_size)
    tensors = {w.path: np.ascontiguousarray(w.numpy()) for w in model.model_weights()}

    def write(staging):
        atomic_write_bytes(
            os.path.join(staging, WEIGHTS_FILE),
            save(tensors, metadata={"format": "keras-txl"}),
        )
        atomic_write_bytes(
            os.path.join(staging, CONFIG_FILE),
            (model.txl_config.to_json() + "\n").encode(),
        )
        if tokenizer is not None:
            tokenizer.save(os.path.join(staging, TOKENIZER_DIR))
        # Last: the sizes and sha256s a loader checks (`verify_manifest`).
        write_manifest(staging)

    write_preset(directory, write, check_replaceable_weights_folder)
    return directory


def _model_tokenizer(tokenizer, vocabulary_size):
    """The keras-txl tokenizer `save_pretrained` writes beside a model of
    `vocabulary_size`: `tokenizer`, or the one its folder holds."""
    from keras_txl.tokenizers import TransformerXLTokenizer
    from keras_txl.tokenizers import load_tokenizer

    try:
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = load_tokenizer(tokenizer)
        elif not isinstance(tokenizer, TransformerXLTokenizer):
            raise ValueError(
                "`tokenizer` must be a keras-txl tokenizer (keras_txl.tokenizers; "
                "the only kind a loader reads back) or the path of a folder "
                f"holding one, received {type(tokenizer).__name__}."
            )
        tokenizer.check_model_vocabulary(vocabulary_size)
    except ValueError as error:
        message = str(error)
        if not message.startswith("`tokenizer`"):
            message = f"`tokenizer`: {message}"
        raise ValueError(message) from None
    return tokenizer


def load_preset(directory, stateful=False, batch_size=None, limits=None,
                load_weights=True, **changes):
    """A `TransformerXLCausalLM` from a keras-hub preset folder, checked.

    The config (and every JSON file keras-hub reads) is bounded by
    `limits` before a layer is built; a preset whose tokenizer is missing
    or has another vocabulary size than the model is refused by name.

    Args:
        directory: str. A local preset folder (from `save_preset` /
            `save_to_preset`).
        stateful, batch_size, limits, **changes: as `load_pretrained`.
    """
    from keras_txl.causal_lm import TransformerXLCausalLM

    model = TransformerXLCausalLM.from_preset(
        os.fspath(directory), load_weights=load_weights, limits=limits
    )
    if stateful or changes:
        clone = model.with_settings(stateful=stateful, batch_size=batch_size, **changes)
        if changes:
            check_config(clone.txl_config, limits, source="the overrides")
        model = clone
    return model


def save_preset(model, directory, tokenizer=None, sequence_length=None):
    """Writes `model` (and its tokenizer) as a keras-hub preset folder.

    The folder is written beside `directory` under a temporary name and
    then renamed into place, so a killed writer leaves the previous preset
    (or nothing), never half of one. `directory` must be new, an empty
    folder or a keras-hub preset (which is replaced): anything else there
    is refused, never deleted.

    Args:
        model: `TransformerXLCausalLM`.
        directory: str.
        tokenizer: a keras-txl tokenizer layer or a tokenizer folder, or
            None to keep the model's own preprocessor (if any).
        sequence_length: the preprocessor's sequence length (default: the
            config's `segment_length`); with no `tokenizer`, the model's own
            preprocessor is re-packed to it.
    """
    from keras_txl.causal_lm import check_preprocessor
    from keras_txl.causal_lm_preprocessor import TransformerXLCausalLMPreprocessor

    directory = os.path.abspath(os.fspath(directory))
    check_replaceable(directory)
    preprocessor = model.preprocessor
    if isinstance(tokenizer, (str, os.PathLike)):
        from keras_txl.tokenizers import load_tokenizer

        tokenizer = load_tokenizer(tokenizer)
    if sequence_length is not None:
        sequence_length = checks.positive_int("sequence_length", sequence_length)
    if tokenizer is None and sequence_length is not None:
        if preprocessor is None:
            raise ValueError(
                "`sequence_length` is the preprocessor's, and this model has none: "
                "pass its `tokenizer` too."
            )
        tokenizer = preprocessor.tokenizer  # the model's own, re-packed
    if tokenizer is not None:
        preprocessor = TransformerXLCausalLMPreprocessor(
            tokenizer,
            sequence_length=sequence_length or model.txl_config.segment_length,
        )
    if preprocessor is not None:
        # Before anything is written: a preset whose tokenizer does not fit
        # the model would be refused by every loader.
        check_preprocessor(preprocessor, model.txl_config.vocabulary_size)
    task = model.with_settings(stateful=False)
    task.preprocessor = preprocessor
    task.save_to_preset(directory)  # staged, with its manifest.json
    return directory


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
        **changes: config overrides of the evaluation and training settings
            (memory_length, clamp_length, same_length, dropout, ...); a field
            the weights were trained with (`keras_txl.config.TRAINED_FIELDS`)
            may be repeated, not changed.

    Raises:
        ValueError: missing files, a truncated/corrupted weights file,
            weights that do not fit the config, or a config beyond limits.
    """
    from keras_txl.causal_lm import TransformerXLCausalLM
    from keras_txl.weights_file import check_tensor_names
    from keras_txl.weights_file import read_safetensors
    from keras_txl.weights_file import read_safetensors_header

    refuse_training_workdir(directory)
    layout = folder_format(directory, limits)
    if layout == "keras-hub":
        return load_preset(directory, stateful, batch_size, limits, **changes)
    if layout == "hugging-face":
        from keras_txl.hf_checkpoint import load_hf_checkpoint

        return load_hf_checkpoint(directory, stateful, batch_size, limits, **changes)
    config = load_config(directory, limits)
    if changes:
        config.check_trained_fields(changes, os.path.join(directory, CONFIG_FILE))
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
    verify_manifest(directory, limits)
    tensors = read_safetensors(weights_path, limits=limits)
    for name, variable in expected.items():
        variable.assign(loaded_weight(name, tensors.pop(name), weights_path))
    return model


def tokenizer_directory(directory):
    """The folder holding a model's tokenizer, or None: the preset itself
    (`tokenizer.json` + `assets/tokenizer/`) or a keras-txl folder's
    `tokenizer/`."""
    if os.path.isfile(os.path.join(directory, PRESET_TOKENIZER_FILE)):
        return os.fspath(directory)
    path = os.path.join(directory, TOKENIZER_DIR)
    return path if os.path.isdir(path) else None
