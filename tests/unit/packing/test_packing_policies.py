"""The baseline policies on small hand-made clusters where the right answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from gpuyard.scheduler.placement.packing import (
    POLICIES,
    BestFitPolicy,
    ClusterState,
    PackingPolicy,
    PodRequest,
    UnknownPolicyError,
    fits,
    get_policy,
    select_best,
)


def cluster(*specs: tuple[str, int, int, str]) -> ClusterState:
    """specs: (name, cpu_milli, gpus, model); memory is plentiful."""
    return ClusterState.from_nodes(
        names=[s[0] for s in specs],
        cpu_milli=[s[1] for s in specs],
        memory_mib=[10**6] * len(specs),
        gpus=[s[2] for s in specs],
        models=[s[3] for s in specs],
    )


def share(milli: int, cpu: int = 1000) -> PodRequest:
    return PodRequest(name=f"s{milli}", cpu_milli=cpu, memory_mib=100, num_gpu=1, gpu_milli=milli)


def whole(n: int, cpu: int = 1000) -> PodRequest:
    return PodRequest(name=f"w{n}", cpu_milli=cpu, memory_mib=100, num_gpu=n, gpu_milli=1000)


def test_registry_has_every_policy_and_rejects_unknown_names():
    assert list(POLICIES) == [
        "random",
        "first-fit",
        "dot-product",
        "gpu-clustering",
        "gpu-packing",
        "best-fit",
        "fgd",
        "gpuyard",
    ]
    for name in POLICIES:
        policy = get_policy(name)
        assert isinstance(policy, PackingPolicy) and policy.name == name
    with pytest.raises(UnknownPolicyError, match="unknown packing policy 'tetris'; known: random"):
        get_policy("tetris")


def test_ties_go_to_the_node_whose_name_sorts_first_not_the_first_row():
    s = cluster(("node-c", 8000, 2, "T4"), ("node-a", 8000, 2, "T4"), ("node-b", 8000, 2, "T4"))
    assert s.name_rank.tolist() == [2, 0, 1]
    assert select_best(s, np.array([0, 1, 2]), scores=np.array([5, 5, 5])) == 1
    assert select_best(s, np.array([0, 2]), scores=np.array([5, 5])) == 2
    assert select_best(s, np.array([0, 1, 2]), scores=np.array([7, 5, 5])) == 0
    assert get_policy("first-fit").place(s, whole(1)) == (1, (0,))


def test_place_returns_none_when_nothing_fits():
    s = cluster(("a", 8000, 1, "T4"))
    assert get_policy("best-fit").place(s, whole(2)) is None


def test_best_fit_takes_the_node_left_with_least():
    s = cluster(("a", 64000, 8, "G2"), ("b", 16000, 2, "T4"), ("c", 32000, 4, "V100"))
    s.allocate(2, (0,), share(600))
    s.allocate(2, (1,), share(300))
    # left after a 300m pod (CPU/128 cores, GPU/8 GPUs): a .49/.96, b .12/.21, c .24/.35
    assert BestFitPolicy().place(s, share(300))[0] == 1
    s.allocate(1, (0,), whole(1, cpu=15500))
    # b now has no CPU for it; c is left with less than a
    assert BestFitPolicy().place(s, share(300))[0] == 2


def test_baselines_give_a_shared_pod_the_tightest_gpu_that_fits():
    s = cluster(("c", 32000, 4, "V100"))
    s.allocate(0, (0,), share(600))
    s.allocate(0, (1,), share(300))
    for name in ("best-fit", "dot-product", "gpu-packing", "gpu-clustering"):
        assert get_policy(name).place(s, share(350)) == (0, (0,)), name
        assert get_policy(name).place(s, share(500)) == (0, (1,)), name
        assert get_policy(name).place(s, share(800)) == (0, (2,)), name


def test_first_fit_takes_first_node_and_first_gpu_that_fit():
    s = cluster(("a", 8000, 2, "T4"), ("b", 8000, 2, "T4"))
    s.allocate(0, (0,), share(800))
    assert get_policy("first-fit").place(s, share(500)) == (0, (1,))
    assert get_policy("first-fit").place(s, share(150)) == (0, (0,))
    assert get_policy("first-fit").place(s, whole(2)) == (1, (0, 1))


def test_dot_product_prefers_the_node_with_least_free_in_the_pod_direction():
    s = cluster(("a", 128000, 8, "G2"), ("b", 16000, 2, "T4"))
    node, _ = get_policy("dot-product").place(s, whole(1, cpu=8000))
    assert node == 1


def test_gpu_packing_prefers_a_partly_used_gpu_then_a_partly_used_node():
    s = cluster(("a", 64000, 4, "V100"), ("b", 64000, 4, "V100"), ("c", 64000, 4, "V100"))
    s.allocate(1, (2,), share(400))  # b: one shared GPU with 600 left
    s.allocate(2, (0,), whole(1))  # c: used, but no partly used GPU
    assert get_policy("gpu-packing").place(s, share(500)) == (1, (2,))
    # no partly used GPU fits 700m: a fresh GPU on a partly used node (b or c, b by name) beats idle a
    assert get_policy("gpu-packing").place(s, share(700))[0] == 1
    assert get_policy("gpu-packing").place(s, whole(2))[0] == 1


def test_gpu_clustering_groups_pods_of_one_gpu_kind():
    s = cluster(("a", 64000, 4, "V100"), ("b", 64000, 4, "V100"), ("c", 64000, 4, "V100"))
    s.allocate(0, (0,), whole(1))
    s.allocate(2, (0,), share(300))
    assert get_policy("gpu-clustering").place(s, share(200))[0] == 2
    assert get_policy("gpu-clustering").place(s, whole(1))[0] == 0
    assert get_policy("gpu-clustering").place(s, whole(2))[0] == 1  # idle beats other kinds


def test_random_is_reproducible_per_seed_and_spreads():
    s = cluster(*[(f"n{i:02d}", 8000, 2, "T4") for i in range(20)])
    picks = [get_policy("random", seed=seed).place(s, share(100))[0] for seed in range(10)]
    again = [get_policy("random", seed=seed).place(s, share(100))[0] for seed in range(10)]
    assert picks == again
    assert len(set(picks)) > 3


def test_gpu_model_constraint_is_respected_by_every_policy():
    s = cluster(("a", 8000, 2, "T4"), ("b", 8000, 2, "V100"))
    pod = PodRequest(
        name="v", cpu_milli=1000, memory_mib=10, num_gpu=1, gpu_milli=500, allowed_models=s.model_ids("V100")
    )
    for name in POLICIES:
        policy = get_policy(name)
        policy.prepare([pod, share(500)])
        assert policy.place(s, pod)[0] == 1, name
    assert fits(s, pod).tolist() == [False, True]
