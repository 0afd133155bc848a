"""Pods a leader created but never bound: finish or undo them, on the leader.

The writer creates a pod unbound and binds it right after (`pods/binding`). A leader that dies
(or loses the lease) between the two leaves a pod with `schedulerName: gpuyard` and no node on
the API server; nobody else binds it, and the operator of the next leader sees it as existing and
waits for it. :class:`OrphanSweeper` runs on the leader: a gpuyard pod that has been unbound for
two sweeps in a row and is not being created by this process's writer now is

* bound to the node it was created for (annotation `gpuyard.io/assigned-node`, written by the
  writer at create) when its Reservation (same namespace and name) is still on that node, since
  the scheduler's view already counts it there;
* deleted otherwise (its placement is gone): the operator creates it again once placed.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from gpuyard.apis.core import Pod
from gpuyard.apis.scheduling import Reservation
from gpuyard.kubecluster.client import ApiError
from gpuyard.kubecluster.writing import ANNOTATION_ASSIGNED_NODE, KubeWriter
from gpuyard.state.backend import BackendError
from gpuyard.state.clock import Clock
from gpuyard.state.store import AlreadyExists, Conflict, NotFound, Store

__all__ = ["OrphanSweeper"]

log = structlog.get_logger(__name__)


class OrphanSweeper:
    """See the module docstring."""

    def __init__(
        self,
        *,
        store: Store,
        writer: KubeWriter,
        clock: Clock,
        is_leader: Callable[[], bool],
        interval: float = 1.0,
    ) -> None:
        self.store = store
        self.writer = writer
        self.clock = clock
        self.is_leader = is_leader
        self.interval = interval
        self._suspects: set[tuple[str, str, str]] = set()  # (namespace, name, uid) seen unbound once
        self.bound = 0
        self.deleted = 0

    def _unbound(self) -> list[Pod]:
        ours = self.writer.scheduler_name
        return [
            p
            for p in self.store.all_of(Pod)  # every second over every pod: no sort
            if p.spec.scheduler_name == ours
            and not p.spec.node_name
            and p.status.phase == "Pending"
            and p.metadata.deletion_timestamp is None
        ]

    async def sweep(self) -> int:
        """One pass; returns how many orphans were bound or deleted."""
        if not self.is_leader():
            self._suspects.clear()
            return 0
        done = 0
        seen: set[tuple[str, str, str]] = set()
        for pod in self._unbound():
            ns, name = pod.metadata.namespace, pod.metadata.name
            key = (ns, name, pod.metadata.uid)
            if (ns, name) in self.writer.in_flight:
                continue
            seen.add(key)
            if key not in self._suspects:
                continue
            node = pod.metadata.annotations.get(ANNOTATION_ASSIGNED_NODE)
            res = self.store.get_of(Reservation, ns, name)
            try:
                if node and res is not None and res.spec.node == node:
                    await self.writer.bind(pod, node)
                    self.bound += 1
                    log.info("kube.orphan_bound", pod=f"{ns}/{name}", node=node)
                else:
                    await self.writer.delete("Pod", ns, name)
                    self.deleted += 1
                    log.info("kube.orphan_deleted", pod=f"{ns}/{name}", reason="its placement is gone")
                done += 1
            except (NotFound, Conflict, AlreadyExists, ApiError, BackendError) as exc:
                log.warning("kube.orphan_failed", pod=f"{ns}/{name}", error=str(exc))
        self._suspects = seen
        return done

    async def run(self) -> None:
        while True:
            await self.clock.sleep(self.interval)
            await self.sweep()
