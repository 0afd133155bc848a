"""Queue ordering: priority + FIFO, aging, DRF across queues, StrictFIFO/BestEffortFIFO, backfill."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpuyard.apis.quotakinds import ANNOTATION_EXPECTED_DURATION, Queue
from gpuyard.apis.scheduling import PodGroup
from gpuyard.scheduler.admission.quota.ordering import (
    Aging,
    FairQueue,
    QueueConfig,
    QueuedJob,
    queue_configs,
    queued_job,
)
from gpuyard.scheduler.admission.quota.resources import fits

G = "nvidia.com/gpu"
NOW = 10_000.0


def j(
    key: str,
    queue: str = "q",
    *,
    prio: int = 0,
    t: float = 0.0,
    gpus: int = 1,
    cpu: int = 0,
    dur: float | None = None,
) -> QueuedJob:
    request = {G: gpus} if gpus else {}
    if cpu:
        request["cpu"] = cpu
    return QueuedJob(key, queue, prio, t, request, dur)


def run_cycle(fq: FairQueue, now: float = NOW) -> tuple[list[str], list[str]]:
    """A cycle whose placer says yes when the aggregate free capacity holds the job."""
    started, blocked = [], []
    cycle = fq.candidates(now)
    for job in cycle:
        if fits(job.request, cycle.free):
            cycle.placed(job)
            started.append(job.key)
        else:
            cycle.blocked(job, "no room")
            blocked.append(job.key)
    return started, blocked


def keys(jobs: list[QueuedJob]) -> list[str]:
    return [x.key for x in jobs]


def test_within_a_queue_priority_then_submission_then_arrival() -> None:
    fq = FairQueue(capacity={G: 100}, aging=Aging(step=0))
    for job in [
        j("low-early", prio=0, t=1),
        j("high-late", prio=5, t=9),
        j("high-early", prio=5, t=3),
        j("tie-2", t=1),
        j("low-late", t=7),
    ]:
        fq.add(job)
    assert keys(fq.order(NOW)) == ["high-early", "high-late", "low-early", "tie-2", "low-late"]
    fq.remove("high-early")
    fq.update(j("low-late", prio=9, t=7))
    assert keys(fq.order(NOW)) == ["low-late", "high-late", "low-early", "tie-2"]
    assert len(fq) == 4 and "high-early" not in fq


def test_aging_lets_an_old_low_priority_job_overtake() -> None:
    fq = FairQueue(capacity={G: 100}, aging=Aging(interval=60, step=1, max_boost=3))
    fq.add(j("old-low", prio=0, t=0))
    fq.add(j("new-high", prio=2, t=90))
    assert keys(fq.order(100)) == ["new-high", "old-low"]  # 0 + 1 step < 2 + 0
    assert keys(fq.order(180)) == ["old-low", "new-high"]  # 0 + 3 = 2 + 1: the earlier submission first
    # the boost is capped at 3: a fresh job of priority 4 goes first, one of priority 3 does not
    fq.add(j("fresh-4", prio=4, t=100_000))
    fq.add(j("fresh-3", prio=3, t=100_000))
    assert fq.effective_priority(fq.get("old-low"), 100_000) == 3
    assert keys(fq.order(100_000)) == ["new-high", "fresh-4", "old-low", "fresh-3"]


def test_aging_per_queue_settings() -> None:
    fq = FairQueue(
        capacity={G: 10}, queues=[QueueConfig("slow", aging=Aging(step=0))], aging=Aging(interval=1, step=1)
    )
    fq.add(j("a", "slow", t=0))
    fq.add(j("b", "fast", t=0))
    assert fq.effective_priority(fq.get("a"), 50) == 0
    assert fq.effective_priority(fq.get("b"), 50) == 50


def test_drf_lowest_weighted_dominant_share_goes_first() -> None:
    fq = FairQueue(capacity={G: 16, "cpu": 100_000}, aging=Aging(step=0))
    fq.add_running(j("ra", "a", gpus=8), start=0)  # a: 0.5 of GPUs
    fq.add_running(j("rb", "b", gpus=0, cpu=75_000), start=0)  # b: 0.75 of CPU (its dominant resource)
    for q in "ab":
        fq.add(j(f"{q}1", q, t=1))
    assert fq.share("a") == 0.5 and fq.share("b") == 0.75
    assert keys(fq.order(NOW)) == ["a1", "b1"]
    fq.set_queue(QueueConfig("b", weight=3))  # b: 0.75 / 3 = 0.25
    assert keys(fq.order(NOW)) == ["b1", "a1"]


def test_drf_interleaves_as_jobs_start() -> None:
    fq = FairQueue(capacity={G: 16})
    for i in range(4):
        fq.add(j(f"a{i}", "a", t=i, gpus=2))
        fq.add(j(f"b{i}", "b", t=i, gpus=4))
    started, _ = run_cycle(fq)
    # a job of b doubles b's share; a catches up with two of its own
    assert started[:5] == ["a0", "b0", "a1", "a2", "b1"]
    assert fq.share("a") + fq.share("b") <= 1.0 + 1e-9


def test_strict_fifo_head_blocks_its_queue_best_effort_goes_on() -> None:
    fq = FairQueue(
        capacity={G: 8},
        queues=[QueueConfig("strict", strategy="StrictFIFO"), QueueConfig("loose")],
        backfill=False,
    )
    fq.add(j("s-big", "strict", t=1, gpus=16))
    fq.add(j("s-small", "strict", t=2, gpus=1))
    fq.add(j("l-big", "loose", t=1, gpus=16))
    fq.add(j("l-small", "loose", t=2, gpus=1))
    started, blocked = run_cycle(fq)
    assert sorted(started) == ["l-small"]
    assert sorted(blocked) == ["l-big", "s-big"]
    why = fq.explain("s-small", NOW)
    assert why.cause == "behind head s-big of StrictFIFO queue strict (no room)"
    assert why.queue_position == 1


def test_max_running_jobs() -> None:
    fq = FairQueue(capacity={G: 100}, queues=[QueueConfig("q", max_running_jobs=2)])
    for i in range(4):
        fq.add(j(f"j{i}", t=i))
    started, _ = run_cycle(fq)
    assert started == ["j0", "j1"]
    assert fq.explain("j2", NOW).cause == "queue q runs 2 jobs (maxRunningJobs 2)"
    fq.finish("j0")
    assert run_cycle(fq)[0] == ["j2"]


def test_no_feedback_counts_as_skipped() -> None:
    fq = FairQueue(capacity={G: 4})
    fq.add(j("a", t=1))
    fq.add(j("b", t=2))
    assert keys(list(fq.candidates(NOW))) == ["a", "b"]
    assert len(fq) == 2


def test_requeue_keeps_the_submission_time() -> None:
    fq = FairQueue(capacity={G: 4}, aging=Aging(step=0))
    fq.add(j("first", t=1))
    fq.add(j("second", t=2))
    fq.start("first", now=5)
    assert fq.is_running("first") and fq.free() == {G: 3}
    fq.requeue("first")
    assert keys(fq.order(NOW)) == ["first", "second"]
    with pytest.raises(KeyError):
        fq.start("nope", now=1)


# --- backfill --------------------------------------------------------------------------------------


def busy_cluster() -> FairQueue:
    """16 GPUs; a running job holds 12 until t=NOW+100; the head wants 8."""
    fq = FairQueue(capacity={G: 16}, aging=Aging(step=0))
    fq.add_running(j("running", "other", gpus=12, dur=100), start=NOW)
    fq.add(j("head", t=1, gpus=8))
    return fq


def test_easy_backfill_short_jobs_end_before_the_shadow_time() -> None:
    fq = busy_cluster()
    fq.add(j("short", t=2, gpus=4, dur=50))
    fq.add(j("long", t=3, gpus=4, dur=500))
    started, blocked = run_cycle(fq)
    # at NOW+100 16 are free, the head needs 8: 8 extra; the long job fits in that extra
    assert started == ["short"]  # the long one no longer fits now (4 free were taken)
    assert blocked == ["head", "long"]
    fq2 = busy_cluster()
    fq2.add(j("long", t=3, gpus=4, dur=500))
    assert run_cycle(fq2)[0] == ["long"]  # uses the 8 the head leaves over


def test_backfill_refuses_a_job_that_would_delay_the_head() -> None:
    fq = FairQueue(capacity={G: 16}, aging=Aging(step=0))
    fq.add_running(j("running", "other", gpus=12, dur=100), start=NOW)
    fq.add(j("head", t=1, gpus=14))  # at NOW+100: 16 free, 2 extra
    fq.add(j("long", t=2, gpus=4, dur=500))
    started, blocked = run_cycle(fq)
    assert started == [] and blocked == ["head"]
    cycle_cause = fq.explain("long", NOW).cause
    assert cycle_cause == "would delay head head, expected to start in 100s"


def test_backfill_without_durations_is_best_effort() -> None:
    fq = FairQueue(capacity={G: 16}, aging=Aging(step=0))
    fq.add_running(j("running", "other", gpus=12), start=NOW)  # no declared duration
    fq.add(j("head", t=1, gpus=14))
    fq.add(j("small", t=2, gpus=4))
    assert run_cycle(fq)[0] == ["small"]


def test_a_starving_head_reserves_when_durations_are_unknown() -> None:
    fq = FairQueue(capacity={G: 16, "cpu": 10_000}, aging=Aging(step=0, reserve_after=3600))
    fq.add_running(j("running", "other", gpus=12), start=NOW)
    fq.add(j("head", t=NOW - 7200, gpus=14))
    fq.add(j("small", t=NOW - 10, gpus=4))
    fq.add(j("cpu-only", t=NOW - 5, gpus=0, cpu=1000))  # nothing the head asks for
    started, blocked = run_cycle(fq)
    assert started == ["cpu-only"] and blocked == ["head"]
    assert (
        fq.explain("small", NOW).cause
        == "head head has waited too long; nothing that competes with it starts first"
    )


def test_blocked_without_reserve_protects_nothing() -> None:
    fq = busy_cluster()
    fq.add(j("long", t=3, gpus=4, dur=10_000))
    cycle = fq.candidates(NOW)
    head = next(cycle)
    cycle.blocked(head, "quota team-a: over runtime", reserve=False)
    assert cycle.head is None
    nxt = next(cycle)
    assert nxt.key == "long"
    cycle.placed(nxt)
    assert next(cycle, None) is None
    assert fq.explain("head", NOW).cause == "quota team-a: over runtime"


def test_explain_positions_and_share() -> None:
    fq = FairQueue(capacity={G: 8}, aging=Aging(step=0))
    fq.add_running(j("r", "busy", gpus=4), start=0)
    fq.add(j("b1", "busy", t=1))
    fq.add(j("i1", "idle", t=5))
    fq.add(j("i2", "idle", t=6))
    e = fq.explain("b1", NOW)
    assert (e.position, e.queue_position, e.queue_share) == (2, 0, 0.5)
    assert (
        fq.explain("i2", NOW).describe() == "#2 overall, #2 in queue idle (share 0.00, effective priority 0)"
    )


# --- from the API ----------------------------------------------------------------------------------


def test_queued_job_from_a_podgroup() -> None:
    pg = PodGroup.model_validate(
        {
            "metadata": {
                "name": "train",
                "namespace": "team-a",
                "annotations": {ANNOTATION_EXPECTED_DURATION: "1h30m"},
                "creationTimestamp": "2026-01-01T00:00:00Z",
            },
            "spec": {
                "priority": 3,
                "roles": [
                    {
                        "name": "Worker",
                        "replicas": 4,
                        "template": {
                            "containers": [
                                {"name": "w", "resources": {"limits": {"nvidia.v100": 2, "cpu": "4"}}}
                            ]
                        },
                    },
                    {
                        "name": "PS",
                        "replicas": 1,
                        "template": {
                            "containers": [
                                {"name": "p", "resources": {"requests": {"cpu": "2", "memory": "8Gi"}}}
                            ]
                        },
                    },
                ],
            },
        }
    )
    job = queued_job(pg)
    assert job.key == ("team-a", "train") and job.queue == "team-a" and job.priority == 3
    assert job.submit_time == datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    assert job.expected_duration == 5400
    assert job.request == {"nvidia.v100": 8, G: 8, "cpu": 18_000, "memory": 8 * 2**30}
    pg.spec.queue = "research"
    pg.metadata.annotations[ANNOTATION_EXPECTED_DURATION] = "soon"
    job = queued_job(pg, submit_time=5)
    assert job.queue == "research" and job.expected_duration is None and job.submit_time == 5


def test_queue_configs_from_queue_objects() -> None:
    q = Queue.model_validate(
        {
            "metadata": {"name": "research"},
            "spec": {
                "weight": 2,
                "queueingStrategy": "StrictFIFO",
                "maxRunningJobs": 3,
                "aging": {"intervalSeconds": 60, "step": 2},
            },
        }
    )
    (cfg,) = queue_configs([q])
    assert cfg == QueueConfig("research", 2.0, "StrictFIFO", 3, Aging(60, 2, 100, None))


# --- parking (the scheduler's "tried, did not fit: wait until the cluster changes") ----------------


def test_parked_jobs_are_not_tried_until_the_cluster_changes() -> None:
    fq = FairQueue(capacity={G: 4}, aging=Aging(step=0))
    fq.add(j("big", t=1, gpus=8))
    fq.add(j("small", t=2))
    cycle = fq.candidates(NOW)
    big = next(cycle)
    fq.park(big.key, epoch=7, reason="no node has 8 GPUs")
    assert not cycle.head  # parking is not feedback to the running cycle
    assert len(fq) == 1 and fq.waiting() == 2 and fq.is_held("big")
    assert keys(list(fq.candidates(NOW))) == ["small"]
    assert fq.explain("big", NOW).cause == "no node has 8 GPUs; set aside until the cluster changes"
    assert fq.wake_parked(7) == 0
    assert fq.wake_parked(8) == 1
    assert keys(fq.order(NOW)) == ["big", "small"]
    assert fq.explain("big", NOW).cause == "no node has 8 GPUs"


def test_backoff_until_a_time() -> None:
    fq = FairQueue(capacity={G: 4})
    fq.add(j("a", t=1))
    fq.add(j("b", t=2))
    fq.backoff("a", until=NOW + 5, reason="assume failed")
    fq.backoff("b", until=NOW + 9)
    assert fq.release_due(NOW) == NOW + 5
    assert fq.release_due(NOW + 5) == NOW + 9 and "a" in fq and fq.is_held("b")
    assert fq.release_due(NOW + 10) is None and len(fq) == 2
    fq.backoff("a", until=NOW + 20)
    assert fq.remove("a") is not None and fq.waiting() == 1
    fq.backoff("b", until=NOW + 20)
    fq.start("b", now=NOW)  # a held job that was placed after all
    assert fq.is_running("b") and fq.waiting() == 0


def test_a_parked_head_stays_protected() -> None:
    fq = busy_cluster()  # 12 of 16 busy until NOW+100; the head wants 14
    fq.add(j("head", t=1, gpus=14))
    fq.park("head", epoch=1, reason="no room")
    fq.add(j("long", t=2, gpus=4, dur=500))
    fq.add(j("short", t=3, gpus=4, dur=50))
    started, _ = run_cycle(fq)
    assert started == ["short"]
    assert fq.explain("long", NOW).cause == "would delay head head, expected to start in 100s"
