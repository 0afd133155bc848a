"""Reclaim plans: whole jobs of borrowing quotas, lowest priority and newest first, never the guaranteed."""

from __future__ import annotations

from gpuyard.scheduler.admission.quota.admission import QuotaBook
from gpuyard.scheduler.admission.quota.tree import QuotaSpec, QuotaTree
from gpuyard.scheduler.admission.quota.victims import RunningJob, plan_reclaim

G = "nvidia.com/gpu"


def setup(jobs: list[RunningJob], *, total: int = 16) -> tuple[QuotaTree, QuotaBook]:
    tree = QuotaTree(
        [QuotaSpec("team-a", min={G: 8}, max={G: 16}), QuotaSpec("team-b", min={G: 8}, max={G: 16})],
        total={G: total},
    )
    book = QuotaBook(tree)
    for j in jobs:
        book.track(j.key, quota=j.quota, usage=j.usage, preemptible=j.preemptible, admitted=True)
    return tree, book


def job(
    key: str, quota: str, gpus: int, *, priority: int = 0, start: float = 0.0, preemptible: bool = True
) -> RunningJob:
    return RunningJob(key, quota, priority, start, {G: gpus}, preemptible)


def test_victims_are_lowest_priority_then_newest_and_never_non_preemptible() -> None:
    running = [
        job("b-old", "team-b", 4, start=100),
        job("b-new", "team-b", 4, start=200),
        job("b-high", "team-b", 4, priority=5, start=300),
        job("b-guarded", "team-b", 4, start=400, preemptible=False),
    ]
    tree, book = setup(running)
    book.track("a1", quota="team-a", usage={G: 8})  # team-a's demand within its min arrives
    assert tree.runtime("team-b")[G] == 8 and tree.used("team-b")[G] == 16
    plan = plan_reclaim(tree, owner="team-a", need={G: 8}, running=running)
    assert plan.feasible, plan.reason
    assert plan.keys == ["b-new", "b-old"]
    assert plan.shortfall == {G: 8} and plan.freed == {G: 8}
    assert (
        "quota team-b uses 16 nvidia.com/gpu > runtime 8 (borrowed); team-a needs it back"
        == plan.victims[0].reason
    )
    # executing the plan restores the owner's min
    for key in plan.keys:
        book.release(key)
    assert book.admit("a1") is None


def test_unneeded_victims_are_spared() -> None:
    running = [
        job("b-small", "team-b", 1, start=500),
        job("b-big", "team-b", 8, priority=1, start=10),
        job("b-rest", "team-b", 7, priority=9),
    ]
    tree, book = setup(running)
    book.track("a1", quota="team-a", usage={G: 8})
    plan = plan_reclaim(tree, owner="team-a", need={G: 8}, running=running)
    assert plan.keys == ["b-big"]  # the small one was picked first, then found unnecessary


def test_nothing_to_do_when_the_room_is_free() -> None:
    running = [job("b1", "team-b", 8)]
    tree, book = setup(running)
    book.track("a1", quota="team-a", usage={G: 8})
    plan = plan_reclaim(tree, owner="team-a", need={G: 8}, running=running)
    assert plan.feasible and plan.victims == [] and plan.shortfall == {}


def test_only_guaranteed_capacity_is_reclaimed() -> None:
    running = [job("b1", "team-b", 16)]
    tree, book = setup(running)
    book.track("a1", quota="team-a", usage={G: 10})
    plan = plan_reclaim(tree, owner="team-a", need={G: 10}, running=running)
    assert not plan.feasible
    assert plan.reason == (
        "quota team-a: nvidia.com/gpu used 0 + needed 10 > min 8; only guaranteed capacity is reclaimed"
    )
    borrowed = plan_reclaim(tree, owner="team-a", need={G: 8}, running=running, within_min_only=False)
    assert borrowed.feasible and borrowed.keys == ["b1"]


def test_quotas_within_their_runtime_are_left_alone() -> None:
    # the cluster shrank to 10: mins 8/8 scale to 5/5; team-a wants 4, team-b keeps 6
    running = [job("b1", "team-b", 4), job("b2", "team-b", 4)]
    tree, book = setup(running, total=10)
    book.track("a1", quota="team-a", usage={G: 4})
    assert tree.min("team-b")[G] == 5 and tree.runtime("team-b")[G] == 6
    plan = plan_reclaim(tree, owner="team-a", need={G: 4}, running=running)
    # free 2, shortfall 2; team-b is 2 over its runtime: one job of 4 goes, not both
    assert plan.feasible and len(plan.victims) == 1
    running = [job("b1", "team-b", 5, preemptible=False)]
    tree, book = setup(running, total=5)
    book.track("a1", quota="team-a", usage={G: 2})
    plan = plan_reclaim(tree, owner="team-a", need={G: 2}, running=running)
    assert (
        not plan.feasible
        and plan.reason == "borrowed capacity that can be reclaimed falls short by 2 nvidia.com/gpu"
    )


def test_siblings_under_a_shared_parent_can_be_reclaimed() -> None:
    tree = QuotaTree(
        [
            QuotaSpec("org", min={G: 8}, max={G: 8}, is_parent=True),
            QuotaSpec("a", parent="org", min={G: 4}, max={G: 8}),
            QuotaSpec("b", parent="org", min={G: 4}, max={G: 8}),
            QuotaSpec("other", min={G: 0}, max={G: 8}),
        ],
        total={G: 8},
    )
    book = QuotaBook(tree)
    running = [job("b1", "b", 4, start=1), job("b2", "b", 4, start=2)]
    for j in running:
        book.track(j.key, quota=j.quota, usage=j.usage, admitted=True)
    book.track("a1", quota="a", usage={G: 4})
    plan = plan_reclaim(tree, owner="a", need={G: 4}, running=running)
    assert plan.keys == ["b2"]
    assert plan.victims[0].reason.startswith("quota b uses 8 nvidia.com/gpu > runtime 4")


def test_owner_must_be_entitled() -> None:
    tree, _ = setup([])
    plan = plan_reclaim(tree, owner="nobody", need={G: 1}, running=[])
    assert not plan.feasible and plan.reason == "quota nobody: not an attached leaf quota"


def test_an_ancestor_over_its_runtime_is_repaired_even_when_the_cluster_has_room() -> None:
    # 5 GPUs, one free. org's runtime is 4 (other's pending GPU takes the fifth), but its child b
    # borrowed 3: a's GPU within its min would put org at 5 > 4, so admission refuses it until
    # a job of b (inside org) goes; a job of `other` would not help org.
    tree = QuotaTree(
        [
            QuotaSpec("org", min={G: 2}, is_parent=True),
            QuotaSpec("a", parent="org", min={G: 2}),
            QuotaSpec("b", parent="org", min={G: 0}),
            QuotaSpec("other", min={G: 0}),
        ],
        total={G: 5},
    )
    book = QuotaBook(tree)
    running = [job("b1", "b", 3, start=1), job("a1", "a", 1, start=2)]
    for j in running:
        book.track(j.key, quota=j.quota, usage=j.usage, admitted=True)
    book.track("other1", quota="other", usage={G: 1})
    book.track("a2", quota="a", usage={G: 1})
    assert tree.runtime("org")[G] == 4 and book.admit("a2") is not None
    plan = plan_reclaim(tree, owner="a", need={G: 1}, running=running)
    assert plan.feasible, plan.reason
    assert plan.keys == ["b1"] and plan.shortfall == {G: 1}
    book.release("b1")
    assert book.admit("a2") is None


def test_an_ancestor_shortfall_names_the_quota_when_it_cannot_be_met() -> None:
    tree = QuotaTree(
        [
            QuotaSpec("org", min={G: 2}, is_parent=True),
            QuotaSpec("a", parent="org", min={G: 2}),
            QuotaSpec("b", parent="org", min={G: 0}),
            QuotaSpec("other", min={G: 0}),
        ],
        total={G: 5},
    )
    book = QuotaBook(tree)
    running = [job("b1", "b", 3, preemptible=False), job("a1", "a", 1)]
    for j in running:
        book.track(j.key, quota=j.quota, usage=j.usage, preemptible=j.preemptible, admitted=True)
    book.track("other1", quota="other", usage={G: 1})
    book.track("a2", quota="a", usage={G: 1})
    plan = plan_reclaim(tree, owner="a", need={G: 1}, running=running)
    assert not plan.feasible
    assert plan.reason == "borrowed capacity that can be reclaimed falls short by 1 nvidia.com/gpu in org"
