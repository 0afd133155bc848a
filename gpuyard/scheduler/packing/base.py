"""The packing-policy interface, node selection with name tie-breaking, and GPU pickers.

A policy answers two questions for one pod against a `ClusterState`:

1. ``score(state, pod, candidates)``: a number per candidate node (higher is better). The
   candidates are the nodes `fits` accepts; the caller never asks about a node the pod cannot use.
2. ``choose_gpus(state, node, pod)``: which GPU indices on the chosen node.

`select` turns scores into a node the way the FGD paper's simulator does: the highest score wins
and **ties go to the node whose name sorts first** (the simulator replaced kube-scheduler's random
pick with this for reproducibility; it packs work onto low-named nodes and keeps the rest whole,
which matters a great deal for the results). `place` is the whole step: filter, score, select,
pick GPUs. It does not commit; the caller calls ``state.allocate(node, gpus, pod)``.

``prepare(workload)`` is called once with the workload's pods before any scoring (FGD derives its
typical-pod distribution from it); policies that need nothing ignore it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import numpy as np

from gpuyard.scheduler.packing.state import GPU_MILLI, ClusterState, PodRequest, fits

__all__ = [
    "PackingPolicy",
    "best_fit_gpu",
    "first_fit_gpu",
    "place",
    "select_best",
    "whole_gpus",
]


def whole_gpus(state: ClusterState, node: int, k: int) -> tuple[int, ...]:
    """The first ``k`` fully free GPUs of ``node`` (by index)."""
    free = np.flatnonzero(state.gpu_free[node] == GPU_MILLI)
    if len(free) < k:
        raise ValueError(f"node {state.node_names[node]} has {len(free)} fully free GPUs, {k} needed")
    return tuple(int(g) for g in free[:k])


def best_fit_gpu(state: ClusterState, node: int, milli: int) -> int:
    """The GPU with the least free milli that still fits ``milli`` (first index among equals)."""
    free = state.gpu_free[node]
    masked = np.where(free >= milli, free, GPU_MILLI + 1)
    g = int(np.argmin(masked))
    if masked[g] > GPU_MILLI:
        raise ValueError(f"node {state.node_names[node]} has no GPU with {milli}m free")
    return g


def first_fit_gpu(state: ClusterState, node: int, milli: int) -> int:
    """The lowest-index GPU with at least ``milli`` free."""
    ok = np.flatnonzero(state.gpu_free[node] >= milli)
    if len(ok) == 0:
        raise ValueError(f"node {state.node_names[node]} has no GPU with {milli}m free")
    return int(ok[0])


def select_best(state: ClusterState, candidates: np.ndarray, scores: np.ndarray) -> int:
    """The candidate with the highest score; ties go to the node whose name sorts first."""
    scores = np.asarray(scores)
    tied = candidates[scores == scores.max()]
    if len(tied) == 1:
        return int(tied[0])
    return int(tied[np.argmin(state.name_rank[tied])])


class PackingPolicy:
    """Base of every packing policy. Subclasses set ``name`` and implement `score`."""

    name: ClassVar[str] = ""

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
            return (best_fit_gpu(state, node, pod.gpu_milli),)
        return whole_gpus(state, node, pod.num_gpu)

    def select(self, state: ClusterState, pod: PodRequest, candidates: np.ndarray) -> int:
        """The chosen node among non-empty ``candidates``."""
        return select_best(state, candidates, self.score(state, pod, candidates))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


def place(policy: PackingPolicy, state: ClusterState, pod: PodRequest) -> tuple[int, tuple[int, ...]] | None:
    """Filter, score, select and pick GPUs for one pod; ``None`` if no node fits. Does not commit."""
    candidates = np.flatnonzero(fits(state, pod))
    if len(candidates) == 0:
        return None
    node = policy.select(state, pod, candidates)
    return node, policy.choose_gpus(state, node, pod)
