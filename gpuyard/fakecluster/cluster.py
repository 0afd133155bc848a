"""The in-memory fake cluster: a `ClusterBackend` with simulated nodes, kubelet and faults.

`FakeCluster.run()` writes the scenario's nodes and device topologies through its writer
(keeping nodes a restarted process reloaded from its journal), sets `synced`, then runs the
simulated kubelet (pod phases on the clock) and the device-health reconciler (a GPU that turns
unhealthy fails the pods using it). Components create pods, already bound by the scheduler's
placement, through `writer` (:class:`~gpuyard.fakecluster.writing.FakeWriter`, the fake API
server); `faults` (:class:`~gpuyard.fakecluster.faulting.FakeFaults`) injects failures.
"""

from __future__ import annotations

import asyncio

import structlog

from gpuyard.apis.core import Pod, Service
from gpuyard.devices.scenarios import Scenario
from gpuyard.fakecluster.faulting import FakeFaults
from gpuyard.fakecluster.health import DeviceHealth
from gpuyard.fakecluster.kubelet import FakeKubelet
from gpuyard.fakecluster.writing import FakeWriter
from gpuyard.state.context import Context
from gpuyard.state.store import NotFound
from gpuyard.state.workqueues import ControllerRunner

__all__ = ["FakeCluster"]

log = structlog.get_logger(__name__)


class FakeCluster:
    """A whole cluster in memory, driven by the context's clock."""

    name = "fake"

    def __init__(self, ctx: Context, scenario: Scenario) -> None:
        self.store = ctx.store
        self.clock = ctx.clock
        self.scenario = scenario
        self.synced = asyncio.Event()
        self.writer = FakeWriter(ctx.store, journal=ctx.journal)
        self.faults = FakeFaults(store=ctx.store, writer=self.writer, clock=ctx.clock)
        self.kubelet = FakeKubelet(
            store=ctx.store, writer=self.writer, clock=ctx.clock, defaults=scenario.kubelet
        )
        self.device_health = DeviceHealth(store=ctx.store, writer=self.writer, clock=ctx.clock)

    # --- lifecycle ---------------------------------------------------------------------------

    async def sync_nodes(self) -> int:
        """Create the scenario's nodes (and their device topologies) that the store does not
        hold yet; return how many nodes were created. All writes share one journal commit."""
        topologies = [
            t
            for t in self.scenario.topologies()
            if self.store.get("NodeTopology", "", t.metadata.name) is None
        ]
        nodes = [n for n in self.scenario.nodes() if self.store.get("Node", "", n.metadata.name) is None]
        await asyncio.gather(*(self.writer.create(t) for t in topologies))
        await asyncio.gather(*(self.writer.create(n) for n in nodes))
        return len(nodes)

    async def run(self) -> None:
        created = await self.sync_nodes()
        log.info(
            "fakecluster.synced",
            scenario=self.scenario.name,
            nodes_created=created,
            nodes=self.store.count("Node"),
        )
        self.synced.set()
        async with asyncio.TaskGroup() as tg:
            for reconciler in (self.kubelet, self.device_health):
                runner = ControllerRunner(reconciler, store=self.store, clock=self.clock)
                tg.create_task(runner.run(), name=reconciler.name)

    @property
    def pods_created(self) -> int:
        return self.writer.pods_created

    # --- deprecated: pods and services go through `writer` ----------------------------------
    # Thin forwarders kept only while the operator still calls them; delete them once it
    # writes through `ctx.writer`. They are not part of the ClusterBackend protocol.

    async def create_pod(self, pod: Pod) -> Pod:
        return await self.writer.create(pod)

    async def delete_pod(self, namespace: str, name: str) -> None:
        try:
            await self.writer.delete("Pod", namespace, name)
        except NotFound:
            pass

    async def apply_service(self, service: Service) -> Service:
        current = self.store.get("Service", service.metadata.namespace or "default", service.metadata.name)
        if current is None:
            return await self.writer.create(service)
        replacement = service.model_copy(
            update={
                "metadata": service.metadata.model_copy(
                    update={"resource_version": current.metadata.resource_version}
                )
            }
        )
        return await self.writer.update(replacement)

    async def delete_service(self, namespace: str, name: str) -> None:
        try:
            await self.writer.delete("Service", namespace, name)
        except NotFound:
            pass
