"""Leader fencing over an API server: a leader past its renew deadline stops writing even when
its event loop is too busy to run the renew loop, a hung renew round is cut short, and a
standby measures the holder's lease on a monotonic clock (a wall-clock jump expires nobody)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpuyard.apis.core import Node
from gpuyard.apis.resources import resource_for
from gpuyard.kubecluster.client import KubeClient
from gpuyard.kubecluster.leading import LeaderElector, round_timeout
from gpuyard.kubecluster.writing import KubeWriter
from gpuyard.state.backend import BackendError
from gpuyard.state.clock import RealClock
from gpuyard.state.config import LeaderElectionConfig
from gpuyard.state.store import Store
from tests.builders import make_node
from tests.kubernetes.conftest_backend import FakeApiServerView, served

__all__ = ["served"]

NAMESPACE = "gpuyard-system"
LEASES = resource_for("Lease")


def config(identity: str, *, duration: float = 3.0, deadline: float = 1.0) -> LeaderElectionConfig:
    return LeaderElectionConfig(
        identity=identity, lease_duration=duration, renew_deadline=deadline, retry_period=0.05
    )


async def connect(server: FakeApiServerView) -> KubeClient:
    server.ensure_namespace(NAMESPACE)
    return await KubeClient.connect(kubeconfig=str(server.kubeconfig), request_timeout=30.0)


@asynccontextmanager
async def leading(elector: LeaderElector) -> AsyncIterator[asyncio.Task[None]]:
    """The elector's loop running, once it leads."""
    task = asyncio.create_task(elector.run())
    try:
        await asyncio.wait_for(elector.wait_leading(), 10)
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def fenced_writer(client: KubeClient, elector: LeaderElector) -> KubeWriter:
    """A writer asking the elector before each write, as the Kubernetes backend wires it."""
    store = Store()
    store.register(Node)
    return KubeWriter(
        client=client,
        store=store,
        may_write=lambda: None if elector.is_leader() else "not the leader",
    )


def node_posts(server: FakeApiServerView) -> int:
    return sum(1 for m, p in server.requests if m == "POST" and p.rstrip("/").endswith("nodes"))


def busy(seconds: float) -> None:
    """Hold the event loop (a long scheduling cycle, a GC pause) for `seconds`."""
    time.sleep(seconds)


class Manual:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class JumpingClock(RealClock):
    """The wall clock, set `offset` seconds ahead (an NTP step, an operator's `date -s`)."""

    offset = 0.0

    def now(self) -> float:
        return super().now() + self.offset

    def utcnow(self) -> datetime:
        return super().utcnow() + timedelta(seconds=self.offset)


def test_a_round_never_outlasts_the_deadline() -> None:
    cfg = config("a", duration=15, deadline=10)
    assert round_timeout(cfg, left=None) == 5  # a candidate: half the deadline
    assert round_timeout(cfg, left=2.5) == 2.5  # a leader: never past its deadline
    assert round_timeout(cfg, left=-1) == 0


async def test_lead_lapses_at_the_deadline_without_the_renew_loop(served: FakeApiServerView) -> None:
    client = await connect(served)
    clock = Manual()
    elector = LeaderElector(
        client=client, clock=RealClock(), namespace=NAMESPACE, config=config("a"), monotonic=clock
    )
    writer = fenced_writer(client, elector)
    try:
        async with leading(elector):
            assert elector.is_leader()
            clock.t += 0.99  # just inside the deadline: still leads, the write goes through
            assert elector.is_leader()
            await writer.create(make_node("written", gpus=1))
            posts = node_posts(served)
            clock.t += 0.01  # the deadline, with no await in between: the renew loop never ran
            assert not elector.is_leader()
            with pytest.raises(BackendError, match="not the leader"):
                await writer.create(make_node("refused", gpus=1))
            assert node_posts(served) == posts
            assert served.get("nodes", "", "refused") is None
    finally:
        await client.close()


async def test_busy_loop_fences_the_leader(served: FakeApiServerView) -> None:
    client = await connect(served)
    elector = LeaderElector(client=client, clock=RealClock(), namespace=NAMESPACE, config=config("a"))
    writer = fenced_writer(client, elector)
    try:
        async with leading(elector) as task:
            busy(1.1)  # the loop is busy past the renew deadline: no renew round can run
            assert not task.done()
            assert not elector.is_leader()
            with pytest.raises(BackendError, match="not the leader"):
                await writer.create(make_node("late", gpus=1))
            assert served.get("nodes", "", "late") is None
            await asyncio.wait_for(elector.wait_lost(), 10)  # the loop, once it runs, gives up
            assert not elector.is_leader()
    finally:
        await client.close()


@pytest.mark.dev_apiserver_only
async def test_hung_renew_is_cut_short_and_the_lead_lost(served: FakeApiServerView) -> None:
    client = await connect(served)  # its own request timeout (30 s) is far longer than the test waits
    elector = LeaderElector(client=client, clock=RealClock(), namespace=NAMESPACE, config=config("a"))
    try:
        async with leading(elector) as task:
            served.server.faults.slow(60)  # every answer, the Lease's GET and PUT too, hangs
            await asyncio.wait_for(elector.wait_lost(), 10)
            assert not elector.is_leader()
            await asyncio.wait_for(task, 5)  # the loop ended: the runtime stops the process
    finally:
        served.clear_faults()
        await client.close()


async def hold_lease(client: KubeClient, holder: str, *, duration: int) -> None:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    body: dict[str, Any] = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "gpuyard", "namespace": NAMESPACE},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration, "renewTime": now},
    }
    await client.create(LEASES, body)


def lease_holder(server: FakeApiServerView) -> str:
    lease = server.get("leases", NAMESPACE, "gpuyard")
    assert lease is not None
    return str(lease["spec"].get("holderIdentity") or "")


async def test_wall_clock_jump_expires_nobody(served: FakeApiServerView) -> None:
    client = await connect(served)
    clock = JumpingClock()
    standby = LeaderElector(client=client, clock=clock, namespace=NAMESPACE, config=config("b"))
    try:
        await hold_lease(client, "a", duration=15)
        assert not await standby.try_acquire_or_renew()
        assert standby.holder == "a"
        clock.offset = 3600.0  # an hour ahead: a wall clock would see the lease long expired
        assert not await standby.try_acquire_or_renew()
        assert standby.holder == "a"
        assert lease_holder(served) == "a"
    finally:
        await client.close()


async def test_unrenewed_lease_expires_on_the_monotonic_clock(served: FakeApiServerView) -> None:
    client = await connect(served)
    mono = Manual()
    standby = LeaderElector(
        client=client, clock=RealClock(), namespace=NAMESPACE, config=config("b"), monotonic=mono
    )
    try:
        await hold_lease(client, "a", duration=15)
        assert not await standby.try_acquire_or_renew()
        mono.t += 14.9
        assert not await standby.try_acquire_or_renew()
        mono.t += 0.1  # 15 s since the standby saw the renewTime it still sees: expired
        assert await standby.try_acquire_or_renew()
        assert lease_holder(served) == "b"
    finally:
        await client.close()
