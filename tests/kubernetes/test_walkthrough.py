"""The Kubernetes walkthrough of docs/kubernetes.md, end to end, with real processes and kubectl.

`gpuyard fake-apiserver`, `gpuyard fake-nodes` and two `gpuyard serve --backend kubernetes`
replicas run as separate processes; `kubectl apply -f` submits KubeDL's TFJob example
(`example/tf/tf_job_mnist.yaml` as KubeDL ships it: `kubeflow.org/v1`, namespace `kubedl`, kept
verbatim in `tests/data/kubedl/`). While its pod runs, the API server forgets its history and drops
every watch (each informer's next WATCH answers 410 Gone and it re-lists), and the leader is
SIGKILLed; the standby takes the Lease over, and the job still ends Succeeded, its pod bound once,
by gpuyard, and `kubectl get tfjobs` shows the phase. gpuyard's replicas present their own token,
so the API server's audit tells their calls apart: every one of them is granted by the ClusterRole
(and leader-election Role) that `gpuyard install --print` ships.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs the kubectl binary")

ROOT = Path(__file__).resolve().parents[2]
JOB_FILE = ROOT / "tests" / "data" / "kubedl" / "tf_job_mnist.yaml"
SERVICE_ACCOUNT_TOKEN = "gpuyard-serviceaccount"  # the replicas' token: their calls in the audit
FAST_LEASE = {  # seconds: a takeover within a few seconds keeps the test short
    "GPUYARD__BACKEND__KUBERNETES__LEADER_ELECTION__LEASE_DURATION": "3",
    "GPUYARD__BACKEND__KUBERNETES__LEADER_ELECTION__RENEW_DEADLINE": "2",
    "GPUYARD__BACKEND__KUBERNETES__LEADER_ELECTION__RETRY_PERIOD": "0.5",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], Any], *, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except (httpx.HTTPError, subprocess.CalledProcessError, KeyError, ValueError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


class Stack:
    """The processes of the walkthrough, each logging to its own file under `tmp`."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.files: list[Any] = []
        self.api_port = free_port()
        self.api = f"http://127.0.0.1:{self.api_port}"
        self.kubeconfig = tmp / "kc.yaml"

    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> None:
        log = (self.tmp / f"{name}.log").open("wb")
        self.files.append(log)
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "gpuyard.cli", *args],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        )

    def kubectl(self, *args: str, stdin: bytes | None = None) -> str:
        out = subprocess.run(
            ["kubectl", "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            check=True,
            timeout=60,
        )
        return out.stdout.decode()

    def kubeconfig_as(self, token: str) -> Path:
        """A copy of the server's kubeconfig presenting `token`."""
        config = yaml.safe_load(self.kubeconfig.read_text())
        for user in config["users"]:
            user["user"] = {"token": token}
        path = self.tmp / f"kc-{token}.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for f in self.files:
            f.close()

    def serve_replicas(
        self, kubeconfig: Path, names: tuple[str, ...] = ("gpuyard-a", "gpuyard-b")
    ) -> dict[str, int]:
        """`gpuyard serve --backend kubernetes` replicas with a fast Lease, each waited for
        ready; their HTTP ports by name."""
        ports = {}
        for name in names:
            ports[name] = free_port()
            self.start(
                name,
                "serve",
                "--backend",
                "kubernetes",
                "--kubeconfig",
                str(kubeconfig),
                "--port",
                str(ports[name]),
                "--data-dir",
                str(self.tmp / name),
                env={**FAST_LEASE, "POD_NAME": name},
            )
        for name, port in ports.items():
            wait_for(
                f"{name} ready",
                lambda port=port: httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200,
            )
        return ports

    def worker_pod(self) -> dict[str, Any]:
        """The KubeDL example's one pod."""
        return json.loads(self.kubectl("get", "pod", "-n", "kubedl", "mnist-worker-0", "-o", "json"))

    def lease_holder(self) -> str:
        lease = json.loads(self.kubectl("get", "lease", "-n", "gpuyard-system", "gpuyard", "-o", "json"))
        return str(lease["spec"]["holderIdentity"])

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.tmp.glob("*.log")))


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path)
    try:
        yield s
    except BaseException:
        print(s.logs())
        raise
    finally:
        s.stop()


def test_a_kubedl_tfjob_succeeds_through_a_410_and_a_leader_kill(stack: Stack) -> None:
    stack.start(
        "apiserver",
        "fake-apiserver",
        "--port",
        str(stack.api_port),
        "--kubeconfig-out",
        str(stack.kubeconfig),
        "--audit",
    )
    wait_for("the API server", lambda: httpx.get(f"{stack.api}/version").status_code == 200)
    crds = subprocess.run(
        [sys.executable, "-m", "gpuyard.cli", "install", "--print", "--crds-only"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    ).stdout
    stack.kubectl("apply", "-f", "-", stdin=crds)
    stack.start(
        "fake-nodes",
        "fake-nodes",
        "--kubeconfig",
        str(stack.kubeconfig),
        "--cluster",
        "configs/clusters/demo.yaml",
        "--pod-duration",
        "6s",
    )
    ports = stack.serve_replicas(stack.kubeconfig_as(SERVICE_ACCOUNT_TOKEN))

    stack.kubectl("apply", "-f", str(JOB_FILE))

    pod = stack.worker_pod
    running = wait_for(
        "the worker running", lambda: pod().get("status", {}).get("phase") == "Running" and pod()
    )
    assert running["spec"]["schedulerName"] == "gpuyard"
    node = running["spec"]["nodeName"]
    assert node

    # A forced 410: history compacted, every watch dropped; each informer re-lists.
    httpx.post(f"{stack.api}/_gpuyard/faults", json={"action": "compact"}).raise_for_status()
    httpx.post(f"{stack.api}/_gpuyard/faults", json={"action": "drop-watches"}).raise_for_status()

    # The leader dies mid-run; the standby takes the Lease over.
    holder = stack.lease_holder
    leader = wait_for("a leader", holder)
    standby = next(n for n in ports if n != leader)
    stack.procs[leader].send_signal(signal.SIGKILL)
    wait_for("the standby to lead", lambda: holder() == standby, timeout=60)

    def phase() -> str:
        job = json.loads(stack.kubectl("get", "tfjobs.kubeflow.org", "-n", "kubedl", "mnist", "-o", "json"))
        conditions = job.get("status", {}).get("conditions") or []
        return str(conditions[-1]["type"]) if conditions else ""

    wait_for("the TFJob to succeed", lambda: phase() == "Succeeded", timeout=180)
    assert "Succeeded" in stack.kubectl("get", "tfjobs", "-n", "kubedl")
    finished = pod()
    assert finished["status"]["phase"] == "Succeeded"
    assert finished["spec"]["nodeName"] == node  # never moved, never bound twice

    audit = httpx.get(f"{stack.api}/_gpuyard/audit").json()
    records = audit["records"] if isinstance(audit, dict) else audit
    bindings = [
        r for r in records if r["subresource"] == "binding" and r["verb"] == "create" and r["code"] < 300
    ]
    assert len(bindings) == 1, bindings
    assert {r["user"] for r in bindings} == {SERVICE_ACCOUNT_TOKEN}  # bound by gpuyard

    # Every call gpuyard made is granted by the RBAC it ships.
    shipped = list(
        yaml.safe_load_all(
            subprocess.run(
                [sys.executable, "-m", "gpuyard.cli", "install", "--print"],
                cwd=ROOT,
                capture_output=True,
                check=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            ).stdout
        )
    )
    rules = [
        rule for doc in shipped if doc and doc["kind"] in ("ClusterRole", "Role") for rule in doc["rules"]
    ]
    ours = {
        (r["group"], r["resource"] + (f"/{r['subresource']}" if r["subresource"] else ""), r["verb"])
        for r in records
        if r["user"] == SERVICE_ACCOUNT_TOKEN
    }
    assert ("", "pods/binding", "create") in ours and ("coordination.k8s.io", "leases", "update") in ours
    denied = sorted(
        call
        for call in ours
        if not any(
            call[0] in rule["apiGroups"] and call[1] in rule["resources"] and call[2] in rule["verbs"]
            for rule in rules
        )
    )
    assert not denied, f"calls the shipped ClusterRole does not grant: {denied}"
