"""End-to-end TensorRT-LLM 1.2.x run of the adapter: the engine alone, Mode A, Mode B.

One seeded synthetic chat + batch workload (Poisson arrivals; chat prompts share a system prefix)
is replayed in real time against a fresh ``LLM`` per mode, and per-class latency and SLO
attainment are written to ``<out>/summary.csv`` with a ``manifest.json``:

- ``engine``: ``LLM.generate_async`` straight away (the engine's FIFO admission);
- ``gate``: Mode A, the front-end gate admitting in the policy's order;
- ``mode_b``: Mode B, the policy inside the executor's scheduler
  (``TLLM_WORKER_USE_SINGLE_PROCESS=1``).

Meant for a GPU machine with ``tensorrt_llm`` 1.2.x (``benchmarks/trtllm_e2e.sh`` checks and skips
elsewhere). The model defaults to a small Llama with dummy weights (``load_format="dummy"``), so
the latencies measure the scheduling, not a real model's quality. ``--double`` runs the same code
against the CPU test double (``tests/fakes/trtllm12``) to check the script itself; those numbers
are not GPU measurements and the rows say so.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import platform
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from superinfer.adapters.manager import build_plugin_manager
from superinfer.adapters.trtllm import plugin
from superinfer.adapters.trtllm.gate import TrtllmGate
from superinfer.adapters.trtllm.slo_table import InMemorySloTable
from superinfer.policy_core.types import SLO

ROOT = Path(__file__).resolve().parents[1]
CHAT = SLO("chat", ttft_ms=500.0, tpot_ms=50.0, priority=0)
BATCH = SLO("batch", deadline_s=120.0, priority=1)
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "num_hidden_layers": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
COLUMNS = (
    "engine",
    "mode",
    "policy",
    "slo_class",
    "n",
    "finished",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "slo_attainment",
    "output_tok_per_s",
    "hw",
)


@dataclass(frozen=True)
class Req:
    arrival_s: float
    slo: SLO
    prompt: list[int]
    max_tokens: int


def workload(n: int, rate: float, seed: int) -> list[Req]:
    """``n`` requests, Poisson at ``rate``/s; chat: 512-token shared prefix + 128, 64 out; batch:
    1024 unique prompt tokens, 256 out."""
    rng = random.Random(seed)
    system = [rng.randrange(3, 32000) for _ in range(512)]
    t, reqs = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        if rng.random() < 0.5:
            prompt = system + [rng.randrange(3, 32000) for _ in range(128)]
            reqs.append(Req(t, CHAT, prompt, 64))
        else:
            reqs.append(Req(t, BATCH, [rng.randrange(3, 32000) for _ in range(1024)], 256))
    return reqs


def _make_llm(args: argparse.Namespace, model_dir: str) -> Any:
    from tensorrt_llm import LLM
    from tensorrt_llm.llmapi import KvCacheConfig

    kv = KvCacheConfig(
        max_tokens=args.kv_tokens, enable_block_reuse=True, event_buffer_max_size=16384
    )
    if args.double:
        return LLM(
            "double", max_batch_size=args.max_batch_size, max_num_tokens=4096, kv_cache_config=kv
        )
    return LLM(
        model=model_dir,
        skip_tokenizer_init=True,
        load_format="dummy",
        max_batch_size=args.max_batch_size,
        max_num_tokens=4096,
        max_seq_len=2048,
        kv_cache_config=kv,
    )


async def _replay(
    reqs: list[Req], submit: Any, poll: Any = None
) -> list[tuple[Req, float, float, float, int]]:
    """Replay in real time; per request (req, arrival, first token, end, tokens) in s."""
    from tensorrt_llm import SamplingParams

    start = time.monotonic()

    async def one(r: Req) -> tuple[Req, float, float, float, int]:
        await asyncio.sleep(max(0.0, start + r.arrival_s - time.monotonic()))
        arrival, first, n = time.monotonic(), float("nan"), 0
        params = SamplingParams(max_tokens=r.max_tokens, end_id=2, pad_id=2, ignore_eos=True)
        async for out in submit(r, params):
            n = len(out.outputs[0].token_ids)
            if n and first != first:
                first = time.monotonic()
        return r, arrival, first, time.monotonic(), n

    poller = asyncio.create_task(poll()) if poll else None
    try:
        return await asyncio.gather(*(one(r) for r in reqs))
    finally:
        if poller:
            poller.cancel()


def run_mode(mode: str, args: argparse.Namespace, reqs: list[Req], model_dir: str) -> list[Any]:
    table = InMemorySloTable()
    if mode == "mode_b":
        plugin.install(build_plugin_manager(args.policy).hook, slo_table=table)
    try:
        llm = _make_llm(args, model_dir)
    finally:
        plugin.uninstall()
    try:
        if mode == "gate":
            gate = TrtllmGate(llm, build_plugin_manager(args.policy).hook)

            def submit(r: Req, params: Any) -> Any:
                return gate.generate(r.prompt, params, slo=r.slo)

            return asyncio.run(_replay(reqs, submit, gate.poll_forever))

        async def direct(r: Req, params: Any) -> Any:
            out = llm.generate_async(r.prompt, params, streaming=True)
            table.put(out.request_id, r.slo, time.monotonic())
            async for o in out:
                yield o

        return asyncio.run(_replay(reqs, direct))
    finally:
        llm.shutdown()


def summarize(mode: str, policy: str, results: list[Any], hw: str) -> list[dict[str, Any]]:
    rows = []
    wall = max(end for _, _, _, end, _ in results) - min(a for _, a, _, _, _ in results)
    for name in ("chat", "batch", "all"):
        sel = [x for x in results if name == "all" or x[0].slo.name == name]
        if not sel:
            continue
        ttft = np.array([(first - arr) * 1e3 for _, arr, first, _, _ in sel])
        tpot = np.array([(end - first) * 1e3 / (n - 1) for _, _, first, end, n in sel if n > 1])
        met = 0
        for r, arr, first, end, n in sel:
            ok = n == r.max_tokens
            ok &= r.slo.ttft_ms is None or (first - arr) * 1e3 <= r.slo.ttft_ms
            ok &= r.slo.tpot_ms is None or n < 2 or (end - first) * 1e3 / (n - 1) <= r.slo.tpot_ms
            ok &= r.slo.deadline_s is None or end - arr <= r.slo.deadline_s
            met += ok
        rows.append(
            {
                "engine": "trtllm",
                "mode": mode,
                "policy": policy if mode != "engine" else "native",
                "slo_class": name,
                "n": len(sel),
                "finished": sum(n > 0 for *_, n in sel),
                "ttft_p50_ms": round(float(np.percentile(ttft, 50)), 2),
                "ttft_p99_ms": round(float(np.percentile(ttft, 99)), 2),
                "tpot_p50_ms": round(float(np.percentile(tpot, 50)), 3) if tpot.size else "",
                "tpot_p99_ms": round(float(np.percentile(tpot, 99)), 3) if tpot.size else "",
                "slo_attainment": round(met / len(sel), 4),
                "output_tok_per_s": round(sum(n for *_, n in sel) / wall, 1),
                "hw": hw,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="HF checkpoint folder (default: a dummy-weight Llama)")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--rate", type=float, default=8.0, help="arrivals per second")
    p.add_argument("--policy", default="priority")
    p.add_argument("--modes", default="engine,gate,mode_b")
    p.add_argument("--max-batch-size", type=int, default=16)
    p.add_argument("--kv-tokens", type=int, default=32768)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "results" / "trtllm_e2e"))
    p.add_argument("--double", action="store_true", help="CPU test double (checks the script)")
    args = p.parse_args(argv)
    if args.double:
        sys.path.insert(0, str(ROOT / "tests" / "fakes" / "trtllm12"))
    os.environ.setdefault("TLLM_WORKER_USE_SINGLE_PROCESS", "1")  # Mode B patches this process
    import tensorrt_llm

    if args.double:
        hw = "double (CPU test double, not a GPU measurement)"
    else:
        import torch

        hw = torch.cuda.get_device_name(0)
    reqs = workload(args.requests, args.rate, args.seed)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or tmp
        if not args.model:
            Path(tmp, "config.json").write_text(json.dumps(TINY_LLAMA))
        for mode in args.modes.split(","):
            t0 = time.monotonic()
            results = run_mode(mode, args, reqs, model_dir)
            rows += summarize(mode, args.policy, results, hw)
            print(f"{mode}: {len(results)} requests in {time.monotonic() - t0:.1f} s", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    manifest = {
        "argv": sys.argv[1:] if argv is None else argv,
        "tensorrt_llm": tensorrt_llm.__version__,
        "hw": hw,
        "host": platform.node(),
        "python": platform.python_version(),
        "model": args.model or "dummy-weight Llama (benchmarks/trtllm_e2e.py TINY_LLAMA)",
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    for row in rows:
        print(",".join(str(row[c]) for c in COLUMNS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
