"""What a job has beside its pods, on the fake cluster: KubeDL's Tensorboard
(`kubedl.io/tensorboard-config`), a MarsJob's web UI Ingress (`webHost`) and the
HorizontalPodAutoscaler of a PyTorchJob's `elasticPolicy.metrics`, scaled by the fake cluster's
autoscaler on the scenario's `hpaMetrics` and the virtual clock."""

from __future__ import annotations

import json
from typing import Any

from gpuyard.apis.addons import Deployment, HorizontalPodAutoscaler, Ingress
from gpuyard.apis.core import Event, Pod, Service
from gpuyard.apis.jobkinds import MarsJob
from gpuyard.apis.jobs import JobValidationError, parse_job
from gpuyard.state.ownership import USER
from gpuyard.state.writing import identified
from gpuyard.testing import Cluster

NODES = [("dgx-a100", 2)]
TB = "kubedl.io/tensorboard-config"


def tfjob(name: str, *, config: Any = None, duration: str = "30s") -> dict[str, Any]:
    annotations = (
        {TB: config if isinstance(config, str) else json.dumps(config)} if config is not None else {}
    )
    container = {"name": "tensorflow", "image": "tf:2", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    template = {
        "metadata": {"annotations": {"fake.gpuyard.io/duration": duration}},
        "spec": {"containers": [container]},
    }
    return {
        "apiVersion": "training.kubedl.io/v1alpha1",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {"tfReplicaSpecs": {"Worker": {"replicas": 1, "template": template}}},
    }


def objects(c: Cluster, name: str) -> dict[str, Any]:
    return {
        kind: c.store.get(kind, "default", name)
        for kind in ("Deployment", "Service", "Ingress")
        if c.store.get(kind, "default", name) is not None
    }


async def test_a_tensorboard_is_made_as_kubedl_makes_it_and_goes_ttl_after_the_job() -> None:
    config = {
        "logDir": "/mnt/logs/mnist",
        "ttlSecondsAfterJobFinished": 120,
        "image": "tensorflow/tensorflow:2.15.0",
        "ingressSpec": {"host": "tb.example.com", "pathPrefix": "/tb", "annotations": {"team": "vision"}},
    }
    async with Cluster.start(nodes=NODES) as c:
        job = await c.submit(tfjob("mnist", config=config))
        await c.until(lambda: len(objects(c, "mnist-tensorboard-0")) == 3, timeout=30)
        made = objects(c, "mnist-tensorboard-0")
        for obj in made.values():
            (ref,) = obj.metadata.owner_references
            assert (ref.kind, ref.name, ref.uid, ref.controller) == ("TFJob", "mnist", job.metadata.uid, True)
            assert obj.metadata.labels["job-name"] == "mnist"
            assert obj.metadata.labels["replica-type"] == "tensorboard"
            assert obj.metadata.annotations[TB] == json.dumps(config)
        deployment = made["Deployment"]
        assert isinstance(deployment, Deployment)
        pod = deployment.spec["template"]
        (container,) = pod["spec"]["containers"]
        assert container["name"] == "tensorboard" and container["image"] == "tensorflow/tensorflow:2.15.0"
        assert container["command"][-1].startswith(
            "python -m tensorboard.main --logdir /mnt/logs/mnist --path_prefix /tb/default/mnist"
        )
        assert container["resources"] == {} and container["ports"] == [{"containerPort": 6006}]
        assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": ""} in container["env"]
        assert pod["spec"]["restartPolicy"] == "Always"
        assert deployment.spec["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        service = made["Service"]
        assert isinstance(service, Service)
        assert service.spec.cluster_ip == "None" and [(p.name, p.port) for p in service.spec.ports] == [
            ("tensorboard", 6006)
        ]
        assert service.spec.selector == deployment.spec["selector"]["matchLabels"]
        ingress = made["Ingress"]
        assert isinstance(ingress, Ingress)
        (rule,) = ingress.spec["rules"]
        (path,) = rule["http"]["paths"]
        assert rule["host"] == "tb.example.com" and path["path"] == "/tb/default/mnist/"
        assert path["backend"] == {"service": {"name": "mnist-tensorboard-0", "port": {"number": 6006}}}
        assert ingress.metadata.annotations["team"] == "vision"
        # the fake cluster runs no Tensorboard, and says so (in describe job's Events)
        (warning,) = [
            e for e in c.store.list_of(Event, namespace="default") if e.reason == "TensorboardNotServed"
        ]
        assert warning.type == "Warning" and "http://tb.example.com/tb/default/mnist/" in warning.message
        # the job's own pods are not the Tensorboard's: the operator ran only its worker
        assert [p.metadata.name for p in c.pods(job)] == ["mnist-worker-0"]

        await c.run_until(job, "Succeeded", timeout=120)
        finished = c.now
        await c.advance(60)
        assert len(objects(c, "mnist-tensorboard-0")) == 3  # kept for ttlSecondsAfterJobFinished
        await c.until(lambda: not objects(c, "mnist-tensorboard-0"), timeout=120)
        assert c.now - finished >= 119


async def test_dropping_the_annotation_removes_the_tensorboard_and_no_host_means_no_ingress() -> None:
    async with Cluster.start(nodes=NODES) as c:
        job = await c.submit(tfjob("plain", config={"logDir": "/logs"}, duration="inf"))
        await c.until(lambda: len(objects(c, "plain-tensorboard-0")) == 2, timeout=30)
        assert set(objects(c, "plain-tensorboard-0")) == {"Deployment", "Service"}
        changed = c.job(job).clone()
        del changed.metadata.annotations[TB]
        await identified(c.writer, USER).update(changed)
        await c.until(lambda: not objects(c, "plain-tensorboard-0"), timeout=30)
        assert c.store.get("Service", "default", "plain-worker-0") is not None  # the job's own stays


def test_a_bad_tensorboard_config_is_refused_naming_the_annotation() -> None:
    for config, why in (
        ("{not json", "not valid JSON"),
        ('["/logs"]', "must be a JSON object"),
        ('{"image": "tb"}', "logDir"),
        ('{"logDir": "/l", "ttlSecondsAfterJobFinished": -1}', "ttlSecondsAfterJobFinished"),
        ('{"logDir": "/l", "ingressSpec": {"host": "Not A Host"}}', "DNS-1123"),
    ):
        try:
            parse_job(tfjob("bad", config=config))
        except JobValidationError as exc:
            text = json.dumps(exc.details)
            assert f"metadata.annotations.{TB}" in text and why in text, text
        else:
            raise AssertionError(f"{config!r} was accepted")


def marsjob(name: str, *, web_host: str | None) -> dict[str, Any]:
    def role(replicas: int) -> dict[str, Any]:
        container = {"name": "mars", "image": "mars", "resources": {"limits": {"cpu": 1, "memory": "1Gi"}}}
        meta = {"annotations": {"fake.gpuyard.io/duration": "inf"}}
        return {"replicas": replicas, "template": {"metadata": meta, "spec": {"containers": [container]}}}

    spec: dict[str, Any] = {
        "marsReplicaSpecs": {"Scheduler": role(1), "WebService": role(1), "Worker": role(1)}
    }
    if web_host:
        spec["webHost"] = web_host
    return {
        "apiVersion": "training.kubedl.io/v1alpha1",
        "kind": "MarsJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


async def test_a_mars_web_host_gives_each_web_service_its_ingress() -> None:
    async with Cluster.start(nodes=NODES) as c:
        job = await c.submit(marsjob("mars", web_host="mars.example.com"))
        await c.run_until(job, "Running", timeout=120)
        await c.until(lambda: c.store.get("Ingress", "default", "mars-webservice-0") is not None, timeout=30)
        ingress = c.store.get_of(Ingress, "default", "mars-webservice-0")
        svc = c.store.get_of(Service, "default", "mars-webservice-0")
        assert ingress is not None and svc is not None
        (ref,) = ingress.metadata.owner_references
        assert (ref.kind, ref.name, ref.uid) == ("Service", "mars-webservice-0", svc.metadata.uid)
        (rule,) = ingress.spec["rules"]
        assert rule["host"] == "mars.example.com"
        paths = [(p["path"], p["backend"]["service"]["port"]["number"]) for p in rule["http"]["paths"]]
        assert paths == [
            ("/mars/default/mars-webservice-0/(.*)", 11111),
            ("/mars/default/mars-webservice-0", 11111),
        ]
        assert ingress.metadata.annotations["nginx.ingress.kubernetes.io/rewrite-target"] == "/$1"
        reasons = [e.reason for e in c.store.list_of(Event, namespace="default") if e.type == "Warning"]
        assert reasons.count("WebUINotServed") == 1
        assert [i.metadata.name for i in c.store.list_of(Ingress, namespace="default")] == [
            "mars-webservice-0"
        ]
        # dropping webHost drops the Ingress
        changed = c.job(job).clone()
        assert isinstance(changed, MarsJob)
        changed.spec.web_host = None
        await identified(c.writer, USER).update(changed)
        await c.until(lambda: not c.store.list_of(Ingress, namespace="default"), timeout=30)


async def test_a_mars_job_without_web_host_has_no_ingress() -> None:
    async with Cluster.start(nodes=NODES) as c:
        job = await c.submit(marsjob("quiet", web_host=None))
        await c.run_until(job, "Running", timeout=120)
        await c.advance(30)
        assert c.store.get("Service", "default", "quiet-webservice-0") is not None
        assert not c.store.list_of(Ingress, namespace="default")


def elastic_job(name: str, *, workers: int, metrics: list[dict[str, Any]]) -> dict[str, Any]:
    container = {"name": "pytorch", "image": "train", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    template = {
        "metadata": {"annotations": {"fake.gpuyard.io/duration": "inf"}},
        "spec": {"containers": [container]},
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "elasticPolicy": {"minReplicas": 1, "maxReplicas": 4, "rdzvBackend": "c10d", "metrics": metrics},
            "pytorchReplicaSpecs": {"Worker": {"replicas": workers, "template": template}},
        },
    }


CPU_50 = {
    "type": "Resource",
    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}},
}


def running(c: Cluster, name: str) -> int:
    return sum(
        1
        for p in c.store.list_of(Pod, namespace="default", selector={"job-name": name})
        if p.status.phase == "Running"
    )


async def test_elastic_metrics_scale_the_workers_between_min_and_max_on_the_scenario_metrics() -> None:
    scenario = {
        "nodeGroups": [{"name": "gpu", "count": 1, "topology": "dgx-a100"}],
        "hpaMetrics": [
            {"job": "elastic", "metric": "cpu", "value": 100},  # twice the target: 2 -> 4 workers
            {"job": "elastic", "metric": "cpu", "at": "2m", "value": 10},  # a fifth: down to 1 (min)
        ],
    }
    async with Cluster.start(scenario) as c:
        job = await c.submit(elastic_job("elastic", workers=2, metrics=[CPU_50]))
        hpa = c.store.get_of(HorizontalPodAutoscaler, "default", "elastic")
        await c.until(
            lambda: c.store.get("HorizontalPodAutoscaler", "default", "elastic") is not None, timeout=10
        )
        hpa = c.store.get_of(HorizontalPodAutoscaler, "default", "elastic")
        assert hpa is not None
        assert hpa.spec["scaleTargetRef"] == {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "name": "elastic",
        }
        assert (hpa.spec["minReplicas"], hpa.spec["maxReplicas"], hpa.spec["metrics"]) == (1, 4, [CPU_50])
        assert hpa.metadata.owner_references[0].uid == job.metadata.uid

        def workers() -> int:
            return c.job(job).replica_specs["Worker"].count

        await c.until(lambda: workers() == 4, timeout=60)
        await c.until(lambda: running(c, "elastic") == 4, timeout=120)
        status = c.store.get_of(HorizontalPodAutoscaler, "default", "elastic")
        assert status is not None and status.status.desired_replicas == 4
        # the value drops at 2m; the scale-down waits out the 5-minute stabilization window
        await c.until(lambda: c.now >= 150, timeout=200)
        assert workers() == 4
        await c.until(lambda: workers() == 1, timeout=600)
        assert c.now >= 300
        await c.until(lambda: running(c, "elastic") == 1, timeout=120)
        assert c.phase(job) == "Running"


def test_bad_elastic_metrics_are_refused_naming_the_field() -> None:
    bad_target = {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization"}}}
    for metrics, field, why in (
        ([{"type": "Memory"}], "spec.elasticPolicy.metrics.0.type", "is not one of"),
        ([bad_target], "spec.elasticPolicy.metrics.0.resource.target.averageUtilization", "above 0"),
        (["cpu"], "spec.elasticPolicy.metrics.0", "dictionary"),
    ):
        try:
            parse_job(elastic_job("bad", workers=1, metrics=metrics))
        except JobValidationError as exc:
            assert any(d["field"] == field and why in d["reason"] for d in exc.details), exc.details
        else:
            raise AssertionError(f"{metrics!r} was accepted")
    kubedl = elastic_job("bad", workers=1, metrics=[CPU_50]) | {"apiVersion": "training.kubedl.io/v1alpha1"}
    try:
        parse_job(kubedl)
    except JobValidationError as exc:
        assert any(d["field"] == "spec.elasticPolicy.metrics" and "scale" in d["reason"] for d in exc.details)
    else:
        raise AssertionError("metrics on a training.kubedl.io PyTorchJob were accepted")


async def test_a_deployment_of_that_name_gpuyard_did_not_make_is_left_alone() -> None:
    async with Cluster.start(nodes=NODES) as c:
        theirs = Deployment(
            metadata={"name": "taken-tensorboard-0", "namespace": "default"}, spec={"replicas": 3}
        )
        c.store.create(theirs)
        await c.submit(tfjob("taken", config={"logDir": "/logs"}, duration="inf"))
        await c.until(
            lambda: c.store.get("Service", "default", "taken-tensorboard-0") is not None, timeout=30
        )
        await c.advance(30)
        kept = c.store.get_of(Deployment, "default", "taken-tensorboard-0")
        assert kept is not None and kept.spec == {"replicas": 3} and not kept.metadata.owner_references
