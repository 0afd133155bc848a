"""The job reconciler's status side: conditions, phase transitions, replica statuses, events.

:class:`ReportingMixin` is the part of :class:`gpuyard.controllers.reconciling.JobReconciler`
that turns what a pass observed and decided into the job's status: `_set` records a condition
(with its event, the phase-transition metric and the one canonical `job.transition` log line),
`_progress` moves a job that is not restarting to Queuing or Running, `_replica_statuses` counts
active/succeeded/failed pods and restarts per role, `_write_status` writes the status only when
it changed, `_emit` records the pass's events, and `_deadline_requeue` wakes the job at its
`activeDeadlineSeconds`. It is a mixin: `store`, `metrics` and the pass records
(:class:`~gpuyard.controllers.reconciling.Observed`, :class:`~gpuyard.controllers.reconciling.Actions`)
come from `reconciling.py`.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import structlog

from gpuyard.apis.core import Pod
from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.jobspecs import JobStatus, ReplicaStatus
from gpuyard.apis.scheduling import PodGroup, Reservation
from gpuyard.controllers.judging import reason_of
from gpuyard.controllers.metrics import JobMetrics
from gpuyard.controllers.statuses import record_event, set_condition
from gpuyard.state.store import Store
from gpuyard.state.workqueues import Requeue

if TYPE_CHECKING:
    from gpuyard.controllers.reconciling import Actions, Observed

__all__ = ["ReportingMixin"]

log = structlog.get_logger(__name__)


class ReportingMixin:
    """Writes a job's status and events from one pass (a mixin of `JobReconciler`)."""

    # set by JobReconciler.__init__
    store: Store
    metrics: JobMetrics

    # --- status ----------------------------------------------------------------------------------

    def _progress(
        self,
        job: TrainingJob,
        status: JobStatus,
        obs: Observed,
        live: dict[str, Pod],
        held: dict[str, Reservation],
        pod_group: PodGroup,
        restarting: bool,
        acts: Actions,
        now: datetime,
    ) -> None:
        if live and status.start_time is None:
            status.start_time = now
        if restarting:
            return
        name = f"{job.kind} {job.metadata.name}"
        running = any(p.status.phase == "Running" for p in live.values())
        all_up = all(
            (p := live.get(r.name)) is not None and p.status.phase in ("Running", "Succeeded")
            for r in obs.replicas
        )
        if running or all_up:
            self.metrics.pods_running(
                job.kind, job.metadata.uid, created=job.metadata.creation_timestamp, now=now, all_pods=all_up
            )
        if status.phase == "Restarting":
            if all_up:
                self._set(
                    job, status, acts, "Running", self._reason(job, "Running"), f"{name} is running.", now
                )
        elif running:
            self._set(job, status, acts, "Running", self._reason(job, "Running"), f"{name} is running.", now)
        elif not live and status.phase in ("", "Created", "Queuing"):
            why = pod_group.status.message or pod_group.status.reason
            message = f"{name} is queuing" + (f": {why}" if why else ".")
            self._set(
                job,
                status,
                acts,
                "Queuing",
                self._reason(job, "Queuing"),
                message,
                now,
                event=status.phase != "Queuing",
            )

    def _replica_statuses(
        self, job: TrainingJob, status: JobStatus, obs: Observed, *, live: dict[str, Pod] | None = None
    ) -> None:
        out: dict[str, ReplicaStatus] = {role: ReplicaStatus() for role in job.roles()}
        for rep in obs.replicas:
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
        status.replica_statuses = out

    def _set(
        self,
        job: TrainingJob,
        status: JobStatus,
        acts: Actions,
        type_: str,
        reason: str,
        message: str,
        now: datetime,
        *,
        true: bool = True,
        warning: bool = False,
        event: bool = True,
        force_event: bool = False,
    ) -> None:
        before = status.phase
        changed = set_condition(status, type_, reason=reason, message=message, now=now, true=true)
        if (changed and event) or force_event:
            acts.events.append((reason, message, warning))
        if changed and type_ == "Created":
            self.metrics.created(job.kind)
        if status.phase != before:
            self.metrics.transition(
                (job.metadata.namespace, job.metadata.name), job.kind, was=before, phase=status.phase
            )
            log.info(
                "job.transition",
                job=f"{job.metadata.namespace}/{job.metadata.name}",
                kind=job.kind,
                phase=status.phase,
                was=before or "-",
                reason=reason,
            )

    @staticmethod
    def _reason(job: TrainingJob, what: str) -> str:
        return reason_of(job, what)

    def _write_status(self, job: TrainingJob, status: JobStatus, now: datetime) -> None:
        self.metrics.track((job.metadata.namespace, job.metadata.name), job.kind, status.phase)
        if status.model_dump(exclude={"last_reconcile_time"}) == job.status.model_dump(
            exclude={"last_reconcile_time"}
        ):
            return
        status.last_reconcile_time = now
        self.store.update(job.model_copy(update={"status": status}))

    def _emit(self, job: TrainingJob, acts: Actions, now: datetime) -> None:
        for reason, message, warning in acts.events:
            record_event(self.store, job, reason=reason, message=message, now=now, warning=warning)
        acts.events.clear()

    def _deadline_requeue(self, job: TrainingJob, status: JobStatus, now: datetime) -> Requeue | None:
        deadline = job.run_policy.active_deadline_seconds
        if deadline is None or status.start_time is None:
            return None
        remaining = status.start_time.timestamp() + deadline - now.timestamp()
        return Requeue(after=max(0.0, remaining) + 0.001)
