"""`gpuyard suspend|resume|patch job`, `get priorityclasses` and `reschedule [--dry-run]` against
the whole platform served on a loopback port (virtual clock)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import structlog
from click.testing import CliRunner

from gpuyard.apis.scheduling import PodGroup, Reservation
from gpuyard.cli import main
from gpuyard.testing import Cluster
from tests.integration.serving import clean_cli_env
from tests.integration.test_rescheduling_platform import job, scattered


async def cli(url: str, *args: str) -> Any:
    with structlog.testing.capture_logs():  # the server's logs stay out of what the CLI prints
        return await asyncio.to_thread(
            CliRunner().invoke, main, [*args, "--server", url], catch_exceptions=False
        )


async def test_suspend_resume_and_patch_job(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_cli_env(monkeypatch, tmp_path)
    async with Cluster.start(nodes=[("dgx-a100", 1)], serve_http=True) as c:
        j = await c.submit(job("work", 8))
        await c.run_until(j, "Running", timeout=300)
        result = await cli(c.url, "suspend", "job", "default/work")
        assert result.exit_code == 0, result.output
        assert result.output.strip() == "pytorchjob/work suspended in namespace default"
        await c.run_until(j, "Suspended", timeout=120)
        await c.advance(5)
        assert c.store.list_of(Reservation) == [] and c.pods(j) == []
        result = await cli(c.url, "resume", "job", "work")
        assert result.exit_code == 0, result.output
        await c.run_until(j, "Running", timeout=300)

        result = await cli(
            c.url, "patch", "job", "work", "--type", "merge", "-p", '{"metadata": {"labels": {"team": "a"}}}'
        )
        assert result.exit_code == 0 and "pytorchjob/work patched" in result.output
        assert c.job(j).metadata.labels["team"] == "a"
        before = c.job(j).metadata.resource_version
        result = await cli(
            c.url,
            "patch",
            "job",
            "work",
            "-p",
            '{"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 3}}}}',
        )
        assert result.exit_code == 2
        assert "spec.pytorchReplicaSpecs.Worker.replicas is immutable" in result.output
        assert c.job(j).metadata.resource_version == before
        result = await cli(c.url, "patch", "job", "work", "-p", "not json")
        assert result.exit_code == 2 and "-p: not JSON" in result.output
        result = await cli(c.url, "suspend", "job", "missing")
        assert result.exit_code == 2 and "not found" in result.output

        result = await cli(c.url, "get", "priorityclasses")
        assert result.exit_code == 0
        lines = result.output.splitlines()
        assert lines[0].split()[:3] == ["NAME", "VALUE", "GLOBAL-DEFAULT"]
        assert [ln.split()[0] for ln in lines[1:]] == ["system-node-critical", "system-cluster-critical"]


async def test_reschedule_dry_run_prints_the_plan_then_runs_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_cli_env(monkeypatch, tmp_path)
    async with scattered(serve_http=True) as (c, placed):
        result = await cli(c.url, "reschedule", "--dry-run")
        assert result.exit_code == 0, result.output
        header, row, tail = result.output.splitlines()
        assert header.split() == ["JOB", "POD", "FROM", "TO", "COST", "(GPU-h)"]
        assert row.split()[0] == "default/keep-3" and row.split()[2].startswith(placed["keep-3"] + "[")
        assert tail == "would let default/big start"
        assert not any(pg.status.evictions for pg in c.store.list_of(PodGroup))
        result = await cli(c.url, "reschedule", "-o", "json")
        assert result.exit_code == 0
        assert [m["job"] for m in json.loads(result.output)["moves"]] == ["default/keep-3"]
        await c.run_until(("default", "big"), "Running", timeout=600)
        result = await cli(c.url, "describe", "job", "keep-3")
        assert "Preempted or moved (who and why):" in result.output
        assert "Migrated" in result.output and "for default/big" in result.output
