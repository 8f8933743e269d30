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

Distribution: `strategy.experimental_distribute_dataset` splits the batch
dimension of each global batch in order, so under a single-worker
`MirroredStrategy` with `R` replicas, replica `r` receives rows
`[r * B / R, (r + 1) * B / R)` at every step and therefore always the same
streams, in order. Its memory stays valid across steps. See
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

__all__ = ["LMBatches", "batchify", "lm_dataset", "num_segments"]




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
    return array.astype(np.int32, copy=False)


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

    Raises:
        ValueError: if a number is not a positive integer, if `batch_size`
            is not divisible by `num_replicas`, or if a stream is shorter
            than `segment_length + 1` tokens (or 2 tokens when
            `drop_remainder=False`).

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
                f"corpus has {self.num_tokens} tokens: {per_stream} per "
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


def lm_dataset(
    token_ids,
    batch_size: int,
    segment_length: int,
    *,
    num_replicas: int = 1,
    drop_remainder: bool = True,
    repeat: bool = False,
    start_segment: int = 0,
) -> tf.data.Dataset:
    """Ordered `(inputs, targets)` batches for Transformer-XL training.

    Batch `k` holds segment `k` of each of the `B` streams made by
    `batchify`: `inputs[b] = stream_b[k*T:(k+1)*T]` and
    `targets[b] = stream_b[k*T+1:(k+1)*T+1]`. So row `b` of batch `k + 1`
    starts at the token right after the last input of row `b` of batch
    `k`, and the memory a model carries from one batch to the next belongs
    to the same text. Nothing is shuffled.

    Args:
        token_ids: 1-D array-like of int. The corpus as one stream.
        batch_size: int. Global batch size `B` (number of streams).
        segment_length: int. Segment length `T`.
        num_replicas: int. Number of replicas the batch will be distributed
            over; only checked (`B` must be divisible by it). Pass the
            global batch to `strategy.experimental_distribute_dataset`:
            replica `r` then gets rows `[r*B/R, (r+1)*B/R)` every step.
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

    Returns:
        A `tf.data.Dataset` of `(inputs, targets)`, both int32 of shape
        `(B, T)`.

    Raises:
        ValueError: for the errors listed in `LMBatches`, for a
            non-integer `token_ids`, or for a `start_segment` outside
            `[0, steps_per_epoch)` when `repeat=False`.

    Example:

    >>> ds = lm_dataset(np.arange(100), batch_size=2, segment_length=8)
    >>> inputs, targets = next(iter(ds))
    >>> inputs.shape
    TensorShape([2, 8])
    """
    tokens = _as_token_array(token_ids)
    layout = LMBatches(
        num_tokens=int(tokens.size),
        batch_size=batch_size,
        segment_length=segment_length,
        num_replicas=num_replicas,
        drop_remainder=drop_remainder,
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
            f"segment_length={segment_length}, {tokens.size} tokens), so "
            f"start_segment must be in [0, {steps}). Pass repeat=True to "
            "wrap around."
        )

    # (B, S). Captured by the map function as an eager input, not copied
    # into the graph as a constant.
    streams = tf.constant(batchify(tokens, layout.batch_size))
    rows = layout.batch_size
    length = layout.segment_length
    last_input = layout.tokens_per_stream - 1  # targets need one more token

    def segment(index):
        begin = tf.cast(index, tf.int32) * length
        size = tf.minimum(length, last_input - begin)
        inputs = tf.slice(streams, [0, begin], [rows, size])  # (B, T)
        targets = tf.slice(streams, [0, begin + 1], [rows, size])  # (B, T)
        time = length if drop_remainder else None
        inputs.set_shape([rows, time])
        targets.set_shape([rows, time])
        return inputs, targets

    if repeat:
        first = start_segment % steps
        indices = tf.data.Dataset.counter(first).map(lambda k: k % steps)
    else:
        indices = tf.data.Dataset.range(start_segment, steps)
    dataset = indices.map(segment)

    options = tf.data.Options()
    options.deterministic = True
    # There are no files to shard, so AUTO would try FILE, log a warning
    # and fall back to DATA. (Multi-worker input is not tested here: there
    # tf.distribute rebatches each global batch into per-replica pieces
    # and then shards the pieces by element.)
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.DATA
    )
    dataset = dataset.with_options(options)
    logger.debug(
        "lm_dataset: %d tokens -> %d streams of %d, %d segments of %d "
        "(start %d, repeat %s)",
        tokens.size,
        rows,
        layout.tokens_per_stream,
        steps,
        length,
        start_segment,
        repeat,
    )
    return dataset.prefetch(2)
