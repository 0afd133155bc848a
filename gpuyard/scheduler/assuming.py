"""The assume: a placement becomes Reservations in the store, in one synchronous step.

`assume` creates one Reservation per placed pod without awaiting in between (so no other
component sees half a gang) and records each in the snapshot at once. If a write fails, every
Reservation created in this step is deleted again and the snapshot forgets them (the un-assume,
Kueue's admit pattern); the caller requeues the gang with a backoff.

Also here: the PodGroup status the scheduler owns (phase, reason, message, placed count) and
Kubernetes-style Events (`Scheduled`, `FailedScheduling`), aggregated per object and reason
with a count, as Kubernetes does.
"""

from __future__ import annotations

from datetime import datetime

from gpuyard.apis.core import Event
from gpuyard.apis.meta import ObjectMeta, OwnerReference
from gpuyard.apis.scheduling import (
    GROUP,
    LABEL_JOB_NAME,
    LABEL_REPLICA_INDEX,
    LABEL_REPLICA_TYPE,
    PodGroup,
    Reservation,
    ReservationSpec,
)
from gpuyard.scheduler.outcomes import Placement, PodPlacement
from gpuyard.scheduler.snapshot import Snapshot
from gpuyard.state.store import NotFound, Store

__all__ = [
    "AssumeFailed",
    "assume",
    "record_event",
    "reservation_for",
    "share_memory_of",
    "unassume",
    "write_status",
]

COMPONENT = "gpuyard-scheduler"


class AssumeFailed(Exception):
    """A store write of the assume failed; nothing of the placement remains."""


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
            labels={
                LABEL_JOB_NAME: pod.group,
                LABEL_REPLICA_TYPE: pod.role.lower(),
                LABEL_REPLICA_INDEX: str(pod.index),
            },
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


def share_memory_of(snapshot: Snapshot, pp: PodPlacement) -> int:
    """MiB of GPU memory a shared pod's placement holds on its GPU (0 for whole GPUs)."""
    if not pp.shape.shared or not pp.gpus:
        return 0
    return int(snapshot.share_memory(pp.row, pp.shape)[pp.gpus[0]])


def assume(
    store: Store, snapshot: Snapshot, placement: Placement, *, owners: dict[tuple[str, str], str]
) -> list[Reservation]:
    """Create every Reservation of `placement` now; on any failure undo them all and raise AssumeFailed."""
    peers = placement.local_peers()
    created: list[Reservation] = []
    try:
        for pp in placement.pods:
            res = reservation_for(
                pp,
                peers=peers[pp.pod.name],
                owner_uid=owners.get((pp.pod.namespace, pp.pod.group), ""),
                gpu_memory_mib=share_memory_of(snapshot, pp),
            )
            stored = store.create(res)
            created.append(stored)
            snapshot.upsert_reservation(stored)
    except Exception as exc:  # a refused write, or a bug: either way no half gang stays behind
        unassume(store, snapshot, created)
        raise AssumeFailed(f"recording the placement failed: {exc}") from exc
    return created


def unassume(store: Store, snapshot: Snapshot, created: list[Reservation]) -> None:
    """Delete Reservations this cycle created and forget them in the snapshot."""
    for res in reversed(created):
        key = (res.metadata.namespace, res.metadata.name)
        try:
            store.delete("Reservation", *key)
        except NotFound:
            pass
        snapshot.remove_reservation(key)


def write_status(
    store: Store,
    key: tuple[str, str],
    *,
    phase: str,
    reason: str,
    message: str,
    placed: int,
    attempts: int,
    now: datetime,
) -> PodGroup | None:
    """Set the scheduler's part of a PodGroup's status; write only if something changed.

    Returns the stored PodGroup when it wrote, None when it did not (gone, or nothing changed).
    """
    pg = store.get("PodGroup", *key)
    if pg is None:
        return None
    old = pg.status  # type: ignore[attr-defined]
    if (old.phase, old.reason, old.message, old.placed) == (phase, reason, message, placed):
        return None
    status = old.model_copy(
        update={
            "phase": phase,
            "reason": reason,
            "message": message,
            "placed": placed,
            "queued_at": old.queued_at or now,
            "placed_at": (old.placed_at or now) if phase == "Placed" else old.placed_at,
            "attempts": max(attempts, old.attempts),
        }
    )
    return store.update(pg.model_copy(update={"status": status}))  # type: ignore[return-value]


def record_event(
    store: Store,
    *,
    podgroup: PodGroup,
    reason: str,
    message: str,
    type_: str = "Normal",
    now: datetime,
) -> None:
    """One Event per (job, reason): created once, then its count and message updated.

    The event is about the job that owns the PodGroup (its controller owner reference), so the
    job's event list shows it; about the PodGroup itself when it has no owner. It carries the
    `job-name` label either way.
    """
    meta = podgroup.metadata
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
    ev_name = f"{meta.name}.{reason.lower()}"
    old = store.get("Event", meta.namespace, ev_name)
    if old is not None:
        store.update(
            old.model_copy(update={"count": old.count + 1, "message": message, "last_timestamp": now})  # type: ignore[attr-defined]
        )
        return
    store.create(
        Event(
            metadata=ObjectMeta(name=ev_name, namespace=meta.namespace, labels={LABEL_JOB_NAME: meta.name}),
            involved_object=involved,
            reason=reason,
            message=message,
            type=type_,  # type: ignore[arg-type]
            first_timestamp=now,
            last_timestamp=now,
            source={"component": COMPONENT},
        )
    )
