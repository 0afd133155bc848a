"""The user-facing harness end to end: the example project passes, and failures read well.

Each case runs pytest in a subprocess, as a team's CI would: `examples/user-suite` as shipped;
then a small suite written here with a deliberately wrong expectation, a bad scenario and a bad
manifest, whose report must carry the helpers' and validators' messages (and, for bad input, no
traceback from inside gpuyard); then the plugin registered twice (entry point + conftest).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pytest(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_example_user_suite_passes() -> None:
    result = _pytest("examples/user-suite", "-p", "no:randomly", cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout


USER_TESTS = '''
from pathlib import Path

import pytest

JOB = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: quad}
spec:
  pytorchReplicaSpecs:
    Worker:
      replicas: 1
      template:
        spec:
          containers: [{name: pytorch, image: x, resources: {limits: {nvidia.com/gpu: 4}}}]
"""


async def test_wrong_model(gpuyard_cluster):
    c = await gpuyard_cluster(nodes=[("dgx1-v100", 1)])
    job = await c.submit(JOB)
    await c.run_until(job, "Running", timeout=60)
    c.assert_on_model(job, "H100")


@pytest.fixture
async def broken_cluster(gpuyard_cluster):
    return await gpuyard_cluster(Path(__file__).parent / "bad-cluster.yaml")


async def test_bad_scenario(broken_cluster):
    pass


async def test_bad_manifest(gpuyard_cluster):
    c = await gpuyard_cluster(nodes=["dgx1-v100"])
    await c.submit(JOB.replace("replicas: 1", "replicas: two"))
'''


def _project(tmp_path: Path, *, conftest: str = 'pytest_plugins = ["gpuyard.testing"]\n') -> Path:
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "bad-cluster.yaml").write_text("nodeGroups:\n  - name: gpu\n    topology: dgx7\n")
    (tmp_path / "test_user.py").write_text(USER_TESTS)
    return tmp_path


def _section(output: str, test: str) -> str:
    """The report section of one failed test (from its header to the next one)."""
    start = output.index(f" {test} ")
    nxt = output.find("\n___", start + 1)
    nxt2 = output.find("short test summary", start + 1)
    ends = [e for e in (nxt, nxt2) if e != -1]
    return output[start : min(ends) if ends else len(output)]


def test_failures_read_as_the_helpers_and_validators_say(tmp_path: Path) -> None:
    result = _pytest("-p", "no:randomly", cwd=_project(tmp_path))
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "2 failed, 1 error" in out  # a fixture that fails is an error at setup

    wrong = _section(out, "test_wrong_model")
    assert (
        "AssertionError: job default/quad expected on H100 GPUs, but quad-worker-0 on dgx1-v100-0 (Tesla-V100"
        in wrong
    )
    assert "quad-worker-0: dgx1-v100-0 v100 gpus=[" in wrong  # the placement table is part of the message
    assert 'c.assert_on_model(job, "H100")' in wrong  # the traceback stops at the user's line

    scenario = _section(out, "test_bad_scenario")
    assert "invalid scenario:" in scenario and "bad-cluster.yaml: nodeGroups.0.topology:" in scenario
    assert "unknown topology preset 'dgx7'; allowed: dgx1-v100" in scenario
    assert "gpuyard/" not in scenario and "Traceback" not in scenario

    manifest = _section(out, "test_bad_manifest")
    assert "invalid job manifest:" in manifest
    assert "<job text>: spec.pytorchReplicaSpecs.Worker.replicas:" in manifest
    assert "gpuyard/" not in manifest and "Traceback" not in manifest


def test_plugin_registered_by_entry_point_and_conftest_alike(tmp_path: Path) -> None:
    """pluggy refuses one module under two names; the plugin reserves the other name itself."""
    (tmp_path / "as_entry_point.py").write_text(
        "import gpuyard.testing\n\n"
        "def pytest_addhooks(pluginmanager):\n"
        "    pluginmanager.register(gpuyard.testing, 'gpuyard')  # what the pytest11 entry point does\n"
    )
    project = _project(tmp_path)
    (project / "test_user.py").write_text(
        "async def test_ok(gpuyard_cluster):\n"
        "    c = await gpuyard_cluster(nodes=['dgx1-v100'])\n"
        "    assert len(c.store.list('Node')) == 1\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "as_entry_point"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
