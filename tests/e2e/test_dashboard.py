"""The dashboard in headless Chromium: a job submitted through the API shows up Running, its page
masks secrets, its node opens to the topology view, and a screenshot is saved.

Runs a whole Platform (demo scenario, real clock, in memory) on a free loopback port in a
background thread, and drives Debian's `/usr/bin/chromium` with Playwright's sync API from the
test thread. Skips only when chromium or playwright is missing (`.ci/install-browser` installs
chromium; playwright is a dev dependency).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import re
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml

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

    def __init__(self, *, tokens: list[dict[str, object]] | None = None) -> None:
        self.url = ""
        self._tokens = tokens or []
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
            server={"host": "127.0.0.1", "port": 0, "tokens": self._tokens},
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


def post(url: str, path: str, body: bytes, content_type: str = "application/yaml") -> dict:
    req = urllib.request.Request(
        f"{url}{path}", data=body, method="POST", headers={"Content-Type": content_type}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read() or b"{}")


def submit_demo_jobs(url: str) -> list[str]:
    """The demo's sample jobs (what `gpuyard demo` submits), retried while the default
    ResourceClasses of the GPU models appear; returns their "ns/name" keys."""
    keys = []
    for path in sorted((ROOT / "configs" / "demo").glob("*.yaml")):
        deadline = time.monotonic() + 15
        while True:
            try:
                post(url, "/api/v1/jobs", path.read_bytes())
                break
            except urllib.error.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        meta = yaml.safe_load(path.read_text())["metadata"]
        keys.append(f"{meta['namespace']}/{meta['name']}")
    return keys


@contextlib.contextmanager
def demo_page(server: Server) -> Iterator[tuple[Any, list[str]]]:
    """The demo with its team quotas applied and its sample jobs submitted, open in Chromium on
    the cluster page once the jobs show (a Running and a Queuing one); yields the page and the
    jobs' keys, and checks that the page raised no error."""
    ARTIFACTS.mkdir(exist_ok=True)
    teams = list(yaml.safe_load_all((ROOT / "configs" / "quotas" / "demo-teams.yaml").read_text()))
    post(server.url, "/api/v1/apply", json.dumps(teams).encode(), "application/json")
    jobs = submit_demo_jobs(server.url)
    assert "team-a/resnet50-ddp" in jobs and "team-a/xgb-churn" in jobs
    assert sync_playwright is not None
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(server.url + "/")
            expect(page.locator("#live")).to_have_text("● live", timeout=15000)
            ddp = page.locator('tr[data-job="team-a/resnet50-ddp"]')
            expect(ddp.locator(".phase-cell")).to_have_text("Running", timeout=30000)
            sweep = page.locator('tr[data-job="team-b/a100-sweep"] .phase-cell')
            expect(sweep).to_have_text("Queuing", timeout=15000)
            yield page, jobs
            assert not errors, errors
        finally:
            browser.close()


def test_dashboard_quota_tree_shows_units_and_what_a_quota_asks_for(server: Server) -> None:
    """Each resource a quota sets, uses or asks for is a row, memory in binary units (280Gi, not
    bytes), CPU in cores, GPUs as integers; team-b's A100 gang, which can never fit, asks nothing of the quota."""
    with demo_page(server) as (page, _):
        team_a = page.locator('[data-quota="team-a"]')
        expect(team_a.locator('[data-resource="memory"] [data-col="used"]')).to_have_text(
            "used 280Gi", timeout=20000
        )
        expect(team_a.locator('[data-resource="cpu"] [data-col="used"]')).to_have_text("used 44")
        expect(team_a.locator('[data-resource="nvidia.com/gpu"] .q-min')).to_have_text("24")
        expect(team_a.locator('[data-resource="nvidia.com/gpu"] .q-max')).to_have_text("52")
        # memory: team-a uses it but its quota sets neither min nor max: "-", as in `get quotas`
        expect(team_a.locator('[data-resource="memory"] .q-min')).to_have_text("-")
        expect(team_a.locator('[data-resource="memory"] .q-max')).to_have_text("-")
        expect(team_a.locator('[data-resource="memory"] .q-max')).to_have_attribute(
            "title", "max not set: no ceiling (unlimited)"
        )
        team_b = page.locator('[data-quota="team-b"]')
        # team-b's waiting A100 gang (4 x 8 GPUs) can never fit on the demo's one 8-GPU A100 node:
        # it asks nothing of the quota, so no A100 row squeezes what others may borrow
        expect(team_b.locator('[data-resource="nvidia.a100"]')).to_have_count(0)
        expect(team_b.locator('[data-resource="memory"] [data-col="used"]')).to_have_text("used 1Ti")
        assert "300647710720" not in page.locator("#quotas").inner_text()
        assert team_b.locator('[data-resource="nvidia.k80"]').count() == 0  # untouched: no row
        # the page, not the element: the dashboard's refresh may replace #quotas mid-shot
        page.screenshot(path=str(ARTIFACTS / "dashboard-quota-tree.png"), full_page=True)


def test_dashboard_job_colours_are_distinct_and_an_unhealthy_gpu_is_labelled(server: Server) -> None:
    """The demo's jobs each have a colour of their own; a GPU failed through the fault route
    reads "unhealthy" (text, not only colour) in the node grid and on the topology page, and
    both show a legend."""
    with demo_page(server) as (page, jobs):
        colours = {}
        for key in jobs:
            swatch = page.locator(f'tr[data-job="{key}"] .swatch')
            # wait on state: the row and its colour are drawn (an opaque rgb(), not yet transparent)
            expect(swatch).to_have_css("background-color", re.compile(r"^rgb\(\d+, \d+, \d+\)$"))
            colours[key] = swatch.evaluate("el => getComputedStyle(el).backgroundColor")
        rgb = {k: tuple(int(x) for x in re.findall(r"\d+", c)[:3]) for k, c in colours.items()}
        closest = min(math.dist(rgb[a], rgb[b]) for a, b in itertools.combinations(jobs, 2))
        assert closest > 60, f"two jobs' colours are hard to tell apart: {colours}"
        ddp_gpu = page.locator('#nodes .gpu[title*="team-a/resnet50-ddp"]').first
        assert (
            ddp_gpu.evaluate("el => getComputedStyle(el).backgroundColor") == colours["team-a/resnet50-ddp"]
        )
        expect(page.locator("#nodes .legend")).to_contain_text("unhealthy")

        post(server.url, "/api/v1/fake/nodes/k80-0/gpus/3:fail", b"", "application/json")
        cell = page.locator('[data-node="k80-0"] .gpu[data-gpu="3"]')
        expect(cell).to_have_class(re.compile(r"\bunhealthy\b"), timeout=20000)
        expect(cell).to_have_attribute("title", re.compile("unhealthy"))
        page.screenshot(path=str(ARTIFACTS / "dashboard-demo-overview.png"), full_page=True)

        page.goto(server.url + "/#/nodes/k80-0")
        gpu = page.locator('#topology .dev.gpu[data-gpu="3"]')
        expect(gpu.locator(".dev-job")).to_have_text("unhealthy", timeout=15000)
        expect(page.locator('#topology .dev.gpu[data-gpu="2"] .dev-job')).to_have_text("free")
        expect(page.locator("#topology .legend")).to_contain_text("free")
        page.screenshot(path=str(ARTIFACTS / "dashboard-demo-topology.png"), full_page=True)
