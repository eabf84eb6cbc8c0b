#!/usr/bin/env bash
# `make bench`'s summary.csv, byte for byte, against the committed results/default/summary.csv
# (issue 16: the redesign changes no decision). About 3.5 minutes on 2 quiet cores.
# Usage: bash benchmarks/check_make_bench.sh   (from the repository root, after `make install`)
set -euo pipefail
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
.venv/bin/superinfer bench --out "$out/run" > "$out/log" 2>&1 || { tail -5 "$out/log"; exit 1; }
if cmp "$out/run/summary.csv" results/default/summary.csv; then
  echo "make bench: summary.csv byte-identical to results/default/summary.csv"
else
  echo "make bench: summary.csv DIFFERS from results/default/summary.csv" >&2
  exit 1
fi
