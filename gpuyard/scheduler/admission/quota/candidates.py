"""One scheduling cycle's walk over the fair queue: DRF across queues, EASY backfill.

:meth:`FairQueue.candidates <gpuyard.scheduler.admission.quota.ordering.FairQueue.candidates>` returns a
:class:`Candidates`: it yields ready jobs lazily — a heap of queues by weighted dominant share,
each queue's pending jobs by :func:`~gpuyard.scheduler.admission.quota.queues.pending_order` — skipping
full queues (`maxRunningJobs`) and stopping a StrictFIFO queue at a head that cannot start. The
cycle reports each job back (`placed` / `blocked`); the first job blocked for lack of room (or
the FairQueue's parked head) becomes the protected *head*, and from then on a job behind it may
start only as EASY backfill allows (it ends before the head's shadow time, fits in what the head
leaves over, or uses nothing the head needs). See `ordering` for the rules in full.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator, Mapping
from typing import TYPE_CHECKING

from gpuyard.scheduler.admission.quota.queues import QueuedJob, pending_order
from gpuyard.scheduler.admission.quota.resources import Vector, add, fits

if TYPE_CHECKING:
    from gpuyard.scheduler.admission.quota.ordering import FairQueue

__all__ = ["Candidates"]


class Candidates:
    """One cycle's walk through the queues (see the module docstring).

    Iterate it; after each job, call `placed(job)` if it started (it leaves the queue) or
    `blocked(job, reason)` if it could not. A job given no feedback before the next one is
    asked for counts as skipped (no reservation). `reserve=False` in `blocked` says waiting for
    room would not help (quota, a request no node can hold), so the job is not protected.
    """

    def __init__(self, fq: FairQueue, now: float, free: Vector) -> None:
        self._fq = fq
        self.now = now
        self.free = free
        self._heap = [(fq.share(name), name) for name, q in fq._queues.items() if q.pending]
        heapq.heapify(self._heap)
        self._iters: dict[str, Iterator[Hashable]] = {}
        self._current: tuple[QueuedJob, str] | None = None
        self.head: QueuedJob | None = None
        self.shadow_time: float | None = None
        self.extra: Vector | None = None
        self._strict_head = False
        self.by_placement = False
        """The caller holds the head's room on the real nodes (the scheduler core's `backfilling`):
        every job may be tried, the placement keeps it off the held room."""
        if fq.backfill:
            parked = fq.parked_head(now)
            if parked is not None:
                self._protect(parked)

    def __iter__(self) -> Candidates:
        return self

    def __next__(self) -> QueuedJob:
        if self._current is not None:
            self.blocked(self._current[0], "", reserve=False)
        fq = self._fq
        while self._heap:
            _, name = heapq.heappop(self._heap)
            q = fq._queues[name]
            if q.full():
                continue
            it = self._iters.get(name)
            if it is None:
                it = self._iters[name] = pending_order(q, fq.aging_of(name), self.now, fq._pending)
            key = next(it, None)
            if key is None:
                continue
            job = fq._pending[key][0]
            tag = self._backfill_check(job)
            if tag is None:
                if q.config.strategy != "StrictFIFO":  # a StrictFIFO queue stops at its head
                    heapq.heappush(self._heap, (fq.share(name), name))
                continue
            self._current = (job, tag)
            return job
        raise StopIteration

    def _backfill_check(self, job: QueuedJob) -> str | None:
        """How `job` may start with a protected head ahead ("free", "ends", "extra"), or None."""
        head = self.head
        if head is None or not self._fq.backfill:
            return "free"
        if self.by_placement:
            return "free"
        need = {r for r, a in head.request.items() if a > 0}
        if not any(job.request.get(r, 0) > 0 for r in need):
            return "free"
        if self.shadow_time is None:
            if self._strict_head:
                self._fq.note(
                    job.key,
                    f"head {head.key} has waited too long; nothing that competes with it starts first",
                )
                return None
            return "free"
        if job.expected_duration is not None and self.now + job.expected_duration <= self.shadow_time:
            return "ends"
        if self.extra is not None and fits(job.request, self.extra):
            return "extra"
        self._fq.note(
            job.key,
            f"would delay head {head.key}, expected to start in {max(0.0, self.shadow_time - self.now):.0f}s",
        )
        return None

    def _protect(self, head: QueuedJob) -> None:
        """Make `head` the job backfill must not delay: its shadow time and extra capacity."""
        self.head = head
        self._fq._head = head.key
        found = self._fq.shadow(head, self.now, self.free)
        if found is not None:
            self.shadow_time, self.extra = found
        aging = self._fq.aging_of(head.queue)
        self._strict_head = (
            aging.reserve_after is not None and self.now - head.submit_time >= aging.reserve_after
        )

    def _take_current(self, job: QueuedJob) -> str | None:
        if self._current is not None and self._current[0].key == job.key:
            tag = self._current[1]
            self._current = None
            return tag
        return None

    def placed(self, job: QueuedJob, *, usage: Mapping[str, int] | None = None) -> None:
        """The job started: it leaves the queue and its queue's share grows."""
        tag = self._take_current(job)
        use = usage if usage is not None else job.request
        self._fq.start(job.key, now=self.now, usage=use)
        add(self.free, use, sign=-1)
        if tag == "extra" and self.extra is not None:
            add(self.extra, use, sign=-1)
        if tag is not None:
            heapq.heappush(self._heap, (self._fq.share(job.queue), job.queue))

    def blocked(self, job: QueuedJob, reason: str, *, reserve: bool = True) -> None:
        """The job could not start now; the first such job (with `reserve`) becomes the head."""
        tag = self._take_current(job)
        if reason:
            self._fq.note(job.key, reason)
        if reserve and self.head is None and self._fq.backfill:
            self._protect(job)
        q = self._fq._queues.get(job.queue)
        if tag is None or (q is not None and q.config.strategy == "StrictFIFO"):
            return  # a StrictFIFO queue stops here for this cycle: not pushed back
        heapq.heappush(self._heap, (self._fq.share(job.queue), job.queue))
