"""The job page's Logs panel in headless Chromium: the leader pod's log read once it runs, another
pod's followed until its container exits, and the reason of a 501 shown.

Reuses the Platform fixture of `test_dashboard.py` (demo scenario, real clock, in memory); every
wait is on what the page shows (Playwright's `expect`), never a sleep.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from tests.e2e import test_dashboard as base
from tests.e2e.test_dashboard import ARTIFACTS, CHROMIUM, JOB, LAUNCH_ARGS, Server, submit

pytestmark = base.pytestmark  # skips where chromium or playwright is missing
server = base.server  # the same fixture: a whole Platform on the demo scenario
sync_playwright = base.sync_playwright
expect: Any = getattr(base, "expect", None)


def logged_job(name: str, *, worker_runs: str) -> dict[str, Any]:
    """A PyTorchJob of a master (runs until deleted) and one worker that runs `worker_runs`."""
    job = copy.deepcopy(JOB)
    job["metadata"] = {"name": name, "namespace": "team-e2e"}
    master = job["spec"]["pytorchReplicaSpecs"]["Master"]
    master["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.v100"] = 1
    worker = copy.deepcopy(master)
    worker["template"]["metadata"] = {"annotations": {"fake.gpuyard.io/duration": worker_runs}}
    job["spec"]["pytorchReplicaSpecs"]["Worker"] = worker
    return job


def open_job(pw: Any, url: str, name: str) -> tuple[Any, Any, list[str]]:
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, headless=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{url}/#/jobs/team-e2e/{name}")
    expect(page.locator("#logs")).to_be_visible(timeout=15000)
    return browser, page, errors


def test_job_page_shows_the_leaders_log_and_follows_a_pod_to_its_end(server: Server) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    submit(server.url, logged_job("logs-ddp", worker_runs="20s"))
    with sync_playwright() as pw:
        browser, page, errors = open_job(pw, server.url, "logs-ddp")
        try:
            lines, status = page.locator("#log-lines"), page.locator("#log-status")
            expect(page.locator("#log-pod")).to_have_value("logs-ddp-master-0", timeout=15000)
            # read again when the pod starts running: where and how it started, its environment
            expect(lines).to_contain_text(
                "started container pytorch image pytorch/pytorch:2.3.0", timeout=30000
            )
            expect(lines).to_contain_text("env: RANK=0")
            expect(lines).to_contain_text("WORLD_SIZE=2")
            expect(status).to_have_text("Running")

            page.locator("#log-pod").select_option("logs-ddp-worker-0")
            expect(lines).to_contain_text("env: RANK=1", timeout=30000)
            page.locator("#log-follow").click()
            expect(page.locator("#log-follow")).to_have_text("Stop")
            expect(status).to_have_text("following…")
            expect(lines).to_contain_text("started container pytorch", timeout=15000)
            page.screenshot(path=str(ARTIFACTS / "dashboard-logs.png"), full_page=True)
            # the stream ends when the container exits, and the panel says so
            expect(lines).to_contain_text("exited with code 0 (Completed)", timeout=60000)
            expect(page.locator("#log-follow")).to_have_text("Follow")
            expect(status).to_have_text("Succeeded: the container has finished")
            assert lines.inner_text().count("started container") == 1
            assert not errors, errors
        finally:
            browser.close()


def test_job_page_shows_why_there_is_no_log(server: Server) -> None:
    submit(server.url, logged_job("no-logs", worker_runs="inf"))
    reason = "pod logs are not available: the plain backend reads no pod logs; read the containers' output"
    with sync_playwright() as pw:
        browser, page, errors = open_job(pw, server.url, "no-logs")
        try:
            page.route(
                "**/pods/*/log*",
                lambda route: route.fulfill(
                    status=501,
                    content_type="application/json",
                    body=json.dumps({"error": {"code": 501, "message": reason, "details": []}}),
                ),
            )
            expect(page.locator("#log-pod")).to_have_value("no-logs-master-0", timeout=15000)
            page.locator("#log-refresh").click()
            expect(page.locator("#log-status")).to_contain_text(reason, timeout=15000)
            expect(page.locator("#log-status")).to_have_class("why wide")
            page.locator("#log-follow").click()  # the stream is refused the same way
            expect(page.locator("#log-follow")).to_have_text("Follow", timeout=15000)
            expect(page.locator("#log-status")).to_contain_text(reason)
            assert not errors, errors
        finally:
            browser.close()
