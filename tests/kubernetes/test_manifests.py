"""Deploy manifests and every built-in object gpuyard writes, validated against Kubernetes' schemas.

`kubernetes-validate` ships the OpenAPI schemas of each Kubernetes release; objects are checked
`strict` (no unknown fields) for 1.30 and the newest release it ships. The ServiceMonitor
(`monitoring.coreos.com/v1`) is not a built-in kind and kubernetes-validate has no schema for it:
it is checked structurally here (the fields the Prometheus operator needs).
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from gpuyard.apis.core import Event
from gpuyard.apis.gangs import GANG_API_VERSIONS, GANG_SCHEDULERS
from gpuyard.apis.jobkinds import KIND_INFO
from gpuyard.apis.resources import API_RESOURCES
from gpuyard.apis.scheduling import pod_name
from gpuyard.cli import main
from gpuyard.cli.install import API_RULES, DELEGATE_RULES, RULES, manifests, write_manifests
from gpuyard.controllers.delegating import PodScheduling
from gpuyard.controllers.materializing import build_pod, build_service
from gpuyard.controllers.workloads.registry import plugin_for
from gpuyard.state.events import EventRecorder
from gpuyard.state.kinds import register_kinds
from gpuyard.state.ownership import OPERATOR
from gpuyard.state.store import Store
from gpuyard.state.writing import StoreWriter
from tests.unit.controllers.fakes import JOBS, load_job, reserve

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
CASES = sorted(p.stem for p in JOBS.glob("*.yaml"))
NOT_BUILT_IN = {"ServiceMonitor"}


def printed(*args: str) -> list[dict[str, Any]]:
    result = CliRunner().invoke(main, ["install", "--print", *args])
    assert result.exit_code == 0, result.output
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def validate(obj: dict[str, Any]) -> None:
    for version in VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


def test_print_emits_crds_then_every_manifest_and_all_validate() -> None:
    docs = printed()
    kinds = [d["kind"] for d in docs]
    first_other = kinds.index("Namespace")
    assert set(kinds[:first_other]) == {"CustomResourceDefinition"}
    assert kinds[first_other:] == [
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Role",  # the nodes' heartbeat Leases, read-only, in kube-node-lease
        "RoleBinding",
        "Deployment",
        "Service",
    ]  # no ServiceMonitor: a cluster without the Prometheus operator would refuse the whole apply
    assert [d["kind"] for d in printed("--service-monitor")][-1] == "ServiceMonitor"
    for doc in docs:
        if doc["kind"] not in NOT_BUILT_IN:
            validate(doc)


def test_service_monitor_scrapes_the_service_port() -> None:
    docs = {d["kind"]: d for d in printed("--service-monitor")}
    monitor, service = docs["ServiceMonitor"], docs["Service"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}


def test_print_through_the_kubernetes_validate_cli() -> None:
    """`gpuyard install --print | kubernetes-validate --strict -` (the CLI reads stdin once per call)."""
    text = CliRunner().invoke(main, ["install", "--print"]).stdout
    for version in VERSIONS:
        run = subprocess.run(
            [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", version, "-"],
            input=text,
            capture_output=True,
            text=True,
            check=False,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert "ERROR" not in run.stdout


def test_options_namespace_image_crds_only_and_bad_input() -> None:
    docs = printed("--namespace", "ml-platform", "--image", "registry.example/gpuyard:1.2")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["metadata"]["namespace"] == "ml-platform"
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/gpuyard:1.2"
    binding = next(d for d in docs if d["kind"] == "ClusterRoleBinding")
    assert binding["subjects"][0]["namespace"] == "ml-platform"
    assert {d["kind"] for d in printed("--crds-only")} == {"CustomResourceDefinition"}
    runner = CliRunner()
    bad = runner.invoke(main, ["install", "--print", "--namespace", "Not_Valid"])
    assert bad.exit_code == 2 and "--namespace" in bad.output
    assert runner.invoke(main, ["install"]).exit_code == 2


def test_shipped_manifests_are_the_generated_ones(tmp_path: Path) -> None:
    paths = write_manifests(tmp_path)
    for path in paths:
        shipped = ROOT / "configs" / "deploy" / path.name
        assert shipped.read_text() == path.read_text(), f"{shipped} is stale: run `make deploy`"


def test_deployment_is_hardened_and_probed() -> None:
    deployment = next(d for d in manifests() if d["kind"] == "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][:3] == ["serve", "--backend", "kubernetes"]
    assert "--insecure" not in container["args"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["runAsNonRoot"] is True
    assert container["resources"]["requests"] and container["resources"]["limits"]
    mounted = {m["name"] for m in container["volumeMounts"]}
    assert mounted <= {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    insecure = next(d for d in manifests(insecure=True) if d["kind"] == "Deployment")
    assert "--insecure" in insecure["spec"]["template"]["spec"]["containers"][0]["args"]


def test_cluster_role_is_least_privilege() -> None:
    role = next(d for d in manifests() if d["kind"] == "ClusterRole")
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted[("", "pods/binding")] == {"create"}
    assert granted[("", "pods/status")] == {"patch"}
    assert granted[("", "pods/log")] == {"get"}  # the pod log route, also on a read-only replica
    assert granted[("", "nodes")] == {"list", "watch"}
    assert "create" not in granted[("", "nodes")]
    for r in API_RESOURCES:  # every kind the backend watches is readable (the Lease: by a Role)
        # Events are written, not watched; nor is what is not `watched` (ConfigMaps)
        if r.kind not in ("Lease", "Event") and not r.gang_scheduler and r.watched:
            assert {"list", "watch"} <= granted[(r.group, r.plural)], r.kind
    assert not any(r.gang_scheduler and (r.group, r.plural) in granted for r in API_RESOURCES)
    for r in API_RESOURCES:
        if r.kind in KIND_INFO:
            assert granted[(r.group, f"{r.plural}/status")] == {"patch"}
            # every job kind of every group: what the operator does (list, watch, delete) and what the
            # HTTP API's routes do (submit: create, get after a 409; a job's PATCH is a PUT: update)
            assert granted[(r.group, r.plural)] == {*RULES["TrainingJob"], *API_RULES["TrainingJob"]}, r.kind
            assert "patch" not in granted[(r.group, r.plural)]  # only the status is patched
    # the status of the built-in kinds the API creates is the cluster's controllers'
    assert ("", "resourcequotas/status") not in granted
    assert ("policy", "poddisruptionbudgets/status") not in granted
    assert ("coordination.k8s.io", "leases") not in granted  # the Lease is namespaced: a Role
    assert set(RULES["Event"]) >= {"create", "update"}


@pytest.mark.parametrize("gang", GANG_SCHEDULERS)
def test_delegate_mode_manifests_grant_only_that_gang_schedulers_pod_groups(gang: str) -> None:
    objects = printed("--gang-scheduler", gang)
    role = next(d for d in objects if d["kind"] == "ClusterRole")
    podgroups = {
        group: set(rule["verbs"])
        for rule in role["rules"]
        if "podgroups" in rule["resources"]
        for group in rule["apiGroups"]
    }
    assert podgroups == {
        "scheduling.gpuyard.io": set(RULES["PodGroup"]),
        GANG_API_VERSIONS[gang].split("/")[0]: set(DELEGATE_RULES["GangPodGroup"]),
    }
    deployment = next(d for d in objects if d["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GPUYARD__SCHEDULER__MODE"] == "delegate" and env["GPUYARD__SCHEDULER__GANG_SCHEDULER"] == gang
    for obj in objects:
        if obj["kind"] not in NOT_BUILT_IN and obj["kind"] != "CustomResourceDefinition":
            validate(obj)


def test_a_read_only_api_install_grants_only_what_the_controllers_use() -> None:
    objects = printed("--read-only-api")
    role = next(d for d in objects if d["kind"] == "ClusterRole")
    assert (
        role["rules"] == next(d for d in manifests(read_only_api=True) if d["kind"] == "ClusterRole")["rules"]
    )
    granted = {
        (group, resource): set(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    for r in API_RESOURCES:
        if r.kind in KIND_INFO:  # users create jobs with kubectl; gpuyard only deletes them (TTL)
            assert granted[(r.group, r.plural)] == set(RULES["TrainingJob"]), r.plural
    assert granted[("gpuyard.io", "queues")] == set(RULES["Queue"])  # read only
    assert ("scheduling.k8s.io", "priorityclasses") in granted
    assert "create" not in granted[("scheduling.k8s.io", "priorityclasses")]
    deployment = next(d for d in objects if d["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GPUYARD__SERVER__READ_ONLY"] == "true"
    for obj in objects:
        if obj["kind"] not in NOT_BUILT_IN and obj["kind"] != "CustomResourceDefinition":
            validate(obj)


# --- objects gpuyard writes to a cluster ---------------------------------------------------------


def _written(case: str, *, host_network: bool, scheduling: PodScheduling) -> list[dict[str, Any]]:
    job = load_job(case, host_network=host_network)
    job.metadata.uid = "2f1c7f4e-0000-4000-8000-000000000001"
    plugin = plugin_for(job.kind)
    placement = reserve(job)
    out = []
    for role in job.roles():
        for index in range(job.replica_specs[role].count):
            res = placement[pod_name(job.metadata.name, role, index)]
            port = res.spec.host_ports[0] if host_network else None
            pod = build_pod(
                job,
                role,
                index,
                plugin=plugin,
                reservation=res,
                host_port=port,
                peers=placement,
                scheduling=scheduling,
            )
            out.append(pod.to_dict())
            out.append(build_service(job, role, index, plugin=plugin, host_port=port).to_dict())
    return out


@pytest.mark.parametrize(
    "scheduling",
    [PodScheduling(), PodScheduling(scheduler_name="koord-scheduler", gang_scheduler="koordinator")],
    ids=["gpuyard", "delegate"],
)
@pytest.mark.parametrize("host_network", [False, True], ids=["normal", "hostnetwork"])
@pytest.mark.parametrize("case", CASES)
def test_pods_and_services_of_every_job_file_validate(
    case: str, host_network: bool, scheduling: PodScheduling
) -> None:
    objects = _written(case, host_network=host_network, scheduling=scheduling)
    assert {o["kind"] for o in objects} == {"Pod", "Service"}
    for obj in objects:
        validate(obj)
        if obj["kind"] == "Pod":
            assert obj["metadata"]["ownerReferences"][0]["uid"] == "2f1c7f4e-0000-4000-8000-000000000001"
            assert obj["spec"]["schedulerName"] == scheduling.scheduler_name


async def test_job_events_validate() -> None:
    store = Store()
    register_kinds(store)
    writer = StoreWriter(store)
    job = load_job("tf-dist-mnist")
    job.metadata.uid = "2f1c7f4e-0000-4000-8000-000000000002"
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    events = EventRecorder(component=OPERATOR, store=store, writer=writer, now=lambda: now)
    labels = {"job-name": job.metadata.name}
    await events.record(job, reason="TFJobRunning", message="running", labels=labels)
    await events.record(job, reason="TFJobRestarting", message="again", type="Warning", labels=labels)
    await events.record(job, reason="TFJobRestarting", message="again", type="Warning", labels=labels)
    stored = store.list_of(Event)
    assert sorted((e.reason, e.count) for e in stored) == [("TFJobRestarting", 2), ("TFJobRunning", 1)]
    for event in stored:
        body = event.to_dict()
        involved = body["involvedObject"]
        assert set(involved) >= {"apiVersion", "kind", "name", "namespace", "uid"}
        assert body["source"]["component"] and body["firstTimestamp"] and body["lastTimestamp"]
        assert body["reportingComponent"] == body["source"]["component"] == OPERATOR
        validate(body)


def test_deployment_reads_api_tokens_the_settings_accept(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Secret's `tokens.json` reaches `server.tokens` through the env var the Deployment sets."""
    from gpuyard.state.config import load_settings

    deployment = next(d for d in manifests() if d["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (env,) = [e for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    digest = "0" * 64
    monkeypatch.setenv(env["name"], f'[{{"sha256": "{digest}", "user": "ops", "role": "admin"}}]')
    assert [t.user for t in load_settings(None).server.tokens] == ["ops"]
