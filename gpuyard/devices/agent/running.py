"""The long-running `gpuyard agent`: discover once, publish, then keep the NodeTopology current.

Data flow on the node::

    NVML / sysfs / file / preset --Inventory.read()--> NodeTopology --TopologySink.put()--> gpuyard API
            NVML events --EventWatcher.wait()--> HealthBook --------^      (PUT /api/v1/nodetopologies/N)
                                                           \\--> listeners (the device plugin's ListAndWatch)

- Start: NVML is opened (`nvmlInit`); when that or the first reading fails (no driver yet, library
  missing, or any exception a binding raises) the agent logs one line and retries with exponential
  backoff; a file or preset source needs no NVML.
- Health: every `health_interval` seconds at most, the watcher's events (XID, double-bit ECC, GPU
  lost) are recorded; a GPU that turned unhealthy is published at once, so the scheduler stops
  using it within one interval and the backend fails the pods on it.
- Publishing: a sink that fails (server unreachable, 5xx) is logged once per outage and retried
  with backoff; the agent keeps serving what it knows (the device plugin keeps streaming).
  `resync` re-publishes the last topology periodically, so a server that lost it gets it back.

Nothing here knows HTTP frameworks: :class:`HttpSink` uses httpx, the CLI wires the pieces.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

import httpx
import structlog

from gpuyard.apis.devices import NodeTopology
from gpuyard.devices.agent.allocating import PendingPod, pending_pods_from
from gpuyard.devices.agent.health import EventWatcher, HealthEvent
from gpuyard.devices.agent.inventory import Inventory
from gpuyard.devices.discovery import DiscoveryError
from gpuyard.devices.render import to_yaml

__all__ = [
    "Agent",
    "AgentTimings",
    "HttpPodLookup",
    "HttpSink",
    "PrintSink",
    "SinkError",
    "TopologySink",
    "nvml_module",
]

log = structlog.get_logger(__name__)


class SinkError(RuntimeError):
    """The topology could not be written; the message says where and why."""


class TopologySink(Protocol):
    """Where the agent writes the node's NodeTopology."""

    async def put(self, topology: NodeTopology) -> None: ...


class PrintSink:
    """Writes each topology as YAML to a stream (`--print`, `--dry-run`)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else io.StringIO()
        self.written: list[NodeTopology] = []

    async def put(self, topology: NodeTopology) -> None:
        self.written.append(topology)
        self.stream.write(to_yaml(topology))
        self.stream.flush()


class HttpSink:
    """`PUT /api/v1/nodetopologies/{name}` on a gpuyard server (needs an admin token)."""

    def __init__(self, server: str, *, token: str | None = None, timeout_s: float = 10.0) -> None:
        self.server = server.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.AsyncClient(headers=headers, timeout=timeout_s)

    async def put(self, topology: NodeTopology) -> None:
        url = f"{self.server}/api/v1/nodetopologies/{topology.metadata.name}"
        body = topology.to_dict()
        body["metadata"].pop("resourceVersion", None)  # the agent owns the object: last write wins
        try:
            r = await self.client.put(url, json=body)
        except httpx.HTTPError as exc:
            raise SinkError(f"cannot reach {self.server}: {exc}") from exc
        if r.status_code >= 400:
            raise SinkError(f"{url} answered {r.status_code}: {r.text[:300]}")

    async def aclose(self) -> None:
        await self.client.aclose()


class HttpPodLookup:
    """The device plugin's pod lookup over the gpuyard API: `GET /api/v1/nodes/{node}/pods`."""

    def __init__(self, server: str, *, token: str | None = None, timeout_s: float = 5.0) -> None:
        self.server = server.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.AsyncClient(headers=headers, timeout=timeout_s)

    async def pending_pods(self, node: str) -> list[PendingPod]:
        url = f"{self.server}/api/v1/nodes/{node}/pods"
        try:
            r = await self.client.get(url)
        except httpx.HTTPError as exc:
            raise SinkError(f"cannot reach {self.server}: {exc}") from exc
        if r.status_code >= 400:
            raise SinkError(f"{url} answered {r.status_code}: {r.text[:300]}")
        items = r.json().get("items", [])
        return pending_pods_from(i for i in items if isinstance(i, dict))

    async def aclose(self) -> None:
        await self.client.aclose()


@dataclass(frozen=True, slots=True)
class AgentTimings:
    health_interval_s: float = 5.0
    resync_s: float = 300.0
    backoff_min_s: float = 1.0
    backoff_max_s: float = 60.0


class Agent:
    """Discovery + health + publishing for one node (module doc)."""

    def __init__(
        self,
        inventory: Inventory,
        sink: TopologySink,
        *,
        timings: AgentTimings = AgentTimings(),
        write: bool = True,
    ) -> None:
        self.inventory = inventory
        self.sink = sink
        self.timings = timings
        self.write = write
        self.current: NodeTopology | None = None
        self.published: NodeTopology | None = None
        self.listeners: list[Callable[[NodeTopology], None]] = []
        self.ready = asyncio.Event()
        self._base: NodeTopology | None = None
        self._watcher: EventWatcher | None = None
        self._nvml_open = False
        self._watch_failures: set[str] = set()

    # --- one reading --------------------------------------------------------------------------

    def _open_nvml(self) -> None:
        nvml = self.inventory.nvml
        if self.inventory.source != "nvml" or self._nvml_open:
            return
        if nvml is None:
            raise DiscoveryError("NVML is not available: install nvidia-ml-py (pip install 'gpuyard[agent]')")
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            raise DiscoveryError(f"NVML could not start ({exc}); is the NVIDIA driver loaded?") from exc
        self._nvml_open = True

    def _discover(self) -> NodeTopology:
        """One reading; whatever NVML or sysfs raised comes out as a DiscoveryError naming it."""
        try:
            self._open_nvml()
            topology = self.inventory.read()
            if self.inventory.source == "nvml" and self._watcher is None:
                self._watcher = EventWatcher(
                    self.inventory.nvml, len(topology.spec.gpus), self.inventory.book
                )
        except DiscoveryError:
            raise
        except Exception as exc:  # a binding that changed under us (TypeError, AttributeError, ...)
            raise DiscoveryError(f"node discovery failed ({type(exc).__name__}: {exc})") from exc
        return topology

    async def discover(self) -> NodeTopology:
        """Read the node (in a worker thread) and remember it; DiscoveryError as `Inventory.read`."""
        topology = await asyncio.to_thread(self._discover)
        self._base = topology
        self._set(topology)
        return topology

    def _set(self, topology: NodeTopology) -> None:
        self.current = topology
        self.ready.set()
        for listener in list(self.listeners):
            listener(topology)

    async def publish(self) -> bool:
        """Write the current topology; False (logged) when the sink failed."""
        if self.current is None or not self.write:
            return self.current is not None
        try:
            await self.sink.put(self.current)
        except SinkError as exc:
            log.warning("cannot write NodeTopology; keeping what is known and retrying", error=str(exc))
            return False
        self.published = self.current
        return True

    def record(self, events: list[HealthEvent]) -> bool:
        """Record health events; when a GPU turned unhealthy, update the current topology."""
        if self._base is None:
            return False
        if not self.inventory.book.record(events, len(self._base.spec.gpus)):
            return False
        for event in events:
            log.warning("GPU unhealthy", gpu=event.index, reason=event.reason, node=self._base.metadata.name)
        self._set(self.inventory.book.apply(self._base))
        return True

    # --- the long-running loop -----------------------------------------------------------------

    async def _start(self) -> None:
        delay = self.timings.backoff_min_s
        failing = ""
        while True:
            try:
                await self.discover()
                return
            except DiscoveryError as exc:
                if str(exc) != failing:
                    log.error("node discovery failed; retrying with backoff", error=str(exc))
                    failing = str(exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.timings.backoff_max_s)

    async def run(self) -> None:
        """Discover (retrying), publish, watch health until cancelled."""
        await self._start()
        loop = asyncio.get_running_loop()
        ok = await self.publish()
        delay = self.timings.backoff_min_s
        retry_at = loop.time() + delay
        resync_at = loop.time() + self.timings.resync_s
        interval = self.timings.health_interval_s
        try:
            while True:
                events = await self._watch(interval)
                changed = self.record(events)
                now = loop.time()
                if changed or now >= resync_at or (not ok and now >= retry_at):
                    was_ok = ok
                    ok = await self.publish()
                    resync_at = now + self.timings.resync_s
                    if ok:
                        if not was_ok:
                            log.info("NodeTopology written again after an outage")
                        delay = self.timings.backoff_min_s
                    else:
                        delay = min(delay * 2, self.timings.backoff_max_s) if not was_ok else delay
                        retry_at = now + delay
        finally:
            self.close()

    async def _watch(self, interval: float) -> list[HealthEvent]:
        """Health events of one interval; a watcher that fails is logged once per kind of failure and
        the interval is waited out, so the agent keeps serving what it knows."""
        if self._watcher is None:
            await asyncio.sleep(interval)
            return []
        try:
            return await asyncio.to_thread(self._watcher.wait, interval)
        except Exception as exc:
            key = f"{type(exc).__name__}: {exc}"
            if key not in self._watch_failures:
                self._watch_failures.add(key)
                log.error("GPU health watch failed; keeping the topology and retrying", error=key)
            await asyncio.sleep(interval)
            return []

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        if self._nvml_open:
            with contextlib.suppress(Exception):
                self.inventory.nvml.nvmlShutdown()
            self._nvml_open = False


def nvml_module() -> Any:
    """`pynvml`, or None when the package is not installed (the CLI explains what to install)."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml
