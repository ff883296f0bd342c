# Targets a newcomer can guess. Every target sets up the local virtual environment
# itself, with what it needs and nothing more, so a fresh machine with only Python 3.10+
# needs nothing else: `make demo` installs the package and its demo extra (no torch, Ray
# or Beam); `make test` and `make lint` add the test and dev extras.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
BASE_STAMP := $(VENV)/.base-stamp
TEST_STAMP := $(VENV)/.test-stamp
DEMO_STAMP := $(VENV)/.demo-stamp
DOCS_STAMP := $(VENV)/.docs-stamp
TEST_EXTRAS := .[test,dev]
# The test and docs extras pin torch's CPU build (2.13.0+cpu on Linux x86_64): PyPI has only
# CUDA builds there, several GB. pip finds the CPU wheel where its configuration points
# (a find-links folder, as on the project's CI machines); elsewhere `make test` asks
# PyTorch's CPU index for it, after pip's usual places have none.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# $(call PIP_WITH_CPU_TORCH,.[extras]): the editable install of those extras, asking
# PyTorch's CPU index for torch's CPU build if pip's usual places hold none.
PIP_WITH_CPU_TORCH = $(PIP) install -q -e '$(1)' || { \
	  echo "make: installing again with PyTorch's CPU index ($(TORCH_CPU_INDEX)) for torch's CPU build"; \
	  $(PIP) install -q -e '$(1)' --extra-index-url $(TORCH_CPU_INDEX); }

.PHONY: install test test-fast lint bench bench-convert demo docs docs-serve clean

# The package alone (and the grain alias's startup hook, see setup.py). An existing venv is
# kept: `python -m venv` over it rewrites its activate scripts and pyvenv.cfg in place,
# which in a venv of hard-linked copies (a worktree's) rewrites every copy's.
$(BASE_STAMP): setup.cfg setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e .
	touch $@

# What the suite and the linters need: every extra's libraries (see setup.cfg's test).
$(TEST_STAMP): $(BASE_STAMP)
	$(call PIP_WITH_CPU_TORCH,$(TEST_EXTRAS))
	touch $@

# The demo extra (tokenizers for the language model's BPE, scikit-learn for its shipped
# digits) on top of the package.
$(DEMO_STAMP): $(BASE_STAMP)
	$(PIP) install -q -e '.[demo]'
	touch $@

install: $(BASE_STAMP)

# The whole non-GPU suite (slow and multi-process tests included).
test: $(TEST_STAMP)
	$(PY) -m pytest -m "not gpu" -q

# The suite without the tests marked slow (multi-process start-ups, clusters, builds).
test-fast: $(TEST_STAMP)
	$(PY) -m pytest -m "not gpu and not slow" -q

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy dataloader samplers sources operations

# The benchmarks make their own environment (benchmarks/.venv, with the peers).
bench: $(BASE_STAMP)
	$(PY) benchmarks/run.py

# TFRecord -> ArrayRecord: the Beam pipeline at 1 and 2 workers against its peers.
bench-convert: $(BASE_STAMP)
	$(PY) benchmarks/convert.py

# The language model (the main job), then the digits demo, whose files the configs/
# examples read.
demo: $(DEMO_STAMP)
	$(PY) -m dataloader demo
	$(PY) -m dataloader demo --demo=digits

# The documentation site (docs/, mkdocs.yml): the docs extra (MkDocs, Material,
# mkdocstrings, and what the pages' examples import) on top of the base install.
# `docs` builds it strictly (a broken link, a missing anchor or a docstring that names a
# parameter the code lacks fails it) into site/; `docs-serve` serves it while you edit.
$(DOCS_STAMP): $(BASE_STAMP)
	$(call PIP_WITH_CPU_TORCH,.[docs])
	touch $@

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

docs-serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve --dev-addr 127.0.0.1:8000

clean:
	rm -rf $(VENV) build dist site *.egg-info .pytest_cache .hypothesis
