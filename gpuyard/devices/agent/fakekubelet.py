"""A fake kubelet for device-plugin tests: the Registration server and a device-plugin client.

:class:`FakeKubelet` listens on `<dir>/kubelet.sock` like the kubelet's device manager. When a
plugin registers, it connects to the plugin's endpoint, follows its `ListAndWatch` stream (the
latest device list per resource is in `devices`) and offers the calls the kubelet makes when it
admits a pod: :meth:`preferred` (GetPreferredAllocation) and :meth:`allocate` (Allocate).
:meth:`restart` does what a kubelet restart does to the plugin directory: every socket in it is
deleted and `kubelet.sock` is created anew.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import grpc

from gpuyard.devices.agent.proto import api_pb2, api_pb2_grpc

__all__ = ["FakeKubelet"]


class _Registration:
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    async def Register(self, request: Any, context: Any) -> Any:
        if request.version != "v1beta1":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version}")
        self.kubelet.registered.append((request.resource_name, request.endpoint))
        self.kubelet.follow(request.resource_name, request.endpoint)
        return api_pb2.Empty()


class FakeKubelet:
    """The kubelet side of the device-plugin API (module doc)."""

    def __init__(self, plugin_dir: Path) -> None:
        self.plugin_dir = Path(plugin_dir)
        self.registered: list[tuple[str, str]] = []
        self.devices: dict[str, list[tuple[str, str]]] = {}
        self.updates: dict[str, int] = {}
        self._server: Any = None
        self._channels: dict[str, Any] = {}
        self._streams: dict[str, asyncio.Task[None]] = {}

    async def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.plugin_dir / 'kubelet.sock'}")
        await server.start()
        self._server = server

    def follow(self, resource: str, endpoint: str) -> None:
        old = self._streams.pop(resource, None)
        if old is not None:
            old.cancel()
        channel = grpc.aio.insecure_channel(f"unix://{self.plugin_dir / endpoint}")
        self._channels[resource] = channel
        self._streams[resource] = asyncio.get_running_loop().create_task(self._watch(resource, channel))

    async def _watch(self, resource: str, channel: Any) -> None:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for response in stub.ListAndWatch(api_pb2.Empty()):
                self.devices[resource] = [(d.ID, d.health) for d in response.devices]
                self.updates[resource] = self.updates.get(resource, 0) + 1

    def _stub(self, resource: str) -> Any:
        return api_pb2_grpc.DevicePluginStub(self._channels[resource])

    async def preferred(
        self, resource: str, *, available: list[str], size: int, must_include: list[str] | None = None
    ) -> list[str]:
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available,
                    must_include_deviceIDs=must_include or [],
                    allocation_size=size,
                )
            ]
        )
        response = await self._stub(resource).GetPreferredAllocation(request, timeout=5)
        return list(response.container_responses[0].deviceIDs)

    async def allocate(self, resource: str, ids: list[str]) -> dict[str, str]:
        """The env of the one container; grpc.aio.AioRpcError when the plugin refuses."""
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
        )
        response = await self._stub(resource).Allocate(request, timeout=5)
        return dict(response.container_responses[0].envs)

    async def stop(self) -> None:
        for task in self._streams.values():
            task.cancel()
        for task in self._streams.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._streams.clear()
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        if self._server is not None:
            await self._server.stop(grace=0.1)
            self._server = None

    async def restart(self) -> None:
        """Stop, delete every socket in the plugin directory, start again (a kubelet restart)."""
        await self.stop()
        for path in self.plugin_dir.glob("*.sock"):
            path.unlink()
        await self.start()
