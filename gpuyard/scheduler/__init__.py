"""The gang scheduler: all-or-nothing placement of whole jobs on a vectorised cluster snapshot.

Data flow: the operator writes a PodGroup per job → the scheduling loop (`running`) keeps a NumPy
`Snapshot` of free capacity current from the store watch, takes PodGroups from the queue
(`queueing`), builds plain gang requests (`gangs`), decides with the pure
`place(snapshot, gang, profile)` (`placing`: filters, scores, fill, GPU chooser — all plugins
of a `Profile`, `framework`/`profiles`), and *assumes* the result as one Reservation per pod in
one synchronous step (`assuming`); the operator turns reservations into pods.

Entry point for the runtime: :func:`components` — the scheduling loop (an object with `name`
and `async run()`) and the default-ResourceClass reconciler (run through ControllerRunner).
"""

from __future__ import annotations

from typing import Any

from gpuyard.scheduler.defaultclasses import DefaultClassReconciler
from gpuyard.scheduler.framework import (
    CycleState,
    GPUChoice,
    Profile,
    ProfileSpec,
    register_chooser,
    register_filter,
    register_hook,
    register_profile,
    register_score,
)
from gpuyard.scheduler.gang_requests import GangRequest, PodShape, PodSlot, RolePart, build_gang
from gpuyard.scheduler.inventory import DeviceInventory
from gpuyard.scheduler.outcomes import Placement, PodPlacement, Unschedulable
from gpuyard.scheduler.placing import place
from gpuyard.scheduler.profiles import build_profile, profile_from_settings
from gpuyard.scheduler.queueing import PriorityFIFOQueue, SchedulingQueue
from gpuyard.scheduler.running import SchedulerLoop
from gpuyard.scheduler.snapshot import Snapshot
from gpuyard.state.context import Context

__all__ = [
    "CycleState",
    "DefaultClassReconciler",
    "DeviceInventory",
    "GPUChoice",
    "GangRequest",
    "Placement",
    "PodPlacement",
    "PodShape",
    "PodSlot",
    "PriorityFIFOQueue",
    "Profile",
    "ProfileSpec",
    "RolePart",
    "SchedulerLoop",
    "SchedulingQueue",
    "Snapshot",
    "Unschedulable",
    "build_gang",
    "build_profile",
    "components",
    "place",
    "profile_from_settings",
    "register_chooser",
    "register_filter",
    "register_hook",
    "register_profile",
    "register_score",
]


def components(ctx: Context) -> list[Any]:
    """The scheduler's components: the scheduling loop, the default-ResourceClass reconciler and,
    where the store knows NodeTopology, the device inventory (GPU health -> DeviceUnhealthy)."""
    out: list[Any] = [SchedulerLoop(ctx), DefaultClassReconciler(ctx.store)]
    if "NodeTopology" in ctx.store.kinds():
        out.append(DeviceInventory(ctx.store, clock=ctx.clock))
    return out
