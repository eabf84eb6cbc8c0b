"""Host time Mode B adds to one TensorRT-LLM scheduling step, measured on the CPU test double.

For ``N`` active requests, all decoding, it times ``schedule_request`` of the executor's own
``SimpleScheduler`` and of the ``SuperinferScheduler`` wrapped around it; the difference is what
the adapter adds per step. With ``max_repeat_steps=1`` the policy is asked at every step (views,
the policy call, the decision check, the reordering); with the policies' default (1024) a
decode-only decision is replayed while the active list is unchanged, as in a steady decode phase.
The double's inner scheduler is a Python reference of the C++ one, so only the difference carries
over to a real engine. Writes ``results/benchmarks/trtllm_adapter_overhead.csv``.

    .venv/bin/python benchmarks/trtllm_adapter_overhead.py [--sizes 8,64,256] [--repeats 200]
"""

from __future__ import annotations

import argparse
import csv
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fakes" / "trtllm12"))

from superinfer.adapters.manager import build_plugin_manager  # noqa: E402
from superinfer.adapters.trtllm import plugin  # noqa: E402
from superinfer.adapters.trtllm.slo_table import InMemorySloTable  # noqa: E402
from superinfer.policy_core.types import SLO  # noqa: E402

COLUMNS = (
    "policy",
    "max_repeat_steps",
    "active_requests",
    "inner_us",
    "wrapper_us",
    "overhead_us",
    "overhead_us_min",
    "repeats",
    "host",
    "note",
)


def _decoding_engine(policy: str, n: int, max_repeat_steps: int) -> Any:
    from tensorrt_llm.llmapi import LLM, KvCacheConfig, SamplingParams

    table = InMemorySloTable()
    pm = build_plugin_manager(policy, {"max_repeat_steps": str(max_repeat_steps)})
    plugin.install(pm.hook, slo_table=table)
    try:
        llm = LLM(
            "double",
            max_batch_size=n,
            max_num_tokens=64 * n,
            kv_cache_config=KvCacheConfig(max_tokens=2048 * n, tokens_per_block=32),
        )
    finally:
        plugin.uninstall()
    classes = (SLO("chat", ttft_ms=1000.0, priority=0), SLO("batch", deadline_s=600.0, priority=1))
    for i in range(n):
        out = llm.generate_async([i * 100 + t for t in range(64)], SamplingParams(max_tokens=1024))
        table.put(out.request_id, classes[i % 2])
    llm._fake_step()  # every request prefilled: all decoding from here on
    return llm._engine


def _time_us(schedule: Any, executor: Any, repeats: int) -> list[float]:
    """Per-call times of ``schedule(active_requests, inflight_req_ids)``, in µs."""
    active, inflight = executor.active_requests, executor.inflight_req_ids
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        schedule(active, inflight)
        samples.append((time.perf_counter() - t0) * 1e6)
    return samples


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="8,64,256")
    p.add_argument("--policies", default="fcfs,priority")
    p.add_argument("--max-repeat-steps", default="1,1024")
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument(
        "--out", default=str(ROOT / "results" / "benchmarks" / "trtllm_adapter_overhead.csv")
    )
    args = p.parse_args(argv)
    rows = []
    for policy in args.policies.split(","):
        for repeat in map(int, args.max_repeat_steps.split(",")):
            for n in map(int, args.sizes.split(",")):
                executor = _decoding_engine(policy, n, repeat)
                inner = _time_us(executor.scheduler.inner.schedule_request, executor, args.repeats)
                outer = _time_us(executor.scheduler.schedule_request, executor, args.repeats)
                med_in, med_out = statistics.median(inner), statistics.median(outer)
                rows.append(
                    {
                        "policy": policy,
                        "max_repeat_steps": repeat,
                        "active_requests": n,
                        "inner_us": round(med_in, 1),
                        "wrapper_us": round(med_out, 1),
                        "overhead_us": round(med_out - med_in, 1),
                        "overhead_us_min": round(min(outer) - min(inner), 1),
                        "repeats": args.repeats,
                        "host": f"{platform.node()} {platform.processor()}",
                        "note": "median (min: best case) of per-call times; CPU test double; "
                        "inner = "
                        "Python reference of the C++ schedulers",
                    }
                )
                print(",".join(str(rows[-1][c]) for c in COLUMNS[:7]), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
