"""Relative multi-head attention of Transformer-XL (paper section 3.3).

Shape legend: B batch, T segment (queries), M memory, K = M + T keys,
N heads, H head_dim, D hidden_dim.
"""

import functools
import os

import keras
from keras import ops

from keras_txl import fusion
from keras_txl.memory import last_of_joined


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
    padding = [[0, 0]] * (len(scores.shape) - 1) + [[1, 0]]
    return shift_padded(ops.pad(scores, padding))


def shift_padded(padded):
    """`relative_shift` of scores that already carry the zero column.

    `padded[..., i, 0]` must be 0 and `padded[..., i, c + 1]` the raw score
    of column c. The attention gets this layout for free by putting a zero
    row in front of `W_R R` (`q . 0 = 0`), which saves the pad's copy.

    Only reshapes and one contiguous `slice` of the flattened (T, K+1)
    blocks: its gradient is a pad, far cheaper on CPU than the gradient of
    a strided slice (which the `x[..., 1:, :]` form of the trick costs).

    Args:
        padded: (..., T, K+1) tensor.

    Returns:
        (..., T, K) tensor.
    """
    shape = ops.shape(padded)
    lead = shape[:-2]
    query_length, key_length = shape[-2], shape[-1] - 1
    rank = len(padded.shape)
    # Rows of the (K+1, T) view are contiguous: drop the first T numbers.
    flat = ops.reshape(padded, (*lead, (key_length + 1) * query_length))
    flat = ops.slice(
        flat, [0] * (rank - 2) + [query_length],
        (*lead, key_length * query_length),
    )
    return ops.reshape(flat, (*lead, query_length, key_length))  # (..., T, K)


def _masked_scores(content, padded_position, mask, dtype):
    import tensorflow as tf

    scores = tf.cast(content + shift_padded(padded_position), dtype)
    lowest = tf.constant(tf.as_dtype(dtype).min, dtype)
    return scores if mask is None else tf.where(mask, scores, lowest)


def masked_scores(content, padded_position, mask, dtype):
    """`where(mask, content + shift(padded_position), lowest)` in `dtype`,
    as one XLA-compiled kernel (`keras_txl.fusion`).

    `content` (B, N, T, K) and `padded_position` (B, N, T, K+1) (the raw
    position scores with the shift's zero column, see `shift_padded`), in
    the compute dtype; `mask` a bool broadcasting to (B, N, T, K), or None;
    `dtype` the softmax's dtype (the sum is rounded to it once; blocked
    scores get its lowest finite value, as `masking_bias`)."""
    import tensorflow as tf

    scores = fusion.compiled("masked_scores", _masked_scores)(
        content, padded_position, mask, tf.as_dtype(dtype))
    # The call's result has no static shape for grappler's cost model (it
    # warns at the softmax otherwise): restate the content scores' shape.
    return tf.reshape(scores, tf.shape(content))


def _native_bfloat16(dtype):
    """Whether `dtype` is bfloat16 and this host computes it natively: a GPU,
    or a CPU whose oneDNN reaches AVX512_BF16 or AMX (`keras_txl.host`)."""
    if dtype != "bfloat16":
        return False
    import tensorflow as tf

    if tf.config.list_logical_devices("GPU"):
        return True
    return _cpu_native_bfloat16(os.environ.get("ONEDNN_MAX_CPU_ISA"),
                                os.environ.get("TF_ENABLE_ONEDNN_OPTS"))


@functools.lru_cache(maxsize=None)
def _cpu_native_bfloat16(onednn_cap, onednn_opts):
    # Read /proc/cpuinfo once per setting (it is ~1.5 KB per core), not at every
    # eager call of every layer; the arguments key the cache on the oneDNN cap
    # and switch in force.
    from keras_txl import host

    return host.native_bfloat16()


def masking_bias(attention_mask):
    """Bool mask -> float32 additive bias (0 or the lowest float), shaped to
    add to (B, N, T, K) scores: a (T, K) mask (the same for every row) gives
    (1, 1, T, K); a (B, T, K) mask (per row: a memory validity mask) gives
    (B, 1, T, K).

    Adding the most negative finite float32 to a blocked score gives that
    same value (scores are far below its rounding step), so this equals
    replacing blocked scores by it: blocked keys get probability 0, a fully
    blocked row becomes uniform, as in the references. An add is cheaper
    than a select and its gradient is the identity.
    """
    return ops.where(scores_mask(attention_mask), 0.0, -3.4028234663852886e38)


def scores_mask(attention_mask):
    """A (T, K) or (B, T, K) bool mask shaped to broadcast over (B, N, T, K)
    scores: (1, 1, T, K) or (B, 1, T, K)."""
    if len(attention_mask.shape) == 2:
        return attention_mask[None, None]  # (1, 1, T, K)
    return attention_mask[:, None]  # (B, 1, T, K)


def keys_operand(keys):
    """(B, K, N, H) keys -> (B, N, H, K), the layout the scores read.

    The attention keeps keys as (B, N, H, K) and values as (B, N, K, H)
    (`values_operand`), in training and in the key/value cache alike: the
    score and mixing products are plain batched matmuls on them, and a
    cache in this layout is extended and slid without a transpose per
    segment (the transposes of the memory's keys and values were about a
    third of an evaluation step's op time at M = 3,672). With one position
    (decoding) the transpose is a reshape.
    """
    if keys.shape[1] == 1:
        shape = ops.shape(keys)
        return ops.reshape(keys, (shape[0], shape[2], shape[3], 1))
    return ops.transpose(keys, (0, 2, 3, 1))


def values_operand(values):
    """(B, K, N, H) values -> (B, N, K, H) (see `keys_operand`)."""
    if values.shape[1] == 1:
        shape = ops.shape(values)
        return ops.reshape(values, (shape[0], shape[2], 1, shape[3]))
    return ops.transpose(values, (0, 2, 1, 3))


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
        attention_mask: (T, K) or (B, T, K) bool, True where attending is
            allowed (per row: with a memory validity mask).
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
        self._output_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
        self._probability_dropout = keras.layers.Dropout(
            attention_dropout, dtype=self.dtype_policy)

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
    def _kernels(self):
        """The q, k and v kernels, (D, N, H) each, in the compute dtype;
        the q kernel scaled by 1/sqrt(H) (see `project_query`).

        An unstack, not `kernel[:, i]`: the gradient of a strided slice is
        slow on CPU even for a kernel this small (about 1 ms each).
        """
        query_kernel, key_kernel, value_kernel = ops.unstack(
            ops.cast(self.qkv_kernel, self.compute_dtype), axis=1
        )
        return query_kernel * self._scale(), key_kernel, value_kernel

    def _scale(self):
        return 1.0 / (self.head_dim**0.5)

    def project_query(self, query):
        """(B, T, D) inputs -> (B, N, T, H) queries, scaled by 1/sqrt(H).

        The score scale goes on the (D, N, H) kernel: the same products as
        scaling the scores, without a pass over the queries or the scores.
        """
        dtype = self.compute_dtype
        return ops.einsum(
            "btd,dnh->bnth", ops.cast(query, dtype), self._kernels()[0]
        )  # (B, N, T, H)

    def project_keys(self, keys_in):
        """(B, K, D) inputs -> keys (B, N, H, K) and values (B, N, K, H)."""
        dtype = self.compute_dtype
        _, key_kernel, value_kernel = self._kernels()
        keys_in = ops.cast(keys_in, dtype)
        # Two products rather than one split afterwards: splitting the
        # (B, K, 2, N, H) result costs a strided-slice gradient of its size.
        return (
            keys_operand(ops.einsum("bkd,dnh->bknh", keys_in, key_kernel)),
            values_operand(ops.einsum("bkd,dnh->bknh", keys_in, value_kernel)),
        )

    def project_positions(self, position_embedding):
        """(K, D) sinusoid matrix R -> `[0 ; W_R R]` as (N, H, K+1).

        The zero column in front is the relative shift's padding (see
        `shift_padded`): position scores come out of one product already
        padded. Column c + 1 holds `W_R R_c` (relative mode).
        """
        dtype = self.compute_dtype
        projected = ops.einsum(
            "kd,dnh->nhk", ops.cast(position_embedding, dtype),
            ops.cast(self.position_kernel, dtype),
        )  # (N, H, K)
        return ops.pad(projected, [[0, 0], [0, 0], [1, 0]])  # (N, H, K+1)

    def _scores(self, q, k, r, u, w, bias):
        """Pre-softmax scores, (B, N, T, K) float32, and the (b)+(d) terms.

        Every product is a plain batched matmul on operands already in
        their layout: queries (B, N, T, H) scaled by 1/sqrt(H)
        (`project_query`), keys (B, N, H, K) (`keys_operand`),
        `[0 ; W_R R]` (N, H, K+1) (`project_positions`, broadcast over the
        batch). The position scores come out with the zero column of the
        shift in place. `u` and `v` are scaled like the queries (two (N, H)
        multiplies). `bias` is the additive mask from `masking_bias`
        ((1, 1, T, K) or (B, 1, T, K)) or None.
        """
        scores, position = self._scores_in_compute_dtype(q, k, r, u, w)
        scores = ops.cast(scores, "float32")
        if bias is not None:
            scores = scores + bias
        return scores, position

    def _scores_in_compute_dtype(self, q, k, r, u, w):
        """Unmasked (B, N, T, K) scores in the compute dtype, and the
        (b)+(d) terms (None in vanilla mode)."""
        if not self.relative:
            return ops.matmul(q, k), None  # (B, N, T, K)
        content, padded_position = self._score_products(q, k, r, u, w)
        position = shift_padded(padded_position)  # (B, N, T, K)
        return content + position, position

    def _score_products(self, q, k, r, u, w):
        """The two matmuls of the relative scores: (a)+(c) (B, N, T, K) and
        the unshifted (b)+(d) with the shift's zero column (B, N, T, K+1)."""
        scale = self._scale()
        # (a) + (c): content terms with the global content bias u.
        content = ops.matmul(q + ops.expand_dims(u * scale, 1), k)
        # (b) + (d): position terms with the global position bias v.
        padded_position = ops.matmul(q + ops.expand_dims(w * scale, 1), r[None])
        return content, padded_position

    def _inference_probabilities(self, q, k, r, u, w, attention_mask):
        """Attention probabilities at inference, by one of two paths.

        Under `keras_txl.fusion.fused_kernels` (relative attention), the
        shift, the sum of the two score products and the mask are one
        XLA-compiled kernel between oneDNN's matmuls and softmax.

        Otherwise in bfloat16: the float32 path casts the (B, N, T, K)
        scores up and the probabilities back down for the mixing matmul,
        two passes of about 0.4 ms each per layer on the benchmark's
        config (AMX Xeon, 2 cores); here a select masks in bfloat16 instead.

        Both bfloat16 shortcuts (the select, the bfloat16 softmax) are taken
        only where the matmuls have bfloat16 instructions (`_native_bfloat16`):
        on a CPU without them oneDNN's bfloat16 softmax is emulated, gives
        other bits (1-2 bfloat16 ulps on an AVX2 AMD EPYC) and saves nothing,
        so the float32 path runs there (under `fused_kernels` its kernel masks
        in float32).

        Either way the softmax runs in bfloat16 for a bfloat16 model
        (oneDNN's, which gives the same bits as the float32 softmax rounded
        to bfloat16: the scores were already rounded to bfloat16 by their
        sum, and the probabilities are rounded to it for the matmul either
        way) and in float32 otherwise. The evaluation's per-token NLL came
        out bit-identical to the float32-softmax path (docs/benchmarks.md).
        Training keeps the float32 softmax, whose gradient needs it.
        """
        softmax_dtype = "bfloat16" if _native_bfloat16(self.compute_dtype) else "float32"
        mask = None if attention_mask is None else scores_mask(attention_mask)
        # The kernel sums the two products in the compute dtype and XLA may
        # keep that sum in float32 (excess precision): only where the softmax
        # runs in the compute dtype is that the graph's rounding.
        if (self.relative and fusion.enabled()
                and softmax_dtype == self.compute_dtype):
            content, padded_position = self._score_products(q, k, r, u, w)
            scores = masked_scores(content, padded_position, mask, softmax_dtype)
        else:
            scores, _ = self._scores_in_compute_dtype(q, k, r, u, w)
            scores = ops.cast(scores, softmax_dtype)
            if mask is not None:
                # The lowest finite value, as `masking_bias` adds float32's.
                import tensorflow as tf

                lowest = ops.cast(tf.as_dtype(softmax_dtype).min, softmax_dtype)
                scores = ops.where(mask, scores, lowest)
        return ops.softmax(scores, axis=-1)  # (B, N, T, K)

    def _mix(self, probabilities, v):
        """(B, N, T, K) probabilities x (B, N, K, H) values -> (B, T, N*H)."""
        batch_size, query_length = ops.shape(v)[0], ops.shape(probabilities)[2]
        context = ops.matmul(
            ops.cast(probabilities, self.compute_dtype), v
        )  # (B, N, T, H)
        return ops.reshape(
            ops.transpose(context, (0, 2, 1, 3)),
            (batch_size, query_length, self.num_heads * self.head_dim),
        )  # (B, T, N*H), head-major like the kernel

    def _context_recomputed(self, query, keys_in, r, u, w, bias, dropout_seed=None):
        """The attention context, keeping only the projections' inputs.

        Training would otherwise keep, per layer, q, k, v, the (B, N, T, K)
        float32 probabilities and five transposed copies of q, k and v for
        the backward pass (about 20 MB per layer on the benchmark's
        config). Here the backward pass recomputes all of them from the
        segment and `[memory ; segment]` inputs, which the kernels'
        gradients need anyway: one more projection and score computation
        per layer, about a quarter of the memory. With attention dropout the
        mask comes from `dropout_seed`, drawn once outside, so the backward
        pass recomputes the same mask.
        """
        import tensorflow as tf  # the only backend keras-txl runs on

        def context(*inputs):
            query, keys_in, *rest = inputs
            r, u, w = rest if rest else (None, None, None)
            q = self.project_query(query)  # (B, N, T, H)
            k, v = self.project_keys(keys_in)  # (B, N, H, K), (B, N, K, H)
            scores, _ = self._scores(q, k, r, u, w, bias)
            probabilities = ops.softmax(scores, axis=-1)
            if dropout_seed is not None:
                probabilities = tf.nn.experimental.stateless_dropout(
                    probabilities, rate=self.attention_dropout, seed=dropout_seed
                )
            return self._mix(probabilities, v)

        inputs = (query, keys_in, r, u, w) if self.relative else (query, keys_in)
        return tf.recompute_grad(context)(*inputs)

    def _dropout_seed(self):
        """Draws the probability dropout's seed as `keras.layers.Dropout`
        does on TensorFlow (one draw from its generator, int32), so either
        path drops the same entries for the same generator state."""
        import tensorflow as tf

        seed = self._probability_dropout.seed_generator.next()
        if seed.dtype != tf.int32:
            seed = tf.cast(tf.math.floormod(seed, tf.int32.max - 1), tf.int32)
        return seed

    def _attend(self, q, k, v, r, content_bias, position_bias,
                attention_mask, training, return_scores):
        """Scores, softmax and output from projected q, k, v and `W_R R`."""
        dtype = self.compute_dtype
        u = w = None
        if self.relative:
            u = ops.cast(content_bias, dtype)
            w = ops.cast(position_bias, dtype)
        if not training and not return_scores and (
                _native_bfloat16(dtype) or (self.relative and fusion.enabled())):
            probabilities = self._inference_probabilities(
                q, k, r, u, w, attention_mask)
            return self._output(self._mix(probabilities, v), training)
        bias = None
        if attention_mask is not None:
            bias = masking_bias(attention_mask)  # (1 or B, 1, T, K) float32
        scores, position = self._scores(q, k, r, u, w, bias)
        probabilities = ops.softmax(scores, axis=-1)  # (B, N, T, K) float32
        dropped = self._probability_dropout(probabilities, training=training)
        output = self._output(self._mix(dropped, v), training)
        if not return_scores:
            return output
        return output, self._details(q, k, r, u, w, scores, position, probabilities)

    def _output(self, context, training):
        """(B, T, N*H) context -> (B, T, D): output projection and dropout."""
        n, h = self.num_heads, self.head_dim
        output = ops.matmul(
            context,
            ops.reshape(ops.cast(self.output_kernel, self.compute_dtype), (n * h, -1)),
        )  # (B, T, D)
        return self._output_dropout(output, training=training)

    def _details(self, q, k, r, u, w, scores, position, probabilities):
        """Score terms and probabilities as (B, N, T, K) float32, for pictures.

        `q` is scaled by 1/sqrt(H) already (`project_query`)."""
        scale = self._scale()
        as_float = lambda x: ops.cast(x, "float32")  # noqa: E731
        details = {
            "scores": as_float(scores),
            "probabilities": as_float(probabilities),
        }
        if self.relative:
            details["position"] = as_float(position)
            r = r[:, :, 1:]  # (N, H, K): W_R R without the shift's column
            # (a) alone, (b) alone and the bias terms.
            details["term_a"] = as_float(ops.einsum("bnth,bnhk->bntk", q, k))
            details["term_b"] = as_float(relative_shift(
                ops.einsum("bnth,nhk->bntk", q, r)))
            details["term_d"] = as_float(relative_shift(
                ops.einsum("nh,nhk->nk", w, r)[None, :, None, :]
                + ops.zeros_like(position))) * scale
            # (a) + (c): the content terms with the global content bias u.
            details["content"] = as_float(ops.einsum(
                "bnth,bnhk->bntk", q + ops.expand_dims(u * scale, 1), k))
        return details

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
        r = None
        if self.relative:
            r = self.project_positions(position_embedding)  # (N, H, K+1)
        if training and not return_scores:
            u = w = bias = seed = None
            if self.relative:
                u = ops.cast(content_bias, dtype)
                w = ops.cast(position_bias, dtype)
            if attention_mask is not None:
                bias = masking_bias(attention_mask)  # (1 or B, 1, T, K) float32
            if self.attention_dropout:
                seed = self._dropout_seed()
            context = self._context_recomputed(query, keys_in, r, u, w, bias, seed)
            return self._output(context, training)
        q = self.project_query(query)  # (B, N, T, H)
        k, v = self.project_keys(keys_in)  # (B, N, H, K), (B, N, K, H)
        return self._attend(
            q, k, v, r, content_bias, position_bias, attention_mask,
            training, return_scores,
        )

    def project_new_positions(self, query):
        """(B, T, D) -> q (B, N, T, H), k (B, N, H, T), v (B, N, T, H).

        The same projections as `project_query` and `project_keys`, as one
        (B*T, D) x (D, 3*N*H) matmul on the whole q|k|v kernel, split by one
        transpose into the three operands' layouts (inference only: no
        gradient goes through the split). On the throughput benchmark's
        evaluation step it took about what the three products did (2.6 ms
        against 3 x 0.9 ms per layer) with fewer ops; for one position
        (decoding) it avoids unstacking the kernel and the einsum set-up,
        the larger part of such a step's cost.
        """
        dtype = self.compute_dtype
        n, h = self.num_heads, self.head_dim
        batch_size, length, hidden_dim = (
            ops.shape(query)[0], ops.shape(query)[1], ops.shape(query)[2]
        )
        scales = ops.convert_to_tensor([self._scale(), 1.0, 1.0], dtype)
        kernel = ops.reshape(
            ops.cast(self.qkv_kernel, dtype) * ops.reshape(scales, (1, 3, 1, 1)),
            (-1, 3 * n * h),
        )  # (D, 3NH), q (scaled) | k | v, head-major
        qkv = ops.matmul(
            ops.reshape(ops.cast(query, dtype), (-1, hidden_dim)), kernel
        )  # (B*T, 3NH)
        if query.shape[1] == 1:
            qkv = ops.reshape(qkv, (batch_size, 3, n, 1, h))  # T = 1
            q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]  # (B, N, 1, H) each
            return q, ops.reshape(k, (batch_size, n, h, 1)), v
        qkv = ops.transpose(
            ops.reshape(qkv, (batch_size, length, 3, n, h)), (2, 0, 3, 1, 4)
        )  # (3, B, N, T, H)
        q, k, v = ops.unstack(qkv, axis=0)
        return q, ops.transpose(k, (0, 1, 3, 2)), v

    def call_with_cache(
        self,
        query,
        key_cache,
        value_cache,
        position_projection=None,
        content_bias=None,
        position_bias=None,
        attention_mask=None,
        memory_length=None,
    ):
        """Inference over `[memory ; segment]` with the memory pre-projected.

        Equals `call(query, memory, ...)` when `key_cache, value_cache =
        project_keys(memory)` and `position_projection =
        project_positions(R)`: only the T new positions are projected, and
        the scores go through the same `_attend` as `call`.

        Args:
            query: (B, T, D) segment input.
            key_cache: (B, N, H, M) and value_cache: (B, N, M, H), the
                projected memory (`project_keys`).
            position_projection: (N, H, K+1) `[0 ; W_R R]` (relative mode,
                `project_positions`).
            content_bias, position_bias, attention_mask: as in `call`.
            memory_length: None, or the next cache's length M.

        Returns:
            `(output (B, T, D), keys, values)`: with `memory_length` None,
            the keys (B, N, H, K) and values (B, N, K, H) of
            `[memory ; segment]`; otherwise their last M positions, the next
            cache (taken from the segment's own keys and values alone when
            T >= M: no copy when T == M).
        """
        dtype = self.compute_dtype
        q, new_keys, new_values = self.project_new_positions(query)
        k = ops.concatenate([ops.cast(key_cache, dtype), new_keys], axis=3)
        v = ops.concatenate([ops.cast(value_cache, dtype), new_values], axis=2)
        output = self._attend(
            q, k, v, position_projection, content_bias, position_bias,
            attention_mask, False, False,
        )  # (B, T, D)
        if memory_length is None:
            return output, k, v  # (B, N, H, K), (B, N, K, H)
        next_values = last_of_joined(value_cache, new_values, memory_length, 2, v)
        if next_values is new_values:
            next_values = _own_buffer(new_values)
        return (
            output,
            last_of_joined(key_cache, new_keys, memory_length, 3, k),  # (B, N, H, M)
            next_values,  # (B, N, M, H)
        )

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


def _own_buffer(values):
    """`values` copied into a buffer of its own, in TensorFlow's graph mode.

    The segment's values come out of `project_new_positions` as one slice of
    its (3, B, N, T, H) q|k|v tensor, and TensorFlow's Unpack returns such a
    slice without copying: kept as the next cache (T == M), it would keep the
    whole tensor alive until the next segment, 3x the values' size per layer
    (measured on wt103_base's evaluation at batch 60: 900 against 450 MB of
    cache held between segments). XLA writes its outputs to buffers of their
    own, so under XLA nothing is copied.
    """
    if fusion.in_xla_context():
        return values
    import tensorflow as tf

    return tf.raw_ops.DeepCopy(x=values)
