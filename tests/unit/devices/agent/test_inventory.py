"""The agent's discovery through the fake NVML: each shape gives the preset's model (GPUs, NVLink
tiers, NUMA), NICs come from a sysfs tree, MIG/fabric are recorded, and NVML faults are survivable."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuyard.apis.devices import NodeTopology
from gpuyard.devices import get_preset, link_matrix, pick_nics
from gpuyard.devices.agent.fakenvml import FAKE_SHAPES, FakeNVML
from gpuyard.devices.agent.inventory import ANNOTATION_FABRIC, ANNOTATION_MIG, Inventory
from gpuyard.devices.discovery import DiscoveryError


def _read(fake: FakeNVML, node: str, **kwargs) -> NodeTopology:  # type: ignore[no-untyped-def]
    fake.nvmlInit()
    try:
        return Inventory(
            node=node, nvml=fake, sysfs_root=kwargs.pop("sysfs_root", Path("/nonexistent")), **kwargs
        ).read()
    finally:
        fake.nvmlShutdown()


def _gpu_facts(topology: NodeTopology) -> list[tuple]:  # type: ignore[type-arg]
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
    fake.enable_mig(5)
    assert _read(fake, "a1").metadata.annotations[ANNOTATION_MIG] == "2,5"
    assert ANNOTATION_MIG not in _read(FakeNVML.shaped("dgx1-v100"), "v1").metadata.annotations


def test_a_partition_policy_needs_a_known_table() -> None:
    with pytest.raises(DiscoveryError, match="partition table"):
        _read(FakeNVML.shaped("dgx1-v100"), "v1", partition_policy="Honor")


def test_missing_optional_symbols_are_skipped() -> None:
    fake = FakeNVML.shaped(
        "hgx-h100",
        node_name="old",
        missing=("nvmlDeviceGetNumaNodeId", "nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetMigMode"),
    )
    found = _read(fake, "old")
    assert len(found.spec.gpus) == 8 and ANNOTATION_FABRIC not in found.metadata.annotations
    assert found.spec.gpus[0].nvlink_peers[1] == 18


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
