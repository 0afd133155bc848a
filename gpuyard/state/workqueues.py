"""Work queues: store changes become keys in de-duplicating work queues that reconcilers drain.

Reconcilers never receive payloads: a change to an object becomes its *key* in each interested
reconciler's :class:`WorkQueue`, and the reconciler reads the latest state from the store. The
queue follows client-go's rules:

* a key waiting in the queue is not added twice (de-duplication bounds memory by the number of
  distinct keys, however fast events arrive);
* a key is never processed by two workers at once;
* a key added while it is being processed is processed again afterwards (never lost);
* a failed reconcile is retried with exponential backoff per key; a write the API server refused
  or did not answer is logged as one `reconcile.retry` warning, any other error with its traceback.

:class:`ControllerRunner` connects a :class:`Reconciler` to the store: it lists, watches from
the list's resourceVersion, re-lists on :class:`Gone`, and runs `concurrency` workers.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from gpuyard.state.backend import BackendError
from gpuyard.state.clock import Clock
from gpuyard.state.store import Conflict, Gone, Store, WatchEvent

__all__ = [
    "ControllerRunner",
    "ObjectKey",
    "Reconciler",
    "Requeue",
    "Watch",
    "WorkQueue",
]

log = structlog.get_logger(__name__)

ObjectKey = tuple[str, str]  # (namespace, name)
Mapper = Callable[[Any], Iterable[ObjectKey]]


class QueueShutDown(Exception):
    """The work queue was shut down while waiting."""


class WorkQueue:
    """De-duplicating, per-key-exclusive work queue with delayed adds and per-key backoff."""

    def __init__(
        self, *, clock: Clock, name: str = "", base_delay: float = 0.05, max_delay: float = 60.0
    ) -> None:
        self.name = name
        self._clock = clock
        self._queue: deque[ObjectKey] = deque()
        self._dirty: set[ObjectKey] = set()
        self._processing: set[ObjectKey] = set()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._delayed: dict[ObjectKey, tuple[float, asyncio.Task[None]]] = {}
        self._failures: dict[ObjectKey, int] = {}
        self._base = base_delay
        self._max = max_delay
        self._shutdown = False
        self.adds = 0

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def processing(self) -> int:
        return len(self._processing)

    @property
    def delayed(self) -> int:
        return len(self._delayed)

    def add(self, key: ObjectKey) -> None:
        if self._shutdown or key in self._dirty:
            return
        self.adds += 1
        self._dirty.add(key)
        if key in self._processing:
            return  # re-queued by done()
        self._queue.append(key)
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                break

    def add_after(self, key: ObjectKey, delay: float) -> None:
        """Add `key` after `delay` seconds on the clock; an earlier pending add wins."""
        if self._shutdown:
            return
        if delay <= 0:
            self.add(key)
            return
        due = self._clock.now() + delay
        pending = self._delayed.get(key)
        if pending is not None:
            if pending[0] <= due:
                return
            pending[1].cancel()
        self._delayed[key] = (due, asyncio.get_running_loop().create_task(self._add_later(key, delay)))

    async def _add_later(self, key: ObjectKey, delay: float) -> None:
        try:
            await self._clock.sleep(delay)
        except asyncio.CancelledError:
            return
        self._delayed.pop(key, None)
        self.add(key)

    def add_rate_limited(self, key: ObjectKey) -> float:
        """Re-add after an exponential backoff for this key; return the delay used."""
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        delay = min(self._max, self._base * 2.0**n)
        self.add_after(key, delay)
        return delay

    def forget(self, key: ObjectKey) -> None:
        """Reset the key's backoff after a successful reconcile."""
        self._failures.pop(key, None)

    async def get(self) -> ObjectKey:
        while not self._queue:
            if self._shutdown:
                raise QueueShutDown(self.name)
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                # pass the wake-up on if we were woken and cancelled at the same time
                if fut.done() and not fut.cancelled() and self._queue:
                    self._wake_one()
                raise
        key = self._queue.popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def _wake_one(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def done(self, key: ObjectKey) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            self._wake_one()

    def shut_down(self) -> None:
        self._shutdown = True
        for _, task in self._delayed.values():
            task.cancel()
        self._delayed.clear()
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)


# --- reconcilers ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Watch:
    """A kind a reconciler follows, and how its objects map to the reconciler's keys."""

    kind: str
    mapper: Mapper | None = None  # None: the object's own (namespace, name)


@dataclass(frozen=True, slots=True)
class Requeue:
    """Returned by `reconcile` to look at the key again after `after` seconds."""

    after: float


class Reconciler(Protocol):
    """What :class:`ControllerRunner` drives: the kinds it watches (and how their objects map to
    keys), how many workers it gets, and `reconcile(key)`."""

    @property
    def name(self) -> str: ...

    @property
    def watches(self) -> Sequence[Watch]: ...

    @property
    def concurrency(self) -> int: ...

    async def reconcile(self, key: ObjectKey) -> Requeue | None: ...


def _own_key(obj: Any) -> Iterable[ObjectKey]:
    return ((obj.metadata.namespace, obj.metadata.name),)


class ControllerRunner:
    """Feeds a reconciler de-duplicated keys from the store and runs its workers."""

    def __init__(self, reconciler: Reconciler, *, store: Store, clock: Clock, metrics: Any = None) -> None:
        self.reconciler = reconciler
        self.store = store
        self.clock = clock
        self.queue = WorkQueue(clock=clock, name=reconciler.name)
        self._mappers = {w.kind: (w.mapper or _own_key) for w in reconciler.watches}
        self._metrics = metrics
        self.reconciles = 0
        self.errors = 0
        self.synced = asyncio.Event()

    def enqueue_event(self, event: WatchEvent) -> None:
        for key in self._mappers[event.object.kind](event.object):
            self.queue.add(key)

    def _relist(self) -> int:
        rv = self.store.resource_version
        for kind, mapper in self._mappers.items():
            for obj in self.store.list(kind):
                for key in mapper(obj):
                    self.queue.add(key)
        return rv

    async def _pump(self) -> None:
        """LIST, then WATCH from the list's version; on Gone, LIST again (level-triggered)."""
        rv = self._relist()
        self.synced.set()
        while True:
            try:
                async for event in self.store.watch(list(self._mappers), since=rv):
                    self.enqueue_event(event)
                return  # store closed
            except Gone:
                log.info("watch.relist", controller=self.reconciler.name)
                rv = self._relist()

    async def _worker(self) -> None:
        queue = self.queue
        name = self.reconciler.name
        while True:
            try:
                key = await queue.get()
            except QueueShutDown:
                return
            started = time.perf_counter()
            try:
                result = await self.reconciler.reconcile(key)
            except asyncio.CancelledError:
                queue.done(key)
                raise
            except Conflict:
                queue.done(key)
                queue.add(key)  # someone wrote in between: look again at the newest state
            except (BackendError, TimeoutError) as exc:
                # the API server refused or did not answer a write: expected, retried, said in one line
                # (a traceback says nothing more, and rendering one costs more than the pass)
                self.errors += 1
                queue.done(key)
                delay = queue.add_rate_limited(key)
                log.warning(
                    "reconcile.retry",
                    controller=name,
                    key="/".join(key),
                    error=str(exc) or type(exc).__name__,
                    retry_in=round(delay, 3),
                )
            except Exception:
                self.errors += 1
                queue.done(key)
                delay = queue.add_rate_limited(key)
                log.exception("reconcile.error", controller=name, key="/".join(key), retry_in=round(delay, 3))
            else:
                queue.done(key)
                queue.forget(key)
                if result is not None:
                    queue.add_after(key, result.after)
            finally:
                self.reconciles += 1
                if self._metrics is not None:
                    self._metrics.observe_reconcile(name, time.perf_counter() - started)

    async def run(self) -> None:
        """Run the pump and the workers until cancelled."""
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._pump(), name=f"{self.reconciler.name}-pump")
                for i in range(max(1, self.reconciler.concurrency)):
                    tg.create_task(self._worker(), name=f"{self.reconciler.name}-worker-{i}")
        finally:
            self.queue.shut_down()
