"""Installing: a missing TensorFlow wheel or add-on is named, with the command that fixes it."""

import os
import runpy
import shutil
import subprocess
import sys
import tarfile

import pytest
import setuptools

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_without(module):
    """Imports keras_txl (and the tokenizers) in a process where `module` is absent."""
    code = (f"import sys; sys.modules[{module!r}] = None\n"
            "import keras_txl, training.tokenizers\n")
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)


def test_missing_tensorflow_names_both_wheels():
    result = run_without("tensorflow")
    assert result.returncode != 0
    assert "keras-txl needs TensorFlow 2.21" in result.stderr
    assert "keras-txl[cpu]" in result.stderr and "keras-txl[cuda]" in result.stderr


def test_missing_tensorflow_text_says_how_to_install_it():
    result = run_without("tensorflow_text")
    assert result.returncode != 0
    assert "pip install --no-deps 'tensorflow-text>=2.21,<2.22'" in result.stderr


def test_missing_serving_api_says_how_to_install_it(monkeypatch):
    from export import serving

    # Absent, even where an earlier test has imported it (sys.modules caches
    # each submodule on its own).
    for name in ("tensorflow_serving", "tensorflow_serving.apis",
                 "tensorflow_serving.apis.predict_pb2",
                 "tensorflow_serving.apis.prediction_log_pb2"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r"pip install --no-deps "
                       r"'tensorflow-serving-api>=2\.21,<2\.22'"):
        serving.make_predict_request("txl", "serving_default", {})
    with pytest.raises(ImportError, match="tensorflow-serving-api"):
        serving.read_warmup_file("unused")


def setup_arguments(monkeypatch):
    captured = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: captured.update(kw))
    monkeypatch.chdir(REPO)
    runpy.run_path(os.path.join(REPO, "setup.py"))
    return captured


def test_setup_leaves_the_tensorflow_wheel_to_the_extras(monkeypatch):
    args = setup_arguments(monkeypatch)
    names = [r.split(">")[0].split("[")[0] for r in args["install_requires"]]
    assert not {"tensorflow", "tensorflow-cpu", "tensorflow-text",
                "tensorflow-serving-api"} & set(names)
    assert "keras" in names and "safetensors" in names
    extras = args["extras_require"]
    assert extras["cpu"] == ["tensorflow-cpu>=2.21,<2.22"]
    # The CUDA route: the same TensorFlow version, the add-ons with their deps.
    assert extras["cuda"] == ["tensorflow[and-cuda]>=2.21,<2.22",
                              "tensorflow-text>=2.21,<2.22",
                              "tensorflow-serving-api>=2.21,<2.22"]
    # matplotlib is optional (Keras imports pyplot wherever it is installed).
    assert "matplotlib" not in names
    assert extras["plots"] == ["matplotlib>=3.8,<4"]
    assert "matplotlib>=3.8,<4" in extras["tests"]


def test_attention_pictures_without_matplotlib_say_how_to_install_it(monkeypatch):
    from keras_txl import insight

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install 'keras-txl\[plots\]'"):
        insight.attention_report(None, [1, 2, 3], "unused")


def test_sdist_carries_what_setup_py_reads(tmp_path, monkeypatch):
    # From a clean copy: setuptools also packs what a leftover *.egg-info lists.
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "*.egg-info", "build", "dist", "runs", "__pycache__",
        ".hypothesis", ".pytest_cache"))
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(dist)],
                   cwd=source, check=True, capture_output=True, timeout=300)
    (archive,) = dist.glob("keras*txl-*.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(dist, filter="data")
    (unpacked,) = [p for p in dist.iterdir() if p.is_dir()]
    for name in ("requirements.txt", "requirements-tf-addons.txt", "README.md"):
        assert (unpacked / name).is_file(), name
    # Its setup.py, run from the unpacked sdist alone, gives the same extras.
    captured = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: captured.update(kw))
    monkeypatch.chdir(unpacked)
    runpy.run_path(str(unpacked / "setup.py"))
    assert captured["extras_require"]["cpu"] == ["tensorflow-cpu>=2.21,<2.22"]
