"""XLA-compiled element-wise kernels for graph-mode inference on CPU.

Graph-mode TensorFlow runs every element-wise op as its own pass over
memory. Around the matmuls of a Transformer-XL layer that is most of an
evaluation step on a CPU: a layer norm is about ten ops over the (B, T, D)
activations, and the attention scores take a shift, an add and a mask over
(B, N, T, K) before the softmax. XLA would fuse them, but XLA-compiling the
whole step gives up oneDNN's matmuls (AMX, bf16), which XLA's CPU dots do
not reach. So only these regions are compiled, each into one kernel, and
the matmuls and the softmax stay oneDNN's.

They are used while a graph is traced inside `fused_kernels()`: the
evaluation step (`keras_txl.training.loop.make_eval_step`) is; training
steps and exports (SavedModel, TFLite) are not, and their graphs hold no
XLA-compiled calls.
"""

import contextlib
import contextvars

_ENABLED = contextvars.ContextVar("keras_txl_fused_kernels", default=False)
_KERNELS = {}


@contextlib.contextmanager
def fused_kernels(enabled=True):
    """Inference code traced inside uses the XLA-compiled kernels below."""
    token = _ENABLED.set(bool(enabled))
    try:
        yield
    finally:
        _ENABLED.reset(token)


def enabled():
    return _ENABLED.get()


def _compiled(name, function):
    # Made on first use: a `tf.function` at import time would import
    # TensorFlow with the package.
    if name not in _KERNELS:
        import tensorflow as tf

        _KERNELS[name] = tf.function(function, jit_compile=True)
    return _KERNELS[name]


def _normalize(x, residual, gamma, beta, epsilon):
    import tensorflow as tf

    dtype = x.dtype
    x = tf.cast(x, tf.float32)
    if residual is not None:
        x = x + tf.cast(residual, tf.float32)
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    centered = x - mean
    variance = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
    y = centered * tf.math.rsqrt(variance + epsilon) * gamma + beta
    return tf.cast(y, dtype)


def layer_norm(x, residual, gamma, beta, epsilon):
    """LayerNorm over the last axis of `x (+ residual)`, in float32 (the sum
    too: it is not rounded to x's dtype first), returned in x's dtype.
    `gamma`, `beta`: float32 (D,); `epsilon`: a Python float."""
    return _compiled("layer_norm", _normalize)(x, residual, gamma, beta, float(epsilon))


def _masked_scores(content, padded_position, mask, dtype):
    import tensorflow as tf

    from keras_txl.relative_attention import shift_padded

    scores = tf.cast(content + shift_padded(padded_position), dtype)
    lowest = tf.constant(tf.as_dtype(dtype).min, dtype)
    return scores if mask is None else tf.where(mask, scores, lowest)


def masked_scores(content, padded_position, mask, dtype):
    """`where(mask, content + shift(padded_position), lowest)` in `dtype`.

    `content` (B, N, T, K) and `padded_position` (B, N, T, K+1) (the raw
    position scores with the shift's zero column, see `shift_padded`), in
    the compute dtype; `mask` a bool broadcasting to (B, N, T, K), or None;
    `dtype` the softmax's dtype (the sum is rounded to it once; blocked
    scores get its lowest finite value, as `masking_bias`)."""
    import tensorflow as tf

    scores = _compiled("masked_scores", _masked_scores)(
        content, padded_position, mask, tf.as_dtype(dtype))
    # The call's result has no static shape for grappler's cost model (it
    # warns at the softmax otherwise): restate the content scores' shape.
    return tf.reshape(scores, tf.shape(content))
