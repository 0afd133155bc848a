"""The job CLI against a live (loopback) server: submit, get jobs/pods, describe, delete, exit codes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import click
import pytest_asyncio
import yaml
from click.testing import CliRunner

from gpuyard.cli.jobs import register
from gpuyard.controllers.reconciling import JobReconciler
from gpuyard.state.context import Context
from gpuyard.state.workqueues import ControllerRunner
from tests.builders import make_node
from tests.integration.serving import serving
from tests.integration.test_operator_api import make
from tests.unit.controllers.fakes import JOBS, ScriptedBackend, TinyScheduler


@click.group()
def root() -> None:
    """A stand-in for the `gpuyard` root group."""


register(root)


class Live:
    def __init__(self, ctx: Context, url: str) -> None:
        self.ctx = ctx
        self.url = url

    async def cli(self, *args: str, server: bool = True) -> Any:
        argv = [*args, "--server", self.url] if server else list(args)
        return await asyncio.to_thread(CliRunner().invoke, root, argv, catch_exceptions=False)


@pytest_asyncio.fixture
async def live() -> AsyncIterator[Live]:
    ctx = Context.for_tests()
    for n in ("node-a", "node-b"):
        ctx.store.create(make_node(n))
    ctx.backend = ScriptedBackend(ctx.store)
    ctx.writer = ctx.backend.writer
    tasks = [
        asyncio.create_task(ControllerRunner(JobReconciler(ctx), store=ctx.store, clock=ctx.clock).run()),
        asyncio.create_task(
            ControllerRunner(TinyScheduler(ctx.store), store=ctx.store, clock=ctx.clock).run()
        ),
    ]
    try:
        async with serving(make(ctx)) as url:
            yield Live(ctx, url)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        ctx.store.close()


async def test_submit_get_describe_delete(live: Live, tmp_path: Path) -> None:
    result = await live.cli("submit", str(JOBS / "tf-mnist-hostnetwork.yaml"))
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "tfjob/mnist created in namespace kubedl"
    await live.ctx.clock.advance(0.01)
    backend = live.ctx.backend
    for _ in range(2):
        backend.run_all("kubedl", "mnist")  # type: ignore[union-attr]
        await live.ctx.clock.advance(0.01)

    result = await live.cli("get", "jobs")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "KIND", "PHASE", "QUEUE", "REPLICAS", "RESTARTS", "AGE"]
    assert lines[1].split()[:6] == ["kubedl", "mnist", "TFJob", "Running", "kubedl", "PS:2,Worker:3"]

    result = await live.cli("get", "pods", "--job", "kubedl/mnist", "-o", "json")
    assert result.exit_code == 0
    pods = json.loads(result.output)
    assert len(pods) == 5
    for pod in pods:
        port = pod["summary"]["hostPort"]
        config = json.loads(pod["summary"]["env"]["tensorflow"]["TF_CONFIG"])
        rt = pod["summary"]["replicaType"]
        assert config["cluster"][rt][int(pod["summary"]["replicaIndex"])].endswith(f":{port}")

    result = await live.cli("get", "pods", "--job", "kubedl/mnist")
    assert result.output.splitlines()[0].split() == [
        "NAME",
        "PHASE",
        "NODE",
        "HOST-PORT",
        "GPUS",
        "EXIT",
        "AGE",
    ]

    result = await live.cli("describe", "job", "kubedl/mnist")
    assert result.exit_code == 0
    assert (
        "Phase:       Running" in result.output
        and "JobCreated" in result.output
        and "mnist-worker-2" in result.output
    )
    result = await live.cli("describe", "job", "kubedl/mnist", "-o", "yaml")
    described = yaml.safe_load(result.output)
    assert described["job"]["kind"] == "TFJob" and len(described["pods"]) == 5 and described["events"]

    result = await live.cli("delete", "job", "kubedl/mnist")
    assert result.exit_code == 0 and result.output.strip() == "tfjob/mnist deleted from namespace kubedl"
    result = await live.cli("describe", "job", "kubedl/mnist")
    assert result.exit_code == 2
    assert result.output.strip() == "error: job kubedl/mnist not found"


async def test_bad_input_exits_2_with_one_line(live: Live, tmp_path: Path) -> None:
    bad = yaml.safe_load((JOBS / "pytorch-simple.yaml").read_text())
    bad["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] = "Sometimes"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    result = await live.cli("submit", str(path))
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: invalid job: nothing was stored: {path}: spec.pytorchReplicaSpecs.Worker.restartPolicy:"
    )
    assert not live.ctx.store.list("PyTorchJob")

    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: TFJob\n  bad: [\n")
    result = await live.cli("submit", str(broken))
    assert result.exit_code == 2 and result.output.startswith(f"error: {broken}:")
    result = await live.cli("submit", str(tmp_path / "missing.yaml"))
    assert result.exit_code == 2

    assert (await live.cli("submit", str(JOBS / "pytorch-simple.yaml"))).exit_code == 0
    result = await live.cli("submit", str(JOBS / "pytorch-simple.yaml"))
    assert result.exit_code == 2 and "already exists" in result.output


async def test_multiple_files_are_all_or_nothing(live: Live, tmp_path: Path) -> None:
    bad = yaml.safe_load((JOBS / "jax-simple.yaml").read_text())
    bad["spec"]["jaxReplicaSpecs"]["Worker"]["replicas"] = -3
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    result = await live.cli("submit", str(JOBS / "pytorch-simple.yaml"), str(path))
    assert result.exit_code == 2 and f"{path}: spec.jaxReplicaSpecs.Worker.replicas" in result.output
    assert not live.ctx.store.list("PyTorchJob")


async def test_submit_errors_name_the_file_and_document_and_give_every_detail(
    live: Live, tmp_path: Path
) -> None:
    good = yaml.safe_load((JOBS / "pytorch-simple.yaml").read_text())
    bad = yaml.safe_load((JOBS / "jax-simple.yaml").read_text())
    bad["spec"]["jaxReplicaSpecs"]["Worker"]["replicas"] = -3
    bad["spec"]["jaxReplicaSpecs"]["Worker"]["restartPolicy"] = "Sometimes"
    one = tmp_path / "one.yaml"
    one.write_text(yaml.safe_dump(bad))
    result = await live.cli("submit", str(one))  # one document: the file, both invalid fields
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: invalid job: nothing was stored: ")
    assert f"{one}: spec.jaxReplicaSpecs.Worker.replicas: " in lines[0]
    assert f"{one}: spec.jaxReplicaSpecs.Worker.restartPolicy: " in lines[0]
    assert "documents[" not in lines[0]

    multi = tmp_path / "multi.yaml"  # the second document of a second file, after a list of one
    multi.write_text(yaml.safe_dump_all([good | {"metadata": {"name": "ok-2"}}, bad]))
    listed = tmp_path / "listed.json"
    listed.write_text(json.dumps([good | {"metadata": {"name": "ok-3"}}]))
    result = await live.cli("submit", str(listed), str(multi))
    assert result.exit_code == 2
    line = result.output.strip()
    assert line.startswith("error: invalid 3 documents: nothing was stored: ")
    assert f"{multi}: documents[1]: spec.jaxReplicaSpecs.Worker.replicas: " in line
    assert f"{multi}: documents[1]: spec.jaxReplicaSpecs.Worker.restartPolicy: " in line
    assert str(listed) not in line
    assert not live.ctx.store.list("PyTorchJob") and not live.ctx.store.list("JAXJob")

    # a name taken: the conflict names the file too
    assert (await live.cli("submit", str(JOBS / "pytorch-simple.yaml"))).exit_code == 0
    taken = tmp_path / "taken.yaml"
    taken.write_text(yaml.safe_dump(good))
    result = await live.cli("submit", str(taken))
    assert result.exit_code == 2 and f"{taken}: metadata.name: " in result.output


async def test_unreachable_server_exits_1(live: Live) -> None:
    result = await asyncio.to_thread(
        CliRunner().invoke, root, ["get", "jobs", "--server", "http://127.0.0.1:9"], catch_exceptions=False
    )
    assert result.exit_code == 1
    assert result.output.startswith("error: cannot reach the gpuyard server at http://127.0.0.1:9")
