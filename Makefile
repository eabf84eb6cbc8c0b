# superinfer: `make bench` runs the main job on its default; `make test` installs and tests.
# Both create .venv on first use and (re)install when pyproject.toml changes.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: bench test test-all lint install clean cache-eval

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Base install (what `make bench` needs).
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(PIP) install -e .
	@touch $@

# KV reuse: LRU, LFU, the reuse predictor and Belady on the Mooncake trace -> results/cache/.
cache-eval: $(VENV)/.installed
	$(BIN)/superinfer cache-eval --trace mooncake --out results/cache

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
