"""A fake NVML module shaped like a real node, for tests and demos of `gpuyard agent` without a GPU.

:class:`FakeNVML` answers the `pynvml` calls the agent makes (discovery, MIG, fabric state, events)
from a :class:`~gpuyard.apis.devices.NodeTopology`, usually a preset:

- `dgx1-v100`: 8x V100 in the hybrid cube mesh (NV1/NV2 links straight to peer GPUs);
- `dgx-a100`: 8x A100, 12 NVLinks per GPU to the NVSwitches;
- `hgx-h100`: 8x H100, 18 NVLinks per GPU to the NVSwitches, fabric state `Completed`.

It is held to the real binding (`nvidia-ml-py`'s `pynvml`, checked against 13.615):
every `nvml*` function takes the real parameters under the real names and answers the real shape
(tests/unit/devices/agent/test_fakenvml_signatures.py binds each one against
`inspect.signature` of the real function). In particular `nvmlDeviceGetGpuFabricInfo[V](device,
gpuFabricInfo)` fills a caller's `c_nvmlGpuFabricInfo[V]_t` passed by reference (`ctypes.byref`)
and returns NVML_SUCCESS, and the V variant refuses a struct whose `version` it does not know, as
libnvidia-ml does. Handles compare by identity, like the real ctypes pointers: the device in an
event is not `==` to the handle `nvmlDeviceGetHandleByIndex` gave.

NVLink remote ends are the peer GPU's bus id (direct links) or a switch bus id (`nvswitch`); the PCIe
common ancestor of two GPUs comes from the topology's switches and NUMA nodes. Faults a test injects:
`inject_xid(i, xid)`, `inject_ecc(i)` (double-bit ECC), `lose_gpu(i)` (every call on that GPU then
fails with NVML_ERROR_GPU_IS_LOST and a waiting event set reports it), `fabric_state(i, state)`,
`enable_mig(i, profiles)` (MIG mode with those instances), `fail_init` (nvmlInit raises the given NVML
error code), `missing` (symbols an old binding lacks: `getattr` raises AttributeError) and
`raise_on(name, exc)` (every call of `name` raises `exc`, of any type: a driver error, or the
TypeError a changed signature gives).
"""

from __future__ import annotations

import ctypes
import functools
import re
import threading
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuyard.apis.devices import NodeTopology
from gpuyard.devices.presets import get_preset, model_key
from gpuyard.devices.tiers import LinkTier, Resolver

__all__ = ["FAKE_SHAPES", "MIG_FAMILIES", "FakeNVML", "FakeNVMLError"]

FAKE_SHAPES = ("dgx1-v100", "dgx-a100", "hgx-h100")
MIG_FAMILIES = frozenset(
    {"a30", "a100", "a800", "h100", "h800", "h20", "h200", "gh200", "b200", "gb200", "b300", "gb300"}
)
"""Model families with MIG (NVIDIA's MIG user guide); the others answer Not Supported."""

# values from nvml.h (the ones pynvml exports under the same names)
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0
NVML_GPU_FABRIC_STATE_NOT_STARTED = 1
NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2
NVML_GPU_FABRIC_STATE_COMPLETED = 3
NVML_GPU_FABRIC_UUID_LEN = 16
nvmlGpuFabricInfo_v2 = 0x02000024
nvmlGpuFabricInfo_v3 = 0x3000028
_PHYSICAL_LINKS = 18  # no GPU has more NVLinks than this (H100, H200, B200)
_MAX_MIG_DEVICES = 7
_PROFILE_RE = re.compile(r"^(?:(\d+)c\.)?(\d+)g\.(\d+)gb$")
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


# --- the structures the real binding defines (same fields, same names) ---------------------------


class c_nvmlGpuFabricInfo_t(ctypes.Structure):
    _fields_ = [
        ("clusterUuid", ctypes.c_uint8 * NVML_GPU_FABRIC_UUID_LEN),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
    ]


class c_nvmlGpuFabricInfo_v2_t(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_uint8 * NVML_GPU_FABRIC_UUID_LEN),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
        ("healthMask", ctypes.c_uint32),
    ]

    def __init__(self) -> None:
        super().__init__(version=nvmlGpuFabricInfo_v2)


class c_nvmlDeviceAttributes(ctypes.Structure):
    _fields_ = [
        ("multiprocessorCount", ctypes.c_uint),
        ("sharedCopyEngineCount", ctypes.c_uint),
        ("sharedDecoderCount", ctypes.c_uint),
        ("sharedEncoderCount", ctypes.c_uint),
        ("sharedJpegCount", ctypes.c_uint),
        ("sharedOfaCount", ctypes.c_uint),
        ("gpuInstanceSliceCount", ctypes.c_uint),
        ("computeInstanceSliceCount", ctypes.c_uint),
        ("memorySizeMB", ctypes.c_ulonglong),
    ]


c_nvmlGpuFabricInfoV_t = c_nvmlGpuFabricInfo_v2_t
_Attributes = c_nvmlDeviceAttributes


@dataclass(eq=False)
class _Handle:
    """A device handle; compares by identity like the real `c_nvmlDevice_t` pointers."""

    index: int


@dataclass(eq=False)
class _MigHandle:
    parent: int
    position: int


@dataclass
class _Pci:
    busId: str
    busIdLegacy: str = ""
    domain: int = 0
    bus: int = 0
    device: int = 0
    pciDeviceId: int = 0
    pciSubSystemId: int = 0


@dataclass
class _Memory:
    total: int
    free: int
    used: int = 0
    version: int = 0
    reserved: int = 0


@dataclass
class _Event:
    device: _Handle
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass(eq=False)
class _EventSet:
    registered: dict[int, int] = field(default_factory=dict)  # GPU index -> event type mask


@dataclass(frozen=True)
class _MigInstance:
    profile: str
    gpu_slices: int
    compute_slices: int
    memory_mb: int


def _mig_instance(profile: str) -> _MigInstance:
    match = _PROFILE_RE.match(profile)
    if not match:
        raise ValueError(f"MIG profile {profile!r}: expected like '1g.10gb' or '1c.3g.40gb'")
    gpu = int(match.group(2))
    compute = int(match.group(1) or gpu)
    gb = int(match.group(3))
    return _MigInstance(profile, gpu, compute, gb * 1024 - 128)  # NVML's sizes sit just under the GB


def _struct_of(ref: Any) -> Any:
    """The structure behind `ctypes.byref(s)` or `ctypes.pointer(s)`; None for anything else (a
    struct passed by value reaches libnvidia-ml as garbage, not as a pointer)."""
    obj = getattr(ref, "_obj", None)
    if isinstance(obj, ctypes.Structure):
        return obj
    if isinstance(ref, ctypes._Pointer) and isinstance(ref.contents, ctypes.Structure):
        return ref.contents
    return None


class FakeNVML:
    """A `pynvml` stand-in built from a topology (module doc). Thread-safe: the agent waits for
    events in a worker thread while a test injects faults from the event loop."""

    NVMLError = FakeNVMLError
    NVML_SUCCESS = NVML_SUCCESS
    NVML_FEATURE_ENABLED = 1
    NVML_FEATURE_DISABLED = 0
    NVML_NVLINK_MAX_LINKS = 36
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_ERROR_UNINITIALIZED = NVML_ERROR_UNINITIALIZED
    NVML_ERROR_INVALID_ARGUMENT = NVML_ERROR_INVALID_ARGUMENT
    NVML_ERROR_NOT_FOUND = NVML_ERROR_NOT_FOUND
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_FUNCTION_NOT_FOUND = NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
    NVML_GPU_FABRIC_STATE_NOT_STARTED = NVML_GPU_FABRIC_STATE_NOT_STARTED
    NVML_GPU_FABRIC_STATE_IN_PROGRESS = NVML_GPU_FABRIC_STATE_IN_PROGRESS
    NVML_GPU_FABRIC_STATE_COMPLETED = NVML_GPU_FABRIC_STATE_COMPLETED
    NVML_GPU_FABRIC_UUID_LEN = NVML_GPU_FABRIC_UUID_LEN
    nvmlGpuFabricInfo_v2 = nvmlGpuFabricInfo_v2
    nvmlGpuFabricInfo_v3 = nvmlGpuFabricInfo_v3
    nvmlEventTypeSingleBitEccError = 1
    nvmlEventTypeDoubleBitEccError = 2
    nvmlEventTypeXidCriticalError = 8
    c_nvmlGpuFabricInfo_t = c_nvmlGpuFabricInfo_t
    c_nvmlGpuFabricInfo_v2_t = c_nvmlGpuFabricInfo_v2_t
    c_nvmlGpuFabricInfoV_t = c_nvmlGpuFabricInfoV_t
    c_nvmlDeviceAttributes = c_nvmlDeviceAttributes

    def __init__(
        self,
        topology: NodeTopology,
        *,
        fabric: bool | None = None,
        missing: Collection[str] = (),
        fail_init: int | None = None,
    ) -> None:
        self._missing = frozenset(missing)
        self._raise: dict[str, BaseException | type[BaseException]] = {}
        self.topology = topology
        self.fail_init = fail_init
        self.initialized = 0
        gpus = topology.spec.gpus
        self._lock = threading.Condition()
        self._events: deque[_Event | int] = deque()
        self._lost: set[int] = set()
        self._sets: list[_EventSet] = []
        self._mig: dict[int, list[_MigInstance]] = {}
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
            if len(remotes) > _PHYSICAL_LINKS:
                raise ValueError(
                    f"GPU {i} has {len(remotes)} NVLinks; no GPU has more than {_PHYSICAL_LINKS}"
                )
            self._links.append(remotes)
        self._resolver = Resolver(topology)

    @classmethod
    def shaped(cls, preset: str, *, node_name: str | None = None, **kwargs: Any) -> FakeNVML:
        """A fake of preset `preset` (one of FAKE_SHAPES, or any preset)."""
        return cls(get_preset(preset, node_name=node_name), **kwargs)

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml"):
            if name in object.__getattribute__(self, "_missing"):
                raise AttributeError(f"function {name} is not found in this NVML library")
            failure = object.__getattribute__(self, "_raise").get(name)
            if failure is not None:
                real = object.__getattribute__(self, name)

                @functools.wraps(real)
                def failing(*args: Any, **kwargs: Any) -> Any:
                    raise failure

                return failing
        return object.__getattribute__(self, name)

    # --- faults ---------------------------------------------------------------------------------

    def raise_on(self, name: str, exc: BaseException | type[BaseException] | None) -> None:
        """Every call of `name` raises `exc` from now on (None: answers normally again)."""
        if exc is None:
            self._raise.pop(name, None)
        else:
            self._raise[name] = exc

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

    def enable_mig(self, index: int, profiles: Sequence[str] = ()) -> None:
        """GPU `index` in MIG mode with these instances (`1g.10gb`, `3g.40gb`, `1c.3g.40gb`, ...);
        a GPU whose model has no MIG still answers Not Supported."""
        self._mig[index] = [_mig_instance(p) for p in profiles]

    def _push(self, event: _Event | int) -> None:
        with self._lock:
            self._events.append(event)
            self._lock.notify_all()

    # --- helpers ----------------------------------------------------------------------------------

    def _gpu(self, handle: Any) -> Any:
        if not self.initialized:
            raise FakeNVMLError(NVML_ERROR_UNINITIALIZED)
        if not isinstance(handle, _Handle) or not 0 <= handle.index < len(self.topology.spec.gpus):
            raise FakeNVMLError(NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            if handle.index in self._lost:
                raise FakeNVMLError(NVML_ERROR_GPU_IS_LOST)
        return self.topology.spec.gpus[handle.index]

    def _mig_capable(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        if (gpu.model_key or model_key(gpu.model)).split("-")[0] not in MIG_FAMILIES:
            raise FakeNVMLError(NVML_ERROR_NOT_SUPPORTED)
        return int(handle.index)

    def _mig_instance(self, handle: Any) -> _MigInstance:
        if not isinstance(handle, _MigHandle):
            raise FakeNVMLError(NVML_ERROR_INVALID_ARGUMENT)
        parent = self._mig_capable(_Handle(handle.parent))
        instances = self._mig.get(parent, [])
        if handle.position >= len(instances):
            raise FakeNVMLError(NVML_ERROR_NOT_FOUND)
        return instances[handle.position]

    # --- pynvml calls (the real names, parameters and answers) -----------------------------------

    def nvmlInit(self) -> None:
        if self.fail_init is not None:
            raise FakeNVMLError(self.fail_init)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        if not self.initialized:
            raise FakeNVMLError(NVML_ERROR_UNINITIALIZED)
        self.initialized -= 1

    def nvmlDeviceGetCount(self) -> int:
        if not self.initialized:
            raise FakeNVMLError(NVML_ERROR_UNINITIALIZED)
        return len(self.topology.spec.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        handle = _Handle(int(index))
        self._gpu(handle)
        return handle

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> _Pci:
        bus_id = str(self._gpu(handle).pci_bus_id)
        parts = bus_id.split(":")
        bus = int(parts[1], 16) if len(parts) == 3 else 0
        return _Pci(busId=bus_id, busIdLegacy=bus_id[4:], bus=bus)

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return str(self._gpu(handle).model).replace("-", " ", 1)  # "NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> _Memory:
        total = int(self._gpu(handle).memory_mib) * 1024 * 1024
        return _Memory(total=total, free=total, version=version or 0)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if isinstance(handle, _MigHandle):
            self._mig_instance(handle)
            return f"MIG-{self.topology.spec.gpus[handle.parent].uuid[4:]}-{handle.position}"
        return str(self._gpu(handle).uuid)

    def nvmlDeviceGetMinorNumber(self, handle: _Handle) -> int:
        gpu = self._gpu(handle)
        return int(gpu.minor if gpu.minor is not None else gpu.index)

    def nvmlDeviceGetNumaNodeId(self, handle: _Handle) -> int:
        return int(self._gpu(handle).numa_node)

    def nvmlDeviceGetNvLinkState(self, device: _Handle, link: int) -> int:
        self._gpu(device)
        if not 0 <= link < _PHYSICAL_LINKS:
            raise FakeNVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return int(link < len(self._links[device.index]))

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: _Handle, link: int) -> _Pci:
        self._gpu(device)
        remotes = self._links[device.index]
        if not 0 <= link < _PHYSICAL_LINKS:
            raise FakeNVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if link >= len(remotes):
            raise FakeNVMLError(NVML_ERROR_NOT_SUPPORTED)
        return _Pci(busId=remotes[link])

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: _Handle, device2: _Handle) -> int:
        tier = self._resolver.pcie_tier(self._gpu(device1), self._gpu(device2))
        return _ANCESTOR.get(tier, 50)

    def nvmlDeviceGetMigMode(self, device: _Handle) -> list[int]:
        index = self._mig_capable(device)
        mode = int(index in self._mig)
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: _Handle) -> int:
        index = self._mig_capable(device)
        return _MAX_MIG_DEVICES if index in self._mig else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: _Handle, index: int) -> _MigHandle:
        parent = self._mig_capable(device)
        if parent not in self._mig:
            raise FakeNVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if not 0 <= index < _MAX_MIG_DEVICES:
            raise FakeNVMLError(NVML_ERROR_INVALID_ARGUMENT)
        handle = _MigHandle(parent, int(index))
        self._mig_instance(handle)
        return handle

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> ctypes.c_uint:
        if isinstance(device, _MigHandle):
            self._mig_instance(device)
            return ctypes.c_uint(1)  # the real binding returns the c_uint itself, not its value
        self._gpu(device)
        return ctypes.c_uint(0)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: _MigHandle) -> _Handle:
        self._mig_instance(migDevice)
        return _Handle(migDevice.parent)

    def nvmlDeviceGetGpuInstanceId(self, device: _MigHandle) -> int:
        self._mig_instance(device)
        return int(device.position)

    def nvmlDeviceGetComputeInstanceId(self, device: _MigHandle) -> int:
        self._mig_instance(device)
        return 0

    def nvmlDeviceGetAttributes(self, device: _MigHandle) -> _Attributes:
        """Attributes of a MIG device (NVML answers them for MIG device handles only)."""
        if not isinstance(device, _MigHandle):
            self._gpu(device)
            raise FakeNVMLError(NVML_ERROR_NOT_SUPPORTED)
        inst = self._mig_instance(device)
        return c_nvmlDeviceAttributes(
            multiprocessorCount=14 * inst.compute_slices,
            gpuInstanceSliceCount=inst.gpu_slices,
            computeInstanceSliceCount=inst.compute_slices,
            memorySizeMB=inst.memory_mb,
        )

    def _fill_fabric(self, device: _Handle, gpuFabricInfo: Any, *, versioned: bool) -> int:
        self._gpu(device)
        info = _struct_of(gpuFabricInfo)
        if info is None:
            raise FakeNVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if versioned and getattr(info, "version", None) not in (nvmlGpuFabricInfo_v2, nvmlGpuFabricInfo_v3):
            raise FakeNVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if self._fabric is None or device.index not in self._fabric:
            raise FakeNVMLError(NVML_ERROR_NOT_SUPPORTED)
        info.state = self._fabric[device.index]
        info.status = NVML_SUCCESS
        info.cliqueId = 1
        for pos in range(NVML_GPU_FABRIC_UUID_LEN):
            info.clusterUuid[pos] = 0x10 + pos
        return NVML_SUCCESS

    def nvmlDeviceGetGpuFabricInfo(self, device: _Handle, gpuFabricInfo: Any) -> int:
        """Fills the `c_nvmlGpuFabricInfo_t` the caller passes by reference; NVML_SUCCESS."""
        return self._fill_fabric(device, gpuFabricInfo, versioned=False)

    def nvmlDeviceGetGpuFabricInfoV(self, device: _Handle, gpuFabricInfo: Any) -> int:
        """Fills the versioned `c_nvmlGpuFabricInfoV_t` the caller passes by reference."""
        return self._fill_fabric(device, gpuFabricInfo, versioned=True)

    def nvmlEventSetCreate(self) -> _EventSet:
        if not self.initialized:
            raise FakeNVMLError(NVML_ERROR_UNINITIALIZED)
        event_set = _EventSet()
        self._sets.append(event_set)
        return event_set

    def nvmlDeviceGetSupportedEventTypes(self, handle: _Handle) -> int:
        self._gpu(handle)
        return self.nvmlEventTypeXidCriticalError | self.nvmlEventTypeDoubleBitEccError | 1

    def nvmlDeviceRegisterEvents(self, handle: _Handle, eventTypes: int, eventSet: _EventSet) -> None:
        self._gpu(handle)
        eventSet.registered[handle.index] = int(eventTypes)

    def nvmlEventSetWait(self, eventSet: _EventSet, timeoutms: int) -> _Event:
        """The next event for a registered GPU; NVML_ERROR_TIMEOUT after `timeoutms` without one;
        NVML_ERROR_GPU_IS_LOST once for a GPU that fell off the bus."""
        with self._lock:
            self._lock.wait_for(lambda: bool(self._events), timeout=timeoutms / 1000)
            while self._events:
                event = self._events.popleft()
                if isinstance(event, int):
                    raise FakeNVMLError(NVML_ERROR_GPU_IS_LOST)
                if eventSet.registered.get(event.device.index, 0) & event.eventType:
                    return event
            raise FakeNVMLError(NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, eventSet: _EventSet) -> None:
        if eventSet in self._sets:
            self._sets.remove(eventSet)
