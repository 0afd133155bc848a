"""One error shape for every 4xx/5xx answer.

`{"error": {"code": 422, "message": "...", "details": [{"field": "spec.x", "reason": "..."}]}}`
Handlers raise :class:`ApiError`; the middleware in `app.py` renders it (and turns anything
unexpected into a 500 without a stack trace).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiohttp import web
from pydantic import ValidationError

__all__ = ["ApiError", "details_from_validation", "error_response"]


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, details: Iterable[dict[str, str]] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.details = list(details)


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
