"""An independent float64 NumPy transcription of the official TF model.

Follows kimiyoung/transformer-xl `tf/model.py` (`transformer`,
`rel_multihead_attn`, `rel_shift`, `_create_mask`, `_cache_mem`,
`positionwise_FF`, `mask_adaptive_embedding_lookup`,
`mask_adaptive_logsoftmax`) line by line, time-major as the original, on a
dict of variables under the official names. It shares no code with
keras_txl. Also writes such variables as a TF1 name-based checkpoint (a
`tf.compat.v1` graph and `Saver`) with a `corpus-info.json`, as the
official `train_gpu.py` / `data_utils.py` do.

Shape legend (time-major, as the official code): T segment, B batch,
M memory, K = M + T, N heads, H head width, D d_model, V vocabulary.
"""

import dataclasses
import json
import os

import numpy as np


@dataclasses.dataclass
class Layout:
    """The official hyper-parameters (train_gpu.py flags and corpus info)."""

    n_token: int
    n_layer: int
    d_model: int
    d_embed: int
    n_head: int
    d_head: int
    d_inner: int
    cutoffs: list = dataclasses.field(default_factory=list)  # inner ones
    div_val: int = 1
    untie_r: bool = False
    proj_share_all_but_first: bool = False
    proj_same_dim: bool = True
    dataset: str = "enwik8"
    # Evaluation settings.
    tgt_len: int = 4
    mem_len: int = 6
    clamp_len: int = -1
    same_length: bool = True

    @property
    def tie_projs(self):
        ties = [False] * (len(self.cutoffs) + 1)
        if self.proj_share_all_but_first:
            for i in range(1, len(ties)):
                ties[i] = True
        return ties


# The four released layouts, tiny, plus variants of shapes and settings.
LAYOUTS = {
    # WikiText-103: adaptive input/softmax, div_val 4, shared projections
    # but the first, untied r biases (tf/sota/wt103.sh).
    "wt103": Layout(
        n_token=150, n_layer=2, d_model=64, d_embed=64, n_head=4, d_head=16,
        d_inner=96, cutoffs=[20, 45, 90], div_val=4, untie_r=True,
        proj_share_all_but_first=True, dataset="wt103",
        tgt_len=4, mem_len=6, clamp_len=5, same_length=True,
    ),
    # enwik8 / text8: no cutoffs, div_val 1, tied r biases.
    "enwik8": Layout(
        n_token=60, n_layer=2, d_model=32, d_embed=32, n_head=2, d_head=16,
        d_inner=48, dataset="enwik8", tgt_len=5, mem_len=7, clamp_len=6,
        same_length=True,
    ),
    "text8": Layout(
        n_token=27, n_layer=3, d_model=24, d_embed=24, n_head=4, d_head=6,
        d_inner=40, dataset="text8", tgt_len=4, mem_len=4, clamp_len=-1,
        same_length=True,
    ),
    # One Billion Word: proj_same_dim=False, no projection sharing, div_val 4.
    "lm1b": Layout(
        n_token=160, n_layer=2, d_model=64, d_embed=64, n_head=2, d_head=32,
        d_inner=80, cutoffs=[30, 60, 100], div_val=4, untie_r=True,
        proj_same_dim=False, dataset="lm1b", tgt_len=3, mem_len=5,
        clamp_len=-1, same_length=True,
    ),
    # Variants: other heads (N H != D), memory, clamp, same_length off.
    "wt103_heads3x8_mem9_clamp2": Layout(
        n_token=100, n_layer=2, d_model=32, d_embed=32, n_head=3, d_head=8,
        d_inner=40, cutoffs=[20, 50], div_val=2, untie_r=True,
        proj_share_all_but_first=True, dataset="wt103", tgt_len=3,
        mem_len=9, clamp_len=2, same_length=False,
    ),
    # d_embed != d_model without cutoffs: the softmax reuses proj_W.
    "enwik8_embed16_untied": Layout(
        n_token=50, n_layer=2, d_model=32, d_embed=16, n_head=4, d_head=8,
        d_inner=48, untie_r=True, dataset="enwik8", tgt_len=4, mem_len=3,
        clamp_len=2, same_length=True,
    ),
    # A last cluster 0 wide: d_embed // div_val**3 = 16 // 64 = 0. The
    # official code creates lookup_table [60, 0] and proj_W [0, D]: those
    # tokens embed to zero and score by their bias alone.
    "wt103_zero_wide_last_cluster": Layout(
        n_token=150, n_layer=2, d_model=32, d_embed=16, n_head=2, d_head=16,
        d_inner=40, cutoffs=[20, 45, 90], div_val=4, untie_r=True,
        proj_share_all_but_first=True, dataset="wt103", tgt_len=4,
        mem_len=5, clamp_len=-1, same_length=True,
    ),
    # The last cutoff equal to the vocabulary: the official data_utils
    # writes [0, 20, 45, 90, 90], and tf/model.py builds an empty last
    # cluster (its head logit takes a share of the probability).
    "wt103_empty_last_cluster": Layout(
        n_token=90, n_layer=2, d_model=32, d_embed=16, n_head=2, d_head=16,
        d_inner=40, cutoffs=[20, 45, 90], div_val=2, untie_r=True,
        proj_share_all_but_first=True, dataset="wt103", tgt_len=4,
        mem_len=5, clamp_len=-1, same_length=True,
    ),
    # div_val 1 with cutoffs: one table, cutoff_i softmax scopes.
    "div1_cutoffs": Layout(
        n_token=80, n_layer=2, d_model=32, d_embed=16, n_head=2, d_head=16,
        d_inner=40, cutoffs=[30, 55], div_val=1,
        proj_share_all_but_first=True, dataset="wt103", tgt_len=4,
        mem_len=5, clamp_len=-1, same_length=True,
    ),
}


# === Variables ===


def official_variables(layout, seed=0):
    """{official name: float32 array} with random values, as tf/model.py
    would create them for `layout` (scope `transformer/`)."""
    lay = layout
    rng = np.random.default_rng(seed)

    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    v = {}
    t = "transformer/"
    bias_shape = ([lay.n_layer] if lay.untie_r else []) + [lay.n_head, lay.d_head]
    v[t + "r_w_bias"] = normal(bias_shape, 0.3)
    v[t + "r_r_bias"] = normal(bias_shape, 0.3)
    n_token, d_model, d_embed = lay.n_token, lay.d_model, lay.d_embed
    ends = [0] + list(lay.cutoffs) + [n_token]
    # mask_adaptive_embedding_lookup
    if lay.div_val == 1:
        v[t + "adaptive_embed/lookup_table"] = normal([n_token, d_embed], 0.3)
        if d_model != d_embed:
            v[t + "adaptive_embed/proj_W"] = normal([d_embed, d_model], 0.3)
    else:
        for i in range(len(ends) - 1):
            cur = d_embed // (lay.div_val ** i)
            s = t + f"adaptive_embed/cutoff_{i}/"
            v[s + "lookup_table"] = normal([ends[i + 1] - ends[i], cur], 0.3)
            if not (d_model == cur and not lay.proj_same_dim):
                v[s + "proj_W"] = normal([cur, d_model], 1.0 / np.sqrt(max(cur, 1)))
    hid = lay.n_head * lay.d_head
    for layer in range(lay.n_layer):
        a = t + f"layer_{layer}/rel_attn/"
        f = t + f"layer_{layer}/ff/"
        v[a + "qkv/kernel"] = normal([d_model, 3 * hid], 0.4 / np.sqrt(d_model))
        v[a + "r/kernel"] = normal([d_model, hid], 0.4 / np.sqrt(d_model))
        v[a + "o/kernel"] = normal([hid, d_model], 1.0 / np.sqrt(hid))
        v[a + "LayerNorm/gamma"] = (1 + normal([d_model], 0.2))
        v[a + "LayerNorm/beta"] = normal([d_model], 0.2)
        inner = lay.d_inner
        v[f + "layer_1/kernel"] = normal([d_model, inner], 1 / np.sqrt(d_model))
        v[f + "layer_1/bias"] = normal([inner], 0.1)
        v[f + "layer_2/kernel"] = normal([inner, d_model], 1 / np.sqrt(inner))
        v[f + "layer_2/bias"] = normal([d_model], 0.1)
        v[f + "LayerNorm/gamma"] = (1 + normal([d_model], 0.2))
        v[f + "LayerNorm/beta"] = normal([d_model], 0.2)
    # mask_adaptive_logsoftmax
    s = t + "adaptive_softmax/"
    if not lay.cutoffs:
        v[s + "bias"] = normal([n_token], 0.5)
        return v
    for i in range(len(ends) - 1):
        cur = d_embed // (lay.div_val ** i)
        c = s + f"cutoff_{i}/"
        v[c + "b"] = normal([ends[i + 1] - ends[i]], 0.5)
        if not lay.tie_projs[i]:
            if (lay.div_val == 1 or not lay.proj_same_dim) and d_model == cur:
                pass
            else:
                v[c + "proj"] = normal([cur, d_model], 1.0 / np.sqrt(d_model))
        if i == 0:
            v[c + "cluster_W"] = normal([len(lay.cutoffs), d_embed], 0.5)
            v[c + "cluster_b"] = normal([len(lay.cutoffs)], 0.5)
    return v


def optimizer_slots(variables, seed=1):
    """Adam slots and counters a training run leaves in a checkpoint."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, value in variables.items():
        for slot in ("Adam", "Adam_1"):
            out[f"{name}/{slot}"] = rng.standard_normal(value.shape).astype(
                np.float32
            )
    out["beta1_power"] = np.float32(0.9**3)
    out["beta2_power"] = np.float32(0.999**3)
    out["global_step"] = np.int64(1191000)
    return out


def write_checkpoint(directory, variables, layout, prefix="model.ckpt",
                     global_step=0, cutoffs_form="official", extra=None,
                     corpus_info=True):
    """Saves `variables` as a TF1 name-based checkpoint + corpus-info.json.

    `cutoffs_form`: "official" writes `[0, c..., n_token]` as
    `data_utils.py` does, "inner" writes only `[c...]`.
    """
    import tensorflow as tf

    os.makedirs(directory, exist_ok=True)
    everything = dict(variables)
    everything.update(extra or {})
    graph = tf.Graph()
    with graph.as_default():
        created = [
            tf.compat.v1.Variable(value, name=name)
            for name, value in everything.items()
        ]
        saver = tf.compat.v1.train.Saver(created)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            path = saver.save(
                session, os.path.join(directory, prefix),
                global_step=global_step,
            )
    if corpus_info:
        cutoffs = list(layout.cutoffs)
        if cutoffs_form == "official" and cutoffs:
            cutoffs = [0] + cutoffs + [layout.n_token]
        with open(os.path.join(directory, "corpus-info.json"), "w") as f:
            json.dump({"vocab_size": layout.n_token, "cutoffs": cutoffs,
                       "dataset": layout.dataset}, f)
    return path


# === Forward pass (float64) ===


def _create_mask(qlen, mlen, same_length):
    # tf/model.py `_create_mask`: 1 = blocked.
    attn_mask = np.ones([qlen, qlen])
    mask_u = np.triu(attn_mask)  # matrix_band_part(., 0, -1)
    mask_dia = np.diag(np.diag(attn_mask))  # matrix_band_part(., 0, 0)
    attn_mask_pad = np.zeros([qlen, mlen])
    ret = np.concatenate([attn_mask_pad, mask_u - mask_dia], 1)
    if same_length:
        mask_l = np.tril(attn_mask)  # matrix_band_part(., -1, 0)
        ret = np.concatenate(
            [ret[:, :qlen] + mask_l - mask_dia, ret[:, qlen:]], 1
        )
    return ret


def _rel_shift(x):
    # x: [qlen, klen, bsz, n_head]; pad one zero column in front of klen.
    size = x.shape
    x = np.pad(x, [[0, 0], [1, 0], [0, 0], [0, 0]])
    x = np.reshape(x, [size[1] + 1, size[0], size[2], size[3]])
    x = x[1:]
    return np.reshape(x, size)


def _layer_norm(x, gamma, beta, eps=1e-12):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def _log_softmax(x):
    if x.shape[-1] == 0:  # an empty last cluster: tf.nn.log_softmax gives an empty tensor
        return x
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _softmax(x, axis):
    x = x - x.max(axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis, keepdims=True)


def forward(layout, variables, token_ids, mems=None):
    """One segment of the official model, float64, dropout off.

    Args:
        layout: `Layout`.
        variables: {official name: array}.
        token_ids: (B, T) ints (batch-major, converted inside).
        mems: list of n_layer [M, B, D] arrays, or None (zeros, as the
            official evaluation feeds).

    Returns:
        (log_probs (B, T, V) float64, new_mems list of [M, B, D]).
    """
    lay = layout
    w = {k: np.asarray(val, np.float64) for k, val in variables.items()}
    t = "transformer/"
    dec_inp = np.asarray(token_ids).T  # [T, B]
    qlen, bsz = dec_inp.shape
    d_model, n_head, d_head = lay.d_model, lay.n_head, lay.d_head
    if mems is None:
        mems = [np.zeros([lay.mem_len, bsz, d_model]) for _ in range(lay.n_layer)]
    mlen = mems[0].shape[0]
    klen = mlen + qlen
    ends = [0] + list(lay.cutoffs) + [lay.n_token]

    # Adaptive input, scaled by sqrt(d_model) after the projection.
    if lay.div_val == 1:
        y = w[t + "adaptive_embed/lookup_table"][dec_inp]
        if t + "adaptive_embed/proj_W" in w:
            y = np.einsum("ibe,ed->ibd", y, w[t + "adaptive_embed/proj_W"])
    else:
        y = np.zeros([qlen, bsz, d_model])
        for i in range(len(ends) - 1):
            s = t + f"adaptive_embed/cutoff_{i}/"
            mask = (dec_inp >= ends[i]) & (dec_inp < ends[i + 1])
            cur = w[s + "lookup_table"][dec_inp[mask] - ends[i]]
            if s + "proj_W" in w:
                cur = cur @ w[s + "proj_W"]
            y[mask] = cur
    embeddings = y * d_model**0.5

    attn_mask = _create_mask(qlen, mlen, lay.same_length)
    pos_seq = np.arange(klen - 1, -1, -1.0)
    if lay.clamp_len > 0:
        pos_seq = np.minimum(pos_seq, lay.clamp_len)
    inv_freq = 1 / (10000 ** (np.arange(0, d_model, 2.0) / d_model))
    sinusoid = np.einsum("i,j->ij", pos_seq, inv_freq)
    pos_emb = np.concatenate([np.sin(sinusoid), np.cos(sinusoid)], -1)  # [K, D]

    output = embeddings
    new_mems = []
    for layer in range(lay.n_layer):
        # _cache_mem: the layer *input* joins the memory; mem_len 0 keeps
        # the (empty) memory it was given (`[-0:]` would keep everything).
        if lay.mem_len == 0:
            new_mems.append(mems[layer])
        else:
            new_mems.append(
                np.concatenate([mems[layer], output], 0)[-lay.mem_len:]
            )
        a = t + f"layer_{layer}/rel_attn/"
        r_w_bias = w[t + "r_w_bias"][layer] if lay.untie_r else w[t + "r_w_bias"]
        r_r_bias = w[t + "r_r_bias"][layer] if lay.untie_r else w[t + "r_r_bias"]
        cat = np.concatenate([mems[layer], output], 0)  # [K, B, D]
        heads = cat @ w[a + "qkv/kernel"]
        r_head_k = pos_emb @ w[a + "r/kernel"]  # [K, N H]
        q, k, v = np.split(heads, 3, -1)
        q = q[-qlen:].reshape(qlen, bsz, n_head, d_head)
        k = k.reshape(klen, bsz, n_head, d_head)
        v = v.reshape(klen, bsz, n_head, d_head)
        r_head_k = r_head_k.reshape(klen, n_head, d_head)
        AC = np.einsum("ibnd,jbnd->ijbn", q + r_w_bias, k)
        BD = _rel_shift(np.einsum("ibnd,jnd->ijbn", q + r_r_bias, r_head_k))
        score = (AC + BD) * (1 / d_head**0.5)
        m = attn_mask[:, :, None, None]
        score = score * (1 - m) - 1e30 * m
        prob = _softmax(score, 1)
        vec = np.einsum("ijbn,jbnd->ibnd", prob, v).reshape(
            qlen, bsz, n_head * d_head
        )
        out = vec @ w[a + "o/kernel"]
        output = _layer_norm(
            out + output, w[a + "LayerNorm/gamma"], w[a + "LayerNorm/beta"]
        )
        f = t + f"layer_{layer}/ff/"
        inner = np.maximum(output @ w[f + "layer_1/kernel"] + w[f + "layer_1/bias"], 0)
        ff = inner @ w[f + "layer_2/kernel"] + w[f + "layer_2/bias"]
        output = _layer_norm(
            ff + output, w[f + "LayerNorm/gamma"], w[f + "LayerNorm/beta"]
        )

    # Adaptive log-softmax over the whole vocabulary (the official code
    # gathers the targets' entries of exactly these values).
    def logit(x, W, b, proj):
        if proj is not None:
            x = np.einsum("ibd,ed->ibe", x, proj)
        return np.einsum("ibd,nd->ibn", x, W) + b

    s = t + "adaptive_softmax/"
    if lay.div_val == 1:
        params_W = w[t + "adaptive_embed/lookup_table"]
        params_projs = w.get(t + "adaptive_embed/proj_W")
    else:
        params_W = [w[t + f"adaptive_embed/cutoff_{i}/lookup_table"]
                    for i in range(len(ends) - 1)]
        params_projs = [w.get(t + f"adaptive_embed/cutoff_{i}/proj_W")
                        for i in range(len(ends) - 1)]
    if not lay.cutoffs:
        logprob = _log_softmax(logit(output, params_W, w[s + "bias"], params_projs))
    else:
        logprob = np.zeros([qlen, bsz, lay.n_token])
        for i in range(len(ends) - 1):
            c = s + f"cutoff_{i}/"
            l_idx, r_idx = ends[i], ends[i + 1]
            cur_W = params_W[l_idx:r_idx] if lay.div_val == 1 else params_W[i]
            cur_b = w[c + "b"]
            if lay.tie_projs[i]:
                cur_proj = params_projs if lay.div_val == 1 else params_projs[i]
            else:
                cur_proj = w.get(c + "proj")
            if i == 0:
                cur_W = np.concatenate([cur_W, w[c + "cluster_W"]], 0)
                cur_b = np.concatenate([cur_b, w[c + "cluster_b"]], 0)
                head_logprob = _log_softmax(logit(output, cur_W, cur_b, cur_proj))
                logprob[..., l_idx:r_idx] = head_logprob[..., : r_idx - l_idx]
            else:
                tail = _log_softmax(logit(output, cur_W, cur_b, cur_proj))
                logprob[..., l_idx:r_idx] = (
                    head_logprob[..., ends[1] + i - 1, None] + tail
                )
    return logprob.transpose(1, 0, 2), new_mems
