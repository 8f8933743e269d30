"""Importing the official TF releases (keras_txl/official_checkpoint.py).

Tiny TF1 name-based checkpoints are written under the official variable
names (a `tf.compat.v1` graph and `Saver`, with Adam slots, beta powers and
`global_step` as a training run leaves them) for the four released layouts
and shape variants. keras-txl's log-probs and memories over four segments,
memory carried, are compared with `tests/official_reference.py`, an
independent float64 NumPy transcription of the official `tf/model.py`.
"""

import json
import os
import re
import shutil

import numpy as np
import pytest

import keras_txl
from keras_txl import presets
from keras_txl.official_checkpoint import read_corpus_info
from tests import official_reference as ref

SEGMENTS, B = 4, 2
ATOL = 1e-4


def write_release(directory, name="wt103", variables=None, extra=None, **kw):
    layout = ref.LAYOUTS[name]
    if variables is None:
        variables = ref.official_variables(layout)
    slots = ref.optimizer_slots(variables)
    slots.update(extra or {})
    ref.write_checkpoint(str(directory), variables, layout, extra=slots, **kw)
    return layout, variables


def settings(layout):
    return dict(
        segment_length=layout.tgt_len, memory_length=layout.mem_len,
        clamp_length=layout.clamp_len, same_length=layout.same_length,
    )


def chain(model, layout, variables, seed=0):
    """Keras and reference outputs over SEGMENTS segments."""
    rng = np.random.default_rng(seed)
    memory, reference_mems, rows = None, None, []
    for _ in range(SEGMENTS):
        ids = rng.integers(0, layout.n_token, (B, layout.tgt_len))
        out = model.call_with_memory(ids.astype("int32"), memory)
        log_probs, reference_mems = ref.forward(
            layout, variables, ids, reference_mems
        )
        memory = out["memory"]
        rows.append(dict(
            ids=ids, log_probs=out["log_probs"].numpy(), memory=memory.numpy(),
            ref_log_probs=log_probs,
            # [M, B, D] per layer -> (B, L, M, D)
            ref_memory=np.stack([m.transpose(1, 0, 2) for m in reference_mems], 1),
        ))
    return rows


@pytest.mark.parametrize("name", list(ref.LAYOUTS))
def test_matches_numpy_reference_over_segments(name, tmp_path):
    layout, variables = write_release(tmp_path, name)
    model = keras_txl.load_official_checkpoint(tmp_path, **settings(layout))
    cfg = model.txl_config

    # Everything the checkpoint and corpus-info.json determine.
    assert cfg.vocabulary_size == layout.n_token
    assert cfg.cutoffs == tuple(layout.cutoffs)
    assert cfg.num_layers == layout.n_layer
    assert cfg.hidden_dim == layout.d_model
    assert cfg.embedding_dim == layout.d_embed
    assert (cfg.num_heads, cfg.head_dim) == (layout.n_head, layout.d_head)
    assert cfg.intermediate_dim == layout.d_inner
    assert cfg.untie_relative_bias == layout.untie_r
    assert cfg.tie_embeddings is True
    if layout.cutoffs:
        assert cfg.div_val == layout.div_val
        assert cfg.tie_projections == tuple(layout.tie_projs)
    if layout.div_val > 1:
        assert cfg.project_same_dim == layout.proj_same_dim
    # What the official code fixes, and evaluation defaults.
    assert cfg.layer_norm_epsilon == 1e-12
    assert cfg.same_length_convention == "official_tf"
    assert cfg.dropout == cfg.attention_dropout == 0.0

    rows = chain(model, layout, variables)
    worst_lp = max(np.abs(r["log_probs"] - r["ref_log_probs"]).max() for r in rows)
    worst_mem = max(np.abs(r["memory"] - r["ref_memory"]).max() for r in rows)
    assert worst_lp < ATOL, f"log-probs differ by {worst_lp:.2e}"
    assert worst_mem < ATOL, f"memories differ by {worst_mem:.2e}"
    # Distributions, and not degenerate ones; an empty last cluster keeps
    # its share of the head's softmax, as in the official code.
    totals = np.exp(rows[-1]["log_probs"]).sum(-1)
    if layout.cutoffs and layout.cutoffs[-1] == layout.n_token:
        assert (totals < 1 - 1e-4).all() and (totals > 0.5).all(), totals
    else:
        np.testing.assert_allclose(totals, 1.0, atol=1e-5)
    assert rows[-1]["log_probs"].std() > 0.5
    # The memory is really used: the last segment without it differs.
    alone = model.call_with_memory(rows[-1]["ids"].astype("int32"))
    assert np.abs(alone["log_probs"].numpy() - rows[-1]["log_probs"]).max() > 1e-2


def test_div_val_above_d_embed_loads(tmp_path):
    # d_embed 8, div_val 16, one cutoff: widths [8, 0], which every div_val
    # above 8 gives (the shapes cannot tell which); the inference tried
    # div_val 2..8 only and refused the checkpoint ("do not follow
    # E_i = E // div_val**i for any div_val > 1").
    layout = ref.Layout(
        n_token=40, n_layer=1, d_model=16, d_embed=8, n_head=2, d_head=8,
        d_inner=24, cutoffs=[10], div_val=16, untie_r=True, dataset="wt103",
    )
    variables = ref.official_variables(layout)
    ref.write_checkpoint(str(tmp_path), variables, layout)
    model = keras_txl.load_official_checkpoint(tmp_path, **settings(layout))
    cfg = model.txl_config
    assert [cfg.cluster_embedding_dim(i) for i in range(2)] == [8, 0]
    rows = chain(model, layout, variables)
    assert max(np.abs(r["log_probs"] - r["ref_log_probs"]).max() for r in rows) < ATOL


@pytest.mark.parametrize("same_length", [True, False])
def test_memory_length_zero_matches_the_official_cache_mem(same_length, tmp_path):
    # `_cache_mem` with mem_len 0 returns the empty memory it was given: no
    # recurrence, every segment alone.
    import dataclasses

    layout = dataclasses.replace(ref.LAYOUTS["wt103"], mem_len=0,
                                 same_length=same_length)
    variables = ref.official_variables(layout)
    ref.write_checkpoint(str(tmp_path), variables, layout)
    model = keras_txl.load_official_checkpoint(tmp_path, **settings(layout))
    rows = chain(model, layout, variables)
    for row in rows:
        assert row["memory"].shape == (B, layout.n_layer, 0, layout.d_model)
        assert row["ref_memory"].shape == row["memory"].shape
        assert np.abs(row["log_probs"] - row["ref_log_probs"]).max() < ATOL
    alone = model.call_with_memory(rows[-1]["ids"].astype("int32"))
    np.testing.assert_allclose(alone["log_probs"].numpy(), rows[-1]["log_probs"],
                               atol=1e-6)


@pytest.mark.parametrize("keys", ["nested", "flat"])
def test_tf2_object_based_checkpoint_of_the_official_variables(keys, tmp_path):
    # The official variables saved with tf.train.Checkpoint (TF2): keys are
    # object paths ("transformer/r_w_bias/.ATTRIBUTES/VARIABLE_VALUE", or with
    # "/" escaped as ".S" when a name holds it), with save_counter beside them.
    import tensorflow as tf

    layout = ref.LAYOUTS["wt103_heads3x8_mem9_clamp2"]
    variables = ref.official_variables(layout)
    created = {name: tf.Variable(value) for name, value in variables.items()}
    if keys == "flat":
        root = tf.train.Checkpoint(**created)
    else:
        modules = {}

        def module(path):
            if path not in modules:
                modules[path] = tf.Module()
                parent, _, leaf = path.rpartition("/")
                setattr(module(parent) if parent else top, leaf, modules[path])
            return modules[path]

        top = tf.Module()
        for name, variable in created.items():
            parent, _, leaf = name.rpartition("/")
            setattr(module(parent), leaf, variable)
        root = tf.train.Checkpoint(transformer=top.transformer)
    root.save(str(tmp_path / "model.ckpt"))
    (tmp_path / "corpus-info.json").write_text(json.dumps(
        {"vocab_size": layout.n_token, "cutoffs": layout.cutoffs, "dataset": "wt103"}))
    names = [n for n, _ in tf.train.list_variables(str(tmp_path / "model.ckpt-1"))]
    assert any(n.endswith("/.ATTRIBUTES/VARIABLE_VALUE") for n in names)
    model = keras_txl.load_official_checkpoint(tmp_path, **settings(layout))
    rows = chain(model, layout, variables)
    assert max(np.abs(r["log_probs"] - r["ref_log_probs"]).max() for r in rows) < ATOL


@pytest.mark.parametrize(
    "form", ["folder", "prefix", "no_state_file", "stale_state_file", "inner_cutoffs"]
)
def test_checkpoint_path_forms(form, tmp_path):
    kw = {"cutoffs_form": "inner"} if form == "inner_cutoffs" else {}
    layout, variables = write_release(tmp_path, "wt103", **kw)
    info = json.loads((tmp_path / "corpus-info.json").read_text())
    if form == "inner_cutoffs":
        assert info["cutoffs"] == [20, 45, 90]
    else:  # data_utils.py writes [0, ..., vocab_size]
        assert info["cutoffs"] == [0, 20, 45, 90, 150]
    path = tmp_path
    if form == "prefix":
        path = tmp_path / "model.ckpt-0"
    if form == "no_state_file":
        os.remove(tmp_path / "checkpoint")
    if form == "stale_state_file":  # a path from the training machine
        (tmp_path / "checkpoint").write_text(
            'model_checkpoint_path: "/gone/model.ckpt-0"\n'
        )
    model = keras_txl.load_official_checkpoint(path, **settings(layout))
    assert model.txl_config.cutoffs == (20, 45, 90)
    rows = chain(model, layout, variables)
    assert max(np.abs(r["log_probs"] - r["ref_log_probs"]).max() for r in rows) < ATOL


@pytest.mark.parametrize("suffix", [".index", ".meta", ".data-00000-of-00001"])
def test_any_file_of_a_checkpoint_names_that_checkpoint(suffix, tmp_path):
    # A folder of several checkpoints, the state file naming the latest: the
    # .index of an older one loaded it, its .meta (what tf.compat.v1's
    # import_meta_graph takes) or .data-* file was refused as "neither a
    # folder nor a checkpoint prefix (no '...model.ckpt-100.meta.index', and
    # not a Saver V1 checkpoint file)".
    layout = ref.LAYOUTS["enwik8"]
    older = ref.official_variables(layout, seed=0)
    ref.write_checkpoint(str(tmp_path), older, layout, global_step=100)
    ref.write_checkpoint(str(tmp_path), ref.official_variables(layout, seed=1), layout,
                         global_step=200)
    assert "model.ckpt-200" in (tmp_path / "checkpoint").read_text()
    model = keras_txl.load_official_checkpoint(tmp_path / f"model.ckpt-100{suffix}",
                                               **settings(layout))
    rows = chain(model, layout, older)
    assert max(np.abs(r["log_probs"] - r["ref_log_probs"]).max() for r in rows) < ATOL


@pytest.mark.parametrize("given", ["model.ckpt-999", "model.ckpt", "checkpoint"])
def test_a_prefix_not_in_its_folder_lists_the_checkpoints_there(given, tmp_path):
    # A mistyped step (or the step left out, or the state file given) was
    # refused as "neither a folder nor a checkpoint prefix (no
    # '.../model.ckpt-999.index', ...)", without the prefixes that are there.
    layout = ref.LAYOUTS["text8"]
    for step in (100, 200):
        ref.write_checkpoint(str(tmp_path), ref.official_variables(layout), layout,
                             global_step=step)
    message = _load_error(tmp_path / given)
    assert "neither a folder nor a checkpoint prefix" in message
    assert f"{tmp_path} holds the checkpoints ['model.ckpt-100', 'model.ckpt-200']" in message
    assert "its state file names 'model.ckpt-200'" in message


@pytest.mark.parametrize("form", ["folder", "prefix", "no_state_file"])
def test_saver_v1_format_checkpoint(form, tmp_path):
    # tf.train.Saver(write_version=SaverDef.V1) writes one file `model.ckpt-0`
    # (no .index / .data-*), which TF's reader opens. It was refused as
    # "names '.../model.ckpt-0', which is not in the folder" (it is) or "is
    # neither a folder nor a checkpoint prefix".
    import tensorflow as tf

    layout = ref.LAYOUTS["wt103"]
    variables = ref.official_variables(layout)
    graph = tf.Graph()
    with graph.as_default():
        created = [tf.compat.v1.Variable(value, name=name) for name, value in
                   {**variables, **ref.optimizer_slots(variables)}.items()]
        saver = tf.compat.v1.train.Saver(created, write_version=tf.compat.v1.train.SaverDef.V1)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, str(tmp_path / "model.ckpt"), global_step=0)
    (tmp_path / "corpus-info.json").write_text(json.dumps(
        {"vocab_size": layout.n_token, "cutoffs": [0, *layout.cutoffs, layout.n_token]}))
    assert not list(tmp_path.glob("*.index"))
    path = tmp_path / "model.ckpt-0" if form == "prefix" else tmp_path
    if form == "no_state_file":
        os.remove(tmp_path / "checkpoint")
    model = keras_txl.load_official_checkpoint(path, **settings(layout))
    rows = chain(model, layout, variables)
    assert max(np.abs(r["log_probs"] - r["ref_log_probs"]).max() for r in rows) < ATOL
    # The .meta graph beside it stands for the checkpoint (it is not read as one).
    from_meta = keras_txl.load_official_checkpoint(tmp_path / "model.ckpt-0.meta", **settings(layout))
    ids = rows[0]["ids"].astype("int32")
    np.testing.assert_allclose(from_meta.call_with_memory(ids)["log_probs"],
                               model.call_with_memory(ids)["log_probs"], atol=1e-6)


def test_stateful_import_equals_the_pure_model(tmp_path):
    layout, _ = write_release(tmp_path, "lm1b")
    pure = keras_txl.load_official_checkpoint(tmp_path, **settings(layout))
    stateful = keras_txl.load_official_checkpoint(
        tmp_path, stateful=True, batch_size=B, **settings(layout)
    )
    ids = np.random.default_rng(2).integers(0, layout.n_token, (B, 2 * layout.tgt_len))
    memory = None
    for s in range(2):
        segment = ids[:, s * layout.tgt_len:(s + 1) * layout.tgt_len]
        out = pure.call_with_memory(segment.astype("int32"), memory)
        memory = out["memory"]
        np.testing.assert_allclose(
            stateful(segment.astype("int32")).numpy(), out["log_probs"].numpy(),
            atol=1e-5,
        )


def test_release_layout_with_data_folder(tmp_path):
    """pretrained_xl/tf_<dataset>/{model,data/corpus-info.json}."""
    layout, _ = write_release(tmp_path / "model", "text8")
    (tmp_path / "data").mkdir()
    shutil.move(tmp_path / "model" / "corpus-info.json", tmp_path / "data")
    model = keras_txl.load_official_checkpoint(tmp_path / "model")
    assert model.txl_config.vocabulary_size == 27


def test_optimizer_slots_and_global_step_are_skipped(tmp_path):
    layout, variables = write_release(tmp_path, "enwik8")
    import tensorflow as tf

    names = tf.train.load_checkpoint(str(tmp_path / "model.ckpt-0"))
    names = names.get_variable_to_shape_map()
    assert "global_step" in names and "beta1_power" in names
    assert "transformer/r_w_bias/Adam_1" in names
    model = keras_txl.load_official_checkpoint(tmp_path)
    np.testing.assert_array_equal(
        model.backbone.content_bias.numpy(), variables["transformer/r_w_bias"]
    )


# === Evaluation protocol ===


def test_eval_protocols_are_the_official_sota_scripts():
    # tf/sota/{wt103,enwik8,text8,lm1b}.sh: TEST_TGT_LEN, TEST_MEM_LEN,
    # TEST_CLAMP_LEN, --same_length=True.
    table = {name: (p["segment_length"], p["memory_length"], p["clamp_length"],
                    p["same_length"])
             for name, p in keras_txl.EVAL_PROTOCOLS.items()}
    assert table == {
        "wt103": (128, 1600, 1000, True),
        "enwik8": (128, 3800, 1000, True),
        "text8": (128, 3800, 1000, True),
        "lm1b": (32, 128, -1, True),
    }
    from keras_txl.cli import _PROTOCOLS  # the CLI's choices

    assert _PROTOCOLS == tuple(keras_txl.EVAL_PROTOCOLS)
    for preset, protocol in presets.PROTOCOL_OF_PRESET.items():
        assert presets.PRESETS[preset]["eval"] == keras_txl.EVAL_PROTOCOLS[protocol]
    config = keras_txl.TransformerXLConfig.from_preset(
        "wt103_base", same_length_convention="pytorch"
    )
    applied = keras_txl.apply_eval_protocol(config, "wt103")
    assert (applied.segment_length, applied.memory_length,
            applied.clamp_length, applied.same_length,
            applied.same_length_convention) == (128, 1600, 1000, True, "official_tf")
    assert applied.num_parameters() == config.num_parameters()
    with pytest.raises(ValueError, match="Unknown evaluation protocol 'ptb'"):
        presets.eval_protocol("ptb")


def test_preset_applies_the_protocol_and_keywords_override(tmp_path):
    write_release(tmp_path, "lm1b")
    model = keras_txl.load_official_checkpoint(tmp_path, preset="lm1b")
    cfg = model.txl_config
    assert (cfg.segment_length, cfg.memory_length, cfg.clamp_length,
            cfg.same_length) == (32, 128, -1, True)
    model = keras_txl.load_official_checkpoint(
        tmp_path, preset="wt103_large", memory_length=7
    )
    cfg = model.txl_config
    assert (cfg.segment_length, cfg.memory_length, cfg.clamp_length) == (128, 7, 1000)
    message = _load_error(tmp_path, preset="ptb")
    assert "Unknown evaluation protocol 'ptb'" in message and "'wt103'" in message


# === Errors ===


def _load_error(path, **kw):
    with pytest.raises(ValueError) as info:
        keras_txl.load_official_checkpoint(path, **kw)
    return str(info.value)


def test_vocab_size_contradicting_corpus_info(tmp_path):
    write_release(tmp_path, "enwik8")
    (tmp_path / "corpus-info.json").write_text(
        json.dumps({"vocab_size": 61, "cutoffs": [], "dataset": "enwik8"})
    )
    message = _load_error(tmp_path)
    assert "transformer/adaptive_embed/lookup_table" in message
    assert "[60, 32]" in message and "[61, 32]" in message
    assert str(tmp_path / "corpus-info.json") in message and "model.ckpt-0" in message


def test_cutoffs_contradicting_corpus_info(tmp_path):
    write_release(tmp_path, "wt103")
    info = tmp_path / "corpus-info.json"
    info.write_text(json.dumps(
        {"vocab_size": 150, "cutoffs": [0, 25, 45, 90, 150], "dataset": "wt103"}
    ))
    message = _load_error(tmp_path)
    assert "transformer/adaptive_embed/cutoff_0/lookup_table" in message
    assert "cutoffs=[25, 45, 90]" in message
    info.write_text(json.dumps({"vocab_size": 150, "cutoffs": [20, 45]}))
    message = _load_error(tmp_path)
    assert str(info) in message and "4 adaptive embedding tables" in message
    info.write_text(json.dumps({"vocab_size": 150, "cutoffs": [0, 20, 45, 149]}))
    assert "must end with vocab_size=150" in _load_error(tmp_path)


def test_missing_variable(tmp_path):
    layout = ref.LAYOUTS["wt103"]
    variables = ref.official_variables(layout)
    del variables["transformer/layer_1/ff/layer_2/bias"]
    write_release(tmp_path, "wt103", variables=variables)
    message = _load_error(tmp_path)
    assert "missing variable 'transformer/layer_1/ff/layer_2/bias'" in message
    assert "model.ckpt-0" in message


@pytest.mark.parametrize("name, missing", [
    # Cluster 0's softmax projection is never shared (train_gpu.py/train.py
    # start tie_projs with False): without it, the loader used the
    # embedding's proj_W in its place and loaded a model nobody trained.
    ("wt103", "cutoff_0/proj"),
    ("div1_cutoffs", "cutoff_0/proj"),
    # proj_share_all_but_first shares clusters 1.. all or none: one of
    # several own projections missing is a missing variable, not a tie.
    ("lm1b", "cutoff_2/proj"),
])
def test_missing_softmax_projection_is_named_not_replaced_by_a_tie(name, missing, tmp_path):
    variables = ref.official_variables(ref.LAYOUTS[name])
    del variables["transformer/adaptive_softmax/" + missing]
    write_release(tmp_path, name, variables=variables)
    message = _load_error(tmp_path)
    assert f"missing variable 'transformer/adaptive_softmax/{missing}'" in message


@pytest.mark.parametrize("missing", ["cutoff_0/lookup_table", "cutoff_2/lookup_table",
                                     "cutoff_3/lookup_table"])
def test_missing_embedding_table_is_named(missing, tmp_path):
    # Was: "3 adaptive embedding tables (...cutoff_0..2/lookup_table) but
    # corpus-info.json has 3 cutoffs [20, 45, 90], so 4 clusters: the corpus
    # info belongs to another model", naming neither the missing variable nor
    # that the checkpoint's own softmax (cutoff_3/b) has the 4 clusters.
    variables = ref.official_variables(ref.LAYOUTS["wt103"])
    del variables["transformer/adaptive_embed/" + missing]
    write_release(tmp_path, "wt103", variables=variables)
    message = _load_error(tmp_path)
    assert f"missing variable 'transformer/adaptive_embed/{missing}'" in message
    assert "corpus-info.json" in message and "4 clusters" in message


def test_missing_projection_of_a_cluster_as_wide_as_d_model_is_named(tmp_path):
    # Without cutoff_0/proj_W (cluster 0 is d_model wide), proj_same_dim was
    # inferred False and the error named the softmax's cutoff_0/proj, which
    # is there and only exists with proj_same_dim: "unknown variable(s)
    # ['transformer/adaptive_softmax/cutoff_0/proj']".
    variables = ref.official_variables(ref.LAYOUTS["wt103"])
    del variables["transformer/adaptive_embed/cutoff_0/proj_W"]
    write_release(tmp_path, "wt103", variables=variables)
    message = _load_error(tmp_path)
    assert "missing variable 'transformer/adaptive_embed/cutoff_0/proj_W'" in message
    assert "unknown" not in message


def test_unknown_model_variable(tmp_path):
    extra = {"transformer/layer_0/rel_attn/gate/kernel": np.zeros([8], np.float32)}
    write_release(tmp_path, "text8", extra=extra)
    message = _load_error(tmp_path)
    assert "unknown variable(s) ['transformer/layer_0/rel_attn/gate/kernel']" in message
    assert "model.ckpt-0" in message


def test_shape_contradicting_other_variables(tmp_path):
    layout = ref.LAYOUTS["enwik8"]
    variables = ref.official_variables(layout)
    variables["transformer/layer_1/rel_attn/o/kernel"] = np.zeros([32, 30], np.float32)
    write_release(tmp_path, "enwik8", variables=variables)
    message = _load_error(tmp_path)
    assert "'transformer/layer_1/rel_attn/o/kernel' has shape [32, 30]" in message
    assert "expected [32, 32]" in message

    variables = ref.official_variables(layout)
    variables["transformer/r_r_bias"] = np.zeros([2, 2, 16], np.float32)
    write_release(tmp_path / "b", "enwik8", variables=variables)
    message = _load_error(tmp_path / "b")
    assert "'transformer/r_r_bias' has shape [2, 2, 16]" in message
    assert "from transformer/r_w_bias" in message


@pytest.mark.parametrize("name, change, says", [
    # A table 65 wide: d_embed is read from it, so cutoff_0/proj_W [64, 64]
    # no longer fits; the message said "expected [65, 64] from the other
    # variables", naming neither the table nor the width.
    ("wt103", ("transformer/adaptive_embed/cutoff_0/lookup_table", (20, 65)),
     ["'transformer/adaptive_embed/cutoff_0/proj_W' has shape [64, 64], expected [65, 64]",
      "d_embed=65 (from transformer/adaptive_embed/cutoff_0/lookup_table)",
      "d_model=64 (from transformer/layer_0/rel_attn/qkv/kernel)"]),
    ("enwik8", ("transformer/layer_0/ff/layer_1/kernel", (32, 49)),
     ["'transformer/layer_0/ff/layer_1/bias' has shape [48], expected [49]",
      "d_inner=49 (from transformer/layer_0/ff/layer_1/kernel)"]),
    ("wt103_heads3x8_mem9_clamp2", ("transformer/layer_1/rel_attn/r/kernel", (32, 25)),
     ["'transformer/layer_1/rel_attn/r/kernel' has shape [32, 25], expected [32, 24]",
      "n_head=3, d_head=8 (from transformer/r_w_bias)"]),
])
def test_wrong_shape_names_the_variables_the_expected_shape_comes_from(name, change, says, tmp_path):
    variables = ref.official_variables(ref.LAYOUTS[name])
    variables[change[0]] = np.zeros(change[1], np.float32)
    write_release(tmp_path, name, variables=variables)
    message = _load_error(tmp_path)
    for part in says:
        assert part in message


def test_keyword_contradicting_checkpoint(tmp_path):
    write_release(tmp_path, "text8")
    message = _load_error(tmp_path, num_layers=2)
    assert "`num_layers`=2 contradicts" in message and "num_layers=3" in message
    message = _load_error(tmp_path, layer_norm_epsilon=1e-5)
    assert "layer_norm_epsilon=1e-12" in message
    # Repeating a fixed value is fine.
    model = keras_txl.load_official_checkpoint(tmp_path, num_layers=3, dropout=0.1)
    assert model.txl_config.dropout == 0.1


def test_missing_files(tmp_path):
    assert "No TF checkpoint" in _load_error(tmp_path)
    write_release(tmp_path, "text8", corpus_info=False)
    message = _load_error(tmp_path)
    assert "No corpus-info.json" in message
    assert str(tmp_path / "corpus-info.json") in message
    assert "neither a folder nor a checkpoint prefix" in _load_error(
        tmp_path / "model.ckpt-9"
    )


@pytest.mark.parametrize("which", ["index", "data"])
def test_a_fifo_in_place_of_a_checkpoint_file_is_refused_not_waited_on(which, tmp_path):
    # TensorFlow's reader blocks forever on a FIFO (nothing ever writes it).
    write_release(tmp_path, "text8")
    path = next(p for p in tmp_path.iterdir()
                if p.name.endswith(".index" if which == "index" else ".data-00000-of-00001"))
    path.unlink()
    os.mkfifo(path)
    what = "checkpoint index" if which == "index" else "checkpoint data shard"
    assert f"The {what} {str(path)!r} is a FIFO" in _load_error(tmp_path)


def test_corpus_info_dataset_must_be_a_string(tmp_path):
    write_release(tmp_path, "text8")
    info = json.loads((tmp_path / "corpus-info.json").read_text())
    (tmp_path / "corpus-info.json").write_text(json.dumps({**info, "dataset": ["text8"]}))
    assert re.search(r"corpus-info.json: `dataset` must be a string .* received \['text8'\]",
                     _load_error(tmp_path))


def test_cli_vocabulary_file_needs_the_corpus_info_dataset_before_loading(tmp_path, capsys):
    from keras_txl.cli import main

    write_release(tmp_path, "text8")
    info = json.loads((tmp_path / "corpus-info.json").read_text())
    del info["dataset"]
    (tmp_path / "corpus-info.json").write_text(json.dumps(info))
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["_"] + [chr(ord("a") + i) for i in range(26)]) + "\n")
    assert main(["generate", "--from-official", str(tmp_path), "--vocabulary-file",
                 str(vocab), "--prompt", "the"]) == 2
    err = capsys.readouterr().err
    assert (f"{tmp_path / 'corpus-info.json'}: `dataset` is None, but a vocabulary file is "
            "read with the tokenizer of the release's dataset") in err


# === Vocabulary ===


def test_vocabulary_file(tmp_path):
    layout, _ = write_release(tmp_path, "text8")
    symbols = ["_"] + [chr(ord("a") + i) for i in range(26)]
    vocab = tmp_path / "text8-vocab.txt"
    vocab.write_text("\n".join(symbols) + "\n", encoding="utf-8")
    model = keras_txl.load_official_checkpoint(tmp_path, vocabulary_file=str(vocab))
    assert model.vocabulary == tuple(symbols)
    from keras_txl.tokenizers import official_tokenizer

    tokenizer = official_tokenizer(model.vocabulary, "text8")
    tokenizer.check_model_vocabulary(model.txl_config.vocabulary_size)
    ids = tokenizer.encode("the cat")
    assert ids.tolist() == [20, 8, 5, 0, 3, 1, 20]
    assert tokenizer.decode(ids) == "the cat"

    short = tmp_path / "short.txt"
    short.write_text("\n".join(symbols[:-1]) + "\n", encoding="utf-8")
    message = _load_error(tmp_path, vocabulary_file=str(short))
    assert str(short) in message and "26 symbols" in message
    assert "vocab_size=27" in message
    # A byte order mark (a Windows editor's) is not part of the first symbol.
    bom = tmp_path / "bom.txt"
    bom.write_bytes(b"\xef\xbb\xbf" + "\n".join(symbols).encode() + b"\n")
    assert keras_txl.load_official_checkpoint(
        tmp_path, vocabulary_file=str(bom)).vocabulary == tuple(symbols)
    # Something other than a regular file is named as what it is.
    assert f"The `vocabulary_file` {str(tmp_path)!r} is a directory" in _load_error(
        tmp_path, vocabulary_file=str(tmp_path))
    repeated = tmp_path / "repeated.txt"
    repeated.write_text("\n".join(symbols[:-1] + ["a"]) + "\n", encoding="utf-8")
    message = _load_error(tmp_path, vocabulary_file=str(repeated))
    assert str(repeated) in message and "'a' on line 27 repeats line 2" in message


def test_official_tokenizers_follow_the_official_preprocessing(tmp_path):
    from keras_txl import tokenizers

    # enwik8: decimal UTF-8 byte values, newlines dropped (prep_enwik8.py).
    vocabulary = [str(b) for b in (101, 104, 195, 169, 32)]
    enwik8 = tokenizers.official_tokenizer(vocabulary, "enwik8")
    ids = enwik8.encode("hé\ne")
    assert ids.tolist() == [1, 2, 3, 0]
    assert enwik8.decode(ids) == "hée"
    enwik8.save(tmp_path / "tok")
    loaded = tokenizers.load_tokenizer(tmp_path / "tok")
    assert loaded.encode("hé").tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="symbol '120' is not in the enwik8"):
        enwik8.encode("x")
    # text8: characters, "_" for a space; fit orders by frequency.
    text8 = tokenizers.OfficialSymbolTokenizer.fit("ab a", dataset="text8")
    assert text8.vocabulary == ["a", "b", "_"]
    assert text8.decode(text8.encode("ba ab")) == "ba ab"
    # wt103: words, <eos> per line; lm1b: <S> words <S> per line, <UNK>.
    wt103 = tokenizers.official_tokenizer(["<eos>", "the", "<unk>", "cat"], "wt103")
    assert wt103.encode("the cat dog\n").tolist() == [1, 3, 2, 0]
    lm1b = tokenizers.official_tokenizer(["<S>", "<UNK>", "the"], "lm1b")
    assert lm1b.encode("the dog\n").tolist() == [0, 2, 1, 0]
    strict = tokenizers.official_tokenizer(["<eos>", "the"], "wt103")
    with pytest.raises(ValueError, match="word 'cat' is not in the vocabulary"):
        strict.encode("the cat\n")


def test_wt2_and_ptb_corpus_infos_get_the_official_word_tokenizers(tmp_path, capsys):
    # tf/data_utils.py also prepares "wt2" and "ptb" (as wt103: words, <eos>
    # per line; ptb lower-cased); a model trained on them with the official
    # code was refused with a vocabulary file: "`dataset` is 'ptb', but a
    # vocabulary file is read with the tokenizer of the release's dataset, one
    # of ('wt103', 'lm1b', 'enwik8', 'text8')".
    from keras_txl import tokenizers
    from keras_txl.cli import main

    words = ["<eos>", "the", "<unk>", "cat", "n"]
    wt2 = tokenizers.official_tokenizer(words, "wt2")
    assert wt2.encode("the cat dog\nThe\n").tolist() == [1, 3, 2, 0, 2, 0]
    ptb = tokenizers.official_tokenizer(words, "ptb")  # Vocab(lower_case=True)
    assert ptb.encode("The CAT N\n").tolist() == [1, 3, 4, 0]

    layout, _ = write_release(tmp_path, "enwik8")
    info = json.loads((tmp_path / "corpus-info.json").read_text())
    (tmp_path / "corpus-info.json").write_text(json.dumps({**info, "dataset": "ptb"}))
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(words + [f"w{i}" for i in range(layout.n_token - len(words))]) + "\n")
    assert main(["generate", "--from-official", str(tmp_path), "--vocabulary-file", str(vocab),
                 "--prompt", "The cat", "--max-new-tokens", "3", "--top-k", "1"]) == 0
    assert capsys.readouterr().out.strip()


def test_read_corpus_info_forms(tmp_path):
    path = tmp_path / "corpus-info.json"
    path.write_text(json.dumps({"vocab_size": 204, "cutoffs": [], "dataset": "enwik8"}))
    assert read_corpus_info(str(path)) == (204, (), "enwik8")
    path.write_text(json.dumps({"vocab_size": 10, "cutoffs": [0, 4, 10]}))
    assert read_corpus_info(str(path)) == (10, (4,), None)
    path.write_text(json.dumps({"vocab_size": 10, "cutoffs": [4, 3]}))
    with pytest.raises(ValueError, match="must increase strictly"):
        read_corpus_info(str(path))


# === Export and generation ===


def test_imported_model_exports_and_generates(tmp_path):
    from keras_txl import generation
    from keras_txl.export import generation as export_generation
    from keras_txl.export.saved_model import export_saved_model
    from keras_txl.export.tflite import export_tflite
    from keras_txl.export.tflite import run_tflite
    from keras_txl.tokenizers import official_tokenizer

    layout, variables = write_release(tmp_path / "release", "wt103")
    symbols = ["<eos>", "<unk>"] + [f"w{i}" for i in range(layout.n_token - 2)]
    vocab = tmp_path / "wt103-vocab.txt"
    vocab.write_text("\n".join(symbols) + "\n", encoding="utf-8")
    model = keras_txl.load_official_checkpoint(
        tmp_path / "release", vocabulary_file=str(vocab), **settings(layout)
    )
    official_tokenizer(model.vocabulary, "wt103").save(tmp_path / "tokenizer")
    T = layout.tgt_len
    ids = np.random.default_rng(1).integers(0, layout.n_token, (1, 3 * T))
    ids = ids.astype(np.int32)
    memory, expected = None, []
    for s in range(3):
        out = model.call_with_memory(ids[:, s * T:(s + 1) * T], memory)
        memory = out["memory"]
        expected.append(out["log_probs"].numpy())
    expected = np.concatenate(expected, axis=1)

    version = export_saved_model(
        model, str(tmp_path / "sm"), tokenizer_dir=str(tmp_path / "tokenizer")
    )
    backend = export_generation.SavedModelBackend(version)
    assert backend.tokenizer_dir is not None
    prompt = ids[0, :6].tolist()
    keras_ids = np.asarray(generation.generate(model, prompt, 5, temperature=0))
    saved_ids = np.asarray(generation.generate(backend, prompt, 5, temperature=0))
    assert keras_ids.shape[-1] == 5
    np.testing.assert_array_equal(saved_ids, keras_ids)

    path = export_tflite(model, str(tmp_path / "txl.tflite"), batch_size=1,
                         segment_length=T)
    tflite_log_probs = run_tflite(path, ids)
    assert np.abs(tflite_log_probs - expected).max() < 1e-4


# === Command line ===


TEXT8_SYMBOLS = ["_"] + [chr(ord("a") + i) for i in range(26)]


def text8_release(tmp_path):
    layout, variables = write_release(tmp_path / "release", "text8")
    vocab = tmp_path / "text8-vocab.txt"
    vocab.write_text("\n".join(TEXT8_SYMBOLS) + "\n", encoding="utf-8")
    return layout, variables, vocab


def test_cli_eval_from_official_with_the_paper_protocol(tmp_path, capsys):
    import dataclasses

    from keras_txl.cli import main

    layout, variables, vocab = text8_release(tmp_path)
    words = "the memory of the model is the hidden state of the last segment "
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("train", "valid", "test"):
        (corpus / f"{split}.txt").write_text(words * 5, encoding="utf-8")
    code = main(["eval", "--from-official", str(tmp_path / "release"),
                 "--vocabulary-file", str(vocab), "--data", str(corpus),
                 "--protocol", "paper"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["settings"] == {"segment_length": 128, "memory_length": 3800,
                                  "clamp_length": 1000, "same_length": True,
                                  "batch_size": 1, "max_segments": 0,
                                  "dtype": "float32"}
    # The same number from the NumPy transcription under tf/sota/text8.sh
    # settings: one stream, segments of 128 with the memory carried.
    paper = dataclasses.replace(layout, tgt_len=128, mem_len=3800,
                                clamp_len=1000, same_length=True)
    ids = np.array([TEXT8_SYMBOLS.index("_" if c == " " else c)
                    for c in words * 5])
    assert result["tokens"] == len(ids) - 1
    nll, mems = [], None
    for start in range(0, len(ids) - 1, 128):
        x = ids[start:start + 128][: len(ids) - 1 - start]
        y = ids[start + 1:start + 1 + len(x)]
        log_probs, mems = ref.forward(paper, variables, x[None], mems)
        nll.extend(-log_probs[0, np.arange(len(y)), y])
    assert abs(result["loss"] - np.mean(nll)) < 1e-4, (result["loss"], np.mean(nll))
    assert abs(result["bpc"] - np.mean(nll) / np.log(2)) < 1e-4


def test_cli_protocol_paper_needs_a_dataset(tmp_path, capsys):
    from keras_txl.cli import main

    run = tmp_path / "run"
    run.mkdir()
    assert main(["eval", "--workdir", str(run), "--protocol", "paper"]) == 2
    assert "--protocol paper takes the dataset" in capsys.readouterr().err


def test_cli_generate_and_export_from_official(tmp_path, capsys):
    from keras_txl import generation
    from keras_txl.cli import main
    from keras_txl.export import generation as export_generation

    layout, variables, vocab = text8_release(tmp_path)
    release = str(tmp_path / "release")
    code = main(["generate", "--from-official", release, "--vocabulary-file",
                 str(vocab), "--prompt", "the cat", "--max-new-tokens", "6",
                 "--temperature", "0"])
    assert code == 0
    text = capsys.readouterr().out.rstrip("\n")
    model = keras_txl.load_official_checkpoint(release, preset="text8")
    expected = generation.generate(model, [20, 8, 5, 0, 3, 1, 20], 6, temperature=0)
    assert text == "the cat" + "".join(
        " " if TEXT8_SYMBOLS[i] == "_" else TEXT8_SYMBOLS[i]
        for i in np.asarray(expected).reshape(-1)
    )
    out = tmp_path / "exports"
    code = main(["export", "--from-official", release, "--vocabulary-file",
                 str(vocab), "--out", str(out), "--memory-length", "8"])
    assert code == 0
    backend = export_generation.SavedModelBackend(str(out / "txl"))
    assert backend.config.memory_length == 8
    assert backend.config.layer_norm_epsilon == 1e-12
    from keras_txl.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(backend.tokenizer_dir)
    assert tokenizer.encode("the cat").tolist() == [20, 8, 5, 0, 3, 1, 20]


# === The vocabulary conversion snippet of docs/official_checkpoints.md ===


def _doc_snippet():
    from testing import REPO

    text = (REPO / "docs" / "official_checkpoints.md").read_text(encoding="utf-8")
    block = text.split("<!-- vocabulary-snippet -->", 1)[1]
    code = block.split("```python\n", 1)[1].split("```", 1)[0]
    # Everything but the example call on the real release.
    lines = [line for line in code.splitlines()
             if not line.startswith('write_vocabulary("pretrained_xl')]
    assert len(lines) == len(code.splitlines()) - 1
    namespace = {}
    exec("\n".join(lines), namespace)  # noqa: S102 - our own documentation
    return namespace


def test_vocabulary_snippet_converts_a_cache_pkl_and_refuses_code(
    tmp_path, monkeypatch, capsys
):
    import collections
    import pickle
    import sys
    import types

    # Stand-ins for the official tf/data_utils.py and tf/vocabulary.py.
    data_utils = types.ModuleType("data_utils")
    vocabulary = types.ModuleType("vocabulary")

    class Corpus:
        pass

    class Vocab:
        pass

    Corpus.__module__, Corpus.__qualname__ = "data_utils", "Corpus"
    Vocab.__module__, Vocab.__qualname__ = "vocabulary", "Vocab"
    data_utils.Corpus, vocabulary.Vocab = Corpus, Vocab
    monkeypatch.setitem(sys.modules, "data_utils", data_utils)
    monkeypatch.setitem(sys.modules, "vocabulary", vocabulary)
    symbols = ["<eos>", "the", ",", "<unk>", "café", "Дай"]
    vocab = Vocab()
    vocab.special, vocab.lower_case, vocab.delimiter = ["<eos>"], False, None
    vocab.counter = collections.Counter({"the": 5, ",": 3})
    vocab.idx2sym = list(symbols)
    vocab.sym2idx = collections.OrderedDict((s, i) for i, s in enumerate(symbols))
    vocab.eos_idx = 0
    corpus = Corpus()
    corpus.dataset, corpus.vocab = "wt103", vocab
    corpus.cutoffs = [0, 2, 4, len(symbols)]
    corpus.train = np.arange(10, dtype=np.int64) % len(symbols)
    corpus.test = np.int64(3)
    cache = tmp_path / "cache.pkl"
    cache.write_bytes(pickle.dumps(corpus, protocol=2))

    snippet = _doc_snippet()
    out = tmp_path / "vocab.txt"
    snippet["write_vocabulary"](str(cache), str(out))
    assert f"{out}: 6 symbols" in capsys.readouterr().out
    assert out.read_text(encoding="utf-8").split("\n") == symbols + [""]
    from keras_txl.official_checkpoint import read_vocabulary_file

    assert read_vocabulary_file(str(out), 6) == symbols

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo owned",))

    evil = tmp_path / "evil.pkl"
    evil.write_bytes(pickle.dumps({"vocab": Evil()}, protocol=2))
    with pytest.raises(pickle.UnpicklingError, match="refusing (posix|os|nt).system"):
        snippet["write_vocabulary"](str(evil), str(tmp_path / "x.txt"))


def test_documented_commands_parse():
    """Every `txl` command in the docs of this feature is a valid command
    line (arguments and choices)."""
    import re
    import shlex

    from testing import REPO

    from keras_txl.cli import build_parser

    commands = []
    for name in ("docs/official_checkpoints.md", "README.md", "docs/export.md"):
        text = (REPO / name).read_text(encoding="utf-8")
        for block in re.findall(r"```bash\n(.*?)```", text, re.S):
            for command in block.replace("\\\n", " ").splitlines():
                if command.startswith("txl ") and "from-official" in command:
                    commands.append(command)
    assert len(commands) >= 4
    parser = build_parser()
    for command in commands:
        args = parser.parse_args(shlex.split(command)[1:])
        assert args.from_official.startswith("pretrained_xl/tf_")


def test_lm1b_tokenizer_wraps_every_sentence_as_the_official_stream():
    from keras_txl.tokenizers import official_tokenizer

    vocabulary = ["<S>", "<UNK>", "the", "cat", "sat"]
    tokenizer = official_tokenizer(vocabulary, "lm1b")
    # vocabulary.py with add_double_eos: ['<S>'] + line.split() + ['<S>'] per line.
    expected = [0, 2, 3, 0, 0, 4, 1, 0]
    for text in ("the cat\nsat dog\n", "the cat\nsat dog"):
        np.testing.assert_array_equal(tokenizer.encode(text), expected)
    # The chunked encoder of long texts gives the same stream as one piece.
    long_text = "the cat sat\n" * 50_000
    ids = tokenizer.encode(long_text)
    np.testing.assert_array_equal(ids, np.tile([0, 2, 3, 4, 0], 50_000))
