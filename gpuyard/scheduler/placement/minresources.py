"""`minResources`: a gang is not tried until the cluster's free capacity covers it.

Volcano's PodGroup `minResources` (KubeDL's `runPolicy.schedulingPolicy.minResources`, copied by
the operator to `PodGroup.spec.minResources`) is "the least a job needs to run". Volcano's
`enqueue` action keeps such a PodGroup Pending (not Inqueue) while the idle resources of the
cluster do not cover it, so a job that cannot start does not take part in allocation; the
coscheduling plugin's PreFilter rejects likewise. gpuyard does the same, before it builds and
places the gang (`attempting.schedule_one`): a gang holding no Reservation whose `minResources`
exceed the free (unreserved) capacity of the ready, schedulable nodes waits with reason
`MinResources` and a message naming each short resource (wanted, free, and the cluster's whole
allocatable when even that is short). It then takes no part in this cycle: it holds no room
for itself (no backfill hold) and preempts nothing (in Volcano, too, only enqueued jobs preempt);
it is tried again when capacity grows. Once covered, placement goes on as usual — the gang's
real pod requests decide where it goes. A gang already (partly) placed is never held back.

Resources compared: `cpu`, `memory`, `pods`, `nvidia.com/gpu` (whole idle GPUs) and any extended
resource the nodes advertise; a name no node has counts as none free.

Pure: one vectorised sum per resource over the snapshot's arrays.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from gpuyard.apis.core import GPU_RESOURCE
from gpuyard.apis.quantity import format_quantity, parse_quantity, to_int, to_milli
from gpuyard.scheduler.cache.snapshot import Snapshot

__all__ = ["MIN_RESOURCES", "min_resources_short"]

MIN_RESOURCES = "MinResources"
_MIB = 1024 * 1024


def _amounts(snap: Snapshot, name: str) -> tuple[int, int, str]:
    """(free, allocatable, unit) of resource `name` over the usable nodes, in the arrays' units."""
    a = snap.arrays
    usable = a.alive & a.ready & a.schedulable
    if name == "cpu":
        return int(a.cpu_free[usable].sum()), int(a.cpu_alloc[usable].sum()), "m"
    if name == "memory":
        return int(a.mem_free[usable].sum()), int(a.mem_alloc[usable].sum()), "Mi"
    if name == "pods":
        return int(a.pods_free[usable].sum()), int(a.pods_alloc[usable].sum()), ""
    if name == GPU_RESOURCE:
        healthy = a.gpu_healthy & a.gpu_exists
        return int(a.gpu_whole_free[usable].sum()), int(healthy[usable].sum()), ""
    col = a.ext_col(name)
    if col is None:
        return 0, 0, ""
    return int(a.ext_free[usable, col].sum()), int(a.ext_alloc[usable, col].sum()), ""


def _wanted(name: str, value: Any) -> int:
    q = parse_quantity(value)
    if name == "cpu":
        return to_milli(q)
    if name == "memory":
        return -(-to_int(q) // _MIB)  # MiB, rounded up
    return to_int(q)


def _show(amount: int, unit: str) -> str:
    if unit == "m":
        return format_quantity(Decimal(amount) / 1000)
    if unit == "Mi":
        return format_quantity(Decimal(amount * _MIB))
    return str(amount)


def min_resources_short(snap: Snapshot, min_resources: Mapping[str, Any] | None) -> str | None:
    """Why the free capacity does not cover `min_resources` (None: it does, or none is set)."""
    if not min_resources:
        return None
    short: list[str] = []
    never = False
    for name, value in sorted(min_resources.items()):
        wanted = _wanted(name, value)
        if wanted <= 0:
            continue
        free, total, unit = _amounts(snap, name)
        if free >= wanted:
            continue
        part = f"{name} {_show(wanted, unit)} > {_show(free, unit)} free"
        if total < wanted:
            never = True
            part += f" ({_show(total, unit)} in the whole cluster)"
        short.append(part)
    if not short:
        return None
    lead = "minResources can never be covered" if never else "waiting until free capacity covers minResources"
    return f"{lead}: {'; '.join(short)}"
