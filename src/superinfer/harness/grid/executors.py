"""Run many cells: in local processes or as Ray tasks, through the cell cache, with progress.

Both executors run the same function (:func:`superinfer.harness.grid.cells.run_cell`) on the same
specs, so they give the same outcomes; only the wall time differs. The driver alone reads and
writes the cache, as each cell comes back, so an interrupted run keeps every finished cell.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from types import TracebackType
from typing import Any

from superinfer.harness.errors import UserError
from superinfer.harness.grid.cells import CellCache, CellSpec, cell_key, run_cell

__all__ = ["EXECUTORS", "CellRunner"]

#: ``--executor`` choices.
EXECUTORS = ("local", "ray")

#: Called after each cell: ``(cells done, cells in this batch, outcome came from the cache)``.
ProgressFn = Callable[[int, int, bool], None]

# Ray binds a local instance to the host's outward address unless it believes it is on a
# single-node platform; this variable (read when ray is imported) keeps it on 127.0.0.1.
_RAY_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class CellRunner:
    """Runs batches of cells and caches their outcomes. Use as a context manager.

    Args:
        executor: ``"local"`` (a process pool; ``workers == 1`` runs in this process) or
            ``"ray"`` (one Ray task per cell, one CPU each).
        workers: local processes, or the CPUs of a local Ray instance; default: all CPUs.
        address: Ray cluster to connect to (``ray.init(address=...)``, e.g. ``auto`` or
            ``ray://host:10001``); ``None`` starts a local instance on 127.0.0.1, unless Ray
            is already initialised in this process, in which case that instance is used.
        cache: where outcomes are kept (``CellCache(None)`` keeps none).

    Raises:
        UserError: unknown executor, ``--address`` without Ray, or Ray not installed.
    """

    def __init__(
        self,
        executor: str = "local",
        *,
        workers: int | None = None,
        address: str | None = None,
        cache: CellCache | None = None,
    ) -> None:
        if executor not in EXECUTORS:
            raise UserError(f"unknown executor {executor!r}; known: {', '.join(EXECUTORS)}")
        if address is not None and executor != "ray":
            raise UserError("--address needs --executor ray")
        if workers is not None and workers < 1:
            raise UserError(f"--workers must be >= 1, got {workers}")
        self.executor = executor
        self.workers = workers or os.cpu_count() or 1
        self.address = address
        self.cache = cache or CellCache(None)
        self.num_run = 0
        self.num_cached = 0
        self._pool: ProcessPoolExecutor | None = None
        self._ray: Any = None
        self._ray_started = False
        self._remote: Any = None

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> CellRunner:
        if self.executor == "ray":
            self._start_ray()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=exc is None, cancel_futures=True)
            self._pool = None
        if self._ray_started:
            self._ray.shutdown()
            self._ray_started = False

    def _start_ray(self) -> None:
        if self.address is None:
            os.environ.setdefault(_RAY_LOOPBACK_ENV, "0")
        try:
            import ray
        except ImportError:
            raise UserError("--executor ray needs Ray: pip install 'superinfer[ray]'") from None
        self._ray = ray
        if not ray.is_initialized():
            if self.address is None:
                ray.init(num_cpus=self.workers, include_dashboard=False, log_to_driver=False)
            else:
                try:
                    ray.init(address=self.address, log_to_driver=False)
                except (ConnectionError, ValueError, RuntimeError) as exc:
                    raise UserError(f"--address {self.address}: {exc}") from None
            self._ray_started = True
        self._remote = ray.remote(num_cpus=1, max_retries=0)(run_cell)

    # -- running --------------------------------------------------------------------------------

    def run(
        self, cells: Sequence[CellSpec], progress: ProgressFn | None = None
    ) -> list[dict[str, Any]]:
        """Outcomes of ``cells``, in order: from the cache where present, else simulated.

        Equal cells (same key) run once. Each new outcome is cached as soon as it comes back.

        Raises:
            UserError: a cell failed on bad input (the message names the cell).
        """
        keys = [cell_key(c) for c in cells]
        outcomes: dict[str, dict[str, Any]] = {}
        todo: dict[str, CellSpec] = {}
        for key, cell in zip(keys, cells, strict=True):
            if key in outcomes or key in todo:
                continue
            hit = self.cache.get(key)
            if hit is not None:
                outcomes[key] = hit
            else:
                todo[key] = cell
        total = len(outcomes) + len(todo)
        self.num_cached += len(outcomes)
        if progress:
            for i in range(len(outcomes)):
                progress(i + 1, total, True)

        def done(key: str, outcome: dict[str, Any]) -> None:
            self.cache.put(key, todo[key], outcome)
            outcomes[key] = outcome
            self.num_run += 1
            if progress:
                progress(len(outcomes), total, False)

        if todo:
            if self.executor == "ray":
                self._run_ray(todo, done)
            elif self.workers == 1 or len(todo) == 1:
                for key, cell in todo.items():
                    done(key, _call(cell))
            else:
                self._run_pool(todo, done)
        return [outcomes[k] for k in keys]

    def _run_pool(
        self, todo: dict[str, CellSpec], done: Callable[[str, dict[str, Any]], None]
    ) -> None:
        if self._pool is None:
            # spawn, not fork: the driver may hold threads (progress display) and locks.
            ctx = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx)
        futures: dict[Future[dict[str, Any]], str] = {
            self._pool.submit(_call, cell): key for key, cell in todo.items()
        }
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in sorted(finished, key=lambda f: futures[f]):
                done(futures[fut], fut.result())

    def _run_ray(
        self, todo: dict[str, CellSpec], done: Callable[[str, dict[str, Any]], None]
    ) -> None:
        ray = self._ray
        refs = {self._remote.remote(cell): key for key, cell in todo.items()}
        pending = list(refs)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                for ref in ready:
                    try:
                        outcome = ray.get(ref)
                    except ray.exceptions.RayTaskError as exc:
                        cause = getattr(exc, "cause", None)
                        if isinstance(cause, UserError):
                            raise UserError(_where(todo[refs[ref]], cause)) from None
                        raise
                    done(refs[ref], outcome)
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise


def _where(cell: CellSpec, exc: BaseException) -> str:
    return f"cell {cell.engine} x {cell.policy} x {cell.replicas} replicas: {exc}"


def _call(cell: CellSpec) -> dict[str, Any]:
    """:func:`run_cell` with the cell named in a user error (what worker processes run)."""
    try:
        return run_cell(cell)
    except UserError as exc:
        raise UserError(_where(cell, exc)) from None
