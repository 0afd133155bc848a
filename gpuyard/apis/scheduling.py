"""The contract between the job operator and the scheduler: PodGroup and Reservation.

Each object and field has one writer (the table is in `docs/architecture.md`); requests between
the two are fields the other side reads, never writes or deletions of the other's objects.

* The operator creates, updates and deletes the **PodGroup** (one per job, same namespace and
  name) and owns its `spec`: per role the replicas, the minimum placed together, the pod template
  the scheduler reads requests, selectors, tolerations and host-network needs from, and
  `spec.release`: pod name -> uid of the Reservation the operator no longer needs (the pod
  finished for good, must move on failover, was stopped after an eviction, or the job is
  suspended). The scheduler deletes exactly that Reservation and, if the replica is still wanted,
  places it again (`spec.preferredNodes` says where it ran).
* The scheduler alone writes the PodGroup's **status** (phase, reason, message, placed, times,
  attempts, `evictions`; phase `Failed`, reason `ScheduleTimeout`, when the gang was not placed
  within `spec.scheduleTimeoutSeconds`: the operator then fails the job) and creates and deletes **Reservations**: one per placed pod (same
  namespace, named like the pod: `<job>-<role>-<index>`), the ledger of what is allocated (a
  node's free capacity is its allocatable minus its reservations). `status.evictions` (pod name ->
  why) asks the operator to stop those pods (priority preemption, quota reclaim, migration); the
  Reservations keep holding their devices until the operator releases them through
  `spec.release`, so a GPU is never handed out while a pod still runs on it. A PodGroup that is
  deleted loses its Reservations (the scheduler collects them).
* The operator creates each pod from its Reservation (node bound, devices in env/annotations)
  when its start order allows, once the PodGroup's status says `Placed`.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from gpuyard.apis.core import Pod, PodSpec
from gpuyard.apis.meta import K8sModel, Resource
from gpuyard.apis.quantity import Quantity

__all__ = [
    "ANNOTATION_DEVICES",
    "ANNOTATION_EXPLAIN",
    "GROUP",
    "LABEL_JOB_NAME",
    "LABEL_MIGRATING_POD",
    "LABEL_REPLICA_INDEX",
    "LABEL_REPLICA_TYPE",
    "GangRole",
    "PodGroup",
    "PodGroupSpec",
    "PodGroupStatus",
    "Reservation",
    "ReservationSpec",
    "pod_devices",
    "pod_gpus",
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
# On a Reservation `<pod>.next`: the new place of a pod the rescheduler moves (reserved before the
# pod is evicted); the operator ignores it, the scheduler renames it to `<pod>` once the old is gone.
LABEL_MIGRATING_POD = "gpuyard.io/migrating-pod"


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
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="The labels every pod of the role carries (the replica index apart): what "
        "inter-pod affinity and topology spread selectors are matched against.",
    )
    spot_replicas: int = Field(
        default=0,
        ge=0,
        description="How many of the role's last replicas are spot replicas (KubeDL's spotReplicaSpec): "
        "the scheduler prefers spot nodes (node.kubernetes.io/lifecycle: spot) for them.",
    )

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
    release: dict[str, str] = Field(
        default_factory=dict,
        description="Pod name -> uid of the Reservation the operator no longer needs; the scheduler "
        "deletes exactly that Reservation (and places the pod again if its replica is still wanted).",
    )
    schedule_timeout_seconds: int | None = Field(
        default=None,
        ge=0,
        description="Coscheduling's scheduleTimeoutSeconds: a gang not placed within this many seconds "
        "of being queued (or resumed) is failed (status phase Failed, reason ScheduleTimeout).",
    )
    min_resources: dict[str, Quantity] | None = Field(
        default=None,
        description="Volcano's minResources: the gang is not tried until the free capacity of the "
        "cluster covers these totals (it stays Pending, reason MinResources).",
    )

    def total_replicas(self) -> int:
        return sum(r.replicas for r in self.roles)

    def minimum(self) -> int:
        per_role = sum(r.minimum for r in self.roles)
        if self.min_available is None:
            return per_role
        return min(self.min_available, self.total_replicas())


class PodGroupStatus(K8sModel):
    phase: Literal["Pending", "Placed", "Suspended", "Failed"] = "Pending"
    reason: str = ""
    message: str = ""
    placed: int = 0
    queued_at: datetime | None = None
    placed_at: datetime | None = None
    attempts: int = 0
    evictions: dict[str, str] = Field(
        default_factory=dict,
        description="Pod name -> why the scheduler wants it stopped (preemption, reclaim, migration); "
        "the operator stops the pod, then releases its Reservation through spec.release.",
    )


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


def pod_devices(pod: Pod) -> dict[str, Any]:
    """The pod's `gpuyard.io/devices` annotation as a mapping ({} when it is absent or malformed)."""
    try:
        devices = json.loads(pod.metadata.annotations.get(ANNOTATION_DEVICES, "{}"))
    except ValueError:
        return {}
    return devices if isinstance(devices, dict) else {}


def pod_gpus(pod: Pod) -> list[int]:
    """The GPU indices the pod was given (its `gpuyard.io/devices` annotation)."""
    return [g for g in pod_devices(pod).get("gpus", []) if isinstance(g, int)]
