"""Fair-queue data: queued jobs, queue settings, aging, explanations, one tenant queue's order.

Plain dataclasses that :class:`~gpuyard.scheduler.admission.quota.ordering.FairQueue` keeps and the
scheduling cycle reads; :func:`queue_configs` and :func:`queued_job` are the edge where the API
objects (Queue, PodGroup) become them. :class:`TenantQueue` (one queue's pending jobs per
priority bucket and its running totals) and :func:`pending_order` (its pending jobs by effective
priority, then submission: aging makes this a k-way merge over the buckets) are shared by
`ordering` (FairQueue) and `candidates` (a cycle's walk); the package exports neither.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from gpuyard.apis.durations import parse_duration
from gpuyard.apis.quotakinds import ANNOTATION_EXPECTED_DURATION, Queue
from gpuyard.apis.scheduling import PodGroup
from gpuyard.scheduler.admission.quota.resources import Vector, podgroup_usage

__all__ = [
    "NO_AGING",
    "Aging",
    "Explanation",
    "QueueConfig",
    "QueuedJob",
    "TenantQueue",
    "pending_order",
    "queue_configs",
    "queued_job",
]

Strategy = Literal["StrictFIFO", "BestEffortFIFO"]


@dataclass(slots=True)
class QueuedJob:
    """A job waiting to start, as the queue sees it (built once from its PodGroup)."""

    key: Hashable
    queue: str
    priority: int = 0
    submit_time: float = 0.0
    request: Mapping[str, int] = field(default_factory=dict)
    """The whole gang's demand in quota units."""
    expected_duration: float | None = None
    """Seconds, from `gpuyard.io/expected-duration`; None: unknown."""


@dataclass(frozen=True, slots=True)
class Aging:
    interval: float = 600.0
    step: int = 1
    max_boost: int = 100
    reserve_after: float | None = None

    def boost(self, waited: float) -> int:
        if self.step <= 0 or waited <= 0:
            return 0
        return min(self.max_boost, self.step * int(waited // self.interval))


NO_AGING = Aging(step=0)


@dataclass(frozen=True, slots=True)
class QueueConfig:
    name: str
    weight: float = 1.0
    strategy: Strategy = "BestEffortFIFO"
    max_running_jobs: int | None = None
    aging: Aging | None = None
    """None: the FairQueue's default aging."""
    preemption_policy: str = "LowerPriority"
    """Never | LowerPriority | LowerOrNewerEqualPriority: whom its jobs may preempt."""
    preempt_min_runtime: float = 0.0
    """Its jobs are not preempted before they have run this many seconds."""


def queue_configs(queues: Iterable[Queue]) -> list[QueueConfig]:
    """QueueConfigs from Queue objects (the edge: pydantic in, plain data out)."""
    out = []
    for q in queues:
        a = q.spec.aging
        aging = None if a is None else Aging(a.interval_seconds, a.step, a.max_boost, a.reserve_after_seconds)
        out.append(
            QueueConfig(
                q.metadata.name,
                q.spec.weight,
                q.spec.queueing_strategy,
                q.spec.max_running_jobs,
                aging,
                preemption_policy=q.spec.preemption_policy,
                preempt_min_runtime=q.spec.min_runtime_seconds(),
            )
        )
    return out


def queued_job(pg: PodGroup, *, submit_time: float | None = None) -> QueuedJob:
    """A PodGroup as the queue sees it: queue (spec.queue, else namespace), priority, submit
    time (status.queuedAt, else creation), whole-gang request, expected duration (annotation
    `gpuyard.io/expected-duration`, ignored when unreadable)."""
    meta = pg.metadata
    if submit_time is None:
        stamp = pg.status.queued_at or meta.creation_timestamp
        submit_time = stamp.timestamp() if stamp is not None else 0.0
    duration = None
    raw = meta.annotations.get(ANNOTATION_EXPECTED_DURATION)
    if raw:
        try:
            duration = parse_duration(raw)
        except ValueError:
            duration = None
    return QueuedJob(
        key=(meta.namespace, meta.name),
        queue=pg.spec.queue or meta.namespace or "default",
        priority=pg.spec.priority,
        submit_time=submit_time,
        request=podgroup_usage(pg),
        expected_duration=duration,
    )


@dataclass(frozen=True, slots=True)
class Explanation:
    """Where a pending job stands: jobs ahead of it, its queue's share, what holds it back."""

    key: Hashable
    queue: str
    position: int
    """Jobs ahead of it overall if nothing started (queues in share order)."""
    queue_position: int
    """Jobs ahead of it in its own queue."""
    effective_priority: int
    queue_share: float
    cause: str | None

    def describe(self) -> str:
        text = (
            f"#{self.position + 1} overall, #{self.queue_position + 1} in queue {self.queue} "
            f"(share {self.queue_share:.2f}, effective priority {self.effective_priority})"
        )
        return f"{text}: {self.cause}" if self.cause else text


class TenantQueue:
    """One tenant queue: pending jobs per base priority (sorted by submit time), running totals."""

    __slots__ = ("buckets", "config", "pending", "running", "usage")

    def __init__(self, config: QueueConfig) -> None:
        self.config = config
        self.buckets: dict[int, list[tuple[float, int, Hashable]]] = {}
        self.pending = 0
        self.running = 0
        self.usage: Vector = {}

    def full(self) -> bool:
        cap = self.config.max_running_jobs
        return cap is not None and self.running >= cap


def pending_order(
    q: TenantQueue, aging: Aging, now: float, pending: Mapping[Hashable, object]
) -> Iterator[Hashable]:
    """One queue's pending keys by (effective priority desc, submit time, arrival).

    Within a priority bucket effective priority never rises along submission order (older jobs
    have aged at least as much), so a k-way merge over the buckets' heads is exact. Buckets are
    copied once, so the queue may change while this runs (keys no longer pending are skipped).
    """
    heap = []
    for prio, bucket in q.buckets.items():
        if bucket:
            snapshot = list(bucket)
            t, seq, _ = snapshot[0]
            heap.append((-(prio + aging.boost(now - t)), t, seq, prio, 0, snapshot))
    heapq.heapify(heap)
    while heap:
        _, _, _, prio, i, snapshot = heap[0]
        key = snapshot[i][2]
        if i + 1 < len(snapshot):
            t, seq, _ = snapshot[i + 1]
            heapq.heapreplace(heap, (-(prio + aging.boost(now - t)), t, seq, prio, i + 1, snapshot))
        else:
            heapq.heappop(heap)
        if key in pending:
            yield key
