"""The fake NVMLs are held to the real `nvidia-ml-py`: every `nvml*` function they define takes the
real function's parameters (names, kinds, defaults) and answers its shape, their constants and
structures are the real ones, and every call the agent makes during discovery, MIG and fabric
reading and health watching binds against the real signature. (The fake once shared the agent's
one-argument `nvmlDeviceGetGpuFabricInfoV`; the real one takes `(device, gpuFabricInfo)`.)"""

from __future__ import annotations

import ctypes
import dataclasses
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpuyard.devices.agent.fakenvml import FAKE_SHAPES, FakeNVML
from gpuyard.devices.agent.health import EventWatcher, HealthBook
from gpuyard.devices.agent.inventory import Inventory

from ..test_discovery import _quad

FAKES: dict[str, Callable[[], Any]] = {
    "agent FakeNVML": lambda: FakeNVML.shaped("hgx-h100"),
    "discovery test FakeNVML": _quad,
}


def _functions(fake: Any) -> list[str]:
    return sorted(n for n in dir(type(fake)) if n.startswith("nvml") and callable(getattr(type(fake), n)))


def _shape(sig: inspect.Signature) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


@pytest.mark.parametrize("which", list(FAKES))
def test_every_fake_function_has_the_real_signature(which: str) -> None:
    fake = FAKES[which]()
    names = _functions(fake)
    assert "nvmlDeviceGetHandleByIndex" in names
    wrong = {}
    for name in names:
        real = getattr(pynvml, name, None)
        assert real is not None, f"{name} is not a function of the real pynvml"
        fake_sig, real_sig = inspect.signature(getattr(fake, name)), inspect.signature(real)
        if _shape(fake_sig) != _shape(real_sig):
            wrong[name] = (str(fake_sig), str(real_sig))
    assert not wrong, f"fake vs real signatures differ: {wrong}"


def test_the_signature_check_catches_the_old_fabric_call() -> None:
    """The check above fails on the signature the fake and the agent once shared."""

    def nvmlDeviceGetGpuFabricInfoV(handle: Any) -> Any:
        return None

    old = _shape(inspect.signature(nvmlDeviceGetGpuFabricInfoV))
    assert old != _shape(inspect.signature(pynvml.nvmlDeviceGetGpuFabricInfoV))
    with pytest.raises(TypeError):
        inspect.signature(pynvml.nvmlDeviceGetGpuFabricInfoV).bind(object())


def test_constants_and_structures_are_the_real_ones() -> None:
    fake = FakeNVML.shaped("dgx-a100")
    constants = [
        n
        for n in dir(FakeNVML)
        if (n.startswith(("NVML_", "nvmlEventType", "nvmlGpuFabricInfo_v")))
        and not callable(getattr(FakeNVML, n))
    ]
    assert "NVML_NVLINK_MAX_LINKS" in constants and "nvmlGpuFabricInfo_v2" in constants
    assert {n: getattr(fake, n) for n in constants} == {n: getattr(pynvml, n) for n in constants}
    for name in ("c_nvmlGpuFabricInfo_t", "c_nvmlGpuFabricInfoV_t", "c_nvmlDeviceAttributes"):
        mine, real = getattr(fake, name), getattr(pynvml, name)
        assert [f[0] for f in mine._fields_] == [f[0] for f in real._fields_], name
        assert ctypes.sizeof(mine) == ctypes.sizeof(real), name
    assert fake.c_nvmlGpuFabricInfoV_t().version == pynvml.c_nvmlGpuFabricInfoV_t().version


def _fields(obj: Any) -> set[str]:
    if dataclasses.is_dataclass(obj):
        return {f.name for f in dataclasses.fields(obj)}
    return {f[0] for f in type(obj)._fields_}


def _real_fields(*structs: Any) -> set[str]:
    return {f[0] for s in structs for f in s._fields_}


def test_answers_have_the_real_shape() -> None:
    fake = FakeNVML.shaped("hgx-h100")
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(fake.nvmlDeviceGetName(handle), str)  # convertStrBytes: str, not bytes
    assert isinstance(fake.nvmlDeviceGetUUID(handle), str)
    assert _fields(fake.nvmlDeviceGetPciInfo(handle)) <= _real_fields(pynvml.nvmlPciInfo_t)
    assert isinstance(fake.nvmlDeviceGetPciInfo(handle).busId, str)
    memory = fake.nvmlDeviceGetMemoryInfo(handle)
    assert _fields(memory) <= _real_fields(pynvml.c_nvmlMemory_t, pynvml.c_nvmlMemory_v2_t)
    mode = fake.nvmlDeviceGetMigMode(handle)
    assert type(mode) is list and [type(m) for m in mode] == [int, int]
    info = fake.c_nvmlGpuFabricInfoV_t()
    assert fake.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info)) == pynvml.NVML_SUCCESS
    assert info.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED and info.cliqueId == 1
    with pytest.raises(FakeNVML.NVMLError) as by_value:  # a struct by value is no pointer to NVML
        fake.nvmlDeviceGetGpuFabricInfoV(handle, info)
    assert by_value.value.value == pynvml.NVML_ERROR_INVALID_ARGUMENT
    stale = fake.c_nvmlGpuFabricInfoV_t()
    stale.version = 1
    with pytest.raises(FakeNVML.NVMLError) as mismatch:
        fake.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(stale))
    assert mismatch.value.value == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    fake.enable_mig(1, ["3g.40gb"])
    mig = fake.nvmlDeviceGetMigDeviceHandleByIndex(fake.nvmlDeviceGetHandleByIndex(1), 0)
    assert isinstance(fake.nvmlDeviceGetAttributes(mig), pynvml.c_nvmlDeviceAttributes.__mro__[1])
    assert _fields(fake.nvmlDeviceGetAttributes(mig)) == _real_fields(pynvml.c_nvmlDeviceAttributes)
    assert isinstance(fake.nvmlDeviceIsMigDeviceHandle(mig), ctypes.c_uint)
    events = fake.nvmlEventSetCreate()
    fake.nvmlDeviceRegisterEvents(handle, fake.nvmlEventTypeXidCriticalError, events)
    fake.inject_xid(0, 79)
    event = fake.nvmlEventSetWait(events, 100)
    assert _fields(event) == _real_fields(pynvml.c_nvmlEventData_t)
    assert event.device is not handle and event.device != handle  # handles are pointers: identity only
    fake.nvmlShutdown()


class Recorder:
    """Passes every `nvml*` call to a fake and records its arguments."""

    def __init__(self, fake: FakeNVML) -> None:
        self._fake = fake
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._fake, name)
        if not (name.startswith("nvml") and callable(value)):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            return value(*args, **kwargs)

        return call


@pytest.mark.parametrize("shape", FAKE_SHAPES)
def test_every_call_the_agent_makes_binds_against_the_real_signature(shape: str) -> None:
    fake = FakeNVML.shaped(shape, node_name="n1")
    fake.enable_mig(0, ["1g.10gb", "3g.40gb"])
    nvml = Recorder(fake)
    nvml.nvmlInit()
    topology = Inventory(node="n1", nvml=nvml, sysfs_root=Path("no-such-sysfs")).read()
    watcher = EventWatcher(nvml, len(topology.spec.gpus), HealthBook())
    fake.inject_xid(3, 79)
    assert [e.index for e in watcher.wait(0.5)] == [3]
    assert watcher.wait(0.01) == []
    watcher.close()
    nvml.nvmlShutdown()
    called = {name for name, _, _ in nvml.calls}
    assert {"nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetMigMode", "nvmlEventSetWait"} <= called
    for name, args, kwargs in nvml.calls:
        inspect.signature(getattr(pynvml, name)).bind(*args, **kwargs)  # TypeError on a wrong call
