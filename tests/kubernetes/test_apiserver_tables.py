"""`kubectl get nodes` and `kubectl get pods` against the test API server print kubectl's own
columns for those built-in kinds (server-side table printing, `gpuyard/testing/apiserver/tables.py`):
nodes NAME STATUS ROLES AGE VERSION, pods NAME READY STATUS RESTARTS AGE (and IP, NODE with
`-o wide`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuyard.testing.apiserver.catalog import Resource
from gpuyard.testing.apiserver.fixture import RunningApiServer
from gpuyard.testing.apiserver.tables import table
from tests.kubernetes.test_apiserver_kubectl import KUBECTL, Kubectl

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (not on PATH)")


def node(name: str, *, ready: str, roles: tuple[str, ...] = (), cordoned: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {f"node-role.kubernetes.io/{r}": "" for r in roles}},
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {
            "conditions": [{"type": "Ready", "status": ready}],
            "nodeInfo": {"kubeletVersion": "v1.30.2-gpuyard"},
        },
    }


def rows(text: str) -> dict[str, list[str]]:
    lines = [line.split() for line in text.strip().splitlines()]
    return {cells[0]: cells for cells in lines}


async def test_kubectl_get_nodes_shows_status_roles_version(
    fake_apiserver: RunningApiServer, tmp_path: Path
) -> None:
    assert KUBECTL is not None
    kubectl = Kubectl(KUBECTL, fake_apiserver, tmp_path)
    nodes = [
        node("gpu-0", ready="True", roles=("worker", "gpu")),
        node("gpu-1", ready="False", cordoned=True),
    ]
    manifest = tmp_path / "nodes.yaml"
    manifest.write_text(yaml.safe_dump_all(nodes))
    await kubectl("create", "-f", str(manifest))
    out = await kubectl("get", "nodes")
    header = out.splitlines()[0].split()
    assert header == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    got = rows("\n".join(out.splitlines()[1:]))
    assert got["gpu-0"][1:3] == ["Ready", "gpu,worker"]
    assert got["gpu-0"][4] == "v1.30.2-gpuyard"
    assert got["gpu-1"][1:3] == ["NotReady,SchedulingDisabled", "<none>"]


async def test_kubectl_get_pods_shows_ready_status_restarts(
    fake_apiserver: RunningApiServer, tmp_path: Path
) -> None:
    assert KUBECTL is not None
    kubectl = Kubectl(KUBECTL, fake_apiserver, tmp_path)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "x"}]},
    }
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(yaml.safe_dump(pod))
    await kubectl("create", "-f", str(manifest))
    out = await kubectl("get", "pods", "-o", "wide")
    assert out.splitlines()[0].split()[:7] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"]
    assert rows("\n".join(out.splitlines()[1:]))["p"][1:4] == ["0/2", "Pending", "0"]
    assert (await kubectl("get", "pods")).splitlines()[0].split() == [
        "NAME",
        "READY",
        "STATUS",
        "RESTARTS",
        "AGE",
    ]


def test_pod_cells_follow_container_states() -> None:
    """Without kubectl: a pod's READY, STATUS (a container's reason wins) and RESTARTS cells."""
    res = Resource(group="", version="v1", plural="pods", kind="Pod", singular="pod", namespaced=True)
    pod = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": "a", "ready": True, "restartCount": 2, "state": {"running": {}}},
                {
                    "name": "b",
                    "ready": False,
                    "restartCount": 1,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                },
            ],
        },
    }
    cells = table(res, [pod])["rows"][0]["cells"]
    assert cells[:4] == ["p", "1/2", "CrashLoopBackOff", 3]
