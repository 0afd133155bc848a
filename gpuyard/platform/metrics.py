"""Prometheus metrics of the platform core, on an injected `CollectorRegistry`.

Components create their own metrics on `ctx.registry`; this module holds the ones the runtime
owns: reconcile durations, work-queue depth, store size and event-loop lag.
"""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry, Gauge, Histogram

from gpuyard.state.store import Store

__all__ = ["CoreMetrics"]


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
