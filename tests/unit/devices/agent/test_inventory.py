"""The agent's discovery through the fake NVML: each shape gives the preset's model (GPUs, NVLink
tiers, NUMA), NICs come from a sysfs tree, MIG/fabric are recorded, and NVML faults are survivable."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import structlog

from gpuyard.apis.devices import GPUDevice, NodeTopology, NodeTopologySpec
from gpuyard.apis.meta import ObjectMeta
from gpuyard.devices import get_preset, link_matrix, pick_nics
from gpuyard.devices.agent.fakenvml import FAKE_SHAPES, FakeNVML, FakeNVMLError
from gpuyard.devices.agent.health import ANNOTATION_UNHEALTHY_REASONS, HealthBook, HealthEvent
from gpuyard.devices.agent.inventory import (
    ANNOTATION_FABRIC,
    ANNOTATION_MIG,
    ANNOTATION_MIG_DEVICES,
    Inventory,
)
from gpuyard.devices.discovery import DiscoveryError, reset_warnings


def _read(fake: FakeNVML, node: str, **kwargs: Any) -> NodeTopology:
    fake.nvmlInit()
    try:
        return Inventory(
            node=node, nvml=fake, sysfs_root=kwargs.pop("sysfs_root", Path("/nonexistent")), **kwargs
        ).read()
    finally:
        fake.nvmlShutdown()


def _gpu_facts(topology: NodeTopology) -> list[tuple[Any, ...]]:
    return [
        (
            g.index,
            g.uuid,
            g.model,
            g.memory_mib,
            g.pci_bus_id,
            g.numa_node,
            g.socket,
            g.nvlink_peers,
            g.nvswitch,
        )
        for g in topology.spec.gpus
    ]


@pytest.mark.parametrize("shape", FAKE_SHAPES)
def test_each_fake_shape_discovers_the_presets_model(shape: str) -> None:
    preset = get_preset(shape, node_name="n1", partition_policy=None)
    found = _read(FakeNVML.shaped(shape, node_name="n1"), "n1")
    assert found.metadata.name == "n1"
    assert _gpu_facts(found) == _gpu_facts(preset)
    labels = lambda t: [[link.label for link in row] for row in link_matrix(t)]  # noqa: E731
    assert labels(found) == labels(preset)  # NV#, PIX, PXB, NODE, SYS: the tiers the scheduler ranks
    assert {n.id: n.socket for n in found.spec.numa_nodes} == {n.id: n.socket for n in preset.spec.numa_nodes}
    assert all(g.health == "Healthy" for g in found.spec.gpus)


def test_h100_fabric_state_and_partitions() -> None:
    fake = FakeNVML.shaped("hgx-h100", node_name="h1")
    found = _read(fake, "h1", partition_policy="Honor")
    preset = get_preset("hgx-h100", node_name="h1")
    assert (found.spec.partitions, found.spec.partition_policy) == (preset.spec.partitions, "Honor")
    assert found.metadata.annotations[ANNOTATION_FABRIC].startswith("0=Completed,1=Completed")
    fake.fabric_state(3, 2)  # fabric manager still registering GPU 3: no NVLink for it yet
    again = _read(fake, "h1")
    assert [g.index for g in again.spec.gpus if g.health != "Healthy"] == [3]


def test_mig_enabled_gpus_are_annotated() -> None:
    fake = FakeNVML.shaped("dgx-a100", node_name="a1")
    fake.enable_mig(2)
    fake.enable_mig(5, ["7g.80gb"])
    assert _read(fake, "a1").metadata.annotations[ANNOTATION_MIG] == "2,5"
    assert ANNOTATION_MIG not in _read(FakeNVML.shaped("dgx1-v100"), "v1").metadata.annotations


def test_a_partition_policy_needs_a_known_table() -> None:
    with pytest.raises(DiscoveryError, match="partition table"):
        _read(FakeNVML.shaped("dgx1-v100"), "v1", partition_policy="Honor")


def test_missing_optional_symbols_are_skipped() -> None:
    fake = FakeNVML.shaped(
        "hgx-h100",
        node_name="old",
        missing=(
            "nvmlDeviceGetNumaNodeId",
            "nvmlDeviceGetGpuFabricInfoV",
            "nvmlDeviceGetGpuFabricInfo",
            "nvmlDeviceGetMigMode",
        ),
    )
    found = _read(fake, "old")
    assert len(found.spec.gpus) == 8 and ANNOTATION_FABRIC not in found.metadata.annotations
    assert found.spec.gpus[0].nvlink_peers[1] == 18


@pytest.mark.parametrize(
    "old_driver",
    [
        {"missing": ("nvmlDeviceGetGpuFabricInfoV",)},  # a binding older than the V call
        {"raise_on": ("nvmlDeviceGetGpuFabricInfoV", 25)},  # a driver that refuses the struct version
    ],
)
def test_fabric_state_falls_back_to_the_unversioned_call(old_driver: dict[str, Any]) -> None:
    fake = FakeNVML.shaped("hgx-h100", node_name="h1", missing=old_driver.get("missing", ()))
    if "raise_on" in old_driver:
        name, code = old_driver["raise_on"]
        fake.raise_on(name, FakeNVMLError(code))
    fake.fabric_state(2, 1)
    found = _read(fake, "h1")
    assert found.metadata.annotations[ANNOTATION_FABRIC].startswith("0=Completed,1=Completed,2=NotStarted")
    assert [g.index for g in found.spec.gpus if g.health != "Healthy"] == [2]


@pytest.mark.parametrize(
    "exc",
    [
        TypeError("takes 1 positional argument but 2 were given"),
        AttributeError("c_nvmlGpuFabricInfoV_t"),
        FakeNVMLError(999),
        RuntimeError("anything"),
    ],
)
@pytest.mark.parametrize(
    "call",
    [
        "nvmlDeviceGetGpuFabricInfoV",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetTopologyCommonAncestor",
        "nvmlDeviceGetNumaNodeId",
        "nvmlDeviceGetMemoryInfo",
    ],
)
def test_no_exception_of_an_nvml_call_stops_a_reading(call: str, exc: Exception) -> None:
    reset_warnings()
    fake = FakeNVML.shaped("hgx-h100", node_name="h1")
    fake.raise_on(call, exc)
    with structlog.testing.capture_logs() as logs:
        found = _read(fake, "h1")
        _read(fake, "h1")  # a second reading logs nothing new
    assert len(found.spec.gpus) == 8  # every GPU still there, indices stable
    warned = [e for e in logs if e["log_level"] in ("warning", "error")]
    assert len(warned) == 1, warned
    assert type(exc).__name__ in warned[0].get("error", "")
    if call == "nvmlDeviceGetMemoryInfo":  # a GPU whose basic facts are unreadable is kept out
        assert all(g.health == "Unhealthy" for g in found.spec.gpus)
    else:
        assert all(g.health == "Healthy" for g in found.spec.gpus)


def test_mig_gpus_are_kept_out_with_a_reason() -> None:
    fake = FakeNVML.shaped("dgx-a100", node_name="a1")
    fake.enable_mig(2, ["3g.40gb", "3g.40gb"])
    fake.enable_mig(5, ["1c.3g.40gb", "1g.10gb"])
    fake.enable_mig(6)
    found = _read(fake, "a1")
    assert [g.index for g in found.spec.gpus if g.health != "Healthy"] == [2, 5, 6]
    notes = found.metadata.annotations
    assert notes[ANNOTATION_MIG] == "2,5,6"
    assert json.loads(notes[ANNOTATION_MIG_DEVICES]) == {
        "2": ["3g.40gb", "3g.40gb"],
        "5": ["1c.3g.40gb", "1g.10gb"],
        "6": [],
    }
    reasons = json.loads(notes[ANNOTATION_UNHEALTHY_REASONS])
    assert reasons["2"].startswith("MIG mode enabled (MIG devices 3g.40gb, 3g.40gb)")
    assert "no MIG devices created" in reasons["6"] and "whole GPUs only" in reasons["6"]
    # the health book's later reasons are added to the MIG ones, not put in their place
    book = HealthBook()
    book.record([HealthEvent(3, "XID 79")], 8)
    merged = json.loads(book.apply(found).metadata.annotations[ANNOTATION_UNHEALTHY_REASONS])
    assert sorted(merged) == ["2", "3", "5", "6"] and merged["3"] == "XID 79"
    # a GPU model without MIG answers Not Supported: never kept out for MIG
    v100 = FakeNVML.shaped("dgx1-v100")
    v100.enable_mig(0, ["1g.10gb"])
    assert all(g.health == "Healthy" for g in _read(v100, "v1").spec.gpus)


def test_describe_node_shows_why_a_gpu_is_kept_out() -> None:
    from gpuyard.cli.nodes import render_node

    fake = FakeNVML.shaped("dgx-a100", node_name="a1")
    fake.enable_mig(2, ["7g.80gb"])
    found = _read(fake, "a1")
    text = render_node({"topology": found.to_dict(), "gpus": {}, "nics": {}})
    assert "Unhealthy GPUs: 2" in text
    assert "GPU 2: MIG mode enabled (MIG devices 7g.80gb)" in text


def _single_gpu_vm(root: Path, *, local_cpulist: str | None) -> FakeNVML:
    """A one-GPU H200 virtual machine as one really answered: NVML's NUMA node Not Supported, sysfs
    numa_node -1, CPUs 0-15."""
    gpu = GPUDevice(
        index=0,
        minor=0,
        uuid="GPU-h200",
        model="NVIDIA-H200",
        memory_mib=143771,
        pci_bus_id="00000000:00:05.0",
    )
    fake = FakeNVML(NodeTopology(metadata=ObjectMeta(name="vm"), spec=NodeTopologySpec(gpus=[gpu])))
    fake.raise_on("nvmlDeviceGetNumaNodeId", FakeNVMLError(3))
    pci = root / "bus" / "pci" / "devices" / "0000:00:05.0"
    pci.mkdir(parents=True)
    (pci / "numa_node").write_text("-1\n")
    if local_cpulist is not None:
        (pci / "local_cpulist").write_text(local_cpulist + "\n")
    cpu = root / "devices" / "system" / "cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text("0-15\n")
    return fake


@pytest.mark.parametrize("local_cpulist", ["0-15", None, "garbage"])
def test_a_single_gpu_vm_gets_a_model_key_and_cpus(tmp_path: Path, local_cpulist: str | None) -> None:
    found = _read(_single_gpu_vm(tmp_path, local_cpulist=local_cpulist), "vm", sysfs_root=tmp_path)
    gpu = found.spec.gpus[0]
    assert (gpu.model, gpu.model_key, gpu.memory_mib, gpu.numa_node) == ("NVIDIA-H200", "h200", 143771, 0)
    assert [(n.id, n.cpus) for n in found.spec.numa_nodes] == [(0, "0-15")]
    assert gpu.health == "Healthy"


def test_a_lost_gpu_is_unhealthy_not_dropped() -> None:
    fake = FakeNVML.shaped("dgx-a100", node_name="a1")
    fake.lose_gpu(5)
    found = _read(fake, "a1")
    assert len(found.spec.gpus) == 8
    assert [g.index for g in found.spec.gpus if g.health != "Healthy"] == [5]


def test_nvml_that_cannot_start_is_a_discovery_error() -> None:
    from gpuyard.devices.agent.running import Agent, PrintSink

    agent = Agent(Inventory(node="x", nvml=FakeNVML.shaped("dgx-a100", fail_init=9)), PrintSink())
    with pytest.raises(DiscoveryError, match="could not start"):
        agent._discover()


def _sysfs(root: Path, topology: NodeTopology, nics: dict[str, int]) -> None:
    """A sysfs tree: each GPU under root port -> switch port `sw<k>`; NIC `name` under GPU k's switch."""
    devices = root / "devices" / "pci0000:00"
    pci = root / "bus" / "pci" / "devices"
    pci.mkdir(parents=True)

    def bdf(nvml_bus: str) -> str:
        d, b, r = nvml_bus.split(":")
        return f"{int(d, 16):04x}:{b.lower()}:{r.lower()}"

    for gpu in topology.spec.gpus:
        k = gpu.index // 2
        path = devices / f"0000:{0x10 + k:02x}:00.0" / f"0000:{0x20 + k:02x}:00.0" / bdf(gpu.pci_bus_id)
        path.mkdir(parents=True)
        (path / "numa_node").write_text(f"{gpu.numa_node}\n")
        os.symlink(path, pci / bdf(gpu.pci_bus_id))
    for n, (name, gpu_index) in enumerate(nics.items()):
        k = gpu_index // 2
        path = (
            devices / f"0000:{0x10 + k:02x}:00.0" / f"0000:{0x20 + k:02x}:00.0" / f"0000:{0x80 + n:02x}:00.0"
        )
        path.mkdir(parents=True)
        (path / "numa_node").write_text("-1\n")
        ib = root / "class" / "infiniband" / name
        (ib / "ports" / "1").mkdir(parents=True)
        (ib / "ports" / "1" / "rate").write_text("200 Gb/sec (4X HDR)\n")
        os.symlink(path, ib / "device")


def test_rdma_nics_from_sysfs_sit_under_their_gpus_switch(tmp_path: Path) -> None:
    preset = get_preset("dgx-a100", node_name="a1")
    _sysfs(tmp_path, preset, {"mlx5_0": 0, "mlx5_1": 2, "mlx5_2": 4, "mlx5_3": 6})
    found = _read(FakeNVML(preset), "a1", sysfs_root=tmp_path)
    assert [n.name for n in found.spec.nics] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert all(n.bandwidth_gbps == 200 and n.rdma for n in found.spec.nics)
    by_name = {n.name: n for n in found.spec.nics}
    assert by_name["mlx5_2"].pcie_switch == found.spec.gpus[4].pcie_switch
    assert by_name["mlx5_2"].numa_node == found.spec.gpus[4].numa_node  # sysfs said -1: the GPU's
    assert pick_nics(found, [4, 5], "SamePCIe") == ["mlx5_2"]
