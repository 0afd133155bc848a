"""Fault injection on the fake cluster (the backend's `faults`): what a real cluster would report.

Used by the HTTP fault routes, the test harness and simulations, through the
:class:`~gpuyard.state.backend.FaultInjector` protocol. Every change goes through the fake
cluster's writer, exactly as the real failure would be reported: a failed node turns NotReady
and its pods fail with reason `NodeLost`; a crashed pod fails with an exit code (`OOMKilled` <->
137; exit code 0 ends it Succeeded with reason `Completed`, any other code is an `Error`) or a
reason (`Evicted`); a failed GPU turns unhealthy (node annotation and NodeTopology
health) and the pods using it fail with `DeviceUnhealthy`. The writes are the backend's
(`BACKEND`), whoever asked for the fault.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import structlog

from gpuyard.apis.core import Node, NodeCondition, Pod
from gpuyard.apis.devicematching import ANNOTATION_UNHEALTHY_GPUS, format_unhealthy, unhealthy_indices
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.meta import Resource
from gpuyard.apis.scheduling import pod_gpus
from gpuyard.devices.fakepods import exit_reason
from gpuyard.fakecluster.health import active_pods_on, fail_pod, fail_pods_on_gpus
from gpuyard.fakecluster.writing import FakeWriter
from gpuyard.state.backend import FaultError
from gpuyard.state.clock import Clock
from gpuyard.state.ownership import BACKEND
from gpuyard.state.store import Store
from gpuyard.state.writing import identified, retry_on_conflict

__all__ = ["EXIT_CODES", "FakeFaults"]

log = structlog.get_logger(__name__)

R = TypeVar("R", bound=Resource)

EXIT_CODES = {"OOMKilled": 137, "Error": 1}


class FakeFaults:
    """The fake cluster's :class:`~gpuyard.state.backend.FaultInjector`."""

    def __init__(self, *, store: Store, writer: FakeWriter, clock: Clock) -> None:
        self.store = store
        self.writer = writer  # the fake API server (its injected create failures)
        self._writes = identified(writer, BACKEND)  # what a fault writes
        self.clock = clock

    def fail_next_creates(self, count: int = 1) -> None:
        """Make the next `count` pod creations fail with BackendError (tests the un-assume path)."""
        self.writer.fail_creates = count

    async def _set_ready(self, name: str, *, ready: bool, reason: str, message: str | None) -> None:
        self.store.must_get_of(Node, "", name)
        condition = NodeCondition(
            type="Ready",
            status="True" if ready else "False",
            reason=reason,
            message=message,
            last_transition_time=self.clock.utcnow(),
        )
        await self._writes.patch_status("Node", "", name, {"conditions": [condition]})

    async def fail_node(self, name: str, *, reason: str = "NodeLost") -> int:
        """Turn the node NotReady; fail its running pods with `NodeLost`. Returns pods failed."""
        await self._set_ready(name, ready=False, reason=reason, message="injected node failure")
        pods = active_pods_on(self.store, name)
        for pod in pods:
            await fail_pod(
                self._writes,
                pod,
                exit_code=None,
                reason="NodeLost",
                message=f"node {name} was lost",
                clock=self.clock,
            )
        log.info("fakecluster.node_failed", node=name, pods_failed=len(pods))
        return len(pods)

    async def recover_node(self, name: str) -> None:
        await self._set_ready(name, ready=True, reason="KubeletReady", message=None)
        log.info("fakecluster.node_recovered", node=name)

    async def crash_pod(
        self, namespace: str, name: str, *, exit_code: int | None = None, reason: str | None = None
    ) -> Pod:
        """Fail a pod now: with an exit code, or a reason (OOMKilled implies 137, Evicted none).

        Without a reason, the exit code gives it as the kubelet does: 0 `Completed` (the pod
        Succeeded), 137 `OOMKilled`, any other `Error`."""
        pod = self.store.must_get_of(Pod, namespace, name)
        if pod.status.phase in ("Succeeded", "Failed"):
            raise FaultError(f"pod {namespace}/{name} already finished ({pod.status.phase})")
        if exit_code is None and reason is None:
            exit_code = 1
        if exit_code is None and reason in EXIT_CODES:
            exit_code = EXIT_CODES[reason]
        if reason is None and exit_code is not None:
            reason = exit_reason(exit_code)  # 0 Completed, 137 OOMKilled, else Error
        return await fail_pod(
            self._writes,
            pod,
            exit_code=exit_code,
            reason=reason or "Error",
            message="injected crash",
            clock=self.clock,
        )

    def unhealthy_gpus(self, node: str) -> set[int]:
        return set(unhealthy_indices(self.store.must_get_of(Node, "", node)))

    async def _set_unhealthy(self, node: str, gpus: set[int]) -> None:
        """The NodeTopology first (it is authoritative: the device-health reconciler mirrors it
        into the node), then the node annotation, so the two never disagree for long."""

        def set_health(topo: NodeTopology) -> bool:
            health = {g.index: g.health for g in topo.spec.gpus}
            for gpu in topo.spec.gpus:
                gpu.health = "Unhealthy" if gpu.index in gpus else "Healthy"
            return health != {g.index: g.health for g in topo.spec.gpus}

        def annotate(n: Node) -> bool:
            want = format_unhealthy(gpus)
            if n.metadata.annotations.get(ANNOTATION_UNHEALTHY_GPUS, "") == want:
                return False
            if want:
                n.metadata.annotations[ANNOTATION_UNHEALTHY_GPUS] = want
            else:
                n.metadata.annotations.pop(ANNOTATION_UNHEALTHY_GPUS, None)
            return True

        if self.store.get_of(NodeTopology, "", node) is not None:
            await self._change(NodeTopology, node, set_health)
        await self._change(Node, node, annotate)

    async def _change(self, cls: type[R], name: str, change: Callable[[R], bool]) -> None:
        """Re-read, change a copy, write it if `change` says it changed; retried on conflict."""

        async def write() -> R:
            copy = self.store.must_get_of(cls, "", name).clone()
            if change(copy):
                return await self._writes.update(copy)
            return copy

        await retry_on_conflict(write)

    async def fail_gpu(self, node: str, index: int) -> int:
        """Mark GPU `index` of `node` unhealthy and fail the pods using it. Returns pods failed."""
        gpus = self.unhealthy_gpus(node)
        gpus.add(index)
        # the pods using it now: the device-health reconciler may fail some of them first
        failed = sum(1 for p in active_pods_on(self.store, node) if index in pod_gpus(p))
        await self._set_unhealthy(node, gpus)
        await fail_pods_on_gpus(self.store, self._writes, node=node, gpus=[index], clock=self.clock)
        log.info("fakecluster.gpu_failed", node=node, gpu=index, pods_failed=failed)
        return failed

    async def recover_gpu(self, node: str, index: int) -> None:
        gpus = self.unhealthy_gpus(node)
        gpus.discard(index)
        await self._set_unhealthy(node, gpus)
