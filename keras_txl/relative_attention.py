"""Relative multi-head attention of Transformer-XL (paper section 3.3).

Shape legend: B batch, T segment (queries), M memory, K = M + T keys,
N heads, H head_dim, D hidden_dim.
"""

import keras
from keras import ops


def relative_shift(scores):
    """Aligns raw position scores with relative distances, in O(K) memory.

    `scores[..., i, c]` is `q_i . R_{K-1-c}` (column c holds distance K-1-c).
    The result `out[..., i, j]` is `q_i . R_{M+i-j}` for every j <= M + i;
    entries with j > M + i are garbage and must be masked (they always are,
    by the causal mask). The trick: pad one zero column in front, view the
    (T, K+1) block as (K+1, T), drop the first row, view as (T, K): row i
    moves left by T-1-i.

    Args:
        scores: (..., T, K) tensor.

    Returns:
        (..., T, K) tensor.
    """
    shape = ops.shape(scores)
    lead = shape[:-2]
    query_length, key_length = shape[-2], shape[-1]
    padding = [[0, 0]] * (len(shape) - 1) + [[1, 0]]
    x = ops.pad(scores, padding)  # (..., T, K+1)
    x = ops.reshape(x, (*lead, key_length + 1, query_length))  # (..., K+1, T)
    x = x[..., 1:, :]  # (..., K, T)
    return ops.reshape(x, (*lead, query_length, key_length))  # (..., T, K)


@keras.saving.register_keras_serializable(package="keras_txl")
class RelativeMultiHeadAttention(keras.layers.Layer):
    """Multi-head attention over `[memory ; segment]` with relative positions.

    The score of query i and key j in head n is the paper's
    `A_ij = (a) + (b) + (c) + (d)` written as
    `(q_i + u) . k_j + (q_i + v) . W_R R_{i-j}`, scaled by `1/sqrt(H)`:
    (a) content, (c) global content bias u, (b) content-dependent position
    and (d) global position bias v. q, k and v come from one bias-free
    projection (the official layout), q only for the segment.

    With `relative=False` the position terms and biases are dropped: plain
    scaled dot-product attention (the vanilla baseline).

    Args:
        num_heads: int. Number of heads N.
        head_dim: int. Width of one head H.
        dropout: float. Dropout on the attention output.
        attention_dropout: float. Dropout on the attention probabilities.
        relative: bool. Use the relative position terms.
        kernel_initializer: initializer for the projections.

    Call arguments:
        query: (B, T, D) segment input (layer-normed first under pre-LN).
        memory: (B, M, D) memory of this layer (normalised the same way).
        position_embedding: (K, D) sinusoid matrix R (relative mode).
        content_bias: (N, H) u (relative mode).
        position_bias: (N, H) v (relative mode).
        attention_mask: (T, K) bool, True where attending is allowed.
        training: bool.
        return_scores: bool. Also return the score terms and probabilities.

    Returns:
        (B, T, D) tensor, or `(output, details)` with `return_scores`.

    Reference:
        Dai et al., 2019, arXiv:1901.02860, section 3.3 and eq. (in 3.3).
    """

    def __init__(
        self,
        num_heads,
        head_dim,
        dropout=0.0,
        attention_dropout=0.0,
        relative=True,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.relative = relative
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self._output_dropout = keras.layers.Dropout(dropout)
        self._probability_dropout = keras.layers.Dropout(attention_dropout)

    def build(self, query_shape):
        hidden_dim = query_shape[-1]
        n, h = self.num_heads, self.head_dim
        # q | k | v in one kernel, head-major within each (official layout).
        self.qkv_kernel = self.add_weight(
            name="qkv_kernel", shape=(hidden_dim, 3, n, h),
            initializer=self.kernel_initializer,
        )
        if self.relative:
            self.position_kernel = self.add_weight(
                name="position_kernel", shape=(hidden_dim, n, h),
                initializer=self.kernel_initializer,
            )
        self.output_kernel = self.add_weight(
            name="output_kernel", shape=(n, h, hidden_dim),
            initializer=self.kernel_initializer,
        )
        self.built = True

    # --- pieces shared by `call` and `call_with_cache` -------------------
    def project_query(self, query):
        """(B, T, D) inputs -> (B, T, N, H) queries."""
        dtype = self.compute_dtype
        kernel = ops.cast(self.qkv_kernel, dtype)
        return ops.einsum(
            "btd,dnh->btnh", ops.cast(query, dtype), kernel[:, 0]
        )  # (B, T, N, H)

    def project_keys(self, keys_in):
        """(B, K, D) inputs -> keys and values, (B, K, N, H) each."""
        dtype = self.compute_dtype
        kernel = ops.cast(self.qkv_kernel, dtype)
        kv = ops.einsum(
            "bkd,dcnh->bkcnh", ops.cast(keys_in, dtype), kernel[:, 1:]
        )  # (B, K, 2, N, H)
        return kv[:, :, 0], kv[:, :, 1]  # (B, K, N, H) each

    def project_positions(self, position_embedding):
        """(K, D) sinusoid matrix R -> (K, N, H) `W_R R` (relative mode)."""
        dtype = self.compute_dtype
        return ops.einsum(
            "kd,dnh->knh", ops.cast(position_embedding, dtype),
            ops.cast(self.position_kernel, dtype),
        )  # (K, N, H)

    def _attend(self, q, k, v, r, content_bias, position_bias,
                attention_mask, training, return_scores):
        """Scores, softmax and output from projected q, k, v and `W_R R`."""
        dtype = self.compute_dtype
        scale = 1.0 / (self.head_dim**0.5)
        details = {}
        if self.relative:
            u = ops.cast(content_bias, dtype)
            w = ops.cast(position_bias, dtype)
            # (a) + (c): content terms with the global content bias u.
            content = ops.einsum("btnh,bknh->bntk", q + u, k)  # (B, N, T, K)
            # (b) + (d): position terms with the global position bias v.
            position = relative_shift(
                ops.einsum("btnh,knh->bntk", q + w, r)
            )  # (B, N, T, K)
            scores = ops.cast(content + position, "float32") * scale
            if return_scores:
                details["content"] = ops.cast(content, "float32") * scale
                details["position"] = ops.cast(position, "float32") * scale
                # (a) alone, (b) alone, and the bias terms, for pictures.
                details["term_a"] = ops.cast(
                    ops.einsum("btnh,bknh->bntk", q, k), "float32") * scale
                details["term_b"] = ops.cast(relative_shift(
                    ops.einsum("btnh,knh->bntk", q, r)), "float32") * scale
                details["term_d"] = ops.cast(relative_shift(
                    ops.einsum("nh,knh->nk", w, r)[None, :, None, :]
                    + ops.zeros_like(position)), "float32") * scale
        else:
            scores = ops.cast(
                ops.einsum("btnh,bknh->bntk", q, k), "float32"
            ) * scale  # (B, N, T, K)
        if attention_mask is not None:
            # Blocked keys get the most negative finite float32 (not -inf),
            # so a fully blocked row becomes uniform, as in the references.
            scores = ops.where(
                attention_mask[None, None, :, :], scores,
                ops.full_like(scores, -3.4028234663852886e38),
            )
        probabilities = ops.softmax(scores, axis=-1)  # (B, N, T, K) float32
        if return_scores:
            details["scores"] = scores
            details["probabilities"] = probabilities
        dropped = self._probability_dropout(probabilities, training=training)
        context = ops.einsum(
            "bntk,bknh->btnh", ops.cast(dropped, dtype), v
        )  # (B, T, N, H)
        output = ops.einsum(
            "btnh,nhd->btd", context, ops.cast(self.output_kernel, dtype)
        )  # (B, T, D)
        output = self._output_dropout(output, training=training)
        if return_scores:
            return output, details
        return output

    def call(
        self,
        query,
        memory,
        position_embedding=None,
        content_bias=None,
        position_bias=None,
        attention_mask=None,
        training=False,
        return_scores=False,
    ):
        dtype = self.compute_dtype
        query = ops.cast(query, dtype)
        keys_in = ops.concatenate([ops.cast(memory, dtype), query], axis=1)  # (B,K,D)
        q = self.project_query(query)  # (B, T, N, H)
        k, v = self.project_keys(keys_in)  # (B, K, N, H) each
        r = None
        if self.relative:
            r = self.project_positions(position_embedding)  # (K, N, H)
        return self._attend(
            q, k, v, r, content_bias, position_bias, attention_mask,
            training, return_scores,
        )

    def project_new_positions(self, query):
        """(B, T, D) -> q, k, v, (B, T, N, H) each, in one matmul.

        The same projections as `project_query` and `project_keys`, done
        with one (B*T, D) x (D, 3*N*H) matmul on the whole q|k|v kernel:
        for the few positions of a decoding step this avoids slicing the
        kernel and the einsum set-up, the larger part of the step's cost.
        """
        dtype = self.compute_dtype
        n, h = self.num_heads, self.head_dim
        batch_size, length, hidden_dim = (
            ops.shape(query)[0], ops.shape(query)[1], ops.shape(query)[2]
        )
        kernel = ops.reshape(
            ops.cast(self.qkv_kernel, dtype), (-1, 3 * n * h)
        )  # (D, 3NH), q | k | v, head-major
        qkv = ops.matmul(
            ops.reshape(ops.cast(query, dtype), (-1, hidden_dim)), kernel
        )  # (B*T, 3NH)
        qkv = ops.reshape(qkv, (batch_size, length, 3, n, h))  # (B,T,3,N,H)
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]

    def call_with_cache(
        self,
        query,
        key_cache,
        value_cache,
        position_projection=None,
        content_bias=None,
        position_bias=None,
        attention_mask=None,
    ):
        """Inference over `[memory ; segment]` with the memory pre-projected.

        Equals `call(query, memory, ...)` when `key_cache, value_cache =
        project_keys(memory)` and `position_projection =
        project_positions(R)`: only the T new positions are projected, and
        the scores go through the same `_attend` as `call`.

        Args:
            query: (B, T, D) segment input.
            key_cache, value_cache: (B, M, N, H) projected memory.
            position_projection: (K, N, H) `W_R R` (relative mode).
            content_bias, position_bias, attention_mask: as in `call`.

        Returns:
            `(output (B, T, D), keys (B, K, N, H), values (B, K, N, H))`:
            the keys and values of `[memory ; segment]`, whose last M
            positions are the next cache.
        """
        dtype = self.compute_dtype
        q, new_keys, new_values = self.project_new_positions(query)
        k = ops.concatenate([ops.cast(key_cache, dtype), new_keys], axis=1)
        v = ops.concatenate([ops.cast(value_cache, dtype), new_values], axis=1)
        output = self._attend(
            q, k, v, position_projection, content_bias, position_bias,
            attention_mask, False, False,
        )  # (B, T, D)
        return output, k, v  # (B, K, N, H) each

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            relative=self.relative,
            kernel_initializer=keras.initializers.serialize(
                self.kernel_initializer
            ),
        )
        return config
