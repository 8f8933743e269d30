"""Ordered language-model batches for Transformer-XL, built with `tf.data`.

Transformer-XL carries a memory of hidden states from one segment to the
next, so the batches must keep the text in order: row `b` of batch `k + 1`
must continue exactly where row `b` of batch `k` stopped. This module does
what the reference code calls "batchify":

1. the corpus, one long 1-D stream of `N` token ids, is cut into `B`
   contiguous streams of `S = N // B` tokens (the last `N % B` tokens are
   dropped); stream `b` holds tokens `[b * S, (b + 1) * S)`;
2. each stream is read left to right in segments of `T` tokens. Batch `k`
   holds, for every stream, the inputs `stream[k*T : (k+1)*T]` and the
   targets `stream[k*T + 1 : (k+1)*T + 1]` (the inputs shifted by one).

Shape legend: N tokens in the corpus, B batch size (number of streams),
S tokens per stream, T segment length, R replicas.

One pipeline serves every reader of ordered segments: the custom training
loop, Keras `fit`, `evaluate` (a shorter last segment, `drop_remainder=False`)
and resuming (`start_segment`). Two ways to distribute it:

- global batches through `strategy.experimental_distribute_dataset` (what
  Keras `fit` does): a single-worker `MirroredStrategy` with `R` replicas
  splits each global batch in order, so replica `r` receives rows
  `[r * B / R, (r + 1) * B / R)` at every step, always the same streams;
- `distributed_lm_dataset` (the custom loop):
  `strategy.distribute_datasets_from_function` with `lm_dataset(...,
  input_context=...)`, where each input pipeline (one per worker) builds only
  its own replicas' rows, per-replica batches in replica order. The same
  rows as above, and also right under `MultiWorkerMirroredStrategy`.

Either way a replica's memory stays valid across steps. See
`LMBatches.replica_rows`.

Reference: Dai et al., "Transformer-XL", arXiv:1901.02860, section 3.2 and
the `batchify` / `LMOrderedIterator` data code of the official release.
"""

from __future__ import annotations

import dataclasses
import logging
import numbers

import numpy as np
import tensorflow as tf

from keras_txl import checks

logger = logging.getLogger(__name__)

__all__ = [
    "LMBatches",
    "batchify",
    "distributed_lm_dataset",
    "lm_dataset",
    "num_segments",
]


def _as_token_array(token_ids) -> np.ndarray:
    array = np.asarray(token_ids)
    if array.ndim != 1:
        raise ValueError(
            "`token_ids` must be a 1-D sequence of integer token ids (the "
            f"whole corpus as one stream). Received shape {array.shape}."
        )
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(
            f"`token_ids` must hold integers. Received dtype {array.dtype}."
        )
    if array.size and (
        array.min() < np.iinfo(np.int32).min
        or array.max() > np.iinfo(np.int32).max
    ):
        raise ValueError(
            "`token_ids` must fit in int32. Received values in "
            f"[{array.min()}, {array.max()}]."
        )
    if array.size and array.min() < 0:
        # A padding or "no token" value: an embedding lookup on a GPU reads
        # zeros for it in silence.
        first = int(np.argmax(array < 0))
        raise ValueError(
            "`token_ids` must be token ids, >= 0 (they index the vocabulary). "
            f"Received token_ids[{first}]={array[first]}."
        )
    return array.astype(np.int32, copy=False)


def _as_token_source(token_ids):
    """A token stream read by offset (`ShardedTokens`: has `read_windows`
    and `len`) as it is, anything else as an int32 array."""
    if hasattr(token_ids, "read_windows") and hasattr(token_ids, "__len__"):
        return token_ids
    return _as_token_array(token_ids)


@dataclasses.dataclass(frozen=True)
class LMBatches:
    """How a corpus is cut into ordered `(inputs, targets)` batches.

    Creating one validates the numbers, so it is also the place where the
    errors for a too-short corpus or an indivisible batch are raised.

    Args:
        num_tokens: int. Length `N` of the token stream.
        batch_size: int. Global batch size `B`, the number of parallel
            streams.
        segment_length: int. Segment length `T`, tokens per row per step.
        num_replicas: int. Number of replicas `R` the global batch is split
            over. `batch_size` must be divisible by it.
        drop_remainder: bool. If True every batch is `(B, T)` and the tail of
            each stream that does not fill a whole segment is skipped. If
            False a last, shorter segment covers it, so every token of each
            stream except the first is a target exactly once (use this for
            evaluation).
        name: str. What the tokens are, as the errors name them (e.g.
            "The train split"); not part of the layout.

    Raises:
        ValueError: if a number is not a positive integer, if `batch_size`
            is not divisible by `num_replicas`, or if a stream is shorter
            than `segment_length + 1` tokens (or 2 tokens when
            `drop_remainder=False`), or if there are no tokens.

    Example:

    >>> batches = LMBatches(num_tokens=1000, batch_size=4, segment_length=10)
    >>> batches.steps_per_epoch  # (1000 // 4 - 1) // 10
    24
    """

    num_tokens: int
    batch_size: int
    segment_length: int
    num_replicas: int = 1
    drop_remainder: bool = True
    name: str = dataclasses.field(default="corpus", compare=False)

    def __post_init__(self):
        if (
            isinstance(self.num_tokens, bool)
            or not isinstance(self.num_tokens, numbers.Integral)
            or self.num_tokens < 0
        ):
            raise ValueError(
                "`num_tokens` must be a non-negative integer. Received: "
                f"num_tokens={self.num_tokens!r}."
            )
        batch_size = checks.positive_int("batch_size", self.batch_size)
        segment_length = checks.positive_int(
            "segment_length", self.segment_length
        )
        num_replicas = checks.positive_int("num_replicas", self.num_replicas)
        if batch_size % num_replicas:
            raise ValueError(
                f"batch_size={batch_size} must be divisible by "
                f"num_replicas={num_replicas}: each replica gets a contiguous "
                "block of batch_size / num_replicas rows (streams). Use a "
                f"batch size that is a multiple of {num_replicas}."
            )
        if self.num_tokens == 0:
            raise ValueError(f"{self.name} is empty (0 tokens).")
        per_stream = self.num_tokens // batch_size
        needed = segment_length + 1 if self.drop_remainder else 2
        if per_stream < needed:
            what = (
                f"segment_length={segment_length} needs at least "
                f"{needed} per stream"
                if self.drop_remainder
                else "drop_remainder=False needs at least 2 per stream "
                "(one input and its target)"
            )
            raise ValueError(
                f"{self.name} has {self.num_tokens} tokens: {per_stream} per "
                f"stream for batch_size={batch_size}, but {what}. Use a "
                "longer corpus, a smaller batch_size or a shorter "
                "segment_length."
            )

    @property
    def tokens_per_stream(self) -> int:
        """int. Tokens `S = N // B` in each of the `B` streams."""
        return self.num_tokens // self.batch_size

    @property
    def steps_per_epoch(self) -> int:
        """int. Number of batches (segments per stream) in one epoch."""
        full, rest = divmod(self.tokens_per_stream - 1, self.segment_length)
        return full + (1 if rest and not self.drop_remainder else 0)

    @property
    def tokens_per_epoch(self) -> int:
        """int. Number of target tokens in one epoch, over all streams."""
        if self.drop_remainder:
            per_stream = self.steps_per_epoch * self.segment_length
        else:
            per_stream = self.tokens_per_stream - 1
        return per_stream * self.batch_size

    @property
    def rows_per_replica(self) -> int:
        """int. Rows (streams) each replica receives per step, `B / R`."""
        return self.batch_size // self.num_replicas

    def replica_rows(self, replica_id: int) -> tuple[int, int]:
        """Rows `[start, stop)` of the global batch that replica gets.

        This is the split `tf.distribute` makes when the global batch goes
        through `experimental_distribute_dataset` under a single-worker
        `MirroredStrategy`: contiguous blocks, in replica order.

        Args:
            replica_id: int. Replica index in `[0, num_replicas)`.

        Returns:
            A `(start, stop)` tuple of row indices.
        """
        if (
            isinstance(replica_id, bool)
            or not isinstance(replica_id, numbers.Integral)
            or not 0 <= replica_id < self.num_replicas
        ):
            raise ValueError(
                "`replica_id` must be an integer in [0, num_replicas="
                f"{self.num_replicas}). Received: replica_id={replica_id!r}."
            )
        start = int(replica_id) * self.rows_per_replica
        return start, start + self.rows_per_replica


def num_segments(
    num_tokens: int,
    batch_size: int,
    segment_length: int,
    drop_remainder: bool = True,
) -> int:
    """Number of batches one epoch of `lm_dataset` yields.

    Args:
        num_tokens: int. Length of the token stream.
        batch_size: int. Number of parallel streams.
        segment_length: int. Tokens per row per batch.
        drop_remainder: bool. As in `lm_dataset`.

    Returns:
        int. `(num_tokens // batch_size - 1) // segment_length`, plus one
        when `drop_remainder=False` and a shorter last segment remains.
    """
    return LMBatches(
        num_tokens=num_tokens,
        batch_size=batch_size,
        segment_length=segment_length,
        drop_remainder=drop_remainder,
    ).steps_per_epoch


def batchify(token_ids, batch_size: int) -> np.ndarray:
    """Splits one token stream into `batch_size` contiguous streams.

    Args:
        token_ids: 1-D array-like of int. The corpus as one stream, `(N,)`.
        batch_size: int. Number of streams `B`.

    Returns:
        An int32 numpy array of shape `(B, N // B)` whose row `b` is
        `token_ids[b * S:(b + 1) * S]` with `S = N // B`. The last `N % B`
        tokens are dropped, as in the reference code.

    Raises:
        ValueError: if `token_ids` is not 1-D integer data, if `batch_size`
            is not a positive integer or if there are fewer than
            `batch_size` tokens.

    Example:

    >>> batchify(np.arange(10), 3)
    array([[0, 1, 2],
           [3, 4, 5],
           [6, 7, 8]], dtype=int32)
    """
    batch_size = checks.positive_int("batch_size", batch_size)
    tokens = _as_token_array(token_ids)
    per_stream = tokens.size // batch_size
    if per_stream < 1:
        raise ValueError(
            f"corpus has {tokens.size} tokens, fewer than "
            f"batch_size={batch_size}: every stream needs at least one "
            "token."
        )
    return tokens[: per_stream * batch_size].reshape(batch_size, per_stream)


def _checked_layout(
    num_tokens,
    batch_size,
    segment_length,
    *,
    num_replicas=1,
    drop_remainder=True,
    repeat=False,
    start_segment=0,
    name="corpus",
):
    """`(LMBatches, start_segment)` after every check of `lm_dataset`."""
    layout = LMBatches(
        num_tokens=num_tokens,
        batch_size=batch_size,
        segment_length=segment_length,
        num_replicas=num_replicas,
        drop_remainder=drop_remainder,
        name=name,
    )
    steps = layout.steps_per_epoch
    if (
        isinstance(start_segment, bool)
        or not isinstance(start_segment, numbers.Integral)
        or start_segment < 0
    ):
        raise ValueError(
            "`start_segment` must be a non-negative integer. Received: "
            f"start_segment={start_segment!r}."
        )
    start_segment = int(start_segment)
    if not repeat and start_segment >= steps:
        raise ValueError(
            f"start_segment={start_segment} is past the end of the data: "
            f"one epoch has {steps} segments (batch_size={batch_size}, "
            f"segment_length={segment_length}, {num_tokens} tokens), so "
            f"start_segment must be in [0, {steps}). Pass repeat=True to "
            "wrap around."
        )
    return layout, start_segment


def lm_dataset(
    token_ids,
    batch_size: int,
    segment_length: int,
    *,
    num_replicas: int = 1,
    drop_remainder: bool = True,
    repeat: bool = False,
    start_segment: int = 0,
    input_context=None,
    name: str = "corpus",
) -> tf.data.Dataset:
    """Ordered `(inputs, targets)` batches for Transformer-XL.

    Batch `k` holds segment `k` of each of the `B` streams made by
    `batchify`: `inputs[b] = stream_b[k*T:(k+1)*T]` and
    `targets[b] = stream_b[k*T+1:(k+1)*T+1]`. So row `b` of batch `k + 1`
    starts at the token right after the last input of row `b` of batch
    `k`, and the memory a model carries from one batch to the next belongs
    to the same text. Nothing is shuffled.

    The one ordered-segment pipeline of the project: the custom loop (with
    `input_context`, through `distributed_lm_dataset`), Keras `fit` (global
    batches) and `evaluate` (`drop_remainder=False`) all read their
    segments from it.

    Args:
        token_ids: 1-D array-like of int. The corpus as one stream; or
            a `training.shards.ShardedTokens` (the prepared shards), read
            window by window, never whole: the same batches.
        batch_size: int. Global batch size `B` (number of streams).
        segment_length: int. Segment length `T`.
        num_replicas: int. Number of replicas the batch will be distributed
            over (`B` must be divisible by it). Without `input_context` it
            is only checked: pass the global batch to
            `strategy.experimental_distribute_dataset`, and under a
            single-worker `MirroredStrategy` replica `r` gets rows
            `[r*B/R, (r+1)*B/R)` every step. With `input_context` it is
            taken from the context (a different value is an error).
        drop_remainder: bool. If True (training) all batches are `(B, T)`
            and the tail of the streams that does not fill a segment is not
            used. If False (evaluation) a last, shorter batch `(B, t)` with
            `t < T` covers it; the time dimension is then `None` in the
            element spec.
        repeat: bool. If True the dataset is infinite: after the last
            segment it starts again at segment 0 (reset the memory there;
            `LMBatches.steps_per_epoch` tells when).
        start_segment: int. Index of the first batch, for resuming: the
            result equals the full dataset with the first `start_segment`
            batches skipped, without reading them. With `repeat=True` any
            value is allowed and taken modulo the epoch length, so the
            global step count can be passed directly.
        input_context: optional `tf.distribute.InputContext`, as
            `strategy.distribute_datasets_from_function` passes it. The
            dataset then holds only the rows of the replicas this input
            pipeline feeds (pipeline `p` of `P` feeds replicas
            `[p*R/P, (p+1)*R/P)`, each replica `r` its rows
            `[r*B/R, (r+1)*B/R)`), one per-replica batch `(B/R, T)` per
            element, replica after replica within a step. Auto-sharding is
            off: the rows are already this pipeline's.
        name: str. What `token_ids` are, in the errors (e.g. "The train
            split").

    Returns:
        A `tf.data.Dataset` of `(inputs, targets)`, both int32 of shape
        `(B, T)` (`(B/R, T)` with `input_context`).

    Raises:
        ValueError: for the errors listed in `LMBatches`, for a
            non-integer `token_ids`, for a `start_segment` outside
            `[0, steps_per_epoch)` when `repeat=False`, or for a
            `num_replicas` that contradicts `input_context`.

    Example:

    >>> ds = lm_dataset(np.arange(100), batch_size=2, segment_length=8)
    >>> inputs, targets = next(iter(ds))
    >>> inputs.shape
    TensorShape([2, 8])
    """
    tokens = _as_token_source(token_ids)
    if input_context is not None:
        replicas = input_context.num_replicas_in_sync
        if num_replicas not in (1, replicas):
            raise ValueError(
                f"num_replicas={num_replicas!r} contradicts the input "
                f"context, which has {replicas} replicas in sync. Leave "
                "num_replicas out when passing input_context."
            )
        num_replicas = replicas
    layout, start_segment = _checked_layout(
        len(tokens),
        batch_size,
        segment_length,
        num_replicas=num_replicas,
        drop_remainder=drop_remainder,
        repeat=repeat,
        start_segment=start_segment,
        name=name,
    )
    steps = layout.steps_per_epoch
    local_replicas = 1
    first, rows = 0, layout.batch_size
    if input_context is not None:
        pipelines = input_context.num_input_pipelines
        local_replicas = num_replicas // pipelines
        # Only the rows of the replicas this pipeline feeds.
        first = (
            input_context.input_pipeline_id
            * local_replicas
            * layout.rows_per_replica
        )
        rows = local_replicas * layout.rows_per_replica
    length = layout.segment_length
    per_stream = layout.tokens_per_stream
    last_input = per_stream - 1  # targets need one more token
    time_dim = length if drop_remainder else None
    if isinstance(tokens, np.ndarray):
        # (rows, S), captured by the map function as an eager input, not
        # copied into the graph as a constant.
        streams = tf.constant(
            batchify(tokens, layout.batch_size)[first : first + rows]
        )

        def window(begin, size):  # (rows, size + 1)
            return tf.slice(streams, [0, begin], [rows, size + 1])

    else:
        # Shards: each step reads its (rows, T + 1) window by offset, so
        # nothing but the window is in memory. Stream b starts at b * S.
        row_starts = (np.arange(first, first + rows, dtype=np.int64) * per_stream)

        def read(begin, size):
            return tokens.read_windows(row_starts + int(begin), int(size) + 1)

        def window(begin, size):
            out = tf.numpy_function(read, [begin, size], tf.int32, stateful=False)
            out.set_shape([rows, None])
            return out

    def segment(index):
        begin = tf.cast(index, tf.int32) * length
        size = tf.minimum(length, last_input - begin)
        both = window(begin, size)  # (rows, size + 1)
        inputs = both[:, :-1]  # (rows, T)
        targets = both[:, 1:]  # (rows, T)
        inputs.set_shape([rows, time_dim])
        targets.set_shape([rows, time_dim])
        return inputs, targets

    if repeat:
        first_segment = start_segment % steps
        indices = tf.data.Dataset.counter(first_segment).map(
            lambda k: k % steps
        )
    else:
        indices = tf.data.Dataset.range(start_segment, steps)
    dataset = indices.map(segment)
    if input_context is not None and local_replicas > 1:
        # (local replicas * b, T) per step -> one (b, T) element per local
        # replica, in replica order: tf.distribute hands them out so.
        per_replica = layout.rows_per_replica

        def split(inputs, targets):
            shape = [local_replicas, per_replica, -1]
            return tf.reshape(inputs, shape), tf.reshape(targets, shape)

        dataset = dataset.map(split).unbatch()

    options = tf.data.Options()
    options.deterministic = True
    if input_context is not None:
        policy = tf.data.experimental.AutoShardPolicy.OFF
    else:
        # There are no files to shard, so AUTO would try FILE, log a
        # warning and fall back to DATA. (Multi-worker input this way is
        # not tested; `distributed_lm_dataset` is.)
        policy = tf.data.experimental.AutoShardPolicy.DATA
    options.experimental_distribute.auto_shard_policy = policy
    dataset = dataset.with_options(options)
    logger.debug(
        "lm_dataset: %d tokens -> %d streams of %d (%d here), %d segments "
        "of %d (start %d, repeat %s)",
        len(tokens),
        layout.batch_size,
        layout.tokens_per_stream,
        rows,
        steps,
        length,
        start_segment,
        repeat,
    )
    return dataset.prefetch(2)


def distributed_lm_dataset(
    strategy,
    token_ids,
    batch_size: int,
    segment_length: int,
    **kwargs,
):
    """`lm_dataset` per input pipeline, as a distributed dataset.

    `strategy.distribute_datasets_from_function` with
    `lm_dataset(..., input_context=context)`: each input pipeline (one per
    worker) builds only its replicas' rows, so replica `r` (its id in the
    sync group) receives rows `[r*B/R, (r+1)*B/R)` of every global batch,
    under the default, Mirrored, MultiWorkerMirrored and TPU strategies
    alike. The arguments are checked here, before any worker builds its
    pipeline.

    Args:
        strategy: a `tf.distribute.Strategy`.
        token_ids, batch_size, segment_length: as in `lm_dataset`.
        **kwargs: the other keyword arguments of `lm_dataset`
            (`drop_remainder`, `repeat`, `start_segment`, `name`), not
            `num_replicas` or `input_context`.

    Returns:
        A `tf.distribute.DistributedDataset` of per-replica `(inputs,
        targets)`, int32 `(B/R, T)`.
    """
    for key in ("num_replicas", "input_context"):
        if key in kwargs:
            raise TypeError(
                f"distributed_lm_dataset() takes `{key}` from the strategy; "
                f"do not pass it (received {key}={kwargs[key]!r})."
            )
    tokens = _as_token_source(token_ids)
    # Every error (short corpus, batch not divisible, start past the end)
    # here, in the caller, rather than inside tf.distribute.
    _checked_layout(
        len(tokens),
        batch_size,
        segment_length,
        num_replicas=strategy.num_replicas_in_sync,
        **kwargs,
    )
    return strategy.distribute_datasets_from_function(
        lambda context: lm_dataset(
            tokens, batch_size, segment_length, input_context=context, **kwargs
        )
    )
