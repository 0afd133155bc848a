"""The topology issue's "done when" on the demo cluster, through the Platform on a virtual clock.

A 4-GPU PyTorchJob asking for RDMA on a DGX-1 node gets a fully NVLinked quad with the NICs under
its GPUs' PCIe switches; `gpuyard describe node` shows the job holding each GPU and NIC; a GPU
marked unhealthy in the NodeTopology (as an NVML agent would) fails the pod with DeviceUnhealthy
and the node annotation follows.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import click
import pytest
import pytest_asyncio
import structlog
import yaml
from click.testing import CliRunner

from gpuyard.apis.jobkinds import find_job
from gpuyard.cli.jobs import register as register_jobs
from gpuyard.cli.nodes import register as register_nodes
from gpuyard.controllers.reconciling import JobReconciler
from gpuyard.devices.presets import DGX1_NVLINKS
from gpuyard.platform.api import app as app_module
from gpuyard.platform.runtime import Platform
from gpuyard.state.clock import VirtualClock
from gpuyard.state.config import Settings
from tests.unit.controllers.fakes import ROOT


@click.group()
def cli_root() -> None:
    """Stand-in for the `gpuyard` root group."""


register_jobs(cli_root)
register_nodes(cli_root)

JOB = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "metadata": {"name": "quad", "namespace": "default"},
    "spec": {
        "pytorchReplicaSpecs": {
            "Master": {
                "replicas": 1,
                "template": {
                    "spec": {
                        "nodeSelector": {"gpuyard.io/gpu-model": "v100"},
                        "containers": [
                            {
                                "name": "pytorch",
                                "image": "train",
                                "resources": {
                                    "limits": {
                                        "nvidia.com/gpu": 4,
                                        "rdma/hca": 2,
                                        "cpu": "8",
                                        "memory": "32Gi",
                                    }
                                },
                            }
                        ],
                    }
                },
            }
        }
    },
}


@pytest_asyncio.fixture
async def platform(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Platform]:
    modules = list(app_module.ROUTE_MODULES)
    for extra in ("gpuyard.platform.api.jobs", "gpuyard.platform.api.nodes"):
        if extra not in modules:
            modules.append(extra)
    monkeypatch.setattr(app_module, "ROUTE_MODULES", modules)
    settings = Settings(
        server={"host": "127.0.0.1", "port": 0},
        backend={
            "cluster": str(ROOT / "configs" / "clusters" / "demo.yaml"),
            "data_dir": None,
            "clock": "virtual",
        },
    )
    p = Platform(settings, clock=VirtualClock(), serve_http=True, drive_clock=False)
    names = {c.name for c in p.components}
    if "job-operator" not in names:
        p.add_component(JobReconciler(p.ctx))
    if "scheduler" not in names:
        from gpuyard.scheduler import components as scheduler_components

        for c in scheduler_components(p.ctx):
            p.add_component(c)
    task = asyncio.create_task(p.run())
    await asyncio.wait_for(p.backend.synced.wait(), 5)
    await asyncio.wait_for(p.serving.wait(), 5)
    try:
        with structlog.testing.capture_logs():
            yield p
    finally:
        p.stop()
        await asyncio.wait_for(task, 10)


async def _cli(p: Platform, *args: str) -> Any:
    return await asyncio.to_thread(
        CliRunner().invoke, cli_root, [*args, "--server", p.url], catch_exceptions=False
    )


async def test_four_gpu_pytorchjob_gets_an_nvlinked_quad_with_its_nics(
    platform: Platform, tmp_path: Path
) -> None:
    clock = platform.clock
    job_file = tmp_path / "topology-quad.yaml"
    job_file.write_text(yaml.safe_dump(JOB))
    result = await _cli(platform, "submit", str(job_file))
    assert result.exit_code == 0, result.output

    def running() -> bool:
        job = find_job(platform.store, "default", "quad")
        return job is not None and job.status.phase == "Running"

    assert await clock.run_until(running, timeout=600)  # type: ignore[attr-defined]
    res = platform.store.must_get("Reservation", "default", "quad-master-0")
    node = res.spec.node  # type: ignore[attr-defined]
    gpus = tuple(res.spec.gpus)  # type: ignore[attr-defined]
    assert gpus in {(0, 1, 2, 3), (4, 5, 6, 7)}
    assert all((a, b) in DGX1_NVLINKS for a in gpus for b in gpus if a < b)  # fully NVLinked
    topo = platform.store.must_get("NodeTopology", "", node)
    switches = {topo.spec.gpus[g].pcie_switch for g in gpus}  # type: ignore[attr-defined]
    nics = list(res.spec.nics)  # type: ignore[attr-defined]
    assert len(nics) == 2 and {topo.nic(n).pcie_switch for n in nics} == switches  # type: ignore[attr-defined]
    pod = platform.store.must_get("Pod", "default", "quad-master-0")
    assert nics == json.loads(pod.metadata.annotations["gpuyard.io/devices"])["nics"]

    described = await _cli(platform, "describe", "node", node)
    assert described.exit_code == 0, described.output
    out = described.output
    assert out.count("default/quad") >= len(gpus) + len(nics), out
    for nic in nics:
        assert any(nic in line and "default/quad" in line for line in out.splitlines()), out
    as_json = await _cli(platform, "describe", "node", node, "-o", "json")
    data = json.loads(as_json.output)["topology"]
    assert sorted(int(g) for g in data["gpus"]) == list(gpus)
    assert all(h[0]["job"] == "default/quad" for h in data["gpus"].values())
    missing = await _cli(platform, "describe", "node", "no-such-node")
    assert missing.exit_code != 0

    # a GPU going unhealthy in the NodeTopology (as an NVML agent reports it) fails the pod
    def break_gpu(t):  # type: ignore[no-untyped-def]
        t.spec.gpus[gpus[0]].health = "Unhealthy"

    platform.store.mutate("NodeTopology", "", node, break_gpu)

    def failed() -> bool:
        p = platform.store.get("Pod", "default", "quad-master-0")
        return p is None or p.status.reason == "DeviceUnhealthy" or p.metadata.uid != pod.metadata.uid  # type: ignore[attr-defined]

    assert await clock.run_until(failed, timeout=60)  # type: ignore[attr-defined]
    annotated = platform.store.must_get("Node", "", node).metadata.annotations
    assert annotated.get("gpuyard.io/unhealthy-gpus") == str(gpus[0])
