"""A small HTTP client for the gpuyard API, for the CLI's client commands.

Synchronous (`httpx`, with `httpx-sse` for watches), no session state: one connection per call. Server errors come back as
:class:`ClientError` with a one-line message built from the API's error body
(`{"error": {"code", "message", "details"}}`) and the exit code the CLI must use: 2 for bad input
(4xx), 1 for server or network trouble (5xx, refused connection, timeout).

The server is `--server URL`, else `$GPUYARD_SERVER`, else `server:` in the config file, else
http://127.0.0.1:8080; a bearer token comes from `--token`, else `$GPUYARD_TOKEN`, else `token:` in
the config file. The config file is `$GPUYARD_CONFIG` or `~/.config/gpuyard/config.yaml`:

    server: http://gpuyard.example:8080
    token: s3cr3t

`stream()` follows a Server-Sent Events watch and yields `(event, data)` pairs. Lists are fetched
whole (`list_all`): pages of `chunk_size` items, following `metadata.continue`. `Warning` headers
of the answers (e.g. `299 - "unknown field \"spec.bogusField\""`) are collected in `warnings`, for
the CLI to print.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import yaml

__all__ = [
    "DEFAULT_SERVER",
    "ApiClient",
    "ClientError",
    "config_path",
    "default_server",
    "default_token",
    "error_line",
    "load_client_config",
    "normalize_server",
    "warning_text",
]

DEFAULT_SERVER = "http://127.0.0.1:8080"
DEFAULT_CHUNK_SIZE = 500  # the server's default page size
MAX_PAGES = 10_000  # a list longer than this many pages is a server fault, not data
FIELD_VALIDATION = ("strict", "warn", "ignore")  # `--validate`, sent as ?fieldValidation=Strict|Warn|Ignore


def config_path() -> Path:
    return Path(os.environ.get("GPUYARD_CONFIG") or Path.home() / ".config" / "gpuyard" / "config.yaml")


def load_client_config() -> dict[str, str]:
    """`server` and `token` from the client config file; {} when there is none.

    A file that exists but is not a mapping of strings is bad input (exit code 2)."""
    path = config_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ClientError(f"{path}: cannot read: {exc.strerror or exc}", exit_code=2) from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ClientError(f"{path}: not valid YAML: {getattr(exc, 'problem', exc)}", exit_code=2) from None
    if not isinstance(data, dict):
        raise ClientError(f"{path}: expected a mapping with server and token", exit_code=2)
    out = {}
    for key in ("server", "token"):
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise ClientError(f"{path}: {key}: expected a string", exit_code=2)
        if value:
            out[key] = value
    unknown = sorted(set(data) - {"server", "token"})
    if unknown:
        raise ClientError(f"{path}: unknown keys {unknown}; allowed: server, token", exit_code=2)
    return out


def default_server() -> str:
    env = os.environ.get("GPUYARD_SERVER")
    if env:
        return env
    try:
        return load_client_config().get("server") or DEFAULT_SERVER
    except ClientError:
        return DEFAULT_SERVER


def default_token() -> str | None:
    return os.environ.get("GPUYARD_TOKEN") or load_client_config().get("token")


class ClientError(Exception):
    """A failed request: `message` is one line; `exit_code` is 2 (bad input) or 1 (server/network)."""

    def __init__(
        self,
        message: str,
        *,
        exit_code: int,
        status: int | None = None,
        summary: str | None = None,
        details: list[tuple[str, str]] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.status = status
        self.summary = summary if summary is not None else message
        """The API error's message without its details."""
        self.details = details or []
        """(field, reason) of every detail the server sent, in its order."""


def error_parts(status: int, body: bytes) -> tuple[str, list[tuple[str, str]]]:
    """The API error body's message and every (field, reason) of its details (or the raw text)."""
    try:
        payload = json.loads(body.decode("utf-8", "replace") or "{}")
        err = payload.get("error", {}) if isinstance(payload, dict) else {}
    except ValueError:
        err = {}
    if not isinstance(err, dict) or not err:
        text = body.decode("utf-8", "replace").strip().replace("\n", " ")
        return f"HTTP {status}: {text[:300] or 'no details'}", []
    message = str(err.get("message") or f"HTTP {status}")
    raw = err.get("details")
    details = [
        (str(d.get("field", "?")), str(d.get("reason", "")))
        for d in (raw if isinstance(raw, list) else [])
        if isinstance(d, dict)
    ]
    return message, details


def join_error(message: str, details: list[tuple[str, str]]) -> str:
    """`<message>: <field>: <reason>; <field>: <reason>; ...`: one line with every detail.

    A detail whose reason the message already says is not said twice: its field is put in front
    of the reason where the message says it (`spec.x: PriorityClass 'nope' does not exist;
    nothing was changed`)."""
    parts = []
    for field, reason in details:
        at = _said_at(message, reason)
        if at >= 0:
            if not message[:at].endswith(f"{field}: "):
                message = f"{message[:at]}{field}: {message[at:]}"
            continue
        parts.append(f"{field}: {reason}")
    return f"{message}: " + "; ".join(parts) if parts else message


def _said_at(message: str, reason: str) -> int:
    """Where `message` says `reason` as a clause of its own (between `; ` / `: ` and `;` / `:` or
    the end), or -1."""
    if not reason:
        return -1
    start = 0
    while (at := message.find(reason, start)) >= 0:
        end = at + len(reason)
        before_ok = at == 0 or message[:at].endswith(("; ", ": "))
        after_ok = end == len(message) or message[end] in ";:"
        if before_ok and after_ok:
            return at
        start = at + 1
    return -1


API_PATH_SUFFIXES = ("/api/v1", "/api")
"""Paths people paste with the server URL (`http://host:8080/api/v1`); the client adds them itself."""


def normalize_server(url: str) -> str:
    """The server URL the client wants (`http://HOST:PORT`, a proxy's path prefix kept): a scheme
    is added to `host:port`, the API path (`/api/v1`) and trailing slashes are dropped."""
    url = url.strip().rstrip("/")
    if url and "://" not in url:
        url = f"http://{url}"
    for suffix in API_PATH_SUFFIXES:
        if url.endswith(suffix):
            url = url[: -len(suffix)].rstrip("/")
            break
    return url


TOKEN_HINT = "pass --token TOKEN or set GPUYARD_TOKEN (or `token:` in the client config file {path})"
START_HINT = (
    "start one with `gpuyard demo` (or `gpuyard serve`), or name yours with --server URL or GPUYARD_SERVER"
)


def hint_for(status: int, message: str, *, has_token: bool) -> str:
    """What to do next after an error answer, or "" (a 401: which flag or setting carries a token)."""
    if status == 401:
        if has_token:
            return f"the token was refused: check it ({TOKEN_HINT.format(path=config_path())})"
        return TOKEN_HINT.format(path=config_path())
    return ""


def error_line(status: int, body: bytes) -> str:
    """`<message>: <field>: <reason>; ...` from the API's error body (or the raw text)."""
    return join_error(*error_parts(status, body))


class ApiClient:
    """The gpuyard API over HTTP: one short-lived connection per call, no state between calls."""

    def __init__(
        self,
        server: str | None = None,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
    ) -> None:
        file: dict[str, str] = {}
        self._config_error: ClientError | None = None
        if server is None or token is None:
            try:
                file = load_client_config()
            except ClientError as exc:  # reported by the first request, where the CLI catches it
                self._config_error = exc
        self.server = normalize_server(
            server or os.environ.get("GPUYARD_SERVER") or file.get("server") or DEFAULT_SERVER
        )
        self.token = token if token is not None else (os.environ.get("GPUYARD_TOKEN") or file.get("token"))
        self.timeout = timeout
        self.chunk_size = chunk_size
        self.warnings: list[str] = []
        """The text of every `Warning` header answered so far (Kubernetes' `299 - "text"` form)."""
        """Items per page when a list is fetched whole (`list_all`); the server allows 1..5000."""

    @contextmanager
    def _open(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | None] | None = None,
        accept: str = "application/json",
        body: bytes | None = None,
        content_type: str | None = None,
        timeout: float | httpx.Timeout | None = None,
    ) -> Iterator[httpx.Response]:
        """Send one request and yield its response with the body not yet read (an SSE stream stays open).

        A 4xx/5xx answer, an unreachable server and a malformed server URL become :class:`ClientError`."""
        if self._config_error is not None:
            raise self._config_error
        headers = {"Accept": accept}
        if content_type:
            headers["Content-Type"] = content_type
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        params = {k: v for k, v in (query or {}).items() if v}
        try:
            with httpx.Client(
                timeout=timeout if timeout is not None else self.timeout, follow_redirects=True
            ) as http:
                request = http.build_request(
                    method, self.server + path, params=params, headers=headers, content=body
                )
                response = http.send(request, stream=True)
                try:
                    if response.status_code >= 400:
                        summary, details = error_parts(response.status_code, response.read())
                        hint = hint_for(response.status_code, summary, has_token=bool(self.token))
                        line = join_error(summary, details)
                        raise ClientError(
                            f"{line}; {hint}" if hint else line,
                            exit_code=2 if response.status_code < 500 else 1,
                            status=response.status_code,
                            summary=summary,
                            details=details,
                        )
                    self.warnings += [warning_text(w) for w in response.headers.get_list("Warning")]
                    yield response
                finally:
                    response.close()
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            raise ClientError(
                f"{self.server!r} is not a server URL (http://HOST:PORT): {exc}", exit_code=2
            ) from None
        except httpx.TransportError as exc:
            hint = f"; {START_HINT}" if isinstance(exc, httpx.ConnectError) else ""
            raise ClientError(
                f"cannot reach the gpuyard server at {self.server}: {_reason(exc)}{hint}", exit_code=1
            ) from None

    def stream(
        self, path: str, *, query: Mapping[str, str | None] | None = None
    ) -> Iterator[tuple[str, Any]]:
        """Follow an SSE watch: yield (event type, decoded data) until the server ends the stream.

        Events without data or with data that is not JSON are skipped; a `GONE` event ends the watch."""
        from httpx_sse import EventSource, SSEError

        with self._open(
            "GET", path, query=query, accept="text/event-stream", timeout=max(self.timeout, 60.0)
        ) as response:
            try:
                for sse in EventSource(response).iter_sse():
                    if not sse.data:
                        continue
                    if sse.event == "GONE":
                        return
                    try:
                        data = json.loads(sse.data)
                    except ValueError:
                        continue
                    yield sse.event, data
            except (httpx.TransportError, httpx.StreamError, SSEError) as exc:
                raise ClientError(
                    f"lost the watch stream from {self.server}: {_reason(exc)}", exit_code=1
                ) from None

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        content_type: str | None = None,
        query: Mapping[str, str | None] | None = None,
    ) -> Any:
        """One call: the decoded JSON answer, or None for an empty one."""
        with self._open(method, path, query=query, body=body, content_type=content_type) as response:
            try:
                raw = response.read()
            except (httpx.TransportError, httpx.StreamError) as exc:
                raise ClientError(
                    f"cannot read the answer of {self.server}: {_reason(exc)}", exit_code=1
                ) from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ClientError(
                f"the server at {self.server} answered with something that is not JSON", exit_code=1
            ) from None

    def list_all(self, path: str, *, query: Mapping[str, str | None] | None = None) -> dict[str, Any]:
        """Every item of a paged list route: pages of `chunk_size` items, following `metadata.continue`.

        The answer has the shape of one page: `items` (all of them) and the first page's
        `metadata.resourceVersion` (a watch from it misses nothing that happened while paging)."""
        items: list[Any] = []
        first: dict[str, Any] | None = None
        token: str | None = None
        for _ in range(MAX_PAGES):
            page = self.request(
                "GET", path, query={**(query or {}), "limit": str(self.chunk_size), "continue": token}
            )
            page = page if isinstance(page, dict) else {}
            first = first if first is not None else page
            items += page.get("items", [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
        else:
            raise ClientError(f"{path}: more than {MAX_PAGES} pages; is the server looping?", exit_code=1)
        meta = dict((first or {}).get("metadata") or {})
        meta["continue"] = None
        out = {**(first or {}), "items": items, "metadata": meta}
        return out

    # --- job endpoints ---------------------------------------------------------------------------

    def submit(self, text: str, *, validate: str | None = None) -> Any:
        """Submit job documents; `validate` (strict|warn|ignore) is the server's field validation."""
        return self.request(
            "POST",
            "/api/v1/jobs",
            body=text.encode(),
            content_type="application/yaml",
            query={"fieldValidation": _field_validation(validate)},
        )

    def jobs(
        self, *, namespace: str | None = None, phase: str | None = None, queue: str | None = None
    ) -> Any:
        return self.list_all("/api/v1/jobs", query={"namespace": namespace, "phase": phase, "queue": queue})

    def job(self, namespace: str, name: str) -> Any:
        return self.request("GET", f"/api/v1/namespaces/{_q(namespace)}/jobs/{_q(name)}")

    def patch_job(self, namespace: str, name: str, patch: Mapping[str, Any]) -> Any:
        """A JSON merge patch (RFC 7386) of the job."""
        return self.request(
            "PATCH",
            f"/api/v1/namespaces/{_q(namespace)}/jobs/{_q(name)}",
            body=json.dumps(patch).encode(),
            content_type="application/merge-patch+json",
        )

    def delete_job(self, namespace: str, name: str) -> Any:
        return self.request("DELETE", f"/api/v1/namespaces/{_q(namespace)}/jobs/{_q(name)}")

    def job_pods(self, namespace: str, name: str) -> Any:
        return self.list_all(f"/api/v1/namespaces/{_q(namespace)}/jobs/{_q(name)}/pods")

    def pods(self, *, namespace: str | None = None, job: str | None = None) -> Any:
        """Pods of every job the caller may see (`namespace`, `job` narrow it)."""
        return self.list_all("/api/v1/pods", query={"namespace": namespace, "job": job})

    def pod_log(
        self, namespace: str, name: str, *, container: str | None = None, tail_lines: int | None = None
    ) -> Any:
        """A pod's log: `{"phase", "container", "containers", "lines", "truncated"}`."""
        return self.request(
            "GET",
            f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}/log",
            query={"container": container, "tailLines": None if tail_lines is None else str(tail_lines)},
        )

    def follow_log(
        self, namespace: str, name: str, *, container: str | None = None, tail_lines: int | None = None
    ) -> Iterator[str]:
        """A pod's log line by line as the server streams it (`follow=true`), until the container
        has finished: no read timeout, a quiet container may print nothing for long."""
        query = {
            "container": container,
            "follow": "true",
            "tailLines": None if tail_lines is None else str(tail_lines),
        }
        path = f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}/log"
        timeout = httpx.Timeout(self.timeout, read=None)
        with self._open("GET", path, query=query, accept="text/plain", timeout=timeout) as response:
            try:
                yield from response.iter_lines()
            except (httpx.TransportError, httpx.StreamError) as exc:
                raise ClientError(
                    f"lost the log stream from {self.server}: {_reason(exc)}", exit_code=1
                ) from None

    def job_events(self, namespace: str, name: str) -> Any:
        return self.list_all(f"/api/v1/namespaces/{_q(namespace)}/jobs/{_q(name)}/events")

    # --- cluster endpoints -----------------------------------------------------------------------

    def nodes(self, *, selector: str | None = None) -> Any:
        return self.list_all("/api/v1/nodes", query={"labelSelector": selector})

    def node_usage(self, *, selector: str | None = None) -> Any:
        return self.list_all("/api/v1/usage/nodes", query={"labelSelector": selector})

    def summary(self) -> Any:
        return self.request("GET", "/api/v1/summary")

    def resource_classes(self) -> Any:
        return self.list_all("/api/v1/resourceclasses")

    def reservations(self, *, namespace: str | None = None, node: str | None = None) -> Any:
        return self.list_all("/api/v1/reservations", query={"namespace": namespace, "node": node})

    # --- fault injection (fake backend) ----------------------------------------------------------

    def fault_node(self, name: str, action: str) -> Any:
        return self.request("POST", f"/api/v1/fake/nodes/{_q(name)}:{_q(action)}")

    def fault_gpu(self, node: str, index: int, action: str) -> Any:
        return self.request("POST", f"/api/v1/fake/nodes/{_q(node)}/gpus/{index}:{_q(action)}")

    def crash_pod(
        self, namespace: str, name: str, *, exit_code: int | None = None, reason: str | None = None
    ) -> Any:
        query = {"exitCode": None if exit_code is None else str(exit_code), "reason": reason}
        return self.request("POST", f"/api/v1/fake/pods/{_q(namespace)}/{_q(name)}:crash", query=query)

    def fail_next_creates(self, count: int) -> Any:
        return self.request("POST", "/api/v1/fake/pods:failNextCreates", query={"count": str(count)})


def warning_text(header: str) -> str:
    """The text of a `Warning: 299 - "text"` header (RFC 7234), unquoted; other forms as they are."""
    code, _, rest = header.partition(" ")
    agent, _, text = rest.partition(" ")
    if code.isdigit() and agent and len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return header


def _field_validation(validate: str | None) -> str | None:
    if validate is None:
        return None
    if validate.lower() not in FIELD_VALIDATION:
        raise ClientError(
            f"--validate must be one of {', '.join(FIELD_VALIDATION)}; got {validate!r}", exit_code=2
        )
    return validate.capitalize()


def _q(part: str) -> str:
    return quote(part, safe="")


def _reason(exc: Exception) -> str:
    """The cause of a transport error in a few words (`[Errno 111] Connection refused`, `timed out`)."""
    text = str(exc)
    if not text and isinstance(exc, httpx.TimeoutException):
        return "timed out"
    return text or type(exc).__name__
