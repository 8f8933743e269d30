"""The stateless core: `(token_ids, memory) -> (hidden, new_memory)`.

Every entry point (the Keras model, stateful or not, training steps, export
signatures, generation) calls this one function; the math lives here.

Shape legend: B batch, T segment, M memory_length, K = M + T, L num_layers,
N num_heads, H head_dim, D hidden_dim.
"""

import keras
from keras import ops

from keras_txl.adaptive import AdaptiveEmbedding
from keras_txl.config import TransformerXLConfig
from keras_txl.decoder_block import TransformerXLBlock
from keras_txl.memory import attention_mask
from keras_txl.memory import update_memory
from keras_txl.memory import zero_memory
from keras_txl.position_encoding import absolute_position_embedding
from keras_txl.position_encoding import relative_position_embedding


@keras.saving.register_keras_serializable(package="keras_txl")
class TransformerXLBackbone(keras.layers.Layer):
    """Adaptive embedding + L decoder blocks with segment-level recurrence.

    Memory is one batch-major tensor (B, L, M, D): for layer l, the last M
    *inputs* of layer l (layer 0: the scaled, dropped-out embedding), cut
    from the graph. A missing memory is all-zero memory of full length (what
    the official TF code and Hugging Face do). With M == 0 there is no
    recurrence and the memory has shape (B, L, 0, D).

    Args:
        config: `TransformerXLConfig` or its dict.

    Call arguments:
        token_ids: (B, T) int32.
        memory: (B, L, M, D) float32, or None.
        training: bool.
        return_details: bool. Also return per-layer attention details and
            hidden states (for analysis; slower).

    Returns:
        `(hidden, new_memory)`: (B, T, D) final hidden states (after the
        final dropout, before the softmax) and (B, L, M, D) float32 memory;
        with `return_details`, a third item, a dict of per-layer lists.

    Reference:
        Dai et al., 2019, arXiv:1901.02860, sections 3.2 and 3.3.
    """

    def __init__(self, config, **kwargs):
        # The float32 memory must not be cast to the compute dtype on entry.
        kwargs.setdefault("autocast", False)
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = TransformerXLConfig.from_dict(config)
        self.config = config
        cfg = config
        init = keras.initializers.RandomNormal(stddev=cfg.init_std)
        self.token_embedding = AdaptiveEmbedding(
            cfg, dtype=self.dtype_policy, name="token_embedding"
        )
        self.blocks = [
            TransformerXLBlock(
                num_heads=cfg.num_heads,
                head_dim=cfg.resolved_head_dim,
                intermediate_dim=cfg.intermediate_dim,
                dropout=cfg.dropout,
                attention_dropout=cfg.attention_dropout,
                pre_layer_norm=cfg.pre_layer_norm,
                layer_norm_epsilon=cfg.layer_norm_epsilon,
                relative=self.relative,
                kernel_initializer=init,
                dtype=self.dtype_policy,
                name=f"block_{i}",
            )
            for i in range(cfg.num_layers)
        ]
        self._embedding_dropout = keras.layers.Dropout(cfg.dropout)
        self._position_dropout = keras.layers.Dropout(cfg.dropout)
        self._output_dropout = keras.layers.Dropout(cfg.dropout)

    @property
    def relative(self):
        return self.config.attention_type == "relative"

    def build(self, input_shape=None):
        cfg = self.config
        self.token_embedding.build()
        for block in self.blocks:
            block.build((None, None, cfg.hidden_dim))
        if self.relative:
            bias_shape = (cfg.num_heads, cfg.resolved_head_dim)
            if cfg.untie_relative_bias:
                bias_shape = (cfg.num_layers, *bias_shape)
            init = keras.initializers.RandomNormal(stddev=cfg.init_std)
            # u and v of the paper (r_w_bias / r_r_bias in the official code).
            self.content_bias = self.add_weight(
                name="content_bias", shape=bias_shape, initializer=init
            )
            self.position_bias = self.add_weight(
                name="position_bias", shape=bias_shape, initializer=init
            )
        self.built = True

    def _layer_biases(self, layer):
        if not self.relative:
            return None, None
        if self.config.untie_relative_bias:
            return self.content_bias[layer], self.position_bias[layer]
        return self.content_bias, self.position_bias

    def call(self, token_ids, memory=None, training=False, return_details=False):
        cfg = self.config
        batch_size, segment_length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
        memory_length = cfg.memory_length
        if memory is None:
            memory = zero_memory(
                batch_size, cfg.num_layers, memory_length, cfg.hidden_dim
            )
        x = self.token_embedding(token_ids)  # (B, T, D)
        if not self.relative:
            x = x + ops.cast(
                absolute_position_embedding(segment_length, cfg.hidden_dim),
                x.dtype,
            )
        x = self._embedding_dropout(x, training=training)
        mask = attention_mask(
            segment_length, memory_length, cfg.same_length,
            cfg.same_length_convention,
        )  # (T, K)
        position_embedding = None
        if self.relative:
            position_embedding = relative_position_embedding(
                segment_length + memory_length, cfg.hidden_dim,
                cfg.clamp_length,
            )  # (K, D)
            position_embedding = self._position_dropout(
                ops.cast(position_embedding, self.compute_dtype),
                training=training,
            )
        new_memory = []
        details = {"attention": [], "hidden": []}
        for layer, block in enumerate(self.blocks):
            # h~ = [SG(m) o h] (paper section 3.2): the memory is a constant
            # in this segment, whether it came from the model or the caller.
            layer_memory = ops.stop_gradient(memory[:, layer])  # (B, M, D)
            new_memory.append(update_memory(layer_memory, x, memory_length))
            content_bias, position_bias = self._layer_biases(layer)
            x = block(
                x, layer_memory, position_embedding=position_embedding,
                content_bias=content_bias, position_bias=position_bias,
                attention_mask=mask, training=training,
                return_scores=return_details,
            )
            if return_details:
                x, attention = x
                details["attention"].append(attention)
                details["hidden"].append(x)
        x = self._output_dropout(x, training=training)
        # Memory is float32 whatever the compute dtype (it is exported and
        # fed back by clients).
        new_memory = ops.cast(ops.stack(new_memory, axis=1), "float32")  # (B,L,M,D)
        if return_details:
            return x, new_memory, details
        return x, new_memory

    def get_config(self):
        config = super().get_config()
        config.update(config=self.config.to_dict())
        return config
