"""`gpuyard fake-nodes` against an API server (the `fake_apiserver` fixture): nodes, kubelets, their
admission of pods (checked against the kubelet's `pkg/kubelet/lifecycle/predicate.go`), faults."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
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
from gpuyard.kubecluster.fakenodes.admission import Rejection, admit, rejected_status
from gpuyard.kubecluster.fakenodes.objects import (
    node_lease,
    node_objects,
    running_status,
    terminated_status,
    topology_objects,
)
from tests.builders import make_pod

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


def gpu_pod_body(name: str, node: str, gpus: int, **annotations: str) -> dict[str, Any]:
    """A pod asking for 1 cpu, 1 GiB and `gpus` GPUs."""
    body = pod_body(name, node, **annotations)
    requests = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(gpus)}
    body["spec"]["containers"][0]["resources"] = {"requests": requests, "limits": requests}
    return body


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
    # with the kubelet port (pod logs): its address and port
    for node in node_objects(SCENARIO, now=NOW) + node_objects(
        SCENARIO, now=NOW, kubelet=("127.0.0.1", 10250)
    ):
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


# --- admission -----------------------------------------------------------------------------------

DGX = SCENARIO.nodes()[0].status.allocatable  # dgx1-0: 80 cpu, 512 GiB, 8 GPUs, 4 HCAs, 110 pods


def test_admission_counts_the_pods_admitted_before() -> None:
    running = [make_pod("a", node="dgx1-0", gpus=6, cpu="40"), make_pod("b", node="dgx1-0", cpu="30")]
    assert admit(make_pod("c", gpus=2, cpu="10"), allocatable=DGX, admitted=running) is None
    assert admit(make_pod("d", gpus=3, cpu="1"), allocatable=DGX, admitted=running) == Rejection(
        reason="OutOfnvidia.com/gpu",
        message="Node didn't have enough resource: nvidia.com/gpu, requested: 3, used: 6, capacity: 8",
    )
    assert admit(make_pod("e", gpus=3, cpu="1"), allocatable=DGX, admitted=[]) is None


def test_admission_reports_the_first_misfit_in_the_kubelets_order() -> None:
    full = [make_pod("a", node="dgx1-0", gpus=8, cpu="79500m", memory="500Gi")]
    # cpu comes before memory, memory before extended resources; cpu in millicores, memory in bytes
    both = admit(make_pod("b", gpus=1, cpu="1", memory="100Gi"), allocatable=DGX, admitted=full)
    assert both == Rejection(
        reason="OutOfcpu",
        message="Node didn't have enough resource: cpu, requested: 1000, used: 79500, capacity: 80000",
    )
    memory = admit(make_pod("c", gpus=1, cpu="100m", memory="100Gi"), allocatable=DGX, admitted=full)
    assert memory is not None and memory.reason == "OutOfmemory"
    assert memory.message.endswith(f"requested: {100 * 2**30}, used: {500 * 2**30}, capacity: {512 * 2**30}")
    gpu = admit(make_pod("d", gpus=1, cpu="100m", memory="1Gi"), allocatable=DGX, admitted=full)
    assert gpu is not None and gpu.reason == "OutOfnvidia.com/gpu"
    status = rejected_status(gpu)
    assert status["phase"] == "Failed" and status["reason"] == "OutOfnvidia.com/gpu"
    assert status["message"] == f"Pod was rejected: {gpu.message}"


def test_admission_counts_pods_and_skips_extended_resources_the_node_lacks() -> None:
    small = {"cpu": Decimal("8"), "memory": Decimal(2**34), "pods": Decimal("2")}
    two = [make_pod("a", node="n", cpu="1"), make_pod("b", node="n", cpu="1")]
    assert admit(make_pod("c", cpu="0"), allocatable=small, admitted=two) == Rejection(
        reason="OutOfpods",
        message="Node didn't have enough resource: pods, requested: 1, used: 2, capacity: 2",
    )
    # the node advertises no GPU resource: the kubelet drops the request (DRA, cluster-level resources)
    assert admit(make_pod("d", gpus=4), allocatable=small, admitted=two[:1]) is None
    # an advertised one at zero, or a native resource the node lacks, does not fit
    zero = {**small, "gpuyard.io/gpu": Decimal(0)}
    share = make_pod("e", cpu="1")
    share.spec.containers[0].resources.limits["gpuyard.io/gpu"] = Decimal(1)
    rejected = admit(share, allocatable=zero, admitted=[])
    assert rejected is not None and rejected.reason == "OutOfgpuyard.io/gpu"
    huge = make_pod("f", cpu="1")
    huge.spec.containers[0].resources.limits["hugepages-2Mi"] = Decimal(2**21)
    rejected = admit(huge, allocatable=small, admitted=[])
    assert rejected is not None and rejected.reason == "OutOfhugepages-2Mi"


def test_admission_takes_the_larger_of_the_containers_and_each_init_container() -> None:
    pod = make_pod("a", gpus=2, cpu="10")
    init = pod.spec.containers[0].model_copy(deep=True)
    init.name = "fetch"
    init.resources.limits["cpu"] = Decimal(75)
    pod.spec.init_containers = [init]
    beside = [make_pod("b", node="dgx1-0", cpu="10")]
    rejected = admit(pod, allocatable=DGX, admitted=beside)
    assert rejected is not None and rejected.reason == "OutOfcpu" and "requested: 75000" in rejected.message


async def test_a_pod_the_node_cannot_fit_fails_out_of_the_resource(
    cluster: tuple[FakeNodes, Any],
) -> None:
    """Two schedulers binding onto one node: the kubelet fails the pod that does not fit, at once."""
    nodes, core = cluster
    forever = {"fake.gpuyard.io/start-delay": "0", "fake.gpuyard.io/duration": "inf"}
    await core.create_namespaced_pod("ml", body=gpu_pod_body("big", "dgx1-0", 6, **forever))
    await core.create_namespaced_pod("ml", body=gpu_pod_body("more", "dgx1-0", 3, **forever))
    await core.create_namespaced_pod("ml", body=gpu_pod_body("fits", "dgx1-0", 2, **forever))
    await core.create_namespaced_pod("ml", body=gpu_pod_body("other", "dgx1-1", 8, **forever))

    async def status(name: str) -> Any:
        return (await core.read_namespaced_pod(name, "ml")).status

    async def phases() -> dict[str, str]:
        return {n: str((await status(n)).phase) for n in ("big", "more", "fits", "other")}

    settled = {"big": "Running", "more": "Failed", "fits": "Running", "other": "Running"}
    assert await until(lambda: _is(phases(), settled)), await phases()
    more = await status("more")
    assert more.reason == "OutOfnvidia.com/gpu"
    assert more.message == (
        "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, requested: 3, used: 6, capacity: 8"
    )
    assert more.start_time is None and not more.container_statuses  # it never ran
    # once `big` is gone, its GPUs are free again: a pod of 6 fits beside `fits`
    await core.delete_namespaced_pod("big", "ml")
    assert await until(lambda: _true(("ml", "big") not in nodes.pods))
    await core.create_namespaced_pod("ml", body=gpu_pod_body("later", "dgx1-0", 6, **forever))
    assert await until(lambda: _is(_phase(status("later")), "Running"))
    assert nodes.rejected == 1


async def test_pods_deleted_while_the_watch_was_down_free_their_node(
    cluster: tuple[FakeNodes, Any],
) -> None:
    """A new watch starts from a LIST: pods deleted in the gap are forgotten, not counted forever."""
    nodes, core = cluster
    forever = {"fake.gpuyard.io/start-delay": "0", "fake.gpuyard.io/duration": "inf"}
    await core.create_namespaced_pod("ml", body=gpu_pod_body("old", "dgx1-1", 8, **forever))
    assert await until(lambda: _true(("ml", "old") in nodes.admitted))
    nodes._seen("ADDED", Pod.model_validate(gpu_pod_body("ghost", "dgx1-1", 8)))  # never existed
    assert ("ml", "ghost") not in nodes.admitted  # rejected: the node is full
    await core.delete_namespaced_pod("old", "ml")
    assert await until(lambda: _true(("ml", "old") not in nodes.pods))
    await nodes._relist()
    assert ("ml", "ghost") not in nodes.pods
    await core.create_namespaced_pod("ml", body=gpu_pod_body("new", "dgx1-1", 8, **forever))

    async def new_phase() -> str:
        return str((await core.read_namespaced_pod("new", "ml")).status.phase)

    assert await until(lambda: _is(new_phase(), "Running"))


async def _phase(status: Any) -> str:
    return str((await status).phase)
