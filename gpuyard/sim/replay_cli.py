"""``gpuyard simulate replay``: replay a job trace through the whole platform on a virtual clock.

Mounted by ``gpuyard.cli`` under the ``simulate`` group. It loads the trace (the simple CSV or an
openb pod list), builds the cluster from a scenario file (``--scenario``) or an openb node list
(``--nodes``), runs :func:`gpuyard.sim.replay.run_replay` with the chosen queue policy, prints a
table and writes to ``--out``:

* ``summary.json``: job counts, JCT and queueing delay (mean, p50, p95, p99), GPU utilisation
  (mean of the samples, time-weighted, peak), makespan, simulated and wall seconds;
* ``jobs.csv``: one row per job (submit, placed, start, finish, delay, JCT, final phase);
* ``utilisation.csv``: allocated GPU milli over time, at every change or every ``--sample`` s;
* ``replay.png``: GPU allocation over time (total and per queue) and the jobs waiting, only
  where matplotlib is installed (the ``plot`` extra); without it the command says so and how to
  get it, and writes no picture.

Bad input (a missing column, a non-numeric field, an unknown GPU model in ``gpu_spec``, an
unknown policy, a bad quota file) prints one line naming the file, line and column (or the
option) and exits with code 2.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click
import structlog

from gpuyard.apis.devicematching import LABEL_GPU_MODEL, LABEL_GPU_PRODUCT
from gpuyard.apis.jobs import JobValidationError, load_documents
from gpuyard.apis.meta import Resource
from gpuyard.apis.quota import QuotaValidationError, parse_quota_document
from gpuyard.devices.scenarios import ScenarioError, describe, load_scenario
from gpuyard.sim.plotting import no_plot_line, out_help
from gpuyard.sim.replay import (
    POLICIES,
    ReplayResult,
    run_replay,
    summarize,
    utilisation_steps,
    write_jobs_csv,
    write_plot,
    write_summary_json,
    write_utilisation_csv,
)
from gpuyard.sim.replay_trace import FORMATS, load_trace, openb_scenario, scenario_models
from gpuyard.sim.traces import TraceError
from gpuyard.state.logs import configure_logging

__all__ = ["load_policy_documents", "replay"]


class _Bad(Exception):
    """Bad input: one line for the user, exit code 2."""


def load_policy_documents(path: Path) -> list[Resource]:
    """ElasticQuota / ResourceQuota / Queue documents of a YAML file, validated as the server does."""
    try:
        text = path.read_text()
    except OSError as e:
        raise _Bad(f"--quota: {path}: cannot read: {e.strerror or e}") from None
    try:
        docs = load_documents(text)
    except JobValidationError as e:
        raise _Bad(f"--quota: {path}: {e.message}") from None
    out: list[Resource] = []
    quotas: list[Any] = []
    for i, doc in enumerate(docs):
        where = f"{path}: documents[{i}]"
        try:
            obj = parse_quota_document(doc, current_quotas=quotas)
        except QuotaValidationError as e:
            detail = "; ".join(f"{d['field']}: {d['reason']}" for d in e.details) or e.message
            raise _Bad(f"--quota: {where}: {detail}") from None
        if obj.KIND == "ElasticQuota":
            quotas.append(obj)
        out.append(obj)
    return out


@click.command("replay")
@click.option("--trace", "trace_path", required=True, type=click.Path(path_type=Path), help="Trace CSV.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="simple",
    show_default=True,
    help="simple: name,submit_time,duration,num_gpu,gpu_milli,cpu_milli,memory_mib[,gpu_spec,queue,priority]; "
    "openb: an openb pod list with creation_time/deletion_time.",
)
@click.option(
    "--scenario", "scenario_path", type=click.Path(path_type=Path), help="Fake-cluster scenario YAML."
)
@click.option(
    "--nodes",
    "nodes_path",
    type=click.Path(path_type=Path),
    help="openb node list CSV (instead of --scenario).",
)
@click.option(
    "--queue-policy",
    "policy",
    type=click.Choice(POLICIES),
    default="drf",
    show_default=True,
    help="fifo: one StrictFIFO queue, no priorities; priority: one queue, priority then arrival; "
    "drf: a queue per trace queue, fair share across them.",
)
@click.option(
    "--quota",
    "quota_path",
    type=click.Path(path_type=Path),
    help="YAML with ElasticQuota / ResourceQuota / Queue documents to load first.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("out/replay"),
    show_default=True,
    help=out_help("summary.json, jobs.csv and utilisation.csv", "replay.png"),
)
@click.option("--until", type=float, default=None, help="Stop after this many simulated seconds.")
@click.option("--limit", type=int, default=None, help="Replay only the first N jobs (by submit time).")
@click.option(
    "--sample", type=float, default=None, help="utilisation.csv every S seconds (default: at every change)."
)
@click.pass_context
def replay(
    ctx: click.Context,
    trace_path: Path,
    fmt: str,
    scenario_path: Path | None,
    nodes_path: Path | None,
    policy: str,
    quota_path: Path | None,
    out_dir: Path,
    until: float | None,
    limit: int | None,
    sample: float | None,
) -> None:
    """Replay a job trace (arrivals and departures) through queue, quota, gang and topology scheduling."""
    try:
        result = _run(
            trace_path=trace_path,
            fmt=fmt,
            scenario_path=scenario_path,
            nodes_path=nodes_path,
            policy=policy,
            quota_path=quota_path,
            until=until,
            limit=limit,
            sample=sample,
        )
    except _Bad as e:
        click.echo(f"error: {e}", err=True)
        ctx.exit(2)
        return
    rows = (
        result.samples
        if sample is None
        else utilisation_steps(result.samples, step=sample, end=result.simulated_s)
    )
    summary = summarize(result, rows=rows)
    summary.update(trace=str(trace_path), format=fmt, cluster=str(scenario_path or nodes_path))
    _print_table(summary)
    written = [
        write_summary_json(summary, out_dir / "summary.json"),
        write_jobs_csv(result, out_dir / "jobs.csv"),
        write_utilisation_csv(rows, result.total_milli, out_dir / "utilisation.csv"),
    ]
    for path in written:
        click.echo(f"wrote {path}")
    png = write_plot(result, out_dir / "replay.png")
    if png is None:
        click.echo(no_plot_line("replay.png"))
    else:
        click.echo(f"wrote {png}")


def _run(
    *,
    trace_path: Path,
    fmt: str,
    scenario_path: Path | None,
    nodes_path: Path | None,
    policy: str,
    quota_path: Path | None,
    until: float | None,
    limit: int | None,
    sample: float | None,
) -> ReplayResult:
    if (scenario_path is None) == (nodes_path is None):
        raise _Bad("give the cluster as --scenario FILE or --nodes FILE (one of them)")
    if until is not None and not until > 0:
        raise _Bad(f"--until: must be positive, got {until:g}")
    if limit is not None and limit < 1:
        raise _Bad(f"--limit: must be at least 1, got {limit}")
    if sample is not None and not sample > 0:
        raise _Bad(f"--sample: must be positive, got {sample:g}")
    try:
        if nodes_path is not None:
            scenario, label = openb_scenario(nodes_path), LABEL_GPU_PRODUCT
        else:
            assert scenario_path is not None
            scenario, label = load_scenario(scenario_path), LABEL_GPU_MODEL
        trace = load_trace(trace_path, fmt=fmt, models=scenario_models(scenario, label=label), limit=limit)
    except (TraceError, ScenarioError) as e:
        raise _Bad(str(e)) from None
    documents = load_policy_documents(quota_path) if quota_path is not None else []
    click.echo(f"replaying {len(trace.jobs)} jobs on {describe(scenario)} (queue policy {policy})", err=True)
    saved = structlog.get_config()
    configure_logging(level="warning")  # one line per job transition would cost more than the replay
    try:
        return asyncio.run(
            run_replay(
                trace, scenario=scenario, policy=policy, model_label=label, documents=documents, until=until
            )
        )
    finally:
        structlog.configure(**saved)


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}{unit}" if isinstance(value, float) else f"{value}{unit}"


def _print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    jobs = summary["jobs"]
    table = Table(title=f"replay: {summary['policy']} ({summary['stopped']})")
    for name in ("", "mean", "p50", "p95", "p99"):
        table.add_column(name, justify="left" if not name else "right")
    for label, key in (("JCT (s)", "jct_s"), ("queueing delay (s)", "queueing_delay_s")):
        s = summary[key]
        table.add_row(label, *(_fmt(s[k]) for k in ("mean", "p50", "p95", "p99")))
    util = summary["gpu_utilisation_pct"]
    Console(soft_wrap=True).print(table)
    click.echo(
        f"jobs: {jobs['total']} total, {jobs['finished']} finished, {jobs['failed']} failed, "
        f"{jobs['rejected']} rejected, {jobs['never_started']} never started, {jobs['running']} still running"
    )
    click.echo(
        f"GPU utilisation: {_fmt(util['time_weighted'], ' %')} time-weighted, "
        f"{_fmt(util['mean_of_samples'], ' %')} mean of samples, {_fmt(util['peak'], ' %')} peak; "
        f"makespan {_fmt(summary['makespan_s'], ' s')}; simulated {_fmt(summary['simulated_s'], ' s')} "
        f"in {summary['wall_s']:.2f} s wall"
    )
