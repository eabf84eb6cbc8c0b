"""Every ``superinfer_*`` hook, grouped by engine lifecycle.

Engines (the simulator and the adapters) are the callers; policies are the plugins. Calls are
keyword-only, as pluggy enforces. An implementation may accept a subset of a hook's arguments,
which is what lets a hook gain arguments later without breaking plugins.
"""

from __future__ import annotations

from typing import Any

import pluggy

from superinfer.policy_core.types import (
    KVPrecision,
    PlacementDecision,
    PrefixNodeView,
    RequestView,
    ScheduleDecision,
    StepState,
    StepStats,
)

PROJECT_NAME = "superinfer"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

__all__ = ["PROJECT_NAME", "hookimpl", "hookspec", "policy_counters", "wants_prompt_keys"]


def wants_prompt_keys(hook: Any) -> bool:
    """Whether a plugin of ``hook`` (a pluggy hook relay) that sees new requests reads their
    :attr:`RequestView.prompt_chunk_keys` (its class sets ``reads_prompt_keys``: ``adaptive``,
    ``hazard``), so an engine hashes prompts only for such a plugin. Engines ask once, when they are
    built with the plugins (the simulator, SGLang's adapter)."""
    impls = hook.superinfer_request_arrived.get_hookimpls()
    return any(getattr(impl.plugin, "reads_prompt_keys", False) for impl in impls)


def policy_counters(hook: Any) -> dict[str, int]:
    """The scheduling policy's own counters: ``stats()`` of the plugin of ``hook`` (a pluggy hook
    relay) that implements ``superinfer_schedule``, or of the policy it wraps (its ``policy``
    attribute); ``{}`` when no such plugin has one. ``superinfer`` and ``oracle`` count what
    they decided (names: ``policy_core.policies.superinfer.records._COUNTER_NAMES``, e.g.
    ``ttft_boosts``, ``rejected``). The simulator writes them into each cell's
    ``policy_stats``, SGLang's adapter into its stats file."""
    counters: dict[str, int] = {}
    for impl in hook.superinfer_schedule.get_hookimpls():
        stats = getattr(getattr(impl.plugin, "policy", impl.plugin), "stats", None)
        if callable(stats):
            counters = dict(stats())
    return counters


# -------------------------------------------------------------------------------------------------
# Request lifecycle hooks
# -------------------------------------------------------------------------------------------------


@hookspec
def superinfer_request_arrived(request: RequestView, now_s: float) -> None:
    """A request entered the engine's waiting queue.

    Called by the engine once per request, before the first scheduling point that can see it.

    Args:
        request: the request as it arrived (no KV, nothing generated).
        now_s: arrival instant on the engine clock, in s.
    """


@hookspec
def superinfer_request_finished(request: RequestView, now_s: float) -> None:
    """A request produced its last output token and released its KV.

    Called by the engine once per finished request, after the step that finished it. Finished
    requests are the only source of output-length labels a learning policy may use.

    Args:
        request: its final view (``generated_tokens`` is the true output length).
        now_s: instant the last token was produced, in s.
    """


@hookspec
def superinfer_request_aborted(request: RequestView, now_s: float, reason: str) -> None:
    """A request ended without finishing: rejected by a policy or the engine, or failed.

    Args:
        request: its last view.
        now_s: instant it ended, in s.
        reason: short machine-readable reason, e.g. ``"prompt_exceeds_kv_capacity"``.
    """


# -------------------------------------------------------------------------------------------------
# Scheduling hooks
# -------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def superinfer_schedule(state: StepState) -> ScheduleDecision | None:
    """Decide the next step of one engine replica.

    Called by the engine at every scheduling point (before each step it does not repeat).
    Stops at the first non-None result.

    Args:
        state: the replica's queues, free KV blocks and step limits.

    Returns:
        The decision for this step; the engine validates it and raises ``PolicyError`` on a
        decision that names unknown requests or exceeds the budget or the free KV blocks.
    """


@hookspec(firstresult=True)
def superinfer_kv_precision(request: RequestView, state: StepState) -> KVPrecision | None:
    """Choose the KV storage precision of a request about to be admitted.

    Called by engines that can store KV per request at different precisions, once per
    admission. Stops at the first non-None result; ``None`` from every plugin means the engine's
    own KV dtype.

    Args:
        request: the request being admitted.
        state: the replica state at that scheduling point.
    """


# -------------------------------------------------------------------------------------------------
# KV memory hooks
# -------------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def superinfer_kv_placement(
    nodes: tuple[PrefixNodeView, ...],
    now_s: float,
    free_hbm_blocks: int,
    free_cpu_blocks: int,
    needed_hbm_blocks: int,
    total_hbm_blocks: int,
) -> PlacementDecision | None:
    """Decide pin / keep / offload / drop for cached prefix nodes, and what to prefetch.

    Called by engines with a prefix cache (a) when an allocation needs ``needed_hbm_blocks``
    more HBM blocks than are free, before the engine evicts anything, and (b) optionally after
    a step that changed the cache, with ``needed_hbm_blocks=0`` (pins and prefetches). Stops at
    the first non-None result; ``None`` from every plugin leaves the engine's own eviction order
    (LRU) in charge. The engine checks the decision with
    ``policy_core.validation.check_placement`` and applies it in this order: drop, offload,
    prefetch, then replaces its pin set; if the decision frees less than needed, the engine's
    own eviction frees the rest among unpinned nodes (and then it preempts).

    Args:
        nodes: every cached prefix node, in HBM and in CPU memory (ancestors of a listed node
            are listed; ``in_use`` marks those running requests reference).
        now_s: current instant, in s.
        free_hbm_blocks: free KV blocks in HBM.
        free_cpu_blocks: free KV blocks in CPU memory (0 without a CPU tier).
        needed_hbm_blocks: HBM blocks the engine must free now beyond ``free_hbm_blocks``
            (0 when it calls only to let the policy pin and prefetch).
        total_hbm_blocks: KV blocks in HBM (caps what a policy may pin).
    """


# -------------------------------------------------------------------------------------------------
# Step hooks
# -------------------------------------------------------------------------------------------------


@hookspec
def superinfer_step_finished(stats: StepStats) -> None:
    """A step (or a run of repeated steps) ended.

    Called by the engine after every executed step, with what it ran and the KV in use, for
    policies that learn online and for metrics plugins. Not firstresult: every plugin sees it.

    Args:
        stats: what the step did.
    """
