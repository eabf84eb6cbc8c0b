"""Per-request KV precision on TensorRT-LLM: one engine per KV dtype, a Mode A gate on each.

TensorRT-LLM 1.2 stores every request's KV in the engine's one ``kv_cache_config.dtype``, so the
quantization planner's per-request choice becomes a choice of engine (engine notes §2.4).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from superinfer.adapters.trtllm.apply import choose_pool
from superinfer.adapters.trtllm.gate import GateRequest, TrtllmGate
from superinfer.policy_core.types import SLO, KVPrecision

__all__ = ["PrecisionRouter"]


class PrecisionRouter:
    """Per-request KV precision as a choice among engines, one KV dtype each (notes §2.4).

    At each arrival the router asks ``superinfer_kv_precision`` with the request as it would look
    in the highest-precision engine and that engine's state (its memory pressure), then submits
    it to the engine whose precision :func:`~superinfer.adapters.trtllm.apply.choose_pool` picks.

    Args:
        gates: one gate per engine, by the precision of its KV dtype.
        hook: the plugin manager's hook relay.

    Raises:
        ValueError: no gates.
    """

    def __init__(self, gates: Mapping[KVPrecision, TrtllmGate], hook: Any) -> None:
        if not gates:
            raise ValueError("PrecisionRouter needs at least one gate")
        self.gates = dict(gates)
        self.hook = hook
        self.default = choose_pool(KVPrecision.FP16, self.gates)
        self.routed: dict[KVPrecision, int] = dict.fromkeys(self.gates, 0)

    def route(self, prompt_token_ids: Sequence[int], sampling_params: Any, slo: SLO) -> KVPrecision:
        """The precision pool for a request arriving now."""
        gate = self.gates[self.default]
        max_out = int(getattr(sampling_params, "max_tokens", None) or 0)
        asked = self.hook.superinfer_kv_precision(
            request=gate.preview(prompt_token_ids, max_out, slo), state=gate.state()
        )
        return choose_pool(asked or self.default, self.gates)

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        sampling_params: Any = None,
        *,
        slo: SLO,
        request_id: str | None = None,
        **generate_kwargs: Any,
    ) -> GateRequest:
        """Route, then :meth:`TrtllmGate.submit` on the chosen engine's gate."""
        precision = self.route(prompt_token_ids, sampling_params, slo)
        self.routed[precision] += 1
        return self.gates[precision].submit(
            prompt_token_ids, sampling_params, slo=slo, request_id=request_id, **generate_kwargs
        )

    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        sampling_params: Any = None,
        *,
        slo: SLO,
        request_id: str | None = None,
        **generate_kwargs: Any,
    ) -> AsyncIterator[Any]:
        """Route, then stream from :meth:`TrtllmGate.generate` on the chosen engine's gate."""
        precision = self.route(prompt_token_ids, sampling_params, slo)
        self.routed[precision] += 1
        async for output in self.gates[precision].generate(
            prompt_token_ids, sampling_params, slo=slo, request_id=request_id, **generate_kwargs
        ):
            yield output
