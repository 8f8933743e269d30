"""keras-txl: Transformer-XL (Dai et al., 2019) in Keras 3."""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

try:
    import tensorflow  # noqa: F401
except ImportError as error:  # the wheel is the user's choice (setup.py)
    raise ImportError(
        "keras-txl needs TensorFlow 2.21, which is not installed. On a CPU "
        "machine: `pip install 'keras-txl[cpu]'` (the tensorflow-cpu wheel); "
        "with a GPU: `pip install 'keras-txl[cuda]'`. See the README, "
        "'Installing'."
    ) from error

from keras_txl.adaptive import AdaptiveEmbedding  # noqa: E402
from keras_txl.adaptive import AdaptiveSoftmax  # noqa: E402
from keras_txl.backbone import TransformerXLBackbone  # noqa: E402
from keras_txl.causal_lm import TransformerXLCausalLM  # noqa: E402
from keras_txl.config import TransformerXLConfig  # noqa: E402
from keras_txl.decoder_block import TransformerXLBlock  # noqa: E402
from keras_txl.hf_checkpoint import load_hf_checkpoint  # noqa: E402
from keras_txl.host_memory import CompiledFunction  # noqa: E402
from keras_txl.host_memory import release_free_memory  # noqa: E402
from keras_txl.io import load_pretrained  # noqa: E402
from keras_txl.io import save_pretrained  # noqa: E402
from keras_txl.memory import attention_mask  # noqa: E402
from keras_txl.memory import update_memory  # noqa: E402
from keras_txl.official_checkpoint import load_official_checkpoint  # noqa: E402,E501
from keras_txl.presets import EVAL_PROTOCOLS  # noqa: E402
from keras_txl.presets import PRESETS  # noqa: E402
from keras_txl.presets import apply_eval_protocol  # noqa: E402
from keras_txl.relative_attention import RelativeMultiHeadAttention  # noqa: E402
from keras_txl.relative_attention import relative_shift  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "AdaptiveEmbedding",
    "AdaptiveSoftmax",
    "CompiledFunction",
    "EVAL_PROTOCOLS",
    "PRESETS",
    "RelativeMultiHeadAttention",
    "TransformerXLBackbone",
    "TransformerXLBlock",
    "TransformerXLCausalLM",
    "TransformerXLConfig",
    "apply_eval_protocol",
    "attention_mask",
    "load_hf_checkpoint",
    "load_official_checkpoint",
    "load_pretrained",
    "release_free_memory",
    "save_pretrained",
    "relative_shift",
    "update_memory",
]
