"""Turning a policy name into what runs: the one place that resolves a policy.

``native`` (an engine profile's own policy, with a fallback), the registered names a run
selects, ``--policy-opt`` strings, the clairvoyant ``oracle``'s true output lengths, the
prefix-cache placement plugin (``--kv-policy``) and the KV quantization planner
(``--kv-quant``) are resolved here and nowhere else; engine runners call
:func:`policy_manager`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pluggy

from superinfer.adapters.manager import (
    UnknownPolicyError,
    available_policies,
    build_plugin_manager,
    make_policy,
    policy_options,
)
from superinfer.harness.errors import UserError
from superinfer.harness.workload.workload import Workload
from superinfer.sim.profiles import PROFILES, get_profile

__all__ = [
    "FALLBACK_POLICY",
    "POLICY_FIELDS",
    "REQUEST_FIELDS",
    "fields_set",
    "ignored_field_warnings",
    "build_policy",
    "make_quant_planner",
    "merge_policy_opts",
    "native_policy",
    "policy_class",
    "policy_listing",
    "policy_manager",
    "registered_policies",
    "resolve_policy",
    "resolve_policy_opts",
    "select_policies",
]

#: What ``native`` runs as when the engine's own policy is not registered.
FALLBACK_POLICY = "fcfs"


#: The request fields a policy may read: ``priority`` (``SLO.priority``), ``slo`` (the TTFT and
#: TPOT targets) and ``deadline`` (``SLO.deadline_s``).
REQUEST_FIELDS = ("priority", "slo", "deadline")
#: The request fields each built-in policy's decisions depend on. Checked against behaviour:
#: ``superinfer conform``'s ``fields_honoured`` scenario runs a workload with and without each
#: field and ``tests/harness/conform/test_conform_sim.py`` asserts the fields it finds changing a
#: decision are exactly these (docs/conformance.md).
POLICY_FIELDS: Mapping[str, frozenset[str]] = {
    "fcfs": frozenset(),
    "lpm": frozenset(),
    "mlfq": frozenset(),
    "priority": frozenset({"priority"}),
    "edf": frozenset({"slo", "deadline"}),
    "oracle": frozenset({"slo", "deadline"}),
    # superinfer ranks by SLO class targets and slack; SLO.priority is not read
    "superinfer": frozenset({"slo", "deadline"}),
}


def fields_set(workload: Workload) -> set[str]:
    """The request fields ``workload`` carries information in: ``priority`` when its requests
    have more than one priority, ``slo`` / ``deadline`` when any request has a TTFT or TPOT
    target / a deadline."""
    slos = {s.slo for s in workload.requests}
    out = set()
    if len({s.priority for s in slos}) > 1:
        out.add("priority")
    if any(s.ttft_ms is not None or s.tpot_ms is not None for s in slos):
        out.add("slo")
    if any(s.deadline_s is not None for s in slos):
        out.add("deadline")
    return out


def ignored_field_warnings(policies: Sequence[str], engine: str, workload: Workload) -> list[str]:
    """One warning per built-in policy of ``policies`` (``native`` resolved on ``engine``) that
    ignores a field ``workload`` sets (:data:`POLICY_FIELDS`, :func:`fields_set`); policies
    without an entry (an engine's own, a label) give none."""
    given = fields_set(workload)
    out = []
    for name in policies:
        resolved = name
        if name == "native":
            try:
                resolved = resolve_policy(name, engine)[0]
            except UserError:
                continue
        known = POLICY_FIELDS.get(resolved)
        if known is None:
            continue
        ignored = sorted(given - known)
        if ignored:
            label = name if resolved == name else f"{name} ({resolved})"
            out.append(
                f"policy `{label}` on `{engine}` ignores the request field(s) "
                f"{', '.join(ignored)} that this workload sets: its decisions do not depend on "
                "them (docs/conformance.md, fields_honoured)"
            )
    return out


def registered_policies() -> list[str]:
    """Names of the registered scheduling policies (entry points ``superinfer.policies``),
    sorted."""
    return sorted(available_policies())


def native_policy(engine: str) -> str | None:
    """The registered name of ``engine``'s own scheduling policy, or ``None`` if unknown."""
    profile = PROFILES.get(engine)
    return profile.native_policy if profile is not None else None


def resolve_policy(name: str, engine: str) -> tuple[str, str | None]:
    """The registered policy ``name`` runs as on ``engine``, and a note when it is a fallback.

    ``native`` is the engine profile's ``native_policy``; if that is not registered, it runs
    :data:`FALLBACK_POLICY` and the note says so.

    Raises:
        UserError: unknown engine, or ``name`` is neither ``native`` nor registered.
    """
    registered = available_policies()
    if name == "native":
        try:
            native = get_profile(engine).native_policy
        except KeyError as exc:
            raise UserError(exc.args[0]) from None
        if native in registered:
            return native, None
        return FALLBACK_POLICY, (
            f"{engine}'s native policy {native!r} is not registered: ran {FALLBACK_POLICY!r}"
        )
    if name not in registered:
        raise UserError(f"unknown policy {name!r}; registered: {', '.join(sorted(registered))}")
    return name, None


def policy_class(name: str) -> type:
    """The class of registered policy ``name`` (the type of an instance registered as one).

    Raises:
        KeyError: ``name`` is not registered.
    """
    loaded = available_policies()[name].load()
    return loaded if isinstance(loaded, type) else type(loaded)


def select_policies(
    names: Sequence[str], *, engine_policies: Sequence[str] = (), default: Sequence[str] = ()
) -> list[str]:
    """The policies a run selects: ``names`` in order; if empty, ``default``, else every
    registered one (sorted).

    Args:
        names: the ``--policies`` names.
        engine_policies: names the engines run themselves (accepted though not registered).
        default: the engines' default selection.

    Raises:
        UserError: a name that is not registered; the message lists the registered ones.
    """
    registered = available_policies()
    if not names:
        return list(default) if default else sorted(registered)
    unknown = [n for n in names if n not in registered and n not in engine_policies]
    if unknown:
        known = ", ".join(sorted(registered))
        raise UserError(f"unknown policy {unknown[0]!r}; registered: {known}")
    return list(names)


def resolve_policy_opts(policies: Sequence[str], opts: Sequence[str]) -> dict[str, dict[str, str]]:
    """Per-policy options from ``--policy-opt`` strings.

    ``key=value`` sets the option on every policy in ``policies`` that has it; ``policy.key=value``
    sets it on that policy only. Later strings win.

    Raises:
        UserError: a string without ``=``, a policy that is not selected, or an option that no
            selected policy (or not the named one) has; the message lists the options.
    """
    known = {name: policy_options(policy_class(name)) for name in policies}
    out: dict[str, dict[str, str]] = {name: {} for name in policies}
    for opt in opts:
        key, sep, value = opt.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(f"--policy-opt {opt!r}: expected key=value or policy.key=value")
        target, dot, option = key.rpartition(".")
        if dot:
            if target not in known:
                raise UserError(
                    f"--policy-opt {opt!r}: policy {target!r} is not among the selected "
                    f"({', '.join(policies)})"
                )
            if option not in known[target]:
                names = ", ".join(sorted(known[target])) or "none"
                raise UserError(
                    f"--policy-opt {opt!r}: policy {target!r} has no option {option!r} "
                    f"(options: {names})"
                )
            out[target][option] = value
            continue
        having = [name for name in policies if option in known[name]]
        if not having:
            raise UserError(
                f"--policy-opt {opt!r}: no selected policy has option {option!r} "
                "(see `superinfer policies --options`)"
            )
        for name in having:
            out[name][option] = value
    return out


def merge_policy_opts(
    options: Mapping[str, Mapping[str, str]], policies: Sequence[str], opts: Sequence[str]
) -> dict[str, dict[str, str]]:
    """Per policy of ``policies``: its ``options`` (policy -> key -> value, e.g. a spec's or
    ``BenchConfig.policy_options``) with the ``--policy-opt`` strings ``opts`` laid over them
    (:func:`resolve_policy_opts`). Only ``policies`` are in the result.

    Raises:
        UserError: as :func:`resolve_policy_opts`.
    """
    resolved = resolve_policy_opts(policies, opts)
    return {name: {**options.get(name, {}), **resolved[name]} for name in policies}


def build_policy(name: str, options: Mapping[str, str], workload: Workload) -> str | object:
    """What to hand ``build_plugin_manager`` for policy ``name``: the name itself, or, for a
    policy that declares ``needs_output_lengths`` (the clairvoyant ``oracle``), an instance built
    with ``output_tokens`` = every request's true output length from ``workload``.

    Raises:
        UnknownPolicyError: a bad option.
    """
    entry = available_policies().get(name)
    cls = entry.load() if entry is not None else None
    if isinstance(cls, type) and getattr(cls, "needs_output_lengths", False):
        lengths = {s.request_id: s.output_tokens for s in workload.requests}
        built: object = make_policy(cls, options, name, extra={"output_tokens": lengths})
        return built
    return name


def make_quant_planner(options: Mapping[str, str]) -> Any:
    """The KV quantization planner with ``--kv-quant-opt`` options (``QuantPlanner`` fields:
    ``floors``, ``default_floor``, ``int8_pressure``, ``int4_pressure``, ``hysteresis``,
    ``count_waiting``), converted to each field's type.

    Raises:
        UserError: an unknown option, a value of the wrong type, or values the planner refuses.
    """
    from superinfer.policy_core.quant_planner import QuantPlanner

    try:
        return make_policy(QuantPlanner, dict(options), "quant")
    except (UnknownPolicyError, ValueError) as exc:
        raise UserError(f"--kv-quant-opt: {exc}") from None


def policy_manager(
    name: str,
    options: Mapping[str, str] | None = None,
    *,
    workload: Workload | None = None,
    kv_policy: str | None = None,
    quant_options: Mapping[str, str] | None = None,
    plugins: Sequence[object] = (),
) -> pluggy.PluginManager:
    """The plugin manager a cell runs ``name`` under: the policy built once, with its plugins.

    Args:
        name: a registered policy name.
        options: its constructor options (``key -> value`` strings).
        workload: the cell's requests; given, a policy that declares ``needs_output_lengths``
            gets their true output lengths (:func:`build_policy`).
        kv_policy: prefix-cache placement policy name (``superinfer.kv_policies``), or ``None``.
        quant_options: ``--kv-quant-opt`` options; given (even empty), the KV quantization
            planner is registered (:func:`make_quant_planner`).
        plugins: extra plugins registered beside the policy (observers).

    Returns:
        The manager, ``check_pending()`` passed.

    Raises:
        UnknownPolicyError: an unknown policy or a bad option.
        UserError: a bad ``--kv-quant-opt``.
    """
    opts = dict(options or {})
    built = build_policy(name, opts, workload) if workload is not None else name
    pm = build_plugin_manager(built, None if built is not name else opts, kv_policy=kv_policy)
    if quant_options is not None:
        from superinfer.adapters.kv_precision import register_quant_planner

        register_quant_planner(pm, make_quant_planner(quant_options))
    for plugin in plugins:
        pm.register(plugin)
    pm.check_pending()
    return pm


def policy_listing(*, show_options: bool = False) -> list[str]:
    """Lines of ``superinfer policies``: each registered policy and its entry point, with
    ``show_options`` its ``--policy-opt`` options (default and help) below it."""
    lines = []
    for name, ep in sorted(available_policies().items()):
        lines.append(f"{name:12s} {ep.value}")
        if not show_options:
            continue
        loaded = ep.load()
        cls = loaded if isinstance(loaded, type) else type(loaded)
        for key, (default, text) in policy_options(cls).items():
            if key == "output_tokens":
                continue  # set by the harness from the workload, not an option
            lines.append(f"    {key} = {default!r}: {text}")
    return lines
