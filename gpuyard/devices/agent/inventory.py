"""What the agent knows about its node: the NodeTopology built from NVML + sysfs, a file, or a preset.

One :class:`Inventory` per agent. `read()` builds the node's topology from its source:

- `nvml`: `discovery.read_topology` (GPUs, NVLinks, PCIe tree, NUMA, CPUs) with NVML held open, then
  the RDMA NICs from sysfs (`rdma.py`), MIG mode and, where NVML reports it, the GPU fabric state:
  `nvmlDeviceGetGpuFabricInfoV(handle, byref(c_nvmlGpuFabricInfoV_t()))` with the struct's `version`
  set (the unversioned `nvmlDeviceGetGpuFabricInfo` on a driver that refuses the version). A GPU
  whose fabric registration has not completed is unhealthy (it cannot use NVLink);
- MIG: a GPU whose current MIG mode is enabled is never handed out whole. Its MIG devices are read
  (`nvmlDeviceGetMaxMigDeviceCount`, `nvmlDeviceGetMigDeviceHandleByIndex`, `nvmlDeviceGetAttributes`)
  and named by profile as NVIDIA's device plugin names them (`1g.10gb`, `1c.3g.40gb`); gpuyard does
  not schedule MIG devices, so the GPU is kept out of the schedulable set (reported Unhealthy) with
  the reason in `gpuyard.io/unhealthy-reasons`, which `gpuyard describe node` prints.
  MIG-enabled GPUs, their devices and fabric states are recorded as annotations
  (`gpuyard.io/mig-enabled-gpus`, `gpuyard.io/mig-devices`, `gpuyard.io/gpu-fabric`);
- `file`: a NodeTopology YAML or an `nvidia-smi topo -m` capture (`topo_import.import_topology`);
- `preset`: a synthetic preset (`presets.get_preset`).

No exception of an NVML call, of any type, escapes `read()` once the GPUs are counted: it is logged
once and what is known is kept. A partition table may be applied (`partition_policy`: the HGX H100 shared-NVSwitch table for 8x H100
with NVSwitch), and the :class:`~gpuyard.devices.agent.health.HealthBook` overlays what the health
watcher has seen. The result is named like the node and labelled `gpuyard.io/discovered-by`.
"""

from __future__ import annotations

import ctypes
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gpuyard.apis.devices import NodeTopology, PartitionPolicy
from gpuyard.devices.agent.health import ANNOTATION_UNHEALTHY_REASONS, HealthBook, HealthEvent
from gpuyard.devices.agent.rdma import place_nics, read_nics
from gpuyard.devices.discovery import DiscoveryError, expected_answer, read_topology, warn_once
from gpuyard.devices.presets import H100_PARTITIONS, get_preset
from gpuyard.devices.render import from_yaml
from gpuyard.devices.topo_import import import_topology

__all__ = [
    "ANNOTATION_FABRIC",
    "ANNOTATION_MIG",
    "ANNOTATION_MIG_DEVICES",
    "LABEL_DISCOVERED_BY",
    "Inventory",
    "Source",
    "mig_profile_name",
]

Source = Literal["nvml", "file", "preset"]
LABEL_DISCOVERED_BY = "gpuyard.io/discovered-by"
ANNOTATION_MIG = "gpuyard.io/mig-enabled-gpus"
ANNOTATION_MIG_DEVICES = "gpuyard.io/mig-devices"
"""NodeTopology annotation: JSON `{gpu index: [MIG profile of each MIG device]}`."""
ANNOTATION_FABRIC = "gpuyard.io/gpu-fabric"
_FABRIC_STATES = {0: "NotSupported", 1: "NotStarted", 2: "InProgress", 3: "Completed"}
_VERSION_MISMATCH = 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
_GPU_FABRIC_INFO_V2 = 0x02000024  # nvmlGpuFabricInfo_v2


def _failed(call: str, exc: BaseException, **fields: Any) -> None:
    warn_once(
        f"error:{call}:{type(exc).__name__}:{getattr(exc, 'value', '')}",
        "NVML call failed; keeping what is known",
        call=call,
        error=f"{type(exc).__name__}: {exc}",
        **fields,
    )


def _mig_enabled(nvml: Any, handle: Any) -> bool:
    """Current MIG mode of one GPU (`nvmlDeviceGetMigMode` answers `[current, pending]`); False
    where NVML has no MIG call or the GPU is not MIG-capable (NOT_SUPPORTED is the normal answer of
    a V100 or T4, not worth a log line)."""
    get_mode = getattr(nvml, "nvmlDeviceGetMigMode", None)
    if get_mode is None:
        return False
    try:
        current = get_mode(handle)[0]
    except Exception as exc:
        if not expected_answer(nvml, exc):
            _failed("nvmlDeviceGetMigMode", exc)
        return False
    return int(current) == int(getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1))


def mig_profile_name(attributes: Any) -> str:
    """The MIG profile of a MIG device's `nvmlDeviceGetAttributes`, named as NVIDIA's device plugin
    names it: `<g>g.<memory in GiB, rounded up>gb`, `<c>c.` in front when its compute instance has
    fewer slices than its GPU instance."""
    gpu = int(attributes.gpuInstanceSliceCount)
    compute = int(attributes.computeInstanceSliceCount)
    gb = math.ceil(int(attributes.memorySizeMB) / 1024)
    name = f"{gpu}g.{gb}gb"
    return name if compute in (0, gpu) else f"{compute}c.{name}"


def _mig_devices(nvml: Any, handle: Any) -> list[str]:
    """Profiles of the MIG devices of a GPU in MIG mode (empty when none were created)."""
    try:
        count = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    except Exception as exc:
        _failed("nvmlDeviceGetMaxMigDeviceCount", exc)
        return []
    out: list[str] = []
    for position in range(count):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, position)
        except Exception as exc:
            if expected_answer(nvml, exc):
                continue  # no MIG device at this index
            _failed("nvmlDeviceGetMigDeviceHandleByIndex", exc)
            break
        try:
            out.append(mig_profile_name(nvml.nvmlDeviceGetAttributes(mig)))
        except Exception as exc:
            _failed("nvmlDeviceGetAttributes", exc)
            out.append("unknown")
    return out


def _fabric_state(nvml: Any, handle: Any) -> int | None:
    """The GPU's NVSwitch fabric state, None where NVML does not report one.

    The real binding fills a structure the caller owns: `nvmlDeviceGetGpuFabricInfoV(handle,
    byref(c_nvmlGpuFabricInfoV_t()))` with `version` set; a driver older than the struct answers
    ARGUMENT_VERSION_MISMATCH and gets the unversioned `nvmlDeviceGetGpuFabricInfo`.
    """
    calls = (
        ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t", True),
        ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t", False),
    )
    for call, struct, versioned in calls:
        func = getattr(nvml, call, None)
        make = getattr(nvml, struct, None)
        if func is None or make is None:
            continue
        try:
            info = make()
            if versioned:
                info.version = int(getattr(nvml, "nvmlGpuFabricInfo_v2", _GPU_FABRIC_INFO_V2))
            func(handle, ctypes.byref(info))
            return int(info.state)
        except Exception as exc:
            if versioned and getattr(exc, "value", None) == _VERSION_MISMATCH:
                continue
            if not expected_answer(nvml, exc):  # NOT_SUPPORTED: pre-Hopper, PCIe boards
                _failed(call, exc)
            return None
    return None


@dataclass
class Inventory:
    """Builds the node's NodeTopology from one source (module doc)."""

    node: str
    source: Source = "nvml"
    nvml: Any = None
    topology_file: Path | None = None
    preset: str | None = None
    sysfs_root: Path = Path("/sys")
    partition_policy: PartitionPolicy | None = None
    book: HealthBook = field(default_factory=HealthBook)

    def read(self) -> NodeTopology:
        """The node's topology now (blocking: NVML and sysfs reads). DiscoveryError when NVML is
        unusable or the file/preset cannot be read."""
        if self.source == "preset":
            if not self.preset:
                raise DiscoveryError("source 'preset' needs a preset name (--preset)")
            topology = get_preset(self.preset, node_name=self.node)
        elif self.source == "file":
            if self.topology_file is None:
                raise DiscoveryError("source 'file' needs a topology file (--topology)")
            try:
                text = self.topology_file.read_text(encoding="utf-8")
                if "kind: NodeTopology" in text or '"kind": "NodeTopology"' in text:
                    topology = from_yaml(text)
                else:
                    topology = import_topology(text, name=self.node)
            except (OSError, ValueError) as exc:
                raise DiscoveryError(f"cannot read topology file {self.topology_file}: {exc}") from exc
            topology.metadata.name = self.node
        else:
            topology = self._from_nvml()
        if self.partition_policy is not None:
            topology = self._partitioned(topology, self.partition_policy)
        topology.metadata.labels[LABEL_DISCOVERED_BY] = self.source
        return self.book.apply(topology)

    def _from_nvml(self) -> NodeTopology:
        nvml = self.nvml
        if nvml is None:
            raise DiscoveryError("source 'nvml' needs NVML (pip install 'gpuyard[agent]' on a GPU host)")
        topology = read_topology(
            nvml,
            name=self.node,
            sysfs_pci=self.sysfs_root / "bus" / "pci" / "devices",
            sysfs_root=self.sysfs_root,
        )
        nics = read_nics(self.sysfs_root)
        if nics:
            topology = place_nics(topology, nics, sysfs_root=self.sysfs_root)
        mig: dict[int, list[str]] = {}
        fabric: dict[int, str] = {}
        events: list[HealthEvent] = []
        completed = int(getattr(nvml, "NVML_GPU_FABRIC_STATE_COMPLETED", 3))
        not_supported = int(getattr(nvml, "NVML_GPU_FABRIC_STATE_NOT_SUPPORTED", 0))
        for gpu in topology.spec.gpus:
            if gpu.health != "Healthy":
                events.append(HealthEvent(gpu.index, "unreadable through NVML"))
                continue
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
            except Exception as exc:
                _failed("nvmlDeviceGetHandleByIndex", exc, gpu=gpu.index)
                events.append(HealthEvent(gpu.index, "unreadable through NVML"))
                continue
            if _mig_enabled(nvml, handle):
                mig[gpu.index] = _mig_devices(nvml, handle)
            state = _fabric_state(nvml, handle)
            if state is not None and state != not_supported:
                fabric[gpu.index] = _FABRIC_STATES.get(state, str(state))
                if state != completed:
                    events.append(HealthEvent(gpu.index, f"NVSwitch fabric {fabric[gpu.index]}"))
        self.book.record(events, len(topology.spec.gpus))
        if mig:
            topology = _keep_out_mig(topology, mig)
        if fabric:
            topology.metadata.annotations[ANNOTATION_FABRIC] = ",".join(
                f"{i}={s}" for i, s in sorted(fabric.items())
            )
        return topology

    @staticmethod
    def _partitioned(topology: NodeTopology, policy: PartitionPolicy) -> NodeTopology:
        spec = topology.spec
        if spec.partitions is None:
            if len(spec.gpus) != 8 or not all(g.nvswitch for g in spec.gpus):
                raise DiscoveryError(
                    "a partition policy needs the node's partition table: known for 8 GPUs on NVSwitch "
                    f"(HGX H100); this node has {len(spec.gpus)} GPUs"
                )
            partitions = [list(p) for p in H100_PARTITIONS]
        else:
            partitions = spec.partitions
        changed = spec.model_copy(update={"partitions": partitions, "partition_policy": policy})
        return topology.model_copy(update={"spec": type(spec).model_validate(changed.model_dump())})


def _keep_out_mig(topology: NodeTopology, mig: dict[int, list[str]]) -> NodeTopology:
    """GPUs in MIG mode leave the schedulable set, each with a reason a person can read."""
    annotations = topology.metadata.annotations
    annotations[ANNOTATION_MIG] = ",".join(map(str, sorted(mig)))
    annotations[ANNOTATION_MIG_DEVICES] = json.dumps(
        {str(i): devices for i, devices in sorted(mig.items())}, separators=(",", ":")
    )
    reasons: dict[str, str] = json.loads(annotations.get(ANNOTATION_UNHEALTHY_REASONS, "{}"))
    for index, devices in mig.items():
        gpu = topology.spec.gpus[index]
        gpu.health = "Unhealthy"
        held = f"MIG devices {', '.join(devices)}" if devices else "no MIG devices created"
        reasons.setdefault(
            str(index), f"MIG mode enabled ({held}); gpuyard hands out whole GPUs only, so it is kept out"
        )
    annotations[ANNOTATION_UNHEALTHY_REASONS] = json.dumps(
        dict(sorted(reasons.items(), key=lambda kv: int(kv[0]))), separators=(",", ":")
    )
    return topology
