"""Spec and status models of the training job kinds (KubeDL and Kubeflow field names).

The parts every kind shares: replica specs (`*ReplicaSpecs` values), the run and scheduling
policies (KubeDL inlines them, Kubeflow nests `runPolicy`), each kind's `spec` model and the
`status` the operator writes. The kinds themselves and their per-project facts are in
:mod:`gpuyard.apis.jobkinds`; parsing and validation of a submitted document in
:mod:`gpuyard.apis.jobs`, which re-exports everything here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator

from gpuyard.apis.core import PodTemplateSpec
from gpuyard.apis.meta import K8sModel
from gpuyard.apis.quantity import Quantity

__all__ = [
    "MAX_REPLICAS",
    "CleanPodPolicy",
    "DAGCondition",
    "ElasticDLJobSpec",
    "ElasticPolicy",
    "JAXJobSpec",
    "JobCondition",
    "JobConditionType",
    "JobSpec",
    "JobStatus",
    "MPIJobSpec",
    "MarsJobSpec",
    "MarsWorkerMemoryTuningPolicy",
    "PaddleJobSpec",
    "PodRestart",
    "PyTorchJobSpec",
    "RDZVConf",
    "ReplicaSpec",
    "ReplicaStatus",
    "RestartPolicy",
    "RunPolicy",
    "SchedulingPolicy",
    "SpotReplicaSpec",
    "SuccessPolicy",
    "TFJobSpec",
    "XDLJobSpec",
    "XGBoostJobSpec",
]

MAX_REPLICAS = 10_000
"""The most replicas one replica type (role) of a job may ask for."""
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
"""The range of Kubernetes' int32 fields (priority, backoffLimit, ttlSecondsAfterFinished, ...)."""

RestartPolicy = Literal["Always", "OnFailure", "Never", "ExitCode"]
CleanPodPolicy = Literal["All", "Running", "None"]
SuccessPolicy = Literal["", "AllWorkers"]
JobConditionType = Literal["Created", "Queuing", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]


# --- spec ------------------------------------------------------------------------------------


class DAGCondition(K8sModel):
    """Start this replica type only when every pod of `upstream` has reached `onPhase`."""

    upstream: str
    on_phase: Literal["Running", "Succeeded"] = "Running"


class SpotReplicaSpec(K8sModel):
    """KubeDL's spot replicas: the last `spotReplicaNumber` replicas of the role run with this
    `priorityClassName` (replacing the template's) and these extra pod labels. The scheduler
    prefers spot nodes (`node.kubernetes.io/lifecycle: spot`) for them, and their interruption
    (preemption, eviction, a lost node) does not count against the job's `backoffLimit`."""

    spot_replica_number: int = Field(default=0, ge=0, le=INT32_MAX)
    priority_class_name: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class ReplicaSpec(K8sModel):
    """One replica type (role) of a job: how many pods, their template, how they restart."""

    replicas: int | None = None
    min_available: int | None = Field(
        default=None,
        ge=0,
        description="gpuyard extension (Volcano's task minAvailable, Koordinator's per-role minMember): "
        "how many of this role's pods must be placed together for the gang to start; the rest are "
        "placed when room appears. Default: all replicas (elastic PyTorch workers: minReplicas).",
    )
    template: PodTemplateSpec = Field(default_factory=PodTemplateSpec)
    restart_policy: RestartPolicy | None = None
    depends_on: list[DAGCondition] | None = Field(
        default=None,
        validation_alias=AliasChoices("dependsOn", "dependOn", "depends_on"),
        serialization_alias="dependsOn",
    )
    spot_replica_spec: SpotReplicaSpec | None = Field(
        default=None,
        description="KubeDL: the last spotReplicaNumber replicas get a spot priority class and labels.",
    )

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, value: int | None) -> int | None:
        if value is not None and value < 0:
            raise ValueError(f"must be a non-negative integer (0, 1, 2, ...); got {value}")
        if value is not None and value > MAX_REPLICAS:
            raise ValueError(f"{value} is out of range; allowed: 0..{MAX_REPLICAS}")
        return value

    @model_validator(mode="after")
    def _minimum_within_replicas(self) -> ReplicaSpec:
        if self.min_available is not None and self.min_available > self.count:
            raise ValueError(
                f"minAvailable ({self.min_available}) must not exceed replicas ({self.count}); "
                f"allowed: 0..{self.count}"
            )
        return self

    @property
    def count(self) -> int:
        return self.replicas if self.replicas is not None else 1

    @property
    def spot_replicas(self) -> int:
        """How many of the role's last replicas are spot replicas (0 without a spotReplicaSpec)."""
        spot = self.spot_replica_spec
        return min(spot.spot_replica_number, self.count) if spot is not None else 0

    def is_spot(self, index: int) -> bool:
        """Replica `index` is one of the last `spotReplicaNumber` (KubeDL's rule)."""
        return index >= self.count - self.spot_replicas


class SchedulingPolicy(K8sModel):
    """Gang/queue settings; KubeDL's and Kubeflow's fields are both accepted."""

    min_available: int | None = Field(default=None, ge=0, le=INT32_MAX)
    queue: str | None = None
    priority: int | None = Field(
        default=None, ge=INT32_MIN, le=INT32_MAX, description="int32, as Kubernetes'."
    )
    priority_class_name: str | None = None
    priority_class: str | None = Field(default=None, description="Kubeflow's spelling of priorityClassName.")
    min_resources: dict[str, Quantity] | None = None
    schedule_timeout_seconds: int | None = Field(default=None, ge=0, le=INT32_MAX)


class RunPolicy(K8sModel):
    clean_pod_policy: CleanPodPolicy | None = None
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0, le=INT32_MAX)
    active_deadline_seconds: int | None = Field(default=None, ge=0)  # int64
    backoff_limit: int | None = Field(default=None, ge=0, le=INT32_MAX)
    scheduling_policy: SchedulingPolicy | None = None
    suspend: bool | None = None
    managed_by: str | None = Field(
        default=None,
        max_length=63,
        description="The controller that reconciles the job (training-operator v1.9): absent or "
        "kubeflow.org/training-operator is gpuyard; kueue.x-k8s.io/multikueue leaves it to Kueue. Immutable.",
        json_schema_extra={
            "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "managedBy is immutable"}]
        },
    )


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

    min_replicas: int | None = Field(default=None, ge=0, le=MAX_REPLICAS)
    max_replicas: int | None = Field(default=None, ge=0, le=MAX_REPLICAS)
    rdzv_backend: str | None = None
    rdzv_port: int | None = Field(default=None, ge=1, le=65535)
    rdzv_host: str | None = None
    rdzv_id: str | None = None
    rdzv_conf: list[RDZVConf] | None = None
    standalone: bool | None = None
    n_proc_per_node: int | None = Field(default=None, ge=1)
    max_restarts: int | None = Field(default=None, ge=0)
    metrics: list[dict[str, Any]] | None = Field(
        default=None,
        description="autoscaling/v2 MetricSpecs: a HorizontalPodAutoscaler scales the Worker replicas "
        "between minReplicas and maxReplicas on them (training-operator's hpa.go).",
    )


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


class XDLJobSpec(JobSpec):
    """KubeDL's XDLJob: PS, Scheduler, Worker and ExtendRole replicas; the job succeeds once enough
    workers (Worker and ExtendRole) have (`minFinishWorkRate` percent, else `minFinishWorkNum`)."""

    xdl_replica_specs: dict[str, ReplicaSpec] = Field(default_factory=dict)
    min_finish_work_num: int | None = Field(
        default=None, ge=0, le=INT32_MAX, description="KubeDL: workers that must succeed (default: all)."
    )
    min_finish_work_rate: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description="KubeDL: the percentage of workers that must succeed; wins over minFinishWorkNum "
        "(default 90 when neither is set).",
    )


class ElasticDLJobSpec(JobSpec):
    """KubeDL's ElasticDLJob: one Master, which starts and scales the workers itself."""

    elasticdl_replica_specs: dict[str, ReplicaSpec] = Field(default_factory=dict)
    git_sync_config: dict[str, Any] | None = Field(
        default=None,
        description="KubeDL: git-sync options (gpuyard reads them from the kubedl.io/git-sync-config annotation).",
    )


# --- status ----------------------------------------------------------------------------------


class JobCondition(K8sModel):
    type: JobConditionType
    status: Literal["True", "False", "Unknown"] = "True"
    reason: str = ""
    message: str = ""
    last_update_time: datetime | None = None
    last_transition_time: datetime | None = None


class ReplicaStatus(K8sModel):
    """Pods of one replica type now: running (`active`), succeeded, failed; plus restarts and
    evictions so far."""

    active: int = 0
    succeeded: int = 0
    failed: int = 0
    restarts: int = 0
    evicted: int = Field(
        default=0,
        description="KubeDL: pods of this replica type evicted or preempted (a Failed pod whose reason "
        "is Evicted or Preempted, or that carries a DisruptionTarget condition), counted once each.",
    )
    selector: str | None = Field(
        default=None,
        description="The role's pods as a label selector (training-operator's; the `scale` subresource's "
        "labelSelectorPath): set on the Worker of a PyTorchJob with elasticPolicy.metrics.",
    )


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
    model_version_name: str | None = Field(
        default=None, description="KubeDL: the ModelVersion the job's success created (spec.modelVersion)."
    )
    cache_backend_name: str | None = Field(
        default=None, description="KubeDL: the dataset cache the job's pods mount (spec.cacheBackend)."
    )

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
