"""The HTTP face of the test API server: parse a Kubernetes REST path, pick the verb, apply the faults
in force, record the call, and answer from `objects.py` (JSON, or a server-side-printed Table) or stream
a watch (`watching.py`).

    /api/v1[/namespaces/{ns}]/{plural}[/{name}[/{subresource}]]
    /apis/{group}/{version}[/namespaces/{ns}]/{plural}[/{name}[/{subresource}]]

`pods/{name}/log` is answered from the kubelet of the pod's node (`podlogs.py`).
Also served: discovery (`/api`, `/apis`, `/api/v1`, `/apis/{group}[/{version}]`, in the legacy and the
aggregated form), `/version`, `/healthz`, `/livez`, `/readyz`, `/openapi/v3` (`openapi.py`) and `/openapi/v2`
(empty), and the test endpoints under `/_gpuyard/` (faults, audit),
never under `/api` or `/apis`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import yaml
from aiohttp import web
from pydantic import ValidationError

from gpuyard.testing.apiserver.applying import APPLY, manager_from_user_agent
from gpuyard.testing.apiserver.catalog import Resource
from gpuyard.testing.apiserver.errors import ApiError, status_body
from gpuyard.testing.apiserver.faults import FaultRequest
from gpuyard.testing.apiserver.openapi import group_version_document, root_document
from gpuyard.testing.apiserver.podlogs import serve_pod_log
from gpuyard.testing.apiserver.selecting import Matcher, field_selector, label_selector
from gpuyard.testing.apiserver.tables import table, wants_table
from gpuyard.testing.apiserver.watching import WatchRequest, serve_watch

if TYPE_CHECKING:
    from gpuyard.testing.apiserver.server import FakeApiServer

__all__ = ["AuditRecord", "Target", "build_app"]

_JSON = "application/json"
_OPENAPI_V2_PROTOBUF = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"  # parsable by Go mime
_NOT_FOUND = "the server could not find the requested resource"
SERVER_VERSION = {
    "major": "1",
    "minor": "30",
    "gitVersion": "v1.30.0",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-04-17T00:00:00Z",
    "goVersion": "go1.22.2",
    "compiler": "gc",
    "platform": "linux/amd64",
}


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One resource request as RBAC sees it (verb, group, resource, subresource, namespace, name),
    with its answer's code and who asked: the bearer token presented (this server trusts any token
    unless started with one, so a test may give each client its own to tell their calls apart), and
    the `fieldManager` a write named (as a real server records it in `managedFields`)."""

    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int
    user: str = ""
    manager: str = ""


@dataclass(frozen=True, slots=True)
class Target:
    """What a resource path names."""

    res: Resource
    namespace: str | None
    name: str | None
    sub: str | None


def _json(body: Any, status: int = 200, content_type: str = _JSON) -> web.Response:
    return web.Response(body=json.dumps(body).encode(), status=status, headers={"Content-Type": content_type})


def _error(code: int, message: str, field: str | None = None) -> web.Response:
    details = [{"field": field, "reason": message}] if field else []
    return _json({"error": {"code": code, "message": message, "details": details}}, status=code)


def _aggregated_version(accept: str) -> str | None:
    """`v2` / `v2beta1` when the client asks for aggregated discovery first, else None (legacy)."""
    for media in accept.split(","):
        params = dict(p.strip().split("=", 1) for p in media.split(";")[1:] if "=" in p)
        if params.get("g") == "apidiscovery.k8s.io" and params.get("as") == "APIGroupDiscoveryList":
            if params.get("v") in ("v2", "v2beta1"):
                return params["v"]
            continue
        if media.split(";")[0].strip() in (_JSON, "*/*", ""):
            return None
    return None


def _openapi_v2(request: web.Request) -> web.Response:
    """An OpenAPI v2 document without definitions (kubectl 1.27 reads it before the v3 ones; with no
    schema for a kind it validates nothing client-side). Protobuf when asked, as kubectl does."""
    if "protobuf" in request.headers.get("Accept", ""):
        # openapi_v2.Document{swagger: "2.0"}: field 1, wire type 2, length 3
        return web.Response(body=b"\x0a\x032.0", headers={"Content-Type": _OPENAPI_V2_PROTOBUF})
    return _json(
        {
            "swagger": "2.0",
            "info": {"title": "Kubernetes", "version": "v1.30.0"},
            "paths": {},
            "definitions": {},
        }
    )


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true", "yes")


class Handler:
    """The one aiohttp handler: every path goes through `handle`."""

    def __init__(self, server: FakeApiServer) -> None:
        self.server = server

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        try:
            if path.startswith("/_gpuyard/"):
                return await self._test_endpoint(request)
            self._check_auth(request)
            if self.server.faults.delay:
                await asyncio.sleep(self.server.faults.delay)
            return await self._dispatch(request)
        except ApiError as exc:
            return _json(exc.body(), status=exc.code)

    def _check_auth(self, request: web.Request) -> None:
        token = self.server.token
        if token is None:
            return
        if request.headers.get("Authorization", "") != f"Bearer {token}":
            raise ApiError(401, "Unauthorized", reason="Unauthorized")

    # --- non-resource paths -----------------------------------------------------------------------

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        catalog = self.server.catalog
        if request.method != "GET" and (len(parts) < 3 or parts[0] not in ("api", "apis")):
            raise ApiError(
                405, f"{request.method} is not allowed on {request.path}", reason="MethodNotAllowed"
            )
        if not parts:
            paths = ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/readyz", "/version"]
            paths += [f"/apis/{g}" for g in catalog.groups()]
            paths += [f"/apis/{g}/{v}" for g in catalog.groups() for v in catalog.versions_of(g)]
            return _json({"paths": sorted(paths)})
        if parts == ["version"]:
            return _json(SERVER_VERSION)
        if parts[0] in ("healthz", "livez", "readyz"):
            return web.Response(text="ok")
        if parts == ["openapi", "v2"]:
            return _openapi_v2(request)
        if parts[:2] == ["openapi", "v3"]:
            if len(parts) == 2:
                return _json(root_document(catalog))
            if parts[2:3] == ["api"] and len(parts) == 4:  # /openapi/v3/api/v1
                return _json(group_version_document(catalog, "", parts[3]))
            if parts[2:3] == ["apis"] and len(parts) == 5:  # /openapi/v3/apis/{group}/{version}
                return _json(group_version_document(catalog, parts[3], parts[4]))
            raise ApiError(404, _NOT_FOUND, reason="NotFound")
        if parts[0] == "api":
            if len(parts) == 1:
                return self._discovery(request, core=True)
            if parts[1] != "v1":
                raise ApiError(404, _NOT_FOUND, reason="NotFound")
            if len(parts) == 2:
                return _json(catalog.resource_list("", "v1"))
            return await self._resource_request(request, group="", version="v1", parts=parts[2:])
        if parts[0] == "apis":
            if len(parts) == 1:
                return self._discovery(request, core=False)
            if len(parts) == 2:
                return _json(catalog.api_group(parts[1]))
            if len(parts) == 3:
                return _json(catalog.resource_list(parts[1], parts[2]))
            return await self._resource_request(request, group=parts[1], version=parts[2], parts=parts[3:])
        raise ApiError(404, _NOT_FOUND, reason="NotFound")

    def _discovery(self, request: web.Request, *, core: bool) -> web.Response:
        version = _aggregated_version(request.headers.get("Accept", ""))
        catalog = self.server.catalog
        if version is not None:
            content_type = f"{_JSON};g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList"
            return _json(catalog.aggregated(core=core, version=version), content_type=content_type)
        if core:
            return _json(catalog.api_versions(f"{self.server.host}:{self.server.port}"))
        return _json(catalog.api_group_list())

    async def _test_endpoint(self, request: web.Request) -> web.Response:
        faults = self.server.faults
        if request.path == "/_gpuyard/faults":
            if request.method == "GET":
                return _json(faults.state())
            if request.method == "POST":
                try:
                    spec = FaultRequest.model_validate_json(await request.read())
                except ValidationError as exc:
                    first = exc.errors()[0]
                    where = ".".join(str(p) for p in first["loc"])
                    return _error(400, f"{where or 'body'}: {first['msg']}", where or "body")
                return _json({"applied": spec.root.action, **faults.apply(spec), "state": faults.state()})
            return _error(405, f"{request.method} /_gpuyard/faults: use GET or POST")
        if request.path == "/_gpuyard/audit":
            if request.method == "GET":
                return _json(
                    {
                        "enabled": self.server.audit is not None,
                        "records": [asdict(r) for r in self.server.audit or []],
                    }
                )
            if request.method == "DELETE":
                if self.server.audit is not None:
                    self.server.audit.clear()
                return _json({"cleared": True})
            return _error(405, f"{request.method} /_gpuyard/audit: use GET or DELETE")
        return _error(404, f"{request.path}: not a test endpoint (/_gpuyard/faults, /_gpuyard/audit)")

    # --- resources --------------------------------------------------------------------------------

    async def _resource_request(
        self, request: web.Request, *, group: str, version: str, parts: list[str]
    ) -> web.StreamResponse:
        namespace = None
        if (
            parts[0] == "namespaces"
            and len(parts) >= 3
            and not (len(parts) == 3 and parts[2] in ("status", "finalize"))
        ):
            namespace, parts = parts[1], parts[2:]
        if len(parts) > 3:
            raise ApiError(404, _NOT_FOUND, reason="NotFound")
        res = self.server.catalog.get(group, version, parts[0])
        target = Target(
            res, namespace, parts[1] if len(parts) > 1 else None, parts[2] if len(parts) > 2 else None
        )
        if not res.namespaced and namespace is not None:
            raise ApiError(404, _NOT_FOUND, reason="NotFound")
        if target.sub is not None and target.sub not in res.subresources:
            raise ApiError(404, _NOT_FOUND, reason="NotFound")
        verb = self._verb(request, target)
        code = 500
        try:
            if (injected := self.server.faults.take_failure(request.path, verb)) is not None:
                raise ApiError(
                    injected, f"injected fault: {request.method} {request.path} answered {injected}"
                )
            if self.server.faults.take_conflict(verb):
                raise ApiError.conflict(
                    res.plural, target.name or "", group=res.group, why="injected conflict"
                )
            if "dryRun" in request.query:
                raise ApiError.bad_request("dryRun: not supported by this test API server")
            response = await self._execute(request, target=target, verb=verb)
            code = response.status
            return response
        except ApiError as exc:
            code = exc.code
            raise
        finally:
            if self.server.audit is not None:
                user = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
                self.server.audit.append(
                    AuditRecord(
                        verb,
                        res.group,
                        res.plural,
                        target.sub or "",
                        target.namespace or "",
                        target.name or "",
                        code,
                        user,
                        request.query.get("fieldManager", ""),
                    )
                )
                if code < 300 and verb in ("create", "update", "patch") and target.sub is None:
                    self.server.audit += await self._owner_checks(request, target, user)

    async def _owner_checks(self, request: web.Request, target: Target, user: str) -> list[AuditRecord]:
        """The authorization a real API server's OwnerReferencesPermissionEnforcement admission
        makes of a write that sets `blockOwnerDeletion` on an ownerReference: `update` on the
        owner's `finalizers` subresource. Not enforced here (no RBAC), but audited, so a test that
        checks the RBAC gpuyard ships against the audit sees that it needs it."""
        try:
            body = json.loads(await request.read() or b"{}")
        except ValueError:
            return []
        refs = ((body.get("metadata") or {}) if isinstance(body, dict) else {}).get("ownerReferences") or []
        out = []
        for ref in refs:
            if not isinstance(ref, dict) or not ref.get("blockOwnerDeletion"):
                continue
            api_version = str(ref.get("apiVersion", ""))
            owner = self.server.catalog.for_kind(api_version, str(ref.get("kind", "")))
            if owner is None:
                continue
            namespace = (target.namespace or "") if owner.namespaced else ""
            out.append(
                AuditRecord(
                    "update",
                    owner.group,
                    owner.plural,
                    "finalizers",
                    namespace,
                    str(ref.get("name", "")),
                    200,
                    user,
                )
            )
        return out

    @staticmethod
    def _verb(request: web.Request, target: Target) -> str:
        method = request.method
        if method == "GET":
            if target.name is None:
                return "watch" if _truthy(request.query.get("watch")) else "list"
            return "get"
        if method == "POST":
            return "create"
        if method == "PUT":
            return "update"
        if method == "PATCH":
            return "patch"
        if method == "DELETE":
            return "deletecollection" if target.name is None else "delete"
        raise ApiError(405, f"{method} is not allowed", reason="MethodNotAllowed")

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        try:
            if "yaml" in request.content_type:
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as exc:
            raise ApiError.bad_request(f"the request body is not valid JSON: {exc}") from None

    def _match(self, request: web.Request, res: Resource) -> Matcher | None:
        labels = label_selector(request.query.get("labelSelector"))
        fields = field_selector(request.query.get("fieldSelector"), allowed=res.selectable_fields)
        if labels is None or fields is None:
            return labels or fields
        return lambda obj: labels(obj) and fields(obj)

    def _answer(
        self, request: web.Request, res: Resource, *, obj: dict[str, Any], status: int = 200
    ) -> web.Response:
        rendered = self.server.objects.render(res, obj)
        if wants_table(request.headers.get("Accept", "")):
            meta = {"resourceVersion": (obj.get("metadata") or {}).get("resourceVersion", "")}
            return _json(
                table(
                    res,
                    [rendered],
                    metadata=meta,
                    include_object=request.query.get("includeObject", "Metadata"),
                ),
                status,
            )
        return _json(rendered, status)

    async def _execute(self, request: web.Request, *, target: Target, verb: str) -> web.StreamResponse:
        objects, res, ns, name = self.server.objects, target.res, target.namespace, target.name
        q = request.query
        if verb == "watch":
            watch = WatchRequest.from_query(q, res=res, namespace=ns, match=self._match(request, res))
            return await serve_watch(
                request, self.server, watch, as_table=wants_table(request.headers.get("Accept", ""))
            )
        if verb == "list":
            limit = q.get("limit")
            listed = objects.list(
                res,
                namespace=ns,
                match=self._match(request, res),
                limit=int(limit) if limit and limit.isdigit() else None,
                continue_token=q.get("continue"),
                resource_version=q.get("resourceVersion"),
                resource_version_match=q.get("resourceVersionMatch"),
            )
            if wants_table(request.headers.get("Accept", "")):
                return _json(
                    table(
                        res,
                        listed["items"],
                        metadata=listed["metadata"],
                        include_object=q.get("includeObject", "Metadata"),
                    )
                )
            return _json(listed)
        if verb == "get" and target.sub == "log" and res.key == ("", "pods"):
            return await serve_pod_log(request, self.server, res, name or "", ns)
        if verb == "get":
            return self._answer(request, res, obj=objects.get(res, name or "", namespace=ns))
        body = await self._body(request)
        if verb == "create":
            if name is None and res.key == ("", "bindings"):  # the older form of pods/{name}/binding
                pods = self.server.catalog.get("", "v1", "pods")
                pod_name = (
                    ((body or {}).get("metadata") or {}).get("name") if isinstance(body, dict) else None
                )
                if not pod_name:
                    raise ApiError.invalid(
                        "Binding", "", field="metadata.name", why="Required value: the pod's name"
                    )
                objects.bind(pods, pod_name, body=body, namespace=ns)
                return _json(status_body(code=201, message=""), 201)
            if name is None:
                return self._answer(request, res, obj=objects.create(res, body, namespace=ns), status=201)
            if target.sub == "binding":
                objects.bind(res, name, body=body, namespace=ns)
                return _json(status_body(code=201, message=""), 201)
            if target.sub == "eviction":
                objects.evict(res, name, namespace=ns)
                return _json(status_body(code=201, message=""), 201)
            raise ApiError(405, f"POST is not allowed on {request.path}", reason="MethodNotAllowed")
        if name is None:
            if verb == "deletecollection":
                return _json(self._delete_collection(request, res, namespace=ns, body=body))
            raise ApiError(405, f"{request.method} is not allowed on a collection", reason="MethodNotAllowed")
        if target.sub not in (None, "status"):
            raise ApiError(
                405, f"{request.method} is not allowed on {request.path}", reason="MethodNotAllowed"
            )
        status = target.sub == "status"
        # the field manager of managedFields: the request's, else (not for an apply) its User-Agent's
        manager = q.get("fieldManager") or manager_from_user_agent(request.headers.get("User-Agent", ""))
        if verb == "update":
            return self._answer(
                request,
                res,
                obj=objects.replace(res, name, body=body, namespace=ns, status=status, manager=manager),
            )
        if verb == "patch":
            apply = request.content_type == APPLY
            created = apply and objects.storage.get(res.key, name, namespace=ns or "") is None
            obj = objects.patch(
                res,
                name,
                patch=body,
                content_type=request.content_type,
                namespace=ns,
                status=status,
                manager=q.get("fieldManager") if apply else manager,
                force=_truthy(q.get("force")),
            )
            return self._answer(request, res, obj=obj, status=201 if created else 200)
        options = body if isinstance(body, dict) else {}
        if "propagationPolicy" in q:
            options = {**options, "propagationPolicy": q["propagationPolicy"]}
        return self._answer(request, res, obj=objects.delete(res, name, namespace=ns, options=options))

    def _delete_collection(
        self, request: web.Request, res: Resource, *, namespace: str | None, body: Any
    ) -> dict[str, Any]:
        listed = self.server.objects.list(res, namespace=namespace, match=self._match(request, res))
        options = body if isinstance(body, dict) else {}
        gone = []
        for obj in listed["items"]:
            meta = obj.get("metadata") or {}
            try:
                gone.append(
                    self.server.objects.delete(
                        res, meta.get("name", ""), namespace=meta.get("namespace"), options=options
                    )
                )
            except ApiError as exc:
                if exc.code != 404:
                    raise
        return {**listed, "items": gone}


def build_app(server: FakeApiServer) -> web.Application:
    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", Handler(server).handle)
    return app
