"""Scheduler metrics: cycle time by result, attempts, pods placed, PodGroups waiting.

`gpuyard_scheduler_cycle_seconds{result}` (a histogram of the time to decide and assume one
gang), `gpuyard_scheduler_attempts{result}`, `gpuyard_scheduler_placed_pods` and
`gpuyard_scheduler_pending_podgroups`, on the context's injected registry; the scheduling loop
(`running`) writes them from what the core counted (`decisions.Tally`) and the time it measured.
Preemption counts `gpuyard_preemptions_total{reason}` (priority, reclaim, migration: jobs
stopped) and `gpuyard_gpu_hours_lost_total` (the work they lose); the rescheduler
`gpuyard_migrations_total` (jobs moved to defragment GPUs).
"""

from __future__ import annotations

import weakref
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["SchedulerMetrics"]


_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, SchedulerMetrics] = weakref.WeakKeyDictionary()


class SchedulerMetrics:
    """Cycle time by result, attempts, pods placed, PodGroups waiting — on an injected registry.

    One set per registry: components built twice on one registry share it.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.cycle = Histogram(
            "gpuyard_scheduler_cycle_seconds",
            "Time to decide and assume one gang.",
            ["result"],
            buckets=_BUCKETS,
            registry=registry,
        )
        self.attempts = Counter(
            "gpuyard_scheduler_attempts", "Scheduling attempts by result.", ["result"], registry=registry
        )
        self.placed = Counter("gpuyard_scheduler_placed_pods", "Pods given a reservation.", registry=registry)
        self.pending = Gauge(
            "gpuyard_scheduler_pending_podgroups",
            "PodGroups waiting in the scheduling queue.",
            registry=registry,
        )
        self.preemptions = Counter(
            "gpuyard_preemptions",
            "Running jobs stopped to make room for another, by reason (priority, reclaim, migration).",
            ["reason"],
            registry=registry,
        )
        self.gpu_hours_lost = Counter(
            "gpuyard_gpu_hours_lost",
            "GPU-hours of work lost by stopped jobs (GPUs x time since start or last checkpoint).",
            registry=registry,
        )
        self.migrations = Counter(
            "gpuyard_migrations", "Jobs moved by the rescheduler to defragment GPUs", registry=registry
        )
        self._children: dict[str, tuple[Any, Any]] = {}

    @classmethod
    def for_registry(cls, registry: CollectorRegistry) -> SchedulerMetrics:
        metrics = _BY_REGISTRY.get(registry)
        if metrics is None:
            metrics = _BY_REGISTRY[registry] = cls(registry)
        return metrics

    def observe_cycles(self, seconds: float, result: str, *, count: int = 1, pods: int = 0) -> None:
        """`count` attempts of `result` that took `seconds` each and placed `pods` pods in all."""
        if count:
            children = self._children.get(result)
            if children is None:
                children = self._children[result] = (self.cycle.labels(result), self.attempts.labels(result))
            for _ in range(count):
                children[0].observe(seconds)
            children[1].inc(count)
        if pods:
            self.placed.inc(pods)

    def preempted(self, reason: str, *, jobs: int = 1) -> None:
        self.preemptions.labels(reason).inc(jobs)

    def lost(self, gpu_hours: float) -> None:
        if gpu_hours > 0:
            self.gpu_hours_lost.inc(gpu_hours)

    def migrated(self, jobs: int) -> None:
        if jobs:
            self.migrations.inc(jobs)
