"""Discover a real node's GPU topology through NVML (the device inventory on a real host).

`discover()` imports `pynvml` (package `nvidia-ml-py`, the `gpuyard[nvml]` extra) lazily, so the
rest of gpuyard never needs the NVIDIA driver; tests inject a fake module with the same
functions. What is read, per GPU:

- name (model), total memory, UUID, minor number, PCI bus id. The model key comes from the model
  table (`presets.model_key`); a product the table lacks gets a key derived from its name and one
  warning per product, and stays schedulable by its product name;
- NUMA node: `nvmlDeviceGetNumaNodeId` when the driver has it (virtual machines answer Not
  Supported), else `/sys/bus/pci/devices/<bus id>/numa_node`; -1 or nothing means unknown, and GPUs
  of unknown NUMA node with the same CPUs share one node (numbered from 0);
- CPUs near the GPU: `/sys/bus/pci/devices/<bus id>/local_cpulist`, else the CPU list of its NUMA
  node (`/sys/devices/system/node/node<N>/cpulist`), else every online CPU of the machine; a NUMA
  node of a discovered topology never has an empty CPU list;
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
once and skipped. No exception of an NVML call, whatever its type (NVMLError, TypeError from a
binding whose signature changed, AttributeError, ...), escapes a reading: it is logged once and the
reading goes on with what it has; only when not even the GPU count can be read is the answer a
:class:`DiscoveryError`, which the agent retries. :class:`DiscoveryError` explains what is missing (library, driver, GPUs).
`discover()` opens and closes NVML around one reading; `read_topology()` is the same reading for a
caller that holds NVML open (the agent).
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import structlog

from gpuyard.apis.devices import NICDevice, NodeTopology, NodeTopologySpec
from gpuyard.devices.presets import known_model, model_key
from gpuyard.devices.topo_import import topology_from_links

__all__ = [
    "DiscoveryError",
    "discover",
    "expected_answer",
    "load_nvml",
    "machine_cpus",
    "optional_call",
    "read_topology",
    "reset_warnings",
    "warn_once",
]

log = structlog.get_logger(__name__)
_WARNED: set[str] = set()

# NVML constants, used when the module does not define them (values from nvml.h).
_TOPOLOGY = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_FEATURE_ENABLED = 1
_MAX_LINKS = 18
_EXPECTED = (None, 2, 3, 6)  # no code (a stand-in's error), INVALID_ARGUMENT, NOT_SUPPORTED, NOT_FOUND
_CPU_LIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


class DiscoveryError(RuntimeError):
    """NVML is unusable here (no library, no driver, no GPUs); the message says which and why."""


def warn_once(key: str, message: str, **fields: Any) -> None:
    """Log `message` the first time `key` is seen in this process (a missing NVML symbol, a call the
    GPU does not support): one clear line, not one per GPU per interval."""
    if key in _WARNED:
        return
    _WARNED.add(key)
    log.warning(message, **fields)


def _nvml_error(nvml: Any) -> type[BaseException]:
    error = getattr(nvml, "NVMLError", None)
    return error if isinstance(error, type) and issubclass(error, BaseException) else Exception


def expected_answer(nvml: Any, exc: BaseException) -> bool:
    """Whether `exc` is NVML's ordinary "no such thing here" (Not Supported, Invalid Argument for a
    link index past the GPU's last, Not Found), not worth a log line."""
    return isinstance(exc, _nvml_error(nvml)) and getattr(exc, "value", None) in _EXPECTED


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def reset_warnings() -> None:
    """Forget which warnings were given (tests that assert a warning is logged once)."""
    _WARNED.clear()


def optional_call(nvml: Any, name: str, *args: Any) -> Any:
    """`nvml.<name>(*args)`, or None when the library lacks the symbol or the call raises anything
    (logged once per symbol and kind of error)."""
    try:
        func = getattr(nvml, name, None)
    except Exception:  # a module whose attribute lookup itself fails
        func = None
    if func is None:
        warn_once(f"missing:{name}", "NVML call not available in this driver; skipped", call=name)
        return None
    try:
        return func(*args)
    except Exception as exc:
        warn_once(
            f"error:{name}:{type(exc).__name__}:{getattr(exc, 'value', '')}",
            "NVML call failed; skipped",
            call=name,
            error=_describe(exc),
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


def _sysfs_dir(bus_id: str, sysfs: Path) -> Path:
    # sysfs spells the domain with 4 hex digits and lower case: 0000:07:00.0
    domain, bus, rest = bus_id.split(":")
    return sysfs / f"{int(domain, 16):04x}:{bus.lower()}:{rest.lower()}"


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _sysfs_numa(bus_id: str, sysfs: Path) -> int | None:
    value = _read_int(_sysfs_dir(bus_id, sysfs) / "numa_node")
    return value if value is not None and value >= 0 else None


def _numa_node(nvml: Any, handle: Any, bus_id: str, sysfs: Path) -> int | None:
    """The GPU's NUMA node, None when unknown (NVML Not Supported and sysfs -1, as in a VM)."""
    value = optional_call(nvml, "nvmlDeviceGetNumaNodeId", handle)
    try:
        if value is not None and int(value) >= 0:
            return int(value)
    except (TypeError, ValueError):
        pass
    return _sysfs_numa(bus_id, sysfs)


def _cpu_list(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text if _CPU_LIST.match(text) else None


def machine_cpus(sysfs_root: Path = Path("/sys")) -> str:
    """Every CPU this machine has online, as Linux lists them (`0-15`); never empty."""
    online = _cpu_list(sysfs_root / "devices" / "system" / "cpu" / "online")
    if online:
        return online
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = list(range(os.cpu_count() or 1))
    return _ranges(cpus)


def _ranges(cpus: Sequence[int]) -> str:
    out: list[str] = []
    start = prev = cpus[0]
    for cpu in [*cpus[1:], None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(out)


def _gpu_cpus(bus_id: str, numa: int | None, *, sysfs: Path, sysfs_root: Path) -> str:
    """CPUs near a GPU: its PCI function's `local_cpulist`, its NUMA node's, else the machine's."""
    local = _cpu_list(_sysfs_dir(bus_id, sysfs) / "local_cpulist") if bus_id else None
    if local:
        return local
    if numa is not None:
        node = _cpu_list(sysfs_root / "devices" / "system" / "node" / f"node{numa}" / "cpulist")
        if node:
            return node
    return machine_cpus(sysfs_root)


def _nvlinks(nvml: Any, handle: Any) -> list[str]:
    """Bus ids of the remote end of each enabled NVLink of one GPU."""
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", _FEATURE_ENABLED)
    remotes: list[str] = []
    if not hasattr(nvml, "nvmlDeviceGetNvLinkState") or not hasattr(nvml, "nvmlDeviceGetNvLinkRemotePciInfo"):
        warn_once("missing:nvlink", "NVML has no NVLink calls in this driver; NVLinks not read")
        return remotes
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", _MAX_LINKS))):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != enabled:
                continue
            remotes.append(_bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
        except Exception as exc:
            if expected_answer(nvml, exc):
                continue  # link index not present on this GPU, or NVLink unsupported
            warn_once(  # the binding or the GPU failed: the other links would fail alike
                f"error:nvlink:{type(exc).__name__}:{getattr(exc, 'value', '')}",
                "NVML NVLink calls failed; NVLinks of this GPU not read",
                error=_describe(exc),
            )
            break
    return remotes


def discover(
    nvml: Any = None,
    *,
    name: str = "localhost",
    nics: Sequence[NICDevice] = (),
    sysfs_pci: str | Path = "/sys/bus/pci/devices",
    sysfs_root: str | Path | None = None,
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
        return read_topology(nvml, name=name, nics=nics, sysfs_pci=sysfs_pci, sysfs_root=sysfs_root)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # pragma: no cover - shutdown failure changes nothing we return
            pass


def _root_of(sysfs: Path) -> Path:
    """The sysfs root of a `<root>/bus/pci/devices` directory; `/sys` for any other layout."""
    return sysfs.parents[2] if sysfs.parts[-3:] == ("bus", "pci", "devices") else Path("/sys")


def _read_gpu(
    nvml: Any, index: int, *, sysfs: Path, sysfs_root: Path
) -> tuple[Any, dict[str, Any], int | None, str]:
    """One GPU's handle, fields, NUMA node and CPUs; raises whatever NVML raised."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    bus = _bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId)
    product = _text(nvml.nvmlDeviceGetName(handle)).strip()
    model = product.replace(" ", "-")
    if model and not known_model(model):
        warn_once(
            f"model:{model}",
            "GPU model not in the model table; its key is derived from the product name",
            product=product,
            model_key=model_key(model),
        )
    info: dict[str, Any] = {
        "model": model,
        "memory_mib": int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024),
        "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
        "pci_bus_id": bus,
    }
    minor = optional_call(nvml, "nvmlDeviceGetMinorNumber", handle)
    if minor is not None:
        info["minor"] = int(minor)
    numa = _numa_node(nvml, handle, bus, sysfs)
    return handle, info, numa, _gpu_cpus(bus, numa, sysfs=sysfs, sysfs_root=sysfs_root)


def read_topology(
    nvml: Any,
    *,
    name: str = "localhost",
    nics: Sequence[NICDevice] = (),
    sysfs_pci: str | Path = "/sys/bus/pci/devices",
    sysfs_root: str | Path | None = None,
) -> NodeTopology:
    """Read the topology through an NVML that the caller has initialised (see :func:`discover`).

    `sysfs_root` (default: the root above `sysfs_pci`, else `/sys`) is where NUMA nodes' and the
    machine's CPU lists are read.
    """
    sysfs = Path(sysfs_pci)
    root = Path(sysfs_root) if sysfs_root is not None else _root_of(sysfs)
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except Exception as exc:
        raise DiscoveryError(f"NVML could not count the GPUs ({_describe(exc)})") from exc
    if count == 0:
        raise DiscoveryError("NVML reports no GPUs on this host")
    handles: list[Any] = []
    fields: list[dict[str, Any]] = []
    numa: list[int | None] = []
    cpus: list[str] = []
    unreadable: dict[str, list[int]] = {}
    for i in range(count):
        try:
            handle, info, gpu_numa, gpu_cpus = _read_gpu(nvml, i, sysfs=sysfs, sysfs_root=root)
        except Exception as exc:  # lost GPU, or a binding that fails: keep the index, mark it
            unreadable.setdefault(_describe(exc), []).append(i)
            handle, info, gpu_numa, gpu_cpus = None, {"health": "Unhealthy"}, None, machine_cpus(root)
        handles.append(handle)
        fields.append(info)
        numa.append(gpu_numa)
        cpus.append(gpu_cpus)
    for error, gpus in unreadable.items():  # one line per kind of failure, naming its GPUs
        warn_once(f"gpu:{error}", "GPUs unreadable through NVML; reported Unhealthy", gpus=gpus, error=error)
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
        gpu_cpus=cpus,
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
    try:
        return "SYS" if level is None else _TOPOLOGY.get(int(level), "SYS")
    except (TypeError, ValueError):
        return "SYS"
