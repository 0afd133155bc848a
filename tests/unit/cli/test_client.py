"""The CLI's HTTP client against a real loopback server: headers, query strings, the error body and
exit codes, timeouts, redirects and Server-Sent Events watches (GONE, skipped events, a broken stream)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpuyard.cli.client import ApiClient, ClientError, error_line, join_error


class Server:
    """A stand-in API server; `release` lets a deliberately slow handler finish."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.url = ""

    async def echo(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "method": request.method,
                "path": request.raw_path,
                "accept": request.headers.get("Accept"),
                "auth": request.headers.get("Authorization"),
                "type": request.headers.get("Content-Type"),
                "body": (await request.read()).decode(),
            }
        )

    async def empty(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def text(self, request: web.Request) -> web.Response:
        return web.Response(text="<html>hello</html>")

    async def invalid(self, request: web.Request) -> web.Response:
        error = {
            "code": "Invalid",
            "message": "job is invalid",
            "details": [{"field": "spec.replicas", "reason": "must be >= 1"}],
        }
        return web.json_response({"error": error}, status=422)

    async def unauthorized(self, request: web.Request) -> web.Response:
        error = {"code": "Unauthorized", "message": "send 'Authorization: Bearer <token>'"}
        return web.json_response({"error": error}, status=401)

    async def boom(self, request: web.Request) -> web.Response:
        return web.Response(status=503, text="overloaded\ntry later")

    async def slow(self, request: web.Request) -> web.Response:
        await self.release.wait()
        return web.json_response({})

    async def moved(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/api/v1/echo")

    async def watch(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(
            b": a comment\n\n"
            b"event: ping\n\n"  # no data: skipped
            b"event: ADDED\ndata: not json\n\n"  # skipped
            b'event: ADDED\ndata: {"name": "a"}\n\n'
            b'event: MODIFIED\r\ndata: {"name":\r\ndata:  "b"}\r\n\r\n'
            b"data: [1, 2]\n\n"
            b"event: GONE\ndata: {}\n\n"
            b'event: ADDED\ndata: {"name": "never"}\n\n'
        )
        await resp.write_eof()
        return resp

    async def quiet(self, request: web.Request) -> web.StreamResponse:
        """Two events a minute apart with a keep-alive comment every 15 seconds of silence between them."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'event: ADDED\ndata: {"name": "a"}\n\n')
        for _ in range(4):
            await asyncio.sleep(15)
            await resp.write(b": keep-alive\n\n")
        await resp.write(b'event: DELETED\ndata: {"name": "a"}\n\nevent: GONE\ndata: {}\n\n')
        await resp.write_eof()
        return resp

    async def broken(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'event: ADDED\ndata: {"name": "a"}\n\n')
        assert request.transport is not None
        request.transport.abort()  # the connection drops mid-stream
        return resp

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/api/v1/echo", self.echo)
        app.router.add_route("*", "/api/v1/namespaces/{rest:.*}", self.echo)
        app.router.add_get("/api/v1/empty", self.empty)
        app.router.add_get("/api/v1/text", self.text)
        app.router.add_get("/api/v1/invalid", self.invalid)
        app.router.add_get("/api/v1/boom", self.boom)
        app.router.add_get("/api/v1/unauthorized", self.unauthorized)
        app.router.add_get("/api/v1/slow", self.slow)
        app.router.add_get("/api/v1/moved", self.moved)
        app.router.add_get("/api/v1/watch", self.watch)
        app.router.add_get("/api/v1/quiet", self.quiet)
        app.router.add_get("/api/v1/broken", self.broken)
        return app


async def _serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **server_kwargs: Any
) -> AsyncIterator[Server]:
    monkeypatch.setenv("GPUYARD_CONFIG", str(tmp_path / "absent.yaml"))
    monkeypatch.delenv("GPUYARD_TOKEN", raising=False)
    monkeypatch.delenv("GPUYARD_SERVER", raising=False)
    state = Server()
    test_server = TestServer(state.app(), host="127.0.0.1")
    await test_server.start_server(**server_kwargs)
    state.url = str(test_server.make_url("")).rstrip("/")
    try:
        yield state
    finally:
        state.release.set()
        await test_server.close()


@pytest_asyncio.fixture
async def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Server]:
    """The test server as aiohttp serves by default (keep-alive on: a redirect may reuse the
    connection, as it does against `gpuyard serve`)."""
    async for state in _serve(tmp_path, monkeypatch):
        yield state


@pytest_asyncio.fixture
async def quiet_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Server]:
    """No keep-alive timer on connections: under looptime it would fire as soon as the loop idles,
    before the client (in a thread) has sent its request."""
    async for state in _serve(tmp_path, monkeypatch, keepalive_timeout=0):
        yield state


async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """The client is synchronous (it serves a CLI): run it beside the server's event loop."""
    return await asyncio.to_thread(fn, *args, **kwargs)


async def collect(client: ApiClient, path: str) -> list[tuple[str, Any]]:
    return await call(lambda: list(client.stream(path)))


async def test_headers_query_and_body(server: Server) -> None:
    client = ApiClient(server.url + "/", token="s3cr3t")
    got = await call(
        client.request,
        "POST",
        "/api/v1/echo",
        body=b"kind: TFJob\n",
        content_type="application/yaml",
        query={"phase": "Running", "queue": None, "namespace": ""},
    )
    assert got == {
        "method": "POST",
        "path": "/api/v1/echo?phase=Running",  # empty query values are left out
        "accept": "application/json",
        "auth": "Bearer s3cr3t",
        "type": "application/yaml",
        "body": "kind: TFJob\n",
    }
    anonymous = ApiClient(server.url, token="")
    assert (await call(anonymous.request, "GET", "/api/v1/echo"))["auth"] is None


async def test_names_are_quoted_in_paths(server: Server) -> None:
    got = await call(ApiClient(server.url, token="t").job, "team a", "x/y")
    assert got["path"] == "/api/v1/namespaces/team%20a/jobs/x%2Fy"


async def test_token_and_server_from_environment_and_config_file(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"server: {server.url}\ntoken: from-file\n")
    monkeypatch.setenv("GPUYARD_CONFIG", str(config))
    assert (await call(ApiClient().request, "GET", "/api/v1/echo"))["auth"] == "Bearer from-file"
    monkeypatch.setenv("GPUYARD_TOKEN", "from-env")
    assert (await call(ApiClient().request, "GET", "/api/v1/echo"))["auth"] == "Bearer from-env"
    config.write_text("server: [1, 2]\n")
    with pytest.raises(ClientError) as err:  # a broken config file is reported by the first request
        await call(ApiClient(token="t").request, "GET", "/api/v1/echo")
    assert err.value.exit_code == 2 and "server: expected a string" in err.value.message


async def test_empty_and_non_json_answers(server: Server) -> None:
    client = ApiClient(server.url, token="t")
    assert await call(client.request, "GET", "/api/v1/empty") is None
    with pytest.raises(ClientError) as err:
        await call(client.request, "GET", "/api/v1/text")
    assert err.value.exit_code == 1 and "not JSON" in err.value.message


async def test_follows_redirects(server: Server) -> None:
    got = await call(ApiClient(server.url, token="t").request, "GET", "/api/v1/moved")
    assert got["path"] == "/api/v1/echo" and got["auth"] == "Bearer t"


async def test_bad_input_is_exit_code_2_with_the_fields(server: Server) -> None:
    with pytest.raises(ClientError) as err:
        await call(ApiClient(server.url, token="t").request, "GET", "/api/v1/invalid")
    assert (err.value.exit_code, err.value.status) == (2, 422)
    assert err.value.message == "job is invalid: spec.replicas: must be >= 1"


async def test_server_trouble_is_exit_code_1_with_the_text(server: Server) -> None:
    with pytest.raises(ClientError) as err:
        await call(ApiClient(server.url, token="t").request, "GET", "/api/v1/boom")
    assert (err.value.exit_code, err.value.status) == (1, 503)
    assert err.value.message == "HTTP 503: overloaded try later"


async def test_unreachable_server_and_timeout_are_exit_code_1(server: Server) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ClientError) as err:
        await call(ApiClient(f"http://127.0.0.1:{port}", token="t").summary)
    assert err.value.exit_code == 1
    assert err.value.message.startswith(f"cannot reach the gpuyard server at http://127.0.0.1:{port}: ")
    with pytest.raises(ClientError) as err:
        await call(ApiClient(server.url, token="t", timeout=0.2).request, "GET", "/api/v1/slow")
    assert err.value.exit_code == 1 and err.value.message.endswith("timed out")


async def test_a_server_that_is_not_a_url_is_bad_input(server: Server) -> None:
    with pytest.raises(ClientError) as err:
        await call(ApiClient("ftp://localhost:8080", token="t").summary)
    assert err.value.exit_code == 2 and "is not a server URL (http://HOST:PORT)" in err.value.message


async def test_a_server_given_with_the_api_path_or_without_a_scheme_is_understood(server: Server) -> None:
    host_port = server.url.removeprefix("http://")
    for given in (f"{server.url}/api/v1", f"{server.url}/api/v1/", f"{server.url}/api", host_port):
        client = ApiClient(given, token="t")
        assert client.server == server.url
        answer = await call(client.request, "GET", "/api/v1/echo")
        assert answer["path"] == "/api/v1/echo"


async def test_a_refused_connection_says_how_to_start_or_name_a_server() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ClientError) as err:
        await call(ApiClient(f"http://127.0.0.1:{port}", token="t").summary)
    assert "gpuyard demo" in err.value.message and "--server URL" in err.value.message


async def test_a_401_says_which_flag_and_variable_carry_a_token(server: Server) -> None:
    with pytest.raises(ClientError) as err:
        await call(ApiClient(server.url, token="").request, "GET", "/api/v1/unauthorized")
    assert err.value.exit_code == 2
    assert "--token" in err.value.message and "GPUYARD_TOKEN" in err.value.message
    with pytest.raises(ClientError) as err:
        await call(ApiClient(server.url, token="wrong").request, "GET", "/api/v1/unauthorized")
    assert "the token was refused" in err.value.message


def test_a_reason_the_message_already_says_is_not_repeated() -> None:
    reason = "PriorityClass 'nope' does not exist; known: high, low"
    line = join_error(f"{reason}; nothing was changed", [("spec.priorityClassName", reason)])
    assert line == f"spec.priorityClassName: {reason}; nothing was changed"
    assert line.count("does not exist") == 1
    other = join_error("job is invalid", [("spec.replicas", "must be >= 1")])
    assert other == "job is invalid: spec.replicas: must be >= 1"


async def test_stream_follows_events_until_gone(server: Server) -> None:
    got = await collect(ApiClient(server.url, token="t"), "/api/v1/watch")
    assert got == [("ADDED", {"name": "a"}), ("MODIFIED", {"name": "b"}), ("message", [1, 2])]


async def in_thread(fn: Callable[[], Any]) -> Any:
    """Run `fn` in a thread of its own, not the loop's executor: looptime (fake loop time) waits
    in real time while an executor job runs, but jumps ahead while the loop only awaits sockets."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def run() -> None:
        try:
            result = fn()
        except BaseException as exc:
            loop.call_soon_threadsafe(done.set_exception, exc)
        else:
            loop.call_soon_threadsafe(done.set_result, result)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        return await done
    finally:
        thread.join()


@pytest.mark.looptime
async def test_stream_outlives_quiet_minutes_with_keep_alives(quiet_server: Server) -> None:
    server = quiet_server
    # The server is silent for a minute of loop time (passed at once with looptime), sending a
    # keep-alive comment every 15 s; comments are not events, and the watch goes on.
    loop = asyncio.get_running_loop()
    start = loop.time()
    client = ApiClient(server.url, token="t", timeout=5)
    got = await in_thread(lambda: list(client.stream("/api/v1/quiet")))
    assert got == [("ADDED", {"name": "a"}), ("DELETED", {"name": "a"})]
    assert loop.time() - start >= 60


async def test_stream_errors(server: Server) -> None:
    client = ApiClient(server.url, token="t")
    with pytest.raises(ClientError) as err:
        await collect(client, "/api/v1/broken")
    assert err.value.exit_code == 1 and err.value.message.startswith("lost the watch stream from")
    with pytest.raises(ClientError) as err:  # an error answer before the stream starts
        await collect(client, "/api/v1/invalid")
    assert err.value.exit_code == 2 and err.value.message.startswith("job is invalid")


@pytest.mark.parametrize(
    ("body", "line"),
    [
        (b'{"error": {"message": "no such job"}}', "no such job"),
        (b'{"error": {"message": "bad", "details": [{"field": "a", "reason": "b"}, "x"]}}', "bad: a: b"),
        (
            b'{"error": {"message": "bad", "details": [{"field": "a", "reason": "b"}, {"field": "c", "reason": "d"}]}}',
            "bad: a: b; c: d",
        ),
        (b'{"error": "flat"}', 'HTTP 500: {"error": "flat"}'),
        (b"", "HTTP 500: no details"),
        (b"[1]", "HTTP 500: [1]"),
        (json.dumps({"error": {}}).encode(), 'HTTP 500: {"error": {}}'),
    ],
)
def test_error_line(body: bytes, line: str) -> None:
    assert error_line(500, body) == line
