"""`TransformerXLCausalLM`: the Keras model users train, save and export.

Shape legend: B batch, T segment, L num_layers, M memory_length,
D hidden_dim, V vocabulary_size.
"""

import math
import numbers

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from keras_txl import checks
from keras_txl.adaptive import AdaptiveSoftmax
from keras_txl.backbone import TransformerXLBackbone
from keras_txl.config import TransformerXLConfig

# initial_memory() refuses to allocate more than this by default (4 GiB).
MAX_INITIAL_MEMORY_BYTES = 4 << 30


def _is_concrete(x):
    """True for numpy arrays and eager tensors: values can be checked now."""
    if isinstance(x, np.ndarray):
        return True
    if isinstance(x, (keras.Variable, keras.KerasTensor)):
        return False
    return (
        tf.is_tensor(x)
        and not isinstance(x, tf.Variable)
        and not tf.is_symbolic_tensor(x)
    )


@keras.saving.register_keras_serializable(package="keras_txl")
class TransformerXLCausalLM(keras.Model):
    """Transformer-XL language model with explicit or stateful memory.

    `call_with_memory(token_ids, memory)` is pure: it returns the log-probs
    and the new memory and touches no state. With `stateful=True` the memory
    lives in a non-trainable variable of shape (batch_size, L, M, D) that
    each call reads and overwrites (like a stateful Keras RNN): the batch
    size is fixed, feed segments in order with `fit(shuffle=False)` and call
    `reset_memory()` between unrelated texts. Under a `tf.distribute`
    strategy `batch_size` is the per-replica batch and every replica keeps
    its own memory.

    Args:
        config: `TransformerXLConfig` or its dict.
        stateful: bool. Keep the memory in a variable across calls.
        batch_size: int. Batch each call sees; required when stateful.

    Call arguments:
        token_ids: (B, T) int tensor.
        training: bool.

    Returns:
        (B, T, V) float32 log-probabilities.

    Example:
    ```python
    config = keras_txl.TransformerXLConfig.from_preset("tiny")
    model = keras_txl.TransformerXLCausalLM(config)
    out = model.call_with_memory(np.zeros((2, 8), "int32"))
    out = model.call_with_memory(next_ids, out["memory"])
    ```

    Reference:
        Dai et al., 2019, arXiv:1901.02860.
    """

    def __init__(self, config, stateful=False, batch_size=None, **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = TransformerXLConfig.from_dict(config)
        if not isinstance(config, TransformerXLConfig):
            raise ValueError(
                "`config` must be a TransformerXLConfig or a dict, received "
                f"{type(config).__name__}."
            )
        if stateful:
            if (isinstance(batch_size, bool)
                    or not isinstance(batch_size, numbers.Integral)
                    or batch_size <= 0):
                raise ValueError(
                    "A stateful TransformerXLCausalLM needs a fixed positive "
                    f"integer `batch_size`, received batch_size={batch_size!r}."
                )
            batch_size = int(batch_size)
        self.txl_config = config
        self.stateful = stateful
        self.batch_size = batch_size
        self.backbone = TransformerXLBackbone(
            config, dtype=self.dtype_policy, name="backbone"
        )
        self.softmax = AdaptiveSoftmax(
            config, dtype=self.dtype_policy, name="softmax"
        )
        self.backbone.build()
        self.softmax.build()
        self.memory = None
        if stateful:
            # ON_READ + ONLY_FIRST_REPLICA: each replica keeps its own copy
            # under MirroredStrategy (shared/TF_NOTES.md section 2).
            self.memory = keras.Variable(
                initializer="zeros",
                shape=self.memory_shape(batch_size),
                dtype="float32",
                trainable=False,
                synchronization="on_read",
                aggregation="only_first_replica",
                name="memory",
            )
        self.built = True

    # --- memory -----------------------------------------------------------
    def memory_shape(self, batch_size):
        cfg = self.txl_config
        return (batch_size, cfg.num_layers, cfg.memory_length, cfg.hidden_dim)

    def initial_memory(self, batch_size, max_bytes=MAX_INITIAL_MEMORY_BYTES):
        """All-zero memory (B, L, M, D) float32 for the first segment.

        Args:
            batch_size: int >= 1 (NumPy integers too).
            max_bytes: int. Refuse a memory larger than this (default 4 GiB),
                so one call cannot allocate hundreds of GB.
        """
        batch_size = checks.positive_int("batch_size", batch_size)
        shape = self.memory_shape(batch_size)
        size = 4 * math.prod(shape)
        if size > max_bytes:
            raise ValueError(
                f"initial_memory(batch_size={batch_size}) would allocate "
                f"{size} bytes for a memory of shape {shape}, more than "
                f"max_bytes={max_bytes}; use a smaller batch or raise max_bytes."
            )
        return ops.zeros(shape, dtype="float32")

    def reset_memory(self):
        """Zero the stateful memory (start of a new text or epoch)."""
        if not self.stateful:
            raise ValueError(
                "reset_memory() needs a model built with stateful=True; this "
                "model takes the memory as an argument of call_with_memory()."
            )
        self.memory.assign(ops.zeros(self.memory.shape, dtype="float32"))

    # --- validation -------------------------------------------------------
    def _check_token_ids(self, token_ids):
        cfg = self.txl_config
        if not (tf.is_tensor(token_ids) or isinstance(token_ids, keras.KerasTensor)):
            array = np.asarray(token_ids)
            if array.dtype == object:
                raise ValueError(
                    "`token_ids` must be an integer array of shape "
                    "(batch, segment_length)."
                )
            token_ids = array
        dtype = str(token_ids.dtype.name if hasattr(token_ids.dtype, "name")
                    else token_ids.dtype)
        if "int" not in dtype:
            raise ValueError(
                "`token_ids` must be an integer tensor (int32 or int64) of "
                f"shape (batch, segment_length), received dtype {dtype}."
            )
        shape = tuple(token_ids.shape)
        if len(shape) != 2:
            raise ValueError(
                "`token_ids` must have rank 2, (batch, segment_length), "
                f"received shape {shape}."
            )
        if shape[1] == 0:
            raise ValueError(
                "`token_ids` must hold at least one position per row, "
                f"received shape {shape} (segment_length 0)."
            )
        if _is_concrete(token_ids):
            values = np.asarray(token_ids)
            if values.size and (
                values.min() < 0 or values.max() >= cfg.vocabulary_size
            ):
                raise ValueError(
                    "`token_ids` must be in [0, vocabulary_size="
                    f"{cfg.vocabulary_size}), received values in "
                    f"[{values.min()}, {values.max()}]."
                )
            return ops.convert_to_tensor(values.astype("int32"))
        token_ids = ops.cast(token_ids, "int32")
        if tf.is_tensor(token_ids):
            # Graph mode: checked at run time (a no-op under XLA).
            with tf.control_dependencies([
                tf.debugging.assert_non_negative(
                    token_ids, message="`token_ids` must be >= 0"
                ),
                tf.debugging.assert_less(
                    token_ids, tf.constant(cfg.vocabulary_size, tf.int32),
                    message=f"`token_ids` must be < vocabulary_size="
                    f"{cfg.vocabulary_size}",
                ),
            ]):
                token_ids = tf.identity(token_ids)
        return token_ids

    def _check_memory(self, memory, token_ids):
        cfg = self.txl_config
        if not (tf.is_tensor(memory) or isinstance(memory, keras.KerasTensor)
                or isinstance(memory, tf.Variable)):
            memory = np.asarray(memory)
        dtype = str(memory.dtype.name if hasattr(memory.dtype, "name")
                    else memory.dtype)
        if "float" not in dtype:
            raise ValueError(
                f"`memory` must be a float tensor, received dtype {dtype}."
            )
        shape = tuple(memory.shape)
        expected = (cfg.num_layers, cfg.memory_length, cfg.hidden_dim)
        if len(shape) != 4 or any(
            s is not None and s != e for s, e in zip(shape[1:], expected)
        ):
            raise ValueError(
                "`memory` must have shape (batch, num_layers, memory_length, "
                f"hidden_dim) = (batch, {expected[0]}, {expected[1]}, "
                f"{expected[2]}), received shape {shape}."
            )
        batch = token_ids.shape[0]
        if shape[0] is not None and batch is not None and shape[0] != batch:
            raise ValueError(
                f"`memory` has batch size {shape[0]} but `token_ids` has batch "
                f"size {batch}; pass the memory returned for this batch."
            )
        if _is_concrete(memory):
            # Checked after the cast: a float64 1e300 is finite before it.
            values = checks.finite_float32(
                "memory", memory,
                "pass the memory returned by the previous segment or zeros.",
            )
            return ops.convert_to_tensor(values)
        memory = ops.cast(memory, "float32")
        if tf.is_tensor(memory) and tf.is_tensor(token_ids) and not isinstance(
            memory, keras.Variable
        ):
            # Graph mode: the batch and the values are only known at run
            # time (a no-op under XLA).
            with tf.control_dependencies([
                tf.debugging.assert_equal(
                    tf.shape(memory)[0], tf.shape(token_ids)[0],
                    message="`memory` must have the same batch size as "
                    "`token_ids`",
                ),
                tf.debugging.assert_all_finite(
                    memory, "`memory` contains NaN or Inf values"
                ),
            ]):
                memory = tf.identity(memory)
        return memory

    # --- forward ----------------------------------------------------------
    def call_with_memory(
        self, token_ids, memory=None, training=False, return_hidden=False
    ):
        """Pure forward pass over one segment.

        Args:
            token_ids: (B, T) int tensor, ids in [0, vocabulary_size).
            memory: (B, L, M, D) float tensor or None (all-zero memory).
            training: bool. Dropout on.
            return_hidden: bool. Also return the final hidden states.

        Returns:
            dict with "log_probs" (B, T, V) float32 and "memory"
            (B, L, M, D) float32 (and "hidden" (B, T, D)).

        Raises:
            ValueError: on ids out of range, wrong dtype/rank, or memory of
                the wrong shape, batch or dtype.
        """
        token_ids = self._check_token_ids(token_ids)
        if memory is not None:
            memory = self._check_memory(memory, token_ids)
        hidden, new_memory = self.backbone(
            token_ids, memory, training=training
        )
        log_probs = self.log_probs_from_hidden(hidden)
        out = {"log_probs": log_probs, "memory": new_memory}
        if return_hidden:
            out["hidden"] = hidden
        return out

    def build_cache(self, memory=None, batch_size=1, segment_length=1):
        """A memory key/value cache for fast decoding (see `call_with_cache`).

        Args:
            memory: (B, L, M, D) float tensor (e.g. the memory after the
                prompt), or None for zeros of `batch_size` rows.
            batch_size: int. Used when `memory` is None.
            segment_length: int. T of the coming calls (1 to decode).

        Returns:
            dict of per-layer tensors (see
            `TransformerXLBackbone.build_cache`).
        """
        if memory is None:
            memory = self.initial_memory(batch_size)
        else:
            ids = np.zeros((memory.shape[0] or 1, 1), "int32")
            memory = self._check_memory(memory, ids)
        return self.backbone.build_cache(memory, segment_length)

    def call_with_cache(self, token_ids, cache):
        """Inference over one segment with the memory key/value cache.

        Same values as `call_with_memory(token_ids, cache["memory"])`, but
        only the T new positions are projected in each layer: decoding one
        token costs O(M) per layer instead of re-projecting the M memory
        positions and the position matrix.

        Args:
            token_ids: (B, T) int tensor.
            cache: dict from `build_cache` or a previous call.

        Returns:
            dict with "log_probs" (B, T, V) float32, "memory" (B, L, M, D)
            float32 (the new memory) and "cache" (the slid cache).
        """
        token_ids = self._check_token_ids(token_ids)
        hidden, new_cache = self.backbone.call_with_cache(token_ids, cache)
        return {
            "log_probs": self.log_probs_from_hidden(hidden),
            "memory": self.backbone.stack_memory(new_cache),
            "cache": new_cache,
        }

    def log_probs_from_hidden(self, hidden):
        """(B, T, D) hidden states -> (B, T, V) float32 log-probabilities."""
        embedding = self.backbone.token_embedding
        return self.softmax(hidden, embedding.tables, embedding.projections)

    def _check_full_batch(self, token_ids):
        """A stateful model's memory has `batch_size` rows: every batch must
        be full (Keras' predict and fit hand over a short last batch)."""
        message = (
            f"A stateful TransformerXLCausalLM built with batch_size="
            f"{self.batch_size} needs every batch to hold exactly "
            f"{self.batch_size} rows (its memory has {self.batch_size}); "
            "drop or pad the short last batch, e.g. pass a number of rows "
            "that is a multiple of the batch size"
        )
        batch = token_ids.shape[0] if hasattr(token_ids, "shape") else None
        if batch is not None and batch != self.batch_size:
            raise ValueError(f"{message}; received a batch of {batch}.")
        if batch is None and tf.is_tensor(token_ids):
            # Unknown until run time (a traced predict/fit step).
            with tf.control_dependencies([tf.debugging.assert_equal(
                tf.shape(token_ids)[0], self.batch_size, message=message,
            )]):
                token_ids = tf.identity(token_ids)
        return token_ids

    def predict(self, x, batch_size=None, *args, **kwargs):
        if self.stateful and hasattr(x, "shape") and len(x.shape) >= 1:
            rows = x.shape[0]
            step = batch_size or self.batch_size
            if rows is not None and (step != self.batch_size or rows % step):
                raise ValueError(
                    f"A stateful TransformerXLCausalLM built with batch_size="
                    f"{self.batch_size} predicts in batches of exactly "
                    f"{self.batch_size} rows; received {rows} rows with "
                    f"batch_size={step}. Pass a multiple of {self.batch_size} "
                    "rows (drop or pad the last batch)."
                )
            batch_size = self.batch_size
        return super().predict(x, batch_size, *args, **kwargs)

    def call(self, token_ids, training=False):
        if not self.stateful:
            return self.call_with_memory(token_ids, None, training)["log_probs"]
        token_ids = self._check_full_batch(token_ids)
        out = self.call_with_memory(token_ids, self.memory, training)
        self.memory.assign(out["memory"])
        return out["log_probs"]

    def compute_output_spec(self, token_ids, training=False):
        shape = tuple(token_ids.shape)
        return keras.KerasTensor(
            (*shape, self.txl_config.vocabulary_size), dtype="float32"
        )

    # --- evaluation settings ---------------------------------------------
    def with_settings(self, stateful=False, batch_size=None, **changes):
        """A copy with other memory_length / clamp_length / same_length...

        Weights do not depend on those settings (the paper evaluates with a
        longer memory than it trains with); the copy shares no variables.
        """
        config = self.txl_config.replace(**changes)
        clone = TransformerXLCausalLM(
            config, stateful=stateful, batch_size=batch_size,
            dtype=self.dtype_policy,
        )
        clone.assign_weights_from(self)
        return clone

    def model_weights(self):
        """All weights but the stateful memory, in a fixed order."""
        return [w for w in self.weights if w is not self.memory]

    def assign_weights_from(self, other):
        """Copies the weights of a model with the same architecture.

        The memory variable (if any) is left alone, so a stateful model can
        take the weights of a pure one and the other way round.
        """
        source, target = other.model_weights(), self.model_weights()
        if len(source) != len(target) or any(
            tuple(a.shape) != tuple(b.shape) for a, b in zip(source, target)
        ):
            raise ValueError(
                "assign_weights_from() needs a model with the same "
                "architecture; the weight shapes differ."
            )
        for s, t in zip(source, target):
            t.assign(s)

    def get_config(self):
        config = super().get_config()
        config.update(
            config=self.txl_config.to_dict(),
            stateful=self.stateful,
            batch_size=self.batch_size,
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        return cls(**config)
