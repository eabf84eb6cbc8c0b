"""``mlfq``: FastServe's skip-join multi-level feedback queue, without SLO awareness."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from superinfer.policy_core.batching import fill_step
from superinfer.policy_core.changes import ranked
from superinfer.policy_core.protocols import BasePolicy
from superinfer.policy_core.types import Queue, RequestView, ScheduleDecision, StepState

__all__ = ["MLFQPolicy"]


@dataclass
class MLFQPolicy(BasePolicy):
    """Skip-join MLFQ (FastServe, Wu et al., arXiv:2305.05920, §4.1), service in tokens.

    Queue ``i`` of ``num_queues`` has a quantum of ``quantum_base_tokens * 2**i`` tokens of
    service (FastServe doubles its per-queue quanta). A request joins the first queue whose
    quantum covers its prompt (skip-join: its prefill would use up the quanta above), moves down
    one queue each time it uses up the quantum of the queue it is in, and is served in
    ``(queue, arrival)`` order. FastServe's starvation prevention: a request that has waited
    ``starvation_s`` without its first token is served from queue 0. It knows nothing of SLOs.

    The level is a pure function of a request's prompt length and service (``computed_tokens``),
    so the policy keeps no state. It never repeats decisions, since levels change as requests
    decode.
    """

    num_queues: int = field(default=8, metadata={"help": "number of queues"})
    quantum_base_tokens: int = field(
        default=256, metadata={"help": "quantum of queue 0; queue i has base * 2**i tokens"}
    )
    starvation_s: float = field(
        default=60.0, metadata={"help": "wait without a first token after which queue 0 serves"}
    )
    name: str = "mlfq"

    def __post_init__(self) -> None:
        if self.num_queues < 1 or self.quantum_base_tokens < 1:
            raise ValueError("mlfq: num_queues and quantum_base_tokens must be >= 1")
        if not self.starvation_s > 0:
            raise ValueError(f"mlfq: starvation_s must be > 0, got {self.starvation_s}")

    def level(self, view: RequestView, now_s: float) -> int:
        """The queue ``view`` is served from at ``now_s``."""
        if view.first_token_s is None and now_s - view.arrival_s >= self.starvation_s:
            return 0
        last = self.num_queues - 1
        level = 0
        while level < last and view.prompt_tokens > self.quantum_base_tokens << level:
            level += 1  # skip-join
        left = max(view.computed_tokens - view.cached_tokens, 0)
        while level < last and left >= self.quantum_base_tokens << level:
            left -= self.quantum_base_tokens << level
            level += 1  # demotion after each quantum used up
        return level

    def _key(self, view: RequestView) -> tuple[int, float, str]:
        """``(level at the call's instant, arrival, id)``; a request that may still starve is
        put on the replica's starvation heap, to be re-keyed when it does."""
        now, heap, pending = self._ctx
        if (
            view.first_token_s is None
            and now - view.arrival_s < self.starvation_s
            and view.request_id not in pending
        ):
            pending.add(view.request_id)
            heapq.heappush(heap, (view.arrival_s, view.request_id))
        return (self.level(view, now), view.arrival_s, view.request_id)

    def schedule(self, state: StepState) -> ScheduleDecision:
        # Both queues in (level, arrival) order, kept across calls: a key is recomputed when the
        # change set names its request, or when the request starts starving (a heap by arrival:
        # ``now - arrival >= starvation_s`` holds for a prefix of it).
        now = state.now_s
        books = self.__dict__.setdefault("_starving", {})
        last, heap, pending = books.get(state.replica) or (now, [], set())
        rebuild = now < last  # time went back: every key may be stale
        if rebuild:
            heap, pending = [], set()
        books[state.replica] = (now, heap, pending)
        due: list[str] = []
        while heap and now - heap[0][0] >= self.starvation_s:
            rid = heapq.heappop(heap)[1]
            pending.discard(rid)
            due.append(rid)
        self._ctx: tuple[float, list[tuple[float, str]], set[str]] = (now, heap, pending)
        key = self._key
        running = ranked(self, state, Queue.RUNNING, key, rekey=due, rebuild=rebuild)
        waiting = ranked(self, state, Queue.WAITING, key, rekey=due, rebuild=rebuild)
        return fill_step(state, running.ordered(state), waiting.views(state))
