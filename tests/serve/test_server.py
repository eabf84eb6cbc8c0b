"""``superinfer serve --engine hf``: SLO and priority per request, the OpenAI request checks, and
the app on the real engine (SmolLM2, loaded once per session) driven in-process through httpx's
ASGI transport: streamed and whole answers agree token for token, rejections carry the reason,
/metrics counts every ended request, a cancelled request frees its KV and is reported."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from tests.adapters.hf.conftest import require  # noqa: E402

# fail, not skip, under `make test` (tests.adapters.hf.conftest.required)
require("starlette", "run `make install-serve`")
require("prometheus_client", "run `make install-serve`")

from superinfer.policy_core.policies.fcfs import FCFSPolicy  # noqa: E402
from superinfer.policy_core.types import SLO, ScheduleDecision, StepState  # noqa: E402
from superinfer.serve import (  # noqa: E402
    DEFAULT_SLO_CLASSES,
    RequestError,
    ServeConfig,
    ServingEngine,
    build_app,
    ignored_fields,
    priority_rank,
    request_slo,
    resolve_slo,
)

CONFIG = ServeConfig()
CHAT, BATCH = DEFAULT_SLO_CLASSES["chat"], DEFAULT_SLO_CLASSES["batch"]


# -- SLO and priority ---------------------------------------------------------------------------


def test_the_slo_comes_from_the_body_then_custom_params_then_headers_then_the_default() -> None:
    assert resolve_slo({}, {}, CONFIG) == BATCH
    assert resolve_slo({"slo": "chat"}, {}, CONFIG) == CHAT
    assert resolve_slo({"slo": {"class": "chat", "ttft_ms": 250}}, {}, CONFIG) == SLO(
        "chat", ttft_ms=250.0, tpot_ms=100.0, priority=0
    )
    assert resolve_slo({"slo": {"deadline_s": 30}}, {}, CONFIG) == SLO(
        "batch", deadline_s=30.0, priority=1
    )
    body = {"custom_params": {"slo": {"class": "chat", "tpot_ms": 40}}}
    assert resolve_slo(body, {"x-slo-class": "batch"}, CONFIG).tpot_ms == 40.0
    headers = {"x-slo-class": "chat", "x-slo-ttft-ms": "500", "x-slo-tpot-ms": "50"}
    assert resolve_slo({}, headers, CONFIG) == SLO("chat", ttft_ms=500.0, tpot_ms=50.0)
    assert resolve_slo({"slo": "batch"}, headers, CONFIG) == BATCH  # the body wins


@pytest.mark.parametrize(
    ("body", "headers", "message"),
    [
        ({"slo": "gold"}, {}, "slo: unknown class 'gold' (classes: batch, chat)"),
        ({"slo": {"class": "chat", "ttft": 1}}, {}, "slo: unknown field 'ttft'"),
        ({"slo": {"class": "chat", "ttft_ms": -1}}, {}, "slo.ttft_ms must be > 0, got -1"),
        ({"slo": {"tpot_ms": "fast"}}, {}, "slo.tpot_ms must be a number, got 'fast'"),
        ({"slo": 3}, {}, "slo must be a class name or an object"),
        ({"custom_params": {"slo": "x"}}, {}, "custom_params.slo: unknown class 'x'"),
        ({}, {"x-slo-ttft-ms": "soon"}, "header x-slo-ttft-ms: not a number: 'soon'"),
        ({"priority": 1.5}, {}, "priority must be an integer, got 1.5"),
    ],
)
def test_bad_slo_fields_are_named(body: Any, headers: Any, message: str) -> None:
    with pytest.raises(RequestError) as err:
        resolve_slo(body, headers, CONFIG)
    assert err.value.status == 400 and err.value.message.startswith(message)


def test_slo_forms_resolve_per_request() -> None:
    scaled = resolve_slo({"slo": {"class": "chat", "ttft_ms_per_1k_prompt": 500}}, {}, CONFIG)
    assert request_slo(scaled, 3000, CONFIG) == SLO("chat", ttft_ms=2500.0, tpot_ms=100.0)
    relative = resolve_slo({"slo": {"class": "chat", "ttft_x_isolated": 4}}, {}, CONFIG)
    assert (relative.ttft_ms, relative.ttft_x_isolated, relative.tpot_ms) == (None, 4.0, 100.0)
    calibrated = ServeConfig(isolated_latency=lambda p: (p * 0.5, 30.0))
    got = request_slo(relative, 100, calibrated)
    assert (got.ttft_ms, got.tpot_ms, got.ttft_x_isolated) == (200.0, 100.0, None)
    both = resolve_slo({"slo": {"class": "chat", "tpot_x_isolated": 2}}, {}, calibrated)
    assert request_slo(both, 100, calibrated).tpot_ms == 60.0
    with pytest.raises(RequestError) as err:
        request_slo(relative, 100, CONFIG)
    assert err.value.message == "slo.ttft_x_isolated: this server has no step-time calibration"
    assert request_slo(CHAT, 100, CONFIG) is CHAT


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"ttft_x_isolated": 2, "ttft_ms": 5}, "slo.ttft_x_isolated: ttft_x_isolated replaces"),
        ({"tpot_x_isolated": 0}, "slo.tpot_x_isolated must be > 0, got 0"),
        ({"class": "batch", "ttft_ms_per_1k_prompt": 9}, "slo.ttft_ms_per_1k_prompt: ttft_ms_"),
    ],
)
def test_bad_slo_forms_are_named(spec: Any, message: str) -> None:
    with pytest.raises(RequestError) as err:
        resolve_slo({"slo": {"class": "chat", **spec}}, {}, CONFIG)
    assert err.value.status == 400 and err.value.message.startswith(message)


def test_priority_reads_in_the_configured_convention() -> None:
    assert priority_rank(5, "vllm") == 5 and priority_rank(5, "sglang") == -5
    sglang = ServeConfig(priority_convention="sglang")
    # SGLang: the more urgent request sends the larger value and gets the smaller rank.
    urgent = resolve_slo({"slo": "batch", "priority": 10}, {}, sglang)
    relaxed = resolve_slo({"slo": "batch", "priority": 1}, {}, sglang)
    assert (urgent.priority, relaxed.priority) == (-10, -1)
    assert resolve_slo({"priority": 10}, {}, CONFIG).priority == 10
    with pytest.raises(ValueError, match="priority convention 'trt'"):
        ServeConfig(priority_convention="trt")
    with pytest.raises(ValueError, match="default class 'gold' is not a class"):
        ServeConfig(default_class="gold")


# -- the app on the real engine -----------------------------------------------------------------


@dataclass
class ShedBatch(FCFSPolicy):
    """FCFS that rejects every waiting batch request (a load-shedding policy)."""

    name: str = "shed-batch"

    def schedule(self, state: StepState) -> ScheduleDecision:
        shed = {v.request_id: "shed_batch" for v in state.waiting if v.slo.name == "batch"}
        if shed:
            return ScheduleDecision(reject=shed)
        return super().schedule(state)


@contextmanager
def serving(model: Any, policy: Any = "fcfs", config: ServeConfig = CONFIG) -> Iterator[Any]:
    from superinfer.adapters.hf.engine import EngineConfig, EngineSession
    from superinfer.adapters.manager import build_plugin_manager

    session = EngineSession(model, build_plugin_manager(policy).hook, EngineConfig(num_blocks=64))
    session.start()
    try:
        yield ServingEngine(session, model, config)
    finally:
        session.stop(hard=True)


def call(engine: ServingEngine, *requests: tuple[str, str, Any, dict[str, str]]) -> list[Any]:
    """Send requests concurrently to the app; each answer as (status, headers, body text)."""
    import httpx

    async def go() -> list[Any]:
        transport = httpx.ASGITransport(app=build_app(engine))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:

            async def one(method: str, path: str, body: Any, headers: dict[str, str]) -> Any:
                if method == "GET":
                    r = await client.get(path)
                elif isinstance(body, str):
                    r = await client.post(path, content=body, headers=headers)
                else:
                    r = await client.post(path, json=body, headers=headers)
                return r.status_code, r.headers, r.text

            return list(await asyncio.gather(*(one(*r) for r in requests)))

    return asyncio.run(go())


def events(text: str) -> list[Any]:
    out = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_streamed_and_whole_answers_agree_and_usage_counts_tokens(smollm2: Any) -> None:
    prompt = {"prompt": "The three primary colors are", "max_tokens": 6, "ignore_eos": True}
    chat = {"messages": [{"role": "user", "content": "Name a fruit."}], "max_tokens": 5,
            "min_tokens": 5}  # fmt: skip
    with serving(smollm2) as engine:
        answers = call(
            engine,
            ("POST", "/v1/completions", {**prompt, "stream": True,
                                         "stream_options": {"include_usage": True}}, {}),
            ("POST", "/v1/completions", prompt, {}),
            ("POST", "/v1/chat/completions", {**chat, "stream": True}, {}),
            ("POST", "/v1/chat/completions", chat, {}),
        )  # fmt: skip
    (s1, h1, streamed), (s2, _, whole), (s3, h3, chat_streamed), (s4, _, chat_whole) = answers
    assert (s1, s2, s3, s4) == (200, 200, 200, 200)
    assert h1["content-type"].startswith("text/event-stream")
    ev = events(streamed)
    assert ev[-1] == "[DONE]"
    assert ev[-2]["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}
    assert ev[-3]["choices"][0]["finish_reason"] == "length"
    text = "".join(e["choices"][0]["text"] for e in ev[:-2])
    body = json.loads(whole)
    assert body["object"] == "text_completion" and body["usage"]["completion_tokens"] == 6
    assert body["choices"][0] == {
        "index": 0, "text": text, "logprobs": None, "finish_reason": "length",
    }  # fmt: skip
    cev = events(chat_streamed)
    assert cev[0]["object"] == "chat.completion.chunk"
    assert cev[0]["choices"][0]["delta"]["role"] == "assistant"
    assert cev[-1] == "[DONE]" and cev[-2]["choices"][0]["finish_reason"] == "length"
    chat_text = "".join(e["choices"][0]["delta"].get("content", "") for e in cev[:-1])
    cbody = json.loads(chat_whole)
    assert cbody["choices"][0]["message"] == {"role": "assistant", "content": chat_text}
    assert cbody["usage"]["completion_tokens"] == 5


def test_requests_the_engine_cannot_honour_are_answered_400_naming_the_field(
    smollm2: Any,
) -> None:
    bad = [
        ("not json", "the body is not valid JSON"),
        ({"prompt": "x", "n": 2}, "n=2 is not supported by this server"),
        ({"prompt": "x", "stop": ["\n"]}, "stop=['\\n'] is not supported by this server"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens must be a positive integer, got 0"),
        ({"prompt": ""}, "prompt is empty"),
        ({"prompt": [1, 99999999]}, "prompt: token ids must be in [0, 49152)"),
        ({"prompt": "x", "min_tokens": 2, "max_tokens": 8}, "min_tokens between 0 and"),
        ({"prompt": "x", "logit_bias": {"7": -100}}, "logit_bias: only -100 on end-of-sequence"),
        ({"prompt": "x", "slo": "gold"}, "slo: unknown class 'gold'"),
        # a helper's audit (2026-12-05): these were a bare 500 with a traceback, or ignored
        ('{"prompt": "\\ud800abc"}', "prompt: not valid text (a lone surrogate at character 0)"),
        ('{"prompt": ' + "[" * 5000 + "]" * 5000 + "}", "the body is not valid JSON (nested"),
        ({"prompt": "x", "custom_params": "chat"}, "custom_params must be an object"),
        ({"prompt": "x", "model": 123}, "model must be a string, got 123"),
    ]
    with serving(smollm2) as engine:
        answers = call(engine, *(("POST", "/v1/completions", b, {}) for b, _ in bad))
        over = call(engine, ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 9000}, {}))
    for (status, _, text), (_, message) in zip(answers, bad, strict=True):
        err = json.loads(text)["error"]
        assert status == 400 and err["type"] == "invalid_request_error", text
        assert err["message"].startswith(message), text
    ((status, _, text),) = over
    assert status == 400
    assert json.loads(text)["error"] == {
        "message": "request rejected: exceeds_max_model_len (prompt 1 + max_tokens 9000 = 9001 "
        "tokens, over the context's 8192)",
        "type": "rejected", "param": "max_tokens", "code": "exceeds_max_model_len",
    }  # fmt: skip


def test_a_policy_rejection_is_a_503_with_its_reason_and_metrics_count_every_end(
    smollm2: Any,
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    base = {"prompt": "Hello", "max_tokens": 3, "ignore_eos": True}
    with serving(smollm2, ShedBatch()) as engine:
        answers = call(
            engine,
            ("POST", "/v1/completions", {**base, "slo": "chat"}, {}),
            ("POST", "/v1/completions", base, {"x-slo-class": "chat", "x-slo-ttft-ms": "60000"}),
            ("POST", "/v1/completions", base, {}),  # default class: batch, shed
        )
        ((_, mh, metrics_text),) = call(engine, ("GET", "/metrics", None, {}))
        ((health_status, _, health),) = call(engine, ("GET", "/health", None, {}))
    assert [a[0] for a in answers] == [200, 200, 503]
    assert json.loads(answers[2][2])["error"]["code"] == "shed_batch"
    assert mh["content-type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(metrics_text)
        for s in fam.samples
    }
    ended = "superinfer_requests_ended_total"
    assert samples[(ended, (("slo_class", "chat"), ("status", "finished")))] == 2
    assert samples[(ended, (("slo_class", "batch"), ("status", "rejected")))] == 1
    assert samples[(ended, (("slo_class", "batch"), ("status", "finished")))] == 0
    assert samples[("superinfer_slo_attainment", (("slo_class", "batch"),))] == 0.0
    met = samples[("superinfer_slo_met_total", (("slo_class", "chat"),))]
    attained = samples[("superinfer_slo_attainment", (("slo_class", "chat"),))]
    assert attained == met / 2
    assert samples[("superinfer_kv_capacity_blocks", ())] == 64
    assert samples[("superinfer_kv_used_blocks", ())] == 0  # everything ended
    assert samples[("superinfer_requests_running", (("tier", "0"),))] == 0
    assert samples[("superinfer_ttft_seconds_count", (("slo_class", "chat"),))] == 2
    assert samples[("superinfer_engine_up", ())] == 1
    assert health_status == 200 and json.loads(health)["policy"] == "fcfs"


def test_priority_and_slo_reach_the_policy_and_a_cancel_frees_the_kv(smollm2: Any) -> None:
    config = ServeConfig(priority_convention="sglang")
    with serving(smollm2, config=config) as engine:

        async def go() -> tuple[Any, Any, Any]:
            params = engine.parse({"prompt": "Once upon a time", "max_tokens": 200,
                                   "ignore_eos": True}, chat=False)  # fmt: skip
            slo = resolve_slo({"slo": "chat", "priority": 7}, {}, config)
            live = engine.submit(params, slo)
            first = await engine.next_event(live)
            engine.take(live, first)  # type: ignore[arg-type]
            tracked = engine.session.binding.tracked[live.request_id]
            engine.cancel(live)
            for _ in range(200):  # the engine drops it at its next loop iteration
                if live.request_id in engine.session.binding.ended:
                    break
                await asyncio.sleep(0.05)
            return live, tracked, engine.session.binding.ended.get(live.request_id)

        live, tracked, ended = asyncio.run(go())
        assert tracked.slo == SLO("chat", ttft_ms=1000.0, tpot_ms=100.0, priority=-7)
        assert ended is not None and ended[:2] == ("failed", "cancelled")
        assert 0 < len(live.tokens) < 200
        assert engine.stats()["chat"].failed == 1
        with engine.session.binding.lock:
            assert engine.session.binding.queue_by_tier == {}


def test_another_model_is_a_404_and_every_refused_request_is_counted(smollm2: Any) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    chat = '{"messages": [{"role": "user", "content": "\\udc00"}]}'
    with serving(smollm2) as engine:
        answers = call(
            engine,
            ("POST", "/v1/completions", {"prompt": "x", "model": "gpt-9000"}, {}),
            ("POST", "/v1/chat/completions", chat, {"content-type": "application/json"}),
            ("POST", "/v1/completions", "not json", {}),
            ("POST", "/v1/completions", {"prompt": "x", "n": 2}, {}),
            ("POST", "/v1/completions", '{"prompt": "' + "a" * (1 << 20) + '"}', {}),
        )
        ((_, _, metrics_text),) = call(engine, ("GET", "/metrics", None, {}))
    (s1, _, t1), (s2, _, t2) = answers[:2]
    assert (s1, json.loads(t1)["error"]) == (404, {
        "message": "the model 'gpt-9000' does not exist (this server serves "
        "'smollm2-135m-instruct')",
        "type": "invalid_request_error", "param": "model", "code": "model_not_found",
    })  # fmt: skip
    assert s2 == 400 and json.loads(t2)["error"]["param"] == "messages[0].content"
    s5, _, t5 = answers[4]
    assert (s5, json.loads(t5)["error"]["message"]) == (
        413,
        "the body is 1,048,590 bytes, over the limit of 1,048,576 (the context holds far less)",
    )
    refused = {
        (s.labels["status"], s.labels["param"]): s.value
        for family in text_string_to_metric_families(metrics_text)
        if family.name == "superinfer_requests_refused"
        for s in family.samples
        if s.name == "superinfer_requests_refused_total"
    }
    assert refused == {
        ("400", ""): 1.0, ("400", "messages[].content"): 1.0, ("400", "n"): 1.0,
        ("404", "model"): 1.0, ("413", ""): 1.0,
    }  # fmt: skip


def test_fields_neither_read_nor_without_effect_are_listed_sorted() -> None:
    body = {"prompt": "x", "max_token": 5, "temperature": 0.7, "response_format": {}, "n": 1}
    assert ignored_fields(body) == ("max_token", "response_format")
    assert ignored_fields({"prompt": "x", "seed": 1, "user": "u", "slo": "chat"}) == ()


def test_a_request_with_ignored_fields_is_served_logged_and_counted(
    smollm2: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    typo = {"prompt": "x", "max_tokens": 2, "max_token": 5, "temperature": 0.5}
    many = {"prompt": "x", "max_tokens": 2, **{f"f{i}": i for i in range(10)}, "a" * 50: 1}
    with caplog.at_level("WARNING", logger="superinfer.serve.engine"), serving(smollm2) as engine:
        answers = call(
            engine,
            ("POST", "/v1/completions", typo, {}),
            ("POST", "/v1/completions", many, {}),
            ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2, "seed": 3}, {}),
        )
        ((_, _, metrics_text),) = call(engine, ("GET", "/metrics", None, {}))
    assert [status for status, _, _ in answers] == [200, 200, 200]
    assert [len(json.loads(text)["choices"]) for _, _, text in answers] == [1, 1, 1]
    lines = sorted(r.getMessage() for r in caplog.records)
    assert lines == [
        f"request fields ignored (not read by this server): '{'a' * 40}', 'f0', 'f1', 'f2', "
        "'f3', 'f4', 'f5', 'f6' and 3 more",
        "request fields ignored (not read by this server): 'max_token'",
    ]
    (count,) = (
        s.value
        for family in text_string_to_metric_families(metrics_text)
        if family.name == "superinfer_requests_with_ignored_fields"
        for s in family.samples
        if s.name == "superinfer_requests_with_ignored_fields_total"
    )
    assert count == 2.0
