"""Pod logs on Kubernetes: `gpuyard fake-nodes`' kubelet port, the API server's `pods/log` in front
of it, and gpuyard's log route and `gpuyard logs` on the Kubernetes backend.

Each test runs against the development API server and, where the control-plane binaries are
cached, the real kube-apiserver (`served`): the API server finds the pod's node, dials the kubelet
port the Node names (its InternalIP and `status.daemonEndpoints.kubeletEndpoint.Port`) over HTTPS
and streams what it answers. Waits are on state (a pod's phase, a stream's end), never on time.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from gpuyard.cli import main
from gpuyard.devices.scenarios import load_scenario
from gpuyard.kubecluster.fakenodes import FakeNodes, KubeletEndpoint, connect
from gpuyard.kubecluster.fakenodes.objects import node_objects
from gpuyard.kubecluster.podlogs import open_pod_log
from gpuyard.testing.apiserver.fixture import RunningApiServer
from tests.integration.serving import clean_cli_env
from tests.kubernetes.conftest_backend import FakeApiServerView, served
from tests.kubernetes.test_backend_platform import platform, settings

__all__ = ["served"]

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = load_scenario(ROOT / "configs" / "clusters" / "small.yaml")
NODE = "node-0"  # one of the small scenario's nodes


@asynccontextmanager
async def fake_nodes(kubeconfig: Path) -> AsyncIterator[FakeNodes]:
    """fake-nodes of the small scenario with their kubelet port on a free loopback port."""
    api = await connect(str(kubeconfig))
    async with api:
        nodes = FakeNodes(api, scenario=SCENARIO, heartbeat=0.5, kubelet=KubeletEndpoint("127.0.0.1", 0))
        task = asyncio.create_task(nodes.run())
        try:
            await asyncio.wait_for(nodes.registered.wait(), 20)
            yield nodes
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def pod_body(name: str, node: str = NODE, **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "trainer",
                    "image": "example/trainer:1",
                    "env": [{"name": "RANK", "value": "0"}, {"name": "WORLD_SIZE", "value": "1"}],
                }
            ],
        },
    }


async def until(check: Callable[[], Any], *, what: str, timeout: float = 30.0) -> Any:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not (value := await check()):
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
    return value


async def phase(core: client.CoreV1Api, name: str) -> str:
    return str((await core.read_namespaced_pod(name, "default")).status.phase)


async def test_the_api_server_reads_a_log_from_the_fake_kubelet_port(served: FakeApiServerView) -> None:
    async with fake_nodes(served.kubeconfig) as nodes:
        node = served.get("nodes", "", NODE)
        assert node is not None
        port = nodes.kubelet_server.port if nodes.kubelet_server else 0
        assert port and node["status"]["addresses"] == [{"type": "InternalIP", "address": "127.0.0.1"}]
        assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == port
        core = client.CoreV1Api(nodes.api)
        await core.create_namespaced_pod(
            "default", body=pod_body("waiting", **{"fake.gpuyard.io/start-delay": "1h"})
        )
        await core.create_namespaced_pod(
            "default",
            body=pod_body("short", **{"fake.gpuyard.io/duration": "4s", "fake.gpuyard.io/exit-code": "3"}),
        )

        with pytest.raises(ApiException) as waiting:
            await core.read_namespaced_pod_log("waiting", "default")
        assert waiting.value.status == 400 and "waiting to start" in str(waiting.value.body)

        await until(lambda: _is_not_pending(core, "short"), what="short running")
        text = await core.read_namespaced_pod_log("short", "default", container="trainer")
        started, env = text.splitlines()[:2]
        assert "started container trainer image example/trainer:1 on node node-0" in started
        assert "env: RANK=0 WORLD_SIZE=1" in env
        last = await core.read_namespaced_pod_log("short", "default", tail_lines=1)
        assert last.splitlines() == [text.splitlines()[-1]]
        with pytest.raises(ApiException) as wrong:
            await core.read_namespaced_pod_log("short", "default", container="sidecar")
        assert wrong.value.status == 400 and "not valid for pod short" in str(wrong.value.body)

        # follow: the answer stays open until the container has exited, then ends
        lines = await asyncio.wait_for(_collect(nodes, "short", follow=True), 30)
        assert lines[:2] == [started, env] and "exited with code 3 (Error)" in lines[-1]
        assert await phase(core, "short") == "Failed"
    assert ("GET", "/pods/default/short/log") in served.requests


async def _is_not_pending(core: client.CoreV1Api, name: str) -> bool:
    return await phase(core, name) != "Pending"


async def _collect(nodes: FakeNodes, name: str, *, follow: bool) -> list[str]:
    lines = await open_pod_log(nodes.api, "default", name, container="trainer", follow=follow)
    return [line async for line in lines]


async def test_gpuyard_reads_logs_on_the_kubernetes_backend(
    served: FakeApiServerView, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TFJob's pods, run by fake-nodes: gpuyard's log route answers from the cluster,
    `gpuyard logs job/NAME --role --index` prints one pod's, `-f` follows it to its end."""
    clean_cli_env(monkeypatch, tmp_path)
    async with fake_nodes(served.kubeconfig) as nodes:
        custom = client.CustomObjectsApi(nodes.api)
        core = client.CoreV1Api(nodes.api)
        async with platform(settings(served.kubeconfig, election=False), serve_http=True) as p:
            await asyncio.wait_for(p.serving.wait(), 10)
            await custom.create_namespaced_custom_object(
                "kubeflow.org", "v1", "default", "tfjobs", tfjob_logged("mnist", workers=2)
            )
            worker = "mnist-worker-1"
            await until(lambda: _is_not_pending_named(core, worker), what=f"{worker} running", timeout=60)
            async with aiohttp.ClientSession() as http:
                url = f"{p.url}/api/v1/namespaces/default/pods/{worker}/log"
                async with http.get(url) as resp:
                    body = await resp.json()
                    assert resp.status == 200, body
            assert body["container"] == "tensorflow" and body["phase"] in ("Running", "Succeeded")
            assert "started container tensorflow" in body["lines"][0]
            assert "TF_CONFIG task=worker:1 cluster=worker:2" in body["lines"][1]

            cli = CliRunner()
            args = ["--server", p.url]
            shown = await asyncio.to_thread(
                cli.invoke, main, ["logs", "job/default/mnist", "--role", "worker", "--index", "1", *args]
            )
            assert shown.exit_code == 0, shown.output
            assert printed(shown.output)[:2] == body["lines"][:2]

            followed = await asyncio.wait_for(
                asyncio.to_thread(cli.invoke, main, ["logs", "job/mnist", "-n", "default", "-f", *args]), 60
            )
            assert followed.exit_code == 0, followed.output
            lines = printed(followed.output)
            assert (
                "started container tensorflow" in lines[0] and "exited with code 0 (Completed)" in lines[-1]
            )
    assert ("GET", f"/pods/default/{worker}/log") in served.requests


async def _is_not_pending_named(core: client.CoreV1Api, name: str) -> bool:
    try:
        return await phase(core, name) != "Pending"
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


def printed(output: str) -> list[str]:
    """The log lines of a CLI run's output (the platform's own log lines, printed from the same
    process while the CLI ran, are left out)."""
    return [line for line in output.splitlines() if not re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[", line)]


def tfjob_logged(name: str, *, workers: int) -> dict[str, Any]:
    """A TFJob whose workers (one GPU each) run 5 s on fake-nodes."""
    container = {"name": "tensorflow", "image": "tf:1", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    template = {
        "metadata": {"annotations": {"fake.gpuyard.io/duration": "5s"}},
        "spec": {"containers": [container]},
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "tfReplicaSpecs": {
                "Worker": {"replicas": workers, "restartPolicy": "Never", "template": template}
            }
        },
    }


async def test_the_development_api_server_words_log_errors_as_kube_apiserver(
    fake_apiserver: RunningApiServer,
) -> None:
    """No kubelet address, no kubelet listening, several containers and none named."""
    api = await connect(str(fake_apiserver.kubeconfig))
    async with api:
        core = client.CoreV1Api(api)
        (listed,) = node_objects(SCENARIO, now=_now())[:1]
        bare = {**listed, "status": {**listed["status"], "addresses": []}}
        await core.create_node(body=bare)
        closed = {**listed, "metadata": {**listed["metadata"], "name": "closed"}}
        closed["status"] = {
            **listed["status"],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": _closed_port()}},
        }
        await core.create_node(body=closed)
        for name, node in (("on-bare", bare["metadata"]["name"]), ("on-closed", "closed")):
            await core.create_namespaced_pod("default", body=pod_body(name, node))
        two = pod_body("two")
        two["spec"]["containers"].append({"name": "sidecar", "image": "x"})
        await core.create_namespaced_pod("default", body=two)
        for pod, status, says in (
            ("on-bare", 500, "no preferred addresses found"),
            ("on-closed", 500, "dial tcp 127.0.0.1"),
            ("two", 400, "choose one of: [trainer sidecar]"),
            ("nope", 404, 'pods \\"nope\\" not found'),
        ):
            with pytest.raises(ApiException) as refused:
                await core.read_namespaced_pod_log(pod, "default")
            assert refused.value.status == status and says in str(refused.value.body), refused.value.body


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_the_kubelet_port_answers_as_a_kubelet(fake_apiserver: RunningApiServer) -> None:
    """Straight to the kubelet port (HTTPS, self-signed): 404 for a pod not on these nodes or a
    container it lacks, 400 before the container runs, the log (its last N lines) once it does."""
    async with fake_nodes(fake_apiserver.kubeconfig) as nodes:
        core = client.CoreV1Api(nodes.api)
        await core.create_namespaced_pod(
            "default", body=pod_body("waiting", **{"fake.gpuyard.io/start-delay": "1h"})
        )
        await core.create_namespaced_pod(
            "default", body=pod_body("running", **{"fake.gpuyard.io/duration": "inf"})
        )
        await until(lambda: _is_not_pending(core, "running"), what="running")
        await until(lambda: _true(nodes.played_pod("default", "waiting") is not None), what="waiting seen")
        port = nodes.kubelet_server.port if nodes.kubelet_server else 0
        base = f"https://127.0.0.1:{port}/containerLogs/default"
        async with aiohttp.ClientSession() as http:

            async def get(path: str) -> tuple[int, str]:
                async with http.get(f"{base}/{path}", ssl=False) as resp:
                    return resp.status, await resp.text()

            assert (await get("nope/trainer"))[0] == 404
            assert (await get("running/sidecar"))[0] == 404
            status, text = await get("waiting/trainer")
            assert status == 400 and 'container "trainer" in pod "waiting" is waiting to start' in text
            status, text = await get("running/trainer")
            assert status == 200 and len(text.splitlines()) == 2 and "started container trainer" in text
            assert await get("running/trainer?tailLines=1") == (200, text.splitlines()[1] + "\n")


async def _true(value: bool) -> bool:
    return value


async def test_a_taken_kubelet_port_is_survived_and_old_addresses_are_replaced(
    fake_apiserver: RunningApiServer,
) -> None:
    """fake-nodes whose kubelet port cannot be bound register their nodes without one (a warning,
    no address anyone would dial); a later run that serves it replaces the nodes' addresses (a
    strategic merge would keep the old Hostname, which kube-apiserver dials first)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        api = await connect(str(fake_apiserver.kubeconfig))
        async with api:
            port = taken.getsockname()[1]
            nodes = FakeNodes(api, scenario=SCENARIO, kubelet=KubeletEndpoint("127.0.0.1", port))
            assert not await nodes.serve_kubelet() and nodes.kubelet_location() is None
            await nodes.register()
            node = await client.CoreV1Api(api).read_node(NODE)
            assert {a.type for a in node.status.addresses} == {"InternalIP", "Hostname"}
    async with fake_nodes(fake_apiserver.kubeconfig) as served_nodes:
        node = await client.CoreV1Api(served_nodes.api).read_node(NODE)
        assert [(a.type, a.address) for a in node.status.addresses] == [("InternalIP", "127.0.0.1")]
        assert node.status.daemon_endpoints.kubelet_endpoint.port == served_nodes.kubelet_location()[1]  # type: ignore[index]
