"""The simulator's StepState change sets equal the difference of consecutive full snapshots of
each replica (issue 21), over random workloads and random valid decisions (swaps, resumes,
prefetches, rejections, prefix-cache hits that grow and shrink), on every engine profile."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from superinfer.adapters.manager import build_plugin_manager
from superinfer.sim.engine import Simulator
from superinfer.sim.profiles import SIM_SGLANG, SIM_TRTLLM, SIM_VLLM
from superinfer.sim.request import RequestSpec
from tests.change_sets import StateRecorder, assert_change_sets_exact
from tests.sim.helpers import config
from tests.sim.test_properties import SLOS, Chaos, requests_st


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    raw=requests_st,
    profile=st.sampled_from([SIM_VLLM, SIM_SGLANG, SIM_TRTLLM]),
    blocks=st.integers(60, 400),
    cpu_ratio=st.sampled_from([0.0, 0.5, 2.0]),
    replicas=st.sampled_from([1, 2]),
    seed=st.integers(0, 10_000),
)
def test_sim_change_sets_equal_the_snapshot_difference(  # noqa: PLR0913
    raw,
    profile,
    blocks,
    cpu_ratio,
    replicas,
    seed,  # noqa: ANN001
) -> None:
    specs = []
    for i, (arrival, prompt, output, suffix, cls) in enumerate(sorted(raw)):
        chain = (0, *suffix)
        hashes = tuple(hash(chain[: j + 1]) & 0xFFFF_FFFF for j in range(len(chain)))
        specs.append(RequestSpec(f"r{i}", arrival, prompt, output, output + 5, SLOS[cls],
                                 block_hashes=hashes[: -(-prompt // 512)],
                                 hash_block_tokens=512))  # fmt: skip
    chaos = Chaos(seed)
    recorder = StateRecorder(chaos.superinfer_schedule)
    pm = build_plugin_manager(recorder)
    blocks_scaled = blocks * 16 // profile.block_size_tokens
    sim = Simulator(config(profile=profile, num_gpu_blocks_override=blocks_scaled,
                           cpu_kv_ratio=cpu_ratio, replicas=replicas), pm.hook)  # fmt: skip
    sim.run(specs)
    assert assert_change_sets_exact(recorder.states) == len(recorder.states) > 0
    assert {s.changes.series for s in recorder.states if s.changes} == {  # one per replica
        rep.views.series for rep in sim.replicas if rep.views.seq
    }
