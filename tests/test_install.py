"""Installing: a missing TensorFlow wheel or add-on is named, with the command that fixes it."""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tomllib
from testing import REPO


def run_without(module, code):
    """Runs `code` in a process where `module` is absent."""
    code = f"import sys; sys.modules[{module!r}] = None\n" + code
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)


def test_missing_tensorflow_names_both_wheels():
    # The package itself imports without TensorFlow (the serving client runs
    # there); the model classes and the CLI's commands say what to install.
    result = run_without("tensorflow", "import keras_txl\nkeras_txl.TransformerXLCausalLM\n")
    assert result.returncode != 0
    assert "keras-txl needs TensorFlow 2.21" in result.stderr
    assert "keras-txl[cpu]" in result.stderr and "keras-txl[cuda]" in result.stderr


def test_missing_tensorflow_text_says_how_to_install_it():
    result = run_without("tensorflow_text", "import keras_txl.tokenizers\n")
    assert result.returncode != 0
    assert "pip install --no-deps 'tensorflow-text>=2.21,<2.22'" in result.stderr


def test_missing_keras_hub_says_how_to_install_it():
    # keras-hub is an add-on installed --no-deps (it names tensorflow-text):
    # without it every model class failed with "No module named 'keras_hub'",
    # and `txl train` the same, after the corpus was prepared.
    result = run_without("keras_hub", "import keras_txl\nkeras_txl.TransformerXLCausalLM\n")
    assert result.returncode != 0
    assert "keras-txl needs keras-hub 0.32" in result.stderr, result.stderr[-2000:]
    assert "pip install --no-deps 'keras-hub>=0.32,<0.33'" in result.stderr
    result = run_without("keras_hub", "from keras_txl.cli import main\n"
                                      "raise SystemExit(main(['eval', '--workdir', 'nowhere']))\n")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "txl eval: error: keras-txl needs keras-hub 0.32" in result.stderr, result.stderr[-2000:]


def test_missing_serving_api_says_how_to_install_it(monkeypatch):
    from keras_txl.export import serving

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


def project_metadata():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def names(requirements):
    return [re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0] for r in requirements]


def test_metadata_leaves_the_tensorflow_wheel_to_the_extras():
    project = project_metadata()["project"]
    runtime = names(project["dependencies"])
    assert not {"tensorflow", "tensorflow-cpu", "tensorflow-text",
                "tensorflow-serving-api"} & set(runtime)
    assert "keras" in runtime and "safetensors" in runtime
    extras = project["optional-dependencies"]
    assert extras["cpu"] == ["tensorflow-cpu>=2.21,<2.22"]
    # The CUDA route: the same TensorFlow version, the add-ons with their deps,
    # the same add-ons the CPU route installs --no-deps.
    with open(os.path.join(REPO, "requirements-tf-addons.txt")) as f:
        addons = [line.split("#")[0].strip() for line in f if line.split("#")[0].strip()]
    assert extras["cuda"] == ["tensorflow[and-cuda]>=2.21,<2.22", *addons]
    # matplotlib is optional (Keras imports pyplot wherever it is installed).
    assert "matplotlib" not in runtime
    assert extras["plots"] == ["matplotlib>=3.8,<4"]
    assert "matplotlib>=3.8,<4" in extras["tests"]


def test_the_installed_distribution_has_one_top_level_package_and_the_txl_command():
    # What the install made of pyproject.toml (this environment's install):
    # only keras_txl at the top level, the repository's training/ and export/
    # folders imported as keras_txl.training and keras_txl.export, and a
    # `txl` script that runs the CLI.
    from importlib import metadata
    from importlib.util import find_spec

    import keras_txl.cli

    distribution = metadata.distribution("keras-txl")
    assert distribution.read_text("top_level.txt").split() == ["keras_txl"]
    for package, folder in (("keras_txl.training", "training"), ("keras_txl.export", "export")):
        (location,) = find_spec(package).submodule_search_locations
        modules = sorted(p.name for p in pathlib.Path(location).glob("*.py"))
        assert modules and modules == sorted(p.name for p in pathlib.Path(REPO, folder).glob("*.py"))
    (script,) = distribution.entry_points.select(group="console_scripts", name="txl")
    assert script.load() is keras_txl.cli.main


def test_attention_pictures_without_matplotlib_say_how_to_install_it(monkeypatch):
    from keras_txl import insight

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install 'keras-txl\[plots\]'"):
        insight.attention_report(None, [1, 2, 3], "unused")


def readme_python_quick_start(index=0):
    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read()
    return re.findall(r"```python\n(.*?)```", text, re.S)[index]


def test_txl_help_does_not_import_tensorflow():
    code = textwrap.dedent("""
        import sys
        from keras_txl.cli import main
        try:
            main(["--help"])
        except SystemExit:
            pass
        import keras_txl.export.serving_client  # the client for hosts without TF
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras"))
        print("HEAVY", heavy)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stdout, result.stdout[-2000:]
    assert "usage: txl" in result.stdout


def test_non_editable_install_beside_the_users_own_training_and_export(tmp_path):
    """`pip install .` (not editable) from a clean copy; the quick start and
    `txl train` run from a folder holding the user's `training.py`,
    `export.py` and `training/` package, which are never executed."""
    source = tmp_path / "clone"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    for name in listed:
        if os.path.isfile(os.path.join(REPO, name)):
            os.makedirs(source / os.path.dirname(name), exist_ok=True)
            shutil.copy2(os.path.join(REPO, name), source / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # Third-party dependencies (TensorFlow is 1.3 GB) come from the test's own environment
    # through a .pth line; that directory's own .pth files (our editable install) are not
    # processed, so only the freshly installed keras_txl can be imported.
    ours = os.path.dirname(os.path.dirname(os.path.abspath(np.__file__)))
    with open(os.path.join(site, "deps.pth"), "w") as f:
        f.write(ours + "\n")
    install = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", str(source)],
        capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    top_level = sorted(os.listdir(site))
    assert "keras_txl" in top_level
    assert "training" not in top_level and "export" not in top_level, top_level
    assert not (pathlib.Path(site) / "keras_txl" / "__editable__").exists()

    user = tmp_path / "my-project"
    (user / "training").mkdir(parents=True)
    marker = user / "EXECUTED"
    poison = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\nraise SystemExit('user code ran')\n"
    for name in ("training.py", "export.py", "training/__init__.py", "training/tokenizers.py"):
        (user / name).write_text(poison)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("PYTHONPATH", None)
    corpus = user / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    # `txl train` writes the preset the README's quick start reads (runs/demo/model).
    train = subprocess.run(
        [str(venv / "bin" / "txl"), "train", "--data", str(corpus), "--workdir",
         str(user / "runs" / "demo"), "--preset", "tiny", "--tokenizer", "byte", "--steps", "4",
         "--batch-size", "2", "--segment-length", "16", "--memory-length", "16",
         "--set", "train.warmup_steps=1"],
        cwd=user, env=env, capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, train.stderr[-3000:]
    assert (user / "runs" / "demo" / "model" / "model.weights.h5").is_file()
    assert (user / "runs" / "demo" / "model" / "tokenizer.json").is_file()
    for index in (0, 1):
        quick = subprocess.run([python, "-c", readme_python_quick_start(index)], cwd=user,
                               env=env, capture_output=True, text=True, timeout=600)
        assert quick.returncode == 0, quick.stderr[-3000:]
    assert (user / "my_preset" / "model.weights.h5").is_file()
    where = subprocess.run([python, "-c", "import keras_txl.training.run as r; print(r.__file__)"],
                           cwd=user, env=env, capture_output=True, text=True, timeout=300)
    assert where.stdout.strip().startswith(site), where.stdout + where.stderr
    assert not marker.exists(), marker.read_text()
