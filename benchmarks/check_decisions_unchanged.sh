#!/usr/bin/env bash
# Decisions unchanged (issue 21): the headline suite's summary.csv at the working tree, byte for
# byte against the same run at BASE (a git revision, checked out in a temporary worktree); both
# sides run at once. DURATION_S (default 300; `full` for the whole hour) and RATE_SCALES (default
# 0.6,1.6: the headline load and the heaviest) shorten the suite to fit a loaded 2-core machine;
# MAKE_BENCH=1 also compares `make bench` (the whole hour on sim:vllm, every policy).
# `tests/test_bench_golden.py` pins the first 300 s of `make bench` on its own.
# Usage: bash benchmarks/check_decisions_unchanged.sh BASE   (from the repository root)
set -euo pipefail
base=${1:?usage: check_decisions_unchanged.sh BASE}
py=${PYTHON:-.venv/bin/python}
[ -x "$py" ] || py=/work/main/.venv/bin/python
dur=${DURATION_S:-300}
args=(--suite headline --engines sim:vllm,sim:sglang,sim:trtllm --workers 1
      --rate-scales "${RATE_SCALES:-0.6,1.6}")
[ "$dur" = full ] || args+=(--duration-s "$dur")
runs=(headline)
[ "${MAKE_BENCH:-0}" = 1 ] && runs+=(bench)
tmp=$(mktemp -d)
trap 'git worktree remove --force "$tmp/base" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git worktree add --detach "$tmp/base" "$base" >/dev/null 2>&1
cp -r src "$tmp/head-src"  # a snapshot: the working tree may change while the runs go on
side() {  # side NAME SRC: every run of one side, in order
  local name=$1 src=$2 run
  for run in "${runs[@]}"; do
    if [ "$run" = headline ]; then set -- "${args[@]}"; else set --; fi
    PYTHONPATH=$src nice -n 19 "$py" -m superinfer bench "$@" --out "$tmp/$name-$run" \
      > "$tmp/$name-$run.log" 2>&1 || { tail -5 "$tmp/$name-$run.log"; return 1; }
  done
}
side base "$tmp/base/src" & pid_base=$!
side head "$tmp/head-src" & pid_head=$!
wait $pid_base && wait $pid_head
status=0
for run in "${runs[@]}"; do
  if cmp "$tmp/base-$run/summary.csv" "$tmp/head-$run/summary.csv"; then
    echo "$run: summary.csv byte-identical to $base ($(wc -l < "$tmp/head-$run/summary.csv") lines)"
  else
    echo "$run: summary.csv DIFFERS from $base" >&2
    status=1
  fi
done
exit $status
