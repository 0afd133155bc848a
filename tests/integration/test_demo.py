"""`gpuyard demo` (what `make run` starts): serves, submits the sample jobs, stops on SIGTERM."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=2) as r:
        return json.loads(r.read())


def test_demo_runs_sample_jobs_and_explains_the_waiting_one():
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuyard.cli", "demo", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 30
        jobs: dict[str, dict] = {}
        while time.time() < deadline:
            try:
                items = _get(f"{base}/api/v1/jobs")["items"]
            except OSError:
                items = []
            jobs = {f"{j['metadata']['namespace']}/{j['metadata']['name']}": j for j in items}
            phases = {k: j["summary"]["phase"] for k, j in jobs.items()}
            if len(jobs) == 5 and phases.get("team-a/resnet50-ddp") == "Running":
                break
            time.sleep(0.2)
        assert set(jobs) == {
            "kubedl/mnist",
            "team-a/resnet50-ddp",
            "team-a/xgb-churn",
            "team-b/a100-sweep",
            "team-b/llm-pretrain",
        }
        assert jobs["team-a/resnet50-ddp"]["summary"]["phase"] == "Running"
        assert jobs["team-b/a100-sweep"]["summary"]["phase"] == "Queuing"
        explain = _get(f"{base}/api/v1/namespaces/team-b/jobs/a100-sweep/explain")
        assert "nvidia.a100" in json.dumps(explain)
        pods = _get(f"{base}/api/v1/namespaces/team-a/jobs/resnet50-ddp/pods")["items"]
        nodes = {p["spec"]["nodeName"] for p in pods}
        assert len(pods) == 4 and all(n.startswith("dgx1-") for n in nodes), (
            "V100 class lands on the DGX-1 nodes"
        )
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=5)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def test_demo_url_line_comes_after_the_sample_jobs_have_started():
    """The "open http..." line is the last of the start-up burst, not buried under job logs."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuyard.cli", "demo", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        before: list[str] = []
        for line in proc.stderr:
            if "gpuyard demo: open http://" in line:
                break
            before.append(line)
        else:
            raise AssertionError("no URL line:\n" + "".join(before))
        assert any(line.startswith("demo: submitted 5 sample jobs") for line in before)
        running = {
            json.loads(line)["job"]
            for line in before
            if line.startswith("{") and '"job.transition"' in line and '"phase": "Running"' in line
        }
        assert running == {"kubedl/mnist", "team-a/resnet50-ddp", "team-a/xgb-churn", "team-b/llm-pretrain"}
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
