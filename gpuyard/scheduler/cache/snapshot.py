"""The scheduler's snapshot: free capacity of every node as NumPy arrays, kept current incrementally.

Free = allocatable − the node's Reservations. The running loop feeds changes in
(`refresh_node`, `remove_node`, `upsert_reservation`, `remove_reservation`, `set_classes`) for
the objects the store watch reported since the last cycle; each touches one row. Derived masks —
per distinct node-selector/affinity, per toleration set, per ResourceClass — are computed once
over all nodes, cached, and patched row by row when a node changes, so filters are vectorised
array operations and never a Python loop over nodes per pod.

`place()` mutates the arrays while it tries a placement and undoes every change before it
returns (`apply`/`unapply` of :class:`Alloc`); the loop then records the chosen placement for
good through `upsert_reservation` (the "assume").

:class:`Snapshot` is a composition of four parts, each owning its own state and given what it
reads when it is built:

* `arrays` — :class:`~gpuyard.scheduler.cache.nodearrays.NodeArrays`, the flat per-node arrays (the
  layout is described there);
* `node_rows` — :class:`~gpuyard.scheduler.cache.noderows.NodeRows`, which node is in which row and
  its static facts (labels, taints, GPUs, topology and subset table), written into `arrays`;
* `ledger` — :class:`~gpuyard.scheduler.cache.allocations.Ledger`, the Reservations and the Allocs
  they take from `arrays` (`apply`/`unapply`, host ports);
* `masks` — :class:`~gpuyard.scheduler.cache.masks.Masks`, the cached node and ResourceClass masks and
  the per-shape GPU availability read from `arrays` and `node_rows`.

The snapshot sequences them on every change (claim a row, grow the arrays, load the node, reset
its free capacity, patch the masks) and keeps the change counters (`epoch`, `version`,
`static_version`). The arrays and facts the filters, scores and choosers read are exposed on the
snapshot itself as read-only attributes of its parts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from operator import attrgetter
from typing import Any

import numpy as np

from gpuyard.apis.core import GPU_RESOURCE, Node
from gpuyard.apis.devicematching import gpu_devices
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.quantity import to_int
from gpuyard.apis.resourceclasses import ResourceClass
from gpuyard.apis.scheduling import Reservation
from gpuyard.devices.subsets import SubsetTable
from gpuyard.scheduler.cache.allocations import Alloc, Entry, Ledger
from gpuyard.scheduler.cache.masks import ClassMask, Masks
from gpuyard.scheduler.cache.nodearrays import NodeArrays
from gpuyard.scheduler.cache.noderows import NodeRows
from gpuyard.scheduler.gangs.requests import Constraints, PodShape, Term

__all__ = ["Alloc", "Snapshot"]


def _part(path: str) -> Any:
    """A read-only attribute of the snapshot that is `path` of one of its parts (a C-level
    getter: no Python frame per access in the hot path)."""
    return property(attrgetter(path))


class Snapshot:
    """Per-node free capacity and static facts as flat arrays; see the module docstring."""

    def __init__(
        self, *, port_range: tuple[int, int] = (20000, 30000), rows: int = 16, gpu_width: int = 8
    ) -> None:
        self.arrays = NodeArrays(rows=rows, gpu_width=gpu_width, port_lo=port_range[0])
        self.node_rows = NodeRows(self.arrays)
        self.ledger = Ledger(arrays=self.arrays, port_range=port_range)
        self.masks = Masks(arrays=self.arrays, rows=self.node_rows)
        self.epoch = 0
        """Bumped whenever capacity may have grown (node added or changed, reservation removed,
        classes changed): jobs that did not fit are worth another try."""
        self.version = 0
        """Bumped on every change."""
        self.static_version = 0
        """Bumped when node facts or classes change (caches of static filter masks)."""

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
        snap.ledger.resume_ports()
        return snap

    # --- changes -----------------------------------------------------------------------------

    def refresh_node(self, node: Node, topology: NodeTopology | None = None) -> int:
        """Load or reload one node's row (static facts and free capacity); return the row."""
        name = node.metadata.name
        devices = gpu_devices(node, topology)
        row, new = self.node_rows.claim(name)
        a = self.arrays
        if row >= a.n or len(devices) > a.g:
            a.grow(max(2 * a.n, row + 1) if row >= a.n else a.n, len(devices))
            self.masks.forget()
        if new:
            self.ledger.restart_ports(row)
        self.node_rows.load(row, node, topology, devices)
        self.ledger.reset_row(row, name)
        self.masks.patch_row(row)
        self.epoch += 1
        self.version += 1
        self.static_version += 1
        return row

    def remove_node(self, name: str) -> None:
        """The node is gone: its row is dead (and reused for the next new node); its
        Reservations stay recorded until they are removed."""
        row = self.node_rows.release(name)
        if row is None:
            return
        self.arrays.row_version[row] += 1
        self.ledger.detach(name)
        self.version += 1
        self.static_version += 1

    def upsert_reservation(self, res: Reservation, *, advance_cursor: bool = True) -> bool:
        """Record a Reservation (idempotent by resourceVersion); True if anything changed."""
        row = self.node_rows.index.get(res.spec.node)
        changed = self.ledger.upsert(res, row=row, advance_cursor=advance_cursor)
        if changed:
            self.version += 1
        return changed

    def remove_reservation(self, key: tuple[str, str]) -> Entry | None:
        """Forget a Reservation (namespace, name) and give its capacity back; the entry removed."""
        entry = self.ledger.remove(key)
        if entry is not None:
            self.epoch += 1
            self.version += 1
        return entry

    def set_classes(self, classes: Iterable[ResourceClass]) -> bool:
        """Install the current ResourceClasses; True if any changed (their masks are recomputed lazily)."""
        changed = self.masks.set_classes(classes)
        if changed:
            self.epoch += 1
            self.version += 1
            self.static_version += 1
        return changed

    # --- the ledger --------------------------------------------------------------------------

    def apply(self, alloc: Alloc, *, row: int, advance_cursor: bool = True) -> None:
        """Take `alloc` from `row`'s free capacity (`place()` tries a pod; never checks)."""
        self.ledger.apply(alloc, row=row, advance_cursor=advance_cursor)

    def unapply(self, alloc: Alloc) -> None:
        """Give back what `apply` took."""
        self.ledger.unapply(alloc)

    def take_ports(self, row: int, count: int) -> tuple[int, ...] | None:
        """`count` free host ports on `row`, round-robin after the last one handed out there."""
        return self.ledger.take_ports(row, count)

    def placed_pods(self, group: tuple[str, str]) -> dict[str, str]:
        """Pods of a PodGroup that hold a Reservation: pod name -> node."""
        return self.ledger.placed_pods(group)

    def group_gpus(self, group: tuple[str, str]) -> dict[str, int]:
        """GPUs a PodGroup's Reservations hold, per node (shares count as one GPU)."""
        return self.ledger.group_gpus(group)

    def group_allocs(self, group: tuple[str, str]) -> list[Alloc]:
        """What a PodGroup's Reservations take (an `Alloc` per pod; `row` -1 when not applied)."""
        return self.ledger.group_allocs(group)

    def groups(self) -> list[tuple[str, str]]:
        """Every PodGroup holding at least one Reservation."""
        return self.ledger.groups()

    def workload_counts(self) -> Mapping[tuple[int, int, int], int]:
        """(cpu milli, GPUs, milli per GPU) -> how many GPU reservations have that shape."""
        return self.ledger.workload_counts()

    @property
    def reservation_count(self) -> int:
        return len(self.ledger)

    port_lo: int = _part("ledger.port_lo")
    port_hi: int = _part("ledger.port_hi")
    port_count: int = _part("ledger.port_count")

    # --- the masks ---------------------------------------------------------------------------

    def selector_mask(self, constraints: Constraints) -> np.ndarray | None:
        """bool[N] for nodeSelector + required affinity (cached); None when the pod selects nothing."""
        return self.masks.selector_mask(constraints)

    def term_mask(self, term: Term) -> np.ndarray:
        """bool[N] for one node-selector term (preferred affinity scoring)."""
        return self.masks.term_mask(term)

    def taint_mask(self, constraints: Constraints) -> np.ndarray:
        """bool[N]: nodes whose NoSchedule/NoExecute taints the pod tolerates (cached)."""
        return self.masks.taint_mask(constraints)

    def class_mask(self, name: str) -> ClassMask | None:
        """Which GPUs ResourceClass `name` matches (None: no such class)."""
        return self.masks.class_mask(name)

    @property
    def class_names(self) -> Mapping[str, object]:
        """The installed ResourceClasses by name."""
        return self.masks.class_names

    def gpu_available(self, gpu_class: str | None, gpu_milli: int) -> np.ndarray:
        """int[N]: idle GPUs of the class, or for a share how many fit by milli (see `Masks`)."""
        return self.masks.gpu_available(gpu_class, gpu_milli)

    def share_memory(self, row: int, shape: PodShape) -> np.ndarray:
        """int64[G]: MiB a share of `shape` needs on each GPU of `row`."""
        return self.masks.share_memory(row, shape)

    def share_available(self, shape: PodShape) -> np.ndarray:
        """int[N]: how many shares of `shape` fit on each node, by milli and memory."""
        return self.masks.share_available(shape)

    def share_fits(self, row: int, shape: PodShape) -> np.ndarray:
        """bool[G]: GPUs of `row` a share of `shape` fits on."""
        return self.masks.share_fits(row, shape)

    # --- the nodes ---------------------------------------------------------------------------

    @property
    def node_count(self) -> int:
        return self.node_rows.count

    def gpu_id(self, row: int, index: int) -> str:
        """The UUID of GPU `index` of `row`."""
        return self.node_rows.gpu_id(row, index)

    names: list[str | None] = _part("node_rows.names")
    index: dict[str, int] = _part("node_rows.index")
    node_rv: dict[str, int] = _part("node_rows.node_rv")
    node_obj: dict[str, Node] = _part("node_rows.node_obj")
    taints: list[tuple[tuple[str, str | None, str], ...]] = _part("node_rows.taints")
    topologies: list[NodeTopology | None] = _part("node_rows.topologies")
    tables: list[SubsetTable | None] = _part("node_rows.tables")
    table_list: list[SubsetTable] = _part("node_rows.table_list")
    model_names: list[str] = _part("node_rows.model_names")
    block_names: list[str] = _part("node_rows.block_names")
    spine_names: list[str] = _part("node_rows.spine_names")

    # --- the arrays (layout: gpuyard.scheduler.cache.nodearrays) -----------------------------------

    def ext_col(self, name: str) -> int | None:
        """The column of extended resource `name` in `ext_alloc`/`ext_free` (None: unknown)."""
        return self.arrays.ext_col(name)

    n: int = _part("arrays.n")
    g: int = _part("arrays.g")
    ext_names: list[str] = _part("arrays.ext_names")
    alive: np.ndarray = _part("arrays.alive")
    ready: np.ndarray = _part("arrays.ready")
    schedulable: np.ndarray = _part("arrays.schedulable")
    tainted: np.ndarray = _part("arrays.tainted")
    cpu_alloc: np.ndarray = _part("arrays.cpu_alloc")
    cpu_free: np.ndarray = _part("arrays.cpu_free")
    mem_alloc: np.ndarray = _part("arrays.mem_alloc")
    mem_free: np.ndarray = _part("arrays.mem_free")
    pods_free: np.ndarray = _part("arrays.pods_free")
    ext_alloc: np.ndarray = _part("arrays.ext_alloc")
    ext_free: np.ndarray = _part("arrays.ext_free")
    gpu_count: np.ndarray = _part("arrays.gpu_count")
    gpu_healthy: np.ndarray = _part("arrays.gpu_healthy")
    gpu_free_milli: np.ndarray = _part("arrays.gpu_free_milli")
    gpu_mem_mib: np.ndarray = _part("arrays.gpu_mem_mib")
    gpu_mem_free: np.ndarray = _part("arrays.gpu_mem_free")
    gpu_whole_free: np.ndarray = _part("arrays.gpu_whole_free")
    gpu_healthy_count: np.ndarray = _part("arrays.gpu_healthy_count")
    gpu_healthy_inv: np.ndarray = _part("arrays.gpu_healthy_inv")
    gpu_model: np.ndarray = _part("arrays.gpu_model")
    gpu_kinds: np.ndarray = _part("arrays.gpu_kinds")
    row_version: np.ndarray = _part("arrays.row_version")
    block: np.ndarray = _part("arrays.block")
    spine: np.ndarray = _part("arrays.spine")
    table_id: np.ndarray = _part("arrays.table_id")
    ports_used_count: np.ndarray = _part("arrays.ports_used_count")
    port_cursor: np.ndarray = _part("arrays.port_cursor")
    ports_used: list[dict[int, int]] = _part("arrays.ports_used")
    nics_used: list[dict[str, int]] = _part("arrays.nics_used")
