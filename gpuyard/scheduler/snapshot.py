"""The scheduler's snapshot: free capacity of every node as NumPy arrays, kept current incrementally.

One row per node, one column per GPU slot (`G` = the most GPUs any node has; missing GPUs are
padding that behaves as fully used). The arrays follow the packing policies' layout
(`gpuyard.scheduler.packing.state`): `cpu_free[N]` milli-CPU, `mem_free[N]` MiB,
`gpu_free_milli[N, G]` free thousandths of each GPU (1000 = idle), `gpu_mem_free[N, G]` free
GPU memory in MiB (whole-GPU pods take all of it, shares their memory), `gpu_model[N]`.

GPU sharing: a GPU serves one whole-GPU pod or several shares, never both — a whole-GPU pod
needs `gpu_free_milli == 1000` (so no share on it) and takes all 1000; a share takes its milli
and memory, so the GPU is no longer idle for whole-GPU pods until every share has left.

Free = allocatable − the node's Reservations. The running loop feeds changes in
(`refresh_node`, `upsert_reservation`, `remove_reservation`, `set_classes`) for the objects the
store watch reported since the last cycle; each touches one row. Derived masks — per distinct
node-selector/affinity, per toleration set, per ResourceClass — are computed once over all nodes,
cached, and patched row by row when a node changes, so filters are vectorised array operations
and never a Python loop over nodes per pod.

`place()` mutates the arrays while it tries a placement and undoes every change before it
returns (`apply`/`unapply` of :class:`Alloc`); the loop then records the chosen placement for
good through `upsert_reservation` (the "assume").

The module holds the arrays, building and node rows (:class:`Snapshot`); the reservation ledger and
`apply`/`unapply` are in `allocations.py` (:class:`Alloc`, :class:`SnapshotLedger`), the cached
node masks, ResourceClass masks and GPU-share helpers in `masks.py` (:class:`ClassMask`,
:class:`SnapshotMasks`); `Snapshot` inherits both, so every method is on the snapshot itself.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import TYPE_CHECKING

import numpy as np

from gpuyard.apis.core import GPU_RESOURCE, Node
from gpuyard.apis.devicematching import DeviceInfo, gpu_devices
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.quantity import to_int, to_milli
from gpuyard.apis.resourceclasses import Matcher, ResourceClass
from gpuyard.apis.scheduling import Reservation
from gpuyard.devices.bandwidth import model_key
from gpuyard.devices.presets import H100_PARTITIONS
from gpuyard.devices.subsets import MAX_TABLE_GPUS, SubsetTable, table_for
from gpuyard.scheduler.allocations import Alloc, SnapshotLedger, _Entry
from gpuyard.scheduler.gang_requests import GPU_MILLI, MIB
from gpuyard.scheduler.masks import ClassMask, SnapshotMasks

if TYPE_CHECKING:
    from gpuyard.scheduler.packing.state import ClusterState

__all__ = ["LABEL_BLOCK", "LABEL_PARTITION_POLICY", "LABEL_SPINE", "Alloc", "ClassMask", "Snapshot"]

LABEL_BLOCK = "topology.gpuyard.io/block"
LABEL_SPINE = "topology.gpuyard.io/spine"
LABEL_PARTITION_POLICY = "gpuyard.io/gpu-partition-policy"
_PARTITION_MODELS = ("h100", "h800", "h20")
_UNLIMITED_PODS = 1 << 30


class Snapshot(SnapshotLedger, SnapshotMasks):
    """Per-node free capacity and static facts as flat arrays; see the module docstring."""

    block_label = LABEL_BLOCK
    """Node label naming the network block (the tightest level); set per instance or class-wide."""
    spine_label = LABEL_SPINE
    """Node label naming the spine (the level above blocks)."""

    def __init__(
        self, *, port_range: tuple[int, int] = (20000, 30000), rows: int = 16, gpu_width: int = 8
    ) -> None:
        lo, hi = port_range
        if lo > hi:
            raise ValueError(f"host port range {lo}-{hi} is empty")
        self.port_lo, self.port_hi = lo, hi
        self.port_count = hi - lo + 1
        self.names: list[str | None] = []
        self.index: dict[str, int] = {}
        self._free_rows: list[int] = []
        self.node_rv: dict[str, int] = {}
        self.labels: list[Mapping[str, str]] = []
        self.taints: list[tuple[tuple[str, str | None, str], ...]] = []
        self.devices: list[list[DeviceInfo]] = []
        self.ports_used: list[dict[int, int]] = []  # per row: host port -> reservations using it
        self.topologies: list[NodeTopology | None] = []  # per row, with the node's partition policy applied
        self.tables: list[SubsetTable | None] = []  # per row: the shared best-subset table (<= 8 GPUs)
        self._topo_keys: list[tuple | None] = []
        self.nics_used: list[dict[str, int]] = []  # per row: NIC name -> reservations holding it
        self.table_list: list[SubsetTable] = []
        self._table_index: dict[str, int] = {}
        self.spine_names: list[str] = []
        self._spine_index: dict[str, int] = {}
        self.model_names: list[str] = []
        self._model_index: dict[str, int] = {}
        self.block_names: list[str] = []
        self._block_index: dict[str, int] = {}
        self.ext_names: list[str] = []
        self._ext_index: dict[str, int] = {}
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._by_node: dict[str, set[tuple[str, str]]] = {}
        self._by_group: dict[tuple[str, str], dict[str, _Entry]] = {}
        self._matchers: dict[str, tuple[int, Matcher]] = {}
        self._class_masks: dict[str, ClassMask] = {}
        self._selector_masks: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self._taint_masks: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self._shape_counts: dict[tuple[int, int, int], int] = {}  # GPU reservations per (cpu, GPUs, milli)
        self.epoch = 0
        """Bumped whenever capacity may have grown (node added or changed, reservation removed,
        classes changed): jobs that did not fit are worth another try."""
        self.version = 0
        """Bumped on every change."""
        self.static_version = 0
        """Bumped when node facts or classes change (caches of static filter masks)."""
        self._alloc_arrays(max(rows, 1), max(gpu_width, 1))

    # --- arrays ------------------------------------------------------------------------------

    def _alloc_arrays(self, n: int, g: int) -> None:
        self.n, self.g = n, g
        self.alive = np.zeros(n, dtype=bool)
        self.ready = np.zeros(n, dtype=bool)
        self.schedulable = np.zeros(n, dtype=bool)
        self.cpu_alloc = np.zeros(n, dtype=np.int64)
        self.cpu_free = np.zeros(n, dtype=np.int64)
        self.mem_alloc = np.zeros(n, dtype=np.int64)
        self.mem_free = np.zeros(n, dtype=np.int64)
        self.pods_alloc = np.zeros(n, dtype=np.int64)
        self.pods_free = np.zeros(n, dtype=np.int64)
        self.ext_alloc = np.zeros((n, len(self.ext_names)), dtype=np.int64)
        self.ext_free = np.zeros((n, len(self.ext_names)), dtype=np.int64)
        self.gpu_count = np.zeros(n, dtype=np.int16)
        self.gpu_exists = np.zeros((n, g), dtype=bool)
        self.gpu_healthy = np.zeros((n, g), dtype=bool)
        self.gpu_free_milli = np.zeros((n, g), dtype=np.int32)
        self.gpu_mem_mib = np.zeros((n, g), dtype=np.int32)
        self.gpu_mem_free = np.zeros((n, g), dtype=np.int64)
        self.gpu_whole_free = np.zeros(n, dtype=np.int32)
        self.gpu_healthy_count = np.zeros(n, dtype=np.int32)
        self.gpu_healthy_inv = np.zeros(n, dtype=np.float64)  # 1 / healthy GPUs (0 without): binpack scores
        self.gpu_model = np.full(n, -1, dtype=np.int16)
        # GPU pods per kind: column 0 shares, column k pods of k whole GPUs
        self.gpu_kinds = np.zeros((n, g + 1), dtype=np.int32)
        self.row_version = np.zeros(n, dtype=np.int64)  # bumped whenever a row's free capacity changes
        self.block = np.full(n, -1, dtype=np.int32)
        self.spine = np.full(n, -1, dtype=np.int32)
        self.table_id = np.full(n, -1, dtype=np.int32)
        self.ports_used_count = np.zeros(n, dtype=np.int32)
        self.port_cursor = np.full(n, self.port_lo - 1, dtype=np.int64)
        self.tainted = np.zeros(n, dtype=bool)

    def _grow(self, n: int, g: int) -> None:
        """Make room for `n` rows and `g` GPU slots, keeping every value."""
        old = {k: getattr(self, k) for k in _ARRAYS}
        old_n, old_g = self.n, self.g
        self._alloc_arrays(max(n, old_n), max(g, old_g))
        for k, arr in old.items():
            new = getattr(self, k)
            if arr.ndim == 1:
                new[:old_n] = arr
            elif k.startswith("ext") or k == "gpu_kinds":
                new[:old_n, : arr.shape[1]] = arr
            else:
                new[:old_n, :old_g] = arr
        for cache in (self._selector_masks, self._taint_masks):
            for key, mask in cache.items():
                grown = np.zeros(self.n, dtype=bool)
                grown[:old_n] = mask
                cache[key] = grown
        for name, cm in self._class_masks.items():
            gpu = np.zeros((self.n, self.g), dtype=bool)
            gpu[:old_n, :old_g] = cm.gpu
            self._class_masks[name] = ClassMask(gpu, gpu.any(axis=1), gpu.sum(axis=1))

    def _ext_column(self, name: str) -> int:
        col = self._ext_index.get(name)
        if col is None:
            col = len(self.ext_names)
            self.ext_names.append(name)
            self._ext_index[name] = col
            self.ext_alloc = np.concatenate([self.ext_alloc, np.zeros((self.n, 1), np.int64)], axis=1)
            self.ext_free = np.concatenate([self.ext_free, np.zeros((self.n, 1), np.int64)], axis=1)
        return col

    def ext_col(self, name: str) -> int | None:
        return self._ext_index.get(name)

    # --- building ----------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        *,
        nodes: Iterable[Node],
        reservations: Iterable[Reservation] = (),
        topologies: Mapping[str, NodeTopology] | None = None,
        classes: Iterable[ResourceClass] = (),
        port_range: tuple[int, int] = (20000, 30000),
    ) -> Snapshot:
        """A snapshot of these nodes and reservations (used at start-up, after a re-list, in tests)."""
        node_list = list(nodes)
        width = 1
        for node in node_list:
            width = max(width, to_int(node.status.allocatable.get(GPU_RESOURCE, Decimal(0)) // 1))
        snap = cls(port_range=port_range, rows=len(node_list), gpu_width=width)
        snap.set_classes(classes)
        topologies = topologies or {}
        for node in node_list:
            snap.refresh_node(node, topologies.get(node.metadata.name))
        for res in reservations:
            snap.upsert_reservation(res, advance_cursor=False)
        for row, used in enumerate(snap.ports_used):
            if used:
                snap.port_cursor[row] = max(used)
        return snap

    # --- nodes -------------------------------------------------------------------------------

    def refresh_node(self, node: Node, topology: NodeTopology | None = None) -> int:
        """Load or reload one node's row (static facts and free capacity); return the row."""
        name = node.metadata.name
        row = self.index.get(name)
        if row is None:
            if self._free_rows:
                row = self._free_rows.pop()
            else:
                row = len(self.names)
                if row >= self.n:
                    self._grow(max(2 * self.n, row + 1), self.g)
            if row == len(self.names):
                self.names.append(name)
                self.labels.append({})
                self.taints.append(())
                self.devices.append([])
                self.ports_used.append({})
                self.topologies.append(None)
                self.tables.append(None)
                self._topo_keys.append(None)
                self.nics_used.append({})
            self.names[row] = name
            self.index[name] = row
            self.port_cursor[row] = self.port_lo - 1
        self.node_rv[name] = node.resource_version
        alloc = node.status.allocatable
        devices = gpu_devices(node, topology)
        if len(devices) > self.g:
            self._grow(self.n, len(devices))
        self.labels[row] = node.metadata.labels
        self.taints[row] = tuple(
            (t.key, t.value, t.effect) for t in node.spec.taints if t.effect in ("NoSchedule", "NoExecute")
        )
        self.tainted[row] = bool(self.taints[row])
        self.devices[row] = devices
        self.alive[row] = True
        self.ready[row] = node.ready
        self.schedulable[row] = not node.spec.unschedulable
        self.cpu_alloc[row] = to_milli(alloc.get("cpu", Decimal(0)))
        self.mem_alloc[row] = to_int(alloc.get("memory", Decimal(0))) // MIB
        pods = alloc.get("pods")
        self.pods_alloc[row] = to_int(pods) if pods is not None else _UNLIMITED_PODS
        for res in alloc:
            if res not in ("cpu", "memory", "pods", GPU_RESOURCE):
                self._ext_column(res)
        self.ext_alloc[row, :] = 0
        for res, q in alloc.items():
            col = self._ext_index.get(res)
            if col is not None:
                self.ext_alloc[row, col] = to_milli(q)
        count = len(devices)
        self.gpu_count[row] = count
        self.gpu_exists[row, :] = False
        self.gpu_exists[row, :count] = True
        self.gpu_healthy[row, :] = False
        self.gpu_mem_mib[row, :] = 0
        for d in devices:
            self.gpu_healthy[row, d.index] = d.healthy
            self.gpu_mem_mib[row, d.index] = d.memory_mib
        healthy = int(self.gpu_healthy[row].sum())
        self.gpu_healthy_count[row] = healthy
        self.gpu_healthy_inv[row] = 1.0 / healthy if healthy else 0.0
        model = devices[0].model if devices else ""
        self.gpu_model[row] = self._intern(model, self.model_names, self._model_index) if model else -1
        block = node.metadata.labels.get(self.block_label)
        self.block[row] = self._intern(block, self.block_names, self._block_index) if block else -1
        spine = node.metadata.labels.get(self.spine_label)
        self.spine[row] = self._intern(spine, self.spine_names, self._spine_index) if spine else -1
        self._refresh_topology(row, node, topology, count)
        self._reset_free(row)
        self._patch_masks(row)
        self.epoch += 1
        self.version += 1
        self.static_version += 1
        return row

    def _refresh_topology(self, row: int, node: Node, topology: NodeTopology | None, count: int) -> None:
        """Keep the row's NodeTopology (node's partition policy applied) and its subset table.

        The table lookup fingerprints the topology (~0.3 ms), so it is redone only when the
        NodeTopology object or the node's partition-policy label changes.
        """
        policy = node.metadata.labels.get(LABEL_PARTITION_POLICY)
        if topology is None or topology.gpu_count != count:
            self.topologies[row] = self.tables[row] = self._topo_keys[row] = None
            self.table_id[row] = -1
            return
        key = (id(topology), topology.resource_version, policy)
        if self._topo_keys[row] == key and topology.resource_version:
            return
        effective = _with_policy(topology, policy)
        table = table_for(effective) if count <= MAX_TABLE_GPUS else None
        self.topologies[row] = effective
        self.tables[row] = table
        self._topo_keys[row] = key
        if table is None:
            self.table_id[row] = -1
            return
        tid = self._table_index.get(table.fingerprint)
        if tid is None:
            tid = self._table_index[table.fingerprint] = len(self.table_list)
            self.table_list.append(table)
        self.table_id[row] = tid

    @staticmethod
    def _intern(value: str, names: list[str], index: dict[str, int]) -> int:
        pos = index.get(value)
        if pos is None:
            pos = index[value] = len(names)
            names.append(value)
        return pos

    def _reset_free(self, row: int) -> None:
        """Free = allocatable, then every reservation on the node applied again."""
        self.cpu_free[row] = self.cpu_alloc[row]
        self.mem_free[row] = self.mem_alloc[row]
        self.pods_free[row] = self.pods_alloc[row]
        self.ext_free[row, :] = self.ext_alloc[row, :]
        self.gpu_free_milli[row, :] = np.where(self.gpu_exists[row], GPU_MILLI, 0)
        self.gpu_mem_free[row, :] = self.gpu_mem_mib[row, :]
        self.ports_used[row] = {}
        self.ports_used_count[row] = 0
        self.nics_used[row] = {}
        self.gpu_kinds[row, :] = 0
        self.row_version[row] += 1
        name = self.names[row]
        for key in self._by_node.get(name, ()):  # type: ignore[arg-type]
            entry = self._entries[key]
            entry.alloc.row = -1
            self.apply(entry.alloc, row=row, advance_cursor=False)
        self._recount(row)

    def _recount(self, row: int) -> None:
        self.gpu_whole_free[row] = int(
            ((self.gpu_free_milli[row] == GPU_MILLI) & self.gpu_healthy[row]).sum()
        )

    def remove_node(self, name: str) -> None:
        row = self.index.pop(name, None)
        if row is None:
            return
        self.node_rv.pop(name, None)
        self.names[row] = None
        self.alive[row] = False
        self.ready[row] = False
        self.row_version[row] += 1
        for key in self._by_node.get(name, ()):
            self._entries[key].alloc.row = -1
        self._free_rows.append(row)
        self.version += 1
        self.static_version += 1

    @property
    def node_count(self) -> int:
        return len(self.index)

    # --- other views -------------------------------------------------------------------------

    def gpu_id(self, row: int, index: int) -> str:
        devices = self.devices[row]
        return devices[index].uuid if index < len(devices) else f"GPU-{self.names[row]}-{index}"

    def packing_state(self) -> ClusterState:
        """The packing policies' `ClusterState` over the live nodes (a copy; unhealthy GPUs count as used)."""
        from gpuyard.scheduler.packing.state import ClusterState  # the packing package is optional here

        rows = np.flatnonzero(self.alive)
        return ClusterState(
            node_names=[self.names[r] for r in rows],
            model_names=self.model_names,
            cpu_free=np.maximum(self.cpu_free[rows], 0),
            mem_free=np.maximum(self.mem_free[rows], 0),
            gpu_free=np.clip(np.where(self.gpu_healthy[rows], self.gpu_free_milli[rows], 0), 0, GPU_MILLI),
            gpu_count=self.gpu_count[rows],
            gpu_model=self.gpu_model[rows],
            cpu_capacity=np.maximum(self.cpu_alloc[rows], self.cpu_free[rows]),
            mem_capacity=np.maximum(self.mem_alloc[rows], self.mem_free[rows]),
            gpu_pods=self.gpu_kinds[rows],
        )


def _with_policy(topology: NodeTopology, policy: str | None) -> NodeTopology:
    """The topology with the node label's partition policy (Honor | Prefer) applied.

    A topology without a partition table gets the vendor's H100-family table when its GPUs are
    H100/H800/H20 and the label asks for a policy; other values of the label are ignored.
    """
    spec = topology.spec
    if policy not in ("Honor", "Prefer") or policy == spec.partition_policy:
        return topology
    partitions = spec.partitions
    if partitions is None:
        keys = {(g.model_key or model_key(g.model)).lower() for g in spec.gpus}
        if len(spec.gpus) != 8 or not keys or not keys <= set(_PARTITION_MODELS):
            return topology
        partitions = [list(p) for p in H100_PARTITIONS]
    changed = topology.model_copy(deep=True)
    changed.spec.partitions = partitions
    changed.spec.partition_policy = policy  # type: ignore[assignment]
    return changed


_ARRAYS = (
    "alive",
    "ready",
    "schedulable",
    "cpu_alloc",
    "cpu_free",
    "mem_alloc",
    "mem_free",
    "pods_alloc",
    "pods_free",
    "ext_alloc",
    "ext_free",
    "gpu_count",
    "gpu_exists",
    "gpu_healthy",
    "gpu_free_milli",
    "gpu_mem_mib",
    "gpu_mem_free",
    "gpu_whole_free",
    "gpu_healthy_count",
    "gpu_healthy_inv",
    "gpu_model",
    "gpu_kinds",
    "row_version",
    "block",
    "spine",
    "table_id",
    "ports_used_count",
    "port_cursor",
    "tainted",
)
