"""Topology-aware scheduling plugins: the GPU chooser, two scores and the flexible-shape split.

This is where the pure `gpuyard.devices` package meets the scheduler. The snapshot keeps, per
node row, the node's NodeTopology (with the node label `gpuyard.io/gpu-partition-policy`
applied) and the shared best-subset table (`Snapshot.tables[row]`, `Snapshot.table_id[N]`), both
refreshed only when the NodeTopology or the label changes. Per pod everything is a lookup:

* :class:`TopologyChooser` (`topology`, the default chooser of the `default` and `binpack`
  profiles): k whole GPUs by `subsets.pick_gpus(table, free_mask, k)` (greedy fallback above 8
  GPUs); with RDMA (`rdma/hca` requested, or `gpuyard.io/device-joint-allocate`) the GPUs and the
  NICs under their PCIe switches come from `subsets.select`, NICs held by other Reservations on
  the node not being free. A required scope that cannot be met refuses the node and says why
  (`refusals`), never a silent downgrade. Unhealthy GPUs are never in the free mask.
* :class:`TopologyScore` (`topology`): the ring bandwidth and locality of the set the table would
  hand out on each candidate node, so the node that can give an NVLink-connected set wins.
* :class:`FragmentationScore` (`topology-frag`): prefers the node where the pod *loses* the least
  of the node's future subsets (the sum of the table's own picks for every size, before minus
  after the pod, relative to a fully free node): a gradient, as FGD scores the change of
  fragmentation. A one-GPU pod then goes to a node that has few GPUs left rather than opening a
  whole one (which would lose its 8-, 4- and 2-GPU sets), so whole nodes stay whole for gangs.
* :func:`best_split`: for flexible one-GPU data-parallel workers that no single node can hold, the
  two-node split with the best modelled all-reduce bandwidth (`bandwidth.placement_bandwidth`).

Scores work per *distinct table* over NumPy arrays of free masks, never per node in Python.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from gpuyard.devices.bandwidth import NodeShare, placement_bandwidth
from gpuyard.devices.subsets import greedy_pick, indices_of, pick, pick_gpus, pick_nics, select
from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.gangs.requests import GPU_MILLI, PodShape
from gpuyard.scheduler.placement.choosing import LowestIndexChooser
from gpuyard.scheduler.placement.framework import CycleState, GPUChoice

__all__ = [
    "FragmentationScore",
    "Split",
    "TopologyChooser",
    "TopologyScore",
    "best_split",
    "free_masks",
    "row_free_mask",
]

_BITS: dict[int, np.ndarray] = {}
_MAX_REFUSALS = 8


def _bits(g: int) -> np.ndarray:
    bits = _BITS.get(g)
    if bits is None:
        bits = _BITS[g] = (1 << np.arange(g, dtype=np.int64)).astype(np.int64)
    return bits


def row_free_mask(snapshot: Snapshot, row: int, gpu_class: str | None) -> int:
    """Bit i set when GPU i of `row` is idle, healthy and of the class."""
    ok = (snapshot.gpu_free_milli[row] == GPU_MILLI) & snapshot.gpu_healthy[row]
    if gpu_class is not None:
        cm = snapshot.class_mask(gpu_class)
        if cm is None:
            return 0
        ok = ok & cm.gpu[row]
    return int(ok.astype(np.int64) @ _bits(snapshot.g))


def free_masks(snapshot: Snapshot, nodes: np.ndarray | slice, gpu_class: str | None) -> np.ndarray:
    """int64 free masks (idle, healthy, of the class) of the rows `nodes`, vectorised."""
    ok = (snapshot.gpu_free_milli[nodes] == GPU_MILLI) & snapshot.gpu_healthy[nodes]
    if gpu_class is not None:
        cm = snapshot.class_mask(gpu_class)
        if cm is None:
            return np.zeros(ok.shape[0], dtype=np.int64)
        ok = ok & cm.gpu[nodes]
    result: np.ndarray = ok.astype(np.int64) @ _bits(snapshot.g)
    return result


def _free_nics(snapshot: Snapshot, row: int) -> list[str]:
    topo = snapshot.topologies[row]
    if topo is None:
        return []
    held = snapshot.nics_used[row]
    return [n.name for n in topo.spec.nics if n.name not in held]


class TopologyChooser:
    """Best GPU subset by table lookup (greedy above 8 GPUs), with NICs for RDMA pods."""

    name = "topology"

    def __init__(self) -> None:
        self._plain = LowestIndexChooser()
        self.refusals: dict[PodShape, dict[str, str]] = {}
        """Per shape: node -> why it could not serve a pod although its GPU count fits."""

    def reset(self) -> None:
        """Forget refusals (called by `place()` at the start of every attempt)."""
        self.refusals.clear()

    def _refuse(self, shape: PodShape, node: str, why: str) -> None:
        seen = self.refusals.setdefault(shape, {})
        if len(seen) < _MAX_REFUSALS:
            seen[node] = why

    def choose(
        self, snapshot: Snapshot, row: int, shape: PodShape, *, within: int | None = None
    ) -> GPUChoice | None:
        """GPUs (and NICs) for one pod of `shape` on `row`; `within` restricts the GPUs to a mask."""
        if not shape.gpus or shape.shared:
            return self._plain.choose(snapshot, row, shape)
        topo = snapshot.topologies[row]
        node = snapshot.names[row] or ""
        if topo is None:
            if shape.nic_scope is not None:
                self._refuse(shape, node, f"requiredScope {shape.nic_scope}: the node has no device topology")
                return None
            if within is not None:
                gpus = indices_of(row_free_mask(snapshot, row, shape.gpu_class) & within)[: shape.gpus]
                return GPUChoice(gpus) if len(gpus) == shape.gpus else None
            return self._plain.choose(snapshot, row, shape)
        free = row_free_mask(snapshot, row, shape.gpu_class)
        if within is not None:
            free &= within
        table = snapshot.tables[row]
        k = shape.gpus
        if not shape.rdma:
            picked = pick_gpus(table, free, k) if table is not None else greedy_pick(topo, free, k)
            if picked is None:
                self._why_not(shape, node, topo.spec.partition_policy, free)
                return None
            return GPUChoice(picked)
        sel = select(
            topo,
            free,
            k,
            rdma=True,
            nic_scope=shape.nic_scope,
            free_nics=_free_nics(snapshot, row),
            table=table,
        )
        if sel is None:
            if (pick_gpus(table, free, k) if table is not None else greedy_pick(topo, free, k)) is None:
                self._why_not(shape, node, topo.spec.partition_policy, free)
            else:
                unit = "PCIe switch" if shape.nic_scope == "SamePCIe" else "NUMA node"
                self._refuse(
                    shape,
                    node,
                    f"requiredScope {shape.nic_scope}: no {k} free GPUs with a free RDMA NIC on every {unit} they span",
                )
            return None
        return GPUChoice(sel.gpus, sel.nics)

    def _why_not(self, shape: PodShape, node: str, policy: str | None, free: int) -> None:
        if policy == "Honor":
            self._refuse(
                shape,
                node,
                f"GPU partition policy Honor: no allowed {shape.gpus}-GPU partition among free GPUs "
                f"{list(indices_of(free))} (allowed sizes 1, 2, 4, 8)",
            )


def _table_groups(snapshot: Snapshot, nodes: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
    ids = snapshot.table_id[nodes]
    return ids, np.unique(ids[ids >= 0])


class TopologyScore:
    """Ring bandwidth (log scale) and locality of the set each candidate node would hand out."""

    name = "topology"

    def score(
        self, state: CycleState, shape: PodShape, nodes: np.ndarray | slice, take: np.ndarray
    ) -> np.ndarray | None:
        k = shape.gpus
        if k < 2 or shape.shared:
            return None
        snap = state.snapshot
        ids, tables = _table_groups(snap, nodes)
        if not len(tables):
            return None
        masks = free_masks(snap, nodes, shape.gpu_class)
        out = np.zeros(len(ids), dtype=np.float64)
        for tid in tables.tolist():
            table = snap.table_list[tid]
            sel = ids == tid
            if k > table.n:
                continue
            m = masks[sel] & ((1 << table.n) - 1)
            bw = table.bandwidth[m, k].astype(np.float64)
            loc = table.locality[m, k].astype(np.float64)
            out[sel] = np.where(bw > 0, 10.0 * np.log2(np.maximum(bw, 1.0)) + (4.0 - loc), 0.0)
        return out


class FragmentationScore:
    """Prefer the node that loses the least of its future subsets to this pod (see the module doc).

    The score is the change, not the level: scoring what is left (the level) ranks a fully free
    node best for every pod, so one-GPU pods opened whole nodes one after another and the gangs
    that came next found no node with room (`bench/topology_quality.py`).
    """

    name = "topology-frag"

    def __init__(self) -> None:
        self._full: dict[int, float] = {}

    def _future(self, table: Any, rest: np.ndarray) -> np.ndarray:
        total = np.zeros(len(rest), dtype=np.float64)
        for size in range(2, table.n + 1):
            bw = table.bandwidth[rest, size].astype(np.float64)
            total += np.where(np.isfinite(bw), bw, 0.0)
        return total

    def score(
        self, state: CycleState, shape: PodShape, nodes: np.ndarray | slice, take: np.ndarray
    ) -> np.ndarray | None:
        k = shape.gpus
        if not k or shape.shared:
            return None
        snap = state.snapshot
        ids, tables = _table_groups(snap, nodes)
        if not len(tables):
            return None
        masks = free_masks(snap, nodes, shape.gpu_class)
        out = np.zeros(len(ids), dtype=np.float64)
        for tid in tables.tolist():
            table = snap.table_list[tid]
            if k > table.n:
                continue
            sel = ids == tid
            m = masks[sel] & ((1 << table.n) - 1)
            chosen = table.choice[m, k].astype(np.int64)
            rest = np.where(chosen > 0, m ^ chosen, 0)
            full = self._full.get(id(table))
            if full is None:
                full = self._full[id(table)] = (
                    float(self._future(table, np.array([(1 << table.n) - 1]))[0]) or 1.0
                )
            out[sel] = (self._future(table, rest) - self._future(table, m)) / full
        return out


# --- flexible shapes ---------------------------------------------------------------------------

Split = list[tuple[int, int]]
"""(row, pods) per node of a split."""

_SPLIT_CANDIDATES = 12


def _node_share(snapshot: Snapshot, row: int, shape: PodShape, count: int) -> NodeShare | None:
    topo = snapshot.topologies[row]
    if topo is None:
        return None
    free = row_free_mask(snapshot, row, shape.gpu_class)
    table = snapshot.tables[row]
    if table is not None:
        mask = pick(table, free, count)
        if mask is None:
            return None
        gpus, intra = indices_of(mask), float(table.ring[mask])
    else:
        picked = greedy_pick(topo, free, count)
        if picked is None:
            return None
        gpus, intra = picked, None
    nics: tuple[str, ...] = ()
    if shape.rdma:
        got = pick_nics(topo, gpus, shape.nic_scope, free_nics=_free_nics(snapshot, row))
        if got is None:
            return None
        nics = tuple(got)
    return NodeShare(topo, tuple(gpus), nics, intra_gbps=intra)


def best_split(
    snapshot: Snapshot,
    shape: PodShape,
    *,
    rows: np.ndarray,
    caps: np.ndarray,
    scores: np.ndarray,
    want: int,
) -> tuple[Split, float] | None:
    """The two-node split of `want` one-GPU pods with the best modelled all-reduce bandwidth.

    Candidates are the `_SPLIT_CANDIDATES` rows that can take the most (only rows with a
    NodeTopology); every pair and every split between them is evaluated with table lookups and
    `placement_bandwidth`. Ties: the split that keeps the most pods together (7+1 over 4+4: fewer
    ring hops leave a node), then the better summed node score. None when no pair can hold it.
    """
    ranked = np.lexsort((-scores, -caps))[:_SPLIT_CANDIDATES]
    order = [int(i) for i in ranked if caps[i] > 0 and snapshot.topologies[int(rows[i])] is not None]
    shares: dict[tuple[int, int], NodeShare | None] = {}

    def share(i: int, count: int) -> NodeShare | None:
        key = (i, count)
        if key not in shares:
            shares[key] = _node_share(snapshot, int(rows[i]), shape, count)
        return shares[key]

    best: tuple[tuple[float, int, float], Split, float] | None = None
    for a, b in itertools.combinations(order, 2):
        ca, cb = int(caps[a]), int(caps[b])
        if ca + cb < want:
            continue
        for t in range(max(1, want - cb), min(ca, want - 1) + 1):
            sa, sb = share(a, t), share(b, want - t)
            if sa is None or sb is None:
                continue
            gbps = placement_bandwidth([sa, sb]).bus_gbps
            key = (round(gbps, 6), max(t, want - t), float(scores[a] + scores[b]))
            if best is None or key > best[0]:
                best = (key, [(int(rows[a]), t), (int(rows[b]), want - t)], gbps)
    if best is None:
        return None
    split = sorted(best[1], key=lambda rc: -rc[1])
    return split, best[2]


def colocated_set(snapshot: Snapshot, row: int, shape: PodShape, count: int) -> int | None:
    """The mask of `count` GPUs on `row` that co-located one-GPU workers of one job share."""
    topo = snapshot.topologies[row]
    free = row_free_mask(snapshot, row, shape.gpu_class)
    if topo is None:
        gpus = indices_of(free)[:count]
    else:
        table = snapshot.tables[row]
        if table is not None:
            return pick(table, free, count)
        picked = greedy_pick(topo, free, count)
        if picked is None:
            return None
        gpus = picked
    if len(gpus) < count:
        return None
    out = 0
    for g in gpus:
        out |= 1 << g
    return out
