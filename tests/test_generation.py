"""Generation: the memory key/value cache equals the uncached path; sampling
is deterministic; greedy decoding is identical on Keras, SavedModel and
TFLite; `txl generate` streams the same text from every source."""

import os
from functools import partial

import keras
import numpy as np
import pytest
import tensorflow as tf
from testing import FIXTURES
from testing import chain_segments
from testing import random_ids
from testing import tiny_config

from keras_txl import TransformerXLCausalLM
from keras_txl import generation
from keras_txl.cli import main
from keras_txl.export import generation as export_generation
from keras_txl.training.loop import eval_cache

V, T, M, B = 11, 4, 3, 2


# The toolkit's tiny model (V 11, 2 layers, D 8, T 4) with adaptive input and
# softmax, and a memory shorter than the segment.
tiny = partial(tiny_config, adaptive=True, memory_length=M)


# === The memory key/value cache ===

CACHE_VARIANTS = {
    "post_ln": {},
    "pre_ln": {"pre_layer_norm": True},
    "same_length_tf": {"same_length": True,
                       "same_length_convention": "official_tf"},
    "pre_ln_same_length_pt_memory_1": {
        "pre_layer_norm": True, "same_length": True,
        "same_length_convention": "pytorch", "memory_length": 1},
    "clamp_untied_plain_softmax": {"clamp_length": 2,
                                   "untie_relative_bias": True,
                                   "cutoffs": (), "div_val": 1},
    "vanilla": {"attention_type": "vanilla"},
    "memory_0": {"memory_length": 0},
}


@pytest.mark.parametrize("variant", sorted(CACHE_VARIANTS))
def test_cache_equals_uncached_at_every_step(variant):
    model = TransformerXLCausalLM(tiny(**CACHE_VARIANTS[variant]))
    memory_length = model.txl_config.memory_length
    memory = model.call_with_memory(random_ids((B, T)))["memory"]
    cache = model.build_cache(memory)
    # Enough steps for the memory window to wrap around 3 times and more.
    steps = 3 * max(memory_length, 1) + 3
    tokens = np.concatenate([random_ids((B, 1), seed=100 + step) for step in range(steps)], 1)
    plain = chain_segments(model, tokens, 1, memory=memory)
    for step, expected in enumerate(plain.outputs):
        cached = model.call_with_cache(tokens[:, step:step + 1], cache)
        np.testing.assert_allclose(
            cached["log_probs"].numpy(), expected["log_probs"],
            atol=1e-5, err_msg=f"log-probs differ at step {step}",
        )
        np.testing.assert_allclose(
            cached["memory"].numpy(), expected["memory"], atol=1e-5,
            err_msg=f"memory differs at step {step}",
        )
        cache = cached["cache"]
    memory = plain.memory
    # The slid windows are the memory and the projections of the memory.
    rebuilt = model.build_cache(memory)
    for name in ("memory", "keys", "values"):
        assert len(cache[name]) == model.txl_config.num_layers
        for slid, fresh in zip(cache[name], rebuilt[name]):
            np.testing.assert_allclose(slid.numpy(), fresh.numpy(), atol=1e-5)


@pytest.mark.parametrize("variant,memory_length", [
    ("post_ln", M), ("pre_ln_same_length_pt_memory_1", 1),
    # M == T (the next cache is the segment's own keys) and M > T.
    ("post_ln", T), ("pre_ln", T + 3),
])
def test_cache_with_whole_segments_equals_call_with_memory(variant, memory_length):
    model = TransformerXLCausalLM(tiny(**{**CACHE_VARIANTS[variant],
                                         "memory_length": memory_length}))
    lengths = [T, T, 3, T]  # 3: positions re-projected
    tokens = np.concatenate([random_ids((B, n), seed=s) for s, n in enumerate(lengths)], 1)
    plain = chain_segments(model, tokens, lengths, memory=model.initial_memory(B))
    cache = model.build_cache(model.initial_memory(B), segment_length=T)
    # Evaluation's cache (`eval_cache`): the keys and values alone, the same
    # log-probs and the same slid windows, no memory to read back.
    bare = eval_cache(model, B, T)
    assert set(bare) == set(cache) - {"memory"}
    for segment, expected in zip(plain.segments, plain.outputs):
        cached = model.call_with_cache(segment, cache)
        np.testing.assert_allclose(cached["log_probs"].numpy(),
                                   expected["log_probs"], atol=1e-5)
        np.testing.assert_allclose(cached["memory"].numpy(),
                                   expected["memory"], atol=1e-5)
        cache = cached["cache"]
        without = model.call_with_cache(segment, bare)
        assert "memory" not in without and "memory" not in without["cache"]
        np.testing.assert_array_equal(without["log_probs"].numpy(),
                                      cached["log_probs"].numpy())
        for name in ("keys", "values"):
            for kept, slid in zip(cache[name], without["cache"][name]):
                np.testing.assert_array_equal(slid.numpy(), kept.numpy())
        bare = without["cache"]
    with pytest.raises(ValueError, match="keep_memory=True"):
        model.backbone.stack_memory(bare)
    with pytest.raises(ValueError, match="`keep_memory` must be True or False.*'no'"):
        model.build_cache(batch_size=B, keep_memory="no")


# === Sampling ===


def test_sample_next_greedy_top_k_top_p():
    # The host loops pick with keras-hub's samplers, as model.generate does.
    log_probs = np.log(np.array([0.1, 0.5, 0.15, 0.25]))

    def draws(n, **options):
        sampler = generation.sampler_from_options(seed=0, **options)
        return [generation.sample_next(log_probs, sampler) for _ in range(n)]

    assert draws(1, temperature=0) == [1]
    assert set(draws(20, temperature=5.0, top_k=1)) == {1}
    assert set(draws(20, top_p=0.4)) == {1}
    # top_p=0.7 keeps {0.5, 0.25}; top_k=3 keeps {0.5, 0.25, 0.15}.
    assert set(draws(200, top_p=0.7)) == {1, 3}
    assert set(draws(300, top_k=3)) == {1, 2, 3}
    # The same seed draws the same ids.
    assert draws(30, top_k=3) == draws(30, top_k=3)


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -1.0}, "temperature"),
    ({"top_k": -2}, "top_k"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
])
def test_bad_sampling_settings_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generation.sampler_from_options(**kwargs)


def test_generate_is_deterministic_streams_and_cache_changes_nothing():
    model = TransformerXLCausalLM(tiny())
    cached = generation.KerasBackend(model)
    uncached = generation.KerasBackend(model, use_cache=False)
    prompt = random_ids(6)
    streamed = []
    kwargs = dict(temperature=1.0, top_k=6, top_p=0.95, seed=7)
    first = generation.generate(cached, prompt, 15, on_token=streamed.append,
                                **kwargs)
    traces = cached.num_traces
    assert first.dtype == np.int32 and first.shape == (15,)
    assert streamed == first.tolist()
    np.testing.assert_array_equal(
        generation.generate(cached, prompt, 15, **kwargs), first)
    np.testing.assert_array_equal(
        generation.generate(uncached, prompt, 15, **kwargs), first)
    others = [generation.generate(cached, prompt, 15, temperature=1.0, seed=s)
              for s in range(3)]
    assert len({tuple(o) for o in others}) > 1
    assert generation.generate(cached, prompt, 0).shape == (0,)
    # Traced for the prompt chunks (4 and 2) and the steps (1), not once
    # per step or per call.
    assert traces <= 3 and cached.num_traces == traces


def test_generate_rejects_bad_inputs():
    model = TransformerXLCausalLM(tiny())
    with pytest.raises(ValueError, match="at least one"):
        generation.generate(model, [], 3)
    with pytest.raises(ValueError, match="vocabulary_size=11"):
        generation.generate(model, [1, 11], 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generation.generate(model, [1], -1)
    with pytest.raises(ValueError, match="schedule"):
        generation.generate(model, [1], 2, schedule="sliding")

    class FixedFour:  # a backend exported with T = 4
        segment_length, vocabulary_size = 4, V

        def initial_state(self, memory=None):
            return None

        def run(self, token_ids, state, position=-1):
            raise AssertionError("not reached")

    with pytest.raises(ValueError, match="segment-length 1"):
        generation.generate(FixedFour(), [1], 2, schedule="token")
    with pytest.raises(ValueError, match="fixed segment length of 4"):
        generation.generate(FixedFour(), [1], 2, segment_length=2)


def test_text_stream_holds_back_incomplete_characters():
    from keras_txl.tokenizers import ByteTokenizer

    tokenizer = ByteTokenizer()
    stream = generation.TextStream(tokenizer, tokenizer.encode("caf"))
    pieces = [stream.add(i) for i in tokenizer.encode("é ok")]
    assert pieces == ["", "é", " ", "o", "k"]
    assert stream.finish() == "" and stream.text == "é ok"


# === Keras vs SavedModel vs TFLite, and the CLI ===

CYCLE = "txl keras!"  # 10 distinct characters: a deterministic successor


class Recording:
    """A backend wrapper that keeps the log-probs each step returns."""

    def __init__(self, backend):
        self.backend, self.log_probs = backend, []
        self.segment_length = backend.segment_length
        self.vocabulary_size = backend.vocabulary_size
        self.config = getattr(backend, "config", None)

    def initial_state(self, memory=None):
        return self.backend.initial_state(memory)

    def run(self, token_ids, state, position=-1):
        log_probs, state = self.backend.run(token_ids, state, position)
        self.log_probs.append(np.asarray(log_probs))
        return log_probs, state


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny model trained on a repeated phrase, saved and exported."""
    from keras_txl.export.saved_model import export_saved_model
    from keras_txl.export.tflite import export_tflite
    from keras_txl.io import save_pretrained
    from keras_txl.tokenizers import CharTokenizer

    keras.utils.set_random_seed(0)
    tokenizer = CharTokenizer.fit([CYCLE])
    config = tiny(vocabulary_size=tokenizer.vocabulary_size(), hidden_dim=16,
                  intermediate_dim=32, memory_length=4, init_std=0.02,
                  projection_init_std=0.01)
    model = TransformerXLCausalLM(config)
    stream = tokenizer.encode(CYCLE * 20)
    optimizer = keras.optimizers.Adam(0.02)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            log_probs = model.call_with_memory(x, None, training=True)["log_probs"]
            loss = -tf.reduce_mean(tf.gather(log_probs, y, batch_dims=2))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    rng = np.random.default_rng(0)
    for _ in range(60):
        starts = rng.integers(0, len(stream) - T - 1, 8)
        x = np.stack([stream[s:s + T] for s in starts])
        y = np.stack([stream[s + 1:s + T + 1] for s in starts])
        loss = float(train_step(x, y))
    assert loss < 0.5, loss

    root = tmp_path_factory.mktemp("generation")
    workdir = root / "run"
    save_pretrained(model, str(workdir / "model"), tokenizer=tokenizer)
    tokenizer_dir = str(workdir / "model" / "tokenizer")
    out = root / "export"
    saved = export_saved_model(model, str(out), tokenizer_dir=tokenizer_dir,
                               warmup=False)
    # The shape `txl export --format tflite` writes by default: B=1, T=T.
    tflite_4 = export_tflite(model, str(out / "txl.tflite"), batch_size=1,
                             segment_length=T, tokenizer_dir=tokenizer_dir)
    return dict(model=model, tokenizer=tokenizer, workdir=str(workdir),
                saved=saved, tflite_4=tflite_4, out=out)


def greedy(backend, prompt, n=24, **kwargs):
    recording = Recording(backend)
    tokens = generation.generate(recording, prompt, n, temperature=0, **kwargs)
    return tokens, np.stack(recording.log_probs)


def test_greedy_is_identical_on_keras_saved_model_and_tflite(exported):
    model, tokenizer = exported["model"], exported["tokenizer"]
    prompt = tokenizer.encode("keras!")  # 6 ids: one full segment + 2
    cached, cached_lp = greedy(generation.KerasBackend(model), prompt)
    assert tokenizer.decode(cached).startswith("txl keras!txl")
    assert len(set(cached.tolist())) == len(CYCLE)  # not a fixed point
    uncached, uncached_lp = greedy(
        generation.KerasBackend(model, use_cache=False), prompt)
    saved, saved_lp = greedy(export_generation.SavedModelBackend(exported["saved"]),
                             prompt)
    for tokens, log_probs in ((uncached, uncached_lp), (saved, saved_lp)):
        np.testing.assert_array_equal(tokens, cached)
        np.testing.assert_allclose(log_probs, cached_lp, atol=1e-5)

    # TFLite with T = 4: the "segment" schedule, padded partial segments.
    keras_4, keras_4_lp = greedy(generation.KerasBackend(model), prompt,
                                 schedule="segment")
    tflite_4, tflite_4_lp = greedy(
        export_generation.TFLiteBackend.from_file(exported["tflite_4"]), prompt)
    np.testing.assert_array_equal(tflite_4, keras_4)
    np.testing.assert_allclose(tflite_4_lp, keras_4_lp, atol=1e-4)
    np.testing.assert_array_equal(keras_4, cached)  # a well-learned phrase


def test_greedy_is_identical_on_keras_and_a_tflite_model_with_t_1(exported):
    from keras_txl.export.tflite import export_tflite

    model, tokenizer = exported["model"], exported["tokenizer"]
    path = export_tflite(model, str(exported["out"] / "t1" / "txl.tflite"),
                         batch_size=1, segment_length=1)
    prompt = tokenizer.encode("keras!")
    # T = 1: the prompt goes one token at a time ("token" schedule through
    # next_token), as in Keras with segment_length=1.
    expected, expected_lp = greedy(generation.KerasBackend(model), prompt,
                                   segment_length=1)
    tokens, log_probs = greedy(export_generation.TFLiteBackend.from_file(path), prompt)
    np.testing.assert_array_equal(tokens, expected)
    np.testing.assert_allclose(log_probs, expected_lp, atol=1e-4)


def test_sampling_with_a_seed_is_identical_across_backends(exported):
    model, tokenizer = exported["model"], exported["tokenizer"]
    prompt = tokenizer.encode("txl k")
    kwargs = dict(temperature=4.0, top_k=5, seed=3, schedule="segment")
    expected = generation.generate(model, prompt, 20, **kwargs)
    assert len(set(expected.tolist())) > 1
    for backend in (export_generation.SavedModelBackend(exported["saved"]),
                    export_generation.TFLiteBackend.from_file(exported["tflite_4"])):
        np.testing.assert_array_equal(
            generation.generate(backend, prompt, 20, **kwargs), expected)


def test_cli_streams_the_same_text_from_every_source(exported, capsys):
    common = ["--prompt", "txl ", "--max-new-tokens", "13", "--temperature",
              "0"]
    outputs = {}
    for name, source in (
        ("workdir", ["--workdir", exported["workdir"]]),
        ("saved_model", ["--saved-model", os.path.dirname(exported["saved"])]),
        ("tflite_4", ["--tflite", exported["tflite_4"]]),
    ):
        assert main(["generate", *source, *common]) == 0
        outputs[name] = capsys.readouterr().out
    assert outputs["workdir"] == "txl " + (CYCLE * 3)[4:4 + 13] + "\n"
    assert outputs["saved_model"] == outputs["workdir"]
    assert outputs["tflite_4"] == outputs["workdir"]


def test_cli_samples_a_keras_source_with_model_generate(exported, capsys):
    """`txl generate --workdir` runs `generate_ids` (keras-hub samplers over
    the compiled `model.generate`): the same seed, the same text."""
    model, tokenizer = exported["model"], exported["tokenizer"]
    argv = ["generate", "--workdir", exported["workdir"], "--prompt", "txl ",
            "--max-new-tokens", "10", "--temperature", "4.0", "--top-k", "5",
            "--seed", "3"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    (new,) = generation.generate_ids(model, [tokenizer.encode("txl ")], 10,
                                     temperature=4.0, top_k=5, seed=3)
    assert printed == "txl " + tokenizer.decode(new.tolist()) + "\n"
    assert main(argv) == 0 and capsys.readouterr().out == printed
    assert len(set(new.tolist())) > 1


def test_cli_prompt_ids_with_a_hugging_face_folder(capsys):
    folder = FIXTURES / "hf_transfo_xl_tiny"
    argv = ["generate", "--from-hf", str(folder), "--max-new-tokens", "6",
            "--seed", "0", "--top-k", "3"]
    assert main([*argv, "--prompt-ids", "1,2,3"]) == 0
    printed = capsys.readouterr().out.split()
    assert len(printed) == 6 and all(x.isdigit() for x in printed)
    assert main([*argv, "--prompt", "hello"]) == 2
    assert "--prompt-ids" in capsys.readouterr().err


def test_cli_errors_are_clear(tmp_path, capsys):
    assert main(["generate", "--saved-model", str(tmp_path), "--prompt-ids",
                 "1", "--max-new-tokens", "1"]) == 2
    assert "not a SavedModel" in capsys.readouterr().err
    assert main(["generate", "--workdir", str(tmp_path), "--prompt", "a"]) == 2
    assert "No model" in capsys.readouterr().err


# === keras-hub generation: generate_ids / generate_text ===


def test_generate_ids_is_batched_compiled_and_seeded():
    """`generate_ids` (keras-hub samplers over `model.generate`): greedy
    equals the host loop fed one token at a time, a batch equals each
    prompt alone, a seed fixes the samples, bad options are refused."""
    keras.utils.set_random_seed(0)
    model = TransformerXLCausalLM(tiny())
    prompts = [random_ids(n, seed=n).tolist() for n in (2, 5, 9)]
    batch = generation.generate_ids(model, prompts, 7, temperature=0)
    for prompt, new in zip(prompts, batch):
        np.testing.assert_array_equal(
            generation.generate_ids(model, [prompt], 7, temperature=0)[0], new)
        np.testing.assert_array_equal(
            generation.generate(model, prompt, 7, temperature=0, segment_length=1), new)
    options = dict(temperature=1.0, top_k=6, top_p=0.9, seed=3)
    first = generation.generate_ids(model, prompts, 12, **options)
    again = generation.generate_ids(model, prompts, 12, **options)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    samples = {tuple(generation.generate_ids(model, prompts[:1], 12, temperature=1.0,
                                             seed=s)[0]) for s in range(3)}
    assert len(samples) > 1
    # top_k=1 keeps only the most likely id: greedy at any temperature.
    for a, b in zip(generation.generate_ids(model, prompts, 7, temperature=3.0,
                                            top_k=1, seed=1), batch):
        np.testing.assert_array_equal(a, b)
    for kwargs, message in [({"temperature": -1}, "temperature"), ({"top_p": 0.0}, "top_p"),
                            ({"top_k": -1}, "top_k"), ({"seed": -1}, "seed")]:
        with pytest.raises(ValueError, match=message):
            generation.generate_ids(model, prompts, 3, **kwargs)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generation.generate_ids(model, prompts, 0)
    with pytest.raises(ValueError, match="non-empty list"):
        generation.generate_ids(model, [], 3)
