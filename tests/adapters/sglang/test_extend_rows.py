"""The opt-in fix of SGLang's CPU extend attention (``adapters/sglang/extend_rows.py``): prefill
rows bit for bit SGLang's, one-token extends bit for bit SGLang's decode path, and the cases it
hands back to SGLang whole."""

from __future__ import annotations

from typing import Any

import pytest

from tests.adapters.sglang.gate import require_sglang

require_sglang()

import torch  # noqa: E402
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend  # noqa: E402
from sglang.srt.plugins.hook_registry import HookRegistry, HookType  # noqa: E402

from superinfer.adapters.sglang import extend_rows as mod  # noqa: E402

HEADS, KV_HEADS, DIM = 9, 3, 64  # SmolLM2-135M's attention
ORIGINAL = TorchNativeAttnBackend._run_sdpa_forward_extend


def _batch(contexts: list[int], extends: list[int]) -> tuple[Any, ...]:
    """An extend batch over a KV pool of random bf16 values: request ``i`` holds
    ``contexts[i] - extends[i]`` tokens and extends them by ``extends[i]``."""
    gen = torch.Generator().manual_seed(0)
    pool = sum(contexts)
    k = torch.randn(pool, KV_HEADS, DIM, generator=gen).to(torch.bfloat16)
    v = torch.randn(pool, KV_HEADS, DIM, generator=gen).to(torch.bfloat16)
    req_to_token = torch.zeros(len(contexts), max(contexts) + 8, dtype=torch.int64)
    start = 0
    for i, c in enumerate(contexts):
        req_to_token[i, :c] = torch.arange(start, start + c)
        start += c
    q = torch.randn(sum(extends), HEADS, DIM, generator=gen).to(torch.bfloat16)
    lens, ext = torch.tensor(contexts), torch.tensor(extends)
    return q, k, v, req_to_token, torch.arange(len(contexts)), lens, lens - ext, ext


def _run(fn: Any, batch: tuple[Any, ...], **kw: Any) -> Any:
    q, k, v, r2t, pool, lens, prefix, ext = batch
    out = torch.zeros_like(q)
    backend = object.__new__(TorchNativeAttnBackend)  # the functions read no state
    fn(backend, q, out, k, v, r2t, pool, lens, prefix, ext, **kw)
    return out


def _fixed(*args: Any, **kw: Any) -> Any:
    return mod.extend_rows(ORIGINAL, *args, **kw)


KW = {"scaling": DIM**-0.5, "enable_gqa": True, "causal": True}


def _decode(batch: tuple[Any, ...], **kw: Any) -> Any:
    """SGLang's decode path on the same requests (one query row each: a batch of decodes)."""
    q, k, v, r2t, pool, lens, _, _ = batch
    out = torch.zeros_like(q)
    backend = object.__new__(TorchNativeAttnBackend)
    kw = {key: kw[key] for key in ("scaling", "enable_gqa")}
    backend._run_sdpa_forward_decode(q, out, k, v, r2t, pool, lens, causal=False, **kw)
    return out


def test_prefill_rows_are_sglangs_and_one_token_extends_are_its_decodes() -> None:
    # two prefill chunks (one on a 280-token prefix) and three decodes riding along
    batch = _batch([300, 40, 513, 77, 900], [20, 1, 13, 1, 1])
    fixed, padded = _run(_fixed, batch, **KW), _run(ORIGINAL, batch, **KW)
    prefill = [*range(0, 20), *range(21, 34)]
    assert torch.equal(fixed[prefill], padded[prefill])
    decode_rows = [20, 34, 35]
    q, k, v, r2t, pool, lens, _, _ = batch
    alone = (q[decode_rows], k, v, r2t, pool[[1, 3, 4]], lens[[1, 3, 4]], None, None)
    assert torch.equal(fixed[decode_rows], _decode(alone, **KW))
    # the padded square's last row is the same attention, summed in another order: equal to
    # bf16 rounding (measured here: at most 1 unit in the last place, in 1 of 1,728 values)
    torch.testing.assert_close(fixed, padded)
    decodes_only = _batch([64, 65, 700], [1, 1, 1])
    assert torch.equal(_run(_fixed, decodes_only, **KW), _decode(decodes_only, **KW))


def test_what_it_was_not_written_for_goes_to_sglang_whole() -> None:
    calls: list[int] = []

    def spy(*args: Any, **kw: Any) -> Any:
        calls.append(len(args[1]))  # the query rows handed over
        return ORIGINAL(*args, **kw)

    def fixed_spy(*args: Any, **kw: Any) -> Any:
        return mod.extend_rows(spy, *args, **kw)

    prefills = _batch([300, 40], [20, 40])
    assert torch.equal(_run(fixed_spy, prefills, **KW), _run(ORIGINAL, prefills, **KW))
    mixed = _batch([300, 40, 77], [20, 1, 1])
    window = {**KW, "sliding_window_size": 16}
    assert torch.equal(_run(fixed_spy, mixed, **window), _run(ORIGINAL, mixed, **window))
    bidirectional = {**KW, "causal": False}
    _run(fixed_spy, mixed, **bidirectional)
    _run(fixed_spy, mixed, **KW)  # the decodes stay here: SGLang gets the 20 prefill rows
    assert calls == [60, 22, 22, 20]


def test_the_entry_point_installs_the_hook_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(HookRegistry, "_hooks", type(HookRegistry._hooks)(list))
    monkeypatch.delenv(mod.ENV_EXTEND_ROWS, raising=False)
    mod.register()
    assert dict(HookRegistry._hooks) == {}
    monkeypatch.setenv(mod.ENV_EXTEND_ROWS, "1")
    mod.register()
    ((kind, hook, _),) = HookRegistry._hooks[mod._TARGET]
    assert (kind, hook) == (HookType.AROUND, mod.extend_rows)
