"""NVML discovery against a fake `pynvml` module (no driver needed)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import structlog
from pydantic import ValidationError

from gpuyard.apis.devices import NICDevice
from gpuyard.devices import GPU_MODELS, DiscoveryError, discover, gpu_link, pick_gpus, table_for

MiB = 1024 * 1024


class NVMLError(Exception):
    pass


@dataclass
class FakeNVML:
    """Enough of pynvml for discovery: GPUs by bus id, NVLink remotes, common ancestors, NUMA."""

    names: list[str]
    buses: list[str]
    numa: list[int]
    nvlinks: dict[int, list[str]]  # GPU -> remote bus id per enabled link
    ancestor: dict[frozenset[int], int]
    broken: set[int] = field(default_factory=set)
    count_override: int | None = None
    init_error: Exception | None = None
    calls: list[str] = field(default_factory=list)

    NVMLError = NVMLError
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 12

    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.init_error
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.names) if self.count_override is None else self.count_override

    # the real pynvml's parameter names and answers (str, not bytes: its convertStrBytes decodes)
    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index in self.broken:
            raise NVMLError("GPU is lost")
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self.names[handle]

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> Any:
        return SimpleNamespace(total=32768 * MiB, used=0, free=32768 * MiB)

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-fake-{handle}"

    def nvmlDeviceGetMinorNumber(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetPciInfo(self, handle: int) -> Any:
        return SimpleNamespace(busId=self.buses[handle])

    def nvmlDeviceGetNumaNodeId(self, handle: int) -> int:
        return self.numa[handle]

    def nvmlDeviceGetNvLinkState(self, device: int, link: int) -> int:
        if link >= len(self.nvlinks.get(device, [])):
            raise NVMLError("invalid argument")
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: int, link: int) -> Any:
        return SimpleNamespace(busId=self.nvlinks[device][link])

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: int, device2: int) -> int:
        return self.ancestor[frozenset((device1, device2))]


def _quad() -> FakeNVML:
    """4 V100s: 0-1 and 2-3 on one switch each, NV2 0-1, NV1 0-2 and 1-3; two NUMA nodes."""
    buses = [f"0000:{b:02x}:00.0" for b in (0x06, 0x07, 0x86, 0x87)]
    wire = [f"00000000:{b:02X}:00.0" for b in (0x06, 0x07, 0x86, 0x87)]
    return FakeNVML(
        names=["Tesla V100-SXM2-32GB"] * 4,
        buses=buses,
        numa=[0, 0, 1, 1],
        nvlinks={0: [wire[1], wire[1], wire[2]], 1: [wire[0], wire[0], wire[3]], 2: [wire[0]], 3: [wire[1]]},
        ancestor={
            frozenset((0, 1)): 10,
            frozenset((2, 3)): 10,
            frozenset((0, 2)): 50,
            frozenset((0, 3)): 50,
            frozenset((1, 2)): 50,
            frozenset((1, 3)): 50,
        },
    )


def test_discovers_gpus_links_and_switches() -> None:
    nvml = _quad()
    topo = discover(nvml, name="host1")
    spec = topo.spec
    assert topo.metadata.name == "host1"
    assert nvml.calls == ["init", "shutdown"]
    assert [g.model for g in spec.gpus] == ["Tesla-V100-SXM2-32GB"] * 4
    assert spec.gpus[0].model_key == "v100" and spec.gpus[0].memory_mib == 32768
    assert spec.gpus[2].uuid == "GPU-fake-2" and spec.gpus[2].pci_bus_id == "00000000:86:00.0"
    assert spec.gpus[0].nvlink_peers == {1: 2, 2: 1}
    assert [gpu_link(topo, 0, j).label for j in range(4)] == ["X", "NV2", "NV1", "SYS"]
    assert gpu_link(topo, 2, 3).label == "PIX"
    assert spec.gpus[2].pcie_switch == spec.gpus[3].pcie_switch is not None
    assert spec.gpus[0].pcie_switch == spec.gpus[1].pcie_switch is not None  # PIX although NVLinked
    assert [g.numa_node for g in spec.gpus] == [0, 0, 1, 1]
    assert spec.sockets == 2
    assert pick_gpus(table_for(topo), 0b1111, 2) == (0, 1)


def test_nvswitch_links_become_nv_all_pairs() -> None:
    nvml = _quad()
    nvml.nvlinks = {i: ["00000000:C1:00.0"] * 12 for i in range(4)}  # every link to an NVSwitch
    topo = discover(nvml)
    assert all(g.nvswitch for g in topo.spec.gpus)
    assert {gpu_link(topo, i, j).label for i in range(4) for j in range(4) if i != j} == {"NV12"}


@dataclass
class FakeNVMLWithoutNuma(FakeNVML):
    """An older driver: no nvmlDeviceGetNumaNodeId."""

    nvmlDeviceGetNumaNodeId = None  # type: ignore[assignment]


def test_numa_falls_back_to_sysfs(tmp_path: Path) -> None:
    base = _quad()
    nvml = FakeNVMLWithoutNuma(base.names, base.buses, base.numa, base.nvlinks, base.ancestor)
    for pos, bus in enumerate(("0000:06:00.0", "0000:07:00.0", "0000:86:00.0", "0000:87:00.0")):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "numa_node").write_text(f"{pos // 2 + 2}\n")
    topo = discover(nvml, sysfs_pci=tmp_path)
    assert [g.numa_node for g in topo.spec.gpus] == [2, 2, 3, 3]
    assert [g.numa_node for g in discover(nvml, sysfs_pci=tmp_path / "missing").spec.gpus] == [0, 0, 1, 1]


def test_unreadable_gpu_is_unhealthy_not_dropped() -> None:
    nvml = _quad()
    nvml.broken = {3}
    topo = discover(nvml)
    assert topo.gpu_count == 4
    assert topo.spec.gpus[3].health == "Unhealthy"
    assert gpu_link(topo, 2, 3).label == "SYS"


def test_nics_are_validated() -> None:
    topo = discover(_quad(), nics=[NICDevice(name="mlx5_0", numa_node=0)])
    assert [n.name for n in topo.spec.nics] == ["mlx5_0"]
    with pytest.raises(ValidationError, match="not declared"):
        discover(_quad(), nics=[NICDevice(name="mlx5_0", pcie_switch="nowhere")])


def test_errors_explain_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(DiscoveryError, match="install the nvidia-ml-py package"):
        discover()
    failing = _quad()
    failing.init_error = NVMLError("Driver Not Loaded")
    with pytest.raises(DiscoveryError, match=r"Driver Not Loaded.*NVIDIA driver installed"):
        discover(failing)
    empty = _quad()
    empty.count_override = 0
    with pytest.raises(DiscoveryError, match="no GPUs"):
        discover(empty)
    assert empty.calls == ["init", "shutdown"]


def test_a_product_the_table_lacks_gets_a_stable_key_and_one_warning() -> None:
    from gpuyard.apis.devicematching import DeviceSelector, compile_selector, gpu_devices
    from tests.builders import make_node

    nvml = _quad()
    nvml.names = ["NVIDIA Foo X1"] * 4
    with structlog.testing.capture_logs() as logs:
        first = discover(nvml)
        again = discover(nvml)
    keys = {g.model_key for g in first.spec.gpus + again.spec.gpus}
    assert keys == {"foo-x1"} and {g.model for g in first.spec.gpus} == {"NVIDIA-Foo-X1"}
    warned = [e for e in logs if "not in the model table" in e["event"]]
    assert len(warned) == 1 and warned[0]["product"] == "NVIDIA Foo X1"
    # schedulable by its product label: a ResourceClass selecting the product matches every GPU
    node = make_node("foo-0", gpus=4)
    wants = compile_selector(DeviceSelector(match_labels={"product": "NVIDIA-Foo-X1", "model": "foo-x1"}))
    assert [wants.test(d.properties()) for d in gpu_devices(node, first)] == [True] * 4


@pytest.mark.parametrize(
    ("product", "key"),
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA A800-SXM4-80GB", "a800"),
        ("NVIDIA H20", "h20"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GB200", "gb200"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40", "l40"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA H100 NVL", "h100"),
        ("NVIDIA H100 PCIe", "h100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("NVIDIA A10G", "a10g"),
        ("Tesla V100S-PCIE-32GB", "v100"),
    ],
)
def test_current_data_centre_parts_are_in_the_table(product: str, key: str) -> None:
    nvml = _quad()
    nvml.names = [product] * 4
    with structlog.testing.capture_logs() as logs:
        topo = discover(nvml)
    assert {g.model_key for g in topo.spec.gpus} == {key}
    assert key in GPU_MODELS and GPU_MODELS[key].memory_mib > 0
    assert not [e for e in logs if "not in the model table" in e["event"]]
