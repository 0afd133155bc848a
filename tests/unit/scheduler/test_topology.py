"""The topology plugins in `place()`: NVLink subsets, RDMA NICs, partitions, domains, flexible splits."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.scheduling import PodGroup, Reservation, ReservationSpec
from gpuyard.devices.presets import DGX1_NVLINKS, get_preset
from gpuyard.devices.subsets import mask_of
from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.gangs.outcomes import Placement, Unschedulable
from tests.unit.scheduler.helpers import assume_into, make_node, place_one, podgroup, role, snap

MODEL = {"dgx1-v100": "v100", "dgx-a100": "a100", "hgx-h100": "h100"}
QUADS = {(0, 1, 2, 3), (4, 5, 6, 7)}
NV2_PAIRS = {pair for pair, links in DGX1_NVLINKS.items() if links == 2}


def cluster(preset: str, count: int = 1, *, labels: dict[str, str] | None = None, **kw: object) -> Snapshot:
    nodes, topos = [], {}
    for i in range(count):
        name = f"{preset}-{i}"
        extra = dict(labels or {})
        node = make_node(name, model=MODEL[preset], labels=extra)
        node.status.allocatable["rdma/hca"] = Decimal(8)
        nodes.append(node)
        topos[name] = get_preset(preset, node_name=name, **kw)  # type: ignore[arg-type]
    s = snap(nodes)
    for node in nodes:
        s.refresh_node(node, topos[node.metadata.name])
    return s


def occupy(s: Snapshot, node: str, gpus: list[int], name: str = "busy") -> None:
    """Hold exactly `gpus` of `node` with a Reservation of another job."""
    res = Reservation(
        metadata=ObjectMeta(name=f"{name}-{node}", namespace="other", resource_version="1"),
        spec=ReservationSpec(
            pod_group=name, role="Worker", index=0, node=node, gpus=sorted(gpus), gpu_milli=1000
        ),
    )
    s.upsert_reservation(res)


def gpus_of(result: Placement | Unschedulable) -> list[tuple[int, ...]]:
    assert isinstance(result, Placement), result
    return [pp.gpus for pp in result.pods]


def test_two_gpus_get_an_nv2_pair_on_dgx1() -> None:
    s = cluster("dgx1-v100")
    [pair] = gpus_of(place_one(s, podgroup("j", role(gpus=2))))
    assert pair in NV2_PAIRS


def test_two_gpus_get_an_nv2_pair_among_scattered_free_gpus() -> None:
    s = cluster("dgx1-v100")
    occupy(s, "dgx1-v100-0", [0, 2, 5, 6])  # free 1, 3, 4, 7: only (4, 7) is NV2
    [pair] = gpus_of(place_one(s, podgroup("j", role(gpus=2))))
    assert pair == (4, 7)


def test_four_gpus_get_a_fully_nvlinked_quad() -> None:
    s = cluster("dgx1-v100")
    [quad] = gpus_of(place_one(s, podgroup("j", role(gpus=4))))
    assert quad in QUADS
    occupy(s, "dgx1-v100-0", [0])
    [quad] = gpus_of(place_one(s, podgroup("k", role(gpus=4))))
    assert quad == (4, 5, 6, 7)


def test_the_node_with_a_free_quad_wins() -> None:
    s = cluster("dgx1-v100", 2)
    occupy(s, "dgx1-v100-0", [0, 5, 2, 7], "a")  # node 0: free 1, 3, 4, 6 (no quad)
    occupy(s, "dgx1-v100-1", [0, 1, 2, 3], "b")  # node 1: free quad 4-7
    result = place_one(s, podgroup("j", role(gpus=4)))
    assert isinstance(result, Placement)
    assert result.pods[0].node == "dgx1-v100-1" and result.pods[0].gpus == (4, 5, 6, 7)


def test_rdma_nics_under_the_gpus_switches_on_dgx_a100() -> None:
    s = cluster("dgx-a100")
    result = place_one(s, podgroup("j", role(gpus=2, extra={"rdma/hca": 1})))
    assert isinstance(result, Placement)
    pp = result.pods[0]
    topo = s.topologies[0]
    switches = {topo.spec.gpus[g].pcie_switch for g in pp.gpus}
    assert pp.nics and {topo.nic(n).pcie_switch for n in pp.nics} <= switches


def test_joint_allocate_same_pcie_and_nics_already_held() -> None:
    s = cluster("dgx1-v100")
    ann = {
        "gpuyard.io/device-joint-allocate": json.dumps(
            {"deviceTypes": ["gpu", "rdma"], "requiredScope": "SamePCIe"}
        )
    }

    def job(name: str, gpus: int) -> PodGroup:
        pg = podgroup(name, role(gpus=gpus))
        pg.metadata.annotations.update(ann)
        return pg

    first = place_one(s, job("a", 4))
    assert isinstance(first, Placement)
    topo = s.topologies[0]
    pp = first.pods[0]
    assert pp.gpus in QUADS and len(pp.nics) == 2
    assert {topo.nic(n).pcie_switch for n in pp.nics} == {topo.spec.gpus[g].pcie_switch for g in pp.gpus}
    assume_into(s, first)
    second = place_one(s, job("b", 4))
    assert isinstance(second, Placement)
    assert not set(second.pods[0].nics) & set(pp.nics)
    assume_into(s, second)
    # every NIC is held now: a third SamePCIe job cannot get one even with free GPUs
    s2 = cluster("dgx1-v100")
    held = place_one(s2, job("a", 8))
    assume_into(s2, held)  # type: ignore[arg-type]
    assert isinstance(held, Placement) and len(held.pods[0].nics) == 4


def test_impossible_required_scope_is_unschedulable_with_that_reason() -> None:
    s = cluster("dgx1-v100")
    pg = podgroup("hog", role(gpus=1))
    pg.metadata.annotations["gpuyard.io/device-joint-allocate"] = json.dumps(
        {"deviceTypes": ["gpu", "rdma"], "requiredScope": "SamePCIe"}
    )
    first = place_one(s, pg)
    assert isinstance(first, Placement)
    assume_into(s, first)
    # take the other three NICs with three more one-GPU SamePCIe jobs, each on another switch
    for name in ("b", "c", "d"):
        more = pg.model_copy(deep=True)
        more.metadata.name = name
        got = place_one(s, more)
        assert isinstance(got, Placement)
        assume_into(s, got)
    late = pg.model_copy(deep=True)
    late.metadata.name = "late"
    result = place_one(s, late)
    assert isinstance(result, Unschedulable)
    assert "requiredScope SamePCIe" in result.full_message()
    plain = place_one(s, podgroup("plain", role(gpus=1)))
    assert isinstance(plain, Placement)  # never a silent downgrade, but others still fit


def test_bad_joint_allocate_annotation_is_a_request_error() -> None:
    from gpuyard.apis.resourceclasses import RequestError
    from tests.unit.scheduler.helpers import gang_of

    s = cluster("dgx1-v100")
    pg = podgroup("j", role(gpus=1))
    pg.metadata.annotations["gpuyard.io/device-joint-allocate"] = (
        '{"deviceTypes":["gpu","rdma"],"requiredScope":"SameRack"}'
    )
    with pytest.raises(RequestError, match="SamePCIe, SameNUMA, None"):
        gang_of(s, pg)


@pytest.mark.parametrize("policy", ["Honor", "Prefer"])
def test_h100_partitions(policy: str) -> None:
    s = cluster("hgx-h100", labels={"gpuyard.io/gpu-partition-policy": policy}, partition_policy=None)
    assert s.topologies[0].spec.partition_policy == policy  # the label overrides the topology
    occupy(s, "hgx-h100-0", [0, 2, 4, 6])  # no allowed pair is free
    result = place_one(s, podgroup("j", role(gpus=2)))
    if policy == "Honor":
        assert isinstance(result, Unschedulable)
        assert "partition policy Honor" in result.full_message()
    else:
        assert isinstance(result, Placement) and len(result.pods[0].gpus) == 2


def test_h100_honor_takes_allowed_pairs() -> None:
    s = cluster("hgx-h100")
    occupy(s, "hgx-h100-0", [1])
    [pair] = gpus_of(place_one(s, podgroup("j", role(gpus=2))))
    assert pair in {(2, 3), (4, 5), (6, 7)}
    three = place_one(s, podgroup("k", role(gpus=3)))
    assert isinstance(three, Unschedulable)


def test_unhealthy_gpus_are_never_chosen() -> None:
    s = cluster("dgx1-v100", unhealthy=[0])
    [quad] = gpus_of(place_one(s, podgroup("j", role(gpus=4))))
    assert 0 not in quad and quad == (4, 5, 6, 7)


def _scattered(per_node: list[int]) -> Snapshot:
    s = cluster("dgx-a100", len(per_node))
    for i, free in enumerate(per_node):
        busy = list(range(free, 8))
        if busy:
            occupy(s, f"dgx-a100-{i}", busy, f"busy{i}")
    return s


def test_flexible_split_seven_plus_one() -> None:
    s = _scattered([7, 1, 4, 4])  # 16 free GPUs, no node with 8
    pg = podgroup("ddp", role(gpus=1, replicas=8), job_kind="PyTorchJob")
    result = place_one(s, pg)
    assert isinstance(result, Placement)
    counts = {}
    for pp in result.pods:
        counts[pp.node] = counts.get(pp.node, 0) + 1
    assert sorted(counts.values()) == [1, 7]
    peers = result.local_peers()
    on_big = [pp for pp in result.pods if counts[pp.node] == 7]
    assert all(len(peers[pp.pod.name]) == 6 for pp in on_big)
    assert len({g for pp in on_big for g in pp.gpus}) == 7


def test_rigid_two_by_four_explains_the_flexible_split() -> None:
    s = _scattered([3, 5, 0, 0])
    result = place_one(s, podgroup("rigid", role(gpus=4, replicas=2)))
    assert isinstance(result, Unschedulable)
    assert "would fit now as 3+5" in result.full_message()


def test_required_block_is_honoured() -> None:
    s = Snapshot.build(nodes=[])
    nodes = [
        make_node("a0", labels={"topology.gpuyard.io/block": "a"}),
        make_node("b0", labels={"topology.gpuyard.io/block": "b"}),
        make_node("b1", labels={"topology.gpuyard.io/block": "b"}),
    ]
    s = snap(nodes)
    pg = podgroup("j", role(gpus=8, replicas=2))
    pg.metadata.annotations["gpuyard.io/topology-required"] = "block"
    result = place_one(s, pg)
    assert isinstance(result, Placement) and set(result.nodes) == {"b0", "b1"}
    s2 = snap(nodes[:2])
    result = place_one(s2, pg)
    assert isinstance(result, Unschedulable)
    assert "topology-required block: no single block has room" in result.full_message()
    free = place_one(s2, podgroup("free", role(gpus=8, replicas=2)))
    assert isinstance(free, Placement)  # the same shape without the requirement still fits


def test_gang_prefers_one_node_then_fewest_in_a_block() -> None:
    nodes = [
        make_node("a0", labels={"topology.gpuyard.io/block": "a"}),
        make_node("b0", labels={"topology.gpuyard.io/block": "b"}),
        make_node("b1", labels={"topology.gpuyard.io/block": "b"}),
    ]
    s = snap(nodes)
    one = place_one(s, podgroup("one", role(gpus=2, replicas=4)))
    assert isinstance(one, Placement) and len(one.nodes) == 1


def test_scores_have_no_opinion_without_topologies() -> None:
    s = snap([make_node("n0"), make_node("n1")])
    result = place_one(s, podgroup("j", role(gpus=4)))
    assert isinstance(result, Placement) and result.pods[0].gpus == (0, 1, 2, 3)
    assert mask_of(result.pods[0].gpus) == 0b1111


def test_topology_frag_keeps_the_whole_node_whole() -> None:
    """`topology-frag` scores what the pod takes from a node's future GPU sets, not what is left:
    one GPU from a partly used node, not from the lowest, fully free node (which would lose its
    8-, 4- and 2-GPU sets)."""
    s = cluster("dgx1-v100", 3)
    occupy(s, "dgx1-v100-1", [0, 1, 2, 3, 4, 5])
    occupy(s, "dgx1-v100-2", [0, 1, 2, 3])
    weights = {"first-fit": 0, "topology-frag": 1}
    alone = place_one(s, podgroup("j", role(gpus=1)), profile="first-fit", weights=weights)
    assert isinstance(alone, Placement) and alone.nodes != ["dgx1-v100-0"]
    default = place_one(s, podgroup("k", role(gpus=1)))
    assert isinstance(default, Placement) and default.nodes != ["dgx1-v100-0"]
