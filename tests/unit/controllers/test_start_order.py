"""The start-order table: default DAG per kind, overrides, and when a role may start."""

from __future__ import annotations

import pytest

from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.jobspecs import DAGCondition
from gpuyard.controllers.ordering import can_start, dependencies_of
from gpuyard.controllers.workloads.base import WorkloadPlugin
from gpuyard.controllers.workloads.registry import plugin_for
from tests.unit.controllers.fakes import job_from, load_job

C = {"containers": [{"name": "main", "image": "x"}]}


def job(kind: str, api: str, roles: list[str]):  # type: ignore[no-untyped-def]
    field = {
        "TFJob": "tfReplicaSpecs",
        "PyTorchJob": "pytorchReplicaSpecs",
        "XGBoostJob": "xgbReplicaSpecs",
        "MPIJob": "mpiReplicaSpecs",
        "MarsJob": "marsReplicaSpecs",
        "JAXJob": "jaxReplicaSpecs",
        "PaddleJob": "paddleReplicaSpecs",
        "XDLJob": "xdlReplicaSpecs",
        "ElasticDLJob": "elasticdlReplicaSpecs",
    }[kind]
    spec = {field: {r: {"replicas": 1, "template": {"spec": C}} for r in roles}}
    return job_from({"apiVersion": api, "kind": kind, "metadata": {"name": "j"}, "spec": spec})


KUBEDL, KUBEFLOW = "training.kubedl.io/v1alpha1", "kubeflow.org/v1"


def start_order(job: TrainingJob, plugin: WorkloadPlugin) -> list[list[str]]:
    """Roles grouped in waves: each wave starts once the waves before it are up."""
    deps = dependencies_of(job, plugin)
    remaining = list(job.roles())
    done: set[str] = set()
    waves: list[list[str]] = []
    while remaining:
        wave = [r for r in remaining if all(c.upstream in done for c in deps.get(r, []))]
        assert wave, f"a cycle among {remaining}"
        waves.append(wave)
        done.update(wave)
        remaining = [r for r in remaining if r not in wave]
    return waves


@pytest.mark.parametrize(
    ("kind", "api", "roles", "waves"),
    [
        ("TFJob", KUBEDL, ["PS", "Worker", "Chief", "Evaluator"], [["PS", "Evaluator"], ["Chief", "Worker"]]),
        ("TFJob", KUBEDL, ["PS", "Master", "Worker"], [["PS"], ["Master", "Worker"]]),
        ("TFJob", KUBEFLOW, ["GraphLearn", "PS", "Worker"], [["GraphLearn", "PS"], ["Worker"]]),
        ("TFJob", KUBEDL, ["GraphLearn", "Chief", "Worker"], [["GraphLearn", "Chief"], ["Worker"]]),
        ("PyTorchJob", KUBEDL, ["AIMaster", "Master", "Worker"], [["AIMaster"], ["Master"], ["Worker"]]),
        ("PyTorchJob", KUBEDL, ["AIMaster", "Worker"], [["AIMaster"], ["Worker"]]),
        ("PyTorchJob", KUBEFLOW, ["Master", "Worker"], [["Master"], ["Worker"]]),
        ("XGBoostJob", KUBEDL, ["Master", "Worker"], [["Master"], ["Worker"]]),
        ("MPIJob", KUBEFLOW, ["Launcher", "Worker"], [["Worker"], ["Launcher"]]),
        ("MarsJob", KUBEDL, ["Scheduler", "Worker", "WebService"], [["Scheduler"], ["WebService", "Worker"]]),
        ("JAXJob", KUBEFLOW, ["Worker"], [["Worker"]]),
        ("PaddleJob", KUBEFLOW, ["Master", "Worker"], [["Master"], ["Worker"]]),
        (
            "XDLJob",
            KUBEDL,
            ["PS", "Scheduler", "Worker", "ExtendRole"],
            [["PS", "Scheduler", "Worker", "ExtendRole"]],
        ),
        ("ElasticDLJob", KUBEDL, ["Master"], [["Master"]]),
    ],
)
def test_default_start_order(kind: str, api: str, roles: list[str], waves: list[list[str]]) -> None:
    j = job(kind, api, roles)
    assert start_order(j, plugin_for(kind)) == waves


def test_depends_on_overrides_and_empty_list_clears() -> None:
    j = job("TFJob", KUBEDL, ["PS", "Worker", "Chief"])
    j.replica_specs["Worker"].depends_on = [DAGCondition(upstream="chief", on_phase="Succeeded")]
    j.replica_specs["Chief"].depends_on = []
    deps = dependencies_of(j, plugin_for("TFJob"))
    assert deps == {"Worker": [DAGCondition(upstream="Chief", on_phase="Succeeded")]}
    assert start_order(j, plugin_for("TFJob")) == [["PS", "Chief"], ["Worker"]]


def test_can_start_needs_every_upstream_pod_at_the_phase() -> None:
    deps = {"Worker": [DAGCondition(upstream="PS", on_phase="Running")]}
    replicas = {"PS": 2, "Worker": 3}
    assert not can_start("Worker", deps=deps, replicas=replicas, phases={})
    assert not can_start("Worker", deps=deps, replicas=replicas, phases={"PS": {0: "Running"}})
    assert not can_start("Worker", deps=deps, replicas=replicas, phases={"PS": {0: "Running", 1: "Pending"}})
    assert can_start("Worker", deps=deps, replicas=replicas, phases={"PS": {0: "Running", 1: "Succeeded"}})
    assert can_start("PS", deps=deps, replicas=replicas, phases={})
    # Succeeded and Failed rank alike (KubeDL's phaseComparator)
    done = {"Worker": [DAGCondition(upstream="PS", on_phase="Succeeded")]}
    assert not can_start(
        "Worker", deps=done, replicas=replicas, phases={"PS": {0: "Running", 1: "Succeeded"}}
    )
    assert can_start("Worker", deps=done, replicas=replicas, phases={"PS": {0: "Failed", 1: "Succeeded"}})


def test_missing_upstream_role_counts_as_ready() -> None:
    deps = {"Worker": [DAGCondition(upstream="PS")]}
    assert can_start("Worker", deps=deps, replicas={"Worker": 1}, phases={})


def test_hostnetwork_example_waits_for_both_ps() -> None:
    j = load_job("tf-mnist-hostnetwork")
    assert start_order(j, plugin_for("TFJob")) == [["PS"], ["Worker"]]
