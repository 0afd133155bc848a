"""Pods, Services and PodGroups built from a job: labels, devices, code sync, host network, gang."""

from __future__ import annotations

import json

from gpuyard.apis.scheduling import ANNOTATION_DEVICES, pod_name
from gpuyard.controllers.materializing import build_pod, build_service
from gpuyard.controllers.podgroups import pod_group_spec
from gpuyard.controllers.workloads.registry import plugin_for
from tests.unit.controllers.fakes import load_job, reserve

GIT = (
    '{"source": "https://github.com/kubedl-io/kubedl.git", "branch": "master", "image": "kubedl/git-sync:v2"}'
)


def test_pod_is_bound_with_devices_labels_and_never_restarts_in_place() -> None:
    job = load_job("tf-mnist-hostnetwork")
    res = reserve(job)
    pod = build_pod(
        job, "Worker", 2, plugin=plugin_for("TFJob"), reservation=res["mnist-worker-2"], host_port=20004
    )
    assert pod.metadata.name == "mnist-worker-2" and pod.metadata.namespace == "kubedl"
    assert pod.spec.node_name == "node-a" and pod.spec.restart_policy == "Never"
    assert pod.metadata.owner_references[0].kind == "TFJob"
    assert pod.spec.scheduler_name == "gpuyard"
    assert pod.metadata.labels == {  # KubeDL's and Kubeflow's labels, whichever group the job is in
        "group-name": "training.kubedl.io",
        "job-name": "mnist",
        "replica-type": "worker",
        "replica-index": "2",
        "training.kubeflow.org/job-name": "mnist",
        "training.kubeflow.org/replica-type": "worker",
        "training.kubeflow.org/replica-index": "2",
    }
    assert pod.metadata.annotations["fake.gpuyard.io/duration"] == "120"  # template annotations kept
    devices = json.loads(pod.metadata.annotations[ANNOTATION_DEVICES])
    assert devices == {"gpus": [1], "gpuIds": ["GPU-node-a-1"], "nics": [], "hostPorts": [20004]}
    env = pod.spec.containers[0].env_dict()
    # the container sees only its GPU, renumbered 0; the physical index is GPUYARD_GPU_INDICES
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["CUDA_VISIBLE_DEVICES"]) == ("GPU-node-a-1", "0")
    assert env["GPUYARD_GPU_INDICES"] == "1"


def test_kubeflow_pods_carry_both_label_sets_and_the_master_role() -> None:
    job = load_job("pytorch-simple")
    pod = build_pod(
        job, "Master", 0, plugin=plugin_for("PyTorchJob"), reservation=reserve(job)["pytorch-simple-master-0"]
    )
    labels = pod.metadata.labels
    assert labels["job-role"] == "master" and labels["training.kubeflow.org/job-role"] == "master"
    assert labels["training.kubeflow.org/job-name"] == "pytorch-simple"
    assert labels["training.kubeflow.org/operator-name"] == "pytorchjob-controller"


def test_git_sync_config_becomes_an_init_container() -> None:
    job = load_job("pytorch-kubedl")
    job.metadata.annotations["kubedl.io/git-sync-config"] = GIT
    pod = build_pod(
        job,
        "Worker",
        0,
        plugin=plugin_for("PyTorchJob"),
        reservation=reserve(job)["pytorch-dist-sendrecv-example-worker-0"],
    )
    (init,) = pod.spec.init_containers
    assert init.name == "git-sync-code" and init.image == "kubedl/git-sync:v2"
    assert [(e.name, e.value) for e in init.env] == [
        ("GIT_SYNC_REPO", "https://github.com/kubedl-io/kubedl.git"),
        ("GIT_SYNC_ONE_TIME", "true"),
        ("GIT_SYNC_MAX_SYNC_FAILURES", "3"),
        ("GIT_SYNC_BRANCH", "master"),
        ("GIT_SYNC_ROOT", "/code"),
        ("GIT_SYNC_DEST", "kubedl"),
    ]
    assert init.model_extra["volumeMounts"] == [{"name": "git-sync", "readOnly": False, "mountPath": "/code"}]
    assert pod.spec.model_extra["volumes"] == [{"name": "git-sync", "emptyDir": {}}]
    mount = pod.spec.containers[0].model_extra["volumeMounts"][-1]
    assert mount == {"name": "git-sync", "readOnly": False, "mountPath": "kubedl", "subPath": "kubedl"}


def test_services_headless_or_forwarding_to_the_host_port() -> None:
    job = load_job("tf-dist-mnist")
    svc = build_service(job, "PS", 1, plugin=plugin_for("TFJob"))
    assert svc.metadata.name == "dist-mnist-for-e2e-test-ps-1" and svc.spec.cluster_ip == "None"
    assert [(p.name, p.port, p.target_port) for p in svc.spec.ports] == [("tfjob-port", 2222, 2222)]
    hn = load_job("tf-dist-mnist", host_network=True)
    svc = build_service(hn, "PS", 1, plugin=plugin_for("TFJob"), host_port=21234)
    assert svc.spec.cluster_ip is None and svc.spec.type == "ClusterIP"
    assert [(p.port, p.target_port) for p in svc.spec.ports] == [(2222, 21234)]
    assert svc.spec.selector == {
        "group-name": "kubeflow.org",
        "job-name": "dist-mnist-for-e2e-test",
        "replica-type": "ps",
        "replica-index": "1",
    }


def test_pod_group_carries_the_gang() -> None:
    job = load_job("tf-mnist-hostnetwork")
    job.metadata.annotations["gpuyard.io/gang-group"] = "kubedl/other, kubedl/third"
    spec = pod_group_spec(job, plugin_for("TFJob"))
    assert [(r.name, r.replicas, r.host_ports) for r in spec.roles] == [("PS", 2, 1), ("Worker", 3, 1)]
    assert spec.roles[1].template.host_network and spec.roles[1].template.restart_policy == "Never"
    assert spec.queue == "kubedl" and spec.gang_group == ["kubedl/other", "kubedl/third"] and not spec.suspend
    assert spec.minimum() == 5
    elastic = pod_group_spec(load_job("pytorch-elastic"), plugin_for("PyTorchJob"))
    assert (elastic.roles[0].replicas, elastic.roles[0].min_available, elastic.minimum()) == (2, 1, 1)


def test_mpi_launcher_template_in_the_gang_includes_its_init_container() -> None:
    job = load_job("mpi-tensorflow-mnist")
    spec = pod_group_spec(job, plugin_for("MPIJob"))
    launcher = next(r for r in spec.roles if r.name == "Launcher")
    assert [c.name for c in launcher.template.init_containers] == ["kubectl-delivery"]
    assert launcher.template.requests()["memory"] >= 2 * 2**30


def test_pod_names_match_the_contract() -> None:
    job = load_job("mars-kubedl")
    for role in job.roles():
        for i in range(job.replica_specs[role].count):
            pod = build_pod(
                job,
                role,
                i,
                plugin=plugin_for("MarsJob"),
                reservation=reserve(job)[pod_name(job.metadata.name, role, i)],
            )
            assert pod.metadata.name == pod_name(job.metadata.name, role, i)
