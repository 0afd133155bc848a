"""`place()` on plain data: gang semantics, scores, filters, ports, failover, explanations."""

from __future__ import annotations

import numpy as np
import pytest

from gpuyard.apis.core import Taint
from gpuyard.scheduler.gangs.outcomes import Placement, Unschedulable
from gpuyard.scheduler.gangs.requests import GangRequest, PodShape, PodSlot, RolePart
from gpuyard.scheduler.placement.framework import ProfileSpec
from gpuyard.scheduler.placement.placing import place
from gpuyard.scheduler.placement.profiles import build_profile, builtin_registry
from tests.unit.scheduler.helpers import assume_into, gang_of, make_node, place_one, podgroup, role, snap

ARRAYS = (
    "cpu_free",
    "mem_free",
    "pods_free",
    "gpu_free_milli",
    "gpu_whole_free",
    "ports_used_count",
    "port_cursor",
)


def state_of(s):
    return {k: getattr(s, k).copy() for k in ARRAYS} | {"ports": [dict(p) for p in s.ports_used]}


def same_state(a, b) -> bool:
    return all(np.array_equal(a[k], b[k]) for k in ARRAYS) and a["ports"] == b["ports"]


def nodes_of(result: Placement) -> dict[str, str]:
    return {p.pod.name: p.node for p in result.pods}


def used(s, pg_name: str, node: str, gpus: int) -> None:
    """Occupy `gpus` GPUs of `node` with a one-pod job (through a real placement)."""
    pg = podgroup(
        pg_name, role(gpus=gpus, cpu=None, memory=None, node_selector={"kubernetes.io/hostname": node})
    )
    result = place_one(s, pg)
    assert isinstance(result, Placement), result
    assume_into(s, result)


# --- gang semantics ---------------------------------------------------------------------------


def test_a_gang_that_does_not_fit_takes_nothing():
    s = snap([make_node("a", gpus=8), make_node("b", gpus=8)])
    before = state_of(s)
    result = place_one(s, podgroup("j", role(replicas=3, gpus=8)))
    assert isinstance(result, Unschedulable)
    assert result.needed == 3 and result.fits == 2 and result.most_on_one_node == 1
    assert same_state(before, state_of(s))  # place() is pure


def test_a_gang_that_fits_is_placed_whole_on_the_fewest_nodes():
    s = snap([make_node(n, gpus=8) for n in "abc"])
    result = place_one(s, podgroup("j", role(replicas=4, gpus=2)))
    assert isinstance(result, Placement) and len(result.pods) == 4
    assert len(result.nodes) == 1
    assert sorted(g for p in result.pods for g in p.gpus) == list(range(8))
    peers = result.local_peers()
    assert peers["j-worker-0"] == ["j-worker-1", "j-worker-2", "j-worker-3"]


def test_role_min_available_places_the_minimum_and_defers_the_rest():
    s = snap([make_node("a", gpus=8)])
    result = place_one(s, podgroup("j", role(replicas=5, gpus=2, min_available=2)))
    assert isinstance(result, Placement)
    assert [p.pod.index for p in result.pods] == [0, 1, 2, 3]
    assert [p.index for p in result.deferred] == [4]
    too_big = place_one(s, podgroup("k", role(replicas=6, gpus=4, min_available=3)))
    assert isinstance(too_big, Unschedulable) and too_big.needed == 3


def test_job_min_available_counts_roles_in_order():
    s = snap([make_node("a", gpus=4, cpu="64")])
    pg = podgroup("j", role("PS", 1, cpu="2"), role("Worker", 6, gpus=1), min_available=3)
    gang = gang_of(s, pg)
    assert [(p.role, p.required, len(p.pods)) for p in gang.parts] == [("PS", 1, 1), ("Worker", 2, 6)]
    result = place(s, gang, build_profile())
    assert isinstance(result, Placement)
    assert sorted(p.pod.name for p in result.pods) == [
        "j-ps-0",
        "j-worker-0",
        "j-worker-1",
        "j-worker-2",
        "j-worker-3",
    ]
    assert [p.name for p in result.deferred] == ["j-worker-4", "j-worker-5"]


def test_already_placed_pods_count_toward_the_minimum():
    s = snap([make_node("a", gpus=8), make_node("b", gpus=8)])
    first = place_one(s, podgroup("j", role(replicas=3, gpus=4)))
    assert isinstance(first, Placement)
    assume_into(s, first)
    s.remove_reservation(("default", "j-worker-1"))
    gang = gang_of(s, podgroup("j", role(replicas=3, gpus=4)))
    assert [p.name for p in gang.parts[0].pods] == ["j-worker-1"] and gang.parts[0].required == 1
    assert set(gang.placed) == {"j-worker-0", "j-worker-2"}
    again = place(s, gang, build_profile())
    assert isinstance(again, Placement) and [p.pod.name for p in again.pods] == ["j-worker-1"]


def test_gang_group_is_placed_together_or_not_at_all():
    a = podgroup("a", role(gpus=8), gang_group=["default/b"])
    b = podgroup("b", role(gpus=8), gang_group=["default/a"])
    one = snap([make_node("n1", gpus=8)])
    before = state_of(one)
    result = place_one(one, a, b)
    assert isinstance(result, Unschedulable) and "Worker of b" in result.message
    assert same_state(before, state_of(one))
    two = snap([make_node("n1", gpus=8), make_node("n2", gpus=8)])
    result = place_one(two, a, b)
    assert isinstance(result, Placement)
    assert sorted(nodes_of(result).values()) == ["n1", "n2"]


# --- scores and fills -------------------------------------------------------------------------


def test_binpack_fills_the_most_used_node_and_keeps_free_blocks_whole():
    s = snap([make_node(n, gpus=8) for n in "abc"])
    used(s, "x", "a", 2)
    used(s, "y", "b", 6)
    result = place_one(s, podgroup("j", role(gpus=2)))
    assert nodes_of(result) == {"j-worker-0": "b"}
    assert result.pods[0].gpus == (6, 7)


def test_spread_profile_deals_pods_one_per_node():
    s = snap([make_node(n, gpus=8) for n in "abc"])
    spread = place_one(s, podgroup("j", role(replicas=3, gpus=1)), profile="spread")
    assert sorted(nodes_of(spread).values()) == ["a", "b", "c"]
    packed = place_one(s, podgroup("j", role(replicas=3, gpus=1)), profile="binpack")
    assert len(set(nodes_of(packed).values())) == 1


def test_exact_fit_prefers_the_node_left_with_no_idle_gpus():
    s = snap([make_node(n, gpus=8) for n in "abc"])
    used(s, "x", "a", 2)  # a: 6 free
    used(s, "y", "b", 4)  # b: 4 free
    result = place_one(s, podgroup("j", role(gpus=4)))
    assert nodes_of(result) == {"j-worker-0": "b"}


def test_cpu_only_pods_prefer_cpu_nodes_and_spread():
    s = snap([make_node("g1", gpus=8), make_node("c1", gpus=0), make_node("c2", gpus=0)])
    result = place_one(s, podgroup("j", role(replicas=2, cpu="4")))
    assert sorted(nodes_of(result).values()) == ["c1", "c2"]


def test_cpu_only_pods_leave_gpu_nodes_a_reserve():
    s = snap([make_node("g1", gpus=8, cpu="64")])
    assert isinstance(place_one(s, podgroup("j", role(cpu="32"))), Placement)  # half is free for CPU pods
    result = place_one(s, podgroup("j", role(cpu="40")))
    assert isinstance(result, Unschedulable)
    assert "keeps its remaining CPU/memory for GPU pods" in result.message
    off = place_one(
        s, podgroup("j", role(cpu="40")), args={"gpu-node-reserve": {"cpu_fraction": 0, "memory_fraction": 0}}
    )
    assert isinstance(off, Placement)


def test_gpu_type_preference_follows_preferred_node_affinity():
    s = snap([make_node("v", gpus=8, model="v100"), make_node("a", gpus=8, model="a100")])
    prefer = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "preference": {"matchExpressions": [{"key": "gpuyard.io/gpu-model", "operator": "In", "values": ["a100"]}]}}
    ]}}  # fmt: skip
    result = place_one(s, podgroup("j", role(gpus=1, affinity=prefer)))
    assert nodes_of(result) == {"j-worker-0": "a"}


def test_first_fit_and_seeded_random_profiles():
    s = snap([make_node(n, gpus=8) for n in "abcd"])
    assert nodes_of(place_one(s, podgroup("j", role(gpus=1)), profile="first-fit")) == {"j-worker-0": "a"}
    runs = {
        tuple(nodes_of(place_one(s, podgroup("j", role(gpus=1)), profile="random", seed=3)).values())
        for _ in range(3)
    }
    assert len(runs) == 1


def test_weights_from_config_change_the_decision():
    s = snap([make_node(n, gpus=8) for n in "ab"])
    used(s, "x", "a", 4)
    assert nodes_of(place_one(s, podgroup("j", role(gpus=1)), profile="binpack")) == {"j-worker-0": "a"}
    spread = place_one(
        s,
        podgroup("j", role(gpus=1)),
        profile="binpack",
        weights={"most-allocated": 0, "least-allocated": 10},
    )
    assert nodes_of(spread) == {"j-worker-0": "b"}
    with pytest.raises(ValueError, match="unknown score plugin 'nope'"):
        build_profile(weights={"nope": 1})
    with pytest.raises(ValueError, match="unknown scheduler profile"):
        build_profile("fastest")


def test_a_multi_node_gang_stays_in_one_block_when_one_can_hold_it():
    nodes = [
        make_node(f"{blk}-{i}", gpus=8, labels={"topology.gpuyard.io/block": blk})
        for blk in ("x", "y")
        for i in range(3)
    ]
    s = snap(nodes)
    used(s, "u1", "x-0", 4)
    used(s, "u2", "y-0", 6)
    used(s, "u3", "y-1", 6)
    # 20 one-GPU pods: no node holds them; block x (4+8+8) holds them all, block y (2+2+8) does not
    result = place_one(s, podgroup("j", role(replicas=20, gpus=1, cpu=None, memory=None)))
    assert isinstance(result, Placement)
    assert {n.split("-")[0] for n in nodes_of(result).values()} == {"x"}


# --- filters ----------------------------------------------------------------------------------


def test_filters_keep_pods_off_nodes_they_may_not_use():
    nodes = [
        make_node("ok", gpus=8, labels={"pool": "train"}),
        make_node("wrong-pool", gpus=8, labels={"pool": "serve"}),
        make_node("not-ready", gpus=8, labels={"pool": "train"}, ready=False),
        make_node(
            "tainted",
            gpus=8,
            labels={"pool": "train"},
            taints=[Taint(key="dedicated", value="x", effect="NoSchedule")],
        ),
        make_node("cordoned", gpus=8, labels={"pool": "train"}),
        make_node("broken", gpus=8, labels={"pool": "train"}),
    ]
    nodes[4].spec.unschedulable = True
    nodes[5].metadata.annotations["gpuyard.io/unhealthy-gpus"] = "0,1,2,3,4,5,6"
    s = snap(nodes)
    result = place_one(s, podgroup("j", role(replicas=8, gpus=1, node_selector={"pool": "train"})))
    assert isinstance(result, Placement) and set(nodes_of(result).values()) == {"ok"}
    failing = place_one(s, podgroup("j", role(replicas=10, gpus=1, node_selector={"pool": "train"})))
    assert isinstance(failing, Unschedulable)
    counts = {f.name: f.failed for f in failing.filters}
    assert counts == {"node-ready": 1, "node-unschedulable": 1, "node-affinity": 1, "taint-toleration": 1}
    assert failing.fits == 9  # "broken" still has one healthy GPU: 8 + 1
    tolerant = place_one(
        s,
        podgroup("j", role(replicas=16, gpus=1, tolerations=[{"key": "dedicated", "operator": "Exists"}], affinity={
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["train"]}]}]}}})),
    )  # fmt: skip
    assert isinstance(tolerant, Placement) and set(nodes_of(tolerant).values()) == {"ok", "tainted"}


def test_unhealthy_gpus_are_never_chosen():
    node = make_node("a", gpus=4)
    node.metadata.annotations["gpuyard.io/unhealthy-gpus"] = "0,2"
    s = snap([node])
    result = place_one(s, podgroup("j", role(gpus=2)))
    assert result.pods[0].gpus == (1, 3)
    assert isinstance(place_one(s, podgroup("j", role(gpus=3))), Unschedulable)


def test_extended_resources_are_counted():
    node = make_node("a", gpus=8)
    node.status.allocatable["rdma/hca"] = node.status.allocatable["pods"].__class__(2)
    s = snap([node, make_node("b", gpus=8)])
    result = place_one(s, podgroup("j", role(replicas=2, gpus=1, extra={"rdma/hca": 1})))
    assert set(nodes_of(result).values()) == {"a"}
    assert isinstance(
        place_one(s, podgroup("j", role(replicas=3, gpus=1, extra={"rdma/hca": 1}))), Unschedulable
    )


# --- host ports and failover ------------------------------------------------------------------


def test_host_ports_are_unique_per_node_and_a_replaced_pod_gets_a_new_one():
    s = snap([make_node("a", gpus=8)], port_range=(20000, 20009))
    first = place_one(s, podgroup("j", role(replicas=3, gpus=1, host_ports=2)))
    ports = [p.host_ports for p in first.pods]
    assert ports == [(20000, 20001), (20002, 20003), (20004, 20005)]
    assume_into(s, first)
    s.remove_reservation(("default", "j-worker-1"))  # the pod failed: its ports are free again
    again = place_one(s, podgroup("j", role(replicas=3, gpus=1, host_ports=2)))
    assert [p.pod.name for p in again.pods] == ["j-worker-1"]
    assert again.pods[0].host_ports == (20006, 20007)  # not the ports it had
    assume_into(s, again)
    other = place_one(s, podgroup("k", role(replicas=2, gpus=1, host_ports=1)))
    assert [p.host_ports for p in other.pods] == [(20008,), (20009,)]
    assume_into(s, other)
    full = place_one(s, podgroup("m", role(replicas=3, gpus=1, host_ports=1)))
    assert isinstance(full, Unschedulable)
    assert "at most 2 of 3 fit now on 1 node (the most on one node: 2, limited by host-ports)" in full.message


def test_failover_prefers_the_previous_node_then_its_block():
    nodes = [
        make_node(f"{blk}-{i}", gpus=8, labels={"topology.gpuyard.io/block": blk})
        for blk in ("x", "y")
        for i in range(2)
    ]
    s = snap(nodes)
    used(s, "u", "x-0", 6)  # binpack alone would pick x-0
    pg = podgroup("j", role(replicas=1, gpus=2), preferredNodes={"j-worker-0": "y-1"})
    assert nodes_of(place_one(s, pg)) == {"j-worker-0": "y-1"}
    used(s, "v", "y-1", 8)  # the old node is full now: stay in its block
    assert nodes_of(place_one(s, pg)) == {"j-worker-0": "y-0"}


# --- GPU shares (the engine supports them; the GPU-sharing issue adds the request syntax) ------


def test_gpu_shares_stack_on_one_gpu_best_fit():
    s = snap([make_node("a", gpus=2)])
    shape = PodShape(cpu_milli=100, gpus=1, gpu_milli=300)
    pods = tuple(PodSlot("default", "j", "Worker", i, f"j-worker-{i}") for i in range(3))
    gang = GangRequest(
        ("default", "j"), (("default", "j"),), [RolePart("default", "j", "Worker", shape, pods, 3)]
    )
    result = place(s, gang, build_profile("binpack"))
    assert isinstance(result, Placement)
    assert [p.gpus for p in result.pods] == [(0,), (0,), (0,)] and all(
        p.gpu_milli == 300 for p in result.pods
    )
    assume_into(s, result)
    assert s.gpu_free_milli[0, :2].tolist() == [100, 1000] and s.gpu_whole_free[0] == 1


def test_default_profile_stacks_shares_until_a_fragment_would_be_stranded():
    # FGD (the default's packing policy) against a workload of 300m shares: a third share on GPU 0
    # would leave 100m that no such share can use, so it opens GPU 1 instead
    s = snap([make_node("a", gpus=2)])
    shape = PodShape(cpu_milli=100, gpus=1, gpu_milli=300)
    pods = tuple(PodSlot("default", "j", "Worker", i, f"j-worker-{i}") for i in range(3))
    gang = GangRequest(
        ("default", "j"), (("default", "j"),), [RolePart("default", "j", "Worker", shape, pods, 3)]
    )
    result = place(s, gang, build_profile())
    assert isinstance(result, Placement)
    assert [p.gpus for p in result.pods] == [(0,), (0,), (1,)]


# --- explanations and hooks -------------------------------------------------------------------


def test_explanation_says_what_is_missing():
    nodes = [make_node(f"v{i}", gpus=8, model="v100") for i in range(3)] + [
        make_node("k", gpus=8, model="k80")
    ]
    nodes.append(make_node("down", gpus=8, model="v100", ready=False))
    s = snap(nodes)
    used(s, "a", "v0", 5)
    used(s, "b", "v1", 5)
    used(s, "c", "v2", 6)
    result = place_one(
        s, podgroup("j", role(replicas=2, gpus=4, resource="nvidia.v100", cpu="8", memory=None))
    )
    assert isinstance(result, Unschedulable)
    assert result.message == (
        "Worker: 2 pods of 4 GPUs of class nvidia.v100, 8 CPU must be placed together; 0/5 nodes can take one: "
        "1 node is not ready; 1 node has no GPUs of class nvidia.v100; "
        "0/5 nodes have 4 free GPUs of class nvidia.v100 in one node; 2 nodes have 3."
    )
    partial = place_one(s, podgroup("j", role(replicas=4, gpus=1, resource="nvidia.v100")))
    assert isinstance(partial, Unschedulable) is False
    big = place_one(s, podgroup("j", role(replicas=9, gpus=1, resource="nvidia.v100")))
    assert (
        "at most 8 of 9 fit now on 3 nodes (the most on one node: 3, limited by node-resources)"
        in big.message
    )


def test_a_gpu_chooser_that_refuses_a_node_sends_the_pods_elsewhere():
    from gpuyard.scheduler.placement.choosing import LowestIndexChooser

    class NotOnA(LowestIndexChooser):
        name = "not-on-a"

        def choose(self, snapshot, row, shape, *, within=None):
            return None if snapshot.names[row] == "a" else super().choose(snapshot, row, shape, within=within)

    reg = builtin_registry()
    reg.register_chooser("not-on-a", lambda args: NotOnA())
    reg.register_profile("test-not-on-a", ProfileSpec(scores={"gpu-binpack": 1}, chooser="not-on-a"))
    s = snap([make_node("a", gpus=8), make_node("b", gpus=8)])
    used(s, "x", "a", 4)  # binpack would choose a
    one = place_one(s, podgroup("j", role(gpus=1)), profile="test-not-on-a", registry=reg)
    assert nodes_of(one) == {"j-worker-0": "b"}
    gang = place_one(s, podgroup("j", role(replicas=3, gpus=2)), profile="test-not-on-a", registry=reg)
    assert set(nodes_of(gang).values()) == {"b"}
    too_many = place_one(s, podgroup("j", role(replicas=5, gpus=2)), profile="test-not-on-a", registry=reg)
    assert isinstance(too_many, Unschedulable)


def test_a_score_plugin_may_normalise_its_own_scores():
    class Inverted:
        name = "test-inverted"

        def score(self, state, shape, nodes, take):
            return np.arange(state.snapshot.n, dtype=np.float64)[nodes]

        def normalize(self, raw, *, valid=None):
            return -raw  # prefers the first node although the raw score says the last

    reg = builtin_registry()
    reg.register_score("test-inverted", lambda args: Inverted())
    reg.register_profile("test-inverted", ProfileSpec(scores={"test-inverted": 1}))
    s = snap([make_node(n, gpus=8) for n in "abc"])
    placed = place_one(s, podgroup("j", role(gpus=1)), profile="test-inverted", registry=reg)
    assert nodes_of(placed) == {"j-worker-0": "a"}


def test_explanation_blames_the_gangs_own_pods_not_none_free():
    # the Master takes the node's 8 GPUs in the trial; the node is not "none free", the gang holds it
    s = snap([make_node("a", gpus=8, model="a100")])
    result = place_one(
        s,
        podgroup(
            "j",
            role("Master", 1, gpus=8, resource="nvidia.a100"),
            role("Worker", 1, gpus=8, resource="nvidia.a100"),
        ),
    )
    assert isinstance(result, Unschedulable)
    assert "none free" not in result.message
    assert "1 node has 8 free but the gang's earlier pods take them" in result.message


def test_explanation_says_a_gang_larger_than_the_cluster_can_never_fit():
    s = snap([make_node("a", gpus=8, model="a100")])
    result = place_one(s, podgroup("j", role(replicas=4, gpus=8, resource="nvidia.a100")))
    assert isinstance(result, Unschedulable)
    assert result.message.startswith("can never fit: asks 32 nvidia.a100, the cluster has 8; Worker: ")
    fits = place_one(s, podgroup("k", role(replicas=1, gpus=8, resource="nvidia.a100")))
    assert isinstance(fits, Placement)
    used(s, "x", "a", 8)
    busy = place_one(s, podgroup("m", role(replicas=1, gpus=8, resource="nvidia.a100")))
    assert isinstance(busy, Unschedulable) and "can never fit" not in busy.message
