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


def test_wake_parked_with_keep_wakes_as_stay_does() -> None:
    """Kept jobs (`keep`, through the wakeable index) wake as a `stay` predicate over every held
    job has them wake, in the same order; the parked head is found among the protected parked
    jobs as among all held ones."""
    rng = random.Random(5)
    for _ in range(30):
        fqs = [FairQueue(capacity={G: 64}, queues=[QueueConfig("a"), QueueConfig("b")]) for _ in range(2)]
        jobs = [QueuedJob(f"j{i}", rng.choice("ab"), rng.randrange(3), float(i), {G: 1}) for i in range(30)]
        script = [
            (rng.choice(jobs), rng.randrange(4), rng.randrange(1, 6), rng.random() < 0.5) for _ in range(120)
        ]
        keep = {job.key for job in rng.sample(jobs, 10)}
        unkept = rng.sample(sorted(keep), 3)
        for k in keep:
            fqs[1].keep(k)
        for fq in fqs:
            for i, (job, op, epoch, reserve) in enumerate(script):
                if i == 60 and fq is fqs[1]:
                    for k in unkept:
                        fq.unkeep(k)
                if op == 0:
                    fq.add(job)
                elif op == 1 and job.key in fq:
                    fq.park(job.key, epoch=epoch, reserve=reserve)
                elif op == 2 and job.key in fq:
                    fq.backoff(job.key, until=float(epoch))
                elif op == 3:
                    fq.remove(job.key)
        a, b = fqs
        assert a.parked_head(0.0) == min(
            (h.job for h in a._held.values() if h.reserve and h.epoch is not None),
            key=lambda job: a.rank(job, 0.0),
            default=None,
        )
        assert a.wake_parked(4, stay=(keep - set(unkept)).__contains__) == b.wake_parked(4)
        assert list(a._pending) == list(b._pending)
        assert [j.key for j in a.order(0.0)] == [j.key for j in b.order(0.0)]
        assert list(a._held) == list(b._held)
