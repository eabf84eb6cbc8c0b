"""Prometheus metrics of the server, read from the engine at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["TPOT_BUCKETS_S", "TTFT_BUCKETS_S", "EngineCollector"]

#: Bucket bounds of the TTFT and TPOT histograms, s.
TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
TPOT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class EngineCollector:
    """Prometheus metrics read from the engine at scrape time."""

    def __init__(self, engine: Any) -> None:
        """Read ``engine`` (a :class:`superinfer.serve.engine.ServingEngine`; typed ``Any`` so
        this module, which the engine imports, does not import it back) at every scrape."""
        self.engine = engine

    def collect(self) -> Iterator[Any]:
        """The metric families, read now (``prometheus_client`` custom-collector protocol)."""
        engine = self.engine
        binding = engine.session.binding
        with binding.lock:
            queues = dict(binding.queue_by_tier)
            used = binding.used_blocks
        capacity = binding.capacity_blocks
        up = GaugeMetricFamily("superinfer_engine_up", "1 while the engine loop runs")
        up.add_metric([], 1.0 if engine.healthy else 0.0)
        yield up
        tiers = sorted({tier for tier, _ in queues} | {0})
        for state in ("waiting", "running"):
            g = GaugeMetricFamily(
                f"superinfer_requests_{state}",
                f"Requests {state} in the engine after its latest scheduling step, per tier"
                + (" (holding KV)" if state == "running" else ""),
                labels=["tier"],
            )
            for tier in tiers:
                g.add_metric([str(tier)], float(queues.get((tier, state), 0)))
            yield g
        kv = GaugeMetricFamily("superinfer_kv_used_blocks", "KV blocks in use")
        kv.add_metric([], float(used))
        yield kv
        cap = GaugeMetricFamily("superinfer_kv_capacity_blocks", "KV blocks of the pool")
        cap.add_metric([], float(capacity))
        yield cap
        frac = GaugeMetricFamily("superinfer_kv_used_fraction", "KV blocks in use / capacity")
        frac.add_metric([], used / capacity if capacity else 0.0)
        yield frac
        size = GaugeMetricFamily("superinfer_kv_used_bytes", "KV bytes in use (every layer)")
        size.add_metric([], float(used * binding.kv_block_bytes))
        yield size
        stats = engine.stats()
        ended = CounterMetricFamily(
            "superinfer_requests_ended",
            "Requests ended, per SLO class and status (finished, rejected, failed)",
            labels=["slo_class", "status"],
        )
        met = CounterMetricFamily(
            "superinfer_slo_met", "Requests that finished within every target of their class",
            labels=["slo_class"],
        )  # fmt: skip
        attain = GaugeMetricFamily(
            "superinfer_slo_attainment",
            "Fraction of the class's ended requests that met their SLO (rejected and failed "
            "count as misses)",
            labels=["slo_class"],
        )
        for name, s in sorted(stats.items()):
            for status in ("finished", "rejected", "failed"):
                ended.add_metric([name, status], float(getattr(s, status)))
            met.add_metric([name], float(s.met))
            total = s.finished + s.rejected + s.failed
            attain.add_metric([name], s.met / total if total else 0.0)
        yield ended
        yield met
        yield attain
        failed = CounterMetricFamily(
            "superinfer_requests_failed",
            "Failed requests, per SLO class and kind of reason (policy_error, "
            "client_disconnected, engine_error, ...)",
            labels=["slo_class", "kind"],
        )
        for name, s in sorted(stats.items()):
            for kind, count in sorted(s.failed_by_kind.items()):
                failed.add_metric([name, kind], float(count))
        yield failed
        errors = CounterMetricFamily(
            "superinfer_policy_errors",
            "Errors the policy raised while serving (each failed one request, or a lifecycle "
            "hook call); the engine went on",
        )
        errors.add_metric([], float(engine.policy_errors))
        yield errors
        refused = CounterMetricFamily(
            "superinfer_requests_refused",
            "Requests answered before they reached the engine (malformed or unsupported "
            "fields, another model, a stopped engine), per HTTP status and field (list indices "
            "as [])",
            labels=["status", "param"],
        )
        for (status, param), count in sorted(engine.refused.items()):
            refused.add_metric([str(status), param], float(count))
        yield refused
        ignored = CounterMetricFamily(
            "superinfer_requests_with_ignored_fields",
            "Requests served with top-level fields the server neither reads nor accepts as "
            "without effect (a misspelt or unsupported field; the log names them)",
        )
        ignored.add_metric([], float(engine.ignored_field_requests))
        yield ignored
