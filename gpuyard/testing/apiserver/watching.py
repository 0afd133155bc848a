"""WATCH streams of the test API server (`GET ...?watch=true`): newline-delimited JSON events.

- `resourceVersion` unset or "0": an ADDED event for every current object, then every change;
  a version: every change after it, replayed from the history, then live; a version older than the
  history: one `ERROR` event carrying a 410 `Status` ("too old resource version"), then the stream
  ends, as a real API server's watch cache does.
- `allowWatchBookmarks=true`: a `BOOKMARK` event with the current resourceVersion every
  `server.bookmark_interval` seconds of quiet; `sendInitialEvents=true`: after the initial ADDED
  events, a bookmark annotated `k8s.io/initial-events-end: "true"`.
- `timeoutSeconds`: the stream ends after that long (the server's `max_watch_seconds` otherwise).
- label and field selectors: an object that starts (stops) matching is ADDED (DELETED).
- faults: `drop_watches` ends the stream; a silenced stream stays open and sends nothing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gpuyard.testing.apiserver.catalog import Resource
from gpuyard.testing.apiserver.errors import ApiError
from gpuyard.testing.apiserver.selecting import Matcher
from gpuyard.testing.apiserver.storage import CLOSE
from gpuyard.testing.apiserver.tables import table

if TYPE_CHECKING:
    from gpuyard.testing.apiserver.server import FakeApiServer

__all__ = ["WatchRequest", "serve_watch"]

_TICK_SECONDS = 0.5  # how often an idle stream checks its deadline and its client


@dataclass(frozen=True, slots=True)
class WatchRequest:
    """The parameters of one watch."""

    res: Resource
    namespace: str | None
    match: Matcher | None
    since: int | None
    timeout: float | None
    bookmarks: bool
    initial_events: bool

    @classmethod
    def from_query(
        cls, query: Mapping[str, str], *, res: Resource, namespace: str | None, match: Matcher | None
    ) -> WatchRequest:
        rv = query.get("resourceVersion") or ""
        if rv in ("", "0"):
            since = None
        elif rv.isdigit():
            since = int(rv)
        else:
            raise ApiError.bad_request(
                f"resourceVersion: invalid value {rv!r}: must be a resourceVersion this server returned"
            )
        timeout = query.get("timeoutSeconds")
        if timeout is not None and not timeout.isdigit():
            raise ApiError.bad_request(
                f"timeoutSeconds: invalid value {timeout!r}: must be a whole number of seconds"
            )
        initial = query.get("sendInitialEvents", "").lower() == "true"
        return cls(
            res=res,
            namespace=namespace,
            match=match,
            since=None if initial else since,
            timeout=float(timeout) if timeout else None,
            bookmarks=query.get("allowWatchBookmarks", "").lower() in ("1", "true"),
            initial_events=initial,
        )


async def _write(resp: web.StreamResponse, event: dict[str, Any]) -> None:
    await resp.write(json.dumps(event).encode() + b"\n")


async def serve_watch(
    request: web.Request, server: FakeApiServer, watch: WatchRequest, *, as_table: bool
) -> web.StreamResponse:
    """Stream the events of one watch until its deadline, the client leaves, or a fault ends it."""
    storage, res = server.storage, watch.res
    resp = web.StreamResponse(
        status=200, headers={"Content-Type": "application/json", "Cache-Control": "no-cache"}
    )
    resp.enable_chunked_encoding()
    try:
        watcher = storage.watch(
            res.key,
            namespace=watch.namespace,
            match=watch.match,
            since=watch.since,
            silenced=server.faults.silent,
        )
    except ApiError as exc:
        await resp.prepare(request)
        await _write(resp, {"type": "ERROR", "object": exc.body()})
        return resp
    initial_left = watcher.queue.qsize() if watch.initial_events else -1
    initial_rv = storage.rv
    loop = asyncio.get_running_loop()
    limit = watch.timeout if watch.timeout is not None else server.max_watch_seconds
    deadline = loop.time() + limit
    next_bookmark = loop.time() + server.bookmark_interval

    def bookmark(rv: int, *, initial_end: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {
            "type": "BOOKMARK",
            "object": {"kind": res.kind, "apiVersion": res.api_version, "metadata": meta},
        }

    try:
        await resp.prepare(request)
        if initial_left == 0 and watch.bookmarks and not watcher.silenced:
            await _write(resp, bookmark(initial_rv, initial_end=True))
        while True:
            now = loop.time()
            if (
                (now >= deadline and not watcher.silenced)
                or request.transport is None
                or request.transport.is_closing()
            ):
                break
            wait = max(0.0, min(_TICK_SECONDS, deadline - now, next_bookmark - now))
            try:
                item = await asyncio.wait_for(watcher.queue.get(), wait)
            except TimeoutError:
                if watch.bookmarks and not watcher.silenced and loop.time() >= next_bookmark:
                    await _write(resp, bookmark(storage.rv))
                if loop.time() >= next_bookmark:
                    next_bookmark = loop.time() + server.bookmark_interval
                continue
            if item is CLOSE:
                break
            if watcher.silenced:
                continue
            type_, obj = item
            rendered = server.objects.render(res, obj)
            if as_table:
                rendered = table(
                    res, [rendered], metadata={"resourceVersion": obj["metadata"]["resourceVersion"]}
                )
            await _write(resp, {"type": type_, "object": rendered})
            if initial_left > 0:
                initial_left -= 1
                if initial_left == 0 and watch.bookmarks:
                    await _write(resp, bookmark(initial_rv, initial_end=True))
    except (ConnectionResetError, ConnectionError):
        pass
    finally:
        storage.unwatch(watcher)
    return resp
