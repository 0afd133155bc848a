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
  capacity (`reclaiming.py`); a failed assume is rolled back and retried after a backoff.
  Quota, queue and ResourceQuota statuses are written once per cycle, only when changed.

Each `schedule_one` is synchronous: between taking a job and recording its placement nothing
else runs, so two decisions never race for the same GPUs. The loop yields to the event loop
every few jobs. Metrics (`gpuyard_scheduler_cycle_seconds{result}`, attempts, pods placed,
PodGroups waiting) go to the context's registry.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpuyard.apis.resourceclasses import RequestError
from gpuyard.apis.scheduling import PodGroup, pod_name
from gpuyard.platform.context import Context
from gpuyard.platform.store import Gone
from gpuyard.scheduler.admitting import Admission
from gpuyard.scheduler.assuming import AssumeFailed, assume, record_event, write_status
from gpuyard.scheduler.framework import CycleState, Profile
from gpuyard.scheduler.gangs import GangRequest, ShapeCache, build_gang
from gpuyard.scheduler.outcomes import Placement, Unschedulable
from gpuyard.scheduler.placing import place
from gpuyard.scheduler.profiles import profile_from_settings
from gpuyard.scheduler.quota import FairQueue
from gpuyard.scheduler.reclaiming import Reclaimer
from gpuyard.scheduler.snapshot import Snapshot

__all__ = ["SchedulerLoop", "SchedulerMetrics"]

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
_STATUS_EVERY = 10.0  # seconds: a waiting job's position-only message changes are written this often
_YIELD_EVERY = 32
_BACKOFF_BASE = 0.5
_BACKOFF_MAX = 60.0

Key = tuple[str, str]


_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, SchedulerMetrics] = weakref.WeakKeyDictionary()


class SchedulerMetrics:
    """Cycle time by result, attempts, pods placed, PodGroups waiting — on an injected registry.

    One set per registry: components built twice on one registry share it.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.cycle = Histogram(
            "gpuyard_scheduler_cycle_seconds",
            "Time to decide and assume one gang.",
            ["result"],
            buckets=_BUCKETS,
            registry=registry,
        )
        self.attempts = Counter(
            "gpuyard_scheduler_attempts", "Scheduling attempts by result.", ["result"], registry=registry
        )
        self.placed = Counter("gpuyard_scheduler_placed_pods", "Pods given a reservation.", registry=registry)
        self.pending = Gauge(
            "gpuyard_scheduler_pending_podgroups",
            "PodGroups waiting in the scheduling queue.",
            registry=registry,
        )
        self._children: dict[str, tuple[Any, Any]] = {}

    @classmethod
    def for_registry(cls, registry: CollectorRegistry) -> SchedulerMetrics:
        metrics = _BY_REGISTRY.get(registry)
        if metrics is None:
            metrics = _BY_REGISTRY[registry] = cls(registry)
        return metrics

    def observe_cycle(self, seconds: float, result: str, *, pods: int = 0) -> None:
        children = self._children.get(result)
        if children is None:
            children = self._children[result] = (self.cycle.labels(result), self.attempts.labels(result))
        children[0].observe(seconds)
        children[1].inc()
        if pods:
            self.placed.inc(pods)


class SchedulerLoop:
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
        self._quota_parked: dict[Key, tuple] = {}  # parked by quota alone since last tried -> shape
        self._by_shape: dict[tuple, set[Key]] = {}  # the same, per shape

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
        self._drop_quota_parking()
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
            self._unpark_quota(key)
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

    def _quota_blocked(self, key: Key, reason: str, *, shape: tuple | None = None) -> None:
        pg = self.store.get("PodGroup", *key)
        self.queue.park(key, epoch=self._epoch(), reason=reason, reserve=False)
        self._park_quota(key, shape)
        if pg is None:
            return
        code = "ResourceQuotaExceeded" if reason.startswith("ResourceQuota") else "QuotaExceeded"
        self._attempts[key] = self._attempts.get(key, pg.status.attempts) + 1  # type: ignore[attr-defined]
        self._waiting(pg, code, reason, held=0)  # type: ignore[arg-type]

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
                    self._drop_quota_parking()
        if dirty["ResourceClass"]:
            dirty["ResourceClass"].clear()
            self._drop_quota_parking()
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
            self.queue.wake_parked(epoch, stay=self._quota_stays())

    def _quota_stays(self) -> Callable[[Key], bool] | None:
        """For `wake_parked`: jobs parked by quota alone stay parked while quota still blocks
        their shape and reclaim cannot help it (not owed). One check per shape, so a change
        elsewhere does not send every waiting job through a cycle again."""
        adm = self.admission
        for keys in list(self._by_shape.values()):
            rep = next(iter(keys))
            if adm.check(rep) is None or adm.owed(rep):
                for key in list(keys):
                    self._unpark_quota(key)
        return self._quota_parked.__contains__ if self._quota_parked else None

    def _park_quota(self, key: Key, shape: tuple | None) -> None:
        self._unpark_quota(key)
        if shape is not None:
            self._quota_parked[key] = shape
            self._by_shape.setdefault(shape, set()).add(key)

    def _unpark_quota(self, key: Key) -> None:
        shape = self._quota_parked.pop(key, None)
        if shape is not None:
            keys = self._by_shape[shape]
            keys.discard(key)
            if not keys:
                del self._by_shape[shape]

    def _drop_quota_parking(self) -> None:
        """Quota configuration changed: shapes may mean other quotas; wake by epoch as usual."""
        self._quota_parked.clear()
        self._by_shape.clear()

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
        self._unpark_quota(key)
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
            if placed >= pg.spec.total_replicas() and _complete(pg, held):
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
            self._unpark_quota(key)
            self._last_cause.pop(key, None)
            if _complete(m, held_pods):
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
            self._unpark_quota(key)
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


def _complete(pg: PodGroup, held: dict[str, str]) -> bool:
    """Every replica of every role holds a reservation."""
    name = pg.metadata.name
    return all(pod_name(name, r.name, i) in held for r in pg.spec.roles for i in range(r.replicas))


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
