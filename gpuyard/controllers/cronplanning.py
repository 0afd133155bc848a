"""What a Cron should do now, as plain data: the cron controller's pure half.

:func:`plan_cron` takes a Cron, the jobs it created (labelled `kubedl.io/cron-name` and owned by
it) and the time, and decides as KubeDL's cron controller does (`controllers/apps/cron_controller.go`):

1. `status.active`: the Cron's jobs that have not finished; `status.history`: every job it
   created (kept after the job is gone), oldest first, its last condition and when it was created
   and finished, cut to `historyLimit` (the newest kept); finished jobs cut from the history are
   deleted;
2. nothing new while `suspend` is true or after `deadline` (a `Deadline` Event);
3. the most recent schedule time since `status.lastScheduleTime` (or the Cron's creation) that
   has come: `Forbid` skips it while a job is active (an `AlreadyActive` Event), `Replace`
   deletes the active jobs, then a job `<cron>-<unix time>` is created from the template with
   the `kubedl.io/cron-name` label and a controller owner reference to the Cron; a template
   that names its job forces `Forbid` (the name can only be used once at a time);
4. look again at the next schedule time.

The reconciler (`cronrunning.py`) carries the plan out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuyard.apis.crons import (
    LABEL_CRON_NAME,
    Cron,
    CronHistory,
    CronHistoryObject,
    CronObjectReference,
    cron_job_name,
    workload_of,
)
from gpuyard.apis.cronschedules import ConcurrencyPolicy, parse_schedule
from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.jobs import JobValidationError, parse_job
from gpuyard.state.events import EventType

__all__ = ["CronEvent", "CronPlan", "cron_owns", "job_reference", "plan_cron"]

TOO_MANY_MISSED = 100


@dataclass(frozen=True, slots=True)
class CronEvent:
    reason: str
    message: str
    type: EventType = "Normal"


@dataclass(slots=True)
class CronPlan:
    """One step for a Cron: status to write, a job to create, jobs to delete, Events, when to look again."""

    active: list[TrainingJob]
    history: list[CronHistory]
    last_schedule_time: datetime | None
    create: TrainingJob | None = None
    delete: list[TrainingJob] = field(default_factory=list)
    events: list[CronEvent] = field(default_factory=list)
    requeue_after: float | None = None

    def status(self, created: TrainingJob | None = None) -> dict[str, Any]:
        """The status fields to write (`created`: the job as stored, with its uid)."""
        active = [*self.active, *([created] if created is not None else [])]
        return {
            "active": [job_reference(j) for j in active],
            "history": self.history,
            "last_schedule_time": self.last_schedule_time,
        }


def cron_owns(cron: Cron, job: TrainingJob) -> bool:
    """Whether `job` is one of `cron`'s runs: its label and its controller reference."""
    if job.metadata.labels.get(LABEL_CRON_NAME) != cron.metadata.name:
        return False
    return any(
        ref.kind == "Cron"
        and ref.name == cron.metadata.name
        and (not cron.metadata.uid or ref.uid == cron.metadata.uid)
        for ref in job.metadata.owner_references
    )


def job_reference(job: TrainingJob) -> CronObjectReference:
    return CronObjectReference(
        api_version=job.api_version,
        kind=job.kind,
        namespace=job.metadata.namespace,
        name=job.metadata.name,
        uid=job.metadata.uid,
    )


def _last_condition(job: TrainingJob) -> str:
    return job.status.conditions[-1].type if job.status.conditions else ""


def _finished_at(job: TrainingJob, now: datetime) -> datetime | None:
    if not job.status.finished:
        return None
    if job.status.completion_time is not None:
        return job.status.completion_time
    cond = job.status.conditions[-1] if job.status.conditions else None
    return getattr(cond, "last_transition_time", None) or now


def _history(cron: Cron, jobs: Sequence[TrainingJob], now: datetime) -> list[CronHistory]:
    """The stored history merged with the jobs as they are now, oldest first."""
    template = cron.spec.template
    by_name = {h.object.name: h.model_copy() for h in cron.status.history}
    for job in jobs:
        old = by_name.get(job.metadata.name)
        entry = CronHistory(
            object=CronHistoryObject(
                api_group=template.api_version or job.api_version, kind=job.kind, name=job.metadata.name
            ),
            status=_last_condition(job),
            created=job.metadata.creation_timestamp,
            finished=_finished_at(job, now),
        )
        if old is not None and old.finished is not None and entry.finished is not None:
            entry.finished = old.finished  # observed once, kept
        by_name[job.metadata.name] = entry
    far = datetime.max.replace(tzinfo=now.tzinfo)
    return sorted(by_name.values(), key=lambda h: (h.created or far, h.object.name))


def plan_cron(cron: Cron, jobs: Sequence[TrainingJob], *, now: datetime) -> CronPlan:
    """The next step for `cron` given its jobs (see the module docstring)."""
    spec = cron.spec
    mine = [j for j in jobs if cron_owns(cron, j)]
    active = sorted(
        (j for j in mine if not j.status.finished and j.metadata.deletion_timestamp is None),
        key=lambda j: (j.metadata.creation_timestamp or now, j.metadata.name),
    )
    history = _history(cron, mine, now)
    plan = CronPlan(active=active, history=history, last_schedule_time=cron.status.last_schedule_time)
    if spec.history_limit is not None and len(history) > spec.history_limit:
        cut = history[: len(history) - spec.history_limit]
        plan.history = history[len(history) - spec.history_limit :]
        gone = {h.object.name for h in cut}
        plan.delete = [j for j in mine if j.metadata.name in gone and j.status.finished]
    if cron.metadata.deletion_timestamp is not None or spec.suspend:
        return plan
    if spec.deadline is not None and now > spec.deadline:
        plan.events.append(CronEvent("Deadline", "cron has reached its deadline and stops scheduling"))
        return plan
    try:
        schedule = parse_schedule(spec.schedule)
    except ValueError as exc:
        plan.events.append(CronEvent("InvalidSchedule", f"invalid schedule: {exc}", "Warning"))
        return plan
    plan.requeue_after = max(0.0, (schedule.next_after(now) - now).total_seconds())
    since = cron.status.last_schedule_time or cron.metadata.creation_timestamp or now
    due, missed = schedule.latest_due(since=since, now=now)
    if due is None or due == cron.status.last_schedule_time:
        return plan
    if missed > TOO_MANY_MISSED:
        plan.events.append(
            CronEvent(
                "TooManyMissedTimes",
                f"too many missed start times: more than {TOO_MANY_MISSED}. Check clock skew",
                "Warning",
            )
        )
    job, policy, problem = _job_for(cron, due)
    if job is None:
        plan.events.append(CronEvent("FailedCreate", f"Error creating workload: {problem}", "Warning"))
        return plan
    if policy == "Forbid" and active:
        plan.events.append(
            CronEvent(
                "AlreadyActive",
                "Not starting because prior execution is running and concurrency policy is Forbid",
            )
        )
        return plan
    if policy == "Replace":
        plan.delete += [j for j in active if j not in plan.delete]
        plan.active = []
    plan.create = job
    plan.last_schedule_time = due
    return plan


def _job_for(cron: Cron, due: datetime) -> tuple[TrainingJob | None, ConcurrencyPolicy, str]:
    """The job to create for the schedule time `due`, the concurrency policy in force, or why none."""
    doc = workload_of(cron)
    meta = dict(doc.get("metadata") or {})
    policy: ConcurrencyPolicy = cron.spec.policy
    meta.pop("generateName", None)  # a random suffix could run one schedule time twice
    if meta.get("name"):
        policy = "Forbid"  # one fixed name: one run at a time (KubeDL's OverridePolicy)
    else:
        meta["name"] = cron_job_name(cron.metadata.name, due)
    meta["namespace"] = cron.metadata.namespace
    meta["labels"] = {**dict(meta.get("labels") or {}), LABEL_CRON_NAME: cron.metadata.name}
    meta["ownerReferences"] = [
        *list(meta.get("ownerReferences") or []),
        cron.controller_reference().to_dict(),
    ]
    doc["metadata"] = meta
    try:
        return parse_job(doc), policy, ""
    except JobValidationError as exc:
        return None, policy, "; ".join(f"{d['field']}: {d['reason']}" for d in exc.details) or exc.message
