"""Adaptive input embeddings and adaptive softmax (Baevski & Auli; Grave et al.).

The vocabulary is split by `cutoffs` into a head shortlist `[0, c0)` and
tail clusters `[c_{i-1}, c_i)`. Cluster i has a table of width
`embedding_dim // div_val**i` and a projection to/from `hidden_dim`.
Projections are stored as (E_i, D) matrices: the embedding uses `row @ P`,
the softmax uses `h @ P^T` (one variable, used both ways when tied).

Shape legend: B batch, T segment, D hidden_dim, E_i cluster width,
V vocabulary, C number of tail clusters.
"""

import keras
from keras import ops

from keras_txl.fusion import in_xla_context


@keras.saving.register_keras_serializable(package="keras_txl")
class AdaptiveEmbedding(keras.layers.Layer):
    """Adaptive input embedding, scaled by sqrt(hidden_dim) after projection.

    With `div_val == 1` there is one (V, E) table (projected iff E != D);
    otherwise one table and projection per cluster.

    Args:
        config: `TransformerXLConfig` (as a dict in `get_config`).

    Call arguments:
        token_ids: (B, T) int tensor.

    Returns:
        (B, T, D) tensor in the layer's compute dtype.
    """

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        from keras_txl.config import TransformerXLConfig

        if isinstance(config, dict):
            config = TransformerXLConfig.from_dict(config)
        self.config = config
        self.tables = []
        self.projections = []

    def build(self, input_shape=None):
        cfg = self.config
        table_init = keras.initializers.RandomNormal(stddev=cfg.init_std)
        proj_init = keras.initializers.RandomNormal(
            stddev=cfg.projection_init_std
        )
        if cfg.div_val == 1:
            bounds = [(0, cfg.vocabulary_size)]
        else:
            bounds = cfg.cluster_bounds
        for i, (start, end) in enumerate(bounds):
            width = cfg.cluster_embedding_dim(i)
            self.tables.append(
                self.add_weight(
                    name=f"table_{i}", shape=(end - start, width),
                    initializer=table_init,
                )
            )
            if cfg.cluster_has_projection(i):
                self.projections.append(
                    self.add_weight(
                        name=f"projection_{i}", shape=(width, cfg.hidden_dim),
                        initializer=proj_init,
                    )
                )
            else:
                self.projections.append(None)
        self.built = True

    def _project(self, x, projection):
        if projection is None:
            return x
        return ops.einsum(
            "bte,ed->btd", x, ops.cast(projection, self.compute_dtype)
        )

    def call(self, token_ids):
        cfg = self.config
        token_ids = ops.cast(token_ids, "int32")
        dtype = self.compute_dtype
        if cfg.div_val == 1:
            x = ops.take(ops.cast(self.tables[0], dtype), token_ids, axis=0)
            x = self._project(x, self.projections[0])
        else:
            # Static shapes (XLA/TFLite friendly): every cluster looks up a
            # clipped local id and the cluster mask keeps the right one.
            x = None
            for i, (start, end) in enumerate(cfg.cluster_bounds):
                if end == start or cfg.cluster_embedding_dim(i) == 0:
                    # An empty last cluster embeds no token; a 0-wide one
                    # embeds its tokens to zero. Skipped: a (.., 0) or 0-deep
                    # matmul aborts the process inside oneDNN in graph mode.
                    continue
                local = ops.clip(token_ids - start, 0, end - start - 1)
                part = ops.take(ops.cast(self.tables[i], dtype), local, axis=0)
                part = self._project(part, self.projections[i])  # (B, T, D)
                inside = ops.logical_and(token_ids >= start, token_ids < end)
                part = part * ops.cast(inside[..., None], dtype)
                x = part if x is None else x + part
        return x * ops.cast(cfg.hidden_dim**0.5, dtype)

    def get_config(self):
        config = super().get_config()
        config.update(config=self.config.to_dict())
        return config


@keras.saving.register_keras_serializable(package="keras_txl")
class AdaptiveSoftmax(keras.layers.Layer):
    """Adaptive log-softmax over the full vocabulary, float32 output.

    Head logits = `(h @ P_0^T) @ [W_0 ; cluster_kernel]^T + [b_0 ; cluster_bias]`:
    the shortlist tokens then one logit per tail cluster. A token of tail
    cluster i gets `head_logprob[c0 + i - 1] + tail_logprob_i`. Without
    cutoffs it is a plain (optionally projected) log-softmax.

    Tables (and tied projections) belong to the `AdaptiveEmbedding` and are
    passed in at call time; this layer owns the output biases, the cluster
    logits, untied projections and, with `tie_embeddings=False`, its own
    tables.

    Args:
        config: `TransformerXLConfig`.

    Call arguments:
        hidden: (B, T, D) tensor.
        embedding_tables: list of the embedding's tables.
        embedding_projections: list of the embedding's projections.

    Returns:
        (B, T, V) float32 log-probabilities.
    """

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        from keras_txl.config import TransformerXLConfig

        if isinstance(config, dict):
            config = TransformerXLConfig.from_dict(config)
        self.config = config
        self.own_projections = []
        self.own_tables = []

    def build(self, input_shape=None):
        cfg = self.config
        init = keras.initializers.RandomNormal(stddev=cfg.init_std)
        proj_init = keras.initializers.RandomNormal(
            stddev=cfg.projection_init_std
        )
        self.bias = self.add_weight(
            name="bias", shape=(cfg.vocabulary_size,), initializer="zeros"
        )
        if cfg.num_clusters:
            self.cluster_kernel = self.add_weight(
                name="cluster_kernel",
                shape=(cfg.num_clusters, cfg.cluster_embedding_dim(0)),
                initializer=init,
            )
            self.cluster_bias = self.add_weight(
                name="cluster_bias", shape=(cfg.num_clusters,),
                initializer="zeros",
            )
        ties = cfg.resolved_tie_projections
        for i in range(cfg.num_clusters + 1):
            if cfg.cluster_has_projection(i) and not ties[i]:
                self.own_projections.append(
                    self.add_weight(
                        name=f"projection_{i}",
                        shape=(cfg.cluster_embedding_dim(i), cfg.hidden_dim),
                        initializer=proj_init,
                    )
                )
            else:
                self.own_projections.append(None)
        if not cfg.tie_embeddings:
            if cfg.div_val == 1:
                shapes = [(cfg.vocabulary_size, cfg.cluster_embedding_dim(0))]
            else:
                shapes = [
                    (end - start, cfg.cluster_embedding_dim(i))
                    for i, (start, end) in enumerate(cfg.cluster_bounds)
                ]
            for i, shape in enumerate(shapes):
                self.own_tables.append(
                    self.add_weight(
                        name=f"table_{i}", shape=shape, initializer=init
                    )
                )
        self.built = True

    def cluster_weights(self, embedding_tables, embedding_projections):
        """[(table_i, bias_i, projection_i or None)] per cluster, head first."""
        cfg = self.config
        tables = self.own_tables if not cfg.tie_embeddings else embedding_tables
        ties = cfg.resolved_tie_projections
        # The clusters' rows of the one (V, E) table with div_val 1, and of the
        # bias, by one split: its gradient is one concatenation. A slice per
        # cluster has a gradient of the whole table's size each, zero-padded,
        # then summed (wt103_base: four 440 MB tensors per step in float32);
        # nor does TensorFlow alias the slices when a row is not a multiple of
        # 64 bytes (d 410: 1,640), so they were copies as well.
        splits = [end for _, end in cfg.cluster_bounds[:-1]]
        biases = ops.split(self.bias, splits, axis=0) if splits else [self.bias]
        if cfg.div_val == 1:
            rows = ops.split(tables[0], splits, axis=0) if splits else [tables[0]]
        out = []
        for i in range(len(cfg.cluster_bounds)):
            if cfg.div_val == 1:
                table = rows[i]
                shared = embedding_projections[0]
            else:
                table = tables[i]
                shared = embedding_projections[i]
            if not cfg.cluster_has_projection(i):
                projection = None
            elif ties[i]:
                projection = shared
            else:
                projection = self.own_projections[i]
            out.append((table, biases[i], projection))
        return out

    def _logits(self, hidden, table, bias, projection):
        if table.shape[-1] == 0:
            return _bias_only_logits(hidden, bias)
        dtype = self.compute_dtype
        if projection is not None:
            hidden = ops.einsum(
                "btd,ed->bte", hidden, ops.cast(projection, dtype)
            )  # (B, T, E_i)
        logits = ops.einsum("bte,ve->btv", hidden, ops.cast(table, dtype))
        return ops.cast(logits, "float32") + ops.cast(bias, "float32")

    def call(self, hidden, embedding_tables, embedding_projections):
        cfg = self.config
        hidden = ops.cast(hidden, self.compute_dtype)
        weights = self.cluster_weights(embedding_tables, embedding_projections)
        head_table, head_bias, head_projection = weights[0]
        if not cfg.num_clusters:
            return ops.log_softmax(
                self._logits(hidden, head_table, head_bias, head_projection),
                axis=-1,
            )
        head_table = ops.concatenate(
            [ops.cast(head_table, "float32"), self.cluster_kernel], axis=0
        )
        head_bias = ops.concatenate([head_bias, self.cluster_bias], axis=0)
        head = ops.log_softmax(
            self._logits(hidden, head_table, head_bias, head_projection), axis=-1
        )  # (B, T, c0 + C)
        shortlist = cfg.cutoffs[0]
        pieces = [head[..., :shortlist]]
        for i in range(1, cfg.num_clusters + 1):
            start, end = cfg.cluster_bounds[i]
            if end == start:
                # An empty last cluster (cutoffs[-1] == V) has no columns; its
                # (.., 0) logits would abort oneDNN's matmul in graph mode.
                continue
            table, bias, projection = weights[i]
            tail = ops.log_softmax(
                self._logits(hidden, table, bias, projection), axis=-1
            )
            column = shortlist + i - 1
            pieces.append(head[..., column : column + 1] + tail)
        return ops.concatenate(pieces, axis=-1)  # (B, T, V)

    def nll(self, hidden, targets, embedding_tables, embedding_projections):
        """The targets' negative log-likelihood, without the (B, T, V) log-probs.

        Equals `-log_probs[..., target]` of `call` (the same logits, the same
        log-sum-exp), but a tail cluster's logits are computed only for the
        tokens whose target falls in it (the official code's and Hugging
        Face's training loss), and no (B, T, V) tensor is formed. With
        WikiText-103's 267,735 words at batch 60 x 150 tokens the full
        log-probs are 9.6 GB in float32, and the gradient of picking from
        them indexes B * T * V > 2**31 elements (an int32 overflow).

        Args:
            hidden: (B, T, D) tensor (any leading shape).
            targets: int tensor of hidden's leading shape, ids in [0, V).
            embedding_tables, embedding_projections: as for `call`.

        Returns:
            float32 tensor of targets' shape.
        """
        import tensorflow as tf

        cfg = self.config
        dtype = self.compute_dtype
        out_shape = ops.shape(targets)
        hidden = ops.reshape(ops.cast(hidden, dtype), (-1, cfg.hidden_dim))  # (N, D)
        targets = ops.reshape(ops.cast(targets, "int32"), (-1,))  # (N,)
        weights = self.cluster_weights(embedding_tables, embedding_projections)
        head_table, head_bias, head_projection = weights[0]
        if not cfg.num_clusters:
            logits = self._rows_logits(hidden, head_table, head_bias, head_projection)
            return ops.reshape(_picked_nll(logits, targets), out_shape)
        head_table = ops.concatenate(
            [ops.cast(head_table, "float32"), self.cluster_kernel], axis=0
        )
        head_bias = ops.concatenate([head_bias, self.cluster_bias], axis=0)
        head = self._rows_logits(hidden, head_table, head_bias, head_projection)
        shortlist = cfg.cutoffs[0]
        # Each target's cluster (0 = the shortlist) and its column of the head:
        # itself in the shortlist, else its cluster's logit.
        cluster = sum(ops.cast(targets >= c, "int32") for c in cfg.cutoffs)
        column = ops.where(cluster == 0, targets, shortlist + cluster - 1)
        nll = _picked_nll(head, column)
        rows_static = hidden.shape[0]
        static_rows = rows_static is not None and _tails_in_static_rows()
        for i in range(1, cfg.num_clusters + 1):
            start, end = cfg.cluster_bounds[i]
            if end == start:  # an empty last cluster: no target is in it
                continue
            table, bias, projection = weights[i]
            if static_rows:
                tail_nll = (self._tail_nll_bucketed
                            if rows_static * (end - start) <= _BUCKETED_LOGITS_MAX
                            else self._tail_nll_chunked)
                nll = nll + tail_nll(hidden, targets, cluster == i, start, weights[i],
                                     rows_static)
                continue
            # The rows whose target is in cluster i: a dynamic shape, exact.
            rows = ops.reshape(ops.where(cluster == i)[0], (-1, 1))
            # After the NLL so far: TensorFlow's executor would otherwise start
            # each cluster's logits as soon as the rows are known, and the
            # head's (N, c0) logits and every tail's would be alive together
            # (wt103_base's evaluation at batch 60: 0.7 + 1.2 GB).
            with tf.control_dependencies([nll]):
                picked_hidden = ops.take(hidden, rows[:, 0], axis=0)
            tail = self._rows_logits(picked_hidden, table, bias, projection)
            tail_nll = _picked_nll(tail, ops.take(targets, rows[:, 0], axis=0) - start)
            nll = nll + ops.scatter(rows, tail_nll, ops.shape(nll))
        return ops.reshape(nll, out_shape)

    def _tail_nll_bucketed(self, hidden, targets, member, start, cluster_weights, n):
        """A small tail cluster's NLL, scattered to (N,), with static shapes (XLA).

        (Tails whose N x V_i every-row logits exceed `_BUCKETED_LOGITS_MAX`
        take `_tail_nll_chunked` instead: XLA sizes this one's memory for its
        largest bucket, every row.) XLA gives `ops.where(member)` its bound, N
        rows, so the dynamic path above computes this cluster's logits for
        every row under XLA: at
        WikiText-103's vocabulary that is 247,735 logits per token where the
        official code computes ~20,000 (2.2x the FLOPs wt103_base needs per
        token; on an H200 the XLA-compiled float32 step trained at 0.76x graph
        mode's speed). Static shapes need a bound known when compiling, so the
        rows are taken in buckets: the smallest of the capacities
        `_capacities(n)` (n, n/2, ..., n/32) that holds this batch's rows,
        chosen at run time (nested `ops.cond`, one branch per capacity). At
        most twice the rows needed are computed, or n/32 when fewer are needed;
        the filler rows are masked to 0 and get no gradient. Exact: the same
        per-row logits as the dynamic path.

        The gradient picks the bucket again, recomputes its logits and
        differentiates them inside the branch. Differentiating through the
        forward's conds would not do: under XLA, TensorFlow makes each branch
        output the other branches' intermediates too, as zeros (the logits of
        every bucket, ~2N rows of each cluster, filled at every step; measured,
        the loss pass took 787 ms against ~700 ms now, docs/benchmarks.md).
        """
        import tensorflow as tf

        table, bias, projection = cluster_weights
        capacities = _capacities(n)
        # Each member row's slot among the members, in order.
        slot = ops.cumsum(ops.cast(member, "int32")) - 1
        count = ops.sum(ops.cast(member, "int32"))
        # The index of the smallest capacity >= count (capacities ascending).
        smaller = ops.convert_to_tensor(capacities[:-1], dtype="int32")
        branch = ops.sum(ops.cast(count > smaller, "int32"))

        def tail_nll(capacity, hidden, table, bias, *projection):
            projection = projection[0] if projection else None
            if capacity == n:  # every row: no selection needed
                rows, valid = None, member
                picked_hidden, picked_targets = hidden, targets
            else:
                # Row + 1 into each member's slot (slot `capacity` collects
                # the rest and is dropped); 0 marks an empty slot.
                into = ops.where(member & (slot < capacity), slot, capacity)
                filled = ops.scatter(ops.reshape(into, (-1, 1)),
                                     ops.arange(1, n + 1, dtype="int32"), (capacity + 1,))
                filled = filled[:capacity]
                rows, valid = ops.maximum(filled - 1, 0), filled > 0
                picked_hidden = _take_rows(hidden, rows)
                picked_targets = ops.take(targets, rows, axis=0)
            logits = self._rows_logits(picked_hidden, table, bias, projection)
            picked = _picked_nll(logits, picked_targets - start)
            picked = ops.where(valid, picked, ops.zeros_like(picked))
            if rows is None:
                return picked
            return ops.scatter(ops.reshape(rows, (-1, 1)), picked, (n,))

        def switch(branch_fn, i=0):
            # Nested conds (If ops), not one switch (a Case op): with a Case in
            # it, TensorFlow's bridge to XLA took 26 s instead of 6.5 s to
            # compile wt103_base's evaluation step (16 layers, 2-core Zen 5).
            if i == len(capacities) - 1:
                return branch_fn(capacities[i])()
            return ops.cond(branch <= i, branch_fn(capacities[i]),
                            lambda: switch(branch_fn, i + 1))

        @tf.custom_gradient
        def bucketed(*inputs):
            # The forward unseen by any tape (custom_gradient leaves it
            # recorded: tracing a persistent tape's step took 26 s, not 1).
            unseen = [ops.stop_gradient(x) for x in inputs]
            nll = switch(lambda c: lambda: tail_nll(c, *unseen))

            def grad(upstream):
                def backward(capacity):
                    def run():
                        with tf.GradientTape() as tape:
                            tape.watch(inputs)
                            out = tail_nll(capacity, *inputs)
                        return tape.gradient(
                            out, inputs, output_gradients=upstream,
                            unconnected_gradients=tf.UnconnectedGradients.ZERO)
                    return run

                return switch(backward)

            return nll, grad

        inputs = (hidden, table, bias) + (() if projection is None else (projection,))
        return bucketed(*[ops.convert_to_tensor(x) for x in inputs])

    def _tail_nll_chunked(self, hidden, targets, member, start, cluster_weights, n):
        """A tail cluster's NLL, scattered to (N,), with static shapes (XLA).

        XLA gives `ops.where(member)` its bound, N rows, so the dynamic path
        above would compute this cluster's logits for every row under XLA: at
        WikiText-103's vocabulary 247,735 logits per token where the official
        code computes ~20,000 (2.2x the FLOPs wt103_base needs per token; on
        an H200 the XLA-compiled float32 step trained at 0.76x graph mode's
        speed). Here the member rows are taken in order, `_chunk_rows(n)` (N/32)
        at a time, by a loop that runs as many times as this batch needs (a
        `tf.while_loop` with a run-time trip count): at most one chunk of
        filler rows is computed (masked to 0, no gradient), and XLA, whose
        buffers are sized when compiling, holds one chunk's logits at a time.
        Exact: the same per-row logits as the dynamic path.

        For tails whose every-row logits exceed `_BUCKETED_LOGITS_MAX`; the
        smaller ones take `_tail_nll_bucketed`'s buckets, whose memory XLA
        sizes for their largest branch, every row (with buckets alone,
        wt103_base's 2-layer evaluation step at batch 60 peaked at 14.7 GB in
        bf16 on a CPU, docs/benchmarks.md).

        The gradient loops over the same chunks, recomputes each one's logits
        and differentiates them there, summing into the inputs' gradients: a
        loop differentiated by TensorFlow would keep every iteration's logits
        for its backward pass.
        """
        import tensorflow as tf

        table, bias, projection = cluster_weights
        chunk = _chunk_rows(n)
        chunks = -(-n // chunk)
        # Each member row's slot among the members, in order; row + 1 into
        # its slot (slot `chunks * chunk` collects the rest and is dropped),
        # 0 marking an empty slot.
        slot = ops.cumsum(ops.cast(member, "int32")) - 1
        count = ops.sum(ops.cast(member, "int32"))
        size = chunks * chunk
        into = ops.where(member, slot, size)
        filled = ops.scatter(ops.reshape(into, (-1, 1)), ops.arange(1, n + 1, dtype="int32"),
                             (size + 1,))[:size]
        all_rows, all_valid = ops.maximum(filled - 1, 0), filled > 0
        iterations = (count + chunk - 1) // chunk

        def chunk_rows(i):
            rows = tf.slice(all_rows, [i * chunk], [chunk])
            return rows, tf.slice(all_valid, [i * chunk], [chunk])

        def chunk_nll(rows, valid, picked_hidden, table, bias, projection):
            logits = self._rows_logits(picked_hidden, table, bias, projection)
            picked = _picked_nll(logits, tf.gather(targets, rows) - start)
            return tf.where(valid, picked, tf.zeros_like(picked))

        def loop(body, initial):
            return tf.while_loop(lambda i, *_: i < iterations, body, (tf.constant(0), *initial),
                                 maximum_iterations=chunks)[1:]

        @tf.custom_gradient
        def chunked(*inputs):
            # The forward unseen by any tape (custom_gradient leaves it
            # recorded: tracing a persistent tape's step took 26 s, not 1).
            hidden, table, bias, *projection = [tf.stop_gradient(x) for x in inputs]
            projection = projection[0] if projection else None

            def forward(i, nll):
                rows, valid = chunk_rows(i)
                picked = chunk_nll(rows, valid, tf.gather(hidden, rows), table, bias,
                                   projection)
                return i + 1, tf.tensor_scatter_nd_add(nll, rows[:, None], picked)

            (nll,) = loop(forward, (tf.zeros((n,), "float32"),))

            def grad(upstream):
                def backward(i, *sums):
                    rows, valid = chunk_rows(i)
                    weights = list(inputs[1:])
                    picked_hidden = tf.gather(inputs[0], rows)
                    with tf.GradientTape() as tape:
                        tape.watch([picked_hidden, *weights])
                        picked = chunk_nll(rows, valid, picked_hidden, *weights[:2],
                                           weights[2] if len(weights) > 2 else None)
                    grads = tape.gradient(
                        picked, [picked_hidden, *weights],
                        output_gradients=tf.gather(upstream, rows),
                        unconnected_gradients=tf.UnconnectedGradients.ZERO)
                    d_hidden = tf.tensor_scatter_nd_add(sums[0], rows[:, None], grads[0])
                    return (i + 1, d_hidden,
                            *[total + g for total, g in zip(sums[1:], grads[1:])])

                return loop(backward, [tf.zeros_like(x) for x in inputs])

            return nll, grad

        inputs = (hidden, table, bias) + (() if projection is None else (projection,))
        return chunked(*[ops.convert_to_tensor(x) for x in inputs])

    def _rows_logits(self, rows, table, bias, projection):
        """(N, D) rows in the compute dtype -> (N, V_i) float32 logits, as `_logits`."""
        if table.shape[-1] == 0:
            return _bias_only_logits(rows, bias)
        dtype = self.compute_dtype
        if projection is not None:
            rows = ops.einsum("nd,ed->ne", rows, ops.cast(projection, dtype))
        logits = ops.einsum("ne,ve->nv", rows, ops.cast(table, dtype))
        return ops.cast(logits, "float32") + ops.cast(bias, "float32")

    def get_config(self):
        config = super().get_config()
        config.update(config=self.config.to_dict())
        return config


def _bias_only_logits(hidden, bias):
    """A 0-wide cluster's logits (its tokens score by their bias alone, as in
    the official code) without its 0-deep matmuls, which abort the process
    inside oneDNN in graph mode: (..., D) hidden -> (..., V_i) float32."""
    bias = ops.cast(bias, "float32")
    shape = tuple(ops.shape(hidden)[:-1]) + (ops.shape(bias)[0],)
    return ops.zeros(shape, "float32") + bias


def _tails_in_static_rows():
    """Whether `AdaptiveSoftmax.nll` takes each tail's rows in static shapes
    (buckets or chunks): under XLA, whose shapes are static
    (`benchmarks/adaptive_nll.py` turns it off to time the dynamic rows under
    XLA, every row)."""
    return in_xla_context()


# Under XLA a tail of V_i words over N rows takes its rows in buckets while
# N * V_i logits (every row's, what XLA sizes the buckets' memory for) stay
# within this, else in chunks (`_tail_nll_chunked`). 2**28: 1 GiB of float32
# logits; WikiText-103's largest tail at 1,024 rows (1.6e8) is bucketed, at
# the GPU benchmark's 9,000 (1.4e9) chunked. Measured on a 2-core Zen 5: the
# buckets' fewer passes over a tail's table ran the loss at 1,024 rows in
# 662-711 ms against 900-967 chunked, and an evaluation step at M = 1,600
# (128 rows) in 166-182 ms against 199-201 (docs/benchmarks.md).
_BUCKETED_LOGITS_MAX = 2**28


def _chunk_rows(n):
    """Rows per chunk of a tail cluster's loop over N rows (`_tail_nll_chunked`).

    N/32 (at most 1/32 of the rows computed in vain, and one chunk's logits
    held), but at least 64 rows, or all N: every chunk reads the cluster's
    whole table, so a chunk must be large enough for its matmul to be bound by
    arithmetic rather than by reading the table (WikiText-103's largest tail
    is 160,000 x 410, 262 MB in float32: a 64-row chunk does ~32 FLOPs per
    byte of it).
    """
    return min(n, max(64, -(-n // 32)))


def _capacities(n, halvings=5):
    """Ascending row capacities n / 2**k (k = halvings .. 0, rounded up), ending at n."""
    return sorted({-(-n // 2**k) for k in range(halvings + 1)})


def _take_rows(values, rows):
    """`ops.take(values, rows, axis=0)` whose gradient is a dense (n, ...) tensor.

    A gather's own gradient is IndexedSlices; leaving a cond's branch, their
    dense shape becomes an output of the cond, which XLA cannot read when
    compiling ("must be a compile-time constant"). Here the branch sums the
    rows' gradients into the static shape itself.
    """
    import tensorflow as tf

    n = values.shape[0]

    @tf.custom_gradient
    def take(values):
        def grad(upstream):
            return tf.math.unsorted_segment_sum(upstream, rows, n)

        return tf.gather(values, rows), grad

    return take(values)


def pick_columns(values, columns):
    """(..., V) float values, (...) int columns -> (...) values[..., columns].

    Graph mode gathers the columns from the flattened values with int64
    indices, and its gradient (`upstream` at each picked column, zeros
    elsewhere) is one `scatter_nd` into the values' shape: the only (..., V)
    tensor the pick adds. TensorFlow's own choices would not do: a batched
    gather indexes the flattened (... * V,) values in int32, which overflows
    with a large vocabulary (WikiText-103's log-probs at batch 60 x 150 hold
    2.4e9), and a one-hot comparison (`where(column == arange(V), values, 0)`)
    holds a boolean mask, a zeros tensor and the selection, each (..., V), in
    the forward pass and again in its gradient (measured on wt103_base's
    evaluation at batch 60: 1.1 GB each for the largest tail cluster, 36 % of
    the step's peak memory). Under XLA the comparison is kept: XLA fuses it
    into the reduction without forming any of them.
    """
    if in_xla_context():
        vocabulary = ops.shape(values)[-1]
        hit = ops.arange(vocabulary, dtype="int32") == ops.cast(columns, "int32")[..., None]
        return ops.sum(ops.where(hit, values, ops.zeros_like(values)), axis=-1)
    return _gather_columns(values, columns)


def _gather_columns(values, columns):
    import tensorflow as tf

    columns = tf.cast(columns, tf.int64)
    out_shape = tf.shape(columns)
    vocabulary = tf.shape(values, out_type=tf.int64)[-1]
    columns = tf.reshape(columns, [-1])
    rows = tf.range(tf.size(columns, out_type=tf.int64), dtype=tf.int64)

    # A column outside [0, V) picks 0 and gets no gradient, as the comparison
    # does; its flat index would otherwise read a neighbouring row.
    inside = (columns >= 0) & (columns < vocabulary)
    columns = tf.where(inside, columns, tf.zeros_like(columns))

    @tf.custom_gradient
    def pick(values):
        picked = tf.gather(tf.reshape(values, [-1]), rows * vocabulary + columns)
        picked = tf.where(inside, picked, tf.zeros_like(picked))
        # The gradient reads only the shape: the values need not stay alive for it.
        shape = tf.shape(values)

        def grad(upstream):
            indices = tf.stack([rows, columns], axis=1)
            upstream = tf.where(inside, tf.reshape(upstream, [-1]), tf.zeros_like(picked))
            dense = tf.scatter_nd(indices, upstream,
                                  tf.stack([tf.size(rows, out_type=tf.int64), vocabulary]))
            return tf.reshape(dense, shape)

        return tf.reshape(picked, out_shape), grad

    return pick(values)


def _picked_nll(logits, columns):
    """(N, V) float32 logits, (N,) int columns -> (N,) logsumexp - logits[columns]."""
    return ops.logsumexp(logits, axis=-1) - pick_columns(logits, columns)
