"""A thin REST layer over `kubernetes_asyncio`'s `ApiClient` for any `ApiResource`.

The Kubernetes backend's informers and writer speak to the API server only through
:class:`KubeClient`: LIST, WATCH (a stream of raw events), GET, POST, PUT, merge PATCH (of the
object or a subresource), DELETE and `pods/binding`. URLs come from
`gpuyard.apis.resources.ApiResource`; bodies are plain JSON dicts (the callers convert to and from
the `apis/` models). LIST comes in pages (`paging.py`, as client-go's pager). LIST and WATCH take a namespace and a label selector, so an informer can watch
a part of a resource (Events labelled `job-name`, Leases in `kube-node-lease`). Kubernetes errors become gpuyard's: 404 :class:`NotFound`, 409
:class:`AlreadyExists` (on create) or :class:`Conflict`, 410 :class:`Gone`, anything else (5xx,
timeouts, a refused connection, 4xx such as 403/422) :class:`ApiError`, a
:class:`~gpuyard.state.backend.BackendError` with the HTTP status.

Every POST, PUT and PATCH carries the writing component's identity as `fieldManager`
(`gpuyard.state.writing.writer_identity`, e.g. `gpuyard-scheduler`), so the API server's
`managedFields` name the component that owns each field (`gpuyard.state.ownership`).

`connect()` loads the kubeconfig the way kubectl does: the given file (or `$KUBECONFIG`), else
the in-cluster service account, else `~/.kube/config`.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException

from gpuyard.apis.resources import ApiResource, resource_for
from gpuyard.kubecluster.paging import DEFAULT_PAGE_SIZE, Page, list_pages
from gpuyard.state.backend import BackendError
from gpuyard.state.store import AlreadyExists, Conflict, Gone, NotFound
from gpuyard.state.writing import writer_identity

__all__ = ["ApiError", "Json", "KubeClient", "WatchSilent", "load_configuration", "status_of"]

Json = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
_FIELD_MANAGED = ("POST", "PUT", "PATCH")  # the verbs that take `fieldManager`


class ApiError(BackendError):
    """The API server refused or failed a request (`status` 0: no answer at all)."""

    def __init__(self, message: str, *, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class WatchSilent(ApiError):
    """A watch stream sent nothing (no event, no bookmark) for longer than the inactivity timeout."""


async def load_configuration(
    *, kubeconfig: str | None, context: str | None, what: str = "backend.kubernetes.kubeconfig"
) -> Configuration:
    """The client configuration: `kubeconfig` (else `$KUBECONFIG`), else in-cluster, else
    `~/.kube/config`. Raises :class:`ApiError` naming what was tried when none can be loaded
    (`what`: how the caller's user names the kubeconfig, a setting or a CLI option)."""
    conf = Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    if path is not None:
        first = path.split(os.pathsep)[0]
        try:
            await kube_config.load_kube_config(
                config_file=first, context=context, client_configuration=conf, persist_config=False
            )
        except (OSError, kube_config.ConfigException) as exc:
            raise ApiError(f"{what}: cannot load {first}: {exc}") from None
        return conf
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            kube_config.load_incluster_config(client_configuration=conf)
            return conf
        except kube_config.ConfigException as exc:
            raise ApiError(f"in-cluster config: {exc}") from None
    try:
        await kube_config.load_kube_config(context=context, client_configuration=conf, persist_config=False)
    except (OSError, kube_config.ConfigException) as exc:
        option = what if what.startswith("--") else f"{what} (--kubeconfig)"
        raise ApiError(
            f"no kubeconfig: set {option} or $KUBECONFIG, or run in a pod with a service account ({exc})"
        ) from None
    return conf


def status_of(body: bytes | str) -> tuple[str, str]:
    """(reason, message) of a Kubernetes error answer: its `Status` body's, else ("", its text)."""
    try:
        data = json.loads(body) if body else {}
    except ValueError:
        return "", body.decode(errors="replace") if isinstance(body, bytes) else body
    if isinstance(data, dict):
        return str(data.get("reason") or ""), str(data.get("message") or "")
    return "", ""


def _error(status: int, body: bytes | str, *, what: str, creating: bool = False) -> Exception:
    """The gpuyard error for a Kubernetes error answer (a `Status` body when it has one)."""
    reason, message = status_of(body)
    text = f"{what}: {status} {reason}: {message}".rstrip(": ")
    if status == 404:
        return NotFound(text)
    if status == 409:
        return AlreadyExists(text) if creating or reason == "AlreadyExists" else Conflict(text)
    if status == 410:
        return Gone(text)
    return ApiError(text, status=status, reason=reason)


class KubeClient:
    """REST calls on `ApiResource`s; see the module docstring."""

    def __init__(self, api: ApiClient, *, request_timeout: float = 30.0) -> None:
        self.api = api
        self.request_timeout = request_timeout

    @classmethod
    async def connect(
        cls, *, kubeconfig: str | None = None, context: str | None = None, request_timeout: float = 30.0
    ) -> KubeClient:
        conf = await load_configuration(kubeconfig=kubeconfig, context=context)
        return cls(ApiClient(configuration=conf), request_timeout=request_timeout)

    @property
    def host(self) -> str:
        return str(self.api.configuration.host)

    async def close(self) -> None:
        await self.api.close()

    # --- raw requests --------------------------------------------------------------------------

    async def _open(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Json | None = None,
        content_type: str = "application/json",
        timeout: aiohttp.ClientTimeout | float | None = None,
    ) -> Any:
        """Send a request; the open response (an aiohttp `ClientResponse`)."""
        try:
            return await self.api.call_api(
                path,
                method,
                query_params=list((query or {}).items()),
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout if timeout is not None else self.request_timeout,
            )
        except ApiException as exc:  # raised by the auth refresh, not by an answer
            raise ApiError(f"{method} {path}: {exc.reason}", status=exc.status or 0) from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ApiError(f"{method} {path}: {type(exc).__name__}: {exc}") from None

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Json | None = None,
        content_type: str = "application/json",
        creating: bool = False,
    ) -> Json:
        """One request answered with JSON; a non-2xx answer raises the mapped error. A write
        carries the writing component's identity as `fieldManager` (unless `query` names one)."""
        manager = writer_identity()
        if manager and method in _FIELD_MANAGED and "fieldManager" not in (query or {}):
            query = {**(query or {}), "fieldManager": manager}
        resp = await self._open(method, path, query=query, body=body, content_type=content_type)
        try:
            data = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApiError(f"{method} {path}: {type(exc).__name__}: {exc}") from None
        finally:
            resp.release()
        if not 200 <= resp.status <= 299:
            raise _error(resp.status, data, what=f"{method} {path}", creating=creating)
        try:
            out = json.loads(data) if data else {}
        except ValueError:
            raise ApiError(f"{method} {path}: the answer is not JSON", status=resp.status) from None
        return out if isinstance(out, dict) else {}

    # --- verbs ---------------------------------------------------------------------------------

    async def list_page(
        self,
        res: ApiResource,
        *,
        namespace: str | None = None,
        selector: str | None = None,
        limit: int | None = None,
        token: str | None = None,
    ) -> tuple[list[Json], str, str]:
        """One LIST request: (items, the list's resourceVersion, the `continue` token or "").
        `limit` None asks for everything at once. An expired `token` raises `Gone`."""
        query: dict[str, str] = {}
        if limit is not None:
            query["limit"] = str(limit)
        if token:
            query["continue"] = token
        if selector:
            query["labelSelector"] = selector
        data = await self.request("GET", res.path(namespace=namespace), query=query)
        items: list[Json] = data.get("items") or []
        meta = data.get("metadata") or {}
        api_version, kind = res.api_version, res.wire_kind
        for item in items:  # list items come without apiVersion and kind
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return items, str(meta.get("resourceVersion") or ""), str(meta.get("continue") or "")

    def pages(
        self,
        res: ApiResource,
        *,
        namespace: str | None = None,
        selector: str | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> AsyncIterator[Page]:
        """The pages of one LIST of `res` (`paging.list_pages`: `limit` / `continue`, restarted
        when a token expires, then one full list)."""

        async def fetch(limit: int | None, token: str | None) -> tuple[list[Json], str, str]:
            return await self.list_page(res, namespace=namespace, selector=selector, limit=limit, token=token)

        return list_pages(fetch, page_size=page_size, what=res.plural)

    async def list(
        self,
        res: ApiResource,
        *,
        namespace: str | None = None,
        selector: str | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> tuple[list[Json], str]:
        """Every object of `res` (in `namespace`) and the list's resourceVersion, gathered from
        :meth:`pages` (a restarted list's earlier pages are dropped)."""
        items: list[Json] = []
        rv = ""
        async for page in self.pages(res, namespace=namespace, selector=selector, page_size=page_size):
            if page.restarted:
                items = []
            items += page.items
            rv = page.resource_version
        return items, rv

    async def watch(
        self,
        res: ApiResource,
        *,
        resource_version: str,
        timeout_seconds: float,
        inactivity: float,
        opened: Callable[[], None] | None = None,
        namespace: str | None = None,
        selector: str | None = None,
    ) -> AsyncIterator[Json]:
        """The raw events (`{"type", "object"}`) of one WATCH request from `resource_version`
        (of the objects in `namespace` matching the label `selector`, when given), bookmarks
        included, until the server ends the stream; `opened()` is called once the server has
        accepted the request.

        Raises :class:`Gone` on a 410 (answer or ERROR event), :class:`WatchSilent` when nothing
        arrives for `inactivity` seconds, :class:`ApiError` on any other failure.
        """
        query = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(max(1, int(timeout_seconds))),
        }
        if resource_version:
            query["resourceVersion"] = resource_version
        if selector:
            query["labelSelector"] = selector
        path = res.path(namespace=namespace)
        timeout = aiohttp.ClientTimeout(total=None, connect=self.request_timeout)
        resp = await self._open("GET", path, query=query, timeout=timeout)
        try:
            if not 200 <= resp.status <= 299:
                raise _error(resp.status, await resp.read(), what=f"WATCH {path}")
            if opened is not None:
                opened()
            while True:
                try:
                    async with asyncio.timeout(inactivity):
                        line = await resp.content.readline()
                except TimeoutError:
                    raise WatchSilent(f"WATCH {path}: nothing for {inactivity:g}s") from None
                except aiohttp.ClientError as exc:
                    raise ApiError(f"WATCH {path}: {type(exc).__name__}: {exc}") from None
                if not line:
                    return  # the server ended the stream (timeoutSeconds): watch again
                line = line.strip()
                if not line:
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    raise ApiError(f"WATCH {path}: a line that is not JSON") from None
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    raise _error(int(status.get("code") or 500), json.dumps(status), what=f"WATCH {path}")
                yield event
        finally:
            resp.release()

    async def get(self, res: ApiResource, namespace: str, name: str) -> Json:
        return await self.request("GET", res.path(namespace=namespace, name=name))

    async def create(self, res: ApiResource, body: Json) -> Json:
        ns = (body.get("metadata") or {}).get("namespace") or None
        return await self.request("POST", res.path(namespace=ns), body=body, creating=True)

    async def replace(self, res: ApiResource, body: Json) -> Json:
        meta = body.get("metadata") or {}
        path = res.path(namespace=meta.get("namespace") or None, name=meta["name"])
        return await self.request("PUT", path, body=body)

    async def patch(
        self, res: ApiResource, namespace: str, name: str, patch: Json, *, sub: str | None = None
    ) -> Json:
        """A JSON merge patch of the object, or of its subresource `sub` (`status`)."""
        path = res.path(namespace=namespace or None, name=name, sub=sub)
        return await self.request("PATCH", path, body=patch, content_type=MERGE_PATCH)

    async def delete(
        self,
        res: ApiResource,
        namespace: str,
        name: str,
        *,
        resource_version: str | None = None,
        uid: str | None = None,
        grace_period: int | None = None,
    ) -> Json:
        """DELETE one object; `grace_period=0` is a kubelet's final delete of a pod (no waiting).
        `resource_version` and `uid` are preconditions: the server answers 409 when the object it
        holds under that name is another."""
        body: Json | None = None
        preconditions = {
            k: v for k, v in (("resourceVersion", resource_version), ("uid", uid)) if v is not None
        }
        if preconditions or grace_period is not None:
            body = {"apiVersion": "v1", "kind": "DeleteOptions"}
            if preconditions:
                body["preconditions"] = preconditions
            if grace_period is not None:
                body["gracePeriodSeconds"] = grace_period
        return await self.request("DELETE", res.path(namespace=namespace or None, name=name), body=body)

    async def bind(self, namespace: str, name: str, node: str, *, uid: str | None = None) -> None:
        """Bind a pod to `node` through the `pods/binding` subresource (as kube-scheduler does)."""
        pods = resource_for("Pod")
        meta: Json = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self.request("POST", pods.path(namespace=namespace, name=name, sub="binding"), body=body)
