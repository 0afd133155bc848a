"""Flat-array cluster state for GPU-sharing placement, and the feasibility filter.

This is the data the packing policies score. It is deliberately plain: one row per node, NumPy
arrays the live scheduler's snapshot can hand over as they are, no pydantic and no per-node
Python objects. The simulator (`gpuyard.sim.openb`) builds one from a trace; the scheduler builds
one from its snapshot.

Array layout (N nodes, G = the most GPUs any node has):

* ``cpu_free: int64[N]`` free CPU in milli-cores; ``mem_free: int64[N]`` free memory in MiB.
* ``gpu_free: int32[N, G]`` free milli-GPU of each GPU (1000 = an idle GPU). **Rows are padded
  with 0** for GPUs a node does not have, and ``gpu_count: int16[N]`` says how many exist. A
  padded slot behaves exactly like a fully used GPU (nothing fits on it, it adds nothing to free
  capacity), so vectorised code never needs to mask it; only "is the whole node idle" and
  ``release`` consult ``gpu_count``.
* ``gpu_model: int16[N]`` index into ``model_names`` (-1: no GPU model, e.g. a CPU-only node).
* ``gpu_pods: int32[N, G + 1]`` GPU pods on each node by kind: column 0 counts shared-GPU pods,
  column k counts pods holding k whole GPUs (the GPU-clustering policy reads it).

Sharing rule: a GPU serves either one whole-GPU pod or several shared pods, never both. It is
kept by the arithmetic: a whole-GPU pod needs ``free == 1000`` and takes all of it; a shared pod
needs ``free >= gpu_milli``; so a GPU with any share taken is not fully free, and a GPU held whole
has nothing left. ``allocate`` checks every request and raises `OvercommitError` rather than go
below zero; ``release`` raises rather than free more than a node has.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "GPU_MILLI",
    "ClusterState",
    "OvercommitError",
    "PodRequest",
    "fits",
]

GPU_MILLI = 1000
"""Capacity of one GPU in milli-GPU."""


class OvercommitError(ValueError):
    """An allocation or release that would break the node's capacity or the sharing rule."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PodRequest:
    """What one pod asks for (keyword arguments only).

    ``gpu_milli`` is per GPU: 1000 for whole GPUs, ``0 < gpu_milli < 1000`` only with
    ``num_gpu == 1`` (a shared GPU). ``allowed_models`` holds model indices into the state's
    ``model_names`` (``None``: any model).
    """

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int = 0
    gpu_milli: int = 0
    allowed_models: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_mib < 0 or self.num_gpu < 0:
            raise ValueError(f"pod {self.name}: negative request")
        if self.num_gpu == 0:
            if self.gpu_milli != 0:
                raise ValueError(f"pod {self.name}: gpu_milli={self.gpu_milli} without num_gpu")
        elif not 0 < self.gpu_milli <= GPU_MILLI:
            raise ValueError(f"pod {self.name}: gpu_milli must be in 1..{GPU_MILLI}, got {self.gpu_milli}")
        elif self.gpu_milli < GPU_MILLI and self.num_gpu != 1:
            raise ValueError(f"pod {self.name}: a GPU share (gpu_milli < {GPU_MILLI}) needs num_gpu == 1")

    @property
    def shared(self) -> bool:
        """True for a pod that takes part of one GPU."""
        return self.num_gpu == 1 and self.gpu_milli < GPU_MILLI

    @property
    def total_gpu_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def shape(self) -> tuple[int, int, int, tuple[int, ...] | None]:
        """The request shape FGD groups typical pods by: (cpu, num_gpu, gpu_milli, models)."""
        return (self.cpu_milli, self.num_gpu, self.gpu_milli, self.allowed_models)


class ClusterState:
    """Mutable free capacity of every node, as flat arrays (see the module docstring)."""

    __slots__ = (
        "cpu_capacity",
        "cpu_free",
        "gpu_count",
        "gpu_free",
        "gpu_model",
        "gpu_pods",
        "mem_capacity",
        "mem_free",
        "model_names",
        "name_rank",
        "node_names",
    )

    def __init__(
        self,
        *,
        node_names: Sequence[str],
        model_names: Sequence[str],
        cpu_free: np.ndarray,
        mem_free: np.ndarray,
        gpu_free: np.ndarray,
        gpu_count: np.ndarray,
        gpu_model: np.ndarray,
        cpu_capacity: np.ndarray | None = None,
        mem_capacity: np.ndarray | None = None,
        gpu_pods: np.ndarray | None = None,
    ) -> None:
        n = len(node_names)
        self.node_names = list(node_names)
        self.model_names = list(model_names)
        self.cpu_free = np.asarray(cpu_free, dtype=np.int64).copy()
        self.mem_free = np.asarray(mem_free, dtype=np.int64).copy()
        self.gpu_free = np.asarray(gpu_free, dtype=np.int32).reshape(n, -1).copy()
        self.gpu_count = np.asarray(gpu_count, dtype=np.int16).copy()
        self.gpu_model = np.asarray(gpu_model, dtype=np.int16).copy()
        self.cpu_capacity = (
            self.cpu_free.copy() if cpu_capacity is None else np.asarray(cpu_capacity, np.int64)
        )
        self.mem_capacity = (
            self.mem_free.copy() if mem_capacity is None else np.asarray(mem_capacity, np.int64)
        )
        g = self.gpu_free.shape[1]
        if gpu_pods is None:
            gpu_pods = np.zeros((n, g + 1), dtype=np.int32)
        self.gpu_pods = np.asarray(gpu_pods, dtype=np.int32).copy()
        for arr, what in (
            (self.cpu_free, "cpu_free"),
            (self.mem_free, "mem_free"),
            (self.gpu_count, "gpu_count"),
        ):
            if arr.shape != (n,):
                raise ValueError(f"{what} must have one entry per node ({n}), got shape {arr.shape}")
        if self.gpu_model.shape != (n,):
            raise ValueError(
                f"gpu_model must have one entry per node ({n}), got shape {self.gpu_model.shape}"
            )
        if n and (self.gpu_count.max(initial=0) > g or self.gpu_count.min(initial=0) < 0):
            raise ValueError(f"gpu_count must be within 0..{g} (the width of gpu_free)")
        if (self.gpu_free < 0).any() or (self.gpu_free > GPU_MILLI).any():
            raise ValueError(f"gpu_free values must be within 0..{GPU_MILLI}")
        if (self.gpu_model >= len(self.model_names)).any():
            raise ValueError("gpu_model holds an index beyond model_names")
        order = np.argsort(np.array(self.node_names, dtype=object), kind="stable")
        self.name_rank = np.empty(n, dtype=np.int64)
        self.name_rank[order] = np.arange(n)

    @classmethod
    def from_nodes(
        cls,
        *,
        names: Sequence[str],
        cpu_milli: Sequence[int] | np.ndarray,
        memory_mib: Sequence[int] | np.ndarray,
        gpus: Sequence[int] | np.ndarray,
        models: Sequence[str],
    ) -> ClusterState:
        """An empty cluster: every node fully free. ``models[i]`` is "" for a node without GPUs."""
        gpus = np.asarray(gpus, dtype=np.int64)
        model_names = sorted({m for m in models if m})
        model_index = {m: i for i, m in enumerate(model_names)}
        width = max(int(gpus.max(initial=0)), 1)
        gpu_free = np.where(np.arange(width)[None, :] < gpus[:, None], GPU_MILLI, 0)
        return cls(
            node_names=names,
            model_names=model_names,
            cpu_free=np.asarray(cpu_milli),
            mem_free=np.asarray(memory_mib),
            gpu_free=gpu_free,
            gpu_count=gpus,
            gpu_model=np.array([model_index.get(m, -1) if m else -1 for m in models], dtype=np.int16),
        )

    # ---------------------------------------------------------------- queries
    @property
    def n_nodes(self) -> int:
        return len(self.node_names)

    @property
    def max_gpus(self) -> int:
        return self.gpu_free.shape[1]

    @property
    def total_gpu_milli(self) -> int:
        return int(self.gpu_count.astype(np.int64).sum()) * GPU_MILLI

    @property
    def free_gpu_milli(self) -> int:
        return int(self.gpu_free.sum(dtype=np.int64))

    def model_ids(self, spec: str | None) -> tuple[int, ...] | None:
        """Model indices for a ``|``-separated GPU spec ("" or None: any). Raises KeyError on an unknown model."""
        if not spec:
            return None
        ids = set()
        for name in spec.split("|"):
            name = name.strip()
            if not name:
                continue
            try:
                ids.add(self.model_names.index(name))
            except ValueError:
                raise KeyError(name) from None
        return tuple(sorted(ids)) if ids else None

    def copy(self) -> ClusterState:
        return ClusterState(
            node_names=self.node_names,
            model_names=self.model_names,
            cpu_free=self.cpu_free,
            mem_free=self.mem_free,
            gpu_free=self.gpu_free,
            gpu_count=self.gpu_count,
            gpu_model=self.gpu_model,
            cpu_capacity=self.cpu_capacity,
            mem_capacity=self.mem_capacity,
            gpu_pods=self.gpu_pods,
        )

    # ---------------------------------------------------------------- changes
    def _check_gpus(self, node: int, gpus: Sequence[int], pod: PodRequest) -> list[int]:
        idx = [int(g) for g in gpus]
        if len(idx) != pod.num_gpu:
            raise OvercommitError(f"pod {pod.name} asks for {pod.num_gpu} GPU(s), got indices {idx}")
        if len(set(idx)) != len(idx):
            raise OvercommitError(f"pod {pod.name}: GPU indices {idx} repeat")
        count = int(self.gpu_count[node])
        for g in idx:
            if not 0 <= g < count:
                raise OvercommitError(f"node {self.node_names[node]} has no GPU {g} (it has {count})")
        return idx

    def allocate(self, node: int, gpus: Sequence[int], pod: PodRequest) -> None:
        """Take ``pod``'s request on ``node`` and GPUs ``gpus``; raise `OvercommitError` if it does not fit."""
        node = int(node)
        idx = self._check_gpus(node, gpus, pod)
        where = f"node {self.node_names[node]}"
        if self.cpu_free[node] < pod.cpu_milli:
            raise OvercommitError(
                f"{where}: pod {pod.name} needs {pod.cpu_milli}m CPU, {self.cpu_free[node]}m free"
            )
        if self.mem_free[node] < pod.memory_mib:
            raise OvercommitError(
                f"{where}: pod {pod.name} needs {pod.memory_mib}Mi, {self.mem_free[node]}Mi free"
            )
        if pod.allowed_models is not None and int(self.gpu_model[node]) not in pod.allowed_models and idx:
            raise OvercommitError(f"{where}: GPU model not allowed for pod {pod.name}")
        for g in idx:
            free = int(self.gpu_free[node, g])
            if pod.shared and free < pod.gpu_milli:
                raise OvercommitError(f"{where} GPU {g}: pod {pod.name} needs {pod.gpu_milli}m, {free}m free")
            if not pod.shared and free != GPU_MILLI:
                raise OvercommitError(
                    f"{where} GPU {g} is not fully free ({free}m); pod {pod.name} needs it whole"
                )
        self.cpu_free[node] -= pod.cpu_milli
        self.mem_free[node] -= pod.memory_mib
        for g in idx:
            self.gpu_free[node, g] -= pod.gpu_milli
        if pod.num_gpu:
            self.gpu_pods[node, 0 if pod.shared else pod.num_gpu] += 1

    def release(self, node: int, gpus: Sequence[int], pod: PodRequest) -> None:
        """Give back what `allocate` took; raise `OvercommitError` if the node would exceed its capacity."""
        node = int(node)
        idx = self._check_gpus(node, gpus, pod)
        where = f"node {self.node_names[node]}"
        if self.cpu_free[node] + pod.cpu_milli > self.cpu_capacity[node]:
            raise OvercommitError(f"{where}: releasing pod {pod.name} would exceed its CPU capacity")
        if self.mem_free[node] + pod.memory_mib > self.mem_capacity[node]:
            raise OvercommitError(f"{where}: releasing pod {pod.name} would exceed its memory capacity")
        for g in idx:
            if int(self.gpu_free[node, g]) + pod.gpu_milli > GPU_MILLI:
                raise OvercommitError(f"{where} GPU {g}: releasing pod {pod.name} would exceed {GPU_MILLI}m")
        kind = 0 if pod.shared else pod.num_gpu
        if pod.num_gpu and self.gpu_pods[node, kind] <= 0:
            raise OvercommitError(f"{where}: no pod like {pod.name} is placed there")
        self.cpu_free[node] += pod.cpu_milli
        self.mem_free[node] += pod.memory_mib
        for g in idx:
            self.gpu_free[node, g] += pod.gpu_milli
        if pod.num_gpu:
            self.gpu_pods[node, kind] -= 1


_MASK_CACHE: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}


def model_mask(n_models: int, allowed: tuple[int, ...] | None) -> np.ndarray:
    """bool[n_models + 1]: which model indices a pod accepts; the extra last slot (index -1) is False."""
    key = (n_models, allowed or ())
    mask = _MASK_CACHE.get(key)
    if mask is None:
        mask = np.zeros(n_models + 1, dtype=bool)
        if allowed is None:
            mask[:n_models] = True
        else:
            mask[list(allowed)] = True
        _MASK_CACHE[key] = mask
    return mask


def fits(state: ClusterState, pod: PodRequest, rows: np.ndarray | None = None) -> np.ndarray:
    """bool[N] (or bool[len(rows)] for those rows only): the nodes that can host ``pod`` now
    (CPU, memory, GPU count or share, GPU model)."""
    at = slice(None) if rows is None else rows
    ok = (state.cpu_free[at] >= pod.cpu_milli) & (state.mem_free[at] >= pod.memory_mib)
    if pod.num_gpu == 0:
        return ok
    free = state.gpu_free[at]
    if pod.shared:
        ok &= (free >= pod.gpu_milli).any(axis=1)
    else:
        ok &= (free == GPU_MILLI).sum(axis=1) >= pod.num_gpu
    if pod.allowed_models is not None:
        ok &= model_mask(len(state.model_names), pod.allowed_models)[state.gpu_model[at]]
    return ok
