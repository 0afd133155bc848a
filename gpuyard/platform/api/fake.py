"""Fault injection (HTTP): lose and recover nodes, fail GPUs, crash pods, fail pod creations.

`POST /api/v1/fake/nodes/{name}:fail`, `.../{name}:recover`, `.../{name}/gpus/{idx}:fail`,
`.../{name}/gpus/{idx}:recover`, `POST /api/v1/fake/pods/{ns}/{name}:crash?exitCode=137&reason=OOMKilled`,
`POST /api/v1/fake/pods:failNextCreates?count=N`.
The routes ask the backend's `faults` (the :class:`~gpuyard.state.backend.FaultInjector`
protocol); a backend that cannot inject faults (a real cluster) answers 501 naming why. An
unknown action answers 422 naming the allowed ones.
"""

from __future__ import annotations

from aiohttp import web

from gpuyard.apis.core import Node
from gpuyard.platform.api.app import CTX, stored
from gpuyard.platform.api.auth import authorize
from gpuyard.platform.api.errors import ApiError
from gpuyard.platform.api.openapi import Param, operation
from gpuyard.state.backend import FaultError, FaultInjector
from gpuyard.state.store import NotFound

__all__ = ["setup"]

CRASH_REASONS = ("Error", "OOMKilled", "Evicted")
MAX_FAILED_CREATES = 1000


def _faults(request: web.Request) -> FaultInjector:
    authorize(request, "admin")
    backend = request.app[CTX].backend
    faults = backend.faults if backend is not None else None
    if faults is None:
        name = backend.name if backend is not None else None
        raise ApiError(
            501,
            f"fault injection is not available: the {name} backend cannot inject faults"
            if name
            else "fault injection is not available: no cluster backend is running",
            details=[{"field": "backend.kind", "reason": "fault injection needs the fake backend"}],
        )
    return faults


def _node(request: web.Request, name: str) -> str:
    stored(request, "Node", "", name, what=f"node {name}")
    return name


def _action(request: web.Request, allowed: tuple[str, ...]) -> str:
    action = request.match_info["action"]
    if action not in allowed:
        raise ApiError(
            422,
            f"unknown action {action!r}; allowed: {', '.join(allowed)}",
            details=[{"field": "action", "reason": f"allowed: {', '.join(allowed)}"}],
        )
    return action


@operation(
    "Fail or recover a node (fake backend; action: fail | recover)", tags=["fake"], errors=[404, 422, 501]
)
async def node_action(request: web.Request) -> web.Response:
    faults = _faults(request)
    action = _action(request, ("fail", "recover"))
    name = _node(request, request.match_info["name"])
    if action == "fail":
        failed = await faults.fail_node(name)
        return web.json_response({"node": name, "ready": False, "podsFailed": failed})
    await faults.recover_node(name)
    return web.json_response({"node": name, "ready": True})


def _gpu_index(request: web.Request, node: str, raw: str) -> int:
    try:
        index = int(raw)
    except ValueError:
        raise ApiError(
            422,
            f"GPU index {raw!r} is not a number",
            details=[{"field": "idx", "reason": "must be an integer"}],
        ) from None
    count = int(request.app[CTX].store.must_get_of(Node, "", node).status.capacity.get("nvidia.com/gpu", 0))
    if not 0 <= index < count:
        raise ApiError(
            422,
            f"node {node} has GPUs 0..{count - 1}",
            details=[{"field": "idx", "reason": f"must be in 0..{count - 1}"}],
        )
    return index


@operation(
    "Fail or recover one GPU (fake backend; action: fail | recover)", tags=["fake"], errors=[404, 422, 501]
)
async def gpu_action(request: web.Request) -> web.Response:
    faults = _faults(request)
    action = _action(request, ("fail", "recover"))
    node = _node(request, request.match_info["name"])
    index = _gpu_index(request, node, request.match_info["idx"])
    if action == "fail":
        failed = await faults.fail_gpu(node, index)
        return web.json_response({"node": node, "gpu": index, "healthy": False, "podsFailed": failed})
    await faults.recover_gpu(node, index)
    return web.json_response({"node": node, "gpu": index, "healthy": True})


@operation(
    "Crash a pod (fake backend; action: crash)",
    tags=["fake"],
    params=[Param("exitCode", type="integer"), Param("reason", description="Error | OOMKilled | Evicted")],
    errors=[404, 409, 422, 501],
)
async def pod_action(request: web.Request) -> web.Response:
    faults = _faults(request)
    _action(request, ("crash",))
    ns, name = request.match_info["ns"], request.match_info["name"]
    exit_code = None
    raw = request.query.get("exitCode")
    if raw is not None:
        try:
            exit_code = int(raw)
        except ValueError:
            raise ApiError(
                422,
                "exitCode must be an integer",
                details=[{"field": "exitCode", "reason": "must be an integer 0-255"}],
            ) from None
        if not 0 <= exit_code <= 255:
            raise ApiError(
                422,
                "exitCode must be in 0..255",
                details=[{"field": "exitCode", "reason": "must be an integer 0-255"}],
            )
    reason = request.query.get("reason")
    if reason is not None and reason not in CRASH_REASONS:
        raise ApiError(
            422,
            f"unknown reason {reason!r}",
            details=[{"field": "reason", "reason": f"allowed: {', '.join(CRASH_REASONS)}"}],
        )
    try:
        pod = await faults.crash_pod(ns, name, exit_code=exit_code, reason=reason)
    except NotFound:
        raise ApiError(404, f"pod {ns}/{name} not found") from None
    except FaultError as exc:
        raise ApiError(409, str(exc)) from None
    return web.json_response(
        {
            "pod": f"{ns}/{name}",
            "phase": pod.status.phase,
            "exitCode": pod.status.exit_code,
            "reason": pod.status.reason,
        }
    )


@operation(
    "Make the next pod creations fail (fake backend; action: failNextCreates)",
    tags=["fake"],
    params=[Param("count", type="integer", description=f"1..{MAX_FAILED_CREATES}, default 1")],
    errors=[422, 501],
)
async def creates_action(request: web.Request) -> web.Response:
    faults = _faults(request)
    _action(request, ("failNextCreates",))
    raw = request.query.get("count", "1")
    try:
        count = int(raw)
    except ValueError:
        count = 0
    if not 1 <= count <= MAX_FAILED_CREATES:
        raise ApiError(
            422,
            f"count must be an integer in 1..{MAX_FAILED_CREATES}, not {raw!r}",
            details=[{"field": "count", "reason": f"must be an integer 1-{MAX_FAILED_CREATES}"}],
        )
    faults.fail_next_creates(count)
    return web.json_response({"failNextCreates": count})


def setup(app: web.Application) -> None:
    app.router.add_post("/api/v1/fake/nodes/{name:[^/:]+}:{action}", node_action)
    app.router.add_post("/api/v1/fake/nodes/{name:[^/:]+}/gpus/{idx:[^/:]+}:{action}", gpu_action)
    app.router.add_post("/api/v1/fake/pods/{ns}/{name:[^/:]+}:{action}", pod_action)
    app.router.add_post("/api/v1/fake/pods:{action}", creates_action)
