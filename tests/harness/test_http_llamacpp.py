"""The ``http`` engine against a server nobody here wrote: llama.cpp's OpenAI-compatible server
(``llama-cpp-python[server]``) serving the same SmolLM2 GGUF, benchmarked unchanged with
``--backend openai``. Slow (``make test-all``): llama-cpp-python compiles llama.cpp on install
(``make install-llamacpp``); ``SUPERINFER_REQUIRE_LLAMACPP=1`` makes a missing install an error.

llama.cpp's server streams no usage, so token counts rest on ``finish_reason: "length"``; its
prompt tokenization must agree with the client's (same GGUF vocabulary): both are checked through
the requests it finishes with exactly the requested length."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

pytest.importorskip("httpx_sse", reason="httpx-sse missing: run `make install-serve`")
pytest.importorskip("transformers", reason="transformers missing: run `make install-hf`")

from superinfer.cli import cli  # noqa: E402
from superinfer.harness.engines.peers import LLAMACPP_ALIAS, llamacpp_python, llamacpp_server  # noqa: E402

pytestmark = pytest.mark.slow

WORKLOAD = ["--trace", "azure", "--start-s", "77", "--rate-scale", "0.5", "--duration-s", "4",
            "--length-scale", "0.125", "--max-prompt-tokens", "64",
            "--max-output-tokens", "8"]  # fmt: skip


def test_llamacpp_server_benchmarked_unchanged_with_backend_openai(tmp_path: Path) -> None:
    if llamacpp_python() is None:
        if os.environ.get("SUPERINFER_REQUIRE_LLAMACPP"):
            pytest.fail("llama-cpp-python[server] missing: run `make install-llamacpp`")
        pytest.skip("llama-cpp-python[server] missing: run `make install-llamacpp`")
    out = tmp_path / "run"
    with llamacpp_server(log=tmp_path / "llamacpp.log") as url:
        args = ["bench", "--engine", "http", "--url", url, "--backend", "openai", *WORKLOAD,
                "--out", str(out)]  # fmt: skip
        result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    requests = pd.read_parquet(out / "requests.parquet")
    assert len(requests) == 19
    assert (requests["status"] == "finished").all(), requests[["request_id", "reason"]]
    assert (requests["generated_tokens"] == requests["output_tokens"]).all()
    cell = json.loads((out / "manifest.json").read_text())["cells"]["http/server"]
    assert cell["model"] == LLAMACPP_ALIAS and cell["eos_token_ids_banned"] == [0, 2]
    assert cell["server_prompt_tokens_off"]["requests_with_usage"] == 0  # no usage in streams
