"""The backend factory: the one place that knows which `ClusterBackend` runs.

The runtime asks it twice. First :func:`plan_backend` checks the settings before anything is
written (`backend.kind`: a :class:`~gpuyard.state.config.ConfigError` naming the field and the allowed
values; for the fake cluster its scenario file: a `ScenarioError` naming file and field). Then, once
the store and journal exist, :func:`build_backend` builds the backend and makes its writer the
context's one write path (`ctx.backend`, `ctx.writer`). Everything else (HTTP API, CLI,
simulator, test harness, operator, scheduler) sees only the protocol in `gpuyard.state.backend`;
an import-linter contract keeps it so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuyard.devices.scenarios import Scenario, load_scenario
from gpuyard.fakecluster import FakeCluster
from gpuyard.state.backend import ClusterBackend
from gpuyard.state.config import ConfigError, Settings
from gpuyard.state.context import Context

if TYPE_CHECKING:
    from gpuyard.kubecluster.fakenodes import FakeNodes

__all__ = ["AVAILABLE", "BackendPlan", "build_backend", "plan_backend", "start_fake_nodes"]

AVAILABLE = ("fake",)  # backend.kind values this build can run


@dataclass(frozen=True, slots=True)
class BackendPlan:
    """A validated choice of backend: its kind and, for the fake cluster, the scenario it runs."""

    kind: str
    scenario: Scenario | None = None


def plan_backend(settings: Settings, *, scenario: Scenario | None = None) -> BackendPlan:
    """Validate the backend settings; `scenario` replaces the fake cluster's scenario file."""
    kind = settings.backend.kind
    if kind not in AVAILABLE:
        raise ConfigError(
            f"backend.kind: {kind!r} is not available in this build; allowed: {', '.join(AVAILABLE)}"
        )
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
    else:  # pragma: no cover - plan_backend admits only AVAILABLE kinds
        raise ConfigError(f"backend.kind: {plan.kind!r} is not available; allowed: {', '.join(AVAILABLE)}")
    ctx.backend = backend
    ctx.writer = backend.writer
    return backend


async def start_fake_nodes(
    *, kubeconfig: str | None, scenario: Scenario, heartbeat: float = 10.0
) -> FakeNodes:
    """`gpuyard fake-nodes`: the scenario's nodes and kubelets for the API server of `kubeconfig`
    (imported here, lazily: the Kubernetes extra may be absent where only the fake cluster runs)."""
    from gpuyard.kubecluster.fakenodes import FakeNodes, connect

    return FakeNodes(await connect(kubeconfig), scenario=scenario, heartbeat=heartbeat)
