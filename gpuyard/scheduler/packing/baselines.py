"""The baseline packing policies of the FGD paper, as its public simulator scores them.

Each is one score plugin with integer scores in 0..100 (kube-scheduler's range, truncated the way
the simulator truncates), so ties are common and `select_best` breaks them by node name. The
normalising constants are the simulator's: 128 CPU cores and 8 GPUs as the largest node.

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

import numpy as np

from gpuyard.scheduler.packing.base import PackingPolicy, first_fit_gpu
from gpuyard.scheduler.packing.state import GPU_MILLI, ClusterState, PodRequest

__all__ = [
    "MAX_SPEC_CPU",
    "MAX_SPEC_GPU",
    "BestFitPolicy",
    "DotProductPolicy",
    "FirstFitPolicy",
    "GpuClusteringPolicy",
    "GpuPackingPolicy",
    "RandomPolicy",
]

MAX_SPEC_CPU = 128_000
"""Largest node CPU (milli) the simulator normalises by."""
MAX_SPEC_GPU = 8 * GPU_MILLI
"""Largest node GPU (milli) the simulator normalises by."""
MAX_SCORE = 100


class RandomPolicy(PackingPolicy):
    """A uniformly random feasible node (seeded, so a run is reproducible)."""

    name = "random"

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
            return (first_fit_gpu(state, node, pod.gpu_milli),)
        return super().choose_gpus(state, node, pod)


class DotProductPolicy(PackingPolicy):
    """Tetris-style alignment: ``int(100 * (1 - (free . req) / 2))`` over normalised vectors."""

    name = "dot-product"

    def score(self, state: ClusterState, pod: PodRequest, candidates: np.ndarray) -> np.ndarray:
        cpu = state.cpu_free[candidates] / MAX_SPEC_CPU
        gpu = state.gpu_free[candidates].sum(axis=1, dtype=np.int64) / MAX_SPEC_GPU
        dot = cpu * (pod.cpu_milli / MAX_SPEC_CPU) + gpu * (pod.total_gpu_milli / MAX_SPEC_GPU)
        return np.trunc(MAX_SCORE * (1.0 - dot / 2.0)).astype(np.int64)


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
        return base + band * (MAX_SCORE // 4)


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
        return np.where(idle, idle_score, busy_score)


class BestFitPolicy(PackingPolicy):
    """Least remaining resources after placement: ``100 * (1 - mean of leftover CPU and GPU)``, normalised."""

    name = "best-fit"

    def score(self, state: ClusterState, pod: PodRequest, candidates: np.ndarray) -> np.ndarray:
        cpu_left = (state.cpu_free[candidates] - pod.cpu_milli) / MAX_SPEC_CPU
        gpu_left = (
            state.gpu_free[candidates].sum(axis=1, dtype=np.int64) - pod.total_gpu_milli
        ) / MAX_SPEC_GPU
        raw = np.trunc((1.0 - (cpu_left * 0.5 + gpu_left * 0.5)) * MAX_SCORE).astype(np.int64)
        lo, hi = raw.min(), raw.max()
        if hi == lo:
            return np.zeros(len(candidates), dtype=np.int64)
        return (raw - lo) * MAX_SCORE // (hi - lo)
