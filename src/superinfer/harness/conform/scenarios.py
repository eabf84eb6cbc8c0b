"""The conformance scenarios: each a workload (``conform.workloads``) plus a check on the
per-request results, reporting a measured value, its unit, the threshold and a reason.

A check reads :class:`RunResult`: the requests table every engine gives, and, where the engine
runs in-process, the :class:`~superinfer.harness.conform.observe.DecisionLog`. What a scenario
needs that the engine does not expose makes it ``not observable``, with the reason; a scenario
whose workload did not provoke what it tests (no preemption happened) is ``not exercised``.
Definitions and sources: docs/conformance.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from superinfer.harness.conform.observe import Admission, DecisionLog
from superinfer.harness.conform.workloads import (
    SHORT_PROMPT,
    Scale,
    Variant,
    make_workload,
    request,
    strip_field,
)
from superinfer.policy_core.types import SLO

__all__ = ["FIELDS", "SCENARIOS", "Outcome", "RunResult", "Scenario", "scenario_names"]

#: The request fields ``fields_honoured`` strips one at a time.
FIELDS = ("priority", "slo", "deadline")

PASS, FAIL, NOT_OBSERVABLE, NOT_EXERCISED, INFO = (
    "pass",
    "fail",
    "not observable",
    "not exercised",
    "info",
)


@dataclass(frozen=True)
class RunResult:
    """One run of a scenario variant.

    Attributes:
        requests: its requests table (``report.metrics.REQUEST_COLUMNS``, ``cached_tokens`` on
            the simulator).
        log: the decisions, where the engine runs in-process; else ``None``.
        preemptions_observable: ``num_preemptions`` is the engine's own count (not a
            placeholder 0, as over HTTP).
        exact: the engine is deterministic (the simulator): any difference between two runs is a
            different decision, not noise.
    """

    requests: pd.DataFrame
    log: DecisionLog | None = None
    preemptions_observable: bool = False
    exact: bool = False


@dataclass(frozen=True)
class Outcome:
    """A scenario's verdict (one row of ``matrix.csv``)."""

    passed: str
    value: float | None
    unit: str
    threshold: str
    detail: str


@dataclass(frozen=True)
class Scenario:
    """One scenario.

    Attributes:
        name: its row in the matrix.
        title: one line.
        needs: what it cannot run without: ``decisions`` (a decision log), ``cache``
            (``cached_tokens`` per request); the runner skips it where the engine lacks one.
        build: the variants to run, sized to a :class:`Scale`.
        check: the verdict from the runs by variant name, the scale and the fields the policy
            is declared to read (``None``: not one of ours).
    """

    name: str
    title: str
    needs: frozenset[str]
    build: Callable[[Scale], list[Variant]]
    check: Callable[[Mapping[str, RunResult], Scale, frozenset[str] | None], Outcome]
    runs_with: tuple[str, ...] = field(default=())


def _chat(scale: Scale, factor: float = 10.0, priority: int = 0) -> SLO:
    ttft = (scale.ttft0_s + factor * scale.unit_s) * 1e3
    return SLO(
        "chat", ttft_ms=round(ttft, 3), tpot_ms=round(4 * scale.unit_s * 1e3, 3), priority=priority
    )


def _batch(scale: Scale, priority: int = 1) -> SLO:
    return SLO("batch", deadline_s=round(2000 * scale.unit_s + 10, 3), priority=priority)


def _first_token_s(df: pd.DataFrame) -> pd.Series:
    return df["arrival_s"] + df["ttft_ms"] / 1e3


def _by_id(df: pd.DataFrame) -> pd.DataFrame:
    return df.set_index("request_id")


def _unfinished(df: pd.DataFrame) -> int:
    return int((df["status"] != "finished").sum())


# -- priority inversion at the running cap ---------------------------------------------------


def _inversion_build(scale: Scale) -> list[Variant]:
    u = scale.unit_s
    reqs = [
        request(f"bg{i}", 0.01 * i * u, SHORT_PROMPT, 48, _batch(scale)) for i in range(scale.cap)
    ]
    reqs.append(request("urgent", 8 * u, SHORT_PROMPT, 4, _chat(scale)))
    return [Variant("base", make_workload("priority_inversion", reqs))]


def _inversion_check(runs: Mapping[str, RunResult], scale: Scale, _: object) -> Outcome:
    run = runs["base"]
    df = _by_id(run.requests)
    if _unfinished(df):
        return Outcome(FAIL, None, "ratio", "<= 0.5", f"{_unfinished(df)} requests did not finish")
    urgent = df.loc["urgent"]
    bg = df[df.index != "urgent"]
    left = float(np.median(bg["finish_s"])) - float(urgent["arrival_s"])
    ratio = float(urgent["ttft_ms"]) / 1e3 / left if left > 0 else float("inf")
    if run.log is not None:
        victims = sum(1 for p in run.log.preemptions if p.for_priority == 0 and p.priority > 0)
        pre = f"{victims} lower-priority request(s) preempted for it"
    elif run.preemptions_observable:
        pre = f"{int(bg['num_preemptions'].sum())} background preemption(s)"
    else:
        pre = "preemptions not observable over HTTP"
    detail = (
        f"urgent TTFT {urgent['ttft_ms']:.0f} ms while the {scale.cap} running requests "
        f"(the cap) had {left * 1e3:.0f} ms left; {pre}"
    )
    return Outcome(PASS if ratio <= 0.5 else FAIL, round(ratio, 3), "ratio", "<= 0.5", detail)


# -- re-admission order and recomputed tokens after preemption -------------------------------


def _pressure_build(scale: Scale) -> list[Variant]:
    kv = scale.kv_tokens if not scale.sets_kv else 1024
    p, o = kv // 8, kv // 4
    slo = _batch(scale)
    u = scale.unit_s
    reqs = [request(f"r{i}", 0.01 * i * u, p, o, slo) for i in range(scale.cap)]
    reqs += [request(f"late{i}", (0.3 + 0.2 * i) * o * u, p, 8, slo) for i in range(2)]
    return [Variant("base", make_workload("kv_pressure", reqs), kv_tokens=kv)]


def _readmission_check(runs: Mapping[str, RunResult], scale: Scale, _: object) -> Outcome:
    run = runs["base"]
    assert run.log is not None
    log = run.log
    thr = "== 0"
    if not log.preemptions:
        return Outcome(
            NOT_EXERCISED,
            0,
            "inversions",
            thr,
            "no preemption happened (the engine reserves output KV at admission?)",
        )
    waiting: dict[str, float] = {}  # preempted request -> its arrival, while it waits
    inversions, readmitted = 0, 0
    events = sorted(
        [(p.now_s, 0, p.request_id, p) for p in log.preemptions]
        + [(a.now_s, 1, a.request_id, a) for a in log.admissions],
        key=lambda e: (e[0], e[1]),
    )
    for _, kind, rid, ev in events:
        if kind == 0:
            waiting[rid] = log_arrival(log, rid)
            continue
        waiting.pop(rid, None)
        assert isinstance(ev, Admission)  # kind 1: the admissions
        if ev.readmission:
            readmitted += 1
        # an admission of a same-priority request that arrived after one still waiting
        inversions += sum(1 for arr in waiting.values() if arr < ev.arrival_s)
    detail = (
        f"{len(log.preemptions)} preemption(s), {readmitted} re-admission(s); "
        f"{inversions} admission(s) of a later arrival ahead of a preempted request"
    )
    return Outcome(PASS if inversions == 0 else FAIL, inversions, "inversions", thr, detail)


def log_arrival(log: DecisionLog, rid: str) -> float:
    """Arrival of ``rid`` as the log saw it at its first admission."""
    return next(a.arrival_s for a in log.admissions if a.request_id == rid)


def _recompute_check(runs: Mapping[str, RunResult], scale: Scale, _: object) -> Outcome:
    run = runs["base"]
    assert run.log is not None
    log, df = run.log, run.requests
    needed = {
        r.request_id: int(
            r.prompt_tokens + r.generated_tokens - 1 - log.first_hit.get(r.request_id, 0)
        )
        for r in df.itertuples()
    }
    recomputed, lost = log.recomputed_tokens(needed), log.lost_tokens()
    if not log.preemptions:
        return Outcome(NOT_EXERCISED, 0, "tokens", "<= 0", "no preemption happened")
    excess = recomputed - lost
    detail = (
        f"{recomputed} tokens recomputed for {lost} lost in {len(log.preemptions)} preemption(s)"
    )
    return Outcome(PASS if excess <= 0 else FAIL, excess, "tokens", "<= 0", detail)


# -- preemption during chunked prefill ---------------------------------------------------------


def _chunked_build(scale: Scale) -> list[Variant]:
    length = min(3 * scale.budget, scale.max_prompt)
    kv = 7 * length // 3 + 2 * scale.budget if scale.sets_kv else scale.kv_tokens
    length = min(length, kv // 3)
    u = scale.unit_s
    reqs = [request(f"low{i}", 0.01 * i * u, length, 8, _batch(scale)) for i in range(scale.cap)]
    reqs += [request(f"urgent{i}", (1 + i) * u, length, 8, _chat(scale, 200)) for i in range(2)]
    return [Variant("base", make_workload("chunked_preemption", reqs), kv_tokens=kv)]


def _hopeless(df: pd.DataFrame) -> pd.Series:
    """Requests the policy rejected as unable to meet their SLO (``reject_hopeless``): its
    declared overload answer, accounted for with a reason, so not a lost request."""
    return (df["status"] == "rejected") & (df["reason"] == "slo_unattainable")


def _chunked_check(runs: Mapping[str, RunResult], scale: Scale, _: object) -> Outcome:
    run = runs["base"]
    df = run.requests
    hopeless = int(_hopeless(df).sum())
    n, bad = len(df), _unfinished(df) - hopeless
    if run.log is None:
        ok = PASS if bad == 0 else FAIL
        return Outcome(
            ok,
            bad,
            "requests unfinished",
            "== 0",
            f"{n - bad - hopeless}/{n} finished"
            + (f" ({hopeless} rejected as unattainable)" if hopeless else "")
            + "; KV and queue at the end not observable over "
            "HTTP; preemptions not observable",
        )
    log = run.log
    mid = sum(1 for p in log.preemptions if p.computed_tokens < p.prompt_tokens)
    stats = log.last_stats
    kv_left = stats.used_hbm_blocks if stats else 0
    queue_left = stats.num_waiting if stats else 0
    value = bad + kv_left + queue_left
    detail = (
        f"{n - bad - hopeless}/{n} finished"
        + (f" ({hopeless} rejected as unattainable)" if hopeless else "")
        + f"; {mid} of {len(log.preemptions)} preemption(s) mid "
        f"prefill; after the last step {kv_left} KV blocks used, {queue_left} waiting"
    )
    if value:
        return Outcome(FAIL, value, "left over", "== 0", detail)
    return Outcome(PASS if mid else NOT_EXERCISED, value, "left over", "== 0", detail)


# -- head-of-line blocking ---------------------------------------------------------------------


def _hol_build(scale: Scale) -> list[Variant]:
    long = min(8 * scale.budget, scale.kv_tokens // 2, scale.max_prompt)
    u = scale.unit_s
    reqs = [request("long", 0.0, long, 4, _batch(scale))]
    reqs += [request(f"short{i}", (1 + i) * u, SHORT_PROMPT, 4, _chat(scale)) for i in range(4)]
    return [Variant("base", make_workload("head_of_line", reqs))]


def _hol_check(runs: Mapping[str, RunResult], scale: Scale, _: object) -> Outcome:
    df = _by_id(runs["base"].requests)
    # A short rejected as unattainable (its first token was due before the step running at its
    # arrival could end: reject_hopeless) is the policy's declared overload answer, counted in
    # the detail; any other end, or no short served at all, fails.
    hopeless = _hopeless(df) & (df.index != "long")
    ends = df[(df["status"] != "finished") & ~hopeless]
    if len(ends) or int(hopeless.sum()) == len(df) - 1:
        why = ", ".join(
            f"{i}: {r.status} ({r.reason})" for i, r in df[df["status"] != "finished"].iterrows()
        )
        return Outcome(FAIL, None, "ratio", "<= 0.5", f"not every request finished: {why}")
    long_ttft = float(df.loc["long", "ttft_ms"])
    shorts = df[(df.index != "long") & ~hopeless]["ttft_ms"]
    ratio = float(shorts.max()) / long_ttft
    detail = (
        f"short TTFT max {shorts.max():.0f} ms, median {shorts.median():.0f} ms while a "
        f"{int(df.loc['long', 'prompt_tokens'])}-token prompt took {long_ttft:.0f} ms to "
        "its first token"
    )
    if hopeless.any():
        detail += f"; {int(hopeless.sum())} short(s) rejected as unattainable"
    return Outcome(PASS if ratio <= 0.5 else FAIL, round(ratio, 3), "ratio", "<= 0.5", detail)


# -- class separation under overload -----------------------------------------------------------


#: Arrival gap between pairs in ``class_separation``, decode steps: twice the cap's capacity
#: (the cap's requests of 16 tokens free a slot every 4 steps; a pair arrives every 2).
SEPARATION_GAP = 2.0


def _separation_build(scale: Scale) -> list[Variant]:
    u = scale.unit_s
    tight = SLO("chat", ttft_ms=round((scale.ttft0_s + 24 * u) * 1e3, 3), priority=0)
    loose = SLO("batch", ttft_ms=round((scale.ttft0_s + 48 * u) * 1e3, 3), priority=0)
    reqs = []
    for i in range(4 * scale.cap):
        first, second = (tight, loose) if i % 2 == 0 else (loose, tight)
        t = SEPARATION_GAP * i * u
        reqs.append(request(f"{first.name}{i}", t, SHORT_PROMPT, 16, first))
        reqs.append(request(f"{second.name}{i}", t, SHORT_PROMPT, 16, second))
    return [Variant("base", make_workload("class_separation", reqs))]


def _separation_check(runs: Mapping[str, RunResult], scale: Scale, _: object) -> Outcome:
    df = runs["base"].requests
    att = df.groupby("slo_class")["met_slo"].mean()
    tight, loose = float(att.get("chat", 0.0)), float(att.get("batch", 0.0))
    diff = round(tight - loose, 3)
    detail = f"attainment tight {tight:.3f} vs loose {loose:.3f} (same traffic, same priority)"
    if tight == 1.0 and loose == 1.0:
        return Outcome(NOT_EXERCISED, diff, "attainment", ">= 0", detail + ": no overload")
    return Outcome(PASS if diff >= 0 else FAIL, diff, "attainment", ">= 0", detail)


# -- fields honoured ---------------------------------------------------------------------------


def _fields_build(scale: Scale) -> list[Variant]:
    u = scale.unit_s
    reqs = []
    for i in range(3 * scale.cap):
        if i % 2:
            slo = _chat(scale, 6)
        else:  # deadlines that interleave with the chat requests' TTFT deadlines
            due = scale.ttft0_s + (8 + 6 * (i % 3)) * scale.unit_s
            slo = SLO("batch", deadline_s=round(due, 6), priority=1)
        reqs.append(request(f"q{i}", 0.5 * i * u, SHORT_PROMPT + 8 * (i % 4), 8 + 4 * (i % 3), slo))
    base = make_workload("fields", reqs)
    return [Variant("base", base), *(Variant(f"no_{f}", strip_field(base, f)) for f in FIELDS)]


def _changed(a: RunResult, b: RunResult) -> tuple[bool, float]:
    """Whether two runs decided differently, and the share of request pairs whose first-token
    order flipped (exact runs: any timestamp difference counts)."""
    x, y = _by_id(a.requests), _by_id(b.requests).reindex(_by_id(a.requests).index)
    fx, fy = _first_token_s(x).to_numpy(), _first_token_s(y).to_numpy()
    n = len(fx)
    dx, dy = np.sign(fx[:, None] - fx[None, :]), np.sign(fy[:, None] - fy[None, :])
    pairs = n * (n - 1)
    flipped = float(((dx * dy) < 0).sum()) / pairs if pairs else 0.0
    if a.exact:
        same = (
            np.allclose(fx, fy, rtol=0, atol=1e-9, equal_nan=True)
            and np.allclose(
                x["finish_s"].to_numpy(),
                y["finish_s"].to_numpy(),
                rtol=0,
                atol=1e-9,
                equal_nan=True,
            )
            and (x["status"].to_numpy() == y["status"].to_numpy()).all()
        )
        return (not same), flipped
    return flipped > 0.2, flipped


def _fields_check(
    runs: Mapping[str, RunResult], scale: Scale, declared: frozenset[str] | None
) -> Outcome:
    honoured, parts = set(), []
    for f in FIELDS:
        changed, flipped = _changed(runs["base"], runs[f"no_{f}"])
        if changed:
            honoured.add(f)
        parts.append(f"{f}: {'yes' if changed else 'no'} ({flipped:.0%} of pairs reordered)")
    detail = "; ".join(parts)
    if declared is None:
        return Outcome(INFO, len(honoured), "fields", "(no declaration)", detail)
    ok = honoured == set(declared)
    want = ",".join(sorted(declared)) or "none"
    return Outcome(
        PASS if ok else FAIL,
        len(honoured),
        "fields",
        f"== {{{want}}}",
        detail + ("" if ok else f"; declared: {want}"),
    )


# -- priority polarity -------------------------------------------------------------------------


def _polarity_build(scale: Scale) -> list[Variant]:
    u = scale.unit_s
    out = []
    for name, urgent_rank, other_rank in (("as_sent", 0, 1), ("flipped", 1, 0)):
        reqs = [
            request(f"block{i}", 0.01 * i * u, SHORT_PROMPT, 12 + 4 * i, _batch(scale, other_rank))
            for i in range(scale.cap)
        ]
        reqs += [
            request(f"low{i}", (3 + 0.2 * i) * u, SHORT_PROMPT, 4, _batch(scale, other_rank))
            for i in range(2)
        ]
        reqs += [
            request(f"urgent{i}", (3.5 + 0.2 * i) * u, SHORT_PROMPT, 4, _batch(scale, urgent_rank))
            for i in range(2)
        ]
        out.append(Variant(name, make_workload(f"polarity-{name}", reqs)))
    return out


def _urgent_first(run: RunResult, scale: Scale) -> bool:
    """Whether the urgent pair's mean first token led the low pair's by over one decode step
    (``scale.unit_s``; honoured priority leads by ~8, a slot freeing every 4): less is a tie."""
    df = _by_id(run.requests)
    ft = _first_token_s(df)
    urgent = ft[[i for i in df.index if i.startswith("urgent")]].mean()
    low = ft[[i for i in df.index if i.startswith("low")]].mean()
    return bool(low - urgent > scale.unit_s)


def _polarity_check(runs: Mapping[str, RunResult], scale: Scale, _: object) -> Outcome:
    a, b = _urgent_first(runs["as_sent"], scale), _urgent_first(runs["flipped"], scale)
    thr = "== +1"
    if a and not b:
        return Outcome(
            PASS,
            1,
            "sign",
            thr,
            "the request sent as more urgent ran first, both "
            "ways: the backend's priority mapping is right",
        )
    if b and not a:
        return Outcome(
            FAIL,
            -1,
            "sign",
            thr,
            "the request sent as LESS urgent ran first, both "
            "ways: the engine's priority polarity is the opposite of the mapping",
        )
    what = (
        "the later-arriving urgent request ran first both ways" if a else "arrival order both ways"
    )
    return Outcome(INFO, 0, "sign", thr, f"priority not honoured ({what}): polarity undetectable")


# -- KV retention by priority ------------------------------------------------------------------


def _retention_build(scale: Scale) -> list[Variant]:
    block = 64
    kv = 2048 if scale.sets_kv else scale.kv_tokens
    u = scale.unit_s
    prefix = tuple(range(1, 5))  # 4 blocks of 64 tokens shared by the urgent requests
    reqs = [
        request(
            "vip0", 0.0, 5 * block, 4, _chat(scale), hashes=(*prefix, 100), hash_block_tokens=block
        )
    ]
    for i in range(8):
        hashes = tuple(1000 + 10 * i + j for j in range(kv // (4 * block)))
        reqs.append(
            request(
                f"bulk{i}",
                (20 + 2 * i) * u,
                len(hashes) * block,
                4,
                _batch(scale),
                hashes=hashes,
                hash_block_tokens=block,
            )
        )
    reqs.append(
        request(
            "vip1",
            80 * u,
            5 * block,
            4,
            _chat(scale),
            hashes=(*prefix, 101),
            hash_block_tokens=block,
        )
    )
    return [Variant("base", make_workload("kv_retention", reqs), kv_tokens=kv)]


def _retention_check(runs: Mapping[str, RunResult], scale: Scale, _: object) -> Outcome:
    df = _by_id(runs["base"].requests)
    if df.loc["vip1", "status"] != "finished":  # never ran: the cache was not put to the test
        why = f"{df.loc['vip1', 'status']} ({df.loc['vip1', 'reason']})"
        return Outcome(NOT_EXERCISED, None, "hit fraction", ">= 0.5", f"vip1 {why}: never ran")
    hit = float(df.loc["vip1", "cached_tokens"]) / (4 * 64)
    bulk = int(df.loc[[i for i in df.index if i.startswith("bulk")], "prompt_tokens"].sum())
    detail = (
        f"the high-priority 256-token prefix: {hit:.0%} served from cache after "
        f"{bulk} tokens of low-priority prompts passed through"
    )
    return Outcome(PASS if hit >= 0.5 else FAIL, round(hit, 3), "hit fraction", ">= 0.5", detail)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "priority_inversion",
        "an urgent request at the running cap with KV free",
        frozenset(),
        _inversion_build,
        _inversion_check,
    ),
    Scenario(
        "readmission_order",
        "preempted requests re-admitted ahead of later arrivals",
        frozenset({"decisions"}),
        _pressure_build,
        _readmission_check,
    ),
    Scenario(
        "recompute_excess",
        "tokens recomputed beyond what preemption lost",
        frozenset({"decisions"}),
        _pressure_build,
        _recompute_check,
        ("readmission_order",),
    ),
    Scenario(
        "chunked_prefill_preemption",
        "preemption mid chunked prefill: all finish, KV and queue back to zero",
        frozenset(),
        _chunked_build,
        _chunked_check,
    ),
    Scenario(
        "head_of_line",
        "short chat TTFT while one long prompt prefills",
        frozenset(),
        _hol_build,
        _hol_check,
    ),
    Scenario(
        "class_separation",
        "tight vs loose class attainment under overload",
        frozenset(),
        _separation_build,
        _separation_check,
    ),
    Scenario(
        "fields_honoured",
        "which request fields change a decision",
        frozenset(),
        _fields_build,
        _fields_check,
    ),
    Scenario(
        "priority_polarity",
        "the priority mapping the backend needs, detected",
        frozenset(),
        _polarity_build,
        _polarity_check,
    ),
    Scenario(
        "kv_retention",
        "a high-priority prefix still cached after low-priority pressure",
        frozenset({"cache"}),
        _retention_build,
        _retention_check,
    ),
)


def scenario_names() -> list[str]:
    """Every scenario's name, in matrix order."""
    return [s.name for s in SCENARIOS]
