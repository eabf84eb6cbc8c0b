"""Ahead-of-time compilation of every kernel variant for a CUDA architecture, without a GPU.

Triton's wheel ships ``ptxas``, so the kernels can be lowered to a cubin for sm_80 (A100) or
sm_90 (H100 / H200) on any machine. That proves they compile for the GPUs they target, and
``cuobjdump`` (also in the wheel) reports registers and local memory per thread (local memory
> 0 means register spills). Needs compiled kernels: ``TRITON_INTERPRET`` must be unset or 0 when
``superinfer.kernels`` is first imported.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

from superinfer.kernels.dequantize_kv import _dequantize_key_kernel, _dequantize_value_kernel
from superinfer.kernels.dispatch import HAS_TRITON, is_interpreted, triton
from superinfer.kernels.paged_decode_attention import (
    TILE_TOKENS,
    _merge_splits_kernel,
    _paged_decode_kernel,
)
from superinfer.kernels.quantize_kv import _quantize_key_kernel, _quantize_value_kernel

__all__ = ["CompiledVariant", "compile_variants"]

# Shapes of the serving configuration benchmarks/kernels.py measures (Llama-3.1-8B KV heads).
HEAD_DIM, GROUP, PAGE, GQA, SPLITS = 128, 32, 64, 4, 64
_RESOURCES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


@dataclass(frozen=True, slots=True)
class CompiledVariant:
    """One kernel variant compiled to a cubin.

    Attributes:
        kernel: kernel function name.
        variant: the constexpr choices and dtypes, e.g. ``"bits=4,q=fp16"``.
        arch: compute capability, e.g. 90.
        registers: registers per thread.
        local_bytes: local memory per thread (spilled registers), bytes.
        shared_bytes: static shared memory per block, bytes.
    """

    kernel: str
    variant: str
    arch: int
    registers: int
    local_bytes: int
    shared_bytes: int


def _signature(kernel: Any, pointers: dict[str, str], constexprs: dict[str, Any]) -> dict[str, str]:
    sig = {}
    for param in kernel.params:
        name = param.name
        if param.is_constexpr:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = pointers[name]
        else:
            sig[name] = "fp32" if name == "sm_scale_log2" else "i32"
    missing = set(constexprs) - {k for k, v in sig.items() if v == "constexpr"}
    if missing:
        raise ValueError(f"{kernel.__name__}: no constexpr parameters {sorted(missing)}")
    return sig


def _variants(tiles: tuple[int, ...]) -> list[tuple[Any, str, dict[str, str], dict[str, Any]]]:
    out = []
    half = {"HALF_D": HEAD_DIM // 2, "BLOCK_HALF_D": HEAD_DIM // 2, "GROUP": GROUP}
    io = {"x_ptr": "*fp16", "out_ptr": "*fp16", "codes_ptr": "*u8"}
    io |= dict.fromkeys(("scale_ptr", "zero_ptr"), "*fp16")
    per_token = {"GROUP": GROUP, "BLOCK_T": 16}
    for bits in (8, 4):
        name = f"bits={bits}"
        out += [
            (_quantize_key_kernel, name, io, {**half, "BITS": bits}),
            (_quantize_value_kernel, name, io, {**per_token, "BITS": bits}),
            (_dequantize_key_kernel, name, io, {**half, "BITS": bits}),
            (_dequantize_value_kernel, name, io, {**per_token, "BITS": bits}),
        ]
    ints = ("block_tables_ptr", "seq_lens_ptr", "residual_pages_ptr", "seq_ids_ptr")
    partials = dict.fromkeys(("part_m_ptr", "part_l_ptr", "part_acc_ptr"), "*fp32")
    for q_dtype in ("fp16", "bf16"):
        for bits in (16, 8, 4):
            data = "*u8" if bits != 16 else f"*{q_dtype}"
            ptrs = {"q_ptr": f"*{q_dtype}", "k_ptr": data, "v_ptr": data}
            ptrs |= dict.fromkeys(("ks_ptr", "kz_ptr", "vs_ptr", "vz_ptr"), "*fp16")
            ptrs |= dict.fromkeys(("rk_ptr", "rv_ptr"), f"*{q_dtype}")
            ptrs |= dict.fromkeys(ints, "*i32") | partials
            for tile in tiles:
                consts = {
                    "GQA": GQA, "BLOCK_H": 16, "HEAD_DIM": HEAD_DIM, "BLOCK_D": HEAD_DIM,
                    "PAGE": PAGE, "TILE": tile, "GROUP": GROUP if bits != 16 else 1, "BITS": bits,
                    "PAGES_PER_SPLIT": 512 // PAGE, "IEEE": False,
                }  # fmt: skip
                name = f"bits={bits},q={q_dtype},tile={tile}"
                out.append((_paged_decode_kernel, name, ptrs, consts))
    merge = {"HEAD_DIM": HEAD_DIM, "BLOCK_D": HEAD_DIM, "BLOCK_S": SPLITS}
    out.append((_merge_splits_kernel, "out=fp16", partials | {"out_ptr": "*fp16"}, merge))
    return out


def _resources(cubin: bytes) -> tuple[int, int, int]:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        text = subprocess.run(
            [tool, "--dump-resource-usage", fh.name], capture_output=True, text=True, check=True
        ).stdout
    match = _RESOURCES.search(text)
    if match is None:
        raise RuntimeError(f"cuobjdump printed no resource usage: {text[-200:]!r}")
    registers, _, shared, local = (int(g) for g in match.groups())
    return registers, local, shared


def compile_variants(
    arch: int = 90, tiles: tuple[int, ...] = (TILE_TOKENS,)
) -> list[CompiledVariant]:
    """Compile every kernel variant for compute capability ``arch`` (80 = A100, 90 = H100/H200).

    Shapes: head_dim 128, group 32, pages of 64 tokens, 4 query heads per KV head; the paged
    attention kernel once per inner tile size in ``tiles``; Triton's default 4 warps.

    Raises:
        RuntimeError: Triton missing, kernels built by the interpreter, or a compile failure
            (Triton's own error propagates).
    """
    if not HAS_TRITON:
        raise RuntimeError("Triton is not installed")
    if is_interpreted(_quantize_key_kernel):
        raise RuntimeError("kernels were built by the interpreter: unset TRITON_INTERPRET")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", arch, 32)
    results = []
    for kernel, variant, pointers, constexprs in _variants(tiles):
        source = ASTSource(kernel, _signature(kernel, pointers, constexprs), constexprs)
        compiled = triton.compile(source, target=target)
        registers, local, shared = _resources(compiled.asm["cubin"])
        results.append(CompiledVariant(kernel.__name__, variant, arch, registers, local, shared))
    return results
