"""The pytest fixture `fake_apiserver`: a test API server on a free port of 127.0.0.1, in the test's
event loop, with a kubeconfig for it; stopped after the test.

    async def test_watch(fake_apiserver):
        config = await kubernetes_asyncio.config.load_kube_config(str(fake_apiserver.kubeconfig))
        fake_apiserver.server.faults.drop_watches()

Registered by gpuyard's pytest plugin (`gpuyard.testing`). Needs the `kubernetes` extra (kmock).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuyard.testing.apiserver.server import FakeApiServer

__all__ = ["RunningApiServer", "fake_apiserver"]


@dataclass(frozen=True)
class RunningApiServer:
    """What the fixture gives: the server object, its URL and a kubeconfig file for it."""

    server: FakeApiServer
    url: str
    kubeconfig: Path


async def _fake_apiserver(tmp_path: Path) -> AsyncIterator[RunningApiServer]:
    """A started `FakeApiServer` (request auditing on, bookmarks every 0.2 s)."""
    server = FakeApiServer(port=0, audit=True, bookmark_interval=0.2)
    await server.start()
    try:
        path = server.write_kubeconfig(tmp_path / "fake-apiserver.kubeconfig")
        yield RunningApiServer(server=server, url=server.url, kubeconfig=path)
    finally:
        await server.stop()


def _register() -> object:
    """pytest-asyncio's fixture decorator, or pytest's where it is not installed (the plugin must
    load without it)."""
    try:
        from pytest_asyncio import fixture
    except ImportError:  # pragma: no cover
        return pytest.fixture(_fake_apiserver, name="fake_apiserver")
    return fixture(_fake_apiserver, name="fake_apiserver")


fake_apiserver = _register()
