"""Import a real `nvidia-smi topo -m` matrix as a NodeTopology (`gpuyard devices import-topo`).

Accepted input is the matrix as printed by current and older drivers, tab- or space-separated
(pasted from a terminal), with or without ANSI colour codes and CRLF line ends: a header of device
columns (`GPU0..`, then NICs as `mlx5_*` or `NIC#`), optional `CPU Affinity`, `NUMA Affinity` and
`GPU NUMA ID` columns, one row per device, then the optional `Legend:` and `NIC Legend:` blocks
(`NIC0: mlx5_0` renames the NIC columns). Blank lines and lines ending in `:` (e.g. `GPU Topology:`)
may precede the header.

What the parser can read but gpuyard does not use is a :class:`TopologyWarning` (line, column,
message), never an error: a column title it does not know (its values are ignored), more values after
a row's link cells than there are titles, fewer (an empty cell of a tab-separated row, a missing
trailing value: unknown), a blank link cell of a tab-separated row (its mirror cell is used, else
`SYS`), a MIG device row (`MIG 1g.10gb Device 0`, `GPU0/1/0`: MIG devices are not scheduled), other
text after the matrix. In a space-aligned copy a CPU list is told from a NUMA id by its form.

What it cannot read is rejected with :class:`TopologyParseError`, which carries the 1-based line and
column and names what is allowed: unknown link cells, rows that do not match the header (missing
link cells, missing or duplicate rows), `X` off the diagonal, NVLink to a NIC, asymmetric cells, and
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from gpuyard.apis.devices import GPUDevice, NICDevice, NodeTopology, NodeTopologySpec, NUMANode, PCIeSwitch
from gpuyard.apis.meta import ObjectMeta
from gpuyard.devices.bandwidth import model_key
from gpuyard.devices.tiers import ALLOWED_LINKS, Link, LinkTier, parse_link

__all__ = [
    "MAX_DIRECT_NVLINKS",
    "TopoMatrix",
    "TopologyParseError",
    "TopologyWarning",
    "import_topology",
    "load_topology_file",
    "parse_topo_matrix",
    "topology_from_links",
]

log = structlog.get_logger(__name__)

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
_MIG_ROW_RE = re.compile(r"^(MIG\b|MIG-|GPU\d+/\d+)")
_PCIE = (LinkTier.PIX, LinkTier.PXB, LinkTier.PHB)


class TopologyParseError(ValueError):
    """A matrix that is not valid `nvidia-smi topo -m` output; `line`/`column` are 1-based."""

    def __init__(self, message: str, *, line: int, column: int) -> None:
        super().__init__(f"line {line}, column {column}: {message}")
        self.message = message
        self.line = line
        self.column = column


@dataclass(frozen=True, slots=True)
class TopologyWarning:
    """Something the parser read but does not use; `line`/`column` are 1-based."""

    message: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"line {self.line}, column {self.column}: {self.message}"


@dataclass(frozen=True, slots=True)
class TopoMatrix:
    """A parsed matrix: device names (GPUs first, NICs renamed by the NIC Legend) and labels."""

    devices: tuple[str, ...]
    gpu_count: int
    labels: tuple[tuple[str, ...], ...]
    cpu_affinity: tuple[str, ...]
    numa_affinity: tuple[int | None, ...]
    legend: dict[str, str] = field(default_factory=dict)
    warnings: tuple[TopologyWarning, ...] = ()

    @property
    def nic_names(self) -> tuple[str, ...]:
        return self.devices[self.gpu_count :]


def _tokens(line: str) -> list[tuple[str, int]]:
    return [(m.group(0), m.start() + 1) for m in _TOKEN_RE.finditer(line)]


def _tab_fields(line: str) -> list[tuple[str, int]]:
    """The tab-separated fields of a line, stripped, each with the 1-based column where its text
    starts (where it would start, for an empty one)."""
    out: list[tuple[str, int]] = []
    pos = 0
    for raw in line.split("\t"):
        text = raw.strip()
        lead = len(raw) - len(raw.lstrip())
        out.append((text, pos + lead + 1))
        pos += len(raw) + 1
    return out


def _is_title_start(toks: list[tuple[str, int]], pos: int) -> bool:
    return any(tuple(t for t, _ in toks[pos : pos + len(title)]) == title for title in _TITLES)


def _parse_header(
    line: str, toks: list[tuple[str, int]], lineno: int, warnings: list[TopologyWarning], row_names: set[str]
) -> tuple[list[str], list[str]]:
    """The device columns and the titles of the value columns after them (an unknown title is kept,
    so values stay aligned, and warned about).

    A column is a device when it is `GPU<n>`, names a row, or looks like a NIC (a name with a digit,
    and in a tab-separated header a field without spaces); the first other word starts the titles.
    """
    devices: list[str] = []
    fields = {col: text for text, col in _tab_fields(line)} if "\t" in line else {}
    pos = 0
    while pos < len(toks):
        text, col = toks[pos]
        if text in ("CPU", "NUMA") or _is_title_start(toks, pos):
            break
        nic_like = any(c.isdigit() for c in text) and " " not in fields.get(col, text)
        if (
            not _GPU_RE.match(text)
            and parse_link_or_none(text) is None
            and not (text in row_names or nic_like)
        ):
            break  # a column title gpuyard does not know
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
    tab_titles = {col: text for text, col in _tab_fields(line) if text} if "\t" in line else {}
    while pos < len(toks):
        for title in _TITLES:
            if tuple(t for t, _ in toks[pos : pos + len(title)]) == title:
                titles.append(" ".join(title))
                pos += len(title)
                break
        else:
            start = toks[pos][1]
            if start in tab_titles:  # a tab-separated header: the title is the whole field
                words = len(tab_titles[start].split())
            else:  # space-aligned: the words up to the next title we know
                words = 1
                while pos + words < len(toks) and not _is_title_start(toks, pos + words):
                    words += 1
            unknown = " ".join(t for t, _ in toks[pos : pos + words])
            warnings.append(
                TopologyWarning(
                    f"column title {unknown!r} is not one gpuyard reads ({_TITLES_ALLOWED}); its values are ignored",
                    lineno,
                    start,
                )
            )
            titles.append(unknown)
            pos += words
    return devices, titles


@dataclass(slots=True)
class _Row:
    name: str
    lineno: int
    cells: list[Link | None]  # None: a blank cell of a tab-separated row
    cols: list[int]
    values: list[str]  # one per title, "N/A" where unknown


def _split_row(
    line: str, toks: list[tuple[str, int]], d: int
) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """A row's link cells and the fields after them: by tab where the row has tabs (so a blank cell
    shows), else by whitespace."""
    if "\t" in line:
        fields = _tab_fields(line)
        if fields[0][0] == "":  # a row indented by a tab: the name is the next field
            fields = fields[1:]
        return fields[1 : 1 + d], fields[1 + d :]
    return toks[1 : 1 + d], toks[1 + d :]


def _row_values(
    name: str, rest: list[tuple[str, int]], titles: list[str], *, tabbed: bool, lineno: int, where: int
) -> tuple[list[str], list[TopologyWarning]]:
    """The values of the title columns after a row's link cells, "N/A" where empty or missing.

    A tab-separated row is read by position; `nvidia-smi` pads the NUMA Affinity value with a
    second tab, which is dropped. In a space-aligned copy an empty cell leaves no trace, so values
    are read by their form: a CPU list (`0-47`, `0,2`) is the CPU Affinity, the other values fill the
    remaining titles in order. Values beyond the titles are ignored with a warning.
    """
    warnings: list[TopologyWarning] = []
    if tabbed:
        cells = list(rest)
        numa = titles.index("NUMA Affinity") if "NUMA Affinity" in titles else -1
        if 0 <= numa < len(cells) - 1 and len(cells) > len(titles) and cells[numa + 1][0] == "":
            del cells[numa + 1]
        values = [t or "N/A" for t, _ in cells[: len(titles)]]
        extra = [(t, c) for t, c in cells[len(titles) :] if t]
        if len(values) < len(titles):
            warnings.append(
                TopologyWarning(
                    f"row {name!r} has {len(values)} values after its link cells; expected {len(titles)} "
                    f"({', '.join(titles)}); the missing ones are unknown",
                    lineno,
                    where,
                )
            )
            values += ["N/A"] * (len(titles) - len(values))
    else:
        filled = [(t, c) for t, c in rest if t]
        by_title = dict.fromkeys(titles, "N/A")
        if filled and "CPU Affinity" in by_title and _CPU_LIST_RE.match(filled[0][0]):
            by_title["CPU Affinity"] = filled.pop(0)[0]
        others = [t for t in titles if t != "CPU Affinity"]
        for title, (value, _) in zip(others, filled, strict=False):
            by_title[title] = value
        values = list(by_title.values())
        extra = filled[len(others) :]
    if extra:
        warnings.append(
            TopologyWarning(
                f"row {name!r} has more values after its link cells than the header has titles "
                f"({', '.join(titles) or 'none'}); ignored: {', '.join(t for t, _ in extra)}",
                lineno,
                extra[0][1],
            )
        )
    return values, warnings


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
    warnings: list[TopologyWarning] = []
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
    row_names = set()
    for later in lines[idx + 1 :]:
        first = later.split()
        if not first or first[0] in ("Legend:", "NIC"):
            break
        row_names.add(first[0])
    devices, titles = _parse_header(lines[idx], header, idx + 1, warnings, row_names)
    gpu_count = sum(1 for d in devices if _GPU_RE.match(d))
    d = len(devices)
    rows: dict[str, _Row] = {}
    idx += 1
    last = idx - 1  # the header line, until rows follow
    while idx < len(lines):
        line = lines[idx]
        toks = _tokens(line)
        if not toks or toks[0][0] in ("Legend:", "NIC"):
            break
        lineno = idx + 1
        name, col = toks[0]
        if name not in devices:
            if _MIG_ROW_RE.match(name):
                warnings.append(
                    TopologyWarning(
                        f"MIG device row {line.strip()[:40]!r} ignored (MIG devices are not scheduled)",
                        lineno,
                        col,
                    )
                )
                idx += 1
                continue
            raise TopologyParseError(
                f"row {name!r} is not a column of the header; columns: {', '.join(devices)}",
                line=lineno,
                column=col,
            )
        if name in rows:
            raise TopologyParseError(f"row {name!r} appears twice", line=lineno, column=col)
        cell_texts, rest = _split_row(line, toks, d)
        cells: list[Link | None] = []
        cols: list[int] = []
        for j in range(d):
            if j >= len(cell_texts):
                raise TopologyParseError(
                    f"row {name!r} has {j} link cells; expected {d} (one per column {devices[0]}..{devices[-1]})",
                    line=lineno,
                    column=len(line.rstrip("\t")) + 1,
                )
            cell, ccol = cell_texts[j]
            link = parse_link_or_none(cell) if cell else None
            if link is None and cell:
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
        values: list[str] = ["N/A"] * len(titles)
        where = rest[0][1] if rest else len(line) + 1
        if is_gpu:
            values, found = _row_values(name, rest, titles, tabbed="\t" in line, lineno=lineno, where=where)
            warnings += found
        elif any(t for t, _ in rest):
            warnings.append(TopologyWarning(f"values of NIC row {name!r} ignored", lineno, where))
        rows[name] = _Row(name, lineno, cells, cols, values)
        last = idx
        idx += 1
    missing = [dev for dev in devices if dev not in rows]
    if missing:
        raise TopologyParseError(
            f"the matrix is not square: {d} device columns but {len(rows)} rows; missing rows: {', '.join(missing)}",
            line=last + 2,
            column=1,
        )
    legend, nic_legend = _parse_trailer(lines, idx, warnings)
    links = _fill_blanks(devices, rows, warnings)
    _validate_cells(devices, gpu_count, rows, links)
    cpu, numa = _affinities(devices[:gpu_count], titles, rows)
    _check_numa(devices, gpu_count, rows, links, numa)
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
    labels = tuple(tuple(links[i][j].label for j in range(d)) for i in range(d))
    return TopoMatrix(tuple(renamed), gpu_count, labels, tuple(cpu), tuple(numa), legend, tuple(warnings))


def _fill_blanks(
    devices: list[str], rows: dict[str, _Row], warnings: list[TopologyWarning]
) -> list[list[Link]]:
    """The link matrix with each blank cell read from its mirror cell, else as SYS (the farthest)."""
    out: list[list[Link]] = []
    for i, a in enumerate(devices):
        row = rows[a]
        filled: list[Link] = []
        for j, b in enumerate(devices):
            link = row.cells[j]
            if link is None:
                mirror = rows[b].cells[i] if i != j else parse_link("X")
                link = mirror if mirror is not None else parse_link("SYS")
                how = "from its mirror cell" if mirror is not None else "as SYS (its mirror is blank too)"
                warnings.append(
                    TopologyWarning(
                        f"row {a}, column {b} is blank; read {how}: {link.label}", row.lineno, row.cols[j]
                    )
                )
            filled.append(link)
        out.append(filled)
    return out


def _parse_trailer(
    lines: list[str], idx: int, warnings: list[TopologyWarning]
) -> tuple[dict[str, str], dict[str, tuple[str, int, int]]]:
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
        warnings.append(
            TopologyWarning(
                f"unexpected text after the matrix ignored: {text[:40]!r}; read there: blank lines, a 'Legend:' "
                "block of 'LABEL = meaning' lines, a 'NIC Legend:' block of 'NIC0: mlx5_0' lines",
                pos + 1,
                col,
            )
        )
    return legend, nic_legend


def _validate_cells(
    devices: list[str], gpu_count: int, rows: dict[str, _Row], links: list[list[Link]]
) -> None:
    for i, a in enumerate(devices):
        row = rows[a]
        for j, b in enumerate(devices):
            link = links[i][j]
            if (i == j) != (link.tier is LinkTier.X):
                what = "the diagonal must be X" if i == j else "X (self) appears off the diagonal"
                raise TopologyParseError(
                    f"row {a}, column {b} is {link.label}: {what}", line=row.lineno, column=row.cols[j]
                )
            if link.tier is LinkTier.NV and (i >= gpu_count or j >= gpu_count):
                raise TopologyParseError(
                    f"row {a}, column {b} is {link.label}; NVLink joins GPUs only, allowed here: PIX, PXB, PHB, NODE, SYS",
                    line=row.lineno,
                    column=row.cols[j],
                )
            if j < i and link != links[j][i]:
                raise TopologyParseError(
                    f"row {a}, column {b} is {link.label} but row {b}, column {a} is {links[j][i].label}; the matrix must be symmetric",
                    line=row.lineno,
                    column=row.cols[j],
                )


def _affinities(
    gpus: list[str], titles: list[str], rows: Mapping[str, _Row]
) -> tuple[list[str], list[int | None]]:
    cpu: list[str] = []
    numa: list[int | None] = []
    for gpu in gpus:
        values = dict(zip(titles, rows[gpu].values, strict=True))
        cpus = values.get("CPU Affinity", "")
        cpu.append(cpus if _CPU_LIST_RE.match(cpus) or cpus.isdigit() else "")
        raw = values.get("NUMA Affinity", "")
        numa.append(int(raw) if raw.isdigit() else None)
    return cpu, numa


def _check_numa(
    devices: list[str],
    gpu_count: int,
    rows: Mapping[str, _Row],
    links: list[list[Link]],
    numa: list[int | None],
) -> None:
    for i in range(gpu_count):
        row = rows[devices[i]]
        for j in range(gpu_count):
            link = links[i][j]
            if link.tier in (*_PCIE, LinkTier.NODE) and None not in (numa[i], numa[j]) and numa[i] != numa[j]:
                raise TopologyParseError(
                    f"{devices[i]} and {devices[j]} are {link.label} (one NUMA node) but their NUMA Affinity differs "
                    f"({numa[i]} vs {numa[j]})",
                    line=row.lineno,
                    column=row.cols[j],
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
    on_warning: Callable[[TopologyWarning], None] | None = None,
) -> NodeTopology:
    """Parse `nvidia-smi topo -m` text into a NodeTopology named `name` (see the module doc).

    The matrix does not say which GPU model, how much memory, or the NICs' line rate: pass them.
    Each :class:`TopologyWarning` goes to `on_warning` (default: logged).
    """
    matrix = parse_topo_matrix(text)
    for warning in matrix.warnings:
        if on_warning is not None:
            on_warning(warning)
        else:
            log.warning(warning.message, line=warning.line, column=warning.column, topology=name)
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
