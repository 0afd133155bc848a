"""The scheduling queue of PodGroups waiting for placement: priority, then FIFO.

Three places a PodGroup can wait, after kube-scheduler's queue:

* **active** — ready to be tried, ordered by `spec.priority` (higher first), then creation time,
  then name; `pop` takes the head;
* **parked** — tried and did not fit; it stays parked until the cluster's capacity may have
  grown (the snapshot's `epoch` moved past the one it failed at: a node was added or changed, a
  reservation was released, a class changed), so a pending job costs nothing while nothing
  changes, and every job that could now fit is tried again in the next cycle;
* **backing off** — a transient failure (the assume's store write failed); back to active at
  a clock time.

The queue is best-effort FIFO: a head that does not fit does not block smaller jobs behind it.
:class:`SchedulingQueue` is the interface the queue/quota issue replaces (tenant queues,
fair share, backfill, aging).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Protocol

__all__ = ["PriorityFIFOQueue", "QueueKey", "SchedulingQueue"]

QueueKey = tuple[str, str]  # PodGroup (namespace, name)


class SchedulingQueue(Protocol):
    def add(self, key: QueueKey, *, priority: int, created: float) -> None:
        """Make `key` ready to be tried (a parked or backing-off key moves to active)."""
        ...

    def pop(self) -> QueueKey | None:
        """The next key to try, or None when no key is active."""
        ...

    def discard(self, key: QueueKey) -> None:
        """Forget `key` wherever it waits (deleted, suspended, fully placed)."""
        ...

    def park(self, key: QueueKey, *, epoch: int, priority: int, created: float) -> None:
        """`key` did not fit at snapshot `epoch`; keep it until capacity may have grown."""
        ...

    def backoff(self, key: QueueKey, *, until: float, priority: int, created: float) -> None: ...

    def wake_parked(self, epoch: int) -> int:
        """Activate every key parked before `epoch`; return how many."""
        ...

    def release_due(self, now: float) -> float | None:
        """Activate keys whose backoff ended by `now`; return when the next one ends (or None)."""
        ...

    def is_held(self, key: QueueKey) -> bool:
        """Parked or backing off: the key returns by itself when worth it."""
        ...

    def __len__(self) -> int: ...

    def waiting(self) -> int:
        """Keys anywhere in the queue (active, parked or backing off)."""
        ...


@dataclass(slots=True)
class _Held:
    priority: int
    created: float
    at: float  # parked epoch, or backoff end time


class PriorityFIFOQueue:
    """Priority then FIFO, with parking and backoff (see the module docstring)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, str, str, int]] = []
        self._active: dict[QueueKey, tuple[int, int]] = {}  # key -> (priority, heap sequence)
        self._parked: dict[QueueKey, _Held] = {}
        self._backoff: dict[QueueKey, _Held] = {}
        self._seq = itertools.count()

    def add(self, key: QueueKey, *, priority: int, created: float) -> None:
        self._parked.pop(key, None)
        self._backoff.pop(key, None)
        known = self._active.get(key)
        if known is not None and known[0] == priority:
            return
        seq = next(self._seq)
        self._active[key] = (priority, seq)
        heapq.heappush(self._heap, (-priority, created, key[0], key[1], seq))
        if len(self._heap) > 4 * len(self._active) + 1024:
            self._compact()

    def _compact(self) -> None:
        self._heap = [e for e in self._heap if self._active.get((e[2], e[3]), (0, -1))[1] == e[4]]
        heapq.heapify(self._heap)

    def pop(self) -> QueueKey | None:
        heap = self._heap
        while heap:
            _, _, ns, name, seq = heapq.heappop(heap)
            key = (ns, name)
            known = self._active.get(key)
            if known is not None and known[1] == seq:
                del self._active[key]
                return key
        return None

    def discard(self, key: QueueKey) -> None:
        self._active.pop(key, None)
        self._parked.pop(key, None)
        self._backoff.pop(key, None)

    def park(self, key: QueueKey, *, epoch: int, priority: int, created: float) -> None:
        self._active.pop(key, None)
        self._backoff.pop(key, None)
        self._parked[key] = _Held(priority, created, epoch)

    def backoff(self, key: QueueKey, *, until: float, priority: int, created: float) -> None:
        self._active.pop(key, None)
        self._parked.pop(key, None)
        self._backoff[key] = _Held(priority, created, until)

    def wake_parked(self, epoch: int) -> int:
        ready = [(k, h) for k, h in self._parked.items() if h.at < epoch]
        for key, held in ready:
            self.add(key, priority=held.priority, created=held.created)
        return len(ready)

    def release_due(self, now: float) -> float | None:
        if not self._backoff:
            return None
        due = [(k, h) for k, h in self._backoff.items() if h.at <= now]
        for key, held in due:
            self.add(key, priority=held.priority, created=held.created)
        return min((h.at for h in self._backoff.values()), default=None)

    def is_held(self, key: QueueKey) -> bool:
        return key in self._parked or key in self._backoff

    def __contains__(self, key: object) -> bool:
        return key in self._active or key in self._parked or key in self._backoff

    def __len__(self) -> int:
        return len(self._active)

    def waiting(self) -> int:
        return len(self._active) + len(self._parked) + len(self._backoff)

    def parked(self) -> list[QueueKey]:
        return list(self._parked)
