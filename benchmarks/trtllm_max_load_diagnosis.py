"""Why TensorRT-LLM's max-load throughput misses its p90 target: the rows, instrumented (issue 19).

``results/fidelity/published.csv`` scores TensorRT-LLM's published max-load throughput at a p90
|rel_err| above 20%, with the misses in three clusters. This script checks two of them by running
the calibration's own simulation of each row (``calibrate_published_sim``: same release profile,
costs in ``sim/engine_costs.json``, same shortened request count, ``fcfs``) one iteration per step
(``max_repeat_steps`` 1, which yields the same throughput) and recording every step:

* the 70B FP8 runs on one H100 with long outputs (rows 29-39): is admission KV-bound, and what
  per-step time would the published number need?
* the 8B FP8 128/128 runs (rows 1, 2, 483, 484): batch reached, KV use, time in mixed steps.

Per row it prints (units in the column names): published and simulated output tok/s and their
rel_err; KV capacity in blocks and tokens and the requests whose whole prompt + output fit
(``GUARANTEED_NO_EVICT`` reserves that much per request); peak blocks used; the running requests
per step (weighted by step time); the share of time in steps that run a prefill chunk and their
mean tokens; the mean decode-only step (ms) and its batch; that step's HBM roofline (weights +
KV read at the GPU's peak bandwidth, ms); and ``pub_step_ms``: the longest decode step the
published throughput allows at the simulated batch (batch / published tok/s; a bound only where
prefill takes little of the time). Then what ``trtllm-bench``'s build heuristic would
have chosen for ``max_batch_size`` / ``max_num_tokens`` and its estimate of the requests in KV
(TensorRT-LLM ``tensorrt_llm/bench/build/tuning.py``, ``calc_engine_setting`` and
``finetune_setting``: requests = (NVML total GiB - params x bytes per weight) x 0.95 over the KV
GiB of ISL + OSL tokens; batch = that, capped at 4,096, rounded up to a multiple of 32 (at least
64) below 256, of 128 below 1,024, else of 256; tokens = batch x (1 + ISL / OSL), at most
32,768, rounded up to a multiple of 256 (at least 2,048), 512 or 1,024), and the rows
re-simulated with profile variants (:data:`VARIANTS`). Last, the published and simulated
H200 / H100 throughput ratio of every setup run on both (from ``results/fidelity/published.csv``).

Prints only; writes nothing. Usage (about 8 minutes on 2 shared cores)::

    python benchmarks/trtllm_max_load_diagnosis.py [--rows 29,31,...] [--no-variants]
"""

from __future__ import annotations

import argparse
import csv
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from superinfer.adapters.manager import build_plugin_manager
from superinfer.harness.offline.calibrate_published_sim import (
    _num_requests,
    _requests,
    load_rows,
    setup_of,
)
from superinfer.harness.workload.data import data_dir
from superinfer.sim.calibrated import default_step_time
from superinfer.sim.config import SimConfig, dtype_bytes, kv_capacity_blocks
from superinfer.sim.engine import Simulator
from superinfer.sim.engine_costs import EngineStepTime, load_costs
from superinfer.sim.hardware import get_gpu, get_model
from superinfer.sim.request import RequestStatus
from superinfer.sim.step_time import BatchShape
from superinfer.sim.versions import get_version

#: Cluster (2): 70B FP8, one H100 (and the H200 128/2048 row for contrast); cluster (3): 8B FP8
#: 128/128 on H200 and H100, releases 0.17 and 0.21 (``shared/data/published/engine_perf.csv``).
DEFAULT_ROWS = (29, 31, 33, 35, 37, 39, 30, 1, 2, 483, 484)
#: Profile variants: (name, ``EngineProfile`` overrides, rows it is run on); ``None``: each
#: row's own ``trtllm-bench`` limits (:func:`bench_heuristic`).
VARIANTS: tuple[tuple[str, dict[str, Any] | None, tuple[int, ...]], ...] = (
    ("trtllm-bench limits", None, (29, 31, 33, 35, 37, 39, 1, 2, 484)),
    # Every byte of HBM beside the weights as KV: the most KV one 80 GB H100 can hold.
    ("kv=all free HBM", {"activation_reserve_bytes": 0, "memory_fraction": 1.0}, (31, 35)),
    # trtllm-bench's heuristic for these setups (printed below): max_batch_size 4,096.
    ("max_batch 4096", {"max_num_seqs": 4096, "max_num_seqs_large_gpu": 4096}, (1, 2, 484)),
    # The 0.17 sample output of perf-benchmarking.md (shared/data/published/README.md):
    # runtime max batch 2,048, max tokens 4,096.
    ("max_tokens 4096", {"token_budget": 4096, "token_budget_large_gpu": 4096}, (1, 2, 484)),
)
_GIB = 1024**3


class _Steps:
    """A step time that records ``(step_s, gpu_s, num_seqs, prefill_tokens, decode_kv_tokens,
    num_tokens)`` per step."""

    def __init__(self, inner: EngineStepTime) -> None:
        self.inner = inner
        self.steps: list[tuple[float, float, int, int, float, int]] = []

    def step_time_s(self, shape: BatchShape) -> float:
        t = float(self.inner.step_time_s(shape))
        if shape.num_tokens:
            self.steps.append((t, self.inner.gpu_s(shape), shape.num_seqs, shape.prefill_tokens,
                               shape.decode_kv_tokens, shape.num_tokens))  # fmt: skip
        return t

    def decode_coefficients(self, num_seqs: int) -> tuple[float, float]:
        a, b = self.inner.decode_coefficients(num_seqs)
        return float(a), float(b)


def run_row(row: dict[str, str], overrides: dict[str, Any] | None = None) -> dict[str, float]:
    """Simulate one published row as the calibration does, one iteration per step; its numbers."""
    setup, why = setup_of(row)
    if setup is None:
        raise ValueError(f"row {row['row_id']}: {why}")
    profile = replace(get_version(setup.release), **(overrides or {}))
    model, gpu = get_model(setup.model), get_gpu(setup.gpu)
    config = SimConfig(profile, model, gpu, tp=setup.tp, weight_dtype=setup.weight_dtype,
                       kv_dtype=setup.kv_dtype)  # fmt: skip
    kernels = default_step_time(model, gpu, setup.tp, weight_bytes=dtype_bytes(setup.weight_dtype),
                                kv_bytes=dtype_bytes(setup.kv_dtype))  # fmt: skip
    step = _Steps(EngineStepTime(kernels, profile, setup.weight_dtype, load_costs()))
    base = data_dir()
    assert base is not None
    specs = _requests(setup, _num_requests(setup, config), base)
    pm = build_plugin_manager(profile.native_policy, {"max_repeat_steps": 1})
    result = Simulator(config, pm.hook, step_time=step).run(specs)
    done = [r for r in result.requests if r.status is RequestStatus.FINISHED]
    span = max(r.finish_s for r in done) - min(r.spec.arrival_s for r in done)
    tok_s = sum(r.generated_tokens for r in done) / span
    cap = kv_capacity_blocks(profile, model, gpu, setup.tp, setup.weight_dtype, setup.kv_dtype)
    per_req = math.ceil((setup.isl + setup.osl) / profile.block_size_tokens)
    st = np.array(step.steps)
    dec = st[st[:, 3] == 0]
    published = float(row["value"])
    out = {
        "published_tok_s": published, "sim_tok_s": tok_s, "rel_err": tok_s / published - 1,
        "kv_blocks": cap, "kv_tokens": cap * profile.block_size_tokens,
        "fit_requests": cap // per_req, "peak_blocks": float(result.peak_kv_blocks[0]),
        "running_per_step": float(np.average(st[:, 2], weights=st[:, 0])),
        "prefill_time_share": float(st[st[:, 3] > 0, 0].sum() / st[:, 0].sum()),
        "mixed_step_tokens": float(st[st[:, 3] > 0, 5].mean()),
    }  # fmt: skip
    if len(dec):
        w_bytes = model.weight_bytes(dtype_bytes(setup.weight_dtype)) / setup.tp
        kv_bytes = float(dec[:, 4].mean()) * model.kv_bytes_per_token(2.0) / setup.tp
        batch = float(dec[:, 2].mean())
        out |= {"decode_step_ms": 1e3 * float(dec[:, 0].mean()), "decode_batch": batch,
                "roofline_ms": 1e3 * (w_bytes + kv_bytes) / gpu.peak_mem_bw_bytes_s,
                "pub_step_ms": 1e3 * batch / published}  # fmt: skip
    return out


def bench_heuristic(row: dict[str, str]) -> tuple[float, int, int]:
    """``trtllm-bench``'s build estimate for a row: (requests in KV, max_batch_size,
    max_num_tokens); see the module docstring for the source."""
    setup, _ = setup_of(row)
    assert setup is not None
    model, gpu = get_model(setup.model), get_gpu(setup.gpu)
    wb, kb = dtype_bytes(setup.weight_dtype), dtype_bytes(setup.kv_dtype)
    free_gib = gpu.memory_bytes / _GIB * setup.tp - model.num_params / 1e9 * wb
    kv_gib_per_token = 2 * model.num_layers * max(setup.tp, model.num_kv_heads) * model.head_dim \
        * kb / _GIB  # fmt: skip
    requests = free_gib * 0.95 / kv_gib_per_token / (setup.isl + setup.osl)
    bs = min(requests, 4096)
    step = 32 if bs < 256 else 128 if bs < 1024 else 256
    max_bs = max(64, step * math.ceil(bs / step)) if bs < 256 else step * math.ceil(bs / step)
    tokens = min(bs * (1 + setup.isl / setup.osl), 32768)
    unit = 256 if tokens < 4096 else 512 if tokens < 8192 else 1024
    max_tokens = max(2048, unit * math.ceil(tokens / unit))
    return requests, max_bs, max_tokens


def _limits(row: dict[str, str]) -> dict[str, Any]:
    """``EngineProfile`` overrides with the row's ``trtllm-bench`` batch and token limits."""
    _, bs, tok = bench_heuristic(row)
    return {"max_num_seqs": bs, "max_num_seqs_large_gpu": bs, "token_budget": tok,
            "token_budget_large_gpu": tok}  # fmt: skip


def _fmt(x: float) -> str:
    return f"{x:.3f}" if abs(x) < 10 else f"{x:,.1f}"


def gpu_ratios(path: Path) -> list[tuple[str, float, float]]:
    """(setup without GPU, published H200/H100, simulated H200/H100) from ``published.csv``."""
    by: dict[str, dict[str, tuple[float, float]]] = {}
    with path.open(newline="") as fh:
        for r in csv.DictReader(fh):
            s = r["setup"].split()
            if r["engine"] != "trtllm" or r["metric"] != "total_output_tok_s" or "inf" not in s:
                continue
            key = " ".join(s[:3] + s[4:6])
            by.setdefault(key, {})[s[3]] = (float(r["published"]), float(r["simulated"]))
    return [(k, v["h200"][0] / v["h100-80gb"][0], v["h200"][1] / v["h100-80gb"][1])
            for k, v in sorted(by.items()) if "h200" in v and "h100-80gb" in v]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(map(str, DEFAULT_ROWS)))
    ap.add_argument("--no-variants", action="store_true")
    ap.add_argument("--csv", default="results/fidelity/published.csv")
    args = ap.parse_args()
    rows = {int(r["row_id"]): r for r in load_rows()}
    ids = [int(x) for x in args.rows.split(",")]
    for rid in ids:
        setup, _ = setup_of(rows[rid])
        label = setup.label if setup else "?"
        nums = run_row(rows[rid])
        req, bs, tok = bench_heuristic(rows[rid])
        print(f"row {rid} {label}")
        print("   " + "  ".join(f"{k}={_fmt(v)}" for k, v in nums.items()))
        print(f"   trtllm-bench heuristic: {req:,.1f} requests in KV, max_batch_size {bs}, "
              f"max_num_tokens {tok}")  # fmt: skip
    if not args.no_variants:
        for name, over, vrows in VARIANTS:
            for rid in vrows:
                nums = run_row(rows[rid], over if over is not None else _limits(rows[rid]))
                print(f"variant {name!r} row {rid}: sim_tok_s={nums['sim_tok_s']:,.1f} "
                      f"rel_err={nums['rel_err']:+.3f} kv_tokens={nums['kv_tokens']:,.0f} "
                      f"running_per_step={nums['running_per_step']:.1f}")  # fmt: skip
    ratios = gpu_ratios(Path(args.csv))
    above = sum(s > p for _, p, s in ratios)
    print(f"H200/H100 throughput ratio: simulated above published on {above} of {len(ratios)} "
          "setups run on both")  # fmt: skip
    for key, p, s in ratios:
        if "128/128" in key and "8b" in key:
            print(f"   {key}: published {p:.3f}, simulated {s:.3f}")


if __name__ == "__main__":
    main()
