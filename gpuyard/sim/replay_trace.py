"""Loading a replay trace (jobs with arrival and departure) and an openb node list as a scenario.

Two trace formats feed `gpuyard simulate replay`:

* **simple** CSV: ``name, submit_time, duration, num_gpu, gpu_milli, cpu_milli, memory_mib``
  required, then optionally ``gpu_spec`` (``|``-separated GPU models; empty = any), ``queue``
  (empty = ``default``) and ``priority`` (a whole number; empty = 0). Times are seconds from the
  start of the trace (decimals allowed).
* **openb** pod CSV (Alibaba cluster-trace-gpu-v2023, read by
  :func:`gpuyard.sim.traces.load_openb_pods`): ``creation_time`` is the submit time, the duration
  is ``deletion_time - scheduled_time`` (``deletion_time - creation_time`` when ``scheduled_time``
  is missing or empty); every job goes to queue ``default`` with priority 0.

GPU requests follow openb's rules: ``gpu_milli`` is per GPU (1..1000), a share (< 1000) needs
``num_gpu = 1``. Bad input raises :class:`~gpuyard.sim.traces.TraceError` naming the file, the
line (1 = the header) and the column. `openb_scenario` turns an openb node list into a fake-cluster
scenario whose nodes carry the trace's GPU model name in ``nvidia.com/gpu.product``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpuyard.apis.devicematching import LABEL_GPU_MODEL, LABEL_GPU_PRODUCT
from gpuyard.devices.presets import GPU_MODELS
from gpuyard.devices.scenarios import Scenario, parse_scenario
from gpuyard.sim.traces import (
    TraceError,
    check_gpu_request,
    load_openb_nodes,
    load_openb_pods,
    parse_gpu_spec,
    read_csv,
)

__all__ = [
    "FORMATS",
    "OPENB_MODELS",
    "SIMPLE_COLUMNS",
    "SIMPLE_OPTIONAL",
    "Trace",
    "TraceJob",
    "load_trace",
    "openb_scenario",
    "scenario_models",
]

FORMATS = ("simple", "openb")
SIMPLE_COLUMNS = ("name", "submit_time", "duration", "num_gpu", "gpu_milli", "cpu_milli", "memory_mib")
SIMPLE_OPTIONAL = ("gpu_spec", "queue", "priority")
# openb GPU model -> the fake cluster's model key (memory, product defaults); others count as a10-like
OPENB_MODELS = {"P100": "p100", "T4": "t4", "V100M16": "v100-16gb", "V100M32": "v100", "A10": "a10"}
_FALLBACK_MODEL = "a10"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace: when it arrives, how long it runs, what it asks for, where it queues."""

    name: str
    submit: float
    duration: float
    num_gpu: int
    gpu_milli: int
    cpu_milli: int
    memory_mib: int
    gpu_spec: tuple[str, ...] = ()
    queue: str = "default"
    priority: int = 0
    line: int = 0

    @property
    def gpu_request_milli(self) -> int:
        """The whole job's GPU request in thousandths of a GPU."""
        return self.num_gpu * self.gpu_milli


@dataclass(frozen=True, slots=True)
class Trace:
    path: str
    jobs: list[TraceJob]

    @property
    def queues(self) -> list[str]:
        return sorted({j.queue for j in self.jobs})


def _number(text: str, *, path: str, line: int, column: str, whole: bool, minimum: float | None) -> float:
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        kind = "a whole number" if whole else "a number"
        raise TraceError(f"not {kind}: {text!r}", path=path, line=line, column=column)
    if whole and value != int(value):
        raise TraceError(f"not a whole number: {text!r}", path=path, line=line, column=column)
    if minimum is not None and value < minimum:
        raise TraceError(f"must be >= {minimum:g}, got {text}", path=path, line=line, column=column)
    return value


def _name(text: str, *, path: str, line: int, column: str, seen: dict[str, int] | None = None) -> str:
    name = text.strip()
    if not _NAME.match(name) or len(name) > 52:
        raise TraceError(
            f"{name!r} is not a valid name: lower-case letters, digits and '-', at most 52 characters",
            path=path,
            line=line,
            column=column,
        )
    if seen is not None:
        if name in seen:
            raise TraceError(f"{name!r} repeats line {seen[name]}", path=path, line=line, column=column)
        seen[name] = line
    return name


def load_simple(path: str | Path, *, models: Iterable[str] | None = None) -> Trace:
    """Read a simple trace CSV; with ``models``, every ``gpu_spec`` model must be one of them."""
    p = str(path)
    header, rows = read_csv(path, SIMPLE_COLUMNS)
    col = {c: header.index(c) for c in (*SIMPLE_COLUMNS, *SIMPLE_OPTIONAL) if c in header}
    known = None if models is None else set(models)
    seen: dict[str, int] = {}
    jobs = []
    for line, row in rows:

        def cell(c: str, row: list[str] = row) -> str:
            return row[col[c]] if c in col else ""

        def num(c: str, *, whole: bool = True, minimum: float | None = 0, line: int = line) -> float:
            return _number(cell(c), path=p, line=line, column=c, whole=whole, minimum=minimum)

        name = _name(cell("name"), path=p, line=line, column="name", seen=seen)
        submit, duration = num("submit_time", whole=False), num("duration", whole=False)
        num_gpu, milli = int(num("num_gpu")), int(num("gpu_milli"))
        cpu, mem = int(num("cpu_milli")), int(num("memory_mib"))
        check_gpu_request(num_gpu, milli, path=p, line=line)
        queue = cell("queue").strip() or "default"
        _name(queue, path=p, line=line, column="queue")
        priority = int(num("priority", minimum=None)) if cell("priority").strip() else 0
        spec = parse_gpu_spec(cell("gpu_spec"), known=known, path=p, line=line)
        if spec and num_gpu == 0:
            raise TraceError("gpu_spec on a job without GPUs", path=p, line=line, column="gpu_spec")
        jobs.append(TraceJob(name, submit, duration, num_gpu, milli, cpu, mem, spec, queue, priority, line))
    return Trace(p, jobs)


def load_openb(path: str | Path, *, models: Iterable[str] | None = None) -> Trace:
    """Read an openb pod CSV with ``creation_time`` and ``deletion_time`` as a replay trace."""
    p = str(path)
    pods = load_openb_pods(path, models=models)
    header, rows = read_csv(path, ("name", "creation_time", "deletion_time"))
    scheduled = header.index("scheduled_time") if "scheduled_time" in header else None
    ci, di = header.index("creation_time"), header.index("deletion_time")
    jobs = []
    for i, (line, row) in enumerate(rows):
        created = _number(row[ci], path=p, line=line, column="creation_time", whole=False, minimum=0)
        deleted = _number(row[di], path=p, line=line, column="deletion_time", whole=False, minimum=0)
        start, start_col = created, "creation_time"
        if scheduled is not None and row[scheduled].strip() and row[scheduled].strip().lower() != "nan":
            start = _number(
                row[scheduled], path=p, line=line, column="scheduled_time", whole=False, minimum=0
            )
            start_col = "scheduled_time"
        if deleted < start:
            raise TraceError(
                f"deletion_time {deleted:g} is before {start_col} {start:g}",
                path=p,
                line=line,
                column="deletion_time",
            )
        name = _name(pods.names[i], path=p, line=line, column="name")
        spec = tuple(s for s in pods.gpu_spec[i].split("|") if s)
        jobs.append(
            TraceJob(
                name,
                created,
                deleted - start,
                int(pods.num_gpu[i]),
                int(pods.gpu_milli[i]),
                int(pods.cpu_milli[i]),
                int(pods.memory_mib[i]),
                spec,
                line=line,
            )
        )
    names: dict[str, int] = {}
    for job in jobs:
        _name(job.name, path=p, line=job.line, column="name", seen=names)
    return Trace(p, jobs)


def load_trace(
    path: str | Path, *, fmt: str = "simple", models: Iterable[str] | None = None, limit: int | None = None
) -> Trace:
    """A trace in `fmt` (``simple`` or ``openb``), jobs ordered by submit time (then file order)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; allowed: {', '.join(FORMATS)}")
    trace = (load_simple if fmt == "simple" else load_openb)(path, models=models)
    jobs = sorted(trace.jobs, key=lambda j: (j.submit, j.line))
    if limit is not None:
        jobs = jobs[:limit]
    if not jobs:
        raise TraceError("no jobs", path=path, line=2)
    return Trace(trace.path, jobs)


def openb_scenario(path: str | Path, *, start_delay: float = 0.0) -> Scenario:
    """A fake-cluster scenario from an openb node list, one node group per distinct node shape.

    Each GPU node's ``nvidia.com/gpu.product`` label is the trace's model name (``G2``, ``T4``,
    ...), which is what an openb ``gpu_spec`` matches; ``gpuyard.io/gpu-model`` is the nearest
    model gpuyard knows (`OPENB_MODELS`, else ``a10``). No device topology: GPUs are all alike.
    """
    nodes = load_openb_nodes(path)
    shapes: dict[tuple[int, int, int, str], int] = {}
    for i in range(len(nodes)):
        shape = (int(nodes.cpu_milli[i]), int(nodes.memory_mib[i]), int(nodes.gpus[i]), nodes.models[i])
        shapes[shape] = shapes.get(shape, 0) + 1
    groups = []
    for k, ((cpu, mem, gpus, model), count) in enumerate(shapes.items()):
        tag = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-") or "cpu"
        group: dict[str, object] = {
            "name": f"{tag}-{k}",
            "count": count,
            "cpu": f"{max(cpu, 1)}m",
            "memory": f"{max(mem, 1)}Mi",
            "maxPods": 1000,
        }
        if gpus:
            group["gpu"] = {
                "model": OPENB_MODELS.get(model, _FALLBACK_MODEL),
                "count": gpus,
                "product": model,
            }
        groups.append(group)
    data = {"name": Path(path).stem, "kubelet": {"startDelay": start_delay}, "nodeGroups": groups}
    return parse_scenario(data, source=str(path))


def scenario_models(scenario: Scenario, *, label: str) -> set[str]:
    """The GPU model names a ``gpu_spec`` may use on this cluster (values of `label`)."""
    out = set()
    for group in scenario.node_groups:
        for spec in group.gpus or ([group.gpu] if group.gpu else []):
            if label == LABEL_GPU_PRODUCT:
                out.add(spec.product or GPU_MODELS[spec.model].name)
            elif label == LABEL_GPU_MODEL:
                out.add(spec.model)
    return out
