#!/usr/bin/env bash
# End-to-end run of the TensorRT-LLM adapter (engine alone, Mode A, Mode B) on a GPU machine with
# tensorrt_llm 1.2.x, e.g. inside nvcr.io/nvidia/tensorrt-llm/release:1.2.1 after `pip install -e .`
# in this checkout. Elsewhere it prints why it skipped and exits 0. Arguments go to
# benchmarks/trtllm_e2e.py (--requests, --rate, --policy, --modes, --model, --out ...).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

if ! reason="$("$PY" - 2>&1 <<'CHECK'
import sys
try:
    import superinfer  # noqa: F401
except ImportError:
    sys.exit("superinfer is not installed in this Python (pip install -e .)")
try:
    import tensorrt_llm
except Exception as exc:  # ImportError, or CUDA/driver errors raised at import
    sys.exit(f"tensorrt_llm is not importable here ({type(exc).__name__}: {exc})".splitlines()[0])
from superinfer.adapters.trtllm.engine import UnsupportedEngineError, check_version
try:
    check_version(tensorrt_llm.__version__)
except UnsupportedEngineError as exc:
    sys.exit(str(exc))
import torch
if not torch.cuda.is_available():
    sys.exit("no CUDA device")
CHECK
)"; then
    echo "trtllm_e2e: skipped: ${reason##*$'\n'}"
    exit 0
fi
exec "$PY" benchmarks/trtllm_e2e.py "$@"
