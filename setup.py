"""keras-txl: Transformer-XL for TensorFlow 2 / Keras 3, from training to deployment."""

import pathlib

from setuptools import setup

HERE = pathlib.Path(__file__).parent


def _requirements():
    lines = (HERE / "requirements.txt").read_text().splitlines()
    reqs = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            reqs.append(line)
    return reqs


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
    install_requires=_requirements(),
    extras_require={
        "tests": ["pytest>=8,<10", "hypothesis>=6.100,<7"],
    },
    entry_points={"console_scripts": ["txl=keras_txl.__main__:main"]},
)
