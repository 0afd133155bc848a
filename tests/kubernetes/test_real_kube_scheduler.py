"""kube-scheduler beside gpuyard on the real control plane (`make k8s-bin`): one set of GPU nodes, two
schedulers, no over-commit.

`gpuyard fake-nodes` registers `configs/clusters/small.yaml` (4 nodes: 8 GPUs, 64 cpu, 512 GiB each)
and plays the kubelets, which admit pods as a real kubelet does (a pod that does not fit fails
`OutOf<resource>`). `gpuyard serve --backend kubernetes` runs. Plain pods with `schedulerName:
default-scheduler` (1 GPU, 24 cpu each: two per node leave 16 cpu and 6 GPUs) are bound by
kube-scheduler; then TFJobs whose GPU workers (2 GPUs, 16 cpu) gpuyard binds, more than the room
left, so gpuyard must count kube-scheduler's pods (one worker per node fits beside them, not two)
and queue the rest. While it runs and once everything finished: no pod failed `OutOf...`, and on no
node did the bound, unfinished pods ask for more cpu, memory, pods or GPUs than it has (GPUs
counted however a pod holds them: `nvidia.com/gpu`, `gpuyard.io/gpu` or a ResourceClaim's
devices). Everything runs to Succeeded.

Not covered: both schedulers deciding at the same moment. kube-scheduler sees gpuyard's placements
only once its pods are bound, so it can bind into room gpuyard has chosen but not yet bound; the
kubelet then rejects the later pod (`OutOfcpu`), as on any cluster with two schedulers
(docs/kubernetes-testing.md, "Differences the tests met").
"""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

import httpx
import pytest

from gpuyard.apis.core import Pod
from gpuyard.devices.scenarios import load_scenario
from tests.kubernetes.realplane import admin_http
from tests.kubernetes.test_walkthrough import FAST_LEASE, ROOT, Stack, free_port, wait_for

SCENARIO = "configs/clusters/small.yaml"
NAMESPACE = "default"
PLAIN_PODS = 8
JOBS = 4
TERMINAL = ("Succeeded", "Failed")
GPU_NAMES = ("nvidia.com/gpu", "gpuyard.io/gpu")


def plain_pod(i: int) -> dict[str, Any]:
    requests = {"nvidia.com/gpu": "1", "cpu": "24", "memory": "64Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"plain-{i}", "namespace": NAMESPACE, "labels": {"app": "plain"}},
        "spec": {
            "schedulerName": "default-scheduler",
            "restartPolicy": "Never",
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"requests": requests, "limits": requests}}
            ],
        },
    }


def tfjob(i: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "2", "cpu": "16", "memory": "64Gi"}
    container = {"name": "tensorflow", "image": "tf:1", "resources": {"limits": limits}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": f"train-{i}", "namespace": NAMESPACE},
        "spec": {
            "tfReplicaSpecs": {
                "Worker": {
                    "replicas": 2,
                    "restartPolicy": "Never",
                    "template": {"spec": {"containers": [container]}},
                }
            }
        },
    }


def _claim_devices(http: httpx.Client) -> dict[tuple[str, str], int]:
    """(namespace, name) of each allocated ResourceClaim -> how many devices it holds."""
    answer = http.get("/apis/resource.k8s.io/v1/resourceclaims")
    if answer.status_code == 404:
        return {}
    answer.raise_for_status()
    return {
        (c["metadata"]["namespace"], c["metadata"]["name"]): len(
            ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
        )
        for c in answer.json()["items"]
    }


def over_commits(pods: list[dict[str, Any]], claims: dict[tuple[str, str], int]) -> list[str]:
    """Each node whose bound, unfinished pods ask for more than its allocatable, and what."""
    allocatable = {n.metadata.name: n.status.allocatable for n in load_scenario(ROOT / SCENARIO).nodes()}
    used: dict[str, dict[str, Decimal]] = {name: {} for name in allocatable}
    for raw in pods:
        node = raw["spec"].get("nodeName")
        if node not in used or (raw.get("status") or {}).get("phase") in TERMINAL:
            continue
        pod = Pod.model_validate(raw)
        total = used[node]
        requests = pod.spec.requests()
        gpus = sum((requests.get(name, Decimal(0)) for name in GPU_NAMES), Decimal(0))
        for ref in raw["spec"].get("resourceClaims") or []:
            gpus += claims.get((pod.metadata.namespace, ref.get("resourceClaimName") or ""), 0)
        for name, q in (*((n, requests.get(n, Decimal(0))) for n in ("cpu", "memory")), ("pods", Decimal(1))):
            total[name] = total.get(name, Decimal(0)) + q
        total["gpus"] = total.get("gpus", Decimal(0)) + gpus
    out = []
    for node, total in used.items():
        have = {**allocatable[node], "gpus": allocatable[node].get("nvidia.com/gpu", Decimal(0))}
        out += [f"{node}: {k} {v} > {have[k]}" for k, v in total.items() if v > have[k]]
    return out


@pytest.mark.parametrize("gpu_resource", ["nvidia.com/gpu"])
def test_pods_of_kube_scheduler_and_of_gpuyard_share_nodes_without_over_commit(
    clean_plane: Any, plane_stack: Stack, gpu_resource: str
) -> None:
    plane, stack = clean_plane, plane_stack
    started = time.monotonic()
    with admin_http(plane) as http:
        stack.start(
            "fake-nodes",
            "fake-nodes",
            "--kubeconfig",
            str(plane.admin_kubeconfig),
            "--cluster",
            SCENARIO,
            "--pod-duration",
            "6s",
            "--heartbeat",
            "2",
        )
        wait_for("the fake nodes", lambda: len(http.get("/api/v1/nodes").json()["items"]) == 4)
        port = free_port()
        stack.start(
            "gpuyard",
            "serve",
            "--backend",
            "kubernetes",
            "--kubeconfig",
            str(plane.admin_kubeconfig),
            "--port",
            str(port),
            "--data-dir",
            str(stack.tmp / "gpuyard"),
            env={
                **FAST_LEASE,
                "POD_NAME": "gpuyard-0",
                "GPUYARD__BACKEND__KUBERNETES__GPU_RESOURCE": gpu_resource,
            },
        )
        wait_for("gpuyard ready", lambda: httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200)

        for i in range(PLAIN_PODS):
            answer = http.post(f"/api/v1/namespaces/{NAMESPACE}/pods", json=plain_pod(i))
            assert answer.status_code == 201, answer.text

        def plain_running() -> bool:
            pods = http.get(f"/api/v1/namespaces/{NAMESPACE}/pods").json()["items"]
            return len(pods) == PLAIN_PODS and all(p["status"].get("phase") == "Running" for p in pods)

        wait_for("kube-scheduler's pods running", plain_running)
        for i in range(JOBS):
            answer = http.post(f"/apis/kubeflow.org/v1/namespaces/{NAMESPACE}/tfjobs", json=tfjob(i))
            assert answer.status_code == 201, answer.text

        violations: list[str] = []
        shared: set[str] = set()  # nodes seen running pods of both schedulers at once
        workers: dict[str, str] = {}  # every job pod seen bound -> its scheduler (finished ones go)

        def settled() -> bool:
            pods = http.get(f"/api/v1/namespaces/{NAMESPACE}/pods").json()["items"]
            violations.extend(over_commits(pods, _claim_devices(http)))
            by_node: dict[str, set[str]] = {}
            for p in pods:
                if p["metadata"].get("labels", {}).get("training.kubeflow.org/job-name") and p["spec"].get(
                    "nodeName"
                ):
                    workers[p["metadata"]["name"]] = p["spec"]["schedulerName"]
                if p["spec"].get("nodeName") and (p.get("status") or {}).get("phase") == "Running":
                    by_node.setdefault(p["spec"]["nodeName"], set()).add(p["spec"]["schedulerName"])
            shared.update(n for n, names in by_node.items() if len(names) > 1)
            jobs = http.get(f"/apis/kubeflow.org/v1/namespaces/{NAMESPACE}/tfjobs").json()["items"]
            plain = [p for p in pods if p["metadata"]["name"].startswith("plain-")]
            return all((p.get("status") or {}).get("phase") in TERMINAL for p in plain) and all(
                (j.get("status") or {}).get("phase") in TERMINAL for j in jobs
            )

        wait_for("every pod and job to finish", settled, timeout=300)
        pods = http.get(f"/api/v1/namespaces/{NAMESPACE}/pods").json()["items"]
        jobs = http.get(f"/apis/kubeflow.org/v1/namespaces/{NAMESPACE}/tfjobs").json()["items"]

    rejected = {
        p["metadata"]["name"]: f"{p['status'].get('reason')}: {p['status'].get('message')}"
        for p in pods
        if str((p.get("status") or {}).get("reason") or "").startswith("OutOf")
    }
    assert not rejected, f"the kubelets rejected pods: {rejected}"
    assert not violations, f"over-committed: {sorted(set(violations))}"
    plain = [p for p in pods if p["metadata"]["name"].startswith("plain-")]
    assert len(plain) == PLAIN_PODS and len(workers) >= 2 * JOBS, workers
    assert {p["spec"]["schedulerName"] for p in plain} == {"default-scheduler"}
    assert set(workers.values()) == {"gpuyard"}
    assert {p["status"]["phase"] for p in plain} == {"Succeeded"}
    assert {j["status"]["phase"] for j in jobs} == {"Succeeded"}, [j["status"] for j in jobs]
    assert shared, "no node ever ran pods of both schedulers at once: the test showed nothing"
    print(f"kube-scheduler beside gpuyard ({gpu_resource}): {time.monotonic() - started:.0f} s")
