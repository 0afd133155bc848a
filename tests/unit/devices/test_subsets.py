"""The best-subset tables, the greedy fallback, joint NIC selection and select()."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuyard.apis.devices import GPUDevice, NodeTopology, NodeTopologySpec, PCIeSwitch
from gpuyard.devices import (
    PRESETS,
    LinkTier,
    Locality,
    bandwidth_matrix,
    build_table,
    fingerprint,
    free_mask,
    get_preset,
    greedy_pick,
    indices_of,
    mask_of,
    pick,
    pick_gpus,
    pick_many,
    pick_nics,
    select,
    table_for,
)
from gpuyard.devices.tiers import locality_matrix

from .conftest import brute_ring

QUADS = (0b00001111, 0b11110000)
TABLES = {preset: table_for(get_preset(preset)) for preset in PRESETS}
PREFER = table_for(get_preset("hgx-h100", partition_policy="Prefer"))


def _k_subsets(mask: int, k: int) -> list[int]:
    return [mask_of(c) for c in itertools.combinations(indices_of(mask), k)]


def test_dgx1_two_gpus_get_an_nv2_pair_when_one_is_free() -> None:
    topo = get_preset("dgx1-v100")
    table = TABLES["dgx1-v100"]
    nv2 = {
        mask_of(p)
        for p in itertools.combinations(range(8), 2)
        if topo.spec.gpus[p[0]].nvlink_peers.get(p[1]) == 2
    }
    seen = 0
    for free in range(256):
        chosen = pick(table, free, 2)
        if any(p & free == p for p in nv2):
            assert chosen in nv2, bin(free)
            seen += 1
    assert seen > 100
    assert pick_gpus(table, 0xFF, 2) == (2, 3)  # NV2 and the same PCIe switch


def test_dgx1_four_gpus_get_a_whole_quad_when_free() -> None:
    table = TABLES["dgx1-v100"]
    for free in range(256):
        if any(q & free == q for q in QUADS):
            assert pick(table, free, 4) in QUADS, bin(free)
    assert pick(table, 0b11110001, 4) == 0b11110000


def test_leftovers_keep_blocks_whole() -> None:
    assert pick_gpus(TABLES["dgx1-v100"], mask_of([0, 1, 2, 3, 4]), 1) == (4,)  # keep the quad
    assert pick_gpus(TABLES["dgx-a100"], mask_of([0, 1, 2]), 1) == (2,)  # keep the switch pair
    assert pick_gpus(TABLES["hgx-h100"], mask_of([0, 1, 2, 4, 5]), 1) == (2,)  # keep two partitions
    assert pick_gpus(TABLES["hgx-h100"], 0xFF & ~(1 << 4), 2) == (6, 7)  # keep {0,1,2,3}
    assert pick_gpus(TABLES["p100"], 0xFF & ~1, 4) == (4, 5, 6, 7)  # a whole switch


def test_locality_breaks_bandwidth_ties() -> None:
    assert pick_gpus(TABLES["pcie-t4x4"], 0b1111, 2) == (0, 1)
    assert pick_gpus(TABLES["pcie-t4x4"], 0b1110, 2) == (2, 3)
    assert pick_gpus(TABLES["k80"], 0b11110100, 2) == (4, 5)
    table = TABLES["dgx-a100"]
    assert table.locality[0xFF, 2] == Locality.SWITCH
    assert table.locality[0xFF, 4] == Locality.NUMA
    assert pick_gpus(table, 0b11011011, 4) in ((0, 1, 3, 4), (0, 1, 6, 7), (3, 4, 6, 7))


@pytest.mark.parametrize("preset", PRESETS)
def test_table_is_optimal_against_brute_force(preset: str) -> None:
    topo = get_preset(preset, partition_policy=None)
    table = build_table(topo)
    bw, loc = bandwidth_matrix(topo), locality_matrix(topo)
    n = topo.gpu_count
    ring = {m: brute_ring(bw, indices_of(m)) for m in range(1, 1 << n)}

    def set_loc(m: int) -> int:
        return max((int(loc[a, b]) for a, b in itertools.combinations(indices_of(m), 2)), default=0)

    for free in range(1 << n):
        for k in range(1, free.bit_count() + 1):
            subsets = _k_subsets(free, k)
            best = max(ring[m] for m in subsets)
            chosen = pick(table, free, k)
            assert chosen is not None and chosen & ~free == 0 and chosen.bit_count() == k
            assert ring[chosen] == best == table.bandwidth[free, k] or (best == float("inf") and k == 1)
            assert set_loc(chosen) == min(set_loc(m) for m in subsets if ring[m] == best)
            assert table.locality[free, k] == set_loc(chosen)


def test_h100_honor_returns_only_partitions() -> None:
    topo = get_preset("hgx-h100")
    table = TABLES["hgx-h100"]
    allowed = {mask_of(p) for p in topo.spec.partitions or []}
    for free in range(256):
        for k in range(1, 9):
            chosen = pick(table, free, k)
            fits = [m for m in allowed if m.bit_count() == k and m & free == m]
            if fits:
                assert chosen in fits
            else:
                assert chosen is None
    assert pick(table, 0xFF, 3) is None
    assert pick_gpus(table, 0b00111110, 2) == (2, 3)


def test_h100_prefer_ranks_partitions_first() -> None:
    topo = get_preset("hgx-h100", partition_policy="Prefer")
    allowed = {mask_of(p) for p in topo.spec.partitions or []}
    for free in range(256):
        for k in range(1, free.bit_count() + 1):
            chosen = pick(PREFER, free, k)
            assert chosen is not None and chosen.bit_count() == k and chosen & ~free == 0
            if any(m.bit_count() == k and m & free == m for m in allowed):
                assert chosen in allowed
    assert pick_gpus(PREFER, 0xFF, 3) == (0, 1, 2)
    assert pick_gpus(PREFER, mask_of([1, 2, 4, 5]), 2) == (4, 5)


def test_unhealthy_gpus_are_never_picked() -> None:
    topo = get_preset("dgx-a100", unhealthy=[1, 6])
    free = free_mask(topo)
    assert free == 0xFF & ~0b01000010
    table = table_for(topo)
    for k in range(1, 7):
        chosen = pick_gpus(table, free, k)
        assert chosen is not None and 1 not in chosen and 6 not in chosen
    assert pick(table, free, 7) is None
    assert free_mask(topo, busy=[0, 2]) == free & ~0b101


def test_tables_are_shared_by_identical_nodes() -> None:
    a = table_for(get_preset("dgx-a100", node_name="a", unhealthy=[3]))
    b = table_for(get_preset("dgx-a100", node_name="b"))
    assert a is b
    assert fingerprint(get_preset("hgx-h100")) != fingerprint(
        get_preset("hgx-h100", partition_policy="Prefer")
    )
    assert table_for(get_preset("hgx-h100")) is not PREFER
    assert a.choice.flags.writeable is False


def test_pick_edges() -> None:
    table = TABLES["pcie-t4x4"]
    assert pick(table, 0b1111, 0) == 0
    assert pick(table, 0b1111, 5) is None
    assert pick(table, 0, 1) is None
    assert pick(table, 0b0101, 3) is None
    with pytest.raises(ValueError, match="beyond the node's 4 GPUs"):
        pick(table, 0b10000, 1)
    with pytest.raises(ValueError):
        pick(table, 0b1, -1)
    with pytest.raises(ValueError):
        pick(table, -1, 1)


def test_pick_many_matches_pick() -> None:
    import numpy as np

    table = TABLES["dgx1-v100"]
    frees = np.arange(256).repeat(9)
    ks = np.tile(np.arange(9), 256)
    got = pick_many(table, frees, ks)
    for free, k, chosen in zip(frees.tolist(), ks.tolist(), got.tolist(), strict=True):
        assert (pick(table, free, k) or 0) == chosen


@settings(max_examples=400, deadline=None)
@given(
    preset=st.sampled_from([*PRESETS, "hgx-h100-prefer"]),
    free=st.integers(min_value=0, max_value=255),
    k=st.integers(min_value=0, max_value=9),
)
def test_pick_stays_inside_the_free_mask(preset: str, free: int, k: int) -> None:
    table = PREFER if preset == "hgx-h100-prefer" else TABLES[preset]
    free &= (1 << table.n) - 1
    chosen = pick(table, free, k)
    if chosen is not None:
        assert chosen & ~free == 0
        assert chosen.bit_count() == k
    elif table.policy != "Honor":
        assert k > free.bit_count()


def _big_pcie_node() -> NodeTopology:
    """12 GPUs: three PCIe switches of four, switches 0-1 on socket 0, switch 2 on socket 1."""
    gpus = [
        GPUDevice(index=i, model="Tesla-T4", pcie_switch=f"sw{i // 4}", numa_node=i // 8, socket=i // 8)
        for i in range(12)
    ]
    switches = [PCIeSwitch(name=f"sw{s}", numa_node=s // 2, socket=s // 2) for s in range(3)]
    return NodeTopology(spec=NodeTopologySpec(gpus=gpus, sockets=2, pcie_switches=switches))


def test_greedy_fallback_for_big_nodes() -> None:
    topo = _big_pcie_node()
    with pytest.raises(ValueError, match="greedy_pick"):
        table_for(topo)
    full = (1 << 12) - 1
    assert greedy_pick(topo, full, 4) == (0, 1, 2, 3)
    assert greedy_pick(topo, full & ~0b1, 4) == (4, 5, 6, 7)
    assert greedy_pick(topo, full & ~0b1, 2) == (1, 2)
    assert greedy_pick(topo, 0b1000_0001_0001, 3) == (0, 4, 11)
    assert greedy_pick(topo, full, 1) == (0,)
    assert greedy_pick(topo, 0b11, 3) is None
    result = select(topo, full & ~0b1111, 2)
    assert result is not None and result.gpus == (4, 5) and result.tier is LinkTier.PIX
    assert result.bandwidth == 16.0


def test_greedy_honours_partitions() -> None:
    topo = _big_pcie_node()
    topo.spec.partitions = [[0, 1], [8, 9], [4, 5, 6, 7]]
    topo.spec.partition_policy = "Honor"
    full = (1 << 12) - 1
    assert greedy_pick(topo, full, 2) == (0, 1)
    assert greedy_pick(topo, full & ~0b1, 2) == (8, 9)
    assert greedy_pick(topo, full, 3) is None
    topo.spec.partition_policy = "Prefer"
    assert greedy_pick(topo, full, 3) == (0, 1, 2)


def test_pick_nics_same_pcie_on_dgx_a100() -> None:
    topo = get_preset("dgx-a100")
    for i in range(8):
        nics = pick_nics(topo, [i], "SamePCIe")
        assert nics is not None and len(nics) == 1
        assert topo.nic(nics[0]).pcie_switch == topo.spec.gpus[i].pcie_switch
    four = pick_nics(topo, [0, 1, 2, 3], "SamePCIe")
    assert four == ["mlx5_0", "mlx5_2"]
    assert pick_nics(topo, [0, 1], "SamePCIe", free_nics={"mlx5_1", "mlx5_2"}) == ["mlx5_1"]
    assert pick_nics(topo, [0, 1], "SamePCIe", free_nics={"mlx5_2", "mlx5_3"}) is None  # never downgraded
    assert pick_nics(topo, [0, 1], "SameNUMA", free_nics={"mlx5_2", "mlx5_3"}) == ["mlx5_2"]
    assert pick_nics(topo, [0, 1], "SameNUMA", free_nics={"mlx5_5"}) is None
    assert pick_nics(topo, [0, 7], "SameNUMA") == ["mlx5_0", "mlx5_6"]
    assert pick_nics(topo, [0, 1], None, free_nics={"mlx5_7"}) == ["mlx5_7"]
    assert pick_nics(topo, [0, 1], None, free_nics=set()) == []
    with pytest.raises(ValueError, match="allowed: SamePCIe, SameNUMA or None"):
        pick_nics(topo, [0], "SameRack")  # type: ignore[arg-type]


def test_pick_nics_skips_unhealthy_and_non_rdma() -> None:
    topo = get_preset("dgx-a100")
    topo.spec.nics[0].health = "Unhealthy"
    assert pick_nics(topo, [0], "SamePCIe") == ["mlx5_1"]
    assert pick_nics(get_preset("pcie-t4x4"), [0, 1], "SamePCIe") is None  # only a non-RDMA NIC
    assert pick_nics(get_preset("pcie-t4x4"), [0, 1], None) == []
    assert pick_nics(get_preset("k80"), [0], "SamePCIe") is None  # the NIC is on no switch
    assert pick_nics(get_preset("k80"), [0], "SameNUMA") == ["mlx4_0"]
    assert pick_nics(get_preset("k80"), [7], "SameNUMA") is None


def test_select_moves_gpus_to_where_nics_are_free() -> None:
    topo = get_preset("dgx-a100")
    busy = {"mlx5_0", "mlx5_1"}
    free_nics = {nic.name for nic in topo.spec.nics} - busy
    plain = select(topo, 0xFF, 2)
    assert plain is not None and plain.gpus == (0, 1) and plain.nics == ()
    joint = select(topo, 0xFF, 2, nic_scope="SamePCIe", free_nics=free_nics)
    assert joint is not None and joint.gpus == (2, 3) and joint.nics == ("mlx5_2",)
    assert joint.bandwidth == 300.0 and joint.tier is LinkTier.NV
    assert select(topo, 0b11, 2, nic_scope="SamePCIe", free_nics=free_nics) is None
    numa = select(topo, 0b111, 2, nic_scope="SameNUMA", free_nics={"mlx5_7"})
    assert numa is None
    best_effort = select(topo, 0xFF, 2, rdma=True, free_nics={"mlx5_7"})
    assert best_effort is not None and best_effort.gpus == (0, 1) and best_effort.nics == ("mlx5_7",)
    assert select(topo, 0xFF, 9) is None


def test_select_on_h100_gives_each_gpu_its_nic() -> None:
    topo = get_preset("hgx-h100")
    result = select(topo, 0xFF, 4, nic_scope="SamePCIe")
    assert result is not None
    assert result.gpus == (0, 1, 2, 3)
    assert result.nics == ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")
