"""Device-plugin mode against a fake kubelet: registration and re-registration, ListAndWatch health
after an injected XID, Allocate with exactly the annotated devices, and a refused unplaced pod."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from gpuyard.apis.scheduling import ANNOTATION_DEVICES
from gpuyard.devices.agent.allocating import (
    RESOURCE_GPU,
    RESOURCE_RDMA,
    PendingPod,
    pending_pods_from,
)
from gpuyard.devices.agent.deviceplugin import DevicePlugin
from gpuyard.devices.agent.fakekubelet import FakeKubelet
from gpuyard.devices.agent.fakenvml import FakeNVML
from gpuyard.devices.agent.inventory import Inventory
from gpuyard.devices.agent.running import Agent, AgentTimings, PrintSink
from tests.unit.devices.agent.test_health import running, until

NODE = "a100-0"


def pod_doc(name: str, gpus: list[int], uuids: list[str], nics: list[str], phase: str = "Pending") -> dict:  # type: ignore[type-arg]
    devices = {"gpus": gpus, "gpuIds": uuids, "nics": nics, "hostPorts": []}
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": {ANNOTATION_DEVICES: json.dumps(devices)},
        },
        "spec": {"nodeName": NODE},
        "status": {"phase": phase},
    }


class StaticLookup:
    def __init__(self) -> None:
        self.pods: list[dict] = []  # type: ignore[type-arg]
        self.asked: list[str] = []

    async def pending_pods(self, node: str) -> list[PendingPod]:
        self.asked.append(node)
        return pending_pods_from(self.pods)


@pytest.fixture
def plugin_dir() -> AsyncIterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dp"))  # unix socket paths are limited to 107 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def stack(plugin_dir: Path, lookup: StaticLookup, resource: str = RESOURCE_GPU):  # type: ignore[no-untyped-def]
    fake = FakeNVML.shaped("dgx-a100", node_name=NODE)
    # NVML does not see NICs: the RDMA plugin is served from the preset's (sysfs is tested in test_inventory)
    source = "nvml" if resource == RESOURCE_GPU else "preset"
    agent = Agent(
        Inventory(node=NODE, source=source, preset="dgx-a100", nvml=fake, sysfs_root=plugin_dir / "no-sys"),
        PrintSink(),
        timings=AgentTimings(health_interval_s=0.05, backoff_min_s=0.01),
    )
    plugin = DevicePlugin(node=NODE, resource=resource, lookup=lookup, plugin_dir=plugin_dir, poll_s=0.05)
    agent.listeners.append(plugin.update)
    kubelet = FakeKubelet(plugin_dir)
    await kubelet.start()
    async with running(agent):
        await until(lambda: agent.current is not None)
        watch = asyncio.create_task(plugin.watch())
        try:
            await until(lambda: bool(kubelet.devices.get(resource)), timeout=5)
            yield fake, agent, plugin, kubelet
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            await kubelet.stop()


async def test_registration_devices_and_health_after_an_xid(plugin_dir: Path) -> None:
    async with stack(plugin_dir, StaticLookup()) as (fake, agent, _plugin, kubelet):
        assert kubelet.registered == [(RESOURCE_GPU, "gpuyard-gpu.sock")]
        uuids = [g.uuid for g in agent.current.spec.gpus]
        assert kubelet.devices[RESOURCE_GPU] == [(u, "Healthy") for u in uuids]
        fake.inject_xid(5, 79)
        await until(lambda: dict(kubelet.devices[RESOURCE_GPU])[uuids[5]] == "Unhealthy", timeout=3)
        assert [h for _, h in kubelet.devices[RESOURCE_GPU]].count("Unhealthy") == 1


async def test_allocate_returns_the_scheduled_gpus_and_refuses_an_unplaced_pod(plugin_dir: Path) -> None:
    lookup = StaticLookup()
    async with stack(plugin_dir, lookup) as (_, agent, _plugin, kubelet):
        uuids = [g.uuid for g in agent.current.spec.gpus]
        lookup.pods = [
            pod_doc("ddp-worker-0", [4, 5, 6, 7], uuids[4:8], ["mlx5_4", "mlx5_6"]),
            pod_doc("done-worker-0", [0, 1], uuids[0:2], [], phase="Running"),
        ]
        preferred = await kubelet.preferred(RESOURCE_GPU, available=uuids[2:], size=4)
        assert preferred == uuids[4:8]
        env = await kubelet.allocate(RESOURCE_GPU, preferred)
        assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids[4:8])
        assert env["GPUYARD_GPU_INDICES"] == "4,5,6,7"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await kubelet.allocate(RESOURCE_GPU, uuids[0:4])  # no pending pod was given these GPUs
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "no pending gpuyard pod on node a100-0" in refused.value.details()
        assert "default/ddp-worker-0" in refused.value.details()
        # two pending pods of the same size: no preference (never a guess), Allocate still exact
        lookup.pods.append(pod_doc("other-worker-0", [0, 1, 2, 3], uuids[0:4], []))
        assert await kubelet.preferred(RESOURCE_GPU, available=uuids, size=4) == []
        assert (await kubelet.allocate(RESOURCE_GPU, uuids[0:4]))["GPUYARD_GPU_INDICES"] == "0,1,2,3"


async def test_rdma_resource_streams_nics_and_allocates_them(plugin_dir: Path) -> None:
    lookup = StaticLookup()
    async with stack(plugin_dir, lookup, RESOURCE_RDMA) as (_, agent, _plugin, kubelet):
        names = [n.name for n in agent.current.spec.nics if n.rdma]
        assert [i for i, _ in kubelet.devices[RESOURCE_RDMA]] == names
        lookup.pods = [pod_doc("ddp-worker-0", [4, 5], ["u4", "u5"], names[2:4])]
        env = await kubelet.allocate(RESOURCE_RDMA, names[2:4])
        assert env["NCCL_IB_HCA"] == "=" + ",".join(names[2:4])


async def test_reregisters_when_the_kubelet_restarts(plugin_dir: Path) -> None:
    async with stack(plugin_dir, StaticLookup()) as (_, _agent, plugin, kubelet):
        assert plugin.registrations == 1
        await kubelet.restart()  # sockets deleted, kubelet.sock created anew
        kubelet.devices.clear()
        await until(lambda: plugin.registrations == 2 and bool(kubelet.devices.get(RESOURCE_GPU)), timeout=5)
        assert kubelet.registered == [(RESOURCE_GPU, "gpuyard-gpu.sock")] * 2
        assert (plugin_dir / "gpuyard-gpu.sock").exists()
