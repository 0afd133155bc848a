"""The scheduler's synchronous core: changes in, decisions out, no store, no clock, no event loop.

:class:`SchedulerState` holds everything the scheduler knows — its own view of the watched
objects (:class:`~gpuyard.scheduler.cache.objects.ObjectCache`), the NumPy :class:`Snapshot` of free
capacity, the queues and quota (:class:`~gpuyard.scheduler.admission.gatekeeping.Admission`), per-job
records — and has three entry points:

* `load(objects)` (a full LIST) and `apply(changes)` (watch events: object added, modified,
  deleted). They only note what changed; a PodGroup event whose generation, labels and
  annotations did not change is a status-only write (usually the scheduler's own) and is
  ignored, except the first sight and deletes;
* `step(now=, utcnow=)` applies what changed (snapshot rows, reservations, quota tree, queues,
  capacity; spec.release -> delete exactly that Reservation; a deleted PodGroup -> delete its
  Reservations; evictions whose Reservations are gone are cleared), re-activates parked jobs if
  capacity or quota room may have grown, then walks the FairQueue's candidates (DRF across
  queues, priority/FIFO, aging, backfill) — quota admission first, then `place()` (pure) — and
  returns :mod:`~gpuyard.scheduler.decisions` for the loop to write. A walk is done in slices of
  `limit` jobs; `more` says whether the walk goes on at the next `step`;
* `unassume(decision, error=)`: the loop could not create a gang's Reservations; the snapshot
  forgets them and the gang backs off (Kueue's admit pattern); `write_failed(decision)`: a
  status or a deletion was not written and is decided again;
* `take_counts()`: what was counted since the last call (attempts, preemptions, migrations).

The time is what the loop passes in (`now`, `utcnow`); the loop measures how long a step takes
and writes the metrics from the counts.

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
from gpuyard.apis.scheduling import PodGroup, Reservation
from gpuyard.scheduler.admission.gatekeeping import Admission
from gpuyard.scheduler.admission.quota import FairQueue
from gpuyard.scheduler.admission.recording import Key, QuotaParking, Recorder, is_complete
from gpuyard.scheduler.cache.grouping import GangGroups
from gpuyard.scheduler.cache.holds import Holds
from gpuyard.scheduler.cache.objects import ObjectCache
from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.cycle.attempting import GangSignature, Walk, backoff, offer, retry_partial
from gpuyard.scheduler.cycle.timeouts import Deadlines, time_out, track_deadline
from gpuyard.scheduler.decisions import (
    ChangeLike,
    Decision,
    DeleteReservation,
    PatchStatus,
    PlaceGang,
    Tally,
)
from gpuyard.scheduler.gangs.outcomes import Unschedulable
from gpuyard.scheduler.gangs.requests import ShapeCache
from gpuyard.scheduler.placement.framework import Profile
from gpuyard.scheduler.preemption.reclaim import Reclaimer
from gpuyard.scheduler.rescheduling.rescheduler import Rescheduler

__all__ = ["WATCHED", "SchedulerState"]

log = structlog.get_logger(__name__)

WATCHED = (
    "Node",
    "NodeTopology",
    "Reservation",
    "ResourceClass",
    "PodGroup",
    "ElasticQuota",
    "ResourceQuota",
    "Queue",
    "PodDisruptionBudget",
)
STEP_JOBS = 32
"""Jobs per `step`: the loop writes their decisions and takes new changes between slices."""


class SchedulerState:
    """The scheduler's state and decisions (see the module docstring)."""

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
        self.port_range = port_range
        self.objects = ObjectCache(WATCHED)
        self.admission = Admission(self.objects, writes_quota_used=writes_quota_used)
        self.reclaimer = Reclaimer(delay=reclaim_delay)
        self.snapshot = Snapshot(port_range=port_range)
        self.recorder = Recorder(events=events)
        self.parking = QuotaParking()  # jobs parked by quota alone
        self.groups = GangGroups()
        self.placed_pods = 0
        self.placed_jobs = 0
        self.cycles = 0
        self.now = 0.0
        self.utcnow = datetime.fromtimestamp(0, UTC)
        self.shapes: ShapeCache = {}
        self.no_fit: dict[GangSignature, tuple[tuple[int, int], Unschedulable]] = {}
        self.never_fit: dict[object, tuple[tuple[int, int], str | None]] = {}  # per shape and nodes
        self.never_jobs: dict[Key, tuple[tuple[int, int, int], Unschedulable | None]] = {}  # per job
        self.head_plans: dict[Key, tuple[tuple[int, int], str, float]] = {}  # head's plan, state, time
        self.holds = Holds()  # room held for nominated preemptors and the backfill head
        self.preempting: dict[Key, set[Key]] = {}  # preemptor -> its victims still stopping
        self.deadlines = Deadlines()  # waiting gangs' scheduleTimeoutSeconds (`timeouts`)
        self.preempt_tried: dict[Key, int] = {}  # preemptor -> epoch of its last search
        self.lowest_running: tuple[int, int | None] | None = None  # (epoch, lowest running priority)
        self.backfill_hold_seconds = backfill_hold_seconds
        self.nomination_seconds = nomination_seconds
        self.partial: dict[Key, int] = {}  # running jobs with pods still to place -> epoch last tried
        self.positions: dict[Key, int] = {}  # this cycle: a candidate's position in its queue
        self.generation: dict[Key, int] = {}  # generation at the last attempt
        self._sigs: dict[Key, Signature] = {}  # PodGroup: (generation, labels, annotations) last seen
        self._dirty: dict[str, set[Key]] = {k: set() for k in WATCHED}
        self._assumed: dict[Key, Reservation] = {}  # assumed, not yet seen back from the store
        self._deleting: dict[Key, str] = {}  # Reservation -> uid, deletion decided
        self._gone: set[Key] = set()  # PodGroups deleted since the last step
        self._uids: dict[Key, str] = {}  # PodGroup -> the uid whose Reservations it holds
        self._walk: Walk | None = None
        self.rescheduler: Rescheduler | None = None  # the defragmenting rescheduler (`rescheduling`)
        self._left_ready = 0
        self._seen_epoch = -1

    @property
    def queue(self) -> FairQueue:
        """The tenant queues (the admission's FairQueue)."""
        return self.admission.queue

    @property
    def more(self) -> bool:
        """A walk is under way: call `step` again soon."""
        return self._walk is not None

    def epoch(self) -> int:
        """Grows when capacity (snapshot) or quota room (admission) may have grown."""
        return self.snapshot.epoch + self.admission.epoch + self.holds.released

    # --- input -----------------------------------------------------------------------------------

    def load(self, objects: Mapping[str, Iterable[Resource]], *, now: float, utcnow: datetime) -> None:
        """Start over from a full LIST: `objects` per watched kind the cluster knows."""
        self.now, self.utcnow = now, utcnow
        cache = self.objects
        cache.reset(k for k in WATCHED if k in objects)
        for items in objects.values():
            for obj in items:
                cache.put(obj)
        topologies = {t.metadata.name: t for t in cache.list_of(NodeTopology)}
        classes = cache.list_of(ResourceClass)
        self.snapshot = Snapshot.build(
            nodes=cache.list_of(Node),
            reservations=cache.list_of(Reservation),
            topologies=topologies,
            classes=classes,
            port_range=self.port_range,
        )
        self.admission.load(nodes=cache.list_of(Node), classes=classes, topologies=topologies)
        self.no_fit.clear()
        self.never_fit.clear()
        self.never_jobs.clear()
        self.head_plans.clear()
        self.holds = Holds()
        self.preempting.clear()
        self.deadlines.clear()
        self.preempt_tried.clear()
        self.partial.clear()
        self.parking.clear()
        self.recorder.clear()
        self.groups.clear()
        self._sigs.clear()
        self._gone.clear()
        self._uids.clear()
        self._assumed.clear()
        self._deleting.clear()
        self._walk = None
        for d in self._dirty.values():
            d.clear()
        for res in cache.list_of(Reservation):
            self._collect_if_orphan(res)
        for pg in cache.list_of(PodGroup):
            self._sigs[(pg.metadata.namespace, pg.metadata.name)] = _signature_of(pg)
            self.groups.seen(pg)
        for pg in cache.list_of(PodGroup):
            self._consider(pg)
        self._seen_epoch = self.epoch()

    def apply(self, changes: Iterable[ChangeLike]) -> None:
        """Note watch events (anything with `type` and `object`); `step` acts on them."""
        cache, dirty = self.objects, self._dirty
        for change in changes:
            obj = change.object
            kind = obj.kind
            meta = obj.metadata
            key = (meta.namespace, meta.name)
            if change.type == "DELETED":
                cache.pop(kind, key)
                if kind == "PodGroup":
                    self._gone.add(key)
            else:
                cache.put(obj)
                if kind == "PodGroup":
                    sig = _signature_of(obj)
                    if self._sigs.get(key) == sig:
                        continue  # a status-only write: nothing the scheduler decides on changed
                    self._sigs[key] = sig
                elif kind == "Reservation" and self._assumed.pop(key, None) is not None:
                    continue  # the echo of our own create: the snapshot holds it already
            if kind in dirty:
                dirty[kind].add(key)

    # --- output ----------------------------------------------------------------------------------

    def step(self, *, now: float, utcnow: datetime, limit: int = STEP_JOBS) -> list[Decision]:
        """Act on the changes, then try up to `limit` more jobs of the current walk."""
        self.now, self.utcnow = now, utcnow
        self.holds.expire(now)
        self._sync()
        walk = self._walk
        if walk is None:
            time_out(self)
        if walk is None and self.rescheduler is not None and self.rescheduler.due(now):
            self.rescheduler.tick(self)
        if walk is None:
            self.cycles += 1
            retry_partial(self)
            walk = self._walk = Walk(self.queue.candidates(now))
            walk.candidates.by_placement = True  # the head holds room on real nodes (`backfilling`)
            self.positions.clear()
        else:
            walk.verdicts.clear()  # the state changed between slices
        done = 0
        for job in walk.candidates:
            offer(self, walk, job)
            done += 1
            if done >= limit:
                return self.recorder.take()
        self._walk = None
        self._left_ready = len(self.queue)  # ready but not offered (behind a head, maxRunningJobs)
        out = self.recorder.take()
        out.extend(self.admission.status_patches())
        return out

    def unassume(self, decision: PlaceGang, *, error: str) -> list[Decision]:
        """Creating the gang's Reservations failed (those created were deleted again): forget
        them and back the gang off."""
        for res in decision.reservations:
            key = (res.metadata.namespace, res.metadata.name)
            self._assumed.pop(key, None)
            self.snapshot.remove_reservation(key)
            current = self.objects.get_of(Reservation, *key)
            if isinstance(current, Reservation) and self._deleting.get(key) != current.metadata.uid:
                self.snapshot.upsert_reservation(current)  # its deletion failed: it holds the room
        self.placed_pods -= len(decision.reservations)
        self.placed_jobs -= 1
        message = f"recording the placement failed: {error}"
        for key in decision.members:
            self.recorder.write_failed(key)  # its Placed status was not written
            if self.snapshot.placed_pods(key):
                self.partial[key] = self.epoch()  # holds pods placed before: retried when worth it
            else:
                self.partial.pop(key, None)
                if self.queue.is_running(key):
                    self.admission.requeue(key)
            pg = self.objects.get_of(PodGroup, *key)
            if isinstance(pg, PodGroup):
                backoff(self, pg, message)
        return self.recorder.take()

    def write_failed(self, decision: Decision) -> None:
        """A status write or a deletion did not happen: do it again when next due."""
        if isinstance(decision, PatchStatus):
            if decision.kind == "PodGroup":
                self.recorder.write_failed((decision.namespace, decision.name))
                self._dirty["PodGroup"].add((decision.namespace, decision.name))
            else:
                self.admission.write_failed(decision.kind, decision.namespace, decision.name)
        elif isinstance(decision, DeleteReservation):
            self._deleting.pop((decision.namespace, decision.name), None)
            key = (decision.namespace, decision.name)
            res = self.objects.get_of(Reservation, *key)
            if isinstance(res, Reservation):  # it still holds its room: decided again next step
                if key not in self._assumed:  # else the create under its name fails: `unassume`
                    self.snapshot.upsert_reservation(res)
                self._dirty["PodGroup"].add((decision.namespace, res.spec.pod_group))

    def next_due(self, now: float) -> tuple[bool, float | None]:
        """Whether jobs are ready now (a backoff ended, a rescheduler run or a scheduleTimeout is
        due), and when the next backoff, reclaim delay, scheduleTimeout or rescheduler run is due
        (the loop sleeps until then, or until a change)."""
        due = self.queue.release_due(now)
        timeout = self.deadlines.next_due()
        if (
            len(self.queue) > self._left_ready
            or (self.rescheduler is not None and self.rescheduler.due(now))
            or (timeout is not None and timeout <= now)
        ):
            return True, due
        for other in (
            self.reclaimer.next_due(now),
            self.holds.next_due(),
            self.deadlines.next_due(),
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
            "nodes": self.snapshot.node_count,
            "reservations": self.snapshot.reservation_count,
        }

    def assumed(self, reservations: list[Reservation]) -> None:
        """`attempting` recorded these in the snapshot; their store echo is not news."""
        for res in reservations:
            self._assumed[(res.metadata.namespace, res.metadata.name)] = res

    def forget_reservation(self, ns: str, name: str, uid: str) -> None:
        """Decide to delete a Reservation of the scheduler's own (the rescheduler's moves)."""
        self._delete(ns, name, uid)

    def evicting(self, pg: PodGroup) -> bool:
        """Pods of `pg` the scheduler asked to stop still hold their Reservations."""
        return bool(self.recorder.view(pg).evictions)

    # --- keeping the snapshot current ------------------------------------------------------------

    def _sync(self) -> None:
        """Apply what changed since the last call; re-activate parked jobs if worth it."""
        cache, snap, dirty, adm = self.objects, self.snapshot, self._dirty, self.admission
        for kind, sync in (
            ("ElasticQuota", adm.sync_quotas),
            ("ResourceQuota", adm.sync_resource_quotas),
            ("Queue", adm.sync_queues),
        ):
            if dirty[kind]:
                keys, dirty[kind] = dirty[kind], set()
                if adm.changed(kind, keys):  # not just the echo of a status write
                    sync()
                    self.parking.clear()
        if dirty["ResourceClass"]:
            dirty["ResourceClass"].clear()
            self.parking.clear()
            classes = cache.list_of(ResourceClass)
            if snap.set_classes(classes):
                self.shapes.clear()
            adm.sync_classes(
                classes,
                nodes=cache.list_of(Node),
                topologies={t.metadata.name: t for t in cache.list_of(NodeTopology)},
            )
        topo_changed = dirty["NodeTopology"]
        nodes = dirty["Node"] | {("", name) for _, name in topo_changed}
        dirty["Node"], dirty["NodeTopology"] = set(), set()
        for _, name in nodes:
            node = cache.get_of(Node, "", name)
            if node is None:
                snap.remove_node(name)
                adm.node_changed(name, None, None)
                continue
            if snap.node_obj.get(name) is node and ("", name) not in topo_changed:
                continue
            topology = cache.get_of(NodeTopology, "", name)
            snap.refresh_node(node, topology)
            adm.node_changed(name, node, topology)
        reservations, dirty["Reservation"] = dirty["Reservation"], set()
        freed: set[Key] = set()  # PodGroups that lost a reservation: look at them again
        for key in reservations:
            res = cache.get_of(Reservation, *key)
            if isinstance(res, Reservation):
                if self._deleting.get(key) == res.metadata.uid:
                    continue  # freed when its deletion was decided
                snap.upsert_reservation(res)
                self._collect_if_orphan(res)
            else:
                self._deleting.pop(key, None)
                if key in self._assumed:
                    continue  # the old one under a name given again: the snapshot holds the new one
                entry = snap.remove_reservation(key)
                if entry is not None:
                    freed.add(entry.group)
        groups, dirty["PodGroup"] = dirty["PodGroup"] | freed, set()
        gone, self._gone = self._gone, set()
        for key in gone:  # deleted (and maybe created again since): the old one's records go
            self._forget(key)
        for key in groups:
            pg = cache.get_of(PodGroup, *key)
            if pg is None:
                if key not in gone:
                    self._forget(key)
            else:
                self._consider(pg, from_event=True)
        epoch = self.epoch()
        if epoch != self._seen_epoch:
            self._seen_epoch = epoch
            self.queue.wake_parked(epoch, stay=self.parking.stays(adm))

    def _collect_if_orphan(self, res: Reservation) -> None:
        """A Reservation whose PodGroup is gone (or was recreated) is deleted."""
        ns = res.metadata.namespace
        pg = self.objects.get_of(PodGroup, ns, res.spec.pod_group)
        owners = [r.uid for r in res.metadata.owner_references if r.kind == "PodGroup"]
        if pg is not None and (not owners or pg.metadata.uid in owners):
            return
        self._delete(ns, res.metadata.name, res.metadata.uid)

    def _collect_stale(self, pg: PodGroup, held: Mapping[str, str]) -> None:
        """Collect Reservations of `pg`'s name that an earlier PodGroup owned."""
        ns = pg.metadata.namespace
        for pod in held:
            res = self.objects.get_of(Reservation, ns, pod)
            owners = [r.uid for r in res.metadata.owner_references if r.kind == "PodGroup"] if res else []
            if res is not None and owners and pg.metadata.uid not in owners:
                self._delete(ns, pod, res.metadata.uid)

    def _delete(self, ns: str, name: str, uid: str) -> None:
        """Decide to delete a Reservation: its room is free in the snapshot at once (as a
        placement is assumed when decided); if the deletion fails, it is held again."""
        if (ns, name) in self._deleting and self._deleting[(ns, name)] in (uid, ""):
            return
        self._deleting[(ns, name)] = uid
        self.recorder.out.append(DeleteReservation(ns, name, uid))
        self.snapshot.remove_reservation((ns, name))

    def _forget(self, key: Key) -> None:
        """The PodGroup is gone: its Reservations go too, and every record of it."""
        for pod in self.snapshot.placed_pods(key):
            res = self.objects.get_of(Reservation, key[0], pod)
            self._delete(key[0], pod, res.metadata.uid if res is not None else "")
        self.admission.forget(key)
        self.holds.drop(key)
        self.deadlines.drop(key)
        self.head_plans.pop(key, None)
        self.never_jobs.pop(key, None)
        self.preempting.pop(key, None)
        self.preempt_tried.pop(key, None)
        self._released_victim(key)
        self.reclaimer.forget(key)
        self.reclaimer.released(key)
        self.recorder.forget(key)
        self.generation.pop(key, None)
        self.partial.pop(key, None)
        self._sigs.pop(key, None)
        self._uids.pop(key, None)
        self.parking.unpark(key)
        self.groups.forget(key)

    def _released_victim(self, victim: Key) -> None:
        """A victim's evicted Reservations are all gone (or it is gone)."""
        for owner, victims in list(self.preempting.items()):
            victims.discard(victim)
            if not victims:
                del self.preempting[owner]

    def _consider(self, pg: PodGroup, *, from_event: bool = False) -> None:
        """Honour releases and clear done evictions; queue a PodGroup that has pods without a
        Reservation; keep the Suspended and Placed phases current."""
        key = (pg.metadata.namespace, pg.metadata.name)
        self.groups.seen(pg)
        adm, rec, now = self.admission, self.recorder, self.utcnow
        held = self.snapshot.placed_pods(key)
        if held and self._uids.get(key) != pg.metadata.uid:
            self._collect_stale(pg, held)  # an earlier PodGroup of this name held them
        self._uids[key] = pg.metadata.uid
        for pod, uid in pg.spec.release.items():
            res = self.objects.get_of(Reservation, key[0], pod)
            if pod in held and res is not None and res.metadata.uid == uid:
                self._delete(key[0], pod, uid)
        held = self.snapshot.placed_pods(key)
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
            self.reclaimer.released(key)
            self._released_victim(key)
        if pg.spec.suspend:
            adm.forget(key)
            self.deadlines.drop(key)
            self.partial.pop(key, None)
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
            self.deadlines.drop(key)
            adm.ensure_running(pg, now=self.now)
            if placed >= pg.spec.total_replicas() and is_complete(pg, held):
                self.partial.pop(key, None)
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
                self.partial.setdefault(key, -1)
            return
        self.partial.pop(key, None)
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
            and self.generation.get(key) == pg.metadata.generation
            and key in adm.jobs
        ):
            return  # nothing that changes its fit: it returns by itself when worth it
        adm.enqueue(pg)

    def count_placed(self, decision: PlaceGang) -> None:
        self.placed_pods += len(decision.reservations)
        self.placed_jobs += 1


Signature = tuple[int, str, tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]


def _signature_of(pg: Resource) -> Signature:
    """What a PodGroup event must change for the scheduler to look at it again (only its
    metadata is read, so any object will do)."""
    meta = pg.metadata
    return (meta.generation, meta.uid, tuple(meta.labels.items()), tuple(meta.annotations.items()))
