"""Request routers: which replica an arriving request joins.

Four routers, by the name ``SimConfig.router`` gives (:data:`ROUTERS`):

* ``round_robin``: replicas in turn.
* ``least_tokens``: the fewest outstanding tokens (prompt tokens not yet computed plus output caps
  not yet generated), then the fewest running requests, then the lowest index.
* ``slo_aware``: a request with a TTFT target goes where the fewest prompt tokens wait for prefill;
  the others as ``least_tokens``.
* ``cache_aware``: the replica whose prefix cache holds the longest prefix of the prompt, balanced
  by load, as SGLang's model gateway does (:data:`CACHE_THRESHOLD`).

A router sees replicas read-only; only the round-robin one keeps state (its turn).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from superinfer.sim.replica import Replica
from superinfer.sim.request import SimRequest

__all__ = [
    "BALANCE_ABS_THRESHOLD",
    "BALANCE_REL_THRESHOLD",
    "CACHE_THRESHOLD",
    "ROUTERS",
    "CacheAwareRouter",
    "LeastTokensRouter",
    "RoundRobinRouter",
    "Router",
    "SloAwareRouter",
    "make_router",
]

#: The cache-aware router's defaults, as SGLang's model gateway (sgl-router) and vLLM's router
#: ship them for their ``cache_aware`` policy: route to the replica holding the longest prefix
#: when it covers more than ``--cache-threshold`` 0.3 of the prompt, else to the one with the
#: smallest cache; but once the busiest replica has more than ``--balance-abs-threshold`` 64
#: requests over the idlest and ``--balance-rel-threshold`` 1.5 times as many, to the idlest.
CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5


class Router(Protocol):
    """What the simulator needs from a router."""

    def route(self, req: SimRequest, replicas: Sequence[Replica]) -> Replica:
        """The replica ``req`` joins (``replicas`` is non-empty, in index order)."""
        ...


def outstanding_tokens(rep: Replica) -> int:
    """Tokens ``rep`` still owes its live requests: prompt tokens not yet computed plus output
    caps not yet generated."""
    live = (*rep.waiting.values(), *rep.running.values(), *rep.swapped.values())
    return sum(r.pending_tokens + r.spec.max_output_tokens - r.generated_tokens for r in live)


def queued_prefill_tokens(rep: Replica) -> int:
    """Prompt tokens waiting for prefill on ``rep`` (requests with more than one pending)."""
    live = (*rep.waiting.values(), *rep.running.values(), *rep.swapped.values())
    return sum(r.pending_tokens for r in live if r.pending_tokens > 1)


class RoundRobinRouter:
    """Replicas in turn, starting with replica 0."""

    def __init__(self) -> None:
        self._next = 0

    def route(self, req: SimRequest, replicas: Sequence[Replica]) -> Replica:
        """The replica whose turn it is; the turn moves on."""
        rep = replicas[self._next]
        self._next = (self._next + 1) % len(replicas)
        return rep


class LeastTokensRouter:
    """The replica with the fewest :func:`outstanding_tokens` (ties: fewest running, lowest
    index)."""

    def route(self, req: SimRequest, replicas: Sequence[Replica]) -> Replica:
        """The least-loaded replica."""
        return min(replicas, key=lambda rep: (outstanding_tokens(rep), len(rep.running), rep.index))


class SloAwareRouter:
    """Requests with a TTFT target go to the replica with the fewest
    :func:`queued_prefill_tokens`; the others as :class:`LeastTokensRouter` (ties alike)."""

    def route(self, req: SimRequest, replicas: Sequence[Replica]) -> Replica:
        """The replica that will start ``req``'s prefill soonest, if it has a TTFT target."""
        load = queued_prefill_tokens if req.spec.slo.ttft_ms is not None else outstanding_tokens
        return min(replicas, key=lambda rep: (load(rep), len(rep.running), rep.index))


class CacheAwareRouter:
    """SGLang gateway's ``cache_aware`` policy (:data:`CACHE_THRESHOLD` and the balance
    thresholds): the idlest replica when load is unbalanced, else the longest cached prefix when it
    covers enough of the prompt, else the smallest cache (ties: load, then index)."""

    def route(self, req: SimRequest, replicas: Sequence[Replica]) -> Replica:
        """The replica ``req`` joins under the rules above."""
        loads = [len(r.waiting) + len(r.running) + len(r.swapped) for r in replicas]
        busiest, idlest = max(loads), min(loads)
        if busiest - idlest > BALANCE_ABS_THRESHOLD and busiest > BALANCE_REL_THRESHOLD * idlest:
            return replicas[loads.index(idlest)]
        spec = req.spec
        best, best_tokens = None, 0
        if spec.block_hashes:
            for rep in replicas:
                matched = rep.cache.match(spec.block_hashes, spec.prompt_tokens).tokens
                if matched > best_tokens:
                    best, best_tokens = rep, matched
        if best is not None and best_tokens > CACHE_THRESHOLD * spec.prompt_tokens:
            return best
        return min(replicas, key=lambda r: (r.cache.hbm_blocks + r.cache.cpu_blocks,
                                            loads[r.index], r.index))  # fmt: skip


_ROUTERS: dict[str, type[Router]] = {
    "round_robin": RoundRobinRouter,
    "least_tokens": LeastTokensRouter,
    "slo_aware": SloAwareRouter,
    "cache_aware": CacheAwareRouter,
}

#: Request routers across replicas, by name.
ROUTERS: tuple[str, ...] = tuple(_ROUTERS)


def make_router(name: str) -> Router:
    """A fresh router of kind ``name`` (one of :data:`ROUTERS`).

    Raises:
        ValueError: unknown name; the message lists the known ones.
    """
    if name not in _ROUTERS:
        raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}")
    return _ROUTERS[name]()
