#!/usr/bin/env bash
# Decisions unchanged (issue 21): the headline suite's summary.csv (and `make bench`'s) at the
# working tree, byte for byte against the same runs at BASE (a git revision, checked out in a
# temporary worktree). DURATION_S (default 600) shortens the headline suite's hour so the check
# fits a loaded 2-core machine; DURATION_S=full runs it whole. `make bench` always runs whole.
# Usage: bash benchmarks/check_decisions_unchanged.sh BASE   (from the repository root)
set -euo pipefail
base=${1:?usage: check_decisions_unchanged.sh BASE}
py=${PYTHON:-.venv/bin/python}
[ -x "$py" ] || py=/work/main/.venv/bin/python
dur=${DURATION_S:-600}
args=(--suite headline --engines sim:vllm,sim:sglang,sim:trtllm --workers 2)
[ "$dur" = full ] || args+=(--duration-s "$dur")
tmp=$(mktemp -d)
trap 'git worktree remove --force "$tmp/base" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git worktree add --detach "$tmp/base" "$base" >/dev/null 2>&1
status=0
for side in base head; do
  src=$PWD/src
  [ $side = base ] && src=$tmp/base/src
  PYTHONPATH=$src nice -n 19 "$py" -m superinfer bench "${args[@]}" --out "$tmp/$side-headline" \
    > "$tmp/$side-headline.log" 2>&1 || { tail -5 "$tmp/$side-headline.log"; exit 1; }
  PYTHONPATH=$src nice -n 19 "$py" -m superinfer bench --out "$tmp/$side-bench" \
    > "$tmp/$side-bench.log" 2>&1 || { tail -5 "$tmp/$side-bench.log"; exit 1; }
done
for run in headline bench; do
  if cmp "$tmp/base-$run/summary.csv" "$tmp/head-$run/summary.csv"; then
    echo "$run: summary.csv byte-identical to $base ($(wc -l < "$tmp/head-$run/summary.csv") lines)"
  else
    echo "$run: summary.csv DIFFERS from $base" >&2
    status=1
  fi
done
exit $status
