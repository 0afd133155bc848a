"""RDMA NICs from sysfs, and where they sit relative to the GPUs (the agent's NIC discovery).

NVML does not see NICs. Linux lists RDMA devices under `/sys/class/infiniband/<name>` (`mlx5_0`,
...); `device` links to the PCI function, whose resolved path is the chain of PCI bridges from the
root complex down (`/sys/devices/pci0000:00/0000:00:01.0/0000:02:00.0/0000:03:08.0/0000:07:00.0`),
and whose `numa_node` file holds the NUMA node (-1 unknown). The line rate is the first port's
`ports/1/rate` (`200 Gb/sec (4X HDR)`).

:func:`read_nics` turns that into `NICDevice`s; :func:`place_nics` gives each NIC the PCIe switch of
the GPU it shares the deepest bridge chain with (at least the root port and one switch port: the
same PCIe switch tree), so joint GPU + NIC selection (`SamePCIe`) works on discovered nodes. The
root (`/sys`) is a parameter: tests build a small tree in a temporary directory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuyard.apis.devices import NICDevice, NodeTopology, NodeTopologySpec

__all__ = ["SysfsNIC", "pci_chain", "place_nics", "read_nics"]

_BDF = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_RATE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")


@dataclass(frozen=True, slots=True)
class SysfsNIC:
    """One RDMA device as sysfs shows it."""

    name: str
    pci_bus_id: str
    """sysfs form, `0000:0c:00.0`."""
    chain: tuple[str, ...]
    """PCI functions from the root port down to the NIC itself."""
    numa_node: int
    gbps: float


def _read(path: Path, default: str = "") -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return default


def pci_chain(device_dir: Path) -> tuple[str, ...]:
    """The PCI bus ids on the resolved path of a sysfs PCI device directory, root port first."""
    parts = Path(os.path.realpath(device_dir)).parts
    return tuple(p.lower() for p in parts if _BDF.match(p))


def read_nics(sysfs_root: str | Path = "/sys") -> list[SysfsNIC]:
    """The RDMA devices under `<root>/class/infiniband`, sorted by name; none when the directory
    is missing (no RDMA stack on this host)."""
    base = Path(sysfs_root) / "class" / "infiniband"
    if not base.is_dir():
        return []
    out = []
    for entry in sorted(base.iterdir(), key=lambda p: p.name):
        device = entry / "device"
        chain = pci_chain(device) if device.exists() else ()
        numa = _read(device / "numa_node", "-1")
        rate = _RATE.match(_read(entry / "ports" / "1" / "rate"))
        out.append(
            SysfsNIC(
                name=entry.name,
                pci_bus_id=chain[-1] if chain else "",
                chain=chain,
                numa_node=int(numa) if numa.lstrip("-").isdigit() else -1,
                gbps=float(rate.group(1)) if rate else 100.0,
            )
        )
    return out


def _nvml_bus(sysfs_bus: str) -> str:
    domain, bus, rest = sysfs_bus.split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}"


def _sysfs_bus(nvml_bus: str) -> str:
    domain, bus, rest = nvml_bus.split(":")
    return f"{int(domain, 16):04x}:{bus.lower()}:{rest.lower()}"


def place_nics(
    topology: NodeTopology, nics: Sequence[SysfsNIC], *, sysfs_root: str | Path = "/sys"
) -> NodeTopology:
    """`topology` with `nics` added: each under the PCIe switch of the GPU it shares the deepest
    bridge chain with (two or more common bridges), else under no switch; NUMA node and socket from
    sysfs and the topology's NUMA nodes. Re-validated (a NIC may not name an unknown switch)."""
    spec = topology.spec
    pci = Path(sysfs_root) / "bus" / "pci" / "devices"
    gpu_chains = [pci_chain(pci / _sysfs_bus(g.pci_bus_id)) if g.pci_bus_id else () for g in spec.gpus]
    socket_of = {n.id: n.socket for n in spec.numa_nodes}
    devices = []
    for nic in nics:
        best, depth = None, 1
        for gpu, chain in zip(spec.gpus, gpu_chains, strict=True):
            common = 0
            for a, b in zip(chain[:-1], nic.chain[:-1], strict=False):
                if a != b:
                    break
                common += 1
            if common > depth:
                best, depth = gpu, common
        numa = nic.numa_node if nic.numa_node >= 0 or best is None else best.numa_node
        if spec.numa_nodes and numa not in socket_of:
            numa = -1
        devices.append(
            NICDevice(
                name=nic.name,
                rdma=True,
                pci_bus_id=_nvml_bus(nic.pci_bus_id) if nic.pci_bus_id else "",
                pcie_switch=best.pcie_switch if best is not None else None,
                numa_node=numa,
                socket=socket_of.get(numa, -1) if numa >= 0 else -1,
                bandwidth_gbps=nic.gbps,
            )
        )
    changed = spec.model_copy(update={"nics": devices, "nic_link_matrix": None})
    return topology.model_copy(update={"spec": NodeTopologySpec.model_validate(changed.model_dump())})
