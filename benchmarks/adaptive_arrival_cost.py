"""What the ``adaptive`` placement plugins cost at each request's arrival on SGLang, the part the
server's ``placement_us`` (the placement hook alone) does not hold: hashing the prompt into its
chunk keys (``adapters.sglang.prefix_view.prompt_chunk_keys``, in SGLang's scheduler process)
and reading them into the three shadow caches (``AdaptivePlacementPolicy.observe_request``).

Replays the prompts of ``benchmarks/sglang_kv_placement.py``'s default workload (``gen-multi-turn``,
16-token blocks, the first ``--window-s`` seconds at 3x, as token ids built by
``workload.prompts.hashed_prompt_ids`` as the server receives them) in arrival order through both,
the shadows sized as on the server (512 chunks: 8,192 tokens), and times each call. Writes
``--out`` (``part, n, us_p50, us_p90, us_p99, us_mean, us_per_1k_prompt_tokens``)::

    .venv/bin/python benchmarks/adaptive_arrival_cost.py \
        --out results/sglang-kv-placement/prompts/arrival_cost.csv
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from superinfer.adapters.sglang.prefix_view import prompt_chunk_keys
from superinfer.harness.offline.cache_workloads import generated_workload
from superinfer.harness.workload.prompts import hashed_prompt_ids
from superinfer.policy_core.kv_placement_adaptive import AdaptivePlacementPolicy
from superinfer.policy_core.types import SLO, KVLocation, PrefixNodeView, RequestView

#: The tiny-Llama fixture's vocabulary (the SmolLM2 tokenizer's), as on the server.
VOCAB = 49_152


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window-s", type=float, default=600.0)
    parser.add_argument("--capacity-chunks", type=int, default=512)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    workload = generated_workload(
        "gen-multi-turn", block_tokens=16, window_s=args.window_s, max_prompt_tokens=1900,
        output_tokens=8, seed=0, speedup=3.0,
    )  # fmt: skip
    chat = SLO("chat", ttft_ms=1000.0)
    policy = AdaptivePlacementPolicy()
    shown = tuple(f"s{i}" for i in range(args.capacity_chunks))
    sizer = PrefixNodeView("s", None, 16 * len(shown), len(shown), KVLocation.HBM, 0, 0.0, False,
                           content_key="s", chunk_keys=shown)  # fmt: skip
    hashing, reading, tokens = [], [], 0
    for i, r in enumerate(workload.requests):
        ids = hashed_prompt_ids(r.block_hashes, 16, r.prompt_tokens, vocab_size=VOCAB, index=i)
        req = SimpleNamespace(origin_input_ids=ids, extra_key=None, cache_salt=None)
        start = time.perf_counter()
        keys = prompt_chunk_keys(req, 1)
        hashing.append(time.perf_counter() - start)
        view = RequestView(f"r{i}", r.arrival_s, len(ids), 8, chat, prompt_chunk_keys=keys)
        start = time.perf_counter()
        policy.observe_request(view)
        reading.append(time.perf_counter() - start)
        tokens += len(ids)
        if i == 0:  # the first eviction sizes the shadows, as on the server
            policy.decide((sizer,), 0.0, 0, 0, 0, len(shown))
    rows = []
    for part, secs in (("prompt_chunk_keys", hashing), ("observe_request", reading)):
        us = np.asarray(secs) * 1e6
        rows.append({
            "part": part, "n": len(us), "us_p50": np.percentile(us, 50),
            "us_p90": np.percentile(us, 90), "us_p99": np.percentile(us, 99), "us_mean": us.mean(),
            "us_per_1k_prompt_tokens": us.sum() / tokens * 1e3,
        })  # fmt: skip
        print(rows[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out, index=False, float_format="%.4g")
    print(f"wrote {args.out}; leader {policy.leader}, switches {policy.switches}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
