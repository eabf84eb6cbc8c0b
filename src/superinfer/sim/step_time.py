"""Step-time model: how long one engine step takes on a GPU, from the batch it runs.

A roofline per operator: each kernel takes ``max(FLOPs / achieved FLOP/s, bytes / achieved
bytes/s)``. Per transformer layer (shapes per GPU at tensor-parallel degree ``t``, as in Vidur's
``vidur/profiling/mlp/mlp_impl.py``)::

    qkv_proj   [T x h] . [h x (q + 2 kv) d / t]
    o_proj     [T x q d / t] . [q d / t x h]
    gate_up    [T x h] . [h x 2 I / t]
    down_proj  [T x I / t] . [I / t x h]
    attention  prefill chunks: 4 q d / t FLOPs per query-key pair; decode: reads its KV
    2 all-reduces of [T x h] FP16 when t > 1 (ring: 2 (t-1)/t of the bytes on the bus)

plus the LM head for the sequences that sample, and a per-step CPU overhead (scheduling, input
preparation, sampling, output processing) taken from Vidur's measured sarathi-serve overheads
(``shared/data/profiling/historical/6d98aa8/a100/cpu_overheads.csv``, Llama-2-70B TP4 medians of
schedule + sampler_e2e + prepare_inputs_e2e + process_model_outputs: 1.77 ms at batch 8, 6.89 ms
at batch 128, i.e. 1.43 ms + 0.0427 ms per sequence). The efficiencies in ``GPUSpec`` are first
estimates; ``superinfer calibrate`` fits them to measured kernel timings.
"""

from __future__ import annotations

from dataclasses import dataclass

from superinfer.sim.hardware import GPUSpec, ModelSpec

__all__ = ["BatchShape", "RooflineStepTime"]

#: Per-step CPU overhead intercept and slope (s, s/sequence); see the module docstring.
STEP_OVERHEAD_S = 1.43e-3
STEP_OVERHEAD_PER_SEQ_S = 0.0427e-3
#: Small per-layer kernels (2 RMSNorms, RoPE, SiLU-and-mul, residual adds): Vidur's A100
#: Llama-3-8B medians at 1 token sum to about 0.03 ms (README §4.1 example table).
LAYER_SMALL_KERNELS_S = 0.03e-3


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What one step runs, summarised for the step-time model.

    A step runs, per scheduled request ``i``, ``n_i`` new tokens on top of ``c_i`` tokens that
    already have KV. Requests with ``n_i == 1`` are decodes; the others are prefill chunks.

    Attributes:
        num_tokens: ``sum n_i``, tokens through the linear layers.
        num_samples: requests whose step ends with a sampled token (LM head rows).
        prefill_attn_pairs: ``sum over prefill chunks of n_i * (c_i + (n_i + 1) / 2)``, the
            causal query-key pairs.
        prefill_kv_tokens: ``sum over prefill chunks of (c_i + n_i)``, KV tokens they read.
        decode_kv_tokens: ``sum over decodes of (c_i + 1)``, KV tokens they read, in FP16
            equivalents (a quantized request's tokens count at its bytes ratio to FP16).
        num_seqs: requests in the step.
        prefill_tokens: ``sum over prefill chunks of n_i``.
        prefill_full_pairs: ``sum over prefill chunks of n_i * (c_i + n_i)``, the query-key pairs
            of a kernel that does not skip the causal mask's empty half.
        num_prefill_seqs: requests in the step running a prefill chunk.
    """

    num_tokens: int
    num_samples: int
    prefill_attn_pairs: float
    prefill_kv_tokens: int
    decode_kv_tokens: float
    num_seqs: int
    prefill_tokens: int = 0
    prefill_full_pairs: float = 0.0
    num_prefill_seqs: int = 0


class RooflineStepTime:
    """Roofline step time for one model on one GPU type at one tensor-parallel degree.

    Args:
        model: the model.
        gpu: the GPU.
        tp: tensor-parallel degree (GPUs per replica); must divide the KV heads.
        kv_bytes_per_elem: bytes per KV element (2 for FP16).

    Raises:
        ValueError: ``tp`` < 1 or not dividing ``model.num_kv_heads``.
    """

    def __init__(
        self, model: ModelSpec, gpu: GPUSpec, tp: int, kv_bytes_per_elem: float = 2.0
    ) -> None:
        if tp < 1 or model.num_kv_heads % tp:
            raise ValueError(f"tp={tp} must be >= 1 and divide num_kv_heads={model.num_kv_heads}")
        self.model, self.gpu, self.tp = model, gpu, tp
        h, d, ffn = model.hidden_size, model.head_dim, model.intermediate_size
        q, kv = model.num_q_heads, model.num_kv_heads
        #: (K, N) of each GEMM per GPU, per layer.
        self.gemms: tuple[tuple[int, int], ...] = (
            (h, (q + 2 * kv) * d // tp),
            (q * d // tp, h),
            (h, 2 * ffn // tp),
            (ffn // tp, h),
        )
        self.flops_s = gpu.peak_flops * gpu.compute_efficiency
        self.bytes_s = gpu.peak_mem_bw_bytes_s * gpu.memory_efficiency
        self.attn_flops_per_pair = 4.0 * (q // tp) * d  # QK^T and PV, per layer
        self.kv_bytes_per_token_layer = 2.0 * (kv // tp) * d * kv_bytes_per_elem
        self.lm_head = (h, model.vocab_size // tp)

    # -- pieces ---------------------------------------------------------------------------------

    def _gemm_s(self, num_tokens: int, k: int, n: int) -> float:
        flops = 2.0 * num_tokens * k * n
        moved = 2.0 * (k * n + num_tokens * k + num_tokens * n)
        return max(flops / self.flops_s, moved / self.bytes_s)

    def linear_s(self, num_tokens: int) -> float:
        """All GEMMs of all layers for ``num_tokens`` tokens, s."""
        per_layer = sum(self._gemm_s(num_tokens, k, n) for k, n in self.gemms)
        return self.model.num_layers * (per_layer + LAYER_SMALL_KERNELS_S)

    def allreduce_s(self, num_tokens: int) -> float:
        """The 2 all-reduces per layer of all layers, s (0 at TP1)."""
        if self.tp == 1:
            return 0.0
        size = 2.0 * num_tokens * self.model.hidden_size
        one = self.gpu.allreduce_latency_s + size * 2 * (self.tp - 1) / self.tp / (
            self.gpu.allreduce_bus_bw_bytes_s
        )
        return 2 * self.model.num_layers * one

    def attention_s(self, shape: BatchShape) -> float:
        """Prefill and decode attention kernels of all layers, s."""
        prefill = max(
            shape.prefill_attn_pairs * self.attn_flops_per_pair / self.flops_s,
            shape.prefill_kv_tokens * self.kv_bytes_per_token_layer / self.bytes_s,
        )
        # Decode attention is memory-bound for GQA (q/kv = 8 FLOPs per byte, far below the ridge).
        decode = shape.decode_kv_tokens * self.kv_bytes_per_token_layer / self.bytes_s
        return self.model.num_layers * (prefill + decode)

    def overhead_s(self, num_seqs: int) -> float:
        """Per-step CPU overhead, s."""
        return STEP_OVERHEAD_S + STEP_OVERHEAD_PER_SEQ_S * num_seqs

    # -- whole steps ----------------------------------------------------------------------------

    def step_time_s(self, shape: BatchShape) -> float:
        """Duration of one step running ``shape``, s."""
        if shape.num_tokens == 0:
            return 0.0
        k, n = self.lm_head
        return (
            self.linear_s(shape.num_tokens)
            + self.allreduce_s(shape.num_tokens)
            + self.attention_s(shape)
            + self._gemm_s(shape.num_samples, k, n)
            + self.overhead_s(shape.num_seqs)
        )

    def decode_coefficients(self, num_seqs: int) -> tuple[float, float]:
        """Step time of a pure-decode batch as ``a + b * decode_kv_tokens``.

        Args:
            num_seqs: sequences decoding one token each.

        Returns:
            ``(a_s, b_s_per_kv_token)``; equals :meth:`step_time_s` for that batch.
        """
        k, n = self.lm_head
        a = (
            self.linear_s(num_seqs)
            + self.allreduce_s(num_seqs)
            + self._gemm_s(num_seqs, k, n)
            + self.overhead_s(num_seqs)
        )
        b = self.model.num_layers * self.kv_bytes_per_token_layer / self.bytes_s
        return a, b
