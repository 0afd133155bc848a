"""A whole platform on the virtual clock, over a scenario file, for the demo-style integration tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import structlog

from gpuyard.controllers.reconciling import JobReconciler
from gpuyard.platform.runtime import Platform
from gpuyard.state.clock import VirtualClock
from gpuyard.state.config import Settings


@contextlib.asynccontextmanager
async def virtual_platform(
    cluster: Path, *, prepare: Callable[[Platform], None] | None = None
) -> AsyncIterator[Platform]:
    """Run operator, scheduler and fake cluster over `cluster` on a virtual clock the test drives;
    `prepare(platform)` runs before the platform starts (e.g. to store quotas)."""
    settings = Settings(backend={"cluster": str(cluster), "data_dir": None, "clock": "virtual"})
    platform = Platform(settings, clock=VirtualClock(), serve_http=False, drive_clock=False)
    names = {c.name for c in platform.components}
    if "job-operator" not in names:
        platform.add_component(JobReconciler(platform.ctx))
    if "scheduler" not in names:
        from gpuyard.scheduler import components as scheduler_components

        for c in scheduler_components(platform.ctx):
            platform.add_component(c)
    if prepare is not None:
        prepare(platform)
    task = asyncio.create_task(platform.run())
    await asyncio.wait_for(platform.backend.synced.wait(), 5)
    try:
        with structlog.testing.capture_logs():
            yield platform
    finally:
        platform.stop()
        await asyncio.wait_for(task, 10)
