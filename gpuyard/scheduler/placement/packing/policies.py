"""The packing-policy interface and the FGD paper's baseline policies.

A policy answers two questions for one pod against a `ClusterState`:

1. ``score(state, pod, candidates)``: a number per candidate node (higher is better). The
   candidates are the nodes `fits` accepts; the caller never asks about a node the pod cannot use.
2. ``choose_gpus(state, node, pod)``: which GPU indices on the chosen node.

`select` turns scores into a node the way the FGD paper's simulator does: the highest score wins
and **ties go to the node whose name sorts first** (the simulator replaced kube-scheduler's random
pick with this for reproducibility; it packs work onto the same nodes and keeps the rest whole,
which matters a great deal for the results). ``policy.place(state, pod)`` is the whole step:
filter, score, select, pick GPUs. It does not commit; the caller calls
``state.allocate(node, gpus, pod)``.

``prepare(workload)`` is called once with the workload's pods before any scoring (FGD derives its
typical-pod distribution from it); policies that need nothing ignore it.

The baselines are scored as the paper's public simulator scores them: one score plugin each,
integer scores in 0..100 (kube-scheduler's range, truncated the way the simulator truncates), so
ties are common and `select_best` breaks them by node name. The normalising constants are the
simulator's: 128 CPU cores and 8 GPUs as the largest node.

* ``random``: a uniformly random feasible node; a shared pod gets a random fitting GPU.
* ``first-fit``: every node scores the same, so the first node by name that fits wins.
* ``dot-product`` (Tetris): ``1 - (free . request) / 2`` over normalised (CPU, total GPU) vectors,
  so the node with the least free capacity in the pod's directions scores highest.
* ``gpu-clustering``: prefer nodes already serving pods of the same GPU kind (shared, or k whole
  GPUs), then idle nodes, then nodes with other kinds; within a band, less free GPU scores higher.
* ``gpu-packing``: prefer a partly used GPU, then fully free GPUs on a partly used node, then an
  idle node (fewer GPUs first).
* ``best-fit``: least remaining (CPU, GPU) after placement, min-max normalised over the candidates.

All but ``random`` and ``first-fit`` give a shared pod the tightest GPU that fits.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import numpy as np

from gpuyard.scheduler.placement.packing.state import GPU_MILLI, ClusterState, PodRequest, fits

__all__ = [
    "MAX_SPEC_CPU",
    "MAX_SPEC_GPU",
    "BestFitPolicy",
    "DotProductPolicy",
    "FirstFitPolicy",
    "GpuClusteringPolicy",
    "GpuPackingPolicy",
    "PackingPolicy",
    "RandomPolicy",
    "best_fit_gpu",
    "first_fit_gpu",
    "select_best",
    "whole_gpus",
]


def whole_gpus(state: ClusterState, node: int, *, count: int) -> tuple[int, ...]:
    """The first ``count`` fully free GPUs of ``node`` (by index)."""
    free = np.flatnonzero(state.gpu_free[node] == GPU_MILLI)
    if len(free) < count:
        raise ValueError(f"node {state.node_names[node]} has {len(free)} fully free GPUs, {count} needed")
    return tuple(int(g) for g in free[:count])


def best_fit_gpu(state: ClusterState, node: int, *, milli: int) -> int:
    """The GPU with the least free milli that still fits ``milli`` (first index among equals)."""
    free = state.gpu_free[node]
    masked = np.where(free >= milli, free, GPU_MILLI + 1)
    g = int(np.argmin(masked))
    if masked[g] > GPU_MILLI:
        raise ValueError(f"node {state.node_names[node]} has no GPU with {milli}m free")
    return g


def first_fit_gpu(state: ClusterState, node: int, *, milli: int) -> int:
    """The lowest-index GPU with at least ``milli`` free."""
    ok = np.flatnonzero(state.gpu_free[node] >= milli)
    if len(ok) == 0:
        raise ValueError(f"node {state.node_names[node]} has no GPU with {milli}m free")
    return int(ok[0])


def select_best(state: ClusterState, candidates: np.ndarray, *, scores: np.ndarray) -> int:
    """The candidate with the highest score; ties go to the node whose name sorts first."""
    scores = np.asarray(scores)
    tied = candidates[scores == scores.max()]
    if len(tied) == 1:
        return int(tied[0])
    return int(tied[np.argmin(state.name_rank[tied])])


class PackingPolicy:
    """Base of every packing policy. Subclasses set ``name`` and implement `score`."""

    name: ClassVar[str] = ""
    per_node: ClassVar[bool] = True
    """A node's score depends on that node (and the prepared workload) only, so a caller may keep
    scores of nodes that did not change; False for scores drawn at random or normalised over the
    candidates."""

    def prepare(self, workload: Iterable[PodRequest]) -> None:
        """Learn what the policy needs from the workload's pods (default: nothing)."""

    def score(self, state: ClusterState, pod: PodRequest, candidates: np.ndarray) -> np.ndarray:
        """One score per candidate node index, higher is better."""
        raise NotImplementedError

    def choose_gpus(self, state: ClusterState, node: int, pod: PodRequest) -> tuple[int, ...]:
        """GPU indices on ``node`` for ``pod`` (default: tightest GPU for a share, first free GPUs otherwise)."""
        if pod.num_gpu == 0:
            return ()
        if pod.shared:
            return (best_fit_gpu(state, node, milli=pod.gpu_milli),)
        return whole_gpus(state, node, count=pod.num_gpu)

    def select(self, state: ClusterState, pod: PodRequest, candidates: np.ndarray) -> int:
        """The chosen node among non-empty ``candidates``."""
        return select_best(state, candidates, scores=self.score(state, pod, candidates))

    def place(self, state: ClusterState, pod: PodRequest) -> tuple[int, tuple[int, ...]] | None:
        """Filter, score, select and pick GPUs for one pod; ``None`` if no node fits. Does not commit."""
        candidates = np.flatnonzero(fits(state, pod))
        if len(candidates) == 0:
            return None
        node = self.select(state, pod, candidates)
        return node, self.choose_gpus(state, node, pod)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


MAX_SPEC_CPU = 128_000
"""Largest node CPU (milli) the simulator normalises by."""
MAX_SPEC_GPU = 8 * GPU_MILLI
"""Largest node GPU (milli) the simulator normalises by."""
MAX_SCORE = 100


class RandomPolicy(PackingPolicy):
    """A uniformly random feasible node (seeded, so a run is reproducible)."""

    name = "random"
    per_node = False

    def __init__(self, *, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def score(self, state: ClusterState, pod: PodRequest, candidates: np.ndarray) -> np.ndarray:
        return self.rng.random(len(candidates))

    def choose_gpus(self, state: ClusterState, node: int, pod: PodRequest) -> tuple[int, ...]:
        if pod.shared:
            ok = np.flatnonzero(state.gpu_free[node] >= pod.gpu_milli)
            return (int(ok[self.rng.integers(len(ok))]),)
        return super().choose_gpus(state, node, pod)


class FirstFitPolicy(PackingPolicy):
    """The first node (by name) that fits; the first GPU (by index) that fits."""

    name = "first-fit"

    def score(self, state: ClusterState, pod: PodRequest, candidates: np.ndarray) -> np.ndarray:
        return np.zeros(len(candidates), dtype=np.int64)

    def choose_gpus(self, state: ClusterState, node: int, pod: PodRequest) -> tuple[int, ...]:
        if pod.shared:
            return (first_fit_gpu(state, node, milli=pod.gpu_milli),)
        return super().choose_gpus(state, node, pod)


class DotProductPolicy(PackingPolicy):
    """Tetris-style alignment: ``int(100 * (1 - (free . req) / 2))`` over normalised vectors."""

    name = "dot-product"

    def score(self, state: ClusterState, pod: PodRequest, candidates: np.ndarray) -> np.ndarray:
        cpu = state.cpu_free[candidates] / MAX_SPEC_CPU
        gpu = state.gpu_free[candidates].sum(axis=1, dtype=np.int64) / MAX_SPEC_GPU
        dot = cpu * (pod.cpu_milli / MAX_SPEC_CPU) + gpu * (pod.total_gpu_milli / MAX_SPEC_GPU)
        result: np.ndarray = np.trunc(MAX_SCORE * (1.0 - dot / 2.0)).astype(np.int64)
        return result


class GpuClusteringPolicy(PackingPolicy):
    """Group pods of one GPU kind on the same nodes (four score bands, see the module docstring)."""

    name = "gpu-clustering"

    def score(self, state: ClusterState, pod: PodRequest, candidates: np.ndarray) -> np.ndarray:
        if pod.num_gpu == 0:
            return np.zeros(len(candidates), dtype=np.int64)
        kinds = state.gpu_pods[candidates]
        kind = 0 if pod.shared else pod.num_gpu
        same = kinds[:, kind] > 0 if kind < kinds.shape[1] else np.zeros(len(candidates), dtype=bool)
        n_kinds = (kinds > 0).sum(axis=1)
        left = state.gpu_free[candidates].sum(axis=1, dtype=np.int64)
        base = (MAX_SCORE // 4) * (MAX_SPEC_GPU - left) // MAX_SPEC_GPU
        band = np.where(same, np.where(n_kinds == 1, 3, 2), np.where(n_kinds == 0, 1, 0))
        result: np.ndarray = base + band * (MAX_SCORE // 4)
        return result


class GpuPackingPolicy(PackingPolicy):
    """Partly used GPUs first, then free GPUs on partly used nodes, then idle nodes."""

    name = "gpu-packing"

    def score(self, state: ClusterState, pod: PodRequest, candidates: np.ndarray) -> np.ndarray:
        if pod.num_gpu == 0:
            return np.zeros(len(candidates), dtype=np.int64)
        free = state.gpu_free[candidates].astype(np.int64)
        n_full = (free == GPU_MILLI).sum(axis=1)
        idle = n_full == state.gpu_count[candidates]
        idle_score = np.maximum(MAX_SCORE // 3 - n_full, n_full)
        if pod.shared:
            tight = np.where(free >= pod.gpu_milli, free, GPU_MILLI + 1).min(axis=1)
            used_gpu = np.maximum(MAX_SCORE - (tight * 100 // GPU_MILLI) // 10, MAX_SCORE // 2)
            fresh_gpu = np.maximum(MAX_SCORE // 2 - 1, MAX_SCORE // 3)
            busy_score = np.where(tight < GPU_MILLI, used_gpu, fresh_gpu)
        else:
            busy_score = np.full(len(candidates), max(MAX_SCORE // 2 - pod.num_gpu, MAX_SCORE // 3))
        result: np.ndarray = np.where(idle, idle_score, busy_score)
        return result


class BestFitPolicy(PackingPolicy):
    """Least remaining resources after placement: ``100 * (1 - mean of leftover CPU and GPU)``, normalised."""

    name = "best-fit"
    per_node = False

    def score(self, state: ClusterState, pod: PodRequest, candidates: np.ndarray) -> np.ndarray:
        cpu_left = (state.cpu_free[candidates] - pod.cpu_milli) / MAX_SPEC_CPU
        gpu_left = (
            state.gpu_free[candidates].sum(axis=1, dtype=np.int64) - pod.total_gpu_milli
        ) / MAX_SPEC_GPU
        raw = np.trunc((1.0 - (cpu_left * 0.5 + gpu_left * 0.5)) * MAX_SCORE).astype(np.int64)
        lo, hi = raw.min(), raw.max()
        if hi == lo:
            return np.zeros(len(candidates), dtype=np.int64)
        result: np.ndarray = (raw - lo) * MAX_SCORE // (hi - lo)
        return result
