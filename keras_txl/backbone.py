"""The stateless core: `(token_ids, memory) -> (hidden, new_memory)`.

Every entry point (the Keras model, stateful or not, training steps, export
signatures, generation) calls this one function; the math lives here.

Shape legend: B batch, T segment, M memory_length, K = M + T, L num_layers,
N num_heads, H head_dim, D hidden_dim.
"""

import os

import keras
from keras import ops
from keras_hub.models import Backbone

from keras_txl.adaptive import AdaptiveEmbedding
from keras_txl.checks import positive_int
from keras_txl.config import TransformerXLConfig
from keras_txl.decoder_block import TransformerXLBlock
from keras_txl.host import check_cpu_precision
from keras_txl.memory import attention_mask
from keras_txl.memory import memory_attention_mask
from keras_txl.memory import update_memory
from keras_txl.memory import update_memory_mask
from keras_txl.memory import zero_memory
from keras_txl.position_encoding import absolute_position_embedding
from keras_txl.position_encoding import relative_position_embedding


class SubclassedModelType(type):
    """The metaclass of keras-txl's models: they stay subclassed models.

    When a functional model whose class derives from a subclass of
    `keras.Model` is built (every keras-hub model: `GPT2Backbone(...)`,
    `Backbone.from_preset(...)` of another architecture), Keras rewrites the
    bases of that chain so that `keras.Model` becomes `Functional`
    (keras-team/keras#17270), and with it the bases of keras-hub's shared
    `Backbone` and `Task`, for the rest of the process. Python then
    recomputes the method resolution order of every subclass, ours
    included: their constructors asked for `inputs` and `outputs` and the
    models built before failed at their next call. The resolution order of
    a class of this type leaves out `Functional` (and its `Function` base),
    whatever Keras does to keras-hub's classes: its methods are keras-hub's
    and `keras.Model`'s, as they were written against.
    """

    def mro(cls):
        from keras.src.models.functional import Functional

        functional = set(Functional.__mro__) - set(keras.Model.__mro__)
        return [base for base in super().mro() if base not in functional]


def _check_cpu_dtype(policy):
    """A bfloat16 (float16) policy on a CPU whose oneDNN is capped below the level
    that has those matmuls would crash TensorFlow at the first one
    (`keras_txl.host.check_cpu_precision`): raise a clear error at construction
    instead. Where a GPU or TPU is visible the matmuls run there and nothing is
    checked."""
    if policy.compute_dtype not in ("bfloat16", "float16"):
        return
    import tensorflow as tf  # the only backend keras-txl runs on

    if tf.config.list_physical_devices("GPU") or tf.config.list_physical_devices("TPU"):
        return
    check_cpu_precision(policy.name)


@keras.saving.register_keras_serializable(package="keras_txl")
class TransformerXLBackbone(Backbone, metaclass=SubclassedModelType):
    """Adaptive embedding + L decoder blocks with segment-level recurrence.

    A `keras_hub.models.Backbone`: `get_config()` holds the hyper-parameters
    (the fields of `TransformerXLConfig`) flat, as every keras-hub backbone
    does, so `from_preset` / `save_to_preset` and `from_config` work; the
    same fields are also available as one `TransformerXLConfig` (`.config`).

    Unlike keras-hub's functional backbones, this one is a subclassed model:
    its call takes and returns the memory, which a functional graph of
    fixed inputs cannot carry across calls of different segment lengths.

    Memory is one batch-major tensor (B, L, M, D): for layer l, the last M
    *inputs* of layer l (layer 0: the scaled, dropped-out embedding), cut
    from the graph. A missing memory is M zero vectors (what the official TF
    code and Hugging Face do), or, with `empty_memory="masked"`, M masked
    slots (the PyTorch reference). With M == 0 there is no recurrence and
    the memory has shape (B, L, 0, D).

    Args:
        config: `TransformerXLConfig` or its dict; or leave it out and pass
            the config's fields as keyword arguments (keras-hub style).
        dtype: dtype policy (e.g. "mixed_bfloat16").

    Call arguments:
        token_ids: (B, T) int32, or keras-hub's dict with a "token_ids"
            entry (a "padding_mask" entry is not needed: a causal model
            never lets text attend to the padding after it).
        memory: (B, L, M, D) float32, or None.
        training: bool.
        return_details: bool. Also return per-layer attention details and
            hidden states (for analysis; slower).
        memory_mask: (B, M) bool or None: which memory slots hold real
            memory (None: all of them, or none with `empty_memory="masked"`
            and no memory). `update_memory_mask` gives the next one.

    Returns:
        `(hidden, new_memory)`: (B, T, D) final hidden states (after the
        final dropout, before the softmax) and (B, L, M, D) float32 memory;
        with `return_details`, a third item, a dict of per-layer lists.

    Example:
    ```python
    backbone = keras_txl.TransformerXLBackbone(
        vocabulary_size=256, num_layers=2, hidden_dim=32, num_heads=2,
        intermediate_dim=64, memory_length=16,
    )
    hidden, memory = backbone(np.zeros((2, 8), "int32"))
    hidden, memory = backbone(next_ids, memory)
    ```

    Reference:
        Dai et al., 2019, arXiv:1901.02860, sections 3.2 and 3.3.
    """

    def __init__(self, config=None, dtype=None, **kwargs):
        fields = {
            key: kwargs.pop(key) for key in list(kwargs)
            if key in TransformerXLConfig.__dataclass_fields__
        }
        if config is None:
            config = TransformerXLConfig.from_dict(fields)
        elif fields:
            raise ValueError(
                "Pass either `config` or the config's fields as keyword "
                f"arguments, not both; received config and {sorted(fields)}."
            )
        if isinstance(config, dict):
            config = TransformerXLConfig.from_dict(config)
        if not isinstance(config, TransformerXLConfig):
            raise ValueError(
                "`config` must be a TransformerXLConfig or a dict, received "
                f"{type(config).__name__}."
            )
        # The float32 memory must not be cast to the compute dtype on entry.
        kwargs.setdefault("autocast", False)
        super().__init__(dtype=dtype, **kwargs)
        _check_cpu_dtype(self.dtype_policy)
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
        # The layer's policy: under mixed precision they pass the compute
        # dtype through (a float32 dropout would cast back).
        self._embedding_dropout = keras.layers.Dropout(cfg.dropout, dtype=self.dtype_policy)
        self._position_dropout = keras.layers.Dropout(cfg.dropout, dtype=self.dtype_policy)
        self._output_dropout = keras.layers.Dropout(cfg.dropout, dtype=self.dtype_policy)
        self.build()

    # keras-hub's names for the shape of the model.
    @property
    def vocabulary_size(self):
        return self.config.vocabulary_size

    @property
    def num_layers(self):
        return self.config.num_layers

    @property
    def hidden_dim(self):
        return self.config.hidden_dim

    @property
    def memory_length(self):
        return self.config.memory_length

    @property
    def relative(self):
        return self.config.attention_type == "relative"

    def build(self, input_shape=None):
        if self.built:  # built in __init__; a Model's build may be called again
            return
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
                    ops.shape(token_ids)[1], self.config.hidden_dim,
                    self.config.position_frequency_dtype,
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
            key_length, cfg.hidden_dim, cfg.clamp_length,
            cfg.position_frequency_dtype,
        )  # (K, D)
        return self._position_dropout(
            ops.cast(position_embedding, self.compute_dtype),
            training=training,
        )

    def resolve_memory_mask(self, memory, memory_mask, batch_size):
        """The (B, M) validity of the memory slots, or None (all valid)."""
        cfg = self.config
        if memory_mask is None and memory is None and (
            cfg.empty_memory == "masked" and cfg.memory_length > 0
        ):
            return ops.zeros((batch_size, cfg.memory_length), "bool")
        return memory_mask

    def call(self, token_ids, memory=None, training=False, return_details=False,
             memory_mask=None, layer_intercept_fn=None):
        """`layer_intercept_fn(x, index)`, keras-hub's hook of
        `CausalLM.score`: called on the embeddings (index -1) and on each
        block's output (0-based), its result going on in their place (into
        the next block and the next layer's memory)."""
        cfg = self.config
        if isinstance(token_ids, dict):
            token_ids = token_ids["token_ids"]
        batch_size, segment_length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
        memory_length = cfg.memory_length
        memory_mask = self.resolve_memory_mask(memory, memory_mask, batch_size)
        if memory is None:
            memory = zero_memory(
                batch_size, cfg.num_layers, memory_length, cfg.hidden_dim
            )
        x = self._embed(token_ids, training)  # (B, T, D)
        if layer_intercept_fn is not None:
            x = layer_intercept_fn(x, -1)
        mask = self._attention_mask(segment_length)  # (T, K)
        if memory_mask is not None:
            mask = memory_attention_mask(mask, memory_mask)  # (B, T, K)
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
            if layer_intercept_fn is not None:
                x = layer_intercept_fn(x, layer)
        x = self._output_dropout(x, training=training)
        # Memory is float32 whatever the compute dtype (it is exported and
        # fed back by clients).
        new_memory = ops.cast(ops.stack(new_memory, axis=1), "float32")  # (B,L,M,D)
        if return_details:
            return x, new_memory, details
        return x, new_memory

    # === Memory key/value cache (inference) ===
    def build_cache(self, memory, segment_length=1, memory_mask=None, keep_memory=True):
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
            memory_mask: (B, M) bool or None, as in `call`.
            keep_memory: bool. Whether the cache also carries the memory
                itself, slid by every `call_with_cache` so that
                `stack_memory` can return it. Evaluation, which needs only
                the keys and values, passes False: in float32 the memory is
                a third of what a step copies to slide the cache, in
                mixed_bfloat16 half (float32 beside bfloat16 keys and
                values).

        Returns:
            dict of L-tuples: "memory" (B, M, D) float32 (with
            `keep_memory`), "keys"
            (B, N, H, M) and "values" (B, N, M, H) in the compute dtype (the
            layouts the attention's products read, so a step neither
            transposes nor re-lays the cache) and, in relative mode,
            "positions" (N, H, M + T + 1), `[0 ; W_R R]` of each layer
            (`RelativeMultiHeadAttention.project_positions`); with a memory
            mask, "memory_mask" (B, M) bool, slid with the memory.
        """
        memory = ops.cast(memory, "float32")
        layers = [memory[:, layer] for layer in range(len(self.blocks))]
        projected = [
            block.project_memory(layer_memory)  # keys, values
            for block, layer_memory in zip(self.blocks, layers)
        ]
        cache = {
            "keys": tuple(k for k, _ in projected),
            "values": tuple(v for _, v in projected),
        }
        if keep_memory:
            cache["memory"] = tuple(layers)
        if memory_mask is not None:
            cache["memory_mask"] = ops.cast(memory_mask, "bool")
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
        )  # L x (N, H, K+1)

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
            the new memory `call` would return (if the cache keeps the
            memory, `build_cache(keep_memory=True)`).
        """
        memory_length = self.config.memory_length
        segment_length = ops.shape(token_ids)[1]
        x = self._embed(token_ids, False)  # (B, T, D)
        mask = self._attention_mask(segment_length)  # (T, K)
        memory_mask = cache.get("memory_mask")
        if memory_mask is not None:
            mask = memory_attention_mask(mask, memory_mask)  # (B, T, K)
        positions = cache.get("positions")
        static_length = token_ids.shape[1]
        if self.relative and (
            positions is None
            or static_length is None
            or positions[0].shape[-1] != memory_length + static_length + 1
        ):
            # Built for another T: project R for this K once, for all layers.
            positions = self._position_projections(
                memory_length + segment_length
            )

        new_memory, new_keys, new_values = [], [], []
        keep_memory = "memory" in cache
        for layer, block in enumerate(self.blocks):
            if keep_memory:
                new_memory.append(
                    update_memory(cache["memory"][layer], x, memory_length)
                )
            content_bias, position_bias = self._layer_biases(layer)
            x, keys, values = block.call_with_cache(
                x, cache["keys"][layer], cache["values"][layer],
                position_projection=None if positions is None else positions[layer],
                content_bias=content_bias, position_bias=position_bias,
                attention_mask=mask, memory_length=memory_length,
            )  # the next cache: keys (B, N, H, M), values (B, N, M, H)
            new_keys.append(keys)
            new_values.append(values)
        new_cache = {"keys": tuple(new_keys), "values": tuple(new_values)}
        if keep_memory:
            new_cache["memory"] = tuple(ops.cast(m, "float32") for m in new_memory)
        if memory_mask is not None:
            new_cache["memory_mask"] = update_memory_mask(
                memory_mask, segment_length, memory_length
            )
        if "positions" in cache:
            new_cache["positions"] = cache["positions"]
        return x, new_cache

    @staticmethod
    def stack_memory(cache):
        """The (B, L, M, D) float32 memory held by a cache."""
        if "memory" not in cache:
            raise ValueError(
                "This cache does not keep the memory (it was built with "
                "`build_cache(..., keep_memory=False)`): build it with "
                "`keep_memory=True` to read the memory back.")
        return ops.stack(cache["memory"], axis=1)

    # --- keras-hub: LoRA --------------------------------------------------
    def default_lora_layer_names(self):
        """The layers `enable_lora(rank)` adapts: each block's feed-forward
        Dense layers. keras-hub's defaults (the attention's "query_dense",
        "value_dense") name no layer here: the attention keeps its query,
        key and value projections in one fused weight, without LoRA."""
        return ["intermediate_dense", "output_dense"]

    def enable_lora(self, rank, target_layer_names=None):
        """keras-hub's `enable_lora`: freezes the backbone's weights and adds
        rank-`rank` adapters to the layers named `target_layer_names`
        (default `default_lora_layer_names()`, the feed-forward Dense
        layers), the only weights left to train; `save_lora_weights` /
        `load_lora_weights` save and load those.

        keras-hub froze every layer and adapted none, in silence, when no
        layer had the names given (as with its defaults here), and left the
        backbone's own relative biases trainable: names that match no layer
        with LoRA are refused before anything is frozen, and the biases
        are frozen too."""
        rank = positive_int("rank", rank)
        names = self.default_lora_layer_names() if target_layer_names is None else target_layer_names
        if isinstance(names, str):
            names = [names]
        capable = sorted({layer.name for layer in self._flatten_layers(include_self=False)
                          if layer.weights and hasattr(layer, "enable_lora")})
        if not any(name in capable for name in names):
            raise ValueError(
                f"`target_layer_names`={list(names)!r} name no layer with LoRA in this "
                f"TransformerXLBackbone; those that have it: {capable} (the attention's "
                "query/key/value projection is one fused weight, without LoRA)."
            )
        super().enable_lora(rank, target_layer_names=list(names))
        self._lora_target_names = list(names)  # a copy adapts the same layers
        for variable in self._trainable_variables:  # content/position biases
            variable.trainable = False

    @classmethod
    def from_preset(cls, preset, load_weights=True, limits=None, **kwargs):
        """keras-hub's `Backbone.from_preset`, with a local folder checked
        first as `TransformerXLCausalLM.from_preset` checks it: the config a
        TransformerXLBackbone's within `limits` (see `keras_txl.limits`),
        every file keras-hub reads present, regular and bounded, its
        manifest matched, and the weights floating point and finite; `hf://`
        and `kaggle://` handles fail by name when they cannot be downloaded.

        Args:
            preset: a local preset folder (a backbone's or a task's) or a
                keras-hub handle.
            load_weights: bool.
            limits: None, a dict or a `keras_txl.limits.Limits`.
            **kwargs: passed to keras-hub (e.g. `dtype`).
        """
        from keras_txl import folders

        if folders.is_local_preset(preset):
            preset = os.fspath(preset)
            folders.check_preset_folder(preset, limits)
            return folders.load_preset_folder(
                super().from_preset, preset, load_weights=load_weights, **kwargs)
        return folders.load_preset_handle(
            super().from_preset, preset, load_weights=load_weights, **kwargs)

    def save_to_preset(self, preset_dir, max_shard_size=10):
        """keras-hub's `save_to_preset`, written atomically with a
        `manifest.json` (`keras_txl.folders.save_preset_part`): the preset
        is written beside `preset_dir` under a temporary name and renamed
        into place, so a failed or killed save leaves the previous folder as
        it was, and a later load checks every file against the manifest.
        The previous backbone's files (config, metadata, weights and weight
        shards) are replaced; a tokenizer or preprocessor saved there is
        kept. `preset_dir` must be new, an empty folder or a keras-hub
        preset (of a TransformerXLBackbone, or of a tokenizer alone).

        A whole model's task files there (`task.json`, `task.weights.h5`)
        are kept when this backbone has the previous one's config, and
        removed with a warning when it has another (they describe the
        previous backbone, and a loader refuses a task of another config:
        the folder would not load); the preset then loads as this backbone
        with the kept preprocessor.
        """
        from keras_txl import folders

        folders.save_preset_part(
            preset_dir,
            lambda folder: Backbone.save_to_preset(self, folder, max_shard_size=max_shard_size),
            folders.BACKBONE_ENTRIES, config=self.config)

    def load_weights(self, filepath, *args, **kwargs):
        """Keras' `load_weights`; a keras-hub preset's weights file (or the
        index of its weight shards) is first checked against the folder's
        `manifest.json` where it has one.
        keras-hub's own loaders (`keras_hub.models.CausalLM.from_preset`)
        read a preset's weights through here, never through
        `TransformerXLCausalLM.from_preset`, which checks the same."""
        from keras_txl import folders

        if isinstance(filepath, (str, os.PathLike)):
            directory, name = os.path.split(os.path.abspath(os.fspath(filepath)))
            if (name in (folders.PRESET_WEIGHTS_FILE, folders.PRESET_SHARD_INDEX)
                    and os.path.isfile(os.path.join(directory, folders.CONFIG_FILE))):
                folders.verify_manifest(directory)
        return super().load_weights(filepath, *args, **kwargs)

    def get_config(self):
        # keras-hub style: the hyper-parameters flat beside name/dtype.
        config = super().get_config()
        config.update(self.config.to_dict())
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if "config" in config:  # written by keras-txl before 0.2
            config.update(config.pop("config"))
        return super().from_config(config)
