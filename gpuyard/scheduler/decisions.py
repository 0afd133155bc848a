"""The plain data that flows in and out of the scheduler's synchronous core.

In: *stimuli*, every one through :meth:`~gpuyard.scheduler.core.SchedulerState.apply` (as dask's
worker state machine takes `handle_stimulus`): a :class:`Change` (an object added, modified or
deleted; the store's watch events have the same two fields, `type` and `object`, and are accepted
as they are), :class:`CreateFailed` (a gang's Reservations could not all be created),
:class:`WriteFailed` (a status, Event or deletion was not written) and
:class:`RescheduleRequested` (someone asks the rescheduler for a run). Time is the other input:
`step(now=...)` expires nominations and backoffs, and `next_due` says when to step again.

Out: what :meth:`~gpuyard.scheduler.core.SchedulerState.step` decided, for the async loop
(`running`) to execute through the writer, in order:

* :class:`PlaceGang` — create these Reservations (one gang, already *assumed* in the snapshot);
  only when every create succeeded, execute `then` (the PodGroup statuses `Placed` and the
  `Scheduled` events). If one fails, the loop deletes those it created and hands the decision
  back as a :class:`CreateFailed` stimulus (Kueue's admit pattern);
* :class:`DeleteReservation` — delete exactly that Reservation (name and uid; a released one, or
  one of a PodGroup that no longer exists);
* :class:`PatchStatus` — merge these top-level status fields into an object's status
  (PodGroup, ElasticQuota, Queue, ResourceQuota): only fields the scheduler owns;
* :class:`RecordEvent` — one Kubernetes-style Event per (object, reason), its count bumped when
  it exists.

The core's parts that decide append to one :class:`Outbox`, so decisions keep the order they
were made in. Beside the decisions, a :class:`Tally` counts attempts, preemptions and migrations;
the loop takes it after each step and turns it into metrics (the core reads no clock and writes
no metric).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from gpuyard.apis.meta import Resource
from gpuyard.apis.scheduling import Reservation

__all__ = [
    "Change",
    "ChangeLike",
    "CreateFailed",
    "Decision",
    "DeleteReservation",
    "EventType",
    "Outbox",
    "PatchStatus",
    "PlaceGang",
    "RecordEvent",
    "RescheduleRequested",
    "Stimulus",
    "Tally",
    "WriteFailed",
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


# --- stimuli other than object changes -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CreateFailed:
    """Creating `decision`'s Reservations failed (those created were deleted again): the core
    forgets what it assumed and backs the gang off."""

    decision: PlaceGang
    error: str


@dataclass(frozen=True, slots=True)
class WriteFailed:
    """`decision` (a status, an Event or a deletion) was not written: decided again when due."""

    decision: Decision


@dataclass(frozen=True, slots=True)
class RescheduleRequested:
    """A run of the defragmenting rescheduler at the next step; `reply` gets its result (plain
    JSON). Without a rescheduler, `reply` gets `{"error": ...}` at once."""

    dry_run: bool
    reply: Callable[[dict[str, Any]], None]


Stimulus = ChangeLike | CreateFailed | WriteFailed | RescheduleRequested


class Outbox:
    """Decisions in the order the core's parts made them, until the loop takes them."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: list[Decision] = []

    def __len__(self) -> int:
        return len(self._items)

    def append(self, decision: Decision) -> None:
        self._items.append(decision)

    def take(self) -> list[Decision]:
        """The decisions made since the last call."""
        items, self._items = self._items, []
        return items


@dataclass(slots=True)
class Tally:
    """What the core counted since the loop last took it: scheduling attempts (a gang placed,
    or not), jobs stopped by reason and the GPU-hours they lose, jobs moved by the rescheduler.
    Plain counts, bounded however long nobody takes them."""

    placed: int = 0  # attempts that placed a gang
    unschedulable: int = 0  # attempts that did not
    pods: int = 0  # pods those attempts placed
    preemptions: dict[str, int] = field(default_factory=dict)  # reason -> jobs stopped
    gpu_hours_lost: float = 0.0
    migrations: int = 0

    @property
    def attempts(self) -> int:
        return self.placed + self.unschedulable

    def attempt(self, *, pods: int | None) -> None:
        """One attempt to place a gang: `pods` placed, or None when it did not start."""
        if pods is None:
            self.unschedulable += 1
        else:
            self.placed += 1
            self.pods += pods

    def preempted(self, reason: str, *, gpu_hours: float) -> None:
        self.preemptions[reason] = self.preemptions.get(reason, 0) + 1
        if gpu_hours > 0:
            self.gpu_hours_lost += gpu_hours

    def migrated(self) -> None:
        self.migrations += 1

    def take(self) -> Tally:
        """The counts so far; counting starts again from zero."""
        out = Tally(
            self.placed, self.unschedulable, self.pods, self.preemptions, self.gpu_hours_lost, self.migrations
        )
        self.placed = self.unschedulable = self.pods = self.migrations = 0
        self.preemptions, self.gpu_hours_lost = {}, 0.0
        return out
