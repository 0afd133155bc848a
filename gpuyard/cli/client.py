"""A small HTTP client for the gpuyard API, for the CLI's client commands.

Synchronous (`urllib`), no session state: one request per command. Server errors come back as
:class:`ClientError` with a one-line message built from the API's error body
(`{"error": {"code", "message", "details"}}`) and the exit code the CLI must use: 2 for bad input
(4xx), 1 for server or network trouble (5xx, refused connection, timeout).

The server is `--server URL`, else `$GPUYARD_SERVER`, else http://127.0.0.1:8080; a bearer token
comes from `--token` or `$GPUYARD_TOKEN`.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

__all__ = ["DEFAULT_SERVER", "ApiClient", "ClientError", "default_server", "error_line"]

DEFAULT_SERVER = "http://127.0.0.1:8080"


def default_server() -> str:
    return os.environ.get("GPUYARD_SERVER") or DEFAULT_SERVER


class ClientError(Exception):
    """A failed request: `message` is one line; `exit_code` is 2 (bad input) or 1 (server/network)."""

    def __init__(self, message: str, *, exit_code: int, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.status = status


def error_line(status: int, body: bytes) -> str:
    """`<message>: <field>: <reason>; ...` from the API's error body (or the raw text)."""
    try:
        payload = json.loads(body.decode("utf-8", "replace") or "{}")
        err = payload.get("error", {}) if isinstance(payload, dict) else {}
    except ValueError:
        err = {}
    if not err:
        text = body.decode("utf-8", "replace").strip().replace("\n", " ")
        return f"HTTP {status}: {text[:300] or 'no details'}"
    message = str(err.get("message") or f"HTTP {status}")
    details = err.get("details") or []
    parts = [f"{d.get('field', '?')}: {d.get('reason', '')}" for d in details if isinstance(d, dict)]
    return f"{message}: " + "; ".join(parts) if parts else message


class ApiClient:
    def __init__(self, server: str | None = None, *, token: str | None = None, timeout: float = 30.0) -> None:
        self.server = (server or default_server()).rstrip("/")
        self.token = token if token is not None else os.environ.get("GPUYARD_TOKEN")
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        content_type: str | None = None,
        query: dict[str, str | None] | None = None,
    ) -> Any:
        url = self.server + path
        params = {k: v for k, v in (query or {}).items() if v}
        if params:
            url += "?" + urllib.parse.urlencode(params)
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(url, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            data = exc.read()
            code = 2 if 400 <= exc.code < 500 else 1
            raise ClientError(error_line(exc.code, data), exit_code=code, status=exc.code) from None
        except (TimeoutError, urllib.error.URLError, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ClientError(
                f"cannot reach the gpuyard server at {self.server}: {reason}", exit_code=1
            ) from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ClientError(
                f"the server at {self.server} answered with something that is not JSON", exit_code=1
            ) from None

    # --- job endpoints ---------------------------------------------------------------------------

    def submit(self, text: str) -> Any:
        return self.request("POST", "/api/v1/jobs", body=text.encode(), content_type="application/yaml")

    def jobs(
        self, *, namespace: str | None = None, phase: str | None = None, queue: str | None = None
    ) -> Any:
        return self.request(
            "GET", "/api/v1/jobs", query={"namespace": namespace, "phase": phase, "queue": queue}
        )

    def job(self, namespace: str, name: str) -> Any:
        return self.request("GET", f"/api/v1/namespaces/{_q(namespace)}/jobs/{_q(name)}")

    def delete_job(self, namespace: str, name: str) -> Any:
        return self.request("DELETE", f"/api/v1/namespaces/{_q(namespace)}/jobs/{_q(name)}")

    def job_pods(self, namespace: str, name: str) -> Any:
        return self.request("GET", f"/api/v1/namespaces/{_q(namespace)}/jobs/{_q(name)}/pods")

    def job_events(self, namespace: str, name: str) -> Any:
        return self.request("GET", f"/api/v1/namespaces/{_q(namespace)}/jobs/{_q(name)}/events")


def _q(part: str) -> str:
    return urllib.parse.quote(part, safe="")
