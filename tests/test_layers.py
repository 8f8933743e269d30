"""Hand-computed checks of the building blocks, one at a time."""

from functools import partial

import numpy as np
import pytest
import tensorflow as tf
from keras import ops
from testing import tiny_config

from keras_txl.adaptive import AdaptiveEmbedding
from keras_txl.adaptive import AdaptiveSoftmax
from keras_txl.memory import attention_mask
from keras_txl.memory import update_memory
from keras_txl.position_encoding import relative_position_embedding
from keras_txl.relative_attention import RelativeMultiHeadAttention
from keras_txl.relative_attention import relative_shift


def test_relative_shift_on_a_3x5_example():
    # T=3 queries, K=5 keys (M=2). Raw column c holds distance K-1-c, so
    # raw[i, c] = 10*i + (K-1-c) encodes (query, distance).
    T, K, M = 3, 5, 2
    raw = np.array([[10 * i + (K - 1 - c) for c in range(K)] for i in range(T)],
                   dtype="float32")
    out = ops.convert_to_numpy(relative_shift(raw[None, None]))[0, 0]
    for i in range(T):
        for j in range(K):
            if j <= M + i:  # visible: must hold distance M + i - j of query i
                assert out[i, j] == 10 * i + (M + i - j), (i, j, out)
    # The exact matrix, garbage entries included (they are masked later).
    np.testing.assert_array_equal(out, [[2, 1, 0, 0, 14],
                                        [13, 12, 11, 10, 0],
                                        [24, 23, 22, 21, 20]])


def test_relative_shift_keeps_leading_axes_apart():
    x = np.random.default_rng(0).normal(size=(2, 3, 4, 6)).astype("float32")
    out = ops.convert_to_numpy(relative_shift(x))
    for b in range(2):
        for n in range(3):
            single = ops.convert_to_numpy(relative_shift(x[b, n]))
            np.testing.assert_array_equal(out[b, n], single)


def test_causal_mask_over_memory_and_segment():
    mask = ops.convert_to_numpy(attention_mask(3, 2))
    np.testing.assert_array_equal(mask.astype(int), [[1, 1, 1, 0, 0],
                                                     [1, 1, 1, 1, 0],
                                                     [1, 1, 1, 1, 1]])


def test_same_length_official_tf_sees_memory_plus_one_keys():
    mask = ops.convert_to_numpy(attention_mask(3, 2, True, "official_tf"))
    np.testing.assert_array_equal(mask.astype(int), [[1, 1, 1, 0, 0],
                                                     [0, 1, 1, 1, 0],
                                                     [0, 0, 1, 1, 1]])
    assert (mask.sum(1) == 3).all()


def test_same_length_pytorch_sees_memory_keys():
    mask = ops.convert_to_numpy(attention_mask(3, 2, True, "pytorch"))
    np.testing.assert_array_equal(mask.astype(int), [[0, 1, 1, 0, 0],
                                                     [0, 0, 1, 1, 0],
                                                     [0, 0, 0, 1, 1]])
    # Hugging Face's degenerate case: no memory blocks every key.
    assert not ops.convert_to_numpy(attention_mask(3, 0, True, "pytorch")).any()


def test_update_memory_keeps_last_positions():
    old = np.arange(2 * 3 * 1, dtype="float32").reshape(2, 3, 1)
    new = 100 + np.arange(2 * 2 * 1, dtype="float32").reshape(2, 2, 1)
    out = ops.convert_to_numpy(update_memory(old, new, 3))
    np.testing.assert_array_equal(out[0, :, 0], [2, 100, 101])
    out = ops.convert_to_numpy(update_memory(old, new, 1))
    np.testing.assert_array_equal(out[1, :, 0], [103])
    assert ops.convert_to_numpy(update_memory(old[:, :0], new, 0)).shape == (2, 0, 1)


@pytest.mark.parametrize("old_length,new_length,memory_length", [
    (3, 2, 3), (3, 2, 2), (3, 2, 1), (3, 5, 4), (4, 2, 5), (6, 2, 3), (0, 3, 3)])
def test_update_memory_equals_the_last_positions_of_the_join(
        old_length, new_length, memory_length):
    # Whatever path it takes (the segment alone when T >= M, a kept tail of
    # the old memory otherwise, or the join when T is unknown at tracing).
    rng = np.random.default_rng(old_length * 10 + new_length)
    old = rng.normal(size=(2, old_length, 3)).astype("float32")
    new = rng.normal(size=(2, new_length, 3)).astype("float32")
    expected = np.concatenate([old, new], 1)[:, -memory_length:]
    np.testing.assert_array_equal(
        ops.convert_to_numpy(update_memory(old, new, memory_length)), expected)
    unknown_length = tf.function(
        lambda a, b: update_memory(a, b, memory_length),
        input_signature=[tf.TensorSpec((None, None, 3)), tf.TensorSpec((None, None, 3))])
    np.testing.assert_array_equal(unknown_length(old, new).numpy(), expected)


@pytest.mark.parametrize("length", [-2, 1.5, True, "3"])
def test_last_of_joined_names_a_bad_length(length):
    from keras_txl.memory import last_of_joined

    with pytest.raises(ValueError, match=r"`length` must be a non-negative int\. Received: length="):
        last_of_joined(np.zeros((1, 2, 3)), np.zeros((1, 2, 3)), length)


def test_fused_kernels_takes_a_bool_only():
    from keras_txl import fusion

    with pytest.raises(ValueError, match=r"`enabled` must be True or False\. Received: enabled='yes'"):
        with fusion.fused_kernels("yes"):
            pass
    assert not fusion.enabled()
    with fusion.fused_kernels():
        assert fusion.enabled()
        with fusion.fused_kernels(False):
            assert not fusion.enabled()
        assert fusion.enabled()
    assert not fusion.enabled()


def test_position_embedding_is_sin_then_cos_with_clamp():
    R = ops.convert_to_numpy(relative_position_embedding(5, 4, clamp_length=2))
    inv = 1.0 / 10000 ** (np.arange(0, 4, 2) / 4)
    distances = np.minimum(np.arange(4, -1, -1), 2)  # 4..0 clamped to 2
    angles = distances[:, None] * inv[None]
    np.testing.assert_allclose(R, np.concatenate([np.sin(angles), np.cos(angles)], 1),
                               atol=1e-6)


def _naive_relative_attention(q_in, mem, Wqkv, Wr, Wo, u, v, R, mask):
    """Direct transcription of the paper's A_ij, one (i, j) at a time."""
    cat = np.concatenate([mem, q_in], 1)
    B, K, _ = cat.shape
    T = q_in.shape[1]
    M = K - T
    N, H = u.shape
    q = np.einsum("btd,dnh->btnh", q_in, Wqkv[:, 0])
    k = np.einsum("bkd,dnh->bknh", cat, Wqkv[:, 1])
    val = np.einsum("bkd,dnh->bknh", cat, Wqkv[:, 2])
    out = np.zeros((B, T, N, H))
    for b in range(B):
        for n in range(N):
            for i in range(T):
                scores = np.full(K, -np.inf)
                for j in range(K):
                    if not mask[i, j]:
                        continue
                    dist = M + i - j
                    r = R[K - 1 - dist] @ Wr[:, n]  # row of distance `dist`
                    scores[j] = ((q[b, i, n] + u[n]) @ k[b, j, n]
                                 + (q[b, i, n] + v[n]) @ r) / np.sqrt(H)
                p = np.exp(scores - scores.max())
                p /= p.sum()
                out[b, i, n] = p @ val[b, :, n]
    return np.einsum("btnh,nhd->btd", out, Wo)


@pytest.mark.parametrize("same_length", [False, True])
def test_relative_attention_matches_naive_formula(same_length):
    rng = np.random.default_rng(1)
    B, T, M, D, N, H = 2, 3, 4, 8, 2, 4
    layer = RelativeMultiHeadAttention(N, H)
    layer.build((B, T, D))
    weights = [rng.normal(size=w.shape).astype("float32") * 0.5 for w in layer.weights]
    for w, value in zip(layer.weights, weights):
        w.assign(value)
    Wqkv, Wr, Wo = weights
    u, v = rng.normal(size=(N, H)), rng.normal(size=(N, H))
    q_in = rng.normal(size=(B, T, D)).astype("float32")
    mem = rng.normal(size=(B, M, D)).astype("float32")
    R = ops.convert_to_numpy(relative_position_embedding(M + T, D))
    mask = ops.convert_to_numpy(attention_mask(T, M, same_length, "official_tf"))
    got = layer(q_in, mem, position_embedding=R, content_bias=u.astype("float32"),
                position_bias=v.astype("float32"), attention_mask=mask)
    expected = _naive_relative_attention(q_in, mem, Wqkv, Wr, Wo, u, v, R, mask)
    np.testing.assert_allclose(ops.convert_to_numpy(got), expected, atol=1e-4)


def _attention_case(seed, T, M, same_length=False, **layer_kwargs):
    """A built attention layer (D=8, N=2, H=4, B=2) and random inputs for it."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    B, D, N, H = 2, 8, 2, 4
    layer = RelativeMultiHeadAttention(N, H, **layer_kwargs)
    layer.build((B, T, D))
    normal = lambda *shape: rng.normal(size=shape).astype("float32")  # noqa: E731
    return dict(
        layer=layer, query=tf.constant(normal(B, T, D)),
        memory=tf.constant(normal(B, M, D)),
        u=tf.Variable(normal(N, H)), v=tf.Variable(normal(N, H)),
        R=relative_position_embedding(M + T, D),
        mask=attention_mask(T, M, same_length, "official_tf"),
        upstream=tf.constant(normal(B, T, D)),
    )


@pytest.mark.parametrize("relative,same_length", [(True, False), (True, True), (False, False)])
def test_training_attention_recomputes_the_same_values_and_gradients(relative, same_length):
    # training=True (no dropout) takes the path that recomputes the scores
    # in the backward pass; training=False the plain one. Same outputs,
    # same gradients for the inputs, the memory, every weight and u, v.
    import tensorflow as tf

    case = _attention_case(3, T=5, M=4, same_length=same_length, relative=relative)
    layer, q_in, mem, u, v, R, mask, upstream = (case[k] for k in (
        "layer", "query", "memory", "u", "v", "R", "mask", "upstream"))
    sources = [q_in, mem, u, v] + [w.value for w in layer.weights]

    def run(training):
        with tf.GradientTape() as tape:
            tape.watch([q_in, mem])
            out = layer(q_in, mem, position_embedding=R, content_bias=u,
                        position_bias=v, attention_mask=mask, training=training)
            loss = tf.reduce_sum(out * upstream)
        grads = tape.gradient(loss, sources)
        return out, grads

    out_plain, grads_plain = run(False)
    out_recomputed, grads_recomputed = run(True)
    np.testing.assert_allclose(out_recomputed, out_plain, rtol=1e-6, atol=1e-6)
    for name, a, b in zip(["query", "memory", "u", "v"] + [w.path for w in layer.weights],
                          grads_recomputed, grads_plain):
        if not relative and name in ("u", "v"):
            assert a is None and b is None
            continue
        assert a is not None, name
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)


def test_attention_dropout_is_recomputed_with_the_same_mask():
    # With attention dropout the training path draws the seed once and the
    # backward pass recomputes the same mask: outputs and gradients equal
    # the plain path (Keras' Dropout layer) for the same generator state.
    import tensorflow as tf

    case = _attention_case(8, T=6, M=5, attention_dropout=0.4)
    layer, query, memory, u, v, R, mask, upstream = (case[k] for k in (
        "layer", "query", "memory", "u", "v", "R", "mask", "upstream"))
    generator = layer._probability_dropout.seed_generator
    start = generator.state.numpy()

    def plain():
        keys_in = tf.concat([memory, query], axis=1)
        q = layer.project_query(query)
        k, v_ = layer.project_keys(keys_in)
        r = layer.project_positions(R)
        return layer._attend(q, k, v_, r, u, v, mask, True, False)

    def recomputed():
        return layer(query, memory, position_embedding=R, content_bias=u,
                     position_bias=v, attention_mask=mask, training=True)

    results = []
    for fn in (plain, recomputed):
        generator.state.assign(start)
        with tf.GradientTape() as tape:
            tape.watch(query)
            out = fn()
            loss = tf.reduce_sum(out * upstream)
        grads = tape.gradient(loss, [query] + [w.value for w in layer.weights])
        results.append((out.numpy(), [g.numpy() for g in grads]))
    (out_a, grads_a), (out_b, grads_b) = results
    np.testing.assert_allclose(out_b, out_a, rtol=1e-6, atol=1e-6)
    for a, b in zip(grads_b, grads_a):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # Dropout did act: without it the output differs.
    generator.state.assign(start)
    no_dropout = layer(query, memory, position_embedding=R, content_bias=u,
                       position_bias=v, attention_mask=mask, training=False)
    assert not np.allclose(no_dropout.numpy(), out_a)


# The toolkit's tiny model with three clusters (ids 0-4, 5-11, 12-19) of
# widths 8, 4 and 2.
_config = partial(tiny_config, vocabulary_size=20, cutoffs=(5, 12), div_val=2)


def test_adaptive_embedding_looks_up_the_right_cluster():
    cfg = _config()
    layer = AdaptiveEmbedding(cfg)
    layer.build()
    ids = np.array([[0, 4, 5, 11, 12, 19]])
    got = ops.convert_to_numpy(layer(ids))[0]
    tables = [ops.convert_to_numpy(t) for t in layer.tables]
    projections = [ops.convert_to_numpy(p) for p in layer.projections]
    starts = [0, 5, 12]
    for pos, token in enumerate(ids[0]):
        c = 0 if token < 5 else (1 if token < 12 else 2)
        expected = tables[c][token - starts[c]] @ projections[c] * np.sqrt(8)
        np.testing.assert_allclose(got[pos], expected, atol=1e-5)


@pytest.mark.parametrize("changes", [
    {},
    {"div_val": 1, "embedding_dim": 6},
    {"div_val": 1, "embedding_dim": 8},
    {"cutoffs": (), "div_val": 1},
    {"tie_projections": (True, False, True)},
    {"tie_embeddings": False},
    {"cutoffs": (5, 20)},  # an empty last cluster, as the official code builds it
])
def test_adaptive_softmax_is_a_distribution_matching_a_direct_computation(changes):
    cfg = _config(**changes)
    embedding, softmax = AdaptiveEmbedding(cfg), AdaptiveSoftmax(cfg)
    embedding.build()
    softmax.build()
    for w in softmax.weights:  # non-zero biases so they matter
        w.assign(np.random.default_rng(2).normal(size=w.shape).astype("float32"))
    hidden = np.random.default_rng(3).normal(size=(2, 3, 8)).astype("float32")
    log_probs = ops.convert_to_numpy(
        softmax(hidden, embedding.tables, embedding.projections))
    assert log_probs.shape == (2, 3, 20) and log_probs.dtype == np.float32
    empty = bool(cfg.cutoffs) and cfg.cutoffs[-1] == 20
    if not empty:  # an empty last cluster keeps its share (below)
        np.testing.assert_allclose(np.exp(log_probs).sum(-1), 1.0, atol=1e-5)

    # Direct computation from the cluster weights, written independently.
    def logsoftmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    clusters = [(ops.convert_to_numpy(t), ops.convert_to_numpy(b),
                 None if p is None else ops.convert_to_numpy(p))
                for t, b, p in softmax.cluster_weights(embedding.tables,
                                                       embedding.projections)]

    def logits(i):
        t, b, p = clusters[i]
        h = hidden if p is None else hidden @ p.T
        return h @ t.T + b

    if not cfg.cutoffs:
        np.testing.assert_allclose(log_probs, logsoftmax(logits(0)), atol=1e-5)
        return
    t0, b0, p0 = clusters[0]
    h0 = hidden if p0 is None else hidden @ p0.T
    head = logsoftmax(np.concatenate(
        [h0 @ t0.T + b0,
         h0 @ ops.convert_to_numpy(softmax.cluster_kernel).T
         + ops.convert_to_numpy(softmax.cluster_bias)], -1))
    c0 = cfg.cutoffs[0]
    if empty:  # the tokens' probabilities and the empty cluster's head share
        np.testing.assert_allclose(
            np.exp(log_probs).sum(-1) + np.exp(head[..., c0 + len(cfg.cutoffs) - 1]), 1.0,
            atol=1e-5)
    expected = [head[..., :c0]]
    for i in range(1, len(cfg.cutoffs) + 1):
        if cfg.cluster_bounds[i][0] == cfg.cluster_bounds[i][1]:
            continue  # an empty cluster has no tokens
        expected.append(head[..., c0 + i - 1 : c0 + i] + logsoftmax(logits(i)))
    np.testing.assert_allclose(log_probs, np.concatenate(expected, -1), atol=1e-5)


def test_relu_dropout_values_and_gradient():
    import keras
    import tensorflow as tf

    from keras_txl.decoder_block import relu_dropout

    rate = 0.25
    x = tf.constant(np.random.default_rng(4).normal(size=(64, 256)).astype("float32"))
    x = tf.tensor_scatter_nd_update(x, [[0, 0]], [0.0])  # relu's kink at 0
    upstream = tf.constant(np.random.default_rng(5).normal(size=(64, 256)).astype("float32"))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = relu_dropout(x, rate, keras.random.SeedGenerator(7))
        loss = tf.reduce_sum(y * upstream)
    grad = tape.gradient(loss, x).numpy()
    y, xn = y.numpy(), x.numpy()
    relu = np.maximum(xn, 0) / (1 - rate)
    kept = y != 0
    # Every output is either dropped or the scaled relu.
    np.testing.assert_allclose(y[kept], relu[kept], rtol=1e-6)
    positive = xn > 0
    dropped = positive & ~kept
    assert abs(dropped.sum() / positive.sum() - rate) < 0.02
    # The gradient of relu(x) * keep / (1 - rate) for the keep mask drawn.
    expected = np.where(positive & kept, upstream.numpy() / (1 - rate), 0.0)
    np.testing.assert_allclose(grad, expected, rtol=1e-6)
    assert grad[0, 0] == 0.0
    with pytest.raises(ValueError, match=r"`rate` must be in \(0, 1\), received rate=1.0"):
        relu_dropout(x, 1.0, keras.random.SeedGenerator(7))
    # Another draw, another mask.
    again = relu_dropout(x, rate, keras.random.SeedGenerator(8)).numpy()
    assert (again != 0).sum() != kept.sum() or not np.array_equal(again != 0, kept)


def test_layer_norm_equals_keras_values_and_gradients():
    import keras
    import tensorflow as tf

    from keras_txl.decoder_block import LayerNorm

    rng = np.random.default_rng(6)
    x = tf.constant(rng.normal(2.0, 3.0, size=(3, 5, 16)).astype("float32"))
    upstream = tf.constant(rng.normal(size=(3, 5, 16)).astype("float32"))
    results = []
    for cls in (LayerNorm, keras.layers.LayerNormalization):
        layer = cls(epsilon=1e-5)
        layer.build(x.shape)
        layer.gamma.assign(rng.normal(size=16).astype("float32") if not results
                           else results[0][2][0])
        layer.beta.assign(rng.normal(size=16).astype("float32") if not results
                          else results[0][2][1])
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x)
            loss = tf.reduce_sum(y * upstream)
        grads = tape.gradient(loss, [x, layer.gamma.value, layer.beta.value])
        results.append((y.numpy(), [g.numpy() for g in grads],
                        (layer.gamma.numpy(), layer.beta.numpy())))
    (y_ours, grads_ours, _), (y_keras, grads_keras, _) = results
    np.testing.assert_allclose(y_ours, y_keras, rtol=1e-5, atol=1e-5)
    for name, a, b in zip(["x", "gamma", "beta"], grads_ours, grads_keras):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=name)
    # Same weights as Keras' layer (HF checkpoints and saved models load).
    layer = LayerNorm(name="norm")
    layer.build((None, 16))
    assert [w.path for w in layer.weights] == ["norm/gamma", "norm/beta"]


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_fused_layer_norms_equal_the_graph_ones(policy):
    # Under `fused_kernels`, inference norms (and the residual sums in
    # front of them) are one XLA-compiled call; training ignores it.
    import tensorflow as tf

    from keras_txl.decoder_block import LayerNorm
    from keras_txl.fusion import fused_kernels

    rng = np.random.default_rng(9)
    layer = LayerNorm(epsilon=1e-5, dtype=policy)
    layer.build((2, 5, 16))
    layer.gamma.assign(rng.normal(size=16).astype("float32"))
    layer.beta.assign(rng.normal(size=16).astype("float32"))
    x = tf.constant(rng.normal(2.0, 3.0, size=(2, 5, 16)), layer.compute_dtype)
    residual = tf.constant(rng.normal(size=(2, 5, 16)), layer.compute_dtype)
    as_float = lambda t: ops.convert_to_numpy(ops.cast(t, "float32"))  # noqa: E731

    def traced(fused, training):
        def run(a, b):
            with fused_kernels(fused):
                return layer(a, training=training), layer.normalize_sum(a, b, training)
        function = tf.function(run)
        graph = function.get_concrete_function(x, residual).graph
        compiled = [op for op in graph.get_operations()
                    if op.type in ("StatefulPartitionedCall", "PartitionedCall")
                    and op.get_attr("_XlaMustCompile")] if fused else []
        return [as_float(t) for t in function(x, residual)], len(compiled)

    (plain, plain_sum), _ = traced(False, False)
    (fused, fused_sum), n_compiled = traced(True, False)
    (_, _), n_compiled_training = traced(True, True)
    assert n_compiled == 2 and n_compiled_training == 0
    # float32: the same up to the order of the reductions. bfloat16: the
    # fused sum is not rounded to bfloat16 before the norm, so it is the
    # float32 norm of the exact sum rounded once.
    np.testing.assert_allclose(fused, plain, atol=1e-5 if policy == "float32" else 0.04)
    exact = as_float(x) + as_float(residual)
    exact = (exact - exact.mean(-1, keepdims=True)) / np.sqrt(exact.var(-1, keepdims=True) + 1e-5)
    exact = exact * layer.gamma.numpy() + layer.beta.numpy()
    step = 1e-5 if policy == "float32" else np.abs(exact) * 2.0 ** -8 + 1e-6
    assert (np.abs(fused_sum - exact) <= step).all()
    np.testing.assert_allclose(plain_sum, exact, atol=1e-5 if policy == "float32" else 0.1)
    assert keras_dtype_policy_is_float32()


def keras_dtype_policy_is_float32():
    import keras

    return keras.config.dtype_policy().name == "float32"


@pytest.mark.parametrize("relative,mask_kind", [
    (True, "causal"), (True, "per_row"), (True, "none"), (False, "causal")])
@pytest.mark.parametrize("policy,fused", [
    ("mixed_bfloat16", False), ("mixed_bfloat16", True), ("float32", True)])
def test_inference_probabilities_equal_the_float32_path(relative, mask_kind, policy, fused):
    # At inference the scores are masked by a select (in bfloat16 they go
    # through a bfloat16 softmax), and under `fused_kernels` the shift, sum
    # and mask are one XLA-compiled kernel; `return_scores` keeps the
    # float32 path (cast up, additive mask, float32 softmax, cast down).
    # Same output, to the bit, a row whose keys are all blocked included
    # (uniform). On a CPU without bfloat16 instructions (AVX2) the bfloat16
    # model takes the float32 path there too (its emulated bfloat16 softmax
    # differed by 1-2 ulps): the same bits by construction.
    import keras
    import tensorflow as tf

    from keras_txl.fusion import fused_kernels

    rng = np.random.default_rng(5)
    B, T, M, D, N, H = 2, 5, 4, 8, 2, 4
    layer = RelativeMultiHeadAttention(N, H, relative=relative, dtype=policy)
    layer.build((B, T, D))
    for w in layer.weights:
        w.assign(rng.normal(size=w.shape).astype("float32") * 0.7)
    mask = None
    if mask_kind == "causal":
        mask = attention_mask(T, M)
    elif mask_kind == "per_row":
        mask = np.broadcast_to(ops.convert_to_numpy(attention_mask(T, M)), (B, T, M + T)).copy()
        mask[1, 2, :] = False  # a fully blocked row
    kwargs = dict(attention_mask=mask)
    if relative:
        kwargs.update(position_embedding=relative_position_embedding(M + T, D),
                      content_bias=tf.constant(rng.normal(size=(N, H)), "float32"),
                      position_bias=tf.constant(rng.normal(size=(N, H)), "float32"))
    query = tf.constant(rng.normal(size=(B, T, D)) * 2, "float32")
    memory = tf.constant(rng.normal(size=(B, M, D)) * 2, "float32")
    with fused_kernels(fused):
        function = tf.function(lambda q, m: layer(q, m, **kwargs))
        graph = function.get_concrete_function(query, memory).graph
        fast = function(query, memory)
    compiled = [op for op in graph.get_operations()
                if op.type in ("StatefulPartitionedCall", "PartitionedCall")
                and op.get_attr("_XlaMustCompile")]
    # Without bfloat16 instructions a bfloat16 model's scores stay in graph
    # mode (XLA could keep their sum in float32: other bits).
    from keras_txl import host

    native = policy == "float32" or host.native_bfloat16()
    assert len(compiled) == (1 if fused and relative and native else 0)
    reference, details = layer(query, memory, return_scores=True, **kwargs)
    assert fast.dtype == reference.dtype == layer.compute_dtype
    np.testing.assert_array_equal(
        ops.convert_to_numpy(ops.cast(fast, "float32")),
        ops.convert_to_numpy(ops.cast(reference, "float32")))
    if mask_kind == "per_row":
        probabilities = ops.convert_to_numpy(details["probabilities"])
        np.testing.assert_allclose(probabilities[1, :, 2], 1.0 / (M + T), rtol=1e-6)
    assert keras.config.dtype_policy().name == "float32"


@pytest.mark.parametrize("changes", [
    {},
    {"div_val": 1, "embedding_dim": 6},
    {"cutoffs": (), "div_val": 1},
    {"tie_projections": (True, False, True)},
    {"tie_embeddings": False},
])
@pytest.mark.parametrize("jit", [False, True])
def test_adaptive_softmax_nll_equals_the_full_log_probs_with_the_same_gradients(changes, jit):
    # The training and evaluation loss: tail clusters only for the rows whose
    # target is in them, no (B, T, V) tensor. Every cluster gets targets.
    cfg = _config(**changes)
    embedding, softmax = AdaptiveEmbedding(cfg), AdaptiveSoftmax(cfg)
    embedding.build()
    softmax.build()
    for w in softmax.weights:
        w.assign(np.random.default_rng(2).normal(size=w.shape).astype("float32"))
    rng = np.random.default_rng(4)
    hidden = tf.constant(rng.normal(size=(3, 7, 8)).astype("float32"))
    targets = tf.constant(np.r_[np.arange(20), [0]].reshape(3, 7).astype("int32"))
    weights = [w.value for w in (*embedding.weights, *softmax.weights)]

    def both(hidden, targets):
        # The sums inside the tape: a target the tape did not record has no
        # gradient (zeros here, which would make the comparison below vacuous).
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(hidden)
            full = -tf.gather(softmax(hidden, embedding.tables, embedding.projections),
                              targets, batch_dims=2)
            nll = softmax.nll(hidden, targets, embedding.tables, embedding.projections)
            sums = [tf.reduce_sum(full), tf.reduce_sum(nll)]
        grads = [tape.gradient(total, [hidden, *weights],
                               unconnected_gradients=tf.UnconnectedGradients.ZERO)
                 for total in sums]
        return full, nll, grads

    full, nll, (g_full, g_nll) = tf.function(both, jit_compile=jit)(hidden, targets)
    assert nll.shape == (3, 7) and nll.dtype == tf.float32
    np.testing.assert_allclose(nll, full, rtol=1e-6, atol=1e-6)
    for a, b in zip(g_full, g_nll):
        # (float32 sums in another order: gradients up to ~10 here)
        np.testing.assert_allclose(tf.convert_to_tensor(b), tf.convert_to_tensor(a),
                                   rtol=1e-5, atol=1e-5)
    # The gradients compared are the losses' own: the hidden states and the
    # same weights get one from both (not the zeros of an unconnected target).
    def nonzero(grads):
        return [float(tf.reduce_max(tf.abs(tf.convert_to_tensor(g)))) > 0 for g in grads]

    assert nonzero(g_nll) == nonzero(g_full) and nonzero(g_nll)[0]
    assert sum(nonzero(g_nll)) >= 3  # the hidden states and the weights


@pytest.mark.parametrize("tie_embeddings", [True, False])
def test_adaptive_softmax_with_one_table_forms_its_gradient_once(tie_embeddings):
    # With div_val 1 the clusters are rows of one (V, E) table. Sliced per
    # cluster, each slice's gradient was a zero-padded (V, E) tensor, summed:
    # wt103_base's four were 440 MB each per float32 step (and the graph-mode
    # loss pass 1.5x slower on a 2-core CPU). One split: one concatenation.
    cfg = _config(div_val=1, embedding_dim=6, tie_embeddings=tie_embeddings)
    embedding, softmax = AdaptiveEmbedding(cfg), AdaptiveSoftmax(cfg)
    embedding.build()
    softmax.build()
    table = (embedding.tables if tie_embeddings else softmax.own_tables)[0].value
    hidden = tf.constant(np.random.default_rng(0).normal(size=(3, 7, 8)).astype("float32"))
    targets = tf.constant(np.r_[np.arange(20), [0]].reshape(3, 7).astype("int32"))

    @tf.function
    def table_gradient(hidden, targets):
        with tf.GradientTape() as tape:
            nll = tf.reduce_sum(softmax.nll(hidden, targets, embedding.tables,
                                            embedding.projections))
        return tape.gradient(nll, table)

    graph = table_gradient.get_concrete_function(hidden, targets).graph
    table_sized = [op.type for op in graph.get_operations()
                   for out in op.outputs if out.shape == table.shape]
    assert table_sized.count("ConcatV2") == 1, table_sized
    assert not {"StridedSliceGrad", "Pad", "AddN"} & set(table_sized), table_sized
    # Its rows: each cluster's own gradient (the head's, then each tail's).
    grad = table_gradient(hidden, targets).numpy()
    with tf.GradientTape() as tape:
        full = tf.reduce_sum(-tf.gather(softmax(hidden, embedding.tables,
                                                embedding.projections), targets, batch_dims=2))
    expected = tape.gradient(full, table).numpy()
    assert np.abs(expected).max() > 0
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-5)


def _nll_in_graph_mode_and_xla_with_tail_rows(count, positions):
    """The tiny adaptive softmax's NLL and gradients, graph mode and XLA, over
    4 x `positions` rows of which `count` have their target in the last tail;
    asserts the two equal. Returns (graph function, XLA function, hidden, targets)."""
    cfg = _config()
    embedding, softmax = AdaptiveEmbedding(cfg), AdaptiveSoftmax(cfg)
    embedding.build()
    softmax.build()
    for w in softmax.weights:
        w.assign(np.random.default_rng(3).normal(size=w.shape).astype("float32"))
    rng = np.random.default_rng(count)
    n = 4 * positions
    targets = rng.integers(0, 12, size=n)  # the head and cluster 1
    in_last = rng.choice(n, count, replace=False)
    targets[in_last] = rng.integers(12, 20, size=count)  # cluster 2: `count` rows
    targets = tf.constant(targets.reshape(4, positions).astype("int32"))
    hidden = tf.constant(rng.normal(size=(4, positions, 8)).astype("float32"))
    weights = [w.value for w in (*embedding.weights, *softmax.weights)]

    def loss_and_grads(hidden, targets):
        with tf.GradientTape() as tape:
            tape.watch(hidden)
            nll = softmax.nll(hidden, targets, embedding.tables, embedding.projections)
            total = tf.reduce_sum(nll * tf.range(1.0, positions + 1.0))
        grads = tape.gradient(total, [hidden, *weights],
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return nll, grads

    graph = tf.function(loss_and_grads)
    xla = tf.function(loss_and_grads, jit_compile=True)
    (nll, grads), (nll_xla, grads_xla) = graph(hidden, targets), xla(hidden, targets)
    # The gradients compared are the loss's: the last tail's table has one
    # exactly when some row's target is in it.
    last = [w.name for w in embedding.weights].index("table_2")
    assert np.abs(grads[0].numpy()).max() > 0
    assert (np.abs(tf.convert_to_tensor(grads[1 + last]).numpy()).max() > 0) == (count > 0)
    np.testing.assert_allclose(nll_xla, nll, rtol=1e-6, atol=1e-6)
    for a, b in zip(grads, grads_xla):
        a, b = tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy()
        # float32 sums in another order (per chunk, per bucket): up to ~1e-6 of
        # the largest entry (4.7e-5 where it is 56); a wrong or missing row
        # would be off by its whole gradient.
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=max(1e-5, 3e-6 * np.abs(a).max()))
    if count == 1:  # one row in all: one capacity or chunk of one row
        one = (hidden[:1, :1], targets[:1, :1])
        np.testing.assert_allclose(xla(*one)[0], graph(*one)[0], rtol=1e-6)
    return graph, xla, hidden, targets


def _op_types(function, *args):
    return {op.type for op in function.get_concrete_function(*args).graph.get_operations()}


@pytest.mark.parametrize("count", [0, 1, 2, 3, 9, 33, 63, 64])
def test_adaptive_softmax_nll_under_xla_takes_a_tails_rows_in_static_buckets(count):
    # Under XLA, a tail cluster's rows are taken in the smallest static
    # capacity (64, 32, ..., 2 rows here) that holds them, chosen at run time;
    # the same NLL and gradients as graph mode's exact dynamic rows, at each
    # bucket and its edges: no row, one, a capacity, one past it, every row.
    graph, xla, hidden, targets = _nll_in_graph_mode_and_xla_with_tail_rows(count, 16)
    # XLA picks the bucket with conds (If ops) and no Where (which XLA would
    # pad to every row); graph mode takes the exact rows with Where.
    assert "StatelessIf" in _op_types(xla, hidden, targets)
    assert "Where" not in _op_types(xla, hidden, targets)
    # The forward conds carry no intermediates out (differentiating through
    # one makes every branch output all branches' logits, as zeros): one per
    # tail cluster, each giving the (N,) NLL alone.
    # The backward conds (the custom gradient's) give the inputs' gradients alone.
    conds = [op for op in xla.get_concrete_function(hidden, targets).graph.get_operations()
             if op.type == "StatelessIf"]
    shapes = [[tuple(t.shape) for t in op.outputs] for op in conds]
    forward = [s for s in shapes if s == [(64,)]]
    assert len(forward) == 2, shapes
    # (the 64 rows' hidden states; each tail's table, bias and projection:
    # 7 x 4 and 8 x 2 with div_val 2, projections back to d 8)
    inputs = {(64, 8), (7, 4), (7,), (4, 8), (8, 2), (8,), (2, 8)}
    assert all(set(s) <= inputs for s in shapes if s not in forward), shapes
    assert "Where" in _op_types(graph, hidden, targets)
    assert "StatelessIf" not in _op_types(graph, hidden, targets)


@pytest.mark.parametrize("count", [0, 1, 63, 64, 65, 128, 200, 256])
def test_adaptive_softmax_nll_under_xla_takes_a_large_tails_rows_in_chunks(count, monkeypatch):
    # Under XLA, a tail whose every-row logits exceed the buckets' budget
    # (here: every tail) has its member rows taken 64 at a time (N / 32, at
    # least 64) by a loop that runs as often as the batch needs; the same NLL
    # and gradients as graph mode's exact dynamic rows, at each chunk edge: no
    # row, one, a chunk, one past it, two, a partial last chunk, every row.
    from keras_txl import adaptive
    from keras_txl.adaptive import _chunk_rows

    monkeypatch.setattr(adaptive, "_BUCKETED_LOGITS_MAX", -1)
    assert _chunk_rows(256) == 64 and _chunk_rows(9000) == 282 and _chunk_rows(20) == 20
    graph, xla, hidden, targets = _nll_in_graph_mode_and_xla_with_tail_rows(count, 64)
    # XLA loops over chunks (While) and has no Where (which XLA would pad to
    # every row); graph mode takes the exact rows with Where.
    loops = {"While", "StatelessWhile"}
    assert loops & _op_types(xla, hidden, targets)
    assert "Where" not in _op_types(xla, hidden, targets)
    assert "Where" in _op_types(graph, hidden, targets)
    assert not loops & _op_types(graph, hidden, targets)


def _mean_nll_in_graph_mode_and_xla(softmax, embedding, hidden, targets, variables):
    """(mean NLL, its gradients for `hidden` and `variables`), traced and XLA-compiled."""

    def loss_and_grads(hidden, targets):
        with tf.GradientTape() as tape:
            tape.watch(hidden)
            loss = tf.reduce_mean(softmax.nll(hidden, targets, embedding.tables,
                                              embedding.projections))
        return loss, tape.gradient(loss, [hidden, *variables])

    return [tf.function(loss_and_grads, jit_compile=jit)(hidden, targets)
            for jit in (False, True)]


def _embedding_and_bfloat16_softmax():
    """The tiny adaptive input (float32) and a mixed_bfloat16 softmax, built."""
    cfg = _config()
    embedding = AdaptiveEmbedding(cfg)
    softmax = AdaptiveSoftmax(cfg, dtype="mixed_bfloat16")
    embedding.build()
    softmax.build()
    return embedding, softmax


def test_adaptive_softmax_nll_under_xla_in_bfloat16_equals_graph_mode():
    embedding, softmax = _embedding_and_bfloat16_softmax()
    rng = np.random.default_rng(8)
    hidden = tf.constant(rng.normal(size=(4, 16, 8)).astype("float32"))
    targets = tf.constant(rng.integers(0, 20, size=(4, 16)).astype("int32"))

    (loss, grads), (loss_xla, grads_xla) = _mean_nll_in_graph_mode_and_xla(
        softmax, embedding, hidden, targets, softmax.trainable_weights)
    np.testing.assert_allclose(loss_xla, loss, rtol=1e-2)
    for a, b in zip(grads, grads_xla):
        assert b.dtype == a.dtype == tf.float32
        np.testing.assert_allclose(b, a, rtol=5e-2, atol=5e-3)


def test_adaptive_softmax_nll_trains_under_xla_with_a_large_vocabulary():
    # The variables' gradients of a jit-compiled loss, with a vocabulary large
    # enough that TensorFlow leaves the bucket conds' outputs unfolded: the
    # rows' gradient must leave each branch dense with a static shape, or XLA
    # refuses it ("must be a compile-time constant"). Same as graph mode.
    cfg = _config(vocabulary_size=100_000, cutoffs=(2_000, 4_000, 10_000), div_val=1,
                  hidden_dim=16)
    embedding, softmax = AdaptiveEmbedding(cfg), AdaptiveSoftmax(cfg)
    embedding.build()
    softmax.build()
    rng = np.random.default_rng(6)
    targets = tf.constant(rng.integers(0, 100_000, size=(2, 32)).astype("int32"))
    hidden = tf.constant(rng.normal(size=(2, 32, 16)).astype("float32"))
    variables = [*embedding.trainable_weights, *softmax.trainable_weights]
    (loss, grads), (loss_xla, grads_xla) = _mean_nll_in_graph_mode_and_xla(
        softmax, embedding, hidden, targets, variables)
    np.testing.assert_allclose(loss_xla, loss, rtol=1e-6)
    for a, b in zip(grads, grads_xla):
        np.testing.assert_allclose(tf.convert_to_tensor(b), tf.convert_to_tensor(a), atol=1e-6)


def test_adaptive_softmax_nll_under_xla_chunks_only_the_tails_too_large_for_buckets():
    # XLA sizes a bucketed tail's memory for every row, so a tail whose N x V_i
    # logits exceed 2**28 takes chunks: at 4,096 rows the 90,000-word tail
    # (3.7e8) loops over chunks, the 2,000 and 6,000-word ones take buckets.
    from keras_txl.adaptive import _BUCKETED_LOGITS_MAX

    assert 4096 * 6_000 <= _BUCKETED_LOGITS_MAX < 4096 * 90_000
    cfg = _config(vocabulary_size=100_000, cutoffs=(2_000, 4_000, 10_000), div_val=1,
                  hidden_dim=16)
    embedding, softmax = AdaptiveEmbedding(cfg), AdaptiveSoftmax(cfg)
    embedding.build()
    softmax.build()

    @tf.function(jit_compile=True)
    def nll(hidden, targets):
        return softmax.nll(hidden, targets, embedding.tables, embedding.projections)

    graph = nll.get_concrete_function(tf.TensorSpec((64, 64, 16), tf.float32),
                                      tf.TensorSpec((64, 64), tf.int32)).graph
    types = [op.type for op in graph.get_operations()]
    assert types.count("StatelessIf") == 2  # one nest of bucket conds per small tail
    assert sum(t in ("While", "StatelessWhile") for t in types) == 1


def test_adaptive_softmax_nll_in_bfloat16_and_with_a_vocabulary_past_int32_indexing():
    # mixed_bfloat16: the same logits as the full path, so the same NLL.
    embedding, softmax = _embedding_and_bfloat16_softmax()
    hidden = np.random.default_rng(5).normal(size=(2, 10, 8)).astype("float32")
    targets = np.arange(20).reshape(2, 10).astype("int32")
    full = -np.take_along_axis(ops.convert_to_numpy(
        softmax(hidden, embedding.tables, embedding.projections)), targets[..., None], -1)[..., 0]
    nll = softmax.nll(hidden, targets, embedding.tables, embedding.projections)
    np.testing.assert_allclose(ops.convert_to_numpy(nll), full, rtol=1e-6)
    # B * T * V above 2**31 (WikiText-103's vocabulary at batch 60 x 150): the
    # gradient of picking from the full log-probs overflowed int32 in its
    # scatter; the NLL's gradient graph traces (shapes only, nothing is run).
    big = _config(vocabulary_size=300_000, cutoffs=(20_000, 40_000), embedding_dim=8)
    big_embedding, big_softmax = AdaptiveEmbedding(big), AdaptiveSoftmax(big)

    @tf.function
    def loss_and_grads(hidden, targets):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(big_softmax.nll(hidden, targets, big_embedding.tables,
                                                 big_embedding.projections))
        return tape.gradient(loss, big_softmax.trainable_weights)

    big_embedding.build()
    big_softmax.build()
    loss_and_grads.get_concrete_function(tf.TensorSpec((60, 150, 8), tf.float32),
                                         tf.TensorSpec((60, 150), tf.int32))
