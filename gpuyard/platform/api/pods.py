"""Pod endpoints: every pod of the jobs a caller may see, and a pod's log.

* `GET /api/v1/pods?namespace=&job=&limit=&continue=` — pods owned by jobs, paged, each with the
  `summary` of `GET .../jobs/{name}/pods` plus `summary.job` (what `gpuyard get pods` lists).
* `GET /api/v1/namespaces/{ns}/pods/{name}/log?container=&tailLines=&follow=` — the pod's log
  (`gpuyard logs`, the dashboard's job page). Without `follow`: JSON, `{"namespace", "name",
  "phase", "container", "containers", "lines", "truncated"}` (at most the last `MAX_LINES` lines;
  `truncated` says that earlier ones were left out). With `follow=true`: `text/plain`, one line
  each, streamed until the container has finished (a pod not started yet is waited for first;
  errors found before the stream opens are the usual JSON errors).

The backend reads the log (:class:`~gpuyard.state.backend.PodLogs`): on the fake cluster its
kubelet's short log per container (start, environment, exit); on Kubernetes the API server's
`pods/log` (the kubelet of the pod's node, `gpuyard fake-nodes` for fake nodes). A backend that
reads no logs answers 501 naming why; a cluster that refuses or cannot reach the kubelet, 502.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from gpuyard.apis.core import Pod
from gpuyard.apis.scheduling import LABEL_JOB_NAME
from gpuyard.platform.api.app import CTX
from gpuyard.platform.api.auth import allowed_namespaces, authorize
from gpuyard.platform.api.errors import ApiError
from gpuyard.platform.api.jobs import pod_view
from gpuyard.platform.api.openapi import Param, operation
from gpuyard.platform.api.paging import PAGING, list_body, paginate
from gpuyard.state.backend import BackendError, PodLogs
from gpuyard.state.store import Gone

__all__ = ["MAX_LINES", "setup"]

MAX_LINES = 10_000
"""The most lines a JSON log answer holds (the last ones; `tailLines` asks for fewer)."""
CHECK_SECONDS = 5.0
"""While a followed log is quiet, how often to look whether its client is still there."""
FINISHED = ("Succeeded", "Failed")


LOG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "namespace": {"type": "string"},
        "name": {"type": "string"},
        "phase": {"type": "string"},
        "container": {"type": "string"},
        "containers": {"type": "array", "items": {"type": "string"}},
        "lines": {"type": "array", "items": {"type": "string"}},
        "truncated": {"type": "boolean"},
    },
}
LIST_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"items": {"type": "array"}}}


def _view(pod: Pod) -> dict[str, Any]:
    out = pod_view(pod)
    out["summary"]["job"] = pod.metadata.labels.get(LABEL_JOB_NAME)
    return out


@operation(
    "Pods of every job the caller may see, with node, host port and GPUs",
    tags=["pods"],
    params=[
        Param("namespace", description="Only this namespace"),
        Param("job", description="Only this job's"),
        *PAGING,
    ],
    response=LIST_SCHEMA,
)
async def list_pods(request: web.Request) -> web.Response:
    store = request.app[CTX].store
    namespace = request.query.get("namespace") or None
    job = request.query.get("job") or None
    if namespace:
        authorize(request, "read", namespace)
    visible = allowed_namespaces(request)
    pods = [
        p
        for p in store.list_of(Pod, namespace=namespace, selector={LABEL_JOB_NAME: job} if job else None)
        if LABEL_JOB_NAME in p.metadata.labels and (visible is None or p.metadata.namespace in visible)
    ]
    pods.sort(key=lambda p: (p.metadata.namespace, p.metadata.name))
    page, token = paginate(request, pods)
    return web.json_response(
        list_body([_view(p) for p in page], next_token=token, resource_version=store.resource_version)
    )


def _log_reader(request: web.Request) -> PodLogs:
    backend = request.app[CTX].backend
    if backend is None:
        raise ApiError(501, "pod logs are not available: no cluster backend is running")
    if not isinstance(backend, PodLogs):
        name = getattr(backend, "name", "this")
        raise ApiError(
            501,
            f"pod logs are not available: the {name} backend reads no pod logs; read the containers' "
            "output with `kubectl logs -n NAMESPACE POD`",
        )
    return backend


def _tail_lines(request: web.Request) -> int | None:
    raw = request.query.get("tailLines")
    if raw is None or raw == "":
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 9:
        raise ApiError(
            400,
            f"tailLines must be a non-negative integer, got {raw[:40]!r}",
            details=[{"field": "tailLines", "reason": "allowed: 0 or more (the last N lines)"}],
        )
    return int(raw)


def _follow(request: web.Request) -> bool:
    raw = (request.query.get("follow") or "false").lower()
    if raw not in ("true", "false", "1", "0"):
        raise ApiError(
            400,
            f"follow must be true or false, got {raw[:40]!r}",
            details=[{"field": "follow", "reason": "allowed: true, false"}],
        )
    return raw in ("true", "1")


def _log_refusal(exc: BackendError, ns: str, name: str) -> ApiError:
    """The answer when the backend could not open the log: the cluster's 400 and 404 as they are
    (the container has not started, the pod is gone), 503 without an answer, else 502 (a cluster
    that refuses gpuyard the log or cannot reach the node's kubelet)."""
    status = exc.status
    if status in (400, 404):
        return ApiError(status, f"pod {ns}/{name}: {exc}")
    if status == 0:
        return ApiError(503, f"pod {ns}/{name}: the log cannot be read now: {exc}")
    if status == 403:
        hint = "; gpuyard's ServiceAccount needs get on pods/log (gpuyard install grants it)"
    else:
        hint = "; the API server reads logs from the kubelet of the pod's node: is it reachable?"
    reason = f"the Kubernetes API server answered HTTP {status}"
    return ApiError(
        502,
        f"pod {ns}/{name}: the cluster did not give the log: {exc}{hint}",
        details=[{"field": "cluster", "reason": reason}],
    )


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def _started(request: web.Request, pod: Pod) -> Pod | None:
    """`pod` once it is no longer Pending (as the store sees it), or None when it was deleted first
    or the client went away."""
    store = request.app[CTX].store
    ns, name = pod.metadata.namespace, pod.metadata.name
    while True:
        since = store.resource_version
        current = store.get_of(Pod, ns, name)
        if current is None or _gone(request):
            return None
        if current.status.phase != "Pending":
            return current
        events = store.watch("Pod", since=since, namespace=ns)
        try:
            while True:
                async with asyncio.timeout(CHECK_SECONDS):
                    event = await anext(events)
                if event.object.metadata.name == name:
                    break
        except (TimeoutError, Gone, StopAsyncIteration):
            pass
        finally:
            await _close(events)


async def _close(lines: AsyncIterator[Any]) -> None:
    close = getattr(lines, "aclose", None)
    if close is not None:
        with contextlib.suppress(Exception):
            await close()


async def _stream(request: web.Request, lines: AsyncIterator[str]) -> web.StreamResponse:
    """Send each line as it comes (`text/plain`), until the log ends or the client goes away."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/plain; charset=utf-8", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    pending: asyncio.Task[str] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(lines))
            done, _ = await asyncio.wait({pending}, timeout=CHECK_SECONDS)
            if not done:
                if _gone(request):
                    break
                continue
            task, pending = pending, None
            try:
                line = task.result()
            except StopAsyncIteration:
                break
            except BackendError:
                break  # the stream broke after it opened: the answer ends here
            await response.write(line.encode() + b"\n")
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
    except ConnectionResetError:
        pass  # the client went away
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        await _close(lines)
    return response


@operation(
    "A pod's log: JSON, or with follow=true a text/plain stream until the container has finished",
    tags=["pods"],
    params=[
        Param("container", description="The container (default: the pod's first)"),
        Param("tailLines", type="integer", minimum=0, description="Only the last N lines"),
        Param(
            "follow",
            type="boolean",
            description="Stream the log as text/plain until the container has finished",
        ),
    ],
    response=LOG_SCHEMA,
    errors=[400, 404, 501, 502, 503],
)
async def pod_log(request: web.Request) -> web.StreamResponse:
    ns, name = request.match_info["ns"], request.match_info["name"]
    authorize(request, "read", ns)
    tail_lines = _tail_lines(request)
    follow = _follow(request)
    pod = request.app[CTX].store.get_of(Pod, ns, name)
    if pod is None:
        raise ApiError(404, f"pod {ns}/{name} not found (gpuyard get pods lists them)")
    reader = _log_reader(request)
    containers = [c.name for c in pod.spec.containers]
    container = request.query.get("container") or (containers[0] if containers else "")
    if container not in containers:
        raise ApiError(
            400,
            f"pod {ns}/{name} has no container {container!r}",
            details=[{"field": "container", "reason": f"allowed: {', '.join(containers) or 'none'}"}],
        )
    if follow:
        if pod.status.phase == "Pending":
            started = await _started(request, pod)
            if started is None:
                raise ApiError(404, f"pod {ns}/{name} was deleted before it started")
            pod = started
        try:
            lines = await reader.pod_log(pod, container=container, follow=True, tail_lines=tail_lines)
        except BackendError as exc:
            raise _log_refusal(exc, ns, name) from None
        return await _stream(request, lines)
    kept: deque[str] = deque(maxlen=MAX_LINES)
    seen = 0
    if pod.status.phase != "Pending":  # a container not started has no log yet
        try:
            lines = await reader.pod_log(pod, container=container, tail_lines=tail_lines)
            try:
                async for line in lines:
                    kept.append(line)
                    seen += 1
            finally:
                await _close(lines)
        except BackendError as exc:
            raise _log_refusal(exc, ns, name) from None
    return web.json_response(
        {
            "namespace": ns,
            "name": name,
            "phase": pod.status.phase,
            "container": container,
            "containers": containers,
            "lines": list(kept),
            "truncated": seen > len(kept),
        }
    )


def setup(app: web.Application) -> None:
    app.router.add_get("/api/v1/pods", list_pods)
    app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}/log", pod_log)
