"""The job reconciler's backend side: creating services and pods, un-assuming, deleting.

:class:`ApplyingMixin` is the part of :class:`gpuyard.controllers.reconciling.JobReconciler`
that carries out what a pass decided: `_plan_creates` picks the replicas whose pods may be
created now (the gang minimum placed, start order from `ordering.py`), `_materialize` applies
one Service per placed replica and then creates those pods through the backend (built by
`materializing.py`), `_host_port` gives a host-network replica a port when the scheduler
assigned none, `_unassume` answers a refused create by releasing the reservations that have no
pod and requeueing with backoff, and the `_delete_*` helpers remove pods (through the backend),
reservations and other objects (ignoring ones already gone). It is a mixin: `store`, `backend`,
`settings`, `_create_failures` and the pass records come from `reconciling.py`.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import structlog

from gpuyard.apis.core import Pod
from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.jobspecs import JobStatus
from gpuyard.apis.scheduling import LABEL_JOB_NAME, PodGroup, Reservation
from gpuyard.controllers.judging import Replica
from gpuyard.controllers.materializing import build_pod, build_service
from gpuyard.controllers.ordering import can_start, dependencies_of
from gpuyard.controllers.workloads.base import WorkloadPlugin
from gpuyard.state.backend import BackendError, ClusterBackend
from gpuyard.state.store import NotFound, Store
from gpuyard.state.workqueues import ObjectKey, Requeue

if TYPE_CHECKING:
    from gpuyard.controllers.reconciling import Actions, Observed
    from gpuyard.state.config import OperatorConfig

__all__ = ["ApplyingMixin"]

log = structlog.get_logger(__name__)


class ApplyingMixin:
    """Creates and deletes a job's children through the backend and store (a mixin of `JobReconciler`)."""

    # set by JobReconciler (`backend` is its property)
    store: Store
    backend: ClusterBackend
    settings: OperatorConfig
    _create_failures: dict[ObjectKey, int]

    # --- creating pods -------------------------------------------------------------------------

    def _plan_creates(
        self,
        job: TrainingJob,
        plugin: WorkloadPlugin,
        status: JobStatus,
        obs: Observed,
        live: dict[str, Pod],
        held: dict[str, Reservation],
        pod_group: PodGroup,
    ) -> list[Replica]:
        wanted = [r for r in obs.replicas if r.name in held and r.name not in live]
        if not wanted:
            return []
        started = status.start_time is not None or bool(live)
        if not started and len(held) < max(1, pod_group.spec.minimum()):
            return []  # the whole gang (its minimum) is placed before any pod starts
        deps = dependencies_of(job, plugin)
        replicas = {r: s.count for r, s in job.replica_specs.items()}
        phases: dict[str, dict[int, str]] = {}
        for rep in obs.replicas:
            pod = live.get(rep.name)
            if pod is not None:
                phases.setdefault(rep.role, {})[rep.index] = pod.status.phase
        return [r for r in wanted if can_start(r.role, deps=deps, replicas=replicas, phases=phases)]

    async def _materialize(
        self,
        job: TrainingJob,
        plugin: WorkloadPlugin,
        obs: Observed,
        held: dict[str, Reservation],
        to_create: list[Replica],
        acts: Actions,
        now: datetime,
    ) -> Requeue | None:
        # services first: a pod's Service (and its targetPort) is in place before the pod runs
        ports = {name: self._host_port(res) for name, res in held.items()} if job.host_network else {}
        for rep in obs.replicas:
            res = held.get(rep.name)
            if res is None:
                continue
            desired = build_service(job, rep.role, rep.index, plugin=plugin, host_port=ports.get(rep.name))
            current = obs.services.get(rep.name)
            if (
                current is None
                or current.spec != desired.spec
                or current.metadata.labels != desired.metadata.labels
            ):
                await self.backend.apply_service(desired)
        key = (job.metadata.namespace, job.metadata.name)
        domain = self.settings.cluster_domain
        for rep in to_create:
            res = held[rep.name]
            pod = build_pod(
                job,
                rep.role,
                rep.index,
                plugin=plugin,
                reservation=res,
                host_port=ports.get(rep.name),
                cluster_domain=domain,
                peers=held,
            )
            try:
                await self.backend.create_pod(pod)
            except BackendError as exc:
                return self._unassume(job, obs, held, str(exc), acts)
            acts.events.append(("SuccessfulCreatePod", f"Created pod: {rep.name}", False))
        if to_create:
            self._create_failures.pop(key, None)
        return None

    def _host_port(self, res: Reservation) -> int:
        """The reservation's host port; if the scheduler assigned none, the lowest free one on its node."""
        if res.spec.host_ports:
            return res.spec.host_ports[0]
        lo, hi = self.settings.host_port_range
        used: set[int] = set()
        for other in self.store.list("Reservation"):
            if other.spec.node == res.spec.node:  # type: ignore[attr-defined]
                used.update(other.spec.host_ports)  # type: ignore[attr-defined]
        port = next((p for p in range(lo, hi + 1) if p not in used), lo)
        current = self.store.get("Reservation", res.metadata.namespace, res.metadata.name)
        if current is not None:
            copy = current.clone()
            copy.spec.host_ports = [port]  # type: ignore[attr-defined]
            self.store.update(copy)
        log.warning(
            "job.host_port_assigned",
            reservation=f"{res.metadata.namespace}/{res.metadata.name}",
            node=res.spec.node,
            port=port,
        )
        return port

    def _unassume(
        self, job: TrainingJob, obs: Observed, held: dict[str, Reservation], error: str, acts: Actions
    ) -> Requeue:
        """A refused pod create: give back the reservations that have no pod and queue again."""
        ns, name = job.metadata.namespace, job.metadata.name
        with_pods = {
            p.metadata.name for p in self.store.list("Pod", namespace=ns, selector={LABEL_JOB_NAME: name})
        }
        released = []
        for rname, res in held.items():
            if rname not in with_pods:
                self._delete_reservation(res)
                released.append(rname)

        def pending(pg: PodGroup) -> None:
            pg.status.phase = "Pending"
            pg.status.reason = "PodCreationFailed"
            pg.status.message = error

        try:
            self.store.mutate("PodGroup", ns, name, pending)
        except NotFound:
            pass
        acts.events.append(
            (
                "FailedCreatePod",
                f"Error creating: {error}; released {len(released)} reservation(s) and queued again",
                True,
            )
        )
        key = (ns, name)
        failures = self._create_failures.get(key, 0)
        self._create_failures[key] = failures + 1
        log.warning("job.create_failed", job=f"{ns}/{name}", error=error, released=len(released))
        return Requeue(after=min(30.0, 0.5 * 2**failures))

    # --- deleting ------------------------------------------------------------------------------

    async def _delete_pod(self, pod: Pod) -> None:
        await self.backend.delete_pod(pod.metadata.namespace, pod.metadata.name)

    def _delete_reservation(self, res: Reservation) -> None:
        self._delete_quietly("Reservation", res.metadata.namespace, res.metadata.name)

    def _delete_quietly(self, kind: str, ns: str, name: str) -> None:
        try:
            self.store.delete(kind, ns, name)
        except NotFound:
            pass
