"""The ``superinfer`` policy: the lifecycle hooks and ``schedule()``, composing the layers below
(see the package docstring for the mechanisms)."""

from __future__ import annotations

from dataclasses import dataclass

from superinfer.policy_core.kv_cost import has_cpu_tier
from superinfer.policy_core.policies.superinfer.records import (
    _INF,
    _RUNNING,
    _WAITING,
    _Entry,
    _Replica,
    _Step,
)
from superinfer.policy_core.policies.superinfer.rotation import _Rotation
from superinfer.policy_core.types import (
    RequestView,
    ScheduleDecision,
    StepState,
    StepStats,
)

__all__ = ["SuperInferPolicy"]


@dataclass
class SuperInferPolicy(_Rotation):
    """The SLO-aware rotation scheduler; see the module docstring for the mechanisms.

    Every attribute below is a hyperparameter (``superinfer bench --policy-opt key=value``),
    validated on construction.

    Raises:
        ValueError: on construction, naming the first invalid hyperparameter.
    """

    # -- lifecycle ------------------------------------------------------------------------------

    def on_request_arrived(self, request: RequestView, now_s: float) -> None:
        e = self._entries.get(request.request_id)
        if e is not None:  # announced twice: keep the first record
            return
        e = self._entries[request.request_id] = _Entry(request)
        e.tier = self._initial_tier(request)
        e.demote_at = self._quanta[e.tier]
        e.queued_s = now_s
        if e.ttft_s is not None and self.ttft_reserve_quantile > 0:
            self.ttft_prompts.observe(request.pending_tokens)
        if e.ttft_s is not None and (self._last_ttft_s is None or now_s > self._last_ttft_s):
            self._last_ttft_s = now_s
        if e.ttft_s is not None and self._kv_reserve_on:
            self.ttft_footprints.observe(request.pending_tokens + request.max_output_tokens)
        rep = self._replica(request.replica)
        self._fcfs_join(rep, e)
        self._enqueue(rep, e, _WAITING, now_s)
        if e.tier != e.reported_tier:
            rep.unreported.append(e)

    def on_request_finished(self, request: RequestView, now_s: float) -> None:
        self.estimator.observe(request.slo.name, request.generated_tokens)
        self._forget(request.request_id)

    def on_request_aborted(self, request: RequestView, now_s: float, reason: str) -> None:
        self._forget(request.request_id)

    def on_step_finished(self, stats: StepStats) -> None:
        self.step_time.observe(stats)
        if stats.num_steps > 0 and stats.duration_s > 0:
            per_step = stats.duration_s / stats.num_steps
            ewma = self._step_ewma_s
            self._step_ewma_s = per_step if ewma == 0.0 else 0.95 * ewma + 0.05 * per_step
            if self.ttft_boost_unmixed:  # its credit counts on the time between a decode's
                # tokens: report time over steps that ran decodes (a prefill step alone runs none)
                w = 1.0 / self.decode_interval_memory
                decoded = float(stats.num_steps if stats.num_decode_tokens > 0 else 0)
                d, n = self._interval_means
                self._interval_means = (
                    (stats.duration_s, decoded)
                    if d == 0.0
                    else (d + w * (stats.duration_s - d), n + w * (decoded - n))
                )
            if self.credit_step_memory:  # the long-run mean the TTFT boost's credit counts on
                w, mean = 1.0 / self.credit_step_memory, self._credit_step_s
                self._credit_step_s = per_step if mean == 0.0 else mean + w * (per_step - mean)

    # -- the decision ---------------------------------------------------------------------------

    def schedule(self, state: StepState) -> ScheduleDecision:
        """Decide one step of ``state.replica``.

        Work per call: a visit of the running requests the change set names (arrivals,
        irregular changes, due checks, decodes at a KV-block or quantum boundary; all of them
        without a usable change set: ``running.py``); heap operations for the requests whose
        checks fall due, that are admitted, resumed, preempted or shed; a scan of
        ``state.waiting`` only when the policy's books disagree with it (a request it was not
        told about) or to read the new views of requests it preempted.

        Returns:
            A decision that passes ``check_decision(state, d, swap_supported=...)`` with
            ``swap_supported`` true only if the state shows a CPU tier.
        """
        rep, now = self._replica(state.replica), state.now_s
        rep.token_budget = state.token_budget
        self._sync(rep, state)
        cpu = has_cpu_tier(state)
        if cpu:
            self._counters["saw_cpu_tier"] = 1
        link_step = state.link_bytes_per_s * self._typical_step_s() * self.swap_budget_fraction
        step = _Step(
            state=state,
            free=state.free_hbm_blocks,
            budget=state.token_budget,
            seats=state.max_num_seqs - len(state.running),
            free_cpu=state.free_cpu_blocks if cpu else 0,
            swap_out_bytes=link_step if cpu else 0.0,
            swap_in_bytes=link_step if cpu else 0.0,
        )
        self._run_due_checks(rep, step, now)
        decodes, lanes, need = self._scan_running(rep, step, now)
        cap_s = self._tpot_cap(rep.books, step, now)  # before a preemption changes the books
        if need > step.free:
            self._relieve_shortage(rep, step, self._running_entries(state), need)
        self._schedule_decodes(rep, step, decodes, need)
        prefill_allow = self._prefill_allowance(step, len(decodes), cap_s)
        prefill_allow = self._reserve_for_ttft(rep, step, len(decodes), cap_s, prefill_allow)
        boost = self.ttft_boost and (state.mixed_batches or self.ttft_boost_unmixed)
        if boost and prefill_allow < step.budget:
            ttft_lanes = rep.books.ttft_lanes
            prefill_allow = self._ttft_boost(rep, step, decodes, ttft_lanes, prefill_allow, now)
        rep.prefill_chunk_tokens = float(prefill_allow)
        rep.num_decodes = len(decodes)
        self._allocate_prefill(rep, step, lanes, min(prefill_allow, step.budget), cpu)
        self._protect_first_tokens(rep, step, decodes)
        if cpu and self.rotation:
            self._rotate_proactively(rep, step)
        self._shed(rep, step)
        return self._finish(rep, step, now)

    def _finish(self, rep: _Replica, step: _Step, now: float) -> ScheduleDecision:
        tiers: dict[str, int] = {}
        if rep.unreported:
            step.changed.extend(rep.unreported)
            rep.unreported = []
        for e in step.changed:
            if e.where in (_WAITING, _RUNNING) and e.tier != e.reported_tier:
                if e.rid in self._entries and e.rid not in step.reject:
                    tiers[e.rid] = e.tier
                    e.reported_tier = e.tier
        repeat = 1
        quiet = not (step.admit or step.resume or step.preempt or step.reject)
        rep.books.last_out = tuple(step.preempt)
        tokens = step.tokens
        # every decode runs one token, so the step is one token per request unless a prefill
        # got more (a prefill trimmed to none by the guard has no entry)
        if quiet and tokens and all(tokens.get(r, 1) == 1 for r in step.prefills):
            # Repeat no further than the next check that could change the decision.
            first = rep.due.first()
            horizon = min(rep.next_running_check_s, first[0] if first is not None else _INF)
            per_step = max(self._typical_step_s(), 1e-6)
            steps = (horizon - now) / per_step if horizon < _INF else self.max_repeat_steps
            repeat = int(max(1, min(self.max_repeat_steps, steps)))
        prefetch = self._prefetch_promoted(step)
        for held in step.held:
            self._counters[held] += 1
        return ScheduleDecision(
            num_tokens=step.tokens,
            admit=tuple(step.admit),
            resume=tuple(step.resume),
            preempt=step.preempt,
            reject=step.reject,
            prefetch=tuple(prefetch),
            tiers=tiers,
            max_repeat_steps=repeat,
        )
