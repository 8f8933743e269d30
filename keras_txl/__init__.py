"""keras-txl: Transformer-XL (Dai et al., 2019) in Keras 3.

Importing the package is cheap: the public names below are loaded on first
use (PEP 562), so `txl --help` and the serving client
(`keras_txl.export.serving_client`) run on hosts without TensorFlow.
"""

import importlib
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

__version__ = "0.1.0"

# Public name -> the module that defines it.
_EXPORTS = {
    "AdaptiveEmbedding": "keras_txl.adaptive",
    "AdaptiveSoftmax": "keras_txl.adaptive",
    "CompiledFunction": "keras_txl.host_memory",
    "EVAL_PROTOCOLS": "keras_txl.presets",
    "PRESETS": "keras_txl.presets",
    "RelativeMultiHeadAttention": "keras_txl.relative_attention",
    "TransformerXLBackbone": "keras_txl.backbone",
    "TransformerXLBlock": "keras_txl.decoder_block",
    "TransformerXLCausalLM": "keras_txl.causal_lm",
    "TransformerXLCausalLMPreprocessor": "keras_txl.causal_lm_preprocessor",
    "TransformerXLConfig": "keras_txl.config",
    "apply_eval_protocol": "keras_txl.presets",
    "attention_mask": "keras_txl.memory",
    "load_hf_checkpoint": "keras_txl.hf_checkpoint",
    "load_official_checkpoint": "keras_txl.official_checkpoint",
    "load_pretrained": "keras_txl.io",
    "load_preset": "keras_txl.io",
    "release_free_memory": "keras_txl.host_memory",
    "relative_shift": "keras_txl.relative_attention",
    "save_pretrained": "keras_txl.io",
    "save_preset": "keras_txl.io",
    "update_memory": "keras_txl.memory",
}

__all__ = sorted(_EXPORTS)


def require_tensorflow():
    """Imports TensorFlow, or says which wheel to install (the user's choice)."""
    try:
        import tensorflow  # noqa: F401
    except ImportError as error:
        raise ImportError(
            "keras-txl needs TensorFlow 2.21, which is not installed. On a CPU "
            "machine: `pip install 'keras-txl[cpu]'` (the tensorflow-cpu wheel); "
            "with a GPU: `pip install 'keras-txl[cuda]'`. See the README, "
            "'Installing'."
        ) from error


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'keras_txl' has no attribute {name!r}")
    require_tensorflow()
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
