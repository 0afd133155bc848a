"""The assume: a placement becomes Reservations in the snapshot at once, and in the store after.

`assume` builds one Reservation per placed pod and records each in the snapshot synchronously
(so the next decision of the same cycle already sees the GPUs taken); the loop then creates
them through the writer. If a create fails, `unassume` makes the snapshot forget them all (the
loop deletes those already created): no half gang stays behind (Kueue's admit pattern).

Also here, as plain data for the loop to write: the PodGroup status fields the scheduler owns
(:class:`StatusView`, :func:`status_changes`) and Kubernetes-style Events (:func:`event_about`),
one per object and reason with a count, as Kubernetes does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from gpuyard.apis.meta import ObjectMeta, OwnerReference
from gpuyard.apis.podplacement import ANNOTATION_ANTI_AFFINITY, anti_terms_to_json
from gpuyard.apis.scheduling import (
    GROUP,
    LABEL_JOB_NAME,
    LABEL_REPLICA_INDEX,
    LABEL_REPLICA_TYPE,
    PodGroup,
    Reservation,
    ReservationSpec,
)
from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.decisions import EventType, PatchStatus, RecordEvent
from gpuyard.scheduler.gangs.outcomes import Placement, PodPlacement

__all__ = [
    "COMPONENT",
    "StatusView",
    "assume",
    "event_about",
    "patch",
    "reservation_for",
    "share_memory_of",
    "status_changes",
    "unassume",
]

COMPONENT = "gpuyard-scheduler"


def reservation_for(
    pp: PodPlacement, *, peers: list[str], owner_uid: str = "", gpu_memory_mib: int = 0
) -> Reservation:
    """The Reservation recording one pod's placement (`gpu_memory_mib`: a share's GPU memory)."""
    pod = pp.pod
    owners = []
    if owner_uid:
        owners.append(
            OwnerReference(api_version=GROUP, kind="PodGroup", name=pod.group, uid=owner_uid, controller=True)
        )
    return Reservation(
        metadata=ObjectMeta(
            name=pod.name,
            namespace=pod.namespace,
            labels={  # the pod's labels: inter-pod affinity of pods placed later matches them
                **pod.role_labels,
                LABEL_JOB_NAME: pod.group,
                LABEL_REPLICA_TYPE: pod.role.lower(),
                LABEL_REPLICA_INDEX: str(pod.index),
            },
            annotations=_anti_affinity(pp),
            owner_references=owners,
        ),
        spec=ReservationSpec(
            pod_group=pod.group,
            role=pod.role,
            index=pod.index,
            node=pp.node,
            gpus=list(pp.gpus),
            gpu_ids=list(pp.gpu_ids),
            gpu_milli=pp.gpu_milli,
            gpu_memory_mib=gpu_memory_mib,
            nics=list(pp.nics),
            host_ports=list(pp.host_ports),
            requests=dict(pp.requests),
            local_peers=peers,
        ),
    )


def _anti_affinity(pp: PodPlacement) -> dict[str, str]:
    """The pod's required anti-affinity terms, kept on its Reservation (symmetric anti-affinity)."""
    rules = pp.shape.rules
    if rules is None or not rules.anti_affinity:
        return {}
    return {ANNOTATION_ANTI_AFFINITY: anti_terms_to_json(rules.anti_affinity)}


def share_memory_of(snapshot: Snapshot, pp: PodPlacement) -> int:
    """MiB of GPU memory a shared pod's placement holds on its GPU (0 for whole GPUs)."""
    if not pp.shape.shared or not pp.gpus:
        return 0
    return int(snapshot.share_memory(pp.row, pp.shape)[pp.gpus[0]])


def assume(
    snapshot: Snapshot, placement: Placement, *, owners: dict[tuple[str, str], str]
) -> list[Reservation]:
    """The Reservations of `placement`, each recorded in the snapshot now (not yet written)."""
    peers = placement.local_peers()
    out: list[Reservation] = []
    for pp in placement.pods:
        res = reservation_for(
            pp,
            peers=peers[pp.pod.name],
            owner_uid=owners.get((pp.pod.namespace, pp.pod.group), ""),
            gpu_memory_mib=share_memory_of(snapshot, pp),
        )
        snapshot.upsert_reservation(res)
        out.append(res)
    return out


def unassume(snapshot: Snapshot, reservations: list[Reservation]) -> None:
    """Forget assumed Reservations in the snapshot (their write failed)."""
    for res in reversed(reservations):
        snapshot.remove_reservation((res.metadata.namespace, res.metadata.name))


@dataclass(slots=True)
class StatusView:
    """The scheduler's fields of a PodGroup status, as last written (or read)."""

    phase: str = "Pending"
    reason: str = ""
    message: str = ""
    placed: int = 0
    queued_at: datetime | None = None
    placed_at: datetime | None = None
    attempts: int = 0
    evictions: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, pg: PodGroup) -> StatusView:
        st = pg.status
        return cls(
            st.phase,
            st.reason,
            st.message,
            st.placed,
            st.queued_at,
            st.placed_at,
            st.attempts,
            dict(st.evictions),
        )


def status_changes(
    view: StatusView,
    *,
    phase: str,
    reason: str,
    message: str,
    placed: int,
    attempts: int,
    now: datetime,
) -> dict[str, object] | None:
    """The status fields to write for this outcome (None when nothing changed); `view` is updated."""
    if (view.phase, view.reason, view.message, view.placed) == (phase, reason, message, placed):
        return None
    changes: dict[str, object] = {"phase": phase, "reason": reason, "message": message, "placed": placed}
    view.phase, view.reason, view.message, view.placed = phase, reason, message, placed
    if view.queued_at is None:
        view.queued_at = changes["queued_at"] = now
    if phase == "Placed" and view.placed_at is None:
        view.placed_at = changes["placed_at"] = now
    if attempts > view.attempts:
        view.attempts = changes["attempts"] = attempts
    return changes


def patch(key: tuple[str, str], changes: dict[str, object]) -> PatchStatus:
    return PatchStatus("PodGroup", key[0], key[1], changes)


def event_about(
    pg: PodGroup, *, reason: str, message: str, type_: EventType = "Normal", now: datetime
) -> RecordEvent:
    """The Event for `reason` about the job that owns the PodGroup (its controller owner
    reference), so the job's event list shows it; about the PodGroup itself when it has no
    owner. It carries the `job-name` label either way."""
    meta = pg.metadata
    involved = {
        "kind": "PodGroup",
        "apiVersion": GROUP,
        "namespace": meta.namespace,
        "name": meta.name,
        "uid": meta.uid,
    }
    for ref in meta.owner_references:
        if ref.controller:
            involved = {
                "kind": ref.kind,
                "apiVersion": ref.api_version,
                "namespace": meta.namespace,
                "name": ref.name,
                "uid": ref.uid,
            }
            break
    return RecordEvent(
        namespace=meta.namespace,
        name=f"{meta.name}.{reason.lower()}",
        job=meta.name,
        involved=involved,
        reason=reason,
        message=message,
        type=type_,
        at=now,
    )
