"""Work queues and reconciler runners: dedup, no lost keys, backoff, back-pressure, no leaks."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from gpuyard.state.backend import BackendError
from gpuyard.state.clock import VirtualClock
from gpuyard.state.kinds import register_kinds
from gpuyard.state.store import Store
from gpuyard.state.workqueues import ControllerRunner, Requeue, Watch, WorkQueue
from tests.builders import make_pod


async def test_queue_deduplicates_waiting_keys():
    q = WorkQueue(clock=VirtualClock())
    for _ in range(1000):
        q.add(("ns", "a"))
    q.add(("ns", "b"))
    assert len(q) == 2
    assert await q.get() == ("ns", "a")
    assert await q.get() == ("ns", "b")


async def test_key_added_while_processing_is_processed_again_not_concurrently():
    q = WorkQueue(clock=VirtualClock())
    q.add(("ns", "a"))
    key = await q.get()
    q.add(key)  # a change arrives while the key is being reconciled
    assert len(q) == 0, "must not be handed to a second worker while processing"
    q.done(key)
    assert len(q) == 1
    assert await q.get() == key
    q.done(key)
    assert len(q) == 0


async def test_add_after_uses_the_clock_and_earliest_wins():
    clock = VirtualClock()
    q = WorkQueue(clock=clock)
    q.add_after(("ns", "a"), 10)
    q.add_after(("ns", "a"), 5)
    q.add_after(("ns", "a"), 20)
    await clock.advance(4.9)
    assert len(q) == 0
    await clock.advance(0.2)
    assert len(q) == 1
    await clock.advance(30)
    assert len(q) == 1, "the later adds were superseded by the earliest"
    q.shut_down()


async def test_backoff_grows_then_resets():
    q = WorkQueue(clock=VirtualClock(), base_delay=1, max_delay=8)
    delays = [q.add_rate_limited(("ns", "a")) for _ in range(6)]
    assert delays == [1, 2, 4, 8, 8, 8]
    q.forget(("ns", "a"))
    assert q.add_rate_limited(("ns", "a")) == 1
    q.shut_down()


class Recorder:
    name = "recorder"
    concurrency = 3
    watches = (Watch("Pod"),)

    def __init__(self, store: Store) -> None:
        self.store = store
        self.calls: list[tuple[str, str]] = []
        self.active: set[tuple[str, str]] = set()
        self.overlap = False
        self.fail_first: set[tuple[str, str]] = set()
        self.seen_versions: dict[tuple[str, str], int] = {}
        self.error: Exception = RuntimeError("transient")

    async def reconcile(self, key):
        if key in self.active:
            self.overlap = True
        self.active.add(key)
        try:
            await asyncio.sleep(0)
            self.calls.append(key)
            obj = self.store.get("Pod", *key)
            if obj is not None:
                self.seen_versions[key] = obj.resource_version
            if key in self.fail_first:
                self.fail_first.discard(key)
                raise self.error
            return None
        finally:
            self.active.discard(key)


async def test_runner_sees_latest_state_retries_errors_and_stops_cleanly():
    clock = VirtualClock()
    store = Store(now=clock.utcnow)
    register_kinds(store)
    store.create(make_pod("existing"))
    rec = Recorder(store)
    rec.fail_first.add(("default", "flaky"))
    runner = ControllerRunner(rec, store=store, clock=clock)
    task = asyncio.create_task(runner.run())
    await clock.advance(0)
    assert ("default", "existing") in rec.calls  # initial LIST
    pod = store.create(make_pod("busy"))
    for i in range(50):  # a burst of changes to one object
        copy = store.get("Pod", "default", "busy").clone()
        copy.metadata.labels["n"] = str(i)
        store.update(copy)
    store.create(make_pod("flaky"))
    await clock.advance(5)
    assert rec.calls.count(("default", "busy")) < 50, "bursts are de-duplicated"
    assert rec.seen_versions[("default", "busy")] == pod.resource_version + 50, (
        "the last reconcile saw the newest state"
    )
    assert rec.calls.count(("default", "flaky")) == 2, "failed once, retried after backoff"
    assert not rec.overlap
    assert runner.errors == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize(
    ("error", "event", "level", "traceback"),
    [
        (BackendError("injected 500 on create Pod"), "reconcile.retry", "warning", False),
        (TimeoutError("injected timeout on patch_status TFJob"), "reconcile.retry", "warning", False),
        (RuntimeError("a bug"), "reconcile.error", "error", True),
    ],
)
async def test_a_failed_write_is_one_warning_and_a_bug_keeps_its_traceback(error, event, level, traceback):
    clock = VirtualClock()
    store = Store(now=clock.utcnow)
    register_kinds(store)
    rec = Recorder(store)
    rec.error = error
    rec.fail_first.add(("default", "p"))
    store.create(make_pod("p"))
    runner = ControllerRunner(rec, store=store, clock=clock)
    with capture_logs() as logs:
        task = asyncio.create_task(runner.run())
        await clock.advance(5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert rec.calls.count(("default", "p")) == 2, "retried after backoff"
    assert runner.errors == 1
    [line] = [entry for entry in logs if entry["event"].startswith("reconcile.")]
    assert (line["event"], line["log_level"], line["key"]) == (event, level, "default/p")
    assert line.get("exc_info", False) is traceback
    if not traceback:
        assert line["error"] == str(error)


async def test_requeue_after_runs_again_on_the_clock():
    clock = VirtualClock()
    store = Store(now=clock.utcnow)
    register_kinds(store)

    class Periodic:
        name = "periodic"
        concurrency = 1
        watches = (Watch("Pod"),)
        times: list[float] = []

        async def reconcile(self, key):
            self.times.append(clock.elapsed)
            return Requeue(after=60) if len(self.times) < 3 else None

    rec = Periodic()
    store.create(make_pod("a"))
    task = asyncio.create_task(ControllerRunner(rec, store=store, clock=clock).run())
    await clock.advance(600)
    assert rec.times == [0, 60, 120]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
