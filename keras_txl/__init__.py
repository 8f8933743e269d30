"""keras-txl: Transformer-XL (Dai et al., 2019) in Keras 3.

Importing the package is cheap: the public names below are loaded on first
use (PEP 562), so `txl --help` and the serving client
(`keras_txl.export.serving_client`) run on hosts without TensorFlow.
"""

import importlib
import importlib.util
import os
import sys
import types

os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def _prefer_tensorflow_onednn():
    # TensorFlow's oneDNN kernels on CPUs where its default leaves them off (x86
    # without AVX-512 VNNI/BF16, AVX-VNNI or AMX): keras_txl.host.prefer_tensorflow_onednn.
    from keras_txl.host import prefer_tensorflow_onednn

    prefer_tensorflow_onednn()


_prefer_tensorflow_onednn()


class _DeferredModule(types.ModuleType):
    """Stands for a module in `sys.modules` until one of its names is used.

    The first lookup of a name it lacks (`__getattr__` is only called for
    those; `__spec__`, which `import` reads, is set) imports the real
    module in its place and copies its names here, so that modules that
    bound this stand-in at import time read the real names from then on.
    """

    def __getattr__(self, name):
        real = load_deferred_module(self.__name__)
        self.__dict__.update(real.__dict__)
        return getattr(real, name)


def load_deferred_module(name):
    """The real module behind a `_DeferredModule` (imported now if needed)."""
    module = sys.modules.get(name)
    if isinstance(module, _DeferredModule):
        del sys.modules[name]
    return importlib.import_module(name)


def register_text_ops():
    """Imports tensorflow-text if it is installed, registering its ops.

    Loading a SavedModel whose signatures tokenize text (word, char,
    sentencepiece, wordpiece tokenizers) needs them; keras-txl defers the
    import (below), so its loaders call this first.
    """
    try:
        load_deferred_module("tensorflow_text")
    except ImportError:
        pass


def _defer_tensorflow_text():
    """Imports tensorflow-text on first use rather than with keras-hub.

    keras-hub imports tensorflow-text eagerly (for its tokenizers). That maps
    its op libraries: 117 MB more resident memory, measured, in every process
    that builds a model, although only the word, char, sentencepiece and
    wordpiece tokenizers use it. Python's `importlib.util.LazyLoader` cannot
    do this: on Python 3.11 an `import` of a lazy module reads `__spec__`,
    which executes it. The stand-in above is imported instead; the first use
    of one of its names (our tokenizers, keras-hub's, a user's
    `tensorflow_text.` call) imports the real module and registers its ops.
    Nothing is done when it is not installed or already imported.
    """
    if "tensorflow_text" in sys.modules:
        return
    try:
        spec = importlib.util.find_spec("tensorflow_text")
    except (ImportError, ValueError):
        return
    if spec is None:
        return
    module = _DeferredModule("tensorflow_text")
    module.__spec__ = spec
    module.__file__ = spec.origin
    # Its subpackages stay importable without executing the package itself:
    # keras-hub imports `tensorflow_text.tools.wordpiece_vocab`'s learner
    # (plain Python and NumPy) at import time.
    module.__path__ = list(spec.submodule_search_locations or [])
    sys.modules["tensorflow_text"] = module


_defer_tensorflow_text()

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
    # keras-hub is an add-on installed --no-deps (it names tensorflow-text,
    # which names the CUDA wheel): found without importing it (a config alone
    # needs none of it).
    if importlib.util.find_spec("keras_hub") is None:
        raise ImportError(
            "keras-txl needs keras-hub 0.32, which is not installed: `pip install "
            "--no-deps 'keras-hub>=0.32,<0.33'` (its own dependencies are keras-txl's; "
            "in a checkout: `pip install --no-deps -r requirements-tf-addons.txt`). See "
            "the README, 'Installing'."
        )
    # Its import lets the kernel reclaim the library pages that loading
    # TensorFlow read once (keras_txl.host_memory.release_library_pages).
    importlib.import_module("keras_txl.host_memory")


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


# --- Keras's registry --------------------------------------------------------
# Keras (`keras.models.load_model`, `keras.saving.deserialize_keras_object`) and
# keras-hub's own loaders (`keras_hub.models.CausalLM.from_preset`) look
# keras-txl's classes up by their registered names ("keras_txl>..."), which
# `@keras.saving.register_keras_serializable` adds when a class's module runs.
# Those modules are deferred (above), so `import keras_txl` alone would leave
# the names unknown, and Keras has no hook for a name it lacks. So the modules
# are imported as soon as Keras is: now if it already is, else right after its
# import (or keras-hub's) completes. A process that never imports Keras (`txl
# --help`, the serving client) still loads none of it.
_REGISTERING_MODULE = "keras_txl.causal_lm"  # imports every registered class
_WATCHED_IMPORTS = ("keras", "keras_hub")  # and keras-txl's own modules
_BUSY_PACKAGES = ("keras_txl", "keras", "keras_hub", "tensorflow", "tensorflow_text",
                  "numpy")


def _initializing(name):
    spec = getattr(sys.modules.get(name), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def register_keras_classes(just_loaded=None):
    """Registers keras-txl's Keras classes (imports `keras_txl.causal_lm`).

    Does nothing before Keras is imported, or while a module that import
    needs is itself still being imported (Keras imported from inside one of
    keras-txl's modules, or TensorFlow's): importing it then would see a
    half-built module. Each keras-txl module calls it again when its own
    import completes (`_KerasImportWatcher`). Returns whether they are
    registered.
    """
    if _REGISTERING_MODULE in sys.modules and not _initializing(_REGISTERING_MODULE):
        return True
    if "keras" not in sys.modules:
        return False
    busy = [name for name in list(sys.modules)
            if name not in (just_loaded, "keras_txl")
            and name.split(".")[0] in _BUSY_PACKAGES and _initializing(name)]
    if busy:
        return False
    importlib.import_module(_REGISTERING_MODULE)
    return True


class _RegisterAfterImport:
    """Wraps the loader of a watched package: runs it, then
    `register_keras_classes`. Everything else is the real loader's."""

    def __init__(self, loader, name):
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            register_keras_classes(just_loaded=self._name)
        except Exception as error:  # never break the user's `import keras`
            import warnings

            warnings.warn(
                f"keras-txl could not register its classes with Keras after "
                f"`import {self._name}` ({type(error).__name__}: {error}); "
                "`import keras_txl.causal_lm` raises the same error.",
                stacklevel=2,
            )

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _KerasImportWatcher:
    """A `sys.meta_path` finder for Keras, keras-hub and keras-txl's own
    modules only: it finds them with the other finders and wraps their loader
    (`_RegisterAfterImport`), so the classes are registered right after
    whichever of them completes its import last."""

    def find_spec(self, name, path=None, target=None):
        if name not in _WATCHED_IMPORTS and not name.startswith("keras_txl."):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _RegisterAfterImport(spec.loader, name)
        return spec


def _watch_keras_imports():
    if "keras" in sys.modules:
        register_keras_classes()
        return
    # By name: a reloaded keras_txl has a new class, and one watcher is enough.
    if not any(type(finder).__name__ == "_KerasImportWatcher" for finder in sys.meta_path):
        sys.meta_path.insert(0, _KerasImportWatcher())


_watch_keras_imports()
