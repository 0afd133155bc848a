"""Priority preemption: the victim choice (kube-scheduler's `TestSelectBestCandidate` cases),
whole gangs, protections (PodDisruptionBudgets, the non-preemptible label, queue policies) and
nomination — with plain data and the synchronous core, no event loop."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from gpuyard.apis.disruption import PodDisruptionBudget
from gpuyard.apis.quotakinds import Queue
from gpuyard.scheduler.decisions import PlaceGang, RecordEvent
from gpuyard.scheduler.gangs.outcomes import Placement
from gpuyard.scheduler.placement.profiles import build_profile
from gpuyard.scheduler.preemption.victims import Candidate, plan_cost, select_victims
from tests.unit.scheduler.helpers import assume_into, gang_of, make_node, place_one, podgroup, role, snap
from tests.unit.scheduler.test_core import T0, Cluster, core, of, step


def on(node: str) -> dict[str, str]:
    return {"kubernetes.io/hostname": node}


# --- the order of plans -------------------------------------------------------------------------


def c(name: str, priority: int = 0, *, start: float = 0.0, lost: float = 0.0) -> Candidate:
    return Candidate(key=("ns", name), priority=priority, start_time=start, gpu_hours_lost=lost)


@pytest.mark.parametrize(
    ("case", "plans", "violations", "best"),
    [
        ("lowest highest priority", [[c("a", 1), c("b", 1)], [c("c", 2)]], [0, 0], 0),
        ("lowest sum of priorities", [[c("a", 2), c("b", 2)], [c("c", 2), c("d", 1)]], [0, 0], 1),
        ("fewest victims", [[c("a"), c("b")], [c("c")]], [0, 0], 1),
        ("fewest GPU-hours lost", [[c("a", lost=5.0)], [c("b", lost=1.0)]], [0, 0], 1),
        ("latest start", [[c("a", start=10.0)], [c("b", start=50.0)]], [0, 0], 1),
        ("fewest PDB violations before priority", [[c("a", 0)], [c("b", 5)]], [1, 0], 1),
        ("priority before the number of victims", [[c("a", 3)], [c("b", 1), c("c", 1)]], [0, 0], 1),
    ],
)
def test_plans_are_ordered_as_kube_scheduler_picks_a_node(
    case: str, plans: list[list[Candidate]], violations: list[int], best: int
) -> None:
    costs = [plan_cost(p, v) for p, v in zip(plans, violations, strict=True)]
    assert costs.index(min(costs)) == best, case


# --- choosing victims on a snapshot -------------------------------------------------------------


def running(s: Any, name: str, gpus: int, node: str, *, replicas: int = 1) -> None:
    got = place_one(s, podgroup(name, role(replicas=replicas, gpus=gpus, node_selector=on(node))))
    assert isinstance(got, Placement)
    assume_into(s, got)


@pytest.mark.parametrize(
    ("case", "jobs", "candidates", "expected"),
    [
        (
            "lowest highest priority wins over fewer victims",
            [("a", 4, "n1"), ("b", 4, "n1"), ("c", 8, "n2")],
            {"a": (1, 0.0), "b": (1, 0.0), "c": (2, 0.0)},
            {"a", "b"},
        ),
        (
            "a higher-priority job on the node sends the plan elsewhere",
            [("a", 4, "n1"), ("b", 4, "n1"), ("c", 8, "n2")],
            {"a": (0, 0.0), "b": (3, 0.0), "c": (2, 0.0)},
            {"c"},
        ),
        (
            "fewest victims at equal priority",
            [("a", 4, "n1"), ("b", 4, "n1"), ("c", 8, "n2")],
            {"a": (0, 0.0), "b": (0, 0.0), "c": (0, 0.0)},
            {"c"},
        ),
        (
            "the latest started at equal cost",
            [("a", 8, "n1"), ("c", 8, "n2")],
            {"a": (0, 10.0), "c": (0, 50.0)},
            {"c"},
        ),
    ],
)
def test_select_victims_picks_the_cheapest_plan_that_fits_on_real_nodes(
    case: str, jobs: list[tuple[str, int, str]], candidates: dict[str, tuple[int, float]], expected: set[str]
) -> None:
    s = snap([make_node("n1", gpus=8), make_node("n2", gpus=8)])
    for name, gpus, node in jobs:
        running(s, name, gpus, node)
    cands = [
        Candidate(key=("default", n), priority=p, start_time=t, gpus=dict((j[0], j[1]) for j in jobs)[n])
        for n, (p, t) in candidates.items()
    ]
    gang = gang_of(s, podgroup("urgent", role(gpus=8)))
    before = s.gpu_whole_free.copy()
    plan = select_victims(s, gang, build_profile("default"), cands)
    assert plan is not None, case
    assert {v.key[1] for v in plan.victims} == expected, case
    assert (s.gpu_whole_free == before).all()  # the snapshot is as it was


def test_no_plan_when_even_every_candidate_gone_leaves_no_room() -> None:
    s = snap([make_node("n1", gpus=8), make_node("n2", gpus=8)])
    running(s, "a", 4, "n1")
    running(s, "b", 4, "n2")
    gang = gang_of(s, podgroup("urgent", role(gpus=8)))
    only_a = [Candidate(key=("default", "a"), gpus=4)]  # b is protected: n1 frees 4 + 4 idle
    plan = select_victims(s, gang, build_profile("default"), only_a)
    assert plan is not None and [v.key[1] for v in plan.victims] == ["a"]
    gang16 = gang_of(s, podgroup("huge", role(gpus=8), role("PS", gpus=8)))
    assert select_victims(s, gang16, build_profile("default"), only_a) is None


# --- the core: whole gangs, protections, nomination ------------------------------------------------


def low(name: str, gpus: int, node: str, *, ns: str = "t", replicas: int = 1, **spec: Any) -> Any:
    return podgroup(name, role(replicas=replicas, gpus=gpus, node_selector=on(node)), namespace=ns, **spec)


def urgent(ns: str = "u", gpus: int = 8, priority: int = 1000) -> Any:
    return podgroup("urgent", role(gpus=gpus), namespace=ns, priority=priority)


def release(cluster: Cluster, ns: str, name: str) -> None:
    """What the operator does once the evicted pods stopped."""
    pg = cluster.get("PodGroup", ns, name)
    rel = {p: cluster.get("Reservation", ns, p).metadata.uid for p in pg.status.evictions}
    cluster.spec("PodGroup", ns, name, lambda x: x.spec.release.update(rel))


def evicted(cluster: Cluster, ns: str, name: str) -> dict[str, str]:
    return dict(cluster.get("PodGroup", ns, name).status.evictions)


def test_a_gang_is_preempted_whole_and_the_preemptor_starts_once_it_stopped() -> None:
    cluster = Cluster(make_node("n1", gpus=8), make_node("n2", gpus=8))
    state = core(cluster)
    cluster.put(podgroup("gang", role(replicas=2, gpus=8), namespace="t"))
    step(state, cluster)
    cluster.put(urgent())
    out = step(state, cluster, now=10.0)
    assert set(evicted(cluster, "t", "gang")) == {"gang-worker-0", "gang-worker-1"}  # both pods
    status = cluster.get("PodGroup", "t", "gang").status
    assert (status.phase, status.reason) == ("Pending", "Preempted")
    assert status.message == "preempted by a higher-priority job (priority 1000) of another team"
    assert "urgent" not in status.message
    assert {e.reason for e in of(RecordEvent, out)} >= {"Preempted", "Preempting"}
    assert cluster.get("PodGroup", "u", "urgent").status.reason == "Nominated"
    assert of(PlaceGang, step(state, cluster, now=11.0)) == []  # the victim's pods still run
    release(cluster, "t", "gang")
    assert [g.key for g in of(PlaceGang, step(state, cluster, now=12.0))] == [("u", "urgent")]
    counts = state.take_counts()  # the core counts; the loop writes the metrics (see the platform test)
    assert counts.preemptions == {"priority": 1} and counts.gpu_hours_lost > 0


def test_equal_priority_and_non_preemptible_jobs_are_not_victims() -> None:
    cluster = Cluster(
        make_node("n1", gpus=8),
        low("same", 8, "n1", priority=1000),
        podgroup(
            "keep",
            role(gpus=8, node_selector=on("n2")),
            namespace="t",
        ),
        make_node("n2", gpus=8),
    )
    keep = cluster.get("PodGroup", "t", "keep").clone()
    keep.metadata.labels["quota.scheduling.koordinator.sh/preemptible"] = "false"
    cluster.put(keep)
    state = core(cluster)
    step(state, cluster)
    cluster.put(urgent())
    step(state, cluster, now=10.0)
    assert evicted(cluster, "t", "same") == {} and evicted(cluster, "t", "keep") == {}
    assert cluster.get("PodGroup", "u", "urgent").status.phase == "Pending"


def queue(name: str, **spec: Any) -> Queue:
    return Queue.model_validate({"metadata": {"name": name}, "spec": spec})


def test_queue_min_runtime_and_policy_protect_running_jobs() -> None:
    cluster = Cluster(make_node("n1", gpus=8), queue("t", preemptMinRuntime="1h"), queue("u"))
    state = core(cluster)
    cluster.put(low("young", 8, "n1"))
    step(state, cluster, now=0.0)
    cluster.put(urgent())
    step(state, cluster, now=600.0)
    assert evicted(cluster, "t", "young") == {}  # ran 10 minutes of its hour
    cluster.put(queue("t"))  # the protection is lifted
    step(state, cluster, now=601.0)
    assert evicted(cluster, "t", "young")


def test_a_queue_that_never_preempts() -> None:
    cluster = Cluster(make_node("n1", gpus=8), queue("u", preemptionPolicy="Never"))
    state = core(cluster)
    cluster.put(low("victim", 8, "n1"))
    step(state, cluster)
    cluster.put(urgent())
    step(state, cluster, now=10.0)
    assert evicted(cluster, "t", "victim") == {}


@pytest.mark.parametrize(("policy", "taken"), [("LowerOrNewerEqualPriority", True), ("LowerPriority", False)])
def test_lower_or_newer_equal_priority_takes_a_newer_job_of_equal_priority(policy: str, taken: bool) -> None:
    cluster = Cluster(make_node("n1", gpus=8), queue("u", preemptionPolicy=policy))
    state = core(cluster)
    waiting = urgent(priority=5)
    waiting.metadata.creation_timestamp = T0 - timedelta(hours=1)  # submitted an hour ago
    cluster.put(waiting)
    cluster.put(low("first", 8, "n1", priority=5))  # same priority, started after that (queue t goes first)
    step(state, cluster, now=0.0)  # `first` is placed, then `urgent` does not fit
    assert bool(evicted(cluster, "t", "first")) is taken


def test_a_pod_disruption_budget_steers_the_choice() -> None:
    pdb = PodDisruptionBudget.model_validate(
        {
            "metadata": {"name": "serving", "namespace": "t"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"job-name": "newer"}}},
        }
    )
    cluster = Cluster(make_node("n1", gpus=8), make_node("n2", gpus=8), pdb)
    state = core(cluster)
    cluster.put(low("older", 8, "n1"))
    step(state, cluster, now=0.0)
    cluster.put(low("newer", 8, "n2"))
    step(state, cluster, now=100.0)
    cluster.put(urgent())
    step(state, cluster, now=200.0)
    # without the budget the newer job (less work lost) would go; it is covered, so the older goes
    assert evicted(cluster, "t", "newer") == {}
    assert evicted(cluster, "t", "older")


def test_nomination_stops_a_smaller_job_from_taking_the_freed_gpus() -> None:
    cluster = Cluster(make_node("n1", gpus=8))
    state = core(cluster)
    cluster.put(low("victim", 8, "n1"))
    step(state, cluster)
    cluster.put(urgent())
    step(state, cluster, now=10.0)
    assert evicted(cluster, "t", "victim")
    # a small job of a queue tried before the preemptor's arrives while the victim stops
    cluster.put(podgroup("small", role(gpus=1), namespace="a-small"))
    step(state, cluster, now=11.0)
    release(cluster, "t", "victim")
    out = step(state, cluster, now=12.0)
    assert [g.key for g in of(PlaceGang, out)] == [("u", "urgent")]
    message = cluster.get("PodGroup", "a-small", "small").status.message
    assert "free room for a job that waits ahead" in message


def test_with_quotas_priority_preempts_only_within_the_preemptors_quota() -> None:
    from tests.unit.scheduler.test_core import _quota

    cluster = Cluster(
        make_node("n1", gpus=8), make_node("n2", gpus=8), _quota("a", 8, 16), _quota("b", 8, 16)
    )
    state = core(cluster)
    cluster.put(podgroup("b-low", role(gpus=8, cpu=None, memory=None), namespace="b"))  # b's guarantee
    cluster.put(podgroup("a-low", role(gpus=8, cpu=None, memory=None), namespace="a"))
    step(state, cluster)
    cluster.put(podgroup("a-urgent", role(gpus=8, cpu=None, memory=None), namespace="a", priority=1000))
    step(state, cluster, now=10.0)
    assert evicted(cluster, "b", "b-low") == {}  # another quota's job within its min is safe
    assert evicted(cluster, "a", "a-low")  # its own quota's lower-priority job makes room
