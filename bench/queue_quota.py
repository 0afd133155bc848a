"""Queue + elastic quota benchmark in the shape of Kueue's scheduler performance test, as JSON.

Kueue's test (test/performance/scheduler): 5 cohorts x 6 ClusterQueues that may borrow from
their cohort, 15,000 workloads of three sizes created over time; Kueue reports about 351 s for
the run. Here:

* the quota tree: 5 parent ElasticQuotas (`cohort-0..4`, min 120 GPUs, max the cluster) with
  6 leaves each (`cN-qM`, min 20 GPUs, max the cluster: borrowing allowed, lending allowed),
  one Queue per leaf (weight 1, BestEffortFIFO), one namespace per leaf covered by its quota;
* the cluster: 75 nodes x 8 GPUs = 600 GPUs, the sum of the leaves' min;
* 15,000 one-pod jobs (500 per leaf): 60 % small (1 GPU, 60 s), 30 % medium (4 GPUs, 120 s),
  10 % large (8 GPUs, 300 s), arriving as a Poisson stream over 3,000 virtual seconds (the
  demand is about 10x what the cluster can run in that time, so queues and borrowing matter);
* the real `SchedulerLoop` (watch, snapshot, FairQueue, quota admission, reclaim, `place()`,
  assume, statuses) on a `VirtualClock`; PodGroups are created directly (no job operator and no
  simulated kubelet: at this size they would dominate the time), and a job "ends" when its
  duration has passed since it was admitted: its PodGroup is deleted (the scheduler collects its
  Reservations). A job preempted by reclaim is asked to stop (`status.evictions`); the benchmark
  plays the operator and releases those Reservations (`spec.release`) at once. It waits again;
  its earlier admission does not count.

    .venv/bin/python bench/queue_quota.py            # full size (15,000 jobs)
    .venv/bin/python bench/queue_quota.py --small    # CI size (1,500 jobs, 300 virtual seconds)
    .venv/bin/python bench/queue_quota.py --jobs 150 # 150 jobs per leaf (4,500), 900 virtual s

Prints one JSON object: wall seconds of the whole run, virtual seconds simulated, mean / p50 /
p95 time-to-admission per size class (virtual seconds, first admission), the minimum over
samples (taken after each arrival/end instant, once the scheduler is idle) of a leaf's used/min
while its demand (status.request) is at least its min (1.0 means every leaf with work always had
its guarantee), with the 5th percentile, mean and the share of samples below min, scheduling cycles per wall second, jobs
admitted per wall second and preemptions.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import logging
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuyard.apis.core import GPU_RESOURCE, Node, NodeCondition, NodeSpec, NodeStatus
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.quantity import parse_quantity
from gpuyard.apis.quotakinds import ElasticQuota, Queue
from gpuyard.apis.scheduling import PodGroup
from gpuyard.scheduler import SchedulerLoop
from gpuyard.state.clock import VirtualClock, settle
from gpuyard.state.config import Settings
from gpuyard.state.context import Context
from gpuyard.state.kinds import register_kinds
from gpuyard.state.store import Store, tune_gc

COHORTS, LEAVES, LEAF_MIN, GPUS_PER_NODE = 5, 6, 20, 8
SIZES = {"small": (1, 60.0, 0.6), "medium": (4, 120.0, 0.3), "large": (8, 300.0, 0.1)}
PREFIX = "quota.scheduling.koordinator.sh"


def node(name: str) -> Node:
    alloc = {
        "cpu": parse_quantity(96),
        "memory": parse_quantity("768Gi"),
        "pods": parse_quantity(110),
        GPU_RESOURCE: parse_quantity(GPUS_PER_NODE),
    }
    labels = {"kubernetes.io/hostname": name, "gpuyard.io/gpu-model": "v100", "nvidia.com/gpu.count": "8"}
    return Node(
        metadata=ObjectMeta(name=name, labels=labels),
        spec=NodeSpec(),
        status=NodeStatus(
            capacity=dict(alloc), allocatable=alloc, conditions=[NodeCondition(type="Ready", status="True")]
        ),
    )


def quota(name: str, *, gmin: int, gmax: int, parent: str | None, is_parent: bool) -> ElasticQuota:
    labels = {f"{PREFIX}/allow-lent-resource": "true"}
    if parent:
        labels[f"{PREFIX}/parent"] = parent
    if is_parent:
        labels[f"{PREFIX}/is-parent"] = "true"
    return ElasticQuota.model_validate(
        {
            "metadata": {"name": name, "namespace": name, "labels": labels},
            "spec": {
                "min": {GPU_RESOURCE: str(gmin)},
                "max": {GPU_RESOURCE: str(gmax)},
                "namespaces": [] if is_parent else [name],
            },
        }
    )


def podgroup(name: str, namespace: str, gpus: int) -> PodGroup:
    container = {"name": "main", "image": "train", "resources": {"limits": {GPU_RESOURCE: gpus}}}
    return PodGroup.model_validate(
        {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"roles": [{"name": "Worker", "replicas": 1, "template": {"containers": [container]}}]},
        }
    )


def workload(jobs: int, window: float, seed: int = 7) -> list[tuple[float, str, str, str]]:
    """(arrival, leaf, job name, size) sorted by arrival: `jobs` per leaf, Poisson over `window`."""
    rng = np.random.default_rng(seed)
    names = list(SIZES)
    probs = [SIZES[s][2] for s in names]
    out = []
    for c in range(COHORTS):
        for q in range(LEAVES):
            leaf = f"c{c}-q{q}"
            arrivals = np.sort(rng.uniform(0, window, size=jobs))
            sizes = rng.choice(len(names), size=jobs, p=probs)
            out += [
                (float(t), leaf, f"{leaf}-{i:05d}", names[s])
                for i, (t, s) in enumerate(zip(arrivals, sizes, strict=True))
            ]
    out.sort()
    return out


async def run(*, jobs_per_leaf: int, window: float) -> dict[str, Any]:
    total_gpus = COHORTS * LEAVES * LEAF_MIN
    clock = VirtualClock()
    store = Store()  # the server's watch log (50,000 events); a longer one only holds old objects
    register_kinds(store)
    ctx = Context(store=store, clock=clock, settings=Settings(backend={"data_dir": None}))
    for i in range(total_gpus // GPUS_PER_NODE):
        store.create(node(f"node-{i:03d}"))
    leaves = []
    for c in range(COHORTS):
        store.create(
            quota(f"cohort-{c}", gmin=LEAVES * LEAF_MIN, gmax=total_gpus, parent=None, is_parent=True)
        )
        for q in range(LEAVES):
            leaf = f"c{c}-q{q}"
            leaves.append(leaf)
            store.create(quota(leaf, gmin=LEAF_MIN, gmax=total_gpus, parent=f"cohort-{c}", is_parent=False))
            store.create(Queue.model_validate({"metadata": {"name": leaf}, "spec": {"weight": 1}}))
    arrivals = workload(jobs_per_leaf, window)
    size_of = {name: size for _, _, name, size in arrivals}
    arrived: dict[tuple[str, str], float] = {}  # jobs not yet ended
    arrival_at: dict[tuple[str, str], float] = {}
    first_admit: dict[tuple[str, str], float] = {}
    started: dict[tuple[str, str], float] = {}
    events: list[tuple[float, int, str, tuple[str, str]]] = []  # (time, seq, "end", key)
    seq = 0
    counters = {"admissions": 0, "preemptions": 0}

    loop = SchedulerLoop(ctx)
    adm = loop.admission
    original_start, original_requeue = adm.start, adm.requeue
    requeued: set[tuple[str, str]] = set()  # may have evictions to release

    def on_start(key: tuple[str, str], *, now: float) -> None:
        nonlocal seq
        original_start(key, now=now)
        if key in started or key not in arrived:
            return
        counters["admissions"] += 1
        started[key] = now
        first_admit.setdefault(key, now)
        seq += 1
        heapq.heappush(events, (now + SIZES[size_of[key[1]]][1], seq, "end", key))

    def on_requeue(key: tuple[str, str]) -> None:  # preempted by reclaim: running no more
        original_requeue(key)
        requeued.add(key)
        if started.pop(key, None) is not None:
            counters["preemptions"] += 1

    def release_evicted() -> bool:
        """The operator's part of a preemption: stop the pods (none here), release their room."""
        wrote = False
        for key in list(requeued):
            pg = store.get("PodGroup", *key)
            evictions = pg.status.evictions if pg is not None else {}  # type: ignore[attr-defined]
            if not evictions:
                requeued.discard(key)
                continue
            uids = {}
            for pod in evictions:
                res = store.get("Reservation", key[0], pod)
                if res is not None and pg.spec.release.get(pod) != res.metadata.uid:  # type: ignore[union-attr]
                    uids[pod] = res.metadata.uid
            if uids:
                store.mutate("PodGroup", *key, lambda g, uids=uids: g.spec.release.update(uids))
                wrote = True
        return wrote

    adm.start = on_start  # type: ignore[method-assign]
    adm.requeue = on_requeue  # type: ignore[method-assign]
    task = asyncio.create_task(loop.run())
    await loop.synced.wait()
    await settle()
    tune_gc()
    t0 = clock.now()
    cycles_before = loop.state.cycles
    samples: list[float] = []
    wall = time.perf_counter()
    cpu = time.process_time()
    i = 0
    while i < len(arrivals) or events or len(started) < len(arrived):
        next_arrival = t0 + arrivals[i][0] if i < len(arrivals) else float("inf")
        next_end = events[0][0] if events else float("inf")
        when = min(next_arrival, next_end)
        if when == float("inf"):  # nothing running and nothing arriving: must not happen
            break
        await clock.advance(max(0.0, when - clock.now()))
        while i < len(arrivals) and t0 + arrivals[i][0] <= clock.now():
            _, leaf, name, size = arrivals[i]
            store.create(podgroup(name, leaf, SIZES[size][0]))
            arrived[(leaf, name)] = arrival_at[(leaf, name)] = clock.now()
            i += 1
        while events and events[0][0] <= clock.now():
            end, _, _, key = heapq.heappop(events)
            if started.get(key) is None or abs(started[key] + SIZES[size_of[key[1]]][1] - end) > 1e-6:
                continue  # preempted since: this end belongs to an earlier run
            store.delete("PodGroup", *key)
            arrived.pop(key)
            started.pop(key)
        await settle()
        while release_evicted():
            await settle()
        for leaf in leaves:
            st = store.get("ElasticQuota", leaf, leaf).status  # type: ignore[union-attr]
            if st.request.get(GPU_RESOURCE, 0) >= LEAF_MIN:
                samples.append(float(st.used.get(GPU_RESOURCE, 0)) / LEAF_MIN)
    wall = time.perf_counter() - wall
    cpu = time.process_time() - cpu
    virtual = clock.now() - t0
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    store.close()
    waits: dict[str, list[float]] = {s: [] for s in SIZES}
    for key, t in first_admit.items():
        waits[size_of[key[1]]].append(t - arrival_at[key])
    return {
        "path": "SchedulerLoop with PodGroups created directly (no job operator, no kubelet)",
        "cohorts": COHORTS,
        "leaf_quotas": COHORTS * LEAVES,
        "gpus": total_gpus,
        "jobs": len(arrivals),
        "jobs_admitted": len(first_admit),
        "wall_seconds": round(wall, 2),
        "cpu_seconds": round(cpu, 2),
        "virtual_seconds": round(virtual, 1),
        "time_to_admission_s": {
            s: {
                "jobs": len(w),
                "mean": round(float(np.mean(w)), 1) if w else None,
                "p50": round(float(np.percentile(w, 50)), 1) if w else None,
                "p95": round(float(np.percentile(w, 95)), 1) if w else None,
            }
            for s, w in waits.items()
        },
        "min_quota_usage": round(min(samples), 3) if samples else None,
        "p5_quota_usage_with_demand": round(float(np.percentile(samples, 5)), 3) if samples else None,
        "mean_quota_usage_with_demand": round(float(np.mean(samples)), 3) if samples else None,
        "share_of_samples_below_min": round(float(np.mean(np.array(samples) < 1.0)), 4) if samples else None,
        "cycles": loop.state.cycles - cycles_before,
        "cycles_per_s": round((loop.state.cycles - cycles_before) / wall, 1) if wall else None,
        "admissions_per_s": round(counters["admissions"] / wall, 1) if wall else None,
        "preemptions": counters["preemptions"],
        "schedule_attempts": len(loop.cycle_seconds),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a tenth of the jobs and window (CI)")
    parser.add_argument("--jobs", type=int, default=None, help="jobs per leaf (window scales: 6 s per job)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    jobs, window = (50, 300.0) if args.small else (500, 3000.0)
    if args.jobs is not None:
        jobs, window = args.jobs, 6.0 * args.jobs
    out: dict[str, Any] = {
        "benchmark": "queue_quota",
        "shape": "Kueue scheduler perf: 5 cohorts x 6 queues, 15,000 workloads (Kueue: ~351 s)",
        "small": args.small,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    out |= asyncio.run(run(jobs_per_leaf=jobs, window=window))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
