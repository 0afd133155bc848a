"""Invariants under random trees, demand and job arrivals/completions (hypothesis).

* runtimes never exceed the parent's (and children's runtimes add up to at most the parent's);
* the tree's incremental runtimes (per changed resource, splits redone only where their inputs
  moved) are those of a tree built afresh with the same demand;
* a job refused for room and not owed its min stays so while the marks of the quota without
  room and of its own quota do not change (quota parking skips its check then);
* a quota the tree does not report as touched kept its runtime, used and request (status writes
  look only at the touched ones);
* while the mins fit the cluster, every quota gets at least min(request, min);
* admission never lets usage exceed the runtime anywhere on the job's path;
* a feasible reclaim plan restores an owner's min: afterwards its job is admitted and fits;
* backfill never delays the head when durations are declared;
* across queues, the next job always comes from a queue with the lowest weighted share.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

from gpuyard.scheduler.admission.quota.admission import QuotaBook, admit, admits
from gpuyard.scheduler.admission.quota.ordering import Aging, FairQueue, QueueConfig, QueuedJob
from gpuyard.scheduler.admission.quota.resources import fits
from gpuyard.scheduler.admission.quota.tree import DEFAULT_QUOTA, ROOT_QUOTA, QuotaSpec, QuotaTree
from gpuyard.scheduler.admission.quota.victims import RunningJob, plan_reclaim

G = "nvidia.com/gpu"
C = "cpu"
RES = (G, C)


@st.composite
def trees(draw: st.DrawFn) -> tuple[list[QuotaSpec], dict[str, int]]:
    """A valid tree: children's mins within the parent's min, top-level mins within the cluster."""
    unit = {G: 1, C: 1000}
    total = {G: draw(st.integers(4, 32)), C: draw(st.integers(4, 32)) * 1000}
    specs: list[QuotaSpec] = []
    names = (f"q{i}" for i in itertools.count())

    def make(parent: str, budget: dict[str, int], depth: int) -> None:
        for _ in range(draw(st.integers(1, 2 if depth else 3))):
            lo = {r: draw(st.integers(0, max(0, budget[r] // unit[r]))) * unit[r] for r in RES}
            for r in RES:
                budget[r] -= lo[r]
            hi = {
                r: lo[r] + draw(st.integers(0, total[r] // unit[r])) * unit[r]
                for r in RES
                if draw(st.booleans())
            }
            weight = {r: draw(st.integers(1, 100)) for r in RES} if draw(st.booleans()) else None
            name = next(names)
            has_kids = depth < 2 and draw(st.integers(0, 2)) > 0
            specs.append(
                QuotaSpec(
                    name,
                    parent=parent,
                    min=lo,
                    max=hi,
                    shared_weight=weight,
                    allow_lent=draw(st.booleans()),
                    is_parent=has_kids,
                )
            )
            if has_kids:
                make(name, dict(lo), depth + 1)

    make(ROOT_QUOTA, dict(total), 0)
    return specs, total


class QuotaMachine(RuleBasedStateMachine):
    jobs = Bundle("jobs")

    @initialize(tree=trees())
    def build(self, tree: tuple[list[QuotaSpec], dict[str, int]]) -> None:
        specs, total = tree
        self.specs = specs
        self.tree = QuotaTree(specs, total=total)
        self.book = QuotaBook(self.tree)
        self.leaves = [s.name for s in specs if not s.is_parent] + [DEFAULT_QUOTA]
        self.mins_fit = True
        self.seq = itertools.count()
        self.start = itertools.count()
        self.running: dict[str, RunningJob] = {}
        self.refused: dict[str, tuple[str, str, tuple[int, ...]]] = {}

    @rule(
        target=jobs,
        data=st.data(),
        gpus=st.integers(0, 6),
        cpu=st.integers(0, 6),
        preemptible=st.sampled_from([True, True, True, False]),
        priority=st.integers(0, 3),
    )
    def arrive(self, data: st.DataObject, gpus: int, cpu: int, preemptible: bool, priority: int) -> str:
        quota = data.draw(st.sampled_from(self.leaves))
        key = f"j{next(self.seq)}"
        usage = {G: gpus, C: cpu * 1000}
        self.book.track(key, quota=quota, usage=usage, preemptible=preemptible)
        self.meta = getattr(self, "meta", {})
        self.meta[key] = priority
        return key

    @rule(
        target=jobs,
        data=st.data(),
        gpus=st.integers(1, 6),
        cpu=st.integers(0, 6),
        priority=st.integers(0, 3),
    )
    def arrive_and_admit(self, data: st.DataObject, gpus: int, cpu: int, priority: int) -> str:
        key = self.arrive(data, gpus, cpu, True, priority)
        self.try_admit(key)
        return key

    @rule(key=jobs)
    def try_admit(self, key: str) -> None:
        charge = self.book.charge(key)
        if charge is None or charge.admitted:
            return
        said = admit(self.tree, charge.quota, charge.usage, preemptible=charge.preemptible)
        cause = self.book.cause(key)
        if cause is not None and cause[0] != "missing" and not self.tree.owed(charge.quota, charge.usage):
            self.refused[key] = (cause[1], charge.quota, self.tree.marks(cause[1], charge.quota))
        assert admits(self.tree, charge.quota, charge.usage, preemptible=charge.preemptible) == (said is None)
        if self.book.admit(key) is None:
            self.running[key] = RunningJob(
                key, charge.quota, self.meta[key], next(self.start), charge.usage, charge.preemptible
            )
            for name in self.tree.path(charge.quota):
                used, runtime = self.tree.used(name), self.tree.runtime(name)
                for r, amount in charge.usage.items():
                    if amount:
                        assert used.get(r, 0) <= runtime.get(r, 0), (name, r, used, runtime)
            if not charge.preemptible:
                lo, np_used = self.tree.min(charge.quota), self.tree.non_preemptible_used(charge.quota)
                assert all(np_used.get(r, 0) <= lo.get(r, 0) for r in RES)

    @rule(key=consumes(jobs))
    def finish(self, key: str) -> None:
        self.book.forget(key)
        self.running.pop(key, None)

    @rule(key=jobs)
    def preempt(self, key: str) -> None:
        self.book.release(key)
        self.running.pop(key, None)

    @rule(key=jobs)
    def reclaim(self, key: str) -> None:
        charge = self.book.charge(key)
        if charge is None or charge.admitted:
            return
        plan = plan_reclaim(self.tree, owner=charge.quota, need=charge.usage, running=self.running.values())
        if not plan.feasible:
            return
        for victim in plan.victims:
            assert victim.job.preemptible
            self.book.release(victim.job.key)
            del self.running[victim.job.key]
        total, used = self.tree.total, self.tree.used(ROOT_QUOTA)
        free = {r: total.get(r, 0) - used.get(r, 0) for r in RES}
        assert fits(charge.usage, free), (plan, free)
        assert self.book.admit(key) is None
        self.running[key] = RunningJob(
            key, charge.quota, self.meta[key], next(self.start), charge.usage, charge.preemptible
        )

    @rule(factor=st.sampled_from([0.5, 0.75, 1.5, 2.0]))
    def resize_cluster(self, factor: float) -> None:
        total = {r: int(a * factor) for r, a in self.tree.total.items()}
        self.tree.set_total(total)
        top = [self.tree.spec(n) for n in self.tree.children_of(ROOT_QUOTA)]
        self.mins_fit = all(sum(s.min.get(r, 0) for s in top) <= total.get(r, 0) for r in RES)

    @invariant()
    def runtimes_fit_in_the_parent(self) -> None:
        if not hasattr(self, "tree"):
            return
        for parent in [ROOT_QUOTA, *self.tree.names()]:
            kids = self.tree.children_of(parent)
            if not kids:
                continue
            prt = self.tree.runtime(parent)
            for r in RES:
                shares = [self.tree.runtime(k).get(r, 0) for k in kids]
                assert sum(shares) <= prt.get(r, 0), (parent, r, shares, prt)
                assert all(0 <= s <= prt.get(r, 0) for s in shares)

    @invariant()
    def refused_jobs_stay_refused_while_the_marks_stand(self) -> None:
        if not hasattr(self, "tree"):
            return
        for key, (blocker, quota, marks) in list(self.refused.items()):
            charge = self.book.charge(key)
            if charge is None or charge.admitted or self.tree.marks(blocker, quota) != marks:
                del self.refused[key]
                continue
            assert self.book.cause(key) is not None
            assert not self.tree.owed(charge.quota, charge.usage)

    @invariant()
    def untouched_quotas_kept_their_vectors(self) -> None:
        if not hasattr(self, "tree"):
            return
        self.tree.refresh()
        touched = self.tree.take_touched()
        now = {n: tuple(dict(v) for v in self.tree.vectors(n)) for n in [ROOT_QUOTA, *self.tree.names()]}
        seen = getattr(self, "seen_vectors", None)
        if touched is not None and seen is not None:
            for name, vectors in now.items():
                if name not in touched:
                    assert seen.get(name) == vectors, name
        self.seen_vectors = now

    @invariant()
    def incremental_runtimes_match_a_fresh_tree(self) -> None:
        if not hasattr(self, "tree"):
            return
        fresh = QuotaTree(self.specs, total=self.tree.total)
        for _, charge in self.book.jobs():
            if charge.counted:
                fresh.add_request(charge.quota, charge.usage)
            if charge.admitted:
                fresh.add_used(charge.quota, charge.usage, preemptible=charge.preemptible)
        for name in [ROOT_QUOTA, *self.tree.names()]:
            want, got = fresh.status(name), self.tree.status(name)
            assert (want.runtime, want.scaled_min, want.request) == (got.runtime, got.scaled_min, got.request)

    @invariant()
    def runtime_within_max_and_min_guaranteed(self) -> None:
        if not hasattr(self, "tree"):
            return
        for name in self.tree.names():
            st_ = self.tree.status(name)
            for r in RES:
                rt = st_.runtime.get(r, 0)
                cap = st_.max.get(r)
                if cap is not None:
                    assert rt <= cap
                if self.mins_fit:
                    limited = st_.request.get(r, 0) if cap is None else min(st_.request.get(r, 0), cap)
                    assert rt >= min(limited, st_.min.get(r, 0)), (name, r, st_)


TestQuotaMachine = QuotaMachine.TestCase
TestQuotaMachine.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# --- backfill and DRF --------------------------------------------------------------------------


running_jobs = st.lists(st.tuples(st.integers(1, 8), st.integers(1, 500)), min_size=1, max_size=6)
pending_jobs = st.lists(
    st.tuples(st.integers(1, 16), st.integers(1, 1000), st.integers(0, 2)), min_size=2, max_size=12
)


@given(capacity=st.integers(8, 32), running=running_jobs, pending=pending_jobs)
@settings(max_examples=300, deadline=None)
def test_backfill_never_delays_the_head(
    capacity: int, running: list[tuple[int, int]], pending: list[tuple[int, int, int]]
) -> None:
    now = 1000.0
    fq = FairQueue(capacity={G: capacity}, aging=Aging(step=0))
    used = 0
    for i, (gpus, dur) in enumerate(running):
        if used + gpus > capacity:
            break
        used += gpus
        fq.add_running(QueuedJob(f"r{i}", "other", 0, 0.0, {G: gpus}, float(dur)), start=now)
    for i, (gpus, dur, prio) in enumerate(pending):
        fq.add(QueuedJob(f"p{i}", f"q{i % 2}", prio, float(i), {G: min(gpus, capacity)}, float(dur)))
    cycle = fq.candidates(now)
    for job in cycle:
        if fits(job.request, cycle.free):
            cycle.placed(job)
        else:
            cycle.blocked(job, "no room")
    head = cycle.head
    assume(head is not None and cycle.shadow_time is not None)
    after = fq.shadow(head, now, fq.free())
    assert after is not None
    assert after[0] <= cycle.shadow_time


@given(
    weights=st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0]), min_size=2, max_size=4),
    jobs=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 8), st.integers(0, 8)), min_size=1, max_size=30
    ),
)
@settings(max_examples=200, deadline=None)
def test_drf_picks_a_lowest_share_queue(weights: list[float], jobs: list[tuple[int, int, int]]) -> None:
    queues = [QueueConfig(f"q{i}", weight=w) for i, w in enumerate(weights)]
    fq = FairQueue(capacity={G: 1000, C: 1000}, queues=queues, aging=Aging(step=0))
    for n, (qi, gpus, cpu) in enumerate(jobs):
        fq.add(QueuedJob(f"j{n}", f"q{qi % len(weights)}", 0, float(n), {G: gpus, C: cpu}))
    cycle = fq.candidates(0.0)
    for job in cycle:
        waiting = {x.queue for x in fq.pending()}
        lowest = min(fq.share(q) for q in waiting)
        assert fq.share(job.queue) <= lowest + 1e-12
        cycle.placed(job)
    assert len(fq) == 0


@given(capacity=st.integers(8, 32), running=running_jobs, pending=pending_jobs, later=pending_jobs)
@settings(max_examples=200, deadline=None)
def test_a_parked_head_is_not_delayed_by_later_cycles(
    capacity: int,
    running: list[tuple[int, int]],
    pending: list[tuple[int, int, int]],
    later: list[tuple[int, int, int]],
) -> None:
    now = 1000.0
    fq = FairQueue(capacity={G: capacity}, aging=Aging(step=0))
    used = 0
    for i, (gpus, dur) in enumerate(running):
        if used + gpus > capacity:
            break
        used += gpus
        fq.add_running(QueuedJob(f"r{i}", "other", 0, 0.0, {G: gpus}, float(dur)), start=now)
    for i, (gpus, dur, prio) in enumerate(pending):
        fq.add(QueuedJob(f"p{i}", f"q{i % 2}", prio, float(i), {G: min(gpus, capacity)}, float(dur)))

    def cycle_once() -> tuple[QueuedJob | None, float | None]:
        cycle = fq.candidates(now)
        for job in cycle:
            if fits(job.request, cycle.free):
                cycle.placed(job)
            else:
                fq.park(job.key, epoch=1, reason="no room")  # the scheduler's flow: set it aside
                cycle.blocked(job, "no room")
        return cycle.head, cycle.shadow_time

    head, shadow = cycle_once()
    assume(head is not None and shadow is not None)
    for i, (gpus, dur, prio) in enumerate(later):
        fq.add(QueuedJob(f"l{i}", f"q{i % 3}", prio, 100.0 + i, {G: min(gpus, capacity)}, float(dur)))
    head2, _ = cycle_once()
    assert head2 is not None and head2.key == head.key
    after = fq.shadow(head, now, fq.free())
    assert after is not None and after[0] <= shadow
