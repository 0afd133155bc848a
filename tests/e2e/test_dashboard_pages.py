"""The dashboard's queue, node and submit pages and the delete button, in headless Chromium.

Reuses the Platform fixture of `test_dashboard.py` (demo scenario, real clock, in memory) and
saves a screenshot of each page under `tests/e2e/artifacts/`.
"""

from __future__ import annotations

import copy
import json
import re
import urllib.request
from typing import Any

from tests.e2e import test_dashboard as base
from tests.e2e.test_dashboard import ARTIFACTS, CHROMIUM, JOB, LAUNCH_ARGS, Server, submit

pytestmark = base.pytestmark  # skips where chromium or playwright is missing
server = base.server  # the same fixture: a whole Platform on the demo scenario
sync_playwright = base.sync_playwright
expect: Any = getattr(base, "expect", None)
Page = Any


def a100_job(name: str, namespace: str = "team-q", gpus: int = 8) -> dict[str, Any]:
    job = copy.deepcopy(JOB)
    job["metadata"] = {"name": name, "namespace": namespace}
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    container["env"] = []
    container["resources"] = {"limits": {"nvidia.a100": gpus, "cpu": "8", "memory": "32Gi"}}
    return job


def put_queue(url: str, name: str, weight: float) -> None:
    body = {
        "apiVersion": "gpuyard.io/v1alpha1",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": {"weight": weight},
    }
    req = urllib.request.Request(
        f"{url}/api/v1/queues/{name}",
        data=json.dumps(body).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status in (200, 201)


def get(url: str, path: str) -> Any:
    with urllib.request.urlopen(f"{url}{path}", timeout=10) as resp:
        return json.loads(resp.read())


def open_page(pw: Any, url: str) -> tuple[Any, Page, list[str]]:
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, headless=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url + "/")
    expect(page.locator("#overview")).to_be_visible(timeout=15000)
    return browser, page, errors


def test_queue_page_lists_pending_jobs_in_order_with_reasons_and_running_jobs(server: Server) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    put_queue(server.url, "team-q", 2)
    submit(server.url, a100_job("q-first"))  # takes the demo's only 8 A100s
    submit(server.url, a100_job("q-second"))  # waits
    submit(server.url, a100_job("q-third"))  # waits behind q-second
    with sync_playwright() as pw:
        browser, page, errors = open_page(pw, server.url)
        try:
            row = page.locator('#jobs tr[data-job="team-q/q-first"]')
            expect(row.locator(".phase-cell")).to_have_text("Running", timeout=30000)
            page.locator("#overview a.queue-link", has_text="team-q").click()  # queue depths link the queue
            expect(page.locator("#queue h2")).to_have_text("Queue team-q", timeout=15000)
            pending = page.locator("#queue-pending-jobs tbody tr")
            expect(pending).to_have_count(2, timeout=15000)
            assert pending.nth(0).get_attribute("data-job") == "team-q/q-second"
            assert pending.nth(1).get_attribute("data-job") == "team-q/q-third"
            expect(pending.nth(0).locator(".why")).not_to_be_empty()
            assert "a100" in pending.nth(0).inner_text().lower(), pending.nth(0).inner_text()
            expect(page.locator('#queue-running-jobs tr[data-job="team-q/q-first"]')).to_be_visible()
            expect(page.locator("#queue-running")).to_have_text("1", timeout=15000)
            expect(page.locator("#queue-share")).to_have_text(re.compile(r"^\d+\.\d\d$"), timeout=15000)
            page.screenshot(path=str(ARTIFACTS / "dashboard-queue.png"), full_page=True)
            # the job page links its queue too
            pending.nth(0).locator("a").click()
            expect(page.locator("#job a.queue-link")).to_have_text("team-q", timeout=15000)
            assert not errors, errors
        finally:
            browser.close()


def test_node_page_for_a_gpu_node_and_a_cpu_node(server: Server) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    submit(server.url, JOB)
    with sync_playwright() as pw:
        browser, page, errors = open_page(pw, server.url)
        try:
            row = page.locator('tr[data-job="team-e2e/browser-ddp"]')
            expect(row.locator(".phase-cell")).to_have_text("Running", timeout=30000)
            node = row.locator(".placement").inner_text().split("[")[0]
            page.locator(f'[data-node="{node}"]').click()
            expect(page.locator("#node h2")).to_have_text(f"Node {node}", timeout=15000)
            expect(page.locator("#node-ready")).to_have_text("True")
            expect(page.locator('#node tr[data-resource="cpu"]')).to_contain_text("80")
            expect(page.locator("#node-labels")).to_contain_text("gpuyard.io/gpu-model=v100")
            expect(page.locator("#node-conditions")).to_contain_text("Ready")
            pod = page.locator('#node-pods tr[data-pod="team-e2e/browser-ddp-master-0"]')
            expect(pod).to_contain_text("Running", timeout=15000)
            expect(pod.locator('a[href="#/jobs/team-e2e/browser-ddp"]')).to_be_visible()
            expect(page.locator("#node-events")).to_be_visible()
            expect(page.locator("#topology .dev.gpu.held")).to_have_count(4)  # the topology view, inline
            page.screenshot(path=str(ARTIFACTS / "dashboard-node-gpu.png"), full_page=True)
            page.locator("#topology-link").click()  # and on its own page
            expect(page.locator("#topology")).to_be_visible(timeout=15000)
            expect(page.locator("#node")).to_have_count(0)

            page.goto(server.url + "/#/nodes/cpu-0")
            expect(page.locator("#node h2")).to_have_text("Node cpu-0", timeout=15000)
            expect(page.locator("#node-gpus")).to_contain_text("CPU-only")
            expect(page.locator("#node-pods")).to_contain_text("no pods on this node")
            expect(page.locator("#node-events")).to_contain_text("no events about this node")
            expect(page.locator("#topology")).to_have_count(0)
            expect(page.locator("#topology-link")).to_have_count(0)
            assert "no device topology" not in page.locator("main").inner_text()
            page.screenshot(path=str(ARTIFACTS / "dashboard-node-cpu.png"), full_page=True)
            assert not errors, errors
        finally:
            browser.close()


GOOD = """apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: from-browser, namespace: team-ui}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
          containers:
            - name: pytorch
              image: pytorch/pytorch:2.3.0
              resources: {limits: {nvidia.v100: 2, cpu: "4", memory: 16Gi}}
"""


def test_submit_and_delete_a_job_from_the_dashboard(server: Server) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser, page, errors = open_page(pw, server.url)
        try:
            page.locator("#nav-submit").click()
            expect(page.locator("#submit")).to_be_visible(timeout=15000)
            # a bad document: the server's error and every detail, as it answered
            page.locator("#submit-yaml").fill(GOOD.replace("replicas: 1", "replicas: -1"))
            page.locator("#submit-button").click()
            error = page.locator("#submit-error")
            expect(error).to_be_visible(timeout=15000)
            expect(error).to_contain_text("HTTP 422")
            expect(error).to_contain_text("nothing was stored")
            assert "replicas" in error.locator("li").first.inner_text()
            page.screenshot(path=str(ARTIFACTS / "dashboard-submit-error.png"), full_page=True)
            assert get(server.url, "/api/v1/jobs?namespace=team-ui")["items"] == []

            page.locator("#submit-yaml").fill(GOOD)
            page.locator("#submit-button").click()
            expect(page.locator("#submit-ok")).to_contain_text(
                "PyTorchJob team-ui/from-browser", timeout=15000
            )
            page.screenshot(path=str(ARTIFACTS / "dashboard-submit.png"), full_page=True)
            page.locator("#submit-ok a").click()
            expect(page.locator("#job-phase")).to_have_text("Running", timeout=30000)
            page.screenshot(path=str(ARTIFACTS / "dashboard-job-actions.png"), full_page=True)

            dialogs: list[str] = []

            def answer(dialog: Any) -> None:
                dialogs.append(dialog.message)
                dialog.dismiss() if len(dialogs) == 1 else dialog.accept()

            page.on("dialog", answer)
            page.locator("#delete-job").click()  # dismissed: nothing happens
            expect(page.locator("#job-phase")).to_have_text("Running")
            assert [
                j["metadata"]["name"] for j in get(server.url, "/api/v1/jobs?namespace=team-ui")["items"]
            ] == ["from-browser"]
            page.locator("#delete-job").click()  # confirmed
            expect(page.locator("#overview")).to_be_visible(timeout=15000)
            expect(page.locator('tr[data-job="team-ui/from-browser"]')).to_have_count(0, timeout=15000)
            assert len(dialogs) == 2 and "team-ui/from-browser" in dialogs[0]
            assert get(server.url, "/api/v1/jobs?namespace=team-ui")["items"] == []
            assert not errors, errors
        finally:
            browser.close()


def token_server() -> Server:
    """The same Platform with tokens: `alice` may change jobs in team-ui, `vic` may only read."""
    from gpuyard.platform.api.auth import hash_token

    return Server(
        tokens=[
            {"sha256": hash_token("alice-token"), "user": "alice", "role": "user", "namespaces": ["team-ui"]},
            {"sha256": hash_token("vic-token"), "user": "vic", "role": "viewer", "namespaces": ["team-ui"]},
        ]
    )


def use_token(page: Any, value: str) -> None:
    page.locator("#token").fill(value)
    page.locator("#token-form button").click()


def test_submit_and_delete_send_the_token_and_show_refusals(monkeypatch: Any) -> None:
    import structlog

    from gpuyard.platform.api import app as app_module

    if "gpuyard.platform.api.dashboard" not in app_module.ROUTE_MODULES:
        monkeypatch.setattr(
            app_module, "ROUTE_MODULES", [*app_module.ROUTE_MODULES, "gpuyard.platform.api.dashboard"]
        )
    srv = token_server()
    with structlog.testing.capture_logs():
        srv.start()
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, headless=True)
                try:
                    page = browser.new_page(viewport={"width": 1400, "height": 1000})
                    page.goto(srv.url + "/#/submit")
                    expect(page.locator("#submit")).to_be_visible(timeout=15000)
                    page.locator("#submit-yaml").fill(GOOD)
                    page.locator("#submit-button").click()  # no token yet
                    expect(page.locator("#submit-error")).to_contain_text("HTTP 401", timeout=15000)
                    use_token(page, "vic-token")  # a viewer may not submit
                    page.locator("#submit-button").click()
                    expect(page.locator("#submit-error")).to_contain_text("HTTP 403", timeout=15000)
                    use_token(page, "alice-token")
                    page.locator("#submit-button").click()
                    expect(page.locator("#submit-ok")).to_contain_text("team-ui/from-browser", timeout=15000)
                    assert page.evaluate("sessionStorage.getItem('gpuyard.token')") == "alice-token"

                    use_token(page, "vic-token")  # a viewer sees the job but may not delete it
                    page.locator("#submit-ok a").click()
                    expect(page.locator("#job-phase")).to_be_visible(timeout=15000)
                    page.on("dialog", lambda d: d.accept())
                    page.locator("#delete-job").click()
                    error = page.locator("#delete-error")
                    expect(error).to_contain_text("HTTP 403", timeout=15000)
                    page.screenshot(path=str(ARTIFACTS / "dashboard-delete-refused.png"), full_page=True)
                    use_token(page, "alice-token")
                    page.locator("#delete-job").click()
                    expect(page.locator("#overview")).to_be_visible(timeout=15000)
                    expect(page.locator('tr[data-job="team-ui/from-browser"]')).to_have_count(
                        0, timeout=15000
                    )
                finally:
                    browser.close()
        finally:
            srv.stop()
