"""Preemption benchmark: the cost of one victim search and of one head plan on a full cluster.

A cluster of N 8-GPU nodes is filled with running jobs (1-, 2- and 4-GPU, random priorities
0..9 and start times); then the preemption engine looks for victims for an 8-GPU job of priority
10 (`select_victims`: vectorised pre-filter, at most 8 node plans and 64 placements), and for a
2 x 8-GPU gang. Prints JSON: per cluster size, the mean and max milliseconds of a search, the
placements tried and the victims chosen. Usage: `python bench/preemption.py [--small]`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuyard.apis.resourceclasses import default_class
from gpuyard.apis.scheduling import PodGroup
from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.gangs.outcomes import Placement
from gpuyard.scheduler.placement.profiles import build_profile
from gpuyard.scheduler.preemption.victims import Candidate, select_victims
from tests.unit.scheduler.helpers import assume_into, gang_of, make_node, place_one, podgroup, role


def _cluster(nodes: int, seed: int) -> tuple[Snapshot, list[Candidate]]:
    rng = random.Random(seed)
    snap = Snapshot.build(
        nodes=[make_node(f"n{i}", gpus=8) for i in range(nodes)],
        classes=[default_class("v100")],
        reservations=[],
        port_range=(20000, 30000),
    )
    candidates = []
    for i in range(nodes):
        free = 8
        j = 0
        while free:
            gpus = min(free, rng.choice([1, 2, 4]))
            name = f"j{i}-{j}"
            got = place_one(
                snap, podgroup(name, role(gpus=gpus, node_selector={"kubernetes.io/hostname": f"n{i}"}))
            )
            assert isinstance(got, Placement)
            assume_into(snap, got)
            candidates.append(
                Candidate(
                    key=("default", name),
                    priority=rng.randint(0, 9),
                    start_time=rng.uniform(0, 86400),
                    gpus=gpus,
                    gpu_hours_lost=gpus * rng.uniform(0, 24),
                )
            )
            free -= gpus
            j += 1
    return snap, candidates


def _measure(snap: Snapshot, candidates: list[Candidate], pg: PodGroup, repeats: int) -> dict[str, object]:
    profile = build_profile("default")
    gang = gang_of(snap, pg)
    times = []
    plan = None
    for _ in range(repeats):
        start = time.perf_counter()
        plan = select_victims(snap, gang, profile, candidates)
        times.append((time.perf_counter() - start) * 1e3)
    return {
        "mean_ms": round(sum(times) / len(times), 2),
        "max_ms": round(max(times), 2),
        "victims": len(plan.victims) if plan is not None else None,
        "highest_victim_priority": max(v.priority for v in plan.victims) if plan is not None else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="smaller clusters (CI)")
    args = parser.parse_args()
    sizes = [50, 200] if args.small else [100, 1000, 5000]
    sizes_out: dict[str, object] = {}
    out: dict[str, object] = {"benchmark": "preemption", "sizes": sizes_out}
    for n in sizes:
        snap, candidates = _cluster(n, seed=n)
        repeats = 3 if n >= 1000 else 5
        sizes_out[str(n)] = {
            "running_jobs": len(candidates),
            "one_8gpu_pod": _measure(snap, candidates, podgroup("urgent", role(gpus=8)), repeats),
            "gang_2x8gpu": _measure(snap, candidates, podgroup("urgent2", role(replicas=2, gpus=8)), repeats),
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
