"""Job kinds at the edge: accepted as written, defaulted like the reference operators, bad input named."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuyard.apis.jobkinds import API_KUBEDL, API_KUBEFLOW, PyTorchJob, TFJob
from gpuyard.apis.jobs import JobValidationError, load_documents, parse_job
from tests.unit.controllers.fakes import JOBS, load_job

C = {"containers": [{"name": "tensorflow", "image": "tf"}]}


def tf(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_KUBEDL,
        "kind": "TFJob",
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": spec,
    }


def fields(doc: Any) -> dict[str, str]:
    with pytest.raises(JobValidationError) as err:
        parse_job(doc)
    return {d["field"]: d["reason"] for d in err.value.details}


@pytest.mark.parametrize("path", sorted(JOBS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_parses_and_round_trips(path) -> None:  # type: ignore[no-untyped-def]
    (doc,) = load_documents(path.read_text())
    job = parse_job(doc)
    again = parse_job(json.loads(json.dumps(job.to_dict())))
    assert again.to_dict() == job.to_dict()


def test_defaults_follow_the_reference_operators() -> None:
    job = parse_job(
        tf(
            tfReplicaSpecs={
                "ps": {"template": {"spec": C}},
                "WORKER": {"replicas": 2, "template": {"spec": C}},
            }
        )
    )
    assert isinstance(job, TFJob) and job.flavor == "kubedl"
    assert sorted(job.replica_specs) == ["PS", "Worker"]  # replica types normalised (setTypeNames)
    assert job.replica_specs["PS"].replicas == 1
    assert job.replica_specs["Worker"].restart_policy == "ExitCode"  # KubeDL's TF default
    port = job.replica_specs["Worker"].template.spec.containers[0].ports[0]
    assert (port.name, port.container_port) == ("tfjob-port", 2222)
    assert job.run_policy.clean_pod_policy == "Running"
    kf = parse_job({**tf(tfReplicaSpecs={"Worker": {"template": {"spec": C}}}), "apiVersion": API_KUBEFLOW})
    assert kf.replica_specs["Worker"].restart_policy == "Never"  # Kubeflow's TF default


def test_kubeflow_pytorch_defaults() -> None:
    job = load_job("pytorch-elastic")
    assert isinstance(job, PyTorchJob)
    assert job.spec.nproc_per_node == "auto"
    assert (job.spec.elastic_policy.min_replicas, job.spec.elastic_policy.max_replicas) == (1, 3)  # type: ignore[union-attr]
    assert job.replica_specs["Worker"].restart_policy == "OnFailure"


def test_kubedl_inline_and_kubeflow_nested_run_policy() -> None:
    inline = parse_job(
        tf(
            tfReplicaSpecs={"Worker": {"template": {"spec": C}}},
            backoffLimit=3,
            schedulingPolicy={"queue": "q1", "minAvailable": 1},
        )
    )
    assert inline.run_policy.backoff_limit == 3 and inline.queue == "q1"
    nested = parse_job(
        {
            **tf(
                tfReplicaSpecs={"Worker": {"template": {"spec": C}}},
                runPolicy={"backoffLimit": 5, "suspend": True},
            ),
            "apiVersion": API_KUBEFLOW,
        }
    )
    assert nested.run_policy.backoff_limit == 5 and nested.suspended
    assert parse_job(tf(tfReplicaSpecs={"Worker": {"template": {"spec": C}}})).queue == "ns"


def test_unknown_fields_pass_through() -> None:
    doc = tf(
        tfReplicaSpecs={"Worker": {"template": {"spec": {**C, "volumes": [{"name": "v", "emptyDir": {}}]}}}},
        enableDynamicWorker=False,
    )
    out = parse_job(doc).to_dict()
    assert out["spec"]["enableDynamicWorker"] is False
    assert out["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["volumes"] == [
        {"name": "v", "emptyDir": {}}
    ]


# --- bad input -------------------------------------------------------------------------------


def test_unknown_kind_lists_allowed_kinds() -> None:
    got = fields({"apiVersion": API_KUBEDL, "kind": "SparkJob", "metadata": {"name": "x"}})
    assert (
        "allowed: ElasticDLJob, JAXJob, MPIJob, MarsJob, PaddleJob, PyTorchJob, TFJob, XDLJob, XGBoostJob"
        in got["kind"]
    )


def test_unknown_api_version_lists_allowed_versions() -> None:
    got = fields({**tf(tfReplicaSpecs={}), "apiVersion": "kubeflow.org/v1beta2"})
    assert got["apiVersion"].endswith("allowed: kubeflow.org/v1, training.kubedl.io/v1alpha1")
    got = fields({"apiVersion": API_KUBEDL, "kind": "JAXJob", "metadata": {"name": "x"}, "spec": {}})
    assert got["apiVersion"].endswith("allowed: kubeflow.org/v1")


def test_every_offending_field_is_listed() -> None:
    got = fields(
        tf(
            tfReplicaSpecs={
                "Foo": {"template": {"spec": C}},
                "Worker": {
                    "replicas": -1,
                    "restartPolicy": "Sometimes",
                    "template": {
                        "spec": {
                            "containers": [{"name": "tensorflow", "resources": {"limits": {"cpu": "2x"}}}]
                        }
                    },
                },
            },
            cleanPodPolicy="Some",
        )
    )
    assert got["spec.tfReplicaSpecs.Foo"].endswith(
        "allowed: Chief, Evaluator, GraphLearn, Master, PS, Worker"
    )
    assert "non-negative" in got["spec.tfReplicaSpecs.Worker.replicas"]
    assert (
        got["spec.tfReplicaSpecs.Worker.restartPolicy"]
        == "Input should be 'Always', 'OnFailure', 'Never' or 'ExitCode'"
    )
    assert (
        "'2x' is not a quantity; allowed:"
        in got["spec.tfReplicaSpecs.Worker.template.spec.containers.0.resources.limits.cpu"]
    )
    assert got["spec.cleanPodPolicy"] == "Input should be 'All', 'Running' or 'None'"


def test_replica_type_must_exist_for_the_projects_kind() -> None:
    doc = {
        "apiVersion": API_KUBEFLOW,
        "kind": "PyTorchJob",
        "metadata": {"name": "p"},
        "spec": {"pytorchReplicaSpecs": {"AIMaster": {"template": {"spec": C}}}},
    }
    assert fields(doc)["spec.pytorchReplicaSpecs.AIMaster"].endswith("allowed: Master, Worker")
    doc["apiVersion"] = API_KUBEDL
    assert parse_job(doc).replica_specs["AIMaster"].restart_policy == "Always"


def test_name_and_structure_errors() -> None:
    got = fields(
        tf(tfReplicaSpecs={"Worker": {"template": {"spec": C}}}) | {"metadata": {"name": "Bad_Name"}}
    )
    assert "metadata.name" in got
    assert "metadata.name" in fields(
        tf(tfReplicaSpecs={"Worker": {"template": {"spec": C}}}) | {"metadata": {}}
    )
    assert "at least one replica type" in fields(tf())["spec.tfReplicaSpecs"]
    assert (
        "at least one container"
        in fields(tf(tfReplicaSpecs={"Worker": {"template": {"spec": {"containers": []}}}}))[
            "spec.tfReplicaSpecs.Worker.template.spec.containers"
        ]
    )
    assert fields(["not", "a", "job"]) == {"<root>": "expected an object, got list"}


def test_depends_on_errors() -> None:
    got = fields(
        tf(
            tfReplicaSpecs={
                "PS": {"dependsOn": [{"upstream": "Worker"}], "template": {"spec": C}},
                "Worker": {"dependsOn": [{"upstream": "PS"}, {"upstream": "Chef"}], "template": {"spec": C}},
            }
        )
    )
    assert (
        got["spec.tfReplicaSpecs.Worker.dependsOn.1.upstream"]
        == "unknown replica type 'Chef'; allowed: PS, Worker"
    )
    assert got["spec.tfReplicaSpecs"].startswith("dependsOn forms a cycle:")
    bad_phase = fields(
        tf(
            tfReplicaSpecs={
                "Worker": {"dependsOn": [{"upstream": "PS", "onPhase": "Pending"}], "template": {"spec": C}}
            }
        )
    )
    assert (
        bad_phase["spec.tfReplicaSpecs.Worker.dependsOn.0.onPhase"]
        == "Input should be 'Running' or 'Succeeded'"
    )


def test_kind_specific_rules() -> None:
    two_masters = {
        "apiVersion": API_KUBEFLOW,
        "kind": "PyTorchJob",
        "metadata": {"name": "p"},
        "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 2, "template": {"spec": C}}}},
    }
    assert "at most one Master" in fields(two_masters)["spec.pytorchReplicaSpecs.Master.replicas"]
    too_many = tf(
        tfReplicaSpecs={"Worker": {"replicas": 2, "template": {"spec": C}}},
        schedulingPolicy={"minAvailable": 3},
    )
    assert fields(too_many)["spec.schedulingPolicy.minAvailable"].endswith("allowed: 0..2")


def test_load_documents_forms() -> None:
    one = json.dumps(tf(tfReplicaSpecs={"Worker": {"template": {"spec": C}}}))
    assert len(load_documents(one)) == 1
    assert len(load_documents(f"[{one}, {one}]")) == 2
    assert len(load_documents(json.dumps({"kind": "List", "items": [json.loads(one)] * 3}))) == 3
    assert len(load_documents("---\nkind: TFJob\n---\nkind: PyTorchJob\n---\n")) == 2
    with pytest.raises(JobValidationError) as err:
        load_documents("kind: TFJob\n  bad: [indent\n")
    assert "line" in err.value.details[0]["reason"]
    with pytest.raises(JobValidationError):
        load_documents("")


def test_git_sync_annotation_is_checked_at_submit() -> None:
    doc = tf(tfReplicaSpecs={"Worker": {"template": {"spec": C}}})
    doc["metadata"]["annotations"] = {"kubedl.io/git-sync-config": "{not json"}
    assert fields(doc)["metadata.annotations.kubedl.io/git-sync-config"].startswith("not valid JSON")
    doc["metadata"]["annotations"] = {"kubedl.io/git-sync-config": '{"branch": "main"}'}
    assert "source" in fields(doc)["metadata.annotations.kubedl.io/git-sync-config"]
