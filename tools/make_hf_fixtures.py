"""Generate extra Transformer-XL parity fixtures from the Hugging Face PyTorch reference.

This is a developer tool. It is NOT run by the test suite and it is not importable from
the package: it needs PyTorch and the (deprecated) HF TransfoXL code, which only run
unmodified in transformers 4.37.2 (4.38 .. 4.57 crash in TransfoXL, see
shared/fixtures/hf_transfo_xl_tiny/README.md). Run it from a separate virtualenv:

    python3 -m venv /work/peer-venv
    /work/peer-venv/bin/pip install torch==2.13.0 transformers==4.37.2 safetensors numpy
    /work/peer-venv/bin/python tools/make_hf_fixtures.py            # all option sets
    /work/peer-venv/bin/python tools/make_hf_fixtures.py NAME ...     # only some
    /work/peer-venv/bin/python tools/make_hf_fixtures.py --verify    # only re-check

For every option set in OPTION_SETS it
  1. builds TransfoXLConfig(**args) (dropout = dropatt = 0), torch.manual_seed(0),
     TransfoXLLMHeadModel(config) with HF's own init;
  2. rescales / perturbs every parameter once (tied tensors stay tied) so that nothing
     is 0 or 1 and attention is far from uniform (same recipe as the shared fixture);
  3. draws inputs int32 [2, 3*T] with numpy default_rng, redrawn until every
     adaptive-softmax cluster occurs in every segment;
  4. runs 3 segments of width T, segment 0 with mems=None, segment s+1 with the mems
     returned by segment s, one forward pass without labels per segment;
  5. writes tests/fixtures/<name>/: config.json, model.safetensors, inputs.npy,
     expected_logprobs_seg{s}.npy, expected_hidden_seg{s}.npy,
     expected_mems_seg{s}.npz (absent when mem_len == 0: HF then returns mems=None),
     README.md;
  6. reloads config.json + model.safetensors into a fresh HF model, recomputes, and
     requires every array to be bit-identical.
An option set with `save_dtype` is instead saved as a user's half-precision copy is
(`model.to(dtype).save_pretrained(folder, safe_serialization=True)`: config.json with the
non-default fields, tensors rounded, the inv_freq buffer too), and steps 4-6 run on
`TransfoXLLMHeadModel.from_pretrained(folder)` (float32, with the rounded frequencies).
"""

import argparse
import json
import math
import os
import sys
import warnings

import numpy as np

warnings.simplefilter("ignore")  # HF's TransfoXL deprecation warnings

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import TransfoXLConfig  # noqa: E402
from transformers import TransfoXLLMHeadModel  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_ROOT = os.path.join(REPO, "tests", "fixtures")
BATCH = 2
N_SEG = 3

# Every option set: TransfoXLConfig arguments (dropout/dropatt are forced to 0), the segment width T,
# and a one-line statement of what it covers.
OPTION_SETS = {
    "div1_cutoffs_dembed": dict(
        args=dict(vocab_size=150, cutoffs=[40, 100], div_val=1, d_model=32, d_embed=48, n_head=4,
                  d_head=8, d_inner=64, n_layer=2, mem_len=6, clamp_len=1000, same_length=False,
                  pre_lnorm=False, untie_r=True),
        T=5,
        covers="div_val=1 with cutoffs (one embedding table sliced by cluster in the softmax) and "
               "d_embed != d_model, so a single input projection emb_projs.0 exists; the softmax uses its own "
               "untied out_projs.0 for the head and out_projs.1/.2 == emb_projs.0 (tie_projs default "
               "[False, True, True]) for the tail clusters.",
    ),
    "div2_untied_projs_prelnorm": dict(
        args=dict(vocab_size=300, cutoffs=[100, 200], div_val=2, d_model=32, d_embed=32, n_head=4,
                  d_head=8, d_inner=64, n_layer=3, mem_len=8, clamp_len=1000, same_length=False,
                  pre_lnorm=True, untie_r=False, tie_projs=[False, False, True]),
        T=6,
        covers="pre-LN layers (memory stored un-normalised, zero first memory becomes LN bias), shared "
               "r_w_bias/r_r_bias across layers (untie_r=False), tie_projs=[False, False, True] (out_projs.1 is "
               "its own parameter, out_projs.2 == emb_projs.2), 3 layers.",
    ),
    "no_cutoffs_same_length_clamp": dict(
        args=dict(vocab_size=60, cutoffs=[], div_val=1, d_model=32, d_embed=32, n_head=4, d_head=8,
                  d_inner=64, n_layer=2, mem_len=7, clamp_len=3, same_length=True, pre_lnorm=False,
                  untie_r=True),
        T=5,
        covers="plain softmax (cutoffs=[], no cluster parameters, no projections at all since "
               "d_embed == d_model), same_length=True, clamp_len=3 (distances 0..11 occur, everything >= 3 "
               "uses the vector of 3).",
    ),
    "mem0_no_same_length": dict(
        args=dict(vocab_size=60, cutoffs=[20, 40], div_val=2, d_model=32, d_embed=32, n_head=4, d_head=8,
                  d_inner=64, n_layer=2, mem_len=0, clamp_len=1000, same_length=False, pre_lnorm=False,
                  untie_r=True),
        T=6,
        covers="mem_len=0: no memory at all, every segment is processed alone (HF returns mems=None, so no "
               "expected_mems files), with a 3-cluster div_val=2 adaptive softmax.",
    ),
    "untied_embeddings": dict(
        args=dict(vocab_size=60, cutoffs=[30], div_val=2, d_model=32, d_embed=32, n_head=4, d_head=8,
                  d_inner=64, n_layer=2, mem_len=5, clamp_len=1000, same_length=False, pre_lnorm=False,
                  untie_r=True, tie_word_embeddings=False),
        T=4,
        covers="tie_word_embeddings=False: crit.out_layers.i.weight are separate parameters (independent "
               "random values, different from the embedding tables); projections still tied per tie_projs "
               "default [False, True]; a single tail cluster.",
    ),
    "same_length_short_memory": dict(
        args=dict(vocab_size=60, cutoffs=[], div_val=1, d_model=32, d_embed=32, n_head=4, d_head=16,
                  d_inner=64, n_layer=3, mem_len=3, clamp_len=1000, same_length=True, pre_lnorm=False,
                  untie_r=True),
        T=6,
        covers="same_length=True with mem_len=3 < T=6: each query sees exactly mem_len=3 keys (itself and the "
               "2 before it), so early queries reach into the memory and late ones do not; memory keeps only "
               "the last 3 inputs of each layer; n_head*d_head = 64 != d_model = 32.",
    ),
    "zero_wide_last_cluster": dict(
        args=dict(vocab_size=60, cutoffs=[10, 20, 30], div_val=4, d_model=16, d_embed=16, n_head=2,
                  d_head=8, d_inner=32, n_layer=2, mem_len=5, clamp_len=1000, same_length=True,
                  pre_lnorm=False, untie_r=True),
        T=4,
        covers="a last cluster 0 wide: d_embed // div_val**3 = 16 // 64 = 0, so emb_layers.3.weight is "
               "[30, 0] and emb_projs.3 / out_projs.3 are [16, 0] (transformers builds it; its tokens embed to "
               "zero and score by their bias alone). This folder stores the 0-size tensors; transformers' own "
               "save_pretrained leaves some of them out (the test checks that form too).",
    ),
    "dembed_wide_noshare_tied_r_heads3": dict(
        args=dict(vocab_size=90, cutoffs=[20, 50], div_val=4, d_model=32, d_embed=64, n_head=3,
                  d_head=8, d_inner=48, n_layer=2, mem_len=5, clamp_len=2, same_length=True,
                  pre_lnorm=False, untie_r=False, tie_projs=[False, False, False]),
        T=4,
        covers="d_embed = 64 > d_model = 32 with div_val=4 (cluster widths 64, 16, 4: every cluster projects), "
               "tie_projs all False (as proj_share_all_but_first=False makes it: every crit.out_projs.i is its own "
               "parameter), shared r biases (untie_r=False), n_head*d_head = 24 != d_model, same_length with "
               "clamp_len=2.",
    ),
    "tie_projs_first_prelnorm_untied_r": dict(
        args=dict(vocab_size=90, cutoffs=[20, 50], div_val=2, d_model=32, d_embed=32, n_head=4, d_head=8,
                  d_inner=48, n_layer=2, mem_len=5, clamp_len=1000, same_length=False, pre_lnorm=True,
                  untie_r=True, tie_projs=[True, False, True]),
        T=4,
        covers="tie_projs=[True, False, True]: the head cluster's softmax projection tied to emb_projs.0 (the "
               "official code never does this, transformers allows it), cluster 1 untied, cluster 2 tied; "
               "pre-LN layers with per-layer r biases (untie_r=True).",
    ),
    # Saved as a user's half-precision copy is: `model.to(dtype).save_pretrained(...)`, which rounds the
    # inv_freq buffer too; the expected outputs are transformers' of that folder loaded back in float32
    # (`from_pretrained`, the default dtype), which computes its sinusoids with the rounded frequencies.
    "half_float16_frequencies": dict(
        args=dict(vocab_size=30, cutoffs=[], div_val=1, d_model=32, d_embed=32, n_head=2, d_head=8,
                  d_inner=32, n_layer=1, mem_len=10, clamp_len=1000, same_length=False, pre_lnorm=False,
                  untie_r=True),
        T=5,
        save_dtype="float16",
        covers="a checkpoint saved in float16 by `save_pretrained` (every tensor rounded, the "
               "transformer.pos_emb.inv_freq buffer included; tied copies left out, the config.json only "
               "the fields that differ from the defaults), loaded back by transformers in float32: its "
               "sinusoids use the rounded frequencies (up to 0.05% off 1 / 10000^(2k / d_model)).",
    ),
    "half_bfloat16_frequencies": dict(
        args=dict(vocab_size=30, cutoffs=[], div_val=1, d_model=32, d_embed=32, n_head=2, d_head=8,
                  d_inner=32, n_layer=1, mem_len=10, clamp_len=1000, same_length=False, pre_lnorm=False,
                  untie_r=True),
        T=5,
        save_dtype="bfloat16",
        covers="as half_float16_frequencies, saved in bfloat16: frequencies up to 0.4% off.",
    ),
}


# ----------------------------------------------------------------------------------------------
# model construction and weight perturbation

def make_config(args):
    return TransfoXLConfig(**args, dropout=0.0, dropatt=0.0)


def perturb(model):
    """Rescale / shift every (unique) parameter in place on the global torch RNG.

    Returns README rows (parameter name, change). Tied parameters are visited once because
    named_parameters() removes duplicates; the tie itself is untouched.
    """
    cfg = model.config
    std0, pstd0 = cfg.init_std, cfg.proj_init_std  # HF init: N(0, init_std) weights, N(0, proj_init_std) projs
    d_model = cfg.d_model
    rows = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".emb_layers." in name or (name.startswith("crit.out_layers.") and name.endswith(".weight")):
                f = 0.25 / std0
                p.mul_(f)
                rows.append((name, f"x{f:.4g} -> std 0.25"))
            elif ".emb_projs." in name or name.startswith("crit.out_projs."):
                f = (1.0 / math.sqrt(d_model)) / pstd0
                p.mul_(f)
                rows.append((name, f"x{f:.4g} -> std 1/sqrt(d_model)"))
            elif name.endswith("r_w_bias") or name.endswith("r_r_bias"):
                f = 0.5 / std0
                p.mul_(f)
                rows.append((name, f"x{f:.4g} -> std 0.5"))
            elif name.endswith("qkv_net.weight") or name.endswith("r_net.weight"):
                f = (1.2 / math.sqrt(p.shape[1])) / std0
                p.mul_(f)
                rows.append((name, f"x{f:.4g} -> std 1.2/sqrt(fan_in)"))
            elif name.endswith("o_net.weight") or name.endswith("CoreNet.3.weight"):
                f = (1.0 / math.sqrt(p.shape[1])) / std0
                p.mul_(f)
                rows.append((name, f"x{f:.4g} -> std 1/sqrt(fan_in)"))
            elif name.endswith("CoreNet.0.weight"):
                f = (math.sqrt(2.0) / math.sqrt(p.shape[1])) / std0
                p.mul_(f)
                rows.append((name, f"x{f:.4g} -> std sqrt(2)/sqrt(fan_in)"))
            elif name.endswith("CoreNet.0.bias") or name.endswith("CoreNet.3.bias") or ".layer_norm." in name:
                p.add_(torch.randn(p.shape) * 0.1)
                rows.append((name, "+N(0,0.1)"))
            elif name == "crit.cluster_weight":
                f = 0.25 / std0
                p.mul_(f)
                rows.append((name, f"x{f:.4g} -> std 0.25"))
            elif name == "crit.cluster_bias" or (name.startswith("crit.out_layers.") and name.endswith(".bias")):
                p.add_(torch.randn(p.shape) * 0.5)
                rows.append((name, "+N(0,0.5)"))
            else:
                raise RuntimeError(f"no perturbation rule for parameter {name}")
        for name, p in model.named_parameters():
            if bool((p == 0).any()) or bool((p == 1).any()):
                raise RuntimeError(f"{name} still has an exact 0 or 1")
    return rows


def build_model(args):
    config = make_config(args)
    torch.manual_seed(0)
    model = TransfoXLLMHeadModel(config)
    rows = perturb(model)
    model.eval()
    return model, rows


def tied_groups(model):
    """Lists of state_dict names that share storage (same tensor)."""
    groups = {}
    for k, v in model.state_dict().items():
        groups.setdefault((v.data_ptr(), tuple(v.shape)), []).append(k)
    return [g for g in groups.values() if len(g) > 1]


# ----------------------------------------------------------------------------------------------
# inputs and the 3-segment run

def cluster_bounds(vocab, cutoffs):
    edges = [0] + list(cutoffs) + [vocab]
    return list(zip(edges[:-1], edges[1:]))


def draw_inputs(vocab, cutoffs, T, seed=0):
    rng = np.random.default_rng(seed)
    bounds = cluster_bounds(vocab, cutoffs)
    for _ in range(10000):
        ids = rng.integers(0, vocab, size=(BATCH, N_SEG * T))
        ok = all(
            np.any((ids[:, s * T:(s + 1) * T] >= lo) & (ids[:, s * T:(s + 1) * T] < hi))
            for s in range(N_SEG) for lo, hi in bounds)
        if ok:
            return ids.astype(np.int32)
    raise RuntimeError("could not draw inputs covering every cluster")


def run_segments(model, ids, T):
    """Returns per segment: logprobs [B,T,V], hidden [B,T,d], mems (list of [M,B,d]) or None."""
    captured = {}

    def pre_hook(_module, args):
        captured["h"] = args[0].detach().clone()

    handle = model.crit.register_forward_pre_hook(pre_hook)
    out = []
    mems = None
    try:
        with torch.no_grad():
            for s in range(N_SEG):
                seg = torch.from_numpy(ids[:, s * T:(s + 1) * T].astype(np.int64))
                o = model(input_ids=seg, mems=mems, output_hidden_states=True, return_dict=True)
                hidden = captured.pop("h")
                if not torch.equal(hidden, o.hidden_states[-1]):
                    raise RuntimeError("crit input != last hidden state")
                lp = o.prediction_scores.numpy().astype(np.float32)
                hd = hidden.numpy().astype(np.float32)
                mm = None if o.mems is None else [m.numpy().astype(np.float32).copy() for m in o.mems]
                out.append((lp.copy(), hd.copy(), mm))
                mems = o.mems
    finally:
        handle.remove()
    return out


def attention_stats(model, ids, T):
    """Diagnostics: mean normalised entropy of attention rows over visible keys, and max prob."""
    ents, maxp = [], []
    mems = None
    with torch.no_grad():
        for s in range(N_SEG):
            seg = torch.from_numpy(ids[:, s * T:(s + 1) * T].astype(np.int64))
            o = model(input_ids=seg, mems=mems, output_attentions=True, return_dict=True)
            for a in o.attentions:  # [B, H, q, k]
                a = a.numpy().astype(np.float64)
                vis = a > 0
                n = vis.sum(-1)
                h = -(np.where(vis, a * np.log(np.where(vis, a, 1.0)), 0.0)).sum(-1)
                sel = n > 1
                ents.append((h[sel] / np.log(n[sel])).ravel())
                maxp.append(a.max(-1).ravel())
            mems = o.mems
    return float(np.concatenate(ents).mean()), float(np.concatenate(maxp).mean())


# ----------------------------------------------------------------------------------------------
# writing and verification

def write_fixture(name, spec):
    args, T = spec["args"], spec["T"]
    model, rows = build_model(args)
    folder = os.path.join(OUT_ROOT, name)
    os.makedirs(folder, exist_ok=True)
    for f in os.listdir(folder):
        os.remove(os.path.join(folder, f))
    if spec.get("save_dtype"):
        # The reference is the half-precision save loaded back in float32.
        exact = model.transformer.pos_emb.inv_freq.clone()
        model.to(getattr(torch, spec["save_dtype"])).save_pretrained(folder, safe_serialization=True)
        for extra in set(os.listdir(folder)) - {"config.json", "model.safetensors"}:
            os.remove(os.path.join(folder, extra))
        model = TransfoXLLMHeadModel.from_pretrained(folder)
        model.eval()
        if model.dtype != torch.float32 or torch.equal(model.transformer.pos_emb.inv_freq, exact):
            raise RuntimeError("the reference must run in float32 with the rounded frequencies")
    cfg = model.config
    ids = draw_inputs(cfg.vocab_size, cfg.cutoffs, T)
    results = run_segments(model, ids, T)
    again = run_segments(model, ids, T)
    for (a, b) in zip(results, again):
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])

    if not spec.get("save_dtype"):
        with open(os.path.join(folder, "config.json"), "w") as fh:
            json.dump(cfg.to_dict(), fh, indent=2, sort_keys=True)
            fh.write("\n")
        sd = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
        save_file(sd, os.path.join(folder, "model.safetensors"))
    np.save(os.path.join(folder, "inputs.npy"), ids)
    for s, (lp, hd, mm) in enumerate(results):
        np.save(os.path.join(folder, f"expected_logprobs_seg{s}.npy"), lp)
        np.save(os.path.join(folder, f"expected_hidden_seg{s}.npy"), hd)
        if mm is not None:
            np.savez(os.path.join(folder, f"expected_mems_seg{s}.npz"),
                     **{f"layer_{l}": m for l, m in enumerate(mm)})
        elif cfg.mem_len != 0:
            raise RuntimeError("HF returned mems=None with mem_len > 0")

    ent, mp = attention_stats(model, ids, T)
    write_readme(folder, name, spec, model, rows, ids, results, ent, mp)
    return folder


def fmt_args(args):
    return json.dumps(args)


def write_readme(folder, name, spec, model, rows, ids, results, ent, mp):
    cfg, T = model.config, spec["T"]
    V, M = cfg.vocab_size, cfg.mem_len
    klen_max = (M if M > 0 else 0) + T
    lines = []
    lines.append(f"# Parity fixture `{name}` (HF PyTorch TransfoXLLMHeadModel reference)\n")
    lines.append(f"Generated by `tools/make_hf_fixtures.py` (not run by the tests) with transformers "
                 f"{transformers.__version__}, torch {torch.__version__}, numpy {np.__version__}, CPU, "
                 f"torch threads = 1. Same procedure and file formats as "
                 f"`shared/fixtures/hf_transfo_xl_tiny/README.md` (read that for the forward-pass semantics and HF "
                 f"quirks); only the differences are listed here.\n")
    lines.append("## What it covers\n")
    lines.append(spec["covers"] + "\n")
    lines.append("## Config\n")
    lines.append("`TransfoXLConfig` arguments (everything else HF default; dropout = dropatt = 0 added):\n")
    lines.append("```\n" + fmt_args(spec["args"]) + "\n```\n")
    lines.append("Resulting values that matter: `" + json.dumps(dict(
        tie_projs=cfg.tie_projs, tie_word_embeddings=cfg.tie_word_embeddings, untie_r=cfg.untie_r,
        same_length=cfg.same_length, clamp_len=cfg.clamp_len, mem_len=cfg.mem_len, pre_lnorm=cfg.pre_lnorm,
        layer_norm_epsilon=cfg.layer_norm_epsilon, adaptive=cfg.adaptive)) + "`.\n")
    lines.append(f"Segment width T = {T}, batch = {BATCH}, segments = {N_SEG}; `config.json` is "
                 f"`model.config.to_dict()` (load with `TransfoXLConfig.from_dict`; it keeps `tie_projs`).\n")
    notes = []
    if M == 0:
        notes.append("mem_len = 0: HF's `init_mems` returns None and `outputs.mems` is None, so every segment is "
                     "run with `mems=None` and sees only itself (klen = T). **No `expected_mems_seg*.npz` files "
                     "exist in this folder.** same_length is False on purpose: same_length=True with mem_len=0 "
                     "blocks every key in HF (uniform rows, future included), a quirk not captured here.")
    else:
        notes.append(f"Segment 0 gets `mems=None`, i.e. {M} all-zero memory vectors per layer that are attended "
                     f"like real memory; klen = {klen_max} in every segment.")
    if cfg.clamp_len > 0 and cfg.clamp_len < klen_max:
        notes.append(f"clamp_len = {cfg.clamp_len} < klen - 1 = {klen_max - 1}: relative distances above "
                     f"{cfg.clamp_len} are clamped to {cfg.clamp_len}.")
    else:
        notes.append(f"clamp_len = {cfg.clamp_len} never clamps (klen = {klen_max}).")
    if cfg.same_length and M > 0:
        mask_len = klen_max - M
        shift = T - mask_len if mask_len > 0 else T
        notes.append(f"same_length: HF mask = triu(ones(T, klen), 1 + mlen) + tril(ones(T, klen), -{shift}); "
                     f"query i sees keys j with i - {shift} < j <= i + {M}, i.e. exactly {M} keys (itself included).")
    if not cfg.untie_r:
        notes.append("untie_r = False: one `transformer.r_w_bias` / `transformer.r_r_bias` [n_head, d_head] shared "
                     "by every layer; the state_dict also lists it under every `layers.l.dec_attn.r_*_bias` name "
                     "(same tensor, saved as copies).")
    if cfg.div_val == 1 and cfg.cutoffs:
        notes.append("div_val = 1 with cutoffs: a single table `emb_layers.0` [vocab, d_embed] and a single "
                     "`crit.out_layers.0` (weight tied to it, one bias [vocab]); the softmax slices rows "
                     "[c_{i-1}, c_i) of that table/bias per cluster. cluster_weight is [n_clusters, d_embed]. "
                     "Head logits use `crit.out_projs.0` (own parameter); tail cluster i uses `crit.out_projs.i`, "
                     "which HF ties to `transformer.word_emb.emb_projs.0` (the only input projection) when "
                     "tie_projs[i] is True.")
    if cfg.div_val == 1 and cfg.d_embed == cfg.d_model:
        notes.append("div_val = 1 and d_embed == d_model: no projection parameters at all (emb_projs empty, "
                     "out_projs = [None]); logits = h @ W^T + b.")
    if not cfg.cutoffs:
        notes.append("cutoffs = []: plain log_softmax over the vocabulary, no cluster_weight/cluster_bias.")
    if not cfg.tie_word_embeddings:
        notes.append("tie_word_embeddings = False: `crit.out_layers.i.weight` are independent parameters with "
                     "their own (different) values; only projections are tied (per tie_projs).")
    lines.append("Notes:\n")
    lines.extend(f"* {n}" for n in notes)
    lines.append("")

    lines.append("## Weights\n")
    lines.append("`torch.manual_seed(0)`, `TransfoXLLMHeadModel(config)` (HF init), then on the same global torch "
                 "RNG every parameter (each tied tensor once, in `named_parameters()` order) was changed as below; "
                 "the script asserts no element is exactly 0 or 1 afterwards.\n")
    lines.append("| parameter | change |\n| --- | --- |")
    lines.extend(f"| `{n}` | {c} |" for n, c in rows)
    lines.append("")
    groups = tied_groups(model)
    if groups:
        lines.append("Tied tensors (one tensor in the model, saved under every name as equal copies):\n")
        lines.extend("* " + " == ".join(f"`{g}`" for g in grp) for grp in groups)
    else:
        lines.append("No tied tensors.")
    lines.append("")
    lines.append("Tensor shapes:\n")
    lines.append("| name | shape |\n| --- | --- |")
    lines.extend(f"| `{k}` | {list(v.shape)} |" for k, v in model.state_dict().items())
    lines.append("")
    lines.append(f"Attention is not uniform: mean normalised entropy of attention rows (over visible keys, "
                 f"all layers/heads/segments) = {ent:.3f} (1 = uniform), mean max probability = {mp:.3f}.\n")

    lines.append("## Inputs\n")
    bounds = cluster_bounds(V, cfg.cutoffs)
    lines.append(f"`inputs.npy` int32 [{BATCH}, {N_SEG * T}] from `numpy.random.default_rng(0).integers(0, {V}, "
                 f"size=({BATCH}, {N_SEG * T}))`, redrawn until every cluster {bounds} occurs in every segment; "
                 f"segment s = columns [s*{T}, (s+1)*{T}). Cast to int64 for the model. Per segment one pass "
                 f"`model(input_ids=seg, mems=mems, output_hidden_states=True)` without labels; segment s+1 gets "
                 f"`outputs.mems` of segment s.\n")

    lines.append("## Files (s = 0..2)\n")
    lines.append("| file | dtype, shape | meaning |\n| --- | --- | --- |")
    if spec.get("save_dtype"):
        lines.append(f"| config.json | | written by `model.to(torch.{spec['save_dtype']}).save_pretrained(folder, "
                     f"safe_serialization=True)` (only the fields that differ from the defaults) |")
        lines.append(f"| model.safetensors | {spec['save_dtype']} | the same save: every tensor rounded to "
                     f"{spec['save_dtype']}, `transformer.pos_emb.inv_freq` included, tied copies left out; the "
                     f"expected outputs are those of `TransfoXLLMHeadModel.from_pretrained(folder)` (float32, "
                     f"so the rounded values upcast, the frequencies too) |")
    else:
        lines.append("| config.json | | `model.config.to_dict()` |")
        lines.append("| model.safetensors | float32 | full `state_dict()` (tied tensors stored once per name) |")
    lines.append(f"| inputs.npy | int32 {list(ids.shape)} | token ids |")
    lines.append(f"| expected_logprobs_seg{{s}}.npy | float32 {list(results[0][0].shape)} | HF `prediction_scores` "
                 f"(log-probabilities) |")
    lines.append(f"| expected_hidden_seg{{s}}.npy | float32 {list(results[0][1].shape)} | final hidden state fed to "
                 f"the softmax (captured at the crit's input; equals `hidden_states[-1]`) |")
    if M > 0:
        lines.append(f"| expected_mems_seg{{s}}.npz | float32 | memory after segment s, keys `layer_0`.."
                     f"`layer_{cfg.n_layer - 1}`, each {list(results[0][2][0].shape)} = [mem_len, batch, d_model], "
                     f"time-major, oldest first; the last mem_len inputs of that layer |")
    else:
        lines.append("| (no expected_mems files) | | mem_len = 0, HF returns mems=None |")
    lines.append("")
    mx = dict(logprobs=max(float(np.abs(r[0]).max()) for r in results),
              hidden=max(float(np.abs(r[1]).max()) for r in results))
    if M > 0:
        mx["mems"] = max(float(np.abs(m).max()) for r in results for m in r[2])
    lines.append("Largest |value|: " + ", ".join(f"{k} {v:.3g}" for k, v in mx.items()) + ".\n")
    lines.append("## Verification\n")
    lines.append("Reloading `config.json` (`TransfoXLConfig.from_dict`) + `model.safetensors` (`load_state_dict`, "
                 "strict) into a fresh HF model and recomputing the 3 segments reproduces every stored array bit "
                 "for bit (checked by the script; the same run repeated in-process is also bit-identical). "
                 "Tolerances for an independent float32 implementation: as in the shared fixture README "
                 "(atol 1e-4 on log-probs, 5e-5 on hidden/mems).\n")
    with open(os.path.join(folder, "README.md"), "w") as fh:
        fh.write("\n".join(lines))


def verify_fixture(name, spec):
    folder = os.path.join(OUT_ROOT, name)
    with open(os.path.join(folder, "config.json")) as fh:
        cfg = TransfoXLConfig.from_dict(json.load(fh))
    for k, v in spec["args"].items():
        if getattr(cfg, k) != v:
            raise AssertionError(f"{name}: config.json {k}={getattr(cfg, k)} != {v}")
    torch.manual_seed(12345)  # different init, everything must come from the file
    if spec.get("save_dtype"):
        model = TransfoXLLMHeadModel.from_pretrained(folder)  # float32, as the reference was run
    else:
        model = TransfoXLLMHeadModel(cfg)
        model.load_state_dict(load_file(os.path.join(folder, "model.safetensors")), strict=True)
    model.eval()
    ids = np.load(os.path.join(folder, "inputs.npy"))
    assert ids.dtype == np.int32 and ids.shape == (BATCH, N_SEG * spec["T"])
    results = run_segments(model, ids, spec["T"])
    for s, (lp, hd, mm) in enumerate(results):
        assert np.array_equal(lp, np.load(os.path.join(folder, f"expected_logprobs_seg{s}.npy"))), (name, s)
        assert np.array_equal(hd, np.load(os.path.join(folder, f"expected_hidden_seg{s}.npy"))), (name, s)
        mpath = os.path.join(folder, f"expected_mems_seg{s}.npz")
        if mm is None:
            assert not os.path.exists(mpath), mpath
        else:
            with np.load(mpath) as z:
                assert sorted(z.files) == [f"layer_{l}" for l in range(len(mm))]
                for l, m in enumerate(mm):
                    assert z[f"layer_{l}"].dtype == np.float32
                    assert np.array_equal(m, z[f"layer_{l}"]), (name, s, l)
    return True


FREQUENCIES = os.path.join(OUT_ROOT, "hf_rounded_inv_freq.npz")
# d_model values: the fixtures', the released models' (410, 512, 1024, 1280), and ones whose float32
# frequencies lie next to a float16/bfloat16 rounding midpoint (a NumPy float64 computation rounded
# them the other way).
FREQUENCY_D_MODELS = (16, 32, 64, 312, 410, 508, 512, 578, 624, 738, 1024, 1280, 2048)


def write_rounded_frequencies():
    """transformers' inv_freq buffer (float32, as TransfoXL computes it) after a float16 / bfloat16
    save, loaded back as float32: keys `float16_{D}` / `bfloat16_{D}`."""
    from transformers.models.deprecated.transfo_xl.modeling_transfo_xl import PositionalEmbedding

    arrays = {}
    for d in FREQUENCY_D_MODELS:
        model = PositionalEmbedding(d)
        for dtype in ("float16", "bfloat16"):
            arrays[f"{dtype}_{d}"] = model.inv_freq.to(getattr(torch, dtype)).float().numpy()
    np.savez(FREQUENCIES, **arrays)
    print(f"wrote {FREQUENCIES} ({os.path.getsize(FREQUENCIES) / 1024:.1f} KiB)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="option sets (default: all)")
    ap.add_argument("--verify", action="store_true", help="only re-check existing folders")
    ap.add_argument("--frequencies", action="store_true",
                    help=f"only write {os.path.relpath(FREQUENCIES, REPO)}")
    a = ap.parse_args()
    if a.frequencies:
        write_rounded_frequencies()
        return
    if transformers.__version__ != "4.37.2":
        print(f"warning: transformers {transformers.__version__}, fixtures were made with 4.37.2", file=sys.stderr)
    torch.set_num_threads(1)
    names = a.names or list(OPTION_SETS)
    for name in names:
        spec = OPTION_SETS[name]
        if not a.verify:
            folder = write_fixture(name, spec)
            size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
            print(f"{name}: wrote {folder} ({size / 1024:.1f} KiB)")
        verify_fixture(name, spec)
        print(f"{name}: reload + recompute bit-identical")


if __name__ == "__main__":
    main()
