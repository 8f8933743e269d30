"""Damaged, foreign and mistyped checkpoints for the two importers.

`keras_txl/official_checkpoint.py` (TF1 name-based checkpoints written by
`tests/official_reference.py`) and `keras_txl/hf_checkpoint.py` (the HF
fixture rewritten): every case is a `ValueError` naming the file and the
tensor or field, or the checkpoint inside the given folder being loaded.
"""

import glob
import json
import logging
import os
import shutil

import numpy as np
import pytest
from testing import FIXTURES

import keras_txl
from tests import official_reference as ref

LAYOUT = "text8"  # the smallest official layout: 3 layers, 27 symbols
HF = FIXTURES / "hf_transfo_xl_tiny"


def write_release(directory, seed=0, variables=None, slots=True):
    """A tiny official release in `directory`; returns its variables."""
    layout = ref.LAYOUTS[LAYOUT]
    if variables is None:
        variables = ref.official_variables(layout, seed=seed)
    extra = ref.optimizer_slots(variables) if slots else None
    ref.write_checkpoint(str(directory), variables, layout, extra=extra)
    return variables


def load_error(path, **kw):
    """The message of the ValueError `load_official_checkpoint` raises."""
    with pytest.raises(ValueError) as info:
        keras_txl.load_official_checkpoint(path, **kw)
    return str(info.value)


def loaded_bias(path):
    """r_w_bias of the model imported from `path`."""
    return keras_txl.load_official_checkpoint(path).backbone.content_bias.numpy()


@pytest.fixture
def no_model(monkeypatch):
    """Building a `TransformerXLCausalLM` fails the test: the error must
    come before it."""
    from keras_txl import causal_lm

    def build(*args, **kwargs):
        raise AssertionError("the model was built before the check")

    monkeypatch.setattr(causal_lm, "TransformerXLCausalLM", build)


# === Official: damaged data shards ===


def _damage(data, how):
    """`data` (a shard's bytes) truncated, emptied or with a byte flipped;
    None to delete the shard."""
    if how == "truncated":
        return data[: len(data) // 2]
    if how == "empty":
        return b""
    if how == "flipped_byte":
        changed = bytearray(data)
        changed[len(changed) // 2] ^= 0xFF
        return bytes(changed)
    return None


@pytest.mark.parametrize("how", ["truncated", "empty", "missing", "flipped_byte"])
def test_damaged_data_shard_is_named_before_the_model_is_built(how, tmp_path, no_model):
    # No optimizer slots: every byte of the shard belongs to a model variable.
    write_release(tmp_path, slots=False)
    (shard,) = glob.glob(str(tmp_path / "model.ckpt-0.data-*"))
    with open(shard, "rb") as f:
        damaged = _damage(f.read(), how)
    if damaged is None:
        os.remove(shard)
    else:
        with open(shard, "wb") as f:
            f.write(damaged)
    message = load_error(tmp_path)
    assert "damaged or truncated checkpoint" in message
    assert str(tmp_path / "model.ckpt-0") in message
    assert "cannot read variable 'transformer/" in message
    expected = ("no model.ckpt-0.data-* file" if how == "missing"
                else os.path.basename(shard))
    assert expected in message


# === Official: invalid UTF-8 ===


def test_corpus_info_that_is_not_utf8_names_the_file(tmp_path):
    write_release(tmp_path)
    info = tmp_path / "corpus-info.json"
    info.write_bytes(b'{"vocab_size": 27, "cutoffs": [], "dataset": "\xff"}')
    message = load_error(tmp_path)
    assert str(info) in message and "utf-8" in message


def test_vocabulary_file_that_is_not_utf8_names_the_file_and_line(tmp_path):
    write_release(tmp_path)
    vocab = tmp_path / "text8-vocab.txt"
    vocab.write_bytes(b"_\na\n\xffb\n" + b"".join(
        bytes([c]) + b"\n" for c in range(ord("c"), ord("z") + 1)
    ))
    message = load_error(tmp_path, vocabulary_file=str(vocab))
    assert str(vocab) in message
    assert "not valid UTF-8" in message and "line 3" in message


# === Official: the checkpoint is resolved inside the folder ===


@pytest.mark.parametrize("line", ["b 4213", "b\t4213", "b ", " b", "b\u00a0c"])
def test_vocabulary_line_is_read_by_its_first_field_as_the_official_vocab(line, tmp_path):
    # The official `Vocab._build_from_file` keeps `line.strip().split()[0]`:
    # LM1B's `1b_word_vocab.txt` may carry a count after each word, and the
    # whole line as the symbol would map that word to <unk> in silence.
    write_release(tmp_path)
    symbols = ["_"] + [chr(ord("a") + i) for i in range(26)]
    symbols[2] = line
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(symbols) + "\n", encoding="utf-8")
    model = keras_txl.load_official_checkpoint(tmp_path, vocabulary_file=str(vocab))
    assert model.vocabulary[2] == "b" and model.vocabulary[:2] == ("_", "a")
    symbols[2] = "  \t "
    vocab.write_text("\n".join(symbols) + "\n", encoding="utf-8")
    assert "line 3 is empty" in load_error(tmp_path, vocabulary_file=str(vocab))
    symbols[2] = "a 17"  # the first field repeats line 2
    vocab.write_text("\n".join(symbols) + "\n", encoding="utf-8")
    assert "symbol 'a' on line 3 repeats line 2" in load_error(tmp_path, vocabulary_file=str(vocab))


@pytest.mark.parametrize("folder, prefix", [
    ("run [v2]", "model.ckpt-0"), ("back\\slash", "model.ckpt-0"),
    ("plain", "model[1].ckpt-0"),
])
def test_a_path_tensorflow_reads_as_a_glob_pattern_is_named(folder, prefix, tmp_path):
    # TensorFlow's reader globs `<prefix>.index`: brackets or a backslash made
    # an intact checkpoint read as "damaged or truncated".
    directory = tmp_path / folder
    write_release(directory)
    if prefix != "model.ckpt-0":
        for path in glob.glob(str(directory / "model.ckpt-0.*")):
            os.rename(path, path.replace("model.ckpt-0", prefix))
    path = str(directory / prefix)
    message = load_error(path)
    assert f"TensorFlow's checkpoint reader cannot open {path!r}" in message
    assert "damaged" not in message


def test_spaces_unicode_and_self_matching_glob_characters_load(tmp_path):
    for name in ("with space \u00e9", "star*", "q?", "br[x"):
        write_release(tmp_path / name, slots=False)
        assert loaded_bias(tmp_path / name).shape == (4, 6)


def test_a_variable_stored_under_two_keys_is_refused(tmp_path, no_model):
    # The TF1 name and the tf.train.Checkpoint key of one variable: which
    # one holds is not for the loader to guess.
    variables = ref.official_variables(ref.LAYOUTS[LAYOUT])
    key = "transformer/r_w_bias/.ATTRIBUTES/VARIABLE_VALUE"
    write_release(tmp_path, variables={**variables, key: variables["transformer/r_w_bias"]},
                  slots=False)
    message = load_error(tmp_path)
    assert "variable 'transformer/r_w_bias' is stored twice, as" in message
    assert repr(key) in message



@pytest.mark.parametrize("scope", ["tower_0/", "model/"])
def test_official_variables_under_an_outer_scope_load_as_the_official_ones(scope, tmp_path):
    # The official model built inside another scope (a tower, a wrapper):
    # `tower_0/transformer/...`, slots and counters under it too. Read as the
    # official names, the same numbers as the reference.
    layout = ref.LAYOUTS[LAYOUT]
    variables = ref.official_variables(layout)
    everything = {**variables, **ref.optimizer_slots(variables)}
    ref.write_checkpoint(str(tmp_path), {scope + k: v for k, v in everything.items()},
                         layout)
    model = keras_txl.load_official_checkpoint(
        tmp_path, segment_length=layout.tgt_len, memory_length=layout.mem_len,
        clamp_length=layout.clamp_len, same_length=layout.same_length)
    ids = np.random.default_rng(0).integers(0, layout.n_token, (2, layout.tgt_len))
    expected, _ = ref.forward(layout, variables, ids)
    got = model.call_with_memory(ids.astype("int32"))["log_probs"].numpy()
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_official_variables_under_several_outer_scopes_are_refused(tmp_path, no_model):
    variables = ref.official_variables(ref.LAYOUTS[LAYOUT])
    write_release(tmp_path, slots=False, variables={
        **{"tower_0/" + k: v for k, v in variables.items()},
        **{"tower_1/" + k: v for k, v in variables.items()}})
    message = load_error(tmp_path)
    assert "the model variables are under 2 scopes ['tower_0/', 'tower_1/']" in message

def test_copied_release_folder_loads_its_own_weights(tmp_path):
    original = write_release(tmp_path / "a", seed=0)
    # TF1's Saver writes absolute paths into the `checkpoint` state file.
    state = (tmp_path / "a" / "checkpoint").read_text()
    assert str(tmp_path / "a" / "model.ckpt-0") in state
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    write_release(tmp_path / "a", seed=7)  # `a` moves on; the copy keeps its own
    assert (tmp_path / "b" / "checkpoint").read_text() == state
    np.testing.assert_array_equal(
        loaded_bias(tmp_path / "b"), original["transformer/r_w_bias"]
    )


@pytest.mark.parametrize("form", ["absolute", "relative"])
def test_state_file_pointing_outside_the_folder_is_not_followed(form, tmp_path):
    inside = write_release(tmp_path / "release", seed=0)
    write_release(tmp_path / "elsewhere", seed=7)
    target = (str(tmp_path / "elsewhere" / "model.ckpt-0") if form == "absolute"
              else "../elsewhere/model.ckpt-0")
    (tmp_path / "release" / "checkpoint").write_text(
        f'model_checkpoint_path: "{target}"\n'
    )
    # The same name in the folder: that one.
    np.testing.assert_array_equal(
        loaded_bias(tmp_path / "release"), inside["transformer/r_w_bias"]
    )


def test_state_file_naming_a_prefix_not_in_the_folder(tmp_path, caplog):
    write_release(tmp_path / "elsewhere", seed=7)
    release = tmp_path / "release"
    inside = write_release(release, seed=0)
    for name in os.listdir(release):  # model.ckpt-0.* -> model.ckpt-5.*
        if name.startswith("model.ckpt-0."):
            os.rename(release / name, release / name.replace("-0.", "-5."))
    elsewhere = str(tmp_path / "elsewhere" / "model.ckpt-0")
    (release / "checkpoint").write_text(f'model_checkpoint_path: "{elsewhere}"\n')
    # One checkpoint in the folder: that one, with a warning naming both.
    with caplog.at_level(logging.WARNING, "keras_txl.official_checkpoint"):
        np.testing.assert_array_equal(
            loaded_bias(release), inside["transformer/r_w_bias"]
        )
    assert elsewhere in caplog.text and str(release / "model.ckpt-5") in caplog.text
    # Several: refused, naming the state file and where it points.
    for name in os.listdir(release):
        if name.startswith("model.ckpt-5."):
            shutil.copy(release / name, release / name.replace("-5.", "-6."))
    message = load_error(release)
    assert str(release / "checkpoint") in message and elsewhere in message
    assert "['model.ckpt-5', 'model.ckpt-6']" in message


# === Official: weights of the wrong dtype or not finite ===


def _bad_value(value, how):
    """`value` turned int32, bool, or holding a NaN or an Inf."""
    if how == "int32":
        return np.round(value * 10).astype(np.int32)
    if how == "bool":
        return value > 0
    bad = value.copy()
    bad.flat[0] = np.nan if how == "nan" else np.inf
    return bad


def _bad_value_named(how):
    """What the error says about a `_bad_value(..., how)` tensor."""
    return f"has dtype {how}" if how in ("int32", "bool") else "holds NaN or Inf"


@pytest.mark.parametrize("how", ["int32", "bool", "nan", "inf"])
def test_official_weights_of_a_wrong_dtype_or_not_finite_are_refused(
    how, tmp_path, no_model
):
    name = "transformer/layer_1/ff/layer_1/bias"
    variables = ref.official_variables(ref.LAYOUTS[LAYOUT])
    variables[name] = _bad_value(variables[name], how)
    write_release(tmp_path, variables=variables)
    message = load_error(tmp_path)
    assert str(tmp_path / "model.ckpt-0") in message and repr(name) in message
    assert _bad_value_named(how) in message


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_official_weights_of_other_float_dtypes_still_load(dtype, tmp_path):
    variables = {
        name: value.astype(dtype)
        for name, value in ref.official_variables(ref.LAYOUTS[LAYOUT]).items()
    }
    write_release(tmp_path, variables=variables)
    np.testing.assert_array_equal(
        loaded_bias(tmp_path),
        variables["transformer/r_w_bias"].astype(np.float32),
    )


# === Hugging Face: config.json fields are type-checked ===


def _hf_folder(directory, weights=True, **changes):
    """A copy of the HF fixture with `changes` made to its config.json."""
    directory.mkdir()
    config = json.loads((HF / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))
    if weights:
        shutil.copy(HF / "model.safetensors", directory)
    return directory / "config.json"


@pytest.mark.parametrize("field, value", [
    ("pre_lnorm", "false"),
    ("same_length", "no"),
    ("untie_r", 1),
    ("tie_word_embeddings", None),
    ("tie_projs", "abc"),
    ("tie_projs", [0, 1, 1]),
    ("d_model", 64.9),
    ("d_model", 64.0),
    ("n_layer", "3"),
    ("n_layer", True),
    ("n_head", 0),
    ("div_val", [2]),
    ("mem_len", -1),
    ("clamp_len", 1.5),
    ("cutoffs", [100.0, 200]),
    ("cutoffs", "100,200"),
    ("dropout", "abc"),
    ("dropout", False),
    ("layer_norm_epsilon", "1e-5"),
    ("attn_type", False),
])
def test_hf_config_fields_of_the_wrong_type_are_refused(field, value, tmp_path):
    config_path = _hf_folder(tmp_path / "hf", weights=False, **{field: value})
    with pytest.raises(ValueError) as info:
        keras_txl.load_hf_checkpoint(str(tmp_path / "hf"))
    message = str(info.value)
    assert str(config_path) in message
    assert field in message and repr(value) in message


@pytest.mark.parametrize("field, value, says", [
    ("sample_softmax", 8, "sample_softmax=8 is a sampled-softmax model"),
    ("ext_len", 2, "ext_len=2 keeps the last 2 positions"),
    ("sample_softmax", "8", "`sample_softmax` has the wrong type"),
    ("ext_len", -1, "`ext_len` has the wrong type or value"),
])
def test_hf_options_that_change_the_outputs_are_refused_by_name(field, value, says, tmp_path):
    # A sampled softmax (transformers' LM head asserts it off) or an extended
    # context (older transformers' ext_len, which shortens what enters the
    # memory) would load as the plain model and compute something else.
    config_path = _hf_folder(tmp_path / "hf", **{field: value})
    with pytest.raises(ValueError) as info:
        keras_txl.load_hf_checkpoint(str(tmp_path / "hf"))
    assert str(config_path) in str(info.value) and says in str(info.value)
    # Their off values load as before.
    off = {"sample_softmax": -1, "ext_len": 0}[field]
    _hf_folder(tmp_path / "off", **{field: off})
    model = keras_txl.load_hf_checkpoint(str(tmp_path / "off"))
    reference = keras_txl.load_hf_checkpoint(str(HF))
    for a, b in zip(model.weights, reference.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("key, value, field", [("clamp_len", -5, "clamp_length"),
                                              ("dropatt", 1.5, "attention_dropout")])
def test_hf_value_out_of_range_names_the_config_json_key(key, value, field, tmp_path):
    # The config's range check names keras-txl's field, which config.json
    # does not have.
    config_path = _hf_folder(tmp_path / "hf", **{key: value})
    with pytest.raises(ValueError) as info:
        keras_txl.load_hf_checkpoint(str(tmp_path / "hf"))
    assert f"`{field}` is {config_path}'s `{key}`" in str(info.value)


@pytest.mark.parametrize("field, value", [
    ("pre_layer_norm", True), ("layer_norm_epsilon", 1e-12),
    ("same_length_convention", "official_tf"), ("attention_type", "vanilla"),
    ("tie_projections", (False, False, False)), ("num_layers", 1),
])
def test_hf_keyword_contradicting_the_checkpoint_is_refused(field, value):
    # pre_layer_norm, the epsilon, the same_length mask or the attention leave
    # no trace in the weights: changed, the model loaded and computed
    # another function than the checkpoint's.
    with pytest.raises(ValueError) as info:
        keras_txl.load_hf_checkpoint(str(HF), **{field: value})
    message = str(info.value)
    assert f"`{field}`={value!r} contradicts {HF / 'config.json'}" in message


def test_hf_keywords_may_repeat_the_checkpoint_and_change_evaluation_settings():
    reference = keras_txl.load_hf_checkpoint(str(HF))
    cfg = reference.txl_config
    model = keras_txl.load_hf_checkpoint(
        str(HF), pre_layer_norm=cfg.pre_layer_norm, cutoffs=list(cfg.cutoffs),
        tie_projections=list(cfg.tie_projections), memory_length=3,
        clamp_length=2, same_length=True, dropout=0.0)
    assert (model.txl_config.memory_length, model.txl_config.clamp_length) == (3, 2)
    for a, b in zip(model.weights, reference.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_hf_config_values_out_of_range_name_the_file(tmp_path):
    config_path = _hf_folder(tmp_path / "hf", weights=False, dropout=1.5)
    with pytest.raises(ValueError) as info:
        keras_txl.load_hf_checkpoint(str(tmp_path / "hf"))
    assert str(config_path) in str(info.value) and "dropout" in str(info.value)


def test_a_tied_softmax_projection_must_be_the_embedding_projection(tmp_path):
    # tie_projs [false, true, true]: crit.out_projs.1 is stored, and must
    # equal transformer.word_emb.emb_projs.1 (as a tied table must equal its
    # embedding table): one that differs is refused, not dropped.
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    _hf_folder(tmp_path / "hf", weights=False)
    tensors = load_file(str(HF / "model.safetensors"))
    np.testing.assert_array_equal(tensors["crit.out_projs.1"],
                                  tensors["transformer.word_emb.emb_projs.1"])
    tensors["crit.out_projs.1"] = tensors["crit.out_projs.1"] + 0.01
    save_file(tensors, str(tmp_path / "hf" / "model.safetensors"))
    with pytest.raises(ValueError, match=r"crit.out_projs.1 differs from the embedding "
                                         r"projection transformer.word_emb.emb_projs.1 it "
                                         r"is tied to \(config.json: tie_projs\[1\]"):
        keras_txl.load_hf_checkpoint(str(tmp_path / "hf"))


def test_a_pickled_pytorch_checkpoint_is_named_and_never_read(tmp_path):
    _hf_folder(tmp_path / "hf", weights=False)
    (tmp_path / "hf" / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(ValueError, match=r"No model.safetensors in .*, only "
                                         r"pytorch_model.bin, which keras-txl does not "
                                         r"read .*safe_serialization=True"):
        keras_txl.load_hf_checkpoint(str(tmp_path / "hf"))
    (tmp_path / "hf" / "pytorch_model.bin").rename(
        tmp_path / "hf" / "pytorch_model-00001-of-00002.bin")
    with pytest.raises(ValueError, match=r"only pytorch_model-00001-of-00002.bin, which"):
        keras_txl.load_hf_checkpoint(str(tmp_path / "hf"))


def test_a_transformers_tf_checkpoint_gets_its_own_conversion(tmp_path):
    # A folder with only tf_model.h5 (transformers' TF TransfoXL; the hub's
    # transfo-xl-wt103 has one) was told "(a pytorch_model.bin is a pickle ...)"
    # and to convert with `from_pretrained(folder)`, which fails on such a
    # folder: transformers needs from_tf=True to read an .h5.
    _hf_folder(tmp_path / "hf", weights=False)
    (tmp_path / "hf" / "tf_model.h5").write_bytes(b"\x89HDF\r\n\x1a\nnot read")
    with pytest.raises(ValueError) as info:
        keras_txl.load_hf_checkpoint(str(tmp_path / "hf"))
    message = str(info.value)
    assert "only tf_model.h5" in message and "pytorch_model.bin is a pickle" not in message
    assert "from_pretrained(folder, from_tf=True).save_pretrained(out, safe_serialization=True)" in message



ONE, TWO = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


def _shard(directory, layout, weight_map=None):
    """Writes the HF fixture's tensors into `directory` as transformers'
    sharded save: `layout` maps each shard file name to the tensor names it
    holds; the index maps them so too unless `weight_map` is given."""
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    tensors = load_file(str(HF / "model.safetensors"))
    for file_name, names in layout.items():
        save_file({n: tensors[n] for n in names}, str(directory / file_name))
    if weight_map is None:
        weight_map = {n: f for f, names in layout.items() for n in names}
    (directory / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 0}, "weight_map": weight_map}))


def _hf_names():
    from safetensors.numpy import load_file

    return sorted(load_file(str(HF / "model.safetensors")))


def test_a_sharded_safetensors_checkpoint_loads_as_the_single_file(tmp_path):
    # transformers' save_pretrained shards a model bigger than max_shard_size:
    # model.safetensors.index.json names each tensor's file.
    _hf_folder(tmp_path / "hf", weights=False)
    names = _hf_names()
    _shard(tmp_path / "hf", {ONE: names[::2], TWO: names[1::2]})
    model = keras_txl.load_hf_checkpoint(str(tmp_path / "hf"))
    reference = keras_txl.load_hf_checkpoint(str(HF))
    assert len(model.weights) == len(reference.weights)
    for a, b in zip(model.weights, reference.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    # load_pretrained reads the folder the same way.
    same = keras_txl.load_pretrained(str(tmp_path / "hf"))
    for a, b in zip(same.weights, reference.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("how, says", [
    ("shard missing", r"puts 1 tensors in 'model-00002-of-00002.safetensors', which is "
                      r"not in .*: a shard was not downloaded or copied"),
    ("tensor unlisted", r"model-00001-of-00002.safetensors holds tensor 'crit.cluster_bias', "
                        r"which .*model.safetensors.index.json does not list"),
    ("tensor in two shards", r"model-00001-of-00002.safetensors holds tensor "
                             r"'crit.cluster_bias', which .* puts in "
                             r"'model-00002-of-00002.safetensors'"),
    ("tensor not in its shard", r"index.json puts tensor 'crit.extra' in "
                                r"'model-00002-of-00002.safetensors', which does not hold it"),
    ("outside", r"shard file named in .*index.json '../x.safetensors' leaves the folder"),
    ("no weight_map", r"index.json must hold a JSON object whose `weight_map` maps each"),
])
def test_a_sharded_checkpoint_whose_shards_do_not_fit_its_index_is_refused(how, says, tmp_path):
    directory = tmp_path / "hf"
    _hf_folder(directory, weights=False)
    names = _hf_names()
    rest = [n for n in names if n != "crit.cluster_bias"]
    layout = {ONE: rest, TWO: ["crit.cluster_bias"]}
    weight_map = {n: ONE for n in rest}
    weight_map["crit.cluster_bias"] = TWO
    if how == "tensor unlisted":
        layout = {ONE: names}
        del weight_map["crit.cluster_bias"]
    elif how == "tensor in two shards":
        layout = {ONE: names, TWO: ["crit.cluster_bias"]}
    elif how == "tensor not in its shard":
        weight_map["crit.extra"] = TWO
    elif how == "outside":
        weight_map["crit.cluster_bias"] = "../x.safetensors"
    _shard(directory, layout, weight_map)
    if how == "shard missing":
        (directory / TWO).unlink()
    elif how == "no weight_map":
        (directory / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(ValueError, match=says):
        keras_txl.load_hf_checkpoint(str(directory))

def test_hf_config_null_lengths_keep_their_defaults():
    hf = json.loads((HF / "config.json").read_text())
    config = keras_txl.hf_checkpoint.config_from_hf(
        {**hf, "tgt_len": None, "mem_len": None}
    )
    # transformers' TransfoXLConfig defaults: tgt_len 128, mem_len 1600.
    assert (config.segment_length, config.memory_length) == (128, 1600)
    config = keras_txl.hf_checkpoint.config_from_hf({**hf, "tgt_len": 7})
    assert config.segment_length == 7


def test_hf_fields_left_out_mean_what_they_mean_in_transformers():
    # A hand-written config.json: the fields that change the numbers but no
    # tensor's shape take TransfoXLConfig's defaults (transformers 4.37:
    # mem_len 1600, clamp_len 1000, same_length True, projections shared
    # but the first), proj_share_all_but_first is read, and transformers'
    # alias names are its fields.
    hf = json.loads((HF / "config.json").read_text())
    assert len(hf["cutoffs"]) == 2
    bare = {k: v for k, v in hf.items()
            if k not in ("mem_len", "clamp_len", "same_length", "tie_projs")}
    config = keras_txl.hf_checkpoint.config_from_hf(bare)
    assert (config.memory_length, config.clamp_length, config.same_length) == (1600, 1000, True)
    assert config.tie_projections == (False, True, True)
    unshared = keras_txl.hf_checkpoint.config_from_hf(
        {**bare, "proj_share_all_but_first": False})
    assert unshared.tie_projections == (False, False, False)
    written = keras_txl.hf_checkpoint.config_from_hf(  # tie_projs wins, as in transformers
        {**bare, "proj_share_all_but_first": False, "tie_projs": [False, True, False]})
    assert written.tie_projections == (False, True, False)
    with pytest.raises(ValueError, match="`proj_share_all_but_first` has the wrong type"):
        keras_txl.hf_checkpoint.config_from_hf({**bare, "proj_share_all_but_first": "no"})
    aliases = {"n_token": "vocab_size", "hidden_size": "d_model",
               "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"}
    renamed = {({v: k for k, v in aliases.items()}.get(k, k)): v for k, v in hf.items()}
    assert keras_txl.hf_checkpoint.config_from_hf(renamed) == \
        keras_txl.hf_checkpoint.config_from_hf(hf)
    with pytest.raises(ValueError, match=r"`n_token` \(transformers' other name for "
                                         r"`vocab_size`\) is 7 but `vocab_size` is"):
        keras_txl.hf_checkpoint.config_from_hf({**hf, "n_token": 7})



def test_hf_older_tie_weight_field_unties_the_output_tables(tmp_path):
    # transformers 2.x/3.x (and the hub's own TransfoXL config.json) wrote
    # `tie_weight`, not `tie_word_embeddings`: an untied model saved then has
    # its own crit.out_layers, which must be used, not refused as a bad tie.
    untied = FIXTURES / "untied_embeddings"
    config = json.loads((untied / "config.json").read_text())
    assert config.pop("tie_word_embeddings") is False
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text(json.dumps({**config, "tie_weight": False}))
    shutil.copy(untied / "model.safetensors", old)
    model = keras_txl.load_hf_checkpoint(str(old))
    assert model.txl_config.tie_embeddings is False
    reference = keras_txl.load_hf_checkpoint(str(untied))
    for a, b in zip(model.weights, reference.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    # tie_word_embeddings, where present, wins (transformers 4 reads only it).
    (old / "config.json").write_text(json.dumps(
        {**config, "tie_weight": False, "tie_word_embeddings": True}))
    with pytest.raises(ValueError, match=r"crit.out_layers.0.weight differs from the "
                                         r"embedding table but config.json ties them"):
        keras_txl.load_hf_checkpoint(str(old))
    (old / "config.json").write_text(json.dumps({**config, "tie_weight": "no"}))
    with pytest.raises(ValueError, match=r"`tie_weight` has the wrong type"):
        keras_txl.load_hf_checkpoint(str(old))


def test_hf_tie_projs_with_more_flags_than_clusters_is_refused(tmp_path):
    # One flag per cluster: a longer list flags clusters `cutoffs` does not
    # have (transformers' tie_weights fails on a true one).
    config_path = _hf_folder(tmp_path / "hf", tie_projs=[False, True, True, True])
    with pytest.raises(ValueError) as info:
        keras_txl.load_hf_checkpoint(str(tmp_path / "hf"))
    assert (f"{config_path}: `tie_projs` has 4 flags [False, True, True, True], but "
            "`cutoffs`=[100, 200] make 3 clusters") in str(info.value)
    # A shorter list reads as transformers reads it: the missing flags untied.
    hf = json.loads(config_path.read_text())
    assert keras_txl.hf_checkpoint.config_from_hf(
        {**hf, "tie_projs": [False, True]}).tie_projections == (False, True, False)


# === Hugging Face: tensors of the wrong dtype or not finite ===


def _rewrite_tensors(directory, change):
    """Rewrites `directory/model.safetensors` with `change(tensors)`."""
    from safetensors.numpy import load_file
    from safetensors.numpy import save_file

    path = str(directory / "model.safetensors")
    tensors = load_file(path)
    save_file(change(tensors), path)
    return path


@pytest.mark.parametrize("how", ["int32", "bool", "nan", "inf"])
def test_hf_tensors_of_a_wrong_dtype_or_not_finite_are_refused(how, tmp_path):
    name = "transformer.layers.1.pos_ff.CoreNet.0.bias"
    _hf_folder(tmp_path / "hf")

    def change(tensors):
        tensors[name] = _bad_value(tensors[name], how)
        return tensors

    path = _rewrite_tensors(tmp_path / "hf", change)
    with pytest.raises(ValueError) as info:
        keras_txl.load_hf_checkpoint(str(tmp_path / "hf"))
    message = str(info.value)
    assert path in message and repr(name) in message
    assert _bad_value_named(how) in message


def test_hf_float64_tensors_load_as_the_float32_ones(tmp_path):
    _hf_folder(tmp_path / "hf")
    _rewrite_tensors(tmp_path / "hf", lambda tensors: {
        name: value.astype(np.float64) for name, value in tensors.items()
    })
    wide = keras_txl.load_hf_checkpoint(str(tmp_path / "hf"))
    reference = keras_txl.load_hf_checkpoint(str(HF))
    for a, b in zip(wide.weights, reference.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
