"""Bandwidth model: GB/s between two GPUs, of a ring all-reduce in a node, and across nodes.

Every figure is per direction and comes from docs/topology.md (which cites its sources):

- NVLink: 25 GB/s per link (V100 NVLink 2.0; A100 12 links = 300 GB/s; H100 18 links = 450 GB/s),
  so an `NV#` pair has `# x 25` GB/s, whether the links are direct or through NVSwitch.
- PCIe x16: Gen3 16, Gen4 32, Gen5 64 GB/s, the slower GPU's generation deciding.
- `SYS` across sockets: also limited by the SMP link, one UPI link = 20.8 GB/s unless the topology
  says otherwise (`spec.inter_socket_gbps`). `SYS` between NUMA nodes of one socket is PCIe-bound.
- NICs: line rate / 8 (100 Gb/s = 12.5 GB/s), limited by the PCIe path to the nearest GPU.

A ring all-reduce is bounded by its slowest hop, so the *ring bandwidth* of a GPU set is the
largest `t` such that the GPUs can be ordered in a cycle whose every hop has at least `t` GB/s.
It is found exactly: for each distinct link bandwidth, highest first, test whether the graph of
links at least that fast has a Hamiltonian cycle (Held-Karp bitmask DP; for all 2^n subsets of an
n <= 8 GPU node at once in :func:`all_ring_bandwidths`). One GPU has no ring: `math.inf`.

Across nodes (:func:`placement_bandwidth`), each node's share is `min(intra-node ring, sum of its
NICs' effective bandwidth)`: NCCL runs one or more channels per NIC and each channel leaves the
node once, so a node's cross-node bus bandwidth is the sum of its NICs (8 x 200 Gb/s measured at
192 GB/s, 4 x EDR at 48, one 100 Gb/s NIC at 12); it is not divided again by the node's GPU count
because bus bandwidth is already a per-GPU figure. The placement's figure is the slowest node's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpuyard.apis.devices import GPUDevice, NICDevice, NodeTopology
from gpuyard.devices.presets import GPU_MODELS, model_key
from gpuyard.devices.tiers import Link, LinkTier, Resolver, gpu_link, nic_link

__all__ = [
    "DEFAULT_PCIE_GEN",
    "EXACT_RING_MAX",
    "HOST_NETWORK_GBPS",
    "NVLINK_GBPS_PER_LINK",
    "PCIE_GBPS",
    "UPI_GBPS",
    "NodeBandwidth",
    "NodeShare",
    "PlacementBandwidth",
    "Ring",
    "all_ring_bandwidths",
    "bandwidth_matrix",
    "best_ring",
    "gpu_pcie_gen",
    "link_gbps",
    "model_key",
    "nic_effective_gbps",
    "placement_bandwidth",
    "ring_bandwidth",
]

NVLINK_GBPS_PER_LINK = 25.0
PCIE_GBPS = {3: 16.0, 4: 32.0, 5: 64.0}
UPI_GBPS = 20.8
HOST_NETWORK_GBPS = 1.25
"""A node with no NIC given to the job: an assumed 10 Gb/s host network (not a measured figure)."""
EXACT_RING_MAX = 12
"""Rings of up to this many GPUs are solved exactly; larger ones by a greedy heuristic."""

DEFAULT_PCIE_GEN: dict[str, int] = {model_key(m.name): m.pcie_gen for m in GPU_MODELS.values()}
"""PCIe generation per model family, from the model table (`presets.GPU_MODELS`)."""


def gpu_pcie_gen(gpu: GPUDevice) -> int:
    """The GPU's PCIe generation: explicit, else the model's usual one, else Gen3."""
    if gpu.pcie_gen is not None:
        return gpu.pcie_gen
    return DEFAULT_PCIE_GEN.get(gpu.model_key or model_key(gpu.model), 3)


def link_gbps(link: Link, *, pcie_gen: int, same_socket: bool, smp_gbps: float = UPI_GBPS) -> float:
    """Per-direction GB/s of one link between two GPUs (or a GPU and a NIC)."""
    if link.tier is LinkTier.X:
        return math.inf
    if link.tier is LinkTier.NV:
        return link.nvlinks * NVLINK_GBPS_PER_LINK
    pcie = PCIE_GBPS[pcie_gen]
    if link.tier is LinkTier.SYS and not same_socket:
        return min(pcie, smp_gbps)
    return pcie


def _same_socket(a: GPUDevice | NICDevice, b: GPUDevice | NICDevice) -> bool:
    return a.socket >= 0 and a.socket == b.socket


def bandwidth_matrix(topology: NodeTopology) -> np.ndarray:
    """n x n float64 array of per-direction GB/s between GPUs (inf on the diagonal)."""
    spec = topology.spec
    n = len(spec.gpus)
    smp = spec.inter_socket_gbps or UPI_GBPS
    res = Resolver(topology)
    gens = [gpu_pcie_gen(g) for g in spec.gpus]
    out = np.full((n, n), math.inf)
    for i in range(n):
        for j in range(i + 1, n):
            link = gpu_link(topology, i, j, resolver=res)
            same = _same_socket(spec.gpus[i], spec.gpus[j])
            out[i, j] = out[j, i] = link_gbps(
                link, pcie_gen=min(gens[i], gens[j]), same_socket=same, smp_gbps=smp
            )
    return out


@dataclass(frozen=True, slots=True)
class Ring:
    """A ring all-reduce order and its bottleneck bandwidth (GB/s per direction)."""

    bandwidth: float
    order: tuple[int, ...]


def _ham_cycle(adj: list[int], k: int) -> list[int] | None:
    """A Hamiltonian cycle through local vertices 0..k-1 (adjacency bit masks), or None."""
    if k <= 2:
        return list(range(k)) if k < 2 or adj[0] & 2 else None
    full = (1 << k) - 1
    if all((adj[v] | (1 << v)) == full for v in range(k)):
        return list(range(k))
    reach = [0] * (full + 1)
    reach[1] = 1
    for mask in range(1, full, 2):
        ends = reach[mask]
        while ends:
            v = (ends & -ends).bit_length() - 1
            ends &= ends - 1
            nxt = adj[v] & ~mask
            while nxt:
                bit = nxt & -nxt
                nxt ^= bit
                reach[mask | bit] |= bit
    ends = reach[full] & adj[0] & ~1
    if not ends:
        return None
    order: list[int] = []
    mask, v = full, (ends & -ends).bit_length() - 1
    while True:
        order.append(v)
        if mask == 1:
            break
        mask ^= 1 << v
        cand = reach[mask] & adj[v]
        v = (cand & -cand).bit_length() - 1
    order.reverse()
    return order


def _greedy_cycle(sub: np.ndarray, t: float) -> list[int] | None:
    """Nearest-neighbour cycle using only links >= t, tried from every start (heuristic)."""
    k = len(sub)
    for start in range(k):
        order, used = [start], {start}
        while len(order) < k:
            cur = order[-1]
            nxt = [j for j in range(k) if j not in used and sub[cur, j] >= t]
            if not nxt:
                break
            best = max(nxt, key=lambda j: (sub[cur, j], -j))
            order.append(best)
            used.add(best)
        if len(order) == k and sub[order[-1], order[0]] >= t:
            return order
    return None


def best_ring(matrix: np.ndarray, gpus: Sequence[int]) -> Ring:
    """The ring over `gpus` with the highest bottleneck hop (exact up to EXACT_RING_MAX GPUs)."""
    members = sorted(set(gpus))
    k = len(members)
    if k == 0:
        raise ValueError("a ring needs at least one GPU")
    if k == 1:
        return Ring(math.inf, tuple(members))
    sub = matrix[np.ix_(members, members)]
    if k == 2:
        return Ring(float(sub[0, 1]), tuple(members))
    values = sorted({float(sub[i, j]) for i in range(k) for j in range(i + 1, k)}, reverse=True)
    for t in values:
        adj = [sum(1 << j for j in range(k) if j != i and sub[i, j] >= t) for i in range(k)]
        order = _ham_cycle(adj, k) if k <= EXACT_RING_MAX else _greedy_cycle(sub, t)
        if order is not None:
            return Ring(t, tuple(members[i] for i in order))
    raise AssertionError("the complete graph always has a ring")  # pragma: no cover


def ring_bandwidth(topology: NodeTopology, gpus: Sequence[int]) -> float:
    """Bottleneck GB/s of the best ring all-reduce over `gpus` inside one node."""
    return best_ring(bandwidth_matrix(topology), gpus).bandwidth


def all_ring_bandwidths(matrix: np.ndarray) -> np.ndarray:
    """Ring bandwidth of every subset mask of an n-GPU node (index = mask; 0 for the empty set).

    One Held-Karp pass per distinct link bandwidth, all subsets at once: `reach[S]` holds the end
    vertices of Hamiltonian paths over S that start at S's lowest GPU; S has a ring at threshold t
    when one of those ends links back to the start.
    """
    n = len(matrix)
    size = 1 << n
    out = np.zeros(size)
    for i in range(n):
        out[1 << i] = math.inf
        for j in range(i + 1, n):
            out[(1 << i) | (1 << j)] = matrix[i, j]
    pending = [m for m in range(size) if m.bit_count() >= 3]
    values = sorted({float(matrix[i, j]) for i in range(n) for j in range(i + 1, n)}, reverse=True)
    for t in values:
        if not pending:
            break
        adj = [sum(1 << j for j in range(n) if j != i and matrix[i, j] >= t) for i in range(n)]
        reach = [0] * size
        for i in range(n):
            reach[1 << i] = 1 << i
        for mask in range(1, size):
            ends = reach[mask]
            if not ends:
                continue
            low = mask & -mask
            above = ~(low | (low - 1)) & ~mask
            while ends:
                v = (ends & -ends).bit_length() - 1
                ends &= ends - 1
                nxt = adj[v] & above
                while nxt:
                    bit = nxt & -nxt
                    nxt ^= bit
                    reach[mask | bit] |= bit
        still = []
        for mask in pending:
            start = (mask & -mask).bit_length() - 1
            if reach[mask] & adj[start]:
                out[mask] = t
            else:
                still.append(mask)
        pending = still
    return out


def nic_effective_gbps(topology: NodeTopology, nic: str, *, gpus: Sequence[int]) -> float:
    """A NIC's GB/s for these GPUs: line rate / 8, limited by the PCIe path to the nearest one."""
    spec = topology.spec
    dev = topology.nic(nic)
    line = dev.bandwidth_gbps / 8.0
    if not gpus:
        return line
    res = Resolver(topology)
    smp = spec.inter_socket_gbps or UPI_GBPS
    path = max(
        link_gbps(
            nic_link(topology, g, nic, resolver=res),
            pcie_gen=gpu_pcie_gen(spec.gpus[g]),
            same_socket=_same_socket(spec.gpus[g], dev),
            smp_gbps=smp,
        )
        for g in gpus
    )
    return min(line, path)


@dataclass(frozen=True, slots=True)
class NodeShare:
    """The part of a placement on one node: its GPUs, the NICs given to the job there.

    `intra_gbps` may carry the ring bandwidth already known (from a subset table) to skip the search.
    """

    topology: NodeTopology
    gpus: tuple[int, ...]
    nics: tuple[str, ...] = ()
    intra_gbps: float | None = None


@dataclass(frozen=True, slots=True)
class NodeBandwidth:
    node: str
    intra_gbps: float
    nic_gbps: float
    gbps: float


@dataclass(frozen=True, slots=True)
class PlacementBandwidth:
    """Modelled all-reduce bus bandwidth of a placement and what limits it."""

    bus_gbps: float
    bottleneck: str
    nodes: tuple[NodeBandwidth, ...]


def placement_bandwidth(
    shares: Sequence[NodeShare], *, fallback_gbps: float = HOST_NETWORK_GBPS
) -> PlacementBandwidth:
    """Ring all-reduce bus bandwidth of a (possibly multi-node) placement; see the module doc."""
    if not shares:
        raise ValueError("a placement needs at least one node share")
    multi = len(shares) > 1
    nodes: list[NodeBandwidth] = []
    for share in shares:
        if not share.gpus:
            raise ValueError(f"node share on {share.topology.metadata.name!r} has no GPUs")
        intra = share.intra_gbps
        if intra is None:
            intra = ring_bandwidth(share.topology, share.gpus)
        nic = math.inf
        if multi:
            nic = sum(nic_effective_gbps(share.topology, name, gpus=share.gpus) for name in share.nics)
            nic = nic or fallback_gbps
        nodes.append(NodeBandwidth(share.topology.metadata.name, intra, nic, min(intra, nic)))
    worst = min(nodes, key=lambda nb: nb.gbps)
    if math.isinf(worst.gbps):
        why = "single GPU: no communication"
    elif worst.gbps == worst.nic_gbps and multi:
        why = f"NICs on node {worst.node!r} ({worst.nic_gbps:g} GB/s)"
    else:
        why = f"intra-node ring on node {worst.node!r} ({worst.intra_gbps:g} GB/s)"
    return PlacementBandwidth(worst.gbps, why, tuple(nodes))
