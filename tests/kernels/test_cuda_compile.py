"""Every kernel variant compiles to an sm_90 (H100 / H200) cubin, on a machine without a GPU.

Runs in a subprocess: this process built the kernels with the interpreter, and compiling needs
them built as JIT functions (TRITON_INTERPRET=0 before the first import).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

_SCRIPT = """
import dataclasses, json
from superinfer.kernels.aot import compile_variants
print(json.dumps([dataclasses.asdict(v) for v in compile_variants(90)]))
"""


def test_all_kernels_compile_for_sm90() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    variants = json.loads(done.stdout.strip().splitlines()[-1])
    names = sorted({(v["kernel"], v["variant"]) for v in variants})
    # quantize/dequantize x key/value x int8/int4, paged attention x 3 precisions x fp16/bf16, merge
    assert len(names) == 8 + 6 + 1
    for v in variants:
        assert v["arch"] == 90 and 0 < v["registers"] <= 255, v
