"""What the cluster holds right now, computed from the store: GPUs by model, fragmentation, jobs.

One pass over nodes, reservations, PodGroups and jobs gives a :class:`ClusterUsage`. Two readers
share it: `GET /api/v1/summary` (and through it the dashboard's overview) and
:class:`ClusterCollector`, a `prometheus_client` custom collector that computes the `gpuyard_gpus_*`
and `gpuyard_gpu_fragmentation_ratio` series at scrape time, so nothing has to keep them in step
with the store between scrapes.

Definitions (documented for users in docs/operations.md):

* **allocated GPUs** of a node: the distinct GPU indices named by the node's Reservations (a GPU
  shared by several pods counts once; any share makes it allocated).
* **free GPUs** of a node: its allocatable `nvidia.com/gpu` minus allocated and unhealthy
  GPUs (node annotation `gpuyard.io/unhealthy-gpus`), and 0 on a node that is not Ready.
* **reference request** `k`: the most common per-pod whole-GPU count above 1 among reservations
  and pending PodGroups (ties: the larger); 2 when there is none.
* **fragmentation ratio**: the share of free GPUs that sit on nodes whose free count is below
  `k`, i.e. free GPUs the most common multi-GPU pod cannot use. 0 when nothing is free.

This is a read of the store, not the scheduling hot path: it runs per request or per scrape,
costs one pass over the objects, and does no validation.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuyard.apis.core import GPU_RESOURCE, Event, Node
from gpuyard.apis.devicematching import LABEL_GPU_MODEL, unhealthy_indices
from gpuyard.apis.jobkinds import KIND_INFO
from gpuyard.apis.quantity import QuantityError, parse_quantity
from gpuyard.apis.quotakinds import ElasticQuota, Queue
from gpuyard.apis.scheduling import PodGroup, Reservation
from gpuyard.state.store import Store

__all__ = [
    "PENDING_PHASES",
    "ClusterCollector",
    "ClusterUsage",
    "NodeUsage",
    "cluster_usage",
    "register_cluster_metrics",
]

PENDING_PHASES = frozenset({"", "Created", "Queuing"})
DEFAULT_REFERENCE_REQUEST = 2


@dataclass(slots=True)
class NodeUsage:
    """One node's GPUs, CPU and memory: allocatable and what reservations hold."""

    name: str
    model: str
    ready: bool
    gpus: int
    gpus_allocated: int
    gpus_unhealthy: int
    cpu: Decimal
    cpu_requested: Decimal
    memory: Decimal
    memory_requested: Decimal
    holders: dict[int, list[str]] = field(default_factory=dict)  # GPU index -> ["ns/job", ...]
    unhealthy: list[int] = field(default_factory=list)  # indices of the unhealthy GPUs

    @property
    def gpus_free(self) -> int:
        if not self.ready:
            return 0
        return max(0, self.gpus - self.gpus_allocated - self.gpus_unhealthy)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "ready": self.ready,
            "gpus": self.gpus,
            "gpusAllocated": self.gpus_allocated,
            "gpusFree": self.gpus_free,
            "gpusUnhealthy": self.gpus_unhealthy,
            "cpu": float(self.cpu),
            "cpuRequested": float(self.cpu_requested),
            "memoryBytes": float(self.memory),
            "memoryRequestedBytes": float(self.memory_requested),
            "holders": {str(k): v for k, v in sorted(self.holders.items())},
            "unhealthyGpus": list(self.unhealthy),
        }


@dataclass(slots=True)
class ClusterUsage:
    nodes: list[NodeUsage]
    reference_request: int
    jobs_by_phase: dict[str, int]
    queue_depths: dict[str, int]

    def gpus_by_model(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for n in self.nodes:
            if n.gpus == 0:
                continue
            row = out.setdefault(n.model, {"total": 0, "allocated": 0, "free": 0, "unhealthy": 0})
            row["total"] += n.gpus
            row["allocated"] += n.gpus_allocated
            row["free"] += n.gpus_free
            row["unhealthy"] += n.gpus_unhealthy
        return dict(sorted(out.items()))

    def fragmentation(self, model: str | None = None) -> float:
        """Share of free GPUs (of `model`, or all) on nodes with fewer than `reference_request` free."""
        free = stranded = 0
        for n in self.nodes:
            if model is not None and n.model != model:
                continue
            f = n.gpus_free
            free += f
            if f < self.reference_request:
                stranded += f
        return stranded / free if free else 0.0


def _q(value: Any) -> Decimal:
    if value is None:
        return Decimal(0)
    try:
        return parse_quantity(value)
    except (QuantityError, ArithmeticError):
        return Decimal(0)


def _whole_gpus(requests: dict[str, Any]) -> int:
    return int(_q(requests.get(GPU_RESOURCE)))


def cluster_usage(store: Store) -> ClusterUsage:
    """One pass over the store; see the module docstring for the definitions."""
    held: dict[str, dict[int, list[str]]] = defaultdict(dict)
    cpu_used: dict[str, Decimal] = defaultdict(Decimal)
    mem_used: dict[str, Decimal] = defaultdict(Decimal)
    sizes: Counter[int] = Counter()
    for res in store.list_of(Reservation):
        spec = res.spec
        holder = f"{res.metadata.namespace}/{spec.pod_group}"
        per_node = held[spec.node]
        for idx in spec.gpus:
            gpu_holders = per_node.setdefault(idx, [])
            if holder not in gpu_holders:
                gpu_holders.append(holder)
        reqs = spec.requests
        cpu_used[spec.node] += _q(reqs.get("cpu"))
        mem_used[spec.node] += _q(reqs.get("memory"))
        if len(spec.gpus) > 1 and (spec.gpu_milli in (0, 1000)):
            sizes[len(spec.gpus)] += 1
    for pg in store.list_of(PodGroup):
        if pg.status.phase != "Pending":
            continue
        for role in pg.spec.roles:
            k = _whole_gpus(role.template.requests())
            if k > 1:
                sizes[k] += role.replicas
    reference = max(sizes.items(), key=lambda kv: (kv[1], kv[0]))[0] if sizes else DEFAULT_REFERENCE_REQUEST
    nodes = []
    for node in store.list_of(Node):
        alloc = node.status.allocatable
        name = node.metadata.name
        gpus = _whole_gpus(alloc)
        holders = held.get(name, {})
        unhealthy = sorted(unhealthy_indices(node))
        nodes.append(
            NodeUsage(
                name=name,
                model=node.metadata.labels.get(LABEL_GPU_MODEL, "unknown" if gpus else "none"),
                ready=node.ready,
                gpus=gpus,
                gpus_allocated=len(holders),
                gpus_unhealthy=len(unhealthy),
                cpu=_q(alloc.get("cpu")),
                cpu_requested=cpu_used.get(name, Decimal(0)),
                memory=_q(alloc.get("memory")),
                memory_requested=mem_used.get(name, Decimal(0)),
                holders=holders,
                unhealthy=unhealthy,
            )
        )
    phases: Counter[str] = Counter()
    queues: Counter[str] = Counter()
    for kind, info in KIND_INFO.items():
        if kind not in store.kinds():
            continue
        for job in store.list_of(info.cls):
            phase = job.status.phase or "Created"
            phases[phase] += 1
            if phase in PENDING_PHASES:
                queues[job.queue or "default"] += 1
    return ClusterUsage(
        nodes=nodes,
        reference_request=reference,
        jobs_by_phase=dict(sorted(phases.items())),
        queue_depths=dict(sorted(queues.items())),
    )


class ClusterCollector(Collector):
    """`gpuyard_gpus_total|allocated|free{model}`, `gpuyard_gpu_fragmentation_ratio{model}` and
    `gpuyard_jobs{phase}`, computed from the store at scrape time."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def describe(self) -> list[Any]:
        return []  # computed at scrape time; no fixed description needed for registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        usage = cluster_usage(self._store)
        by_model = usage.gpus_by_model()
        total = GaugeMetricFamily(
            "gpuyard_gpus_total", "GPUs on the cluster's nodes, by model.", labels=["model"]
        )
        alloc = GaugeMetricFamily(
            "gpuyard_gpus_allocated", "GPUs held by reservations, by model.", labels=["model"]
        )
        free = GaugeMetricFamily(
            "gpuyard_gpus_free", "Healthy unallocated GPUs on Ready nodes, by model.", labels=["model"]
        )
        frag = GaugeMetricFamily(
            "gpuyard_gpu_fragmentation_ratio",
            "Share of free GPUs on nodes whose free count is below the most common multi-GPU request "
            '(model="" for the whole cluster).',
            labels=["model"],
        )
        for model, row in by_model.items():
            total.add_metric([model], row["total"])
            alloc.add_metric([model], row["allocated"])
            free.add_metric([model], row["free"])
            frag.add_metric([model], usage.fragmentation(model))
        frag.add_metric([""], usage.fragmentation())
        ref = GaugeMetricFamily(
            "gpuyard_gpu_fragmentation_reference_gpus",
            "The per-pod GPU count the fragmentation ratio is measured against.",
            value=usage.reference_request,
        )
        jobs = GaugeMetricFamily("gpuyard_jobs", "Jobs by phase.", labels=["phase"])
        for phase, n in usage.jobs_by_phase.items():
            jobs.add_metric([phase], n)
        yield from (total, alloc, free, frag, ref, jobs)
        yield from self._queues_and_quotas()

    def _queues_and_quotas(self) -> Iterator[GaugeMetricFamily]:
        """Queue depth and share, quota min/runtime/used per resource, and preemptions, from the
        statuses and Events the scheduler writes."""
        store = self._store
        kinds = set(store.kinds())
        depth = GaugeMetricFamily("gpuyard_queue_pending_jobs", "Jobs waiting in a queue.", labels=["queue"])
        running = GaugeMetricFamily(
            "gpuyard_queue_running_jobs", "Jobs admitted from a queue.", labels=["queue"]
        )
        share = GaugeMetricFamily(
            "gpuyard_queue_weighted_share", "A queue's weighted dominant-resource share.", labels=["queue"]
        )
        if "Queue" in kinds:
            for q in store.list_of(Queue):
                name = q.metadata.name
                depth.add_metric([name], q.status.pending)
                running.add_metric([name], q.status.running)
                share.add_metric([name], q.status.share)
        quota = GaugeMetricFamily(
            "gpuyard_quota_resource",
            "Elastic quota per resource: min, max, runtime (what it may use now), used.",
            labels=["quota", "resource", "kind"],
        )
        if "ElasticQuota" in kinds:
            for eq in store.list_of(ElasticQuota):
                name = eq.metadata.name
                for what, values in (
                    ("min", eq.spec.min),
                    ("max", eq.spec.max),
                    ("runtime", eq.status.runtime),
                    ("used", eq.status.used),
                ):
                    for resource, amount in values.items():
                        quota.add_metric([name, resource, what], float(amount))
        preempted = GaugeMetricFamily(
            "gpuyard_preemptions",
            "Jobs preempted (reclaimed by a quota), from their Events.",
            value=sum(e.count for e in store.list_of(Event) if e.reason == "Preempted"),
        )
        yield from (depth, running, share, quota, preempted)


def register_cluster_metrics(registry: CollectorRegistry, store: Store) -> ClusterCollector:
    """Register the scrape-time cluster collector on `registry` (once per registry)."""
    collector = ClusterCollector(store)
    registry.register(collector)
    return collector
