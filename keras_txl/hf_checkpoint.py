"""Import Hugging Face TransfoXL checkpoints (`config.json` + `model.safetensors`,
or the shards listed by a `model.safetensors.index.json`).

Only JSON and safetensors are read: nothing is unpickled. PyTorch `Linear`
weights are (out, in) and are transposed into Keras layouts; projections
`[d_model, width]` become our (width, d_model) matrices.

Nothing is coerced: each `config.json` field must have its JSON type
(`"pre_lnorm": "false"` or `"n_layer": 3.0` is an error naming the file and
the field), and each tensor read must be float16/bfloat16/float32/float64
and finite (`keras_txl.checks.loaded_weight`) before it is cast to float32.
"""

import logging
import math
import os
import re

import numpy as np

from keras_txl.checks import finite_number
from keras_txl.checks import loaded_weight
from keras_txl.checks import non_negative_int
from keras_txl.checks import positive_int
from keras_txl.config import TransformerXLConfig
from keras_txl.limits import check_config
from keras_txl.safe_files import read_json
from keras_txl.weights_file import read_safetensors_header

logger = logging.getLogger(__name__)


def config_from_hf(hf: dict, source="config.json") -> TransformerXLConfig:
    """Maps a Hugging Face `TransfoXLConfig` dict to a `TransformerXLConfig`.

    Every field used is type-checked, nothing is coerced: booleans must be
    JSON booleans (`"false"` is not false), integers JSON integers (not
    `32.0`, `"3"` or `true`), floats JSON numbers, `cutoffs` a list of
    integers and `tie_projs` a list of booleans. `source` (the file) is
    named in every error, with the field and the value received.

    Raises:
        ValueError: a field of the wrong type or value, a missing field, an
            attn_type other than 0, sample_softmax > 0 or ext_len > 0.
    """
    try:
        config = _config_from_hf(hf, source)
    except (TypeError, OverflowError, AttributeError) as e:
        # A safety net: `_config_from_hf` checks each field it reads.
        raise ValueError(
            f"{source} has a value of the wrong type for a TransfoXL "
            f"config: {e}"
        ) from None
    return config


def _field_error(source, key, value, expected):
    """The ValueError for HF field `key` of `source` that is not `expected`."""
    return ValueError(
        f"{source}: `{key}` has the wrong type or value for a TransfoXL "
        f"config: expected {expected}, received {key}={value!r} "
        f"({_json_type(value)})."
    )


def _json_type(value):
    """The JSON name of a parsed value's type, for messages."""
    names = {bool: "boolean", int: "integer", float: "float", str: "string",
             list: "list", dict: "object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _hf_int(hf, key, default, source, minimum=None, none_is_default=False):
    """Integer field `key` (a JSON integer, not a float, string or bool),
    >= `minimum` (0 or 1) when given."""
    value = hf.get(key, default)
    if value is None and none_is_default:
        return default
    check = {1: positive_int, 0: non_negative_int}.get(minimum, _any_int)
    try:
        return check(key, value)
    except ValueError:
        expected = "an integer" + (f" >= {minimum}" if minimum is not None else "")
        raise _field_error(source, key, value, expected) from None


def _any_int(name, value):
    """`value` if it is an integer (of any sign; not `bool`)."""
    if not _is_int(value):
        raise ValueError(f"`{name}` must be an integer.")
    return value


def _hf_bool(hf, key, default, source):
    """Boolean field `key`: a JSON `true`/`false` only."""
    value = hf.get(key, default)
    if not isinstance(value, bool):
        raise _field_error(source, key, value, "a JSON boolean (true/false)")
    return value


def _hf_float(hf, key, default, source):
    """Number field `key`: a finite JSON number (not a string or bool)."""
    value = hf.get(key, default)
    try:
        return finite_number(key, value)
    except ValueError:
        raise _field_error(source, key, value, "a finite number") from None


def _hf_list(hf, key, default, source, check, expected):
    """List field `key` whose elements all pass `check`."""
    value = hf.get(key, default)
    if not isinstance(value, list) or not all(check(v) for v in value):
        raise _field_error(source, key, value, expected)
    return list(value)


def _is_int(value):
    """Whether `value` is a JSON integer (a Python `int`, not `bool`)."""
    return isinstance(value, int) and not isinstance(value, bool)


# transformers' `TransfoXLConfig.attribute_map`: these names mean the same fields.
HF_ALIASES = {"n_token": "vocab_size", "hidden_size": "d_model",
              "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"}
# transformers' `TransfoXLConfig` defaults of the fields that change the
# numbers but no tensor's shape: a config.json without them means these in
# transformers, so here too (a hand-written config; transformers writes
# every field). The fields that shape the tensors are checked against the
# weights file instead.
HF_DEFAULTS = {"mem_len": 1600, "clamp_len": 1000, "same_length": True,
               "proj_share_all_but_first": True}


def _with_aliases(hf, source):
    """`hf` with transformers' alias names mapped to the fields they stand
    for; an alias and its field with other values is an error."""
    hf = dict(hf)
    for alias, key in HF_ALIASES.items():
        if alias not in hf:
            continue
        value = hf.pop(alias)
        if key in hf and hf[key] != value:
            raise ValueError(
                f"{source}: `{alias}` (transformers' other name for `{key}`) is "
                f"{value!r} but `{key}` is {hf[key]!r}: which one holds?"
            )
        hf[key] = value
    return hf


def _config_from_hf(hf, source):
    """`config_from_hf` without the safety net for unexpected types."""
    hf = _with_aliases(hf, source)
    # Another architecture's config.json can hold the same field names
    # (n_layer, d_model, n_head, ...) and even tensors of fitting shapes.
    model_type = hf.get("model_type", "transfo-xl")
    if model_type not in ("transfo-xl", "transfo_xl"):
        raise ValueError(
            f"{source}: model_type={model_type!r} is not a TransfoXL checkpoint: "
            "only model_type 'transfo-xl' (or no model_type) can be loaded."
        )
    attn_type = hf.get("attn_type", 0)
    if not _is_int(attn_type) or attn_type != 0:
        raise ValueError(
            f"{source}: only attn_type=0 (Transformer-XL relative attention) "
            f"can be loaded, the checkpoint has attn_type={attn_type!r}."
        )
    # Options of transformers (or of its older TransfoXLConfig) that change
    # the outputs and have no keras-txl equivalent: only their off values load.
    sample_softmax = _hf_int(hf, "sample_softmax", -1, source)
    if sample_softmax > 0:
        raise ValueError(
            f"{source}: sample_softmax={sample_softmax} is a sampled-softmax "
            "model, which keras-txl (like transformers' TransfoXLLMHeadModel) "
            "does not load: only sample_softmax <= 0 (the full adaptive "
            "softmax) can be loaded."
        )
    ext_len = _hf_int(hf, "ext_len", 0, source, minimum=0)
    if ext_len:
        raise ValueError(
            f"{source}: ext_len={ext_len} keeps the last {ext_len} positions "
            "of each segment out of the memory (older transformers); "
            "keras-txl loads ext_len=0 (or absent) only."
        )
    required = ["vocab_size", "d_model", "n_head", "d_head", "d_inner",
                "n_layer"]
    missing = [k for k in required if k not in hf]
    if missing:
        raise ValueError(
            f"{source} is missing {missing}: not a TransfoXL config."
        )
    cutoffs = _hf_list(hf, "cutoffs", [], source, _is_int,
                       "a list of integers")
    tie_projs = hf.get("tie_projs")
    if tie_projs is not None:
        tie_projs = _hf_list(hf, "tie_projs", None, source,
                             lambda t: isinstance(t, bool),
                             "null or a list of booleans (one per cluster)")
        # HF keeps one flag per cluster (head first). A shorter list is
        # read as transformers reads it (missing flags: not tied); a longer
        # one flags clusters that `cutoffs` does not have (transformers fails
        # on a true one): the two fields do not belong together.
        if len(tie_projs) > len(cutoffs) + 1:
            raise ValueError(
                f"{source}: `tie_projs` has {len(tie_projs)} flags "
                f"{tie_projs}, but `cutoffs`={cutoffs} make "
                f"{len(cutoffs) + 1} clusters (one flag each, head first): "
                "the two fields do not belong together."
            )
        tie_projs = tie_projs + [False] * (len(cutoffs) + 1 - len(tie_projs))
    else:
        # transformers derives tie_projs from this constructor argument (a
        # config.json it wrote holds tie_projs, which then wins).
        share = _hf_bool(hf, "proj_share_all_but_first",
                         HF_DEFAULTS["proj_share_all_but_first"], source)
        tie_projs = [False] + [share] * len(cutoffs)
    d_model = _hf_int(hf, "d_model", None, source, minimum=1)
    fields = dict(
        vocabulary_size=_hf_int(hf, "vocab_size", None, source, minimum=1),
        num_layers=_hf_int(hf, "n_layer", None, source, minimum=1),
        hidden_dim=d_model,
        num_heads=_hf_int(hf, "n_head", None, source, minimum=1),
        head_dim=_hf_int(hf, "d_head", None, source, minimum=1),
        intermediate_dim=_hf_int(hf, "d_inner", None, source, minimum=1),
        embedding_dim=_hf_int(hf, "d_embed", d_model, source, minimum=1),
        cutoffs=tuple(cutoffs),
        div_val=_hf_int(hf, "div_val", 1, source, minimum=1),
        tie_projections=tuple(tie_projs),
        tie_embeddings=_tie_word_embeddings(hf, source),
        project_same_dim=True,
        # null (and, as before, 0) for tgt_len means the default.
        segment_length=_hf_int(hf, "tgt_len", 128, source, minimum=0,
                               none_is_default=True) or 128,
        memory_length=_hf_int(hf, "mem_len", HF_DEFAULTS["mem_len"], source,
                              minimum=0, none_is_default=True),
        clamp_length=_hf_int(hf, "clamp_len", HF_DEFAULTS["clamp_len"], source),
        same_length=_hf_bool(hf, "same_length", HF_DEFAULTS["same_length"], source),
        same_length_convention="pytorch",
        pre_layer_norm=_hf_bool(hf, "pre_lnorm", False, source),
        untie_relative_bias=_hf_bool(hf, "untie_r", True, source),
        attention_type="relative",
        dropout=_hf_float(hf, "dropout", 0.1, source),
        attention_dropout=_hf_float(hf, "dropatt", 0.0, source),
        layer_norm_epsilon=_hf_float(hf, "layer_norm_epsilon", 1e-5, source),
        init_std=_hf_float(hf, "init_std", 0.02, source),
        projection_init_std=_hf_float(hf, "proj_init_std", 0.01, source),
    )
    try:
        return TransformerXLConfig(**fields)
    except ValueError as e:  # a range the config checks (dropout < 1, ...)
        # The message names keras-txl's field; say which config.json key it
        # was read from.
        named = [f"`{field}` is {source}'s `{key}`" for field, key in _HF_KEYS.items()
                 if f"`{field}`" in str(e)]
        raise ValueError(f"{source}: {e}" + (f" ({'; '.join(named)}.)" if named else "")) from None


def _tie_word_embeddings(hf, source):
    """`tie_word_embeddings`, or where it is absent the field of older
    transformers (2.x, 3.x: the hub's own TransfoXL config.json) that meant
    the same, `tie_weight`: an old `"tie_weight": false` model keeps its own
    output tables."""
    if "tie_word_embeddings" in hf or "tie_weight" not in hf:
        return _hf_bool(hf, "tie_word_embeddings", True, source)
    return _hf_bool(hf, "tie_weight", True, source)


# keras-txl's config fields read from config.json keys of another name.
_HF_KEYS = {"vocabulary_size": "vocab_size", "num_layers": "n_layer", "hidden_dim": "d_model",
            "num_heads": "n_head", "head_dim": "d_head", "intermediate_dim": "d_inner",
            "embedding_dim": "d_embed", "tie_projections": "tie_projs",
            "tie_embeddings": "tie_word_embeddings", "segment_length": "tgt_len",
            "memory_length": "mem_len", "clamp_length": "clamp_len", "pre_layer_norm": "pre_lnorm",
            "untie_relative_bias": "untie_r", "attention_dropout": "dropatt",
            "projection_init_std": "proj_init_std"}


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
            if math.prod(shape) == 0:
                # A 0-size tensor (a 0-wide cluster's table or projection):
                # transformers' save_pretrained leaves some out; nothing lost.
                return np.zeros(shape, np.float32)
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
        # Dtype and finiteness before the cast: an int or bool tensor would
        # cast silently, a NaN would spread through every output.
        value = loaded_weight(name, self.tensors[name], self.path)
        return np.asarray(value, dtype=np.float32)


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


class _ShardedTensors(_LazyTensors):
    """The shards of a sharded checkpoint as one `_LazyTensors`: each tensor
    read from its own file, on demand."""

    def __init__(self, shards, header):
        self.header = header
        self.files = {path: _LazyTensors(path, part) for path, part in shards.items()}
        self.where = {name: path for path, part in shards.items() for name in part}

    def __getitem__(self, name):
        return self.files[self.where[name]][name]


SHARD_INDEX = "model.safetensors.index.json"


def read_shard_index(directory, limits=None):
    """The tensors of a sharded safetensors checkpoint, headers only.

    transformers writes `model.safetensors.index.json`,
    `{"metadata": {...}, "weight_map": {tensor name: shard file name}}`,
    beside the shards (`model-00001-of-00002.safetensors`, ...). Every shard
    named must be in the folder and hold exactly the tensors the map puts
    in it: a shard missing, one of another save, or a tensor in two files is
    an error naming the index, the shard and the tensor.

    Returns:
        (header, shards): `{name: (shape, dtype)}` of all the tensors and
        `{shard path: {name: (shape, dtype)}}` per file.
    """
    from keras_txl.safe_files import resolve_inside

    index_path = os.path.join(directory, SHARD_INDEX)
    index = read_json(index_path, limits)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if (not isinstance(weight_map, dict) or not weight_map
            or not all(isinstance(f, str) for f in weight_map.values())):
        raise ValueError(
            f"{index_path} must hold a JSON object whose `weight_map` maps each "
            "tensor name to its shard's file name (transformers' sharded save), "
            f"received weight_map={weight_map!r:.200}."
        )
    shards, header = {}, {}
    for file_name in sorted(set(weight_map.values())):
        path = resolve_inside(directory, file_name, f"shard file named in {index_path}")
        if not os.path.lexists(path):
            count = sum(f == file_name for f in weight_map.values())
            raise ValueError(
                f"{index_path} puts {count} tensors in {file_name!r}, which is not "
                f"in {directory!r}: a shard was not downloaded or copied."
            )
        part = read_safetensors_header(path, limits)
        for name in part:
            if weight_map.get(name) != file_name:
                where = weight_map.get(name)
                raise ValueError(
                    f"{path} holds tensor {name!r}, which {index_path} "
                    + (f"puts in {where!r}" if where else "does not list")
                    + ": the shards and the index are of different saves."
                )
        shards[path] = part
        header.update(part)
    missing = [name for name in weight_map if name not in header]
    if missing:
        raise ValueError(
            f"{index_path} puts tensor {missing[0]!r} in "
            f"{weight_map[missing[0]]!r}, which does not hold it"
            f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}: "
            "the shards and the index are of different saves."
        )
    return header, shards


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
                        "but config.json ties them (tie_word_embeddings, or "
                        "older transformers' tie_weight, true or absent)."
                    )
    else:
        for (name, shape), table in zip(out_tables, softmax.own_tables):
            _assign(table, sd.get(name, shape), name)
    # Tied softmax projections may be stored too: they must be the embedding
    # projection they are tied to (transformers' `tie_weights`: the only one
    # with div_val 1, the cluster's own otherwise), as tied tables must.
    ties = cfg.resolved_tie_projections
    for i in range(cfg.num_clusters + 1):
        name = f"crit.out_projs.{i}"
        j = 0 if cfg.div_val == 1 else i
        tied_to = embedding.projections[j] if ties[i] else None
        if (tied_to is not None and softmax.own_projections[i] is None
                and sd.has(name)):
            value = sd.get(name, (D, tied_to.shape[0])).T
            if not np.allclose(value, tied_to.numpy()):
                raise ValueError(
                    f"{path}: {name} differs from the embedding projection "
                    f"transformer.word_emb.emb_projs.{j} it is tied to "
                    f"(config.json: tie_projs[{i}] is true, or "
                    "proj_share_all_but_first): is config.json the one that "
                    "belongs to these weights?"
                )
        sd.used.add(name)
    found = stored_frequency_dtype(sd, D, path)
    if found is not None and found != cfg.position_frequency_dtype:
        raise ValueError(
            f"{path}: {_INV_FREQ} holds the frequencies of position_frequency_dtype="
            f"{found!r}, with which transformers computes the sinusoids; the model has "
            f"position_frequency_dtype={cfg.position_frequency_dtype!r}: build it with "
            f"{found!r} (load_hf_checkpoint does)."
        )
    unused = sorted(set(tensors) - sd.used)
    if unused:
        raise ValueError(
            f"{path}: tensors not understood by the loader: {unused[:10]}"
            f"{' ...' if len(unused) > 10 else ''}. Is config.json the one "
            "that belongs to these weights?"
        )


# transformers' `TransfoXLConfig` defaults of the fields that shape tensors
# (its defaults are the WT103 large model's).
HF_SHAPE_DEFAULTS = {"div_val": 4, "d_embed": 1024, "cutoffs": [20000, 40000, 200000]}
_EMB = "transformer.word_emb.emb_layers.{}.weight"


def _fill_shape_fields(hf, header, source):
    """`hf` with `d_embed`, `div_val` and `cutoffs` read from the tensors'
    shapes where config.json leaves them out (a hand-written config.json;
    transformers writes every field). transformers would read its defaults
    (`HF_SHAPE_DEFAULTS`), which load only the weights that have them; the
    shapes give the same values for those, and the right ones for the rest.
    A field the shapes do not fix gets transformers' default.

    Raises:
        ValueError: `cutoffs` absent, not shown by the weights (div_val 1:
            one table) and transformers' default does not fit.
    """
    absent = [key for key in HF_SHAPE_DEFAULTS if key not in hf]
    widths, sizes = [], []
    while _EMB.format(len(widths)) in header:
        shape = header[_EMB.format(len(widths))][0]
        if len(shape) != 2:
            return hf  # named by the loader's shape check
        sizes.append(shape[0])
        widths.append(shape[1])
    if not absent or not widths:
        return hf
    hf = dict(hf)
    found = {}
    d_model = hf.get("d_model", hf.get("hidden_size"))
    if "d_embed" in absent:
        found["d_embed"] = widths[0]
    if "div_val" in absent:
        if len(widths) > 1:
            fits = [d for d in range(2, widths[0] + 2)
                    if all(widths[0] // d**i == w for i, w in enumerate(widths))]
            # transformers' default where it fits (a 0-wide cluster fits many).
            found["div_val"] = 4 if 4 in fits else (fits[0] if fits else 1)
        elif (not hf.get("cutoffs") and "crit.cluster_weight" not in header
              and "transformer.word_emb.emb_projs.0" in header and widths[0] == d_model):
            # One cluster: only div_val > 1 projects a table as wide as d_model.
            found["div_val"] = HF_SHAPE_DEFAULTS["div_val"]
        else:
            found["div_val"] = 1
    if "cutoffs" in absent:
        clusters = header.get("crit.cluster_weight", ((0,),))[0][0]
        vocab = hf.get("vocab_size", hf.get("n_token"))
        if len(widths) > 1:
            found["cutoffs"] = [int(c) for c in np.cumsum(sizes[:-1])]
        elif not clusters:
            found["cutoffs"] = []
        else:
            default = HF_SHAPE_DEFAULTS["cutoffs"]
            if len(default) != clusters or not isinstance(vocab, int) or vocab <= default[-1]:
                raise ValueError(
                    f"{source} has no `cutoffs`, and the weights (div_val 1: one table) do not "
                    f"show them; transformers' default {default} does not fit vocab_size={vocab} "
                    f"and the {clusters} tail clusters of crit.cluster_weight: add `cutoffs` (the "
                    "inner cluster bounds, e.g. [20000, 40000, 200000]) to it."
                )
            found["cutoffs"] = list(default)
    logger.info("%s has no %s: read from the weights as %s.", source, absent, found)
    hf.update(found)
    return hf


def _weights_header(directory, limits):
    """The tensors' `{name: (shape, dtype)}` of a folder's safetensors file or
    sharded save (headers only), or None without either."""
    if os.path.lexists(os.path.join(directory, "model.safetensors")):
        return read_safetensors_header(os.path.join(directory, "model.safetensors"), limits)
    if os.path.lexists(os.path.join(directory, SHARD_INDEX)):
        return read_shard_index(directory, limits)[0]
    return None


_INV_FREQ = "transformer.pos_emb.inv_freq"


def stored_frequency_dtype(sd, hidden_dim, path):
    """The `position_frequency_dtype` of the stored `inv_freq` buffer, which
    transformers computes the sinusoids with: "float32" for
    `1 / 10000^(2k / d_model)`, "float16"/"bfloat16" for those values
    rounded so (a save in that precision), None without a buffer. Other
    frequencies are refused; ones within 1% that are no such rounding load
    as "float32" with a warning naming the difference."""
    from keras_txl.position_encoding import rounded_frequencies

    sd.used.add(_INV_FREQ)
    if not sd.has(_INV_FREQ):
        return None
    size = len(range(0, hidden_dim, 2))
    stored = sd.get(_INV_FREQ, (size,))
    exact = 1.0 / 10000.0 ** (np.arange(0, hidden_dim, 2, dtype=np.float64) / hidden_dim)
    off = float(np.max(np.abs(stored.astype(np.float64) - exact) / exact)) if size else 0.0
    if off <= 1e-6:
        return "float32"
    if off > 1e-2:
        raise ValueError(
            f"{path}: {_INV_FREQ} holds other frequencies than 1 / 10000^(2k / d_model) "
            f"(d_model={hidden_dim}): up to {off:.0%} off. keras-txl computes the standard "
            "sinusoids, so a model with other position frequencies cannot be loaded."
        )
    for dtype in ("float16", "bfloat16"):
        if np.array_equal(stored, rounded_frequencies(hidden_dim, dtype)):
            logger.info(
                "%s: %s holds the frequencies rounded to %s (a %s save): the sinusoids are "
                "computed with them, as transformers does (position_frequency_dtype=%r).",
                path, _INV_FREQ, dtype, dtype, dtype,
            )
            return dtype
    logger.warning(
        "%s: %s holds frequencies up to %.2g%% off 1 / 10000^(2k / d_model) that are not "
        "those rounded to float16 or bfloat16: transformers runs with the stored values, "
        "keras-txl with the exact ones, so its outputs differ from transformers' (about 1e-3 "
        "in log-probs at short distances, far more at long ones).",
        path, _INV_FREQ, 100 * off,
    )
    return "float32"


def _check_lm_head(header, hf, weights_path):
    """A TransfoXL LM head's checkpoint (`TransfoXLLMHeadModel`) always holds
    its adaptive softmax (`crit.out_layers.*.bias` at least): a base
    `TransfoXLModel`'s (saved without the `transformer.` prefix, no `crit.`
    tensor) would fail at its first tensor as "missing tensor
    'transformer.word_emb...'", which named neither what the folder is nor
    what to load instead."""
    if any(name.startswith("crit.") for name in header):
        return
    architectures = hf.get("architectures")
    said = ""
    if isinstance(architectures, list) and architectures:
        said = (f" (its config.json says architectures={architectures!r}"
                + (": the head's tensors are missing)" if "TransfoXLLMHeadModel" in architectures
                   else ")"))
    raise ValueError(
        f"{weights_path} holds no adaptive softmax ('crit.' tensors): a base "
        f"TransfoXLModel checkpoint without the LM head{said}, from which no "
        "language model can be built (the softmax's biases and cluster weights "
        "are not in it). Pass the folder of a TransfoXLLMHeadModel checkpoint "
        "(e.g. transfo-xl/transfo-xl-wt103, or "
        "`TransfoXLLMHeadModel.from_pretrained(...).save_pretrained(out, "
        "safe_serialization=True)`)."
    )


def load_hf_checkpoint(directory, stateful=False, batch_size=None, limits=None,
                       **changes):
    """Builds a `TransformerXLCausalLM` from a Hugging Face TransfoXL folder.

    Args:
        directory: str. Folder with `config.json` and `model.safetensors`
            (or transformers' sharded save: `model.safetensors.index.json`
            and the shards it names, `read_shard_index`).
        stateful: bool. Build the stateful variant.
        batch_size: int. Needed when stateful.
        limits: None, a dict or a `keras_txl.limits.Limits`: bounds on what
            the folder may ask for (see docs/reliability.md).
        **changes: config overrides of the evaluation and training
            settings (e.g. `memory_length=1600` for a longer evaluation
            memory, `dropout=0.0`). The fields the checkpoint fixes
            (`keras_txl.config.TRAINED_FIELDS`: widths, layers, `pre_layer_norm`,
            `layer_norm_epsilon`, `same_length_convention`, ...) may be
            repeated, not changed; `position_frequency_dtype` is read from
            the stored `inv_freq` buffer ("float16"/"bfloat16" for a save in
            that precision, whose rounded frequencies transformers computes
            with).

    Returns:
        A `TransformerXLCausalLM` with the checkpoint's weights.

    Raises:
        ValueError: a missing/invalid `config.json` or a field of it of
            the wrong JSON type (naming the file, field and value), a
            truncated or corrupted `model.safetensors`, a shard missing or
            not the one its index describes, weights that do not
            match the config, a tensor that is not float16/bfloat16/
            float32/float64 or holds NaN/Inf (naming the file and tensor),
            a keyword argument that contradicts the checkpoint, or a config
            beyond `limits`.
    """
    from keras_txl.causal_lm import TransformerXLCausalLM
    from keras_txl.safe_files import folder_path

    directory = folder_path(directory)
    if not os.path.lexists(directory):
        raise ValueError(f"`directory`={directory!r} does not exist.")
    if not os.path.isdir(directory):
        raise ValueError(
            f"`directory`={directory!r} is a file; a Hugging Face checkpoint is a folder "
            "(config.json with model.safetensors or its shards): pass the folder that holds "
            f"it: {os.path.dirname(os.path.abspath(directory))!r}."
        )
    config_path = os.path.join(directory, "config.json")
    if not os.path.lexists(config_path):
        raise ValueError(f"No config.json in {directory!r}.")
    hf = read_json(config_path, limits)
    if not isinstance(hf, dict):
        raise ValueError(
            f"{config_path} must be a JSON object, received "
            f"{type(hf).__name__}: not a TransfoXL config."
        )
    if any(key not in hf for key in HF_SHAPE_DEFAULTS):
        early = _weights_header(directory, limits)
        if early is not None:
            hf = _fill_shape_fields(hf, early, config_path)
    config = config_from_hf(hf, config_path)
    check_config(config, limits, source=config_path)
    if changes:
        # position_frequency_dtype is read from the weights, further down.
        config.check_trained_fields(
            {k: v for k, v in changes.items() if k != "position_frequency_dtype"}, config_path)
        config = config.replace(**changes)
        check_config(config, limits, source="the overrides")
    weights_path = os.path.join(directory, "model.safetensors")
    index_path = os.path.join(directory, SHARD_INDEX)
    shards = None
    if not os.path.lexists(weights_path):
        names = sorted(os.listdir(directory))
        pickled = [name for name in names if re.fullmatch(
            r"pytorch_model(-\d+-of-\d+)?\.bin|tf_model\.h5", name)]
        if SHARD_INDEX in names:
            # transformers' sharded save: the index names each tensor's file.
            weights_path = index_path
            header, shards = read_shard_index(directory, limits)
        elif pickled:
            # A PyTorch .bin is a pickle, which can run code when loaded:
            # never read. transformers converts it (an .h5 too, told so).
            found = next((name for name in pickled if name.endswith(".bin")), pickled[0])
            if found.endswith(".bin"):
                why, load = ("a pytorch_model.bin is a pickle, which can run code when "
                             "loaded"), "from_pretrained(folder)"
            else:
                why, load = ("transformers' TensorFlow weights, an HDF5 file, which "
                             "transformers reads with from_tf=True"), "from_pretrained(folder, from_tf=True)"
            raise ValueError(
                f"No model.safetensors in {directory!r}, only {found}, which "
                f"keras-txl does not read ({why}). Convert it once with transformers, where you "
                f"trust the file: `TransfoXLLMHeadModel.{load}"
                ".save_pretrained(out, safe_serialization=True)`."
            )
    if shards is None:
        header = read_safetensors_header(weights_path, limits)
    _check_lm_head(header, hf, weights_path)
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
    if shards is None:
        tensors = _LazyTensors(weights_path, header)
    else:
        tensors = _ShardedTensors(shards, header)
    # The stored frequencies decide position_frequency_dtype (a float16 or
    # bfloat16 save rounds them, and transformers computes with them).
    found = stored_frequency_dtype(_StateDict(tensors, weights_path), config.hidden_dim, weights_path)
    if found is not None:
        config.replace(position_frequency_dtype=found).check_trained_fields(
            {k: v for k, v in changes.items() if k == "position_frequency_dtype"}, weights_path)
        config = config.replace(position_frequency_dtype=found)
    model = TransformerXLCausalLM(
        config, stateful=stateful, batch_size=batch_size
    )
    load_hf_weights(model, tensors, weights_path)
    logger.info("Loaded %s (%d tensors).", directory, len(tensors))
    return model
