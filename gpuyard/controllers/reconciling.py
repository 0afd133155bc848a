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

**A settled job is not planned again.** Most passes of a waiting job write its status (the
scheduler's word changed) and nothing else; that write brings the key back, and planning the
job again finds nothing to do. So a pass that writes nothing but the job's status and Events,
asks for no later look and saw no finished pod leaves the job *settled*: the job's
resourceVersion after the pass and the count of events of the job's other objects (pods,
Reservations, PodGroups, the gang scheduler's PodGroup, PriorityClasses; counted when the watch
maps them to the key, before any pass they wake) as the pass began. A pass that finds both
unchanged returns at once. Anything a plan reads besides the time is the job or one of those
objects (a finished pod's node health aside, hence the last condition), and a pass that asks for
no later look reads the time only to stamp what it writes, so planning again would write nothing;
`tests/unit/controllers/conftest.py` plans every skipped pass anyway and checks that.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuyard.apis.gangs import GANG_KIND
from gpuyard.apis.jobkinds import KIND_INFO, TrainingJob, find_job
from gpuyard.apis.managers import external_manager
from gpuyard.apis.meta import Resource
from gpuyard.apis.priorityclasses import PriorityClass, named_class
from gpuyard.apis.scheduling import LABEL_JOB_NAME
from gpuyard.controllers.applying import Applier
from gpuyard.controllers.delegating import PodScheduling
from gpuyard.controllers.metrics import job_metrics
from gpuyard.controllers.observing import Observed, observe
from gpuyard.controllers.planning import Plan, plan
from gpuyard.controllers.workloads.registry import plugin_for
from gpuyard.state.context import Context
from gpuyard.state.workqueues import Mapper, ObjectKey, Requeue, Watch

__all__ = ["JobReconciler", "Settled"]

_FINISHED = ("Succeeded", "Failed")


def _job_key(obj: Resource) -> Iterable[ObjectKey]:
    name = obj.metadata.labels.get(LABEL_JOB_NAME)
    return ((obj.metadata.namespace, name),) if name else ()


def _own_key(obj: Resource) -> Iterable[ObjectKey]:
    return ((obj.metadata.namespace, obj.metadata.name),)


@dataclass(frozen=True, slots=True)
class Settled:
    """A job a pass left with nothing more to do (see the module docstring)."""

    version: str  # the job's resourceVersion after the pass (its own status write included)
    inputs: int  # events of the job's other objects counted when the pass began


def quiet(decided: Plan, observed: Observed) -> bool:
    """The pass writes nothing but the job's status and Events, asks for no later look and saw no
    finished pod: planning the job again on the same objects would write nothing."""
    return (
        decided.requeue is None
        and not decided.delete_job
        and not decided.delete_pods
        and not decided.delete_services
        and decided.delete_pod_group is None
        and decided.create_pod_group is None
        and not decided.pod_group
        and not decided.services
        and decided.gang_group is None
        and decided.delete_gang_group is None
        and not decided.create_pods
        and not any(r.pod is not None and r.pod.status.phase in _FINISHED for r in observed.replicas)
    )


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
        # per job: events of its other objects (`_counted`), and how the last quiet pass left it
        self._inputs: dict[ObjectKey, int] = {}
        self._settled: dict[ObjectKey, Settled] = {}
        self.skipped = 0  # passes that found their job settled
        self.watches: Sequence[Watch] = (
            *(Watch(kind) for kind in KIND_INFO),
            Watch("Pod", self._counted(_job_key)),
            Watch("Reservation", self._counted(_job_key)),
            Watch("PodGroup", self._counted(_own_key)),
            *((Watch(GANG_KIND, self._counted(_own_key)),) if GANG_KIND in ctx.store.kinds() else ()),
            *(
                (Watch("PriorityClass", self._counted(self._jobs_naming)),)
                if "PriorityClass" in ctx.store.kinds()
                else ()
            ),
        )
        self.metrics = job_metrics(ctx.registry)
        self.applier = Applier(store=ctx.store, writer=ctx.writer, metrics=self.metrics)

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        namespace, name = key
        job = find_job(self.store, namespace, name)
        if job is None:
            self.metrics.deleted(key)
            self._settled.pop(key, None)
            self._inputs.pop(key, None)
            await self.applier.delete_children(namespace, name)
            self.applier.create_failures.pop(key, None)
            return None
        inputs = self._inputs.get(key, 0)
        if self.settled(key, job):  # before the managedBy check: only a pass it let through settles
            self.skipped += 1
            return None
        if external_manager(job) is not None:
            return None  # runPolicy.managedBy names another controller: no pods, no status (managers.py)
        self._settled.pop(key, None)
        self.applier.status_versions.pop(key, None)
        observed = observe(self.store, job)
        decided = self.plan(job, observed)
        requeue = await self.applier.apply(job, decided)
        version = self.applier.status_versions.pop(key, job.metadata.resource_version)
        if requeue is None and quiet(decided, observed):
            self._settled[key] = Settled(version, inputs)
        return requeue

    def settled(self, key: ObjectKey, job: TrainingJob) -> bool:
        """The last quiet pass left `job` as it is now, and none of its other objects changed since."""
        last = self._settled.get(key)
        return (
            last is not None
            and last.version == job.metadata.resource_version
            and last.inputs == self._inputs.get(key, 0)
        )

    def plan(self, job: TrainingJob, observed: Observed) -> Plan:
        """One pass's plan for `job` as the store holds it now."""
        return plan(
            job,
            plugin=plugin_for(job.kind),
            observed=observed,
            now=self.clock.utcnow(),
            cluster_domain=self.settings.cluster_domain,
            scheduling=self.scheduling,
            priority_classes=self.store.list_of(PriorityClass)
            if "PriorityClass" in self.store.kinds()
            else (),
        )

    def _counted(self, mapper: Mapper) -> Mapper:
        """`mapper`, counting each event per job key it maps to (`settled` compares the counts)."""
        inputs = self._inputs

        def counted(obj: Resource) -> Iterable[ObjectKey]:
            keys = tuple(mapper(obj))
            for key in keys:
                inputs[key] = inputs.get(key, 0) + 1
            return keys

        return counted

    def _jobs_naming(self, obj: object) -> list[ObjectKey]:
        """The jobs that name a PriorityClass that was created, changed or deleted."""
        name = getattr(getattr(obj, "metadata", None), "name", None)
        out: list[ObjectKey] = []
        for kind in KIND_INFO:
            for job in self.store.list(kind):
                if isinstance(job, TrainingJob) and named_class(job)[0] == name:
                    out.append((job.metadata.namespace, job.metadata.name))
        return out
