"""Spot replicas on the Kubernetes backend (the development API server, gpuyard's CRDs): the last
replica of a PyTorchJob with `spotReplicaSpec` is created with the spot priorityClassName and
labels and bound to the spot node, the first without them and off it; the PodGroup on the API
server carries the role's spotReplicas, so a new leader places the spot replicas alike."""

from __future__ import annotations

from typing import Any

from gpuyard.apis.resources import resource_for
from gpuyard.kubecluster.writing import to_json
from tests.builders import make_node
from tests.kubernetes.conftest_backend import FakeApiServerView, served
from tests.kubernetes.test_backend_platform import NODES, connect, eventually, job_pods, platform, settings

__all__ = ["served"]

PYTORCHJOBS = resource_for("PyTorchJob", "kubeflow.org/v1")
PRIORITY_CLASSES = resource_for("PriorityClass")


def spot_job(name: str) -> dict[str, Any]:
    container = {"name": "pytorch", "image": "pt:1", "resources": {"limits": {"nvidia.com/gpu": 4}}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": 2,
                    "restartPolicy": "OnFailure",
                    "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [container]}},
                    "spotReplicaSpec": {
                        "spotReplicaNumber": 1,
                        "priorityClassName": "spot-low",
                        "labels": {"capacity": "spot"},
                    },
                }
            }
        },
    }


def what_happened(served: FakeApiServerView, job: str) -> str:
    """The job's events, PodGroup, Reservations and pods as the server holds them: what a failed
    placement assertion prints."""
    mine = [e for e in served.list("events") if e["involvedObject"].get("name", "").startswith(job)]
    lines = [f"event {e['involvedObject'].get('name')}: {e.get('reason')}: {e.get('message')}" for e in mine]
    lines += [f"podgroup: {g['spec']} {g.get('status')}" for g in served.list("podgroups")]
    lines += [f"reservation: {r['metadata']['name']} {r['spec']}" for r in served.list("reservations")]
    lines += [
        f"pod: {p['metadata']['name']} {p['spec'].get('nodeName')} {p.get('status')}"
        for p in job_pods(served, job)
    ]
    lines += [
        f"node: {n['metadata']['name']} {n['spec']} {n['status'].get('conditions')}"
        for n in served.list("nodes")
    ]
    return "\n".join(lines)


async def test_the_last_replica_gets_the_spot_class_labels_and_node(served: FakeApiServerView) -> None:
    client = await connect(served)
    try:
        await client.create(NODES, to_json(make_node("od-0", gpus=8)))
        spot = make_node("spot-0", gpus=8, labels={"node.kubernetes.io/lifecycle": "spot"})
        await client.create(NODES, to_json(spot))
        await client.create(
            PRIORITY_CLASSES,
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": "spot-low"},
                "value": -10,
            },
        )
        async with platform(settings(served.kubeconfig, election=False)):
            await client.create(PYTORCHJOBS, spot_job("sp"))
            pods = await eventually(
                lambda: (
                    len(x := job_pods(served, "sp")) == 2 and all(p["spec"].get("nodeName") for p in x) and x
                ),
                what="two bound pods",
            )
            by_name = {p["metadata"]["name"]: p for p in pods}
            first, last = by_name["sp-worker-0"], by_name["sp-worker-1"]
            assert last["spec"]["priorityClassName"] == "spot-low"
            assert last["metadata"]["labels"]["capacity"] == "spot"
            assert last["metadata"]["labels"]["app"] == "sp"
            assert last["spec"]["nodeName"] == "spot-0"
            assert "priorityClassName" not in first["spec"]
            assert "capacity" not in first["metadata"]["labels"]
            # binpacking alone would have put both together
            assert first["spec"]["nodeName"] == "od-0", what_happened(served, "sp")
            (group,) = [g for g in served.list("podgroups") if g["metadata"]["name"] == "sp"]
            assert [r.get("spotReplicas") for r in group["spec"]["roles"]] == [1]
    finally:
        await client.close()
