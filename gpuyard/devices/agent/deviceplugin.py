"""Device-plugin mode: the kubelet device-plugin API `v1beta1` served by the agent (gRPC, unix sockets).

For clusters without DRA. One :class:`DevicePlugin` per resource (`gpuyard.io/gpu`: GPU UUIDs,
`gpuyard.io/rdma`: RDMA NIC names, `gpuyard.io/gpu-share`: `share_slots` slots per GPU for MPS share
pods) listens on `<plugin dir>/gpuyard-<name>.sock` and registers with the kubelet's Registration
service on `<plugin dir>/kubelet.sock`:

- `ListAndWatch` streams every device with its health from the agent's NodeTopology and pushes a new
  list whenever it changes (an XID makes the GPU Unhealthy here and in the NodeTopology at once);
- `GetPreferredAllocation` / `Allocate` answer for the pod the kubelet is admitting, by the rule in
  :mod:`.allocating`: the pending pod gpuyard bound first that this plugin has not served, with the
  requested count; `Allocate` returns exactly that pod's GPUs as env (`NVIDIA_VISIBLE_DEVICES`),
  device nodes (`/dev/nvidia<minor>`, `/dev/nvidiactl`, `/dev/nvidia-uvm`...) or CDI names
  (`nvidia.com/gpu=<uuid>`), and for a share the MPS limits and the MPS pipe directory mount;
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
    RESOURCE_GPU_SHARE,
    RESOURCE_RDMA,
    SHARE_SLOT_SEPARATOR,
    AllocationError,
    AllocationOptions,
    GpuInfo,
    PendingPod,
    PodLookup,
    allocation_for,
    allocation_for_pod,
    preferred_allocation,
)
from gpuyard.devices.agent.proto import api_pb2, api_pb2_grpc

__all__ = [
    "API_VERSION",
    "DEFAULT_PLUGIN_DIR",
    "DEFAULT_SHARE_SLOTS",
    "KUBELET_SOCKET",
    "DevicePlugin",
    "devices_of",
]

log = structlog.get_logger(__name__)

API_VERSION = "v1beta1"
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_SHARE_SLOTS = 16  # share pods per GPU the kubelet can admit (MPS allows up to 48 clients)


def devices_of(topology: NodeTopology, resource: str, *, share_slots: int = DEFAULT_SHARE_SLOTS) -> list[Any]:
    """`Device` messages (ID, health, NUMA node) for one resource of a topology."""
    out = []
    if resource == RESOURCE_GPU:
        items = [(g.uuid or str(g.index), g.health, g.numa_node) for g in topology.spec.gpus]
    elif resource == RESOURCE_GPU_SHARE:
        items = [
            (f"{g.uuid or g.index}{SHARE_SLOT_SEPARATOR}{slot}", g.health, g.numa_node)
            for g in topology.spec.gpus
            for slot in range(share_slots)
        ]
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
                served=plugin.served_for(pods),
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
                pod = allocation_for(
                    pods, node=plugin.node, resource=plugin.resource, ids=ids, served=plugin.served_for(pods)
                )
            except AllocationError as exc:
                log.warning("Allocate refused", node=plugin.node, resource=plugin.resource, error=str(exc))
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
                raise  # abort() raises; this line is never reached
            plugin.served[pod.ident] = frozenset(ids)
            log.info(
                "Allocate",
                node=plugin.node,
                resource=plugin.resource,
                pod=pod.key,
                devices=list(pod.ids(plugin.resource)),
                kubelet_ids=ids,
            )
            responses.append(plugin.response(pod))
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
        options: AllocationOptions = AllocationOptions(),
        share_slots: int = DEFAULT_SHARE_SLOTS,
    ) -> None:
        self.node = node
        self.options = options
        self.share_slots = share_slots
        self.gpus: dict[str, GpuInfo] = {}
        # pods answered (PendingPod.ident -> the kubelet's IDs), kept while they are pending
        self.served: dict[str, frozenset[str]] = {}
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
        self.devices = devices_of(topology, self.resource, share_slots=self.share_slots)
        self.gpus = {
            g.uuid or str(g.index): GpuInfo(
                uuid=g.uuid or str(g.index),
                minor=g.minor if g.minor is not None else g.index,
                memory_mib=g.memory_mib,
            )
            for g in topology.spec.gpus
        }
        self.unhealthy = {d.ID for d in self.devices if d.health != "Healthy"}
        self.version += 1

        async def notify() -> None:
            async with self.changed:
                self.changed.notify_all()

        task = asyncio.get_running_loop().create_task(notify())
        self._notify_task = task  # keep a reference until it runs

    def served_for(self, pods: list[PendingPod]) -> dict[str, frozenset[str]]:
        """The pods served and still pending (the others are forgotten: started, gone or failed)."""
        pending = {p.ident for p in pods if not p.admitted}
        for ident in [i for i in self.served if i not in pending]:
            del self.served[ident]
        return self.served

    def response(self, pod: PendingPod) -> Any:
        """The `ContainerAllocateResponse` giving the container exactly `pod`'s devices."""
        alloc = allocation_for_pod(pod, resource=self.resource, gpus=self.gpus, options=self.options)
        devices = [
            api_pb2.DeviceSpec(container_path=c, host_path=h, permissions=p) for c, h, p in alloc.devices
        ]
        if self.resource == RESOURCE_RDMA:
            devices = self.device_specs(list(pod.nics))
        return api_pb2.ContainerAllocateResponse(
            envs=alloc.envs,
            devices=devices,
            cdi_devices=[api_pb2.CDIDevice(name=n) for n in alloc.cdi_devices],
            mounts=[api_pb2.Mount(container_path=c, host_path=h, read_only=ro) for c, h, ro in alloc.mounts],
        )

    def device_specs(self, ids: list[str]) -> list[Any]:
        """Host devices the container needs for RDMA NICs (`/dev/infiniband/uverbsN`, `rdma_cm`)."""
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
