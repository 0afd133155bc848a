"""The decoding processes' life: started in the background by the first large body (which does not
wait for them), used through the API, and gone with the server's event loop."""

from __future__ import annotations

import asyncio
import gc
import io
import os
import time
import types
from collections.abc import Callable
from typing import Any

import pytest

from gpuyard.apis.decoding import MAX_NODES
from gpuyard.platform.api import bodies, decoders
from gpuyard.platform.api.app import make_app
from gpuyard.platform.api.manifests import decode_body
from gpuyard.state.context import Context

FLAT = "".join(f"k{i}: v\n" for i in range(350_000))  # 3.6 MiB, over the node limit


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between open and read
        return False


def children() -> set[int]:
    """This process's children (the decoders are started with `subprocess`: direct children)."""
    me = os.getpid()
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        found.add(int(entry))
            except (OSError, ValueError):
                continue
    return found


async def until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


def test_the_pool_and_its_processes_end_with_the_event_loop() -> None:
    async def serve() -> tuple[decoders.DecoderPool, list[int]]:
        pool = await decoders.decoder_pool(2)
        pool.warm()
        await until(lambda: len(pool.pids()) == 2)
        assert set(pool.pids()) <= children()
        return pool, pool.pids()

    pool, pids = asyncio.run(serve())  # asyncio.run shuts the loop's asynchronous generators down
    assert pool.closed and decoders.current_pool() is None
    assert not any(alive(pid) for pid in pids)
    assert not set(pids) & children()


def test_a_pool_closed_while_a_worker_starts_leaves_no_process() -> None:
    async def serve() -> decoders.DecoderPool:
        pool = await decoders.decoder_pool(1)
        pool.warm()  # the loop ends while the worker imports
        return pool

    before = children()
    pool = asyncio.run(serve())
    assert pool.closed
    deadline = time.monotonic() + 60
    while children() - before:  # a worker that was starting is killed when it reports
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_close_decoders_stops_the_workers_and_a_later_call_starts_new_ones() -> None:
    async def serve() -> None:
        pool = await decoders.decoder_pool(1)
        pool.warm()
        await until(lambda: pool.ready)
        first = pool.pids()
        decoders.close_decoders()
        assert pool.closed and not any(alive(pid) for pid in first)
        again = await decoders.decoder_pool(1)
        assert again is not pool and not again.closed
        loop = asyncio.get_running_loop()
        again.warm()
        await until(lambda: again.ready)
        assert await again.run(decode_body, ("a: 1\n",), {}, deadline=loop.time() + 30) == [{"a": 1}]

    asyncio.run(serve())
    assert decoders.current_pool() is None


async def test_the_first_large_body_does_not_wait_for_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decoders, "DECODE_PROCESSES", 1)
    pool = await decoders.decoder_pool(1)
    runs = []
    original = decoders.DecoderPool.run

    async def counted(self: decoders.DecoderPool, *args: Any, **kw: Any) -> Any:
        runs.append(args[0])
        return await original(self, *args, **kw)

    monkeypatch.setattr(decoders.DecoderPool, "run", counted)
    assert not pool.ready
    with pytest.raises(Exception, match=f"more than {MAX_NODES} nodes"):
        await bodies.off_loop(decode_body, FLAT, timeout_s=30)
    assert runs == []  # decoded in a thread: no worker was up
    await until(lambda: pool.ready)  # the body started one
    with pytest.raises(Exception, match=f"more than {MAX_NODES} nodes"):
        await bodies.off_loop(decode_body, FLAT, timeout_s=30)
    assert runs == [decode_body]


@pytest.fixture
def ctx() -> Context:
    return Context.for_tests()


async def test_a_large_body_is_decoded_by_a_worker_through_the_api(
    aiohttp_client: Any, ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    http = await aiohttp_client(make_app(ctx))
    headers = {"Content-Type": "application/yaml"}
    monkeypatch.setattr(decoders, "DECODE_PROCESSES", 0)
    in_thread = await http.post("/api/v1/jobs", data=io.BytesIO(FLAT.encode()), headers=headers)
    monkeypatch.undo()
    monkeypatch.setattr(decoders, "DECODE_PROCESSES", 1)
    pool = await decoders.decoder_pool(1)
    pool.warm()
    await until(lambda: pool.ready)
    runs = []
    original = decoders.DecoderPool.run

    async def counted(self: decoders.DecoderPool, *args: Any, **kw: Any) -> Any:
        runs.append(args[0].__name__)
        return await original(self, *args, **kw)

    monkeypatch.setattr(decoders.DecoderPool, "run", counted)
    in_worker = await http.post("/api/v1/jobs", data=io.BytesIO(FLAT.encode()), headers=headers)
    small = await http.put("/api/v1/queues/q", data=b"metadata: {name: q}\n", headers=headers)
    assert runs == ["_decode_jobs"]  # the small body stayed in a thread
    assert in_worker.status == in_thread.status == 422
    assert await in_worker.json() == await in_thread.json()
    assert small.status in (200, 201), await small.text()


async def test_an_overrun_through_the_api_is_422_and_the_worker_is_replaced(
    aiohttp_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuyard.state.config import Settings

    ctx = Context.for_tests(settings=Settings(server={"decode_timeout_seconds": 0.02}))
    http = await aiohttp_client(make_app(ctx))
    monkeypatch.setattr(decoders, "DECODE_PROCESSES", 1)
    pool = await decoders.decoder_pool(1)
    pool.warm()
    await until(lambda: pool.ready)
    first = pool.pids()
    r = await http.post(
        "/api/v1/jobs", data=io.BytesIO(FLAT.encode()), headers={"Content-Type": "application/yaml"}
    )
    assert r.status == 422
    error = (await r.json())["error"]
    assert "server.decode_timeout_seconds" in error["message"]
    await until(lambda: not alive(first[0]), 10)
    await until(lambda: pool.ready and pool.pids() != first)


@pytest.mark.parametrize("processes", [0, 1], ids=["thread", "worker"])
async def test_a_refused_body_is_freed_with_its_answer_not_by_the_garbage_collector(
    aiohttp_client: Any, ctx: Context, monkeypatch: pytest.MonkeyPatch, processes: int
) -> None:
    """No reference cycle (a refusal's traceback holding a frame that holds the refusal) keeps
    the handler's frames, and with them the body's text and request, after the answer."""
    monkeypatch.setattr(decoders, "DECODE_PROCESSES", processes)
    http = await aiohttp_client(make_app(ctx))
    if processes:
        pool = await decoders.decoder_pool(1)
        pool.warm()
        await until(lambda: pool.ready)
    gc.collect()
    gc.disable()
    try:
        gc.set_debug(gc.DEBUG_SAVEALL)
        r = await http.post(
            "/api/v1/jobs", data=io.BytesIO(FLAT.encode()), headers={"Content-Type": "application/yaml"}
        )
        assert r.status == 422
        await asyncio.sleep(0.1)
        gc.collect()
        kept = sorted(
            o.f_code.co_name
            for o in gc.garbage
            if isinstance(o, types.FrameType) and "gpuyard" in o.f_code.co_filename
        )
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert kept == []
