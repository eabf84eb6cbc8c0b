"""The engine releases the published measurements ran (``shared/data/published``), as profiles.

``sim.profiles`` models the releases the project runs today (vLLM 0.10-0.11, SGLang 0.5.23,
TensorRT-LLM 1.2). The published numbers were measured on older releases with other defaults;
each profile here is one of today's with the settings of the release (and of the run) that
differ, so that a published setup is simulated with the mechanics it ran with. Kernel scales are
shared within an engine (``kernel_key``); CPU terms are per release where one was measured.

Every setting cites its source: a row of ``shared/data/published/engine_perf.csv`` (its ``method``
column), that directory's README, or the engine's code at that version.
"""

from __future__ import annotations

from dataclasses import replace

from superinfer.sim.profiles import SIM_SGLANG, SIM_TRTLLM, SIM_VLLM, EngineProfile

__all__ = ["VERSIONS", "get_version"]

_GIB = 1024**3

VERSIONS: dict[str, EngineProfile] = {
    # WukLab rows 718-749: "defaults: FlashInfer, chunked prefill, token budget 512, no prefix
    # caching, no multi-step"; max_num_seqs 256 (vLLM 0.5 ``SchedulerConfig`` default). V0's
    # scheduler runs on the critical path (no overlap).
    "vllm-0.5.4": replace(
        SIM_VLLM,
        name="sim:vllm@0.5.4",
        version="vllm 0.5.4",
        token_budget=512,
        token_budget_large_gpu=512,
        max_num_seqs=256,
        max_num_seqs_large_gpu=256,
        cpu_key="vllm-0.5.4",
        cpu_overlap=False,
    ),  # fmt: skip
    # Rows 612-647: ``--num-scheduler-steps 10 --max_model_len 4096``; chunked prefill is off by
    # default in 0.6.0 for contexts <= 32K, so prefills run in steps of their own (V0's
    # ``_schedule_default`` schedules decodes only when no prefill was scheduled) of up to
    # ``max(max_model_len, 2048)`` = 4,096 tokens; 256 sequences. Multi-step: decode-only steps
    # pay a tenth of the scheduling CPU (``cpu_decode_divisor``), run 10 at a time, and an
    # arrival waits for the run to end (``cut_repeat_on_arrival`` False), and a run lasts its 10
    # steps past a sequence's finish (``repeat_past_finish``: vLLM's multi-step output processor
    # truncates the surplus tokens). CPU terms: 0.5.4's (the V0
    # scheduler; 0.6.0's blog, rows 661-663, reports the split before its fixes).
    "vllm-0.6.0": replace(
        SIM_VLLM,
        name="sim:vllm@0.6.0",
        version="vllm 0.6.0",
        token_budget=4096,
        token_budget_large_gpu=4096,
        max_num_seqs=256,
        max_num_seqs_large_gpu=256,
        cpu_key="vllm-0.5.4",
        cpu_overlap=False,
        cpu_decode_divisor=10,
        mixed_batches=False,
        cut_repeat_on_arrival=False,
        repeat_past_finish=True,
    ),  # fmt: skip
    # WukLab rows 679-716: "chunked-prefill budget 512, K=10 multi-step for decode-only batches,
    # radix cache OFF"; no overlap scheduler before 0.4 (row 677, the 0.4 blog introduces it).
    # The published schedule time is per iteration, so the fitted CPU term is per iteration
    # (no divisor): SGLang 0.5 runs one decode step per round at about that cost.
    "sglang-0.2.13": replace(
        SIM_SGLANG,
        name="sim:sglang@0.2.13",
        version="sglang 0.2.13",
        token_budget=512,
        token_budget_large_gpu=512,
        cpu_overlap=False,
        kernel_key="sglang",
        cpu_key="sglang-0.2.13",
    ),  # fmt: skip
    # Rows 608-645: ``--disable-radix-cache``, ``--mem-frac 0.88`` (stated for the 70B offline
    # run; taken for all); chunked prefill 8,192 (``server_args.py`` 0.3.0 default); no overlap
    # scheduler (introduced in 0.4, row 677).
    "sglang-0.3.0": replace(
        SIM_SGLANG,
        name="sim:sglang@0.3.0",
        version="sglang 0.3.0",
        memory_fraction=0.88,
        cpu_overlap=False,
        kernel_key="sglang-0.3.0",
        cpu_key="sglang-0.3.0",
    ),  # fmt: skip
    # Rows 123-302: Triton ``tensorrtllm_backend``, BF16; ``kv_cache_free_gpu_mem_fraction`` 0.9
    # (the backend's default); max batch and tokens not stated: TensorRT-LLM's build defaults
    # of that era (``max_batch_size`` 2,048 and ``max_num_tokens`` 8,192, as 1.2's).
    "trtllm-0.14": replace(SIM_TRTLLM, name="sim:trtllm@0.14", version="tensorrt-llm 0.14.0"),
    # Rows 1-122: ``trtllm-bench`` with ``kv_cache_free_gpu_mem_fraction 0.95``; batch and token
    # limits from build heuristics, not stated (1.2's defaults taken).
    "trtllm-0.17": replace(
        SIM_TRTLLM, name="sim:trtllm@0.17", version="tensorrt-llm 0.17", memory_fraction=0.95
    ),  # fmt: skip
    # Rows 483-537 (0.21), 588-599 (1.1) and 600-607 (1.2): PyTorch backend, KV fraction 0.95.
    "trtllm-0.21": replace(
        SIM_TRTLLM, name="sim:trtllm@0.21", version="tensorrt-llm 0.21.0", memory_fraction=0.95
    ),  # fmt: skip
    "trtllm-1.1": replace(
        SIM_TRTLLM, name="sim:trtllm@1.1", version="tensorrt-llm 1.1", memory_fraction=0.95
    ),  # fmt: skip
    "trtllm-1.2": replace(
        SIM_TRTLLM, name="sim:trtllm@1.2", version="tensorrt-llm 1.2", memory_fraction=0.95
    ),  # fmt: skip
}


def get_version(key: str) -> EngineProfile:
    """The profile of one published release, e.g. ``"vllm-0.5.4"``.

    Raises:
        KeyError: unknown release; the message lists the known ones.
    """
    if key not in VERSIONS:
        raise KeyError(f"unknown engine release {key!r}; known: {', '.join(VERSIONS)}")
    return VERSIONS[key]
