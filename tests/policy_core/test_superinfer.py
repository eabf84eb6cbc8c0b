"""Exact decisions of the ``superinfer`` rotation scheduler on small hand-made states.

Every policy here runs on its step-time priors (no step was observed) and a cold length
estimator, so its estimates have closed forms: a step costs ``A + B * prefill_tokens`` s and a
request with ``L`` output tokens left under its cap is predicted to produce ``L / 2`` more.
"""

from __future__ import annotations

from collections import Counter

import pytest

from superinfer.policy_core.policies.superinfer import SuperInferPolicy, queues
from superinfer.policy_core.types import (
    SLO,
    KVLocation,
    PreemptMode,
    RequestView,
    ScheduleDecision,
    StepState,
    StepStats,
)
from superinfer.policy_core.validation import check_decision
from tests.factories import BATCH, CHAT, make_state, make_view
from tests.policy_core.engine_double import EngineDouble, Req

A, B = 0.02, 1e-4  # step-time priors: s per step, s per prefill token
SWAP, RECOMPUTE = PreemptMode.SWAP, PreemptMode.RECOMPUTE


def policy(**options: object) -> SuperInferPolicy:
    base: dict[str, object] = {
        "prior_step_s": A,
        "prior_prefill_token_s": B,
        "prior_decode_seq_s": 0.0,
        # demotion of hopeless requests, the default before issue 18; the default now rejects
        # them (test_hopeless_requests_are_rejected_by_default), tests that want it say so
        "reject_hopeless": False,
    }
    base.update(options)
    return SuperInferPolicy(**base)  # type: ignore[arg-type]


def test_hopeless_requests_are_rejected_by_default() -> None:
    assert SuperInferPolicy().reject_hopeless is True


def decide(p: SuperInferPolicy, state: StepState, *, swap: bool = False) -> ScheduleDecision:
    decision = p.schedule(state)
    check_decision(state, decision, swap_supported=swap)
    return decision


def arrive(p: SuperInferPolicy, *views: RequestView) -> None:
    for v in views:
        p.on_request_arrived(v, v.arrival_s)


def decoding(rid: str, prompt: int, generated: int, **kw: object) -> RequestView:
    """A running request in decode: its KV covers everything but the last sampled token; its
    first token came at 9.95 s unless ``first_token_s`` says otherwise."""
    kw.setdefault("first_token_s", 9.95)
    computed = prompt + generated - 1
    return make_view(rid, prompt=prompt, computed=computed, generated=generated, **kw)  # type: ignore[arg-type]


class TestTiers:
    def test_skip_join_and_class_tiers(self) -> None:
        p = policy(quantum_base_tokens=1000, quantum_growth=4.0)
        no_slo = SLO("best-effort")
        arrive(
            p,
            make_view("chat-short", prompt=1000),
            make_view("chat-long", prompt=1001),
            make_view("chat-huge", prompt=20_000),
            make_view("batch", prompt=10, slo=BATCH),
            make_view("other", prompt=10, slo=no_slo),
        )
        tiers = {rid: e.tier for rid, e in p._entries.items()}
        # quanta 1000, 4000, 16000, inf: a prompt skips every tier its prefill would exhaust
        assert tiers == {"chat-short": 0, "chat-long": 1, "chat-huge": 3, "batch": 2, "other": 3}

    def test_demotion_exactly_when_the_quantum_is_used(self) -> None:
        p = policy(quantum_base_tokens=64, quantum_growth=2.0)
        arrive(p, make_view("r", prompt=40))
        # service = computed tokens: 63 keeps tier 0, 64 uses its quantum of 64
        assert decide(p, make_state(running=[decoding("r", 40, 24)])).tiers == {}
        assert decide(p, make_state(running=[decoding("r", 40, 25)])).tiers == {"r": 1}
        # tier 1's quantum (128) counts from there: 64 + 128 = 192
        assert decide(p, make_state(running=[decoding("r", 40, 152)])).tiers == {}
        assert decide(p, make_state(running=[decoding("r", 40, 153)])).tiers == {"r": 2}


class TestPromotion:
    def _waiting_batch(self) -> tuple[SuperInferPolicy, RequestView, float]:
        p = policy(aging=False)
        view = make_view("b", prompt=1000, max_output=100, slo=BATCH)
        arrive(p, view)
        # estimate = prefill (B * 1000 + one chunk's A) + predicted output (100 / 2) * A
        estimate = (B * 1000 + A) + 50 * A
        return p, view, 600.0 - estimate  # the instant the estimate exceeds the slack

    def test_fires_exactly_when_the_estimate_exceeds_the_slack(self) -> None:
        p, view, crossing = self._waiting_batch()
        full = {"waiting": [view], "free_blocks": 0}  # it cannot be admitted: it stays queued
        before = decide(p, make_state(now_s=crossing - 1e-6, **full))  # type: ignore[arg-type]
        assert before.tiers == {"b": 2}  # its skip-join tier, reported once
        after = decide(p, make_state(now_s=crossing + 1e-6, **full))  # type: ignore[arg-type]
        assert after.tiers == {"b": 0}

    def test_margin_moves_the_crossing_earlier(self) -> None:
        p = policy(aging=False, promotion_margin_s=0.5)
        view = make_view("b", prompt=1000, max_output=100, slo=BATCH)
        arrive(p, view)
        crossing = 600.0 - (B * 1000 + A) - 50 * A - 0.5
        state = make_state(now_s=crossing - 1e-6, waiting=[view], free_blocks=0)
        assert decide(p, state).tiers == {"b": 2}
        state = make_state(now_s=crossing + 1e-6, waiting=[view], free_blocks=0)
        assert decide(p, state).tiers == {"b": 0}

    def test_off_means_never(self) -> None:
        p = policy(aging=False, promotion=False, best_effort_demotion=False)
        view = make_view("b", prompt=1000, max_output=100, slo=BATCH)
        arrive(p, view)
        assert decide(p, make_state(now_s=599.9, waiting=[view], free_blocks=0)).tiers == {"b": 2}

    def test_a_promoted_swapped_request_is_prefetched(self) -> None:
        p = policy(aging=False)
        view = make_view("s", prompt=1000, max_output=100, slo=BATCH, location=KVLocation.CPU)
        swapped = make_view(
            "s",
            prompt=1000,
            computed=1000,
            generated=1,
            max_output=100,
            slo=BATCH,
            location=KVLocation.CPU,
        )
        arrive(p, view)
        state = make_state(
            now_s=599.5,
            swapped=[swapped],
            # room for its 63 blocks, but not for them and the watermark (1 block) a resume must
            # leave: only the prefetch can start
            free_blocks=63,
            total_cpu_blocks=1000,
            free_cpu_blocks=900,
            kv_block_bytes=1_000_000,
            link_bytes_per_s=1e10,
        )
        d = decide(p, state, swap=True)
        assert d.prefetch == ("s",) and d.resume == ()


class TestHopeless:
    def test_a_missed_ttft_stays_in_its_tier_behind_every_feasible_request(self) -> None:
        p = policy()
        late = make_view("late", prompt=100, arrival_s=8.0)  # TTFT deadline 9.0 < now 10.0
        fresh = make_view("fresh", prompt=100, arrival_s=9.9)  # deadline 10.9: feasible
        arrive(p, late, fresh)
        # a budget of 100 tokens fits one prompt: the feasible one goes first although the
        # late one's deadline is earlier (EDF would serve the lost cause)
        d = decide(p, make_state(waiting=[late, fresh], token_budget=100))
        assert d.admit == ("fresh",) and d.tiers == {}  # both stay in tier 0
        assert p._entries["late"].best_effort and not p._entries["fresh"].best_effort
        # and it still comes before lower-tier work
        q = policy()
        batch = make_view("batch", prompt=100, slo=BATCH, arrival_s=0.0)
        arrive(q, late, batch)
        d = decide(q, make_state(waiting=[batch, late], token_budget=100))
        assert d.admit == ("late",)

    def test_or_goes_to_the_last_tier(self) -> None:
        p = policy(best_effort_tier="last")
        late = make_view("late", prompt=100, arrival_s=8.0)
        arrive(p, late)
        d = decide(p, make_state(waiting=[late], free_blocks=0))
        assert d.tiers == {"late": 3} and p._entries["late"].best_effort

    def test_or_is_rejected_under_admission_control(self) -> None:
        p = policy(reject_hopeless=True)
        late = make_view("late", prompt=100, arrival_s=8.0)
        fresh = make_view("fresh", prompt=100, arrival_s=9.9)  # deadline 10.9: feasible
        arrive(p, late, fresh)
        d = decide(p, make_state(waiting=[late, fresh], free_blocks=0))
        assert dict(d.reject) == {"late": "slo_unattainable"}
        assert p.stats()["rejected"] == 1 and p.stats()["hopeless_kept"] == 0

    def test_but_only_under_queueing_pressure(self) -> None:
        p = policy(reject_hopeless=True)
        late = make_view("late", prompt=100, arrival_s=8.0)  # TTFT deadline 9.0 < now 10.0
        batch = make_view("batch", prompt=100, slo=BATCH, arrival_s=0.0)  # a lower tier
        arrive(p, late, batch)
        # no request of its tier or a higher one, waiting or running, could still make its
        # target: it keeps its place (first, before the lower tier) instead of being rejected
        d = decide(p, make_state(waiting=[batch, late], token_budget=100))
        assert dict(d.reject) == {} and d.admit == ("late",)
        assert p.stats()["hopeless_kept"] == 1 and not p._entries["late"].best_effort
        # kept, it is checked again a step later, and rejected once a feasible peer waits
        q = policy(reject_hopeless=True)
        arrive(q, late)
        d = decide(q, make_state(waiting=[late], free_blocks=0))
        assert dict(d.reject) == {} and d.admit == ()
        fresh = make_view("fresh", prompt=100, arrival_s=10.05)
        arrive(q, fresh)
        d = decide(q, make_state(now_s=10.1, waiting=[late, fresh], free_blocks=0))
        assert dict(d.reject) == {"late": "slo_unattainable"}
        # or a running chat still within its targets (it would share the step with it)
        r = policy(reject_hopeless=True)
        chat = decoding("chat", 64, 2, arrival_s=9.0, first_token_s=9.5)
        arrive(r, late, chat)
        d = decide(r, make_state(waiting=[late], running=[chat]))
        assert dict(d.reject) == {"late": "slo_unattainable"}

    def test_a_prompt_too_long_for_its_ttft_is_hopeless_on_arrival(self) -> None:
        p = policy(best_effort_tier="last")
        # even alone, in one step: B * 20000 + A = 2.02 s > 1 s of slack
        huge = make_view("huge", prompt=20_000, arrival_s=10.0)
        arrive(p, huge)
        d = decide(p, make_state(waiting=[huge], free_blocks=0))
        assert d.tiers == {"huge": 3}


class TestAging:
    def test_an_aged_request_is_served_before_every_tier(self) -> None:
        def run(now_s: float) -> tuple[ScheduleDecision, SuperInferPolicy]:
            p = policy(aging_s=10.0, aging_deadline_fraction=0.0)  # BATCH ages at aging_s
            old = make_view("old", prompt=100, slo=BATCH, arrival_s=0.0)
            chat = make_view("chat", prompt=100, arrival_s=9.5)
            arrive(p, old, chat)
            # a budget of 100 tokens fits one of the two prompts
            state = make_state(now_s=now_s, waiting=[old, chat], token_budget=100)
            return decide(p, state), p

        d, p = run(9.99)
        assert d.admit == ("chat",) and d.tiers == {"old": 2}  # tier 0 before tier 2
        d, p = run(10.0)
        # aged: served first, in tier 0 (which the engine already shows, so no tier update)
        assert d.admit == ("old",) and d.tiers == {} and p._entries["old"].tier == 0

    def test_a_deadline_class_ages_at_its_fraction_of_the_deadline(self) -> None:
        # BATCH's 600 s deadline at fraction 0.5: aged at 300 s after arrival, not at aging_s
        def run(now_s: float, **opts: object) -> ScheduleDecision:
            p = policy(aging_s=10.0, **opts)
            old = make_view("old", prompt=100, slo=BATCH, arrival_s=0.0)
            chat = make_view("chat", prompt=100, arrival_s=now_s - 0.5)
            arrive(p, old)
            # the check set at a first call (5 s) is the one due: nothing else changes
            decide(p, make_state(now_s=5.0, waiting=[old], token_budget=0))
            arrive(p, chat)
            state = make_state(now_s=now_s, waiting=[old, chat], token_budget=100)
            return decide(p, state)

        assert run(10.0, aging_deadline_fraction=0.0).admit == ("old",)  # off: at aging_s
        assert run(10.0, aging_deadline_fraction=0.5).admit == ("chat",)
        assert run(299.99, aging_deadline_fraction=0.5).admit == ("chat",)
        assert run(300.0, aging_deadline_fraction=0.5).admit == ("old",)
        # a budget shorter than aging_s leaves aging_s the bound: 0.01 * 600 = 6 s < 10 s
        assert run(9.99, aging_deadline_fraction=0.01).admit == ("chat",)
        assert run(10.0, aging_deadline_fraction=0.01).admit == ("old",)

    def test_aging_deadline_fraction_must_be_below_one(self) -> None:
        with pytest.raises(
            ValueError, match=r"aging_deadline_fraction must be in \[0, 1\), got 1.0"
        ):
            policy(aging_deadline_fraction=1.0)

    def test_aged_requests_take_the_next_seat_but_preempt_nobody(self) -> None:
        p = policy(aging_s=10.0, aging_deadline_fraction=0.0)  # BATCH ages at aging_s
        old = make_view("old", prompt=100, slo=BATCH, arrival_s=0.0)
        chat = decoding("chat", 64, 2, arrival_s=9.0, first_token_s=9.5)
        newer = make_view("newer", prompt=64, arrival_s=9.9)
        arrive(p, old, make_view("chat", prompt=64, arrival_s=9.0), newer)
        state = make_state(now_s=10.0, waiting=[old, newer], running=[chat], max_num_seqs=1)
        d = decide(p, state)
        assert d.admit == () and dict(d.preempt) == {} and d.num_tokens == {"chat": 1}
        # the chat request finished: the seat goes to the aged request, not the newer chat
        p.on_request_finished(chat, 10.1)
        d = decide(p, make_state(now_s=10.1, waiting=[old, newer], max_num_seqs=1))
        assert d.admit == ("old",)

    def test_an_aged_request_is_never_preempted_until_its_first_token(self) -> None:
        p = policy(aging_s=10.0, aging_deadline_fraction=0.0, quantum_base_tokens=50)
        old = make_view("old", prompt=1000, slo=BATCH, arrival_s=0.0)
        arrive(p, old)
        d = decide(p, make_state(now_s=10.0, waiting=[old], token_budget=100))
        assert d.admit == ("old",) and p._entries["old"].aged
        # mid-prefill, past every quantum: not demoted, and a new chat request waits for it
        running = make_view("old", prompt=1000, computed=100, slo=BATCH, arrival_s=0.0)
        chat = make_view("chat", prompt=64, arrival_s=10.0)
        arrive(p, chat)
        state = make_state(now_s=10.05, waiting=[chat], running=[running], max_num_seqs=1)
        d = decide(p, state)
        assert dict(d.preempt) == {} and d.admit == () and "old" not in d.tiers
        assert p._entries["old"].tier == 0
        # its first token ends the protection: it drops back to its tier's rules
        done = make_view(
            "old", prompt=1000, computed=1000, generated=1, slo=BATCH, arrival_s=0.0,
            first_token_s=10.2,
        )  # fmt: skip
        decide(p, make_state(now_s=10.3, waiting=[chat], running=[done], max_num_seqs=2))
        assert not p._entries["old"].aged


class TestTPOTProtection:
    def test_prefill_is_sized_to_the_smallest_tpot_allowance(self) -> None:
        p = policy(ttft_boost=False)
        # generated 2 tokens, first at 9.9: allowance 0.1 * 2 - (10.0 - 9.9) = 0.1 s
        dec = decoding("dec", 32, 2, first_token_s=9.9)
        new = make_view("new", prompt=2000, arrival_s=10.0)
        arrive(p, make_view("dec", prompt=32), new)
        d = decide(p, make_state(running=[dec], waiting=[new]))
        allowance = 0.1 * 2 - (10.0 - 9.9)
        expected = int((allowance * 0.9 - (A + 0.0 * 1)) / B)
        assert dict(d.num_tokens) == {"dec": 1, "new": expected}

    def test_the_allowance_is_planned_to_a_share_of_the_tpot_target(self) -> None:
        # tpot_plan_share 0.8: the allowance is 0.08 * 3 - (10.0 - 9.85) = 0.09 s, not
        # 0.1 * 3 - 0.15 = 0.15 s; the step's prefill fits 0.9 of it after the decode
        p = policy(ttft_boost=False, tpot_plan_share=0.8)
        dec = decoding("dec", 32, 3, first_token_s=9.85)
        new = make_view("new", prompt=2000, arrival_s=10.0)
        arrive(p, make_view("dec", prompt=32), new)
        d = decide(p, make_state(running=[dec], waiting=[new]))
        allowance = 0.1 * 0.8 * 3 - (10.0 - 9.85)
        expected = int((allowance * 0.9 - A) / B)
        assert dict(d.num_tokens) == {"dec": 1, "new": expected}
        full = policy(ttft_boost=False)
        arrive(full, make_view("dec", prompt=32), new)
        d_full = decide(full, make_state(running=[dec], waiting=[new]))
        assert d_full.num_tokens["new"] == int(((0.1 * 3 - (10.0 - 9.85)) * 0.9 - A) / B)
        assert d_full.num_tokens["new"] > expected

    def test_without_latency_decodes_the_whole_budget_is_used(self) -> None:
        p = policy()
        batch = decoding("batch", 32, 2, slo=BATCH, first_token_s=9.9)
        new = make_view("new", prompt=5000, slo=BATCH, arrival_s=10.0)
        arrive(p, make_view("batch", prompt=32, slo=BATCH), new)
        d = decide(p, make_state(running=[batch], waiting=[new], free_blocks=1000))
        assert dict(d.num_tokens) == {"batch": 1, "new": 2047}

    def test_a_ttft_urgent_prefill_borrows_from_decodes_with_credit(self) -> None:
        # The decode has 0.1 s banked and will produce about 500 more tokens at A < tpot each,
        # credit enough for one long step now.
        p = policy(min_prefill_tokens=1)
        for i in range(40):  # teach the estimator that chat outputs are 500 tokens long
            p.on_request_finished(make_view(f"f{i}", generated=500), 0.0)
        dec = decoding("dec", 32, 2, first_token_s=9.9, max_output=1000)
        urgent = make_view("urgent", prompt=2400, arrival_s=9.3)
        arrive(p, make_view("dec", prompt=32), urgent)
        plain = decide(
            policy(ttft_boost=False),
            make_state(running=[dec], waiting=[urgent], token_budget=4096, free_blocks=1000),
        )
        boosted = decide(
            p, make_state(running=[dec], waiting=[urgent], token_budget=4096, free_blocks=1000)
        )
        # TPOT alone allows 700 tokens (as above); 0.3 s of slack fits 3 steps of A after the
        # prompt's B * 2400 = 0.24 s, so it needs chunks of 800, which the credit covers
        assert plain.num_tokens["urgent"] == 700 and boosted.num_tokens["urgent"] == 800

    def test_with_ttft_boost_whole_a_prefill_the_credit_covers_runs_whole(self) -> None:
        # As above, but the option runs the 2,400 tokens in this step: the decode's credit (0.1 s
        # banked plus about 500 tokens at 0.1 - A s each) covers 2,400 x B = 0.24 s
        def boosted(*, whole: bool, later: int) -> int:
            p = policy(min_prefill_tokens=1, ttft_boost_whole=whole)
            for i in range(40):
                p.on_request_finished(make_view(f"f{i}", generated=later), 0.0)
            dec = decoding("dec", 32, 2, first_token_s=9.9, max_output=1000)
            urgent = make_view("urgent", prompt=2400, arrival_s=9.3)
            arrive(p, make_view("dec", prompt=32), urgent)
            state = make_state(running=[dec], waiting=[urgent], token_budget=4096,
                               free_blocks=1000)  # fmt: skip
            return decide(p, state).num_tokens["urgent"]

        assert boosted(whole=True, later=500) == 2400
        assert boosted(whole=False, later=500) == 800
        # outputs of 3 tokens leave the decode one token to come, so only its 0.1 s banked:
        # 0.9 x 0.1 - A = 0.07 s, 700 tokens, short of 2,400 (and of the plan's 800): the step
        # gets what TPOT alone allows, as without the option
        assert boosted(whole=True, later=3) == boosted(whole=False, later=3) == 700


class TestTPOTProtectionWithoutMixedBatches:
    """``StepState.mixed_batches = False`` (SGLang's prefill-first batches): a prefill step runs
    alone, so it and the decode step after it must fit the smallest TPOT allowance."""

    def _decide(self, first_token_s: float, **options: object) -> ScheduleDecision:
        p = policy(**{"prior_decode_seq_s": 0.0, **options})
        dec = decoding("dec", 32, 2, first_token_s=first_token_s)
        new = make_view("new", prompt=2000, arrival_s=10.0)
        arrive(p, make_view("dec", prompt=32), new)
        state = make_state(running=[dec], waiting=[new], mixed_batches=False)
        return decide(p, state)

    def test_the_prefill_step_and_the_next_decode_step_fit_the_allowance(self) -> None:
        # allowance 0.1 * 2 - (10.0 - 9.9) = 0.1 s; 0.09 s less a decode step (A) and the
        # prefill step's own A: (0.09 - 0.04) / B = 500 tokens (mixed: 700, test above)
        d = self._decide(9.9)
        allowance = 0.1 * 2 - (10.0 - 9.9)
        expected = int((allowance * 0.9 - A - A) / B)
        assert expected == 500 and dict(d.num_tokens) == {"dec": 1, "new": expected}

    def test_below_min_prefill_tokens_the_step_decodes_and_the_boost_stays_off(self) -> None:
        # allowance 0.2 - 0.15 = 0.05 s: (0.045 - 0.04) / B = 50 tokens < 256: no prefill step,
        # though the new request's TTFT is due (a boost would borrow on a mixed engine)
        d = self._decide(9.85)
        assert dict(d.num_tokens) == {"dec": 1} and d.admit == ()
        mixed = policy(ttft_boost=False)
        dec = decoding("dec", 32, 2, first_token_s=9.85)
        new = make_view("new", prompt=2000, arrival_s=10.0)
        arrive(mixed, make_view("dec", prompt=32), new)
        floor = decide(mixed, make_state(running=[dec], waiting=[new]))
        assert dict(floor.num_tokens) == {"dec": 1, "new": 256}  # min_prefill_tokens

    @staticmethod
    def _boosted(later: int, boosts: list[int] | None = None, **options: object) -> int:
        """The urgent chat's tokens in a step without mixed batches, beside one decode (0.1 s
        banked) whose requests' outputs are ``later`` tokens long (``boosts`` gets the
        policy's ``ttft_boosts`` count after the step)."""
        p = policy(min_prefill_tokens=1, **options)
        for i in range(40):
            p.on_request_finished(make_view(f"f{i}", generated=later), 0.0)
        dec = decoding("dec", 32, 2, first_token_s=9.9, max_output=1000)
        urgent = make_view("urgent", prompt=2400, arrival_s=9.3)
        arrive(p, make_view("dec", prompt=32), urgent)
        state = make_state(running=[dec], waiting=[urgent], token_budget=4096, free_blocks=1000,
                           mixed_batches=False)  # fmt: skip
        tokens = decide(p, state).num_tokens["urgent"]
        if boosts is not None:
            boosts.append(p.stats()["ttft_boosts"])
        return tokens

    def test_the_policy_counts_the_steps_the_ttft_boost_grew(self) -> None:
        counts: list[int] = []
        assert self._boosted(500, counts) == 2400  # the boost grew 500 -> 2,400: counted
        assert self._boosted(3, counts) == 500  # the credit fell short: not counted
        assert self._boosted(500, counts, ttft_boost_unmixed=False) == 500  # no boost
        assert counts == [1, 0, 0]

    def test_ttft_boost_unmixed_runs_an_urgent_prefill_whole_or_not_at_all(self) -> None:
        # the decode's credit (0.1 s banked plus about 500 tokens at 0.1 - A s each) covers the
        # 2,400 tokens' 0.24 s, the prefill step's A and the decode step's A: all in this step
        assert self._boosted(500, ttft_boost_unmixed=True) == self._boosted(500) == 2400
        # without the option (on by default) the boost stays off: TPOT alone allows
        # (0.09 - A - A) / B
        assert self._boosted(500, ttft_boost_unmixed=False) == 500
        # 3-token outputs leave one token to come, so only 0.1 s of credit: 500 tokens, short
        # of 2,400; no chunk paced to the plan (a mixed engine's 800), the step keeps its 500
        assert self._boosted(3) == self._boosted(3, ttft_boost_unmixed=False) == 500

    def test_the_unmixed_boost_counts_future_tokens_at_the_time_between_a_decodes_tokens(
        self,
    ) -> None:
        # reports of a 0.03 s decode step, then a 0.09 s prefill step alone (no decode token),
        # with decode_interval_memory (and credit_step_memory) 2: the mean step is 0.03 +
        # (0.09 - 0.03) / 2 = 0.06 s, the time between a decode's tokens (0.06 s) /
        # (1 + (0 - 1) / 2 = 0.5 steps) = 0.12 s,
        # over the 0.1 s TPOT: no future credit, so 0.1 s banked covers 500 tokens, not 2,400
        def stats(duration_s: float, decode_tokens: int) -> StepStats:
            return StepStats(9.0, 0, duration_s, 1, 0, decode_tokens, 1, 0, 0, 100)

        reports = (stats(0.03, 1), stats(0.09, 0))
        learnt = policy(ttft_boost_unmixed=True, decode_interval_memory=2, credit_step_memory=2)
        for r in reports:
            learnt.on_step_finished(r)
        assert learnt._credit_step_s == pytest.approx(0.06, abs=1e-15)
        assert learnt._decode_interval_s(0.0) == pytest.approx(0.12, abs=1e-15)
        assert learnt._interval_means == pytest.approx((0.06, 0.5), abs=1e-15)
        # the decision, on the means alone (reports also refit the step-time model)
        p = policy(min_prefill_tokens=1, ttft_boost_unmixed=True, credit_step_memory=2)
        p._credit_step_s, p._interval_means = learnt._credit_step_s, learnt._interval_means
        for i in range(40):
            p.on_request_finished(make_view(f"f{i}", generated=500), 0.0)
        dec = decoding("dec", 32, 2, first_token_s=9.9, max_output=1000)
        urgent = make_view("urgent", prompt=2400, arrival_s=9.3)
        arrive(p, make_view("dec", prompt=32), urgent)
        state = make_state(running=[dec], waiting=[urgent], token_budget=4096, free_blocks=1000,
                           mixed_batches=False)  # fmt: skip
        assert decide(p, state).num_tokens["urgent"] == 500
        p_mixed = policy(min_prefill_tokens=1, ttft_boost_whole=True, credit_step_memory=2)
        p_mixed._credit_step_s, p_mixed._interval_means = p._credit_step_s, p._interval_means
        for i in range(40):
            p_mixed.on_request_finished(make_view(f"f{i}", generated=500), 0.0)
        arrive(p_mixed, make_view("dec", prompt=32), urgent)
        mixed = make_state(running=[dec], waiting=[urgent], token_budget=4096, free_blocks=1000)
        # with mixed batches the credit counts on the mean step (0.06 s): the whole prompt
        assert decide(p_mixed, mixed).num_tokens["urgent"] == 2400
        # the same reports with decode_interval_memory 20 (weight 0.05): 0.03 + 0.05 x 0.06 =
        # 0.033 s over 0.95 steps, 0.0347 s between tokens: the credit covers the 2,400 tokens;
        # with the default 2,000, (0.03 + 0.06 / 2000) s over 1 - 1 / 2000 steps; the interval
        # does not read credit_step_memory
        fast = policy(ttft_boost_unmixed=True, decode_interval_memory=20, credit_step_memory=2)
        slow, off = policy(), policy(ttft_boost_unmixed=False)
        for r in reports:
            for learner in (fast, slow, off):
                learner.on_step_finished(r)
        assert fast._decode_interval_s(0.0) == pytest.approx(0.033 / 0.95, abs=1e-15)
        assert slow._decode_interval_s(0.0) == pytest.approx(0.03003 / 0.9995, abs=1e-15)
        assert off._interval_means == (0.0, 0.0)  # kept only under the option, its one reader
        assert self._boosted(500, ttft_boost_unmixed=True) == 2400
        assert policy()._decode_interval_s(0.25) == 0.25  # no report yet: the fallback

    @staticmethod
    def _unmixed(lengths: list[int], arrival_s: float, **options: object) -> int:
        """``_boosted`` with the option on, finished outputs of ``lengths`` tokens and the
        urgent chat arriving at ``arrival_s`` (TTFT 1 s; the step is at 10 s)."""
        p = policy(min_prefill_tokens=1, ttft_boost_unmixed=True, **options)
        for i, n in enumerate(lengths):
            p.on_request_finished(make_view(f"f{i}", generated=n), 0.0)
        dec = decoding("dec", 32, 2, first_token_s=9.9, max_output=1000)
        urgent = make_view("urgent", prompt=2400, arrival_s=arrival_s)
        arrive(p, make_view("dec", prompt=32), urgent)
        state = make_state(running=[dec], waiting=[urgent], token_budget=4096, free_blocks=1000,
                           mixed_batches=False)  # fmt: skip
        return decide(p, state).num_tokens["urgent"]

    def test_the_unmixed_boost_borrows_only_where_waiting_would_miss(self) -> None:
        # 0.1 s banked must reach (0.26 s prefill step + 0.02 s decode step) / 0.9 = 0.3111 s:
        # 0.2111 s short, regained at 0.1 - 0.02 s per token, one token per 0.02 s (no reports:
        # the fallback interval), so after 0.0528 s; the prefill then ends at 10.3128 s
        worst, regrow, typical, pending = 0.1, 0.1 - A, A, 2400
        short = (A + B * pending + A) / 0.9 - worst
        end = 10.0 + short / regrow * typical + A + B * pending
        assert end == pytest.approx(10.312777777777778, abs=1e-12)
        # a chat arriving at 9.312 s is due at 10.312 s: waiting would miss, the boost runs it
        # whole; at 9.314 s it can wait, and the step keeps the TPOT allowance's 500 tokens
        assert self._unmixed([500] * 40, 9.312) == 2400
        assert self._unmixed([500] * 40, 9.314) == 500
        # the threshold sits where the arithmetic above says, on both sides within 1 ms
        assert self._unmixed([500] * 40, end - 1.0 - 1e-3) == 2400
        assert self._unmixed([500] * 40, end - 1.0 + 1e-3) == 500

    def test_the_unmixed_boost_counts_future_tokens_at_its_own_quantile(self) -> None:
        # outputs of 3 tokens (2 of 40) or 500: a 2-token decode's remaining count at the 0.05
        # quantile is the 2nd shortest (index int(0.05 * 39) = 1) -> 3 - 2 = 1 token: no future
        # credit, 0.1 s banked covers 500 tokens; at 0.2 (index 7) 498 tokens: the whole 2,400
        lengths = [3, 3] + [500] * 38
        assert self._unmixed(lengths, 9.3) == 500
        assert self._unmixed(lengths, 9.3, unmixed_credit_quantile=0.2) == 2400
        # credit_quantile (the mixed engines' boost) does not move it
        assert self._unmixed(lengths, 9.3, credit_quantile=0.2) == 500
        p = policy(credit_quantile=0.2)
        for i, n in enumerate(lengths):
            p.on_request_finished(make_view(f"f{i}", generated=n), 0.0)
        dec = decoding("dec", 32, 2, max_output=1000)
        assert (p.credit_tokens(dec), p.credit_tokens(dec, 0.05)) == (498.0, 1.0)

    @pytest.mark.parametrize(("share", "want"), [(0.125, 32), (0.5, 128), (1.0, 255)])
    def test_the_floor_is_at_most_a_share_of_a_small_token_budget(
        self, share: float, want: int
    ) -> None:
        # the hf engine's 256-token steps, a decode with no TPOT allowance left (0.1 * 2 - 0.2):
        # the step still prefills min(256, share * 256) tokens (1/8 by default: 32; at 1.0 the
        # 255 the decode leaves of the budget)
        p = policy(ttft_boost=False, min_prefill_budget_share=share)
        dec = decoding("dec", 32, 2, first_token_s=9.8)
        new = make_view("new", prompt=2000, arrival_s=10.0)
        arrive(p, make_view("dec", prompt=32), new)
        d = decide(p, make_state(running=[dec], waiting=[new], token_budget=256))
        assert dict(d.num_tokens) == {"dec": 1, "new": want}

    @pytest.mark.parametrize(
        ("step_s", "first_s", "want"),
        [(0.1, 9.8, 32), (0.0999, 9.8, 0), (0.02, 9.8255, 0), (0.02, 9.8265, 38), (0.02, 9.9, 700)],
    )
    def test_the_floor_yields_while_decoding_alone_banks_allowance(
        self, step_s: float, first_s: float, want: int
    ) -> None:
        # prefill_floor_yields: the chat decode's planned TPOT is 0.1 s. A step of it alone
        # (the prior step time, no per-decode cost) of 0.1 s banks nothing: the floor holds
        # (32 of the 256-token budget); at 0.0999 s it banks 0.1 ms a step, and the prefill
        # waits (0 tokens, not the floor). An allowance of (0.0255 * 0.9 - 0.02) / 1e-4 = 29
        # tokens, under the floor, gives none either; over it, tokens run as without the
        # option: (0.0265 * 0.9 - 0.02) / 1e-4 = 38, and (0.1 * 0.9 - 0.02) / 1e-4 = 700 of a
        # 2,048-token budget
        opts = {"ttft_boost": False, "prefill_floor_yields": True, "prior_step_s": step_s}
        p = policy(**opts)
        dec = decoding("dec", 32, 2, first_token_s=first_s)
        new = make_view("new", prompt=2000, arrival_s=10.0)
        arrive(p, make_view("dec", prompt=32), new)
        budget = 2048 if want > 38 else 256
        d = decide(p, make_state(running=[dec], waiting=[new], token_budget=budget))
        assert dict(d.num_tokens) == ({"dec": 1, "new": want} if want else {"dec": 1})
        # without the option the floor holds in each (0 and 29 -> 32)
        p = policy(**{**opts, "prefill_floor_yields": False})
        arrive(p, make_view("dec", prompt=32), new)
        d = decide(p, make_state(running=[dec], waiting=[new], token_budget=budget))
        assert dict(d.num_tokens) == {"dec": 1, "new": max(want, 32)}

    def test_a_yielding_floor_leaves_an_urgent_chat_its_boost(self) -> None:
        # a decode with nothing banked (the floor yields) and about 500 tokens to come, a chat
        # of 2,400 tokens due at 10.3 s: the TTFT boost grows its chunk from the decode's credit
        # to the 800 of the plan (test_a_ttft_urgent_prefill_borrows_from_decodes_with_credit),
        # as without the option
        def chunk(yields: bool) -> tuple[int, int]:
            p = policy(prefill_floor_yields=yields)
            for i in range(40):
                p.on_request_finished(make_view(f"f{i}", generated=500), 0.0)
            dec = decoding("dec", 32, 2, first_token_s=9.8, max_output=1000)
            urgent = make_view("urgent", prompt=2400, arrival_s=9.3)
            arrive(p, make_view("dec", prompt=32), urgent)
            state = make_state(running=[dec], waiting=[urgent], token_budget=4096,
                               free_blocks=1000)  # fmt: skip
            return decide(p, state).num_tokens["urgent"], p.stats()["ttft_boosts"]

        assert chunk(True) == chunk(False) == (800, 1)

    @pytest.mark.parametrize(
        ("prompt", "later", "want"), [(300, 500, 128), (40, 500, 40), (300, 3, 0)]
    )
    def test_a_yielding_floor_boosts_a_floor_or_nothing(
        self, prompt: int, later: int, want: int
    ) -> None:
        # hf's 256-token steps with the floor at 128 (share 0.5); the decode's allowance,
        # 0.0255 s (planned TPOT 0.1 s, 2 tokens, first at 9.8255 s), gives (0.0255 * 0.9 - A)
        # / B = 29 tokens, under the floor: the floor yields (0). A chat due at 10.3 s: its
        # plan's chunk, 300 tokens over the 7 steps of A in 0.6 of its 0.3 s slack, is 43
        # tokens (40 over 8: 5); the boost gives a floor's worth, 128, or all of a shorter
        # prompt, 40, where the decode's credit covers it (about 500 tokens to come), and
        # nothing where it does not (3 to come: credit is the 29 tokens banked), where it once
        # ran the paced 43 and 5 and the 29. Without the option the floor, 128, runs each.
        def tokens(yields: bool) -> int:
            p = policy(prefill_floor_yields=yields, min_prefill_budget_share=0.5)
            for i in range(40):
                p.on_request_finished(make_view(f"f{i}", generated=later), 0.0)
            dec = decoding("dec", 32, 2, first_token_s=9.8255, max_output=1000)
            urgent = make_view("urgent", prompt=prompt, arrival_s=9.3)
            arrive(p, make_view("dec", prompt=32), urgent)
            state = make_state(running=[dec], waiting=[urgent], token_budget=256,
                               free_blocks=1000)  # fmt: skip
            return decide(p, state).num_tokens.get("urgent", 0)

        assert tokens(True) == want
        assert tokens(False) == min(128, prompt)


class TestTTFTReserveWithoutMixedBatches:
    """Without mixed batches, a prefill step with no TTFT-class prefill pending leaves the
    decodes the time to prefill the ``ttft_reserve_quantile`` of recent chat prompts."""

    def _decide(
        self, waiting: RequestView, mixed: bool = False, **opts: object
    ) -> ScheduleDecision:
        p = policy(**{"prior_decode_seq_s": 0.0, **opts})
        # 16 chat prompts seen (the estimator's min_samples), 80..230 tokens, then gone
        for i in range(16):
            seen = make_view(f"seen{i}", prompt=80 + 10 * i, arrival_s=1.0)
            arrive(p, seen)
            p.on_request_aborted(seen, 1.0, "client")
        dec = decoding("dec", 32, 2, first_token_s=9.9)  # allowance 0.2 - 0.1 = 0.1 s
        arrive(p, make_view("dec", prompt=32), waiting)
        state = make_state(running=[dec], waiting=[waiting], mixed_batches=mixed)
        return decide(p, state)

    def test_a_batch_prefill_step_leaves_the_reserve(self) -> None:
        bat = make_view("bat", prompt=2000, slo=BATCH, arrival_s=10.0)
        d = self._decide(bat, ttft_reserve_quantile=0.5)
        # the 0.5 quantile of 80..230 is the 8th of 16 (index int(0.5 * 15) = 7): 150 tokens,
        # B * 150 = 0.015 s held back: ((0.1 - 0.015) * 0.9 - A - A) / B = 365 tokens
        expected = int(((0.1 - B * 150) * 0.9 - A - A) / B)
        assert expected == 365 and dict(d.num_tokens) == {"dec": 1, "bat": expected}
        # quantile 0 (no reserve): the 500 tokens of the plain rule
        off = self._decide(bat, ttft_reserve_quantile=0.0)
        assert dict(off.num_tokens) == {"dec": 1, "bat": 500}

    def test_a_chat_prefill_or_a_mixed_engine_gets_the_whole_allowance(self) -> None:
        chat = make_view("chat", prompt=2000, arrival_s=10.0)
        assert dict(self._decide(chat).num_tokens) == {"dec": 1, "chat": 500}
        bat = make_view("bat", prompt=2000, slo=BATCH, arrival_s=10.0)
        mixed = self._decide(bat, mixed=True, ttft_boost=False)
        assert dict(mixed.num_tokens) == {"dec": 1, "bat": 700}  # as without a reserve

    def test_ttft_reserve_mixed_holds_it_back_on_a_mixed_engine_too(self) -> None:
        bat = make_view("bat", prompt=2000, slo=BATCH, arrival_s=10.0)
        d = self._decide(
            bat, mixed=True, ttft_boost=False, ttft_reserve_quantile=0.5, ttft_reserve_mixed=True
        )
        # the decodes run in the step, so only their step is charged (no prefill step's own A):
        # ((0.1 - B * 150) * 0.9 - A) / B = 565 tokens, of the 700 without the reserve
        expected = int(((0.1 - B * 150) * 0.9 - A) / B)
        assert expected == 565 and dict(d.num_tokens) == {"dec": 1, "bat": expected}
        # a chat prefill pending: the whole allowance, as without the option
        chat = make_view("chat", prompt=2000, arrival_s=10.0)
        both = self._decide(chat, mixed=True, ttft_boost=False, ttft_reserve_mixed=True)
        assert dict(both.num_tokens) == {"dec": 1, "chat": 700}

    def test_beside_a_chat_prefill_a_batch_prompt_stops_at_the_reserve(self) -> None:
        def run(**opts: object) -> dict[str, int]:
            p = policy(prior_decode_seq_s=0.0, ttft_boost=False, ttft_reserve_quantile=0.5, **opts)
            for i in range(16):  # 16 chat prompts seen, 80..230 tokens: the 0.5 quantile 150
                seen = make_view(f"seen{i}", prompt=80 + 10 * i, arrival_s=1.0)
                arrive(p, seen)
                p.on_request_aborted(seen, 1.0, "client")
            dec = decoding("dec", 32, 2, first_token_s=9.9)  # allowance 0.1 s
            chat = make_view("chat", prompt=100, arrival_s=10.0)
            bat = make_view("bat", prompt=2000, slo=BATCH, arrival_s=10.0)
            arrive(p, make_view("dec", prompt=32), chat, bat)
            state = make_state(running=[dec], waiting=[chat, bat], mixed_batches=True)
            return dict(decide(p, state).num_tokens)

        # without the options the step takes the whole 700-token allowance, the batch prompt the
        # 600 the chat leaves; with both the chat still gets its 100, and the batch prompt only
        # what the reserve allows the whole step: the chat's prompt joined the window (17
        # prompts, 0.5 quantile 140 tokens), ((0.1 - B * 140) * 0.9 - A) / B = 574, less 100
        assert run() == {"dec": 1, "chat": 100, "bat": 600}
        reserved = int(((0.1 - B * 140) * 0.9 - A) / B)
        assert reserved == 574
        both = {"ttft_reserve_mixed": True, "ttft_reserve_beside_chats": True}
        assert run(**both) == {"dec": 1, "chat": 100, "bat": reserved - 100}
        assert run(ttft_reserve_mixed=True) == run()  # the reserve alone: only without a chat

    def test_after_a_rejection_the_replica_holds_no_reserve_for_shed_s(self) -> None:
        def run(**opts: object) -> tuple[dict[str, int], dict[str, str]]:
            p = policy(ttft_boost=False, ttft_reserve_quantile=0.5, reject_hopeless=True, **opts)
            for i in range(16):  # 16 chat prompts seen, 80..230 tokens: the 0.5 quantile 150
                seen = make_view(f"seen{i}", prompt=80 + 10 * i, arrival_s=1.0)
                arrive(p, seen)
                p.on_request_aborted(seen, 1.0, "client")
            dec = decoding("dec", 32, 2, first_token_s=9.9)  # allowance 0.1 s
            late = make_view("late", prompt=100, arrival_s=8.0)  # its 1 s TTFT is gone
            bat = make_view("bat", prompt=2000, slo=BATCH, arrival_s=10.0)
            arrive(p, make_view("dec", prompt=32), late, bat)
            state = make_state(running=[dec], waiting=[late, bat], mixed_batches=True)
            d = decide(p, state)
            return dict(d.num_tokens), dict(d.reject)

        # the hopeless chat is rejected at the call's due checks, before the step is sized; its
        # prompt joined the window (17 prompts, 0.5 quantile 140 tokens), so the reserve leaves
        # the batch prompt ((0.1 - B * 140) * 0.9 - A) / B = 574 tokens; with
        # ttft_reserve_shed_s it gets the 700 of the plain rule; shed_s 0 (the default) keeps it
        rejected = {"late": "slo_unattainable"}
        reserve = {"ttft_reserve_mixed": True}
        reserved = int(((0.1 - B * 140) * 0.9 - A) / B)
        assert reserved == 574 and run(**reserve) == ({"dec": 1, "bat": reserved}, rejected)
        assert run(**reserve, ttft_reserve_shed_s=10.0) == ({"dec": 1, "bat": 700}, rejected)
        assert run() == run(**reserve, ttft_reserve_shed_s=10.0)
        with pytest.raises(ValueError, match=r"ttft_reserve_shed_s must be >= 0, got -1.0"):
            policy(ttft_reserve_shed_s=-1.0)

    @pytest.mark.parametrize(("later_s", "want"), [(9.9, 700), (10.0, 574)])
    def test_the_reserve_comes_back_shed_s_after_the_rejection(
        self, later_s: float, want: int
    ) -> None:
        p = policy(
            ttft_boost=False,
            ttft_reserve_quantile=0.5,
            reject_hopeless=True,
            ttft_reserve_mixed=True,
            ttft_reserve_shed_s=10.0,
        )
        for i in range(16):  # as above: with the rejected chat, 17 prompts, 0.5 quantile 140
            seen = make_view(f"seen{i}", prompt=80 + 10 * i, arrival_s=1.0)
            arrive(p, seen)
            p.on_request_aborted(seen, 1.0, "client")
        dec = decoding("dec", 32, 2, first_token_s=9.9)
        late = make_view("late", prompt=100, arrival_s=8.0)
        bat = make_view("bat", prompt=2000, slo=BATCH, arrival_s=10.0)
        arrive(p, make_view("dec", prompt=32), late, bat)
        first = decide(p, make_state(running=[dec], waiting=[late, bat], mixed_batches=True))
        assert dict(first.reject) == {"late": "slo_unattainable"}
        assert dict(first.num_tokens) == {"dec": 1, "bat": 700}
        # a later step, the decode's allowance 0.1 s again: 0.1 * generated - (now - 9.9)
        now = 10.0 + later_s
        generated = round((now - 9.9 + 0.1) / 0.1)
        dec = decoding("dec", 32, generated, first_token_s=9.9)
        bat = make_view("bat", prompt=2000, computed=700, slo=BATCH, arrival_s=10.0)
        state = make_state(running=[dec, bat], now_s=now, mixed_batches=True)
        assert dict(decide(p, state).num_tokens) == {"dec": 1, "bat": want}

    def test_the_quantile_must_be_in_the_unit_interval(self) -> None:
        with pytest.raises(ValueError, match=r"ttft_reserve_quantile must be in \[0, 1\]"):
            policy(ttft_reserve_quantile=1.5)


class TestFirstTokenGuard:
    """A chat whose whole prompt fits in the step is not made late by a batch prompt's chunk."""

    def _decide(self, chat_arrival_s: float, **options: object) -> tuple[ScheduleDecision, int]:
        p = policy(**{"first_token_guard": True, **options})
        long = make_view("long", prompt=8000, computed=2048, slo=BATCH, arrival_s=0.0)
        short = make_view("short", prompt=16, arrival_s=chat_arrival_s)
        arrive(p, make_view("long", prompt=8000, slo=BATCH), short)
        state = make_state(running=[long], waiting=[short], free_blocks=1000, total_blocks=1000)
        return decide(p, state), p.stats()["first_token_trims"]

    def test_the_batch_chunk_is_trimmed_to_end_the_step_by_the_chat_deadline(self) -> None:
        # due at 9.2 + 1.0 = 10.2 s; the full step (16 + 2032 tokens) would end at
        # 10.0 + A + B * 2048 = 10.2248 s: 0.0248 s late = 248 tokens (249 after float rounding
        # up), so the step ends at 10.0 + A + B * (16 + 1783) = 10.1999 s
        plain, _ = self._decide(9.2, first_token_guard=False)
        assert dict(plain.num_tokens) == {"short": 16, "long": 2032}
        guarded, trims = self._decide(9.2)
        assert dict(guarded.num_tokens) == {"short": 16, "long": 1783} and trims == 1
        assert guarded.admit == ("short",)

    def test_no_trim_when_the_deadline_is_met_or_out_of_reach(self) -> None:
        roomy, trims = self._decide(9.5)  # due 10.5 s: the full step ends at 10.2248 s
        assert dict(roomy.num_tokens) == {"short": 16, "long": 2032} and trims == 0
        # due 10.01 s: even the chat alone ends at 10.0 + A + B * 16 = 10.0216 s
        late, trims = self._decide(9.01, reject_hopeless=False, best_effort_demotion=False)
        assert dict(late.num_tokens) == {"short": 16, "long": 2032} and trims == 0

    def _decide_chat_donor(self, long_arrival_s: float) -> tuple[ScheduleDecision, int]:
        """A 4,000-token chat waiting beside the short chat, both tier 0; the short first."""
        p = policy(first_token_guard=True)
        long = make_view("long", prompt=4000, arrival_s=long_arrival_s)
        short = make_view("short", prompt=16, arrival_s=9.2)
        arrive(p, long, short)
        state = make_state(waiting=[long, short], free_blocks=1000, total_blocks=1000)
        return decide(p, state), p.stats()["first_token_trims"]

    def test_a_later_chat_gives_tokens_if_it_still_makes_its_first_token(self) -> None:
        # short due 10.2 s; the step (16 + 2032 tokens) ends at 10.2248 s, 249 tokens late.
        # long would prefill its 4,000 tokens after the trimmed step (10.1999 s) by
        # + prefill_s(4000, 2048, 0) = 2 A + B * 4000 = 10.6399 s: it gives if due after that
        guarded, trims = self._decide_chat_donor(9.9)  # due 10.9 s
        assert dict(guarded.num_tokens) == {"short": 16, "long": 1783} and trims == 1
        kept, trims = self._decide_chat_donor(9.6)  # due 10.6 s: it would be late
        assert dict(kept.num_tokens) == {"short": 16, "long": 2032} and trims == 0


class TestPreemption:
    def _state(self, victim_computed: int, link: float, free_cpu: int) -> StepState:
        keep = decoding("keep", 32, 1)  # computed 32: its next token needs a new block
        victim = decoding("victim", victim_computed, 1, slo=BATCH)
        return make_state(
            running=[keep, victim],
            free_blocks=0,
            total_cpu_blocks=1000,
            free_cpu_blocks=free_cpu,
            kv_block_bytes=1_000_000,
            link_bytes_per_s=link,
        )

    def _victim_mode(self, victim_computed: int, link: float, free_cpu: int = 1000) -> object:
        p = policy()
        arrive(p, make_view("keep", prompt=32), make_view("victim", prompt=10, slo=BATCH))
        d = decide(p, self._state(victim_computed, link, free_cpu), swap=True)
        assert d.num_tokens == {"keep": 1}
        return d.preempt["victim"]

    def test_swap_when_the_link_round_trip_is_cheaper_than_recompute(self) -> None:
        # 160 tokens = 10 blocks of 1 MB: swap 2 * 10 MB / 10 GB/s = 2 ms < recompute 16 ms
        assert self._victim_mode(160, link=1e10) is SWAP

    def test_recompute_when_the_link_is_slow(self) -> None:
        # 1 GB/s: swap 20 ms > recompute 160 * 0.1 ms = 16 ms
        assert self._victim_mode(160, link=1e9) is RECOMPUTE

    def test_recompute_when_cpu_memory_is_short(self) -> None:
        assert self._victim_mode(160, link=1e10, free_cpu=9) is RECOMPUTE

    def test_never_swaps_without_a_cpu_tier(self) -> None:
        p = policy()
        arrive(p, make_view("keep", prompt=32), make_view("victim", prompt=10, slo=BATCH))
        state = make_state(
            running=[decoding("keep", 32, 1), decoding("victim", 160, 1, slo=BATCH)],
            free_blocks=0,
            kv_block_bytes=1_000_000,
            link_bytes_per_s=1e10,  # a link but no CPU blocks
        )
        d = decide(p, state, swap=False)
        assert dict(d.preempt) == {"victim": RECOMPUTE}

    def test_a_better_tier_preempts_a_worse_one_to_be_admitted(self) -> None:
        p = policy()
        batch = decoding("batch", 64, 1, slo=BATCH)  # 4 blocks
        chat = make_view("chat", prompt=48, arrival_s=10.0)  # needs 3 blocks
        arrive(p, make_view("batch", prompt=64, slo=BATCH), chat)
        d = decide(p, make_state(running=[batch], waiting=[chat], free_blocks=1, total_blocks=5))
        assert d.admit == ("chat",) and dict(d.preempt) == {"batch": RECOMPUTE}
        # the reverse never happens: a batch request waits for a chat one to finish
        p = policy()
        chat_running = decoding("chat", 64, 1)
        batch_waiting = make_view("batch", prompt=48, slo=BATCH, arrival_s=10.0)
        arrive(p, make_view("chat", prompt=64), batch_waiting)
        state = make_state(
            running=[chat_running], waiting=[batch_waiting], free_blocks=1, total_blocks=5
        )
        d = decide(p, state)
        assert d.admit == () and dict(d.preempt) == {}


class TestRotation:
    def _states(self, rotation: bool) -> ScheduleDecision:
        p = policy(rotation=rotation, rotation_slice_tokens=16, tpot_safety=1.0)
        cpu = {
            "total_cpu_blocks": 1000,
            "free_cpu_blocks": 1000,
            "kv_block_bytes": 1_000_000,
            "link_bytes_per_s": 1e10,
            "total_blocks": 100,
        }
        arrive(p, make_view("batch", prompt=64, slo=BATCH))
        first = decoding("batch", 64, 1, slo=BATCH)
        decide(p, make_state(running=[first], free_blocks=96, **cpu), swap=True)  # type: ignore[arg-type]
        # 300 tokens later (> its slice of 16 * 4**2 = 256), two chat requests arrive; the
        # budget admits one, and HBM is then below the 5 % watermark with the other waiting
        batch = decoding("batch", 64, 301, slo=BATCH)
        c1 = make_view("c1", prompt=48, arrival_s=10.0)
        c2 = make_view("c2", prompt=48, arrival_s=10.0)
        arrive(p, c1, c2)
        state = make_state(running=[batch], waiting=[c1, c2], free_blocks=6, token_budget=49, **cpu)  # type: ignore[arg-type]
        return decide(p, state, swap=True)

    def test_a_resident_that_used_its_slice_rotates_out_when_better_work_waits(self) -> None:
        d = self._states(rotation=True)
        assert d.admit == ("c1",) and dict(d.preempt) == {"batch": SWAP}

    def test_rotation_off_keeps_it_resident(self) -> None:
        d = self._states(rotation=False)
        assert d.admit == ("c1",) and dict(d.preempt) == {}

    def test_swapped_requests_resume_when_their_tier_comes_round(self) -> None:
        p = policy()
        back = make_view(
            "back", prompt=64, computed=64, generated=1, slo=BATCH, location=KVLocation.CPU
        )
        arrive(p, make_view("back", prompt=64, slo=BATCH))
        state = make_state(
            swapped=[back],
            free_blocks=50,
            total_cpu_blocks=100,
            free_cpu_blocks=96,
            kv_block_bytes=1_000_000,
            link_bytes_per_s=1e10,
        )
        d = decide(p, state, swap=True)
        assert d.resume == ("back",) and dict(d.num_tokens) == {"back": 1}

    def test_swap_round_trip_over_many_steps(self) -> None:
        # Batch jobs fill HBM; chat arrives; rotation swaps batch out and back, and every
        # request finishes with its KV conserved.
        reqs = [Req(f"b{i}", 0.0, 256, 400, BATCH) for i in range(6)]
        reqs += [Req(f"c{i}", 1.0 + 0.1 * i, 128, 20, CHAT) for i in range(6)]
        engine = EngineDouble(
            policy(rotation_slice_tokens=16),
            reqs,
            prefill_token_s=1e-4,
            total_hbm_blocks=120,
            total_cpu_blocks=400,
            link_bytes_per_s=1e10,
            kv_block_bytes=1_000_000,
        )
        engine.run()
        assert {r.where for r in reqs} == {"finished"}
        assert engine.swapped_out_bytes > 0 and engine.swapped_out_bytes == engine.swapped_in_bytes
        assert all(r.generated == r.output for r in reqs)


class TestWeightedRotation:
    def test_tiers_get_their_weighted_share_of_a_contended_budget(self) -> None:
        # Four backlogged tiers whose requests only prefill (1 output token): over many steps
        # each gets weight_t / sum(weights) of the tokens, weights 2**(3 - t).
        p = policy(
            quantum_base_tokens=1000,
            quantum_growth=4.0,
            tier_weight_ratio=2.0,
            aging=False,
            promotion=False,
            best_effort_demotion=False,
        )
        no_slo = SLO("other")
        prompts = {0: (500, CHAT), 1: (2000, CHAT), 2: (8000, CHAT), 3: (3000, no_slo)}
        reqs = [
            Req(f"t{t}-{i}", 0.0, prompt, 1, slo, max_output=1)
            for t, (prompt, slo) in prompts.items()
            for i in range(400)
        ]
        engine = EngineDouble(p, reqs, total_hbm_blocks=10**7)
        tier_of = {r.rid: int(r.rid[1]) for r in reqs}
        tokens = [0, 0, 0, 0]
        for _ in range(100):  # tier 0's backlog (400 x 500 tokens) lasts longer than this
            d = engine.step()
            assert d is not None
            for rid, n in d.num_tokens.items():
                tokens[tier_of[rid]] += n
        total = sum(tokens)
        assert total == 100 * 2048  # work-conserving: every step uses the whole budget
        shares = [n / total for n in tokens]
        for share, want in zip(shares, [8 / 15, 4 / 15, 2 / 15, 1 / 15], strict=True):
            # stride scheduling is off by at most one 256-token turn per tier
            assert share == pytest.approx(want, abs=256 / total * 4)


class TestAdmissionControl:
    def test_a_full_tier_sheds_its_least_important_request(self) -> None:
        p = policy(max_waiting_per_tier=2)
        views = [make_view(f"c{i}", prompt=64, arrival_s=9.6 + 0.1 * i) for i in range(3)]
        arrive(p, *views)
        d = decide(p, make_state(waiting=views, free_blocks=0))
        assert dict(d.reject) == {"c2": "shed: tier 0 queue full"}  # the latest deadline

    def test_best_effort_requests_are_shed_first(self) -> None:
        p = policy(max_waiting_per_tier=1, best_effort_tier="last")
        late = make_view("late", prompt=64, arrival_s=5.0)  # TTFT missed: best effort, tier 3
        other = SLO("other")
        views = [late, make_view("x", prompt=64, slo=other, arrival_s=9.9)]
        arrive(p, *views)
        d = decide(p, make_state(waiting=views, free_blocks=0))
        assert dict(d.reject) == {"late": "shed: tier 3 queue full"}

    def test_a_request_preempted_in_this_decision_is_shed_at_the_next(self) -> None:
        # Admitting c1 preempts the batch job (recompute: no CPU tier) back into tier 2, which
        # then holds 2 > 1 waiting requests, and the batch job (latest deadline) is the least
        # important. It is still in the state's running queue, so rejecting it in the same
        # decision failed check_decision ("reject names 'batch', which is not in the right
        # queue", a PolicyError that ended a simulation; found at 3x Azure load with
        # max_waiting_per_tier=20). It is shed at the next call, from the waiting queue.
        p = policy(max_waiting_per_tier=1)
        batch = decoding("batch", 64, 1, slo=BATCH, first_token_s=9.0)  # 4 blocks
        b2 = make_view("b2", prompt=32, slo=BATCH, arrival_s=0.0)  # 2 blocks: no room left
        c1 = make_view("c1", prompt=48, arrival_s=9.9)  # 3 blocks
        arrive(p, make_view("batch", prompt=64, slo=BATCH, arrival_s=5.0), b2, c1)
        state = make_state(running=[batch], waiting=[b2, c1], free_blocks=0, total_blocks=4)
        d = decide(p, state)
        assert d.admit == ("c1",) and dict(d.preempt) == {"batch": RECOMPUTE}
        assert dict(d.reject) == {}
        after = make_state(
            running=[make_view("c1", prompt=48, computed=48, generated=1, first_token_s=10.0)],
            waiting=[make_view("batch", prompt=64, generated=1, slo=BATCH, arrival_s=5.0), b2],
            free_blocks=1,
            total_blocks=4,
        )
        d = decide(p, after)
        assert dict(d.reject) == {"batch": "shed: tier 2 queue full"}


class TestLazyHeaps:
    @staticmethod
    def _run(slack: int, monkeypatch: pytest.MonkeyPatch) -> tuple[list[object], int, Counter[str]]:
        # 600 chats of 2,000 prompt tokens, one every 10 ms, one prefill per 50 ms step: most
        # wait past their TTFT and are rejected, the oldest first, from the bottom of tier 0's
        # shed heap (its top is the latest deadline); nothing is shed (the tier stays < 4,096)
        monkeypatch.setattr(queues, "_COMPACT_SLACK", slack)
        p = policy(reject_hopeless=True)
        reqs = [Req(f"c{i}", 0.01 * i, 2000, 2, CHAT) for i in range(600)]
        engine = EngineDouble(p, reqs)
        longest = 0
        while engine.step() is not None:
            longest = max(longest, len(p._replica(0).shed_heaps[0]))
        decisions: list[object] = [
            (d.admit, dict(d.reject), dict(d.num_tokens), d.max_repeat_steps)
            for _, d in engine.decisions
        ]
        return decisions, longest, Counter(r.where for r in reqs)

    def test_rejected_requests_do_not_pile_up_in_the_shed_heap(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        compacted, longest, where = self._run(64, monkeypatch)
        lazy, lazy_longest, lazy_where = self._run(10**9, monkeypatch)
        assert where == lazy_where == Counter({"rejected": 457, "finished": 143})
        assert lazy_longest == 600  # without compaction every request's item stayed
        assert longest == 252  # compacted past twice the live items plus 64
        assert compacted == lazy  # the same decisions, call for call


class TestBooks:
    def test_requests_it_was_never_told_about_are_adopted(self) -> None:
        p = policy()
        w = make_view("w", prompt=32, arrival_s=9.9)
        r = decoding("r", 32, 3)
        d = decide(p, make_state(waiting=[w], running=[r]))
        assert dict(d.num_tokens) == {"r": 1, "w": 32} and d.admit == ("w",)

    def test_a_request_preempted_for_room_stays_in_the_books(self) -> None:
        # c1 gets in by preempting the batch job; c2 then finds no room, so the rotation moves
        # on to tier 2, where the batch job now waits: it must not be admitted back in the same
        # decision, and the policy must keep it as waiting (no rebuild of its books needed).
        p = policy()
        batch = decoding("batch", 64, 1, slo=BATCH)  # 4 blocks
        c1 = make_view("c1", prompt=48, arrival_s=9.9)  # 3 blocks
        c2 = make_view("c2", prompt=48, arrival_s=9.95)
        arrive(p, make_view("batch", prompt=64, slo=BATCH), c1, c2)
        state = make_state(running=[batch], waiting=[c1, c2], free_blocks=0, total_blocks=4)
        d = decide(p, state)
        assert d.admit == ("c1",) and dict(d.preempt) == {"batch": RECOMPUTE}
        rep = p._replica(0)
        assert set(rep.waiting) == {"batch", "c2"}
        after = make_state(
            running=[make_view("c1", prompt=48, computed=48, generated=1, first_token_s=10.0)],
            waiting=[make_view("batch", prompt=64, generated=1, slo=BATCH), c2],
            free_blocks=1,
            total_blocks=4,
        )
        p.schedule(after)
        assert set(rep.waiting) == {"batch", "c2"} and rep.num_stale == 0

    def test_decode_only_steps_repeat_until_the_next_check(self) -> None:
        p = policy()
        arrive(p, make_view("r", prompt=32, slo=BATCH))
        d = decide(p, make_state(running=[decoding("r", 32, 3, slo=BATCH)]))
        assert dict(d.num_tokens) == {"r": 1}
        # a running batch request is re-checked within recheck_s = 1 s: 1 s / A = 50 steps
        assert d.max_repeat_steps == 50

    @pytest.mark.parametrize(
        "key, value",
        [
            ("num_tiers", 0),
            ("quantum_growth", 0.5),
            ("tpot_safety", 0.0),
            ("tpot_plan_share", 0.0),
            ("tpot_plan_share", 1.5),
            ("deadline_class_tier", 4),
            ("aging_s", 0.0),
            ("kv_watermark", 1.0),
        ],
    )
    def test_invalid_hyperparameters_are_refused(self, key: str, value: object) -> None:
        with pytest.raises(ValueError, match=key):
            SuperInferPolicy(**{key: value})  # type: ignore[arg-type]


class TestExtremeSLOs:
    """Issue 20, item 1: every SLO the validators accept (any target > 0, up to ``inf``) keeps
    the policy's arithmetic finite; ``tpot_ms=1.7e308`` used to end in ``int(inf)``."""

    HUGE_TPOT = SLO("huge", ttft_ms=2000.0, tpot_ms=1.7e308)

    def test_a_tpot_of_1_7e308_ms_caps_no_prefill(self) -> None:
        # allowance 1.7e305 s * 2 tokens: room_s / B is inf, once int(inf) (OverflowError)
        p = policy()
        dec = decoding("dec", 32, 2, first_token_s=9.9, slo=self.HUGE_TPOT)
        new = make_view("new", prompt=5000, arrival_s=10.0, slo=self.HUGE_TPOT)
        arrive(p, make_view("dec", prompt=32, slo=self.HUGE_TPOT), new)
        d = decide(p, make_state(running=[dec], waiting=[new], free_blocks=1000))
        assert dict(d.num_tokens) == {"dec": 1, "new": 2047} and d.admit == ("new",)
        assert p._replica(0).prefill_chunk_tokens == float(2**62)

    @pytest.mark.parametrize(
        "ttft_ms, step_s", [(float("inf"), A), (1.7e308, 1e-4)], ids=["inf", "1.7e308"]
    )
    def test_a_huge_ttft_target_needs_no_ttft_boost(self, ttft_ms: float, step_s: float) -> None:
        # the boost's steps = int(room_s / per_step) was int(inf): slack inf, or 1.7e305 s / 1e-4
        p = policy(min_prefill_tokens=1, prior_step_s=step_s)
        dec = decoding("dec", 32, 2, first_token_s=9.9)  # CHAT: 0.1 s of TPOT allowance
        far = make_view("far", prompt=2400, arrival_s=9.3, slo=SLO("far", ttft_ms=ttft_ms))
        arrive(p, make_view("dec", prompt=32), far)
        d = decide(p, make_state(running=[dec], waiting=[far], token_budget=4096, free_blocks=1000))
        expected = int(((0.1 * 2 - (10.0 - 9.9)) * 0.9 - step_s) / B)  # TPOT protection alone
        assert dict(d.num_tokens) == {"dec": 1, "far": expected}

    @pytest.mark.parametrize("name", ["superinfer", "oracle"])
    def test_the_simulator_runs_a_class_with_tpot_1_7e308_ms(self, name: str) -> None:
        from superinfer.policy_core.policies.oracle import OraclePolicy
        from superinfer.sim.request import RequestStatus
        from tests.sim.helpers import simulate, spec

        specs = [
            spec(f"r{i}", 0.05 * i, 300 + 40 * i, 20 + i, slo=self.HUGE_TPOT) for i in range(12)
        ]
        chosen: SuperInferPolicy = (
            SuperInferPolicy()
            if name == "superinfer"
            else OraclePolicy(output_tokens={s.request_id: s.output_tokens for s in specs})
        )
        result, _ = simulate(specs, chosen)
        assert [(r.status, r.generated_tokens) for r in result.requests] == [
            (RequestStatus.FINISHED, 20 + i) for i in range(12)
        ]


class TestYieldDecodes:
    """A chat prompt that a step's decodes would push into one more budget-bound step gets
    their tokens instead, from the decodes that can wait a step (``yield_decodes``)."""

    def _decide(
        self, prompt: int, decodes: list[RequestView], arrival_s: float = 9.6, **options: object
    ) -> tuple[ScheduleDecision, int]:
        p = policy(**{"yield_decodes": True, **options})
        long = make_view("long", prompt=prompt, arrival_s=arrival_s)
        for d in decodes:
            arrive(p, make_view(d.request_id, prompt=d.prompt_tokens, slo=d.slo))
        arrive(p, long)
        state = make_state(running=decodes, waiting=[long], free_blocks=1000, total_blocks=1000)
        return decide(p, state), p.stats()["decodes_yielded"]

    @staticmethod
    def _decodes(*chat_generated: int, batch: int = 1) -> list[RequestView]:
        """``batch`` batch decodes, then a chat decode per ``chat_generated`` (first token at
        9.95 s: banked allowance ``0.1 * generated - 0.05`` s at 10.0 s)."""
        out = [decoding(f"bat{i}", 32, 5, slo=BATCH) for i in range(batch)]
        return out + [decoding(f"chat{g}", 32, g) for g in chat_generated]

    def test_the_batch_decodes_go_first_then_the_chat_with_the_most_allowance(self) -> None:
        # 2,048 - 3 decodes = 2,045 tokens now; 4,092 - 2,045 = 2,047 left: two more steps of
        # 2,045 with the decodes, one of 2,048 without. k = 2,047 - 2,045 = 2 tokens now
        # (then 2,045 left: one step with every decode). The batch decode and the chat that
        # banked 4.95 s (50 tokens) wait; the one with 2.95 s (30 tokens) runs
        d, yielded = self._decide(4092, self._decodes(30, 50))
        assert dict(d.num_tokens) == {"long": 2047, "chat30": 1} and yielded == 2
        plain, none = self._decide(4092, self._decodes(30, 50), yield_decodes=False)
        assert dict(plain.num_tokens) == {"bat0": 1, "chat30": 1, "chat50": 1, "long": 2045}
        assert none == 0

    def test_nothing_moves_when_no_step_is_saved(self) -> None:
        # 4,090 - 2,045 = 2,045 left: one more step with the decodes anyway
        d, yielded = self._decide(4090, self._decodes(30, 50))
        assert d.num_tokens["long"] == 2045 and yielded == 0

    def test_a_chat_decode_without_allowance_for_two_steps_does_not_wait(self) -> None:
        # k = 2,048 - 2,045 = 3 tokens; a step of 2,048 tokens is predicted at
        # A + B * 2,048 = 0.2248 s, so a decode must have banked 0.4496 s: 3 tokens (0.25 s)
        # have not, and the batch decode and the 50-token chat are 2 of the 3 needed
        d, yielded = self._decide(4093, self._decodes(3, 50))
        assert d.num_tokens["long"] == 2045 and yielded == 0

    def test_nothing_moves_for_a_first_token_late_even_so(self) -> None:
        # due 10.2 s; the step ends at 10.0 + A + B * 2,048 = 10.2248 s before the rest
        d, yielded = self._decide(
            4092, self._decodes(30, 50), arrival_s=9.2, best_effort_demotion=False
        )
        assert d.num_tokens["long"] == 2045 and yielded == 0


def test_the_boost_credit_counts_on_the_long_run_mean_step() -> None:
    def stats(duration_s: float, steps: int = 1) -> StepStats:
        return StepStats(10.0, 0, duration_s, steps, 0, 1, 1, 0, 0, 100)

    slow = policy(credit_step_memory=4)
    for d in (0.2, 0.1, 0.3):  # a repeated decision counts its mean step: 0.3 / 3 = 0.1
        slow.on_step_finished(stats(d, steps=3 if d == 0.3 else 1))
    # 0.2, then 0.2 + (0.1 - 0.2) / 4 = 0.175, then 0.175 + (0.1 - 0.175) / 4 = 0.15625
    assert slow._credit_step_s == pytest.approx(0.15625, abs=1e-15)
    assert slow._step_ewma_s == pytest.approx(0.95 * (0.95 * 0.2 + 0.05 * 0.1) + 0.05 * 0.1)
    plain = policy()  # 0: no mean of its own, the boost reads the step-time average
    plain.on_step_finished(stats(0.2))
    assert plain._credit_step_s == 0.0 and plain._step_ewma_s == 0.2
    with pytest.raises(ValueError, match="credit_step_memory must be >= 0, got -1"):
        policy(credit_step_memory=-1)


def test_a_yield_keeps_the_engines_reserve_and_the_kv_watermark() -> None:
    import dataclasses

    # 20 batch decodes leave 2,028 tokens of the 2,048 to a 4,061-token chat (127 blocks of 16);
    # 2,033 left: one step more with them. k = 2,033 - 2,028 = 5, and 2,028 + 5 tokens take a
    # 128th block
    p_views = [decoding(f"bat{i}", 32, 5, slo=BATCH) for i in range(20)]

    def run(reserved: int) -> dict[str, int]:
        p = policy(yield_decodes=True)
        long = make_view("long", prompt=4061, arrival_s=9.6)
        for d in p_views:
            arrive(p, make_view(d.request_id, prompt=32, slo=BATCH))
        arrive(p, long)
        state = make_state(running=p_views, waiting=[long], free_blocks=1000, total_blocks=1000)
        return dict(decide(p, dataclasses.replace(state, reserved_hbm_blocks=reserved)).num_tokens)

    assert run(0)["long"] == 2033 and len(run(0)) == 16  # 5 decodes wait a step
    # admitting the chat leaves 1,000 - 127 = 873 free blocks; the engine's reserve (863) and
    # the 1 % watermark (10) take all of them, so the 128th block does not fit: no yield
    assert run(863) == {**{d.request_id: 1 for d in p_views}, "long": 2028}
    assert run(862)["long"] == 2033  # one block above the floors: it fits
