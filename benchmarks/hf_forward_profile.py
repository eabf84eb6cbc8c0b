"""Inside the forward pass: how much of SmolLM2-135M's CPU forward is kernels, how much Python.

The per-step profile (``steps.parquet``) shows that the engine's own Python outside the model
(scheduling, input preparation, sampling, output handling) is about 1% of a step; this looks inside
the forward. It runs the model's forward under ``torch.profiler`` for a decode step (``B`` new
tokens over a 200-token cache per sequence, plain KV cache) and for a 256-token prefill, and splits
the wall time into the linear layers (``aten::linear``: the GEMMs and the LM head), attention
(``aten::scaled_dot_product_attention``), other top-level aten ops, and the rest: Python, module
dispatch and the profiler itself. The engine's paged path adds its cache gather/scatter to the
attention share; the linear-layer share is the same.

Usage::

    python benchmarks/hf_forward_profile.py [--threads N] [--out results/hf/forward_profile.csv]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile
from transformers import DynamicCache

from superinfer.adapters.hf.engine import load_smollm2
from superinfer.harness.report.results import CSV_FLOAT_FORMAT, write_atomic

CASES = (("decode", 1, 1, 200), ("decode", 8, 1, 200), ("prefill", 1, 256, 0))


def _inputs(batch: int, new: int, past: int, model: object) -> dict[str, object]:
    ids = torch.arange(100, 100 + new).repeat(batch, 1)
    kwargs: dict[str, object] = {"input_ids": ids}
    if past:
        cache = DynamicCache()
        with torch.inference_mode():
            model(input_ids=torch.arange(300, 300 + past).repeat(batch, 1), past_key_values=cache)  # type: ignore[operator]
        kwargs["past_key_values"] = cache
    return kwargs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("results/hf/forward_profile.csv"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_smollm2().model
    rows = []
    for kind, batch, new, past in CASES:
        walls, linear, attn, other = [], 0.0, 0.0, 0.0
        for _ in range(args.repeats):
            kwargs = _inputs(batch, new, past, model)
            with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
                start = time.perf_counter()
                model(**kwargs)
                walls.append(time.perf_counter() - start)
            for evt in prof.events():
                if evt.cpu_parent is not None or not evt.name.startswith("aten::"):
                    continue  # nested ops are inside their top-level op's time
                seconds = evt.cpu_time_total / 1e6
                if evt.name == "aten::linear":
                    linear += seconds
                elif evt.name == "aten::scaled_dot_product_attention":
                    attn += seconds
                else:
                    other += seconds
        n = args.repeats
        wall = sum(walls) / n
        rows.append(
            {
                "case": f"{kind} B={batch} new={new} past={past}",
                "threads": torch.get_num_threads(),
                "wall_ms": wall * 1e3,
                "linear_ms": linear / n * 1e3,
                "attention_ms": attn / n * 1e3,
                "other_ops_ms": other / n * 1e3,
                "python_and_dispatch_ms": (wall - (linear + attn + other) / n) * 1e3,
            }
        )
    df = pd.DataFrame(rows)
    for col in ("linear_ms", "attention_ms", "other_ops_ms", "python_and_dispatch_ms"):
        df[col.replace("_ms", "_share")] = df[col] / df["wall_ms"]
    write_atomic(args.out, lambda p: df.to_csv(p, index=False, float_format=CSV_FLOAT_FORMAT))
    print(df.round(3).to_string(index=False))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
