"""The platform process: HTTP health, readiness, journal restart, clean shutdown, CLI errors."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import aiohttp
import pytest

from gpuyard.devices.scenarios import ScenarioError
from gpuyard.platform.backends import BackendPlan, build_backend, plan_backend
from gpuyard.platform.runtime import Component, Platform, supervise
from gpuyard.state.backend import ClusterBackend
from gpuyard.state.clock import VirtualClock
from gpuyard.state.config import ConfigError, Settings
from gpuyard.state.context import Context


def settings(tmp_path=None, **backend) -> Settings:
    return Settings(
        server={"host": "127.0.0.1", "port": 0},
        backend={
            "cluster": "configs/clusters/demo.yaml",
            "data_dir": str(tmp_path) if tmp_path else None,
            **backend,
        },
    )


async def start(platform: Platform) -> asyncio.Task:
    task = asyncio.create_task(platform.run())
    await asyncio.wait_for(platform.backend.synced.wait(), 5)
    await asyncio.wait_for(platform.serving.wait(), 5)
    return task


async def test_serves_health_ready_and_the_demo_nodes():
    platform = Platform(settings())
    task = await start(platform)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{platform.url}/healthz") as r:
            assert r.status == 200 and (await r.json()) == {"status": "ok"}
        async with http.get(f"{platform.url}/readyz") as r:
            assert r.status == 200
        async with http.get(f"{platform.url}/api/v1/nodes") as r:
            names = [n["metadata"]["name"] for n in (await r.json())["items"]]
        assert "dgx1-0" in names and len(names) == 9
        async with http.get(f"{platform.url}/api/v1/summary") as r:
            assert (await r.json())["gpusTotal"] == 52
        async with http.get(f"{platform.url}/api/v1/nowhere") as r:
            assert r.status == 404
            assert (await r.json())["error"]["code"] == 404
        async with http.get(f"{platform.url}/metrics") as r:
            assert "gpuyard_store_resource_version" in await r.text()
    started = time.perf_counter()
    platform.stop()
    await asyncio.wait_for(task, 5)
    assert time.perf_counter() - started < 5


async def test_restart_reloads_journaled_state(tmp_path):
    first = Platform(settings(tmp_path))
    task = await start(first)
    first.store.mutate("Node", "", "dgx1-0", lambda n: n.metadata.labels.update(team="a"))
    rv = first.store.resource_version
    first.stop()
    await task

    second = Platform(settings(tmp_path))
    node = second.store.get("Node", "", "dgx1-0")
    assert node is not None and node.metadata.labels["team"] == "a"
    assert second.store.resource_version == rv
    task = await start(second)
    assert second.store.count("Node") == 9, "scenario nodes are not created twice"
    second.stop()
    await task


async def test_an_http_write_is_durable_when_it_is_answered(tmp_path):
    """Answered means journaled: a process reading the journal right then sees the write."""
    from gpuyard.state.journal import Journal
    from gpuyard.state.kinds import register_kinds
    from gpuyard.state.store import Store

    def journaled_queues() -> list[str]:
        store = Store()
        register_kinds(store)
        Journal(tmp_path / "journal.db").load_into(store)
        return [q.metadata.name for q in store.list("Queue")]

    platform = Platform(settings(tmp_path))
    task = await start(platform)
    async with aiohttp.ClientSession(platform.url) as http:
        for name in ("kept", "gone"):
            async with http.put(f"/api/v1/queues/{name}", json={"spec": {}}) as r:
                assert r.status == 201, await r.text()
        assert journaled_queues() == ["gone", "kept"]
        async with http.delete("/api/v1/queues/gone") as r:
            assert r.status == 200
        assert journaled_queues() == ["kept"], "a DELETE is answered once the journal holds it"
    platform.stop()
    await task


async def test_a_crashing_component_is_restarted():
    runs = []

    async def flaky() -> None:
        runs.append(1)
        if len(runs) < 3:
            raise RuntimeError("boom")

    clock = VirtualClock()
    task = asyncio.create_task(supervise(Component("flaky", flaky), clock=clock))
    await clock.advance(10)
    await task
    assert len(runs) == 3


async def test_a_fatal_component_stops_and_backoff_restarts_from_the_start_after_a_healthy_run():
    async def fatal() -> None:
        raise RuntimeError("port in use")

    with pytest.raises(RuntimeError, match="port in use"):
        await supervise(Component("http", fatal, restart=False), clock=VirtualClock())

    now = [0.0]
    delays: list[float] = []
    runs = iter([0, 0, 0, 120, 0])  # how long each run lasts before it crashes (seconds)

    async def crashes() -> None:
        try:
            now[0] += next(runs)
        except StopIteration:
            return
        raise RuntimeError("boom")

    class Recording(VirtualClock):
        async def sleep(self, seconds: float) -> None:
            delays.append(seconds)

    await supervise(Component("flaky", crashes), clock=Recording(), now=lambda: now[0])
    assert delays == [0.2, 0.4, 0.8, 0.1, 0.2], "doubling, then from the start after 120 s healthy"


def test_the_factory_names_the_field_of_a_bad_backend_setting():
    with pytest.raises(ConfigError) as err:
        plan_backend(settings(kind="kubernetes", kubernetes={"kubeconfig": "missing-kc.yaml"}))
    assert str(err.value) == "backend.kubernetes.kubeconfig: missing-kc.yaml is not a file"
    with pytest.raises(ScenarioError, match=r"missing\.yaml: cannot read"):
        plan_backend(settings(cluster="missing.yaml"))


def test_a_bad_backend_setting_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError, match=r"backend\.kubernetes\.kubeconfig"):
        Platform(settings(tmp_path / "data", kind="kubernetes", kubernetes={"kubeconfig": "missing-kc.yaml"}))
    assert not (tmp_path / "data").exists()


def test_kubernetes_mode_keeps_no_journal(tmp_path):
    kubeconfig = tmp_path / "kc.yaml"
    kubeconfig.write_text("apiVersion: v1\n")
    platform = Platform(
        settings(tmp_path / "data", kind="kubernetes", kubernetes={"kubeconfig": str(kubeconfig)})
    )
    assert platform.journal is None and platform.backend.name == "kubernetes"
    assert not (tmp_path / "data").exists()  # the API server is the store of record


async def test_the_factory_makes_the_backend_the_contexts_writer():
    ctx = Context.for_tests()
    plan = plan_backend(settings())
    assert plan.kind == "fake" and plan.scenario is not None
    backend = build_backend(ctx, plan)
    assert isinstance(backend, ClusterBackend)
    assert ctx.backend is backend and ctx.writer is backend.writer
    assert backend.faults is not None
    assert BackendPlan(kind="fake", scenario=plan.scenario) == plan


def run_cli(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def test_bad_config_exits_2_with_one_line(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("server:\n  port: -1\n")
    data = tmp_path / "data"
    result = run_cli("serve", "--config", str(cfg), "--data-dir", str(data))
    assert result.returncode == 2
    assert "bad.yaml: server.port" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not data.exists(), "nothing is written to the data dir"


def test_bad_scenario_exits_2(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("nodeGroups:\n  - name: a\n    gpu: {model: z9, count: 1}\n")
    data = tmp_path / "data"
    result = run_cli("serve", "--cluster", str(scenario), "--data-dir", str(data))
    assert result.returncode == 2
    assert "s.yaml: nodeGroups.0.gpu.model" in result.stderr
    assert not data.exists()


def test_a_bad_kubeconfig_exits_2_naming_the_setting(tmp_path):
    data = tmp_path / "data"
    missing = tmp_path / "kc.yaml"
    result = run_cli(
        "serve", "--backend", "kubernetes", "--kubeconfig", str(missing), "--data-dir", str(data)
    )
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: backend.kubernetes.kubeconfig: {missing} is not a file"
    assert not data.exists()


def test_non_loopback_without_insecure_is_refused():
    result = run_cli("serve", "--host", "0.0.0.0", "--data-dir", "")
    assert result.returncode == 2
    assert "--insecure" in result.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_stops_serve_within_5_seconds(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "GPUYARD__LOGGING__FORMAT": "json"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuyard.cli",
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(tmp_path / "d"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.time() + 20
        import urllib.request

        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("server did not come up")
        started = time.time()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=5)
        assert time.time() - started < 5
        assert proc.returncode == 0
        assert (tmp_path / "d" / "journal.db").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
