# superinfer: `make bench` runs the main job on its default; `make test` installs and tests.
# Both create .venv on first use and (re)install when pyproject.toml changes.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: bench test test-all lint install install-sglang clean

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

# The SGLang adapter's CPU test environment (../shared/engines/sglang-0.5.md, section 5): the real
# sglang wheel without its dependencies (it pins torch 2.14.1, a multi-GB CUDA build), the local CPU
# torch 2.13.0 forced by a constraint file, the modules' own imports from the `sglang` extra, and a
# .pth hook that stands in for torchvision (whose PyPI wheel needs CUDA torch) when sglang imports it.
SGLANG_PIN := sglang==0.5.23
$(VENV)/.installed-sglang: pyproject.toml $(VENV)/.installed-dev
	echo 'torch==2.13.0' > $(VENV)/torch-constraint.txt
	PIP_CONSTRAINT=$(CURDIR)/$(VENV)/torch-constraint.txt $(PIP) install -e '.[dev,sglang]'
	PIP_CONSTRAINT=$(CURDIR)/$(VENV)/torch-constraint.txt $(PIP) install --no-deps $(SGLANG_PIN)
	$(BIN)/python -c 'from superinfer.adapters.sglang.cpu_compat import install_pth; print(install_pth())'
	@touch $@

install-sglang: $(VENV)/.installed-sglang

bench: $(VENV)/.installed
	$(BIN)/superinfer bench

# The SGLang adapter's tests run against the real sglang wheel, installed once into .venv (stamp
# file; about 3.5 min and 3 GB the first time); SUPERINFER_REQUIRE_SGLANG makes a missing install
# an error instead of a skip.
test: $(VENV)/.installed-sglang
	SUPERINFER_REQUIRE_SGLANG=1 $(BIN)/python -m pytest -q

# Everything, slow tests included.
test-all: $(VENV)/.installed-sglang
	SUPERINFER_REQUIRE_SGLANG=1 $(BIN)/python -m pytest -q -m ""

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
