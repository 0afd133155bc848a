"""Cluster scenarios: the YAML files under `configs/clusters/` that describe a fake cluster.

A scenario lists node groups (count, CPU, memory, GPUs and their model, labels, taints,
network block, topology preset) and the simulated kubelet's defaults (start delay, pod
duration, exit code). `load_scenario` validates the file and names the file and field path of
any mistake; `Scenario.nodes()` expands the groups into Node objects with the labels the
scheduler relies on (GPU model, product, memory, count, topology preset, network block).
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from gpuyard.apis.core import GPU_RESOURCE, Node, NodeCondition, NodeSpec, NodeStatus, Taint
from gpuyard.apis.meta import ObjectMeta, StrictK8sModel
from gpuyard.apis.quantity import Quantity, format_quantity

__all__ = [
    "GPU_MODELS",
    "LABEL_BLOCK",
    "LABEL_GPU_COUNT",
    "LABEL_GPU_MEMORY",
    "LABEL_GPU_MODEL",
    "LABEL_GPU_PRODUCT",
    "LABEL_SPINE",
    "LABEL_TOPOLOGY_PRESET",
    "GpuSpec",
    "KubeletDefaults",
    "NodeGroup",
    "Scenario",
    "ScenarioError",
    "load_scenario",
]

LABEL_GPU_MODEL = "gpuyard.io/gpu-model"
LABEL_GPU_PRODUCT = "nvidia.com/gpu.product"
LABEL_GPU_MEMORY = "nvidia.com/gpu.memory"
LABEL_GPU_COUNT = "nvidia.com/gpu.count"
LABEL_TOPOLOGY_PRESET = "gpuyard.io/topology-preset"
LABEL_BLOCK = "topology.gpuyard.io/block"
LABEL_SPINE = "topology.gpuyard.io/spine"
LABEL_HOSTNAME = "kubernetes.io/hostname"

# short model key -> (product name as GPU feature discovery reports it, memory MiB per GPU)
GPU_MODELS: dict[str, tuple[str, int]] = {
    "k80": ("Tesla-K80", 12 * 1024),
    "p100": ("Tesla-P100-PCIE-16GB", 16 * 1024),
    "v100": ("Tesla-V100-SXM2-32GB", 32 * 1024),
    "v100-16gb": ("Tesla-V100-SXM2-16GB", 16 * 1024),
    "t4": ("Tesla-T4", 15 * 1024),
    "a10": ("NVIDIA-A10", 24 * 1024),
    "a30": ("NVIDIA-A30", 24 * 1024),
    "a100": ("NVIDIA-A100-SXM4-80GB", 80 * 1024),
    "a100-40gb": ("NVIDIA-A100-SXM4-40GB", 40 * 1024),
    "l40s": ("NVIDIA-L40S", 45 * 1024),
    "h100": ("NVIDIA-H100-80GB-HBM3", 80 * 1024),
    "h800": ("NVIDIA-H800", 80 * 1024),
    "h20": ("NVIDIA-H20", 96 * 1024),
}


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
    gpu: GpuSpec | None = None
    topology: str | None = Field(default=None, description="Topology preset name (dgx1-v100, dgx-a100, ...).")
    topology_file: str | None = Field(default=None, description="An `nvidia-smi topo -m` text file.")
    rdma_nics: int = Field(default=0, ge=0, le=64, description="RDMA NICs (resource rdma/hca).")
    block: str | None = Field(default=None, description="Network block label value.")
    spine: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=list)
    max_pods: int = Field(default=110, ge=1)

    @model_validator(mode="after")
    def _positive(self) -> NodeGroup:
        if self.cpu <= 0:
            raise ValueError("cpu must be positive")
        if self.memory <= 0:
            raise ValueError("memory must be positive")
        return self


class KubeletDefaults(StrictK8sModel):
    start_delay: float = Field(default=1.0, ge=0, description="Seconds from Pending to Running.")
    duration: float | None = Field(
        default=None, ge=0, description="Pod run time in seconds; null runs forever."
    )
    exit_code: int = Field(default=0, ge=0, le=255)


class Scenario(StrictK8sModel):
    name: str = "cluster"
    description: str = ""
    kubelet: KubeletDefaults = Field(default_factory=KubeletDefaults)
    node_groups: list[NodeGroup] = Field(min_length=1)

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

    def nodes(self) -> list[Node]:
        """Expand the node groups into Ready Node objects (`<group>-<i>`)."""
        out = []
        for g in self.node_groups:
            for i in range(g.count):
                out.append(_make_node(g, f"{g.name}-{i}"))
        return out

    @property
    def total_gpus(self) -> int:
        return sum(g.count * (g.gpu.count if g.gpu else 0) for g in self.node_groups)


def _make_node(group: NodeGroup, name: str) -> Node:
    labels = {LABEL_HOSTNAME: name, **group.labels}
    capacity: dict[str, Decimal] = {
        "cpu": group.cpu,
        "memory": group.memory,
        "pods": Decimal(group.max_pods),
    }
    if group.gpu is not None:
        product, memory = GPU_MODELS[group.gpu.model]
        labels[LABEL_GPU_MODEL] = group.gpu.model
        labels[LABEL_GPU_PRODUCT] = group.gpu.product or product
        labels[LABEL_GPU_MEMORY] = str(group.gpu.memory_mib or memory)
        labels[LABEL_GPU_COUNT] = str(group.gpu.count)
        capacity[GPU_RESOURCE] = Decimal(group.gpu.count)
    if group.topology:
        labels[LABEL_TOPOLOGY_PRESET] = group.topology
    if group.block:
        labels[LABEL_BLOCK] = group.block
    if group.spine:
        labels[LABEL_SPINE] = group.spine
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


def parse_scenario(data: object, *, source: str) -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: expected a mapping with nodeGroups, got {type(data).__name__}")
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            path = ".".join(str(p) for p in err["loc"]) or "<root>"
            msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
            problems.append(f"{path}: {msg}")
        raise ScenarioError(f"{source}: " + "; ".join(problems)) from None


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
    return parse_scenario(data, source=str(p))


def describe(scenario: Scenario) -> str:
    """One line: `demo: 9 nodes, 44 GPUs (16 v100, 8 a100, ...)`."""
    per_model: dict[str, int] = {}
    nodes = 0
    for g in scenario.node_groups:
        nodes += g.count
        if g.gpu:
            per_model[g.gpu.model] = per_model.get(g.gpu.model, 0) + g.count * g.gpu.count
    models = ", ".join(f"{n} {m}" for m, n in sorted(per_model.items()))
    return (
        f"{scenario.name}: {nodes} nodes, {scenario.total_gpus} GPUs ({models or 'none'}); "
        + format_quantity(sum((g.cpu * g.count for g in scenario.node_groups), Decimal(0)))
        + " CPUs"
    )
