"""Device-topology objects: the GPUs, NICs, PCIe switches and NUMA nodes of one node.

A :class:`NodeTopology` is a cluster-scoped object (one per node, named like the node) that the
device inventory writes into the store: from a preset (fake cluster), from an imported
`nvidia-smi topo -m` matrix, or from NVML discovery on a real host. The scheduler never reads
these models in its hot path; `gpuyard.devices` turns a topology once into flat tables
(link tiers, bandwidths, best GPU subsets) shared by every node with the same fingerprint.

Conventions of the model (see docs/topology.md):

- GPUs are numbered 0..n-1 and `gpus[i].index == i`; a set of GPUs is a bit mask over indices.
- `nvlink_peers` maps a peer GPU index to the number of NVLinks between the two GPUs, exactly the
  number that `nvidia-smi topo -m` prints as `NV#`. Behind NVSwitch every pair shows the GPU's
  full link count (NV12 on A100, NV18 on H100) and `nvswitch` is true.
- A device's `pcie_switch` names its lowest PCIe switch; switches may have a `parent` switch and a
  `host_bridge`. Together with `numa_node` and `socket` this reproduces PIX/PXB/PHB/NODE/SYS.
- `numa_node`/`socket` of -1 mean "unknown" (as Linux sysfs writes it), e.g. a NIC that
  `nvidia-smi` shows only as SYS to every GPU.
- `link_matrix` / `nic_link_matrix`, when present (imported topologies), are authoritative for
  the link labels and override what the structure implies.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from pydantic import Field, field_validator, model_validator

from gpuyard.apis.meta import Resource, StrictK8sModel

__all__ = [
    "LINK_LABELS_ALLOWED",
    "GPUDevice",
    "Health",
    "NICDevice",
    "NUMANode",
    "NodeTopology",
    "NodeTopologySpec",
    "PCIeSwitch",
    "PartitionPolicy",
]

Health = Literal["Healthy", "Unhealthy"]
PartitionPolicy = Literal["Honor", "Prefer"]

LINK_LABELS_ALLOWED = "X, NV<n> (n >= 1), PIX, PXB, PHB, NODE, SYS (or the legacy SOC)"
_LINK_RE = re.compile(r"^(X|NV[1-9][0-9]*|PIX|PXB|PHB|NODE|SYS|SOC)$")


class GPUDevice(StrictK8sModel):
    """One GPU as `nvidia-smi` and NVML describe it."""

    index: int = Field(ge=0)
    minor: int | None = None
    uuid: str = ""
    model: str = ""
    model_key: str = ""
    """Short model key (`v100`, `a100`, `h100`, ...); empty means derive it from `model`."""
    memory_mib: int = Field(default=0, ge=0)
    health: Health = "Healthy"
    pci_bus_id: str = ""
    pcie_gen: int | None = Field(default=None, ge=3, le=5)
    """PCIe generation of the GPU's x16 link; None means the model's usual generation."""
    pcie_switch: str | None = None
    numa_node: int = Field(default=0, ge=-1)
    socket: int = Field(default=0, ge=-1)
    nvlink_peers: dict[int, int] = Field(default_factory=dict)
    nvswitch: bool = False


class NICDevice(StrictK8sModel):
    """A network adapter (RDMA or not) and where it sits on the PCIe tree."""

    name: str = Field(min_length=1)
    rdma: bool = True
    health: Health = "Healthy"
    pci_bus_id: str = ""
    pcie_switch: str | None = None
    numa_node: int = Field(default=0, ge=-1)
    socket: int = Field(default=0, ge=-1)
    bandwidth_gbps: float = Field(default=100.0, gt=0)
    """Line rate in Gb/s (bits); the bandwidth model divides by 8."""


class NUMANode(StrictK8sModel):
    id: int = Field(ge=0)
    socket: int = Field(default=0, ge=0)
    cpus: str = ""
    """CPU list as Linux prints it (`0-19,40-59`), informational."""


class PCIeSwitch(StrictK8sModel):
    name: str = Field(min_length=1)
    parent: str | None = None
    """Upstream switch: two devices under switches with a common ancestor are PXB."""
    host_bridge: str | None = None
    """Root complex: two devices under different switch trees of one host bridge are PHB."""
    numa_node: int = Field(default=0, ge=-1)
    socket: int = Field(default=0, ge=-1)


def _check_label(label: str, where: str) -> None:
    if not _LINK_RE.match(label):
        raise ValueError(f"{where}: unknown link {label!r}; allowed: {LINK_LABELS_ALLOWED}")


class NodeTopologySpec(StrictK8sModel):
    preset: str | None = None
    gpus: list[GPUDevice] = Field(default_factory=list)
    nics: list[NICDevice] = Field(default_factory=list)
    sockets: int = Field(default=1, ge=1)
    numa_nodes: list[NUMANode] = Field(default_factory=list)
    pcie_switches: list[PCIeSwitch] = Field(default_factory=list)
    inter_socket_gbps: float | None = Field(default=None, gt=0)
    """Per-direction bandwidth of the SMP link between sockets (GB/s); None means one UPI link."""
    partitions: list[list[int]] | None = None
    """Allowed GPU index sets (H100 shared-NVSwitch mode); None means every set is allowed."""
    partition_policy: PartitionPolicy | None = None
    link_matrix: list[list[str]] | None = None
    """Optional GPU x GPU link labels as `nvidia-smi topo -m` prints them (authoritative)."""
    nic_link_matrix: list[list[str]] | None = None
    """Optional GPU x NIC link labels, rows in GPU order, columns in `nics` order."""

    @field_validator("partitions")
    @classmethod
    def _partitions_are_sets(cls, value: list[list[int]] | None) -> list[list[int]] | None:
        if value is None:
            return None
        for pos, part in enumerate(value):
            if not part:
                raise ValueError(f"partitions[{pos}] is empty; a partition lists at least one GPU index")
            if len(set(part)) != len(part):
                raise ValueError(f"partitions[{pos}] repeats a GPU index: {part}")
        return [sorted(part) for part in value]

    @model_validator(mode="after")
    def _consistent(self) -> NodeTopologySpec:
        n = len(self.gpus)
        for pos, gpu in enumerate(self.gpus):
            if gpu.index != pos:
                raise ValueError(
                    f"gpus[{pos}].index is {gpu.index}; GPUs must be listed in index order 0..{n - 1}"
                )
            for peer, links in gpu.nvlink_peers.items():
                if not 0 <= peer < n or peer == pos:
                    raise ValueError(
                        f"gpus[{pos}].nvlinkPeers has peer {peer}; allowed: another GPU index 0..{n - 1}"
                    )
                if links < 1:
                    raise ValueError(
                        f"gpus[{pos}].nvlinkPeers[{peer}] is {links}; a link count is at least 1"
                    )
                if self.gpus[peer].nvlink_peers.get(pos) != links:
                    raise ValueError(
                        f"gpus[{pos}].nvlinkPeers[{peer}] = {links} but gpus[{peer}].nvlinkPeers[{pos}] = "
                        f"{self.gpus[peer].nvlink_peers.get(pos)}; NVLink counts must be symmetric"
                    )
        names = [nic.name for nic in self.nics]
        if len(set(names)) != len(names):
            raise ValueError(f"nics: duplicate NIC names in {names}")
        switches = {sw.name for sw in self.pcie_switches}
        if len(switches) != len(self.pcie_switches):
            raise ValueError("pcieSwitches: duplicate switch names")
        for sw in self.pcie_switches:
            if sw.parent is not None and sw.parent not in switches:
                raise ValueError(f"pcieSwitches[{sw.name}].parent {sw.parent!r} is not a declared switch")
        self._check_switch_cycles()
        placed: tuple[tuple[str, Sequence[GPUDevice | NICDevice]], ...] = (
            ("gpus", self.gpus),
            ("nics", self.nics),
        )
        for kind, devices in placed:
            for pos, dev in enumerate(devices):
                if dev.pcie_switch is not None and dev.pcie_switch not in switches:
                    raise ValueError(
                        f"{kind}[{pos}].pcieSwitch {dev.pcie_switch!r} is not declared in pcieSwitches "
                        f"(declared: {sorted(switches)})"
                    )
        numa = {node.id: node for node in self.numa_nodes}
        if numa:
            for pos, gpu in enumerate(self.gpus):
                if gpu.numa_node not in numa:
                    raise ValueError(
                        f"gpus[{pos}].numaNode {gpu.numa_node} is not declared in numaNodes {sorted(numa)}"
                    )
                if gpu.socket != numa[gpu.numa_node].socket:
                    raise ValueError(
                        f"gpus[{pos}].socket {gpu.socket} differs from numaNodes[{gpu.numa_node}].socket "
                        f"{numa[gpu.numa_node].socket}"
                    )
        if self.partition_policy is not None and self.partitions is None:
            raise ValueError("partitionPolicy is set but partitions is empty; allowed: set both or neither")
        for pos, part in enumerate(self.partitions or []):
            for idx in part:
                if not 0 <= idx < n:
                    raise ValueError(f"partitions[{pos}] has GPU index {idx}; allowed: 0..{n - 1}")
        self._check_matrices(n)
        return self

    def _check_switch_cycles(self) -> None:
        parents = {sw.name: sw.parent for sw in self.pcie_switches}
        for start in parents:
            seen = {start}
            cur = parents[start]
            while cur is not None:
                if cur in seen:
                    raise ValueError(f"pcieSwitches: the parent chain of {start!r} loops")
                seen.add(cur)
                cur = parents.get(cur)

    def _check_matrices(self, n: int) -> None:
        if self.link_matrix is not None:
            if len(self.link_matrix) != n or any(len(row) != n for row in self.link_matrix):
                raise ValueError(f"linkMatrix must be {n} x {n} (one row and one column per GPU)")
            for i, row in enumerate(self.link_matrix):
                for j, label in enumerate(row):
                    _check_label(label, f"linkMatrix[{i}][{j}]")
                    if (i == j) != (label == "X"):
                        raise ValueError(f"linkMatrix[{i}][{j}] is {label!r}; X appears on the diagonal only")
                    if label != self.link_matrix[j][i]:
                        raise ValueError(
                            f"linkMatrix[{i}][{j}] is {label!r} but linkMatrix[{j}][{i}] is {self.link_matrix[j][i]!r}"
                        )
        if self.nic_link_matrix is not None:
            m = len(self.nics)
            if len(self.nic_link_matrix) != n or any(len(row) != m for row in self.nic_link_matrix):
                raise ValueError(f"nicLinkMatrix must be {n} x {m} (one row per GPU, one column per NIC)")
            for i, row in enumerate(self.nic_link_matrix):
                for j, label in enumerate(row):
                    _check_label(label, f"nicLinkMatrix[{i}][{j}]")
                    if label == "X" or label.startswith("NV"):
                        raise ValueError(
                            f"nicLinkMatrix[{i}][{j}] is {label!r}; allowed: PIX, PXB, PHB, NODE, SYS"
                        )


class NodeTopology(Resource):
    """The device topology of one node (cluster-scoped, named like the node)."""

    KIND = "NodeTopology"
    API_VERSION = "gpuyard.io/v1alpha1"
    NAMESPACED = False

    spec: NodeTopologySpec = Field(default_factory=NodeTopologySpec)

    @property
    def gpu_count(self) -> int:
        return len(self.spec.gpus)

    def nic(self, name: str) -> NICDevice:
        """The NIC called `name`; KeyError naming the known NICs otherwise."""
        for nic in self.spec.nics:
            if nic.name == name:
                return nic
        raise KeyError(
            f"node topology {self.metadata.name!r} has no NIC {name!r}; NICs: {[n.name for n in self.spec.nics]}"
        )
