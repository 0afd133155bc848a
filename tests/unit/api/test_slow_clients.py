"""Slow clients over raw sockets on 127.0.0.1 (`connections.GuardedRunner`): a slow header is
closed, a slow body is a 408, and one address holds at most `server.max_connections_per_address`
connections. Short limits keep every test within a few seconds; each is bounded by `wait_for`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

from aiohttp import web

from gpuyard.platform.api.app import make_app
from gpuyard.platform.api.connections import GuardedRunner
from gpuyard.state.config import Settings
from gpuyard.state.context import Context

HEADER = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Padding: " + b"a" * 200 + b"\r\n\r\n"


@asynccontextmanager
async def serving(**server: object) -> AsyncIterator[tuple[int, Context]]:
    settings = Settings(backend={"data_dir": None, "clock": "virtual"}, server=server)
    ctx = Context.for_tests(settings=settings)
    runner = GuardedRunner(make_app(ctx), server=settings.server, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield port, ctx
    finally:
        await runner.cleanup()


async def trickle(writer: asyncio.StreamWriter, data: bytes, *, every: float) -> int:
    """Send `data` a byte at a time; how many bytes went out before the server closed."""
    sent = 0
    with suppress(ConnectionError):
        for i in range(len(data)):
            writer.write(data[i : i + 1])
            await writer.drain()
            sent += 1
            await asyncio.sleep(every)
    return sent


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """Every byte the server sent before it closed. A server that closes while the client is still
    sending makes the client's kernel see a reset, not an end of stream: that ends it too (the
    answer, read as it arrives, is already here)."""
    got = b""
    with suppress(ConnectionResetError):
        while chunk := await reader.read(65536):
            got += chunk
    return got


async def test_a_slow_header_is_closed_before_it_is_complete() -> None:
    async with serving(header_timeout_seconds=0.5) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        sender = asyncio.create_task(trickle(writer, HEADER, every=0.05))  # 12 s to send it all
        try:
            answer = await asyncio.wait_for(until_closed(reader), 10)
            still_sending = not sender.done()
        finally:
            sender.cancel()
            with suppress(asyncio.CancelledError):
                await sender
            writer.close()
        assert answer == b""  # closed without an answer
        assert still_sending  # while the header was still arriving


async def test_a_fast_request_on_the_same_server_is_answered() -> None:
    async with serving(header_timeout_seconds=0.5) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(HEADER)
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 200")


async def test_a_slow_body_is_a_408_naming_the_setting() -> None:
    body = b"apiVersion: v1\n" * 20
    head = (
        b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/yaml\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
    )
    async with serving(body_timeout_seconds=0.5) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head)
        sender = asyncio.create_task(trickle(writer, body, every=0.05))
        try:
            answer = await asyncio.wait_for(until_closed(reader), 15)
        finally:
            sender.cancel()
            with suppress(asyncio.CancelledError):
                await sender
            writer.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"server.body_timeout_seconds" in answer


async def test_one_address_holds_at_most_the_cap_and_loopback_is_exempt_by_default() -> None:
    async with serving(max_connections_per_address=2, connection_cap_exempt_loopback=False) as (port, _):
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        assert b"server.max_connections_per_address" in answer
        _, first = held.pop()
        first.close()
        await first.wait_closed()
        await asyncio.sleep(0.2)  # the server sees the close
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(HEADER)
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert answer.startswith(b"HTTP/1.1 200")
        for _, w in [*held, (reader, writer)]:
            w.close()
    async with serving(max_connections_per_address=1) as (port, _):  # loopback exempt: not counted
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        reader, writer = held[-1]
        writer.write(HEADER)
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert answer.startswith(b"HTTP/1.1 200")
        for _, w in held:
            w.close()
