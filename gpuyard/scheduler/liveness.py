"""Liveness as a checked property: no job waits while it could run.

Safety (nothing over-allocated, no partial gang) says nothing about a job that waits for ever:
a preemptor blocked by held room, a job whose quota runtime was squeezed by a request that can
never be placed, a job not retried after what blocked it went away. The rule checked here:

    no job stays unplaced for more than `cycles` scheduling cycles (3) and `seconds` (5 s),
    whichever is longer, while it *fits now*; nor more than `seconds` without the scheduler
    running a cycle at all (nothing retried it).

**Fits now** is answered by a *fresh* scheduler (:func:`fitting_now`): a
:class:`~gpuyard.scheduler.core.SchedulerState` built from the objects alone (nodes,
Reservations, PodGroups, quotas, queues, classes, PodDisruptionBudgets) plus the room the running
scheduler holds for jobs ahead (its claims: nominations, the backfill head's room), with nothing
else of its memory (parked jobs, caches, backoffs), walks the queues once;
the jobs it places are those that fit now. Its walk applies every rule a job must pass: quota and
queue admission, `place()` with all the job's constraints (topology, affinity, GPU class), and
the room claimed by jobs ahead of it (placed before it in the walk by priority and queue order,
a preemptor whose victims still stop, the protected head's backfill room). A job that waits by
its own choice is not placed by it either (suspended, a required topology still within its
timeout, a gang group missing members). Two causes it does not see are excluded by status: a job
backing off after a failed write (`AssumeFailed`), and a preemption victim whose pods still stop.

:class:`LivenessTracker` remembers since when (cycle and time) each job has fitted without a
break, and reports those past the bound. The invariant checker
(`gpuyard.platform.invariants`) and the test harness call it with the store's objects; the
state-machine test (tests/unit/scheduler/test_liveness_machine.py) after every step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from gpuyard.apis.meta import Resource
from gpuyard.apis.scheduling import PodGroup, Reservation
from gpuyard.scheduler.cache.holds import Hold
from gpuyard.scheduler.core import WATCHED, SchedulerState
from gpuyard.scheduler.decisions import PlaceGang
from gpuyard.scheduler.placement.framework import Profile

__all__ = ["CYCLES", "SECONDS", "LivenessTracker", "Stuck", "fitting_now"]

Key = tuple[str, str]
CYCLES = 3
SECONDS = 5.0
_OWN_WAIT = ("AssumeFailed",)  # backing off after a failed write: the scheduler's retry policy


def fitting_now(
    objects: Mapping[str, Iterable[Resource]],
    *,
    profile: Profile,
    port_range: tuple[int, int],
    now: float,
    utcnow: datetime,
    claims: Iterable[Hold] = (),
) -> set[Key]:
    """The unplaced PodGroups a fresh scheduler places in its first walk (see the module
    docstring): the jobs that fit now. `objects`: per kind, what the store holds; `claims`: the
    room the running scheduler holds (nominations after preemption, the backfill head's room),
    which the rule counts as claimed by the jobs ahead that hold it."""
    listed = {kind: list(objects.get(kind, ())) for kind in WATCHED if kind in objects}
    waiting: set[Key] = set()
    held = {
        (r.metadata.namespace, r.spec.pod_group)
        for r in listed.get("Reservation", ())
        if isinstance(r, Reservation)
    }
    for pg in listed.get("PodGroup", ()):
        if not isinstance(pg, PodGroup):
            continue
        key = (pg.metadata.namespace, pg.metadata.name)
        st = pg.status
        if key in held or pg.spec.suspend or st.phase in ("Failed", "Suspended") or st.evictions:
            continue
        if st.reason in _OWN_WAIT:
            continue
        waiting.add(key)
    if not waiting:
        return set()
    state = SchedulerState(profile=profile, port_range=port_range, events=False)
    state.load(listed, now=now, utcnow=utcnow)
    for hold in claims:
        if hold.owner in waiting or hold.owner in held:
            state.claims.holds.set(replace(hold, nodes=dict(hold.nodes)))
    placed: set[Key] = set()
    for _ in range(1_000):
        for decision in state.step(now=now, utcnow=utcnow, limit=10_000):
            if isinstance(decision, PlaceGang):
                placed.update(decision.members)
        if not state.more:
            break
    return placed & waiting


@dataclass(frozen=True, slots=True)
class Stuck:
    """A job that has fitted since `cycles` cycles and `seconds` seconds, yet is not placed."""

    key: Key
    cycles: int
    seconds: float

    def __str__(self) -> str:
        return (
            f"PodGroup {self.key[0]}/{self.key[1]} has fitted for {self.cycles} scheduling cycles "
            f"and {self.seconds:g}s and is still not placed"
        )


@dataclass(slots=True)
class LivenessTracker:
    """Since when each job has fitted without a break; who is past the bound."""

    cycles: int = CYCLES
    seconds: float = SECONDS
    since: dict[Key, tuple[int, float]] = field(default_factory=dict)

    def observe(self, fitting: Iterable[Key], *, cycle: int, now: float) -> list[Stuck]:
        """`fitting`: the jobs that fit now (`fitting_now`) at scheduling cycle `cycle`, time
        `now`; the jobs that have fitted past the bound (more cycles and more seconds)."""
        fit = set(fitting)
        for key in [k for k in self.since if k not in fit]:
            del self.since[key]
        out = []
        for key in sorted(fit):
            c0, t0 = self.since.setdefault(key, (cycle, now))
            ran = cycle - c0
            # past both bounds; or the scheduler ran no cycle at all meanwhile (nothing retried it)
            if now - t0 > self.seconds and (ran > self.cycles or ran == 0):
                out.append(Stuck(key, ran, round(now - t0, 3)))
        return out
