"""Best GPU subsets per (free mask, k), precomputed once per topology: the scheduler's hot path.

For a node of n <= 8 GPUs there are 2^n free masks. :func:`build_table` ranks, for every free
mask F and every request size k, all k-subsets S of F and stores the winner in flat NumPy arrays
indexed `[F, k]`, so :func:`pick` is one list lookup. The ranking, most important first:

1. partition policy: `Honor` admits only the vendor's allowed sets; `Prefer` ranks them first;
2. ring bandwidth of S (highest bottleneck hop, :mod:`gpuyard.devices.bandwidth`);
3. locality of S: same PCIe switch > same PCIe tree / host bridge > same NUMA > same socket > cross;
4. what is left, R = F - S: for request sizes k' from n down to 1, the sum of ring bandwidths (and
   then of localities) of the k'-subsets the table itself would hand out from R one after the other
   (repeatedly), i.e. keep big fast blocks whole, then keep as many good smaller blocks as possible;
5. the lowest mask, so the table is deterministic.

Step 4 reads rows of smaller masks, which are built first (R < F numerically). Tables are cached
by a fingerprint of what decides the ranking (links, bandwidths, locality, partitions), so all
identical nodes share one table. Unhealthy or busy GPUs are simply absent from the free mask.

Nodes with more than 8 GPUs get no table: :func:`greedy_pick` grows a set from the best free pair
(documented in docs/topology.md). :func:`pick_nics` implements Koordinator's joint GPU + RDMA
allocation scopes, and :func:`select` combines both.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from gpuyard.apis.devices import NodeTopology
from gpuyard.devices.bandwidth import all_ring_bandwidths, bandwidth_matrix, best_ring
from gpuyard.devices.tiers import LinkTier, Resolver, gpu_link, locality_matrix

__all__ = [
    "MAX_TABLE_GPUS",
    "NICScope",
    "Selection",
    "SubsetTable",
    "build_table",
    "clear_table_cache",
    "fingerprint",
    "free_mask",
    "greedy_pick",
    "indices_of",
    "mask_of",
    "pick",
    "pick_gpus",
    "pick_many",
    "pick_nics",
    "select",
    "table_for",
]

MAX_TABLE_GPUS = 8
NICScope = Literal["SamePCIe", "SameNUMA"] | None
_SCOPES = ("SamePCIe", "SameNUMA", None)


def mask_of(indices: Iterable[int]) -> int:
    out = 0
    for i in indices:
        out |= 1 << i
    return out


def indices_of(mask: int) -> tuple[int, ...]:
    return tuple(i for i in range(mask.bit_length()) if mask >> i & 1)


def free_mask(topology: NodeTopology, *, busy: Iterable[int] = ()) -> int:
    """Mask of the healthy GPUs not in `busy`."""
    healthy = mask_of(g.index for g in topology.spec.gpus if g.health == "Healthy")
    return healthy & ~mask_of(busy)


@dataclass(frozen=True, slots=True, eq=False)
class SubsetTable:
    """Precomputed best subsets of one topology; arrays are read-only and shared.

    `choice[F, k]` is the chosen mask (0: no k-subset of F is admissible), `bandwidth[F, k]` its
    ring GB/s (inf for one GPU, 0 when none), `tier[F, k]` its worst pairwise LinkTier (-1 when
    none), `locality[F, k]` its Locality (-1 when none). `ring[S]`, `set_locality[S]`,
    `set_tier[S]` and `allowed[S]` describe every subset S.
    """

    fingerprint: str
    n: int
    choice: np.ndarray
    bandwidth: np.ndarray
    tier: np.ndarray
    locality: np.ndarray
    ring: np.ndarray
    set_locality: np.ndarray
    set_tier: np.ndarray
    allowed: np.ndarray
    policy: str | None
    _flat: list[int]
    _indices: tuple[tuple[int, ...], ...]


def _analysis(topology: NodeTopology) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = topology.gpu_count
    bw = bandwidth_matrix(topology)
    loc = locality_matrix(topology)
    res = Resolver(topology)
    tiers = np.zeros((n, n), dtype=np.int16)
    for i in range(n):
        for j in range(i + 1, n):
            tiers[i, j] = tiers[j, i] = gpu_link(topology, i, j, resolver=res).rank
    return bw, loc, tiers


def _partition_masks(topology: NodeTopology) -> tuple[frozenset[int] | None, str | None]:
    spec = topology.spec
    if spec.partitions is None or spec.partition_policy is None:
        return None, None
    return frozenset(mask_of(p) for p in spec.partitions), spec.partition_policy


def fingerprint(topology: NodeTopology) -> str:
    """Hash of everything the subset ranking depends on (not names, UUIDs or health)."""
    bw, loc, tiers = _analysis(topology)
    parts, policy = _partition_masks(topology)
    return _fingerprint(bw, loc, tiers, parts, policy)


def _fingerprint(
    bw: np.ndarray, loc: np.ndarray, tiers: np.ndarray, parts: frozenset[int] | None, policy: str | None
) -> str:
    doc = {
        "bw": [[None if math.isinf(x) else round(float(x), 6) for x in row] for row in bw],
        "loc": loc.tolist(),
        "tiers": tiers.tolist(),
        "parts": sorted(parts) if parts is not None else None,
        "policy": policy,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:24]


def build_table(topology: NodeTopology) -> SubsetTable:
    """Rank every k-subset of every free mask (module doc); n <= MAX_TABLE_GPUS. Not cached."""
    n = topology.gpu_count
    if n > MAX_TABLE_GPUS:
        raise ValueError(
            f"subset tables cover up to {MAX_TABLE_GPUS} GPUs; this node has {n} (use greedy_pick)"
        )
    bw, loc, tiers = _analysis(topology)
    parts, policy = _partition_masks(topology)
    return _build(n, bw, loc, tiers, parts, policy, _fingerprint(bw, loc, tiers, parts, policy))


def _build(
    n: int,
    bw: np.ndarray,
    loc: np.ndarray,
    tiers: np.ndarray,
    parts: frozenset[int] | None,
    policy: str | None,
    fp: str,
) -> SubsetTable:
    size = 1 << n
    ring = all_ring_bandwidths(bw) if n else np.zeros(1)
    set_loc = [0] * size
    set_rank = [0] * size  # worst Link.rank inside the set (0 = X for singletons)
    for mask in range(1, size):
        low = (mask & -mask).bit_length() - 1
        rest = mask & (mask - 1)
        worst_loc, worst_rank = set_loc[rest], set_rank[rest]
        for j in indices_of(rest):
            worst_loc = max(worst_loc, int(loc[low, j]))
            worst_rank = max(worst_rank, int(tiers[low, j]))
        set_loc[mask], set_rank[mask] = worst_loc, worst_rank
    allowed = [parts is None or m in parts for m in range(size)]
    honor = policy == "Honor"
    ring_l = ring.tolist()
    width = n + 1
    flat = [0] * (size * width)
    rep_bw = [[0.0] * width for _ in range(size)]
    rep_loc = [[0] * width for _ in range(size)]
    future: list[tuple[float, ...]] = [()] * size
    by_count: list[list[int]] = [[] for _ in range(width)]
    for big in range(size):
        for bucket in by_count:
            bucket.clear()
        sub = big
        while sub:
            by_count[sub.bit_count()].append(sub)
            sub = (sub - 1) & big
        row = big * width
        for k in range(1, big.bit_count() + 1):
            best, best_key = 0, None
            for cand in by_count[k]:
                if honor and not allowed[cand]:
                    continue
                key = (allowed[cand], ring_l[cand], -set_loc[cand], future[big ^ cand], -cand)
                if best_key is None or key > best_key:
                    best, best_key = cand, key
            flat[row + k] = best
        mine_bw, mine_loc = rep_bw[big], rep_loc[big]
        for k in range(1, width):
            chosen = flat[row + k]
            if chosen:
                rest = big ^ chosen
                mine_bw[k] = (1.0 if k == 1 else ring_l[chosen]) + rep_bw[rest][k]
                mine_loc[k] = set_loc[chosen] + rep_loc[rest][k]
        # rounded: equal totals summed in another order must tie, not differ by an ulp
        future[big] = tuple(x for k in range(n, 0, -1) for x in (round(mine_bw[k], 6), -mine_loc[k]))
    choice = np.array(flat, dtype=np.uint16).reshape(size, width)
    ring_arr = np.asarray(ring, dtype=np.float64)
    set_loc_arr = np.array(set_loc, dtype=np.int8)
    set_tier_arr = np.array([-(-r // 1000) for r in set_rank], dtype=np.int8)  # rank -> LinkTier
    none = choice == 0
    bandwidth = np.where(none, 0.0, ring_arr[choice]).astype(np.float32)
    tier = np.where(none, -1, set_tier_arr[choice]).astype(np.int8)
    locality = np.where(none, -1, set_loc_arr[choice]).astype(np.int8)
    arrays: list[np.ndarray] = [choice, bandwidth, tier, locality, ring_arr, set_loc_arr, set_tier_arr]
    allowed_arr = np.array(allowed, dtype=bool)
    for arr in (*arrays, allowed_arr):
        arr.setflags(write=False)
    return SubsetTable(
        fingerprint=fp,
        n=n,
        choice=choice,
        bandwidth=bandwidth,
        tier=tier,
        locality=locality,
        ring=ring_arr,
        set_locality=set_loc_arr,
        set_tier=set_tier_arr,
        allowed=allowed_arr,
        policy=policy,
        _flat=flat,
        _indices=tuple(indices_of(m) for m in range(size)),
    )


_CACHE: dict[str, SubsetTable] = {}
_CACHE_MAX = 256


def table_for(topology: NodeTopology) -> SubsetTable:
    """The (shared, cached) subset table of a topology with <= 8 GPUs."""
    n = topology.gpu_count
    if n > MAX_TABLE_GPUS:
        raise ValueError(
            f"subset tables cover up to {MAX_TABLE_GPUS} GPUs; this node has {n} (use greedy_pick)"
        )
    bw, loc, tiers = _analysis(topology)
    parts, policy = _partition_masks(topology)
    fp = _fingerprint(bw, loc, tiers, parts, policy)
    table = _CACHE.get(fp)
    if table is None:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        table = _CACHE[fp] = _build(n, bw, loc, tiers, parts, policy, fp)
    return table


def clear_table_cache() -> None:
    _CACHE.clear()


def pick(table: SubsetTable, free: int, k: int) -> int | None:
    """The best k-GPU mask inside `free`, or None when there is none. O(1)."""
    if k < 0 or free < 0:
        raise ValueError(f"pick needs free >= 0 and k >= 0, got free={free}, k={k}")
    if k > table.n:
        return None
    try:
        chosen = table._flat[free * (table.n + 1) + k]
    except IndexError:
        raise ValueError(f"free mask {free:#x} has bits beyond the node's {table.n} GPUs") from None
    return chosen if chosen or k == 0 else None


def pick_gpus(table: SubsetTable, free: int, k: int) -> tuple[int, ...] | None:
    """Like :func:`pick`, as sorted GPU indices."""
    chosen = pick(table, free, k)
    return None if chosen is None else table._indices[chosen]


def pick_many(table: SubsetTable, free: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Vectorised :func:`pick`: chosen masks for arrays of free masks and sizes (0 = none)."""
    chosen: np.ndarray = table.choice[free, k]
    return chosen


def _best_of(
    candidates: Iterable[tuple[int, ...]], bw: np.ndarray, loc: np.ndarray
) -> tuple[int, ...] | None:
    best, best_key = None, None
    for cand in candidates:
        worst = max((int(loc[a, b]) for a in cand for b in cand if a < b), default=0)
        key = (best_ring(bw, cand).bandwidth, -worst, -mask_of(cand))
        if best_key is None or key > best_key:
            best, best_key = cand, key
    return best


def _closeness(
    g: int, *, chosen: Sequence[int], bw: np.ndarray, loc: np.ndarray
) -> tuple[float, float, float, int]:
    """How well GPU `g` joins `chosen`: its weakest link, then locality, then total bandwidth."""
    return (
        min(bw[g, s] for s in chosen),
        -max(loc[g, s] for s in chosen),
        sum(bw[g, s] for s in chosen),
        -g,
    )


def greedy_pick(topology: NodeTopology, free: int, k: int) -> tuple[int, ...] | None:
    """Fallback for nodes without a table (more than 8 GPUs): a heuristic, O(n^2 k^2).

    Partitions first (Honor: the best allowed set inside `free` by ring bandwidth then locality,
    else None; Prefer: that set when one exists). Otherwise grow a set from every free GPU as a
    seed, each time adding the free GPU whose slowest link to the set is fastest (ties: closest
    locality, then most total bandwidth to the set, then lowest index) -- the seed's first partner
    is its best pair -- and keep the grown set with the best (locality, slowest pairwise link,
    total pairwise bandwidth, lowest mask). k = 1 takes the lowest free GPU.
    """
    gpus = [i for i in range(topology.gpu_count) if free >> i & 1]
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if k > len(gpus):
        return None
    bw = bandwidth_matrix(topology)
    loc = locality_matrix(topology)
    spec = topology.spec
    if spec.partitions is not None and spec.partition_policy is not None:
        fits = [tuple(p) for p in spec.partitions if len(p) == k and all(free >> i & 1 for i in p)]
        found = _best_of(fits, bw, loc)
        if found is not None or spec.partition_policy == "Honor":
            return found
    if k <= 1:
        return tuple(gpus[:k])
    best, best_key = None, None
    for seed in gpus:
        chosen = [seed]
        while len(chosen) < k:
            nxt = max(
                (g for g in gpus if g not in chosen),
                key=functools.partial(_closeness, chosen=chosen, bw=bw, loc=loc),
            )
            chosen.append(nxt)
        pairs = list(itertools.combinations(chosen, 2))
        key = (
            -max(loc[a, b] for a, b in pairs),
            min(bw[a, b] for a, b in pairs),
            sum(bw[a, b] for a, b in pairs),
            -mask_of(chosen),
        )
        if best_key is None or key > best_key:
            best, best_key = chosen, key
    return tuple(sorted(best or ()))


def _free_rdma(topology: NodeTopology, free_nics: Collection[str] | None) -> list[int]:
    return [
        pos
        for pos, nic in enumerate(topology.spec.nics)
        if nic.rdma and nic.health == "Healthy" and (free_nics is None or nic.name in free_nics)
    ]


def pick_nics(
    topology: NodeTopology,
    gpus: Sequence[int],
    scope: NICScope,
    *,
    free_nics: Collection[str] | None = None,
) -> list[str] | None:
    """RDMA NICs to give with `gpus` (Koordinator's device-joint-allocate), or None if impossible.

    - `SamePCIe`: one free RDMA NIC under each PCIe switch tree the GPUs span (a GPU with no known
      switch cannot be satisfied);
    - `SameNUMA`: one free RDMA NIC on each NUMA node the GPUs span;
    - `None`: no requirement: for each switch tree the GPUs span, the nearest free RDMA NIC not
      already taken (possibly fewer, possibly none: an empty list).
    Among several candidates the one under a chosen GPU's own switch wins, then the fastest, then
    the first by name. A scope is never silently downgraded.
    """
    if scope not in _SCOPES:
        raise ValueError(f"unknown NIC scope {scope!r}; allowed: SamePCIe, SameNUMA or None")
    spec = topology.spec
    res = Resolver(topology)
    free = _free_rdma(topology, free_nics)
    chosen_gpus = [spec.gpus[g] for g in sorted(set(gpus))]
    leaves = {g.pcie_switch for g in chosen_gpus}
    taken: list[int] = []

    def rank(pos: int) -> tuple[int, float, str]:
        nic = spec.nics[pos]
        return (0 if nic.pcie_switch in leaves else 1, -nic.bandwidth_gbps, nic.name)

    if scope == "SamePCIe":
        roots: list[str] = []
        for gpu in chosen_gpus:
            root = res.root(gpu.pcie_switch)
            if root is None:
                return None
            if root not in roots:
                roots.append(root)
        for root in roots:
            cands = [p for p in free if p not in taken and res.root(spec.nics[p].pcie_switch) == root]
            if not cands:
                return None
            taken.append(min(cands, key=rank))
    elif scope == "SameNUMA":
        for numa in dict.fromkeys(g.numa_node for g in chosen_gpus):
            cands = [p for p in free if p not in taken and numa >= 0 and spec.nics[p].numa_node == numa]
            if not cands:
                return None
            taken.append(min(cands, key=rank))
    else:
        anchors: dict[str | None, int] = {}
        for gpu in chosen_gpus:
            anchors.setdefault(res.root(gpu.pcie_switch), gpu.index)
        for gpu_index in anchors.values():
            cands = [p for p in free if p not in taken]
            if not cands:
                break
            gpu = spec.gpus[gpu_index]
            taken.append(min(cands, key=lambda p: (res.pcie_tier(gpu, spec.nics[p]), *rank(p))))
    return [spec.nics[p].name for p in taken]


def _eligible_gpus(topology: NodeTopology, scope: NICScope, free_nics: Collection[str] | None) -> int:
    """GPUs whose switch tree (SamePCIe) or NUMA node (SameNUMA) has a free RDMA NIC."""
    spec = topology.spec
    res = Resolver(topology)
    free = [spec.nics[p] for p in _free_rdma(topology, free_nics)]
    if scope == "SamePCIe":
        roots = {res.root(nic.pcie_switch) for nic in free} - {None}
        return mask_of(
            g.index for g in spec.gpus if g.pcie_switch is not None and res.root(g.pcie_switch) in roots
        )
    numas = {nic.numa_node for nic in free if nic.numa_node >= 0}
    return mask_of(g.index for g in spec.gpus if g.numa_node in numas)


@dataclass(frozen=True, slots=True)
class Selection:
    """GPUs (and NICs) chosen on one node, with the modelled ring bandwidth and worst link tier."""

    gpus: tuple[int, ...]
    mask: int
    nics: tuple[str, ...]
    bandwidth: float
    tier: LinkTier


def select(
    topology: NodeTopology,
    free: int,
    k: int,
    *,
    rdma: bool = False,
    nic_scope: NICScope = None,
    free_nics: Collection[str] | None = None,
    table: SubsetTable | None = None,
) -> Selection | None:
    """Pick k GPUs (table or greedy) and, when `rdma` or a `nic_scope` is given, their NICs.

    With a scope, if the best GPUs cannot get NICs in that scope, the pick is repeated among only
    the GPUs whose switch tree / NUMA node has a free RDMA NIC (exactly the feasible sets); None
    when that fails too.
    """
    n = topology.gpu_count
    if table is None and n <= MAX_TABLE_GPUS:
        table = table_for(topology)

    def choose(mask: int) -> tuple[int, ...] | None:
        return pick_gpus(table, mask, k) if table is not None else greedy_pick(topology, mask, k)

    gpus = choose(free)
    if gpus is None:
        return None
    nics: list[str] = []
    if rdma or nic_scope is not None:
        found = pick_nics(topology, gpus, nic_scope, free_nics=free_nics)
        if found is None:
            gpus = choose(free & _eligible_gpus(topology, nic_scope, free_nics))
            if gpus is None:
                return None
            found = pick_nics(topology, gpus, nic_scope, free_nics=free_nics)
            if found is None:  # pragma: no cover - eligible GPUs always satisfy the scope
                return None
        nics = found
    mask = mask_of(gpus)
    if table is not None:
        bandwidth, tier = float(table.ring[mask]), LinkTier(int(table.set_tier[mask]))
    else:
        bandwidth = best_ring(bandwidth_matrix(topology), gpus).bandwidth if gpus else math.inf
        res = Resolver(topology)
        ranks = [gpu_link(topology, a, b, resolver=res) for a in gpus for b in gpus if a < b]
        tier = max(ranks, key=lambda link: link.rank).tier if ranks else LinkTier.X
    return Selection(gpus=gpus, mask=mask, nics=tuple(nics), bandwidth=bandwidth, tier=tier)
