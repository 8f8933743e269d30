"""Import Hugging Face TransfoXL checkpoints (`config.json` + `model.safetensors`).

Only JSON and safetensors are read: nothing is unpickled. PyTorch `Linear`
weights are (out, in) and are transposed into Keras layouts; projections
`[d_model, width]` become our (width, d_model) matrices.
"""

import logging
import math
import os

import numpy as np

from keras_txl.config import TransformerXLConfig
from keras_txl.limits import check_config
from keras_txl.safe_files import read_json
from keras_txl.weights_file import read_safetensors_header

logger = logging.getLogger(__name__)


def config_from_hf(hf: dict) -> TransformerXLConfig:
    """Maps a Hugging Face `TransfoXLConfig` dict to a `TransformerXLConfig`."""
    try:
        return _config_from_hf(hf)
    except (TypeError, OverflowError, AttributeError) as e:
        # A value of the wrong JSON type (a list for n_layer, 1e999, ...).
        raise ValueError(
            f"config.json has a value of the wrong type for a TransfoXL "
            f"config: {e}"
        ) from None


def _config_from_hf(hf: dict) -> TransformerXLConfig:
    attn_type = hf.get("attn_type", 0)
    if attn_type != 0:
        raise ValueError(
            f"Only attn_type=0 (Transformer-XL relative attention) can be "
            f"loaded, the checkpoint has attn_type={attn_type}."
        )
    required = ["vocab_size", "d_model", "n_head", "d_head", "d_inner",
                "n_layer"]
    missing = [k for k in required if k not in hf]
    if missing:
        raise ValueError(
            f"config.json is missing {missing}: not a TransfoXL config."
        )
    cutoffs = list(hf.get("cutoffs", []))
    tie_projs = hf.get("tie_projs")
    if tie_projs is not None:
        tie_projs = [bool(t) for t in tie_projs]
        # HF keeps one flag per cluster (head first); be lenient about a
        # shorter list (missing flags mean "not tied").
        tie_projs = (tie_projs + [False] * (len(cutoffs) + 1))[: len(cutoffs) + 1]
    return TransformerXLConfig(
        vocabulary_size=int(hf["vocab_size"]),
        num_layers=int(hf["n_layer"]),
        hidden_dim=int(hf["d_model"]),
        num_heads=int(hf["n_head"]),
        head_dim=int(hf["d_head"]),
        intermediate_dim=int(hf["d_inner"]),
        embedding_dim=int(hf.get("d_embed", hf["d_model"])),
        cutoffs=tuple(cutoffs),
        div_val=int(hf.get("div_val", 1)),
        tie_projections=tuple(tie_projs) if tie_projs is not None else None,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        project_same_dim=True,
        segment_length=int(hf.get("tgt_len", 128) or 128),
        memory_length=int(hf.get("mem_len", 0) or 0),
        clamp_length=int(hf.get("clamp_len", -1)),
        same_length=bool(hf.get("same_length", False)),
        same_length_convention="pytorch",
        pre_layer_norm=bool(hf.get("pre_lnorm", False)),
        untie_relative_bias=bool(hf.get("untie_r", True)),
        attention_type="relative",
        dropout=float(hf.get("dropout", 0.1)),
        attention_dropout=float(hf.get("dropatt", 0.0)),
        layer_norm_epsilon=float(hf.get("layer_norm_epsilon", 1e-5)),
        init_std=float(hf.get("init_std", 0.02)),
        projection_init_std=float(hf.get("proj_init_std", 0.01)),
    )


class _StateDict:
    """Checked access to the tensors; remembers what was used."""

    def __init__(self, tensors, path):
        self.tensors = tensors
        self.path = path
        self.used = set()

    def has(self, name):
        return name in self.tensors

    def get(self, name, shape):
        if name not in self.tensors:
            raise ValueError(f"{self.path}: missing tensor {name!r}.")
        # A lazy file knows the shape from its header: check before reading.
        shape_of = getattr(self.tensors, "shape_of", None)
        found = shape_of(name) if shape_of else tuple(self.tensors[name].shape)
        if tuple(found) != tuple(shape):
            raise ValueError(
                f"{self.path}: tensor {name!r} has shape {tuple(found)}, "
                f"expected {tuple(shape)} from config.json."
            )
        self.used.add(name)
        return np.asarray(self.tensors[name], dtype=np.float32)


class _LazyTensors:
    """A safetensors file read one tensor at a time, on demand.

    The loader reads only the tensors the config needs, so an unexpected
    tensor is reported without ever being read.
    """

    def __init__(self, path, header):
        from safetensors import safe_open

        self.header = header
        self.path = path
        try:
            self._file = safe_open(path, framework="numpy")
        except Exception as e:  # safetensors raises its own error types
            raise ValueError(
                f"Could not read {path!r} as safetensors (truncated or "
                f"corrupted file?): {e}"
            ) from None

    def __contains__(self, name):
        return name in self.header

    def __iter__(self):
        return iter(self.header)

    def __len__(self):
        return len(self.header)

    def shape_of(self, name):
        return self.header[name][0]

    def __getitem__(self, name):
        try:
            return self._file.get_tensor(name)
        except Exception as e:  # safetensors raises its own error types
            raise ValueError(
                f"Could not read tensor {name!r} of {self.path!r} (truncated "
                f"or corrupted file?): {e}"
            ) from None


def _assign(variable, value, name):
    if tuple(variable.shape) != tuple(value.shape):
        raise ValueError(
            f"{name}: cannot assign shape {tuple(value.shape)} to variable "
            f"{variable.path} of shape {tuple(variable.shape)}."
        )
    variable.assign(value)


def load_hf_weights(model, tensors, path="model.safetensors"):
    """Copies a HF TransfoXL state dict (numpy arrays) into `model`."""
    cfg = model.txl_config
    sd = _StateDict(tensors, path)
    D, N, H = cfg.hidden_dim, cfg.num_heads, cfg.resolved_head_dim
    backbone = model.backbone
    embedding = backbone.token_embedding

    # Adaptive input.
    for i, table in enumerate(embedding.tables):
        name = f"transformer.word_emb.emb_layers.{i}.weight"
        _assign(table, sd.get(name, table.shape), name)
    for i, projection in enumerate(embedding.projections):
        if projection is None:
            continue
        name = f"transformer.word_emb.emb_projs.{i}"
        value = sd.get(name, (D, projection.shape[0])).T
        _assign(projection, value, name)

    # Relative biases u (r_w_bias) and v (r_r_bias).
    if cfg.untie_relative_bias:
        for bias, hf_name in ((backbone.content_bias, "r_w_bias"),
                              (backbone.position_bias, "r_r_bias")):
            value = np.stack([
                sd.get(f"transformer.layers.{l}.dec_attn.{hf_name}", (N, H))
                for l in range(cfg.num_layers)
            ])
            _assign(bias, value, hf_name)
    else:
        for bias, hf_name in ((backbone.content_bias, "r_w_bias"),
                              (backbone.position_bias, "r_r_bias")):
            name = f"transformer.{hf_name}"
            shared = sd.get(name, (N, H))
            _assign(bias, shared, name)
            # HF also lists the shared bias under every layer's name.
            for l in range(cfg.num_layers):
                copy = f"transformer.layers.{l}.dec_attn.{hf_name}"
                if sd.has(copy) and not np.array_equal(sd.get(copy, (N, H)), shared):
                    raise ValueError(
                        f"{path}: {copy} differs from {name} but config.json "
                        "says untie_r=false (shared biases)."
                    )

    # Decoder blocks.
    for l, block in enumerate(backbone.blocks):
        p = f"transformer.layers.{l}."
        attention = block.attention
        qkv = sd.get(p + "dec_attn.qkv_net.weight", (3 * N * H, D))
        _assign(attention.qkv_kernel, qkv.T.reshape(D, 3, N, H), "qkv_net")
        r = sd.get(p + "dec_attn.r_net.weight", (N * H, D))
        _assign(attention.position_kernel, r.T.reshape(D, N, H), "r_net")
        o = sd.get(p + "dec_attn.o_net.weight", (D, N * H))
        _assign(attention.output_kernel, o.T.reshape(N, H, D), "o_net")
        _assign(block.attention_norm.gamma,
                sd.get(p + "dec_attn.layer_norm.weight", (D,)), "ln")
        _assign(block.attention_norm.beta,
                sd.get(p + "dec_attn.layer_norm.bias", (D,)), "ln")
        inner = cfg.intermediate_dim
        _assign(block.intermediate_dense.kernel,
                sd.get(p + "pos_ff.CoreNet.0.weight", (inner, D)).T, "ff0")
        _assign(block.intermediate_dense.bias,
                sd.get(p + "pos_ff.CoreNet.0.bias", (inner,)), "ff0")
        _assign(block.output_dense.kernel,
                sd.get(p + "pos_ff.CoreNet.3.weight", (D, inner)).T, "ff3")
        _assign(block.output_dense.bias,
                sd.get(p + "pos_ff.CoreNet.3.bias", (D,)), "ff3")
        _assign(block.feedforward_norm.gamma,
                sd.get(p + "pos_ff.layer_norm.weight", (D,)), "ln")
        _assign(block.feedforward_norm.beta,
                sd.get(p + "pos_ff.layer_norm.bias", (D,)), "ln")

    # Adaptive softmax.
    softmax = model.softmax
    bounds = cfg.cluster_bounds
    if cfg.div_val == 1:
        # One Linear over the whole vocabulary.
        bias = sd.get("crit.out_layers.0.bias", (cfg.vocabulary_size,))
        out_tables = [("crit.out_layers.0.weight",
                       (cfg.vocabulary_size, cfg.cluster_embedding_dim(0)))]
    else:
        bias = np.concatenate([
            sd.get(f"crit.out_layers.{i}.bias", (end - start,))
            for i, (start, end) in enumerate(bounds)
        ])
        out_tables = [
            (f"crit.out_layers.{i}.weight",
             (end - start, cfg.cluster_embedding_dim(i)))
            for i, (start, end) in enumerate(bounds)
        ]
    _assign(softmax.bias, bias, "crit.out_layers.*.bias")
    if cfg.num_clusters:
        _assign(softmax.cluster_kernel, sd.get(
            "crit.cluster_weight",
            (cfg.num_clusters, cfg.cluster_embedding_dim(0))), "cluster_weight")
        _assign(softmax.cluster_bias,
                sd.get("crit.cluster_bias", (cfg.num_clusters,)),
                "cluster_bias")
    for i, projection in enumerate(softmax.own_projections):
        if projection is None:
            continue
        name = f"crit.out_projs.{i}"
        _assign(projection, sd.get(name, (D, projection.shape[0])).T, name)
    if cfg.tie_embeddings:
        # Tied copies are stored under both names; make sure they agree.
        for i, (name, shape) in enumerate(out_tables):
            if sd.has(name):
                value = sd.get(name, shape)
                if not np.allclose(value, embedding.tables[i].numpy()):
                    raise ValueError(
                        f"{path}: {name} differs from the embedding table "
                        "but config.json says tie_word_embeddings=true."
                    )
    else:
        for (name, shape), table in zip(out_tables, softmax.own_tables):
            _assign(table, sd.get(name, shape), name)
    # Tied softmax projections may be stored too: mark them as understood.
    for i in range(cfg.num_clusters + 1):
        sd.used.add(f"crit.out_projs.{i}")
    sd.used.add("transformer.pos_emb.inv_freq")
    unused = sorted(set(tensors) - sd.used)
    if unused:
        raise ValueError(
            f"{path}: tensors not understood by the loader: {unused[:10]}"
            f"{' ...' if len(unused) > 10 else ''}. Is config.json the one "
            "that belongs to these weights?"
        )


def load_hf_checkpoint(directory, stateful=False, batch_size=None, limits=None,
                       **changes):
    """Builds a `TransformerXLCausalLM` from a Hugging Face TransfoXL folder.

    Args:
        directory: str. Folder with `config.json` and `model.safetensors`.
        stateful: bool. Build the stateful variant.
        batch_size: int. Needed when stateful.
        limits: None, a dict or a `keras_txl.limits.Limits`: bounds on what
            the folder may ask for (see docs/reliability.md).
        **changes: config overrides (e.g. `memory_length=1600` for a longer
            evaluation memory, `dropout=0.0`).

    Returns:
        A `TransformerXLCausalLM` with the checkpoint's weights.

    Raises:
        ValueError: a missing/invalid `config.json`, a truncated or
            corrupted `model.safetensors`, weights that do not match the
            config, or a config beyond `limits`.
    """
    from keras_txl.causal_lm import TransformerXLCausalLM

    config_path = os.path.join(directory, "config.json")
    if not os.path.lexists(config_path):
        raise ValueError(f"No config.json in {directory!r}.")
    hf = read_json(config_path, limits)
    if not isinstance(hf, dict):
        raise ValueError(
            f"{config_path} must be a JSON object, received "
            f"{type(hf).__name__}: not a TransfoXL config."
        )
    config = config_from_hf(hf)
    check_config(config, limits, source=config_path)
    if changes:
        config = config.replace(**changes)
        check_config(config, limits, source="the overrides")
    weights_path = os.path.join(directory, "model.safetensors")
    header = read_safetensors_header(weights_path, limits)
    # Before building: HF files hold the parameters plus copies of tied
    # tables, projections and shared biases, so never more than twice the
    # parameters (plus per-layer bias copies and inv_freq).
    values = sum(math.prod(shape) for shape, _ in header.values())
    allowed = (2 * config.num_parameters() + config.hidden_dim
               + 2 * config.num_layers * config.num_heads
               * config.resolved_head_dim)
    if values > allowed:
        raise ValueError(
            f"{weights_path}: the tensors hold {values} values, more than "
            f"the {allowed} a TransfoXL model of this config.json stores: "
            "weights of another config?"
        )
    tensors = _LazyTensors(weights_path, header)
    model = TransformerXLCausalLM(
        config, stateful=stateful, batch_size=batch_size
    )
    load_hf_weights(model, tensors, weights_path)
    logger.info("Loaded %s (%d tensors).", directory, len(tensors))
    return model
