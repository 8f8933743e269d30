"""Untrusted model folders (issue 18, item 4): hostile sizes, FIFOs, devices,
file names that leave the folder, deep JSON and oversized tensors are refused
within a second and within 100 MB of extra memory, before anything is built."""

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
from testing import FIXTURES
from testing import REPO

import keras_txl
from keras_txl.io import load_pretrained
from keras_txl.io import save_pretrained
from keras_txl.limits import Limits
from keras_txl.limits import resolve_limits
from keras_txl.safe_files import json_depth
from keras_txl.safe_files import resolve_inside
from keras_txl.tokenizers import build_tokenizer
from keras_txl.tokenizers import load_tokenizer
from keras_txl.weights_file import read_safetensors
from keras_txl.weights_file import read_safetensors_header

TINY = dict(vocabulary_size=11, num_layers=2, hidden_dim=8, num_heads=2,
            intermediate_dim=16, memory_length=4, segment_length=4)
GIB = 1 << 30


def _tiny_folder(directory):
    model = keras_txl.TransformerXLCausalLM(keras_txl.TransformerXLConfig(**TINY))
    tokenizer = build_tokenizer("word", ["a b c d e f g h i"])  # 11 ids, as the model
    save_pretrained(model, str(directory), tokenizer=tokenizer)
    return model


def _header(path):
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(size))


def _write_safetensors(path, header, data_size, sparse=True):
    """A safetensors file with `header` and `data_size` data bytes (a hole:
    no disk is used for a sparse 3 GB file)."""
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + data_size)


def _with_giant_tensor(path, name="unexpected.giant", shape=(3 * GIB // 4,)):
    """Rewrites `path` (a real safetensors file) with one more 3 GB tensor."""
    header = _header(path)
    end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        f.seek(8 + size)
        data = f.read()
    header[name] = {"dtype": "F32", "shape": list(shape),
                    "data_offsets": [end, end + 4 * int(np.prod(shape))]}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data[:end])
        f.truncate(8 + len(raw) + end + 4 * int(np.prod(shape)))


def _edit_config(directory, **changes):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def _hostile_folders(root, template):
    """{case: (loader, folder, expected message part)}."""
    cases = {}

    def folder(name):
        target = root / name
        shutil.copytree(template, target)
        return target

    d = folder("huge_hidden_dim")
    _edit_config(d, hidden_dim=10**9, num_heads=2)
    cases["hidden_dim=10**9"] = ("pretrained", d, "hidden_dim=1000000000 exceeds")
    d = folder("many_layers")
    _edit_config(d, num_layers=100000)
    cases["num_layers=100000"] = ("pretrained", d, "num_layers=100000 exceeds")
    d = folder("many_parameters")
    _edit_config(d, vocabulary_size=1 << 24, hidden_dim=65536, num_heads=64,
                 intermediate_dim=65536)
    cases["4e12 parameters"] = ("pretrained", d, "max_parameters")
    d = folder("giant_tensor")
    _with_giant_tensor(d / "model.safetensors")
    cases["3 GB unexpected tensor"] = ("pretrained", d, "values")
    d = folder("giant_expected_name")
    header = _header(d / "model.safetensors")
    name = next(k for k in header if k != "__metadata__")
    del header[name]
    os.remove(d / "model.safetensors")
    _with_giant_tensor_from(d / "model.safetensors", header, template, name)
    cases["3 GB tensor under an expected name"] = ("pretrained", d, "values")
    d = folder("offsets_past_end")
    header = _header(d / "model.safetensors")
    name = next(k for k in header if k != "__metadata__")
    header[name] = {"dtype": "F32", "shape": [GIB], "data_offsets": [0, 4 * GIB]}
    _write_safetensors(d / "model.safetensors", header, 64)
    cases["offsets past the end"] = ("pretrained", d, "outside the")
    d = folder("huge_header_claim")
    (d / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 60) + b"{}")
    cases["header length 2**60"] = ("pretrained", d, "header claims")
    d = folder("deep_header")
    raw = b"[" * 100000 + b"]" * 100000
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    cases["10^5-deep safetensors header"] = ("pretrained", d, "nested")
    d = folder("fifo_weights")
    os.remove(d / "model.safetensors")
    os.mkfifo(d / "model.safetensors")
    cases["FIFO model.safetensors"] = ("pretrained", d, "FIFO")
    d = folder("fifo_config")
    os.remove(d / "config.json")
    os.mkfifo(d / "config.json")
    cases["FIFO config.json"] = ("pretrained", d, "FIFO")
    d = folder("device_weights")
    os.remove(d / "model.safetensors")
    os.symlink("/dev/zero", d / "model.safetensors")
    cases["symlink to /dev/zero"] = ("pretrained", d, "character device")
    d = folder("deep_config")
    (d / "config.json").write_text("[" * 100000 + "]" * 100000)
    cases["10^5-deep config.json"] = ("pretrained", d, "nested")
    d = folder("big_config")
    (d / "config.json").write_bytes(b" " * (17 << 20) + b"{}")
    cases["17 MB config.json"] = ("pretrained", d, "max_json_bytes")
    # The old keras-txl layout (read only) names its vocabulary file.
    old_layout = {"format_version": 1, "kind": "word", "add_eos": True,
                  "lower_case": False, "unk_token": "<unk>",
                  "eos_token": "<eos>"}
    d = folder("escaping_vocabulary")
    tokenizer_json = d / "tokenizer" / "tokenizer.json"
    config = {**old_layout, "vocabulary_file": "../../../../../../../etc/passwd"}
    tokenizer_json.write_text(json.dumps(config))
    cases["vocabulary_file ../../etc/passwd"] = ("tokenizer", d / "tokenizer",
                                                 "leaves the folder")
    d = folder("absolute_vocabulary")
    tokenizer_json = d / "tokenizer" / "tokenizer.json"
    config["vocabulary_file"] = "/etc/passwd"
    tokenizer_json.write_text(json.dumps(config))
    cases["vocabulary_file /etc/passwd"] = ("tokenizer", d / "tokenizer",
                                            "leaves the folder")
    d = folder("fifo_vocabulary")
    vocabulary = d / "tokenizer" / "assets" / "tokenizer" / "vocabulary.txt"
    os.remove(vocabulary)
    os.mkfifo(vocabulary)
    cases["FIFO vocabulary file"] = ("tokenizer", d / "tokenizer", "FIFO")
    d = folder("foreign_tokenizer_class")
    tokenizer_json = d / "tokenizer" / "tokenizer.json"
    config = json.loads(tokenizer_json.read_text())
    config.update(module="os", class_name="system", registered_name=None)
    tokenizer_json.write_text(json.dumps(config))
    cases["tokenizer.json naming os.system"] = (
        "tokenizer", d / "tokenizer", "a keras-txl tokenizer is one of")
    d = folder("deep_tokenizer_json")
    (d / "tokenizer" / "tokenizer.json").write_text("{\"a\":" * 50000 + "1" + "}" * 50000)
    cases["deep tokenizer.json"] = ("tokenizer", d / "tokenizer", "nested")

    hf_template = FIXTURES / sorted(
        p.name for p in FIXTURES.iterdir() if (p / "model.safetensors").exists()
    )[0]
    d = root / "hf_many_layers"
    shutil.copytree(hf_template, d)
    hf = json.loads((d / "config.json").read_text())
    hf["n_layer"] = 100000
    (d / "config.json").write_text(json.dumps(hf))
    cases["HF n_layer=100000"] = ("hf", d, "num_layers=100000 exceeds")
    d = root / "hf_giant_tensor"
    shutil.copytree(hf_template, d)
    _with_giant_tensor(d / "model.safetensors")
    cases["HF 3 GB unexpected tensor"] = ("hf", d, "values")
    d = root / "hf_list_layers"
    shutil.copytree(hf_template, d)
    hf = json.loads((d / "config.json").read_text())
    hf["n_layer"] = [1, 2]
    (d / "config.json").write_text(json.dumps(hf))
    cases["HF n_layer a list"] = ("hf", d, "wrong type")
    return cases


def _hostile_presets(root, template):
    """{case: ("pretrained", preset folder, expected message part)}: files
    of a keras-hub preset that are no regular files (with and without its
    manifest.json), named before anything opens them."""
    cases = {}
    kinds = {"/dev/zero": "character device", "FIFO": "FIFO", "folder": "directory"}
    for name in ("model.weights.h5", "task.weights.h5", "task.json"):
        for kind, message in kinds.items():
            for manifest in (True, False):
                if name == "task.json" and kind == "folder":
                    continue
                target = root / f"preset_{name}_{kind.strip('/')}_{manifest}".replace("/", "_")
                shutil.copytree(template, target)
                path = target / name
                os.remove(path)
                if not manifest:
                    os.remove(target / "manifest.json")
                if kind == "/dev/zero":
                    os.symlink("/dev/zero", path)
                elif kind == "FIFO":
                    os.mkfifo(path)
                else:
                    path.mkdir()
                what = "with its manifest" if manifest else "no manifest"
                cases[f"preset {name} {kind} ({what})"] = ("pretrained", target, message)
    return cases


def _with_giant_tensor_from(path, header, template, name):
    """The template's header with tensor `name` moved to the end as 3 GB."""
    source = template / "model.safetensors"
    with open(source, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        f.seek(8 + size)
        data = f.read()
    end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    header = dict(header)
    header[name] = {"dtype": "F32", "shape": [3 * GIB // 4],
                    "data_offsets": [end, end + 3 * GIB]}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data[:end])
        f.truncate(8 + len(raw) + end + 3 * GIB)


CHILD = r"""
import json, os, resource, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
from keras_txl import causal_lm  # TensorFlow and Keras: imported before measuring
from keras_txl.hf_checkpoint import load_hf_checkpoint
from keras_txl.io import load_pretrained
from keras_txl.tokenizers import load_tokenizer
import keras_txl
keras_txl.register_text_ops()  # tensorflow-text (deferred until first use) before measuring

LOADERS = {"pretrained": load_pretrained, "hf": load_hf_checkpoint,
           "tokenizer": load_tokenizer}

def rss_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])

for name, (loader, folder) in json.load(sys.stdin).items():
    try:  # reset the peak (VmHWM) to the current RSS (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = rss_kb("VmRSS")
    except OSError:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    try:
        LOADERS[loader](folder)
        error = None
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    seconds = time.monotonic() - start
    peak = rss_kb("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"case": name, "error": error, "seconds": seconds,
                      "extra_mb": max(0, peak - before) / 1024}), flush=True)
"""


def test_hostile_folders_fail_fast_with_little_memory(tmp_path):
    template = tmp_path / "template"
    model = _tiny_folder(template)
    cases = _hostile_folders(tmp_path, template)
    from keras_txl.io import save_preset

    save_preset(model, str(tmp_path / "preset_template"), tokenizer=str(template / "tokenizer"))
    cases.update(_hostile_presets(tmp_path, tmp_path / "preset_template"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop(keras_txl.limits.ENVIRONMENT_VARIABLE, None)
    request = {name: (loader, str(folder)) for name, (loader, folder, _) in cases.items()}
    # A blocked read (the FIFOs) would hang the child: the timeout fails the test.
    result = subprocess.run(
        [sys.executable, "-c", CHILD], input=json.dumps(request), env=env,
        capture_output=True, text=True, timeout=240,
    )
    rows = {}
    for line in result.stdout.splitlines():
        row = json.loads(line)
        rows[row["case"]] = row
    assert set(rows) == set(cases), result.stderr[-3000:]
    for name, (_, _, message) in cases.items():
        row = rows[name]
        print(f"{name:40s} {row['seconds'] * 1000:7.1f} ms "
              f"{row['extra_mb']:6.1f} MB  {row['error']}")
        assert row["error"] is not None and row["error"].startswith("ValueError"), row
        assert message in row["error"], row
        assert row["seconds"] < 1.0, row
        assert row["extra_mb"] < 100, row


def test_a_good_folder_still_loads_also_through_symlinks(tmp_path):
    model = _tiny_folder(tmp_path / "blobs")
    # A hub cache: the snapshot's files are symlinks into a blob folder.
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer"):
        os.symlink(tmp_path / "blobs" / name, snapshot / name)
    loaded = load_pretrained(str(snapshot))
    for a, b in zip(model.model_weights(), loaded.model_weights()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    tokenizer = load_tokenizer(snapshot / "tokenizer")
    assert tokenizer.decode(tokenizer.encode("a b c")) == "a b c"


def test_the_header_is_compared_with_the_model_before_reading(tmp_path):
    _tiny_folder(tmp_path)
    path = str(tmp_path / "model.safetensors")
    header = read_safetensors_header(path)
    assert all(dtype == "F32" for _, dtype in header.values())
    expected = {name: shape for name, (shape, _) in header.items()}
    assert set(read_safetensors(path, expected=expected)) == set(expected)
    name = sorted(expected)[0]
    wrong = {**expected, name: (99,) + tuple(expected[name])}
    with pytest.raises(ValueError, match=rf"tensor '{name}' has shape"):
        read_safetensors(path, expected=wrong)
    with pytest.raises(ValueError, match=r"unexpected \['extra'\]|missing \['extra'\]"):
        read_safetensors(path, expected={**expected, "extra": (1,)})
    with pytest.raises(ValueError, match="has dtype F32, the config needs F16"):
        read_safetensors(path, expected={**expected, name: (expected[name], "F16")})


def test_limits_are_overridable_by_argument_and_environment(tmp_path, monkeypatch):
    _tiny_folder(tmp_path)
    with pytest.raises(ValueError, match=r"num_layers=2 exceeds the limit "
                       r"max_num_layers=1 .*limits=\{'max_num_layers': \.\.\.\}"):
        load_pretrained(str(tmp_path), limits={"max_num_layers": 1})
    monkeypatch.setenv("KERAS_TXL_LIMITS", '{"max_num_layers": 1}')
    assert resolve_limits().max_num_layers == 1
    with pytest.raises(ValueError, match="max_num_layers=1"):
        load_pretrained(str(tmp_path))
    # The argument wins over the environment.
    load_pretrained(str(tmp_path), limits={"max_num_layers": 2})
    monkeypatch.setenv("KERAS_TXL_LIMITS", "[1]")
    with pytest.raises(ValueError, match="KERAS_TXL_LIMITS must be a JSON object"):
        resolve_limits()
    monkeypatch.delenv("KERAS_TXL_LIMITS")
    with pytest.raises(ValueError, match=r"Unknown limit\(s\) \['max_layers'\]"):
        resolve_limits({"max_layers": 3})
    with pytest.raises(ValueError, match="must be a positive integer"):
        Limits(max_num_layers=0)
    assert resolve_limits() == Limits()


def test_names_that_leave_the_folder_and_json_depth(tmp_path):
    assert resolve_inside(tmp_path, "a/../vocabulary.txt") == str(tmp_path / "vocabulary.txt")
    for name in ("../x", "a/../../x", "/etc/passwd", "", None, 3):
        with pytest.raises(ValueError, match="leaves the folder|non-empty file name"):
            resolve_inside(tmp_path, name)
    assert json_depth(b'{"a": [1, {"b": []}]}') == 4
    assert json_depth(b"[" * 5000 + b"]" * 5000, chunk_size=7) == 5000


# === Checksums: a damaged or changed file of a folder keras-txl wrote ===


def _flip_middle_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_save_pretrained_refuses_to_write_over_another_librarys_folder(tmp_path):
    from keras_txl.io import save_preset

    model = keras_txl.TransformerXLCausalLM(keras_txl.TransformerXLConfig(**TINY))
    hf = tmp_path / "hf"
    shutil.copytree(FIXTURES / "hf_transfo_xl_tiny", hf)
    before = {p.name: p.read_bytes() for p in hf.iterdir()}
    with pytest.raises(ValueError, match=r"holds a Hugging Face TransfoXL checkpoint: "
                                         r"refusing to write"):
        save_pretrained(model, str(hf))
    assert {p.name: p.read_bytes() for p in hf.iterdir()} == before
    save_preset(model, str(tmp_path / "preset"))
    with pytest.raises(ValueError, match=r"holds a keras-hub preset: refusing"):
        save_pretrained(model, str(tmp_path / "preset"))
    save_pretrained(model, str(tmp_path / "mine"))  # its own folder: written again
    save_pretrained(model, str(tmp_path / "mine"))
    assert load_pretrained(str(tmp_path / "mine")).txl_config == model.txl_config


def test_save_pretrained_checks_its_tokenizer_against_the_model(tmp_path):
    # The tokenizer was written as given: one of another vocabulary size,
    # any folder (a whole preset copied in as tokenizer/), and a file or a
    # missing path was a raw NotADirectoryError / FileNotFoundError.
    from keras_txl.io import save_preset
    from keras_txl.io import tokenizer_directory

    model = keras_txl.TransformerXLCausalLM(keras_txl.TransformerXLConfig(**TINY))
    small = build_tokenizer("word", ["a b c"])  # 5 ids, the model has 11
    small.save(tmp_path / "small")
    for given in (small, str(tmp_path / "small")):
        with pytest.raises(ValueError, match=r"`tokenizer`: .*vocabulary_size=5, but the "
                                             r"model has vocabulary_size=11"):
            save_pretrained(model, str(tmp_path / "m"), tokenizer=given)
    (tmp_path / "notes.txt").write_text("mine")
    for given in (tmp_path / "notes.txt", tmp_path / "missing", tmp_path):
        with pytest.raises(ValueError, match=rf"`tokenizer`: no tokenizer in {re.escape(str(given))}"):
            save_pretrained(model, str(tmp_path / "m"), tokenizer=given)
    with pytest.raises(ValueError, match=r"`tokenizer` must be a keras-txl tokenizer .*"
                                         r"received int"):
        save_pretrained(model, str(tmp_path / "m"), tokenizer=5)
    assert not (tmp_path / "m").exists()
    # A preset's tokenizer: only the tokenizer is written, not the preset.
    good = build_tokenizer("word", ["a b c d e f g h i"])
    save_preset(model, str(tmp_path / "preset"), tokenizer=good)
    save_pretrained(model, str(tmp_path / "m"), tokenizer=str(tmp_path / "preset"))
    written = sorted(str(p.relative_to(tmp_path / "m" / "tokenizer"))
                     for p in (tmp_path / "m" / "tokenizer").rglob("*") if p.is_file())
    assert written == ["assets/tokenizer/vocabulary.txt", "tokenizer.json"]
    loaded = load_tokenizer(tokenizer_directory(str(tmp_path / "m")))
    assert loaded.get_vocabulary() == good.get_vocabulary()
    assert load_pretrained(str(tmp_path / "m")).txl_config == model.txl_config


@pytest.mark.parametrize("config", ["[1, 2]", '"a string"', "3", "null"])
def test_a_config_json_that_is_no_object_is_named(tmp_path, config):
    # A JSON list was classed as a keras-txl folder: from_preset said "load
    # it with keras_txl.load_pretrained", which then said "A config must be a dict".
    (tmp_path / "config.json").write_text(config)
    message = (rf"{re.escape(str(tmp_path / 'config.json'))} must be a JSON object "
               r"\(a keras-hub backbone config, a keras-txl TransformerXLConfig or a "
               rf"Hugging Face TransfoXL config\), received {type(json.loads(config)).__name__}")
    for load in (load_pretrained, keras_txl.TransformerXLCausalLM.from_preset):
        with pytest.raises(ValueError, match=message):
            load(str(tmp_path))


def test_a_number_of_too_many_digits_in_a_json_file_is_named(tmp_path):
    # Python refuses to convert an integer of more than 4300 digits: the
    # ValueError ("Exceeds the limit (4300 digits) for integer string
    # conversion") named no file.
    (tmp_path / "config.json").write_text('{"vocabulary_size": 1' + "0" * 5000 + "}")
    message = (rf"{re.escape(str(tmp_path / 'config.json'))} could not be read as JSON: "
               r"Exceeds the limit \(4300 digits\)")
    for load in (load_pretrained, keras_txl.TransformerXLCausalLM.from_preset,
                 keras_txl.TransformerXLBackbone.from_preset):
        with pytest.raises(ValueError, match=message):
            load(str(tmp_path))


def test_a_save_under_a_file_names_the_file(tmp_path):
    # Was a raw FileExistsError / NotADirectoryError from os.makedirs.
    from keras_txl.io import save_preset

    model = keras_txl.TransformerXLCausalLM(keras_txl.TransformerXLConfig(**TINY))
    (tmp_path / "afile").write_text("mine")
    saves = (model.save_to_preset, lambda d: save_preset(model, d),
             lambda d: save_pretrained(model, d))
    for save in saves:
        for target in (tmp_path / "afile" / "sub", tmp_path / "afile" / "sub" / "deeper"):
            with pytest.raises(ValueError, match=rf"`directory` '{re.escape(str(target))}' "
                                                 rf"cannot be created: '{re.escape(str(tmp_path))}/afile' "
                                                 r"is a file, not a folder"):
                save(str(target))
    assert (tmp_path / "afile").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_a_save_pretrained_that_fails_midway_leaves_the_previous_folder(tmp_path, monkeypatch):
    # save_pretrained wrote its files into the folder one by one: a failure
    # after the weights left new weights beside the old config and manifest,
    # a folder refused on load, the previous model lost.
    old = _tiny_folder(tmp_path / "m")
    (tmp_path / "m" / "README.md").write_text("my card")
    ids = np.array([[1, 2, 3, 4]], "int32")
    expected = old.call_with_memory(ids)["log_probs"]
    before = {p.relative_to(tmp_path): p.read_bytes()
              for p in (tmp_path / "m").rglob("*") if p.is_file()}
    import keras

    keras.utils.set_random_seed(7)
    new = keras_txl.TransformerXLCausalLM(keras_txl.TransformerXLConfig(**TINY))

    tokenizer = build_tokenizer("word", ["a b c d e f g h i"])

    def disk_full(self, directory):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(type(tokenizer), "save", disk_full)
        with pytest.raises(OSError, match="No space left"):
            save_pretrained(new, str(tmp_path / "m"), tokenizer=tokenizer)
    with monkeypatch.context() as patch:
        patch.setattr(keras_txl.io, "write_manifest", lambda d: (_ for _ in ()).throw(
            KeyboardInterrupt("killed")))
        with pytest.raises(KeyboardInterrupt):
            save_pretrained(new, str(tmp_path / "m"))
    after = {p.relative_to(tmp_path): p.read_bytes()
             for p in (tmp_path / "m").rglob("*") if p.is_file()}
    assert after == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temporaries left
    np.testing.assert_array_equal(
        load_pretrained(str(tmp_path / "m")).call_with_memory(ids)["log_probs"], expected)
    # A complete save replaces it (the tokenizer copied from the folder being
    # replaced, the model card kept); other files are refused, not deleted.
    save_pretrained(new, str(tmp_path / "m"), tokenizer=str(tmp_path / "m" / "tokenizer"))
    np.testing.assert_array_equal(
        load_pretrained(str(tmp_path / "m")).call_with_memory(ids)["log_probs"],
        new.call_with_memory(ids)["log_probs"])
    assert load_tokenizer(str(tmp_path / "m" / "tokenizer")).vocabulary_size() == 11
    assert (tmp_path / "m" / "README.md").read_text() == "my card"
    (tmp_path / "m" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"holds files that are not a keras-txl weights "
                                         r"folder \(notes.txt\): refusing"):
        save_pretrained(new, str(tmp_path / "m"))
    assert (tmp_path / "m" / "notes.txt").read_text() == "mine"


def test_a_preset_load_hashes_each_file_once_and_still_notices_a_rewrite(tmp_path, monkeypatch):
    # from_preset checks the folder, then keras-hub's loader reads the
    # weights through TransformerXLBackbone.load_weights, which checks it
    # again: an unchanged file is not hashed twice. A rewrite is noticed even
    # with its size and mtime put back (the ctime moves).
    from keras_txl import folders
    from keras_txl.io import save_preset

    tokenizer = build_tokenizer("char", ["abc"])
    model = keras_txl.TransformerXLCausalLM(keras_txl.TransformerXLConfig(
        **{**TINY, "vocabulary_size": tokenizer.vocabulary_size()}))
    preset = tmp_path / "preset"
    save_preset(model, str(preset), tokenizer=tokenizer)
    listed = json.loads((preset / "manifest.json").read_text())["files"]
    time.sleep(folders._RACY_SECONDS + 0.1)  # files changed just now are hashed every time
    hashed = []
    real_sha256 = folders.sha256_file
    monkeypatch.setattr(folders, "sha256_file",
                        lambda path: hashed.append(os.path.basename(path)) or real_sha256(path))
    keras_txl.TransformerXLCausalLM.from_preset(str(preset))
    assert sorted(hashed) == sorted(os.path.basename(name) for name in listed)
    hashed.clear()
    keras_txl.TransformerXLCausalLM.from_preset(str(preset))
    assert hashed == []
    weights = preset / "model.weights.h5"
    before = os.stat(weights)
    _flip_middle_byte(weights)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.path.getsize(weights) == before.st_size
    with pytest.raises(ValueError, match="model.weights.h5 does not match the sha256"):
        keras_txl.TransformerXLCausalLM.from_preset(str(preset))
    assert hashed == ["model.weights.h5"]


def test_model_folders_carry_a_manifest_that_notices_damage(tmp_path):
    from keras_txl.io import save_preset

    models = {"weights": _tiny_folder(tmp_path / "weights")}
    tokenizer = build_tokenizer("char", ["abc"])
    models["preset"] = keras_txl.TransformerXLCausalLM(keras_txl.TransformerXLConfig(
        **{**TINY, "vocabulary_size": tokenizer.vocabulary_size()}))
    preset = tmp_path / "preset"
    save_preset(models["preset"], str(preset), tokenizer=tokenizer)
    listed = {
        folder.name: sorted(json.loads((folder / "manifest.json").read_text())["files"])
        for folder in (tmp_path / "weights", preset)
    }
    assert listed["weights"] == ["config.json", "model.safetensors",
                                 "tokenizer/assets/tokenizer/vocabulary.txt",
                                 "tokenizer/tokenizer.json"]
    assert listed["preset"] == ["assets/tokenizer/vocabulary.json", "config.json",
                                "metadata.json", "model.weights.h5", "preprocessor.json",
                                "task.json", "task.weights.h5", "tokenizer.json"]
    ids = np.array([[1, 2, 3]], "int32")
    for name, weights in (("weights", "model.safetensors"), ("preset", "model.weights.h5")):
        folder = tmp_path / name
        expected = models[name].call_with_memory(ids)["log_probs"]
        # Files a loader does not read may be added (a README, a hub's dot-files).
        (folder / "README.md").write_text("notes")
        (folder / ".gitattributes").write_text("*.h5 filter=lfs")
        np.testing.assert_array_equal(
            load_pretrained(str(folder)).call_with_memory(ids)["log_probs"], expected)
        copy = tmp_path / f"{name}-flipped"
        shutil.copytree(folder, copy)
        _flip_middle_byte(copy / weights)  # same size: only the sha256 tells
        with pytest.raises(ValueError, match=rf"{weights} does not match the sha256 in "
                                             rf".*manifest.json: a damaged or changed file"):
            load_pretrained(str(copy))
        copy = tmp_path / f"{name}-missing"
        shutil.copytree(folder, copy)
        # (a file no other check reads at load time)
        unread = {"weights": "tokenizer/tokenizer.json", "preset": "metadata.json"}[name]
        (copy / unread).unlink()
        with pytest.raises(ValueError, match=rf"{unread} is listed in .*manifest.json but missing"):
            load_pretrained(str(copy))
        copy = tmp_path / f"{name}-added"
        shutil.copytree(folder, copy)
        (copy / "model_1.weights.h5").write_bytes(b"x")
        with pytest.raises(ValueError, match=r"model_1.weights.h5 is not listed in .*manifest.json"):
            load_pretrained(str(copy))
    # keras-hub's own loader entry point checks the preset the same way.
    copy = tmp_path / "preset-flipped"
    with pytest.raises(ValueError, match="does not match the sha256"):
        keras_txl.TransformerXLCausalLM.from_preset(str(copy))


@pytest.mark.parametrize("manifest, message", [
    ({"format": "keras-txl-model-folder", "files": {"../config.json": {"bytes": 1, "sha256": "0"}}},
     "leaves the folder"),
    ({"format": "something else", "files": {}}, "is not a keras-txl manifest"),
    ({"format": "keras-txl-model-folder", "files": {"config.json": {"bytes": "1"}}},
     "is not a keras-txl manifest"),
    ([1, 2], "is not a keras-txl manifest"),
])
def test_a_hostile_manifest_is_refused_by_name(tmp_path, manifest, message):
    _tiny_folder(tmp_path / "m")
    (tmp_path / "m" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=message):
        load_pretrained(str(tmp_path / "m"))


def test_a_preset_whose_hdf5_metadata_is_damaged_is_a_value_error(tmp_path):
    # h5py raises RuntimeError ("bad symbol table node signature"), not
    # OSError, for damaged metadata; without a manifest to catch it first
    # that must still be a ValueError naming the preset.
    from keras_txl.io import save_preset

    model = keras_txl.TransformerXLCausalLM(keras_txl.TransformerXLConfig(**TINY))
    save_preset(model, str(tmp_path / "p"))
    (tmp_path / "p" / "manifest.json").unlink()
    path = tmp_path / "p" / "model.weights.h5"
    data = bytearray(path.read_bytes())
    for i in range(1024, 1536, 4):
        data[i] = 0x7F
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"Could not read the preset .*model.weights.h5"):
        load_pretrained(str(tmp_path / "p"))


@pytest.mark.parametrize("value", [5, None, b"folder"])
def test_a_folder_argument_that_is_no_path_is_named(value):
    from keras_txl.hf_checkpoint import load_hf_checkpoint

    for load in (load_pretrained, load_hf_checkpoint):
        with pytest.raises(TypeError, match=r"`directory` must be a folder path \(str or "
                                            rf"os.PathLike\), received {type(value).__name__}"):
            load(value)
