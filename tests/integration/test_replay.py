"""Trace replay through a whole Platform (fake cluster, operator, scheduler with queues) on the
virtual clock: jobs finish, JCT = queueing delay + duration exactly, a job that does not fit waits
for a departure, FIFO and priority order jobs as they should, DRF alternates between queues, and
the command writes its files."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from gpuyard.devices.scenarios import parse_scenario
from gpuyard.sim.replay import JobRecord, run_replay
from gpuyard.sim.replay_cli import replay
from gpuyard.sim.replay_trace import load_trace

ROOT = Path(__file__).resolve().parents[2]
HEADER = "name,submit_time,duration,num_gpu,gpu_milli,cpu_milli,memory_mib,gpu_spec,queue,priority\n"


def scenario(nodes: int):
    groups = [{"name": "dgx", "count": nodes, "cpu": "64", "memory": "512Gi", "topology": "dgx1-v100"}]
    return parse_scenario({"name": "t", "kubelet": {"startDelay": 0}, "nodeGroups": groups}, source="<test>")


def trace(tmp_path: Path, rows: list[str]):
    path = tmp_path / "trace.csv"
    path.write_text(HEADER + "".join(r + "\n" for r in rows))
    return load_trace(path, models={"v100"})


def by_name(jobs: list[JobRecord]) -> dict[str, JobRecord]:
    return {j.name: j for j in jobs}


def start_order(jobs: list[JobRecord]) -> list[str]:
    return [j.name for j in sorted(jobs, key=lambda j: (j.start, j.submit))]


async def test_jobs_finish_and_a_job_that_does_not_fit_waits_for_a_departure(tmp_path: Path) -> None:
    rows = [
        "big,0,100,8,1000,8000,65536,,,0",
        "share-1,1,50,1,500,1000,4096,,,0",  # no GPU is free beside "big": it waits for it
        "waits,10,30,8,1000,8000,65536,v100,,0",
        "small,20,40,2,1000,2000,8192,,,0",
    ]
    result = await run_replay(trace(tmp_path, rows), scenario=scenario(1), policy="drf")
    jobs = by_name(result.jobs)
    assert result.stopped == "done"
    assert all(j.phase == "Succeeded" for j in jobs.values()), [
        (j.name, j.phase, j.message) for j in jobs.values()
    ]
    assert jobs["big"].start == 0.0 and jobs["big"].finish == 100.0
    assert jobs["share-1"].start == 100.0  # started when "big" left
    assert jobs["waits"].start == jobs["share-1"].finish == 150.0  # it needs the whole node
    for j in jobs.values():
        assert j.jct == j.queueing_delay + j.duration  # exact on the virtual clock
        assert j.placed is not None and j.placed <= j.start
    # utilisation never above 100 %, back to 0 at the end
    assert max(v for _, v in result.samples) <= result.total_milli
    assert result.samples[-1][1] == 0


async def test_fifo_keeps_arrival_order_and_priority_lets_the_urgent_job_first(tmp_path: Path) -> None:
    rows = ["first,0,100,8,1000,0,0,,,0", "low,1,100,8,1000,0,0,,,0", "urgent,2,100,8,1000,0,0,,,10"]
    fifo = by_name((await run_replay(trace(tmp_path, rows), scenario=scenario(1), policy="fifo")).jobs)
    prio = by_name((await run_replay(trace(tmp_path, rows), scenario=scenario(1), policy="priority")).jobs)
    assert (fifo["low"].start, fifo["urgent"].start) == (100.0, 200.0)
    # with priorities the urgent job preempts the running priority-0 one on arrival; the preempted
    # job runs again after it, keeping its place ahead of `low`
    assert (prio["urgent"].start, prio["first"].finish, prio["low"].start) == (2.0, 202.0, 202.0)
    assert prio["urgent"].queueing_delay == 0.0 and prio["low"].jct == 301.0


async def test_drf_alternates_between_two_queues(tmp_path: Path) -> None:
    rows = [f"a{i},{i},100,8,1000,0,0,,team-a,0" for i in range(4)]
    rows += [f"b{i},{4 + i},100,8,1000,0,0,,team-b,0" for i in range(4)]
    drf = (await run_replay(trace(tmp_path, rows), scenario=scenario(2), policy="drf")).jobs
    fifo = (await run_replay(trace(tmp_path, rows), scenario=scenario(2), policy="fifo")).jobs
    assert start_order(fifo) == ["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"]
    # a0 and a1 take both nodes; from then on the queue holding less goes next
    assert start_order(drf) == ["a0", "a1", "b0", "a2", "b1", "a3", "b2", "b3"]


async def test_allocation_is_recorded_per_queue(tmp_path: Path) -> None:
    rows = [f"a{i},{i},100,8,1000,0,0,,team-a,0" for i in range(2)]
    rows += [f"b{i},{2 + i},100,8,1000,0,0,,team-b,0" for i in range(2)]
    result = await run_replay(trace(tmp_path, rows), scenario=scenario(2), policy="drf")
    assert set(result.queue_samples) == {"team-a", "team-b"}

    def at(samples: list[tuple[float, int]], t: float) -> int:
        return [v for s, v in samples if s <= t][-1]

    # at every change the queues' lines add up to the total line
    for t, total in result.samples:
        assert sum(at(q, t) for q in result.queue_samples.values()) == total, t
    assert max(v for _, v in result.queue_samples["team-a"]) == 16000  # both nodes' 8 GPUs
    assert all(q[-1][1] == 0 for q in result.queue_samples.values())


def test_command_writes_summary_jobs_and_utilisation(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = CliRunner().invoke(
        replay,
        [
            "--trace", str(ROOT / "configs" / "traces" / "sample-replay.csv"),
            "--scenario", str(ROOT / "configs" / "clusters" / "demo.yaml"),
            "--queue-policy", "priority", "--out", str(out), "--sample", "600",
        ],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["jobs"]["total"] == 40 and summary["jobs"]["finished"] == 40
    assert summary["stopped"] == "done" and summary["policy"] == "priority"
    assert 0 < summary["gpu_utilisation_pct"]["time_weighted"] <= 100
    assert summary["jct_s"]["p50"] >= summary["queueing_delay_s"]["p50"]
    assert len((out / "jobs.csv").read_text().splitlines()) == 41
    rows = (out / "utilisation.csv").read_text().splitlines()
    assert rows[0] == "time_s,allocated_gpu_milli,total_gpu_milli,pct" and rows[2].startswith("600,")
    assert "queueing delay" in r.output


def test_openb_trace_on_openb_nodes(tmp_path: Path) -> None:
    data = ROOT / "tests" / "data" / "openb"
    r = CliRunner().invoke(
        replay,
        ["--format", "openb", "--trace", str(data / "pods_small.csv"), "--nodes", str(data / "nodes_small.csv"),
         "--limit", "15", "--out", str(tmp_path)],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["jobs"]["total"] == 15 and summary["jobs"]["finished"] == 15
