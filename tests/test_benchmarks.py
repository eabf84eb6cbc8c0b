"""The benchmark scripts run and write their result files (timings are never asserted)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_policy_overhead_writes_its_csv(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "policy_overhead.py"),
            "--sizes",
            "8x32,16x64",
            "--calls",
            "6",
            "--warmup",
            "2",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    with (tmp_path / "policy_overhead.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:5] == ["policy", "n_running", "n_waiting", "median_us", "p99_us"]
    policies = ["edf", "fcfs", "lpm", "mlfq", "oracle", "priority", "superinfer"]
    assert [(r["policy"], r["n_running"], r["n_waiting"]) for r in rows] == [
        (p, n, w) for n, w in (("8", "32"), ("16", "64")) for p in policies
    ]
    assert all(float(r["median_us"]) > 0 for r in rows)


def test_policy_overhead_takes_the_page_size(tmp_path: Path) -> None:
    """``--block-tokens 1`` (SGLang's default page size) runs the double with one-token pages;
    0 is a one-line usage error."""
    script = [sys.executable, str(ROOT / "benchmarks" / "policy_overhead.py")]
    args = ["--sizes", "8x32", "--calls", "6", "--warmup", "2", "--repeats", "1"]
    args += ["--policies", "superinfer,fcfs", "--out", str(tmp_path)]
    proc = subprocess.run([*script, *args, "--block-tokens", "1"], capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    with (tmp_path / "policy_overhead.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["policy"], r["calls"]) for r in rows] == [("superinfer", "6"), ("fcfs", "6")]
    bad = subprocess.run([*script, *args, "--block-tokens", "0"], capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].endswith("--block-tokens must be >= 1")


# Runs each script's module body (its imports) without its `__main__` block, in one child process.
_IMPORT_ALL = """
import json, runpy, sys
failed, skipped = {}, {}
for path in sys.argv[1:]:
    try:
        runpy.run_path(path, run_name="benchmark_import_check")
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] == "superinfer":
            failed[path] = repr(exc)
        else:  # an optional extra (torch, triton, ...) that this install lacks
            skipped[path] = exc.name
    except Exception as exc:
        failed[path] = repr(exc)
print(json.dumps({"failed": failed, "skipped": skipped}))
"""


def test_every_benchmark_script_imports() -> None:
    """Every script's top-level imports resolve: a moved superinfer module fails here, not later
    on a machine that runs the script (only ``policy_overhead.py`` runs in the tests)."""
    scripts = sorted(str(p) for p in (ROOT / "benchmarks").glob("*.py"))
    assert scripts
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, *scripts],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["failed"] == {}


def test_seed_real_engines_states_the_rows_from_the_repeats() -> None:
    import runpy

    import pandas as pd

    mod = runpy.run_path(str(ROOT / "benchmarks" / "seed_real_engines.py"), run_name="t")
    rows = []
    for engine, native in (("hf", "fcfs"), ("sglang", "native")):
        for policy, ttft, tok, kv, att in ((native, 2000.0, 8.0, 0.2, 0.8),
                                           ("superinfer", 800.0, 7.8, 0.1, 0.95)):  # fmt: skip
            for cls, metric, mean in (
                ("chat", "ttft_p99_ms", ttft),
                ("batch", "output_tok_s", tok),
                ("all", "kv_peak_gb", kv),
                ("chat", "slo_attainment", att),
            ):
                rows.append((engine, policy, 1.5, cls, metric, 3, mean, mean - 1, mean + 1, 0.5))
    agg = pd.DataFrame(rows, columns=["engine", "policy", "load", "slo_class", "metric", "n",
                                      "mean", "min", "max", "std"])  # fmt: skip
    table = mod["seed_rows"](agg)
    hf = table[(table["engine"] == "hf") & (table["policy"] == "superinfer/fcfs")]
    assert dict(zip(hf["metric"], hf["value"].round(6), strict=True)) == {
        "chat_p99_latency_ratio": 0.4,
        "batch_throughput_ratio": 0.975,
        "peak_kv_ratio": 0.5,
        "chat_attainment_points": 15.0,
    }
    side = table[(table["engine"] == "sglang") & (table["policy"] == "native")]
    assert side[["min", "max", "n_repeats"]].iloc[0].tolist() == [1999.0, 2001.0, 3]
    assert len(table) == 2 * (8 + 4)
    with pytest.raises(ValueError, match="hf at 1.5 req/s is given twice"):
        mod["seed_rows"](pd.concat([agg, agg]))


def test_seed_real_engines_pools_the_repeats_of_several_runs() -> None:
    import runpy

    import pandas as pd

    mod = runpy.run_path(str(ROOT / "benchmarks" / "seed_real_engines.py"), run_name="t")
    cols = ["engine", "policy", "repeat", "load", "slo_class", "slo_attainment"]
    one = pd.DataFrame([("sglang", "native", r, 0.6, "chat", a) for r, a in enumerate((0.5, 0.7))],
                       columns=cols)  # fmt: skip
    two = pd.DataFrame([("sglang", "native", 0, 0.6, "chat", 0.9)], columns=cols)
    agg = mod["pooled_aggregate"]([one, two])
    row = agg[agg["metric"] == "slo_attainment"].iloc[0]
    assert (row["n"], row["min"], row["max"]) == (3, 0.5, 0.9)
    assert row["mean"] == pytest.approx(0.7)


def test_feasible_misses_breaks_attainment_down_by_prompt_band() -> None:
    import runpy

    import pandas as pd

    from superinfer.harness.engines.base import BenchConfig
    from superinfer.harness.engines.isolated import engine_isolated_latency

    mod = runpy.run_path(str(ROOT / "benchmarks" / "feasible_misses.py"), run_name="t")
    # (prompt, status, met, feasible, ttft_ms): two short chats met, one 4,100-token chat rejected,
    # one missing its TTFT, one met; one infeasible chat and one batch request left out.
    nan = float("nan")
    rows = [(300, "finished", True, True, 200.0), (500, "finished", True, True, 300.0),
            (4100, "rejected", False, True, nan), (4100, "finished", False, True, 1200.0),
            (4100, "finished", True, True, 900.0),
            (9000, "finished", False, False, 2500.0)]  # fmt: skip
    df = pd.DataFrame(
        [("sim:vllm", "superinfer", "chat", p, s, m, f, t, 1000.0) for p, s, m, f, t in rows]
        + [("sim:vllm", "superinfer", "batch", 100, "finished", True, True, 50.0, nan)],
        columns=["engine", "policy", "slo_class", "prompt_tokens", "status", "met_slo",
                 "feasible", "ttft_ms", "slo_ttft_ms"],
    )  # fmt: skip
    table = mod["band_rows"](df, BenchConfig(), "r", "chat")
    assert table[["prompt_band", "n_feasible", "n_rejected", "n_ttft_missed",
                  "median_prompt_tokens"]].values.tolist() == [
        ["0-1024", 2, 0, 0, 400], ["4000-4200", 3, 1, 1, 4100]]  # fmt: skip
    assert table["attainment_feasible"].round(6).tolist() == [1.0, 0.333333]
    iso = engine_isolated_latency(BenchConfig(), "sim:vllm").prefill_ms(4100)
    assert table["isolated_ttft_ms"].iloc[1] == iso
    assert table["isolated_slack_ms"].iloc[1] == 1000.0 - iso
    with pytest.raises(ValueError, match="no request of class 'code'"):
        mod["band_rows"](df, BenchConfig(), "r", "code")


def test_window_outcomes_counts_how_the_window_requests_ended() -> None:
    import runpy

    import pandas as pd

    mod = runpy.run_path(str(ROOT / "benchmarks" / "window_outcomes.py"), run_name="t")
    # (policy, arrival_s, status, reason, met, ttft_ms, tpot_ms) against TTFT 1,000 / TPOT 100 ms:
    # in the window [100, 200): fcfs one met, one late on both, one late on TPOT only;
    # superinfer one met, two rejected; the arrivals at 99 and 200 are outside it.
    nan = float("nan")
    rows = [("fcfs", 99.0, "finished", "", False, 5000.0, 50.0),
            ("fcfs", 100.0, "finished", "", True, 900.0, 90.0),
            ("fcfs", 150.0, "finished", "", False, 1500.0, 150.0),
            ("fcfs", 160.0, "finished", "", False, 800.0, 120.0),
            ("fcfs", 200.0, "finished", "", False, 3000.0, 50.0),
            ("superinfer", 120.0, "finished", "", True, 500.0, 80.0),
            ("superinfer", 130.0, "rejected", "slo_unattainable", False, nan, nan),
            ("superinfer", 199.0, "rejected", "slo_unattainable", False, nan, nan)]  # fmt: skip
    df = pd.DataFrame(
        [(p, "chat", a, st, r, m, t, tp, 1000.0, 100.0) for p, a, st, r, m, t, tp in rows],
        columns=["policy", "slo_class", "arrival_s", "status", "reason", "met_slo", "ttft_ms",
                 "tpot_ms", "slo_ttft_ms", "slo_tpot_ms"],
    )  # fmt: skip
    table = mod["window_outcomes"](df, 100.0, 200.0)
    assert table.drop(columns="attainment").values.tolist() == [
        ["fcfs", "chat", 3, 1, 1, 2, 0, 0, ""],
        ["superinfer", "chat", 3, 1, 0, 0, 2, 0, "slo_unattainable"],
    ]
    assert table["attainment"].tolist() == [0.333333, 0.333333]


def test_sglang_kv_placement_offline_rates_by_hand() -> None:
    import runpy

    from superinfer.harness.workload.workload import CHAT_SLO, Source, Workload
    from superinfer.sim.request import RequestSpec

    mod = runpy.run_path(str(ROOT / "benchmarks" / "sglang_kv_placement.py"), run_name="t")
    # 4-token blocks, LRU of 3 blocks: [1, 2] misses (8 tokens); [1, 2, 3] finds 1, 2 (8 of
    # 12); [1, 4] finds 1 (4 of 8; 4 is new): 12 of 28 prompt tokens from the cache.
    reqs = tuple(
        RequestSpec(f"r{i}", float(i), 4 * len(h), 1, 1, CHAT_SLO, source="g",
                    block_hashes=h, hash_block_tokens=4)
        for i, h in enumerate([(1, 2), (1, 2, 3), (1, 4)])
    )  # fmt: skip
    w = Workload("g", reqs, (Source("g", "g", CHAT_SLO, 1),), 1.0, None)
    (row,) = mod["offline_rates"](w, 3, ("lru",))
    assert row == {"policy": "lru", "capacity_blocks": 3, "prefix_hit_rate": 12 / 28}
    from superinfer.harness.offline.cache_workloads import generated_workload

    gen = generated_workload(
        "gen-multi-turn",
        block_tokens=16,
        window_s=60.0,
        max_prompt_tokens=10_000,
        output_tokens=8,
        speedup=3.0,
    )
    assert gen.details["left_out"] == 0 and all(r.arrival_s < 20.0 for r in gen.requests)
    # the last block may be partial
    assert all(
        16 * (len(r.block_hashes) - 1) < r.prompt_tokens <= 16 * len(r.block_hashes)
        for r in gen.requests
    )


def test_cache_predictability_hindsight_policies_by_hand() -> None:
    """One reused block H (every 2 s) between one-shot blocks X1..X3, one block of cache: LRU
    always evicts H for the next X (no hit); Belady and both hindsight policies keep H (its class
    and age promise a reuse, an X's does not), so H hits at t = 2, 4, 6: 3 of 7 references."""
    import runpy

    import numpy as np

    from superinfer.harness.offline.cache_replay import replay
    from superinfer.harness.offline.cache_trace import BlockTrace

    mod = runpy.run_path(str(ROOT / "benchmarks" / "cache_predictability.py"), run_name="t")
    seq = [0, 1, 0, 2, 0, 3, 0]  # H X1 H X2 H X3 H, one block per request, 1 s apart
    n = len(seq)
    trace = BlockTrace("hand", np.arange(n, dtype=np.float64), np.full(n, 4), np.arange(n + 1),
                       np.array(seq), np.full(4, -1), np.zeros(4, dtype=np.int64),
                       np.full(4, 4), 4)  # fmt: skip
    cls, length, closed = mod["intervals"](trace, ("accesses",))
    # H's accesses 1, 2, 3, 4 -> classes 0, 1, 1, 2; its last interval and the X's stay open
    assert cls.tolist() == [0, 0, 1, 0, 1, 0, 2]
    assert length.tolist() == [2, 5, 2, 3, 2, 1, 0]
    assert closed.tolist() == [True, False, True, False, True, False, False]
    assert replay(trace, "lru", 0.25, 1).block_hit_rate == 0.0
    assert replay(trace, "belady", 0.25, 1).block_hit_rate == 3 / 7
    for method in mod["METHODS"]:
        for classing in (("accesses",), ()):
            ivl = mod["intervals"](trace, classing)
            k = mod["num_classes"](classing)
            table = mod["hindsight_tables"](*ivl, k, method, 6.0)
            cache = mod["HindsightCache"](1, [-1] * 4, [0] * 4, classing, table)
            stats: dict[str, float] = {}
            thr = mod["GAP"]["belady_threshold"](trace, mod["next_use"](trace), 1)
            assert mod["block_hit_rate"](trace, cache, thr, stats) == 3 / 7, (method, classing)
            assert stats["kept_share"] == 0.0  # every eviction is an X, never used again


def test_cache_predictability_tables_by_hand() -> None:
    """Two gaps of exactly 1 s (an age-bin edge): binned, the gap is spread over [1, 2^(1/4)) s,
    so the mean gap is (1 + 2^(1/4)) / 2 and the hit density from age 0 its inverse."""
    import runpy

    import numpy as np

    mod = runpy.run_path(str(ROOT / "benchmarks" / "cache_predictability.py"), run_name="t")
    cls, length, closed = np.zeros(2, dtype=np.int64), np.ones(2), np.ones(2, dtype=bool)
    mean = (1 + 2**0.25) / 2
    oracle = mod["hindsight_tables"](cls, length, closed, 1, "class-oracle", 100.0)
    assert oracle[0, 0] == pytest.approx(-mean)
    hazard = mod["hindsight_tables"](cls, length, closed, 1, "hazard-hindsight", 100.0)
    assert hazard[0, 0] == pytest.approx(1 / mean)
    # one of two never closes: the oracle counts it as a 100 s gap, the hazard as censored at 0 s
    closed[1], length[1] = False, 0.0
    oracle = mod["hindsight_tables"](cls, length, closed, 1, "class-oracle", 100.0)
    edges = mod["AGE_EDGES_S"]
    i = max(j for j, e in enumerate(edges) if e <= 100.0)  # the 100 s gap's bin
    assert oracle[0, 0] == pytest.approx(-(mean + (edges[i] + edges[i + 1]) / 2) / 2)
    with pytest.raises(ValueError, match="unknown method"):
        mod["hindsight_tables"](cls, length, closed, 1, "lru", 100.0)
    assert mod["class_of"](("accesses", "children"), 5, 0, 2, -1.0) == 2 * 4 + 2
    assert mod["class_of"](("depth", "last_gap"), 1, 6, 0, 20.0) == 2 * 6 + 3


def test_reuse_analysis_by_hand() -> None:
    """Conversation A (turns at 0, 4, 10 and 12 s), B (one turn) and a one-shot X. Continuing
    turns' gaps before / after: (4, 6) and (6, 2), ranked oppositely: Spearman -1. At 5 blocks,
    leaf LRU loses A's prefix to B and X before A's second turn (hits 0 + 5 + 5 of 29 references);
    evicting the dead B and X first keeps it (3 + 5 + 5), as Belady does."""
    import runpy

    import numpy as np

    from superinfer.harness.offline.cache_replay import next_use
    from superinfer.harness.offline.cache_trace import BlockTrace

    mod = runpy.run_path(str(ROOT / "benchmarks" / "mooncake_reuse_analysis.py"), run_name="t")
    a = [0, 1, 2, 8, 9, 10, 11, 12, 13]  # A's blocks a0..a8 as dense ids (first appearance)
    reqs = [a[:3], [3, 4, 5], [6, 7], a[:5], a[:7], a[:9]]
    times = [0.0, 1.0, 2.0, 4.0, 10.0, 12.0]
    parent = [-1, 0, 1, -1, 3, 4, -1, 6, 2, 8, 9, 10, 11, 12]
    depth = [0, 1, 2, 0, 1, 2, 0, 1, 3, 4, 5, 6, 7, 8]
    offsets = np.cumsum([0] + [len(r) for r in reqs])
    trace = BlockTrace("hand", np.array(times), np.full(6, 64), offsets,
                       np.array([b for r in reqs for b in r]), np.array(parent),
                       np.array(depth), np.full(14, 64), 64)  # fmt: skip
    nxt = next_use(trace)
    rows = dict(mod["continuation_rows"](trace, nxt))
    # first appearances as a last block a2, b2, x1, a4, a6, a8: a2, a4, a6 come back
    assert rows["reuse_rate_partial_last_block"] == 0.5
    assert rows["reuse_rate_full_block"] == 0.5  # a0, a1, a3, a5 of a0, a1, b0, b1, x0, a3, a5, a7
    assert rows["requests_with_new_full_blocks"] == 6
    assert rows["continuation_rate"] == 0.5  # A's first three turns
    assert rows["auc_continuation_prefix_hit_blocks"] == 5 / 9  # (0, 3, 5) against (0, 0, 7)
    assert rows["turns_with_prev_and_next_gap"] == 2
    assert rows["spearman_prev_vs_next_turn_gap"] == pytest.approx(-1.0, abs=1e-12)
    hits = dict(mod["hit_rate_rows"](trace, nxt, 0.36))
    assert hits["capacity_blocks_at_0.36"] == 5
    assert hits["hit_rate_lru_0.36"] == 10 / 29
    assert hits["hit_rate_lru_dead_block_oracle_0.36"] == 13 / 29
    assert hits["hit_rate_belady_0.36"] == 13 / 29
    assert hits["dead_block_share_of_belady_lead_0.36"] == 1.0


def test_trace_request_steps_prints_each_step_of_the_request() -> None:
    out = subprocess.run(
        [sys.executable, "benchmarks/trace_request_steps.py", "--request-id", "conv-3",
         "--until-s", "10"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout  # fmt: skip
    lines = out.splitlines()
    # prefilled whole in one step of its own, then decoding: the simulated run is deterministic
    assert lines[0].split() == [
        "7.191", "s", "replica", "1", "it:", "396", "of", "396", "pending", "step:", "396",
        "tokens,", "0", "decodes,", "running", "0,", "waiting", "1", "other", "chunks", "[]",
    ]  # fmt: skip
    assert lines[1].split()[4:9] == ["it:", "1", "of", "1", "pending"]
    assert lines[-1].split()[:4] == ["1", "conv-3", "1", "396"]


def test_trtllm_014_lengths_simulates_the_202_214_rows_both_ways() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import trtllm_014_lengths as t
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    import superinfer.harness.offline.calibrate_published_sim as cps
    from superinfer.harness.workload.data import data_dir

    rows = t.rows_202_214()
    ids = [int(r["row_id"]) for r, _, _ in rows]
    # two setups (70B TP4, 8B TP1) x six rates x five metrics
    assert ids == list(range(183, 213)) + list(range(273, 303))
    setup = next(s for r, s, _ in rows if r["row_id"] == "300")
    assert (setup.isl, setup.osl, setup.rate) == (202, 214, None)
    m = t.sharegpt_202_214(setup, data_dir())
    # deterministic: the same 500 ShareGPT draws, scaled to mean 202 / 214 tokens
    assert m["itl_ms:mean"] == pytest.approx(20.994596606142096, rel=1e-12)
    assert m["total_output_tok_s"] == pytest.approx(11677.796004990983, rel=1e-12)
    # the module's ShareGPT means are restored for the calibration
    assert (cps.SHAREGPT_MEAN_IN, cps.SHAREGPT_MEAN_OUT) == (202.0, 194.3)


def test_sglang030_admission_compares_the_rule_off_and_on_per_published_row() -> None:
    import runpy

    from superinfer.harness.workload.data import data_dir
    from superinfer.sim.engine_costs import load_costs

    mod = runpy.run_path(str(ROOT / "benchmarks" / "sglang030_admission.py"), run_name="t")
    keys = ("total_output_tok_s", "request_throughput_req_s", "ttft_ms:p50", "tpot_ms:p50",
            "itl_ms:p50", "e2e_latency_ms:p50")  # fmt: skip
    seen = []

    def fake(setup, costs, base, overrides):  # type: ignore[no-untyped-def]
        seen.append((setup.release, overrides["finish_aware_admission"]))
        return dict.fromkeys(keys, 90.0 if overrides["finish_aware_admission"] else 100.0)

    costs = load_costs()
    base = data_dir()
    assert base is not None
    rows = mod["table"](base, costs, fake)
    assert {r for r, _ in seen} == {"sglang-0.3.0"} and len(seen) == 2 * 6  # 6 setups
    assert len(rows) == 20 and [r[0] for r in rows][-1] == "645"
    row = {r[0]: r for r in rows}["645"]
    assert row[2:6] == ["total_output_tok_s", 3856.01, 100.0, 90.0]
    assert row[6:] == [round((100 - 3856.01) / 3856.01, 4), round((90 - 3856.01) / 3856.01, 4)]
    latency_ms = 1e3 * costs["request_latency_s"]["sglang-0.3.0"]["s"]
    ttft = {r[0]: r for r in rows}["609"]  # TTFT p50: the request-path latency added
    assert ttft[4] == round(100.0 + latency_ms, 4) and ttft[5] == round(90.0 + latency_ms, 4)


def test_sglang_kv_reserve_sweep_sweeps_any_option_with_others_fixed(capsys) -> None:  # type: ignore[no-untyped-def]
    import runpy

    import pandas as pd

    mod = runpy.run_path(str(ROOT / "benchmarks" / "sglang_kv_reserve_sweep.py"), run_name="t")
    seen = []

    def fake(src, engine, fit=None, superinfer_options=None):  # type: ignore[no-untyped-def]
        seen.append(dict(superinfer_options))
        k = float(superinfer_options["ttft_seat_reserve"])
        rows = [("chat", 0.9 + k / 100, 1), ("batch", 1.0, 0), ("all", 0.0, 0)]
        return pd.DataFrame(
            [{"engine": "sim:sglang-cpu", "policy": "superinfer", "load": 0.5,
              "slo_class": c, "slo_attainment": a, "n_rejected": r, "ttft_p99_ms": 100.0,
              "e2e_p50_ms": 10.0, "output_tok_s": 20.0 + k} for c, a, r in rows]
        )  # fmt: skip

    mod["sweep_rows"].__globals__["resimulate"] = fake
    out = mod["sweep_rows"](Path("x"), ["0", "2"], None, "ttft_seat_reserve",
                            {"serial_whole_prefills": "false"})  # fmt: skip
    assert seen == [
        {"serial_whole_prefills": "false", "ttft_seat_reserve": "0"},
        {"serial_whole_prefills": "false", "ttft_seat_reserve": "2"},
    ]
    assert list(out.columns) == mod["COLUMNS"]
    assert out[["reserve", "chat_attainment", "chat_rejected", "output_tok_s"]].values.tolist() == [
        ["0", 0.9, 1, 20.0], ["2", 0.92, 1, 22.0],
    ]  # fmt: skip
    assert set(out["option"]) == {"ttft_seat_reserve"}
    # a bad --set is one line, exit 2
    assert mod["main"](["--src", "x", "--set", "no_equals_sign"]) == 2
    assert capsys.readouterr().err.startswith("error: --reserve")


def test_long_prompt_chunks_sorts_a_prefill_by_how_it_ran() -> None:
    import runpy

    kind_of = runpy.run_path(str(ROOT / "benchmarks" / "long_prompt_chunks.py"), run_name="t")[
        "kind_of"
    ]
    # (instant s, its tokens, the step's tokens, the budget); arrived at 10.0 s
    assert kind_of([], 10.0) == "never"
    assert kind_of([(10.01, 2048, 2048, 2048), (10.4, 2041, 2048, 2048)], 10.0) == "two steps"
    full = [(10.01, 2042, 2048, 2048), (10.4, 2042, 2048, 2048), (10.8, 1, 1361, 2048)]
    assert kind_of(full, 10.0) == "budget-bound"
    small = [(10.01, 500, 520, 2048), (10.1, 2048, 2048, 2048), (10.5, 1500, 1520, 2048)]
    assert kind_of(small, 10.0) == "time-bound"
    assert kind_of(full, 9.8) == "budget-bound +queued"  # first chunk 0.21 s after arrival
    assert kind_of(full[:2], 9.87) == "two steps"  # 0.14 s: not queued


def test_sglang_kv_placement_gaps_finds_each_prompts_reusable_prefix_and_its_idle_time() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import sglang_kv_placement_gaps as g
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    # a session's turns at 0, 10 and 25 s, each its history plus a new chunk; a one-shot at 12 s
    table = g.reusable([[1, 2], [1, 2, 3], [9], [1, 2, 3, 4]], [0.0, 10.0, 12.0, 25.0])
    assert table.reusable_chunks.tolist() == [0, 2, 0, 3]
    assert table.gap_s.fillna(-1.0).tolist() == [-1.0, 10.0, -1.0, 15.0]
    assert table.reads.tolist() == [0, 1, 0, 1]


def test_seed_collect_puts_each_seed_run_on_one_line(tmp_path: Path) -> None:
    from superinfer.harness.bench import BenchConfig
    from superinfer.harness.suites_seed import run_seed_suite

    config = BenchConfig(engines=("sim:vllm",), rate_scale=0.6, duration_s=10.0, replicas=1,
                         policy_opts=("superinfer.ttft_boost_whole=true",))  # fmt: skip
    table, _ = run_seed_suite(config, tmp_path / "run-a")
    script = [sys.executable, str(ROOT / "benchmarks" / "seed_collect.py")]
    out = tmp_path / "seed.csv"
    proc = subprocess.run([*script, str(tmp_path / "run-a"), "--out", str(out)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    with out.open() as f:
        (row,) = list(csv.DictReader(f))
    value = {(r.policy, r.stack, r.metric): r.value for r in table.itertuples()}
    assert (row["run"], row["engine"], row["rate_scale"], row["duration_s"]) == (
        "run-a",
        "sim:vllm",
        "0.6",
        "10",
    )
    assert (row["engine_options"], row["superinfer_options"], row["oracle_options"]) == (
        "",
        "ttft_boost_whole=true",
        "",
    )
    assert float(row["native_attainment"]) == pytest.approx(
        value["fcfs", "none", "chat_slo_attainment"], rel=1e-5
    )
    assert float(row["stack_attainment"]) == pytest.approx(
        value["superinfer", "full", "chat_slo_attainment"], rel=1e-5
    )
    assert float(row["oracle_attainment"]) == pytest.approx(
        value["oracle", "full", "chat_slo_attainment"], rel=1e-5
    )
    ratio = value["superinfer/fcfs", "full/none", "chat_p99_latency_ratio"]
    assert float(row["chat_p99_latency_ratio"]) == pytest.approx(ratio, rel=1e-5)
    points = value["superinfer/fcfs", "full/none", "chat_attainment_points"]
    assert row["all_four_met"] == str(points >= 18.0 and ratio <= 0.6 and (
        value["superinfer/fcfs", "full/none", "peak_kv_ratio"] <= 0.67
    ) and value["superinfer/fcfs", "full/none", "batch_throughput_ratio"] >= 0.96)  # fmt: skip
    bad = subprocess.run([*script, str(tmp_path), "--out", str(out)], capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        f"seed_collect: {tmp_path / 'summary.csv'}: no such file (a `bench --suite seed` run "
        "folder?)"
    )
    broken = tmp_path / "run-b"
    broken.mkdir()
    (broken / "summary.csv").write_text((tmp_path / "run-a" / "summary.csv").read_text())
    (broken / "manifest.json").write_text("{")
    bad = subprocess.run([*script, str(broken), "--out", str(out)], capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.startswith(f"seed_collect: {broken / 'manifest.json'}: not JSON (")
    assert len(bad.stderr.strip().splitlines()) == 1


def test_hf_prefill_cost_fits_a_steps_cost_and_normalizes_busy_time_by_decode_speed() -> None:
    import runpy

    import pandas as pd

    mod = runpy.run_path(str(ROOT / "benchmarks" / "hf_prefill_cost.py"), run_name="t")

    def step(policy: str, p: int, d: int, kv: int, ms: float | None = None) -> tuple:
        # a step of p prefill tokens (one sequence) and d decodes over kv KV tokens; by default
        # 20 ms + 2 ms/prefill token + 30 ms/decode + 0.5 ms per token x 1k KV + 90 ms if p > 0
        t = 20 + 2 * p + 30 * d + 0.5 * ((p + d) * kv / 1e3) + 90 * (p > 0) if ms is None else ms
        return ("hf", policy, f"hf_{policy}_0.3_0", t, d + (p > 0), p + d, p, d, kv)

    cols = list(mod["STEP_COLUMNS"])
    decodes = [step(pol, 0, d, 1000) for pol in ("fcfs", "superinfer") for d in (1, 2, 3, 4)]
    chunks = [(100, 0, 500), (50, 2, 1500), (200, 1, 800), (30, 3, 2000)]
    steps = pd.DataFrame(
        decodes
        + [step("fcfs", *c) for c in chunks[:2]]
        + [step("superinfer", *c) for c in chunks]
        + [step("sglang-like", 0, 1, 1000)],
        columns=cols,
    )
    steps.loc[steps["policy"] == "sglang-like", "engine"] = "sglang"  # not hf: left out
    got = mod["cost_rows"](steps, "s")
    assert got["policy"].tolist() == ["fcfs", "superinfer"]
    fit = got.iloc[0][["fit_base_ms", "fit_prefill_token_ms", "fit_decode_seq_ms",
                       "fit_token_kv_ms", "fit_prefill_step_ms"]].astype(float)  # fmt: skip
    assert fit.round(6).tolist() == [20.0, 2.0, 30.0, 0.5, 90.0]
    # decode steps exactly on their fit: speed 1, busy time as is (1,029 and 1,942.4 ms by hand)
    assert got["decode_speed"].round(9).tolist() == [1.0, 1.0]
    assert got["busy_s"].round(6).tolist() == [1.029, 1.9424]
    assert got["busy_norm_vs_fcfs"].round(6).tolist() == [1.0, round(1.9424 / 1.029, 6)]
    assert got[["runs", "steps", "prefill_steps", "prefill_tokens"]].values.tolist() == [
        [1, 6, 2, 150], [1, 8, 4, 380]]  # fmt: skip
    assert got["median_chunk"].tolist() == [75.0, 75.0]
    # one decode shape: fcfs's at 100 ms, superinfer's at 120 ms -> speeds 100/110, 120/110
    same = pd.DataFrame(
        [step("fcfs", 0, 2, 1000, 100.0), step("superinfer", 0, 2, 1000, 120.0)]
        + [step("fcfs", *chunks[0]), step("superinfer", *chunks[0])],
        columns=cols,
    )
    got = mod["cost_rows"](same, "s")
    assert got["decode_speed"].round(9).tolist() == [round(100 / 110, 9), round(120 / 110, 9)]
    busy = [(100 + 335) / 1e3, (120 + 335) / 1e3]
    assert got["busy_norm_s"].round(9).tolist() == [
        round(busy[0] * 110 / 100, 9), round(busy[1] * 110 / 120, 9)]  # fmt: skip
    with pytest.raises(ValueError, match="needs decode-only and prefilling hf steps"):
        mod["cost_rows"](same[same["num_prefill_tokens"] == 0], "s")
    with pytest.raises(ValueError, match="lacks column 'kv_tokens'"):
        mod["cost_rows"](same.drop(columns="kv_tokens"), "s")
