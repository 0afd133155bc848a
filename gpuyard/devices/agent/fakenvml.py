"""A fake NVML module shaped like a real node, for tests and demos of `gpuyard agent` without a GPU.

:class:`FakeNVML` answers the `pynvml` calls the agent makes (discovery, MIG mode, fabric state,
events) from a :class:`~gpuyard.apis.devices.NodeTopology`, usually a preset:

- `dgx1-v100`: 8x V100 in the hybrid cube mesh (NV1/NV2 links straight to peer GPUs);
- `dgx-a100`: 8x A100, 12 NVLinks per GPU to the NVSwitches;
- `hgx-h100`: 8x H100, 18 NVLinks per GPU to the NVSwitches, fabric state `Completed`.

NVLink remote ends are the peer GPU's bus id (direct links) or a switch bus id (`nvswitch`); the PCIe
common ancestor of two GPUs comes from the topology's switches and NUMA nodes. Faults a test injects:
`inject_xid(i, xid)`, `inject_ecc(i)` (double-bit ECC), `lose_gpu(i)` (every call on that GPU then
fails with NVML_ERROR_GPU_IS_LOST and a waiting event set reports it), `fabric_state(i, state)`,
`fail_init` (nvmlInit raises the given NVML error code) and `missing` (symbols an old driver lacks:
`getattr` raises AttributeError as for a real `pynvml` against an older libnvidia-ml).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from gpuyard.apis.devices import NodeTopology
from gpuyard.devices.presets import get_preset
from gpuyard.devices.tiers import LinkTier, Resolver

__all__ = ["FAKE_SHAPES", "FakeNVML", "FakeNVMLError"]

FAKE_SHAPES = ("dgx1-v100", "dgx-a100", "hgx-h100")

# values from nvml.h (the ones pynvml exports under the same names)
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0
NVML_GPU_FABRIC_STATE_NOT_STARTED = 1
NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2
NVML_GPU_FABRIC_STATE_COMPLETED = 3
_ANCESTOR = {
    LinkTier.PIX: 10,
    LinkTier.PXB: 20,
    LinkTier.PHB: 30,
    LinkTier.NODE: 40,
    LinkTier.SYS: 50,
}


class FakeNVMLError(Exception):
    """Stands in for `pynvml.NVMLError`: `value` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class _Handle:
    index: int


@dataclass
class _Pci:
    busId: str


@dataclass
class _Memory:
    total: int
    free: int
    used: int = 0


@dataclass
class _Event:
    device: _Handle
    eventType: int
    eventData: int


@dataclass
class _Fabric:
    state: int
    status: int = 0
    clusterUuid: bytes = b"\x00" * 16
    cliqueId: int = 0


@dataclass
class _EventSet:
    registered: dict[int, int] = field(default_factory=dict)  # GPU index -> event type mask


class FakeNVML:
    """A `pynvml` stand-in built from a topology (module doc). Thread-safe: the agent waits for
    events in a worker thread while a test injects faults from the event loop."""

    NVMLError = FakeNVMLError
    NVML_FEATURE_ENABLED = 1
    NVML_FEATURE_DISABLED = 0
    NVML_NVLINK_MAX_LINKS = 18
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_GPU_FABRIC_STATE_COMPLETED = NVML_GPU_FABRIC_STATE_COMPLETED
    nvmlEventTypeSingleBitEccError = 1
    nvmlEventTypeDoubleBitEccError = 2
    nvmlEventTypeXidCriticalError = 8

    def __init__(
        self,
        topology: NodeTopology,
        *,
        fabric: bool | None = None,
        missing: Collection[str] = (),
        fail_init: int | None = None,
    ) -> None:
        self._missing = frozenset(missing)
        self.topology = topology
        self.fail_init = fail_init
        self.initialized = 0
        gpus = topology.spec.gpus
        self._lock = threading.Condition()
        self._events: deque[_Event | int] = deque()
        self._lost: set[int] = set()
        self._sets: list[_EventSet] = []
        self._mig: set[int] = set()
        has_switch = any(g.nvswitch for g in gpus)
        self._fabric: dict[int, int] | None = None
        if fabric if fabric is not None else (has_switch and gpus and gpus[0].model_key == "h100"):
            self._fabric = dict.fromkeys(range(len(gpus)), NVML_GPU_FABRIC_STATE_COMPLETED)
        self._links: list[list[str]] = []
        for i, gpu in enumerate(gpus):
            remotes: list[str] = []
            if gpu.nvswitch:
                count = max(gpu.nvlink_peers.values(), default=0)
                remotes = [f"00000000:{0xC0 + link % 6:02X}:00.0" for link in range(count)]
            else:
                for peer, links in sorted(gpu.nvlink_peers.items()):
                    remotes += [gpus[peer].pci_bus_id] * links
            if len(remotes) > self.NVML_NVLINK_MAX_LINKS:
                raise ValueError(f"GPU {i} has {len(remotes)} NVLinks; NVML reports at most 18")
            self._links.append(remotes)
        self._resolver = Resolver(topology)

    @classmethod
    def shaped(cls, preset: str, *, node_name: str | None = None, **kwargs: Any) -> FakeNVML:
        """A fake of preset `preset` (one of FAKE_SHAPES, or any preset)."""
        return cls(get_preset(preset, node_name=node_name), **kwargs)

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml") and name in object.__getattribute__(self, "_missing"):
            raise AttributeError(f"function {name} is not found in this NVML library")
        return object.__getattribute__(self, name)

    # --- faults ---------------------------------------------------------------------------------

    def inject_xid(self, index: int, xid: int) -> None:
        self._push(_Event(_Handle(index), self.nvmlEventTypeXidCriticalError, xid))

    def inject_ecc(self, index: int) -> None:
        self._push(_Event(_Handle(index), self.nvmlEventTypeDoubleBitEccError, 0))

    def lose_gpu(self, index: int) -> None:
        with self._lock:
            self._lost.add(index)
        self._push(index)

    def fabric_state(self, index: int, state: int) -> None:
        if self._fabric is None:
            self._fabric = {}
        self._fabric[index] = state

    def _push(self, event: _Event | int) -> None:
        with self._lock:
            self._events.append(event)
            self._lock.notify_all()

    # --- pynvml calls ---------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.fail_init is not None:
            raise FakeNVMLError(self.fail_init)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self.initialized = max(0, self.initialized - 1)

    def _gpu(self, handle: _Handle) -> Any:
        if not self.initialized:
            raise FakeNVMLError(NVML_ERROR_UNINITIALIZED)
        with self._lock:
            if handle.index in self._lost:
                raise FakeNVMLError(NVML_ERROR_GPU_IS_LOST)
        return self.topology.spec.gpus[handle.index]

    def nvmlDeviceGetCount(self) -> int:
        if not self.initialized:
            raise FakeNVMLError(NVML_ERROR_UNINITIALIZED)
        return len(self.topology.spec.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        handle = _Handle(index)
        self._gpu(handle)
        return handle

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> _Pci:
        return _Pci(self._gpu(handle).pci_bus_id)

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return str(self._gpu(handle).model).replace("-", " ", 1)  # "NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle) -> _Memory:
        total = int(self._gpu(handle).memory_mib) * 1024 * 1024
        return _Memory(total=total, free=total)

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return str(self._gpu(handle).uuid)

    def nvmlDeviceGetMinorNumber(self, handle: _Handle) -> int:
        gpu = self._gpu(handle)
        return int(gpu.minor if gpu.minor is not None else gpu.index)

    def nvmlDeviceGetNumaNodeId(self, handle: _Handle) -> int:
        return int(self._gpu(handle).numa_node)

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        self._gpu(handle)
        if link >= self.NVML_NVLINK_MAX_LINKS:
            raise FakeNVMLError(NVML_ERROR_NOT_SUPPORTED)
        return int(link < len(self._links[handle.index]))

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: _Handle, link: int) -> _Pci:
        self._gpu(handle)
        remotes = self._links[handle.index]
        if link >= len(remotes):
            raise FakeNVMLError(NVML_ERROR_NOT_SUPPORTED)
        return _Pci(remotes[link])

    def nvmlDeviceGetTopologyCommonAncestor(self, a: _Handle, b: _Handle) -> int:
        tier = self._resolver.pcie_tier(self._gpu(a), self._gpu(b))
        return _ANCESTOR.get(tier, 50)

    def enable_mig(self, index: int) -> None:
        self._mig.add(index)

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        self._gpu(handle)
        if self.topology.spec.gpus[handle.index].model_key not in ("a100", "a100-40gb", "h100", "h20"):
            raise FakeNVMLError(NVML_ERROR_NOT_SUPPORTED)
        mode = int(handle.index in self._mig)
        return [mode, mode]

    def nvmlDeviceGetGpuFabricInfoV(self, handle: _Handle) -> _Fabric:
        self._gpu(handle)
        if self._fabric is None or handle.index not in self._fabric:
            raise FakeNVMLError(NVML_ERROR_NOT_SUPPORTED)
        return _Fabric(state=self._fabric[handle.index])

    def nvmlEventSetCreate(self) -> _EventSet:
        if not self.initialized:
            raise FakeNVMLError(NVML_ERROR_UNINITIALIZED)
        event_set = _EventSet()
        self._sets.append(event_set)
        return event_set

    def nvmlDeviceGetSupportedEventTypes(self, handle: _Handle) -> int:
        self._gpu(handle)
        return self.nvmlEventTypeXidCriticalError | self.nvmlEventTypeDoubleBitEccError | 1

    def nvmlDeviceRegisterEvents(self, handle: _Handle, types: int, event_set: _EventSet) -> None:
        self._gpu(handle)
        event_set.registered[handle.index] = types

    def nvmlEventSetWait(self, event_set: _EventSet, timeout_ms: int) -> _Event:
        """The next event for a registered GPU; NVML_ERROR_TIMEOUT after `timeout_ms` without one;
        NVML_ERROR_GPU_IS_LOST once for a GPU that fell off the bus."""
        with self._lock:
            self._lock.wait_for(lambda: bool(self._events), timeout=timeout_ms / 1000)
            while self._events:
                event = self._events.popleft()
                if isinstance(event, int):
                    raise FakeNVMLError(NVML_ERROR_GPU_IS_LOST)
                if event_set.registered.get(event.device.index, 0) & event.eventType:
                    return event
            raise FakeNVMLError(NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        if event_set in self._sets:
            self._sets.remove(event_set)
