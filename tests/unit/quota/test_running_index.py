"""The indexes preemption and reclaim read per attempt (`Admission.running`: the running jobs by
priority and quota; `QuotaBook.admitted`: the admitted charges; `Admission.running_jobs`: the
admitted jobs as reclaim sees them) equal the answer computed from scratch after any sequence of
starts, stops, preemptions, priority and quota changes and forgets."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuyard.apis.quotakinds import LABEL_QUOTA_NAME
from gpuyard.apis.scheduling import PodGroup
from gpuyard.scheduler.admission.gatekeeping import Admission
from gpuyard.scheduler.admission.priorities import RunningPriorities
from gpuyard.scheduler.admission.quota import RunningJob
from gpuyard.scheduler.cache.objects import ObjectCache

Key = tuple[str, str]

NAMES = [f"j{i}" for i in range(6)]
PRIORITIES = [0, 5, 10]
QUOTAS = ["qa", "qb"]  # named by the job's label: a relabelled job moves to another quota


def _pg(name: str, *, priority: int, quota: str, generation: int) -> PodGroup:
    return PodGroup.model_validate(
        {
            "metadata": {
                "name": name,
                "namespace": "team",
                "uid": f"uid-{name}",
                "generation": generation,
                "labels": {LABEL_QUOTA_NAME: quota},
            },
            "spec": {
                "priority": priority,
                "roles": [
                    {
                        "name": "Worker",
                        "replicas": 1,
                        "template": {
                            "containers": [
                                {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}
                            ]
                        },
                    }
                ],
            },
        }
    )


def _expected_running(adm: Admission) -> dict[Key, tuple[int, str]]:
    """What `preempt_for` computed per attempt before: every tracked job the queue runs."""
    return {k: (t.job.priority, t.quota) for k, t in adm.jobs.items() if adm.queue.is_running(k)}


def _check(adm: Admission) -> None:
    want = _expected_running(adm)
    assert dict(adm.running.items()) == want
    assert adm.running.lowest() == (min(p for p, _ in want.values()) if want else None)
    for quota in [None, *QUOTAS, "nowhere"]:
        for p in [-1, *PRIORITIES, 11]:
            for equal in (True, False):
                got = list(adm.running.at_most(p, equal=equal, quota=quota))
                assert len(got) == len(set(got))
                assert set(got) == {
                    k
                    for k, (q, in_quota) in want.items()
                    if (q < p or (equal and q == p)) and quota in (None, in_quota)
                }
                assert [want[k][0] for k in got] == sorted(want[k][0] for k in got)  # lowest first
    admitted = {k: c for k, c in adm.quotas.jobs() if c.admitted}
    assert dict(adm.quotas.admitted()) == admitted
    fresh = [  # what `running_jobs` built per call before
        RunningJob(
            key=k,
            quota=c.quota,
            priority=adm.jobs[k].job.priority,
            start_time=adm.jobs[k].started or 0.0,
            usage=c.usage,
            preemptible=c.preemptible,
        )
        for k, c in admitted.items()
        if k in adm.jobs
    ]
    assert sorted(adm.running_jobs(), key=str) == sorted(fresh, key=str)


ops = st.lists(
    st.tuples(
        st.sampled_from(["enqueue", "run", "start", "requeue", "finish", "forget", "reload"]),
        st.sampled_from(NAMES),
        st.sampled_from(PRIORITIES),
        st.sampled_from(QUOTAS),
        st.booleans(),  # a new generation (the PodGroup changed: maybe its priority)
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_running_index_matches_a_recount(steps: list[tuple[str, str, int, str, bool]]) -> None:
    adm = Admission(ObjectCache(["PodGroup"]))
    generation: dict[str, int] = {}
    priority: dict[str, int] = {}
    quota: dict[str, str] = {}
    now = 0.0
    for op, name, prio, q, bump in steps:
        now += 1.0
        key = ("team", name)
        if bump or name not in generation:
            generation[name] = generation.get(name, 0) + 1
            priority[name], quota[name] = prio, q
        pg = _pg(name, priority=priority[name], quota=quota[name], generation=generation[name])
        if op == "enqueue":  # queued; a running job is requeued (it lost its placement)
            adm.enqueue(pg)
        elif op == "run":  # found holding reservations (a re-list, or a priority change while it runs)
            adm.ensure_running(pg, now=now)
        elif op == "start" and key in adm.jobs:
            adm.start(key, now=now)
        elif op == "requeue" and key in adm.jobs:  # preempted
            adm.requeue(key)
        elif op == "finish":  # the queue alone says it stopped
            adm.queue.finish(key)
        elif op == "forget":
            adm.forget(key)
        elif op == "reload":
            adm.load(nodes=[], classes=[], topologies={})
            generation.clear()
            priority.clear()
            quota.clear()
        _check(adm)


def test_running_priorities_moves_a_job_between_priorities() -> None:
    index = RunningPriorities()
    a: Key = ("n", "a")
    b: Key = ("n", "b")
    index.set(a, 5, "q")
    index.set(b, 3, "q")
    assert index.lowest() == 3
    index.set(b, 7, "q")
    assert index.lowest() == 5
    assert list(index.at_most(7)) == [a, b]
    assert list(index.at_most(7, equal=False)) == [a]
    index.set(b, 7, "r")
    assert list(index.at_most(7, quota="q")) == [a] and list(index.at_most(7, quota="r")) == [b]
    index.set(a, None)
    index.set(a, None)
    assert index.lowest() == 7 and len(index) == 1 and a not in index
    index.set(b, None)
    assert index.lowest() is None and list(index.at_most(100)) == []
