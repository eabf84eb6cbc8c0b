"""``superinfer serve --engine hf``: the OpenAI-compatible server on the real CPU engine, its
configuration built from the command line's strings (docs/serve.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from superinfer.harness.engines.hf import HFOptions, hf_options
from superinfer.harness.engines.hf_sim import sim_step_time
from superinfer.harness.engines.isolated import IsolatedLatency
from superinfer.harness.errors import UserError
from superinfer.harness.policies import registered_policies
from superinfer.harness.workload.slo_options import parse_slo
from superinfer.policy_core.slo_forms import SLO_FORMS
from superinfer.policy_core.types import SLO

__all__ = ["SERVE_ENGINE_OPTIONS", "serve_hf"]

#: The ``--engine-option`` keys ``serve --engine hf`` uses: the engine's limits and threads, and
#: the step-time calibration its engine-relative SLOs read.
SERVE_ENGINE_OPTIONS = (
    "num_blocks",
    "max_batch_tokens",
    "max_num_seqs",
    "page_size_tokens",
    "num_threads",
    "step_time_file",
)


def _isolated(opts: HFOptions) -> Callable[[int], tuple[float, float]]:
    """Prompt tokens -> ``(prefill_ms, decode_ms)`` alone on this engine, from its CPU
    calibration (``--engine-option step_time_file``, else the default fit), for engine-relative
    SLOs (docs/metrics.md, "SLO forms")."""
    lat = IsolatedLatency(sim_step_time(opts), opts.max_batch_tokens, "hf-cpu calibration")
    return lambda prompt: (lat.prefill_ms(prompt), lat.decode_ms(prompt))


def serve_hf(
    *,
    policy: str | None,
    policy_options: Mapping[str, str],
    host: str | None,
    port: int | None,
    priority_convention: str,
    slo_classes: Sequence[str],
    default_class: str,
    engine_options: Mapping[str, str],
    log: Callable[[str], None],
    drain_s: float = 30.0,
) -> None:
    """Build the server's configuration, then serve until interrupted.

    Args:
        policy: policy name (``None``: ``superinfer`` if registered, else ``fcfs``).
        policy_options: its ``--policy-opt`` options.
        host: address to bind (``None``: 127.0.0.1).
        port: TCP port (``None``: 8000).
        priority_convention: ``vllm`` (lower is more urgent) or ``sglang``.
        slo_classes: ``--slo-class`` strings defining or changing classes.
        default_class: class of a request that names none.
        engine_options: ``--engine-option`` settings: those of :data:`SERVE_ENGINE_OPTIONS`
            (``engines.hf.HFOptions``; the others shape a benchmark run, not a server).
        log: called with each log line.
        drain_s: on shutdown, how long requests in flight may run on, s (``ServeConfig``).

    Raises:
        UserError: the hf or serve extra or the model missing, or a bad option.
    """
    try:
        from superinfer.adapters.hf.engine import EngineConfig, ModelNotInstalledError
        from superinfer.serve import DEFAULT_SLO_CLASSES, ServeConfig, serve_forever
    except ImportError as exc:
        raise UserError(
            f"serve --engine hf needs the hf and serve extras ({exc}); run `make install-serve`"
        ) from None
    if policy is None:
        policy = "superinfer" if "superinfer" in registered_policies() else "fcfs"
    classes = dict(DEFAULT_SLO_CLASSES)
    keys = ("ttft_ms", "tpot_ms", "deadline_s", "priority", *SLO_FORMS)
    for name, changes in parse_slo(slo_classes, keys=keys, flag="--slo-class").items():
        if "priority" in changes:
            value = changes["priority"]
            if value is None or value != int(value):
                raise UserError(f"--slo-class {name}: priority must be an integer")
            changes["priority"] = int(value)
        base = classes.get(name) or SLO(name)
        try:
            classes[name] = dataclasses.replace(base, **changes)  # type: ignore[arg-type]
        except ValueError as exc:
            raise UserError(f"--slo-class {name}: {exc}") from None
    opts = hf_options(engine_options)  # a bad key or value: its error first
    if other := sorted(set(engine_options) - set(SERVE_ENGINE_OPTIONS)):
        raise UserError(
            f"--engine-option {other[0]}: a benchmark setting, not used by serve --engine hf "
            f"(serve takes {', '.join(SERVE_ENGINE_OPTIONS)})"
        )
    try:
        config = ServeConfig(
            host=host or "127.0.0.1",
            port=8000 if port is None else port,
            policy=policy,
            slo_classes=classes,
            default_class=default_class,
            priority_convention=priority_convention,
            isolated_latency=_isolated(opts),
            drain_s=drain_s,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    engine_config = EngineConfig(
        page_size_tokens=opts.page_size_tokens,
        num_blocks=opts.num_blocks,
        max_batch_tokens=opts.max_batch_tokens,
        max_num_seqs=opts.max_num_seqs,
        num_threads=opts.num_threads,
    )
    try:
        serve_forever(
            config, policy_options=dict(policy_options), engine_config=engine_config, log=log
        )
    except ModelNotInstalledError as exc:
        raise UserError(str(exc)) from None
