"""Discover a real node's GPU topology through NVML (the device inventory on a real host).

`discover()` imports `pynvml` (package `nvidia-ml-py`, the `gpuyard[nvml]` extra) lazily, so the
rest of gpuyard never needs the NVIDIA driver; tests inject a fake module with the same
functions. What is read, per GPU:

- name (model), total memory, UUID, minor number, PCI bus id;
- NUMA node: `nvmlDeviceGetNumaNodeId` when the driver has it, else
  `/sys/bus/pci/devices/<bus id>/numa_node`, else 0;
- NVLinks: for every link with `nvmlDeviceGetNvLinkState == enabled`, the remote end from
  `nvmlDeviceGetNvLinkRemotePciInfo`; a remote that is another GPU counts one link to that peer,
  any other remote (an NVSwitch) counts one switch link. GPUs with switch links reach each other
  through NVSwitch with `min(own switch links, peer's switch links)` links, as `nvidia-smi` prints;
- the PCIe tier of every pair from `nvmlDeviceGetTopologyCommonAncestor` (SINGLE -> PIX,
  MULTIPLE -> PXB, HOSTBRIDGE -> PHB, NODE -> NODE, SYSTEM -> SYS; INTERNAL, the two GPUs of one
  board, -> PIX), turned into switches and NUMA nodes by the same code as `nvidia-smi` imports.

NVML does not report NICs: pass them (`nics=`) if the inventory found them elsewhere (`gpuyard
agent` reads them from sysfs, `gpuyard.devices.agent.rdma`).
A GPU whose handle or attributes cannot be read is reported Unhealthy rather than dropped, so GPU
indices stay stable. An optional call the library lacks (an older driver) or that fails is logged
once and skipped. :class:`DiscoveryError` explains what is missing (library, driver, GPUs).
`discover()` opens and closes NVML around one reading; `read_topology()` is the same reading for a
caller that holds NVML open (the agent).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import structlog

from gpuyard.apis.devices import NICDevice, NodeTopology, NodeTopologySpec
from gpuyard.devices.topo_import import topology_from_links

__all__ = ["DiscoveryError", "discover", "load_nvml", "read_topology", "warn_once"]

log = structlog.get_logger(__name__)
_WARNED: set[str] = set()

# NVML constants, used when the module does not define them (values from nvml.h).
_TOPOLOGY = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_FEATURE_ENABLED = 1
_MAX_LINKS = 18


class DiscoveryError(RuntimeError):
    """NVML is unusable here (no library, no driver, no GPUs); the message says which and why."""


def warn_once(key: str, message: str, **fields: Any) -> None:
    """Log `message` the first time `key` is seen in this process (a missing NVML symbol, a call the
    GPU does not support): one clear line, not one per GPU per interval."""
    if key in _WARNED:
        return
    _WARNED.add(key)
    log.warning(message, **fields)


def optional_call(nvml: Any, name: str, *args: Any) -> Any:
    """`nvml.<name>(*args)`, or None when the library lacks the symbol or NVML answers an error
    (logged once per symbol and error)."""
    func = getattr(nvml, name, None)
    if func is None:
        warn_once(f"missing:{name}", "NVML call not available in this driver; skipped", call=name)
        return None
    try:
        return func(*args)
    except nvml.NVMLError as exc:
        warn_once(
            f"error:{name}:{getattr(exc, 'value', exc)}",
            "NVML call failed; skipped",
            call=name,
            error=str(exc),
        )
        return None


def load_nvml() -> ModuleType:
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise DiscoveryError(
            "NVML is not available: install the nvidia-ml-py package (pip install 'gpuyard[nvml]') "
            "on a host with the NVIDIA driver, or use a topology preset / `nvidia-smi topo -m` import instead"
        ) from exc


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus_id(value: Any) -> str:
    """Normalise a PCI bus id to NVML's `00000000:07:00.0` form (upper-case hex)."""
    text = _text(value).strip().upper()
    domain, _, rest = text.rpartition(":")
    domain, _, bus = domain.rpartition(":")
    return f"{int(domain or '0', 16):08X}:{bus}:{rest}"


def _sysfs_numa(bus_id: str, sysfs: Path) -> int | None:
    # sysfs spells the domain with 4 hex digits and lower case: 0000:07:00.0
    domain, bus, rest = bus_id.split(":")
    path = sysfs / f"{int(domain, 16):04x}:{bus.lower()}:{rest.lower()}" / "numa_node"
    try:
        value = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def _numa_node(nvml: Any, handle: Any, bus_id: str, sysfs: Path) -> int | None:
    value = optional_call(nvml, "nvmlDeviceGetNumaNodeId", handle)
    if value is not None and int(value) >= 0:
        return int(value)
    return _sysfs_numa(bus_id, sysfs)


def _nvlinks(nvml: Any, handle: Any) -> list[str]:
    """Bus ids of the remote end of each enabled NVLink of one GPU."""
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", _FEATURE_ENABLED)
    remotes: list[str] = []
    if not hasattr(nvml, "nvmlDeviceGetNvLinkState") or not hasattr(nvml, "nvmlDeviceGetNvLinkRemotePciInfo"):
        warn_once("missing:nvlink", "NVML has no NVLink calls in this driver; NVLinks not read")
        return remotes
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", _MAX_LINKS)):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != enabled:
                continue
            remotes.append(_bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
        except nvml.NVMLError:
            continue  # link index not present on this GPU, or NVLink unsupported
    return remotes


def discover(
    nvml: Any = None,
    *,
    name: str = "localhost",
    nics: Sequence[NICDevice] = (),
    sysfs_pci: str | Path = "/sys/bus/pci/devices",
) -> NodeTopology:
    """Read this host's GPUs, NVLinks and PCIe tree through NVML into a NodeTopology.

    `nvml` is the `pynvml` module (imported lazily when None), or a stand-in for tests.
    """
    nvml = nvml if nvml is not None else load_nvml()
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        raise DiscoveryError(
            f"NVML could not start ({exc}); is the NVIDIA driver installed and loaded?"
        ) from exc
    try:
        return read_topology(nvml, name=name, nics=nics, sysfs_pci=sysfs_pci)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # pragma: no cover - shutdown failure changes nothing we return
            pass


def read_topology(
    nvml: Any,
    *,
    name: str = "localhost",
    nics: Sequence[NICDevice] = (),
    sysfs_pci: str | Path = "/sys/bus/pci/devices",
) -> NodeTopology:
    """Read the topology through an NVML that the caller has initialised (see :func:`discover`)."""
    sysfs = Path(sysfs_pci)
    count = int(nvml.nvmlDeviceGetCount())
    if count == 0:
        raise DiscoveryError("NVML reports no GPUs on this host")
    handles: list[Any] = []
    fields: list[dict[str, Any]] = []
    numa: list[int | None] = []
    for i in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            bus = _bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId)
            info: dict[str, Any] = {
                "model": _text(nvml.nvmlDeviceGetName(handle)).replace(" ", "-"),
                "memory_mib": int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024),
                "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
                "pci_bus_id": bus,
                "minor": int(nvml.nvmlDeviceGetMinorNumber(handle)),
            }
            numa.append(_numa_node(nvml, handle, bus, sysfs))
        except nvml.NVMLError as exc:
            handle, info = None, {"health": "Unhealthy", "model": f"unreadable ({exc})"}
            numa.append(None)
        handles.append(handle)
        fields.append(info)
    index_of_bus = {f["pci_bus_id"]: i for i, f in enumerate(fields) if "pci_bus_id" in f}
    peer_links = [dict.fromkeys(range(count), 0) for _ in range(count)]
    switch_links = [0] * count
    for i, handle in enumerate(handles):
        if handle is None:
            continue
        for remote in _nvlinks(nvml, handle):
            j = index_of_bus.get(remote)
            if j is None:
                switch_links[i] += 1
            elif j != i:
                peer_links[i][j] += 1
    labels = [["X"] * count for _ in range(count)]
    pcie = [["X"] * count for _ in range(count)]
    for i in range(count):
        for j in range(i + 1, count):
            links = max(peer_links[i][j], peer_links[j][i])
            if switch_links[i] and switch_links[j]:
                links += min(switch_links[i], switch_links[j])
            pcie[i][j] = pcie[j][i] = _pcie_label(nvml, handles[i], handles[j])
            labels[i][j] = labels[j][i] = f"NV{links}" if links else pcie[i][j]
    topology = topology_from_links(
        name=name,
        gpu_count=count,
        nic_names=(),
        labels=labels,
        pcie_labels=pcie,
        gpu_numa=numa,
        gpu_fields=fields,
    )
    if nics:  # re-validated: a NIC naming an unknown PCIe switch is an error, not silently kept
        data = topology.spec.model_dump()
        data["nics"] = [nic.model_dump() for nic in nics]
        topology.spec = NodeTopologySpec.model_validate(data)
    return topology


def _pcie_label(nvml: Any, a: Any, b: Any) -> str:
    if a is None or b is None:
        return "SYS"
    level = optional_call(nvml, "nvmlDeviceGetTopologyCommonAncestor", a, b)
    return "SYS" if level is None else _TOPOLOGY.get(int(level), "SYS")
