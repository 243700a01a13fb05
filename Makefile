# Two commands on a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test setup bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[plots,dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(PY) -m multidraft compare

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/verify_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
