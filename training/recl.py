"""How much context a model uses: RECL (the paper's Appendix C) and reach.

Three tools:

- `context_losses(model, tokens, targets, context)`: the loss of each target
  token when the model is given only the `context` tokens before it,
  `l(c, t) = -log p(x_t | x_{t-c}, ..., x_{t-1})`.
- `relative_effective_context_length(losses, contexts, r)`: RECL of every
  model of a group from those losses (Dai et al., 2019, section 4.3 and
  Appendix C), and `txl recl` (`recl_main`) that runs both on trained
  workdirs.
- `recurrence_reach(...)` and `perturbation_reach(...)`: how far back a
  token can influence the current prediction through the segment-level
  recurrence, in closed form and measured by perturbing tokens.

RECL (Appendix C). A group of models m_1..m_N; l_i(c, t) the loss of m_i on
token t with context c. For a short context c and a longer c':

    b(c, t)     = min_i l_i(c, t)                        (group baseline)
    T           = the top-r fraction of tokens with the largest b(c, t)
    f_i(c, c')  = mean over t in T of min(b(c, t), l_i(c', t))
    g_i(c, c')  = (exp f_i(c, c) - exp f_i(c, c')) / exp f_i(c, c)

Starting from the shortest context, c moves to the next longer one while
g_i(c, c') >= 0.01; RECL_i is the c where it stops. Only improvements over
the best short-context loss of the group count, so a model cannot gain
RECL by being bad at short contexts. The paper steps c by a fixed Delta;
here c walks a given list of contexts (use an evenly spaced one to match).
"""

import io
import json
import logging
import math
import os
import time
import weakref

import numpy as np

from keras_txl import checks
from keras_txl import safe_files
from keras_txl.io import tokenizer_directory

logger = logging.getLogger(__name__)

DEFAULT_RATIOS = (0.1, 0.5, 1.0)
DEFAULT_THRESHOLD = 0.01


# --- RECL on loss tables ---------------------------------------------------
def _check_losses(losses, contexts):
    contexts = [int(c) for c in contexts]
    if len(contexts) < 2:
        raise ValueError(
            f"RECL needs at least two context lengths, received {contexts}."
        )
    if any(b <= a for a, b in zip(contexts, contexts[1:])):
        raise ValueError(
            f"`contexts` must be strictly increasing, received {contexts}."
        )
    if not losses:
        raise ValueError("`losses` is empty: give one loss table per model.")
    tables = {}
    shape = None
    for name, table in losses.items():
        table = np.asarray(table, dtype=np.float64)
        if table.ndim != 2 or table.shape[0] != len(contexts):
            raise ValueError(
                f"The losses of {name!r} must have shape (len(contexts), "
                f"num_tokens) = ({len(contexts)}, N), received {table.shape}."
            )
        if shape is not None and table.shape != shape:
            raise ValueError(
                f"All models must be scored on the same tokens: {name!r} has "
                f"shape {table.shape}, another model {shape}."
            )
        if not np.all(np.isfinite(table)):
            raise ValueError(f"The losses of {name!r} contain NaN or Inf.")
        shape = table.shape
        tables[name] = table
    if shape[1] == 0:
        raise ValueError("The loss tables hold no tokens.")
    return tables, contexts


def hard_token_set(baseline, r):
    """Indices of the ceil(r * N) tokens with the largest baseline loss.

    Ties are broken by position (earlier first), so the set is
    deterministic.
    """
    if not 0.0 < r <= 1.0:
        raise ValueError(f"`r` must be in (0, 1], received r={r!r}.")
    count = max(1, int(math.ceil(r * len(baseline) - 1e-9)))
    order = np.argsort(-np.asarray(baseline), kind="stable")
    return np.sort(order[:count])


def relative_gains(losses, contexts, r=0.1, hard_set="current"):
    """Relative gain g_i(c_k, c_{k+1}) of every model for every step k.

    Args:
        losses: dict model name -> (len(contexts), N) array of per-token
            losses in nats, row k at context `contexts[k]`; every model
            scored on the same N tokens.
        contexts: strictly increasing ints.
        r: float in (0, 1]. Fraction of hardest tokens kept.
        hard_set: "current" (the paper: the top-r tokens by b(c, t) at the
            short context c of each step) or "initial" (fixed once, at the
            shortest context).

    Returns:
        dict name -> list of len(contexts) - 1 floats.
    """
    tables, contexts = _check_losses(losses, contexts)
    if hard_set not in ("current", "initial"):
        raise ValueError(
            "`hard_set` must be 'current' or 'initial', received "
            f"{hard_set!r}."
        )
    stacked = np.stack(list(tables.values()))  # (models, contexts, N)
    baseline = stacked.min(axis=0)  # (contexts, N): b(c, t)
    fixed = hard_token_set(baseline[0], r)
    gains = {name: [] for name in tables}
    for k in range(len(contexts) - 1):
        chosen = fixed if hard_set == "initial" else hard_token_set(baseline[k], r)
        b = baseline[k, chosen]
        short = math.exp(b.mean())  # exp f_i(c, c): the same for every model
        for name, table in tables.items():
            long = math.exp(np.minimum(b, table[k + 1, chosen]).mean())
            gains[name].append((short - long) / short)
    return gains


def relative_effective_context_length(
    losses, contexts, r=0.1, threshold=DEFAULT_THRESHOLD, hard_set="current"
):
    """RECL of every model of a group (Dai et al., 2019, Appendix C).

    Args:
        losses: dict model name -> (len(contexts), N) per-token losses
            (nats), as for `relative_gains`.
        contexts: strictly increasing context lengths, the steps of c.
        r: float in (0, 1]. Fraction of hardest tokens (0.1, 0.5, 1.0 in
            the paper's Table 8).
        threshold: float. c keeps growing while the relative gain is at
            least this (0.01 in the paper).
        hard_set: see `relative_gains`.

    Returns:
        dict name -> {"recl": int, "capped": bool, "gains": [float]}.
        `capped` is True when the gain never fell below the threshold: RECL
        is then only known to be >= the longest context given.

    Example:

    >>> loss = np.array([[2.0], [1.0], [1.0]])  # one token, 3 contexts
    >>> relative_effective_context_length({"a": loss}, [8, 16, 32])["a"]["recl"]
    16
    """
    threshold = checks.finite_number("threshold", threshold, minimum=0)
    gains = relative_gains(losses, contexts, r, hard_set)
    contexts = [int(c) for c in contexts]
    out = {}
    for name, steps in gains.items():
        recl, capped = contexts[-1], True
        for k, gain in enumerate(steps):
            if gain < threshold:
                recl, capped = contexts[k], False
                break
        out[name] = {"recl": recl, "capped": capped, "gains": steps}
    return out


def recl_table(losses, contexts, ratios=DEFAULT_RATIOS,
               threshold=DEFAULT_THRESHOLD, hard_set="current"):
    """RECL for several r: dict name -> {r: {"recl", "capped", "gains"}}."""
    result = {name: {} for name in losses}
    for r in ratios:
        for name, value in relative_effective_context_length(
            losses, contexts, r, threshold, hard_set
        ).items():
            result[name][float(r)] = value
    return result


# --- losses at a given context -------------------------------------------
def evaluation_model(model, **changes):
    """The model with dropout off and the given memory/clamp/same_length."""
    cfg = model.txl_config
    settings = {k: v for k, v in changes.items()
                if v is not None and getattr(cfg, k) != v}
    if cfg.dropout or cfg.attention_dropout:
        settings.update(dropout=0.0, attention_dropout=0.0)
    return model.with_settings(**settings) if settings else model


def context_segments(context, segment_length):
    """Lengths of the segments a `context`-token window is cut into.

    Cut from its end, so the last segment (holding the scored token) is a
    full one: e.g. context 70, T 32 -> [6, 32, 32].
    """
    if context < 1:
        raise ValueError(f"`context` must be >= 1, received {context}.")
    if segment_length < 1:
        raise ValueError(
            f"`segment_length` must be >= 1, received {segment_length}."
        )
    head = context % segment_length
    return ([head] if head else []) + [segment_length] * (context // segment_length)


def context_losses(model, tokens, targets, context, segment_length=None,
                   batch_size=64):
    """Loss of each target token given exactly `context` tokens before it.

    For target position t the model reads x_{t-c} .. x_{t-1} as if the
    text began at x_{t-c}: the window is cut into segments of
    `segment_length` from its end (the first one shorter), read in order
    with the memory carried from the all-zero start memory, and the
    log-probability of x_t at the last position is kept. For a model
    without memory this is the sliding-window evaluation of Al-Rfou et al.
    (2018) with window min(c, T); for Transformer-XL every token before t
    is reachable within its recurrence bound (`recurrence_reach`).

    Use the model as it should be evaluated (`evaluation_model`: dropout
    off, evaluation memory length).

    Args:
        model: `TransformerXLCausalLM`.
        tokens: 1-D int array, the text.
        targets: 1-D int array of positions t with context <= t < len.
        context: int >= 1, c.
        segment_length: int. T of the reading; default the model's.
        batch_size: int. Windows per forward pass.

    Returns:
        float64 array (len(targets),): -log p(x_t | c previous tokens), nats.
    """
    import tensorflow as tf

    # A batch of 0 or less would score nothing and return np.empty's bytes.
    batch_size = checks.positive_int("batch_size", batch_size)
    segment_length = checks.positive_int("segment_length", segment_length,
                                         allow_none=True)
    tokens = np.asarray(tokens)
    targets = np.asarray(targets, dtype=np.int64)
    if tokens.ndim != 1 or targets.ndim != 1:
        raise ValueError("`tokens` and `targets` must be 1-D arrays.")
    if len(targets) and (targets.min() < context or targets.max() >= len(tokens)):
        raise ValueError(
            f"Every target t needs context <= t < len(tokens) (context "
            f"{context}, {len(tokens)} tokens); received targets in "
            f"[{targets.min()}, {targets.max()}]."
        )
    T = segment_length or model.txl_config.segment_length
    lengths = context_segments(context, T)
    skipped = 0
    if model.txl_config.memory_length == 0:
        # Without memory nothing crosses a segment boundary: only the last
        # segment can change the scored token.
        skipped, lengths = context - lengths[-1], lengths[-1:]
    step = _context_step(model)
    offsets = np.arange(-context, 0)  # window positions relative to t
    out = np.empty(len(targets), dtype=np.float64)
    for first in range(0, len(targets), batch_size):
        chunk = targets[first:first + batch_size]
        windows = tokens[chunk[:, None] + offsets[None, :]].astype(np.int32)
        answers = tokens[chunk].astype(np.int32)
        memory = model.initial_memory(len(chunk))
        start = skipped
        for length in lengths:
            x = tf.constant(windows[:, start:start + length])
            start += length
            if start < context:
                memory = step["memory"](x, memory)
            else:
                out[first:first + len(chunk)] = step["loss"](
                    x, tf.constant(answers), memory
                ).numpy()
    return out


# Compiled steps per model, dropped with the model (nothing stored on it).
_CONTEXT_STEPS = weakref.WeakKeyDictionary()


def _context_step(model):
    """Cached tf.functions: memory update, and the loss at the last position."""
    import tensorflow as tf

    cache = _CONTEXT_STEPS.get(model)
    if cache is not None:
        return cache

    @tf.function(reduce_retracing=True)
    def memory_step(x, memory):
        _, new_memory = model.backbone(x, memory, training=False)
        return new_memory

    @tf.function(reduce_retracing=True)
    def loss_step(x, answers, memory):
        hidden, _ = model.backbone(x, memory, training=False)
        log_probs = model.log_probs_from_hidden(hidden[:, -1:])[:, 0]  # (B, V)
        picked = tf.gather(log_probs, answers, axis=1, batch_dims=1)
        return -tf.cast(picked, tf.float64)

    cache = {"memory": memory_step, "loss": loss_step}
    _CONTEXT_STEPS[model] = cache
    return cache


def spread_targets(num_tokens, count, min_position):
    """`count` target positions evenly spread over [min_position, num_tokens)."""
    available = num_tokens - min_position
    if available < 1:
        raise ValueError(
            f"The text has {num_tokens} tokens: no target is left after a "
            f"context of {min_position}. Use shorter contexts or more text."
        )
    count = min(count, available)
    return np.unique(
        np.linspace(min_position, num_tokens - 1, count).round().astype(np.int64)
    )


def loss_table(model, tokens, targets, contexts, segment_length=None,
               batch_size=64, max_window=None):
    """(len(contexts), len(targets)) losses of one model, row k at contexts[k].

    A model without memory sees at most one segment: its window is
    min(c, max_window) tokens (default max_window: its training segment
    length, the window of the Al-Rfou et al. evaluation). A longer
    `max_window` lets a model whose encoding extends (relative) read longer
    windows, as the paper's no-recurrence ablation does. For a model with
    memory `max_window` is ignored and the window is read in segments of
    `segment_length`.
    """
    max_window = checks.positive_int("max_window", max_window, allow_none=True)
    if model.txl_config.memory_length == 0 and max_window:
        segment_length = max_window
    return np.stack([
        context_losses(model, tokens, targets, c, segment_length, batch_size)
        for c in contexts
    ])


# --- reach of the recurrence ----------------------------------------------
def recurrence_reach(num_layers, memory_length, segment_length, position,
                     same_length=False, same_length_convention="official_tf"):
    """Largest distance d such that token p - d can change the output at p.

    With our memory (layer l caches the last M *inputs* of layer l, taken
    in the segment where they were computed, and the (T, M + T) causal mask
    `j <= M + i`), the output at index i of its segment reads, in the last
    layer, keys back to the memory start, i + M tokens back; that key's
    layer input was computed in its own segment and reaches M further back
    from *that* segment's start, i.e. T * ceil(M / T) tokens more per extra
    layer:

        d_max(i) = i + M + (L - 1) * T * ceil(M / T)     (= i + L * M if M = T)

    With `same_length` every query reads exactly M keys back
    ("official_tf", M + 1 keys) or M - 1 ("pytorch", M keys), so
    d_max = L * M or L * (M - 1), independent of i. Without memory (M = 0)
    only the segment itself is visible: d_max = i.

    Args:
        num_layers: int, L.
        memory_length: int, M.
        segment_length: int, T.
        position: int in [0, T), i, the index of the query in its segment.
        same_length: bool.
        same_length_convention: "official_tf" or "pytorch".

    Returns:
        int: token p - d influences the log-probs at p iff 0 <= d <= d_max
        (for generic weights; with a long enough text before p).
    """
    L, M, T, i = num_layers, memory_length, segment_length, position
    if not 0 <= i < T:
        raise ValueError(f"`position` must be in [0, {T}), received {i}.")
    if M == 0:
        return i if not same_length else 0
    if same_length:
        per_layer = M if same_length_convention == "official_tf" else M - 1
        return L * per_layer
    return i + M + (L - 1) * T * math.ceil(M / T)


def perturbation_reach(model, tokens, position, max_distance, tolerance=0.0,
                       segment_length=None):
    """Measures which earlier tokens change the log-probs at one position.

    Reads `tokens` (1-D) segment by segment with the memory carried (no
    gradient crosses segments: the memory is stop-gradient, so the probe
    changes tokens instead), then for every d in [0, max_distance] replaces
    token `position - d` by another id and records the largest absolute
    change of the log-probs at `position`. All perturbed copies run as one
    batch.

    Returns:
        (changes, reach): float array (max_distance + 1,) of max |delta
        log p|, and the largest d whose change exceeds `tolerance` (-1 if
        none).
    """
    import tensorflow as tf

    tokens = np.asarray(tokens, dtype=np.int32)
    T = segment_length or model.txl_config.segment_length
    V = model.txl_config.vocabulary_size
    if not max_distance <= position < len(tokens):
        raise ValueError(
            f"Need max_distance <= position < len(tokens), received "
            f"max_distance={max_distance}, position={position}, "
            f"len(tokens)={len(tokens)}."
        )
    distances = np.arange(max_distance + 1)
    batch = np.repeat(tokens[None, :], len(distances) + 1, axis=0)
    rows = np.arange(1, len(distances) + 1)
    cols = position - distances
    batch[rows, cols] = (batch[rows, cols] + 1 + V // 2) % V  # another id
    end = (position // T + 1) * T  # the segment holding `position`
    if batch.shape[1] < end:
        # Full segments only: tokens after `position` cannot change it
        # (causal mask), and equal shapes keep the rows' arithmetic equal
        # (a short last segment shows float32 noise of ~1 ulp between rows).
        batch = np.pad(batch, ((0, 0), (0, end - batch.shape[1])))
    memory = model.initial_memory(batch.shape[0])
    log_probs = None
    for start in range(0, end, T):
        out = model.call_with_memory(tf.constant(batch[:, start:start + T]), memory)
        memory = out["memory"]
        log_probs = out["log_probs"]
    at = log_probs[:, position % T].numpy().astype(np.float64)  # (1 + D, V)
    changes = np.abs(at[1:] - at[:1]).max(axis=1)
    over = np.nonzero(changes > tolerance)[0]
    return changes, int(over.max()) if len(over) else -1


# --- `txl recl` -------------------------------------------------------------
def _parse_name(spec):
    """'name=path' or 'path' -> (name, path)."""
    if "=" in spec and not os.path.exists(spec):
        name, path = spec.split("=", 1)
        return name, path
    return os.path.basename(os.path.normpath(spec)), spec


def load_tokens(workdir, data=None, split="test", data_dir=None,
                download=False, tfds=None):
    """The split of `data` encoded by the workdir's tokenizer, or the
    workdir's prepared split (`data/{split}/` shards, or the
    `data/{split}.npy` of an older version), when it was encoded by the
    model's tokenizer (`run.check_workdir_tokens`). `tfds`: the
    `text_feature`/`split_names` of a `tfds:` corpus."""
    if data:
        return encode_data(tokenizer_directory(os.path.join(workdir, "model")), data,
                           split, data_dir, download, tfds)
    from keras_txl.training import shards
    from keras_txl.training.run import check_workdir_tokens

    model_dir = os.path.join(workdir, "model")
    if os.path.isdir(model_dir):
        check_workdir_tokens(workdir, split, "model", model_dir,
                             tokenizer_directory(model_dir) or "")
    if shards.is_complete(os.path.join(workdir, "data", split)):
        # The prepared shards (a test split: small enough to hold).
        return np.asarray(shards.ShardedTokens(os.path.join(workdir, "data", split)))
    path = os.path.join(workdir, "data", f"{split}.npy")
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} does not exist; pass --data with the corpus."
        )
    return np.load(path)


def encode_data(tokenizer_dir, data, split="test", data_dir=None, download=False,
                tfds=None):
    """The split of the corpus `data` encoded by the tokenizer in
    `tokenizer_dir`, as int32 ids."""
    from keras_txl.tokenizers import load_tokenizer
    from keras_txl.training.corpora import load_corpus

    tokenizer = load_tokenizer(tokenizer_dir)
    corpus = load_corpus(data, data_dir=data_dir, download=download, **(tfds or {}))
    return np.asarray(tokenizer.encode(corpus.split(split)), dtype=np.int32)


def _bits_name(folder):
    """Bits per token named after what a token is: "bpc" for characters and
    bytes (and for a model with no tokenizer, `folder` None),
    "bits_per_word", ..."""
    if folder is None:
        return "bpc"
    from keras_txl.tokenizers import load_tokenizer

    return load_tokenizer(folder).bits_metric


def check_recl_arguments(args):
    """`txl recl`'s numbers, named by flag before any model or text is read
    (the losses take minutes; a bad --r found after them wastes that, and a
    --batch-size below 1 once gave RECL from uninitialized losses)."""
    def flag_error(flag, expected, value):
        return ValueError(f"{flag} must be {expected}, received {value}.")

    contexts = sorted(set(args.contexts))
    if any(c < 1 for c in contexts):
        raise flag_error("--contexts", "context lengths >= 1",
                         " ".join(map(str, args.contexts)))
    if len(contexts) < 2:
        raise flag_error("--contexts", "at least two different context lengths "
                         "(RECL steps from one to the next)",
                         " ".join(map(str, args.contexts)))
    bad = [r for r in args.r if not 0 < r <= 1]  # NaN fails too
    if bad:
        raise flag_error("--r", "fractions in (0, 1]", " ".join(map(str, args.r)))
    if not (math.isfinite(args.threshold) and 0 <= args.threshold < 1):
        raise flag_error("--threshold", "a relative gain in [0, 1) (0.01 in the "
                         "paper)", args.threshold)
    for flag, value in (("--batch-size", args.batch_size),
                        ("--segment-length", args.segment_length),
                        ("--max-window", args.max_window)):
        if value is not None and value < 1:
            raise flag_error(flag, "a positive integer", value)
    if args.memory_length is not None and args.memory_length < 0:
        raise flag_error("--memory-length", "an integer >= 0", args.memory_length)
    if args.out is not None:
        folder = os.path.dirname(os.path.abspath(args.out))
        if os.path.isdir(args.out):
            raise ValueError(
                f"--out {args.out!r} is a folder: pass the result file's name, e.g. "
                f"{os.path.join(args.out, 'recl.json')!r}.")
        if not os.path.isdir(folder):
            raise ValueError(f"--out {args.out!r}: its folder {folder} does not exist.")
    return contexts


def _load_member(path, from_preset):
    """(model, tokenizer folder or None) of one model of the group: a
    workdir's WORKDIR/model, or a --from-preset folder or handle."""
    if from_preset:
        from keras_txl.sources import preset_model

        return preset_model(path)
    from keras_txl.io import load_pretrained

    model_dir = os.path.join(path, "model")
    if not os.path.isdir(model_dir):
        raise FileNotFoundError(
            f"No trained model in {model_dir} (run `txl train` first)."
        )
    return load_pretrained(model_dir), tokenizer_directory(model_dir)


def recl_main(args):
    """`txl recl`: RECL of a group of trained workdirs (or saved presets,
    `--from-preset`) on one text."""
    contexts = check_recl_arguments(args)
    from_preset = getattr(args, "from_preset", None) is not None
    flag = "--from-preset" if from_preset else "--workdirs"
    specs = [_parse_name(s) for s in (args.from_preset if from_preset else args.workdirs)]
    names = [n for n, _ in specs]
    if len(set(names)) != len(names):
        raise ValueError(
            f"Two models of {flag} have the same name {names}; name them with "
            "NAME=PATH."
        )
    from keras_txl.tokenizers import load_tokenizer
    from keras_txl.tokenizers import tokenizer_fingerprint
    from keras_txl.training.run import tfds_options

    first = None  # the first preset, read for its tokenizer before the text
    if from_preset:
        if not args.data:
            raise ValueError(
                "--from-preset needs --data (the text to score): a preset holds no "
                "prepared splits (those are a training run's, --workdirs).")
        first = _load_member(specs[0][1], True)
        if first[1] is None:
            raise ValueError(
                f"--from-preset {specs[0][1]!r} has no tokenizer (no tokenizer.json and "
                "assets/tokenizer/): the first model of the group tokenizes --data.")
        tokens = encode_data(first[1], args.data, args.split, args.data_dir,
                             args.download, tfds=tfds_options(args))
        bits_folder = first[1]
    else:
        tokens = load_tokens(specs[0][1], args.data, args.split, args.data_dir,
                             args.download, tfds=tfds_options(args))
        bits_folder = tokenizer_directory(os.path.join(specs[0][1], "model"))
    fingerprint = None
    targets = spread_targets(len(tokens), args.targets, max(contexts))
    losses, settings, seconds = {}, {}, {}
    vocabulary = None
    for name, workdir in specs:
        model, folder = first or _load_member(workdir, from_preset)
        first = None
        cfg = model.txl_config
        if vocabulary is not None and cfg.vocabulary_size != vocabulary:
            raise ValueError(
                f"{name} has vocabulary {cfg.vocabulary_size}, the group "
                f"{vocabulary}: RECL compares models on the same tokens."
            )
        vocabulary = cfg.vocabulary_size
        if folder is not None:
            # The same size is not the same tokens: ids must mean the same.
            own = tokenizer_fingerprint(load_tokenizer(folder))
            if fingerprint is not None and own != fingerprint[1]:
                raise ValueError(
                    f"{name}'s tokenizer ({folder}) is not {fingerprint[0]}'s: RECL "
                    "compares models on the same tokens, so the group needs one "
                    "tokenizer.")
            fingerprint = fingerprint or (name, own)
        memory = cfg.memory_length
        if args.memory_length is not None and cfg.memory_length > 0:
            memory = args.memory_length
        eval_model = evaluation_model(model, memory_length=memory)
        start = time.perf_counter()
        losses[name] = loss_table(eval_model, tokens, targets, contexts,
                                  args.segment_length, args.batch_size,
                                  args.max_window)
        seconds[name] = round(time.perf_counter() - start, 1)
        settings[name] = {
            ("from_preset" if from_preset else "workdir"): workdir,
            "attention_type": cfg.attention_type,
            "trained_memory_length": cfg.memory_length,
            "memory_length": memory,
            "reading": (
                f"one window of min(c, {args.max_window or cfg.segment_length})"
                " tokens" if memory == 0 else
                f"segments of {args.segment_length or cfg.segment_length}"
                " with the memory carried"),
        }
        logger.info("%s: losses at %d contexts in %.1fs", name, len(contexts),
                    seconds[name])
    table = recl_table(losses, contexts, args.r, args.threshold, args.hard_set)
    result = {
        "recl": {n: {str(r): v["recl"] for r, v in t.items()}
                 for n, t in table.items()},
        "capped": {n: {str(r): v["capped"] for r, v in t.items()}
                   for n, t in table.items()},
        "gains": {n: {str(r): [round(g, 5) for g in v["gains"]]
                      for r, v in t.items()} for n, t in table.items()},
        f"mean_{_bits_name(bits_folder)}": {
            n: [round(float(row.mean()) / math.log(2), 4) for row in losses[n]]
            for n in names},
        "contexts": contexts, "targets": int(len(targets)),
        "split": args.split, "threshold": args.threshold,
        "hard_set": args.hard_set, "models": settings, "seconds": seconds,
    }
    if args.out:
        # Whole or not at all (a temporary file renamed): a killed or failed
        # write leaves the previous result, never half of one.
        tables = io.BytesIO()
        np.savez(tables, contexts=np.asarray(contexts), targets=targets,
                 **{n: losses[n] for n in names})
        safe_files.atomic_write_bytes(
            os.path.splitext(args.out)[0] + "_losses.npz", tables.getvalue())
        safe_files.atomic_write_bytes(
            args.out, (json.dumps(result, indent=1) + "\n").encode("utf-8"))
    print(json.dumps(result["recl"] | {"contexts": contexts,
                                       "targets": int(len(targets))}))
    ratios = [str(float(r)) for r in args.r]
    print("| model | " + " | ".join(f"RECL r={r}" for r in ratios) + " |")
    print("|---|" + "---:|" * len(ratios))
    for n in names:
        cells = [f"{result['recl'][n][r]}{'+' if result['capped'][n][r] else ''}"
                 for r in ratios]
        print(f"| {n} | " + " | ".join(cells) + " |")
    return 0
