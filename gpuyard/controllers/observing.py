"""Observing a job: everything it owns, read from the store once per reconcile pass.

The first of the operator's three steps (observe -> plan -> apply). :func:`observe` reads the
job's pods, services, PodGroup and the Reservations the scheduler made for that PodGroup, and
the health of the nodes and GPUs those Reservations hold, into an :class:`Observed` snapshot of
plain data; `planning.py` decides from it alone.

A Reservation counts as the job's only while it belongs to the job's current PodGroup (its
owner reference names that PodGroup's uid): the Reservations of an earlier gang of the same
name are the scheduler's to collect, never a placement the new job inherits.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuyard.apis.core import Node, Pod, Service
from gpuyard.apis.devicematching import LABEL_LIFECYCLE, unhealthy_indices
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.gangs import GANG_KIND, GangPodGroup
from gpuyard.apis.jobkinds import KIND_INFO, TrainingJob
from gpuyard.apis.scheduling import LABEL_JOB_NAME, LABEL_MIGRATING_POD, PodGroup, Reservation
from gpuyard.controllers.judging import Replica
from gpuyard.controllers.workloads.base import replica_name
from gpuyard.state.store import Store

__all__ = ["Observed", "job_owner_uid", "observe", "placement_usable"]


@dataclass(slots=True)
class Observed:
    """Everything a job owns, as one pass sees it."""

    replicas: list[Replica]  # every replica the job's spec wants, with its pod and Reservation
    extra_pods: list[Pod]  # pods of this job that no replica wants (scaled in, renamed roles)
    stale_pods: list[Pod]  # pods of an earlier job of the same name
    reservations: dict[str, Reservation]  # pod name -> Reservation of the current PodGroup
    services: dict[str, Service]
    pod_group: PodGroup | None  # the job's PodGroup (None: not created yet)
    stale_group: PodGroup | None = None  # the PodGroup of an earlier job of the same name
    leftovers: int = 0  # Reservations of an earlier gang of this name, not yet collected
    unusable: frozenset[str] = frozenset()  # finished pods whose Reservation is on a lost node or bad GPU
    gang_group: GangPodGroup | None = None  # delegate mode: the gang scheduler's PodGroup of this name


def job_owner_uid(obj: Pod | Service | PodGroup | GangPodGroup) -> str | None:
    """The uid of the training job that owns `obj` (None: not a job's)."""
    for ref in obj.metadata.owner_references:
        if ref.kind in KIND_INFO:
            return ref.uid
    return None


def _belongs_to(res: Reservation, pg: PodGroup) -> bool:
    """The Reservation was made for this PodGroup (not for an earlier one of the same name)."""
    owners = [ref.uid for ref in res.metadata.owner_references if ref.kind == "PodGroup"]
    return not owners or pg.metadata.uid in owners


def placement_usable(store: Store, res: Reservation, *, topologies: bool = True) -> bool:
    """The Reservation's node is there and Ready and none of its GPUs is unhealthy
    (node annotation `gpuyard.io/unhealthy-gpus`, or the NodeTopology's GPU health)."""
    node = store.get_of(Node, "", res.spec.node)
    if node is None or not node.ready:
        return False
    bad = set(unhealthy_indices(node))
    if topologies:
        topo = store.get_of(NodeTopology, "", res.spec.node)
        for gpu in topo.spec.gpus if topo is not None else ():
            if gpu.health != "Healthy":
                bad.add(gpu.index)
    return not (bad & set(res.spec.gpus))


def _on_spot_node(store: Store, rep: Replica) -> bool:
    """The replica's pod ran on a node labelled `node.kubernetes.io/lifecycle: spot`."""
    assert rep.pod is not None
    name = rep.pod.spec.node_name or (rep.reservation.spec.node if rep.reservation is not None else "")
    node = store.get_of(Node, "", name) if name else None
    return node is not None and node.metadata.labels.get(LABEL_LIFECYCLE) == "spot"


def observe(store: Store, job: TrainingJob) -> Observed:
    """Read what `job` owns (see the module docstring)."""
    ns, name = job.metadata.namespace, job.metadata.name
    selector = {LABEL_JOB_NAME: name}
    pods: dict[str, Pod] = {}
    stale: list[Pod] = []
    for pod in store.list_of(Pod, namespace=ns, selector=selector):
        owner = job_owner_uid(pod)
        if owner is None:
            continue  # not a job's pod
        if owner != job.metadata.uid:
            stale.append(pod)
        else:
            pods[pod.metadata.name] = pod
    pg = store.get_of(PodGroup, ns, name)
    stale_group = None
    if pg is not None and job_owner_uid(pg) not in (None, job.metadata.uid):
        stale_group, pg = pg, None
    reservations: dict[str, Reservation] = {}
    leftovers = 0
    for res in store.list_of(Reservation, namespace=ns, selector=selector):
        if res.spec.pod_group != name or LABEL_MIGRATING_POD in res.metadata.labels:
            continue  # another job's; or a migrating pod's new place, the scheduler's until it moves
        if pg is not None and _belongs_to(res, pg):
            reservations[res.metadata.name] = res
        else:
            leftovers += 1
    services = {s.metadata.name: s for s in store.list_of(Service, namespace=ns, selector=selector)}
    replicas = []
    for role in job.roles():
        for index in range(job.replica_specs[role].count):
            rname = replica_name(name, role, index)
            replicas.append(Replica(role, index, rname, pods.pop(rname, None), reservations.get(rname)))
    kinds = store.kinds()
    topologies = "NodeTopology" in kinds
    for rep in replicas:  # a finished pod on a spot node: its failure may be a spot interruption
        if rep.pod is not None and rep.pod.status.phase == "Failed":
            rep.on_spot_node = _on_spot_node(store, rep)
    unusable = frozenset(  # asked only of finished pods: a restarted one may have to move
        rep.name
        for rep in replicas
        if rep.reservation is not None
        and rep.pod is not None
        and rep.pod.status.phase in ("Succeeded", "Failed")
        and not placement_usable(store, rep.reservation, topologies=topologies)
    )
    return Observed(
        replicas=replicas,
        extra_pods=list(pods.values()),
        stale_pods=stale,
        reservations=reservations,
        services=services,
        pod_group=pg,
        stale_group=stale_group,
        leftovers=leftovers,
        unusable=unusable,
        gang_group=store.get_of(GangPodGroup, ns, name) if GANG_KIND in kinds else None,
    )
