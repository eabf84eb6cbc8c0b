"""Fit the engines' own step costs to published measurements, and score them on the rest.

Input: ``shared/data/published/engine_perf.csv`` (562 published numbers of TensorRT-LLM, SGLang and
vLLM, each with its source and version; README there). Every row the simulator can reproduce
becomes a *setup* (engine release, model, dtypes, GPU, TP, lengths or dataset, arrival rate,
number of prompts), simulated with that release's profile (``sim.versions``) under its native
policy (``fcfs``), so the published number and the simulated one sit side by side.

What is fitted (written to ``sim/engine_costs.json``, read by ``sim.engine_costs``); the setups
and the simulated quantities are ``calibrate_published_sim``'s:

* ``cpu[release]``: per-step CPU time ``c0 + c_seq n`` of vLLM 0.5.4 and SGLang 0.2.13, by
  non-negative least squares on relative error against the published per-iteration schedule
  times (WukLab). The prediction of a row is the mean over the simulated iterations of
  ``(c0 + c_seq n_i) / K_i`` (``K_i``: the multi-step divisor on decode-only iterations), which is
  linear in ``(c0, c_seq)``.
* ``kernel_scale[engine][dtype]``: a multiplier on the calibrated kernels' GPU time, the geometric
  mean over the fit rows of ``simulated / published`` max-load throughput and of ``published /
  simulated`` per-iteration forward time, refined once on the fit rows.
* For the releases of :data:`ONLINE_KERNEL_FIT` (SGLang 0.3.0): the kernel scale from their
  lowest-rate online TPOT and the per-running-request CPU from their max-load fit rows
  (:func:`_fit_online_kernels`).
* ``request_latency_s[release]``: time outside the step loop that a client-side TTFT includes
  (:func:`_fit_request_latency`), added to every simulated TTFT and E2E of that release.

The split is deterministic: rows that feed a fit (max-load output throughput, per-iteration
forward and schedule times) are grouped by (engine release family, dtype, metric), sorted by
``row_id``, and alternate ``fit`` (even position) / ``score`` (odd); of the online runs, the TTFT
rows (and the TPOT rows of :data:`ONLINE_KERNEL_FIT` releases) at the lowest published rate of
each (release, model, GPU, TP, lengths) with two rates or more are ``fit``; every other simulated
row is ``score``; rows the simulator cannot reproduce are ``unsupported`` with the reason in the
report.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from superinfer.harness.errors import DataError
from superinfer.harness.offline.calibrate_published_sim import (
    Setup,
    _metric_key,
    load_rows,
    median_itl_s,
    setup_of,
    simulate,
)
from superinfer.harness.workload.data import data_dir
from superinfer.sim.engine_costs import load_costs
from superinfer.sim.versions import get_version

__all__ = ["CSV_COLUMNS", "ONLINE_KERNEL_FIT", "Setup", "costs_json", "fit_published",
           "load_rows", "median_itl_s", "setup_of", "simulate", "summary_table",
           "with_request_latency", "write_csv", "write_published"]  # fmt: skip

CSV_COLUMNS = ("source_row", "engine", "setup", "metric", "published", "simulated", "rel_err",
               "split")  # fmt: skip
_FIT_METRICS = ("total_output_tok_s", "output_tok_s_per_gpu", "per_iter_forward_ms",
                "per_iter_schedule_ms")  # fmt: skip


@dataclass
class _Row:
    row: dict[str, str]
    setup: Setup
    metric: str
    split: str = "score"
    simulated: float | None = None

    @property
    def published(self) -> float:
        return float(self.row["value"])


def _kernel_group(r: _Row) -> tuple[str, str]:
    family = _FAMILY.get(r.setup.release, {})
    key = family.get("kernel_key") or get_version(r.setup.release).kernel_key
    return key, r.setup.weight_dtype


#: Releases whose kernel scale is fitted on their own lowest-rate online TPOT rows (small decode
#: batches), with their max-load fit rows fitting a per-running-request CPU term instead of the
#: scale. The ``sglang`` scale is fitted on 0.2.13's per-iteration forward times (rows 679-716:
#: max-load runs, large batches with 512-token prefill chunks); SGLang 0.3.0's online runs decode
#: small batches (with ``--enable-torch-compile`` for the 8B model, rows 608-619; row 678: up to
#: 1.5x lower latency at small batch; that this is why its fitted scale is lower is our reading,
#: not a measurement), and 0.3.0 has no overlap scheduler (row 677), so the per-request work of
#: a step (output processing, streaming) is taken to be paid in full at large batches.
ONLINE_KERNEL_FIT = ("sglang-0.3.0",)
#: How a release is simulated while its engine family's shared terms (kernel scale, CPU) are
#: fitted, where that differs from its own profile: as the shipped fit (6382d15) simulated it,
#: so that the family terms (``sim:vllm`` uses ``vllm``'s, the ``sim:sglang@0.2.13`` release
#: profile ``sglang``'s; ``sim:sglang`` takes 0.3.0's own terms, ``sim.profiles.SIM_SGLANG``) are
#: unchanged by the release-only mechanics added since: SGLang 0.3.0 costed with the family's
#: keys (its own terms are fitted afterwards), vLLM 0.6.0 ending a run at its first finish.
#: Re-fitting the family terms with those mechanics moves those profiles' costs and every
#: result built on them (left for a full rerun of the results).
_FAMILY: dict[str, dict[str, Any]] = {
    "sglang-0.3.0": {"kernel_key": "sglang", "cpu_key": "sglang-0.2.13"},
    "vllm-0.6.0": {"repeat_past_finish": False},
}
_TTFT_METRICS = ("ttft_ms:p50", "ttft_ms:mean")
_LOAD_METRICS = ("total_output_tok_s", "output_tok_s_per_gpu")


def _online_run(s: Setup) -> tuple[Any, ...]:
    """What one family of online runs shares: all but the arrival rate."""
    return (s.release, s.model, s.gpu, s.tp, s.isl, s.osl, s.weight_dtype)


def _split(rows: list[_Row]) -> None:
    groups: dict[tuple[str, ...], list[_Row]] = defaultdict(list)
    for r in rows:
        if r.metric in _FIT_METRICS and (r.setup.rate is None):
            key = r.setup.release if r.metric == "per_iter_schedule_ms" else _kernel_group(r)
            groups[(*key, r.metric) if isinstance(key, tuple) else (key, r.metric)].append(r)
    for members in groups.values():
        for i, r in enumerate(sorted(members, key=lambda x: int(x.row["row_id"]))):
            r.split = "fit" if i % 2 == 0 else "score"
    # Online runs: the lowest published rate of each (release, model, GPU, TP, lengths) fits the
    # request-path latency (its TTFT rows) and, for ONLINE_KERNEL_FIT releases, the kernel
    # scale (its TPOT row); the higher rates are scored.
    rates: dict[tuple[Any, ...], set[float]] = defaultdict(set)
    for r in rows:
        if r.setup.rate is not None:
            rates[_online_run(r.setup)].add(r.setup.rate)
    for r in rows:
        s = r.setup
        seen = rates.get(_online_run(s), set())
        if s.rate is None or len(seen) < 2 or s.rate != min(seen):
            continue
        if r.metric in _TTFT_METRICS or (
            r.metric == "tpot_ms:p50" and s.release in ONLINE_KERNEL_FIT
        ):
            r.split = "fit"


def _run_all(rows: list[_Row], costs: dict[str, Any], base: Path,
             progress: Callable[[str], None] | None, only_fit: bool = False,
             family: bool = False) -> dict[Setup, dict[str, float]]:  # fmt: skip
    setups = sorted({r.setup for r in rows if not only_fit or r.split == "fit"},
                    key=lambda s: s.label)  # fmt: skip
    out: dict[Setup, dict[str, float]] = {}
    for i, s in enumerate(setups):
        if progress:
            progress(f"[{i + 1}/{len(setups)}] {s.label}")
        try:
            out[s] = simulate(s, costs, base, _FAMILY.get(s.release) if family else None)
        except ValueError as exc:  # the model does not fit
            out[s] = {"_error": str(exc)}  # type: ignore[dict-item]
    return out


def _fit_cpu(rows: list[_Row], sims: dict[Setup, dict[str, float]]) -> dict[str, Any]:
    from scipy.optimize import nnls

    cpu: dict[str, Any] = {}
    by_release: dict[str, list[_Row]] = defaultdict(list)
    for r in rows:
        if r.metric == "per_iter_schedule_ms" and r.split == "fit" and "_cpu_a" in sims[r.setup]:
            by_release[r.setup.release].append(r)
    for release, members in sorted(by_release.items()):
        a = np.array([[sims[r.setup]["_cpu_a"], sims[r.setup]["_cpu_b"]] for r in members])
        y = np.array([r.published / 1e3 for r in members])
        coef, _ = nnls(a / y[:, None], np.ones(len(y)))
        cpu[release] = {"intercept_s": float(coef[0]), "per_seq_s": float(coef[1]),
                        "fit_rows": [int(r.row["row_id"]) for r in members]}  # fmt: skip
    return cpu


def _kernel_ratios(rows: list[_Row], sims: dict[Setup, dict[str, float]]
                   ) -> dict[tuple[str, str], list[float]]:  # fmt: skip
    ratios: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        if r.split != "fit" or r.metric not in _FIT_METRICS or r.metric == "per_iter_schedule_ms":
            continue
        sim = sims[r.setup].get(r.metric)
        if not sim:
            continue
        forward = r.metric == "per_iter_forward_ms"
        ratios[_kernel_group(r)].append(r.published / sim if forward else sim / r.published)
    return ratios


def _fit_online_kernels(rows: list[_Row], costs: dict[str, Any], base: Path,
                        progress: Callable[[str], None] | None, rounds: int = 3,
                        ) -> None:  # fmt: skip
    """Fit each :data:`ONLINE_KERNEL_FIT` release's kernel scale and per-request CPU in place.

    Alternates, ``rounds`` times: the scale times the geometric mean of ``published / simulated``
    TPOT over the release's fit TPOT rows (a fixed-point step of ``TPOT = scale x GPU + CPU``),
    then the per-running-request CPU ``c_seq`` moved so that the mean simulated step of its
    max-load fit rows lasts ``simulated / published`` throughput times as long (``c_seq +=
    step x (ratio - 1) / mean running requests``, floored at 0). The intercept is the
    family's (:data:`_FAMILY`).
    """
    for release in ONLINE_KERNEL_FIT:
        mine = [r for r in rows if r.setup.release == release and r.split == "fit"]
        tpot = [r for r in mine if r.metric == "tpot_ms:p50"]
        load = [r for r in mine if r.metric in _LOAD_METRICS and r.setup.rate is None]
        if not tpot or not load:
            continue
        profile = get_version(release)
        dtype = tpot[0].setup.weight_dtype
        c0 = float(costs["cpu"].get(_FAMILY[release]["cpu_key"], {}).get("intercept_s", 0.0))
        scale, c_seq = 1.0, 0.0
        for i in range(rounds):
            costs["kernel_scale"][profile.kernel_key] = {dtype: scale}
            costs["cpu"][profile.cpu_key] = {"intercept_s": c0, "per_seq_s": c_seq}
            sims = {s: simulate(s, _numbers(costs), base) for s in {r.setup for r in tpot}}
            scale *= _geomean([r.published / sims[r.setup][r.metric] for r in tpot])
            costs["kernel_scale"][profile.kernel_key] = {dtype: scale}
            sims = {s: simulate(s, _numbers(costs), base) for s in {r.setup for r in load}}
            ratio = _geomean([sims[r.setup][r.metric] / r.published for r in load])
            m = sims[load[0].setup]
            step = m["per_iter_forward_ms"] / 1e3 + c0 * m["_cpu_a"] + c_seq * m["_cpu_b"]
            c_seq = max(0.0, c_seq + step * (ratio - 1.0) / m["_cpu_b"])
            if progress:
                progress(f"online fit {release} round {i + 1}: scale {scale:.4f}, "
                         f"c_seq {1e6 * c_seq:.2f} us (throughput ratio {ratio:.4f})")  # fmt: skip
        costs["kernel_scale"][profile.kernel_key] = {dtype: scale}
        costs["cpu"][profile.cpu_key] = {
            "intercept_s": c0, "per_seq_s": c_seq,
            "fit_rows": sorted(int(r.row["row_id"]) for r in tpot + load),
        }  # fmt: skip


def _fit_request_latency(rows: list[_Row], sims: dict[Setup, dict[str, float]]
                         ) -> dict[str, Any]:  # fmt: skip
    """Per release: the time a request spends outside the engine's step loop (HTTP, tokenizing,
    hand-off to the scheduler, detokenizing: what ``bench_serving``'s client-side TTFT includes
    and a simulated step loop does not), the median over its fit TTFT rows of ``published -
    simulated``, floored at 0, in s."""
    gaps: dict[str, list[float]] = defaultdict(list)
    rows_of: dict[str, list[int]] = defaultdict(list)
    for r in rows:
        if r.split == "fit" and r.metric in _TTFT_METRICS and r.metric in sims[r.setup]:
            gaps[r.setup.release].append((r.published - sims[r.setup][r.metric]) / 1e3)
            rows_of[r.setup.release].append(int(r.row["row_id"]))
    return {release: {"s": max(0.0, float(np.median(g))), "fit_rows": sorted(rows_of[release])}
            for release, g in sorted(gaps.items())}  # fmt: skip


def with_request_latency(m: dict[str, float], latency_s: float) -> dict[str, float]:
    """``m`` with ``latency_s`` added to every request's TTFT and E2E (their mean and median
    shift by exactly that much); other metrics unchanged."""
    out = dict(m)
    for key in ("ttft_ms:mean", "ttft_ms:p50", "e2e_latency_ms:p50"):
        if key in out:
            out[key] += 1e3 * latency_s
    return out


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


_Unsupported = list[tuple[dict[str, str], str]]


def fit_published(base: Path | None = None, progress: Callable[[str], None] | None = None
                  ) -> tuple[list[_Row], _Unsupported, dict[str, Any]]:  # fmt: skip
    """Fit the cost parameters and simulate every supported row with them.

    Returns:
        ``(rows, unsupported, costs)``: the simulated rows (split and simulated value set), the
        rows not simulated with the reason, and the fitted parameters (``engine_costs.json``).

    Raises:
        DataError: the shared data is missing.
    """
    if base is None:
        base = data_dir()
        if base is None:
            raise DataError("no shared data folder found (set SUPERINFER_DATA)")
    rows: list[_Row] = []
    unsupported: list[tuple[dict[str, str], str]] = []
    for raw in load_rows(base / "published" / "engine_perf.csv"):
        metric = _metric_key(raw)
        setup, why = setup_of(raw)
        if metric is None:
            unsupported.append((raw, f"metric {raw['metric']!r} is not simulated"))
        elif setup is None:
            unsupported.append((raw, why))
        else:
            rows.append(_Row(raw, setup, metric))
    _split(rows)
    start: dict[str, Any] = {"cpu": {}, "kernel_scale": {}}
    first = _run_all(rows, start, base, progress, only_fit=True, family=True)
    costs: dict[str, Any] = {"cpu": _fit_cpu(rows, first), "kernel_scale": {}}
    for (key, dtype), ratios in sorted(_kernel_ratios(rows, first).items()):
        costs["kernel_scale"].setdefault(key, {})[dtype] = _geomean(ratios)
    if progress:
        progress(f"first fit: {json.dumps(costs, sort_keys=True)}")
    # Refine once on the fit rows: the CPU term makes throughput not exactly 1 / scale.
    again = _run_all(rows, _numbers(costs), base, progress, only_fit=True, family=True)
    for (key, dtype), ratios in _kernel_ratios(rows, again).items():
        costs["kernel_scale"][key][dtype] *= _geomean(ratios)
    _fit_online_kernels(rows, costs, base, progress)
    if progress:
        progress(f"refined fit: {json.dumps(costs, sort_keys=True)}")
    final = _run_all(rows, _numbers(costs), base, progress)
    costs["request_latency_s"] = _fit_request_latency(rows, final)
    for setup, m in final.items():
        latency = costs["request_latency_s"].get(setup.release, {}).get("s", 0.0)
        final[setup] = with_request_latency(m, latency)
    for r in rows:
        r.simulated = final[r.setup].get(r.metric)
    kept = []
    for r in rows:
        if r.simulated is None:
            error = final[r.setup].get("_error") or "the simulation yields no such metric"
            unsupported.append((r.row, str(error)))
        else:
            kept.append(r)
    return kept, unsupported, costs


def _numbers(costs: dict[str, Any]) -> dict[str, Any]:
    return {"cpu": costs["cpu"], "kernel_scale": costs["kernel_scale"]}


def costs_json(costs: dict[str, Any]) -> str:
    """The fitted parameters as stable JSON (what the package ships)."""
    doc = {"source": "shared/data/published/engine_perf.csv (superinfer calibrate --engine "
           "published)", **costs}  # fmt: skip
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def _rel(r: _Row) -> float:
    assert r.simulated is not None
    return (r.simulated - r.published) / r.published


def write_csv(rows: list[_Row], unsupported: list[tuple[dict[str, str], str]], path: Path) -> None:
    """``published.csv``: one line per published row (:data:`CSV_COLUMNS`)."""
    lines = []
    for r in rows:
        lines.append({"source_row": int(r.row["row_id"]), "engine": r.row["engine"],
                      "setup": r.setup.label, "metric": r.metric, "published": r.published,
                      "simulated": round(r.simulated or 0.0, 4), "rel_err": round(_rel(r), 4),
                      "split": r.split})  # fmt: skip
    for raw, _why in unsupported:
        lines.append({"source_row": int(raw["row_id"]), "engine": raw["engine"], "setup": "",
                      "metric": raw["metric"], "published": raw["value"], "simulated": "",
                      "rel_err": "", "split": "unsupported"})  # fmt: skip
    lines.sort(key=lambda x: int(str(x["source_row"])))
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(CSV_COLUMNS))
        writer.writeheader()
        writer.writerows(lines)


def _family(metric: str, setup: Setup) -> str:
    if metric in ("total_output_tok_s", "output_tok_s_per_gpu", "request_throughput_req_s",
                  "total_token_throughput_tok_s"):  # fmt: skip
        return "throughput (max load)" if setup.rate is None else "throughput (online)"
    return metric


def summary_table(rows: list[_Row], split: str = "score") -> list[dict[str, Any]]:
    """Median and p90 ``|rel_err|`` per engine and metric family over the rows of ``split``."""
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        if r.split == split:
            groups[(r.row["engine"], _family(r.metric, r.setup))].append(abs(_rel(r)))
    return [{"engine": e, "metric": m, "n": len(v), "median": float(np.median(v)),
             "p90": float(np.percentile(v, 90))}
            for (e, m), v in sorted(groups.items())]  # fmt: skip


def write_published(out: str | Path, *, install: bool = True,
                    progress: Callable[[str], None] | None = None) -> list[Path]:  # fmt: skip
    """Fit, simulate and write ``published.csv``, ``published_report.md`` and
    ``published_fit.json`` under ``out`` (and the parameters into the package if ``install``).

    Returns:
        The paths written.
    """
    from superinfer.harness.offline.calibrate_published_report import render_report

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, unsupported, costs = fit_published(progress=progress)
    written = [out_dir / "published.csv", out_dir / "published_report.md",
               out_dir / "published_fit.json"]  # fmt: skip
    write_csv(rows, unsupported, written[0])
    tables = {split: summary_table(rows, split) for split in ("score", "fit")}
    written[1].write_text(render_report(rows, unsupported, costs, tables))
    written[2].write_text(costs_json(costs))
    if install:
        target = Path(__file__).resolve().parents[2] / "sim" / "engine_costs.json"
        target.write_text(costs_json(costs))
        load_costs.cache_clear()
        written.append(target)
    return written
