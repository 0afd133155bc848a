"""Bodies decoded in worker processes (`platform.api.decoders`): the same answer as in a thread,
overruns and deaths of a worker, recycling. One pool serves the whole module (one event loop):
starting a worker is a new interpreter importing the API."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio
import yaml

from gpuyard.apis.decoding import json_loads
from gpuyard.platform.api import bodies, decoders
from gpuyard.platform.api.errors import ApiError
from gpuyard.platform.api.jobs import _decode_jobs
from gpuyard.platform.api.manifests import decode_body

pytestmark = pytest.mark.asyncio(loop_scope="module")

BULK = {"max_bytes": 4 * 1024 * 1024, "limit_name": "server.max_body_bytes"}


def job(name: str, ns: str = "team-a") -> dict[str, Any]:
    container = {"name": "pytorch", "image": "train:1", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": ns, "labels": {"team": "a"}},
        "spec": {
            "pytorchReplicaSpecs": {
                "Worker": {"replicas": 2, "template": {"spec": {"containers": [container]}}}
            }
        },
    }


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def pool() -> AsyncIterator[decoders.DecoderPool]:
    workers = await decoders.decoder_pool(2)
    workers.warm()
    await until(lambda: len(workers.pids()) == 2)
    yield workers


@pytest.fixture
async def full(pool: decoders.DecoderPool) -> decoders.DecoderPool:
    """The pool with both workers up (a test before may have replaced one; a start that failed is
    tried again once its retry time has come, as the next request would)."""

    def up() -> bool:
        pool.warm()
        return len(pool.pids()) == pool.processes

    await until(up, timeout_s=120.0)
    return pool


def described(exc: Exception) -> tuple[Any, ...]:
    """The error's type, text and every field the API renders from it."""
    fields = ("status", "message", "details", "msg", "lineno", "colno", "pos", "problem", "context")
    seen = {f: getattr(exc, f) for f in fields if hasattr(exc, f)}
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        seen["mark"] = (mark.line, mark.column)
    return ("error", type(exc), str(exc), seen)


def outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        return ("value", call())
    except Exception as exc:
        return described(exc)


async def async_outcome(call: Callable[[], Awaitable[Any]]) -> tuple[Any, ...]:
    try:
        return ("value", await call())
    except Exception as exc:
        return described(exc)


FLAT_350000 = "".join(f"k{i}: v\n" for i in range(350_000))
JOBS_JSON = json.dumps([job(f"j{i}") for i in range(300)])
ALIAS_BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)
)
CASES: list[tuple[str, Callable[..., Any], str, dict[str, Any]]] = [
    ("jobs-yaml", _decode_jobs, yaml.safe_dump_all([job("a"), job("b", "team-b")]), {"json_body": False, **BULK}),
    ("jobs-json-300", _decode_jobs, JOBS_JSON, {"json_body": True, **BULK}),
    ("jobs-invalid", _decode_jobs, "kind: PyTorchJob\napiVersion: kubeflow.org/v1\nmetadata: {name: x}\n", {"json_body": False, **BULK}),
    ("jobs-malformed-yaml", _decode_jobs, "a: [1, 2\n", {"json_body": False, **BULK}),
    ("jobs-malformed-json", _decode_jobs, '{"a": [1, 2}', {"json_body": True, **BULK}),
    ("jobs-350000-keys", _decode_jobs, FLAT_350000, {"json_body": False, **BULK}),
    ("jobs-5000-digits", _decode_jobs, "kind: PyTorchJob\nspec: {x: " + "9" * 5000 + "}\n", {"json_body": False, **BULK}),
    ("manifests-anchors", decode_body, "a: &b {x: 1}\nc: *b\n---\nkind: List\n", {}),
    ("manifests-list", decode_body, json.dumps({"kind": "List", "items": [{"a": 1}, {"b": [2]}]}), {}),
    ("manifests-deep", decode_body, "[" * 100 + "]" * 100, {}),
    ("manifests-alias-bomb", decode_body, ALIAS_BOMB, {"max_bytes": 1024 * 1024, "limit_name": "server.max_object_body_bytes"}),
    ("manifests-malformed-yaml", decode_body, "a:\n  - b\n c: d\n", {}),
    ("patch-too-many-values", json_loads, '{"metadata": {"labels": ' + '"x", ' * 100_000 + "}", {}),
    ("patch-malformed-json", json_loads, '{"metadata": {"labels": [' + '"x", ' * 10_000 + "}", {}),
    ("patch-big-int", json_loads, '{"spec": {"x": ' + "1" * 30 + "}}", {}),
    ("patch-ok", json_loads, json.dumps({"metadata": {"labels": {f"k{i}": "v" for i in range(2000)}}}), {}),
]  # fmt: skip


@pytest.mark.parametrize(("fn", "text", "kwargs"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_a_body_decoded_in_a_worker_gives_what_a_thread_gives(
    full: decoders.DecoderPool,
    monkeypatch: pytest.MonkeyPatch,
    fn: Callable[..., Any],
    text: str,
    kwargs: dict[str, Any],
) -> None:
    runs = []
    original = decoders.DecoderPool.run

    async def counted(self: decoders.DecoderPool, *args: Any, **kw: Any) -> Any:
        runs.append(args[0])
        return await original(self, *args, **kw)

    monkeypatch.setattr(decoders.DecoderPool, "run", counted)
    monkeypatch.setattr(bodies, "PROCESS_AFTER_BYTES", 0)  # every body goes to a worker
    in_thread = outcome(lambda: fn(text, **kwargs))
    in_worker = await async_outcome(lambda: bodies.off_loop(fn, text, timeout_s=30, **kwargs))
    assert runs == [fn]
    assert in_worker == in_thread


async def test_a_json_error_comes_back_without_the_body(full: decoders.DecoderPool) -> None:
    text = '{"a": [' + "1, " * 10_000 + "}"
    loop = asyncio.get_running_loop()
    with pytest.raises(json.JSONDecodeError) as caught:
        await full.run(json_loads, (text,), {}, deadline=loop.time() + 30)
    assert caught.value.doc == ""  # not sent back: the message, line and column are
    assert (caught.value.lineno, caught.value.colno) == (1, len(text))


async def test_a_call_that_does_not_pickle_is_decoded_in_a_thread(
    full: decoders.DecoderPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bodies, "PROCESS_AFTER_BYTES", 0)
    text = "x" * 1000
    assert await bodies.off_loop(lambda t: len(t), text, timeout_s=5) == 1000
    assert len(full.pids()) == 2


async def test_an_overrun_is_422_and_the_worker_is_killed_and_replaced(
    full: decoders.DecoderPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bodies, "PROCESS_AFTER_BYTES", 0)
    before = full.pids()
    started = full.started
    with pytest.raises(ApiError) as caught:
        await bodies.off_loop(decode_body, FLAT_350000, timeout_s=0.01)
    assert caught.value.status == 422
    assert "server.decode_timeout_seconds" in caught.value.message
    assert caught.value.details == [{"field": "<body>", "reason": "decoding time: at most 0.01 s"}]
    killed = [pid for pid in before if pid not in full.pids()]
    assert len(killed) == 1
    await until(lambda: not alive(killed[0]), 10)
    await until(lambda: len(full.pids()) == 2)
    assert full.started == started + 1
    assert await bodies.off_loop(decode_body, "a: 1\n", timeout_s=30) == [{"a": 1}]


async def test_waiting_for_a_busy_worker_counts_against_the_deadline(full: decoders.DecoderPool) -> None:
    loop = asyncio.get_running_loop()
    slow = [
        asyncio.ensure_future(full.run(time.sleep, (1.0,), {}, deadline=loop.time() + 30)) for _ in range(2)
    ]
    await asyncio.sleep(0.1)  # both workers busy
    with pytest.raises(TimeoutError):
        await full.run(json_loads, ("[1]",), {}, deadline=loop.time() + 0.2)
    await asyncio.gather(*slow)
    assert len(full.pids()) == 2  # nobody was killed: the call never reached a worker


async def test_a_worker_that_dies_while_decoding_fails_that_call_and_is_replaced(
    full: decoders.DecoderPool,
) -> None:
    loop = asyncio.get_running_loop()
    calls = [
        asyncio.ensure_future(full.run(time.sleep, (1.5,), {}, deadline=loop.time() + 30)) for _ in range(2)
    ]
    await asyncio.sleep(0.3)  # both workers busy
    victim = full.pids()[0]
    os.kill(victim, signal.SIGKILL)
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert sum(isinstance(r, decoders.WorkerLost) for r in results) == 1
    assert results.count(None) == 1  # the other worker's call is answered
    await until(lambda: victim not in full.pids() and len(full.pids()) == 2)
    await until(lambda: not alive(victim), 10)


async def test_a_worker_that_died_idle_is_skipped_and_replaced(full: decoders.DecoderPool) -> None:
    loop = asyncio.get_running_loop()
    victims = full.pids()
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    await until(lambda: not any(alive(pid) for pid in victims), 10)
    # the dead ones are noticed when taken, replaced, and the call waits for a new one
    assert await full.run(json_loads, ("[1]",), {}, deadline=loop.time() + 60) == [1]
    await until(lambda: len(full.pids()) == 2 and not set(full.pids()) & set(victims))


async def test_the_worker_killed_mid_call_is_a_500(
    monkeypatch: pytest.MonkeyPatch, full: decoders.DecoderPool
) -> None:
    async def lost(self: decoders.DecoderPool, *args: Any, **kw: Any) -> Any:
        raise decoders.WorkerLost("the decoding process 1 ended: the other end closed the socket")

    monkeypatch.setattr(decoders.DecoderPool, "run", lost)
    monkeypatch.setattr(bodies, "PROCESS_AFTER_BYTES", 0)
    with pytest.raises(ApiError) as caught:
        await bodies.off_loop(decode_body, "a: 1\n", timeout_s=5)
    assert caught.value.status == 500 and "nothing was stored" in caught.value.message


async def test_a_worker_over_the_memory_cap_is_replaced_after_its_answer(
    full: decoders.DecoderPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(decoders, "RECYCLE_RSS_BYTES", 0)
    loop = asyncio.get_running_loop()
    before = set(full.pids())
    assert await full.run(json_loads, ("[1, 2]",), {}, deadline=loop.time() + 30) == [1, 2]
    await until(lambda: len(set(full.pids()) & before) == 1)
    monkeypatch.undo()
    await until(lambda: len(full.pids()) == 2)
    retired = (before - set(full.pids())).pop()
    await until(lambda: not alive(retired), 10)
    assert all(rss > 0 for rss in full.worker_rss_bytes().values())
