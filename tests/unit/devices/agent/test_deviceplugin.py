"""Device-plugin mode against a fake kubelet that behaves as the kubelet's device manager: registration
and re-registration, ListAndWatch health after an injected XID, gangs of pods pending on one node each
getting exactly their annotated GPUs (env, device nodes, CDI names) whatever IDs the kubelet picks,
MPS share pods, and a refused pod gpuyard did not place."""

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
    ANNOTATION_BIND_TIME,
    RESOURCE_GPU,
    RESOURCE_GPU_SHARE,
    RESOURCE_RDMA,
    AllocationOptions,
    PendingPod,
    pending_pods_from,
)
from gpuyard.devices.agent.deviceplugin import DevicePlugin
from gpuyard.devices.agent.fakekubelet import AdmissionError, ContainerDevices, FakeKubelet
from gpuyard.devices.agent.fakenvml import FakeNVML
from gpuyard.devices.agent.inventory import Inventory
from gpuyard.devices.agent.running import Agent, AgentTimings, PrintSink
from tests.unit.devices.agent.test_health import running, until

NODE = "a100-0"


def pod_doc(  # type: ignore[no-untyped-def]
    name: str,
    gpus: list[int],
    uuids: list[str],
    nics: list[str],
    phase: str = "Pending",
    *,
    bind_time: int = 0,
    milli: int = 0,
    memory_mib: int = 0,
    created: str = "2025-01-01T00:00:00Z",
):
    devices: dict = {"gpus": gpus, "gpuIds": uuids, "nics": nics, "hostPorts": []}  # type: ignore[type-arg]
    if milli:
        devices["gpuMilli"] = milli
    if memory_mib:
        devices["gpuMemoryMiB"] = memory_mib
    annotations = {ANNOTATION_DEVICES: json.dumps(devices)}
    if bind_time:
        annotations[ANNOTATION_BIND_TIME] = str(bind_time)
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "annotations": annotations,
        },
        "spec": {"nodeName": NODE},
        "status": {"phase": phase},
    }


def gpus_seen(got: ContainerDevices, minors: dict[str, int]) -> tuple[str, list[str], list[str]]:
    """What the container was given: the env's UUIDs, the GPU device nodes, the CDI names."""
    nodes = sorted(c for c, _, _ in got.devices if c.removeprefix("/dev/nvidia").isdigit())
    return got.envs["NVIDIA_VISIBLE_DEVICES"], nodes, got.cdi_devices


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
async def stack(  # type: ignore[no-untyped-def]
    plugin_dir: Path,
    lookup: StaticLookup,
    resource: str = RESOURCE_GPU,
    options: AllocationOptions = AllocationOptions(),
):
    fake = FakeNVML.shaped("dgx-a100", node_name=NODE)
    # NVML does not see NICs: the RDMA plugin is served from the preset's (sysfs is tested in test_inventory)
    source = "nvml" if resource == RESOURCE_GPU else "preset"
    agent = Agent(
        Inventory(node=NODE, source=source, preset="dgx-a100", nvml=fake, sysfs_root=plugin_dir / "no-sys"),
        PrintSink(),
        timings=AgentTimings(health_interval_s=0.05, backoff_min_s=0.01),
    )
    plugin = DevicePlugin(
        node=NODE, resource=resource, lookup=lookup, plugin_dir=plugin_dir, poll_s=0.05, options=options
    )
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


@pytest.mark.parametrize("pick", ["preferred", "others"])
async def test_an_8x1_gang_and_a_2x4_job_each_get_exactly_their_gpus(plugin_dir: Path, pick: str) -> None:
    """Eight one-GPU pods of a gang pending on one DGX A100 at once, then two four-GPU pods: the kubelet
    admits them one by one (bind order) and, with pick="others", books other GPUs than preferred;
    every container still gets exactly the GPUs gpuyard chose, as env and as device nodes."""
    lookup = StaticLookup()
    async with stack(plugin_dir, lookup) as (_, agent, _plugin, kubelet):
        uuids = [g.uuid for g in agent.current.spec.gpus]
        minors = {g.uuid: g.minor for g in agent.current.spec.gpus}
        order = [3, 0, 7, 5, 1, 6, 2, 4]  # the scheduler's GPU for worker i; bound in worker order
        lookup.pods = [
            pod_doc(f"gang-worker-{i}", [g], [uuids[g]], [], bind_time=1000 + i) for i, g in enumerate(order)
        ][::-1]  # the lookup's order says nothing
        for i, g in enumerate(order):
            (got,) = await kubelet.admit(f"gang-worker-{i}", [{RESOURCE_GPU: 1}], pick=pick)  # type: ignore[arg-type]
            env, nodes, _ = gpus_seen(got[RESOURCE_GPU], minors)
            assert env == uuids[g]
            assert nodes == [f"/dev/nvidia{minors[uuids[g]]}"]
            assert got[RESOURCE_GPU].envs["GPUYARD_GPU_INDICES"] == str(g)
            assert {"/dev/nvidiactl", "/dev/nvidia-uvm"} <= {c for c, _, _ in got[RESOURCE_GPU].devices}
        if pick == "preferred":  # the kubelet's books follow gpuyard's choice
            assert [kubelet.allocated[f"gang-worker-{i}"][RESOURCE_GPU] for i in range(8)] == [
                [uuids[g]] for g in order
            ]
        with pytest.raises(AdmissionError):  # the node is full for the kubelet as for gpuyard
            await kubelet.admit("one-more", [{RESOURCE_GPU: 1}])

        for i in range(8):  # the gang finished
            kubelet.release(f"gang-worker-{i}")
        lookup.pods = [
            pod_doc("job2x4-worker-1", [0, 1, 2, 3], uuids[0:4], [], bind_time=2002),
            pod_doc("job2x4-worker-0", [4, 5, 6, 7], uuids[4:8], [], bind_time=2001),
            pod_doc("gang-worker-0", [3], [uuids[3]], [], phase="Succeeded"),
        ]
        (first,) = await kubelet.admit("job2x4-worker-0", [{RESOURCE_GPU: 4}], pick=pick)  # type: ignore[arg-type]
        (second,) = await kubelet.admit("job2x4-worker-1", [{RESOURCE_GPU: 4}], pick=pick)  # type: ignore[arg-type]
        assert first[RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids[4:8])
        assert second[RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids[0:4])
        assert gpus_seen(second[RESOURCE_GPU], minors)[1] == sorted(
            f"/dev/nvidia{minors[u]}" for u in uuids[0:4]
        )


async def test_a_mixed_node_a_retry_and_an_unplaced_pod(plugin_dir: Path) -> None:
    """4x1 of one gang and 1x4 of another job pending together: the count tells the jobs apart, the
    bind mark the gang's pods; a repeated Allocate gets the same pod; an unplaced pod is refused."""
    lookup = StaticLookup()
    async with stack(plugin_dir, lookup) as (_, agent, _plugin, kubelet):
        uuids = [g.uuid for g in agent.current.spec.gpus]
        lookup.pods = [
            pod_doc("big-worker-0", [0, 1, 2, 3], uuids[0:4], [], bind_time=5),
            *[pod_doc(f"small-worker-{i}", [4 + i], [uuids[4 + i]], [], bind_time=10 + i) for i in range(4)],
            pod_doc("done-worker-0", [0, 1], uuids[0:2], [], phase="Running"),
        ]
        # the kubelet prefers the next small worker's GPU, and Allocate gives it whatever IDs come
        assert await kubelet.preferred(RESOURCE_GPU, available=uuids, size=1) == [uuids[4]]
        got = await kubelet.allocate_container(RESOURCE_GPU, [uuids[0]])
        assert got.envs["NVIDIA_VISIBLE_DEVICES"] == uuids[4]
        again = await kubelet.allocate_container(RESOURCE_GPU, [uuids[0]])  # a retry: same pod
        assert again.envs["NVIDIA_VISIBLE_DEVICES"] == uuids[4]
        assert (await kubelet.allocate(RESOURCE_GPU, uuids[4:8]))["GPUYARD_GPU_INDICES"] == "0,1,2,3"
        for i in range(1, 4):
            env = await kubelet.allocate(RESOURCE_GPU, [uuids[i]])
            assert env["NVIDIA_VISIBLE_DEVICES"] == uuids[4 + i]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await kubelet.allocate(RESOURCE_GPU, [uuids[7]])  # every placed pod was served
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "no pending gpuyard pod on node a100-0 waits for 1 gpuyard.io/gpu" in refused.value.details()
        # a pod the kubelet already admitted (its status written) is not a candidate, after a restart too
        lookup.pods = [
            {
                **pod_doc("seen-worker-0", [2], [uuids[2]], [], bind_time=1),
                "status": {
                    "phase": "Pending",
                    "containerStatuses": [{"name": "c", "state": {"waiting": {}}}],
                },
            },
            pod_doc("new-worker-0", [6], [uuids[6]], [], bind_time=2),
        ]
        assert (await kubelet.allocate(RESOURCE_GPU, [uuids[2]]))["NVIDIA_VISIBLE_DEVICES"] == uuids[6]


async def test_cdi_names_instead_of_device_nodes(plugin_dir: Path) -> None:
    lookup = StaticLookup()
    async with stack(plugin_dir, lookup, options=AllocationOptions(cdi=True)) as (_, agent, _p, kubelet):
        uuids = [g.uuid for g in agent.current.spec.gpus]
        lookup.pods = [pod_doc("w-0", [6, 2], [uuids[6], uuids[2]], [])]
        (got,) = await kubelet.admit("w-0", [{RESOURCE_GPU: 2}], pick="others")
        assert got[RESOURCE_GPU].cdi_devices == [f"nvidia.com/gpu={uuids[2]}", f"nvidia.com/gpu={uuids[6]}"]
        assert got[RESOURCE_GPU].devices == []
        assert got[RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == f"{uuids[2]},{uuids[6]}"


async def test_share_pods_get_their_gpu_and_mps_limits(plugin_dir: Path) -> None:
    """Two share pods on one GPU: each asks gpuyard.io/gpu-share for one slot and gets that GPU with
    its MPS thread percentage, pinned memory limit and the node's MPS pipe directory mounted."""
    lookup = StaticLookup()
    options = AllocationOptions(mps_pipe_directory="/run/nvidia/mps")
    async with stack(plugin_dir, lookup, RESOURCE_GPU_SHARE, options) as (_, agent, _p, kubelet):
        uuids = [g.uuid for g in agent.current.spec.gpus]
        memory = agent.current.spec.gpus[5].memory_mib
        assert len(kubelet.devices[RESOURCE_GPU_SHARE]) == 8 * 16  # 16 slots per GPU by default
        lookup.pods = [
            pod_doc("share-a", [5], [uuids[5]], [], milli=300, memory_mib=8192, bind_time=1),
            pod_doc("share-b", [5], [uuids[5]], [], milli=500, bind_time=2),
            pod_doc("whole", [0], [uuids[0]], [], bind_time=0),  # a whole GPU: not a share
        ]
        (a,) = await kubelet.admit("share-a", [{RESOURCE_GPU_SHARE: 1}], pick="others")
        (b,) = await kubelet.admit("share-b", [{RESOURCE_GPU_SHARE: 1}])
        for got, percent, limit in ((a, "30", "0=8192M"), (b, "50", f"0={memory // 2}M")):
            share = got[RESOURCE_GPU_SHARE]
            assert share.envs["NVIDIA_VISIBLE_DEVICES"] == uuids[5]
            assert share.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == percent
            assert share.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == limit
            assert share.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia/mps"
            assert share.mounts == [("/run/nvidia/mps", "/run/nvidia/mps", False)]
        assert kubelet.preferences[-1][0].startswith(uuids[5] + "::")  # the preference is a slot of GPU 5


def test_pending_pods_read_order_marks_and_shares() -> None:
    pods = pending_pods_from(
        [
            pod_doc("a", [1], ["u1"], [], bind_time=7, milli=250, memory_mib=4096),
            pod_doc("b", [2], ["u2"], [], phase="Running"),
            {"metadata": {"name": "c", "annotations": {ANNOTATION_DEVICES: "not json"}}},
        ]
    )
    assert [(p.name, p.bind_time, p.gpu_milli, p.gpu_memory_mib, p.shared) for p in pods] == [
        ("a", 7, 250, 4096, True)
    ]
    assert pods[0].ids(RESOURCE_GPU) == () and pods[0].ids(RESOURCE_GPU_SHARE) == ("u1",)


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
