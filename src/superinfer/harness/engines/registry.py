"""Engine ids -> engine families: the one place that knows what an engine id means.

An engine id is ``sim:<profile>`` (a simulated GPU engine, ``sim.profiles.PROFILES``),
``sim:hf-cpu`` (the simulator profile of the real CPU engine), ``hf`` (the real CPU engine) or
``http`` (a live OpenAI-compatible server). Each maps to an :class:`EngineFamily`: its runner,
the run directory a bench of it alone writes, the workload shaping it defaults to, and how the
report describes it. Adding an engine family = one runner module + one entry here.

This module imports no runner (runners are named ``module:attribute`` and loaded on use), so the
report and the CLI may read it without importing an engine.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from superinfer.harness.errors import UserError

__all__ = [
    "DEFAULT_OUT",
    "FAMILIES",
    "HF_WORKLOAD",
    "SIM_WORKLOAD",
    "STACK_PARTS",
    "EngineFamily",
    "parse_stack",
    "stack_parts",
    "default_source",
    "engine_family",
    "family_kinds",
    "run_dir",
    "shaping_defaults",
]

#: Run directory of a bench whose engines do not all share a folder of their own.
DEFAULT_OUT = "results/default"

#: The workload ``superinfer bench`` replays on ``hf`` / ``sim:hf-cpu`` unless told otherwise:
#: the Azure 2023 mix from trace second 100 (10 trace seconds: 39 chat and 16 batch requests,
#: the window holds the first code burst after the code service starts at 77 s), arrivals slowed
#: 20x (0.28 req/s over 200 s), lengths divided by 8 and capped at 256 prompt / 64 output
#: tokens. Sized from the figures in issue 8 (2 quiet cores: about 100 prompt and 24 output
#: tokens/s combined): about half the engine's capacity.
HF_WORKLOAD: Mapping[str, Any] = MappingProxyType(
    {
        "start_s": 100.0,
        "rate_scale": 0.05,
        "duration_s": 200.0,
        "length_scale": 0.125,
        "max_prompt_tokens": 256,
        "max_output_tokens": 64,
    }
)
#: The whole trace, unshaped: what every other engine replays by default.
SIM_WORKLOAD: Mapping[str, Any] = MappingProxyType(
    {
        "start_s": 0.0,
        "rate_scale": 1.0,
        "duration_s": None,
        "length_scale": 1.0,
        "max_prompt_tokens": None,
        "max_output_tokens": None,
    }
)


@dataclass(frozen=True)
class EngineFamily:
    """What the harness needs to know about the engines of one family.

    Attributes:
        name: family name; the cells of ``manifest.json`` are keyed ``<engine id>/<policy>``.
        runner: ``module:attribute`` of ``runner(config, engine, policy, workload) ->
            CellResult`` (loaded on first use).
        out_dir: run directory of a bench whose engines all share this folder; ``None``: the
            default (:data:`DEFAULT_OUT`).
        shaping: workload shaping (``start_s``, ``rate_scale``, ...) used where the user set
            none, when any engine of the run has one; ``None``: the whole trace.
        default_source: ``("trace", name)`` or ``("workload", spec)`` replayed when the user
            names neither and every engine agrees; else the ``azure-mixed`` spec.
        label_only: the policy runs on a server the harness does not control; ``--policies``
            only labels the rows.
        kind: how the report describes it: ``sim-gpu`` (a simulated GPU cluster), ``real-cpu``
            (the real CPU engine), ``sim-cpu`` (its simulator profile), ``real-server`` (a real
            server the harness starts per policy) or ``live`` (a server).
        engine_policies: policy names the engine runs itself, without our plugin (accepted by
            ``--policies`` beside the registered ones; ``sglang``: ``native``, ``lpm``,
            ``priority`` are SGLang's own scheduling).
        default_policies: what ``--policies`` defaults to; empty: every registered policy
            the run's families can all run (:attr:`unsupported_policies` left out).
        unsupported_policies: registered policies this family cannot run, left out of the
            default selection and refused by name (``hf``: ``oracle``, which needs each
            request's true output length and the real engine's runner does not feed it).
        step_model: where a request's latency alone on an idle replica comes from
            (``harness.engines.isolated``): ``"sim"`` (the simulator's step-time model of the
            profile), ``"hf-cpu"`` (the measured CPU calibration, ``sim.hf_cpu``) or ``None``
            (none: engine-relative SLOs are refused, feasibility is unknown).
        stack_parts: the parts of ``bench --stack full`` the engine can apply
            (:data:`STACK_PARTS`); the others are left off and the run says why.
    """

    name: str
    runner: str
    out_dir: str | None = None
    shaping: Mapping[str, Any] | None = None
    default_source: tuple[str, str] = ("workload", "azure-mixed")
    label_only: bool = False
    kind: str = "sim-gpu"
    engine_policies: tuple[str, ...] = ()
    default_policies: tuple[str, ...] = ()
    unsupported_policies: tuple[str, ...] = ()
    step_model: str | None = None
    stack_parts: tuple[str, ...] = ()
    _cache: dict[str, Callable[..., Any]] = field(default_factory=dict, compare=False, repr=False)

    def load_runner(self) -> Callable[..., Any]:
        """The family's runner function (imported on first call)."""
        if "runner" not in self._cache:
            module, _, attr = self.runner.partition(":")
            self._cache["runner"] = getattr(importlib.import_module(module), attr)
        return self._cache["runner"]


_PKG = "superinfer.harness.engines"

#: The parts of ``bench --stack full``: the ``superinfer`` policy's rotation through HBM
#: (``superinfer.rotation=true``), the reuse predictor's prefix-cache placement
#: (``--kv-policy reuse``) and the KV quantization planner (``--kv-quant``), with why an engine
#: that lacks one cannot apply it.
STACK_PARTS: Mapping[str, str] = MappingProxyType(
    {
        "rotation": "needs a CPU KV tier to swap to",
        "reuse": "needs a prefix cache the placement plugin drives",
        "quant": "needs per-request KV precision in the engine",
    }
)


def parse_stack(value: str) -> str:
    """``--stack`` -> its canonical form: ``"none"``, ``"full"`` (every part of
    :data:`STACK_PARTS`), or the parts named, comma-separated in :data:`STACK_PARTS` order
    (``"quant,rotation"`` -> ``"rotation,quant"``; all three -> ``"full"``).

    Raises:
        UserError: a part that is not in :data:`STACK_PARTS`, or an empty list.
    """
    text = value.strip().lower()
    if text in ("none", "full"):
        return text
    named = {p.strip() for p in text.split(",") if p.strip()}
    unknown = sorted(named - set(STACK_PARTS))
    if unknown or not named:
        raise UserError(
            f"--stack {value!r}: expected none, full or comma-separated parts of "
            f"{', '.join(STACK_PARTS)}" + (f" (unknown: {', '.join(unknown)})" if unknown else "")
        )
    parts = [p for p in STACK_PARTS if p in named]
    return "full" if len(parts) == len(STACK_PARTS) else ",".join(parts)


def stack_parts(stack: str) -> tuple[str, ...]:
    """The parts a canonical ``stack`` (:func:`parse_stack`) asks for."""
    if stack == "none":
        return ()
    return tuple(STACK_PARTS) if stack == "full" else tuple(stack.split(","))


#: Families by name. ``sim:hf-cpu`` has its own entry (:data:`_EXACT`) ahead of ``sim``.
FAMILIES: Mapping[str, EngineFamily] = MappingProxyType(
    {
        "sim": EngineFamily(
            "sim",
            f"{_PKG}.sim:run_sim_cell",
            step_model="sim",
            stack_parts=("rotation", "reuse", "quant"),
        ),
        "sim-hf-cpu": EngineFamily(
            "sim-hf-cpu",
            f"{_PKG}.sim:run_sim_hf_cpu_cell",
            out_dir="results/hf",
            shaping=HF_WORKLOAD,
            default_source=("trace", "azure"),
            kind="sim-cpu",
            step_model="hf-cpu",
        ),
        "hf": EngineFamily(
            "hf",
            f"{_PKG}.hf:run_hf_cell",
            out_dir="results/hf",
            shaping=HF_WORKLOAD,
            default_source=("trace", "azure"),
            kind="real-cpu",
            unsupported_policies=("oracle",),
            step_model="hf-cpu",
        ),
        "sglang": EngineFamily(
            "sglang",
            f"{_PKG}.sglang:run_sglang_cell",
            out_dir="results/sglang-cpu",
            shaping=HF_WORKLOAD,
            default_source=("trace", "azure"),
            kind="real-server",
            stack_parts=("reuse",),
            engine_policies=("native", "lpm", "priority"),
            default_policies=("native", "lpm", "priority", "superinfer"),
        ),
        "http": EngineFamily(
            "http",
            f"{_PKG}.http:run_http_cell",
            out_dir="results/http",
            label_only=True,
            kind="live",
        ),
    }
)
#: Engine ids with a family of their own, ahead of the prefix rule.
_EXACT = MappingProxyType(
    {"sim:hf-cpu": "sim-hf-cpu", "hf": "hf", "sglang": "sglang", "http": "http"}
)
#: Engine-id prefixes (the part before ``:``) -> family.
_PREFIX = MappingProxyType({"sim": "sim"})


def engine_family(engine: str) -> EngineFamily:
    """The family of engine id ``engine``.

    Raises:
        UserError: an id of no known family; the message lists the families.
    """
    name = _EXACT.get(engine) or _PREFIX.get(engine.split(":")[0])
    if name is None:
        plain = (f for e, f in _EXACT.items() if ":" not in e)
        families = ", ".join(dict.fromkeys([*_PREFIX, *plain]))
        raise UserError(f"unknown engine {engine!r}; engine families: {families}")
    return FAMILIES[name]


def family_kinds(engines: Sequence[str]) -> set[str]:
    """The report kinds (:attr:`EngineFamily.kind`) of ``engines``; unknown ids count as
    ``sim-gpu``."""
    kinds = set()
    for engine in engines:
        try:
            kinds.add(engine_family(engine).kind)
        except UserError:
            kinds.add("sim-gpu")
    return kinds


def run_dir(engines: Sequence[str]) -> str:
    """Default run directory of a bench of ``engines``: their family folder when they all share
    one (``results/hf`` for ``hf``/``sim:hf-cpu``, ``results/http`` for ``http``), else
    :data:`DEFAULT_OUT`.

    Raises:
        UserError: an unknown engine id.
    """
    dirs = {engine_family(e).out_dir for e in engines}
    if len(dirs) == 1 and None not in dirs:
        return str(next(iter(dirs)))
    return DEFAULT_OUT


def shaping_defaults(engines: Sequence[str]) -> dict[str, Any]:
    """Workload settings to use where the user set none: the first family shaping among
    ``engines`` (:data:`HF_WORKLOAD` when any engine is ``hf`` or ``sim:hf-cpu``: the two must
    see the same workload), else :data:`SIM_WORKLOAD` (the whole trace). Unknown ids count as
    shaping-free (they fail later, when the run checks its engines)."""
    for engine in engines:
        try:
            shaping = engine_family(engine).shaping
        except UserError:
            continue
        if shaping is not None:
            return dict(shaping)
    return dict(SIM_WORKLOAD)


def default_source(engines: Sequence[str]) -> tuple[str, str]:
    """``("trace", name)`` or ``("workload", spec)`` a bench of ``engines`` replays when the user
    names neither: the families' common default (``azure`` trace on the CPU engines), else the
    ``azure-mixed`` spec."""
    sources = set()
    for engine in engines:
        try:
            sources.add(engine_family(engine).default_source)
        except UserError:
            sources.add(("workload", "azure-mixed"))
    return next(iter(sources)) if len(sources) == 1 else ("workload", "azure-mixed")
