"""95% bootstrap confidence intervals (resampling prompts) for the KV quantization accuracy.

Reads the per-prompt sums that ``kv_quant_accuracy.py`` writes beside its result
``results/kv_quant/kv_quant_accuracy.csv`` (``*_per_prompt.csv``) and writes
``results/kv_quant/kv_quant_accuracy_ci.csv``. Prompts, not tokens, are resampled: tokens of one
reply are not independent. Deterministic (seeded).

Usage: ``python benchmarks/kv_quant_accuracy_ci.py [--per-prompt PATH] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

RESAMPLES = 2000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--per-prompt", type=Path, default=Path("results/kv_quant/kv_quant_accuracy_per_prompt.csv")
    )
    parser.add_argument(
        "--out", type=Path, default=Path("results/kv_quant/kv_quant_accuracy_ci.csv")
    )
    args = parser.parse_args()
    if not args.per_prompt.is_file():
        sys.exit(f"error: {args.per_prompt}: not found (run benchmarks/kv_quant_accuracy.py)")
    data = pd.read_csv(args.per_prompt, keep_default_na=False)
    ref = data[data.precision == "ref"].set_index("prompt").sort_index()
    num_prompts = len(ref)
    rng = np.random.default_rng(0)
    draws = rng.integers(0, num_prompts, size=(RESAMPLES, num_prompts))
    rows = []
    for (precision, group), rows_of in data[data.precision != "ref"].groupby(
        ["precision", "group_size"], sort=False
    ):
        fmt = rows_of.set_index("prompt").sort_index()
        tokens = fmt.n_tokens.to_numpy()[draws].sum(axis=1)
        agree = fmt.n_agree.to_numpy()[draws].sum(axis=1) / tokens
        ppl = np.exp(fmt.nll_sum.to_numpy()[draws].sum(axis=1) / tokens)
        ppl_ref = np.exp(ref.nll_sum.to_numpy()[draws].sum(axis=1) / tokens)
        delta = 100 * (ppl / ppl_ref - 1)
        rows.append({
            "precision": precision,
            "group_size": group,
            "agreement_lo": round(float(np.percentile(agree, 2.5)), 4),
            "agreement_hi": round(float(np.percentile(agree, 97.5)), 4),
            "ppl_delta_pct_lo": round(float(np.percentile(delta, 2.5)), 3),
            "ppl_delta_pct_hi": round(float(np.percentile(delta, 97.5)), 3),
            "prompts_with_a_disagreement": int((fmt.n_agree < fmt.n_tokens).sum()),
        })  # fmt: skip
    table = pd.DataFrame(rows)
    table.to_csv(args.out, index=False)
    print(table.to_string(index=False))
    print(f"wrote {args.out} ({num_prompts} prompts, {RESAMPLES} resamples)")


if __name__ == "__main__":
    main()
