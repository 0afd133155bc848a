"""Golden tests: the env / TF_CONFIG / hostfile / Services gpuyard generates for each kind.

Every job file in `configs/jobs/` (taken from the KubeDL and Kubeflow examples) is rendered with a
fixed placement, in normal and in host-network mode, and compared byte for byte with
`tests/golden/<job>[.hostnetwork].json` (and `.hostfile` for MPI launchers). The golden files were
checked by hand against the reference operators' Go sources cited in each plugin's docstring.
Regenerate after an intended change with `UPDATE_GOLDEN=1 pytest tests/unit/controllers`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.scheduling import pod_name
from gpuyard.controllers.materializing import build_pod, build_service
from gpuyard.controllers.workloads.mpi import ANNOTATION_CONFIG_FILES
from gpuyard.controllers.workloads.registry import plugin_for
from tests.unit.controllers.fakes import JOBS, load_job, reserve

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
CASES = sorted(p.stem for p in JOBS.glob("*.yaml"))


def render(job: TrainingJob, *, cluster_domain: str = "") -> dict[str, Any]:
    plugin = plugin_for(job.kind)
    placement = reserve(job)
    pods: dict[str, Any] = {}
    services: dict[str, Any] = {}
    for role in job.roles():
        for index in range(job.replica_specs[role].count):
            name = pod_name(job.metadata.name, role, index)
            res = placement[name]
            port = res.spec.host_ports[0] if job.host_network else None
            pod = build_pod(
                job,
                role,
                index,
                plugin=plugin,
                reservation=res,
                host_port=port,
                cluster_domain=cluster_domain,
            )
            spec = pod.spec
            entry: dict[str, Any] = {
                "node": spec.node_name,
                "labels": pod.metadata.labels,
                "containers": {
                    c.name: {
                        "env": [e.to_dict() for e in c.env],
                        "ports": [p.to_dict() for p in c.ports],
                        **({"command": c.command} if c.command else {}),
                        **({"args": c.args} if c.args and job.KIND == "MPIJob" else {}),
                        **(
                            {"volumeMounts": c.model_extra["volumeMounts"]}
                            if (c.model_extra or {}).get("volumeMounts")
                            else {}
                        ),
                    }
                    for c in spec.containers
                },
            }
            if spec.host_network:
                entry["hostNetwork"] = True
                entry["dnsPolicy"] = spec.dns_policy
            if spec.init_containers:
                entry["initContainers"] = [c.to_dict() for c in spec.init_containers]
            if (spec.model_extra or {}).get("volumes"):
                entry["volumes"] = spec.model_extra["volumes"]  # type: ignore[index]
            entry["annotations"] = {
                k: v for k, v in pod.metadata.annotations.items() if k.startswith("gpuyard.io/")
            }
            pods[name] = entry
            services[name] = build_service(job, role, index, plugin=plugin, host_port=port).to_dict()["spec"]
    return {"pods": pods, "services": services}


def check(name: str, actual: str) -> None:
    path = GOLDEN / name
    if UPDATE or not path.exists():
        if not UPDATE:
            pytest.fail(f"missing golden file {path}; run with UPDATE_GOLDEN=1 and review it")
        path.write_text(actual)
        return
    assert actual == path.read_text(), f"{name} differs from the golden file"


@pytest.mark.parametrize("host_network", [False, True], ids=["normal", "hostnetwork"])
@pytest.mark.parametrize("case", CASES)
def test_golden_wiring(case: str, host_network: bool) -> None:
    job = load_job(case, host_network=host_network)
    rendered = render(job)
    suffix = ".hostnetwork" if host_network else ""
    check(f"{case}{suffix}.json", json.dumps(rendered, indent=2, sort_keys=True) + "\n")
    if job.KIND == "MPIJob":
        launcher = pod_name(job.metadata.name, "Launcher", 0)
        files = json.loads(rendered["pods"][launcher]["annotations"][ANNOTATION_CONFIG_FILES])
        check(f"{case}.hostfile", files["/etc/mpi/hostfile"])


def test_custom_cluster_domain_reaches_tf_config() -> None:
    job = load_job("tf-dist-mnist")
    rendered = render(job, cluster_domain="cluster.local")
    env = rendered["pods"]["dist-mnist-for-e2e-test-worker-1"]["containers"]["tensorflow"]["env"]
    config = json.loads(next(e["value"] for e in env if e["name"] == "TF_CONFIG"))
    assert config["cluster"]["ps"] == [
        "dist-mnist-for-e2e-test-ps-0.default.svc.cluster.local:2222",
        "dist-mnist-for-e2e-test-ps-1.default.svc.cluster.local:2222",
    ]
    assert config["task"] == {"type": "worker", "index": 1}


def test_single_replica_tfjob_gets_no_tf_config() -> None:
    job = load_job("tf-dist-mnist")
    job.replica_specs.pop("PS")
    job.replica_specs["Worker"].replicas = 1
    rendered = render(job)
    env = rendered["pods"]["dist-mnist-for-e2e-test-worker-0"]["containers"]["tensorflow"]["env"]
    assert not [e for e in env if e["name"] == "TF_CONFIG"]  # KubeDL/Kubeflow isDistributed
