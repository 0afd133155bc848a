"""`gpuyard agent --kubeconfig`: the node's NodeTopology written straight to a Kubernetes API server."""

from __future__ import annotations

import asyncio

from click.testing import CliRunner

from gpuyard.cli import main
from gpuyard.devices import get_preset
from gpuyard.kubecluster.topologies import KubeTopologySink

ENV = {"GPUYARD_SERVER": "", "GPUYARD_TOKEN": "", "NODE_NAME": ""}


def stored(fake_apiserver, name: str):  # type: ignore[no-untyped-def]
    server = fake_apiserver.server
    return server.objects.get(server.catalog.get("gpuyard.io", "v1alpha1", "nodetopologies"), name)


async def test_the_agent_creates_then_replaces_its_node_topology(fake_apiserver) -> None:  # type: ignore[no-untyped-def]
    fake_apiserver.server.install_gpuyard_crds()
    args = [
        "agent",
        "--once",
        "--preset",
        "dgx-a100",
        "--node",
        "gpu-7",
        "--kubeconfig",
        str(fake_apiserver.kubeconfig),
    ]
    first = await asyncio.to_thread(CliRunner().invoke, main, args, env=ENV)
    assert first.exit_code == 0, first.output
    created = stored(fake_apiserver, "gpu-7")
    assert len(created["spec"]["gpus"]) == 8
    again = await asyncio.to_thread(CliRunner().invoke, main, args, env=ENV)  # the agent owns it: replaced
    assert again.exit_code == 0, again.output
    assert int(stored(fake_apiserver, "gpu-7")["metadata"]["resourceVersion"]) >= int(
        created["metadata"]["resourceVersion"]
    )


async def test_a_server_without_the_crd_is_a_sink_error(fake_apiserver) -> None:  # type: ignore[no-untyped-def]
    from gpuyard.devices.agent.running import SinkError

    sink = await KubeTopologySink.connect(kubeconfig=str(fake_apiserver.kubeconfig))
    topology = get_preset("dgx-a100").model_copy(deep=True)
    topology.metadata.name = "gpu-8"
    try:
        try:
            await sink.put(topology)  # no NodeTopology CRD on this server: 404 on the collection
        except SinkError as exc:
            assert "nodetopologies.gpuyard.io CRD is not installed" in str(exc)
        else:
            raise AssertionError("a server without the CRD accepted the NodeTopology")
    finally:
        await sink.aclose()
