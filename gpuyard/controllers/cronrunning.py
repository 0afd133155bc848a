"""The cron controller: KubeDL's Crons (`apps.kubedl.io/v1alpha1`) and jobs with `spec.cronPolicy`.

:class:`CronReconciler` watches Crons, and every job kind: a job labelled `kubedl.io/cron-name`
brings its Cron's key back (it started, finished, was deleted), and a job with `spec.cronPolicy`
its own key, for which the reconciler keeps a Cron of the job's name whose template is the job
without its cronPolicy, as KubeDL's job controller does (`ReconcileCron`; the job itself runs
too, and the Cron is left when the job is deleted, as in KubeDL).

For a Cron it plans one step (`cronplanning.py`, pure) on the platform's clock (the virtual clock
on the fake cluster) and applies it: deletes (Replace, history beyond `historyLimit`), the new
job (its creation answered 409 means an earlier pass created it: it is taken as created), the
status (`active`, `history`, `lastScheduleTime`) and Events about the Cron; then it looks again at
the next schedule time. When a Cron is gone its jobs are deleted (on Kubernetes the garbage
collector does the same through their owner references). It writes as the job operator.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import structlog

from gpuyard.apis.crons import LABEL_CRON_NAME, Cron, cron_for_job
from gpuyard.apis.jobkinds import KIND_INFO, TrainingJob, find_job
from gpuyard.apis.meta import Resource
from gpuyard.controllers.cronplanning import CronPlan, cron_owns, plan_cron
from gpuyard.state.context import Context
from gpuyard.state.events import EventRecorder
from gpuyard.state.ownership import OPERATOR
from gpuyard.state.store import AlreadyExists, NotFound
from gpuyard.state.workqueues import ObjectKey, Requeue, Watch
from gpuyard.state.writing import identified

__all__ = ["CronReconciler"]

log = structlog.get_logger(__name__)


def _cron_keys(obj: Resource) -> Iterable[ObjectKey]:
    """A job's keys: its Cron's (label), and its own when it carries a cronPolicy."""
    keys: list[ObjectKey] = []
    cron = obj.metadata.labels.get(LABEL_CRON_NAME)
    if cron:
        keys.append((obj.metadata.namespace, cron))
    spec = getattr(obj, "spec", None)
    if spec is not None and "cronPolicy" in (getattr(spec, "model_extra", None) or {}):
        keys.append((obj.metadata.namespace, obj.metadata.name))
    return keys


class CronReconciler:
    """Runs every Cron on the clock; see the module docstring."""

    name = "cron-controller"
    needs_leader = True  # creates and deletes jobs, writes Cron status
    concurrency = 2

    def __init__(self, ctx: Context) -> None:
        if ctx.writer is None:  # pragma: no cover - Context always sets one
            raise RuntimeError("the cron controller needs a writer (ctx.writer)")
        self.store = ctx.store
        self.clock = ctx.clock
        self.writer = identified(ctx.writer, OPERATOR)
        self.events = EventRecorder(
            component=OPERATOR, store=ctx.store, writer=ctx.writer, now=ctx.clock.utcnow
        )
        self.watches: Sequence[Watch] = (Watch(Cron.KIND), *(Watch(kind, _cron_keys) for kind in KIND_INFO))

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        namespace, name = key
        job = find_job(self.store, namespace, name)
        if job is not None:
            await self._wrap(job)
        cron = self.store.get_of(Cron, namespace, name)
        if cron is None:
            await self._delete_orphans(namespace, name)
            return None
        jobs = self._jobs_of(cron)
        now = self.clock.utcnow()
        plan = plan_cron(cron, jobs, now=now)
        created = await self._apply(cron, plan)
        if created is not None:
            log.info("cron.created", cron=f"{namespace}/{name}", job=created.metadata.name)
        return Requeue(plan.requeue_after) if plan.requeue_after is not None else None

    def _jobs_of(self, cron: Cron) -> list[TrainingJob]:
        out: list[TrainingJob] = []
        for kind in KIND_INFO:
            for obj in self.store.list(
                kind, namespace=cron.metadata.namespace, selector={LABEL_CRON_NAME: cron.metadata.name}
            ):
                if isinstance(obj, TrainingJob):
                    out.append(obj)
        return out

    async def _wrap(self, job: TrainingJob) -> None:
        """A job with `spec.cronPolicy`: create or update the Cron of its name (KubeDL's ReconcileCron)."""
        desired = cron_for_job(job)
        if desired is None:
            return
        current = self.store.get_of(Cron, job.metadata.namespace, job.metadata.name)
        if current is None:
            try:
                await self.writer.create(desired)
            except AlreadyExists:
                return
            await self.events.record(
                job,
                reason="CronCreated",
                message=f"created Cron {job.metadata.name} from spec.cronPolicy",
                labels={"job-name": job.metadata.name},
            )
            return
        if current.spec.model_dump(by_alias=True) != desired.spec.model_dump(by_alias=True):
            fresh = current.clone()
            fresh.spec = desired.spec
            await self.writer.update(fresh)

    async def _apply(self, cron: Cron, plan: CronPlan) -> TrainingJob | None:
        ns = cron.metadata.namespace
        for job in plan.delete:
            try:
                await self.writer.delete(job.kind, ns, job.metadata.name)
            except NotFound:
                pass
            await self._event(cron, "SuccessfulDelete", f"deleted job {job.metadata.name}")
        created: TrainingJob | None = None
        if plan.create is not None:
            job = plan.create
            try:
                created = await self.writer.create(job)
            except AlreadyExists:
                existing = find_job(self.store, ns, job.metadata.name)
                if existing is None or not cron_owns(cron, existing):
                    await self._event(
                        cron,
                        "FailedCreate",
                        f"Error creating workload: {job.metadata.name} exists and is not this Cron's",
                        "Warning",
                    )
                    plan.last_schedule_time = cron.status.last_schedule_time
                else:
                    created = existing if existing not in plan.active else None
            else:
                await self._event(cron, "SuccessfulCreate", f"Created workload: {job.metadata.name}")
        status = plan.status(created)
        if _changed(cron, status):
            await self.writer.patch_status(Cron.KIND, ns, cron.metadata.name, status)
        for event in plan.events:
            await self._event(cron, event.reason, event.message, event.type)
        return created

    async def _event(self, cron: Cron, reason: str, message: str, type: Any = "Normal") -> None:
        await self.events.record(cron, reason=reason, message=message, type=type)

    async def _delete_orphans(self, namespace: str, name: str) -> None:
        """The Cron is gone: delete its jobs (owner references' cascade, as the garbage collector)."""
        for kind in KIND_INFO:
            for obj in self.store.list(kind, namespace=namespace, selector={LABEL_CRON_NAME: name}):
                if any(
                    r.kind == "Cron" and r.name == name and r.controller
                    for r in obj.metadata.owner_references
                ):
                    try:
                        await self.writer.delete(kind, namespace, obj.metadata.name)
                    except NotFound:
                        pass


def _changed(cron: Cron, status: dict[str, Any]) -> bool:
    now = cron.status
    return (
        [r.model_dump() for r in now.active] != [r.model_dump() for r in status["active"]]
        or [h.model_dump() for h in now.history] != [h.model_dump() for h in status["history"]]
        or now.last_schedule_time != status["last_schedule_time"]
    )
