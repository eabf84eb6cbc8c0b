"""The published setups as simulations: which row is which run, and what the simulator yields.

One row of ``shared/data/published/engine_perf.csv`` becomes a :class:`Setup` (engine release,
model, dtypes, GPU, TP, lengths or ShareGPT, arrival rate, number of prompts), simulated with that
release's profile (``sim.versions``) under its native policy (:func:`simulate`). Quantities as
``bench_serving`` / ``trtllm-bench`` report them (``_outcome``): throughput = output tokens / time
of the last finish (max-load: every request queued at 0); TTFT, E2E and TPOT per request; mean
ITL = sum of decode time / sum of (output - 1); median ITL = the median of every request's
inter-token gaps (:func:`median_itl_s`; one gap per K-token burst for a K-step multi-step engine,
which streams them together: the README's caveat on vLLM's ITL); per-iteration forward / schedule
= the mean GPU / CPU time of the simulated iterations. Setups are shortened where the published
run was long: a max-load run keeps at least three times the requests the engine can hold at once
(:data:`MAX_LOAD_WAVES`). The fit and the scoring are ``calibrate_published``'s.
"""

from __future__ import annotations

import csv
import random
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from superinfer.harness.errors import DataError
from superinfer.harness.workload.data import data_dir
from superinfer.policy_core.types import SLO
from superinfer.sim.calibrated import default_step_time
from superinfer.sim.config import SimConfig, dtype_bytes, kv_capacity_blocks
from superinfer.sim.engine_costs import EngineStepTime
from superinfer.sim.hardware import get_gpu, get_model
from superinfer.sim.request import RequestSpec, RequestStatus
from superinfer.sim.step_time import BatchShape
from superinfer.sim.versions import get_version

__all__ = ["MAX_LOAD_WAVES", "Setup", "load_rows", "median_itl_s", "setup_of", "simulate"]

#: A max-load run simulates at least this many times the requests the engine holds at once.
MAX_LOAD_WAVES = 3
#: ShareGPT mean lengths the published ShareGPT runs imply: 194.3 output tokens per request
#: (rows 641/640, 643/642, 645/644: output tok/s over req/s) and 202 prompt tokens (the vLLM
#: 0.6.0 blog's ShareGPT average, rows 668-671's setup).
SHAREGPT_MEAN_IN, SHAREGPT_MEAN_OUT = 202.0, 194.3
_SHAREGPT_MEANS = (SHAREGPT_MEAN_IN, SHAREGPT_MEAN_OUT)
_SHAREGPT_CSV = "traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"


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


def _sharegpt_lengths(base: Path, n: int, seed: int,
                      means: tuple[float, float] = _SHAREGPT_MEANS,
                      ) -> list[tuple[int, int]]:  # fmt: skip
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
    sp = means[0] / (sum(p for p, _ in picked) / n)
    so = means[1] / (sum(o for _, o in picked) / n)
    return [(max(1, round(p * sp)), max(1, round(o * so))) for p, o in picked]


def _requests(setup: Setup, n: int, base: Path, seed: int = 0,
              means: tuple[float, float] = _SHAREGPT_MEANS,
              ) -> list[RequestSpec]:  # fmt: skip
    if setup.isl == 0:
        lengths = _sharegpt_lengths(base, n, seed, means)
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


def _num_requests(
    setup: Setup,
    config: SimConfig,
    means: tuple[float, float] = _SHAREGPT_MEANS,
) -> int:
    if setup.rate is not None or setup.per_iter:
        return setup.num_prompts
    blocks = kv_capacity_blocks(config.profile, config.model, config.gpu, config.tp,
                                config.weight_dtype, config.kv_dtype)  # fmt: skip
    tokens = blocks * config.profile.block_size_tokens
    length = setup.isl + setup.osl or int(means[0] + means[1])
    held = min(config.profile.limits(config.gpu)[1], max(1, tokens // length))
    return min(setup.num_prompts, max(64, MAX_LOAD_WAVES * held))


def simulate(setup: Setup, costs: dict[str, Any], base: Path,
             overrides: dict[str, Any] | None = None,
             sharegpt_means: tuple[float, float] = _SHAREGPT_MEANS,
             steps: list[tuple[float, int, int]] | None = None,
             ) -> dict[str, float]:  # fmt: skip
    """Simulate ``setup`` with cost parameters ``costs``; every metric it yields.

    Args:
        overrides: ``EngineProfile`` fields to run it with instead of its release's own (how
            the engine family's shared terms are fitted; ``calibrate_published._FAMILY``).
        sharegpt_means: mean prompt and output tokens the ShareGPT lengths are scaled to
            (``setup.isl == 0`` only); the published ShareGPT runs' by default.
        steps: if given, receives one ``(GPU s, running requests, CPU divisor)`` per step the
            simulator priced alone, in order (a run of two or more multi-step decode steps is
            priced whole by ``decode_coefficients`` and not listed; the divisor is the multi-step
            one on decode-only steps, else 1).

    Raises:
        ValueError: the model does not fit the GPU at that TP.
    """
    from superinfer.adapters.manager import build_plugin_manager
    from superinfer.sim.engine import Simulator

    profile = get_version(setup.release)
    if overrides:
        profile = replace(profile, **overrides)
    config = SimConfig(profile, get_model(setup.model), get_gpu(setup.gpu), tp=setup.tp,
                       weight_dtype=setup.weight_dtype, kv_dtype=setup.kv_dtype,
                       record_token_gaps=setup.rate is not None)  # fmt: skip
    kernels = default_step_time(config.model, config.gpu, config.tp,
                                weight_bytes=dtype_bytes(setup.weight_dtype),
                                kv_bytes=dtype_bytes(setup.kv_dtype))  # fmt: skip
    step = _Recorder(EngineStepTime(kernels, profile, setup.weight_dtype, costs))
    specs = _requests(setup, _num_requests(setup, config, sharegpt_means), base,
                      means=sharegpt_means)  # fmt: skip
    options = {"max_repeat_steps": 1} if setup.per_iter else None
    if not profile.cut_repeat_on_arrival and not setup.per_iter:  # K-step multi-step runs
        options = {"max_repeat_steps": profile.cpu_decode_divisor}
    pm = build_plugin_manager(profile.native_policy, options)
    result = Simulator(config, pm.hook, step_time=step).run(specs)
    if steps is not None:
        steps.extend(step.steps)
    bursts = not profile.cut_repeat_on_arrival  # K-step multi-step: tokens stream per run
    return _outcome(setup, result.requests, step, profile.cpu_decode_divisor, bursts)


def median_itl_s(requests: Iterable[Any], bursts: bool = False) -> float | None:
    """The median inter-token latency over every gap of every request, s, as ``bench_serving``
    computes it (``np.median`` of all requests' ITL lists: one entry per streamed chunk after the
    first).

    Args:
        requests: simulated requests run with ``SimConfig.record_token_gaps``.
        bursts: the engine streams a run of ``k`` repeated steps as one chunk (vLLM's K-step
            multi-step scheduling streams its K tokens together): one gap per run, from the
            previous chunk to the run's end. Otherwise each step's token is its own chunk: the
            run's first gap, then its other ``k - 1`` steps at their mean length (the steps of
            one run differ only by the KV they read, a few percent).

    Returns:
        The median, or ``None`` if no request has a gap.
    """
    gaps: list[float] = []
    counts: list[int] = []
    for r in requests:
        for first, k, rest in r.token_gaps or ():
            if bursts:
                gaps.append(first + rest)
                counts.append(1)
                continue
            gaps.append(first)
            counts.append(1)
            if k > 1:
                gaps.append(rest / (k - 1))
                counts.append(k - 1)
    if not gaps:
        return None
    order = np.argsort(gaps, kind="stable")
    cum = np.cumsum(np.asarray(counts)[order])
    return float(np.asarray(gaps)[order][np.searchsorted(cum, cum[-1] / 2)])


def _outcome(setup: Setup, requests: Iterable[Any], step: _Recorder, k: int,
             bursts: bool = False) -> dict[str, float]:  # fmt: skip
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
        m["tpot_ms:p50"] = 1e3 * float(np.median(tpot))
        m["itl_ms:mean"] = 1e3 * float(sum(r.finish_s - r.first_token_s for r in multi)
                                       / weights.sum())  # fmt: skip
        itl = median_itl_s(multi, bursts)
        if itl is not None:
            m["itl_ms:p50"] = 1e3 * itl
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
