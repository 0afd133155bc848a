"""`FakeApiServer`: a Kubernetes API server in one asyncio process, for tests and development.

    async with FakeApiServer(port=0, audit=True) as server:
        server.write_kubeconfig("kc.yaml")      # kubectl --kubeconfig kc.yaml get pods
        server.faults.drop_watches()           # every open watch stream ends now
        server.faults.compact()                # older resourceVersions answer 410 Gone
        [r for r in server.audit if r.verb == "create"]

It holds the objects in memory (`storage.py`), serves the resources of `catalog.py` (the built-ins and
every registered CRD's) with the semantics of `objects.py`, over `routes.py` / `watching.py`. The CLI
command `gpuyard fake-apiserver` and the pytest fixture `fake_apiserver` start one. It is a test tool:
no TLS, no authorization, no admission, no schema validation (see docs/kubernetes-testing.md).
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from aiohttp import web

from gpuyard.testing.apiserver.catalog import Catalog
from gpuyard.testing.apiserver.faults import Faults
from gpuyard.testing.apiserver.objects import ObjectApi
from gpuyard.testing.apiserver.routes import AuditRecord, build_app
from gpuyard.testing.apiserver.storage import Storage

__all__ = ["DEFAULT_TOKEN", "FakeApiServer"]

DEFAULT_TOKEN = "gpuyard-fake-apiserver-token"  # any bearer token is accepted unless `token` is set


class FakeApiServer:
    """The test API server; `await start()` / `await stop()`, or `async with`."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        audit: bool = False,
        bookmark_interval: float = 60.0,
        max_watch_seconds: float = 1800.0,
        history_limit: int = 10_000,
        gc_delay: float = 0.0,
        graceful_pods: bool = False,
    ) -> None:
        if bookmark_interval <= 0:
            raise ValueError(f"bookmark_interval: must be > 0 seconds, got {bookmark_interval}")
        if history_limit < 1:
            raise ValueError(f"history_limit: must be >= 1, got {history_limit}")
        self.host = host
        self.port = port
        self.token = token
        self.bookmark_interval = bookmark_interval
        self.max_watch_seconds = max_watch_seconds
        self.gc_delay = gc_delay
        self.storage = Storage(history_limit=history_limit)
        self.catalog = Catalog.builtin()
        self.objects = ObjectApi(
            self.storage, self.catalog, schedule_gc=self._schedule_gc, graceful_pods=graceful_pods
        )
        self.faults = Faults(self.storage)
        self.audit: list[AuditRecord] | None = [] if audit else None
        self._runner: web.AppRunner | None = None
        self._gc_handle: asyncio.TimerHandle | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> FakeApiServer:
        """Listen on host:port (port 0: a free one, then in `self.port`)."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        runner = web.AppRunner(
            build_app(self), handler_cancellation=True, access_log=None, shutdown_timeout=0.5
        )
        try:
            await runner.setup()
            await web.SockSite(runner, sock).start()
        except BaseException:
            sock.close()
            await runner.cleanup()
            raise
        self._runner = runner
        return self

    async def stop(self) -> None:
        """End every watch stream and stop listening."""
        if self._gc_handle is not None:
            self._gc_handle.cancel()
            self._gc_handle = None
        self.storage.close_watchers()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> FakeApiServer:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # --- garbage collection -----------------------------------------------------------------------

    def _schedule_gc(self) -> None:
        if self._gc_handle is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # a write from outside the loop (set-up code): collect now
                self.objects.collect_garbage()
                return
            self._gc_handle = loop.call_later(self.gc_delay, self._collect)

    def _collect(self) -> None:
        self._gc_handle = None
        self.objects.collect_garbage()

    # --- kubeconfig -------------------------------------------------------------------------------

    def kubeconfig(self, *, context: str = "gpuyard-fake", token: str | None = None) -> dict[str, Any]:
        """A kubeconfig for this server (kubectl and kubernetes-asyncio accept it), presenting `token`
        (default: the server's own, else `DEFAULT_TOKEN`). A server started without `token` accepts
        any, and its audit records which one each request presented: give each client its own to
        tell their calls apart."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": context, "cluster": {"server": self.url}}],
            "users": [{"name": context, "user": {"token": token or self.token or DEFAULT_TOKEN}}],
            "contexts": [
                {"name": context, "context": {"cluster": context, "user": context, "namespace": "default"}}
            ],
            "current-context": context,
            "preferences": {},
        }

    def write_kubeconfig(
        self, path: str | Path, *, context: str = "gpuyard-fake", token: str | None = None
    ) -> Path:
        """Write `kubeconfig()` to `path` (readable by its owner only); the path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(yaml.safe_dump(self.kubeconfig(context=context, token=token), sort_keys=False))
        target.chmod(0o600)
        return target

    # --- conveniences for tests -------------------------------------------------------------------

    def install_crds(self, crds: list[dict[str, Any]]) -> None:
        """Create (or replace) these CustomResourceDefinitions, as `kubectl apply` would."""
        res = self.catalog.get("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        for crd in crds:
            name = (crd.get("metadata") or {}).get("name", "")
            current = self.storage.get(res.key, name)
            if current is None:
                self.objects.create(res, crd)
            else:
                meta = {
                    **(crd.get("metadata") or {}),
                    "resourceVersion": current["metadata"]["resourceVersion"],
                }
                self.objects.replace(res, name, body={**crd, "metadata": meta})

    def install_gpuyard_crds(self) -> None:
        """Serve gpuyard's custom resources with the minimal CRDs of `crds.py` (open schemas)."""
        from gpuyard.testing.apiserver.crds import minimal_crds

        self.install_crds(minimal_crds())

    def compact(self) -> int:
        """Forget the event history (see `Faults.compact`); the version compacted at."""
        return self.faults.compact()

    @property
    def resource_version(self) -> int:
        return self.storage.rv
