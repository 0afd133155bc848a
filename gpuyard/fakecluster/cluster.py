"""The in-memory fake cluster: a `ClusterBackend` with simulated nodes, kubelet and faults.

`FakeCluster.run()` writes the scenario's nodes and device topologies through its writer
(keeping nodes a restarted process reloaded from its journal), sets `synced`, then runs the
simulated kubelet (pod phases on the clock), the device-health reconciler (a GPU that turns
unhealthy fails the pods using it) and the autoscaler of jobs' HorizontalPodAutoscalers
(`autoscaling.py`, on the scenario's `hpaMetrics`). Components create pods, already bound by the
scheduler's placement, through `writer` (:class:`~gpuyard.fakecluster.writing.FakeWriter`, the fake API
server); `faults` (:class:`~gpuyard.fakecluster.faulting.FakeFaults`) injects failures;
`pod_log()` reads the short log the kubelet keeps per container (`podlogs.py`).

What the fake cluster writes itself (its nodes and topologies, pod phases, GPU health, injected
faults) it writes as `BACKEND` (`state.ownership`), as a real cluster's kubelets and node
controllers write theirs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import structlog

from gpuyard.apis.core import Pod
from gpuyard.devices.scenarios import Scenario
from gpuyard.fakecluster.autoscaling import FakeAutoscaler
from gpuyard.fakecluster.faulting import FakeFaults
from gpuyard.fakecluster.health import DeviceHealth
from gpuyard.fakecluster.kubelet import FakeKubelet
from gpuyard.fakecluster.podlogs import StorePodLogs
from gpuyard.fakecluster.writing import FakeWriter
from gpuyard.state.context import Context
from gpuyard.state.ownership import BACKEND
from gpuyard.state.workqueues import ControllerRunner
from gpuyard.state.writing import acting_as, identified

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
        own = identified(self.writer, BACKEND)  # what the cluster itself writes
        self.faults = FakeFaults(store=ctx.store, writer=self.writer, clock=ctx.clock)
        self.kubelet = FakeKubelet(store=ctx.store, writer=own, clock=ctx.clock, defaults=scenario.kubelet)
        self.device_health = DeviceHealth(store=ctx.store, writer=own, clock=ctx.clock)
        self.autoscaler = FakeAutoscaler(
            store=ctx.store, writer=own, clock=ctx.clock, metrics=scenario.hpa_metrics
        )
        self.logs = StorePodLogs(ctx.store)

    leadership = None  # one process: it always leads

    def healthy(self) -> bool:
        return True  # the cluster is this process's memory

    async def pod_log(
        self, pod: Pod, *, container: str, follow: bool = False, tail_lines: int | None = None
    ) -> AsyncIterator[str]:
        """The kubelet's short log of the container (`PodLogs`)."""
        return await self.logs.pod_log(pod, container=container, follow=follow, tail_lines=tail_lines)

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
        with acting_as(BACKEND):
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
            for reconciler in (self.kubelet, self.device_health, self.autoscaler):
                runner = ControllerRunner(reconciler, store=self.store, clock=self.clock)
                tg.create_task(runner.run(), name=reconciler.name)

    @property
    def pods_created(self) -> int:
        return self.writer.pods_created
