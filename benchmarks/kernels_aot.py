"""Compile every kernel variant for A100 (sm_80) and H100/H200 (sm_90) without a GPU, and record
registers, spills and shared memory per variant in ``results/benchmarks/kernels_aot.csv``.

This proves the kernels build for the GPUs they target; it measures no speed (that is
``benchmarks/kernels.py`` on a GPU). Usage: ``python benchmarks/kernels_aot.py [--out PATH]``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import sys
from pathlib import Path

COLUMNS = ["arch", "kernel", "variant", "registers", "local_bytes", "shared_bytes"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks/kernels_aot.csv"))
    parser.add_argument("--arch", type=int, nargs="+", default=[80, 90])
    args = parser.parse_args()
    os.environ["TRITON_INTERPRET"] = "0"  # compiled kernels, before superinfer.kernels is imported
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, stated

    from superinfer.kernels.aot import compile_variants

    try:
        rows = [v for arch in args.arch for v in compile_variants(arch, tiles=(16, 32, 64))]
    except RuntimeError as exc:
        sys.exit(f"error: {exc}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: v for k, v in dataclasses.asdict(row).items() if k in COLUMNS})
    for row in rows:
        print(f"sm_{row.arch} {row.kernel:26s} {row.variant:26s} regs {row.registers:3d} "
              f"spill {row.local_bytes} B  smem {row.shared_bytes} B")  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
