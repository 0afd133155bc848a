"""The real `kubectl` against the test API server, with the kubeconfig it writes: apply of a CRD and of
a TFJob, get (table, short name, category, -o yaml), get -w, describe, delete.

Skipped where kubectl is not installed. The default kubectl is tested in full; the oldest and newest
of the versions installed beside it (`kubectl.1.27` ... `kubectl.1.33`) run apply and get.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest
import yaml

from gpuyard.testing.apiserver.fixture import RunningApiServer
from tests.kubernetes.conftest import crd_manifest

KUBECTL = shutil.which("kubectl")
TFJOB = Path(__file__).resolve().parents[2] / "configs" / "jobs" / "tf-dist-mnist.yaml"
JOB_NAME = "dist-mnist-for-e2e-test"

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (not on PATH)")


def _versioned() -> list[str]:
    """The oldest and newest `kubectl.1.NN` installed next to the default kubectl."""
    if KUBECTL is None:
        return []
    folder = Path(os.path.realpath(KUBECTL)).parent
    found = sorted(folder.glob("kubectl.1.*"), key=lambda p: int(p.name.rsplit(".", 1)[1]))
    return sorted({str(found[0]), str(found[-1])}) if found else []


class Kubectl:
    """Runs kubectl (as a subprocess of the test's event loop, which serves the API)."""

    def __init__(self, binary: str, server: RunningApiServer, tmp: Path) -> None:
        self.binary = binary
        self.base = [binary, "--kubeconfig", str(server.kubeconfig), "--cache-dir", str(tmp / "kube-cache")]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")} | {"HOME": str(tmp)}

    async def __call__(self, *args: str, ok: bool = True) -> str:
        proc = await asyncio.create_subprocess_exec(
            *self.base, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=self.env
        )
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        if ok:
            assert proc.returncode == 0, f"kubectl {' '.join(args)}: {err.decode()}"
        return out.decode() + err.decode()

    async def start(self, *args: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *self.base, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=self.env
        )


def _write_crd(tmp: Path) -> Path:
    path = tmp / "crd.yaml"
    path.write_text(yaml.safe_dump(crd_manifest()))
    return path


def _podgroup(tmp: Path) -> Path:
    path = tmp / "pg.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "scheduling.gpuyard.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {"name": "g1"},
                "spec": {},
            }
        )
    )
    return path


async def _read_line(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    return (await asyncio.wait_for(proc.stdout.readline(), 10)).decode()


async def test_kubectl_apply_get_watch_describe_delete(
    fake_apiserver: RunningApiServer, tmp_path: Path
) -> None:
    assert KUBECTL is not None
    kubectl = Kubectl(KUBECTL, fake_apiserver, tmp_path)
    assert "created" in await kubectl("apply", "-f", str(_write_crd(tmp_path)))
    assert "tfjob.kubeflow.org/dist-mnist-for-e2e-test created" in await kubectl("apply", "-f", str(TFJOB))
    assert "unchanged" in await kubectl("apply", "-f", str(TFJOB))

    table = await kubectl("get", "tfjobs")
    assert table.split("\n")[0].split() == ["NAME", "STATE", "AGE"] and JOB_NAME in table
    assert JOB_NAME in await kubectl("get", "tfj")  # short name
    assert JOB_NAME in await kubectl("get", "gpuyard")  # category
    doc = yaml.safe_load(await kubectl("get", "tfjob", JOB_NAME, "-o", "yaml"))
    assert doc["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] == 4
    assert doc["metadata"]["uid"] and doc["metadata"]["generation"] == 1

    watcher = await kubectl.start("get", "tfjobs", "-w", "--no-headers")
    try:
        assert JOB_NAME in await _read_line(watcher)
        fake_apiserver.server.objects.patch(
            fake_apiserver.server.catalog.get("kubeflow.org", "v1", "tfjobs"),
            JOB_NAME,
            namespace="default",
            patch={"status": {"conditions": [{"type": "Running", "status": "True"}]}},
            content_type="application/merge-patch+json",
            status=True,
        )
        changed = await _read_line(watcher)
        assert JOB_NAME in changed and "Running" in changed
    finally:
        watcher.terminate()
        await watcher.wait()

    described = await kubectl("describe", "tfjob", JOB_NAME)
    assert f"Name:         {JOB_NAME}" in described and "Kind:         TFJob" in described
    assert f'tfjob.kubeflow.org "{JOB_NAME}" deleted' in await kubectl("delete", "-f", str(TFJOB))
    missing = await kubectl("get", "tfjob", JOB_NAME, ok=False)
    assert "NotFound" in missing


async def test_kubectl_core_kinds(fake_apiserver: RunningApiServer, tmp_path: Path) -> None:
    assert KUBECTL is not None
    kubectl = Kubectl(KUBECTL, fake_apiserver, tmp_path)
    pod = tmp_path / "pod.yaml"
    pod.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "p", "labels": {"app": "x"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            }
        )
    )
    await kubectl("create", "namespace", "kubedl")
    await kubectl("apply", "-n", "kubedl", "-f", str(pod))
    await kubectl("label", "-n", "kubedl", "pod", "p", "tier=gpu")
    listed = await kubectl("get", "pods", "-A", "-l", "tier=gpu", "--no-headers")
    assert listed.split()[:4] == ["kubedl", "p", "0/1", "Pending"]
    assert "default" in await kubectl("get", "namespaces")
    fake_apiserver.server.install_gpuyard_crds()  # PodGroup and the rest, short names included
    await kubectl("create", "-n", "kubedl", "-f", str(_podgroup(tmp_path)))
    assert (await kubectl("get", "pg", "-n", "kubedl", "--no-headers")).split()[0] == "g1"
    assert "NodeTopology" in await kubectl("api-resources", "--api-group", "gpuyard.io")
    await kubectl("delete", "namespace", "kubedl")
    assert "No resources found" in await kubectl("get", "pods", "-A")


@pytest.mark.parametrize("binary", _versioned(), ids=lambda p: Path(p).name)
async def test_other_kubectl_versions_apply_and_get(
    binary: str, fake_apiserver: RunningApiServer, tmp_path: Path
) -> None:
    kubectl = Kubectl(binary, fake_apiserver, tmp_path)
    await kubectl("apply", "-f", str(_write_crd(tmp_path)))
    await kubectl("apply", "-f", str(TFJOB))
    assert JOB_NAME in await kubectl("get", "tfjobs")
    await kubectl("delete", "tfjob", JOB_NAME)
