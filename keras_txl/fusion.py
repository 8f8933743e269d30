"""XLA-compiled element-wise kernels for graph-mode inference.

Graph-mode TensorFlow runs every element-wise op as its own pass over
memory. Around the matmuls of a Transformer-XL layer that is most of an
evaluation step on a CPU: a layer norm is about ten ops over the (B, T, D)
activations, and the attention scores take a shift, an add and a mask over
(B, N, T, K) before the softmax. Each layer module holds its kernel's math
(`decoder_block.LayerNorm`, `relative_attention.masked_scores`); this module
holds the switch and compiles them. XLA would fuse them, but XLA-compiling the
whole step gives up oneDNN's matmuls (AMX, bf16), which XLA's CPU dots do
not reach. So only these regions are compiled, each into one kernel, and
the matmuls and the softmax stay oneDNN's.

They are used while a graph is traced inside `fused_kernels()`: the
evaluation step (`keras_txl.training.loop.make_eval_step`) is; training
steps and exports (SavedModel, TFLite) are not, and their graphs hold no
XLA-compiled calls. The first run compiles them: XLA's compiler adds about
50 MB to the process's peak resident memory (docs/benchmarks.md).
"""

import contextlib
import contextvars

_ENABLED = contextvars.ContextVar("keras_txl_fused_kernels", default=False)
_KERNELS = {}


@contextlib.contextmanager
def fused_kernels(enabled=True):
    """Inference code traced inside uses the XLA-compiled kernels below.

    A context variable: code traced in another thread (a
    `MirroredStrategy` replica's) does not see it and takes the plain
    graph path, which computes the same values."""
    if not isinstance(enabled, bool):
        raise ValueError(
            f"`enabled` must be True or False. Received: enabled={enabled!r}.")
    token = _ENABLED.set(enabled)
    try:
        yield
    finally:
        _ENABLED.reset(token)


def enabled():
    """Whether the code being traced is inside `fused_kernels()`."""
    return _ENABLED.get()


def compiled(name, function):
    """`function` XLA-compiled (`tf.function(jit_compile=True)`), made once
    per `name` on first use: a `tf.function` at import time would import
    TensorFlow with the package. The layers keep their kernels' math in
    their own modules (`relative_attention.masked_scores`,
    `decoder_block.LayerNorm`)."""
    if name not in _KERNELS:
        import tensorflow as tf

        _KERNELS[name] = tf.function(function, jit_compile=True)
    return _KERNELS[name]


def in_xla_context():
    """Whether the code being traced is XLA-compiled (`jit_compile=True`, a TPU).

    TensorFlow's own test for it: the XLA control-flow context its tf.function
    enters while tracing a jit-compiled function (what TensorFlow's ops
    consult to pick XLA-friendly forms). Keras has no public equivalent.
    """
    import tensorflow as tf

    return tf.__internal__.get_enclosing_xla_context() is not None
