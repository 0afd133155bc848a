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
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from gpuyard.apis.core import GPU_RESOURCE, Node
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.quantity import to_int, to_milli
from gpuyard.apis.resourceclasses import DeviceInfo, Matcher, ResourceClass, gpu_devices
from gpuyard.apis.scheduling import Reservation
from gpuyard.devices.bandwidth import model_key
from gpuyard.devices.presets import H100_PARTITIONS
from gpuyard.devices.subsets import MAX_TABLE_GPUS, SubsetTable, table_for
from gpuyard.scheduler.gangs import (
    GPU_MILLI,
    MIB,
    SHARE_RESOURCES,
    Constraints,
    PodShape,
    Term,
    affinity_ok,
    selector_ok,
    taints_ok,
)

if TYPE_CHECKING:
    from gpuyard.scheduler.packing.state import ClusterState

__all__ = ["LABEL_BLOCK", "LABEL_PARTITION_POLICY", "LABEL_SPINE", "Alloc", "ClassMask", "Snapshot"]

LABEL_BLOCK = "topology.gpuyard.io/block"
LABEL_SPINE = "topology.gpuyard.io/spine"
LABEL_PARTITION_POLICY = "gpuyard.io/gpu-partition-policy"
_PARTITION_MODELS = ("h100", "h800", "h20")
_UNLIMITED_PODS = 1 << 30
_MASK_CACHE_SIZE = 1024


@dataclass(slots=True)
class Alloc:
    """What one pod takes on one node: the unit `apply`/`unapply` add and remove."""

    node: str
    cpu: int = 0
    mem: int = 0
    gpus: tuple[int, ...] = ()
    gpu_milli: int = 0
    ext: tuple[tuple[str, int], ...] = ()
    ports: tuple[int, ...] = ()
    row: int = -1  # the row it is applied to, -1 while not applied
    nics: tuple[str, ...] = ()
    gpu_mem: int = 0  # a share's GPU memory in MiB (whole GPUs: all of it, implied)


@dataclass(slots=True)
class _Entry:
    """A Reservation as the snapshot holds it."""

    key: tuple[str, str]
    group: tuple[str, str]
    rv: int
    alloc: Alloc


@dataclass(slots=True)
class ClassMask:
    """Which GPU slots a ResourceClass matches: `gpu[N, G]`, and per node whether any does."""

    gpu: np.ndarray
    node_any: np.ndarray
    count: np.ndarray  # matching GPUs per node (healthy or not)


def _alloc_of(res: Reservation) -> Alloc:
    spec = res.spec
    req = spec.requests
    ext = []
    for name, q in req.items():
        if name in ("cpu", "memory", "pods", GPU_RESOURCE) or name in SHARE_RESOURCES or q <= 0:
            continue
        if (
            "/" not in name
            and not name.startswith("hugepages-")
            and name not in ("ephemeral-storage", "storage")
        ):
            continue  # a ResourceClass request: counted through `gpus`
        ext.append((name, to_milli(q)))
    milli = (spec.gpu_milli or GPU_MILLI) if spec.gpus else 0
    return Alloc(
        node=spec.node,
        gpu_mem=spec.gpu_memory_mib if 0 < milli < GPU_MILLI else 0,
        cpu=to_milli(req.get("cpu", Decimal(0))),
        mem=-(-to_int(req.get("memory", Decimal(0))) // MIB),
        gpus=tuple(spec.gpus),
        gpu_milli=milli,
        ext=tuple(sorted(ext)),
        ports=tuple(spec.host_ports),
        nics=tuple(spec.nics),
    )


class Snapshot:
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

    def _gpus_take(self, row: int, gpus: tuple[int, ...], milli: int, mem: int = 0) -> None:
        """Take `milli` (and a share's `mem` MiB; a whole GPU: all its memory) of each GPU, give
        back when negative, keeping `gpu_whole_free` exact."""
        free = self.gpu_free_milli
        healthy = self.gpu_healthy
        g = self.g
        delta = 0
        whole = abs(milli) >= GPU_MILLI
        for idx in gpus:
            if idx >= g:
                continue
            if whole:  # a whole GPU takes (or gives back) all of its memory
                total = int(self.gpu_mem_mib[row, idx])
                self.gpu_mem_free[row, idx] -= total if milli > 0 else -total
            elif mem:
                self.gpu_mem_free[row, idx] -= mem
            before = int(free[row, idx])
            after = before - milli
            free[row, idx] = after
            if healthy[row, idx]:
                delta += (after == GPU_MILLI) - (before == GPU_MILLI)
        if delta:
            self.gpu_whole_free[row] += delta

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

    # --- reservations ------------------------------------------------------------------------

    def upsert_reservation(self, res: Reservation, *, advance_cursor: bool = True) -> bool:
        """Record a Reservation (idempotent by resourceVersion); True if anything changed."""
        key = (res.metadata.namespace, res.metadata.name)
        rv = res.resource_version
        old = self._entries.get(key)
        if old is not None:
            if old.rv == rv and rv:
                return False
            self.remove_reservation(key)
        entry = _Entry(key, (res.metadata.namespace, res.spec.pod_group), rv, _alloc_of(res))
        self._entries[key] = entry
        self._count_shape(entry.alloc, 1)
        self._by_node.setdefault(entry.alloc.node, set()).add(key)
        self._by_group.setdefault(entry.group, {})[res.metadata.name] = entry
        row = self.index.get(entry.alloc.node)
        if row is not None:
            self.apply(entry.alloc, row=row, advance_cursor=advance_cursor)
        self.version += 1
        return True

    def remove_reservation(self, key: tuple[str, str]) -> _Entry | None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self._count_shape(entry.alloc, -1)
        if entry.alloc.row >= 0:
            self.unapply(entry.alloc)
        keys = self._by_node.get(entry.alloc.node)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_node[entry.alloc.node]
        members = self._by_group.get(entry.group)
        if members is not None:
            members.pop(key[1], None)
            if not members:
                del self._by_group[entry.group]
        self.epoch += 1
        self.version += 1
        return entry

    def placed_pods(self, group: tuple[str, str]) -> dict[str, str]:
        """Pods of a PodGroup that hold a Reservation: pod name -> node."""
        members = self._by_group.get(group)
        if not members:
            return {}
        return {name: e.alloc.node for name, e in members.items()}

    def has_reservation(self, key: tuple[str, str]) -> bool:
        return key in self._entries

    @property
    def reservation_count(self) -> int:
        return len(self._entries)

    # --- apply / unapply (place() and the ledger share them) -----------------------------------

    def apply(self, alloc: Alloc, *, row: int, advance_cursor: bool = True) -> None:
        """Take `alloc` from `row`'s free capacity (may go negative for a stale ledger; never checks)."""
        alloc.row = row
        self.row_version[row] += 1
        self.cpu_free[row] -= alloc.cpu
        self.mem_free[row] -= alloc.mem
        self.pods_free[row] -= 1
        for name, amount in alloc.ext:
            col = self._ext_index.get(name)
            if col is None:
                col = self._ext_column(name)
            self.ext_free[row, col] -= amount
        if alloc.gpus:
            self._gpus_take(row, alloc.gpus, alloc.gpu_milli, alloc.gpu_mem)
            self.gpu_kinds[row, _kind(alloc, self.g)] += 1
        if alloc.nics:
            held = self.nics_used[row]
            for nic in alloc.nics:
                held[nic] = held.get(nic, 0) + 1
        if alloc.ports:
            used = self.ports_used[row]
            lo, hi = self.port_lo, self.port_hi
            for p in alloc.ports:
                n = used.get(p, 0)
                used[p] = n + 1
                if not n and lo <= p <= hi:
                    self.ports_used_count[row] += 1
            if advance_cursor:
                self.port_cursor[row] = alloc.ports[-1]

    def unapply(self, alloc: Alloc) -> None:
        row = alloc.row
        if row < 0:
            return
        alloc.row = -1
        self.row_version[row] += 1
        self.cpu_free[row] += alloc.cpu
        self.mem_free[row] += alloc.mem
        self.pods_free[row] += 1
        for name, amount in alloc.ext:
            self.ext_free[row, self._ext_index[name]] += amount
        if alloc.gpus:
            self._gpus_take(row, alloc.gpus, -alloc.gpu_milli, -alloc.gpu_mem)
            self.gpu_kinds[row, _kind(alloc, self.g)] -= 1
        if alloc.nics:
            held = self.nics_used[row]
            for nic in alloc.nics:
                n = held.get(nic, 0)
                if n > 1:
                    held[nic] = n - 1
                else:
                    held.pop(nic, None)
        if alloc.ports:
            used = self.ports_used[row]
            lo, hi = self.port_lo, self.port_hi
            for p in alloc.ports:
                n = used.get(p, 0)
                if n > 1:
                    used[p] = n - 1
                elif n == 1:
                    del used[p]
                    if lo <= p <= hi:
                        self.ports_used_count[row] -= 1

    def take_ports(self, row: int, count: int) -> tuple[int, ...] | None:
        """`count` free host ports on `row`, round-robin after the last one handed out there."""
        if count <= 0:
            return ()
        if self.port_count - int(self.ports_used_count[row]) < count:
            return None
        used = self.ports_used[row]
        lo, size = self.port_lo, self.port_count
        start = int(self.port_cursor[row]) + 1 - lo
        out: list[int] = []
        for step in range(size):
            p = lo + (start + step) % size
            if p not in used:
                out.append(p)
                if len(out) == count:
                    return tuple(out)
        return None

    # --- masks -------------------------------------------------------------------------------

    @property
    def usable(self) -> np.ndarray:
        """bool[N]: nodes that exist, are Ready and not cordoned."""
        return self.alive & self.ready & self.schedulable

    def selector_mask(self, constraints: Constraints) -> np.ndarray | None:
        """bool[N] for nodeSelector + required affinity (cached); None when the pod selects nothing."""
        if not constraints.selects:
            return None
        key = (constraints.node_selector, constraints.affinity)
        return self._cached(self._selector_masks, key, lambda row: self._selects(key, row))

    def term_mask(self, term: Term) -> np.ndarray:
        """bool[N] for one node-selector term (preferred affinity scoring)."""
        key = ((), (term,))
        return self._cached(self._selector_masks, key, lambda row: self._selects(key, row))

    def taint_mask(self, constraints: Constraints) -> np.ndarray:
        """bool[N]: nodes whose NoSchedule/NoExecute taints the pod tolerates (cached)."""
        key = constraints.tolerations
        if not key:
            return ~self.tainted
        return self._cached(self._taint_masks, key, lambda row: taints_ok(self.taints[row], key))

    def _selects(self, key: tuple, row: int) -> bool:
        node_selector, affinity = key
        labels = self.labels[row]
        if node_selector and not selector_ok(node_selector, labels):
            return False
        return not affinity or affinity_ok(affinity, labels, self.names[row] or "")

    def _cached(self, cache: OrderedDict, key: tuple, test) -> np.ndarray:  # type: ignore[no-untyped-def]
        mask = cache.get(key)
        if mask is not None:
            cache.move_to_end(key)
            return mask
        mask = np.zeros(self.n, dtype=bool)
        for row, name in enumerate(self.names):
            if name is not None:
                mask[row] = test(row)
        cache[key] = mask
        if len(cache) > _MASK_CACHE_SIZE:
            cache.popitem(last=False)
        return mask

    def _patch_masks(self, row: int) -> None:
        for key, mask in self._selector_masks.items():
            mask[row] = self._selects(key, row)
        for key, mask in self._taint_masks.items():
            mask[row] = taints_ok(self.taints[row], key)
        for name, cm in self._class_masks.items():
            self._class_row(cm, self._matchers[name][1], row)

    # --- resource classes --------------------------------------------------------------------

    def set_classes(self, classes: Iterable[ResourceClass]) -> bool:
        """Install the current ResourceClasses; masks of changed classes are recomputed lazily."""
        fresh = {c.metadata.name: c for c in classes}
        changed = False
        for name in list(self._matchers):
            if name not in fresh:
                del self._matchers[name]
                self._class_masks.pop(name, None)
                changed = True
        for name, c in fresh.items():
            known = self._matchers.get(name)
            if known is None or known[0] != c.resource_version or not c.resource_version:
                self._matchers[name] = (c.resource_version, c.matcher())
                self._class_masks.pop(name, None)
                changed = True
        if changed:
            self.epoch += 1
            self.version += 1
            self.static_version += 1
        return changed

    @property
    def class_names(self) -> Mapping[str, object]:
        return self._matchers

    def class_mask(self, name: str) -> ClassMask | None:
        """Which GPUs class `name` matches (None: no such class)."""
        cm = self._class_masks.get(name)
        if cm is not None:
            return cm
        known = self._matchers.get(name)
        if known is None:
            return None
        cm = ClassMask(
            np.zeros((self.n, self.g), dtype=bool),
            np.zeros(self.n, dtype=bool),
            np.zeros(self.n, dtype=np.int32),
        )
        for row, node in enumerate(self.names):
            if node is not None:
                self._class_row(cm, known[1], row)
        self._class_masks[name] = cm
        return cm

    def _class_row(self, cm: ClassMask, matcher: Matcher, row: int) -> None:
        cm.gpu[row, :] = False
        devices = self.devices[row] if self.names[row] is not None else []
        if devices:
            if matcher.per_device:
                for d in devices:
                    cm.gpu[row, d.index] = matcher.matches(d.properties())
            else:
                verdicts: dict[int, bool] = {}
                for d in devices:
                    ok = verdicts.get(id(d.shared))
                    if ok is None:
                        ok = verdicts[id(d.shared)] = matcher.matches(d.shared)
                    cm.gpu[row, d.index] = ok
        cm.count[row] = int(cm.gpu[row].sum())
        cm.node_any[row] = cm.count[row] > 0

    # --- per-shape helpers used by filters and the GPU chooser --------------------------------

    def gpu_usable(self, gpu_class: str | None) -> np.ndarray:
        """bool[N, G]: healthy GPU slots of the class (any GPU for None)."""
        if gpu_class is None:
            return self.gpu_healthy
        cm = self.class_mask(gpu_class)
        return self.gpu_healthy & cm.gpu if cm is not None else np.zeros_like(self.gpu_healthy)

    def gpu_available(self, gpu_class: str | None, gpu_milli: int) -> np.ndarray:
        """int[N]: for whole GPUs, how many idle GPUs of the class; for a share (`gpu_milli` < 1000),
        how many such shares fit, summed over the GPUs of the class."""
        if gpu_class is None and gpu_milli >= GPU_MILLI:
            return self.gpu_whole_free
        usable = self.gpu_usable(gpu_class)
        if gpu_milli >= GPU_MILLI:
            return ((self.gpu_free_milli == GPU_MILLI) & usable).sum(axis=1)
        return np.where(usable, np.maximum(self.gpu_free_milli, 0) // gpu_milli, 0).sum(axis=1)

    def _count_shape(self, alloc: Alloc, delta: int) -> None:
        if not alloc.gpus or not 0 < alloc.gpu_milli <= GPU_MILLI:
            return
        key = (alloc.cpu, len(alloc.gpus), alloc.gpu_milli)
        count = self._shape_counts.get(key, 0) + delta
        if count > 0:
            self._shape_counts[key] = count
        else:
            self._shape_counts.pop(key, None)

    def workload_counts(self) -> Mapping[tuple[int, int, int], int]:
        """(cpu milli, GPUs, milli per GPU) -> how many GPU reservations have that shape: the live
        workload FGD measures fragmentation against (kept current on every reservation change)."""
        return MappingProxyType(self._shape_counts)

    def workload_shapes(self) -> list[tuple[int, int, int]]:
        """The shape of every GPU reservation (`workload_counts`, expanded)."""
        return [shape for shape, count in self._shape_counts.items() for _ in range(count)]

    def share_memory(self, row: int, shape: PodShape) -> np.ndarray:
        """int64[G]: MiB a share of `shape` needs on each GPU of `row` (0 where the GPU's memory is unknown)."""
        if shape.gpu_mem_mib:
            return np.where(self.gpu_mem_mib[row] > 0, shape.gpu_mem_mib, 0).astype(np.int64)
        total = self.gpu_mem_mib[row].astype(np.int64)
        return -(-total * shape.gpu_mem_permille // GPU_MILLI)

    def share_available(self, shape: PodShape) -> np.ndarray:
        """int[N]: how many shares of `shape` fit on each node, by milli AND memory (vectorised;
        `gpu_available` counts by milli only)."""
        usable = self.gpu_usable(shape.gpu_class)
        total = self.gpu_mem_mib.astype(np.int64)
        if shape.gpu_mem_mib:
            need = np.where(total > 0, shape.gpu_mem_mib, 0)
        else:
            need = -(-total * shape.gpu_mem_permille // GPU_MILLI)
        by_milli = np.maximum(self.gpu_free_milli, 0) // shape.gpu_milli
        by_mem = np.where(need > 0, np.maximum(self.gpu_mem_free, 0) // np.maximum(need, 1), by_milli)
        return np.where(usable, np.minimum(by_milli, by_mem), 0).sum(axis=1)

    def share_fits(self, row: int, shape: PodShape) -> np.ndarray:
        """bool[G]: GPUs of `row` a share of `shape` fits on (healthy, of its class, milli and memory free)."""
        usable = self.gpu_usable(shape.gpu_class)[row]
        return (
            usable
            & (self.gpu_free_milli[row] >= shape.gpu_milli)
            & (self.gpu_mem_free[row] >= self.share_memory(row, shape))
        )

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


def _kind(alloc: Alloc, width: int) -> int:
    """The column of `gpu_kinds` an allocation counts in: 0 for a share, else its GPU count."""
    return 0 if alloc.gpu_milli < GPU_MILLI else min(len(alloc.gpus), width)


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
