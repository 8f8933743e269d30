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
from keras_txl.memory import last_positions
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

    def _embed(self, token_ids, training):
        x = self.token_embedding(token_ids)  # (B, T, D)
        if not self.relative:
            x = x + ops.cast(
                absolute_position_embedding(
                    ops.shape(token_ids)[1], self.config.hidden_dim
                ),
                x.dtype,
            )
        return self._embedding_dropout(x, training=training)

    def _attention_mask(self, segment_length):
        cfg = self.config
        return attention_mask(
            segment_length, cfg.memory_length, cfg.same_length,
            cfg.same_length_convention,
        )  # (T, K)

    def _position_embedding(self, key_length, training):
        cfg = self.config
        position_embedding = relative_position_embedding(
            key_length, cfg.hidden_dim, cfg.clamp_length
        )  # (K, D)
        return self._position_dropout(
            ops.cast(position_embedding, self.compute_dtype),
            training=training,
        )

    def call(self, token_ids, memory=None, training=False, return_details=False):
        cfg = self.config
        batch_size, segment_length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
        memory_length = cfg.memory_length
        if memory is None:
            memory = zero_memory(
                batch_size, cfg.num_layers, memory_length, cfg.hidden_dim
            )
        x = self._embed(token_ids, training)  # (B, T, D)
        mask = self._attention_mask(segment_length)  # (T, K)
        position_embedding = None
        if self.relative:
            position_embedding = self._position_embedding(
                segment_length + memory_length, training
            )  # (K, D)
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

    # === Memory key/value cache (inference) ===
    def build_cache(self, memory, segment_length=1):
        """The memory with its keys and values projected, for decoding.

        Decoding one token at a time re-projects, in every layer, the keys
        and values of all M memory positions and the position matrix
        `W_R R`. The cache holds them instead; `call_with_cache` projects
        only the new positions and slides every window by T.

        The cache holds one tensor per layer (L-tuples), not one stacked
        tensor: a step reads each layer's window without slicing it out
        and writes it without re-stacking (two copies of the whole cache
        saved per step; data movement dominates a one-token step on CPU).

        Args:
            memory: (B, L, M, D) float32 memory, e.g. returned after the
                prompt.
            segment_length: int. The T of the coming `call_with_cache`
                calls (1 to decode): `W_R R` depends only on K = M + T.

        Returns:
            dict of L-tuples: "memory" (B, M, D) float32, "keys" and
            "values" (B, M, N, H) in the compute dtype and, in relative
            mode, "positions" (M + T, N, H), `W_R R` of each layer.
        """
        memory = ops.cast(memory, "float32")
        layers = [memory[:, layer] for layer in range(len(self.blocks))]
        projected = [
            block.project_memory(layer_memory)  # (B, M, N, H) twice
            for block, layer_memory in zip(self.blocks, layers)
        ]
        cache = {
            "memory": tuple(layers),
            "keys": tuple(k for k, _ in projected),
            "values": tuple(v for _, v in projected),
        }
        if self.relative:
            cache["positions"] = self._position_projections(
                self.config.memory_length + segment_length
            )
        return cache

    def _position_projections(self, key_length):
        position_embedding = self._position_embedding(key_length, False)
        return tuple(
            block.attention.project_positions(position_embedding)
            for block in self.blocks
        )  # L x (K, N, H)

    def call_with_cache(self, token_ids, cache):
        """Inference over one segment with a cache from `build_cache`.

        Equals `call(token_ids, memory)` (no dropout) for the memory the
        cache holds: the blocks run the same attention code on the cached
        keys and values of the memory plus those of the T new positions.

        Args:
            token_ids: (B, T) int32.
            cache: dict from `build_cache` or a previous `call_with_cache`.

        Returns:
            `(hidden (B, T, D), new_cache)`; `stack_memory(new_cache)` is
            the new memory `call` would return.
        """
        memory_length = self.config.memory_length
        segment_length = ops.shape(token_ids)[1]
        x = self._embed(token_ids, False)  # (B, T, D)
        mask = self._attention_mask(segment_length)  # (T, K)
        positions = cache.get("positions")
        static_length = token_ids.shape[1]
        if self.relative and (
            positions is None
            or static_length is None
            or positions[0].shape[0] != memory_length + static_length
        ):
            # Built for another T: project R for this K once, for all layers.
            positions = self._position_projections(
                memory_length + segment_length
            )

        def slide(window):
            # (B, M + T, ...) -> the last M positions, as `update_memory`.
            if memory_length == 0:
                return window[:, :0]
            return last_positions(window, memory_length)

        new_memory, new_keys, new_values = [], [], []
        for layer, block in enumerate(self.blocks):
            new_memory.append(
                update_memory(cache["memory"][layer], x, memory_length)
            )
            content_bias, position_bias = self._layer_biases(layer)
            x, keys, values = block.call_with_cache(
                x, cache["keys"][layer], cache["values"][layer],
                position_projection=None if positions is None else positions[layer],
                content_bias=content_bias, position_bias=position_bias,
                attention_mask=mask,
            )  # keys, values: (B, M + T, N, H)
            new_keys.append(slide(keys))
            new_values.append(slide(values))
        new_cache = {
            "memory": tuple(ops.cast(m, "float32") for m in new_memory),
            "keys": tuple(new_keys),
            "values": tuple(new_values),
        }
        if "positions" in cache:
            new_cache["positions"] = cache["positions"]
        return x, new_cache

    @staticmethod
    def stack_memory(cache):
        """The (B, L, M, D) float32 memory held by a cache."""
        return ops.stack(cache["memory"], axis=1)

    def get_config(self):
        config = super().get_config()
        config.update(config=self.config.to_dict())
        return config
