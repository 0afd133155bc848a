"""The gang scheduler: all-or-nothing placement of whole jobs on a vectorised cluster snapshot.

Data flow: the operator writes a PodGroup per job → the scheduling loop (`running`) watches the
store and feeds the changes to the synchronous core (`core.SchedulerState`, composed of parts
that own their state: the cluster cache with its NumPy `Snapshot` of free capacity, admission,
preemption's claims, the cycle's memo), which keeps the snapshot current, takes PodGroups from
the tenant queues under quota (`gatekeeping`), builds plain gang requests (`gang_requests`),
decides with the pure `place(snapshot, gang, profile)` (`placing`: filters, scores, fill, GPU
chooser — all plugins of a `Profile`, `framework`/`profiles`), *assumes* the result in the
snapshot (`assuming`) and returns decisions (`decisions`); the loop, which owns the clock and
the metrics, writes them through the context's writer: one Reservation per pod, the PodGroup
status, events. The operator turns reservations into pods.

Entry point for the runtime: :func:`components` — the scheduling loop (an object with `name`
and `async run()`) and the default-ResourceClass reconciler (run through ControllerRunner).
"""

from __future__ import annotations

from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.core import SchedulerState
from gpuyard.scheduler.defaultclasses import DefaultClassReconciler
from gpuyard.scheduler.gangs.outcomes import Placement, PodPlacement, Unschedulable
from gpuyard.scheduler.gangs.requests import GangRequest, PodShape, PodSlot, RolePart, build_gang
from gpuyard.scheduler.placement.framework import CycleState, GPUChoice, Profile, ProfileSpec
from gpuyard.scheduler.placement.placing import place
from gpuyard.scheduler.placement.profiles import (
    build_profile,
    builtin_registry,
    default_registry,
    profile_from_settings,
    register_chooser,
    register_filter,
    register_profile,
    register_score,
)
from gpuyard.scheduler.placement.registry import DuplicatePluginError, PluginRegistry
from gpuyard.scheduler.running import SchedulerLoop
from gpuyard.state.components import Reconciler, Runnable
from gpuyard.state.context import Context
from gpuyard.state.ownership import SCHEDULER

__all__ = [
    "CycleState",
    "DefaultClassReconciler",
    "DuplicatePluginError",
    "GPUChoice",
    "GangRequest",
    "Placement",
    "PluginRegistry",
    "PodPlacement",
    "PodShape",
    "PodSlot",
    "Profile",
    "ProfileSpec",
    "RolePart",
    "SchedulerLoop",
    "SchedulerState",
    "Snapshot",
    "Unschedulable",
    "build_gang",
    "build_profile",
    "builtin_registry",
    "components",
    "default_registry",
    "place",
    "profile_from_settings",
    "register_chooser",
    "register_filter",
    "register_profile",
    "register_score",
]


def components(ctx: Context) -> list[Runnable | Reconciler]:
    """The scheduler's components: the scheduling loop and the default-ResourceClass reconciler,
    both writing as the scheduler (`state.ownership.SCHEDULER`, its field manager)."""
    ctx = ctx.for_component(SCHEDULER)
    return [SchedulerLoop(ctx), DefaultClassReconciler(ctx)]
