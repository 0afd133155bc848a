"""Synthetic node topologies of well-known GPU servers, for the fake cluster, demos and tests.

Each preset reproduces the link tiers of the real machine (`nvidia-smi topo -m`) closely enough
for the scheduler's decisions; `dgx1-v100` reproduces the published DGX-1 matrix exactly (see
tests/data/topo/dgx1-v100-1.txt). Presets:

- `dgx1-v100`: 8x V100 SXM2 in the hybrid cube mesh (NV1/NV2), 4 PCIe switches each with 2 GPUs
  and one 100 Gb/s EDR NIC, two switches per host bridge, 2 sockets (QPI).
- `dgx-a100`: 8x A100 SXM4 on NVSwitch (NV12 everywhere); 4 PCIe switches each with 2 GPUs and
  2 HDR 200 Gb/s RDMA NICs; 2 sockets / NUMA nodes.
- `hgx-h100`: 8x H100 SXM5 on NVSwitch (NV18); one 400 Gb/s ConnectX-7 per GPU under the GPU's
  PCIe switch; the vendor's shared-NVSwitch partition table (policy Honor by default).
- `pcie-t4x4`: 4x T4 on two PCIe switches of one host bridge, one 25 Gb/s Ethernet NIC (no RDMA).
- `k80`: 4 K80 boards = 8 GPUs, each board's two GPUs behind its on-board switch; 2 sockets; one
  56 Gb/s FDR RDMA NIC on socket 0's host bridge.
- `p100`: 8x P100 PCIe, 4 per socket under one PCIe switch each, one 100 Gb/s NIC per switch.

`get_preset` builds a fresh object each call; callers may change it (health, names) freely.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gpuyard.apis.devices import (
    GPUDevice,
    NICDevice,
    NodeTopology,
    NodeTopologySpec,
    NUMANode,
    PartitionPolicy,
    PCIeSwitch,
)
from gpuyard.apis.meta import ObjectMeta

__all__ = [
    "GPU_FAMILIES",
    "GPU_MODELS",
    "PRESETS",
    "PRESET_MODELS",
    "GPUModel",
    "get_preset",
    "known_model",
    "model_key",
]

QPI_GBPS = 19.2  # Broadwell/Haswell-era sockets (DGX-1, K80 and P100 servers)


@dataclass(frozen=True, slots=True)
class GPUModel:
    """A GPU model as presets use it: short key, product name, memory, PCIe gen, NVLinks per GPU."""

    key: str
    name: str
    memory_mib: int
    pcie_gen: int
    nvlinks: int


# The one table of GPU models: product names as GPU feature discovery labels them (NVML's name with
# spaces as dashes), and memory as the fake cluster's node labels advertise it (the fake cluster reads
# this table too). Memory is the board's nominal size in MiB, except where NVML's figure on a real board
# is known (H200: 143,771 MiB). A key with a suffix (`a100-40gb`, `h100-nvl`) is a variant of the family
# that :func:`model_key` returns for it (`a100`, `h100`).
GPU_MODELS: dict[str, GPUModel] = {
    "k80": GPUModel("k80", "Tesla-K80", 12 * 1024, 3, 0),
    "p4": GPUModel("p4", "Tesla-P4", 8 * 1024, 3, 0),
    "p40": GPUModel("p40", "Tesla-P40", 24 * 1024, 3, 0),
    "p100": GPUModel("p100", "Tesla-P100-PCIE-16GB", 16 * 1024, 3, 0),
    "v100": GPUModel("v100", "Tesla-V100-SXM2-32GB", 32 * 1024, 3, 6),
    "v100-16gb": GPUModel("v100-16gb", "Tesla-V100-SXM2-16GB", 16 * 1024, 3, 6),
    "t4": GPUModel("t4", "Tesla-T4", 15 * 1024, 3, 0),
    "a2": GPUModel("a2", "NVIDIA-A2", 16 * 1024, 4, 0),
    "a10": GPUModel("a10", "NVIDIA-A10", 24 * 1024, 4, 0),
    "a10g": GPUModel("a10g", "NVIDIA-A10G", 24 * 1024, 4, 0),
    "a16": GPUModel("a16", "NVIDIA-A16", 16 * 1024, 4, 0),
    "a30": GPUModel("a30", "NVIDIA-A30", 24 * 1024, 4, 4),
    "a40": GPUModel("a40", "NVIDIA-A40", 48 * 1024, 4, 4),
    "a100": GPUModel("a100", "NVIDIA-A100-SXM4-80GB", 80 * 1024, 4, 12),
    "a100-40gb": GPUModel("a100-40gb", "NVIDIA-A100-SXM4-40GB", 40 * 1024, 4, 12),
    "a100-pcie": GPUModel("a100-pcie", "NVIDIA-A100-80GB-PCIe", 80 * 1024, 4, 12),
    "a100-pcie-40gb": GPUModel("a100-pcie-40gb", "NVIDIA-A100-PCIE-40GB", 40 * 1024, 4, 12),
    "a800": GPUModel("a800", "NVIDIA-A800-SXM4-80GB", 80 * 1024, 4, 8),
    "a800-pcie": GPUModel("a800-pcie", "NVIDIA-A800-80GB-PCIe", 80 * 1024, 4, 8),
    "l4": GPUModel("l4", "NVIDIA-L4", 24 * 1024, 4, 0),
    "l20": GPUModel("l20", "NVIDIA-L20", 48 * 1024, 4, 0),
    "l40": GPUModel("l40", "NVIDIA-L40", 48 * 1024, 4, 0),
    "l40s": GPUModel("l40s", "NVIDIA-L40S", 45 * 1024, 4, 0),
    "h100": GPUModel("h100", "NVIDIA-H100-80GB-HBM3", 80 * 1024, 5, 18),
    "h100-pcie": GPUModel("h100-pcie", "NVIDIA-H100-PCIe", 80 * 1024, 5, 12),
    "h100-nvl": GPUModel("h100-nvl", "NVIDIA-H100-NVL", 94 * 1024, 5, 12),
    "h800": GPUModel("h800", "NVIDIA-H800", 80 * 1024, 5, 8),
    "h20": GPUModel("h20", "NVIDIA-H20", 96 * 1024, 5, 18),
    "h200": GPUModel("h200", "NVIDIA-H200", 143771, 5, 18),
    "h200-nvl": GPUModel("h200-nvl", "NVIDIA-H200-NVL", 141 * 1024, 5, 18),
    "gh200": GPUModel("gh200", "NVIDIA-GH200-480GB", 96 * 1024, 5, 18),
    "b200": GPUModel("b200", "NVIDIA-B200", 180 * 1024, 5, 18),
    "gb200": GPUModel("gb200", "NVIDIA-GB200", 186 * 1024, 5, 18),
    "b300": GPUModel("b300", "NVIDIA-B300-SXM6-AC", 270 * 1024, 5, 18),
    "gb300": GPUModel("gb300", "NVIDIA-GB300", 279 * 1024, 5, 18),
}

# Model families, the keys `model_key` returns: longest first where one is a prefix of another
# (GB200 before B200 is kept apart by the word boundary; L40S before L40, A10G before A10).
GPU_FAMILIES: tuple[str, ...] = tuple(
    sorted({key.split("-")[0] for key in GPU_MODELS}, key=lambda k: (-len(k), k))
)
_FAMILY_RE = re.compile(
    r"(?<![A-Za-z0-9])(" + "|".join(GPU_FAMILIES) + r")(?![0-9])",
    re.IGNORECASE,
)
_VENDOR_WORDS = ("nvidia", "tesla")
_SLUG_RE = re.compile(r"[^a-z0-9]+")


def known_model(product: str) -> bool:
    """Whether `product` (an NVML or GPU feature discovery name) names a family of the table."""
    return bool(product) and _FAMILY_RE.search(product) is not None


def model_key(product: str) -> str:
    """Short, stable model key of a GPU product name; "" for an empty name.

    A family of the table is found wherever it stands in the name (`Tesla-V100-SXM2-32GB` -> `v100`,
    `NVIDIA H200` -> `h200`, `NVIDIA GB200` -> `gb200`). A name the table lacks gets a slug of itself
    without the vendor words (`NVIDIA-Foo X1` -> `foo-x1`), so one product always has one key and a
    ResourceClass can still select it by its product label.
    """
    match = _FAMILY_RE.search(product)
    if match:
        return match.group(1).lower()
    words = [w for w in _SLUG_RE.split(product.lower()) if w]
    rest = [w for w in words if w not in _VENDOR_WORDS] or words
    return "-".join(rest)[:63].strip("-")


PRESET_MODELS: dict[str, str] = {
    "dgx1-v100": "v100",
    "dgx-a100": "a100",
    "hgx-h100": "h100",
    "pcie-t4x4": "t4",
    "k80": "k80",
    "p100": "p100",
}
PRESETS: tuple[str, ...] = tuple(PRESET_MODELS)

# DGX-1 hybrid cube mesh, exactly as in the published `nvidia-smi topo -m` (NV1 / NV2 pairs).
DGX1_NVLINKS: dict[tuple[int, int], int] = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2,
    (1, 2): 2, (1, 3): 1, (1, 5): 2,
    (2, 3): 2, (2, 6): 1,
    (3, 7): 1,
    (4, 5): 1, (4, 6): 1, (4, 7): 2,
    (5, 6): 2, (5, 7): 1,
    (6, 7): 2,
}  # fmt: skip

H100_PARTITIONS: list[list[int]] = (
    [[i] for i in range(8)]
    + [[0, 1], [2, 3], [4, 5], [6, 7]]
    + [[0, 1, 2, 3], [4, 5, 6, 7]]
    + [list(range(8))]
)

_KEEP: Any = object()


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where everything sits: per GPU (switch, numa), switches, NICs, sockets."""

    gpu_switch: tuple[str | None, ...]
    gpu_numa: tuple[int, ...]
    numa_socket: Mapping[int, int]
    numa_cpus: Mapping[int, str]
    switches: tuple[PCIeSwitch, ...]
    nics: tuple[tuple[str, str | None, int, float, bool], ...]  # name, switch, numa, Gb/s, rdma
    nvlinks: Mapping[tuple[int, int], int]
    nvswitch: bool = False
    inter_socket_gbps: float | None = None


def _switch(name: str, numa: int, socket: int, *, host_bridge: str | None = None) -> PCIeSwitch:
    return PCIeSwitch(name=name, host_bridge=host_bridge, numa_node=numa, socket=socket)


def _all_pairs(n: int, links: int) -> dict[tuple[int, int], int]:
    return {(i, j): links for i in range(n) for j in range(i + 1, n)}


def _layout(preset: str) -> _Layout:
    two_sockets = {0: 0, 1: 1}
    if preset == "dgx1-v100":
        return _Layout(
            gpu_switch=tuple(f"pcie{i // 2}" for i in range(8)),
            gpu_numa=tuple(i // 4 for i in range(8)),
            numa_socket=two_sockets,
            numa_cpus={0: "0-19,40-59", 1: "20-39,60-79"},
            switches=tuple(_switch(f"pcie{s}", s // 2, s // 2, host_bridge=f"hb{s // 2}") for s in range(4)),
            nics=tuple((f"mlx5_{s}", f"pcie{s}", s // 2, 100.0, True) for s in range(4)),
            nvlinks=DGX1_NVLINKS,
            inter_socket_gbps=QPI_GBPS,
        )
    if preset == "dgx-a100":
        return _Layout(
            gpu_switch=tuple(f"pcie{i // 2}" for i in range(8)),
            gpu_numa=tuple(i // 4 for i in range(8)),
            numa_socket=two_sockets,
            numa_cpus={0: "0-63,128-191", 1: "64-127,192-255"},
            switches=tuple(_switch(f"pcie{s}", s // 2, s // 2) for s in range(4)),
            nics=tuple((f"mlx5_{i}", f"pcie{i // 2}", i // 4, 200.0, True) for i in range(8)),
            nvlinks=_all_pairs(8, 12),
            nvswitch=True,
        )
    if preset == "hgx-h100":
        return _Layout(
            gpu_switch=tuple(f"pcie{i}" for i in range(8)),
            gpu_numa=tuple(i // 4 for i in range(8)),
            numa_socket=two_sockets,
            numa_cpus={0: "0-55,112-167", 1: "56-111,168-223"},
            switches=tuple(_switch(f"pcie{s}", s // 4, s // 4) for s in range(8)),
            nics=tuple((f"mlx5_{i}", f"pcie{i}", i // 4, 400.0, True) for i in range(8)),
            nvlinks=_all_pairs(8, 18),
            nvswitch=True,
        )
    if preset == "pcie-t4x4":
        return _Layout(
            gpu_switch=("pcie0", "pcie0", "pcie1", "pcie1"),
            gpu_numa=(0, 0, 0, 0),
            numa_socket={0: 0},
            numa_cpus={0: "0-31"},
            switches=(_switch("pcie0", 0, 0, host_bridge="hb0"), _switch("pcie1", 0, 0, host_bridge="hb0")),
            nics=(("eth0", None, 0, 25.0, False),),
            nvlinks={},
        )
    if preset == "k80":
        return _Layout(
            gpu_switch=tuple(f"pcie{i // 2}" for i in range(8)),
            gpu_numa=tuple(i // 4 for i in range(8)),
            numa_socket=two_sockets,
            numa_cpus={0: "0-11,24-35", 1: "12-23,36-47"},
            switches=tuple(_switch(f"pcie{b}", b // 2, b // 2, host_bridge=f"hb{b // 2}") for b in range(4)),
            nics=(("mlx4_0", None, 0, 56.0, True),),
            nvlinks={},
            inter_socket_gbps=QPI_GBPS,
        )
    if preset == "p100":
        return _Layout(
            gpu_switch=tuple(f"pcie{i // 4}" for i in range(8)),
            gpu_numa=tuple(i // 4 for i in range(8)),
            numa_socket=two_sockets,
            numa_cpus={0: "0-13,28-41", 1: "14-27,42-55"},
            switches=(_switch("pcie0", 0, 0), _switch("pcie1", 1, 1)),
            nics=(("mlx5_0", "pcie0", 0, 100.0, True), ("mlx5_1", "pcie1", 1, 100.0, True)),
            nvlinks={},
            inter_socket_gbps=QPI_GBPS,
        )
    raise ValueError(f"unknown topology preset {preset!r}; allowed: {', '.join(PRESETS)}")


def get_preset(
    name: str,
    *,
    node_name: str | None = None,
    partition_policy: PartitionPolicy | None = _KEEP,
    unhealthy: Collection[int] = (),
) -> NodeTopology:
    """A fresh NodeTopology of preset `name` (one of PRESETS).

    `node_name` names the object (default: the preset name) and seeds the GPUs' UUIDs;
    `partition_policy` overrides the preset's (only `hgx-h100` has partitions: Honor);
    `unhealthy` lists GPU indices to mark Unhealthy.
    """
    layout = _layout(name)
    model = GPU_MODELS[PRESET_MODELS[name]]
    node = node_name or name
    n = len(layout.gpu_switch)
    bad = set(unhealthy)
    if not bad <= set(range(n)):
        raise ValueError(f"unhealthy GPU indices {sorted(bad - set(range(n)))} out of range 0..{n - 1}")
    peers: list[dict[int, int]] = [{} for _ in range(n)]
    for (a, b), links in layout.nvlinks.items():
        peers[a][b] = links
        peers[b][a] = links
    gpus = [
        GPUDevice(
            index=i,
            minor=i,
            uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'gpuyard/{node}/{i}')}",
            model=model.name,
            model_key=model.key,
            memory_mib=model.memory_mib,
            health="Unhealthy" if i in bad else "Healthy",
            pci_bus_id=f"00000000:{0x07 + 0x10 * i:02X}:00.0",
            pcie_gen=model.pcie_gen,
            pcie_switch=layout.gpu_switch[i],
            numa_node=layout.gpu_numa[i],
            socket=layout.numa_socket[layout.gpu_numa[i]],
            nvlink_peers=peers[i],
            nvswitch=layout.nvswitch,
        )
        for i in range(n)
    ]
    nics = [
        NICDevice(
            name=nic_name,
            rdma=rdma,
            pcie_switch=switch,
            pci_bus_id=f"00000000:{0x0C + 0x10 * pos:02X}:00.0",
            numa_node=numa,
            socket=layout.numa_socket[numa],
            bandwidth_gbps=gbps,
        )
        for pos, (nic_name, switch, numa, gbps, rdma) in enumerate(layout.nics)
    ]
    partitions = [list(p) for p in H100_PARTITIONS] if name == "hgx-h100" else None
    policy: PartitionPolicy | None = "Honor" if partitions else None
    if partition_policy is not _KEEP:
        policy = partition_policy
    if policy is None:
        partitions = None
    elif partitions is None:
        raise ValueError(f"preset {name!r} has no partition table; partition_policy must be None")
    spec = NodeTopologySpec(
        preset=name,
        gpus=gpus,
        nics=nics,
        sockets=len(set(layout.numa_socket.values())),
        numa_nodes=[
            NUMANode(id=numa, socket=sock, cpus=layout.numa_cpus.get(numa, ""))
            for numa, sock in layout.numa_socket.items()
        ],
        pcie_switches=list(layout.switches),
        inter_socket_gbps=layout.inter_socket_gbps,
        partitions=partitions,
        partition_policy=policy,
    )
    return NodeTopology(
        metadata=ObjectMeta(name=node, labels={"gpuyard.io/topology-preset": name}), spec=spec
    )
