"""FairQueue's incremental totals (held counts, running usage, backoff heap) match a recount,
and parked-by-quota jobs are not sent through a cycle again while quota still blocks them."""

from __future__ import annotations

import random

from gpuyard.scheduler.admission.quota.ordering import FairQueue, QueueConfig, QueuedJob

G = "nvidia.com/gpu"


def _recount(fq: FairQueue) -> dict[str, tuple[int, int]]:
    out: dict[str, list[int]] = {}
    for job in [*fq.pending(), *fq.held()]:
        out.setdefault(job.queue, [0, 0])[0] += 1
    for job in fq.running():
        out.setdefault(job.queue, [0, 0])[1] += 1
    return {q: (p, r) for q, (p, r) in out.items()}


def _free(fq: FairQueue) -> dict[str, int]:
    out = dict(fq.capacity)
    for job in fq.running():
        out[G] = out.get(G, 0) - job.request[G]
    return out


def test_counts_and_free_follow_every_transition() -> None:
    rng = random.Random(3)
    fq = FairQueue(capacity={G: 64}, queues=[QueueConfig("a"), QueueConfig("b")])
    jobs = {
        f"j{i}": QueuedJob(f"j{i}", rng.choice("ab"), 0, float(i), {G: rng.choice([1, 4, 8])})
        for i in range(40)
    }
    now = 0.0
    for step in range(2_000):
        key = rng.choice(list(jobs))
        op = rng.randrange(8)
        if op == 0:
            fq.add(jobs[key])
        elif op == 1 and key in fq:
            fq.park(key, epoch=step)
        elif op == 2 and key in fq:
            fq.backoff(key, until=now + rng.uniform(0, 5))
        elif op == 3 and (key in fq or fq.is_held(key)):
            fq.start(key, now=now)
        elif op == 4:
            fq.finish(key)
        elif op == 5:
            fq.requeue(key)
        elif op == 6:
            fq.remove(key)
        else:
            fq.wake_parked(step)
            now += rng.uniform(0, 2)
            nxt = fq.release_due(now)
            backing = [h for h in fq._held.values() if h.until is not None]
            assert all(h.until > now for h in backing)
            assert nxt == (min(h.until for h in backing) if backing else None)
        assert fq.counts() == _recount(fq)
        assert {r: a for r, a in fq.free().items() if a != 0 or r in fq.capacity} == _free(fq)


def test_wake_parked_keeps_the_jobs_stay_names() -> None:
    fq = FairQueue(capacity={G: 8}, queues=[QueueConfig("a")])
    for i in range(4):
        fq.add(QueuedJob(f"j{i}", "a", 0, float(i), {G: 1}))
        fq.park(f"j{i}", epoch=1)
    assert fq.wake_parked(2, stay=lambda k: k in {"j1", "j3"}) == 2
    assert sorted(j.key for j in fq.pending()) == ["j0", "j2"]
    assert sorted(j.key for j in fq.held()) == ["j1", "j3"]
    assert fq.counts() == {"a": (4, 0)}
