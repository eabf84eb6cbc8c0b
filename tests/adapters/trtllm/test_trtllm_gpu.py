"""Both modes on a real TensorRT-LLM 1.2.x (NGC ``nvcr.io/nvidia/tensorrt-llm/release:1.2.1``).

A two-layer Llama with dummy weights (``load_format="dummy"``, no download), TP1, the executor in
this process (``TLLM_WORKER_USE_SINGLE_PROCESS=1``). Skipped, with the reason, wherever
``tensorrt_llm`` does not import, is not 1.2.x, or there is no CUDA device. Run it with
``pytest -m gpu tests/adapters/trtllm/test_trtllm_gpu.py -rs``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from superinfer.adapters.manager import build_plugin_manager
from superinfer.adapters.trtllm import plugin
from superinfer.adapters.trtllm.engine import UnsupportedEngineError, check_version
from superinfer.adapters.trtllm.gate import TrtllmGate
from superinfer.adapters.trtllm.scheduler import SuperinferScheduler
from superinfer.adapters.trtllm.slo_table import InMemorySloTable
from tests.adapters.trtllm.helpers import BATCH, CHAT, Recorder

pytestmark = pytest.mark.gpu

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


def _engine() -> Any:
    trtllm = pytest.importorskip(
        "tensorrt_llm", reason="tensorrt_llm is not importable here (needs CUDA; NGC 1.2.1 image)"
    )
    try:
        check_version(trtllm.__version__)
    except UnsupportedEngineError as exc:
        pytest.skip(str(exc))
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return trtllm


def test_both_modes_on_a_real_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _engine()
    from tensorrt_llm import LLM, SamplingParams
    from tensorrt_llm.llmapi import KvCacheConfig

    monkeypatch.setenv("TLLM_WORKER_USE_SINGLE_PROCESS", "1")
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    engine_side = Recorder()
    pm_b = build_plugin_manager("priority")
    pm_b.register(engine_side)
    table = InMemorySloTable()
    plugin.install(pm_b.hook, slo_table=table, record_admissions=True)
    try:
        llm = LLM(
            model=str(tmp_path),
            skip_tokenizer_init=True,
            load_format="dummy",
            max_batch_size=4,
            max_num_tokens=1024,
            max_seq_len=512,
            kv_cache_config=KvCacheConfig(
                max_tokens=4096, enable_block_reuse=True, event_buffer_max_size=4096
            ),
        )
    finally:
        plugin.uninstall()
    front = Recorder()
    pm_a = build_plugin_manager("priority")
    pm_a.register(front)
    gate = TrtllmGate(llm, pm_a.hook, slo_table=table)
    shared = list(range(1, 129))  # a 128-token prefix shared by every request

    async def one(i: int) -> int:
        n = 0
        prompt = shared + [1000 + i] * 16
        # no tokenizer: end_id must be given; ignore_eos keeps every output at max_tokens
        params = SamplingParams(max_tokens=8, end_id=2, pad_id=2, ignore_eos=True)
        async for out in gate.generate(prompt, params, slo=CHAT if i % 2 else BATCH):
            n = len(out.outputs[0].token_ids)
        return n

    async def main() -> list[int]:
        poller = asyncio.create_task(gate.poll_forever(0.01))
        try:
            return await asyncio.gather(*(one(i) for i in range(12)))
        finally:
            poller.cancel()

    lengths = asyncio.run(main())
    gate.poll()
    llm.shutdown()
    assert lengths == [8] * 12
    assert len(front.finished) == 12 and not front.aborted
    assert gate.counters.num_submitted == 12
    # Mode B ran inside the executor: the engine-side policy saw every request
    assert engine_side.states, "the wrapped scheduler was never called"
    assert len({v.request_id for v in engine_side.arrived}) == 12
    assert {v.slo.name for v in engine_side.arrived} <= {"chat", "batch", "default"}
    # KV events arrived and index the shared prefix
    assert gate.table.num_events > 0
    assert len(gate.table.match(shared)) == 128 // 32
    executor = getattr(getattr(llm, "_executor", None), "engine", None)
    if executor is not None:  # single-process layout [verify]: GenerationExecutorWorker.engine
        assert isinstance(executor.scheduler, SuperinferScheduler)
