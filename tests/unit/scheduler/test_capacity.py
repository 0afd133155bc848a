"""`capacity.ever_fits`: can a gang ever fit on this cluster, were it empty, and why not (typed)."""

from __future__ import annotations

from gpuyard.apis.core import Node
from gpuyard.apis.resourceclasses import default_class
from gpuyard.scheduler.gangs.requests import ANNOTATION_TOPOLOGY_REQUIRED
from gpuyard.scheduler.placement.capacity import (
    DomainShort,
    GPUTotalShort,
    PartShort,
    ever_fits,
    gpu_totals_short,
)
from gpuyard.scheduler.placement.profiles import build_profile
from tests.unit.scheduler.helpers import gang_of, make_node, podgroup, role, snap
from tests.unit.scheduler.test_placing import used


def block(name: str, node: str, gpus: int = 8) -> Node:
    return make_node(node, gpus=gpus, labels={"topology.gpuyard.io/block": name})


def test_a_gang_that_fits_an_empty_cluster_has_no_reasons_even_when_the_cluster_is_full() -> None:
    s = snap([make_node("a", gpus=8), make_node("b", gpus=8)])
    used(s, "x", "a", 8)
    used(s, "y", "b", 8)
    verdict = ever_fits(s, gang_of(s, podgroup("j", role(replicas=2, gpus=8))))
    assert not verdict.never and verdict.reasons == () and verdict.describe() == ""


def test_whole_gpus_beyond_the_clusters_count_of_the_class() -> None:
    s = snap([make_node("a", gpus=8, model="a100"), make_node("b", gpus=8, model="v100")])
    gang = gang_of(
        s, podgroup("j", role(gpus=8, resource="nvidia.a100"), role("PS", gpus=8, resource="nvidia.a100"))
    )
    # each part alone fits on node a; together they ask 16 of the cluster's 8 A100s
    assert gpu_totals_short(s, gang) == [GPUTotalShort("nvidia.a100", 16, 8)]
    verdict = ever_fits(s, gang)
    assert verdict.reasons == (GPUTotalShort("nvidia.a100", 16, 8),)
    assert verdict.describe() == "asks 16 nvidia.a100, the cluster has 8"
    # any GPU: the cluster's 16 are enough for 2 x 8, not for 3 x 8
    assert not ever_fits(s, gang_of(s, podgroup("k", role(replicas=2, gpus=8)))).never
    three = ever_fits(s, gang_of(s, podgroup("k", role(replicas=3, gpus=8))))
    assert GPUTotalShort(None, 24, 16) in three.reasons


def test_a_gpu_class_no_node_has_is_a_part_no_node_may_run() -> None:
    s = snap([make_node("a", gpus=8, model="v100")], classes=[default_class("v100"), default_class("a100")])
    verdict = ever_fits(s, gang_of(s, podgroup("j", role(gpus=1, resource="nvidia.a100"))))
    (reason,) = verdict.reasons
    assert isinstance(reason, PartShort) and reason.nodes == 0 and reason.could_hold == 0
    assert reason.describe() == (
        "Worker needs 1 pod of 1 GPU of class nvidia.a100, 1 CPU, 1Gi memory; no node may run it "
        "(node selector, affinity, taints, GPU class or node state)"
    )
    assert gpu_totals_short(s, gang_of(s, podgroup("j", role(gpus=1, resource="nvidia.a100")))) == []


def test_a_pod_larger_than_any_node() -> None:
    s = snap([make_node("a", gpus=8, cpu="64"), make_node("b", gpus=4, cpu="32")])
    gpus = ever_fits(s, gang_of(s, podgroup("j", role(gpus=9))))
    (reason,) = gpus.reasons
    assert isinstance(reason, PartShort) and reason.shape.gpus == 9
    assert (reason.role, reason.required, reason.nodes, reason.could_hold) == ("Worker", 1, 2, 0)
    assert reason.largest == (("GPUs", 8), ("CPU", 64000), ("memory", 524288))
    assert gpus.describe() == (
        "Worker needs 1 pod of 9 GPUs, 1 CPU, 1Gi memory; the 2 nodes that may run it could hold 0 "
        "even empty (the largest: 8 GPUs, 64 CPU, 524288Mi memory)"
    )
    cpu = ever_fits(s, gang_of(s, podgroup("j", role(replicas=2, gpus=1, cpu="48"))))
    (reason,) = cpu.reasons
    assert isinstance(reason, PartShort) and reason.could_hold == 1 and reason.required == 2
    assert "Worker needs 2 pods of 1 GPU, 48 CPU, 1Gi memory placed together" in cpu.describe()
    # a node selector narrows the nodes that may run it: b alone cannot hold 8 GPUs
    pinned = ever_fits(
        s, gang_of(s, podgroup("j", role(gpus=8, node_selector={"kubernetes.io/hostname": "b"})))
    )
    (reason,) = pinned.reasons
    assert isinstance(reason, PartShort) and reason.nodes == 1 and reason.largest[0] == ("GPUs", 4)


def test_a_required_topology_domain_that_no_block_can_hold() -> None:
    s = snap([block("x", "x1"), block("x", "x2"), block("y", "y1"), make_node("free", gpus=8)])
    three = podgroup("j", role(replicas=3, gpus=8))
    three.metadata.annotations[ANNOTATION_TOPOLOGY_REQUIRED] = "block"
    verdict = ever_fits(s, gang_of(s, three))
    assert verdict.reasons == (DomainShort("block", 2, (("Worker", 3, 2),)),)
    assert verdict.describe() == (
        "topology-required block: none of the 2 blocks could hold the gang even empty "
        "(the most one block could hold: Worker 2 of 3 pods)"
    )
    two = podgroup("k", role(replicas=2, gpus=8))
    two.metadata.annotations[ANNOTATION_TOPOLOGY_REQUIRED] = "block"
    assert not ever_fits(s, gang_of(s, two)).never
    # without the requirement the 4 nodes hold 3 x 8 GPUs
    assert not ever_fits(s, gang_of(s, podgroup("m", role(replicas=3, gpus=8)))).never
    # a spine none of the nodes names
    spine = podgroup("n", role(gpus=1))
    spine.metadata.annotations[ANNOTATION_TOPOLOGY_REQUIRED] = "spine"
    assert ever_fits(s, gang_of(s, spine)).reasons == (DomainShort("spine", 0),)


def test_every_part_must_fit_in_the_same_domain() -> None:
    # the A100 part fits only in block x, the V100 part only in block y
    s = snap(
        [
            make_node("x1", gpus=8, model="a100", labels={"topology.gpuyard.io/block": "x"}),
            make_node("y1", gpus=8, model="v100", labels={"topology.gpuyard.io/block": "y"}),
        ]
    )
    pg = podgroup("j", role(gpus=8, resource="nvidia.a100"), role("PS", gpus=8, resource="nvidia.v100"))
    assert not ever_fits(s, gang_of(s, pg)).never
    pg.metadata.annotations[ANNOTATION_TOPOLOGY_REQUIRED] = "block"
    (reason,) = ever_fits(s, gang_of(s, pg)).reasons
    assert reason == DomainShort("block", 2, (("Worker", 1, 1), ("PS", 1, 1)))


def test_the_profiles_static_filters_decide_which_nodes_may_run_a_part() -> None:
    s = snap([make_node("a", gpus=8), make_node("b", gpus=8, ready=False)])
    gang = gang_of(s, podgroup("j", role(replicas=2, gpus=8)))
    with_default = ever_fits(s, gang, build_profile("default"))
    assert with_default == ever_fits(s, gang)  # the built-in filters without a profile
    (reason,) = with_default.reasons
    assert isinstance(reason, PartShort) and reason.nodes == 1 and reason.could_hold == 1
