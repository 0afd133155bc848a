"""The workload plugin contract: what one job kind tells the generic engine.

A plugin is a small, pure description of a framework (TensorFlow, PyTorch, ...): its default
start order, how to wire one pod's distributed environment (`TF_CONFIG`, `MASTER_ADDR`, an MPI
hostfile, ...), which pods carry the `job-role=master` label, and when the job has succeeded.
The engine (`gpuyard.controllers.planning` and around it) does everything else: gangs, reservations, pods,
services, restarts, status. Plugins never touch the store.

`wire()` receives a :class:`Wiring`: the job, the pod's role and index, the pod template being
built (a private copy: mutate it), and in host-network mode the pod's own host port. The helpers
here reproduce the reference operators' lookups exactly (port by container and port name,
`<job>-<role>-<index>` host names) so that plugins stay short.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from gpuyard.apis.core import Container, EnvVar, PodSpec, PodTemplateSpec
from gpuyard.apis.jobkinds import Flavor, PortDefault, TrainingJob
from gpuyard.apis.jobspecs import DAGCondition, ReplicaSpec
from gpuyard.apis.meta import K8sModel

__all__ = [
    "JobView",
    "PodOutcome",
    "Wiring",
    "WorkloadPlugin",
    "extra_list",
    "go_json",
    "replica_name",
]


def replica_name(job: str, role: str, index: int) -> str:
    """`<job>-<role lower>-<index>`, with '/' replaced like the Go operators' GenGeneralName."""
    return f"{job}-{role.lower()}-{index}".replace("/", "-")


def go_json(value: object) -> str:
    """JSON as Go's `encoding/json` writes it: compact, map keys sorted, `<>&` escaped."""
    text = json.dumps(value, separators=(",", ":"), sort_keys=False, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _sorted_maps(value: object) -> object:
    if isinstance(value, Mapping):
        return {k: _sorted_maps(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted_maps(v) for v in value]
    return value


def go_map(value: Mapping[str, object]) -> dict[str, object]:
    """A Go `map[string]...`: encoding/json writes its keys sorted."""
    return {k: _sorted_maps(value[k]) for k in sorted(value)}


def extra_list(model: K8sModel, key: str) -> list[dict[str, Any]]:
    """The list of raw objects in `model`'s pass-through field `key` (`volumes`, `volumeMounts`:
    Kubernetes fields gpuyard keeps but does not model), created empty if absent or null; append
    to it to add one."""
    extra = model.__pydantic_extra__
    if extra is None:  # a StrictK8sModel keeps no unknown fields
        raise TypeError(f"{type(model).__name__} has no pass-through fields")
    if extra.get(key) is None:
        extra[key] = []
    items: list[dict[str, Any]] = extra[key]  # raw JSON objects, as parsed
    return items


@dataclass(slots=True)
class Wiring:
    """One pod being built: who it is, and the template to wire (a private copy)."""

    job: TrainingJob
    role: str
    index: int
    template: PodTemplateSpec
    annotations: dict[str, str] = field(default_factory=dict)
    host_port: int | None = None
    cluster_domain: str = ""

    @property
    def rt(self) -> str:
        """The replica type as the reference operators write it in names and env: lower case."""
        return self.role.lower()

    @property
    def spec(self) -> PodSpec:
        return self.template.spec

    @property
    def flavor(self) -> Literal["kubedl", "kubeflow"]:
        return self.job.flavor

    @property
    def api(self) -> Flavor:
        return self.job.info.flavor(self.job.api_version)

    @property
    def port_default(self) -> PortDefault:
        return self.api.port

    @property
    def name(self) -> str:
        return self.job.metadata.name

    @property
    def namespace(self) -> str:
        return self.job.metadata.namespace or "default"

    @property
    def host_network(self) -> bool:
        return self.job.host_network and self.host_port is not None

    def specs(self) -> dict[str, ReplicaSpec]:
        return self.job.replica_specs

    def replicas(self, role: str) -> int:
        spec = self.job.replica_specs.get(role)
        return spec.count if spec is not None else 0

    def total_replicas(self, *, exclude: Iterable[str] = ()) -> int:
        skip = set(exclude)
        return sum(s.count for r, s in self.job.replica_specs.items() if r not in skip)

    def port_of(self, role: str) -> int | None:
        """The framework port of `role` as GetPortFromJob finds it: the default container's named port."""
        spec = self.job.replica_specs.get(role)
        if spec is None:
            return None
        return container_port(spec.template.spec, self.port_default)

    def own_port(self, role: str | None = None) -> int | None:
        """The port this pod listens on: its host port in host-network mode, else the framework port."""
        if self.host_network and (role is None or role == self.role):
            return self.host_port
        return self.port_of(role or self.role)

    def host(self, role: str, index: int) -> str:
        return replica_name(self.name, role, index)

    def containers(self, name: str | None = None) -> list[Container]:
        """All containers, or only those named `name` (the framework's default container)."""
        if name is None:
            return list(self.spec.containers)
        return [c for c in self.spec.containers if c.name == name]


def container_port(spec: PodSpec, default: PortDefault) -> int | None:
    """The default port: the default container's port of the default name (first container if none is so named)."""
    if not spec.containers:
        return None
    container = next((c for c in spec.containers if c.name == default.container), spec.containers[0])
    for p in container.ports:
        if p.name == default.name:
            return p.container_port
    return default.port


def add_env(
    container: Container, name: str, value: str | None = None, *, field_path: str | None = None
) -> None:
    """Append an env var (as the Go operators do: `append`, no de-duplication)."""
    if field_path is not None:
        container.env.append(EnvVar(name=name, value_from={"fieldRef": {"fieldPath": field_path}}))
    else:
        container.env.append(EnvVar(name=name, value=value))


def set_env(
    container: Container, name: str, value: str | None = None, *, field_path: str | None = None
) -> None:
    """Append, or replace a variable of the same name (Mars' appendOrOverrideEnvs)."""
    for i, e in enumerate(container.env):
        if e.name == name:
            container.env[i] = (
                EnvVar(name=name, value_from={"fieldRef": {"fieldPath": field_path}})
                if field_path
                else EnvVar(name=name, value=value)
            )
            return
    add_env(container, name, value, field_path=field_path)


@dataclass(frozen=True, slots=True)
class PodOutcome:
    """What became of one replica's current pod (None fields: no pod)."""

    phase: str | None = None
    exit_code: int | None = None


@dataclass(slots=True)
class JobView:
    """The job's pods as the success rule sees them: role -> index -> outcome."""

    replicas: dict[str, int]
    pods: dict[str, dict[int, PodOutcome]] = field(default_factory=dict)

    def outcome(self, role: str, index: int) -> PodOutcome:
        return self.pods.get(role, {}).get(index, PodOutcome())

    def succeeded(self, role: str) -> int:
        return sum(1 for o in self.pods.get(role, {}).values() if o.phase == "Succeeded")

    def all_succeeded(self, role: str) -> bool:
        n = self.replicas.get(role, 0)
        return n > 0 and self.succeeded(role) >= n

    def index_completed(self, role: str, index: int) -> bool:
        """Succeeded with exit code 0 (or no code reported), e.g. worker 0 of a TFJob."""
        o = self.outcome(role, index)
        return o.phase == "Succeeded" and (o.exit_code in (0, None))


class WorkloadPlugin:
    """Base plugin: subclass, set `kind`, override what the framework needs."""

    kind: ClassVar[str] = ""

    def default_dependencies(self, job: TrainingJob) -> dict[str, list[DAGCondition]]:
        """Role -> upstream conditions used when the replica spec gives no `dependsOn`."""
        return {}

    def wire(self, w: Wiring) -> None:
        """Add the framework's environment (env vars, ports, volumes, annotations) to one pod."""

    def is_master(self, job: TrainingJob, role: str, index: int) -> bool:
        """Pods that get the `job-role=master` label."""
        return False

    def succeeded(self, job: TrainingJob, view: JobView) -> bool:
        """Default success rule: every pod of every role succeeded."""
        return all(view.all_succeeded(r) for r, n in view.replicas.items() if n > 0)

    def fatal_roles(self, job: TrainingJob) -> frozenset[str]:
        """Roles whose failure fails the job whatever their restart policy says."""
        return frozenset()


def dependencies(
    pairs: Iterable[tuple[str, str]],
    job: TrainingJob,
    *,
    on_phase: Literal["Running", "Succeeded"] = "Running",
) -> dict[str, list[DAGCondition]]:
    """`[(downstream, upstream), ...]` -> default DAG, keeping only roles the job has."""
    specs = job.replica_specs
    out: dict[str, list[DAGCondition]] = {}
    for down, up in pairs:
        if down in specs and up in specs:
            out.setdefault(down, []).append(DAGCondition(upstream=up, on_phase=on_phase))
    return out
