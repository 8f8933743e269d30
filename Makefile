# The two commands of the README: `make demo` and `make test`. Each sets up .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export TF_CPP_MIN_LOG_LEVEL ?= 3
export KERAS_BACKEND := tensorflow

.PHONY: setup test demo clean

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[tests]"
	touch $@

test: setup
	$(PY) -m pytest -q tests

demo: setup
	$(VENV)/bin/txl demo --workdir runs/demo

clean:
	rm -rf $(VENV) runs .pytest_cache
