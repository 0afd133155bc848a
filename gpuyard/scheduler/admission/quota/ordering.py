"""Queue ordering: which job the scheduling cycle should try next.

Jobs wait in tenant queues (a job's queue is its `schedulingPolicy.queue`, else its namespace).

* **Within a queue**: highest effective priority first, then earliest submission. *Aging* raises
  a waiting job's effective priority by `step` per `interval` waited (at most `maxBoost`), so a
  low-priority job eventually overtakes newer high-priority ones: nothing starves.
* **Across queues**: Dominant Resource Fairness with queue weights: the queue whose running jobs
  hold the smallest weighted dominant share (`max_r used_r / capacity_r / weight`) goes next;
  after each start the shares change and the order follows.
* **StrictFIFO** queues stop at a head that cannot start; **BestEffortFIFO** queues (default)
  go on to the jobs behind it. `maxRunningJobs` caps a queue's running jobs.
* **Backfill** (EASY): the first job of a cycle that cannot start for lack of room becomes the
  protected *head*. From the expected ends of running jobs (`gpuyard.io/expected-duration`) its
  *shadow time* is when enough capacity will be free; a job behind it may start only if it ends
  before the shadow time, or fits in what the head will leave over at that time, or uses nothing
  the head needs. When durations are unknown the shadow time is unknown and backfill is best
  effort (any job that fits may start), unless the head has waited `reserveAfterSeconds`: then
  nothing that competes with it starts.

:class:`FairQueue` is incremental (add/remove/update/start/finish in O(log n) plus a list
shift) and works on small plain dataclasses. Like the scheduler's own queue it can set a job
aside: *parked* until the cluster changes (`park`/`wake_parked`), or *backing off* until a time
(`backoff`/`release_due`); a parked head stays protected from backfill in later cycles. Per cycle, :meth:`FairQueue.candidates` yields
jobs lazily — a k-way merge over priority buckets and a heap of queues — and takes feedback
(`placed` / `blocked`) about each, so a cycle that starts 10 of 15,000 jobs looks at little
more than those.

The pieces: `queues` holds the data (QueuedJob, QueueConfig, Aging, Explanation, one tenant
queue's order), this module the :class:`FairQueue` book-keeping (pending, held, running, shares,
shadow times, explanations), `candidates` one cycle's walk (:class:`Candidates`). Every name this
module exported before is still importable from here.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass

from gpuyard.scheduler.admission.quota.candidates import Candidates
from gpuyard.scheduler.admission.quota.queues import (
    Aging,
    Explanation,
    QueueConfig,
    QueuedJob,
    TenantQueue,
    pending_order,
    queue_configs,
    queued_job,
)
from gpuyard.scheduler.admission.quota.resources import Vector, add, dominant_share, fits

__all__ = [
    "Aging",
    "Candidates",
    "Explanation",
    "FairQueue",
    "QueueConfig",
    "QueuedJob",
    "queue_configs",
    "queued_job",
]


@dataclass(slots=True)
class _Held:
    """A job set aside: parked until the cluster changes (`epoch`), or backing off (`until`)."""

    job: QueuedJob
    epoch: int | None
    until: float | None
    reserve: bool
    seq: int = 0
    """When it was set aside (its place in `FairQueue._held`, kept while it stays held)."""


@dataclass(slots=True)
class _Running:
    job: QueuedJob
    usage: Vector
    start: float
    end: float | None


class FairQueue:
    """Pending and running jobs of every tenant queue, and the order to try them in."""

    def __init__(
        self,
        *,
        capacity: Mapping[str, int] | None = None,
        queues: Iterable[QueueConfig] = (),
        aging: Aging = Aging(),
        backfill: bool = True,
    ) -> None:
        self._capacity: Vector = dict(capacity or {})
        self._default_aging = aging
        self.backfill = backfill
        self._queues: dict[str, TenantQueue] = {}
        self._configs: dict[str, QueueConfig] = {}
        self._pending: dict[Hashable, tuple[QueuedJob, tuple[float, int, Hashable]]] = {}
        self._running: dict[Hashable, _Running] = {}
        self._held: dict[Hashable, _Held] = {}
        self._held_seq = itertools.count()
        self._reserved: dict[Hashable, _Held] = {}  # parked (not backing off) and protected: head candidates
        self._kept: set[Hashable] = set()  # stay parked whatever the epoch (`keep`)
        self._wakeable: dict[Hashable, _Held] = {}  # parked with an epoch and not kept
        self._held_in: dict[str, int] = {}  # per queue: how many of `_held` (kept as they change)
        self._backoffs: list[tuple[float, int, Hashable]] = []  # (until, seq, key); stale ones skipped
        self._used: Vector = {}  # the running jobs' usage, summed
        self._shares: dict[str, float] = {}  # per queue, until its usage, weight or the capacity changes
        self._causes: dict[Hashable, str] = {}
        self._head: Hashable | None = None  # the last protected head, kept while it is parked
        self._seq = itertools.count()
        self.on_running: Callable[[Hashable], None] | None = None
        """Told the key each time a job starts or stops running (an index kept beside the queue)."""
        for cfg in queues:
            self.set_queue(cfg)

    # --- configuration -----------------------------------------------------------------------

    def set_capacity(self, capacity: Mapping[str, int]) -> None:
        """The cluster total the shares are measured against."""
        self._capacity = dict(capacity)
        self._shares.clear()

    @property
    def capacity(self) -> Vector:
        return dict(self._capacity)

    def set_queue(self, config: QueueConfig) -> None:
        self._configs[config.name] = config
        self._shares.pop(config.name, None)
        q = self._queues.get(config.name)
        if q is not None:
            q.config = config

    def set_queues(self, configs: Iterable[QueueConfig]) -> None:
        new = {c.name: c for c in configs}
        for name in list(self._configs):
            if name not in new:
                self.remove_queue(name)
        for cfg in new.values():
            self.set_queue(cfg)

    def remove_queue(self, name: str) -> None:
        """Forget a queue's settings (its jobs stay, under default settings)."""
        self._configs.pop(name, None)
        self._shares.pop(name, None)
        q = self._queues.get(name)
        if q is not None:
            q.config = QueueConfig(name)

    def _queue(self, name: str) -> TenantQueue:
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = TenantQueue(self._configs.get(name) or QueueConfig(name))
        return q

    def config_of(self, queue: str) -> QueueConfig:
        """The queue's settings (defaults for a queue without a Queue object)."""
        return self._configs.get(queue) or QueueConfig(queue)

    def aging_of(self, queue: str) -> Aging:
        cfg = self._configs.get(queue)
        return cfg.aging if cfg is not None and cfg.aging is not None else self._default_aging

    # --- jobs --------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Jobs ready to be tried (not parked or backing off)."""
        return len(self._pending)

    def __contains__(self, key: object) -> bool:
        return key in self._pending

    def waiting(self) -> int:
        """Jobs waiting anywhere: ready, parked or backing off."""
        return len(self._pending) + len(self._held)

    def is_held(self, key: Hashable) -> bool:
        """Parked or backing off: the job comes back by itself when worth it."""
        return key in self._held

    def get(self, key: Hashable) -> QueuedJob | None:
        entry = self._pending.get(key)
        if entry is not None:
            return entry[0]
        held = self._held.get(key)
        return held.job if held is not None else None

    def is_running(self, key: Hashable) -> bool:
        return key in self._running

    def add(self, job: QueuedJob) -> None:
        """Queue a job ready to be tried (replaces a waiting job with the same key)."""
        self.remove(job.key)
        self._insert(job)

    def _insert(self, job: QueuedJob) -> None:
        q = self._queue(job.queue)
        entry = (job.submit_time, next(self._seq), job.key)
        bisect.insort(q.buckets.setdefault(job.priority, []), entry)
        q.pending += 1
        self._pending[job.key] = (job, entry)

    update = add

    def remove(self, key: Hashable) -> QueuedJob | None:
        """Drop a waiting job (deleted, suspended); returns it, or None if it was not waiting."""
        self._causes.pop(key, None)
        if key == self._head:
            self._head = None
        held = self._unhold(key)
        if held is not None:
            return held.job
        return self._take(key)

    def _hold(self, key: Hashable, held: _Held) -> None:
        old = self._held.get(key)
        if old is not None:
            self._held_in[old.job.queue] -= 1
        held.seq = old.seq if old is not None else next(self._held_seq)  # the dict keeps its place
        self._held[key] = held
        if held.reserve and held.epoch is not None:
            self._reserved[key] = held
        else:
            self._reserved.pop(key, None)
        if held.epoch is not None and key not in self._kept:
            self._wakeable[key] = held
        else:
            self._wakeable.pop(key, None)
        self._held_in[held.job.queue] = self._held_in.get(held.job.queue, 0) + 1
        if held.until is not None:
            heapq.heappush(self._backoffs, (held.until, next(self._seq), key))

    def _unhold(self, key: Hashable) -> _Held | None:
        held = self._held.pop(key, None)
        if held is not None:
            self._held_in[held.job.queue] -= 1
            self._reserved.pop(key, None)
            self._wakeable.pop(key, None)
        return held

    def keep(self, key: Hashable) -> None:
        """`key` stays parked whatever the epoch until `unkeep` (quota parking: its quota still
        refuses it); a key not held now is kept once parked."""
        self._kept.add(key)
        self._wakeable.pop(key, None)

    def unkeep(self, key: Hashable) -> None:
        """`key` wakes with the epoch again (when parked)."""
        if key in self._kept:
            self._kept.discard(key)
            held = self._held.get(key)
            if held is not None and held.epoch is not None:
                self._wakeable[key] = held

    def unkeep_all(self) -> None:
        for key in list(self._kept):
            self.unkeep(key)

    def _take(self, key: Hashable) -> QueuedJob | None:
        """Out of the ready structures (not of the held ones); keeps its recorded cause."""
        found = self._pending.pop(key, None)
        if found is None:
            return None
        job, entry = found
        q = self._queues[job.queue]
        bucket = q.buckets[job.priority]
        i = bisect.bisect_left(bucket, entry[:2])
        while bucket[i][2] != key:
            i += 1
        del bucket[i]
        if not bucket:
            del q.buckets[job.priority]
        q.pending -= 1
        return job

    def park(
        self, key: Hashable, *, epoch: int, reason: str = "", reserve: bool = True, until: float | None = None
    ) -> None:
        """Set a ready job aside until the cluster changes past `epoch` (`wake_parked`), or the
        clock reaches `until` when given (a job's own wait ends), whichever comes first.

        It is not tried meanwhile; with `reserve` it stays protected from backfill: the best
        parked job is the head of the next cycles until it comes back.
        """
        job = self._take(key)
        if job is None:
            return
        if reason:
            self._causes[key] = reason
        self._hold(key, _Held(job, epoch, until, reserve))

    def wake_parked(
        self,
        epoch: int,
        *,
        stay: Callable[[Hashable], bool] | None = None,
    ) -> int:
        """Make every job parked before `epoch` ready again (but those kept, and those `stay`
        names), in the order they were set aside; how many. Without `stay` only the parked jobs
        nobody keeps are looked at (an index), however many are kept."""
        if stay is None:  # the index: parked jobs nobody keeps, by when set aside
            woken = [(k, h) for k, h in self._wakeable.items() if h.epoch is not None and h.epoch < epoch]
            woken.sort(key=lambda kh: kh[1].seq)
        else:
            kept = self._kept
            woken = [
                (k, h)
                for k, h in self._held.items()
                if h.epoch is not None and h.epoch < epoch and k not in kept and not stay(k)
            ]
        for key, h in woken:
            self._unhold(key)
            self._insert(h.job)
        return len(woken)

    def backoff(self, key: Hashable, *, until: float, reason: str = "") -> None:
        """Set a ready job aside until the clock reaches `until` (a transient failure)."""
        job = self._take(key)
        if job is None:
            return
        if reason:
            self._causes[key] = reason
        self._hold(key, _Held(job, None, until, False))

    def release_due(self, now: float) -> float | None:
        """Make jobs whose backoff ended by `now` ready; when the next backoff ends (or None)."""
        heap = self._backoffs
        while heap:
            until, _, key = heap[0]
            h = self._held.get(key)
            if h is None or h.until != until:  # released, removed or backing off anew since
                heapq.heappop(heap)
            elif until <= now:
                heapq.heappop(heap)
                self._unhold(key)
                self._insert(h.job)
            else:
                return until
        return None

    def start(self, key: Hashable, *, now: float, usage: Mapping[str, int] | None = None) -> None:
        """The job was admitted and placed: it leaves the queue and counts as running."""
        self._causes.pop(key, None)
        if key == self._head:
            self._head = None
        held = self._unhold(key)
        job = held.job if held is not None else self._take(key)
        if job is None:
            if key in self._running:
                return
            raise KeyError(f"{key!r} is not pending")
        self._add_running(job, now=now, usage=usage)

    def add_running(self, job: QueuedJob, *, start: float, usage: Mapping[str, int] | None = None) -> None:
        """A job found running (e.g. after a restart): count it without queueing it."""
        self.remove(job.key)
        self.finish(job.key)
        self._add_running(job, now=start, usage=usage)

    def _add_running(self, job: QueuedJob, *, now: float, usage: Mapping[str, int] | None) -> None:
        if job.key in self._running:  # counted once, whatever the path that brought it here
            self.finish(job.key)
        use = dict(usage if usage is not None else job.request)
        end = now + job.expected_duration if job.expected_duration is not None else None
        self._running[job.key] = _Running(job, use, now, end)
        q = self._queue(job.queue)
        q.running += 1
        add(q.usage, use)
        self._shares.pop(job.queue, None)
        add(self._used, use)
        if self.on_running is not None:
            self.on_running(job.key)

    def finish(self, key: Hashable) -> None:
        """A running job ended (or was stopped and is gone)."""
        run = self._running.pop(key, None)
        if run is None:
            return
        q = self._queues[run.job.queue]
        q.running -= 1
        add(q.usage, run.usage, sign=-1)
        self._shares.pop(run.job.queue, None)
        add(self._used, run.usage, sign=-1)
        if self.on_running is not None:
            self.on_running(key)

    def requeue(self, key: Hashable) -> None:
        """A running job was stopped (preempted) and waits again, keeping its submission time."""
        run = self._running.get(key)
        if run is None:
            return
        self.finish(key)
        self.add(run.job)

    def counts(self) -> dict[str, tuple[int, int]]:
        """Per queue with jobs: (waiting: ready or held, running), from the running totals."""
        held = self._held_in
        out = {name: (q.pending + held.get(name, 0), q.running) for name, q in self._queues.items()}
        for name, n in held.items():
            if n and name not in out:
                out[name] = (n, 0)
        return {name: c for name, c in out.items() if c[0] or c[1]}

    def pending(self) -> list[QueuedJob]:
        """Jobs ready to be tried."""
        return [job for job, _ in self._pending.values()]

    def held(self) -> list[QueuedJob]:
        """Jobs parked or backing off."""
        return [h.job for h in self._held.values()]

    def running(self) -> list[QueuedJob]:
        return [r.job for r in self._running.values()]

    def run_times(self, key: Hashable) -> tuple[float, float | None] | None:
        """A running job's (start, expected end or None); None when it is not running."""
        run = self._running.get(key)
        return (run.start, run.end) if run is not None else None

    # --- shares and order --------------------------------------------------------------------

    def share(self, queue: str) -> float:
        """The queue's weighted dominant share of the cluster (its running jobs' usage)."""
        share = self._shares.get(queue)
        if share is not None:
            return share
        q = self._queues.get(queue)
        if q is None:
            return 0.0
        share = self._shares[queue] = dominant_share(q.usage, self._capacity) / q.config.weight
        return share

    def effective_priority(self, job: QueuedJob, now: float) -> int:
        return job.priority + self.aging_of(job.queue).boost(now - job.submit_time)

    def free(self) -> Vector:
        """Capacity minus what running jobs use (in aggregate; nodes are the placer's concern)."""
        return add(dict(self._capacity), self._used, sign=-1)

    def queue_order(self, queue: str, now: float) -> list[QueuedJob]:
        """The pending jobs of one queue, in the order they are tried."""
        q = self._queues.get(queue)
        if q is None:
            return []
        return [self._pending[k][0] for k in pending_order(q, self.aging_of(queue), now, self._pending)]

    def order(self, now: float) -> list[QueuedJob]:
        """Every pending job in the order a cycle would try them if none started."""
        out = []
        for name in sorted(self._queues, key=lambda n: (self.share(n), n)):
            out.extend(self.queue_order(name, now))
        return out

    def candidates(self, now: float, *, free: Mapping[str, int] | None = None) -> Candidates:
        """This cycle's candidates, lazily, in order; tell it `placed(job)` or `blocked(job)`.

        `free` is the cluster's free capacity now (default: capacity minus running usage).
        """
        return Candidates(self, now, dict(free) if free is not None else self.free())

    def rank(self, job: QueuedJob, now: float) -> tuple[float, str, int, float, str]:
        """Where a job comes in a cycle's order if nothing starts: queue share and name, priority, time."""
        return (
            self.share(job.queue),
            job.queue,
            -self.effective_priority(job, now),
            job.submit_time,
            str(job.key),
        )

    def parked_head(self, now: float) -> QueuedJob | None:
        """The parked job backfill must still not delay: the last protected head while it is
        parked, else the first parked job (in cycle order) that waits for room."""
        held = self._held.get(self._head) if self._head is not None else None
        if held is not None and held.reserve and held.epoch is not None:
            return held.job
        if not self._reserved:
            return None
        shares: dict[str, float] = {}  # one per queue, not one per parked job

        def rank(job: QueuedJob) -> tuple[float, str, int, float, str]:
            share = shares.get(job.queue)
            if share is None:
                share = shares[job.queue] = self.share(job.queue)
            return (share, job.queue, -self.effective_priority(job, now), job.submit_time, str(job.key))

        return min((h.job for h in self._reserved.values()), key=rank)

    def shadow(self, head: QueuedJob, now: float, free: Mapping[str, int]) -> tuple[float, Vector] | None:
        """When `head` could start at the earliest and what it would leave free then.

        From `free` now plus, in order of expected end, the usage of running jobs. None when that
        time is unknown (needed capacity is held by jobs without a declared duration) or never
        (the head asks for more than the cluster has).
        """
        avail = dict(free)
        need = {r: a for r, a in head.request.items() if a > 0}
        if fits(need, avail):
            return now, {r: avail.get(r, 0) - need.get(r, 0) for r in set(avail) | set(need)}
        ends = sorted(
            (max(r.end, now), str(k), r.usage) for k, r in self._running.items() if r.end is not None
        )
        for end, _, usage in ends:
            add(avail, usage)
            if fits(need, avail):
                return end, {r: avail.get(r, 0) - need.get(r, 0) for r in set(avail) | set(need)}
        return None

    # --- explanations ------------------------------------------------------------------------

    def note(self, key: Hashable, cause: str) -> None:
        """Record why a pending job did not start (shown by `explain`)."""
        if key in self._pending:
            self._causes[key] = cause

    def explain(self, key: Hashable, now: float) -> Explanation:
        """Where a waiting (ready or held) job stands and what holds it back."""
        job = self.get(key)
        if job is None:
            raise KeyError(f"{key!r} is not waiting")
        ahead = 0
        for name in sorted(self._queues, key=lambda n: (self.share(n), n)):
            if name == job.queue:
                break
            ahead += self._queues[name].pending
        order = self.queue_order(job.queue, now)
        mine = (-self.effective_priority(job, now), job.submit_time)
        pos = sum(
            1
            for other in order
            if other.key != key and (-self.effective_priority(other, now), other.submit_time) <= mine
        )
        q = self._queue(job.queue)
        cause = self._causes.get(key)
        held = self._held.get(key)
        if q.full():
            cause = f"queue {job.queue} runs {q.running} jobs (maxRunningJobs {q.config.max_running_jobs})"
        elif held is not None:
            wait = (
                "until the cluster changes" if held.until is None else f"until {held.until:.0f} (backing off)"
            )
            cause = f"{cause}; set aside {wait}" if cause else f"set aside {wait}"
        elif cause is None and pos > 0 and q.config.strategy == "StrictFIFO":
            head = order[0]
            why = self._causes.get(head.key)
            if why is not None:
                cause = f"behind head {head.key} of StrictFIFO queue {job.queue} ({why})"
        return Explanation(
            key, job.queue, ahead + pos, pos, self.effective_priority(job, now), self.share(job.queue), cause
        )
