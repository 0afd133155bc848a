"""Health on the node: an injected XID / ECC error / lost GPU reaches the published NodeTopology within
one health interval; application XIDs do not; NVML and server outages are retried, never hidden."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import structlog

from gpuyard.apis.devices import NodeTopology
from gpuyard.devices.agent.fakenvml import FakeNVML
from gpuyard.devices.agent.health import ANNOTATION_UNHEALTHY_REASONS, HealthEvent
from gpuyard.devices.agent.inventory import Inventory
from gpuyard.devices.agent.running import Agent, AgentTimings, PrintSink, SinkError

INTERVAL = 0.05
NO_SYS = Path("no-such-sysfs")  # the fake node has no RDMA NICs in sysfs
TIMINGS = AgentTimings(health_interval_s=INTERVAL, resync_s=60, backoff_min_s=0.01, backoff_max_s=0.05)


class FlakySink(PrintSink):
    """Fails the first `failures` writes as an unreachable server would."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.attempts = 0

    async def put(self, topology: NodeTopology) -> None:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise SinkError("cannot reach http://gpuyard:8080: connection refused")
        await super().put(topology)


@contextlib.asynccontextmanager
async def running(agent: Agent) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(agent.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(check: Callable[[], bool], *, timeout: float = 2.0) -> None:
    """Wait for `check` in real time (NVML waits in worker threads, gRPC on sockets)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def unhealthy(sink: PrintSink) -> list[int]:
    last = sink.written[-1]
    return [g.index for g in last.spec.gpus if g.health != "Healthy"]


@pytest.fixture
def fake() -> FakeNVML:
    return FakeNVML.shaped("dgx-a100", node_name="a100-0")


async def test_xid_marks_the_gpu_unhealthy_within_one_interval(fake: FakeNVML) -> None:
    sink = PrintSink()
    agent = Agent(Inventory(node="a100-0", nvml=fake, sysfs_root=NO_SYS), sink, timings=TIMINGS)
    async with running(agent):
        await until(lambda: bool(sink.written))
        assert unhealthy(sink) == []
        fake.inject_xid(4, 13)  # an application error: the GPU is fine
        await asyncio.sleep(3 * INTERVAL)
        assert len(sink.written) == 1
        started = time.monotonic()
        fake.inject_xid(4, 79)  # fell off the bus
        await until(lambda: unhealthy(sink) == [4])
        assert time.monotonic() - started < INTERVAL + 1.0  # one interval, plus slack for a busy machine
        assert sink.written[-1].metadata.annotations[ANNOTATION_UNHEALTHY_REASONS] == '{"4":"XID 79"}'
        fake.inject_ecc(6)
        await until(lambda: unhealthy(sink) == [4, 6])
        fake.lose_gpu(1)
        await until(lambda: unhealthy(sink) == [1, 4, 6])
    assert fake.initialized == 0  # NVML closed on the way out


async def test_unreachable_server_is_retried_and_logged_once(fake: FakeNVML) -> None:
    sink = FlakySink(failures=3)
    agent = Agent(Inventory(node="a100-0", nvml=fake, sysfs_root=NO_SYS), sink, timings=TIMINGS)
    with structlog.testing.capture_logs() as logs:
        async with running(agent):
            await until(lambda: bool(sink.written), timeout=3)
            fake.inject_xid(2, 48)  # double-bit ECC reported as an XID
            await until(lambda: unhealthy(sink) == [2])
    failures = [e for e in logs if "cannot write NodeTopology" in e["event"]]
    assert sink.attempts >= 4 and len(failures) == 3
    assert any("written again" in e["event"] for e in logs)


async def test_nvml_that_fails_to_start_is_retried(fake: FakeNVML) -> None:
    fake.fail_init = 9  # driver not loaded yet
    sink = PrintSink()
    agent = Agent(Inventory(node="a100-0", nvml=fake, sysfs_root=NO_SYS), sink, timings=TIMINGS)
    with structlog.testing.capture_logs() as logs:
        async with running(agent):
            await asyncio.sleep(0.1)
            assert not sink.written and not agent.ready.is_set()
            fake.fail_init = None
            await until(lambda: bool(sink.written))
    assert len([e for e in logs if e["event"].startswith("node discovery failed")]) == 1


async def test_preset_source_needs_no_nvml() -> None:
    sink = PrintSink()
    agent = Agent(Inventory(node="t4-0", source="preset", preset="pcie-t4x4"), sink, timings=TIMINGS)
    async with running(agent):
        await until(lambda: bool(sink.written))
    assert sink.written[0].metadata.name == "t4-0" and len(sink.written[0].spec.gpus) == 4


@pytest.mark.parametrize(
    "exc",
    [TypeError("takes 2 positional arguments but 3 were given"), AttributeError("eventType"), OSError(5)],
)
async def test_no_exception_of_nvml_stops_the_agent(fake: FakeNVML, exc: Exception) -> None:
    """A binding that raises anything at start is retried with one log line; a health watch that
    raises anything keeps the published topology, logs once and keeps watching."""
    fake.raise_on("nvmlDeviceGetCount", exc)
    sink = PrintSink()
    agent = Agent(Inventory(node="a100-0", nvml=fake, sysfs_root=NO_SYS), sink, timings=TIMINGS)
    with structlog.testing.capture_logs() as logs:
        async with running(agent) as task:
            await asyncio.sleep(0.1)
            assert not sink.written and not task.done()
            fake.raise_on("nvmlDeviceGetCount", None)
            await until(lambda: bool(sink.written))
            fake.raise_on("nvmlEventSetWait", exc)
            await asyncio.sleep(5 * INTERVAL)
            assert not task.done() and unhealthy(sink) == []
            fake.raise_on("nvmlEventSetWait", None)
            fake.inject_xid(3, 79)
            await until(lambda: unhealthy(sink) == [3])
    started = [e for e in logs if e["event"].startswith("node discovery failed")]
    assert len(started) == 1 and type(exc).__name__ in started[0]["error"]
    waits = [e for e in logs if "event wait failed" in e["event"]]
    assert len(waits) == 1 and type(exc).__name__ in waits[0]["error"]


async def test_a_failing_watcher_is_logged_once_and_waited_out(fake: FakeNVML) -> None:
    sink = PrintSink()
    agent = Agent(Inventory(node="a100-0", nvml=fake, sysfs_root=NO_SYS), sink, timings=TIMINGS)
    with structlog.testing.capture_logs() as logs:
        async with running(agent) as task:
            await until(lambda: bool(sink.written))
            assert agent._watcher is not None

            def broken(timeout_s: float) -> list[HealthEvent]:
                raise ZeroDivisionError("division by zero")

            agent._watcher.wait = broken  # type: ignore[method-assign]
            await asyncio.sleep(5 * INTERVAL)
            assert not task.done() and len(sink.written) == 1
    failed = [e for e in logs if e["event"].startswith("GPU health watch failed")]
    assert len(failed) == 1 and "ZeroDivisionError" in failed[0]["error"]
