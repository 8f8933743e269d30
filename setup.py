"""keras-txl: Transformer-XL for TensorFlow 2 / Keras 3, from training to deployment."""

import pathlib

from setuptools import setup

HERE = pathlib.Path(__file__).parent

# Which TensorFlow wheel is the user's choice (CPU-only or CUDA), as with
# tensorflow-probability: installing one over the other clobbers files.
TENSORFLOW_WHEELS = ("tensorflow-cpu", "tensorflow")
TF_ADDONS = "requirements-tf-addons.txt"


def _requirements(name):
    reqs = []
    for line in (HERE / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            reqs.append(line)
    return reqs


def _name(requirement):
    for sep in "<>=!~[; ":
        requirement = requirement.split(sep, 1)[0]
    return requirement


RUNTIME = _requirements("requirements.txt")
TENSORFLOW = [r for r in RUNTIME if _name(r) in TENSORFLOW_WHEELS]
TF_VERSION = TENSORFLOW[0][len(_name(TENSORFLOW[0])):]
PLOTS = ["matplotlib>=3.8,<4"]

setup(
    name="keras-txl",
    version="0.1.0",
    description="Transformer-XL in Keras 3: exact, trainable at scale, exportable "
    "to SavedModel and TFLite with the memory carried across segments.",
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # `training` and `export` are generic top-level names; they are listed
    # explicitly so nothing else gets swept in (see README, "Packaging").
    packages=["keras_txl", "training", "export"],
    install_requires=[r for r in RUNTIME if _name(r) not in TENSORFLOW_WHEELS],
    extras_require={
        # CPU machines: then `pip install --no-deps -r requirements-tf-addons.txt`.
        "cpu": TENSORFLOW,
        # GPU machines: the CUDA wheel, with which the add-ons install as they are.
        "cuda": [f"tensorflow[and-cuda]{TF_VERSION}"] + _requirements(TF_ADDONS),
        # The attention pictures (`txl attention`) and the docs' plots. Not a
        # runtime dependency: Keras imports pyplot in every process where
        # matplotlib is installed (~30 MB resident, 0.3 s).
        "plots": PLOTS,
        "tests": ["pytest>=8,<10", "hypothesis>=6.100,<7"] + PLOTS,
    },
    entry_points={"console_scripts": ["txl=keras_txl.__main__:main"]},
)
