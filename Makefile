# Targets a newcomer can guess. Every target sets up the local virtual environment
# itself, so a fresh machine with only Python 3.10+ needs nothing else.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install test test-fast lint bench bench-convert demo docs docs-serve clean

$(STAMP): setup.cfg setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,dev]'
	touch $(STAMP)

install: $(STAMP)

# The whole non-GPU suite (slow and multi-process tests included).
test: $(STAMP)
	$(PY) -m pytest -m "not gpu" -q

test-fast: $(STAMP)
	$(PY) -m pytest -m "not gpu and not slow" -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy dataloader samplers sources operations

bench: $(STAMP)
	$(PY) benchmarks/run.py

# TFRecord -> ArrayRecord: the Beam pipeline at 1 and 2 workers against its peers.
bench-convert: $(STAMP)
	$(PY) benchmarks/convert.py

# The demo extra (tokenizers for the language model's BPE, scikit-learn for its shipped
# digits) on top of the base install.
$(VENV)/.demo-stamp: $(STAMP)
	$(PY) -m pip install -q -e '.[demo]'
	touch $@

# The language model (the main job), then the digits demo, whose files the configs/
# examples read.
demo: $(VENV)/.demo-stamp
	$(PY) -m dataloader demo
	$(PY) -m dataloader demo --demo=digits

# The documentation site (docs/, mkdocs.yml): the docs extra (MkDocs, Material,
# mkdocstrings, and what the pages' examples import) on top of the base install.
# `docs` builds it strictly (a broken link, a missing anchor or a docstring that names a
# parameter the code lacks fails it) into site/; `docs-serve` serves it while you edit.
$(VENV)/.docs-stamp: $(STAMP)
	$(PY) -m pip install -q -e '.[docs]'
	touch $@

docs: $(VENV)/.docs-stamp
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

docs-serve: $(VENV)/.docs-stamp
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve --dev-addr 127.0.0.1:8000

clean:
	rm -rf $(VENV) build dist site *.egg-info .pytest_cache .hypothesis
