"""Durability across a killed process: acknowledged writes stay, resourceVersions are never reused."""

from __future__ import annotations

import json
import signal
import time

import httpx
import pytest

from tests.faults.conftest import Server

pytestmark = pytest.mark.faults


def _job(name: str) -> dict[str, object]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": 1,
                    "restartPolicy": "OnFailure",
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "pytorch",
                                    "image": "train:1",
                                    "resources": {"limits": {"nvidia.v100": 1, "cpu": "4", "memory": "8Gi"}},
                                }
                            ]
                        }
                    },
                }
            }
        },
    }


def _submit(http: httpx.Client, name: str) -> None:
    r = http.post("/api/v1/jobs", json=_job(name))
    assert r.status_code in (200, 201), r.text


def _wait_for_events(http: httpx.Client, name: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        r = http.get(f"/api/v1/namespaces/team-a/jobs/{name}/events")
        if r.status_code == 200 and r.json().get("items"):
            return
        time.sleep(0.05)
    raise AssertionError(f"job {name} got no events")


def _rv(http: httpx.Client) -> int:
    return int(http.get("/api/v1/jobs").json()["resourceVersion"])


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_resource_versions_are_never_reused_after_a_restart(server: Server, sig: int) -> None:
    server.start()
    with server.client() as http:
        _submit(http, "first")
        _wait_for_events(http, "first")  # Events (not journaled) have used versions
        time.sleep(0.3)
        seen = _rv(http)  # handed to a client
    server.kill(sig)

    server.start()
    with server.client() as http, server.client() as other:
        assert _rv(http) >= seen
        with http.stream(
            "GET", "/api/v1/watch/jobs", params={"resourceVersion": seen}, timeout=httpx.Timeout(10, read=3)
        ) as watch:
            if watch.status_code == 410:  # resumed from before the restart: re-list, never a gap
                body = json.loads(watch.read())
                assert body["error"]["details"][0]["field"] == "resourceVersion"
                return
            assert watch.status_code == 200
            _submit(other, "second")
            deadline = time.monotonic() + 5
            for line in watch.iter_lines():  # a missed event ends in a read timeout
                assert time.monotonic() < deadline, "the new job's event never came"
                if line.startswith("id: "):
                    assert int(line[4:]) > seen
                if line.startswith("data: ") and '"name":"second"' in line:
                    break
                assert line != "event: GONE"
        second = other.get("/api/v1/namespaces/team-a/jobs/second").json()
        assert int(second["metadata"]["resourceVersion"]) > seen
