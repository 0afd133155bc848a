"""The bandwidth model: per-link figures, exact ring bandwidth, multi-node placements."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from gpuyard.apis.devices import GPUDevice, NodeTopology, NodeTopologySpec
from gpuyard.devices import (
    PRESETS,
    NodeShare,
    all_ring_bandwidths,
    bandwidth_matrix,
    best_ring,
    get_preset,
    load_topology_file,
    placement_bandwidth,
    ring_bandwidth,
)
from gpuyard.devices.bandwidth import nic_effective_gbps

from .conftest import DATA, brute_ring


def test_pair_figures_per_model_and_tier() -> None:
    v100 = bandwidth_matrix(get_preset("dgx1-v100"))
    assert v100[0, 1] == 25.0  # NV1
    assert v100[0, 3] == 50.0  # NV2
    assert v100[0, 5] == 16.0  # SYS: PCIe Gen3 (16) below QPI (19.2)
    assert bandwidth_matrix(get_preset("dgx-a100"))[0, 7] == 300.0
    assert bandwidth_matrix(get_preset("hgx-h100"))[3, 4] == 450.0
    assert bandwidth_matrix(get_preset("pcie-t4x4"))[0, 3] == 16.0
    l40s = bandwidth_matrix(load_topology_file(DATA / "pcie-l40s-1.txt", gpu_model="NVIDIA L40S"))
    assert l40s[0, 1] == 32.0  # NODE, PCIe Gen4
    assert l40s[0, 4] == pytest.approx(20.8)  # SYS across sockets: one UPI link
    assert math.isinf(l40s[2, 2])


def test_nic_line_rate_and_path() -> None:
    h100 = get_preset("hgx-h100")
    assert nic_effective_gbps(h100, "mlx5_0", gpus=[0]) == 50.0  # 400 Gb/s
    assert nic_effective_gbps(h100, "mlx5_7", gpus=[0]) == pytest.approx(20.8)  # reached across UPI
    assert nic_effective_gbps(h100, "mlx5_7", gpus=[0, 7]) == 50.0  # nearest GPU decides
    assert nic_effective_gbps(get_preset("dgx-a100"), "mlx5_0", gpus=[0]) == 25.0
    assert nic_effective_gbps(get_preset("dgx1-v100"), "mlx5_0", gpus=[0]) == 12.5


def test_dgx1_rings() -> None:
    topo = get_preset("dgx1-v100")
    ring = best_ring(bandwidth_matrix(topo), range(8))
    assert ring.bandwidth == 50.0  # the NV2 links form one 8-GPU cycle
    hops = [
        topo.spec.gpus[a].nvlink_peers.get(b)
        for a, b in zip(ring.order, ring.order[1:] + ring.order[:1], strict=True)
    ]
    assert hops == [2] * 8
    assert ring_bandwidth(topo, [0, 1, 2, 3]) == 25.0
    assert ring_bandwidth(topo, [0, 5]) == 16.0
    assert math.isinf(ring_bandwidth(topo, [3]))
    with pytest.raises(ValueError):
        best_ring(bandwidth_matrix(topo), [])


@pytest.mark.parametrize("preset", PRESETS)
def test_all_subsets_match_brute_force(preset: str) -> None:
    bw = bandwidth_matrix(get_preset(preset))
    fast = all_ring_bandwidths(bw)
    n = len(bw)
    for mask in range(1, 1 << n):
        gpus = tuple(i for i in range(n) if mask >> i & 1)
        assert fast[mask] == brute_ring(bw, gpus), gpus
        assert best_ring(bw, gpus).bandwidth == fast[mask]


def test_random_matrices_match_brute_force() -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        n = int(rng.integers(3, 8))
        upper = np.triu(rng.choice([16.0, 25.0, 50.0, 300.0], size=(n, n)), 1)
        bw = upper + upper.T
        np.fill_diagonal(bw, math.inf)
        fast = all_ring_bandwidths(bw)
        for k in range(1, n + 1):
            for gpus in itertools.combinations(range(n), k):
                mask = sum(1 << g for g in gpus)
                assert fast[mask] == brute_ring(bw, gpus)
                ring = best_ring(bw, gpus)
                assert sorted(ring.order) == list(gpus)
                hops = (
                    [bw[a, b] for a, b in zip(ring.order, ring.order[1:] + ring.order[:1], strict=True)]
                    if k > 1
                    else []
                )
                assert min(hops, default=math.inf) == ring.bandwidth


def test_large_rings_use_the_heuristic_and_stay_valid() -> None:
    # 16 GPUs: two NVSwitch islands of 8 joined by PCIe; the best ring must cross twice over PCIe.
    n = 16
    gpus = []
    for i in range(n):
        peers = {j: 12 for j in range(n) if j != i and j // 8 == i // 8}
        gpus.append(
            GPUDevice(index=i, model="NVIDIA-A100", numa_node=i // 8, socket=i // 8, nvlink_peers=peers)
        )
    topo = NodeTopology(spec=NodeTopologySpec(gpus=gpus, sockets=2))
    ring = best_ring(bandwidth_matrix(topo), range(n))
    assert sorted(ring.order) == list(range(n))
    assert ring.bandwidth == pytest.approx(20.8)
    assert ring_bandwidth(topo, range(8)) == 300.0


def test_placement_single_node_is_the_ring() -> None:
    topo = get_preset("dgx-a100")
    result = placement_bandwidth([NodeShare(topo, (0, 1, 2, 3))])
    assert result.bus_gbps == 300.0
    assert "intra-node ring" in result.bottleneck
    single = placement_bandwidth([NodeShare(topo, (5,))])
    assert math.isinf(single.bus_gbps)


def test_placement_across_nodes_is_limited_by_nics() -> None:
    a, b = get_preset("dgx-a100", node_name="a"), get_preset("dgx-a100", node_name="b")
    nics = tuple(f"mlx5_{i}" for i in range(8))
    full = placement_bandwidth([NodeShare(a, tuple(range(8)), nics), NodeShare(b, tuple(range(8)), nics)])
    assert full.bus_gbps == 200.0  # 8 x 200 Gb/s; NCCL measured about 192
    one = placement_bandwidth(
        [NodeShare(a, tuple(range(8)), ("mlx5_0",)), NodeShare(b, tuple(range(8)), nics)]
    )
    assert one.bus_gbps == 25.0
    assert one.bottleneck.startswith("NICs on node 'a'")
    none = placement_bandwidth([NodeShare(a, (0,)), NodeShare(b, (0,))])
    assert none.bus_gbps == 1.25
    assert placement_bandwidth([NodeShare(a, (0,)), NodeShare(b, (0,))], fallback_gbps=3.0).bus_gbps == 3.0


def test_placement_intra_ring_can_be_the_bottleneck() -> None:
    v1, v2 = get_preset("dgx1-v100", node_name="v1"), get_preset("dgx1-v100", node_name="v2")
    nics = ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")
    result = placement_bandwidth([NodeShare(v1, (0, 5), nics), NodeShare(v2, tuple(range(8)), nics)])
    assert result.bus_gbps == 16.0  # GPU0-GPU5 is SYS
    assert "intra-node ring on node 'v1'" in result.bottleneck
    assert result.nodes[1].nic_gbps == 50.0  # 4 x EDR; NCCL measured about 48
    given = placement_bandwidth([NodeShare(v1, (0, 5), nics, intra_gbps=40.0), NodeShare(v2, (0,), nics)])
    assert given.nodes[0].intra_gbps == 40.0
    with pytest.raises(ValueError):
        placement_bandwidth([])
    with pytest.raises(ValueError, match="no GPUs"):
        placement_bandwidth([NodeShare(v1, ())])
