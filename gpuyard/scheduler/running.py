"""The scheduling loop: the async shell around the synchronous core (`core.SchedulerState`).

`SchedulerLoop.run()` LISTs the watched kinds into the core (`load`), then runs two tasks:

* the **watch** follows Node, NodeTopology, Reservation, ResourceClass, PodGroup, ElasticQuota,
  ResourceQuota and Queue changes, buffers them and wakes the cycles; on `Gone` it asks for a
  re-list;
* the **cycles**: hand the buffered changes to the core (`apply`), take its decisions (`step`)
  and execute them through the context's writer — a gang's Reservations first, then its
  `Placed` statuses and events; if one create fails, the Reservations created for that gang
  are deleted again and the core un-assumes it and backs it off (Kueue's admit pattern). A walk
  over the queues is taken in slices; between slices the loop yields to the event loop.

The loop sleeps until a change arrives or the next backoff or reclaim delay ends.

The loop owns the time and the metrics; the core reads no clock and writes no metric. It passes
the clock's `now` and `utcnow` into every `load` and `step`, measures how long each `step` takes,
and turns what the core counted meanwhile (`take_counts`) into the metrics on the context's
registry: `gpuyard_scheduler_cycle_seconds{result}` (each attempt of a step is observed with the
step's time shared among its attempts), attempts, pods placed, PodGroups waiting (after each
walk), jobs preempted and the GPU-hours they lose, jobs migrated.

It also serves the rescheduler's requests (`POST /api/v1/scheduler:reschedule`): :func:`service_for`
finds the :class:`ReschedulerService` of the scheduler running over a store.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Coroutine
from functools import cached_property
from typing import Any
from weakref import WeakKeyDictionary

import structlog

from gpuyard.apis.scheduling import LABEL_JOB_NAME
from gpuyard.scheduler.admission.gatekeeping import Admission
from gpuyard.scheduler.admission.quota import FairQueue
from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.core import WATCHED, SchedulerState
from gpuyard.scheduler.decisions import (
    CreateFailed,
    Decision,
    DeleteReservation,
    PatchStatus,
    PlaceGang,
    RecordEvent,
    RescheduleRequested,
    Stimulus,
    Tally,
    WriteFailed,
)
from gpuyard.scheduler.metrics import SchedulerMetrics
from gpuyard.scheduler.placement.framework import Profile
from gpuyard.scheduler.placement.profiles import profile_from_settings
from gpuyard.scheduler.rescheduling.rescheduler import Rescheduler, Result
from gpuyard.state.config import SchedulerConfig
from gpuyard.state.context import Context
from gpuyard.state.events import EventRecorder
from gpuyard.state.ownership import SCHEDULER
from gpuyard.state.store import AlreadyExists, Gone, NotFound, Store
from gpuyard.state.writing import StoreWriter, Writer, unidentified

__all__ = ["ReschedulerService", "SchedulerLoop", "service_for"]

log = structlog.get_logger(__name__)

_UNDO_ATTEMPTS = 5


QUOTA_USED_WRITERS = frozenset({"koordinator", "coscheduling"})
"""Gang schedulers whose own controller maintains ElasticQuota `status.used` (Koordinator's quota
plugin, scheduler-plugins' elastic quota controller)."""


def quota_used_elsewhere(scheduler: SchedulerConfig) -> bool:
    """Delegate mode to a gang scheduler that writes ElasticQuota `status.used` itself."""
    return scheduler.mode == "delegate" and scheduler.gang_scheduler in QUOTA_USED_WRITERS


class ReschedulerService:
    """The rescheduler of a running scheduler, as the HTTP route (and benchmarks) ask it."""

    def __init__(self, rescheduler: Rescheduler, *, submit: Callable[[Stimulus], None]) -> None:
        self._rescheduler = rescheduler  # read for its counters; asked through the loop
        self._submit = submit

    @property
    def migrations(self) -> int:
        return self._rescheduler.migrations

    @property
    def gpu_hours_lost(self) -> float:
        return self._rescheduler.gpu_hours_lost

    def request(self, *, dry_run: bool) -> Coroutine[Any, Any, Result]:
        """Ask for a run at the next cycle (a stimulus to the loop, which wakes); the coroutine
        answers its result."""
        fut: asyncio.Future[Result] = asyncio.get_running_loop().create_future()

        def reply(result: Result) -> None:
            if not fut.done():
                fut.set_result(result)

        self._submit(RescheduleRequested(dry_run, reply))
        return _wait(fut)


_SERVICES: WeakKeyDictionary[Store, ReschedulerService] = WeakKeyDictionary()


def service_for(store: Store) -> ReschedulerService | None:
    """The rescheduler of the scheduler running over `store` (the HTTP route asks it)."""
    return _SERVICES.get(store)


async def _wait(fut: asyncio.Future[Result]) -> Result:
    return await fut


class SchedulerLoop:
    """The scheduler component (`name`, `async run()`); see the module docstring."""

    name = "scheduler"
    needs_leader = True  # writes Reservations, PodGroup status and events

    def __init__(self, ctx: Context, *, profile: Profile | None = None, events: bool = True) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.clock = ctx.clock
        assert ctx.writer is not None  # the context always has one
        self.writer: Writer = ctx.writer
        # A write is answered at once by the in-memory writer without a journal; otherwise (a
        # journal's group commit, an API server) it waits, and independent writes go together.
        self._together = ctx.journal is not None or not isinstance(unidentified(ctx.writer), StoreWriter)
        port_lo, port_hi = ctx.settings.operator.host_port_range
        self.state = SchedulerState(
            profile=profile or profile_from_settings(ctx.settings),
            port_range=(port_lo, port_hi),
            reclaim_delay=float(getattr(ctx.settings.scheduler, "reclaim_delay", 0.0)),
            nomination_seconds=float(getattr(ctx.settings.scheduler, "nomination_seconds", 300.0)),
            backfill_hold_seconds=float(getattr(ctx.settings.scheduler, "backfill_hold_seconds", 3600.0)),
            events=events,
            writes_quota_used=not quota_used_elsewhere(ctx.settings.scheduler),
        )
        self.metrics = SchedulerMetrics.for_registry(ctx.registry)
        self.cycle_seconds: deque[float] = deque(maxlen=200_000)  # per attempt (see the module docstring)
        self.synced = asyncio.Event()
        self._wake = asyncio.Event()
        self.state.rescheduler = Rescheduler(ctx.settings.scheduler.rescheduler)
        _SERVICES[ctx.store] = ReschedulerService(self.state.rescheduler, submit=self._submit)
        self._relist = True
        self._inbox: list[Stimulus] = []  # watch events and requests, for the next step

    # what tests and benchmarks read
    @property
    def snapshot(self) -> Snapshot:
        return self.state.cache.snapshot

    @property
    def admission(self) -> Admission:
        return self.state.admission

    @property
    def queue(self) -> FairQueue:
        return self.state.queue

    @property
    def placed_pods(self) -> int:
        return self.state.placed_pods

    @property
    def placed_jobs(self) -> int:
        return self.state.placed_jobs

    def stats(self) -> dict[str, Any]:
        return self.state.stats()

    # --- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> None:
        """LIST, then watch and run cycles until cancelled."""
        rv = self._resync()
        self.synced.set()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._watch(rv), name="scheduler-watch")
            tg.create_task(self._cycles(), name="scheduler-cycles")

    def _submit(self, stimulus: Stimulus) -> None:
        """A stimulus from outside the watch (a reschedule request): applied at the next step."""
        self._inbox.append(stimulus)
        self._wake.set()

    def _kinds(self) -> list[str]:
        known = set(self.store.kinds())
        return [k for k in WATCHED if k in known]

    def _resync(self) -> int:
        """Load the core from a full LIST; return the list's resourceVersion."""
        rv = self.store.resource_version
        self.state.load(
            {k: self.store.list(k) for k in self._kinds()}, now=self.clock.now(), utcnow=self.clock.utcnow()
        )
        self._inbox = [s for s in self._inbox if isinstance(s, RescheduleRequested)]  # changes: in the LIST
        self._relist = False
        self._wake.set()
        return rv

    async def _watch(self, rv: int) -> None:
        while True:
            try:
                async for ev in self.store.watch(self._kinds(), since=rv):
                    self._inbox.append(ev)
                    self._wake.set()
                return
            except Gone:
                log.info("scheduler.relist")
                self._relist = True
                rv = self.store.resource_version
                self._wake.set()

    async def _cycles(self) -> None:
        state, clock = self.state, self.clock
        while True:
            await self._wait()
            while True:
                if self._relist:
                    self._resync()
                stimuli, self._inbox = self._inbox, []
                answered = state.apply(stimuli)
                if answered:
                    await self.execute(answered)
                started = time.perf_counter()
                decisions = state.step(now=clock.now(), utcnow=clock.utcnow())
                self._observe(state.take_counts(), time.perf_counter() - started)
                if not state.more:  # a walk ended
                    self.metrics.pending.set(state.queue.waiting())
                if decisions:
                    await self.execute(decisions)
                if not state.more:
                    break
                await clock.sleep(0)

    def _observe(self, counts: Tally, seconds: float) -> None:
        """Metrics of one step: its attempts (each with the step's time shared among them), the
        pods placed, the jobs preempted and migrated."""
        metrics = self.metrics
        if counts.attempts:
            each = seconds / counts.attempts
            self.cycle_seconds.extend([each] * counts.attempts)
            metrics.observe_cycles(each, "placed", count=counts.placed, pods=counts.pods)
            metrics.observe_cycles(each, "unschedulable", count=counts.unschedulable)
        for reason, jobs in counts.preemptions.items():
            metrics.preempted(reason, jobs=jobs)
        metrics.lost(counts.gpu_hours_lost)
        metrics.migrated(counts.migrations)

    async def _wait(self) -> None:
        """Until something changed, or the next backoff or reclaim delay ends."""
        while not self._wake.is_set():
            ready, due = self.state.next_due(self.clock.now())
            if ready:
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

    # --- executing decisions -------------------------------------------------------------------

    async def execute(self, decisions: list[Decision]) -> None:
        """Write the core's decisions; failures go back to the core.

        When the writer answers at once (in memory, no journal) they are written one after the
        other. Otherwise each write waits (the journal's group commit, an API server's answer):
        decisions about different objects are written together (one commit for many), in waves
        that keep the order of decisions about the same object.
        """
        if not self._together:
            for decision in decisions:
                await self._execute_one(decision)
            return
        wave: list[Decision] = []
        seen: set[tuple[str, str, str]] = set()
        for decision in decisions:
            targets = _targets(decision)
            if not seen.isdisjoint(targets):
                await asyncio.gather(*(self._execute_one(d) for d in wave))
                wave, seen = [], set()
            wave.append(decision)
            seen.update(targets)
        await asyncio.gather(*(self._execute_one(d) for d in wave))

    async def _execute_one(self, decision: Decision) -> None:
        if isinstance(decision, PlaceGang):
            await self._place(decision)
        else:
            await self._write(decision)

    async def _place(self, decision: PlaceGang) -> None:
        writer = self.writer
        landed = []  # created, or possibly created: a create that timed out may have landed
        try:
            if not self._together:
                for res in decision.reservations:
                    try:
                        landed.append(await writer.create(res))
                    except AlreadyExists:
                        raise
                    except Exception:
                        landed.append(res)
                        raise
            else:  # one group commit for the whole gang
                results = await asyncio.gather(
                    *(writer.create(res) for res in decision.reservations), return_exceptions=True
                )
                landed = [
                    res if isinstance(result, BaseException) else result
                    for res, result in zip(decision.reservations, results, strict=True)
                    if not isinstance(result, AlreadyExists)
                ]
                failed = [r for r in results if isinstance(r, BaseException)]
                if failed:
                    raise failed[0]
        except Exception as exc:  # a refused write, or a bug: either way no half gang stays behind
            for res in reversed(landed):
                await self._undo(res.metadata.namespace, res.metadata.name)
            log.warning("scheduler.assume_failed", job=f"{decision.key[0]}/{decision.key[1]}", error=str(exc))
            await self.execute(self.state.apply([CreateFailed(decision, str(exc))]))
            return
        if not self._together:
            for then in decision.then:
                await self._write(then)
        else:
            await asyncio.gather(*(self._write(then) for then in decision.then))

    async def _undo(self, namespace: str, name: str) -> None:
        """Delete a Reservation of a gang whose placement failed, trying again when the delete
        itself fails (a flaky backend): one left behind would hold its room for a gang that is
        not placed. If every try fails, the core learns it still holds the room (`unassume`)."""
        for attempt in range(_UNDO_ATTEMPTS):
            try:
                await self.writer.delete("Reservation", namespace, name)
                return
            except NotFound:
                return
            except Exception as exc:
                log.warning(
                    "scheduler.undo_failed",
                    reservation=f"{namespace}/{name}",
                    attempt=attempt + 1,
                    error=str(exc),
                )
                await self.clock.sleep(0)

    async def _write(self, decision: Decision) -> None:
        try:
            if isinstance(decision, PatchStatus):
                await self.writer.patch_status(
                    decision.kind, decision.namespace, decision.name, decision.changes
                )
            elif isinstance(decision, DeleteReservation):
                await self._delete_reservation(decision)
            elif isinstance(decision, RecordEvent):
                await self._record(decision)
        except NotFound:
            self.state.apply([WriteFailed(decision)])
        except Exception:  # the next cycle writes it again
            log.exception("scheduler.write_failed", decision=type(decision).__name__)
            self.state.apply([WriteFailed(decision)])

    async def _delete_reservation(self, decision: DeleteReservation) -> None:
        """Delete exactly the Reservation named (and with that uid, when one is given)."""
        current = self.store.get("Reservation", decision.namespace, decision.name)
        if current is None or (decision.uid and current.metadata.uid != decision.uid):
            return
        await self.writer.delete(
            "Reservation",
            decision.namespace,
            decision.name,
            resource_version=current.metadata.resource_version,
        )

    @cached_property
    def _events(self) -> EventRecorder:
        return EventRecorder(component=SCHEDULER, store=self.store, writer=self.writer, now=self.clock.utcnow)

    async def _record(self, ev: RecordEvent) -> None:
        """One Event per (object, reason), named by the decision, through the one Event recorder:
        created once, then its count, message and time updated."""
        await self._events.record(
            ev.involved,
            reason=ev.reason,
            message=ev.message,
            type=ev.type,
            labels={LABEL_JOB_NAME: ev.job},
            name=ev.name,
            at=ev.at,
        )


def _targets(decision: Decision) -> set[tuple[str, str, str]]:
    """The objects a decision writes (kind, namespace, name)."""
    if isinstance(decision, PlaceGang):
        out = {("Reservation", r.metadata.namespace, r.metadata.name) for r in decision.reservations}
        return out | {("PodGroup", *m) for m in decision.members}
    if isinstance(decision, PatchStatus):
        return {(decision.kind, decision.namespace, decision.name)}
    if isinstance(decision, DeleteReservation):
        return {("Reservation", decision.namespace, decision.name)}
    return {("Event", decision.namespace, decision.name)}
