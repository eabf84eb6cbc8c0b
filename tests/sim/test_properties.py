"""Property tests of the KV pool, prefix cache and engine loop over random workloads and random
(valid) decisions, swaps and rejections included: blocks conserved, capacity never exceeded, no
request lost or duplicated, token counts exact."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from superinfer.adapters.hookspecs import hookimpl
from superinfer.adapters.manager import build_plugin_manager
from superinfer.policy_core.batching import fill_step
from superinfer.policy_core.types import (
    SLO,
    KVLocation,
    PreemptMode,
    ScheduleDecision,
    StepState,
)
from superinfer.policy_core.validation import PolicyError, check_decision
from superinfer.sim.engine import Simulator
from superinfer.sim.profiles import SIM_SGLANG, SIM_TRTLLM, SIM_VLLM
from superinfer.sim.request import RequestSpec, RequestStatus
from tests.sim.helpers import InvariantObserver, config

SLOS = (SLO("chat", ttft_ms=1000.0, tpot_ms=100.0), SLO("batch", deadline_s=600.0, priority=1))


class Chaos:
    """A policy that mixes fcfs with random swaps, resumes, prefetches and rejections, falling
    back to plain fcfs whenever its random decision would not pass the engine's check."""

    name = "chaos"

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    @hookimpl
    def superinfer_schedule(self, state: StepState) -> ScheduleDecision:
        base = fill_step(state, state.running, state.waiting)
        rng = self.rng
        preempt = dict(base.preempt)
        resume: tuple[str, ...] = ()
        prefetch: tuple[str, ...] = ()
        reject: dict[str, str] = {}
        tokens = dict(base.num_tokens)
        if state.total_cpu_blocks and state.running and rng.random() < 0.2:
            victim = rng.choice(state.running).request_id
            preempt[victim] = PreemptMode.SWAP
            tokens.pop(victim, None)
        if state.swapped and (rng.random() < 0.5 or not tokens):
            view = rng.choice(state.swapped)
            if rng.random() < 0.5 or not tokens:  # always make progress when idle
                resume = (view.request_id,)
                tokens[view.request_id] = min(view.pending_tokens, 1)
            elif view.kv_location is KVLocation.CPU:
                prefetch = (view.request_id,)
        if state.waiting and rng.random() < 0.05:
            rid = state.waiting[-1].request_id
            if rid not in base.admit:
                reject[rid] = "shed_for_test"
        decision = ScheduleDecision(
            num_tokens=tokens, admit=base.admit, preempt=preempt, resume=resume,
            prefetch=prefetch, reject=reject,
        )  # fmt: skip
        try:
            check_decision(state, decision, swap_supported=state.total_cpu_blocks > 0)
        except PolicyError:
            return base
        return decision


requests_st = st.lists(
    st.tuples(
        st.floats(0.0, 20.0),  # arrival
        st.integers(1, 700),  # prompt
        st.integers(1, 60),  # output
        st.lists(st.integers(0, 3), max_size=2),  # hash chain suffix (shared prefixes)
        st.integers(0, 1),  # SLO class
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    raw=requests_st,
    profile=st.sampled_from([SIM_VLLM, SIM_SGLANG, SIM_TRTLLM]),
    blocks=st.integers(60, 400),
    cpu_ratio=st.sampled_from([0.0, 0.5, 2.0]),
    seed=st.integers(0, 10_000),
)
def test_books_balance_under_random_decisions(raw, profile, blocks, cpu_ratio, seed) -> None:  # noqa: ANN001
    specs = []
    for i, (arrival, prompt, output, suffix, cls) in enumerate(sorted(raw)):
        # Prefix-chained hashes: a request's k-th block hash encodes its whole prefix.
        chain = (0, *suffix)
        hashes = tuple(hash(chain[: j + 1]) & 0xFFFF_FFFF for j in range(len(chain)))
        n_blocks = -(-prompt // 512)
        specs.append(
            RequestSpec(
                f"r{i}",
                arrival,
                prompt,
                output,
                output + 5,
                SLOS[cls],
                block_hashes=hashes[:n_blocks],
                hash_block_tokens=512,
            )  # fmt: skip
        )
    # capacity in tokens is what matters; pages of 1 token need proportionally more blocks
    blocks_scaled = blocks * 16 // profile.block_size_tokens
    pm = build_plugin_manager(Chaos(seed))
    sim = Simulator(
        config(profile=profile, num_gpu_blocks_override=blocks_scaled, cpu_kv_ratio=cpu_ratio),
        pm.hook,
    )
    observer = InvariantObserver()
    observer.sim = sim
    pm.register(observer)
    result = sim.run(specs)
    assert len(result.requests) == len(specs)
    assert len({r.request_id for r in result.requests}) == len(specs)
    for req in result.requests:
        assert req.status in (RequestStatus.FINISHED, RequestStatus.REJECTED), (
            req.status,
            req.reason,
        )
        if req.status is RequestStatus.FINISHED:
            assert req.generated_tokens == req.spec.output_tokens
            assert req.first_token_s is not None and req.finish_s is not None
            assert req.spec.arrival_s <= req.first_token_s <= req.finish_s
        else:
            assert req.reason in ("shed_for_test", "exceeds_kv_capacity")
    for rep in sim.replicas:  # everything given back at the end
        assert rep.own_hbm_blocks == rep.own_cpu_blocks == 0
        assert rep.cache.evictable_hbm_blocks == rep.cache.hbm_blocks
        rep.cache.check()
