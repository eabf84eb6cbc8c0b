"""How the headline hour's long chat prompts were prefilled: every chat of a prompt-length band,
sorted by how its prefill ran and whether it met its SLO (issue 18).

    PYTHONPATH=src python benchmarks/long_prompt_chunks.py [--policy-opt KEY=VALUE ...] [--out F]

runs ``superinfer`` on the headline workload (``superinfer bench``'s defaults: the Azure hour,
Llama-3.1-70B on 4 x A100 TP4; ``--engine``, ``--rate-scale``) and records, for each chat of
``--min-tokens`` < prompt <= ``--max-tokens`` that an idle replica could serve in time
(``feasible``), the steps that gave it prefill tokens. Each is counted in one kind:

* ``never``: no prefill token (rejected while waiting);
* ``two steps``: its prompt in at most two steps;
* ``budget-bound``: three or more, every one but the last filling the engine's token budget
  (its chunks were as large as the step allowed: the decodes beside it took the rest);
* ``time-bound``: three or more, some not filling the budget (TPOT protection sized them);

with ``+queued`` when its first chunk came more than 0.15 s after its arrival. Prints a table of
kind x met / missed; with ``--out FILE.csv`` also writes it (columns ``kind, met, missed``,
one row per kind, ``+queued`` kept apart). Deterministic (a simulated run).
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pandas as pd

from superinfer.adapters.manager import available_policies
from superinfer.harness.bench import run_bench
from superinfer.harness.engines.base import BenchConfig

#: A first chunk later than this after arrival counts as queued, s.
QUEUED_S = 0.15


def kind_of(chunks: list[tuple[float, int, int, int]], arrival_s: float) -> str:
    """The kind of one request's prefill from its ``(instant s, its tokens, the step's tokens,
    the budget)`` steps that gave it tokens, in order (see the module docstring)."""
    if not chunks:
        return "never"
    if len(chunks) <= 2:
        kind = "two steps"
    elif all(total >= budget for _, _, total, budget in chunks[:-1]):
        kind = "budget-bound"
    else:
        kind = "time-bound"
    return kind + (" +queued" if chunks[0][0] - arrival_s > QUEUED_S else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", default="sim:vllm")
    ap.add_argument("--rate-scale", type=float, default=0.6)
    ap.add_argument("--min-tokens", type=int, default=4000)
    ap.add_argument("--max-tokens", type=int, default=4200)
    ap.add_argument("--policy-opt", action="append", default=[], help="KEY=VALUE (repeatable)")
    ap.add_argument("--out", type=Path, help="also write the table here (CSV)")
    args = ap.parse_args()
    cls: Any = available_policies()["superinfer"].load()
    original = cls.schedule
    chunks: defaultdict[str, list[tuple[float, int, int, int]]] = defaultdict(list)

    def traced(self: Any, state: Any) -> Any:
        decision = original(self, state)
        total = sum(decision.num_tokens.values())
        for v in (*state.running, *state.waiting):
            n = decision.num_tokens.get(v.request_id, 0)
            band = args.min_tokens < v.prompt_tokens <= args.max_tokens
            if n and band and v.slo.name == "chat" and v.first_token_s is None:
                chunks[v.request_id].append((state.now_s, n, total, state.token_budget))
        return decision

    cls.schedule = traced
    opts = dict(kv.split("=", 1) for kv in args.policy_opt)
    cfg = BenchConfig(
        engines=(args.engine,),
        policies=("superinfer",),
        rate_scale=args.rate_scale,
        policy_options={"superinfer": opts},
    )
    req = run_bench(cfg).requests
    band = req[
        (req.slo_class == "chat")
        & req.feasible.astype(bool)
        & (req.prompt_tokens > args.min_tokens)
        & (req.prompt_tokens <= args.max_tokens)
    ]
    counts: Counter[tuple[str, bool]] = Counter()
    for rid, arrival, met in zip(band.request_id, band.arrival_s, band.met_slo, strict=True):
        counts[kind_of(chunks.get(rid, []), float(arrival)), bool(met)] += 1
    print(f"{len(band)} feasible chats of {args.min_tokens + 1}-{args.max_tokens} prompt tokens")
    print("| kind | met | missed |\n|---|---:|---:|")
    rows = [(k, counts[k, True], counts[k, False]) for k in sorted({k for k, _ in counts})]
    for kind, met, missed in rows:
        print(f"| {kind} | {met} | {missed} |")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows, columns=["kind", "met", "missed"]).to_csv(args.out, index=False)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
