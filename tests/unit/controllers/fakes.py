"""Test doubles for the job operator: a tiny gang "scheduler", a scriptable backend, job loaders.

* :func:`reserve` places a job's replicas on named nodes with plain data (golden tests).
* :class:`TinyScheduler` is a reconciler that does what the real scheduler promises in the
  contract (`gpuyard.apis.scheduling`): it deletes exactly the Reservations named in
  `spec.release` and those of a PodGroup that is gone, and for a PodGroup that is not suspended
  creates the missing Reservations of the whole gang in one synchronous step, GPUs first-fit per
  node, host ports round-robin from the range, preferring `spec.preferredNodes`; :func:`evict`
  preempts as the scheduler does (`status.evictions`, Reservations kept).
* :class:`ScriptedBackend` is a `ClusterBackend` whose pods change phase only when a test says
  so; its :class:`ScriptedWriter` (the write path) can refuse pod creates.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

from gpuyard.apis.core import GPU_RESOURCE, Pod, PodStatus
from gpuyard.apis.jobkinds import KIND_INFO, TrainingJob
from gpuyard.apis.jobs import load_documents, parse_job
from gpuyard.apis.meta import ObjectMeta, OwnerReference, Resource
from gpuyard.apis.quantity import to_int
from gpuyard.apis.scheduling import (
    GROUP,
    LABEL_JOB_NAME,
    LABEL_REPLICA_INDEX,
    LABEL_REPLICA_TYPE,
    PodGroup,
    Reservation,
    ReservationSpec,
    pod_name,
)
from gpuyard.fakecluster.kubelet import terminate
from gpuyard.state.backend import BackendError
from gpuyard.state.store import AlreadyExists, Store
from gpuyard.state.workqueues import ObjectKey, Requeue, Watch
from gpuyard.state.writing import StoreWriter

R = TypeVar("R", bound=Resource)

ROOT = Path(__file__).resolve().parents[3]
JOBS = ROOT / "configs" / "jobs"


def load_job(name: str, *, host_network: bool = False, namespace: str | None = None) -> TrainingJob:
    """A job from `configs/jobs/<name>.yaml`, parsed and defaulted as the API does."""
    (doc,) = load_documents((JOBS / f"{name}.yaml").read_text())
    if host_network:
        doc.setdefault("metadata", {}).setdefault("annotations", {})["kubedl.io/network-mode"] = "host"
    if namespace is not None:
        doc["metadata"]["namespace"] = namespace
    return parse_job(doc)


def job_from(doc: dict[str, Any]) -> TrainingJob:
    return parse_job(doc)


def tf_job(
    name: str = "tf",
    *,
    ns: str = "team-a",
    ps: int = 1,
    workers: int = 2,
    policy: str = "ExitCode",
    **run: Any,
) -> TrainingJob:
    spec: dict[str, Any] = {
        "tfReplicaSpecs": {
            "PS": {
                "replicas": ps,
                "restartPolicy": policy,
                "template": {"spec": {"containers": [{"name": "tensorflow", "image": "tf"}]}},
            },
            "Worker": {
                "replicas": workers,
                "restartPolicy": policy,
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "tensorflow",
                                "image": "tf",
                                "resources": {"limits": {"nvidia.com/gpu": 1}},
                            }
                        ]
                    }
                },
            },
        },
        **run,
    }
    if not ps:
        del spec["tfReplicaSpecs"]["PS"]
    return job_from(
        {
            "apiVersion": "training.kubedl.io/v1alpha1",
            "kind": "TFJob",
            "metadata": {"name": name, "namespace": ns},
            "spec": spec,
        }
    )


def gpus_of(job: TrainingJob, role: str) -> int:
    return to_int(job.replica_specs[role].template.spec.requests().get(GPU_RESOURCE, Decimal(0)))


def reserve(
    job: TrainingJob, *, nodes: tuple[str, ...] = ("node-a", "node-b"), port_base: int = 20000
) -> dict[str, Reservation]:
    """Place every replica round-robin over `nodes`, GPUs first-fit, host ports from `port_base`."""
    out: dict[str, Reservation] = {}
    next_gpu = dict.fromkeys(nodes, 0)
    k = 0
    for role in job.roles():
        for index in range(job.replica_specs[role].count):
            node = nodes[k % len(nodes)]
            n = gpus_of(job, role)
            gpus = list(range(next_gpu[node], next_gpu[node] + n))
            next_gpu[node] += n
            name = pod_name(job.metadata.name, role, index)
            out[name] = Reservation(
                metadata=ObjectMeta(
                    name=name,
                    namespace=job.metadata.namespace,
                    labels={
                        LABEL_JOB_NAME: job.metadata.name,
                        LABEL_REPLICA_TYPE: role.lower(),
                        LABEL_REPLICA_INDEX: str(index),
                    },
                ),
                spec=ReservationSpec(
                    pod_group=job.metadata.name,
                    role=role,
                    index=index,
                    node=node,
                    gpus=gpus,
                    gpu_ids=[f"GPU-{node}-{g}" for g in gpus],
                    gpu_milli=1000 if gpus else 0,
                    host_ports=[port_base + k] if job.host_network else [],
                ),
            )
            k += 1
    return out


class TinyScheduler:
    """Places PodGroups the simplest way that honours the contract (whole gang, one step).

    Per PodGroup: collects the Reservations of a PodGroup that is gone (or was recreated),
    deletes exactly the Reservations named in `spec.release`, clears `status.evictions` entries
    whose Reservations are gone, and places every replica without one (not while evicted).
    """

    name = "tiny-scheduler"
    concurrency = 1
    watches = (Watch("PodGroup"), Watch("Reservation", lambda r: ((r.metadata.namespace, r.spec.pod_group),)))

    def __init__(self, store: Store, *, port_range: tuple[int, int] = (20000, 30000)) -> None:
        self.store = store
        self.port_range = port_range
        self.next_port = port_range[0]
        self.placements = 0
        self.hold = False  # tests set this to keep gangs queued
        self.max_placements: int | None = None  # stop placing after this many gangs

    def _free_gpus(self, node: str) -> list[int]:
        n = self.store.must_get("Node", "", node)
        total = to_int(n.status.allocatable.get(GPU_RESOURCE, Decimal(0)))  # type: ignore[attr-defined]
        used: set[int] = set()
        for r in self.store.list("Reservation"):
            if r.spec.node == node:  # type: ignore[attr-defined]
                used.update(r.spec.gpus)  # type: ignore[attr-defined]
        raw = n.metadata.annotations.get("gpuyard.io/unhealthy-gpus", "")
        used.update(int(x) for x in raw.split(",") if x.strip().isdigit())
        return [g for g in range(total) if g not in used]

    def _port(self) -> int:
        port = self.next_port
        self.next_port = port + 1 if port < self.port_range[1] else self.port_range[0]
        return port

    def _collect(self, pg: PodGroup | None, ns: str, name: str) -> dict[str, Reservation]:
        """Delete what the PodGroup no longer holds; return the Reservations it keeps."""
        kept: dict[str, Reservation] = {}
        for r in self.store.list("Reservation", namespace=ns, selector={LABEL_JOB_NAME: name}):
            assert isinstance(r, Reservation)
            owners = [o.uid for o in r.metadata.owner_references if o.kind == "PodGroup"]
            gone = pg is None or (owners and pg.metadata.uid not in owners)
            if gone or (pg is not None and pg.spec.release.get(r.metadata.name) == r.metadata.uid):
                self.store.delete("Reservation", ns, r.metadata.name)
            else:
                kept[r.metadata.name] = r
        if pg is not None and pg.status.evictions:
            left = {p: why for p, why in pg.status.evictions.items() if p in kept}
            if left != pg.status.evictions:
                self.store.mutate("PodGroup", ns, name, lambda p: setattr(p.status, "evictions", left))
        return kept

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        ns, name = key
        pg = self.store.get("PodGroup", *key)
        assert pg is None or isinstance(pg, PodGroup)
        have = self._collect(pg, ns, name)
        if pg is None or self.hold:
            return None
        pg = self.store.must_get("PodGroup", *key)
        assert isinstance(pg, PodGroup)
        if pg.spec.suspend:
            if pg.status.phase != "Suspended":
                self.store.mutate("PodGroup", *key, lambda p: setattr(p.status, "phase", "Suspended"))
            return None
        if self.max_placements is not None and self.placements >= self.max_placements:
            return None
        nodes = [n.metadata.name for n in self.store.list("Node") if n.ready]  # type: ignore[attr-defined]
        free = {n: self._free_gpus(n) for n in nodes}
        plan: list[Reservation] = []
        for role in pg.spec.roles:
            want = to_int(role.template.requests().get(GPU_RESOURCE, Decimal(0)))
            for index in range(role.replicas):
                pname = pod_name(name, role.name, index)
                if pname in have or pname in pg.status.evictions:
                    continue
                preferred = pg.spec.preferred_nodes.get(pname)
                order = ([preferred] if preferred in free else []) + [n for n in nodes if n != preferred]
                node = next((n for n in order if len(free[n]) >= want), None)
                if node is None:
                    self.store.mutate("PodGroup", *key, _pending(f"no node has {want} free GPUs for {pname}"))
                    return None
                gpus, free[node] = free[node][:want], free[node][want:]
                ports = [self._port() for _ in range(role.host_ports)]
                plan.append(
                    Reservation(
                        metadata=ObjectMeta(
                            name=pname,
                            namespace=ns,
                            labels={
                                LABEL_JOB_NAME: name,
                                LABEL_REPLICA_TYPE: role.name.lower(),
                                LABEL_REPLICA_INDEX: str(index),
                            },
                            owner_references=[
                                OwnerReference(
                                    api_version=GROUP, kind="PodGroup", name=name, uid=pg.metadata.uid
                                )
                            ],
                        ),
                        spec=ReservationSpec(
                            pod_group=name,
                            role=role.name,
                            index=index,
                            node=node,
                            gpus=gpus,
                            gpu_ids=[f"GPU-{node}-{g}" for g in gpus],
                            gpu_milli=1000 if gpus else 0,
                            host_ports=ports,
                        ),
                    )
                )
        if not plan:
            if pg.status.phase != "Placed" and have and not pg.status.evictions:
                self.store.mutate("PodGroup", *key, _placed)
            return None
        for res in plan:  # the assume: all in one synchronous step
            self.store.create(res)
        self.placements += 1
        self.store.mutate("PodGroup", *key, _placed)
        return None


def _pending(message: str):  # type: ignore[no-untyped-def]
    def change(pg: PodGroup) -> None:
        pg.status.phase = "Pending"
        pg.status.reason = "Unschedulable"
        pg.status.message = message

    return change


def _placed(pg: PodGroup) -> None:
    pg.status.phase = "Placed"
    pg.status.reason = ""
    pg.status.message = ""


def evict(store: Store, ns: str, name: str, pods: dict[str, str]) -> None:
    """What the scheduler does to preempt: ask for the pods to stop, keep their Reservations."""

    def change(pg: PodGroup) -> None:
        pg.status.evictions = {**pg.status.evictions, **pods}
        pg.status.phase = "Pending"
        pg.status.reason = "Preempted"
        pg.status.message = "; ".join(sorted(set(pods.values())))

    store.mutate("PodGroup", ns, name, change)


class ScriptedWriter(StoreWriter):
    """The write path of :class:`ScriptedBackend`: records every write (`writes`: operation, kind,
    name) and refuses the next `fail_creates` pod creates."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.fail_creates = 0
        self.writes: list[tuple[str, str, str]] = []

    def foreign_writes(self) -> list[tuple[str, str, str]]:
        """Writes the operator must never make: Reservations, PodGroup status, pods' status or
        spec, a job's spec (the user's)."""
        return [
            w
            for w in self.writes
            if w[1] == "Reservation"
            or (w[0] == "patch_status" and w[1] in ("PodGroup", "Pod"))
            or (w[0] == "update" and (w[1] == "Pod" or w[1] in KIND_INFO))
        ]

    async def create(self, obj: R) -> R:
        self.writes.append(("create", obj.kind, obj.metadata.name))
        if isinstance(obj, Pod):
            if self.fail_creates > 0:
                self.fail_creates -= 1
                raise BackendError(f"pod {obj.metadata.name}: admission webhook denied the request")
            try:
                return await super().create(obj.model_copy(update={"status": PodStatus(phase="Pending")}))
            except AlreadyExists as exc:
                raise BackendError(str(exc)) from None
        return await super().create(obj)

    async def update(self, obj: R) -> R:
        self.writes.append(("update", obj.kind, obj.metadata.name))
        return await super().update(obj)

    async def patch_status(
        self,
        kind: str,
        namespace: str,
        name: str,
        changes: Mapping[str, Any],
        *,
        resource_version: str | None = None,
    ) -> Resource:
        self.writes.append(("patch_status", kind, name))
        return await super().patch_status(kind, namespace, name, changes, resource_version=resource_version)

    async def delete(
        self, kind: str, namespace: str, name: str, *, resource_version: str | None = None
    ) -> None:
        self.writes.append(("delete", kind, name))
        await super().delete(kind, namespace, name, resource_version=resource_version)


class ScriptedBackend:
    """A ClusterBackend whose pods stay Pending until the test moves them."""

    name = "scripted"

    def __init__(self, store: Store) -> None:
        self.store = store
        self.synced = asyncio.Event()
        self.synced.set()
        self.writer = ScriptedWriter(store)

    async def run(self) -> None:  # pragma: no cover - not used by the tests
        await asyncio.Event().wait()

    # --- moving pods ---------------------------------------------------------------------------

    def set_phase(self, namespace: str, name: str, phase: str) -> None:
        def change(p: Pod) -> None:
            p.status.phase = phase  # type: ignore[assignment]

        self.store.mutate("Pod", namespace, name, change)

    def run_all(self, namespace: str, job: str) -> None:
        for p in self.store.list("Pod", namespace=namespace, selector={LABEL_JOB_NAME: job}):
            if p.status.phase == "Pending":  # type: ignore[attr-defined]
                self.set_phase(namespace, p.metadata.name, "Running")

    def finish(
        self, namespace: str, name: str, *, exit_code: int | None = 0, reason: str | None = None
    ) -> None:
        pod = self.store.must_get("Pod", namespace, name).clone()
        terminate(pod, exit_code=exit_code, reason=reason, message=None, now=pod.metadata.creation_timestamp)  # type: ignore[arg-type]
        self.store.update(pod)
