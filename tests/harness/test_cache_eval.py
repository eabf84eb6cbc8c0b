"""The offline prefix-cache evaluator: exact hit counts on hand-made traces, Belady's optimality
by exhaustive search, the predictor's exact LRU cold start, CPU-tier accounting."""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from superinfer.cli import main
from superinfer.harness.errors import TraceFormatError
from superinfer.harness.offline.cache_eval import (
    HIT_RATE_COLUMNS,
    BlockTrace,
    belady_prefix_hits,
    block_trace,
    replay,
)
from superinfer.harness.workload.traces import TraceRow
from superinfer.policy_core.reuse import ReusePredictorConfig
from superinfer.policy_core.reuse_adaptive import ADAPTIVE_EXPERTS
from tests.factories import random_forest, root_path


def trace(
    requests: list[list[int]],
    prompts: list[int] | None = None,
    *,
    gap_s: float = 1.0,
    block_tokens: int = 4,
) -> BlockTrace:
    prompts = prompts or [block_tokens * len(r) for r in requests]
    rows = [
        TraceRow(gap_s * i, p, 1, i + 1, tuple(r))
        for i, (r, p) in enumerate(zip(requests, prompts, strict=True))
    ]
    return block_trace(rows, "hand", block_tokens=block_tokens)


def hits(policy: str, tr: BlockTrace, hbm: int, cpu: int = 0, **kw: object) -> tuple[int, ...]:
    r = replay(tr, policy, 0.0, hbm, cpu, **kw)  # type: ignore[arg-type]
    return (r.hit_blocks, r.cpu_hit_blocks, r.hit_tokens, r.cpu_hit_tokens, r.offloaded_blocks)


# Two conversations alternate on a shared first block; two blocks of cache.
ALTERNATE = [[1, 2], [1, 3], [1, 2], [1, 3]]


def test_belady_exact_on_hand_made_sequences() -> None:
    tr = trace(ALTERNATE, prompts=[7, 7, 7, 7])
    # After r0 keep {1, 2}; after r1 {1 (next r2), 2 (r2)} beat 3 (r3); after r2 only 1
    # (2 is never used again, 3 is gone): r3 hits 1 block. Keeping 3 instead also gives 4.
    assert belady_prefix_hits(tr, 2).tolist() == [0, 1, 2, 1]
    res = replay(tr, "belady", 0.1, 2)
    assert (res.hit_blocks, res.total_blocks) == (4, 8)
    assert (res.hit_tokens, res.total_tokens) == (0 + 4 + 7 + 4, 28)  # min(k * 4, 7)
    tr2 = trace([[1, 2], [1, 2], [1, 3], [1, 4], [1, 2]])
    assert belady_prefix_hits(tr2, 2).tolist() == [0, 2, 1, 1, 2]
    assert belady_prefix_hits(tr2, 1).tolist() == [0, 1, 1, 1, 1]
    assert belady_prefix_hits(tr2, 3).tolist() == [0, 2, 1, 1, 2]


def test_lru_and_lfu_exact_on_hand_made_sequences() -> None:
    # LRU evicts the least recent leaf: 2 after r1, 3 after r2 -> one hit per request.
    assert hits("lru", trace(ALTERNATE, prompts=[7] * 4), 2) == (3, 0, 12, 0, 0)
    tr2 = trace([[1, 2], [1, 2], [1, 3], [1, 4], [1, 2]])
    # LRU drops 2 for 3 after r2; LFU keeps 2 (two uses) and drops 3, then 4.
    assert hits("lru", tr2, 2)[0] == 0 + 2 + 1 + 1 + 1
    assert hits("lfu", tr2, 2)[0] == 0 + 2 + 1 + 1 + 2


def _brute_force(tr: BlockTrace, capacity: int) -> int:
    """Most prefix hits any policy can get: every keep-set after every request."""
    states: dict[frozenset[int], int] = {frozenset(): 0}
    for r in range(tr.num_requests):
        blocks = tr.blocks[tr.offsets[r] : tr.offsets[r + 1]].tolist()
        nxt: dict[frozenset[int], int] = {}
        for cache, score in states.items():
            k = 0
            while k < len(blocks) and blocks[k] in cache:
                k += 1
            pool = sorted(cache | set(blocks))
            for size in range(min(capacity, len(pool)) + 1):
                for keep in itertools.combinations(pool, size):
                    key = frozenset(keep)
                    nxt[key] = max(nxt.get(key, -1), score + k)
        states = nxt
    return max(states.values())


def _random_trace(rng: np.random.Generator, nodes: int, requests: int) -> BlockTrace:
    parent, _ = random_forest(rng, nodes, many_roots=False)
    return trace([root_path(parent, int(rng.integers(0, nodes))) for _ in range(requests)])


@pytest.mark.parametrize("seed", range(25))
def test_belady_is_optimal_by_exhaustive_search(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tr = _random_trace(rng, nodes=6, requests=6)
    for capacity in (1, 2, 3):
        assert int(belady_prefix_hits(tr, capacity).sum()) == _brute_force(tr, capacity)


@pytest.mark.parametrize("policy", ["lru", "lfu"])
@pytest.mark.parametrize("cpu", [0, 6])
def test_heap_lru_lfu_match_the_planner_exactly(policy: str, cpu: int) -> None:
    rng = np.random.default_rng(11)
    tr = _random_trace(rng, nodes=60, requests=300)
    # Three requests per instant, as in Mooncake's 3 s buckets: ties in recency.
    tr = dataclasses.replace(tr, arrival_s=np.floor(tr.arrival_s / 3.0) * 3.0)
    for hbm in (4, 10):
        fast = replay(tr, policy, 0.1, hbm, cpu)
        slow = replay(tr, policy, 0.1, hbm, cpu, via_planner=True)
        assert fast.minute_hit_blocks.tolist() == slow.minute_hit_blocks.tolist()
        assert hits(policy, tr, hbm, cpu) == hits(policy, tr, hbm, cpu, via_planner=True)


@pytest.mark.parametrize("cpu", [0, 8])
def test_predictor_cold_start_is_exactly_lru(cpu: int) -> None:
    rng = np.random.default_rng(7)
    tr = _random_trace(rng, nodes=80, requests=400)
    never = ReusePredictorConfig(min_labels=10**9)
    lru = replay(tr, "lru", 0.1, 12, cpu)
    pred = replay(tr, "predictor", 0.1, 12, cpu, predictor_config=never)
    for field in ("hit_blocks", "cpu_hit_blocks", "hit_tokens", "offloaded_blocks"):
        assert getattr(pred, field) == getattr(lru, field), field
    assert pred.minute_hit_blocks.tolist() == lru.minute_hit_blocks.tolist()
    assert pred.predictor is not None and pred.predictor["mode"] == "fallback_lru"
    # With a reachable label count it leaves the fallback, at an instant it reports.
    soon = replay(
        tr,
        "predictor",
        0.1,
        12,
        cpu,
        predictor_config=ReusePredictorConfig(
            min_labels=64, min_labels_per_class=1, initial_horizon_s=5.0
        ),
    )
    assert soon.predictor is not None and soon.predictor["mode"] == "model"
    assert soon.predictor["labels_at_switch"] >= 64


def test_cpu_tier_hits_are_counted_and_split() -> None:
    tr = trace([[1, 2], [3], [1, 2]], prompts=[8, 4, 8])
    # HBM 2 blocks: r1 pushes 2 (LRU, deepest of r0) to CPU; r2 finds 1 in HBM and 2 in CPU.
    assert hits("lru", tr, 2, 2) == (2, 1, 8, 4, 2)
    assert hits("lru", tr, 2, 0) == (1, 0, 4, 0, 0)
    res = replay(tr, "belady", 0.1, 2, 2)  # MIN keeps {1, 2} in HBM: 3 is never used again
    assert (res.hit_blocks, res.cpu_hit_blocks) == (2, 0)


def test_an_unbounded_cache_hits_every_reuse() -> None:
    rng = np.random.default_rng(3)
    tr = _random_trace(rng, nodes=50, requests=200)
    seen: set[int] = set()
    reuses = 0
    for b in tr.blocks.tolist():
        reuses += b in seen
        seen.add(b)
    for policy in ("lru", "lfu", "predictor", "belady"):
        assert replay(tr, policy, 1.0, tr.num_unique).hit_blocks == reuses, policy


def test_block_trace_rejects_hashes_that_are_not_prefix_chained() -> None:
    with pytest.raises(TraceFormatError, match=r"hand:2: field 'hash_ids': hash 2 follows"):
        block_trace(
            [TraceRow(0.0, 8, 1, 1, (1, 2)), TraceRow(1.0, 8, 1, 2, (3, 2))],
            "t",
            block_tokens=4,
            source="hand",
        )
    with pytest.raises(TraceFormatError, match="a hash repeats in one request"):
        block_trace([TraceRow(0.0, 8, 1, 1, (1, 1))], "t", block_tokens=4, source="hand")


def _write_jsonl(path: Path, requests: list[list[int]]) -> None:
    lines = [
        json.dumps(
            {
                "timestamp": 3000 * i,
                "input_length": 512 * len(r) - 100,
                "output_length": 10,
                "hash_ids": r,
            }
        )
        for i, r in enumerate(requests)
    ]
    path.write_text("\n".join(lines) + "\n")


def _superinfer(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    """Run the ``superinfer`` entry point in-process; (exit status, stderr)."""
    monkeypatch.setattr(sys, "argv", ["superinfer", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def test_cli_cache_eval_writes_the_contract_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(1)
    tr = _random_trace(rng, nodes=60, requests=120)
    reqs = [tr.blocks[tr.offsets[r] : tr.offsets[r + 1]].tolist() for r in range(tr.num_requests)]
    src = tmp_path / "tiny.jsonl"
    _write_jsonl(src, reqs)
    out = tmp_path / "cache"
    args = [
        "cache-eval",
        "--trace",
        str(src),
        "--capacities",
        "0.1,0.2",
        "--cpu-ratio",
        "1",
        "--jobs",
        "1",
        "--out",
        str(out),
    ]
    code, err = _superinfer(args, monkeypatch, capsys)
    assert code == 0, err
    table = pd.read_csv(out / "hit_rates.csv")
    assert tuple(table.columns) == HIT_RATE_COLUMNS
    assert len(table) == 4 * 2 * 2 and set(table.policy) == {"lru", "lfu", "predictor", "belady"}
    assert (table.trace == "tiny").all()
    # Belady bounds every policy at equal capacity and tier.
    for _, grp in table.groupby(["capacity_frac", "cpu_tier"]):
        best = grp.set_index("policy").block_hit_rate
        assert (best <= best["belady"] + 1e-12).all()
    for name in (
        "hit_rates_detail.csv",
        "hit_rates_by_minute.csv",
        "hit_rates.png",
        "report.md",
        "manifest.json",
    ):
        assert (out / name).is_file(), name
    report = (out / "report.md").read_bytes()
    (out / "report.md").unlink()
    assert (
        _superinfer(["cache-eval", "--report-only", "--out", str(out)], monkeypatch, capsys)[0] == 0
    )
    assert (out / "report.md").read_bytes() == report  # the report is a function of the files


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--capacities", "x"], "error: --capacities: 'x' is not a number"),
        (["--capacities", "1.5"], "error: capacity fractions must be in (0, 1], got 1.5"),
        (["--policies", "nosuch"], "error: unknown cache policy 'nosuch'; known: lru, lfu"),
        (["--policies", "adaptive-s0"], "error: unknown cache policy 'adaptive-s0'; known: "),
        (["--trace", "nosuch"], "error: unknown trace 'nosuch': give mooncake or a Mooncake"),
        (["--report-only"], "error: "),
    ],
)
def test_cli_cache_eval_mistakes_are_one_line_errors(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    code, err = _superinfer(
        ["cache-eval", *args, "--out", str(tmp_path / "none")], monkeypatch, capsys
    )
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert err.startswith(message), err


def test_generated_traces_are_seeded_and_have_their_structure() -> None:
    from superinfer.harness.offline.cache_trace import load_cache_trace
    from superinfer.harness.offline.cache_workloads import GENERATED_TRACES, generate_rows

    for name, spec in GENERATED_TRACES.items():
        short = dataclasses.replace(spec, duration_s=300.0)
        a, b = generate_rows(short, seed=3), generate_rows(short, seed=3)
        assert a == b and a != generate_rows(short, seed=4), name
        tr = block_trace(a, name, block_tokens=spec.block_tokens)  # prefix-chained, sorted
        assert (np.diff(tr.arrival_s) >= 0).all()
        assert (tr.prompt_tokens <= spec.block_tokens * np.diff(tr.offsets)).all()
    one = load_cache_trace("gen-one-shot", duration_s=120.0)
    assert one.num_unique == len(one.blocks)  # no block is ever reused
    sp = GENERATED_TRACES["gen-system-prompts"]
    rows = generate_rows(dataclasses.replace(sp, duration_s=200.0))
    firsts = {r.block_hashes[0] for r in rows}
    assert len(firsts) <= sp.num_prefixes < len(rows)
    mt = generate_rows(dataclasses.replace(GENERATED_TRACES["gen-multi-turn"], duration_s=600.0))
    by_start: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for r in mt:
        by_start.setdefault(r.block_hashes[:1], []).append(r.block_hashes)
    # Some session re-sends its whole previous prompt as the prefix of the next turn.
    assert any(
        len(x) < len(y) and y[: len(x)] == x
        for turns in by_start.values()
        for x, y in zip(turns, turns[1:], strict=False)
    )


def test_targets_gap_closed_is_exact_and_several_traces_share_one_run(tmp_path: Path) -> None:
    from superinfer.harness.offline.cache_eval import (
        CacheEvalConfig,
        run_cache_eval,
        write_cache_eval,
    )
    from superinfer.harness.offline.cache_report import targets_table

    table = pd.DataFrame(
        [("t", p, 0.1, False, v, v) for p, v in
         (("lru", 0.2), ("lfu", 0.1), ("arc", 0.25), ("s3fifo", 0.24), ("adaptive", 0.26),
          ("belady", 0.45))],
        columns=list(HIT_RATE_COLUMNS),
    )  # fmt: skip
    row = targets_table(table).iloc[0]
    assert row.best_simple == "arc" and row.gap_closed == pytest.approx(0.01 / 0.2)
    assert row.margin_points == pytest.approx(1.0) and row.never_worse_met
    assert row.gap_target_applies and not row.gap_target_met
    config = CacheEvalConfig(
        trace="gen-system-prompts,gen-one-shot",
        capacity_fracs=(0.05,),
        cpu_ratio=1.0,
        policies=("lru", "arc", "s3fifo", "adaptive", "belady"),
        duration_s=120.0,
    )
    traces, results = run_cache_eval(config)
    assert [t.name for t in traces] == ["gen-system-prompts", "gen-one-shot"]
    write_cache_eval(tmp_path, traces, config, results)
    hit = pd.read_csv(tmp_path / "hit_rates.csv")
    assert set(hit.trace) == {"gen-system-prompts", "gen-one-shot"}
    assert (hit[hit.trace == "gen-one-shot"].block_hit_rate == 0).all()
    targets = pd.read_csv(tmp_path / "targets.csv")
    assert len(targets) == 4 and "gap_closed" in targets
    for _, grp in hit.groupby(["trace", "cpu_tier"]):
        by = grp.set_index("policy").block_hit_rate
        assert (by <= by["belady"] + 1e-12).all()


def test_adaptive_cpu_tier_follows_the_union_leader() -> None:
    # A hot two-block prompt [0, 1] every third request, fresh one-block prompts between; 1 HBM
    # block and 2 CPU blocks (a union of 3). LRU's tiers, like a 3-block LRU, keep 0 but drop 1
    # for the two fresh blocks: one hit per hot request (99 of the 100; the first is cold).
    # The union-sized S3-FIFO shadow keeps both and takes the union lead once 30 block
    # references are seen (the 8th hot request, whose hit was counted before); from then on
    # the CPU tier drops the fresh block, which the union leader does not hold, instead of 1:
    # the 7 hot requests before hit 1 block, the 92 after hit 2: 7 + 184 = 191, all from CPU
    # (HBM follows LRU and holds the last fresh block).
    n = 300
    tr = trace([[0, 1] if i % 3 == 0 else [i + 1000] for i in range(n)])
    assert hits("lru", tr, 1, 2)[:2] == (99, 99)
    res = replay(tr, "adaptive", 0.0, 1, 2)
    assert (res.hit_blocks, res.cpu_hit_blocks) == (191, 191)
    assert res.predictor is not None
    assert res.predictor["union_switches"] == ["30:lru->s3fifo"]
    assert res.predictor["leader"] == "lru"


def test_adaptive_sn_replays_the_sampled_predictor() -> None:
    # adaptive-s1 (sample rate 1) is the unsampled predictor: the same hits and switches; the
    # sampled adaptive-s4 runs (its metrics name a leader) on the same trace and tiers.
    n = 300
    tr = trace([[0, 1] if i % 3 == 0 else [i + 1000] for i in range(n)])
    full, one = replay(tr, "adaptive", 0.0, 1, 2), replay(tr, "adaptive-s1", 0.0, 1, 2)
    assert (one.hit_blocks, one.cpu_hit_blocks) == (full.hit_blocks, full.cpu_hit_blocks)
    assert one.predictor is not None and full.predictor is not None
    assert one.predictor["union_switches"] == full.predictor["union_switches"]
    assert one.policy == "adaptive-s1"
    four = replay(tr, "adaptive-s4", 0.0, 1, 2)
    assert four.predictor is not None and four.predictor["leader"] in ADAPTIVE_EXPERTS
