"""Topology placement quality on a busy and on an empty cluster: modelled all-reduce bandwidth vs the best.

A cluster of `dgx1-v100` and `dgx-a100` nodes (with their NodeTopology presets) receives random
arrivals and departures of jobs (Poisson arrivals, exponential lifetimes, load kept around 85 % of
the GPUs). Jobs come in the shapes users submit, each of 1/2/4/8 GPUs in all:

* `pod`: one pod of k GPUs;
* `workers`: k one-GPU worker pods (DDP / Horovod);
* `master+workers`: a one-GPU Master and k-1 one-GPU Workers (PyTorchJob);
* `ps+workers`: a CPU-only PS and k one-GPU Workers (TFJob; the PS must not pull the workers apart).

Every job is placed with the real `place()` on a `Snapshot` and assumed (one Reservation per pod),
once with the `default` profile and once with a topology-oblivious baseline (`first-fit`: first
node, lowest-index GPUs), on the same event sequence.

For each placed job of k >= 2 GPUs it records the modelled ring bandwidth of the GPUs its pods got
together (`SubsetTable.ring` of their union on the node) over the best possible at that moment (the
best k-subset on any node with k free GPUs: `table.bandwidth[free, k]`). A job split over nodes
although one node had room counts 0; a job no node could hold alone is left out of the ratio (its
split is unavoidable) and counted in `split_unavoidable`. Per shape it prints the mean and p10
ratio (target >= 0.95), the one-node share (where one node had room), and `place()` p50/p99 per
job; the GPU-selection time per chooser call (target < 20 us). The empty-cluster pass places each
shape of each size alone on the empty cluster.

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
from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.gangs.outcomes import Placement
from gpuyard.scheduler.gangs.requests import build_gang
from gpuyard.scheduler.placement.placing import place
from gpuyard.scheduler.placement.profiles import build_profile
from gpuyard.scheduler.placement.topology import free_masks
from tests.builders import make_node

SIZES = (1, 2, 4, 8)
WEIGHTS = (0.4, 0.3, 0.2, 0.1)
SHAPES = ("pod", "workers", "master+workers", "ps+workers")
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

    def choose(self, snapshot, row, shape, *, within=None):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        chooser = self.inner
        out = (
            chooser.choose(snapshot, row, shape)
            if within is None
            else chooser.choose(snapshot, row, shape, within=within)
        )  # type: ignore[attr-defined]
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


def _role(name: str, replicas: int, gpus: int) -> dict[str, object]:
    limits: dict[str, object] = {"cpu": "1", "memory": "1Gi"}
    if gpus:
        limits["nvidia.com/gpu"] = gpus
    return {
        "name": name,
        "replicas": replicas,
        "template": {"containers": [{"name": "m", "resources": {"limits": limits}}]},
    }


def _job(name: str, k: int, shape: str) -> PodGroup:
    """A job of `k` GPUs in all, in one of the SHAPES (k = 1 is always one one-GPU pod)."""
    if k == 1 or shape == "pod":
        roles = [_role("Worker", 1, k)]
    elif shape == "workers":
        roles = [_role("Worker", k, 1)]
    elif shape == "master+workers":
        roles = [_role("Master", 1, 1), _role("Worker", k - 1, 1)]
    else:
        roles = [_role("PS", 1, 0), _role("Worker", k, 1)]
    return PodGroup.model_validate(
        {"metadata": {"name": name, "namespace": "bench", "uid": name}, "spec": {"roles": roles}}
    )


def _events(jobs: int, nodes: int, seed: int) -> list[tuple[float, str, int, str, float]]:
    rng = np.random.default_rng(seed)
    mean_gpus = float(np.dot(SIZES, WEIGHTS))
    lifetime = 100.0
    rate = 0.85 * nodes * 8 / (mean_gpus * lifetime)  # Little's law: ~85 % of the GPUs busy
    t = 0.0
    out = []
    for i in range(jobs):
        t += float(rng.exponential(1.0 / rate))
        k = int(rng.choice(SIZES, p=WEIGHTS))
        shape = SHAPES[int(rng.integers(len(SHAPES)))]
        out.append((t, f"j{i}", k, shape, t + float(rng.exponential(lifetime))))
    return out


def _best_possible(snap: Snapshot, k: int) -> float:
    masks = free_masks(snap, slice(None), None)
    best = 0.0
    for tid, table in enumerate(snap.table_list):
        sel = snap.table_id == tid
        if sel.any():
            best = max(best, float(table.bandwidth[masks[sel], k].max()))
    return best


class Quality:
    """Per-shape figures of one pass."""

    def __init__(self) -> None:
        self.ratios: dict[str, list[float]] = {shape: [] for shape in SHAPES}
        self.one_node: dict[str, list[bool]] = {shape: [] for shape in SHAPES}
        self.unavoidable: dict[str, int] = dict.fromkeys(SHAPES, 0)

    def record(self, snap: Snapshot, result: Placement, *, shape: str, k: int, best: float) -> None:
        gpu_pods = [pp for pp in result.pods if pp.gpus]
        rows = {pp.row for pp in gpu_pods}
        if best <= 0:
            self.unavoidable[shape] += 1
            return
        self.one_node[shape].append(len(rows) == 1)
        if len(rows) != 1:
            self.ratios[shape].append(0.0)
            return
        table = snap.tables[gpu_pods[0].row]
        mask = sum(1 << g for pp in gpu_pods for g in pp.gpus)
        self.ratios[shape].append(float(table.ring[mask]) / best)  # type: ignore[union-attr]

    def summary(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for shape in SHAPES:
            r = self.ratios[shape]
            out[shape] = {
                "jobs": len(r),
                "bandwidth_ratio_mean": round(float(np.mean(r)), 4) if r else None,
                "bandwidth_ratio_p10": round(float(np.percentile(r, 10)), 4) if r else None,
                "one_node_share": round(float(np.mean(self.one_node[shape])), 4) if r else None,
                "split_unavoidable": self.unavoidable[shape],
            }
        return out


def _reserve(snap: Snapshot, result: Placement, name: str, rv: itertools.count) -> list[tuple[str, str]]:
    keys = []
    for pp in result.pods:
        res = Reservation(
            metadata=ObjectMeta(name=pp.pod.name, namespace="bench", resource_version=str(next(rv))),
            spec=ReservationSpec(
                pod_group=name,
                role=pp.pod.role,
                index=pp.pod.index,
                node=pp.node,
                gpus=list(pp.gpus),
                gpu_milli=1000 if pp.gpus else 0,
            ),
        )
        snap.upsert_reservation(res)
        keys.append(("bench", pp.pod.name))
    return keys


def run(
    profile_name: str, *, nodes: int, events: list[tuple[float, str, int, str, float]]
) -> dict[str, object]:
    snap = _cluster(nodes)
    profile = build_profile(profile_name)
    timed = TimedChooser(profile.chooser)
    profile.chooser = timed  # type: ignore[assignment]
    ends: list[tuple[float, list[tuple[str, str]]]] = []
    quality = Quality()
    place_s = []
    placed = rejected = 0
    rv = itertools.count(1)
    for t, name, k, shape, end in events:
        ends.sort(key=lambda e: e[0])
        while ends and ends[0][0] <= t:
            for key in ends.pop(0)[1]:
                snap.remove_reservation(key)
        pg = _job(name, k, shape)
        gang = build_gang([pg], placed={}, classes=snap.class_names)
        best = _best_possible(snap, k) if k > 1 else 0.0
        t0 = time.perf_counter()
        result = place(snap, gang, profile)
        place_s.append(time.perf_counter() - t0)
        if not isinstance(result, Placement):
            rejected += 1
            continue
        placed += 1
        ends.append((end, _reserve(snap, result, name, rv)))
        if k > 1:
            quality.record(snap, result, shape=shape, k=k, best=best)
    return {
        "profile": profile_name,
        "jobs_placed": placed,
        "jobs_waiting": rejected,
        "by_shape": quality.summary(),
        "gpu_selection_us_per_call": round(timed.seconds / max(timed.calls, 1) * 1e6, 2),
        "place_us_per_job_p50": round(float(np.percentile(place_s, 50)) * 1e6, 1),
        "place_us_per_job_p99": round(float(np.percentile(place_s, 99)) * 1e6, 1),
    }


def run_empty(profile_name: str, *, nodes: int) -> dict[str, object]:
    """Each shape of each size alone on the empty cluster."""
    quality = Quality()
    profile = build_profile(profile_name)
    for shape in SHAPES:
        for k in SIZES[1:]:
            snap = _cluster(nodes)
            gang = build_gang([_job(f"{shape}-{k}", k, shape)], placed={}, classes=snap.class_names)
            best = _best_possible(snap, k)
            result = place(snap, gang, profile)
            assert isinstance(result, Placement), result
            quality.record(snap, result, shape=shape, k=k, best=best)
    return {"profile": profile_name, "by_shape": quality.summary()}


def _worst(report: dict[str, object]) -> float:
    ratios = [
        v["bandwidth_ratio_mean"]  # type: ignore[index]
        for v in report["by_shape"].values()  # type: ignore[attr-defined]
        if v["bandwidth_ratio_mean"] is not None  # type: ignore[index]
    ]
    return min(ratios) if ratios else 0.0


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
    empty = run_empty("default", nodes=nodes)
    print(
        json.dumps(
            {
                "cluster": {
                    "nodes": nodes,
                    "presets": ["dgx1-v100", "dgx-a100"],
                    "jobs": jobs,
                    "sizes": SIZES,
                    "weights": WEIGHTS,
                    "shapes": SHAPES,
                },
                "busy": topo,
                "busy_first_fit_baseline": base,
                "empty": empty,
                "targets": {"bandwidth_ratio_mean": TARGET_RATIO, "gpu_selection_us_per_call": TARGET_US},
                "meets_targets": bool(
                    min(_worst(topo), _worst(empty)) >= TARGET_RATIO
                    and topo["gpu_selection_us_per_call"] < TARGET_US  # type: ignore[operator]
                ),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
