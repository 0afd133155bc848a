"""Writing the objects a job has beside its pods (`apis/addons.py`, and Services): create the
desired object, write it back when it no longer covers what is desired, delete it.

Shared by the Tensorboard, Mars web UI and autoscaler reconcilers. Every write is the operator's
(`state.ownership.OPERATOR`); a conflict or a name taken by an object the cache has not seen yet
asks for another pass (`Requeue`), as the level-triggered reconcilers expect. :func:`warn_once`
records the Warning Event that says what the fake cluster only stores (nothing serves it there).
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from gpuyard.apis.core import Event
from gpuyard.apis.jobkinds import KIND_INFO, TrainingJob
from gpuyard.apis.meta import Resource
from gpuyard.apis.scheduling import LABEL_JOB_NAME
from gpuyard.state.events import EventRecorder
from gpuyard.state.store import AlreadyExists, Conflict, NotFound, Store
from gpuyard.state.workqueues import Requeue
from gpuyard.state.writing import Writer

__all__ = ["RETRY", "AddonWriter", "warn_once"]

log = structlog.get_logger(__name__)

RETRY = Requeue(after=1.0)
"""Look again soon: a write lost a race with the cache."""


class AddonWriter:
    """Create, write back and delete the objects one reconciler owns."""

    def __init__(self, *, store: Store, writer: Writer) -> None:
        self.store = store
        self.writer = writer

    async def ensure(
        self,
        desired: Resource,
        *,
        same: Callable[[Resource, Resource], bool],
        owned: Callable[[Resource], bool],
    ) -> Requeue | None:
        """Make the stored object `desired` unless it is already `same` as it. One that is not
        `owned` is deleted first when an earlier job of the same name made it (it names a job or a
        job's Service as owner and carries `job-name`); one gpuyard did not make is left alone
        (as KubeDL reports a conflict), logged."""
        kind, ns, name = desired.kind, desired.metadata.namespace, desired.metadata.name
        current = self.store.get(kind, ns, name)
        try:
            if current is not None and not owned(current):
                if not _made_for_a_job(current):
                    log.warning("addon.name_taken", kind=kind, name=f"{ns}/{name}", why="not made by gpuyard")
                    return None
                await self.writer.delete(kind, ns, name)
                return RETRY  # created once the cache has seen it go
            if current is None:
                await self.writer.create(desired)
            elif not same(current, desired):
                update = current.clone()
                for field in type(desired).model_fields:
                    if field not in ("metadata", "status", "kind", "api_version"):
                        setattr(update, field, getattr(desired, field))
                update.metadata.labels = dict(desired.metadata.labels)
                update.metadata.annotations = dict(desired.metadata.annotations)
                update.metadata.owner_references = list(desired.metadata.owner_references)
                await self.writer.update(update)
        except (AlreadyExists, Conflict, NotFound):
            return RETRY
        return None

    async def remove(
        self, kind: str, namespace: str, name: str, *, owned: Callable[[Resource], bool]
    ) -> None:
        """Delete the object if it is there and `owned` says it is this reconciler's."""
        current = self.store.get(kind, namespace, name)
        if current is None or not owned(current):
            return
        try:
            await self.writer.delete(kind, namespace, name)
        except NotFound:
            pass


def _made_for_a_job(obj: Resource) -> bool:
    """Made by gpuyard (or KubeDL) for a job: labelled `job-name`, owned by a job or its Service."""
    return LABEL_JOB_NAME in obj.metadata.labels and any(
        ref.kind in KIND_INFO or ref.kind == "Service" for ref in obj.metadata.owner_references
    )


async def warn_once(
    events: EventRecorder, store: Store, job: TrainingJob, *, reason: str, message: str
) -> None:
    """A Warning Event about `job` with `reason`, unless this job (its uid) already has one."""
    ns, name = job.metadata.namespace, job.metadata.name
    if any(
        e.reason == reason and e.involved_object.get("uid") == job.metadata.uid
        for e in store.list_of(Event, namespace=ns, selector={LABEL_JOB_NAME: name})
    ):
        return
    await events.record(job, reason=reason, message=message, type="Warning", labels={LABEL_JOB_NAME: name})
