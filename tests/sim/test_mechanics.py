"""Each engine profile's mechanics on tiny hand-made cases, with exact outcomes."""

from __future__ import annotations

import pytest

from superinfer.adapters.hookspecs import hookimpl
from superinfer.policy_core.batching import blocks_for_tokens, fill_step
from superinfer.policy_core.kv_bytes import kv_bytes_ratio, kv_sequence_bytes
from superinfer.policy_core.types import (
    KVPrecision,
    Placement,
    PlacementDecision,
    PreemptMode,
    PrefixNodeView,
    ScheduleDecision,
    StepState,
)
from superinfer.sim.config import SimConfig
from superinfer.sim.engine import Simulator
from superinfer.sim.engine_costs import engine_step_time
from superinfer.sim.hardware import get_gpu, get_model
from superinfer.sim.kv import PrefixCache
from superinfer.sim.profiles import SIM_SGLANG, SIM_TRTLLM, SIM_VLLM
from superinfer.sim.request import RequestSpec, RequestStatus
from superinfer.sim.step_time import BatchShape
from tests.sim.helpers import CHAT, InvariantObserver, config, simulate, spec

L8 = get_model("llama-3.1-8b")
A100 = get_gpu("a100-80gb")
#: sim:vllm's own step time (issue 19: the calibrated kernels x its kernel scale + its CPU).
STEP = engine_step_time(SimConfig(SIM_VLLM, get_model("llama-3.1-8b"), get_gpu("a100-80gb")))
BLOCK_BYTES_PER_TOKEN = L8.kv_bytes_per_token()  # FP16, all layers


def hashed(
    rid: str, arrival_s: float, prompt: int, output: int, hashes: tuple[int, ...]
) -> RequestSpec:
    return RequestSpec(rid, arrival_s, prompt, output, output, CHAT, block_hashes=hashes,
                       hash_block_tokens=512)  # fmt: skip


class TestAdmission:
    def test_guaranteed_no_evict_reserves_to_completion_and_never_preempts(self) -> None:
        # Room for exactly one request's prompt + output cap (1,000 + 16 -> 32 blocks of 32).
        first, second = spec("first", 0.0, 1000, 16), spec("second", 0.0, 1000, 16)
        result, _ = simulate([first, second], profile=SIM_TRTLLM, num_gpu_blocks_override=32)
        a, b = result.requests
        assert b.first_token_s > a.finish_s  # waited for the whole reservation to come back
        assert a.num_preemptions == b.num_preemptions == 0

    def test_same_squeeze_preempts_under_vllm_but_never_under_trtllm(self) -> None:
        specs = [spec(f"r{i}", i * 0.01, 300, 400) for i in range(12)]
        vllm, _ = simulate(specs, profile=SIM_VLLM, num_gpu_blocks_override=200)
        trt, _ = simulate(specs, profile=SIM_TRTLLM, num_gpu_blocks_override=100)
        assert sum(r.num_preemptions for r in vllm.requests) > 0
        assert sum(r.num_preemptions for r in trt.requests) == 0
        assert {r.status for r in vllm.requests + trt.requests} == {RequestStatus.FINISHED}

    def test_sglang_holds_back_new_token_ratio_of_running_output_caps(self) -> None:
        seen: list[StepState] = []

        class Recorder:
            name = "recorder"

            @hookimpl
            def superinfer_schedule(self, state: StepState) -> ScheduleDecision:
                seen.append(state)
                return fill_step(state, state.running, state.waiting)

        one = RequestSpec("a", 0.0, 50, 10, 100, CHAT)
        simulate([one], policy=Recorder(), profile=SIM_SGLANG)
        # step 1 admits it (no running yet); step 2 sees it running with 1 of 100 tokens made,
        # and the ratio still at its initial 0.7 (a prefill step does not decay it).
        assert seen[0].reserved_hbm_blocks == 0
        assert seen[1].reserved_hbm_blocks == blocks_for_tokens(int(99 * 0.7), 1) == 69


class TestPrefixCache:
    @pytest.mark.parametrize(
        ("profile", "cached"),
        [(SIM_VLLM, 1184), (SIM_TRTLLM, 1184), (SIM_SGLANG, 1024)],
    )
    def test_a_hit_skips_exactly_the_cached_tokens(self, profile, cached: int) -> None:  # noqa: ANN001
        # 1,190 tokens in hashed blocks of 512, 512, 166. Paged engines cache the last block's
        # whole pages (160 tokens); SGLang caches all 166, but then the hit would reach the last
        # prompt token, which is always recomputed, so it stops one block earlier.
        a = hashed("a", 0.0, 1190, 2, (1, 2, 3))
        b = hashed("b", 100.0, 1190, 2, (1, 2, 3))
        result, _ = simulate([a, b], profile=profile)
        first, second = result.requests
        assert result.counters["cached_tokens"] == cached
        assert second.cached_tokens == cached
        prefill = 1190 - cached
        pairs = prefill * (cached + (prefill + 1) / 2)
        # Each engine's own step time (issue 19: kernel scale, CPU per step, overlap).
        own = engine_step_time(SimConfig(profile, L8, A100))
        expected = own.step_time_s(
            BatchShape(prefill, 1, pairs, 1190, 0, 1, prefill, prefill * 1190, 1)
        )
        assert second.first_token_s - 100.0 == pytest.approx(expected, rel=1e-12)
        assert first.cached_tokens == 0

    def test_evicted_prefix_is_offloaded_to_cpu_and_copied_back_on_a_hit(self) -> None:
        a = hashed("a", 0.0, 2048, 2, (1, 2, 3, 4))  # 4 nodes of 32 pages
        filler = spec("filler", 10.0, 1500, 2)  # needs HBM that only evicting a's nodes frees
        c = hashed("c", 20.0, 2049, 2, (1, 2, 3, 4, 5))
        with_cpu, _ = simulate([a, filler, c], num_gpu_blocks_override=140, cpu_kv_ratio=1.0)
        assert with_cpu.counters["offloaded_blocks"] > 0
        assert with_cpu.counters["onboarded_blocks"] == with_cpu.counters["offloaded_blocks"]
        assert with_cpu.requests[2].cached_tokens == 2048
        no_cpu, _ = simulate([a, filler, c], num_gpu_blocks_override=140, cpu_kv_ratio=0.0)
        assert no_cpu.counters["dropped_blocks"] > 0
        assert no_cpu.requests[2].cached_tokens < 2048

    def test_prioritized_lru_evicts_low_priority_first(self) -> None:
        cache = PrefixCache(32, use_priority=True)
        nodes = [cache.insert(k, None, 64, now_s=float(k)) for k in (1, 2, 3)]
        nodes[0].priority, nodes[1].priority, nodes[2].priority = 80, 10, 35
        cache.unlock(nodes, now_s=5.0)
        order = [cache.pop_victim() for _ in range(3)]
        assert [n.key for n in order if n] == [2, 3, 1]
        lru = PrefixCache(32)
        nodes = [lru.insert(k, None, 64, now_s=0.0) for k in (1, 2, 3)]
        for t, node in zip((3.0, 1.0, 2.0), nodes, strict=True):
            lru.unlock([node], now_s=t)
        assert [lru.pop_victim().key for _ in range(3)] == [2, 3, 1]  # type: ignore[union-attr]

    def test_placement_plugin_pins_and_drops(self) -> None:
        asked: list[tuple[PrefixNodeView, ...]] = []

        class PinFirstBlock:
            name = "pin-first"

            @hookimpl
            def superinfer_kv_placement(self, nodes, now_s, free_hbm_blocks, free_cpu_blocks):  # noqa: ANN001, ANN201
                asked.append(nodes)
                return PlacementDecision({n.node_id: Placement.PIN if n.node_id == "1"
                                          else Placement.DROP for n in nodes})  # fmt: skip

        a = hashed("a", 0.0, 512, 2, (1,))
        b = hashed("b", 1.0, 512, 2, (2,))
        filler = spec("filler", 10.0, 1000, 2)
        pm_policy = "fcfs"
        from superinfer.adapters.manager import build_plugin_manager

        pm = build_plugin_manager(pm_policy)
        pm.register(PinFirstBlock())
        sim = Simulator(config(num_gpu_blocks_override=96, cpu_kv_ratio=1.0), pm.hook)
        result = sim.run([a, b, filler])
        cache = sim.replicas[0].cache
        assert asked and 1 in cache.nodes and cache.nodes[1].pinned
        assert 2 not in cache.nodes  # dropped, not offloaded, as the plugin said
        assert result.counters["offloaded_blocks"] == 0

    def test_a_placement_plugin_reads_the_prompts_keys_and_the_nodes_by_the_same_keys(
        self,
    ) -> None:
        """For a plugin that reads prompt keys (``reads_prompt_keys``: ``adaptive``, ``hazard``)
        a hashed prompt arrives with its block hashes as ``prompt_chunk_keys``, and each cached
        node is one chunk keyed by its hash (its id); an unhashed prompt arrives with none, and
        so does every prompt when no plugin reads them (the simulator hashes nothing then)."""
        arrived: list[tuple[str, tuple[str, ...]]] = []
        shown: set[tuple[str, str, tuple[str, ...]]] = set()

        class Recorder:
            name = "recorder"
            reads_prompt_keys = True

            @hookimpl
            def superinfer_request_arrived(self, request, now_s):  # noqa: ANN001, ANN201
                arrived.append((request.request_id, request.prompt_chunk_keys))

            @hookimpl
            def superinfer_kv_placement(self, nodes, now_s, free_hbm_blocks, free_cpu_blocks):  # noqa: ANN001, ANN201
                shown.update((n.node_id, n.key, n.chunks) for n in nodes)
                return PlacementDecision({})

        from superinfer.adapters.manager import build_plugin_manager

        def run(reads: bool) -> None:
            recorder = Recorder()
            recorder.reads_prompt_keys = reads
            pm = build_plugin_manager("fcfs")
            pm.register(recorder)
            sim = Simulator(config(num_gpu_blocks_override=96), pm.hook)
            assert sim.prompt_keys is reads
            sim.run([hashed("a", 0.0, 1024, 2, (7, 8)), hashed("b", 1.0, 512, 2, (7,)),
                     spec("filler", 10.0, 1000, 2)])  # fmt: skip

        run(True)
        assert arrived == [("a", ("7", "8")), ("b", ("7",)), ("filler", ())]
        assert shown == {("7", "7", ("7",)), ("8", "8", ("8",))}
        arrived.clear()
        run(False)
        assert arrived == [("a", ()), ("b", ()), ("filler", ())]


class SwapOnce:
    """fcfs, except that the first request to reach 5 output tokens is swapped out and resumed."""

    name = "swap-once"

    def __init__(self) -> None:
        self.done = False

    @hookimpl
    def superinfer_schedule(self, state: StepState) -> ScheduleDecision:
        if state.swapped:
            rid = state.swapped[0].request_id
            return ScheduleDecision(num_tokens={rid: 1}, resume=(rid,))
        for view in state.running:
            if view.generated_tokens == 5 and not self.done:
                self.done = True
                return ScheduleDecision(preempt={view.request_id: PreemptMode.SWAP})
        return fill_step(state, state.running, state.waiting)


def test_swap_out_and_in_are_charged_at_link_bandwidth() -> None:
    result, _ = simulate([spec("a", 0.0, 1000, 10)], policy=SwapOnce(), cpu_kv_ratio=1.0)
    (req,) = result.requests
    blocks = blocks_for_tokens(1000 + 4, 16)  # KV of prompt + 4 decoded tokens at the swap
    moved = blocks * 16 * BLOCK_BYTES_PER_TOKEN
    assert result.counters["swap_out_bytes"] == result.counters["swap_in_bytes"] == int(moved)
    assert req.status is RequestStatus.FINISHED and req.generated_tokens == 10
    copy_s = moved / A100.host_link_bytes_s
    a, b = STEP.decode_coefficients(1)
    # the 6th token waits for both copies, then one decode step
    assert req.max_itl_s == pytest.approx(2 * copy_s + a + b * 1005, rel=1e-9)


def test_routers_balance_by_outstanding_tokens() -> None:
    long_job = spec("long", 0.0, 8000, 500)
    shorts = [spec(f"s{i}", 0.001 * (i + 1), 100, 10) for i in range(3)]
    result, _ = simulate([long_job, *shorts], replicas=2, router="least_tokens")
    placed = {r.request_id: r.replica for r in result.requests}
    assert placed == {"long": 0, "s0": 1, "s1": 1, "s2": 1}
    result, _ = simulate([long_job, *shorts], replicas=2, router="round_robin")
    assert [r.replica for r in result.requests] == [0, 1, 0, 1]


def test_no_cpu_tier_means_no_swap() -> None:
    from superinfer.policy_core.validation import PolicyError

    with pytest.raises(PolicyError, match="no CPU KV tier"):
        simulate([spec("a", 0.0, 1000, 10)], policy=SwapOnce(), cpu_kv_ratio=0.0)


class FixedPrecision:
    """Stores every request's KV at one precision."""

    name = "fixed-precision"

    def __init__(self, precision: KVPrecision) -> None:
        self.precision = precision

    @hookimpl
    def superinfer_kv_precision(self, request, state):  # noqa: ANN001, ANN201
        return self.precision


@pytest.mark.parametrize("precision", [KVPrecision.FP16, KVPrecision.INT8, KVPrecision.INT4])
def test_quantized_kv_takes_its_exact_bytes_in_fp16_pages(precision: KVPrecision) -> None:
    from superinfer.adapters.manager import build_plugin_manager

    pm = build_plugin_manager("fcfs")
    pm.register(FixedPrecision(precision))
    sim = Simulator(config(), pm.hook)
    result = sim.run([spec("a", 0.0, 1000, 1)])
    (req,) = result.requests
    page = L8.kv_bytes_per_token() * 16
    expected = -(-kv_sequence_bytes(1000, 32, 8, 128, precision, 32) // int(page))
    assert result.peak_kv_blocks == (expected,)
    assert req.status is RequestStatus.FINISHED
    # int4 codes are half of int8's; both carry the same scales and zero points:
    # per layer and head, a 32-token group is 2*32*128*b/8 code bytes + 2*2*128 + 2*2*128 metadata
    int8 = kv_sequence_bytes(1024, 32, 8, 128, KVPrecision.INT8, 32)
    int4 = kv_sequence_bytes(1024, 32, 8, 128, KVPrecision.INT4, 32)
    meta = 32 * 32 * 8 * (2 * 2 * 128 + 2 * 2 * 128)  # groups x layers x heads x (K + V meta)
    assert int8 - meta == 2 * (int4 - meta)


@pytest.mark.parametrize(("policy", "finished"), [("superinfer", 18), ("fcfs", 24)])
def test_quantized_kv_under_kv_pressure_gives_valid_decisions(policy: str, finished: int) -> None:
    """INT8 requests packed into few pages: the policy counts each next token's pages as the
    engine does (StepState.kv_packing), so no decision overdraws KV (with FP16 page arithmetic
    superinfer admitted past the free pages, and filed a decode that a group's end had freed a
    page of as not growing) and every request finishes or is rejected with its reason
    (superinfer gives up on the chats whose TTFT is already lost)."""
    from superinfer.adapters.manager import build_plugin_manager

    pm = build_plugin_manager(policy)
    pm.register(FixedPrecision(KVPrecision.INT8))
    observer = InvariantObserver()
    sim = observer.sim = Simulator(config(num_gpu_blocks_override=400), pm.hook)
    pm.register(observer)
    specs = [spec(f"r{i}", 0.05 * i, 300 + 37 * i, 200) for i in range(24)]
    result = sim.run(specs)
    done = [r for r in result.requests if r.status is RequestStatus.FINISHED]
    rejected = [r for r in result.requests if r.status is RequestStatus.REJECTED]
    assert (len(done), len(rejected)) == (finished, 24 - finished)
    assert all(r.reason for r in rejected)
    assert observer.steps > 0
    state = sim.replicas[0].state(result.requests[0].finish_s)
    assert state.kv_packing is not None
    assert state.kv_packing.blocks(1000, KVPrecision.INT8) == -(
        -kv_sequence_bytes(1000, 32, 8, 128, KVPrecision.INT8, 32) // (16 * BLOCK_BYTES_PER_TOKEN)
    )


def test_quantized_kv_makes_decode_attention_cheaper() -> None:
    from superinfer.adapters.manager import build_plugin_manager

    times = {}
    for precision in (KVPrecision.FP16, KVPrecision.INT4):
        pm = build_plugin_manager("fcfs")
        pm.register(FixedPrecision(precision))
        (req,) = Simulator(config(), pm.hook).run([spec("a", 0.0, 4000, 3)]).requests
        times[precision] = req.finish_s - req.first_token_s
    a, b = STEP.decode_coefficients(1)
    ratio = kv_bytes_ratio(128, KVPrecision.INT4, 32)
    assert times[KVPrecision.FP16] == pytest.approx(2 * a + b * (4001 + 4002), rel=1e-9)
    assert times[KVPrecision.INT4] == pytest.approx(2 * a + b * ratio * (4001 + 4002), rel=1e-9)


def test_cache_aware_router_follows_the_prefix_then_the_emptiest_cache() -> None:
    first = hashed("first", 0.0, 2048, 2, (1, 2, 3, 4))
    other = hashed("other", 10.0, 2048, 2, (9, 8, 7, 6))  # no shared prefix: emptiest cache
    again = hashed("again", 20.0, 2500, 2, (1, 2, 3, 4, 5))  # 2,048 of 2,500 cached: > 30%
    short = hashed("short", 30.0, 4000, 2, (1, 10, 11, 12, 13, 14, 15, 16))  # 512 < 30%
    result, _ = simulate([first, other, again, short], replicas=2, router="cache_aware")
    placed = {r.request_id: r.replica for r in result.requests}
    assert placed == {"first": 0, "other": 1, "again": 0, "short": 1}


def test_sglang_03_ignore_eos_admission_reaches_the_policy_and_is_off_in_every_profile() -> None:
    from dataclasses import replace

    from superinfer.sim.profiles import EngineProfile
    from superinfer.sim.replica import Replica
    from superinfer.sim.versions import VERSIONS

    def state_of(profile: EngineProfile) -> StepState:
        return Replica(0, profile, 10, 0, 8, 4, 0, 0.0).state(0.0)

    assert state_of(replace(SIM_SGLANG, finish_aware_admission=True)).finish_aware_admission
    assert not state_of(SIM_SGLANG).finish_aware_admission
    assert not any(p.finish_aware_admission for p in VERSIONS.values())
