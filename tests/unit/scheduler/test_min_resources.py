"""minResources in the scheduler core: Volcano's enqueue gate on the cluster's free capacity."""

from __future__ import annotations

from gpuyard.scheduler.decisions import PlaceGang
from tests.unit.scheduler.helpers import make_node, podgroup, role
from tests.unit.scheduler.test_core import Cluster, core, of, step


def placed(decisions: list) -> list[tuple[str, str]]:
    return [g.key for g in of(PlaceGang, decisions)]


def busy() -> Cluster:
    """One 8-GPU node with 6 GPUs taken by `big`."""
    return Cluster(make_node("n1", gpus=8), podgroup("big", role(gpus=6)))


def test_a_gang_waits_until_free_capacity_covers_its_min_resources() -> None:
    cluster = busy()
    state = core(cluster)
    step(state, cluster)
    cluster.put(podgroup("gated", role(gpus=1), minResources={"nvidia.com/gpu": 4, "cpu": "2"}))
    assert placed(step(state, cluster, now=1.0)) == []  # one GPU would fit: minResources holds it back
    status = cluster.get("PodGroup", "default", "gated").status
    assert (status.phase, status.reason) == ("Pending", "MinResources")
    assert "minResources" in status.message and "nvidia.com/gpu 4 > 2 free" in status.message
    assert "cpu" not in status.message  # the CPU part is covered
    # it holds nothing back: a job without minResources behind it starts
    cluster.put(podgroup("small", role(gpus=1)))
    assert placed(step(state, cluster, now=2.0)) == [("default", "small")]
    # once capacity frees up it is tried again and placed
    cluster.delete("PodGroup", "default", "big")
    out = step(state, cluster, now=3.0) + step(state, cluster, now=4.0)
    assert ("default", "gated") in placed(out)


def test_min_resources_the_whole_cluster_lacks_say_so() -> None:
    cluster = Cluster(make_node("n1", gpus=8))
    state = core(cluster)
    cluster.put(podgroup("huge", role(gpus=1), minResources={"nvidia.com/gpu": 16, "example.com/fpga": 1}))
    assert placed(step(state, cluster)) == []
    message = cluster.get("PodGroup", "default", "huge").status.message
    assert message.startswith("minResources can never be covered")
    assert "nvidia.com/gpu 16 > 8 free (8 in the whole cluster)" in message
    assert "example.com/fpga 1 > 0 free" in message


def test_covered_min_resources_change_nothing() -> None:
    cluster = Cluster(make_node("n1", gpus=8))
    state = core(cluster)
    cluster.put(podgroup("ok", role(replicas=2, gpus=2), minResources={"nvidia.com/gpu": 4, "memory": "1Gi"}))
    assert placed(step(state, cluster)) == [("default", "ok")]
