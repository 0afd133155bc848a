"""The Kubernetes walkthrough on the real control plane (`make k8s-bin`), as a user runs it.

On a cluster that already has training-operator's and mpi-operator's CRDs, `gpuyard install --print`
is applied server-side (CRDs, namespace, RBAC, Deployment, Service); `gpuyard fake-nodes` plays the
GPU nodes' kubelets; two `gpuyard serve --backend kubernetes` replicas run as gpuyard's own
ServiceAccount, with a token from `kubectl create token` (the API server enforces RBAC, Node
authorization and OwnerReferencesPermissionEnforcement); `kubectl apply -f` submits KubeDL's
`example/tf/tf_job_mnist.yaml` as shipped. The leader is SIGKILLed while the job runs; the standby
takes the Lease over and the job ends Succeeded, its pod bound once, by gpuyard's ServiceAccount.
The API server's audit log shows no request of gpuyard's refused (403), no write of gpuyard's
refused as invalid (400, 415, 422: everything it writes passes the real API server's validation),
and every request it made is one the shipped roles grant.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from typing import Any

import pytest
import yaml

from tests.kubernetes.peers import MPI_OPERATOR, TRAINING_OPERATOR
from tests.kubernetes.realplane import ControlPlaneView, admin_http, install_crds
from tests.kubernetes.test_walkthrough import JOB_FILE, ROOT, Stack, wait_for

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs the kubectl binary")
SERVICE_ACCOUNT = "system:serviceaccount:gpuyard-system:gpuyard"


def test_two_replicas_as_gpuyards_service_account_run_kubedls_tfjob_through_a_leader_kill(
    clean_plane: Any, plane_stack: Stack
) -> None:
    plane, stack = clean_plane, plane_stack
    with admin_http(plane) as http:
        peers = [c for c in TRAINING_OPERATOR.crd_docs() if c["spec"]["names"]["kind"] != "MPIJob"]
        install_crds(http, peers + MPI_OPERATOR.crd_docs())
        audit_from = plane.audit_log.stat().st_size

        printed = subprocess.run(
            [sys.executable, "-m", "gpuyard.cli", "install", "--print"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        stack.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=printed)
        token = stack.kubectl("create", "token", "gpuyard", "-n", "gpuyard-system", "--duration=2h").strip()
        kubeconfig = plane.token_kubeconfig(stack.tmp / "gpuyard-sa.yaml", token=token, user="gpuyard")

        stack.start(
            "fake-nodes",
            "fake-nodes",
            "--kubeconfig",
            str(plane.admin_kubeconfig),
            "--cluster",
            "configs/clusters/demo.yaml",
            "--pod-duration",
            "8s",
            "--heartbeat",
            "2",
        )
        ports = stack.serve_replicas(kubeconfig)

        stack.kubectl("create", "namespace", "kubedl")
        stack.kubectl("apply", "-f", str(JOB_FILE))

        pod = stack.worker_pod
        running = wait_for(
            "the worker running", lambda: pod().get("status", {}).get("phase") == "Running" and pod()
        )
        assert running["spec"]["schedulerName"] == "gpuyard"
        node = running["spec"]["nodeName"]

        holder = stack.lease_holder
        leader = wait_for("a leader", holder)
        standby = next(n for n in ports if n != leader)
        stack.procs[leader].send_signal(signal.SIGKILL)
        wait_for("the standby to lead", lambda: holder() == standby, timeout=60)

        def phase() -> str:
            job = json.loads(
                stack.kubectl("get", "tfjobs.kubeflow.org", "-n", "kubedl", "mnist", "-o", "json")
            )
            conditions = job.get("status", {}).get("conditions") or []
            return str(conditions[-1]["type"]) if conditions else ""

        wait_for("the TFJob to succeed", lambda: phase() == "Succeeded", timeout=180)
        assert "Succeeded" in stack.kubectl("get", "tfjobs.kubeflow.org", "-n", "kubedl")
        finished = pod()
        assert finished["status"]["phase"] == "Succeeded"
        assert finished["spec"]["nodeName"] == node  # never moved, never bound twice

        view = ControlPlaneView(plane, http)
        view._audit_from = audit_from
        events = view.audit()
        bindings = [
            e
            for e in events
            if e["verb"] == "create"
            and e["objectRef"].get("subresource") == "binding"
            and e["objectRef"].get("namespace") == "kubedl"
            and e.get("responseStatus", {}).get("code", 0) < 300
        ]
        assert [e["user"]["username"] for e in bindings] == [SERVICE_ACCOUNT]  # once, by gpuyard
        ours = [e for e in events if e["user"]["username"] == SERVICE_ACCOUNT]
        assert ours, "the replicas authenticated as gpuyard's ServiceAccount"
        refused = sorted(
            {
                (e["verb"], e["objectRef"].get("resource", ""), e["objectRef"].get("subresource", ""))
                for e in ours
                if e.get("responseStatus", {}).get("code") == 403
            }
        )
        assert not refused, f"RBAC refused gpuyard's calls: {refused}"
        invalid = sorted(
            {
                (e["verb"], e["objectRef"].get("resource", ""), e["objectRef"].get("subresource", ""))
                for e in ours
                if e["verb"] in ("create", "update", "patch")
                and e.get("responseStatus", {}).get("code") in (400, 415, 422)
            }
        )
        assert not invalid, f"the API server refused gpuyard's writes as invalid: {invalid}"
        shipped = [d for d in yaml.safe_load_all(printed) if d]
        assert {d["kind"] for d in shipped} >= {"ClusterRole", "Deployment", "CustomResourceDefinition"}
