"""`GET /api/v1/namespaces/{ns}/pods/{name}/log`: the pod's log, from the kubelet of its node.

As the real API server does (`pkg/registry/core/pod/strategy.go` `LogLocation`), it checks the
container (given, else the pod's only one), finds the pod's node, picks the node's address by the
kube-apiserver's default `--kubelet-preferred-address-types` (Hostname, InternalDNS, InternalIP,
ExternalDNS, ExternalIP) and its kubelet port (`status.daemonEndpoints.kubeletEndpoint.Port`, else
10250), and streams what the kubelet answers at
`https://ADDRESS:PORT/containerLogs/{ns}/{pod}/{container}` (the options `follow`, `tailLines`,
`timestamps`, `previous`, `sinceSeconds`, `limitBytes` passed on) without checking the kubelet's
certificate, as kube-apiserver does without `--kubelet-certificate-authority`. `gpuyard fake-nodes`
serves that port for its nodes.

Errors as the real server words them: 400 for a container that is not the pod's (or none named
where the pod has several) and for what the kubelet refuses with 400 (a container waiting to
start), 404 for a missing pod or node, 500 when the kubelet cannot be reached (`dial tcp ...`).
A pod not bound to a node has an empty log.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import web

from gpuyard.testing.apiserver.catalog import Resource
from gpuyard.testing.apiserver.errors import ApiError

if TYPE_CHECKING:
    from gpuyard.testing.apiserver.server import FakeApiServer

__all__ = ["ADDRESS_TYPES", "KUBELET_PORT", "serve_pod_log"]

ADDRESS_TYPES = ("Hostname", "InternalDNS", "InternalIP", "ExternalDNS", "ExternalIP")
"""kube-apiserver's default `--kubelet-preferred-address-types`, in its order."""
KUBELET_PORT = 10250
"""The port dialled when the node reports none (kube-apiserver's `--kubelet-port`)."""
PASSED_ON = ("follow", "tailLines", "timestamps", "previous", "sinceSeconds", "limitBytes")


def _container(pod: dict[str, Any], asked: str | None) -> str:
    name = (pod.get("metadata") or {}).get("name", "")
    spec = pod.get("spec") or {}
    names = [str(c.get("name", "")) for c in (spec.get("containers") or [])]
    others = [str(c.get("name", "")) for c in (spec.get("initContainers") or [])]
    others += [str(c.get("name", "")) for c in (spec.get("ephemeralContainers") or [])]
    if not asked:
        if len(names) == 1:
            return names[0]
        if not names:
            raise ApiError.bad_request(f"a container name must be specified for pod {name}")
        raise ApiError.bad_request(
            f"a container name must be specified for pod {name}, choose one of: [{' '.join(names)}]"
        )
    if asked not in names + others:
        raise ApiError.bad_request(f"container {asked} is not valid for pod {name}")
    return asked


def kubelet_location(node: dict[str, Any]) -> tuple[str, int]:
    """(address, port) of the node's kubelet, as kube-apiserver picks them."""
    status = node.get("status") or {}
    addresses = status.get("addresses") or []
    for kind in ADDRESS_TYPES:
        for address in addresses:
            if address.get("type") == kind and address.get("address"):
                return str(address["address"]), _port(status)
    name = (node.get("metadata") or {}).get("name", "")
    raise ApiError(500, f"node {name}: no preferred addresses found; known addresses: {addresses}")


def _port(status: dict[str, Any]) -> int:
    endpoint = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")
    return int(endpoint) if isinstance(endpoint, int) and endpoint > 0 else KUBELET_PORT


async def serve_pod_log(
    request: web.Request, server: FakeApiServer, pods: Resource, name: str, namespace: str | None
) -> web.StreamResponse:
    """Answer a pod's log from its node's kubelet (see the module docstring)."""
    pod = server.objects.get(pods, name, namespace=namespace)
    container = _container(pod, request.query.get("container"))
    node_name = (pod.get("spec") or {}).get("nodeName")
    if not node_name:
        return web.Response(body=b"", content_type="text/plain")
    nodes = server.catalog.get("", "v1", "nodes")
    address, port = kubelet_location(server.objects.get(nodes, node_name))
    host = f"[{address}]" if ":" in address else address
    query = {k: request.query[k] for k in PASSED_ON if k in request.query}
    url = f"https://{host}:{port}/containerLogs/{namespace}/{name}/{container}"
    if query:
        url += "?" + urlencode(query)
    follow = request.query.get("follow", "").lower() in ("true", "1")
    timeout = aiohttp.ClientTimeout(total=None if follow else 30.0, connect=10.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        try:
            upstream = await session.get(url, ssl=False)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ApiError(500, f'Get "{url}": dial tcp {host}:{port}: {exc}') from None
        async with upstream:
            if upstream.status >= 300:
                text = (await upstream.text(errors="replace")).strip()
                if upstream.status == 400:
                    raise ApiError.bad_request(text)
                if upstream.status == 404:
                    raise ApiError(404, text, reason="NotFound")
                raise ApiError(500, text or f"the kubelet answered {upstream.status}")
            response = web.StreamResponse(headers={"Content-Type": "text/plain"})
            await response.prepare(request)
            with contextlib.suppress(ConnectionResetError, aiohttp.ClientError):
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            return response
