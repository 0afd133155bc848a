"""The dashboard in headless Chromium: a job submitted through the API shows up Running, its page
masks secrets, its node opens to the topology view, and a screenshot is saved.

Runs a whole Platform (demo scenario, real clock, in memory) on a free loopback port in a
background thread, and drives Debian's `/usr/bin/chromium` with Playwright's sync API from the
test thread. Skips only when chromium or playwright is missing (`.ci/install-browser` installs
chromium; playwright is a dev dependency).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from gpuyard.platform.api import app as app_module
from gpuyard.state.config import Settings

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
CHROMIUM = os.environ.get("GPUYARD_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - depends on the environment
    sync_playwright = None  # type: ignore[assignment]

pytestmark = [
    pytest.mark.skipif(
        sync_playwright is None, reason="playwright is not installed (pip install playwright)"
    ),
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason=f"chromium is not installed at {CHROMIUM} (run .ci/install-browser)",
    ),
]

JOB = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "metadata": {"name": "browser-ddp", "namespace": "team-e2e"},
    "spec": {
        "pytorchReplicaSpecs": {
            "Master": {
                "replicas": 1,
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "pytorch",
                                "image": "pytorch/pytorch:2.3.0",
                                "env": [
                                    {"name": "WANDB_API_KEY", "value": "hunter2-do-not-show"},
                                    {"name": "EPOCHS", "value": "90"},
                                ],
                                "resources": {"limits": {"nvidia.v100": 4, "cpu": "8", "memory": "32Gi"}},
                            }
                        ]
                    }
                },
            }
        }
    },
}


class Server:
    """A Platform serving the demo cluster from a background thread with its own event loop."""

    def __init__(self) -> None:
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._platform = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="gpuyard-e2e", daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to the test thread
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        from gpuyard.platform.runtime import Platform

        settings = Settings(
            server={"host": "127.0.0.1", "port": 0},
            backend={
                "cluster": str(ROOT / "configs" / "clusters" / "demo.yaml"),
                "data_dir": None,
                "clock": "real",
            },
        )
        self._loop = asyncio.get_running_loop()
        platform = Platform(settings)
        self._platform = platform
        task = asyncio.create_task(platform.run())
        await asyncio.wait_for(platform.serving.wait(), 20)
        await asyncio.wait_for(platform.backend.synced.wait(), 20)
        self.url = platform.url
        self._ready.set()
        await task

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(60)
        if self._error is not None:
            raise self._error
        assert self.url, "the platform did not start"

    def stop(self) -> None:
        if self._loop is not None and self._platform is not None:
            self._loop.call_soon_threadsafe(self._platform.stop)
        self._thread.join(20)


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    if "gpuyard.platform.api.dashboard" not in app_module.ROUTE_MODULES:  # until app.py lists it
        monkeypatch.setattr(
            app_module, "ROUTE_MODULES", [*app_module.ROUTE_MODULES, "gpuyard.platform.api.dashboard"]
        )
    srv = Server()
    with structlog.testing.capture_logs():
        srv.start()
        try:
            yield srv
        finally:
            srv.stop()


def submit(url: str, job: dict) -> None:
    req = urllib.request.Request(
        f"{url}/api/v1/jobs",
        data=json.dumps(job).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 201


def test_dashboard_shows_a_job_running_and_its_topology(server: Server) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    assert sync_playwright is not None
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(server.url + "/")
            expect(page.locator("#overview")).to_be_visible(timeout=15000)
            expect(page.locator("#live")).to_have_text("● live", timeout=15000)
            expect(page.locator("[data-node]").first).to_be_visible()

            submit(server.url, JOB)
            row = page.locator('tr[data-job="team-e2e/browser-ddp"]')
            expect(row).to_be_visible(timeout=15000)  # the SSE watch brings it in without a reload
            expect(row.locator(".phase-cell")).to_have_text("Running", timeout=30000)
            placement = row.locator(".placement").inner_text()
            node = placement.split("[")[0]
            assert node, placement
            expect(page.locator(f'[data-node="{node}"] .gpu.held')).to_have_count(4, timeout=15000)
            page.screenshot(path=str(ARTIFACTS / "dashboard-overview.png"), full_page=True)

            row.locator("a").click()
            expect(page.locator("#job-phase")).to_have_text("Running", timeout=15000)
            expect(page.locator('[data-pod="browser-ddp-master-0"]')).to_be_visible()
            page.locator('[data-pod="browser-ddp-master-0"] summary').click()
            text = page.locator("#pods").inner_text()
            assert "WANDB_API_KEY" in text and "EPOCHS=" in text and "90" in text
            assert "hunter2" not in page.content()

            page.locator(f'#explain a[href="#/nodes/{node}"]').first.click()
            topo = page.locator("#topology")
            expect(topo).to_be_visible(timeout=15000)
            expect(topo.locator(".dev.gpu.held")).to_have_count(4)
            expect(topo.locator(".dev.gpu.held").first).to_contain_text("team-e2e/browser-ddp")
            expect(topo.locator("table.nvlink td.nv").first).to_be_visible()
            assert topo.locator(".switch").count() >= 1
            page.screenshot(path=str(ARTIFACTS / "dashboard-topology.png"), full_page=True)
            assert not errors, errors
        finally:
            browser.close()
    assert (ARTIFACTS / "dashboard-topology.png").stat().st_size > 10_000
