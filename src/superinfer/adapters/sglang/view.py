"""SGLang objects -> the policy's views (``RequestView``, ``StepState``; the radix tree's
``PrefixNodeView`` views are :mod:`.prefix_view`'s).

Read-only: nothing here changes a ``Req``, a batch or the radix tree. Time is the adapter's clock
(:func:`make_clock`): the :class:`LogicalClock` wherever more than one rank must take the same
decision (every tensor-parallel rank builds the same views from the same batches), and the
scheduler's own :class:`WallClock` where one process decides alone (TP = PP = 1, no DP attention),
so SLO seconds and step seconds are the same seconds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from superinfer.adapters.sglang.config import CLOCK_MODES, AdapterConfig
from superinfer.adapters.sglang.prefix_view import prompt_chunk_keys
from superinfer.policy_core.batching import blocks_for_tokens, sglang_output_reserve
from superinfer.policy_core.changes import ViewTracker
from superinfer.policy_core.types import (
    SLO,
    AdmissionRule,
    KVLocation,
    RequestView,
    StepState,
)

__all__ = [
    "EngineLimits",
    "LogicalClock",
    "CLOCK_MODES",
    "WallClock",
    "clock_for",
    "make_clock",
    "single_rank",
    "RequestRecord",
    "chunked_request",
    "new_token_ratio",
    "SLOFieldError",
    "kv_pool_blocks",
    "request_view",
    "reserved_blocks",
    "resolve_slo",
    "step_state",
    "ViewTracker",
]


class SLOFieldError(ValueError):
    """A request's SLO fields are unusable; the message names the field (sent back as a 400)."""


@dataclass(slots=True)
class LogicalClock:
    """Adapter time: ``step_index * step_s + num_tokens * token_s`` logical seconds.

    Advanced once per executed batch by the tokens it ran, which every TP rank sees identically.

    Attributes:
        step_s: logical seconds per executed batch.
        token_s: logical seconds per token a batch runs.
        step_index: batches executed.
        num_tokens: tokens run by those batches (prefill tokens, plus one per decoding request).
    """

    step_s: float
    token_s: float
    step_index: int = 0
    num_tokens: int = 0

    @property
    def now_s(self) -> float:
        """The current logical instant, in s."""
        return self.step_index * self.step_s + self.num_tokens * self.token_s

    def advance(self, num_tokens: int, busy_s: float | None = None) -> float:
        """Count one executed batch of ``num_tokens`` tokens; returns its logical duration, s
        (``busy_s``, the batch's measured wall time, is ignored: ranks measure differently)."""
        self.step_index += 1
        self.num_tokens += num_tokens
        return self.step_s + num_tokens * self.token_s


@dataclass(slots=True)
class WallClock:
    """Measured adapter time: seconds of ``time_fn`` since the clock was made.

    For a scheduler that decides alone (:func:`single_rank`): its deadlines, TPOT allowances and
    step-time fit are then in the seconds the SLOs are written in. On a 2-core CPU an SGLang step
    takes 10-1000 ms (a 512-token prefill chunk ~0.6 s), 1-50x the logical clock's nominal 20 ms
    step + 0.1 ms per token (results/sglang-cpu/report.md).

    Attributes:
        time_fn: the time source, s (``time.monotonic``; a test passes its own).
        origin: ``time_fn()`` when the clock was made.
        step_index: batches executed.
        num_tokens: tokens run by those batches.
    """

    time_fn: Callable[[], float] = time.monotonic
    origin: float = math.nan
    step_index: int = 0
    num_tokens: int = 0
    _last: float = field(default=math.nan, repr=False)

    def __post_init__(self) -> None:
        if math.isnan(self.origin):
            self.origin = self.time_fn()
        self._last = self.origin

    @property
    def now_s(self) -> float:
        """Seconds since the clock was made."""
        return self.time_fn() - self.origin

    def advance(self, num_tokens: int, busy_s: float | None = None) -> float:
        """Count one executed batch of ``num_tokens`` tokens.

        Args:
            num_tokens: tokens the batch ran.
            busy_s: its measured wall time (``Scheduler.run_batch``), s; ``None``: the time
                since the previous batch ended (idle time included).

        Returns:
            The batch's duration, s: ``busy_s``, else the time since the previous advance.
        """
        now = self.time_fn()
        since = now - self._last
        self._last = now
        self.step_index += 1
        self.num_tokens += num_tokens
        return since if busy_s is None else busy_s


def single_rank(scheduler: Any) -> bool:
    """Whether this SGLang scheduler takes its decisions alone: one tensor- and one
    pipeline-parallel rank and no DP attention (whose ranks batch together). Independent
    data-parallel replicas each decide alone."""
    args = getattr(scheduler, "server_args", None)
    tp = getattr(scheduler, "tp_size", None) or getattr(args, "tp_size", 1) or 1
    pp = getattr(args, "pp_size", 1)
    dp_attention = bool(getattr(args, "enable_dp_attention", False))
    return int(tp) == 1 and int(pp) == 1 and not dp_attention


def make_clock(
    mode: str,
    step_s: float,
    token_s: float,
    *,
    single: bool | None,
    time_fn: Callable[[], float] = time.monotonic,
) -> LogicalClock | WallClock:
    """The adapter's clock for ``mode`` (:data:`CLOCK_MODES`).

    Args:
        mode: ``logical``; ``wall``; ``auto``: wall when ``single``, else logical.
        step_s: the logical clock's seconds per batch.
        token_s: the logical clock's seconds per token.
        single: whether the scheduler decides alone (:func:`single_rank`); ``None``: not known
            yet (no scheduler bound), and ``auto`` stays logical.
        time_fn: the wall clock's time source.

    Raises:
        ValueError: an unknown mode, or ``wall`` on a scheduler whose ranks must agree.
    """
    if mode not in CLOCK_MODES:
        raise ValueError(f"clock.mode {mode!r}: use one of {', '.join(CLOCK_MODES)}")
    if mode == "wall" and single is False:
        raise ValueError(
            "clock.mode 'wall' needs a lone scheduler rank (TP = PP = 1, no DP attention): ranks "
            "would read different times and decide differently; use 'auto' or 'logical'"
        )
    if mode == "wall" or (mode == "auto" and single):
        return WallClock(time_fn)
    return LogicalClock(step_s, token_s)


@dataclass(slots=True)
class RequestRecord:
    """What the adapter remembers about a request between scheduling points.

    Attributes:
        seq: arrival sequence number on this scheduler (the FCFS tie-break).
        arrival_s: logical arrival instant, s.
        slo: its SLO class.
        tier: scheduling tier last assigned by the policy, ``None`` before any.
        first_token_s: logical instant of its first output token.
        ended: whether finished/aborted has been reported to the plugins.
        precision_planned: whether ``superinfer_kv_precision`` was asked for it.
    """

    seq: int
    arrival_s: float
    slo: SLO
    tier: int | None = None
    first_token_s: float | None = None
    ended: bool = False
    precision_planned: bool = False

    @property
    def rank(self) -> int:
        """Importance, lower is more urgent: the policy's tier, else ``SLO.priority``."""
        return self.tier if self.tier is not None else self.slo.priority


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """The scheduler settings a ``StepState`` reports (from ``Scheduler`` at startup).

    Attributes:
        page_size: tokens per KV page (``--page-size``); the policy's block.
        max_prefill_tokens: prefill tokens per batch (``--max-prefill-tokens``).
        max_running_requests: most requests in the running batch.
        priority_scheduling: ``--enable-priority-scheduling``.
        low_priority_values_first: ``--schedule-low-priority-values-first``.
        kv_cache_dtype: ``--kv-cache-dtype`` (one per engine; for the precision log).
        mixed_chunk: ``Scheduler.is_mixed_chunk`` (``--enable-mixed-chunk`` with chunked
            prefill): a prefill batch carries the running decodes; off by default, so a
            prefill batch runs alone (``StepState.mixed_batches``).
    """

    page_size: int = 1
    max_prefill_tokens: int = 16384
    max_running_requests: int = 256
    priority_scheduling: bool = True
    low_priority_values_first: bool = False
    kv_cache_dtype: str = "auto"
    mixed_chunk: bool = False


def resolve_slo(req: Any, config: AdapterConfig) -> SLO:
    """The SLO class of a new SGLang ``Req``.

    Looked up, first match wins: ``sampling_params.custom_params["slo"]`` (a class name, or an
    object ``{"class": name, "ttft_ms": ..., "tpot_ms": ..., "deadline_s": ...}`` overriding that
    class's targets), then the client's ``priority`` in ``config.priority_classes``, then
    ``config.default_class``.

    Raises:
        SLOFieldError: an unknown class, an unknown or invalid target.
    """
    custom = getattr(req.sampling_params, "custom_params", None) or {}
    spec = custom.get("slo") if isinstance(custom, dict) else None
    if spec is not None:
        name = spec.get("class") if isinstance(spec, dict) else spec
        if name is None and isinstance(spec, dict):
            name = config.default_class
        if not isinstance(name, str) or name not in config.slo_classes:
            known = ", ".join(sorted(config.slo_classes))
            raise SLOFieldError(f"custom_params.slo: unknown class {name!r} (classes: {known})")
        slo = config.slo_classes[name]
        if isinstance(spec, dict):
            overrides = {k: v for k, v in spec.items() if k != "class"}
            allowed = {"ttft_ms", "tpot_ms", "deadline_s"}
            if extra := sorted(set(overrides) - allowed):
                raise SLOFieldError(f"custom_params.slo: unknown field {extra[0]!r}")
            try:
                slo = replace(slo, **overrides)
            except (TypeError, ValueError) as exc:
                raise SLOFieldError(f"custom_params.slo: {exc}") from None
        return slo
    if req.priority is not None and req.priority in config.priority_classes:
        return config.slo_classes[config.priority_classes[req.priority]]
    return config.slo_classes[config.default_class]


def request_view(
    req: Any,
    record: RequestRecord,
    *,
    running: bool,
    page_size: int,
    chunked: bool = False,
    keys: bool = False,
) -> RequestView:
    """The view of one SGLang ``Req`` (``keys``: with its ``prompt_chunk_keys``, from
    :func:`.prefix_view.prompt_chunk_keys`; O(prompt tokens), so only at arrival).

    A running request holds KV for all but its last sampled token (it decodes one token next); a
    waiting one holds none, and ``prefix_hit_tokens`` is SGLang's last prefix match for it.
    ``chunked`` (with ``running``): the scheduler's chunked request between two of its prefill
    chunks (``Scheduler.chunked_req``; in neither the waiting queue nor the running batch until
    its last chunk), which holds KV for the tokens its chunks ran (``Req.prefix_len``, or
    ``extend_end`` where the last chunk is not checkpointed yet) of what it prefills: its prompt,
    plus its output so far when it resumes after a retraction (SGLang chunks
    ``full_untruncated_fill_ids``); at most all but one of them (it has prefill left).
    """
    prompt = len(req.origin_input_ids)
    generated = len(req.output_ids)
    if chunked:
        computed = max(0, min(_chunks_ran(req), prompt + generated - 1))
    else:
        computed = prompt + generated - 1 if running and generated else 0
    return RequestView(
        request_id=req.rid,
        arrival_s=record.arrival_s,
        prompt_tokens=prompt,
        max_output_tokens=req.sampling_params.max_new_tokens,
        slo=record.slo,
        computed_tokens=computed,
        cached_tokens=req.cached_tokens,
        prefix_hit_tokens=0 if running or chunked else req.num_matched_prefix_tokens,
        generated_tokens=generated,
        first_token_s=record.first_token_s,
        num_preemptions=req.retraction_count,
        tier=record.tier or 0,
        kv_location=KVLocation.HBM if computed else KVLocation.UNALLOCATED,
        kv_blocks=-(-computed // page_size),
        prompt_chunk_keys=prompt_chunk_keys(req, page_size) if keys else (),
    )


def clock_for(config: AdapterConfig, scheduler: Any = None) -> LogicalClock | WallClock:
    """:func:`make_clock` of ``config.clock_mode``; ``scheduler`` (an SGLang ``Scheduler``, or
    ``None`` before one is bound) says whether it decides alone (:func:`single_rank`).

    Raises:
        ValueError: ``wall`` on a scheduler whose ranks must agree.
    """
    single = None if scheduler is None else single_rank(scheduler)
    return make_clock(config.clock_mode, config.step_s, config.token_s, single=single)


def kv_pool_blocks(allocator: Any, tree_cache: Any, page_size: int) -> tuple[int, int]:
    """``(free, total)`` KV blocks: free counts the tree's evictable tokens, as SGLang's
    admission budget does (``allocator.create_prefill_budget``)."""
    free_tokens = allocator.available_size() + tree_cache.evictable_size()
    return free_tokens // page_size, allocator.size // page_size


def _chunks_ran(req: Any) -> int:
    """Tokens a chunked request's chunks ran: ``Req.prefix_len``, or ``extend_end`` where its
    last chunk is not checkpointed into the tree yet."""
    return int(max(req.prefix_len, req.extend_end or 0))


def chunked_request(scheduler: Any, waiting: Sequence[Any], running: Sequence[Any]) -> Any:
    """``scheduler.chunked_req`` (SGLang 0.5.23 ``Scheduler``) while it is between two of its
    prefill chunks, in neither ``waiting`` nor ``running``; else ``None`` (also without a
    scheduler, e.g. before it starts)."""
    req = getattr(scheduler, "chunked_req", None)
    if req is None or req.finished() or req in running or req in waiting:
        return None
    return req


def new_token_ratio(scheduler: Any) -> float:
    """The scheduler's ``new_token_ratio`` (``Scheduler.new_token_ratio_tracker.current``,
    SGLang 0.5.23), or 1.0 without one: the whole output cap, as SGLang holds for an
    ``ignore_eos`` request (the harness sends every request so)."""
    tracker = getattr(scheduler, "new_token_ratio_tracker", None)
    return float(getattr(tracker, "current", 1.0))


def reserved_blocks(
    running: Iterable[Any], chunked: Any, new_token_ratio: float, page_size: int
) -> int:
    """KV blocks an admission must leave free for the requests SGLang 0.5.23 runs: the rule of
    the simulator's SGLang CPU profile (``sim.replica.Replica.reserved_blocks`` with
    ``reserve_whole_prompt``), so the policy decides on the server as it does in
    ``sim:sglang-cpu``.

    Each running request's remaining output cap, clipped to ``CLIP_MAX_NEW_TOKENS``
    (:data:`~superinfer.policy_core.batching.SGLANG_CLIP_MAX_NEW_TOKENS`) and scaled by 1.0 for
    an ``ignore_eos`` request, else by ``new_token_ratio``: what ``PrefillAdder`` holds back
    before it admits anyone (``schedule_policy.py``
    ``_get_running_request_total_token_offset``). The chunked request's output cap likewise,
    and its prefill still to run, whole. That part is stricter than SGLang: ``add_chunked_req``
    charges only the chunk it runs in this pass (and the output cap with the last chunk), and a
    policy charges that chunk again as the running prefill's own tokens (``step_blocks``), so up
    to one chunk (at most ``--chunked-prefill-size`` tokens, here 512 of a 4,096-token pool) is
    counted twice, and a prompt with more than one chunk left has its later ones held too: the
    policy may admit less than SGLang would there (not checked against SGLang's own refusals).
    The simulator does the same, so its replays of the server match the policy's view.

    Args:
        running: the running batch's unfinished ``Req``s.
        chunked: ``Scheduler.chunked_req``, or ``None``.
        new_token_ratio: the scheduler's current ``new_token_ratio``.
        page_size: tokens per KV page.

    Returns:
        Blocks, rounded up.
    """
    out = 0.0
    rest = 0
    for req in [*running, *([chunked] if chunked is not None else [])]:
        left = sglang_output_reserve(req.sampling_params.max_new_tokens, len(req.output_ids))
        ratio = 1.0 if getattr(req.sampling_params, "ignore_eos", False) else new_token_ratio
        out += left * ratio
    if chunked is not None:  # its prompt, and its output so far if resumed after a retraction
        ran = _chunks_ran(chunked)
        rest = max(len(chunked.origin_input_ids) + len(chunked.output_ids) - ran, 0)
    return blocks_for_tokens(rest + int(out), page_size)


def step_state(
    *,
    clock: LogicalClock | WallClock,
    waiting: Sequence[RequestView],
    running: Sequence[RequestView],
    free_blocks: int,
    total_blocks: int,
    limits: EngineLimits,
    reserved: int = 0,
) -> StepState:
    """A scheduling point of an SGLang scheduler.

    SGLang has no swap of a running request's KV (a preempted or retracted request is recomputed:
    ``mem_cache/common.py::release_kv_cache(checkpoint=False)``), so ``swapped`` is empty and the
    CPU tier and link bandwidth are reported as 0. The token budget is SGLang's prefill budget plus
    one token per decoding request (the chunked request does not decode), its decode batch (run
    in the same batch only with mixed chunk, ``limits.mixed_chunk``; else in the next one:
    ``mixed_batches``). Admission is SGLang's
    ``PrefillAdder`` rule: ``RESERVE_RATIO`` with ``reserved`` blocks held back for the running
    requests (:func:`reserved_blocks`) and a new request charged its whole remaining prompt and
    output cap (``reserve_whole_prompt``).
    """
    return StepState(
        now_s=clock.now_s,
        step_index=clock.step_index,
        waiting=tuple(waiting),
        running=tuple(running),
        swapped=(),
        free_hbm_blocks=free_blocks,
        total_hbm_blocks=total_blocks,
        free_cpu_blocks=0,
        total_cpu_blocks=0,
        block_size_tokens=limits.page_size,
        token_budget=limits.max_prefill_tokens + sum(1 for v in running if v.pending_tokens <= 1),
        max_num_seqs=limits.max_running_requests,
        reserved_hbm_blocks=reserved,
        admission=AdmissionRule.RESERVE_RATIO,
        mixed_batches=limits.mixed_chunk,
        reserve_whole_prompt=True,
        prefill_runs_whole=True,
    )
