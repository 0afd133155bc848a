"""GPU fragmentation as FGD measures it, vectorised over nodes and cached per node state.

FGD ("Beware of Fragmentation", USENIX ATC'23) scores a placement by how much it reduces the
expected GPU fragmentation of the node, measured against the workload's *typical pods*:

* **Typical pods** M: the pod list grouped by request shape (CPU, GPU count, milli-GPU per GPU,
  allowed models), most popular first, kept until they cover 95% of the pods; their frequencies
  renormalised to sum to 1.
* **Node fragmentation** F_n = sum over m of p_m * f_n(m), with G the node's free GPU milli:
  f = free milli on GPUs whose free milli is below m's (those cannot serve m) when m fits on the
  node (enough such GPUs, enough free CPU, model allowed), and f = G otherwise (CPU-only m included).

How it is computed here (exact, integer, fast):

* p_m = count_m / C with C the total count of the kept shapes, so ``C * F_n`` is an integer and a
  "no change" placement gives a delta of exactly 0 (FGD truncates sigmoid scores to integers, and
  a float rounding error at delta 0 would turn a 50 into a 49).
* F depends on a GPU only through "is its free milli >= t" for the few distinct milli values t of
  the typical GPU pods. Per node and threshold keep ``cnt[n, t]`` (GPUs with free >= t) and
  ``usable[n, t]`` (their free milli). Then ``C * F_n = C * G_n - sum_t usable[n, t] * W[t, model,
  cnt[n, t], cpu bucket]`` where the table W holds the summed counts of the typical pods with milli
  t that fit (their GPU count <= cnt, their CPU <= the node's free CPU, model allowed).
* Those per-node rows are cached and refreshed only for nodes whose arrays changed since the last
  call (one row per placed pod), so the fragmentation of a node is memoised per node state.
  Evaluating "the node after placing pod p" for every candidate node (and, for a shared pod,
  every distinct GPU on it) is a handful of NumPy operations on a (candidates x thresholds) array.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from gpuyard.scheduler.placement.packing.state import GPU_MILLI, ClusterState, PodRequest

__all__ = ["FragmentationModel", "TypicalPods", "TypicalShape", "fgd_scores"]


@dataclass(frozen=True, slots=True)
class TypicalShape:
    """One typical pod shape and how many pods of the workload have it."""

    cpu_milli: int
    num_gpu: int
    gpu_milli: int
    allowed_models: tuple[int, ...] | None
    count: int


class TypicalPods:
    """The workload's most popular request shapes, covering ``coverage`` of its pods (FGD step 1)."""

    def __init__(self, shapes: Iterable[TypicalShape]) -> None:
        self.shapes = list(shapes)
        self.total = sum(s.count for s in self.shapes)
        if self.total <= 0:
            raise ValueError("typical pods need at least one pod")

    @classmethod
    def from_workload(cls, workload: Iterable[PodRequest], *, coverage: float = 0.95) -> TypicalPods:
        counts = Counter(p.shape for p in workload)
        n = sum(counts.values())
        if n == 0:
            raise ValueError("an empty workload has no typical pods")

        # Most popular first; equal counts by larger shape first (the simulator's order:
        # sort.Reverse over (count, cpu, milli, num_gpu, model)).
        def order(
            item: tuple[tuple[int, int, int, tuple[int, ...] | None], int],
        ) -> tuple[int, int, int, int, tuple[int, ...]]:
            (cpu, num, milli, models), count = item
            return (count, cpu, milli, num, models or ())

        kept: list[TypicalShape] = []
        covered = 0
        for (cpu, num, milli, models), count in sorted(counts.items(), key=order, reverse=True):
            if covered >= coverage * n:
                break
            kept.append(TypicalShape(cpu, num, milli, models, count))
            covered += count
        return cls(kept)

    @property
    def probabilities(self) -> np.ndarray:
        return np.array([s.count for s in self.shapes], dtype=np.float64) / self.total


class FragmentationModel:
    """Per-node fragmentation F_n for one set of typical pods (see the module docstring)."""

    def __init__(self, typical: TypicalPods) -> None:
        self.typical = typical
        self.C = typical.total
        gpu_shapes = [s for s in typical.shapes if s.num_gpu > 0 and s.gpu_milli > 0]
        self.thresholds = np.array(sorted({s.gpu_milli for s in gpu_shapes}) or [GPU_MILLI], dtype=np.int64)
        self.cpu_thresholds = np.array(sorted({s.cpu_milli for s in gpu_shapes}), dtype=np.int64)
        self._gpu_shapes = gpu_shapes
        self._table_key: tuple[tuple[str, ...], int] | None = None
        self._state_key: tuple[int, int] | None = None

    # ------------------------------------------------------------------ table W
    def _build_table(self, n_models: int, max_gpus: int) -> None:
        T, NB = len(self.thresholds), len(self.cpu_thresholds) + 1
        M1, G1 = (
            n_models + 1,
            max_gpus + 1,
        )  # slot n_models (model -1): no known model; unconstrained pods fit
        W = np.zeros((T, M1, G1, NB), dtype=np.int64)
        t_index = {int(t): i for i, t in enumerate(self.thresholds)}
        for s in self._gpu_shapes:
            ti = t_index[s.gpu_milli]
            cpu_rank = int(np.searchsorted(self.cpu_thresholds, s.cpu_milli))  # fits when bucket > rank
            models = range(M1) if s.allowed_models is None else [m for m in s.allowed_models if m < n_models]
            for m in models:
                W[ti, m, min(s.num_gpu, G1) :, cpu_rank + 1 :] += s.count
        self._W = W.ravel()
        self._strides = (M1 * G1 * NB, G1 * NB, NB)
        self._t_base = np.arange(T, dtype=np.int64) * self._strides[0]
        self._M1, self._G1 = M1, G1

    # ------------------------------------------------------------------ cache
    def sync(
        self, state: ClusterState, *, rows: np.ndarray | None = None, among: np.ndarray | None = None
    ) -> None:
        """Refresh the cached rows of nodes whose free capacity changed since the last call.

        With ``rows`` the caller vouches that only those nodes may have changed, which skips the
        comparison of every node's arrays (the simulator knows which node it just filled). With
        ``among`` only those nodes are compared and refreshed (a caller that reads no others).
        """
        if self._prepare(state):
            rows = among = None  # a fresh cache: every row must be computed
        if rows is None and among is not None:
            among = np.asarray(among, dtype=np.int64)
            dirty = (state.cpu_free[among] != self._cpu[among]) | (
                state.gpu_model[among] != self._model[among]
            )
            dirty |= (state.gpu_free[among] != self._gpu[among]).any(axis=1)
            if not dirty.any():
                return
            rows = among[dirty]
        if rows is None:
            dirty = (state.cpu_free != self._cpu) | (state.gpu_model != self._model)
            gpu, cached = state.gpu_free, self._gpu
            if gpu.shape[1] % 2 == 0 and gpu.flags.c_contiguous:
                gpu, cached = gpu.view(np.int64), cached.view(np.int64)  # compare two GPUs at a time
            diff = gpu != cached
            for col in range(diff.shape[1]):
                dirty |= diff[:, col]
            if not dirty.any():
                return
            rows = np.flatnonzero(dirty)
        self._refresh(state, np.asarray(rows, dtype=np.int64))

    def _prepare(self, state: ClusterState) -> bool:
        """Size the table and the per-node cache for ``state``; True if the cache was reset."""
        key = (tuple(state.model_names), state.max_gpus)
        if self._table_key != key:
            self._build_table(len(state.model_names), state.max_gpus)
            self._table_key = key
            self._state_key = None
        skey = (state.n_nodes, state.max_gpus)
        if self._state_key != skey:
            n = state.n_nodes
            self._cpu = np.full(n, -1, dtype=np.int64)
            self._gpu = np.full((n, state.max_gpus), -1, dtype=np.int32)
            self._model = np.full(n, -2, dtype=np.int16)
            T = len(self.thresholds)
            self.cnt = np.zeros((n, T), dtype=np.int64)
            self.usable = np.zeros((n, T), dtype=np.int64)
            self.gsum = np.zeros(n, dtype=np.int64)
            self.frag_int = np.zeros(n, dtype=np.int64)
            self._state_key = skey
            return True
        return False

    def _refresh(self, state: ClusterState, d: np.ndarray) -> None:
        V = state.gpu_free[d].astype(np.int64)
        ge = V[:, :, None] >= self.thresholds[None, None, :]
        cnt = ge.sum(axis=1)
        usable = (V[:, :, None] * ge).sum(axis=1)
        gsum = V.sum(axis=1)
        cpu = state.cpu_free[d]
        model = state.gpu_model[d]
        self.cnt[d], self.usable[d], self.gsum[d] = cnt, usable, gsum
        self.frag_int[d] = self._evaluate(model=model, cpu=cpu, gsum=gsum, cnt=cnt, usable=usable)
        self._cpu[d], self._gpu[d], self._model[d] = cpu, state.gpu_free[d], model

    def _evaluate(
        self, *, model: np.ndarray, cpu: np.ndarray, gsum: np.ndarray, cnt: np.ndarray, usable: np.ndarray
    ) -> np.ndarray:
        """C * F for K node states given as (model[K], cpu[K], gsum[K], cnt[K,T], usable[K,T])."""
        bucket = np.searchsorted(self.cpu_thresholds, cpu, side="right")
        _, s1, s2 = self._strides
        m = np.where(model < 0, self._M1 - 1, model).astype(np.int64)
        row = (m * s1 + bucket)[:, None]
        idx = self._t_base[None, :] + row + np.minimum(cnt, self._G1 - 1) * s2
        result: np.ndarray = self.C * gsum - (usable * self._W[idx]).sum(axis=1)
        return result

    def is_current(self, state: ClusterState, node: int) -> bool:
        """True if the cached row of ``node`` still describes it (nothing changed since the last sync)."""
        return (
            self._state_key == (state.n_nodes, state.max_gpus)
            and self._cpu[node] == state.cpu_free[node]
            and self._model[node] == state.gpu_model[node]
            and bool(np.array_equal(self._gpu[node], state.gpu_free[node]))
        )

    # ------------------------------------------------------------------ queries
    def node_frag(self, state: ClusterState) -> np.ndarray:
        """float[N]: F_n of every node now, in milli-GPU."""
        self.sync(state)
        return self.frag_int / self.C

    def cluster_frag(self, state: ClusterState) -> float:
        """Sum of F_n over the cluster, in milli-GPU."""
        self.sync(state)
        return float(self.frag_int.sum()) / self.C

    def frag_after(
        self, state: ClusterState, *, pod: PodRequest, nodes: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """C * F of the nodes in ``nodes`` after placing ``pod`` there, as ``(rows, gpus, frag_int)``.

        Entry i says: placing the pod on ``nodes[rows[i]]`` (on GPU ``gpus[i]`` for a shared pod)
        leaves that node with ``C * F = frag_int[i]``. Rows come in ascending order. A shared pod
        gets one entry per node and distinct free value that fits, on the lowest-index GPU with
        that value (GPUs with equal free milli give the same node state, and "first best GPU" only
        needs the representatives). Other pods get one entry per node with GPU 0 as a placeholder
        (whole-GPU pods take the first fully free GPUs, CPU-only pods take none).
        """
        nodes = np.asarray(nodes, dtype=np.int64)
        self.sync(state, among=nodes)
        cpu2 = state.cpu_free[nodes] - pod.cpu_milli
        model = state.gpu_model[nodes]
        if not pod.shared:
            k = pod.num_gpu
            after = self._evaluate(
                model=model,
                cpu=cpu2,
                gsum=self.gsum[nodes] - k * GPU_MILLI,
                cnt=self.cnt[nodes] - k,
                usable=self.usable[nodes] - k * GPU_MILLI,
            )
            rows = np.arange(len(nodes))
            return rows, np.zeros(len(nodes), dtype=np.int64), after
        V = state.gpu_free[nodes].astype(np.int64)
        # A stable sort puts equal free values together with the lowest GPU index first.
        order = np.argsort(V, axis=1, kind="stable")
        Vs = np.take_along_axis(V, order, axis=1)
        rep = Vs >= pod.gpu_milli
        rep[:, 1:] &= Vs[:, 1:] != Vs[:, :-1]
        r, j = np.nonzero(rep)
        g = order[r, j]
        v = Vs[r, j]
        v2 = v - pod.gpu_milli
        t = self.thresholds[None, :]
        ge1 = v[:, None] >= t
        ge2 = v2[:, None] >= t
        n = nodes[r]
        cnt2 = self.cnt[n] - ge1 + ge2
        usable2 = self.usable[n] - v[:, None] * ge1 + v2[:, None] * ge2
        return (
            r,
            g,
            self._evaluate(
                model=model[r], cpu=cpu2[r], gsum=self.gsum[n] - pod.gpu_milli, cnt=cnt2, usable=usable2
            ),
        )


def fgd_scores(
    model: FragmentationModel, state: ClusterState, *, pod: PodRequest, nodes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FGD's per-node score, best GPU and exact fragmentation decrease, for nodes the pod fits on.

    Score = int(sigmoid(decrease / 1000) * 100) as the simulator computes it (truncated), where
    decrease = F_n(before) - F_n(after) in milli-GPU; for a shared pod the best GPU is the first
    (lowest index) with the highest score. Returns ``(score[K], gpu[K], decrease_int[K])``, int64,
    with ``decrease_int = C * decrease`` (exact). Every node must fit the pod (see `fits`).
    """
    nodes = np.asarray(nodes, dtype=np.int64)
    if len(nodes) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    rows, gpus, after = model.frag_after(state, pod=pod, nodes=nodes)
    dec = model.frag_int[nodes][rows] - after
    score = np.floor(100.0 / (1.0 + np.exp(-dec / (model.C * 1000.0)))).astype(np.int64)
    if not pod.shared:
        return score, gpus, dec
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]]) if len(rows) else rows
    if len(starts) != len(nodes):
        raise ValueError(f"pod {pod.name} does not fit on every node given")
    # Per node: highest score, then lowest GPU index.
    width = state.max_gpus
    key = score * width + (width - 1 - gpus)
    best = np.maximum.reduceat(key, starts)
    pick = key == np.repeat(best, np.diff(np.r_[starts, len(key)]))
    return best // width, width - 1 - best % width, dec[pick]
