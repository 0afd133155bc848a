"""``gpuyard simulate openb``: the openb saturation experiment from the command line.

Mounted by ``gpuyard.cli`` under the ``simulate`` group. It loads the trace, runs every
(policy, seed), prints a per-policy summary and writes three files to ``--out``:

* ``openb_alloc.csv``: allocation curves in the paper's layout (``workload, sc_policy, tune,
  seed, total_gpus, 0..130``), one row per run;
* ``summary.json``: per policy the mean over seeds at 80/90/100/130 % arrived load (with the
  published figures alongside when the trace is the paper's default one), and every run's figures;
* ``openb_alloc.png``: mean curve per policy, only where matplotlib is installed (the ``plot``
  extra: ``pip install 'gpuyard[plot]'``, ``make plot`` in a checkout); otherwise it says so and
  how to get it, and writes no picture.

Bad input (missing column, non-numeric field, unknown GPU model, unknown policy, bad seed list)
prints one line naming the file, line and column (or the option) and exits with code 2.
"""

from __future__ import annotations

import re
import textwrap
from functools import partial
from pathlib import Path
from typing import Any, Literal

import click

from gpuyard.scheduler.placement.packing import POLICIES
from gpuyard.scheduler.placement.profiles import default_registry
from gpuyard.sim.framework_placer import framework_placer
from gpuyard.sim.openb import _DEFAULT_TRACE as PAPER_TRACE
from gpuyard.sim.openb import (
    SUMMARY_POINTS,
    PlacerFactory,
    Result,
    is_default_trace,
    packing_placer,
    run_many,
    summarize,
    write_alloc_csv,
    write_plot,
    write_summary_json,
)
from gpuyard.sim.plotting import no_plot_line, out_help
from gpuyard.sim.traces import NodeTrace, PodTrace, TraceError, load_openb_nodes, load_openb_pods

__all__ = ["ENGINES", "openb", "parse_policies", "parse_seeds", "summary_notes"]

ENGINES: dict[str, PlacerFactory] = {"scheduler": framework_placer, "packing": packing_placer}
"""--engine name -> how each pod is placed."""

_RANGE = re.compile(r"^\s*(-?\d+)\s*(?:-\s*(-?\d+)\s*)?$")


def parse_seeds(text: str) -> list[int]:
    """``"42-51"``, ``"42,45,50-52"`` -> the seeds, in order, without repeats. Raises ValueError."""
    seeds: list[int] = []
    for part in text.split(","):
        m = _RANGE.match(part)
        if not m:
            raise ValueError(f"bad seed {part.strip()!r}: use numbers and ranges like 42-51,60")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise ValueError(f"bad seed range {part.strip()!r}: the end is before the start")
        if hi - lo > 100_000:
            raise ValueError(f"seed range {part.strip()!r} is too long")
        seeds.extend(s for s in range(lo, hi + 1) if s not in seeds)
    if not seeds:
        raise ValueError("no seeds given")
    return seeds


def parse_policies(text: str) -> list[str]:
    """``"fgd,gpuyard"`` -> names, checked against the registry (``all``: every policy). Raises ValueError."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    if names == ["all"]:
        return list(POLICIES)
    unknown = [p for p in names if p not in POLICIES]
    if unknown or not names:
        bad = unknown[0] if unknown else text
        raise ValueError(f"unknown policy {bad!r}; known: {', '.join(POLICIES)}")
    return list(dict.fromkeys(names))


def _fail(ctx: click.Context, message: str) -> None:
    click.echo(f"error: {message}", err=True)
    ctx.exit(2)


@click.command("openb")
@click.option("--nodes", "nodes_path", required=True, type=click.Path(path_type=Path), help="Node list CSV.")
@click.option("--pods", "pods_path", required=True, type=click.Path(path_type=Path), help="Pod list CSV.")
@click.option(
    "--policy",
    "policy_text",
    default="fgd,gpuyard",
    show_default=True,
    help=f"Comma-separated packing policies, or 'all'. Known: {', '.join(POLICIES)}.",
)
@click.option(
    "--seeds",
    "seed_text",
    default="42-51",
    show_default=True,
    help="Seeds: numbers and ranges, e.g. 42-51,60.",
)
@click.option(
    "--load",
    type=float,
    default=1.3,
    show_default=True,
    help="Arrived GPU request as a multiple of cluster GPUs.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("out/openb"),
    show_default=True,
    help=out_help("openb_alloc.csv and summary.json", "openb_alloc.png"),
)
@click.option(
    "--node-order",
    type=click.Choice(["simulator", "trace"]),
    default="simulator",
    show_default=True,
    help="Tie-break order: the paper simulator's seeded node renaming, or the trace's node names.",
)
@click.option(
    "--engine",
    type=click.Choice(list(ENGINES)),
    default="scheduler",
    show_default=True,
    help="scheduler: every pod through the live scheduler (Snapshot, filters, place(), the 'packing' "
    "profile); packing: the packing policies on flat arrays only (faster, same placements).",
)
@click.option(
    "--profile",
    default="packing",
    show_default=True,
    help="Scheduler profile for --engine scheduler: 'packing' (the policy alone, as the paper runs it) "
    "or a live profile such as 'default' (the policy with failover, topology and GPU-type scores).",
)
@click.pass_context
def openb(
    ctx: click.Context,
    nodes_path: Path,
    pods_path: Path,
    policy_text: str,
    seed_text: str,
    load: float,
    out_dir: Path,
    node_order: Literal["simulator", "trace"],  # a click.Choice of these
    engine: str,
    profile: str,
) -> None:
    """Replay the Alibaba openb trace to saturation and compare GPU-packing policies (FGD paper, Fig. 7)."""
    try:
        policies = parse_policies(policy_text)
    except ValueError as e:
        _fail(ctx, f"--policy: {e}")
        return
    try:
        seeds = parse_seeds(seed_text)
    except ValueError as e:
        _fail(ctx, f"--seeds: {e}")
        return
    if not load > 0:
        _fail(ctx, f"--load: must be positive, got {load}")
        return
    try:
        nodes = load_openb_nodes(nodes_path)
        pods = load_openb_pods(pods_path, models=nodes.model_names)
    except TraceError as e:
        _fail(ctx, str(e))
        return
    if nodes.total_gpu_milli == 0:
        _fail(ctx, f"{nodes_path}: the cluster has no GPUs")
        return

    placer_factory = ENGINES[engine]
    if engine == "scheduler":
        profiles = default_registry().profiles
        if profile not in profiles:
            _fail(
                ctx, f"--profile: unknown scheduler profile {profile!r}; known: {', '.join(sorted(profiles))}"
            )
            return
        placer_factory = partial(framework_placer, profile=profile)
    published = is_default_trace(nodes, pods)
    total = len(policies) * len(seeds)
    results = _run_with_progress(
        nodes,
        pods,
        policies=policies,
        seeds=seeds,
        load=load,
        node_order=node_order,
        total=total,
        placer_factory=placer_factory,
    )

    workload = pods_path.stem
    csv_path = write_alloc_csv(results, out_dir / "openb_alloc.csv", workload=workload)
    json_path = write_summary_json(
        results,
        out_dir / "summary.json",
        published=published,
        extra={
            "nodes": str(nodes_path),
            "pods": str(pods_path),
            "load": load,
            "seeds": seeds,
            "node_order": node_order,
            "engine": engine,
            "profile": profile if engine == "scheduler" else None,
        },
    )
    png_path = write_plot(results, out_dir / "openb_alloc.png", published=published, trace=workload)
    summary = summarize(results, published=published)
    _print_summary(summary, published=published)
    for note in summary_notes(nodes, pods, summary, published=published):
        click.echo(textwrap.fill(note, width=100, subsequent_indent="      "))
    click.echo(f"wrote {csv_path}")
    click.echo(f"wrote {json_path}")
    if png_path is None:
        click.echo(no_plot_line("openb_alloc.png"))
    else:
        click.echo(f"wrote {png_path}")


def _run_with_progress(
    nodes: NodeTrace,
    pods: PodTrace,
    *,
    policies: list[str],
    seeds: list[int],
    load: float,
    node_order: Literal["simulator", "trace"],
    total: int,
    placer_factory: PlacerFactory,
) -> list[Result]:
    from rich.console import Console

    run = partial(
        run_many,
        nodes,
        pods,
        policies=policies,
        seeds=seeds,
        load=load,
        node_order=node_order,
        placer_factory=placer_factory,
    )
    console = Console(stderr=True)
    if not console.is_terminal:
        return run()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("openb runs", total=total)

        def advance(r: Result) -> None:
            progress.update(task, advance=1, description=f"done: {r.policy} seed {r.seed}")

        return run(on_result=advance)


def summary_notes(
    nodes: NodeTrace, pods: PodTrace, summary: dict[str, dict[str, Any]], *, published: bool
) -> list[str]:
    """The lines under the summary table that say what its figures can and cannot tell.

    * Another trace than the paper's: its size beside the paper's, and that the policies need not
      rank as they do on the full trace (where `gpuyard` allocates more than `fgd`).
    * A cluster where one pod asks for a large part of the GPUs (the bundled 15-GPU sample): each
      figure moves in steps that large, so one placement can decide the order.
    * A `-` in the table: no seed's arrived GPU request came within 1 % of that load point.
    """
    notes: list[str] = []
    total_milli = nodes.total_gpu_milli
    if not published:
        paper = PAPER_TRACE
        notes.append(
            f"note: {Path(pods.path).name} on {Path(nodes.path).name} is {len(nodes)} nodes, "
            f"{int(nodes.gpus.sum())} GPUs, {len(pods)} pods, not the paper's openb trace "
            f"({paper['nodes']} nodes, {paper['gpus']} GPUs, {paper['pods']} pods): no published "
            "figures to compare, and the policies need not rank as on the full trace, where gpuyard "
            "allocates more than fgd (docs/simulation.md#measured-figures)."
        )
    largest = int(pods.total_gpu_milli.max()) if len(pods) else 0
    step = 100.0 * largest / total_milli if total_milli else 0.0
    if step >= 1.0:
        notes.append(
            f"note: one pod asks for up to {step:.0f} % of this cluster's GPUs, so allocation moves "
            "in steps that large: on so few GPUs a single placement can put one policy ahead."
        )
    shown = [e["alloc_pct_mean"] for k, e in summary.items() if not k.startswith("_")]
    if any(row.get(str(p)) is None for row in shown for p in SUMMARY_POINTS):
        notes.append(
            "note: '-' = in no seed did the arrived GPU request come within 1 % of that load "
            "(one pod's request stepped over it): there is nothing to measure there, it is not 0."
        )
    return notes


def _print_summary(summary: dict[str, dict[str, Any]], *, published: bool) -> None:
    head = "policy".ljust(16) + "".join(f"{p:>9}%" for p in SUMMARY_POINTS) + "   s/run"
    if published:
        head += "   published 100/130"
    click.echo(head)
    for policy, entry in summary.items():
        if policy.startswith("_"):
            continue
        cells = "".join(
            f"{v:>10.2f}" if v is not None else f"{'-':>10}"
            for v in (entry["alloc_pct_mean"][str(p)] for p in SUMMARY_POINTS)
        )
        line = f"{policy:<16}{cells}{entry['wall_s_per_run']:>8.2f}"
        if published and "published_alloc_pct_mean" in entry:
            pub = entry["published_alloc_pct_mean"]
            line += f"   {pub['100']:.2f}/{pub['130']:.2f}"
        click.echo(line)
