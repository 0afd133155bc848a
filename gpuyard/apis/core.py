"""Core Kubernetes objects: Node, Pod, Service, Event, Namespace-less helpers.

The subset of the Kubernetes API a training platform uses, as pydantic models. Field names
follow Kubernetes exactly on the wire (camelCase); fields gpuyard does not interpret are kept
(`extra="allow"`) so pods written for Kubernetes pass through unchanged.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

from pydantic import Field, field_validator

from gpuyard.apis.meta import K8sModel, Resource
from gpuyard.apis.quantity import Quantity

__all__ = [
    "GPU_RESOURCE",
    "Affinity",
    "ConfigMap",
    "Container",
    "ContainerPort",
    "ContainerState",
    "ContainerStatus",
    "EnvVar",
    "Event",
    "Node",
    "NodeAffinity",
    "NodeCondition",
    "NodeSelector",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "NodeSpec",
    "NodeStatus",
    "Pod",
    "PodPhase",
    "PodSpec",
    "PodStatus",
    "PodTemplateSpec",
    "ResourceRequirements",
    "Service",
    "ServicePort",
    "ServiceSpec",
    "Taint",
    "Toleration",
]

GPU_RESOURCE = "nvidia.com/gpu"

PodPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Unknown"]
RestartPolicy = Literal["Always", "OnFailure", "Never"]
DNSPolicy = Literal["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"]
TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


# --- containers -------------------------------------------------------------------------------


class EnvVar(K8sModel):
    name: str
    value: str | None = None
    value_from: dict[str, Any] | None = None


class ContainerPort(K8sModel):
    container_port: int = Field(ge=1, le=65535)
    name: str | None = None
    host_port: int | None = Field(default=None, ge=1, le=65535)
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"


class ResourceRequirements(K8sModel):
    requests: dict[str, Quantity] = Field(default_factory=dict)
    limits: dict[str, Quantity] = Field(default_factory=dict)

    @field_validator("requests", "limits")
    @classmethod
    def _not_negative(cls, value: dict[str, Decimal]) -> dict[str, Decimal]:
        negative = [f"{name}: {q}" for name, q in value.items() if q < 0]
        if negative:
            raise ValueError(f"{', '.join(negative)} is negative; allowed: a quantity of 0 or more")
        return value

    def effective(self) -> dict[str, Decimal]:
        """Requests, defaulting to limits where no request is given (Kubernetes' rule)."""
        merged = dict(self.limits)
        merged.update(self.requests)
        return merged


class Container(K8sModel):
    name: str
    image: str = ""
    command: list[str] = Field(default_factory=list)
    args: list[str] = Field(default_factory=list)
    env: list[EnvVar] = Field(default_factory=list)
    ports: list[ContainerPort] = Field(default_factory=list)
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    image_pull_policy: str | None = None
    working_dir: str | None = None

    def env_dict(self) -> dict[str, str]:
        return {e.name: e.value or "" for e in self.env}

    def set_env(self, name: str, value: str) -> None:
        for e in self.env:
            if e.name == name:
                e.value = value
                return
        self.env.append(EnvVar(name=name, value=value))


# --- scheduling constraints -------------------------------------------------------------------


class NodeSelectorRequirement(K8sModel):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[str] = Field(default_factory=list)


class NodeSelectorTerm(K8sModel):
    match_expressions: list[NodeSelectorRequirement] = Field(default_factory=list)
    match_fields: list[NodeSelectorRequirement] = Field(default_factory=list)


class NodeSelector(K8sModel):
    node_selector_terms: list[NodeSelectorTerm] = Field(default_factory=list)


class NodeAffinity(K8sModel):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    preferred_during_scheduling_ignored_during_execution: list[dict[str, Any]] = Field(default_factory=list)


class Affinity(K8sModel):
    node_affinity: NodeAffinity | None = None


class Toleration(K8sModel):
    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: TaintEffect | None = None
    toleration_seconds: int | None = None

    def tolerates(self, taint: Taint) -> bool:
        if self.effect is not None and self.effect != taint.effect:
            return False
        if self.key is None:  # empty key with Exists tolerates everything
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or (self.value or "") == (taint.value or "")


# --- pods -------------------------------------------------------------------------------------


class PodSpec(K8sModel):
    containers: list[Container] = Field(default_factory=list)
    init_containers: list[Container] = Field(default_factory=list)
    node_name: str | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    affinity: Affinity | None = None
    tolerations: list[Toleration] = Field(default_factory=list)
    host_network: bool = False
    dns_policy: DNSPolicy | None = None
    restart_policy: RestartPolicy | None = None
    scheduler_name: str | None = None
    priority: int | None = None
    priority_class_name: str | None = None
    hostname: str | None = None
    subdomain: str | None = None

    def requests(self) -> dict[str, Decimal]:
        """The pod's effective request: the sum over containers, at least each init container."""
        total: dict[str, Decimal] = {}
        for c in self.containers:
            for name, q in c.resources.effective().items():
                total[name] = total.get(name, Decimal(0)) + q
        for c in self.init_containers:
            for name, q in c.resources.effective().items():
                if q > total.get(name, Decimal(0)):
                    total[name] = q
        return total


class ContainerState(K8sModel):
    waiting: dict[str, Any] | None = None
    running: dict[str, Any] | None = None
    terminated: dict[str, Any] | None = None


class ContainerStatus(K8sModel):
    name: str
    ready: bool = False
    restart_count: int = 0
    state: ContainerState = Field(default_factory=ContainerState)
    exit_code: int | None = Field(default=None, description="Exit code of the last termination (shortcut).")


class PodStatus(K8sModel):
    phase: PodPhase = "Pending"
    reason: str | None = None
    message: str | None = None
    host_ip: str | None = None
    pod_ip: str | None = None
    start_time: datetime | None = None
    container_statuses: list[ContainerStatus] = Field(default_factory=list)
    conditions: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def exit_code(self) -> int | None:
        """The first non-None exit code among the containers (the training process's)."""
        for cs in self.container_statuses:
            if cs.exit_code is not None:
                return cs.exit_code
            if cs.state.terminated and "exitCode" in cs.state.terminated:
                return int(cs.state.terminated["exitCode"])
        return None


class Pod(Resource):
    KIND = "Pod"
    API_VERSION = "v1"

    spec: PodSpec = Field(default_factory=PodSpec)
    status: PodStatus = Field(default_factory=PodStatus)


class PodTemplateSpec(K8sModel):
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: PodSpec = Field(default_factory=PodSpec)


# --- nodes ------------------------------------------------------------------------------------


class Taint(K8sModel):
    key: str
    value: str | None = None
    effect: TaintEffect


class NodeCondition(K8sModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None
    message: str | None = None
    last_transition_time: datetime | None = None


class NodeSpec(K8sModel):
    unschedulable: bool = False
    taints: list[Taint] = Field(default_factory=list)


class NodeStatus(K8sModel):
    capacity: dict[str, Quantity] = Field(default_factory=dict)
    allocatable: dict[str, Quantity] = Field(default_factory=dict)
    conditions: list[NodeCondition] = Field(default_factory=list)

    @field_validator("allocatable")
    @classmethod
    def _non_negative(cls, value: dict[str, Decimal]) -> dict[str, Decimal]:
        for name, q in value.items():
            if q < 0:
                raise ValueError(f"{name} must not be negative")
        return value


class Node(Resource):
    KIND = "Node"
    API_VERSION = "v1"
    NAMESPACED = False

    spec: NodeSpec = Field(default_factory=NodeSpec)
    status: NodeStatus = Field(default_factory=NodeStatus)

    @property
    def ready(self) -> bool:
        for c in self.status.conditions:
            if c.type == "Ready":
                return c.status == "True"
        return False


# --- services and events ----------------------------------------------------------------------


class ServicePort(K8sModel):
    port: int = Field(ge=1, le=65535)
    name: str | None = None
    target_port: int | str | None = None
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"


class ServiceSpec(K8sModel):
    selector: dict[str, str] = Field(default_factory=dict)
    ports: list[ServicePort] = Field(default_factory=list)
    cluster_ip: str | None = Field(default=None, alias="clusterIP")
    type: Literal["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"] = "ClusterIP"


class Service(Resource):
    KIND = "Service"
    API_VERSION = "v1"

    spec: ServiceSpec = Field(default_factory=ServiceSpec)


class ConfigMap(Resource):
    """A ConfigMap gpuyard writes (the Dockerfile of a model's image build, `controllers/imagebuilding.py`);
    gpuyard does not watch ConfigMaps: the store holds only the ones it wrote or read."""

    KIND = "ConfigMap"
    API_VERSION = "v1"

    data: dict[str, str] = Field(default_factory=dict)


class Event(Resource):
    """A Kubernetes-style event about an object (`involvedObject`): `core/v1`'s fields, written by
    the one Event recorder (`gpuyard.state.events`). `source.component` and `reportingComponent`
    name the component that reported it (and is its one writer); `reportingInstance` the replica."""

    KIND = "Event"
    API_VERSION = "v1"

    involved_object: dict[str, str] = Field(default_factory=dict)
    reason: str = ""
    message: str = ""
    type: Literal["Normal", "Warning"] = "Normal"
    count: int = 1
    first_timestamp: datetime | None = None
    last_timestamp: datetime | None = None
    source: dict[str, str] = Field(default_factory=dict)
    reporting_component: str | None = None
    reporting_instance: str | None = None
