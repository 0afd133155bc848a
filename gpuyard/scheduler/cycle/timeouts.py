"""`scheduleTimeoutSeconds`: gangs the scheduler gives up on, and when the next one is due.

KubeDL's `runPolicy.schedulingPolicy.scheduleTimeoutSeconds` (the coscheduling PodGroup's field),
copied by the operator to `PodGroup.spec.scheduleTimeoutSeconds`. The clock starts when the gang
is queued (`status.queuedAt`, set with its first status; a resume from suspension starts it again)
and stops for good once the gang is placed (`status.placedAt`): a gang placed in time is never
failed, even if it is later preempted and waits again. A gang still without any Reservation when
its time is up is failed by the core (`core.SchedulerState`): status phase `Failed`, reason
`ScheduleTimeout`, a message naming the timeout and the last reason it waited, a Warning event;
it leaves the queue and releases any room held for it. The operator turns that into the job's
`Failed` condition and deletes the PodGroup.

:class:`Deadlines` maps each waiting gang to the time (the loop's `now`) its timeout runs out, so
`step` fails those due (:func:`time_out`, between walks) and `next_due` wakes the loop in time;
the core calls :func:`track_deadline` whenever it queues a gang.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import structlog

from gpuyard.apis.scheduling import PodGroup
from gpuyard.scheduler.cache.assuming import StatusView, patch

if TYPE_CHECKING:
    from gpuyard.scheduler.cycle.needs import Cycling

__all__ = ["SCHEDULE_TIMEOUT", "Deadlines", "time_out", "timeout_message", "track_deadline"]

log = structlog.get_logger(__name__)

SCHEDULE_TIMEOUT = "ScheduleTimeout"

Key = tuple[str, str]


def remaining(
    pg: PodGroup, *, queued_at: datetime | None, placed_at: datetime | None, utcnow: datetime
) -> float | None:
    """Seconds left before `pg`'s scheduleTimeoutSeconds runs out (None: no timeout applies)."""
    timeout = pg.spec.schedule_timeout_seconds
    if timeout is None or placed_at is not None:
        return None
    start = queued_at or utcnow
    return timeout - (utcnow - start).total_seconds()


def timeout_message(pg: PodGroup, *, why: str) -> str:
    """The status message of a gang failed for its timeout, with the last reason it waited."""
    timeout = pg.spec.schedule_timeout_seconds
    text = f"not placed within scheduleTimeoutSeconds={timeout}"
    return f"{text}; it waited because: {why}" if why else text


class Deadlines:
    """Waiting gangs with a scheduleTimeoutSeconds -> the time (`now`) their timeout runs out."""

    def __init__(self) -> None:
        self.at: dict[Key, float] = {}

    def set(self, key: Key, *, now: float, left: float | None) -> None:
        """`key` waits with `left` seconds to go (None: no timeout, or placed)."""
        if left is None:
            self.at.pop(key, None)
        else:
            self.at[key] = now + max(0.0, left)

    def drop(self, key: Key) -> None:
        self.at.pop(key, None)

    def due(self, now: float) -> list[Key]:
        """The gangs whose timeout ran out by `now`."""
        return [key for key, at in self.at.items() if at <= now]

    def next_due(self) -> float | None:
        return min(self.at.values(), default=None)

    def clear(self) -> None:
        self.at.clear()


def track_deadline(state: Cycling, pg: PodGroup, view: StatusView) -> None:
    """Note when the waiting gang `pg`'s scheduleTimeoutSeconds runs out (its clock starts with
    `status.queuedAt`, written now if it is not yet)."""
    if pg.spec.schedule_timeout_seconds is None:
        return
    key = (pg.metadata.namespace, pg.metadata.name)
    if view.queued_at is None and view.placed_at is None:
        view.queued_at = state.utcnow
        state.recorder.out.append(patch(key, {"queued_at": state.utcnow}))
    left = remaining(pg, queued_at=view.queued_at, placed_at=view.placed_at, utcnow=state.utcnow)
    state.memo.deadlines.set(key, now=state.now, left=left)


def time_out(state: Cycling) -> None:
    """Fail the waiting gangs whose scheduleTimeoutSeconds ran out (called between walks)."""
    rec, utcnow, memo, cache = state.recorder, state.utcnow, state.memo, state.cache
    for key in memo.deadlines.due(state.now):
        memo.deadlines.drop(key)
        pg = cache.objects.get_of(PodGroup, *key)
        if pg is None or pg.spec.suspend or cache.snapshot.placed_pods(key):
            continue
        view = rec.view(pg)
        message = timeout_message(pg, why=view.message if view.reason != "Queued" else "")
        rec.status(pg, phase="Failed", reason=SCHEDULE_TIMEOUT, message=message, placed=0, now=utcnow)
        rec.event(pg, reason=SCHEDULE_TIMEOUT, message=message, type_="Warning", now=utcnow)
        log.info("job.schedule_timeout", job=f"{key[0]}/{key[1]}", message=message)
        state.admission.forget(key)
        state.claims.given_up(key)
        memo.given_up(key)
        state.parking.unpark(key)
