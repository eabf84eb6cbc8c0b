"""Fit the engines' own step costs to published measurements, and score them on the rest.

Input: ``shared/data/published/engine_perf.csv`` (562 published numbers of TensorRT-LLM, SGLang and
vLLM, each with its source and version; README there). Every row the simulator can reproduce
becomes a *setup* (engine release, model, dtypes, GPU, TP, lengths or dataset, arrival rate,
number of prompts), simulated with that release's profile (``sim.versions``) under its native
policy (``fcfs``), so the published number and the simulated one sit side by side.

What is fitted (written to ``sim/engine_costs.json``, read by ``sim.engine_costs``):

* ``cpu[release]``: per-step CPU time ``c0 + c_seq n`` of vLLM 0.5.4 and SGLang 0.2.13, by
  non-negative least squares on relative error against the published per-iteration schedule
  times (WukLab). The prediction of a row is the mean over the simulated iterations of
  ``(c0 + c_seq n_i) / K_i`` (``K_i``: the multi-step divisor on decode-only iterations), which is
  linear in ``(c0, c_seq)``.
* ``kernel_scale[engine][dtype]``: a multiplier on the calibrated kernels' GPU time, the geometric
  mean over the fit rows of ``simulated / published`` max-load throughput and of ``published /
  simulated`` per-iteration forward time, refined once on the fit rows.

The split is deterministic: rows that feed a fit (max-load output throughput, per-iteration
forward and schedule times) are grouped by (engine release family, dtype, metric), sorted by
``row_id``, and alternate ``fit`` (even position) / ``score`` (odd); every other simulated row is
``score``; rows the simulator cannot reproduce are ``unsupported`` with the reason in the report.

Simulated quantities (``_outcome``): throughput = output tokens / time of the last finish
(max-load: every request queued at 0); TTFT, E2E and TPOT per request as ``bench_serving``
computes them; mean ITL = sum of decode time / sum of (output - 1); median ITL = the token-weighted
median TPOT, times ``K`` for a K-step multi-step engine, which streams K tokens per burst (the
README's caveat on vLLM's ITL); per-iteration forward / schedule = the mean GPU / CPU time of the
simulated iterations. Setups are shortened where the published run was long: a max-load run keeps
at least three times the requests the engine can hold at once (:data:`MAX_LOAD_WAVES`).
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from superinfer.harness.errors import DataError
from superinfer.harness.workload.data import data_dir
from superinfer.policy_core.types import SLO
from superinfer.sim.calibrated import default_step_time
from superinfer.sim.config import SimConfig, dtype_bytes, kv_capacity_blocks
from superinfer.sim.engine_costs import EngineStepTime, load_costs
from superinfer.sim.hardware import get_gpu, get_model
from superinfer.sim.request import RequestSpec, RequestStatus
from superinfer.sim.step_time import BatchShape
from superinfer.sim.versions import get_version

__all__ = ["CSV_COLUMNS", "Setup", "costs_json", "fit_published", "load_rows", "setup_of",
           "simulate", "summary_table", "write_csv", "write_published"]  # fmt: skip

CSV_COLUMNS = ("source_row", "engine", "setup", "metric", "published", "simulated", "rel_err",
               "split")  # fmt: skip
#: A max-load run simulates at least this many times the requests the engine holds at once.
MAX_LOAD_WAVES = 3
#: ShareGPT mean lengths the published ShareGPT runs imply: 194.3 output tokens per request
#: (rows 641/640, 643/642, 645/644: output tok/s over req/s) and 202 prompt tokens (the vLLM
#: 0.6.0 blog's ShareGPT average, rows 668-671's setup).
SHAREGPT_MEAN_IN, SHAREGPT_MEAN_OUT = 202.0, 194.3
_SHAREGPT_CSV = "traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
_FIT_METRICS = ("total_output_tok_s", "output_tok_s_per_gpu", "per_iter_forward_ms",
                "per_iter_schedule_ms")  # fmt: skip


@dataclass(frozen=True)
class Setup:
    """One published run to simulate.

    Attributes:
        release: ``sim.versions`` key, e.g. ``"trtllm-0.17"``.
        model, gpu, tp: as ``sim.hardware`` names them.
        weight_dtype, kv_dtype: ``"fp16"`` or ``"fp8"``.
        isl, osl: fixed lengths, or 0 for ShareGPT lengths.
        num_prompts: requests of the published run.
        rate: arrivals per s (Poisson), or ``None``: all queued at 0.
        per_iter: every step its own iteration (no repeated decode runs), to time iterations.
    """

    release: str
    model: str
    gpu: str
    tp: int
    weight_dtype: str
    kv_dtype: str
    isl: int
    osl: int
    num_prompts: int
    rate: float | None
    per_iter: bool = False

    @property
    def label(self) -> str:
        """A short id, e.g. ``trtllm-0.17 llama-3.1-8b fp8 h100-80gb tp1 128/128 inf``."""
        lengths = "sharegpt" if self.isl == 0 else f"{self.isl}/{self.osl}"
        rate = "inf" if self.rate is None else f"{self.rate:g}rps"
        return (f"{self.release} {self.model} {self.weight_dtype} {self.gpu} tp{self.tp} "
                f"{lengths} {rate} n{self.num_prompts}")  # fmt: skip


def load_rows(path: Path | None = None) -> list[dict[str, str]]:
    """The published rows (``engine_perf.csv``).

    Raises:
        DataError: the file is missing.
    """
    if path is None:
        base = data_dir()
        if base is None:
            raise DataError("no shared data folder found (set SUPERINFER_DATA)")
        path = base / "published" / "engine_perf.csv"
    if not path.is_file():
        raise DataError(f"{path}: no such file (the published measurements)")
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


#: (engine, version prefix, text the version must contain, ``sim.versions`` key).
_RELEASES = (
    ("trtllm", "0.14", "", "trtllm-0.14"),
    ("trtllm", "0.17", "", "trtllm-0.17"),
    ("trtllm", "0.21", "", "trtllm-0.21"),
    ("trtllm", "1.1", "", "trtllm-1.1"),
    ("trtllm", "1.2", "", "trtllm-1.2"),
    ("sglang", "0.3.0", "0.3.0", "sglang-0.3.0"),
    ("sglang", "0.2.13", "radix cache OFF", "sglang-0.2.13"),
    ("vllm", "0.6.0", "0.6.0", "vllm-0.6.0"),
    ("vllm", "0.5.4 (defaults", "", "vllm-0.5.4"),
)


def _release(row: dict[str, str]) -> str | None:
    version = row["engine_version"]
    for engine, prefix, must, key in _RELEASES:
        exact = must == prefix  # "0.3.0": the version string is exactly that
        if (
            row["engine"] in (engine,)
            and version.startswith(prefix)
            and must in version
            and (not exact or version == prefix)
        ):
            return key
    return None


def _gpu(text: str) -> str | None:
    t = text.lower()
    for key, name in (("h200", "h200"), ("h100", "h100-80gb"), ("a100", "a100-80gb")):
        if key in t:
            return name
    return None


def _model(text: str) -> str | None:
    t = text.lower()
    if "70b" in t:
        return "llama-3.1-70b"  # Llama-3 / 3.1 / 3.3 70B share the shapes
    if "8b" in t:
        return "llama-3.1-8b"
    return None


def setup_of(row: dict[str, str]) -> tuple[Setup | None, str]:
    """The setup of one published row, or ``(None, why not)``."""
    release = _release(row)
    if release is None:
        return None, f"no profile of {row['engine']} {row['engine_version'][:30]!r}"
    gpu, model = _gpu(row["gpu"]), _model(row["model"])
    if gpu is None:
        return None, f"GPU {row['gpu'][:20]!r} not modelled"
    if model is None:
        return None, f"model {row['model'][:20]!r} not modelled"
    wd = row["weight_dtype"].upper()
    if wd.startswith("FP8"):
        weight = "fp8"
    elif wd.startswith(("BF16", "FP16")):
        weight = "fp16"
    else:
        return None, f"weight dtype {row['weight_dtype']!r} not modelled"
    kv_text = row["kv_dtype"]
    # FP8 checkpoints carry FP8 KV (the 0.17 doc says so; PyTorch backend 'auto' follows the
    # checkpoint's quant config, assumed FP8 for NVIDIA's FP8 Llama checkpoints).
    kv = "fp8" if kv_text.startswith("FP8") or (weight == "fp8" and "auto" in kv_text) else "fp16"
    tp = int(row["tp"]) if row["tp"].strip().isdigit() else 4  # WukLab 70B: "up to 4 A100"
    isl_text, osl_text = row["isl"].strip(), row["osl"].split()[0] if row["osl"].strip() else ""
    if isl_text == "sharegpt":
        isl = osl = 0
    elif isl_text.isdigit() and osl_text.isdigit():
        isl, osl = int(isl_text), int(osl_text)
    else:
        return None, f"dataset {isl_text!r} lengths not available"
    n_text = row["num_prompts"].strip()
    num = int(n_text) if n_text.isdigit() else 1000
    rate_text = row["request_rate"].strip()
    rate = None if rate_text.startswith(("inf", "all")) else float(rate_text)
    per_iter = row["metric"] in ("per_iter_forward_ms", "per_iter_schedule_ms",
                                 "schedule_share_pct")  # fmt: skip
    return Setup(release, model, gpu, tp, weight, kv, isl, osl, num, rate, per_iter), ""


def _metric_key(row: dict[str, str]) -> str | None:
    metric, pct = row["metric"], row["percentile"].strip()
    if metric in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_latency_ms"):
        return f"{metric}:{'mean' if pct == 'mean' else 'p50'}" if pct in ("mean", "p50") else None
    known = ("total_output_tok_s", "output_tok_s_per_gpu", "request_throughput_req_s",
             "total_token_throughput_tok_s", "per_iter_forward_ms", "per_iter_schedule_ms",
             "schedule_share_pct")  # fmt: skip
    return metric if metric in known else None


# -- workloads --------------------------------------------------------------------------------


def _sharegpt_lengths(base: Path, n: int, seed: int) -> list[tuple[int, int]]:
    path = base / _SHAREGPT_CSV
    if not path.is_file():
        raise DataError(f"{path}: no such file (ShareGPT lengths)")
    with path.open(newline="") as fh:
        rows = [(int(r["num_prefill_tokens"]), int(r["num_decode_tokens"]))
                for r in csv.DictReader(fh)]  # fmt: skip
    # bench_serving's ShareGPT filter: prompt and output >= 4, prompt <= 1024, total <= 2048.
    rows = [(p, o) for p, o in rows if p >= 4 and o >= 4 and p <= 1024 and p + o <= 2048]
    rng = random.Random(seed)
    picked = [rows[rng.randrange(len(rows))] for _ in range(n)]
    sp = SHAREGPT_MEAN_IN / (sum(p for p, _ in picked) / n)
    so = SHAREGPT_MEAN_OUT / (sum(o for _, o in picked) / n)
    return [(max(1, round(p * sp)), max(1, round(o * so))) for p, o in picked]


def _requests(setup: Setup, n: int, base: Path, seed: int = 0) -> list[RequestSpec]:
    if setup.isl == 0:
        lengths = _sharegpt_lengths(base, n, seed)
    else:
        lengths = [(setup.isl, setup.osl)] * n
    rng = random.Random(seed + 1)
    t, specs = 0.0, []
    slo = SLO("batch")
    for i, (p, o) in enumerate(lengths):
        if setup.rate is not None and i:
            t += rng.expovariate(setup.rate)
        specs.append(RequestSpec(f"r{i}", t, p, o, o, slo))
    return specs


# -- simulation -------------------------------------------------------------------------------


class _Recorder:
    """An engine step time that records each step's GPU time, requests and CPU divisor."""

    def __init__(self, inner: EngineStepTime) -> None:
        self.inner = inner
        self.steps: list[tuple[float, int, int]] = []

    def step_time_s(self, shape: BatchShape) -> float:
        if shape.num_tokens:
            decode_only = shape.prefill_tokens == 0
            self.steps.append((self.inner.gpu_s(shape), shape.num_seqs,
                               self.inner.divisor if decode_only else 1))  # fmt: skip
        return self.inner.step_time_s(shape)

    def decode_coefficients(self, num_seqs: int) -> tuple[float, float]:
        return self.inner.decode_coefficients(num_seqs)


def _num_requests(setup: Setup, config: SimConfig) -> int:
    if setup.rate is not None or setup.per_iter:
        return setup.num_prompts
    blocks = kv_capacity_blocks(config.profile, config.model, config.gpu, config.tp,
                                config.weight_dtype, config.kv_dtype)  # fmt: skip
    tokens = blocks * config.profile.block_size_tokens
    length = setup.isl + setup.osl or int(SHAREGPT_MEAN_IN + SHAREGPT_MEAN_OUT)
    held = min(config.profile.limits(config.gpu)[1], max(1, tokens // length))
    return min(setup.num_prompts, max(64, MAX_LOAD_WAVES * held))


def simulate(setup: Setup, costs: dict[str, Any], base: Path) -> dict[str, float]:
    """Simulate ``setup`` with cost parameters ``costs``; every metric it yields.

    Raises:
        ValueError: the model does not fit the GPU at that TP.
    """
    from superinfer.adapters.manager import build_plugin_manager
    from superinfer.sim.engine import Simulator

    profile = get_version(setup.release)
    config = SimConfig(profile, get_model(setup.model), get_gpu(setup.gpu), tp=setup.tp,
                       weight_dtype=setup.weight_dtype, kv_dtype=setup.kv_dtype)  # fmt: skip
    kernels = default_step_time(config.model, config.gpu, config.tp,
                                weight_bytes=dtype_bytes(setup.weight_dtype),
                                kv_bytes=dtype_bytes(setup.kv_dtype))  # fmt: skip
    step = _Recorder(EngineStepTime(kernels, profile, setup.weight_dtype, costs))
    specs = _requests(setup, _num_requests(setup, config), base)
    options = {"max_repeat_steps": 1} if setup.per_iter else None
    if not profile.cut_repeat_on_arrival and not setup.per_iter:  # K-step multi-step runs
        options = {"max_repeat_steps": profile.cpu_decode_divisor}
    pm = build_plugin_manager(profile.native_policy, options)
    result = Simulator(config, pm.hook, step_time=step).run(specs)
    return _outcome(setup, result.requests, step, profile.cpu_decode_divisor)


def _outcome(setup: Setup, requests: Iterable[Any], step: _Recorder, k: int) -> dict[str, float]:
    done = [r for r in requests if r.status is RequestStatus.FINISHED]
    if not done:
        return {}
    start = min(r.spec.arrival_s for r in done)
    span = max(r.finish_s for r in done) - start
    out = sum(r.generated_tokens for r in done)
    inp = sum(r.spec.prompt_tokens for r in done)
    ttft = np.array([r.first_token_s - r.spec.arrival_s for r in done])
    e2e = np.array([r.finish_s - r.spec.arrival_s for r in done])
    multi = [r for r in done if r.generated_tokens > 1]
    tpot = np.array([(r.finish_s - r.first_token_s) / (r.generated_tokens - 1) for r in multi])
    weights = np.array([r.generated_tokens - 1 for r in multi], dtype=float)
    m: dict[str, float] = {
        "total_output_tok_s": out / span,
        "output_tok_s_per_gpu": out / span / setup.tp,
        "request_throughput_req_s": len(done) / span,
        "total_token_throughput_tok_s": (inp + out) / span,
        "ttft_ms:mean": 1e3 * float(ttft.mean()),
        "ttft_ms:p50": 1e3 * float(np.median(ttft)),
        "e2e_latency_ms:p50": 1e3 * float(np.median(e2e)),
    }
    if len(multi):
        order = np.argsort(tpot)
        cum = np.cumsum(weights[order])
        wmed = float(tpot[order][np.searchsorted(cum, cum[-1] / 2)])
        m["tpot_ms:p50"] = 1e3 * float(np.median(tpot))
        m["itl_ms:mean"] = 1e3 * float(sum(r.finish_s - r.first_token_s for r in multi)
                                       / weights.sum())  # fmt: skip
        m["itl_ms:p50"] = 1e3 * wmed * k
    if step.steps:
        gpu = np.array([g for g, _, _ in step.steps])
        m["per_iter_forward_ms"] = 1e3 * float(gpu.mean())
        n = np.array([s for _, s, _ in step.steps], dtype=float)
        d = np.array([k_ for _, _, k_ in step.steps], dtype=float)
        m["_cpu_a"] = float((1.0 / d).mean())  # mean of 1 / K_i
        m["_cpu_b"] = float((n / d).mean())  # mean of n_i / K_i
        cpu = step.inner.cpu
        if cpu is not None:
            sched = 1e3 * (cpu[0] * m["_cpu_a"] + cpu[1] * m["_cpu_b"])
            m["per_iter_schedule_ms"] = sched
            m["schedule_share_pct"] = 100 * sched / (sched + m["per_iter_forward_ms"])
    return m


# -- fit and score ----------------------------------------------------------------------------


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
    return get_version(r.setup.release).kernel_key, r.setup.weight_dtype


def _split(rows: list[_Row]) -> None:
    groups: dict[tuple[str, ...], list[_Row]] = defaultdict(list)
    for r in rows:
        if r.metric in _FIT_METRICS and (r.setup.rate is None):
            key = r.setup.release if r.metric == "per_iter_schedule_ms" else _kernel_group(r)
            groups[(*key, r.metric) if isinstance(key, tuple) else (key, r.metric)].append(r)
    for members in groups.values():
        for i, r in enumerate(sorted(members, key=lambda x: int(x.row["row_id"]))):
            r.split = "fit" if i % 2 == 0 else "score"


def _run_all(rows: list[_Row], costs: dict[str, Any], base: Path,
             progress: Callable[[str], None] | None, only_fit: bool = False,
             ) -> dict[Setup, dict[str, float]]:  # fmt: skip
    setups = sorted({r.setup for r in rows if not only_fit or r.split == "fit"},
                    key=lambda s: s.label)  # fmt: skip
    out: dict[Setup, dict[str, float]] = {}
    for i, s in enumerate(setups):
        if progress:
            progress(f"[{i + 1}/{len(setups)}] {s.label}")
        try:
            out[s] = simulate(s, costs, base)
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
        if r.split != "fit" or r.metric == "per_iter_schedule_ms":
            continue
        sim = sims[r.setup].get(r.metric)
        if not sim:
            continue
        forward = r.metric == "per_iter_forward_ms"
        ratios[_kernel_group(r)].append(r.published / sim if forward else sim / r.published)
    return ratios


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
    first = _run_all(rows, start, base, progress)
    costs: dict[str, Any] = {"cpu": _fit_cpu(rows, first), "kernel_scale": {}}
    for (key, dtype), ratios in sorted(_kernel_ratios(rows, first).items()):
        costs["kernel_scale"].setdefault(key, {})[dtype] = _geomean(ratios)
    if progress:
        progress(f"first fit: {json.dumps(costs, sort_keys=True)}")
    # Refine once on the fit rows: the CPU term makes throughput not exactly 1 / scale.
    again = _run_all(rows, _numbers(costs), base, progress, only_fit=True)
    for (key, dtype), ratios in _kernel_ratios(rows, again).items():
        costs["kernel_scale"][key][dtype] *= _geomean(ratios)
    if progress:
        progress(f"refined fit: {json.dumps(costs, sort_keys=True)}")
    final = _run_all(rows, _numbers(costs), base, progress)
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
