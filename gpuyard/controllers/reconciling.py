"""The job reconciler: one level-triggered loop for every job kind, as observe -> plan -> apply.

For a job key, :class:`JobReconciler` reads the job and everything it owns (`observing.py`),
decides one step towards the job's spec as plain data (`planning.py`, pure), and carries that
plan out through the writer (`applying.py`). A job that is gone has its pods, services, PodGroup
and events deleted (the scheduler collects the PodGroup's Reservations).

The reconciler watches every job kind, and the pods, Reservations and PodGroups labelled with a
job's name, and the gang scheduler's PodGroups of delegate mode (named like the job), so any change
to what a job owns brings its key back; a PriorityClass change brings
back the jobs that name it (their priority is resolved through it). All timing uses the clock.
A job whose `runPolicy.managedBy` names another controller (`apis/managers.py`) is left alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpuyard.apis.gangs import GANG_KIND
from gpuyard.apis.jobkinds import KIND_INFO, TrainingJob, find_job
from gpuyard.apis.managers import external_manager
from gpuyard.apis.meta import Resource
from gpuyard.apis.priorityclasses import PriorityClass, named_class
from gpuyard.apis.scheduling import LABEL_JOB_NAME
from gpuyard.controllers.applying import Applier
from gpuyard.controllers.delegating import PodScheduling
from gpuyard.controllers.metrics import job_metrics
from gpuyard.controllers.observing import observe
from gpuyard.controllers.planning import plan
from gpuyard.controllers.workloads.registry import plugin_for
from gpuyard.state.context import Context
from gpuyard.state.workqueues import ObjectKey, Requeue, Watch

__all__ = ["JobReconciler"]


def _job_key(obj: Resource) -> Iterable[ObjectKey]:
    name = obj.metadata.labels.get(LABEL_JOB_NAME)
    return ((obj.metadata.namespace, name),) if name else ()


class JobReconciler:
    """Reconciles every training job kind through its workload plugin."""

    name = "job-operator"
    needs_leader = True  # creates and deletes pods, services and PodGroups

    def __init__(self, ctx: Context, *, concurrency: int | None = None) -> None:
        if ctx.writer is None:  # pragma: no cover - Context always sets one
            raise RuntimeError("the job operator needs a writer (ctx.writer)")
        self.store = ctx.store
        self.clock = ctx.clock
        self.settings = ctx.settings.operator
        self.scheduling = PodScheduling.from_settings(ctx.settings.scheduler)
        self.concurrency = concurrency or self.settings.concurrency
        self.watches: Sequence[Watch] = (
            *(Watch(kind) for kind in KIND_INFO),
            Watch("Pod", _job_key),
            Watch("Reservation", _job_key),
            Watch("PodGroup"),
            *((Watch(GANG_KIND),) if GANG_KIND in ctx.store.kinds() else ()),  # delegate mode
            *((Watch("PriorityClass", self._jobs_naming),) if "PriorityClass" in ctx.store.kinds() else ()),
        )
        self.metrics = job_metrics(ctx.registry)
        self.applier = Applier(store=ctx.store, writer=ctx.writer, metrics=self.metrics)

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        namespace, name = key
        job = find_job(self.store, namespace, name)
        if job is None:
            self.metrics.deleted(key)
            await self.applier.delete_children(namespace, name)
            self.applier.create_failures.pop(key, None)
            return None
        if external_manager(job) is not None:
            return None  # runPolicy.managedBy names another controller: no pods, no status (managers.py)
        decided = plan(
            job,
            plugin=plugin_for(job.kind),
            observed=observe(self.store, job),
            now=self.clock.utcnow(),
            cluster_domain=self.settings.cluster_domain,
            scheduling=self.scheduling,
            priority_classes=self.store.list_of(PriorityClass)
            if "PriorityClass" in self.store.kinds()
            else (),
        )
        return await self.applier.apply(job, decided)

    def _jobs_naming(self, obj: object) -> list[ObjectKey]:
        """The jobs that name a PriorityClass that was created, changed or deleted."""
        name = getattr(getattr(obj, "metadata", None), "name", None)
        out: list[ObjectKey] = []
        for kind in KIND_INFO:
            for job in self.store.list(kind):
                if isinstance(job, TrainingJob) and named_class(job)[0] == name:
                    out.append((job.metadata.namespace, job.metadata.name))
        return out
