"""A per-step log of a real SGLang scheduler, observer only: what it ran, for how long.

With ``SUPERINFER_STEP_LOG=PATH`` in a server's environment, this module's entry point
(:func:`register`, plugin ``superinfer-steplog`` in group ``sglang.srt.plugins``) installs
:class:`StepLogger` whether or not our policy is on (``SUPERINFER_SGLANG``), so a server under
SGLang's own ``--schedule-policy`` keeps the same log as one under ours. It decides nothing and
changes nothing: two hooks, an AROUND of ``Scheduler.run_batch`` (the forward pass of one batch;
with ``--disable-overlap-schedule``, which the CPU recipe sets, it returns after the forward) and
an AROUND of ``ScheduleBatch.retract_decode`` (sglang 0.5.23, ``managers/scheduler.py`` and
``managers/schedule_batch.py``), counting the requests a KV shortage sent back to the queue.

Each batch that runs tokens appends one CSV line to ``PATH`` (header first when the file is new;
flushed per line, so a reader sees every finished step; a line is ~70 bytes, a CPU step tens of
ms). Columns (:data:`COLUMNS`), named like the hf engine's ``steps.parquet`` where they mean the
same thing, so one model fits both (``superinfer calibrate --engine sglang --steps`` for this log):

- ``pid``: the scheduler process (one per tensor-parallel rank).
- ``step_index``: batches logged by this process, from 0.
- ``start_unix_s``: wall clock at the batch's launch (s since the epoch).
- ``duration_ms``: ``run_batch``'s wall time (ms).
- ``gap_ms``: from the end of the previous logged batch's ``run_batch`` to this one's start (ms):
  the scheduler's own time (the previous batch's result processing, this one's scheduling) when
  the two ran back to back, idle time as well otherwise; empty for a process's first batch.
- ``kind``: ``prefill`` (an extend batch), ``decode`` or ``mixed`` (``--enable-mixed-chunk``).
- ``num_seqs``: requests in the batch.
- ``num_tokens``: tokens run: ``extend_num_tokens`` for an extend or mixed batch, one per request
  for a decode.
- ``num_prefill_tokens`` / ``num_decode_tokens``: of which prompt tokens / one-token decodes (in a
  mixed batch a request extending by one token counts as a decode).
- ``num_samples``: requests whose logits are computed (every request of the batch; a chunked
  request's sample is discarded by SGLang but still computed).
- ``kv_tokens``: ``sum(seq_lens)``, the KV context of the batch including this step's tokens.
- ``prefix_tokens``: of an extend batch, the tokens its requests already held (radix-cache hits
  and a chunked request's earlier chunks: ``sum(prefix_lens)``); 0 for a decode.
- ``num_waiting``: requests in the waiting queue at launch.
- ``retracted``: requests ``retract_decode`` sent back since the previous logged batch.
"""

from __future__ import annotations

import csv
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

__all__ = ["COLUMNS", "ENV_STEP_LOG", "StepLogger", "install_step_log", "register", "step_row"]

ENV_STEP_LOG = "SUPERINFER_STEP_LOG"

#: The log's columns, in order (module docstring).
COLUMNS: tuple[str, ...] = (
    "pid",
    "step_index",
    "start_unix_s",
    "duration_ms",
    "gap_ms",
    "kind",
    "num_seqs",
    "num_tokens",
    "num_prefill_tokens",
    "num_decode_tokens",
    "num_samples",
    "kv_tokens",
    "prefix_tokens",
    "num_waiting",
    "retracted",
)

_M = "sglang.srt.managers"


def _kv_tokens(batch: Any) -> int:
    """``sum(seq_lens)``: ``seq_lens_cpu`` where set (a decode batch's, already counting the token
    it adds: ``prepare_for_decode`` leaves ``seq_lens_sum`` unset), else ``seq_lens_sum``."""
    lens = getattr(batch, "seq_lens_cpu", None)
    if lens is not None:
        return int(lens.sum())
    return int(batch.seq_lens_sum or 0)


def step_row(batch: Any) -> dict[str, Any] | None:
    """The shape columns of one ``ScheduleBatch`` at launch, or ``None`` for a batch that runs
    no tokens (idle, prebuilt).

    Reads ``forward_mode``, ``reqs``, ``extend_num_tokens``, ``extend_lens``, ``prefix_lens`` and
    ``seq_lens_cpu`` or ``seq_lens_sum`` (sglang 0.5.23 ``ScheduleBatch``)."""
    mode = batch.forward_mode
    n = len(batch.reqs)
    if mode.is_decode():
        kind, tokens, prefill, decode, prefix = "decode", n, 0, n, 0
    elif mode.is_extend():
        kind = "mixed" if mode.is_mixed() else "prefill"
        tokens = int(batch.extend_num_tokens or 0)
        decode = sum(1 for x in batch.extend_lens or () if x == 1) if kind == "mixed" else 0
        prefill = tokens - decode
        prefix = sum(int(x) for x in (batch.prefix_lens or []))
    else:
        return None
    return {
        "kind": kind,
        "num_seqs": n,
        "num_tokens": tokens,
        "num_prefill_tokens": prefill,
        "num_decode_tokens": decode,
        "num_samples": n,
        "kv_tokens": _kv_tokens(batch),
        "prefix_tokens": prefix,
    }


class StepLogger:
    """Appends one :data:`COLUMNS` line per batch to ``path`` (module docstring).

    The file is opened on the first logged batch, in the process that runs it (the scheduler), so
    the server's other processes, which load the plugin too, never touch it.

    Args:
        path: the CSV file; appended to (a header is written only if it is empty).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.steps = 0
        self._retracted = 0
        self._prev_end: float | None = None
        self._out: TextIO | None = None
        self._writer: Any = None

    def _open(self) -> Any:
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._out = self.path.open("a", newline="", buffering=1)
            self._writer = csv.DictWriter(self._out, fieldnames=COLUMNS)
            if self._out.tell() == 0:
                self._writer.writeheader()
        return self._writer

    def run_batch(self, original: Callable[..., Any], scheduler: Any, *a: Any, **k: Any) -> Any:
        """AROUND ``Scheduler.run_batch``: time the batch and append its line."""
        batch = a[0] if a else k.get("batch")
        row = step_row(batch) if batch is not None else None
        waiting = len(getattr(scheduler, "waiting_queue", ()) or ())
        start_unix, start = time.time(), time.perf_counter()
        try:
            return original(scheduler, *a, **k)
        finally:
            if row is not None:
                end = time.perf_counter()
                gap = "" if self._prev_end is None else round((start - self._prev_end) * 1e3, 3)
                self._prev_end = end
                row.update(
                    pid=os.getpid(),
                    step_index=self.steps,
                    start_unix_s=round(start_unix, 6),
                    duration_ms=round((end - start) * 1e3, 3),
                    gap_ms=gap,
                    num_waiting=waiting,
                    retracted=self._retracted,
                )
                self._open().writerow(row)
                self.steps += 1
                self._retracted = 0

    def retract_decode(self, original: Callable[..., Any], batch: Any, *a: Any, **k: Any) -> Any:
        """AROUND ``ScheduleBatch.retract_decode``: count the requests it retracted."""
        result = original(batch, *a, **k)
        self._retracted += len(result[0])
        return result


def install_step_log(path: str | Path) -> StepLogger:
    """Register a :class:`StepLogger` writing ``path`` with SGLang's ``HookRegistry`` (applied
    by ``load_plugins``); returns it."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    logger = StepLogger(path)
    HookRegistry.register(f"{_M}.scheduler.Scheduler.run_batch", logger.run_batch, HookType.AROUND)
    HookRegistry.register(
        f"{_M}.schedule_batch.ScheduleBatch.retract_decode",
        logger.retract_decode,
        HookType.AROUND,
    )
    return logger


def register() -> None:
    """Entry point (``sglang.srt.plugins``, name ``superinfer-steplog``): installs the step log
    when ``SUPERINFER_STEP_LOG`` is set, does nothing otherwise."""
    if path := os.environ.get(ENV_STEP_LOG):
        install_step_log(path)
