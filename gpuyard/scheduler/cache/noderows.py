"""Which node lives in which row of the snapshot, and the node's static facts.

:class:`NodeRows` hands out rows (reusing the rows of removed nodes), keeps the per-row facts
that are Python objects (name, labels, taints, GPU devices, the NodeTopology with the node's
partition policy applied and its shared best-subset table) and interns the names of GPU models,
network blocks and spines, and writes a node's numeric static columns of the
:class:`~gpuyard.scheduler.cache.nodearrays.NodeArrays` it is given (allocatable CPU, memory, pods and
extended resources, GPU slots and their health and memory, model, block, spine, table). Free
capacity is not its business: the snapshot resets a loaded row through the ledger.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

from gpuyard.apis.core import GPU_RESOURCE, Node
from gpuyard.apis.devicematching import LABEL_BLOCK, LABEL_SPINE, DeviceInfo
from gpuyard.apis.devices import NodeTopology, PartitionPolicy
from gpuyard.apis.quantity import to_int, to_milli
from gpuyard.devices.bandwidth import model_key
from gpuyard.devices.presets import H100_PARTITIONS
from gpuyard.devices.subsets import MAX_TABLE_GPUS, SubsetTable, table_for
from gpuyard.scheduler.cache.nodearrays import NodeArrays
from gpuyard.scheduler.gangs.requests import MIB

__all__ = ["LABEL_BLOCK", "LABEL_PARTITION_POLICY", "LABEL_SPINE", "NodeRows"]

LABEL_PARTITION_POLICY = "gpuyard.io/gpu-partition-policy"
_PARTITION_MODELS = ("h100", "h800", "h20")
_UNLIMITED_PODS = 1 << 30
_STANDARD = ("cpu", "memory", "pods", GPU_RESOURCE)


class NodeRows:
    """Row assignment and per-row static facts of the snapshot's nodes (see the module docstring)."""

    def __init__(self, arrays: NodeArrays) -> None:
        self._arrays = arrays
        self.names: list[str | None] = []  # per row; None for a free row
        self.index: dict[str, int] = {}  # node name -> row
        self._free_rows: list[int] = []
        self.node_rv: dict[str, int] = {}  # node name -> the resourceVersion its row was loaded from
        self.node_obj: dict[str, Node] = {}  # node name -> the (immutable, shared) object it was loaded from
        self.labels: list[Mapping[str, str]] = []
        self.taints: list[tuple[tuple[str, str | None, str], ...]] = []  # NoSchedule/NoExecute only
        self.devices: list[list[DeviceInfo]] = []
        self.topologies: list[NodeTopology | None] = []  # with the node's partition policy applied
        self.tables: list[SubsetTable | None] = []  # the shared best-subset table (<= 8 GPUs)
        self._topo_keys: list[tuple[int, int, str | None] | None] = []  # (id, resourceVersion, policy)
        self.table_list: list[SubsetTable] = []  # distinct tables; `table_id[N]` indexes it
        self._table_index: dict[str, int] = {}
        self.model_names: list[str] = []  # `gpu_model[N]` indexes it
        self._model_index: dict[str, int] = {}
        self.block_names: list[str] = []  # `block[N]` indexes it
        self._block_index: dict[str, int] = {}
        self.spine_names: list[str] = []  # `spine[N]` indexes it
        self._spine_index: dict[str, int] = {}

    @property
    def count(self) -> int:
        """Nodes that hold a row."""
        return len(self.index)

    def claim(self, name: str) -> tuple[int, bool]:
        """The row of node `name`, and whether it is new (a freed row is reused first). The row
        may lie beyond the arrays: the caller grows them before loading it."""
        row = self.index.get(name)
        if row is not None:
            return row, False
        if self._free_rows:
            row = self._free_rows.pop()
        else:
            row = len(self.names)
            self.names.append(None)
            self.labels.append({})
            self.taints.append(())
            self.devices.append([])
            self.topologies.append(None)
            self.tables.append(None)
            self._topo_keys.append(None)
        self.names[row] = name
        self.index[name] = row
        return row, True

    def release(self, name: str) -> int | None:
        """Give up node `name`'s row (marked dead, kept for the next new node); None if unknown."""
        row = self.index.pop(name, None)
        if row is None:
            return None
        self.node_rv.pop(name, None)
        self.node_obj.pop(name, None)
        self.names[row] = None
        self._arrays.alive[row] = False
        self._arrays.ready[row] = False
        self._free_rows.append(row)
        return row

    def load(self, row: int, node: Node, topology: NodeTopology | None, devices: list[DeviceInfo]) -> None:
        """Write `node`'s static facts into its (claimed, big enough) row."""
        a = self._arrays
        labels = node.metadata.labels
        self.node_rv[node.metadata.name] = node.resource_version
        self.node_obj[node.metadata.name] = node
        self.labels[row] = labels
        self.taints[row] = tuple(
            (t.key, t.value, t.effect) for t in node.spec.taints if t.effect in ("NoSchedule", "NoExecute")
        )
        self.devices[row] = devices
        a.tainted[row] = bool(self.taints[row])
        a.alive[row] = True
        a.ready[row] = node.ready
        a.schedulable[row] = not node.spec.unschedulable
        alloc = node.status.allocatable
        a.cpu_alloc[row] = to_milli(alloc.get("cpu", Decimal(0)))
        a.mem_alloc[row] = to_int(alloc.get("memory", Decimal(0))) // MIB
        pods = alloc.get("pods")
        a.pods_alloc[row] = to_int(pods) if pods is not None else _UNLIMITED_PODS
        cols = [(a.ext_column(res), q) for res, q in alloc.items() if res not in _STANDARD]
        a.ext_alloc[row, :] = 0
        for col, q in cols:
            a.ext_alloc[row, col] = to_milli(q)
        count = len(devices)
        a.gpu_count[row] = count
        a.gpu_exists[row, :] = False
        a.gpu_exists[row, :count] = True
        a.gpu_healthy[row, :] = False
        a.gpu_mem_mib[row, :] = 0
        for d in devices:
            a.gpu_healthy[row, d.index] = d.healthy
            a.gpu_mem_mib[row, d.index] = d.memory_mib
        healthy = int(a.gpu_healthy[row].sum())
        a.gpu_healthy_count[row] = healthy
        a.gpu_healthy_inv[row] = 1.0 / healthy if healthy else 0.0
        model = devices[0].model if devices else ""
        a.gpu_model[row] = _intern(model, self.model_names, self._model_index) if model else -1
        block = labels.get(LABEL_BLOCK)
        a.block[row] = _intern(block, self.block_names, self._block_index) if block else -1
        spine = labels.get(LABEL_SPINE)
        a.spine[row] = _intern(spine, self.spine_names, self._spine_index) if spine else -1
        self._load_topology(row, labels.get(LABEL_PARTITION_POLICY), topology, count)

    def _load_topology(self, row: int, policy: str | None, topology: NodeTopology | None, count: int) -> None:
        """Keep the row's NodeTopology (node's partition policy applied) and its subset table.

        The table lookup fingerprints the topology (~0.3 ms), so it is redone only when the
        NodeTopology object or the node's partition-policy label changes.
        """
        if topology is None or topology.gpu_count != count:
            self.topologies[row] = self.tables[row] = self._topo_keys[row] = None
            self._arrays.table_id[row] = -1
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
            self._arrays.table_id[row] = -1
            return
        tid = self._table_index.get(table.fingerprint)
        if tid is None:
            tid = self._table_index[table.fingerprint] = len(self.table_list)
            self.table_list.append(table)
        self._arrays.table_id[row] = tid

    def gpu_id(self, row: int, index: int) -> str:
        """The UUID of GPU `index` of `row` (a made-up stable name when the node lists none)."""
        devices = self.devices[row]
        return devices[index].uuid if index < len(devices) else f"GPU-{self.names[row]}-{index}"


def _intern(value: str, names: list[str], index: dict[str, int]) -> int:
    pos = index.get(value)
    if pos is None:
        pos = index[value] = len(names)
        names.append(value)
    return pos


_PARTITION_POLICIES: dict[str, PartitionPolicy] = {"Honor": "Honor", "Prefer": "Prefer"}
"""The partition-policy label's values that mean something."""


def _with_policy(topology: NodeTopology, policy: str | None) -> NodeTopology:
    """The topology with the node label's partition policy (Honor | Prefer) applied.

    A topology without a partition table gets the vendor's H100-family table when its GPUs are
    H100/H800/H20 and the label asks for a policy; other values of the label are ignored.
    """
    spec = topology.spec
    chosen = _PARTITION_POLICIES.get(policy) if policy is not None else None
    if chosen is None or chosen == spec.partition_policy:
        return topology
    partitions = spec.partitions
    if partitions is None:
        keys = {(g.model_key or model_key(g.model)).lower() for g in spec.gpus}
        if len(spec.gpus) != 8 or not keys or not keys <= set(_PARTITION_MODELS):
            return topology
        partitions = [list(p) for p in H100_PARTITIONS]
    changed = topology.model_copy(deep=True)
    changed.spec.partitions = partitions
    changed.spec.partition_policy = chosen
    return changed
