"""`gpuyard submit` of a job that can never fit on the cluster: the job is created, and the
server's `can never fit on this cluster` warning is printed on stderr, as kubectl prints warnings."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from gpuyard.cli.jobs import register
from gpuyard.platform.api.app import make_app
from gpuyard.state.context import Context
from tests.builders import make_node
from tests.integration.serving import clean_cli_env, serving

JOB = """apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {{name: {name}, namespace: team-a}}
spec:
  pytorchReplicaSpecs:
    Worker:
      replicas: {replicas}
      template:
        spec:
          containers: [{{name: pytorch, image: x, resources: {{limits: {{cpu: 1, nvidia.com/gpu: 8}}}}}}]
"""


@click.group()
def root() -> None:
    """A stand-in for the `gpuyard` root group."""


register(root)


async def invoke(*args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, root, list(args), catch_exceptions=False)


async def test_submit_prints_the_never_fit_warning_on_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    clean_cli_env(monkeypatch, tmp_path)
    big, small = tmp_path / "big.yaml", tmp_path / "small.yaml"
    big.write_text(JOB.format(name="big", replicas=3))
    small.write_text(JOB.format(name="small", replicas=1))
    ctx = Context.for_tests()
    ctx.store.create(make_node("n1", gpus=8))
    ctx.store.create(make_node("n2", gpus=8))
    async with serving(make_app(ctx)) as url:
        result = await invoke("submit", str(big), "--server", url)
        assert result.exit_code == 0, result.output
        assert result.stdout == "pytorchjob/big created in namespace team-a\n"
        assert result.stderr.splitlines() == [
            "warning: can never fit on this cluster: PyTorchJob team-a/big: Worker needs 3 pods of 8 GPUs, "
            "1 CPU placed together; the 2 nodes that may run it could hold 2 even empty (the largest: "
            "8 GPUs, 64 CPU)",
            "warning: can never fit on this cluster: PyTorchJob team-a/big: asks 24 GPUs, the cluster has 16",
        ]
        assert ctx.store.get("PyTorchJob", "team-a", "big") is not None
        result = await invoke("submit", str(small), "--server", url)
        assert result.exit_code == 0 and result.stderr == ""
