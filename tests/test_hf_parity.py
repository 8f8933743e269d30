"""Numerical parity with Hugging Face's PyTorch TransfoXL on saved fixtures.

`../shared/fixtures/hf_transfo_xl_tiny` (cutoffs + div_val 2, untied r
biases, post-LN) and the folders under `tests/fixtures/` (made by
`tools/make_hf_fixtures.py` with transformers 4.37.2 for the options the
shared one does not cover, and two saved in float16/bfloat16) hold weights,
inputs and expected outputs of three segments with the memory carried.
"""

import glob
import json
import os
import re

import numpy as np
import pytest
from testing import FIXTURES
from testing import chain_segments

import keras_txl
from keras_txl.hf_checkpoint import config_from_hf

SHARED = FIXTURES / "hf_transfo_xl_tiny"


def _fixture_dirs():
    dirs = sorted(os.path.dirname(p) for p in glob.glob(str(FIXTURES / "*" / "config.json")))
    assert len(dirs) >= 12, f"the HF fixtures are missing from {FIXTURES}"
    return [pytest.param(d, id=os.path.basename(d)) for d in dirs]


def _run_segments(model, directory):
    """[(segment ids, outputs)] of the fixture's inputs, memory carried, in
    segments as wide as the reference's."""
    ids = np.load(os.path.join(directory, "inputs.npy"))
    width = np.load(os.path.join(directory, "expected_logprobs_seg0.npy")).shape[1]
    chain = chain_segments(model, ids, width, return_hidden=True)
    return list(zip(chain.segments, chain.outputs))


@pytest.mark.parametrize("directory", _fixture_dirs())
def test_matches_reference_over_three_segments(directory):
    model = keras_txl.load_hf_checkpoint(directory)
    with open(os.path.join(directory, "config.json")) as f:
        mem_len = json.load(f)["mem_len"]
    results = _run_segments(model, directory)
    assert len(results) == 3
    for s, (segment, out) in enumerate(results):
        expected = np.load(os.path.join(directory, f"expected_logprobs_seg{s}.npy"))
        np.testing.assert_allclose(
            out["log_probs"], expected, atol=1e-4, rtol=1e-5,
            err_msg=f"log-probs of segment {s}",
        )
        hidden_path = os.path.join(directory, f"expected_hidden_seg{s}.npy")
        if os.path.exists(hidden_path):
            np.testing.assert_allclose(
                out["hidden"], np.load(hidden_path), atol=5e-5, rtol=1e-5,
                err_msg=f"hidden of segment {s}",
            )
        memory = out["memory"]
        assert memory.shape[2] == mem_len
        mems_path = os.path.join(directory, f"expected_mems_seg{s}.npz")
        if mem_len:
            expected_mems = np.load(mems_path)
            for layer in range(memory.shape[1]):
                # HF memory is time-major (M, B, D); ours is (B, L, M, D).
                reference = expected_mems[f"layer_{layer}"].transpose(1, 0, 2)
                np.testing.assert_allclose(
                    memory[:, layer], reference, atol=5e-5, rtol=1e-5,
                    err_msg=f"memory of layer {layer} after segment {s}",
                )


def test_per_token_losses_match_reference():
    model = keras_txl.load_hf_checkpoint(str(SHARED))
    for s, (segment, out) in enumerate(_run_segments(model, str(SHARED))):
        log_probs = out["log_probs"]
        # NLL of token t+1 predicted at position t, within the segment.
        nll = -np.take_along_axis(
            log_probs[:, :-1], segment[:, 1:, None], axis=-1
        )[..., 0]
        expected = np.load(SHARED / f"expected_loss_inorder_seg{s}.npy")
        np.testing.assert_allclose(nll, expected, atol=1e-4, rtol=1e-5)
        mean = np.load(SHARED / f"expected_meanloss_seg{s}.npy")
        np.testing.assert_allclose(nll[nll != 0].mean(), mean, atol=1e-4)


def test_config_mapping_of_reference():
    with open(SHARED / "config.json") as f:
        config = keras_txl.hf_checkpoint.config_from_hf(json.load(f))
    assert config.cutoffs == (100, 200)
    assert config.div_val == 2
    assert config.memory_length == 12
    assert config.tie_projections == (False, True, True)
    assert config.same_length_convention == "pytorch"
    assert config.layer_norm_epsilon == 1e-5
    assert config.untie_relative_bias


def test_rejects_unsupported_attention_type(tmp_path):
    hf = {"vocab_size": 10, "d_model": 8, "n_head": 2, "d_head": 4,
          "d_inner": 8, "n_layer": 1, "attn_type": 2}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match="attn_type=2"):
        keras_txl.load_hf_checkpoint(str(tmp_path))


@pytest.mark.parametrize("model_type", ["gpt2", "xlnet", 7])
def test_rejects_a_config_of_another_architecture(tmp_path, model_type):
    # GPT-2's config.json holds n_layer, n_head, ... too: it was read as TransfoXL.
    hf = json.loads((SHARED / "config.json").read_text())
    hf["model_type"] = model_type
    (tmp_path / "config.json").write_text(json.dumps(hf))
    (tmp_path / "model.safetensors").write_bytes((SHARED / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match=rf"model_type={model_type!r} is not a TransfoXL "
                                         "checkpoint: only model_type 'transfo-xl'"):
        keras_txl.load_hf_checkpoint(str(tmp_path))


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "missing"])
def test_a_file_or_missing_path_given_for_the_folder_is_named(name, tmp_path):
    # Was "No config.json in '.../config.json'" (or in '.../model.safetensors',
    # or in a folder that does not exist).
    path = SHARED / name if name != "missing" else tmp_path / "nothing-here"
    with pytest.raises(ValueError) as info:
        keras_txl.load_hf_checkpoint(path)
    message = str(info.value)
    if name == "missing":
        assert f"`directory`={str(path)!r} does not exist" in message
    else:
        assert f"`directory`={str(path)!r} is a file" in message
        assert f"pass the folder that holds it: {str(SHARED)!r}" in message


def test_truncated_safetensors_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_bytes((SHARED / "config.json").read_bytes())
    data = (SHARED / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated or corrupted"):
        keras_txl.load_hf_checkpoint(str(tmp_path))


def test_a_base_model_without_the_lm_head_is_named(tmp_path):
    # A TransfoXLModel checkpoint (no LM head: names without "transformer.",
    # no "crit." tensors) failed as "missing tensor
    # 'transformer.word_emb.emb_layers.0.weight'".
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    hf = json.loads((SHARED / "config.json").read_text())
    hf["architectures"] = ["TransfoXLModel"]
    (tmp_path / "config.json").write_text(json.dumps(hf))
    tensors = load_file(str(SHARED / "model.safetensors"))
    base = {name.removeprefix("transformer."): value for name, value in tensors.items()
            if not name.startswith("crit.")}
    save_file(base, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model.safetensors holds no adaptive softmax \('crit.' "
                       r"tensors\): a base TransfoXLModel checkpoint without the LM head \(its "
                       r"config.json says architectures=\['TransfoXLModel'\]\).*Pass the folder "
                       r"of a TransfoXLLMHeadModel checkpoint"):
        keras_txl.load_hf_checkpoint(str(tmp_path))
    hf["architectures"] = ["TransfoXLLMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match=r"without the LM head \(its config.json says "
                       r"architectures=\['TransfoXLLMHeadModel'\]: the head's tensors are missing\)"):
        keras_txl.load_hf_checkpoint(str(tmp_path))
    # Sharded as transformers saves it, and with "transformer." kept: the same.
    del hf["architectures"]
    (tmp_path / "config.json").write_text(json.dumps(hf))
    (tmp_path / "model.safetensors").unlink()
    save_file({name: value for name, value in tensors.items() if not name.startswith("crit.")},
              str(tmp_path / "model-00001-of-00001.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {name: "model-00001-of-00001.safetensors"
                        for name in tensors if not name.startswith("crit.")}}))
    with pytest.raises(ValueError, match=r"index.json holds no adaptive softmax .*without the LM "
                                         r"head, from which"):
        keras_txl.load_hf_checkpoint(str(tmp_path))


def test_weights_of_another_config_are_rejected(tmp_path):
    hf = json.loads((SHARED / "config.json").read_text())
    hf["d_inner"] = 96
    (tmp_path / "config.json").write_text(json.dumps(hf))
    (tmp_path / "model.safetensors").write_bytes(
        (SHARED / "model.safetensors").read_bytes()
    )
    with pytest.raises(ValueError, match="CoreNet.0.weight.*expected \\(96, 64\\)"):
        keras_txl.load_hf_checkpoint(str(tmp_path))


def test_zero_size_tensors_left_out_of_the_file_load_as_empty(tmp_path):
    # transformers' save_pretrained leaves the 0-size projections of a 0-wide
    # cluster (`emb_projs.3`, `out_projs.3` [d_model, 0]) out of the file: they
    # were "missing tensor 'transformer.word_emb.emb_projs.3'". A 0-size tensor
    # holds nothing, so its absence loses nothing.
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    source = FIXTURES / "zero_wide_last_cluster"
    for name in os.listdir(source):
        if name != "model.safetensors":
            (tmp_path / name).write_bytes((source / name).read_bytes())
    tensors = load_file(str(source / "model.safetensors"))
    empty = sorted(name for name, value in tensors.items() if value.size == 0)
    assert empty == ["crit.out_layers.3.weight", "crit.out_projs.3",
                     "transformer.word_emb.emb_layers.3.weight", "transformer.word_emb.emb_projs.3"]
    save_file({name: value for name, value in tensors.items() if value.size},
              str(tmp_path / "model.safetensors"))
    model = keras_txl.load_hf_checkpoint(str(tmp_path))
    assert tuple(model.backbone.token_embedding.tables[3].shape) == (30, 0)
    for s, (segment, out) in enumerate(_run_segments(model, str(tmp_path))):
        expected = np.load(tmp_path / f"expected_logprobs_seg{s}.npy")
        np.testing.assert_allclose(out["log_probs"], expected, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("fixture, absent", [
    ("hf_transfo_xl_tiny", ["div_val", "d_embed", "cutoffs"]),
    ("div1_cutoffs_dembed", ["div_val", "d_embed"]),
    ("no_cutoffs_same_length_clamp", ["div_val", "cutoffs", "d_embed"]),
    ("zero_wide_last_cluster", ["div_val"]),
])
def test_shape_fields_missing_from_config_json_are_read_from_the_weights(fixture, absent, tmp_path):
    # A hand-written config.json without div_val / d_embed / cutoffs: they
    # were taken as 1 / d_model / [] whatever the weights held ("tensor
    # 'transformer.word_emb.emb_layers.0.weight' has shape (100, 64),
    # expected (300, 64)"); the tensors' shapes tell them.
    source = FIXTURES / fixture
    for name in os.listdir(source):
        (tmp_path / name).write_bytes((source / name).read_bytes())
    hf = json.loads((source / "config.json").read_text())
    full = config_from_hf(hf)
    for key in absent:
        del hf[key]
    (tmp_path / "config.json").write_text(json.dumps(hf))
    model = keras_txl.load_hf_checkpoint(str(tmp_path))
    assert model.txl_config == full
    for s, (segment, out) in enumerate(_run_segments(model, str(tmp_path))):
        expected = np.load(tmp_path / f"expected_logprobs_seg{s}.npy")
        np.testing.assert_allclose(out["log_probs"], expected, atol=1e-4, rtol=1e-5)


def test_cutoffs_the_weights_do_not_show_must_be_in_config_json(tmp_path):
    # div_val 1: one table and one output layer, so the cluster bounds are
    # nowhere but in config.json (transformers' default [20000, 40000,
    # 200000] does not fit a vocabulary of 150).
    source = FIXTURES / "div1_cutoffs_dembed"
    for name in os.listdir(source):
        (tmp_path / name).write_bytes((source / name).read_bytes())
    hf = json.loads((source / "config.json").read_text())
    del hf["cutoffs"]
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match=r"config.json has no `cutoffs`, and the weights \(div_val 1: one "
                       r"table\) do not show them; transformers' default \[20000, 40000, 200000\] does not "
                       r"fit vocab_size=150 and the 2 tail clusters of crit.cluster_weight: add `cutoffs`"):
        keras_txl.load_hf_checkpoint(str(tmp_path))


def test_a_missing_div_val_above_d_embed_is_read_from_the_widths():
    # Widths [8, 0]: every div_val above 8 gives them; the search stopped at 8
    # and fell back to div_val 1, which these tensors contradict.
    from keras_txl.hf_checkpoint import _fill_shape_fields

    header = {"transformer.word_emb.emb_layers.0.weight": ((10, 8), "F32"),
              "transformer.word_emb.emb_layers.1.weight": ((30, 0), "F32")}
    hf = {"vocab_size": 40, "d_model": 16, "cutoffs": [10], "d_embed": 8}
    filled = _fill_shape_fields(hf, header, "config.json")
    assert filled["div_val"] > 8
    assert 8 // filled["div_val"] == 0


def _with_inv_freq(tmp_path, change):
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    for name in os.listdir(SHARED):
        if name != "model.safetensors":
            (tmp_path / name).write_bytes((SHARED / name).read_bytes())
    tensors = load_file(str(SHARED / "model.safetensors"))
    tensors["transformer.pos_emb.inv_freq"] = change(tensors["transformer.pos_emb.inv_freq"])
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return str(tmp_path)


def test_stored_frequencies_that_are_not_the_sinusoids_are_refused(tmp_path):
    # transformers computes with the stored `inv_freq` buffer; keras-txl with
    # 1 / 10000^(2k / d_model). Other stored frequencies were dropped in silence.
    path = _with_inv_freq(tmp_path, lambda f: f * 1.5)
    with pytest.raises(ValueError, match=r"transformer.pos_emb.inv_freq holds other frequencies than "
                       r"1 / 10000\^\(2k / d_model\) \(d_model=64\): up to 50% off"):
        keras_txl.load_hf_checkpoint(path)
    path = _with_inv_freq(tmp_path, lambda f: f[:-1])
    with pytest.raises(ValueError, match=r"inv_freq' has shape \(31,\), expected \(32,\)"):
        keras_txl.load_hf_checkpoint(path)


def test_frequencies_near_but_not_rounded_ones_are_named_as_a_difference_from_transformers(tmp_path, caplog):
    # Frequencies within 1% that are no float16/bfloat16 rounding: transformers
    # runs with them, keras-txl with the exact ones, and says so.
    import logging

    path = _with_inv_freq(tmp_path, lambda f: f * np.float32(1.001))
    with caplog.at_level(logging.WARNING, logger="keras_txl.hf_checkpoint"):
        model = keras_txl.load_hf_checkpoint(path)
    assert model.txl_config.position_frequency_dtype == "float32"
    assert re.search(r"transformer.pos_emb.inv_freq holds frequencies up to 0\.1% off "
                     r"1 / 10000\^\(2k / d_model\) that are not those rounded to float16 or bfloat16: "
                     r"transformers runs with the stored values", caplog.text)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="keras_txl.hf_checkpoint"):
        model = keras_txl.load_hf_checkpoint(str(SHARED))
    assert "inv_freq" not in caplog.text
    assert model.txl_config.position_frequency_dtype == "float32"


HALF = ["half_float16_frequencies", "half_bfloat16_frequencies"]


@pytest.mark.parametrize("name", HALF)
def test_a_half_precision_save_matches_transformers(name, caplog):
    # A float16/bfloat16 save rounds the inv_freq buffer (up to 0.05% / 0.4%)
    # and transformers, loading it back in float32, computes its sinusoids
    # with the rounded values. keras-txl computed the exact ones: log-probs
    # 4e-4 (float16) to 1.6e-3 (bfloat16) off on these 3 segments, more at
    # longer distances. The rounding is now part of the config.
    import logging

    directory = str(FIXTURES / name)
    with caplog.at_level(logging.WARNING, logger="keras_txl.hf_checkpoint"):
        model = keras_txl.load_hf_checkpoint(directory)
    assert "inv_freq" not in caplog.text
    dtype = name.split("_")[1]
    assert model.txl_config.position_frequency_dtype == dtype
    for s, (segment, out) in enumerate(_run_segments(model, directory)):
        expected = np.load(os.path.join(directory, f"expected_logprobs_seg{s}.npy"))
        np.testing.assert_allclose(out["log_probs"], expected, atol=5e-5, rtol=0,
                                   err_msg=f"log-probs of segment {s}")
        np.testing.assert_allclose(out["hidden"], np.load(os.path.join(directory, f"expected_hidden_seg{s}.npy")),
                                   atol=5e-5, rtol=0, err_msg=f"hidden of segment {s}")
    # Repeating the stored precision is fine; another one contradicts the weights.
    keras_txl.load_hf_checkpoint(directory, position_frequency_dtype=dtype)
    with pytest.raises(ValueError, match=rf"`position_frequency_dtype`='float32' contradicts .*model.safetensors, "
                       rf"which has position_frequency_dtype='{dtype}'"):
        keras_txl.load_hf_checkpoint(directory, position_frequency_dtype="float32")


def test_the_frequency_precision_survives_config_keras_and_preset_round_trips(tmp_path):
    import keras

    directory = str(FIXTURES / "half_bfloat16_frequencies")
    model = keras_txl.load_hf_checkpoint(directory)
    config = model.txl_config
    assert keras_txl.TransformerXLConfig.from_json(config.to_json()) == config
    ids = np.load(os.path.join(directory, "inputs.npy"))[:, :5]
    expected = np.load(os.path.join(directory, "expected_logprobs_seg0.npy"))
    path = str(tmp_path / "model.keras")
    model.save(path)
    again = keras.models.load_model(path)
    assert again.txl_config.position_frequency_dtype == "bfloat16"
    np.testing.assert_allclose(again.call_with_memory(ids)["log_probs"].numpy(), expected, atol=5e-5, rtol=0)
    model.save_to_preset(str(tmp_path / "preset"))
    again = keras_txl.load_pretrained(str(tmp_path / "preset"))
    assert again.txl_config.position_frequency_dtype == "bfloat16"
    np.testing.assert_allclose(again.call_with_memory(ids)["log_probs"].numpy(), expected, atol=5e-5, rtol=0)


def test_weights_of_a_half_precision_save_into_a_float32_frequency_model_are_refused():
    from keras_txl.hf_checkpoint import _LazyTensors
    from keras_txl.hf_checkpoint import load_hf_weights
    from keras_txl.weights_file import read_safetensors_header

    directory = FIXTURES / "half_float16_frequencies"
    config = keras_txl.load_hf_checkpoint(str(directory)).txl_config
    model = keras_txl.TransformerXLCausalLM(config.replace(position_frequency_dtype="float32"))
    path = str(directory / "model.safetensors")
    with pytest.raises(ValueError, match=r"inv_freq holds the frequencies of position_frequency_dtype='float16', "
                       r"with which transformers computes the sinusoids; the model has "
                       r"position_frequency_dtype='float32'"):
        load_hf_weights(model, _LazyTensors(path, read_safetensors_header(path)), path)


def test_a_position_frequency_dtype_of_another_name_is_refused():
    with pytest.raises(ValueError, match=r"`position_frequency_dtype` must be one of \['float32', 'float16', "
                       r"'bfloat16'\], received position_frequency_dtype='half'"):
        keras_txl.TransformerXLConfig(vocabulary_size=10, num_layers=1, hidden_dim=8, num_heads=2,
                                      intermediate_dim=8, position_frequency_dtype="half")


def test_the_rounded_frequencies_are_those_of_a_transformers_half_precision_save():
    # PyTorch computes the float32 frequencies with its own power; rounded from
    # a float64 computation, a value next to a float16/bfloat16 midpoint went
    # the other way for d_model 312, 508, 578, 624, 738 (the importer then
    # fell back to the exact frequencies and a warning).
    from keras_txl.position_encoding import rounded_frequencies

    with np.load(FIXTURES / "hf_rounded_inv_freq.npz") as stored:
        assert len(stored.files) == 26
        for key in stored.files:
            dtype, d_model = key.split("_")
            np.testing.assert_array_equal(rounded_frequencies(int(d_model), dtype), stored[key], err_msg=key)
