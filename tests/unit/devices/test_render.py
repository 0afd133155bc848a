"""Text renderings: the node drawing and the `nvidia-smi`-style matrix."""

from __future__ import annotations

from gpuyard.devices import draw, format_topo_matrix, get_preset, parse_topo_matrix


def test_draw_shows_switches_nics_nvlinks_and_holders() -> None:
    text = draw(get_preset("dgx1-v100", unhealthy=[7]), holders={0: "job-a", 1: "job-a", 4: "job-b"})
    assert text.startswith("NodeTopology dgx1-v100 (preset dgx1-v100): 8 GPUs Tesla-V100-SXM2-32GB")
    assert "pcie0 @ hb0: GPU0 [job-a]  GPU1 [job-a]  mlx5_0 (100 Gb/s RDMA)" in text
    assert "GPU7 !Unhealthy [-]" in text
    assert "GPU0  NV1:GPU1  NV1:GPU2  NV2:GPU3  NV2:GPU4" in text
    assert "socket 1" in text and "NUMA 1 (cpus 20-39,60-79)" in text


def test_draw_nvswitch_and_partitions() -> None:
    text = draw(get_preset("hgx-h100"))
    assert "NVLink: NVSwitch, every pair NV18" in text
    assert "partitions (Honor): " in text and "{0,1,2,3}" in text
    assert "[" not in text.split("\n")[2]  # no holder labels unless asked
    assert "NVLink: none" in draw(get_preset("pcie-t4x4"))
    assert "eth0 (25 Gb/s eth)" in draw(get_preset("pcie-t4x4"))


def test_matrix_text_parses_back() -> None:
    text = format_topo_matrix(get_preset("k80"))
    matrix = parse_topo_matrix(text)
    assert matrix.devices[-1] == "mlx4_0"
    assert matrix.labels[0][:3] == ("X", "PIX", "PHB")
    assert matrix.numa_affinity == (0, 0, 0, 0, 1, 1, 1, 1)
    assert "Legend:" in text
