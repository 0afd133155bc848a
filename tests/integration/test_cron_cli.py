"""`gpuyard apply -f` of a Cron, `gpuyard get crons` and `gpuyard describe cron` against the whole
platform served on a loopback port (virtual clock): the sample Cron is applied, runs on schedule,
and is listed and described with its runs; a bad schedule exits 2 naming the field; `gpuyard
validate` checks a Cron file offline."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml
from click.testing import CliRunner

from gpuyard.apis.crons import Cron
from gpuyard.cli import main
from gpuyard.testing import Cluster
from tests.integration.serving import clean_cli_env

SAMPLE = Path(__file__).resolve().parents[2] / "configs" / "jobs" / "crons" / "mnist-nightly-cron.yaml"


async def cli(url: str, *args: str) -> Any:
    with structlog.testing.capture_logs():  # the server's logs stay out of what the CLI prints
        return await asyncio.to_thread(
            CliRunner().invoke, main, [*args, "--server", url], catch_exceptions=False
        )


async def test_apply_get_and_describe_a_cron(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_cli_env(monkeypatch, tmp_path)
    doc = yaml.safe_load(SAMPLE.read_text())
    doc["spec"]["schedule"] = "*/5 * * * *"  # the sample's nightly run, every five minutes here
    good = tmp_path / "cron.yaml"
    good.write_text(yaml.safe_dump(doc))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**doc, "spec": {**doc["spec"], "schedule": "5 * *"}}))
    async with Cluster.start(nodes=[("dgx-a100", 1)], serve_http=True) as c:
        result = await cli(c.url, "apply", "-f", str(bad))
        assert result.exit_code == 2, result.output
        assert "spec.schedule" in result.output and "has 3 fields" in result.output
        result = await cli(c.url, "apply", "-f", str(good))
        assert result.exit_code == 0, result.output
        assert "cron" in result.output.lower() and "mnist-nightly" in result.output
        assert await c.until(
            lambda: c.store.must_get_of(Cron, "default", "mnist-nightly").status.active, timeout=301
        )
        run = c.store.must_get_of(Cron, "default", "mnist-nightly").status.active[0].name

        result = await cli(c.url, "get", "crons")
        assert result.exit_code == 0, result.output
        header, row = result.output.splitlines()[:2]
        assert header.split()[:4] == ["NAMESPACE", "NAME", "SCHEDULE", "SUSPEND"]
        assert row.split()[:2] == ["default", "mnist-nightly"] and "*/5 * * * *" in row
        listed = json.loads((await cli(c.url, "get", "crons", "-o", "json")).output)
        assert [x["metadata"]["name"] for x in listed] == ["mnist-nightly"]

        result = await cli(c.url, "describe", "cron", "default/mnist-nightly")
        assert result.exit_code == 0, result.output
        assert "Concurrency policy: Forbid" in result.output
        assert run in result.output and "SuccessfulCreate" in result.output
        result = await cli(c.url, "describe", "cron", "default/none")
        assert result.exit_code != 0 and "cron default/none not found" in result.output


def test_validate_checks_a_cron_offline(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["validate", str(SAMPLE)])
    assert result.exit_code == 0 and "1 Cron" in result.output, result.output
    doc = yaml.safe_load(SAMPLE.read_text())
    doc["spec"]["historyLimit"] = -1
    doc["spec"]["template"]["kind"] = "Deployment"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(main, ["validate", str(bad)])
    assert result.exit_code == 2
    assert "documents[0]: spec.historyLimit:" in result.output
    assert "documents[0]: spec.template.kind: 'Deployment' is not a job kind" in result.output
