"""Names, `TensorSpec`s and pure functions of the exported signatures.

One source of truth for the SavedModel (`saved_model.py`), the TFLite models
(`tflite.py`), the serving client and the docs. Everything is batch-first,
including the memory, so TF Serving's row ("instances") REST form works.

Shape legend: B batch, T segment, L num_layers, M memory_length,
D hidden_dim, V vocabulary_size. B and T are dynamic (None) unless fixed at
export time; L, M, D and V always come from the model config.

| signature       | inputs                                 | outputs                          |
|-----------------|----------------------------------------|----------------------------------|
| serving_default | token_ids (B,T) i32, memory (B,L,M,D)  | log_probs (B,T,V), memory        |
| initial_memory  | batch_size () i32                      | memory (B,L,M,D) zeros           |
| score           | token_ids, targets (B,T) i32, memory   | nll (B,T), memory                |
| next_token      | token_ids, memory                      | log_probs (B,V), memory          |
| reset (stateful TFLite only) | none                      | memory (B,L,M,D) zeros           |
| generate (*)    | prompts (B,) str, max_new_tokens ()    | texts (B,) str, token_ids (B,N), |
|                 | i32, temperature, top_k, top_p, seed   | lengths (B,), memory (B,L,M,D)   |
| generate_from_memory (*) | the same + memory (B,L,M,D)   | the same                         |

(*) SavedModel only, when the model has a preprocessor (a tokenizer whose
tokenize/detokenize are graph ops): the whole decoding loop runs inside
the graph, one request gives a whole continuation (`generate_functions`).

The stateful TFLite variant keeps the memory in a resource variable: its
`serving_default`, `score` and `next_token` take no `memory` input and
return no `memory` output.

A model built with `empty_memory="masked"` (and M > 0; `masked_memory`)
counts an empty memory as M masked slots, not M zero vectors. Its
signatures carry that validity as `memory_mask` (B, M) bool, True where a
slot holds real memory, next to every `memory`: `initial_memory` returns
it all False, `serving_default`/`score`/`next_token` and
`generate_from_memory` take it and return the next one, `generate` and
`reset` return it (the stateful TFLite model keeps it in a second
variable). Every other model's signatures have no `memory_mask`.
"""

from __future__ import annotations

# TensorFlow is imported inside the functions, so the names can be used by
# the TFLite runner and the REST client without importing it.

# --- signature names ------------------------------------------------------
SERVING_DEFAULT = "serving_default"
INITIAL_MEMORY = "initial_memory"
SCORE = "score"
NEXT_TOKEN = "next_token"
RESET = "reset"

# --- tensor names (inputs and outputs) -----------------------------------
TOKEN_IDS = "token_ids"
TARGETS = "targets"
MEMORY = "memory"
MEMORY_MASK = "memory_mask"
BATCH_SIZE = "batch_size"
LOG_PROBS = "log_probs"
NLL = "nll"

# Text in, text out (`generate_functions`).
GENERATE = "generate"
GENERATE_FROM_MEMORY = "generate_from_memory"
PROMPTS = "prompts"
MAX_NEW_TOKENS = "max_new_tokens"
TEMPERATURE = "temperature"
TOP_K = "top_k"
TOP_P = "top_p"
SEED = "seed"
TEXTS = "texts"
LENGTHS = "lengths"
GENERATE_SIGNATURES = (GENERATE, GENERATE_FROM_MEMORY)
# Caps of one `generate` request (the loop runs prompt + new tokens steps
# for the longest row, and its token buffer is B x that length).
MAX_NEW_TOKENS_CAP = 1024
MAX_PROMPT_TOKENS = 4096
MAX_GENERATE_BATCH = 256

SAVED_MODEL_SIGNATURES = (SERVING_DEFAULT, INITIAL_MEMORY, SCORE, NEXT_TOKEN)
# The largest memory `initial_memory` allocates for one request (4 GiB).
MAX_MEMORY_BYTES = 4 << 30
# What one call's activations may need (`request_bytes`), by default.
MAX_REQUEST_BYTES = 16 << 30
TFLITE_SIGNATURES = (SERVING_DEFAULT, SCORE, NEXT_TOKEN)
STATEFUL_TFLITE_SIGNATURES = (SERVING_DEFAULT, SCORE, NEXT_TOKEN, RESET)


def memory_shape(config, batch_size: int | None = None) -> tuple:
    """(B, L, M, D) of the memory of a model with this config."""
    return (
        batch_size,
        config.num_layers,
        config.memory_length,
        config.hidden_dim,
    )


def masked_memory(config) -> bool:
    """True when the signatures of a model with this config carry a
    `memory_mask` next to the memory: `empty_memory="masked"` and M > 0."""
    return config.empty_memory == "masked" and config.memory_length > 0


def memory_mask_shape(config, batch_size: int | None = None) -> tuple:
    """(B, M) of the memory mask of a model with this config."""
    return (batch_size, config.memory_length)


def input_specs(
    config, batch_size: int | None = None, segment_length: int | None = None
) -> dict:
    """Named `tf.TensorSpec`s of every signature input (`memory_mask` only
    for a `masked_memory` config)."""
    import tensorflow as tf

    specs = {
        TOKEN_IDS: tf.TensorSpec(
            [batch_size, segment_length], tf.int32, TOKEN_IDS
        ),
        TARGETS: tf.TensorSpec([batch_size, segment_length], tf.int32, TARGETS),
        MEMORY: tf.TensorSpec(
            list(memory_shape(config, batch_size)), tf.float32, MEMORY
        ),
        BATCH_SIZE: tf.TensorSpec([], tf.int32, BATCH_SIZE),
    }
    if masked_memory(config):
        specs[MEMORY_MASK] = tf.TensorSpec(
            list(memory_mask_shape(config, batch_size)), tf.bool, MEMORY_MASK
        )
    return specs


def _with_mask(entries: dict, mask) -> dict:
    """`entries` with `memory_mask` right after `memory` (when it has one)."""
    out = {}
    for key, value in entries.items():
        out[key] = value
        if key == MEMORY:
            out[MEMORY_MASK] = mask
    return out


def signature_table(
    config,
    batch_size: int | None = None,
    segment_length: int | None = None,
    stateful: bool = False,
    names: tuple | None = None,
) -> dict:
    """Inputs and outputs of each signature as `{name: (dtype, shape)}`.

    Shapes are tuples with None for dynamic dimensions; dtypes are the
    strings "int32" / "float32" (and "bool" for the `memory_mask` of a
    `masked_memory` config, next to every `memory`). Used by the tests (against
    `saved_model_cli` and the TFLite signature lists), the client and the
    docs.

    Args:
        config: `TransformerXLConfig`.
        batch_size: int or None. B, fixed at export or dynamic.
        segment_length: int or None. T, fixed at export or dynamic.
        stateful: bool. The stateful TFLite variant (memory inside).
        names: tuple of signature names to describe; default: all of the
            SavedModel's, or of the stateful TFLite model's when stateful.

    Returns:
        `{signature: {"inputs": {...}, "outputs": {...}}}`.
    """
    B, T, V = batch_size, segment_length, config.vocabulary_size
    mem = ("float32", memory_shape(config, B))
    ids = ("int32", (B, T))
    table = {
        SERVING_DEFAULT: {
            "inputs": {TOKEN_IDS: ids, MEMORY: mem},
            "outputs": {LOG_PROBS: ("float32", (B, T, V)), MEMORY: mem},
        },
        INITIAL_MEMORY: {
            "inputs": {BATCH_SIZE: ("int32", ())},
            "outputs": {MEMORY: mem},
        },
        SCORE: {
            "inputs": {TOKEN_IDS: ids, TARGETS: ids, MEMORY: mem},
            "outputs": {NLL: ("float32", (B, T)), MEMORY: mem},
        },
        NEXT_TOKEN: {
            "inputs": {TOKEN_IDS: ids, MEMORY: mem},
            "outputs": {LOG_PROBS: ("float32", (B, V)), MEMORY: mem},
        },
        RESET: {"inputs": {}, "outputs": {MEMORY: mem}},
    }
    if masked_memory(config):
        mask = ("bool", memory_mask_shape(config, B))
        table = {name: {part: _with_mask(io, mask) for part, io in entry.items()}
                 for name, entry in table.items()}
    if stateful:
        for name in (SERVING_DEFAULT, SCORE, NEXT_TOKEN):
            for part in ("inputs", "outputs"):
                table[name][part].pop(MEMORY)
                table[name][part].pop(MEMORY_MASK, None)
        default = STATEFUL_TFLITE_SIGNATURES
    else:
        default = SAVED_MODEL_SIGNATURES
    if names and set(names) & set(GENERATE_SIGNATURES):
        table.update(generate_signature_table(config))
    return {name: table[name] for name in (names or default)}


def generate_signature_table(config) -> dict:
    """`{generate, generate_from_memory}` entries of `signature_table`."""
    mem = ("float32", memory_shape(config, None))
    inputs = {
        PROMPTS: ("string", (None,)),
        MAX_NEW_TOKENS: ("int32", ()),
        TEMPERATURE: ("float32", ()),
        TOP_K: ("int32", ()),
        TOP_P: ("float32", ()),
        SEED: ("int64", ()),
    }
    outputs = {
        TEXTS: ("string", (None,)),
        TOKEN_IDS: ("int32", (None, None)),
        LENGTHS: ("int32", (None,)),
        MEMORY: mem,
    }
    from_memory = {**inputs, MEMORY: mem}
    if masked_memory(config):
        mask = ("bool", memory_mask_shape(config, None))
        outputs = _with_mask(outputs, mask)
        from_memory = _with_mask(from_memory, mask)
    return {
        GENERATE: {"inputs": dict(inputs), "outputs": dict(outputs)},
        GENERATE_FROM_MEMORY: {
            "inputs": from_memory, "outputs": dict(outputs)
        },
    }


# --- pure signature functions --------------------------------------------


def _check_token_ids(token_ids, name, spec, vocabulary_size, checks):
    """Run-time shape (and, for targets, range) checks on an id tensor."""
    import tensorflow as tf

    token_ids = tf.ensure_shape(token_ids, spec.shape)
    if checks:
        deps = [
            tf.debugging.assert_positive(
                tf.shape(token_ids)[0],
                message=f"`{name}` must hold at least one row (batch size "
                ">= 1)",
            ),
            tf.debugging.assert_positive(
                tf.shape(token_ids)[1],
                message=f"`{name}` must hold at least one position per row "
                "(segment_length >= 1)",
            ),
        ]
        if name == TARGETS:
            # Ids are range-checked by the model; targets only go to a gather.
            deps += [
                tf.debugging.assert_non_negative(
                    token_ids, message="`targets` must be >= 0"
                ),
                tf.debugging.assert_less(
                    token_ids,
                    tf.constant(vocabulary_size, tf.int32),
                    message="`targets` must be < vocabulary_size="
                    f"{vocabulary_size}",
                ),
            ]
        with tf.control_dependencies(deps):
            token_ids = tf.identity(token_ids)
    return token_ids


# A request's activations, as multiples of its largest tensors: about eight
# (B, N, T, T + M) float32 score-sized tensors live at once in a layer's
# attention (scores, their two terms, the shift's copy, probabilities ...),
# and two (B, T, V) ones at the head. Measured on the tiny preset's export:
# T = 8,000 peaked at 4.8 GB of RSS, where this counts 4.1 GB.
_SCORE_TENSORS = 8
_HEAD_TENSORS = 2


def request_bytes(config, batch_size, segment_length):
    """Bytes of activations a call of `segment_length` tokens on
    `batch_size` rows needs (an estimate, see `_SCORE_TENSORS`): the
    attention's are quadratic in the segment length."""
    keys = segment_length + config.memory_length
    return 4 * batch_size * segment_length * (
        _SCORE_TENSORS * config.num_heads * keys
        + _HEAD_TENSORS * config.vocabulary_size)


def _check_request_size(token_ids, config, max_bytes):
    """Refuses a request whose activations (`request_bytes`) exceed
    `max_bytes`, before any of them is allocated: one request of 32,000
    tokens (a 200 KB body) would otherwise ask for ~70 GB."""
    import tensorflow as tf

    shape = tf.cast(tf.shape(token_ids), tf.float64)  # no int overflow
    check = tf.debugging.assert_less_equal(
        request_bytes(config, shape[0], shape[1]),
        tf.constant(float(max_bytes), tf.float64),
        message=f"this request's batch x segment length needs more than "
        f"max_request_bytes={max_bytes} of activations (the attention's grow with "
        "the square of the segment length): send the text in shorter segments, "
        "carrying the memory, or fewer rows")
    with tf.control_dependencies([check]):
        return tf.identity(token_ids)


def _check_memory(memory, token_ids, spec, checks):
    import tensorflow as tf

    # The loaded signature checks dtypes but not shapes: EnsureShape is the
    # run-time check (TF Serving feeds whatever the request holds).
    memory = tf.ensure_shape(memory, spec.shape)
    if checks:
        L, M, D = spec.shape[1:]
        deps = [
            tf.debugging.assert_equal(
                tf.shape(memory)[0],
                tf.shape(token_ids)[0],
                message="`memory` and `token_ids` must have the same batch "
                "size; pass the memory returned for this batch (or "
                f"initial_memory). Expected memory shape (batch, {L}, {M}, {D})",
            ),
            tf.debugging.assert_all_finite(
                memory,
                "`memory` contains NaN or Inf; pass the memory returned by "
                "the previous call or initial_memory",
            ),
        ]
        with tf.control_dependencies(deps):
            memory = tf.identity(memory)
    return memory


def _check_memory_mask(memory_mask, rows, rows_name, spec, checks):
    """Run-time checks of a `memory_mask` input: (B, M) (EnsureShape) and,
    with `checks`, its batch equal to `rows`' (the batch of `rows_name`)."""
    import tensorflow as tf

    memory_mask = tf.ensure_shape(memory_mask, spec.shape)
    if checks:
        same = tf.debugging.assert_equal(
            tf.shape(memory_mask)[0],
            tf.shape(rows)[0],
            message=f"`memory_mask` and `{rows_name}` must have the same batch "
            "size; pass the memory_mask returned with this memory (or "
            "initial_memory's). Expected memory_mask shape (batch, "
            f"{spec.shape[1]}) bool",
        )
        with tf.control_dependencies([same]):
            memory_mask = tf.identity(memory_mask)
    return memory_mask


def signature_functions(
    model,
    batch_size: int | None = None,
    segment_length: int | None = None,
    checks: bool = True,
    names: tuple = SAVED_MODEL_SIGNATURES,
    max_memory_bytes: int = MAX_MEMORY_BYTES,
    max_request_bytes: int = MAX_REQUEST_BYTES,
) -> dict:
    """Pure functions of the SavedModel / stateless TFLite signatures.

    Args:
        model: `TransformerXLCausalLM` (its `call_with_memory` is used, so a
            stateful model's memory variable is not touched).
        batch_size: int or None. Fixed B, or dynamic.
        segment_length: int or None. Fixed T, or dynamic.
        checks: bool. Add run-time assertions (batch agreement, finite
            memory, target range, T >= 1). The TFLite converter drops
            assertions, so TFLite exports pass False and check in Python.
        names: which signatures to build.
        max_memory_bytes: int. `initial_memory` refuses a `batch_size` whose
            memory is larger (default 4 GiB), so one request cannot
            allocate hundreds of GB.
        max_request_bytes: int. The id-level signatures refuse a call
            whose activations (`request_bytes`: the attention's grow with
            the square of the segment length) would be larger (default
            16 GiB), before allocating them.

    Returns:
        `{name: (function, [TensorSpec, ...])}`; each function takes the
        specs' names as arguments and returns a dict of named tensors.
        With a `masked_memory` config, the memory's validity goes in and
        out as `memory_mask` (B, M) bool next to every `memory`.
    """
    import tensorflow as tf

    config = model.txl_config
    specs = input_specs(config, batch_size, segment_length)
    V = config.vocabulary_size
    fixed_batch = batch_size
    out_memory_shape = list(memory_shape(config, batch_size))
    masked = masked_memory(config)
    out_mask_shape = list(memory_mask_shape(config, batch_size))
    # initial_memory allocates what the request asks for: bound it.
    row_bytes = 4 * config.num_layers * config.memory_length * config.hidden_dim
    max_batch = int(min(max_memory_bytes // max(row_bytes, 1), 2**31 - 1))
    if max_batch < 1:
        raise ValueError(
            f"max_memory_bytes={max_memory_bytes} is smaller than one row of "
            f"memory ({row_bytes} bytes); raise it (`txl export --max-request-gib`)."
        )

    def forward(token_ids, memory, memory_mask=None):
        """(log_probs, {memory[, memory_mask]}) of one segment."""
        token_ids = _check_token_ids(
            token_ids, TOKEN_IDS, specs[TOKEN_IDS], V, checks
        )
        if checks:
            token_ids = _check_request_size(token_ids, config, max_request_bytes)
        memory = _check_memory(memory, token_ids, specs[MEMORY], checks)
        if memory_mask is not None:
            memory_mask = _check_memory_mask(
                memory_mask, token_ids, TOKEN_IDS, specs[MEMORY_MASK], checks)
        out = model.call_with_memory(
            token_ids, memory, training=False, memory_mask=memory_mask)
        log_probs = tf.ensure_shape(
            out["log_probs"], [fixed_batch, segment_length, V]
        )  # (B, T, V)
        state = {MEMORY: tf.ensure_shape(out["memory"], out_memory_shape)}
        if memory_mask is not None:
            state[MEMORY_MASK] = tf.ensure_shape(out["memory_mask"], out_mask_shape)
        return log_probs, state

    def serving_default(token_ids, memory, memory_mask=None):
        log_probs, state = forward(token_ids, memory, memory_mask)
        return {LOG_PROBS: log_probs, **state}

    def initial_memory(batch_size):  # the argument is the input's name
        deps = [
            tf.debugging.assert_positive(
                batch_size, message="`batch_size` must be >= 1"
            ),
            tf.debugging.assert_less_equal(
                batch_size, tf.constant(max_batch, tf.int32),
                message=f"`batch_size` must be <= {max_batch}: one row of "
                f"memory is {row_bytes} bytes and one request may allocate "
                f"at most max_memory_bytes={max_memory_bytes}",
            ),
        ]
        if fixed_batch is not None:
            deps.append(
                tf.debugging.assert_equal(
                    batch_size,
                    tf.constant(fixed_batch, tf.int32),
                    message="this model was exported with a fixed batch "
                    f"size of {fixed_batch}",
                )
            )
        with tf.control_dependencies(deps):
            shape = tf.stack([batch_size, *out_memory_shape[1:]])
            zeros = tf.zeros(shape, tf.float32)
            out = {MEMORY: tf.ensure_shape(zeros, out_memory_shape)}
            if masked:  # every slot empty: none is attended
                empty = tf.zeros(tf.stack([batch_size, out_mask_shape[1]]), tf.bool)
                out[MEMORY_MASK] = tf.ensure_shape(empty, out_mask_shape)
        return out

    def score(token_ids, targets, memory, memory_mask=None):
        targets = _check_token_ids(targets, TARGETS, specs[TARGETS], V, checks)
        if checks:
            same = tf.debugging.assert_equal(
                tf.shape(targets),
                tf.shape(token_ids),
                message="`targets` must have the shape of `token_ids`",
            )
            with tf.control_dependencies([same]):
                targets = tf.identity(targets)
        log_probs, state = forward(token_ids, memory, memory_mask)
        # -log p(targets[b, t] | tokens <= t): (B, T)
        nll = -tf.gather(log_probs, targets, batch_dims=2)
        return {NLL: nll, **state}

    def next_token(token_ids, memory, memory_mask=None):
        log_probs, state = forward(token_ids, memory, memory_mask)
        return {LOG_PROBS: log_probs[:, -1, :], **state}  # (B, V)

    memory_specs = [specs[MEMORY]] + ([specs[MEMORY_MASK]] if masked else [])
    table = {
        SERVING_DEFAULT: (serving_default, [specs[TOKEN_IDS], *memory_specs]),
        INITIAL_MEMORY: (initial_memory, [specs[BATCH_SIZE]]),
        SCORE: (
            score,
            [specs[TOKEN_IDS], specs[TARGETS], *memory_specs],
        ),
        NEXT_TOKEN: (next_token, [specs[TOKEN_IDS], *memory_specs]),
    }
    return {name: table[name] for name in names}


def stateful_signature_functions(
    model, memory_variable, batch_size: int, segment_length: int,
    memory_mask_variable=None,
) -> dict:
    """Signatures of the stateful TFLite model (memory in a variable).

    Each call reads the variable, runs the segment and writes the new
    memory back (the Keras stateful-RNN pattern); `reset` writes zeros.

    Args:
        model: `TransformerXLCausalLM`.
        memory_variable: `tf.Variable` of shape (B, L, M, D) float32.
        batch_size, segment_length: int. Both fixed.
        memory_mask_variable: `tf.Variable` of shape (B, M) bool, required
            for a `masked_memory` config (else None): the validity of the
            memory's slots, read and written with the memory; `reset`
            clears it (every slot empty) and returns it too.

    Returns:
        `{name: (function, [TensorSpec, ...])}` for
        `STATEFUL_TFLITE_SIGNATURES`.
    """
    import tensorflow as tf

    config = model.txl_config
    if (memory_mask_variable is not None) != masked_memory(config):
        raise ValueError(
            "`memory_mask_variable` must be a (batch, memory_length) bool "
            "variable exactly when the model has empty_memory='masked' and a "
            f"memory (this one: empty_memory={config.empty_memory!r}, "
            f"memory_length={config.memory_length}).")
    specs = input_specs(config, batch_size, segment_length)
    V = config.vocabulary_size
    shape = list(memory_shape(config, batch_size))
    mask_shape = list(memory_mask_shape(config, batch_size))

    def forward(token_ids):
        token_ids = tf.ensure_shape(token_ids, specs[TOKEN_IDS].shape)
        memory_mask = None
        if memory_mask_variable is not None:
            memory_mask = memory_mask_variable.read_value()
        out = model.call_with_memory(
            token_ids, memory_variable.read_value(), training=False,
            memory_mask=memory_mask,
        )
        memory_variable.assign(tf.ensure_shape(out["memory"], shape))
        if memory_mask_variable is not None:
            memory_mask_variable.assign(
                tf.ensure_shape(out["memory_mask"], mask_shape))
        return tf.ensure_shape(
            out["log_probs"], [batch_size, segment_length, V]
        )

    def serving_default(token_ids):
        return {LOG_PROBS: forward(token_ids)}

    def score(token_ids, targets):
        targets = tf.ensure_shape(targets, specs[TARGETS].shape)
        return {NLL: -tf.gather(forward(token_ids), targets, batch_dims=2)}

    def next_token(token_ids):
        return {LOG_PROBS: forward(token_ids)[:, -1, :]}

    def reset():
        memory_variable.assign(tf.zeros(shape, tf.float32))
        out = {MEMORY: memory_variable.read_value()}
        if memory_mask_variable is not None:
            memory_mask_variable.assign(tf.zeros(mask_shape, tf.bool))
            out[MEMORY_MASK] = memory_mask_variable.read_value()
        return out

    return {
        SERVING_DEFAULT: (serving_default, [specs[TOKEN_IDS]]),
        SCORE: (score, [specs[TOKEN_IDS], specs[TARGETS]]),
        NEXT_TOKEN: (next_token, [specs[TOKEN_IDS]]),
        RESET: (reset, []),
    }


# --- text in, text out: the whole decoding loop in the graph ---------------


def generate_input_specs(config) -> dict:
    """Named `tf.TensorSpec`s of the `generate` signatures' inputs."""
    import tensorflow as tf

    return {
        PROMPTS: tf.TensorSpec([None], tf.string, PROMPTS),
        MAX_NEW_TOKENS: tf.TensorSpec([], tf.int32, MAX_NEW_TOKENS),
        TEMPERATURE: tf.TensorSpec([], tf.float32, TEMPERATURE),
        TOP_K: tf.TensorSpec([], tf.int32, TOP_K),
        TOP_P: tf.TensorSpec([], tf.float32, TOP_P),
        SEED: tf.TensorSpec([], tf.int64, SEED),
        MEMORY: tf.TensorSpec(
            list(memory_shape(config, None)), tf.float32, MEMORY
        ),
        MEMORY_MASK: tf.TensorSpec(
            list(memory_mask_shape(config, None)), tf.bool, MEMORY_MASK
        ),
    }


def seeded_choice(temperature, top_k, top_p, seed):
    """A stateless, seeded `choose(log_probs (B, V), index) -> (B,)` for
    `keras_txl.decoding.decode_loop(..., choose_with_index=True)`.

    Hand-written rather than a keras-hub sampler: those draw from a
    stateful `SeedGenerator` (a variable the SavedModel would share between
    concurrent requests, so a seed could not make one request
    reproducible) and fix temperature/k/p when they are built, while a
    serving request brings its own options and seed as tensors. Here every
    draw is `tf.random.stateless_categorical` keyed by (seed, position
    written): the same request gives the same output.

    Args:
        temperature: () float32 >= 0; 0 is greedy (argmax).
        top_k: () int32 >= 0; keep the k most likely ids (0: all).
        top_p: () float32 in (0, 1]; keep the smallest set of most likely
            ids whose probability reaches top_p (1: all).
        seed: () int64.
    """
    import tensorflow as tf

    def choose(log_probs, index):
        log_probs = tf.cast(log_probs, tf.float32)  # (B, V)
        vocabulary_size = tf.shape(log_probs)[-1]
        greedy = tf.argmax(log_probs, axis=-1, output_type=tf.int32)  # (B,)
        logits = log_probs / tf.maximum(temperature, 1e-6)
        # top-k: the k-th largest value of each row is the threshold.
        k = tf.where(top_k > 0, tf.minimum(top_k, vocabulary_size),
                     vocabulary_size)
        ordered = tf.sort(logits, axis=-1, direction="DESCENDING")  # (B, V)
        kth = tf.gather(ordered, k - 1, axis=-1)[:, None]  # (B, 1)
        logits = tf.where(logits >= kth, logits, -float("inf"))
        # top-p on what top-k kept: keep ids until the mass before them
        # reaches top_p (the most likely id is always kept).
        ordered = tf.sort(logits, axis=-1, direction="DESCENDING")
        probs = tf.nn.softmax(ordered, axis=-1)
        before = tf.cumsum(probs, axis=-1, exclusive=True)  # (B, V)
        kept = tf.where(before < top_p, ordered, float("inf"))
        threshold = tf.reduce_min(kept, axis=-1, keepdims=True)  # (B, 1)
        logits = tf.where(logits >= threshold, logits, -float("inf"))
        key = tf.stack([seed, tf.cast(index, tf.int64)])  # (2,)
        sampled = tf.random.stateless_categorical(
            logits, 1, seed=key, dtype=tf.int32
        )[:, 0]
        return tf.where(temperature > 0, sampled, greedy)

    return choose


def _eager_tokenizer_constants(tokenizer):
    """keras-hub's ByteTokenizer/UnicodeCodepointTokenizer build their
    lookup constant lazily in the first graph that detokenizes and keep it:
    a second traced function (the other `generate` signature, a re-export)
    would capture a tensor of a dead graph. Build it eagerly instead."""
    import tensorflow as tf

    initialize = getattr(tokenizer, "_maybe_initialized_tf", None)
    if initialize is None:
        return
    if hasattr(tokenizer, "_char_lst"):
        tokenizer._char_lst = None
    with tf.init_scope():
        initialize()


def generate_functions(
    model,
    names: tuple = GENERATE_SIGNATURES,
    max_new_tokens_cap: int = MAX_NEW_TOKENS_CAP,
    max_prompt_tokens: int = MAX_PROMPT_TOKENS,
    max_batch_size: int = MAX_GENERATE_BATCH,
) -> dict:
    """Pure functions of the `generate` / `generate_from_memory` signatures.

    Strings in, strings out: the prompts are tokenized by the model's
    preprocessor's tokenizer (graph ops), right-padded to the longest
    prompt plus `max_new_tokens`, decoded by
    `keras_txl.decoding.decode_loop` (a `tf.while_loop`, one token per
    step with the memory key/value cache) and the new tokens detokenized.
    Every row gets at most `max_new_tokens` (fewer after the tokenizer's
    `end_token_id`, if it has one), and its memory covers exactly its
    prompt and its new tokens, as if it were generated alone.

    Args:
        model: `TransformerXLCausalLM` with a preprocessor.
        names: which of the two signatures to build.
        max_new_tokens_cap, max_prompt_tokens, max_batch_size: int. Larger
            requests are refused (one request holds the loop for prompt +
            new tokens steps and a B x that token buffer).

    Returns:
        `{name: (function, [TensorSpec, ...])}` as `signature_functions`.
        Outputs: "texts" (B,) string, the continuations; "token_ids"
        (B, max_new_tokens) int32, the new ids (0 after each row's
        "lengths" (B,) int32); "memory" (B, L, M, D) float32, the memory
        after each row's prompt and continuation (feed it to
        `generate_from_memory` to continue); with a `masked_memory`
        config, "memory_mask" (B, M) bool, its slots' validity, which
        `generate_from_memory` also takes.

    Raises:
        ValueError: the model has no preprocessor/tokenizer, or no memory
            (memory_length=0: the loop reads the context through it).
    """
    import tensorflow as tf

    from keras_txl import checks
    from keras_txl.decoding import decode_loop

    checks.memory_for_generation(model.txl_config.memory_length)

    tokenizer = getattr(getattr(model, "preprocessor", None), "tokenizer", None)
    if tokenizer is None:
        raise ValueError(
            "The `generate` signatures need a model with a preprocessor "
            "(a TransformerXLCausalLMPreprocessor with a tokenizer): attach "
            "one, or export the id-level signatures only."
        )
    _eager_tokenizer_constants(tokenizer)
    config = model.txl_config
    specs = generate_input_specs(config)
    end = getattr(tokenizer, "end_token_id", None)
    stop_token_ids = None if end is None else (int(end),)
    pad = int(getattr(tokenizer, "pad_token_id", None) or 0)
    mem_shape = list(memory_shape(config, None))
    masked = masked_memory(config)

    def checked(prompts, max_new_tokens, temperature, top_k, top_p, seed):
        batch = tf.shape(prompts)[0]
        return [
            tf.debugging.assert_positive(
                batch, message="`prompts` must hold at least one prompt"),
            tf.debugging.assert_less_equal(
                batch, max_batch_size,
                message=f"`prompts` may hold at most {max_batch_size} "
                "prompts per request"),
            tf.debugging.assert_positive(
                max_new_tokens, message="`max_new_tokens` must be >= 1"),
            tf.debugging.assert_less_equal(
                max_new_tokens, max_new_tokens_cap,
                message=f"`max_new_tokens` must be <= {max_new_tokens_cap} "
                "(the cap of one request; continue with "
                "generate_from_memory)"),
            tf.debugging.assert_all_finite(
                temperature, "`temperature` must be finite"),
            tf.debugging.assert_non_negative(
                temperature,
                message="`temperature` must be >= 0 (0 is greedy)"),
            tf.debugging.assert_non_negative(
                top_k, message="`top_k` must be >= 0 (0 keeps every token)"),
            tf.debugging.assert_positive(
                top_p, message="`top_p` must be in (0, 1] (1 keeps every "
                "token)"),
            tf.debugging.assert_less_equal(
                top_p, 1.0, message="`top_p` must be in (0, 1] (1 keeps "
                "every token)"),
            # As generate_ids and SavedModelBackend (check_seed): int64's
            # top is the range's.
            tf.debugging.assert_non_negative(
                seed, message="`seed` must be in [0, 2**63 - 1]"),
        ]

    def run(prompts, max_new_tokens, temperature, top_k, top_p, seed,
            memory=None, memory_mask=None):
        prompts = tf.ensure_shape(prompts, [None])
        with tf.control_dependencies(
            checked(prompts, max_new_tokens, temperature, top_k, top_p, seed)
        ):
            # Every use of the options goes through these identities, so none
            # runs before the checks: the graph runs an op as soon as its
            # inputs are there, and tf.range(max_new_tokens) would otherwise
            # race them (max_new_tokens=-1 failed in Range, 2**31 - 1
            # allocated 8 GB before the cap refused it).
            max_new_tokens, temperature, top_k, top_p, seed = (
                tf.identity(x) for x in (max_new_tokens, temperature, top_k, top_p, seed))
            tokens = tokenizer.tokenize(prompts)  # (B, None) ragged
        tokens = tf.cast(tokens, tf.int32)
        prompt_lengths = tf.cast(tokens.row_lengths(), tf.int32)  # (B,)
        deps = [
            tf.debugging.assert_positive(
                prompt_lengths, message="`prompts`: every prompt must "
                "tokenize to at least one token (an empty prompt has "
                "nothing to continue)"),
            tf.debugging.assert_less_equal(
                prompt_lengths, max_prompt_tokens,
                message=f"`prompts`: a prompt may hold at most "
                f"{max_prompt_tokens} tokens"),
        ]
        if memory is not None:
            memory = tf.ensure_shape(memory, mem_shape)
            deps += [
                tf.debugging.assert_equal(
                    tf.shape(memory)[0], tf.shape(prompts)[0],
                    message="`memory` and `prompts` must have the same "
                    "batch size; pass the memory returned for these "
                    f"prompts. Expected memory shape (batch, "
                    f"{', '.join(str(d) for d in mem_shape[1:])})"),
                tf.debugging.assert_all_finite(
                    memory, "`memory` contains NaN or Inf; pass the "
                    "memory a generate signature returned"),
            ]
        if memory_mask is not None:
            memory_mask = _check_memory_mask(
                memory_mask, prompts, PROMPTS, specs[MEMORY_MASK], True)
        with tf.control_dependencies(deps):
            prompt_lengths = tf.identity(prompt_lengths)
        batch = tf.shape(prompt_lengths)[0]
        length = tf.reduce_max(prompt_lengths) + max_new_tokens  # S
        token_ids = tokens.to_tensor(
            default_value=pad, shape=tf.stack([batch, length])
        )  # (B, S)
        positions = tf.range(length)[None, :]  # (1, S)
        padding_mask = positions < prompt_lengths[:, None]  # (B, S)
        out = decode_loop(
            model, token_ids, padding_mask,
            seeded_choice(temperature, top_k, top_p, seed),
            memory=memory, memory_mask=memory_mask,
            stop_token_ids=stop_token_ids,
            max_lengths=prompt_lengths + max_new_tokens,
            choose_with_index=True,
        )
        # A row that met NaN or +Inf log-probabilities (NaN weights, a
        # float16 overflow) chose its tokens from garbage: an error, as in
        # Keras' generate, not texts.
        finite = tf.debugging.assert_equal(
            out["finite"], tf.ones_like(out["finite"]),
            message="the model returned NaN or +Inf log-probabilities for a "
            "row of this request: check the exported weights")
        with tf.control_dependencies([finite]):
            total = tf.reduce_sum(tf.cast(out["padding_mask"], tf.int32), axis=1)
        lengths = total - prompt_lengths  # (B,) new tokens of each row
        steps = tf.range(max_new_tokens)[None, :]  # (1, N)
        where = tf.minimum(prompt_lengths[:, None] + steps, length - 1)
        new_ids = tf.gather(out["token_ids"], where, batch_dims=1)  # (B, N)
        new_ids = tf.where(steps < lengths[:, None], new_ids, 0)
        texts = tokenizer.detokenize(
            tf.RaggedTensor.from_tensor(new_ids, lengths=lengths)
        )
        result = {
            TEXTS: tf.ensure_shape(texts, [None]),
            TOKEN_IDS: new_ids,
            LENGTHS: lengths,
            MEMORY: tf.ensure_shape(out["memory"], mem_shape),
        }
        if masked:
            result[MEMORY_MASK] = tf.ensure_shape(
                out["memory_mask"], list(memory_mask_shape(config, None)))
        return result

    def generate(prompts, max_new_tokens, temperature, top_k, top_p, seed):
        return run(prompts, max_new_tokens, temperature, top_k, top_p, seed)

    def generate_from_memory(prompts, max_new_tokens, temperature, top_k,
                             top_p, seed, memory, memory_mask=None):
        return run(prompts, max_new_tokens, temperature, top_k, top_p, seed,
                   memory, memory_mask)

    common = [specs[n] for n in (PROMPTS, MAX_NEW_TOKENS, TEMPERATURE,
                                 TOP_K, TOP_P, SEED)]
    from_memory = [specs[MEMORY]] + ([specs[MEMORY_MASK]] if masked else [])
    table = {
        GENERATE: (generate, common),
        GENERATE_FROM_MEMORY: (generate_from_memory, common + from_memory),
    }
    return {name: table[name] for name in names}
