"""The test toolkit: one tiny config, one segment chain, and layer, saving and
LiteRT checks in the spirit of keras-hub's `TestCase`.

Import it as `from testing import ...` (pytest puts `tests/` on `sys.path`).
`conftest.py` keeps only pytest's hooks and fixtures; everything a test
imports lives here, so no test imports `conftest` (which pytest has already
loaded once under its own name: a second import would run it again as a
different module).

- `tiny_config(**overrides)`: the one small `TransformerXLConfig`.
- `byte_causal_lm(**overrides)`: a tiny byte-level model with a
  preprocessor (text in, text out).
- `chain_segments(fn_or_model, ids, segment_length)`: the one loop that
  feeds segments in order with the memory carried.
- `signature_reference(model, ids, segment_length)`: the per-segment numbers
  every export signature must reproduce (log-probs, memory, nll, next).
- `run_layer_test(...)`: config round trip (`get_config`/`from_config`, also
  through JSON), same outputs with the same weights, weight and parameter
  counts, a gradient for every trainable weight.
- `run_model_saving_test(model, ids)`: `save_pretrained`/`load_pretrained`
  and `.keras` round trips give the same numbers.
- `run_litert_export_test(model, ids)`: TFLite export runs like Keras.
"""

import json
import os
import pathlib
import tempfile

import keras
import numpy as np
import tensorflow as tf

REPO = pathlib.Path(__file__).resolve().parents[1]
# Reference outputs of Hugging Face's TransfoXL, shipped with the repository so every
# clone runs the parity tests (copied from ../shared/fixtures; see each README.md).
FIXTURES = REPO / "tests" / "fixtures"


# === Configs ===

# The one tiny model. Deterministic (no dropout) and with weights large enough
# (init_std 0.3) that a changed token or memory moves the log-probs well
# above float32 noise. Vocabulary 11, 2 layers, D 8, 2 heads of 4, T = M = 4.
TINY = dict(
    vocabulary_size=11, num_layers=2, hidden_dim=8, num_heads=2,
    intermediate_dim=16, segment_length=4, memory_length=4, dropout=0.0,
    init_std=0.3, projection_init_std=0.3,
)
# Adaptive input and softmax: a head of 5 ids and one tail cluster of width
# D / 2 (`tiny_config(adaptive=True)`).
ADAPTIVE = dict(cutoffs=(5,), div_val=2)


def tiny_config(adaptive=False, **overrides):
    """The tiny `TransformerXLConfig` of the tests, with `overrides`.

    Args:
        adaptive: bool. Start from adaptive input/softmax (`ADAPTIVE`)
            instead of one plain softmax; `overrides` still win.
        **overrides: any `TransformerXLConfig` field.
    """
    from keras_txl import TransformerXLConfig

    base = dict(TINY)
    if adaptive:
        base.update(ADAPTIVE)
    base.update(overrides)
    return TransformerXLConfig.from_dict(base)  # names an unknown key


# A tiny byte-level model (vocabulary 256) for text in / text out.
BYTE = dict(
    vocabulary_size=256, num_layers=2, hidden_dim=32, num_heads=2,
    head_dim=16, intermediate_dim=64, segment_length=16, memory_length=48,
    dropout=0.0, init_std=0.3, projection_init_std=0.3,
)


def byte_tokenizer():
    """keras-txl's byte tokenizer layer (graph-op tokenize/detokenize)."""
    from keras_txl.tokenizers import ByteTokenizer

    return ByteTokenizer()


def byte_causal_lm(preprocessor=True, **overrides):
    """A `TransformerXLCausalLM` of `BYTE` (+ `overrides`) with a
    `TransformerXLCausalLMPreprocessor` around `byte_tokenizer()`."""
    from keras_txl import TransformerXLCausalLM
    from keras_txl import TransformerXLConfig
    from keras_txl.causal_lm_preprocessor import TransformerXLCausalLMPreprocessor

    config = TransformerXLConfig.from_dict({**BYTE, **overrides})
    attached = None
    if preprocessor:
        attached = TransformerXLCausalLMPreprocessor(
            byte_tokenizer(), sequence_length=config.segment_length
        )
    return TransformerXLCausalLM(config, preprocessor=attached)


def random_ids(shape, vocabulary_size=TINY["vocabulary_size"], seed=0):
    """int32 ids in [0, vocabulary_size) from numpy's generator `seed`."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocabulary_size, size=shape).astype("int32")


# === Distribution ===

_MIRRORED = []


def write_word_corpus(folder, train_words=3000, eval_words=40, seed=0):
    """A `train.txt`/`valid.txt`/`test.txt` folder of random words from a tiny
    vocabulary: enough text for a few hundred `tiny` steps of batch 2 x 8,
    short evaluation splits (the final evaluation is quick)."""
    rng = np.random.default_rng(seed)
    words = "it was the best of times it was the worst of times".split()
    for split, n in (("train", train_words), ("valid", eval_words), ("test", eval_words)):
        (pathlib.Path(folder) / f"{split}.txt").write_text(" ".join(rng.choice(words, size=n)) + "\n")
    return folder


def write_lm1b_release(root, train=("a b .\n", "b c .\n"), heldout=("a z .\n", "c c .\n")):
    """A tiny extracted `1-billion-word-language-modeling-benchmark-r13output`
    at `root`: `train[i]` is training shard i + 1 (`news.en-0000{i+1}-of-00100`,
    written in reverse order, so a reader must sort them), `heldout[i]`
    held-out shard i."""
    root = pathlib.Path(root)
    train_dir = root / "training-monolingual.tokenized.shuffled"
    heldout_dir = root / "heldout-monolingual.tokenized.shuffled"
    train_dir.mkdir(parents=True)
    heldout_dir.mkdir()
    for i, text in reversed(list(enumerate(train, start=1))):
        (train_dir / f"news.en-{i:05d}-of-00100").write_text(text)
    for i, text in enumerate(heldout):
        (heldout_dir / f"news.en.heldout-{i:05d}-of-00050").write_text(text)
    return root


def write_char_run(folder):
    """A training-run folder `folder/run` whose model (tiny, T = M = 4) has a
    char tokenizer fitted on "abc cab bca" (a, b, c, space, newline);
    returns (run folder, vocabulary size)."""
    import keras_txl
    from keras_txl.tokenizers import CharTokenizer

    keras.utils.set_random_seed(0)
    folder = pathlib.Path(folder)
    tokenizer = CharTokenizer.fit(["abc cab bca\n"])
    tokenizer.save(folder / "tokenizer")
    model = keras_txl.TransformerXLCausalLM(tiny_config(
        vocabulary_size=tokenizer.vocabulary_size(), segment_length=4, memory_length=4))
    keras_txl.save_pretrained(model, str(folder / "run" / "model"),
                              tokenizer=str(folder / "tokenizer"))
    return folder / "run", tokenizer.vocabulary_size()


def free_ports(n):
    """`n` free TCP ports on 127.0.0.1 (for a local MultiWorker cluster)."""
    import socket

    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def mirrored_strategy():
    """One MirroredStrategy over the two logical CPUs for the whole session.

    Several MirroredStrategy objects in one process can reuse collective
    instance keys and abort each other's all-reduces ("Shape mismatch in
    the collective instance"), so tests share this one. `conftest.py` splits
    the CPU into two logical devices before TensorFlow starts.
    """
    if not _MIRRORED:
        devices = [d.name for d in tf.config.list_logical_devices("CPU")[:2]]
        _MIRRORED.append(tf.distribute.MirroredStrategy(devices))
    return _MIRRORED[0]


# === Segment chaining ===


class Chain:
    """What `chain_segments` returns.

    Attributes:
        outputs: list of per-segment dicts of numpy arrays ("log_probs",
            "memory" and whatever else the call returned, e.g. "hidden").
        log_probs: (B, N, V) numpy, the segments' log-probs along time.
        memories: list of (B, L, M, D) numpy, the memory after each segment.
        memory: the memory after the last segment, as the call returned it
            (a tensor: pass it on to continue the chain).
        segments: list of the slices of `ids` that were fed.
    """

    def __init__(self, outputs, memory, segments):
        self.outputs = outputs
        self.memory = memory
        self.segments = segments
        self.memories = [out["memory"] for out in outputs]
        self.log_probs = np.concatenate([out["log_probs"] for out in outputs], 1)

    def __len__(self):
        return len(self.outputs)


def _segment_slices(length, segment_length):
    if isinstance(segment_length, int):
        if segment_length <= 0:
            raise ValueError(
                f"`segment_length` must be a positive integer, received {segment_length}."
            )
        starts = range(0, length, segment_length)
        return [slice(s, min(s + segment_length, length)) for s in starts]
    lengths = list(segment_length)
    if sum(lengths) != length or min(lengths, default=0) <= 0:
        raise ValueError(
            f"`segment_length` as a list must be positive lengths that sum to "
            f"the {length} positions of `ids`, received {lengths}."
        )
    ends = np.cumsum(lengths)
    return [slice(int(end - n), int(end)) for n, end in zip(lengths, ends)]


def chain_segments(fn_or_model, ids, segment_length, memory=None,
                   carry_memory=True, **call_kwargs):
    """Feeds `ids` segment by segment, the memory carried from one to the next.

    Args:
        fn_or_model: a model with `call_with_memory`, or a callable
            `fn(token_ids, memory) -> {"log_probs", "memory", ...}` (e.g. a
            `tf.function` or an exported signature).
        ids: (B, N) int array.
        segment_length: int T (the last segment may be shorter), or a list of
            segment lengths that sum to N.
        memory: the memory for the first segment (None: the model's zeros).
        carry_memory: bool. False starts every segment from `memory` (no
            recurrence), for comparisons.
        **call_kwargs: passed to `call_with_memory` (e.g. `return_hidden`).

    Returns:
        `Chain`.
    """
    ids = np.asarray(ids)
    if ids.ndim != 2:
        raise ValueError(f"`ids` must be (batch, length), received shape {ids.shape}.")
    call = getattr(fn_or_model, "call_with_memory", fn_or_model)
    start_memory, outputs, segments = memory, [], []
    for cut in _segment_slices(ids.shape[1], segment_length):
        segment = ids[:, cut]
        out = call(segment, memory if carry_memory else start_memory, **call_kwargs)
        outputs.append({k: keras.ops.convert_to_numpy(v) for k, v in out.items()})
        segments.append(segment)
        memory = out["memory"]
    return Chain(outputs, memory, segments)


def signature_reference(model, ids, segment_length):
    """Per segment, what every export signature must return, from Keras.

    `ids` are fed in segments with the memory carried; the targets are the
    ids shifted left by one (`np.roll`, as the export tests score them).

    Returns:
        list of dicts: "log_probs" (B, T, V), "memory" (B, L, M, D), "nll"
        (B, T) of the targets, "next" (B, V) = log-probs at the last position.
    """
    chain = chain_segments(model, ids, segment_length)
    targets = np.roll(np.asarray(ids), -1, axis=1)
    results = []
    for out, cut in zip(chain.outputs, _segment_slices(ids.shape[1], segment_length)):
        log_probs = out["log_probs"]
        nll = -np.take_along_axis(log_probs, targets[:, cut, None], -1)[..., 0]
        results.append(dict(log_probs=log_probs, memory=out["memory"], nll=nll,
                            next=log_probs[:, -1]))
    return results


# === Layers ===


def _call(layer, input_data, **kwargs):
    if isinstance(input_data, dict):
        return layer(**input_data, **kwargs)
    if isinstance(input_data, (tuple, list)):
        return layer(*input_data, **kwargs)
    return layer(input_data, **kwargs)


def _shapes(structure):
    """Output shapes as tuples; several outputs as a tuple of those."""
    if isinstance(structure, (tuple, list)):
        return tuple(_shapes(x) for x in structure)
    return tuple(structure.shape)


def _expected_shapes(expected):
    if all(isinstance(d, int) or d is None for d in expected):
        return tuple(expected)
    return tuple(_expected_shapes(x) for x in expected)


def _assert_same_outputs(got, expected, message):
    tf.nest.assert_same_structure(got, expected)
    for a, b in zip(tf.nest.flatten(got), tf.nest.flatten(expected)):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), err_msg=message
        )


def run_layer_test(
    layer_cls,
    init_kwargs,
    input_data,
    expected_output_shape,
    expected_num_trainable_weights,
    expected_num_parameters,
    expected_num_non_trainable_weights=0,
    check_gradients=True,
):
    """keras-hub's `TestCase.run_layer_test`, for this project's layers.

    Builds `layer_cls(**init_kwargs)` by calling it on `input_data` and checks:

    - the output shapes equal `expected_output_shape` (a tuple, or a nested
      structure of tuples for layers that return several tensors);
    - the weight counts and `count_params()` equal the expected numbers,
      which the caller computes independently (by hand from the shapes, or
      from `TransformerXLConfig.num_parameters()`);
    - `get_config()` round-trips: `from_config(get_config())` and the Keras
      serialization through JSON (with the class looked up by its registered
      name) give layers with an equal config and, with the same weights,
      exactly the same outputs;
    - with `check_gradients`, every trainable weight gets a gradient from
      the sum of the (float) outputs: no weight is created and left unused.

    Args:
        layer_cls: the layer class.
        init_kwargs: dict of constructor arguments.
        input_data: the call's inputs: a dict (keyword arguments), a tuple
            (positional arguments) or one array.
        expected_output_shape: tuple or nested structure of tuples.
        expected_num_trainable_weights: int.
        expected_num_parameters: int, all weights' elements.
        expected_num_non_trainable_weights: int.
        check_gradients: bool.

    Returns:
        The built layer.
    """
    layer = layer_cls(**init_kwargs)
    output = _call(layer, input_data)
    assert _shapes(output) == _expected_shapes(expected_output_shape), (
        f"output shapes {_shapes(output)}, expected {expected_output_shape}"
    )

    for kind, weights, expected in (
        ("trainable", layer.trainable_weights, expected_num_trainable_weights),
        ("non-trainable", layer.non_trainable_weights, expected_num_non_trainable_weights),
    ):
        assert len(weights) == expected, (
            f"{len(weights)} {kind} weights {[w.path for w in weights]}, expected {expected}"
        )
    assert layer.count_params() == expected_num_parameters, (
        f"{layer.count_params()} parameters, expected {expected_num_parameters}"
    )

    # Config round trip, directly and through JSON (how .keras files keep it).
    config = layer.get_config()
    direct = layer_cls.from_config(config)
    serialized = json.loads(json.dumps(keras.saving.serialize_keras_object(layer)))
    revived = keras.saving.deserialize_keras_object(serialized)
    assert type(revived) is layer_cls, type(revived)
    for other, how in ((direct, "from_config"), (revived, "JSON")):
        assert other.get_config() == config, how
        _call(other, input_data)  # builds it
        other.set_weights(layer.get_weights())
        _assert_same_outputs(_call(other, input_data), output,
                             f"{layer_cls.__name__} after the {how} round trip")

    if check_gradients:
        with tf.GradientTape() as tape:
            result = _call(layer, input_data, training=True)
            loss = tf.add_n([
                tf.reduce_sum(tf.cast(x, "float32")) for x in tf.nest.flatten(result)
                if x.dtype.is_floating
            ])
        grads = tape.gradient(loss, [w.value for w in layer.trainable_weights])
        unused = [w.path for w, g in zip(layer.trainable_weights, grads) if g is None]
        assert not unused, f"no gradient reaches {unused}"
    return layer


# === Models ===


def _model_outputs(model, ids):
    """The numbers a saved model must reproduce: the chained segments of the
    model's T (and, stateful, its calls and the memory variable after them)."""
    T = model.txl_config.segment_length
    if model.stateful:
        outputs = [keras.ops.convert_to_numpy(model(ids[:, cut]))
                   for cut in _segment_slices(ids.shape[1], T)]
        return {"log_probs": np.concatenate(outputs, 1),
                "memory": model.memory.numpy()}
    chain = chain_segments(model, ids, T)
    return {"log_probs": chain.log_probs, "memory": chain.memories[-1]}


def run_model_saving_test(model, input_data):
    """`save_pretrained`/`load_pretrained` and `.keras` round trips.

    Both reloaded models must have the same config, class, statefulness and
    weights, and give exactly the same log-probs and memory as `model` over
    the segments of `input_data` (chained with the model's segment length).
    A stateful model is saved with the memory it holds: the `.keras` file
    keeps that memory (it is a variable of the model), `save_pretrained`
    keeps only the weights, so its reload starts from zero memory.

    Args:
        model: `TransformerXLCausalLM` (pure or stateful).
        input_data: (B, N) int ids; B must be the batch size of a stateful
            model.

    Returns:
        dict: {"pretrained": model, "keras": model}, the reloaded models.
    """
    import keras_txl

    ids = np.asarray(input_data)
    with tempfile.TemporaryDirectory(prefix="txl-saving-test-") as tmp:
        folder = keras_txl.save_pretrained(model, os.path.join(tmp, "pretrained"))
        pretrained = keras_txl.load_pretrained(
            folder, stateful=model.stateful, batch_size=model.batch_size
        )
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        reloaded = keras.models.load_model(path)  # safe_mode stays on
    zero_memory_model = None
    if model.stateful:
        # The pretrained reload starts from zeros: compare it with a copy of
        # `model` that does too.
        zero_memory_model = model.with_settings(stateful=True, batch_size=model.batch_size)
        np.testing.assert_array_equal(reloaded.memory.numpy(), model.memory.numpy())
    for name, other, reference_model in (
        ("keras", reloaded, model),
        ("pretrained", pretrained, zero_memory_model or model),
    ):
        assert type(other) is type(model), (name, type(other))
        assert other.txl_config == model.txl_config, name
        assert other.stateful == model.stateful, name
        for a, b in zip(other.model_weights(), model.model_weights()):
            assert a.path == b.path, (name, a.path, b.path)
            np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=f"{name}: {a.path}")
        got = _model_outputs(other, ids)
        expected = _model_outputs(reference_model, ids)
        for key in got:
            np.testing.assert_array_equal(got[key], expected[key], err_msg=f"{name}: {key}")
    return {"pretrained": pretrained, "keras": reloaded}


def run_litert_export_test(model, input_data, *, stateful=False, quantize="none",
                           atol=1e-4, mean_atol=None):
    """Exports `model` to TFLite and runs it against Keras, segment by segment.

    The model is converted with the project's `export_tflite` (fixed B and T:
    the batch of `input_data` and the config's segment length) and run in
    process with `TFLiteRunner` (LiteRT), the memory carried from segment to
    segment: inside the model when `stateful`, through the signatures'
    memory input/output otherwise. The log-probs (and, stateless, the memory
    after each segment) must match `chain_segments` on the Keras model.

    Args:
        model: `TransformerXLCausalLM`.
        input_data: (B, n * T) int ids.
        stateful: bool. Export the variant that keeps the memory inside.
        quantize: "none", "float16" or "dynamic_int8".
        atol: float. Bound on the largest absolute difference.
        mean_atol: float or None. Bound on the mean absolute difference
            (keras-hub's statistical mode, for quantized models).

    Returns:
        dict of the largest absolute differences, by output name.
    """
    from keras_txl.export import tflite

    ids = np.asarray(input_data)
    T = model.txl_config.segment_length
    if ids.ndim != 2 or ids.shape[1] % T:
        raise ValueError(
            f"`input_data` must be (batch, n * segment_length={T}), received shape "
            f"{ids.shape}."
        )
    with tempfile.TemporaryDirectory(prefix="txl-litert-test-") as tmp:
        path = tflite.export_tflite(
            model, os.path.join(tmp, "model.tflite"), batch_size=ids.shape[0],
            segment_length=T, quantize=quantize, stateful=stateful,
        )
        with open(path, "rb") as f:
            runner = tflite.TFLiteRunner(model_content=f.read())
    assert runner.stateful is stateful
    expected = chain_segments(model, ids, T)
    runner.reset()
    got = {"log_probs": [], "memory": []}
    for segment in expected.segments:
        got["log_probs"].append(runner.step(segment))
        if not stateful:
            got["memory"].append(runner.memory)
    errors = {}
    for key, want in (("log_probs", expected.log_probs), ("memory", expected.memories)):
        if not got[key]:
            continue
        have = np.concatenate(got[key], 1) if key == "log_probs" else np.stack(got[key])
        want = want if key == "log_probs" else np.stack(want)
        difference = np.abs(have - want)
        errors[key] = float(difference.max())
        np.testing.assert_allclose(have, want, atol=atol, rtol=0, err_msg=key)
        if mean_atol is not None:
            assert float(difference.mean()) <= mean_atol, (key, float(difference.mean()))
    return errors
