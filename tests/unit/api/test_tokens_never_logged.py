"""Security basics: a bearer token never reaches a log line, whatever happens to the request
(accepted, refused, rate-limited, or failing inside a handler with the traceback logged)."""

from __future__ import annotations

import logging

import pytest
import structlog
from aiohttp import web

from gpuyard.platform.api.app import make_app
from gpuyard.platform.api.auth import hash_token
from gpuyard.state.config import Settings
from gpuyard.state.context import Context
from gpuyard.state.logs import configure_logging

SECRET = "tok-" + "s3cr3t" * 6
TOKENS = [
    {"sha256": hash_token(SECRET), "user": "alice", "role": "user", "namespaces": ["team-a"]},
    {"sha256": hash_token("root-" + SECRET), "user": "root", "role": "admin"},
]


async def boom(request: web.Request) -> web.Response:
    raise RuntimeError("handler failed")


@pytest.fixture(params=["console", "json"])
def logging_format(request):
    saved = structlog.get_config()
    yield request.param
    structlog.configure(**saved)


async def test_no_token_in_any_log_line(aiohttp_client, capsys, caplog, logging_format):
    caplog.set_level(logging.DEBUG)
    configure_logging(level="debug", fmt=logging_format)  # writes to this test's captured stderr
    settings = Settings(
        server={
            "tokens": TOKENS,
            "rate_limit": {"requests_per_second": 1, "burst": 3, "exempt_loopback": False},
        },
        backend={"data_dir": None},
    )
    app = make_app(Context.for_tests(settings=settings))
    app.router.add_get("/api/v1/boom", boom)
    client = await aiohttp_client(app)
    statuses = []
    for token, path in [
        (SECRET, "/api/v1/jobs"),  # 200
        (SECRET, "/api/v1/quotas/x"),  # 404
        (SECRET, "/api/v1/boom"),  # 500, traceback logged
        (SECRET + "x", "/api/v1/jobs"),  # 401
        (SECRET, "/api/v1/jobs"),  # 429 by now
        ("root-" + SECRET, "/api/v1/boom"),  # 500 as admin
    ]:
        r = await client.get(path, headers={"Authorization": f"Bearer {token}"})
        statuses.append(r.status)
        assert SECRET not in await r.text()
    assert 500 in statuses and 401 in statuses and 429 in statuses
    captured = capsys.readouterr()
    logged = captured.out + captured.err + caplog.text
    assert "http.unhandled" in logged  # the failure was logged...
    assert SECRET not in logged  # ...without the token
    assert "s3cr3t" not in logged
