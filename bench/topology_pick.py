"""Topology benchmark: subset-table build time per preset and the cost of one GPU selection.

Prints JSON: per preset, the table build time (best of a few uncached builds), the mean time of
`pick` / `pick_gpus` over N random (free mask, k) lookups, the per-lookup time of the vectorised
`pick_many`, the mean time of `select` with SamePCIe NICs, and of the >8-GPU greedy fallback.
Target: < 20 us per GPU selection. Usage: `python bench/topology_pick.py [--lookups N] [--small]`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuyard.apis.devices import GPUDevice, NodeTopology, NodeTopologySpec
from gpuyard.devices import PRESETS, build_table, get_preset, greedy_pick, pick, pick_gpus, pick_many, select

TARGET_US = 20.0


def _build_ms(preset: str, repeats: int) -> float:
    topo = get_preset(preset)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        build_table(topo)
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def _per_call_us(func, args: list[tuple[int, int]], table) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    for free, k in args:
        func(table, free, k)
    return (time.perf_counter() - start) / len(args) * 1e6


def _bench_preset(preset: str, *, lookups: int, repeats: int, rng: random.Random) -> dict[str, float]:
    topo = get_preset(preset)
    table = build_table(topo)
    n = topo.gpu_count
    args = [(rng.randrange(1 << n), rng.randint(1, n)) for _ in range(lookups)]
    frees = np.array([a for a, _ in args], dtype=np.int64)
    ks = np.array([k for _, k in args], dtype=np.int64)
    start = time.perf_counter()
    pick_many(table, frees, ks)
    many_us = (time.perf_counter() - start) / lookups * 1e6
    sel_args = args[: max(1, lookups // 10)]
    start = time.perf_counter()
    for free, k in sel_args:
        select(topo, free, k, nic_scope="SamePCIe", table=table)
    select_us = (time.perf_counter() - start) / len(sel_args) * 1e6
    return {
        "gpus": n,
        "table_build_ms": round(_build_ms(preset, repeats), 3),
        "pick_us": round(_per_call_us(pick, args, table), 3),
        "pick_gpus_us": round(_per_call_us(pick_gpus, args, table), 3),
        "pick_many_us_per_lookup": round(many_us, 4),
        "select_samepcie_us": round(select_us, 2),
    }


def _greedy_us(lookups: int, rng: random.Random) -> float:
    """16 GPUs (two NVSwitch islands of 8): no table, the greedy fallback."""
    gpus = [
        GPUDevice(
            index=i,
            model="NVIDIA-A100",
            numa_node=i // 8,
            socket=i // 8,
            nvlink_peers={j: 12 for j in range(16) if j != i and j // 8 == i // 8},
        )
        for i in range(16)
    ]
    topo = NodeTopology(spec=NodeTopologySpec(gpus=gpus, sockets=2))
    args = [(rng.randrange(1 << 16), rng.randint(1, 8)) for _ in range(lookups)]
    start = time.perf_counter()
    for free, k in args:
        greedy_pick(topo, free, k)
    return (time.perf_counter() - start) / lookups * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lookups", type=int, default=100_000)
    parser.add_argument("--small", action="store_true", help="CI-sized run (10,000 lookups)")
    opts = parser.parse_args()
    lookups = 10_000 if opts.small else opts.lookups
    repeats = 2 if opts.small else 5
    rng = random.Random(20240601)
    presets = {p: _bench_preset(p, lookups=lookups, repeats=repeats, rng=rng) for p in PRESETS}
    worst = max(max(r["pick_gpus_us"], r["pick_us"]) for r in presets.values())
    print(
        json.dumps(
            {
                "benchmark": "topology_pick",
                "lookups_per_preset": lookups,
                "presets": presets,
                "greedy_16gpu_us": round(_greedy_us(max(10, lookups // 1000), rng), 1),
                "worst_pick_us": worst,
                "target_pick_us": TARGET_US,
                "meets_target": worst < TARGET_US,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
