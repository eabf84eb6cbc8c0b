"""Engine profiles: the mechanics of each simulated engine, as declarative data.

A profile carries what an engine fixes regardless of policy: KV page size, step limits, how it
sizes and charges KV, its prefix cache and CPU tier, and its native scheduling policy. A policy
plugged in replaces only decisions.

| mechanic | ``sim:vllm`` | ``sim:sglang`` | ``sim:trtllm`` |
|---|---|---|---|
| KV page | 16 tokens | 1 token | 32 tokens |
| tokens per step | 2,048 (A100), 8,192 | 8,192 | 8,192 |
| admission charge | the chunk | chunk + output cap | prompt + output cap, reserved |
| KV memory | 0.9 GPU - W - act | 0.85 GPU - W | 0.9 (GPU - W - act) |
| prefix cache | hashed blocks, LRU | radix, LRU | block reuse, priority LRU |
| CPU tier | KV connector | HiCache | host cache |
| native policy | ``fcfs`` | ``fcfs`` | ``fcfs`` |
| CPU per step | Vidur's sarathi fit | SGLang 0.2.13 fit | none (hidden, assumed) |
| overlap scheduler | no | yes | yes |
| prefill + decode in one step | yes | no | yes |
| kernel scale | ``vllm`` | ``sglang`` | ``trtllm`` (FP16, FP8) |

(W: weights per GPU; act: activation reserve.) Sources are on each profile below; the CPU and
kernel terms and how a step's time is made of them are in ``sim.engine_costs``, their fitted
values in ``sim/engine_costs.json``.
"""

from __future__ import annotations

from dataclasses import dataclass

from superinfer.policy_core.types import AdmissionRule
from superinfer.sim.hardware import GPUSpec, ModelSpec

__all__ = ["PROFILES", "SIM_SGLANG", "SIM_TRTLLM", "SIM_VLLM", "EngineProfile", "get_profile"]

_GIB = 1024**3


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """One engine's mechanics.

    Attributes:
        name: engine id, e.g. ``"sim:vllm"``.
        block_size_tokens: tokens per KV page.
        token_budget: most tokens per step on A100-class GPUs.
        token_budget_large_gpu: the same on GPUs with >= 70 GiB that are not A100s.
        max_num_seqs: most running requests on A100-class GPUs.
        max_num_seqs_large_gpu: the same on larger GPUs.
        kv_memory: how KV capacity is sized: ``"utilization"`` (vLLM: ``fraction x memory -
            weights - activations``), ``"static"`` (SGLang: ``fraction x memory - weights``) or
            ``"free"`` (TensorRT-LLM: ``fraction x (memory - weights - activations)``).
        memory_fraction: the fraction in that formula.
        activation_reserve_bytes: per-GPU memory kept for activations and CUDA graphs (0 where the
            formula has no activation term).
        admission: how admitting a request is charged in KV (see ``AdmissionRule``).
        prefix_cache: ``"hashed_blocks"``, ``"radix"`` or ``"block_reuse"``: all cache whole pages
            of hashed prompt blocks; ``block_reuse`` evicts by retention priority first.
        offload_min_priority: cached blocks below this retention priority are dropped instead of
            offloaded to the CPU tier.
        cpu_kv_ratio: CPU-tier KV capacity as a multiple of HBM KV capacity (0: no CPU tier).
        native_policy: the engine's own scheduling policy, by registered name.
        reserve_ratio_init: SGLang's ``new_token_ratio`` after a retraction (``RESERVE_RATIO``).
        reserve_ratio_min: its floor.
        reserve_ratio_decay: its decrease per decode step.
        version: the engine release the profile follows.
        kernel_key: which kernel scale of ``sim/engine_costs.json`` applies (``sim.engine_costs``).
        cpu_key: which fitted per-step CPU term applies (``"vidur"``: the calibrated model's).
        cpu_overlap: an overlap scheduler prepares the next step while the GPU runs this one,
            hiding the CPU time up to the GPU time.
        cpu_decode_divisor: decode-only steps pay ``1 / K`` of the CPU time (K-step multi-step
            scheduling; 1: none).
        mixed_batches: a step may run prefill chunks and decodes together; when ``False`` a step
            that runs any prefill runs only prefill, and the decodes the policy scheduled with
            it wait for the next step (SGLang without ``--enable-mixed-chunk``).
        cut_repeat_on_arrival: an arrival ends a run of repeated decode steps at the step in
            flight (exact for engines that schedule every step); ``False``: the run goes on, as
            vLLM 0.6's ``--num-scheduler-steps`` runs do.
        repeat_past_finish: a run of repeated decode steps lasts the steps it was given even when
            one of its sequences finishes inside it, whose surplus tokens are dropped (vLLM 0.6's
            multi-step: ``MultiStepOutputProcessor._process_seq_outputs`` truncates the K steps'
            tokens to ``max_tokens``, ``vllm/engine/output_processor/multi_step.py``);
            ``False``: a run ends at its first finish (engines that schedule every step).
        reserve_whole_prompt: ``StepState.reserve_whole_prompt`` (SGLang's admission charges a
            request's whole remaining prompt); set for the SGLang CPU server's profile
            (``sim.hf_cpu.hf_cpu_sim_config(mechanics="sglang")``). ``SIM_SGLANG`` does not set
            it yet: its results were made without it (results/fidelity/README.md).
        prefill_runs_whole: ``StepState.prefill_runs_whole`` (told to the policy; the simulator
            still runs the chunks the policy gives); set for the SGLang CPU server's profile.
        finish_aware_admission: ``StepState.finish_aware_admission`` (SGLang 0.3.1's and
            later releases' admission of ``ignore_eos`` requests with the radix cache disabled,
            as ``bench_serving`` sends them by default). Off in every profile: 0.3.0, the
            release of the published SGLang rows, has no such path (its PyPI wheel's
            ``policy_scheduler.py`` charges ``new_token_ratio`` for every request; 0.3.1's adds
            ``add_one_req_ignore_eos``), and on for ``sim:sglang@0.3.0`` it moved those rows by
            under 0.1 % (``benchmarks/sglang030_admission.py``).
    """

    name: str
    block_size_tokens: int
    token_budget: int
    token_budget_large_gpu: int
    max_num_seqs: int
    max_num_seqs_large_gpu: int
    kv_memory: str
    memory_fraction: float
    activation_reserve_bytes: int
    admission: AdmissionRule
    prefix_cache: str
    offload_min_priority: int
    cpu_kv_ratio: float
    native_policy: str
    reserve_ratio_init: float = 0.0
    reserve_ratio_min: float = 0.0
    reserve_ratio_decay: float = 0.0
    version: str = ""
    kernel_key: str = ""
    cpu_key: str = "vidur"
    cpu_overlap: bool = False
    cpu_decode_divisor: int = 1
    mixed_batches: bool = True
    cut_repeat_on_arrival: bool = True
    repeat_past_finish: bool = False
    reserve_whole_prompt: bool = False
    finish_aware_admission: bool = False
    prefill_runs_whole: bool = False

    def limits(self, gpu: GPUSpec) -> tuple[int, int]:
        """``(token_budget, max_num_seqs)`` on ``gpu``."""
        if gpu.memory_bytes >= 70 * _GIB and not gpu.name.startswith("a100"):
            return self.token_budget_large_gpu, self.max_num_seqs_large_gpu
        return self.token_budget, self.max_num_seqs

    def kv_bytes_per_gpu(self, model: ModelSpec, gpu: GPUSpec, tp: int,
                         bytes_per_param: float = 2) -> float:  # fmt: skip
        """HBM bytes per GPU this engine gives its KV cache (<= 0 if the weights do not fit),
        weights at ``bytes_per_param``."""
        weights = model.weight_bytes(bytes_per_param) / tp
        mem = gpu.memory_bytes
        if self.kv_memory == "utilization":
            return mem * self.memory_fraction - weights - self.activation_reserve_bytes
        if self.kv_memory == "static":
            return mem * self.memory_fraction - weights
        return self.memory_fraction * (mem - weights - self.activation_reserve_bytes)


#: vLLM v1 (v0.10-0.11). Step limits: ``EngineArgs.get_batch_defaults`` (``vllm/engine/
#: arg_utils.py``), OpenAI server context: 2,048 tokens / 256 sequences, or 8,192 / 1,024 on
#: GPUs with >= 70 GiB that are not A100s. ``block_size`` 16 (``vllm/config/cache.py``);
#: ``gpu_memory_utilization`` 0.9 with activations profiled (``gpu_worker.py
#: determine_available_memory``; 3 GiB per GPU is our estimate for a 70B model at TP4 with CUDA
#: graphs). Prefix caching on by default: full blocks hashed, freed blocks evicted LRU
#: (``vllm/v1/core/block_pool.py``). No swap in v1; CPU offload through a KV connector.
#: Per-step CPU: no published number for v1 in ``shared/data/published``, so Vidur's measured
#: sarathi-serve overheads (a vLLM-derived scheduler) stay; not hidden, because asynchronous
#: scheduling is opt-in in 0.10-0.11 (``--async-scheduling``, ``SchedulerConfig.async_scheduling``
#: False). Kernel scale ``vllm``: fitted on the vLLM 0.6.0 ShareGPT offline rows (FlashAttention /
#: FlashInfer, as v1).
SIM_VLLM = EngineProfile(
    name="sim:vllm",
    block_size_tokens=16,
    token_budget=2048,
    token_budget_large_gpu=8192,
    max_num_seqs=256,
    max_num_seqs_large_gpu=1024,
    kv_memory="utilization",
    memory_fraction=0.9,
    activation_reserve_bytes=3 * _GIB,
    admission=AdmissionRule.CHUNK,
    prefix_cache="hashed_blocks",
    offload_min_priority=0,
    cpu_kv_ratio=2.0,
    native_policy="fcfs",
    version="vllm 0.10-0.11 (v1)",
    kernel_key="vllm",
    cpu_key="vidur",
)

#: SGLang 0.5.x. ``page_size`` 1; ``chunked_prefill_size`` 8,192 on 35-160 GB GPUs and
#: ``mem_fraction_static`` 0.85 at TP4 (``sglang/srt/server_args.py``
#: ``_handle_gpu_memory_settings``); ``max_running_requests`` 2,048 (the floor of
#: ``model_runner.py``'s default). Admission per ``PrefillAdder`` (shared/engines/sglang-0.5.md §1)
#: with ``new_token_ratio`` starting at 0.7, decaying over 600 decode steps to 0.7 x 0.14, and
#: reset by a retraction (``SGLANG_INIT_NEW_TOKEN_RATIO``, ``..._MIN_NEW_TOKEN_RATIO_FACTOR``,
#: ``..._NEW_TOKEN_RATIO_DECAY_STEPS``). Radix cache with LRU eviction; HiCache host tier
#: ``hicache_ratio`` 2.0. Native policy ``fcfs``: SGLang 0.5.23's ``--schedule-policy`` default
#: (``sglang/srt/arg_groups/fields/schedule.py``: ``schedule_policy = "fcfs"``). Overlap scheduler
#: on (``disable_overlap_schedule`` False, same file); one decode step per scheduling round
#: (``num_continuous_decode_steps`` 1). Prefill and decode do not share a step: a prefill batch
#: runs alone (``enable_mixed_chunk`` False, same file; ``Scheduler.get_next_batch_to_run`` runs
#: a new prefill batch before the decode batch). Kernel scale and per-step CPU: those fitted for
#: SGLang 0.3.0 (``kernel_key``/``cpu_key`` ``"sglang-0.3.0"``: scale 0.885 on its RPS-4 TPOT
#: rows, CPU 1.82 ms + 61.4 us per running request on its max-load rows; ``shared/data/published``
#: rows 608-645, ``results/fidelity/published_report.md``), the newest SGLang release with
#: published measurements. Not the family scale ``sglang`` (1.450), which is fitted on 0.2.13's
#: per-iteration forward times and on 0.3.0's max-load rows costed with 0.2.13's small CPU term,
#: so it carries into kernel time per-request CPU work that 0.3.0's own fit separates out and
#: that 0.5's overlap scheduler hides; with it, ``sim:sglang`` ran the same kernels 1.65x slower
#: than ``sim:vllm`` (scale 0.876), where the published side-by-side runs show the two engines
#: within 14 % of each other (SGLang 0.3.0 vs vLLM 0.6.0, same GPUs and ShareGPT runs: median
#: TPOT 13.17 vs 14.14 ms and 25.03 vs 23.58 ms at RPS 4, rows 610/614 and 626/630; offline
#: output 4,282 vs 4,132 and 3,856 vs 3,701 tok/s, rows 641/643 and 645/647). Release profiles
#: keep their own (``sim.versions``).
SIM_SGLANG = EngineProfile(
    name="sim:sglang",
    block_size_tokens=1,
    token_budget=8192,
    token_budget_large_gpu=8192,
    max_num_seqs=2048,
    max_num_seqs_large_gpu=2048,
    kv_memory="static",
    memory_fraction=0.85,
    activation_reserve_bytes=0,
    admission=AdmissionRule.RESERVE_RATIO,
    prefix_cache="radix",
    offload_min_priority=0,
    cpu_kv_ratio=2.0,
    native_policy="fcfs",
    reserve_ratio_init=0.7,
    reserve_ratio_min=0.7 * 0.14,
    reserve_ratio_decay=(0.7 - 0.7 * 0.14) / 600,
    version="sglang 0.5.23",
    kernel_key="sglang-0.3.0",
    cpu_key="sglang-0.3.0",
    cpu_overlap=True,
    mixed_batches=False,
)

#: TensorRT-LLM 1.2 (PyTorch backend, LLM API). ``tokens_per_block`` 32, ``max_num_tokens`` 8,192
#: and ``max_batch_size`` 2,048 (``TorchLlmArgs`` defaults); chunked context enabled
#: (``enable_chunked_prefill=True``, not the default, because Azure prompts exceed 8,192 tokens);
#: KV = ``free_gpu_memory_fraction`` 0.9 of what is free after weights and activations
#: (``KvCacheConfig``). ``GUARANTEED_NO_EVICT`` capacity scheduling (the default) reserves each
#: request's blocks to completion and never pauses. Block reuse on by default with prioritized
#: LRU (retention priority 0-100, default 35); the host cache drops blocks below priority 30
#: (shared/engines/trtllm-1.2.md §1.2, §2.2). Overlap scheduler on (``disable_overlap_scheduler``
#: False, ``_executor_loop_overlap``: trtllm-1.2.md). No TensorRT-LLM per-step CPU number is
#: published (``shared/data/published/README.md``, Gaps), and SGLang 0.2.13's fit (0.17 ms per
#: running request, measured at <= 300) would cost 350 ms a step at TensorRT-LLM's 2,048-request
#: batches, which its max-load tables rule out; the CPU term is taken as hidden (``cpu_key``
#: ``"none"``: an assumption, stated). Kernel
#: scale ``trtllm`` per dtype: fitted on the perf-overview max-load tables (FP8 on H100/H200, FP16
#: on A100; rows 1-122 of v0.17, 483-537 of 0.21, 588-607 of 1.1 and 1.2).
SIM_TRTLLM = EngineProfile(
    name="sim:trtllm",
    block_size_tokens=32,
    token_budget=8192,
    token_budget_large_gpu=8192,
    max_num_seqs=2048,
    max_num_seqs_large_gpu=2048,
    kv_memory="free",
    memory_fraction=0.9,
    activation_reserve_bytes=3 * _GIB,
    admission=AdmissionRule.RESERVE_MAX,
    prefix_cache="block_reuse",
    offload_min_priority=30,
    cpu_kv_ratio=2.0,
    native_policy="fcfs",
    version="tensorrt-llm 1.2 (PyTorch backend)",
    kernel_key="trtllm",
    cpu_key="none",
    cpu_overlap=True,
)

PROFILES: dict[str, EngineProfile] = {p.name: p for p in (SIM_VLLM, SIM_SGLANG, SIM_TRTLLM)}


def get_profile(name: str) -> EngineProfile:
    """Look up a profile by engine id.

    Raises:
        KeyError: unknown id; the message lists the known ones.
    """
    if name not in PROFILES:
        raise KeyError(f"unknown engine {name!r}; known: {', '.join(sorted(PROFILES))}")
    return PROFILES[name]
