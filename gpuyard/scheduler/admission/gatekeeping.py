"""Queue and quota state of the scheduling loop: who waits where, who may start, statuses.

The scheduler core (`core.SchedulerState`) owns one :class:`Admission`. It holds the pure core
of `gpuyard/scheduler/admission/quota/` and keeps it in step with the objects the core was given (its
:class:`~gpuyard.scheduler.cache.objects.ObjectCache`; never the store):

* the ElasticQuota tree (`QuotaTree` + `QuotaBook`: every live PodGroup's demand is its
  quota's *request*, except a waiting one that can never be placed on this cluster
  (`never_fits`); a PodGroup holding reservations is *admitted*: its demand is *used*). A GPU
  class (`nvidia.h100`) is charged to the tree only when some ElasticQuota names it in its
  `min`, `max` or shared weight: a per-model limit nobody set never refuses a job (its GPUs
  still count as `nvidia.com/gpu`),
* the namespace ResourceQuotas (`ResourceQuotaBook`, charged per admitted job),
* the tenant queues (`FairQueue`: priority/FIFO, DRF across queues, aging, backfill,
  maxRunningJobs) with the cluster capacity (`capacity_of` per node, summed incrementally).

ElasticQuota, ResourceQuota, Queue, Node and ResourceClass changes are applied by `sync_*`
calls at the start of a cycle, so they take effect at the next cycle without a restart.
`epoch` grows whenever quota room may have grown (a job stopped, a quota or the cluster
changed): the loop wakes jobs parked for quota reasons then.

`status_patches()` returns the `ElasticQuota.status` (runtime/used/request), `Queue.status`
(pending, running, weighted share) and `ResourceQuota.status` (hard, used) writes as
`PatchStatus` decisions — at most one per object per call (the core asks once per cycle) and
only for objects whose numbers changed; `write_failed` makes the next call write again.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import cast

import structlog

from gpuyard.apis.core import Node
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.quotakinds import ElasticQuota, Queue, ResourceQuota
from gpuyard.apis.resourceclasses import ResourceClass, is_class_resource
from gpuyard.apis.scheduling import PodGroup
from gpuyard.scheduler.admission.priorities import RunningPriorities
from gpuyard.scheduler.admission.quota import (
    FairQueue,
    JobCharge,
    QueuedJob,
    QuotaBook,
    QuotaTree,
    ResourceQuotaBook,
    RunningJob,
    capacity_of,
    is_preemptible,
    queue_configs,
    queued_job,
    quota_of,
    resource_quota_usage,
    specs_from_quotas,
)
from gpuyard.scheduler.admission.quota.resources import Vector, add, quantities_of
from gpuyard.scheduler.cache.objects import ObjectCache
from gpuyard.scheduler.decisions import PatchStatus
from gpuyard.scheduler.gangs.outcomes import Refusal

__all__ = ["Admission", "ParkedMarks", "TrackedJob"]

log = structlog.get_logger(__name__)

Key = tuple[str, str]
VectorItems = tuple[tuple[str, int], ...]
JobShape = tuple[tuple[str, VectorItems, bool] | None, str, VectorItems]
"""What quota answers depend on for a waiting job: (quota charge, namespace, ResourceQuota usage)."""
ParkedMarks = tuple[QuotaTree, str, str, tuple[int, ...]]
"""(tree, the quota without room, the job's quota, `QuotaTree.marks` of both): `Admission.parked_marks`."""


@dataclass(slots=True)
class TrackedJob:
    """A live PodGroup as queue and quota see it (built once per generation)."""

    job: QueuedJob
    quota: str
    preemptible: bool
    rq_usage: Vector
    namespace: str
    generation: int
    labels: tuple[tuple[str, str], ...]
    started: float | None = None


class Admission:
    """Queues, quota tree and ResourceQuotas of one scheduling loop (see the module docstring)."""

    def __init__(self, objects: ObjectCache, *, writes_quota_used: bool = True) -> None:
        # False in delegate mode with a gang scheduler that maintains ElasticQuota `status.used`
        # itself (Koordinator, scheduler-plugins): one writer per field, so gpuyard leaves it alone
        self.writes_quota_used = writes_quota_used
        self.objects = objects
        self.tree = QuotaTree()
        self.quotas: QuotaBook[Key] = QuotaBook(self.tree)
        self.rqs = ResourceQuotaBook()
        self.queue = FairQueue()
        self.jobs: dict[Key, TrackedJob] = {}
        self._reclaim_view: dict[Key, RunningJob] = {}  # admitted, tracked jobs (`running_jobs`)
        self.running = RunningPriorities()
        """The running, tracked jobs by priority and quota (preemption's questions; kept by
        `_reindex`)."""
        self.queue.on_running = self._reindex
        self.epoch = 0
        self.has_queues = False
        self.has_quotas = False
        """Elastic quota admission applies once any ElasticQuota exists (before: placement alone)."""
        self._node_cap: dict[str, Vector] = {}
        self._total: Vector = {}
        self._classes: list[ResourceClass] = []
        self._written: dict[tuple[str, str, str], object] = {}
        self._wrote_all: dict[str, object] = {}  # per kind: the state whose statuses are all written
        self._sigs: dict[tuple[str, str, str], object] = {}
        self._shapes: dict[Key, tuple[TrackedJob, JobCharge | None, JobShape]] = {}  # `shape`, per job
        self._named_classes: frozenset[str] = frozenset()  # GPU classes some ElasticQuota names

    # --- configuration from the objects ------------------------------------------------------

    def load(
        self,
        *,
        nodes: Iterable[Node],
        classes: Iterable[ResourceClass],
        topologies: Mapping[str, NodeTopology],
    ) -> None:
        """Everything from a full LIST (start-up, re-list): keeps no job state."""
        kinds = set(self.objects.kinds())
        self.tree = QuotaTree()
        self.quotas = QuotaBook(self.tree)
        self.rqs = ResourceQuotaBook()
        self.queue = FairQueue()
        self.queue.on_running = self._reindex
        self.jobs.clear()
        self.running.clear()
        self._reclaim_view.clear()
        self._shapes.clear()
        self.has_quotas = False
        self._written.clear()
        self._wrote_all.clear()
        self._classes = list(classes)
        self._node_cap = {}
        self._total = {}
        for node in nodes:
            self._set_node(node, topologies.get(node.metadata.name))
        self._apply_total()
        if "ElasticQuota" in kinds:
            self.sync_quotas()
        if "ResourceQuota" in kinds:
            self.sync_resource_quotas()
        if "Queue" in kinds:
            self.sync_queues()
        self.epoch += 1

    def changed(self, kind: str, keys: Iterable[Key]) -> bool:
        """Whether any of these objects changed other than in its status (our own writes echo back)."""
        found = False
        for ns, name in keys:
            obj = self.objects.get(kind, ns, name)
            meta = obj.metadata if obj is not None else None
            sig = (
                None
                if meta is None
                else (
                    meta.generation,
                    tuple(sorted(meta.labels.items())),
                    tuple(sorted(meta.annotations.items())),
                )
            )
            if self._sigs.get((kind, ns, name), 0) != sig:
                self._sigs[(kind, ns, name)] = sig
                found = True
        return found

    def sync_quotas(self) -> None:
        """The ElasticQuota objects changed: new tree structure, jobs re-charged where their quota moved."""
        specs = specs_from_quotas(self.objects.list_of(ElasticQuota))
        self._wrote_all.clear()
        self.has_quotas = bool(specs)
        named = frozenset(
            r
            for spec in specs
            for r in (*spec.min, *spec.max, *(spec.shared_weight or {}))
            if is_class_resource(r)
        )
        recount, self._named_classes = named != self._named_classes, named
        self.tree.set_quotas(specs)
        if recount:
            self._apply_total(force=True)
        for key, t in self.jobs.items():
            quota = quota_of(dict(t.labels), t.namespace, tree=self.tree)
            if quota != t.quota or recount:
                self._retrack(key, t, quota=quota)
        self.epoch += 1

    def quota_usage(self, request: Mapping[str, int]) -> Vector:
        """What a job's request charges to the quota tree: GPU classes no quota names are left
        out (their GPUs count as `nvidia.com/gpu` all the same)."""
        named = self._named_classes
        return {r: a for r, a in request.items() if r in named or not is_class_resource(r)}

    def sync_resource_quotas(self) -> None:
        self.rqs.set_quotas(self.objects.list_of(ResourceQuota))
        self.epoch += 1

    def sync_queues(self) -> None:
        queues = self.objects.list_of(Queue)
        self.has_queues = bool(queues)
        self._wrote_all.clear()
        self.queue.set_queues(queue_configs(queues))
        self.epoch += 1

    def sync_classes(
        self,
        classes: Iterable[ResourceClass],
        *,
        nodes: Iterable[Node],
        topologies: Mapping[str, NodeTopology],
    ) -> None:
        """ResourceClasses changed: every node's per-class capacity is counted again."""
        self._classes = list(classes)
        self._node_cap = {}
        self._total = {}
        for node in nodes:
            self._set_node(node, topologies.get(node.metadata.name))
        self._apply_total()

    def node_changed(self, name: str, node: Node | None, topology: NodeTopology | None) -> None:
        """One node was added, changed or removed: its share of the capacity is recounted."""
        old = self._node_cap.pop(name, None)
        if old:
            add(self._total, old, sign=-1)
        if node is not None:
            self._set_node(node, topology)
        self._apply_total()

    def _set_node(self, node: Node, topology: NodeTopology | None) -> None:
        topologies = {node.metadata.name: topology} if topology is not None else None
        cap = capacity_of([node], classes=self._classes, topologies=topologies)
        if cap:
            self._node_cap[node.metadata.name] = cap
            add(self._total, cap)

    def _apply_total(self, *, force: bool = False) -> None:
        total = {k: v for k, v in self._total.items() if v > 0}
        if total != self.queue.capacity or force:
            self.tree.set_total(self.quota_usage(total))
            self.queue.set_capacity(total)
            self.epoch += 1

    # --- jobs --------------------------------------------------------------------------------

    def _tracked(self, pg: PodGroup) -> TrackedJob:
        meta = pg.metadata
        key = (meta.namespace, meta.name)
        known = self.jobs.get(key)
        labels = tuple(sorted(meta.labels.items()))
        if known is not None and known.generation == meta.generation and known.labels == labels:
            return known
        job = queued_job(pg)
        n_pods = pg.spec.total_replicas()
        t = TrackedJob(
            job=job,
            quota=quota_of(meta.labels, meta.namespace, tree=self.tree),
            preemptible=is_preemptible(meta.labels),
            rq_usage=resource_quota_usage(job.request, pods=n_pods, kind=pg.spec.job_kind or ""),
            namespace=meta.namespace,
            generation=meta.generation,
            labels=labels,
            started=known.started if known is not None else None,
        )
        if known is not None:
            admitted = self.quotas.charge(key)
            self._retrack(key, t, quota=t.quota, admitted=bool(admitted and admitted.admitted))
        else:
            self.jobs[key] = t
            self.quotas.track(
                key, quota=t.quota, usage=self.quota_usage(job.request), preemptible=t.preemptible
            )
            self._reindex(key)
        return t

    def _retrack(self, key: Key, t: TrackedJob, *, quota: str, admitted: bool | None = None) -> None:
        charge = self.quotas.charge(key)
        if admitted is None:
            admitted = bool(charge and charge.admitted)
        t.quota = quota
        self.jobs[key] = t
        self.quotas.track(
            key,
            quota=quota,
            usage=self.quota_usage(t.job.request),
            preemptible=t.preemptible,
            admitted=admitted,
        )
        self._reindex(key)
        if admitted:
            self.rqs.charge(key, t.namespace, t.rq_usage)

    def _reindex(self, key: Hashable) -> None:
        """`key` started or stopped running, was admitted or released, its start time or its
        tracked job was replaced: `running` and the reclaim view (`running_jobs`) follow."""
        k = cast(Key, key)
        t = self.jobs.get(k)
        if t is not None and self.queue.is_running(k):
            self.running.set(k, t.job.priority, t.quota)
        else:
            self.running.set(k, None)
        charge = self.quotas.charge(k)
        if t is None or charge is None or not charge.admitted:
            self._reclaim_view.pop(k, None)
            return
        self._reclaim_view[k] = RunningJob(
            key=k,
            quota=charge.quota,
            priority=t.job.priority,
            start_time=t.started or 0.0,
            usage=charge.usage,
            preemptible=charge.preemptible,
        )

    def enqueue(self, pg: PodGroup) -> QueuedJob:
        """A PodGroup with no placement waits: tracked (its demand joins the request) and queued."""
        t = self._tracked(pg)
        key = (pg.metadata.namespace, pg.metadata.name)  # = t.job.key
        if self.queue.is_running(key):
            self.requeue(key)
        else:
            self.queue.add(t.job)
        return t.job

    def ensure_running(self, pg: PodGroup, *, now: float) -> None:
        """A PodGroup found holding reservations (placed by us earlier, or after a re-list)."""
        t = self._tracked(pg)
        key = (pg.metadata.namespace, pg.metadata.name)  # = t.job.key
        if self._admit(key, t):
            self.rqs.charge(key, t.namespace, t.rq_usage)
        if not self.queue.is_running(key):
            self.queue.add_running(t.job, start=now)
            t.started = now
        self._reindex(key)

    def _admit(self, key: Key, t: TrackedJob) -> bool:
        """Charge the job to its quota as admitted; True if it was not admitted before."""
        charge = self.quotas.charge(key)
        if charge is None or charge.admitted:
            return False
        self.quotas.track(
            key,
            quota=t.quota,
            usage=self.quota_usage(t.job.request),
            preemptible=t.preemptible,
            admitted=True,
        )
        self._reindex(key)
        return True

    def check(self, key: Key) -> Refusal | None:
        """None if quota and ResourceQuotas let the waiting job start now, else the first cause."""
        t = self.jobs.get(key)
        if t is None:
            return None
        reason = self.quotas.check(key) if self.has_quotas else None
        if reason is not None:
            return Refusal("QuotaExceeded", reason)
        reason = self.rqs.check(t.namespace, t.rq_usage)
        return Refusal("ResourceQuotaExceeded", reason) if reason is not None else None

    def allows(self, key: Key) -> bool:
        """Whether `check` says yes, without building its message (quota parking asks this
        once per shape and change)."""
        t = self.jobs.get(key)
        if t is None:
            return True
        if self.has_quotas and not self.quotas.allows(key):
            return False
        return self.rqs.check(t.namespace, t.rq_usage) is None

    def parked_marks(self, key: Key) -> ParkedMarks | None:
        """While quota blocks the waiting job and reclaim cannot help it (not owed): what that
        depends on (the quota without room, the job's quota, their `QuotaTree.marks`), for
        `still_parked`. None when the job may start, may be owed, or ResourceQuotas alone block it."""
        charge = self.quotas.charge(key)
        if not self.has_quotas or key not in self.jobs or charge is None or charge.admitted:
            return None
        cause = self.quotas.cause(key)
        if cause is None or cause[0] not in ("excess", "min", "max") or self.owed(key):
            return None
        blocker = cause[1]
        return (self.tree, blocker, charge.quota, self.tree.marks(blocker, charge.quota))

    def still_parked(self, key: Key, marks: ParkedMarks) -> bool:
        """Whether `parked_marks` would still say the job stays parked: its quota's usage and
        the blocking quota's did not go down and no runtime or min changed since `marks`."""
        tree, blocker, quota, seen = marks
        charge = self.quotas.charge(key)
        return (
            tree is self.tree
            and self.has_quotas
            and key in self.jobs
            and charge is not None
            and not charge.admitted
            and charge.quota == quota
            and tree.marks(blocker, quota) == seen
        )

    def never_fits(self, key: Key, never: bool) -> bool:
        """Whether the waiting job can never be placed on this cluster as it is: then its demand
        leaves its quota's request (it must not squeeze the runtime of quotas whose jobs could
        run), and comes back once the cluster changes so that it could. Whether that changed
        the request."""
        if self.quotas.count_demand(key, not never):
            self.epoch += 1  # other quotas' runtimes may have grown
            return True
        return False

    def shape(self, key: Key) -> JobShape | None:
        """What `check` and `owed` depend on besides the quota state: jobs of equal shape get
        the same answers until the state changes (the loop checks one per shape per state)."""
        t = self.jobs.get(key)
        if t is None:
            return None
        charge = self.quotas.charge(key) if self.has_quotas else None
        if charge is not None and charge.admitted:
            return None
        known = self._shapes.get(key)  # a new TrackedJob or JobCharge replaces the old ones
        if known is not None and known[0] is t and known[1] is charge:
            return known[2]
        quota = (charge.quota, tuple(sorted(charge.usage.items())), charge.preemptible) if charge else None
        shape = (quota, t.namespace, tuple(sorted(t.rq_usage.items())))
        self._shapes[key] = (t, charge, shape)
        return shape

    def start(self, key: Key, *, now: float) -> None:
        """The job was placed: admitted (even a gang-group member that was not checked itself)."""
        t = self.jobs.get(key)
        if t is None:
            return
        self._admit(key, t)
        self.rqs.charge(key, t.namespace, t.rq_usage)
        if not self.queue.is_running(key):
            if key in self.queue or self.queue.is_held(key):
                self.queue.start(key, now=now)
            else:
                self.queue.add_running(t.job, start=now)
        t.started = now
        self._reindex(key)

    def requeue(self, key: Key) -> None:
        """The job lost its placement (preempted, un-assumed) and waits again, keeping its place."""
        self.quotas.release(key)
        self.rqs.uncharge(key)
        self.queue.requeue(key)
        t = self.jobs.get(key)
        if t is not None:
            t.started = None
        self._reindex(key)
        self.epoch += 1

    def forget(self, key: Key) -> None:
        """The job is gone or suspended."""
        self._shapes.pop(key, None)
        if self.jobs.pop(key, None) is None:
            return
        self._reindex(key)
        self.quotas.forget(key)
        self.rqs.uncharge(key)
        self.queue.remove(key)
        self.queue.finish(key)
        self.epoch += 1

    def running_jobs(self) -> list[RunningJob]:
        """Admitted jobs as reclaim sees them (kept per job by `_reindex`, not built per call)."""
        return list(self._reclaim_view.values())

    @property
    def tenancy(self) -> bool:
        """Quotas or queues are configured: waiting jobs are told their queue position and share."""
        return self.has_quotas or self.has_queues

    def owed(self, key: Key) -> bool:
        """The waiting job fits within its quota's min and runtime (so reclaim may help it)."""
        charge = self.quotas.charge(key)
        if not self.has_quotas or charge is None or charge.admitted or not charge.usage:
            return False
        tree = self.tree
        if charge.quota not in tree or not tree.is_attached(charge.quota):
            return False
        # every dimension counts: within the min where the quota has one, within the runtime
        # always; nothing it asks for is guaranteed: nothing to take back
        return tree.owed(charge.quota, charge.usage)

    # --- statuses ----------------------------------------------------------------------------

    def status_patches(self) -> list[PatchStatus]:
        """Quota, queue and ResourceQuota statuses that changed, as writes to make."""
        store, kinds = self.objects, set(self.objects.kinds())
        out: list[PatchStatus] = []
        if "ElasticQuota" in kinds:
            self.tree.refresh()
        # Statuses are functions of the tree (or the queue counts): unchanged since every one was
        # written, there is nothing to write (a failed write makes the next call look again).
        tree = self.tree
        if "ElasticQuota" in kinds and self._wrote_all.get("ElasticQuota") != (tree, tree.version):
            written = self._written
            touched = tree.take_touched()  # the others' vectors are as last compared (and written)
            for eq in store.list_of(ElasticQuota):
                meta = eq.metadata
                name = meta.name
                wkey = (eq.kind, meta.namespace, name)
                if touched is not None and name not in touched and wkey in written:
                    continue
                if name not in tree:
                    continue
                runtime, used, request = numbers = tree.vectors(name)
                if written.get(wkey) == numbers:  # the vectors as last written (copies)
                    continue
                written[wkey] = (dict(runtime), dict(used), dict(request))
                vectors = {"runtime": runtime, "request": request}
                if self.writes_quota_used:
                    vectors["used"] = used
                self._patch(out, eq, {n: quantities_of(x) for n, x in vectors.items()})
            self._wrote_all["ElasticQuota"] = (tree, tree.version)
        counts = self.queue_counts() if "Queue" in kinds else None
        last = self._wrote_all.get("Queue")
        if counts is not None and last != counts:
            # queues whose counts are those of the last pass have their statuses written already
            moved = (
                {n for n in counts.keys() | last.keys() if counts.get(n) != last.get(n)}
                if isinstance(last, dict)
                else None
            )
            for q in store.list_of(Queue):
                if (
                    moved is not None
                    and q.metadata.name not in moved
                    and (q.kind, q.metadata.namespace, q.metadata.name) in self._written
                ):
                    continue
                pending, running, share = counts.get(q.metadata.name, (0, 0, 0.0))
                share = round(share, 4)
                if self._changed(q, (pending, running, share)):
                    self._patch(out, q, {"pending": pending, "running": running, "share": share})
            self._wrote_all["Queue"] = counts
        if "ResourceQuota" in kinds:
            for rq in store.list_of(ResourceQuota):
                used = self.rqs.used(rq.metadata.namespace, rq.metadata.name)
                if self._changed(rq, tuple(sorted(used.items()))):
                    changes: dict[str, object] = {
                        "hard": dict(rq.spec.hard),
                        "used": {k: _quantity(k, v) for k, v in used.items()},
                    }
                    self._patch(out, rq, changes)
        return out

    def write_failed(self, kind: str, namespace: str, name: str) -> None:
        """A status write was refused (gone, or an error): the next call writes it again."""
        self._written.pop((kind, namespace, name), None)
        self._wrote_all.pop(kind, None)

    def queue_counts(self) -> dict[str, tuple[int, int, float]]:
        """Per queue: pending (ready or set aside), running, weighted dominant share."""
        return {q: (p, r, self.queue.share(q)) for q, (p, r) in self.queue.counts().items()}

    def _changed(self, obj: ElasticQuota | Queue | ResourceQuota, numbers: tuple[object, ...]) -> bool:
        """Whether `obj`'s status numbers differ from those last written (noted as written now)."""
        meta = obj.metadata
        wkey = (obj.kind, meta.namespace, meta.name)
        if self._written.get(wkey) == numbers:
            return False
        self._written[wkey] = numbers
        return True

    def _patch(
        self, out: list[PatchStatus], obj: ElasticQuota | Queue | ResourceQuota, changes: dict[str, object]
    ) -> None:
        """Patch the fields of `obj`'s status that differ from `changes`."""
        status, meta = obj.status, obj.metadata
        changes = {k: v for k, v in changes.items() if getattr(status, k) != v}
        if changes:
            out.append(PatchStatus(obj.kind, meta.namespace, meta.name, changes))


def _quantity(key: str, amount: int) -> object:
    res = key.removeprefix("requests.").removeprefix("limits.")
    return quantities_of({res: amount})[res]
