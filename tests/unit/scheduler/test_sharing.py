"""GPU sharing in the live scheduler: request syntax, placement rules, FGD preference, pod env."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuyard.apis.core import Pod
from gpuyard.apis.resourceclasses import RequestError
from gpuyard.apis.scheduling import Reservation, ReservationSpec
from gpuyard.controllers.materializing import _device_env
from gpuyard.scheduler.cache.assuming import reservation_for, share_memory_of
from gpuyard.scheduler.gangs.outcomes import Placement, Unschedulable
from gpuyard.scheduler.gangs.requests import PodShape, parse_share
from tests.unit.scheduler.helpers import gang_of, make_node, place_one, podgroup, role, snap

V100_MIB = 32768  # the v100 preset's memory


def share_role(name: str = "Worker", replicas: int = 1, **share: object) -> dict:
    return role(name, replicas, cpu="1", memory="1Gi", extra=dict(share))


def assume(s, placement: Placement) -> list[Reservation]:
    out = []
    for i, pp in enumerate(placement.pods):
        r = reservation_for(pp, peers=[], gpu_memory_mib=share_memory_of(s, pp))
        r.metadata.resource_version = str(50_000 + s.reservation_count + i)
        s.upsert_reservation(r)
        out.append(r)
    return out


def shape(s, *roles: dict) -> PodShape:
    return gang_of(s, podgroup("p", *roles)).parts[0].shape


# --- request syntax ---------------------------------------------------------------------------


def test_gpuyard_milli_and_memory_mib():
    s = snap([make_node("a", gpus=1)])
    got = shape(s, share_role(**{"gpuyard.io/gpu-milli": 500, "gpuyard.io/gpu-memory-mib": 4096}))
    assert (got.gpus, got.gpu_milli, got.gpu_mem_mib, got.shared) == (1, 500, 4096, True)


def test_milli_alone_gets_the_same_fraction_of_memory():
    s = snap([make_node("a", gpus=1)])
    got = shape(s, share_role(**{"gpuyard.io/gpu-milli": 250}))
    assert (got.gpu_milli, got.gpu_mem_mib, got.gpu_mem_permille) == (250, 0, 250)
    assert s.share_memory(0, got)[0] == V100_MIB // 4


def test_koordinator_core_and_ratio():
    s = snap([make_node("a", gpus=1)])
    got = shape(s, share_role(**{"koordinator.sh/gpu-core": 30, "koordinator.sh/gpu-memory-ratio": 50}))
    assert (got.gpu_milli, got.gpu_mem_permille, got.gpu_mem_mib) == (300, 500, 0)
    assert s.share_memory(0, got)[0] == V100_MIB // 2


def test_koordinator_memory_bytes_round_up_to_mib():
    got = parse_share(
        {"koordinator.sh/gpu-core": Decimal(20), "koordinator.sh/gpu-memory": Decimal(3 * 2**30 + 1)}
    )
    assert (got.milli, got.mem_mib) == (200, 3 * 1024 + 1)


def test_ratio_alone_sets_compute_too():
    got = parse_share({"koordinator.sh/gpu-memory-ratio": Decimal(25)})
    assert (got.milli, got.mem_permille) == (250, 250)


def test_full_share_is_a_whole_gpu():
    s = snap([make_node("a", gpus=1)])
    got = shape(s, share_role(**{"koordinator.sh/gpu-core": 100}))
    assert (got.gpus, got.gpu_milli, got.shared) == (1, 1000, False)


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        ({"koordinator.sh/gpu-core": Decimal(150)}, "koordinator.sh/gpu-core"),
        ({"gpuyard.io/gpu-milli": Decimal("2.5")}, "gpuyard.io/gpu-milli"),
        (
            {"gpuyard.io/gpu-milli": Decimal(5), "koordinator.sh/gpu-core": Decimal(5)},
            "koordinator.sh/gpu-core",
        ),
        ({"gpuyard.io/gpu-memory-mib": Decimal(1024)}, "gpuyard.io/gpu-memory-mib"),
        (
            {
                "gpuyard.io/gpu-milli": Decimal(5),
                "gpuyard.io/gpu-memory-mib": Decimal(5),
                "koordinator.sh/gpu-memory-ratio": Decimal(5),
            },
            "koordinator.sh/gpu-memory-ratio",
        ),
    ],
)
def test_bad_share_requests_name_the_resource(request_, field):
    with pytest.raises(RequestError) as err:
        parse_share(request_)
    assert err.value.resource == field


def test_share_with_several_gpus_is_refused():
    s = snap([make_node("a", gpus=2)])
    with pytest.raises(RequestError, match="one GPU"):
        shape(s, role(gpus=2, extra={"gpuyard.io/gpu-milli": 500}))


def test_share_restricted_to_a_resource_class():
    s = snap([make_node("a", gpus=1, model="t4"), make_node("b", gpus=1, model="v100")])
    pg = podgroup("j", role(gpus=1, resource="nvidia.v100", extra={"gpuyard.io/gpu-milli": 300}))
    assert gang_of(s, pg).parts[0].shape.gpu_class == "nvidia.v100"
    result = place_one(s, pg)
    assert isinstance(result, Placement) and result.pods[0].node == "b"
    assert result.pods[0].gpu_milli == 300


# --- placement --------------------------------------------------------------------------------


def test_memory_limits_how_many_shares_stack():
    s = snap([make_node("a", gpus=2)])
    pg = podgroup(
        "j", share_role(replicas=2, **{"gpuyard.io/gpu-milli": 200, "gpuyard.io/gpu-memory-mib": 20000})
    )
    result = place_one(s, pg)
    assert isinstance(result, Placement)
    assert sorted(p.gpus for p in result.pods) == [(0,), (1,)]  # 2 x 20000 MiB > 32768 MiB
    res = assume(s, result)
    assert {r.spec.gpu_memory_mib for r in res} == {20000}
    assert s.gpu_mem_free[0, :2].tolist() == [V100_MIB - 20000] * 2
    small = PodShape(gpus=1, gpu_milli=100, gpu_mem_mib=13000)
    assert s.share_available(small)[0] == 0 and s.gpu_available(None, 100)[0] == 16
    third = place_one(
        s, podgroup("k", share_role(**{"gpuyard.io/gpu-milli": 100, "gpuyard.io/gpu-memory-mib": 13000}))
    )
    assert isinstance(third, Unschedulable)


def test_whole_gpu_pod_never_joins_shares():
    s = snap([make_node("a", gpus=1)])
    share = place_one(s, podgroup("s", share_role(**{"gpuyard.io/gpu-milli": 100})))
    assert isinstance(share, Placement)
    assume(s, share)
    assert isinstance(place_one(s, podgroup("w", role(gpus=1))), Unschedulable)


def test_share_never_joins_a_whole_gpu_pod():
    s = snap([make_node("a", gpus=1)])
    whole = place_one(s, podgroup("w", role(gpus=1)))
    assert isinstance(whole, Placement)
    assume(s, whole)
    assert s.gpu_mem_free[0, 0] == 0
    assert isinstance(place_one(s, podgroup("s", share_role(**{"gpuyard.io/gpu-milli": 1}))), Unschedulable)


def test_removing_shares_frees_the_gpu_for_whole_pods():
    s = snap([make_node("a", gpus=1)])
    share = place_one(s, podgroup("s", share_role(replicas=2, **{"koordinator.sh/gpu-core": 40})))
    assert isinstance(share, Placement)
    for r in assume(s, share):
        s.remove_reservation((r.metadata.namespace, r.metadata.name))
    assert s.gpu_mem_free[0, 0] == V100_MIB and s.gpu_free_milli[0, 0] == 1000
    assert isinstance(place_one(s, podgroup("w", role(gpus=1))), Placement)


def test_fgd_prefers_the_node_where_fragmentation_grows_least():
    """a: one GPU with a 400m share on it (600 free); b: an idle GPU. Best-fit fills a (900 used,
    100 stranded for every typical pod); FGD keeps a's 600 usable and opens b."""
    nodes = [make_node("a", gpus=1), make_node("b", gpus=1)]
    s = snap(nodes)
    first = place_one(s, podgroup("x", share_role(**{"gpuyard.io/gpu-milli": 400})), profile="best-fit")
    assert isinstance(first, Placement)
    assume(s, first)
    held = first.pods[0].node
    pg = podgroup("j", share_role(**{"gpuyard.io/gpu-milli": 500}))
    best_fit = place_one(s, pg, profile="best-fit")
    fgd = place_one(s, pg)
    assert isinstance(best_fit, Placement) and isinstance(fgd, Placement)
    assert best_fit.pods[0].node == held
    assert fgd.pods[0].node != held


# --- never over-commit (property) -------------------------------------------------------------

_request = st.one_of(
    st.tuples(st.just("whole"), st.integers(1, 2)),
    st.tuples(st.just("milli"), st.integers(1, 999)),
    st.tuples(st.just("core+ratio"), st.tuples(st.integers(1, 99), st.integers(1, 100))),
    st.tuples(st.just("milli+mib"), st.tuples(st.integers(1, 999), st.integers(1, 40000))),
)


def _role_for(kind: str, value) -> dict:
    if kind == "whole":
        return role(gpus=value)
    if kind == "milli":
        return share_role(**{"gpuyard.io/gpu-milli": value})
    if kind == "core+ratio":
        return share_role(
            **{"koordinator.sh/gpu-core": value[0], "koordinator.sh/gpu-memory-ratio": value[1]}
        )
    return share_role(**{"gpuyard.io/gpu-milli": value[0], "gpuyard.io/gpu-memory-mib": value[1]})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(_request, min_size=1, max_size=25), profile=st.sampled_from(["default", "best-fit"]))
def test_shares_never_overcommit_a_gpu(requests, profile):
    s = snap([make_node("a", gpus=2), make_node("b", gpus=1, model="v100-16gb")])
    held: list[Reservation] = []
    for i, (kind, value) in enumerate(requests):
        result = place_one(s, podgroup(f"p{i}", _role_for(kind, value)), profile=profile)
        if isinstance(result, Placement):
            held.extend(assume(s, result))
    milli: dict[tuple[str, int], int] = defaultdict(int)
    mem: dict[tuple[str, int], int] = defaultdict(int)
    kinds: dict[tuple[str, int], set[bool]] = defaultdict(set)
    for r in held:
        for g in r.spec.gpus:
            key = (r.spec.node, g)
            milli[key] += r.spec.gpu_milli
            shared = r.spec.gpu_milli < 1000
            kinds[key].add(shared)
            if shared:
                mem[key] += r.spec.gpu_memory_mib
    for key, total in milli.items():
        row = s.index[key[0]]
        assert total <= 1000, key
        assert mem[key] <= s.gpu_mem_mib[row, key[1]], key
        assert len(kinds[key]) == 1, f"{key} serves whole and shared pods"
        assert s.gpu_free_milli[row, key[1]] == 1000 - total
    assert (s.gpu_mem_free >= 0).all()


# --- pod env ----------------------------------------------------------------------------------


def test_shared_pod_gets_its_share_in_env():
    pod = Pod.model_validate(
        {
            "metadata": {"name": "j-worker-0", "namespace": "default"},
            "spec": {
                "containers": [
                    {"name": "side", "image": "x"},
                    {"name": "main", "image": "y", "resources": {"limits": {"gpuyard.io/gpu-milli": 250}}},
                ]
            },
        }
    )
    res = Reservation.model_validate(
        {
            "metadata": {"name": "j-worker-0", "namespace": "default"},
            "spec": ReservationSpec(
                pod_group="j",
                role="Worker",
                index=0,
                node="a",
                gpus=[1],
                gpu_ids=["GPU-a-1"],
                gpu_milli=250,
                gpu_memory_mib=8192,
            ).model_dump(by_alias=True),
        }
    )
    _device_env(pod, res)
    env = {e.name: e.value for e in pod.spec.containers[1].env}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-a-1"
    assert env["GPUYARD_GPU_MILLI"] == "250"
    assert env["GPUYARD_GPU_MEMORY_LIMIT_MIB"] == "8192"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert not pod.spec.containers[0].env


def test_whole_gpu_pod_gets_no_share_env():
    pod = Pod.model_validate(
        {
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {
                "containers": [{"name": "main", "image": "y", "resources": {"limits": {"nvidia.com/gpu": 1}}}]
            },
        }
    )
    res = Reservation.model_validate(
        {
            "metadata": {"name": "p", "namespace": "default"},
            "spec": ReservationSpec(
                pod_group="j", role="Worker", index=0, node="a", gpus=[0], gpu_milli=1000
            ).model_dump(by_alias=True),
        }
    )
    _device_env(pod, res)
    names = {e.name for e in pod.spec.containers[0].env}
    assert "NVIDIA_VISIBLE_DEVICES" in names and "GPUYARD_GPU_MILLI" not in names
