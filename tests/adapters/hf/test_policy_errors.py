"""A policy that raises fails only the request it raised on, and the engine goes on (issue 20).

The same real ``PagedAttentionCache`` and ``RequestState`` objects as ``test_scheduler.py`` (tiny
Llama config, no weights); the policy is FCFS that raises ``OverflowError`` on any step that
shows it a request with an absurd TPOT target, as the ``superinfer`` policy did on
``tpot_ms = 1.7e308`` (``int(inf)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tests.adapters.hf.conftest import required

if not required():  # under `make test` a missing transformers fails (conftest.required)
    pytest.importorskip("transformers", reason="transformers missing: run `make install-hf`")

from superinfer.adapters.hookspecs import hookimpl  # noqa: E402
from superinfer.policy_core.policies.fcfs import FCFSPolicy  # noqa: E402
from superinfer.policy_core.types import SLO, RequestView, ScheduleDecision, StepState  # noqa: E402
from superinfer.policy_core.validation import PolicyError  # noqa: E402
from tests.adapters.hf.test_scheduler import CHAT, arrive, make_scheduler, run_step  # noqa: E402

HUGE = SLO("chat", ttft_ms=1000.0, tpot_ms=1.7e308)


def serving_scheduler(policy: object) -> tuple[Any, Any]:
    """A scheduler bound as a server binds it (``isolate_policy_errors``)."""
    scheduler, binding = make_scheduler(policy)  # type: ignore[arg-type]
    binding.isolate_policy_errors = True
    return scheduler, binding


@dataclass
class Overflowing(FCFSPolicy):
    """FCFS that raises on a step showing a TPOT target over 1e300 ms (``running_only``: only
    once that request runs, as the superinfer policy's decode allowance did)."""

    name: str = "overflowing"
    running_only: bool = False

    def schedule(self, state: StepState) -> ScheduleDecision:
        views = state.running if self.running_only else (*state.waiting, *state.running)
        for v in views:
            if v.slo.tpot_ms is not None and v.slo.tpot_ms > 1e300:
                raise OverflowError("cannot convert float infinity to integer")
        return super().schedule(state)


@dataclass
class AlwaysRaises(FCFSPolicy):
    """A policy that cannot schedule any step, not even an empty one."""

    name: str = "always-raises"

    def schedule(self, state: StepState) -> ScheduleDecision:
        raise ZeroDivisionError("division by zero")


class RaisesOnArrival:
    """A plugin whose arrival hook raises for one request id."""

    def __init__(self, bad: str) -> None:
        self.bad = bad
        self.inner = FCFSPolicy()

    @hookimpl
    def superinfer_schedule(self, state: StepState) -> ScheduleDecision:
        return self.inner.schedule(state)

    @hookimpl
    def superinfer_request_arrived(self, request: RequestView, now_s: float) -> None:
        if request.request_id == self.bad:
            raise KeyError(request.request_id)


def test_a_waiting_request_the_policy_raises_on_is_failed_alone() -> None:
    scheduler, binding = serving_scheduler(Overflowing())
    arrive(scheduler, binding, "ok", prompt=6, output=2)
    arrive(scheduler, binding, "bad", prompt=6, output=2, slo=HUGE)
    batch, _, num_q, _ = scheduler.schedule_batch(16, 32)
    assert [f.state.request_id for f in batch] == ["ok"] and num_q == 6
    status, reason, _ = binding.ended["bad"]
    assert (status, reason) == (
        "failed",
        "policy error: OverflowError: cannot convert float infinity to integer",
    )
    assert binding.policy_errors == 1 and binding.error is None
    assert "bad" not in scheduler.waiting_requests and "bad" not in scheduler.active_requests


def test_a_running_request_the_policy_raises_on_is_failed_and_its_kv_freed() -> None:
    scheduler, binding = serving_scheduler(Overflowing(running_only=True))
    arrive(scheduler, binding, "bad", prompt=6, output=4, slo=HUGE)
    arrive(scheduler, binding, "ok", prompt=6, output=2, slo=CHAT)
    batch, *_ = scheduler.schedule_batch(16, 32)  # both admitted: nothing raises yet
    assert sorted(f.state.request_id for f in batch) == ["bad", "ok"]
    assert binding.used_blocks == 4  # 2 pages of 4 tokens each
    run_step(scheduler, batch)
    batch, *_ = scheduler.schedule_batch(16, 32)  # "bad" now runs: the policy raises
    assert [f.state.request_id for f in batch] == ["ok"]
    assert binding.ended["bad"][:2] == (
        "failed",
        "policy error: OverflowError: cannot convert float infinity to integer",
    )
    assert binding.used_blocks == 2  # only "ok"'s two blocks
    assert binding.queue_by_tier == {(0, "running"): 1}
    assert binding.error is None and binding.policy_errors == 1


def test_an_arrival_hook_error_fails_that_request_only() -> None:
    scheduler, binding = serving_scheduler(RaisesOnArrival("bad"))
    arrive(scheduler, binding, "bad", prompt=4, output=2)
    arrive(scheduler, binding, "ok", prompt=4, output=2)
    assert binding.ended["bad"][:2] == ("failed", "policy error: KeyError: 'bad'")
    batch, *_ = scheduler.schedule_batch(16, 32)
    assert [f.state.request_id for f in batch] == ["ok"]
    assert binding.policy_errors == 1


def test_a_policy_that_cannot_schedule_an_empty_step_stops_the_engine() -> None:
    scheduler, binding = serving_scheduler(AlwaysRaises())
    arrive(scheduler, binding, "r1", prompt=4, output=2)
    with pytest.raises(ZeroDivisionError):
        scheduler.schedule_batch(16, 32)
    assert isinstance(binding.error, ZeroDivisionError)
    assert list(scheduler.waiting_requests) == ["r1"] and binding.policy_errors == 0


def test_an_error_no_single_request_causes_fails_every_live_request() -> None:
    @dataclass
    class Pairs(FCFSPolicy):
        """Raises only when it sees two requests at once."""

        name: str = "pairs"

        def schedule(self, state: StepState) -> ScheduleDecision:
            if len(state.waiting) + len(state.running) >= 2:
                raise PolicyError("two at once")
            return super().schedule(state)

    scheduler, binding = serving_scheduler(Pairs())
    arrive(scheduler, binding, "a", prompt=4, output=2)
    arrive(scheduler, binding, "b", prompt=4, output=2)
    batch, *_ = scheduler.schedule_batch(16, 32)
    assert batch == []
    assert {rid: binding.ended[rid][:2] for rid in ("a", "b")} == {
        "a": ("failed", "policy error: PolicyError: two at once"),
        "b": ("failed", "policy error: PolicyError: two at once"),
    }
    assert binding.policy_errors == 2 and binding.error is None and binding.used_blocks == 0


def test_without_isolation_a_policy_error_stops_the_engine_as_before() -> None:
    # `bench --engine hf` does not isolate: a policy bug ends the run (exit 3), as before.
    scheduler, binding = make_scheduler(Overflowing())  # type: ignore[arg-type]
    arrive(scheduler, binding, "bad", prompt=6, output=2, slo=HUGE)
    with pytest.raises(OverflowError, match="cannot convert float infinity"):
        scheduler.schedule_batch(16, 32)
    assert isinstance(binding.error, OverflowError) and binding.policy_errors == 0
    assert list(scheduler.waiting_requests) == ["bad"]
