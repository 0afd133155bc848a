"""The CLI on the job fields of issue #27, against a live (loopback) server: a misspelt `image` and a field
gpuyard does not act on (with `--validate strict`) exit 2 naming the field; a job another controller
manages is stored, gets no pods, and `describe job` says who manages it."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpuyard.state.clock import VirtualClock
from tests.integration.test_operator_cli import Live, live
from tests.unit.controllers.fakes import JOBS

__all__ = ["live"]

FIELD = "spec.pytorchReplicaSpecs.Worker.template.spec"


def pytorch(tmp_path: Path, name: str) -> tuple[Path, dict]:  # type: ignore[type-arg]
    doc = yaml.safe_load((JOBS / "pytorch-simple.yaml").read_text())
    doc["metadata"]["name"] = name
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path, doc


async def test_a_misspelt_image_exits_2_naming_it(live: Live, tmp_path: Path) -> None:
    path, doc = pytorch(tmp_path, "typo")
    container = doc["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    container["imag"] = container.pop("image")
    path.write_text(yaml.safe_dump(doc))
    result = await live.cli("submit", str(path))
    assert result.exit_code == 2
    assert (
        f"{FIELD}.containers[0].image: required; found unknown field 'imag': did you mean 'image'?"
        in result.output
    )
    assert not live.ctx.store.list("PyTorchJob") and not live.ctx.store.list("Pod")


async def test_strict_validation_names_a_field_gpuyard_does_not_act_on(live: Live, tmp_path: Path) -> None:
    path, doc = pytorch(tmp_path, "gated")
    doc["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["schedulingGates"] = [
        {"name": "x.io/wait"}
    ]
    path.write_text(yaml.safe_dump(doc))
    result = await live.cli("submit", "--validate", "strict", str(path))
    assert result.exit_code == 2
    assert f"{FIELD}.schedulingGates" in result.output and "accepted but not acted on" in result.output
    assert not live.ctx.store.list("PyTorchJob")


async def test_a_job_kueue_manages_gets_no_pods_and_describe_says_so(live: Live, tmp_path: Path) -> None:
    path, doc = pytorch(tmp_path, "elsewhere")
    doc["spec"]["runPolicy"] = {"managedBy": "kueue.x-k8s.io/multikueue"}
    path.write_text(yaml.safe_dump(doc))
    ours, _ = pytorch(tmp_path, "ours")
    assert (await live.cli("submit", str(path))).exit_code == 0
    assert (await live.cli("submit", str(ours))).exit_code == 0
    clock = live.ctx.clock
    assert isinstance(clock, VirtualClock)
    assert await clock.run_until(
        lambda: live.ctx.store.get("Pod", "kubeflow", "ours-master-0") is not None, timeout=60
    )
    assert live.ctx.store.get("Pod", "kubeflow", "ours-master-0") is not None
    assert not [p for p in live.ctx.store.list("Pod") if p.metadata.name.startswith("elsewhere-")]
    result = await live.cli("describe", "job", "kubeflow/elsewhere")
    assert result.exit_code == 0
    assert "Managed by:  kueue.x-k8s.io/multikueue (runPolicy.managedBy:" in result.output
    result = await live.cli("describe", "job", "kubeflow/ours")
    assert "Managed by:  kubeflow.org/training-operator\n" in result.output
