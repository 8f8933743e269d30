"""Generation as a hostile user drives it: every path that claims the same
greedy text as `model.generate` gives it, on an untrained model whose
log-probs depend on how the prompt was fed."""

import re

import keras
import numpy as np
import pytest
from testing import tiny_config

import keras_txl
from keras_txl import generation
from keras_txl.cli import main

# An untrained model with large weights (V 50, T = M = 4): a prompt fed as one
# segment (M zero memory vectors at every position) gives log-probs up to ~0.9
# away from the same prompt fed one token at a time, enough to change the
# greedy tokens of these prompts.
PROMPTS = [[23, 25, 37, 47], [1, 7, 41, 47], [12, 15, 43, 21],
           [43, 37, 41, 26, 40, 16]]


@pytest.fixture(scope="module")
def untrained():
    keras.utils.set_random_seed(0)
    return keras_txl.TransformerXLCausalLM(tiny_config(
        vocabulary_size=50, memory_length=4, init_std=1.0, projection_init_std=1.0))


def test_host_loop_greedy_equals_model_generate_by_default(untrained):
    # The host loop (txl generate --no-cache, exported models' next_token)
    # fed the prompt in chunks of the model's segment length, model.generate
    # one token at a time: their greedy tokens differed, although the
    # documentation promised the same text.
    expected = generation.generate_ids(untrained, PROMPTS, 6, temperature=0)
    differs = 0
    for prompt, new in zip(PROMPTS, expected):
        for use_cache in (True, False):
            np.testing.assert_array_equal(
                generation.generate(untrained, prompt, 6, temperature=0,
                                    use_cache=use_cache), new)
        chunked = generation.generate(untrained, prompt, 6, temperature=0,
                                      segment_length=4)
        differs += not np.array_equal(chunked, new)
    assert differs  # the prompt's chunking matters for this model


def test_cli_no_cache_prints_the_greedy_text_of_the_default_path(untrained, tmp_path,
                                                                  capsys):
    keras_txl.save_pretrained(untrained, str(tmp_path / "run" / "model"))
    argv = ["generate", "--workdir", str(tmp_path / "run"), "--prompt-ids",
            ",".join(map(str, PROMPTS[0])), "--max-new-tokens", "6",
            "--temperature", "0"]
    outputs = []
    for flags in ([], ["--no-cache"], ["--schedule", "token"]):
        assert main([*argv, *flags]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[1] == outputs[0] and outputs[2] == outputs[0]


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_generate_refuses_non_finite_log_probs(bad):
    # The host loop raised on NaN/+Inf log-probs; model.generate (and
    # generate_ids, txl generate) printed argmax(NaN) tokens in silence.
    keras.utils.set_random_seed(0)
    model = keras_txl.TransformerXLCausalLM(tiny_config(memory_length=4))
    model.compile(sampler="greedy")
    weights = model.get_weights()
    weights[0] = np.full_like(weights[0], bad)
    model.set_weights(weights)
    with pytest.raises(ValueError, match="NaN or \\+Inf log-probabilities"):
        generation.generate(model, [1, 2], 3, temperature=0)
    with pytest.raises(ValueError, match=r"NaN or \+Inf log-probabilities .*rows \[0, 1\]"):
        model.generate([[1, 2], [3]], max_length=5)
    with pytest.raises(ValueError, match="NaN or \\+Inf log-probabilities"):
        generation.generate_ids(model, [[1, 2]], 3, temperature=1.0, seed=0)


@pytest.mark.parametrize("bad, num_beams", [(np.nan, 3), (np.inf, 1)])
def test_beam_search_refuses_non_finite_log_probs(bad, num_beams):
    # Greedy and sampling refused NaN/+Inf log-probs; beam search (keras-hub's
    # own loop) ranked its beams on them in silence and returned made-up ids.
    import keras_hub

    keras.utils.set_random_seed(0)
    model = keras_txl.TransformerXLCausalLM(tiny_config(memory_length=4))
    model.compile(sampler=keras_hub.samplers.BeamSampler(num_beams=num_beams))
    weights = model.get_weights()
    weights[0] = np.full_like(weights[0], bad)
    model.set_weights(weights)
    with pytest.raises(ValueError, match=r"NaN or \+Inf log-probabilities .*rows \[0, 1\]"):
        model.generate([[1, 2], [3]], max_length=5, stop_token_ids=(4, 5))


@pytest.fixture(scope="module")
def masked_model():
    keras.utils.set_random_seed(0)
    model = keras_txl.TransformerXLCausalLM(tiny_config(
        vocabulary_size=50, memory_length=8, empty_memory="masked", init_std=1.0,
        projection_init_std=1.0))
    model.compile(sampler="greedy", jit_compile=False)  # quicker to trace
    return model


def test_host_loop_continues_a_partly_empty_masked_memory(masked_model):
    # The host loop's `initial_memory` took no mask: a memory from
    # model.generate(return_memory=True) with unfilled (masked) slots was
    # resumed as if every slot were real, and gave other tokens than
    # model.generate continuing the same memory with its mask.
    model = masked_model
    _, memory, mask = model.generate([[44, 47, 0]], max_length=5, return_memory=True)
    memory, mask = np.asarray(memory), np.asarray(mask)
    assert 0 < mask.sum() < mask.size  # partly empty
    # Each backend's first step equals call_with_memory with the mask.
    reference = model.call_with_memory(np.array([[3]], np.int32), memory,
                                       memory_mask=mask)["log_probs"][0, -1]
    for use_cache in (True, False):
        backend = generation.KerasBackend(model, use_cache=use_cache)
        log_probs, _ = backend.run(np.array([[3]], np.int32),
                                   backend.initial_state(memory, memory_mask=mask))
        np.testing.assert_allclose(log_probs, reference, atol=1e-5)
    expected = model.generate([[3, 3]], max_length=8, memory=memory,
                              memory_mask=mask, strip_prompt=True)[0]
    np.testing.assert_array_equal(generation.generate(
        model, [3, 3], 6, temperature=0, initial_memory=memory,
        initial_memory_mask=mask), expected)
    # The mask matters here: every slot taken as real gives other tokens.
    all_real = generation.generate(model, [3, 3], 6, temperature=0,
                                   initial_memory=memory,
                                   initial_memory_mask=np.ones_like(mask))
    assert not np.array_equal(all_real, expected)


def test_host_loop_initial_memory_mask_errors_name_it(masked_model, untrained):
    memory = np.zeros((1, 2, 8, 8), np.float32)
    with pytest.raises(ValueError, match="`initial_memory_mask` is required"):
        generation.generate(masked_model, [1], 2, initial_memory=memory)
    for bad in (np.ones((1, 8), np.int32), np.ones((1, 7), bool), np.ones((8,), bool)):
        with pytest.raises(ValueError, match=r"`initial_memory_mask` must be a bool "
                                             r"array of shape \(1, memory_length\)"):
            generation.generate(masked_model, [1], 2, initial_memory=memory,
                                initial_memory_mask=bad)
    with pytest.raises(ValueError, match="`initial_memory_mask` is the validity"):
        generation.generate(masked_model, [1], 2, initial_memory_mask=np.ones((1, 8), bool))
    with pytest.raises(ValueError, match="`initial_memory_mask` is only for a model"):
        generation.generate(untrained, [1], 2, initial_memory=np.zeros((1, 2, 4, 8)),
                            initial_memory_mask=np.ones((1, 4), bool))


def test_host_loop_refuses_a_non_bool_use_cache_and_a_non_callable_on_token(untrained):
    # use_cache="no" was truthy and decoded with the cache in silence;
    # on_token=5 failed with a TypeError after the first id was computed.
    with pytest.raises(ValueError, match="`use_cache` must be True or False"):
        generation.generate(untrained, [1, 2], 2, use_cache="no")
    with pytest.raises(ValueError, match="`use_cache` must be True or False"):
        generation.KerasBackend(untrained, use_cache=0)
    seen = []
    with pytest.raises(ValueError, match="`on_token` must be None or a callable"):
        generation.generate(untrained, [1, 2], 2, on_token=5)
    generation.generate(untrained, [1, 2], 2, on_token=seen.append, use_cache=np.bool_(False))
    assert len(seen) == 2


def test_host_loops_cap_max_new_tokens_before_anything_runs(untrained, tmp_path):
    # generate/generate_iter (the Keras, SavedModel and TFLite host loops)
    # took max_new_tokens=2**40 and ran one step per token for as long as
    # asked, in effect forever; model.generate, generate_ids and txl
    # generate refuse more than 2**20 tokens (prompt included) per call.
    def stop(token):
        raise RuntimeError("the loop ran")

    expected = re.escape(
        "`max_new_tokens` must be at most 1048573: the prompt (3 tokens) and the new "
        "tokens come to more than the 1048576 (MAX_GENERATE_LENGTH, 2**20) tokens of "
        "one call; received max_new_tokens=1099511627776. Generate a longer text in "
        "pieces, each continuing from the memory of the one before: "
        "model.generate(..., return_memory=True), then memory=")
    for use_cache in (True, False):
        with pytest.raises(ValueError, match=expected):
            generation.generate(untrained, [1, 2, 3], 2**40, on_token=stop,
                                use_cache=use_cache)
        with pytest.raises(ValueError, match=expected):
            generation.generate_iter(untrained, [1, 2, 3], 2**40, use_cache=use_cache)
    with pytest.raises(ValueError, match=r"must be at most 1048573: .* received "
                                         r"max_new_tokens=1048574\."):
        generation.generate_iter(untrained, [1, 2, 3], 2**20 - 2)
    with pytest.raises(ValueError, match=r"must be at most 1048575: .* received "
                                         r"max_new_tokens=1099511627776\."):
        generation.generate_ids(untrained, [[1]], 2**40)
    # The largest allowed count is accepted.
    assert next(generation.generate_iter(untrained, [1, 2, 3], 2**20 - 3)) in range(50)
    # generate_text: refused before the model folder is read (there is none).
    with pytest.raises(ValueError, match=r"`max_new_tokens` must be at most 1048575: "):
        generation.generate_text(str(tmp_path / "no-model"), "hi", 2**40)
