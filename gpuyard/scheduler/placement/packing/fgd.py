"""FGD (fragmentation gradient descent) and gpuyard's policy built on it.

``fgd`` reproduces the FGD paper's scheduler as its public simulator runs it: typical pods from
the workload (95% coverage), score = ``int(sigmoid(dF / 1000) * 100)`` where dF is the decrease of
the node's fragmentation, a shared pod tried on every GPU that fits (first best GPU wins), a
whole-GPU pod on the node's first fully free GPUs, and ties between nodes broken by node name.

``gpuyard`` is FGD plus what FGD does not see: **CPU stranding** and **room kept for
model-constrained pods**. FGD's fragmentation asks only whether a typical pod still fits *once* on
a node, so it cannot tell that a CPU-heavy pod on a node with little CPU per GPU leaves that node's
remaining GPUs without the CPU their future pods need. On the openb trace that is the largest
loss: the 8-GPU G2 nodes (71% of the GPUs) have 12 cores per GPU, the average GPU pod asks for
about 10.9 cores per GPU, and whole idle GPUs end up stranded on CPU-exhausted G2 nodes while the
2-GPU T4 nodes (52 cores per GPU) sit with CPU to spare. gpuyard ranks candidate nodes,
lexicographically, by:

1. for a GPU pod that accepts any model: whether the node's GPU model keeps, after the pod, at
   least the free GPU milli the workload's pods restricted to that model still need (their demand,
   split evenly over the models each accepts, times the share of the cluster's GPUs still free).
   Steering such pods to CPU-rich nodes of another model would otherwise starve the pods that can
   only run there (validated on the `spec-P` workload variants, `bench/packing_variants.py`);
2. for a GPU pod, the increase of the node's **CPU deficit**, ``max(0, free GPUs x r - free CPU)``,
   where r is the workload's CPU per GPU (total CPU of its GPU pods / their total GPUs); smaller is
   better, and a negative increase (a GPU-heavy, CPU-light pod on a node short of CPU) is best.
   Nodes with CPU to spare all score 0 here, so FGD decides among them. CPU-only pods skip this
   key: FGD already counts what their CPU takes from the GPU pods' fit, and reserving CPU against
   them loses on CPU-heavy workloads (the `cpu-P` variants);
3. FGD's truncated score, unchanged (its integer buckets and the name order are what keep packing
   consolidated; breaking its ties by the exact fragmentation decrease measurably loses);
4. node name, as FGD.

The keys are exact integers packed into one int64 score, so the scheduler can use it as is.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from gpuyard.scheduler.placement.packing.fragmentation import FragmentationModel, TypicalPods, fgd_scores
from gpuyard.scheduler.placement.packing.policies import PackingPolicy
from gpuyard.scheduler.placement.packing.state import ClusterState, PodRequest

__all__ = ["FgdPolicy", "GpuyardPolicy"]


class FgdPolicy(PackingPolicy):
    """The FGD paper's scheduler (faithful reproduction; see the module docstring)."""

    name = "fgd"

    def __init__(self, *, coverage: float = 0.95) -> None:
        self.coverage = coverage
        self.model: FragmentationModel | None = None
        self._best_gpu: tuple[ClusterState, PodRequest, np.ndarray] | None = None

    def prepare(self, workload: Iterable[PodRequest]) -> None:
        self.model = FragmentationModel(TypicalPods.from_workload(workload, coverage=self.coverage))

    def _model(self) -> FragmentationModel:
        if self.model is None:
            raise RuntimeError(f"policy {self.name!r} needs prepare(workload) before scoring")
        return self.model

    def _fgd(self, state: ClusterState, pod: PodRequest, candidates: np.ndarray) -> np.ndarray:
        """FGD scores of ``candidates``; remembers each one's best GPU for `choose_gpus`."""
        model = self._model()
        score, gpu, _ = fgd_scores(model, state, pod=pod, nodes=candidates)
        if pod.shared:
            best = np.full(state.n_nodes, -1, dtype=np.int64)
            best[candidates] = gpu
            self._best_gpu = (state, pod, best)
        return score

    def score(self, state: ClusterState, pod: PodRequest, candidates: np.ndarray) -> np.ndarray:
        return self._fgd(state, pod, candidates)

    def choose_gpus(self, state: ClusterState, node: int, pod: PodRequest) -> tuple[int, ...]:
        if not pod.shared:
            return super().choose_gpus(state, node, pod)
        model = self._model()
        cached = self._best_gpu
        if (
            cached is not None
            and cached[0] is state
            and cached[1] is pod
            and cached[2][node] >= 0
            and model.is_current(state, node)  # the node is as it was when scored
        ):
            return (int(cached[2][node]),)
        _, gpu, _ = fgd_scores(model, state, pod=pod, nodes=np.array([node]))
        return (int(gpu[0]),)


class GpuyardPolicy(FgdPolicy):
    """FGD with model-room and CPU-stranding awareness (see the module docstring)."""

    name = "gpuyard"
    _FGD_LEVELS = 101  # FGD scores are 0..100
    _ROOM_KEY = 1 << 50  # above every deficit x FGD key

    def __init__(self, *, coverage: float = 0.95) -> None:
        super().__init__(coverage=coverage)
        self.cpu_per_gpu = 0
        self.model_demand: dict[int, int] = {}

    def prepare(self, workload: Iterable[PodRequest]) -> None:
        pods = list(workload)
        super().prepare(pods)
        gpu_milli = sum(p.total_gpu_milli for p in pods)
        gpu_cpu = sum(p.cpu_milli for p in pods if p.num_gpu)
        # r: milli-CPU per whole GPU asked for by the workload's GPU pods.
        self.cpu_per_gpu = round(gpu_cpu * 1000 / gpu_milli) if gpu_milli else 0
        demand: dict[int, int] = {}
        for p in pods:
            if p.num_gpu and p.allowed_models:
                share = p.total_gpu_milli // len(p.allowed_models)
                for m in p.allowed_models:
                    demand[m] = demand.get(m, 0) + share
        self.model_demand = demand

    def deficit_increase(self, state: ClusterState, pod: PodRequest, candidates: np.ndarray) -> np.ndarray:
        """int64[K]: increase of ``1000 x max(0, free GPUs x r - free CPU)`` if ``pod`` goes there."""
        r = self.cpu_per_gpu
        gpu = state.gpu_free[candidates].sum(axis=1, dtype=np.int64)
        cpu = state.cpu_free[candidates] * 1000
        before = np.maximum(0, gpu * r - cpu)
        after = np.maximum(0, (gpu - pod.total_gpu_milli) * r - (cpu - pod.cpu_milli * 1000))
        result: np.ndarray = after - before
        return result

    def leaves_room(self, state: ClusterState, pod: PodRequest, candidates: np.ndarray) -> np.ndarray:
        """bool[K]: after ``pod``, the candidate's GPU model still has the free GPU milli that the
        model-constrained pods still need (always True for constrained, CPU-only or when no pod
        of the workload is constrained)."""
        ok = np.ones(len(candidates), dtype=bool)
        if not self.model_demand or pod.allowed_models is not None or pod.num_gpu == 0:
            return ok
        n_models = len(state.model_names)
        has_model = state.gpu_model >= 0
        models = state.gpu_model[has_model]
        free = np.bincount(models, weights=state.gpu_free[has_model].sum(axis=1), minlength=n_models)
        supply = np.bincount(
            models, weights=state.gpu_count[has_model].astype(np.float64) * 1000.0, minlength=n_models
        )
        still_free = float(free.sum()) / max(float(supply.sum()), 1.0)
        need = np.zeros(n_models + 1)
        for m, milli in self.model_demand.items():
            if m < n_models:
                need[m] = milli * still_free
        cand_models = state.gpu_model[candidates]
        modelled = cand_models >= 0
        after = free[np.where(modelled, cand_models, 0)] - pod.total_gpu_milli
        ok[modelled] = after[modelled] >= need[cand_models[modelled]]
        return ok

    def score(self, state: ClusterState, pod: PodRequest, candidates: np.ndarray) -> np.ndarray:
        fgd = self._fgd(state, pod, candidates)
        key = fgd.astype(np.int64)
        if pod.num_gpu:
            key = key - self.deficit_increase(state, pod, candidates) * self._FGD_LEVELS
        result: np.ndarray = key + self.leaves_room(state, pod, candidates) * self._ROOM_KEY
        return result
