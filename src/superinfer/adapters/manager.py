"""The plugin manager: finds policies by name and wires one into the ``superinfer_*`` hooks.

Policies come from the entry-point group ``superinfer.policies`` (built-ins are declared there in
our own ``pyproject.toml``, exactly like a third party's). An entry point names either a pure
policy class (anything with ``schedule(state)``; it is wrapped in :class:`PolicyPlugin`) or a
ready pluggy plugin with ``superinfer_*`` hook implementations.

Prefix-cache placement policies (``superinfer_kv_placement``) come from the group
``superinfer.kv_policies`` (built-ins: ``lru``, ``lfu``, ``reuse``) and are enabled with
``build_plugin_manager(..., kv_policy=NAME)``; without one, the engine's own eviction runs.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, get_type_hints

import pluggy

from superinfer.adapters import hookspecs
from superinfer.adapters.hookspecs import PROJECT_NAME, hookimpl
from superinfer.policy_core.protocols import SchedulerPolicy
from superinfer.policy_core.types import RequestView, ScheduleDecision, StepState, StepStats

__all__ = [
    "ENTRY_POINT_GROUP",
    "KV_ENTRY_POINT_GROUP",
    "PolicyPlugin",
    "UnknownPolicyError",
    "available_kv_policies",
    "available_policies",
    "build_plugin_manager",
    "make_policy",
    "policy_options",
]

ENTRY_POINT_GROUP = "superinfer.policies"
KV_ENTRY_POINT_GROUP = "superinfer.kv_policies"


class UnknownPolicyError(ValueError):
    """No policy of that name is registered, or its options are wrong."""


class PolicyPlugin:
    """Adapts a pure :class:`SchedulerPolicy` to the hooks."""

    def __init__(self, policy: SchedulerPolicy) -> None:
        self.policy = policy

    @hookimpl
    def superinfer_schedule(self, state: StepState) -> ScheduleDecision:
        return self.policy.schedule(state)

    @hookimpl
    def superinfer_request_arrived(self, request: RequestView, now_s: float) -> None:
        self.policy.on_request_arrived(request, now_s)

    @hookimpl
    def superinfer_request_finished(self, request: RequestView, now_s: float) -> None:
        self.policy.on_request_finished(request, now_s)

    @hookimpl
    def superinfer_request_aborted(self, request: RequestView, now_s: float, reason: str) -> None:
        # Optional on a policy (BasePolicy has it): a policy that keeps its own queues must hear
        # of requests the engine ends without finishing them.
        aborted = getattr(self.policy, "on_request_aborted", None)
        if aborted is not None:
            aborted(request, now_s, reason)

    @hookimpl
    def superinfer_step_finished(self, stats: StepStats) -> None:
        self.policy.on_step_finished(stats)


def available_policies() -> dict[str, EntryPoint]:
    """Registered policies by name (entry-point group ``superinfer.policies``)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_kv_policies() -> dict[str, EntryPoint]:
    """Registered prefix-cache placement policies by name (group ``superinfer.kv_policies``)."""
    return {ep.name: ep for ep in entry_points(group=KV_ENTRY_POINT_GROUP)}


def _convert(raw: Any, hint: Any, key: str, policy: str) -> Any:
    if not isinstance(raw, str):
        return raw
    if isinstance(hint, types.UnionType) or hint in (str, Any):
        return raw
    try:
        if hint is bool:
            if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1", "yes")
        return hint(raw)
    except (TypeError, ValueError):
        name = getattr(hint, "__name__", str(hint))
        raise UnknownPolicyError(
            f"policy {policy!r}: option {key}={raw!r} is not of type {name}"
        ) from None


def policy_options(cls: type) -> dict[str, tuple[Any, str]]:
    """The options of policy class ``cls``: name -> (default, help text).

    The options of a dataclass policy are its init fields except ``name``; the help text is the
    field's ``metadata["help"]`` (empty when missing). A non-dataclass policy has none.
    """
    if not dataclasses.is_dataclass(cls):
        return {}
    out: dict[str, tuple[Any, str]] = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.name == "name":
            continue
        default: Any = f.default
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        out[f.name] = (default, str(f.metadata.get("help", "")))
    return out


def make_policy(
    cls: type, options: Mapping[str, Any], name: str, extra: Mapping[str, Any] | None = None
) -> Any:
    """Instantiate policy class ``cls`` with ``options``, converting ``key=value`` strings.

    Options of a dataclass policy are converted to each field's annotated type. ``extra`` are
    constructor arguments passed as they are (objects no command line can spell, such as the
    ``oracle``'s true output lengths).

    Raises:
        UnknownPolicyError: an option the policy does not have, a value of the wrong type, or
            a value (or a default) the policy's validation refuses.
    """
    extra = dict(extra or {})
    if not options or not dataclasses.is_dataclass(cls):
        try:
            return cls(**options, **extra)
        except ValueError as exc:
            raise UnknownPolicyError(f"policy {name!r}: {exc}") from None
    hints = get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls) if f.init and f.name != "name"}
    kwargs = {}
    for key, raw in options.items():
        if key not in fields:
            known = ", ".join(sorted(fields)) or "none"
            raise UnknownPolicyError(f"policy {name!r} has no option {key!r} (options: {known})")
        kwargs[key] = _convert(raw, hints.get(key, str), key, name)
    try:
        return cls(**kwargs, **extra)
    except ValueError as exc:
        raise UnknownPolicyError(str(exc)) from None


def build_plugin_manager(
    policy: str | object,
    options: Mapping[str, Any] | None = None,
    *,
    kv_policy: str | object | None = None,
    kv_options: Mapping[str, Any] | None = None,
) -> pluggy.PluginManager:
    """A plugin manager with our hookspecs, one scheduling policy and, optionally, one prefix-cache
    placement policy registered.

    Args:
        policy: a registered policy name, a policy object, or a ready plugin.
        options: constructor options for a policy given by name (``key -> value``).
        kv_policy: a name registered in ``superinfer.kv_policies`` (``lru``, ``lfu``, ``reuse``)
            or a plugin implementing ``superinfer_kv_placement``; ``None``: the engine's own
            eviction.
        kv_options: constructor options for a ``kv_policy`` given by name.

    Returns:
        The manager; ``check_pending()`` has passed, so a misspelt hook has already failed.

    Raises:
        UnknownPolicyError: no policy of that name; the message lists the registered ones.
        pluggy.PluginValidationError: a plugin implements a hook that does not exist.
    """
    pm = pluggy.PluginManager(PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    name = policy if isinstance(policy, str) else getattr(policy, "name", type(policy).__name__)
    policy = _load(policy, options, available_policies(), "policy")
    has_hooks = any(attr.startswith("superinfer_") for attr in dir(policy))
    plugin = policy if has_hooks else PolicyPlugin(policy)  # type: ignore[arg-type]
    pm.register(plugin, name=f"policy:{name}")
    if kv_policy is not None:
        kv_name = (
            kv_policy
            if isinstance(kv_policy, str)
            else getattr(kv_policy, "name", type(kv_policy).__name__)
        )
        pm.register(
            _load(kv_policy, kv_options, available_kv_policies(), "kv policy"),
            name=f"kv_policy:{kv_name}",
        )
    elif kv_options:
        raise UnknownPolicyError("kv options need a kv policy")
    pm.check_pending()
    return pm


def _load(
    policy: str | object,
    options: Mapping[str, Any] | None,
    registry: Mapping[str, EntryPoint],
    kind: str,
) -> Any:
    if not isinstance(policy, str):
        if options:
            raise UnknownPolicyError(f"options apply only to a {kind} given by name")
        return policy
    if policy not in registry:
        known = ", ".join(sorted(registry)) or "none (is superinfer installed?)"
        raise UnknownPolicyError(f"unknown {kind} {policy!r}; registered: {known}")
    loaded = registry[policy].load()
    return make_policy(loaded, options or {}, policy) if isinstance(loaded, type) else loaded
