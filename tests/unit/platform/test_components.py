"""The component seam: every package's `components(ctx)` gives typed runnables and reconcilers,
and the runtime starts those that need the lead only once the backend has synced and this
replica leads."""

from __future__ import annotations

import asyncio

import pytest

from gpuyard.platform.runtime import Platform, _component_factories
from gpuyard.state.clock import VirtualClock
from gpuyard.state.components import Reconciler, Runnable
from gpuyard.state.config import Settings
from gpuyard.state.context import Context

# every component a package may contribute, and whether it needs the lead (all of them write)
NEEDS_LEADER = {
    "job-operator": True,  # pods, services, PodGroups
    "job-event-cleaner": True,  # deletes the Events of jobs that are gone
    "cron-controller": True,  # creates and deletes a Cron's jobs, writes its status
    "model-version-creator": True,  # a succeeded job's ModelVersion
    "model-version": True,  # Models, image-build pods, ModelVersion status
    "dataset-cache": True,  # Fluid's Dataset and runtime of a job
    "tensorboard": True,  # a job's Tensorboard Deployment, Service, Ingress
    "mars-web": True,  # a MarsJob's web UI Ingresses
    "elastic-autoscaler": True,  # a job's HorizontalPodAutoscaler
    "scheduler": True,  # Reservations, PodGroup status, events
    "default-resource-classes": True,  # ResourceClasses
}
ALWAYS = {"job-operator", "scheduler", "default-resource-classes"}
RUNTIME_OWN = {"backend", "metrics"}  # the runtime's own, on every replica


def _settings() -> Settings:
    return Settings(backend={"cluster": "configs/clusters/demo.yaml", "data_dir": None, "clock": "virtual"})


def _platform() -> Platform:
    return Platform(_settings(), clock=VirtualClock(), serve_http=False, drive_clock=False)


def _contributed(ctx: Context) -> dict[str, bool]:
    """Every component the packages contribute: name -> needs_leader."""
    seen: dict[str, bool] = {}
    for factory in _component_factories():
        for item in factory(ctx):
            kinds = (isinstance(item, Runnable), isinstance(item, Reconciler))
            assert kinds in ((True, False), (False, True)), f"{item!r}: exactly one of the two"
            assert isinstance(item.needs_leader, bool)
            assert item.name not in seen, f"two components named {item.name}"
            seen[item.name] = item.needs_leader
    return seen


def test_every_component_of_every_package_is_a_runnable_or_a_reconciler() -> None:
    seen = _contributed(Context.for_tests())
    assert seen.keys() >= ALWAYS
    for name, needs_leader in seen.items():
        assert name in NEEDS_LEADER, f"a new component {name}: say here whether it needs the lead"
        assert needs_leader == NEEDS_LEADER[name], name


def test_the_platform_runs_them_behind_the_lead_and_its_own_on_every_replica() -> None:
    platform = _platform()
    seen = _contributed(Context.for_tests())
    led = {c.name for c in platform.components if c.needs_leader}
    everywhere = {c.name for c in platform.components if not c.needs_leader}
    assert led == {name for name, needs in seen.items() if needs}
    assert everywhere == RUNTIME_OWN | {name for name, needs in seen.items() if not needs}


class _Started:
    """A runnable that records when it starts."""

    def __init__(self, name: str, *, needs_leader: bool) -> None:
        self.name = name
        self.needs_leader = needs_leader
        self.started = asyncio.Event()

    async def run(self) -> None:
        self.started.set()
        await asyncio.Event().wait()


class _Election:
    """A `Leadership` the test decides: it leads once `lead()` is called, until `lose()`."""

    def __init__(self) -> None:
        self._leading = asyncio.Event()
        self._lost = asyncio.Event()

    def is_leader(self) -> bool:
        return self._leading.is_set() and not self._lost.is_set()

    @property
    def holder(self) -> str | None:
        return "this-replica" if self.is_leader() else "another-replica"

    async def wait_leading(self) -> None:
        await self._leading.wait()

    async def wait_lost(self) -> None:
        await self._lost.wait()

    def lead(self) -> None:
        self._leading.set()

    def lose(self) -> None:
        self._lost.set()


async def test_components_that_need_the_lead_start_only_while_this_replica_leads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    platform = _platform()
    election = _Election()
    monkeypatch.setattr(platform.backend, "leadership", election)
    reader = _Started("reader", needs_leader=False)
    writer = _Started("writer", needs_leader=True)
    platform.add_component(reader)
    platform.add_component(writer)
    task = asyncio.create_task(platform.run())
    try:
        await asyncio.wait_for(platform.backend.synced.wait(), 5)
        await asyncio.wait_for(reader.started.wait(), 5)
        for _ in range(20):
            await asyncio.sleep(0)
        assert not writer.started.is_set(), "synced, but not leading: no writer runs"
        assert platform.not_leader() == "not the leader; the leader is another-replica"

        election.lead()
        await asyncio.wait_for(writer.started.wait(), 5)
        assert platform.not_leader() is None

        election.lose()
        await asyncio.wait_for(task, 5)  # a replica that lost the lead stops
        assert platform.lost_leadership
    finally:
        platform.stop()
        await asyncio.wait_for(task, 5)


async def test_with_one_replica_they_start_once_the_backend_has_synced() -> None:
    platform = _platform()
    assert platform.backend.leadership is None
    writer = _Started("writer", needs_leader=True)
    platform.add_component(writer)
    task = asyncio.create_task(platform.run())
    try:
        await asyncio.wait_for(writer.started.wait(), 5)
        assert platform.backend.synced.is_set()
    finally:
        platform.stop()
        await asyncio.wait_for(task, 5)
