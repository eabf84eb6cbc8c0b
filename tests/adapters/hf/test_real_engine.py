"""A short real run of the CPU engine (SmolLM2-135M, transformers continuous batching): every
request ends, token counts are exact, token timestamps are monotonic, and recompute preemption
works on the real engine. The model loads once per session (``smollm2`` fixture); each run takes
seconds. No timing is asserted."""

from __future__ import annotations

from typing import Any

import numpy as np

from superinfer.harness.bench import BenchConfig, run_bench
from superinfer.harness.engines.hf import HFOptions, replay
from superinfer.harness.workload.prompts import PromptBuilder, load_sharegpt_prompts
from superinfer.harness.workload.workload import BATCH_SLO, CHAT_SLO, Workload
from superinfer.sim.request import RequestSpec

#: (arrival s, prompt tokens, output tokens, class)
SHORT = (
    (0.0, 24, 6, CHAT_SLO),
    (0.1, 48, 2, BATCH_SLO),
    (0.3, 16, 5, CHAT_SLO),
    (0.6, 40, 1, BATCH_SLO),
    (0.8, 20, 4, CHAT_SLO),
)


def specs(rows: Any = SHORT) -> tuple[RequestSpec, ...]:
    return tuple(
        RequestSpec(f"{slo.name}-{i}", t, p, o, max(o, 8), slo, source=slo.name)
        for i, (t, p, o, slo) in enumerate(rows)
    )


def run_replay(model: Any, policy: str, reqs: tuple[RequestSpec, ...], opts: HFOptions) -> Any:
    from superinfer.adapters.hf.engine import EngineConfig, EngineSession
    from superinfer.adapters.manager import build_plugin_manager

    builder = PromptBuilder(model.tokenizer, load_sharegpt_prompts(), seed=0)
    prompts = [builder.build(i, s.prompt_tokens) for i, s in enumerate(reqs)]
    assert [len(p) for p in prompts] == [s.prompt_tokens for s in reqs]
    config = EngineConfig(num_blocks=opts.num_blocks, max_batch_tokens=opts.max_batch_tokens)
    session = EngineSession(model, build_plugin_manager(policy).hook, config)
    session.start()
    try:
        traces, _ = replay(session, reqs, prompts, opts)
    finally:
        session.stop(hard=True)
    return traces, session


def test_real_replay_is_complete_exact_and_monotonic(smollm2: Any) -> None:
    reqs = specs()
    traces, session = run_replay(smollm2, "fcfs", reqs, HFOptions(drain_s=300))
    for spec, trace in zip(reqs, traces, strict=True):
        assert (trace.status, trace.reason) == ("finished", ""), spec.request_id
        assert len(trace.token_times) == spec.output_tokens
        times = np.array(trace.token_times)
        assert times[0] >= spec.arrival_s
        assert (np.diff(times) >= 0).all()
        assert trace.end_s == times[-1]
    steps = session.binding.steps
    assert steps and [s.step_index for s in steps] == list(range(len(steps)))
    assert sum(s.num_tokens for s in steps) == sum(
        s.prompt_tokens + s.output_tokens - 1 for s in reqs
    )
    for s in steps:
        phases = s.schedule_s + s.prepare_s + s.forward_s + s.finish_s
        assert abs(phases - s.duration_s) < 1e-9 and s.forward_s > 0


def test_real_preemption_recomputes_and_still_finishes_exactly(smollm2: Any) -> None:
    # 40 + 30 tokens: 2 blocks of 32 at admission, 3 by the end. With 5 blocks fcfs admits two
    # requests (4 blocks); when the second needs its third block none is free, so it is
    # preempted (recompute) and re-admitted later with its output folded into its prompt.
    rows = ((0.0, 40, 30, CHAT_SLO), (0.0, 40, 30, CHAT_SLO), (0.0, 40, 30, BATCH_SLO))
    reqs = specs(rows)
    traces, session = run_replay(smollm2, "fcfs", reqs, HFOptions(num_blocks=5, drain_s=300))
    assert [(t.status, len(t.token_times)) for t in traces] == [("finished", 30)] * 3
    # how often depends on when the engine's loop takes the three requests in; at least once
    assert sum(t.num_preemptions for t in session.binding.tracked.values()) >= 1
    assert session.binding.peak_blocks == 5
    for trace in traces:
        assert (np.diff(trace.token_times) >= 0).all()


def test_bench_cells_account_for_every_request_under_each_policy(smollm2: Any) -> None:
    reqs = specs()
    workload = Workload("short", reqs, (), 1.0, None)
    config = BenchConfig(engines=("hf",), policies=("fcfs", "priority"), engine_options={})
    result = run_bench(config, workload=workload)
    df = result.requests
    assert len(df) == 2 * len(reqs)
    assert (df["status"] == "finished").all()
    assert (df["generated_tokens"] == df["output_tokens"]).all()
    assert (df["first_token_s"] >= df["arrival_s"]).all()
    assert (df["finish_s"] >= df["first_token_s"]).all()
    assert list(result.summary["slo_class"]) == ["batch", "chat", "all"] * 2
    assert set(result.steps["policy"]) == {"fcfs", "priority"}
    cell = result.info["cells"]["hf/fcfs"]
    assert cell["model"] == "smollm2-135m-instruct" and cell["step_profile"]["num_steps"] > 0
