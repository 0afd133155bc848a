"""A whole platform on the real clock, serving its HTTP API on a free port, for end-to-end tests
that talk to it as a client (the agent, the device plugin, curl-style checks)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from gpuyard.platform.runtime import Platform
from gpuyard.state.config import Settings

T = TypeVar("T")


@contextlib.asynccontextmanager
async def live_platform(cluster: str = "configs/clusters/demo.yaml") -> AsyncIterator[Platform]:
    """The platform over scenario `cluster`, synced and serving (`platform.url`); stopped after."""
    platform = Platform(
        Settings(
            server={"host": "127.0.0.1", "port": 0},
            backend={"cluster": cluster, "data_dir": None, "clock": "real"},
        )
    )
    task = asyncio.create_task(platform.run())
    try:
        await asyncio.wait_for(platform.backend.synced.wait(), 5)
        await asyncio.wait_for(platform.serving.wait(), 5)
        yield platform
    finally:
        platform.stop()
        await asyncio.wait_for(task, 10)


async def until(check: Callable[[], Awaitable[T]], *, timeout: float = 10.0) -> T:
    """`await check()` every 50 ms until it is truthy or `timeout` seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result or time.monotonic() > deadline:
            return result
        await asyncio.sleep(0.05)
