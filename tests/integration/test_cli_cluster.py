"""The cluster CLI against a live loopback server: get nodes/resourceclasses, top nodes, watch jobs,
events (--follow), the config file, and exit codes (2 bad input, 1 server/network)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import click
import pytest
import pytest_asyncio
import yaml
from click.testing import CliRunner

from gpuyard.apis.devicematching import LABEL_BLOCK, LABEL_SPINE
from gpuyard.apis.jobspecs import JobCondition
from gpuyard.cli.client import ApiClient
from gpuyard.cli.cluster import register
from gpuyard.state.context import Context
from gpuyard.state.events import EventRecorder
from gpuyard.state.ownership import OPERATOR
from tests.builders import make_node
from tests.integration.serving import clean_cli_env, serving
from tests.unit.api.test_dashboard import build_app, make_ctx
from tests.unit.controllers.fakes import load_job


@click.group()
def root() -> None:
    """A stand-in for the `gpuyard` root group."""


register(root)


class Live:
    def __init__(self, ctx: Context, url: str) -> None:
        self.ctx = ctx
        self.url = url

    async def cli(self, *args: str, token: str | None = "root", env: dict[str, str] | None = None) -> Any:
        argv = [*args, "--server", self.url]
        if token is not None:
            argv += ["--token", token]
        runner = CliRunner()
        return await asyncio.to_thread(runner.invoke, root, argv, catch_exceptions=False, env=env)


@pytest_asyncio.fixture
async def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Live]:
    clean_cli_env(monkeypatch, tmp_path)
    ctx = make_ctx()
    try:
        async with serving(build_app(ctx)) as url:
            yield Live(ctx, url)
    finally:
        ctx.store.close()


async def test_get_nodes(live: Live) -> None:
    r = await live.cli("get", "nodes")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].split() == [
        "NAME",
        "STATUS",
        "GPU-MODEL",
        "GPUS",
        "ALLOCATED",
        "FREE",
        "CPU",
        "MEMORY",
        "AGE",
    ]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["dgx-0"][1:7] == ["Ready", "v100", "8", "8", "0", "80"]
    assert rows["dgx-1"][3:6] == ["8", "7", "1"]
    assert rows["cpu-0"][2:4] == ["-", "0"]
    r = await live.cli("get", "nodes", "-o", "wide")
    assert r.output.splitlines()[0].split()[-4:] == ["UNHEALTHY", "BLOCK", "SPINE", "TAINTS"]
    r = await live.cli("get", "nodes", "-o", "json", "-l", "gpuyard.io/gpu-model=a100")
    assert [n["metadata"]["name"] for n in json.loads(r.output)] == ["a100-0"]
    r = await live.cli("get", "nodes", "-l", "a in")
    assert r.exit_code == 2 and r.output.startswith("error: ") and len(r.output.strip().splitlines()) == 1


async def test_get_nodes_wide_shows_block_and_spine(live: Live) -> None:
    """The scheduler's topology labels, as scenarios write them, fill BLOCK and SPINE."""
    labels = {LABEL_BLOCK: "blk-a", LABEL_SPINE: "sp-1"}
    live.ctx.store.create(make_node("rack-0", gpus=8, model="a100", labels=labels))
    live.ctx.store.create(make_node("rack-1", gpus=8, model="a100", labels={LABEL_BLOCK: "blk-b"}))
    r = await live.cli("get", "nodes", "-o", "wide")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    header = lines[0].split()
    rows = {line.split()[0]: dict(zip(header, line.split(), strict=False)) for line in lines[1:]}
    assert (rows["rack-0"]["BLOCK"], rows["rack-0"]["SPINE"]) == ("blk-a", "sp-1")
    assert (rows["rack-1"]["BLOCK"], rows["rack-1"]["SPINE"]) == ("blk-b", "-")
    assert (rows["dgx-0"]["BLOCK"], rows["dgx-0"]["SPINE"]) == ("-", "-")


async def test_top_nodes(live: Live) -> None:
    r = await live.cli("top", "nodes")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].split() == ["NAME", "GPUS", "GPU%", "CPU", "CPU%", "MEMORY", "MEMORY%"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["dgx-0"][1:5] == ["8/8", "100%", "8/80", "10%"]
    assert rows["dgx-1"][1:3] == ["7/8", "88%"]
    assert rows["dgx-0"][5] == "32Gi/512Gi"
    r = await live.cli("top", "nodes", "-o", "wide")
    wide = {line.split()[0]: line.split() for line in r.output.splitlines()[1:]}
    assert wide["dgx-0"][-1] == "team-a/big" and wide["dgx-1"][-1] == "team-b/small"
    r = await live.cli("top", "nodes", "-o", "yaml")
    assert {n["name"] for n in yaml.safe_load(r.output)} == {"dgx-0", "dgx-1", "a100-0", "cpu-0"}


async def test_get_resourceclasses(live: Live) -> None:
    body = {
        "apiVersion": "scheduling.gpuyard.io/v1alpha1",
        "kind": "ResourceClass",
        "spec": {"description": "any V100"},
    }
    r = await live.cli("get", "resourceclasses")
    assert r.exit_code == 0 and r.output.split() == ["NAME", "DESCRIPTION"]
    from gpuyard.apis.resourceclasses import ResourceClass

    live.ctx.store.create(ResourceClass.model_validate({**body, "metadata": {"name": "tesla-v100"}}))
    r = await live.cli("get", "resourceclasses", "-o", "wide")
    assert r.output.splitlines()[1].split()[:3] == ["tesla-v100", "any", "V100"]
    r = await live.cli("get", "resourceclasses", "-o", "json")
    assert json.loads(r.output)[0]["metadata"]["name"] == "tesla-v100"


async def test_watch_jobs(live: Live) -> None:
    task = asyncio.create_task(live.cli("watch", "jobs", "--watch-only", "--max-events", "2"))
    await asyncio.sleep(0.5)  # the watch connects
    job = load_job("pytorch-simple", namespace="team-c")
    job.metadata.name = "watched"
    live.ctx.store.create(job)
    stored = live.ctx.store.get(job.kind, "team-c", "watched").clone()  # type: ignore[union-attr]
    stored.status.phase = "Running"
    live.ctx.store.update(stored)
    r = await asyncio.wait_for(task, 20)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[1].split() == ["ADDED", "team-c/watched", "PyTorchJob", "Created", "-"]
    assert lines[2].split() == ["MODIFIED", "team-c/watched", "PyTorchJob", "Running", "-"]


async def test_watch_jobs_lines_up_shows_the_last_condition_and_skips_unchanged_rows(live: Live) -> None:
    task = asyncio.create_task(
        live.cli("watch", "jobs", "-n", "team-c", "-o", "wide", "--watch-only", "--max-events", "4")
    )
    await asyncio.sleep(0.5)  # the watch connects
    job = load_job("pytorch-simple", namespace="team-c")
    job.metadata.name = "resnet50-imagenet-ddp-run2"
    await live.ctx.writer.create(job)

    async def change(phase: str, condition: str | None = None, message: str = "") -> None:
        current = live.ctx.store.must_get(job.kind, "team-c", job.metadata.name)
        fields: dict[str, Any] = {"phase": phase}
        if condition is not None:
            new = JobCondition(type=condition, status="True", reason=condition, message=message)
            fields["conditions"] = [*current.status.conditions, new]  # type: ignore[attr-defined]
        await live.ctx.writer.patch_status(job.kind, "team-c", job.metadata.name, fields)

    await change("Queuing")
    await change("Queuing")  # nothing shown changed: no row
    await change("Queuing")
    await change("Running", "Running", "all pods running")
    await change("Succeeded", "Succeeded", "done")
    r = await asyncio.wait_for(task, 20)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    headers = ["EVENT", "NAMESPACE/NAME", "KIND", "PHASE", "CONDITION", "MESSAGE"]
    assert lines[0].split() == headers
    starts = [lines[0].index(h) for h in headers]
    rows = [
        [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)] for line in lines[1:]
    ]
    ref = f"team-c/{job.metadata.name}"
    assert rows == [
        ["ADDED", ref, "PyTorchJob", "Created", "-", "-"],
        ["MODIFIED", ref, "PyTorchJob", "Queuing", "-", "-"],
        ["MODIFIED", ref, "PyTorchJob", "Running", "Running", "all pods running"],
        ["MODIFIED", ref, "PyTorchJob", "Succeeded", "Succeeded", "done"],
    ]


async def test_events_and_follow(live: Live) -> None:
    job = next(iter(live.ctx.store.list("PyTorchJob", namespace="team-a")))
    ref = f"team-a/{job.metadata.name}"
    events = EventRecorder(
        component=OPERATOR, store=live.ctx.store, writer=live.ctx.writer, now=live.ctx.clock.utcnow
    )  # type: ignore[arg-type]
    labels = {"job-name": job.metadata.name}
    await events.record(job, reason="JobCreated", message="created", labels=labels)
    r = await live.cli("events", "--job", ref)
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0].split() == ["TIME", "TYPE", "REASON", "COUNT", "MESSAGE"]
    assert "JobCreated" in r.output.splitlines()[1]

    task = asyncio.create_task(
        live.cli("events", "--job", ref, "--follow", "--max-events", "1", "-o", "json")
    )
    # When the command lists is not known from here: record until it has followed one new event
    # (an event recorded before its list is in the listed part, and the watch waits for a later one).
    for k in range(40):
        await events.record(job, reason="JobRunning", message=f"is running ({k})", labels=labels)
        await asyncio.wait([task], timeout=0.5)
        if task.done():
            break
    r = await asyncio.wait_for(task, 20)
    assert r.exit_code == 0, r.output
    followed = [json.loads(line) for line in r.output.splitlines()]
    assert followed[0]["reason"] == "JobCreated" and followed[-1]["reason"] == "JobRunning"
    assert len(followed) >= 2


async def test_errors_and_exit_codes(live: Live) -> None:
    r = await live.cli("events", "--job", "team-a/nope")
    assert r.exit_code == 2 and r.output.strip() == "error: job team-a/nope not found"
    r = await live.cli("events", "--job", "a/b/c")
    assert r.exit_code == 2 and "NAMESPACE/NAME" in r.output
    r = await live.cli("top", "nodes", token=None)
    assert r.exit_code == 2 and "missing bearer token" in r.output
    r = await live.cli("top", "nodes", token="wrong")
    assert r.exit_code == 2 and "unknown or revoked token" in r.output
    r = await live.cli("get", "nodes", "-o", "xml")
    assert r.exit_code == 2
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = await asyncio.to_thread(
        CliRunner().invoke, root, ["top", "nodes", "--server", f"http://127.0.0.1:{port}"]
    )
    assert r.exit_code == 1 and r.output.startswith("error: cannot reach the gpuyard server")


async def test_config_file(live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"server": live.url, "token": "vic"}))
    monkeypatch.setenv("GPUYARD_CONFIG", str(config))
    r = await asyncio.to_thread(CliRunner().invoke, root, ["top", "nodes", "-o", "wide"])
    assert r.exit_code == 0, r.output
    rows = {line.split()[0]: line.split() for line in r.output.splitlines()[1:]}
    assert rows["dgx-1"][-1] == "other"  # the viewer of team-a does not see team-b's job
    config.write_text("server: [1, 2]\n")
    r = await asyncio.to_thread(CliRunner().invoke, root, ["top", "nodes"])
    assert r.exit_code == 2 and "server: expected a string" in r.output


async def test_events_follow_ends_when_the_job_is_deleted(live: Live) -> None:
    job = next(iter(live.ctx.store.list("PyTorchJob", namespace="team-a")))
    ref = f"team-a/{job.metadata.name}"
    listed = threading.Event()
    real = ApiClient.job_events

    def job_events(self: ApiClient, ns: str, name: str) -> Any:
        answer = real(self, ns, name)
        listed.set()
        return answer

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ApiClient, "job_events", job_events)
        task = asyncio.create_task(live.cli("events", "--job", ref, "--follow"))
        assert await asyncio.to_thread(listed.wait, 20)  # the command has found the job and listed
        await live.ctx.writer.delete(job.kind, "team-a", job.metadata.name)
        r = await asyncio.wait_for(task, 20)
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[-1] == f"job {ref} was deleted"


async def test_events_follow_sees_a_deletion_before_the_watch_starts(live: Live) -> None:
    job = next(iter(live.ctx.store.list("PyTorchJob", namespace="team-a")))
    ref = f"team-a/{job.metadata.name}"
    # deleted right after the job's events are listed, before the stream connects
    real = ApiClient.job_events

    def listed_then_deleted(self: ApiClient, ns: str, name: str) -> Any:
        answer = real(self, ns, name)
        asyncio.run_coroutine_threadsafe(live.ctx.writer.delete(job.kind, ns, name), loop).result(10)
        return answer

    loop = asyncio.get_running_loop()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ApiClient, "job_events", listed_then_deleted)
        r = await asyncio.wait_for(live.cli("events", "--job", ref, "--follow", "-o", "json"), 20)
    assert r.exit_code == 0, r.output
    assert f"job {ref} was deleted" in r.output
