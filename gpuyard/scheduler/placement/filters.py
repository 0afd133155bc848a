"""Built-in Filter plugins: vectorised masks and per-node pod counts over the snapshot.

Each filter answers for a whole *shape* (all identical pods of a role) in a few array
operations: a bool[N] mask or an int[N] "how many pods of this shape fit here" computed with
integer division on the free arrays. Filters marked `static` depend only on node facts and the
shape's constraints/GPU class, so `placing` caches their combined mask until a node or class
changes. Their order is the order of the explanation ("10 not ready, 3 didn't match the node
selector, ...": each node is blamed on the first filter that rejects it).

`gpu-node-reserve` keeps CPU-only pods out of the CPU and memory a GPU node's idle GPUs will
need: for each idle GPU its share of the node's CPU/memory (times a configurable fraction).

`held-room` keeps every gang out of the room held for another one (a preemptor's nomination, the
backfill head's planned placement: `holds`); the cycle puts the held amounts per row in
`state.data["held"]`, and without them the filter has no opinion.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from gpuyard.scheduler.gangs.requests import PodShape
from gpuyard.scheduler.placement.framework import CycleState

__all__ = [
    "DEFAULT_FILTERS",
    "GPUClass",
    "GPUNodeReserve",
    "HeldRoom",
    "HostPorts",
    "NodeAffinity",
    "NodeReady",
    "NodeResources",
    "NodeUnschedulable",
    "TaintToleration",
    "gpu_node_reserve",
]

DEFAULT_FILTERS = (
    "node-ready",
    "node-unschedulable",
    "node-affinity",
    "taint-toleration",
    "gpu-class",
    "node-resources",
    "host-ports",
    "inter-pod-affinity",
    "pod-topology-spread",
    "gpu-node-reserve",
    "held-room",
)


def _nodes(n: int) -> str:
    return f"{n} node{'s' if n != 1 else ''}"


def _have(n: int) -> str:
    return f"{_nodes(n)} {'has' if n == 1 else 'have'}"


class NodeReady:
    name = "node-ready"
    static = True

    def filter(self, state: CycleState, shape: PodShape) -> np.ndarray:
        s = state.snapshot
        result: np.ndarray = s.alive & s.ready
        return result

    def explain(self, state: CycleState, shape: PodShape, failed: np.ndarray) -> str:
        n = int(failed.sum())
        return f"{_nodes(n)} {'is' if n == 1 else 'are'} not ready"


class NodeUnschedulable:
    name = "node-unschedulable"
    static = True

    def filter(self, state: CycleState, shape: PodShape) -> np.ndarray:
        return state.snapshot.schedulable

    def explain(self, state: CycleState, shape: PodShape, failed: np.ndarray) -> str:
        n = int(failed.sum())
        return f"{_nodes(n)} {'is' if n == 1 else 'are'} cordoned (unschedulable)"


class NodeAffinity:
    """nodeSelector and required node affinity."""

    name = "node-affinity"
    static = True

    def filter(self, state: CycleState, shape: PodShape) -> np.ndarray | None:
        return state.snapshot.selector_mask(shape.constraints)

    def explain(self, state: CycleState, shape: PodShape, failed: np.ndarray) -> str:
        n = int(failed.sum())
        return f"{_nodes(n)} didn't match the pod's node selector/affinity"


class TaintToleration:
    name = "taint-toleration"
    static = True

    def filter(self, state: CycleState, shape: PodShape) -> np.ndarray:
        return state.snapshot.taint_mask(shape.constraints)

    def explain(self, state: CycleState, shape: PodShape, failed: np.ndarray) -> str:
        s = state.snapshot
        seen: dict[str, int] = {}
        for row in np.flatnonzero(failed)[:1000]:
            for key, value, effect in s.taints[row]:
                text = f"{key}={value}:{effect}" if value else f"{key}:{effect}"
                seen[text] = seen.get(text, 0) + 1
        top = ", ".join(t for t, _ in sorted(seen.items(), key=lambda kv: -kv[1])[:3])
        n = int(failed.sum())
        return f"{_nodes(n)} had untolerated taints ({top})" if top else f"{_nodes(n)} had untolerated taints"


class GPUClass:
    """Nodes that have at least the pod's number of GPUs of its class at all (free or not)."""

    name = "gpu-class"
    static = True

    def filter(self, state: CycleState, shape: PodShape) -> np.ndarray | None:
        if not shape.gpus:
            return None
        s = state.snapshot
        if shape.gpu_class is None:
            return s.gpu_count >= shape.gpus
        cm = s.class_mask(shape.gpu_class)
        if cm is None:
            return np.zeros(s.n, dtype=bool)
        return cm.count >= shape.gpus

    def explain(self, state: CycleState, shape: PodShape, failed: np.ndarray) -> str:
        s = state.snapshot
        if shape.gpu_class is None:
            counts = s.gpu_count
            what = "GPUs"
        else:
            cm = s.class_mask(shape.gpu_class)
            if cm is None:
                return f"resource class {shape.gpu_class} does not exist"
            counts = cm.count
            what = f"GPUs of class {shape.gpu_class}"
        none = int((failed & (counts == 0)).sum())
        fewer = int(failed.sum()) - none
        parts = []
        if none:
            parts.append(f"{_have(none)} no {what}")
        if fewer:
            parts.append(f"{_have(fewer)} fewer than {shape.gpus} {what} in all")
        return ", ".join(parts)


class NodeResources:
    """Free CPU, memory, pod slots, extended resources and GPUs: how many pods of the shape fit."""

    name = "node-resources"
    static = False

    def filter(self, state: CycleState, shape: PodShape) -> np.ndarray:
        s = state.snapshot
        if state.want == 1:  # one pod: comparisons only, no division
            ok = s.pods_free >= 1
            if shape.cpu_milli:
                ok &= s.cpu_free >= shape.cpu_milli
            if shape.mem_mib:
                ok &= s.mem_free >= shape.mem_mib
            for name, amount in shape.ext:
                col = s.ext_col(name)
                if col is None:
                    return np.zeros(s.n, dtype=bool)
                ok &= s.ext_free[:, col] >= amount
            if shape.gpus:
                ok &= (
                    s.share_available(shape)
                    if shape.shared
                    else s.gpu_available(shape.gpu_class, shape.gpu_milli)
                ) >= shape.gpus
            return ok
        cap = s.pods_free.copy()
        if shape.cpu_milli:
            np.minimum(cap, s.cpu_free // shape.cpu_milli, out=cap)
        if shape.mem_mib:
            np.minimum(cap, s.mem_free // shape.mem_mib, out=cap)
        for name, amount in shape.ext:
            col = s.ext_col(name)
            if col is None:
                return np.zeros(s.n, dtype=np.int64)
            np.minimum(cap, s.ext_free[:, col] // amount, out=cap)
        if shape.gpus:
            avail = (
                s.share_available(shape)
                if shape.shared
                else s.gpu_available(shape.gpu_class, shape.gpu_milli)
            )
            np.minimum(cap, avail // shape.gpus, out=cap)
        np.maximum(cap, 0, out=cap)
        return cap

    def explain(self, state: CycleState, shape: PodShape, failed: np.ndarray) -> str:
        s = state.snapshot
        parts = []
        if shape.gpus:
            avail = (
                s.share_available(shape)
                if shape.shared
                else s.gpu_available(shape.gpu_class, shape.gpu_milli)
            )
            short = failed & (avail < shape.gpus)
            if short.any():
                eligible = state.data.get("eligible", failed)
                have = int((eligible & (avail >= shape.gpus)).sum())
                total = int(s.alive.sum())
                unit = "free GPU share" if shape.shared else "free GPU"
                what = f"{shape.gpus} {unit}{'s' if shape.gpus != 1 else ''}"
                if shape.gpu_class:
                    what += f" of class {shape.gpu_class}"
                text = f"{have}/{total} nodes have {what} in one node"
                before = _available_without_gang(state, shape)
                taken = short & (before >= shape.gpus) if before is not None else np.zeros_like(short)
                rest = short & ~taken
                if rest.any():
                    below = avail[rest]
                    best = int(below.max())
                    if best > 0:
                        text += f"; {_have(int((below == best).sum()))} {best}"
                    else:
                        text += f"; {_have(int(rest.sum()))} none free"
                if taken.any() and before is not None:
                    most = int(before[taken].max())
                    text += f"; {_have(int(taken.sum()))} {most} free but the gang's earlier pods take them"
                parts.append(text)
        checks: list[tuple[str, int, np.ndarray, Callable[[int], str]]]
        checks = [("cpu", shape.cpu_milli, s.cpu_free, lambda v: f"{v / 1000:g} CPU"),
                  ("memory", shape.mem_mib, s.mem_free, lambda v: f"{v}Mi memory")]  # fmt: skip
        for _, need, free, fmt in checks:
            if need:
                n = int((failed & (free < need)).sum())
                if n:
                    parts.append(f"{_have(n)} less than {fmt(need)} free")
        n = int((failed & (s.pods_free < 1)).sum())
        if n:
            parts.append(f"{_nodes(n)} {'is' if n == 1 else 'are'} at the pod limit")
        for name, amount in shape.ext:
            col = s.ext_col(name)
            if col is None:
                parts.append(f"no node offers {name}")
                continue
            n = int((failed & (s.ext_free[:, col] < amount)).sum())
            if n:
                parts.append(f"{_have(n)} less than {amount / 1000:g} {name} free")
        return "; ".join(parts) or f"{_nodes(int(failed.sum()))} lack free resources"


def _available_without_gang(state: CycleState, shape: PodShape) -> np.ndarray | None:
    """int[N]: what `NodeResources` counts as available for `shape` were the gang's own pods
    placed earlier in this attempt (`state.data["gang_allocs"]`) not there; None without any."""
    gang = state.data.get("gang_allocs")
    if not gang:
        return None
    s = state.snapshot
    rows = [alloc.row for alloc in gang]
    for alloc in reversed(gang):
        s.unapply(alloc)
    try:
        result: np.ndarray = (
            s.share_available(shape) if shape.shared else s.gpu_available(shape.gpu_class, shape.gpu_milli)
        )
        return result.copy()
    finally:
        for alloc, row in zip(gang, rows, strict=True):
            s.apply(alloc, row=row, advance_cursor=False)


class HostPorts:
    """Enough free host ports in the configured range for a host-network pod."""

    name = "host-ports"
    static = False

    def filter(self, state: CycleState, shape: PodShape) -> np.ndarray | None:
        if not shape.host_ports:
            return None
        s = state.snapshot
        return np.maximum(s.port_count - s.ports_used_count.astype(np.int64), 0) // shape.host_ports

    def explain(self, state: CycleState, shape: PodShape, failed: np.ndarray) -> str:
        s = state.snapshot
        return f"{_have(int(failed.sum()))} fewer than {shape.host_ports} free host ports in {s.port_lo}-{s.port_hi}"


class GPUNodeReserve:
    """CPU-only pods leave each idle GPU its share of a GPU node's CPU and memory (times `fraction`)."""

    name = "gpu-node-reserve"
    static = False

    def __init__(self, *, cpu_fraction: float = 0.5, memory_fraction: float = 0.5) -> None:
        for label, value in (("cpu_fraction", cpu_fraction), ("memory_fraction", memory_fraction)):
            if not 0 <= value <= 1:
                raise ValueError(f"gpu-node-reserve: {label} must be within 0..1, got {value}")
        self.cpu_fraction = cpu_fraction
        self.memory_fraction = memory_fraction

    def _reserve(self, state: CycleState) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        s = state.snapshot
        healthy = s.gpu_healthy_count
        gpu_node = healthy > 0
        idle_share = np.where(gpu_node, s.gpu_whole_free / np.maximum(healthy, 1), 0.0)
        cpu = np.ceil(s.cpu_alloc * idle_share * self.cpu_fraction).astype(np.int64)
        mem = np.ceil(s.mem_alloc * idle_share * self.memory_fraction).astype(np.int64)
        return gpu_node, cpu, mem

    def filter(self, state: CycleState, shape: PodShape) -> np.ndarray | None:
        if (
            shape.gpus
            or not (shape.cpu_milli or shape.mem_mib)
            or (self.cpu_fraction == 0 and self.memory_fraction == 0)
        ):
            return None
        s = state.snapshot
        gpu_node, cpu_res, mem_res = self._reserve(state)
        cap = np.full(s.n, np.iinfo(np.int64).max // 2, dtype=np.int64)
        if shape.cpu_milli:
            np.minimum(cap, (s.cpu_free - cpu_res) // shape.cpu_milli, out=cap)
        if shape.mem_mib:
            np.minimum(cap, (s.mem_free - mem_res) // shape.mem_mib, out=cap)
        cap = np.where(gpu_node, np.maximum(cap, 0), np.iinfo(np.int64).max // 2)
        return cap

    def explain(self, state: CycleState, shape: PodShape, failed: np.ndarray) -> str:
        n = int(failed.sum())
        return (
            f"{_nodes(n)} {'keeps its' if n == 1 else 'keep their'} remaining CPU/memory for GPU pods "
            f"(CPU-only pods leave idle GPUs {self.cpu_fraction:.0%} of their CPU and {self.memory_fraction:.0%} of their memory share)"
        )


class HeldRoom:
    """Room held for another gang (`state.data["held"]`: GPUs, milli-CPU, MiB per row) is not free.

    Whole GPUs are counted (a held GPU count is taken off the idle GPUs of the node); shares of a
    GPU and extended resources are not held.
    """

    name = "held-room"
    static = False

    def filter(self, state: CycleState, shape: PodShape) -> np.ndarray | None:
        held = state.data.get("held")
        if held is None:
            return None
        gpu, cpu, mem = held
        s = state.snapshot
        big = np.iinfo(np.int64).max // 2
        cap = np.full(s.n, big, dtype=np.int64)
        if shape.gpus and not shape.shared:
            avail = s.gpu_available(shape.gpu_class, shape.gpu_milli).astype(np.int64)
            np.minimum(cap, (avail - gpu) // shape.gpus, out=cap)
        if shape.cpu_milli:
            np.minimum(cap, (s.cpu_free - cpu) // shape.cpu_milli, out=cap)
        if shape.mem_mib:
            np.minimum(cap, (s.mem_free - mem) // shape.mem_mib, out=cap)
        touched = (gpu > 0) | (cpu > 0) | (mem > 0)
        return np.where(touched, np.maximum(cap, 0), big)

    def explain(self, state: CycleState, shape: PodShape, failed: np.ndarray) -> str:
        n = int(failed.sum())
        return (
            f"{_nodes(n)} {'keeps its' if n == 1 else 'keep their'} free room for a job that waits ahead "
            f"of this one (nominated after preemption, or the queue's head that cannot start yet)"
        )


def gpu_node_reserve(args: Mapping[str, Any]) -> GPUNodeReserve:
    """The `gpu-node-reserve` filter's factory: its arguments are `GPUNodeReserve`'s."""
    return GPUNodeReserve(**args)
