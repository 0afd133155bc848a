"""The packing policies as scheduler plugins: the `packing` score, the `packing` GPU chooser, the
`packing` profile.

`gpuyard.scheduler.placement.packing` holds the GPU-sharing packing policies (FGD, best-fit, ..., and
gpuyard's own) over flat `ClusterState` arrays. This module runs them inside the scheduling
framework, on the live :class:`~gpuyard.scheduler.cache.snapshot.Snapshot`, so the trace simulator and
`gpuyard serve` place pods with one and the same code:

* :class:`PackingScore` (score plugin ``packing``, args ``policy`` (default ``gpuyard``),
  ``coverage``, ``seed``) keeps a `ClusterState` *mirror* of the snapshot, row for row, refreshes
  its free arrays from the snapshot before each scoring (a few vectorised copies; FGD's
  per-node fragmentation cache then recomputes only the rows that changed), and returns the
  policy's score for the candidate rows. The policy learns its typical pods from
  :meth:`PackingScore.prepare` (the simulator passes the trace's workload) or, when nothing was
  prepared, from the pods now holding GPUs plus the pod being placed (the live platform).
* :class:`PackingChooser` (chooser ``packing-gpus``): a GPU share goes on the GPU the policy picks (FGD:
  the GPU whose use fragments the node least); whole GPUs come from the `topology` chooser, which
  keeps NVLink-aware choices (for fragmentation only the number of idle GPUs on a node counts).
* :class:`CPUStranding` (score ``cpu-stranding``, for CPU-only pods): the increase of each node's
  CPU deficit, ``max(0, free GPUs x r - free CPU)`` with r the CPU per GPU of the GPU pods
  running now. The gpuyard policy leaves CPU-only pods to FGD, whose coarse scores tie on most
  nodes: the ``packing`` profile breaks those ties by node order (as the paper's simulator), a
  live profile that also spreads CPU-only pods (``cpu-spread``) breaks them with this score
  first, so spreading never takes the CPU that a GPU node's idle GPUs need.
* the ``packing`` profile: ``packing`` as the only score, pack fill, the ``packing-gpus`` chooser,
  and the default filters but ``gpu-node-reserve`` (how much CPU to leave next to idle GPUs is
  the policy's business: gpuyard's policy weighs exactly that).
  Select the policy with ``scheduler.plugin_args: {packing: {policy: fgd}}``.

Ties go to the lowest snapshot row (the framework's argmax), which the simulator orders by node
name, as the paper's simulator breaks ties.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.gangs.requests import GPU_MILLI, Constraints, PodShape
from gpuyard.scheduler.placement.choosing import share_choice
from gpuyard.scheduler.placement.filtering import static_mask
from gpuyard.scheduler.placement.filters import DEFAULT_FILTERS
from gpuyard.scheduler.placement.framework import CycleState, GPUChoice, ProfileSpec
from gpuyard.scheduler.placement.packing import (
    POLICIES,
    ClusterState,
    PackingPolicy,
    PodRequest,
    fits,
    get_policy,
)
from gpuyard.scheduler.placement.topology import TopologyChooser

__all__ = [
    "PACKING_PROFILE",
    "CPUStranding",
    "PackingChooser",
    "PackingScore",
    "mirror_of",
    "packing_score_factory",
]

_SCORE_CACHE_SIZE = 64  # pod shapes whose per-node scores are kept


def mirror_of(snapshot: Snapshot) -> ClusterState:
    """A `ClusterState` with one row per snapshot row (dead rows: no GPUs, no capacity)."""
    n, g = snapshot.n, snapshot.g
    names = [name or "" for name in snapshot.names] + [""] * (n - len(snapshot.names))
    alive = snapshot.alive
    return ClusterState(
        node_names=names,
        model_names=snapshot.model_names,
        cpu_free=np.zeros(n, dtype=np.int64),
        mem_free=np.zeros(n, dtype=np.int64),
        gpu_free=np.zeros((n, g), dtype=np.int32),
        gpu_count=np.where(alive, snapshot.gpu_count, 0),
        gpu_model=np.where(alive, snapshot.gpu_model, -1),
        cpu_capacity=np.where(alive, snapshot.cpu_alloc, 0),
        mem_capacity=np.where(alive, snapshot.mem_alloc, 0),
        gpu_pods=np.zeros((n, g + 1), dtype=np.int32),
    )


class PackingScore:
    """A packing policy's score over the snapshot (see the module docstring)."""

    name = "packing"
    normalize_keeps_order = True  # a lone opinion is used as is (see `placing.score_candidates`)

    def __init__(
        self, *, policy: str = "gpuyard", coverage: float = 0.95, seed: int = 0, gpu_only: bool = False
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"packing: unknown policy {policy!r}; known: {', '.join(POLICIES)}")
        if not 0 < coverage <= 1:
            raise ValueError(f"packing: coverage must be within (0, 1], got {coverage}")
        self.policy: PackingPolicy = get_policy(policy, seed=seed, coverage=coverage)
        self.gpu_only = gpu_only
        self.prepared = False
        self._learned: tuple[int, int, int, set[tuple[int, int, int]]] | None = (
            None  # version, pods, shapes, shapes seen
        )
        self._mirror: ClusterState | None = None
        self._stamp: tuple[int, int, int, int, int] | None = None
        self._models: dict[tuple[Constraints, str | None], tuple[int, ...] | None] = {}
        self._seen = np.zeros(0, dtype=np.int64)
        self._scores: dict[
            tuple[tuple[int, int, int, tuple[int, ...] | None], int], tuple[int, np.ndarray, np.ndarray]
        ] = {}
        self._generation = 0  # bumped when the policy learns a workload: cached scores are void

    def prepare(self, workload: Iterable[PodRequest]) -> None:
        """Fix the workload the policy measures fragmentation against (model indices refer to the
        snapshot's `model_names`)."""
        self.policy.prepare(workload)
        self.prepared = True
        self._generation += 1

    # --- the mirror ------------------------------------------------------------------------------

    def mirror(self, snapshot: Snapshot) -> ClusterState:
        """The snapshot's free capacity as the policy's `ClusterState`: the rows whose
        `row_version` moved since the last call are copied again, the others are kept."""
        stamp = (id(snapshot), snapshot.static_version, snapshot.n, snapshot.g, len(snapshot.model_names))
        if self._mirror is None or self._stamp != stamp:
            self._mirror, self._stamp, self._models = mirror_of(snapshot), stamp, {}
            self._seen = np.full(snapshot.n, -1, dtype=np.int64)
            self._scores.clear()
        m = self._mirror
        dirty = np.flatnonzero(snapshot.row_version != self._seen)
        if len(dirty):
            m.cpu_free[dirty] = np.maximum(snapshot.cpu_free[dirty], 0)
            m.mem_free[dirty] = np.maximum(snapshot.mem_free[dirty], 0)
            free = np.where(snapshot.gpu_healthy[dirty], snapshot.gpu_free_milli[dirty], 0)
            m.gpu_free[dirty] = np.clip(free, 0, GPU_MILLI)
            m.gpu_pods[dirty] = snapshot.gpu_kinds[dirty]
            self._seen[dirty] = snapshot.row_version[dirty]
        return m

    def _cached_scores(self, snapshot: Snapshot, mirror: ClusterState, pod: PodRequest) -> np.ndarray:
        """float[N]: the policy's score of every row for `pod` (-inf where it does not fit),
        recomputed only for rows that changed since this shape was last scored (`per_node`)."""
        key = (pod.shape, pod.memory_mib)
        entry = self._scores.pop(key, None)
        if entry is None or entry[0] != self._generation:
            scores = np.full(snapshot.n, -np.inf)
            seen = np.full(snapshot.n, -1, dtype=np.int64)
        else:
            _, scores, seen = entry
        dirty = np.flatnonzero(snapshot.row_version != seen)
        if len(dirty):
            ok = dirty[fits(mirror, pod, dirty)]
            scores[dirty] = -np.inf
            if len(ok):
                scores[ok] = self.policy.score(mirror, pod, ok)
            seen[dirty] = snapshot.row_version[dirty]
        self._scores[key] = (self._generation, scores, seen)  # most recent last
        if len(self._scores) > _SCORE_CACHE_SIZE:
            del self._scores[next(iter(self._scores))]
        return scores

    def request(self, state: CycleState | None, shape: PodShape) -> PodRequest:
        """The pod as the policy sees it; with a `state`, the GPU models it may use when its
        constraints narrow them."""
        return PodRequest(
            name="pod",
            cpu_milli=shape.cpu_milli,
            memory_mib=shape.mem_mib,
            num_gpu=shape.gpus,
            gpu_milli=shape.gpu_milli if shape.gpus else 0,
            allowed_models=self._allowed_models(state, shape) if shape.gpus and state is not None else None,
        )

    def _allowed_models(self, state: CycleState, shape: PodShape) -> tuple[int, ...] | None:
        key = (shape.constraints, shape.gpu_class)
        if key not in self._models:
            snap = state.snapshot
            with_gpus = snap.alive & (snap.gpu_count > 0) & (snap.gpu_model >= 0)
            every = set(np.unique(snap.gpu_model[with_gpus]).tolist())
            # the nodes the pod's constraints allow for one GPU: the static filters also weigh
            # the GPU count, which says nothing about models
            one = PodShape(
                gpus=1, gpu_milli=GPU_MILLI, gpu_class=shape.gpu_class, constraints=shape.constraints
            )
            allowed = set(np.unique(snap.gpu_model[with_gpus & static_mask(state, one)]).tolist())
            self._models[key] = tuple(sorted(allowed)) if allowed != every else None
        return self._models[key]

    def _learn(self, snapshot: Snapshot, pod: PodRequest, *, synthetic: bool = False) -> None:
        """Without a prepared workload: the pods now holding GPUs plus this one.

        Learning resets FGD's per-node cache, so it is redone only when it matters: the pod's
        shape is new to the model, or the number of GPU pods or of distinct shapes moved by more
        than a quarter since the last time (the proportions FGD weighs change slowly). A
        `synthetic` pod (a gang's pods summed) is no workload shape: it never causes a re-learn.
        """
        if self._learned is not None and (self._learned[0] == snapshot.version or synthetic):
            return
        counts = snapshot.workload_counts()
        total, kinds = sum(counts.values()), len(counts)
        last = self._learned
        key = (pod.cpu_milli, pod.num_gpu, pod.gpu_milli)
        if (
            last is not None
            and key in last[3]
            and abs(total - last[1]) * 4 <= last[1]
            and abs(kinds - last[2]) * 4 <= last[2]
        ):
            self._learned = (snapshot.version, *last[1:])
            return
        workload = [pod]
        for (cpu, n, milli), count in counts.items():
            workload.extend(
                [PodRequest(name="w", cpu_milli=cpu, memory_mib=0, num_gpu=n, gpu_milli=milli)] * count
            )
        self.policy.prepare(workload)
        self._generation += 1
        self._learned = (snapshot.version, total, kinds, {*counts, key})

    # --- the plugin ------------------------------------------------------------------------------

    def score(
        self, state: CycleState, shape: PodShape, nodes: np.ndarray | slice, take: np.ndarray
    ) -> np.ndarray | None:
        if self.gpu_only and not shape.gpus:
            return None
        snap = state.snapshot
        mirror = self.mirror(snap)
        pod = self.request(state, shape)
        if not self.prepared:
            self._learn(snap, pod, synthetic=shape.pods > 1)
        ok = take > 0
        if self.policy.per_node:
            out = np.where(ok, self._cached_scores(snap, mirror, pod)[nodes], -np.inf)
        else:
            rows = np.arange(snap.n)[nodes]
            out = np.full(len(rows), -np.inf)
            fit = ok.copy()
            fit[ok] = fits(mirror, pod, rows[ok])
            if fit.any():
                out[fit] = self.policy.score(mirror, pod, rows[fit])
        lost = ok & np.isneginf(out)  # a candidate of the filters that the policy's view refuses
        if lost.any():
            finite = out[ok & ~lost]
            out[lost] = (finite.min() if len(finite) else 0.0) - 1.0  # last, but still a candidate
        return out

    @staticmethod
    def normalize(raw: np.ndarray, *, valid: np.ndarray | None = None) -> np.ndarray:
        """Dense rank of the candidates' scores, scaled to 0..100 (equal scores, equal ranks).

        The policy's scores are lexicographic keys whose spread says nothing: a rank keeps the
        order and lets a weighted plugin (failover, topology) count the same against any step.
        """
        out = np.zeros(len(raw), dtype=np.float64)
        ok = np.isfinite(raw) if valid is None else (valid & np.isfinite(raw))
        if not ok.any():
            return out
        levels, rank = np.unique(raw[ok], return_inverse=True)
        if len(levels) > 1:
            out[ok] = rank * (100.0 / (len(levels) - 1))
        return out

    def choose_share(self, snapshot: Snapshot, row: int, shape: PodShape) -> int | None:
        """The policy's GPU on `row` for a share of `shape` (None: the policy has no opinion)."""
        mirror = self.mirror(snapshot)
        pod = self.request(None, shape)
        if not (mirror.gpu_free[row] >= pod.gpu_milli).any():
            return None
        if not self.prepared:
            self._learn(snapshot, pod)
        return int(self.policy.choose_gpus(mirror, row, pod)[0])


class PackingChooser:
    """Shares on the policy's GPU, whole GPUs by topology (see the module docstring)."""

    name = "packing-gpus"

    def __init__(self) -> None:
        self.topology = TopologyChooser()
        self.score: PackingScore | None = None
        self.refusals = self.topology.refusals

    def link(self, scores: Iterable[object]) -> None:
        """Called by `build_profile` with the profile's score plugins: find the packing score."""
        self.score = next((s for s in scores if isinstance(s, PackingScore)), None)

    def reset(self) -> None:
        self.topology.reset()

    def choose(
        self, snapshot: Snapshot, row: int, shape: PodShape, *, within: int | None = None
    ) -> GPUChoice | None:
        if not shape.shared or self.score is None:
            return self.topology.choose(snapshot, row, shape, within=within)
        gpu = self.score.choose_share(snapshot, row, shape)
        if gpu is not None and snapshot.share_fits(row, shape)[gpu]:
            return GPUChoice((gpu,))
        return share_choice(snapshot, row, shape)  # the policy's GPU is not of the class, or short of memory


class CPUStranding:
    """Score ``cpu-stranding`` (see the module docstring); no opinion on GPU pods."""

    name = "cpu-stranding"
    normalize = staticmethod(PackingScore.normalize)  # dense rank, as the packing score

    def __init__(self) -> None:
        self._ratio: tuple[int, int] = (-1, 0)  # snapshot version, milli-CPU per GPU (x1000)

    def cpu_per_gpu(self, snapshot: Snapshot) -> int:
        """Milli-CPU per whole GPU of the GPU reservations now held, as the gpuyard policy's r."""
        version, ratio = self._ratio
        if version != snapshot.version:
            cpu = gpu = 0
            for (cpu_milli, gpus, milli), count in snapshot.workload_counts().items():
                cpu += cpu_milli * count
                gpu += gpus * milli * count
            ratio = round(cpu * 1000 / gpu) if gpu else 0
            self._ratio = (snapshot.version, ratio)
        return ratio

    def score(
        self, state: CycleState, shape: PodShape, nodes: np.ndarray | slice, take: np.ndarray
    ) -> np.ndarray | None:
        if shape.gpus:
            return None
        snap = state.snapshot
        r = self.cpu_per_gpu(snap)
        if not r:
            return None
        gpu = snap.gpu_free_milli[nodes].sum(axis=1, dtype=np.int64)
        cpu = snap.cpu_free[nodes].astype(np.int64) * 1000
        need = take.astype(np.int64) * shape.cpu_milli * 1000
        before = np.maximum(0, gpu * r - cpu)
        after = np.maximum(0, gpu * r - (cpu - need))
        out: np.ndarray = (before - after).astype(np.float64)
        return out


def packing_score_factory(name: str, *, gpu_only: bool) -> Callable[[Mapping[str, Any]], PackingScore]:
    """The factory of score plugin `name` (`packing`, or `packing-gpu` with `gpu_only`): arguments
    `policy`, `coverage`, `seed`."""

    def make(args: Mapping[str, Any]) -> PackingScore:
        unknown = sorted(set(args) - {"policy", "coverage", "seed"})
        if unknown:
            raise ValueError(f"score plugin {name!r} takes policy, coverage and seed; got {unknown}")
        return PackingScore(
            policy=str(args.get("policy", "gpuyard")),
            coverage=float(args.get("coverage", 0.95)),
            seed=int(args.get("seed", 0)),
            gpu_only=gpu_only,
        )

    return make


PACKING_PROFILE = ProfileSpec(
    scores={"packing": 1},
    filters=tuple(f for f in DEFAULT_FILTERS if f != "gpu-node-reserve"),  # the policy weighs CPU
    fill="pack",
    chooser="packing-gpus",
    description="a GPU packing policy (plugin_args packing.policy: fgd, best-fit, ..., gpuyard)",
)
"""The `packing` profile (registered by `profiles.builtin_registry`)."""
