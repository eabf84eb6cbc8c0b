"""End to end on this machine: ``superinfer serve --engine hf`` started on 127.0.0.1 (a free port)
as its own process, benchmarked through ``superinfer bench --engine http`` with the real model.

Nineteen requests of both classes arrive over 4 s (a slice of the Azure mix with the code burst,
prompts up to 64 tokens, outputs up to 8): every one must finish with exactly its token count,
the server must have seen the same prompt lengths the client cut, and the server's own /metrics
must count each class's requests, which shows the SLO headers reached it. No timing is asserted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

#: Set any of these and a missing extra or model fails the test instead of skipping it (as
#: ``tests/adapters/hf/conftest.py``'s ``required()``; ``make test`` sets one).
REQUIRE_VARS = ("CI", "SUPERINFER_REQUIRE_HF", "SUPERINFER_REQUIRE_SGLANG")
REQUIRED = any(os.environ.get(name) for name in REQUIRE_VARS)

for _module, _hint in (("httpx_sse", "make install-serve"), ("uvicorn", "make install-serve"),
                       ("transformers", "make install-hf")):  # fmt: skip
    if REQUIRED:
        __import__(_module)
    else:
        pytest.importorskip(_module, reason=f"{_module} missing: run `{_hint}`")

from superinfer.cli import cli  # noqa: E402

#: The workload: Azure trace seconds 77-85 at half rate (4 s), lengths / 8, capped.
WORKLOAD = ["--trace", "azure", "--start-s", "77", "--rate-scale", "0.5", "--duration-s", "4",
            "--length-scale", "0.125", "--max-prompt-tokens", "64",
            "--max-output-tokens", "8"]  # fmt: skip


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from superinfer.adapters.hf.engine import ModelNotInstalledError, smollm2_gguf_path
    from superinfer.harness.engines.peers import superinfer_server

    try:
        smollm2_gguf_path()
    except ModelNotInstalledError as exc:
        if REQUIRED:
            raise
        pytest.skip(str(exc))
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with superinfer_server("priority", log=log) as url:
        yield url


def test_bench_through_http_against_superinfer_serve(served: str, tmp_path: Path) -> None:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    url = served
    out = tmp_path / "run"
    args = ["bench", "--engine", "http", "--url", url, "--backend", "openai", "--policies",
            "priority", *WORKLOAD, "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    requests = pd.read_parquet(out / "requests.parquet")
    assert len(requests) == 19
    assert (requests["status"] == "finished").all(), requests[["request_id", "reason"]]
    assert (requests["generated_tokens"] == requests["output_tokens"]).all()
    assert (requests["ttft_ms"] > 0).all() and (requests["e2e_ms"] >= requests["ttft_ms"]).all()
    summary = pd.read_csv(out / "summary.csv")
    every = summary[summary["slo_class"] == "all"].iloc[0]
    assert (every["engine"], every["policy"]) == ("http", "priority")
    assert every["n_requests"] == every["n_finished"] == 19 and every["n_failed"] == 0
    cell = json.loads((out / "manifest.json").read_text())["cells"]["http/priority"]
    assert cell["model"] == "smollm2-135m-instruct"
    assert cell["prompt_tokens_off"] == {"requests": 0, "max": 0}
    assert cell["server_prompt_tokens_off"] == {"requests_with_usage": 19, "differ": 0, "max": 0}
    assert "`http` (a live server at" in (out / "report.md").read_text()

    text = httpx.get(f"{url}/metrics", timeout=10).text
    ended = {
        (s.labels["slo_class"], s.labels["status"]): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "superinfer_requests_ended_total"
    }
    per_class = requests["slo_class"].value_counts().to_dict()
    assert per_class == {"batch": 12, "chat": 7}
    for name, count in per_class.items():
        assert ended[(name, "finished")] == count
        assert ended[(name, "failed")] == ended[(name, "rejected")] == 0
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200  # still serving
