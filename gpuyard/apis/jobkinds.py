"""The training job kinds and what the API knows about each: KubeDL and Kubeflow.

One store kind per `kind` (TFJob exists in both API groups; the object's `apiVersion` says which
project's conventions apply). :class:`TrainingJob` is the base of every kind; :data:`KIND_INFO`
declares each kind's model, replica field, role order and per-project flavor (allowed roles,
default restart policy, replicas and port). Spec and status models are in
:mod:`gpuyard.apis.jobspecs`; parsing and validation in :mod:`gpuyard.apis.jobs`, which
re-exports everything here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import Field

from gpuyard.apis.jobspecs import (
    ElasticDLJobSpec,
    JAXJobSpec,
    JobSpec,
    JobStatus,
    MarsJobSpec,
    MPIJobSpec,
    PaddleJobSpec,
    PyTorchJobSpec,
    ReplicaSpec,
    RestartPolicy,
    RunPolicy,
    TFJobSpec,
    XDLJobSpec,
    XGBoostJobSpec,
)
from gpuyard.apis.meta import Resource

__all__ = [
    "ANNOTATION_GANG_GROUP",
    "ANNOTATION_GIT_SYNC",
    "ANNOTATION_NETWORK_MODE",
    "API_KUBEDL",
    "API_KUBEFLOW",
    "JOB_KINDS",
    "KIND_INFO",
    "ElasticDLJob",
    "Flavor",
    "JAXJob",
    "JobKindInfo",
    "MPIJob",
    "MarsJob",
    "PaddleJob",
    "PortDefault",
    "PyTorchJob",
    "TFJob",
    "TrainingJob",
    "XDLJob",
    "XGBoostJob",
    "find_job",
    "job_classes",
]

API_KUBEDL = "training.kubedl.io/v1alpha1"
API_KUBEFLOW = "kubeflow.org/v1"

ANNOTATION_NETWORK_MODE = "kubedl.io/network-mode"  # value "host": host-network mode
ANNOTATION_GIT_SYNC = "kubedl.io/git-sync-config"  # JSON: git-sync init container options
ANNOTATION_GANG_GROUP = "gpuyard.io/gang-group"  # comma-separated ns/name of jobs placed together


# --- the kinds ---------------------------------------------------------------------------------


class TrainingJob(Resource):
    """Base of every job kind; `replica_specs` is the kind's `*ReplicaSpecs` map."""

    REPLICA_FIELD: ClassVar[str] = ""

    spec: JobSpec = Field(default_factory=JobSpec)
    status: JobStatus = Field(default_factory=JobStatus)

    @property
    def replica_specs(self) -> dict[str, ReplicaSpec]:
        specs: dict[str, ReplicaSpec] = getattr(self.spec, self.REPLICA_FIELD)
        return specs

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


class XDLJob(TrainingJob):
    KIND = "XDLJob"
    API_VERSION = API_KUBEDL
    REPLICA_FIELD = "xdl_replica_specs"
    spec: XDLJobSpec = Field(default_factory=XDLJobSpec)


class ElasticDLJob(TrainingJob):
    KIND = "ElasticDLJob"
    API_VERSION = API_KUBEDL
    REPLICA_FIELD = "elasticdl_replica_specs"
    spec: ElasticDLJobSpec = Field(default_factory=ElasticDLJobSpec)


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
    "XDLJob": JobKindInfo(  # KubeDL xdljob_constants.go; reconcile order PS, Scheduler, Worker, ExtendRole
        XDLJob,
        "xdlReplicaSpecs",
        ("PS", "Scheduler", "Worker", "ExtendRole"),
        {
            API_KUBEDL: Flavor(
                ("PS", "Scheduler", "Worker", "ExtendRole"),
                {"*": "Never"},
                PortDefault("xdl", "xdljob-port", 2222),
            )
        },
    ),
    "ElasticDLJob": JobKindInfo(  # KubeDL elasticdljob_constant.go: the Master starts its own workers
        ElasticDLJob,
        "elasticdlReplicaSpecs",
        ("Master",),
        {API_KUBEDL: Flavor(("Master",), {"*": "Never"}, PortDefault("elasticdl", "elasticdl-port", 11111))},
    ),
}

JOB_KINDS: list[type[Resource]] = [info.cls for info in KIND_INFO.values()]


def job_classes() -> list[type[TrainingJob]]:
    return [info.cls for info in KIND_INFO.values()]


def find_job(store: Any, namespace: str, name: str) -> TrainingJob | None:
    """The job named `name` in `namespace`, whatever its kind (names are unique per namespace)."""
    for kind in KIND_INFO:
        obj: TrainingJob | None = store.get(kind, namespace, name)
        if obj is not None:
            return obj
    return None
