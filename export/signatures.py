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

The stateful TFLite variant keeps the memory in a resource variable: its
`serving_default`, `score` and `next_token` take no `memory` input and
return no `memory` output.
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
BATCH_SIZE = "batch_size"
LOG_PROBS = "log_probs"
NLL = "nll"

SAVED_MODEL_SIGNATURES = (SERVING_DEFAULT, INITIAL_MEMORY, SCORE, NEXT_TOKEN)
# The largest memory `initial_memory` allocates for one request (4 GiB).
MAX_MEMORY_BYTES = 4 << 30
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


def input_specs(
    config, batch_size: int | None = None, segment_length: int | None = None
) -> dict:
    """Named `tf.TensorSpec`s of every signature input."""
    import tensorflow as tf

    return {
        TOKEN_IDS: tf.TensorSpec(
            [batch_size, segment_length], tf.int32, TOKEN_IDS
        ),
        TARGETS: tf.TensorSpec([batch_size, segment_length], tf.int32, TARGETS),
        MEMORY: tf.TensorSpec(
            list(memory_shape(config, batch_size)), tf.float32, MEMORY
        ),
        BATCH_SIZE: tf.TensorSpec([], tf.int32, BATCH_SIZE),
    }


def signature_table(
    config,
    batch_size: int | None = None,
    segment_length: int | None = None,
    stateful: bool = False,
    names: tuple | None = None,
) -> dict:
    """Inputs and outputs of each signature as `{name: (dtype, shape)}`.

    Shapes are tuples with None for dynamic dimensions; dtypes are the
    strings "int32" / "float32". Used by the tests (against
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
    if stateful:
        for name in (SERVING_DEFAULT, SCORE, NEXT_TOKEN):
            table[name]["inputs"].pop(MEMORY)
            table[name]["outputs"].pop(MEMORY)
        default = STATEFUL_TFLITE_SIGNATURES
    else:
        default = SAVED_MODEL_SIGNATURES
    return {name: table[name] for name in (names or default)}


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


def signature_functions(
    model,
    batch_size: int | None = None,
    segment_length: int | None = None,
    checks: bool = True,
    names: tuple = SAVED_MODEL_SIGNATURES,
    max_memory_bytes: int = MAX_MEMORY_BYTES,
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

    Returns:
        `{name: (function, [TensorSpec, ...])}`; each function takes the
        specs' names as arguments and returns a dict of named tensors.
    """
    import tensorflow as tf

    config = model.txl_config
    specs = input_specs(config, batch_size, segment_length)
    V = config.vocabulary_size
    fixed_batch = batch_size
    out_memory_shape = list(memory_shape(config, batch_size))
    # initial_memory allocates what the request asks for: bound it.
    row_bytes = 4 * config.num_layers * config.memory_length * config.hidden_dim
    max_batch = int(min(max_memory_bytes // max(row_bytes, 1), 2**31 - 1))
    if max_batch < 1:
        raise ValueError(
            f"max_memory_bytes={max_memory_bytes} is smaller than one row of "
            f"memory ({row_bytes} bytes); raise it."
        )

    def forward(token_ids, memory):
        token_ids = _check_token_ids(
            token_ids, TOKEN_IDS, specs[TOKEN_IDS], V, checks
        )
        memory = _check_memory(memory, token_ids, specs[MEMORY], checks)
        out = model.call_with_memory(token_ids, memory, training=False)
        log_probs = tf.ensure_shape(
            out["log_probs"], [fixed_batch, segment_length, V]
        )  # (B, T, V)
        new_memory = tf.ensure_shape(out["memory"], out_memory_shape)
        return log_probs, new_memory

    def serving_default(token_ids, memory):
        log_probs, new_memory = forward(token_ids, memory)
        return {LOG_PROBS: log_probs, MEMORY: new_memory}

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
        return {MEMORY: tf.ensure_shape(zeros, out_memory_shape)}

    def score(token_ids, targets, memory):
        targets = _check_token_ids(targets, TARGETS, specs[TARGETS], V, checks)
        if checks:
            same = tf.debugging.assert_equal(
                tf.shape(targets),
                tf.shape(token_ids),
                message="`targets` must have the shape of `token_ids`",
            )
            with tf.control_dependencies([same]):
                targets = tf.identity(targets)
        log_probs, new_memory = forward(token_ids, memory)
        # -log p(targets[b, t] | tokens <= t): (B, T)
        nll = -tf.gather(log_probs, targets, batch_dims=2)
        return {NLL: nll, MEMORY: new_memory}

    def next_token(token_ids, memory):
        log_probs, new_memory = forward(token_ids, memory)
        return {LOG_PROBS: log_probs[:, -1, :], MEMORY: new_memory}  # (B, V)

    table = {
        SERVING_DEFAULT: (serving_default, [specs[TOKEN_IDS], specs[MEMORY]]),
        INITIAL_MEMORY: (initial_memory, [specs[BATCH_SIZE]]),
        SCORE: (
            score,
            [specs[TOKEN_IDS], specs[TARGETS], specs[MEMORY]],
        ),
        NEXT_TOKEN: (next_token, [specs[TOKEN_IDS], specs[MEMORY]]),
    }
    return {name: table[name] for name in names}


def stateful_signature_functions(
    model, memory_variable, batch_size: int, segment_length: int
) -> dict:
    """Signatures of the stateful TFLite model (memory in a variable).

    Each call reads the variable, runs the segment and writes the new
    memory back (the Keras stateful-RNN pattern); `reset` writes zeros.

    Args:
        model: `TransformerXLCausalLM`.
        memory_variable: `tf.Variable` of shape (B, L, M, D) float32.
        batch_size, segment_length: int. Both fixed.

    Returns:
        `{name: (function, [TensorSpec, ...])}` for
        `STATEFUL_TFLITE_SIGNATURES`.
    """
    import tensorflow as tf

    config = model.txl_config
    specs = input_specs(config, batch_size, segment_length)
    V = config.vocabulary_size
    shape = list(memory_shape(config, batch_size))

    def forward(token_ids):
        token_ids = tf.ensure_shape(token_ids, specs[TOKEN_IDS].shape)
        out = model.call_with_memory(
            token_ids, memory_variable.read_value(), training=False
        )
        memory_variable.assign(tf.ensure_shape(out["memory"], shape))
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
        return {MEMORY: memory_variable.read_value()}

    return {
        SERVING_DEFAULT: (serving_default, [specs[TOKEN_IDS]]),
        SCORE: (score, [specs[TOKEN_IDS], specs[TARGETS]]),
        NEXT_TOKEN: (next_token, [specs[TOKEN_IDS]]),
        RESET: (reset, []),
    }
