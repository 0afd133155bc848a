"""Kubernetes-shaped errors of the test API server: a `Status` object with the HTTP code.

Every handler in this package raises `ApiError`; the HTTP layer (`routes.py`) renders it as the
`v1 Status` body real API servers send, so clients (kubectl, kubernetes-asyncio) report it as
they would a real cluster's answer (`Error from server (NotFound): pods "x" not found`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ApiError", "status_body"]

_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    504: "Timeout",
}


class ApiError(Exception):
    """An answer other than success: HTTP `code`, a Kubernetes `reason` and a message."""

    def __init__(
        self, code: int, message: str, *, reason: str | None = None, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or _REASONS.get(code, "Unknown")
        self.details = details

    def body(self) -> dict[str, Any]:
        return status_body(code=self.code, message=self.message, reason=self.reason, details=self.details)

    @classmethod
    def not_found(cls, plural: str, name: str, *, group: str = "") -> ApiError:
        return cls(
            404,
            f'{plural}{"." + group if group else ""} "{name}" not found',
            details={"name": name, "group": group, "kind": plural},
        )

    @classmethod
    def already_exists(cls, plural: str, name: str, *, group: str = "") -> ApiError:
        return cls(
            409,
            f'{plural}{"." + group if group else ""} "{name}" already exists',
            reason="AlreadyExists",
            details={"name": name, "group": group, "kind": plural},
        )

    @classmethod
    def conflict(cls, plural: str, name: str, *, group: str = "", why: str | None = None) -> ApiError:
        what = f'{plural}{"." + group if group else ""} "{name}"'
        return cls(
            409,
            f"Operation cannot be fulfilled on {what}: "
            + (
                why
                or "the object has been modified; please apply your changes to the latest version and try again"
            ),
            reason="Conflict",
            details={"name": name, "group": group, "kind": plural},
        )

    @classmethod
    def invalid(cls, kind: str, name: str, *, field: str, why: str) -> ApiError:
        return cls(
            422,
            f'{kind} "{name}" is invalid: {field}: {why}',
            reason="Invalid",
            details={"name": name, "kind": kind, "causes": [{"field": field, "message": why}]},
        )

    @classmethod
    def bad_request(cls, message: str) -> ApiError:
        return cls(400, message, reason="BadRequest")

    @classmethod
    def gone(cls, message: str) -> ApiError:
        return cls(410, message, reason="Expired")


def status_body(
    *, code: int, message: str, reason: str | None = None, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A `v1 Status`: Failure for codes >= 400, Success below."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure" if code >= 400 else "Success",
        "message": message,
        "code": code,
    }
    if code >= 400:
        body["reason"] = reason or _REASONS.get(code, "Unknown")
    if details:
        body["details"] = details
    return body
