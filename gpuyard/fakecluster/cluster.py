"""The in-memory fake cluster: a `ClusterBackend` with simulated nodes, kubelet and faults.

`FakeCluster.run()` writes the scenario's nodes into the store (keeping nodes a restarted
process reloaded from its journal), sets `synced`, and runs the simulated kubelet. Pods are
created already bound by the operator through `create_pod`; their phases advance on the clock.

Fault injection (used by tests, the HTTP API and simulations) changes the store exactly as a
real cluster would report it: a failed node turns NotReady and its pods fail with reason
`NodeLost`; a crashed pod fails with an exit code (`OOMKilled` -> 137) or reason (`Evicted`);
a failed GPU is marked unhealthy and the pods using it fail with `DeviceUnhealthy`.
"""

from __future__ import annotations

import asyncio
import json

import structlog

from gpuyard.apis.core import NodeCondition, Pod, Service
from gpuyard.apis.devicematching import ANNOTATION_UNHEALTHY_GPUS, format_unhealthy, unhealthy_indices
from gpuyard.apis.scheduling import ANNOTATION_DEVICES
from gpuyard.fakecluster.kubelet import FakeKubelet, terminate
from gpuyard.fakecluster.scenario import Scenario
from gpuyard.fakecluster.writing import FakeWriter
from gpuyard.state.context import Context
from gpuyard.state.store import NotFound
from gpuyard.state.workqueues import ControllerRunner

__all__ = ["FakeCluster"]

log = structlog.get_logger(__name__)

EXIT_CODES = {"OOMKilled": 137, "Error": 1}


class FakeCluster:
    """A whole cluster in memory, driven by the context's clock."""

    name = "fake"

    def __init__(self, ctx: Context, scenario: Scenario) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.clock = ctx.clock
        self.scenario = scenario
        self.synced = asyncio.Event()
        self.kubelet = FakeKubelet(store=ctx.store, clock=ctx.clock, defaults=scenario.kubelet)
        self.writer = FakeWriter(ctx.store, journal=ctx.journal)

    # --- lifecycle ---------------------------------------------------------------------------

    def sync_nodes(self) -> int:
        """Create the scenario's nodes (and their device topologies) that the store does not
        hold yet; return how many nodes were created."""
        created = 0
        for topo in self.scenario.topologies():
            if self.store.get("NodeTopology", "", topo.metadata.name) is None:
                self.store.create(topo)
        for node in self.scenario.nodes():
            if self.store.get("Node", "", node.metadata.name) is None:
                self.store.create(node)
                created += 1
        return created

    async def run(self) -> None:
        created = self.sync_nodes()
        log.info(
            "fakecluster.synced",
            scenario=self.scenario.name,
            nodes_created=created,
            nodes=self.store.count("Node"),
        )
        self.synced.set()
        await ControllerRunner(self.kubelet, store=self.store, clock=self.clock).run()

    # --- ClusterBackend ----------------------------------------------------------------------

    @property
    def pods_created(self) -> int:
        return self.writer.pods_created

    async def create_pod(self, pod: Pod) -> Pod:
        return await self.writer.create(pod)

    async def delete_pod(self, namespace: str, name: str) -> None:
        try:
            self.store.delete("Pod", namespace, name)
        except NotFound:
            pass

    async def apply_service(self, service: Service) -> Service:
        current = self.store.get("Service", service.metadata.namespace or "default", service.metadata.name)
        if current is None:
            return self.store.create(service)
        return self.store.update(service, check_version=False)

    async def delete_service(self, namespace: str, name: str) -> None:
        try:
            self.store.delete("Service", namespace, name)
        except NotFound:
            pass

    # --- fault injection ---------------------------------------------------------------------

    def fail_next_creates(self, count: int = 1) -> None:
        """Make the next `count` pod creations fail with BackendError (tests the un-assume path)."""
        self.writer.fail_creates = count

    def _pods_on(self, node: str) -> list[Pod]:
        return [
            p
            for p in self.store.list("Pod")
            if p.spec.node_name == node and p.status.phase in ("Pending", "Running")
        ]  # type: ignore[attr-defined]

    def _fail_pod(self, pod: Pod, *, exit_code: int | None, reason: str, message: str) -> None:
        failed = pod.clone()
        terminate(failed, exit_code=exit_code, reason=reason, message=message, now=self.clock.utcnow())
        self.store.update(failed, check_version=False)

    def fail_node(self, name: str, *, reason: str = "NodeLost") -> int:
        """Turn the node NotReady; fail its running pods with `reason`. Returns pods failed."""
        node = self.store.must_get("Node", "", name)
        changed = node.clone()
        changed.status.conditions = [
            NodeCondition(
                type="Ready",
                status="False",
                reason=reason,
                message="injected node failure",
                last_transition_time=self.clock.utcnow(),
            )
        ]
        self.store.update(changed)
        pods = self._pods_on(name)
        for pod in pods:
            self._fail_pod(pod, exit_code=None, reason="NodeLost", message=f"node {name} was lost")
        log.info("fakecluster.node_failed", node=name, pods_failed=len(pods))
        return len(pods)

    def recover_node(self, name: str) -> None:
        node = self.store.must_get("Node", "", name)
        changed = node.clone()
        changed.status.conditions = [
            NodeCondition(
                type="Ready", status="True", reason="KubeletReady", last_transition_time=self.clock.utcnow()
            )
        ]
        self.store.update(changed)
        log.info("fakecluster.node_recovered", node=name)

    def crash_pod(
        self, namespace: str, name: str, *, exit_code: int | None = None, reason: str | None = None
    ) -> Pod:
        """Fail a pod now: with an exit code, or a reason (OOMKilled implies 137, Evicted none)."""
        pod = self.store.must_get("Pod", namespace, name)
        assert isinstance(pod, Pod)
        if pod.status.phase in ("Succeeded", "Failed"):
            raise ValueError(f"pod {namespace}/{name} already finished ({pod.status.phase})")
        if exit_code is None and reason is None:
            exit_code = 1
        if exit_code is None and reason in EXIT_CODES:
            exit_code = EXIT_CODES[reason]
        self._fail_pod(pod, exit_code=exit_code, reason=reason or "Error", message="injected crash")
        return self.store.must_get("Pod", namespace, name)  # type: ignore[return-value]

    def unhealthy_gpus(self, node: str) -> set[int]:
        return set(unhealthy_indices(self.store.must_get("Node", "", node)))  # type: ignore[arg-type]

    def _set_unhealthy(self, node: str, gpus: set[int]) -> None:
        def change(n):  # type: ignore[no-untyped-def]
            if gpus:
                n.metadata.annotations[ANNOTATION_UNHEALTHY_GPUS] = format_unhealthy(gpus)
            else:
                n.metadata.annotations.pop(ANNOTATION_UNHEALTHY_GPUS, None)

        self.store.mutate("Node", "", node, change)
        if self.store.get("NodeTopology", "", node) is not None:

            def set_health(topo):  # type: ignore[no-untyped-def]
                for gpu in topo.spec.gpus:
                    gpu.health = "Unhealthy" if gpu.index in gpus else "Healthy"

            self.store.mutate("NodeTopology", "", node, set_health)

    def fail_gpu(self, node: str, index: int) -> int:
        """Mark GPU `index` of `node` unhealthy and fail the pods using it. Returns pods failed."""
        gpus = self.unhealthy_gpus(node)
        gpus.add(index)
        self._set_unhealthy(node, gpus)
        failed = 0
        for pod in self._pods_on(node):
            try:
                devices = json.loads(pod.metadata.annotations.get(ANNOTATION_DEVICES, "{}"))
            except ValueError:
                continue
            if index in devices.get("gpus", []):
                self._fail_pod(
                    pod,
                    exit_code=None,
                    reason="DeviceUnhealthy",
                    message=f"GPU {index} on {node} became unhealthy",
                )
                failed += 1
        log.info("fakecluster.gpu_failed", node=node, gpu=index, pods_failed=failed)
        return failed

    def recover_gpu(self, node: str, index: int) -> None:
        gpus = self.unhealthy_gpus(node)
        gpus.discard(index)
        self._set_unhealthy(node, gpus)
