"""SmolLM2-135M-Instruct: load time from the GGUF vs its dense copy, and what the copy's memory
does to a decode step.

Two measurements (``adapters/hf/dense.py``, ``dense_build.py``, ``engine.load_model_folder``):

- **load**: ``load_smollm2()`` in a fresh process each time (imports excluded; the tokenizer, the
  weights and the warm-up forward included), alternating the GGUF (``from_gguf=True``) and the
  dense copy, ``--repeats`` of each.
- **decode step**: one process holds three loads of the same weights: from the GGUF, from the
  dense copy as the engine loads it (each weight copied into its own numpy array), and from the
  dense copy left on the safetensors file's mapped pages (``from_pretrained`` alone). It times a
  batch-32 decode forward (one new token per sequence, no cache) ``--rounds`` times, rotating the
  order each round, and reports each load's median and its median ratio to the GGUF load's time
  in the same round.

Usage::

    python benchmarks/smollm2_load.py [--repeats 3] [--rounds 40] \\
        [--out results/benchmarks/smollm2_load.csv]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from superinfer.harness.report.results import CSV_FLOAT_FORMAT, write_atomic

_LOAD = """
import json, sys, time
from superinfer.adapters.hf.engine import load_smollm2
t = time.perf_counter()
loaded = load_smollm2(from_gguf=sys.argv[1] == "gguf")
print(json.dumps({"load_s": time.perf_counter() - t, "source": str(loaded.source)}))
"""


def _load_times(repeats: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for i in range(repeats):
        for source in ("gguf", "dense"):
            out = subprocess.run([sys.executable, "-c", _LOAD, source], check=True,
                                 capture_output=True, text=True).stdout  # fmt: skip
            got = json.loads(out.strip().splitlines()[-1])
            rows.append({"measure": "load_s", "variant": source, "repeat": i,
                         "value": got["load_s"], "detail": got["source"]})  # fmt: skip
    return rows


def _decode_steps(rounds: int) -> list[dict[str, object]]:
    import torch
    from transformers import AutoModelForCausalLM

    from superinfer.adapters.hf.dense import default_dense_dir
    from superinfer.adapters.hf.engine import load_model_folder, load_smollm2

    folder = default_dense_dir()
    models = {
        "gguf": load_smollm2(from_gguf=True).model,
        "dense (engine: own arrays)": load_model_folder(folder).model,
        "dense (file's mapped pages)": AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32
        ).eval(),
    }
    ids = torch.arange(100, 132).unsqueeze(1)
    times: dict[str, list[float]] = {k: [] for k in models}
    with torch.inference_mode():
        for model in models.values():
            model(input_ids=ids)
        order = list(models)
        for r in range(rounds):
            for name in order[r % 3 :] + order[: r % 3]:
                t = time.perf_counter()
                for _ in range(2):
                    models[name](input_ids=ids)
                times[name].append((time.perf_counter() - t) / 2)
    rows: list[dict[str, object]] = []
    for name, ts in times.items():
        ratio = statistics.median(a / b for a, b in zip(ts, times["gguf"], strict=True))
        median_ms = 1000 * statistics.median(ts)
        rows.append({"measure": "decode32_step_ms_median", "variant": name, "repeat": 0,
                     "value": median_ms, "detail": f"{rounds} rounds"})  # fmt: skip
        rows.append({"measure": "decode32_step_ratio_to_gguf", "variant": name, "repeat": 0,
                     "value": ratio, "detail": "median of per-round ratios"})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run both measurements and write one tidy CSV (``measure, variant, repeat, value,
    detail``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--out", type=Path, default=Path("results/benchmarks/smollm2_load.csv"))
    args = ap.parse_args(argv)
    rows = _load_times(args.repeats) + _decode_steps(args.rounds)
    frame = pd.DataFrame(rows)
    write_atomic(args.out, lambda p: frame.to_csv(p, index=False, float_format=CSV_FLOAT_FORMAT,
                                                  lineterminator="\n"))  # fmt: skip
    for measure, part in frame.groupby("measure", sort=False):
        for variant, v in part.groupby("variant", sort=False)["value"]:
            print(f"{measure} {variant}: {', '.join(f'{x:.3f}' for x in v)}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
