"""The openb saturation experiment of the FGD paper: replay, curves, summaries, files.

Method (what the FGD paper's simulator does, see docs/simulation.md):

0. Name the nodes the way the simulator does (seeded ``%04d-`` prefixes, `simulator_node_names`),
   since ties between equal scores go to the node whose name sorts first.
1. Tune the pod list to ``load`` (1.3) x the cluster's GPU milli and shuffle it with the seed
   (`gpuyard.sim.traces.tune_workload`).
2. Schedule the pods one by one; pods never leave; a pod that fits nowhere is skipped and counted
   as failed. The policy learns its typical pods from the trace's pod list before tuning.
3. After each pod record arrived GPU milli (requested by all pods so far, placed or not), allocated
   GPU milli, and the cluster's fragmentation (sum of FGD's F_n over nodes).
4. Curves at each integer arrived % k = 0..130, as the paper's ``analysis_allo_discrete.csv``:
   the mean of the allocation % (each rounded to 2 decimals) over the pods whose arrived % rounds
   to k (half to even), rounded to 2 decimals; where no pod rounds to k, the pods within k +- 1.

The placement step sits behind `Placer` (``place(pod) -> (node, gpus) | None``, which also
commits the placement in the placer's own view of the cluster), plugged in with
``run_openb(..., placer_factory=...)``: `PackingPlacer` (the default of this function) calls
`gpuyard.scheduler.placement.packing` on flat arrays; `gpuyard.sim.framework_placer.FrameworkPlacer` (what
`gpuyard simulate openb` uses unless told ``--engine packing``) sends every pod through the live
scheduler — Snapshot, filters, `place()`, the packing plugins — and places each one the same way. Whatever the placer,
the run mirrors every placement into its own ledger `ClusterState`, which raises if a placer ever
over-commits a node or mixes whole and shared use of one GPU.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from gpuyard.scheduler.placement.packing import (
    ClusterState,
    FragmentationModel,
    PackingPolicy,
    PodRequest,
    TypicalPods,
    get_policy,
)
from gpuyard.sim.traces import NodeTrace, PodTrace, tune_workload

__all__ = [
    "CURVE_POINTS",
    "PAPER_POLICY_NAMES",
    "PUBLISHED_MEANS",
    "SUMMARY_POINTS",
    "PackingPlacer",
    "Placer",
    "PlacerFactory",
    "Result",
    "discretize",
    "is_default_trace",
    "packing_placer",
    "plot_title",
    "published_at",
    "published_curves",
    "published_seed_curves",
    "run_many",
    "run_openb",
    "seeds_text",
    "simulator_node_names",
    "summarize",
    "write_alloc_csv",
    "write_plot",
    "write_summary_json",
]

CURVE_POINTS = 131
"""Curves hold one value per integer arrived % from 0 to 130."""
SUMMARY_POINTS = (80, 90, 100, 130)

PAPER_POLICY_NAMES = {
    "random": "01-Random",
    "dot-product": "02-DotProd",
    "gpu-clustering": "03-GpuClustering",
    "gpu-packing": "04-GpuPacking",
    "best-fit": "05-BestFit",
    "fgd": "06-FGD",
}
"""Our policy names -> the row names of the paper's result files."""

PUBLISHED_MEANS = {
    "random": {80: 78.66, 90: 85.02, 100: 86.30, 130: 87.47},
    "dot-product": {80: 80.02, 90: 89.98, 100: 90.62, 130: 90.85},
    "gpu-clustering": {80: 80.02, 90: 89.98, 100: 91.65, 130: 91.88},
    "gpu-packing": {80: 80.02, 90: 89.98, 100: 91.78, 130: 92.00},
    "best-fit": {80: 80.02, 90: 89.99, 100: 92.86, 130: 93.08},
    "fgd": {80: 80.02, 90: 89.98, 100: 95.23, 130: 95.39},
}
"""Published 10-seed (42..51) mean GPU allocation % of the default trace at 80/90/100/130 % arrived
(from the simulator repository's ``expected_results/analysis_allo_discrete.csv``)."""

_DEFAULT_TRACE = {"nodes": 1213, "gpus": 6212, "pods": 8152}
_NODE_ORDER_STREAM = 0x6E6F646573  # "nodes": keeps the node permutation apart from the workload draws


class Placer(Protocol):
    """Places one pod and commits it in its own view of the cluster."""

    def place(self, pod: PodRequest) -> tuple[int, tuple[int, ...]] | None: ...


class PlacerFactory(Protocol):
    """Builds a fresh placer for one run over an empty cluster."""

    def __call__(
        self, *, state: ClusterState, workload: Sequence[PodRequest], policy: str, seed: int
    ) -> Placer: ...


class PackingPlacer:
    """The default placer: ``policy.place`` (`gpuyard.scheduler.placement.packing`) on its own `ClusterState`."""

    def __init__(self, state: ClusterState, policy: PackingPolicy) -> None:
        self.state = state
        self.policy = policy

    def place(self, pod: PodRequest) -> tuple[int, tuple[int, ...]] | None:
        choice = self.policy.place(self.state, pod)
        if choice is not None:
            self.state.allocate(choice[0], choice[1], pod)
        return choice


def packing_placer(*, state: ClusterState, workload: Sequence[PodRequest], policy: str, seed: int) -> Placer:
    """`PlacerFactory` for `PackingPlacer` with the named policy, prepared on ``workload``."""
    packing = get_policy(policy, seed=seed)
    packing.prepare(workload)
    return PackingPlacer(state, packing)


@dataclass(slots=True)
class Result:
    """One run: a policy on one seed's workload."""

    policy: str
    seed: int
    load: float
    total_gpu_milli: int
    pods: int
    placed: int
    failed: int
    alloc: np.ndarray
    """float[131]: GPU allocation % at arrived % 0..130 (NaN where the run has no data)."""
    frag_rate: np.ndarray
    """float[131]: fragmented share of the idle GPU milli, % (same points)."""
    final_alloc: float
    final_frag_rate: float
    wall_s: float
    cpu_s: float
    """CPU time of the process during the run (less sensitive than wall time to a busy machine)."""
    steps: np.ndarray
    """float[P, 3]: after each pod, (arrived %, allocation %, fragmentation rate %)."""

    def alloc_at(self, pct: int) -> float:
        return float(self.alloc[pct])

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "seed": self.seed,
            "load": self.load,
            "pods": self.pods,
            "placed": self.placed,
            "failed": self.failed,
            "final_alloc_pct": round(self.final_alloc, 2),
            "final_frag_rate_pct": round(self.final_frag_rate, 2),
            "alloc_pct": {str(p): _num(self.alloc[p]) for p in SUMMARY_POINTS if p < len(self.alloc)},
            "wall_s": round(self.wall_s, 3),
            "cpu_s": round(self.cpu_s, 3),
        }


def _num(x: float) -> float | None:
    return None if np.isnan(x) else round(float(x), 2)


def _mean_at(runs: Sequence[Result], pct: int) -> float | None:
    values = [r.alloc[pct] for r in runs if pct < len(r.alloc) and not np.isnan(r.alloc[pct])]
    return round(float(np.mean(values)), 2) if values else None


def discretize(arrived_pct: np.ndarray, values_pct: np.ndarray, *, points: int = CURVE_POINTS) -> np.ndarray:
    """Mean of ``values_pct`` (rounded to 2 decimals) per rounded arrived %; k +- 1 where k is empty."""
    bucket = np.round(np.asarray(arrived_pct, dtype=np.float64)).astype(np.int64)
    vals = np.round(np.asarray(values_pct, dtype=np.float64), 2)
    keep = (bucket >= 0) & (bucket < points + 1)
    bucket, vals = bucket[keep], vals[keep]
    sums = np.bincount(bucket, weights=vals, minlength=points + 1)[: points + 1]
    counts = np.bincount(bucket, minlength=points + 1)[: points + 1]
    out = np.full(points, np.nan)
    for k in range(points):
        if counts[k]:
            out[k] = sums[k] / counts[k]
        else:
            lo, hi = max(k - 1, 0), min(k + 1, points)
            c = counts[lo : hi + 1].sum()
            if c:
                out[k] = sums[lo : hi + 1].sum() / c
    return np.round(out, 2)


def run_openb(
    nodes: NodeTrace,
    pods: PodTrace,
    *,
    policy: str,
    seed: int,
    load: float = 1.3,
    placer_factory: PlacerFactory = packing_placer,
    node_order: Literal["simulator", "trace"] = "simulator",
) -> Result:
    """Run the saturation experiment once (see the module docstring).

    ``node_order="simulator"`` (the default) names the nodes as the paper's simulator does before
    it schedules anything: sorted by name, each gets a ``"%04d-"`` prefix from a random
    permutation drawn with the seed, so "ties go to the name that sorts first" is a random but
    fixed node order per seed. ``"trace"`` keeps the trace's names (ties then follow them).
    """
    started, started_cpu = time.perf_counter(), time.process_time()
    if node_order == "simulator":
        nodes = simulator_node_names(nodes, seed=seed)
    elif node_order != "trace":
        raise ValueError(f"node_order must be 'simulator' or 'trace', got {node_order!r}")
    ledger = nodes.to_state()
    total = ledger.total_gpu_milli
    if total <= 0:
        raise ValueError(f"{nodes.path}: the cluster has no GPUs")
    requests = pods.requests(ledger)
    order = tune_workload(pods, cluster_gpu_milli=total, load=load, seed=seed)
    placer = placer_factory(state=ledger.copy(), workload=requests, policy=policy, seed=seed)
    frag = FragmentationModel(TypicalPods.from_workload(requests))
    frag.sync(ledger)
    req_milli = pods.total_gpu_milli
    n = len(order)
    arrived = np.cumsum(req_milli[order]) if n else np.zeros(0, dtype=np.int64)
    used = np.zeros(n, dtype=np.int64)
    frag_int = np.zeros(n, dtype=np.int64)
    allocated, failed = 0, 0
    frag_total = int(frag.frag_int.sum())
    for j, i in enumerate(order):
        pod = requests[i]
        choice = placer.place(pod)
        if choice is None:
            failed += 1
        else:
            node, gpus = choice
            ledger.allocate(node, gpus, pod)
            allocated += int(req_milli[i])
            before = int(frag.frag_int[node])
            frag.sync(ledger, rows=np.array([node]))
            frag_total += int(frag.frag_int[node]) - before
        used[j] = allocated
        frag_int[j] = frag_total
    idle = total - used
    frag_milli = frag_int / frag.C
    with np.errstate(invalid="ignore", divide="ignore"):
        frag_rate = np.where(idle > 0, 100.0 * frag_milli / np.maximum(idle, 1), 0.0)
    arrived_pct = 100.0 * arrived / total
    alloc_pct = 100.0 * used / total
    return Result(
        policy=policy,
        seed=seed,
        load=load,
        total_gpu_milli=total,
        pods=n,
        placed=n - failed,
        failed=failed,
        alloc=discretize(arrived_pct, alloc_pct),
        frag_rate=discretize(arrived_pct, frag_rate),
        final_alloc=float(alloc_pct[-1]) if n else 0.0,
        final_frag_rate=float(frag_rate[-1]) if n else 0.0,
        wall_s=time.perf_counter() - started,
        cpu_s=time.process_time() - started_cpu,
        steps=np.column_stack([arrived_pct, alloc_pct, frag_rate]),
    )


def simulator_node_names(nodes: NodeTrace, *, seed: int) -> NodeTrace:
    """``nodes`` renamed as the paper's simulator names them: ``f"{perm[i]:04d}-{name}"`` over the
    name-sorted nodes, ``perm`` a permutation drawn from the seed (its own stream, independent of
    the workload's)."""
    n = len(nodes)
    perm = np.random.default_rng([seed, _NODE_ORDER_STREAM]).permutation(n)
    width = max(4, len(str(n - 1)))
    rank = np.empty(n, dtype=np.int64)
    rank[sorted(range(n), key=nodes.names.__getitem__)] = np.arange(n)
    names = [f"{perm[rank[i]]:0{width}d}-{name}" for i, name in enumerate(nodes.names)]
    return replace(nodes, names=names)


def run_many(
    nodes: NodeTrace,
    pods: PodTrace,
    *,
    policies: Sequence[str],
    seeds: Sequence[int],
    load: float = 1.3,
    placer_factory: PlacerFactory = packing_placer,
    node_order: Literal["simulator", "trace"] = "simulator",
    on_result: Callable[[Result], None] | None = None,
) -> list[Result]:
    """`run_openb` for every (policy, seed), policies outermost."""
    results = []
    for policy in policies:
        for seed in seeds:
            r = run_openb(
                nodes,
                pods,
                policy=policy,
                seed=seed,
                load=load,
                placer_factory=placer_factory,
                node_order=node_order,
            )
            results.append(r)
            if on_result is not None:
                on_result(r)
    return results


def is_default_trace(nodes: NodeTrace, pods: PodTrace) -> bool:
    """True for the paper's default openb trace (the published figures apply)."""
    return (
        len(nodes) == _DEFAULT_TRACE["nodes"]
        and int(nodes.gpus.sum()) == _DEFAULT_TRACE["gpus"]
        and len(pods) == _DEFAULT_TRACE["pods"]
        and Path(pods.path).name.startswith("openb_pod_list_default")
    )


def summarize(results: Iterable[Result], *, published: bool) -> dict[str, dict[str, Any]]:
    """Per policy: mean over seeds of allocation % at 80/90/100/130, failed pods, seconds per run."""
    by_policy: dict[str, list[Result]] = {}
    for r in results:
        by_policy.setdefault(r.policy, []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for policy, runs in by_policy.items():
        entry: dict[str, Any] = {
            "seeds": [r.seed for r in runs],
            "load": runs[0].load,
            "alloc_pct_mean": {str(p): _mean_at(runs, p) for p in SUMMARY_POINTS},
            "failed_pods_mean": round(float(np.mean([r.failed for r in runs])), 1),
            "final_frag_rate_pct_mean": round(float(np.mean([r.final_frag_rate for r in runs])), 2),
            "wall_s_per_run": round(float(np.mean([r.wall_s for r in runs])), 3),
            "cpu_s_per_run": round(float(np.mean([r.cpu_s for r in runs])), 3),
        }
        if published and policy in PUBLISHED_MEANS:
            pub = PUBLISHED_MEANS[policy]
            entry["published_alloc_pct_mean"] = {str(p): pub[p] for p in SUMMARY_POINTS}
            entry["delta_vs_published"] = {
                str(p): None
                if entry["alloc_pct_mean"][str(p)] is None
                else round(entry["alloc_pct_mean"][str(p)] - pub[p], 2)
                for p in SUMMARY_POINTS
            }
        out[policy] = entry
    if published:
        out["_published"] = {k: {str(p): v for p, v in pub.items()} for k, pub in PUBLISHED_MEANS.items()}
    return out


def write_alloc_csv(
    results: Iterable[Result], path: str | Path, *, workload: str, paper_names: bool = False
) -> Path:
    """Curves in the paper's layout: ``workload, sc_policy, tune, seed, total_gpus, 0, ..., 130``.

    With ``paper_names``, ``sc_policy`` uses the paper's row names (``06-FGD``...) where one exists.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["workload", "sc_policy", "tune", "seed", "total_gpus", *map(str, range(CURVE_POINTS))])
        for r in results:
            cells = ["" if np.isnan(v) else f"{v:.2f}".rstrip("0").rstrip(".") for v in r.alloc]
            name = PAPER_POLICY_NAMES.get(r.policy, r.policy) if paper_names else r.policy
            w.writerow([workload, name, r.load, r.seed, r.total_gpu_milli // 1000, *cells])
    return path


def write_summary_json(
    results: Iterable[Result], path: str | Path, *, published: bool, extra: dict[str, Any] | None = None
) -> Path:
    """The `summarize` figures (plus each run's own figures) as JSON."""
    results = list(results)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        **(extra or {}),
        "policies": summarize(results, published=published),
        "runs": [r.to_json() for r in results],
    }
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return path


PUBLISHED_NAMES = {
    "01-Random": "random",
    "02-DotProd": "dot-product",
    "03-GpuClustering": "gpu-clustering",
    "04-GpuPacking": "gpu-packing",
    "05-BestFit": "best-fit",
    "06-FGD": "fgd",
}


def published_seed_curves() -> dict[str, dict[int, np.ndarray]]:
    """The FGD paper's allocation curve per policy and seed on the default trace.

    Read from `sim/data/fgd_expected_alloc_default.csv` (the paper simulator's
    `expected_results`, columns 0..130 = GPU allocation % at each % of arrived load; seeds 42..51).
    """
    rows: dict[str, dict[int, np.ndarray]] = {}
    with (Path(__file__).parent / "data" / "fgd_expected_alloc_default.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            name = PUBLISHED_NAMES.get(row["sc_policy"])
            if name is not None:
                curve = np.array([float(row[str(i)]) for i in range(CURVE_POINTS)])
                rows.setdefault(name, {})[int(row["seed"])] = curve
    return rows


def published_curves(seeds: Iterable[int] | None = None) -> dict[str, np.ndarray]:
    """The paper's per-policy allocation curves on the default trace: the mean over `seeds`
    (default: every seed it published); a policy lacking one of the seeds is left out."""
    out: dict[str, np.ndarray] = {}
    wanted = None if seeds is None else list(seeds)
    for name, by_seed in published_seed_curves().items():
        keys = sorted(by_seed) if wanted is None else wanted
        if keys and all(k in by_seed for k in keys):
            out[name] = np.mean(np.array([by_seed[k] for k in keys]), axis=0)
    return out


def published_at(policy: str, seeds: Iterable[int], points: Iterable[int]) -> dict[int, float] | None:
    """The paper's allocation % for `policy` at `points` (arrived %), mean over `seeds`, 2
    decimals; None when the paper has no curve for that policy and every one of those seeds."""
    curve = published_curves(seeds).get(policy)
    if curve is None:
        return None
    return {p: round(float(curve[p]), 2) for p in points}


def seeds_text(seeds: Iterable[int]) -> str:
    """``[42, 43, 44, 50]`` -> ``"42-44, 50"``."""
    ordered = sorted(set(seeds))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ", ".join(parts)


def plot_title(results: Sequence[Result], *, trace: str | None = None) -> str:
    """The openb plot's title: the trace, the load and the seeds its curves are the mean of."""
    seeds = sorted({r.seed for r in results})
    loads = sorted({r.load for r in results})
    what = f"{trace}: " if trace else ""
    load = f", load {', '.join(f'{x:g}' for x in loads)}" if loads else ""
    n = len(seeds)
    return f"{what}GPU allocation, mean of {n} seed{'s' if n != 1 else ''} ({seeds_text(seeds)}){load}"


def write_plot(
    results: Iterable[Result], path: str | Path, *, published: bool = False, trace: str | None = None
) -> Path | None:
    """Mean allocation curve per policy as a PNG, the whole range and a zoom on 80-130 % load,
    titled with the trace (`trace`, e.g. the pod list's name) and the seeds, with the paper's
    published curves for the same seeds dashed alongside when `published`; ``None`` (nothing
    written) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    results = list(results)
    by_policy: dict[str, list[np.ndarray]] = {}
    for r in results:
        by_policy.setdefault(r.policy, []).append(r.alloc)
    paper = published_curves(sorted({r.seed for r in results})) if published else {}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    x = np.arange(CURVE_POINTS)
    for ax in axes:
        for i, (policy, curves) in enumerate(by_policy.items()):
            color = f"C{i}"
            stack = np.vstack(curves)
            seen = (~np.isnan(stack)).sum(axis=0)
            mean = np.where(
                seen > 0, np.nansum(stack, axis=0) / np.maximum(seen, 1), np.nan
            )  # NaN where no run has data
            ax.plot(x, mean, color=color, label=f"{policy} (gpuyard)")
            if policy in paper:
                ax.plot(
                    x, paper[policy], color=color, linestyle="--", linewidth=1, label=f"{policy} (published)"
                )
        ax.plot(x, np.minimum(x, 100), color="grey", linestyle=":", linewidth=1, label="ideal")
        ax.set_xlabel("arrived GPU request (% of cluster GPUs)")
        ax.set_ylabel("GPU allocation (%)")
        ax.grid(alpha=0.3)
    axes[0].set_xlim(0, CURVE_POINTS - 1)
    axes[1].set_xlim(80, CURVE_POINTS - 1)
    axes[1].set_ylim(80, 100)
    axes[1].set_title("zoom: 80-130 % arrived")
    axes[1].legend(loc="lower right", fontsize=8)
    fig.suptitle(plot_title(results, trace=trace))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
