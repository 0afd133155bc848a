"""`nvidia-smi topo -m` as real drivers print it: a table of hand-written matrices in the formats
NVIDIA documents and users paste (tab-separated or space-aligned, empty or missing affinity
columns, `GPU NUMA ID`, NICs as `NIC0` + NIC Legend or as `mlx5_0`, legends, ANSI colour, CRLF,
2 to 16 GPUs). Each case is checked for what the scheduler relies on: GPU and NIC names, link
labels, NUMA nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from gpuyard.devices import TopologyParseError, gpu_link, import_topology, nic_link
from gpuyard.devices.topo_import import TopologyWarning

LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def render(
    gpus: int,
    nics: list[str],
    link: Callable[[str, str], str],
    values: Callable[[int], list[str]],
    titles: list[str],
    *,
    nic_legend: dict[str, str] | None = None,
    tail: str = LEGEND,
) -> str:
    """A matrix as `nvidia-smi topo -m` prints it: tab-separated, ` X ` on the diagonal, values
    of the title columns on GPU rows only, each cell with its tab even when empty."""
    names = [f"GPU{i}" for i in range(gpus)] + nics
    lines = ["\t" + "\t".join(names + titles)]
    for a in names:
        cells = [" X " if a == b else link(a, b) for b in names]
        extra = values(int(a[3:])) if a.startswith("GPU") else []
        lines.append("\t".join([a, *cells, *extra]))
    out = "\n".join(lines) + "\n" + tail
    if nic_legend:
        out += "\nNIC Legend:\n\n" + "".join(f"  {k}: {v}\n" for k, v in nic_legend.items())
    return out


def socket_of(name: str, gpus: int, per_socket: int) -> int:
    index = int(name[3:]) if name.startswith("GPU") else int(name.rsplit("_", 1)[-1].lstrip("NIC"))
    return index // per_socket if name.startswith("GPU") else (index * gpus // 8) // per_socket


def hgx_h100_link(a: str, b: str) -> str:
    if a.startswith("GPU") and b.startswith("GPU"):
        return "NV18"
    ia = int(a.lstrip("GPUNIC").rsplit("_", 1)[-1])
    ib = int(b.lstrip("GPUNIC").rsplit("_", 1)[-1])
    if ia == ib:
        return "PIX"
    return "NODE" if ia // 4 == ib // 4 else "SYS"


HGX_NICS = [f"NIC{i}" for i in range(8)]
HGX_LEGEND = {f"NIC{i}": f"mlx5_{i}" for i in range(8)}
HGX_TITLES = ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]


def pairs_link(a: str, b: str) -> str:
    """Four PCIe GPUs bridged in NVLink pairs (0-1, 2-3), one NIC per pair."""
    ga, gb = a.startswith("GPU"), b.startswith("GPU")
    ia, ib = int(a[-1]), int(b[-1])
    pair_a = ia // 2 if ga else ia
    pair_b = ib // 2 if gb else ib
    if ga and gb and pair_a == pair_b:
        return "NV4"
    if pair_a == pair_b:
        return "PIX"
    return "NODE"


@dataclass
class Case:
    text: str
    gpus: int
    nics: list[str] = field(default_factory=list)
    links: dict[tuple[int, int], str] = field(default_factory=dict)
    nic_links: dict[tuple[int, str], str] = field(default_factory=dict)
    numa: list[int] | None = None


def _cases() -> dict[str, Case]:
    hgx = render(
        8, HGX_NICS, hgx_h100_link, lambda i: ["", str(i // 4), "N/A"], HGX_TITLES, nic_legend=HGX_LEGEND
    )
    h100_expect = {
        "gpus": 8,
        "nics": [f"mlx5_{i}" for i in range(8)],
        "links": {(0, 7): "NV18", (3, 4): "NV18"},
        "nic_links": {(0, "mlx5_0"): "PIX", (1, "mlx5_0"): "NODE", (5, "mlx5_0"): "SYS"},
        "numa": [0, 0, 0, 0, 1, 1, 1, 1],
    }
    return {
        "hgx-h100 empty CPU Affinity, NIC legend": Case(hgx, **h100_expect),  # type: ignore[arg-type]
        "hgx-h100 ANSI-underlined header": Case(
            "\x1b[4m" + hgx.replace("\n", "\x1b[0m\n", 1),
            **h100_expect,  # type: ignore[arg-type]
        ),
        "hgx-h100 pasted from a terminal (tabs expanded)": Case(
            "\n".join(line.expandtabs(8) for line in hgx.splitlines()) + "\n",
            **h100_expect,  # type: ignore[arg-type]
        ),
        "hgx-h100 CRLF line endings": Case(hgx.replace("\n", "\r\n"), **h100_expect),  # type: ignore[arg-type]
        "2 PCIe GPUs, host bridge, no NICs": Case(
            render(2, [], lambda a, b: "PHB", lambda i: ["0-15", "0"], ["CPU Affinity", "NUMA Affinity"]),
            gpus=2,
            links={(0, 1): "PHB"},
            numa=[0, 0],
        ),
        "4 GPUs in NVLink pairs, mlx5 NICs, GPU NUMA ID": Case(
            render(
                4,
                ["mlx5_0", "mlx5_1"],
                pairs_link,
                lambda i: ["0-31,64-95", "0", "N/A"],
                HGX_TITLES,
            ),
            gpus=4,
            nics=["mlx5_0", "mlx5_1"],
            links={(0, 1): "NV4", (2, 3): "NV4", (1, 2): "NODE"},
            nic_links={(0, "mlx5_0"): "PIX", (3, "mlx5_1"): "PIX", (0, "mlx5_1"): "NODE"},
            numa=[0, 0, 0, 0],
        ),
        "16 GPUs over NVSwitch, two sockets": Case(
            render(
                16,
                [],
                lambda a, b: "NV6",
                lambda i: ["0-23,48-71" if i < 8 else "24-47,72-95", str(i // 8)],
                ["CPU Affinity", "NUMA Affinity"],
            ),
            gpus=16,
            links={(0, 15): "NV6", (9, 10): "NV6"},
            numa=[0] * 8 + [1] * 8,
        ),
        "10 PCIe GPUs under two switches per socket": Case(
            render(
                10,
                [],
                lambda a, b: (
                    "PIX"
                    if int(a[3:]) // 5 == int(b[3:]) // 5 and int(a[3:]) % 5 < 3 and int(b[3:]) % 5 < 3
                    else ("PXB" if int(a[3:]) // 5 == int(b[3:]) // 5 else "SYS")
                ),
                lambda i: ["0-19" if i < 5 else "20-39", str(i // 5)],
                ["CPU Affinity", "NUMA Affinity"],
            ),
            gpus=10,
            links={(0, 1): "PIX", (0, 4): "PXB", (4, 5): "SYS", (7, 5): "PIX", (9, 5): "PXB"},
            numa=[0] * 5 + [1] * 5,
        ),
        "only a CPU Affinity column (older drivers)": Case(
            render(2, [], lambda a, b: "SYS", lambda i: [f"{i * 8}-{i * 8 + 7}"], ["CPU Affinity"]),
            gpus=2,
            links={(0, 1): "SYS"},
            numa=[0, 1],
        ),
        "no affinity columns, no legend": Case(
            render(4, [], lambda a, b: "NV2", lambda i: [], [], tail=""), gpus=4, links={(0, 3): "NV2"}
        ),
        "GPU NUMA ID holding numbers (Grace Hopper)": Case(
            render(1, [], lambda a, b: "X", lambda i: ["0-71", "0", "1"], HGX_TITLES),
            gpus=1,
            numa=[0],
        ),
        "empty NUMA Affinity and GPU NUMA ID, NIC rows with trailing tabs": Case(
            render(
                2,
                ["mlx5_0"],
                lambda a, b: "PIX" if "mlx5_0" in (a, b) and "GPU0" in (a, b) else "PHB",
                lambda i: ["0-7", "", ""],
                HGX_TITLES,
            ).replace("mlx5_0\tPIX\tPHB\t X ", "mlx5_0\tPIX\tPHB\t X \t\t\t"),
            gpus=2,
            nics=["mlx5_0"],
            links={(0, 1): "PHB"},
            nic_links={(0, "mlx5_0"): "PIX", (1, "mlx5_0"): "PHB"},
        ),
        "title line before the header": Case(
            "GPU Topology:\n\n" + render(2, [], lambda a, b: "NV1", lambda i: ["0-3", "0"], HGX_TITLES[:2]),
            gpus=2,
            links={(0, 1): "NV1"},
            numa=[0, 0],
        ),
    }


CASES = _cases()


@pytest.mark.parametrize("name", list(CASES))
def test_real_formats_are_read(name: str) -> None:
    case = CASES[name]
    topo = import_topology(case.text, name="n")
    assert topo.gpu_count == case.gpus
    assert [nic.name for nic in topo.spec.nics] == case.nics
    for (a, b), label in case.links.items():
        assert gpu_link(topo, a, b).label == label, (a, b)
    for (gpu, nic), label in case.nic_links.items():
        assert nic_link(topo, gpu, nic).label == label, (gpu, nic)
    if case.numa is not None:
        assert [g.numa_node for g in topo.spec.gpus] == case.numa


def test_a_tab_row_missing_a_value_is_read_with_a_warning() -> None:
    text = render(2, [], lambda a, b: "PHB", lambda i: ["0-15", "0"], ["CPU Affinity", "NUMA Affinity"])
    short = text.replace("PHB\t0-15\t0\nGPU1", "PHB\t0-15\nGPU1")
    warnings: list[TopologyWarning] = []
    topo = import_topology(short, on_warning=warnings.append)
    assert topo.gpu_count == 2 and gpu_link(topo, 0, 1).label == "PHB"
    assert [(w.line, "has 1 values" in w.message, "expected 2" in w.message) for w in warnings] == [
        (2, True, True)
    ]
    assert [g.numa_node for g in topo.spec.gpus] == [0, 0]  # NUMA 0 from GPU1, PHB: the same node


def test_more_values_than_titles_are_ignored_with_a_warning() -> None:
    text = render(2, [], lambda a, b: "PHB", lambda i: ["0-15", "0", "7"], ["CPU Affinity", "NUMA Affinity"])
    warnings: list[TopologyWarning] = []
    topo = import_topology(text, on_warning=warnings.append)
    assert [g.numa_node for g in topo.spec.gpus] == [0, 0]
    assert len(warnings) == 2 and all("ignored: 7" in w.message for w in warnings)


def test_a_row_missing_a_link_cell_is_still_refused_with_line_and_column() -> None:
    text = render(3, [], lambda a, b: "PHB", lambda i: ["0-15", "0"], ["CPU Affinity", "NUMA Affinity"])
    broken = text.replace("GPU1\tPHB\t X \tPHB\t0-15", "GPU1\tPHB\t X \t0-15")
    with pytest.raises(TopologyParseError) as info:
        import_topology(broken)
    assert (
        info.value.line == 3
        and "only 2 link cells before its affinity values; expected 3" in info.value.message
    )
