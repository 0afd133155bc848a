"""GPU-sharing packing policies (FGD and the baselines) over flat node arrays.

A pure package: it imports NumPy and the standard library only, so the live scheduler's NumPy
snapshot and the trace-replay simulator call the same code. What the caller provides is a
`ClusterState` (see ``state.py`` for the array layout) and a `PodRequest`; what it gets back is a
node index and GPU indices::

    policy = get_policy("fgd")
    policy.prepare(workload_pods)           # FGD learns the typical pods
    choice = policy.place(state, pod)       # None, or (node, gpu indices); does not commit
    if choice is not None:
        state.allocate(*choice, pod)        # raises OvercommitError rather than over-commit

Policies: ``random``, ``first-fit``, ``dot-product``, ``gpu-clustering``, ``gpu-packing``,
``best-fit``, ``fgd`` (the paper's), ``gpuyard`` (FGD plus CPU-stranding and GPU-model scarcity
awareness; see ``fgd.py`` and docs/simulation.md).
"""

from __future__ import annotations

from gpuyard.scheduler.placement.packing.fgd import FgdPolicy, GpuyardPolicy
from gpuyard.scheduler.placement.packing.fragmentation import (
    FragmentationModel,
    TypicalPods,
    TypicalShape,
    fgd_scores,
)
from gpuyard.scheduler.placement.packing.policies import (
    BestFitPolicy,
    DotProductPolicy,
    FirstFitPolicy,
    GpuClusteringPolicy,
    GpuPackingPolicy,
    PackingPolicy,
    RandomPolicy,
    best_fit_gpu,
    first_fit_gpu,
    select_best,
    whole_gpus,
)
from gpuyard.scheduler.placement.packing.state import (
    GPU_MILLI,
    ClusterState,
    OvercommitError,
    PodRequest,
    fits,
)

__all__ = [
    "GPU_MILLI",
    "POLICIES",
    "BestFitPolicy",
    "ClusterState",
    "DotProductPolicy",
    "FgdPolicy",
    "FirstFitPolicy",
    "FragmentationModel",
    "GpuClusteringPolicy",
    "GpuPackingPolicy",
    "GpuyardPolicy",
    "OvercommitError",
    "PackingPolicy",
    "PodRequest",
    "RandomPolicy",
    "TypicalPods",
    "TypicalShape",
    "UnknownPolicyError",
    "best_fit_gpu",
    "fgd_scores",
    "first_fit_gpu",
    "fits",
    "get_policy",
    "select_best",
    "whole_gpus",
]

POLICIES: dict[str, type[PackingPolicy]] = {
    "random": RandomPolicy,
    "first-fit": FirstFitPolicy,
    "dot-product": DotProductPolicy,
    "gpu-clustering": GpuClusteringPolicy,
    "gpu-packing": GpuPackingPolicy,
    "best-fit": BestFitPolicy,
    "fgd": FgdPolicy,
    "gpuyard": GpuyardPolicy,
}
"""Policy name -> factory. Factories take keyword arguments only (``seed`` for ``random``)."""


class UnknownPolicyError(KeyError):
    """A policy name that is not in `POLICIES`."""

    def __str__(self) -> str:
        return f"unknown packing policy {self.args[0]!r}; known: {', '.join(POLICIES)}"


def get_policy(name: str, *, seed: int = 0, coverage: float | None = None) -> PackingPolicy:
    """A fresh policy instance by name; ``seed`` only matters to ``random``, ``coverage`` (the
    share of the workload FGD's typical pods cover, default 0.95) to ``fgd`` and ``gpuyard``."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise UnknownPolicyError(name) from None
    if factory is RandomPolicy:
        return RandomPolicy(seed=seed)
    if coverage is not None and issubclass(factory, FgdPolicy):
        return factory(coverage=coverage)
    return factory()
