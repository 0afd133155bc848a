"""What one scheduling attempt leaves behind, as decisions: PodGroup statuses, events, counters.

The core (`core.SchedulerState`) decides; its :class:`Recorder` turns each outcome into plain
decisions (`decisions.PatchStatus`, `decisions.RecordEvent`) for the loop to write:

* a placed gang: status `Placed` and a `Scheduled` event (attached to the gang's
  `PlaceGang.then`, so they are written only once its Reservations exist);
* a job set aside: not placed (no room, not permitted, a gang-group member missing) or blocked
  by quota; its status names its position, its queue's share and the first blocking cause
  (rewritten at most every `_STATUS_EVERY` seconds when only the position changed), with a
  `FailedScheduling` event when the cause changes;
* a failed write: the job backs off (exponential, up to a minute) and says so.

The Recorder keeps the scheduler's view of each PodGroup's status (:class:`StatusView`): the
scheduler is the only writer of those fields, so it writes only what changed, without reading
the store. Also here: :class:`QuotaParking`, jobs parked by quota alone, grouped by job shape,
so that a cluster change wakes them only when quota no longer blocks their shape or reclaim
could help.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime

import structlog

from gpuyard.apis.scheduling import PodGroup, pod_name
from gpuyard.scheduler.admission.gatekeeping import Admission, JobShape, ParkedMarks
from gpuyard.scheduler.admission.quota import FairQueue
from gpuyard.scheduler.cache.assuming import StatusView, event_about, patch, status_changes
from gpuyard.scheduler.decisions import Decision, EventType, Outbox, PatchStatus, RecordEvent, Tally

__all__ = ["Key", "QuotaParking", "Recorder", "is_complete"]

log = structlog.get_logger(__name__)

_STATUS_EVERY = 10.0  # seconds: a waiting job's position-only message changes are written this often
_BACKOFF_BASE = 0.5
_BACKOFF_MAX = 60.0

Key = tuple[str, str]


class QuotaParking:
    """Jobs parked by quota alone since they were last tried, and the same per job shape."""

    def __init__(self, queue: Callable[[], FairQueue]) -> None:
        self._queue = queue  # the FairQueue that keeps them parked (`FairQueue.keep`)
        self.parked: dict[Key, JobShape] = {}  # parked by quota alone since last tried -> shape
        self.by_shape: dict[JobShape, set[Key]] = {}  # the same, per shape
        self.marks: dict[JobShape, ParkedMarks] = {}  # per shape: why it stays (`Admission.parked_marks`)

    def stays(self, adm: Admission) -> None:
        """Before `wake_parked`: jobs parked by quota alone stay parked (kept by the FairQueue)
        while quota still blocks their shape and reclaim cannot help it (not owed); the others
        are no longer kept. One check per shape, so a change elsewhere does not send every
        waiting job through a cycle again."""
        for shape, keys in list(self.by_shape.items()):
            rep = next(iter(keys))
            marks = self.marks.get(shape)
            if marks is not None and adm.still_parked(rep, marks):
                continue  # no usage went down where it matters, no runtime changed: same answer
            marks = adm.parked_marks(rep)
            if marks is not None:
                self.marks[shape] = marks
            elif adm.allows(rep) or adm.owed(rep):
                for key in list(keys):
                    self.unpark(key)

    def park(self, key: Key, shape: JobShape | None) -> None:
        self.unpark(key)
        if shape is not None:
            self.parked[key] = shape
            self.by_shape.setdefault(shape, set()).add(key)
            self._queue().keep(key)

    def unpark(self, key: Key) -> None:
        shape = self.parked.pop(key, None)
        if shape is not None:
            self._queue().unkeep(key)
            keys = self.by_shape[shape]
            keys.discard(key)
            if not keys:
                del self.by_shape[shape]
                self.marks.pop(shape, None)

    def clear(self) -> None:
        """Quota configuration changed: shapes may mean other quotas; wake by epoch as usual."""
        self.parked.clear()
        self.by_shape.clear()
        self.marks.clear()
        self._queue().unkeep_all()


class Recorder:
    """PodGroup statuses and events as decisions, attempt and failure counts per job; the
    core's counts for the loop's metrics (`tally`)."""

    def __init__(self, *, events: bool = True, out: Outbox | None = None) -> None:
        self.events = events
        self.out = out if out is not None else Outbox()  # shared with the cache's deletions
        self.tally = Tally()
        self.views: dict[Key, StatusView] = {}
        self.attempts: dict[Key, int] = {}
        self.failures: dict[Key, int] = {}
        self.last_cause: dict[Key, tuple[str, str, float]] = {}

    def take(self) -> list[Decision]:
        """The decisions recorded since the last call."""
        return self.out.take()

    def forget(self, key: Key) -> None:
        for table in (self.views, self.attempts, self.failures, self.last_cause):
            table.pop(key, None)

    def clear(self) -> None:
        """A re-list: statuses are read again from the objects."""
        self.views.clear()
        self.last_cause.clear()

    def view(self, pg: PodGroup) -> StatusView:
        key = (pg.metadata.namespace, pg.metadata.name)
        view = self.views.get(key)
        if view is None:
            view = self.views[key] = StatusView.of(pg)
        return view

    def evicting(self, pg: PodGroup) -> bool:
        """Pods of `pg` the scheduler asked to stop still hold their Reservations."""
        return bool(self.view(pg).evictions)

    def write_failed(self, key: Key) -> None:
        """A status write did not happen: read the status again from the object next time."""
        self.views.pop(key, None)

    # --- statuses and events ---------------------------------------------------------------------

    def status(
        self,
        pg: PodGroup,
        *,
        phase: str,
        reason: str,
        message: str,
        placed: int,
        now: datetime,
        into: list[PatchStatus | RecordEvent] | None = None,
        extra: Mapping[str, object] | None = None,
    ) -> PatchStatus | None:
        """Record the scheduler's status fields of `pg` when they changed (plus `extra` fields)."""
        key = (pg.metadata.namespace, pg.metadata.name)
        view = self.view(pg)
        changes = status_changes(
            view,
            phase=phase,
            reason=reason,
            message=message,
            placed=placed,
            attempts=self.attempts.get(key, 0),
            now=now,
        )
        if extra:
            changes = {**(changes or {}), **extra}
        if not changes:
            return None
        decision = patch(key, changes)
        if into is None:
            self.out.append(decision)
        else:
            into.append(decision)
        return decision

    def evictions(self, pg: PodGroup, evictions: dict[str, str]) -> None:
        """Set `status.evictions` (pod -> why) when it differs from what was written."""
        view = self.view(pg)
        if view.evictions != evictions:
            view.evictions = dict(evictions)
            self.out.append(patch((pg.metadata.namespace, pg.metadata.name), {"evictions": dict(evictions)}))

    def event(
        self,
        pg: PodGroup,
        *,
        reason: str,
        message: str,
        type_: EventType = "Normal",
        now: datetime,
        into: list[PatchStatus | RecordEvent] | None = None,
    ) -> RecordEvent | None:
        if not self.events:
            return None
        decision = event_about(pg, reason=reason, message=message, type_=type_, now=now)
        if into is None:
            self.out.append(decision)
        else:
            into.append(decision)
        return decision

    def attempted(self, pg: PodGroup) -> None:
        key = (pg.metadata.namespace, pg.metadata.name)
        self.attempts[key] = self.attempts.get(key, pg.status.attempts) + 1

    def waiting(
        self,
        pg: PodGroup,
        code: str,
        cause: str,
        *,
        held: int,
        now: float,
        utcnow: datetime,
        where: str | None,
    ) -> None:
        """Why a queued job waits: `where` (its position and queue share, when tenancy is
        configured), then the first blocking cause. The FailedScheduling event follows the
        cause; a message that differs only in position is rewritten at most every
        `_STATUS_EVERY` seconds."""
        key = (pg.metadata.namespace, pg.metadata.name)
        last = self.last_cause.get(key)
        same = last is not None and last[0] == code and last[1] == cause
        if same and last is not None and now - last[2] < _STATUS_EVERY:
            return
        self.last_cause[key] = (code, cause, now)
        self.status(
            pg,
            phase="Placed" if held else "Pending",
            reason=code,
            message=f"{where}: {cause}" if where else cause,
            placed=held,
            now=utcnow,
        )
        if same:
            return
        self.event(pg, reason="FailedScheduling", message=cause, type_="Warning", now=utcnow)
        log.info("job.unschedulable", job=f"{key[0]}/{key[1]}", reason=code, message=cause)

    def backoff_delay(self, key: Key) -> float:
        """One more failure of `key`: how long it waits before the next try."""
        n = self.failures.get(key, 0)
        self.failures[key] = n + 1
        return min(_BACKOFF_MAX, _BACKOFF_BASE * (1 << n))  # 1 << n: 2**n as an int (n >= 0)


def is_complete(pg: PodGroup, held: dict[str, str]) -> bool:
    """Every replica of every role holds a reservation."""
    name = pg.metadata.name
    return all(pod_name(name, r.name, i) in held for r in pg.spec.roles for i in range(r.replicas))
