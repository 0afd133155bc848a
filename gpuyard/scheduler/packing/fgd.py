"""FGD (fragmentation gradient descent) and gpuyard's policy built on it.

``fgd`` reproduces the FGD paper's scheduler as its public simulator runs it: typical pods from
the workload (95% coverage), score = ``int(sigmoid(dF / 1000) * 100)`` where dF is the decrease of
the node's fragmentation, a shared pod tried on every GPU that fits (first best GPU wins), a
whole-GPU pod on the node's first fully free GPUs, and ties between nodes broken by node name.

``gpuyard`` is FGD plus the resource FGD does not see: **CPU stranding**. FGD's fragmentation asks
only whether a typical pod still fits *once* on a node, so it cannot tell that a CPU-heavy pod on a
node with little CPU per GPU leaves that node's remaining GPUs without the CPU their future pods
need. On the openb trace that is the largest loss: the 8-GPU G2 nodes (71% of the GPUs) have 12
cores per GPU, the average GPU pod asks for about 10.9 cores per GPU, and whole idle GPUs end up
stranded on CPU-exhausted G2 nodes while the 2-GPU T4 nodes (52 cores per GPU) sit with CPU to
spare. gpuyard ranks candidate nodes, lexicographically, by:

1. the increase of the node's **CPU deficit**, ``max(0, free GPUs x r - free CPU)``, where r is the
   workload's CPU per GPU (total CPU of its GPU pods / their total GPUs); smaller is better, and a
   negative increase (a GPU-heavy, CPU-light pod on a node short of CPU) is best. Nodes with CPU to
   spare all score 0 here, so FGD decides among them;
2. FGD's truncated score, unchanged (its integer buckets and the name order are what keep packing
   consolidated; breaking its ties by the exact fragmentation decrease measurably loses);
3. GPU-model scarcity, for a pod that accepts any model: prefer nodes whose model is least asked
   for by the workload's model-constrained pods (a no-op when no pod is constrained);
4. node name, as FGD.

The keys are exact integers packed into one int64 score, so the scheduler can use it as is.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from gpuyard.scheduler.packing.fragmentation import FragmentationModel, TypicalPods, fgd_scores
from gpuyard.scheduler.packing.policies import PackingPolicy
from gpuyard.scheduler.packing.state import ClusterState, PodRequest

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
    """FGD with CPU-stranding and model-scarcity awareness (see the module docstring)."""

    name = "gpuyard"
    _FGD_LEVELS = 101  # FGD scores are 0..100
    _SCARCITY_LEVELS = 101  # scarcity key is 0..100

    def __init__(self, *, coverage: float = 0.95) -> None:
        super().__init__(coverage=coverage)
        self.cpu_per_gpu = 0
        self.model_demand: dict[int, int] = {}
        self._scarcity: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

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
        self._scarcity = None

    def deficit_increase(self, state: ClusterState, pod: PodRequest, candidates: np.ndarray) -> np.ndarray:
        """int64[K]: increase of ``1000 x max(0, free GPUs x r - free CPU)`` if ``pod`` goes there."""
        r = self.cpu_per_gpu
        gpu = state.gpu_free[candidates].sum(axis=1, dtype=np.int64)
        cpu = state.cpu_free[candidates] * 1000
        before = np.maximum(0, gpu * r - cpu)
        after = np.maximum(0, (gpu - pod.total_gpu_milli) * r - (cpu - pod.cpu_milli * 1000))
        return after - before

    def scarcity(self, state: ClusterState, pod: PodRequest, candidates: np.ndarray) -> np.ndarray:
        """int64[K] in 0..100: 100 - constrained demand on the node's model in % of its supply."""
        if not self.model_demand or pod.allowed_models is not None or pod.num_gpu == 0:
            return np.zeros(len(candidates), dtype=np.int64)
        cached = self._scarcity
        if cached is not None and cached[0] is state.gpu_model and cached[1] is state.gpu_count:
            return cached[2][state.gpu_model[candidates]]  # models and GPU counts never change in a state
        table = self._scarcity_table(state)
        self._scarcity = (state.gpu_model, state.gpu_count, table)
        return table[state.gpu_model[candidates]]

    def _scarcity_table(self, state: ClusterState) -> np.ndarray:
        """int64[models + 1]: the scarcity key per model index (the last entry: no model)."""
        n_models = len(state.model_names)
        supply = np.bincount(
            state.gpu_model[state.gpu_model >= 0],
            weights=state.gpu_count[state.gpu_model >= 0].astype(np.float64) * 1000.0,
            minlength=n_models,
        )
        demand = np.zeros(n_models + 1)
        for m, milli in self.model_demand.items():
            if m < n_models:
                demand[m] = milli
        pressure = np.divide(demand[:n_models], supply, out=np.ones(n_models), where=supply > 0)
        key = 100 - np.round(100 * np.minimum(pressure, 1.0)).astype(np.int64)
        return np.append(key, 0)

    def score(self, state: ClusterState, pod: PodRequest, candidates: np.ndarray) -> np.ndarray:
        fgd = self._fgd(state, pod, candidates)
        key = -self.deficit_increase(state, pod, candidates)
        key = key * self._FGD_LEVELS + fgd
        return key * self._SCARCITY_LEVELS + self.scarcity(state, pod, candidates)
