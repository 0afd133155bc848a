"""`gpuyard check` and `GET /api/v1/check` against a live in-process platform: ok (exit 0),
a broken invariant (exit 1, the objects named), bad input (exit 2 / 400), JSON output."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from gpuyard.apis.meta import OwnerReference
from gpuyard.apis.scheduling import ANNOTATION_DEVICES, Reservation
from gpuyard.cli import main
from gpuyard.testing import Cluster
from tests.builders import make_pod
from tests.integration.serving import clean_cli_env

JOB = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: ddp, namespace: default}
spec:
  pytorchReplicaSpecs:
    Worker:
      replicas: 2
      template:
        metadata: {annotations: {fake.gpuyard.io/duration: "600"}}
        spec: {containers: [{name: pytorch, image: x, resources: {limits: {nvidia.com/gpu: 4}}}]}
"""


async def _cli(url: str, *args: str) -> Any:
    argv = ["check", *args, "--server", url]
    return await asyncio.to_thread(CliRunner().invoke, main, argv, catch_exceptions=False)


@pytest.mark.gpuyard_no_invariants  # the test breaks an invariant on purpose
async def test_check_reports_ok_then_a_double_allocated_gpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_cli_env(monkeypatch, tmp_path)
    async with Cluster.start(nodes=[("dgx1-v100", 1)], serve_http=True) as c:
        job = await c.submit(JOB)
        await c.run_until(job, "Running")
        r = await _cli(c.url)
        assert r.exit_code == 0, r.output
        assert r.output.startswith("ok: 11 invariants hold (1 Node, 2 Pod, 2 Reservation, 1 PodGroup")

        res = c.store.list_of(Reservation)[0]
        intruder = make_pod(
            "intruder",
            node=res.spec.node,
            annotations={ANNOTATION_DEVICES: json.dumps({"gpus": res.spec.gpus})},
        )
        intruder.status.phase = "Running"
        c.store.create(intruder)
        r = await _cli(c.url, "--grace", "0")
        assert r.exit_code == 1
        assert "gpu" in r.output and "Pod/default/intruder" in r.output and res.metadata.name in r.output

        r = await _cli(c.url, "--grace", "0", "-o", "json")
        assert r.exit_code == 1
        answer = json.loads(r.output)
        assert answer["ok"] is False
        assert {v["invariant"] for v in answer["violations"]} == {"gpu"}
        assert all(v["family"] == "safety" for v in answer["violations"])


async def test_a_bad_grace_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_cli_env(monkeypatch, tmp_path)
    async with Cluster.start(nodes=[("dgx1-v100", 1)], serve_http=True) as c:
        r = await _cli(c.url, "--grace", "61")
        assert r.exit_code == 2 and "--grace" in r.output
        async with httpx.AsyncClient() as client:
            answer = await client.get(f"{c.url}/api/v1/check", params={"grace": "soon"})
        assert answer.status_code == 400
        assert answer.json()["error"]["details"] == [{"field": "grace", "reason": "seconds, 0..60"}]


async def test_a_settled_violation_that_clears_within_the_grace_is_not_reported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_cli_env(monkeypatch, tmp_path)
    async with Cluster.start(nodes=[("dgx1-v100", 1)], serve_http=True) as c:
        orphan = make_pod("orphan", node=None)
        orphan.metadata.owner_references = [
            OwnerReference(api_version="kubeflow.org/v1", kind="PyTorchJob", name="gone", uid="u-1")
        ]
        stored = c.store.create(orphan)
        async with httpx.AsyncClient() as client:
            seen = (await client.get(f"{c.url}/api/v1/check", params={"grace": "0"})).json()
            assert [v["invariant"] for v in seen["violations"]] == ["owner"]
            pending = asyncio.create_task(client.get(f"{c.url}/api/v1/check", params={"grace": "0.5"}))
            await asyncio.sleep(0.1)
            c.store.delete("Pod", "default", stored.metadata.name)  # the change in flight lands
            later = (await pending).json()
        assert later["ok"] is True, later
