"""The node model of the Kubernetes backend: nodes as the scheduler must see them, and lost nodes.

Nodes come from the API server (the Node informer mirrors them through :class:`NodeModel`), and
three things are added on the way into the store:

* **Foreign pods take capacity.** The scheduler's snapshot counts free capacity as allocatable
  minus gpuyard's Reservations; pods it did not place (DaemonSets, other schedulers' pods) hold
  no Reservation. So the node mirrored into the store carries what is left for gpuyard: its
  `status.allocatable` less the requests of every active (not finished) pod bound to it whose
  `schedulerName` is not gpuyard, and the GPUs such pods hold are listed as unavailable in the
  `gpuyard.io/unhealthy-gpus` annotation (the highest indices no gpuyard pod or Reservation
  uses: which device a foreign pod got is the device plugin's secret). What was taken off is
  shown in annotation `gpuyard.io/foreign-usage`. In delegate mode the pods of gpuyard's jobs
  carry the gang scheduler's name but are not foreign: each is counted once, by the Reservation
  gpuyard's queue admitted it with (a pod whose Reservation is in the store), whichever node the
  gang scheduler picks. The Node on the API server is never changed by this; the cached copy
  keeps the server's resourceVersion.
* **Topology.** A node's `NodeTopology` object is used when the server has one; else one is
  derived (kept in the cache only) from the preset named by the node label
  `gpuyard.io/topology-preset` (`devices/presets.py`); else there is none and the scheduler uses
  a flat topology from the node's GPU capacity and `nvidia.com/gpu.product` label, exactly as for
  a fake cluster's node without a topology.
* **Lost nodes.** A node that disappears from the API server or turns NotReady is remembered
  with the time it was lost; after `node_lost_grace` seconds its active pods are failed with
  reason `NodeLost` (a status PATCH, as the node controller would), by the leader only.
* **Heartbeats.** A node whose Lease in the node-lease namespace was not renewed for
  `node_monitor_grace` seconds (`heartbeats.py`, checked by the same loop) counts as NotReady:
  lost since its heartbeat went stale, and published into the store with its Ready condition
  `Unknown` (reason `NodeStatusUnknown`), so the scheduler places nothing new there. A renewed
  Lease makes it Ready again; a node without a Lease is judged by its Ready condition alone.
* **Unhealthy GPUs.** A GPU its NodeTopology (the node agent's) or the node's
  `gpuyard.io/unhealthy-gpus` annotation marks unhealthy fails gpuyard's active pods holding it
  (`DeviceUnhealthy`, a status PATCH by the leader, same loop), as on the fake cluster: the
  operator's failover places them again, elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from decimal import Decimal

import structlog

from gpuyard.apis.core import GPU_RESOURCE, Node, Pod
from gpuyard.apis.devicematching import ANNOTATION_UNHEALTHY_GPUS, format_unhealthy, unhealthy_indices
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.jobkinds import KIND_INFO
from gpuyard.apis.meta import Resource
from gpuyard.apis.scheduling import LABEL_JOB_NAME, Reservation, pod_gpus
from gpuyard.devices.presets import PRESETS, get_preset
from gpuyard.devices.scenarios import LABEL_TOPOLOGY_PRESET
from gpuyard.kubecluster.heartbeats import (
    Heartbeat,
    LeaseMirror,
    heartbeat_seen,
    is_stale,
    stale_message,
    stale_since,
    with_unknown_ready,
)
from gpuyard.kubecluster.writing import SCHEDULER_NAME, KubeWriter
from gpuyard.state.clock import Clock
from gpuyard.state.config import NODE_LEASE_NAMESPACE
from gpuyard.state.store import Conflict, NotFound, Store

__all__ = [
    "ANNOTATION_DERIVED",
    "ANNOTATION_FOREIGN_USAGE",
    "NodeModel",
    "foreign_usage",
]

log = structlog.get_logger(__name__)

ANNOTATION_FOREIGN_USAGE = "gpuyard.io/foreign-usage"
ANNOTATION_DERIVED = "gpuyard.io/derived-from"
ACTIVE = ("Pending", "Running", "Unknown")
NODE_LOST = "NodeLost"
DEVICE_UNHEALTHY = "DeviceUnhealthy"  # as the fake cluster's kubelet says it (fakecluster/health.py)


def _is_foreign(pod: Pod, ours: str = SCHEDULER_NAME) -> bool:
    return (pod.spec.scheduler_name or "default-scheduler") != ours


def foreign_usage(
    pods: list[Pod], *, ours: str = SCHEDULER_NAME, reserved: Callable[[Pod], bool] = lambda _: False
) -> dict[str, Decimal]:
    """The summed requests of the active pods given that scheduler `ours` did not place (less
    those `reserved` says a Reservation already counts: delegated pods of gpuyard's jobs)."""
    total: dict[str, Decimal] = {}
    for pod in pods:
        if pod.status.phase not in ACTIVE or not _is_foreign(pod, ours) or reserved(pod):
            continue
        for name, q in pod.spec.requests().items():
            total[name] = total.get(name, Decimal(0)) + q
    return total


class NodeModel:
    """Mirror for the Node, Pod, NodeTopology and node-Lease informers; see the module docstring."""

    def __init__(
        self,
        *,
        store: Store,
        clock: Clock,
        node_lost_grace: float,
        node_monitor_grace: float = 40.0,
        lease_namespace: str = NODE_LEASE_NAMESPACE,
        is_leader: Callable[[], bool] = lambda: True,
        scheduler_name: str = SCHEDULER_NAME,
        delegated_to: str | None = None,
    ) -> None:
        self.scheduler_name = scheduler_name
        self.delegated_to = delegated_to  # delegate mode: the gang scheduler's schedulerName
        self.store = store
        self.clock = clock
        self.grace = node_lost_grace
        self.is_leader = is_leader
        self.raw: dict[str, Node] = {}  # node name -> as the API server holds it
        self.pods_on: dict[str, dict[tuple[str, str], Pod]] = {}  # node -> its pods
        self.lost_since: dict[str, float] = {}  # node -> when it went away or NotReady
        self.monitor_grace = node_monitor_grace
        self.lease_namespace = lease_namespace
        self.heartbeats: dict[str, Heartbeat] = {}  # node -> its Lease's last renewal seen
        self.stale: set[str] = set()  # nodes whose heartbeat is older than the monitor grace
        self.writer: KubeWriter | None = None
        self.pods_failed = 0
        self._pending: set[str] | None = None  # nodes to publish when a batch ends (`batched`)

    @contextmanager
    def batched(self) -> Iterator[None]:
        """Publish each node whose pods changed inside once, at the end (the Pod informer's LIST:
        its pods arrive in thousands, and re-deriving a node per pod costs a copy of the node and a
        sum over its pods each). A Node's own change is published at once."""
        if self._pending is not None:
            yield
            return
        self._pending = set()
        try:
            yield
        finally:
            pending, self._pending = self._pending, None
            for name in sorted(pending):
                self._publish(name)

    # --- Nodes ---------------------------------------------------------------------------------

    def put(self, obj: Resource) -> None:
        """The Mirror of the Node informer."""
        if not isinstance(obj, Node):
            raise TypeError(f"NodeModel mirrors Nodes, not {obj.kind}")
        name = obj.metadata.name
        self.raw[name] = obj
        self._judge(name)
        self._publish(name)
        self._derive_topology(obj)

    def _judge(self, name: str) -> None:
        """Remember whether (and since when) the node is lost: NotReady, or its heartbeat stale."""
        node = self.raw.get(name)
        if node is None:
            return  # `drop` decides for a node that went away
        beat = self.heartbeats.get(name)
        if name in self.stale and beat is not None:
            self.lost_since.setdefault(name, stale_since(beat, grace=self.monitor_grace))
        elif node.ready:
            self.lost_since.pop(name, None)
        else:
            self.lost_since.setdefault(name, self.clock.now())

    def drop(self, kind: str, namespace: str, name: str) -> None:
        self.raw.pop(name, None)
        self.store.forget("Node", "", name)
        if self.pods_on.get(name):
            self.lost_since.setdefault(name, self.clock.now())
        topo = self.store.get_of(NodeTopology, "", name)
        if topo is not None and topo.metadata.annotations.get(ANNOTATION_DERIVED):
            self.store.forget("NodeTopology", "", name)

    def _publish(self, name: str) -> None:
        """Mirror the node with the capacity foreign pods take off (see the module docstring)."""
        node = self.raw.get(name)
        if node is None:
            return
        beat = self.heartbeats.get(name)
        if name in self.stale and beat is not None:  # the copy, never the server's Node
            message = stale_message(
                namespace=self.lease_namespace, name=name, beat=beat, grace=self.monitor_grace
            )
            node = with_unknown_ready(
                node, message=message, since=stale_since(beat, grace=self.monitor_grace)
            )
        pods = list(self.pods_on.get(name, {}).values())
        usage = foreign_usage(pods, ours=self.scheduler_name, reserved=self._reserved)
        if not usage:
            if self.store.get_of(Node, "", name) is not node:
                self.store.observe(node, force=True)
            return
        adjusted = node.clone()
        alloc = adjusted.status.allocatable
        for res, q in usage.items():
            if res in alloc and res != GPU_RESOURCE:
                alloc[res] = max(Decimal(0), alloc[res] - q)
        gpus = int(usage.get(GPU_RESOURCE, Decimal(0)))
        if gpus > 0:
            count = int(alloc.get(GPU_RESOURCE, Decimal(0)))
            ours = {g for p in pods if not self._foreign(p) and p.status.phase in ACTIVE for g in pod_gpus(p)}
            ours.update(
                g for r in self.store.list_of(Reservation) if r.spec.node == name for g in r.spec.gpus
            )
            broken = set(unhealthy_indices(node))
            free = [i for i in range(count - 1, -1, -1) if i not in ours and i not in broken]
            taken = set(free[:gpus])
            adjusted.metadata.annotations[ANNOTATION_UNHEALTHY_GPUS] = format_unhealthy(broken | taken)
        adjusted.metadata.annotations[ANNOTATION_FOREIGN_USAGE] = ",".join(
            f"{k}={v}" for k, v in sorted(usage.items())
        )
        self.store.observe(adjusted, force=True)

    def _reserved(self, pod: Pod) -> bool:
        """A delegated pod of a gpuyard job, whose Reservation already counts its capacity."""
        if self.delegated_to is None or pod.spec.scheduler_name != self.delegated_to:
            return False
        if not any(ref.kind in KIND_INFO for ref in pod.metadata.owner_references):
            return False
        res = self.store.get_of(Reservation, pod.metadata.namespace, pod.metadata.name)
        job = pod.metadata.labels.get(LABEL_JOB_NAME)
        return res is not None and job is not None and res.metadata.labels.get(LABEL_JOB_NAME) == job

    def _foreign(self, pod: Pod) -> bool:
        return _is_foreign(pod, self.scheduler_name) and not self._reserved(pod)

    def republish(self) -> None:
        """Publish every node again (once every informer has listed: the Reservations that tell
        delegated pods from foreign ones may have arrived after the pods)."""
        for name in list(self.raw):
            self._publish(name)

    def _derive_topology(self, node: Node) -> None:
        name = node.metadata.name
        preset = node.metadata.labels.get(LABEL_TOPOLOGY_PRESET)
        held = self.store.get_of(NodeTopology, "", name)
        if held is not None and not held.metadata.annotations.get(ANNOTATION_DERIVED):
            return  # the server's own NodeTopology wins
        if preset not in PRESETS:
            if preset:
                log.warning(
                    "kube.unknown_topology_preset", node=name, preset=preset, allowed=", ".join(PRESETS)
                )
            if held is not None:
                self.store.forget("NodeTopology", "", name)
            return
        if held is not None and held.metadata.annotations.get(ANNOTATION_DERIVED) == f"preset:{preset}":
            return
        topo = get_preset(preset, node_name=name)
        topo.metadata.annotations[ANNOTATION_DERIVED] = f"preset:{preset}"
        topo.metadata.resource_version = "1"
        if held is not None:
            self.store.forget("NodeTopology", "", name)
        self.store.observe(topo)

    # --- NodeTopologies --------------------------------------------------------------------------

    def topology_mirror(self) -> TopologyMirror:
        return TopologyMirror(self)

    # --- Pods ------------------------------------------------------------------------------------

    def pod_mirror(self) -> PodMirror:
        return PodMirror(self)

    def pod_changed(self, pod: Pod | None, *, old: Pod | None) -> None:
        """Keep the per-node pod index; re-publish the nodes whose foreign usage changed."""
        touched: set[str] = set()
        for p, add in ((old, False), (pod, True)):
            if p is None or not p.spec.node_name:
                continue
            key = (p.metadata.namespace, p.metadata.name)
            on = self.pods_on.setdefault(p.spec.node_name, {})
            if add:
                on[key] = p
            else:
                on.pop(key, None)
            if _is_foreign(p, self.scheduler_name):  # delegated ones too: they may have been counted
                touched.add(p.spec.node_name)
        if self._pending is not None:
            self._pending.update(touched)
            return
        for name in touched:
            self._publish(name)

    # --- heartbeats (node Leases) ----------------------------------------------------------------

    def lease_mirror(self) -> LeaseMirror:
        return LeaseMirror(self)

    def lease_seen(self, name: str, renew_time: datetime | None) -> None:
        """The node-lease informer saw the Lease of node `name` (see `heartbeats.py`)."""
        self.heartbeats[name] = heartbeat_seen(self.heartbeats.get(name), renew_time, now=self.clock.now())
        self.check_heartbeats(only=name)

    def lease_gone(self, name: str) -> None:
        """The node's Lease was deleted: its Ready condition alone decides again."""
        self.heartbeats.pop(name, None)
        if name in self.stale:
            self.stale.discard(name)
            self._restored(name)

    def check_heartbeats(self, *, only: str | None = None) -> list[str]:
        """Mark the nodes whose heartbeat went stale, unmark the renewed ones; the changed names."""
        now = self.clock.now()
        changed = []
        for name in [only] if only is not None else list(self.heartbeats):
            beat = self.heartbeats.get(name)
            stale = is_stale(beat, now=now, grace=self.monitor_grace)
            if stale == (name in self.stale) or beat is None:
                continue
            changed.append(name)
            if stale:
                self.stale.add(name)
                log.warning(
                    "kube.node_heartbeat_stale",
                    node=name,
                    lease=f"{self.lease_namespace}/{name}",
                    renew_time=beat.renew_time.isoformat() if beat.renew_time else None,
                    grace=self.monitor_grace,
                )
                self._judge(name)
                self._publish(name)
            else:
                self.stale.discard(name)
                log.info("kube.node_heartbeat_renewed", node=name)
                self._restored(name)
        return changed

    def _restored(self, name: str) -> None:
        """The heartbeat no longer counts against the node: lost only if NotReady."""
        self._judge(name)
        self._publish(name)

    # --- lost nodes ------------------------------------------------------------------------------

    async def fail_lost(self) -> int:
        """Fail the active pods of nodes lost longer than the grace period; return how many.

        A pod there that is being deleted (the taint manager's eviction is a graceful delete) is
        also deleted at once (gracePeriodSeconds 0, as its kubelet's final delete would be): with the
        kubelet gone nobody finishes it, and it holds the name its replacement needs. That is done
        whatever its phase, on every pass: the eviction may reach this cache only after the pod was
        failed here. The delete names the pod's uid, so a replacement of the same name is never hit."""
        if self.writer is None or not self.is_leader():
            return 0
        now = self.clock.now()
        failed = forced = 0
        for name, since in list(self.lost_since.items()):
            if now - since < self.grace:
                continue
            for pod in list(self.pods_on.get(name, {}).values()):
                ns, pod_name = pod.metadata.namespace, pod.metadata.name
                try:
                    if pod.status.phase in ACTIVE:
                        await self.writer.patch_status(
                            "Pod",
                            ns,
                            pod_name,
                            {"phase": "Failed", "reason": NODE_LOST, "message": f"node {name} was lost"},
                        )
                        failed += 1
                    if pod.metadata.deletion_timestamp is not None:
                        await self.writer.delete(
                            "Pod", ns, pod_name, uid=pod.metadata.uid or None, grace_period=0
                        )
                        forced += 1
                except (NotFound, Conflict):
                    continue  # gone already, or the name is another pod's now
            if name not in self.raw and not self.pods_on.get(name):  # gone, and every pod with it
                self.lost_since.pop(name, None)
        if failed:
            self.pods_failed += failed
            log.info("kube.node_lost_pods_failed", pods=failed)
        if forced:
            log.info(
                "kube.node_lost_pods_deleted", pods=forced, why="evicted from a node whose kubelet is gone"
            )
        return failed

    # --- unhealthy GPUs --------------------------------------------------------------------------

    def unhealthy_gpus(self, name: str) -> set[int]:
        """The node's GPUs its NodeTopology (the agent's) or its `gpuyard.io/unhealthy-gpus`
        annotation calls unhealthy (never the GPUs the published copy marks taken by foreign pods)."""
        bad: set[int] = set()
        topo = self.store.get_of(NodeTopology, "", name)
        if topo is not None and not topo.metadata.annotations.get(ANNOTATION_DERIVED):
            bad.update(g.index for g in topo.spec.gpus if g.health != "Healthy")
        node = self.raw.get(name)
        if node is not None:
            bad.update(unhealthy_indices(node))
        return bad

    async def fail_unhealthy(self) -> int:
        """Fail gpuyard's active pods that hold a GPU gone unhealthy (`DeviceUnhealthy`), as the
        fake cluster does: the operator's failover places them again. Leader only; idempotent (a
        failed pod is no longer active). Returns how many were failed."""
        if self.writer is None or not self.is_leader():
            return 0
        failed = 0
        for name, pods in list(self.pods_on.items()):
            if not pods or not (bad := self.unhealthy_gpus(name)):
                continue  # most nodes: no unhealthy GPU, and their pods need no look
            active = [
                p
                for p in pods.values()
                if p.status.phase in ACTIVE and p.metadata.deletion_timestamp is None and not self._foreign(p)
            ]
            for pod in active:
                hit = sorted(bad.intersection(pod_gpus(pod)))
                if not hit:
                    continue
                message = f"GPU {','.join(map(str, hit))} on {name} became unhealthy"
                try:
                    await self.writer.patch_status(
                        "Pod",
                        pod.metadata.namespace,
                        pod.metadata.name,
                        {"phase": "Failed", "reason": DEVICE_UNHEALTHY, "message": message},
                    )
                    failed += 1
                except NotFound:
                    continue
        if failed:
            log.info("kube.device_unhealthy_pods_failed", pods=failed)
        return failed

    async def run(self, *, interval: float = 1.0) -> None:
        """Every `interval` seconds at most (a quarter of the shorter grace when less): mark the
        nodes whose heartbeat went stale, then fail the pods of nodes lost beyond the grace."""
        while True:
            await self.clock.sleep(min(interval, max(min(self.grace, self.monitor_grace) / 4, 0.05)))
            self.check_heartbeats()
            await self.fail_lost()
            await self.fail_unhealthy()


class PodMirror:
    """Mirror for the Pod informer: the store, plus the node model's per-node pod index."""

    def __init__(self, model: NodeModel) -> None:
        self.model = model

    def batched(self) -> AbstractContextManager[None]:
        return self.model.batched()

    def put(self, obj: Resource) -> None:
        if not isinstance(obj, Pod):
            raise TypeError(f"PodMirror mirrors Pods, not {obj.kind}")
        old = self.model.store.get_of(Pod, obj.metadata.namespace, obj.metadata.name)
        if self.model.store.observe(obj):
            self.model.pod_changed(obj, old=old)

    def drop(self, kind: str, namespace: str, name: str) -> None:
        old = self.model.store.get_of(Pod, namespace, name)
        if self.model.store.forget(kind, namespace, name):
            self.model.pod_changed(None, old=old)


class TopologyMirror:
    """Mirror for the NodeTopology informer: a node's preset topology comes back when the
    server's own NodeTopology goes away."""

    def __init__(self, model: NodeModel) -> None:
        self.model = model

    def put(self, obj: Resource) -> None:
        held = self.model.store.get(obj.kind, "", obj.metadata.name)
        if held is not None and held.metadata.annotations.get(ANNOTATION_DERIVED):
            self.model.store.forget(obj.kind, "", obj.metadata.name)
        self.model.store.observe(obj)

    def drop(self, kind: str, namespace: str, name: str) -> None:
        held = self.model.store.get(kind, "", name)
        if held is not None and held.metadata.annotations.get(ANNOTATION_DERIVED):
            return
        self.model.store.forget(kind, "", name)
        node = self.model.raw.get(name)
        if node is not None:
            self.model._derive_topology(node)
