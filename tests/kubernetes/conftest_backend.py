"""A small in-process Kubernetes API server for the Kubernetes backend's tests, and fixtures.

It speaks the REST and watch protocol for every `ApiResource` of `gpuyard.apis.resources` with
the semantics the backend relies on: one resourceVersion counter, LIST with the list's version,
WATCH from a version (bookmarks, `timeoutSeconds`), 410 after `compact()`, 409 on a stale PUT or
merge PATCH precondition and on a taken name, the `status` and `binding` subresources, and fault
injection (`fail(n, status)`, `silence()`, `drop_watches()`). Every request is recorded.

Import the fixtures into a test module with `from tests.kubernetes.conftest_backend import *`
(`tests/kubernetes/conftest.py` belongs to the test API server's own suite).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from aiohttp import web

from gpuyard.apis.resources import API_RESOURCES, ApiResource

__all__ = ["FakeApiServerView", "MiniApiServer", "apiserver", "served"]

Json = dict[str, Any]


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }
    return web.json_response(body, status=code)


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge(out.get(k), v)
    return out


class MiniApiServer:
    """See the module docstring."""

    def __init__(self, *, bookmark_interval: float = 0.5) -> None:
        self.resources: dict[tuple[str, str, str], ApiResource] = {
            (r.group, r.version, r.plural): r for r in API_RESOURCES
        }
        self.objects: dict[tuple[str, str, str], Json] = {}  # (resource id, ns, name)
        self.log: list[tuple[int, str, str, Json]] = []  # (rv, resource id, type, object)
        self.rv = 100
        self.compacted = 0
        self.bookmark_interval = bookmark_interval
        self.requests: list[tuple[str, str]] = []
        self.bindings: list[tuple[str, str, str]] = []  # (namespace, pod uid, node) of every binding made
        self.faults: list[tuple[int, int, str | None, str | None]] = []  # count, status, method, path end
        self.silent = False
        self._changed = asyncio.Condition()
        self._streams: set[web.StreamResponse] = set()
        self._drop = 0
        self.runner: web.AppRunner | None = None
        self.url = ""

    # --- control ------------------------------------------------------------------------------

    def fail(
        self, count: int = 1, *, status: int = 500, method: str | None = None, path: str | None = None
    ) -> None:
        """The next `count` requests (of `method`, to a path ending in `path`) answer `status`."""
        self.faults.append((count, status, method, path))

    def compact(self) -> None:
        """Forget the watch history: a WATCH from any earlier version gets 410 Gone."""
        self.compacted = self.rv
        self.drop_watches()

    def drop_watches(self) -> None:
        self._drop += 1
        asyncio.get_running_loop().create_task(self._notify())

    def silence(self, silent: bool = True) -> None:
        """Open and new watch streams send nothing (no events, no bookmarks) while silent."""
        self.silent = silent

    def watch_count(self, plural: str) -> int:
        return sum(1 for m, p in self.requests if m == "WATCH" and p.endswith("/" + plural))

    def get(self, plural: str, namespace: str, name: str) -> Json | None:
        for (rid, ns, n), obj in self.objects.items():
            if rid.endswith("/" + plural) and ns == namespace and n == name:
                return obj
        return None

    def list(self, plural: str) -> list[Json]:
        return [o for (rid, _, _), o in self.objects.items() if rid.endswith("/" + plural)]

    # --- serving ------------------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        port = sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        self.drop_watches()
        await asyncio.sleep(0)
        if self.runner is not None:
            await self.runner.cleanup()

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "test", "cluster": {"server": self.url}}],
                    "users": [{"name": "test", "user": {"token": "test-token"}}],
                    "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
                    "current-context": "test",
                }
            )
        )
        return path

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _parse(self, path: str) -> tuple[ApiResource, str, str | None, str | None] | None:
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        ns = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        if not rest:
            return None
        res = self.resources.get((group, version, rest[0]))
        if res is None:
            return None
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        return res, ns, name, sub

    def _bump(self, rid: str, type_: str, obj: Json) -> Json:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.log.append((self.rv, rid, type_, copy.deepcopy(obj)))
        asyncio.get_running_loop().create_task(self._notify())
        return obj

    async def handle(self, request: web.Request) -> web.StreamResponse:
        watching = request.method == "GET" and request.query.get("watch") in ("true", "1")
        self.requests.append(("WATCH" if watching else request.method, request.path))
        for i, (count, status, method, end) in enumerate(self.faults):
            if (method is None or method == request.method) and (end is None or request.path.endswith(end)):
                self.faults[i] = (count - 1, status, method, end)
                if count - 1 <= 0:
                    self.faults.pop(i)
                return _status(status, "InternalError", "injected failure")
        parsed = self._parse(request.path)
        if parsed is None:
            return _status(
                404, "NotFound", f"the server could not find the requested resource {request.path}"
            )
        res, ns, name, sub = parsed
        rid = f"{res.group}/{res.version}/{res.plural}"
        body: Json = {}
        if request.can_read_body:
            raw = await request.read()
            body = json.loads(raw) if raw else {}
        if request.method == "GET" and name is None:
            if watching:
                return await self._watch(request, res, rid, ns)
            items = [
                copy.deepcopy(o)
                for (r, n, _), o in sorted(self.objects.items())
                if r == rid and (not ns or n == ns)
            ]
            return web.json_response(
                {
                    "apiVersion": res.api_version,
                    "kind": f"{res.kind}List",
                    "metadata": {"resourceVersion": str(self.rv)},
                    "items": items,
                }
            )
        key = (rid, ns, name or (body.get("metadata") or {}).get("name") or "")
        current = self.objects.get(key)
        what = f'{res.plural} "{key[2]}"'
        if request.method == "POST" and sub == "binding":
            if current is None:
                return _status(404, "NotFound", f"{what} not found")
            if current.get("spec", {}).get("nodeName"):
                return _status(
                    409, "Conflict", f"pod {key[2]} is already assigned to node {current['spec']['nodeName']}"
                )
            current["spec"]["nodeName"] = body["target"]["name"]
            self.bindings.append((ns, current["metadata"]["uid"], body["target"]["name"]))
            self._bump(rid, "MODIFIED", current)
            return web.json_response({"kind": "Status", "status": "Success", "code": 201}, status=201)
        if request.method == "POST" and name is None:
            meta = body.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                key = (rid, ns, meta["name"])
            if key in self.objects:
                return _status(409, "AlreadyExists", f"{what} already exists")
            if res.namespaced:
                meta["namespace"] = ns or meta.get("namespace") or "default"
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            meta["generation"] = 1
            if res.status_subresource and res.kind != "Node":  # a kubelet registers its Node with status
                body.pop("status", None)
            if res.kind == "Pod":
                body["status"] = {"phase": "Pending"}
            self.objects[key] = body
            return web.json_response(self._bump(rid, "ADDED", body), status=201)
        if current is None:
            return _status(404, "NotFound", f"{what} not found")
        if request.method == "GET":
            return web.json_response(current)
        if request.method == "DELETE":
            pre = (body.get("preconditions") or {}).get("resourceVersion")
            if pre and pre != current["metadata"]["resourceVersion"]:
                return _status(409, "Conflict", f"{what}: precondition failed")
            del self.objects[key]
            return web.json_response(self._bump(rid, "DELETED", current))
        want = (body.get("metadata") or {}).get("resourceVersion")
        if want and want != current["metadata"]["resourceVersion"]:
            return _status(
                409, "Conflict", f"Operation cannot be fulfilled on {what}: the object has been modified"
            )
        if request.method == "PUT":
            new = copy.deepcopy(body)
            if res.status_subresource and sub != "status":
                new["status"] = current.get("status", {})
            for k in ("uid", "creationTimestamp", "namespace", "generation"):
                if k in current["metadata"]:
                    new["metadata"][k] = current["metadata"][k]
        elif request.method == "PATCH":
            if sub == "status":
                new = copy.deepcopy(current)
                new["status"] = _merge(current.get("status", {}), body.get("status", {}))
            else:
                body = {k: v for k, v in body.items() if not (res.status_subresource and k == "status")}
                new = _merge(current, body)
        else:
            return _status(405, "MethodNotAllowed", request.method)
        if new.get("spec") != current.get("spec"):
            new["metadata"]["generation"] = int(current["metadata"].get("generation", 1)) + 1
        self.objects[key] = new
        return web.json_response(self._bump(rid, "MODIFIED", new))

    async def _watch(self, request: web.Request, res: ApiResource, rid: str, ns: str) -> web.StreamResponse:
        since_raw = request.query.get("resourceVersion", "")
        since = int(since_raw) if since_raw.isdigit() else self.rv
        timeout = float(request.query.get("timeoutSeconds", "300"))
        bookmarks = request.query.get("allowWatchBookmarks") == "true"
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        self._streams.add(resp)
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        drop = self._drop

        async def send(event: Json) -> None:
            await resp.write(json.dumps(event).encode() + b"\n")

        try:
            if since < self.compacted:
                await send(
                    {
                        "type": "ERROR",
                        "object": {
                            "kind": "Status",
                            "code": 410,
                            "reason": "Expired",
                            "message": f"too old resource version: {since} ({self.compacted})",
                        },
                    }
                )
                return resp
            cursor = since
            last_sent = loop.time()
            while loop.time() < end and drop == self._drop:
                if not self.silent:
                    for rv, r, type_, obj in itertools.islice(self.log, 0, None):
                        if rv <= cursor or r != rid:
                            continue
                        if ns and obj["metadata"].get("namespace") != ns:
                            continue
                        await send({"type": type_, "object": obj})
                        last_sent = loop.time()
                    cursor = max(cursor, self.rv)
                    if bookmarks and loop.time() - last_sent >= self.bookmark_interval:
                        await send(
                            {
                                "type": "BOOKMARK",
                                "object": {
                                    "kind": res.kind,
                                    "apiVersion": res.api_version,
                                    "metadata": {"resourceVersion": str(cursor)},
                                },
                            }
                        )
                        last_sent = loop.time()
                async with self._changed:
                    try:
                        await asyncio.wait_for(
                            self._changed.wait(),
                            timeout=min(self.bookmark_interval, max(0.01, end - loop.time())),
                        )
                    except TimeoutError:
                        pass
        except ConnectionResetError:
            pass
        finally:
            self._streams.discard(resp)
        return resp


@pytest_asyncio.fixture
async def apiserver(tmp_path: Path) -> AsyncIterator[MiniApiServer]:
    server = MiniApiServer()
    await server.start()
    server.kubeconfig(tmp_path / "kubeconfig.yaml")
    try:
        yield server
    finally:
        await server.stop()


_METHODS = {
    "create": "POST",
    "get": "GET",
    "list": "GET",
    "watch": "WATCH",
    "update": "PUT",
    "patch": "PATCH",
}


class FakeApiServerView:
    """The `fake_apiserver` fixture's server seen through the few questions the platform tests ask
    (the same as :class:`MiniApiServer`'s, and `realplane.ControlPlaneView`'s for the real control
    plane): objects by plural, requests made, bindings, faults."""

    real = False

    def __init__(self, running: Any) -> None:
        self.running = running
        self.server = running.server
        self.kubeconfig: Path = running.kubeconfig

    def _resources(self, plural: str) -> list[Any]:
        """Every served resource of that plural (a job kind has one per API group)."""
        return [res for (_, _, p), res in self.server.catalog.resources.items() if p == plural]

    def list(self, plural: str) -> list[Json]:
        items: list[Json] = []
        for res in self._resources(plural):
            items += self.server.objects.list(res)["items"]
        return items

    def get(self, plural: str, namespace: str, name: str) -> Json | None:
        for res in self._resources(plural):
            try:
                obj: Json = self.server.objects.get(res, name, namespace=namespace or None)
            except Exception:  # the server's own 404
                continue
            return obj
        return None

    @property
    def requests(self) -> list[tuple[str, str]]:
        out = []
        for r in self.server.audit:
            path = "/".join(x for x in (r.group, r.resource, r.namespace, r.name, r.subresource) if x)
            out.append((_METHODS.get(r.verb, r.verb.upper()), "/" + path))
        return out

    def bindings(self) -> list[tuple[str, str]]:
        """(namespace, pod) of every binding the server accepted."""
        return [
            (r.namespace, r.name)
            for r in self.server.audit
            if r.verb == "create" and r.subresource == "binding" and 200 <= r.code < 300
        ]

    def deletions(self, plural: str, namespace: str, name: str) -> int:
        return sum(
            1
            for r in self.server.audit
            if r.verb == "delete"
            and r.resource == plural
            and r.namespace == namespace
            and r.name == name
            and 200 <= r.code < 300
        )

    def fail(
        self, count: int = 1, *, status: int = 500, verb: str | None = None, path_prefix: str = ""
    ) -> None:
        self.server.faults.fail_next(count, code=status, path_prefix=path_prefix, verb=verb)

    def clear_faults(self) -> None:
        self.server.faults.clear()

    def drop_watches(self) -> None:
        self.server.faults.drop_watches()

    def install_crds(self, docs: list[Json]) -> None:
        self.server.install_crds(docs)

    def ensure_namespace(self, name: str) -> None:
        """Nothing to do: this server takes objects in namespaces that do not exist (a listed
        difference from a real one, docs/kubernetes-testing.md)."""


@pytest.fixture(params=["dev", "real"])
def served(request: pytest.FixtureRequest) -> Iterator[Any]:
    """An API server with gpuyard's CRDs installed, once per server: `dev` is the development server
    (`fake_apiserver`, minimal CRDs), `real` the real control plane (`kube_control_plane`, the CRDs
    gpuyard ships), wiped before each test. A test marked `dev_apiserver_only` (fault injection)
    runs on the development server alone."""
    if request.param == "dev":
        running = request.getfixturevalue("fake_apiserver")
        running.server.install_gpuyard_crds()
        yield FakeApiServerView(running)
        return
    if request.node.get_closest_marker("dev_apiserver_only"):
        pytest.skip("fault injection: the development API server's alone")
    from tests.kubernetes.realplane import ControlPlaneView, admin_http

    plane = request.getfixturevalue("real_plane")
    with admin_http(plane) as http:
        ControlPlaneView(plane, http).wipe()
        view = ControlPlaneView(plane, http)  # the audit log from here on
        yield view
