"""Cluster scenarios: the YAML files under `configs/clusters/` that describe a synthetic cluster.

A scenario lists node groups (count, CPU, memory, GPUs and their model, labels, taints,
network block, topology preset) and the simulated kubelet's defaults (start delay, pod
duration, exit code; per pod, the `fake.gpuyard.io/*` annotations override them).
It is plain data built from the device presets, so it lives here, below every backend: the
fake backend runs it, while the simulator, the test harness and the CLI read it (node counts,
GPU models) without knowing which backend runs. `load_scenario` validates the file and names the file and field path of
any mistake; `Scenario.nodes()` expands the groups into Node objects with the labels the
scheduler relies on (GPU model, product, memory, count, topology preset, network block, spot lifecycle).
"""

from __future__ import annotations

import math
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from gpuyard.apis.core import GPU_RESOURCE, Node, NodeCondition, NodeSpec, NodeStatus, Taint
from gpuyard.apis.devicematching import (
    LABEL_BLOCK,
    LABEL_GPU_MEMORY,
    LABEL_GPU_MODEL,
    LABEL_GPU_PRODUCT,
    LABEL_LIFECYCLE,
    LABEL_SPINE,
)
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.durations import (
    parse_duration,
    parse_pod_duration,
)
from gpuyard.apis.hpametrics import HpaMetric
from gpuyard.apis.meta import ObjectMeta, StrictK8sModel
from gpuyard.apis.quantity import Quantity, format_quantity
from gpuyard.devices.presets import GPU_MODELS, PRESET_MODELS, PRESETS, get_preset
from gpuyard.devices.topo_import import TopologyParseError, load_topology_file, topology_from_links

__all__ = [
    "LABEL_GPU_COUNT",
    "LABEL_TOPOLOGY_PRESET",
    "GpuSpec",
    "KubeletDefaults",
    "NodeGroup",
    "Scenario",
    "ScenarioError",
    "load_scenario",
]

LABEL_GPU_COUNT = "nvidia.com/gpu.count"
LABEL_TOPOLOGY_PRESET = "gpuyard.io/topology-preset"
LABEL_HOSTNAME = "kubernetes.io/hostname"


class ScenarioError(Exception):
    """A scenario file that cannot be used; the message names the file and field path."""


class GpuSpec(StrictK8sModel):
    model: str = Field(description="Short model key, e.g. v100, a100, h100, t4, k80, p100.")
    count: int = Field(ge=1, le=64)
    memory_mib: int | None = Field(default=None, alias="memoryMiB", ge=1)
    product: str | None = None

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value not in GPU_MODELS:
            raise ValueError(f"unknown GPU model {value!r}; allowed: {', '.join(sorted(GPU_MODELS))}")
        return value


class NodeGroup(StrictK8sModel):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", description="Node name prefix.")
    count: int = Field(default=1, ge=1, le=100_000)
    cpu: Quantity = Field(default=Decimal(64))
    memory: Quantity = Field(default=Decimal(512 * 2**30))
    ephemeral_storage: Quantity = Field(
        default=Decimal(2 * 2**40), description="Local disk for pods (ephemeral-storage)."
    )
    gpu: GpuSpec | None = None
    gpus: list[GpuSpec] | None = Field(
        default=None,
        min_length=1,
        description="Several GPU models in one node, in GPU index order (e.g. 4 x a100 then 2 x t4); "
        "instead of `gpu`. The node gets a PCIe topology with each GPU's own model and memory.",
    )
    topology: str | None = Field(default=None, description="Topology preset name (dgx1-v100, dgx-a100, ...).")
    topology_file: str | None = Field(default=None, description="An `nvidia-smi topo -m` text file.")
    rdma_nics: int = Field(default=0, ge=0, le=64, description="RDMA NICs (resource rdma/hca).")
    block: str | None = Field(default=None, description="Network block label value.")
    spine: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=list)
    max_pods: int = Field(default=110, ge=1)
    spot: bool = Field(
        default=False,
        description="Spot capacity: the nodes get node.kubernetes.io/lifecycle: spot, which spot replicas "
        "prefer and other pods avoid while other room exists.",
    )

    @field_validator("topology")
    @classmethod
    def _known_preset(cls, value: str | None) -> str | None:
        if value is not None and value not in PRESETS:
            raise ValueError(f"unknown topology preset {value!r}; allowed: {', '.join(PRESETS)}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> NodeGroup:
        if self.cpu <= 0:
            raise ValueError("cpu must be positive")
        if self.memory <= 0:
            raise ValueError("memory must be positive")
        if self.topology is not None and self.topology_file is not None:
            raise ValueError("give either topology (a preset) or topologyFile, not both")
        if self.gpus is not None:
            if self.gpu is not None:
                raise ValueError("give either gpu (one model) or gpus (several models), not both")
            if self.topology is not None or self.topology_file is not None:
                raise ValueError(
                    "gpus (several models) takes no topology or topologyFile: its GPUs share PCIe"
                )
        if self.topology is not None:
            preset = get_preset(self.topology)
            model = PRESET_MODELS[self.topology]
            if self.gpu is None:
                self.gpu = GpuSpec(model=model, count=preset.gpu_count)
            elif (
                self.gpu.count != preset.gpu_count
                or GPU_MODELS[self.gpu.model].name != GPU_MODELS[model].name
            ):
                raise ValueError(
                    f"topology {self.topology} has {preset.gpu_count} x {model}; gpu says {self.gpu.count} x {self.gpu.model}"
                )
        return self

    @property
    def gpu_count(self) -> int:
        if self.gpus is not None:
            return sum(g.count for g in self.gpus)
        return self.gpu.count if self.gpu else 0

    def gpu_models(self) -> list[str]:
        """The model key of each GPU, in index order."""
        specs = self.gpus if self.gpus is not None else ([self.gpu] if self.gpu else [])
        return [g.model for g in specs for _ in range(g.count)]

    def node_topology(self, node_name: str, *, base_dir: Path | None = None) -> NodeTopology | None:
        """The device topology of one node of this group (preset, imported file, or the PCIe
        topology of a node with several GPU models), or None."""
        if self.gpus is not None:
            return _mixed_topology(self.gpus, node_name)
        if self.topology is not None:
            return get_preset(self.topology, node_name=node_name)
        if self.topology_file is not None:
            path = Path(self.topology_file)
            if not path.is_absolute() and base_dir is not None:
                path = base_dir / path
            model = GPU_MODELS[self.gpu.model] if self.gpu else None
            topo = load_topology_file(
                path,
                name=node_name,
                gpu_model=model.name if model else "",
                memory_mib=model.memory_mib if model else 0,
            )
            return topo
        return None


class KubeletDefaults(StrictK8sModel):
    start_delay: float = Field(
        default=1.0, ge=0, description="Time from Pending to Running: seconds or a Go-style duration (2s)."
    )
    duration: float | None = Field(
        default=None,
        ge=0,
        description="Pod run time: seconds or a Go-style duration (40s, 1h30m); null (or inf) runs forever.",
    )
    exit_code: int = Field(default=0, ge=0, le=255)

    @field_validator("start_delay", mode="before")
    @classmethod
    def _start_delay(cls, value: Any) -> Any:
        return parse_duration(value) if isinstance(value, str | int | float) else value

    @field_validator("duration", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if isinstance(value, str):
            return parse_pod_duration(value)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return None if math.isinf(value) and value > 0 else parse_duration(value)
        return value


class Scenario(StrictK8sModel):
    _base_dir: Path | None = None  # the scenario file's folder: topologyFile paths are relative to it

    name: str = "cluster"
    description: str = ""
    kubelet: KubeletDefaults = Field(default_factory=KubeletDefaults)
    node_groups: list[NodeGroup] = Field(min_length=1)
    hpa_metrics: list[HpaMetric] = Field(
        default_factory=list,
        description="What the metrics API answers for jobs' HorizontalPodAutoscalers (apis/hpametrics.py).",
    )

    @model_validator(mode="after")
    def _unique_groups(self) -> Scenario:
        seen: set[str] = set()
        for g in self.node_groups:
            if g.name in seen:
                raise ValueError(f"node group name {g.name!r} appears twice")
            seen.add(g.name)
        return self

    def group_of(self, node_name: str) -> NodeGroup | None:
        for g in self.node_groups:
            prefix = f"{g.name}-"
            if node_name.startswith(prefix) and node_name[len(prefix) :].isdigit():
                return g
        return None

    def topologies(self) -> list[NodeTopology]:
        """The NodeTopology objects of every node that has one (same names as the nodes)."""
        out = []
        for g in self.node_groups:
            for i in range(g.count):
                topo = g.node_topology(f"{g.name}-{i}", base_dir=self._base_dir)
                if topo is not None:
                    out.append(topo)
        return out

    def nodes(self) -> list[Node]:
        """Expand the node groups into Ready Node objects (`<group>-<i>`)."""
        out = []
        for g in self.node_groups:
            for i in range(g.count):
                out.append(_make_node(g, f"{g.name}-{i}"))
        return out

    @property
    def total_gpus(self) -> int:
        return sum(g.count * g.gpu_count for g in self.node_groups)


def _mixed_topology(specs: list[GpuSpec], node_name: str) -> NodeTopology:
    """All GPUs under one host bridge (PHB), each with its own model and memory."""
    fields = []
    for spec in specs:
        model = GPU_MODELS[spec.model]
        for _ in range(spec.count):
            fields.append(
                {
                    "model": spec.product or model.name,
                    "memory_mib": spec.memory_mib or model.memory_mib,
                }
            )
    n = len(fields)
    labels = [["X" if i == j else "PHB" for j in range(n)] for i in range(n)]
    return topology_from_links(name=node_name, gpu_count=n, nic_names=(), labels=labels, gpu_fields=fields)


def _make_node(group: NodeGroup, name: str) -> Node:
    labels = {LABEL_HOSTNAME: name, **group.labels}
    capacity: dict[str, Decimal] = {
        "cpu": group.cpu,
        "memory": group.memory,
        "ephemeral-storage": group.ephemeral_storage,
        "pods": Decimal(group.max_pods),
    }
    if group.gpus is not None:
        labels[LABEL_GPU_COUNT] = str(group.gpu_count)  # model, product and memory differ per GPU:
        capacity[GPU_RESOURCE] = Decimal(group.gpu_count)  # the NodeTopology says which is which
    if group.gpu is not None:
        model = GPU_MODELS[group.gpu.model]
        labels[LABEL_GPU_MODEL] = group.gpu.model
        labels[LABEL_GPU_PRODUCT] = group.gpu.product or model.name
        labels[LABEL_GPU_MEMORY] = str(group.gpu.memory_mib or model.memory_mib)
        labels[LABEL_GPU_COUNT] = str(group.gpu.count)
        capacity[GPU_RESOURCE] = Decimal(group.gpu.count)
    if group.topology:
        labels[LABEL_TOPOLOGY_PRESET] = group.topology
    if group.block:
        labels[LABEL_BLOCK] = group.block
    if group.spine:
        labels[LABEL_SPINE] = group.spine
    if group.spot:
        labels[LABEL_LIFECYCLE] = "spot"
    if group.rdma_nics:
        capacity["rdma/hca"] = Decimal(group.rdma_nics)
    return Node(
        metadata=ObjectMeta(name=name, labels=labels, annotations=dict(group.annotations)),
        spec=NodeSpec(taints=list(group.taints)),
        status=NodeStatus(
            capacity=capacity,
            allocatable=dict(capacity),
            conditions=[NodeCondition(type="Ready", status="True", reason="KubeletReady")],
        ),
    )


def parse_scenario(data: object, *, source: str, base_dir: Path | None = None) -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: expected a mapping with nodeGroups, got {type(data).__name__}")
    try:
        scenario = Scenario.model_validate(data)
        scenario._base_dir = base_dir
        for i, group in enumerate(scenario.node_groups):
            if group.topology_file is not None:
                _check_topology_file(group, index=i, source=source, base_dir=base_dir)
        return scenario
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            path = ".".join(str(p) for p in err["loc"]) or "<root>"
            msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
            problems.append(f"{path}: {msg}")
        raise ScenarioError(f"{source}: " + "; ".join(problems)) from None


def _check_topology_file(group: NodeGroup, *, index: int, source: str, base_dir: Path | None) -> None:
    where = f"{source}: nodeGroups.{index}.topologyFile"
    try:
        topo = group.node_topology(f"{group.name}-0", base_dir=base_dir)
    except OSError as exc:
        raise ScenarioError(f"{where}: cannot read {group.topology_file}: {exc.strerror or exc}") from None
    except TopologyParseError as exc:
        raise ScenarioError(
            f"{where}: {group.topology_file}:{exc.line}:{exc.column}: {exc.message}"
        ) from None
    assert topo is not None
    if group.gpu is not None and group.gpu.count != topo.gpu_count:
        raise ScenarioError(
            f"{where}: the matrix has {topo.gpu_count} GPUs; gpu.count says {group.gpu.count}"
        )


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; :class:`ScenarioError` names file, line or field."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ScenarioError(f"{p}: cannot read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        raise ScenarioError(f"{p}{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    return parse_scenario(data, source=str(p), base_dir=p.parent)


def describe(scenario: Scenario) -> str:
    """One line: `demo: 9 nodes, 44 GPUs (16 v100, 8 a100, ...)`."""
    per_model: dict[str, int] = {}
    nodes = 0
    for g in scenario.node_groups:
        nodes += g.count
        for model in g.gpu_models():
            per_model[model] = per_model.get(model, 0) + g.count
    models = ", ".join(f"{n} {m}" for m, n in sorted(per_model.items()))
    return (
        f"{scenario.name}: {nodes} nodes, {scenario.total_gpus} GPUs ({models or 'none'}); "
        + format_quantity(sum((g.cpu * g.count for g in scenario.node_groups), Decimal(0)))
        + " CPUs"
    )
