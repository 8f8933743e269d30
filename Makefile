# The two commands of the README: `make demo` and `make test`. Each sets up .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
export TF_CPP_MIN_LOG_LEVEL ?= 3
export KERAS_BACKEND := tensorflow

.PHONY: setup test demo clean

setup: $(VENV)/.installed

# A fresh venv whenever the requirements change: never one TensorFlow wheel over another.
# tensorflow-text and tensorflow-serving-api name the CUDA `tensorflow` wheel as a
# dependency but run on tensorflow-cpu of the same version: installed without their deps.
$(VENV)/.installed: requirements.txt requirements-tf-addons.txt setup.py
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(PIP) -r requirements.txt
	$(PIP) --no-deps -r requirements-tf-addons.txt
	$(PIP) -e ".[tests]"
	touch $@

test: setup
	$(PY) -m pytest -q tests

demo: setup
	$(VENV)/bin/txl demo --workdir runs/demo

clean:
	rm -rf $(VENV) runs .pytest_cache
