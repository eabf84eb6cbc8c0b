"""Workload spec files: built-ins, mixing, windows, seeds, one-line errors with file and line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from superinfer.harness.errors import SpecError, UserError
from superinfer.harness.workload.data import trace_path
from superinfer.harness.workload.spec_build import build_from_spec
from superinfer.harness.workload.specs import builtin_specs, load_workload_spec, parse_spec
from superinfer.harness.workload.traces import load_mooncake_jsonl
from superinfer.harness.workload.workload import build_workload


def test_azure_mixed_is_exactly_the_default_trace_workload() -> None:
    spec = build_from_spec(load_workload_spec("azure-mixed"))
    trace = build_workload("azure")
    assert len(spec.requests) == 28_185
    assert spec.requests == trace.requests  # every field of every request, in order
    assert [s.max_output_tokens for s in spec.sources] == [1000, 2048]


def test_builtins_are_listed() -> None:
    assert list(builtin_specs()) == [
        "azure-mixed", "mooncake-chat", "reasoning-long", "sharegpt-poisson",
    ]  # fmt: skip


def test_reasoning_long_answers_every_prompt_with_4096_tokens() -> None:
    wl = build_from_spec(load_workload_spec("reasoning-long"), seed=0)
    again = build_from_spec(load_workload_spec("reasoning-long"), seed=0)
    assert wl.requests == again.requests
    assert {(r.output_tokens, r.max_output_tokens, r.slo.name) for r in wl.requests} == {
        (4096, 4096, "chat")
    }
    assert max(r.arrival_s for r in wl.requests) < 900.0
    assert len(wl.requests) == 7_210  # Poisson at 8 req/s for 900 s, seed 0


def test_mooncake_chat_spreads_buckets_and_keeps_block_hashes() -> None:
    one = build_from_spec(load_workload_spec("mooncake-chat"), seed=0)
    two = build_from_spec(load_workload_spec("mooncake-chat"), seed=1)
    assert len(one.requests) == 12_031
    first = one.requests[0]
    assert (first.request_id, first.hash_block_tokens, first.block_hashes[:3]) == (
        "kimi-1",
        512,
        (0, 1, 2),
    )
    assert sum(len(r.block_hashes) for r in one.requests) == 288_500
    times = np.array([r.arrival_s for r in one.requests])
    assert np.all(np.diff(times) >= 0) and times[0] == 0.0
    # Every request stays inside its bucket, after its recorded stamp and before the next one
    # (2,997-3,003 ms apart). The run clock starts at the first (spread) arrival, which shifts
    # every request by the same amount, so the offsets from the stamps span less than a bucket.
    trace = load_mooncake_jsonl(trace_path("conversation_trace.jsonl"))
    raw = {f"kimi-{r.line}": r.arrival_s for r in trace}
    offsets = np.array([r.arrival_s - raw[r.request_id] for r in one.requests])
    assert -3.003 < offsets.min() <= 0.0 and offsets.max() - offsets.min() < 3.003
    assert len(set(np.round(times, 6))) > 12_000  # bursts are spread (1,180 distinct stamps)
    assert [r.request_id for r in one.requests] == [r.request_id for r in two.requests]
    assert [r.arrival_s for r in one.requests] != [r.arrival_s for r in two.requests]
    assert one.requests == build_from_spec(load_workload_spec("mooncake-chat"), seed=0).requests


def test_sharegpt_poisson_is_seeded_and_windowed() -> None:
    wl = build_from_spec(load_workload_spec("sharegpt-poisson"), seed=0)
    again = build_from_spec(load_workload_spec("sharegpt-poisson"), seed=0)
    assert wl.requests == again.requests
    assert len(wl.requests) == 2_415  # ~4 req/s x 600 s
    assert wl.requests[0].arrival_s == 0.0 and wl.requests[-1].arrival_s < 600.0
    assert len({r.request_id for r in wl.requests}) == len(wl.requests)
    assert {r.slo.name for r in wl.requests} == {"chat"}
    short = build_from_spec(load_workload_spec("sharegpt-poisson"), seed=0, duration_s=60.0)
    assert short.requests == tuple(r for r in wl.requests if r.arrival_s < 60.0)


def _write(tmp_path: Path, text: str, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


USER_CSV = "t,in,out\n0,10,5\n2,20,6\n4,30,7\n6,40,8\n"


def test_user_trace_spec_with_relative_file_window_and_scaling(tmp_path: Path) -> None:
    (tmp_path / "mine.csv").write_text(USER_CSV)
    spec = _write(
        tmp_path,
        """
name = "mine"
rate_scale = 2.0
start_s = 1.0
duration_s = 2.0
[[source]]
name = "app"
format = "csv"
file = "mine.csv"
slo = {ttft_ms = 500, priority = 0}
columns = {arrival = "t", prompt_tokens = "in", output_tokens = "out"}
""",
    )
    wl = build_from_spec(load_workload_spec(str(spec)))
    # Times 0, 2, 4, 6 s at twice the rate -> 0, 1, 2, 3; window [1, 3) -> shifted to 0, 1.
    assert [(r.request_id, r.arrival_s, r.prompt_tokens) for r in wl.requests] == [
        ("app-3", 0.0, 20),
        ("app-4", 1.0, 30),
    ]
    assert wl.requests[0].slo.name == "app" and wl.requests[0].slo.ttft_ms == 500
    assert wl.requests[0].max_output_tokens == 8  # the source's longest output


def test_sources_are_independent_and_superposed(tmp_path: Path) -> None:
    (tmp_path / "lens.csv").write_text("in,out\n" + "".join(f"{i},{i}\n" for i in range(1, 50)))
    source = """
[[source]]
name = "{name}"
format = "csv"
file = "lens.csv"
slo = "chat"
num_requests = {n}
arrivals = {{process = "gamma", rate_rps = 2.0, burstiness = 0.5}}
columns = {{prompt_tokens = "in", output_tokens = "out"}}
"""
    alone = build_from_spec(
        load_workload_spec(str(_write(tmp_path, source.format(name="a", n=30))))
    )
    both = build_from_spec(
        load_workload_spec(
            str(
                _write(
                    tmp_path,
                    source.format(name="a", n=30) + source.format(name="b", n=80),
                    "two.toml",
                )
            )
        )
    )
    assert [r for r in both.requests if r.source == "a"] == list(alone.requests)
    assert len(both.requests) == 110
    # 80 > 49 rows: the sampler reshuffles for a second pass.
    b_lengths = [r.prompt_tokens for r in both.requests if r.source == "b"]
    assert sorted(b_lengths[:49]) == list(range(1, 50))  # a first pass uses every row once
    assert b_lengths[:49] != list(range(1, 50))  # in a shuffled order


def test_per_source_clock_starts_every_trace_at_zero(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("t,in,out\n100,1,1\n101,1,1\n")
    (tmp_path / "b.csv").write_text("t,in,out\n500,2,2\n")
    body = """
clock = "{clock}"
[[source]]
name = "a"
format = "csv"
file = "a.csv"
slo = "chat"
columns = {{arrival = "t", prompt_tokens = "in", output_tokens = "out"}}
[[source]]
name = "b"
format = "csv"
file = "b.csv"
slo = "batch"
columns = {{arrival = "t", prompt_tokens = "in", output_tokens = "out"}}
"""
    shared = build_from_spec(load_workload_spec(str(_write(tmp_path, body.format(clock="shared")))))
    own = build_from_spec(
        load_workload_spec(str(_write(tmp_path, body.format(clock="per-source"), "o.toml")))
    )
    assert [(r.request_id, r.arrival_s) for r in shared.requests] == [
        ("a-2", 0.0),
        ("a-3", 1.0),
        ("b-2", 400.0),
    ]
    assert [(r.request_id, r.arrival_s) for r in own.requests] == [
        ("a-2", 0.0),
        ("b-2", 0.0),
        ("a-3", 1.0),
    ]


def test_prompt_set_source_carries_text(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text(
        '[{"id": "x", "conversations": [{"from": "human", "value": "Hello there, world"}]}]'
    )
    spec = _write(
        tmp_path,
        """
[[source]]
name = "sg"
format = "sharegpt-prompts"
file = "p.json"
slo = "chat"
output_tokens = 64
num_requests = 3
arrivals = {process = "poisson", rate_rps = 1.0}
""",
    )
    wl = build_from_spec(load_workload_spec(str(spec)))
    assert [r.request_id for r in wl.requests] == ["sg-0", "sg-1", "sg-2"]
    assert {r.output_tokens for r in wl.requests} == {64}
    assert wl.requests[0].prompt_tokens == 4  # Mistral v1: Hello / there / , / world
    assert dict(wl.prompts) == {f"sg-{i}": "Hello there, world" for i in range(3)}


GOOD_SOURCE = """[[source]]
name = "s"
format = "sharegpt-lengths"
slo = "chat"
arrivals = {process = "poisson", rate_rps = 1.0}
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name = 'x'\nrate_scale = \n", ":2: not TOML (Invalid value)"),
        ("nmae = 'x'\n" + GOOD_SOURCE, ":1: field 'nmae': unknown key (known: "),
        ("duration_s = -1\n" + GOOD_SOURCE, ":1: field 'duration_s': -1 must be > 0"),
        ("name = 'x'\n", ": field 'source': needs at least one [[source]] table"),
        (
            GOOD_SOURCE.replace("poisson", "weibull"),
            ":5: field 'source[0].arrivals.process': 'weibull' is not one of",
        ),
        (
            GOOD_SOURCE.replace("rate_rps = 1.0", "rate_rps = 'fast'"),
            ":5: field 'source[0].arrivals.rate_rps': 'fast' is not a finite number",
        ),
        (
            GOOD_SOURCE.replace('"chat"', '"gold"'),
            ":4: field 'source[0].slo': unknown SLO class 'gold' (known: batch, chat)",
        ),
        (
            GOOD_SOURCE.replace("sharegpt-lengths", "parquet"),
            ":3: field 'source[0].format': 'parquet' is not one of azure",
        ),
        (
            GOOD_SOURCE.replace('{process = "poisson", rate_rps = 1.0}', '"trace"'),
            ":5: field 'source[0].arrivals.process': format 'sharegpt-lengths' has no arrival",
        ),
        (GOOD_SOURCE + GOOD_SOURCE, ":7: field 'source[1].name': 's' is used by an earlier source"),
        ("[slo.chat]\nttft_ms = 0\n" + GOOD_SOURCE, ":2: field 'slo.chat.ttft_ms': 0 must be > 0"),
        (
            "[slo.chat]\npriority = 1.5\n" + GOOD_SOURCE,
            ":2: field 'slo.chat.priority': 1.5 is not an integer",
        ),
        (
            GOOD_SOURCE + "\n[bench]\nreplicas = 'four'\n",
            ":8: field 'bench.replicas': 'four' is not an int",
        ),
        (
            GOOD_SOURCE + "columns = {in = 'a'}\n",
            ":6: field 'source[0].columns': only for formats csv and jsonl",
        ),
        (
            GOOD_SOURCE.replace("sharegpt-lengths", "csv") + "file = 'x.csv'\n",
            ":1: field 'source[0].columns': format 'csv' needs a column mapping",
        ),
        (
            GOOD_SOURCE + "file = 'nowhere/x.csv'\n",
            ":6: field 'source[0].file': nowhere/x.csv: no such file",
        ),
        (GOOD_SOURCE + "file = 'x.csv'\n", ":6: field 'source[0].file': x.csv: trace not found"),
        (
            "[slo.chat]\nttft_ms_per_1k_prompt = 200\n" + GOOD_SOURCE,
            ":2: field 'slo.chat.ttft_ms_per_1k_prompt': ttft_ms_per_1k_prompt needs ttft_ms",
        ),
        (
            "[slo.chat]\nttft_ms = 900\nttft_x_isolated = 4\n" + GOOD_SOURCE,
            ":3: field 'slo.chat.ttft_x_isolated': ttft_x_isolated replaces ttft_ms: give one",
        ),
        (
            "[slo.chat]\ntpot_x_isolated = 0\n" + GOOD_SOURCE,
            ":2: field 'slo.chat.tpot_x_isolated': 0 must be > 0",
        ),
        (
            "[slo.chat]\nttft_x_isolated = 'x'\n" + GOOD_SOURCE,
            ":2: field 'slo.chat.ttft_x_isolated': 'x' is not a finite number",
        ),
        (
            "[slo.chat]\nttft_ms_per_1k = 1\n" + GOOD_SOURCE,
            ":2: field 'slo.chat.ttft_ms_per_1k': unknown key (known: deadline_s, priority, tpot_",
        ),
    ],
)
def test_malformed_specs_name_file_line_and_field(tmp_path: Path, text: str, expected: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        build_from_spec(load_workload_spec(str(path)))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    assert expected in message.replace(str(path), "")


def test_unbounded_synthetic_source_and_unknown_name(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="neither num_requests nor a window"):
        build_from_spec(parse_spec(GOOD_SOURCE))
    with pytest.raises(UserError, match="unknown workload 'nope'; use a built-in"):
        load_workload_spec("nope")
