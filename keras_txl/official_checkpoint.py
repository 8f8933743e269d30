"""Import the official TensorFlow releases of Transformer-XL.

The authors' TF1 code (kimiyoung/transformer-xl, `tf/model.py`) saved its
models as name-based checkpoints (`model.ckpt-N.index` / `.data-*`, with a
`checkpoint` state file) beside a `corpus-info.json`
(`{"vocab_size": ..., "cutoffs": [0, c_1, ..., vocab_size], "dataset": ...}`).
This module reads them with `tf.train.load_checkpoint` only (the same
variables saved by a TF2 `tf.train.Checkpoint`, under their object paths,
load too): no TF1 graph is built and nothing is unpickled (the releases' `cache.pkl`, which holds
the vocabulary, is never opened; see `docs/official_checkpoints.md`).

Everything the variable shapes and `corpus-info.json` determine is inferred
(vocabulary, cutoffs, div_val, widths, layers, heads, untie_r, which
projections are shared, proj_same_dim) and cross-checked; the rest
(memory_length, clamp_length, same_length, segment_length) comes from a
paper protocol (`preset=`) or keyword arguments.

The official layout, all under the variable scope `transformer/`
(time-major code; Dense kernels are `[in, out]`, as in Keras):

    r_w_bias, r_r_bias                      [N, H], or [L, N, H] (untie_r)
    adaptive_embed/lookup_table             [V, E]        (div_val 1)
    adaptive_embed/proj_W                   [E, D]        (iff E != D)
    adaptive_embed/cutoff_i/lookup_table    [V_i, E_i]    (div_val > 1)
    adaptive_embed/cutoff_i/proj_W          [E_i, D]      (omitted when
                                            E_i == D and not proj_same_dim)
    layer_l/rel_attn/qkv/kernel             [D, 3 N H]    (q | k | v)
    layer_l/rel_attn/r/kernel               [D, N H]
    layer_l/rel_attn/o/kernel               [N H, D]
    layer_l/rel_attn/LayerNorm/{gamma,beta} [D]
    layer_l/ff/layer_1/{kernel,bias}        [D, I], [I]
    layer_l/ff/layer_2/{kernel,bias}        [I, D], [D]
    layer_l/ff/LayerNorm/{gamma,beta}       [D]
    adaptive_softmax/bias                   [V]           (no cutoffs)
    adaptive_softmax/cutoff_i/b             [V_i]
    adaptive_softmax/cutoff_0/cluster_W     [C, E]
    adaptive_softmax/cutoff_0/cluster_b     [C]
    adaptive_softmax/cutoff_i/proj          [E_i, D]      (untied only)

Output tables are always the embedding tables (the official code ties
them); a cluster whose softmax has no `proj` of its own shares the
embedding's `proj_W` (`proj_share_all_but_first`).

Shape legend: L num_layers, N num_heads, H head_dim, D hidden_dim,
E embedding_dim, E_i cluster width, V vocabulary, V_i cluster size,
C tail clusters, I intermediate_dim.

Reference: Dai et al., 2019, arXiv:1901.02860; kimiyoung/transformer-xl
`tf/model.py`, `tf/train_gpu.py`, `tf/data_utils.py`, `tf/sota/*.sh`.
"""

import glob
import logging
import os
import re

import numpy as np

from keras_txl.checks import loaded_weight
from keras_txl.config import TransformerXLConfig
from keras_txl.safe_files import open_regular_file
from keras_txl.safe_files import read_bytes
from keras_txl.safe_files import read_json

logger = logging.getLogger(__name__)

CORPUS_INFO_FILE = "corpus-info.json"
STATE_FILE = "checkpoint"  # TF's state file: `model_checkpoint_path: "..."`
SCOPE = "transformer/"
# The state file's `model_checkpoint_path` line (a text-format string).
_STATE_PATH = re.compile(
    rb'^[ \t]*model_checkpoint_path[ \t]*:[ \t]*"((?:[^"\\\n]|\\.)*)"', re.M
)

# Non-model bookkeeping a training run leaves in the checkpoint: optimizer
# slots (`<var>/Adam`, `<var>/Adam_1`, ...), Adam's beta powers, the step.
_SLOT = re.compile(
    r"/(Adam|Adam_\d+|Momentum|Adagrad|Adadelta(_\d+)?|RMSProp(_\d+)?|"
    r"ExponentialMovingAverage|Ftrl(_\d+)?)$"
)
_BOOKKEEPING = re.compile(
    r"^(global_step|beta1_power(_\d+)?|beta2_power(_\d+)?|"
    r"learning_rate|_CHECKPOINTABLE_OBJECT_GRAPH|save_counter)$"
    # tf.train.Checkpoint: slots of a tracked optimizer, and its own state.
    r"|/\.OPTIMIZER_SLOT/|^optimizer/"
)
# A tf.train.Checkpoint (TF2, object-based) stores a variable under its
# object path, each component escaped ("/" as ".S", "." as ".."), and this.
_OBJECT_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"
_LAYER = re.compile(r"^transformer/layer_(\d+)/")

# What the official code fixes: a keyword argument may repeat these values
# but not change them.
OFFICIAL_SETTINGS = dict(
    attention_type="relative",
    pre_layer_norm=False,
    tie_embeddings=True,
    # tf.contrib.layers.layer_norm hard-codes 1e-12.
    layer_norm_epsilon=1e-12,
    # `_create_mask` with same_length: a query sees M + 1 keys.
    same_length_convention="official_tf",
)
# Evaluation defaults (the official eval scripts pass dropout=dropatt=0).
EVALUATION_SETTINGS = dict(dropout=0.0, attention_dropout=0.0)


def is_bookkeeping(name):
    """Whether a checkpoint variable is an optimizer slot or a counter."""
    return bool(_SLOT.search(name) or _BOOKKEEPING.search(name))


def variable_name(key):
    """The variable name a checkpoint key stands for: a TF1 name as it is,
    the key of a `tf.train.Checkpoint` as its object path unescaped
    (`transformer/r_w_bias/.ATTRIBUTES/VARIABLE_VALUE` or
    `transformer.Sr_w_bias/.ATTRIBUTES/VARIABLE_VALUE`:
    `transformer/r_w_bias`)."""
    if not key.endswith(_OBJECT_VALUE):
        return key
    return "/".join(
        re.sub(r"\.(.)", lambda m: "/" if m.group(1) == "S" else m.group(1), part)
        for part in key[: -len(_OBJECT_VALUE)].split("/")
    )


# === Files ===


def resolve_checkpoint(path):
    """(checkpoint prefix, folder) for a folder or a checkpoint prefix.

    A folder is resolved inside itself only. Its `checkpoint` state file
    names a prefix, which TF1's `Saver` writes as an absolute path of the
    training machine (or a relative one, maybe with `../`): only the last
    component of that path is taken and looked for in the folder, so a
    copied folder (`cp -r a b`) loads its own files, never `a`'s, and a
    state file cannot point outside the folder. Without a state file, or
    when the name it gives is not in the folder, the folder's single
    `*.index` file is used (several are refused: pass a prefix).

    Raises:
        ValueError: no checkpoint, or several and none named by the state
            file (the message names the state file and what it points to).

    A file of a checkpoint (its `.index`, `.meta` or a `.data-*` shard)
    stands for that checkpoint.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        return _resolve_folder(path), path
    if os.path.isfile(path + ".index"):
        return path, os.path.dirname(os.path.abspath(path))
    # One of a V2 checkpoint's files (its `.index`, its `.meta` graph, a
    # `.data-NNNNN-of-NNNNN` shard): that checkpoint.
    of_file = re.fullmatch(r"(.+)\.(index|meta|data-\d{5}-of-\d{5})", path, re.S)
    if of_file and os.path.isfile(path) and (
            os.path.isfile(of_file.group(1) + ".index") or _is_v1_checkpoint(of_file.group(1))):
        return of_file.group(1), os.path.dirname(os.path.abspath(path))
    if _is_v1_checkpoint(path):
        return path, os.path.dirname(os.path.abspath(path))
    raise ValueError(
        f"`path`={path!r} is neither a folder nor a checkpoint prefix (no "
        f"{path + '.index'!r}, and not a Saver V1 checkpoint file). Pass the "
        "release's model folder or a prefix such as 'model/model.ckpt-0'"
        f"{_checkpoints_beside(path)}."
    )


def _checkpoints_beside(path):
    """For the error on a path that is no checkpoint: the prefixes in its
    folder and the one its state file names ('' if none)."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        return ""
    pattern = os.path.join(glob.escape(directory), "*")
    names = sorted(os.path.basename(p)[: -len(".index")] for p in glob.glob(pattern + ".index"))
    if not names:  # Saver V1 files (each opened: only when there is no .index)
        names = sorted(os.path.basename(p) for p in glob.glob(pattern) if _is_v1_checkpoint(p))
    if not names:
        return ""
    try:
        named = _state_file_prefix(directory)
    except (OSError, ValueError):
        named = None
    last = re.split(r"[\\/]", named)[-1] if named is not None else None
    state = f"; its state file names {last!r}" if last is not None else ""
    return f" ({directory} holds the checkpoints {names[:10]}{' ...' if len(names) > 10 else ''}{state})"


# The last 8 bytes of a TF table file (leveldb's table magic number): a V2
# `.index` and a V1 checkpoint file (`Saver(write_version=SaverDef.V1)`) end
# with them.
_TABLE_MAGIC = (0xDB4775248B80FB57).to_bytes(8, "little")


def _is_v1_checkpoint(path):
    """Whether `path` is a TF1 Saver V1 checkpoint: one table file holding
    the variables, with no `.index` beside it (not a V2 `.index` or
    `.data-*` file, nor the `.meta` graph)."""
    name = os.path.basename(path)
    if (not os.path.isfile(path) or name.endswith((".index", ".meta"))
            or ".data-" in name or name == STATE_FILE
            or os.path.lexists(path + ".index")):
        return False
    try:
        with open_regular_file(path, "checkpoint") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() < len(_TABLE_MAGIC):
                return False
            f.seek(-len(_TABLE_MAGIC), os.SEEK_END)
            return f.read() == _TABLE_MAGIC
    except (OSError, ValueError):
        return False


def _state_file_prefix(directory):
    """The prefix named by `directory`'s state file, as written there (None
    without a state file or a `model_checkpoint_path` line)."""
    path = os.path.join(directory, STATE_FILE)
    if not os.path.lexists(path):
        return None
    data = read_bytes(path, 1 << 20, "checkpoint state file")
    found = _STATE_PATH.findall(data)
    if not found:
        logger.warning("%s names no model_checkpoint_path; ignored.", path)
        return None
    # Text-format escapes: only \" and \\ occur in practice.
    raw = re.sub(rb"\\(.)", rb"\1", found[-1])
    return raw.decode("utf-8", "replace")


def _resolve_folder(directory):
    """The checkpoint prefix of a folder, inside it (see
    `resolve_checkpoint`)."""
    named = _state_file_prefix(directory)
    state = os.path.join(directory, STATE_FILE)
    if named is not None:
        # The last component, of a POSIX or a Windows path.
        name = re.split(r"[\\/]", named)[-1]
        if name not in ("", ".", "..") and (
            os.path.isfile(os.path.join(directory, name + ".index"))
            or _is_v1_checkpoint(os.path.join(directory, name))
        ):
            return os.path.join(directory, name)
    indexes = sorted(glob.glob(os.path.join(glob.escape(directory), "*.index")))
    for index in indexes:
        _check_regular(index, "checkpoint index")
    if not indexes:
        # Saver V1 checkpoints: one file each, no .index (named as a V2
        # prefix's index here, which the code below strips).
        indexes = [
            p + ".index" for p in sorted(glob.glob(os.path.join(glob.escape(directory), "*")))
            if _is_v1_checkpoint(p)
        ]
    stale = (
        f"; its state file {state!r} names {named!r}, which is not in the "
        "folder (only names inside the folder are used)"
        if named is not None else ""
    )
    if len(indexes) == 1:
        if named is not None:
            logger.warning(
                "%s names %r, which is not in %s; using the folder's only "
                "checkpoint %s.", state, named, directory, indexes[0][:-6],
            )
        return indexes[0][: -len(".index")]
    if not indexes:
        raise ValueError(
            f"No TF checkpoint in {directory!r}{stale}: expected a "
            "`model.ckpt-N.index` file (with its `.data-*` files) in it."
        )
    names = [os.path.basename(p)[: -len(".index")] for p in indexes]
    raise ValueError(
        f"{directory!r} holds several checkpoints {names}"
        f"{stale or f' and no state file {state!r} naming one'}; pass the "
        f"prefix, e.g. {os.path.join(directory, names[-1])!r}."
    )


def _check_regular(path, what):
    """A ValueError naming `path` unless it is a regular file (or a symlink
    to one): a FIFO would block the reader, a device feed it forever."""
    with open_regular_file(path, what):
        pass


def read_corpus_info(path):
    """Reads `corpus-info.json`: (vocabulary_size, inner cutoffs, dataset).

    The official `data_utils.py` writes the cutoffs with 0 and vocab_size at
    the ends (`[0, 20000, 40000, 200000, 267735]`, `[]` without adaptive
    softmax); a list of inner cutoffs only (`[20000, 40000, 200000]`) is
    accepted too.

    Raises:
        ValueError: a missing file, bad JSON, or values that do not fit.
    """
    if not os.path.lexists(path):  # (another kind of file: read_json names it)
        raise ValueError(
            f"No {CORPUS_INFO_FILE} at {path!r}: the official releases keep "
            "it in their data folder (`{\"vocab_size\": ..., \"cutoffs\": "
            "[...], \"dataset\": ...}`); copy it beside the checkpoint or "
            "pass `corpus_info=`."
        )
    # Bounded, regular files only; bad JSON or UTF-8 is a ValueError naming
    # the file.
    info = read_json(path, what=CORPUS_INFO_FILE)
    if not isinstance(info, dict):
        raise ValueError(f"{path} must hold a JSON object, got {info!r}.")
    size = info.get("vocab_size")
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise ValueError(
            f"{path}: `vocab_size` must be a positive integer, received "
            f"{size!r}."
        )
    cutoffs = info.get("cutoffs", [])
    if not isinstance(cutoffs, list) or any(
        not isinstance(c, int) or isinstance(c, bool) for c in cutoffs
    ):
        raise ValueError(
            f"{path}: `cutoffs` must be a list of integers, received "
            f"{cutoffs!r}."
        )
    if cutoffs and cutoffs[0] == 0:
        if cutoffs[-1] != size:
            raise ValueError(
                f"{path}: `cutoffs`={cutoffs} starts with 0, so it must end "
                f"with vocab_size={size} (the official format "
                "[0, c_1, ..., vocab_size])."
            )
        cutoffs = cutoffs[1:-1]
    if cutoffs != sorted(set(cutoffs)) or (
        cutoffs and (cutoffs[0] <= 0 or cutoffs[-1] > size)
    ):
        raise ValueError(
            f"{path}: `cutoffs`={info.get('cutoffs')} must increase strictly "
            f"inside (0, vocab_size={size}] (the last may equal it: an empty last cluster)."
        )
    dataset = info.get("dataset")
    if dataset is not None and not isinstance(dataset, str):
        raise ValueError(
            f"{path}: `dataset` must be a string (the release's dataset, e.g. "
            f"'wt103') or absent, received {dataset!r}."
        )
    return size, tuple(cutoffs), dataset


def read_vocabulary_file(path, vocabulary_size=None):
    """Reads a vocabulary file: one symbol per line, the id is the line; as
    the official code, a line's first field is its symbol (a count may
    follow).

    Args:
        path: str. A UTF-8 text file (see `docs/official_checkpoints.md` for
            how to write it from a release's `cache.pkl`).
        vocabulary_size: int or None. The size the checkpoint needs.

    Returns:
        list of str.

    Raises:
        ValueError: a missing file, an empty line, a repeated symbol, or a
            size other than `vocabulary_size`.
    """
    if not os.path.lexists(path):
        raise ValueError(f"`vocabulary_file`={path!r} does not exist.")
    text = _utf8_text(path)
    if text.startswith("\ufeff"):
        # A byte order mark (an editor's, on Windows): not part of symbol 0.
        text = text[1:]
    if text.endswith("\n"):
        text = text[:-1]
    symbols = [s[:-1] if s.endswith("\r") else s for s in text.split("\n")]
    if text == "":
        symbols = []
    # As the official `Vocab._build_from_file` reads a vocabulary file: the
    # first whitespace-separated field of each line, so a count may follow
    # the symbol (LM1B's `1b_word_vocab.txt`) and spaces around it are not
    # part of it (its tokenizers split text on whitespace: no symbol holds any).
    fields = [s.split() for s in symbols]
    for line, field in enumerate(fields, start=1):
        if not field:
            raise ValueError(
                f"`vocabulary_file` {path}: line {line} is empty; every line "
                "must hold one symbol (the id is the line number - 1)."
            )
    symbols = [field[0] for field in fields]
    seen = {}
    for line, symbol in enumerate(symbols, start=1):
        if symbol in seen:
            raise ValueError(
                f"`vocabulary_file` {path}: symbol {symbol!r} on line {line} "
                f"repeats line {seen[symbol]}."
            )
        seen[symbol] = line
    if vocabulary_size is not None and len(symbols) != vocabulary_size:
        raise ValueError(
            f"`vocabulary_file` {path} has {len(symbols)} symbols, but the "
            f"checkpoint and {CORPUS_INFO_FILE} have vocab_size="
            f"{vocabulary_size}: the file belongs to another model (or "
            "lost/gained lines when it was written)."
        )
    return symbols


def _utf8_text(path):
    """The text of a UTF-8 vocabulary file, line ends kept as they are."""
    with open_regular_file(path, "`vocabulary_file`") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ValueError(
            f"`vocabulary_file` {path} is not valid UTF-8: byte {e.start} "
            f"(line {line}) {data[e.start:e.end]!r}: {e.reason}. Write it "
            "as UTF-8 (see docs/official_checkpoints.md)."
        ) from None


def find_corpus_info(directory):
    """`corpus-info.json` beside the checkpoint, else in `../data/` (the
    releases' `tf_<dataset>/{model,data}` layout); the first if neither."""
    candidates = [
        os.path.join(directory, CORPUS_INFO_FILE),
        os.path.join(os.path.dirname(os.path.abspath(directory)), "data",
                     CORPUS_INFO_FILE),
    ]
    return next((c for c in candidates if os.path.isfile(c)), candidates[0])


def official_dataset(path, for_tokenizer=False):
    """The `dataset` named by the corpus info of a release (or None).

    `for_tokenizer`: the dataset must name an official tokenizer
    (`keras_txl.tokenizers.OFFICIAL_DATASETS`), which a vocabulary file is
    read with: checked here, before a model is built."""
    from keras_txl.tokenizers import OFFICIAL_DATASETS

    _, directory = resolve_checkpoint(path)
    info = find_corpus_info(directory)
    dataset = read_corpus_info(info)[2]
    if for_tokenizer and dataset not in OFFICIAL_DATASETS:
        raise ValueError(
            f"{info}: `dataset` is {dataset!r}, but a vocabulary file is read with "
            f"the tokenizer of the release's dataset, one of {OFFICIAL_DATASETS}: "
            "set it in the file (the official releases write it)."
        )
    return dataset


def _outer_scope(names, prefix):
    """The scope the model variables are under when it is not the
    official `transformer/` itself: a model built inside another scope
    (`tower_0/transformer/...`, `model/transformer/...`); '' otherwise.

    Raises:
        ValueError: the variables are under several such scopes (one copy
            of the model per tower, say): which one to read is not for the
            loader to guess.
    """
    model = [n for n in names if not is_bookkeeping(n)]
    if any(n.startswith(SCOPE) for n in model):
        return ""
    inner = "/" + SCOPE
    scopes = sorted({n[: n.index(inner) + 1] for n in model if inner in n})
    if len(scopes) > 1:
        raise ValueError(
            f"{prefix}: the model variables are under {len(scopes)} scopes "
            f"{scopes[:5]}{' ...' if len(scopes) > 5 else ''}, each with its "
            f"own {SCOPE!r}: several models (one per tower?) in one "
            "checkpoint. The official code shares one set of variables "
            f"between its towers, under {SCOPE!r}."
        )
    return scopes[0] if scopes else ""


class _Checkpoint:
    """The model variables of a checkpoint, with checked access."""

    def __init__(self, prefix):
        import tensorflow as tf

        self.prefix = prefix
        self.corpus_info = CORPUS_INFO_FILE  # its path, once known
        # TensorFlow's reader would block forever on a FIFO: regular files only.
        if os.path.lexists(prefix + ".index"):
            _check_regular(prefix + ".index", "checkpoint index")
        for shard in sorted(glob.glob(glob.escape(prefix) + ".data-*")):
            _check_regular(shard, "checkpoint data shard")
        index = prefix + ".index"
        if not os.path.lexists(index) and os.path.lexists(prefix):
            index = prefix  # a Saver V1 checkpoint: one file
            _check_regular(index, "checkpoint")
        if os.path.lexists(index) and index not in tf.io.gfile.glob(index):
            # TF's reader looks the index up as a glob pattern: a path that
            # does not match itself (`[x]`, `\`) would read as a missing or
            # damaged checkpoint.
            raise ValueError(
                f"TensorFlow's checkpoint reader cannot open {prefix!r}: it "
                "reads the path as a glob pattern, which brackets ('[...]') "
                "or a backslash in it change. Move, rename or link the "
                "checkpoint to a path without them (the checkpoint itself "
                "is not at fault)."
            )
        try:
            self.reader = tf.train.load_checkpoint(prefix)
        except Exception as e:  # TF raises several error types here
            raise ValueError(
                f"Could not read the TF checkpoint {prefix!r}: damaged or "
                f"truncated checkpoint (or a missing .data file?): {e}"
            ) from None
        shapes = self.reader.get_variable_to_shape_map()
        scope = _outer_scope(map(variable_name, shapes), prefix)
        if scope:
            logger.info(
                "%s: the model variables are under the scope %r (a model built "
                "inside another scope); read as the official %r.",
                prefix, scope, SCOPE,
            )
        self.keys = {}  # variable name -> its key in the checkpoint
        for key in sorted(shapes):
            name = variable_name(key)
            if scope and name.startswith(scope):
                name = name[len(scope):]
            if name in self.keys:
                raise ValueError(
                    f"{prefix}: variable {name!r} is stored twice, as "
                    f"{self.keys[name]!r} and {key!r}: which one holds?"
                )
            self.keys[name] = key
        self.skipped = sorted(n for n in self.keys if is_bookkeeping(n))
        self.shapes = {
            name: tuple(shapes[key])
            for name, key in self.keys.items()
            if not is_bookkeeping(name)
        }

    def has(self, name):
        return name in self.shapes

    def shape(self, name, why=""):
        if name not in self.shapes:
            raise ValueError(
                f"{self.prefix}: missing variable {name!r}{why}. Is this an "
                "official Transformer-XL checkpoint (tf/model.py)?"
            )
        return self.shapes[name]

    def read(self, name):
        """Variable `name` as float32, checked: readable (the `.data-*`
        files there, whole and with matching checksums), of a float dtype
        and finite (`keras_txl.checks.loaded_weight`)."""
        try:
            value = self.reader.get_tensor(self.keys[name])
        except Exception as e:  # IndexError, OpError, ... from TF's reader
            message = (str(e).strip().splitlines() or [""])[0]
            raise ValueError(
                f"{self.prefix}: cannot read variable {name!r}: damaged or "
                f"truncated checkpoint ({self._damage()}: an interrupted "
                f"download or copy?). {type(e).__name__}: {message}"
            ) from None
        return np.asarray(loaded_weight(name, value, self.prefix), np.float32)

    def verify(self, names):
        """Reads and checks every variable in `names`, keeping none: the
        damage `read` finds, found before a model is built."""
        for name in names:
            self.read(name)

    def _damage(self):
        """What may be wrong with the prefix's `.data-*` shards, in words."""
        pattern = glob.escape(self.prefix) + ".data-*"
        shards = [os.path.basename(p) for p in sorted(glob.glob(pattern))]
        if not shards:
            return f"no {os.path.basename(self.prefix)}.data-* file beside its .index"
        return f"{', '.join(shards)} cut short, altered, or a shard missing"


# === Configuration ===


def _infer_div_val(widths, prefix):
    """div_val from the cluster widths E_i = E // div_val**i."""
    first = widths[0]
    # Up to first + 1: every div_val above `first` gives the same widths
    # (first, 0, 0, ...), so the smallest stands for them.
    for div_val in range(2, first + 2):
        if all(first // div_val**i == w for i, w in enumerate(widths)):
            return div_val
    names = [
        f"{SCOPE}adaptive_embed/cutoff_{i}/lookup_table"
        for i in range(len(widths))
    ]
    raise ValueError(
        f"{prefix}: the widths {list(widths)} of {names} do not follow "
        "E_i = E // div_val**i for any div_val > 1."
    )


def infer_config(checkpoint, vocabulary_size, cutoffs, info_path):
    """The architecture fields a checkpoint and its corpus info determine."""
    ckpt = checkpoint
    p = ckpt.prefix
    bias = ckpt.shape(SCOPE + "r_w_bias", " (the relative-position bias u)")
    if len(bias) == 3:
        untie, (bias_layers, num_heads, head_dim) = True, bias
    elif len(bias) == 2:
        untie, bias_layers, (num_heads, head_dim) = False, None, bias
    else:
        raise ValueError(
            f"{p}: variable {SCOPE}r_w_bias has shape {bias}; expected "
            "[n_head, d_head] or [n_layer, n_head, d_head] (untie_r)."
        )
    layers = sorted({
        int(m.group(1)) for m in map(_LAYER.match, ckpt.shapes) if m
    })
    if not layers:
        raise ValueError(
            f"{p}: no {SCOPE}layer_0/... variables: not an official "
            "Transformer-XL checkpoint."
        )
    num_layers = layers[-1] + 1
    if untie and bias_layers != num_layers:
        raise ValueError(
            f"{p}: variable {SCOPE}r_w_bias has shape {bias} "
            f"(n_layer={bias_layers}) but the checkpoint has layers up to "
            f"{SCOPE}layer_{num_layers - 1}."
        )
    qkv_name = SCOPE + "layer_0/rel_attn/qkv/kernel"
    qkv = ckpt.shape(qkv_name)
    if len(qkv) != 2 or qkv[1] != 3 * num_heads * head_dim:
        raise ValueError(
            f"{p}: variable {qkv_name} has shape {qkv}; expected "
            f"[d_model, 3 * n_head * d_head] = [d_model, "
            f"{3 * num_heads * head_dim}] from {SCOPE}r_w_bias {bias}."
        )
    hidden_dim = qkv[0]
    ff_name = SCOPE + "layer_0/ff/layer_1/kernel"
    ff = ckpt.shape(ff_name)
    if len(ff) != 2 or ff[0] != hidden_dim:
        raise ValueError(
            f"{p}: variable {ff_name} has shape {ff}; expected "
            f"[d_model={hidden_dim}, d_inner] from {qkv_name} {qkv}."
        )
    intermediate_dim = ff[1]

    embed = SCOPE + "adaptive_embed/"
    if ckpt.has(embed + "lookup_table"):
        div_val = 1
        table = ckpt.shape(embed + "lookup_table")
        if len(table) != 2:
            raise ValueError(
                f"{p}: variable {embed}lookup_table has shape {table}; "
                "expected [n_token, d_embed]."
            )
        embedding_dim = table[1]
        embed_projections = [ckpt.has(embed + "proj_W")] * (len(cutoffs) + 1)
        project_same_dim = True
    elif any(ckpt.has(embed + f"cutoff_{i}/lookup_table") for i in range(len(cutoffs) + 1)):
        widths = []
        while ckpt.has(embed + f"cutoff_{len(widths)}/lookup_table"):
            shape = ckpt.shape(embed + f"cutoff_{len(widths)}/lookup_table")
            if len(shape) != 2:
                raise ValueError(
                    f"{p}: variable {embed}cutoff_{len(widths)}/lookup_table "
                    f"has shape {shape}; expected [cluster size, width]."
                )
            widths.append(shape[1])
        if len(widths) < len(cutoffs) + 1:
            # A gap (or the last ones) in the tables the corpus info's
            # clusters need: name the first variable missing.
            raise ValueError(
                f"{p}: missing variable '{embed}cutoff_{len(widths)}/lookup_table': "
                f"{info_path} has {len(cutoffs)} cutoffs {list(cutoffs)}, so "
                f"{len(cutoffs) + 1} clusters, each with its table, and the "
                f"checkpoint has those of the first {len(widths)} only"
                + (f" ({embed}cutoff_0..{len(widths) - 1}/lookup_table)" if widths else "")
                + ". A truncated or partly renamed checkpoint (or the corpus "
                "info of another model)?"
            )
        if len(widths) != len(cutoffs) + 1:
            raise ValueError(
                f"{p}: {len(widths)} adaptive embedding tables "
                f"({embed}cutoff_0..{len(widths) - 1}/lookup_table) but "
                f"{info_path} has {len(cutoffs)} cutoffs {list(cutoffs)}, "
                f"so {len(cutoffs) + 1} clusters: the corpus info belongs "
                "to another model."
            )
        div_val = _infer_div_val(widths, p)
        embedding_dim = widths[0]
        embed_projections = [
            ckpt.has(embed + f"cutoff_{i}/proj_W") for i in range(len(widths))
        ]
        # proj_same_dim only shows on a cluster as wide as d_model: it has a
        # proj_W then, and an own softmax `proj` unless that is shared (so
        # either one, the other missing, is a checkpoint missing a variable,
        # which the layout check names).
        same = [i for i, w in enumerate(widths) if w == hidden_dim]
        project_same_dim = (
            embed_projections[same[0]]
            or ckpt.has(SCOPE + f"adaptive_softmax/cutoff_{same[0]}/proj")
        ) if same else True
    else:
        raise ValueError(
            f"{p}: missing variable {embed}lookup_table (or "
            f"{embed}cutoff_0/lookup_table with adaptive input). Is this an "
            "official Transformer-XL checkpoint (tf/model.py)?"
        )

    if cutoffs:
        # The official code (train_gpu.py, train.py) never shares cluster 0's
        # softmax projection, and shares those of clusters 1.. all or none
        # (proj_share_all_but_first). Where a cluster has a projection, an
        # untied one has its own `cutoff_i/proj`; so shared means that no
        # such cluster past 0 has one. Any other pattern is a checkpoint
        # with missing variables, which the layout check names (inferring
        # a tie from each absent `proj` loaded the embedding's in its place).
        softmax = SCOPE + "adaptive_softmax/"
        projected = [i for i in range(1, len(cutoffs) + 1) if embed_projections[i]]
        share = not any(ckpt.has(softmax + f"cutoff_{i}/proj") for i in projected)
        tie_projections = (False,) + tuple(
            share and embed_projections[i] for i in range(1, len(cutoffs) + 1)
        )
    else:
        # Without cutoffs the official softmax always reuses the embedding's
        # projection (`params_projs`), if there is one.
        tie_projections = (True,)
    return dict(
        vocabulary_size=vocabulary_size,
        num_layers=num_layers,
        hidden_dim=hidden_dim,
        num_heads=num_heads,
        head_dim=head_dim,
        intermediate_dim=intermediate_dim,
        embedding_dim=embedding_dim,
        cutoffs=tuple(cutoffs),
        div_val=div_val,
        tie_projections=tie_projections,
        project_same_dim=project_same_dim,
        untie_relative_bias=untie,
    )


def official_variables(config, corpus_info=CORPUS_INFO_FILE):
    """{name: (shape, source)} of the official layout for `config`.

    `source` says what fixes the shape, for error messages: the sizes and
    the variables `infer_config` read them from; `corpus_info` is the path
    they give for the corpus info.
    """

    cfg = config
    D, inner = cfg.hidden_dim, cfg.intermediate_dim
    N, H = cfg.num_heads, cfg.resolved_head_dim
    V, E = cfg.vocabulary_size, cfg.resolved_embedding_dim
    info = f"{corpus_info} (vocab_size={V}, cutoffs={list(cfg.cutoffs)})"
    embed = SCOPE + "adaptive_embed/"
    # Where infer_config read each size.
    d_model = f"d_model={D} (from {SCOPE}layer_0/rel_attn/qkv/kernel)"
    heads = f"n_head={N}, d_head={H} (from {SCOPE}r_w_bias)"
    d_inner = f"d_inner={inner} (from {SCOPE}layer_0/ff/layer_1/kernel)"
    table = embed + ("lookup_table" if cfg.div_val == 1 else "cutoff_0/lookup_table")
    d_embed = f"d_embed={E} (from {table})"

    def width_of(i):
        if cfg.div_val == 1 or i == 0:
            return d_embed
        return (f"width {cfg.cluster_embedding_dim(i)} = d_embed // div_val**{i} "
                f"({d_embed}, div_val={cfg.div_val} from the tables' widths)")

    out = {}
    bias = (cfg.num_layers, N, H) if cfg.untie_relative_bias else (N, H)
    out[SCOPE + "r_w_bias"] = (bias, "the other variables")
    out[SCOPE + "r_r_bias"] = (bias, SCOPE + "r_w_bias")
    if cfg.div_val == 1:
        out[embed + "lookup_table"] = ((V, E), info)
        if E != D:
            out[embed + "proj_W"] = ((E, D), f"{d_embed} and {d_model}")
    else:
        for i, (start, end) in enumerate(cfg.cluster_bounds):
            width = cfg.cluster_embedding_dim(i)
            out[embed + f"cutoff_{i}/lookup_table"] = ((end - start, width), f"{info} and {width_of(i)}")
            if cfg.cluster_has_projection(i):
                out[embed + f"cutoff_{i}/proj_W"] = ((width, D), f"{width_of(i)} and {d_model}")
    for layer in range(cfg.num_layers):
        a = SCOPE + f"layer_{layer}/rel_attn/"
        f = SCOPE + f"layer_{layer}/ff/"
        out[a + "qkv/kernel"] = ((D, 3 * N * H), f"{d_model} and {heads}")
        out[a + "r/kernel"] = ((D, N * H), f"{d_model} and {heads}")
        out[a + "o/kernel"] = ((N * H, D), f"{heads} and {d_model}")
        out[a + "LayerNorm/gamma"] = ((D,), d_model)
        out[a + "LayerNorm/beta"] = ((D,), d_model)
        out[f + "layer_1/kernel"] = ((D, inner), f"{d_model} and {d_inner}")
        out[f + "layer_1/bias"] = ((inner,), d_inner)
        out[f + "layer_2/kernel"] = ((inner, D), f"{d_inner} and {d_model}")
        out[f + "layer_2/bias"] = ((D,), d_model)
        out[f + "LayerNorm/gamma"] = ((D,), d_model)
        out[f + "LayerNorm/beta"] = ((D,), d_model)
    softmax = SCOPE + "adaptive_softmax/"
    if not cfg.cutoffs:
        out[softmax + "bias"] = ((V,), info)
        return out
    ties = cfg.resolved_tie_projections
    for i, (start, end) in enumerate(cfg.cluster_bounds):
        width = cfg.cluster_embedding_dim(i)
        out[softmax + f"cutoff_{i}/b"] = ((end - start,), info)
        if cfg.cluster_has_projection(i) and not ties[i]:
            out[softmax + f"cutoff_{i}/proj"] = ((width, D), f"{width_of(i)} and {d_model}")
    out[softmax + "cutoff_0/cluster_W"] = ((cfg.num_clusters, E), f"{info} and {d_embed}")
    out[softmax + "cutoff_0/cluster_b"] = ((cfg.num_clusters,), info)
    return out


def _check_layout(checkpoint, config):
    """Every expected variable present with its shape, nothing unknown."""
    expected = official_variables(config, checkpoint.corpus_info)
    p = checkpoint.prefix
    missing = [n for n in expected if not checkpoint.has(n)]
    if missing:
        more = ""
        if len(missing) > 1:
            more = f" (and {len(missing) - 1} more: {missing[1:4]})"
        raise ValueError(
            f"{p}: missing variable {missing[0]!r}{more}"
            f"; the other variables and {CORPUS_INFO_FILE} imply it. A "
            "truncated or partly renamed checkpoint?"
        )
    for name, (shape, source) in expected.items():
        got = checkpoint.shapes[name]
        if got != shape:
            raise ValueError(
                f"{p}: variable {name!r} has shape {list(got)}, expected "
                f"{list(shape)} from {source}: the checkpoint and "
                f"{CORPUS_INFO_FILE} do not belong together, or the "
                "checkpoint is not an official Transformer-XL."
            )
    unknown = sorted(set(checkpoint.shapes) - set(expected))
    if unknown:
        raise ValueError(
            f"{p}: unknown variable(s) {unknown[:5]}"
            f"{' ...' if len(unknown) > 5 else ''}: not part of the official "
            "Transformer-XL layout for this configuration (and not an "
            "optimizer slot or global_step, which are skipped). A model "
            "from modified code cannot be imported as is."
        )


def official_config(prefix, corpus_info_path, preset=None, **config):
    """The `TransformerXLConfig` of an official checkpoint (no weights read).

    Args:
        prefix: str. Checkpoint prefix.
        corpus_info_path: str. Its `corpus-info.json`.
        preset: str or None. A paper protocol (`EVAL_PROTOCOLS` key or a
            paper preset name) for segment/memory/clamp length and
            same_length.
        **config: other `TransformerXLConfig` fields (what the checkpoint
            does not fix).

    Returns:
        (config, checkpoint): the config and the opened `_Checkpoint`.
    """
    from keras_txl.presets import EVAL_PROTOCOLS
    from keras_txl.presets import eval_protocol

    settings = dict(EVALUATION_SETTINGS)
    if preset is not None:
        settings.update(eval_protocol(preset))  # unknown names fail early
    size, cutoffs, dataset = read_corpus_info(corpus_info_path)
    checkpoint = _Checkpoint(prefix)
    checkpoint.corpus_info = corpus_info_path
    inferred = infer_config(checkpoint, size, cutoffs, corpus_info_path)
    fixed = {**inferred, **OFFICIAL_SETTINGS}
    for key, value in config.items():
        if key in fixed:
            ok = value == fixed[key] or (
                key in ("cutoffs", "tie_projections")
                and value is not None and tuple(value) == fixed[key]
            )
            if not ok:
                raise ValueError(
                    f"`{key}`={value!r} contradicts the official checkpoint, "
                    f"which has {key}={fixed[key]!r} (from its variable "
                    f"shapes, {CORPUS_INFO_FILE} or the official code); "
                    "leave it out."
                )
    if preset is None and dataset in EVAL_PROTOCOLS:
        logger.info(
            "%s: dataset %r; no `preset` given, so memory_length, "
            "clamp_length and same_length are the config defaults unless "
            "passed (preset=%r applies the paper's evaluation).",
            corpus_info_path, dataset, dataset,
        )
    settings.update(config)
    settings.update(fixed)
    return TransformerXLConfig.from_dict(settings), checkpoint


# === Weights ===


def _assign(variable, value, name):
    if tuple(variable.shape) != tuple(value.shape):  # a loader bug, not input
        raise ValueError(
            f"{name}: cannot assign shape {tuple(value.shape)} to variable "
            f"{variable.path} of shape {tuple(variable.shape)}."
        )
    variable.assign(value)


def load_official_weights(model, checkpoint):
    """Copies the official variables into a `TransformerXLCausalLM`."""
    cfg = model.txl_config
    _check_layout(checkpoint, cfg)
    read = checkpoint.read
    D, N, H = cfg.hidden_dim, cfg.num_heads, cfg.resolved_head_dim
    backbone = model.backbone
    embedding = backbone.token_embedding
    embed = SCOPE + "adaptive_embed/"
    if cfg.div_val == 1:
        names = [(embed + "lookup_table", embed + "proj_W")]
    else:
        names = [
            (embed + f"cutoff_{i}/lookup_table", embed + f"cutoff_{i}/proj_W")
            for i in range(cfg.num_clusters + 1)
        ]
    for (table_name, projection_name), table, projection in zip(
        names, embedding.tables, embedding.projections
    ):
        _assign(table, read(table_name), table_name)
        if projection is not None:
            _assign(projection, read(projection_name), projection_name)
    # u and v: the same shapes here ([N, H] or [L, N, H]).
    _assign(backbone.content_bias, read(SCOPE + "r_w_bias"), "r_w_bias")
    _assign(backbone.position_bias, read(SCOPE + "r_r_bias"), "r_r_bias")
    for layer, block in enumerate(backbone.blocks):
        a = SCOPE + f"layer_{layer}/rel_attn/"
        f = SCOPE + f"layer_{layer}/ff/"
        attention = block.attention
        # One [D, 3 N H] kernel split q | k | v, each head-major [N, H].
        _assign(attention.qkv_kernel,
                read(a + "qkv/kernel").reshape(D, 3, N, H), a + "qkv/kernel")
        _assign(attention.position_kernel,
                read(a + "r/kernel").reshape(D, N, H), a + "r/kernel")
        _assign(attention.output_kernel,
                read(a + "o/kernel").reshape(N, H, D), a + "o/kernel")
        for norm, scope in ((block.attention_norm, a),
                            (block.feedforward_norm, f)):
            _assign(norm.gamma, read(scope + "LayerNorm/gamma"),
                    scope + "LayerNorm/gamma")
            _assign(norm.beta, read(scope + "LayerNorm/beta"),
                    scope + "LayerNorm/beta")
        for dense, name in ((block.intermediate_dense, "layer_1"),
                            (block.output_dense, "layer_2")):
            _assign(dense.kernel, read(f + name + "/kernel"), f + name)
            _assign(dense.bias, read(f + name + "/bias"), f + name)
    softmax = model.softmax
    s = SCOPE + "adaptive_softmax/"
    if not cfg.cutoffs:
        _assign(softmax.bias, read(s + "bias"), s + "bias")
    else:
        _assign(softmax.bias, np.concatenate([
            read(s + f"cutoff_{i}/b") for i in range(cfg.num_clusters + 1)
        ]), s + "cutoff_*/b")
        _assign(softmax.cluster_kernel, read(s + "cutoff_0/cluster_W"),
                s + "cutoff_0/cluster_W")
        _assign(softmax.cluster_bias, read(s + "cutoff_0/cluster_b"),
                s + "cutoff_0/cluster_b")
        for i, projection in enumerate(softmax.own_projections):
            if projection is not None:
                _assign(projection, read(s + f"cutoff_{i}/proj"),
                        s + f"cutoff_{i}/proj")


def load_official_checkpoint(
    path,
    preset=None,
    vocabulary_file=None,
    corpus_info=None,
    stateful=False,
    batch_size=None,
    **config,
):
    """Builds a `TransformerXLCausalLM` from an official TF release.

    The architecture is read from the variable shapes and
    `corpus-info.json`; the official code's fixed choices are applied
    (LayerNorm epsilon 1e-12, the M+1-key same_length mask, tied output
    tables) and, for evaluation, dropout 0. The first segment attends to an
    all-zero memory, as in the official evaluation. Optimizer slots
    (`/Adam`, `/Adam_1`), Adam's beta powers and `global_step` are skipped.

    Args:
        path: str. The release's model folder (with its `checkpoint` state
            file, or one `*.index`), or a prefix such as
            `.../model.ckpt-0`, or one of its files (`.index`, `.meta`,
            `.data-*`). A folder is resolved inside itself only
            (`resolve_checkpoint`): a copied folder loads its own files.
        preset: str or None. Paper evaluation protocol: "wt103", "enwik8",
            "text8", "lm1b" (or "wt103_large", ...): sets segment_length,
            memory_length, clamp_length and same_length as in the official
            `tf/sota/*.sh`. Keyword arguments override it.
        vocabulary_file: str or None. One symbol per line (ids in file
            order); checked against the vocabulary size and kept as
            `model.vocabulary` (a tuple of str).
        corpus_info: str or None. Path of `corpus-info.json`; default: the
            checkpoint's folder, then its parent's `data/` folder (the
            layout of the releases, `pretrained_xl/tf_wt103/{model,data}`).
        stateful, batch_size: as for `TransformerXLCausalLM`.
        **config: `TransformerXLConfig` fields the checkpoint does not fix
            (memory_length, clamp_length, same_length, segment_length,
            dropout, ...). Fields it fixes may be repeated, not changed.

    Returns:
        A `TransformerXLCausalLM`.

    Raises:
        ValueError: no checkpoint or `corpus-info.json`; a missing variable,
            an unknown model variable, a shape that contradicts
            `corpus-info.json` or the other variables (each names the
            variable and file); a damaged or truncated checkpoint (a
            `.data-*` shard missing, cut short or failing its checksum), a
            variable that is not float16/bfloat16/float32/float64 or holds
            NaN/Inf (each names the prefix and the variable, and is found
            before the model is built); a `corpus-info.json` or vocabulary
            file that is not valid UTF-8; a vocabulary file of the wrong
            size; a keyword argument that contradicts the checkpoint.

    Example:
    ```python
    model = keras_txl.load_official_checkpoint(
        "pretrained_xl/tf_wt103/model", preset="wt103",
        vocabulary_file="wt103-vocab.txt")
    out = model.call_with_memory(ids)              # (B, 128) ids
    out = model.call_with_memory(next_ids, out["memory"])
    ```
    """
    from keras_txl.causal_lm import TransformerXLCausalLM

    prefix, directory = resolve_checkpoint(path)
    if corpus_info is None:
        corpus_info = find_corpus_info(directory)
    cfg, checkpoint = official_config(prefix, corpus_info, preset, **config)
    symbols = None
    if vocabulary_file is not None:
        symbols = read_vocabulary_file(vocabulary_file, cfg.vocabulary_size)
    # Every variable read and checked once (one at a time, so no more memory
    # than the largest) before the model is built: a damaged file fails fast.
    _check_layout(checkpoint, cfg)
    checkpoint.verify(official_variables(cfg))
    model = TransformerXLCausalLM(cfg, stateful=stateful, batch_size=batch_size)
    load_official_weights(model, checkpoint)
    if symbols is not None:
        model.vocabulary = tuple(symbols)
    logger.info(
        "Loaded %s: %d model variables, %d optimizer/bookkeeping variables "
        "skipped.", prefix, len(checkpoint.shapes), len(checkpoint.skipped),
    )
    return model
