"""Backfill against the head's *planned placement*, and "can never fit on this cluster".

The queue's protected head (the first job of a cycle that waits for room, `quota.candidates`)
must not be overtaken by jobs that would delay it, yet must not hold back jobs that fit
elsewhere. Counting free GPUs in total cannot tell the two apart (3 + 5 free GPUs are 8 in
total, but no 2 x 4-GPU gang fits), so the head's reservation is made on the real nodes:

1. :func:`never_fits`: even empty, the nodes that may run a required part of the gang (static
   filters: selectors, taints, GPU class, node state) cannot hold its pods (allocatable GPUs of
   the class, CPU, memory), its whole GPUs of a class exceed the cluster's, or no single block or
   spine it requires could hold it (`placement.capacity.ever_fits`; cached per gang shape until a
   node changes): it *can never fit on this cluster*; its message says so and why, and it holds
   nothing;
2. :func:`plan_head`: otherwise the running jobs are taken away in the order they are expected
   to end (`gpuyard.io/expected-duration`; jobs without one after them, longest-running first;
   at most `MAX_FINISHERS`) until the head fits (a doubling then bisecting search: a few
   placements, not one per job; a plan stands `REPLAN_SECONDS` while it holds its room).
   That placement is the head's *planned placement*; the free room it needs on its nodes (what
   it takes there minus what the jobs taken away free there) is held for the head
   (:class:`~gpuyard.scheduler.cache.holds.Hold`, cause `backfill`) until the head starts, another job
   becomes the head, or `scheduler.backfill_hold_seconds` pass. A job expected to end before the
   head's *shadow time* (when those jobs are expected to end) may still use the held room.

Every other job is placed against the free room minus the held room (`held-room` filter): it
starts when it fits elsewhere. The head's status message ends with what it waits for: "(room
is held for it (3 GPUs on n1) until 1 running job there ends; other jobs may use the rest)".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuyard.scheduler.cache.holds import Hold
from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.gangs.outcomes import Placement
from gpuyard.scheduler.gangs.requests import GangRequest
from gpuyard.scheduler.placement.capacity import ever_fits
from gpuyard.scheduler.placement.framework import Profile
from gpuyard.scheduler.preemption.fitting import fits_without, room_needed

if TYPE_CHECKING:
    from gpuyard.scheduler.cycle.needs import Cycling

__all__ = ["Capacity", "never_fits", "plan_head"]

Key = tuple[str, str]
NEVER = "can never fit on this cluster"
MAX_FINISHERS = 256
"""The planned placement looks at most this many running jobs (in the order they end)."""
REPLAN_SECONDS = 10.0
"""A head's plan stands this long while it holds its room, however the cluster changes."""


@dataclass(frozen=True, slots=True)
class Capacity:
    """What `never_fits` reads: the snapshot, the profile, and its answers per gang shape (the
    cycle's memo, `CycleMemo.never_fit`)."""

    snapshot: Snapshot
    profile: Profile
    never_fit: dict[object, tuple[tuple[int, int], str | None]]


def never_fits(state: Capacity, gang: GangRequest, signature: object | None) -> str | None:
    """ "can never fit on this cluster: ..." when the gang could not fit were the nodes empty
    (`placement.capacity.ever_fits`: a required part needs more pods of its shape than the nodes
    that may run it could hold, its whole GPUs of a class exceed the cluster's, or no required
    block or spine could hold it); the message gives the first reason. Cached per gang shape
    until a node changes."""
    snap = state.snapshot
    token = (snap.static_version, snap.node_count)
    if signature is not None:
        cached = state.never_fit.get(signature)
        if cached is not None and cached[0] == token:
            return cached[1]
    message = _never(state, gang)
    if signature is not None:
        if len(state.never_fit) > 10_000:
            state.never_fit.clear()
        state.never_fit[signature] = (token, message)
    return message


def _never(state: Capacity, gang: GangRequest) -> str | None:
    verdict = ever_fits(state.snapshot, gang, state.profile)
    return f"{NEVER}: {verdict.reasons[0].describe()}" if verdict.never else None


def _finishers(state: Cycling, exclude: set[Key]) -> tuple[list[Key], dict[Key, float | None]]:
    """Running PodGroups in the order they are expected to free their room, and their ends."""
    queue = state.admission.queue
    order: list[tuple[int, float, float, Key]] = []
    ends: dict[Key, float | None] = {}
    for group in state.cache.snapshot.groups():
        if group in exclude:
            continue
        times = queue.run_times(group)
        start, end = times if times is not None else (0.0, None)
        ends[group] = end
        order.append((0 if end is not None else 1, end if end is not None else 0.0, start, group))
    order.sort()
    return [g for *_, g in order], ends


def plan_head(state: Cycling, key: Key, gang: GangRequest, *, members: set[Key]) -> str:
    """The head `key` does not fit now: hold the free room of its planned placement. Returns the
    note for its status message ("" when no plan was found)."""
    snap, profile = state.cache.snapshot, state.profile
    holds, plans = state.claims.holds, state.memo.head_plans
    groups, ends = _finishers(state, members)
    if not groups:
        return ""
    cache = plans.get(key)
    token = (snap.epoch, holds.version)
    if cache is not None and (
        cache[0] == token or (state.now - cache[2] < REPLAN_SECONDS and holds.get(key) is not None)
    ):
        return cache[1]  # planned recently and still holding: the plan stands
    groups = groups[:MAX_FINISHERS]
    n = len(groups)
    # the smallest prefix of `groups` whose removal lets the head fit: double, then bisect
    hi = 1
    found: Placement | None = None
    while True:
        got = fits_without(snap, gang, profile, groups[:hi])
        if isinstance(got, Placement):
            found = got
            break
        if hi >= n:
            break
        hi = min(2 * hi, n)
    note = ""
    if found is not None:
        lo = hi // 2  # does not fit with `lo` removed (or lo == 0: checked by the caller)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            got = fits_without(snap, gang, profile, groups[:mid])
            if isinstance(got, Placement):
                hi, found = mid, got
            else:
                lo = mid
        gone = groups[:hi]
        freed = [a for g in gone for a in snap.group_allocs(g) if a.row >= 0]
        room = room_needed(found, freed)
        known = [ends[g] for g in gone]
        shadow = max(e for e in known if e is not None) if all(e is not None for e in known) else None
        if room:
            tracked = state.admission.jobs.get(key)
            hold = Hold(
                owner=key,
                cause="backfill",
                nodes=room,
                until=state.now + state.claims.backfill_hold_seconds,
                shadow=shadow,
                priority=tracked.job.priority if tracked is not None else 0,
                submitted=tracked.job.submit_time if tracked is not None else 0.0,
                queue=tracked.job.queue if tracked is not None else "",
            )
            holds.drop_cause("backfill", keep=key)
            holds.set(hold)
            k = len(gone)
            when = f", expected in {max(0.0, shadow - state.now):.0f}s" if shadow is not None else ""
            note = (
                f"room is held for it ({hold.describe()}) until {k} running job{'s' if k != 1 else ''} "
                f"there {'end' if k != 1 else 'ends'}{when}; other jobs may use the rest"
            )
        else:
            note = "it starts when running jobs end; other jobs may use the room it does not need"
    token = (snap.epoch, holds.version)
    plans[key] = (token, note, state.now)
    if len(plans) > 1_000:
        plans.clear()
    return note
