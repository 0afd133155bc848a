"""The transform on informer objects (`kubecluster/trimming.py`): `managedFields` go from every
object; a foreign pod keeps what the node model reads of it (its requests, node, phase, scheduler,
labels, owners, deletion) and loses env, volumes, probes and statuses; gpuyard's own pods (its
scheduler, a job's, a ModelVersion's build pod) are kept whole."""

from __future__ import annotations

import copy
from typing import Any

from gpuyard.apis.core import Pod
from gpuyard.kubecluster.nodes import foreign_usage
from gpuyard.kubecluster.trimming import LAST_APPLIED, Trimmer

OURS = frozenset({"gpuyard"})


def container(name: str, cpu: str, gpus: int = 0) -> dict[str, Any]:
    limits: dict[str, Any] = {"cpu": cpu, "memory": "1Gi"}
    if gpus:
        limits["nvidia.com/gpu"] = gpus
    return {
        "name": name,
        "image": "registry.example/agent:1",
        "command": ["/agent", "--verbose"],
        "env": [{"name": "TOKEN", "value": "s3cret" * 50}],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}},
        "securityContext": {"privileged": True},
        "resources": {"limits": limits, "requests": {"cpu": cpu}},
    }


def pod(scheduler: str = "default-scheduler", **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "agent-x",
            "namespace": "kube-system",
            "uid": "u-1",
            "resourceVersion": "42",
            "labels": {"app": "agent"},
            "annotations": {LAST_APPLIED: "{" + "x" * 2000 + "}", "note": "kept"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "d"}],
            "deletionTimestamp": "2026-01-01T00:00:00Z",
            "finalizers": ["example.com/hold"],
            "managedFields": [{"manager": "kubelet", "operation": "Update", "fieldsV1": {"f:status": {}}}],
            **meta,
        },
        "spec": {
            "nodeName": "n1",
            "schedulerName": scheduler,
            "priority": 7,
            "tolerations": [{"operator": "Exists"}],
            "containers": [container("a", "500m", gpus=1), container("b", "250m")],
            "initContainers": [container("init", "2")],
            "volumes": [{"name": "data", "hostPath": {"path": "/var/data"}}],
        },
        "status": {
            "phase": "Running",
            "hostIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "a", "ready": True, "restartCount": 0, "image": "x"}],
        },
    }


def test_a_foreign_pod_keeps_what_the_node_model_reads() -> None:
    raw = pod()
    trim = Trimmer(ours=OURS)
    before = Pod.model_validate(copy.deepcopy(raw))
    after = Pod.model_validate(trim("Pod", copy.deepcopy(raw)))
    assert trim.trimmed_pods == 1
    assert after.spec.requests() == before.spec.requests()
    assert foreign_usage([after]) == foreign_usage([before]) != {}
    for read in (
        lambda p: p.metadata.name,
        lambda p: p.metadata.namespace,
        lambda p: p.metadata.uid,
        lambda p: p.metadata.labels,
        lambda p: p.metadata.owner_references,
        lambda p: p.metadata.deletion_timestamp,
        lambda p: p.metadata.finalizers,
        lambda p: p.metadata.resource_version,
        lambda p: p.spec.node_name,
        lambda p: p.spec.scheduler_name,
        lambda p: p.spec.priority,
        lambda p: p.spec.tolerations,
        lambda p: p.status.phase,
        lambda p: p.status.host_ip,
        lambda p: [c.name for c in p.spec.containers + p.spec.init_containers],
    ):
        assert read(after) == read(before)
    assert after.metadata.annotations == {"note": "kept"}
    dumped = after.to_dict()
    assert "managedFields" not in dumped["metadata"]
    assert "volumes" not in dumped["spec"]
    for c in dumped["spec"]["containers"]:
        assert c["name"] in ("a", "b") and c["resources"]["limits"]  # the model adds empty defaults only
        assert not c.get("env") and not c.get("command") and "volumeMounts" not in c
        assert "livenessProbe" not in c and "securityContext" not in c
    assert not after.status.container_statuses and not after.status.conditions


def test_gpuyard_s_pods_are_kept_whole_but_managed_fields() -> None:
    trim = Trimmer(ours=OURS)
    job_owned = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "name": "mnist", "uid": "j"}
    build = {"apiVersion": "model.kubedl.io/v1alpha1", "kind": "ModelVersion", "name": "mv", "uid": "m"}
    for raw in (
        pod("gpuyard"),
        pod(ownerReferences=[job_owned]),
        pod(ownerReferences=[build]),
        pod(labels={"job-name": "mnist"}),
    ):
        expected = copy.deepcopy(raw)
        del expected["metadata"]["managedFields"]
        assert trim("Pod", raw) == expected
    assert trim.trimmed_pods == 0


def test_every_kind_loses_managed_fields_only() -> None:
    trim = Trimmer(ours=OURS)
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n1", "managedFields": [{"manager": "kubelet"}], "labels": {"a": "b"}},
        "status": {"capacity": {"cpu": "8"}, "images": [{"names": ["x"], "sizeBytes": 1}]},
    }
    out = trim("Node", copy.deepcopy(node))
    del node["metadata"]["managedFields"]
    assert out == node
