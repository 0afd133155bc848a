"""The scheduling loop: watch the store, keep the snapshot current, place gangs, assume them.

`SchedulerLoop.run()` LISTs nodes, reservations, classes and PodGroups into a fresh
:class:`Snapshot` and the queue, then runs two tasks:

* the **watch** follows Node, NodeTopology, Reservation, ResourceClass and PodGroup changes and
  only notes their keys (a dirty set) and wakes the cycle; on `Gone` it asks for a re-list;
* the **cycles**: apply the dirty keys to the snapshot (one row per changed node, one entry per
  changed reservation), re-activate parked jobs if capacity may have grown, then take PodGroups
  from the queue one by one: build the gang request, `place()` it (pure), run Permit and
  Reserve plugins, *assume* (create every Reservation synchronously), write the PodGroup
  status and an Event. A gang that does not fit is parked with a readable reason; a failed
  assume is rolled back and retried after a backoff.

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
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpuyard.apis.resourceclasses import RequestError
from gpuyard.apis.scheduling import PodGroup, pod_name
from gpuyard.platform.context import Context
from gpuyard.platform.store import Gone
from gpuyard.scheduler.assuming import AssumeFailed, assume, record_event, write_status
from gpuyard.scheduler.framework import CycleState, Profile
from gpuyard.scheduler.gangs import GangRequest, ShapeCache, build_gang
from gpuyard.scheduler.outcomes import Placement, Unschedulable
from gpuyard.scheduler.placing import place
from gpuyard.scheduler.profiles import profile_from_settings
from gpuyard.scheduler.queueing import PriorityFIFOQueue, SchedulingQueue
from gpuyard.scheduler.snapshot import Snapshot

__all__ = ["SchedulerLoop", "SchedulerMetrics"]

log = structlog.get_logger(__name__)

WATCHED = ("Node", "NodeTopology", "Reservation", "ResourceClass", "PodGroup")
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
        queue: SchedulingQueue | None = None,
        events: bool = True,
    ) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.clock = ctx.clock
        self.profile = profile or profile_from_settings(ctx.settings)
        self.queue: SchedulingQueue = queue or PriorityFIFOQueue()
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
        self._no_fit.clear()
        for d in self._dirty.values():
            d.clear()
        for pg in store.list("PodGroup"):
            self._consider(pg)  # type: ignore[arg-type]
        self._relist = False
        self._seen_epoch = self.snapshot.epoch
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
            done = 0
            while True:
                key = self.queue.pop()
                if key is None:
                    break
                try:
                    self.schedule_one(key)
                except Exception:  # one bad job must not stop the scheduler: retry it later
                    log.exception("scheduler.cycle_failed", job=f"{key[0]}/{key[1]}")
                    self._retry_later(key)
                done += 1
                if done % _YIELD_EVERY == 0:
                    await self.clock.sleep(0)
                    self.sync()
            self.metrics.pending.set(self.queue.waiting())

    async def _wait(self) -> None:
        """Until something changed, or the next backoff ends."""
        while not self._wake.is_set():
            due = self.queue.release_due(self.clock.now())
            if len(self.queue):
                break
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
        store, snap, dirty = self.store, self.snapshot, self._dirty
        if dirty["ResourceClass"]:
            dirty["ResourceClass"].clear()
            if snap.set_classes(store.list("ResourceClass")):  # type: ignore[arg-type]
                self._shapes.clear()
        topo_changed = dirty["NodeTopology"]
        nodes = dirty["Node"] | {("", name) for _, name in topo_changed}
        dirty["Node"], dirty["NodeTopology"] = set(), set()
        for _, name in nodes:
            node = store.get("Node", "", name)
            if node is None:
                snap.remove_node(name)
                continue
            if snap.node_rv.get(name) == node.resource_version and ("", name) not in topo_changed:
                continue
            topology = store.get("NodeTopology", "", name) if self._has_topology else None
            snap.refresh_node(node, topology)  # type: ignore[arg-type]
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
        if snap.epoch != self._seen_epoch:
            self._seen_epoch = snap.epoch
            self.queue.wake_parked(snap.epoch)

    def _forget(self, key: Key) -> None:
        self.queue.discard(key)
        for table in (self._generation, self._attempts, self._failures, self._own_writes):
            table.pop(key, None)  # type: ignore[attr-defined]
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
        if pg.spec.suspend:
            self.queue.discard(key)
            if status.phase != "Suspended":
                self._status(key, phase="Suspended", reason="Suspended", message="the job is suspended")
            return
        held = self.snapshot.placed_pods(key)
        placed = len(held)
        if placed >= pg.spec.total_replicas() and _complete(pg, held):
            self.queue.discard(key)
            if status.phase != "Placed" and pg.spec.total_replicas() > 0:
                self._status(
                    key, phase="Placed", reason="Placed", message=f"all {placed} pods hold a reservation"
                )
            return
        if status.phase == "Suspended" or (status.phase == "Placed" and placed == 0):
            self._status(key, phase="Pending", reason="Queued", message="waiting for placement")
        if from_event and self.queue.is_held(key) and self._generation.get(key) == pg.metadata.generation:
            return  # our own status write, or nothing that changes its fit: it returns by itself
        self.queue.add(key, priority=pg.spec.priority, created=_created(pg))

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
            if not _complete(m, held_pods):
                self.queue.park(key, epoch=self.snapshot.epoch, priority=m.spec.priority, created=_created(m))
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
        epoch = self.snapshot.epoch
        message = result.full_message()
        for m in members:
            key = m.key[1:]
            self.queue.park(key, epoch=epoch, priority=m.spec.priority, created=_created(m))
            held = len(self.snapshot.placed_pods(key))
            old = m.status
            self._attempts[key] = self._attempts.get(key, old.attempts) + 1
            if old.reason == result.reason and old.message == message:
                continue
            phase = "Placed" if held else "Pending"
            self._status(key, phase=phase, reason=result.reason, message=message, placed=held)
            if self.events:
                record_event(
                    self.store,
                    podgroup=m,
                    reason="FailedScheduling",
                    message=message,
                    type_="Warning",
                    now=self.clock.utcnow(),
                )
            log.info("job.unschedulable", job=f"{key[0]}/{key[1]}", reason=result.reason, message=message)

    def _backoff(self, members: list[PodGroup], message: str) -> None:
        for m in members:
            key = m.key[1:]
            n = self._failures.get(key, 0)
            self._failures[key] = n + 1
            delay = min(_BACKOFF_MAX, _BACKOFF_BASE * 2**n)
            self.queue.backoff(
                key, until=self.clock.now() + delay, priority=m.spec.priority, created=_created(m)
            )
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
            self.queue.backoff(
                key, until=self.clock.now() + delay, priority=pg.spec.priority, created=_created(pg)
            )  # type: ignore[attr-defined]

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


def _created(pg: PodGroup) -> float:
    ts = pg.metadata.creation_timestamp
    return ts.timestamp() if ts is not None else 0.0


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
