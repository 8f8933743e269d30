# The two commands of the README: `make demo` and `make test`. Each sets up .venv first.
# `make bench` runs the side-by-side benchmark beside the reference (docs/benchmarks.md).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BENCH_VENV := .venv-bench
PEER_VENV ?= ../peer-venv
PIP_FLAGS := --quiet --disable-pip-version-check
export TF_CPP_MIN_LOG_LEVEL ?= 3
export KERAS_BACKEND := tensorflow

.PHONY: setup test demo bench clean

setup: $(VENV)/.installed

# A fresh venv whenever the requirements change: never one TensorFlow wheel over another.
# tensorflow-text and tensorflow-serving-api name the CUDA `tensorflow` wheel as a
# dependency but run on tensorflow-cpu of the same version: installed without their deps.
$(VENV)/.installed: pyproject.toml requirements-tf-addons.txt
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) -e ".[cpu,tests]"
	$(PY) -m pip install $(PIP_FLAGS) --no-deps -r requirements-tf-addons.txt
	touch $@

test: setup
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q tests

demo: setup
	$(VENV)/bin/txl demo --workdir runs/demo

# What a user who trains and evaluates installs (no pytest, no matplotlib), like the
# reference's own venv (shared/bench/README.md: torch, transformers, safetensors, numpy).
$(BENCH_VENV)/.installed: pyproject.toml requirements-tf-addons.txt
	rm -rf $(BENCH_VENV)
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install $(PIP_FLAGS) -e ".[cpu]"
	$(BENCH_VENV)/bin/python -m pip install $(PIP_FLAGS) --no-deps -r requirements-tf-addons.txt
	touch $@

$(PEER_VENV)/.installed:
	$(PYTHON) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/python -m pip install $(PIP_FLAGS) torch==2.13.0 transformers==4.37.2 safetensors numpy
	touch $@

bench: $(BENCH_VENV)/.installed $(PEER_VENV)/.installed
	$(BENCH_VENV)/bin/python benchmarks/compare_peer.py --peer-python $(PEER_VENV)/bin/python \
		--rounds 5 --ours "" --ours "--precision mixed_bfloat16"

clean:
	rm -rf $(VENV) $(BENCH_VENV) runs .pytest_cache
