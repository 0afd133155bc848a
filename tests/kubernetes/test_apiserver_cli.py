"""`gpuyard fake-apiserver` as a user runs it: a process serving on a port, a kubeconfig that
kubernetes-asyncio loads, gpuyard's CRDs (and the gang schedulers' PodGroups) on request, a clean exit on SIGTERM, exit codes for bad input."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

from click.testing import CliRunner
from kubernetes_asyncio import client, config

from gpuyard.cli import main

ROOT = Path(__file__).resolve().parents[2]


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuyard.cli", "fake-apiserver", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip


async def test_serves_with_a_kubeconfig_and_stops_on_sigterm(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc.yaml"
    proc = await _spawn("--port", "0", "--kubeconfig-out", str(kubeconfig), "--gpuyard-crds", "--gang-crds")
    try:
        assert proc.stderr is not None
        banner = (await asyncio.wait_for(proc.stderr.readline(), 20)).decode()
        assert "fake Kubernetes API server on http://127.0.0.1:" in banner and str(kubeconfig) in banner
        configuration = client.Configuration()
        await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
        async with client.ApiClient(configuration) as api:
            version = await client.VersionApi(api).get_code()
            assert version.major == "1"
            groups = await client.CustomObjectsApi(api).get_api_resources("scheduling.gpuyard.io", "v1alpha1")
            assert {r.name for r in groups.resources} >= {"podgroups", "podgroups/status", "reservations"}
            pg = await client.CustomObjectsApi(api).create_namespaced_custom_object(
                "scheduling.gpuyard.io", "v1alpha1", "default", "podgroups",
                {"apiVersion": "scheduling.gpuyard.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "g"}, "spec": {}},
            )  # fmt: skip
            assert pg["metadata"]["uid"]
            for group, version in (
                ("scheduling.volcano.sh", "v1beta1"),
                ("scheduling.x-k8s.io", "v1alpha1"),
                ("scheduling.sigs.k8s.io", "v1alpha1"),
            ):  # --gang-crds: the PodGroups of delegate mode's gang schedulers
                served = await client.CustomObjectsApi(api).get_api_resources(group, version)
                assert "podgroups" in {r.name for r in served.resources}
                assert {r.kind for r in served.resources if r.name == "podgroups"} == {"PodGroup"}
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 20)
    assert proc.returncode == 0


def test_bad_input_exits_2_and_a_busy_port_exits_1() -> None:
    runner = CliRunner()
    bad = runner.invoke(main, ["fake-apiserver", "--port", "70000"])
    assert bad.exit_code == 2 and "--port" in bad.output
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        taken = runner.invoke(main, ["fake-apiserver", "--port", str(port)])
    assert taken.exit_code == 1 and f"cannot listen on 127.0.0.1:{port}" in taken.output
    exposed = runner.invoke(main, ["fake-apiserver", "--host", "0.0.0.0", "--port", "0"])
    assert exposed.exit_code == 2 and "--token" in exposed.output
