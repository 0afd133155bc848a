"""Presets: shapes, models, and the DGX-1 links exactly as the published matrix."""

from __future__ import annotations

import pytest

from gpuyard.devices import GPU_MODELS, PRESET_MODELS, PRESETS, get_preset, gpu_link, nic_link
from gpuyard.devices.bandwidth import model_key

from .conftest import file_cells

SHAPES = {  # preset -> (GPUs, NICs, sockets, model key)
    "dgx1-v100": (8, 4, 2, "v100"),
    "dgx-a100": (8, 8, 2, "a100"),
    "hgx-h100": (8, 8, 2, "h100"),
    "pcie-t4x4": (4, 1, 1, "t4"),
    "k80": (8, 1, 2, "k80"),
    "p100": (8, 2, 2, "p100"),
}


def test_every_preset_is_listed() -> None:
    assert set(PRESETS) == set(SHAPES) == set(PRESET_MODELS)


@pytest.mark.parametrize("preset", PRESETS)
def test_shapes_and_models(preset: str) -> None:
    gpus, nics, sockets, key = SHAPES[preset]
    topo = get_preset(preset)
    assert (topo.gpu_count, len(topo.spec.nics), topo.spec.sockets) == (gpus, nics, sockets)
    model = GPU_MODELS[key]
    for gpu in topo.spec.gpus:
        assert (gpu.model, gpu.model_key, gpu.memory_mib) == (model.name, key, model.memory_mib)
        assert model_key(gpu.model) == key
        assert gpu.uuid.startswith("GPU-")
    assert len({g.uuid for g in topo.spec.gpus}) == gpus
    assert topo.metadata.name == preset


def test_names_and_uuids_follow_the_node_name() -> None:
    a, b = get_preset("dgx-a100", node_name="n1"), get_preset("dgx-a100", node_name="n2")
    assert a.metadata.name == "n1"
    assert a.spec.gpus[0].uuid != b.spec.gpus[0].uuid
    assert a.spec.gpus[0].uuid == get_preset("dgx-a100", node_name="n1").spec.gpus[0].uuid


def test_unknown_preset_lists_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="allowed: dgx1-v100, dgx-a100"):
        get_preset("dgx-b200")


def test_unhealthy_marks_gpus() -> None:
    topo = get_preset("p100", unhealthy=[2, 5])
    assert [g.index for g in topo.spec.gpus if g.health == "Unhealthy"] == [2, 5]
    with pytest.raises(ValueError, match="out of range"):
        get_preset("p100", unhealthy=[8])


def test_dgx1_matches_the_published_matrix() -> None:
    topo = get_preset("dgx1-v100")
    names, cells = file_cells("dgx1-v100-1.txt")
    for i in range(8):
        for col in names:
            expected = cells[f"GPU{i}"][col].strip()
            got = (
                gpu_link(topo, i, int(col[3:])).label
                if col.startswith("GPU")
                else nic_link(topo, i, col).label
            )
            assert got == expected, (i, col)


def test_nvswitch_presets() -> None:
    for preset, links in (("dgx-a100", "NV12"), ("hgx-h100", "NV18")):
        topo = get_preset(preset)
        assert all(g.nvswitch for g in topo.spec.gpus)
        assert {gpu_link(topo, i, j).label for i in range(8) for j in range(8) if i != j} == {links}


def test_dgx_a100_pairs_gpus_and_nics_under_four_switches() -> None:
    topo = get_preset("dgx-a100")
    for i in range(8):
        under = [nic.name for nic in topo.spec.nics if nic.pcie_switch == topo.spec.gpus[i].pcie_switch]
        assert under == [f"mlx5_{2 * (i // 2)}", f"mlx5_{2 * (i // 2) + 1}"]
        assert [nic_link(topo, i, n).label for n in under] == ["PIX", "PIX"]
    assert len({g.pcie_switch for g in topo.spec.gpus}) == 4
    assert all(nic.rdma and nic.bandwidth_gbps == 200 for nic in topo.spec.nics)


def test_h100_partitions_and_policy_override() -> None:
    topo = get_preset("hgx-h100")
    assert topo.spec.partition_policy == "Honor"
    parts = {tuple(p) for p in topo.spec.partitions or []}
    assert {(0, 1), (2, 3), (4, 5), (6, 7), (0, 1, 2, 3), (4, 5, 6, 7), tuple(range(8))} <= parts
    assert {(i,) for i in range(8)} <= parts
    assert get_preset("hgx-h100", partition_policy="Prefer").spec.partition_policy == "Prefer"
    assert get_preset("hgx-h100", partition_policy=None).spec.partitions is None
    with pytest.raises(ValueError, match="no partition table"):
        get_preset("dgx-a100", partition_policy="Honor")


def test_pcie_presets_tiers() -> None:
    t4 = get_preset("pcie-t4x4")
    assert [gpu_link(t4, 0, j).label for j in range(4)] == ["X", "PIX", "PHB", "PHB"]
    k80 = get_preset("k80")
    assert [gpu_link(k80, 0, j).label for j in range(8)] == [
        "X",
        "PIX",
        "PHB",
        "PHB",
        "SYS",
        "SYS",
        "SYS",
        "SYS",
    ]
    p100 = get_preset("p100")
    assert [gpu_link(p100, 0, j).label for j in range(8)] == [
        "X",
        "PIX",
        "PIX",
        "PIX",
        "SYS",
        "SYS",
        "SYS",
        "SYS",
    ]
    assert nic_link(p100, 0, "mlx5_0").label == "PIX"
    assert nic_link(k80, 0, "mlx4_0").label == "NODE"
    assert nic_link(k80, 7, "mlx4_0").label == "SYS"
