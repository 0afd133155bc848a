"""A job's status as one reconcile pass drafts it: conditions, phase, replica statuses, events.

Pure (no store, no I/O), used by `planning.py`. A :class:`Report` holds the pass's draft of the
job's status and what the draft says happened: the Events to record and the phase transitions
(which the apply step turns into metrics and the one canonical `job.transition` log line).
:func:`progress` moves a job that is not restarting to Queuing or Running (an elastic job
whose replicas above its minimum were preempted runs on its minimum; a job whose every pod was
preempted is Queuing with reason `Preempted` until it runs again), :func:`replica_statuses`
counts active/succeeded/failed pods and restarts per role, :func:`deadline_after` says when
`activeDeadlineSeconds` runs out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from gpuyard.apis.core import Pod
from gpuyard.apis.jobkinds import PyTorchJob, TrainingJob
from gpuyard.apis.jobspecs import JobStatus, ReplicaStatus
from gpuyard.apis.meta import deep_copy
from gpuyard.apis.scheduling import PodGroup
from gpuyard.controllers.judging import Replica, reason_of
from gpuyard.controllers.podgroups import ANNOTATION_ELASTIC
from gpuyard.controllers.statuses import set_condition

KUBEFLOW_JOB_NAME = "training.kubeflow.org/job-name"
KUBEFLOW_REPLICA_TYPE = "training.kubeflow.org/replica-type"

__all__ = [
    "EVICTION_REASONS",
    "PREEMPTED",
    "EventNote",
    "Launch",
    "Report",
    "Transition",
    "deadline_after",
    "evicted",
    "progress",
    "replica_statuses",
    "status_changes",
]


PREEMPTED = "Preempted"
"""The Queuing reason of a job whose pods were all preempted, until it runs again."""


@dataclass(frozen=True, slots=True)
class EventNote:
    """An Event to record about the job."""

    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True, slots=True)
class Transition:
    """The job's phase moved from `was` to `phase` (for the metrics and the log line)."""

    was: str
    phase: str
    reason: str


@dataclass(frozen=True, slots=True)
class Launch:
    """Some pod of the job runs (`all_pods`: every replica is up): the launch-delay metrics."""

    all_pods: bool


@dataclass(slots=True)
class Report:
    """The draft of `job`'s status in one pass, and the events and transitions it implies."""

    job: TrainingJob
    now: datetime
    status: JobStatus = field(init=False)
    events: list[EventNote] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    created: bool = False  # the Created condition was set in this pass (the created-jobs metric)

    def __post_init__(self) -> None:
        self.status = deep_copy(self.job.status)

    @property
    def name(self) -> str:
        return f"{self.job.kind} {self.job.metadata.name}"

    def reason(self, what: str) -> str:
        return reason_of(self.job, what)

    def note(self, reason: str, message: str, *, warning: bool = False) -> None:
        self.events.append(EventNote(reason, message, warning))

    def set(
        self,
        type_: str,
        *,
        reason: str,
        message: str,
        true: bool = True,
        warning: bool = False,
        event: bool = True,
        force_event: bool = False,
    ) -> None:
        """Set a condition (Kubeflow semantics) with its Event; note a phase transition."""
        status = self.status
        before = status.phase
        changed = set_condition(status, type_, reason=reason, message=message, now=self.now, true=true)
        if (changed and event) or force_event:
            self.note(reason, message, warning=warning)
        if changed and type_ == "Created":
            self.created = True
        if status.phase != before:
            self.transitions.append(Transition(before, status.phase, reason))

    def restarting(self, message: str) -> None:
        """Enter Restarting with a Warning event every time (each restart is news)."""
        self.set(
            "Restarting", reason=self.reason("Restarting"), message=message, warning=True, force_event=True
        )


def progress(
    report: Report,
    *,
    replicas: list[Replica],
    live: Mapping[str, Pod],
    pod_group: PodGroup | None,
    restarting: bool,
) -> Launch | None:
    """Move a job that is not restarting to Running or Queuing; say whether its pods run."""
    status = report.status
    if live and status.start_time is None:
        status.start_time = report.now
    if restarting:
        return None
    running = any(p.status.phase == "Running" for p in live.values())
    all_up = all(
        (p := live.get(r.name)) is not None and p.status.phase in ("Running", "Succeeded") for r in replicas
    )
    name = report.name
    if status.phase == "Restarting":
        if all_up:
            report.set("Running", reason=report.reason("Running"), message=f"{name} is running.")
        elif _elastic_minimum_up(pod_group, replicas=replicas, live=live):
            up = sum(1 for p in live.values() if p.status.phase == "Running")
            report.set(
                "Running",
                reason=report.reason("Running"),
                message=f"{name} is running on {up} of {len(replicas)} replicas (its elastic minimum is up).",
            )
    elif running:
        report.set("Running", reason=report.reason("Running"), message=f"{name} is running.")
    elif not live and status.phase in ("", "Created", "Queuing"):
        why = ""
        # a PodGroup still Suspended is the scheduler's word from before the job was resumed
        if pod_group is not None and pod_group.status.phase != "Suspended":
            why = pod_group.status.message or pod_group.status.reason
        queuing = status.condition("Queuing")
        if queuing is not None and queuing.status == "True" and queuing.reason == PREEMPTED:
            # preempted and waiting to run again: the preemption stays its reason until it runs
            message = f"{name} is queuing again after a preemption" + (f": {why}" if why else ".")
            report.set("Queuing", reason=PREEMPTED, message=message, event=False)
        else:
            message = f"{name} is queuing" + (f": {why}" if why else ".")
            report.set(
                "Queuing", reason=report.reason("Queuing"), message=message, event=status.phase != "Queuing"
            )
    return Launch(all_pods=all_up) if running or all_up else None


def _elastic_minimum_up(
    pod_group: PodGroup | None, *, replicas: list[Replica], live: Mapping[str, Pod]
) -> bool:
    """An elastic job (replicas above its minimum were preempted) runs with every role at least
    at its minimum: it is Running, not Restarting, while the rest wait for room."""
    if pod_group is None or pod_group.metadata.annotations.get(ANNOTATION_ELASTIC) != "true":
        return False
    up: dict[str, int] = {}
    for rep in replicas:
        pod = live.get(rep.name)
        if pod is not None and pod.status.phase == "Running":
            up[rep.role] = up.get(rep.role, 0) + 1
    return bool(up) and all(up.get(role.name, 0) >= role.minimum for role in pod_group.spec.roles)


def replica_statuses(
    job: TrainingJob, status: JobStatus, *, replicas: list[Replica], live: Mapping[str, Pod] | None = None
) -> None:
    """Per role: running, succeeded and failed pods (of `live`, else each replica's pod), the failed
    ones evicted or preempted (:func:`evicted`), and restarts."""
    out: dict[str, ReplicaStatus] = {role: ReplicaStatus() for role in job.roles()}
    for rep in replicas:
        rs = out[rep.role]
        record = status.pod_restarts.get(rep.name)
        rs.restarts += record.count if record is not None else 0
        pod = rep.pod if live is None else live.get(rep.name)
        if pod is None:
            continue
        phase = pod.status.phase
        if phase == "Running":
            rs.active += 1
        elif phase == "Succeeded":
            rs.succeeded += 1
        elif phase == "Failed":
            rs.failed += 1
            if evicted(pod):
                rs.evicted += 1
    if isinstance(job, PyTorchJob) and job.spec.elastic_policy and job.spec.elastic_policy.metrics:
        if (workers := out.get("Worker")) is not None:  # the `scale` subresource's selector (HPA)
            workers.selector = f"{KUBEFLOW_JOB_NAME}={job.metadata.name},{KUBEFLOW_REPLICA_TYPE}=worker"
    status.replica_statuses = out


EVICTION_REASONS = frozenset({"Evicted", "Preempted"})


def evicted(pod: Pod) -> bool:
    """A Failed pod that was evicted or preempted, as KubeDL's `eviction.PodIsEvicted` (reason
    `Evicted`) plus reason `Preempted` and Kubernetes' `DisruptionTarget` condition (set by the
    scheduler's preemption, the eviction API, the taint manager and the kubelet)."""
    if pod.status.phase != "Failed":
        return False
    if pod.status.reason in EVICTION_REASONS:
        return True
    return any(
        c.get("type") == "DisruptionTarget" and c.get("status") == "True" for c in pod.status.conditions
    )


def status_changes(old: JobStatus, new: JobStatus, *, now: datetime) -> dict[str, object]:
    """The status fields to write (with `lastReconcileTime`), or {} when nothing else changed."""
    changes: dict[str, object] = {
        name: getattr(new, name)
        for name in type(new).model_fields
        if name != "last_reconcile_time" and getattr(new, name) != getattr(old, name)
    }
    if changes:
        changes["last_reconcile_time"] = now
    return changes


def deadline_after(job: TrainingJob, status: JobStatus, *, now: datetime) -> float | None:
    """Seconds until `activeDeadlineSeconds` runs out (None: no deadline, or not started)."""
    deadline = job.run_policy.active_deadline_seconds
    if deadline is None or status.start_time is None:
        return None
    remaining = status.start_time.timestamp() + deadline - now.timestamp()
    return max(0.0, remaining) + 0.001
