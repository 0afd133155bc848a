"""The whole platform at cluster scale: N nodes, M queued jobs, one process, as JSON.

`gpuyard.testing.Cluster` runs the full platform in process (store, journal on a temporary data
dir, job operator, scheduler, fake kubelets, the HTTP API on loopback) on a virtual clock over a
mixed fleet: DGX A100, DGX-1 V100 and HGX H100 (8 GPUs each) and PCIe T4 hosts (4 GPUs), in the
ratio 3 : 3 : 3 : 1. Four tenants (namespaces `team-0..3`) each have an ElasticQuota (min a
quarter of the GPUs, max all of them: borrowing allowed) and two PriorityClasses exist
(`scale-high`, `scale-low`); a fifth of the jobs ask for `scale-high`. Jobs are PyTorchJobs of
five shapes (pods x GPUs per pod): 1x1 (40 %), 2x4 (20 %), 8x1 (15 %), 1x8 (15 %), 4x8 (10 %),
each running a virtual day, so nothing ends while the queue is placed; about 7.6 GPUs per job,
so 10 jobs per node ask for ten times the fleet.

Phases, each timed on the wall clock:

1. submit: every job goes in through the same validation as `POST /api/v1/jobs`, in batches of
   500 (`submit_s`, `submit_jobs_per_s`), while every node is cordoned (`spec.unschedulable`),
   so the operator makes each job's PodGroup and the queue fills but nothing is placed; the
   virtual clock does not move meanwhile;
2. place: the nodes are uncordoned and the virtual clock moves one second at a time until no pod was bound for 5 virtual
   seconds in a row (nothing more fits): `pods_per_s` and `jobs_per_s` are pods bound and jobs
   with every pod bound in that phase, per wall second. Meanwhile a ticker task measures the
   event loop's lag (a 10 ms sleep, how late it wakes: `loop_lag_ms` p50 / p99 / max) and a
   client polls `GET /api/v1/jobs?limit=100` on loopback every 250 ms (`list_jobs_ms`);
3. restart: the platform stops (the journal is flushed) and a new one starts on the same data
   dir: `restart_s` is the wall time until it has loaded the journal and listed its nodes.

Also reported: scheduling cycle p50 / p99 (ms per attempt, the scheduler's own figures), peak
RSS (MiB, the whole process), the objects in the store, and the CPU seconds of the process in
each phase (`submit_cpu_s`, `place_cpu_s`, `restart_cpu_s`): on a machine shared with other work
the wall figures move with the load, the CPU a phase took much less.

    .venv/bin/python bench/scale.py --small              # 100 nodes / 1,000 jobs (CI, seconds)
    .venv/bin/python bench/scale.py                      # 1,000 / 10,000
    .venv/bin/python bench/scale.py --nodes 5000 --jobs 50000
    .venv/bin/python bench/scale.py --pairs              # 1,000/10,000, 5,000/50,000, 10,000/100,000

`--pairs` runs each pair in a fresh process (so each peak RSS is its own) and states the growth
from one pair to the next (the ratio of each figure to the ratio of sizes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.priorityclasses import API_VERSION as PC_API_VERSION
from gpuyard.apis.priorityclasses import PriorityClass
from gpuyard.apis.scheduling import Reservation
from gpuyard.scheduler.running import SchedulerLoop
from gpuyard.state.clock import settle
from gpuyard.testing import Cluster

FLEET = (("dgx-a100", 3, 8), ("dgx1-v100", 3, 8), ("hgx-h100", 3, 8), ("pcie-t4x4", 1, 4))
SHAPES = (
    ("1x1", 1, 1, 0.40),
    ("2x4", 2, 4, 0.20),
    ("8x1", 8, 1, 0.15),
    ("1x8", 1, 8, 0.15),
    ("4x8", 4, 8, 0.10),
)
TENANTS = 4
BATCH = 500
QUIET_S = 5  # virtual seconds with no new binding: nothing more fits
PAIRS = ((1_000, 10_000), (5_000, 50_000), (10_000, 100_000))


def fleet(nodes: int) -> tuple[list[tuple[str, int]], int]:
    """(preset, count) in the ratio of FLEET, and the GPUs they hold."""
    weight = sum(w for _, w, _ in FLEET)
    counts = [nodes * w // weight for _, w, _ in FLEET]
    counts[0] += nodes - sum(counts)
    out = [(preset, n) for (preset, _, _), n in zip(FLEET, counts, strict=True) if n]
    gpus = sum(n * g for (_, _, g), n in zip(FLEET, counts, strict=True))
    return out, gpus


def quotas(gpus: int) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
            "kind": "ElasticQuota",
            "metadata": {"name": f"team-{t}", "namespace": f"team-{t}"},
            "spec": {"min": {"nvidia.com/gpu": str(gpus // TENANTS)}, "max": {"nvidia.com/gpu": str(gpus)}},
        }
        for t in range(TENANTS)
    ]


def job_doc(rng: random.Random, i: int) -> dict[str, Any]:
    shape = rng.choices(SHAPES, weights=[s[3] for s in SHAPES])[0]
    _, pods, gpus, _ = shape
    template = {
        "metadata": {"annotations": {"fake.gpuyard.io/duration": "86400"}},
        "spec": {
            "containers": [
                {
                    "name": "pytorch",
                    "image": "train:1",
                    "resources": {"limits": {"nvidia.com/gpu": gpus, "cpu": "2", "memory": "8Gi"}},
                }
            ]
        },
    }
    specs: dict[str, Any] = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": template}}
    if pods > 1:
        specs["Worker"] = {"replicas": pods - 1, "restartPolicy": "Never", "template": template}
    priority = "scale-high" if rng.random() < 0.2 else "scale-low"
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": f"j{i:06d}-{shape[0]}", "namespace": f"team-{i % TENANTS}"},
        "spec": {
            "runPolicy": {"backoffLimit": 0, "schedulingPolicy": {"priorityClass": priority}},
            "pytorchReplicaSpecs": specs,
        },
    }


def priority_class(name: str, value: int) -> PriorityClass:
    return PriorityClass(
        api_version=PC_API_VERSION, kind="PriorityClass", metadata=ObjectMeta(name=name), value=value
    )


def scheduler_of(c: Cluster) -> SchedulerLoop:
    for comp in c.platform.components:
        owner = getattr(comp.run, "__self__", None)
        if isinstance(owner, SchedulerLoop):
            return owner
    raise RuntimeError("no SchedulerLoop among the platform's components")


def cordon(c: Cluster, unschedulable: bool) -> None:
    for node in c.store.keys_of("Node"):
        c.store.mutate("Node", *node, lambda n: setattr(n.spec, "unschedulable", unschedulable))


def pct(values: list[float], q: float, scale: float = 1000.0) -> float | None:
    return round(float(np.percentile(values, q)) * scale, 3) if values else None


async def ticker(lags: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        start = time.perf_counter()
        await asyncio.sleep(0.01)
        lags.append(time.perf_counter() - start - 0.01)


async def poller(url: str, times: list[float], stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        while not stop.is_set():
            start = time.perf_counter()
            r = await http.get("/api/v1/jobs", params={"limit": "100"})
            r.raise_for_status()
            times.append(time.perf_counter() - start)
            await asyncio.sleep(0.25)


def placed(c: Cluster) -> tuple[int, int]:
    """(pods bound, jobs whose every pod is bound), from the scheduler's Reservations."""
    per_group: dict[tuple[str, str], int] = {}
    for res in c.store.list_of(Reservation):
        key = (res.metadata.namespace, res.spec.pod_group)
        per_group[key] = per_group.get(key, 0) + 1
    pods = sum(per_group.values())
    jobs = 0
    for (ns, name), n in per_group.items():
        group = c.store.get("PodGroup", ns, name)
        if group is not None and n >= sum(r.replicas for r in group.spec.roles):  # type: ignore[attr-defined]
            jobs += 1
    return pods, jobs


async def run(*, nodes: int, jobs: int, seed: int) -> dict[str, Any]:
    presets, gpus = fleet(nodes)
    rng = random.Random(seed)
    out: dict[str, Any] = {"nodes": nodes, "fleet": dict(presets), "gpus": gpus, "jobs": jobs}
    with tempfile.TemporaryDirectory(prefix="gpuyard-scale-") as tmp:
        settings = {"backend": {"data_dir": str(Path(tmp) / "data")}}
        started = time.perf_counter()
        c = await Cluster.launch(
            nodes=presets, quotas=quotas(gpus), settings=settings, serve_http=True, check_invariants=False
        )
        try:
            out["start_s"] = round(time.perf_counter() - started, 2)
            for pc in (priority_class("scale-high", 1000), priority_class("scale-low", 100)):
                c.store.create(pc)
            loop = scheduler_of(c)
            docs = [job_doc(rng, i) for i in range(jobs)]
            cordon(c, True)  # the queue fills before anything is placed
            started, cpu = time.perf_counter(), time.process_time()
            for i in range(0, jobs, BATCH):
                await c.submit_all(docs[i : i + BATCH])
            submit = time.perf_counter() - started
            submit_cpu = time.process_time() - cpu
            del docs
            pods0, jobs0 = placed(c)
            out |= {
                "submit_s": round(submit, 2),
                "submit_cpu_s": round(submit_cpu, 2),
                "submit_jobs_per_s": round(jobs / submit, 1) if submit else None,
                "placed_while_submitting": {"pods": pods0, "jobs": jobs0},
            }
            cordon(c, False)
            cycles_before = len(loop.cycle_seconds)
            stop = asyncio.Event()
            lags: list[float] = []
            lists: list[float] = []
            tasks = [
                asyncio.create_task(ticker(lags, stop)),
                asyncio.create_task(poller(c.url, lists, stop)),
            ]
            started, cpu = time.perf_counter(), time.process_time()
            quiet = 0
            reserved = c.store.count("Reservation")
            while quiet < QUIET_S:
                await c.clock.advance(1.0)
                await settle()
                now = c.store.count("Reservation")
                quiet = quiet + 1 if now == reserved else 0
                reserved = now
            place = time.perf_counter() - started
            place_cpu = time.process_time() - cpu
            stop.set()
            await asyncio.gather(*tasks)
            pods1, jobs1 = placed(c)
            cycles = list(loop.cycle_seconds)[cycles_before:]
            out |= {
                "place_s": round(place, 2),
                "place_cpu_s": round(place_cpu, 2),
                "virtual_s": round(c.now, 1),
                "pods_placed": pods1 - pods0,
                "jobs_placed": jobs1 - jobs0,
                "pods_per_s": round((pods1 - pods0) / place, 1) if place else None,
                "jobs_per_s": round((jobs1 - jobs0) / place, 1) if place else None,
                "gpus_reserved": sum(len(r.spec.gpus) for r in c.store.list_of(Reservation)),
                "cycle_attempts": len(cycles),
                "cycle_ms": {"p50": pct(cycles, 50), "p99": pct(cycles, 99)},
                "loop_lag_ms": {"p50": pct(lags, 50), "p99": pct(lags, 99), "max": pct(lags, 100)},
                "list_jobs_ms": {"requests": len(lists), "p50": pct(lists, 50), "p99": pct(lists, 99)},
                "objects": {
                    kind: c.store.count(kind)
                    for kind in ("PyTorchJob", "PodGroup", "Pod", "Reservation", "Event")
                },
            }
        finally:
            await c.stop()
        started, cpu = time.perf_counter(), time.process_time()
        again = await Cluster.launch(nodes=presets, settings=settings, check_invariants=False)
        try:
            out["restart_s"] = round(time.perf_counter() - started, 2)
            out["restart_cpu_s"] = round(time.process_time() - cpu, 2)
            out["restart_jobs_loaded"] = again.store.count("PyTorchJob")
        finally:
            await again.stop()
    out["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return out


def growth(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each figure's ratio from one pair to the next, beside the ratio of sizes."""
    out = []
    for a, b in itertools.pairwise(runs):
        size = b["jobs"] / a["jobs"]
        row: dict[str, Any] = {
            "from": f"{a['nodes']}/{a['jobs']}",
            "to": f"{b['nodes']}/{b['jobs']}",
            "size_x": size,
        }
        for key in ("submit_s", "place_s", "place_cpu_s", "peak_rss_mib", "restart_s", "restart_cpu_s"):
            if a.get(key) and b.get(key):
                row[f"{key}_x"] = round(b[key] / a[key], 2)
        for key in ("cycle_ms", "list_jobs_ms", "loop_lag_ms"):
            if a.get(key, {}).get("p99") and b.get(key, {}).get("p99"):
                row[f"{key}_p99_x"] = round(b[key]["p99"] / a[key]["p99"], 2)
        out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1_000, help="nodes (default 1,000)")
    parser.add_argument("--jobs", type=int, default=None, help="queued jobs (default 10 per node)")
    parser.add_argument("--small", action="store_true", help="100 nodes, 1,000 jobs (CI)")
    parser.add_argument("--pairs", action="store_true", help="1,000/10,000, 5,000/50,000, 10,000/100,000")
    parser.add_argument("--max-nodes", type=int, default=None, help="with --pairs: skip larger pairs")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.nodes < 1 or (args.jobs is not None and args.jobs < 1):
        parser.error("--nodes and --jobs must be at least 1")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    logging.basicConfig(level=logging.CRITICAL)
    if args.pairs:
        runs = []
        for nodes, jobs in PAIRS:
            if args.max_nodes is not None and nodes > args.max_nodes:
                continue
            cmd = [
                sys.executable,
                __file__,
                "--nodes",
                str(nodes),
                "--jobs",
                str(jobs),
                "--seed",
                str(args.seed),
            ]
            done = subprocess.run(cmd, check=True, capture_output=True, text=True)
            runs.append(json.loads(done.stdout))
        print(json.dumps({"benchmark": "scale", "pairs": runs, "growth": growth(runs)}, indent=2))
        return
    nodes, jobs = (100, 1_000) if args.small else (args.nodes, args.jobs or 10 * args.nodes)
    out = {"benchmark": "scale", "small": args.small}
    out |= asyncio.run(run(nodes=nodes, jobs=jobs, seed=args.seed))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
