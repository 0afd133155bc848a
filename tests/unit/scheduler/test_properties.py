"""Property tests of `place()`: nothing over-allocated, gangs whole or not at all, filters obeyed."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpuyard.apis.core import Taint
from gpuyard.apis.devicematching import gpu_devices
from gpuyard.apis.quantity import to_int, to_milli
from gpuyard.apis.resourceclasses import ResourceClass, default_class
from gpuyard.scheduler.gangs.outcomes import Placement, Unschedulable
from gpuyard.scheduler.placement.placing import place
from gpuyard.scheduler.placement.profiles import build_profile
from tests.unit.scheduler.helpers import assume_into, gang_of, make_node, podgroup, role, snap
from tests.unit.scheduler.test_placing import same_state, state_of

MODELS = ["v100", "k80", "a100"]
BIG = ResourceClass.model_validate(
    {
        "metadata": {"name": "big"},
        "spec": {"selector": {"matchExpressions": [{"key": "memory", "operator": "Gt", "values": ["20Gi"]}]}},
    }
)
CLASSES = [default_class(m) for m in MODELS] + [BIG]


@st.composite
def clusters(draw):
    nodes = []
    for i in range(draw(st.integers(1, 7))):
        gpus = draw(st.sampled_from([0, 1, 2, 4, 8]))
        node = make_node(
            f"n{i}",
            gpus=gpus,
            model=draw(st.sampled_from(MODELS)),
            cpu=str(draw(st.integers(2, 32))),
            memory=f"{draw(st.integers(4, 64))}Gi",
            labels={"pool": draw(st.sampled_from(["a", "b"])), "topology.gpuyard.io/block": f"b{i % 2}"},
            taints=[Taint(key="special", value="yes", effect="NoSchedule")]
            if draw(st.integers(0, 5)) == 0
            else [],
            ready=draw(st.integers(0, 7)) > 0,
        )
        node.spec.unschedulable = draw(st.integers(0, 9)) == 0
        if gpus and draw(st.booleans()):
            broken = draw(st.lists(st.integers(0, gpus - 1), max_size=2, unique=True))
            node.metadata.annotations["gpuyard.io/unhealthy-gpus"] = ",".join(map(str, broken))
        nodes.append(node)
    return nodes


@st.composite
def roles(draw, index: int):
    replicas = draw(st.integers(0, 5))
    return role(
        f"R{index}",
        replicas,
        gpus=draw(st.sampled_from([0, 0, 1, 2, 4])),
        resource=draw(st.sampled_from(["nvidia.com/gpu", "nvidia.com/gpu", "nvidia.v100", "big"])),
        cpu=draw(st.sampled_from([None, "500m", "1", "4"])),
        memory=draw(st.sampled_from([None, "512Mi", "2Gi", "8Gi"])),
        min_available=draw(st.one_of(st.none(), st.integers(0, replicas))),
        host_ports=draw(st.sampled_from([0, 0, 1, 3])),
        node_selector={"pool": "a"} if draw(st.integers(0, 3)) == 0 else None,
        tolerations=[{"key": "special", "operator": "Exists"}] if draw(st.booleans()) else None,
    )


@st.composite
def jobs(draw, name: str):
    n_roles = draw(st.integers(1, 3))
    extra = {}
    if draw(st.integers(0, 3)) == 0:
        extra["minAvailable"] = draw(st.integers(0, 6))
    return podgroup(name, *[draw(roles(i)) for i in range(n_roles)], **extra)


def check_ledger(s, nodes, reservations) -> None:
    """Recompute every node's use from the reservations alone and compare with its capacity."""
    by_name = {n.metadata.name: n for n in nodes}
    cpu, mem, pods = defaultdict(int), defaultdict(int), defaultdict(int)
    gpu_milli: dict[tuple[str, int], int] = defaultdict(int)
    ports: dict[str, list[int]] = defaultdict(list)
    for r in reservations:
        spec = r.spec
        node = spec.node
        cpu[node] += to_milli(spec.requests.get("cpu", Decimal(0)))
        mem[node] += to_int(spec.requests.get("memory", Decimal(0)))
        pods[node] += 1
        for g in spec.gpus:
            gpu_milli[(node, g)] += spec.gpu_milli
        ports[node].extend(spec.host_ports)
    for name, node in by_name.items():
        alloc = node.status.allocatable
        assert cpu[name] <= to_milli(alloc["cpu"]), f"CPU over-allocated on {name}"
        assert mem[name] <= to_int(alloc["memory"]), f"memory over-allocated on {name}"
        assert pods[name] <= to_int(alloc["pods"])
        assert len(ports[name]) == len(set(ports[name])), f"host port used twice on {name}"
        assert all(s.port_lo <= p <= s.port_hi for p in ports[name])
    for (name, g), milli in gpu_milli.items():
        assert milli <= 1000, f"GPU {g} of {name} over-allocated"
        assert g < len(gpu_devices(by_name[name]))


def check_placement(result: Placement, gang, nodes) -> None:
    by_name = {n.metadata.name: n for n in nodes}
    classes = {c.metadata.name: c.matcher() for c in CLASSES}
    placed_names = [p.pod.name for p in result.pods]
    assert len(placed_names) == len(set(placed_names))
    for part in gang.parts:
        names = {p.name for p in part.pods}
        got = [p for p in result.pods if p.pod.name in names]
        assert len(got) >= part.required, f"{part.role}: {len(got)} placed, {part.required} required"
        assert {p.name for p in part.pods[: part.required]} <= {p.pod.name for p in got}
    for p in result.pods:
        node = by_name[p.node]
        shape = p.shape
        assert node.ready and not node.spec.unschedulable
        for key, value in shape.constraints.node_selector:
            assert node.metadata.labels.get(key) == value
        for taint in node.spec.taints:
            assert any(t[0] == taint.key for t in shape.constraints.tolerations)
        assert len(p.gpus) == shape.gpus and len(set(p.gpus)) == len(p.gpus)
        assert len(p.host_ports) == shape.host_ports
        devices = gpu_devices(node)
        for g in p.gpus:
            assert devices[g].healthy, f"unhealthy GPU {g} of {p.node} chosen"
            if shape.gpu_class:
                assert classes[shape.gpu_class].matches(devices[g].properties())
            assert p.gpu_ids[p.gpus.index(g)] == devices[g].uuid


@settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(
    nodes=clusters(),
    batch=st.lists(st.tuples(st.booleans()), min_size=1, max_size=4),
    profile=st.sampled_from(["default", "binpack", "spread", "first-fit", "random"]),
    data=st.data(),
)
def test_place_never_over_allocates_and_is_all_or_nothing(nodes, batch, profile, data):
    s = snap(nodes, classes=CLASSES, port_range=(20000, 20007))
    prof = build_profile(profile, seed=1)
    ledger = []
    for i, (grouped,) in enumerate(batch):
        pgs = [data.draw(jobs(f"j{i}"))]
        if grouped:
            pgs.append(data.draw(jobs(f"j{i}b")))
        gang = gang_of(s, *pgs)
        before = state_of(s)
        result = place(s, gang, prof)
        assert same_state(before, state_of(s)), "place() changed the snapshot"
        if isinstance(result, Unschedulable):
            assert result.message
            event("unschedulable")
            continue
        event("placed" if not result.deferred else "placed, some deferred")
        check_placement(result, gang, nodes)
        ledger.extend(assume_into(s, result))
        check_ledger(s, nodes, ledger)
