"""How the server runs: :class:`ServeConfig` and the default SLO classes."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from superinfer.policy_core.types import SLO

__all__ = ["DEFAULT_SLO_CLASSES", "PRIORITY_CONVENTIONS", "ServeConfig"]

#: The benchmark's classes (docs/metrics.md; the SGLang adapter's defaults): chat must meet
#: TTFT <= 1 s and TPOT <= 100 ms, batch must finish within 600 s.
DEFAULT_SLO_CLASSES: Mapping[str, SLO] = {
    "chat": SLO("chat", ttft_ms=1000.0, tpot_ms=100.0, priority=0),
    "batch": SLO("batch", deadline_s=600.0, priority=1),
}

#: ``priority`` conventions: vLLM ranks lower values first (``--scheduling-policy priority``),
#: SGLang higher values first (unless ``--schedule-low-priority-values-first``).
PRIORITY_CONVENTIONS = ("vllm", "sglang")


@dataclass(frozen=True)
class ServeConfig:
    """How ``superinfer serve --engine hf`` runs.

    Attributes:
        host: address to bind (127.0.0.1: this machine only).
        port: TCP port, 0 to 65535 (0: any free port); else ``ValueError``.
        policy: registered policy name.
        slo_classes: SLO class by name.
        default_class: class of a request that names none.
        priority_convention: ``"vllm"`` (lower ``priority`` is more urgent) or ``"sglang"``
            (higher is more urgent).
        served_model_name: the model id of ``/v1/models`` and of responses.
        isolated_latency: prompt tokens -> ``(prefill_ms, decode_ms)`` of a request alone on
            this engine (a step-time calibration), for engine-relative SLOs
            (``ttft_x_isolated``, ``tpot_x_isolated``); ``None``: such requests get HTTP 400.
        drain_s: on SIGTERM or a first SIGINT, how long requests in flight may run on, s
            (> 0); those still running then are failed (``server shutdown``: an ``error``
            event on a stream, HTTP 503 otherwise) and counted.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    policy: str = "fcfs"
    slo_classes: Mapping[str, SLO] = field(default_factory=lambda: dict(DEFAULT_SLO_CLASSES))
    default_class: str = "batch"
    priority_convention: str = "vllm"
    served_model_name: str = "smollm2-135m-instruct"
    isolated_latency: Callable[[int], tuple[float, float]] | None = None
    drain_s: float = 30.0

    def __post_init__(self) -> None:
        d = self.drain_s
        number = isinstance(d, int | float) and not isinstance(d, bool)
        if not (number and math.isfinite(d) and d > 0):
            raise ValueError(f"drain_s must be a number of seconds > 0, got {d!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, int):
            raise ValueError(f"port must be an integer in [0, 65535], got {self.port!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535] (TCP), got {self.port}")
        if self.default_class not in self.slo_classes:
            known = ", ".join(sorted(self.slo_classes))
            raise ValueError(f"default class {self.default_class!r} is not a class ({known})")
        if self.priority_convention not in PRIORITY_CONVENTIONS:
            raise ValueError(
                f"priority convention {self.priority_convention!r}: use vllm or sglang"
            )
