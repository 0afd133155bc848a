"""`gpuyard fake-nodes` against an API server (the `fake_apiserver` fixture): nodes, kubelets, faults."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import pytest_asyncio
from click.testing import CliRunner
from kubernetes_asyncio import client

from gpuyard.apis.core import Pod
from gpuyard.apis.crds import crds
from gpuyard.cli import main
from gpuyard.cli.fakenodes import DEFAULT_POD_DURATION, _with_duration, admin_app
from gpuyard.devices.scenarios import load_scenario
from gpuyard.kubecluster.fakenodes import FakeNodes, connect
from gpuyard.kubecluster.fakenodes.objects import (
    node_lease,
    node_objects,
    running_status,
    terminated_status,
    topology_objects,
)

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = load_scenario(ROOT / "configs" / "clusters" / "demo.yaml")
VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def pod_body(name: str, node: str, **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "annotations": annotations},
        "spec": {
            "nodeName": node,
            "schedulerName": "gpuyard",
            "containers": [{"name": "trainer", "image": "example/trainer:1"}],
        },
    }


@pytest_asyncio.fixture
async def cluster(fake_apiserver: Any) -> AsyncIterator[tuple[FakeNodes, client.CoreV1Api]]:
    """fake-nodes on gpuyard's test API server, connected through its kubeconfig."""
    api = await connect(str(fake_apiserver.kubeconfig))
    async with api:
        extensions = client.ApiextensionsV1Api(api)
        for crd in crds():
            await extensions.create_custom_resource_definition(body=crd)
        nodes = FakeNodes(api, scenario=SCENARIO, heartbeat=0.2)
        task = asyncio.create_task(nodes.run())
        await asyncio.wait_for(nodes.registered.wait(), 10)
        try:
            yield nodes, client.CoreV1Api(api)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def until(check: Callable[[], Any], *, timeout: float = 10.0) -> Any:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        value = await check()
        if value or loop.time() > end:
            return value
        await asyncio.sleep(0.05)


async def test_nodes_are_registered_with_devices_and_heartbeats(cluster) -> None:  # type: ignore[no-untyped-def]
    nodes, core = cluster
    listed = (await core.list_node()).items
    assert {n.metadata.name for n in listed} == nodes.names
    dgx = next(n for n in listed if n.metadata.name == "dgx1-0")
    assert dgx.status.allocatable["nvidia.com/gpu"] == "8"
    assert dgx.status.capacity["rdma/hca"] == "4"
    assert dgx.metadata.labels["nvidia.com/gpu.product"] == "Tesla-V100-SXM2-32GB"
    assert dgx.metadata.labels["gpuyard.io/topology-preset"] == "dgx1-v100"
    assert [c.type for c in dgx.status.conditions] == ["Ready"] and dgx.status.conditions[0].status == "True"
    custom = client.CustomObjectsApi(core.api_client)
    topologies = (await custom.list_cluster_custom_object("gpuyard.io", "v1alpha1", "nodetopologies"))[
        "items"
    ]
    assert {t["metadata"]["name"] for t in topologies} == {
        t["metadata"]["name"] for t in topology_objects(SCENARIO)
    }
    leases = client.CoordinationV1Api(core.api_client)

    async def renewed() -> bool:
        found = (await leases.list_namespaced_lease("kube-node-lease")).items
        return {lease.metadata.name for lease in found} == nodes.names

    assert await until(renewed)


async def test_a_bound_pod_runs_to_succeeded_after_its_duration(cluster, fake_apiserver) -> None:  # type: ignore[no-untyped-def]
    _, core = cluster
    await core.create_namespaced_pod(
        "ml",
        body=pod_body(
            "w-0", "dgx1-0", **{"fake.gpuyard.io/start-delay": "0", "fake.gpuyard.io/duration": "0.3"}
        ),
    )
    await core.create_namespaced_pod("ml", body=pod_body("elsewhere", "not-a-fake-node"))

    async def phase(name: str) -> str:
        status = (await core.read_namespaced_pod(name, "ml")).status
        return str(status.phase or "") if status is not None else ""

    assert await until(lambda: _is(phase("w-0"), "Succeeded"))
    pod = await core.read_namespaced_pod("w-0", "ml")
    assert pod.status.start_time is not None
    (status,) = pod.status.container_statuses
    assert status.state.terminated.exit_code == 0 and status.state.terminated.reason == "Completed"
    assert await phase("elsewhere") in ("", "Pending")  # not bound to a fake node: not ours
    # the kubelet writes pod status through the status subresource only, never the pod itself
    pod_writes = {
        (r.verb, r.subresource)
        for r in fake_apiserver.server.audit
        if r.resource == "pods" and r.verb not in ("get", "list", "watch")
    }
    assert pod_writes == {("create", ""), ("patch", "status")}  # create: this test's own


async def test_exit_code_annotation_fails_the_pod(cluster) -> None:  # type: ignore[no-untyped-def]
    _, core = cluster
    ann = {
        "fake.gpuyard.io/start-delay": "0",
        "fake.gpuyard.io/duration": "0.1",
        "fake.gpuyard.io/exit-code": "3",
    }
    await core.create_namespaced_pod("ml", body=pod_body("bad", "dgx1-1", **ann))

    async def failed() -> bool:
        status = (await core.read_namespaced_pod("bad", "ml")).status
        return status is not None and status.phase == "Failed"

    assert await until(failed)
    pod = await core.read_namespaced_pod("bad", "ml")
    assert pod.status.container_statuses[0].state.terminated.exit_code == 3


async def test_a_failed_node_turns_not_ready_and_fails_its_pods(cluster) -> None:  # type: ignore[no-untyped-def]
    nodes, core = cluster
    ann = {"fake.gpuyard.io/start-delay": "0", "fake.gpuyard.io/duration": "inf"}
    await core.create_namespaced_pod("ml", body=pod_body("long", "dgx1-1", **ann))

    async def running() -> bool:
        status = (await core.read_namespaced_pod("long", "ml")).status
        return status is not None and status.phase == "Running"

    assert await until(running)
    assert await until(
        lambda: _true(("ml", "long") in nodes.pods and nodes.pods[("ml", "long")].status.phase == "Running")
    )
    assert await nodes.fail_node("dgx1-1") == 1
    pod = await core.read_namespaced_pod("long", "ml")
    assert pod.status.phase == "Failed" and pod.status.reason == "NodeLost"
    node = await core.read_node("dgx1-1")
    assert node.status.conditions[0].status == "False"
    with pytest.raises(KeyError, match="not one of the fake nodes"):
        await nodes.fail_node("nope")


async def _is(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def _true(value: bool) -> bool:
    return value


def test_everything_fake_nodes_writes_validates() -> None:
    pod = Pod.model_validate(pod_body("w-0", "dgx1-0"))
    for node in node_objects(SCENARIO, now=NOW):
        for version in VERSIONS:
            kubernetes_validate.validate(node, version, strict=True)
    for status in (
        running_status(pod, now=NOW),
        terminated_status(pod, exit_code=0, reason="Completed", now=NOW),
        terminated_status(pod, exit_code=137, reason="NodeLost", message="node failed", now=NOW),
    ):
        for version in VERSIONS:
            kubernetes_validate.validate(
                {**pod_body("w-0", "dgx1-0"), "status": status}, version, strict=True
            )
    for version in VERSIONS:
        kubernetes_validate.validate(node_lease("dgx1-0", now=NOW), version, strict=True)
    topologies = topology_objects(SCENARIO)
    assert {t["metadata"]["name"] for t in topologies} <= {
        n["metadata"]["name"] for n in node_objects(SCENARIO, now=NOW)
    }
    assert all(t["kind"] == "NodeTopology" and t["spec"]["gpus"] for t in topologies)


async def test_fault_injection_over_the_admin_port(cluster, aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    nodes, core = cluster
    devices = '{"gpus":[2,3],"gpuIds":[],"nics":[],"hostPorts":[]}'
    ann = {
        "fake.gpuyard.io/start-delay": "0",
        "fake.gpuyard.io/duration": "inf",
        "gpuyard.io/devices": devices,
    }
    await core.create_namespaced_pod("ml", body=pod_body("gpu-user", "dgx1-0", **ann))
    assert await until(
        lambda: _true(
            ("ml", "gpu-user") in nodes.pods and nodes.pods[("ml", "gpu-user")].status.phase == "Running"
        )
    )
    http = await aiohttp_client(admin_app(nodes))
    missing = await http.post("/nodes/nope/fail")
    assert missing.status == 404 and "dgx1-0" in (await missing.json())["error"]["message"]
    spared = await http.post("/nodes/dgx1-0/gpus/5/fail")
    assert (await spared.json()) == {"podsFailed": 0}
    hit = await http.post("/nodes/dgx1-0/gpus/3/fail")
    assert (await hit.json()) == {"podsFailed": 1}
    pod = await core.read_namespaced_pod("gpu-user", "ml")
    assert pod.status.phase == "Failed" and pod.status.reason == "DeviceUnhealthy"
    node = await core.read_node("dgx1-0")
    assert node.metadata.annotations["gpuyard.io/unhealthy-gpus"] == "3,5"
    custom = client.CustomObjectsApi(core.api_client)
    topo = await custom.get_cluster_custom_object("gpuyard.io", "v1alpha1", "nodetopologies", "dgx1-0")
    assert [g["index"] for g in topo["spec"]["gpus"] if g.get("health") == "Unhealthy"] == [3, 5]
    assert (await (await http.post("/nodes/dgx1-0/recover")).json()) == {"podsFailed": 0}
    assert (await http.post("/nodes/dgx1-0/gpus/5/recover")).status == 200
    node = await core.read_node("dgx1-0")
    assert node.metadata.annotations["gpuyard.io/unhealthy-gpus"] == "3"


def test_cli_rejects_a_bad_scenario(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodeGroups: []\n")
    result = CliRunner().invoke(main, ["fake-nodes", "--cluster", str(bad)])
    assert result.exit_code == 2 and "nodeGroups" in result.output


async def test_a_running_pod_seen_again_runs_only_what_is_left(cluster) -> None:  # type: ignore[no-untyped-def]
    """A pod found Running (fake-nodes restarted, a node back) counts its duration from startTime."""
    nodes, core = cluster
    await nodes.fail_node("dgx1-0")  # not played while its node is down
    started = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    await core.create_namespaced_pod(
        "ml", body=pod_body("resumed", "dgx1-0", **{"fake.gpuyard.io/duration": "1h"})
    )
    status = {"phase": "Running", "startTime": started.strftime("%Y-%m-%dT%H:%M:%SZ")}
    await core.patch_namespaced_pod_status("resumed", "ml", body={"status": status})
    key = ("ml", "resumed")
    assert await until(lambda: _true(key in nodes.pods and nodes.pods[key].status.phase == "Running"))
    await nodes.recover_node("dgx1-0")

    async def done() -> bool:
        status = (await core.read_namespaced_pod("resumed", "ml")).status
        return status is not None and status.phase == "Succeeded"

    assert await until(done, timeout=5.0)  # not another hour


def test_pods_without_a_duration_finish_after_the_default() -> None:
    demo = load_scenario(Path("configs/clusters/demo.yaml"))
    assert demo.kubelet.duration is None  # the demo's own pods run until annotated, crashed or deleted
    assert _with_duration(demo, None).kubelet.duration == DEFAULT_POD_DURATION
    assert _with_duration(demo, "5m").kubelet.duration == 300.0
    assert _with_duration(demo, "forever").kubelet.duration is None
    timed = demo.model_copy(update={"kubelet": demo.kubelet.model_copy(update={"duration": 7.0})})
    assert _with_duration(timed, None).kubelet.duration == 7.0  # the scenario's own duration wins


def test_cli_rejects_a_bad_pod_duration() -> None:
    result = CliRunner().invoke(main, ["fake-nodes", "--pod-duration", "soon"])
    assert result.exit_code == 2
    assert "--pod-duration" in result.output
