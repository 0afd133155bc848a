"""Import a real `nvidia-smi topo -m` matrix as a NodeTopology (`gpuyard devices import-topo`).

Accepted input is the matrix exactly as printed by current and older drivers, tab- or
space-separated: a header of device columns (`GPU0..`, then NICs as `mlx5_*` or `NIC#`), optional
`CPU Affinity`, `NUMA Affinity` and `GPU NUMA ID` columns (a cell may be empty: some drivers
print no CPU affinity on HGX H100; in a space-aligned copy a CPU list is told from a NUMA id by its
form), one row per device, then the optional
`Legend:` and `NIC Legend:` blocks (`NIC0: mlx5_0` renames the NIC columns). Blank lines and lines
ending in `:` (e.g. `GPU Topology:`) may precede the header.

Anything else is rejected with :class:`TopologyParseError`, which carries the 1-based line and
column and names what is allowed: unknown cells, rows that do not match the header (non-square
matrices, missing or duplicate rows), `X` off the diagonal, NVLink to a NIC, asymmetric cells, and
NUMA affinities that contradict a same-NUMA link.

:func:`topology_from_links` turns a label matrix into the structural model (it is shared with NVML
discovery): NV# cells become NVLink peers; PIX groups become PCIe switches, PXB groups their parent
switch, PHB groups a host bridge; NUMA nodes come from the NUMA Affinity column, else from
NODE-or-closer links and equal CPU affinities. `nvidia-smi` prints no sockets: each NUMA node is
taken as its own socket unless `numa_to_socket` says otherwise. The labels themselves are kept as
the topology's `link_matrix` / `nic_link_matrix`, so imported tiers are exactly the input's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuyard.apis.devices import GPUDevice, NICDevice, NodeTopology, NodeTopologySpec, NUMANode, PCIeSwitch
from gpuyard.apis.meta import ObjectMeta
from gpuyard.devices.bandwidth import model_key
from gpuyard.devices.tiers import ALLOWED_LINKS, Link, LinkTier, parse_link

__all__ = [
    "MAX_DIRECT_NVLINKS",
    "TopoMatrix",
    "TopologyParseError",
    "import_topology",
    "load_topology_file",
    "parse_topo_matrix",
    "topology_from_links",
]

MAX_DIRECT_NVLINKS = 18
"""No GPU has more NVLinks than this; a GPU showing more in total reaches its peers via NVSwitch."""

_GPU_RE = re.compile(r"^GPU(\d+)$")
_NIC_NAME_RE = re.compile(r"^[A-Za-z][\w.:-]*$")
_CPUS_RE = re.compile(r"^(N/A|\d+(-\d+)?(,\d+(-\d+)?)*)$")
_CPU_LIST_RE = re.compile(r"^\d+(-\d+|(,\d+(-\d+)?)+)(,\d+(-\d+)?)*$")  # a range or a list: not a NUMA id
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_TITLES = (("CPU", "Affinity"), ("NUMA", "Affinity"), ("GPU", "NUMA", "ID"))
_TITLES_ALLOWED = "CPU Affinity, NUMA Affinity, GPU NUMA ID"
_TOKEN_RE = re.compile(r"\S+")
_PCIE = (LinkTier.PIX, LinkTier.PXB, LinkTier.PHB)


class TopologyParseError(ValueError):
    """A matrix that is not valid `nvidia-smi topo -m` output; `line`/`column` are 1-based."""

    def __init__(self, message: str, *, line: int, column: int) -> None:
        super().__init__(f"line {line}, column {column}: {message}")
        self.message = message
        self.line = line
        self.column = column


@dataclass(frozen=True, slots=True)
class TopoMatrix:
    """A parsed matrix: device names (GPUs first, NICs renamed by the NIC Legend) and labels."""

    devices: tuple[str, ...]
    gpu_count: int
    labels: tuple[tuple[str, ...], ...]
    cpu_affinity: tuple[str, ...]
    numa_affinity: tuple[int | None, ...]
    legend: dict[str, str] = field(default_factory=dict)

    @property
    def nic_names(self) -> tuple[str, ...]:
        return self.devices[self.gpu_count :]


def _tokens(line: str) -> list[tuple[str, int]]:
    return [(m.group(0), m.start() + 1) for m in _TOKEN_RE.finditer(line)]


def _parse_header(toks: list[tuple[str, int]], lineno: int) -> tuple[list[str], list[str]]:
    """The device columns and the titles of the value columns after them."""
    devices: list[str] = []
    pos = 0
    while pos < len(toks):
        text, col = toks[pos]
        if text in ("CPU", "NUMA") or (text == "GPU" and pos + 1 < len(toks) and toks[pos + 1][0] == "NUMA"):
            break
        gpu = _GPU_RE.match(text)
        if gpu:
            if len(devices) != int(gpu.group(1)):
                raise TopologyParseError(
                    f"column {text!r} out of order; GPU columns must come first as GPU0, GPU1, ... (expected GPU{len(devices)})",
                    line=lineno,
                    column=col,
                )
        elif not _NIC_NAME_RE.match(text) or parse_link_or_none(text) is not None:
            raise TopologyParseError(
                f"{text!r} is not a device column; allowed: GPU<n>, NIC<n> or a NIC name like mlx5_0",
                line=lineno,
                column=col,
            )
        elif not any(_GPU_RE.match(d) for d in devices):
            raise TopologyParseError(
                f"column {text!r} comes before GPU0; GPU columns come first", line=lineno, column=col
            )
        if text in devices:
            raise TopologyParseError(f"column {text!r} appears twice", line=lineno, column=col)
        devices.append(text)
        pos += 1
    titles: list[str] = []
    while pos < len(toks):
        for title in _TITLES:
            if tuple(t for t, _ in toks[pos : pos + len(title)]) == title:
                titles.append(" ".join(title))
                pos += len(title)
                break
        else:
            raise TopologyParseError(
                f"unknown column title starting at {toks[pos][0]!r}; allowed: {_TITLES_ALLOWED}",
                line=lineno,
                column=toks[pos][1],
            )
    return devices, titles


def _row_values(line: str, toks: list[tuple[str, int]], *, links: int, titles: list[str]) -> list[str] | None:
    """A row's values of the title columns after its `links` link cells, an empty cell as `N/A`
    (drivers leave CPU Affinity, or GPU NUMA ID, empty on some systems). In a tab-separated row
    every cell keeps its tab, so an empty one shows; in a space-aligned copy a CPU list (`0-47`,
    `0,2`) is the CPU Affinity and the other values fill the remaining titles in order. None when
    the row has more values than titles, or a tab-separated row lacks a cell."""
    extra = [t for t, _ in toks[1 + links :]]
    if len(extra) == len(titles):
        return extra
    if len(extra) > len(titles):
        return None
    if "\t" in line:
        fields = line.split("\t")[1 + links :]
        if len(fields) < len(titles) or any(f.strip() for f in fields[len(titles) :]):
            return None
        return [f.strip() or "N/A" for f in fields[: len(titles)]]
    values = dict.fromkeys(titles, "N/A")
    if "CPU Affinity" in values and extra and _CPU_LIST_RE.match(extra[0]):
        values["CPU Affinity"] = extra.pop(0)
    for title, value in zip([t for t in titles if t != "CPU Affinity"], extra, strict=False):
        values[title] = value
    return list(values.values())


def parse_link_or_none(text: str) -> Link | None:
    try:
        return parse_link(text)
    except ValueError:
        return None


def parse_topo_matrix(text: str) -> TopoMatrix:
    """Parse and validate `nvidia-smi topo -m` text (module doc); TopologyParseError otherwise.

    Terminal escapes are dropped first: current drivers underline the header line with ANSI
    codes even when the output is piped to a file.
    """
    lines = _ANSI.sub("", text).splitlines()
    idx = 0
    while idx < len(lines) and (not lines[idx].strip() or lines[idx].rstrip().endswith(":")):
        idx += 1
    if idx == len(lines):
        raise TopologyParseError(
            "no matrix found; expected a header line starting with GPU0", line=max(1, len(lines)), column=1
        )
    header = _tokens(lines[idx])
    if header[0][0] != "GPU0":
        raise TopologyParseError(
            f"expected the matrix header starting with GPU0, got {header[0][0]!r}",
            line=idx + 1,
            column=header[0][1],
        )
    devices, titles = _parse_header(header, idx + 1)
    gpu_count = sum(1 for d in devices if _GPU_RE.match(d))
    d = len(devices)
    rows: dict[str, tuple[list[Link], list[int], int, list[str]]] = {}
    idx += 1
    last = idx - 1  # the header line, until rows follow
    while idx < len(lines):
        toks = _tokens(lines[idx])
        if not toks or toks[0][0] in ("Legend:", "NIC"):
            break
        lineno = idx + 1
        name, col = toks[0]
        if name not in devices:
            raise TopologyParseError(
                f"row {name!r} is not a column of the header; columns: {', '.join(devices)}",
                line=lineno,
                column=col,
            )
        if name in rows:
            raise TopologyParseError(f"row {name!r} appears twice", line=lineno, column=col)
        cells, cols = [], []
        for j in range(d):
            if 1 + j >= len(toks):
                raise TopologyParseError(
                    f"row {name!r} has {j} link cells; expected {d} (one per column {devices[0]}..{devices[-1]})",
                    line=lineno,
                    column=len(lines[idx]) + 1,
                )
            cell, ccol = toks[1 + j]
            link = parse_link_or_none(cell)
            if link is None:
                if _CPUS_RE.match(cell):
                    raise TopologyParseError(
                        f"row {name!r} has only {j} link cells before its affinity values; expected {d}",
                        line=lineno,
                        column=ccol,
                    )
                raise TopologyParseError(
                    f"unknown link {cell!r} in row {name}, column {devices[j]}; allowed: {ALLOWED_LINKS}",
                    line=lineno,
                    column=ccol,
                )
            cells.append(link)
            cols.append(ccol)
        is_gpu = devices.index(name) < gpu_count
        extra: list[str] | None = []
        if is_gpu or len(toks) > 1 + d:
            extra = _row_values(lines[idx], toks, links=d, titles=titles)
        if extra is None:
            where = toks[1 + d][1] if len(toks) > 1 + d else len(lines[idx]) + 1
            raise TopologyParseError(
                f"row {name!r} has {len(toks) - 1 - d} values after its {d} link cells; expected {len(titles)} ({', '.join(titles) or 'none'})",
                line=lineno,
                column=where,
            )
        rows[name] = (cells, cols, lineno, extra)
        last = idx
        idx += 1
    missing = [dev for dev in devices if dev not in rows]
    if missing:
        raise TopologyParseError(
            f"the matrix is not square: {d} device columns but {len(rows)} rows; missing rows: {', '.join(missing)}",
            line=last + 2,
            column=1,
        )
    legend, nic_legend = _parse_trailer(lines, idx)
    _validate_cells(devices, gpu_count, rows)
    cpu, numa = _affinities(devices[:gpu_count], titles, rows)
    _check_numa(devices, gpu_count, rows, numa)
    renamed = list(devices)
    for nic, (target, lineno, col) in nic_legend.items():
        if nic not in devices[gpu_count:]:
            raise TopologyParseError(
                f"NIC Legend names {nic!r}, which is not a column of the matrix", line=lineno, column=col
            )
        if target in renamed:
            raise TopologyParseError(
                f"NIC Legend maps {nic!r} to {target!r}, which is already a column", line=lineno, column=col
            )
        renamed[devices.index(nic)] = target
    labels = tuple(tuple(rows[dev][0][j].label for j in range(d)) for dev in devices)
    return TopoMatrix(tuple(renamed), gpu_count, labels, tuple(cpu), tuple(numa), legend)


def _parse_trailer(lines: list[str], idx: int) -> tuple[dict[str, str], dict[str, tuple[str, int, int]]]:
    legend: dict[str, str] = {}
    nic_legend: dict[str, tuple[str, int, int]] = {}
    section = None
    for pos in range(idx, len(lines)):
        text = lines[pos].strip()
        if not text:
            continue
        if text == "Legend:":
            section = "legend"
            continue
        if text == "NIC Legend:":
            section = "nic"
            continue
        col = len(lines[pos]) - len(lines[pos].lstrip()) + 1
        if section == "legend" and "=" in text:
            key, _, meaning = text.partition("=")
            legend[key.strip()] = meaning.strip()
            continue
        match = re.match(r"^(NIC\d+)\s*:\s*(\S+)$", text)
        if section == "nic" and match:
            nic_legend[match.group(1)] = (match.group(2), pos + 1, col)
            continue
        raise TopologyParseError(
            f"unexpected text after the matrix: {text[:40]!r}; allowed: blank lines, a 'Legend:' block of 'LABEL = meaning' "
            "lines, a 'NIC Legend:' block of 'NIC0: mlx5_0' lines",
            line=pos + 1,
            column=col,
        )
    return legend, nic_legend


def _validate_cells(
    devices: list[str], gpu_count: int, rows: dict[str, tuple[list[Link], list[int], int, list[str]]]
) -> None:
    for i, a in enumerate(devices):
        cells, cols, lineno, _ = rows[a]
        for j, b in enumerate(devices):
            link = cells[j]
            if (i == j) != (link.tier is LinkTier.X):
                what = "the diagonal must be X" if i == j else "X (self) appears off the diagonal"
                raise TopologyParseError(
                    f"row {a}, column {b} is {link.label}: {what}", line=lineno, column=cols[j]
                )
            if link.tier is LinkTier.NV and (i >= gpu_count or j >= gpu_count):
                raise TopologyParseError(
                    f"row {a}, column {b} is {link.label}; NVLink joins GPUs only, allowed here: PIX, PXB, PHB, NODE, SYS",
                    line=lineno,
                    column=cols[j],
                )
            if j < i and link != rows[b][0][i]:
                raise TopologyParseError(
                    f"row {a}, column {b} is {link.label} but row {b}, column {a} is {rows[b][0][i].label}; the matrix must be symmetric",
                    line=lineno,
                    column=cols[j],
                )


def _affinities(
    gpus: list[str], titles: list[str], rows: Mapping[str, tuple[Any, Any, int, list[str]]]
) -> tuple[list[str], list[int | None]]:
    cpu: list[str] = []
    numa: list[int | None] = []
    for gpu in gpus:
        values = dict(zip(titles, rows[gpu][3], strict=True))
        cpus = values.get("CPU Affinity", "")
        cpu.append("" if cpus == "N/A" else cpus)
        raw = values.get("NUMA Affinity", "")
        numa.append(int(raw) if raw.isdigit() else None)
    return cpu, numa


def _check_numa(
    devices: list[str], gpu_count: int, rows: Mapping[str, tuple[Any, Any, int, Any]], numa: list[int | None]
) -> None:
    for i in range(gpu_count):
        cells, cols, lineno, _ = rows[devices[i]]
        for j in range(gpu_count):
            link = cells[j]
            if link.tier in (*_PCIE, LinkTier.NODE) and None not in (numa[i], numa[j]) and numa[i] != numa[j]:
                raise TopologyParseError(
                    f"{devices[i]} and {devices[j]} are {link.label} (one NUMA node) but their NUMA Affinity differs "
                    f"({numa[i]} vs {numa[j]})",
                    line=lineno,
                    column=cols[j],
                )


class _UnionFind:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def topology_from_links(
    *,
    name: str,
    gpu_count: int,
    nic_names: Sequence[str],
    labels: Sequence[Sequence[str]],
    pcie_labels: Sequence[Sequence[str]] | None = None,
    gpu_numa: Sequence[int | None] = (),
    gpu_cpus: Sequence[str] = (),
    gpu_fields: Sequence[Mapping[str, Any]] = (),
    gpu_model: str = "",
    memory_mib: int = 0,
    nic_gbps: float = 100.0,
    numa_to_socket: Mapping[int, int] | None = None,
) -> NodeTopology:
    """Build the structural model from a validated device x device label matrix (module doc).

    `labels` covers GPUs first, then NICs. `pcie_labels`, when the caller knows it (NVML does), is
    the PCIe tier of every pair even where NVLink hides it in `labels`; the switch / NUMA structure
    is built from it. `gpu_fields` optionally gives per-GPU extra fields (uuid, pci_bus_id, model,
    memory_mib, health, minor) that override `gpu_model`/`memory_mib`.
    """
    d = gpu_count + len(nic_names)
    links = [[parse_link(labels[i][j]) for j in range(d)] for i in range(d)]
    pcie = (
        links
        if pcie_labels is None
        else [[parse_link(pcie_labels[i][j]) for j in range(d)] for i in range(d)]
    )
    numa_in = list(gpu_numa) + [None] * (gpu_count - len(gpu_numa))
    cpus_in = list(gpu_cpus) + [""] * (gpu_count - len(gpu_cpus))
    leaf, tree, host, node = (_UnionFind(d) for _ in range(4))
    in_pcie = [False] * d
    for i in range(d):
        for j in range(i + 1, d):
            tier = pcie[i][j].tier
            if tier in _PCIE:
                in_pcie[i] = in_pcie[j] = True
                host.union(i, j)
                if tier is not LinkTier.PHB:
                    tree.union(i, j)
                if tier is LinkTier.PIX:
                    leaf.union(i, j)
            if tier in (*_PCIE, LinkTier.NODE):
                node.union(i, j)
    for i in range(gpu_count):
        for j in range(i + 1, gpu_count):
            same_numa = numa_in[i] is not None and numa_in[i] == numa_in[j]
            same_cpus = (
                numa_in[i] is None
                and numa_in[j] is None
                and cpus_in[i]
                and cpus_in[i] == cpus_in[j]
                and pcie[i][j].tier is not LinkTier.SYS  # SYS crosses NUMA nodes, whatever the CPU lists say
            )
            if same_numa or same_cpus:
                node.union(i, j)
    numa_of = _numa_ids(gpu_count, d, node, numa_in)
    gpu_numas = sorted({numa_of[i] for i in range(gpu_count)})
    socket_map = (
        dict(numa_to_socket) if numa_to_socket is not None else {n: pos for pos, n in enumerate(gpu_numas)}
    )
    missing = [n for n in gpu_numas if n not in socket_map]
    if missing:
        raise ValueError(f"numa_to_socket has no socket for NUMA node(s) {missing}")

    def sock(numa: int) -> int:
        return socket_map[numa] if numa >= 0 else -1

    leaf_name: dict[int, str] = {}
    tree_name: dict[int, str] = {}
    switches: list[PCIeSwitch] = []
    tree_leaves: dict[int, set[int]] = {}
    host_trees: dict[int, set[int]] = {}
    for i in range(d):
        if in_pcie[i]:
            tree_leaves.setdefault(tree.find(i), set()).add(leaf.find(i))
            host_trees.setdefault(host.find(i), set()).add(tree.find(i))
    host_name = {
        h: f"hb{pos}" for pos, h in enumerate(sorted(h for h, ts in host_trees.items() if len(ts) > 1))
    }
    for t in sorted(tree_leaves):
        if len(tree_leaves[t]) > 1:
            tree_name[t] = f"pcie-up{len(tree_name)}"
            numa = numa_of[t]
            switches.append(
                PCIeSwitch(
                    name=tree_name[t],
                    host_bridge=host_name.get(host.find(t)),
                    numa_node=numa,
                    socket=sock(numa),
                )
            )
    for i in range(d):
        root = leaf.find(i)
        if in_pcie[i] and root not in leaf_name:
            leaf_name[root] = f"pcie{len(leaf_name)}"
            t = tree.find(i)
            parent = tree_name.get(t)
            switches.append(
                PCIeSwitch(
                    name=leaf_name[root],
                    parent=parent,
                    host_bridge=None if parent else host_name.get(host.find(i)),
                    numa_node=numa_of[i],
                    socket=sock(numa_of[i]),
                )
            )

    def switch_of(i: int) -> str | None:
        return leaf_name[leaf.find(i)] if in_pcie[i] else None

    gpus = []
    for i in range(gpu_count):
        peers = {j: links[i][j].nvlinks for j in range(gpu_count) if links[i][j].tier is LinkTier.NV}
        extra = dict(gpu_fields[i]) if i < len(gpu_fields) else {}
        model = extra.pop("model", gpu_model)
        gpus.append(
            GPUDevice(
                index=i,
                model=model,
                model_key=model_key(model),
                memory_mib=extra.pop("memory_mib", memory_mib),
                pcie_switch=switch_of(i),
                numa_node=numa_of[i],
                socket=sock(numa_of[i]),
                nvlink_peers=peers,
                nvswitch=sum(peers.values()) > MAX_DIRECT_NVLINKS,
                **extra,
            )
        )
    nics = [
        NICDevice(
            name=nic,
            pcie_switch=switch_of(gpu_count + k),
            numa_node=numa_of[gpu_count + k],
            socket=sock(numa_of[gpu_count + k]),
            bandwidth_gbps=nic_gbps,
        )
        for k, nic in enumerate(nic_names)
    ]
    cpus_by_numa: dict[int, str] = {}
    for i in range(gpu_count):
        cpus_by_numa.setdefault(numa_of[i], cpus_in[i])
    spec = NodeTopologySpec(
        gpus=gpus,
        nics=nics,
        sockets=max(1, len({sock(n) for n in gpu_numas})),
        numa_nodes=[NUMANode(id=n, socket=sock(n), cpus=cpus_by_numa.get(n, "")) for n in gpu_numas],
        pcie_switches=switches,
        link_matrix=[[links[i][j].label for j in range(gpu_count)] for i in range(gpu_count)],
        nic_link_matrix=[[links[i][j].label for j in range(gpu_count, d)] for i in range(gpu_count)]
        if nic_names
        else None,
    )
    return NodeTopology(metadata=ObjectMeta(name=name), spec=spec)


def _numa_ids(gpu_count: int, d: int, node: _UnionFind, numa_in: list[int | None]) -> list[int]:
    """NUMA id per device: the GPUs' NUMA Affinity where given, else numbered; NIC-only groups -1."""
    group_numa: dict[int, int] = {}
    for i in range(gpu_count):
        numa = numa_in[i]
        if numa is not None:
            group_numa.setdefault(node.find(i), numa)
    used = set(group_numa.values())
    nxt = 0
    for i in range(gpu_count):
        g = node.find(i)
        if g not in group_numa:
            while nxt in used:
                nxt += 1
            group_numa[g] = nxt
            used.add(nxt)
    return [group_numa.get(node.find(i), -1) for i in range(d)]


def import_topology(
    text: str,
    *,
    name: str = "imported",
    gpu_model: str = "",
    memory_mib: int = 0,
    nic_gbps: float = 100.0,
    numa_to_socket: Mapping[int, int] | None = None,
) -> NodeTopology:
    """Parse `nvidia-smi topo -m` text into a NodeTopology named `name` (see the module doc).

    The matrix does not say which GPU model, how much memory, or the NICs' line rate: pass them.
    """
    matrix = parse_topo_matrix(text)
    return topology_from_links(
        name=name,
        gpu_count=matrix.gpu_count,
        nic_names=matrix.nic_names,
        labels=matrix.labels,
        gpu_numa=matrix.numa_affinity,
        gpu_cpus=matrix.cpu_affinity,
        gpu_model=gpu_model,
        memory_mib=memory_mib,
        nic_gbps=nic_gbps,
        numa_to_socket=numa_to_socket,
    )


def load_topology_file(path: str | Path, **kwargs: Any) -> NodeTopology:
    """:func:`import_topology` on a file; the node name defaults to the file's stem."""
    file = Path(path)
    kwargs.setdefault("name", file.stem)
    return import_topology(file.read_text(encoding="utf-8"), **kwargs)
