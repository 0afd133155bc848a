"""`gpuyard describe job` and `GET .../jobs/{name}` show where a job's web UIs are: its
Tensorboard (`kubedl.io/tensorboard-config`) and a MarsJob's web service (`webHost`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio
import yaml

from gpuyard.controllers.marsweb import MarsWebReconciler
from gpuyard.controllers.tensorboards import TensorboardReconciler
from gpuyard.state.context import Context
from gpuyard.state.workqueues import ControllerRunner
from tests.builders import make_node
from tests.integration.serving import serving
from tests.integration.test_operator_api import make
from tests.integration.test_operator_cli import Live
from tests.unit.controllers.fakes import ScriptedBackend


@pytest_asyncio.fixture
async def live() -> AsyncIterator[Live]:
    ctx = Context.for_tests()
    ctx.store.create(make_node("node-a"))
    ctx.backend = ScriptedBackend(ctx.store)
    ctx.writer = ctx.backend.writer
    runners = [TensorboardReconciler(ctx), MarsWebReconciler(ctx)]
    tasks = [
        asyncio.create_task(ControllerRunner(r, store=ctx.store, clock=ctx.clock).run()) for r in runners
    ]
    try:
        async with serving(make(ctx)) as url:
            yield Live(ctx, url)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        ctx.store.close()


def tfjob(config: dict[str, Any]) -> dict[str, Any]:
    container = {"name": "tensorflow", "image": "tf:2"}
    return {
        "apiVersion": "training.kubedl.io/v1alpha1",
        "kind": "TFJob",
        "metadata": {
            "name": "mnist",
            "namespace": "default",
            "annotations": {"kubedl.io/tensorboard-config": json.dumps(config)},
        },
        "spec": {"tfReplicaSpecs": {"Worker": {"template": {"spec": {"containers": [container]}}}}},
    }


async def test_describe_job_shows_the_tensorboard_address(live: Live, tmp_path: Path) -> None:
    path = tmp_path / "tb.yaml"
    config = {"logDir": "/logs", "ingressSpec": {"host": "tb.example.com", "pathPrefix": "tb"}}
    path.write_text(yaml.safe_dump(tfjob(config)))
    result = await live.cli("submit", str(path))
    assert result.exit_code == 0, result.output
    for _ in range(5):
        await live.ctx.clock.advance(0.05)
    result = await live.cli("describe", "job", "default/mnist")
    assert result.exit_code == 0, result.output
    assert "Tensorboard: http://tb.example.com/tb/default/mnist/" in result.output
    assert "not made yet" not in result.output
    result = await live.cli("describe", "job", "default/mnist", "-o", "json")
    (ui,) = json.loads(result.output)["job"]["summary"]["webUIs"]
    assert ui == {
        "name": "tensorboard",
        "address": "http://tb.example.com/tb/default/mnist/",
        "objects": [
            "deployment/mnist-tensorboard-0",
            "service/mnist-tensorboard-0",
            "ingress/mnist-tensorboard-0",
        ],
        "ready": True,
    }


async def test_a_bad_tensorboard_config_is_refused_with_exit_2_naming_the_annotation(
    live: Live, tmp_path: Path
) -> None:
    doc = tfjob({"logDir": "/logs"})
    doc["metadata"]["annotations"]["kubedl.io/tensorboard-config"] = '{"logDir": '
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = await live.cli("submit", str(path))
    assert result.exit_code == 2
    assert "metadata.annotations.kubedl.io/tensorboard-config" in result.output
    assert "not valid JSON" in result.output
