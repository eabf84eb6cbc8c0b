"""Engine-neutral value types shared by every policy, adapter and the simulator.

Everything here is a frozen, slotted dataclass or a string enum: no engine objects, no tensors,
no sentinel values. Units are in the field names (``_s`` instants on one monotonic clock,
``_ms`` durations, ``_tokens``, ``_blocks``, ``_bytes``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "SLO",
    "AdmissionRule",
    "KVLocation",
    "KVPages",
    "KVPrecision",
    "Placement",
    "PlacementDecision",
    "PreemptMode",
    "PrefixNodeView",
    "Queue",
    "QueueChanges",
    "RequestView",
    "ScheduleDecision",
    "StepChanges",
    "StepState",
    "StepStats",
]


class KVPrecision(str, enum.Enum):
    """Storage precision of a request's KV cache."""

    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"


class KVLocation(str, enum.Enum):
    """Where a request's KV cache lives right now."""

    UNALLOCATED = "unallocated"  # no KV yet (waiting, or freed by a recompute preemption)
    HBM = "hbm"
    CPU = "cpu"


class PreemptMode(str, enum.Enum):
    """How a preempted request gives its KV back.

    ``RECOMPUTE`` frees the blocks; the request re-runs its prefill (prompt plus tokens generated
    so far) when it resumes. ``SWAP`` copies the blocks to CPU memory and back on resume.
    """

    RECOMPUTE = "recompute"
    SWAP = "swap"


class AdmissionRule(str, enum.Enum):
    """How an engine charges KV for admitting a request (an engine mechanic, not a policy choice).

    ``CHUNK``: only the blocks of the tokens it runs this step (vLLM v1 ``allocate_slots``).
    ``RESERVE_MAX``: blocks for its whole prompt plus ``max_output_tokens``, allocated at admission,
    so it can never run out (TensorRT-LLM ``GUARANTEED_NO_EVICT``).
    ``RESERVE_RATIO``: the blocks it runs plus headroom for its whole remaining output cap, which
    is not allocated (SGLang ``PrefillAdder``: ``extend_len + max_new_tokens``); running requests
    keep ``new_token_ratio`` of theirs as ``StepState.reserved_hbm_blocks``.
    """

    CHUNK = "chunk"
    RESERVE_MAX = "reserve_max"
    RESERVE_RATIO = "reserve_ratio"


class Placement(str, enum.Enum):
    """Fate of one cached prefix node (DESIGN §6)."""

    PIN = "pin"  # keep in HBM, never evict while pinned
    KEEP = "keep"  # leave to the engine's own eviction order
    OFFLOAD = "offload"  # move to CPU memory
    DROP = "drop"  # free


@dataclass(frozen=True, slots=True)
class SLO:
    """Service-level objective of one request class.

    A request meets its SLO only if it meets every target that is set (``None`` = no target).

    Attributes:
        name: class name, e.g. ``"chat"`` or ``"batch"``; the key of per-class metrics.
        ttft_ms: time to first token target, arrival to first token, in ms.
        tpot_ms: time per output token target, ``(e2e - ttft) / (output_tokens - 1)``, in ms.
        deadline_s: end-to-end deadline after arrival, in s.
        weight: relative importance (goodput weighting, load shedding); > 0.
        priority: strict priority; **lower is more urgent** (vLLM's convention).
        ttft_ms_per_1k_prompt: prompt-scaled TTFT: ms added to ``ttft_ms`` per 1,000 prompt
            tokens (needs ``ttft_ms``).
        ttft_x_isolated: engine-relative TTFT: this multiple of the request's prefill alone on an
            idle replica of the engine (instead of ``ttft_ms``).
        tpot_x_isolated: engine-relative TPOT: this multiple of the request's first decode step
            alone on an idle replica (instead of ``tpot_ms``).

    The last three are *forms* of a class; a request carries the absolute targets they give for
    it (``policy_core.slo_forms.for_request``), so policies and metrics read ``ttft_ms`` and
    ``tpot_ms`` only.

    Raises:
        ValueError: on an empty name, a non-positive target or weight, or forms that clash.
    """

    name: str
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    deadline_s: float | None = None
    weight: float = 1.0
    priority: int = 0
    ttft_ms_per_1k_prompt: float | None = None
    ttft_x_isolated: float | None = None
    tpot_x_isolated: float | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("SLO.name must be non-empty")
        for key in ("ttft_ms_per_1k_prompt", "ttft_x_isolated", "tpot_x_isolated"):
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise ValueError(f"SLO {self.name!r}: {key} must be > 0, got {value}")
        for form, base in (("ttft_x_isolated", "ttft_ms"), ("tpot_x_isolated", "tpot_ms")):
            if getattr(self, form) is not None and getattr(self, base) is not None:
                raise ValueError(f"SLO {self.name!r}: {form} replaces {base}: give one")
        if self.ttft_ms_per_1k_prompt is not None and self.ttft_ms is None:
            raise ValueError(f"SLO {self.name!r}: ttft_ms_per_1k_prompt needs ttft_ms (the base)")
        for key in ("ttft_ms", "tpot_ms", "deadline_s"):
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise ValueError(f"SLO {self.name!r}: {key} must be > 0, got {value}")
        if not self.weight > 0:
            raise ValueError(f"SLO {self.name!r}: weight must be > 0, got {self.weight}")


@dataclass(frozen=True, slots=True)
class RequestView:
    """What a policy may know about one request at a scheduling point.

    Token accounting follows vLLM v1 (``vllm/v1/core/sched/scheduler.py``): a request's sequence
    is its prompt followed by the tokens generated so far; ``computed_tokens`` of them have KV. Each
    step runs some of the ``pending_tokens``; when none are left the step samples one new token.
    A fresh request starts with ``computed_tokens == cached_tokens``; a recompute preemption sets it
    back to 0, so on resume the prompt *and* the tokens generated so far are prefilled again::

        | <----------- prompt_tokens -----------> | <- generated_tokens -> |
        | <---------- computed_tokens ----------> | <- pending_tokens ---> |
        | < cached_tokens > |

    Attributes:
        request_id: engine-unique id.
        arrival_s: arrival instant on the engine clock, in s.
        prompt_tokens: prompt length in tokens.
        max_output_tokens: the request's declared output cap (``max_tokens``); the true output
            length is never shown to a policy (only the ``oracle`` policy gets it, separately).
        slo: the request's SLO class.
        computed_tokens: tokens of the sequence whose KV exists (cached prefix included).
        cached_tokens: prompt tokens served from a prefix cache at admission.
        prefix_hit_tokens: for a waiting request, prompt tokens the engine's prefix cache holds
            right now (the longest cached prefix; what SGLang's ``lpm`` sorts by); 0 without a
            prefix cache.
        generated_tokens: output tokens produced so far.
        first_token_s: instant of the first output token, or ``None`` before it.
        num_preemptions: times this request has been preempted.
        tier: scheduling tier last assigned by the policy (``ScheduleDecision.tiers``), 0 before.
        kv_precision: precision its KV is stored in.
        kv_location: where its KV lives.
        kv_blocks: KV blocks in its block table (in HBM or CPU, per ``kv_location``), shared
            prefix-cache blocks included.
        shared_kv_blocks: of ``kv_blocks``, those owned by the prefix cache (shared with other
            requests); preempting the request does not free them.
        replica: index of the engine replica whose queues hold it (0 for a single engine); set
            before ``superinfer_request_arrived`` so a policy serving several replicas can keep
            per-replica queues without scanning every state.
        prompt_chunk_keys: content keys of the prompt's whole chunks, the same keys as the
            :attr:`PrefixNodeView.chunk_keys` of the nodes that hold that prompt once cached, so
            a placement policy can replay what requests read (``adaptive``, ``hazard``); given
            at ``superinfer_request_arrived`` by SGLang's adapter when a plugin that reads them
            is on (its class sets ``reads_prompt_keys``) and by our simulator when the workload
            has block hashes (a key per hashed block), else ``()``.
    """

    request_id: str
    arrival_s: float
    prompt_tokens: int
    max_output_tokens: int
    slo: SLO
    computed_tokens: int = 0
    cached_tokens: int = 0
    prefix_hit_tokens: int = 0
    generated_tokens: int = 0
    first_token_s: float | None = None
    num_preemptions: int = 0
    tier: int = 0
    kv_precision: KVPrecision = KVPrecision.FP16
    kv_location: KVLocation = KVLocation.UNALLOCATED
    kv_blocks: int = 0
    shared_kv_blocks: int = 0
    replica: int = 0
    prompt_chunk_keys: tuple[str, ...] = ()

    @property
    def own_kv_blocks(self) -> int:
        """Blocks that only this request holds: what preempting it frees."""
        return self.kv_blocks - self.shared_kv_blocks

    @property
    def num_tokens(self) -> int:
        """Length of the sequence so far: prompt plus generated tokens."""
        return self.prompt_tokens + self.generated_tokens

    @property
    def pending_tokens(self) -> int:
        """Tokens to run before the next output token (>= 1 while the request is live)."""
        return self.prompt_tokens + self.generated_tokens - self.computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """True while more than the last sampled token lacks KV (a prefill or a recompute)."""
        return self.pending_tokens > 1 or self.generated_tokens == 0


class Queue(str, enum.Enum):
    """The queue of a replica that holds a request (``StepState.waiting`` / ``running`` /
    ``swapped``)."""

    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"


@dataclass(frozen=True, slots=True)
class QueueChanges:
    """How one queue of a replica differs from the previous state of the same series.

    Sets of request ids, without order (a policy that needs one sorts them); a request that moved
    between queues is in ``left`` of one and ``arrived`` of the other.

    A *decode advance* is the change of a request that was decoding (``generated_tokens > 0``
    and ``pending_tokens == 1``) and only ran decode steps since: ``computed_tokens`` and
    ``generated_tokens`` both grew by the same ``d >= 0``, ``kv_blocks`` did not shrink, and every
    other field is equal (``policy_core.changes.decode_advance``). Every running request's view
    changes at every decode step, so ``irregular`` lets a policy look only at the views whose
    change it cannot predict, and bound the rest by ``max_advance``.

    Attributes:
        arrived: in this queue now, not in it at the previous state.
        left: in this queue at the previous state, not now.
        changed: in this queue at both, with views that differ (``!=``: any field).
        irregular: of ``changed``, the ids whose change is not a decode advance.
        min_advance: the smallest ``d`` of the decode advances in ``changed`` (0 if none).
        max_advance: the largest ``d`` of the decode advances in ``changed`` (0 if none): no
            request of ``changed - irregular`` gained more tokens than this. When both are equal
            and ``changed - irregular`` holds every request that was decoding at both states,
            every such request ran exactly ``max_advance`` decode steps (the running pass of
            ``superinfer`` then advances one clock instead of visiting each).
    """

    arrived: frozenset[str] = frozenset()
    left: frozenset[str] = frozenset()
    changed: frozenset[str] = frozenset()
    irregular: frozenset[str] = frozenset()
    min_advance: int = 0
    max_advance: int = 0


@dataclass(frozen=True, slots=True)
class StepChanges:
    """What changed in a replica's queues since the previous ``StepState`` of its series.

    An engine numbers the full states it shows a policy, per replica, in one *series*
    (``series`` is unique in the process; ``seq`` counts 1, 2, ... and ``base_seq`` is the state
    the change set is relative to, ``seq - 1``; 0 means empty queues). A policy that remembers the
    ``(series, seq)`` it last saw uses the change set only when ``(series, base_seq)`` equals it;
    otherwise (a state it did not see, another engine, a new run) it resynchronizes from the
    queues. Built by :class:`superinfer.policy_core.changes.ViewTracker`.

    Attributes:
        series: id of the engine-side series (one per replica of one engine object).
        seq: this state's number in the series (>= 1).
        base_seq: the number of the state the changes are relative to (``seq - 1``).
        waiting: changes of ``StepState.waiting``.
        running: changes of ``StepState.running``.
        swapped: changes of ``StepState.swapped``.
    """

    series: int
    seq: int
    base_seq: int
    waiting: QueueChanges = QueueChanges()
    running: QueueChanges = QueueChanges()
    swapped: QueueChanges = QueueChanges()

    def of(self, queue: Queue) -> QueueChanges:
        """The changes of ``queue``."""
        if queue is Queue.WAITING:
            return self.waiting
        return self.running if queue is Queue.RUNNING else self.swapped


class KVPages(Protocol):
    """How an engine pages a quantized request's KV (``StepState.kv_packing``); implemented by
    ``policy_core.kv_bytes.KVPacking``."""

    def blocks(self, num_tokens: int, precision: KVPrecision) -> int:
        """Pages ``num_tokens`` tokens of KV at ``precision`` fill."""
        ...

    def tokens_that_fit(self, num_tokens: int, precision: KVPrecision, blocks: int) -> int:
        """Tokens a sequence of ``num_tokens`` tokens can surely add within ``blocks`` pages."""
        ...


@dataclass(frozen=True, slots=True)
class StepState:
    """Everything a scheduling policy sees at one scheduling point of one engine replica.

    The queues are full snapshots (tuples of frozen views). An engine may also hand over its own
    id -> view map and what changed since its previous state, so that a policy keeps its orders
    incrementally instead of rescanning queues that did not change. Invariants, when present:

    * ``views == {v.request_id: v for v in (*waiting, *running, *swapped)}`` and ``queue_of``
      maps the same ids to their queue (a request is in one queue only);
    * ``changes`` is exactly the difference of this state's queues and those of the state
      ``(changes.series, changes.base_seq)``: per queue, ``arrived`` = ids now minus ids then,
      ``left`` = ids then minus ids now, ``changed`` = ids in both whose views are unequal,
      ``irregular`` = the ids of ``changed`` whose change is not a decode advance (see
      ``QueueChanges``), and ``min_advance`` / ``max_advance`` = the fewest / most tokens a
      decode advance in ``changed`` added (0 if none); so a request in none of ``arrived`` /
      ``irregular`` of its queue has the previous state's view, or that view advanced by at
      most ``max_advance`` decode tokens;
    * a state that shows only part of the queues (a probe of one request, a retraction point
      without the waiting queue) has ``changes = None`` and does not advance the series.

    All three are optional (``None``): an engine that does not supply them still works with every
    policy, and a policy that ignores them still works with every engine. ``changes = None`` means
    "unknown": the policy must treat every request as possibly changed.

    Attributes:
        now_s: current instant on the engine clock, in s.
        step_index: logical step counter of this replica (identical on every TP rank).
        waiting: requests queued without KV in HBM (new, or preempted by recompute), arrival order.
        running: requests holding KV in HBM, in the order they were admitted.
        swapped: requests whose KV is in CPU memory (swap preemption), swap-out order.
        free_hbm_blocks: KV blocks in HBM a policy may count on: free, plus cached prefix blocks
            nobody uses (the engine evicts them on demand), minus what the engine holds back for
            running requests under its admission rule.
        total_hbm_blocks: KV blocks in HBM.
        free_cpu_blocks: free KV blocks in CPU memory (0 when there is no CPU tier).
        total_cpu_blocks: KV blocks in CPU memory.
        block_size_tokens: tokens per KV block (page size).
        token_budget: most tokens (prefill + decode) one step may run (``max_num_batched_tokens``).
        max_num_seqs: most requests one step may run.
        reserved_hbm_blocks: of ``free_hbm_blocks``, blocks the engine holds back for running
            requests' future tokens (``RESERVE_RATIO``); admissions must leave them free.
        admission: how the engine charges KV for admitting a request (see ``AdmissionRule``).
        kv_block_bytes: bytes of one KV block across the replica's GPUs (FP16), for cost models.
        link_bytes_per_s: HBM<->CPU copy bandwidth per direction for swap and prefetch, bytes/s
            (0 without a CPU tier).
        replica: index of the replica this state describes (0 for a single engine); one policy
            object may serve every replica of a cluster.
        mixed_batches: a step may run prefill chunks beside decodes. ``False``: a step that runs
            any prefill runs only prefill, and the running decodes wait for the next step, so a
            prefill step delays every decode by its whole duration (SGLang 0.5.23 without
            ``--enable-mixed-chunk``: ``Scheduler.get_next_batch_to_run`` runs a new prefill
            batch before the running decode batch; ``Scheduler.is_mixed_chunk``).
        reserve_whole_prompt: under ``RESERVE_RATIO``, an admission must find room for its whole
            remaining prompt (its later prefill chunks too) besides its output cap, and
            ``reserved_hbm_blocks`` holds the prompt still to prefill of running requests whole
            (SGLang 0.5.23 ``PrefillAdder.add_one_req``: ``extend_input_len +
            max_new_tokens``; ``add_chunked_req`` takes a continuing chunk before any
            admission). ``False``: only this step's chunk is charged.
        prefill_runs_whole: an admitted request's prompt runs to its end in the steps that
            follow, one chunk of the step budget each, before any other admission and without
            the policy (SGLang 0.5.23: ``PrefillAdder.add_chunked_req`` takes the chunked
            request's next chunk first in ``Scheduler._get_new_batch_prefill_raw``; the request
            is out of the running batch until its last chunk, ``get_next_batch_to_run``
            excludes it). A chat arriving then waits for every such chunk ahead of it.
        finish_aware_admission: under ``RESERVE_RATIO``, admissions follow SGLang 0.3.1's rule
            for ``ignore_eos`` requests with the radix cache disabled instead of the
            ``reserved_hbm_blocks`` check: a request is admitted if, with every running and
            admitted request decoding to its output cap and freeing its KV as it finishes,
            the pool never runs dry (:func:`policy_core.batching.finish_aware_fits`), while
            the reserve-ratio budget, checked before each request, is not spent
            (:class:`policy_core.batching.FinishAwareAdder`, which names its SGLang 0.3
            sources).
        views: request id -> view of every request in the three queues, or ``None``.
        queue_of: request id -> the queue holding it (the same ids as ``views``), or ``None``.
        changes: what changed since the previous state of the engine's series, or ``None``.
        kv_packing: how the engine packs a quantized request's KV into its pages
            (:class:`KVPages`, e.g. ``policy_core.kv_bytes.KVPacking``), or ``None``: every
            request's KV fills FP16
            pages (``ceil(tokens / block_size_tokens)``) whatever its ``kv_precision``.
    """

    now_s: float
    step_index: int
    waiting: tuple[RequestView, ...]
    running: tuple[RequestView, ...]
    swapped: tuple[RequestView, ...]
    free_hbm_blocks: int
    total_hbm_blocks: int
    free_cpu_blocks: int
    total_cpu_blocks: int
    block_size_tokens: int
    token_budget: int
    max_num_seqs: int
    reserved_hbm_blocks: int = 0
    admission: AdmissionRule = AdmissionRule.CHUNK
    kv_block_bytes: int = 0
    link_bytes_per_s: float = 0.0
    replica: int = 0
    views: Mapping[str, RequestView] | None = None
    queue_of: Mapping[str, Queue] | None = None
    changes: StepChanges | None = None
    mixed_batches: bool = True
    kv_packing: KVPages | None = None
    reserve_whole_prompt: bool = False
    finish_aware_admission: bool = False
    prefill_runs_whole: bool = False

    def view_map(self) -> Mapping[str, RequestView]:
        """``views``, or the same map built from the queues (one pass) when the engine gave none."""
        if self.views is not None:
            return self.views
        return {v.request_id: v for q in (self.waiting, self.running, self.swapped) for v in q}


@dataclass(frozen=True, slots=True)
class ScheduleDecision:
    """A policy's decision for one step; data only, applied by the engine.

    The engine applies it in this order: ``reject``, ``preempt``, ``resume``, ``admit``, then runs
    ``num_tokens``. Every id must be one the state showed, in the right queue, and in at most one of
    ``reject`` / ``preempt`` / ``resume`` / ``admit``. The engine raises ``PolicyError`` otherwise,
    or when the step would exceed the token budget, ``max_num_seqs`` or the free KV blocks.

    Attributes:
        num_tokens: request id -> tokens to run this step (a prefill chunk, or 1 for a decode),
            each > 0. Only requests that are running after admit/resume/preempt; sum <=
            ``token_budget``.
        admit: waiting request ids to move to running (allocating their KV), in this order.
        resume: swapped request ids to swap back in and run.
        preempt: running request id -> how it gives its KV back.
        reject: request id (waiting or swapped) -> reason; the request ends, counted as rejected.
        prefetch: swapped request ids whose KV should start moving back to HBM ahead of a resume.
        tiers: request id -> scheduling tier to record on the request (``RequestView.tier``).
        max_repeat_steps: the engine may repeat this decision's decode part for up to this many
            consecutive steps without asking again (vLLM's multi-step scheduling), stopping early at
            the first arrival, finish or KV shortage. Only honoured when every scheduled request
            decodes one token and nothing is admitted, resumed, preempted or rejected.
    """

    num_tokens: Mapping[str, int] = field(default_factory=dict)
    admit: tuple[str, ...] = ()
    resume: tuple[str, ...] = ()
    preempt: Mapping[str, PreemptMode] = field(default_factory=dict)
    reject: Mapping[str, str] = field(default_factory=dict)
    prefetch: tuple[str, ...] = ()
    tiers: Mapping[str, int] = field(default_factory=dict)
    max_repeat_steps: int = 1

    def __post_init__(self) -> None:
        # O(1) here: ``num_tokens`` values are checked (each > 0) by the engine's
        # ``validation.check_decision``, in the pass over ``num_tokens`` it makes anyway; a
        # ``min()`` over them here was one pass per call of every policy (its removal: -4.1 %
        # instructions per ``superinfer`` call at 256 running, results/benchmarks/README.md).
        if self.max_repeat_steps < 1:
            raise ValueError(f"max_repeat_steps must be >= 1, got {self.max_repeat_steps}")

    @property
    def total_tokens(self) -> int:
        """Tokens this step runs."""
        return sum(self.num_tokens.values())


@dataclass(frozen=True, slots=True)
class PrefixNodeView:
    """One cached prefix node (a radix-tree node or a hashed KV block chain) as a policy sees it.

    Attributes:
        node_id: engine-unique id of the node.
        parent_id: id of the parent node, ``None`` for a child of the root.
        num_tokens: tokens whose KV this node holds.
        num_blocks: KV blocks it holds.
        location: HBM or CPU.
        hit_count: times a request's prefix matched through this node.
        last_access_s: instant of the last match or insert, in s.
        in_use: True while a running request references it (it must not be dropped or
            offloaded).
        depth: nodes between the root and this node (0 for a child of the root); for a hashed
            block cache, the block's index in the prompt.
        slo_classes: names of the SLO classes of the requests that inserted or matched it.
        num_waiting_refs: queued requests (waiting or swapped, not running) whose prompt's
            cached prefix runs through this node; the engine counts at least those the
            scheduler is about to run (admitted next, promoted, or named in
            ``ScheduleDecision.prefetch``). A policy keeps such nodes and prefetches them from CPU.
        content_key: a key of the node's content (its tokens from the root to its end) that a
            re-inserted copy of the same prefix gets again, for engines whose node ids are not
            (SGLang's radix nodes take a fresh counter id on every insert; our simulator's node
            ids are block hashes, which it gives again here); ``None``: the node id names the
            content. Policies key their access history on :attr:`key`.
        chunk_keys: content keys of the whole fixed-size chunks that end in the node (the path
            hash at every multiple of the engine's chunk size, counted in tokens from the root,
            that falls in the node), first first; they do not change when the engine splits the
            node, so a policy that compares what several caches would hold (``adaptive``) can
            count a hit on part of a node, and every key stands for the same number of tokens
            (a partial chunk at the node's end is left out: it is the start of the chunk its
            child ends). Used only with a ``content_key``: ``()`` then means no chunk ends in
            the node; without one, the node is one chunk (a hashed KV block).
    """

    node_id: str
    parent_id: str | None
    num_tokens: int
    num_blocks: int
    location: KVLocation
    hit_count: int
    last_access_s: float
    in_use: bool
    depth: int = 0
    slo_classes: tuple[str, ...] = ()
    num_waiting_refs: int = 0
    content_key: str | None = None
    chunk_keys: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """The key a policy remembers this node's history by: ``content_key``, else ``node_id``."""
        return self.node_id if self.content_key is None else self.content_key

    @property
    def chunks(self) -> tuple[str, ...]:
        """The keys of the node's whole chunks, first first: ``chunk_keys`` with a
        ``content_key``, else the node as one chunk (``(node_id,)``, a hashed KV block)."""
        return (self.node_id,) if self.content_key is None else self.chunk_keys


@dataclass(frozen=True, slots=True)
class PlacementDecision:
    """Pin / keep / offload / drop per prefix node, and CPU nodes to load back.

    Nodes not named in ``actions`` are ``KEEP``. The pin set of a decision replaces the previous
    one: a node pinned before and not named ``PIN`` now is unpinned.

    Attributes:
        actions: node id -> placement.
        prefetch: ids of CPU nodes to copy back to HBM ahead of their use, parents before
            children (``policy_core.validation.check_placement`` lists every rule).
    """

    actions: Mapping[str, Placement] = field(default_factory=dict)
    prefetch: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StepStats:
    """What one engine step did, reported after it ran (for learning and metrics).

    Attributes:
        now_s: instant the step ended, in s.
        step_index: logical step counter of the replica.
        duration_s: wall (or simulated) time of the step, in s; for a repeated decision, all steps.
        num_steps: steps this report covers (> 1 for a repeated decision).
        num_prefill_tokens: prefill tokens run.
        num_decode_tokens: decode tokens run.
        num_running: requests that ran.
        num_waiting: requests waiting after the step.
        used_hbm_blocks: KV blocks in use in HBM after the step.
        total_hbm_blocks: KV blocks in HBM.
        finished_ids: ids of requests that finished in this step.
    """

    now_s: float
    step_index: int
    duration_s: float
    num_steps: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int
    used_hbm_blocks: int
    total_hbm_blocks: int
    finished_ids: tuple[str, ...] = ()
