"""Loaders for the Alibaba openb GPU-cluster trace, and workload tuning for trace replay.

The trace (cluster-trace-gpu-v2023, as the FGD paper used it) is two CSV files:

* nodes: ``sn, cpu_milli, memory_mib, gpu, model`` (``model`` empty for a node without GPUs);
* pods: ``name, cpu_milli, memory_mib, num_gpu, gpu_milli`` required, then optionally
  ``gpu_spec`` (allowed GPU models, ``|``-separated; empty or ``nan`` = any), ``qos``,
  ``pod_phase``, ``creation_time``, ``deletion_time``, ``scheduled_time`` (kept as read, unused
  by the saturation experiment).

Bad input raises `TraceError`, whose message names the file, the line (1 = header) and the column:
a missing column, a field that is not a whole number, an out-of-range or inconsistent request, or
a GPU model in ``gpu_spec`` that no node has.

`tune_workload` scales a pod list to ``load x`` the cluster's GPU capacity the way the FGD
simulator does: append copies of uniformly random pods while the total stays within the target
(stopping at the first copy that would exceed it), or remove uniformly random pods while the
total is above it; then shuffle. Everything is drawn from one NumPy Generator seeded with the
seed, so a (trace, load, seed) triple always gives the same workload.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpuyard.scheduler.placement.packing import GPU_MILLI, ClusterState, PodRequest

__all__ = [
    "NODE_COLUMNS",
    "POD_COLUMNS",
    "NodeTrace",
    "PodTrace",
    "TraceError",
    "check_gpu_request",
    "load_openb_nodes",
    "load_openb_pods",
    "parse_gpu_spec",
    "read_csv",
    "tune_workload",
]

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
_NO_SPEC = {"", "nan", "none", "null"}


class TraceError(ValueError):
    """Bad trace input, located by file, line and column."""

    def __init__(self, message: str, *, path: str | Path, line: int | None = None, column: str | None = None):
        self.message, self.path, self.line, self.column = message, str(path), line, column
        where = self.path if line is None else f"{self.path}:{line}"
        if column is not None:
            where += f": column {column!r}"
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True, slots=True)
class NodeTrace:
    """The node list, one entry per node in file order."""

    path: str
    names: list[str]
    cpu_milli: np.ndarray
    memory_mib: np.ndarray
    gpus: np.ndarray
    models: list[str]

    def __len__(self) -> int:
        return len(self.names)

    @property
    def total_gpu_milli(self) -> int:
        return int(self.gpus.sum()) * GPU_MILLI

    @property
    def model_names(self) -> list[str]:
        return sorted({m for m in self.models if m})

    def to_state(self) -> ClusterState:
        """An empty `ClusterState` of these nodes."""
        return ClusterState.from_nodes(
            names=self.names,
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
            gpus=self.gpus,
            models=self.models,
        )


@dataclass(frozen=True, slots=True)
class PodTrace:
    """The pod list, one entry per pod in file order (``gpu_spec`` "" means any model)."""

    path: str
    names: list[str]
    cpu_milli: np.ndarray
    memory_mib: np.ndarray
    num_gpu: np.ndarray
    gpu_milli: np.ndarray
    gpu_spec: list[str]
    extra: dict[str, list[str]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.names)

    @property
    def total_gpu_milli(self) -> np.ndarray:
        """int64[P]: each pod's whole GPU request in milli (num_gpu x gpu_milli)."""
        total: np.ndarray = self.num_gpu * self.gpu_milli
        return total

    def requests(self, state: ClusterState) -> list[PodRequest]:
        """One `PodRequest` per pod, with ``gpu_spec`` resolved against ``state.model_names``."""
        specs: dict[str, tuple[int, ...] | None] = {}
        out = []
        for i, name in enumerate(self.names):
            spec = self.gpu_spec[i]
            if spec not in specs:
                specs[spec] = state.model_ids(spec)
            out.append(
                PodRequest(
                    name=name,
                    cpu_milli=int(self.cpu_milli[i]),
                    memory_mib=int(self.memory_mib[i]),
                    num_gpu=int(self.num_gpu[i]),
                    gpu_milli=int(self.gpu_milli[i]),
                    allowed_models=specs[spec],
                )
            )
        return out


def check_gpu_request(num_gpu: int, milli: int, *, path: str | Path, line: int) -> None:
    """openb's GPU request rules: `milli` per GPU (1..1000), a share (< 1000) is one GPU; a
    `TraceError` names the column otherwise."""
    if milli > GPU_MILLI:
        raise TraceError(
            f"must be <= {GPU_MILLI} (it is per GPU), got {milli}", path=path, line=line, column="gpu_milli"
        )
    if num_gpu == 0 and milli != 0:
        raise TraceError(f"gpu_milli={milli} with num_gpu=0", path=path, line=line, column="gpu_milli")
    if num_gpu > 0 and milli == 0:
        raise TraceError(f"num_gpu={num_gpu} with gpu_milli=0", path=path, line=line, column="gpu_milli")
    if 0 < milli < GPU_MILLI and num_gpu != 1:
        raise TraceError(
            f"a GPU share ({milli}m) needs num_gpu=1, got {num_gpu}", path=path, line=line, column="num_gpu"
        )


def parse_gpu_spec(
    text: str, *, known: set[str] | None, path: str | Path, line: int, have: str = "the cluster has"
) -> tuple[str, ...]:
    """The GPU models a ``gpu_spec`` allows (``V100M16|V100M32``; empty or ``nan``: any), each
    checked against `known` (``have`` words the error: "unknown GPU model 'X' (<have>: ...)")."""
    if text.strip().lower() in _NO_SPEC:
        return ()
    parts = tuple(dict.fromkeys(s.strip() for s in text.split("|") if s.strip()))
    for part in parts:
        if known is not None and part not in known:
            allowed = ", ".join(sorted(known)) or "none"
            raise TraceError(
                f"unknown GPU model {part!r} ({have}: {allowed})", path=path, line=line, column="gpu_spec"
            )
    return parts


def read_csv(path: str | Path, required: Sequence[str]) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """The header and the (line number, fields) of every data row; `TraceError` names the file and
    line when it cannot be read or a `required` column is missing."""
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise TraceError("empty file: expected a header line", path=path, line=1)
            header = [h.strip() for h in header]
            for col in required:
                if col not in header:
                    raise TraceError(
                        f"missing column (header has: {', '.join(header)})", path=path, line=1, column=col
                    )
            rows = []
            for row in reader:
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) < len(header):
                    row = row + [""] * (len(header) - len(row))
                rows.append((reader.line_num, row))
            return header, rows
    except OSError as e:
        raise TraceError(f"cannot read: {e.strerror or e}", path=path) from None
    except UnicodeDecodeError as e:
        raise TraceError(f"not UTF-8 text: {e}", path=path) from None


def _ints(
    path: str | Path, rows: list[tuple[int, list[str]]], *, col: int, name: str, minimum: int = 0
) -> np.ndarray:
    out = np.empty(len(rows), dtype=np.int64)
    for i, (line, row) in enumerate(rows):
        text = row[col].strip()
        try:
            value = int(text)
        except ValueError:
            try:
                f = float(text)
            except ValueError:
                f = math.nan
            if not math.isfinite(f) or f != int(f):
                raise TraceError(f"not a whole number: {text!r}", path=path, line=line, column=name) from None
            value = int(f)
        if value < minimum:
            raise TraceError(f"must be >= {minimum}, got {value}", path=path, line=line, column=name)
        out[i] = value
    return out


def load_openb_nodes(path: str | Path) -> NodeTrace:
    """Read an openb node list (``sn, cpu_milli, memory_mib, gpu, model``)."""
    header, rows = read_csv(path, NODE_COLUMNS)
    c = {name: header.index(name) for name in NODE_COLUMNS}
    if not rows:
        raise TraceError("no nodes", path=path, line=2)
    names = [row[c["sn"]].strip() for _, row in rows]
    gpus = _ints(path, rows, col=c["gpu"], name="gpu")
    models = [row[c["model"]].strip() for _, row in rows]
    seen: dict[str, int] = {}
    for i, (line, _) in enumerate(rows):
        if not names[i]:
            raise TraceError("empty node name", path=path, line=line, column="sn")
        if names[i] in seen:
            raise TraceError(
                f"node {names[i]!r} repeats line {seen[names[i]]}", path=path, line=line, column="sn"
            )
        seen[names[i]] = line
        if gpus[i] > 0 and models[i].lower() in _NO_SPEC:
            raise TraceError(
                f"a node with {gpus[i]} GPU(s) needs a GPU model", path=path, line=line, column="model"
            )
        if gpus[i] == 0:
            models[i] = ""
    return NodeTrace(
        path=str(path),
        names=names,
        cpu_milli=_ints(path, rows, col=c["cpu_milli"], name="cpu_milli"),
        memory_mib=_ints(path, rows, col=c["memory_mib"], name="memory_mib"),
        gpus=gpus,
        models=models,
    )


def load_openb_pods(path: str | Path, *, models: Iterable[str] | None = None) -> PodTrace:
    """Read an openb pod list; with ``models``, every model named in ``gpu_spec`` must be one of them."""
    header, rows = read_csv(path, POD_COLUMNS)
    c = {name: header.index(name) for name in POD_COLUMNS}
    num_gpu = _ints(path, rows, col=c["num_gpu"], name="num_gpu")
    gpu_milli = _ints(path, rows, col=c["gpu_milli"], name="gpu_milli")
    known = None if models is None else set(models)
    spec_col = header.index("gpu_spec") if "gpu_spec" in header else None
    specs: list[str] = []
    for i, (line, row) in enumerate(rows):
        check_gpu_request(int(num_gpu[i]), int(gpu_milli[i]), path=path, line=line)
        text = row[spec_col] if spec_col is not None else ""
        spec = "|".join(parse_gpu_spec(text, known=known, path=path, line=line, have="the nodes have"))
        specs.append(spec)
    names = [row[c["name"]].strip() for _, row in rows]
    for i, (line, _) in enumerate(rows):
        if not names[i]:
            raise TraceError("empty pod name", path=path, line=line, column="name")
    extra = {
        col: [row[header.index(col)] for _, row in rows]
        for col in header
        if col not in POD_COLUMNS and col != "gpu_spec" and col
    }
    return PodTrace(
        path=str(path),
        names=names,
        cpu_milli=_ints(path, rows, col=c["cpu_milli"], name="cpu_milli"),
        memory_mib=_ints(path, rows, col=c["memory_mib"], name="memory_mib"),
        num_gpu=num_gpu,
        gpu_milli=gpu_milli,
        gpu_spec=specs,
        extra=extra,
    )


def tune_workload(pods: PodTrace, *, cluster_gpu_milli: int, load: float = 1.3, seed: int) -> np.ndarray:
    """Pod indices (repeats are copies) totalling about ``load x cluster_gpu_milli`` GPU milli, shuffled.

    While the total is below the target, a uniformly random pod of the list is appended unless it
    would take the total past the target, which ends the tuning. While the total is above the
    target, uniformly random pods are removed. Then the order is shuffled. All draws come from
    ``numpy.random.default_rng(seed)``.
    """
    if load <= 0:
        raise ValueError(f"load must be positive, got {load}")
    rng = np.random.default_rng(seed)
    req = pods.total_gpu_milli
    n = len(req)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    target = load * cluster_gpu_milli
    total = int(req.sum())
    index = list(range(n))
    if total < target and (req > 0).any():
        while True:
            j = int(rng.integers(n))
            if total + int(req[j]) > target:
                break
            index.append(j)
            total += int(req[j])
    elif total > target:
        while total > target and index:
            k = int(rng.integers(len(index)))
            total -= int(req[index[k]])
            index.pop(k)
    out = np.array(index, dtype=np.int64)
    return out[rng.permutation(len(out))]
