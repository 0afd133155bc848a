"""Runtime quota: the split (largest remainder, re-splitting), min scaling, and whole trees."""

from __future__ import annotations

import pytest

from gpuyard.scheduler.admission.quota.tree import (
    DEFAULT_QUOTA,
    ROOT_QUOTA,
    QuotaSpec,
    QuotaTree,
    largest_remainder,
    redistribute,
    scale_mins,
)

G = "nvidia.com/gpu"


def spec(
    name: str,
    *,
    parent: str = ROOT_QUOTA,
    lo: int = 0,
    hi: int | None = None,
    weight: int | None = None,
    lend: bool = True,
    is_parent: bool = False,
) -> QuotaSpec:
    return QuotaSpec(
        name=name,
        parent=parent,
        min={G: lo},
        max={} if hi is None else {G: hi},
        shared_weight=None if weight is None else {G: weight},
        allow_lent=lend,
        is_parent=is_parent,
    )


# --- largest remainder ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total", "weights", "expected"),
    [
        (45, [60, 50, 80], [14, 12, 19]),  # the worked example
        (9, [50, 80], [3, 6]),  # what B leaves, split between C and D
        (10, [1, 1, 1], [4, 3, 3]),  # ties go by name: A first
        (0, [1, 2], [0, 0]),
        (7, [0, 5], [0, 7]),
        (5, [0, 0], [0, 0]),
        (10**12, [3, 7], [3 * 10**11, 7 * 10**11]),  # memory in bytes: no float rounding
    ],
)
def test_largest_remainder(total: int, weights: list[int], expected: list[int]) -> None:
    names = [chr(ord("A") + i) for i in range(len(weights))]
    out = largest_remainder(total, weights, names)
    assert out == expected
    if sum(w for w in weights if w > 0):
        assert sum(out) == max(total, 0)


def test_largest_remainder_exact_for_huge_weights() -> None:
    weights = [2**62 + 1, 2**61 + 3, 12345]
    out = largest_remainder(2**40 + 7, weights, ["a", "b", "c"])
    assert sum(out) == 2**40 + 7


# --- the split among children ----------------------------------------------------------------------


def test_worked_example_spare_split_by_weight() -> None:
    # 45 spare GPUs, three borrowers that want plenty: 14/12/19
    out = redistribute(
        45,
        requests=[100, 100, 100],
        mins=[0, 0, 0],
        weights=[60, 50, 80],
        lend=[True] * 3,
        names=["B", "C", "D"],
    )
    assert out == [14, 12, 19]


def test_worked_example_capped_borrower_leaves_the_rest_to_others() -> None:
    # B wants only 5 more: it keeps 5, the 9 it leaves go C +3, D +6
    out = redistribute(
        45,
        requests=[5, 100, 100],
        mins=[0, 0, 0],
        weights=[60, 50, 80],
        lend=[True] * 3,
        names=["B", "C", "D"],
    )
    assert out == [5, 12 + 3, 19 + 6]


def test_children_within_min_get_their_request_and_borrowers_their_min_first() -> None:
    # A wants 4 of its min 10 (lends 6); B wants 30 with min 10: B gets 10 + all spare
    out = redistribute(
        40, requests=[4, 30], mins=[10, 10], weights=[1, 1], lend=[True, True], names=["A", "B"]
    )
    assert out == [4, 30]
    out = redistribute(
        20, requests=[4, 30], mins=[10, 10], weights=[1, 1], lend=[True, True], names=["A", "B"]
    )
    assert out == [4, 16]


def test_a_quota_that_does_not_lend_keeps_its_min() -> None:
    out = redistribute(
        20, requests=[4, 30], mins=[10, 10], weights=[1, 1], lend=[False, True], names=["A", "B"]
    )
    assert out == [10, 10]


def test_nobody_wants_more_leaves_spare_unassigned() -> None:
    out = redistribute(100, requests=[5, 7], mins=[0, 0], weights=[1, 1], lend=[True, True], names=["A", "B"])
    assert out == [5, 7]


def test_zero_weight_borrower_gets_only_its_min() -> None:
    out = redistribute(
        20, requests=[15, 15], mins=[5, 0], weights=[0, 1], lend=[True, True], names=["A", "B"]
    )
    assert out == [5, 15]


@pytest.mark.parametrize(
    ("capacity", "mins", "expected"),
    [
        (40, [10, 20], [10, 20]),  # fits: unchanged
        (15, [10, 20], [5, 10]),  # shrunk: proportional
        (10, [3, 3, 3, 3], [2, 2, 2, 2]),  # rounded down, never above capacity
        (0, [5, 5], [0, 0]),
    ],
)
def test_scale_mins(capacity: int, mins: list[int], expected: list[int]) -> None:
    out = scale_mins(capacity, mins)
    assert out == expected
    assert out == list(mins) or sum(out) <= capacity


# --- trees ----------------------------------------------------------------------------------------


def test_tree_worked_example_with_mins() -> None:
    # cluster 100: A holds its min 25 (wants no more), B/C/D want 40 each over their mins of 10
    tree = QuotaTree(
        [
            spec("A", lo=25, hi=100, weight=1),
            spec("B", lo=10, hi=100, weight=60),
            spec("C", lo=10, hi=100, weight=50),
            spec("D", lo=10, hi=100, weight=80),
        ],
        total={G: 100},
    )
    tree.add_request("A", {G: 25})
    for name in "BCD":
        tree.add_request(name, {G: 50})
    rt = {n: tree.runtime(n)[G] for n in "ABCD"}
    # 100 - 25 - 3 x 10 = 45 spare -> 14/12/19
    assert rt == {"A": 25, "B": 24, "C": 22, "D": 29}
    tree.add_request("B", {G: -35})  # B now wants 15: 5 over its min
    rt = {n: tree.runtime(n)[G] for n in "ABCD"}
    assert rt == {"A": 25, "B": 15, "C": 25, "D": 35}


def test_request_is_limited_by_max_before_it_is_passed_up() -> None:
    tree = QuotaTree(
        [spec("P", lo=0, hi=20, is_parent=True), spec("a", parent="P", hi=10), spec("b", parent="P", hi=30)],
        total={G: 100},
    )
    tree.add_request("a", {G: 30})
    tree.add_request("b", {G: 5})
    assert tree.request("a")[G] == 30
    assert tree.request("P")[G] == 15  # min(30, 10) + 5
    assert tree.runtime("P")[G] == 15
    assert tree.runtime("a")[G] == 10
    assert tree.runtime("b")[G] == 5


def test_parent_max_caps_the_subtree() -> None:
    tree = QuotaTree(
        [spec("P", hi=12, is_parent=True), spec("a", parent="P"), spec("b", parent="P")], total={G: 100}
    )
    tree.add_request("a", {G: 30})
    tree.add_request("b", {G: 30})
    assert tree.runtime("P")[G] == 12
    assert tree.runtime("a")[G] + tree.runtime("b")[G] == 12


def test_three_levels_runtime_flows_down() -> None:
    tree = QuotaTree(
        [
            spec("org", lo=40, hi=80, is_parent=True),
            spec("team-a", parent="org", lo=20, hi=80),
            spec("team-b", parent="org", lo=20, hi=80),
            spec("other", lo=20, hi=100),
        ],
        total={G: 100},
    )
    tree.add_request("team-a", {G: 70})
    tree.add_request("team-b", {G: 10})
    tree.add_request("other", {G: 60})
    # root: org wants 80 (70 + 10), min 40; other wants 60, min 20; spare 40 by weight 80:100
    assert tree.runtime("org")[G] + tree.runtime("other")[G] == 100
    assert tree.runtime("org")[G] == 40 + 18 and tree.runtime("other")[G] == 20 + 22
    # inside org: team-b gets its 10, team-a its min 20 + the rest (28)
    assert tree.runtime("team-b")[G] == 10
    assert tree.runtime("team-a")[G] == 48


def test_cluster_shrink_scales_mins_down_proportionally() -> None:
    tree = QuotaTree([spec("A", lo=30, hi=100), spec("B", lo=10, hi=100)], total={G: 40})
    tree.add_request("A", {G: 50})
    tree.add_request("B", {G: 50})
    assert tree.min("A")[G] == 30 and tree.runtime("A")[G] + tree.runtime("B")[G] == 40
    tree.set_total({G: 20})  # half the cluster is gone: mins 30/10 -> 15/5
    assert tree.min("A")[G] == 15 and tree.min("B")[G] == 5
    assert tree.runtime("A")[G] == 15 and tree.runtime("B")[G] == 5
    assert tree.status("A").min[G] == 30  # the configured min is unchanged


def test_detached_quota_gets_no_runtime() -> None:
    tree = QuotaTree(
        [spec("orphan", parent="missing"), spec("x", parent="y"), spec("y", parent="x")], total={G: 10}
    )
    tree.add_request("orphan", {G: 5})
    assert not tree.is_attached("orphan") and not tree.is_attached("x")
    assert tree.runtime("orphan")[G] == 0
    assert tree.path("x") == ["x"]


def test_default_quota_exists_and_borrows_leftovers() -> None:
    tree = QuotaTree([spec("team", lo=6, hi=10)], total={G: 10})
    assert DEFAULT_QUOTA in tree
    tree.add_request(DEFAULT_QUOTA, {G: 8})
    tree.add_request("team", {G: 4})
    assert tree.runtime("team")[G] == 4
    assert tree.runtime(DEFAULT_QUOTA)[G] == 6


def test_resources_not_named_are_unlimited_and_weighted_one() -> None:
    tree = QuotaTree(
        [QuotaSpec("a", min={G: 2}, max={G: 4}), QuotaSpec("b", min={G: 2}, max={G: 4})],
        total={G: 8, "cpu": 10_000},
    )
    tree.add_request("a", {"cpu": 8_000})
    tree.add_request("b", {"cpu": 8_000})
    assert tree.runtime("a")["cpu"] == 5_000 and tree.runtime("b")["cpu"] == 5_000


def test_usage_and_requests_survive_replacing_the_quota_set() -> None:
    tree = QuotaTree([spec("a", lo=4, hi=8)], total={G: 8})
    tree.add_request("a", {G: 6})
    tree.add_used("a", {G: 3})
    tree.set_quotas([spec("P", lo=8, is_parent=True), spec("a", parent="P", lo=4, hi=8)])
    assert tree.used("a")[G] == 3 and tree.used("P")[G] == 3 and tree.used(ROOT_QUOTA)[G] == 3
    assert tree.request("P")[G] == 6
    assert tree.path("a") == ["a", "P", ROOT_QUOTA]


def test_refresh_is_lazy_and_counts_versions() -> None:
    tree = QuotaTree([spec("a", lo=1, hi=2)], total={G: 2})
    tree.runtime("a")
    v = tree.version
    tree.runtime("a")
    tree.used("a")
    assert tree.version == v
    tree.add_request("a", {G: 1})
    tree.runtime("a")
    assert tree.version == v + 1


def test_a_quota_that_does_not_lend_passes_its_min_up() -> None:
    # org (min 10) holds keeper (min 5, does not lend, idle) and worker (min 5, wants 3);
    # other wants everything. Koordinator passes only keeper's request (0) up, so org would get
    # 3 and keeper's 5 could not be honoured; gpuyard passes keeper's min up: org holds 8.
    tree = QuotaTree(
        [
            spec("org", lo=10, is_parent=True),
            spec("keeper", parent="org", lo=5, lend=False),
            spec("worker", parent="org", lo=5),
            spec("other", lo=0),
        ],
        total={G: 20},
    )
    tree.add_request("worker", {G: 3})
    tree.add_request("other", {G: 100})
    assert tree.request("keeper")[G] == 0
    assert tree.request("org")[G] == 8
    assert tree.runtime("org")[G] == 8
    assert tree.runtime("keeper")[G] == 5 and tree.runtime("worker")[G] == 3
    assert tree.runtime("other")[G] == 12
