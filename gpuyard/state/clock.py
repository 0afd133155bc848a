"""Time for every component: a real clock for `serve`, a virtual one for tests and simulations.

Components never call `asyncio.sleep` or `time.time` for timing; they use the injected
:class:`Clock`. With :class:`VirtualClock`, time stands still while anything can run and then
jumps straight to the next due timer, so a 10-hour workload finishes in seconds of wall time
and every run is reproducible.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

__all__ = ["MAX_TIMESTAMP", "Clock", "RealClock", "VirtualClock", "settle"]

MAX_TIMESTAMP = datetime(9000, 1, 1, tzinfo=UTC).timestamp()
"""The latest instant the virtual clock reaches: a timer due later never fires (it sleeps until
cancelled), so time never moves past what a `datetime` can hold."""


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch (virtual or real)."""
        ...

    def utcnow(self) -> datetime: ...

    async def sleep(self, seconds: float) -> None: ...


class RealClock:
    """Wall-clock time and `asyncio.sleep`."""

    def now(self) -> float:
        return time.time()

    def utcnow(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


async def settle(*, max_rounds: int = 10_000) -> None:
    """Yield to the event loop until no other callback is ready to run (the loop is idle)."""
    loop = asyncio.get_running_loop()
    for _ in range(max_rounds):
        await asyncio.sleep(0)
        ready = getattr(loop, "_ready", None)
        if ready is None:  # an event loop without the attribute: a fixed number of rounds
            if _ >= 50:
                return
        elif not ready:
            return


class VirtualClock:
    """A clock whose time moves only when told to, or when the loop is idle (`run`).

    `advance(seconds)` fires every timer due within that span, in time order, letting the loop
    settle after each, so components see the same sequence of instants they would in real time.
    """

    def __init__(self, *, start: datetime | None = None) -> None:
        self._epoch = (start or datetime(2026, 1, 1, tzinfo=UTC)).timestamp()
        self._now = self._epoch
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._timer_added: asyncio.Event | None = None

    def now(self) -> float:
        return self._now

    def utcnow(self) -> datetime:
        return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=self._now)

    @property
    def elapsed(self) -> float:
        """Virtual seconds since the clock started."""
        return self._now - self._epoch

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        due = self._now + seconds
        if not due <= MAX_TIMESTAMP:  # beyond what the clock can show (or NaN): never due
            await fut
            return
        heapq.heappush(self._timers, (due, next(self._seq), fut))
        if self._timer_added is not None:
            self._timer_added.set()
        await fut

    def next_due(self) -> float | None:
        """When the earliest live timer is due, or None."""
        while self._timers and self._timers[0][2].done():  # cancelled sleepers
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def _fire_due(self) -> int:
        fired = 0
        while self._timers and self._timers[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._timers)
            if not fut.done():
                fut.set_result(None)
                fired += 1
        return fired

    async def advance(self, seconds: float) -> None:
        """Move time forward by `seconds`, firing timers in order and settling after each."""
        target = min(self._now + max(0.0, seconds), MAX_TIMESTAMP)
        await settle()
        while True:
            due = self.next_due()
            if due is None or due > target:
                break
            self._now = max(self._now, due)
            self._fire_due()
            await settle()
        self._now = target
        await settle()

    async def run_until(
        self,
        condition: Callable[[], bool],
        *,
        timeout: float,
    ) -> bool:
        """Jump from timer to timer until `condition()` holds or `timeout` virtual seconds pass."""
        deadline = min(self._now + timeout, MAX_TIMESTAMP)
        await settle()
        while not condition():
            due = self.next_due()
            if due is None or due > deadline:
                self._now = max(self._now, deadline) if due is not None else self._now
                return condition()
            self._now = max(self._now, due)
            self._fire_due()
            await settle()
        return True

    async def run(self, *, stop: Callable[[], bool] | None = None) -> None:
        """Drive time automatically: whenever the loop is idle, jump to the next timer.

        Runs until cancelled (or `stop()` is true); used by `serve --clock virtual` and replays.
        """
        self._timer_added = asyncio.Event()
        try:
            while stop is None or not stop():
                await settle()
                if self.next_due() is None:
                    self._timer_added.clear()
                    await self._timer_added.wait()
                    continue
                self._now = max(self._now, self.next_due() or self._now)
                self._fire_due()
        finally:
            self._timer_added = None
