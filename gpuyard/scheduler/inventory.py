"""The device inventory reconciler: GPU health from NodeTopology objects, for any backend.

NodeTopology objects live in the store (the fake cluster creates them from presets; on a real node
an agent writes them from NVML, including health changes from XID/ECC events). This reconciler,
keyed by node name, follows NodeTopology and Node changes and keeps three things consistent:

1. the node annotation `gpuyard.io/unhealthy-gpus` ("0,3") mirrors the NodeTopology's GPU health
   (the NodeTopology is authoritative where one exists; the annotation is for backends and tools
   that only read nodes);
2. every pod holding an unhealthy GPU (through its Reservation, same namespace and name) that is
   still Pending or Running is marked Failed with reason `DeviceUnhealthy`; the operator's
   failover then re-places it, and the scheduler's snapshot keeps the GPU out of placement
   until the NodeTopology says Healthy again (`Snapshot.refresh_node`);
3. it is idempotent: a pod already finished is never written again, and nothing is written
   when the annotation already matches.

On the fake backend `fail_gpu` does the same directly, so the reconciler then finds nothing to do.
"""

from __future__ import annotations

import structlog

from gpuyard.apis.core import ContainerState, ContainerStatus, Node, Pod
from gpuyard.apis.devicematching import ANNOTATION_UNHEALTHY_GPUS, format_unhealthy
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.scheduling import Reservation
from gpuyard.state.clock import Clock
from gpuyard.state.store import Conflict, NotFound, Store
from gpuyard.state.workqueues import Requeue, Watch

__all__ = ["DEVICE_UNHEALTHY", "DeviceInventory", "unhealthy_gpus"]

log = structlog.get_logger(__name__)

DEVICE_UNHEALTHY = "DeviceUnhealthy"
_ACTIVE = ("Pending", "Running")


def unhealthy_gpus(topology: NodeTopology) -> list[int]:
    return sorted(g.index for g in topology.spec.gpus if g.health != "Healthy")


def _node_key(obj: object) -> list[tuple[str, str]]:
    return [("", obj.metadata.name)]  # type: ignore[attr-defined]


class DeviceInventory:
    """Reconciler: NodeTopology GPU health -> node annotation and DeviceUnhealthy pod failures."""

    name = "device-inventory"
    concurrency = 1

    def __init__(self, store: Store, *, clock: Clock | None = None) -> None:
        self.store = store
        self.clock = clock
        self.watches = [Watch("NodeTopology", _node_key), Watch("Node", _node_key)]

    async def reconcile(self, key: tuple[str, str]) -> Requeue | None:
        name = key[1]
        topology = self.store.get("NodeTopology", "", name)
        node = self.store.get("Node", "", name)
        if topology is None or node is None:
            return None
        assert isinstance(topology, NodeTopology) and isinstance(node, Node)
        bad = unhealthy_gpus(topology)
        try:
            self._mirror(node, bad)
            failed = self._fail_pods(name, set(bad)) if bad else 0
        except Conflict:
            return Requeue(after=0.1)
        if failed:
            log.info("inventory.pods_failed", node=name, gpus=bad, pods=failed)
        return None

    def _mirror(self, node: Node, bad: list[int]) -> None:
        want = format_unhealthy(bad)
        have = node.metadata.annotations.get(ANNOTATION_UNHEALTHY_GPUS, "")
        if want == have:
            return
        changed = node.clone()
        if want:
            changed.metadata.annotations[ANNOTATION_UNHEALTHY_GPUS] = want
        else:
            changed.metadata.annotations.pop(ANNOTATION_UNHEALTHY_GPUS, None)
        self.store.update(changed)

    def _fail_pods(self, node: str, bad: set[int]) -> int:
        failed = 0
        for res in self.store.list("Reservation"):
            assert isinstance(res, Reservation)
            if res.spec.node != node or not bad.intersection(res.spec.gpus):
                continue
            pod = self.store.get("Pod", res.metadata.namespace, res.metadata.name)
            if not isinstance(pod, Pod) or pod.spec.node_name not in (None, "", node):
                continue
            if pod.status.phase not in _ACTIVE or pod.status.reason == DEVICE_UNHEALTHY:
                continue
            gpus = sorted(bad.intersection(res.spec.gpus))
            changed = pod.clone()
            changed.status.phase = "Failed"
            changed.status.reason = DEVICE_UNHEALTHY
            changed.status.message = f"GPU {','.join(map(str, gpus))} on {node} became unhealthy"
            now = self.clock.utcnow().isoformat() if self.clock is not None else None
            terminated: dict[str, object] = {"reason": DEVICE_UNHEALTHY}
            if now:
                terminated["finishedAt"] = now
            changed.status.container_statuses = [
                ContainerStatus(name=c.name, ready=False, state=ContainerState(terminated=terminated))
                for c in changed.spec.containers
            ]
            try:
                self.store.update(changed)
            except NotFound:
                continue
            failed += 1
        return failed
