"""The contract between the job operator and the scheduler: PodGroup and Reservation.

* The operator turns a job into a **PodGroup** (one per job, same namespace and name): per role
  the replicas, the minimum that must be placed together, and the pod template the scheduler
  reads requests, selectors, tolerations and host-network needs from.
* The scheduler places the gang and records the decision as one **Reservation** per pod (same
  namespace, named like the pod: `<job>-<role>-<index>`), all written in one synchronous step
  (the "assume"). Reservations are the ledger of what is allocated: a node's free capacity is its
  allocatable minus its reservations. They name the node, GPU indices and ids, GPU share, NICs
  and host ports.
* The operator creates each pod from its reservation (node bound, devices in env/annotations)
  when its start order allows, and deletes the reservation when the pod will not run again
  (finished, job ended, suspended, or the pod must move). A PodGroup whose replicas lack
  reservations is placed again (failover re-places just those pods).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from gpuyard.apis.core import PodSpec
from gpuyard.apis.meta import K8sModel, Resource
from gpuyard.apis.quantity import Quantity

__all__ = [
    "ANNOTATION_DEVICES",
    "ANNOTATION_EXPLAIN",
    "GROUP",
    "LABEL_JOB_NAME",
    "LABEL_REPLICA_INDEX",
    "LABEL_REPLICA_TYPE",
    "GangRole",
    "PodGroup",
    "PodGroupSpec",
    "PodGroupStatus",
    "Reservation",
    "ReservationSpec",
    "pod_name",
]

GROUP = "scheduling.gpuyard.io/v1alpha1"

# Labels every pod and reservation of a job carries (KubeDL's names).
LABEL_JOB_NAME = "job-name"
LABEL_REPLICA_TYPE = "replica-type"
LABEL_REPLICA_INDEX = "replica-index"
LABEL_GROUP_NAME = "group-name"
# The devices a pod was given, as JSON: {"gpus": [...], "gpuIds": [...], "nics": [...], ...}
ANNOTATION_DEVICES = "gpuyard.io/devices"
ANNOTATION_EXPLAIN = "gpuyard.io/why-pending"


def pod_name(job: str, role: str, index: int) -> str:
    """The name of replica `index` of `role` in `job` (and of its reservation and Service)."""
    return f"{job}-{role.lower()}-{index}"


class GangRole(K8sModel):
    """One role (replica type) of a gang."""

    name: str = Field(description="Replica type as written in the job, e.g. Worker, PS, Master.")
    replicas: int = Field(ge=0)
    min_available: int | None = Field(default=None, ge=0, description="Default: all replicas.")
    template: PodSpec = Field(default_factory=PodSpec)
    host_ports: int = Field(default=0, ge=0, description="Host ports each pod needs (host-network mode).")

    @property
    def minimum(self) -> int:
        return self.replicas if self.min_available is None else min(self.min_available, self.replicas)


class PodGroupSpec(K8sModel):
    roles: list[GangRole] = Field(default_factory=list)
    min_available: int | None = Field(
        default=None, ge=0, description="Job-wide minimum (KubeDL schedulingPolicy)."
    )
    queue: str = ""
    priority: int = 0
    priority_class_name: str | None = None
    gang_group: list[str] = Field(
        default_factory=list, description="Other jobs (ns/name) placed together with this one."
    )
    suspend: bool = False
    job_kind: str = ""
    preferred_nodes: dict[str, str] = Field(
        default_factory=dict,
        description="Pod name -> node it ran on, set by the operator when a pod must be re-placed "
        "(failover): the scheduler prefers that node, then its topology domain.",
    )

    def total_replicas(self) -> int:
        return sum(r.replicas for r in self.roles)

    def minimum(self) -> int:
        per_role = sum(r.minimum for r in self.roles)
        if self.min_available is None:
            return per_role
        return min(self.min_available, self.total_replicas())


class PodGroupStatus(K8sModel):
    phase: Literal["Pending", "Placed", "Suspended"] = "Pending"
    reason: str = ""
    message: str = ""
    placed: int = 0
    queued_at: datetime | None = None
    placed_at: datetime | None = None
    attempts: int = 0


class PodGroup(Resource):
    KIND = "PodGroup"
    API_VERSION = GROUP

    spec: PodGroupSpec = Field(default_factory=PodGroupSpec)
    status: PodGroupStatus = Field(default_factory=PodGroupStatus)


class ReservationSpec(K8sModel):
    pod_group: str
    role: str
    index: int = Field(ge=0)
    node: str
    gpus: list[int] = Field(default_factory=list, description="GPU indices on the node.")
    gpu_ids: list[str] = Field(default_factory=list, description="GPU UUIDs, in the order of `gpus`.")
    gpu_milli: int = Field(default=0, ge=0, description="Per GPU: 1000 for whole GPUs, less for a share.")
    gpu_memory_mib: int = Field(default=0, ge=0, description="Per GPU memory limit of a share (0: whole).")
    nics: list[str] = Field(default_factory=list)
    host_ports: list[int] = Field(default_factory=list)
    requests: dict[str, Quantity] = Field(default_factory=dict, description="The pod's whole request.")
    local_peers: list[str] = Field(default_factory=list, description="Pods of the same gang on this node.")


class Reservation(Resource):
    KIND = "Reservation"
    API_VERSION = GROUP

    spec: ReservationSpec
