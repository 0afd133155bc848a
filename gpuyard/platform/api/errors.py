"""One error shape for every 4xx/5xx answer.

`{"error": {"code": 422, "message": "...", "details": [{"field": "spec.x", "reason": "..."}]}}`
Handlers raise :class:`ApiError`; the middleware in `app.py` renders it (a write the backend
failed through :func:`cluster_refusal`), and turns anything unexpected into a 500 without a
stack trace.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from gpuyard.state.backend import BackendError

__all__ = ["ApiError", "cluster_refusal", "details_from_validation", "error_response"]


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, details: Iterable[dict[str, str]] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.details = list(details)


def cluster_refusal(exc: BackendError, *, note: str = "") -> ApiError:
    """The answer to a write the backend failed: 422 when the cluster refused the object itself
    (its API server answered 400 or 422: a CRD schema, an admission webhook), 503 when it did not
    answer (or this replica may not write: a standby), else 502 (the cluster refused gpuyard's
    write, e.g. 403 when its ClusterRole was narrowed). `note` is added to the message."""
    status = exc.status
    if status in (400, 422):
        code, what = 422, "the cluster refused the object"
    elif status == 0:
        code, what = 503, "the cluster did not take the write"
    else:
        code, what = 502, "the cluster refused the write"
    reason = f"the Kubernetes API server answered HTTP {status}" if status else "no answer from the cluster"
    return ApiError(code, f"{what}: {exc}{note}", details=[{"field": "cluster", "reason": reason}])


def error_response(status: int, message: str, details: list[dict[str, str]] | None = None) -> web.Response:
    body: dict[str, Any] = {"error": {"code": status, "message": message, "details": details or []}}
    return web.json_response(body, status=status)


def details_from_validation(exc: ValidationError, *, prefix: str = "") -> list[dict[str, str]]:
    """`[{"field": "spec.replicas", "reason": "..."}]` from a pydantic error."""
    out = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"])
        if prefix:
            path = f"{prefix}.{path}" if path else prefix
        reason = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        out.append({"field": path, "reason": reason})
    return out
