"""`gpuyard demo` (what `make run` starts): serves, submits the sample jobs, stops on SIGTERM."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from click.testing import CliRunner

import gpuyard.cli as cli
import gpuyard.cli.serving as serving


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
            "kubedl/mnist-demo",
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


def _demo_settings(monkeypatch, args: list[str], env: dict[str, str]):
    """The settings `gpuyard demo ARGS` would serve with, under ENV (nothing is started)."""
    seen = []
    monkeypatch.setattr(serving, "_run_server", lambda settings, **_: seen.append(settings))
    for name in ("GPUYARD__SERVER__HOST", "GPUYARD__SERVER__PORT", "GPUYARD__SERVER__INSECURE"):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(cli.main, ["demo", "--no-jobs", *args], env=env)
    return result, seen


def test_demo_takes_host_and_port_from_the_settings_unless_given(monkeypatch):
    # what `GPUYARD__SERVER__PORT=18080 make run` does: the environment picks the port
    env = {"GPUYARD__SERVER__PORT": "18080", "GPUYARD__SERVER__HOST": "localhost"}
    result, seen = _demo_settings(monkeypatch, [], env)
    assert result.exit_code == 0, result.output
    assert (seen[0].server.host, seen[0].server.port) == ("localhost", 18080)
    # the flags win over the environment
    result, seen = _demo_settings(monkeypatch, ["--port", "18081", "--host", "127.0.0.1"], env)
    assert result.exit_code == 0, result.output
    assert (seen[0].server.host, seen[0].server.port) == ("127.0.0.1", 18081)
    # nothing set anywhere: the defaults
    result, seen = _demo_settings(monkeypatch, [], {})
    assert (seen[0].server.host, seen[0].server.port) == ("127.0.0.1", 8080)


def test_demo_rejects_a_bad_port_naming_it(monkeypatch):
    result, seen = _demo_settings(monkeypatch, ["--port", "70000"], {})
    assert result.exit_code == 2 and not seen
    assert "port" in result.output, result.output
    result, seen = _demo_settings(monkeypatch, [], {"GPUYARD__SERVER__PORT": "eighty"})
    assert result.exit_code == 2 and not seen
    assert "port" in result.output, result.output


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
        assert running == {
            "kubedl/mnist-demo",
            "team-a/resnet50-ddp",
            "team-a/xgb-churn",
            "team-b/llm-pretrain",
        }
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
