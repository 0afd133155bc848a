"""Hostile input is refused fast with a 4xx naming the field and what is allowed; the CLI exits 2."""

from __future__ import annotations

import asyncio

import pytest
from click.testing import CliRunner

from gpuyard.cli import main
from gpuyard.platform.api.app import make_app
from gpuyard.state.context import Context


@pytest.fixture
async def client(aiohttp_client):
    ctx = Context.for_tests()
    return await aiohttp_client(make_app(ctx)), ctx


async def test_an_unknown_phase_is_400_naming_phase_and_the_allowed_ones(client):
    http, _ = client
    resp = await asyncio.wait_for(http.get("/api/v1/jobs?phase=Bogus"), 1)
    assert resp.status == 400
    detail = (await resp.json())["error"]["details"][0]
    assert detail["field"] == "phase"
    assert "Running" in detail["reason"] and "Succeeded" in detail["reason"]
    assert (await http.get("/api/v1/jobs?phase=running")).status == 200


def test_get_jobs_with_an_unknown_phase_exits_2_naming_the_allowed_phases():
    result = CliRunner().invoke(main, ["get", "jobs", "--phase", "Bogus", "--server", "http://127.0.0.1:9"])
    assert result.exit_code == 2
    assert "--phase" in result.output and "running" in result.output.lower()
