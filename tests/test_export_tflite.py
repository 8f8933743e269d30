"""TFLite export: builtin ops only, fresh-process parity, stateful, quantized.

The .tflite files are run in a new Python process that imports only
`ai_edge_litert`, numpy and `keras_txl.export.tflite` (no TensorFlow), chained over
three segments, and compared here with `call_with_memory`.
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
from testing import FIXTURES
from testing import REPO
from testing import signature_reference
from testing import tiny_config

import keras_txl
from keras_txl.export import cli
from keras_txl.export import signatures as sig
from keras_txl.export import tflite

HF = FIXTURES / "hf_transfo_xl_tiny"
B, T, SEGMENTS = 2, 4, 3

FRESH_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[2])
import numpy as np
from keras_txl.export.tflite import TFLiteRunner, run_tflite

for job in json.loads(sys.argv[1]):
    runner = TFLiteRunner(job["path"])
    ids = np.load(job["inputs"])
    targets = np.roll(ids, -1, axis=1)
    T = runner.segment_length
    segments = [slice(s * T, (s + 1) * T) for s in range(ids.shape[1] // T)]
    out = {}
    runner.reset()
    for s, cut in enumerate(segments):
        out[f"log_probs_{s}"] = runner.step(ids[:, cut])
        if not runner.stateful:
            out[f"memory_{s}"] = runner.memory
    runner.reset()
    for s, cut in enumerate(segments):
        out[f"nll_{s}"] = runner.score(ids[:, cut], targets[:, cut])
    runner.reset()
    for s, cut in enumerate(segments):
        out[f"next_{s}"] = runner.next_token(ids[:, cut])
    if runner.stateful:
        runner.reset()
        out["after_reset"] = runner.step(ids[:, segments[0]])
    out["run_tflite"] = run_tflite(job["path"], ids)
    np.savez(job["output"], **out)
print("REPORT " + json.dumps({"tensorflow_imported": "tensorflow" in sys.modules}))
"""


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def tensor_types(path):
    """Counts of tensor types in a .tflite file ("FLOAT32", "INT8", ...)."""
    from ai_edge_litert import schema_py_generated as schema

    names = {v: k for k, v in vars(schema.TensorType).items() if not k.startswith("_")}
    model = schema.Model.GetRootAsModel(open(path, "rb").read(), 0)
    counts = {}
    for g in range(model.SubgraphsLength()):
        graph = model.Subgraphs(g)
        for t in range(graph.TensorsLength()):
            name = names[graph.Tensors(t).Type()]
            counts[name] = counts.get(name, 0) + 1
    return counts


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    keras.utils.set_random_seed(0)
    tmp = tmp_path_factory.mktemp("tflite")
    # Weights of >= 1024 elements, so dynamic-range int8 really quantizes
    # (the converter leaves smaller tensors in float). The library's
    # initial scale: the quantization error bounds below are for it.
    model = keras_txl.TransformerXLCausalLM(tiny_config(
        vocabulary_size=64, hidden_dim=32, intermediate_dim=64, memory_length=6,
        init_std=0.02))
    # float32 through `txl export --workdir ... --format tflite`.
    keras_txl.save_pretrained(model, str(tmp / "run" / "model"))
    parser = cli.add_arguments(argparse.ArgumentParser())
    code = cli.run(parser.parse_args([
        "--workdir", str(tmp / "run"), "--format", "tflite", "--out",
        str(tmp / "out"), "--batch-size", str(B), "--segment-length", str(T),
    ]))
    assert code == 0
    paths = {"float32": str(tmp / "out" / "txl.tflite")}
    paths["stateful"] = tflite.export_tflite(
        model, str(tmp / "out" / "stateful.tflite"), batch_size=B,
        segment_length=T, stateful=True,
    )
    paths.update(tflite.export_tflite_variants(
        model, {q: str(tmp / "out" / f"{q}.tflite") for q in ("float16", "dynamic_int8")},
        batch_size=B, segment_length=T,
    ))
    paths["hf"] = tflite.export_tflite(
        keras_txl.load_hf_checkpoint(str(HF)), str(tmp / "hf" / "hf.tflite"),
        batch_size=2, segment_length=8,
    )
    ids = np.random.default_rng(0).integers(0, 64, (B, SEGMENTS * T)).astype(np.int32)
    np.save(tmp / "ids.npy", ids)
    jobs = []
    for name, path in paths.items():
        inputs = str(HF / "inputs.npy") if name == "hf" else str(tmp / "ids.npy")
        jobs.append(dict(path=path, inputs=inputs, output=str(tmp / f"{name}.npz")))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(
        [sys.executable, "-c", FRESH_SCRIPT, json.dumps(jobs), str(REPO)],
        cwd=tmp, env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(
        [x for x in proc.stdout.splitlines() if x.startswith("REPORT ")][-1][7:]
    )
    return types.SimpleNamespace(
        model=model, ids=ids, paths=paths, tmp=tmp, report=report,
        fresh={name: np.load(tmp / f"{name}.npz") for name in paths},
        reference=signature_reference(model, ids, T),
    )


def test_builtin_ops_only(artifacts):
    for name, path in artifacts.paths.items():
        operators = tflite.tflite_operators(open(path, "rb").read())
        assert not [op for op in operators if op.startswith("CUSTOM")], (name, operators)
        assert not [op for op in operators if "FLEX" in op.upper()], (name, operators)
        assert "FULLY_CONNECTED" in operators or "BATCH_MATMUL" in operators
    stateful = tflite.tflite_operators(open(artifacts.paths["stateful"], "rb").read())
    assert {"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE"} <= set(stateful)


def test_side_files(artifacts):
    out = os.path.dirname(artifacts.paths["float32"])
    for path in artifacts.paths.values():  # not tempfile's 0o600
        assert os.stat(path).st_mode & 0o777 == 0o666 & ~_umask()
    config = keras_txl.TransformerXLConfig.from_json(os.path.join(out, "config.json"))
    assert config == artifacts.model.txl_config
    info = json.load(open(os.path.join(out, "stateful.json")))
    assert info["batch_size"] == B and info["segment_length"] == T
    assert sorted(info["signatures"]) == sorted(sig.STATEFUL_TFLITE_SIGNATURES)
    assert keras_txl.TransformerXLConfig(**info["config"]) == artifacts.model.txl_config


def test_a_folder_of_another_model_is_refused_before_anything_is_written(artifacts):
    # The folder's config.json is the artifacts model's (several .tflite
    # files share it): another model's export there is refused, and no file
    # changes; the same model goes on exporting beside its own files.
    out = os.path.dirname(artifacts.paths["float32"])
    before = {name: open(os.path.join(out, name), "rb").read() for name in os.listdir(out)}
    other = keras_txl.TransformerXLCausalLM(tiny_config(
        vocabulary_size=64, hidden_dim=32, intermediate_dim=64, memory_length=7))
    with pytest.raises(ValueError, match=(
            f"The folder {re.escape(out)} already holds config.json of another model "
            "or tokenizer.*Export into another folder")):
        tflite.export_tflite(other, os.path.join(out, "other.tflite"), batch_size=B,
                             segment_length=T)
    after = {name: open(os.path.join(out, name), "rb").read() for name in os.listdir(out)}
    assert after == before


@pytest.mark.parametrize("name", ["float32", "stateful"])
def test_signatures_match_the_table(artifacts, name):
    runner = tflite.TFLiteRunner(artifacts.paths[name])
    stateful = name == "stateful"
    assert runner.stateful is stateful
    names = sig.STATEFUL_TFLITE_SIGNATURES if stateful else sig.TFLITE_SIGNATURES
    table = sig.signature_table(
        artifacts.model.txl_config, B, T, stateful=stateful, names=names
    )
    assert sorted(runner.signature_names) == sorted(table)
    for signature, entry in table.items():
        inputs = runner.input_details(signature)
        assert {k: (v[1].name, v[0]) for k, v in inputs.items()} == entry["inputs"]
        outputs = runner._runners[signature].get_output_details()
        got = {k: (np.dtype(v["dtype"]).name, tuple(int(d) for d in v["shape"]))
               for k, v in outputs.items()}
        assert got == entry["outputs"], signature
    assert runner.memory_shape == (B, 2, 6, 32)


def _compare(fresh, reference, atol, keys=("log_probs", "memory", "nll", "next")):
    errors = {}
    for s, ref in enumerate(reference):
        for key in keys:
            got = fresh[f"{key}_{s}"]
            np.testing.assert_allclose(got, ref[key], atol=atol, rtol=0,
                                       err_msg=f"{key} of segment {s}")
            errors[key] = max(errors.get(key, 0.0), float(np.abs(got - ref[key]).max()))
    return errors


def test_fresh_process_float32_matches_call_with_memory(artifacts):
    assert artifacts.report["tensorflow_imported"] is False
    fresh = artifacts.fresh["float32"]
    _compare(fresh, artifacts.reference, atol=1e-4)
    chained = np.concatenate([r["log_probs"] for r in artifacts.reference], axis=1)
    np.testing.assert_allclose(fresh["run_tflite"], chained, atol=1e-4)


def test_fresh_process_stateful_matches_and_resets(artifacts):
    fresh = artifacts.fresh["stateful"]
    _compare(fresh, artifacts.reference, atol=1e-4, keys=("log_probs", "nll", "next"))
    np.testing.assert_allclose(fresh["after_reset"], artifacts.reference[0]["log_probs"], atol=1e-4)
    # The memory really is carried: segment 1 alone differs.
    alone = artifacts.model.call_with_memory(artifacts.ids[:, T:2 * T])["log_probs"]
    assert np.abs(alone.numpy() - fresh["log_probs_1"]).max() > 1e-4


def test_stateful_reset_in_process(artifacts):
    runner = tflite.TFLiteRunner(artifacts.paths["stateful"])
    first = runner.step(artifacts.ids[:, :T])  # fresh model: zero memory
    runner.step(artifacts.ids[:, T:2 * T])
    carried = runner.step(artifacts.ids[:, :T])
    assert np.abs(carried - first).max() > 1e-4
    zeros = runner.run("reset")["memory"]
    np.testing.assert_array_equal(zeros, np.zeros((B, 2, 6, 32)))
    np.testing.assert_allclose(runner.step(artifacts.ids[:, :T]), first, atol=1e-6)


def test_quantized_variants_stay_close(artifacts, capsys):
    reference = artifacts.reference
    sizes = {n: os.path.getsize(artifacts.paths[n]) for n in ("float32", "float16", "dynamic_int8")}
    errors = {}
    for name, bound in (("float16", 0.02), ("dynamic_int8", 0.2)):
        errors[name] = _compare(artifacts.fresh[name], reference, atol=bound)
    with capsys.disabled():
        print(f"\n[tflite quantization, random small model] sizes {sizes} "
              f"max |log-prob error| float16 {errors['float16']['log_probs']:.2e} "
              f"dynamic_int8 {errors['dynamic_int8']['log_probs']:.2e}")
    assert tensor_types(artifacts.paths["float16"]).get("FLOAT16", 0) > 0
    assert tensor_types(artifacts.paths["dynamic_int8"]).get("INT8", 0) > 0
    # Small weights dominate less in a real model; here only < fp32.
    assert sizes["dynamic_int8"] < sizes["float16"] < sizes["float32"]
    assert errors["dynamic_int8"]["log_probs"] > 0  # it did quantize


def test_hf_fixture_parity_through_tflite(artifacts):
    fresh = artifacts.fresh["hf"]
    for s in range(3):
        expected = np.load(HF / f"expected_logprobs_seg{s}.npy")
        np.testing.assert_allclose(fresh[f"log_probs_{s}"], expected, atol=1e-4,
                                   rtol=1e-5, err_msg=f"segment {s}")


def _good(artifacts):
    return dict(token_ids=artifacts.ids[:, :T], memory=np.zeros((B, 2, 6, 32), np.float32))


MEMORY_SHAPE = (B, 2, 6, 32)
BAD_RUNS = {
    "ids_float": ("serving_default",
                  dict(token_ids=np.zeros((B, T), np.float32)), "integer array"),
    "ids_wrong_T": ("serving_default",
                    dict(token_ids=np.zeros((B, T + 1), np.int32)),
                    "must have shape (2, 4)"),
    "ids_wrong_B": ("next_token", dict(token_ids=np.zeros((1, T), np.int32)),
                    "must have shape (2, 4)"),
    "ids_too_large": ("serving_default", dict(token_ids=np.full((B, T), 64)),
                      "vocabulary_size=64"),
    "ids_negative": ("serving_default", dict(token_ids=np.full((B, T), -1)),
                     "vocabulary_size=64"),
    "memory_wrong_M": ("serving_default",
                       dict(memory=np.zeros((B, 2, 5, 32), np.float32)),
                       "`memory` must have shape (2, 2, 6, 32)"),
    "memory_int": ("serving_default",
                   dict(memory=np.zeros(MEMORY_SHAPE, np.int32)), "float array"),
    "memory_nan": ("serving_default",
                   dict(memory=np.full(MEMORY_SHAPE, np.nan, np.float32)),
                   "NaN or Inf"),
    # finite as float64, Inf once cast to the model's float32
    "memory_overflows_float32": ("serving_default",
                                 dict(memory=np.full(MEMORY_SHAPE, 1e39)),
                                 "NaN or Inf values (as float32)"),
    "targets_out_of_range": ("score", dict(targets=np.full((B, T), 99)),
                             "`targets` must be in"),
    "missing_input": ("serving_default", dict(memory=None), "missing ['memory']"),
    "unknown_signature": ("initial_memory", {}, "Unknown signature 'initial_memory'"),
}


@pytest.mark.parametrize("case", sorted(BAD_RUNS))
def test_runner_rejects_bad_inputs(artifacts, case):
    runner = tflite.TFLiteRunner(artifacts.paths["float32"])
    signature, changes, pattern = BAD_RUNS[case]
    inputs = _good(artifacts)
    if signature == "score":
        inputs["targets"] = artifacts.ids[:, 1:T + 1]
    inputs.update(changes)
    inputs = {k: v for k, v in inputs.items() if v is not None}
    with pytest.raises(ValueError, match=re.escape(pattern)):
        runner.run(signature, **inputs)
    out = runner.run("serving_default", **_good(artifacts))  # still usable
    np.testing.assert_allclose(out["log_probs"], artifacts.reference[0]["log_probs"], atol=1e-4)


def test_stateful_runner_rejects_memory_input(artifacts):
    runner = tflite.TFLiteRunner(artifacts.paths["stateful"])
    with pytest.raises(ValueError, match=r"unexpected \['memory'\]"):
        runner.run("serving_default", **_good(artifacts))


def test_raw_litert_signature_checks_dtypes(artifacts):
    # Without TFLiteRunner, LiteRT itself rejects a wrong dtype.
    from ai_edge_litert.interpreter import Interpreter

    raw = Interpreter(model_path=artifacts.paths["float32"]).get_signature_runner("serving_default")
    with pytest.raises(ValueError, match="expected type INT32"):
        raw(token_ids=np.zeros((B, T), np.float32), memory=np.zeros((B, 2, 6, 32), np.float32))


def test_export_arguments_are_checked(artifacts, tmp_path):
    model = artifacts.model
    path = str(tmp_path / "m.tflite")
    with pytest.raises(ValueError, match="`quantize` must be one of"):
        tflite.export_tflite(model, path, batch_size=1, segment_length=4, quantize="int4")
    with pytest.raises(ValueError, match="`batch_size` must be a positive integer"):
        tflite.export_tflite(model, path, batch_size=None, segment_length=4)
    with pytest.raises(ValueError, match="`segment_length` must be a positive integer"):
        tflite.export_tflite(model, path, batch_size=1, segment_length=0)
    with pytest.raises(ValueError, match="exactly one of"):
        tflite.TFLiteRunner()
    with pytest.raises(ValueError, match="n \\* segment_length"):
        tflite.run_tflite(artifacts.paths["float32"], artifacts.ids[:, :T + 1])
    # No segment at all was "need at least one array to concatenate".
    with pytest.raises(ValueError, match=r"n >= 1 segments .* received shape \(2, 0\)"):
        tflite.run_tflite(artifacts.paths["float32"], artifacts.ids[:, :0])
    assert os.listdir(tmp_path) == []


def test_a_mixed_precision_model_exports_its_float32_weights(artifacts, tmp_path):
    # TFLite's builtins compute in float32: a mixed_bfloat16 model (float32
    # variables) exports as the float32 model with the same weights, not as
    # a conversion error hundreds of lines long.
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        mixed = keras_txl.TransformerXLCausalLM(artifacts.model.txl_config)
    finally:
        keras.config.set_dtype_policy("float32")
    mixed.assign_weights_from(artifacts.model)
    path = tflite.export_tflite(mixed, str(tmp_path / "m.tflite"), batch_size=B,
                                segment_length=T)
    out = tflite.TFLiteRunner(path).run("serving_default", **_good(artifacts))
    np.testing.assert_allclose(out["log_probs"], artifacts.reference[0]["log_probs"], atol=1e-4)
    assert mixed.dtype_policy.name == "mixed_bfloat16"  # the model itself is unchanged


def test_token_by_token_tflite_equals_generate_and_ships_the_vocabulary(tmp_path):
    """What an app does: the T = 1 TFLite model in a host loop, memory fed
    back, equals `model.generate` (greedy) on prompts of 5, 17 and 40
    tokens; the tokenizer's vocabulary lies beside the .tflite file."""
    from testing import byte_causal_lm

    from keras_txl.export.generation import tflite_generate

    keras.utils.set_random_seed(0)
    model = byte_causal_lm()
    model.compile(sampler="greedy")
    path = tflite.export_tflite(model, str(tmp_path / "txl.tflite"), batch_size=1,
                         segment_length=1)
    with open(tmp_path / "vocabulary.txt", encoding="utf-8") as f:
        vocabulary = f.read().splitlines()
    with open(tmp_path / "tokenizer_info.json") as f:
        info = json.load(f)
    # The byte kind: line i is the byte value i; a newline is byte 10.
    assert vocabulary == [str(i) for i in range(256)]
    assert info["kind"] == "byte" and info["vocabulary_size"] == 256
    assert info["eos_id"] is None and info["newline"] == "byte"
    runner = tflite.TFLiteRunner(path)
    new_tokens, worst = 10, 0.0
    for text in ["Hello", "The quick brown f",
                 "Transformer-XL keeps a memory of the pas"]:
        ids = [vocabulary.index(str(b)) for b in text.encode()]  # the app's tokenizer
        assert ids == list(text.encode())
        expected, memory = model.generate(
            [ids], max_length=len(ids) + new_tokens, strip_prompt=True,
            return_memory=True)
        got, tflite_memory = tflite_generate(runner, ids, new_tokens)
        np.testing.assert_array_equal(got, expected[0])
        worst = max(worst, float(np.abs(tflite_memory - np.asarray(memory)).max()))
    assert worst < 1e-4
    print(f"max |memory(TFLite) - memory(generate)| = {worst:.2e}")
    with pytest.raises(ValueError, match="non-empty 1-D"):
        tflite_generate(runner, [[1, 2]], 1)


def test_shapes_too_large_for_a_device_are_refused_before_allocating(artifacts, tmp_path):
    # --batch-size 10**8 --stateful allocated the memory variable while tracing
    # (TensorFlow's OOM traceback).
    with pytest.raises(ValueError, match=r"batch_size=100000000 .* GiB of memory, more "
                                         r"than 4 GiB"):
        tflite.export_tflite(artifacts.model, str(tmp_path / "m.tflite"),
                             batch_size=10**8, segment_length=4, stateful=True)
    with pytest.raises(ValueError, match=r"GiB of activations of one call"):
        tflite.export_tflite(artifacts.model, str(tmp_path / "m.tflite"),
                             batch_size=1, segment_length=200_000)
    assert os.listdir(tmp_path) == []


def test_one_text_memory_is_checked_not_cut_to_its_first_row(artifacts):
    # tflite_generate(memory=(2, L, M, D)) used row 0 and dropped row 1; so did
    # the TFLite and SavedModel backends' initial_state.
    from keras_txl.export.generation import TFLiteBackend

    backend = TFLiteBackend.from_file(artifacts.paths["float32"])
    shape = tuple(backend.memory_shape)[1:]
    one = np.random.default_rng(0).normal(size=(1, *shape)).astype(np.float32)
    np.testing.assert_array_equal(backend.initial_state(one), np.repeat(one, B, 0))
    with pytest.raises(ValueError, match=r"`memory` must have shape \(1, num_layers"):
        backend.initial_state(np.zeros((2, *shape), np.float32))
    with pytest.raises(ValueError, match="`memory` contains NaN"):
        backend.initial_state(np.full((1, *shape), np.nan, np.float32))


@pytest.mark.parametrize("kind", ["char", "word"])
def test_a_model_whose_tokenizer_has_lookup_tables_exports_to_tflite(tmp_path, kind):
    # The tokenizer went into the converted graph with the model: its
    # HashTableV2 is no builtin op, so char and word models failed in the
    # converter (a raw ConverterError); byte models passed.
    from keras_txl.causal_lm_preprocessor import TransformerXLCausalLMPreprocessor
    from keras_txl.tokenizers import CharTokenizer
    from keras_txl.tokenizers import WordTokenizer

    tokenizer = (CharTokenizer(["<unk>", "a", "b", " ", "\n"]) if kind == "char"
                 else WordTokenizer(["<eos>", "<unk>", "a", "b", "c"]))
    model = keras_txl.TransformerXLCausalLM(
        tiny_config(vocabulary_size=5, memory_length=4),
        preprocessor=TransformerXLCausalLMPreprocessor(tokenizer, sequence_length=4))
    path = tflite.export_tflite(model, str(tmp_path / "m.tflite"), batch_size=1,
                                segment_length=4)
    assert (tmp_path / "vocabulary.txt").read_text(encoding="utf-8").splitlines()[:2] == (
        ["<unk>", "a"] if kind == "char" else ["<eos>", "<unk>"])
    ids = np.array([[1, 2, 3, 4]], np.int32)
    runner = tflite.TFLiteRunner(path)
    out = runner.run("serving_default", token_ids=ids,
                     memory=np.zeros(runner.memory_shape, np.float32))
    np.testing.assert_allclose(out["log_probs"], model.call_with_memory(ids)["log_probs"],
                               atol=1e-4)
    assert model.preprocessor is not None  # the user's model is left as it was


def test_a_folder_where_the_tflite_file_goes_is_refused_before_anything_is_written(tmp_path):
    # An "[Errno 21] Is a directory" after the conversion; with `txl export
    # --format all --overwrite`, after the SavedModel and its side files were
    # written: a half-done export.
    model = keras_txl.TransformerXLCausalLM(tiny_config(memory_length=2))
    out = tmp_path / "out"
    (out / "txl.tflite").mkdir(parents=True)
    (out / "txl.tflite" / "x").write_text("mine")
    with pytest.raises(ValueError, match=re.escape(
            f"{out / 'txl.tflite'} is a folder, where the TFLite file of "
            f"{out / 'txl.tflite'} goes: refusing to write over it, also with overwrite. "
            "Move it away, or name the file otherwise (`txl export --name` or --out).")):
        tflite.export_tflite(model, str(out / "txl.tflite"), batch_size=1, segment_length=T)
    (tmp_path / "other" / "m.json").mkdir(parents=True)
    with pytest.raises(ValueError, match=re.escape(
            f"{tmp_path / 'other' / 'm.json'} is a folder, where its export record of "
            f"{tmp_path / 'other' / 'm.tflite'} goes")):
        tflite.export_tflite(model, str(tmp_path / "other" / "m.tflite"), batch_size=1,
                             segment_length=T)
    parser = cli.add_arguments(argparse.ArgumentParser())
    for format in ("tflite", "all"):
        with pytest.raises(ValueError, match="txl.tflite is a folder, where the TFLite file"):
            # Before a model is loaded: there is none at --workdir.
            cli.run(parser.parse_args(["--workdir", str(tmp_path / "none"), "--out", str(out),
                                       "--format", format, "--overwrite"]))
    assert os.listdir(out) == ["txl.tflite"]
    assert os.listdir(out / "txl.tflite") == ["x"]
    assert os.listdir(tmp_path / "other") == ["m.json"]


def test_tflite_generate_checks_stop_token_ids_and_on_token_before_running():
    # An id was a TypeError ("'int' object is not iterable"), "auto" an
    # int('a') ValueError, an id outside the vocabulary never stopped
    # anything in silence, and a bad on_token failed after the prompt ran.
    from keras_txl.export.generation import tflite_generate

    V = 11
    calls = []

    def run(name, token_ids, memory):
        """Greedy continues with token + 1 (mod V)."""
        calls.append(int(token_ids[0, 0]))
        log_probs = np.full((1, V), -10.0, np.float32)
        log_probs[0, (int(token_ids[0, 0]) + 1) % V] = 0.0
        return {sig.LOG_PROBS: log_probs, sig.MEMORY: memory}

    runner = types.SimpleNamespace(stateful=False, segment_length=1, batch_size=1,
                                   vocabulary_size=V, memory_shape=(1, 2, 3, 8), run=run)
    for stop in (5, np.int64(5), (9, 5), [5], np.array([5])):
        ids, _ = tflite_generate(runner, [1, 2], 8, temperature=0, stop_token_ids=stop)
        assert ids.tolist() == [3, 4, 5]
    assert tflite_generate(runner, [1], 3, stop_token_ids=())[0].tolist() == [2, 3, 4]
    calls.clear()
    for stop in (11, (-1,), (3, 99), "auto", 2.0, True):
        with pytest.raises(ValueError, match=re.escape(
                "`stop_token_ids` must be None, an id or a tuple of ids in "
                f"[0, vocabulary_size=11), received stop_token_ids={stop!r}.")):
            tflite_generate(runner, [1, 2], 4, stop_token_ids=stop)
    with pytest.raises(ValueError, match="`on_token` must be None or a callable taking "
                                         "each new id, received int"):
        tflite_generate(runner, [1, 2], 4, on_token=3)
    assert calls == []


def _counting_runner(vocabulary_size):
    """A stand-in TFLite runner of batch 1 and segment 1 (uniform log-probs),
    and the list of the ids it was run on."""
    calls = []

    def run(name, token_ids, memory):
        calls.append(int(token_ids[0, 0]))
        return {sig.LOG_PROBS: np.zeros((1, vocabulary_size), np.float32), sig.MEMORY: memory}

    runner = types.SimpleNamespace(stateful=False, segment_length=1, batch_size=1,
                                   vocabulary_size=vocabulary_size, memory_shape=(1, 2, 3, 8),
                                   run=run)
    return runner, calls


def test_tflite_generate_checks_the_prompt_ids_range_before_running():
    # An id past int32 was numpy's OverflowError ("Python integer 4294967301
    # out of bounds for int32") after the ids before it had run, and an id
    # outside the vocabulary was refused as `token_ids` by the runner at its
    # turn, not as the `prompt_ids` the caller passed.
    from keras_txl.export.generation import tflite_generate

    V = 11
    runner, calls = _counting_runner(V)
    for prompt, low, high in (([1, 2**32 + 5], 1, 2**32 + 5), ([3, -1], -1, 3),
                              (np.array([4, 11], np.int64), 4, 11),
                              (np.array([2**63], np.uint64), 2**63, 2**63)):
        with pytest.raises(ValueError, match=re.escape(
                f"`prompt_ids` must hold ids in [0, vocabulary_size={V}), received "
                f"values in [{low}, {high}].")):
            tflite_generate(runner, prompt, 2)
    assert calls == []
    assert tflite_generate(runner, np.array([10], np.uint8), 1, temperature=0)[0].tolist() == [0]


def test_tflite_generate_caps_max_new_tokens_and_names_an_empty_prompt():
    # max_new_tokens=2**40 ran one TFLite call per token for as long as asked
    # (in effect forever, the new ids in a growing Python list), where
    # model.generate, generate_ids and txl generate refuse more than 2**20
    # tokens per call; and tflite_generate([]) said "dtype float64".
    from keras_txl.export.generation import tflite_generate

    V = 11
    runner, calls = _counting_runner(V)

    def stop_after_one(token):
        raise RuntimeError("the loop ran")
    for new, prompt in ((2**40, [1, 2]), (2**20 - 1, [1, 2]), (np.int64(2**20), [1])):
        with pytest.raises(ValueError, match=re.escape(
                f"`max_new_tokens` must be at most {2**20 - len(prompt)}: the prompt "
                f"({len(prompt)} tokens) and the new tokens come to more than the 1048576 "
                f"(MAX_GENERATE_LENGTH, 2**20) tokens of one call; received "
                f"max_new_tokens={int(new)}. Generate a longer text in pieces")) as e:
            tflite_generate(runner, prompt, new, on_token=stop_after_one)
        assert "tflite_generate returns its memory for its memory=" in str(e.value)
    with pytest.raises(ValueError, match=re.escape(
            "`prompt_ids` is empty: it must hold at least one token id.")):
        tflite_generate(runner, [], 1)
    assert calls == []
    # The largest allowed count is taken (and runs: one id, then on_token stops it).
    with pytest.raises(RuntimeError, match="the loop ran"):
        tflite_generate(runner, [1], 2**20 - 1, on_token=stop_after_one)


def test_a_model_quantized_in_keras_is_refused_by_name_before_converting(tmp_path):
    # model.quantize("int8") then export_tflite: the int8 kernels reached the
    # converter, a ConverterError of hundreds of MLIR lines ("'tfl.fully_connected'
    # op operand #0 must be tensor of 32-bit float ... but got 'tensor<16x64xi8>'");
    # with a preprocessor, "assign_weights_from() needs a model with the same
    # architecture". (Its SavedModel gives its outputs: test_export_saved_model.)
    import warnings

    from testing import byte_causal_lm

    for preprocessor in (False, True):
        model = byte_causal_lm(preprocessor=preprocessor)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.backbone.quantize("int8")
        out = tmp_path / f"out{preprocessor}"
        message = (r"TFLite export of a model quantized in Keras \(model.quantize\('int8'\): "
                   r"\d+ layers in int8 mode, .*\) is not supported: .*"
                   r'`quantize="dynamic_int8"`.*`export_saved_model`')
        with pytest.raises(ValueError, match=message):
            tflite.export_tflite(model, str(out / "m.tflite"), batch_size=1, segment_length=4)
        with pytest.raises(ValueError, match=message):
            tflite.check_tflite_export(model, {"none": str(out / "m.tflite")}, batch_size=1,
                                       segment_length=4)
        assert not out.exists()


def test_a_lora_model_exports_its_adapted_outputs(tmp_path):
    # The TFLite export converts an id-level float32 copy of the model
    # (`assign_weights_from`): the LoRA adapters of `backbone.enable_lora`
    # travel with it, and the .tflite file gives the adapted log-probs.
    from testing import byte_causal_lm

    keras.utils.set_random_seed(0)
    model = byte_causal_lm(preprocessor=True)
    ids = np.random.default_rng(0).integers(0, 256, (1, 4)).astype(np.int32)
    plain = np.asarray(model.call_with_memory(ids)["log_probs"])
    model.backbone.enable_lora(2)
    rng = np.random.default_rng(1)
    for v in model.backbone.weights:
        if "lora_kernel_b" in v.path:
            v.assign(rng.normal(0, 0.5, v.shape).astype("float32"))
    expected = np.asarray(model.call_with_memory(ids)["log_probs"])
    assert np.abs(expected - plain).max() > 1.0
    runner = tflite.TFLiteRunner(tflite.export_tflite(
        model, str(tmp_path / "m.tflite"), batch_size=1, segment_length=4))
    out = runner.run("serving_default", token_ids=ids,
                     memory=np.zeros(runner.memory_shape, np.float32))
    np.testing.assert_allclose(out["log_probs"], expected, atol=1e-4)
