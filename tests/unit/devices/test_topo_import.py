"""Importing real `nvidia-smi topo -m` matrices, and rejecting bad ones with line and column."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuyard.devices import (
    PRESETS,
    TopologyParseError,
    format_topo_matrix,
    get_preset,
    gpu_link,
    import_topology,
    load_topology_file,
    nic_link,
    parse_topo_matrix,
    pick_gpus,
    pick_nics,
    table_for,
)
from gpuyard.devices.tiers import Locality, gpu_locality
from gpuyard.devices.topo_import import TopologyWarning

from .conftest import DATA, MATRICES, file_cells


@pytest.mark.parametrize("name", MATRICES)
def test_imported_tiers_are_the_files_tiers(name: str) -> None:
    topo = load_topology_file(DATA / name)
    names, cells = file_cells(name)
    nic_names = [nic.name for nic in topo.spec.nics]
    for i in range(topo.gpu_count):
        for pos, col in enumerate(names):
            expected = cells[f"GPU{i}"][col].strip().replace("SOC", "SYS")
            if col.startswith("GPU"):
                assert gpu_link(topo, i, int(col[3:])).label == expected
            else:
                assert nic_link(topo, i, pos - topo.gpu_count).label == expected
    assert len(nic_names) == len(names) - topo.gpu_count
    assert topo.metadata.name == name.removesuffix(".txt")


def test_dgx1_structure() -> None:
    topo = load_topology_file(DATA / "dgx1-v100-1.txt", gpu_model="Tesla-V100-SXM2-32GB", memory_mib=32768)
    spec = topo.spec
    assert [nic.name for nic in spec.nics] == ["mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3"]
    assert spec.gpus[0].nvlink_peers == {1: 1, 2: 1, 3: 2, 4: 2}
    assert not any(g.nvswitch for g in spec.gpus)
    assert [g.numa_node for g in spec.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert spec.sockets == 2 and spec.numa_nodes[0].cpus == "0-19,40-59"
    assert spec.gpus[0].pcie_switch == spec.gpus[1].pcie_switch == topo.nic("mlx5_0").pcie_switch
    assert spec.gpus[0].pcie_switch != spec.gpus[2].pcie_switch
    assert gpu_locality(topo, 0, 3) is Locality.PCIE  # NV2, and PHB through mlx5_1
    assert spec.gpus[0].model_key == "v100" and spec.gpus[0].memory_mib == 32768
    # the imported node picks the same GPUs as the preset
    preset_table = table_for(get_preset("dgx1-v100"))
    table = table_for(topo)
    for free in range(256):
        for k in range(1, 9):
            assert pick_gpus(table, free, k) == pick_gpus(preset_table, free, k)


def test_dgx_a100_structure() -> None:
    topo = load_topology_file(DATA / "dgx-a100-1.txt", gpu_model="NVIDIA A100-SXM4-80GB", nic_gbps=200)
    spec = topo.spec
    assert all(g.nvswitch for g in spec.gpus)
    assert [g.numa_node for g in spec.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert topo.nic("mlx5_4").numa_node == -1  # SYS to every GPU: unknown
    assert pick_nics(topo, [0, 1], "SamePCIe") == ["mlx5_0"]
    assert pick_nics(topo, [0, 2], "SamePCIe") == ["mlx5_0", "mlx5_2"]
    assert pick_nics(topo, [0, 1], "SameNUMA") == ["mlx5_0"]
    assert pick_nics(topo, [6], "SamePCIe", free_nics={"mlx5_4", "mlx5_5"}) is None
    assert gpu_locality(topo, 0, 1) is Locality.PCIE
    assert pick_gpus(table_for(topo), 0xFF, 2) == (0, 1)


def test_dgx_a100_sockets_can_be_given() -> None:
    topo = load_topology_file(DATA / "dgx-a100-1.txt", numa_to_socket={1: 0, 3: 0, 5: 1, 7: 1})
    assert topo.spec.sockets == 2
    assert [g.socket for g in topo.spec.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert gpu_locality(topo, 0, 2) is Locality.SOCKET
    with pytest.raises(ValueError, match="no socket for NUMA"):
        load_topology_file(DATA / "dgx-a100-1.txt", numa_to_socket={1: 0})


def test_a30_nic_legend_and_preamble() -> None:
    text = "GPU Topology:\n" + (DATA / "nvlink-pairs-a30-1.txt").read_text()
    topo = import_topology(text, name="a30", gpu_model="NVIDIA A30")
    assert [nic.name for nic in topo.spec.nics] == ["mlx5_0"]
    assert nic_link(topo, 3, "mlx5_0").label == "PIX"
    assert nic_link(topo, 2, "mlx5_0").label == "PXB"
    assert topo.spec.gpus[0].nvlink_peers == {1: 4}
    assert pick_nics(topo, [2, 3], "SamePCIe") == ["mlx5_0"]
    assert pick_nics(topo, [0, 1], "SamePCIe") is None
    assert pick_gpus(table_for(topo), 0b1111, 2) == (2, 3)  # NV4 and its NIC side of the box
    matrix = parse_topo_matrix(text)
    assert matrix.legend["PIX"].startswith("Connection traversing at most a single PCIe bridge")


def test_l40s_numa_and_missing_nic_locality() -> None:
    topo = load_topology_file(DATA / "pcie-l40s-1.txt", gpu_model="NVIDIA L40S")
    assert [g.numa_node for g in topo.spec.gpus] == [0] * 4 + [1] * 4
    assert pick_gpus(table_for(topo), 0xFF, 4) == (0, 1, 2, 3)
    assert pick_nics(topo, [0], "SamePCIe") is None
    assert pick_nics(topo, [0], "SameNUMA") is None
    assert pick_nics(topo, [0], None) == ["NIC0"]


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_round_trips_through_the_matrix(preset: str) -> None:
    topo = get_preset(preset)
    back = import_topology(format_topo_matrix(topo), name=preset)
    n = topo.gpu_count
    assert [[gpu_link(back, i, j).label for j in range(n)] for i in range(n)] == [
        [gpu_link(topo, i, j).label for j in range(n)] for i in range(n)
    ]
    assert [[nic_link(back, i, nic.name).label for nic in topo.spec.nics] for i in range(n)] == [
        [nic_link(topo, i, nic.name).label for nic in topo.spec.nics] for i in range(n)
    ]
    assert [g.numa_node for g in back.spec.gpus] == [g.numa_node for g in topo.spec.gpus]


GOOD = (
    "\tGPU0\tGPU1\tmlx5_0\tCPU Affinity\tNUMA Affinity\n"
    "GPU0\t X \tNV2\tPIX\t0-7\t0\n"
    "GPU1\tNV2\t X \tPHB\t0-7\t0\n"
    "mlx5_0\tPIX\tPHB\t X \n"
)


def test_the_small_good_matrix_parses() -> None:
    topo = import_topology(GOOD)
    assert topo.spec.gpus[0].nvlink_peers == {1: 2}
    assert nic_link(topo, 1, "mlx5_0").label == "PHB"


@pytest.mark.parametrize(
    ("text", "line", "column", "message"),
    [
        (
            GOOD.replace("GPU0\t X \tNV2\tPIX", "GPU0\t X \tNV2\tPIQ"),
            2,
            14,
            "unknown link 'PIQ' in row GPU0, column mlx5_0; allowed: X, NV<n>",
        ),
        (GOOD.replace("\tNV2\t X \tPHB", "\tNVL\t X \tPHB"), 3, 6, "unknown link 'NVL'"),
        (
            GOOD.replace("mlx5_0\tPIX\tPHB\t X \n", ""),
            4,
            1,
            "not square: 3 device columns but 2 rows; missing rows: mlx5_0",
        ),
        (
            GOOD.replace("GPU1\tNV2\t X \tPHB", "GPU1\tNV2\t X "),
            3,
            14,
            "only 2 link cells before its affinity values; expected 3",
        ),
        (GOOD.replace("mlx5_0\tPIX\tPHB\t X ", "mlx5_0\tPIX\tPHB"), 4, 15, "has 2 link cells; expected 3"),
        (GOOD.replace("GPU1\tNV2\t X ", "GPU1\tNV2\tNV2"), 3, 10, "the diagonal must be X"),
        (GOOD.replace("GPU1\tNV2\t X \tPHB", "GPU1\tX\t X \tPHB"), 3, 6, "X (self) appears off the diagonal"),
        (
            GOOD.replace("GPU1\tNV2\t X ", "GPU1\tNV1\t X "),
            3,
            6,
            "row GPU1, column GPU0 is NV1 but row GPU0, column GPU1 is NV2",
        ),
        (
            GOOD.replace("mlx5_0\tPIX\tPHB\t X ", "mlx5_0\tNV1\tPHB\t X ").replace(
                "NV2\tPIX\t0-7", "NV2\tNV1\t0-7"
            ),
            2,
            14,
            "NVLink joins GPUs only",
        ),
        (GOOD.replace("GPU1\tNV2", "GPU7\tNV2"), 3, 1, "row 'GPU7' is not a column of the header"),
        (
            GOOD.replace("GPU1\tNV2\t X \tPHB\t0-7\t0\n", "GPU0\tNV2\t X \tPHB\t0-7\t0\n"),
            3,
            1,
            "row 'GPU0' appears twice",
        ),
        (GOOD.replace("\tGPU0\tGPU1", "\tGPU0\tGPU2"), 1, 7, "column 'GPU2' out of order"),
        (GOOD.replace("\tGPU0\tGPU1", "\tGPU1\tGPU0"), 1, 2, "expected the matrix header starting with GPU0"),
        (
            GOOD.replace("\tmlx5_0\tCPU", "\tPIX\tCPU"),
            1,
            12,
            "is not a device column; allowed: GPU<n>, NIC<n>",
        ),
        (GOOD + "\nNIC Legend:\n\n  NIC3: mlx5_9\n", 8, 3, "NIC Legend names 'NIC3'"),
        ("", 1, 1, "no matrix found"),
        ("\nfoo bar\n", 2, 1, "expected the matrix header starting with GPU0"),
    ],
)
def test_bad_matrices_are_rejected_with_line_and_column(
    text: str, line: int, column: int, message: str
) -> None:
    with pytest.raises(TopologyParseError) as info:
        import_topology(text)
    err = info.value
    assert message in err.message
    assert (err.line, err.column) == (line, column), str(err)
    assert str(err).startswith(f"line {line}, column {column}: ")


@pytest.mark.parametrize(
    ("text", "line", "column", "message"),
    [
        (
            GOOD.replace("CPU Affinity", "CPU Mask"),
            1,
            19,
            "column title 'CPU Mask' is not one gpuyard reads",
        ),
        (
            GOOD.replace("PHB\t0-7\t0", "PHB\t0-7"),
            3,
            18,
            "row 'GPU1' has 1 values after its link cells; expected 2 (CPU Affinity, NUMA Affinity)",
        ),
        (GOOD + "\nhello there\n", 6, 1, "unexpected text after the matrix ignored: 'hello there'"),
        (GOOD.replace("\t0-7\t0\nGPU1", "\t0-7\t0\t42\nGPU1"), 2, 24, "ignored: 42"),
        (
            GOOD.replace("GPU1\tNV2\t X \tPHB", "GPU1\t\t X \tPHB"),
            3,
            6,
            "row GPU1, column GPU0 is blank; read from its mirror cell: NV2",
        ),
        (
            GOOD.replace("mlx5_0\tPIX", "MIG 1g.10gb Device 0\tPIX\tPHB\t X \nmlx5_0\tPIX"),
            4,
            1,
            "MIG device row",
        ),
    ],
)
def test_what_is_read_but_not_used_is_a_warning(text: str, line: int, column: int, message: str) -> None:
    warnings: list[TopologyWarning] = []
    topo = import_topology(text, on_warning=warnings.append)
    assert topo.gpu_count == 2 and gpu_link(topo, 0, 1).label == "NV2"
    assert [nic.name for nic in topo.spec.nics] == ["mlx5_0"]
    assert len(warnings) == 1, warnings
    assert message in warnings[0].message
    assert (warnings[0].line, warnings[0].column) == (line, column), str(warnings[0])


def test_import_topo_cli_warns_and_exits_0_or_names_line_and_column(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from gpuyard.cli import main

    warned = tmp_path / "warned.txt"
    warned.write_text(GOOD.replace("CPU Affinity", "CPU Mask"))
    result = CliRunner().invoke(main, ["devices", "import-topo", str(warned)])
    assert result.exit_code == 0, result.output
    assert f"warning: {warned}:1:19: column title 'CPU Mask'" in result.stderr
    assert "kind: NodeTopology" in result.stdout
    bad = tmp_path / "bad.txt"
    bad.write_text(GOOD.replace("GPU0\t X \tNV2\tPIX", "GPU0\t X \tNV2\tPIQ"))
    result = CliRunner().invoke(main, ["devices", "import-topo", str(bad)])
    assert result.exit_code == 2
    assert f"error: {bad}:2:14: unknown link 'PIQ'" in result.stderr


def test_numa_contradiction_is_reported() -> None:
    text = GOOD.replace("NV2\tPIX\t0-7\t0", "NODE\tPIX\t0-7\t0").replace(
        "GPU1\tNV2\t X \tPHB\t0-7\t0", "GPU1\tNODE\t X \tPHB\t0-7\t1"
    )
    with pytest.raises(TopologyParseError, match="NUMA Affinity differs"):
        import_topology(text)


def test_legacy_soc_and_space_separated() -> None:
    text = "        GPU0    GPU1    CPU Affinity\nGPU0     X      SOC     0-5\nGPU1    SOC      X      6-11\n"
    topo = import_topology(text)
    assert gpu_link(topo, 0, 1).label == "SYS"
    assert [g.numa_node for g in topo.spec.gpus] == [0, 1]  # different CPU affinity, SYS between them
    assert topo.spec.link_matrix == [["X", "SYS"], ["SYS", "X"]]


def test_real_single_h100_output_with_terminal_escapes() -> None:
    """`nvidia-smi topo -m` from a one-H100 VM: the header is underlined with ANSI codes even
    when piped, and there is a `GPU NUMA ID` column holding N/A."""
    text = (DATA / "h100-1gpu-ansi.txt").read_text()
    assert "\x1b[4m" in text
    topo = import_topology(text, name="h100-vm", gpu_model="NVIDIA-H100-80GB-HBM3", memory_mib=81559)
    assert topo.gpu_count == 1 and topo.spec.nics == []
    assert topo.spec.gpus[0].numa_node == 0
