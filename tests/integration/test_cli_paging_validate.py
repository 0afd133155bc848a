"""The CLI against a live loopback server: `get jobs` follows `continue` pages; `submit --validate`
prints the server's unknown-field warnings, or exits 2 naming the field with `strict`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from gpuyard.cli.client import ApiClient
from gpuyard.cli.jobs import register
from gpuyard.platform.api.app import make_app
from gpuyard.state.context import Context
from tests.integration.serving import clean_cli_env, serving

JOB = """apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {{name: {name}, namespace: team-a}}
spec:{extra}
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
          containers: [{{name: pytorch, image: x, resources: {{limits: {{cpu: 1}}}}}}]
"""


@click.group()
def root() -> None:
    """A stand-in for the `gpuyard` root group."""


register(root)


def invoke(*args: str) -> object:
    return asyncio.to_thread(CliRunner().invoke, root, list(args), catch_exceptions=False)


async def test_get_jobs_fetches_every_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    clean_cli_env(monkeypatch, tmp_path)
    ctx = Context.for_tests()
    async with serving(make_app(ctx)) as url:
        body = "---\n".join(JOB.format(name=f"j{i:03d}", extra="") for i in range(23))
        await asyncio.to_thread(ApiClient(url).submit, body)
        client = ApiClient(url, chunk_size=5)
        listed = await asyncio.to_thread(client.jobs)
        assert [j["metadata"]["name"] for j in listed["items"]] == [f"j{i:03d}" for i in range(23)]
        result = await invoke("get", "jobs", "-o", "json", "--server", url)
        assert result.exit_code == 0, result.output
        assert len(json.loads(result.output)) == 23


async def test_submit_prints_unknown_field_warnings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    clean_cli_env(monkeypatch, tmp_path)
    path = tmp_path / "job.yaml"
    path.write_text(JOB.format(name="j", extra="\n  bogusField: 1"))
    ctx = Context.for_tests()
    async with serving(make_app(ctx)) as url:
        result = await invoke("submit", str(path), "--server", url, "--validate", "strict")
        assert result.exit_code == 2
        assert "spec.bogusField" in result.output and "unknown field" in result.output
        assert ctx.store.get("PyTorchJob", "team-a", "j") is None
        result = await invoke("submit", str(path), "--server", url)
        assert result.exit_code == 0, result.output
        assert 'warning: unknown field "spec.bogusField"' in result.output
        path.write_text(JOB.format(name="k", extra="\n  bogusField: 1"))
        result = await invoke("submit", str(path), "--server", url, "--validate=ignore")
        assert result.exit_code == 0 and "warning" not in result.output
