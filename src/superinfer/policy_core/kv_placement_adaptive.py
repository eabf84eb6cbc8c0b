"""The adaptive reuse predictor as a prefix-cache placement policy (issue 22): it follows whichever
of LRU, S3-FIFO, ARC and the reuse-hazard model is doing best on the engine's traffic, judged
either by shadow caches (:class:`AdaptivePlacementPolicy`, plugin ``adaptive``) or by each
expert's regret on the engine's own cache (:class:`AdaptiveRegretPlacementPolicy`, plugin
``adaptive-regret``).

Both order the engine's nodes with the leading expert's own placement policy of
:mod:`superinfer.policy_core.kv_placement`, kept in step with the engine. Pure: stdlib and numpy.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from superinfer.policy_core.kv_baselines import ArcCache, LruCache, S3FifoCache
from superinfer.policy_core.kv_placement import (
    ArcPlacementPolicy,
    LRUPlacementPolicy,
    PlacementPolicy,
    S3FifoPlacementPolicy,
    accessed_since,
)
from superinfer.policy_core.kv_placement_hazard import HazardPlacementPolicy, HazardShadow
from superinfer.policy_core.kv_placement_plan import ScoreFn
from superinfer.policy_core.reuse import NodeColumns
from superinfer.policy_core.types import KVLocation, PrefixNodeView, RequestView

__all__ = ["ADAPTIVE_POLICIES", "AdaptivePlacementPolicy", "AdaptiveRegretPlacementPolicy"]

FloatArray = NDArray[np.float64]
_log = logging.getLogger(__name__)
#: Prompts read before the first eviction (when the shadows get their size) kept at most.
_MAX_PENDING = 4_096

#: The placement policies that order the engine's nodes while each expert leads, and the key
#: caches that shadow them, by expert name (``hazard``'s shadow, a :class:`HazardShadow` over
#: the ``hazard`` order's model, is made by ``AdaptivePlacementPolicy._shadow``).
_SHADOWS: dict[str, type[Any]] = {"lru": LruCache, "arc": ArcCache, "s3fifo": S3FifoCache}
_ORDERS: dict[str, type[PlacementPolicy]] = {
    "lru": LRUPlacementPolicy,
    "arc": ArcPlacementPolicy,
    "s3fifo": S3FifoPlacementPolicy,
    "hazard": HazardPlacementPolicy,
}


@dataclass
class AdaptivePlacementPolicy(PlacementPolicy):
    """Issue 22's adaptive reuse predictor in the placement hook: the engine's nodes leave in
    the order of whichever expert (LRU, S3-FIFO, ARC, the reuse-hazard model) would have served
    the most prompt tokens lately.

    The offline form (:class:`~superinfer.policy_core.reuse_adaptive.AdaptiveCache`) sees whole
    requests over a known block forest; this one sees only what the hook shows, the engine's
    cached nodes at each eviction. It keeps one shadow cache per expert (keys only, no KV) over
    the nodes' chunks (:attr:`PrefixNodeView.chunks`, content keys of the whole fixed-size
    pieces that end in a node, which an engine's split of a node does not change; a node without
    a content key is one chunk keyed by its id), each shadow as many chunks as the engine has
    shown at once (whole chunks only, so that every slot stands for the same tokens; with a
    node's partial last chunk as one more slot, a slot held 1 to 16 tokens), so that a prefix
    the engine evicted and inserted again, or split, is a hit in a shadow that kept it. At each
    call the nodes accessed since the last one (last access newer than last seen; oldest first,
    deeper first on ties) are read by every shadow; a read adds to a shadow's score the tokens
    of its chunks up to the first that shadow lacks (each chunk the node's tokens over its
    chunks: what that policy would have served from its cache, a prefix), then its chunks enter
    the shadow; all scores halve every ``half_life_tokens`` tokens read. The shadows never hear
    of the engine's evictions: each is its own policy's whole cache. The hazard expert's shadow
    (:class:`~superinfer.policy_core.kv_placement_hazard.HazardShadow`) trims once per read by
    the learned model of the ``hazard`` order (below), which reads the same prompts.

    Where the engine gives each new request's prompt chunk keys
    (:attr:`RequestView.prompt_chunk_keys`, read by :meth:`observe_request`), the shadows read
    those instead, once per request as the offline replay does, and the nodes' accesses no
    longer (on the real SGLang server, where every prefix match and insert touches a node
    again, reading the nodes ranked the experts within a point: ``results/sglang-kv-placement``).

    The shadows choose the leader. The nodes are ordered by the leader's own placement policy
    (:class:`LRUPlacementPolicy`, :class:`ArcPlacementPolicy`, :class:`S3FifoPlacementPolicy`,
    :class:`HazardPlacementPolicy` of :mod:`~superinfer.policy_core.kv_placement_hazard`), one
    of each kept in step with the engine on every call (fed the same accesses and the engine's
    evictions, as the ``lru``, ``arc``, ``s3fifo`` and ``hazard`` plugins are), so that with one
    leader throughout the decisions are that plugin's exactly; a shadow, which never hears of
    the engine's evictions, holds other content than the engine. After the first switch, with
    ``follow``, the nodes whose deepest whole chunk the leader's shadow lacks leave first: the
    engine's content, shaped by the old leader, moves to the new one's sooner (on the real
    SGLang server, without it, the hit rate lagged the new leader's by 2.4 points for a quarter
    of the trace after the switch: ``results/sglang-kv-placement/prompts/runs.csv``). The first
    expert leads at the start (cold start: LRU's order exactly); another takes the lead when its
    score exceeds the leader's by ``switch_margin`` of the decayed tokens accessed (a lead in
    token hit rate) and by ``min_lead_tokens``, so near-tied experts are not chased. Never pins.
    Work: O(chunks read x experts) for the shadows (at each arrival when prompts are read, else
    in the call) and each expert plugin's own work in every call.

    Attributes:
        experts: shadow policies, among ``lru``, ``arc``, ``s3fifo``, ``hazard``; the first is
            the cold start.
        half_life_tokens: half-life of the scores, in tokens accessed.
        switch_margin: lead in decayed token hit rate needed to take the lead.
        min_lead_tokens: lead in decayed hit tokens needed to take the lead.
        follow: after the first switch, the nodes whose deepest whole chunk the leader's
            shadow does not hold leave first (in the leader's order), so that the engine's
            content moves to the leader's sooner (the offline ``FollowingCache`` rule); False:
            the leader's order alone.
        leader: the expert followed now.
        scores: decayed hit tokens of each shadow; ``accessed``: decayed tokens accessed.
        switches: (call number, old leader, new leader) of each change of leader.
        from_prompts: whether the experts are judged on the requests' prompts (after the first
            keyed prompt) rather than on the nodes' accesses.

    Raises:
        ValueError: an unknown or repeated expert, or a value out of range.
    """

    name: ClassVar[str] = "adaptive"
    #: Asks engines for :attr:`RequestView.prompt_chunk_keys` (SGLang's adapter hashes each new
    #: prompt only when a plugin says so).
    reads_prompt_keys: ClassVar[bool] = True

    experts: tuple[str, ...] = ("lru", "s3fifo", "arc", "hazard")
    half_life_tokens: float = 65_536.0
    switch_margin: float = 0.005
    min_lead_tokens: float = 256.0
    follow: bool = True
    leader: str = field(default="", init=False)
    scores: dict[str, float] = field(default_factory=dict, init=False)
    accessed: float = field(default=0.0, init=False)
    switches: list[tuple[int, str, str]] = field(default_factory=list, init=False)
    _shadows: dict[str, Any] = field(default_factory=dict, init=False, repr=False)
    _orders: dict[str, PlacementPolicy] = field(default_factory=dict, init=False, repr=False)
    #: The ``hazard`` order if it is an expert (it learns from the prompts the shadows read).
    _hazard: HazardPlacementPolicy | None = field(default=None, init=False, repr=False)
    _seen: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _chunks: dict[str, tuple[tuple[str, ...], float]] = field(
        default_factory=dict, init=False, repr=False
    )
    #: Chunks of the nodes shown at this call (at least 1): the shadows' and ghost lists' size.
    _shown: int = field(default=1, init=False, repr=False)
    from_prompts: bool = field(default=False, init=False)
    #: Reads waiting for the shadows: chunk keys, tokens per chunk, the request (None: a node).
    _pending: deque[tuple[tuple[str, ...], float, RequestView | None]] = field(
        default_factory=lambda: deque(maxlen=_MAX_PENDING), init=False, repr=False
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if (
            not self.experts
            or len(set(self.experts)) < len(self.experts)
            or any(e not in _ORDERS for e in self.experts)
        ):
            raise ValueError(f"experts must be distinct names among {sorted(_ORDERS)}, "
                             f"got {self.experts}")  # fmt: skip
        if not self.half_life_tokens > 0:
            raise ValueError(f"half_life_tokens must be > 0, got {self.half_life_tokens}")
        if min(self.switch_margin, self.min_lead_tokens) < 0:
            raise ValueError("switch_margin and min_lead_tokens must be >= 0")
        self.leader = self.experts[0]
        self.scores = dict.fromkeys(self.experts, 0.0)
        self._orders = {e: _ORDERS[e]() for e in self.experts}
        hazard = self._orders.get("hazard")
        self._hazard = hazard if isinstance(hazard, HazardPlacementPolicy) else None

    def _see(self, nodes: tuple[PrefixNodeView, ...], needed_hbm_blocks: int) -> None:
        """Note each node's chunks and their tokens (every order notes what it needs)."""
        for order in self._orders.values():
            order._see(nodes, needed_hbm_blocks)
        self._chunks = {}
        for nd in nodes:
            chunks = nd.chunks
            self._chunks[nd.key] = chunks, nd.num_tokens / max(len(chunks), 1)
        self._shown = max(sum(len(c) for c, _ in self._chunks.values()), 1)

    def metrics(self) -> dict[str, Any]:
        out = super().metrics()
        out.update(leader=self.leader, switches=len(self.switches), scores=dict(self.scores),
                   accessed_tokens=self.accessed, from_prompts=self.from_prompts)  # fmt: skip
        return out

    def observe_request(self, request: RequestView) -> None:
        """Read a new request's prompt (:attr:`RequestView.prompt_chunk_keys`, each chunk its
        share of ``prompt_tokens``): from the first keyed prompt on, the experts are judged on
        the requests' reads, once each, as the offline replay judges them, and no longer on
        the nodes' accesses (SGLang touches a node at every prefix match of a waiting request
        and again when a request's KV is inserted, each a hit in every shadow). Before the
        first eviction the reads wait, up to the last 4,096 (an older one leaves unjudged; the
        ``hazard`` order still learns from it). The ``hazard`` order learns each prompt as the
        shadows read it, so that its shadow's trim after a read sees the keys' reads up to that
        read, not later ones."""
        chunks = request.prompt_chunk_keys
        if not chunks:
            return
        self.from_prompts = True
        if len(self._pending) == self._pending.maxlen:
            self._learn(self._pending.popleft()[2])
        self._pending.append((chunks, request.prompt_tokens / len(chunks), request))
        if self._ready():
            self._flush()

    def _learn(self, request: RequestView | None) -> None:
        """The ``hazard`` order, if an expert, reads ``request``'s prompt (None: a node's
        access, which that order reads itself)."""
        if request is not None and self._hazard is not None:
            self._hazard.observe_request(request)

    def _scores(
        self, keys: NDArray[Any], cols: NodeColumns, now_s: float, has_cpu_tier: bool
    ) -> tuple[FloatArray | ScoreFn, FloatArray | ScoreFn | None, bool]:
        fresh = accessed_since(self._seen, keys, now_s - cols.age_s, cols.depth)
        for i in fresh:
            self._seen[keys[i]] = float(now_s - cols.age_s[i])
        self._judge(keys, fresh)
        orders = {e: p._scores(keys, cols, now_s, has_cpu_tier)[0] for e, p in self._orders.items()}
        self._note_victims(keys, orders)
        if len(self._seen) > 4 * len(keys):  # forget nodes no longer shown
            self._seen = {k: t for k, t in self._seen.items() if k in self._chunks}
        return self._followed(keys, np.asarray(orders[self.leader], dtype=np.float64)), None, False

    def _followed(self, keys: NDArray[Any], score: FloatArray) -> FloatArray:
        """With ``follow``, after the first switch: ``score`` (the leader's order) with the
        nodes whose deepest whole chunk the leader's shadow lacks put first, in that order
        (a node without a whole chunk keeps its place)."""
        shadow = self._shadows.get(self.leader)
        if not (self.follow and self.switches and shadow is not None):
            return score
        lacks = np.fromiter(
            (bool(c) and c[-1] not in shadow for c, _ in map(self._chunks.__getitem__, keys)),
            bool, len(keys),
        )  # fmt: skip
        if not lacks.any():
            return score
        out: FloatArray = score - (float(score.max() - score.min()) + 1.0) * lacks
        return out

    def _judge(self, keys: NDArray[Any], fresh: list[int]) -> None:
        """Size what the reads go to, then read the requests' prompts waiting or, without
        prompt keys, the accessed nodes' chunks."""
        self._size(self._shown)
        if not self.from_prompts:
            self._pending.extend((*self._chunks[keys[i]], None) for i in fresh)
        self._flush()

    def _size(self, shown: int) -> None:
        """The shadows hold as many chunks as the most shown at once."""
        if not self._shadows:
            self._shadows = {e: self._shadow(e, shown) for e in self.experts}
        for shadow in self._shadows.values():
            shadow.capacity = max(shown, shadow.capacity)

    def _shadow(self, expert: str, capacity: int) -> Any:
        """A shadow cache of ``expert``'s policy with ``capacity`` chunks (``hazard``'s scores
        with the model of the ``hazard`` order)."""
        order = self._orders[expert]
        if isinstance(order, HazardPlacementPolicy):
            return HazardShadow(capacity, order)
        return _SHADOWS[expert](capacity)

    def _ready(self) -> bool:
        """Whether reads can be judged now (the shadows exist: after the first call)."""
        return bool(self._shadows)

    def _flush(self) -> None:
        reads = list(self._pending)
        self._pending.clear()
        self._read(reads)

    def _read(self, reads: list[tuple[tuple[str, ...], float, RequestView | None]]) -> None:
        """Feed reads (a prompt's or a node's chunks root first, tokens per chunk, the request) to
        the ``hazard`` order and the shadows, in order, and update the leader by hit tokens. A
        read hits a shadow in its chunks up to the first one that shadow lacks (a prefix cache
        serves a prefix: offline, ``reuse_adaptive``'s shadows count prefix hits too; counting
        every chunk held, the S3-FIFO and LRU shadows hit 0.669 and 0.663 of the tokens read by
        the first switch on the real SGLang server, where the offline replay of the run gives
        0.600 and 0.560: ``results/sglang-kv-placement/adaptive_switches.csv``,
        ``tries/runs-bd8c695.csv``); each read's chunks then enter every shadow deepest first (so
        that a parent is more recent than its child, as offline)."""
        hits = dict.fromkeys(self.experts, 0.0)
        total = 0.0
        shadows = [(name, shadow, isinstance(shadow, HazardShadow))
                   for name, shadow in self._shadows.items()]  # fmt: skip
        for chunks, tokens, request in reads:
            self._learn(request)
            total += tokens * len(chunks)
            for name, shadow, settles in shadows:
                k = 0
                while k < len(chunks) and chunks[k] in shadow:
                    k += 1
                hits[name] += k * tokens
                for chunk in reversed(chunks):
                    shadow.access(chunk)
                if settles:
                    shadow.settle()
        self._update_leader(self.scores, hits, total, lower_wins=False, what="")

    def _note_victims(self, keys: NDArray[Any], orders: dict[str, Any]) -> None:
        """After the experts' orders: nothing here (the regret variant notes their victims)."""
        return None

    def _update_leader(
        self, table: dict[str, float], add: dict[str, float], total: float, *,
        lower_wins: bool, what: str,
    ) -> None:  # fmt: skip
        """Decay ``table`` (scores or regrets) by ``total`` tokens read, add ``add``, and hand
        the lead to the best expert if it leads by the margins; ``what`` labels the log line."""
        decay = 0.5 ** (total / self.half_life_tokens)
        for name in self.experts:
            table[name] = table[name] * decay + add[name]
        self.accessed = self.accessed * decay + total
        sign = -1.0 if lower_wins else 1.0
        best = max(self.experts, key=lambda e: sign * table[e])  # first expert wins a tie
        lead = sign * (table[best] - table[self.leader])
        if lead > self.switch_margin * self.accessed and lead > self.min_lead_tokens:
            self.switches.append((self.num_calls, self.leader, best))
            _log.warning("%s placement: %s leads %s at call %d (%s%.0f vs %.0f of %.0f decayed "
                         "tokens)", self.name, best, self.leader, self.num_calls, what,
                         table[best], table[self.leader], self.accessed)  # fmt: skip
            self.leader = best


@dataclass
class AdaptiveRegretPlacementPolicy(AdaptivePlacementPolicy):
    """The adaptive predictor scored by regret on the engine's own cache instead of by shadow
    caches (LeCaR, Vietri et al., HotStorage 2018; CACHEUS, Rodriguez et al., FAST 2021).

    Every expert's placement policy is kept in step with the engine as in
    :class:`AdaptivePlacementPolicy`, and at each eviction every expert names the victims it
    would take: its lowest-scored leaves (not in use, in HBM) until ``needed_hbm_blocks`` are
    covered. Their chunks enter that expert's ghost list (FIFO, as many chunks as the engine
    shows). A later access to a chunk in an expert's ghost list is a hit that expert would have
    lost: it adds the chunk's tokens to the expert's regret (and leaves the list). So the
    experts are compared on the engine's real content and at its real size, where shadow caches
    (which hold other content than the engine) measured differences of under a point between LRU
    and S3-FIFO on the real SGLang server, whose own hit rates differed by 6. The leader is the
    expert with the least decayed regret; another takes the lead when its regret is lower by
    ``switch_margin`` of the decayed tokens accessed and by ``min_lead_tokens``. Only one step
    is counterfactual: after an expert's victims would have left, what it would have done next
    is not simulated.

    Attributes:
        regrets: decayed tokens each expert would have lost.
    """

    name: ClassVar[str] = "adaptive-regret"

    regrets: dict[str, float] = field(default_factory=dict, init=False)
    _ghosts: dict[str, OrderedDict[str, None]] = field(default_factory=dict, init=False,
                                                       repr=False)  # fmt: skip
    _nodes: tuple[PrefixNodeView, ...] = field(default=(), init=False, repr=False)
    _needed: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.regrets = dict.fromkeys(self.experts, 0.0)
        self._ghosts = {e: OrderedDict() for e in self.experts}

    def metrics(self) -> dict[str, Any]:
        out = super().metrics()
        out["regrets"] = dict(self.regrets)
        return out

    def _see(self, nodes: tuple[PrefixNodeView, ...], needed_hbm_blocks: int) -> None:
        """Also note the nodes and the blocks to free (each expert's victims)."""
        super()._see(nodes, needed_hbm_blocks)
        self._nodes, self._needed = nodes, needed_hbm_blocks

    def _size(self, shown: int) -> None:
        return None  # no shadows; the ghost lists are trimmed as victims join them

    def _ready(self) -> bool:
        return True  # the ghost lists need no size to be read

    def _read(self, reads: list[tuple[tuple[str, ...], float, RequestView | None]]) -> None:
        """Charge each expert the tokens of the chunks read that it had named (the ``hazard``
        order reads the prompts); update the leader."""
        lost = dict.fromkeys(self.experts, 0.0)
        total = 0.0
        for chunks, tokens, request in reads:
            self._learn(request)
            total += tokens * len(chunks)
            for chunk in chunks:
                for name, ghost in self._ghosts.items():
                    if ghost.pop(chunk, 0) is None:
                        lost[name] += tokens
        self._update_leader(self.regrets, lost, total, lower_wins=True, what="regret ")

    def _note_victims(self, keys: NDArray[Any], orders: dict[str, Any]) -> None:
        """Each expert's victims at this eviction join its ghost list."""
        if self._needed <= 0:
            return
        capacity = self._shown
        for name, score in orders.items():
            ghost = self._ghosts[name]
            for i in self._victims(np.asarray(score, dtype=np.float64)):
                for chunk in self._chunks[keys[i]][0]:
                    ghost[chunk] = None
                    ghost.move_to_end(chunk)
            while len(ghost) > capacity:
                ghost.popitem(last=False)

    def _victims(self, score: FloatArray) -> list[int]:
        """The nodes an expert with ``score`` would evict now: its lowest-scored leaves that are
        in HBM and not in use, until ``needed_hbm_blocks`` are covered (a one-pass planner)."""
        parents = {nd.parent_id for nd in self._nodes}
        out, freed = [], 0
        for i in np.argsort(score, kind="stable").tolist():
            nd = self._nodes[i]
            if nd.node_id in parents or nd.in_use or nd.location is not KVLocation.HBM:
                continue
            out.append(i)
            freed += max(nd.num_blocks, 1)
            if freed >= self._needed:
                break
        return out


#: The adaptive placement policies by name (the names of their plugins' entry points).
ADAPTIVE_POLICIES: dict[str, type[PlacementPolicy]] = {
    cls.name: cls for cls in (AdaptivePlacementPolicy, AdaptiveRegretPlacementPolicy)
}
