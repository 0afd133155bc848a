"""The plain data that flows in and out of the scheduler's synchronous core.

In: a :class:`Change` (an object added, modified or deleted; the store's watch events have the
same two fields, `type` and `object`, and are accepted as they are).

Out: what :meth:`~gpuyard.scheduler.core.SchedulerState.step` decided, for the async loop
(`running`) to execute through the writer, in order:

* :class:`PlaceGang` — create these Reservations (one gang, already *assumed* in the snapshot);
  only when every create succeeded, execute `then` (the PodGroup statuses `Placed` and the
  `Scheduled` events). If one fails, the loop deletes those it created and hands the decision
  back to :meth:`~gpuyard.scheduler.core.SchedulerState.unassume` (Kueue's admit pattern);
* :class:`DeleteReservation` — delete exactly that Reservation (name and uid; a released one, or
  one of a PodGroup that no longer exists);
* :class:`PatchStatus` — merge these top-level status fields into an object's status
  (PodGroup, ElasticQuota, Queue, ResourceQuota): only fields the scheduler owns;
* :class:`RecordEvent` — one Kubernetes-style Event per (object, reason), its count bumped when
  it exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from gpuyard.apis.meta import Resource
from gpuyard.apis.scheduling import Reservation

__all__ = [
    "Change",
    "ChangeLike",
    "Decision",
    "DeleteReservation",
    "EventType",
    "PatchStatus",
    "PlaceGang",
    "RecordEvent",
]

Key = tuple[str, str]


EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True, slots=True)
class Change:
    """One object as the store now has it (`DELETED`: as it was last)."""

    type: Literal["ADDED", "MODIFIED", "DELETED"]
    object: Resource


class ChangeLike(Protocol):
    """A :class:`Change`, or a store watch event (the same two fields)."""

    @property
    def type(self) -> str: ...

    @property
    def object(self) -> Resource: ...


@dataclass(slots=True)
class PatchStatus:
    kind: str
    namespace: str
    name: str
    changes: dict[str, Any]


@dataclass(slots=True)
class RecordEvent:
    """An Event about `involved` (kind, apiVersion, namespace, name, uid), labelled with the job."""

    namespace: str
    name: str  # the Event's name: "<podgroup>.<reason lowercased>"
    job: str
    involved: dict[str, str]
    reason: str
    message: str
    type: EventType
    at: datetime


@dataclass(slots=True)
class DeleteReservation:
    namespace: str
    name: str
    uid: str  # "" deletes whatever Reservation has the name


@dataclass(slots=True)
class PlaceGang:
    """One gang's placement: Reservations to create, then statuses and events to write."""

    key: Key
    members: tuple[Key, ...]
    reservations: list[Reservation]
    then: list[PatchStatus | RecordEvent] = field(default_factory=list)


Decision = PlaceGang | DeleteReservation | PatchStatus | RecordEvent
