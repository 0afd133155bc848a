"""The backend factory: the one place that knows which `ClusterBackend` runs.

The runtime asks it twice. First :func:`plan_backend` checks the settings before anything is
written (`backend.kind`: a :class:`~gpuyard.state.config.ConfigError` naming the field and the allowed
values; for the fake cluster its scenario file: a `ScenarioError` naming file and field). Then, once
the store and journal exist, :func:`build_backend` builds the backend (`fake`: the in-memory
`FakeCluster`; `kubernetes`: `KubeCluster` over the API server of `backend.kubernetes.*`) and makes its writer the
context's one write path (`ctx.backend`, `ctx.writer`). Everything else (HTTP API, CLI,
simulator, test harness, operator, scheduler) sees only the protocol in `gpuyard.state.backend`;
an import-linter contract keeps it so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpuyard.devices.agent.running import TopologySink
from gpuyard.devices.scenarios import Scenario, load_scenario
from gpuyard.fakecluster import FakeCluster
from gpuyard.kubecluster import KubeCluster
from gpuyard.state.backend import ClusterBackend
from gpuyard.state.config import ConfigError, Settings
from gpuyard.state.context import Context

if TYPE_CHECKING:
    from gpuyard.kubecluster.fakenodes import FakeNodes

__all__ = [
    "AVAILABLE",
    "BackendPlan",
    "agent_topology_sink",
    "build_backend",
    "plan_backend",
    "start_fake_nodes",
]

AVAILABLE = ("fake", "kubernetes")  # backend.kind values this build can run


@dataclass(frozen=True, slots=True)
class BackendPlan:
    """A validated choice of backend: its kind and, for the fake cluster, the scenario it runs
    (the Kubernetes backend has none: its nodes are the API server's)."""

    kind: str
    scenario: Scenario | None = None


def plan_backend(settings: Settings, *, scenario: Scenario | None = None) -> BackendPlan:
    """Validate the backend settings; `scenario` replaces the fake cluster's scenario file."""
    kind = settings.backend.kind
    if kind not in AVAILABLE:
        raise ConfigError(
            f"backend.kind: {kind!r} is not available in this build; allowed: {', '.join(AVAILABLE)}"
        )
    if kind == "kubernetes":
        kubeconfig = settings.backend.kubernetes.kubeconfig
        if kubeconfig is not None and not Path(kubeconfig).is_file():
            raise ConfigError(f"backend.kubernetes.kubeconfig: {kubeconfig} is not a file")
        return BackendPlan(kind=kind)  # the API server holds the nodes: no scenario
    if scenario is None:
        scenario = load_scenario(settings.backend.cluster)  # ScenarioError names file and field
    return BackendPlan(kind=kind, scenario=scenario)


def build_backend(ctx: Context, plan: BackendPlan) -> ClusterBackend:
    """Build the planned backend over `ctx` and make it the context's backend and writer.

    Call it after the journal (if any) is attached to `ctx`: the backend's writer makes writes
    durable in it.
    """
    if plan.kind == "fake":
        assert plan.scenario is not None, "plan_backend always gives the fake cluster a scenario"
        backend: ClusterBackend = FakeCluster(ctx, plan.scenario)
    elif plan.kind == "kubernetes":
        backend = KubeCluster(ctx)
    else:  # pragma: no cover - plan_backend admits only AVAILABLE kinds
        raise ConfigError(f"backend.kind: {plan.kind!r} is not available; allowed: {', '.join(AVAILABLE)}")
    ctx.backend = backend
    ctx.writer = backend.writer
    return backend


async def start_fake_nodes(
    *,
    kubeconfig: str | None,
    scenario: Scenario,
    heartbeat: float = 10.0,
    kubelet_address: str | None = None,
    kubelet_port: int = 0,
) -> FakeNodes:
    """`gpuyard fake-nodes`: the scenario's nodes and kubelets for the API server of `kubeconfig`
    (imported here, lazily: the Kubernetes extra may be absent where only the fake cluster runs),
    with their kubelet port (pod logs) on `kubelet_address`:`kubelet_port` unless the address is None."""
    from gpuyard.kubecluster.fakenodes import FakeNodes, KubeletEndpoint, connect

    kubelet = None if kubelet_address is None else KubeletEndpoint(kubelet_address, kubelet_port)
    return FakeNodes(await connect(kubeconfig), scenario=scenario, heartbeat=heartbeat, kubelet=kubelet)


async def agent_topology_sink(*, kubeconfig: str | None, context: str | None = None) -> TopologySink:
    """`gpuyard agent --kubeconfig`: the sink writing the node's NodeTopology to that API server."""
    from gpuyard.kubecluster.topologies import KubeTopologySink

    return await KubeTopologySink.connect(kubeconfig=kubeconfig, context=context)
