"""`gpuyard validate`: the shipped KubeDL/Kubeflow examples and policies pass; broken copies name the field."""

from __future__ import annotations

from pathlib import Path

import yaml
from click.testing import CliRunner

from gpuyard.cli.validate import validate_command

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
SMALL = str(CONFIGS / "clusters" / "small.yaml")


def _run(*args: str | Path) -> tuple[int, list[str]]:
    result = CliRunner().invoke(validate_command, [str(a) for a in args], catch_exceptions=False)
    return result.exit_code, result.output.splitlines()


def test_shipped_jobs_quotas_queues_and_classes_are_valid() -> None:
    files = sorted((CONFIGS / "jobs").glob("*.yaml"))
    files += sorted((CONFIGS / "quotas").glob("*.yaml")) + sorted(
        (CONFIGS / "resourceclasses").glob("*.yaml")
    )
    code, lines = _run(*files)
    assert code == 0, lines
    assert lines[-1].startswith(f"ok: {len(files)} file(s)")


def _broken(tmp_path: Path, name: str, change) -> Path:  # type: ignore[no-untyped-def]
    docs = list(yaml.safe_load_all((CONFIGS / name).read_text()))
    change(docs)
    out = tmp_path / Path(name).name
    out.write_text(yaml.safe_dump_all(docs))
    return out


def test_broken_copies_report_file_document_and_field(tmp_path: Path) -> None:
    def tf(docs):  # type: ignore[no-untyped-def]
        docs[0]["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = "many"
        docs[0]["spec"]["tfReplicaSpecs"]["Boss"] = docs[0]["spec"]["tfReplicaSpecs"]["PS"]

    def quotas(docs):  # type: ignore[no-untyped-def]
        docs[1]["spec"]["min"]["nvidia.com/gpu"] = "64"  # team-a's min above its max

    def queue(docs):  # type: ignore[no-untyped-def]
        docs[2]["spec"]["queueingStrategy"] = "Random"

    tf_file = _broken(tmp_path, "jobs/tf-dist-mnist.yaml", tf)
    quota_file = _broken(tmp_path, "quotas/elastic-quotas.yaml", quotas)
    queue_file = _broken(tmp_path, "quotas/queues.yaml", queue)
    code, lines = _run(tf_file, quota_file, queue_file)
    assert code == 2
    problems = [line for line in lines if ": documents[" in line]
    assert any(
        line.startswith(f"{tf_file}: documents[0]: spec.tfReplicaSpecs.Boss: unknown replica type 'Boss'")
        for line in problems
    ), problems
    assert any(
        line.startswith(f"{tf_file}: documents[0]: spec.tfReplicaSpecs.Worker.replicas:") for line in problems
    )
    assert any(line.startswith(f"{quota_file}: documents[1]: spec.min") for line in problems), problems
    assert any(
        line.startswith(f"{queue_file}: documents[2]: spec.queueingStrategy:") and "StrictFIFO" in line
        for line in problems
    ), problems
    assert lines[-1].startswith(f"{len(problems)} problem(s): 3 file(s)")


def test_cluster_option_reports_jobs_that_could_never_be_placed(tmp_path: Path) -> None:
    job = yaml.safe_load((CONFIGS / "jobs" / "pytorch-simple.yaml").read_text())
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    worker["replicas"] = 5
    worker["template"]["spec"]["containers"][0].setdefault("resources", {})["limits"] = {"nvidia.com/gpu": 8}
    gang = tmp_path / "gang.yaml"
    gang.write_text(yaml.safe_dump(job))
    too_big = tmp_path / "big.yaml"
    worker["replicas"] = 1
    worker["template"]["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": 16}
    too_big.write_text(yaml.safe_dump(job))

    code, lines = _run(gang, too_big)  # offline without a cluster: both are valid documents
    assert code == 0, lines
    code, lines = _run(gang, too_big, "--cluster", SMALL)
    assert code == 2
    assert lines[0].startswith(
        f"{gang}: documents[0]: spec.pytorchReplicaSpecs: could never be placed on cluster 'small'"
    )
    assert lines[1] == (
        f"{too_big}: documents[0]: spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].resources.limits."
        "nvidia.com/gpu: requests 16 nvidia.com/gpu per pod; the largest node has 8"
    )


def test_unreadable_file_unknown_kind_and_bad_scenario(tmp_path: Path) -> None:
    other = tmp_path / "other.yaml"
    other.write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n")
    code, lines = _run(tmp_path / "missing.yaml", other)
    assert code == 2
    assert lines[0].startswith(f"{tmp_path / 'missing.yaml'}: cannot read:")
    assert lines[1].startswith(
        f"{other}: documents[0]: kind: 'Deployment'; allowed: Cron, ElasticDLJob, ElasticQuota, JAXJob"
    )
    bad = tmp_path / "cluster.yaml"
    bad.write_text("nodeGroups: []\n")
    code, lines = _run(other, "--cluster", bad)
    assert code == 2 and lines[0].startswith(f"error: {bad}: nodeGroups:")


def test_bad_values_fail_validate_with_the_field(tmp_path: Path) -> None:
    """A negative CPU request, too many replicas and unreadable or unbounded durations exit 2,
    naming the field; a Go-style duration is fine."""

    def bad(docs):  # type: ignore[no-untyped-def]
        ps = docs[0]["spec"]["tfReplicaSpecs"]["PS"]
        ps["template"]["spec"]["containers"][0].setdefault("resources", {})["requests"] = {"cpu": "-1"}
        worker = docs[0]["spec"]["tfReplicaSpecs"]["Worker"]
        worker["replicas"] = 100_001
        worker["template"].setdefault("metadata", {})["annotations"] = {"fake.gpuyard.io/duration": "3e11"}

    code, lines = _run(_broken(tmp_path, "jobs/tf-dist-mnist.yaml", bad))
    assert code == 2, lines
    text = "\n".join(lines)
    assert "spec.tfReplicaSpecs.PS.template.spec.containers.0.resources.requests: cpu: -1 is negative" in text
    assert "spec.tfReplicaSpecs.Worker.replicas: 100001 is out of range" in text

    def fine(docs):  # type: ignore[no-untyped-def]
        worker = docs[0]["spec"]["tfReplicaSpecs"]["Worker"]
        worker["template"].setdefault("metadata", {})["annotations"] = {"fake.gpuyard.io/duration": "40s"}

    code, lines = _run(_broken(tmp_path, "jobs/tf-dist-mnist.yaml", fine))
    assert code == 0, lines


def test_an_out_of_range_or_unreadable_duration_fails_validate(tmp_path: Path) -> None:
    def bad(docs):  # type: ignore[no-untyped-def]
        worker = docs[0]["spec"]["tfReplicaSpecs"]["Worker"]
        worker["template"].setdefault("metadata", {})["annotations"] = {"fake.gpuyard.io/duration": "3e11"}
        docs[0]["metadata"]["annotations"] = {"gpuyard.io/expected-duration": "later"}

    code, lines = _run(_broken(tmp_path, "jobs/tf-dist-mnist.yaml", bad))
    assert code == 2, lines
    assert any(
        "metadata.annotations.gpuyard.io/expected-duration: 'later' is not a duration" in line
        for line in lines
    )
    assert any(
        "spec.tfReplicaSpecs.Worker.template.metadata.annotations.fake.gpuyard.io/duration: '3e11' is out of range"
        in line
        for line in lines
    ), lines
