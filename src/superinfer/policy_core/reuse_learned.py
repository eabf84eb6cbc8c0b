"""The learned reuse predictor as a request-level block cache (:class:`LearnedCache`), for the
adaptive predictor's shadow and ``benchmarks/cache_decision_cost.py``.

Blocks and the request interface as in :mod:`superinfer.policy_core.reuse_blocks`; the model is
:class:`superinfer.policy_core.reuse.ReusePredictor`, the eviction order the placement
planner's (:func:`superinfer.policy_core.kv_placement_plan.eviction_order`). Pure: stdlib and
numpy.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import cast

import numpy as np
from numpy.typing import NDArray

from superinfer.policy_core.kv_placement_plan import eviction_order
from superinfer.policy_core.reuse import NodeColumns, ReusePredictor, ReusePredictorConfig
from superinfer.policy_core.reuse_blocks import BlockCache

__all__ = ["LearnedCache"]


class LearnedCache(BlockCache):
    """The learned reuse predictor of :mod:`superinfer.policy_core.reuse` (logistic model of
    P(reused within the cache's characteristic time), LRU until calibrated) evicting leaves
    lowest score first, in the :class:`~superinfer.policy_core.kv_placement_plan.PlacementPlanner`'s
    order (:func:`~superinfer.policy_core.kv_placement_plan.eviction_order`).

    The O(cache) work (columns, scores, the ordering) is amortized: a plan scores every cached
    block at once and orders ``need + lookahead`` victims (``lookahead = max(min_lookahead,
    lookahead_frac x capacity)``; the planner's greedy order, so its first ``need`` are what a
    plan for ``need`` would drop). The following requests take theirs from that queue, skipping
    a block touched since the plan (its score changed) or that gained a cached child, merged by
    score with a side heap of the blocks that became candidates since the plan (each request's
    last block, and a parent its evicted child exposed), scored one by one
    (:meth:`~superinfer.policy_core.reuse.ReusePredictor.score_one`). A new plan comes when the
    queue runs out or as many blocks as it ordered have left (so queued scores never age more
    than one plan's worth of evictions). The training examples of the requests since the
    previous plan (``samples_per_call`` each, one AdaGrad batch per request) are drawn at the
    plan. With ``lookahead_frac=0``, or in a cache of fewer than ``amortize_min_blocks`` blocks
    (4,096: where a plan is cheap and the shortcut cost hit rate, -0.35 points on
    ``gen-multi-turn`` at 5 % over three seeds), every request that must evict plans afresh and
    takes the first ``need`` (the replay before issue 22's cost work, O(cache) per request;
    decisions identical).

    Per request: O(blocks) numpy work, O(log) per eviction; one O(cache) plan per ``lookahead``
    evictions.
    """

    name = "learned"

    def __init__(
        self,
        capacity: int,
        parent: Sequence[int],
        depth: Sequence[int],
        tokens: Sequence[int] | None = None,
        seed: int = 0,
        *,
        lookahead_frac: float = 1.0 / 32.0,
        min_lookahead: int = 16,
        amortize_min_blocks: int = 4096,
    ) -> None:
        super().__init__(capacity, parent, depth)
        u = len(self.parent)
        self.model = ReusePredictor(ReusePredictorConfig(seed=seed))
        self._parent = np.asarray(self.parent, dtype=np.int64)
        self._depth = np.asarray(self.depth, dtype=np.int64)
        self._tokens = np.ones(u) if tokens is None else np.asarray(tokens, dtype=np.float64)
        self.cached = np.zeros(u, dtype=bool)
        self.last = np.full(u, -np.inf)
        self.first = np.zeros(u)
        self.accesses = np.zeros(u)
        self.interval = np.full(u, np.nan)
        self.touched = np.full(u, -1, dtype=np.int64)  # request index of the last access
        self.children = np.zeros(u, dtype=np.int64)  # cached children per block
        self.pos = np.full(u, -1, dtype=np.int64)
        self.size = 0
        amortize = lookahead_frac > 0 and capacity >= amortize_min_blocks
        self.lookahead = max(min_lookahead, int(lookahead_frac * capacity)) if amortize else 0
        self.num_plans = 0
        self._queue: list[int] = []
        self._qscore: list[float] = []
        self._queued: set[int] = set()
        self._side: list[tuple[float, int, int, int]] = []  # (score, -depth, block, request)
        self._qpos = 0
        self._taken = 0  # blocks evicted since the plan
        self._plan_req = -1
        self._req = -1
        self._unsampled = 0

    def __contains__(self, block: object) -> bool:
        return bool(self.cached[cast(int, block)])

    def request(self, blocks: Sequence[int], now_s: float) -> list[int]:
        self._req += 1
        b = np.asarray(blocks, dtype=np.int64)
        w = self.model.config.interval_weight
        seen = self.last[b] > -np.inf
        gap = now_s - self.last[b]
        old = self.interval[b]
        self.interval[b] = np.where(
            seen, np.where(np.isnan(old), gap, w * gap + (1 - w) * old), np.nan
        )
        self.first[b[~seen]] = now_s
        self.last[b] = now_s
        self.accesses[b] += 1
        self.touched[b] = self._req
        fresh = b[~self.cached[b]]
        if len(fresh):
            self.size += len(fresh)
            self.cached[fresh] = True
            par = self._parent[fresh]
            np.add.at(self.children, par[par >= 0], 1)
        need = self.size - self.capacity
        if need <= 0:
            return []
        self._unsampled += 1
        self.model.learn(now_s, lambda keys: self.last[keys])
        side = self._side
        if self.lookahead and self._queue:
            leaf = blocks[-1]
            if not self.children[leaf]:
                self._push_side(leaf, now_s)
        out: list[int] = []
        cached, touched, children, parent = self.cached, self.touched, self.children, self.parent
        queue, qscore, queued = self._queue, self._qscore, self._queued
        planned = False
        while len(out) < need:
            while self._qpos < len(queue):  # skip what changed since the plan
                v = queue[self._qpos]
                if cached[v] and touched[v] <= self._plan_req and not children[v]:
                    break
                self._qpos += 1
            while side:
                _, _, v, at = side[0]
                if cached[v] and touched[v] <= at and not children[v]:
                    break
                heapq.heappop(side)
            if (self._qpos >= len(queue) or self._taken >= len(queue)) and not planned:
                # The queue ran out, or as many blocks left since the plan as it ordered (the
                # side heap took some): a new plan sees every candidate with fresh scores.
                planned = True
                if self._plan(now_s, need - len(out)):
                    queue, qscore, queued = self._queue, self._qscore, self._queued
                    side = self._side
                    continue
            if self._qpos >= len(queue) and not side:
                break  # nothing else may leave now
            from_queue = not side or (
                self._qpos < len(queue) and (qscore[self._qpos], -self.depth[queue[self._qpos]],
                                              queue[self._qpos]) < side[0][:3]
            )  # fmt: skip
            if from_queue:
                v = queue[self._qpos]
                self._qpos += 1
            else:
                v = heapq.heappop(side)[2]
            self._taken += 1
            cached[v] = False
            p = parent[v]
            if p >= 0:
                children[p] -= 1
                if (
                    self.lookahead
                    and not children[p]
                    and (not from_queue or p not in queued or touched[p] > self._plan_req)
                ):
                    # scored as the planner scores an exposed parent: with the child it had
                    self._push_side(p, now_s, 1.0)
            out.append(v)
        self.size -= len(out)
        if out:
            self.model.observe_evictions(now_s - self.last[np.asarray(out, dtype=np.int64)])
        return out

    def content(self) -> list[int]:
        out: list[int] = np.flatnonzero(self.cached).tolist()
        return out

    def _push_side(self, b: int, now_s: float, num_children: float = 0.0) -> None:
        """A block that became an eviction candidate since the plan, scored now."""
        score = self.model.score_one(
            now_s - float(self.last[b]),
            now_s - float(self.first[b]),
            float(self.accesses[b]),
            float(self.interval[b]),
            float(self.depth[b]),
            float(self._tokens[b]),
            num_children,
        )
        heapq.heappush(self._side, (score, -self.depth[b], b, self._req))

    def _plan(self, now_s: float, need: int) -> bool:
        """Order the next ``need + lookahead`` victims; False when nothing can leave."""
        self.num_plans += 1
        cached = np.flatnonzero(self.cached)
        self.pos[cached] = np.arange(len(cached))
        par = self._parent[cached]
        ppos = np.where(par >= 0, self.pos[np.maximum(par, 0)], -1)
        children = self.children[cached].astype(np.float64)

        def cols_of(idx: NDArray[np.int64]) -> NodeColumns:
            c = cached[idx]
            return NodeColumns(
                age_s=now_s - self.last[c],
                since_first_s=now_s - self.first[c],
                num_accesses=self.accesses[c],
                interval_ewma_s=self.interval[c],
                depth=self._depth[c].astype(np.float64),
                tokens_per_block=self._tokens[c],
                num_children=children[idx],
            )

        model = self.model
        sample = model.sample_indices(len(cached), calls=self._unsampled)
        # Shuffled, so that each of the batches (one per request since the last plan, one
        # AdaGrad step each, as if sampled request by request) is a uniform draw.
        model.add_samples(cached[sample], cols_of(sample), now_s, batches=self._unsampled)
        self._unsampled = 0
        # Every cached block at once: one vector pass is cheaper than scoring the chains the
        # eviction exposes one by one.
        every = model.scores(cols_of(np.arange(len(cached))))
        order = eviction_order(every, ppos, self._depth[cached], need + self.lookahead)
        self._queue = cached[order].tolist()
        self._qscore = every[order].tolist()
        self._queued = set(self._queue)
        self._side = []
        self._qpos = 0
        self._taken = 0
        self._plan_req = self._req
        return bool(self._queue)
