"""The job reconciler: one level-triggered loop for every job kind.

For a job key it reads the job and everything the job owns (pods, services, reservations, its
PodGroup) and moves the world one step towards the job's spec:

1. conditions first seen: Created; a finished job: clean up (cleanPodPolicy), TTL; a suspended
   job: drop pods and reservations, keep the job;
2. finished pods through the restart-policy table (`restarting.py`): restart (counted against
   `backoffLimit`), or fail the job; then the plugin's success rule; `activeDeadlineSeconds`;
3. the PodGroup (gang) from the job (`podgroups.py`); on failover the pods that must move lose their
   reservation and the PodGroup records the node they ran on (`spec.preferredNodes`);
4. one Service per placed replica (host-network: its targetPort follows the pod's host port),
   then the pods whose reservations exist, in start order (`ordering.py`), through the backend;
   a refused create un-assumes the unmaterialised reservations and requeues.

Status (conditions, replica statuses, restart records) is written *before* pods or reservations
are deleted, so a crash or a conflicting write never loses or double-counts a restart: each
restart is recorded with the uid of the failed pod it replaces. All timing uses the clock.

The status side of a pass (`_set`, `_progress`, replica statuses, the status write, events) is
in `reporting.py` (:class:`ReportingMixin`); creating services and pods through the backend,
un-assuming on a refused create and the delete helpers are in `applying.py` (:class:`ApplyingMixin`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

import structlog

from gpuyard.apis.core import Pod, Service
from gpuyard.apis.devicematching import unhealthy_indices
from gpuyard.apis.jobkinds import KIND_INFO, TrainingJob, find_job
from gpuyard.apis.jobspecs import JobStatus, PodRestart
from gpuyard.apis.meta import deep_copy
from gpuyard.apis.scheduling import LABEL_JOB_NAME, PodGroup, Reservation
from gpuyard.controllers.applying import ApplyingMixin
from gpuyard.controllers.judging import Replica, judge, uncounted
from gpuyard.controllers.metrics import job_metrics
from gpuyard.controllers.podgroups import ANNOTATION_JOB_GENERATION, build_pod_group, pod_group_spec
from gpuyard.controllers.reporting import ReportingMixin
from gpuyard.controllers.restarting import Ending, needs_new_placement
from gpuyard.controllers.workloads.base import WorkloadPlugin, replica_name
from gpuyard.controllers.workloads.registry import plugin_for
from gpuyard.state.backend import ClusterBackend
from gpuyard.state.context import Context
from gpuyard.state.workqueues import ObjectKey, Requeue, Watch

__all__ = ["JobReconciler"]

log = structlog.get_logger(__name__)

ACTIVE = ("Pending", "Running", "Unknown")


def _job_key(obj: object) -> Iterable[ObjectKey]:
    labels = obj.metadata.labels  # type: ignore[attr-defined]
    name = labels.get(LABEL_JOB_NAME)
    return ((obj.metadata.namespace, name),) if name else ()  # type: ignore[attr-defined]


def _owner_uid(obj: Pod | Service | PodGroup) -> str | None:
    for ref in obj.metadata.owner_references:
        if ref.kind in KIND_INFO:
            return ref.uid
    return None


@dataclass(slots=True)
class Observed:
    """Everything a job owns, read once per pass."""

    replicas: list[Replica]
    extra_pods: list[Pod]  # pods of this job that no replica wants (scaled in, renamed roles)
    stale_pods: list[Pod]  # pods of an earlier job of the same name
    reservations: dict[str, Reservation]
    services: dict[str, Service]
    pod_group: PodGroup | None


@dataclass(slots=True)
class Actions:
    """What a pass decided to do after the status is written."""

    delete_pods: list[Pod] = field(default_factory=list)
    delete_reservations: list[Reservation] = field(default_factory=list)
    moves: dict[str, str] = field(default_factory=dict)  # pod name -> node it ran on
    events: list[tuple[str, str, bool]] = field(default_factory=list)  # reason, message, warning


class JobReconciler(ReportingMixin, ApplyingMixin):
    """Reconciles every training job kind through its workload plugin."""

    name = "job-operator"

    def __init__(self, ctx: Context, *, concurrency: int | None = None) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.clock = ctx.clock
        self.settings = ctx.settings.operator
        self.concurrency = concurrency or self.settings.concurrency
        self.watches = (
            *(Watch(kind) for kind in KIND_INFO),
            Watch("Pod", _job_key),
            Watch("Reservation", _job_key),
            Watch("PodGroup"),
        )
        self._create_failures: dict[ObjectKey, int] = {}
        self.metrics = job_metrics(ctx.registry)

    @property
    def backend(self) -> ClusterBackend:
        if self.ctx.backend is None:
            raise RuntimeError("the job operator needs a cluster backend (ctx.backend)")
        return self.ctx.backend

    # --- entry ---------------------------------------------------------------------------------

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        namespace, name = key
        job = find_job(self.store, namespace, name)
        if job is None:
            self.metrics.deleted(key)
            await self._delete_children(namespace, name)
            self._create_failures.pop(key, None)
            return None
        return await self._sync(job)

    # --- observation ---------------------------------------------------------------------------

    def _observe(self, job: TrainingJob) -> Observed:
        ns, name = job.metadata.namespace, job.metadata.name
        selector = {LABEL_JOB_NAME: name}
        pods: dict[str, Pod] = {}
        stale: list[Pod] = []
        for pod in self.store.list("Pod", namespace=ns, selector=selector):
            owner = _owner_uid(pod)  # type: ignore[arg-type]
            if owner is None:
                continue  # not ours
            if owner != job.metadata.uid:
                stale.append(pod)  # type: ignore[arg-type]
            else:
                pods[pod.metadata.name] = pod  # type: ignore[assignment]
        reservations = {
            r.metadata.name: r
            for r in self.store.list("Reservation", namespace=ns, selector=selector)
            if r.spec.pod_group == name  # type: ignore[attr-defined]
        }
        services = {s.metadata.name: s for s in self.store.list("Service", namespace=ns, selector=selector)}
        replicas = []
        for role in job.roles():
            for index in range(job.replica_specs[role].count):
                rname = replica_name(name, role, index)
                replicas.append(Replica(role, index, rname, pods.pop(rname, None), reservations.get(rname)))  # type: ignore[arg-type]
        pg = self.store.get("PodGroup", ns, name)
        return Observed(replicas, list(pods.values()), stale, reservations, services, pg)  # type: ignore[arg-type]

    # --- the pass ------------------------------------------------------------------------------

    async def _sync(self, job: TrainingJob) -> Requeue | None:
        now = self.clock.utcnow()
        plugin = plugin_for(job.kind)
        obs = self._observe(job)
        status = deep_copy(job.status)
        acts = Actions()
        for pod in obs.stale_pods:
            await self._delete_pod(pod)
        if obs.pod_group is not None and _owner_uid(obs.pod_group) not in (None, job.metadata.uid):
            # the gang of an earlier job of the same name: its placement is not ours
            self._delete_quietly("PodGroup", obs.pod_group.metadata.namespace, obs.pod_group.metadata.name)
            for res in obs.reservations.values():
                self._delete_reservation(res)
            obs = self._observe(job)
        if status.condition("Created") is None:
            self._set(
                job,
                status,
                acts,
                "Created",
                self._reason(job, "Created"),
                f"{job.kind} {job.metadata.name} is created.",
                now,
            )
        if status.finished:
            return await self._finished(job, status, obs, acts, now)
        if job.suspended:
            return await self._suspend(job, plugin, status, obs, acts, now)
        if status.is_true("Suspended"):
            status.start_time = None
            self._set(
                job,
                status,
                acts,
                "Suspended",
                self._reason(job, "Resumed"),
                f"{job.kind} {job.metadata.name} is resumed.",
                now,
                true=False,
            )
            status.phase = "Created"

        verdict = judge(job, plugin, status, obs.replicas, now)
        terminal, restarts = verdict.terminal, verdict.restarts
        if terminal is not None:
            type_, reason, message = terminal
            status.completion_time = now
            self._set(job, status, acts, type_, reason, message, now, warning=type_ == "Failed")
            self._replica_statuses(job, status, obs)
            self._write_status(job, status, now)
            self._emit(job, acts, now)
            return await self._finished(job, status, self._observe(job), Actions(), now, written=True)

        self._plan_restarts(job, status, obs, restarts, acts, now)
        pod_group = self._ensure_pod_group(job, plugin, obs.pod_group, acts)
        restarted = {p.metadata.name for p in acts.delete_pods}
        moved = {r.metadata.name for r in acts.delete_reservations}
        live = {r.name: r.pod for r in obs.replicas if r.pod is not None and r.name not in restarted}
        held = {n: r for n, r in obs.reservations.items() if n not in moved}
        # a running pod whose reservation the scheduler took away (preemption) must stop
        preempted = []
        for rep in obs.replicas:
            pod = live.get(rep.name)
            if pod is not None and rep.name not in held and pod.status.phase in ACTIVE:
                acts.delete_pods.append(pod)
                live.pop(rep.name)
                preempted.append(rep.name)
        if preempted:
            message = f"{job.kind} {job.metadata.name} is restarting because {len(preempted)} replica(s) lost their placement: {', '.join(preempted)}."
            self._restarting(job, status, acts, message, now)
        acts.delete_pods.extend(obs.extra_pods)
        to_create = self._plan_creates(job, plugin, status, obs, live, held, pod_group)
        self._progress(job, status, obs, live, held, pod_group, bool(restarts or preempted), acts, now)
        self._replica_statuses(job, status, obs, live=live)
        self._write_status(job, status, now)

        for pod in acts.delete_pods:
            await self._delete_pod(pod)
        for res in acts.delete_reservations:
            self._delete_reservation(res)
        requeue = await self._materialize(job, plugin, obs, held, to_create, acts, now)
        self._emit(job, acts, now)
        return requeue or self._deadline_requeue(job, status, now)

    # --- judging finished pods -----------------------------------------------------------------

    def _plan_restarts(
        self,
        job: TrainingJob,
        status: JobStatus,
        obs: Observed,
        restarts: list[tuple[Replica, Ending]],
        acts: Actions,
        now: datetime,
    ) -> None:
        if not restarts:
            return
        per_role: dict[str, int] = {}
        exited_ok = 0
        for rep, ending in restarts:
            assert rep.pod is not None
            if uncounted(status, rep):
                record = status.pod_restarts.setdefault(rep.name, PodRestart())
                record.count += 1
                record.last_uid = rep.pod.metadata.uid
                status.restarts += 1
                if ending.exit_code is not None:
                    acts.events.append(
                        (
                            "ExitedWithCode",
                            f"Pod: {rep.pod.metadata.namespace}.{rep.name} exited with code {ending.exit_code}",
                            False,
                        )
                    )
            acts.delete_pods.append(rep.pod)
            if ending.phase == "Failed":
                per_role[rep.role] = per_role.get(rep.role, 0) + 1
            else:
                exited_ok += 1
            node = rep.reservation.spec.node if rep.reservation is not None else rep.pod.spec.node_name
            move = (
                job.host_network
                or needs_new_placement(ending)
                or (rep.reservation is not None and not self._placement_healthy(rep.reservation))
            )
            if move:
                if rep.reservation is not None:
                    acts.delete_reservations.append(rep.reservation)
                if node:
                    acts.moves[rep.name] = node
        name = f"{job.kind} {job.metadata.name}"
        if per_role:
            parts = ", ".join(f"{n} {role}" for role, n in per_role.items())
            message = f"{name} is restarting because {parts} replica(s) failed."
        else:
            message = (
                f"{name} is restarting because {exited_ok} replica(s) exited and restartPolicy is Always."
            )
        self._restarting(job, status, acts, message, now)

    def _restarting(
        self, job: TrainingJob, status: JobStatus, acts: Actions, message: str, now: datetime
    ) -> None:
        """Enter Restarting with a Warning event every time (each restart is news)."""
        self._set(
            job,
            status,
            acts,
            "Restarting",
            self._reason(job, "Restarting"),
            message,
            now,
            warning=True,
            force_event=True,
        )

    def _placement_healthy(self, res: Reservation) -> bool:
        node = self.store.get("Node", "", res.spec.node)
        if node is None or not node.ready:  # type: ignore[attr-defined]
            return False
        bad = set(unhealthy_indices(node))  # type: ignore[arg-type]
        if "NodeTopology" in self.store.kinds():
            topo = self.store.get("NodeTopology", "", res.spec.node)
            for gpu in getattr(getattr(topo, "spec", None), "gpus", None) or []:
                if getattr(gpu, "health", "Healthy") != "Healthy":
                    bad.add(gpu.index)
        return not (bad & set(res.spec.gpus))

    # --- gang ------------------------------------------------------------------------------------

    def _ensure_pod_group(
        self, job: TrainingJob, plugin: WorkloadPlugin, pg: PodGroup | None, acts: Actions
    ) -> PodGroup:
        domain = self.settings.cluster_domain
        if pg is None:
            return self.store.create(
                build_pod_group(job, plugin, cluster_domain=domain, preferred_nodes=acts.moves)
            )
        generation = str(job.metadata.generation)
        if pg.metadata.annotations.get(ANNOTATION_JOB_GENERATION) == generation and not acts.moves:
            return pg  # nothing to change: no copy (a waiting job is looked at often)
        copy = pg.clone()
        changed = False
        if copy.metadata.annotations.get(ANNOTATION_JOB_GENERATION) != generation:
            copy.spec = pod_group_spec(
                job, plugin, cluster_domain=domain, preferred_nodes=copy.spec.preferred_nodes
            )
            copy.metadata.annotations[ANNOTATION_JOB_GENERATION] = generation
            changed = True
        if acts.moves:
            copy.spec.preferred_nodes.update(acts.moves)
            copy.status.phase = "Pending"
            copy.status.reason = "Failover"
            copy.status.message = "re-placing " + ", ".join(sorted(acts.moves))
            changed = True
        return self.store.update(copy) if changed else pg

    # --- suspension, completion, deletion ------------------------------------------------------

    async def _suspend(
        self,
        job: TrainingJob,
        plugin: WorkloadPlugin,
        status: JobStatus,
        obs: Observed,
        acts: Actions,
        now: datetime,
    ) -> Requeue | None:
        if not status.is_true("Suspended"):
            status.start_time = None
            self._set(
                job,
                status,
                acts,
                "Suspended",
                self._reason(job, "Suspended"),
                f"{job.kind} {job.metadata.name} is suspended.",
                now,
            )
        self._replica_statuses(job, status, obs, live={})
        self._write_status(job, status, now)
        for rep in obs.replicas:
            if rep.pod is not None:
                await self._delete_pod(rep.pod)
        for pod in obs.extra_pods:
            await self._delete_pod(pod)
        for res in obs.reservations.values():
            self._delete_reservation(res)
        self._ensure_pod_group(job, plugin, obs.pod_group, acts)
        self._emit(job, acts, now)
        return None

    async def _finished(
        self,
        job: TrainingJob,
        status: JobStatus,
        obs: Observed,
        acts: Actions,
        now: datetime,
        *,
        written: bool = False,
    ) -> Requeue | None:
        if not written:
            self._write_status(job, status, now)
            self._emit(job, acts, now)
        policy = job.run_policy.clean_pod_policy or "Running"
        for pod in [*(r.pod for r in obs.replicas if r.pod is not None), *obs.extra_pods]:
            if policy == "All" or (policy == "Running" and pod.status.phase in ACTIVE):
                await self._delete_pod(pod)
                if pod.metadata.name in obs.services:
                    await self.backend.delete_service(pod.metadata.namespace, pod.metadata.name)
        for res in obs.reservations.values():
            self._delete_reservation(res)
        if obs.pod_group is not None:
            self._delete_quietly("PodGroup", obs.pod_group.metadata.namespace, obs.pod_group.metadata.name)
        ttl = job.run_policy.ttl_seconds_after_finished
        if ttl is None:
            return None
        finished_at = (status.completion_time or now).timestamp()
        remaining = finished_at + ttl - now.timestamp()
        if remaining > 0:
            return Requeue(after=remaining)
        log.info(
            "job.ttl_expired", job=f"{job.metadata.namespace}/{job.metadata.name}", kind=job.kind, ttl=ttl
        )
        self._delete_quietly(job.kind, job.metadata.namespace, job.metadata.name)
        await self._delete_children(job.metadata.namespace, job.metadata.name)
        return None

    async def _delete_children(self, ns: str, name: str) -> None:
        """The job is gone: delete its pods, services, reservations, PodGroup and events."""
        selector = {LABEL_JOB_NAME: name}
        for pod in self.store.list("Pod", namespace=ns, selector=selector):
            if _owner_uid(pod) is not None:  # type: ignore[arg-type]
                await self._delete_pod(pod)  # type: ignore[arg-type]
        for svc in self.store.list("Service", namespace=ns, selector=selector):
            if _owner_uid(svc) is not None:  # type: ignore[arg-type]
                await self.backend.delete_service(ns, svc.metadata.name)
        for res in self.store.list("Reservation", namespace=ns, selector=selector):
            if res.spec.pod_group == name:  # type: ignore[attr-defined]
                self._delete_reservation(res)  # type: ignore[arg-type]
        self._delete_quietly("PodGroup", ns, name)
        for ev in self.store.list("Event", namespace=ns, selector=selector):
            self._delete_quietly("Event", ns, ev.metadata.name)
