"""Applying a reconcile pass: the :class:`~gpuyard.controllers.planning.Plan` written through the writer.

The last of the operator's three steps (observe -> plan -> apply). :class:`Applier` carries a
plan out through `ctx.writer`, in this order: the job's status (`patch_status`, based on the
job's resourceVersion, so a status decided on a stale job is re-decided), the pods to stop, the
PodGroup (deleted, created, or its spec changed with :func:`retry_on_conflict`: release requests
go out only after the pods they concern are stopped), in delegate mode the gang scheduler's
PodGroup (deleted, created or updated; the pods that name it are created only once it is written),
the Services, the pods to create, the Services to delete, the Events, and the job itself when its
TTL ran out.

A refused pod create (:class:`~gpuyard.state.backend.BackendError`) is answered as Kueue's admit
does: the Reservations that have no pod are released (`spec.release`), a FailedCreatePod event
is recorded and the job is looked at again after a backoff that doubles per failure. The
applier also keeps the job metrics and writes the one `job.transition` log line per phase change.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import structlog

from gpuyard.apis.core import Pod, Service
from gpuyard.apis.gangs import GANG_KIND, GangPodGroup
from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.meta import Resource
from gpuyard.apis.scheduling import LABEL_JOB_NAME, PodGroup
from gpuyard.controllers.metrics import JobMetrics
from gpuyard.controllers.observing import job_owner_uid
from gpuyard.controllers.planning import Plan
from gpuyard.controllers.podgroups import PodGroupChange, changed_pod_group
from gpuyard.controllers.reporting import EventNote
from gpuyard.state.backend import BackendError
from gpuyard.state.events import EventRecorder
from gpuyard.state.ownership import OPERATOR
from gpuyard.state.store import AlreadyExists, NotFound, Store
from gpuyard.state.workqueues import ObjectKey, Requeue
from gpuyard.state.writing import Writer, identified, retry_on_conflict

__all__ = ["Applier"]

log = structlog.get_logger(__name__)


class Applier:
    """Writes a job's plans through `writer` (as the operator, `OPERATOR`); reads the store only to
    re-decide a conflicting write."""

    def __init__(self, *, store: Store, writer: Writer, metrics: JobMetrics) -> None:
        self.store = store
        self.writer = identified(writer, OPERATOR)
        self.events = EventRecorder(component=OPERATOR, store=store, writer=writer)
        self.metrics = metrics
        self.create_failures: dict[ObjectKey, int] = {}
        # job key -> its resourceVersion after this applier's last status write (the reconciler's
        # record of a settled job; it takes each entry out)
        self.status_versions: dict[ObjectKey, str] = {}

    async def apply(self, job: TrainingJob, plan: Plan) -> Requeue | None:
        ns, name = job.metadata.namespace, job.metadata.name
        report = plan.report
        if plan.status:  # first, and only then counted: a conflict re-decides the whole pass
            stored = await self.writer.patch_status(
                job.kind, ns, name, plan.status, resource_version=job.metadata.resource_version
            )
            self.status_versions[(ns, name)] = stored.metadata.resource_version
        self._count(job, plan)
        for pod in plan.delete_pods:
            await self._delete("Pod", pod.metadata.namespace, pod.metadata.name)
        if plan.delete_pod_group is not None:
            await self._delete("PodGroup", ns, plan.delete_pod_group.metadata.name)
        if plan.create_pod_group is not None:
            try:
                await self.writer.create(plan.create_pod_group)
            except AlreadyExists:  # a cache that lags the server: its event brings the key back
                pass
        elif plan.pod_group:
            await self._change_pod_group((ns, name), plan.pod_group)
        if plan.delete_gang_group is not None:
            await self._delete(GANG_KIND, ns, plan.delete_gang_group.metadata.name)
        for svc in plan.services:
            await self._write_service(svc)
        requeue = await self._write_gang_group(job, plan)
        if requeue is None:
            requeue = await self._create_pods(job, plan)
        for svc_name in plan.delete_services:
            await self._delete("Service", ns, svc_name)
        await self._record(job, report.events, now=report.now)
        if plan.delete_job:
            log.info(
                "job.ttl_expired",
                job=f"{ns}/{name}",
                kind=job.kind,
                ttl=job.run_policy.ttl_seconds_after_finished,
            )
            await self._delete(job.kind, ns, name)
            await self.delete_children(ns, name)
            return None
        if requeue is not None:
            return requeue
        return Requeue(after=plan.requeue) if plan.requeue is not None else None

    def _count(self, job: TrainingJob, plan: Plan) -> None:
        """The job metrics and the one `job.transition` log line per phase change."""
        ns, name = job.metadata.namespace, job.metadata.name
        key = (ns, name)
        report = plan.report
        if report.created:
            self.metrics.created(job.kind)
        if plan.launch is not None:
            self.metrics.pods_running(
                job.kind,
                job.metadata.uid,
                name=name,
                namespace=ns,
                created=job.metadata.creation_timestamp,
                now=report.now,
                all_pods=plan.launch.all_pods,
            )
        for t in report.transitions:
            self.metrics.transition(key, job.kind, was=t.was, phase=t.phase)
            log.info(
                "job.transition",
                job=f"{ns}/{name}",
                kind=job.kind,
                phase=t.phase,
                was=t.was or "-",
                reason=t.reason,
            )
        self.metrics.track(key, job.kind, report.status.phase)

    # --- pods and services ---------------------------------------------------------------------

    async def _create_pods(self, job: TrainingJob, plan: Plan) -> Requeue | None:
        key = (job.metadata.namespace, job.metadata.name)
        for pod in plan.create_pods:
            try:
                await self.writer.create(pod)
            except BackendError as exc:
                return await self._refused(job, plan, str(exc))
            plan.report.note("SuccessfulCreatePod", f"Created pod: {pod.metadata.name}")
        if plan.create_pods:
            self.create_failures.pop(key, None)
        return None

    async def _write_gang_group(self, job: TrainingJob, plan: Plan) -> Requeue | None:
        """Delegate mode: create or update the gang scheduler's PodGroup; when the API server refuses
        it (e.g. the gang scheduler's CRD is not installed) no pod is created, a FailedCreatePodGroup
        event says why and the job is looked at again after a backoff that doubles per failure."""
        group = plan.gang_group
        if group is None:
            return None
        try:
            if group.metadata.resource_version:
                await self.writer.update(group)
            else:
                await self.writer.create(group)
        except AlreadyExists:  # a cache that lags the server: its event brings the key back
            pass
        except (BackendError, NotFound) as exc:
            ns, name = job.metadata.namespace, job.metadata.name
            plan.report.note(
                "FailedCreatePodGroup",
                f"Error creating {group.api_version} PodGroup {name}: {exc}; "
                "is the gang scheduler (scheduler.gang_scheduler) installed?",
                warning=True,
            )
            failures = self.create_failures.get((ns, name), 0)
            self.create_failures[(ns, name)] = failures + 1
            log.warning("job.gang_group_failed", job=f"{ns}/{name}", error=str(exc))
            return Requeue(after=min(30.0, 0.5 * 2**failures))
        return None

    async def _refused(self, job: TrainingJob, plan: Plan, error: str) -> Requeue:
        """A refused pod create: release the Reservations that have no pod and look again later."""
        ns, name = job.metadata.namespace, job.metadata.name
        with_pods = {
            p.metadata.name for p in self.store.list("Pod", namespace=ns, selector={LABEL_JOB_NAME: name})
        }
        release = {pod: uid for pod, uid in plan.held.items() if pod not in with_pods}
        await self._change_pod_group(
            (ns, name), PodGroupChange(release=release, existing=plan.pod_group.existing)
        )
        plan.report.note(
            "FailedCreatePod",
            f"Error creating: {error}; released {len(release)} reservation(s) and queued again",
            warning=True,
        )
        key = (ns, name)
        failures = self.create_failures.get(key, 0)
        self.create_failures[key] = failures + 1
        log.warning("job.create_failed", job=f"{ns}/{name}", error=error, released=len(release))
        return Requeue(after=min(30.0, 0.5 * 2**failures))

    async def _write_service(self, desired: Resource) -> None:
        ns, name = desired.metadata.namespace, desired.metadata.name

        async def write() -> Resource:
            current = self.store.get("Service", ns, name)
            if current is None:
                return await self.writer.create(desired)
            update = desired.model_copy(
                update={
                    "metadata": desired.metadata.model_copy(
                        update={"resource_version": current.metadata.resource_version}
                    )
                }
            )
            return await self.writer.update(update)

        await retry_on_conflict(write)

    # --- the PodGroup --------------------------------------------------------------------------

    async def _change_pod_group(self, key: ObjectKey, change: PodGroupChange) -> None:
        async def write() -> PodGroup | None:
            current = self.store.get_of(PodGroup, *key)
            if current is None:
                return None
            new = changed_pod_group(current, change)
            return None if new is None else await self.writer.update(new)

        await retry_on_conflict(write)

    # --- events and deletes ----------------------------------------------------------------------

    async def _record(self, job: TrainingJob, events: Iterable[EventNote], *, now: datetime) -> None:
        labels = {LABEL_JOB_NAME: job.metadata.name}
        for ev in events:
            await self.events.record(
                job,
                reason=ev.reason,
                message=ev.message,
                type="Warning" if ev.warning else "Normal",
                labels=labels,
                at=now,
            )
            log.info(
                "job.event",
                job=f"{job.metadata.namespace}/{job.metadata.name}",
                kind=job.kind,
                reason=ev.reason,
                message=ev.message,
                type="Warning" if ev.warning else "Normal",
            )

    async def _delete(self, kind: str, ns: str, name: str) -> None:
        try:
            await self.writer.delete(kind, ns, name)
        except NotFound:
            pass

    async def delete_children(self, ns: str, name: str) -> None:
        """The job is gone: delete its pods, services, PodGroup (its Reservations go with it) and events."""
        selector = {LABEL_JOB_NAME: name}
        for pod in self.store.list_of(Pod, namespace=ns, selector=selector):
            if job_owner_uid(pod) is not None:
                await self._delete("Pod", ns, pod.metadata.name)
        for svc in self.store.list_of(Service, namespace=ns, selector=selector):
            if job_owner_uid(svc) is not None:
                await self._delete("Service", ns, svc.metadata.name)
        await self._delete("PodGroup", ns, name)
        gang = self.store.get_of(GangPodGroup, ns, name) if GANG_KIND in self.store.kinds() else None
        if gang is not None and job_owner_uid(gang) is not None:
            await self._delete(GANG_KIND, ns, name)
        for ev in self.store.list("Event", namespace=ns, selector=selector):
            await self._delete("Event", ns, ev.metadata.name)
