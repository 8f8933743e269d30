"""A tokenized corpus split as flat token files ("shards"), written once.

Layout of one split's folder (`WORKDIR/data/{split}/`):

    shard-00000.bin ...   the token ids, little-endian uint16 (vocabularies
                          up to 65,536) or int32, nothing else: token i of
                          the split is at byte i * itemsize of the
                          concatenated shards
    progress.json         while writing: the finished shards (file, tokens,
                          sha256, where in the source the next one starts)
    index.json            written last: the finished split (files, tokens,
                          sha256 of each; the total, the dtype, the largest
                          id, the key, and `tokens_sha256`: the sha256 of
                          the whole token stream, whatever its shards)

Why flat files: the ordered batches read, at every step, one window of
`T + 1` tokens at a known offset of each of `B` streams, and a resumed run
starts at an offset computed from the step. A flat file answers both with
one positional read (`os.pread`) and no index; TFRecord/ArrayRecord would
add per-record framing and (TFRecord) sequential-only access, so an exact
resume would have to read through everything before it. Reads use `pread`
rather than a memory map: the pages of a map count in the process's RSS
once touched, so a long run over a large corpus would grow it; a `pread`
copies only the window (docs/data.md, "Shards").

Writing is resumable and deterministic: the source is read in chunks that
end at newlines (`CorpusSource.chunks`), each chunk is encoded and appended
to the current shard; shard i holds exactly the tokens `[i * shard_tokens,
(i + 1) * shard_tokens)` of the split (the last one fewer), whatever the
chunk sizes. It is written as `*.tmp`, fsynced, renamed, and
only then recorded in `progress.json` (atomically) with the cursor of the
next chunk. A killed run restarts from the last recorded shard, so it
finishes with the same bytes as an uninterrupted run.

Two identities: the index's `key` says what the shards were made from and
how (the source, the text rules, the tokenizer and the shard size: `txl prepare` rewrites
shards of another key); `ShardedTokens.key` says which tokens they hold,
`tokens-sha256:<tokens_sha256>`, the same for any shard size. A
checkpoint records the second (its data position is an offset in the
token stream: the ordered batches read by offset, never by shard), so
re-sharding the same tokens keeps a resume exact.
"""

import collections
import hashlib
import json
import logging
import os
import threading
import time

import numpy as np

from keras_txl.io import atomic_write_bytes
from keras_txl.io import sha256_file

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_SHARD_TOKENS",
    "FORMAT",
    "MAX_OPEN_SHARDS",
    "MIN_SHARD_TOKENS",
    "ShardedTokens",
    "is_complete",
    "tokens_sha256",
    "write_split",
]

FORMAT = "keras-txl-shards/1"
DEFAULT_SHARD_TOKENS = 1 << 26  # 64M tokens: 128 MB (uint16) or 256 MB (int32)
# The smallest `--shard-tokens` (`txl prepare`/`train`): every shard is a
# file, fsynced and recorded once, so one token per shard would make a file
# (and an fsync) per token. `write_split` itself takes any size (tests cut
# tiny splits into many shards).
MIN_SHARD_TOKENS = 1024
# Shard files a `ShardedTokens` keeps open at most (the least recently read
# is closed past it): a small --shard-tokens on a large corpus makes
# thousands of shards, more than `ulimit -n` (often 1024) allows open.
MAX_OPEN_SHARDS = 64
INDEX = "index.json"
PROGRESS = "progress.json"


def _write_json(path, data):
    atomic_write_bytes(path, (json.dumps(data, indent=1) + "\n").encode())


def _read_json(path):
    """A JSON object (index.json, progress.json), or a ValueError naming the
    file and the folder to delete."""
    why = None
    try:
        with open(path) as handle:
            data = json.load(handle)
        if not isinstance(data, dict):
            why = f"a JSON {type(data).__name__}, not an object"
    except ValueError as error:
        why = f"not valid JSON ({error})"
    except OSError as error:
        why = f"not a readable file ({error.strerror})"
    if why:
        raise ValueError(f"{path} is {why}; delete {os.path.dirname(path)} to "
                         "prepare it again.")
    return data


def _check_index(path, index):
    """The fields `ShardedTokens` reads from an index.json, with their types:
    an index edited by hand (or written by something else) is a ValueError
    naming it, not a KeyError or TypeError from deep inside."""
    why = None
    listed = index.get("shards")
    if index.get("dtype") not in ("<u2", "<i4"):
        why = f'"dtype" is {index.get("dtype")!r}, expected "<u2" or "<i4"'
    elif not isinstance(listed, list):
        why = f'"shards" is {type(listed).__name__}, expected a list'
    else:
        for number, shard in enumerate(listed):
            tokens = shard.get("tokens") if isinstance(shard, dict) else None
            if not (isinstance(shard, dict) and isinstance(shard.get("file"), str)
                    and isinstance(shard.get("sha256"), str)
                    and isinstance(tokens, int) and not isinstance(tokens, bool)
                    and tokens >= 0):
                why = (f'shard {number} is {shard!r}, expected {{"file": str, '
                       '"tokens": int >= 0, "sha256": str}')
                break
    if why:
        raise ValueError(f"{path} is not an index of shards: {why}. Delete "
                         f"{os.path.dirname(path)} and prepare again.")


def dtype_for(vocabulary_size):
    """`"<u2"` for up to 65,536 ids, else `"<i4"`."""
    return "<u2" if vocabulary_size <= 1 << 16 else "<i4"


def is_complete(folder, key=None) -> bool:
    """True if `folder` holds a finished split (with this `key`)."""
    path = os.path.join(folder, INDEX)
    if not os.path.isfile(path):
        return False
    return key is None or _read_json(path).get("key") == key


class ShardedTokens:
    """A split's token stream, read from its shards by offset.

    Behaves like the 1-D int32 array of the split without holding it:
    `len()`, `read(start, stop)`, `read_windows(starts, length)`;
    `np.asarray(shards)` reads it all (small splits, tests). Each shard
    is hashed against its sha256 in the index when it is first read (or
    all at once by `verify`): a changed one is a ValueError naming it.

    `key` identifies the tokens, not their files: `tokens-sha256:<hex>`
    (the index's `tokens_sha256`, the same for any shard size), or the
    index's `key` for an index written before `tokens_sha256` existed.
    Training records it in every checkpoint and refuses to resume on
    another. It is never taken on trust: reading it first runs `verify`
    (once), which also recomputes `tokens_sha256` from the shards' bytes,
    so an index edited by hand (or shards copied in from another split with
    their sha256s) is an error, not a key of other tokens.

    Args:
        folder: str. A split folder with an `index.json` (see the module).
    """

    def __init__(self, folder):
        self.folder = os.fspath(folder)
        path = os.path.join(self.folder, INDEX)
        if not os.path.isfile(path):
            raise ValueError(f"{self.folder} holds no finished shards ({INDEX} is "
                             "missing): run `txl prepare` again to finish them.")
        index = _read_json(path)
        if index.get("format") != FORMAT:
            raise ValueError(f"{path} has format {index.get('format')!r}, expected {FORMAT!r}.")
        _check_index(path, index)
        self.index = index
        self.dtype = np.dtype(index["dtype"])
        self.max_id = int(index.get("max_id", -1))
        content = index.get("tokens_sha256")
        self._key = f"tokens-sha256:{content}" if content else index.get("key")
        # Whether `verify` has checked every shard and the whole stream.
        self._stream_checked = False
        sizes, self._paths = [], []
        for shard in index["shards"]:
            file = os.path.join(self.folder, os.path.basename(shard["file"]))
            expected = int(shard["tokens"]) * self.dtype.itemsize
            if not os.path.isfile(file):
                raise ValueError(
                    f"shard {file} is missing (listed in {path}): the shards are "
                    f"damaged; delete {self.folder} and prepare again.")
            actual = os.path.getsize(file)
            if actual != expected:
                raise ValueError(
                    f"shard {file} has {actual} bytes, the index says {expected}: the "
                    f"shards are damaged; delete {self.folder} and prepare again.")
            sizes.append(int(shard["tokens"]))
            self._paths.append(file)
        self._starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self.num_tokens = int(self._starts[-1])
        # Open shard files, least recently read first (see `_fd`).
        self._fds = collections.OrderedDict()
        # `read` looks up a descriptor then reads it, while another thread's
        # read could close it (`_fd` keeps `MAX_OPEN_SHARDS`).
        self._lock = threading.Lock()
        # The shards already hashed against the index (see `_fd`).
        self._verified = set()

    def __len__(self):
        return self.num_tokens

    @property
    def key(self):
        """The tokens' identity (see the class), after `verify`."""
        self.verify()
        return self._key

    def __repr__(self):
        return (f"ShardedTokens({self.folder!r}, {self.num_tokens} tokens, "
                f"{len(self._paths)} shards)")

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_fds"] = collections.OrderedDict()
        del state["_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _fd(self, shard):
        """The open file of `shard`. Each shard is hashed against its sha256
        in the index when it is first opened, through the descriptor then
        read: a shard changed since it was written (same size, other bytes)
        is an error before any of its tokens is used, whoever opened the
        split (`txl recl`, the Python API) and whether or not `verify` ran.
        At first use rather than at every read: the hash streams the whole
        file (about 1 s per GB), once per process, which the ordered batches
        pay anyway as they read every shard; re-hashing at each read would
        cost the file per window.

        At most `MAX_OPEN_SHARDS` stay open: past it the least recently read
        one is closed (reopened when read again, not hashed again)."""
        fd = self._fds.get(shard)
        if fd is not None:
            self._fds.move_to_end(shard)
            return fd
        fd = os.open(self._paths[shard], os.O_RDONLY)
        try:
            if shard not in self._verified:
                with os.fdopen(os.dup(fd), "rb") as handle:
                    self._check(shard, hashlib.file_digest(handle, "sha256").hexdigest())
        except BaseException:
            os.close(fd)
            raise
        self._fds[shard] = fd
        while len(self._fds) > MAX_OPEN_SHARDS:
            os.close(self._fds.popitem(last=False)[1])
        return fd

    def _check(self, shard, digest):
        if digest != self.index["shards"][shard]["sha256"]:
            raise ValueError(
                f"shard {self._paths[shard]} does not match its sha256 in {INDEX}: it "
                f"changed since it was written. Delete {self.folder} and prepare again "
                "(`txl prepare` with the same --data and --workdir).")
        self._verified.add(shard)

    def close(self):
        for fd in self._fds.values():
            os.close(fd)
        self._fds = collections.OrderedDict()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def read(self, start, stop) -> np.ndarray:
        """Tokens `[start, stop)` as int32."""
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= self.num_tokens:
            raise ValueError(f"read({start}, {stop}) is outside [0, {self.num_tokens}].")
        out = np.empty(stop - start, np.int32)
        shard = int(np.searchsorted(self._starts, start, side="right")) - 1
        done, item = 0, self.dtype.itemsize
        while start + done < stop:
            base = int(self._starts[shard])
            take = min(stop - start - done, int(self._starts[shard + 1]) - (start + done))
            with self._lock:
                data = os.pread(self._fd(shard), take * item, (start + done - base) * item)
            if len(data) != take * item:
                raise ValueError(f"shard {self._paths[shard]} is shorter than its index says.")
            out[done:done + take] = np.frombuffer(data, self.dtype)
            done += take
            shard += 1
        return out

    def read_windows(self, starts, length) -> np.ndarray:
        """`(len(starts), length)` int32: row i is `read(starts[i], starts[i] + length)`."""
        starts = np.asarray(starts, np.int64).reshape(-1)
        out = np.empty((starts.size, int(length)), np.int32)
        for row, start in enumerate(starts.tolist()):
            out[row] = self.read(start, start + int(length))
        return out

    def __array__(self, dtype=None, copy=None):
        array = self.read(0, self.num_tokens)
        return array if dtype is None else array.astype(dtype)

    def verify(self):
        """Hashes every shard not hashed yet against the index now (rather
        than at its first read, `_fd`), and the whole token stream against
        the index's `tokens_sha256` (in the same read, once per object);
        raises if one differs."""
        if self._stream_checked:
            return
        content = self.index.get("tokens_sha256")
        if not content:  # an index older than tokens_sha256: shards only
            for shard, path in enumerate(self._paths):
                if shard not in self._verified:
                    self._check(shard, sha256_file(path))
        else:
            stream, digests = _stream_digests(self._paths, self.dtype)
            for shard, digest in enumerate(digests):
                if shard not in self._verified:
                    self._check(shard, digest)
            if stream != content:
                raise ValueError(
                    f"{os.path.join(self.folder, INDEX)}: its tokens_sha256 {content} is "
                    f"not the sha256 of the tokens its shards hold ({stream}): the index "
                    "was edited, or shards were copied in from elsewhere. Delete "
                    f"{self.folder} and prepare again (`txl prepare` with the same "
                    "--data and --workdir).")
        self._stream_checked = True


def tokens_sha256(paths, dtype, expected=None):
    """sha256 of the token stream held by the shard files `paths` (in
    order): the ids as little-endian int32, so it depends on the tokens
    only, not on where the shards cut them nor on their `dtype`.

    `expected`: the sha256 of each file, as recorded when it was written;
    a file that no longer matches is a ValueError (the stream's hash is
    never taken over damaged bytes)."""
    stream, digests = _stream_digests(paths, dtype)
    for path, own, recorded in zip(paths, digests, expected or digests):
        if own != recorded:
            raise ValueError(
                f"shard {path} changed after it was written (its sha256 no longer "
                f"matches the one recorded in {PROGRESS}). Run `txl prepare` again: "
                "it re-encodes the shards that do not match.")
    return stream


def _stream_digests(paths, dtype):
    """`(tokens_sha256, [sha256 of each file])` of the shard files `paths`,
    in one read of each."""
    dtype = np.dtype(dtype)
    digest, digests = hashlib.sha256(), []
    block = (1 << 22) * dtype.itemsize  # whole tokens: 4M per read
    for path in paths:
        own = hashlib.sha256()
        with open(path, "rb") as handle:
            for data in iter(lambda handle=handle: handle.read(block), b""):
                own.update(data)
                digest.update(np.frombuffer(data, dtype).astype("<i4").tobytes())
        digests.append(own.hexdigest())
    return digest.hexdigest(), digests


def _recorded_shards_intact(folder, shards, dtype, split):
    """The recorded shards of an unfinished split up to the first one that is
    missing, of the wrong size or does not match its sha256 (re-encoded from
    there: a resumed run must not build on damaged bytes)."""
    item = np.dtype(dtype).itemsize
    for number, shard in enumerate(shards):
        path = os.path.join(folder, shard["file"])
        why = None
        if not os.path.isfile(path):
            why = "is missing"
        elif os.path.getsize(path) != shard["tokens"] * item:
            why = f"has {os.path.getsize(path)} bytes, not {shard['tokens'] * item}"
        elif sha256_file(path) != shard["sha256"]:
            why = "does not match its recorded sha256"
        if why is not None:
            logger.warning("prepare %s: recorded shard %s %s: encoding again from "
                           "shard %d", split, path, why, number)
            return shards[:number]
    return shards


class _Progress:
    """Progress lines on the log (stderr): MB read, tokens, MB/s."""

    def __init__(self, split, every=5.0):
        self.split, self.every = split, every
        self.start = self.last = time.perf_counter()
        self.bytes = self.tokens = 0

    def update(self, nbytes, ntokens, force=False):
        self.bytes += nbytes
        self.tokens += ntokens
        now = time.perf_counter()
        if force or now - self.last >= self.every:
            self.last = now
            rate = self.bytes / max(now - self.start, 1e-9) / 1e6
            logger.info("prepare %s: %.1fM characters read, %d tokens, %.1fM characters/s",
                        self.split, self.bytes / 1e6, self.tokens, rate)


def write_split(folder, chunks, encode, *, key, dtype, split="split",
                shard_tokens=DEFAULT_SHARD_TOKENS, after_shard=None):
    """Writes (or finishes) one split's shards; returns its `ShardedTokens`.

    Args:
        folder: str. The split's folder (created).
        chunks: callable `cursor -> iterable of (text, cursor_after)`, e.g.
            `lambda c: source.chunks("train", c)`.
        encode: callable `text -> int array`.
        key: dict or str. What the shards are made from (source, tokenizer,
            options); a folder with another key is refused, not reused.
        dtype: str. `"<u2"` or `"<i4"` (see `dtype_for`).
        split: str. Name for the logs.
        shard_tokens: int. Tokens per shard (the last one holds the rest).
        after_shard: optional callable `(shard_number) -> None`, called
            after each shard is recorded (tests kill the process there).

    Returns:
        `ShardedTokens` of the finished split.
    """
    if (isinstance(shard_tokens, bool) or not isinstance(shard_tokens, (int, np.integer))
            or shard_tokens < 1):
        raise ValueError(f"`shard_tokens` must be a positive integer. Received: "
                         f"shard_tokens={shard_tokens!r}.")
    os.makedirs(folder, exist_ok=True)
    index_path = os.path.join(folder, INDEX)
    progress_path = os.path.join(folder, PROGRESS)
    if os.path.isfile(index_path):
        if _read_json(index_path).get("key") != key:
            raise ValueError(
                f"{folder} holds shards made from another source or tokenizer; "
                f"delete {folder} (or use a new --workdir) to prepare again.")
        if os.path.exists(progress_path):  # killed right after the index
            os.remove(progress_path)
        tokens = ShardedTokens(folder)
        tokens.verify()  # reused: check every byte against the index
        return tokens
    shards, resume = [], {"cursor": None, "skip": 0}
    if os.path.isfile(progress_path):
        progress = _read_json(progress_path)
        if progress.get("key") == key and progress.get("dtype") == dtype:
            shards = _recorded_shards_intact(folder, progress["shards"], dtype, split)
            if shards:
                resume = shards[-1]["resume"]
            logger.info("prepare %s: resuming after %d finished shards", split, len(shards))
        else:
            logger.info("prepare %s: unfinished shards of another key, starting over", split)
    keep = {s["file"] for s in shards} | {PROGRESS}
    for name in os.listdir(folder):  # partial or stale files of a killed run
        if name not in keep:
            os.remove(os.path.join(folder, name))
    max_id = max([s.get("max_id", -1) for s in shards], default=-1)
    limit = np.iinfo(np.dtype(dtype)).max
    meter = _Progress(split)
    state = {"handle": None, "digest": None, "count": 0, "max": -1}

    def close_shard(resume_here):
        handle = state["handle"]
        handle.flush()
        os.fsync(handle.fileno())
        handle.close()
        name = f"shard-{len(shards):05d}.bin"
        os.replace(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))
        shards.append({"file": name, "tokens": state["count"],
                       "sha256": state["digest"].hexdigest(), "max_id": state["max"],
                       "resume": resume_here})
        _write_json(progress_path, {"format": FORMAT, "key": key, "dtype": dtype,
                                    "shards": shards})
        state["handle"] = None
        if after_shard is not None:
            after_shard(len(shards) - 1)

    # Shard i holds tokens [i * shard_tokens, (i + 1) * shard_tokens) of the
    # split whatever the chunks: a shard can end inside a chunk, and its
    # "resume" says where the next one starts: the cursor before that
    # chunk and how many of the chunk's tokens to skip.
    before, skip = resume["cursor"], resume["skip"]
    for text, after in chunks(before):
        ids = np.asarray(encode(text))
        meter.update(len(text), ids.size)
        base = skip  # tokens of this chunk already in finished shards
        if skip:
            ids, skip = ids[skip:], 0
        done = 0
        while done < ids.size:
            if state["handle"] is None:
                name = f"shard-{len(shards):05d}.bin"
                state.update(handle=open(os.path.join(folder, name + ".tmp"), "wb"),
                             digest=hashlib.sha256(), count=0, max=-1)
            take = min(ids.size - done, shard_tokens - state["count"])
            piece = ids[done:done + take]
            low, high = int(piece.min()), int(piece.max())
            if low < 0 or high > limit:
                raise ValueError(f"token ids in [{low}, {high}] do not fit {dtype}.")
            data = piece.astype(dtype).tobytes()
            state["handle"].write(data)
            state["digest"].update(data)
            state["count"] += take
            state["max"] = max(state["max"], high)
            max_id = max(max_id, high)
            done += take
            if state["count"] >= shard_tokens:
                if done == ids.size:
                    close_shard({"cursor": after, "skip": 0})
                else:
                    close_shard({"cursor": before, "skip": base + done})
        before = after
    if state["handle"] is not None:
        close_shard({"cursor": before, "skip": 0})
    meter.update(0, 0, force=True)
    total = sum(s["tokens"] for s in shards)
    # Where to resume depends on how the source was chunked: not part of
    # the finished split, which depends only on its tokens.
    listed = [{k: v for k, v in s.items() if k != "resume"} for s in shards]
    # Read back once (the files were just written: from the page cache):
    # the stream's own hash, which a resumed run checks, cannot be carried
    # across a kill in the middle of the writing.
    content = tokens_sha256([os.path.join(folder, s["file"]) for s in shards], dtype,
                            expected=[s["sha256"] for s in shards])
    _write_json(index_path, {"format": FORMAT, "key": key, "dtype": dtype,
                             "num_tokens": total, "max_id": max_id,
                             "tokens_sha256": content, "shards": listed})
    if os.path.exists(progress_path):
        os.remove(progress_path)
    tokens = ShardedTokens(folder)
    # The stream was just hashed from these files, each checked: not again.
    tokens._stream_checked = tokens._key == f"tokens-sha256:{content}"
    return tokens
