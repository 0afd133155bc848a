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
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from gpuyard.apis.quota import ANNOTATION_EXPECTED_DURATION, Queue, parse_duration
from gpuyard.apis.scheduling import PodGroup
from gpuyard.scheduler.quota.resources import Vector, add, dominant_share, fits, podgroup_usage

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

Strategy = Literal["StrictFIFO", "BestEffortFIFO"]


@dataclass(slots=True)
class QueuedJob:
    """A job waiting to start, as the queue sees it (built once from its PodGroup)."""

    key: Hashable
    queue: str
    priority: int = 0
    submit_time: float = 0.0
    request: Mapping[str, int] = field(default_factory=dict)
    """The whole gang's demand in quota units."""
    expected_duration: float | None = None
    """Seconds, from `gpuyard.io/expected-duration`; None: unknown."""


@dataclass(frozen=True, slots=True)
class Aging:
    interval: float = 600.0
    step: int = 1
    max_boost: int = 100
    reserve_after: float | None = None

    def boost(self, waited: float) -> int:
        if self.step <= 0 or waited <= 0:
            return 0
        return min(self.max_boost, self.step * int(waited // self.interval))


NO_AGING = Aging(step=0)


@dataclass(frozen=True, slots=True)
class QueueConfig:
    name: str
    weight: float = 1.0
    strategy: Strategy = "BestEffortFIFO"
    max_running_jobs: int | None = None
    aging: Aging | None = None
    """None: the FairQueue's default aging."""


def queue_configs(queues: Iterable[Queue]) -> list[QueueConfig]:
    """QueueConfigs from Queue objects (the edge: pydantic in, plain data out)."""
    out = []
    for q in queues:
        a = q.spec.aging
        aging = None if a is None else Aging(a.interval_seconds, a.step, a.max_boost, a.reserve_after_seconds)
        out.append(
            QueueConfig(
                q.metadata.name, q.spec.weight, q.spec.queueing_strategy, q.spec.max_running_jobs, aging
            )
        )
    return out


def queued_job(pg: PodGroup, *, submit_time: float | None = None) -> QueuedJob:
    """A PodGroup as the queue sees it: queue (spec.queue, else namespace), priority, submit
    time (status.queuedAt, else creation), whole-gang request, expected duration (annotation
    `gpuyard.io/expected-duration`, ignored when unreadable)."""
    meta = pg.metadata
    if submit_time is None:
        stamp = pg.status.queued_at or meta.creation_timestamp
        submit_time = stamp.timestamp() if stamp is not None else 0.0
    duration = None
    raw = meta.annotations.get(ANNOTATION_EXPECTED_DURATION)
    if raw:
        try:
            duration = parse_duration(raw)
        except ValueError:
            duration = None
    return QueuedJob(
        key=(meta.namespace, meta.name),
        queue=pg.spec.queue or meta.namespace or "default",
        priority=pg.spec.priority,
        submit_time=submit_time,
        request=podgroup_usage(pg),
        expected_duration=duration,
    )


@dataclass(frozen=True, slots=True)
class Explanation:
    """Where a pending job stands: jobs ahead of it, its queue's share, what holds it back."""

    key: Hashable
    queue: str
    position: int
    """Jobs ahead of it overall if nothing started (queues in share order)."""
    queue_position: int
    """Jobs ahead of it in its own queue."""
    effective_priority: int
    queue_share: float
    cause: str | None

    def describe(self) -> str:
        text = (
            f"#{self.position + 1} overall, #{self.queue_position + 1} in queue {self.queue} "
            f"(share {self.queue_share:.2f}, effective priority {self.effective_priority})"
        )
        return f"{text}: {self.cause}" if self.cause else text


@dataclass(slots=True)
class _Held:
    """A job set aside: parked until the cluster changes (`epoch`), or backing off (`until`)."""

    job: QueuedJob
    epoch: int | None
    until: float | None
    reserve: bool


@dataclass(slots=True)
class _Running:
    job: QueuedJob
    usage: Vector
    start: float
    end: float | None


class _Q:
    """One tenant queue: pending jobs per base priority (sorted by submit time), running totals."""

    __slots__ = ("buckets", "config", "pending", "running", "usage")

    def __init__(self, config: QueueConfig) -> None:
        self.config = config
        self.buckets: dict[int, list[tuple[float, int, Hashable]]] = {}
        self.pending = 0
        self.running = 0
        self.usage: Vector = {}

    def full(self) -> bool:
        cap = self.config.max_running_jobs
        return cap is not None and self.running >= cap


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
        self._queues: dict[str, _Q] = {}
        self._configs: dict[str, QueueConfig] = {}
        self._pending: dict[Hashable, tuple[QueuedJob, tuple[float, int, Hashable]]] = {}
        self._running: dict[Hashable, _Running] = {}
        self._held: dict[Hashable, _Held] = {}
        self._held_in: dict[str, int] = {}  # per queue: how many of `_held` (kept as they change)
        self._backoffs: list[tuple[float, int, Hashable]] = []  # (until, seq, key); stale ones skipped
        self._used: Vector = {}  # the running jobs' usage, summed
        self._causes: dict[Hashable, str] = {}
        self._head: Hashable | None = None  # the last protected head, kept while it is parked
        self._seq = itertools.count()
        for cfg in queues:
            self.set_queue(cfg)

    # --- configuration -----------------------------------------------------------------------

    def set_capacity(self, capacity: Mapping[str, int]) -> None:
        """The cluster total the shares are measured against."""
        self._capacity = dict(capacity)

    @property
    def capacity(self) -> Vector:
        return dict(self._capacity)

    def set_queue(self, config: QueueConfig) -> None:
        self._configs[config.name] = config
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
        q = self._queues.get(name)
        if q is not None:
            q.config = QueueConfig(name)

    def _queue(self, name: str) -> _Q:
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = _Q(self._configs.get(name) or QueueConfig(name))
        return q

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
        self._held[key] = held
        self._held_in[held.job.queue] = self._held_in.get(held.job.queue, 0) + 1
        if held.until is not None:
            heapq.heappush(self._backoffs, (held.until, next(self._seq), key))

    def _unhold(self, key: Hashable) -> _Held | None:
        held = self._held.pop(key, None)
        if held is not None:
            self._held_in[held.job.queue] -= 1
        return held

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

    def park(self, key: Hashable, *, epoch: int, reason: str = "", reserve: bool = True) -> None:
        """Set a ready job aside until the cluster changes past `epoch` (`wake_parked`).

        It is not tried meanwhile; with `reserve` it stays protected from backfill: the best
        parked job is the head of the next cycles until it comes back.
        """
        job = self._take(key)
        if job is None:
            return
        if reason:
            self._causes[key] = reason
        self._hold(key, _Held(job, epoch, None, reserve))

    def wake_parked(self, epoch: int, *, stay: Callable[[Hashable], bool] | None = None) -> int:
        """Make every job parked before `epoch` ready again (but those `stay` keeps); how many."""
        woken = [
            k
            for k, h in self._held.items()
            if h.epoch is not None and h.epoch < epoch and (stay is None or not stay(k))
        ]
        for key in woken:
            self._insert(self._unhold(key).job)  # type: ignore[union-attr]
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
                self._insert(self._unhold(key).job)  # type: ignore[union-attr]
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
        add(self._used, use)

    def finish(self, key: Hashable) -> None:
        """A running job ended (or was stopped and is gone)."""
        run = self._running.pop(key, None)
        if run is None:
            return
        q = self._queues[run.job.queue]
        q.running -= 1
        add(q.usage, run.usage, sign=-1)
        add(self._used, run.usage, sign=-1)

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

    # --- shares and order --------------------------------------------------------------------

    def share(self, queue: str) -> float:
        """The queue's weighted dominant share of the cluster (its running jobs' usage)."""
        q = self._queues.get(queue)
        if q is None:
            return 0.0
        return dominant_share(q.usage, self._capacity) / q.config.weight

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
        return [self._pending[k][0] for k in _merge(q, self.aging_of(queue), now, self._pending)]

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
        parked = [h.job for h in self._held.values() if h.reserve and h.epoch is not None]
        return min(parked, key=lambda job: self.rank(job, now)) if parked else None

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


def _merge(q: _Q, aging: Aging, now: float, pending: Mapping[Hashable, object]) -> Iterator[Hashable]:
    """One queue's pending keys by (effective priority desc, submit time, arrival).

    Within a priority bucket effective priority never rises along submission order (older jobs
    have aged at least as much), so a k-way merge over the buckets' heads is exact. Buckets are
    copied once, so the queue may change while this runs (keys no longer pending are skipped).
    """
    heap = []
    for prio, bucket in q.buckets.items():
        if bucket:
            snapshot = list(bucket)
            t, seq, _ = snapshot[0]
            heap.append((-(prio + aging.boost(now - t)), t, seq, prio, 0, snapshot))
    heapq.heapify(heap)
    while heap:
        _, _, _, prio, i, snapshot = heap[0]
        key = snapshot[i][2]
        if i + 1 < len(snapshot):
            t, seq, _ = snapshot[i + 1]
            heapq.heapreplace(heap, (-(prio + aging.boost(now - t)), t, seq, prio, i + 1, snapshot))
        else:
            heapq.heappop(heap)
        if key in pending:
            yield key


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
                it = self._iters[name] = _merge(q, fq.aging_of(name), self.now, fq._pending)
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
