"""Policy decisions to TensorRT-LLM: scheduler inputs and outputs, retention configs, KV pools.

- ``ScheduleDecision`` -> what the wrapped ``SimpleScheduler`` sees and returns (Mode B): the policy
  orders the active requests, withholds not-started ones it did not admit, skips decodes it did
  not schedule and pauses (recompute) the ones it preempts. The inner capacity and micro-batch
  schedulers still have the last word on what fits.
- ``PlacementDecision`` -> ``KvCacheRetentionConfig`` (Mode A): TensorRT-LLM 1.2 sets retention
  per request at submission, as token ranges with priorities (engine notes §2.2).
- ``KVPrecision`` -> one of several engines (one KV dtype per engine in 1.2, notes §2.4).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from superinfer.policy_core.types import KVPrecision, Placement, ScheduleDecision

__all__ = [
    "DEFAULT_RETENTION_PRIORITY",
    "OFFLOAD_MIN_PRIORITY",
    "RetentionMapping",
    "RetentionRange",
    "SchedulePlan",
    "choose_pool",
    "kv_precision_of_dtype",
    "merge_output",
    "plan_step",
    "retention_config",
    "retention_ranges",
]

#: Priority of blocks without a retention range (``KvCacheRetentionConfig`` default, notes §2.2).
DEFAULT_RETENTION_PRIORITY = 35
#: Lowest priority whose evicted blocks go to the host tier instead of being dropped. The docs say
#: ``secondary_offload_min_priority`` (default 35), but 1.2.x's PyTorch ``KVCacheManager`` never
#: forwards it, so the C++ default 30 applies (PR #13768, notes §2.2).
OFFLOAD_MIN_PRIORITY = 30


# -------------------------------------------------------------------------------------------------
# Mode B: a decision applied around the inner scheduler
# -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SchedulePlan:
    """A ``ScheduleDecision`` in the inner scheduler's terms.

    Attributes:
        ordered: active requests to hand to the inner scheduler, in this order: those the policy
            runs (decision order), those it admits without tokens, the other started requests,
            the requests the policy was not shown (original order), and last the ones it
            preempts. Started requests are never hidden: GUARANTEED_NO_EVICT must keep counting
            their reservations, and MAX_UTILIZATION, which pauses from the back of the list when
            blocks run short, then pauses the preempted ones first and credits their blocks.
        skip_decode: ``py_request_id`` of started requests the policy gave no tokens; their
            decode steps are dropped from the inner's output (their KV stays allocated).
        preempted: started requests to pause (``paused_requests``: KV freed, recompute later).
        rejected: not-started requests to end, with the policy's reason.
    """

    ordered: tuple[Any, ...]
    skip_decode: frozenset[int]
    preempted: tuple[Any, ...]
    rejected: tuple[tuple[Any, str], ...]


def plan_step(
    decision: ScheduleDecision,
    running: Mapping[str, Any],
    waiting: Mapping[str, Any],
    unviewed: Sequence[Any],
) -> SchedulePlan:
    """Translate a checked decision (``check_decision`` passed) into a :class:`SchedulePlan`.

    Args:
        decision: the policy's decision.
        running: started requests by view id, in active-list order.
        waiting: not-started requests by view id.
        unviewed: active requests the policy was not shown (other states, dummies).
    """
    live = {**running, **waiting}
    ordered = [live[rid] for rid in decision.num_tokens]
    placed = set(decision.num_tokens)
    ordered += [waiting[rid] for rid in decision.admit if rid not in placed]
    placed |= set(decision.admit) | set(decision.preempt)
    rest = [req for rid, req in running.items() if rid not in placed]
    preempted = [running[rid] for rid in decision.preempt]
    return SchedulePlan(
        ordered=tuple(ordered + rest + list(unviewed) + preempted),
        skip_decode=frozenset(req.py_request_id for req in rest),
        preempted=tuple(preempted),
        rejected=tuple((waiting[rid], reason) for rid, reason in decision.reject.items()),
    )


def merge_output(output: Any, plan: SchedulePlan) -> Any:
    """The inner's ``SchedulerOutput`` with the policy's skips and preemptions applied.

    Preempted requests leave the context and generation lists and join ``paused_requests``
    (once, whether or not the inner paused them too); skipped decodes leave the generation list.

    Args:
        output: the inner scheduler's ``SchedulerOutput`` (a namedtuple).
        plan: the plan the inner was given.
    """
    preempted = {r.py_request_id for r in plan.preempted}
    drop = preempted | plan.skip_decode
    context = [r for r in output.context_requests if r.py_request_id not in preempted]
    generation = [r for r in output.generation_requests if r.py_request_id not in drop]
    paused = list(output.paused_requests)
    paused_ids = {r.py_request_id for r in paused}
    paused += [r for r in plan.preempted if r.py_request_id not in paused_ids]
    return output._replace(
        context_requests=context, generation_requests=generation, paused_requests=paused
    )


# -------------------------------------------------------------------------------------------------
# Mode A: placement -> retention priorities
# -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetentionMapping:
    """Retention priority for each placement (engine notes §2.2, "Mapping for the predictor").

    Blocks are evicted lowest priority first; evicted blocks at or above
    :data:`OFFLOAD_MIN_PRIORITY` go to the host tier (when ``host_cache_size > 0``), the others are
    dropped. ``KEEP`` sets no range, so the engine default (35) applies.

    Attributes:
        pin_priority: for ``PIN`` (a soft pin: evicted only after every lower priority).
        pin_duration_ms: how long a pin lasts after the block becomes reusable, in ms; ``None``
            for as long as the block lives. After it the priority reverts to 35.
        offload_priority: for ``OFFLOAD``; the default 35 is at or above both documented offload
            thresholds (30 effective on 1.2.1, 35 in the docs), so it offloads on either. It
            equals the default priority, so on 1.2.1 ``offload_priority=30`` makes offloaded blocks
            leave HBM before unplanned ones.
        drop_priority: for ``DROP``; below the threshold, so evicted first and never offloaded.

    Raises:
        ValueError: priorities outside [0, 100], ``drop_priority >= 30``, ``offload_priority <
            30`` or ``pin_priority < offload_priority``.
    """

    pin_priority: int = 100
    pin_duration_ms: float | None = None
    offload_priority: int = DEFAULT_RETENTION_PRIORITY
    drop_priority: int = 1

    def __post_init__(self) -> None:
        for name in ("pin_priority", "offload_priority", "drop_priority"):
            value = getattr(self, name)
            if not 0 <= value <= 100:
                raise ValueError(f"RetentionMapping.{name} must be in [0, 100], got {value}")
        if self.drop_priority >= OFFLOAD_MIN_PRIORITY:
            raise ValueError(f"drop_priority must be < {OFFLOAD_MIN_PRIORITY} (never offloaded)")
        if self.offload_priority < OFFLOAD_MIN_PRIORITY:
            raise ValueError(f"offload_priority must be >= {OFFLOAD_MIN_PRIORITY} (offloaded)")
        if self.pin_priority < self.offload_priority:
            raise ValueError("pin_priority must be >= offload_priority")
        if self.pin_duration_ms is not None and not self.pin_duration_ms > 0:
            raise ValueError(f"pin_duration_ms must be > 0, got {self.pin_duration_ms}")

    def priority(self, placement: Placement) -> tuple[int, float | None] | None:
        """``(priority, duration_ms)`` for a placement, ``None`` for ``KEEP``."""
        if placement is Placement.PIN:
            return self.pin_priority, self.pin_duration_ms
        if placement is Placement.OFFLOAD:
            return self.offload_priority, None
        if placement is Placement.DROP:
            return self.drop_priority, None
        return None


@dataclass(frozen=True, slots=True)
class RetentionRange:
    """Prompt tokens ``[token_start, token_end)`` kept at ``priority`` for ``duration_ms``."""

    token_start: int
    token_end: int
    priority: int
    duration_ms: float | None = None


def retention_ranges(
    placements: Sequence[Placement], tokens_per_block: int, mapping: RetentionMapping
) -> tuple[RetentionRange, ...]:
    """Token ranges for a prompt whose ``i``-th full block gets ``placements[i]``.

    Consecutive blocks with the same priority and duration merge into one range; ``KEEP`` blocks
    get none. Only full blocks are ever stored for reuse, so ranges end on block boundaries.
    """
    ranges: list[RetentionRange] = []
    for i, placement in enumerate(placements):
        setting = mapping.priority(placement)
        if setting is None:
            continue
        start, end = i * tokens_per_block, (i + 1) * tokens_per_block
        last = ranges[-1] if ranges else None
        if last and last.token_end == start and (last.priority, last.duration_ms) == setting:
            ranges[-1] = RetentionRange(last.token_start, end, *setting)
        else:
            ranges.append(RetentionRange(start, end, *setting))
    return tuple(ranges)


def retention_config(ranges: Sequence[RetentionRange], config_cls: Any) -> Any:
    """A ``KvCacheRetentionConfig`` for ``ranges`` (``None`` when empty: the engine default).

    Args:
        ranges: from :func:`retention_ranges`.
        config_cls: ``tensorrt_llm.llmapi.KvCacheRetentionConfig``.
    """
    if not ranges:
        return None
    token_range = config_cls.TokenRangeRetentionConfig
    return config_cls(
        [
            token_range(
                r.token_start,
                r.token_end,
                r.priority,
                None if r.duration_ms is None else timedelta(milliseconds=r.duration_ms),
            )
            for r in ranges
        ],
        DEFAULT_RETENTION_PRIORITY,
    )


# -------------------------------------------------------------------------------------------------
# Precision -> engine
# -------------------------------------------------------------------------------------------------

_BITS = {KVPrecision.INT4: 4, KVPrecision.FP8: 8, KVPrecision.INT8: 8, KVPrecision.FP16: 16}
_DTYPES = {
    "fp8": KVPrecision.FP8,
    "auto": KVPrecision.FP16,  # the model's dtype: FP16 or BF16, two bytes per element
    "float16": KVPrecision.FP16,
    "fp16": KVPrecision.FP16,
    "half": KVPrecision.FP16,
    "bfloat16": KVPrecision.FP16,
    "bf16": KVPrecision.FP16,
}


def kv_precision_of_dtype(dtype: str) -> KVPrecision:
    """The precision of an engine built with ``KvCacheConfig(dtype=dtype)``.

    Raises:
        ValueError: a dtype the PyTorch backend of 1.2 does not store KV in per-pool (notes §2.4:
            FP8 or the model's 16-bit dtype; NVFP4 comes from a checkpoint, not this field).
    """
    try:
        return _DTYPES[dtype.lower()]
    except KeyError:
        raise ValueError(
            f"KvCacheConfig.dtype={dtype!r}: expected one of {', '.join(sorted(_DTYPES))}"
        ) from None


def choose_pool(requested: KVPrecision, available: Collection[KVPrecision]) -> KVPrecision:
    """The engine pool that stores a request's KV at ``requested`` precision, or the closest.

    The exact precision if a pool has it; otherwise the pool with the fewest bits at or above
    the requested ones (never store below what was asked); otherwise the pool with the most bits.

    Raises:
        ValueError: ``available`` is empty.
    """
    if not available:
        raise ValueError("no KV precision pool to route to")
    if requested in available:
        return requested
    above = [p for p in available if _BITS[p] >= _BITS[requested]]
    if above:
        return min(above, key=lambda p: (_BITS[p], p.value))
    return max(available, key=lambda p: (_BITS[p], p.value))
