"""The rescheduler's pure planner: fragmentation detection and the cheapest moves."""

from __future__ import annotations

import pytest

from gpuyard.scheduler.rescheduling.plans import (
    Mover,
    MoverPod,
    NodeRoom,
    Waiting,
    blocked_by_fragmentation,
    migration_cost,
    plan_defrag,
)


def scattered(n: int = 8, *, costs: list[float] | None = None) -> tuple[list[NodeRoom], list[Mover]]:
    """`n` 8-GPU nodes, each with one 1-GPU job on GPU 0 (the issue's example)."""
    costs = costs or [float(i + 1) for i in range(n)]
    nodes = [NodeRoom(f"node-{i}", tuple(range(1, 8)), 8, cpu_free=10_000, mem_free=10_000) for i in range(n)]
    movers = [
        Mover(("default", f"small-{i}"), (MoverPod(f"small-{i}-worker-0", f"node-{i}", (0,)),), costs[i])
        for i in range(n)
    ]
    return nodes, movers


def test_cost_is_gpus_times_time_since_last_checkpoint() -> None:
    assert migration_cost(gpus=2, runtime_s=3600) == pytest.approx(2.0)
    assert migration_cost(gpus=2, runtime_s=3600 + 900, checkpoint_interval_s=1800) == pytest.approx(0.5)
    assert migration_cost(gpus=4, runtime_s=-5) == 0.0


def test_eight_scattered_one_gpu_jobs_free_a_node_by_moving_the_cheapest() -> None:
    nodes, movers = scattered(costs=[5, 4, 0.5, 3, 6, 7, 8, 9])
    big = Waiting(("default", "big"), gpus=8)
    assert blocked_by_fragmentation(big, nodes)
    plan = plan_defrag(big, nodes, movers)
    assert plan is not None
    assert plan.targets == ["node-2"] and plan.movers == [("default", "small-2")]
    (move,) = plan.moves
    assert (move.from_node, move.from_gpus) == ("node-2", (0,))
    assert move.to_node != "node-2" and move.cost == 0.5


def test_not_blocked_when_it_fits_or_when_capacity_is_short() -> None:
    nodes, movers = scattered()
    assert plan_defrag(Waiting(("d", "w"), gpus=7), nodes, movers) is None  # 7 free on every node
    full = [NodeRoom(f"n{i}", (), 8) for i in range(2)]
    assert not blocked_by_fragmentation(Waiting(("d", "w"), gpus=8), full)
    assert not blocked_by_fragmentation(Waiting(("d", "w"), gpus=1), nodes)


def test_unmovable_jobs_and_limits() -> None:
    nodes = [
        NodeRoom("a", (4, 5, 6, 7), 8, cpu_free=100, mem_free=100),
        NodeRoom("b", (2, 3, 4, 5, 6, 7), 8, cpu_free=100, mem_free=100),
    ]
    # node a: two 2-GPU jobs; node b: one 2-GPU job; an 8-GPU job waits (10 GPUs free in all)
    movers = [
        Mover(("d", "a1"), (MoverPod("a1-w-0", "a", (0, 1)),), 1.0),
        Mover(("d", "a2"), (MoverPod("a2-w-0", "a", (2, 3)),), 1.0),
        Mover(("d", "b1"), (MoverPod("b1-w-0", "b", (0, 1)),), 1.5),
    ]
    big = Waiting(("d", "big"), gpus=8)
    plan = plan_defrag(big, nodes, movers)
    assert plan is not None and plan.targets == ["b"] and plan.movers == [("d", "b1")]
    assert plan.moves[0].to_node == "a"
    # b1 may not move: both of node a's jobs must, and b has room for them
    plan = plan_defrag(big, nodes, movers[:2])
    assert plan is not None and plan.targets == ["a"] and sorted(plan.movers) == [("d", "a1"), ("d", "a2")]
    assert plan_defrag(big, nodes, movers[:2], max_movers=1) is None


def test_several_pods_get_several_targets_and_destinations_are_not_targets() -> None:
    nodes, movers = scattered(4)
    plan = plan_defrag(Waiting(("d", "gang"), gpus=8, pods=2), nodes, movers)
    assert plan is not None and len(plan.targets) == 2
    assert not {m.to_node for m in plan.moves} & set(plan.targets)
    assert len(plan.movers) == 2 and plan.cost <= 1 + 3  # each target frees one of the cheaper nodes


def test_destination_needs_cpu_and_memory() -> None:
    nodes = [
        NodeRoom("a", tuple(range(1, 8)), 8, cpu_free=0, mem_free=0),
        NodeRoom("b", tuple(range(1, 8)), 8),
    ]
    movers = [
        Mover(("d", "x"), (MoverPod("x-0", "a", (0,), cpu=1000, mem=10),), 1.0),
        Mover(("d", "y"), (MoverPod("y-0", "b", (0,), cpu=1000, mem=10),), 1.0),
    ]
    assert plan_defrag(Waiting(("d", "big"), gpus=8), nodes, movers) is None  # no room for either elsewhere
