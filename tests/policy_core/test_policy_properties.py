"""Properties every registered policy keeps on random states, and the rotation scheduler's
starvation bound over random workloads (Hypothesis)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from superinfer.adapters.manager import available_policies, make_policy
from superinfer.policy_core.batching import blocks_for_tokens
from superinfer.policy_core.kv_cost import has_cpu_tier
from superinfer.policy_core.policies.superinfer import SuperInferPolicy
from superinfer.policy_core.types import SLO, KVLocation, PreemptMode, RequestView, StepState
from superinfer.policy_core.validation import check_decision
from tests.factories import BATCH, CHAT, make_state, make_view
from tests.policy_core.engine_double import EngineDouble, Req

OTHER = SLO("other")
CLASSES = st.sampled_from([CHAT, BATCH, OTHER])
POLICIES = sorted(available_policies())


@st.composite
def request_views(draw: Any, rid: str, queue: str, bs: int, now: float) -> RequestView:
    prompt = draw(st.integers(1, 3000))
    generated = draw(st.integers(0, 40))
    arrival = draw(st.floats(0.0, now))
    first = draw(st.floats(arrival, now)) if generated else None
    last = prompt + generated - 1  # the last sampled token never has KV yet
    if queue == "waiting":
        computed, blocks, location = 0, 0, KVLocation.UNALLOCATED
    else:
        computed = draw(st.integers(1 if queue == "swapped" else 0, max(last, 1)))
        computed = min(computed, last) if last >= 1 else 0
        blocks = blocks_for_tokens(computed, bs) + (draw(st.integers(0, 1)) if computed else 0)
        location = KVLocation.CPU if queue == "swapped" else KVLocation.HBM
        if queue == "swapped" and blocks == 0:
            blocks = 1
    return make_view(
        rid,
        arrival_s=arrival,
        prompt=prompt,
        computed=computed,
        generated=generated,
        blocks=blocks,
        slo=draw(CLASSES),
        max_output=generated + draw(st.integers(1, 500)),
        first_token_s=first,
        location=location,
        prefix_hit=draw(st.integers(0, prompt)),
        block_size=bs,
    )


@st.composite
def states(draw: Any) -> StepState:
    bs = draw(st.sampled_from([1, 16, 32]))
    now = draw(st.floats(0.0, 1000.0))
    n_run, n_wait = draw(st.integers(0, 10)), draw(st.integers(0, 10))
    cpu = draw(st.booleans())
    n_swap = draw(st.integers(0, 5)) if cpu else 0
    running = [draw(request_views(f"r{i}", "running", bs, now)) for i in range(n_run)]
    waiting = [draw(request_views(f"w{i}", "waiting", bs, now)) for i in range(n_wait)]
    swapped = [draw(request_views(f"s{i}", "swapped", bs, now)) for i in range(n_swap)]
    used = sum(v.kv_blocks for v in running)
    total = used + draw(st.integers(0, 300))
    cpu_used = sum(v.kv_blocks for v in swapped)
    total_cpu = cpu_used + draw(st.integers(0 if not cpu else 1, 400)) if cpu else 0
    return make_state(
        waiting=waiting,
        running=running,
        swapped=swapped,
        free_blocks=total - used,
        total_blocks=max(total, 1),
        free_cpu_blocks=total_cpu - cpu_used,
        total_cpu_blocks=total_cpu,
        token_budget=draw(st.integers(1, 4096)),
        max_num_seqs=n_run + draw(st.integers(0 if n_run else 1, 8)),
        block_size=bs,
        now_s=now,
        kv_block_bytes=draw(st.sampled_from([0, 1 << 20])) if cpu else 0,
        link_bytes_per_s=draw(st.sampled_from([0.0, 1e9, 6.4e10])) if cpu else 0.0,
    )


def build(name: str, state: StepState) -> Any:
    cls = available_policies()[name].load()
    extra = {}
    if getattr(cls, "needs_output_lengths", False):
        ids = [v.request_id for v in (*state.waiting, *state.running, *state.swapped)]
        extra["output_tokens"] = dict.fromkeys(ids, 300) or {"none": 1}
    return make_policy(cls, {}, name, extra=extra)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=states(), announce=st.booleans())
def test_every_decision_is_applicable(state: StepState, announce: bool) -> None:
    """Never more tokens than the budget, never a request it was not given, never a swap
    without a CPU tier, and everything ``check_decision`` checks, for every policy."""
    swap = has_cpu_tier(state)
    ids = {v.request_id for v in (*state.waiting, *state.running, *state.swapped)}
    for name in POLICIES:
        policy = build(name, state)
        if announce:  # as an engine would have: every request announced on arrival
            for v in (*state.waiting, *state.running, *state.swapped):
                policy.on_request_arrived(v, v.arrival_s)
        d = policy.schedule(state)
        check_decision(state, d, swap_supported=swap)
        assert d.total_tokens <= state.token_budget
        named = {*d.num_tokens, *d.admit, *d.resume, *d.preempt, *d.reject, *d.prefetch}
        assert named <= ids, name
        if not swap:
            assert not d.resume and not d.prefetch, name
            assert PreemptMode.SWAP not in d.preempt.values(), name


workloads = st.lists(
    st.tuples(
        st.floats(0.0, 3.0),  # arrival, s
        st.integers(1, 600),  # prompt tokens
        st.integers(1, 60),  # output tokens
        CLASSES,
    ),
    min_size=1,
    max_size=24,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=workloads,
    cpu=st.booleans(),
    budget=st.sampled_from([64, 512, 2048]),
    fraction=st.sampled_from([0.0, 0.005]),
)
def test_no_request_waits_beyond_the_aging_bound(
    spec: list[tuple[float, int, int, SLO]], cpu: bool, budget: int, fraction: float
) -> None:
    """Every wait (arrival or preemption to admission) is at most its aging bound (``aging_s``;
    a deadline class: at most ``aging_deadline_fraction`` of its deadline budget where that is
    longer, 3 s of BATCH's 600 s at 0.005), plus one step per request that can be ahead of it
    among the aged, plus the steps a running request needs to finish and free its seat (aged
    requests preempt nobody): its prefill in chunks of ``min_prefill_tokens`` and its output,
    one token a step. Every request finishes."""
    aging_s, step_s = 1.0, 0.05
    reqs = [
        Req(f"q{i}", arrival, prompt, output, slo)
        for i, (arrival, prompt, output, slo) in enumerate(spec)
    ]
    engine = EngineDouble(
        # demotion, not rejection (issue 18's default): the bound is about requests that wait
        SuperInferPolicy(
            aging_s=aging_s,
            aging_deadline_fraction=fraction,
            min_prefill_tokens=16,
            reject_hopeless=False,
        ),
        reqs,
        step_s=step_s,
        total_hbm_blocks=200,  # 3,200 tokens: live KV often exceeds it
        total_cpu_blocks=400 if cpu else 0,
        link_bytes_per_s=1e10 if cpu else 0.0,
        kv_block_bytes=1 << 20 if cpu else 0,
        token_budget=budget,
        max_num_seqs=8,
    )
    engine.run(max_steps=20_000)
    assert {r.where for r in reqs} == {"finished"}
    longest = max(-(-r.prompt // 16) + r.output for r in reqs)  # steps to finish, at worst
    for r in reqs:
        aged = max(aging_s, fraction * (r.slo.deadline_s or 0.0))
        bound = aged + (len(reqs) + 2 + longest) * step_s + 1e-9
        assert max(r.waits_s) <= bound, (r.rid, r.waits_s)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    olds=st.lists(st.floats(0.0, 5.0), min_size=1, max_size=6),
    fresh=st.integers(0, 6),
    budget=st.integers(1, 2048),
    fraction=st.sampled_from([0.0, 0.5, 0.02]),
)
def test_the_oldest_aged_request_is_admitted_whenever_it_fits(
    olds: list[float], fresh: int, budget: int, fraction: float
) -> None:
    """Per state: once a request has queued ``aging_s`` (a deadline class: and
    ``aging_deadline_fraction`` of its deadline budget since arrival), no other waiting request
    is admitted before it, and it is admitted at the first step with a seat, a token and its
    blocks. At 0.02, BATCH's 600 s gives 12 s: only the requests that arrived by 3 s are aged
    at 15 s; at 0.5 none is, and a fresh chat request (tier 0) goes first."""
    policy = SuperInferPolicy(aging_s=10.0, aging_deadline_fraction=fraction)
    views = [make_view(f"old{i}", prompt=64, slo=BATCH, arrival_s=t) for i, t in enumerate(olds)]
    views += [make_view(f"new{i}", prompt=64, arrival_s=14.9) for i in range(fresh)]
    for v in views:
        policy.on_request_arrived(v, v.arrival_s)
    d = policy.schedule(make_state(now_s=15.0, waiting=views, token_budget=budget))
    # the policy's own arithmetic: the deadline is held as an instant, arrival + 600 s
    aged = [
        i
        for i, t in enumerate(olds)
        if 15.0 - t >= 10.0 and 15.0 >= t + fraction * ((t + 600.0) - t)
    ]
    if aged:
        oldest = min(aged, key=lambda i: (olds[i], i))
        assert d.admit[0] == f"old{oldest}"
    elif fresh:
        assert d.admit[0].startswith("new")
