"""Why SGLang's ``--enable-mixed-chunk`` costs throughput on the CPU server: mixed steps, traced.

The engines suite on the SGLang 0.5.23 CPU server lost 17-22 % output tokens/s with
``--enable-mixed-chunk`` (results/sglang-mixed-chunk/README.md), where ``sim:sglang`` gains from
the same flag. A mixed batch is an EXTEND batch in which each running decode extends by one token.
SGLang's CPU attention backend (``--attention-backend torch_native``,
``sglang/srt/layers/attention/torch_native_backend.py``, 0.5.23, ``_run_sdpa_forward_extend``)
runs an extend request's attention with a query padded to the request's whole context
(``per_req_query_redudant``, ``seq_len_kv`` rows, causal): an L-token context costs an L x L
attention per layer even when one token is new, where the decode path
(``_run_sdpa_forward_decode``) runs 1 x L. GPU backends (FlashInfer, Triton) compute the new
tokens' rows only, which is what the simulator charges.

Two measurements, written to ``--out``:

1. ``mixed_attention_microbench.csv``: the backend's own two functions, timed on this machine for
   ``--decodes`` requests with a context of L tokens each, SmolLM2-135M's attention shape (9 query
   heads, 3 KV heads, head dim 64, bf16; read from the model's ``config.json``): ms per layer as
   one-token extends (inside a mixed batch) and as decodes, and the difference over all layers
   (columns ``round, context_tokens, requests, extend_ms_per_layer, decode_ms_per_layer, layers,
   redundant_ms_per_step``; median of ``--repeats`` calls, ``--rounds`` rounds).
2. ``mixed_step_excess.csv``: each mixed step of the ``--mixed`` step log (the suite's
   ``steps.parquet``, ``adapters/sglang/steplog.py`` columns) against the same work as one
   prefill step plus one decode step, timed by step-time models fitted (``fit_steps``, the
   ``calibrate --engine sglang`` fit) on the prefill steps and on the decode steps of the
   ``--default`` log (the same suite without the flag). The log has totals only, so the split is
   an assumption: the prefill requests' prefix is taken as 0 and the rest of ``prefix_tokens`` as
   the decodes' context (``D = prefix_tokens + decodes``); a real prefill prefix moves context from
   the decodes' side, where a key token costs little, so the excess is if anything understated.
   ``redundant_ms`` is the microbenchmark's per-request difference (median over the rounds) at
   the decodes' mean context (``D / decodes``, linear between measured contexts, capped at the
   largest), times the decodes.
   One row per run of the mixed log and one ``all`` row (columns ``run, mixed_steps,
   measured_s, separate_s, excess_s, excess_ms_per_step, redundant_s, corr, decode_speed_ratio``;
   ``corr``: Pearson correlation of the per-step excess with the per-step ``redundant_ms``;
   ``decode_speed_ratio``: the mixed log's plain decode steps, measured over the default log's
   decode model: the host-speed check, near 1 when the host ran at the same speed in both runs).
3. ``mixed_replay.csv`` and ``mixed_replay_fidelity.csv``: ``sim:sglang-cpu`` (SGLang's
   mechanics with the fitted CPU step time) replaying both real runs (``--default-run`` and
   ``--mixed-run``: each run's ``summary.csv`` and manifest; ``--enable-mixed-chunk`` in the
   manifest's ``sglang_args`` gives the replay ``mixed_batches=1``), once with each run's own
   step-time fit and once with the default run's fit for both (a prediction of the mixed run
   from a log without a mixed step). Fits: ``suites_engines_knee.step_log_fit`` on the step
   logs above, as the suite fits them, with ``--request-latency-ms`` as the request path.
   ``mixed_replay.csv``: per fit, run, side (``real`` / ``simulated``) and policy, the means
   over the repeats of chat attainment, chat TTFT p99, chat TPOT p50 and output tokens/s of
   every class; ``mixed_replay_fidelity.csv``: ``fit, run`` and the rows of
   ``benchmarks/fidelity_cpu.py`` (issue 19's bounds). ``mixed_replay.csv`` ends with the
   what-if run ``mixed_extend_rows``: the mixed run simulated from the default run's fit with
   ``extend_decodes=0``, i.e. on servers with ``adapters/sglang/extend_rows.py``.

Usage::

    python benchmarks/sglang_mixed_cost.py \\
        --default results/sglang-mixed-chunk/real_default_steps.parquet \\
        --mixed results/sglang-mixed-chunk/real_mixed_steps.parquet \\
        --default-run results/sglang-mixed-chunk/real_default \\
        --mixed-run results/sglang-mixed-chunk/real_mixed \\
        --out results/sglang-mixed-chunk

(``--default-run PREFIX`` reads ``PREFIX_summary.csv`` and ``PREFIX_run_manifest.json``, or a
suite run folder's ``summary.csv`` and ``manifest.json`` when ``PREFIX`` is that folder.)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from superinfer.adapters.sglang.real_model import default_real_model_dir
from superinfer.harness.errors import UserError
from superinfer.harness.offline.calibrate_hf import fit_steps
from superinfer.harness.report.results import CSV_FLOAT_FORMAT, write_atomic
from superinfer.harness.suites_engines_fidelity import fidelity, fidelity_csv
from superinfer.harness.suites_engines_knee import step_log_fit
from superinfer.harness.suites_engines_replay import resimulate
from superinfer.harness.suites_engines_report import aggregate
from superinfer.sim.hf_cpu import shape_of_totals

CONTEXTS = (128, 256, 512, 768, 1024)  # the CPU recipe's --context-length is 1,024 (launch.py)


def _attention_shape(config: Path) -> tuple[int, int, int, int]:
    """(query heads, KV heads, head dim, layers) from a Llama ``config.json``."""
    cfg = json.loads(config.read_text())
    heads, layers = int(cfg["num_attention_heads"]), int(cfg["num_hidden_layers"])
    return heads, int(cfg["num_key_value_heads"]), int(cfg["hidden_size"]) // heads, layers


def _median_ms(call: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``call()`` over ``repeats`` calls after one warm-up call, ms."""
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def microbench(config: Path, decodes: int, repeats: int, rounds: int) -> pd.DataFrame:
    """Time torch_native's extend and decode attention for ``decodes`` requests of each context
    in :data:`CONTEXTS` (ms per layer, median of ``repeats`` after one warm-up call), ``rounds``
    times over (one row per round and context: the host moves a round's medians by up to 40 %)."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    backend = object.__new__(TorchNativeAttnBackend)  # the two functions read no state
    heads, kv_heads, dim, layers = _attention_shape(config)
    rows = []
    for rnd, ctx in ((r, c) for r in range(rounds) for c in CONTEXTS):
        k = torch.randn(decodes * ctx, kv_heads, dim, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        req_to_token = torch.arange(decodes * ctx, dtype=torch.int32).view(decodes, ctx)
        pool, lens = torch.arange(decodes), torch.full((decodes,), ctx)
        q = torch.randn(decodes, heads, dim, dtype=torch.bfloat16)
        args = (q, torch.empty_like(q), k, v, req_to_token, pool, lens)
        common = {"scaling": dim**-0.5, "enable_gqa": kv_heads != heads}
        ones = torch.ones(decodes, dtype=torch.int64)
        extend = partial(
            backend._run_sdpa_forward_extend, *args, lens - 1, ones, causal=True, **common
        )
        decode = partial(backend._run_sdpa_forward_decode, *args, causal=False, **common)
        ms = {"extend": _median_ms(extend, repeats), "decode": _median_ms(decode, repeats)}
        rows.append(
            {
                "round": rnd,
                "context_tokens": ctx,
                "requests": decodes,
                "extend_ms_per_layer": ms["extend"],
                "decode_ms_per_layer": ms["decode"],
                "layers": layers,
                "redundant_ms_per_step": (ms["extend"] - ms["decode"]) * layers,
            }
        )
    return pd.DataFrame(rows)


def _predict(model: object, tokens: pd.Series, seqs: pd.Series, kv: pd.Series) -> np.ndarray:
    """Fitted step time (ms) of steps with these totals, 0 where a step has no sequence."""
    return np.array(
        [
            model.step_time_s(shape_of_totals(int(t), int(s), int(s), int(k))) * 1e3  # type: ignore[attr-defined]
            if s > 0
            else 0.0
            for t, s, k in zip(tokens, seqs, kv, strict=True)
        ]
    )


def step_excess(default: pd.DataFrame, mixed: pd.DataFrame, bench: pd.DataFrame) -> pd.DataFrame:
    """Mixed steps against the same work as separate prefill and decode steps (module docstring)."""
    prefill_model, _ = fit_steps(default[default["kind"] == "prefill"].copy())
    decode_model, _ = fit_steps(default[default["kind"] == "decode"].copy())
    steps = mixed[mixed["kind"] == "mixed"].copy()
    if steps.empty:
        raise UserError("--mixed: the step log has no mixed step (run with --enable-mixed-chunk)")
    decodes = steps["num_decode_tokens"].astype(int)
    context = steps["prefix_tokens"].astype(int) + decodes
    prefill_tokens = steps["num_prefill_tokens"].astype(int)
    steps["separate_ms"] = _predict(
        prefill_model, prefill_tokens, steps["num_seqs"] - decodes, prefill_tokens
    ) + _predict(decode_model, decodes, decodes, context)
    med = bench.groupby("context_tokens", as_index=False)[["redundant_ms_per_step", "requests"]]
    med = med.median()  # over the rounds
    per_request = med["redundant_ms_per_step"] / med["requests"]
    mean_ctx = (context / decodes.clip(lower=1)).clip(upper=med["context_tokens"].max())
    steps["redundant_ms"] = decodes * np.interp(mean_ctx, med["context_tokens"], per_request)
    steps["excess_ms"] = steps["duration_ms"] - steps["separate_ms"]
    plain = mixed[mixed["kind"] == "decode"].copy()
    n = plain["num_seqs"].astype(int)
    plain["predicted_ms"] = _predict(decode_model, n, n, plain["kv_tokens"].astype(int))
    rows = []
    for run in [*sorted(steps["run"].unique()), "all"] if "run" in steps else ["all"]:
        g = steps if run == "all" else steps[steps["run"] == run]
        d = plain if run == "all" else plain[plain["run"] == run]
        rows.append(
            {
                "run": run,
                "mixed_steps": len(g),
                "measured_s": g["duration_ms"].sum() / 1e3,
                "separate_s": g["separate_ms"].sum() / 1e3,
                "excess_s": g["excess_ms"].sum() / 1e3,
                "excess_ms_per_step": g["excess_ms"].mean(),
                "redundant_s": g["redundant_ms"].sum() / 1e3,
                "corr": float(np.corrcoef(g["excess_ms"], g["redundant_ms"])[0, 1]),
                "decode_speed_ratio": d["duration_ms"].sum() / d["predicted_ms"].sum(),
            }
        )
    return pd.DataFrame(rows)


#: The SGLang CPU server's request path outside its scheduler steps on this host, ms: the
#: ``request_latency_ms`` the suite measured on its lone requests in
#: results/engines-cpu/sglang-host-speed-knee/sglang_step_time.json (the two runs replayed here
#: had no lone pass).
REQUEST_LATENCY_MS = 38.9


def _run_dir(prefix: Path, steps: pd.DataFrame, into: Path, latency_ms: float) -> Path:
    """A suite run folder for ``resimulate``: ``PREFIX_summary.csv`` and
    ``PREFIX_run_manifest.json`` as ``summary.csv`` and ``manifest.json``, and the fit of
    ``steps`` as ``sglang_step_time.json``."""
    into.mkdir(parents=True)
    for suffix, name in (("_summary.csv", "summary.csv"), ("_run_manifest.json", "manifest.json")):
        src = prefix / name if prefix.is_dir() else prefix.parent / f"{prefix.name}{suffix}"
        if not src.is_file():
            raise UserError(f"{src}: no such file (a suite run's {name}, copied)")
        shutil.copy(src, into / name)
    fit = step_log_fit(steps, "sglang", {}, iterations=True)
    if fit is None:
        raise UserError(f"{prefix}: too few steps of the sglang runs to fit a step time")
    fit["request_latency_ms"] = latency_ms
    (into / "sglang_step_time.json").write_text(json.dumps(fit, indent=2) + "\n")
    return into


def _means(summary: pd.DataFrame) -> pd.DataFrame:
    """Per engine and policy, means over the repeats of the :func:`replay` columns."""
    chat, every = summary[summary["slo_class"] == "chat"], summary[summary["slo_class"] == "all"]
    keys = ["engine", "policy"]
    out = chat.groupby(keys)[["slo_attainment", "ttft_p99_ms", "tpot_p50_ms"]].mean()
    out.columns = ["chat_attainment", "chat_ttft_p99_ms", "chat_tpot_p50_ms"]
    return out.join(every.groupby(keys)["output_tok_s"].mean()).reset_index()


def replay(
    runs: dict[str, tuple[Path, pd.DataFrame]], latency_ms: float
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``sim:sglang-cpu`` replaying each run of ``runs`` (``{name: (prefix, step log)}``, the
    default run first) with each run's own fit and with the first run's (module docstring)."""
    rows, fid_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {
            name: _run_dir(prefix, steps, Path(tmp) / name, latency_ms)
            for name, (prefix, steps) in runs.items()
        }
        first = next(iter(dirs.values())) / "sglang_step_time.json"
        for label, fit in (("own", None), (f"{next(iter(dirs))}_log", first)):
            for name, src in dirs.items():
                frame = resimulate(src, "sim:sglang-cpu", fit=fit)
                means = _means(frame)
                means.insert(
                    0, "side", ["real" if e == "sglang" else "simulated" for e in means["engine"]]
                )
                means.insert(0, "run", name)
                means.insert(0, "fit", label)
                rows.append(means.drop(columns="engine"))
                fid = fidelity_csv(fidelity(aggregate(frame)))
                fid.insert(0, "run", name)
                fid.insert(0, "fit", label)
                fid_rows.append(fid)
        # what the last run would have done on servers with adapters/sglang/extend_rows.py
        last = list(dirs)[-1]
        frame = resimulate(dirs[last], "sim:sglang-cpu", {"extend_decodes": "0"}, fit=first)
        means = _means(frame[frame["engine"] != "sglang"]).drop(columns="engine")
        means.insert(0, "side", "simulated")
        means.insert(0, "run", f"{last}_extend_rows")
        means.insert(0, "fit", f"{next(iter(dirs))}_log")
        rows.append(means)
    return pd.concat(rows, ignore_index=True), pd.concat(fid_rows, ignore_index=True)


def _read_log(path: Path, flag: str) -> pd.DataFrame:
    """A step log, or a one-line error naming the flag."""
    try:
        steps = pd.read_parquet(path)
    except (OSError, ValueError) as exc:
        raise UserError(f"{flag} {path}: cannot read a step log: {exc}") from None
    need = {"kind", "duration_ms", "num_seqs", "num_prefill_tokens", "num_decode_tokens"}
    if missing := sorted(need - set(steps.columns)):
        raise UserError(f"{flag} {path}: not an SGLang step log (no column {', '.join(missing)})")
    return steps


def _write_csv(frame: pd.DataFrame, path: Path) -> None:
    frame.to_csv(path, index=False, float_format=CSV_FLOAT_FORMAT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--default", type=Path, required=True, help="step log without the flag")
    parser.add_argument("--mixed", type=Path, required=True, help="step log with the flag")
    parser.add_argument("--model-config", type=Path, default=None)
    parser.add_argument("--decodes", type=int, default=5, help="requests per microbench step")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5, help="microbenchmark rounds")
    parser.add_argument(
        "--microbench", type=Path, default=None, help="reuse this mixed_attention_microbench.csv"
    )
    parser.add_argument("--default-run", type=Path, required=True, metavar="PREFIX")
    parser.add_argument("--mixed-run", type=Path, required=True, metavar="PREFIX")
    parser.add_argument("--request-latency-ms", type=float, default=REQUEST_LATENCY_MS)
    parser.add_argument("--mixed-name", default="mixed", help="the --mixed-run's name in the CSVs")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    try:
        default, mixed = _read_log(args.default, "--default"), _read_log(args.mixed, "--mixed")
        config = args.model_config or default_real_model_dir() / "config.json"
        if not config.is_file():
            raise UserError(f"--model-config {config}: no such file (make install-smollm2-sglang)")
        if args.microbench:  # a CSV this script wrote: the same estimate, no new timing
            bench = pd.read_csv(args.microbench)
        else:
            bench = microbench(config, args.decodes, args.repeats, args.rounds)
        excess = step_excess(default, mixed, bench)
        runs = {"default": (args.default_run, default), args.mixed_name: (args.mixed_run, mixed)}
        replayed, fid = replay(runs, args.request_latency_ms)
    except UserError as exc:
        sys.exit(f"error: {exc}")
    outputs = (
        ("mixed_attention_microbench", bench),
        ("mixed_step_excess", excess),
        ("mixed_replay", replayed),
        ("mixed_replay_fidelity", fid),
    )
    for name, frame in outputs:
        path = args.out / f"{name}.csv"
        write_atomic(path, partial(_write_csv, frame))
        print(f"{path}\n{frame.to_string(index=False)}")


if __name__ == "__main__":
    main()
