"""Chaos soak: a virtual day of jobs and faults on a large fake cluster, then SIGKILLs of a real server.

Phase one runs the whole platform in process (`gpuyard.testing.Cluster`: fake cluster, operator,
scheduler, virtual clock) on `--nodes` nodes (half DGX-1 V100, half DGX A100) for `--hours`
virtual hours. A steady stream of PyTorchJobs arrives (1 to 8 GPUs, some multi-node gangs, 10
minutes to 3 hours, restart policies ExitCode / OnFailure / Never, a few with a permanent exit
code), and random faults strike: nodes lost and recovered, GPUs failing and recovering, running
pods crashing with retryable or permanent exit codes. The invariants of
`gpuyard.platform.invariants` are checked after every scheduling cycle (safety), whenever a
fault is injected and every 15 virtual minutes (all), and liveness (no job waits more than 3
cycles and 5 s while it fits now) at most every 2 virtual seconds and at those checks. When the day ends no new job arrives and the clock runs until every job
has finished (`--drain-hours` at most).

Phase two starts a real `gpuyard serve --clock virtual` with a journal, submits jobs and kills
it with SIGKILL `--kills` times (starting it again on the same data dir each time): every job
it accepted must be listed after each restart, and `GET /api/v1/check` must find no violation.

Reports (JSON): jobs submitted, completed, failed by their own policy, lost (accepted but gone,
or never finished: must be 0), invariant violations and, beside them, liveness violations (both
must be 0), faults injected, wall time.
Usage: `python bench/soak.py [--nodes 500] [--hours 24] [--small]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import structlog

from gpuyard.apis.core import Pod
from gpuyard.apis.jobkinds import KIND_INFO
from gpuyard.testing import Cluster

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from load import Server, listed

from tests.faults.jobs import gang

TERMINAL = ("Succeeded", "Failed")
STEP = 60.0  # virtual seconds between arrivals and fault draws
FULL_CHECK_EVERY = 15  # steps between checks of every invariant (safety ones: every cycle)


def job_doc(rng: random.Random, name: str) -> tuple[dict[str, Any], str]:
    """A random job and what its policy should make of it ("ok" or "fails")."""
    gpus = rng.choice([1, 1, 2, 4, 8, 8])
    workers = rng.choice([0, 0, 0, 1, 3]) if gpus == 8 else 0
    policy = rng.choice(["ExitCode", "ExitCode", "OnFailure", "Never"])
    duration = rng.randint(600, 3 * 3600)
    exit_code, expect = None, "ok"
    if rng.random() < 0.05:  # a bug in the training script: exits 1
        exit_code = 1
        expect = "fails" if policy != "OnFailure" else "ok"
    doc = gang(
        name,
        workers=workers,
        gpus=gpus,
        policy=policy,
        duration=str(duration),
        backoff=6,
        namespace="soak",
        exit_code=exit_code,
    )
    doc["spec"]["runPolicy"]["cleanPodPolicy"] = "All"
    return doc, expect


def _pods_of(c: Cluster, job: str) -> str:
    """Each pod of `job`: name, phase, reason, node and whether that node is Ready."""
    out = []
    for pod in c.pods(f"soak/{job}"):
        node = c.store.get("Node", "", pod.spec.node_name or "")
        ready = getattr(node, "ready", None)
        out.append(
            f"{pod.metadata.name} {pod.status.phase} {pod.status.reason or '-'} on {pod.spec.node_name} ready={ready}"
        )
    return "; ".join(out) or "none"


def _jobs(c: Cluster) -> dict[str, str]:
    return {
        j.metadata.name: (j.status.phase or "Created")
        for kind in KIND_INFO
        for j in c.store.list(kind, namespace="soak")
    }


async def _inject(c: Cluster, rng: random.Random, faults: Counter[str], down: dict[str, float]) -> None:
    now = c.now
    for node, until in list(down.items()):  # recover what is due
        if until <= now:
            del down[node]
            if node.startswith("gpu:"):
                _, name, idx = node.split(":")
                await c.inject("gpu-recover", name, gpu=int(idx))
                faults["gpu-recover"] += 1
            else:
                await c.inject("node-recover", node)
                faults["node-recover"] += 1
    draw = rng.random()
    nodes = [n.metadata.name for n in c.store.list("Node")]
    if draw < 0.04:
        node = rng.choice(nodes)
        if node not in down:
            await c.inject("node-fail", node)
            down[node] = now + rng.uniform(600, 3600)
            faults["node-fail"] += 1
    elif draw < 0.10:
        node = rng.choice(nodes)
        idx = rng.randrange(8)
        key = f"gpu:{node}:{idx}"
        if key not in down and node not in down:
            await c.inject("gpu-fail", node, gpu=idx)
            down[key] = now + rng.uniform(600, 7200)
            faults["gpu-fail"] += 1
    elif draw < 0.25:
        running = [p for p in c.store.list_of(Pod, namespace="soak") if p.status.phase == "Running"]
        if running:
            pod = rng.choice(running)
            code = rng.choice([137, 137, 143, 1])
            await c.inject("pod-crash", f"soak/{pod.metadata.name}", exit_code=code)
            faults[f"pod-crash-{code}"] += 1


async def in_process(*, nodes: int, hours: float, drain_hours: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    half = nodes // 2
    started = time.perf_counter()
    async with Cluster.start(
        nodes=[("dgx1-v100", half), ("dgx-a100", nodes - half)], check_invariants=True
    ) as c:
        watch = c.invariants
        assert watch is not None
        watch.cycle_versions = False  # versions are scanned at every step instead
        watch.raise_liveness = False  # reported beside the safety violations, not raised
        submitted: list[str] = []
        faults: Counter[str] = Counter()
        down: dict[str, float] = {}
        rate = max(1, nodes // 100)  # jobs per minute: about three quarters of the GPUs busy
        end = hours * 3600
        next_report = 3600.0
        steps = 0
        while c.now < end:
            if c.now >= next_report:
                next_report += 3600
                print(
                    f"soak: t={c.now / 3600:.0f}h jobs={len(submitted)} cycles={watch.cycles} "
                    f"wall={time.perf_counter() - started:.0f}s",
                    file=sys.stderr,
                    flush=True,
                )
            docs = []
            for _ in range(rng.randint(0, 2 * rate)):
                name = f"j{len(submitted):06d}"
                docs.append(job_doc(rng, name)[0])
                submitted.append(name)
            if docs:
                await c.submit_all(docs)
            await _inject(c, rng, faults, down)
            await c.clock.advance(STEP)
            steps += 1
            if steps % FULL_CHECK_EVERY == 0:
                watch.check(when=f"t={c.now:g}s")
        for node in list(down):  # the day is over: everything recovers, the queue drains
            if node.startswith("gpu:"):
                _, name, idx = node.split(":")
                await c.inject("gpu-recover", name, gpu=int(idx))
            else:
                await c.inject("node-recover", node)
        drain = c.now + drain_hours * 3600
        while c.now < drain and any(p not in TERMINAL for p in _jobs(c).values()):
            await c.clock.advance(STEP * 10)
            watch.check(when=f"draining, t={c.now:g}s")
        phases = _jobs(c)
        stuck = {
            n: f"{p}; scheduler: {c.explain(f'soak/{n}')}; pods: {_pods_of(c, n)}"
            for n, p in phases.items()
            if p not in TERMINAL
        }
        wall = time.perf_counter() - started
        seen = watch.take()  # reported, not raised
        violations = [v.to_dict() | {"when": when} for when, v in seen if v.family != "liveness"]
        liveness = [v.to_dict() | {"when": when} for when, v in seen if v.family == "liveness"]
    counts = Counter(phases.values())
    missing = [n for n in submitted if n not in phases]
    unfinished = [n for n, p in phases.items() if p not in TERMINAL]
    return {
        "nodes": nodes,
        "virtual_hours": hours,
        "virtual_seconds_run": round(c.now, 1),
        "jobs_submitted": len(submitted),
        "jobs_completed": counts.get("Succeeded", 0),
        "jobs_failed_by_policy": counts.get("Failed", 0),
        "jobs_lost": len(missing) + len(unfinished),
        "jobs_missing": len(missing),
        "jobs_unfinished_after_drain": len(unfinished),
        "lost_examples": missing[:5] + [f"{n}: {stuck[n]}" for n in unfinished[:5]],
        "faults": dict(sorted(faults.items())),
        "scheduling_cycles_checked": watch.cycles,
        "invariant_violations": len(violations),
        "violation_examples": violations[:5],
        "liveness_violations": len(liveness),
        "liveness_examples": liveness[:5],
        "wall_s": round(wall, 1),
    }


def _submit(http: httpx.Client, doc: dict[str, Any]) -> bool:
    try:
        r = http.post("/api/v1/jobs", json=doc)
    except httpx.HTTPError:
        return False
    return r.status_code in (200, 201)


def with_sigkills(*, kills: int, jobs_per_round: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    accepted: set[str] = set()
    lost_after: list[int] = []
    violations: list[dict[str, Any]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpuyard-soak-") as tmp:
        server = Server(Path(tmp) / "data", log=Path(tmp) / "serve.log", clock="virtual")
        server.start()
        try:
            for round_ in range(kills + 1):
                with httpx.Client(base_url=server.url, timeout=30) as http:
                    lost_after.append(len(accepted - listed(server, "team-a")))
                    check = http.get("/api/v1/check", params={"grace": "1"}).json()
                    violations += [v | {"round": round_} for v in check["violations"]]
                    if round_ == kills:
                        break
                    for i in range(jobs_per_round):
                        name = f"r{round_}-{i:04d}"
                        doc, _ = job_doc(rng, name)
                        doc["metadata"]["namespace"] = "team-a"
                        if _submit(http, doc):
                            accepted.add(name)
                    time.sleep(rng.uniform(0.0, 0.5))  # let the platform run (virtual clock)
                server.kill()
                server.start()
        finally:
            server.kill()
    return {
        "sigkills": kills,
        "jobs_accepted": len(accepted),
        "accepted_then_lost": sum(lost_after),
        "invariant_violations": len(violations),
        "violation_examples": violations[:5],
        "wall_s": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--drain-hours", type=float, default=48.0)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--small", action="store_true", help="40 nodes, 3 virtual hours, 2 SIGKILLs (CI)")
    args = parser.parse_args()
    if args.small:
        args.nodes, args.hours, args.drain_hours, args.kills = 40, 3.0, 24.0, 2
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    out: dict[str, Any] = {"benchmark": "soak"}
    out["in_process"] = asyncio.run(
        in_process(nodes=args.nodes, hours=args.hours, drain_hours=args.drain_hours, seed=args.seed)
    )
    out["sigkill"] = with_sigkills(kills=args.kills, jobs_per_round=30 if args.small else 100, seed=args.seed)
    inproc, killed = out["in_process"], out["sigkill"]
    out["lost"] = inproc["jobs_lost"] + killed["accepted_then_lost"]
    out["invariant_violations"] = inproc["invariant_violations"] + killed["invariant_violations"]
    out["liveness_violations"] = inproc["liveness_violations"]
    out["ok"] = out["lost"] == 0 and out["invariant_violations"] == 0 and out["liveness_violations"] == 0
    print(json.dumps(out, indent=2))
    if not out["ok"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
