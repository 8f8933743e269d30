"""SavedModel export: layout, signatures, fresh-process parity, errors, CLI.

The exported SavedModel is reloaded in a new Python process that imports
only TensorFlow (not keras_txl) and chained over three segments, memory out
-> memory in; its outputs come back as .npz and are compared with
`call_with_memory` here.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import types

import keras
import numpy as np
import pytest
import tensorflow as tf
from testing import FIXTURES
from testing import signature_reference
from testing import tiny_config

import keras_txl
from keras_txl.export import cli
from keras_txl.export import saved_model
from keras_txl.export import serving
from keras_txl.export import signatures as sig
from keras_txl.tokenizers import build_tokenizer
from keras_txl.tokenizers import load_tokenizer

HF = FIXTURES / "hf_transfo_xl_tiny"
B, T, SEGMENTS = 2, 4, 3

# Runs in a fresh interpreter: TensorFlow only.
FRESH_SCRIPT = r"""
import json, sys
import numpy as np
import tensorflow as tf

report = {}
for job in json.loads(sys.argv[1]):
    signatures = tf.saved_model.load(job["saved_model"]).signatures
    ids = np.load(job["inputs"])
    T = job["segment_length"]
    targets = np.roll(ids, -1, axis=1)
    memory = signatures["initial_memory"](
        batch_size=tf.constant(ids.shape[0], tf.int32))["memory"]
    out = {"initial_memory": memory.numpy()}
    for s in range(ids.shape[1] // T):
        segment = tf.constant(ids[:, s * T:(s + 1) * T])
        target = tf.constant(targets[:, s * T:(s + 1) * T])
        served = signatures["serving_default"](token_ids=segment, memory=memory)
        scored = signatures["score"](token_ids=segment, targets=target, memory=memory)
        following = signatures["next_token"](token_ids=segment, memory=memory)
        out[f"log_probs_{s}"] = served["log_probs"].numpy()
        out[f"nll_{s}"] = scored["nll"].numpy()
        out[f"next_{s}"] = following["log_probs"].numpy()
        for name, result in (("score", scored), ("next", following)):
            np.testing.assert_array_equal(result["memory"], served["memory"])
        memory = served["memory"]
        out[f"memory_{s}"] = memory.numpy()
    np.savez(job["output"], **out)
report["keras_txl_imported"] = "keras_txl" in sys.modules
print("REPORT " + json.dumps(report))
"""


def run_fresh(jobs, tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(
        [sys.executable, "-c", FRESH_SCRIPT, json.dumps(jobs)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("REPORT ")][-1]
    return json.loads(line[len("REPORT "):])


def run_cli(*argv):
    parser = cli.add_arguments(argparse.ArgumentParser())
    return cli.run(parser.parse_args([str(a) for a in argv]))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A training-run folder exported with `txl export --workdir`."""
    keras.utils.set_random_seed(0)
    tmp = tmp_path_factory.mktemp("saved_model")
    # M > T, so each memory mixes two segments.
    model = keras_txl.TransformerXLCausalLM(tiny_config(memory_length=6))
    tokenizer = tmp / "tokenizer_src"  # 11 ids, as the model
    build_tokenizer("word", ["a b c d e f g h i"]).save(tokenizer)
    keras_txl.save_pretrained(model, str(tmp / "run" / "model"), tokenizer=str(tokenizer))
    assert run_cli("--workdir", tmp / "run", "--out", tmp / "out") == 0
    ids = np.random.default_rng(0).integers(
        0, model.txl_config.vocabulary_size, (B, SEGMENTS * T)
    ).astype(np.int32)
    return types.SimpleNamespace(
        model=model, version_dir=str(tmp / "out" / "txl" / "1"), ids=ids,
        tmp=tmp, reference=signature_reference(model, ids, T),
    )


@pytest.fixture(scope="module")
def hf_export(tmp_path_factory):
    """The shipped HF fixture exported through `txl export --from-hf`."""
    out = tmp_path_factory.mktemp("hf_saved_model")
    assert run_cli("--from-hf", HF, "--format", "saved_model", "--out", out) == 0
    return str(out / "txl" / "1")


@pytest.fixture(scope="module")
def fresh(exported, hf_export):
    """Both exports reloaded and chained in one fresh process; meanwhile
    `saved_model_cli show --all` runs in another."""
    tmp = exported.tmp
    tool = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    show = subprocess.Popen(
        [tool, "show", "--all", "--dir", exported.version_dir],
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        np.save(tmp / "ids.npy", exported.ids)
        jobs = [dict(saved_model=exported.version_dir, inputs=str(tmp / "ids.npy"),
                     segment_length=T, output=str(tmp / "fresh_tiny.npz"))]
        jobs.append(dict(saved_model=hf_export, inputs=str(HF / "inputs.npy"),
                         segment_length=8, output=str(tmp / "fresh_hf.npz")))
        report = run_fresh(jobs, tmp)
        show_out, show_err = show.communicate(timeout=240)
    finally:
        if show.poll() is None:
            show.kill()
            show.communicate()
    hf = np.load(tmp / "fresh_hf.npz")
    return types.SimpleNamespace(
        report=report, tiny=np.load(tmp / "fresh_tiny.npz"), hf=hf,
        show=(show.returncode, show_out, show_err),
    )


@pytest.fixture(scope="module")
def loaded(exported):
    return tf.saved_model.load(exported.version_dir).signatures


def test_versioned_layout_and_side_files(exported):
    version_dir = exported.version_dir
    base = os.path.dirname(version_dir)
    assert os.path.basename(version_dir) == "1"
    assert os.listdir(base) == ["1"]  # no staging folder left behind
    # Readable by a server running as another user (not tempfile's 0o700).
    assert os.stat(version_dir).st_mode & 0o777 == saved_model.default_mode(True)
    for name in ("saved_model.pb", "variables"):
        assert os.path.exists(os.path.join(version_dir, name))
    extra = os.path.join(version_dir, "assets.extra")
    assert sorted(os.listdir(extra)) == [
        "config.json", "export.json", "tf_serving_warmup_requests", "tokenizer",
    ]
    config = keras_txl.TransformerXLConfig.from_json(os.path.join(extra, "config.json"))
    assert config == exported.model.txl_config
    assert saved_model.load_config(version_dir) == config
    assert load_tokenizer(os.path.join(extra, "tokenizer")).get_vocabulary() == (
        load_tokenizer(exported.tmp / "tokenizer_src").get_vocabulary())
    info = json.load(open(os.path.join(extra, "export.json")))
    assert info["batch_size"] is None and info["segment_length"] is None
    assert sorted(info["signatures"]) == sorted(sig.SAVED_MODEL_SIGNATURES)
    assert info["memory_shape"] == [None, 2, 6, 8]


def test_fresh_process_chain_matches_call_with_memory(exported, fresh):
    assert fresh.report["keras_txl_imported"] is False  # self-contained
    got = fresh.tiny
    np.testing.assert_array_equal(got["initial_memory"], np.zeros((B, 2, 6, 8)))
    for s, ref in enumerate(exported.reference):
        for key in ("log_probs", "memory", "nll", "next"):
            np.testing.assert_allclose(
                got[f"{key}_{s}"], ref[key], atol=1e-5, rtol=0,
                err_msg=f"{key} of segment {s}",
            )
    # The memory really carries information between segments.
    first = exported.model.call_with_memory(exported.ids[:, T:2 * T])
    assert np.abs(first["log_probs"].numpy() - got["log_probs_1"]).max() > 1e-4


def test_hf_fixture_parity_through_saved_model(fresh):
    for s in range(3):
        expected = np.load(HF / f"expected_logprobs_seg{s}.npy")
        np.testing.assert_allclose(
            fresh.hf[f"log_probs_{s}"], expected, atol=1e-4, rtol=1e-5,
            err_msg=f"segment {s}",
        )


def _parse_saved_model_cli(text):
    """{signature: {"inputs"|"outputs": {name: (dtype, shape)}, "method"}}."""
    result = {}
    blocks = re.split(r"^signature_def\['([^']+)'\]:\s*$", text, flags=re.M)
    for name, body in zip(blocks[1::2], blocks[2::2]):
        body = body.split("\nConcrete Functions:")[0]
        entry = {"inputs": {}, "outputs": {}}
        for kind, key, dtype, shape in re.findall(
            r"(inputs|outputs)\['([^']+)'\] tensor_info:\s*\n\s*dtype: (\w+)\s*\n"
            r"\s*shape: (\([^)]*\)|unknown_rank)", body,
        ):
            dims = tuple(int(d) for d in re.findall(r"-?\d+", shape))
            entry[kind][key] = (dtype, dims)
        method = re.search(r"Method name is: (\S+)", body)
        entry["method"] = method.group(1) if method else None
        result[name] = entry
    return result


def test_saved_model_cli_lists_the_four_signatures(exported, fresh):
    returncode, stdout, stderr = fresh.show
    assert returncode == 0, stderr[-3000:]
    shown = _parse_saved_model_cli(stdout)
    shown.pop("__saved_model_init_op", None)
    dtypes = {"int32": "DT_INT32", "float32": "DT_FLOAT"}
    expected = sig.signature_table(exported.model.txl_config)
    assert sorted(shown) == sorted(expected)
    for name, entry in expected.items():
        assert shown[name]["method"] == "tensorflow/serving/predict"
        for kind in ("inputs", "outputs"):
            want = {
                k: (dtypes[d], tuple(-1 if x is None else x for x in s))
                for k, (d, s) in entry[kind].items()
            }
            assert shown[name][kind] == want, (name, kind, stdout)
    # Spot check against the brief's table.
    assert shown["serving_default"]["outputs"]["memory"] == ("DT_FLOAT", (-1, 2, 6, 8))
    assert shown["score"]["outputs"]["nll"] == ("DT_FLOAT", (-1, -1))
    assert shown["next_token"]["outputs"]["log_probs"] == ("DT_FLOAT", (-1, 11))


def _good_inputs(exported):
    return dict(token_ids=tf.constant(exported.ids[:, :T]),
                memory=tf.zeros((B, 2, 6, 8)))


BAD_CALLS = {
    "memory_wrong_M": (
        "serving_default", dict(memory=tf.zeros((B, 2, 5, 8))), "Shape of tensor memory"),
    "memory_wrong_L": (
        "serving_default", dict(memory=tf.zeros((B, 3, 6, 8))), "Shape of tensor memory"),
    "memory_rank_3": (
        "serving_default", dict(memory=tf.zeros((B, 6, 8))), "Shape of tensor memory"),
    "memory_wrong_batch": (
        "next_token", dict(memory=tf.zeros((B + 1, 2, 6, 8))), "same batch size"),
    "memory_int": (
        "serving_default", dict(memory=tf.zeros((B, 2, 6, 8), tf.int32)), "float"),
    "memory_nan": (
        "serving_default", dict(memory=tf.fill((B, 2, 6, 8), np.nan)), "NaN or Inf"),
    "ids_float": (
        "serving_default", dict(token_ids=tf.zeros((B, T))), "int32"),
    "ids_int64": (
        "score", dict(token_ids=tf.zeros((B, T), tf.int64)), "int32"),
    "ids_rank_1": (
        "serving_default", dict(token_ids=tf.zeros((T,), tf.int32)), "Shape of tensor token_ids"),
    "ids_too_large": (
        "serving_default", dict(token_ids=tf.fill((B, T), 11)), "vocabulary_size=11"),
    "ids_negative": (
        "next_token", dict(token_ids=tf.fill((B, T), -1)), "must be >= 0"),
    "empty_segment": (
        "serving_default", dict(token_ids=tf.zeros((B, 0), tf.int32)), "at least one position"),
    "targets_out_of_range": (
        "score", dict(targets=tf.fill((B, T), 11)), "`targets` must be < vocabulary_size"),
    "targets_wrong_shape": (
        "score", dict(targets=tf.zeros((B, T - 1), tf.int32)), "shape of `token_ids`"),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_signatures_reject_bad_inputs(exported, loaded, case):
    name, changes, pattern = BAD_CALLS[case]
    inputs = _good_inputs(exported)
    if name == "score":
        inputs["targets"] = tf.constant(exported.ids[:, 1:T + 1])
    inputs.update(changes)
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(pattern)):
        loaded[name](**inputs)
    # Still fine afterwards.
    good = loaded["serving_default"](**_good_inputs(exported))
    np.testing.assert_allclose(
        good["log_probs"], exported.reference[0]["log_probs"], atol=1e-5
    )


def test_initial_memory_rejects_negative_batch(loaded):
    for bad in (-1, 0):  # a memory of 0 rows fails in every other signature
        with pytest.raises(tf.errors.InvalidArgumentError, match="batch_size` must be >= 1"):
            loaded["initial_memory"](batch_size=tf.constant(bad))


def test_dynamic_batch_and_segment_length(exported, loaded):
    ids = exported.ids[:1, :3]  # B=1, T=3: neither is the warm-up shape
    out = loaded["serving_default"](token_ids=tf.constant(ids), memory=tf.zeros((1, 2, 6, 8)))
    ref = exported.model.call_with_memory(ids)
    np.testing.assert_allclose(out["log_probs"], ref["log_probs"], atol=1e-5)
    np.testing.assert_allclose(out["memory"], ref["memory"], atol=1e-5)


def test_fixed_batch_segment_and_memory_length(exported, tmp_path):
    assert run_cli(
        "--workdir", exported.tmp / "run", "--out", tmp_path, "--name", "lm",
        "--version", 3, "--saved-model-batch-size", B, "--saved-model-segment-length", T,
        "--memory-length", 9, "--no-warmup",
    ) == 0
    version_dir = str(tmp_path / "lm" / "3")
    longer = exported.model.with_settings(memory_length=9)
    reference = longer.call_with_memory(exported.ids[:, :T])["log_probs"].numpy()
    assert saved_model.load_config(version_dir).memory_length == 9
    assert not os.path.exists(os.path.join(version_dir, "assets.extra", serving.WARMUP_FILE))
    signatures = tf.saved_model.load(version_dir).signatures
    specs = signatures["score"].structured_input_signature[1]
    assert tuple(specs["token_ids"].shape) == (B, T)
    assert tuple(specs["targets"].shape) == (B, T)
    assert tuple(specs["memory"].shape) == (B, 2, 9, 8)
    outputs = signatures["serving_default"].structured_outputs
    assert tuple(outputs["log_probs"].shape) == (B, T, 11)
    assert tuple(outputs["memory"].shape) == (B, 2, 9, 8)
    memory = signatures["initial_memory"](batch_size=tf.constant(B))["memory"]
    out = signatures["serving_default"](token_ids=tf.constant(exported.ids[:, :T]), memory=memory)
    np.testing.assert_allclose(out["log_probs"], reference, atol=1e-5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Shape of tensor token_ids"):
        signatures["serving_default"](
            token_ids=tf.constant(exported.ids[:, :T + 1]), memory=memory)
    with pytest.raises(tf.errors.InvalidArgumentError, match="fixed batch size of 2"):
        signatures["initial_memory"](batch_size=tf.constant(3))


def test_a_killed_exports_staging_folder_is_removed_by_the_next_export(exported, tmp_path):
    # A SIGKILL runs no cleanup: its staging folder stays in the base path.
    # The next export removes those of this host's dead processes, and leaves
    # a live process's (another export running) and another host's.
    import socket
    import subprocess
    import sys

    base = tmp_path / "txl"
    base.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    host = socket.gethostname()
    stale = base / f".tmp-1-{int(gone.stdout)}@{host}-abc123"
    live = base / f".tmp-1-{os.getpid()}@{host}-def456"
    elsewhere = base / f".tmp-1-{int(gone.stdout)}@not-{host}-ghi789"
    for folder in (stale, live, elsewhere):
        (folder / "variables").mkdir(parents=True)
    assert run_cli("--workdir", exported.tmp / "run", "--out", tmp_path, "--version", 2,
                   "--no-warmup") == 0
    assert sorted(p.name for p in base.iterdir()) == sorted(["2", live.name, elsewhere.name])


def test_export_arguments_are_checked(exported, tmp_path):
    model = exported.model
    with pytest.raises(ValueError, match="already exists"):
        out_dir = os.path.dirname(os.path.dirname(exported.version_dir))
        saved_model.export_saved_model(model, out_dir)
    with pytest.raises(ValueError, match="`version` must be a positive integer"):
        saved_model.export_saved_model(model, str(tmp_path), version=0)
    with pytest.raises(ValueError, match="`batch_size` must be a positive integer"):
        saved_model.export_saved_model(model, str(tmp_path), batch_size=-2)
    with pytest.raises(ValueError, match="plain folder name"):
        saved_model.export_saved_model(model, str(tmp_path), name="a/b")
    with pytest.raises(ValueError, match="plain folder name"):
        saved_model.export_saved_model(model, str(tmp_path), name="a\x00b")
    # Refused before the tracing, leaving no empty base folder behind.
    with pytest.raises(ValueError, match="`tokenizer_dir`=.* is not a folder"):
        saved_model.export_saved_model(model, str(tmp_path),
                                       tokenizer_dir=str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="TransformerXLCausalLM"):
        saved_model.export_saved_model(keras.Sequential(), str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_cli_reports_missing_model_and_existing_version(exported, tmp_path):
    workdir = tmp_path / "run"
    with pytest.raises(ValueError, match=re.escape(f"No model in {workdir}/model/")):
        run_cli("--workdir", workdir, "--out", tmp_path / "x")
    with pytest.raises(ValueError, match="already exists"):
        run_cli("--workdir", exported.tmp / "run", "--out", exported.tmp / "out")
    with pytest.raises(ValueError, match="is not a folder"):
        run_cli("--from-hf", tmp_path / "nothing", "--out", tmp_path)
    with pytest.raises(ValueError, match="--batch-size must be positive"):
        run_cli("--workdir", workdir, "--out", tmp_path, "--format", "tflite", "--batch-size", 0)
    with pytest.raises(SystemExit):  # argparse: exactly one source
        run_cli("--out", tmp_path)
    (tmp_path / "afile").write_text("mine")
    with pytest.raises(ValueError, match="--out .*afile' is a file: it must be a folder"):
        run_cli("--workdir", exported.tmp / "run", "--out", tmp_path / "afile")
    assert (tmp_path / "afile").read_text() == "mine"
    # A folder below a file was "[Errno 20] Not a directory", after loading.
    for out in (tmp_path / "afile" / "sub", tmp_path / "afile" / "sub" / "x"):
        for format in ("saved_model", "tflite"):
            with pytest.raises(ValueError, match=f"--out '{re.escape(str(out))}' is "
                               f"inside '{re.escape(str(tmp_path / 'afile'))}', which "
                               "is a file: --out must be a folder"):
                run_cli("--workdir", exported.tmp / "run", "--out", out,
                        "--format", format)
    assert (tmp_path / "afile").read_text() == "mine"
    assert not (tmp_path / "x").exists()
    # A TFLite file already there was replaced in silence (a re-export of
    # another model over a deployed one); with --format all, refused before
    # the SavedModel is written.
    (tmp_path / "tfl").mkdir()
    (tmp_path / "tfl" / "txl-stateful.tflite").write_bytes(b"deployed")
    with pytest.raises(ValueError, match=r"txl-stateful.tflite already exists: pass "
                       "--overwrite to replace"):
        run_cli("--workdir", exported.tmp / "run", "--out", tmp_path / "tfl",
                "--format", "all", "--stateful")
    assert os.listdir(tmp_path / "tfl") == ["txl-stateful.tflite"]
    assert (tmp_path / "tfl" / "txl-stateful.tflite").read_bytes() == b"deployed"
    with pytest.raises(ValueError, match=r"txl/1 already exists: pass --overwrite to "
                       r"replace, or choose another --version \(TF Serving"):
        run_cli("--workdir", exported.tmp / "run", "--out", exported.tmp / "out",
                "--format", "all")
    # A TFLite file has no version to choose; a flag for the other format is
    # named first (it is what the user must change).
    with pytest.raises(ValueError) as info:
        run_cli("--workdir", exported.tmp / "run", "--out", tmp_path / "tfl",
                "--format", "tflite", "--stateful")
    assert str(info.value).endswith("already exists: pass --overwrite to replace, or "
                                    "choose another --name or --out.")
    with pytest.raises(ValueError, match=r"--batch-size fixes the TFLite model's shapes"):
        run_cli("--workdir", exported.tmp / "run", "--out", exported.tmp / "out",
                "--format", "saved_model", "--batch-size", 2)


def test_stateful_model_is_exported_through_a_pure_copy(exported):
    stateful = keras_txl.TransformerXLCausalLM(
        exported.model.txl_config, stateful=True, batch_size=B)
    stateful.assign_weights_from(exported.model)
    pure = saved_model.pure_model(stateful)
    assert pure is not stateful and not pure.stateful and pure.memory is None
    out = pure.call_with_memory(exported.ids[:, :T])
    np.testing.assert_allclose(
        out["log_probs"], exported.reference[0]["log_probs"], atol=1e-6)
    assert saved_model.pure_model(exported.model) is exported.model


def test_side_files_hold_the_tokenizer_alone_when_it_lives_in_a_preset(tmp_path):
    # `txl export --workdir` finds the tokenizer in WORKDIR/model, a whole
    # preset: copying that folder put the model's weights into the export
    # (twice), where only the tokenizer belongs.
    from keras_txl.tokenizers import WordTokenizer
    from keras_txl.tokenizers import load_tokenizer

    words = ["<eos>", "<unk>", "the", "cat", "sat"]
    model = keras_txl.TransformerXLCausalLM(tiny_config(vocabulary_size=len(words)))
    keras_txl.save_preset(model, str(tmp_path / "model"), tokenizer=WordTokenizer(words))
    saved_model.write_side_files(str(tmp_path / "out"), model,
                                 tokenizer_dir=str(tmp_path / "model"))
    files = sorted(str(p.relative_to(tmp_path / "out" / "tokenizer"))
                   for p in (tmp_path / "out" / "tokenizer").rglob("*") if p.is_file())
    assert not [f for f in files if f.endswith(".h5") or f in ("config.json", "task.json")], files
    assert load_tokenizer(tmp_path / "out" / "tokenizer").get_vocabulary() == words


def test_overwrite_removes_the_old_version_only_after_the_new_one_is_in_place(
        exported, tmp_path, monkeypatch):
    # The old version folder was deleted before the new one was renamed in:
    # a TF Serving polling the base path found no version, and a kill in
    # between lost both.
    import shutil

    out = tmp_path / "out"
    saved_model.export_saved_model(exported.model, str(out), warmup=False)
    final = out / "txl" / "1"
    removed, real = [], shutil.rmtree

    def watched(path, *args, **kwargs):
        if os.path.basename(str(path)).startswith(".tmp-1_old-"):
            assert (final / "saved_model.pb").is_file(), "old removed before new in place"
        removed.append(os.path.basename(str(path)))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", watched)
    assert saved_model.export_saved_model(
        exported.model, str(out), warmup=False, overwrite=True) == str(final)
    assert any(name.startswith(".tmp-1_old-") for name in removed)
    assert sorted(os.listdir(out / "txl")) == ["1"]
    assert (final / "saved_model.pb").is_file()


def test_an_overwrite_that_fails_or_dies_midway_keeps_the_old_version(
        exported, tmp_path, monkeypatch):
    # The old version moved aside before the new one was renamed in: when that
    # rename failed, the version was missing and the old one stayed under its
    # temporary name; and when the export was killed in between, the next
    # export deleted it with the other leftovers. Both were lost.
    import shutil
    import socket
    import subprocess
    import sys

    out = tmp_path / "out"
    saved_model.export_saved_model(exported.model, str(out), warmup=False)
    base, final = out / "txl", out / "txl" / "1"
    (final / "marker").write_text("old")
    real = os.rename

    def failing(source, target):
        if os.path.basename(str(source)).startswith(".tmp-1-"):
            raise OSError(28, "No space left on device")
        return real(source, target)

    monkeypatch.setattr(os, "rename", failing)
    with pytest.raises(OSError, match="No space left"):
        saved_model.export_saved_model(exported.model, str(out), warmup=False, overwrite=True)
    monkeypatch.setattr(os, "rename", real)
    assert sorted(os.listdir(base)) == ["1"]
    assert (final / "marker").read_text() == "old"
    # Killed in between: the old version under a dead process's name, none at 1.
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    aside = base / f".tmp-1_old-{int(gone.stdout)}@{socket.gethostname()}-abc123"
    real(final, aside)
    assert saved_model.export_saved_model(exported.model, str(out), version=2,
                                          warmup=False) == str(base / "2")
    assert sorted(os.listdir(base)) == ["1", "2"]
    assert (final / "marker").read_text() == "old"
    # With a version in place, a dead export's old copy is a leftover.
    real(final, aside)
    shutil.copytree(aside, final)
    (final / "marker").write_text("new")
    saved_model.export_saved_model(exported.model, str(out), version=3, warmup=False)
    assert sorted(os.listdir(base)) == ["1", "2", "3"]
    assert (final / "marker").read_text() == "new"


def test_one_request_cannot_ask_for_unbounded_activations(exported, tmp_path):
    # The id-level signatures took any segment length: memory grows with its
    # square (T = 8,000 peaked at 4.8 GB on the tiny preset). A request whose
    # activations exceed the cap is refused before they are allocated.
    config = exported.model.txl_config
    small = sig.request_bytes(config, 1, 8)
    assert sig.request_bytes(config, 1, 64) > 20 * small  # quadratic in T
    out = tmp_path / "out"
    run_cli("--workdir", exported.tmp / "run", "--out", out, "--no-warmup",
            "--max-request-gib", small / (1 << 30))
    info = json.load(open(out / "txl" / "1" / serving.ASSETS_EXTRA / "export.json"))
    assert info["request_caps"]["max_request_bytes"] == int(small / (1 << 30) * (1 << 30))
    signatures = tf.saved_model.load(str(out / "txl" / "1")).signatures
    memory = signatures["initial_memory"](batch_size=tf.constant(1))["memory"]
    ok = signatures["serving_default"](token_ids=tf.zeros((1, 8), tf.int32), memory=memory)
    assert ok["log_probs"].shape == (1, 8, config.vocabulary_size)
    for ids in (tf.zeros((1, 9), tf.int32), tf.zeros((2, 8), tf.int32)):
        memory = signatures["initial_memory"](batch_size=tf.constant(ids.shape[0]))["memory"]
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="needs more than max_request_bytes=.*shorter segments"):
            signatures["score"](token_ids=ids, targets=ids, memory=memory)
    with pytest.raises(ValueError, match="--max-request-gib must be a positive number"):
        run_cli("--workdir", exported.tmp / "run", "--out", tmp_path / "o", "--max-request-gib", 0)


def test_version_folders_read_as_tf_serving_reads_them(exported, tmp_path):
    import shutil

    with pytest.raises(ValueError, match=r"`version` must be below 2\*\*63"):
        saved_model.export_saved_model(exported.model, str(tmp_path), version=2**63)
    with pytest.raises(ValueError, match=r"--version must be below 2\*\*63"):
        run_cli("--workdir", exported.tmp / "run", "--out", tmp_path, "--version", 2**64)
    base = tmp_path / "base"
    base.mkdir()
    shutil.copytree(exported.version_dir, base / "02")  # version 2, as TF Serving reads it
    (base / "١٠").mkdir()  # Arabic-Indic digits: not a version folder
    assert serving.resolve_version_dir(str(base)) == str(base / "02")
    shutil.copytree(exported.version_dir, base / "10")
    assert serving.resolve_version_dir(str(base)) == str(base / "10")


def test_names_that_would_replace_side_files_are_refused(exported, tmp_path):
    # `--name config` wrote the TFLite export record over the model's
    # config.json (and `--name tokenizer_info` over the app's tokenizer info).
    from keras_txl.export import tflite

    run = exported.tmp / "run"
    for name, fmt in (("config", "tflite"), ("tokenizer_info", "tflite"),
                      ("vocabulary", "all"), ("tokenizer", "all")):
        with pytest.raises(ValueError, match=f"--name '{name}' would collide with the files"):
            run_cli("--workdir", run, "--out", tmp_path / "o", "--format", fmt, "--name", name)
    assert not (tmp_path / "o").exists() or os.listdir(tmp_path / "o") == []
    with pytest.raises(ValueError, match="would write its export record to config.json"):
        tflite.export_tflite(exported.model, str(tmp_path / "t" / "config.tflite"),
                             batch_size=1, segment_length=4)


def test_format_all_refuses_what_tflite_would_refuse_before_writing_the_saved_model(
        exported, tmp_path):
    # The SavedModel was written, printed, and then the TFLite step failed
    # (another model's side files in --out; a model of memory_length 0).
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text('{"another": "model"}')
    with pytest.raises(ValueError, match="already holds config.json of another model"):
        run_cli("--workdir", exported.tmp / "run", "--out", out, "--format", "all")
    assert os.listdir(out) == ["config.json"]
    zero = tmp_path / "zero"
    keras_txl.save_pretrained(
        keras_txl.TransformerXLCausalLM(tiny_config(memory_length=0)), str(zero / "model"))
    with pytest.raises(ValueError, match="stateless TFLite model needs memory_length >= 1"):
        run_cli("--workdir", zero, "--out", tmp_path / "z", "--format", "all")
    assert not (tmp_path / "z" / "txl").exists()
    with pytest.raises(ValueError, match="GiB of memory, more than 4 GiB"):
        run_cli("--workdir", exported.tmp / "run", "--out", tmp_path / "b", "--format",
                "all", "--stateful", "--batch-size", 10**8)
    assert not (tmp_path / "b" / "txl").exists()


def test_a_file_or_link_at_the_version_is_refused_before_anything_is_written(tmp_path):
    # With overwrite, a file at the version moved aside under a ".tmp-1_old-"
    # name and stayed there (the old version was removed as a folder).
    model = keras_txl.TransformerXLCausalLM(tiny_config())
    out = tmp_path / "out"
    (out / "txl").mkdir(parents=True)
    (out / "txl" / "1").write_text("mine")
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", out / "txl" / "2")
    for version, kind in ((1, "a file"), (2, "a symbolic link")):
        for overwrite in (True, False):
            with pytest.raises(ValueError, match=(
                    f"txl/{version} is {kind}, not a SavedModel version folder: refusing "
                    "to write over it, also with overwrite. Move it away, or choose "
                    "another `version`.")):
                saved_model.export_saved_model(model, str(out), version=version,
                                               warmup=False, overwrite=overwrite)
        # The CLI, before loading a model (there is none at --workdir).
        with pytest.raises(ValueError, match=f"txl/{version} is {kind}, .* choose another "
                                             "--version"):
            run_cli("--workdir", tmp_path / "none", "--out", out, "--version", version,
                    "--overwrite")
    assert sorted(os.listdir(out / "txl")) == ["1", "2"]
    assert (out / "txl" / "1").read_text() == "mine"
    assert os.listdir(tmp_path / "elsewhere") == []
    # A file at the model's base path: "[Errno 17] File exists" once traced.
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "txl").write_text("mine")
    with pytest.raises(ValueError, match="txl is a file, not a SavedModel model base path "
                                         "folder.*choose another `name`"):
        saved_model.export_saved_model(model, str(tmp_path / "other"), warmup=False)
    with pytest.raises(ValueError, match="choose another --name or --out"):
        run_cli("--workdir", tmp_path / "none", "--out", tmp_path / "other",
                "--format", "all", "--overwrite")
    assert os.listdir(tmp_path / "other") == ["txl"]


@pytest.mark.parametrize("kind", ["lora", "int8"])
def test_lora_and_keras_quantized_models_export_their_own_outputs(tmp_path, kind):
    # The export builds copies (pure_model, with_settings, assign_weights_from):
    # a copy that dropped the LoRA adapters (`backbone.enable_lora`, which
    # adapts the feed-forward Dense layers) or the int8 kernels would serve
    # the un-adapted, float model. Both the pure and the stateful model's
    # signatures give the Keras model's log-probs.
    import warnings

    keras.utils.set_random_seed(0)
    model = keras_txl.TransformerXLCausalLM(tiny_config(vocabulary_size=11))
    ids = np.array([[1, 5, 7, 3]], np.int32)
    plain = np.asarray(model.call_with_memory(ids)["log_probs"])
    if kind == "lora":
        model.backbone.enable_lora(2)
        rng = np.random.default_rng(1)
        adapters = [v for v in model.backbone.weights if "lora_kernel_b" in v.path]
        assert len(adapters) == 4  # two feed-forward Dense layers in each of 2 blocks
        for v in adapters:  # as after training: adapters that matter
            v.assign(rng.normal(0, 0.5, v.shape).astype("float32"))
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.quantize("int8")
    expected = np.asarray(model.call_with_memory(ids)["log_probs"])
    assert np.abs(expected - plain).max() > 1e-3  # the adapters / int8 kernels count (1e-5 below)
    memory = np.zeros((1, 2, 4, 8), np.float32)
    for source in (model, model.with_settings(stateful=True, batch_size=1)):
        path = saved_model.export_saved_model(source, str(tmp_path / str(source.stateful)),
                                              warmup=False)
        out = tf.saved_model.load(path).signatures[sig.SERVING_DEFAULT](
            token_ids=tf.constant(ids), memory=tf.constant(memory))
        np.testing.assert_allclose(out[sig.LOG_PROBS].numpy(), expected, atol=1e-5)
