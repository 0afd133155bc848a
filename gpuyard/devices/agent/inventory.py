"""What the agent knows about its node: the NodeTopology built from NVML + sysfs, a file, or a preset.

One :class:`Inventory` per agent. `read()` builds the node's topology from its source:

- `nvml`: `discovery.read_topology` (GPUs, NVLinks, PCIe tree, NUMA) with NVML held open, then the
  RDMA NICs from sysfs (`rdma.py`), MIG mode and, on NVSwitch systems that report it, the GPU fabric
  state (`nvmlDeviceGetGpuFabricInfoV`): a GPU whose fabric registration has not completed is
  unhealthy (it cannot use NVLink). MIG-enabled GPUs and fabric states are recorded as annotations
  (`gpuyard.io/mig-enabled-gpus`, `gpuyard.io/gpu-fabric`);
- `file`: a NodeTopology YAML or an `nvidia-smi topo -m` capture (`topo_import.import_topology`);
- `preset`: a synthetic preset (`presets.get_preset`).

A partition table may be applied (`partition_policy`: the HGX H100 shared-NVSwitch table for 8x H100
with NVSwitch), and the :class:`~gpuyard.devices.agent.health.HealthBook` overlays what the health
watcher has seen. The result is named like the node and labelled `gpuyard.io/discovered-by`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gpuyard.apis.devices import NodeTopology, PartitionPolicy
from gpuyard.devices.agent.health import HealthBook, HealthEvent
from gpuyard.devices.agent.rdma import place_nics, read_nics
from gpuyard.devices.discovery import DiscoveryError, read_topology
from gpuyard.devices.presets import H100_PARTITIONS, get_preset
from gpuyard.devices.render import from_yaml
from gpuyard.devices.topo_import import import_topology

__all__ = [
    "ANNOTATION_FABRIC",
    "ANNOTATION_MIG",
    "LABEL_DISCOVERED_BY",
    "Inventory",
    "Source",
]

Source = Literal["nvml", "file", "preset"]
LABEL_DISCOVERED_BY = "gpuyard.io/discovered-by"
ANNOTATION_MIG = "gpuyard.io/mig-enabled-gpus"
ANNOTATION_FABRIC = "gpuyard.io/gpu-fabric"
_FABRIC_STATES = {0: "NotSupported", 1: "NotStarted", 2: "InProgress", 3: "Completed"}


def _mig_enabled(nvml: Any, handle: Any) -> bool:
    """MIG mode of one GPU; False where NVML has no MIG call or the GPU is not MIG-capable
    (NOT_SUPPORTED is the normal answer of a V100 or T4, not worth a log line)."""
    get_mode = getattr(nvml, "nvmlDeviceGetMigMode", None)
    if get_mode is None:
        return False
    try:
        current = get_mode(handle)[0]
    except nvml.NVMLError:
        return False
    return int(current) == 1


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
        topology = read_topology(nvml, name=self.node, sysfs_pci=self.sysfs_root / "bus" / "pci" / "devices")
        nics = read_nics(self.sysfs_root)
        if nics:
            topology = place_nics(topology, nics, sysfs_root=self.sysfs_root)
        mig: list[int] = []
        fabric: dict[int, str] = {}
        events: list[HealthEvent] = []
        completed = int(getattr(nvml, "NVML_GPU_FABRIC_STATE_COMPLETED", 3))
        for gpu in topology.spec.gpus:
            if gpu.health != "Healthy":
                events.append(HealthEvent(gpu.index, "unreadable through NVML"))
                continue
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
            except nvml.NVMLError:
                events.append(HealthEvent(gpu.index, "unreadable through NVML"))
                continue
            if _mig_enabled(nvml, handle):
                mig.append(gpu.index)
            if gpu.nvswitch and hasattr(nvml, "nvmlDeviceGetGpuFabricInfoV"):
                try:
                    info = nvml.nvmlDeviceGetGpuFabricInfoV(handle)
                except nvml.NVMLError:
                    continue  # not an NVSwitch fabric NVML reports on (pre-Hopper)
                state = int(info.state)
                fabric[gpu.index] = _FABRIC_STATES.get(state, str(state))
                if state not in (0, completed):
                    events.append(HealthEvent(gpu.index, f"NVSwitch fabric {fabric[gpu.index]}"))
        self.book.record(events, len(topology.spec.gpus))
        if mig:
            topology.metadata.annotations[ANNOTATION_MIG] = ",".join(map(str, mig))
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
