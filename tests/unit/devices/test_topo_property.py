"""`nvidia-smi topo -m` as any machine may print it: hypothesis generates matrices (1-16 GPUs, 0-4
NICs, NV#/PIX/PXB/PHB/NODE/SYS/SOC links from a consistent PCIe/NUMA layout, optional affinity
columns, a column title gpuyard does not read, blank cells, extra values, MIG rows, legends, NIC
legends, ANSI colour codes, trailing whitespace, tabs or a terminal's aligned spaces, CRLF) and every
one must import with the right GPUs, NICs, link tiers and NUMA nodes; what is read but not used is a
warning, never an error. Every real capture in tests/data/topo imports too."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuyard.devices import gpu_link, import_topology, nic_link
from gpuyard.devices.topo_import import TopologyWarning

from .conftest import DATA

LEGEND = """Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""
TITLES = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
COLOURS = ("\x1b[4m", "\x1b[1m", "\x1b[32m", "\x1b[1;31m", "\x1b[7m")
RESET = "\x1b[0m"


@dataclass
class Machine:
    """What the generated text says: the expected reading of it."""

    text: str
    gpus: int
    nics: list[str]  # names after the NIC Legend
    links: dict[tuple[int, int], str]  # every pair of devices (GPUs first, then NICs)
    numa: list[int] | None  # per GPU, when the NUMA Affinity column gives all
    warned: set[str] = field(default_factory=set)  # words the warnings must contain


def _tier(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> str:
    """PCIe tier of two devices at (numa, host bridge, switch tree, switch)."""
    if a == b:
        return "PIX"
    if a[:3] == b[:3]:
        return "PXB"
    if a[:2] == b[:2]:
        return "PHB"
    return "NODE" if a[0] == b[0] else "SYS"


@st.composite
def machines(draw: st.DrawFn) -> Machine:
    n = draw(st.integers(1, 16))
    m = draw(st.integers(0, 4))
    numas = draw(st.integers(1, 4))
    place = st.tuples(st.integers(0, numas - 1), st.integers(0, 1), st.integers(0, 1), st.integers(0, 2))
    where = [draw(place) for _ in range(n + m)]
    legacy_soc = draw(st.booleans())
    labels: dict[tuple[int, int], str] = {}
    for i in range(n + m):
        for j in range(i + 1, n + m):
            label = _tier(where[i], where[j])
            if i < n and j < n and draw(st.integers(0, 3)) == 0:
                label = f"NV{draw(st.integers(1, 18))}"
            labels[(i, j)] = labels[(j, i)] = label
    nic_style = draw(st.sampled_from(["NIC", "mlx5"]))
    raw_nics = [f"NIC{k}" if nic_style == "NIC" else f"mlx5_{k}" for k in range(m)]
    legend_nics = nic_style == "NIC" and m > 0 and draw(st.booleans())
    nics = [f"mlx5_{k}" for k in range(m)] if legend_nics else raw_nics
    titles = [t for t in TITLES if draw(st.booleans())]
    unknown_title = draw(st.booleans())
    if unknown_title:
        titles.append("GPU Fabric Thing")
    tabbed = draw(st.booleans())
    blank_cpu = "CPU Affinity" in titles and draw(st.booleans())
    extra_value = draw(st.booleans())
    blank_cell = tabbed and n + m > 1 and draw(st.booleans())
    mig_row = draw(st.booleans())
    warned: set[str] = set()
    if unknown_title:
        warned.add("GPU Fabric Thing")
    if extra_value:
        warned.add("ignored: 99")
    if mig_row:
        warned.add("MIG device row")

    names = [f"GPU{i}" for i in range(n)] + raw_nics
    colour = draw(st.booleans())

    def paint(text: str) -> str:
        if colour and draw(st.integers(0, 5)) == 0:
            return draw(st.sampled_from(COLOURS)) + text + RESET
        return text

    def cell(i: int, j: int) -> str:
        if i == j:
            return draw(st.sampled_from([" X ", "X"]))
        label = labels[(i, j)]
        if label == "SYS" and legacy_soc:
            label = "SOC"
        return paint(label)

    blank_at = None
    if blank_cell:
        i = draw(st.integers(0, n + m - 1))
        j = draw(st.integers(0, n + m - 1).filter(lambda x: x != i))
        blank_at = (i, j)
        warned.add("is blank")
    header = "\t" + "\t".join(paint(x) for x in names + titles)
    if draw(st.booleans()):  # current drivers underline the header even in a pipe
        header = "\t\x1b[4m" + header[1:] + RESET
    lines = [header]
    for i, name in enumerate(names):
        cells = ["" if blank_at == (i, j) else cell(i, j) for j in range(n + m)]
        values: list[str] = []
        if i < n:
            for title in titles:
                if title == "CPU Affinity":
                    lo = where[i][0] * 16
                    values.append("" if blank_cpu else f"{lo}-{lo + 15}")
                elif title == "NUMA Affinity":
                    values.append(str(where[i][0]))
                elif title == "GPU NUMA ID":
                    values.append("N/A")
                else:
                    values.append(draw(st.sampled_from(["0x1", "N/A", "on"])))
            if extra_value:
                values.append("99")
        trail = draw(st.sampled_from(["", " ", "\t", "  \t"]))
        lines.append("\t".join([name, *cells, *values]) + trail)
        if mig_row and i == 0:
            lines.append("MIG 1g.10gb Device 0\t" + "\t".join("SYS" for _ in range(n + m)))
    text = "\n".join(lines) + "\n"
    if draw(st.booleans()):
        text += "\n" + LEGEND
    if legend_nics:
        text += "\nNIC Legend:\n\n" + "".join(f"  NIC{k}: mlx5_{k}\n" for k in range(m))
    if not tabbed:  # pasted from a terminal: tabs expanded to aligned spaces
        text = "\n".join(line.expandtabs(8) for line in text.split("\n"))
    if draw(st.booleans()):
        text = text.replace("\n", "\r\n")
    numa = [where[i][0] for i in range(n)] if "NUMA Affinity" in titles else None
    return Machine(text, n, nics, labels, numa, warned)  # a blank cell reads as its mirror


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(machines())
def test_generated_matrices_import(machine: Machine) -> None:
    warnings: list[TopologyWarning] = []
    topo = import_topology(machine.text, name="gen", on_warning=warnings.append)
    n = machine.gpus
    assert topo.gpu_count == n
    assert [nic.name for nic in topo.spec.nics] == machine.nics
    for i in range(n):
        for j in range(n):
            if i != j:
                assert gpu_link(topo, i, j).label == machine.links[(i, j)], (i, j)
        for k, nic in enumerate(machine.nics):
            assert nic_link(topo, i, nic).label == machine.links[(i, n + k)], (i, nic)
    if machine.numa is not None:
        assert [g.numa_node for g in topo.spec.gpus] == machine.numa
    said = " | ".join(w.message for w in warnings)
    for word in machine.warned:
        assert word in said, (word, said)
    if not machine.warned:
        assert warnings == []
    assert all(w.line >= 1 and w.column >= 1 for w in warnings)


@pytest.mark.parametrize("path", sorted(DATA.glob("*.txt")), ids=lambda p: p.name)
def test_every_real_capture_imports(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    warnings: list[TopologyWarning] = []
    topo = import_topology(text, name=path.stem, on_warning=warnings.append)
    header = next(line for line in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines() if "GPU0" in line)
    assert topo.gpu_count == len(re.findall(r"\bGPU\d+\b", header))
    assert warnings == []
    assert all(g.numa_node >= 0 for g in topo.spec.gpus)
