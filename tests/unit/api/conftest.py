"""Fixtures of the API tests: a test context and an HTTP client of its app (a module that needs
another context, e.g. with tokens, defines its own `ctx`)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuyard.platform.api import app as app_module
from gpuyard.state.context import Context


@pytest.fixture
def ctx() -> Context:
    return Context.for_tests()


@pytest.fixture
async def client(aiohttp_client: Any, ctx: Context) -> Any:
    return await aiohttp_client(app_module.make_app(ctx))
