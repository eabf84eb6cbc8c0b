# superinfer: `make bench` runs the main job on its default; `make test` installs and tests.
# Both create .venv on first use and (re)install when pyproject.toml changes.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: bench test test-all lint install clean fleet

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

# Ray (the `ray` extra, about 240 MB installed) for `--executor ray` and its slow test.
$(VENV)/.installed-ray: pyproject.toml $(VENV)/.installed-dev
	$(PIP) install -e '.[dev,ray]'
	@touch $@

install: $(VENV)/.installed-dev

bench: $(VENV)/.installed
	$(BIN)/superinfer bench

# results/fleet/: GPUs each policy needs on sim:trtllm and sim:sglang, shared vs separate
# clusters (about 20 minutes on 2 cores). `native` is each engine's own policy.
FLEET_POLICIES ?= native,superinfer
fleet: $(VENV)/.installed
	$(BIN)/superinfer fleet plan --workload azure --engines sim:trtllm,sim:sglang \
		--policies $(FLEET_POLICIES) --split --check-full --out results/fleet

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q

# Everything, slow tests included (installs the `ray` extra for the Ray executor test).
test-all: $(VENV)/.installed-ray
	$(BIN)/python -m pytest -q -m ""

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
