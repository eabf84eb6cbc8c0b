"""Time and bandwidth of each KV kernel, and the fraction of the device's HBM peak.

Writes ``results/benchmarks/kernels.csv`` with columns
``device, kernel, precision, shape, time_us, gb_s, frac_of_peak``.

* On a CUDA GPU: compiled kernels at serving sizes (Llama-3.1-8B KV shapes: 8 KV heads x 128
  channels, 32 query heads; pages of 64 tokens; KIVI groups of 32), timed with
  ``triton.testing.do_bench``. ``gb_s`` = bytes the kernel must move (inputs read + outputs
  written, KV counted exactly by ``policy_core.kv_bytes``) / time; ``frac_of_peak`` divides by
  the HBM peak of ``sim.hardware`` (H100 SXM 3.35 TB/s, H200 4.8 TB/s, A100 2.039 TB/s).
  Paged attention runs at inner tiles of 16, 32 and 64 tokens (``tile=`` in ``shape``). Issue 7's
  targets: quantize >= 80% of peak; int4 decode attention >= 2x fp16 at 32k context (printed at
  the end, best tile of each).
* Without a GPU: Triton's interpreter on tiny sizes, only to prove the script runs. Those rows
  say ``cpu-interpreter`` and leave ``frac_of_peak`` empty: interpreter times mean nothing.

Usage: ``python benchmarks/kernels.py [--out PATH]``.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

COLUMNS = ["device", "kernel", "precision", "shape", "time_us", "gb_s", "frac_of_peak"]
PEAK_BY_NAME = {"H200": "h200", "H100": "h100-80gb", "A100": "a100-80gb"}  # -> sim.hardware GPUS

# Serving sizes (GPU) and proof-of-life sizes (interpreter).
GPU_SIZES = {
    "quant_tokens": (4096, 65536),
    "heads": 8, "head_dim": 128, "q_heads": 32, "page": 64, "group": 32,
    "batch": 8, "contexts": (1024, 8192, 32768), "tiles": (16, 32, 64),
}  # fmt: skip
CPU_SIZES = {
    "quant_tokens": (64,),
    "heads": 2, "head_dim": 64, "q_heads": 4, "page": 16, "group": 16,
    "batch": 2, "contexts": (100,), "tiles": (16,),
}  # fmt: skip


def _time_us(fn: Callable[[], object], cuda: bool) -> float:
    if cuda:
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=100)) * 1e3
    fn()  # build the kernel once
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/benchmarks/kernels.csv"))
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are built (first import)

    from superinfer.kernels import (
        HAS_TRITON,
        KVKind,
        PagedKV,
        QuantizedKV,
        dequantize_kv,
        pack_paged_kv,
        paged_decode_attention,
        quantize_kv,
    )
    from superinfer.policy_core.kv_bytes import kv_sequence_bytes
    from superinfer.policy_core.types import KVPrecision
    from superinfer.sim.hardware import get_gpu

    if not HAS_TRITON:
        sys.exit("error: triton is not installed (pip install -e '.[kernels]')")
    device = torch.device("cuda" if cuda else "cpu")
    sizes = GPU_SIZES if cuda else CPU_SIZES
    if cuda:
        name = torch.cuda.get_device_name()
        key = next((v for k, v in PEAK_BY_NAME.items() if k in name), None)
        peak = get_gpu(key).peak_mem_bw_bytes_s if key else None
        label = name
    else:
        peak, label = None, "cpu-interpreter"
    heads, head_dim, group = sizes["heads"], sizes["head_dim"], sizes["group"]
    precision = {16: KVPrecision.FP16, 8: KVPrecision.INT8, 4: KVPrecision.INT4}
    rows: list[list[object]] = []

    def record(
        kernel: str, bits: int, shape: str, moved_bytes: int, fn: Callable[[], object]
    ) -> float:
        t_us = _time_us(fn, cuda)
        gb_s = moved_bytes / (t_us * 1e-6) / 1e9
        frac = f"{gb_s * 1e9 / peak:.3f}" if peak else ""
        row = [label, kernel, precision[bits].value, shape, f"{t_us:.2f}", f"{gb_s:.4g}", frac]
        rows.append(row)
        print("  ".join(str(v) for v in row[1:]))
        return t_us

    def quantize_pair(x: torch.Tensor, bits: int, group: int) -> tuple[QuantizedKV, QuantizedKV]:
        return quantize_kv(x, KVKind.KEY, bits, group), quantize_kv(x, KVKind.VALUE, bits, group)

    def dequantize_pair(k: QuantizedKV, v: QuantizedKV) -> tuple[torch.Tensor, torch.Tensor]:
        return dequantize_kv(k), dequantize_kv(v)

    def attend(q: torch.Tensor, c: PagedKV, max_seq_len: int, tile: int) -> torch.Tensor:
        return paged_decode_attention(
            q, c.kv_bits, c.block_tables, c.seq_lens, c.pools, c.residual_pages,
            max_seq_len=max_seq_len, tile_tokens=tile,
        )  # fmt: skip

    gen = torch.Generator(device=device).manual_seed(0)
    for tokens in sizes["quant_tokens"]:
        x = torch.randn(tokens, heads, head_dim, device=device, generator=gen).half()
        for bits in (8, 4):
            stored = kv_sequence_bytes(tokens, 1, heads, head_dim, precision[bits], group)
            shape = f"T={tokens},H={heads},D={head_dim},G={group}"
            # K and V quantized together, as a cache write does: read 2 fp16 tensors, write codes.
            moved = x.numel() * 2 * 2 + stored
            record("quantize_kv", bits, shape, moved, partial(quantize_pair, x, bits, group))
            pair = quantize_pair(x, bits, group)
            record("dequantize_kv", bits, shape, moved, partial(dequantize_pair, *pair))

    attention_us: dict[tuple[int, int], float] = {}
    q_heads, batch, page = sizes["q_heads"], sizes["batch"], sizes["page"]
    for context in sizes["contexts"]:
        kv = [torch.randn(context, heads, head_dim, device=device, generator=gen).half()
              for _ in range(batch)]  # fmt: skip
        q = torch.randn(batch, q_heads, head_dim, device=device, generator=gen).half()
        for bits in (16, 8, 4):
            cache = pack_paged_kv(kv, kv, [bits] * batch, page_size=page, group_size=group)
            kv_bytes = batch * kv_sequence_bytes(
                context, 1, heads, head_dim, precision[bits], group
            )
            for tile in sizes["tiles"]:
                shape = (
                    f"B={batch},ctx={context},Hq={q_heads},Hkv={heads},D={head_dim},"
                    f"P={page},G={group},tile={tile}"
                )
                t_us = record(
                    "paged_decode_attention", bits, shape, kv_bytes + 2 * q.numel() * 2,
                    partial(attend, q, cache, context, tile),
                )  # fmt: skip
                key = (context, bits)
                attention_us[key] = min(attention_us.get(key, float("inf")), t_us)
    longest = max(sizes["contexts"])
    speedup = attention_us[(longest, 16)] / attention_us[(longest, 4)]
    note = "target >= 2x" if cuda else "interpreter: meaningless, run on a GPU"
    print(f"int4 vs fp16 decode attention at {longest} tokens, best tiles: {speedup:.2f}x ({note})")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    with tmp.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    tmp.replace(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
