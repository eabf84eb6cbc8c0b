"""The real SmolLM2-135M-Instruct on the real SGLang CPU server: the same greedy text as the
``hf`` engine (issue 24). Slow (a ~270 MB conversion once, a 1-2 min server start): ``make
test-all``, after ``make install-smollm2-sglang``."""

from __future__ import annotations

import json
import urllib.request

import pytest

from superinfer.adapters.sglang.real_model import build_real_model, default_real_model_dir
from superinfer.adapters.sglang.server import SGLangServer

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
NEW_TOKENS = 16


def _model_dir():
    folder = default_real_model_dir()
    if not (folder / "model.safetensors").is_file():
        build_real_model(folder)  # what `make install-smollm2-sglang` does
    return folder


def test_sglang_greedy_tokens_equal_the_hf_engines(tmp_path) -> None:
    from superinfer.adapters.hf.engine import load_smollm2

    server = SGLangServer(
        "native", ["--model-path", str(_model_dir())], log_path=tmp_path / "s.log"
    )
    server.start()
    try:
        body = {"text": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": NEW_TOKENS}}
        req = urllib.request.Request(
            server.url + "/generate",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        out = json.loads(urllib.request.urlopen(req, timeout=300).read())
    finally:
        server.stop()
    lm = load_smollm2("float32")
    ids = lm.tokenizer(PROMPT, return_tensors="pt").input_ids
    ref = lm.model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)[0, ids.shape[1] :]
    assert out["output_ids"] == ref.tolist()
    assert out["text"].startswith(" Paris.")
