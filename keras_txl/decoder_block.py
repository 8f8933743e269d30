"""One Transformer-XL decoder block: relative attention + position-wise FFN.

Shape legend: B batch, T segment, M memory, K = M + T, D hidden_dim.
"""

import keras
from keras import ops

from keras_txl import fusion
from keras_txl.relative_attention import RelativeMultiHeadAttention


def relu_dropout(x, rate, seed):
    """`dropout(relu(x))` (inverted dropout) that keeps only its output.

    Composed from `relu` and `Dropout`, the backward pass would keep the
    relu output, the dropped output and the keep mask. The gradient needs
    the output only: `y = relu(x) * keep / (1 - rate)` is positive exactly
    where `x > 0` and the unit is kept, which is where dy/dx = 1/(1 - rate)
    (0 elsewhere, as TensorFlow's relu gradient at 0).

    Args:
        x: tensor, the pre-activation.
        rate: float in (0, 1), the dropout rate.
        seed: a `keras.random.SeedGenerator` (one draw per call, as
            `keras.layers.Dropout`).
    """
    import tensorflow as tf  # the only backend keras-txl runs on

    if not 0.0 < rate < 1.0:
        raise ValueError(f"`rate` must be in (0, 1), received rate={rate!r}.")
    keep = keras.random.uniform(ops.shape(x), seed=seed) >= rate
    scale = 1.0 / (1.0 - rate)

    @ops.custom_gradient
    def forward(x):
        y = ops.where(ops.logical_and(keep, x > 0), x * scale, ops.zeros_like(x))

        def backward(*args, upstream=None):
            upstream = args[0] if upstream is None else upstream
            # relu's gradient kernel, fed the output: `upstream * [y > 0]` in
            # one op that needs the upstream gradient (a separate `y > 0`
            # would be computed, and kept, as soon as y exists).
            return tf.raw_ops.ReluGrad(gradients=upstream * scale, features=y)

        return y, backward

    return forward(x)


def standardize(x, epsilon):
    """`(x_hat, rstd)` over the last axis: the float32 normalisation both
    layer-norm paths share (the graph one, whose gradient keeps these two,
    and the XLA-compiled one)."""
    mean = ops.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    variance = ops.mean(ops.square(centered), axis=-1, keepdims=True)
    rstd = ops.rsqrt(variance + epsilon)  # (.., 1)
    return centered * rstd, rstd


def _norm_kernel(x, residual, gamma, beta, epsilon):
    # `LN(x + residual)` in float32 (the sum too), back in x's dtype: the
    # body of the XLA-compiled norm (`keras_txl.fusion`).
    dtype = x.dtype
    x = ops.cast(x, "float32")
    if residual is not None:
        x = x + ops.cast(residual, "float32")
    x_hat, _ = standardize(x, epsilon)
    return ops.cast(x_hat * gamma + beta, dtype)


@keras.saving.register_keras_serializable(package="keras_txl")
class LayerNorm(keras.layers.LayerNormalization):
    """`LayerNormalization` over the last axis whose gradient keeps less.

    Same weights (`gamma`, `beta`) and values (computed in float32 and cast
    back, like Keras). Keras' form `x * inv + (beta - mean * inv)` keeps the
    input and a full-size `inv * gamma` for its gradient; this keeps only
    the normalised input `x_hat` and the (.., 1) inverse deviation:

        dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)),  g = dy * gamma
    """

    def _fusable(self, inputs):
        return (fusion.enabled() and not self.rms_scaling
                and self.axis in (-1, [-1], [len(inputs.shape) - 1]))

    def _fused(self, inputs, residual):
        """The XLA-compiled norm of `inputs (+ residual)`, the sum taken in
        float32 (`keras_txl.fusion`)."""
        dtype = self.compute_dtype
        return fusion.compiled("layer_norm", _norm_kernel)(
            ops.cast(inputs, dtype),
            None if residual is None else ops.cast(residual, dtype),
            ops.cast(self.gamma, "float32"), ops.cast(self.beta, "float32"),
            float(self.epsilon),
        )

    def normalize_sum(self, inputs, residual, training=False):
        """`self(inputs + residual)`; one fused kernel at inference under
        `keras_txl.fusion.fused_kernels`, where the sum is taken in float32
        (not rounded to the compute dtype first)."""
        if not training and self._fusable(inputs):
            return self._fused(inputs, residual)
        return self(inputs + residual, training=training)

    def call(self, inputs, training=None):
        if not training and self._fusable(inputs):
            return self._fused(inputs, None)
        if self.axis not in (-1, [-1], [len(inputs.shape) - 1]) or self.rms_scaling:
            return super().call(inputs)
        epsilon = self.epsilon
        gamma = ops.cast(self.gamma, "float32")
        beta = ops.cast(self.beta, "float32")

        @ops.custom_gradient
        def normalize(x, gamma, beta):
            x_hat, rstd = standardize(ops.cast(x, "float32"), epsilon)
            y = x_hat * gamma + beta

            def backward(*args, upstream=None):
                upstream = args[0] if upstream is None else upstream
                dy = ops.cast(upstream, "float32")
                reduce_axes = tuple(range(len(dy.shape) - 1))
                d_gamma = ops.sum(dy * x_hat, axis=reduce_axes)
                d_beta = ops.sum(dy, axis=reduce_axes)
                g = dy * gamma
                dx = rstd * (
                    g - ops.mean(g, axis=-1, keepdims=True)
                    - x_hat * ops.mean(g * x_hat, axis=-1, keepdims=True)
                )
                return ops.cast(dx, inputs.dtype), d_gamma, d_beta

            return y, backward

        return ops.cast(normalize(inputs, gamma, beta), self.compute_dtype)


@keras.saving.register_keras_serializable(package="keras_txl")
class TransformerXLBlock(keras.layers.Layer):
    """Decoder block, post-LN (the paper) or pre-LN.

    Post-LN: `h = LN(h + Attn([mem ; h]))`, then `h = LN(h + FFN(h))`.
    Pre-LN: `h = h + Attn(LN([mem ; h]))`, then `h = h + FFN(LN(h))`; the
    stored memory itself is never normalised. FFN is
    `Dense(intermediate, relu) -> dropout -> Dense(D) -> dropout`.

    Args:
        num_heads: int.
        head_dim: int.
        intermediate_dim: int.
        dropout: float.
        attention_dropout: float.
        pre_layer_norm: bool.
        layer_norm_epsilon: float.
        relative: bool. Relative attention (False: vanilla attention).
        kernel_initializer: initializer.

    Call arguments:
        hidden: (B, T, D) input of the block.
        memory: (B, M, D) memory of this block.
        position_embedding, content_bias, position_bias, attention_mask,
        training, return_scores: as in `RelativeMultiHeadAttention`.

    Returns:
        (B, T, D) tensor (and the attention details with `return_scores`).
    """

    def __init__(
        self,
        num_heads,
        head_dim,
        intermediate_dim,
        dropout=0.0,
        attention_dropout=0.0,
        pre_layer_norm=False,
        layer_norm_epsilon=1e-5,
        relative=True,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.pre_layer_norm = pre_layer_norm
        self.layer_norm_epsilon = layer_norm_epsilon
        self.relative = relative
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

        self.attention = RelativeMultiHeadAttention(
            num_heads, head_dim, dropout=dropout,
            attention_dropout=attention_dropout, relative=relative,
            kernel_initializer=self.kernel_initializer, dtype=self.dtype_policy,
            name="attention",
        )
        self.attention_norm = LayerNorm(
            epsilon=layer_norm_epsilon, dtype=self.dtype_policy,
            name="attention_norm",
        )
        # The relu is applied in `_feedforward` (fused with the dropout).
        self.intermediate_dense = keras.layers.Dense(
            intermediate_dim,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy, name="intermediate_dense",
        )
        self.output_dense = None  # created in build: needs D
        self.feedforward_norm = LayerNorm(
            epsilon=layer_norm_epsilon, dtype=self.dtype_policy,
            name="feedforward_norm",
        )
        self._intermediate_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
        self._output_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def build(self, hidden_shape):
        hidden_dim = hidden_shape[-1]
        self.attention.build(hidden_shape)
        self.attention_norm.build(hidden_shape)
        self.intermediate_dense.build(hidden_shape)
        self.output_dense = keras.layers.Dense(
            hidden_dim, kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy, name="output_dense",
        )
        self.output_dense.build((*hidden_shape[:-1], self.intermediate_dim))
        self.feedforward_norm.build(hidden_shape)
        self.built = True

    def _feedforward(self, x, training):
        # On (B*T, D) rows: a 2-D matmul lets TensorFlow's remapper fuse
        # the bias add (and the relu, at inference) into the oneDNN matmul.
        shape = ops.shape(x)
        x = ops.reshape(x, (-1, x.shape[-1]))
        x = self.intermediate_dense(x)
        if training and self.dropout > 0:
            x = relu_dropout(
                x, self.dropout, self._intermediate_dropout.seed_generator
            )
        else:
            x = ops.relu(x)
        x = ops.reshape(self.output_dense(x), shape)
        return self._output_dropout(x, training=training)

    def _attention_input(self, x):
        # Pre-LN: LN([mem ; h]) == [LN(mem) ; LN(h)], LayerNorm is per
        # position, so memory and segment are normalised separately.
        return self.attention_norm(x) if self.pre_layer_norm else x

    def _residual_and_feedforward(self, hidden, attended, training):
        if self.pre_layer_norm:
            hidden = hidden + attended
            return hidden + self._feedforward(
                self.feedforward_norm(hidden), training
            )
        hidden = self.attention_norm.normalize_sum(hidden, attended, training)
        return self.feedforward_norm.normalize_sum(
            hidden, self._feedforward(hidden, training), training
        )

    def call(
        self,
        hidden,
        memory,
        position_embedding=None,
        content_bias=None,
        position_bias=None,
        attention_mask=None,
        training=False,
        return_scores=False,
    ):
        hidden = ops.cast(hidden, self.compute_dtype)
        memory = ops.cast(memory, self.compute_dtype)
        query = self._attention_input(hidden)
        keys = self._attention_input(memory)
        attended = self.attention(
            query, keys, position_embedding=position_embedding,
            content_bias=content_bias, position_bias=position_bias,
            attention_mask=attention_mask, training=training,
            return_scores=return_scores,
        )
        details = None
        if return_scores:
            attended, details = attended
        hidden = self._residual_and_feedforward(hidden, attended, training)
        if return_scores:
            return hidden, details
        return hidden

    def project_memory(self, memory):
        """(B, M, D) memory -> its keys (B, N, H, M) and values (B, N, M, H).

        What `call` computes for the memory part of `[memory ; segment]`
        (after the pre-LN LayerNorm when `pre_layer_norm`): the cache of
        `call_with_cache`.
        """
        memory = ops.cast(memory, self.compute_dtype)
        return self.attention.project_keys(self._attention_input(memory))

    def call_with_cache(
        self,
        hidden,
        key_cache,
        value_cache,
        position_projection=None,
        content_bias=None,
        position_bias=None,
        attention_mask=None,
        memory_length=None,
    ):
        """Inference with the projected memory (see `project_memory`).

        Equals `call(hidden, memory, ...)` (no dropout) for
        `key_cache, value_cache = project_memory(memory)` and
        `position_projection = attention.project_positions(R)`.

        Returns:
            `(hidden (B, T, D), keys, values)`: the keys (B, N, H, K) and
            values (B, N, K, H) of `[memory ; segment]`, or with
            `memory_length` M their last M positions (the next cache).
        """
        hidden = ops.cast(hidden, self.compute_dtype)
        query = self._attention_input(hidden)
        attended, keys, values = self.attention.call_with_cache(
            query, key_cache, value_cache,
            position_projection=position_projection,
            content_bias=content_bias, position_bias=position_bias,
            attention_mask=attention_mask, memory_length=memory_length,
        )
        hidden = self._residual_and_feedforward(hidden, attended, False)
        return hidden, keys, values

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            intermediate_dim=self.intermediate_dim,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            pre_layer_norm=self.pre_layer_norm,
            layer_norm_epsilon=self.layer_norm_epsilon,
            relative=self.relative,
            kernel_initializer=keras.initializers.serialize(
                self.kernel_initializer
            ),
        )
        return config
