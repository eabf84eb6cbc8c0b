"""The change set of ``StepState`` (issue 21): the engine side that builds it, the reference
definition it must equal, and the policy side that keeps queue orders from it.

* :class:`ViewTracker` (engines): one per replica; ``stamp(state)`` adds the id -> view map, the
  queue of each id and the change set since the previous stamped state (``StepState.views``,
  ``queue_of``, ``changes``). The diff runs in C-level dict and identity operations, so it
  costs a few tens of ns per queued request and allocates nothing per request; only views that
  are new objects are compared field by field (an engine that caches views, as the
  simulator does, makes an unchanged request cost one identity check), which also sorts each
  change into a decode advance or an irregular one (:func:`decode_advance`).
* :func:`diff_states`: the definition: the difference of two full snapshots, by value. Tests
  check every engine's change set against it.
* :class:`RankedQueue` (policies): one queue of one replica kept in key order across states,
  updated from the change set in ``O(log n)`` per request touched, or rebuilt by a sort when the
  state carries no usable change set (the engine gives none, or the policy missed a state).
  Iterating it in order yields the same sequence as ``sorted(queue, key=key)``.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, insort
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import fields, replace
from itertools import compress
from operator import attrgetter, is_not
from typing import Any

from superinfer.policy_core.types import Queue, QueueChanges, RequestView, StepChanges, StepState

__all__ = [
    "QUEUES",
    "RankedQueue",
    "SortedKeys",
    "ViewTracker",
    "decode_advance",
    "diff_states",
    "ranked",
]

#: The three queues, in ``StepState`` field order.
QUEUES = (Queue.WAITING, Queue.RUNNING, Queue.SWAPPED)
_EMPTY = QueueChanges()
_rid = attrgetter("request_id")
_SERIES = itertools.count(1)


#: Every ``RequestView`` field but the three a decode step moves (``decode_advance``).
_STILL = attrgetter(
    *(
        f.name
        for f in fields(RequestView)
        if f.name not in ("computed_tokens", "generated_tokens", "kv_blocks")
    )
)


def decode_advance(before: RequestView, after: RequestView) -> int:
    """Tokens ``after`` is ahead of ``before`` by decode steps alone, or -1 if it is not.

    A decode advance (``QueueChanges``): ``before`` was decoding (``generated_tokens > 0``,
    ``pending_tokens == 1``), ``computed_tokens`` and ``generated_tokens`` both grew by the same
    ``d >= 0``, ``kv_blocks`` did not shrink and every other field is equal; returns ``d``.
    """
    d = after.computed_tokens - before.computed_tokens
    if (
        d < 0
        or after.generated_tokens - before.generated_tokens != d
        or after.kv_blocks < before.kv_blocks
        or not before.generated_tokens
        or before.prompt_tokens + before.generated_tokens - before.computed_tokens != 1
        or _STILL(before) != _STILL(after)
    ):
        return -1
    return d


def _queue_changes(
    arrived: frozenset[str],
    left: frozenset[str],
    pairs: Iterator[tuple[str, RequestView, RequestView]],
) -> QueueChanges:
    """The ``QueueChanges`` of ``(id, before, after)`` pairs of ids present at both states (the
    pairs may include unchanged views)."""
    changed, irregular = [], []
    least, most = -1, 0
    for rid, old, new in pairs:
        d = decode_advance(old, new)
        if d < 0:
            if old != new:
                changed.append(rid)
                irregular.append(rid)
        elif d or old.kv_blocks != new.kv_blocks:
            changed.append(rid)
            if d > most:
                most = d
            if d < least or least < 0:
                least = d
    return QueueChanges(
        arrived, left, frozenset(changed), frozenset(irregular), max(least, 0), most
    )


def _queue_views(state: StepState, queue: Queue) -> tuple[RequestView, ...]:
    if queue is Queue.WAITING:
        return state.waiting
    return state.running if queue is Queue.RUNNING else state.swapped


def diff_states(before: StepState | None, after: StepState) -> tuple[QueueChanges, ...]:
    """Per queue (waiting, running, swapped), how ``after`` differs from ``before``, by value.

    The definition the engines' ``StepState.changes`` must equal (``None`` for ``before``: empty
    queues). Pure Python, one pass over both states: for tests and as documentation.
    """
    out = []
    for q in QUEUES:
        old = {} if before is None else {v.request_id: v for v in _queue_views(before, q)}
        new = {v.request_id: v for v in _queue_views(after, q)}
        changed = frozenset(r for r in new if r in old and new[r] != old[r])
        advances = [decode_advance(old[r], new[r]) for r in changed]
        out.append(
            QueueChanges(
                arrived=frozenset(r for r in new if r not in old),
                left=frozenset(r for r in old if r not in new),
                changed=changed,
                irregular=frozenset(r for r, d in zip(changed, advances, strict=True) if d < 0),
                min_advance=min((d for d in advances if d >= 0), default=0),
                max_advance=max((d for d in advances if d >= 0), default=0),
            )
        )
    return tuple(out)


class ViewTracker:
    """Engine side: numbers the full states of one replica and adds their change sets.

    Call :meth:`stamp` on every full state the policy is shown (not on partial or probe states:
    show those unstamped, with ``changes = None``). Holds the previous state's views.
    """

    def __init__(self) -> None:
        self.series = next(_SERIES)
        self.seq = 0
        self._prev: list[dict[str, RequestView]] = [{}, {}, {}]

    def stamp(self, state: StepState) -> StepState:
        """``state`` with ``views``, ``queue_of`` and ``changes`` since the previous stamp."""
        views: dict[str, RequestView] = {}
        queue_of: dict[str, Queue] = {}
        parts = []
        for i, q in enumerate(QUEUES):
            seq = _queue_views(state, q)
            cur = dict(zip(map(_rid, seq), seq, strict=True))
            old = self._prev[i]
            # Ids whose view is not the previous state's object (new ids included), found by
            # C-level iteration without allocating per request; the previous views are alive
            # (self._prev holds them), so ``is`` cannot be fooled by a reused address.
            fresh = list(compress(cur, map(is_not, map(old.get, cur), cur.values())))
            if not fresh and len(cur) == len(old):
                parts.append(_EMPTY)
            else:
                arrived = frozenset(r for r in fresh if r not in old)
                parts.append(
                    _queue_changes(
                        arrived,
                        frozenset(old.keys() - cur.keys()) if len(old) else frozenset(),
                        ((r, old[r], cur[r]) for r in fresh if r not in arrived),
                    )
                )
            self._prev[i] = cur
            views.update(cur)
            queue_of.update(dict.fromkeys(cur, q))
        self.seq += 1
        changes = StepChanges(self.series, self.seq, self.seq - 1, *parts)
        return replace(state, views=views, queue_of=queue_of, changes=changes)


class SortedKeys:
    """A sorted list of unique, comparable keys in buckets of at most ``2 * load``: insert and
    remove cost a bisect over the buckets plus a move inside one bucket (``O(log n + load)``),
    iteration is in order. The idea of ``sortedcontainers.SortedList``, reduced to what the
    policies need."""

    __slots__ = ("_load", "_lists", "_maxes", "_len")

    def __init__(self, keys: Sequence[Any] = (), load: int = 512) -> None:
        self._load = load
        ordered = sorted(keys)
        self._lists = [ordered[i : i + load] for i in range(0, len(ordered), load)]
        self._maxes = [b[-1] for b in self._lists]
        self._len = len(ordered)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Any]:
        return itertools.chain.from_iterable(self._lists)

    def add(self, key: Any) -> None:
        """Insert ``key`` (not already present)."""
        maxes, lists = self._maxes, self._lists
        self._len += 1
        if not maxes:
            lists.append([key])
            maxes.append(key)
            return
        i = bisect_left(maxes, key)
        if i == len(maxes):
            i -= 1
            lists[i].append(key)
            maxes[i] = key
        else:
            insort(lists[i], key)
        if len(lists[i]) > 2 * self._load:
            half = lists[i][self._load :]
            del lists[i][self._load :]
            maxes[i] = lists[i][-1]
            lists.insert(i + 1, half)
            maxes.insert(i + 1, half[-1])

    def remove(self, key: Any) -> None:
        """Remove ``key``; ``ValueError`` if absent."""
        maxes, lists = self._maxes, self._lists
        i = bisect_left(maxes, key)
        if i == len(maxes):
            raise ValueError(f"{key!r} not in SortedKeys")
        bucket = lists[i]
        j = bisect_left(bucket, key)
        if j == len(bucket) or bucket[j] != key:
            raise ValueError(f"{key!r} not in SortedKeys")
        del bucket[j]
        self._len -= 1
        if not bucket:
            del lists[i]
            del maxes[i]
        elif j == len(bucket):
            maxes[i] = bucket[-1]


class RankedQueue:
    """Policy side: one queue of one replica in ``key`` order, kept across states.

    ``key(view)`` must be unique per request and end with its id (``(..., request_id)``), so that
    the order is total and equal to ``sorted(queue, key=key)``. Keys are recomputed only for
    requests the change set names (arrived, changed); ``rekey`` names more (a key that depends on
    time). Without a usable change set (``state.changes`` is ``None`` or does not continue the
    series last seen) the queue is rebuilt from the state: one key per request and a sort, the
    cost of the stateless policy.
    """

    def __init__(self, queue: Queue, key: Callable[[RequestView], Any]) -> None:
        self.queue = queue
        self.key = key
        self._keys: dict[str, Any] = {}
        self._sorted = SortedKeys()
        self._at: tuple[int, int] | None = None
        self._views: Mapping[str, RequestView] | None = None  # the last rebuild's, without views
        self.rebuilds = 0

    def update(self, state: StepState, rekey: Sequence[str] = ()) -> bool:
        """Bring the order to ``state``; returns True if it was rebuilt (no usable change set).

        ``rekey``: ids of this queue whose key may have changed although their view did not.
        """
        ch = state.changes
        views = state.views
        if ch is None or views is None or (ch.series, ch.base_seq) != self._at:
            self._rebuild(state)
            self._at = None if ch is None or views is None else (ch.series, ch.seq)
            return True
        self._at = (ch.series, ch.seq)
        self._views = None
        qc = ch.of(self.queue)
        keys, ranked, key = self._keys, self._sorted, self.key
        for rid in qc.left:
            ranked.remove(keys.pop(rid))
        for rid in qc.arrived:
            k = keys[rid] = key(views[rid])
            ranked.add(k)
        for rids in (qc.changed, rekey):
            for rid in rids:
                old = keys.get(rid)
                if old is None:
                    continue
                k = key(views[rid])
                if k != old:
                    ranked.remove(old)
                    ranked.add(k)
                    keys[rid] = k
        return False

    def reset(self) -> None:
        """Forget the series: the next :meth:`update` rebuilds from the queue."""
        self._at = None

    def _rebuild(self, state: StepState) -> None:
        self.rebuilds += 1
        key = self.key
        seq = _queue_views(state, self.queue)
        by_id = None if state.views is not None else dict(zip(map(_rid, seq), seq, strict=True))
        self._views = by_id
        self._keys = {v.request_id: key(v) for v in seq}
        self._sorted = SortedKeys(list(self._keys.values()))

    def __len__(self) -> int:
        return len(self._sorted)

    def keys(self) -> Iterator[Any]:
        """The keys, in order."""
        return iter(self._sorted)

    def views(self, state: StepState) -> Iterator[RequestView]:
        """The queue's views in ``state`` (the one last passed to :meth:`update`), in order."""
        views = state.views if state.views is not None else self._views
        if views is None:  # pragma: no cover - update() was not called with this state
            raise RuntimeError("RankedQueue.views: call update(state) first")
        return (views[k[-1]] for k in self._sorted)

    def ordered(self, state: StepState) -> list[RequestView]:
        """:meth:`views` as a list."""
        return list(self.views(state))


def ranked(
    owner: object,
    state: StepState,
    queue: Queue,
    key: Callable[[RequestView], Any],
    *,
    rekey: Sequence[str] = (),
    rebuild: bool = False,
) -> RankedQueue:
    """``owner``'s :class:`RankedQueue` of ``queue`` on ``state.replica`` under ``key``, brought
    to ``state`` (``rekey``: see :meth:`RankedQueue.update`; ``rebuild``: from the queue, as
    without a change set). Kept in ``owner.__dict__`` (not a dataclass field: no policy
    option)."""
    store: dict[tuple[int, Queue, Any], RankedQueue] = owner.__dict__.setdefault(
        "_ranked_queues", {}
    )
    rq = store.get((state.replica, queue, key))
    if rq is None:
        rq = store[(state.replica, queue, key)] = RankedQueue(queue, key)
    if rebuild:
        rq.reset()
    rq.update(state, rekey)
    return rq
