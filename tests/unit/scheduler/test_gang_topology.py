"""Gang-level topology: a gang of one-GPU pods is placed like one pod of all their GPUs.

The commonest distributed-training shape (DDP/Horovod/TF workers, one GPU each, often beside a
Master or a CPU-only PS/launcher) must land on one node's best NVLink set when one node can take
it, and fall back to part-by-part placement only when no node can.
"""

from __future__ import annotations

import pytest

from gpuyard.scheduler.gangs.outcomes import Placement
from tests.unit.scheduler.helpers import place_one, podgroup, role
from tests.unit.scheduler.test_topology import QUADS, cluster, occupy

PROFILES = ["default", "binpack"]


def nodes_and_gpus(result: object) -> tuple[set[str], set[int]]:
    assert isinstance(result, Placement), result
    gpu_pods = [pp for pp in result.pods if pp.gpus]
    return {pp.node for pp in gpu_pods}, {g for pp in gpu_pods for g in pp.gpus}


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("count", [1, 2])
def test_master_and_three_workers_of_one_gpu_take_one_nvlinked_quad(profile: str, count: int) -> None:
    s = cluster("dgx1-v100", count)
    gang = podgroup("ddp", role("Master", 1, gpus=1), role("Worker", 3, gpus=1))
    nodes, gpus = nodes_and_gpus(place_one(s, gang, profile=profile))
    assert len(nodes) == 1
    assert tuple(sorted(gpus)) in QUADS


@pytest.mark.parametrize("profile", PROFILES)
def test_eight_one_gpu_workers_fill_one_node(profile: str) -> None:
    s = cluster("dgx1-v100", 2)
    nodes, gpus = nodes_and_gpus(place_one(s, podgroup("w8", role("Worker", 8, gpus=1)), profile=profile))
    assert len(nodes) == 1
    assert gpus == set(range(8))


@pytest.mark.parametrize("profile", PROFILES)
def test_cpu_only_roles_do_not_pull_the_gpu_pods_apart(profile: str) -> None:
    s = cluster("dgx1-v100", 2)
    gang = podgroup("tf", role("PS", 2, gpus=0), role("Worker", 4, gpus=1))
    result = place_one(s, gang, profile=profile)
    nodes, gpus = nodes_and_gpus(result)
    assert len(nodes) == 1
    assert tuple(sorted(gpus)) in QUADS
    assert isinstance(result, Placement)
    assert sum(1 for pp in result.pods if not pp.gpus) == 2  # the PS pods are placed too


def test_mpi_launcher_and_workers() -> None:
    s = cluster("dgx1-v100", 2)
    gang = podgroup("mpi", role("Launcher", 1, gpus=0), role("Worker", 2, gpus=1))
    nodes, gpus = nodes_and_gpus(place_one(s, gang))
    assert len(nodes) == 1
    assert len(gpus) == 2


def test_a_gang_avoids_a_node_whose_free_gpus_are_scattered() -> None:
    s = cluster("dgx1-v100", 2)
    occupy(s, "dgx1-v100-0", [1, 2, 4, 7])  # free: 0, 3, 5, 6 — no NVLinked quad left there
    gang = podgroup("ddp", role("Master", 1, gpus=1), role("Worker", 3, gpus=1))
    nodes, gpus = nodes_and_gpus(place_one(s, gang))
    assert nodes == {"dgx1-v100-1"}
    assert tuple(sorted(gpus)) in QUADS


def test_a_gang_larger_than_any_node_still_places_every_pod() -> None:
    s = cluster("dgx1-v100", 2)
    gang = podgroup("big", role("Master", 1, gpus=1), role("Worker", 8, gpus=1))
    result = place_one(s, gang)
    assert isinstance(result, Placement)
    assert len(result.pods) == 9
    per_gpu = [(pp.node, g) for pp in result.pods for g in pp.gpus]
    assert len(per_gpu) == len(set(per_gpu)) == 9


def test_pods_of_one_gang_never_share_a_gpu_on_one_node() -> None:
    s = cluster("dgx1-v100", 1)
    gang = podgroup("ddp", role("Master", 1, gpus=2), role("Worker", 3, gpus=2))
    result = place_one(s, gang)
    assert isinstance(result, Placement)
    taken = [g for pp in result.pods for g in pp.gpus]
    assert sorted(taken) == list(range(8))


def test_a_gang_that_cannot_be_placed_leaves_nothing_allocated() -> None:
    s = cluster("dgx1-v100", 1)
    free_before = s.gpu_whole_free.copy()
    gang = podgroup("big", role("Master", 1, gpus=1), role("Worker", 8, gpus=1))
    place_one(s, gang)
    assert (s.gpu_whole_free == free_before).all()
