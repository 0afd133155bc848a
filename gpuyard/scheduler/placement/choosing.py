"""GPU choosers: which GPUs of the chosen node a pod gets (the pluggable step inside a node).

The default, `lowest-index`, takes the lowest-numbered idle GPUs of the pod's class (for a GPU
share: the tightest GPU with enough free milli and memory, lowest index among equals; see
`share_choice`). The topology issue
registers a chooser that looks up the best NVLink subset for the node's free mask
(`gpuyard.devices.subsets.pick(table, free_mask, k)`) and the NICs under it; `free_mask` gives
the bit mask such a lookup takes.

A chooser may answer None ("not on this node") even where the node's GPU count said the pod
fits (e.g. an allowed-partition rule); the engine then takes fewer pods there and moves on.
"""

from __future__ import annotations

import numpy as np

from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.gangs.requests import GPU_MILLI, PodShape
from gpuyard.scheduler.placement.framework import GPUChoice

__all__ = ["NO_GPUS", "LowestIndexChooser", "free_mask", "share_choice", "usable_row"]

NO_GPUS = GPUChoice(())


def usable_row(snapshot: Snapshot, row: int, gpu_class: str | None) -> list[bool]:
    """Per GPU slot of `row`: healthy and of the class (any class for None)."""
    healthy = snapshot.gpu_healthy[row]
    if gpu_class is None:
        every: list[bool] = healthy.tolist()
        return every
    cm = snapshot.class_mask(gpu_class)
    if cm is None:
        return [False] * snapshot.g
    result: list[bool] = (healthy & cm.gpu[row]).tolist()
    return result


def free_mask(snapshot: Snapshot, row: int, shape: PodShape) -> int:
    """Bit i set when GPU i of `row` can serve one of the pod's GPUs (idle, or enough share left)."""
    if shape.shared:
        return sum(1 << int(i) for i in snapshot.share_fits(row, shape).nonzero()[0])
    ok = usable_row(snapshot, row, shape.gpu_class)
    free = snapshot.gpu_free_milli[row].tolist()
    need = GPU_MILLI
    mask = 0
    for i, (u, f) in enumerate(zip(ok, free, strict=True)):
        if u and f >= need:
            mask |= 1 << i
    return mask


def share_choice(snapshot: Snapshot, row: int, shape: PodShape) -> GPUChoice | None:
    """The GPU of `row` for one share: where it fits (milli and memory), the tightest in milli
    then in memory (best fit: shared GPUs fill up before idle ones are broken), lowest index
    among equals. The score plugins have already picked the node."""
    fits = snapshot.share_fits(row, shape)
    if not fits.any():
        return None
    milli = snapshot.gpu_free_milli[row].astype(np.int64)
    mem = snapshot.gpu_mem_free[row]
    key = np.where(fits, milli * (1 << 32) + np.clip(mem, 0, (1 << 31) - 1), np.iinfo(np.int64).max)
    return GPUChoice((int(np.argmin(key)),))


class LowestIndexChooser:
    name = "lowest-index"

    def choose(
        self, snapshot: Snapshot, row: int, shape: PodShape, *, within: int | None = None
    ) -> GPUChoice | None:
        if not shape.gpus:
            return NO_GPUS
        if shape.shared:
            return share_choice(snapshot, row, shape)
        ok = usable_row(snapshot, row, shape.gpu_class)
        free = snapshot.gpu_free_milli[row].tolist()
        picked = [
            i
            for i, (u, f) in enumerate(zip(ok, free, strict=True))
            if u and f == GPU_MILLI and (within is None or within >> i & 1)
        ][: shape.gpus]
        return GPUChoice(tuple(picked)) if len(picked) == shape.gpus else None
