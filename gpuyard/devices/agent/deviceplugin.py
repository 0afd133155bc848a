"""Device-plugin mode: the kubelet device-plugin API `v1beta1` served by the agent (gRPC, unix sockets).

For clusters without DRA. One :class:`DevicePlugin` per resource (`gpuyard.io/gpu`: GPU UUIDs,
`gpuyard.io/rdma`: RDMA NIC names) listens on `<plugin dir>/gpuyard-gpu.sock` (`-rdma.sock`) and
registers with the kubelet's Registration service on `<plugin dir>/kubelet.sock`:

- `ListAndWatch` streams every device with its health from the agent's NodeTopology and pushes a new
  list whenever it changes (an XID makes the GPU Unhealthy here and in the NodeTopology at once);
- `GetPreferredAllocation` / `Allocate` answer with exactly the scheduler's devices for the pod
  being started, by the rule in :mod:`.allocating` (no guess; an unplaced pod gets a clear error);
- the kubelet deletes every socket in the plugin directory when it restarts and recreates its own:
  :meth:`DevicePlugin.watch` polls the directory and serves and registers again when `kubelet.sock`
  is new or the plugin's socket is gone.

The generated stubs live in `proto/` (see `proto/api.proto`); gRPC is imported only here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import structlog

from gpuyard.apis.devices import NodeTopology
from gpuyard.devices.agent.allocating import (
    RESOURCE_GPU,
    AllocationError,
    PendingPod,
    PodLookup,
    allocation_env,
    match_allocation,
    preferred_allocation,
)
from gpuyard.devices.agent.proto import api_pb2, api_pb2_grpc

__all__ = ["API_VERSION", "DEFAULT_PLUGIN_DIR", "KUBELET_SOCKET", "DevicePlugin", "devices_of"]

log = structlog.get_logger(__name__)

API_VERSION = "v1beta1"
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
KUBELET_SOCKET = "kubelet.sock"


def devices_of(topology: NodeTopology, resource: str) -> list[Any]:
    """`Device` messages (ID, health, NUMA node) for one resource of a topology."""
    out = []
    if resource == RESOURCE_GPU:
        items = [(g.uuid or str(g.index), g.health, g.numa_node) for g in topology.spec.gpus]
    else:
        items = [(n.name, n.health, n.numa_node) for n in topology.spec.nics if n.rdma]
    for ident, health, numa in items:
        topo = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=numa)]) if numa >= 0 else None
        out.append(api_pb2.Device(ID=ident, health=health, topology=topo))
    return out


def _socket_id(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, int(st.st_ctime_ns))


class _Servicer:
    """The DevicePlugin gRPC service (methods named as the proto's)."""

    def __init__(self, plugin: DevicePlugin) -> None:
        self.plugin = plugin

    async def _pods(self, context: Any) -> list[PendingPod]:
        """The pending pods; an unreachable pod source aborts the call (never an allocation by guess)."""
        plugin = self.plugin
        try:
            return await plugin.lookup.pending_pods(plugin.node)
        except Exception as exc:  # the lookup's transport error, whatever its client library
            log.warning("cannot list pending pods", node=plugin.node, error=str(exc))
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"cannot list pending pods of node {plugin.node}: {exc}"
            )
            raise  # abort() raises; this line is never reached

    async def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        plugin = self.plugin
        seen = [-1]  # the version last sent
        while True:
            async with plugin.changed:
                await plugin.changed.wait_for(lambda: plugin.version != seen[0])
                seen[0] = plugin.version
                devices = list(plugin.devices)
            yield api_pb2.ListAndWatchResponse(devices=devices)

    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        plugin = self.plugin
        pods = await self._pods(context)
        responses = []
        for req in request.container_requests:
            ids = preferred_allocation(
                pods,
                resource=plugin.resource,
                available=list(req.available_deviceIDs),
                must_include=list(req.must_include_deviceIDs),
                size=int(req.allocation_size),
            )
            responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(self, request: Any, context: Any) -> Any:
        plugin = self.plugin
        pods = await self._pods(context)
        responses = []
        for req in request.container_requests:
            ids = list(req.devices_ids)
            unhealthy = sorted(set(ids) & plugin.unhealthy)
            if unhealthy:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"devices {unhealthy} are unhealthy")
            try:
                pod = match_allocation(pods, node=plugin.node, resource=plugin.resource, ids=ids)
            except AllocationError as exc:
                log.warning("Allocate refused", node=plugin.node, resource=plugin.resource, error=str(exc))
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
                raise  # abort() raises; this line is never reached
            log.info("Allocate", node=plugin.node, resource=plugin.resource, pod=pod.key, devices=ids)
            responses.append(
                api_pb2.ContainerAllocateResponse(
                    envs=allocation_env(pod, resource=plugin.resource),
                    devices=plugin.device_specs(ids),
                )
            )
        return api_pb2.AllocateResponse(container_responses=responses)

    async def PreStartContainer(self, request: Any, context: Any) -> Any:
        return api_pb2.PreStartContainerResponse()


class DevicePlugin:
    """Serve one resource to the kubelet and keep it registered (module doc)."""

    def __init__(
        self,
        *,
        node: str,
        resource: str,
        lookup: PodLookup,
        plugin_dir: Path = DEFAULT_PLUGIN_DIR,
        sysfs_root: Path = Path("/sys"),
        poll_s: float = 1.0,
    ) -> None:
        self.node = node
        self.resource = resource
        self.lookup = lookup
        self.plugin_dir = Path(plugin_dir)
        self.sysfs_root = Path(sysfs_root)
        self.poll_s = poll_s
        self.endpoint = f"gpuyard-{resource.rsplit('/', 1)[-1]}.sock"
        self.devices: list[Any] = []
        self.unhealthy: set[str] = set()
        self.version = 0
        self.changed = asyncio.Condition()
        self.registrations = 0
        self._server: Any = None
        self._kubelet_id: tuple[int, int] | None = None
        self._notify_task: asyncio.Task[None] | None = None

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / self.endpoint

    def update(self, topology: NodeTopology) -> None:
        """New devices/health from the agent (called on the event loop); pushed to ListAndWatch."""
        self.devices = devices_of(topology, self.resource)
        self.unhealthy = {d.ID for d in self.devices if d.health != "Healthy"}
        self.version += 1

        async def notify() -> None:
            async with self.changed:
                self.changed.notify_all()

        task = asyncio.get_running_loop().create_task(notify())
        self._notify_task = task  # keep a reference until it runs

    def device_specs(self, ids: list[str]) -> list[Any]:
        """Host devices the container needs for RDMA NICs (`/dev/infiniband/uverbsN`, `rdma_cm`)."""
        if self.resource == RESOURCE_GPU:
            return []  # the NVIDIA container runtime adds the GPU device nodes from NVIDIA_VISIBLE_DEVICES
        specs = [
            api_pb2.DeviceSpec(
                container_path="/dev/infiniband/rdma_cm",
                host_path="/dev/infiniband/rdma_cm",
                permissions="rw",
            )
        ]
        for name in ids:
            verbs = self.sysfs_root / "class" / "infiniband" / name / "device" / "infiniband_verbs"
            with contextlib.suppress(OSError):
                for entry in sorted(os.listdir(verbs)):
                    dev = f"/dev/infiniband/{entry}"
                    specs.append(api_pb2.DeviceSpec(container_path=dev, host_path=dev, permissions="rw"))
        return specs

    async def serve(self) -> None:
        """Listen on the plugin socket (replacing a stale one)."""
        await self.stop()
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(_Servicer(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server

    async def register(self) -> None:
        """Register with the kubelet; grpc.aio.AioRpcError when it refuses or is not there."""
        kubelet = self.plugin_dir / KUBELET_SOCKET
        async with grpc.aio.insecure_channel(f"unix://{kubelet}") as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)
            await stub.Register(
                api_pb2.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.endpoint,
                    resource_name=self.resource,
                    options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
                ),
                timeout=10,
            )
        self._kubelet_id = _socket_id(kubelet)
        self.registrations += 1
        log.info("registered with the kubelet", resource=self.resource, endpoint=self.endpoint)

    async def watch(self) -> None:
        """Serve and stay registered until cancelled: re-serve and re-register when the kubelet
        restarts (its socket is new, or ours was removed); retry with backoff while it is away."""
        delay = self.poll_s
        failing = ""
        try:
            while True:
                kubelet = _socket_id(self.plugin_dir / KUBELET_SOCKET)
                ours = self.socket_path.exists()
                if kubelet is not None and (self._server is None or not ours or kubelet != self._kubelet_id):
                    try:
                        await self.serve()
                        await self.register()
                        failing, delay = "", self.poll_s
                    except grpc.aio.AioRpcError as exc:
                        msg = f"{exc.code().name}: {exc.details()}"
                        if msg != failing:
                            log.warning(
                                "kubelet registration failed; retrying", resource=self.resource, error=msg
                            )
                            failing = msg
                        self._kubelet_id = None
                        delay = min(delay * 2, 30.0)
                elif kubelet is None and failing != "absent":
                    log.warning(
                        "kubelet socket absent; waiting for the kubelet",
                        path=str(self.plugin_dir / KUBELET_SOCKET),
                    )
                    failing = "absent"
                await asyncio.sleep(delay)
        finally:
            await self.stop()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=0.5)
            self._server = None
