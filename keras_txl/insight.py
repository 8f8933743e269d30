"""Pictures of what the memory does (PNG, matplotlib's Agg canvas).

- `plot_head`: for one layer and head, the attention probabilities of the
  T queries of a segment over the K = M + T keys `[memory ; segment]`, and
  the score split into the paper's terms (a) content `q_i . k_j`,
  (b) content-position `q_i . W_R R_{i-j}` and (d) global position
  `v . W_R R_{i-j}` (scaled like the scores), the memory/segment boundary
  marked.
- `plot_layer_by_distance`: the paper's Appendix D view, one row per
  head and one column per relative distance `i - j`, averaged over the
  queries of the segment: the attention probability and terms (a), (b),
  (d).
- `plot_loss_by_position`: the mean loss at each position of a segment,
  with the memory and with each segment alone: the "context
  fragmentation" the paper's introduction describes (without memory the
  first tokens of a segment have almost no context).

`attention_report` makes all of them for a token stream; `txl attention`
calls it. Figures are drawn on `matplotlib.figure.Figure` (no pyplot, no
global backend switch), at fixed sizes (`FIGURE_SIZES` inches at `DPI`).

Shape legend: L num_layers, N num_heads, T segment, M memory_length,
K = M + T keys.

Reference:
    Dai et al., 2019, arXiv:1901.02860: section 1 (context
    fragmentation), section 3.3 (terms (a)-(d)), Appendix D.
"""

import json
import os

import numpy as np

from keras_txl.memory import attention_mask

DPI = 100
FIGURE_SIZES = {
    "head": (12.0, 9.0),  # 1200 x 900 pixels
    "distance": (16.0, 4.5),  # 1600 x 450
    "loss": (8.0, 4.5),  # 800 x 450
}
TERMS = (
    ("term_a", "(a) content  q·k"),
    ("term_b", "(b) content-position  q·W_R R"),
    ("term_d", "(d) global position  v·W_R R"),
)
_MAX_TICK_LABELS = 48


# === Numbers ===


def _segments(token_ids, segment_length):
    ids = np.asarray(token_ids, np.int32).reshape(-1)
    if ids.size == 0:
        raise ValueError("`token_ids` is empty: give some text.")
    length = min(segment_length, ids.size)
    count = ids.size // length
    return ids[: count * length].reshape(count, length)  # (S, T)


def segment_attention(model, token_ids, segment=None):
    """Attention details of one segment of a token stream, memory filled.

    Segments 0..s-1 are run first (with the memory carried), then segment
    s with `return_details`.

    Args:
        model: `TransformerXLCausalLM`.
        token_ids: 1-D ints, the text.
        segment: int or None. Which segment (default: the first whose
            memory is full of text, or the last one).

    Returns:
        dict of numpy arrays: "probabilities" (L, N, T, K) and, for a
        relative model, "term_a", "term_b", "term_d" (L, N, T, K); "mask"
        (T, K) bool; "keys" (K,) the id at each key (-1 for memory slots
        with no text yet); "segment", "memory_length", "segment_length".
    """
    cfg = model.txl_config
    segments = _segments(token_ids, cfg.segment_length)
    count, length = segments.shape
    memory_length = cfg.memory_length
    if segment is None:
        segment = min(-(-memory_length // length), count - 1)
    if not 0 <= segment < count:
        raise ValueError(
            f"`segment` must be in [0, {count}) for this text "
            f"({count} segments of {length} tokens), received {segment}."
        )
    memory = model.initial_memory(1)
    for s in range(segment):
        memory = model.call_with_memory(segments[s : s + 1], memory)["memory"]
    _, _, details = model.backbone(
        segments[segment : segment + 1], memory, return_details=True
    )
    out = {
        "segment": segment,
        "memory_length": memory_length,
        "segment_length": length,
    }
    names = ["probabilities", "scores"]
    if cfg.attention_type == "relative":
        names += [name for name, _ in TERMS]
    for name in names:
        out[name] = np.stack(
            [np.asarray(layer[name])[0] for layer in details["attention"]]
        )  # (L, N, T, K)
    past = segments[:segment].reshape(-1)[-memory_length:] if memory_length else []
    keys = np.full(memory_length + length, -1, np.int64)
    if len(past):
        keys[memory_length - len(past) : memory_length] = past
    keys[memory_length:] = segments[segment]
    out["keys"] = keys
    out["mask"] = np.asarray(attention_mask(
        length, memory_length, cfg.same_length, cfg.same_length_convention
    ))  # (T, K)
    return out


def loss_by_position(model, token_ids, max_segments=64):
    """Mean next-token loss at each position of a segment, with and
    without the memory.

    The text is cut into segments of T inputs and their next-token
    targets. "with_memory": the segments in order, the memory carried.
    "without_memory": each segment alone, no memory (`memory_length=0`).
    The first segment is left out of both means when there are more
    (its memory is empty either way).

    Returns:
        dict: "with_memory", "without_memory" ((T,) float, nats),
        "num_segments" (int, in the means).
    """
    ids = np.asarray(token_ids, np.int32).reshape(-1)
    cfg = model.txl_config
    if ids.size < 2:
        raise ValueError("`token_ids` needs at least 2 tokens for a loss.")
    inputs = _segments(ids[:-1], cfg.segment_length)[:max_segments]
    count, length = inputs.shape
    targets = ids[1 : 1 + count * length].reshape(count, length)

    def nll(log_probs, target):
        log_probs = np.asarray(log_probs)
        return -np.take_along_axis(log_probs, target[..., None], -1)[..., 0]

    with_memory, memory = [], model.initial_memory(1)
    for s in range(count):
        out = model.call_with_memory(inputs[s : s + 1], memory)
        memory = out["memory"]
        with_memory.append(nll(out["log_probs"], targets[s : s + 1])[0])
    alone = model.with_settings(memory_length=0)
    without_memory = nll(alone.call_with_memory(inputs)["log_probs"], targets)
    first = 1 if count > 1 else 0
    return {
        "with_memory": np.mean(np.stack(with_memory)[first:], axis=0),
        "without_memory": np.mean(without_memory[first:], axis=0),
        "num_segments": count - first,
    }


def by_distance(values, mask, memory_length):
    """(N, T, K) values -> (N, K) means over queries per distance i - j.

    Column d holds the mean over the allowed cells whose key is d
    positions before the query (d = M + i - j); NaN where there is none.
    """
    heads, length, keys = values.shape
    query = np.arange(length)[:, None]
    key = np.arange(keys)[None, :]
    distance = np.broadcast_to(memory_length + query - key, (length, keys))
    allowed = mask & (distance >= 0)
    d = distance[allowed]  # (cells,)
    counts = np.bincount(d, minlength=keys)[:keys].astype(np.float64)
    out = np.full((heads, keys), np.nan)
    for h in range(heads):
        sums = np.bincount(d, weights=values[h][allowed], minlength=keys)[:keys]
        with np.errstate(invalid="ignore", divide="ignore"):
            out[h] = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return out


# === Pictures ===


def _save_figure(fig, path):
    """Writes `fig` as a PNG whole or not at all (a killed run leaves the
    previous picture, not a cut one)."""
    import io

    from keras_txl.safe_files import atomic_write_bytes

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    atomic_write_bytes(path, buffer.getvalue())


def require_matplotlib():
    """Raises a clear ImportError when matplotlib (the `[plots]` extra) is absent."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise ImportError(
            "The attention pictures need matplotlib, an optional dependency of "
            "keras-txl (Keras imports pyplot in every process where it is "
            "installed): `pip install 'keras-txl[plots]'`."
        ) from error


def _figure(kind, **kwargs):
    from matplotlib.figure import Figure

    return Figure(figsize=FIGURE_SIZES[kind], dpi=DPI, layout="constrained",
                  **kwargs)


def _label(text):
    """A short, font-safe tick label for a token."""
    text = {" ": "·", "\n": "\\n", "\t": "\\t", "": "''"}.get(text, text)
    if not all(32 <= ord(c) < 127 or 160 < ord(c) < 256 for c in text):
        text = text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= 8 else text[:7] + "~"


def _key_labels(keys, token_labels):
    if token_labels is None:
        return [("-" if k < 0 else str(k)) for k in keys]
    return [("-" if k < 0 else _label(token_labels[k])) for k in keys]


def _probability_norm(largest):
    from matplotlib.colors import PowerNorm

    # Square-root scale: a few keys near the diagonal take most of the mass;
    # the tail over the memory would vanish on a linear scale.
    return PowerNorm(gamma=0.5, vmin=0.0, vmax=max(float(largest), 1e-6))


def _heatmap(fig, ax, values, mask, memory_length, title, cmap, label,
             key_labels, query_labels, symmetric=False):
    import matplotlib

    shown = np.where(mask, values, np.nan)
    if symmetric:
        limit = np.nanmax(np.abs(shown)) if np.isfinite(shown).any() else 1.0
        limit = limit or 1.0
        norm = {"vmin": -limit, "vmax": limit}
    else:
        norm = {"norm": _probability_norm(np.nanmax(shown))}
    colormap = matplotlib.colormaps[cmap].copy()
    colormap.set_bad("#d9d9d9")  # masked (future) keys
    image = ax.imshow(shown, aspect="auto", interpolation="nearest",
                      cmap=colormap, **norm)
    colorbar = fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02)
    colorbar.set_label(label)
    length, keys = values.shape
    above = ax.get_xaxis_transform()  # x in data, y in axes units
    if memory_length:
        ax.axvline(memory_length - 0.5, color="black", linewidth=2.0,
                   linestyle="--")
        ax.text(memory_length / 2 - 0.5, 1.01, f"memory ({memory_length})",
                transform=above, ha="center", va="bottom", fontsize=9)
    ax.text(memory_length + length / 2 - 0.5, 1.01, f"segment ({length})",
            transform=above, ha="center", va="bottom", fontsize=9)
    ax.set_title(title, fontsize=11, pad=16)
    ax.set_xlabel("key position  (memory | segment)")
    ax.set_ylabel("query position in segment")
    if keys <= _MAX_TICK_LABELS:
        ax.set_xticks(range(keys))
        ax.set_xticklabels(key_labels, rotation=90, fontsize=7)
        ax.set_yticks(range(length))
        ax.set_yticklabels(query_labels, fontsize=7)


def plot_head(details, layer, head, path, token_labels=None):
    """PNG of one head: probabilities and terms (a), (b), (d), T x K.

    Args:
        details: dict from `segment_attention`.
        layer, head: int.
        path: str, the .png to write.
        token_labels: list of str per id, or None (ids are shown).

    Returns:
        path.
    """
    memory_length = details["memory_length"]
    mask = details["mask"]
    keys = _key_labels(details["keys"], token_labels)
    queries = keys[memory_length:]
    relative = "term_a" in details
    fig = _figure("head")
    axes = fig.subplots(2, 2) if relative else [[fig.subplots(1, 1)]]
    axes = np.asarray(axes).reshape(-1)
    _heatmap(fig, axes[0], details["probabilities"][layer, head], mask,
             memory_length, "attention probability", "viridis",
             "probability (square-root scale)", keys, queries)
    if relative:
        for ax, (name, title) in zip(axes[1:], TERMS):
            _heatmap(fig, ax, details[name][layer, head], mask,
                     memory_length, title, "RdBu_r", "score / sqrt(H)",
                     keys, queries, symmetric=True)
    fig.suptitle(
        f"Layer {layer}, head {head}: segment {details['segment']} "
        f"(T={details['segment_length']}) over memory M={memory_length}"
        " + segment; grey = masked",
        fontsize=13,
    )
    _save_figure(fig, path)
    return path


def plot_layer_by_distance(details, layer, path):
    """PNG in the style of the paper's Appendix D: heads x distance.

    One panel each for the attention probability and terms (a), (b), (d),
    averaged over the queries of the segment at each relative distance.

    Returns:
        path.
    """
    memory_length = details["memory_length"]
    mask = details["mask"]
    panels = [("probabilities", "attention probability", "viridis", False)]
    if "term_a" in details:
        panels += [(name, title, "RdBu_r", True) for name, title in TERMS]
    fig = _figure("distance")
    axes = np.asarray(fig.subplots(1, len(panels))).reshape(-1)
    for ax, (name, title, cmap, symmetric) in zip(axes, panels):
        values = by_distance(details[name][layer], mask, memory_length)
        if symmetric:
            limit = float(np.nanmax(np.abs(values))) or 1.0
            norm = {"vmin": -limit, "vmax": limit}
        else:
            norm = {"norm": _probability_norm(np.nanmax(values))}
        image = ax.imshow(values, aspect="auto", interpolation="nearest",
                          cmap=cmap, **norm)
        fig.colorbar(image, ax=ax, fraction=0.06, pad=0.02).set_label(
            "score / sqrt(H)" if symmetric else "probability (sqrt scale)")
        ax.set_title(title, fontsize=11)
        ax.set_xlabel("relative distance i - j (0 = itself)")
        ax.set_ylabel("head")
        ax.set_yticks(range(values.shape[0]))
    fig.suptitle(
        f"Layer {layer}: mean over the {details['segment_length']} queries "
        f"of segment {details['segment']} (memory M={memory_length})",
        fontsize=12,
    )
    _save_figure(fig, path)
    return path


def plot_loss_by_position(losses, path, memory_length=None):
    """PNG of the mean loss per position, with and without memory.

    Args:
        losses: dict from `loss_by_position`.
        path: str.
        memory_length: int or None, for the legend.

    Returns:
        path.
    """
    fig = _figure("loss")
    ax = fig.subplots(1, 1)
    with_memory = np.asarray(losses["with_memory"])
    without = np.asarray(losses["without_memory"])
    positions = np.arange(with_memory.size)
    memory = f"M={memory_length}" if memory_length is not None else "memory"
    ax.plot(positions, without, marker="o", color="tab:red",
            label=f"segment alone, no memory (mean {without.mean():.3f})")
    ax.plot(positions, with_memory, marker="s", color="tab:blue",
            label=f"with memory, {memory} (mean {with_memory.mean():.3f})")
    ax.set_xlabel("position within the segment")
    ax.set_ylabel("mean next-token loss (nats)")
    ax.set_title(
        "Context fragmentation: loss by position "
        f"({losses['num_segments']} segments)", fontsize=11,
    )
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=9)
    _save_figure(fig, path)
    return path


def attention_report(model, token_ids, out_dir, layers=(0,), heads=(0,),
                     segment=None, max_segments=64, token_labels=None):
    """All the pictures for a token stream, plus `insight.json`.

    Writes `attention_layer{l}_head{h}.png` per chosen layer and head,
    `distance_layer{l}.png` per chosen layer, and `loss_by_position.png`.

    Args:
        model: `TransformerXLCausalLM`.
        token_ids: 1-D ints, the text.
        out_dir: str. Created if needed.
        layers, heads: sequences of int.
        segment: int or None (see `segment_attention`).
        max_segments: int. Segments in the loss-by-position means.
        token_labels: list of str per id, or None.

    Returns:
        list of the written paths.
    """
    require_matplotlib()
    cfg = model.txl_config
    for name, values, count in (("layers", layers, cfg.num_layers),
                                ("heads", heads, cfg.num_heads)):
        bad = [v for v in values if not 0 <= v < count]
        if bad or not len(values):
            raise ValueError(
                f"`{name}` must be non-empty and in [0, {count}), received "
                f"{list(values)}."
            )
    # Every number first: a text or segment that cannot be pictured is an
    # error before any file is written.
    details = segment_attention(model, token_ids, segment)
    losses = loss_by_position(model, token_ids, max_segments)
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for layer in layers:
        for head in heads:
            paths.append(plot_head(
                details, layer, head,
                os.path.join(out_dir, f"attention_layer{layer}_head{head}.png"),
                token_labels,
            ))
        paths.append(plot_layer_by_distance(
            details, layer, os.path.join(out_dir, f"distance_layer{layer}.png")
        ))
    paths.append(plot_loss_by_position(
        losses, os.path.join(out_dir, "loss_by_position.png"),
        memory_length=cfg.memory_length,
    ))
    summary = {
        "segment": details["segment"],
        "segment_length": details["segment_length"],
        "memory_length": details["memory_length"],
        "loss_with_memory": [float(x) for x in losses["with_memory"]],
        "loss_without_memory": [float(x) for x in losses["without_memory"]],
        "num_segments": losses["num_segments"],
        "files": [os.path.basename(p) for p in paths],
    }
    summary_path = os.path.join(out_dir, "insight.json")
    from keras_txl.safe_files import atomic_write_bytes

    atomic_write_bytes(summary_path, (json.dumps(summary, indent=2) + "\n").encode("utf-8"))
    return paths + [summary_path]
