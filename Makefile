# repdegen: one entry point per job. Run from the repository root.
PYTHON ?= python
# The torch build to install when none is present. On GPU machines the PyPI wheel of this version
# brings CUDA; on the CPU-only machines of this project it resolves to a local CPU build.
TORCH_SPEC ?= torch==2.13.0
TABLE ?= inan2017_t1
SCALE ?= smoke
ARGS ?=
# Corpora: a local directory laid out like ../shared/data, else the Hugging Face hub.
export REPDEGEN_DATA_DIR ?= $(abspath $(wildcard ../shared/data))

.PHONY: install test test-slow test-gpu reproduce-table lint describe help

help:
	@echo "make install                               install repdegen (editable) and its dependencies"
	@echo "make test                                  fast test suite (CPU, minutes)"
	@echo "make test-slow                             real-corpus tests (PTB/WikiText-2 from REPDEGEN_DATA_DIR)"
	@echo "make reproduce-table TABLE=... SCALE=...   regenerate a paper table (smoke | lite | paper)"
	@echo "make lint                                  ruff"

install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install "$(TORCH_SPEC)"
	$(PYTHON) -m pip install -e ".[dev]"

test:
	$(PYTHON) -m pytest -q

test-slow:
	$(PYTHON) -m pytest -q -m slow

test-gpu:
	$(PYTHON) -m pytest -q -m gpu

reproduce-table:
	$(PYTHON) -m reproduce.table table=$(TABLE) scale=$(SCALE) $(ARGS)

lint:
	$(PYTHON) -m ruff check .
