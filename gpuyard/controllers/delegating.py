"""Delegate mode: the objects a gang scheduler (Volcano, scheduler-plugins, Koordinator) expects.

By default gpuyard places every pod itself: the operator creates pods already bound to the node
of their Reservation with `schedulerName: gpuyard` (`scheduler.name`). With `scheduler.mode:
delegate` (KubeDL's `--gang-scheduler-name`), placement is left to another gang scheduler, as
KubeDL does: the operator still waits for gpuyard's queue and quota to admit the job (the
PodGroup turns Placed), then creates the pods *unbound*, without gpuyard's device choice, named
for the gang scheduler (`schedulerName`, its pod-group label or annotations), beside the PodGroup
object that scheduler reads:

* ``volcano``: `scheduling.volcano.sh/v1beta1` PodGroup (`minMember`, `minTaskMember` per role,
  `queue`, `priorityClassName`, `minResources`); pods annotated `scheduling.k8s.io/group-name`
  and `volcano.sh/task-spec`; schedulerName `volcano`.
* ``coscheduling`` (scheduler-plugins): `scheduling.x-k8s.io/v1alpha1` PodGroup (`minMember`,
  `minResources`, `scheduleTimeoutSeconds`); pods labelled `scheduling.x-k8s.io/pod-group`;
  schedulerName `scheduler-plugins-scheduler`.
* ``koordinator``: the `scheduling.sigs.k8s.io/v1alpha1` PodGroup Koordinator reads (`minMember`,
  `scheduleTimeoutSeconds`), pods labelled `pod-group.scheduling.sigs.k8s.io` and annotated
  `gang.scheduling.koordinator.sh/{name,min-available,total-number,mode,waiting-time}`;
  schedulerName `koord-scheduler`.

The pods of a delegated job are created together, without the job's start order (PS before
workers, ...): the gang scheduler places a group only once its minimum of pods exists, so
holding some back would deadlock it (KubeDL likewise).

The gang scheduler's PodGroup is an `apis/gangs.py` GangPodGroup (a `PodGroup` on the wire):
`planning.py` decides when it exists (from the pass that creates the first pods until the job
finishes or is suspended) and `applying.py` writes it before the pods that name it.

Pure functions of the job and its gang (the gpuyard PodGroup spec the operator builds anyway).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from gpuyard.apis.core import Pod
from gpuyard.apis.gangs import (
    GANG_API_VERSIONS,
    GANG_SCHEDULERS,
    GangPodGroup,
    GangPodGroupSpec,
)
from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.quantity import format_quantity
from gpuyard.apis.scheduling import PodGroupSpec
from gpuyard.state.config import SchedulerConfig

__all__ = [
    "ANNOTATION_KOORD_GANG",
    "ANNOTATION_VOLCANO_GROUP",
    "ANNOTATION_VOLCANO_TASK",
    "GANG_SCHEDULERS",
    "LABEL_COSCHEDULING_GROUP",
    "LABEL_KOORD_GROUP",
    "PodScheduling",
    "gang_pod_group",
    "mark_pod",
]

ANNOTATION_VOLCANO_GROUP = "scheduling.k8s.io/group-name"
ANNOTATION_VOLCANO_TASK = "volcano.sh/task-spec"
LABEL_COSCHEDULING_GROUP = "scheduling.x-k8s.io/pod-group"
LABEL_KOORD_GROUP = "pod-group.scheduling.sigs.k8s.io"
ANNOTATION_KOORD_GANG = "gang.scheduling.koordinator.sh/"
DEFAULT_SCHEDULE_TIMEOUT = 300  # seconds a partly placed gang waits (scheduler-plugins' default is 60)


@dataclass(frozen=True, slots=True)
class PodScheduling:
    """Who places the operator's pods: gpuyard (bound pods) or a gang scheduler (delegate mode)."""

    scheduler_name: str = "gpuyard"
    gang_scheduler: str | None = None  # set: delegate mode

    @property
    def delegated(self) -> bool:
        return self.gang_scheduler is not None

    @classmethod
    def from_settings(cls, settings: SchedulerConfig) -> PodScheduling:
        gang = settings.gang_scheduler if settings.mode == "delegate" else None
        return cls(scheduler_name=settings.pod_scheduler_name, gang_scheduler=gang)


def _minimum(job: TrainingJob) -> tuple[int, int]:
    """The job's gang minimum (schedulingPolicy.minAvailable, else every replica) and its total."""
    total = sum(spec.count for spec in job.replica_specs.values())
    policy = job.run_policy.scheduling_policy
    minimum = policy.min_available if policy is not None and policy.min_available is not None else total
    return min(minimum, total), total


def mark_pod(pod: Pod, *, job: TrainingJob, role: str, scheduling: PodScheduling) -> None:
    """Hand an (unbound) pod of `job` to the gang scheduler: its schedulerName and group markers."""
    pod.spec.scheduler_name = scheduling.scheduler_name
    gang = scheduling.gang_scheduler
    if gang is None:
        return
    group = job.metadata.name
    meta = pod.metadata
    if gang == "volcano":
        meta.annotations[ANNOTATION_VOLCANO_GROUP] = group
        meta.annotations[ANNOTATION_VOLCANO_TASK] = role.lower()
    elif gang == "coscheduling":
        meta.labels[LABEL_COSCHEDULING_GROUP] = group
    else:
        minimum, total = _minimum(job)
        meta.labels[LABEL_KOORD_GROUP] = group
        meta.annotations |= {
            f"{ANNOTATION_KOORD_GANG}name": group,
            f"{ANNOTATION_KOORD_GANG}min-available": str(minimum),
            f"{ANNOTATION_KOORD_GANG}total-number": str(total),
            f"{ANNOTATION_KOORD_GANG}mode": "Strict",
            f"{ANNOTATION_KOORD_GANG}waiting-time": f"{_timeout(job)}s",
        }


def _timeout(job: TrainingJob) -> int:
    policy = job.run_policy.scheduling_policy
    if policy is not None and policy.schedule_timeout_seconds is not None:
        return policy.schedule_timeout_seconds
    return DEFAULT_SCHEDULE_TIMEOUT


def _min_resources(spec: PodGroupSpec) -> dict[str, str]:
    """The requests of the gang's minimum: each role's per-pod request times its minimum."""
    total: dict[str, Decimal] = {}
    for role in spec.roles:
        for name, q in role.template.requests().items():
            total[name] = total.get(name, Decimal(0)) + q * role.minimum
    return {name: format_quantity(q) for name, q in sorted(total.items())}


def gang_pod_group(job: TrainingJob, spec: PodGroupSpec, *, scheduling: PodScheduling) -> GangPodGroup:
    """The gang scheduler's PodGroup for `job` (same namespace and name, owned by the job).

    `spec` is the gpuyard PodGroup spec of the job (`podgroups.pod_group_spec`): its roles give the
    per-role minimum and the rendered pod templates the minimum resources are summed from.
    ValueError when `scheduling` is not delegate mode.
    """
    gang = scheduling.gang_scheduler
    if gang is None:
        raise ValueError(
            f"scheduler.mode: not delegate; allowed gang schedulers: {', '.join(GANG_SCHEDULERS)}"
        )
    minimum, _ = _minimum(job)
    body = GangPodGroupSpec(min_member=minimum)
    if gang == "volcano":
        body.min_task_member = {r.name.lower(): r.minimum for r in spec.roles}
        policy = job.run_policy.scheduling_policy  # only a queue the job names: Volcano refuses
        body.queue = (policy.queue if policy is not None else None) or None  # a group in an unknown one
        body.priority_class_name = spec.priority_class_name or None
        body.min_resources = _min_resources(spec)
    elif gang == "coscheduling":
        body.min_resources = _min_resources(spec)
        body.schedule_timeout_seconds = _timeout(job)
    else:
        body.schedule_timeout_seconds = _timeout(job)
    return GangPodGroup.model_validate(
        {
            "apiVersion": GANG_API_VERSIONS[gang],
            "kind": GangPodGroup.KIND,
            "metadata": {
                "name": job.metadata.name,
                "namespace": job.metadata.namespace or "default",
                "labels": {"app.kubernetes.io/managed-by": "gpuyard"},
                "ownerReferences": [
                    {
                        "apiVersion": job.api_version,
                        "kind": job.kind,
                        "name": job.metadata.name,
                        "uid": job.metadata.uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": body,
        }
    )
