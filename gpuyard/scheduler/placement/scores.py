"""Built-in Score plugins: one vectorised raw score per candidate node.

Scores look at the node as it would be *after* receiving `take` pods of the group. The engine
normalises each plugin's raw scores to 0..100 over the candidates and adds them up by weight.

* `gpu-binpack` — most-allocated over the node's GPUs and the extended resources the pod asks
  for: GPU pods fill partly used nodes first, so large free blocks stay whole.
* `exact-fit` — for multi-GPU pods: fewest GPUs of the class left idle on the node afterwards.
* `cpu-spread` — for CPU-only pods: least-allocated CPU/memory, and nodes without GPUs first.
* `gpu-type` — the pod's preferred node-affinity terms (e.g. `gpuyard.io/gpu-model In [a100]`).
* `failover` — a re-placed pod's previous node (`PodGroup.spec.preferredNodes`), then its block.
* GPU packing (FGD and gpuyard's policy, also for shares): `packing_plugins.py`.
* policies for simulation: `most-allocated` (best-fit), `least-allocated` (spread),
  `first-fit` (lowest row), `random`.
"""

from __future__ import annotations

import numpy as np

from gpuyard.scheduler.gangs.requests import GPU_MILLI, PodShape
from gpuyard.scheduler.placement.framework import CycleState

__all__ = [
    "CPUSpread",
    "ExactFit",
    "Failover",
    "FirstFit",
    "GPUBinpack",
    "GPUTypePreference",
    "LeastAllocated",
    "MostAllocated",
    "RandomScore",
    "normalize",
]


def normalize(raw: np.ndarray, *, valid: np.ndarray | None = None) -> np.ndarray:
    """Min-max to 0..100 over the `valid` entries (all by default); all-equal scores give zeros."""
    if valid is None:
        lo, hi = raw.min(), raw.max()
    else:
        lo = raw.min(where=valid, initial=np.inf)
        hi = raw.max(where=valid, initial=-np.inf)
    span = hi - lo
    if not span > 0:
        return np.zeros(len(raw), dtype=np.float64)
    result: np.ndarray = (raw - lo) * (100.0 / span)
    return result


def _used_after(free: np.ndarray, alloc: np.ndarray, taken: np.ndarray) -> np.ndarray:
    """Fraction of `alloc` in use once `taken` more is used (0 where nothing is allocatable)."""
    alloc_f = alloc.astype(np.float64)
    return np.where(alloc_f > 0, 1.0 - (free - taken) / np.maximum(alloc_f, 1.0), 0.0)


def _gpu_used_after(
    state: CycleState, shape: PodShape, nodes: np.ndarray | slice, take: np.ndarray
) -> np.ndarray:
    s = state.snapshot
    healthy = s.gpu_healthy_count[nodes]
    if shape.shared:
        free = np.where(s.gpu_healthy[nodes], s.gpu_free_milli[nodes], 0).sum(axis=1) / GPU_MILLI
        used = take * (shape.gpu_milli / GPU_MILLI)
        return _used_after(free, healthy, used)
    used = healthy - s.gpu_whole_free[nodes] + take * shape.gpus
    result: np.ndarray = used * s.gpu_healthy_inv[nodes]
    return result


class GPUBinpack:
    name = "gpu-binpack"

    def score(
        self, state: CycleState, shape: PodShape, nodes: np.ndarray | slice, take: np.ndarray
    ) -> np.ndarray | None:
        if not shape.gpus:
            return None
        s = state.snapshot
        total = _gpu_used_after(state, shape, nodes, take)
        terms = 1
        for name, amount in shape.ext:
            col = s.ext_col(name)
            if col is not None:
                total = total + _used_after(s.ext_free[nodes, col], s.ext_alloc[nodes, col], take * amount)
                terms += 1
        return total / terms


class ExactFit:
    name = "exact-fit"

    def score(
        self, state: CycleState, shape: PodShape, nodes: np.ndarray | slice, take: np.ndarray
    ) -> np.ndarray | None:
        if shape.gpus < 2:
            return None
        avail = state.snapshot.gpu_available(shape.gpu_class, shape.gpu_milli)[nodes]
        result: np.ndarray = -(avail - take * shape.gpus).astype(np.float64)
        return result


class CPUSpread:
    name = "cpu-spread"

    def score(
        self, state: CycleState, shape: PodShape, nodes: np.ndarray | slice, take: np.ndarray
    ) -> np.ndarray | None:
        if shape.gpus:
            return None
        s = state.snapshot
        cpu = _used_after(s.cpu_free[nodes], s.cpu_alloc[nodes], take * shape.cpu_milli)
        mem = _used_after(s.mem_free[nodes], s.mem_alloc[nodes], take * shape.mem_mib)
        no_gpu = (s.gpu_count[nodes] == 0).astype(np.float64)
        result: np.ndarray = (1.0 - (cpu + mem) / 2) + no_gpu
        return result


class GPUTypePreference:
    name = "gpu-type"

    def score(
        self, state: CycleState, shape: PodShape, nodes: np.ndarray | slice, take: np.ndarray
    ) -> np.ndarray | None:
        if not shape.preferences:
            return None
        s = state.snapshot
        out = np.zeros(len(take), dtype=np.float64)
        for weight, term in shape.preferences:
            out += weight * s.term_mask(term)[nodes]
        return out


class Failover:
    name = "failover"

    def score(
        self, state: CycleState, shape: PodShape, nodes: np.ndarray | slice, take: np.ndarray
    ) -> np.ndarray | None:
        node = state.preferred_node
        if node is None:
            return None
        s = state.snapshot
        row = s.index.get(node)
        if row is None:
            return None
        rows = np.arange(s.n)[nodes]
        out: np.ndarray = (rows == row).astype(np.float64) * 2
        if s.block[row] >= 0:
            out += s.block[nodes] == s.block[row]
        return out


class MostAllocated:
    """Best-fit over every resource the pod asks for (CPU, memory, GPUs)."""

    name = "most-allocated"

    def score(
        self, state: CycleState, shape: PodShape, nodes: np.ndarray | slice, take: np.ndarray
    ) -> np.ndarray | None:
        s = state.snapshot
        parts = []
        if shape.cpu_milli:
            parts.append(_used_after(s.cpu_free[nodes], s.cpu_alloc[nodes], take * shape.cpu_milli))
        if shape.mem_mib:
            parts.append(_used_after(s.mem_free[nodes], s.mem_alloc[nodes], take * shape.mem_mib))
        if shape.gpus:
            parts.append(_gpu_used_after(state, shape, nodes, take))
        if not parts:
            return None
        result: np.ndarray = sum(parts[1:], parts[0]) / len(parts)
        return result


class LeastAllocated(MostAllocated):
    name = "least-allocated"

    def score(
        self, state: CycleState, shape: PodShape, nodes: np.ndarray | slice, take: np.ndarray
    ) -> np.ndarray | None:
        used = super().score(state, shape, nodes, take)
        return None if used is None else 1.0 - used


class FirstFit:
    name = "first-fit"

    def score(
        self, state: CycleState, shape: PodShape, nodes: np.ndarray | slice, take: np.ndarray
    ) -> np.ndarray:
        return -np.arange(state.snapshot.n, dtype=np.float64)[nodes]


class RandomScore:
    name = "random"

    def score(
        self, state: CycleState, shape: PodShape, nodes: np.ndarray | slice, take: np.ndarray
    ) -> np.ndarray:
        return state.rng.random(len(take))
