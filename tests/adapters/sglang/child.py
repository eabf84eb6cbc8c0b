"""What a spawned SGLang process does first (``load_plugins()``), then a probe of the result.

Run as the target of a ``spawn`` child by ``test_plugin.py``: a fresh interpreter, like SGLang's
scheduler processes, that finds our plugin only through its installed entry point.
"""

from __future__ import annotations

from typing import Any


def probe(out: Any) -> None:
    """Load the plugins, then report what is patched and how a real queue gets ordered."""
    from sglang.srt.plugins import load_plugins

    load_plugins()

    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.schedule_policy import PrefillAdder, SchedulePolicy

    from superinfer.adapters.sglang.plugin import current_adapter
    from tests.adapters.sglang.worlds import World, make_req

    result: dict[str, Any] = {
        "wrapped": hasattr(SchedulePolicy.calc_priority, "__wrapped__"),
        "preempt_wrapped": hasattr(PrefillAdder.preempt_to_schedule, "__wrapped__"),
        "retraction_static": isinstance(
            ScheduleBatch.__dict__["_get_decode_retraction_order"], staticmethod
        ),
        "policy": None,
    }
    adapter = current_adapter()
    if adapter is not None:
        result["policy"] = adapter.config.policy
        world = World(64, "superinfer", "python")
        result["strategy"] = type(world.cache.tree_core.eviction_strategy).__name__
    world = World(64, "priority", "python")
    queue = [make_req("first", priority=1), make_req("second", first=50, priority=5)]
    SchedulePolicy("fcfs", world.cache, False, True, False).calc_priority(queue)
    result["order"] = [r.rid for r in queue]
    out.put(result)
