"""Shared test fixtures: every async test must leave no task running."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio


@pytest_asyncio.fixture(autouse=True)
async def no_leaked_tasks(request: pytest.FixtureRequest):
    """Fail a test that leaves tasks running (they are cancelled so later tests stay clean)."""
    before = {t for t in asyncio.all_tasks() if not t.done()}
    yield
    for _ in range(3):  # let tasks that are finishing finish
        await asyncio.sleep(0)
    current = asyncio.current_task()
    leaked = [t for t in asyncio.all_tasks() if t is not current and not t.done() and t not in before]
    if leaked:
        for t in leaked:
            t.cancel()
        await asyncio.gather(*leaked, return_exceptions=True)
        names = ", ".join(
            sorted(t.get_name() + ":" + getattr(t.get_coro(), "__qualname__", "?") for t in leaked)
        )
        pytest.fail(f"test left {len(leaked)} task(s) running: {names}")
