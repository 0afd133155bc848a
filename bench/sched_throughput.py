"""Scheduler throughput benchmark: the real cycle (place, assume, write through the writer), as JSON.

Scenarios (after kube-scheduler's SchedulingBasic and gang workloads):

* A: 5,000 nodes x 8 GPUs, 10,000 single-GPU one-pod jobs;
* B: 5,000 nodes x 8 GPUs, 2,000 gangs of 8 one-GPU pods;
* C: 1,000 mixed nodes (V100, A100, T4 and CPU-only), mixed 1/2/4/8-GPU gangs, some asking for a
  GPU class, and CPU-only pods.

Nodes are written into an in-memory store, the scheduling loop is started (it LISTs them), then
every PodGroup is created at once; the clock runs from then until the last job that fits holds
its reservations (C deliberately asks for more than the cluster has). The loop does all of it:
watch events into the synchronous core, snapshot updates, queue, `place()`, the assume, then
the decisions written through the context's writer (one Reservation per pod, the PodGroup
status and an Event per job).

    .venv/bin/python bench/sched_throughput.py            # full size
    .venv/bin/python bench/sched_throughput.py --small    # CI size (a tenth)
    .venv/bin/python bench/sched_throughput.py --scenario A

Prints one JSON object: per scenario pods/s, jobs/s, cycle p50/p99 (ms: one job's decision
and assume in the core), and the process's peak RSS (MiB) after it. `pods_per_cpu_s` divides by the
process's CPU time instead of wall time: on a shared machine it shows the cost without the
neighbours' load (the CPU time includes the waiting rounds at the end of C). Each scenario runs
with the `default` profile and then `binpack` (`--profile` picks others); the top-level figures
are the first profile's, `by_profile` has each one's and `ratio_to_binpack` the throughput ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuyard.apis.core import GPU_RESOURCE, Node, NodeCondition, NodeSpec, NodeStatus
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.quantity import parse_quantity
from gpuyard.apis.resourceclasses import default_class
from gpuyard.apis.scheduling import PodGroup
from gpuyard.scheduler import SchedulerLoop
from gpuyard.state.clock import RealClock
from gpuyard.state.config import Settings
from gpuyard.state.context import Context
from gpuyard.state.kinds import register_kinds
from gpuyard.state.store import Store, tune_gc

PRODUCTS = {
    "v100": ("Tesla-V100-SXM2-32GB", 32768),
    "a100": ("NVIDIA-A100-SXM4-80GB", 81920),
    "t4": ("Tesla-T4", 15360),
}


def node(
    name: str, *, gpus: int, model: str = "v100", cpu: int = 96, memory_gi: int = 768, block: int = 0
) -> Node:
    labels = {"kubernetes.io/hostname": name, "topology.gpuyard.io/block": f"b{block}"}
    alloc = {
        "cpu": parse_quantity(cpu),
        "memory": parse_quantity(f"{memory_gi}Gi"),
        "pods": parse_quantity(110),
    }
    if gpus:
        product, mem = PRODUCTS[model]
        labels |= {
            "gpuyard.io/gpu-model": model,
            "nvidia.com/gpu.product": product,
            "nvidia.com/gpu.memory": str(mem),
            "nvidia.com/gpu.count": str(gpus),
        }
        alloc[GPU_RESOURCE] = parse_quantity(gpus)
    return Node(
        metadata=ObjectMeta(name=name, labels=labels),
        spec=NodeSpec(),
        status=NodeStatus(
            capacity=dict(alloc), allocatable=alloc, conditions=[NodeCondition(type="Ready", status="True")]
        ),
    )


def job(
    name: str, *, pods: int, gpus: int, cpu: str = "2", memory: str = "8Gi", resource_name: str = GPU_RESOURCE
) -> PodGroup:
    limits: dict[str, object] = {"cpu": cpu, "memory": memory}
    if gpus:
        limits[resource_name] = gpus
    return PodGroup.model_validate(
        {
            "metadata": {"name": name, "namespace": "bench"},
            "spec": {
                "roles": [
                    {
                        "name": "Worker",
                        "replicas": pods,
                        "template": {
                            "containers": [
                                {"name": "main", "image": "train", "resources": {"limits": limits}}
                            ]
                        },
                    }
                ]
            },
        }
    )


def scenario_a(scale: float) -> tuple[list[Node], list[PodGroup]]:
    n, jobs = int(5000 * scale), int(10000 * scale)
    return [node(f"node-{i:05d}", gpus=8, block=i // 32) for i in range(n)], [
        job(f"a-{j:05d}", pods=1, gpus=1) for j in range(jobs)
    ]


def scenario_b(scale: float) -> tuple[list[Node], list[PodGroup]]:
    n, jobs = int(5000 * scale), int(2000 * scale)
    return [node(f"node-{i:05d}", gpus=8, block=i // 32) for i in range(n)], [
        job(f"b-{j:05d}", pods=8, gpus=1) for j in range(jobs)
    ]


def scenario_c(scale: float) -> tuple[list[Node], list[PodGroup]]:
    rng = np.random.default_rng(7)
    n = int(1000 * scale)
    nodes = []
    for i in range(n):
        kind = i % 10
        if kind < 4:
            nodes.append(node(f"node-{i:05d}", gpus=8, model="v100", block=i // 32))
        elif kind < 7:
            nodes.append(node(f"node-{i:05d}", gpus=8, model="a100", block=i // 32))
        elif kind < 9:
            nodes.append(node(f"node-{i:05d}", gpus=4, model="t4", cpu=48, memory_gi=256, block=i // 32))
        else:
            nodes.append(node(f"node-{i:05d}", gpus=0, cpu=64, memory_gi=256, block=i // 32))
    jobs = []
    for j in range(int(2000 * scale)):
        r = rng.random()
        if r < 0.2:
            jobs.append(job(f"c-{j:05d}", pods=int(rng.integers(1, 5)), gpus=0, cpu="4", memory="16Gi"))
            continue
        gpus = int(rng.choice([1, 2, 4, 8], p=[0.4, 0.25, 0.2, 0.15]))
        pods = int(rng.choice([1, 2, 4], p=[0.6, 0.3, 0.1]))
        res = str(rng.choice([GPU_RESOURCE, "nvidia.v100", "nvidia.a100"], p=[0.6, 0.2, 0.2]))
        jobs.append(job(f"c-{j:05d}", pods=pods, gpus=gpus, resource_name=res))
    return nodes, jobs


SCENARIOS = {"A": scenario_a, "B": scenario_b, "C": scenario_c}


async def run(name: str, scale: float, *, profile: str = "default") -> dict[str, object]:
    nodes, jobs = SCENARIOS[name](scale)
    store = Store(history=max(50_000, 20 * len(jobs)))
    register_kinds(store)
    ctx = Context(
        store=store,
        clock=RealClock(),
        settings=Settings(backend={"data_dir": None}, scheduler={"profile": profile}),
    )
    for n in nodes:
        store.create(n)
    for model in ("v100", "a100", "t4"):
        store.create(default_class(model))
    loop = SchedulerLoop(ctx)
    task = asyncio.create_task(loop.run())
    await loop.synced.wait()
    await asyncio.sleep(0)
    pods_total = sum(pg.spec.total_replicas() for pg in jobs)
    tune_gc()  # what the runtime does at start-up (fewer collections, long-lived objects frozen)
    cpu_started = time.process_time()
    started = time.perf_counter()
    for pg in jobs:
        store.create(pg)
    settled_rounds = 0
    last_count, last_change = 0, started
    while True:
        await asyncio.sleep(0.002)
        if loop.placed_jobs != last_count:
            last_count, last_change = loop.placed_jobs, time.perf_counter()
        if loop.placed_jobs >= len(jobs):
            break
        # settled: nothing left to try, or nothing placed for a second while the loop is idle
        # (what is left waits behind a blocked head's reservation or does not fit at all)
        idle = not loop._wake.is_set()
        if idle and (not len(loop.queue) or time.perf_counter() - last_change > 1.0):
            settled_rounds += 1
            if settled_rounds > 50:
                break
        else:
            settled_rounds = 0
    elapsed = last_change - started  # to the last placement (the rest did not fit)
    cpu = time.process_time() - cpu_started
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    cycles = np.array(loop.cycle_seconds) * 1000
    return {
        "nodes": len(nodes),
        "jobs": len(jobs),
        "pods": pods_total,
        "placed_jobs": loop.placed_jobs,
        "placed_pods": loop.placed_pods,
        "seconds": round(elapsed, 3),
        "pods_per_s": round(loop.placed_pods / elapsed, 1),
        "jobs_per_s": round(loop.placed_jobs / elapsed, 1),
        "cpu_seconds": round(cpu, 3),
        "pods_per_cpu_s": round(loop.placed_pods / cpu, 1) if cpu else None,
        "cycle_p50_ms": round(float(np.percentile(cycles, 50)), 3) if len(cycles) else None,
        "cycle_p99_ms": round(float(np.percentile(cycles, 99)), 3) if len(cycles) else None,
        "cycle_max_ms": round(float(cycles.max()), 3) if len(cycles) else None,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a tenth of the size (CI)")
    parser.add_argument(
        "--scenario", choices=sorted(SCENARIOS), action="append", help="run only these (repeatable)"
    )
    parser.add_argument(
        "--profile",
        action="append",
        help="scheduler profile(s) to run (repeatable; default: default and binpack, with the ratio)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    scale = 0.1 if args.small else 1.0
    out: dict[str, object] = {
        "benchmark": "sched_throughput",
        "scale": scale,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    profiles = args.profile or ["default", "binpack"]
    names = args.scenario or sorted(SCENARIOS)
    # every scenario under the first profile, then under the next: the first profile's runs see
    # the same process history as a run of that profile alone
    by_profile = {
        prof: {name: asyncio.run(run(name, scale, profile=prof)) for name in names} for prof in profiles
    }
    for name in names:
        runs = {prof: by_profile[prof][name] for prof in profiles}
        out[name] = runs[profiles[0]]  # the first profile's figures, as before
        if len(profiles) > 1:
            out[name]["by_profile"] = {  # type: ignore[index]
                prof: {k: r[k] for k in ("pods_per_s", "cycle_p99_ms", "placed_pods")}
                for prof, r in runs.items()
            }
            base = runs[profiles[1]]["pods_per_s"]
            out[name]["ratio_to_" + profiles[1]] = (
                round(runs[profiles[0]]["pods_per_s"] / base, 3) if base else None
            )  # type: ignore[index, operator]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
