"""Presets: the paper's models and small CPU models.

Each preset has a "model" part (a `TransformerXLConfig` dict) and the
paper's "train" / "eval" settings used by `training/` (segment and memory
lengths, batch size, learning rate, steps, evaluation memory, clamp and
same_length). Sources: the paper (arXiv 1901.02860) and the official
scripts, as summarised in `shared/REFERENCE.md` section 1. The official
TF runs use LayerNorm epsilon 1e-12 and the M+1-key same_length mask; the
PyTorch runs (wt103_base, enwik8_base) use 1e-5 and M keys.
"""

WT103_VOCAB = 267735
WT103_CUTOFFS = [20000, 40000, 200000]
LM1B_VOCAB = 793472
LM1B_CUTOFFS = [60000, 100000, 640000]

PRESETS = {
    # 18 layers, 257M parameters, 18.3 ppl (official TF, 64 TPU v3 cores).
    "wt103_large": {
        "model": dict(
            vocabulary_size=WT103_VOCAB, num_layers=18, hidden_dim=1024,
            num_heads=16, head_dim=64, intermediate_dim=4096,
            embedding_dim=1024, cutoffs=WT103_CUTOFFS, div_val=4,
            tie_projections=[False, True, True, True],
            segment_length=384, memory_length=384, untie_relative_bias=True,
            dropout=0.2, attention_dropout=0.2, init_std=0.005,
            projection_init_std=0.005, layer_norm_epsilon=1e-12,
            same_length_convention="official_tf",
        ),
        "train": dict(batch_size=128, learning_rate=2.5e-4, warmup_steps=16000,
                      steps=4000000, min_lr_ratio=0.01, clip_norm=0.25),
        "eval": dict(segment_length=128, memory_length=1600,
                     clamp_length=1000, same_length=True),
        "paper": "WikiText-103 test ppl 18.3",
    },
    # 16 layers, 151M parameters, 24.0 ppl (PyTorch, 4 GPUs).
    "wt103_base": {
        "model": dict(
            vocabulary_size=WT103_VOCAB, num_layers=16, hidden_dim=410,
            num_heads=10, head_dim=41, intermediate_dim=2100,
            cutoffs=WT103_CUTOFFS, div_val=1, segment_length=150,
            memory_length=150, dropout=0.1, attention_dropout=0.0,
            same_length_convention="pytorch",
        ),
        "train": dict(batch_size=60, learning_rate=2.5e-4, warmup_steps=0,
                      steps=200000, min_lr_ratio=0.004, clip_norm=0.25),
        "eval": dict(segment_length=64, memory_length=640, clamp_length=400,
                     same_length=True),
        "paper": "WikiText-103 test ppl 24.0",
    },
    # 24 layers, 277M parameters, 0.99 bpc.
    "enwik8_large": {
        "model": dict(
            vocabulary_size=204, num_layers=24, hidden_dim=1024, num_heads=8,
            head_dim=128, intermediate_dim=3072, segment_length=768,
            memory_length=768, dropout=0.15, attention_dropout=0.15,
            layer_norm_epsilon=1e-12, same_length_convention="official_tf",
        ),
        "train": dict(batch_size=64, learning_rate=2.5e-4, warmup_steps=4000,
                      steps=400000, min_lr_ratio=0.01, clip_norm=0.25),
        "eval": dict(segment_length=128, memory_length=3800,
                     clamp_length=1000, same_length=True),
        "paper": "enwik8 test bpc 0.99",
    },
    # 12 layers, 41M parameters, 1.06 bpc (PyTorch).
    "enwik8_base": {
        "model": dict(
            vocabulary_size=204, num_layers=12, hidden_dim=512, num_heads=8,
            head_dim=64, intermediate_dim=2048, segment_length=512,
            memory_length=512, dropout=0.1, attention_dropout=0.0,
            same_length_convention="pytorch",
        ),
        "train": dict(batch_size=22, learning_rate=2.5e-4, warmup_steps=0,
                      steps=400000, min_lr_ratio=0.004, clip_norm=0.25),
        "eval": dict(segment_length=80, memory_length=2100, clamp_length=820,
                     same_length=True),
        "paper": "enwik8 test bpc 1.06",
    },
    # enwik8_large hyper-parameters on text8 (27 symbols), 1.08 bpc.
    "text8_large": {
        "model": dict(
            vocabulary_size=27, num_layers=24, hidden_dim=1024, num_heads=8,
            head_dim=128, intermediate_dim=3072, segment_length=768,
            memory_length=768, dropout=0.15, attention_dropout=0.15,
            layer_norm_epsilon=1e-12, same_length_convention="official_tf",
        ),
        "train": dict(batch_size=64, learning_rate=2.5e-4, warmup_steps=4000,
                      steps=400000, min_lr_ratio=0.01, clip_norm=0.25),
        "eval": dict(segment_length=128, memory_length=3800,
                     clamp_length=1000, same_length=True),
        "paper": "text8 test bpc 1.08",
    },
    # 24 layers, 0.8B parameters, 21.8 ppl.
    "lm1b_large": {
        "model": dict(
            vocabulary_size=LM1B_VOCAB, num_layers=24, hidden_dim=1280,
            num_heads=16, head_dim=80, intermediate_dim=8192,
            embedding_dim=1280, cutoffs=LM1B_CUTOFFS, div_val=4,
            tie_projections=[False, False, False, False],
            project_same_dim=False, segment_length=32, memory_length=32,
            untie_relative_bias=True, dropout=0.05, attention_dropout=0.05,
            init_std=0.005, projection_init_std=0.005,
            layer_norm_epsilon=1e-12, same_length_convention="official_tf",
        ),
        "train": dict(batch_size=512, learning_rate=1e-4, warmup_steps=30000,
                      steps=1200000, min_lr_ratio=0.01, clip_norm=0.25),
        "eval": dict(segment_length=32, memory_length=128, clamp_length=-1,
                     same_length=True),
        "paper": "One Billion Word test ppl 21.8",
    },
    # The paper's 0.46B base (20 layers, d=1024, d_inner 6144; kimiyoung#69).
    # Head layout and dropout are not published: 16x64 heads and the large
    # model's settings are assumed.
    "lm1b_base": {
        "model": dict(
            vocabulary_size=LM1B_VOCAB, num_layers=20, hidden_dim=1024,
            num_heads=16, head_dim=64, intermediate_dim=6144,
            embedding_dim=1024, cutoffs=LM1B_CUTOFFS, div_val=4,
            tie_projections=[False, False, False, False],
            project_same_dim=False, segment_length=32, memory_length=32,
            untie_relative_bias=True, dropout=0.05, attention_dropout=0.05,
            init_std=0.005, projection_init_std=0.005,
            layer_norm_epsilon=1e-12, same_length_convention="official_tf",
        ),
        "train": dict(batch_size=512, learning_rate=1e-4, warmup_steps=30000,
                      steps=1200000, min_lr_ratio=0.01, clip_norm=0.25),
        "eval": dict(segment_length=32, memory_length=128, clamp_length=-1,
                     same_length=True),
        "paper": "One Billion Word test ppl 23.5",
    },
    # Byte-level model for a CPU: the configuration of the peer benchmark
    # (shared/bench): 6 layers, d 256, 8x32 heads, d_inner 1024, T=M=128.
    "char_small": {
        "model": dict(
            vocabulary_size=256, num_layers=6, hidden_dim=256, num_heads=8,
            head_dim=32, intermediate_dim=1024, segment_length=128,
            memory_length=128, dropout=0.1, attention_dropout=0.0,
        ),
        "train": dict(batch_size=8, learning_rate=2.5e-4, warmup_steps=200,
                      steps=4000, min_lr_ratio=0.004, clip_norm=0.25),
        "eval": dict(segment_length=128, memory_length=512, clamp_length=-1,
                     same_length=True),
        "paper": None,
    },
    # A model that trains in seconds: smoke tests and `make demo`.
    "tiny": {
        "model": dict(
            vocabulary_size=256, num_layers=2, hidden_dim=64, num_heads=4,
            head_dim=16, intermediate_dim=128, segment_length=32,
            memory_length=32, dropout=0.1, attention_dropout=0.0,
        ),
        "train": dict(batch_size=8, learning_rate=1e-3, warmup_steps=20,
                      steps=300, min_lr_ratio=0.01, clip_norm=0.25),
        "eval": dict(segment_length=32, memory_length=96, clamp_length=-1,
                     same_length=True),
        "paper": None,
    },
}

# The paper's evaluation protocol for the released official TF models, as
# run by kimiyoung/transformer-xl `tf/sota/{wt103,enwik8,text8,lm1b}.sh`
# (TEST_TGT_LEN / TEST_MEM_LEN / TEST_CLAMP_LEN, --same_length=True,
# dropout and dropatt 0). The official `_create_mask` lets each query see
# M + 1 keys with same_length ("official_tf").
EVAL_PROTOCOLS = {
    "wt103": dict(segment_length=128, memory_length=1600, clamp_length=1000,
                  same_length=True),
    "enwik8": dict(segment_length=128, memory_length=3800, clamp_length=1000,
                   same_length=True),
    "text8": dict(segment_length=128, memory_length=3800, clamp_length=1000,
                  same_length=True),
    "lm1b": dict(segment_length=32, memory_length=128, clamp_length=-1,
                 same_length=True),
}
# The paper presets whose evaluation is one of the protocols above.
PROTOCOL_OF_PRESET = {
    "wt103_large": "wt103",
    "enwik8_large": "enwik8",
    "text8_large": "text8",
    "lm1b_large": "lm1b",
}


def eval_protocol(name):
    """The settings of a paper protocol (a copy), with the mask convention.

    Args:
        name: str. A key of `EVAL_PROTOCOLS` ("wt103", "enwik8", "text8",
            "lm1b") or a paper preset of `PROTOCOL_OF_PRESET`.

    Returns:
        dict of `TransformerXLConfig` fields: segment_length,
        memory_length, clamp_length, same_length and
        same_length_convention="official_tf".
    """
    key = PROTOCOL_OF_PRESET.get(name, name)
    if key not in EVAL_PROTOCOLS:
        raise ValueError(
            f"Unknown evaluation protocol {name!r}. Available: "
            f"{sorted(EVAL_PROTOCOLS) + sorted(PROTOCOL_OF_PRESET)}."
        )
    return {**EVAL_PROTOCOLS[key], "same_length_convention": "official_tf"}


def apply_eval_protocol(config, name):
    """`config` with the paper's evaluation settings of `name`.

    Only settings that do not change weight shapes are replaced, so the
    result evaluates the same weights (`model.with_settings(**...)` or a
    model built from it).

    Example:
    ```python
    config = apply_eval_protocol(model.txl_config, "wt103")
    ```
    """
    return config.replace(**eval_protocol(name))
