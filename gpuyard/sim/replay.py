"""Trace replay through the whole platform: arrivals, departures, queueing delay, utilisation.

`run_replay` builds a :class:`~gpuyard.platform.runtime.Platform` (fake cluster, job operator,
scheduler with queues, quota, gangs and topology) on a :class:`VirtualClock` and feeds it a
:class:`~gpuyard.sim.replay_trace.Trace`. Each trace job becomes one Kubeflow ``PyTorchJob``
with a single ``Master`` pod, validated as ``POST /api/v1/jobs`` does (`parse_job` +
`validate_gang_request`) and created at its submit time. The pod asks for ``nvidia.com/gpu: N``,
or ``gpuyard.io/gpu-milli: M`` for a share of one GPU, plus ``cpu``/``memory``; ``gpu_spec``
becomes a required node affinity on the cluster's GPU-model label; the pod annotation
``fake.gpuyard.io/duration`` makes the simulated kubelet finish it after ``duration`` seconds of
running, and ``gpuyard.io/expected-duration`` gives the queue's backfill the same (exact) estimate.

Queue policies are what the platform's queue does, configured through Queue objects:

* ``fifo``: every job in one ``StrictFIFO`` queue named ``fifo``, submitted without priority,
  no aging: strict arrival order, nothing overtakes a head that cannot start;
* ``priority``: one ``BestEffortFIFO`` queue named ``priority`` without aging: priority, then
  arrival; a job behind a blocked head may start when backfill allows it;
* ``drf``: one ``BestEffortFIFO`` queue per trace queue (weight 1, the platform's aging):
  Dominant Resource Fairness across queues, priority then arrival within each.

Time moves event by event: to the next submit time or the platform's next timer, whichever is
first, until every job has finished, ``until`` seconds have passed, or nothing can change any
more. A store watch records per job the submit, placement (its pod created on a node), start
(its pod Running, kubelet start delay included), finish and final phase, and the GPU milli held
by Reservations at every change. Queueing delay = start - submit; JCT = finish - submit.
"""

from __future__ import annotations

import asyncio
import csv
import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpuyard.apis.devicematching import LABEL_GPU_MODEL
from gpuyard.apis.durations import ANNOTATION_DURATION
from gpuyard.apis.jobs import JobValidationError, parse_job
from gpuyard.apis.meta import Resource
from gpuyard.apis.quotakinds import ANNOTATION_EXPECTED_DURATION
from gpuyard.apis.resourceclasses import SHARE_MILLI, validate_gang_request
from gpuyard.apis.scheduling import LABEL_JOB_NAME
from gpuyard.devices.scenarios import Scenario
from gpuyard.platform.runtime import Platform
from gpuyard.scheduler.placement.packing import GPU_MILLI
from gpuyard.sim.replay_trace import Trace, TraceJob
from gpuyard.state.clock import VirtualClock, settle
from gpuyard.state.config import Settings
from gpuyard.state.ownership import USER
from gpuyard.state.writing import identified

__all__ = [
    "JOB_KIND",
    "POLICIES",
    "JobRecord",
    "ReplayResult",
    "job_manifest",
    "queue_documents",
    "run_replay",
    "stats",
    "summarize",
    "time_weighted_mean",
    "utilisation_steps",
]

POLICIES = ("fifo", "priority", "drf")
JOB_KIND = "PyTorchJob"
TERMINAL = ("Succeeded", "Failed")
_START_TIMEOUT = 10.0  # real seconds for the fake cluster to list its nodes


@dataclass(slots=True)
class JobRecord:
    """What happened to one trace job; times are simulated seconds from the start of the replay."""

    name: str
    namespace: str
    queue: str
    priority: int
    submit: float
    duration: float
    gpu_milli: int
    placed: float | None = None
    start: float | None = None
    finish: float | None = None
    phase: str = "NotSubmitted"
    message: str = ""

    @property
    def queueing_delay(self) -> float | None:
        return None if self.start is None else self.start - self.submit

    @property
    def jct(self) -> float | None:
        return None if self.finish is None else self.finish - self.submit


@dataclass(slots=True)
class ReplayResult:
    policy: str
    jobs: list[JobRecord]
    samples: list[tuple[float, int]]
    """(time, allocated GPU milli) at every change, starting at (0, 0)."""
    total_milli: int
    wall_s: float
    simulated_s: float
    stopped: str
    """``done`` (every job ended), ``until`` (time limit) or ``stalled`` (nothing could change)."""
    extra: dict[str, Any] = field(default_factory=dict)
    queue_samples: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    """Per queue (the jobs' namespace), (time, GPU milli its Reservations hold) at every change."""


# --- what goes into the platform ----------------------------------------------------------------


def job_manifest(
    job: TraceJob, *, queue: str, priority: int | None, model_label: str = LABEL_GPU_MODEL
) -> dict[str, Any]:
    """The PyTorchJob document for one trace job (one Master pod that runs ``duration`` seconds)."""
    limits: dict[str, Any] = {}
    if job.cpu_milli:
        limits["cpu"] = f"{job.cpu_milli}m"
    if job.memory_mib:
        limits["memory"] = f"{job.memory_mib}Mi"
    if job.num_gpu == 1 and job.gpu_milli < GPU_MILLI:
        limits[SHARE_MILLI] = job.gpu_milli
    elif job.num_gpu:
        limits["nvidia.com/gpu"] = job.num_gpu
    pod_spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "replay", "resources": {"limits": limits}}]
    }
    if job.gpu_spec:
        term = {"matchExpressions": [{"key": model_label, "operator": "In", "values": list(job.gpu_spec)}]}
        pod_spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        }
    policy: dict[str, Any] = {"queue": queue}
    if priority is not None:
        policy["priority"] = priority
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": JOB_KIND,
        "metadata": {
            "name": job.name,
            "namespace": job.queue,
            "annotations": {ANNOTATION_EXPECTED_DURATION: f"{job.duration:g}"},
        },
        "spec": {
            "runPolicy": {"schedulingPolicy": policy, "backoffLimit": 0},
            "pytorchReplicaSpecs": {
                "Master": {
                    "replicas": 1,
                    "restartPolicy": "Never",
                    "template": {
                        "metadata": {"annotations": {ANNOTATION_DURATION: repr(float(job.duration))}},
                        "spec": pod_spec,
                    },
                }
            },
        },
    }


def queue_documents(policy: str, queues: Iterable[str]) -> list[dict[str, Any]]:
    """The Queue objects a policy needs (see the module docstring)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown queue policy {policy!r}; allowed: {', '.join(POLICIES)}")

    def queue(name: str, strategy: str, aging: dict[str, Any] | None) -> dict[str, Any]:
        spec: dict[str, Any] = {"queueingStrategy": strategy, "weight": 1}
        if aging is not None:
            spec["aging"] = aging
        return {
            "apiVersion": "gpuyard.io/v1alpha1",
            "kind": "Queue",
            "metadata": {"name": name},
            "spec": spec,
        }

    if policy == "fifo":
        return [queue("fifo", "StrictFIFO", {"step": 0})]
    if policy == "priority":
        return [queue("priority", "BestEffortFIFO", {"step": 0})]
    return [queue(q, "BestEffortFIFO", None) for q in sorted(set(queues))]


def _queue_of(policy: str, job: TraceJob) -> tuple[str, int | None]:
    if policy == "fifo":
        return "fifo", None
    if policy == "priority":
        return "priority", job.priority
    return job.queue, job.priority


# --- the replay ----------------------------------------------------------------------------------


def _step(samples: list[tuple[float, int]], t: float, value: int) -> None:
    """Append (t, value) to a step function, replacing a sample at the same time."""
    if samples[-1][0] == t:
        samples[-1] = (t, value)
    else:
        samples.append((t, value))


class _Recorder:
    """Follows the store: job phases, first placement and start, Reservation GPU milli."""

    def __init__(self, platform: Platform, records: Mapping[tuple[str, str], JobRecord], t0: float) -> None:
        self.platform, self.records, self.t0 = platform, records, t0
        self.alloc = 0
        self.held: dict[tuple[str, str], int] = {}
        self.samples: list[tuple[float, int]] = [(0.0, 0)]
        self.by_queue: dict[str, int] = {}
        self.queue_samples: dict[str, list[tuple[float, int]]] = {}
        self.live_pods: set[tuple[str, str]] = set()
        self.unfinished = 0

    def now(self) -> float:
        return self.platform.clock.now() - self.t0

    async def run(self) -> None:
        async for ev in self.platform.store.watch([JOB_KIND, "Pod", "Reservation"]):
            obj, kind = ev.object, ev.object.kind
            if kind == "Reservation":
                self._reservation(obj, deleted=ev.type == "DELETED")
            elif kind == "Pod":
                self._pod(obj, deleted=ev.type == "DELETED")
            else:
                self._job(obj)

    def _reservation(self, obj: Any, *, deleted: bool) -> None:
        key = (obj.metadata.namespace, obj.metadata.name)
        milli = 0 if deleted else len(obj.spec.gpus) * obj.spec.gpu_milli
        change = milli - self.held.pop(key, 0)
        if milli:
            self.held[key] = milli
        if change:
            self.alloc += change
            t = self.now()
            _step(self.samples, t, self.alloc)
            queue = key[0]  # a replayed job's namespace is its queue
            self.by_queue[queue] = self.by_queue.get(queue, 0) + change
            _step(self.queue_samples.setdefault(queue, [(0.0, 0)]), t, self.by_queue[queue])

    def _pod(self, pod: Any, *, deleted: bool) -> None:
        key = (pod.metadata.namespace, pod.metadata.name)
        if deleted or pod.status.phase in TERMINAL:
            self.live_pods.discard(key)
        else:
            self.live_pods.add(key)
        rec = self.records.get((pod.metadata.namespace, pod.metadata.labels.get(LABEL_JOB_NAME, "")))
        if rec is None or deleted:
            return
        if rec.placed is None and pod.spec.node_name:
            created = pod.metadata.creation_timestamp
            rec.placed = created.timestamp() - self.t0 if created is not None else self.now()
        if rec.start is None and pod.status.start_time is not None:
            rec.start = pod.status.start_time.timestamp() - self.t0

    def _job(self, job: Any) -> None:
        rec = self.records.get((job.metadata.namespace, job.metadata.name))
        if rec is None or rec.phase in TERMINAL:
            return
        phase = job.status.phase or "Created"
        if phase in TERMINAL:
            done = job.status.completion_time
            rec.finish = done.timestamp() - self.t0 if done is not None else self.now()
            self.unfinished -= 1
        rec.phase = phase


async def run_replay(
    trace: Trace,
    *,
    scenario: Scenario,
    policy: str = "drf",
    model_label: str = LABEL_GPU_MODEL,
    documents: Sequence[Resource] = (),
    until: float | None = None,
    stall: float = 600.0,
) -> ReplayResult:
    """Replay `trace` on a fresh platform over `scenario`; see the module docstring.

    `documents`: validated ElasticQuota / ResourceQuota / Queue objects to load first (a Queue
    given there replaces the one the policy would create). `stall`: simulated seconds with no
    pod alive and no arrival left after which waiting jobs count as never started.
    """
    wall = time.perf_counter()
    clock = VirtualClock()
    settings = Settings(
        server={"host": "127.0.0.1", "port": 0}, backend={"data_dir": None, "clock": "virtual"}
    )
    platform = Platform(settings, scenario=scenario, clock=clock, serve_http=False, drive_clock=False)
    given = {(d.KIND, d.metadata.name) for d in documents}
    for doc in queue_documents(policy, trace.queues):
        if ("Queue", doc["metadata"]["name"]) not in given:
            await identified(platform.writer, USER).create(_queue(doc))
    for obj in documents:
        await identified(platform.writer, USER).create(obj)
    task = asyncio.create_task(platform.run(), name="gpuyard-replay-platform")
    watcher: asyncio.Task[None] | None = None
    try:
        await _started(platform, task)
        t0 = clock.now()
        records = {
            (j.queue, j.name): JobRecord(
                j.name, j.queue, j.queue, j.priority, j.submit, j.duration, j.gpu_request_milli
            )
            for j in trace.jobs
        }
        rec = _Recorder(platform, records, t0)
        watcher = asyncio.create_task(rec.run(), name="gpuyard-replay-recorder")
        stopped = await _drive(
            platform, task, trace, rec, policy=policy, model_label=model_label, until=until, stall=stall
        )
        for r in records.values():
            if r.phase not in TERMINAL and r.phase not in ("Rejected", "NotSubmitted"):
                r.phase = "Running" if r.start is not None else r.phase
        simulated = clock.now() - t0
    finally:
        if watcher is not None:  # before the platform: its stopping cancels the store's shared wake-up
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        platform.stop()
        await asyncio.wait_for(task, _START_TIMEOUT)
    return ReplayResult(
        policy=policy,
        jobs=list(records.values()),
        samples=rec.samples,
        total_milli=scenario.total_gpus * GPU_MILLI,
        wall_s=time.perf_counter() - wall,
        simulated_s=simulated,
        stopped=stopped,
        queue_samples=rec.queue_samples,
    )


def _queue(doc: Mapping[str, Any]) -> Resource:
    from gpuyard.apis.quota import parse_quota_document

    return parse_quota_document(dict(doc), current_quotas=[])


async def _started(platform: Platform, task: asyncio.Task[None]) -> None:
    synced = asyncio.create_task(platform.backend.synced.wait())
    done, _ = await asyncio.wait({synced, task}, timeout=_START_TIMEOUT, return_when="FIRST_COMPLETED")
    if synced not in done:
        synced.cancel()
        await asyncio.gather(synced, return_exceptions=True)
        raise RuntimeError("the fake cluster did not list its nodes within 10 s")
    store = platform.store
    models = {n.metadata.labels.get(LABEL_GPU_MODEL) for n in store.list("Node")} - {None, ""}

    def classes_ready() -> bool:
        return all(store.get("ResourceClass", "", f"nvidia.{m}") is not None for m in models)

    assert isinstance(platform.clock, VirtualClock)
    await platform.clock.run_until(classes_ready, timeout=5.0)


async def _drive(
    platform: Platform,
    task: asyncio.Task[None],
    trace: Trace,
    rec: _Recorder,
    *,
    policy: str,
    model_label: str,
    until: float | None,
    stall: float,
) -> str:
    clock = platform.clock
    assert isinstance(clock, VirtualClock)
    # absolute clock times: `now + (t - now)` lands exactly on t (both are large, close floats),
    # while `t0 + offset` compared with `now - t0` may differ in the last bit and never meet
    t0, jobs, n, i = rec.t0, trace.jobs, len(trace.jobs), 0
    arrivals = [t0 + j.submit for j in jobs]
    limit = math.inf if until is None else t0 + until
    idle_since: float | None = None
    while True:
        if task.done():
            task.result()  # re-raise what stopped the platform
            raise RuntimeError("the platform stopped during the replay")
        now = clock.now()
        if i < n and arrivals[i] <= now:
            while i < n and arrivals[i] <= now:
                await _submit(platform, jobs[i], rec, policy=policy, model_label=model_label)
                i += 1
            await settle()
            continue
        if i == n and rec.unfinished == 0:
            return "done"
        if i == n and not rec.live_pods and rec.alloc == 0:
            idle_since = now if idle_since is None else idle_since
            if now - idle_since >= stall:
                return "stalled"  # nothing runs, nothing arrives: what waits cannot start
        else:
            idle_since = None
        due = clock.next_due()
        target = min(arrivals[i] if i < n else math.inf, due if due is not None else math.inf)
        if target == math.inf:
            return "stalled"  # no arrival, no timer: nothing will ever change
        if idle_since is not None:
            target = min(target, idle_since + stall)
        if target >= limit:
            await clock.advance(max(0.0, limit - now))
            return "until"
        await clock.advance(max(0.0, target - now))
        if clock.now() == now and clock.next_due() == due and (i == n or arrivals[i] > now):
            await clock.advance(1e-6)  # a timer due within rounding of now: step past it


async def _submit(
    platform: Platform, job: TraceJob, rec: _Recorder, *, policy: str, model_label: str
) -> None:
    record = rec.records[(job.queue, job.name)]
    record.submit = rec.now()  # the trace's time as the clock holds it
    queue, priority = _queue_of(policy, job)
    doc = job_manifest(job, queue=queue, priority=priority, model_label=model_label)
    try:
        parsed = parse_job(doc)
    except JobValidationError as exc:
        record.phase, record.message = (
            "Rejected",
            "; ".join(f"{d['field']}: {d['reason']}" for d in exc.details),
        )
        return
    problems = validate_gang_request(parsed, store=platform.store)
    if problems:
        record.phase, record.message = "Rejected", "; ".join(f"{p.field}: {p.reason}" for p in problems)
        return
    await identified(platform.writer, USER).create(parsed)
    record.phase = "Created"
    rec.unfinished += 1


# --- metrics -------------------------------------------------------------------------------------


def stats(values: Sequence[float]) -> dict[str, float | None]:
    """Mean, p50, p95, p99 (linear interpolation, as numpy's default), rounded to 2 decimals;
    None for no values."""
    if not len(values):
        return {"mean": None, "p50": None, "p95": None, "p99": None}
    arr = np.asarray(values, dtype=float)
    p50, p95, p99 = np.percentile(arr, [50, 95, 99])
    return {"mean": _r2(arr.mean()), "p50": _r2(p50), "p95": _r2(p95), "p99": _r2(p99)}


def _r2(value: float | np.floating[Any] | None) -> float | None:
    """A figure of summary.json: 2 decimals (``7459.499999999999`` is ``7459.5``)."""
    return None if value is None else round(float(value), 2)


def time_weighted_mean(samples: Sequence[tuple[float, int]], *, start: float, end: float) -> float | None:
    """The mean of a step function (value holds from its time to the next) over [start, end]."""
    if end <= start or not samples:
        return None
    times = np.array([t for t, _ in samples], dtype=float)
    values = np.array([v for _, v in samples], dtype=float)
    edges = np.clip(np.append(times, end), start, end)
    # the value in force at `start` covers [start, first change after start)
    return float((np.diff(edges) * values).sum() / (end - start))


def utilisation_steps(
    samples: Sequence[tuple[float, int]], *, step: float, end: float
) -> list[tuple[float, int]]:
    """The step function sampled every `step` seconds from 0 to `end` (the value in force then)."""
    if step <= 0:
        raise ValueError(f"step must be positive, got {step}")
    times = np.array([t for t, _ in samples], dtype=float)
    values = [v for _, v in samples]
    grid = np.arange(0.0, end + step / 2, step)
    idx = np.searchsorted(times, grid, side="right") - 1
    return [(float(t), int(values[k]) if k >= 0 else 0) for t, k in zip(grid, idx, strict=True)]


def summarize(result: ReplayResult, *, rows: Sequence[tuple[float, int]] | None = None) -> dict[str, Any]:
    """The figures of `summary.json`; `rows` are the utilisation.csv rows (default: every change)."""
    jobs = result.jobs
    finished = [j for j in jobs if j.phase == "Succeeded"]
    started = [j for j in jobs if j.start is not None]
    first = min((j.submit for j in jobs), default=0.0)
    last = max((j.finish for j in jobs if j.finish is not None), default=None)
    end = last if last is not None else result.simulated_s
    total = result.total_milli or 1
    rows = result.samples if rows is None else rows
    return {
        "policy": result.policy,
        "stopped": result.stopped,
        "jobs": {
            "total": len(jobs),
            "finished": len(finished),
            "failed": sum(j.phase == "Failed" for j in jobs),
            "rejected": sum(j.phase == "Rejected" for j in jobs),
            "running": sum(j.start is not None and j.finish is None for j in jobs),
            "never_started": sum(j.start is None for j in jobs),
        },
        "jct_s": stats([j.jct for j in finished if j.jct is not None]),
        "queueing_delay_s": stats([j.queueing_delay for j in started if j.queueing_delay is not None]),
        "gpu_utilisation_pct": {
            "mean_of_samples": _r2(float(np.mean([v for _, v in rows])) * 100 / total) if rows else None,
            "time_weighted": _r2(_pct(time_weighted_mean(result.samples, start=first, end=end), total)),
            "peak": _r2(max((v for _, v in result.samples), default=0) * 100 / total),
            "window_s": [first, end],
        },
        "total_gpu_milli": result.total_milli,
        "makespan_s": (last - first) if last is not None else None,
        "simulated_s": result.simulated_s,
        "wall_s": result.wall_s,
        **result.extra,
    }


def _pct(value: float | None, total: int) -> float | None:
    return None if value is None else value * 100 / total


# --- output files --------------------------------------------------------------------------------

JOB_FIELDS = ("name", "namespace", "queue", "priority", "gpu_milli", "submit", "placed", "start", "finish",
              "duration", "queueing_delay", "jct", "phase", "message")  # fmt: skip


def write_jobs_csv(result: ReplayResult, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(JOB_FIELDS)
        for j in sorted(result.jobs, key=lambda j: (j.submit, j.name)):
            w.writerow(
                [
                    "" if (v := getattr(j, k)) is None else (f"{v:g}" if isinstance(v, float) else v)
                    for k in JOB_FIELDS
                ]
            )
    return path


def write_utilisation_csv(rows: Sequence[tuple[float, int]], total: int, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["time_s", "allocated_gpu_milli", "total_gpu_milli", "pct"])
        for t, v in rows:
            w.writerow([f"{t:g}", v, total, f"{v * 100 / (total or 1):.2f}"])
    return path


def write_summary_json(summary: Mapping[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return path


def pending_steps(jobs: Iterable[JobRecord]) -> list[tuple[float, int]]:
    """Jobs waiting (submitted, not yet started) over time, as a step function from (0, 0).
    A job never started waits from its submit time on; one never submitted is not counted."""
    changes: dict[float, int] = {}
    for j in jobs:
        if j.phase in ("NotSubmitted", "Rejected"):
            continue
        changes[j.submit] = changes.get(j.submit, 0) + 1
        if j.start is not None:
            changes[j.start] = changes.get(j.start, 0) - 1
    steps = [(0.0, 0)]
    level = 0
    for t in sorted(changes):
        level += changes[t]
        _step(steps, t, level)
    return steps


def write_plot(result: ReplayResult, path: str | Path) -> Path | None:
    """GPU allocation over time (total, and per queue), and the jobs waiting, as a PNG; ``None``
    (nothing written) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    end = result.simulated_s
    total = result.total_milli or 1

    def stairs(samples: Sequence[tuple[float, int]], scale: float) -> tuple[list[float], list[float]]:
        kept = [(t, v) for t, v in samples if t < end] or [(0.0, 0)]
        return [v * scale for _, v in kept], [t for t, _ in kept] + [max(end, kept[-1][0])]

    fig, (ax, low) = plt.subplots(2, 1, figsize=(10, 6), sharex=True, height_ratios=(2, 1))
    values, edges = stairs(result.samples, 100 / total)
    ax.stairs(values, edges, fill=True, alpha=0.3, label="all queues")
    for queue in sorted(result.queue_samples):
        values, edges = stairs(result.queue_samples[queue], 100 / total)
        ax.stairs(values, edges, linewidth=1.2, label=queue)
    ax.set_ylabel("GPU allocated (% of cluster)")
    ax.set_ylim(0, 100)
    ax.set_title(f"gpuyard replay ({result.policy})")
    ax.grid(alpha=0.3)
    if result.queue_samples:
        ax.legend(loc="upper right", fontsize=8)
    values, edges = stairs(pending_steps(result.jobs), 1.0)
    low.stairs(values, edges, color="C3")
    low.set_ylabel("jobs waiting")
    low.set_xlabel("simulated time (s)")
    low.set_ylim(bottom=0)
    low.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
