"""Every step of one request's replica from its arrival to its first token, as the policy decided
it: a tool for reading why a request missed its TTFT in a simulated run (issue 18).

    PYTHONPATH=src python benchmarks/trace_request_steps.py --request-id conv-494

runs the headline workload (``superinfer bench``'s defaults: the Azure hour, Llama-3.1-70B on
4 x A100 TP4; ``--engine``, ``--rate-scale``, ``--policy`` and ``--policy-opt`` as in ``bench``)
up to ``--until-s`` of the run clock and prints, for each ``schedule()`` call on the replica that
holds the request while it waits or prefills (and the first call after its first token): the
instant (s), the tokens the decision gives the
request, the step's tokens in all, its decodes, its running and waiting requests, and the other
prefill chunks in it (largest first). Then the request's row of the run (arrival, first token,
TTFT). Prints only; deterministic (a simulated run).
"""

from __future__ import annotations

import argparse
from typing import Any

from superinfer.adapters.manager import available_policies
from superinfer.harness.bench import run_bench
from superinfer.harness.engines.base import BenchConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--request-id", required=True)
    ap.add_argument("--engine", default="sim:vllm")
    ap.add_argument("--rate-scale", type=float, default=0.6)
    ap.add_argument("--policy", default="superinfer")
    ap.add_argument("--policy-opt", action="append", default=[], help="KEY=VALUE (repeatable)")
    ap.add_argument("--until-s", type=float, default=None, help="run clock to stop at, s")
    args = ap.parse_args()
    rid = args.request_id
    cls: Any = available_policies()[args.policy].load()
    steps: list[str] = []
    done: list[bool] = [False]
    original = cls.schedule

    def traced(self: Any, state: Any) -> Any:
        decision = original(self, state)
        views = {v.request_id: v for v in (*state.waiting, *state.running, *state.swapped)}
        v = views.get(rid)
        if v is not None and not done[0]:
            # RequestView.is_prefilling tells a prefill chunk from a decode (a 1-token remainder
            # of a prompt is a prefill, not a decode)
            prefilling = [(k, n) for k, n in decision.num_tokens.items() if views[k].is_prefilling]
            chunks = sorted(((k, n) for k, n in prefilling if k != rid), key=lambda kn: -kn[1])
            decodes = len(decision.num_tokens) - len(prefilling)
            steps.append(
                f"{state.now_s:10.3f} s  replica {state.replica}  it: "
                f"{decision.num_tokens.get(rid, 0):5d} of {v.pending_tokens:5d} pending  step: "
                f"{sum(decision.num_tokens.values()):5d} tokens, {decodes:3d} decodes, "
                f"running {len(state.running):3d}, waiting {len(state.waiting):3d}  "
                f"other chunks {chunks[:4]}"
            )
            done[0] = v.first_token_s is not None
        return decision

    cls.schedule = traced
    opts = dict(kv.split("=", 1) for kv in args.policy_opt)
    cfg = BenchConfig(
        engines=(args.engine,),
        policies=(args.policy,),
        rate_scale=args.rate_scale,
        duration_s=args.until_s,
        policy_options={args.policy: opts},
    )
    result = run_bench(cfg)
    print("\n".join(steps))
    row = result.requests[result.requests.request_id == rid]
    print(row[["request_id", "replica", "prompt_tokens", "arrival_s", "first_token_s", "ttft_ms"]])


if __name__ == "__main__":
    main()
