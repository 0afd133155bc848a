"""ResourceClass: definitions, matching GPUs by properties, and the checks at submit time."""

from __future__ import annotations

import pytest

from gpuyard.apis.core import PodSpec
from gpuyard.apis.devicematching import gpu_devices, model_key
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.quantity import parse_quantity
from gpuyard.apis.resourceclasses import (
    ResourceClass,
    default_class,
    default_class_name,
    parse_gpu_request,
    validate_gang_request,
    validate_resource_class,
)
from gpuyard.scheduler.gangs.outcomes import Placement, Unschedulable
from tests.unit.scheduler.helpers import make_node, place_one, podgroup, role, snap


def rclass(name: str, *exprs: dict, labels: dict | None = None) -> ResourceClass:
    return ResourceClass.model_validate(
        {
            "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": labels or {}, "matchExpressions": list(exprs)}},
        }
    )


K80 = rclass("nvidia.tesla.k80", {"key": "product", "operator": "In", "values": ["Tesla-K80"]})
P100 = rclass("nvidia.tesla.p100", labels={"model": "p100"})
BIG = rclass("big-memory", {"key": "memory", "operator": "Gt", "values": ["10Gi"]})
HUGE = rclass("huge-memory", {"key": "memory", "operator": "Gt", "values": ["40Gi"]})


@pytest.mark.parametrize(
    ("spec", "field", "reason"),
    [
        (
            {"key": "model", "operator": "Like", "values": ["v100"]},
            "operator",
            "unknown operator 'Like'; allowed: In, NotIn, Exists, DoesNotExist, Gt, Lt",
        ),
        ({"key": "memory", "operator": "Gt", "values": ["lots"]}, "", "'lots' is not a number"),
        ({"key": "memory", "operator": "Lt", "values": ["1", "2"]}, "", "needs exactly one value"),
        ({"key": "model", "operator": "In", "values": []}, "", "needs at least one value"),
        ({"key": "model", "operator": "Exists", "values": ["x"]}, "", "takes no values"),
    ],
)
def test_bad_class_definitions_name_the_field(spec, field, reason):
    problems = validate_resource_class(
        {"metadata": {"name": "c"}, "spec": {"selector": {"matchExpressions": [spec]}}}
    )
    assert len(problems) == 1
    path, why = problems[0]
    assert path.startswith("spec.selector.matchExpressions[0]")
    assert path.endswith(field)
    assert reason in why


def test_unknown_field_and_bad_name_are_reported():
    problems = validate_resource_class({"metadata": {"name": "c"}, "spec": {"selectr": {}}})
    assert problems == [("spec.selectr", "unknown field")]
    assert validate_resource_class({"metadata": {"name": "Bad_Name"}, "spec": {}})[0].field == "metadata.name"
    assert validate_resource_class(K80) == []


def test_memory_gt_compares_numbers_with_units():
    m = BIG.matcher()
    assert m.matches({"memory": "16384Mi"})
    assert m.matches({"memory": "32Gi"})
    assert not m.matches({"memory": "10Gi"})  # not greater
    assert not m.matches({"memory": "8192Mi"})
    assert not m.matches({"memory": "plenty"})  # not a number: no match
    assert not m.matches({})
    lt = rclass("small", {"key": "memory", "operator": "Lt", "values": ["16Gi"]}).matcher()
    assert lt.matches({"memory": "12288Mi"}) and not lt.matches({"memory": "16Gi"})


def test_other_operators():
    m = rclass(
        "c",
        {"key": "model", "operator": "NotIn", "values": ["k80"]},
        {"key": "topology.gpuyard.io/block", "operator": "Exists"},
        {"key": "legacy", "operator": "DoesNotExist"},
    ).matcher()
    assert m.matches({"model": "v100", "topology.gpuyard.io/block": "a"})
    assert not m.matches({"model": "k80", "topology.gpuyard.io/block": "a"})
    assert not m.matches({"model": "v100"})
    assert not m.matches({"model": "v100", "topology.gpuyard.io/block": "a", "legacy": ""})


def test_device_properties_from_labels_and_health_annotation():
    node = make_node("n", gpus=4, model="v100", labels={"topology.gpuyard.io/block": "b1"})
    node.metadata.annotations["gpuyard.io/unhealthy-gpus"] = "1, 3"
    devices = gpu_devices(node)
    assert [d.uuid for d in devices] == ["GPU-n-0", "GPU-n-1", "GPU-n-2", "GPU-n-3"]
    assert [d.healthy for d in devices] == [True, False, True, False]
    props = devices[2].properties()
    assert (
        props["model"] == "v100"
        and props["product"] == "Tesla-V100-SXM2-32GB"
        and props["memory"] == "32768Mi"
    )
    assert (
        props["vendor"] == "nvidia" and props["index"] == "2" and props["topology.gpuyard.io/block"] == "b1"
    )


def test_device_properties_from_node_topology():
    node = make_node("n", gpus=2, model="a100")
    topo = NodeTopology.model_validate(
        {
            "metadata": {"name": "n"},
            "spec": {
                "gpus": [
                    {"index": 0, "uuid": "GPU-aaaa", "model": "NVIDIA A100-SXM4-40GB", "memoryMib": 40960},
                    {
                        "index": 1,
                        "uuid": "GPU-bbbb",
                        "model": "NVIDIA A100-SXM4-40GB",
                        "memoryMib": 40960,
                        "health": "Unhealthy",
                    },
                ]
            },
        }
    )
    devices = gpu_devices(node, topo)
    assert [d.uuid for d in devices] == ["GPU-aaaa", "GPU-bbbb"]
    assert [d.healthy for d in devices] == [True, False]
    assert devices[0].memory_mib == 40960 and devices[0].model == "a100"
    assert HUGE.matcher().matches(devices[0].properties()) is False
    assert BIG.matcher().matches(devices[0].properties())


def test_model_keys_and_default_classes():
    assert model_key("Tesla-K80") == "k80"
    assert model_key("NVIDIA-H100-80GB-HBM3") == "h100"
    assert model_key("Tesla V100-SXM2-16GB") == "v100"
    assert default_class_name("v100") == "nvidia.v100"
    assert default_class_name("A100 40GB") == "nvidia.a100-40gb"
    c = default_class("t4")
    assert (
        c.metadata.name == "nvidia.t4"
        and c.matcher().matches({"model": "t4"})
        and not c.matcher().matches({"model": "k80"})
    )


def test_parse_gpu_request_splits_classes_and_extended_resources():
    classes = {"nvidia.tesla.k80": K80}
    req = parse_gpu_request(
        {
            "cpu": parse_quantity("500m"),
            "memory": parse_quantity("1Gi"),
            "nvidia.tesla.k80": parse_quantity(2),
            "rdma/hca": parse_quantity(1),
        },
        classes,
    )
    assert (req.cpu_milli, req.memory, req.gpus, req.gpu_class, req.other) == (
        500,
        2**30,
        2,
        "nvidia.tesla.k80",
        (("rdma/hca", 1000),),
    )
    plain = parse_gpu_request({"nvidia.com/gpu": parse_quantity(1)}, classes)
    assert (plain.gpus, plain.gpu_class) == (1, None)


# --- the K80 / P100 example (two nodes) -------------------------------------------------------


def k80_p100_cluster():
    return snap(
        [make_node("k80-node", gpus=4, model="k80"), make_node("p100-node", gpus=4, model="p100")],
        classes=[K80, P100, BIG],
    )


@pytest.mark.parametrize(
    ("resource", "node"), [("nvidia.tesla.k80", "k80-node"), ("nvidia.tesla.p100", "p100-node")]
)
def test_a_class_request_lands_only_on_matching_gpus(resource, node):
    s = k80_p100_cluster()
    result = place_one(s, podgroup("j", role(replicas=2, gpus=2, resource=resource)))
    assert isinstance(result, Placement)
    assert {p.node for p in result.pods} == {node}
    assert sorted(g for p in result.pods for g in p.gpus) == [0, 1, 2, 3]
    assert result.pods[0].gpu_ids == (f"GPU-{node}-0", f"GPU-{node}-1")


def test_memory_gt_10gi_uses_both_models_but_not_more_than_exist():
    s = k80_p100_cluster()  # K80 12Gi and P100 16Gi: both are "big-memory"
    ok = place_one(s, podgroup("j", role(replicas=2, gpus=4, resource="big-memory")))
    assert isinstance(ok, Placement) and {p.node for p in ok.pods} == {"k80-node", "p100-node"}
    too_many = place_one(s, podgroup("j", role(replicas=3, gpus=4, resource="big-memory")))
    assert isinstance(too_many, Unschedulable)


def test_a_class_no_gpu_matches_cannot_be_placed_and_says_so():
    s = snap([make_node("k80-node", gpus=4, model="k80")], classes=[K80, HUGE])
    result = place_one(s, podgroup("j", role(gpus=1, resource="huge-memory")))
    assert isinstance(result, Unschedulable)
    assert (
        result.message
        == "Worker: 1 pod of 1 GPU of class huge-memory, 1 CPU, 1Gi memory; 0/1 nodes can take one: 1 node has no GPUs of class huge-memory."
    )


# --- submit-time validation -------------------------------------------------------------------

NODES = [make_node("a", gpus=8, model="v100"), make_node("b", gpus=4, model="k80", cpu="16")]
CLASSES = [default_class("v100"), default_class("k80"), K80]


def spec(**limits) -> PodSpec:
    return PodSpec.model_validate({"containers": [{"name": "main", "resources": {"limits": limits}}]})


def test_validation_passes_a_sane_request():
    assert validate_gang_request(podgroup("j", role(replicas=4, gpus=8)), CLASSES, NODES) == []
    assert validate_gang_request(spec(**{"nvidia.k80": 4, "cpu": "16"}), CLASSES, NODES) == []


def test_validation_names_the_field_of_too_large_a_request():
    problems = validate_gang_request(podgroup("j", role(gpus=16)), CLASSES, NODES)
    assert problems == [
        (
            "spec.roles[0].template.containers[0].resources.limits.nvidia.com/gpu",
            "requests 16 nvidia.com/gpu per pod; the largest node has 8",
        )
    ]
    problems = validate_gang_request(spec(**{"nvidia.k80": 6}), CLASSES, NODES)
    assert (
        problems[0].reason == "requests 6 nvidia.k80 per pod; the largest node has 4 GPUs of class nvidia.k80"
    )
    problems = validate_gang_request(spec(cpu="100"), CLASSES, NODES)
    assert problems[0].reason == "requests 100 cpu per pod; the largest node has 64"
    problems = validate_gang_request(spec(**{"example.com/fpga": 1}), CLASSES, NODES)
    assert problems[0].reason == "requests 1 example.com/fpga per pod; no node offers example.com/fpga"


def test_validation_catches_unknown_classes_and_odd_gpu_counts():
    unknown = validate_gang_request(
        {"spec.tfReplicaSpecs.Worker.template.spec": spec(**{"nvidia.tesla.a800": 1})}, CLASSES, NODES
    )
    assert (
        unknown[0].field
        == "spec.tfReplicaSpecs.Worker.template.spec.containers[0].resources.limits.nvidia.tesla.a800"
    )
    assert unknown[0].reason.startswith(
        "unknown resource class 'nvidia.tesla.a800'; known classes: nvidia.k80, nvidia.tesla.k80, nvidia.v100"
    )
    half = validate_gang_request(spec(**{"nvidia.com/gpu": "0.5"}), CLASSES, NODES)
    assert "whole number" in half[0].reason
    mixed = validate_gang_request(spec(**{"nvidia.com/gpu": 1, "nvidia.k80": 1}), CLASSES, NODES)
    assert "GPUs of one kind" in mixed[0].reason
    assert mixed[0].get("field") == mixed[0].field  # reads like the API's detail dict


def test_validation_skips_capacity_checks_without_nodes_and_reads_a_store():
    assert validate_gang_request(spec(**{"nvidia.com/gpu": 64}), CLASSES, []) == []

    class FakeStore:
        def kinds(self):
            return ["Node", "ResourceClass"]

        def list(self, kind):
            return {"Node": NODES, "ResourceClass": CLASSES}[kind]

    assert validate_gang_request(spec(**{"nvidia.com/gpu": 9}), store=FakeStore())[0].reason.endswith(
        "the largest node has 8"
    )


def test_validation_against_a_store_lists_its_nodes_once_until_a_node_is_written():
    from gpuyard.apis.core import Node
    from gpuyard.apis.resourceclasses import ResourceClass
    from gpuyard.state.store import Store

    class CountingStore(Store):
        node_lists = 0

        def list(self, kind, **kw):
            self.node_lists += kind == "Node"
            return super().list(kind, **kw)

    store = CountingStore()
    store.register(Node)
    store.register(ResourceClass)
    for node in NODES:
        store.create(node.model_copy(deep=True))
    too_big = spec(**{"nvidia.com/gpu": 9})
    for _ in range(3):
        assert validate_gang_request(too_big, store=store)[0].reason.endswith("the largest node has 8")
    assert store.node_lists == 1
    store.create(make_node("c", gpus=16, model="v100"))  # a bigger node joins: checked again
    assert validate_gang_request(too_big, store=store) == []
    assert store.node_lists == 2
    other = Store()
    other.register(Node)
    assert validate_gang_request(too_big, store=other) == []  # another store: no nodes, no capacity check


def test_example_class_files_are_valid():
    import glob

    import yaml

    files = sorted(glob.glob("configs/resourceclasses/*.yaml"))
    assert len(files) >= 3
    for path in files:
        with open(path) as fh:
            assert validate_resource_class(yaml.safe_load(fh)) == [], path


def test_default_classes_of_present_models_are_accepted_before_they_are_stored():
    assert validate_gang_request(spec(**{"nvidia.v100": 8}), [], NODES) == []
    problems = validate_gang_request(spec(**{"nvidia.h100": 1}), [], NODES)
    assert (
        problems[0].reason == "unknown resource class 'nvidia.h100'; known classes: nvidia.k80, nvidia.v100"
    )
    stored = make_node("s", gpus=2, model="t4")
    stored.metadata.resource_version = "7"
    assert validate_gang_request(spec(**{"nvidia.t4": 2}), [], [stored]) == []
    assert validate_gang_request(spec(**{"nvidia.t4": 3}), [], [stored])[0].reason.endswith(
        "the largest node has 2 GPUs of class nvidia.t4"
    )


def test_gpu_share_resources_are_not_node_resources_at_submit():
    """`gpuyard.io/gpu-milli` & co. ask for part of a GPU: accepted at submit, not 'no node offers'."""
    assert validate_gang_request(spec(**{"gpuyard.io/gpu-milli": 300, "cpu": "2"}), CLASSES, NODES) == []
    assert (
        validate_gang_request(
            spec(**{"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory-ratio": 50}), CLASSES, NODES
        )
        == []
    )
