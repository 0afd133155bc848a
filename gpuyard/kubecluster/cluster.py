"""`KubeCluster`: the `ClusterBackend` over a real (or test) Kubernetes API server.

`run()` connects (kubeconfig, `$KUBECONFIG`, or the in-cluster service account), starts one
informer per watched resource (Nodes, Pods, Services, ResourceQuotas, PodDisruptionBudgets,
PriorityClasses, and gpuyard's custom resources: the job kinds of the configured `job_groups`,
PodGroups, Reservations, ResourceClasses, NodeTopologies, Queues, ElasticQuotas; in delegate mode
the PodGroups of the configured gang scheduler), two scoped informers (`informer_scope`): the
Events gpuyard wrote about jobs (label `job-name`: a new process or leader finds them, so a repeat
is aggregated, `describe job` shows them, and the operator deletes a deleted job's, even one
deleted while no leader ran: `controllers/eventcleaning.py`) and the nodes'
heartbeat Leases in `node_lease_namespace` (a stale one makes its node NotReady in gpuyard's
view: `heartbeats.py`); then the leader elector (it stands for the lead only once every
informer has listed), the lost-node watcher, the sweep of pods a dead leader created but never
bound (`orphans.py`) and the reporter of job custom resources that fail validation
(`invalid.py`), and sets `synced` once every informer has listed. `healthy()` is False while any watch is broken. With `dra` on or
auto, the writer gives placed pods ResourceClaims (`dra.py`). The store is the informers' cache:
objects keep the API server's resourceVersions, and nothing is journaled (the API server is the
store of record).

What the backend writes itself (the lost-node and unhealthy-GPU pod failures, the orphan sweep,
DRA claims, the reports of invalid jobs, its Events through `events`, an Event recorder) it
writes as `BACKEND` (`state.ownership`): its tasks run `acting_as(BACKEND)`, so every such request
carries `fieldManager: gpuyard-backend`.

The writer (:class:`~gpuyard.kubecluster.writing.KubeWriter`) exists from construction, but its
client is connected in `run()`: a write before that fails with `BackendError`. `leadership` is
the Lease elector (or None when `leader_election.enabled` is false: a single replica leads).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import structlog

from gpuyard.apis.addons import ADDON_KINDS
from gpuyard.apis.core import Pod
from gpuyard.apis.leases import Lease
from gpuyard.apis.meta import Resource
from gpuyard.apis.resources import API_RESOURCES, ApiResource
from gpuyard.apis.scheduling import LABEL_JOB_NAME
from gpuyard.kubecluster.client import ApiError, KubeClient
from gpuyard.kubecluster.dra import DraAllocator
from gpuyard.kubecluster.informing import Informer, Mirror
from gpuyard.kubecluster.invalid import InvalidJobs
from gpuyard.kubecluster.leading import LeaderElector
from gpuyard.kubecluster.nodes import NodeModel
from gpuyard.kubecluster.orphans import OrphanSweeper
from gpuyard.kubecluster.podlogs import open_pod_log
from gpuyard.kubecluster.trimming import Trimmer
from gpuyard.kubecluster.writing import KubeWriter
from gpuyard.state.backend import BackendError, FaultInjector, Leadership
from gpuyard.state.config import KubernetesConfig
from gpuyard.state.context import Context
from gpuyard.state.events import EventRecorder
from gpuyard.state.ownership import BACKEND
from gpuyard.state.writing import acting_as

__all__ = ["KubeCluster", "informer_scope", "watched_resources"]

_ADDONS = frozenset(cls.KIND for cls in ADDON_KINDS)

log = structlog.get_logger(__name__)


def watched_resources(
    kinds: list[str], *, job_groups: list[str], gang_scheduler: str | None = None
) -> list[ApiResource]:
    """The resources to watch: every kind the store knows (but those not `watched`: ConfigMaps),
    job kinds only in the configured groups, a gang scheduler's PodGroups only of `gang_scheduler`
    (delegate mode)."""
    known = set(kinds)
    out = []
    for res in API_RESOURCES:
        if res.kind not in known or not res.watched:
            continue
        if res.categories and "trainingjobs" in res.categories and res.group not in job_groups:
            continue
        if res.gang_scheduler and res.gang_scheduler != gang_scheduler:
            continue
        out.append(res)
    return out


def informer_scope(res: ApiResource, config: KubernetesConfig) -> tuple[str | None, str | None]:
    """(namespace, label selector) of the informer of `res`; None: all of it.

    Events: only those labelled `job-name` (gpuyard's own about jobs; the Events it writes about
    nodes are never read back); Deployments, Ingresses and HorizontalPodAutoscalers likewise (a
    job's Tensorboard, Mars web UI and autoscaler, `apis/addons.py`), never the cluster's others.
    Leases: only the nodes' heartbeats in `node_lease_namespace` (the leader elector reads its own
    Lease itself)."""
    if res.kind == "Event" or res.kind in _ADDONS:
        return None, LABEL_JOB_NAME
    if res.kind == Lease.KIND:
        return config.node_lease_namespace, None
    return None, None


class KubeCluster:
    """The Kubernetes backend; see the module docstring."""

    name = "kubernetes"
    faults: FaultInjector | None = None  # a real cluster's faults are real

    def __init__(self, ctx: Context, *, client: KubeClient | None = None) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.clock = ctx.clock
        self.config: KubernetesConfig = ctx.settings.backend.kubernetes
        scheduler = ctx.settings.scheduler
        self.gang_scheduler = scheduler.gang_scheduler if scheduler.mode == "delegate" else None
        self.synced = asyncio.Event()
        self._client = client
        ctx.store.register(Lease)  # the nodes' heartbeats; Kubernetes mode only (never journaled)
        self.elector: LeaderElector | None = None
        if self.config.leader_election.enabled:
            self.elector = LeaderElector(
                client=client,
                clock=self.clock,
                namespace=self.config.namespace,
                config=self.config.leader_election,
            )
        self.nodes = NodeModel(
            store=ctx.store,
            clock=ctx.clock,
            node_lost_grace=self.config.node_lost_grace,
            node_monitor_grace=self.config.node_monitor_grace,
            lease_namespace=self.config.node_lease_namespace,
            is_leader=self._is_leader,
            scheduler_name=ctx.settings.scheduler.name,
            delegated_to=ctx.settings.scheduler.pod_scheduler_name if self.gang_scheduler else None,
        )
        self.writer = KubeWriter(
            scheduler_name=ctx.settings.scheduler.name,
            gpu_resource=self.config.device_resource,
            client=client,
            store=ctx.store,
            may_write=self._why_not_write,
        )
        self.nodes.writer = self.writer
        self.orphans = OrphanSweeper(
            store=ctx.store, writer=self.writer, clock=ctx.clock, is_leader=self._is_leader
        )
        self.events = EventRecorder(
            component=BACKEND, store=ctx.store, writer=self.writer, now=ctx.clock.utcnow
        )
        self.invalid_jobs = InvalidJobs(clock=ctx.clock, may_write=self._why_not_write, events=self.events)
        self.invalid_jobs.revisit = self._revisit
        self._refetches: set[asyncio.Task[None]] = set()
        self.informers: list[Informer] = []
        ours = {ctx.settings.scheduler.name}
        if self.gang_scheduler:
            ours.add(ctx.settings.scheduler.pod_scheduler_name)
        self.trimmer = Trimmer(ours=frozenset(ours))  # the transform on informer objects

    # --- ClusterBackend ------------------------------------------------------------------------

    @property
    def leadership(self) -> Leadership | None:
        return self.elector

    def healthy(self) -> bool:
        return bool(self.informers) and all(i.healthy for i in self.informers)

    async def pod_log(
        self, pod: Pod, *, container: str, follow: bool = False, tail_lines: int | None = None
    ) -> AsyncIterator[str]:
        """The container's log through the API server's `pods/log` (`PodLogs`, `podlogs.py`)."""
        client = self.writer.client
        if client is None:
            raise ApiError("pod logs: not connected to the API server yet")
        return await open_pod_log(
            client.api,
            pod.metadata.namespace,
            pod.metadata.name,
            container=container,
            follow=follow,
            tail_lines=tail_lines,
            timeout=self.config.request_timeout,
        )

    def _is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    def _why_not_write(self) -> str | None:
        if self.elector is None or self.elector.is_leader():
            return None
        return f"not the leader; the leader is {self.elector.holder or 'not elected yet'}"

    # --- running -------------------------------------------------------------------------------

    def _mirror_for(self, res: ApiResource) -> Mirror | None:
        if res.kind == "Node":
            return self.nodes
        if res.kind == "Pod":
            return self.nodes.pod_mirror()
        if res.kind == "NodeTopology":
            return self.nodes.topology_mirror()
        if res.kind == Lease.KIND:
            return self.nodes.lease_mirror()
        return None

    def _build(self, client: KubeClient) -> None:
        cfg = self.config
        self.writer.client = client
        if cfg.dra_mode != "off":
            self.writer.dra = DraAllocator(
                client=client, store=self.store, mode=cfg.dra_mode, events=self.events
            )
        if cfg.gpu_resource == "nvidia.com/gpu":
            log.warning(
                "kube.gpu_resource.count_only",
                message=(
                    "backend.kubernetes.gpu_resource is nvidia.com/gpu: NVIDIA's device plugin picks each pod's "
                    "GPUs, which may differ from the ones gpuyard chose (topology, health, its books); use auto"
                ),
            )
        if self.elector is not None:
            self.elector.client = client
        self.invalid_jobs.client = client
        self.informers = []
        gang = self.gang_scheduler
        for res in watched_resources(
            self.store.kinds(), job_groups=list(cfg.job_groups), gang_scheduler=gang
        ):
            cls: type[Resource] = self.store.kind_class(res.kind)
            namespace, selector = informer_scope(res, cfg)
            self.informers.append(
                Informer(
                    client=client,
                    resource=res,
                    cls=cls,
                    store=self.store,
                    clock=self.clock,
                    mirror=self._mirror_for(res),
                    watch_timeout=cfg.watch_timeout,
                    inactivity_timeout=cfg.inactivity_timeout,
                    backoff_max=cfg.backoff_max,
                    invalid=self.invalid_jobs if "trainingjobs" in res.categories else None,
                    namespace=namespace,
                    selector=selector,
                    page_size=cfg.list_page_size,
                    transform=self.trimmer,
                )
            )

    async def _connect(self) -> KubeClient:
        if self._client is not None:
            return self._client
        cfg = self.config
        try:
            return await KubeClient.connect(
                kubeconfig=cfg.kubeconfig, context=cfg.context, request_timeout=cfg.request_timeout
            )
        except ApiError as exc:
            raise BackendError(str(exc)) from None

    def _revisit(self, resource: ApiResource, namespace: str, name: str) -> None:
        """Fetch a job that lost a name clash again through its informer (the winner is gone)."""
        for informer in self.informers:
            if informer.resource == resource:
                task = asyncio.get_running_loop().create_task(informer.refetch(namespace, name))
                self._refetches.add(task)
                task.add_done_callback(self._refetches.discard)
                return

    async def _campaign(self, elector: LeaderElector) -> None:
        """Stand for the lead only once every informer has listed: a replica that cannot sync (a
        CRD missing, no access) never takes the Lease from one that could lead."""
        await self.synced.wait()
        await elector.run()

    async def _wait_synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self.informers))
        self.nodes.republish()
        self.synced.set()
        log.info(
            "kube.synced",
            resources=len(self.informers),
            nodes=self.store.count("Node"),
            pods=self.store.count("Pod"),
        )

    async def run(self) -> None:
        client = await self._connect()
        owned = self._client is None
        self._build(client)
        log.info("kube.connected", host=client.host, watching=[i.name for i in self.informers])
        try:
            with acting_as(BACKEND):  # the tasks below inherit it: what they write is the backend's
                async with asyncio.TaskGroup() as tg:
                    for informer in self.informers:
                        tg.create_task(informer.run(), name=f"informer:{informer.name}")
                    tg.create_task(self._wait_synced(), name="kube:synced")
                    tg.create_task(self.nodes.run(), name="kube:node-lost")
                    tg.create_task(self.orphans.run(), name="kube:orphan-pods")
                    tg.create_task(self.invalid_jobs.run(), name="kube:invalid-jobs")
                    if self.elector is not None:
                        tg.create_task(self._campaign(self.elector), name="kube:leader-election")
        finally:
            if owned:
                await client.close()
