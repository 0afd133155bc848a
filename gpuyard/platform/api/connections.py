"""Connections of `gpuyard serve`: slow clients are cut off and one address holds a bounded number.

:class:`GuardedRunner` is the `web.AppRunner` the runtime serves the API with:

* **Slow headers.** aiohttp arms its keep-alive timer when a connection opens and after each
  answer, and closes the connection when it fires while no complete request has arrived. With
  `keepalive_timeout` set to `server.header_timeout_seconds` (15 s), a client sending its
  request line and headers a byte at a time is closed that long after it connected (or after its
  previous answer); an idle keep-alive connection is closed after the same time.
* **Slow bodies.** Handlers read a body within `server.body_timeout_seconds` (`bodies.read_text`:
  408); a body left unread after an early answer (403, 413, 415) is drained for at most
  :data:`LINGER_SECONDS`, then the connection is closed.
* **Memory.** Buffers of 1 MiB and more (request bodies, their text) are always mapped apart and
  given back when freed (glibc's `M_MMAP_THRESHOLD` fixed at 1 MiB instead of rising to the
  largest buffer freed so far), so bodies at the size limit do not grow the heap for good.
* **Connections per address.** At most `server.max_connections_per_address` open connections
  from one client address (loopback exempt unless `server.connection_cap_exempt_loopback` is
  false): one more is answered `503` with `Connection: close` and closed before any request is
  read.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections import Counter
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from gpuyard.state.config import ServerConfig

__all__ = ["LINGER_SECONDS", "GuardedRunner"]

LINGER_SECONDS = 2.0


def _address(transport: asyncio.BaseTransport) -> str | None:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return None


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _refusal(cap: int) -> bytes:
    message = (
        f"too many open connections from this address (at most {cap}, "
        "server.max_connections_per_address); close some and try again"
    )
    body = json.dumps(
        {
            "error": {
                "code": 503,
                "message": message,
                "details": [{"field": "connections", "reason": f"at most {cap} per client address"}],
            }
        }
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class _GuardedServer(web.Server):
    """aiohttp's server, counting the open connections of each client address."""

    def __init__(self, base: web.Server, *, cap: int | None, exempt_loopback: bool) -> None:
        # the same handler, factory and protocol settings as the server the runner built
        super().__init__(
            base.request_handler,
            request_factory=base.request_factory,
            handler_cancellation=base.handler_cancellation,
            loop=base._loop,
            **base._kwargs,
        )
        self.cap = cap
        self.exempt_loopback = exempt_loopback
        self.open: Counter[str] = Counter()
        self._counted: dict[RequestHandler, str] = {}

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        address = _address(transport)
        if self.cap is None or address is None or (self.exempt_loopback and _loopback(address)):
            return
        if self.open[address] >= self.cap:
            transport.write(_refusal(self.cap))
            transport.close()
            return
        self.open[address] += 1
        self._counted[handler] = address

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        address = self._counted.pop(handler, None)
        if address is not None:
            self.open[address] -= 1
            if self.open[address] <= 0:
                del self.open[address]


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def _map_large_buffers(threshold: int = 1024 * 1024) -> None:
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(M_MMAP_THRESHOLD, threshold)


class GuardedRunner(web.AppRunner):
    """An `AppRunner` with the time limits and the per-address cap of `server` (module docstring)."""

    def __init__(self, app: web.Application, *, server: ServerConfig, **kwargs: Any) -> None:
        _map_large_buffers()
        kwargs.setdefault("keepalive_timeout", server.header_timeout_seconds)
        kwargs.setdefault("lingering_time", LINGER_SECONDS)
        super().__init__(app, **kwargs)
        self._settings = server

    async def _make_server(self) -> web.Server:
        base = await super()._make_server()
        return _GuardedServer(
            base,
            cap=self._settings.max_connections_per_address,
            exempt_loopback=self._settings.connection_cap_exempt_loopback,
        )
