# The two commands of the README: `make demo` and `make test`. Each sets up .venv first.
# `make bench` runs the side-by-side benchmark beside the reference (docs/benchmarks.md);
# `make bench-avx2` the same capped at AVX2.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BENCH_VENV := .venv-bench
PEER_VENV ?= ../peer-venv
PIP_FLAGS := --quiet --disable-pip-version-check
export TF_CPP_MIN_LOG_LEVEL ?= 3
export KERAS_BACKEND := tensorflow

.PHONY: setup test demo bench bench-avx2 clean

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

# Two pytest-xdist workers (the 2 cores CI has): most of the suite's time is spent starting
# TensorFlow in child processes and tracing, which a second worker overlaps (7.3 against
# 12.8 minutes on a 2-core AMD EPYC). --dist loadfile keeps each file's tests, and the
# models its module-scoped fixtures build, in one worker.
TEST_WORKERS ?= 2

test: setup
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25 tests

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

# Ours (fp32, bf16) against the reference eager and under torch.compile, 5 alternating
# rounds; `bench-avx2` the same with both frameworks capped at AVX2, ours in fp32 only
# (what "auto" picks there; bf16 under that cap crashes TensorFlow on an AVX-512 CPU,
# keras_txl.host.check_cpu_precision). docs/benchmarks.md, "How to reproduce on both ISA
# levels". Inductor needs gcc/g++ on the PATH.
BENCH_ARGS := --peer-python $(PEER_VENV)/bin/python --rounds 5 \
	--ours "" --ours "--precision mixed_bfloat16"
BENCH_AVX2_ARGS := --peer-python $(PEER_VENV)/bin/python --rounds 5 --ours ""

bench: $(BENCH_VENV)/.installed $(PEER_VENV)/.installed
	$(BENCH_VENV)/bin/python benchmarks/compare_peer.py $(BENCH_ARGS) --isa native

bench-avx2: $(BENCH_VENV)/.installed $(PEER_VENV)/.installed
	$(BENCH_VENV)/bin/python benchmarks/compare_peer.py $(BENCH_AVX2_ARGS) --isa avx2

clean:
	rm -rf $(VENV) $(BENCH_VENV) runs .pytest_cache
