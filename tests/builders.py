"""Small builders for tests: `make_node(...)`, `make_pod(...)`, `make_context()`.

Plain objects with sensible defaults, so a test states only what it is about.
"""

from __future__ import annotations

from gpuyard.apis.core import (
    GPU_RESOURCE,
    Container,
    Node,
    NodeCondition,
    NodeSpec,
    NodeStatus,
    Pod,
    PodSpec,
    ResourceRequirements,
    Taint,
)
from gpuyard.apis.devicematching import LABEL_GPU_MEMORY, LABEL_GPU_MODEL, LABEL_GPU_PRODUCT
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.quantity import parse_quantity
from gpuyard.devices.presets import GPU_MODELS
from gpuyard.devices.scenarios import LABEL_GPU_COUNT
from gpuyard.state.context import Context

__all__ = ["make_context", "make_node", "make_pod"]


def make_node(
    name: str,
    *,
    gpus: int = 8,
    model: str = "v100",
    cpu: str = "64",
    memory: str = "512Gi",
    labels: dict[str, str] | None = None,
    taints: list[Taint] | None = None,
    ready: bool = True,
) -> Node:
    node_labels = {"kubernetes.io/hostname": name}
    capacity = {
        "cpu": parse_quantity(cpu),
        "memory": parse_quantity(memory),
        "ephemeral-storage": parse_quantity("2Ti"),
        "pods": parse_quantity(110),
    }
    if gpus:
        node_labels |= {
            LABEL_GPU_MODEL: model,
            LABEL_GPU_PRODUCT: GPU_MODELS[model].name,
            LABEL_GPU_MEMORY: str(GPU_MODELS[model].memory_mib),
            LABEL_GPU_COUNT: str(gpus),
        }
        capacity[GPU_RESOURCE] = parse_quantity(gpus)
    node_labels |= labels or {}
    return Node(
        metadata=ObjectMeta(name=name, labels=node_labels),
        spec=NodeSpec(taints=taints or []),
        status=NodeStatus(
            capacity=capacity,
            allocatable=dict(capacity),
            conditions=[NodeCondition(type="Ready", status="True" if ready else "False")],
        ),
    )


def make_pod(
    name: str,
    *,
    namespace: str = "default",
    node: str | None = None,
    gpus: int = 0,
    cpu: str = "1",
    memory: str = "1Gi",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> Pod:
    limits = {"cpu": parse_quantity(cpu), "memory": parse_quantity(memory)}
    if gpus:
        limits[GPU_RESOURCE] = parse_quantity(gpus)
    return Pod(
        metadata=ObjectMeta(
            name=name, namespace=namespace, labels=labels or {}, annotations=annotations or {}
        ),
        spec=PodSpec(
            node_name=node,
            containers=[
                Container(name="main", image="busybox", resources=ResourceRequirements(limits=limits))
            ],
        ),
    )


def make_context() -> Context:
    return Context.for_tests()
