"""Events of jobs deleted while no leader ran: found on the API server, deleted by the new leader.

The operator deletes a job's Events with its pods when it sees the job go (`delete_children`).
A job deleted while no gpuyard replica led is never seen going: the API server's garbage
collector takes its pods and PodGroup (they name the job as owner), but Events have no owner and
would stay until the server's event TTL. Since the Event informer (label `job-name`) puts them in
the cache, :class:`JobEventSweeper` finds them on the leader: an Event about a job kind
(`involvedObject`) whose job the cache does not hold (or holds with another uid, a job
re-created under the same name) is deleted, except the `InvalidSpec` Events `invalid.py` writes
about jobs it keeps out of the store on purpose. Only job kinds whose informer has listed are judged,
so a job group that is not reconciled (`job_groups`) or whose CRD is missing loses nothing; an
Event is deleted only when found orphaned by two passes `confirm` seconds apart (a job and its
Events arriving from different watches can never race it). The first sweep runs once this replica
leads with a synced cache, then one every `interval` seconds (Events whose delete failed).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog

from gpuyard.apis.core import Event
from gpuyard.apis.jobkinds import KIND_INFO
from gpuyard.apis.scheduling import LABEL_JOB_NAME
from gpuyard.kubecluster.client import ApiError
from gpuyard.kubecluster.invalid import REASON as INVALID
from gpuyard.state.backend import BackendError
from gpuyard.state.clock import Clock
from gpuyard.state.store import NotFound, Store
from gpuyard.state.writing import Writer

__all__ = ["JobEventSweeper", "orphaned_events"]

log = structlog.get_logger(__name__)

EventKey = tuple[str, str, str]  # (namespace, name, uid) of an Event


def orphaned_events(store: Store, *, judged: Callable[[str, str], bool]) -> set[EventKey]:
    """The Events labelled `job-name` about a job (kind, apiVersion for which `judged` is True)
    that the store does not hold with the Event's `involvedObject.uid`."""
    out: set[EventKey] = set()
    for ev in store.list_of(Event, selector=LABEL_JOB_NAME):
        if ev.reason == INVALID:
            continue  # about a job kept out of the store on purpose (`invalid.py`), not a deleted one
        involved = ev.involved_object
        kind, api_version = involved.get("kind", ""), involved.get("apiVersion", "")
        if kind not in KIND_INFO or not judged(kind, api_version):
            continue
        ns = involved.get("namespace") or ev.metadata.namespace
        job = store.get(kind, ns, involved.get("name", ""))
        if job is not None and job.metadata.uid == involved.get("uid"):
            continue
        out.add((ev.metadata.namespace, ev.metadata.name, ev.metadata.uid))
    return out


class JobEventSweeper:
    """See the module docstring."""

    def __init__(
        self,
        *,
        store: Store,
        writer: Writer,
        clock: Clock,
        judged: Callable[[str, str], bool],
        ready: Callable[[], Awaitable[None]],
        is_leader: Callable[[], bool],
        confirm: float = 1.0,
        interval: float = 300.0,
    ) -> None:
        """`judged(kind, api_version)`: whether that job resource is watched and listed;
        `ready()`: returns once this replica leads with a synced cache."""
        self.store = store
        self.writer = writer
        self.clock = clock
        self.judged = judged
        self.ready = ready
        self.is_leader = is_leader
        self.confirm = confirm
        self.interval = interval
        self.deleted = 0

    async def sweep(self) -> int:
        """Two passes `confirm` seconds apart; delete what both found orphaned. How many went."""
        first = orphaned_events(self.store, judged=self.judged)
        if not first:
            return 0
        await self.clock.sleep(self.confirm)
        done = 0
        for ns, name, uid in first & orphaned_events(self.store, judged=self.judged):
            if not self.is_leader():
                break
            try:
                await self.writer.delete("Event", ns, name)
                done += 1
            except NotFound:
                continue
            except (ApiError, BackendError) as exc:
                log.warning("kube.job_event_delete_failed", event=f"{ns}/{name}", uid=uid, error=str(exc))
        if done:
            self.deleted += done
            log.info(
                "kube.job_events_deleted", events=done, why="their jobs were deleted while no leader ran"
            )
        return done

    async def run(self) -> None:
        while True:
            await self.ready()
            if self.is_leader():
                await self.sweep()
            await self.clock.sleep(self.interval)
