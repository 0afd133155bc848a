"""Topology placement quality on a busy cluster: modelled all-reduce bandwidth vs the best possible.

A cluster of `dgx1-v100` and `dgx-a100` nodes (with their NodeTopology presets) receives random
arrivals and departures of 1/2/4/8-GPU single-pod jobs (Poisson arrivals, exponential lifetimes,
load kept around 85 % of the GPUs). Every job is placed with the real `place()` on a `Snapshot`
and assumed (Reservation recorded), once with the `default` profile (topology chooser + scores)
and once with a topology-oblivious baseline (`first-fit` profile: first node, lowest-index GPUs),
on the same event sequence.

For each placed multi-GPU job it records the modelled ring bandwidth of the GPUs it got
(`SubsetTable.ring`) and the best possible at that moment (the best k-subset over every node with
k free GPUs: `table.bandwidth[free, k]`, the exact optimum for the free mask). Prints JSON: mean
ratio (target >= 0.95), share of multi-GPU jobs whose GPUs are all NVLink-connected, GPU-selection
time per pod (the chooser call inside `place`, target < 20 us) and `place()` time per job.

Usage: `python bench/topology_quality.py [--nodes 32] [--jobs 4000] [--seed 1] [--small]`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.resourceclasses import default_class
from gpuyard.apis.scheduling import PodGroup, Reservation, ReservationSpec
from gpuyard.devices.presets import get_preset
from gpuyard.devices.tiers import LinkTier
from gpuyard.scheduler.gang_requests import build_gang
from gpuyard.scheduler.outcomes import Placement
from gpuyard.scheduler.placing import place
from gpuyard.scheduler.profiles import build_profile
from gpuyard.scheduler.snapshot import Snapshot
from gpuyard.scheduler.topology import free_masks
from tests.builders import make_node

SIZES = (1, 2, 4, 8)
WEIGHTS = (0.4, 0.3, 0.2, 0.1)
TARGET_RATIO = 0.95
TARGET_US = 20.0


class TimedChooser:
    """Wraps a profile's GPU chooser to time every call."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[attr-defined]
        self.seconds = 0.0
        self.calls = 0
        self.refusals = getattr(inner, "refusals", {})

    def reset(self) -> None:
        reset = getattr(self.inner, "reset", None)
        if reset is not None:
            reset()

    def choose(self, snapshot, row, shape):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        out = self.inner.choose(snapshot, row, shape)  # type: ignore[attr-defined]
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return out


def _cluster(nodes: int) -> Snapshot:
    built, topos = [], {}
    for i in range(nodes):
        preset, model = ("dgx1-v100", "v100") if i % 2 == 0 else ("dgx-a100", "a100")
        name = f"n{i:03d}"
        built.append(make_node(name, model=model, cpu="256", memory="2048Gi"))
        topos[name] = get_preset(preset, node_name=name)
    return Snapshot.build(
        nodes=built, topologies=topos, classes=[default_class("v100"), default_class("a100")]
    )


def _job(name: str, k: int) -> PodGroup:
    limits = {"nvidia.com/gpu": k, "cpu": "1", "memory": "1Gi"}
    return PodGroup.model_validate(
        {
            "metadata": {"name": name, "namespace": "bench", "uid": name},
            "spec": {
                "roles": [
                    {
                        "name": "Worker",
                        "replicas": 1,
                        "template": {"containers": [{"name": "m", "resources": {"limits": limits}}]},
                    }
                ]
            },
        }
    )


def _events(jobs: int, nodes: int, seed: int) -> list[tuple[float, str, int, float]]:
    rng = np.random.default_rng(seed)
    mean_gpus = float(np.dot(SIZES, WEIGHTS))
    lifetime = 100.0
    rate = 0.85 * nodes * 8 / (mean_gpus * lifetime)  # Little's law: ~85 % of the GPUs busy
    t = 0.0
    out = []
    for i in range(jobs):
        t += float(rng.exponential(1.0 / rate))
        k = int(rng.choice(SIZES, p=WEIGHTS))
        out.append((t, f"j{i}", k, t + float(rng.exponential(lifetime))))
    return out


def _best_possible(snap: Snapshot, k: int) -> float:
    masks = free_masks(snap, slice(None), None)
    best = 0.0
    for tid, table in enumerate(snap.table_list):
        sel = snap.table_id == tid
        if sel.any():
            best = max(best, float(table.bandwidth[masks[sel], k].max()))
    return best


def run(profile_name: str, *, nodes: int, events: list[tuple[float, str, int, float]]) -> dict[str, object]:
    snap = _cluster(nodes)
    profile = build_profile(profile_name)
    timed = TimedChooser(profile.chooser)
    profile.chooser = timed  # type: ignore[assignment]
    ends: list[tuple[float, tuple[str, str]]] = []
    ratios, nvlinked, place_s = [], [], []
    placed = rejected = 0
    rv = itertools.count(1)
    for t, name, k, end in events:
        ends.sort()
        while ends and ends[0][0] <= t:
            snap.remove_reservation(ends.pop(0)[1])
        pg = _job(name, k)
        gang = build_gang([pg], placed={}, classes=snap.class_names)
        best = _best_possible(snap, k) if k > 1 else 0.0
        t0 = time.perf_counter()
        result = place(snap, gang, profile)
        place_s.append(time.perf_counter() - t0)
        if not isinstance(result, Placement):
            rejected += 1
            continue
        placed += 1
        pp = result.pods[0]
        res = Reservation(
            metadata=ObjectMeta(name=pp.pod.name, namespace="bench", resource_version=str(next(rv))),
            spec=ReservationSpec(
                pod_group=name, role="Worker", index=0, node=pp.node, gpus=list(pp.gpus), gpu_milli=1000
            ),
        )
        snap.upsert_reservation(res)
        ends.append((end, ("bench", pp.pod.name)))
        if k > 1:
            table = snap.tables[pp.row]
            mask = sum(1 << g for g in pp.gpus)
            got = float(table.ring[mask])  # type: ignore[union-attr]
            ratios.append(got / best if best > 0 else 1.0)
            nvlinked.append(int(table.set_tier[mask]) == LinkTier.NV)  # type: ignore[union-attr]
    return {
        "profile": profile_name,
        "jobs_placed": placed,
        "jobs_waiting": rejected,
        "multi_gpu_jobs": len(ratios),
        "bandwidth_ratio_mean": round(float(np.mean(ratios)), 4) if ratios else None,
        "bandwidth_ratio_p10": round(float(np.percentile(ratios, 10)), 4) if ratios else None,
        "nvlink_connected_share": round(float(np.mean(nvlinked)), 4) if nvlinked else None,
        "gpu_selection_us_per_pod": round(timed.seconds / max(timed.calls, 1) * 1e6, 2),
        "place_us_per_job": round(float(np.mean(place_s)) * 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--small", action="store_true", help="CI size: 8 nodes, 500 jobs")
    args = parser.parse_args()
    nodes, jobs = (8, 500) if args.small else (args.nodes, args.jobs)
    events = _events(jobs, nodes, args.seed)
    topo = run("default", nodes=nodes, events=events)
    base = run("first-fit", nodes=nodes, events=events)
    print(
        json.dumps(
            {
                "cluster": {
                    "nodes": nodes,
                    "presets": ["dgx1-v100", "dgx-a100"],
                    "jobs": jobs,
                    "sizes": SIZES,
                    "weights": WEIGHTS,
                },
                "topology": topo,
                "first_fit_baseline": base,
                "targets": {"bandwidth_ratio_mean": TARGET_RATIO, "gpu_selection_us_per_pod": TARGET_US},
                "meets_targets": bool(
                    (topo["bandwidth_ratio_mean"] or 0) >= TARGET_RATIO
                    and topo["gpu_selection_us_per_pod"] < TARGET_US  # type: ignore[operator]
                ),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
