"""The pod fields Kubernetes requires, refused at submit with the field named (`apis/podvalidation.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from gpuyard.apis.jobs import JobValidationError, parse_job
from gpuyard.cli import main
from gpuyard.platform.api.app import make_app
from gpuyard.state.context import Context

BASE = "spec.pytorchReplicaSpecs.Worker.template.spec"


def job(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    pod: dict[str, Any] = {"containers": list(containers)}
    if init is not None:
        pod["initContainers"] = init
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "typo", "namespace": "team-a"},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1, "template": {"spec": pod}}}},
    }


def problems(doc: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(JobValidationError) as err:
        parse_job(doc)
    return {d["field"]: d["reason"] for d in err.value.details}


def test_a_misspelt_image_is_refused_naming_image_and_the_typo() -> None:
    got = problems(job({"name": "pytorch", "imag": "pytorch:2"}))
    assert list(got) == [f"{BASE}.containers[0].image"]
    assert got[f"{BASE}.containers[0].image"] == "required; found unknown field 'imag': did you mean 'image'?"


def test_a_container_without_a_name_is_named_once() -> None:
    got = problems(job({"image": "x"}))
    assert list(got) == [f"{BASE}.containers[0].name"]  # not also pydantic's containers.0.name


@pytest.mark.parametrize(
    ("containers", "init", "field", "words"),
    [
        ([{"name": "Torch", "image": "x"}], None, "containers[0].name", "DNS-1123 label"),
        ([{"name": "a", "image": "x"}, {"name": "a", "image": "y"}], None, "containers[1].name", "duplicate"),
        ([{"name": "a", "image": "x"}], [{"name": "a", "image": "y"}], "containers[0].name", "duplicate"),
        ([{"name": "a", "image": " x"}], None, "containers[0].image", "whitespace"),
        (
            [{"name": "a", "image": "x", "imagePullPolicy": "Sometimes"}],
            None,
            "containers[0].imagePullPolicy",
            "IfNotPresent",
        ),
        (
            [{"name": "a", "image": "x", "ports": [{"name": "p"}]}],
            None,
            "containers[0].ports[0].containerPort",
            "required",
        ),
        (
            [{"name": "a", "image": "x", "ports": [{"containerPort": 1, "name": "a-very-long-port-name"}]}],
            None,
            "containers[0].ports[0].name",
            "15",
        ),
        (
            [{"name": "a", "image": "x", "ports": [{"containerPort": 1, "name": "80"}]}],
            None,
            "containers[0].ports[0].name",
            "letter",
        ),
        (
            [
                {
                    "name": "a",
                    "image": "x",
                    "ports": [{"containerPort": 1, "name": "p"}, {"containerPort": 2, "name": "p"}],
                }
            ],
            None,
            "containers[0].ports[1].name",
            "duplicate",
        ),
        (
            [
                {"name": "a", "image": "x", "ports": [{"containerPort": 1, "hostPort": 9000}]},
                {"name": "b", "image": "x", "ports": [{"containerPort": 2, "hostPort": 9000}]},
            ],
            None,
            "containers[1].ports[0].hostPort",
            "twice",
        ),
        (
            [{"name": "a", "image": "x", "env": [{"value": "1"}]}],
            None,
            "containers[0].env[0].name",
            "required",
        ),
        ([{"name": "a", "image": "x", "env": [{"name": "A=B"}]}], None, "containers[0].env[0].name", "'='"),
        (
            [{"name": "a", "image": "x", "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}],
            None,
            "containers[0].resources.requests.cpu",
            "less than or equal",
        ),
        ([{"name": "a", "image": "x"}], [{"name": "setup"}], "initContainers[0].image", "required"),
    ],
)
def test_what_the_api_server_requires_of_a_pod(
    containers: list[dict[str, Any]], init: list[dict[str, Any]] | None, field: str, words: str
) -> None:
    got = problems(job(*containers, init=init))
    assert f"{BASE}.{field}" in got, got
    assert words in got[f"{BASE}.{field}"]


def test_a_valid_pod_passes() -> None:
    ok = {
        "name": "pytorch",
        "image": "pytorch:2",
        "imagePullPolicy": "IfNotPresent",
        "ports": [{"containerPort": 23456, "name": "pytorchjob-port"}],
        "env": [{"name": "my.var-1", "value": "x"}],
        "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}},
    }
    parse_job(job(ok, init=[{"name": "setup", "image": "busybox"}]))


async def test_submit_refuses_it_with_a_422_naming_the_field_and_stores_nothing(aiohttp_client: Any) -> None:
    ctx = Context.for_tests()
    http = await aiohttp_client(make_app(ctx))
    r = await http.post(
        "/api/v1/jobs",
        data=yaml.safe_dump(job({"name": "pytorch", "imag": "pytorch:2"})),
        headers={"Content-Type": "application/yaml"},
    )
    assert r.status == 422
    body = (await r.json())["error"]
    fields = [d["field"] for d in body["details"]]
    assert f"{BASE}.containers[0].image" in fields
    assert "did you mean 'image'" in str(body["details"])
    assert ctx.store.get("PyTorchJob", "team-a", "typo") is None
    assert not ctx.store.list("Pod")


def test_gpuyard_validate_exits_2_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(job({"name": "pytorch", "imag": "pytorch:2"})))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert f"{BASE}.containers[0].image: required; found unknown field 'imag'" in result.output
