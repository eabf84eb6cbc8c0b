"""Fit the simulator's step-time model to measured GPU timings (Vidur's profiling data).

Inputs (``shared/data/profiling``, README there): per-layer operator timings of Llama-2/3 models on
A100 and H100 at TP 1/2/4/8 (``compute/*/mlp.csv``), NCCL all-reduce timings (``network/*_dgx``),
the one measured attention file (A100, 70B-class shape, TP2) and the sarathi-serve CPU overheads.
Every fit minimises the log of predicted over measured time (relative error), with scipy.

Models fitted:
    * GEMMs (``attn_pre_proj`` = QKV, ``attn_post_proj`` = O, ``mlp_up_proj`` = gate+up,
      ``mlp_down_proj``): a roofline ``max(FLOPs / F_b, bytes / B_b) + c`` whose achieved FLOP/s
      ``F_b`` and bytes/s ``B_b`` are fitted per token range ``b`` (:data:`TOKEN_EDGES`): cuBLAS
      switches kernels as the token count grows, which one pair of efficiencies cannot follow.
      One fit per (GPU, op, per-GPU GEMM shape ``K x N``), used for shapes that were profiled
      (Llama-3.1 8B/70B share Llama-3 8B/70B shapes, and Llama-2-70B's), and one pooled fit per
      (GPU, op) over every shape, used for any other shape.
    * Small per-layer kernels (RMSNorm x2, RoPE, SiLU-and-mul, residual add): ``bytes / B + c``.
    * Attention, from the A100 TP2 file only: decode ``c + c_seq * batch + KV bytes / B``; prefill
      ``c + 4 q d n (ctx + n) / F + c_tok n`` for a chunk of ``n`` tokens on ``ctx`` cached ones.
      The prefill kernel measured there did not skip the masked half of the causal product (the
      ``n (ctx + n)`` form fits with a 4.8% median error, the causal ``n (ctx + n / 2)`` one with
      11%). Other GPUs scale ``F`` and ``B`` by their peak ratio to A100 (extrapolated, not
      measured), and contexts beyond 4,096 tokens extrapolate the fitted lines.
    * All-reduce per (node type, TP): ``alpha + bytes / beta`` on intra-node rows.
    * CPU overhead per step: ``intercept + slope * batch`` on schedule + sampler + input
      preparation + output processing medians, per (model, TP).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from superinfer.harness.errors import DataError
from superinfer.harness.workload.data import data_dir

__all__ = [
    "GEMM_OPS",
    "SMALL_OPS",
    "TOKEN_EDGES",
    "CalibrationResult",
    "calibrate",
    "write_gpu_calibration",
]

#: Token-range boundaries of the GEMM efficiency buckets (the last bucket is open-ended).
TOKEN_EDGES = (0, 32, 128, 256, 512, 1024, 2048, 4096, 8192)
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
SMALL_OPS = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")

#: Profiled (gpu, model) files.
_COMPUTE = (
    ("a100", "Meta-Llama-3-8B"),
    ("a100", "Meta-Llama-3-70B"),
    ("a100", "Llama-2-7b-hf"),
    ("a100", "Llama-2-70b-hf"),
    ("h100", "Llama-2-7b-hf"),
    ("h100", "Llama-2-70b-hf"),
)
_NETWORK = {"a100": "a100_dgx", "h100": "h100_dgx"}
_RANGE_LABELS = (
    "1-31",
    "32-127",
    "128-255",
    "256-511",
    "512-1023",
    "1024-2047",
    "2048-4095",
    "4096-8191",
    "8192+",
)


@dataclass(frozen=True)
class CalibrationResult:
    """Fitted parameters and their errors.

    Attributes:
        params: what ``sim.calibrated.CalibratedStepTime`` reads (JSON-serialisable).
        fit_error: rows ``gpu, model, tp, op, n_points, median_abs_rel_err, p90_abs_rel_err, fit``.
        fit_error_by_range: rows ``gpu, op, fit, token_range, n_points, median_abs_rel_err,
            p90_abs_rel_err`` (GEMMs only).
    """

    params: dict[str, Any]
    fit_error: pd.DataFrame
    fit_error_by_range: pd.DataFrame


def _fit(residual: Callable[[np.ndarray], np.ndarray], x0: np.ndarray) -> np.ndarray:
    from scipy.optimize import least_squares

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        fitted: np.ndarray = np.asarray(least_squares(residual, x0, method="trf").x)
        return fitted


def _errors(pred: np.ndarray, measured: np.ndarray) -> tuple[float, float]:
    err = np.abs(pred / measured - 1.0)
    return float(np.median(err)), float(np.percentile(err, 90))


def _gemm_shape(row: pd.Series, op: str) -> tuple[int, int]:
    """(K, N) of ``op`` on one GPU at the row's TP degree (README §4.1 of the data)."""
    h, q, kv = int(row.n_embd), int(row.n_head), int(row.n_kv_head)
    d, ffn, tp = h // q, int(row.n_expanded_embd), int(row.num_tensor_parallel_workers)
    return {
        "attn_pre_proj": (h, (q + 2 * kv) * d // tp),
        "attn_post_proj": (q * d // tp, h),
        "mlp_up_proj": (h, 2 * ffn // tp),
        "mlp_down_proj": (ffn // tp, h),
    }[op]


def gemm_time_s(params: dict[str, Any], tokens: np.ndarray, k: int, n: int) -> np.ndarray:
    """Predicted GEMM time (s) of ``tokens`` rows through a ``K x N`` weight with ``params``."""
    b = np.searchsorted(np.asarray(TOKEN_EDGES), tokens, side="right") - 1
    flops_s = np.asarray(params["flops_s"])[b]
    bytes_s = np.asarray(params["bytes_s"])[b]
    flops = 2.0 * tokens * k * n
    moved = 2.0 * (k * n + tokens * k + tokens * n)
    return np.maximum(flops / flops_s, moved / bytes_s) + params["overhead_s"]


def _fit_gemm(
    tokens: np.ndarray, k: np.ndarray | int, n: np.ndarray | int, y: np.ndarray
) -> dict[str, Any]:
    nb = len(TOKEN_EDGES)
    b = np.searchsorted(np.asarray(TOKEN_EDGES), tokens, side="right") - 1
    flops = 2.0 * tokens * k * n
    moved = 2.0 * (k * n + tokens * k + tokens * n)

    def residual(p: np.ndarray) -> np.ndarray:
        fs, bs, c = np.exp(p[:nb])[b], np.exp(p[nb : 2 * nb])[b], np.exp(p[-1])
        return np.log((np.maximum(flops / fs, moved / bs) + c) / y)

    x0 = np.r_[np.full(nb, np.log(2e14)), np.full(nb, np.log(1.5e12)), np.log(5e-6)]
    p = _fit(residual, x0)
    used = np.bincount(b, minlength=nb) > 0
    with np.errstate(over="ignore"):
        fs, bs = np.exp(p[:nb]), np.exp(p[nb : 2 * nb])
    # Buckets without data borrow their nearest neighbour's efficiencies.
    for arr in (fs, bs):
        for i in range(nb):
            if not used[i]:
                nearest = min(np.flatnonzero(used), key=lambda j: abs(j - i))
                arr[i] = arr[nearest]
    return {"flops_s": fs.tolist(), "bytes_s": bs.tolist(), "overhead_s": float(np.exp(p[-1]))}


def _load_compute(root: Path) -> pd.DataFrame:
    frames = []
    for gpu, model in _COMPUTE:
        path = root / "compute" / gpu / "meta-llama" / model / "mlp.csv"
        if not path.is_file():
            raise DataError(f"{path}: missing (see shared/data/profiling/README.md)")
        df = pd.read_csv(path)
        df["gpu"], df["model"] = gpu, model
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def _calibrate_gemms(
    df: pd.DataFrame,
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    params: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    by_range: list[dict[str, Any]] = []
    for gpu, g in df.groupby("gpu"):
        params[gpu] = {}
        linear: dict[tuple[str, int], list[np.ndarray]] = {}
        for op in GEMM_OPS:
            shapes = np.array([_gemm_shape(r, op) for _, r in g.iterrows()])
            tokens = g["num_tokens"].to_numpy(float)
            y = g[f"time_stats.{op}.median"].to_numpy(float) * 1e-3
            pooled = _fit_gemm(tokens, shapes[:, 0], shapes[:, 1], y)
            entry: dict[str, Any] = {"pooled": pooled, "by_shape": {}}
            pred = {"pooled": np.empty_like(y), "shape": np.empty_like(y)}
            keys = [f"{k}x{n}" for k, n in shapes]
            for key in sorted(set(keys)):
                idx = np.array([kk == key for kk in keys])
                k, n = (int(v) for v in key.split("x"))
                entry["by_shape"][key] = _fit_gemm(tokens[idx], k, n, y[idx])
                pred["shape"][idx] = gemm_time_s(entry["by_shape"][key], tokens[idx], k, n)
                pred["pooled"][idx] = gemm_time_s(pooled, tokens[idx], k, n)
            params[gpu][op] = entry
            shape_err = g.assign(err=np.abs(pred["shape"] / y - 1.0))
            for (model, tp), part in shape_err.groupby(["model", "num_tensor_parallel_workers"]):
                linear.setdefault((model, int(tp)), []).append(part["err"].to_numpy())
            for fit, p in pred.items():
                frame = g.assign(pred=p, meas=y)
                for (model, tp), part in frame.groupby(["model", "num_tensor_parallel_workers"]):
                    med, p90 = _errors(part["pred"].to_numpy(), part["meas"].to_numpy())
                    rows.append({"gpu": gpu, "model": model, "tp": int(tp), "op": op,
                                 "n_points": len(part), "median_abs_rel_err": med,
                                 "p90_abs_rel_err": p90, "fit": fit})  # fmt: skip
                bucket = np.searchsorted(np.asarray(TOKEN_EDGES), tokens, side="right") - 1
                for i, label in enumerate(_RANGE_LABELS):
                    sel = bucket == i
                    if sel.any():
                        med, p90 = _errors(p[sel], y[sel])
                        by_range.append({"gpu": gpu, "op": op, "fit": fit, "token_range": label,
                                         "n_points": int(sel.sum()), "median_abs_rel_err": med,
                                         "p90_abs_rel_err": p90})  # fmt: skip
        for (model, tp), errs in linear.items():
            err = np.concatenate(errs)
            rows.append({"gpu": gpu, "model": model, "tp": tp, "op": "linear",
                         "n_points": len(err), "median_abs_rel_err": float(np.median(err)),
                         "p90_abs_rel_err": float(np.percentile(err, 90)),
                         "fit": "shape"})  # fmt: skip
    return params, rows, by_range


def _small_bytes(row: pd.DataFrame, op: str) -> np.ndarray:
    """Bytes one small kernel moves (FP16), per the shapes in mlp_impl.py."""
    t = row["num_tokens"].to_numpy(float)
    h = row["n_embd"].to_numpy(float)
    tp = row["num_tensor_parallel_workers"].to_numpy(float)
    d = h / row["n_head"].to_numpy(float)
    if op in ("input_layernorm", "post_attention_layernorm"):
        return 2 * 2 * t * h
    if op == "attn_rope":
        return (
            2 * 2 * t * (row["n_head"].to_numpy(float) + row["n_kv_head"].to_numpy(float)) * d / tp
        )
    if op == "mlp_act":
        return 2 * t * 3 * row["n_expanded_embd"].to_numpy(float) / tp
    return 2 * 3 * t * h  # add


def _calibrate_small(df: pd.DataFrame) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    params: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for gpu, g in df.groupby("gpu"):
        params[gpu] = {}
        for op in SMALL_OPS:
            moved = _small_bytes(g, op)
            y = g[f"time_stats.{op}.median"].to_numpy(float) * 1e-3
            keep = y > 0

            def residual(q: np.ndarray, m: np.ndarray = moved[keep], yy: np.ndarray = y[keep]
                         ) -> np.ndarray:  # fmt: skip
                return np.log((m / np.exp(q[0]) + np.exp(q[1])) / yy)

            p = _fit(residual, np.array([np.log(1e12), np.log(5e-6)]))
            params[gpu][op] = {"bytes_s": float(np.exp(p[0])), "overhead_s": float(np.exp(p[1]))}
            pred = moved / np.exp(p[0]) + np.exp(p[1])
            frame = g.assign(pred=pred, meas=y)[keep]
            for (model, tp), part in frame.groupby(["model", "num_tensor_parallel_workers"]):
                med, p90 = _errors(part["pred"].to_numpy(), part["meas"].to_numpy())
                rows.append({"gpu": gpu, "model": model, "tp": int(tp), "op": op,
                             "n_points": len(part), "median_abs_rel_err": med,
                             "p90_abs_rel_err": p90, "fit": "pooled"})  # fmt: skip
    return params, rows


def _calibrate_attention(root: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    path = root / "historical" / "e2d00e9" / "a100" / "attention.csv"
    if not path.is_file():
        raise DataError(f"{path}: missing (see shared/data/profiling/README.md)")
    df = pd.read_csv(path)
    tp = int(df["num_tensor_parallel_workers"].iloc[0])
    q_heads = int(df["n_q_head"].iloc[0]) // tp
    kv_heads = int(df["n_kv_head"].iloc[0]) // tp
    d = int(df["n_embd"].iloc[0]) // int(df["n_q_head"].iloc[0])
    kv_bytes_per_token = 2 * kv_heads * d * 2  # K and V, FP16, one layer on one GPU
    rows: list[dict[str, Any]] = []

    dec = df[~df["is_prefill"]]
    batch = dec["batch_size"].to_numpy(float)
    kv = dec["kv_cache_size"].to_numpy(float)
    yd = dec["time_stats.attn_decode.median"].to_numpy(float) * 1e-3
    moved = batch * kv * kv_bytes_per_token

    def dec_model(p: np.ndarray) -> np.ndarray:
        return np.exp(p[0]) + np.exp(p[1]) * batch + moved / np.exp(p[2])

    pd_ = _fit(lambda p: np.log(dec_model(p) / yd), np.log([1e-5, 1e-7, 1e12]))
    med, p90 = _errors(dec_model(pd_), yd)
    rows.append({"gpu": "a100", "model": "70B-class GQA (attention.csv)", "tp": tp,
                 "op": "attn_decode", "n_points": len(yd), "median_abs_rel_err": med,
                 "p90_abs_rel_err": p90, "fit": "pooled"})  # fmt: skip

    pre = df[df["is_prefill"]]
    chunk = pre["prefill_chunk_size"].to_numpy(float)
    ctx = pre["kv_cache_size"].to_numpy(float)
    yp = pre["time_stats.attn_prefill.median"].to_numpy(float) * 1e-3
    flops = 4.0 * q_heads * d * chunk * (ctx + chunk)

    def pre_model(p: np.ndarray) -> np.ndarray:
        return np.exp(p[0]) + flops / np.exp(p[1]) + chunk * np.exp(p[2])

    pp = _fit(lambda p: np.log(pre_model(p) / yp), np.log([1e-5, 1e14, 1e-9]))
    med, p90 = _errors(pre_model(pp), yp)
    rows.append({"gpu": "a100", "model": "70B-class GQA (attention.csv)", "tp": tp,
                 "op": "attn_prefill", "n_points": len(yp), "median_abs_rel_err": med,
                 "p90_abs_rel_err": p90, "fit": "pooled"})  # fmt: skip
    params = {
        "measured_on": "a100",
        "decode": {"overhead_s": float(np.exp(pd_[0])), "per_seq_s": float(np.exp(pd_[1])),
                   "bytes_s": float(np.exp(pd_[2]))},
        "prefill": {"overhead_s": float(np.exp(pp[0])), "flops_s": float(np.exp(pp[1])),
                    "per_token_s": float(np.exp(pp[2]))},
        "range": {"decode_batch": [int(batch.min()), int(batch.max())],
                  "decode_kv_tokens": [int(kv.min()), int(kv.max())],
                  "prefill_chunk": [int(chunk.min()), int(chunk.max())],
                  "prefill_context": [int(ctx.min()), int(ctx.max())]},
    }  # fmt: skip
    return params, rows


def _calibrate_allreduce(root: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    params: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for gpu, node in _NETWORK.items():
        path = root / "network" / node / "all_reduce.csv"
        if not path.is_file():
            raise DataError(f"{path}: missing (see shared/data/profiling/README.md)")
        df = pd.read_csv(path)
        intra = df[df["num_workers"] == df["devices_per_node"]]
        params[gpu] = {}
        for tp, g in intra.groupby("num_workers"):
            size = g["size"].to_numpy(float)
            y = g["time_stats.all_reduce.median"].to_numpy(float) * 1e-3

            def model(p: np.ndarray, s: np.ndarray = size) -> np.ndarray:
                return np.exp(p[0]) + s / np.exp(p[1])

            def residual(q: np.ndarray, m: Callable[[np.ndarray], np.ndarray] = model,
                         yy: np.ndarray = y) -> np.ndarray:  # fmt: skip
                return np.log(m(q) / yy)

            p = _fit(residual, np.log([2e-5, 1e11]))
            params[gpu][str(int(tp))] = {"latency_s": float(np.exp(p[0])),
                                         "bytes_s": float(np.exp(p[1]))}  # fmt: skip
            med, p90 = _errors(model(p), y)
            rows.append({"gpu": gpu, "model": node, "tp": int(tp), "op": "all_reduce",
                         "n_points": len(y), "median_abs_rel_err": med, "p90_abs_rel_err": p90,
                         "fit": "pooled"})  # fmt: skip
    return params, rows


def _calibrate_cpu(root: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    path = root / "historical" / "6d98aa8" / "a100" / "cpu_overheads.csv"
    if not path.is_file():
        raise DataError(f"{path}: missing (see shared/data/profiling/README.md)")
    df = pd.read_csv(path)
    cols = ["schedule_median", "sampler_e2e_median", "prepare_inputs_e2e_median",
            "process_model_outputs_median"]  # fmt: skip
    df["step_s"] = df[cols].sum(axis=1) * 1e-3
    params: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for (model, tp), g in df.groupby(["model_name", "tensor_parallel_degree"]):
        x, y = g["batch_size"].to_numpy(float), g["step_s"].to_numpy(float)
        slope, intercept = np.polyfit(x, y, 1)
        params[f"{model}|{int(tp)}"] = {"intercept_s": float(intercept), "per_seq_s": float(slope)}
        med, p90 = _errors(intercept + slope * x, y)
        rows.append({"gpu": "a100", "model": model, "tp": int(tp), "op": "cpu_overhead",
                     "n_points": len(y), "median_abs_rel_err": med, "p90_abs_rel_err": p90,
                     "fit": "pooled"})  # fmt: skip
    return params, rows


def calibrate(root: Path | None = None) -> CalibrationResult:
    """Fit every term of the step-time model to the measured timings under ``root``.

    Args:
        root: the profiling folder; ``<shared data>/profiling`` by default.

    Raises:
        DataError: the folder or one of its files is missing.
    """
    if root is None:
        base = data_dir()
        if base is None:
            raise DataError("no shared data folder found (set SUPERINFER_DATA)")
        root = base / "profiling"
    compute = _load_compute(root)
    gemm, rows, by_range = _calibrate_gemms(compute)
    small, small_rows = _calibrate_small(compute)
    attention, attn_rows = _calibrate_attention(root)
    allreduce, ar_rows = _calibrate_allreduce(root)
    cpu, cpu_rows = _calibrate_cpu(root)
    params = {
        "source": "shared/data/profiling (microsoft/vidur 7d47513 + historical files)",
        "token_edges": list(TOKEN_EDGES),
        "gemm": gemm,
        "small": small,
        "attention": attention,
        "allreduce": allreduce,
        "cpu_overhead": cpu,
    }
    fit_error = pd.DataFrame(rows + small_rows + attn_rows + ar_rows + cpu_rows)
    return CalibrationResult(params, fit_error, pd.DataFrame(by_range))


def params_json(result: CalibrationResult) -> str:
    """The parameters as stable, readable JSON (what the package ships)."""
    return json.dumps(result.params, indent=1, sort_keys=True) + "\n"


def _table(df: pd.DataFrame, cols: list[str]) -> str:
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, row in df.iterrows():
        cells = [f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c]) for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_report(result: CalibrationResult) -> str:
    """``report.md``: what was fitted on what, the errors, and where the model extrapolates."""
    fe = result.fit_error
    gemm = fe[fe["op"].isin(GEMM_OPS)]
    shape = gemm[gemm["fit"] == "shape"]
    misses = shape[(shape["median_abs_rel_err"] > 0.05) | (shape["p90_abs_rel_err"] > 0.20)]
    summary = (
        gemm.groupby(["gpu", "fit"])[["median_abs_rel_err", "p90_abs_rel_err"]]
        .agg(["median", "max"])
        .round(3)
    )
    summary.columns = [f"{a} {b}" for a, b in summary.columns]
    summary = summary.reset_index()
    linear = fe[fe["op"] == "linear"]
    others = (
        fe[~fe["op"].isin((*GEMM_OPS, "linear"))]
        .groupby(["gpu", "op"])
        .agg(groups=("model", "size"), n_points=("n_points", "sum"),
             median_abs_rel_err=("median_abs_rel_err", "median"),
             worst_p90=("p90_abs_rel_err", "max"))
        .reset_index()
    )  # fmt: skip
    att = result.params["attention"]
    lines = [
        "# Step-time calibration",
        "",
        "Produced by `superinfer calibrate` from `shared/data/profiling` (Vidur's measured kernel "
        "timings: A100 and H100, Llama-2 7B/70B and Llama-3 8B/70B, TP 1/2/4/8). Errors are "
        "absolute relative errors of predicted vs measured median op time. Forms of every fit: "
        "`src/superinfer/harness/offline/calibrate.py`; the simulator's model: "
        "`src/superinfer/sim/calibrated.py`.",
        "",
        "## Linear layers (GEMMs)",
        "",
        "`shape`: the fit for that GEMM shape (what the simulator uses for profiled shapes: "
        "Llama-3.1-8B/70B on A100, 70B on H100/H200); `pooled`: one fit per GPU and op over all "
        "shapes (what it uses for any other shape, e.g. Llama-3.1-8B on H100). Per (model, GPU, "
        "TP, op): `fit_error.csv`; per token range: `fit_error_by_range.csv`.",
        "",
        _table(summary, list(summary.columns)),
        "",
        f"Target: median <= 0.05 and p90 <= 0.20 for every (model, GPU, TP, op). With the `shape` "
        f"fit, {len(shape) - len(misses)} of {len(shape)} meet it; the {len(misses)} that do not:",
        "",
        _table(
            misses,
            ["gpu", "model", "tp", "op", "n_points", "median_abs_rel_err", "p90_abs_rel_err"],
        )
        if len(misses)
        else "(none)",
        "",
        "All misses are Llama-2 files (token counts 1-4,096, most points in the 128-2,048 range "
        "where cuBLAS changes kernels and measured time jumps by 20-100% between neighbouring "
        "token counts) and mostly H100. A roofline with one pair of efficiencies per token range "
        "cannot follow those steps; Vidur itself fits random forests, i.e. interpolates. Every "
        "Llama-3 (A100) group meets the target.",
        "",
        "All four linear layers of a (model, GPU, TP) together (rows `op = linear` in "
        f"`fit_error.csv`): {int((linear['median_abs_rel_err'] <= 0.05).sum())} of {len(linear)} "
        f"have median <= 0.05 and {int((linear['p90_abs_rel_err'] <= 0.20).sum())} of "
        f"{len(linear)} p90 <= 0.20:",
        "",
        _table(linear, ["gpu", "model", "tp", "n_points", "median_abs_rel_err", "p90_abs_rel_err"]),
        "",
        "## Other terms",
        "",
        "Per (GPU, op), over the profiled groups (each group in `fit_error.csv`): the median of "
        "the groups' median errors and the worst group's p90.",
        "",
        _table(others, ["gpu", "op", "groups", "n_points", "median_abs_rel_err", "worst_p90"]),
        "",
        "Small kernels (norms, RoPE, activation, add) are a few microseconds each, near the "
        "1 us resolution of the profiler, hence their larger relative errors; they are a small "
        "share of a step.",
        "",
        "## Attention: what it is fitted on, and how far it extrapolates",
        "",
        f"Only one measured attention file exists (`historical/e2d00e9/a100/attention.csv`: "
        f"A100, 70B-class GQA shape at TP2, FlashAttention). Decode is fitted on batch "
        f"{att['range']['decode_batch']} x KV length {att['range']['decode_kv_tokens']} tokens; "
        f"prefill on chunks {att['range']['prefill_chunk']} with cached context "
        f"{att['range']['prefill_context']}. The simulator applies these per-head, per-byte and "
        "per-FLOP rates to other shapes (heads per GPU at other TP degrees), extrapolates linearly "
        "to longer contexts (Mooncake prompts reach 126k tokens), and to H100/H200/GH200 by "
        "scaling the fitted bandwidth and FLOP rate by each GPU's peak ratio to A100. None of "
        "that is measured.",
        "",
    ]
    return "\n".join(lines)


def write_gpu_calibration(out: str = "results/calibration", *, install: bool = True) -> list[Path]:
    """Fit the simulator's step-time model to the measured GPU timings and write it.

    Writes ``fit_error.csv``, ``fit_error_by_range.csv``, ``params.json`` and ``report.md`` to
    ``out`` and, with ``install``, the parameters into the package (``sim/calibration.json``),
    where the simulator reads them.

    Returns:
        The output directory, then the installed file when ``install``.

    Raises:
        DataError: the profiling data is missing or malformed.
    """
    from superinfer.harness.report.results import write_atomic

    out_dir = Path(out)
    result = calibrate()
    text = params_json(result)
    fmt = "%.5g"
    write_atomic(
        out_dir / "fit_error.csv",
        lambda p: result.fit_error.to_csv(p, index=False, float_format=fmt),
    )
    write_atomic(
        out_dir / "fit_error_by_range.csv",
        lambda p: result.fit_error_by_range.to_csv(p, index=False, float_format=fmt),
    )
    write_atomic(out_dir / "params.json", lambda p: p.write_text(text))
    write_atomic(out_dir / "report.md", lambda p: p.write_text(render_report(result)))
    written = [out_dir]
    if install:
        import superinfer.sim as sim_pkg

        target = Path(sim_pkg.__file__).parent / "calibration.json"
        write_atomic(target, lambda p: p.write_text(text))
        written.append(target)
    return written
