"""Prometheus metrics of the platform core, on an injected `CollectorRegistry`, and their exposition.

Components create their own metrics on `ctx.registry`; this module holds the ones the runtime
owns: reconcile durations, work-queue depth, store size and event-loop lag. `/metrics` answers
with :func:`exposition`: every series for admins and the `metrics` role; for anyone else (a public
scrape, `server.metrics_public`) the series that name a tenant (a label in
:data:`TENANT_LABELS`: per-quota usage, queue depths, ...) are left out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from gpuyard.state.store import Store

__all__ = ["TENANT_LABELS", "CoreMetrics", "exposition"]

TENANT_LABELS = frozenset({"queue", "quota", "namespace", "tenant", "team", "user", "job", "pod"})
"""A series with one of these labels describes one tenant: only admins see it."""


class _WithoutTenants:
    """A collector view of `registry` without the series that carry a tenant label."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            kept = [s for s in family.samples if TENANT_LABELS.isdisjoint(s.labels)]
            if not kept and family.samples:
                continue
            out = Metric(family.name, family.documentation, family.type, family.unit)
            out.samples = kept
            yield out


def exposition(registry: CollectorRegistry, *, tenant_detail: bool) -> bytes:
    """The text exposition of `registry`; without per-tenant series unless `tenant_detail`."""
    if tenant_detail:
        return generate_latest(registry)
    return generate_latest(_WithoutTenants(registry))


class CoreMetrics:
    def __init__(self, registry: CollectorRegistry, store: Store) -> None:
        self.reconcile_seconds = Histogram(
            "gpuyard_reconcile_duration_seconds",
            "Time spent in one reconcile, by controller.",
            ["controller"],
            registry=registry,
            buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5),
        )
        self.loop_lag = Gauge(
            "gpuyard_event_loop_lag_seconds", "How late a 0.25 s timer fired, last sample.", registry=registry
        )
        self.store_objects = Gauge(
            "gpuyard_store_objects", "Objects in the store, by kind.", ["kind"], registry=registry
        )
        self.store_rv = Gauge(
            "gpuyard_store_resource_version", "The store's current resourceVersion.", registry=registry
        )
        self._store = store

    def observe_reconcile(self, controller: str, seconds: float) -> None:
        self.reconcile_seconds.labels(controller).observe(seconds)

    def sample_store(self) -> None:
        for kind in self._store.kinds():
            self.store_objects.labels(kind).set(self._store.count(kind))
        self.store_rv.set(self._store.resource_version)

    async def run(self, *, interval: float = 0.25) -> None:
        """Measure event-loop lag in wall time (dask's `_measure_tick`) and sample the store."""
        while True:
            start = time.perf_counter()
            await asyncio.sleep(interval)
            self.loop_lag.set(max(0.0, time.perf_counter() - start - interval))
            self.sample_store()
