"""Topology placement quality on busy clusters: how often gangs are split, how long they wait.

Each cluster mix (`dgx1`: DGX-1 V100 nodes, `dgx-a100`, `hgx-h100`, `mixed`: the three in turn;
every node with its NodeTopology preset, 4 nodes per network block labelled
`topology.gpuyard.io/block`) receives random arrivals and departures of jobs (Poisson arrivals,
exponential lifetimes of mean one hour, load around 85 % of the GPUs). Jobs come in the shapes
users submit, each of 1/2/4/8 GPUs in all:

* `pod`: one pod of k GPUs;
* `workers`: k one-GPU worker pods (DDP / Horovod);
* `master+workers`: a one-GPU Master and k-1 one-GPU Workers (PyTorchJob);
* `ps+workers`: a CPU-only PS and k one-GPU Workers (TFJob).

A job that does not fit waits in a FIFO queue; every waiting job is tried again (in arrival
order, later ones may pass) whenever a job arrives or ends. Every attempt is the real `place()`
on a `Snapshot`, assumed with one Reservation per pod. Each profile (`default`, `binpack`,
`first-fit`) sees the same arrivals; a job's own topology policy (`gpuyard.io/topology-policy`,
and for gangs of one-GPU workers the scheduler's default wait for one node,
`scheduler.topology_wait_seconds`) is applied as the scheduler applies it (`_wait_level`).
`--no-wait-while-others-wait` tries a rule the scheduler does not have: the default wait is not
kept while some other job waits for room (one whose last attempt left it unplaced, not within a
wait of its own), as measured in docs/scheduling.md ("What was tried and not kept").

Per shape and in all (gangs of k >= 2 GPUs), per profile, it reports:

* `split_nodes`: the share of placed gangs whose GPU pods span more than one node — every one,
  whether or not some node had room when it was placed (no exclusions);
* `split_blocks`: the share whose pods span more than one network block;
* `placed`, and `waiting` at the last arrival (the jobs still queued then), with
  `jobs_waiting_by_choice` (of those, the gangs still within their wait for one node that would
  fit now if they were split: waiting by their own choice, not for room) and
  `waiting_jobs` (their sizes and shapes);
* `idle_gpus_while_queued`: the time-average, over the run, of the GPUs left idle while some job
  waits (a job waiting by its own choice leaves the GPUs it could have used idle);
* `waited_then_whole` / `waited_then_split`: gangs refused while they waited for one node, then
  placed on one node / split (a wait that did not pay off);
* `wait_mean_s`, `wait_p95_s`: the wait (seconds) of the placed multi-GPU gangs.

Figures are given per seed, as the mean over the seeds and as the worst seed (the largest split
share, the most waiting). The old headline is kept, labelled for what it is
(`old_headline_excluding_unavoidable`): the modelled ring bandwidth of a gang's GPUs over the best
possible at that moment and the one-node share, counting only the gangs that one node could hold
alone when they were placed.

Usage: `python bench/topology_quality.py [--nodes 32] [--jobs 4000] [--seeds 1-3] [--mixes all]
[--profiles default,binpack,first-fit] [--small]`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuyard.apis.devicematching import LABEL_BLOCK
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.resourceclasses import default_class
from gpuyard.apis.scheduling import PodGroup, Reservation, ReservationSpec
from gpuyard.devices.presets import get_preset
from gpuyard.scheduler.cache.snapshot import Snapshot
from gpuyard.scheduler.gangs.outcomes import Placement
from gpuyard.scheduler.gangs.requests import GPU_MILLI, GangRequest, build_gang
from gpuyard.scheduler.placement.placing import place
from gpuyard.scheduler.placement.profiles import build_profile
from gpuyard.scheduler.placement.topology import free_masks
from tests.builders import make_node

SIZES = (1, 2, 4, 8)
WEIGHTS = (0.4, 0.3, 0.2, 0.1)
SHAPES = ("pod", "workers", "master+workers", "ps+workers")
GANG_SHAPES = SHAPES[1:]
PROFILES = ("default", "binpack", "first-fit")
MIXES: dict[str, tuple[tuple[str, str], ...]] = {
    "dgx1": (("dgx1-v100", "v100"),),
    "dgx-a100": (("dgx-a100", "a100"),),
    "hgx-h100": (("hgx-h100", "h100"),),
    "mixed": (("dgx1-v100", "v100"), ("dgx-a100", "a100"), ("hgx-h100", "h100")),
}
NODES_PER_BLOCK = 4
LIFETIME_S = 3600.0
LOAD = 0.85

Event = tuple[float, str, int, str, float]  # arrival, name, GPUs, shape, lifetime


def _cluster(nodes: int, mix: str) -> Snapshot:
    built, topos, models = [], {}, set()
    kinds = MIXES[mix]
    for i in range(nodes):
        preset, model = kinds[i % len(kinds)]
        name = f"n{i:03d}"
        labels = {LABEL_BLOCK: f"b{i // NODES_PER_BLOCK}"}
        built.append(make_node(name, model=model, cpu="256", memory="2048Gi", labels=labels))
        topos[name] = get_preset(preset, node_name=name)
        models.add(model)
    return Snapshot.build(nodes=built, topologies=topos, classes=[default_class(m) for m in sorted(models)])


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


def _events(jobs: int, nodes: int, seed: int) -> list[Event]:
    rng = np.random.default_rng(seed)
    mean_gpus = float(np.dot(SIZES, WEIGHTS))
    rate = LOAD * nodes * 8 / (mean_gpus * LIFETIME_S)  # Little's law: ~85 % of the GPUs busy
    t = 0.0
    out = []
    for i in range(jobs):
        t += float(rng.exponential(1.0 / rate))
        k = int(rng.choice(SIZES, p=WEIGHTS))
        shape = SHAPES[int(rng.integers(len(SHAPES)))]
        out.append((t, f"j{i}", k, shape, float(rng.exponential(LIFETIME_S))))
    return out


def _best_possible(snap: Snapshot, k: int) -> float:
    masks = free_masks(snap, slice(None), None)
    best = 0.0
    for tid, table in enumerate(snap.table_list):
        sel = snap.table_id == tid
        if sel.any() and k <= table.n:
            best = max(best, float(table.bandwidth[masks[sel] & ((1 << table.n) - 1), k].max()))
    return best


@dataclass
class Figures:
    """What one pass (profile, mix, seed) measured."""

    placed: int = 0
    waiting: int = 0
    gangs: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SHAPES, 0))
    split_nodes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SHAPES, 0))
    split_blocks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SHAPES, 0))
    waits: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in SHAPES})
    ratios: list[float] = field(default_factory=list)
    pod_ratios: list[float] = field(default_factory=list)  # the `pod` shape's (one multi-GPU pod)
    one_node: list[bool] = field(default_factory=list)
    unavoidable: int = 0
    waited_for_node: int = 0
    waited_then_whole: int = 0  # gangs refused while waiting for one node, later placed on one node
    waited_then_split: int = 0  # ... later placed split (their wait did not pay off)
    waiting_by_choice: int = 0  # of `waiting`: gangs within their wait for one node that would fit split
    waiting_shapes: dict[str, int] = field(default_factory=dict)  # of `waiting`: "k-GPU shape" -> count
    idle_queued_gpu_s: float = 0.0  # GPU-seconds idle while some job was waiting
    span_s: float = 0.0  # first to last arrival
    place_s: list[float] = field(default_factory=list)

    def record(
        self, snap: Snapshot, result: Placement, *, shape: str, k: int, best: float, wait: float
    ) -> None:
        self.placed += 1
        if k < 2:
            return
        gpu_pods = [pp for pp in result.pods if pp.gpus]
        rows = {pp.row for pp in gpu_pods}
        blocks = {int(snap.block[r]) for r in rows}
        self.gangs[shape] += 1
        self.split_nodes[shape] += len(rows) > 1
        self.split_blocks[shape] += len(blocks) > 1
        self.waits[shape].append(wait)
        if best <= 0:
            self.unavoidable += 1
            return
        self.one_node.append(len(rows) == 1)
        if len(rows) != 1:
            self.ratios.append(0.0)
            return
        table = snap.tables[gpu_pods[0].row]
        mask = sum(1 << g for pp in gpu_pods for g in pp.gpus)
        self.ratios.append(float(table.ring[mask]) / best)  # type: ignore[union-attr]
        if shape == "pod":
            self.pod_ratios.append(self.ratios[-1])

    def summary(self) -> dict[str, object]:
        def share(num: int, den: int) -> float | None:
            return round(num / den, 4) if den else None

        def waits(values: list[float]) -> dict[str, float | None]:
            if not values:
                return {"wait_mean_s": None, "wait_p95_s": None}
            return {
                "wait_mean_s": round(float(np.mean(values)), 1),
                "wait_p95_s": round(float(np.percentile(values, 95)), 1),
            }

        by_shape: dict[str, object] = {}
        for shape in SHAPES:
            n = self.gangs[shape]
            by_shape[shape] = {
                "placed": n,
                "split_nodes": share(self.split_nodes[shape], n),
                "split_blocks": share(self.split_blocks[shape], n),
                **waits(self.waits[shape]),
            }
        n_all = sum(self.gangs[s] for s in GANG_SHAPES)
        every_wait = [w for s in SHAPES for w in self.waits[s]]
        return {
            "jobs_placed": self.placed,
            "jobs_waiting": self.waiting,
            "jobs_waiting_by_choice": self.waiting_by_choice,
            "idle_gpus_while_queued": round(self.idle_queued_gpu_s / self.span_s, 2) if self.span_s else None,
            "waiting_jobs": dict(sorted(self.waiting_shapes.items())),
            "gangs": {
                "placed": n_all,
                "split_nodes": share(sum(self.split_nodes[s] for s in GANG_SHAPES), n_all),
                "split_blocks": share(sum(self.split_blocks[s] for s in GANG_SHAPES), n_all),
                "split_nodes_count": sum(self.split_nodes[s] for s in GANG_SHAPES),
                "waited_for_one_node": self.waited_for_node,
                "waited_then_whole": self.waited_then_whole,
                "waited_then_split": self.waited_then_split,
            },
            "multi_gpu": waits(every_wait),
            "by_shape": by_shape,
            "old_headline_excluding_unavoidable": {
                "note": "ring bandwidth over the best possible and one-node share, counting only "
                "gangs one node could hold alone when placed",
                "bandwidth_ratio_mean": round(float(np.mean(self.ratios)), 4) if self.ratios else None,
                "one_node_share": round(float(np.mean(self.one_node)), 4) if self.one_node else None,
                "pod_bandwidth_ratio_mean": round(float(np.mean(self.pod_ratios)), 4)
                if self.pod_ratios
                else None,
                "split_unavoidable_left_out": self.unavoidable,
            },
            "place_us_p50": round(float(np.percentile(self.place_s, 50)) * 1e6, 1) if self.place_s else None,
            "place_us_p99": round(float(np.percentile(self.place_s, 99)) * 1e6, 1) if self.place_s else None,
        }


@dataclass
class _Waiting:
    arrival: float
    name: str
    k: int
    shape: str
    lifetime: float
    gang: GangRequest


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


def _wait_level(job: _Waiting, *, now: float, wait_s: float, others_wait: bool = False) -> str | None:
    """The level a job is placed at now: "node" while a gang of one-GPU workers is within the
    scheduler's default wait for one node (the default profile only), else None (preferred).
    `others_wait`: some other job waits for room and the wait is not kept then (`run`)."""
    if wait_s <= 0 or job.k < 2 or job.shape == "pod" or now >= job.arrival + wait_s:
        return None  # the same sum as the wake-up: `now - arrival < wait` may round otherwise and spin
    return None if others_wait else "node"


def run(
    profile_name: str,
    *,
    nodes: int,
    mix: str,
    events: list[Event],
    wait_s: float = 0.0,
    yield_wait: bool = False,
) -> Figures:
    """One pass of `events` through `profile_name` on a fresh `mix` cluster (see module doc).
    `yield_wait`: the default wait for one node is not kept while some other job waits for room
    (a rule tried, not the scheduler's)."""
    snap = _cluster(nodes, mix)
    profile = build_profile(profile_name)
    figures = Figures()
    ends: list[tuple[float, int, list[tuple[str, str]]]] = []
    queue: list[_Waiting] = []
    rv = itertools.count(1)
    seq = itertools.count()
    wakeups: list[float] = []
    refused_at_node: set[str] = set()  # gangs refused while they waited for one node
    idle_since: list[float] = [0.0, 0.0]  # (time, GPUs idle while something waits) since the last drain
    room: set[str] = set()  # jobs whose last attempt left them waiting for room (not within their own wait)

    def drain(now: float) -> None:
        figures.idle_queued_gpu_s += (now - idle_since[0]) * idle_since[1]
        failed: set[tuple[int, str, str | None]] = set()  # signatures that did not fit since the last change
        keep = []
        for job in queue:
            others = yield_wait and len(room) > (job.name in room)
            level = _wait_level(job, now=now, wait_s=wait_s, others_wait=others)
            sig = (job.k, job.shape, level)
            if sig in failed:
                keep.append(job)
                if level is None:
                    room.add(job.name)
                continue
            job.gang.topology_required = level
            t0 = time.perf_counter()
            result = place(snap, job.gang, profile)
            figures.place_s.append(time.perf_counter() - t0)
            # place() leaves the snapshot as it was: the best possible is measured on the same state
            best = _best_possible(snap, job.k) if job.k > 1 and isinstance(result, Placement) else 0.0
            if not isinstance(result, Placement):
                failed.add(sig)
                keep.append(job)
                if level is not None:
                    wakeups.append(job.arrival + wait_s)
                    refused_at_node.add(job.name)
                    room.discard(job.name)  # within its own wait: not waiting for room
                else:
                    room.add(job.name)
                continue
            room.discard(job.name)
            figures.waited_for_node += level is not None and now > job.arrival
            if job.name in refused_at_node:
                refused_at_node.discard(job.name)
                split = len({pp.row for pp in result.pods if pp.gpus}) > 1
                figures.waited_then_split += split
                figures.waited_then_whole += not split
            figures.record(snap, result, shape=job.shape, k=job.k, best=best, wait=now - job.arrival)
            ends.append((now + job.lifetime, next(seq), _reserve(snap, result, job.name, rv)))
            ends.sort()
        queue[:] = keep
        idle_since[:] = [now, float((snap.gpu_free_milli == GPU_MILLI).sum()) if queue else 0.0]

    for t, name, k, shape, lifetime in events:
        while (ends and ends[0][0] <= t) or (wakeups and min(wakeups) <= t):
            end_t = ends[0][0] if ends else float("inf")
            wake_t = min(wakeups) if wakeups else float("inf")
            now = min(end_t, wake_t)
            if end_t <= wake_t:
                for key in ends.pop(0)[2]:
                    snap.remove_reservation(key)
            wakeups[:] = [w for w in wakeups if w > now]
            drain(now)
        gang = build_gang([_job(name, k, shape)], placed={}, classes=snap.class_names)
        queue.append(_Waiting(t, name, k, shape, lifetime, gang))
        drain(t)
    figures.waiting = len(queue)
    figures.span_s = events[-1][0] - events[0][0] if events else 0.0
    last = events[-1][0] if events else 0.0
    for job in queue:  # within its wait, and it would fit now if it were split: waiting by its own choice
        others = yield_wait and len(room) > (job.name in room)
        if _wait_level(job, now=last, wait_s=wait_s, others_wait=others) is not None:
            job.gang.topology_required = None
            figures.waiting_by_choice += isinstance(place(snap, job.gang, profile), Placement)
    for job in queue:
        key = f"{job.k}-GPU {job.shape if job.k > 1 else 'pod'}"
        figures.waiting_shapes[key] = figures.waiting_shapes.get(key, 0) + 1
    return figures


def _seeds(raw: str) -> list[int]:
    out: list[int] = []
    for part in raw.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _aggregate(per_seed: dict[int, dict[str, object]]) -> dict[str, object]:
    """Mean over the seeds and the worst seed (the largest split share, then the most waiting)."""

    def get(s: dict[str, object], *path: str) -> float:
        v: object = s
        for p in path:
            v = v[p]  # type: ignore[index]
        return float(v or 0.0)  # type: ignore[arg-type]

    runs = list(per_seed.values())
    worst_seed = max(
        per_seed, key=lambda s: (get(per_seed[s], "gangs", "split_nodes"), get(per_seed[s], "jobs_waiting"))
    )
    mean = {
        "split_nodes": round(float(np.mean([get(r, "gangs", "split_nodes") for r in runs])), 4),
        "split_blocks": round(float(np.mean([get(r, "gangs", "split_blocks") for r in runs])), 4),
        "jobs_placed": round(float(np.mean([get(r, "jobs_placed") for r in runs])), 1),
        "jobs_waiting": round(float(np.mean([get(r, "jobs_waiting") for r in runs])), 1),
        "jobs_waiting_by_choice": round(float(np.mean([get(r, "jobs_waiting_by_choice") for r in runs])), 1),
        "idle_gpus_while_queued": round(float(np.mean([get(r, "idle_gpus_while_queued") for r in runs])), 2),
        "waited_then_whole": round(float(np.mean([get(r, "gangs", "waited_then_whole") for r in runs])), 1),
        "waited_then_split": round(float(np.mean([get(r, "gangs", "waited_then_split") for r in runs])), 1),
        "wait_mean_s": round(float(np.mean([get(r, "multi_gpu", "wait_mean_s") for r in runs])), 1),
        "wait_p95_s": round(float(np.mean([get(r, "multi_gpu", "wait_p95_s") for r in runs])), 1),
        "old_headline_bandwidth_ratio": round(
            float(
                np.mean([get(r, "old_headline_excluding_unavoidable", "bandwidth_ratio_mean") for r in runs])
            ),
            4,
        ),
        "pod_bandwidth_ratio": round(
            float(
                np.mean(
                    [get(r, "old_headline_excluding_unavoidable", "pod_bandwidth_ratio_mean") for r in runs]
                )
            ),
            4,
        ),
        "by_shape_split_nodes": {
            s: round(float(np.mean([get(r, "by_shape", s, "split_nodes") for r in runs])), 4)
            for s in GANG_SHAPES
        },
    }
    w = per_seed[worst_seed]
    worst = {
        "seed": worst_seed,
        "split_nodes": get(w, "gangs", "split_nodes"),
        "split_blocks": get(w, "gangs", "split_blocks"),
        "jobs_waiting": get(w, "jobs_waiting"),
        "wait_p95_s": get(w, "multi_gpu", "wait_p95_s"),
        "most_waiting_any_seed": max(get(r, "jobs_waiting") for r in runs),
        "largest_split_nodes_any_seed": max(get(r, "gangs", "split_nodes") for r in runs),
    }
    return {"mean": mean, "worst": worst}


def _table(results: dict[str, dict[str, dict[str, object]]]) -> str:
    lines = [
        "mix        profile    split nodes (worst)  split blocks  placed   waiting (worst) [by choice]"
        "  wait mean/p95 s  pod bw",
    ]
    for mix, by_profile in results.items():
        for prof, entry in by_profile.items():
            m, w = entry["mean"], entry["worst"]  # type: ignore[index]
            lines.append(
                f"{mix:<10} {prof:<10} {m['split_nodes']:.3f} ({w['largest_split_nodes_any_seed']:.3f})"  # type: ignore[index]
                f"        {m['split_blocks']:.3f}         {m['jobs_placed']:<8} "  # type: ignore[index]
                f"{m['jobs_waiting']:<5} ({w['most_waiting_any_seed']:g}) [{m['jobs_waiting_by_choice']:g}]"  # type: ignore[index]
                f"       {m['wait_mean_s']:g}/{m['wait_p95_s']:g}"  # type: ignore[index]
                f"  {m['pod_bandwidth_ratio']:.2f}"  # type: ignore[index]
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--seeds", default="1-3", help="numbers and ranges, e.g. 1-3")
    parser.add_argument("--mixes", default="all", help=f"comma-separated of {', '.join(MIXES)}, or all")
    parser.add_argument("--profiles", default=",".join(PROFILES))
    parser.add_argument(
        "--wait",
        type=float,
        default=None,
        help="seconds a gang of one-GPU workers waits for one node under the default profile "
        "(default: the scheduler's setting, scheduler.topology_wait_seconds)",
    )
    parser.add_argument(
        "--no-wait-while-others-wait",
        action="store_true",
        help="a rule tried, not the scheduler's: the default profile's gangs give up their one-node "
        "wait while some other job waits for room",
    )
    parser.add_argument("--small", action="store_true", help="CI size: 8 nodes, 300 jobs, seed 1")
    args = parser.parse_args()
    nodes, jobs, seeds = (8, 300, [1]) if args.small else (args.nodes, args.jobs, _seeds(args.seeds))
    mixes = list(MIXES) if args.mixes == "all" else args.mixes.split(",")
    profiles = args.profiles.split(",")
    wait_s = _default_wait() if args.wait is None else args.wait
    results: dict[str, dict[str, dict[str, object]]] = {}
    t0 = time.perf_counter()
    for mix in mixes:
        results[mix] = {}
        for prof in profiles:
            per_seed = {}
            for seed in seeds:
                events = _events(jobs, nodes, seed)
                figs = run(
                    prof,
                    nodes=nodes,
                    mix=mix,
                    events=events,
                    wait_s=wait_s if prof == "default" else 0.0,
                    yield_wait=args.no_wait_while_others_wait,
                )
                per_seed[seed] = figs.summary()
            results[mix][prof] = {**_aggregate(per_seed), "per_seed": per_seed}
    print(_table(results), file=sys.stderr)
    print(
        json.dumps(
            {
                "cluster": {
                    "nodes": nodes,
                    "nodes_per_block": NODES_PER_BLOCK,
                    "mixes": {m: [p for p, _ in MIXES[m]] for m in mixes},
                    "jobs": jobs,
                    "seeds": seeds,
                    "sizes": SIZES,
                    "weights": WEIGHTS,
                    "shapes": SHAPES,
                    "load": LOAD,
                    "lifetime_mean_s": LIFETIME_S,
                    "default_profile_one_node_wait_s": wait_s,
                    "wait_given_up_while_others_wait_for_room": args.no_wait_while_others_wait,
                },
                "results": results,
                "total_s": round(time.perf_counter() - t0, 1),
            },
            indent=1,
        )
    )


def _default_wait() -> float:
    """The scheduler's default `scheduler.topology_wait_seconds`."""
    from gpuyard.state.config import SchedulerConfig

    return float(SchedulerConfig().topology_wait_seconds)


if __name__ == "__main__":
    main()
