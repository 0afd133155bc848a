"""Events about jobs that are gone: deleted by the operator, on every backend.

The operator deletes a job's Events with its pods when it sees the job go
(`Applier.delete_children`). :class:`JobEventCleaner` deletes the ones it can never see go:

* on Kubernetes, a job deleted while no gpuyard replica led: the API server's garbage collector
  takes its pods and PodGroup (they name the job as owner), but Events have no owner and would
  stay until the server's event TTL. The Kubernetes backend caches the Events labelled `job-name`,
  so the next leader finds them;
* on any backend, an Event about an earlier job of the same name (another uid), or one a
  component wrote just as the job went (the scheduler reporting on a PodGroup being deleted).

An Event labelled `job-name` about a job kind (`involvedObject`) of a group this process
reconciles (`backend.kubernetes.job_groups`; a group not reconciled is never judged) whose job the
store does not hold with that uid is deleted once it is found so twice, `confirm` seconds apart (a
job and its Events arriving from different watches never race it). Kept: the `InvalidSpec`
Events the Kubernetes backend writes about jobs it keeps out of the store on purpose. A reconciler
of Events (run through a `ControllerRunner`, so only once the backend has synced and while this
replica leads): its first pass looks at every Event, later ones at each Event that changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import structlog

from gpuyard.apis.core import Event
from gpuyard.apis.jobkinds import KIND_INFO
from gpuyard.apis.jobs import INVALID_SPEC
from gpuyard.apis.scheduling import LABEL_JOB_NAME
from gpuyard.state.context import Context
from gpuyard.state.ownership import OPERATOR
from gpuyard.state.store import NotFound, Store
from gpuyard.state.workqueues import ObjectKey, Requeue, Watch
from gpuyard.state.writing import Writer, identified

__all__ = ["JobEventCleaner", "orphaned"]

log = structlog.get_logger(__name__)


def orphaned(store: Store, ev: Event, *, groups: Iterable[str]) -> bool:
    """Whether `ev` is about a job (of an API group in `groups`) that the store does not hold
    with the Event's `involvedObject.uid`. Events without the `job-name` label, and the
    `InvalidSpec` Events of jobs kept out of the store on purpose, never are."""
    if LABEL_JOB_NAME not in ev.metadata.labels or ev.reason == INVALID_SPEC:
        return False
    involved = ev.involved_object
    kind, api_version = involved.get("kind", ""), involved.get("apiVersion", "")
    if kind not in KIND_INFO or api_version.split("/")[0] not in set(groups):
        return False
    job = store.get(kind, involved.get("namespace") or ev.metadata.namespace, involved.get("name", ""))
    return job is None or job.metadata.uid != involved.get("uid")


def _labelled(obj: Event) -> Iterable[ObjectKey]:
    return ((obj.metadata.namespace, obj.metadata.name),) if LABEL_JOB_NAME in obj.metadata.labels else ()


class JobEventCleaner:
    """See the module docstring."""

    name = "job-event-cleaner"
    needs_leader = True  # deletes Events
    concurrency = 1

    def __init__(self, ctx: Context, *, confirm: float = 1.0) -> None:
        if ctx.writer is None:  # pragma: no cover - Context always sets one
            raise RuntimeError("the job event cleaner needs a writer (ctx.writer)")
        self.store = ctx.store
        self.clock = ctx.clock
        self.writer: Writer = identified(ctx.writer, OPERATOR)
        self.groups = frozenset(ctx.settings.backend.kubernetes.job_groups)
        self.confirm = confirm
        self.watches: Sequence[Watch] = (Watch("Event", _labelled),)
        self._suspects: dict[ObjectKey, tuple[str, float]] = {}  # found orphaned: (uid, since when)
        self.deleted = 0

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        ev = self.store.get_of(Event, *key)
        if ev is None or not orphaned(self.store, ev, groups=self.groups):
            self._suspects.pop(key, None)
            return None
        now = self.clock.now()
        uid, since = self._suspects.get(key, ("", now))
        if uid != ev.metadata.uid:
            since = now
            self._suspects[key] = (ev.metadata.uid, since)
        if now - since < self.confirm:
            return Requeue(after=since + self.confirm - now)  # found so again then: really gone
        del self._suspects[key]
        try:
            await self.writer.delete("Event", *key)
        except NotFound:
            return None
        self.deleted += 1
        log.info(
            "job.event_deleted",
            name="/".join(key),
            job=f"{ev.involved_object.get('kind')} {ev.involved_object.get('name')}",
            why="its job is gone",
        )
        return None
