"""The issue's "done when": KubeDL's host-network TFJob on the demo cluster, through the CLI.

`gpuyard submit configs/jobs/tf-mnist-hostnetwork.yaml` against a running platform (fake demo
cluster, HTTP server, virtual clock moved by the test) runs to Succeeded; `get pods -o json`
shows each pod's host port and TF_CONFIG; a worker crashed with exit code 137 comes back on a new
port with its Service retargeted; a crash with exit code 1 fails the job.

Until the runtime mounts the operator and the scheduler (`components(ctx)`), the test adds the
operator and the real gang scheduler (`gpuyard.scheduler.components`) itself.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import click
import pytest
import pytest_asyncio
import structlog
from click.testing import CliRunner

from gpuyard.apis.jobkinds import find_job
from gpuyard.cli.jobs import register
from gpuyard.controllers.reconciling import JobReconciler
from gpuyard.platform.api import app as app_module
from gpuyard.platform.runtime import Platform
from gpuyard.state.clock import VirtualClock
from gpuyard.state.config import Settings
from tests.unit.controllers.fakes import JOBS, ROOT, TinyScheduler


@click.group()
def cli_root() -> None:
    """Stand-in for the `gpuyard` root group."""


register(cli_root)


class Demo:
    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        self.clock = platform.clock
        assert isinstance(self.clock, VirtualClock)

    async def cli(self, *args: str) -> Any:
        result = await asyncio.to_thread(
            CliRunner().invoke, cli_root, [*args, "--server", self.platform.url], catch_exceptions=False
        )
        return result

    def phase(self, ns: str, name: str) -> str:
        job = find_job(self.platform.store, ns, name)
        return job.status.phase if job is not None else ""

    async def until(self, cond, timeout: float = 900.0) -> None:  # type: ignore[no-untyped-def]
        assert await self.clock.run_until(cond, timeout=timeout)  # type: ignore[attr-defined]


@pytest_asyncio.fixture
async def demo(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Demo]:
    if "gpuyard.platform.api.jobs" not in app_module.ROUTE_MODULES:
        monkeypatch.setattr(
            app_module, "ROUTE_MODULES", [*app_module.ROUTE_MODULES, "gpuyard.platform.api.jobs"]
        )
    settings = Settings(
        server={"host": "127.0.0.1", "port": 0},
        backend={
            "cluster": str(ROOT / "configs" / "clusters" / "demo.yaml"),
            "data_dir": None,
            "clock": "virtual",
        },
    )
    platform = Platform(settings, clock=VirtualClock(), serve_http=True, drive_clock=False)
    names = {c.name for c in platform.components}
    if "job-operator" not in names:
        platform.add_component(JobReconciler(platform.ctx))
    if "scheduler" not in names:
        try:
            from gpuyard.scheduler import components as scheduler_components
        except ImportError:  # pragma: no cover - before the scheduler landed
            platform.add_component(TinyScheduler(platform.store))
        else:
            for c in scheduler_components(platform.ctx):
                platform.add_component(c)
    task = asyncio.create_task(platform.run())
    await asyncio.wait_for(platform.backend.synced.wait(), 5)
    await asyncio.wait_for(platform.serving.wait(), 5)
    try:
        with structlog.testing.capture_logs():  # keep server logs out of the CLI's captured output
            yield Demo(platform)
    finally:
        platform.stop()
        await asyncio.wait_for(task, 10)


async def test_hostnetwork_tfjob_through_the_cli(demo: Demo) -> None:
    submitted = await demo.cli("submit", str(JOBS / "tf-mnist-hostnetwork.yaml"))
    assert submitted.exit_code == 0, submitted.output
    await demo.until(lambda: demo.phase("kubedl", "mnist") == "Running")
    await demo.clock.advance(5)

    result = await demo.cli("get", "pods", "--job", "kubedl/mnist", "-o", "json")
    assert result.exit_code == 0, result.output
    pods = {p["metadata"]["name"]: p for p in json.loads(result.output)}
    assert sorted(pods) == ["mnist-ps-0", "mnist-ps-1", "mnist-worker-0", "mnist-worker-1", "mnist-worker-2"]
    for name, pod in pods.items():
        port = pod["summary"]["hostPort"]
        assert 20000 <= port <= 30000
        tf_config = json.loads(pod["summary"]["env"]["tensorflow"]["TF_CONFIG"])
        assert (
            tf_config["cluster"][pod["summary"]["replicaType"]][int(pod["summary"]["replicaIndex"])]
            == f"{name}.kubedl.svc:{port}"
        )

    old_port = pods["mnist-worker-1"]["summary"]["hostPort"]
    await demo.platform.backend.faults.crash_pod("kubedl", "mnist-worker-1", exit_code=137)

    def back_on_new_port() -> bool:
        pod = demo.platform.store.get("Pod", "kubedl", "mnist-worker-1")
        return (
            pod is not None
            and pod.status.phase == "Running"
            and pod.spec.containers[0].ports[0].host_port != old_port
        )  # type: ignore[attr-defined]

    await demo.until(back_on_new_port)
    result = await demo.cli("get", "pods", "--job", "kubedl/mnist", "-o", "json")
    new_port = {p["metadata"]["name"]: p for p in json.loads(result.output)}["mnist-worker-1"]["summary"][
        "hostPort"
    ]
    assert new_port != old_port
    service = demo.platform.store.must_get("Service", "kubedl", "mnist-worker-1")
    assert (service.spec.ports[0].port, service.spec.ports[0].target_port) == (2222, new_port)  # type: ignore[attr-defined]

    await demo.until(lambda: demo.phase("kubedl", "mnist") == "Succeeded")
    described = await demo.cli("describe", "job", "kubedl/mnist")
    assert "Phase:       Succeeded" in described.output and "Restarts:    1" in described.output


async def test_exit_code_1_fails_the_job(demo: Demo, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert (await demo.cli("submit", str(JOBS / "tf-mnist-hostnetwork.yaml"))).exit_code == 0
    await demo.until(lambda: demo.phase("kubedl", "mnist") == "Running")
    await demo.clock.advance(5)
    await demo.platform.backend.faults.crash_pod("kubedl", "mnist-worker-0", exit_code=1)
    await demo.until(lambda: demo.phase("kubedl", "mnist") == "Failed")
    result = await demo.cli("get", "jobs", "--phase", "Failed", "-o", "json")
    assert [j["metadata"]["name"] for j in json.loads(result.output)] == ["mnist"]
    live = [
        p
        for p in demo.platform.store.list("Pod", namespace="kubedl")
        if p.status.phase in ("Pending", "Running")
    ]  # type: ignore[attr-defined]
    assert live == []
