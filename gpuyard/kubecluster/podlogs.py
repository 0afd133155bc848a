"""A pod's log on Kubernetes: `GET /api/v1/namespaces/{ns}/pods/{name}/log`, as kubectl reads it.

The API server answers from the kubelet of the pod's node (it proxies to the kubelet's
`/containerLogs/{ns}/{pod}/{container}`; `gpuyard fake-nodes` serves that port for its fake
nodes). :func:`open_pod_log` sends `container`, `follow` and `tailLines` as `kubectl logs
[-f] [--tail N] -c CONTAINER` does, through kubernetes-asyncio's `CoreV1Api`, and yields the
answer line by line as it streams. gpuyard's ServiceAccount needs `get` on `pods/log`
(`gpuyard install` grants it).

A refusal becomes :class:`~gpuyard.kubecluster.client.ApiError` (a `BackendError`) with the API
server's status and message: 400 when the container has not started (`container "x" in pod "y" is
waiting to start: ContainerCreating`) or is not the pod's, 404 when the pod is gone, 403 without
the RBAC, 500 when the API server cannot reach the kubelet (`dial tcp ...: connection refused`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient, CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from gpuyard.kubecluster.client import ApiError, status_of

__all__ = ["MAX_LINE_BYTES", "open_pod_log"]

MAX_LINE_BYTES = 1 << 20
"""A longer line (or output without line ends) is cut into pieces of this size."""


def _refusal(status: int, body: bytes, *, what: str) -> ApiError:
    """The error of a non-2xx answer: the message of its `Status` body (else its text)."""
    reason, message = status_of(body)
    message = message.strip()
    return ApiError(f"{what}: {message or reason or f'HTTP {status}'}", status=status, reason=reason)


async def open_pod_log(
    api: ApiClient,
    namespace: str,
    name: str,
    *,
    container: str,
    follow: bool = False,
    tail_lines: int | None = None,
    timeout: float = 30.0,
) -> AsyncIterator[str]:
    """Open the log of `container` of pod `namespace/name`; the lines it holds (the last
    `tail_lines`), then with `follow` each new one until the kubelet ends the stream (the container
    finished). `timeout`: seconds to connect and, without `follow`, for the whole answer."""
    what = f"GET pods/{name}/log in {namespace}"
    options: dict[str, Any] = {"container": container, "follow": follow}
    if tail_lines is not None:
        options["tail_lines"] = tail_lines
    limit = aiohttp.ClientTimeout(total=None if follow else timeout, connect=timeout)
    try:
        # with _preload_content=False the answer is the open aiohttp response, not the str typed
        resp: Any = await CoreV1Api(api).read_namespaced_pod_log(
            name, namespace, _preload_content=False, _request_timeout=limit, **options
        )
    except ApiException as exc:  # raised before any answer (an expired credential's refresh)
        raise ApiError(f"{what}: {exc.reason}", status=exc.status or 0) from None
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise ApiError(f"{what}: {type(exc).__name__}: {exc}") from None
    if not 200 <= resp.status <= 299:
        try:
            body = await resp.read()
        except (aiohttp.ClientError, TimeoutError):
            body = b""
        finally:
            resp.release()
        raise _refusal(resp.status, body, what=what)
    return _lines(resp, what=what)


async def _lines(resp: Any, *, what: str) -> AsyncIterator[str]:
    """The answer's lines (without their line ends) as they arrive; the response is released when
    the stream ends or the reader stops."""
    buffer = b""
    try:
        async for chunk in resp.content.iter_any():
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for raw in complete:
                yield raw.decode("utf-8", "replace").removesuffix("\r")
            while len(buffer) >= MAX_LINE_BYTES:
                piece, buffer = buffer[:MAX_LINE_BYTES], buffer[MAX_LINE_BYTES:]
                yield piece.decode("utf-8", "replace")
        if buffer:
            yield buffer.decode("utf-8", "replace").removesuffix("\r")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ApiError(f"{what}: the log stream broke: {type(exc).__name__}: {exc}") from None
    finally:
        resp.release()
