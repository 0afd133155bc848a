"""ClusterState and fits(): capacity bookkeeping, the sharing rule, and the feasibility mask."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuyard.scheduler.placement.packing import (
    GPU_MILLI,
    POLICIES,
    ClusterState,
    OvercommitError,
    PodRequest,
    fits,
    get_policy,
)


def cluster(*specs: tuple[str, int, int, int, str]) -> ClusterState:
    """specs: (name, cpu_milli, memory_mib, gpus, model)."""
    return ClusterState.from_nodes(
        names=[s[0] for s in specs],
        cpu_milli=[s[1] for s in specs],
        memory_mib=[s[2] for s in specs],
        gpus=[s[3] for s in specs],
        models=[s[4] for s in specs],
    )


def test_from_nodes_pads_missing_gpus_with_zero_and_counts_them():
    s = cluster(("a", 8000, 1000, 2, "T4"), ("b", 4000, 1000, 4, "V100"), ("c", 4000, 1000, 0, ""))
    assert s.gpu_free.tolist() == [[1000, 1000, 0, 0], [1000] * 4, [0, 0, 0, 0]]
    assert s.gpu_count.tolist() == [2, 4, 0]
    assert s.model_names == ["T4", "V100"]
    assert s.gpu_model.tolist() == [0, 1, -1]
    assert s.total_gpu_milli == 6 * GPU_MILLI == s.free_gpu_milli
    assert s.model_ids("V100|T4") == (0, 1)
    assert s.model_ids("") is None
    with pytest.raises(KeyError):
        s.model_ids("A100")


def test_allocate_and_release_round_trip():
    s = cluster(("a", 8000, 1000, 2, "T4"))
    share = PodRequest(name="p", cpu_milli=1000, memory_mib=100, num_gpu=1, gpu_milli=300)
    whole = PodRequest(name="w", cpu_milli=2000, memory_mib=200, num_gpu=1, gpu_milli=1000)
    s.allocate(0, (1,), share)
    s.allocate(0, (0,), whole)
    assert s.gpu_free[0].tolist() == [0, 700]
    assert (s.cpu_free[0], s.mem_free[0]) == (5000, 700)
    assert s.gpu_pods[0, 0] == 1 and s.gpu_pods[0, 1] == 1
    s.release(0, (1,), share)
    s.release(0, (0,), whole)
    assert s.gpu_free[0].tolist() == [1000, 1000]
    assert (s.cpu_free[0], s.mem_free[0]) == (8000, 1000)
    assert not s.gpu_pods.any()


def test_whole_and_shared_never_share_a_gpu():
    s = cluster(("a", 8000, 1000, 1, "T4"))
    share = PodRequest(name="p", cpu_milli=100, memory_mib=10, num_gpu=1, gpu_milli=100)
    whole = PodRequest(name="w", cpu_milli=100, memory_mib=10, num_gpu=1, gpu_milli=1000)
    s.allocate(0, (0,), share)
    assert not fits(s, whole).any()
    with pytest.raises(OvercommitError, match="not fully free"):
        s.allocate(0, (0,), whole)
    s.release(0, (0,), share)
    s.allocate(0, (0,), whole)
    assert not fits(s, share).any()
    with pytest.raises(OvercommitError, match="needs 100m"):
        s.allocate(0, (0,), share)


@pytest.mark.parametrize(
    ("pod", "gpus", "message"),
    [
        (PodRequest(name="cpu", cpu_milli=9000, memory_mib=1, num_gpu=0, gpu_milli=0), (), "CPU"),
        (PodRequest(name="mem", cpu_milli=1, memory_mib=2000, num_gpu=0, gpu_milli=0), (), "Mi"),
        (PodRequest(name="two", cpu_milli=1, memory_mib=1, num_gpu=2, gpu_milli=1000), (0,), "asks for 2"),
        (PodRequest(name="same", cpu_milli=1, memory_mib=1, num_gpu=2, gpu_milli=1000), (0, 0), "repeat"),
        (
            PodRequest(name="ghost", cpu_milli=1, memory_mib=1, num_gpu=1, gpu_milli=1000),
            (3,),
            "has no GPU 3",
        ),
    ],
)
def test_allocate_refuses_to_overcommit(pod, gpus, message):
    s = cluster(("a", 8000, 1000, 2, "T4"))
    before = (s.cpu_free.copy(), s.mem_free.copy(), s.gpu_free.copy())
    with pytest.raises(OvercommitError, match=message):
        s.allocate(0, gpus, pod)
    assert all(
        np.array_equal(x, y) for x, y in zip(before, (s.cpu_free, s.mem_free, s.gpu_free), strict=True)
    )


def test_release_refuses_to_exceed_capacity():
    s = cluster(("a", 8000, 1000, 1, "T4"))
    pod = PodRequest(name="p", cpu_milli=100, memory_mib=10, num_gpu=1, gpu_milli=500)
    with pytest.raises(OvercommitError):
        s.release(0, (0,), pod)
    s.allocate(0, (0,), pod)
    s.release(0, (0,), pod)
    with pytest.raises(OvercommitError):
        s.release(0, (0,), pod)


def test_pod_request_rejects_inconsistent_shapes():
    with pytest.raises(ValueError, match="num_gpu == 1"):
        PodRequest(name="x", cpu_milli=1, memory_mib=1, num_gpu=2, gpu_milli=500)
    with pytest.raises(ValueError, match="without num_gpu"):
        PodRequest(name="x", cpu_milli=1, memory_mib=1, num_gpu=0, gpu_milli=500)
    with pytest.raises(ValueError, match=r"1\.\.1000"):
        PodRequest(name="x", cpu_milli=1, memory_mib=1, num_gpu=1, gpu_milli=1500)
    assert PodRequest(name="x", cpu_milli=1, memory_mib=1, num_gpu=1, gpu_milli=500).shared
    assert not PodRequest(name="x", cpu_milli=1, memory_mib=1, num_gpu=1, gpu_milli=1000).shared
    assert PodRequest(name="x", cpu_milli=1, memory_mib=1, num_gpu=4, gpu_milli=1000).total_gpu_milli == 4000


def test_fits_checks_cpu_memory_gpus_share_and_model():
    s = cluster(
        ("a", 8000, 1000, 2, "T4"),
        ("b", 2000, 1000, 4, "V100"),
        ("c", 64000, 9000, 0, ""),
        ("d", 8000, 100, 8, "V100"),
    )
    s.allocate(0, (0,), PodRequest(name="half", cpu_milli=100, memory_mib=10, num_gpu=1, gpu_milli=600))
    assert fits(
        s, PodRequest(name="cpu-only", cpu_milli=4000, memory_mib=500, num_gpu=0, gpu_milli=0)
    ).tolist() == [True, False, True, False]
    assert fits(
        s, PodRequest(name="share", cpu_milli=1000, memory_mib=10, num_gpu=1, gpu_milli=500)
    ).tolist() == [True, True, False, True]
    assert fits(
        s, PodRequest(name="share-big", cpu_milli=1000, memory_mib=10, num_gpu=1, gpu_milli=700)
    ).tolist() == [True, True, False, True]
    assert fits(
        s, PodRequest(name="two", cpu_milli=1000, memory_mib=10, num_gpu=2, gpu_milli=1000)
    ).tolist() == [False, True, False, True]
    assert fits(
        s, PodRequest(name="eight", cpu_milli=1000, memory_mib=10, num_gpu=8, gpu_milli=1000)
    ).tolist() == [False, False, False, True]
    v100 = s.model_ids("V100")
    assert fits(
        s,
        PodRequest(
            name="v100", cpu_milli=1000, memory_mib=10, num_gpu=1, gpu_milli=1000, allowed_models=v100
        ),
    ).tolist() == [False, True, False, True]


@settings(max_examples=25, deadline=None)
@given(
    policy=st.sampled_from(sorted(POLICIES)),
    seed=st.integers(0, 2**16),
    ops=st.lists(
        st.tuples(
            st.sampled_from(
                [(0, 0), (1, 100), (1, 250), (1, 500), (1, 800), (1, 1000), (2, 1000), (4, 1000)]
            ),
            st.integers(0, 6000),
            st.booleans(),
        ),
        min_size=1,
        max_size=60,
    ),
)
def test_any_policy_never_overcommits(policy, seed, ops):
    s = cluster(("n0", 16000, 4000, 4, "T4"), ("n1", 8000, 2000, 2, "V100"), ("n2", 32000, 8000, 8, "A100"))
    pol = get_policy(policy, seed=seed)
    pol.prepare(
        [
            PodRequest(name=f"w{i}", cpu_milli=cpu, memory_mib=10, num_gpu=n, gpu_milli=m)
            for i, ((n, m), cpu, _) in enumerate(ops)
        ]
    )
    placed: list[tuple[int, tuple[int, ...], PodRequest]] = []
    owner = {}  # (node, gpu) -> "whole" | "shared"
    for i, ((num, milli), cpu, release) in enumerate(ops):
        if release and placed:
            node, gpus, pod = placed.pop(0)
            s.release(node, gpus, pod)
            for g in gpus:
                if s.gpu_free[node, g] == GPU_MILLI:
                    owner.pop((node, g), None)
            continue
        pod = PodRequest(name=f"p{i}", cpu_milli=cpu, memory_mib=10, num_gpu=num, gpu_milli=milli)
        choice = pol.place(s, pod)
        if choice is None:
            assert not fits(s, pod).any()
            continue
        node, gpus = choice
        s.allocate(node, gpus, pod)
        placed.append((node, gpus, pod))
        kind = "shared" if pod.shared else "whole"
        for g in gpus:
            assert owner.setdefault((node, g), kind) == kind, "a GPU served whole and shared pods"
        assert (s.gpu_free >= 0).all() and (s.gpu_free <= GPU_MILLI).all()
        assert (s.cpu_free >= 0).all() and (s.mem_free >= 0).all()
        assert (s.gpu_free[np.arange(8)[None, :] >= s.gpu_count[:, None]] == 0).all()
