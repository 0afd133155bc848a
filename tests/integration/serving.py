"""An API app served in-process for CLI tests: the CLI's environment cleared (no config file, token
or server from the developer's shell) and the server's logs kept out of the output CliRunner
captures."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import TestServer


def clean_cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUYARD_CONFIG", str(tmp_path / "absent.yaml"))
    monkeypatch.delenv("GPUYARD_TOKEN", raising=False)
    monkeypatch.delenv("GPUYARD_SERVER", raising=False)


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """Serve `app` on a free loopback port; yields its URL."""
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        with structlog.testing.capture_logs():
            yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()
