"""Running the Filter plugins for one shape: per-node capacity, and the per-filter breakdown.

`capacity(state, shape)` gives int64[N]: how many pods of the shape each node can take now,
combining every filter (a mask zeroes a node, a count caps it). The static filters' combined
mask is cached per shape key until a node or a ResourceClass changes (the snapshot's
`static_version`), so a cycle pays only for the dynamic, resource-dependent arithmetic.

`breakdown(state, shape)` and `explain(state, part)` are the slow path, run only when a gang does
not fit: every filter in order, each node blamed on the first filter that rejects it, turned into
a message a person can read, e.g.::

    Worker: 4 pods of 4 GPUs of class nvidia.v100, 8 CPU must be placed together; 0/512 nodes can
    take one: 10 nodes are not ready; 0/512 nodes have 4 free GPUs of class nvidia.v100 in one
    node; 2 nodes have 3.

The explanation is computed on the scratch state `place()` was in when the part failed (earlier
parts of the gang already counted as placed), and ends with the largest part that fits now.
"""

from __future__ import annotations

import numpy as np

from gpuyard.scheduler.gangs.outcomes import FilterCount, Unschedulable
from gpuyard.scheduler.gangs.requests import Constraints, PodShape, RolePart
from gpuyard.scheduler.placement.framework import CycleState, FilterPlugin

__all__ = ["breakdown", "capacity", "explain", "static_key", "static_mask"]

_STATIC_CACHE_SIZE = 512


def static_key(shape: PodShape) -> tuple[Constraints, str | None, int, bool]:
    """What static filters may depend on: constraints, GPU class and count, share or whole."""
    return (shape.constraints, shape.gpu_class, shape.gpus, shape.shared)


def static_mask(state: CycleState, shape: PodShape) -> np.ndarray:
    """bool[N]: live nodes every static filter (selectors, affinity, taints, GPU class) accepts; cached."""
    profile = state.profile
    snap = state.snapshot
    cache = profile.cache
    stamp = (id(snap), snap.static_version, snap.n)
    if cache.get("__stamp__") != stamp:
        cache.clear()
        cache["__stamp__"] = stamp
    key = static_key(shape)
    mask = cache.get(key)
    if mask is None:
        mask = snap.alive.copy()
        for f in profile.filters:
            if getattr(f, "static", False):
                out = f.filter(state, shape)
                if out is not None:
                    mask &= out if out.dtype == bool else out > 0
        if len(cache) > _STATIC_CACHE_SIZE:
            cache.clear()
            cache["__stamp__"] = stamp
        cache[key] = mask
    return mask


def capacity(state: CycleState, shape: PodShape) -> np.ndarray:
    """int64[N]: pods of `shape` each node can take now (0 where any filter rejects it).

    When every filter answered with a mask (they may, for `state.want == 1`), the answer is that
    bool[N] mask: "can take one".
    """
    mask = static_mask(state, shape)
    cap: np.ndarray | None = None
    for f in state.profile.filters:
        if getattr(f, "static", False):
            continue
        out = f.filter(state, shape)
        if out is None:
            continue
        if out.dtype == bool:
            mask = mask & out
        elif cap is None:
            cap = out
        else:
            cap = np.minimum(cap, out)
    if cap is None:
        return mask
    return np.where(mask, cap, 0)


def breakdown(state: CycleState, shape: PodShape) -> list[tuple[FilterPlugin, np.ndarray, np.ndarray]]:
    """[(filter, failed, eligible)] in filter order: `failed` the nodes this filter was first to
    reject (each live node appears in at most one), `eligible` the nodes that reached it."""
    snap = state.snapshot
    passing = snap.alive.copy()
    out: list[tuple[FilterPlugin, np.ndarray, np.ndarray]] = []
    for f in state.profile.filters:
        result = f.filter(state, shape)
        if result is None:
            continue
        ok = result if result.dtype == bool else result > 0
        failed = passing & ~ok
        if failed.any():
            out.append((f, failed, passing.copy()))
        passing &= ok
    return out


def _pods(n: int) -> str:
    return f"{n} pod{'s' if n != 1 else ''}"


def _limited_by(state: CycleState, shape: PodShape, cap: np.ndarray) -> str:
    """`, limited by host-ports`: the count filter that binds on most of the nodes that can take some."""
    some = cap > 0
    best_name, best = "", 0
    for plugin in state.profile.filters:
        if getattr(plugin, "static", False):
            continue
        out = plugin.filter(state, shape)
        if out is None or out.dtype == bool:
            continue
        binding = int((some & (out == cap)).sum())
        if binding > best:
            best_name, best = plugin.name, binding
    return f", limited by {best_name}" if best_name else ""


def explain(state: CycleState, part: RolePart, *, placed_before: int = 0) -> Unschedulable:
    snap = state.snapshot
    shape = part.shape
    needed = part.required
    state.want = max(needed, 2)  # counts, not masks: "at most N fit" needs them
    counts: list[FilterCount] = []
    texts: list[str] = []
    for plugin, failed, eligible in breakdown(state, shape):
        state.data["eligible"] = eligible
        text = plugin.explain(state, shape, failed)
        counts.append(FilterCount(plugin.name, int(failed.sum()), text))
        texts.append(text)
    state.data.pop("eligible", None)
    cap = capacity(state, shape)
    fits = int(np.minimum(cap, needed).sum())
    most = int(cap.max()) if len(cap) else 0
    nodes_ok = int((cap > 0).sum())
    total_nodes = int(snap.alive.sum())

    who = f"{part.role} of {part.group}" if len(state.gang.members) > 1 else part.role
    if needed > 1:
        head = f"{who}: {_pods(needed)} of {shape.describe()} must be placed together"
    else:
        head = f"{who}: 1 pod of {shape.describe()}"
    if placed_before:
        head += f" (after {_pods(placed_before)} of the gang placed before it)"
    if total_nodes == 0:
        body = "there are no nodes"
    elif nodes_ok == 0:
        body = f"0/{total_nodes} nodes can take one: " + "; ".join(texts)
    else:
        body = (
            f"at most {fits} of {needed} fit now on {nodes_ok} node{'s' if nodes_ok != 1 else ''} "
            f"(the most on one node: {most}{_limited_by(state, shape, cap)})"
        )
        if texts:
            body += f"; the other nodes: {'; '.join(texts)}"
    return Unschedulable(
        reason="Unschedulable",
        message=f"{head}; {body}.",
        role=part.role,
        needed=needed,
        fits=fits,
        most_on_one_node=most,
        filters=counts,
    )
