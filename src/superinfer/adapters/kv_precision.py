"""The quantization planner as a pluggy plugin: implements ``superinfer_kv_precision``.

``policy_core`` cannot import pluggy, so the hook implementation lives here. Register it beside
a scheduling policy::

    pm = build_plugin_manager("priority")
    register_quant_planner(pm)              # default floors: chat >= int8, others >= int4
"""

from __future__ import annotations

import pluggy

from superinfer.adapters.hookspecs import hookimpl
from superinfer.policy_core.quant_planner import QuantPlanner
from superinfer.policy_core.types import KVPrecision, RequestView, StepState

__all__ = ["QuantPlannerPlugin", "register_quant_planner"]


class QuantPlannerPlugin:
    """Answers ``superinfer_kv_precision`` with a :class:`QuantPlanner`'s choice."""

    def __init__(self, planner: QuantPlanner | None = None) -> None:
        self.planner = planner if planner is not None else QuantPlanner()

    @hookimpl
    def superinfer_kv_precision(self, request: RequestView, state: StepState) -> KVPrecision:
        return self.planner.plan(request, state)


def register_quant_planner(
    pm: pluggy.PluginManager, planner: QuantPlanner | None = None
) -> QuantPlannerPlugin:
    """Register a :class:`QuantPlannerPlugin` on ``pm`` (name ``kv-precision:<planner name>``).

    Returns:
        The registered plugin (its ``planner`` shows the current pressure level).

    Raises:
        ValueError: a plugin of that name is already registered (pluggy's error).
    """
    plugin = QuantPlannerPlugin(planner)
    pm.register(plugin, name=f"kv-precision:{plugin.planner.name}")
    pm.check_pending()
    return plugin
