"""``QuantPlanner``: per-request KV precision from SLO class and memory pressure (DESIGN §6).

As KV memory pressure grows the planner steps every new request down a ladder,
FP16 -> INT8 -> INT4, but never below its class's floor. Pressure moves the level up at a
threshold and down only ``hysteresis`` below it, so a pool hovering at a threshold does not flip
precision on every admission. A request keeps the precision it was admitted with.

Default floors come from ``results/kv_quant_accuracy.csv`` (SmolLM2-135M-Instruct, 32 ShareGPT
prompts, 3,503 scored reply tokens; definitions in docs/kv_quant.md): INT8 with KIVI groups agrees
with the unquantized model on 99.7-99.8% of next tokens at +0.02% perplexity, INT4 on 96.7-97.5%
at +0.6% to +1.2% (95% bootstrap intervals over prompts do not overlap). So ``chat``
(interactive, strict SLO) stops at INT8 and every other class may go to INT4. The pressure
thresholds are starting values, not measured optima: the simulator is where to sweep them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from superinfer.policy_core.batching import blocks_for_tokens
from superinfer.policy_core.types import KVPrecision, RequestView, StepState

__all__ = ["PRECISION_LADDER", "QuantPlanner", "parse_floors"]

PRECISION_LADDER = (KVPrecision.FP16, KVPrecision.INT8, KVPrecision.INT4)


def parse_floors(spec: str) -> dict[str, KVPrecision]:
    """``"chat=int8,batch=int4"`` -> ``{"chat": INT8, "batch": INT4}``.

    Raises:
        ValueError: an item without ``=`` or an unknown precision (names the item).
    """
    floors: dict[str, KVPrecision] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"floors item {item!r} is not class=precision")
        try:
            floors[name.strip()] = KVPrecision(value.strip())
        except ValueError:
            raise ValueError(f"floors item {item!r}: unknown precision {value!r}") from None
    return floors


@dataclass
class QuantPlanner:
    """Chooses the KV precision of each request at admission.

    Pressure is the KV demand on HBM as a fraction of its capacity: blocks in use, plus (with
    ``count_waiting``) the FP16 blocks that waiting requests' uncached prompts and swapped
    requests' KV would take. It may exceed 1.

    Attributes:
        floors: SLO class name -> least precise precision allowed (``"chat=int8"`` strings are
            accepted too). Classes not named use ``default_floor``.
        default_floor: floor of classes not in ``floors``.
        int8_pressure: pressure at which new requests go to INT8.
        int4_pressure: pressure at which new requests go to INT4.
        hysteresis: a level is left downwards only when pressure falls this far below the
            threshold that entered it.
        count_waiting: include queued demand (waiting prompts, swapped KV) in the pressure.
        name: plugin name.

    Raises:
        ValueError: thresholds not in ``0 < int8_pressure < int4_pressure``, a hysteresis not in
            ``[0, int8_pressure)``, or a floor that is not on the ladder (FP8).
    """

    floors: Mapping[str, KVPrecision] | str = field(
        default_factory=lambda: {"chat": KVPrecision.INT8}
    )
    default_floor: KVPrecision = KVPrecision.INT4
    int8_pressure: float = 0.70
    int4_pressure: float = 0.85
    hysteresis: float = 0.10
    count_waiting: bool = True
    name: str = "quant"
    level: int = field(default=0, init=False)  # index into PRECISION_LADDER

    def __post_init__(self) -> None:
        if isinstance(self.floors, str):
            self.floors = parse_floors(self.floors)
        self.default_floor = KVPrecision(self.default_floor)
        if not 0 < self.int8_pressure < self.int4_pressure:
            raise ValueError(
                f"quant: need 0 < int8_pressure < int4_pressure, got "
                f"{self.int8_pressure}, {self.int4_pressure}"
            )
        if not 0 <= self.hysteresis < self.int8_pressure:
            raise ValueError(
                f"quant: hysteresis must be in [0, int8_pressure), got {self.hysteresis}"
            )
        for cls, floor in (*self.floors.items(), ("<default>", self.default_floor)):
            if floor not in PRECISION_LADDER:
                raise ValueError(f"quant: floor of {cls!r} must be fp16, int8 or int4, got {floor}")

    @property
    def thresholds(self) -> tuple[float, float, float]:
        """Pressure that enters each ladder level (FP16 is entered at 0)."""
        return (0.0, self.int8_pressure, self.int4_pressure)

    def pressure(self, state: StepState) -> float:
        """KV demand on HBM as a fraction of its capacity (0 for a replica without KV blocks)."""
        if state.total_hbm_blocks <= 0:
            return 0.0
        demand = state.total_hbm_blocks - state.free_hbm_blocks
        if self.count_waiting:
            size = state.block_size_tokens
            demand += sum(
                blocks_for_tokens(max(0, r.prompt_tokens - r.prefix_hit_tokens), size)
                for r in state.waiting
            )
            demand += sum(r.kv_blocks for r in state.swapped)
        return demand / state.total_hbm_blocks

    def observe(self, pressure: float) -> KVPrecision:
        """Move the level with ``pressure`` (with hysteresis); return the level's precision."""
        up = self.thresholds
        while self.level < len(PRECISION_LADDER) - 1 and pressure >= up[self.level + 1]:
            self.level += 1
        while self.level > 0 and pressure < up[self.level] - self.hysteresis:
            self.level -= 1
        return PRECISION_LADDER[self.level]

    def floor(self, slo_name: str) -> KVPrecision:
        """The least precise precision class ``slo_name`` may get."""
        assert not isinstance(self.floors, str)
        return self.floors.get(slo_name, self.default_floor)

    def plan(self, request: RequestView, state: StepState) -> KVPrecision:
        """Precision for ``request`` about to be admitted under ``state``.

        Updates the pressure level (the planner's only state); does not mutate its inputs.
        """
        level = PRECISION_LADDER.index(self.observe(self.pressure(state)))
        floor = PRECISION_LADDER.index(self.floor(request.slo.name))
        return PRECISION_LADDER[min(level, floor)]
