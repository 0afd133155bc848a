"""Pod endpoints: every pod of the jobs a caller may see, and a pod's log.

* `GET /api/v1/pods?namespace=&job=&limit=&continue=` — pods owned by jobs, paged, each with the
  `summary` of `GET .../jobs/{name}/pods` plus `summary.job` (what `gpuyard get pods` lists).
* `GET /api/v1/namespaces/{ns}/pods/{name}/log?container=` — the pod's log as JSON:
  `{"namespace", "name", "phase", "container", "containers", "lines"}` (`gpuyard logs`). The
  backend keeps it: on the fake cluster its kubelet's short log per container (start, environment,
  exit; :func:`gpuyard.fakecluster.kubelet.container_logs`). A backend that keeps no log answers
  501 naming why (on Kubernetes: `kubectl logs` reads the containers' own output).
"""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web

from gpuyard.apis.core import Pod
from gpuyard.apis.scheduling import LABEL_JOB_NAME
from gpuyard.platform.api.app import CTX
from gpuyard.platform.api.auth import allowed_namespaces, authorize
from gpuyard.platform.api.errors import ApiError
from gpuyard.platform.api.jobs import pod_view
from gpuyard.platform.api.openapi import Param, operation
from gpuyard.platform.api.paging import PAGING, list_body, paginate

__all__ = ["LogSource", "setup"]


class LogSource(Protocol):
    """What keeps pods' logs (the fake cluster's kubelet)."""

    def container_logs(self, pod: Pod) -> dict[str, list[str]]: ...


LOG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "namespace": {"type": "string"},
        "name": {"type": "string"},
        "phase": {"type": "string"},
        "container": {"type": "string"},
        "containers": {"type": "array", "items": {"type": "string"}},
        "lines": {"type": "array", "items": {"type": "string"}},
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


def _log_source(request: web.Request) -> LogSource:
    backend = request.app[CTX].backend
    source = getattr(backend, "kubelet", None)
    if backend is None or not callable(getattr(source, "container_logs", None)):
        name = getattr(backend, "name", None)
        why = (
            f"the {name} backend keeps no pod logs; read the containers' output with "
            "`kubectl logs -n NAMESPACE POD`"
            if name
            else "no cluster backend is running"
        )
        raise ApiError(501, f"pod logs are not available: {why}")
    return source  # type: ignore[return-value]


@operation(
    "A pod's log (the fake cluster's kubelet keeps a short one per container)",
    tags=["pods"],
    params=[Param("container", description="The container (default: the pod's first)")],
    response=LOG_SCHEMA,
    errors=[404, 501],
)
async def pod_log(request: web.Request) -> web.Response:
    ns, name = request.match_info["ns"], request.match_info["name"]
    authorize(request, "read", ns)
    pod = request.app[CTX].store.get_of(Pod, ns, name)
    if pod is None:
        raise ApiError(404, f"pod {ns}/{name} not found (gpuyard get pods lists them)")
    logs = _log_source(request).container_logs(pod)
    containers = [c.name for c in pod.spec.containers]
    container = request.query.get("container") or (containers[0] if containers else "")
    if container not in logs:
        raise ApiError(
            400,
            f"pod {ns}/{name} has no container {container!r}",
            details=[{"field": "container", "reason": f"allowed: {', '.join(containers) or 'none'}"}],
        )
    return web.json_response(
        {
            "namespace": ns,
            "name": name,
            "phase": pod.status.phase,
            "container": container,
            "containers": containers,
            "lines": logs[container],
        }
    )


def setup(app: web.Application) -> None:
    app.router.add_get("/api/v1/pods", list_pods)
    app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}/log", pod_log)
