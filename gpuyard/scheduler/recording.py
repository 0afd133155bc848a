"""What one scheduling attempt leaves behind: a committed placement, or a job set aside and why.

The scheduling loop (`running`) decides; the methods here, mixed into its class as
:class:`Recorder`, act on the decision:

* **commit** a placement: Permit and Reserve plugins, then *assume* (every Reservation created
  synchronously), the PodGroup status `Placed` and a `Scheduled` event; a failed assume is
  un-reserved and **backed off** (exponential, up to a minute);
* **park** a job that does not start now: not placed (no room, not permitted, a gang-group member
  missing) or blocked by quota; its PodGroup status names its position, its queue's share and
  the first blocking cause (rewritten at most every `_STATUS_EVERY` seconds when only the
  position changed), with a `FailedScheduling` event when the cause changes;
* :class:`QuotaParking`: jobs parked by quota alone, grouped by job shape, so that a cluster
  change wakes them only when quota no longer blocks their shape or reclaim could help.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from gpuyard.apis.scheduling import PodGroup, pod_name
from gpuyard.scheduler.assuming import AssumeFailed, assume, record_event, write_status
from gpuyard.scheduler.framework import CycleState, Profile
from gpuyard.scheduler.gatekeeping import Admission
from gpuyard.scheduler.outcomes import Placement, Unschedulable
from gpuyard.scheduler.snapshot import Snapshot
from gpuyard.state.clock import Clock
from gpuyard.state.store import Store

if TYPE_CHECKING:
    from gpuyard.scheduler.quota import FairQueue

__all__ = ["Key", "QuotaParking", "Recorder", "is_complete"]

log = structlog.get_logger(__name__)

_STATUS_EVERY = 10.0  # seconds: a waiting job's position-only message changes are written this often
_BACKOFF_BASE = 0.5
_BACKOFF_MAX = 60.0

Key = tuple[str, str]


class QuotaParking:
    """Jobs parked by quota alone since they were last tried, and the same per job shape."""

    def __init__(self) -> None:
        self.parked: dict[Key, tuple] = {}  # parked by quota alone since last tried -> shape
        self.by_shape: dict[tuple, set[Key]] = {}  # the same, per shape

    def stays(self, adm: Admission) -> Callable[[Key], bool] | None:
        """For `wake_parked`: jobs parked by quota alone stay parked while quota still blocks
        their shape and reclaim cannot help it (not owed). One check per shape, so a change
        elsewhere does not send every waiting job through a cycle again."""
        for keys in list(self.by_shape.values()):
            rep = next(iter(keys))
            if adm.check(rep) is None or adm.owed(rep):
                for key in list(keys):
                    self.unpark(key)
        return self.parked.__contains__ if self.parked else None

    def park(self, key: Key, shape: tuple | None) -> None:
        self.unpark(key)
        if shape is not None:
            self.parked[key] = shape
            self.by_shape.setdefault(shape, set()).add(key)

    def unpark(self, key: Key) -> None:
        shape = self.parked.pop(key, None)
        if shape is not None:
            keys = self.by_shape[shape]
            keys.discard(key)
            if not keys:
                del self.by_shape[shape]

    def clear(self) -> None:
        """Quota configuration changed: shapes may mean other quotas; wake by epoch as usual."""
        self.parked.clear()
        self.by_shape.clear()


class Recorder:
    """The commit, status and parking half of :class:`~gpuyard.scheduler.running.SchedulerLoop`.

    A mixin: the loop's constructor sets every attribute named below.
    """

    store: Store
    clock: Clock
    admission: Admission
    snapshot: Snapshot
    profile: Profile
    events: bool
    parking: QuotaParking
    placed_pods: int
    placed_jobs: int
    queue: FairQueue
    _wake: asyncio.Event
    _attempts: dict[Key, int]
    _failures: dict[Key, int]
    _own_writes: dict[Key, str]
    _partial: dict[Key, int]
    _positions: dict[Key, int]
    _last_cause: dict[Key, tuple[str, str, float]]
    _epoch: Callable[[], int]

    def _quota_blocked(self, key: Key, reason: str, *, shape: tuple | None = None) -> None:
        pg = self.store.get("PodGroup", *key)
        self.queue.park(key, epoch=self._epoch(), reason=reason, reserve=False)
        self.parking.park(key, shape)
        if pg is None:
            return
        code = "ResourceQuotaExceeded" if reason.startswith("ResourceQuota") else "QuotaExceeded"
        self._attempts[key] = self._attempts.get(key, pg.status.attempts) + 1  # type: ignore[attr-defined]
        self._waiting(pg, code, reason, held=0)  # type: ignore[arg-type]

    def _waiting(self, pg: PodGroup, code: str, cause: str, *, held: int) -> None:
        """Why a queued job waits: its position and queue share, then the first blocking cause.

        The FailedScheduling event follows the cause; a message that differs only in position is
        rewritten at most every `_STATUS_EVERY` seconds.
        """
        key = (pg.metadata.namespace, pg.metadata.name)
        now = self.clock.now()
        last = self._last_cause.get(key)
        same = last is not None and last[0] == code and last[1] == cause
        if same and now - last[2] < _STATUS_EVERY:  # type: ignore[index]
            return
        job = self.queue.get(key)
        qname = job.queue if job is not None else (pg.spec.queue or pg.metadata.namespace)
        share = self.queue.share(qname)
        pos = self._positions.get(key)
        where = f"#{pos + 1} in queue {qname}" if pos is not None else f"queue {qname}"
        self._last_cause[key] = (code, cause, now)
        self._status(
            key,
            phase="Placed" if held else "Pending",
            reason=code,
            message=f"{where} (share {share:.2f}): {cause}" if self.admission.tenancy else cause,
            placed=held,
        )
        if same or not self.events:
            return
        record_event(
            self.store,
            podgroup=pg,
            reason="FailedScheduling",
            message=cause,
            type_="Warning",
            now=self.clock.utcnow(),
        )
        log.info("job.unschedulable", job=f"{key[0]}/{key[1]}", reason=code, message=cause)

    def _commit(
        self, state: CycleState, members: list[PodGroup], placement: Placement
    ) -> Placement | Unschedulable:
        profile = self.profile
        for plugin in profile.permits:
            why = plugin.permit(state, placement)
            if why:
                result = Unschedulable(reason="NotPermitted", message=why)
                self._not_placed(members, result)
                return result
        reserved = []
        for plugin in profile.reserves:
            why = plugin.reserve(state, placement)
            if why:
                for done in reversed(reserved):
                    done.unreserve(state, placement)
                result = Unschedulable(reason="NotReserved", message=why)
                self._not_placed(members, result)
                return result
            reserved.append(plugin)
        owners = {m.key[1:]: m.metadata.uid for m in members}
        try:
            assume(self.store, self.snapshot, placement, owners=owners)
        except AssumeFailed as exc:
            for done in reversed(reserved):
                done.unreserve(state, placement)
            self._backoff(members, str(exc))
            return Unschedulable(reason="AssumeFailed", message=str(exc))
        self.placed_pods += len(placement.pods)
        self.placed_jobs += 1
        now = self.clock.utcnow()
        summary = placement.summary()
        by_member: dict[Key, int] = {}
        for pp in placement.pods:
            k = (pp.pod.namespace, pp.pod.group)
            by_member[k] = by_member.get(k, 0) + 1
        for m in members:
            key = m.key[1:]
            self._failures.pop(key, None)
            held_pods = self.snapshot.placed_pods(key)
            held = len(held_pods)
            self.admission.start(key, now=self.clock.now())
            self.parking.unpark(key)
            self._last_cause.pop(key, None)
            if is_complete(m, held_pods):
                self._partial.pop(key, None)
            else:
                self._partial[key] = self._epoch()
            self._status(key, phase="Placed", reason="Placed", message=summary, placed=held)
            if self.events and by_member.get(key):
                record_event(
                    self.store,
                    podgroup=m,
                    reason="Scheduled",
                    message=f"{summary}: {', '.join(placement.nodes[:8])}{' ...' if len(placement.nodes) > 8 else ''}",
                    now=now,
                )
        log.info(
            "job.placed",
            job=f"{state.gang.key[0]}/{state.gang.key[1]}",
            pods=len(placement.pods),
            nodes=len(placement.nodes),
            deferred=len(placement.deferred),
        )
        return placement

    def _not_placed(self, members: list[PodGroup], result: Unschedulable) -> None:
        epoch = self._epoch()
        message = result.full_message()
        fits = self.admission.has_quotas and result.reason == "Unschedulable"
        cause = f"fits quota, waiting for room: {message}" if fits else message
        for m in members:
            key = m.key[1:]
            self.queue.park(key, epoch=epoch, reason=cause)
            self.parking.unpark(key)
            if key in self._partial:
                self._partial[key] = epoch
            held = len(self.snapshot.placed_pods(key))
            self._attempts[key] = self._attempts.get(key, m.status.attempts) + 1
            self._waiting(m, result.reason, cause, held=held)

    def _backoff(self, members: list[PodGroup], message: str) -> None:
        for m in members:
            key = m.key[1:]
            n = self._failures.get(key, 0)
            self._failures[key] = n + 1
            delay = min(_BACKOFF_MAX, _BACKOFF_BASE * 2**n)
            self.queue.backoff(key, until=self.clock.now() + delay, reason=message)
            held = len(self.snapshot.placed_pods(key))
            self._status(
                key,
                phase="Placed" if held else "Pending",
                reason="AssumeFailed",
                message=f"{message}; retrying in {delay:g}s",
                placed=held,
            )
            log.warning("job.assume_failed", job=f"{key[0]}/{key[1]}", error=message, retry_in=delay)
        self._wake.set()

    def _retry_later(self, key: Key) -> None:
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        pg = self.store.get("PodGroup", *key)
        if pg is not None:
            delay = min(_BACKOFF_MAX, _BACKOFF_BASE * 2**n)
            self.queue.backoff(key, until=self.clock.now() + delay)

    def _status(self, key: Key, *, phase: str, reason: str, message: str, placed: int | None = None) -> None:
        if placed is None:
            placed = len(self.snapshot.placed_pods(key))
        stored = write_status(
            self.store,
            key,
            phase=phase,
            reason=reason,
            message=message,
            placed=placed,
            attempts=self._attempts.get(key, 0),
            now=self.clock.utcnow(),
        )
        if stored is not None:
            self._own_writes[key] = stored.metadata.resource_version


def is_complete(pg: PodGroup, held: dict[str, str]) -> bool:
    """Every replica of every role holds a reservation."""
    name = pg.metadata.name
    return all(pod_name(name, r.name, i) in held for r in pg.spec.roles for i in range(r.replicas))
