"""The scheduling loop: watch the store, keep the snapshot current, admit and place gangs.

`SchedulerLoop.run()` LISTs nodes, reservations, classes, quotas, queues and PodGroups into a
fresh :class:`Snapshot` and :class:`Admission` (tenant queues + quota tree), then runs two tasks:

* the **watch** follows Node, NodeTopology, Reservation, ResourceClass, PodGroup, ElasticQuota,
  ResourceQuota and Queue changes and only notes their keys (a dirty set) and wakes the cycle;
  on `Gone` it asks for a re-list;
* the **cycles**: apply the dirty keys (snapshot rows, reservations, quota tree, queues,
  capacity), re-activate parked jobs if capacity or quota room may have grown, then walk the
  `FairQueue`'s candidates (DRF across queues, priority/FIFO, aging, backfill): quota and
  ResourceQuota admission first (a blocked job is parked with the cause), then build the gang
  request, `place()` it (pure), run Permit and Reserve plugins, *assume* (create every
  Reservation synchronously), write the PodGroup status and an Event. A gang that does not fit
  is parked with a readable reason and, when its quota is owed its min, may reclaim borrowed
  capacity (`preempting.py`); a failed assume is rolled back and retried after a backoff.
  Quota, queue and ResourceQuota statuses are written once per cycle, only when changed.

Each `schedule_one` is synchronous: between taking a job and recording its placement nothing
else runs, so two decisions never race for the same GPUs. The loop yields to the event loop
every few jobs. Metrics (`gpuyard_scheduler_cycle_seconds{result}`, attempts, pods placed,
PodGroups waiting) go to the context's registry.

What the loop does with a decision — commit a placement, park or back off a job and write why
(PodGroup status, events), the quota parking by shape — is in `recording` (mixed in as
:class:`~gpuyard.scheduler.recording.Recorder`); the metrics are in `metrics`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

import structlog

from gpuyard.apis.resourceclasses import RequestError
from gpuyard.apis.scheduling import PodGroup
from gpuyard.scheduler.framework import CycleState, Profile
from gpuyard.scheduler.gang_requests import GangRequest, ShapeCache, build_gang
from gpuyard.scheduler.gatekeeping import Admission
from gpuyard.scheduler.metrics import SchedulerMetrics
from gpuyard.scheduler.outcomes import Placement, Unschedulable
from gpuyard.scheduler.placing import place
from gpuyard.scheduler.preempting import Reclaimer
from gpuyard.scheduler.profiles import profile_from_settings
from gpuyard.scheduler.quota import FairQueue
from gpuyard.scheduler.recording import Key, QuotaParking, Recorder, is_complete
from gpuyard.scheduler.snapshot import Snapshot
from gpuyard.state.context import Context
from gpuyard.state.store import Gone

__all__ = [
    "SchedulerLoop",
]

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
)
_YIELD_EVERY = 32


class SchedulerLoop(Recorder):
    """The scheduler component (`name`, `async run()`); see the module docstring."""

    name = "scheduler"

    def __init__(
        self,
        ctx: Context,
        *,
        profile: Profile | None = None,
        events: bool = True,
    ) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.clock = ctx.clock
        self.profile = profile or profile_from_settings(ctx.settings)
        self.admission = Admission(ctx.store)
        self.reclaimer = Reclaimer(
            ctx.store, delay=float(getattr(ctx.settings.scheduler, "reclaim_delay", 0.0)), events=events
        )
        self.events = events
        self.port_range = tuple(ctx.settings.operator.host_port_range)
        self.snapshot = Snapshot(port_range=self.port_range)  # type: ignore[arg-type]
        self.metrics = SchedulerMetrics.for_registry(ctx.registry)
        self.cycle_seconds: deque[float] = deque(maxlen=200_000)
        self.synced = asyncio.Event()
        self.placed_pods = 0
        self.placed_jobs = 0
        self._wake = asyncio.Event()
        self._relist = True
        self._dirty: dict[str, set[Key]] = {k: set() for k in WATCHED}
        self._seen_epoch = -1
        self._generation: dict[Key, int] = {}
        self._attempts: dict[Key, int] = {}
        self._failures: dict[Key, int] = {}
        self._referenced_by: dict[Key, set[Key]] = {}  # gang-group member -> PodGroups listing it
        self._refs_of: dict[Key, frozenset[Key]] = {}  # PodGroup -> the members it lists
        self._shapes: ShapeCache = {}
        self._no_fit: dict[tuple, tuple[int, Unschedulable]] = {}
        self._has_topology = False
        self._own_writes: dict[Key, str] = {}  # PodGroup -> resourceVersion of our last status write
        self._left_ready = 0
        self._partial: dict[Key, int] = {}  # running jobs with pods still to place -> epoch last tried
        self._positions: dict[Key, int] = {}  # this cycle: a candidate's position in its queue
        self._last_cause: dict[Key, tuple[str, str, float]] = {}  # reason, cause, when written
        self.parking = QuotaParking()  # jobs parked by quota alone

    @property
    def queue(self) -> FairQueue:
        """The tenant queues (the admission's FairQueue)."""
        return self.admission.queue

    def _epoch(self) -> int:
        """Grows when capacity (snapshot) or quota room (admission) may have grown."""
        return self.snapshot.epoch + self.admission.epoch

    # --- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> None:
        """LIST, then watch and run cycles until cancelled."""
        rv = self.resync()
        self.synced.set()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._watch(rv), name="scheduler-watch")
            tg.create_task(self._cycles(), name="scheduler-cycles")

    def _kinds(self) -> list[str]:
        known = set(self.store.kinds())
        self._has_topology = "NodeTopology" in known
        return [k for k in WATCHED if k in known]

    def resync(self) -> int:
        """Rebuild the snapshot and the queue from a full LIST; return the list's resourceVersion."""
        store = self.store
        rv = store.resource_version
        kinds = self._kinds()
        topologies = (
            {t.metadata.name: t for t in store.list("NodeTopology")} if "NodeTopology" in kinds else {}
        )
        self.snapshot = Snapshot.build(
            nodes=store.list("Node"),
            reservations=store.list("Reservation"),
            topologies=topologies,  # type: ignore[arg-type]
            classes=store.list("ResourceClass") if "ResourceClass" in kinds else (),  # type: ignore[arg-type]
            port_range=self.port_range,  # type: ignore[arg-type]
        )
        self.admission.load(
            nodes=store.list("Node"),  # type: ignore[arg-type]
            classes=store.list("ResourceClass") if "ResourceClass" in kinds else (),  # type: ignore[arg-type]
            topologies=topologies,
        )
        self._no_fit.clear()
        self._partial.clear()
        self.parking.clear()
        for d in self._dirty.values():
            d.clear()
        for pg in store.list("PodGroup"):
            self._consider(pg)  # type: ignore[arg-type]
        self._relist = False
        self._seen_epoch = self._epoch()
        self._wake.set()
        return rv

    async def _watch(self, rv: int) -> None:
        while True:
            try:
                async for ev in self.store.watch(self._kinds(), since=rv):
                    meta = ev.object.metadata
                    self._dirty[ev.object.kind].add((meta.namespace, meta.name))
                    self._wake.set()
                return
            except Gone:
                log.info("scheduler.relist")
                self._relist = True
                rv = self.store.resource_version
                self._wake.set()

    async def _cycles(self) -> None:
        while True:
            await self._wait()
            self.sync()
            await self.cycle()
            self._left_ready = len(self.queue)  # ready but not offered (behind a head, maxRunningJobs)
            self.metrics.pending.set(self.queue.waiting())
            self.admission.write_statuses()

    async def cycle(self) -> int:
        """One walk over the queues' candidates; returns how many jobs were tried."""
        self._retry_partial()
        adm, fq = self.admission, self.queue
        now = self.clock.now()
        candidates = fq.candidates(now)
        self._positions.clear()
        seen: dict[str, int] = {}  # per queue: candidates so far this cycle
        # Quota answers per job shape (quota, demand, namespace) while the quota state stays as it
        # is: many waiting jobs of few shapes cost one check (and one `owed`) per shape. Cleared
        # whenever the state may change (a placement, a reclaim, a sync).
        verdicts: dict[tuple, tuple[str, bool]] = {}
        done = 0
        for job in candidates:
            key: Key = job.key  # type: ignore[assignment]
            self._positions[key] = seen.get(job.queue, 0)
            seen[job.queue] = self._positions[key] + 1
            self.parking.unpark(key)
            try:
                shape = adm.shape(key)
                known = verdicts.get(shape) if shape is not None else None
                reason = known[0] if known is not None else adm.check(key)
                if reason is not None:
                    candidates.blocked(job, reason, reserve=False)
                    self._quota_blocked(key, reason, shape=shape)
                    outcome = None
                else:
                    outcome = self.schedule_one(key)
                    if outcome is None:  # gone, suspended, or nothing to place: the watch brings it back
                        self.queue.park(key, epoch=self._epoch(), reserve=False)
                    if isinstance(outcome, Placement):
                        candidates.placed(job)
                        verdicts.clear()
                    else:
                        why = outcome.full_message() if outcome is not None else ""
                        candidates.blocked(job, why, reserve=outcome is not None)
                if outcome is not None or reason is not None:
                    if reason is not None and shape is not None and known is None:
                        known = verdicts[shape] = (reason, adm.owed(key))
                    if self._maybe_reclaim(key, now, owed=known[1] if known is not None else None):
                        verdicts.clear()
            except Exception:  # one bad job must not stop the scheduler: retry it later
                log.exception("scheduler.cycle_failed", job=f"{key[0]}/{key[1]}")
                self._retry_later(key)
                verdicts.clear()
            done += 1
            if done % _YIELD_EVERY == 0:
                await self.clock.sleep(0)
                if self._relist:
                    break
                self.sync()
                verdicts.clear()
        return done

    def _retry_partial(self) -> None:
        """Running jobs with pods still unplaced (elastic minimum, failover): try again when the
        cluster changed since their last try. Owners whose reclaim delay ended are tried again."""
        for key in self.reclaimer.due(self.clock.now()):
            job = self.queue.get(key)
            if job is not None and self.queue.is_held(key):
                self.queue.add(job)
        epoch = self._epoch()
        for key, tried in list(self._partial.items()):
            if tried < epoch and key in self._partial:
                self._partial[key] = epoch
                self.schedule_one(key)

    def _maybe_reclaim(self, key: Key, now: float, *, owed: bool | None = None) -> bool:
        """Reclaim for `key` if it is owed; whether jobs were preempted."""
        victims = self.reclaimer.consider(
            self.admission,
            key,
            now=now,
            utcnow=self.clock.utcnow(),
            epoch=self._epoch(),
            snapshot=self.snapshot,
            owed=owed,
        )
        if victims:
            self._wake.set()
        return bool(victims)

    async def _wait(self) -> None:
        """Until something changed, or the next backoff or reclaim delay ends."""
        while not self._wake.is_set():
            due = self.queue.release_due(self.clock.now())
            if len(self.queue) > self._left_ready:  # released from backoff: try them
                break
            reclaim = self.reclaimer.next_due(self.clock.now())
            if reclaim is not None:
                due = reclaim if due is None else min(due, reclaim)
            if due is None:
                await self._wake.wait()
                break
            waiter = asyncio.ensure_future(self._wake.wait())
            sleeper = asyncio.ensure_future(self.clock.sleep(max(0.0, due - self.clock.now())))
            try:
                await asyncio.wait({waiter, sleeper}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (waiter, sleeper):
                    task.cancel()
                await asyncio.gather(waiter, sleeper, return_exceptions=True)
        self._wake.clear()

    # --- keeping the snapshot current --------------------------------------------------------

    def sync(self) -> None:
        """Apply what the watch reported since the last call; re-activate parked jobs if worth it."""
        if self._relist:
            self.resync()
            return
        store, snap, dirty, adm = self.store, self.snapshot, self._dirty, self.admission
        for kind, apply in (
            ("ElasticQuota", adm.sync_quotas),
            ("ResourceQuota", adm.sync_resource_quotas),
            ("Queue", adm.sync_queues),
        ):
            if dirty[kind]:
                keys, dirty[kind] = dirty[kind], set()
                if adm.changed(kind, keys):  # not just the echo of a status write
                    apply()
                    self.parking.clear()
        if dirty["ResourceClass"]:
            dirty["ResourceClass"].clear()
            self.parking.clear()
            classes = store.list("ResourceClass")
            if snap.set_classes(classes):  # type: ignore[arg-type]
                self._shapes.clear()
            adm.sync_classes(
                classes,  # type: ignore[arg-type]
                nodes=store.list("Node"),  # type: ignore[arg-type]
                topologies={t.metadata.name: t for t in store.list("NodeTopology")}
                if self._has_topology
                else {},
            )
        topo_changed = dirty["NodeTopology"]
        nodes = dirty["Node"] | {("", name) for _, name in topo_changed}
        dirty["Node"], dirty["NodeTopology"] = set(), set()
        for _, name in nodes:
            node = store.get("Node", "", name)
            if node is None:
                snap.remove_node(name)
                adm.node_changed(name, None, None)
                continue
            if snap.node_rv.get(name) == node.resource_version and ("", name) not in topo_changed:
                continue
            topology = store.get("NodeTopology", "", name) if self._has_topology else None
            snap.refresh_node(node, topology)  # type: ignore[arg-type]
            adm.node_changed(name, node, topology)  # type: ignore[arg-type]
        reservations, dirty["Reservation"] = dirty["Reservation"], set()
        freed: set[Key] = set()  # PodGroups that lost a reservation: look at them even if we wrote last
        for key in reservations:
            res = store.get("Reservation", *key)
            if res is not None:
                snap.upsert_reservation(res)  # type: ignore[arg-type]
            else:
                entry = snap.remove_reservation(key)
                if entry is not None:
                    freed.add(entry.group)
                    self._dirty["PodGroup"].add(entry.group)
        groups, dirty["PodGroup"] = dirty["PodGroup"], set()
        for key in groups:
            pg = store.get("PodGroup", *key)
            if pg is None:
                self._forget(key)
            elif (
                key in freed
                or self._own_writes.get(key) != pg.metadata.resource_version
                or self._generation.get(key) != pg.metadata.generation
            ):  # not just the echo of our own status write
                self._consider(pg, from_event=True)  # type: ignore[arg-type]
        epoch = self._epoch()
        if epoch != self._seen_epoch:
            self._seen_epoch = epoch
            self.queue.wake_parked(epoch, stay=self.parking.stays(self.admission))

    def _forget(self, key: Key) -> None:
        self.admission.forget(key)
        self.reclaimer.forget(key)
        for table in (
            self._generation,
            self._attempts,
            self._failures,
            self._own_writes,
            self._partial,
            self._last_cause,
        ):
            table.pop(key, None)  # type: ignore[attr-defined]
        self.parking.unpark(key)
        self._track_refs(key, frozenset())

    def _track_refs(self, key: Key, refs: frozenset[Key]) -> None:
        """Keep the reverse gang-group index: who lists whom."""
        old = self._refs_of.get(key, frozenset())
        if old == refs:
            return
        for target in old - refs:
            listing = self._referenced_by.get(target)
            if listing is not None:
                listing.discard(key)
                if not listing:
                    del self._referenced_by[target]
        for target in refs - old:
            self._referenced_by.setdefault(target, set()).add(key)
        if refs:
            self._refs_of[key] = refs
        else:
            self._refs_of.pop(key, None)

    def _consider(self, pg: PodGroup, *, from_event: bool = False) -> None:
        """Queue a PodGroup that has pods without a Reservation; keep the Suspended phase current."""
        key = (pg.metadata.namespace, pg.metadata.name)
        if pg.spec.gang_group or key in self._refs_of:
            self._track_refs(key, frozenset(_ref_key(r, key[0]) for r in pg.spec.gang_group))
        status = pg.status
        adm = self.admission
        if pg.spec.suspend:
            adm.forget(key)
            self._partial.pop(key, None)
            if status.phase != "Suspended":
                self._status(key, phase="Suspended", reason="Suspended", message="the job is suspended")
            return
        held = self.snapshot.placed_pods(key)
        placed = len(held)
        if placed:  # admitted and (at least partly) running
            adm.ensure_running(pg, now=self.clock.now())
            if placed >= pg.spec.total_replicas() and is_complete(pg, held):
                self._partial.pop(key, None)
                if status.phase != "Placed" and pg.spec.total_replicas() > 0:
                    self._status(
                        key, phase="Placed", reason="Placed", message=f"all {placed} pods hold a reservation"
                    )
            else:
                self._partial.setdefault(key, -1)
            return
        self._partial.pop(key, None)
        if adm.queue.is_running(key):  # lost its placement: preempted or un-assumed
            adm.requeue(key)
        if status.phase == "Suspended" or (status.phase == "Placed" and placed == 0):
            self._status(key, phase="Pending", reason="Queued", message="waiting for placement")
        if (
            from_event
            and self.queue.is_held(key)
            and self._generation.get(key) == pg.metadata.generation
            and key in adm.jobs
        ):
            return  # our own status write, or nothing that changes its fit: it returns by itself
        adm.enqueue(pg)

    # --- one scheduling cycle ----------------------------------------------------------------

    def schedule_one(self, key: Key) -> Placement | Unschedulable | None:
        """Try to place the PodGroup `key` (and its gang group) now; synchronous."""
        started = time.perf_counter()
        pg = self.store.get("PodGroup", *key)
        if pg is None or pg.spec.suspend:  # type: ignore[attr-defined]
            return None
        self._generation[key] = pg.metadata.generation
        members, waiting_for = self._gang_members(pg)  # type: ignore[arg-type]
        if waiting_for:
            msg = f"waiting for gang-group members: {', '.join(waiting_for)}"
            result = Unschedulable(reason="WaitingForGangGroup", message=msg)
            self._not_placed(members, result)
            return result
        snap = self.snapshot
        try:
            gang = build_gang(
                members,
                placed={m.key[1:]: snap.placed_pods(m.key[1:]) for m in members},
                classes=snap.class_names,
                cache=self._shapes,
            )
        except RequestError as exc:
            result = Unschedulable(reason="InvalidRequest", message=f"{exc.resource}: {exc.reason}")
            self._not_placed(members, result)
            return result
        if not gang.parts:
            return None
        signature = _signature(gang)
        cached = self._no_fit.get(signature) if signature is not None else None
        if cached is not None and cached[0] == snap.epoch:
            self._not_placed(members, cached[1])
            return cached[1]
        state = CycleState(snap, gang, self.profile)
        outcome = place(snap, gang, self.profile, state=state)
        if isinstance(outcome, Placement) and not outcome.pods:  # nothing required, nothing fits
            n = len(outcome.deferred)
            outcome = Unschedulable(
                reason="Unschedulable",
                message=f"none of the {n} pod{'s' if n != 1 else ''} above the minimum fits now; they wait for room",
            )
            self._not_placed(members, outcome)
        elif isinstance(outcome, Placement):
            outcome = self._commit(state, members, outcome)
        else:
            if signature is not None:
                if len(self._no_fit) > 10_000:
                    self._no_fit.clear()
                self._no_fit[signature] = (snap.epoch, outcome)
            self._not_placed(members, outcome)
        elapsed = time.perf_counter() - started
        self.cycle_seconds.append(elapsed)
        placed = isinstance(outcome, Placement)
        self.metrics.observe_cycle(
            elapsed, "placed" if placed else "unschedulable", pods=len(outcome.pods) if placed else 0
        )
        return outcome

    # --- gang groups -------------------------------------------------------------------------

    def _gang_members(self, pg: PodGroup) -> tuple[list[PodGroup], list[str]]:
        """The PodGroups placed together with `pg` (itself first), and the members still missing."""
        lead = (pg.metadata.namespace, pg.metadata.name)
        if not pg.spec.gang_group and not self._referenced_by.get(lead):
            return [pg], []
        members: list[PodGroup] = []
        missing: list[str] = []
        seen = {lead}
        todo = [lead]
        while todo:
            key = todo.pop(0)
            obj = pg if key == lead else self.store.get("PodGroup", *key)
            if obj is None or obj.spec.suspend:  # type: ignore[attr-defined]
                missing.append(f"{key[0]}/{key[1]}" + (" (suspended)" if obj is not None else ""))
                continue
            members.append(obj)  # type: ignore[arg-type]
            refs = [_ref_key(r, key[0]) for r in obj.spec.gang_group]  # type: ignore[attr-defined]
            for back in self._referenced_by.get(key, ()):
                other = self.store.get("PodGroup", *back)
                if other is not None and key in {_ref_key(r, back[0]) for r in other.spec.gang_group}:  # type: ignore[attr-defined]
                    refs.append(back)
            for ref in refs:
                if ref not in seen:
                    seen.add(ref)
                    todo.append(ref)
        return members, missing

    # --- introspection -----------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        return {
            "placed_pods": self.placed_pods,
            "placed_jobs": self.placed_jobs,
            "waiting": self.queue.waiting(),
            "nodes": self.snapshot.node_count,
            "reservations": self.snapshot.reservation_count,
        }


def _ref_key(ref: str, namespace: str) -> Key:
    ns, _, name = ref.rpartition("/")
    return (ns or namespace, name)


def _signature(gang: GangRequest) -> tuple | None:
    """Gangs with the same roles, shapes and counts fit or not alike within one epoch.

    None (do not cache) for gang groups and failover hints, whose explanations name more.
    """
    if len(gang.members) > 1:
        return None
    parts = []
    for p in gang.parts:
        if any(pod.preferred_node for pod in p.pods):
            return None
        parts.append((p.role, p.shape, p.required, len(p.pods)))
    return tuple(parts)
