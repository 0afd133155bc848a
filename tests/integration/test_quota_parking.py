"""The scheduling loop leaves quota-blocked jobs parked while quota still blocks their shape:
a change elsewhere (a node joins) sends none of them through a cycle; freeing quota does."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

from gpuyard.scheduler import SchedulerLoop
from gpuyard.state.clock import VirtualClock, settle
from gpuyard.state.config import Settings
from gpuyard.state.context import Context
from gpuyard.state.kinds import register_kinds
from gpuyard.state.store import Store

_spec = importlib.util.spec_from_file_location(
    "queue_quota_bench", Path(__file__).resolve().parents[2] / "bench" / "queue_quota.py"
)
bench = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(bench)  # type: ignore[union-attr]


async def test_quota_blocked_jobs_stay_parked_until_quota_frees() -> None:
    clock = VirtualClock()
    store = Store()
    register_kinds(store)
    ctx = Context(store=store, clock=clock, settings=Settings(backend={"data_dir": None}))
    store.create(bench.node("node-0"))
    store.create(bench.quota("team", gmin=4, gmax=4, parent=None, is_parent=False))
    loop = SchedulerLoop(ctx)
    task = asyncio.create_task(loop.run())
    try:
        await loop.synced.wait()
        for i in range(6):
            store.create(bench.podgroup(f"job-{i}", "team", 4))
            await settle()
        await settle()
        placed = [k for k in loop.admission.jobs if loop.queue.is_running(k)]
        assert placed == [("team", "job-0")]
        blocked = [("team", f"job-{i}") for i in range(1, 6)]
        assert all(loop.queue.is_held(k) for k in blocked)
        attempts = {k: loop.state.recorder.attempts.get(k) for k in blocked}

        store.create(bench.node("node-1"))  # more room, but not more quota
        await settle()
        await clock.advance(1)
        await settle()
        assert {k: loop.state.recorder.attempts.get(k) for k in blocked} == attempts
        assert all(loop.queue.is_held(k) for k in blocked)

        store.delete("PodGroup", "team", "job-0")  # the job ended: the scheduler collects its Reservations
        await settle()
        await clock.advance(1)
        await settle()
        assert loop.queue.is_running(("team", "job-1"))
        assert not any(loop.queue.is_running(k) for k in blocked[1:])
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        store.close()
