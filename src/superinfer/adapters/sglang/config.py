"""The SGLang adapter's configuration: policy, SLO classes, logical clock, pin cap.

It reaches SGLang's scheduler processes through the environment (they are ``spawn`` children, and
``ServerArgs`` arrive pickled without new fields; ``../shared/engines/sglang-0.5.md`` section 4):
``SUPERINFER_CONFIG`` names a JSON file, ``SUPERINFER_POLICY`` and ``SUPERINFER_POLICY_OPTS``
(``key=value,key=value``) override its policy, ``SUPERINFER_KV_POLICY`` its prefix-cache placement
policy (``superinfer.kv_policies``). Every mistake is a :class:`ConfigError` whose one
line names the file and the field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from superinfer.policy_core.types import SLO

#: ``clock.mode`` values (:func:`superinfer.adapters.sglang.view.make_clock`).
CLOCK_MODES = ("auto", "wall", "logical")

__all__ = [
    "CLOCK_MODES",
    "DEFAULT_SLO_CLASSES",
    "ENV_CONFIG",
    "ENV_KV_POLICY",
    "ENV_POLICY",
    "ENV_POLICY_OPTS",
    "ENV_SWITCH",
    "AdapterConfig",
    "ConfigError",
    "load_config",
]

ENV_SWITCH = "SUPERINFER_SGLANG"
ENV_CONFIG = "SUPERINFER_CONFIG"
ENV_POLICY = "SUPERINFER_POLICY"
ENV_POLICY_OPTS = "SUPERINFER_POLICY_OPTS"
ENV_KV_POLICY = "SUPERINFER_KV_POLICY"

#: The benchmark's classes (``harness/workload/workload.py``): chat must meet TTFT <= 1 s and
#: TPOT <= 100 ms, batch must finish within 600 s.
DEFAULT_SLO_CLASSES: Mapping[str, SLO] = {
    "chat": SLO("chat", ttft_ms=1000.0, tpot_ms=100.0, priority=0),
    "batch": SLO("batch", deadline_s=600.0, priority=1),
}

#: Nominal logical-clock rates. Decisions must be identical on every tensor-parallel rank, so there
#: the adapter never reads a wall clock: time advances per executed batch by ``step_s`` plus
#: ``token_s`` per token it ran (SGLang's own HRRN ages by tokens for the same reason,
#: ``srt/managers/schedule_policy.py::_sort_by_hrrn``). These defaults are placeholders of the right
#: order (a decode step of tens of ms, prefill near 10k tokens/s); set them from the server's
#: measured step time (SGLang logs ``gen throughput`` per decode step) before trusting deadlines.
#: A scheduler that decides alone (TP = PP = 1) uses its wall clock instead (``clock.mode``
#: ``auto``, the default; :func:`.view.make_clock`).
DEFAULT_STEP_S = 0.02
DEFAULT_TOKEN_S = 1e-4

#: Share of the KV pool the placement plugin may pin (DESIGN section 6: pinned bytes are capped so
#: active requests never starve).
DEFAULT_PIN_BUDGET_FRACTION = 0.25


class ConfigError(ValueError):
    """The adapter's configuration is unusable; the message is one line naming the field."""


@dataclass(frozen=True, slots=True)
class AdapterConfig:
    """What the adapter needs besides SGLang's own arguments.

    Attributes:
        policy: registered policy name (entry-point group ``superinfer.policies``).
        policy_options: constructor options of that policy (``key -> value``).
        slo_classes: SLO class by name.
        default_class: class of a request that names none.
        priority_classes: SGLang ``priority`` value -> class name, for clients that can only send a
            priority (the OpenAI endpoints, or the ``x-override-priority`` header with
            ``SGLANG_ENABLE_REQUEST_HEADER_OVERRIDES=1``).
        step_s: logical seconds per executed batch.
        token_s: logical seconds per token a batch runs.
        clock_mode: ``auto`` (the scheduler's wall clock when it decides alone: TP = PP = 1 and
            no DP attention; else the logical clock), ``wall`` or ``logical``.
        pin_budget_fraction: most of the KV pool pins may hold, in (0, 1].
        source: where this came from, for error messages.
        kv_policy: prefix-cache placement policy (``superinfer.kv_policies``: ``lru``, ``lfu``,
            ``reuse``), or ``None`` for SGLang's own eviction order.
    """

    policy: str = "fcfs"
    policy_options: Mapping[str, Any] = field(default_factory=dict)
    slo_classes: Mapping[str, SLO] = field(default_factory=lambda: dict(DEFAULT_SLO_CLASSES))
    default_class: str = "batch"
    priority_classes: Mapping[int, str] = field(default_factory=dict)
    step_s: float = DEFAULT_STEP_S
    token_s: float = DEFAULT_TOKEN_S
    clock_mode: str = "auto"
    pin_budget_fraction: float = DEFAULT_PIN_BUDGET_FRACTION
    source: str = "defaults"
    kv_policy: str | None = None

    def __post_init__(self) -> None:
        where = self.source
        if self.default_class not in self.slo_classes:
            raise ConfigError(
                f"{where}: default_class {self.default_class!r} is not in slo_classes"
            )
        for prio, name in self.priority_classes.items():
            if name not in self.slo_classes:
                raise ConfigError(
                    f"{where}: priority_classes[{prio}] = {name!r} is not in slo_classes"
                )
        if not self.step_s > 0 or self.token_s < 0:
            raise ConfigError(f"{where}: clock needs step_s > 0 and token_s >= 0")
        if self.clock_mode not in CLOCK_MODES:
            raise ConfigError(
                f"{where}: clock.mode {self.clock_mode!r}: use one of {', '.join(CLOCK_MODES)}"
            )
        if not 0 < self.pin_budget_fraction <= 1:
            raise ConfigError(f"{where}: pin_budget_fraction must be in (0, 1]")


def _slo(name: str, raw: Any, where: str) -> SLO:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: slo_classes.{name} must be an object")
    known = {"ttft_ms", "tpot_ms", "deadline_s", "weight", "priority"}
    if extra := sorted(set(raw) - known):
        raise ConfigError(f"{where}: slo_classes.{name} has unknown field {extra[0]!r}")
    try:
        return SLO(name, **raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: slo_classes.{name}: {exc}") from None


def _parse_opts(text: str) -> dict[str, str]:
    opts: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{ENV_POLICY_OPTS}: {item!r} is not key=value")
        opts[key.strip()] = value.strip()
    return opts


def _from_mapping(raw: Mapping[str, Any], where: str) -> AdapterConfig:
    known = {
        "policy",
        "policy_options",
        "slo_classes",
        "default_class",
        "priority_classes",
        "clock",
        "pin_budget_fraction",
        "kv_policy",
    }
    if extra := sorted(set(raw) - known):
        raise ConfigError(
            f"{where}: unknown field {extra[0]!r} (fields: {', '.join(sorted(known))})"
        )
    kwargs: dict[str, Any] = {"source": where}
    if "policy" in raw:
        kwargs["policy"] = str(raw["policy"])
    if "policy_options" in raw:
        if not isinstance(raw["policy_options"], dict):
            raise ConfigError(f"{where}: policy_options must be an object")
        kwargs["policy_options"] = dict(raw["policy_options"])
    if "slo_classes" in raw:
        classes = raw["slo_classes"]
        if not isinstance(classes, dict) or not classes:
            raise ConfigError(f"{where}: slo_classes must be a non-empty object")
        kwargs["slo_classes"] = {n: _slo(n, spec, where) for n, spec in classes.items()}
    if "default_class" in raw:
        kwargs["default_class"] = str(raw["default_class"])
    if "priority_classes" in raw:
        table = raw["priority_classes"]
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: priority_classes must be an object of priority -> class")
        try:
            kwargs["priority_classes"] = {int(k): str(v) for k, v in table.items()}
        except ValueError:
            raise ConfigError(f"{where}: priority_classes keys must be integers") from None
    if "clock" in raw:
        clock = raw["clock"]
        if not isinstance(clock, dict) or sorted(set(clock) - {"step_s", "token_s", "mode"}):
            raise ConfigError(f"{where}: clock must be an object with mode, step_s, token_s")
        for key in ("step_s", "token_s"):
            if key in clock:
                kwargs[key] = _number(clock[key], f"clock.{key}", where)
        if "mode" in clock:
            kwargs["clock_mode"] = str(clock["mode"])
    if raw.get("kv_policy") is not None:
        kwargs["kv_policy"] = str(raw["kv_policy"])
    if "pin_budget_fraction" in raw:
        kwargs["pin_budget_fraction"] = _number(
            raw["pin_budget_fraction"], "pin_budget_fraction", where
        )
    return AdapterConfig(**kwargs)


def _number(value: Any, name: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: {name} must be a number, got {value!r}")
    return float(value)


def load_config(environ: Mapping[str, str] | None = None) -> AdapterConfig:
    """Read the configuration from ``SUPERINFER_CONFIG`` and the policy overrides.

    Args:
        environ: the environment to read; ``os.environ`` by default.

    Returns:
        The configuration; the defaults (policy ``fcfs``, classes chat and batch) where unset.

    Raises:
        ConfigError: an unreadable file, malformed JSON (with its line), an unknown or ill-typed
            field.
    """
    env = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
    where = "defaults"
    if path := env.get(ENV_CONFIG):
        where = path
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"{ENV_CONFIG}={path}: cannot read ({exc.strerror})") from None
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a JSON object")
        raw = loaded
    if (policy := env.get(ENV_POLICY)) and policy != raw.get("policy"):
        raw = {**raw, "policy": policy, "policy_options": {}}  # the file's options were not for it
    if kv_policy := env.get(ENV_KV_POLICY):
        raw = {**raw, "kv_policy": kv_policy}
    if opts := env.get(ENV_POLICY_OPTS):
        raw = {**raw, "policy_options": {**raw.get("policy_options", {}), **_parse_opts(opts)}}
    return _from_mapping(raw, where)
