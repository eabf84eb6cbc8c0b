"""What the ``superinfer`` policy remembers: one record per live request, per-replica queues
(waiting and swapped heaps per tier, the aged and due heaps, the stride passes), the running
books (``running.py``), the step's decodes and the decision being built for one call (the due
heap's class is in ``due_queue.py``). Data only; the classes that use them are the other modules
here."""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left, insort
from collections.abc import Container, Iterator

from superinfer.policy_core.batching import view_blocks
from superinfer.policy_core.policies.superinfer.due_queue import _DueQueue
from superinfer.policy_core.types import KVPages, KVPrecision, PreemptMode, RequestView, StepState

_FP16 = KVPrecision.FP16
_WAITING, _RUNNING, _SWAPPED, _GONE = 0, 1, 2, 3
_INF = math.inf


def _decode_blocks(v: RequestView, state: StepState) -> int:
    """HBM blocks a running request's next decode token takes, as ``step_blocks(v, 1, state,
    admit=False)`` counts them (the engines' decision check) but not clipped at 0: the pages its
    tokens fill (at its precision where the engine packs quantized KV) minus the blocks it
    holds."""
    if v.kv_precision is _FP16 or state.kv_packing is None:
        return -(-(v.computed_tokens + 1) // state.block_size_tokens) - v.kv_blocks
    return view_blocks(v, v.computed_tokens + 1, state) - v.kv_blocks


#: What ``stats()`` counts, each from 0 (``ttft_boosts``: steps whose prefill allowance the TTFT
#: boost grew).
_COUNTER_NAMES = (
    "saw_cpu_tier", "swap_out_bytes", "swap_in_bytes", "prefetch_bytes", "promotions",
    "demotions", "best_effort", "aged", "rejected", "first_token_trims", "decodes_yielded",
    "hopeless_kept", "fcfs_aged", "ttft_boosts", "held_seats", "held_kv", "held_seat_reserve",
    "held_kv_reserve", "held_serial_prefill",
)  # fmt: skip

#: In-tier key offset that puts best-effort requests behind every feasible one (keys are instants,
#: s; 1e9 s is beyond any trace).
_BEST_EFFORT_KEY = 1e9


class _Entry:
    """What the policy remembers about one live request."""

    __slots__ = (
        "rid",
        "slo_name",
        "weight",
        "arrival_s",
        "ttft_s",
        "tpot_s",
        "deadline_s",
        "replica",
        "where",
        "view",
        "stale",
        "tier",
        "reported_tier",
        "version",
        "check_version",
        "key",
        "queued_s",
        "lost_tokens",
        "demote_at",
        "resident_service",
        "best_effort",
        "aged",
        "next_check_s",
        "fcfs_tokens",
    )

    def __init__(self, view: RequestView) -> None:
        slo = view.slo
        self.rid = view.request_id
        self.slo_name = slo.name
        self.weight = slo.weight
        self.arrival_s = view.arrival_s
        self.ttft_s = None if slo.ttft_ms is None else slo.ttft_ms / 1e3
        self.tpot_s = None if slo.tpot_ms is None else slo.tpot_ms / 1e3
        self.deadline_s = None if slo.deadline_s is None else view.arrival_s + slo.deadline_s
        self.replica = view.replica
        self.where = _WAITING
        self.view = view
        self.stale = False
        self.tier = 0
        self.reported_tier = view.tier
        self.version = 0
        self.check_version = 0
        self.key = 0.0
        self.queued_s = view.arrival_s
        self.lost_tokens = 0
        self.demote_at: float = _INF
        self.resident_service = 0
        self.best_effort = False
        self.aged = False
        self.next_check_s = _INF
        self.fcfs_tokens = 0  # its prompt tokens until it leaves the queue (fcfs guard)


class _Replica:
    """Per-replica queues: waiting and swapped heaps per tier, aged and due heaps."""

    def __init__(self, index: int, num_tiers: int) -> None:
        self.index = index
        self.waiting: dict[str, _Entry] = {}
        self.swapped: dict[str, _Entry] = {}
        self.heaps: list[list[tuple[float, int, str, int]]] = [[] for _ in range(num_tiers)]
        self.swap_heaps: list[list[tuple[float, int, str, int]]] = [[] for _ in range(num_tiers)]
        self.shed_heaps: list[list[tuple[int, float, float, int, str, int]]] = [
            [] for _ in range(num_tiers)
        ]
        self.count = [0] * num_tiers  # waiting (not aged) per tier
        self.feasible = [0] * num_tiers  # waiting, neither aged nor best effort, per tier
        self.aged: list[tuple[float, int, str, int]] = []
        self.due = _DueQueue()
        self.passes = [0.0] * num_tiers
        self.active = [False] * num_tiers
        self.num_stale = 0
        self.prefill_chunk_tokens = 0.0  # last step's prefill allowance (for estimates)
        self.num_decodes = 0
        self.next_running_check_s = _INF
        self.run_due: list[tuple[float, str, int]] = []  # running checks: (when, id, version)
        self.unreported: list[_Entry] = []  # new entries whose tier the engine has not seen
        self.token_budget = 1 << 30  # the replica's step token budget, once a state showed it
        self.books = _RunBooks(num_tiers)  # the running set as last seen (running.py)
        # fcfs guard: prompt tokens of every request that arrived, and of those gone (prefilled,
        # found cached, or of a request rejected or ended); (arrived before it, seq, id) per
        # request without a TTFT target
        self.fcfs_arrived = 0
        self.fcfs_left = 0
        self.fcfs_due: list[tuple[int, int, str]] = []


class _RunBooks:
    """One replica's running set as of the last state the policy saw (see the module doc)."""

    def __init__(self, num_tiers: int) -> None:
        self.at: tuple[int, int] | None = None  # (series, seq) of that state
        self.order: dict[str, int] = {}  # id -> position, increasing along state.running
        self.ver: dict[str, int] = {}  # id -> version of its bucket and TPOT items
        self.tier: dict[str, int] = {}  # id -> the tier it is counted in
        # running requests that are not decoding: id -> its item in ``lanes``
        self.prefilling: dict[str, _LaneItem] = {}
        # per tier (the one counted in), its prefilling requests in the order the prefill
        # rotation serves them: (key, position, id), sorted (``_Lane``)
        self.lanes: list[list[_LaneItem]] = [[] for _ in range(num_tiers)]
        # the same for the ones awaiting a first token with a TTFT target, not best effort
        self.ttft_lanes: list[list[_LaneItem]] = [[] for _ in range(num_tiers)]
        self.in_ttft: set[str] = set()  # the ids filed in ``ttft_lanes``
        self.run_count = [0] * num_tiers  # running requests per tier
        self.dec_count = [0] * num_tiers  # decodes per tier
        # the decodes' ids in ``state.running`` order, each mapped to 1 (their ``num_tokens``),
        # kept as decodes leave or join near the tail (the ids behind one taken off and put
        # back); ``None`` once one joined further in (rebuilt on use from ``order``), compacted
        # once its deletions (``dec_holes``) pass half its size
        self.dec_map: dict[str, int] | None = {}
        self.dec_holes = 0
        self.clock = 0  # decode tokens every lockstep decode has run since the rebuild
        self.buckets: dict[int, list[tuple[str, int]]] = {}  # clock -> (id, version) to look at
        # decodes needing a KV block at their last look (also in their next bucket): (id, version)
        self.hot: list[tuple[str, int]] = []
        self.tpot: dict[float, _TpotHeap] = {}  # planned TPOT (s) -> its decodes' keys
        self.tkey: dict[str, set[str]] = {}  # id -> the members set of its TPOT heap key
        self.last_out: tuple[str, ...] = ()  # ids the last decision preempted
        self.gone: list[str] = []  # ids in ``order`` whose entry a hook forgot since
        self.bs = 16  # the state's block size, tokens
        self.packing: KVPages | None = None  # the state's kv_packing
        self.growers: list[tuple[int, _Entry, int]] = []  # (position, entry, blocks) this call
        self.need = 0  # the KV blocks of ``growers``, summed
        # decodes holding exactly the pages of their tokens (no packing), each in the class of
        # ``(computed_tokens - clock) % bs`` (``res``: id -> class), whose members all need a
        # page at the clocks where that is ``-clock % bs`` (``classes``: class -> {id: 1}, the
        # due class is the step's one-page growth as is); and when each is looked at next,
        # (clock, id, version: ``ver`` while it stays filed there), a heap
        self.res: dict[str, int] = {}
        self.classes: dict[int, dict[str, int]] = {}
        self.unit_due: list[tuple[int, str, int]] = []
        self.positions = itertools.count()


class _TpotHeap:
    """Decodes of one planned TPOT (the target times ``tpot_plan_share``) keyed by
    ``(first_token_s + tpot * g, first_token_s, g)`` with ``g = generated_tokens - clock``; ids
    with one key share one heap item."""

    __slots__ = ("heap", "members")

    def __init__(self) -> None:
        self.heap: list[tuple[float, float, int]] = []
        self.members: dict[tuple[float, int], set[str]] = {}


class _Decodes:
    """The step's decodes in ``state.running`` order: ids (each mapped to 1, its ``num_tokens``),
    per-tier counts, and the ones whose next token needs a KV block; iterating yields their
    entries with this state's views."""

    __slots__ = ("ids", "per_tier", "growers", "unit", "_n", "_entries", "_state", "_list")

    def __init__(self, ids: dict[str, int], per_tier: list[int],
                 growers: list[tuple[int, _Entry, int]], entries: dict[str, _Entry],
                 state: StepState, unit: dict[str, int]) -> None:  # fmt: skip
        #: the running books' own map (``_RunBooks.dec_map``): read, never written, by the call
        self.ids: dict[str, int] = ids
        self.per_tier: list[int] = per_tier
        #: ``(position, entry, blocks)`` of the decodes whose next token needs KV blocks, in
        #: the order they were looked at (they only set ``_Step.new_blocks``, a map)
        self.growers: list[tuple[int, _Entry, int]] = growers
        #: the decodes that need one page each at this step besides ``growers``, each mapped to
        #: 1 (the class of ``_RunBooks.classes`` due at this clock: the running books' own map,
        #: unchanged during the call)
        self.unit: dict[str, int] = unit
        self._n = len(ids)
        self._entries: dict[str, _Entry] = entries
        self._state: StepState = state
        self._list: list[_Entry] | None = None

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[_Entry]:
        if self._list is None:
            get, views = self._entries.__getitem__, self._state.view_map()
            self._list = [get(rid) for rid in self.ids]
            for e in self._list:
                e.view = views[e.rid]
        return iter(self._list)


#: A running prefill in its tier's lane: ``(_Entry.key, position in state.running, id)``.
_LaneItem = tuple[float, int, str]


def _awaits_first_token(e: _Entry) -> bool:
    """A TTFT-class request still within its target's reach and before its first token."""
    return e.ttft_s is not None and not e.best_effort and e.view.first_token_s is None


def _file_prefill(books: _RunBooks, e: _Entry, t: int) -> None:
    """Put running ``e`` in tier ``t``'s lanes. Its key does not change while it runs (the key
    is set when a request is queued: ``_Queues._enqueue``), nor does it start or stop awaiting
    its first token while it prefills without a visit (a prefill that ran is an irregular
    change, a running request turns best effort only in a visit)."""
    item = books.prefilling[e.rid] = (e.key, books.order[e.rid], e.rid)
    insort(books.lanes[t], item)
    if _awaits_first_token(e):
        insort(books.ttft_lanes[t], item)
        books.in_ttft.add(e.rid)


def _filed_as_before(books: _RunBooks, e: _Entry, t: int) -> bool:
    """Whether running prefill ``e``, counted in tier ``t`` and still prefilling there, would be
    filed where it is: its lane item (key, position, id) and its TTFT-lane membership are the
    ones it has (then a visit leaves its lanes alone instead of taking it out and back in)."""
    item = books.prefilling.get(e.rid)
    return (
        item is not None
        and books.tier.get(e.rid) == t
        and item[0] == e.key
        and (e.rid in books.in_ttft) == _awaits_first_token(e)
    )


def _unfile_prefill(books: _RunBooks, rid: str, t: int) -> None:
    books.in_ttft.discard(rid)
    item = books.prefilling.pop(rid)
    for lane in (books.lanes[t], books.ttft_lanes[t]):
        i = bisect_left(lane, item)
        if i < len(lane) and lane[i] == item:
            del lane[i]


class _Lane:
    """One tier's running prefills for one call, in urgency order (``key``, then
    ``state.running`` order, as a stable sort by key would give): the books' lane read from the
    front, with the requests admitted mid-prefill in this call pushed ahead of it. Requests
    preempted before the call's rotation began are skipped; ones preempted during it stay
    until the rotation pops them (``_Rotation._allocate_prefill``)."""

    __slots__ = ("_items", "_i", "_front", "_entries", "_skip")

    def __init__(
        self, items: list[_LaneItem], entries: dict[str, _Entry], skip: Container[str]
    ) -> None:
        self._items, self._i = items, 0
        self._front: list[_Entry] = []
        self._entries, self._skip = entries, skip

    def head(self) -> _Entry | None:
        """The first request, or ``None`` when the lane is empty."""
        if self._front:
            return self._front[-1]
        items, skip = self._items, self._skip
        while self._i < len(items):
            rid = items[self._i][2]
            if rid not in skip:
                return self._entries[rid]
            self._i += 1
        return None

    def pop(self) -> None:
        """Drop the first request (``head()`` must have returned it)."""
        if self._front:
            self._front.pop()
        else:
            self._i += 1

    def push(self, e: _Entry) -> None:
        """Put ``e`` first (a request admitted mid-prefill keeps the next turn)."""
        self._front.append(e)


class _Step:
    """The decision being built for one call (mutable scratch): the state, the free HBM blocks,
    token budget, seats, free CPU blocks and link bytes each way still unspent; the decision's
    parts as they grow; the entries whose tier changed; the waiting/swapped index of the
    state, built on the first admission attempt without the engine's map; the worst tier
    among running requests (nothing to preempt below it); the ids given prefill tokens, in
    the order they were first given some (``prefills``: a request preempted later in the call
    stays listed, with no ``tokens`` entry)."""

    __slots__ = (
        "state", "free", "budget", "seats", "free_cpu", "swap_out_bytes", "swap_in_bytes",
        "tokens", "new_blocks", "admit", "resume", "preempt", "reject", "prefetch", "changed",
        "queued_views", "worst_tier", "prefills", "whole_prefill", "no_ttft_left", "tightest_s",
        "held",
    )  # fmt: skip

    def __init__(
        self,
        state: StepState,
        free: int,
        budget: int,
        seats: int,
        free_cpu: int,
        swap_out_bytes: float,
        swap_in_bytes: float,
    ) -> None:
        self.state = state
        self.free = free
        self.budget = budget
        self.seats = seats
        self.free_cpu = free_cpu
        self.swap_out_bytes, self.swap_in_bytes = swap_out_bytes, swap_in_bytes
        self.tokens: dict[str, int] = {}
        self.new_blocks: dict[str, int] = {}
        self.admit: list[str] = []
        self.resume: list[str] = []
        self.preempt: dict[str, PreemptMode] = {}
        self.reject: dict[str, str] = {}
        self.prefetch: list[str] = []
        self.changed: list[_Entry] = []
        self.queued_views: dict[str, RequestView] | None = None
        self.worst_tier = -1
        self.prefills: dict[str, None] = {}
        self.whole_prefill: bool | None = None  # a batch prompt in prefill (admission.py)
        self.no_ttft_left: int | None = None  # tokens without a TTFT target may take (reserve)
        self.tightest_s = _INF  # the running decodes' smallest planned TPOT (budget.py)
        self.held: set[str] = set()  # the held_* counters a queued request hit (admission.py)
