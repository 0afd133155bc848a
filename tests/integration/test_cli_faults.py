"""`gpuyard fault ...` against a live loopback server on the fake backend: every action, its
output, bad input (exit 2) and a backend that cannot inject faults (exit 1)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from click.testing import CliRunner

from gpuyard.cli import main
from gpuyard.devices.scenarios import parse_scenario
from gpuyard.platform.api.app import make_app
from gpuyard.platform.backends import BackendPlan, build_backend
from gpuyard.state.context import Context
from tests.builders import make_pod
from tests.integration.serving import clean_cli_env, serving

SCENARIO = {
    "kubelet": {"startDelay": 0},
    "nodeGroups": [{"name": "n", "count": 2, "gpu": {"model": "a100", "count": 8}}],
}


class Live:
    def __init__(self, ctx: Context, url: str) -> None:
        self.ctx = ctx
        self.url = url

    async def cli(self, *args: str) -> Any:
        argv = ["fault", *args, "--server", self.url]
        return await asyncio.to_thread(CliRunner().invoke, main, argv, catch_exceptions=False)


async def _serve(ctx: Context) -> AsyncIterator[Live]:
    async with serving(make_app(ctx)) as url:
        yield Live(ctx, url)


@pytest_asyncio.fixture
async def live(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> AsyncIterator[Live]:
    clean_cli_env(monkeypatch, tmp_path)
    ctx = Context.for_tests()
    fake = build_backend(ctx, BackendPlan(kind="fake", scenario=parse_scenario(SCENARIO, source="t")))
    task = asyncio.create_task(fake.run())
    await fake.synced.wait()
    await ctx.writer.create(make_pod("p", node="n-0"))
    await ctx.clock.advance(1)
    try:
        async for live in _serve(ctx):
            yield live
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_fail_and_recover_node(live: Live) -> None:
    r = await live.cli("fail-node", "n-0")
    assert r.exit_code == 0, r.output
    assert r.output.strip() == "node n-0 failed (NotReady): 1 pod failed"
    assert live.ctx.store.get("Pod", "default", "p").status.reason == "NodeLost"
    r = await live.cli("recover-node", "n-0", "-o", "json")
    assert r.exit_code == 0 and json.loads(r.output) == {"node": "n-0", "ready": True}


async def test_fail_and_recover_gpu(live: Live) -> None:
    r = await live.cli("fail-gpu", "n-1", "3")
    assert r.exit_code == 0 and r.output.strip() == "GPU 3 of node n-1 failed (unhealthy): 0 pods failed"
    assert live.ctx.store.get("Node", "", "n-1").metadata.annotations["gpuyard.io/unhealthy-gpus"] == "3"
    r = await live.cli("recover-gpu", "n-1", "3")
    assert r.exit_code == 0 and r.output.strip() == "GPU 3 of node n-1 recovered (healthy)"


async def test_crash_pod(live: Live) -> None:
    r = await live.cli("crash-pod", "default/p", "--exit-code", "137", "--reason", "OOMKilled")
    assert r.exit_code == 0, r.output
    assert r.output.strip() == "pod default/p crashed: Failed, exit code 137, reason OOMKilled"
    r = await live.cli("crash-pod", "default/p")
    assert r.exit_code == 2 and r.output.startswith("error: ")


async def test_fail_next_creates(live: Live) -> None:
    r = await live.cli("fail-next-creates", "3")
    assert r.exit_code == 0 and r.output.strip() == "the next 3 pod creations will fail"
    assert live.ctx.backend.writer.fail_creates == 3  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["fail-node", "ghost"], "ghost"),
        (["fail-gpu", "n-0", "9"], "GPUs 0..7"),
        (["fail-gpu", "n-0", "x"], "INDEX"),
        (["crash-pod", "p"], "NAMESPACE/NAME"),
        (["crash-pod", "default/ghost"], "default/ghost"),
        (["crash-pod", "default/p", "--reason", "Bored"], "--reason"),
        (["fail-next-creates", "0"], "COUNT"),
        (["explode"], "explode"),
    ],
)
async def test_bad_input_exits_2(live: Live, args: list[str], says: str) -> None:
    before = live.ctx.store.resource_version
    r = await live.cli(*args)
    assert r.exit_code == 2 and says in r.output, r.output
    assert live.ctx.store.resource_version == before


class _NoFaults:
    name = "kubernetes"
    faults = None


async def test_a_backend_without_faults(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    clean_cli_env(monkeypatch, tmp_path)
    ctx = Context.for_tests()
    ctx.backend = _NoFaults()  # type: ignore[assignment]
    async for live in _serve(ctx):
        r = await live.cli("fail-node", "n-0")
        assert r.exit_code == 1
        assert "the kubernetes backend cannot inject faults" in r.output
