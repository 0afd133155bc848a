"""What the rescheduler reads from the scheduler's state, as the planner's plain data.

`rescheduler.py` calls these at the start of a run; `plans.py` plans from what they return. All
read the cluster cache (objects and snapshot) and the recorded statuses; none changes anything.

* :func:`node_rooms`: per Ready, schedulable, untainted node its free whole GPUs, CPU and memory;
* :func:`waiting_jobs`: PodGroups with nothing placed whose last attempt failed for room
  (`Unschedulable`, not quota) at least `min_wait` seconds ago, whose pods all ask for the same
  several whole GPUs on any node (no node selector, affinity, toleration, host network or GPU
  class);
* :func:`movable_jobs`: placed PodGroups whose pods all hold whole GPUs on one node without
  NICs or host ports, complete, with nothing being evicted or moved, not annotated
  `gpuyard.io/migratable: "false"`, without pod affinity / topology spread rules of their own or
  labels a running pod's required anti-affinity matches (the moves do not check those rules),
  and not moved too often, with the cost of moving them:
  GPUs x time since the last checkpoint (`gpuyard.io/checkpoint-interval`), else since they were
  placed or last moved.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from datetime import datetime
from decimal import Decimal

import numpy as np

from gpuyard.apis.core import GPU_RESOURCE, PodSpec
from gpuyard.apis.durations import parse_duration
from gpuyard.apis.podplacement import has_rules
from gpuyard.apis.quantity import to_int, to_milli
from gpuyard.apis.scheduling import PodGroup, Reservation
from gpuyard.scheduler.admission.recording import Recorder, is_complete
from gpuyard.scheduler.cache.cluster import ClusterCache
from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.gangs.requests import GPU_MILLI, MIB
from gpuyard.scheduler.rescheduling.plans import Mover, MoverPod, NodeRoom, Waiting, migration_cost

__all__ = [
    "ANNOTATION_CHECKPOINT_INTERVAL",
    "ANNOTATION_MIGRATABLE",
    "NEXT_SUFFIX",
    "movable_jobs",
    "node_rooms",
    "waiting_jobs",
]

Key = tuple[str, str]
ANNOTATION_MIGRATABLE = "gpuyard.io/migratable"
ANNOTATION_CHECKPOINT_INTERVAL = "gpuyard.io/checkpoint-interval"
NEXT_SUFFIX = ".next"
"""A migrating pod's new Reservation is `<pod>.next` until the old one is gone."""


def waiting_jobs(
    cache: ClusterCache, recorder: Recorder, *, utcnow: datetime, min_wait: float, skip: Container[Key] = ()
) -> list[tuple[Waiting, int]]:
    """Jobs waiting on room (not quota) for `min_wait` seconds or more whose pods each need
    several whole GPUs, with their priority: highest priority first, then the longest waiting."""
    out: list[tuple[float, str, Waiting, int]] = []
    for pg in cache.objects.list_of(PodGroup):
        key = (pg.metadata.namespace, pg.metadata.name)
        if pg.spec.suspend or key in skip or cache.snapshot.placed_pods(key):
            continue
        view = recorder.view(pg)
        if view.reason != "Unschedulable":
            continue
        queued = view.queued_at or pg.status.queued_at or pg.metadata.creation_timestamp
        waited = (utcnow - queued).total_seconds() if queued is not None else 0.0
        if waited < min_wait:
            continue
        shape = _pod_shape(pg)
        if shape is None or shape[0] < 2:
            continue
        gpus, cpu, mem = shape
        pods = max(1, pg.spec.minimum())
        out.append(
            (
                -waited,
                pg.metadata.name,
                Waiting(key, gpus=gpus, pods=pods, cpu=cpu, mem=mem),
                pg.spec.priority,
            )
        )
    out.sort(key=lambda t: (-t[3], t[0], t[1]))
    return [(w, prio) for _, _, w, prio in out]


def movable_jobs(
    cache: ClusterCache,
    recorder: Recorder,
    *,
    utcnow: datetime,
    moved_too_often: Callable[[Key], bool],
    moved_at: Mapping[Key, datetime],
) -> list[tuple[Mover, int]]:
    """Placed jobs that may move (see the module docstring), with their cost and priority;
    `moved_at`: when the rescheduler last moved a job (its run starts again then)."""
    out = []
    anti = {term for entry in cache.snapshot.ledger.anti_entries() for term in entry.anti}
    for pg in cache.objects.list_of(PodGroup):
        key = (pg.metadata.namespace, pg.metadata.name)
        meta = pg.metadata
        if meta.annotations.get(ANNOTATION_MIGRATABLE, meta.labels.get(ANNOTATION_MIGRATABLE)) == "false":
            continue
        if any(has_rules(role.template) for role in pg.spec.roles):
            continue  # its pods' affinity / spread rules: a move does not check them
        if moved_too_often(key) or pg.spec.suspend:
            continue
        held = cache.snapshot.placed_pods(key)
        if not held or len(set(held.values())) != 1 or not is_complete(pg, held):
            continue
        if recorder.view(pg).evictions or any(p.endswith(NEXT_SUFFIX) for p in held):
            continue
        pods = []
        for pod in held:
            res = cache.objects.get_of(Reservation, key[0], pod)
            if not isinstance(res, Reservation) or not _movable(res):
                break
            if any(term.matches(key[0], res.metadata.labels) for term in anti):
                break  # a running pod's required anti-affinity is about it: a move could break it
            req = res.spec.requests
            pods.append(
                MoverPod(
                    pod,
                    res.spec.node,
                    tuple(res.spec.gpus),
                    cpu=to_milli(req.get("cpu", Decimal(0))),
                    mem=-(-to_int(req.get("memory", Decimal(0))) // MIB),
                )
            )
        else:
            gpus = sum(len(p.gpus) for p in pods)
            started = recorder.view(pg).placed_at or pg.status.placed_at
            moved = moved_at.get(key)
            if moved is not None and (started is None or moved > started):
                started = moved
            runtime = (utcnow - started).total_seconds() if started is not None else 0.0
            interval = _interval(pg)
            cost = migration_cost(gpus=gpus, runtime_s=runtime, checkpoint_interval_s=interval)
            out.append((Mover(key, tuple(pods), cost), pg.spec.priority))
    return out


def _movable(res: Reservation) -> bool:
    spec = res.spec
    return bool(spec.gpus) and not spec.nics and not spec.host_ports and spec.gpu_milli in (0, GPU_MILLI)


def _interval(pg: PodGroup) -> float | None:
    raw = pg.metadata.annotations.get(ANNOTATION_CHECKPOINT_INTERVAL)
    if not raw:
        return None
    try:
        value = parse_duration(raw)
    except ValueError:
        return None
    return value if value > 0 else None


def _pod_shape(pg: PodGroup) -> tuple[int, int, int] | None:
    """(GPUs, CPU milli, memory MiB) of every pod, when all pods ask for the same whole GPUs on
    any node (no selectors, affinity or tolerations); None otherwise."""
    shapes = set()
    for role in pg.spec.roles:
        if role.replicas == 0:
            continue
        spec: PodSpec = role.template
        if spec.node_selector or spec.affinity is not None or spec.tolerations or spec.host_network:
            return None
        gpus = cpu = mem = 0
        for c in spec.containers:
            res = c.resources
            merged = {**res.limits, **res.requests}
            gpus += to_int(res.limits.get(GPU_RESOURCE, res.requests.get(GPU_RESOURCE, Decimal(0))))
            cpu += to_milli(merged.get("cpu", Decimal(0)))
            mem += -(-to_int(merged.get("memory", Decimal(0))) // MIB)
            if any("/" in name and name != GPU_RESOURCE for name in res.limits):
                return None  # class or other extended requests: left alone
        shapes.add((gpus, cpu, mem))
    return shapes.pop() if len(shapes) == 1 else None


def node_rooms(snap: Snapshot) -> dict[str, NodeRoom]:
    """Free whole GPUs, CPU and memory of every Ready, schedulable, untainted node."""
    ok = snap.alive & snap.ready & snap.schedulable & ~snap.tainted
    out = {}
    for row in np.flatnonzero(ok):
        name = snap.names[row]
        if name is None:
            continue
        free = np.flatnonzero(snap.gpu_healthy[row] & (snap.gpu_free_milli[row] >= GPU_MILLI))
        out[name] = NodeRoom(
            name,
            tuple(int(i) for i in free),
            int(snap.gpu_healthy_count[row]),
            cpu_free=int(snap.cpu_free[row]),
            mem_free=int(snap.mem_free[row]),
        )
    return out
