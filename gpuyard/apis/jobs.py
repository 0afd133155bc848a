"""Training job kinds: KubeDL (`training.kubedl.io/v1alpha1`) and Kubeflow (`kubeflow.org/v1`).

Job files written for those projects are accepted as written: the models follow their field
names (`tfReplicaSpecs`, `runPolicy`, inline KubeDL run policy, `elasticPolicy`, ...) and keep
every field gpuyard does not interpret. One store kind per `kind` (TFJob exists in both API
groups; the object's `apiVersion` says which project's conventions apply).

This module is the edge of the data flow (`submit -> validate -> store`): `parse_job` turns a
decoded document into a defaulted, validated job or raises :class:`JobValidationError` listing
every offending field path with the allowed values. The job operator
(`gpuyard.controllers`) reads these objects; the per-kind *behaviour* (env wiring, start order,
success rule) lives in its workload plugins, while the per-kind *API facts* (replica types,
default container/port/restart policy) are declared here in :data:`KIND_INFO`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Literal

import yaml
from pydantic import AliasChoices, Field, ValidationError, field_validator

from gpuyard.apis.core import ContainerPort, PodTemplateSpec
from gpuyard.apis.meta import K8sModel, Resource
from gpuyard.apis.quantity import Quantity

__all__ = [
    "ANNOTATION_GANG_GROUP",
    "ANNOTATION_GIT_SYNC",
    "ANNOTATION_NETWORK_MODE",
    "API_KUBEDL",
    "API_KUBEFLOW",
    "JOB_KINDS",
    "KIND_INFO",
    "DAGCondition",
    "ElasticPolicy",
    "JAXJob",
    "JobCondition",
    "JobKindInfo",
    "JobSpec",
    "JobStatus",
    "JobValidationError",
    "MPIJob",
    "MarsJob",
    "PaddleJob",
    "PyTorchJob",
    "ReplicaSpec",
    "ReplicaStatus",
    "RunPolicy",
    "SchedulingPolicy",
    "TFJob",
    "TrainingJob",
    "XGBoostJob",
    "find_job",
    "job_classes",
    "load_documents",
    "parse_job",
]

API_KUBEDL = "training.kubedl.io/v1alpha1"
API_KUBEFLOW = "kubeflow.org/v1"

ANNOTATION_NETWORK_MODE = "kubedl.io/network-mode"  # value "host": host-network mode
ANNOTATION_GIT_SYNC = "kubedl.io/git-sync-config"  # JSON: git-sync init container options
ANNOTATION_GANG_GROUP = "gpuyard.io/gang-group"  # comma-separated ns/name of jobs placed together

RestartPolicy = Literal["Always", "OnFailure", "Never", "ExitCode"]
CleanPodPolicy = Literal["All", "Running", "None"]
SuccessPolicy = Literal["", "AllWorkers"]
JobConditionType = Literal["Created", "Queuing", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 52  # leaves room for "-<role>-<index>" within a 63-character DNS label


# --- spec ------------------------------------------------------------------------------------


class DAGCondition(K8sModel):
    """Start this replica type only when every pod of `upstream` has reached `onPhase`."""

    upstream: str
    on_phase: Literal["Running", "Succeeded"] = "Running"


class ReplicaSpec(K8sModel):
    """One replica type (role) of a job: how many pods, their template, how they restart."""

    replicas: int | None = None
    template: PodTemplateSpec = Field(default_factory=PodTemplateSpec)
    restart_policy: RestartPolicy | None = None
    depends_on: list[DAGCondition] | None = Field(
        default=None,
        validation_alias=AliasChoices("dependsOn", "dependOn", "depends_on"),
        serialization_alias="dependsOn",
    )

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, value: int | None) -> int | None:
        if value is not None and value < 0:
            raise ValueError(f"must be a non-negative integer (0, 1, 2, ...); got {value}")
        return value

    @property
    def count(self) -> int:
        return self.replicas if self.replicas is not None else 1


class SchedulingPolicy(K8sModel):
    """Gang/queue settings; KubeDL's and Kubeflow's fields are both accepted."""

    min_available: int | None = Field(default=None, ge=0)
    queue: str | None = None
    priority: int | None = None
    priority_class_name: str | None = None
    priority_class: str | None = Field(default=None, description="Kubeflow's spelling of priorityClassName.")
    min_resources: dict[str, Quantity] | None = None
    schedule_timeout_seconds: int | None = Field(default=None, ge=0)


class RunPolicy(K8sModel):
    clean_pod_policy: CleanPodPolicy | None = None
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0)
    active_deadline_seconds: int | None = Field(default=None, ge=0)
    backoff_limit: int | None = Field(default=None, ge=0)
    scheduling_policy: SchedulingPolicy | None = None
    suspend: bool | None = None


class JobSpec(RunPolicy):
    """Fields every job kind shares. KubeDL inlines the run policy; Kubeflow nests `runPolicy`."""

    run_policy: RunPolicy | None = None
    success_policy: SuccessPolicy | None = None

    def effective(self) -> RunPolicy:
        """The run policy with Kubeflow's `runPolicy` taking precedence over inline fields."""
        merged: dict[str, Any] = {}
        for name in RunPolicy.model_fields:
            nested = getattr(self.run_policy, name, None) if self.run_policy is not None else None
            merged[name] = nested if nested is not None else getattr(self, name)
        return RunPolicy.model_validate(merged)


class RDZVConf(K8sModel):
    key: str = ""
    value: str = ""


class ElasticPolicy(K8sModel):
    """Kubeflow PyTorchJob's torchrun (elastic) settings."""

    min_replicas: int | None = Field(default=None, ge=0)
    max_replicas: int | None = Field(default=None, ge=0)
    rdzv_backend: str | None = None
    rdzv_port: int | None = Field(default=None, ge=1, le=65535)
    rdzv_host: str | None = None
    rdzv_id: str | None = None
    rdzv_conf: list[RDZVConf] | None = None
    standalone: bool | None = None
    n_proc_per_node: int | None = Field(default=None, ge=1)
    max_restarts: int | None = Field(default=None, ge=0)


class TFJobSpec(JobSpec):
    tf_replica_specs: dict[str, ReplicaSpec] = Field(default_factory=dict)


class PyTorchJobSpec(JobSpec):
    pytorch_replica_specs: dict[str, ReplicaSpec] = Field(default_factory=dict)
    elastic_policy: ElasticPolicy | None = None
    nproc_per_node: str | None = None

    @field_validator("nproc_per_node", mode="before")
    @classmethod
    def _nproc(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class XGBoostJobSpec(JobSpec):
    xgb_replica_specs: dict[str, ReplicaSpec] = Field(default_factory=dict)


class MPIJobSpec(JobSpec):
    mpi_replica_specs: dict[str, ReplicaSpec] = Field(default_factory=dict)
    slots_per_worker: int | None = Field(default=None, ge=1)
    main_container: str | None = None
    mpi_distribution: Literal["OpenMPI", "IntelMPI", "MPICH"] | None = None


class MarsWorkerMemoryTuningPolicy(K8sModel):
    plasma_store: str | None = None
    lock_free_file_io: bool | None = Field(
        default=None,
        validation_alias=AliasChoices("lockFreeFileIO", "lock_free_file_io"),
        serialization_alias="lockFreeFileIO",
    )
    spill_dirs: list[str] | None = None
    worker_cache_percentage: int | None = Field(default=None, ge=0)
    worker_cache_size: Quantity | None = None


class MarsJobSpec(JobSpec):
    mars_replica_specs: dict[str, ReplicaSpec] = Field(default_factory=dict)
    worker_memory_tuning_policy: MarsWorkerMemoryTuningPolicy | None = None
    web_host: str | None = None


class JAXJobSpec(JobSpec):
    jax_replica_specs: dict[str, ReplicaSpec] = Field(default_factory=dict)


class PaddleJobSpec(JobSpec):
    paddle_replica_specs: dict[str, ReplicaSpec] = Field(default_factory=dict)


# --- status ----------------------------------------------------------------------------------


class JobCondition(K8sModel):
    type: JobConditionType
    status: Literal["True", "False", "Unknown"] = "True"
    reason: str = ""
    message: str = ""
    last_update_time: datetime | None = None
    last_transition_time: datetime | None = None


class ReplicaStatus(K8sModel):
    """Pods of one replica type now: running (`active`), succeeded, failed; plus restarts so far."""

    active: int = 0
    succeeded: int = 0
    failed: int = 0
    restarts: int = 0


class PodRestart(K8sModel):
    """How often one replica was restarted, and the uid of the last failed pod counted."""

    count: int = 0
    last_uid: str = ""


class JobStatus(K8sModel):
    conditions: list[JobCondition] = Field(default_factory=list)
    replica_statuses: dict[str, ReplicaStatus] = Field(default_factory=dict)
    start_time: datetime | None = None
    completion_time: datetime | None = None
    last_reconcile_time: datetime | None = None
    phase: str = Field(
        default="", description="gpuyard: the current condition (Created, Queuing, Running, ...)."
    )
    restarts: int = Field(default=0, description="gpuyard: restarts counted against backoffLimit.")
    pod_restarts: dict[str, PodRestart] = Field(default_factory=dict)

    def condition(self, type_: str) -> JobCondition | None:
        for c in self.conditions:
            if c.type == type_:
                return c
        return None

    def is_true(self, type_: str) -> bool:
        c = self.condition(type_)
        return c is not None and c.status == "True"

    @property
    def finished(self) -> bool:
        return self.is_true("Succeeded") or self.is_true("Failed")


# --- the kinds ---------------------------------------------------------------------------------


class TrainingJob(Resource):
    """Base of every job kind; `replica_specs` is the kind's `*ReplicaSpecs` map."""

    REPLICA_FIELD: ClassVar[str] = ""

    spec: JobSpec = Field(default_factory=JobSpec)
    status: JobStatus = Field(default_factory=JobStatus)

    @property
    def replica_specs(self) -> dict[str, ReplicaSpec]:
        return getattr(self.spec, self.REPLICA_FIELD)

    @property
    def info(self) -> JobKindInfo:
        return KIND_INFO[self.KIND]

    @property
    def flavor(self) -> Literal["kubedl", "kubeflow"]:
        return "kubeflow" if self.api_version == API_KUBEFLOW else "kubedl"

    @property
    def run_policy(self) -> RunPolicy:
        return self.spec.effective()

    @property
    def host_network(self) -> bool:
        return self.metadata.annotations.get(ANNOTATION_NETWORK_MODE) == "host"

    @property
    def suspended(self) -> bool:
        return bool(self.run_policy.suspend)

    @property
    def queue(self) -> str:
        policy = self.run_policy.scheduling_policy
        return (
            (policy.queue if policy is not None and policy.queue else "")
            or self.metadata.namespace
            or "default"
        )

    def roles(self) -> list[str]:
        """Replica types present, in the kind's canonical order."""
        order = self.info.order
        return sorted(self.replica_specs, key=lambda r: (order.index(r) if r in order else len(order), r))


class TFJob(TrainingJob):
    KIND = "TFJob"
    API_VERSION = API_KUBEDL
    REPLICA_FIELD = "tf_replica_specs"
    spec: TFJobSpec = Field(default_factory=TFJobSpec)


class PyTorchJob(TrainingJob):
    KIND = "PyTorchJob"
    API_VERSION = API_KUBEDL
    REPLICA_FIELD = "pytorch_replica_specs"
    spec: PyTorchJobSpec = Field(default_factory=PyTorchJobSpec)


class XGBoostJob(TrainingJob):
    KIND = "XGBoostJob"
    API_VERSION = API_KUBEDL
    REPLICA_FIELD = "xgb_replica_specs"
    spec: XGBoostJobSpec = Field(default_factory=XGBoostJobSpec)


class MPIJob(TrainingJob):
    KIND = "MPIJob"
    API_VERSION = API_KUBEDL
    REPLICA_FIELD = "mpi_replica_specs"
    spec: MPIJobSpec = Field(default_factory=MPIJobSpec)


class MarsJob(TrainingJob):
    KIND = "MarsJob"
    API_VERSION = API_KUBEDL
    REPLICA_FIELD = "mars_replica_specs"
    spec: MarsJobSpec = Field(default_factory=MarsJobSpec)


class JAXJob(TrainingJob):
    KIND = "JAXJob"
    API_VERSION = API_KUBEFLOW
    REPLICA_FIELD = "jax_replica_specs"
    spec: JAXJobSpec = Field(default_factory=JAXJobSpec)


class PaddleJob(TrainingJob):
    KIND = "PaddleJob"
    API_VERSION = API_KUBEFLOW
    REPLICA_FIELD = "paddle_replica_specs"
    spec: PaddleJobSpec = Field(default_factory=PaddleJobSpec)


@dataclass(frozen=True, slots=True)
class PortDefault:
    container: str  # the framework's default container name
    name: str  # the default port's name
    port: int | None  # its number; None: the project adds no port


@dataclass(frozen=True, slots=True)
class Flavor:
    """One project's conventions for a kind: allowed roles, defaults."""

    roles: tuple[str, ...]
    restart: Mapping[str, RestartPolicy]  # role -> default restartPolicy ("*" for any role)
    port: PortDefault
    port_roles: tuple[str, ...] | None = None  # roles that get the default port (None: all)
    replicas: Mapping[str, int] = field(default_factory=dict)  # role -> default replicas (else 1)


@dataclass(frozen=True, slots=True)
class JobKindInfo:
    """What the API knows about a kind: its model, replica field and per-project flavors."""

    cls: type[TrainingJob]
    replica_field: str  # the camelCase name on the wire, e.g. tfReplicaSpecs
    order: tuple[str, ...]  # canonical role order (reconcile and display order)
    flavors: Mapping[str, Flavor]  # apiVersion -> flavor

    def flavor(self, api_version: str) -> Flavor:
        return self.flavors[api_version]


_TF_ROLES = ("PS", "Worker", "Chief", "Master", "Evaluator", "GraphLearn")
_TF_PORT = PortDefault("tensorflow", "tfjob-port", 2222)

KIND_INFO: dict[str, JobKindInfo] = {
    "TFJob": JobKindInfo(
        TFJob,
        "tfReplicaSpecs",
        ("GraphLearn", "PS", "Chief", "Master", "Worker", "Evaluator"),
        {
            API_KUBEDL: Flavor(_TF_ROLES, {"*": "ExitCode"}, _TF_PORT),
            API_KUBEFLOW: Flavor(_TF_ROLES, {"*": "Never"}, _TF_PORT),
        },
    ),
    "PyTorchJob": JobKindInfo(
        PyTorchJob,
        "pytorchReplicaSpecs",
        ("AIMaster", "Master", "Worker"),
        {
            API_KUBEDL: Flavor(
                ("Master", "Worker", "AIMaster"),
                {"Master": "ExitCode", "Worker": "OnFailure", "AIMaster": "Always"},
                PortDefault("pytorch", "pytorchjob-port", 23456),
                port_roles=("Master",),
            ),
            API_KUBEFLOW: Flavor(
                ("Master", "Worker"), {"*": "OnFailure"}, PortDefault("pytorch", "pytorchjob-port", 23456)
            ),
        },
    ),
    "XGBoostJob": JobKindInfo(
        XGBoostJob,
        "xgbReplicaSpecs",
        ("Master", "Worker"),
        {
            API_KUBEDL: Flavor(
                ("Master", "Worker"), {"*": "Never"}, PortDefault("xgboostjob", "xgboostjob-port", 9999)
            ),
            API_KUBEFLOW: Flavor(
                ("Master", "Worker"), {"*": "Never"}, PortDefault("xgboost", "xgboostjob-port", 9999)
            ),
        },
    ),
    "MPIJob": JobKindInfo(
        MPIJob,
        "mpiReplicaSpecs",
        ("Worker", "Launcher"),
        {
            API_KUBEDL: Flavor(("Launcher", "Worker"), {"*": "Never"}, PortDefault("mpi", "mpi-port", 2222)),
            API_KUBEFLOW: Flavor(
                ("Launcher", "Worker"),
                {"*": "Never"},
                PortDefault("mpi", "mpi-port", None),
                replicas={"Worker": 0},
            ),
        },
    ),
    "MarsJob": JobKindInfo(
        MarsJob,
        "marsReplicaSpecs",
        ("Scheduler", "WebService", "Worker"),
        {
            API_KUBEDL: Flavor(
                ("Scheduler", "Worker", "WebService"),
                {"Scheduler": "Never", "WebService": "Always", "Worker": "ExitCode"},
                PortDefault("mars", "mars-port", 11111),
            ),
        },
    ),
    "JAXJob": JobKindInfo(
        JAXJob,
        "jaxReplicaSpecs",
        ("Worker",),
        {API_KUBEFLOW: Flavor(("Worker",), {"*": "Never"}, PortDefault("jax", "jaxjob-port", 6666))},
    ),
    "PaddleJob": JobKindInfo(
        PaddleJob,
        "paddleReplicaSpecs",
        ("Master", "Worker"),
        {
            API_KUBEFLOW: Flavor(
                ("Master", "Worker"), {"*": "OnFailure"}, PortDefault("paddle", "master", 36543)
            )
        },
    ),
}

JOB_KINDS: list[type[Resource]] = [info.cls for info in KIND_INFO.values()]


def job_classes() -> list[type[TrainingJob]]:
    return [info.cls for info in KIND_INFO.values()]


def find_job(store: Any, namespace: str, name: str) -> TrainingJob | None:
    """The job named `name` in `namespace`, whatever its kind (names are unique per namespace)."""
    for kind in KIND_INFO:
        obj = store.get(kind, namespace, name)
        if obj is not None:
            return obj  # type: ignore[no-any-return]
    return None


# --- parsing, validation, defaulting ------------------------------------------------------------


class JobValidationError(ValueError):
    """A job document that cannot be accepted; `details` lists `{"field", "reason"}` per problem."""

    def __init__(self, message: str, details: Iterable[dict[str, str]]) -> None:
        super().__init__(message)
        self.message = message
        self.details = list(details)


def _fmt_loc(loc: Iterable[Any]) -> str:
    return ".".join(str(p) for p in loc)


def _pydantic_details(exc: ValidationError) -> list[dict[str, str]]:
    out = []
    for err in exc.errors():
        loc = list(err["loc"])
        # pydantic reports the field by its alias already; keep the path as the user wrote it
        path = _fmt_loc(loc)
        reason = (
            "unknown field" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        )
        out.append({"field": path or "<root>", "reason": reason})
    return out


def _canonical_roles(
    info: JobKindInfo, flavor: Flavor, raw: Mapping[str, Any], *, kind: str, api_version: str
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """Map replica type keys case-insensitively to canonical names (as KubeDL/Kubeflow default them)."""
    allowed = {r.lower(): r for r in flavor.roles}
    out: dict[str, Any] = {}
    errors = []
    for key, value in raw.items():
        canonical = allowed.get(str(key).lower())
        if canonical is None:
            errors.append(
                {
                    "field": f"spec.{info.replica_field}.{key}",
                    "reason": f"unknown replica type {key!r} for {kind} ({api_version}); allowed: {', '.join(sorted(flavor.roles))}",
                }
            )
            continue
        if canonical in out:
            errors.append(
                {
                    "field": f"spec.{info.replica_field}.{key}",
                    "reason": f"replica type {canonical} is given twice",
                }
            )
            continue
        out[canonical] = value
    return out, errors


def parse_job(doc: Any) -> TrainingJob:
    """Validate and default one decoded job document; raise :class:`JobValidationError`."""
    if not isinstance(doc, Mapping):
        raise JobValidationError(
            "a job document must be a mapping",
            [{"field": "<root>", "reason": f"expected an object, got {type(doc).__name__}"}],
        )
    kind = doc.get("kind")
    api_version = doc.get("apiVersion")
    info = KIND_INFO.get(kind) if isinstance(kind, str) else None
    if info is None:
        raise JobValidationError(
            f"unknown kind {kind!r}",
            [{"field": "kind", "reason": f"unknown kind {kind!r}; allowed: {', '.join(sorted(KIND_INFO))}"}],
        )
    if api_version not in info.flavors:
        raise JobValidationError(
            f"unknown apiVersion {api_version!r} for {kind}",
            [
                {
                    "field": "apiVersion",
                    "reason": f"{api_version!r} is not an apiVersion of {kind}; allowed: {', '.join(sorted(info.flavors))}",
                }
            ],
        )
    flavor = info.flavor(api_version)
    errors: list[dict[str, str]] = _name_errors(doc.get("metadata"))
    data = dict(doc)
    data.pop("status", None)  # status is the operator's
    spec = doc.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(spec, Mapping):
        raise JobValidationError(
            "spec must be an object",
            [{"field": "spec", "reason": f"expected an object, got {type(spec).__name__}"}],
        )
    spec = dict(spec)
    raw_roles = spec.get(info.replica_field)
    if raw_roles is None or (isinstance(raw_roles, Mapping) and not raw_roles):
        errors.append(
            {
                "field": f"spec.{info.replica_field}",
                "reason": f"at least one replica type is required; allowed: {', '.join(sorted(flavor.roles))}",
            }
        )
    elif not isinstance(raw_roles, Mapping):
        errors.append(
            {
                "field": f"spec.{info.replica_field}",
                "reason": f"expected a map of replica type to replica spec, got {type(raw_roles).__name__}",
            }
        )
    else:
        roles, role_errors = _canonical_roles(info, flavor, raw_roles, kind=kind, api_version=api_version)
        errors.extend(role_errors)
        spec[info.replica_field] = roles
    data["spec"] = spec
    try:
        job = info.cls.model_validate(data)
    except ValidationError as exc:
        errors.extend(_pydantic_details(exc))
        raise JobValidationError(f"invalid {kind}", errors) from None
    errors.extend(_semantic_errors(job, flavor))
    if errors:
        raise JobValidationError(f"invalid {kind} {job.metadata.name or '<unnamed>'}", errors)
    if not job.metadata.namespace:
        job.metadata.namespace = "default"
    apply_defaults(job)
    return job


def _name_errors(metadata: Any) -> list[dict[str, str]]:
    if not isinstance(metadata, Mapping):
        return [{"field": "metadata", "reason": "required: an object with at least a name"}]
    name = metadata.get("name")
    if not name:
        return [{"field": "metadata.name", "reason": "required"}]
    if not isinstance(name, str) or not _NAME_RE.match(name) or len(name) > MAX_NAME:
        return [
            {
                "field": "metadata.name",
                "reason": f"{name!r} must be lower-case letters, digits and '-', start and end alphanumeric, at most {MAX_NAME} characters",
            }
        ]
    namespace = metadata.get("namespace")
    if namespace is not None and (
        not isinstance(namespace, str) or (namespace and not _NAME_RE.match(namespace))
    ):
        return [
            {
                "field": "metadata.namespace",
                "reason": f"{namespace!r} must be lower-case letters, digits and '-'",
            }
        ]
    return []


def _semantic_errors(job: TrainingJob, flavor: Flavor) -> list[dict[str, str]]:
    errors: list[dict[str, str]] = []
    info = job.info
    specs = job.replica_specs
    git_sync = job.metadata.annotations.get(ANNOTATION_GIT_SYNC)
    if git_sync is not None:
        try:
            opts = json.loads(git_sync)
        except ValueError as exc:
            opts = None
            reason = f"not valid JSON: {exc}"
        else:
            reason = 'an object with at least "source" (the git repository) is required'
        if not isinstance(opts, dict) or not opts.get("source"):
            errors.append({"field": f"metadata.annotations.{ANNOTATION_GIT_SYNC}", "reason": reason})
    for role, spec in specs.items():
        base = f"spec.{info.replica_field}.{role}"
        if not spec.template.spec.containers:
            errors.append(
                {"field": f"{base}.template.spec.containers", "reason": "at least one container is required"}
            )
        for i, dep in enumerate(spec.depends_on or []):
            up = {r.lower(): r for r in specs}.get(dep.upstream.lower())
            if up is None:
                errors.append(
                    {
                        "field": f"{base}.dependsOn.{i}.upstream",
                        "reason": f"unknown replica type {dep.upstream!r}; allowed: {', '.join(sorted(specs))}",
                    }
                )
            elif up == role:
                errors.append(
                    {
                        "field": f"{base}.dependsOn.{i}.upstream",
                        "reason": "a replica type cannot depend on itself",
                    }
                )
    cycle = _dependency_cycle(specs)
    if cycle:
        errors.append(
            {
                "field": f"spec.{info.replica_field}",
                "reason": f"dependsOn forms a cycle: {' -> '.join(cycle)}",
            }
        )
    if job.KIND == "PyTorchJob" and "Master" in specs and specs["Master"].count > 1:
        errors.append(
            {
                "field": f"spec.{info.replica_field}.Master.replicas",
                "reason": "a PyTorchJob has at most one Master; allowed: 0 or 1",
            }
        )
    if job.KIND == "MPIJob" and "Launcher" in specs and specs["Launcher"].count != 1:
        errors.append(
            {
                "field": f"spec.{info.replica_field}.Launcher.replicas",
                "reason": "an MPIJob has exactly one Launcher; allowed: 1",
            }
        )
    policy = job.run_policy
    if policy.scheduling_policy is not None and policy.scheduling_policy.min_available is not None:
        total = sum(s.count for s in specs.values())
        if policy.scheduling_policy.min_available > total:
            errors.append(
                {
                    "field": "spec.schedulingPolicy.minAvailable"
                    if job.spec.run_policy is None
                    else "spec.runPolicy.schedulingPolicy.minAvailable",
                    "reason": f"{policy.scheduling_policy.min_available} is more than the job's {total} replicas; allowed: 0..{total}",
                }
            )
    return errors


def _dependency_cycle(specs: Mapping[str, ReplicaSpec]) -> list[str]:
    lower = {r.lower(): r for r in specs}
    edges = {
        r: [lower[d.upstream.lower()] for d in (s.depends_on or []) if d.upstream.lower() in lower]
        for r, s in specs.items()
    }
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for up in edges.get(node, []):
            if state.get(up) == 1:
                return [*path[path.index(up) :], up]
            if state.get(up) is None:
                found = visit(up)
                if found:
                    return found
        state[node] = 2
        path.pop()
        return []

    for r in specs:
        if state.get(r) is None:
            found = visit(r)
            if found:
                return found
    return []


def apply_defaults(job: TrainingJob) -> None:
    """Fill in what KubeDL/Kubeflow default at admission: replicas, restart policy, ports.

    gpuyard deliberately defaults `cleanPodPolicy` to `Running` for every kind (both projects
    default some kinds to `None`, which leaves pods running after the job ended).
    """
    flavor = job.info.flavor(job.api_version)
    for role, spec in job.replica_specs.items():
        if spec.replicas is None:
            spec.replicas = flavor.replicas.get(role, 1)
        if spec.restart_policy is None:
            spec.restart_policy = flavor.restart.get(role, flavor.restart.get("*", "Never"))
        if flavor.port.port is not None and (flavor.port_roles is None or role in flavor.port_roles):
            _default_port(spec, flavor.port)
    target = job.spec.run_policy if job.spec.run_policy is not None else job.spec
    if job.run_policy.clean_pod_policy is None:
        target.clean_pod_policy = "Running"
    if job.KIND == "PyTorchJob" and job.flavor == "kubeflow":
        _default_pytorch_kubeflow(job)  # type: ignore[arg-type]


def _default_port(spec: ReplicaSpec, port: PortDefault) -> None:
    containers = spec.template.spec.containers
    if not containers:
        return
    container = next((c for c in containers if c.name == port.container), containers[0])
    if any(p.name == port.name for p in container.ports):
        return
    container.ports.append(ContainerPort(name=port.name, container_port=port.port))


def _default_pytorch_kubeflow(job: PyTorchJob) -> None:
    """Kubeflow's `setElasticPolicy` and `setDefaultNprocPerNode`."""
    spec = job.spec
    ep = spec.elastic_policy
    if ep is not None:
        if ep.max_replicas is not None and ep.min_replicas is None:
            ep.min_replicas = ep.max_replicas
        elif ep.min_replicas is not None and ep.max_replicas is None:
            ep.max_replicas = ep.min_replicas
        elif ep.min_replicas is None and ep.max_replicas is None and "Worker" in spec.pytorch_replica_specs:
            workers = spec.pytorch_replica_specs["Worker"].count
            ep.min_replicas = ep.max_replicas = workers
    if (ep is None or ep.n_proc_per_node is None) and spec.nproc_per_node is None:
        spec.nproc_per_node = "auto"


def load_documents(text: str) -> list[Any]:
    """Decode a YAML or JSON body into documents: multi-document YAML, a JSON array, or a `List`.

    Raises :class:`JobValidationError` naming the line and column of a syntax error.
    """
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}" if mark is not None else "<unknown>"
        problem = getattr(exc, "problem", None) or str(exc)
        raise JobValidationError(
            f"not valid YAML or JSON: {problem} at {where}",
            [{"field": "<body>", "reason": f"{problem} at {where}"}],
        ) from None
    out: list[Any] = []
    for doc in docs:
        if isinstance(doc, list):
            out.extend(doc)
        elif isinstance(doc, Mapping) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            out.extend(doc["items"])
        else:
            out.append(doc)
    if not out:
        raise JobValidationError(
            "no job documents in the body",
            [{"field": "<body>", "reason": "empty: expected one or more job documents"}],
        )
    return out
