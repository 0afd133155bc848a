"""Does the gang fit on the real nodes if these jobs were gone?" — the one question every
preemption, reclaim, backfill and migration decision asks.

:func:`fits_without` runs the real placement (`placing.place`: filters, topology, shapes, CPU and
memory included) on the snapshot with the Reservations of some PodGroups taken out, and puts them
back before it returns (the snapshot is scratch space, as `place` itself treats it). The answer is
a :class:`~gpuyard.scheduler.gangs.outcomes.Placement` (where the gang would go) or an
:class:`~gpuyard.scheduler.gangs.outcomes.Unschedulable` (why not).

:func:`room_needed` turns a planned placement into the room to hold per node (what the plan
takes there minus what the removed jobs free there): what a nomination or a backfill head keeps.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from gpuyard.scheduler.cache.holds import HeldArrays
from gpuyard.scheduler.cache.snapshot import Alloc, Snapshot
from gpuyard.scheduler.gangs.outcomes import Placement, Unschedulable
from gpuyard.scheduler.gangs.requests import GangRequest
from gpuyard.scheduler.placement.framework import CycleState, Profile
from gpuyard.scheduler.placement.placing import place

__all__ = ["fits_without", "room_needed", "without"]

Key = tuple[str, str]


@contextmanager
def without(snapshot: Snapshot, groups: Iterable[Key]) -> Iterator[list[Alloc]]:
    """The snapshot as if the Reservations of `groups` were gone (all of them put back after)."""
    taken: list[tuple[Alloc, int]] = []
    for group in groups:
        for alloc in snapshot.group_allocs(group):
            if alloc.row >= 0:
                taken.append((alloc, alloc.row))
    for alloc, _ in taken:
        snapshot.unapply(alloc)
    try:
        yield [alloc for alloc, _ in taken]
    finally:
        for alloc, row in reversed(taken):
            snapshot.apply(alloc, row=row, advance_cursor=False)


def fits_without(
    snapshot: Snapshot,
    gang: GangRequest,
    profile: Profile,
    gone: Iterable[Key] = (),
    *,
    held: HeldArrays | None = None,
) -> Placement | Unschedulable:
    """Where the whole `gang` would go were the PodGroups `gone` not running (their Reservations
    removed), or why it would still not fit. `held`: room held for other gangs (`holds`)."""
    with without(snapshot, gone):
        state = CycleState(snapshot, gang, profile)
        if held is not None:
            state.data["held"] = held
        result = place(snapshot, gang, profile, state=state)
    if isinstance(result, Placement) and not result.pods:
        return Unschedulable(reason="Unschedulable", message="none of its pods fits")
    return result


def room_needed(placement: Placement, freed: Iterable[Alloc]) -> dict[str, tuple[int, int, int]]:
    """Per node of `placement`: (GPUs, milli-CPU, MiB) it takes there beyond what `freed` (the
    removed jobs' allocations) gives back there — the room to hold while those jobs stop."""
    want: dict[str, list[int]] = {}
    for pp in placement.pods:
        shape = pp.shape
        got = want.setdefault(pp.node, [0, 0, 0])
        got[0] += len(pp.gpus) if not shape.shared else 0
        got[1] += shape.cpu_milli
        got[2] += shape.mem_mib
    back: dict[str, list[int]] = {}
    for alloc in freed:
        if alloc.node in want:
            got = back.setdefault(alloc.node, [0, 0, 0])
            got[0] += len(alloc.gpus) if alloc.gpu_milli >= 1000 else 0
            got[1] += alloc.cpu
            got[2] += alloc.mem
    out: dict[str, tuple[int, int, int]] = {}
    for node, (g, c, m) in want.items():
        fg, fc, fm = back.get(node, (0, 0, 0))
        room = (max(0, g - fg), max(0, c - fc), max(0, m - fm))
        if any(room):
            out[node] = room
    return out
