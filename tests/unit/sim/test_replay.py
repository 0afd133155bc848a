"""Replay traces: loading (simple CSV and openb), bad input named by file/line/column, the job
manifest and queue documents each policy produces, and the metrics maths on hand-made timelines.
The replay through a whole platform is in tests/integration/test_replay.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuyard.apis.jobs import parse_job
from gpuyard.apis.quota import parse_quota_document
from gpuyard.sim.replay import (
    JobRecord,
    ReplayResult,
    job_manifest,
    queue_documents,
    stats,
    summarize,
    time_weighted_mean,
    utilisation_steps,
)
from gpuyard.sim.replay_cli import replay
from gpuyard.sim.replay_trace import TraceError, TraceJob, load_trace, openb_scenario, scenario_models

ROOT = Path(__file__).resolve().parents[3]
HEADER = "name,submit_time,duration,num_gpu,gpu_milli,cpu_milli,memory_mib,gpu_spec,queue,priority\n"
MODELS = {"v100", "t4"}


def write(tmp_path: Path, body: str, header: str = HEADER, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(header + body)
    return path


# --- loading ---------------------------------------------------------------------------------------


def test_simple_trace_loads_sorted_by_submit_with_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "b,10.5,60,2,1000,4000,8192,v100|t4,team-a,5\n"
        "a,0,30,1,250,1000,2048,,,\n"
        "c,10.5,1,0,0,500,512,,team-b,-3\n",
    )
    trace = load_trace(path, models=MODELS)
    assert [j.name for j in trace.jobs] == ["a", "b", "c"]
    a, b, c = trace.jobs
    assert (a.submit, a.duration, a.num_gpu, a.gpu_milli, a.queue, a.priority, a.gpu_spec) == (
        0.0, 30.0, 1, 250, "default", 0, ())  # fmt: skip
    assert (b.gpu_spec, b.priority, b.gpu_request_milli, b.line) == (("v100", "t4"), 5, 2000, 2)
    assert (c.priority, c.queue) == (-3, "team-b")
    assert trace.queues == ["default", "team-a", "team-b"]
    assert [j.name for j in load_trace(path, models=MODELS, limit=2).jobs] == ["a", "b"]


def test_optional_columns_may_be_left_out(tmp_path: Path) -> None:
    path = write(tmp_path, "a,0,30,1,1000,1000,2048\n", header=HEADER.split(",gpu_spec")[0] + "\n")
    (job,) = load_trace(path).jobs
    assert (job.queue, job.priority, job.gpu_spec) == ("default", 0, ())


@pytest.mark.parametrize(
    ("header", "row", "line", "column", "words"),
    [
        (HEADER.replace(",duration", ""), "a,0,1,1000,1000,2048,,,\n", 1, "duration", "missing column"),
        (HEADER, "a,0,30,1,1000,1000,2048,,,\nb,5,x,1,1000,1000,2048,,,\n", 3, "duration", "not a number"),
        (HEADER, "a,0,30,1.5,1000,1000,2048,,,\n", 2, "num_gpu", "not a whole number"),
        (HEADER, "a,-1,30,1,1000,1000,2048,,,\n", 2, "submit_time", "must be >= 0"),
        (HEADER, "a,0,30,1,1000,1000,2048,a100,,\n", 2, "gpu_spec", "unknown GPU model 'a100'"),
        (HEADER, "a,0,30,2,500,1000,2048,,,\n", 2, "num_gpu", "needs num_gpu=1"),
        (HEADER, "a,0,30,1,1500,1000,2048,,,\n", 2, "gpu_milli", "must be <= 1000"),
        (HEADER, "a,0,30,1,1000,1000,2048,,,\na,1,30,1,1000,1000,2048,,,\n", 3, "name", "repeats line 2"),
        (HEADER, "A_b,0,30,1,1000,1000,2048,,,\n", 2, "name", "not a valid name"),
        (HEADER, "a,0,30,1,1000,1000,2048,,Team A,\n", 2, "queue", "not a valid name"),
        (HEADER, "a,0,30,1,1000,1000,2048,,,high\n", 2, "priority", "not a whole number"),
    ],
)
def test_bad_simple_trace_names_file_line_and_column(
    tmp_path: Path, header: str, row: str, line: int, column: str, words: str
) -> None:
    path = write(tmp_path, row, header=header)
    with pytest.raises(TraceError) as err:
        load_trace(path, models=MODELS)
    assert (err.value.path, err.value.line, err.value.column) == (str(path), line, column)
    assert words in err.value.message
    assert str(err.value).startswith(f"{path}:{line}: column '{column}': ")


def test_empty_trace_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no jobs"):
        load_trace(write(tmp_path, ""))
    with pytest.raises(ValueError, match="allowed: simple, openb"):
        load_trace(write(tmp_path, ""), fmt="kubeflow")


def test_openb_trace_durations_from_deletion_minus_scheduled(tmp_path: Path) -> None:
    header = (
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,creation_time,deletion_time,scheduled_time\n"
    )
    path = write(
        tmp_path,
        "p-0,4000,8192,1,500,T4,100,700,160\np-1,8000,16384,2,1000,,0,50,\n",
        header=header,
    )
    p1, p0 = load_trace(path, fmt="openb", models={"T4"}).jobs
    assert (p0.submit, p0.duration, p0.gpu_spec, p0.queue) == (100.0, 540.0, ("T4",), "default")
    assert (p1.submit, p1.duration) == (0.0, 50.0)  # no scheduled_time: deletion - creation
    bad = write(tmp_path, "p-0,4000,8192,1,500,,100,90,\n", header=header, name="bad.csv")
    with pytest.raises(TraceError) as err:
        load_trace(bad, fmt="openb")
    assert (err.value.line, err.value.column) == (2, "deletion_time")
    nocol = write(
        tmp_path, "p-0,4000,8192,1,500,,100\n", header=header.split(",deletion")[0] + "\n", name="n.csv"
    )
    with pytest.raises(TraceError) as err:
        load_trace(nocol, fmt="openb")
    assert (err.value.line, err.value.column) == (1, "deletion_time")


def test_openb_nodes_become_scenario_groups_labelled_with_the_trace_model() -> None:
    scenario = openb_scenario(ROOT / "tests" / "data" / "openb" / "nodes_small.csv")
    assert scenario.total_gpus == 4 + 2 + 8 + 1
    assert scenario_models(scenario, label="nvidia.com/gpu.product") == {"V100M16", "T4", "G2", "P100"}
    products = {n.metadata.labels.get("nvidia.com/gpu.product") for n in scenario.nodes()}
    assert {"V100M16", "T4", "G2", "P100"} <= products


# --- what goes into the platform ---------------------------------------------------------------------


def test_manifest_is_a_valid_job_with_share_affinity_duration_and_queue() -> None:
    job = TraceJob("j1", 5, 90, 1, 300, 2000, 4096, ("t4", "v100"), "team-a", 7)
    doc = job_manifest(job, queue="team-a", priority=7)
    parsed = parse_job(doc)
    pod = parsed.replica_specs["Master"].template.spec
    assert pod.containers[0].resources.limits["gpuyard.io/gpu-milli"] == 300
    assert "nvidia.com/gpu" not in pod.containers[0].resources.limits
    term = pod.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms[
        0
    ]
    assert term.match_expressions[0].values == ["t4", "v100"]
    assert (
        parsed.replica_specs["Master"].template.metadata["annotations"]["fake.gpuyard.io/duration"] == "90.0"
    )
    assert (parsed.queue, parsed.metadata.namespace) == ("team-a", "team-a")
    whole = job_manifest(TraceJob("j2", 0, 1, 4, 1000, 0, 0), queue="fifo", priority=None)
    limits = parse_job(whole).replica_specs["Master"].template.spec.containers[0].resources.limits
    assert dict(limits) == {"nvidia.com/gpu": 4}
    assert "priority" not in whole["spec"]["runPolicy"]["schedulingPolicy"]


def test_queue_documents_per_policy_are_valid_queues() -> None:
    fifo, prio = queue_documents("fifo", ["a", "b"]), queue_documents("priority", ["a", "b"])
    drf = queue_documents("drf", ["b", "a", "b"])
    assert [(d["metadata"]["name"], d["spec"]["queueingStrategy"]) for d in fifo] == [("fifo", "StrictFIFO")]
    assert [d["metadata"]["name"] for d in prio] == ["priority"]
    assert [d["metadata"]["name"] for d in drf] == ["a", "b"]
    for doc in fifo + prio + drf:
        parse_quota_document(doc, current_quotas=[])
    with pytest.raises(ValueError, match="allowed: fifo, priority, drf"):
        queue_documents("lottery", [])


# --- metrics -----------------------------------------------------------------------------------------


def test_stats_mean_and_percentiles() -> None:
    s = stats([float(v) for v in range(1, 101)])
    assert s["mean"] == pytest.approx(50.5)
    assert s["p50"] == pytest.approx(50.5)
    assert s["p95"] == pytest.approx(95.05)
    assert s["p99"] == pytest.approx(99.01)
    assert stats([]) == {"mean": None, "p50": None, "p95": None, "p99": None}


def test_time_weighted_mean_of_a_step_function() -> None:
    samples = [(0.0, 0), (10.0, 1000), (30.0, 500), (40.0, 0)]
    # 20 s at 1000 + 10 s at 500 over 50 s
    assert time_weighted_mean(samples, start=0, end=50) == pytest.approx(25000 / 50)
    # a window starting inside a step counts only the part inside
    assert time_weighted_mean(samples, start=20, end=40) == pytest.approx((10 * 1000 + 10 * 500) / 20)
    assert time_weighted_mean(samples, start=5, end=5) is None


def test_utilisation_steps_sample_the_value_in_force() -> None:
    samples = [(0.0, 0), (10.0, 1000), (30.0, 500)]
    assert utilisation_steps(samples, step=10, end=40) == [
        (0.0, 0),
        (10.0, 1000),
        (20.0, 1000),
        (30.0, 500),
        (40.0, 500),
    ]
    with pytest.raises(ValueError):
        utilisation_steps(samples, step=0, end=10)


def test_summary_of_a_hand_made_timeline() -> None:
    jobs = [
        JobRecord("a", "q", "q", 0, 0.0, 10.0, 1000, placed=0.0, start=0.0, finish=10.0, phase="Succeeded"),
        JobRecord("b", "q", "q", 0, 0.0, 10.0, 1000, placed=10.0, start=10.0, finish=20.0, phase="Succeeded"),
        JobRecord("c", "q", "q", 0, 5.0, 10.0, 2000, phase="Created"),
        JobRecord("d", "q", "q", 0, 6.0, 10.0, 9000, phase="Rejected", message="too big"),
    ]
    result = ReplayResult(
        "fifo", jobs, [(0.0, 1000), (20.0, 0)], 2000, wall_s=0.1, simulated_s=30.0, stopped="stalled"
    )
    s = summarize(result)
    assert s["jobs"] == {
        "total": 4,
        "finished": 2,
        "failed": 0,
        "rejected": 1,
        "running": 0,
        "never_started": 2,
    }
    assert s["jct_s"]["mean"] == pytest.approx(15.0)
    assert s["queueing_delay_s"]["p50"] == pytest.approx(5.0)
    assert s["makespan_s"] == pytest.approx(20.0)
    assert s["gpu_utilisation_pct"]["time_weighted"] == pytest.approx(50.0)  # 1 of 2 GPUs for 20 s
    assert s["gpu_utilisation_pct"]["peak"] == pytest.approx(50.0)


def test_pending_steps_count_jobs_submitted_and_not_started() -> None:
    from gpuyard.sim.replay import pending_steps

    jobs = [
        JobRecord("a", "q", "q", 0, 0.0, 10.0, 1000, start=0.0, finish=10.0, phase="Succeeded"),
        JobRecord("b", "q", "q", 0, 0.0, 10.0, 1000, start=10.0, finish=20.0, phase="Succeeded"),
        JobRecord("c", "q", "q", 0, 5.0, 10.0, 2000, phase="Created"),
        JobRecord("d", "q", "q", 0, 6.0, 10.0, 9000, phase="Rejected"),
    ]
    assert pending_steps(jobs) == [(0.0, 1), (5.0, 2), (10.0, 1)]
    assert pending_steps([]) == [(0.0, 0)]


def test_replay_plot_has_the_queue_and_waiting_lines(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from gpuyard.sim.replay import write_plot

    jobs = [JobRecord("a", "q", "q", 0, 0.0, 10.0, 1000, start=5.0, finish=15.0, phase="Succeeded")]
    result = ReplayResult(
        "fifo", jobs, [(0.0, 0), (5.0, 1000), (15.0, 0)], 2000, wall_s=0.1, simulated_s=15.0,
        stopped="done", queue_samples={"q": [(0.0, 0), (5.0, 1000), (15.0, 0)]},
    )  # fmt: skip
    assert write_plot(result, tmp_path / "r.png") == tmp_path / "r.png"
    assert (tmp_path / "r.png").stat().st_size > 0


# --- the command's bad input ---------------------------------------------------------------------------


def test_cli_bad_input_exits_2_naming_the_place(tmp_path: Path) -> None:
    scenario = str(ROOT / "configs" / "clusters" / "small.yaml")
    runner = CliRunner()
    bad = write(tmp_path, "a,0,30,1,1000,1000,2048,h100,,\n")
    r = runner.invoke(replay, ["--trace", str(bad), "--scenario", scenario, "--out", str(tmp_path / "o")])
    assert r.exit_code == 2
    assert f"{bad}:2: column 'gpu_spec': unknown GPU model 'h100' (the cluster has: v100)" in r.output
    r = runner.invoke(replay, ["--trace", str(bad), "--scenario", scenario, "--queue-policy", "lottery"])
    assert r.exit_code == 2 and "--queue-policy" in r.output and "lottery" in r.output
    r = runner.invoke(replay, ["--trace", str(bad)])
    assert r.exit_code == 2 and "--scenario FILE or --nodes FILE" in r.output
    good = write(tmp_path, "a,0,30,1,1000,1000,2048,,,\n", name="good.csv")
    quota = tmp_path / "q.yaml"
    quota.write_text(
        "apiVersion: gpuyard.io/v1alpha1\nkind: Queue\nmetadata: {name: a}\nspec: {weight: -1}\n"
    )
    r = runner.invoke(replay, ["--trace", str(good), "--scenario", scenario, "--quota", str(quota)])
    assert r.exit_code == 2 and f"--quota: {quota}: documents[0]: spec.weight" in r.output
    r = runner.invoke(replay, ["--trace", str(good), "--scenario", scenario, "--until", "-5"])
    assert r.exit_code == 2 and "--until" in r.output


def test_stats_are_rounded_to_two_decimals() -> None:
    # unrounded: mean 0.10000000000000002, p99 0.198
    assert stats([0.0, 0.1, 0.2]) == {"mean": 0.1, "p50": 0.1, "p95": 0.19, "p99": 0.2}
    assert stats([1.0, 2.0, 2.0])["mean"] == 1.67


def test_cli_without_matplotlib_says_how_to_get_the_plot(tmp_path: Path, monkeypatch) -> None:
    """`make run` / `make test` install no matplotlib: the command writes its CSV and JSON files,
    no replay.png, and says how to get plots; its help promises the PNG only with matplotlib."""
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    trace = write(tmp_path, "a,0,30,1,1000,1000,2048,,,\n")
    scenario = str(ROOT / "configs" / "clusters" / "small.yaml")
    out = tmp_path / "o"
    r = CliRunner().invoke(replay, ["--trace", str(trace), "--scenario", scenario, "--out", str(out)])
    assert r.exit_code == 0, r.output
    wrote = sorted(
        Path(line.removeprefix("wrote ")).name for line in r.output.splitlines() if line.startswith("wrote ")
    )
    assert wrote == ["jobs.csv", "summary.json", "utilisation.csv"]
    assert sorted(p.name for p in out.iterdir()) == wrote
    assert (
        "no replay.png: matplotlib is not installed (for plots: pip install 'gpuyard[plot]'; "
        "in a gpuyard checkout: make plot)" in r.output.splitlines()
    )
    text = " ".join(CliRunner().invoke(replay, ["--help"]).output.split())
    assert "also replay.png where matplotlib is installed" in text
