"""Shared test fixtures: every async test must leave no task running.

Property tests (hypothesis) draw new examples on every run, so a developer's `make test` keeps
exploring. CI sets `HYPOTHESIS_PROFILE=ci`: the same examples on every run (derandomised), so a
red CI means the change broke something, not that this run happened to draw a rare case; a rare
case found locally becomes a plain regression test (as in tests/unit/quota/test_reclaim.py).
"""

from __future__ import annotations

import asyncio
import os

import pytest
import pytest_asyncio
import structlog
from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# structlog's default console renderer draws each logged traceback with rich, which costs tens of
# milliseconds apiece; in-process tests log what they inject, so the suite renders them plainly.
structlog.configure(
    processors=[
        *structlog.get_config()["processors"][:-1],
        structlog.dev.ConsoleRenderer(exception_formatter=structlog.dev.plain_traceback),
    ]
)


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
