"""Mode B installation: wrap the scheduler of every ``PyExecutor`` TensorRT-LLM 1.2 builds.

1.2 has no scheduler hook: ``create_py_executor_instance`` hard-codes ``SimpleScheduler(
BindCapacityScheduler, BindMicroBatchScheduler)`` (engine notes §1.3, §1.5). :func:`install`
replaces ``create_py_executor_instance`` *in* ``py_executor_creator`` (which bound it by name with
``from ._util import ...``) by a wrapper that puts a :class:`SuperinferScheduler` around the new
executor's scheduler before its worker starts. ``create_py_executor`` calls it twice when it
estimates the KV cache size; each executor gets its own wrapper. :func:`install` and
:func:`uninstall` are idempotent.

The patch must run in the process that builds the executor: the caller's own process with
``TLLM_WORKER_USE_SINGLE_PROCESS=1`` (TP1), or every MPI-spawned worker through the ``.pth`` hook of
:mod:`superinfer.adapters.trtllm.bootstrap`.
"""

from __future__ import annotations

import functools
import importlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from superinfer.adapters.trtllm.engine import (
    CREATOR_MODULE,
    EngineModules,
    UnsupportedEngineError,
    load_engine,
)
from superinfer.adapters.trtllm.scheduler import NO_TOKEN_LIMIT, EngineLimits, SuperinferScheduler
from superinfer.adapters.trtllm.slo_table import InMemorySloTable, SloTable
from superinfer.policy_core.types import SLO

__all__ = ["DEFAULT_SLO", "install", "is_installed", "uninstall", "wrap_executor"]

#: Class of requests whose SLO nobody registered.
DEFAULT_SLO = SLO("default")

_WRAPPED = "__superinfer_original__"
#: Key of the lifecycle observer in ``ResourceManager.resource_managers``.
OBSERVER_NAME = "superinfer_observer"


@dataclass(frozen=True)
class _Settings:
    hook: Any
    slo_table: SloTable
    default_slo: SLO
    clock: Callable[[], float]
    record_admissions: bool


_settings: _Settings | None = None


def _capacity_policy_name(scheduler_config: Any) -> str:
    policy = getattr(scheduler_config, "capacity_scheduler_policy", None)
    if policy is None:
        return "GUARANTEED_NO_EVICT"  # the 1.2 default (SchedulerConfig, notes §1.2)
    return str(getattr(policy, "value", policy)).rsplit(".", 1)[-1]


def wrap_executor(
    executor: Any,
    *,
    engine: EngineModules,
    hook: Any,
    scheduler_config: Any = None,
    slo_table: SloTable | None = None,
    default_slo: SLO = DEFAULT_SLO,
    clock: Callable[[], float] = time.monotonic,
    record_admissions: bool = False,
) -> SuperinferScheduler:
    """Put a :class:`SuperinferScheduler` around ``executor.scheduler`` (once), and its
    :class:`~superinfer.adapters.trtllm.scheduler.LifecycleObserver` first in the executor's
    resource managers.

    Args:
        executor: a ``PyExecutor`` whose worker has not started.
        engine: from :func:`~superinfer.adapters.trtllm.engine.load_engine`.
        hook: the plugin manager's hook relay.
        scheduler_config: the ``SchedulerConfig`` the executor was built with (capacity policy).
        slo_table, default_slo, clock, record_admissions: see :class:`SuperinferScheduler`.

    Returns:
        The wrapper now in ``executor.scheduler`` (the existing one if already wrapped).

    Raises:
        UnsupportedEngineError: no V1 KV cache manager, or a scheduler without the 1.2
            ``SimpleScheduler`` layout.
    """
    current = executor.scheduler
    if isinstance(current, SuperinferScheduler):
        return current
    micro = getattr(current, "micro_batch_scheduler", None)
    if micro is None or not hasattr(current, "can_schedule"):
        raise UnsupportedEngineError(
            "expected 1.2's SimpleScheduler in PyExecutor.scheduler, "
            f"found {type(current).__name__}"
        )
    rm = engine.resource_manager
    kv = executor.resource_manager.get_resource_manager(rm.ResourceManagerType.KV_CACHE_MANAGER)
    if kv is None:
        raise UnsupportedEngineError("Mode B needs the executor's KV cache manager; it has none")
    if "V2" in type(kv).__name__ or hasattr(kv, "kv_cache_map"):
        raise UnsupportedEngineError(
            f"{type(kv).__name__} is KV cache manager V2 (1.3+); Mode B supports V1 only"
        )
    engine.scheduler.RequestScheduler.register(SuperinferScheduler)
    limits = EngineLimits(
        max_batch_size=int(micro.max_batch_size),
        max_num_tokens=int(micro.max_num_tokens or NO_TOKEN_LIMIT),
        tokens_per_block=int(kv.tokens_per_block),
        reserve_to_completion=_capacity_policy_name(scheduler_config) != "MAX_UTILIZATION",
    )
    wrapper = SuperinferScheduler(
        current,
        hook,
        engine=engine,
        kv_cache_manager=kv,
        limits=limits,
        slo_table=slo_table if slo_table is not None else InMemorySloTable(),
        default_slo=default_slo,
        clock=clock,
        record_admissions=record_admissions,
    )
    managers = executor.resource_manager.resource_managers
    managers[OBSERVER_NAME] = wrapper.observer()
    managers.move_to_end(OBSERVER_NAME, last=False)  # the KV cache manager stays last
    rm.BaseResourceManager.register(type(managers[OBSERVER_NAME]))
    executor.scheduler = wrapper
    return wrapper


def _make_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def create_py_executor_instance(*args: Any, **kwargs: Any) -> Any:
        executor = original(*args, **kwargs)
        settings = _settings
        if settings is not None:
            wrap_executor(
                executor,
                engine=load_engine(),
                hook=settings.hook,
                scheduler_config=kwargs.get("scheduler_config"),
                slo_table=settings.slo_table,
                default_slo=settings.default_slo,
                clock=settings.clock,
                record_admissions=settings.record_admissions,
            )
        return executor

    setattr(create_py_executor_instance, _WRAPPED, original)
    return create_py_executor_instance


def install(
    hook: Any,
    *,
    slo_table: SloTable | None = None,
    default_slo: SLO = DEFAULT_SLO,
    clock: Callable[[], float] = time.monotonic,
    record_admissions: bool = False,
) -> None:
    """Make every executor built from now on in this process schedule through the policy.

    Calling it again replaces the settings (one wrapper stays in place).

    Args:
        hook: the plugin manager's hook relay (``build_plugin_manager(...).hook``).
        slo_table: SLO classes by LLM API request id (an :class:`InMemorySloTable` if omitted).
        default_slo: the class of requests the table does not know.
        clock: monotonic seconds, shared with the table's arrival instants.
        record_admissions: keep per-step admissions on each wrapper (tests).

    Raises:
        ImportError: ``tensorrt_llm`` cannot be imported.
        UnsupportedEngineError: not a 1.2.x release.
    """
    global _settings
    load_engine()
    creator = importlib.import_module(CREATOR_MODULE)
    _settings = _Settings(
        hook,
        slo_table if slo_table is not None else InMemorySloTable(),
        default_slo,
        clock,
        record_admissions,
    )
    current = creator.create_py_executor_instance
    if not hasattr(current, _WRAPPED):
        setattr(creator, "create_py_executor_instance", _make_wrapper(current))  # noqa: B010


def uninstall() -> None:
    """Restore the original ``create_py_executor_instance``; executors already built keep their
    wrapper. A no-op when not installed or ``tensorrt_llm`` was never imported."""
    global _settings
    _settings = None
    creator = sys.modules.get(CREATOR_MODULE)
    if creator is None:
        return
    original = getattr(creator.create_py_executor_instance, _WRAPPED, None)
    if original is not None:
        setattr(creator, "create_py_executor_instance", original)  # noqa: B010


def is_installed() -> bool:
    """Whether executors built now get the wrapper."""
    creator = sys.modules.get(CREATOR_MODULE)
    return (
        _settings is not None
        and creator is not None
        and hasattr(creator.create_py_executor_instance, _WRAPPED)
    )
