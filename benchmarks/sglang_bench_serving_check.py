"""Our HTTP measurements against a client nobody here wrote: ``python -m sglang.bench_serving``.

On one real SGLang server (CPU recipe, tiny-Llama fixture, SGLang's own ``fcfs``), the same
requests are sent twice, once by each client:

* **superinfer**: ``replay_http`` with ``--backend sglang`` (the ``http`` engine of ``superinfer
  bench``, whose requests table is built by ``trace_requests_frame`` exactly as in
  ``run_http_cell``): TTFT and E2E from that table, ITL from the same records' token instants;
* **bench_serving**: ``python -m sglang.bench_serving --backend sglang --dataset-name custom``, a
  JSONL file holding the very prompt texts our client sent, ``--sharegpt-output-len`` the same
  output length (``ignore_eos``: exact), ``--output-details`` for its per-request numbers.

Both send one request at a time (ours: arrivals ``--gap-s`` apart, longer than a request takes;
bench_serving: ``--max-concurrency 1 --request-rate inf``), so each measures a lone request's
latency and any difference is the client's. The two runs alternate ``--rounds`` times (ours,
theirs, ours, theirs, ...) and pool, so a slow spell of a shared machine lands on both. Writes
``OUT/bench_serving_check.csv`` (``metric, percentile, superinfer_ms, bench_serving_ms,
rel_diff``; ``rel_diff = superinfer / bench_serving - 1``) and ``OUT/bench_serving_check.json``
(settings, both clients' raw summaries)::

    PYTHONPATH=src SUPERINFER_SGLANG_FIXTURE=/tmp/sgfix .venv/bin/python \\
        benchmarks/sglang_bench_serving_check.py --out results/sglang-cpu

Definitions (docs/metrics.md, "Against sglang.bench_serving"): TTFT is first token minus send
instant in both; E2E last token (ours) or the response's end (theirs) minus send; ITL the gaps
between consecutive streamed tokens, pooled over requests, in both.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from superinfer.adapters.sglang.fixture import ensure_fixture
from superinfer.adapters.sglang.server import SGLangServer, exit_on_sigterm
from superinfer.harness.engines.hf import trace_requests_frame
from superinfer.harness.engines.http import text_prompts
from superinfer.harness.engines.http_client import HTTPOptions
from superinfer.harness.engines.http_stream import replay_http
from superinfer.harness.workload.prompts import PromptBuilder, load_sharegpt_prompts
from superinfer.policy_core.types import SLO
from superinfer.sim.request import RequestSpec

PERCENTILES = (50, 99)


def our_requests(n: int, prompt: int, output: int, gap_s: float) -> list[RequestSpec]:
    """``n`` requests of ``prompt``/``output`` tokens, ``gap_s`` apart (the first at 1 s)."""
    slo = SLO("batch", deadline_s=600.0, priority=1)
    return [
        RequestSpec(f"r{i}", 1.0 + i * gap_s, prompt, output, output, slo, "check")
        for i in range(n)
    ]


def run_ours(url: str, specs: list[RequestSpec], prompts: list[str]) -> dict[str, list[float]]:
    """TTFT, E2E (per request) and ITL (pooled) in ms, as ``superinfer bench --engine http``."""
    run = replay_http(url, specs, prompts, backend="sglang", opts=HTTPOptions(), model="default")
    df = trace_requests_frame(run.records, {}, engine="http", policy="native")
    if (df["status"] != "finished").any():
        raise SystemExit(f"superinfer client: {sorted(set(df['reason']))}")
    itl = [
        (b - a) * 1e3
        for rec in run.records
        for a, b in zip(rec.token_times, rec.token_times[1:], strict=False)
    ]
    return {"ttft": list(df["ttft_ms"]), "e2e": list(df["e2e_ms"]), "itl": itl}


def run_theirs(
    url: str, prompts: list[str], output: int, tokenizer: str, work: Path, rnd: int
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """bench_serving's per-request TTFT, E2E and pooled ITL (ms), and its own summary."""
    data = work / f"prompts-{rnd}.jsonl"
    with data.open("w") as fh:
        for text in prompts:
            convs = [{"from": "human", "value": text}, {"from": "gpt", "value": "ok"}]
            fh.write(json.dumps({"conversations": convs}) + "\n")
    out = work / f"bench_serving-{rnd}.jsonl"
    cmd = [
        sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", url,
        "--dataset-name", "custom", "--dataset-path", str(data), "--num-prompts",
        str(len(prompts)), "--sharegpt-output-len", str(output), "--tokenizer", tokenizer,
        "--request-rate", "inf", "--max-concurrency", "1", "--output-file", str(out),
        "--output-details", "--disable-tqdm", "--seed", str(rnd),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ})
    if proc.returncode != 0 or not out.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        raise SystemExit(f"bench_serving failed ({proc.returncode}): {tail}")
    res = json.loads(out.read_text().strip().splitlines()[-1])
    ttft = [t * 1e3 for t in res["ttfts"]]
    e2e = [t * 1e3 for t in res["e2e_latencies"]] if "e2e_latencies" in res else []
    if not e2e:  # older field names: latency = ttft + sum(itl)
        e2e = [t * 1e3 + sum(i) * 1e3 for t, i in zip(res["ttfts"], res["itls"], strict=True)]
    itl = [g * 1e3 for gaps in res["itls"] for g in gaps]
    summary = {
        k: res[k]
        for k in (
            "median_ttft_ms",
            "p99_ttft_ms",
            "median_itl_ms",
            "p99_itl_ms",
            "median_e2e_latency_ms",
            "p99_e2e_latency_ms",
            "completed",
        )
        if k in res
    }
    return {"ttft": ttft, "e2e": e2e, "itl": itl}, summary


def compare(ours: dict[str, list[float]], theirs: dict[str, list[float]]) -> pd.DataFrame:
    """The check table: p50 and p99 of each metric from both clients (numpy's linear
    percentile, as bench_serving's ``np.percentile``)."""
    rows = []
    for metric in ("ttft", "itl", "e2e"):
        for q in PERCENTILES:
            a = float(np.percentile(ours[metric], q))
            b = float(np.percentile(theirs[metric], q))
            rows.append(
                {
                    "metric": metric,
                    "percentile": f"p{q}",
                    "superinfer_ms": round(a, 3),
                    "bench_serving_ms": round(b, 3),
                    "rel_diff": round(a / b - 1.0, 4),
                }
            )
    return pd.DataFrame(rows)


def main() -> int:
    """Command line; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/sglang-cpu")
    ap.add_argument("--requests", type=int, default=20, help="per client and round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--gap-s", type=float, default=2.5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from superinfer.adapters.hf.engine import load_smollm2_tokenizer

    tokenizer = load_smollm2_tokenizer()
    specs = our_requests(args.requests, args.prompt_tokens, args.output_tokens, args.gap_s)
    builder = PromptBuilder(tokenizer, load_sharegpt_prompts(), seed=args.seed)
    prompts, counts = text_prompts(tokenizer, builder, specs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-serving-check-"))
    server = SGLangServer("native", log_path=work / "sglang-native.log")
    server.start()
    ours: dict[str, list[float]] = {"ttft": [], "e2e": [], "itl": []}
    theirs: dict[str, list[float]] = {"ttft": [], "e2e": [], "itl": []}
    summaries = []
    begin = time.monotonic()
    try:
        # one unmeasured request first: the first forward pass compiles and allocates
        replay_http(server.url, specs[:1], prompts[:1], backend="sglang", model="default")
        for rnd in range(args.rounds):
            for key, vals in run_ours(server.url, specs, prompts).items():
                ours[key] += vals
            got, summary = run_theirs(
                server.url, prompts, args.output_tokens, str(ensure_fixture()), work, rnd
            )
            for key, vals in got.items():
                theirs[key] += vals
            summaries.append(summary)
            print(f"round {rnd} done ({time.monotonic() - begin:.0f} s)", flush=True)
    finally:
        server.stop()
    table = compare(ours, theirs)
    table.to_csv(out / "bench_serving_check.csv", index=False)
    facts = {
        "command": " ".join(sys.argv),
        "server": "sglang 0.5.23, CPU recipe, tiny-Llama fixture (dummy weights), --policy native",
        "requests_per_round": args.requests,
        "rounds": args.rounds,
        "prompt_tokens": args.prompt_tokens,
        "prompt_tokens_retokenized": sorted(set(counts)),
        "output_tokens": args.output_tokens,
        "superinfer": f"replay_http --backend sglang, arrivals {args.gap_s} s apart",
        "bench_serving": "--backend sglang --dataset-name custom --max-concurrency 1 "
        "--request-rate inf --output-details",
        "bench_serving_summaries": summaries,
        "n": {k: [len(ours[k]), len(theirs[k])] for k in ours},
        "wall_s": round(time.monotonic() - begin, 1),
    }
    (out / "bench_serving_check.json").write_text(json.dumps(facts, indent=2) + "\n")
    print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    exit_on_sigterm()
    raise SystemExit(main())
