#!/usr/bin/env bash
# End to end on a GPU machine with network: SGLang 0.5.23 serving a model with random weights
# (--load-format dummy: only config.json and the tokenizer are downloaded), once natively and once
# with the superinfer plugin, each benchmarked with the same trace slice through our `http` engine.
#
#   benchmarks/sglang_e2e.sh                      # defaults below
#   MODEL=meta-llama/Llama-3.1-8B-Instruct POLICY=superinfer DURATION_S=300 benchmarks/sglang_e2e.sh
#
# Writes results/sglang_e2e/{native,superinfer}/ (run directories: summary.csv, requests.parquet,
# manifest.json, report.md) and the two server logs beside them.
#
# Needs: a CUDA GPU; `pip install sglang==0.5.23` (SGLang's own install, CUDA torch) and
# `pip install -e .` of this repository in the same environment; the `http` engine of
# `superinfer bench` (planned in the issue on live benchmarking over HTTP: until it lands, the bench
# step fails with "unknown engine 'http'" and only the server halves of this script run).
set -euo pipefail

MODEL=${MODEL:-Qwen/Qwen2.5-7B-Instruct}
POLICY=${POLICY:-fcfs}          # superinfer once the rotation policy is merged
TRACE=${TRACE:-azure}
DURATION_S=${DURATION_S:-120}
RATE_SCALE=${RATE_SCALE:-1.0}
PORT=${PORT:-30000}
OUT=${OUT:-results/sglang_e2e}
PYTHON=${PYTHON:-python}
COMMON_ARGS=(--model-path "$MODEL" --load-format dummy --host 127.0.0.1 --port "$PORT"
             --schedule-policy fcfs --enable-priority-scheduling --enable-metrics)

cd "$(dirname "$0")/.."
mkdir -p "$OUT"
"$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "needs a CUDA GPU")'

server_pid=""
stop_server() {
  if [[ -n "$server_pid" ]]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}
trap stop_server EXIT

wait_healthy() {
  for _ in $(seq 600); do
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then return 0; fi
    if ! kill -0 "$server_pid" 2>/dev/null; then echo "server exited; see its log" >&2; return 1; fi
    sleep 1
  done
  echo "server not healthy after 600 s" >&2
  return 1
}

bench() {  # $1: run name
  superinfer bench --engine http --url "http://127.0.0.1:$PORT" --backend sglang \
    --trace "$TRACE" --duration-s "$DURATION_S" --rate-scale "$RATE_SCALE" --out "$OUT/$1"
}

echo "== native SGLang ($MODEL, dummy weights)"
env -u SUPERINFER_SGLANG "$PYTHON" -m sglang.launch_server "${COMMON_ARGS[@]}" \
  >"$OUT/native.server.log" 2>&1 &
server_pid=$!
wait_healthy
bench native
stop_server

echo "== SGLang with superinfer (policy $POLICY)"
superinfer serve --engine sglang --policy "$POLICY" -- "${COMMON_ARGS[@]}" \
  >"$OUT/superinfer.server.log" 2>&1 &
server_pid=$!
wait_healthy
# The plugin logs this line at INFO in each scheduler process (SGLang's --log-level info shows it).
grep -q "superinfer: policy $POLICY installed" "$OUT/superinfer.server.log" \
  || echo "warning: no 'policy installed' line in $OUT/superinfer.server.log" >&2
bench superinfer
stop_server

echo "wrote $OUT/native and $OUT/superinfer"
