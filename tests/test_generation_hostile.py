"""Generation as a hostile user drives it: every path that claims the same
greedy text as `model.generate` gives it, on an untrained model whose
log-probs depend on how the prompt was fed."""

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
