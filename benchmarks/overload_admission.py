"""Overload behaviour of the ``superinfer`` policy's admission rule against ``fcfs`` (issue 18).

At every load of the headline sweep (``harness.suites.SWEEP_RATE_SCALES``, x0.3-1.6 of the Azure
hour's rate), on each simulated engine, runs ``fcfs`` and ``superinfer`` under each admission
variant (``--policy-opt`` sets), and writes per engine x load x policy x class: TTFT p99,
attainment (all and feasible), rejections and their reasons. The criterion: no class's TTFT p99
under ``superinfer`` above ``fcfs``'s, at every load.

    PYTHONPATH=src python benchmarks/overload_admission.py --duration-s 900 --out results/overload

Shorter windows than the hour keep it cheap (the decision needs the ordering, not the hour);
the window is written in the manifest and the CSV (``--duration-s 0``: the whole hour).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from superinfer.harness.bench import run_bench
from superinfer.harness.engines.base import BenchConfig
from superinfer.harness.report.results import short_sha
from superinfer.harness.suites import SWEEP_RATE_SCALES

#: ``superinfer`` is the policy's default (``reject_hopeless=true`` since issue 18);
#: ``superinfer+demote_hopeless`` the earlier rule (hopeless requests demoted, not rejected);
#: ``superinfer+reject_hopeless`` names the default explicitly (the same runs as ``superinfer``).
VARIANTS = {
    "fcfs": ("fcfs", {}),
    "superinfer": ("superinfer", {}),
    "superinfer+demote_hopeless": ("superinfer", {"reject_hopeless": "false"}),
    "superinfer+reject_hopeless": ("superinfer", {"reject_hopeless": "true"}),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engines", default="sim:vllm,sim:sglang,sim:trtllm")
    ap.add_argument("--rates", default=",".join(str(r) for r in SWEEP_RATE_SCALES))
    ap.add_argument("--duration-s", type=float, default=900.0, help="run clock, s; 0: the hour")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--extra", action="append", default=[],
                    help="NAME=KEY=VALUE[;KEY=VALUE]: another superinfer variant")  # fmt: skip
    ap.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE",
                    help="an engine option of every run, e.g. mixed_batches=1")  # fmt: skip
    ap.add_argument("--out", default="results/overload")
    args = ap.parse_args()
    engine_options = dict(kv.split("=", 1) for kv in args.engine_option)
    variants = {k: VARIANTS[k] for k in args.variants.split(",") if k}
    for item in args.extra:
        name, _, opts = item.partition("=")
        variants[name] = ("superinfer", dict(kv.split("=", 1) for kv in opts.split(";") if kv))
    rows = []
    t0 = time.time()
    for engine in args.engines.split(","):
        for rate in (float(r) for r in args.rates.split(",")):
            for label, (policy, opts) in variants.items():
                cfg = BenchConfig(
                    engines=(engine,), policies=(policy,), rate_scale=rate,
                    duration_s=args.duration_s or None, policy_options={policy: opts},
                    engine_options=engine_options,
                )  # fmt: skip
                res = run_bench(cfg)
                req = res.requests
                for _, row in res.summary.iterrows():
                    part = req if row.slo_class == "all" else req[req.slo_class == row.slo_class]
                    rejected = part[part.status != "finished"]
                    reasons = rejected.groupby(["status", "reason"]).size()
                    rows.append({
                        "engine": engine, "rate_scale": rate, "variant": label,
                        "slo_class": row.slo_class, "n_requests": row.n_requests,
                        "ttft_p99_ms": row.ttft_p99_ms, "slo_attainment": row.slo_attainment,
                        "tpot_p99_ms": row.tpot_p99_ms,
                        "slo_attainment_feasible": row.slo_attainment_feasible,
                        "n_rejected": row.n_rejected, "n_failed": row.n_failed,
                        "output_tok_s": row.output_tok_s,
                        "reasons": "; ".join(f"{s}:{r}={n}" for (s, r), n in reasons.items()),
                    })  # fmt: skip
                print(f"{engine} x{rate} {label}: {time.time() - t0:.0f} s", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(rows)
    df.to_csv(out / "overload.csv", index=False, float_format="%.6g")
    # the commit of the superinfer source that ran (a worktree's on PYTHONPATH), not the cwd's
    meta = {
        "command": ["benchmarks/overload_admission.py", *sys.argv[1:]],
        "git_sha": short_sha(7), "machine": platform.platform(), "duration_s": args.duration_s,
        "date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "variants": {k: [p, o] for k, (p, o) in variants.items()},
        "engine_options": engine_options,
        "wall_s": round(time.time() - t0, 1),
    }  # fmt: skip
    (out / "overload_meta.json").write_text(json.dumps(meta, indent=2) + "\n")


if __name__ == "__main__":
    main()
