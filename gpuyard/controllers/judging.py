"""Judging a job's pods: does the job end now, and which replicas restart?

A pure function of the job, its plugin, its status and its replicas' current pods (no store, no
I/O), so every rule is testable with plain objects. In order:

1. `activeDeadlineSeconds` passed since `status.startTime` -> Failed (DeadlineExceeded);
2. a pod that failed and will not be restarted (restart-policy table, or a plugin's fatal role)
   -> Failed, naming how many replicas of which roles failed (KubeDL's message);
3. the plugin's success rule holds -> Succeeded;
4. the restarts needed would exceed `backoffLimit` -> Failed (BackoffLimitExceeded); a spot
   interruption (:func:`spot_interrupted`: a spot replica, or a pod on a spot node, that failed
   because its capacity went away) is restarted by the same table but never counted;
5. otherwise the job goes on, restarting the replicas the policy retries.

A failure outranks a success seen in the same pass, as in KubeDL, where the Failed condition is
set after the Succeeded one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from gpuyard.apis.core import Pod
from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.jobspecs import JobStatus
from gpuyard.apis.scheduling import Reservation
from gpuyard.controllers.restarting import Ending, ending_of, should_restart
from gpuyard.controllers.workloads.base import JobView, PodOutcome, WorkloadPlugin

__all__ = ["SPOT_INTERRUPTIONS", "Replica", "Verdict", "judge", "reason_of", "spot_interrupted", "uncounted"]

SPOT_INTERRUPTIONS = frozenset({"NodeLost", "Evicted", "Preempted", "Preempting", "Shutdown", "Terminated"})
"""Pod failure reasons that mean the capacity went away (the node lost or shut down, the pod
evicted or preempted), not that the workload failed."""


@dataclass(slots=True)
class Replica:
    """One replica of the job (role, index) with its current pod and reservation, if any."""

    role: str
    index: int
    name: str
    pod: Pod | None = None
    reservation: Reservation | None = None
    on_spot_node: bool = False  # the finished pod ran on a spot node (node.kubernetes.io/lifecycle)


@dataclass(slots=True)
class Verdict:
    terminal: tuple[str, str, str] | None = None  # (condition type, reason, message)
    restarts: list[tuple[Replica, Ending]] = field(default_factory=list)


def reason_of(job: TrainingJob, what: str) -> str:
    """KubeDL writes `JobRunning`; Kubeflow `<Kind>Running` (commonutil.NewReason)."""
    return f"{job.kind}{what}" if job.flavor == "kubeflow" else f"Job{what}"


def uncounted(status: JobStatus, rep: Replica) -> bool:
    """The replica's failed pod has not been counted as a restart yet (by its uid)."""
    record = status.pod_restarts.get(rep.name)
    return rep.pod is not None and (record is None or record.last_uid != rep.pod.metadata.uid)


def spot_interrupted(job: TrainingJob, rep: Replica, ending: Ending) -> bool:
    """The replica's pod failed because spot capacity went away: it is a spot replica (the last
    `spotReplicaNumber` of its role) or ran on a spot node, and it failed with a reason of
    :data:`SPOT_INTERRUPTIONS` or a `DisruptionTarget` condition (Kubernetes' preemption and
    eviction mark). Such a restart does not count against `backoffLimit`."""
    if ending.phase != "Failed" or rep.pod is None:
        return False
    if not (rep.on_spot_node or job.replica_specs[rep.role].is_spot(rep.index)):
        return False
    if ending.reason in SPOT_INTERRUPTIONS:
        return True
    return any(
        c.get("type") == "DisruptionTarget" and c.get("status") == "True" for c in rep.pod.status.conditions
    )


def judge(
    job: TrainingJob, plugin: WorkloadPlugin, status: JobStatus, replicas: list[Replica], now: datetime
) -> Verdict:
    policy = job.run_policy
    name = f"{job.kind} {job.metadata.name}"
    view = JobView(replicas={r: s.count for r, s in job.replica_specs.items()})
    restarts: list[tuple[Replica, Ending]] = []
    failed: dict[str, int] = {}
    fatal = plugin.fatal_roles(job)
    container = job.info.flavor(job.api_version).port.container
    for rep in replicas:
        if rep.pod is None:
            continue
        ending = ending_of(rep.pod, container=container)
        view.pods.setdefault(rep.role, {})[rep.index] = PodOutcome(ending.phase, ending.exit_code)
        if ending.phase not in ("Succeeded", "Failed"):
            continue
        restart_policy = job.replica_specs[rep.role].restart_policy or "Never"
        if not (rep.role in fatal and ending.phase == "Failed") and should_restart(restart_policy, ending):
            restarts.append((rep, ending))
        elif ending.phase == "Failed":
            failed[rep.role] = failed.get(rep.role, 0) + 1
    if status.start_time is not None and policy.active_deadline_seconds is not None:
        if (now - status.start_time).total_seconds() >= policy.active_deadline_seconds:
            return Verdict(("Failed", "DeadlineExceeded", "Job was active longer than specified deadline"))
    if failed:
        parts = ", ".join(f"{n} {role}" for role, n in failed.items())
        return Verdict(
            ("Failed", reason_of(job, "Failed"), f"{name} is failed because {parts} replica(s) failed.")
        )
    if plugin.succeeded(job, view):
        return Verdict(("Succeeded", reason_of(job, "Succeeded"), f"{name} successfully completed."))
    fresh = [rep for rep, end in restarts if uncounted(status, rep) and not spot_interrupted(job, rep, end)]
    # restarts count job failures: the pods failing in one pass are one failure
    if restarts and policy.backoff_limit is not None and status.restarts + bool(fresh) > policy.backoff_limit:
        return Verdict(("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"))
    return Verdict(None, restarts)
