"""Independent runs in worker processes, handed over one per worker at a time: the headline
suite's loads (the grid's cells go through ``executors.CellRunner``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, TypeVar

__all__ = ["run_in_processes"]

_In = TypeVar("_In")
_Out = TypeVar("_Out")


def run_in_processes(
    fn: Callable[[_In], _Out],
    jobs: Sequence[_In],
    workers: int,
    progress: Callable[[str], None] | None = None,
) -> list[_Out]:
    """``fn`` of every job in ``workers`` processes, results in ``jobs`` order.

    At most ``workers`` jobs are handed to the pool at a time, so an error, Ctrl-C or SIGTERM
    (the CLI's handler raises SystemExit) waits only for the jobs in progress: a
    ``ProcessPoolExecutor`` given every job at once runs all of them on its ``with`` exit
    before the error comes out (the headline suite went on for its whole length).

    Args:
        fn: a module-level function (the pool pickles it by name).
        jobs: its arguments, one per run.
        workers: processes, >= 1.
        progress: told ``"i/n runs done"`` after each run.

    Raises:
        BaseException: the first error a run raised (in completion order), once the other
            runs in progress end; the jobs not yet handed over never run.
    """
    results: list[Any] = [None] * len(jobs)
    todo = iter(enumerate(jobs))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        running: dict[Future[_Out], int] = {}

        def hand_over() -> None:
            job = next(todo, None)
            if job is not None:
                running[pool.submit(fn, job[1])] = job[0]

        for _ in range(workers):
            hand_over()
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                results[running.pop(future)] = future.result()
                if progress:
                    progress(f"{len(jobs) - len(running)}/{len(jobs)} runs done")
                hand_over()
    return results
