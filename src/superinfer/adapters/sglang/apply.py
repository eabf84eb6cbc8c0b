"""Decisions -> SGLang calls: queue order, tiers as SGLang priorities, preemption victims, decode
retraction order, and the radix tree's pins and eviction order.

Every function here carries out a decision already made by a policy; none of them chooses.
The SGLang mechanics they reuse are those of sglang 0.5.23 (file and function named at each).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping, Sequence
from http import HTTPStatus
from typing import Any

from sglang.srt.mem_cache.evict_policy import EvictionStrategy

from superinfer.adapters.sglang.view import RequestRecord
from superinfer.policy_core.types import (
    KVLocation,
    Placement,
    PlacementDecision,
    PrefixNodeView,
    ScheduleDecision,
)

__all__ = [
    "register_eviction_policy",
    "EVICTION_POLICY_NAME",
    "Band",
    "PlacementBook",
    "SchedulerPort",
    "SuperinferEvictionStrategy",
    "eviction_priority",
    "order_waiting_queue",
    "release_victims",
    "retraction_order",
    "sglang_priority",
]

logger = logging.getLogger(__name__)

#: ``--radix-eviction-policy`` value of :class:`SuperinferEvictionStrategy` (Python tree core only).
EVICTION_POLICY_NAME = "superinfer"


def sglang_priority(rank: int, *, low_values_first: bool) -> int:
    """SGLang ``Req.priority`` for a request of importance ``rank`` (0 most urgent).

    SGLang ranks larger values first unless ``--schedule-low-priority-values-first``
    (``managers/schedule_policy.py::_sort_by_priority_and_fcfs``); its queue-full abort
    (``Scheduler._abort_on_queued_limit``) and ``--retraction-policy priority`` read the same
    field, so they then agree with the policy's tiers.
    """
    return rank if low_values_first else -rank


def eviction_priority(rank: int) -> int:
    """Radix-node priority for KV inserted by a request of importance ``rank``.

    ``PriorityStrategy`` evicts the lowest value first whatever the scheduling direction
    (``mem_cache/evict_policy.py``), and a node keeps the largest priority inserted through it, so
    the KV of urgent tiers outlives that of the others.
    """
    return -rank


def order_waiting_queue(
    queue: list[Any], decision: ScheduleDecision, records: Mapping[str, RequestRecord]
) -> None:
    """Sort SGLang's waiting queue in place: the decision's admissions first, in its order, then
    the rest in arrival order (``PrefillAdder`` admits in queue order)."""
    position = {rid: i for i, rid in enumerate(decision.admit)}
    last = len(position)
    queue.sort(key=lambda r: (position.get(r.rid, last), records[r.rid].seq))


def release_victims(adder: Any, victims: Sequence[Any]) -> None:
    """Preempt ``victims`` (running ``Req``s) the way SGLang's own priority preemption does.

    Mirrors the release half of ``PrefillAdder.preempt_to_schedule`` (sglang 0.5.23,
    ``managers/schedule_policy.py``): give back each victim's reserved decode tokens to the
    adder's budget, free its KV with ``ScheduleBatch.release_req`` (recompute on resume), drop it
    from the running batch, and list it in ``adder.preempt_list``, which the scheduler re-queues.
    """
    chosen = set(map(id, victims))
    batch = adder.running_batch
    keep, released = [], 0
    for i, req in enumerate(batch.reqs):
        if id(req) in chosen:
            adder.memory_budget.total_offset -= adder._get_running_request_total_token_offset(req)
            released += 1
            batch.release_req(i, len(batch.reqs) - released)
        else:
            keep.append(i)
    batch.filter_batch(keep_indices=keep)
    adder.preempt_list.extend(victims)


def retraction_order(reqs: Sequence[Any], decision: ScheduleDecision) -> list[int]:
    """Indices of ``reqs`` from most to least preferred to keep, for ``retract_decode``.

    SGLang pops from the end (``ScheduleBatch.retract_decode``): the decision's preemptions go
    last, the first it named at the very end; before them the running requests it did not schedule;
    first those it scheduled, in its order.
    """
    index = {req.rid: i for i, req in enumerate(reqs)}
    scheduled = [index[rid] for rid in decision.num_tokens if rid in index]
    victims = [index[rid] for rid in decision.preempt if rid in index]
    named = set(scheduled) | set(victims)
    rest = [i for i in range(len(reqs)) if i not in named]
    return scheduled + rest + victims[::-1]


class Band(enum.IntEnum):
    """Eviction band of a radix node: lower bands leave HBM first (then priority, then LRU)."""

    DROP = 0
    OFFLOAD = 1
    KEEP = 2
    PIN = 3


_BANDS = {
    Placement.DROP: Band.DROP,
    Placement.OFFLOAD: Band.OFFLOAD,
    Placement.KEEP: Band.KEEP,
    Placement.PIN: Band.PIN,
}


class PlacementBook:
    """Carries out ``PlacementDecision``s on a ``UnifiedRadixCache``: pins, bands, offloads.

    * ``PIN``: ``cache.lock(node_id)`` (which protects the node and its ancestors) and held until a
      later decision stops naming it; pins are taken in the decision's order while the union of
      pinned paths stays within ``budget_fraction`` of the KV pool; the rest are refused (counted).
    * ``DROP`` / ``OFFLOAD`` / ``KEEP``: the node's :class:`Band`, read by
      :class:`SuperinferEvictionStrategy`.
    * ``OFFLOAD`` with HiCache on: ``cache.backup_node_for_write_back(node_id)`` first, so the
      eviction demotes the node to host memory instead of dropping it. Without a host tier it is
      kept (counted as ``offloads_unavailable``).

    Attributes:
        budget_fraction: most of the KV pool pins may protect, in (0, 1].
        bands: node id -> band of the last decision.
        pins: node id -> the ``TreeLock`` held.
        pinned_tokens: tokens the pins protect now.
        pins_refused: pins refused for the budget (or for a node not in HBM), all decisions.
        offloads_unavailable: offloads asked without a host tier, all decisions.
    """

    def __init__(self, budget_fraction: float) -> None:
        self.budget_fraction = budget_fraction
        self.bands: dict[int, Band] = {}
        self.pins: dict[int, Any] = {}
        self.pinned_tokens = 0
        self.pins_refused = 0
        self.offloads_unavailable = 0

    def band(self, node_id: int) -> Band:
        """The node's band (``KEEP`` if the last decision did not name it)."""
        return self.bands.get(node_id, Band.KEEP)

    def apply(
        self, cache: Any, decision: PlacementDecision, views: Sequence[PrefixNodeView]
    ) -> None:
        """Carry out ``decision`` on ``cache``, whose nodes ``views`` describe."""
        by_id = {v.node_id: v for v in views}
        wanted = [nid for nid, act in decision.actions.items() if act is Placement.PIN]
        for node_id in [n for n in self.pins if str(n) not in wanted]:
            cache.unlock(self.pins.pop(node_id))
        budget = int(cache.token_to_kv_pool_allocator.size * self.budget_fraction)
        covered = self._covered({str(n) for n in self.pins}, by_id)
        for nid in wanted:
            view = by_id.get(nid)
            if int(nid) in self.pins:
                continue
            if view is None or view.location is not KVLocation.HBM:
                self.pins_refused += 1
                continue
            grown = covered | self._covered({nid}, by_id)
            if sum(by_id[n].num_tokens for n in grown) > budget:
                self.pins_refused += 1
                continue
            self.pins[int(nid)] = cache.lock(int(nid))
            covered = grown
        self.pinned_tokens = sum(by_id[n].num_tokens for n in covered)
        hicache = bool(getattr(cache.tree_core, "enable_hicache", False))
        bands = {}
        for nid, action in decision.actions.items():
            band = _BANDS[action]
            if action is Placement.OFFLOAD:
                view = by_id.get(nid)
                if not hicache:
                    self.offloads_unavailable += 1
                    band = Band.KEEP
                elif view is not None and view.location is KVLocation.HBM:
                    cache.backup_node_for_write_back(int(nid))
            bands[int(nid)] = band
        self.bands = bands

    def release_all(self, cache: Any) -> None:
        """Unlock every pin (adapter shutdown, tests)."""
        for lock in self.pins.values():
            cache.unlock(lock)
        self.pins.clear()
        self.pinned_tokens = 0

    @staticmethod
    def _covered(node_ids: set[str], by_id: Mapping[str, PrefixNodeView]) -> set[str]:
        """The nodes a lock on each of ``node_ids`` protects: the nodes and their ancestors."""
        covered: set[str] = set()
        for nid in node_ids:
            cur: str | None = nid
            while cur is not None and cur in by_id and cur not in covered:
                covered.add(cur)
                cur = by_id[cur].parent_id
        return covered


class SuperinferEvictionStrategy(EvictionStrategy):  # type: ignore[misc]  # untyped sglang
    """``--radix-eviction-policy superinfer``: evict by (node priority, band, LRU tick).

    The node priority is the one the adapter inserts from the scheduling policy's rank
    (:func:`eviction_priority`: a chat tier's KV outlives a batch tier's); within one priority the
    band of the last ``superinfer_kv_placement`` decision (:class:`PlacementBook`) orders it, so
    a placement policy decides among a class's nodes; without a decision every node is ``KEEP``
    and the order is SGLang's ``priority`` policy. Registered
    in ``mem_cache/utils.py::_EVICTION_POLICY_FACTORIES``; the Rust tree core cannot call a Python
    strategy, so it needs ``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python``.

    Args:
        book: where bands are read; a callable returning it, so that the strategy SGLang builds at
            cache construction follows the adapter installed in that process.
    """

    def __init__(self, book: Callable[[], PlacementBook | None]) -> None:
        self._book = book

    def get_priority(self, node: Any) -> tuple[int, int, float]:
        book = self._book()
        band = book.band(node.id) if book is not None else Band.KEEP
        return (node.priority, int(band), node.last_access_time)


def register_eviction_policy(book: Callable[[], Any]) -> None:
    """Make ``--radix-eviction-policy superinfer`` known to SGLang's parser and cache factory."""
    from sglang.srt.arg_groups.choices import (
        RADIX_EVICTION_POLICY_CHOICES,
        add_radix_eviction_policy_choices,
    )
    from sglang.srt.mem_cache import utils as cache_utils

    if EVICTION_POLICY_NAME not in RADIX_EVICTION_POLICY_CHOICES:
        add_radix_eviction_policy_choices([EVICTION_POLICY_NAME])
    cache_utils._EVICTION_POLICY_FACTORIES[EVICTION_POLICY_NAME] = lambda **_: (
        SuperinferEvictionStrategy(book)
    )


class SchedulerPort:
    """The plugin's ``EnginePort`` over an SGLang ``Scheduler`` (``_abort_on_queued_limit``'s
    calls)."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def abort(self, req: Any, message: str, status_code: int) -> None:
        from sglang.srt.managers.scheduler import _make_abort_req

        # an HTTPStatus, not an int: SGLang's streaming endpoints send the client an error chunk
        # only for that (entrypoints/openai/serving_completions.py), else a silent empty finish
        code = HTTPStatus(status_code)
        reason = {"type": "abort", "status_code": code, "message": message}
        self.scheduler._release_aborted_request(req)
        self.scheduler.send_abort_output(_make_abort_req(req, finished_reason=reason), req)
