"""A fake kubelet for device-plugin tests: the Registration server and a device-plugin client.

:class:`FakeKubelet` listens on `<dir>/kubelet.sock` like the kubelet's device manager. When a
plugin registers, it connects to the plugin's endpoint, follows its `ListAndWatch` stream (the
latest device list per resource is in `devices`) and offers the calls the kubelet makes when it
admits a pod: :meth:`preferred` (GetPreferredAllocation) and :meth:`allocate` (Allocate).

:meth:`admit` admits one pod as the device manager does (`devicesToAllocate` + `Allocate`): for
each container and resource it counts the healthy devices it has not given to an admitted pod,
refuses the pod when too few are left (`OutOf<resource>`), asks the plugin for a preferred
allocation, picks the devices (`pick="preferred"`: the preference when it is valid, as the real
kubelet does; `pick="others"`: free devices outside the preference first, to show that only the
count of the IDs matters), calls `Allocate` with them, one container per call, and books them.
The plugin is never told the pod. Admitting pods one at a time, in the order given, is what the
kubelet does too. :meth:`restart` does what a kubelet restart does to the plugin directory: every
socket in it is deleted and `kubelet.sock` is created anew.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import grpc

from gpuyard.devices.agent.proto import api_pb2, api_pb2_grpc

__all__ = ["AdmissionError", "ContainerDevices", "FakeKubelet"]


class AdmissionError(RuntimeError):
    """The kubelet rejected the pod (too few devices left: `OutOf<resource>`)."""


@dataclass(slots=True)
class ContainerDevices:
    """What one container got for one resource: the kubelet's IDs and the plugin's answer."""

    ids: list[str]
    envs: dict[str, str] = field(default_factory=dict)
    devices: list[tuple[str, str, str]] = field(default_factory=list)
    cdi_devices: list[str] = field(default_factory=list)
    mounts: list[tuple[str, str, bool]] = field(default_factory=list)


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
        self.allocated: dict[str, dict[str, list[str]]] = {}  # pod -> resource -> the IDs it holds
        self.preferences: list[list[str]] = []  # every preferred allocation the plugin answered
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
        return (await self.allocate_container(resource, ids)).envs

    async def allocate_container(self, resource: str, ids: list[str]) -> ContainerDevices:
        """`Allocate` for one container: the plugin's whole answer; AioRpcError when it refuses."""
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
        )
        response = await self._stub(resource).Allocate(request, timeout=5)
        answer = response.container_responses[0]
        return ContainerDevices(
            ids=list(ids),
            envs=dict(answer.envs),
            devices=[(d.container_path, d.host_path, d.permissions) for d in answer.devices],
            cdi_devices=[d.name for d in answer.cdi_devices],
            mounts=[(m.container_path, m.host_path, m.read_only) for m in answer.mounts],
        )

    def free(self, resource: str) -> list[str]:
        """Healthy devices of `resource` no admitted pod holds (the device manager's books)."""
        held = {i for pod in self.allocated.values() for i in pod.get(resource, [])}
        return [i for i, health in self.devices.get(resource, []) if health == "Healthy" and i not in held]

    async def admit(
        self,
        pod: str,
        containers: Sequence[Mapping[str, int]],
        *,
        pick: Literal["preferred", "others"] = "preferred",
    ) -> list[dict[str, ContainerDevices]]:
        """Admit `pod` (module doc): per container, per resource it requests, what it got."""
        out: list[dict[str, ContainerDevices]] = []
        booked: dict[str, list[str]] = {}
        for requests in containers:
            got: dict[str, ContainerDevices] = {}
            for resource, count in requests.items():
                free = [i for i in self.free(resource) if i not in booked.get(resource, [])]
                if count > len(free):
                    raise AdmissionError(
                        f"pod {pod}: OutOf{resource}: requested {count}, {len(free)} unallocated"
                    )
                preferred = await self.preferred(resource, available=free, size=count)
                self.preferences.append(preferred)
                valid = len(preferred) == count and set(preferred) <= set(free)
                if pick == "preferred" and valid:
                    ids = preferred
                else:
                    others = [i for i in reversed(free) if i not in preferred]
                    ids = [*others, *[i for i in free if i in preferred]][:count]
                got[resource] = await self.allocate_container(resource, ids)
                booked.setdefault(resource, []).extend(ids)
            out.append(got)
        self.allocated[pod] = booked
        return out

    def release(self, pod: str) -> None:
        """The pod ended: its devices are free again."""
        self.allocated.pop(pod, None)

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
