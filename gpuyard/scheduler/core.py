"""The scheduler's synchronous core: changes in, decisions out, no store, no clock, no event loop.

:class:`SchedulerState` composes the parts that own the scheduler's state, each in the layer it
belongs to (docs/architecture.md, "The scheduler's parts"):

* `cache` (:class:`~gpuyard.scheduler.cache.cluster.ClusterCache`): its own view of the watched
  objects, the NumPy `Snapshot` of free capacity, gang groups, pod shapes, and the bookkeeping
  that keeps the snapshot current (assumed and deleted Reservations, garbage);
* `admission` (:class:`~gpuyard.scheduler.admission.gatekeeping.Admission`: the queues and
  quota), `parking` (jobs parked by quota alone) and `recorder` (per-job statuses and events as
  decisions, and the counts the loop turns into metrics);
* `claims` (:class:`~gpuyard.scheduler.preemption.claims.Claims`): room held for preemptors and
  the backfill head, preemptors and their victims, quota reclaim;
* `memo` (:class:`~gpuyard.scheduler.cycle.memo.CycleMemo`): the walk under way and the cycle's
  cached answers, scheduleTimeout deadlines, partly placed jobs;
* `rescheduler` (optional, set by the loop): the defragmenting rescheduler.

The cycle, preemption and the rescheduler never see this class: they take the consumer-side
interfaces of their own packages (`cycle.needs.Cycling`, `preemption.needs.Preempting`,
`rescheduling.needs.Rescheduling`), which it satisfies. It has these entry points:

* `load(objects)` (a full LIST) and `apply(stimuli)`, every other input as a typed stimulus
  (`decisions`): watch events (object added, modified, deleted) are only noted — a PodGroup
  event whose generation, labels and annotations did not change is a status-only write
  (usually the scheduler's own) and is ignored, except the first sight and deletes;
  `CreateFailed` (the loop could not create a gang's Reservations: the snapshot forgets them
  and the gang backs off, Kueue's admit pattern; the answer is the statuses to write);
  `WriteFailed` (a status, Event or deletion was not written: decided again);
  `RescheduleRequested` (a rescheduler run at the next step);
* `step(now=, utcnow=)` applies what changed (snapshot rows, reservations, quota tree, queues,
  capacity; spec.release -> delete exactly that Reservation; a deleted PodGroup -> delete its
  Reservations; evictions whose Reservations are gone are cleared), re-activates parked jobs if
  capacity or quota room may have grown, then walks the FairQueue's candidates (DRF across
  queues, priority/FIFO, aging, backfill) — quota admission first, then `place()` (pure) — and
  returns :mod:`~gpuyard.scheduler.decisions` for the loop to write. A walk is done in slices of
  `limit` jobs; `more` says whether the walk goes on at the next `step`;
* `next_due(now)`: whether jobs are ready and when the loop must wake next; `take_counts()`:
  what was counted since (attempts, preemptions, migrations), for the loop's metrics; `stats()`.

The time is what the loop passes in (`now`, `utcnow`); the loop measures how long a step takes
and writes the metrics.

A placement is *assumed* when decided: its Reservations are recorded in the snapshot at once,
so the next decision already sees the GPUs taken; likewise a deletion frees its room when it
is decided (held again if it fails). Each attempt (`attempting`) is synchronous, so two
decisions never race for the same GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import structlog

from gpuyard.apis.core import Node
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.meta import Resource
from gpuyard.apis.resourceclasses import ResourceClass
from gpuyard.apis.scheduling import PodGroup
from gpuyard.scheduler.admission.gatekeeping import Admission
from gpuyard.scheduler.admission.quota import FairQueue
from gpuyard.scheduler.admission.recording import QuotaParking, Recorder, is_complete
from gpuyard.scheduler.cache.cluster import WATCHED, ClusterCache
from gpuyard.scheduler.cycle.attempting import backoff, offer, retry_partial
from gpuyard.scheduler.cycle.memo import CycleMemo, Walk
from gpuyard.scheduler.cycle.timeouts import time_out, track_deadline
from gpuyard.scheduler.decisions import (
    ChangeLike,
    CreateFailed,
    Decision,
    DeleteReservation,
    Outbox,
    PatchStatus,
    PlaceGang,
    RescheduleRequested,
    Stimulus,
    Tally,
    WriteFailed,
)
from gpuyard.scheduler.placement.framework import Profile
from gpuyard.scheduler.preemption.claims import Claims
from gpuyard.scheduler.preemption.reclaim import Reclaimer
from gpuyard.scheduler.rescheduling.rescheduler import Rescheduler

__all__ = ["WATCHED", "SchedulerState"]

log = structlog.get_logger(__name__)

STEP_JOBS = 32
"""Jobs per `step`: the loop writes their decisions and takes new changes between slices."""


class SchedulerState:
    """The scheduler's parts and its entry points (see the module docstring)."""

    def __init__(
        self,
        *,
        profile: Profile,
        port_range: tuple[int, int],
        reclaim_delay: float = 0.0,
        events: bool = True,
        backfill_hold_seconds: float = 3600.0,
        nomination_seconds: float = 300.0,
        writes_quota_used: bool = True,
    ) -> None:
        self.profile = profile
        out = Outbox()  # the recorder's statuses and events and the cache's deletions, in order
        self.recorder = Recorder(events=events, out=out)
        self.cache = ClusterCache(port_range=port_range, out=out)
        self.admission = Admission(self.cache.objects, writes_quota_used=writes_quota_used)
        self.parking = QuotaParking(lambda: self.admission.queue)  # jobs parked by quota alone
        self.claims = Claims(
            reclaimer=Reclaimer(delay=reclaim_delay),
            nomination_seconds=nomination_seconds,
            backfill_hold_seconds=backfill_hold_seconds,
        )
        self.memo = CycleMemo()
        self.rescheduler: Rescheduler | None = None  # the defragmenting rescheduler (`rescheduling`)
        self.placed_pods = 0
        self.placed_jobs = 0
        self.cycles = 0
        self.now = 0.0
        self.utcnow = datetime.fromtimestamp(0, UTC)
        self._left_ready = 0
        self._seen_epoch = -1

    @property
    def queue(self) -> FairQueue:
        """The tenant queues (the admission's FairQueue)."""
        return self.admission.queue

    @property
    def more(self) -> bool:
        """A walk is under way: call `step` again soon."""
        return self.memo.walk is not None

    def epoch(self) -> int:
        """Grows when capacity (snapshot) or quota room (admission) may have grown."""
        return self.cache.snapshot.epoch + self.admission.epoch + self.claims.holds.released

    # --- input -----------------------------------------------------------------------------------

    def load(self, objects: Mapping[str, Iterable[Resource]], *, now: float, utcnow: datetime) -> None:
        """Start over from a full LIST: `objects` per watched kind the cluster knows."""
        self.now, self.utcnow = now, utcnow
        cache = self.cache
        cache.load(objects)
        known = cache.objects
        self.admission.load(
            nodes=known.list_of(Node),
            classes=known.list_of(ResourceClass),
            topologies={t.metadata.name: t for t in known.list_of(NodeTopology)},
        )
        self.memo.clear()
        self.claims.clear()
        self.parking.clear()
        self.recorder.clear()
        for pg in known.list_of(PodGroup):
            self._consider(pg)
        self._seen_epoch = self.epoch()

    def apply(self, stimuli: Iterable[Stimulus]) -> list[Decision]:
        """Take stimuli (`decisions`): object changes (anything with `type` and `object`) are
        noted for `step` to act on; a failed create is un-assumed and backed off (the answer:
        its statuses to write); a failed write is decided again when due; a reschedule request
        runs at the next step."""
        out: list[Decision] = []
        changes: list[ChangeLike] = []
        for stimulus in stimuli:
            if isinstance(stimulus, CreateFailed):
                out.extend(self._unassume(stimulus.decision, error=stimulus.error))
            elif isinstance(stimulus, WriteFailed):
                self._write_failed(stimulus.decision)
            elif isinstance(stimulus, RescheduleRequested):
                if self.rescheduler is None:
                    stimulus.reply({"error": "no rescheduler runs in this scheduler"})
                else:
                    self.rescheduler.ask(dry_run=stimulus.dry_run, reply=stimulus.reply)
            else:
                changes.append(stimulus)
        if changes:
            self.cache.apply(changes)
        return out

    # --- output ----------------------------------------------------------------------------------

    def step(self, *, now: float, utcnow: datetime, limit: int = STEP_JOBS) -> list[Decision]:
        """Act on the changes, then try up to `limit` more jobs of the current walk."""
        self.now, self.utcnow = now, utcnow
        self.claims.holds.expire(now)
        self._sync()
        memo = self.memo
        walk = memo.walk
        if walk is None:
            time_out(self)
        if walk is None and self.rescheduler is not None and self.rescheduler.due(now):
            self.rescheduler.tick(self)
        if walk is None:
            self.cycles += 1
            retry_partial(self)
            walk = memo.walk = Walk(self.queue.candidates(now))
            walk.candidates.by_placement = True  # the head holds room on real nodes (`backfilling`)
            memo.positions.clear()
        else:
            walk.verdicts.clear()  # the state changed between slices
        done = 0
        for job in walk.candidates:
            offer(self, walk, job)
            done += 1
            if done >= limit:
                return self.recorder.take()
        memo.walk = None
        self._left_ready = len(self.queue)  # ready but not offered (behind a head, maxRunningJobs)
        out = self.recorder.take()
        out.extend(self.admission.status_patches())
        return out

    def _unassume(self, decision: PlaceGang, *, error: str) -> list[Decision]:
        """Creating the gang's Reservations failed (those created were deleted again): forget
        them and back the gang off."""
        self.cache.unassume(decision.reservations)
        self.placed_pods -= len(decision.reservations)
        self.placed_jobs -= 1
        message = f"recording the placement failed: {error}"
        for key in decision.members:
            self.recorder.write_failed(key)  # its Placed status was not written
            if self.cache.snapshot.placed_pods(key):
                self.memo.partial[key] = self.epoch()  # holds pods placed before: retried when worth it
            else:
                self.memo.partial.pop(key, None)
                if self.queue.is_running(key):
                    self.admission.requeue(key)
            pg = self.cache.objects.get_of(PodGroup, *key)
            if isinstance(pg, PodGroup):
                backoff(self, pg, message)
        return self.recorder.take()

    def _write_failed(self, decision: Decision) -> None:
        """A status write or a deletion did not happen: do it again when next due."""
        if isinstance(decision, PatchStatus):
            if decision.kind == "PodGroup":
                self.recorder.write_failed((decision.namespace, decision.name))
                self.cache.recheck((decision.namespace, decision.name))
            else:
                self.admission.write_failed(decision.kind, decision.namespace, decision.name)
        elif isinstance(decision, DeleteReservation):
            self.cache.delete_failed(decision.namespace, decision.name)

    def next_due(self, now: float) -> tuple[bool, float | None]:
        """Whether jobs are ready now (a backoff ended, a rescheduler run or a scheduleTimeout is
        due), and when the next backoff, reclaim delay, hold's end, scheduleTimeout or
        rescheduler run is due (the loop sleeps until then, or until a change)."""
        due = self.queue.release_due(now)
        timeout = self.memo.deadlines.next_due()
        if (
            len(self.queue) > self._left_ready
            or (self.rescheduler is not None and self.rescheduler.due(now))
            or (timeout is not None and timeout <= now)
        ):
            return True, due
        for other in (
            self.claims.next_due(now),
            timeout,
            self.rescheduler.next_due(now) if self.rescheduler else None,
        ):
            if other is not None:
                due = other if due is None else min(due, other)
        return False, due

    def take_counts(self) -> Tally:
        """What was counted since the last call (attempts, preemptions, migrations): the loop
        turns it into metrics."""
        return self.recorder.tally.take()

    def stats(self) -> dict[str, Any]:
        return {
            "placed_pods": self.placed_pods,
            "placed_jobs": self.placed_jobs,
            "waiting": self.queue.waiting(),
            "nodes": self.cache.snapshot.node_count,
            "reservations": self.cache.snapshot.reservation_count,
        }

    def count_placed(self, decision: PlaceGang) -> None:
        self.placed_pods += len(decision.reservations)
        self.placed_jobs += 1

    # --- acting on changes -------------------------------------------------------------------------

    def _sync(self) -> None:
        """Apply what changed since the last call; re-activate parked jobs if worth it."""
        cache, adm = self.cache, self.admission
        synced = cache.sync()
        quota_syncs = {
            "ElasticQuota": adm.sync_quotas,
            "ResourceQuota": adm.sync_resource_quotas,
            "Queue": adm.sync_queues,
        }
        for kind, keys in synced.quotas:
            if adm.changed(kind, keys):  # not just the echo of a status write
                quota_syncs[kind]()
                self.parking.clear()
        known = cache.objects
        if synced.classes is not None:
            self.parking.clear()
            adm.sync_classes(
                synced.classes,
                nodes=known.list_of(Node),
                topologies={t.metadata.name: t for t in known.list_of(NodeTopology)},
            )
        for name, node, topology in synced.nodes:
            adm.node_changed(name, node, topology)
        for key in synced.gone:  # deleted (and maybe created again since): the old one's records go
            self._forget(key)
        for key in synced.groups:
            pg = known.get_of(PodGroup, *key)
            if pg is None:
                if key not in synced.gone:
                    self._forget(key)
            else:
                self._consider(pg, from_event=True)
        epoch = self.epoch()
        if epoch != self._seen_epoch:
            self._seen_epoch = epoch
            self.parking.stays(adm)
            self.queue.wake_parked(epoch)

    def _forget(self, key: tuple[str, str]) -> None:
        """The PodGroup is gone: its Reservations go too, and every record of it."""
        self.cache.forget(key)
        self.admission.forget(key)
        self.claims.forget(key)
        self.memo.forget(key)
        self.recorder.forget(key)
        self.parking.unpark(key)

    def _consider(self, pg: PodGroup, *, from_event: bool = False) -> None:
        """Honour releases and clear done evictions; queue a PodGroup that has pods without a
        Reservation; keep the Suspended and Placed phases current."""
        key = (pg.metadata.namespace, pg.metadata.name)
        adm, rec, memo, now = self.admission, self.recorder, self.memo, self.utcnow
        held = self.cache.note(pg)
        if self.rescheduler is not None:  # a migrating pod whose old place is gone takes its new one
            held = self.rescheduler.promote(self, pg, held)
        view = rec.view(pg)
        if view.evictions:
            left = {p: why for p, why in view.evictions.items() if p in held}
            if left != view.evictions:
                rec.evictions(pg, left)
            if left:  # stopped pods still hold their room: wait until the operator releases them
                if adm.queue.is_running(key) and len(held) - len(left) < max(1, pg.spec.minimum()):
                    adm.requeue(key)  # below its minimum (not an elastic job shrinking): waits again
                return
            self.claims.released(key)
        if pg.spec.suspend:
            adm.forget(key)
            memo.deadlines.drop(key)
            memo.partial.pop(key, None)
            if view.phase != "Suspended":
                rec.status(
                    pg,
                    phase="Suspended",
                    reason="Suspended",
                    message="the job is suspended",
                    placed=len(held),
                    now=now,
                )
            return
        placed = len(held)
        if placed:  # admitted and (at least partly) running
            memo.deadlines.drop(key)
            adm.ensure_running(pg, now=self.now)
            if placed >= pg.spec.total_replicas() and is_complete(pg, held):
                memo.partial.pop(key, None)
                if view.phase != "Placed" and pg.spec.total_replicas() > 0:
                    rec.status(
                        pg,
                        phase="Placed",
                        reason="Placed",
                        message=f"all {placed} pods hold a reservation",
                        placed=placed,
                        now=now,
                    )
            else:
                memo.partial.setdefault(key, -1)
            return
        memo.partial.pop(key, None)
        if adm.queue.is_running(key):  # lost its placement: released or un-assumed
            adm.requeue(key)
        if view.phase == "Failed":
            return  # timed out (`timeouts`): the operator fails the job and deletes the PodGroup
        if view.phase == "Suspended":  # resumed: queued again now, its scheduleTimeoutSeconds anew
            view.queued_at, view.placed_at = None, None
            rec.status(
                pg,
                phase="Pending",
                reason="Queued",
                message="waiting for placement",
                placed=0,
                now=now,
                extra={"placed_at": None},
            )
        elif view.phase == "Placed" and placed == 0:
            rec.status(
                pg, phase="Pending", reason="Queued", message="waiting for placement", placed=0, now=now
            )
        track_deadline(self, pg, view)
        if (
            from_event
            and self.queue.is_held(key)
            and memo.generation.get(key) == pg.metadata.generation
            and key in adm.jobs
        ):
            return  # nothing that changes its fit: it returns by itself when worth it
        adm.enqueue(pg)
