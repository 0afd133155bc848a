"""GPU fragmentation over a virtual day, with the defragmenting rescheduler off and on, as JSON.

Which real jobs it stands for: a shared cluster of 64 eight-GPU machines (DGX A100) kept busy by
many small experiments (1- and 2-GPU jobs, Poisson arrivals, exponential run times with a mean of
2 hours, at least 10 minutes; half of them checkpoint every 30 minutes), while larger training
jobs of 4 and 8 GPUs on one machine arrive now and then (run times around 3 hours). The small
jobs scatter over the machines as they come and go, so a 4- or 8-GPU job often waits although
enough GPUs are free in all.

It runs the whole platform — job operator, scheduler, fake kubelet — on a virtual clock through
the test harness (`gpuyard.testing.Cluster`), twice on the same workload (same seed): with
`scheduler.rescheduler.enabled` false and true (interval 60 s, `min_wait` 120 s, at most 4 jobs
moved per run, one move per job per hour, at most 8 GPU-hours thrown away per hour). Jobs are
submitted as PyTorchJobs whose pods carry `fake.gpuyard.io/duration`.

Measured per run: mean and p95 wait (submit to start, virtual minutes) of the 4- and 8-GPU jobs
(`*_min`: those started; `*_all_min`: with the jobs never started counted with the time they had
waited at the end, a lower bound — the ratio and the goal use these), mean GPU allocation (GPUs held by
Reservations / all GPUs, sampled every 5 virtual minutes after a 2-hour warm-up), migrations,
GPU-hours the moves threw away (the planner's cost: GPUs x time since the last checkpoint, else
since start) and that as a share of the GPU-hours allocated over the day, and the wall time.
Caveat: the fake kubelet runs a moved pod for its whole duration again (it knows no
checkpoints), so moved jobs finish later here than the cost model assumes.

    .venv/bin/python bench/fragmentation.py            # 64 nodes, 24 virtual hours
    .venv/bin/python bench/fragmentation.py --small    # CI size: 16 nodes, 12 virtual hours
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuyard.apis.scheduling import Reservation
from gpuyard.scheduler.running import service_for
from gpuyard.testing import Cluster

SAMPLE = 300.0
WARMUP = 2 * 3600.0


def manifest(name: str, gpus: int, duration: float, checkpoint: str | None) -> dict[str, Any]:
    annotations = {"gpuyard.io/checkpoint-interval": checkpoint} if checkpoint else {}
    container = {"name": "train", "image": "train", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {
            "runPolicy": {"ttlSecondsAfterFinished": 3600},
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": 1,
                    "restartPolicy": "OnFailure",
                    "template": {
                        "metadata": {"annotations": {"fake.gpuyard.io/duration": f"{duration:.0f}"}},
                        "spec": {"containers": [container]},
                    },
                }
            },
        },
    }


def workload(*, nodes: int, hours: float, seed: int) -> list[tuple[float, str, int, float, str | None]]:
    """(arrival s, name, GPUs, duration s, checkpoint interval) sorted by arrival."""
    rng = np.random.default_rng(seed)
    horizon = hours * 3600.0
    capacity = nodes * 8
    big_per_hour = {4: capacity / 512 * 40 / 24, 8: capacity / 512 * 40 / 24}
    big_load = sum(g * 3.0 * rate for g, rate in big_per_hour.items())  # GPUs busy on average
    small_rate = max(0.0, 0.90 * capacity - big_load) / (1.5 * 2.0)  # jobs per hour
    out: list[tuple[float, str, int, float, str | None]] = []

    def poisson(rate_per_hour: float) -> np.ndarray:
        n = rng.poisson(rate_per_hour * hours)
        return np.sort(rng.uniform(0, horizon, size=n))

    for i, t in enumerate(poisson(small_rate)):
        gpus = int(rng.integers(1, 3))
        duration = max(600.0, float(rng.exponential(2 * 3600.0)))
        checkpoint = "30m" if rng.random() < 0.5 else None
        out.append((float(t), f"small-{i:05d}", gpus, duration, checkpoint))
    for gpus, rate in big_per_hour.items():
        for i, t in enumerate(poisson(rate)):
            duration = float(rng.uniform(2 * 3600.0, 4 * 3600.0))
            out.append((float(t), f"big{gpus}-{i:04d}", gpus, duration, "30m"))
    out.sort()
    return out


def _stats(waits: list[float], censored: list[float]) -> dict[str, float | int | None]:
    """Waits of the started jobs; `*_all_min` also counts the never-started ones with the time
    they had waited when the run ended (a lower bound of their wait)."""
    out: dict[str, float | int | None] = {"started": len(waits), "never_started": len(censored)}
    if waits:
        arr = np.asarray(waits) / 60.0
        out.update(mean_min=round(float(arr.mean()), 1), p95_min=round(float(np.percentile(arr, 95)), 1))
    else:
        out.update(mean_min=None, p95_min=None)
    every = np.asarray(waits + censored) / 60.0
    if every.size:
        out.update(
            mean_all_min=round(float(every.mean()), 1), p95_all_min=round(float(np.percentile(every, 95)), 1)
        )
    return out


async def run(*, nodes: int, hours: float, seed: int, rescheduler: bool) -> dict[str, Any]:
    work = workload(nodes=nodes, hours=hours, seed=seed)
    settings = {
        "scheduler": {
            "rescheduler": {
                "enabled": rescheduler,
                "interval": 60,
                "min_wait": 120,
                "max_migrations_per_cycle": 4,
                "max_migrations_per_job_per_hour": 1,
                "max_gpu_hours_lost_per_hour": 8.0,
            }
        }
    }
    started_wall = time.perf_counter()
    submitted: dict[str, float] = {}
    start_of: dict[str, float] = {}
    samples: list[float] = []
    gpu_seconds = 0.0
    total = nodes * 8
    async with Cluster.start(nodes=[("dgx-a100", nodes)], settings=settings) as c:
        t0 = c.clock.now()
        big = [name for _, name, gpus, _, _ in work if gpus >= 4]
        points = sorted(
            [(t, 0, i) for i, (t, *_rest) in enumerate(work)]
            + [(s, 1, -1) for s in np.arange(SAMPLE, hours * 3600.0 + SAMPLE / 2, SAMPLE)]
        )
        for at, kind, index in points:
            await c.advance(max(0.0, t0 + at - c.clock.now()))
            if kind == 0:
                _, name, gpus, duration, checkpoint = work[index]
                await c.submit(manifest(name, gpus, duration, checkpoint))
                submitted[name] = at
                continue
            used = sum(
                len(r.spec.gpus)
                for r in c.store.list_of(Reservation)
                if not r.metadata.name.endswith(".next")
            )
            gpu_seconds += used * SAMPLE
            if at >= WARMUP:
                samples.append(used / total)
            for name in big:
                if name in start_of or name not in submitted:
                    continue
                job = c.store.get("PyTorchJob", "default", name)
                st = getattr(getattr(job, "status", None), "start_time", None)
                if st is not None:
                    start_of[name] = st.timestamp() - c.clock.utcnow().timestamp() + (c.clock.now() - t0)
        svc = service_for(c.store)
        migrations = svc.migrations if svc is not None else 0
        lost = svc.gpu_hours_lost if svc is not None else 0.0
    waits: dict[int, list[float]] = {4: [], 8: []}
    never: dict[int, list[float]] = {4: [], 8: []}
    end = hours * 3600.0
    for _, name, gpus, _, _ in work:
        if gpus < 4:
            continue
        if name in start_of:
            waits[gpus].append(max(0.0, start_of[name] - submitted[name]))
        else:
            never[gpus].append(end - submitted[name])
    used_hours = gpu_seconds / 3600.0
    return {
        "rescheduler": rescheduler,
        "jobs": len(work),
        "wait_4gpu": _stats(waits[4], never[4]),
        "wait_8gpu": _stats(waits[8], never[8]),
        "gpu_allocation_mean": round(float(np.mean(samples)), 4) if samples else None,
        "migrations": migrations,
        "gpu_hours_lost": round(lost, 2),
        "gpu_hours_allocated": round(used_hours, 1),
        "gpu_hours_lost_pct": round(100.0 * lost / used_hours, 3) if used_hours else None,
        "wall_seconds": round(time.perf_counter() - started_wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="CI size: 16 nodes, 12 virtual hours")
    parser.add_argument("--nodes", type=int, default=None)
    parser.add_argument("--hours", type=float, default=None)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    nodes = args.nodes or (16 if args.small else 64)
    hours = args.hours or (12.0 if args.small else 24.0)
    logging.disable(logging.CRITICAL)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    off = asyncio.run(run(nodes=nodes, hours=hours, seed=args.seed, rescheduler=False))
    on = asyncio.run(run(nodes=nodes, hours=hours, seed=args.seed, rescheduler=True))
    p95_off, p95_on = off["wait_8gpu"]["p95_all_min"], on["wait_8gpu"]["p95_all_min"]
    out = {
        "benchmark": "fragmentation",
        "nodes": nodes,
        "gpus_per_node": 8,
        "virtual_hours": hours,
        "seed": args.seed,
        "off": off,
        "on": on,
        "p95_wait_8gpu_ratio_on_off": round(p95_on / p95_off, 3) if p95_off and p95_on is not None else None,
        "goal_met": bool(
            p95_off and p95_on is not None and p95_on <= p95_off / 2 and (on["gpu_hours_lost_pct"] or 0) < 1.0
        ),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
