"""Device health on the fake cluster: a broken GPU fails the pods that use it, as a kubelet would.

On a real node the device plugin reports a GPU unhealthy and the pods holding it fail; the fake
cluster does the same, whoever marked the GPU broken: fault injection (`faults.fail_gpu`) or a
NodeTopology whose GPU health was written Unhealthy through the writer (an agent, a test). The
:class:`DeviceHealth` reconciler, keyed by node name, follows NodeTopology and Node changes and

1. mirrors the NodeTopology's GPU health into the node annotation `gpuyard.io/unhealthy-gpus`
   (the NodeTopology is authoritative where one exists; the annotation is for readers of nodes);
2. fails every Pending or Running pod bound to the node whose `gpuyard.io/devices` annotation
   lists an unhealthy GPU, with reason `DeviceUnhealthy`; the operator's failover then moves it.

Both are idempotent: nothing is written when the annotation already matches or the pod has
already finished. Every write goes through the fake cluster's writer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import cast

import structlog

from gpuyard.apis.core import Node, Pod
from gpuyard.apis.devicematching import ANNOTATION_UNHEALTHY_GPUS, format_unhealthy
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.scheduling import pod_gpus
from gpuyard.fakecluster.kubelet import terminate
from gpuyard.state.clock import Clock
from gpuyard.state.store import Conflict, NotFound, Store
from gpuyard.state.workqueues import ObjectKey, Requeue, Watch
from gpuyard.state.writing import Writer

__all__ = [
    "DEVICE_UNHEALTHY",
    "DeviceHealth",
    "active_pods_on",
    "fail_pod",
    "fail_pods_on_gpus",
]

log = structlog.get_logger(__name__)

DEVICE_UNHEALTHY = "DeviceUnhealthy"
ACTIVE = ("Pending", "Running")


def active_pods_on(store: Store, node: str) -> list[Pod]:
    """Pods bound to `node` that have not finished."""
    return [p for p in store.list_of(Pod) if p.spec.node_name == node and p.status.phase in ACTIVE]


async def fail_pod(
    writer: Writer, pod: Pod, *, exit_code: int | None, reason: str, message: str, clock: Clock
) -> Pod:
    """Put the pod into its terminal phase through the writer (status only); return it as stored."""
    failed = pod.clone()
    terminate(failed, exit_code=exit_code, reason=reason, message=message, now=clock.utcnow())
    status = failed.status
    stored = await writer.patch_status(
        "Pod",
        pod.metadata.namespace,
        pod.metadata.name,
        {
            "phase": status.phase,
            "reason": status.reason,
            "message": status.message,
            "container_statuses": status.container_statuses,
        },
    )
    return cast(Pod, stored)  # patch_status returns the stored object of the kind it patched


async def fail_pods_on_gpus(
    store: Store, writer: Writer, *, node: str, gpus: Iterable[int], clock: Clock
) -> int:
    """Fail the active pods on `node` that use any of `gpus`; return how many were failed."""
    bad = set(gpus)
    failed = 0
    if not bad:
        return 0
    for pod in active_pods_on(store, node):
        hit = sorted(bad.intersection(pod_gpus(pod)))
        if not hit:
            continue
        try:
            await fail_pod(
                writer,
                pod,
                exit_code=None,
                reason=DEVICE_UNHEALTHY,
                message=f"GPU {','.join(map(str, hit))} on {node} became unhealthy",
                clock=clock,
            )
        except NotFound:
            continue
        failed += 1
    return failed


def unhealthy_in(topology: NodeTopology) -> list[int]:
    return sorted(g.index for g in topology.spec.gpus if g.health != "Healthy")


def _node_key(obj: Node | NodeTopology) -> list[ObjectKey]:
    return [("", obj.metadata.name)]


class DeviceHealth:
    """Reconciler: NodeTopology GPU health -> node annotation and DeviceUnhealthy pod failures."""

    name = "fake-device-health"
    concurrency = 1

    def __init__(self, *, store: Store, writer: Writer, clock: Clock) -> None:
        self.store = store
        self.writer = writer
        self.clock = clock
        self.watches: Sequence[Watch] = (Watch("NodeTopology", _node_key), Watch("Node", _node_key))

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        name = key[1]
        topology = self.store.get_of(NodeTopology, "", name)
        node = self.store.get_of(Node, "", name)
        if topology is None or node is None:
            return None
        bad = unhealthy_in(topology)
        try:
            await self._mirror(node, bad)
            failed = await fail_pods_on_gpus(self.store, self.writer, node=name, gpus=bad, clock=self.clock)
        except Conflict:
            return Requeue(after=0.1)
        except NotFound:
            return None
        if failed:
            log.info("fakecluster.device_unhealthy", node=name, gpus=bad, pods_failed=failed)
        return None

    async def _mirror(self, node: Node, bad: list[int]) -> None:
        want = format_unhealthy(bad)
        if node.metadata.annotations.get(ANNOTATION_UNHEALTHY_GPUS, "") == want:
            return
        changed = node.clone()
        if want:
            changed.metadata.annotations[ANNOTATION_UNHEALTHY_GPUS] = want
        else:
            changed.metadata.annotations.pop(ANNOTATION_UNHEALTHY_GPUS, None)
        await self.writer.update(changed)
