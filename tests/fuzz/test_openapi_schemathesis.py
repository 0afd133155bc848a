"""Schemathesis over the served OpenAPI document: every operation, with and without tokens.

An API app with tokens configured is served in-process (its own event loop in a thread, on a
free loopback port); schemathesis reads `GET /api/v1/openapi.json` and generates requests for
every operation from it, as an anonymous caller (401s), as an admin and as a tenant. Checks:
no 5xx, only documented status codes and content types, and bodies that match the documented
schema. Bounded (few examples per operation, derandomised) so it runs in `make test`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
import schemathesis
import structlog
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gpuyard.devices.scenarios import parse_scenario
from gpuyard.platform.api.app import make_app
from gpuyard.platform.api.auth import hash_token
from gpuyard.platform.api.openapi import build_document
from gpuyard.platform.backends import BackendPlan, build_backend
from gpuyard.scheduler.running import SchedulerLoop
from gpuyard.state.config import Settings
from gpuyard.state.context import Context

TOKENS = [
    {"sha256": hash_token("fuzz-admin"), "user": "root", "role": "admin"},
    {"sha256": hash_token("fuzz-alice"), "user": "alice", "role": "user", "namespaces": ["team-a"]},
]
SCENARIO = {
    "kubelet": {"startDelay": 0},
    "nodeGroups": [{"name": "node", "count": 2, "gpu": {"model": "a100", "count": 8}}],
}
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


async def _start(tokens: list[dict[str, str]], box: dict[str, object]) -> tuple[web.AppRunner, int]:
    """An app with a running fake backend on a free loopback port."""
    ctx = Context.for_tests(settings=Settings(server={"tokens": tokens}, backend={"data_dir": None}))
    fake = build_backend(ctx, BackendPlan(kind="fake", scenario=parse_scenario(SCENARIO, source="fuzz")))
    backends = box.setdefault("backends", [])
    assert isinstance(backends, list)
    backends.append(asyncio.ensure_future(fake.run()))
    await fake.synced.wait()
    # The scheduler runs too: routes that ask it (POST /scheduler:reschedule) get an answer.
    backends.append(asyncio.ensure_future(SchedulerLoop(ctx).run()))
    runner = web.AppRunner(make_app(ctx), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


def _serve(ready: threading.Event, box: dict[str, object]) -> None:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    with structlog.testing.capture_logs():
        with_tokens, port = loop.run_until_complete(_start(TOKENS, box))
        without_tokens, open_port = loop.run_until_complete(_start([], box))
        box["loop"], box["ports"] = loop, {"tokens": port, "open": open_port}
        ready.set()
        loop.run_forever()
        for runner in (with_tokens, without_tokens):
            loop.run_until_complete(runner.cleanup())
        backends = box["backends"]
        assert isinstance(backends, list)
        for task in backends:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*backends, return_exceptions=True))
    loop.close()


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, str]]:
    """URLs of two servers: `tokens` (admin and tenant tokens configured) and `open` (none)."""
    ready, box = threading.Event(), {}
    thread = threading.Thread(target=_serve, args=(ready, box), daemon=True)
    thread.start()
    assert ready.wait(30)
    ports = box["ports"]
    assert isinstance(ports, dict)
    yield {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    loop = box["loop"]
    assert isinstance(loop, asyncio.AbstractEventLoop)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(30)


def _document() -> dict[str, object]:
    ctx = Context.for_tests(settings=Settings(server={"tokens": TOKENS}, backend={"data_dir": None}))
    return build_document(make_app(ctx))


SCHEMA = schemathesis.openapi.from_dict(_document())
OPERATIONS = {op.label: op for op in (result.ok() for result in SCHEMA.get_all_operations())}
# caller -> (server, token): no token, an admin's and a tenant's on the server with tokens, and
# the anonymous admin of a server without tokens
CALLERS = {
    "anonymous": ("tokens", None),
    "admin": ("tokens", "fuzz-admin"),
    "tenant": ("tokens", "fuzz-alice"),
    "no-tokens": ("open", None),
}
# Few examples per operation keep the run to about a minute on two cores; the routes that take
# documents get more.
EXAMPLES = {"POST /api/v1/jobs": 40, "POST /api/v1/apply": 30}


def _settings(label: str) -> settings:
    return settings(
        max_examples=EXAMPLES.get(label, 15),
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )


@pytest.mark.parametrize("caller", sorted(CALLERS))
@pytest.mark.parametrize("label", sorted(OPERATIONS))
def test_operation_conforms(label: str, caller: str, servers: dict[str, str]) -> None:
    server, token = CALLERS[caller]
    base_url = servers[server]
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    @_settings(label)
    @given(case=OPERATIONS[label].as_strategy())
    def run(case: schemathesis.Case) -> None:
        case.call_and_validate(base_url=base_url, headers=headers, checks=CHECKS)

    run()
