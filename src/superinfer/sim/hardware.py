"""Model architectures and GPU specifications the simulator knows.

Sources:
    * Llama-3.1 shapes: ``config.json`` of ``meta-llama/Llama-3.1-8B`` and
      ``meta-llama/Llama-3.1-70B`` on the Hugging Face Hub (Llama-3 layer shapes; 128k context
      through rope scaling).
    * GPU peaks: NVIDIA A100 datasheet (80GB SXM4: 312 TFLOPS dense FP16/BF16, 2,039 GB/s HBM2e),
      H100 datasheet (SXM5 80GB: 989 TFLOPS dense FP16/BF16, 3.35 TB/s HBM3), H200 datasheet
      (SXM 141GB: 989 TFLOPS dense FP16/BF16, 4.8 TB/s HBM3e).
    * Achieved fractions of peak (``compute_efficiency``, ``memory_efficiency``): from the
      measured Vidur GEMM timings in ``shared/data/profiling`` (README §6: A100 streams weights at
      1.62 TB/s and reaches 233-241 TFLOP/s; H100 3.02 TB/s and 679-748 TFLOP/s). H200 reuses
      H100's fractions (same SM, no H200 data). Memory: the totals ``nvidia-smi`` reports.
    * All-reduce bus bandwidth: Vidur's ``network/{a100,h100}_dgx/all_reduce.csv`` at 64 MiB
      (README §6: A100 DGX TP2/4/8 = 156/167/174 GB/s, H100 DGX 274/317/365 GB/s).
    * Host link (HBM<->CPU copies, per GPU and direction): PCIe Gen4 x16 (A100) moves 32 GB/s raw,
      PCIe Gen5 x16 (H100, H200) 64 GB/s raw; we take 80% of raw as achieved for pinned-memory
      copies (an assumption, stated, not measured here). GH200's NVLink-C2C moves 450 GB/s per
      direction (NVIDIA GH200 datasheet: 900 GB/s total); again 80% of it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GPUS", "MODELS", "GPUSpec", "ModelSpec", "get_gpu", "get_model"]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Decoder-only transformer shape (Llama family: GQA, gated MLP, RMSNorm, untied LM head).

    Attributes:
        name: canonical name, e.g. ``"llama-3.1-70b"``.
        num_layers: transformer blocks.
        hidden_size: model width ``h``.
        num_q_heads: query heads.
        num_kv_heads: key/value heads (GQA).
        head_dim: per-head width ``d``.
        intermediate_size: MLP width ``I`` (gate and up each ``h x I``).
        vocab_size: vocabulary size ``V``.
        max_model_len_tokens: context length the model supports.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_model_len_tokens: int

    @property
    def num_params(self) -> int:
        """Parameter count: embeddings + LM head + per-layer attention, MLP and two norms."""
        h, d = self.hidden_size, self.head_dim
        attn = h * (self.num_q_heads + 2 * self.num_kv_heads) * d + self.num_q_heads * d * h
        mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + 2 * h
        return self.num_layers * per_layer + 2 * self.vocab_size * h + h

    def weight_bytes(self, bytes_per_param: float = 2) -> int:
        """Bytes of all weights at ``bytes_per_param`` (2 for FP16/BF16, 1 for FP8; FP8
        checkpoints keep the embeddings and LM head in 16 bits, as TensorRT-LLM's and
        ModelOpt's FP8 Llama checkpoints do)."""
        if bytes_per_param == 2:
            return self.num_params * 2
        embed = 2 * self.vocab_size * self.hidden_size
        return int((self.num_params - embed) * bytes_per_param + embed * 2)

    def kv_bytes_per_token(self, bytes_per_elem: float = 2.0) -> float:
        """KV bytes one token takes across all layers and all TP ranks (K and V)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_elem


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """One GPU SKU.

    Attributes:
        name: canonical name, e.g. ``"a100-80gb"``.
        memory_bytes: HBM capacity, bytes.
        peak_flops: dense FP16/BF16 tensor-core peak, FLOP/s.
        peak_mem_bw_bytes_s: HBM bandwidth, bytes/s.
        compute_efficiency: achieved fraction of ``peak_flops`` on large GEMMs.
        memory_efficiency: achieved fraction of ``peak_mem_bw_bytes_s`` streaming weights.
        allreduce_bus_bw_bytes_s: NCCL all-reduce bus bandwidth inside a node, bytes/s.
        allreduce_latency_s: fixed cost of one all-reduce (launch + small-message floor), s.
        host_link_bytes_s: achieved HBM<->CPU copy bandwidth per direction, bytes/s.
    """

    name: str
    memory_bytes: int
    peak_flops: float
    peak_mem_bw_bytes_s: float
    compute_efficiency: float
    memory_efficiency: float
    allreduce_bus_bw_bytes_s: float
    allreduce_latency_s: float
    host_link_bytes_s: float


_MIB = 1024**2  # memory sizes are nvidia-smi's reported totals, in MiB

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, 131072),
        ModelSpec("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256, 131072),
    )
}

GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec("a100-80gb", 81920 * _MIB, 312e12, 2.039e12, 0.76, 0.79, 167e9, 30e-6, 0.8 * 32e9),
        GPUSpec("h100-80gb", 81559 * _MIB, 989e12, 3.35e12, 0.71, 0.90, 317e9, 30e-6, 0.8 * 64e9),
        GPUSpec("h200", 143771 * _MIB, 989e12, 4.8e12, 0.71, 0.90, 317e9, 30e-6, 0.8 * 64e9),
        # GH200 (96 GB HBM3, 4 TB/s; nominal capacity): H100 SM, NVLink-C2C to the Grace CPU.
        GPUSpec("gh200", 96 * 1024 * _MIB, 989e12, 4.0e12, 0.71, 0.90, 317e9, 30e-6, 0.8 * 450e9),
    )
}

_ALIASES = {"a100": "a100-80gb", "h100": "h100-80gb", "h200-141gb": "h200", "gh200-96gb": "gh200"}


def get_model(name: str) -> ModelSpec:
    """Look up a model by name (case-insensitive).

    Raises:
        KeyError: unknown name; the message lists the known ones.
    """
    key = name.lower().removeprefix("meta-llama/")
    if key not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    return MODELS[key]


def get_gpu(name: str) -> GPUSpec:
    """Look up a GPU by name or alias (case-insensitive).

    Raises:
        KeyError: unknown name; the message lists the known ones.
    """
    key = name.lower()
    key = _ALIASES.get(key, key)
    if key not in GPUS:
        raise KeyError(f"unknown GPU {name!r}; known: {', '.join(sorted(GPUS))}")
    return GPUS[key]
