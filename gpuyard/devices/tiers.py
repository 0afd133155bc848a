"""Link tiers between devices, exactly as `nvidia-smi topo -m` labels them, and locality classes.

`nvidia-smi topo -m` prints, for every pair of devices, the "closest" path between them:

    X     the device itself
    NV#   a bonded set of # NVLinks
    PIX   at most one PCIe bridge (same PCIe switch)
    PXB   several PCIe bridges, without the host bridge
    PHB   PCIe and a PCIe host bridge (the CPU's root complex)
    NODE  PCIe and the link between host bridges inside one NUMA node
    SYS   PCIe and the SMP link between NUMA nodes / sockets (QPI/UPI); older drivers print SOC

:class:`Link` is one such label (tier + NVLink count), ordered closest first. A pair is classified
from a :class:`~gpuyard.apis.devices.NodeTopology`: an explicit `link_matrix` wins (imported
topologies), otherwise NVLink peers, then the PCIe switch tree, host bridge, NUMA node and socket.

:class:`Locality` is the scheduler's physical-locality tie-break (same PCIe switch > same PCIe
tree/host bridge > same NUMA node > same socket > cross socket); unlike the label it is defined
for NVLink pairs too, because two NVLinked GPUs still have a PCIe/CPU affinity.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from gpuyard.apis.devices import LINK_LABELS_ALLOWED, GPUDevice, NICDevice, NodeTopology

__all__ = [
    "ALLOWED_LINKS",
    "Link",
    "LinkTier",
    "Locality",
    "Resolver",
    "gpu_link",
    "gpu_locality",
    "link_matrix",
    "locality_matrix",
    "nic_link",
    "nic_link_matrix",
    "parse_link",
]

ALLOWED_LINKS = LINK_LABELS_ALLOWED


class LinkTier(IntEnum):
    """Link tiers, closest first (the order of the `nvidia-smi topo -m` legend, reversed)."""

    X = 0
    NV = 1
    PIX = 2
    PXB = 3
    PHB = 4
    NODE = 5
    SYS = 6


class Locality(IntEnum):
    """Physical locality of a device set, closest first (the subset tables' tie-break)."""

    SWITCH = 0  # all under one PCIe switch (or a single GPU)
    PCIE = 1  # one PCIe switch tree or one host bridge (PXB, PHB)
    NUMA = 2  # one NUMA node (NODE)
    SOCKET = 3  # one socket, several NUMA nodes (SYS inside a socket, e.g. AMD NPS4)
    SYSTEM = 4  # across sockets


@dataclass(frozen=True, slots=True)
class Link:
    """One `nvidia-smi topo -m` cell: a tier, plus the NVLink count for NV#."""

    tier: LinkTier
    nvlinks: int = 0

    @property
    def label(self) -> str:
        if self.tier is LinkTier.NV:
            return f"NV{self.nvlinks}"
        return self.tier.name

    @property
    def rank(self) -> int:
        """Sort key, smaller is closer: X < NV18 < NV12 < NV2 < NV1 < PIX < ... < SYS."""
        return int(self.tier) * 1000 - self.nvlinks

    def __str__(self) -> str:
        return self.label


_FIXED = {tier.name: Link(tier) for tier in LinkTier if tier is not LinkTier.NV}
_FIXED["SOC"] = Link(LinkTier.SYS)


def parse_link(label: str) -> Link:
    """Parse one matrix cell (`X`, `NV2`, `PIX`, ..., legacy `SOC` = `SYS`); ValueError otherwise."""
    text = label.strip()
    found = _FIXED.get(text)
    if found is not None:
        return found
    if text.startswith("NV") and text[2:].isdigit() and int(text[2:]) >= 1 and text[2] != "0":
        return Link(LinkTier.NV, int(text[2:]))
    raise ValueError(f"unknown link {label!r}; allowed: {ALLOWED_LINKS}")


class Resolver:
    """Answers structural questions about one topology (switch roots, PCIe tiers) with caching."""

    __slots__ = ("_host", "_parent", "_roots", "topology")

    def __init__(self, topology: NodeTopology) -> None:
        self.topology = topology
        self._parent = {sw.name: sw.parent for sw in topology.spec.pcie_switches}
        self._host = {sw.name: sw.host_bridge for sw in topology.spec.pcie_switches}
        self._roots: dict[str, str] = {}

    def ancestors(self, switch: str) -> list[str]:
        """The switch itself, then its parent, up to the root of its tree."""
        chain = [switch]
        cur = self._parent.get(switch)
        while cur is not None:
            chain.append(cur)
            cur = self._parent.get(cur)
        return chain

    def root(self, switch: str | None) -> str | None:
        """The top switch of the tree that `switch` belongs to (itself when it has no parent)."""
        if switch is None:
            return None
        found = self._roots.get(switch)
        if found is None:
            found = self.ancestors(switch)[-1]
            self._roots[switch] = found
        return found

    def host_bridge(self, switch: str | None) -> str | None:
        if switch is None:
            return None
        for name in self.ancestors(switch):
            if self._host.get(name) is not None:
                return self._host[name]
        return None

    def pcie_tier(self, a: GPUDevice | NICDevice, b: GPUDevice | NICDevice) -> LinkTier:
        """The PCIe/CPU tier between two devices from the structure alone (ignores NVLink)."""
        sa, sb = a.pcie_switch, b.pcie_switch
        if sa is not None and sb is not None:
            if sa == sb:
                return LinkTier.PIX
            if self.root(sa) == self.root(sb):
                return LinkTier.PXB
            ha = self.host_bridge(sa)
            if ha is not None and ha == self.host_bridge(sb):
                return LinkTier.PHB
        if a.numa_node >= 0 and a.numa_node == b.numa_node:
            return LinkTier.NODE
        return LinkTier.SYS

    def locality(self, a: GPUDevice | NICDevice, b: GPUDevice | NICDevice) -> Locality:
        """Locality of two devices from the structure (defined for NVLink pairs too)."""
        tier = self.pcie_tier(a, b)
        return _sys_locality(a, b) if tier is LinkTier.SYS else _TIER_LOCALITY[tier]


_TIER_LOCALITY = {
    LinkTier.X: Locality.SWITCH,
    LinkTier.PIX: Locality.SWITCH,
    LinkTier.PXB: Locality.PCIE,
    LinkTier.PHB: Locality.PCIE,
    LinkTier.NODE: Locality.NUMA,
}


def _sys_locality(a: GPUDevice | NICDevice, b: GPUDevice | NICDevice) -> Locality:
    if a.socket >= 0 and a.socket == b.socket:
        return Locality.SOCKET
    return Locality.SYSTEM


def gpu_link(topology: NodeTopology, a: int, b: int, *, resolver: Resolver | None = None) -> Link:
    """The link label between GPUs `a` and `b`, as `nvidia-smi topo -m` would print it."""
    spec = topology.spec
    if a == b:
        return _FIXED["X"]
    if spec.link_matrix is not None:
        return parse_link(spec.link_matrix[a][b])
    links = spec.gpus[a].nvlink_peers.get(b, 0)
    if links:
        return Link(LinkTier.NV, links)
    res = resolver or Resolver(topology)
    return _FIXED[res.pcie_tier(spec.gpus[a], spec.gpus[b]).name]


def _nic_index(topology: NodeTopology, nic: int | str) -> int:
    if isinstance(nic, int):
        return nic
    for pos, dev in enumerate(topology.spec.nics):
        if dev.name == nic:
            return pos
    raise KeyError(f"no NIC {nic!r}; NICs: {[d.name for d in topology.spec.nics]}")


def nic_link(topology: NodeTopology, gpu: int, nic: int | str, *, resolver: Resolver | None = None) -> Link:
    """The link label between GPU `gpu` and a NIC (by position in `spec.nics` or by name)."""
    j = _nic_index(topology, nic)
    spec = topology.spec
    if spec.nic_link_matrix is not None:
        return parse_link(spec.nic_link_matrix[gpu][j])
    res = resolver or Resolver(topology)
    return _FIXED[res.pcie_tier(spec.gpus[gpu], spec.nics[j]).name]


def gpu_locality(topology: NodeTopology, a: int, b: int, *, resolver: Resolver | None = None) -> Locality:
    """Locality class of two GPUs: from the explicit label when it is a PCIe tier, else the structure."""
    if a == b:
        return Locality.SWITCH
    spec = topology.spec
    ga, gb = spec.gpus[a], spec.gpus[b]
    if spec.link_matrix is not None:
        link = parse_link(spec.link_matrix[a][b])
        if link.tier is LinkTier.SYS:
            return _sys_locality(ga, gb)
        if link.tier is not LinkTier.NV:
            return _TIER_LOCALITY[link.tier]
    return (resolver or Resolver(topology)).locality(ga, gb)


def link_matrix(topology: NodeTopology) -> list[list[Link]]:
    """Every GPU pair's :class:`Link` (n x n, X on the diagonal)."""
    res = Resolver(topology)
    n = topology.gpu_count
    return [[gpu_link(topology, i, j, resolver=res) for j in range(n)] for i in range(n)]


def nic_link_matrix(topology: NodeTopology) -> list[list[Link]]:
    """Every GPU x NIC :class:`Link` (rows: GPUs, columns: `spec.nics` order)."""
    res = Resolver(topology)
    m = len(topology.spec.nics)
    return [[nic_link(topology, i, j, resolver=res) for j in range(m)] for i in range(topology.gpu_count)]


def locality_matrix(topology: NodeTopology) -> np.ndarray:
    """n x n int8 array of :class:`Locality` values between GPUs (0 on the diagonal)."""
    res = Resolver(topology)
    n = topology.gpu_count
    out = np.zeros((n, n), dtype=np.int8)
    for i in range(n):
        for j in range(i + 1, n):
            out[i, j] = out[j, i] = gpu_locality(topology, i, j, resolver=res)
    return out
