"""``superinfer conform`` against llama.cpp's server (``llama-cpp-python[server]``, the SmolLM2
GGUF), a peer nobody here wrote. Slow (``make test-all``); ``SUPERINFER_REQUIRE_LLAMACPP=1``
makes a missing install an error. Only what does not rest on timing is asserted: every scenario
reports, what HTTP cannot expose is ``not observable``, the preemption scenario's requests all
finish, and llama.cpp (which has no priority) is not found to have the opposite polarity."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("httpx_sse", reason="httpx-sse missing: run `make install-serve`")
pytest.importorskip("transformers", reason="transformers missing: run `make install-hf`")

from superinfer.harness.conform.runner import conform_rows, open_target  # noqa: E402
from superinfer.harness.conform.scenarios import scenario_names  # noqa: E402
from superinfer.harness.engines.base import BenchConfig  # noqa: E402
from superinfer.harness.engines.peers import llamacpp_python  # noqa: E402

pytestmark = pytest.mark.slow


def test_conform_on_llamacpp(tmp_path: Path) -> None:
    if llamacpp_python() is None:
        if os.environ.get("SUPERINFER_REQUIRE_LLAMACPP"):
            pytest.fail("llama-cpp-python[server] missing: run `make install-llamacpp`")
        pytest.skip("llama-cpp-python[server] missing: run `make install-llamacpp`")
    with open_target("llamacpp", "server", BenchConfig(), log_dir=tmp_path) as target:
        rows = {r["scenario"]: r for r in conform_rows(target)}
    assert list(rows) == scenario_names()
    for name in ("readmission_order", "recompute_excess", "kv_retention"):
        assert rows[name]["passed"] == "not observable", rows[name]
    assert rows["chunked_prefill_preemption"]["value"] == 0, rows["chunked_prefill_preemption"]
    assert rows["priority_polarity"]["value"] in (0, 1), rows["priority_polarity"]
    assert rows["fields_honoured"]["passed"] == "info"  # not our policy: nothing declared
