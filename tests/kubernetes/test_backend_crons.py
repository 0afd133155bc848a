"""KubeDL's Cron on the Kubernetes backend (the development API server and the real control plane,
gpuyard's CRDs installed): a Cron created through the API server, as `kubectl apply` would, gets its
job created there on schedule (`@every 1s`), named `<cron>-<unix time>`, labelled
`kubedl.io/cron-name` and owned by the Cron, and its status (`active`, `history`,
`lastScheduleTime`) patched; with `Forbid` a schedule time that comes while the first job runs is
skipped (an `AlreadyActive` Event); deleting the Cron deletes its job."""

from __future__ import annotations

from typing import Any

from gpuyard.apis.resources import resource_for
from gpuyard.kubecluster.writing import to_json
from tests.builders import make_node
from tests.kubernetes.conftest_backend import FakeApiServerView, served
from tests.kubernetes.test_backend_platform import NODES, connect, eventually, platform, settings

__all__ = ["served"]

CRONS = resource_for("Cron")


def cron(name: str) -> dict[str, Any]:
    container = {"name": "pytorch", "image": "train", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    return {
        "apiVersion": "apps.kubedl.io/v1alpha1",
        "kind": "Cron",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "schedule": "@every 1s",
            "concurrencyPolicy": "Forbid",
            "historyLimit": 5,
            "template": {
                "apiVersion": "training.kubedl.io/v1alpha1",
                "kind": "PyTorchJob",
                "workload": {
                    "spec": {
                        "pytorchReplicaSpecs": {
                            "Worker": {"replicas": 1, "template": {"spec": {"containers": [container]}}}
                        }
                    }
                },
            },
        },
    }


def runs(server: FakeApiServerView, name: str) -> list[dict[str, Any]]:
    return [
        j
        for j in server.list("pytorchjobs")
        if j["metadata"].get("labels", {}).get("kubedl.io/cron-name") == name
    ]


async def test_a_cron_creates_its_job_on_the_api_server_and_writes_its_status(
    served: FakeApiServerView,
) -> None:
    client = await connect(served)
    try:
        await client.create(NODES, to_json(make_node("gpu-0", gpus=8)))
        async with platform(settings(served.kubeconfig, election=False)):
            created = await client.create(CRONS, cron("hourly"))
            jobs = await eventually(lambda: runs(served, "hourly"), timeout=15, what="the Cron's job")
            job = jobs[0]
            await eventually(
                lambda: (
                    (s := served.get("crons", "default", "hourly").get("status", {})).get("active")
                    and s.get("history")
                ),
                what="status.active and status.history",
            )
            status = served.get("crons", "default", "hourly")["status"]
            assert [a["name"] for a in status["active"]] == [job["metadata"]["name"]]
            assert status["lastScheduleTime"]
            assert status["history"][0]["object"]["name"] == job["metadata"]["name"]
            owner = job["metadata"]["ownerReferences"][0]
            assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
                "Cron",
                "hourly",
                created["metadata"]["uid"],
                True,
            )
            assert job["metadata"]["name"].startswith("hourly-")
            # a later schedule time comes while the first job still runs: skipped (Forbid)
            await eventually(
                lambda: any(
                    e.get("reason") == "AlreadyActive" and e.get("involvedObject", {}).get("name") == "hourly"
                    for e in served.list("events")
                ),
                what="an AlreadyActive Event about the Cron",
            )
            assert len(runs(served, "hourly")) == 1, "Forbid: no second run while one is active"
            await client.delete(CRONS, "default", "hourly")
            await eventually(
                lambda: not runs(served, "hourly"), timeout=10, what="the job deleted with its Cron"
            )
    finally:
        await client.close()
