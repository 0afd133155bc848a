"""The RBAC that `gpuyard install --print` ships grants exactly the calls gpuyard makes, both ways.

gpuyard (`Platform` with `backend.kind: kubernetes`) runs against the test API server with a
kubeconfig presenting its own bearer token (`GPUYARD`); the test seeds and inspects objects, and
plays the kubelets, with the server's default token. The server's audit records the token of every
request (`AuditRecord.user`), so gpuyard's own calls are the records whose user is `GPUYARD`.

Each scenario of :data:`SCENARIOS` configures one mode (the gpuyard mode with leader election, DRA,
delegate mode with the roles of `--gang-scheduler volcano`, the HTTP API's write routes called with
gpuyard's own API tokens) and drives gpuyard through the paths that mode has: a job's whole life
(placed, bound, its status and Events, a Service changed behind gpuyard's back, Succeeded, its TTL
deleting it and its children), a relabelled job, a lost node, names already taken (injected 409s,
the scheduler's Event an earlier leader left, a DRA claim an earlier pod left, the name of each kind
an API route creates), the status of a Queue and an ElasticQuota (and a ResourceQuota's, which is
the cluster's and never written), the leader releasing the Lease, every write route of the API.
Then

* every call gpuyard made is granted by the shipped ClusterRole (`RULES`, `API_RULES` and, in
  delegate mode, `DELEGATE_RULES`), or by the leader-election Role in gpuyard's namespace;
* every (group, resource[/subresource], verb) those roles grant was called by gpuyard in some
  scenario. `TrainingJob` in `RULES` stands for every job kind of every group: a verb used on one
  job resource counts for all of them (with the same subresource).

Both read the roles from :func:`gpuyard.cli.install.manifests`, so a rule added to `RULES` is
checked at once: exercise it in the scenario of the mode that needs it (add one to `SCENARIOS`
when the mode is new), or remove the verb nobody uses.

The same calls are checked against the ownership table (`gpuyard.state.ownership.OWNERSHIP`): every
write gpuyard made names its component as `fieldManager` (the server records it,
`AuditRecord.manager`), and that component is the one the table lets write that part of that kind
on Kubernetes; a DELETE names no field manager, so a delete is only checked to be one some gpuyard
component may make. The scenarios run once for both tests.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gpuyard.apis.crds import crds
from gpuyard.apis.gangs import GANG_API_VERSIONS, GANG_KIND
from gpuyard.apis.resources import API_RESOURCES, resource_for
from gpuyard.cli.install import manifests
from gpuyard.devices import get_preset
from gpuyard.devices.scenarios import load_scenario
from gpuyard.kubecluster import fakenodes
from gpuyard.kubecluster.client import KubeClient
from gpuyard.kubecluster.dra import RESOURCE_CLAIMS
from gpuyard.kubecluster.writing import to_json
from gpuyard.platform.api.auth import hash_token
from gpuyard.platform.runtime import Platform
from gpuyard.state.config import Settings, TokenConfig
from gpuyard.state.ownership import IDENTITIES, Part, allowed
from gpuyard.testing.apiserver import AuditRecord, FakeApiServer
from gpuyard.testing.apiserver.crds import minimal_crd
from tests.builders import make_node
from tests.kubernetes.test_backend_platform import platform, settings

ROOT = Path(__file__).resolve().parents[2]
GPUYARD = "gpuyard-serviceaccount"  # gpuyard's bearer token: its calls in the audit
JOB_FAMILY = "<every job kind>"  # what RULES' `TrainingJob` stands for

Call = tuple[str, str, str]  # (API group, resource[/subresource], verb), as RBAC names a request

NODES = resource_for("Node")
PODS = resource_for("Pod")
SERVICES = resource_for("Service")
EVENTS = resource_for("Event")
TFJOBS = resource_for("TFJob", "kubeflow.org/v1")
KUBEDL_TFJOBS = resource_for("TFJob", "training.kubedl.io/v1alpha1")
PYTORCHJOBS = resource_for("PyTorchJob", "kubeflow.org/v1")
QUEUES = resource_for("Queue")
ELASTIC_QUOTAS = resource_for("ElasticQuota")
PRIORITY_CLASSES = resource_for("PriorityClass")
RESOURCE_QUOTAS = resource_for("ResourceQuota")
RESOURCE_CLASSES = resource_for("ResourceClass")
POD_GROUPS = resource_for("PodGroup")
RESERVATIONS = resource_for("Reservation")
PDBS = resource_for("PodDisruptionBudget")
NODE_TOPOLOGIES = resource_for("NodeTopology")
MODELS = resource_for("Model")
MODEL_VERSIONS = resource_for("ModelVersion")
CONFIG_MAPS = resource_for("ConfigMap")
# where a create of the gpuyard mode's scenario finds the name taken (409) and gpuyard reads it:
# injected by `taken_once`, and the Event an earlier leader left (`seed_cluster`)
TAKEN = [(r.group, r.plural) for r in (SERVICES, POD_GROUPS, RESERVATIONS, RESOURCE_CLASSES)] + [
    ("", "events")
]
JOB_PLURALS = {r.plural for r in API_RESOURCES if "trainingjobs" in r.categories}


# --- the shipped roles -------------------------------------------------------------------------


@dataclass(frozen=True)
class Grants:
    """What the shipped roles allow: cluster-wide (ClusterRole) and in one namespace (Role)."""

    cluster: frozenset[Call]
    namespaced: dict[str, frozenset[Call]]

    def allows(self, record: AuditRecord) -> bool:
        call = call_of(record)
        return call in self.cluster or call in self.namespaced.get(record.namespace, frozenset())

    def all(self) -> set[Call]:
        return set(self.cluster).union(*self.namespaced.values())


def _expand(rules: Iterable[dict[str, Any]]) -> frozenset[Call]:
    return frozenset(
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    )


def shipped_grants(gang_scheduler: str | None = None) -> Grants:
    """The roles `gpuyard install --print [--gang-scheduler G]` ships."""
    cluster: set[Call] = set()
    namespaced: dict[str, set[Call]] = {}
    for obj in manifests(gang_scheduler=gang_scheduler):
        if obj["kind"] == "ClusterRole":
            cluster |= _expand(obj["rules"])
        elif obj["kind"] == "Role":
            namespaced.setdefault(obj["metadata"]["namespace"], set()).update(_expand(obj["rules"]))
    return Grants(frozenset(cluster), {ns: frozenset(c) for ns, c in namespaced.items()})


def call_of(record: AuditRecord) -> Call:
    resource = f"{record.resource}/{record.subresource}" if record.subresource else record.resource
    return (record.group, resource, record.verb)


def family(call: Call) -> Call:
    """A job resource's call as the `TrainingJob` rule's (one for every job kind and group)."""
    _, resource, verb = call
    plural, _, sub = resource.partition("/")
    if plural in JOB_PLURALS:
        return (JOB_FAMILY, f"{JOB_FAMILY}/{sub}" if sub else JOB_FAMILY, verb)
    return call


def test_family_folds_every_job_kind_and_nothing_else() -> None:
    assert family(("kubeflow.org", "tfjobs/status", "patch")) == family(
        ("training.kubedl.io", "marsjobs/status", "patch")
    )
    assert family(("kubeflow.org", "tfjobs", "delete")) != family(("kubeflow.org", "tfjobs/status", "delete"))
    assert family(("", "pods", "delete")) == ("", "pods", "delete")
    assert {family(c)[0] for c in shipped_grants().all() if c[1].split("/")[0] in JOB_PLURALS} == {JOB_FAMILY}


# --- driving gpuyard -----------------------------------------------------------------------------


@dataclass
class Run:
    """One scenario's server, the test's own client (the default token) and gpuyard's kubeconfig."""

    server: FakeApiServer
    seed: KubeClient
    seed_kubeconfig: Path  # the test's own (the server's default token)
    kubeconfig: Path  # gpuyard's: presents GPUYARD

    def calls(self) -> set[Call]:
        return {call_of(r) for r in self.server.audit or [] if r.user == GPUYARD}

    async def called(self, *calls: Call, timeout: float = 15.0) -> None:
        """Wait until gpuyard has made every call of `calls`."""
        await until(
            lambda: set(calls) <= self.calls(), what=f"gpuyard to call {sorted(calls)}", timeout=timeout
        )

    def objects(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Copies of the objects of `plural` on the server."""
        out = []
        for (_, _, p), res in self.server.catalog.resources.items():
            if p == plural:
                out += self.server.objects.list(res, namespace=namespace)["items"]
        return copy.deepcopy(out)

    def pods_of(self, job: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.objects("pods", "default")
            if (p["metadata"].get("labels") or {}).get("job-name") == job
        ]

    async def kubelet(self, job: str, phase: str) -> None:
        """Play the kubelet: every pod of `job` in `phase` (exit code 0 when it ends)."""
        for pod in self.pods_of(job):
            status: dict[str, Any] = {"phase": phase}
            if phase == "Succeeded":
                name = pod["spec"]["containers"][0]["name"]
                terminated = {"exitCode": 0, "reason": "Completed"}
                status["containerStatuses"] = [
                    {"name": name, "ready": False, "restartCount": 0, "state": {"terminated": terminated}}
                ]
            await self.seed.patch(PODS, "default", pod["metadata"]["name"], {"status": status}, sub="status")


async def until(check: Callable[[], Any], *, what: str, timeout: float = 15.0) -> Any:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not (value := check()):
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
    return value


@asynccontextmanager
async def serving(tmp: Path) -> AsyncIterator[Run]:
    """A test API server with gpuyard's CRDs (auditing on) and the two kubeconfigs."""
    async with FakeApiServer(port=0, audit=True, bookmark_interval=0.2) as server:
        server.install_crds(crds())
        ours = server.write_kubeconfig(tmp / "gpuyard.kubeconfig", token=GPUYARD)
        theirs = server.write_kubeconfig(tmp / "test.kubeconfig")
        seed = await KubeClient.connect(kubeconfig=str(theirs), request_timeout=5.0)
        try:
            yield Run(server=server, seed=seed, seed_kubeconfig=theirs, kubeconfig=ours)
        finally:
            await seed.close()


def pytorchjob(name: str, *, gpus: int) -> dict[str, Any]:
    container = {"name": "pytorch", "image": "pt:1", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
    master = {"replicas": 1, "restartPolicy": "Never", "template": {"spec": {"containers": [container]}}}
    return {
        "apiVersion": PYTORCHJOBS.api_version,
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"pytorchReplicaSpecs": {"Master": master}},
    }


def tfjob(
    name: str, *, api_version: str = "kubeflow.org/v1", workers: int, gpus: int, **run: Any
) -> dict[str, Any]:
    container = {"name": "tensorflow", "image": "tf:1", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
    worker = {
        "replicas": workers,
        "restartPolicy": "Never",
        "template": {"spec": {"containers": [container]}},
    }
    spec: dict[str, Any] = {"tfReplicaSpecs": {"Worker": worker}}
    if run:
        spec["runPolicy"] = run
    return {
        "apiVersion": api_version,
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def seen(p: Platform, kind: str, namespace: str, name: str) -> str | None:
    """The resourceVersion of the object in the platform's cache."""
    obj = p.store.get(kind, namespace, name)
    return None if obj is None else obj.metadata.resource_version


def leading(p: Platform) -> bool:
    return (lead := p.backend.leadership) is not None and lead.is_leader()


def taken_once(run: Run, collection: str) -> None:
    """The next create in `collection` (a path) answers 409, as when another writer took the name
    first: gpuyard's writer then reads what holds the name (a GET) so its cache catches up."""
    run.server.faults.fail_next(1, code=409, path_prefix=collection, verb="create")


async def seed_cluster(run: Run) -> None:
    """Two GPU models' nodes, the default Queue, a PriorityClass, an ElasticQuota and a ResourceQuota of
    namespace `default`, and an Event an earlier leader left."""
    seed = run.seed
    await seed.create(NODES, to_json(make_node("gpu-0", gpus=8)))
    await seed.create(NODES, to_json(make_node("gpu-1", gpus=8, model="a100")))
    for res, body in (
        (QUEUES, {"metadata": {"name": "default"}}),
        (PRIORITY_CLASSES, {"metadata": {"name": "high"}, "value": 1000}),
        (
            ELASTIC_QUOTAS,
            {
                "metadata": {"name": "team", "namespace": "default"},
                "spec": {"max": {"nvidia.com/gpu": 16}, "namespaces": ["default"]},
            },
        ),
        (
            RESOURCE_QUOTAS,
            {
                "metadata": {"name": "gpus", "namespace": "default"},
                "spec": {"hard": {"requests.nvidia.com/gpu": 16}},
            },
        ),
        # The scheduler's Event about a job is named `<job>.<reason>`, and Events are not watched: one
        # left by an earlier leader is found by the create's 409, read, then updated.
        (
            EVENTS,
            {
                "metadata": {"name": "train.scheduled", "namespace": "default"},
                "involvedObject": {"kind": "TFJob", "namespace": "default", "name": "train"},
                "reason": "Scheduled",
                "message": "an earlier leader's",
                "type": "Normal",
                "count": 1,
            },
        ),
    ):
        await seed.create(res, {"apiVersion": res.api_version, "kind": res.kind, **body})


async def gpuyard_mode(run: Run) -> None:
    """Two replicas' leader election, and jobs' whole lives in the gpuyard mode."""
    seed = run.seed
    await seed_cluster(run)
    taken_once(run, RESOURCE_CLASSES.path())  # the default class of one GPU model
    kc = run.kubeconfig
    async with platform(settings(kc, identity="replica-a", node_lost_grace=0.5)) as leader:
        await until(lambda: leading(leader), what="replica-a leading")
        async with platform(settings(kc, identity="replica-b")):
            for res in (SERVICES, POD_GROUPS, RESERVATIONS):
                taken_once(run, res.path(namespace="default"))
            job = tfjob(
                "train",
                workers=2,
                gpus=4,
                ttlSecondsAfterFinished=0,
                schedulingPolicy={"priorityClass": "high"},
            )
            await seed.create(TFJOBS, job)
            await until(
                lambda: len([p for p in run.pods_of("train") if p["spec"].get("nodeName")]) == 2,
                what="train's pods bound",
            )
            await run.called(
                *((group, plural, "get") for group, plural in TAKEN),
                ("", "events", "update"),  # the earlier leader's Event, read after the 409
            )
            # A Service changed behind gpuyard's back is written back at the job's next reconcile.
            svc = run.objects("services", "default")[0]
            svc["spec"]["ports"][0]["port"] = 1
            changed = int((await seed.replace(SERVICES, svc))["metadata"]["resourceVersion"])
            key = ("Service", "default", svc["metadata"]["name"])
            await until(
                lambda: int(seen(leader, *key) or 0) >= changed, what="the changed Service in the cache"
            )
            await run.kubelet("train", "Running")
            await run.called(("", "services", "update"))
            await run.kubelet("train", "Succeeded")
            # ttlSecondsAfterFinished: 0 deletes the job at once, and gpuyard its children
            await run.called(
                ("kubeflow.org", "tfjobs", "delete"), ("", "services", "delete"), ("", "events", "delete")
            )
            await seed.create(
                KUBEDL_TFJOBS, tfjob("lost", api_version=KUBEDL_TFJOBS.api_version, workers=1, gpus=1)
            )
            pod = await until(
                lambda: [p for p in run.pods_of("lost") if p["spec"].get("nodeName")], what="lost placed"
            )
            # The job's labels go to its PodGroup (`kubectl label tfjob lost team=vision`).
            await seed.patch(KUBEDL_TFJOBS, "default", "lost", {"metadata": {"labels": {"team": "vision"}}})
            await run.called(("scheduling.gpuyard.io", "podgroups", "update"))
            # A pod on a node that goes away fails NodeLost after the grace period.
            await run.kubelet("lost", "Running")
            await seed.delete(NODES, "", pod[0]["spec"]["nodeName"])
            await run.called(("", "pods/status", "patch"))


async def dra_mode(run: Run) -> None:
    """DRA (`backend.kubernetes.dra: on`): fake-nodes publish ResourceSlices, and a placed pod gets
    a ResourceClaim, replacing one an earlier pod of the same name left."""
    api = await fakenodes.connect(str(run.seed_kubeconfig))
    async with api:
        nodes = fakenodes.FakeNodes(
            api, scenario=load_scenario(ROOT / "configs" / "clusters" / "small.yaml"), heartbeat=0.5
        )
        task = asyncio.create_task(nodes.run())
        try:
            await asyncio.wait_for(nodes.registered.wait(), 10)
            left = {"metadata": {"name": "claimed-master-0-gpus", "namespace": "default"}, "spec": {}}
            await run.seed.create(
                RESOURCE_CLAIMS, {"apiVersion": RESOURCE_CLAIMS.api_version, "kind": "ResourceClaim", **left}
            )
            async with platform(settings(run.kubeconfig, election=False, dra="on")):
                await run.seed.create(PYTORCHJOBS, pytorchjob("claimed", gpus=2))
                await run.called(
                    ("resource.k8s.io", "resourceclaims", "delete"),
                    ("resource.k8s.io", "resourceclaims", "create"),
                    ("resource.k8s.io", "resourceclaims/status", "patch"),
                )
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def delegate_mode(run: Run) -> None:
    """Delegate mode (`gpuyard install --gang-scheduler volcano`): the operator writes Volcano's
    PodGroup (the name found taken once), puts its spec back when someone changes it, and deletes
    it when the job is done; the test plays Volcano (binds the pods) and the kubelet."""
    volcano = resource_for(GANG_KIND, GANG_API_VERSIONS["volcano"])
    run.server.install_crds([minimal_crd(volcano)])
    seed = run.seed
    await seed.create(NODES, to_json(make_node("gpu-0", gpus=8)))
    await seed.create(
        QUEUES, {"apiVersion": QUEUES.api_version, "kind": "Queue", "metadata": {"name": "default"}}
    )
    s = settings(run.kubeconfig, election=False)
    s = s.model_copy(
        update={"scheduler": s.scheduler.model_copy(update={"mode": "delegate", "gang_scheduler": "volcano"})}
    )
    taken_once(run, volcano.path(namespace="default"))
    async with platform(s) as p:
        await seed.create(TFJOBS, tfjob("handed", workers=2, gpus=2))
        pods = await until(lambda: len(run.pods_of("handed")) == 2 and run.pods_of("handed"), what="two pods")
        await until(
            lambda: p.store.get(GANG_KIND, "default", "handed") is not None, what="Volcano's PodGroup"
        )
        await run.called(("scheduling.volcano.sh", "podgroups", "get"))  # after the 409
        await seed.patch(volcano, "default", "handed", {"spec": {"minMember": 1}})  # someone else's change
        await run.called(("scheduling.volcano.sh", "podgroups", "update"))
        for pod in pods:
            await seed.bind("default", pod["metadata"]["name"], "gpu-0", uid=pod["metadata"]["uid"])
        await run.kubelet("handed", "Running")
        await run.kubelet("handed", "Succeeded")
        await run.called(("scheduling.volcano.sh", "podgroups", "delete"))


# --- the HTTP API's writes ---------------------------------------------------------------------

API_TOKENS = {  # gpuyard's own API tokens (server.tokens): who may ask gpuyard to write
    "api-admin": {"user": "ops", "role": "admin"},
    "api-tenant": {"user": "alice", "role": "user", "namespaces": ["default"]},
    "api-viewer": {"user": "vic", "role": "viewer", "namespaces": ["default"]},
}


@dataclass
class Api:
    """gpuyard's HTTP API, called as one of :data:`API_TOKENS`."""

    http: aiohttp.ClientSession
    url: str

    async def call(
        self, method: str, path: str, *, expect: int, token: str = "api-admin", **kwargs: Any
    ) -> Any:
        headers = {"Authorization": f"Bearer {token}", **kwargs.pop("headers", {})}
        async with self.http.request(method, f"{self.url}{path}", headers=headers, **kwargs) as resp:
            body = await resp.json()
            assert resp.status == expect, f"{method} {path} as {token}: {resp.status} {body}"
            return body

    async def put(self, path: str, doc: dict[str, Any], *, expect: int) -> Any:
        return await self.call("PUT", path, json=doc, expect=expect)

    async def apply(self, *docs: dict[str, Any], expect: int = 200) -> dict[str, str]:
        """`gpuyard apply -f`: the action per kind."""
        body = await self.call("POST", "/api/v1/apply", json=list(docs), expect=expect)
        return {a["kind"]: a["action"] for a in body.get("applied", [])}


def file_objects(run: Run) -> list[str]:
    """The objects of :func:`policy` (but the NodeTopology, whose name is the node's) on the server."""
    return [
        f"{plural}/{o['metadata']['name']}"
        for plural in ("queues", "elasticquotas", "resourcequotas", "resourceclasses", "priorityclasses")
        for o in run.objects(plural)
        if o["metadata"]["name"] in ("team", "gpus", "fast", "high")
    ] + [
        f"{plural}/{o['metadata']['name']}"
        for plural in ("poddisruptionbudgets", "crons")
        for o in run.objects(plural)
    ]


def api_settings(kubeconfig: Path) -> Settings:
    s = settings(kubeconfig, election=False)
    tokens = [TokenConfig(sha256=hash_token(t), **who) for t, who in API_TOKENS.items()]
    return s.model_copy(update={"server": s.server.model_copy(update={"tokens": tokens})})


def policy(*, weight: float, gpus: int) -> list[dict[str, Any]]:
    """One document of every kind `POST /api/v1/apply` takes (APPLY_KINDS)."""
    topology = get_preset("dgx-a100", node_name="gpu-0").to_dict()
    topology["metadata"] = {"name": "gpu-0"}
    docs = [
        {"kind": "Queue", "metadata": {"name": "team"}, "spec": {"weight": weight}},
        {
            "kind": "ElasticQuota",
            "metadata": {"name": "team", "namespace": "default"},
            "spec": {"max": {"nvidia.com/gpu": gpus}, "namespaces": ["default"]},
        },
        {
            "kind": "ResourceQuota",
            "apiVersion": "v1",
            "metadata": {"name": "gpus", "namespace": "default"},
            "spec": {"hard": {"requests.nvidia.com/gpu": str(gpus)}},
        },
        {
            "kind": "ResourceClass",
            "metadata": {"name": "fast"},
            "spec": {"selector": {"matchLabels": {"gpuyard.io/gpu-model": "a100"}}},
        },
        {
            "kind": "PriorityClass",
            "apiVersion": "scheduling.k8s.io/v1",
            "metadata": {"name": "high"},
            "value": 1000,
            "description": f"weight {weight}",
        },
        {
            "kind": "PodDisruptionBudget",
            "apiVersion": "policy/v1",
            "metadata": {"name": "train", "namespace": "default"},
            "spec": {"maxUnavailable": gpus // 8, "selector": {"matchLabels": {"job-name": "train"}}},
        },
        {**topology, "kind": "NodeTopology"},
        {
            "kind": "Cron",
            "apiVersion": "apps.kubedl.io/v1alpha1",
            "metadata": {"name": "nightly", "namespace": "default"},
            "spec": {  # suspended: no runs, only the object is written
                "schedule": "0 2 * * *",
                "suspend": True,
                "template": {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "TFJob",
                    "workload": {"spec": tfjob("x", workers=1, gpus=1)["spec"]},
                },
            },
        },
    ]
    for doc in docs:  # a new weight changes every object
        doc["metadata"]["labels"] = {"policy": f"w{weight:g}"}
    return docs


def gpuyard_created(run: Run, plural: str) -> bool:
    return any(
        r.user == GPUYARD and r.resource == plural and r.verb == "create" for r in run.server.audit or []
    )


async def api_writes(run: Run) -> None:
    """The HTTP API's write routes, called with gpuyard's own API tokens (a viewer's write is
    refused by gpuyard before anything reaches the API server): `gpuyard submit`, `patch job`
    and `delete job` as a tenant, `gpuyard apply -f` with every kind it takes (created, then
    changed), and the PUT and DELETE of quotas, queues, ResourceQuotas, ResourceClasses and
    NodeTopologies as an admin. Each kind's name is found taken once (the cache lagging the
    server): the API answers 409, the writer reads what holds the name, and the retry works."""
    seed = run.seed
    await seed.create(NODES, to_json(make_node("gpu-0", gpus=8, model="a100")))
    async with platform(api_settings(run.kubeconfig), serve_http=True) as p, aiohttp.ClientSession() as http:
        await asyncio.wait_for(p.serving.wait(), 5)
        api = Api(http, p.url)
        job = tfjob("api", workers=1, gpus=1)
        await api.call("POST", "/api/v1/jobs", json=job, token="api-viewer", expect=403)
        assert not gpuyard_created(run, "tfjobs"), "a write gpuyard's own roles refuse reached the cluster"
        taken_once(run, TFJOBS.path(namespace="default"))
        await api.call("POST", "/api/v1/jobs", json=job, token="api-tenant", expect=409)
        await api.call("POST", "/api/v1/jobs", json=job, token="api-tenant", expect=201)
        # the pod log route (a read) gets pods/log; no kubelet serves the test's node: 502
        (pod,) = await until(
            lambda: [x for x in run.pods_of("api") if x["spec"].get("nodeName")], what="api's pod bound"
        )
        name = pod["metadata"]["name"]
        await run.kubelet("api", "Running")
        await until(
            lambda: (x := p.store.get("Pod", "default", name)) is not None and x.status.phase == "Running",
            what="api's pod Running in gpuyard's cache",
        )
        await api.call("GET", f"/api/v1/namespaces/default/pods/{name}/log", token="api-viewer", expect=502)
        labels = {"metadata": {"labels": {"team": "vision"}}}
        path = "/api/v1/namespaces/default/jobs/api"
        patch = {"data": json.dumps(labels), "headers": {"Content-Type": "application/merge-patch+json"}}
        await api.call("PATCH", path, token="api-tenant", expect=200, **patch)
        await api.call("DELETE", path, token="api-tenant", expect=200)
        assert not run.objects("tfjobs", "default")
        # `gpuyard apply -f` is all or nothing: first the names of the kinds only apply writes are
        # found taken (read after the 409), then an ElasticQuota's: what the file's other writes
        # created is deleted again (the PriorityClass and the PodDisruptionBudget too)
        taken_once(run, PRIORITY_CLASSES.path())
        taken_once(run, PDBS.path(namespace="default"))
        await api.apply(*policy(weight=1, gpus=8), expect=409)
        assert not file_objects(run)
        taken_once(run, ELASTIC_QUOTAS.path(namespace="default"))
        await api.apply(*policy(weight=1, gpus=8), expect=409)
        assert not file_objects(run)
        actions = await api.apply(*policy(weight=1, gpus=8))
        assert actions["PriorityClass"] == actions["PodDisruptionBudget"] == "created", actions
        assert set((await api.apply(*policy(weight=2, gpus=16))).values()) == {"configured"}
        # the cluster refuses one object of a change (a webhook): 422, and the others are put back
        run.server.faults.fail_next(1, code=422, path_prefix=QUEUES.path(), verb="update")
        refused = await api.apply(*policy(weight=3, gpus=24), expect=422)
        assert refused == {}
        (quota,) = [q for q in run.objects("elasticquotas", "default") if q["metadata"]["name"] == "team"]
        assert quota["spec"]["max"]["nvidia.com/gpu"] in (16, "16")  # the earlier spec again
        # the PUT and DELETE routes: each object made again, its name found taken once first
        routes = {
            "/api/v1/quotas/team": (ELASTIC_QUOTAS.path(namespace="default"), "ElasticQuota"),
            "/api/v1/queues/team": (QUEUES.path(), "Queue"),
            "/api/v1/namespaces/default/resourcequotas/gpus": (
                RESOURCE_QUOTAS.path(namespace="default"),
                "ResourceQuota",
            ),
            "/api/v1/resourceclasses/fast": (RESOURCE_CLASSES.path(), "ResourceClass"),
            "/api/v1/nodetopologies/gpu-0": (NODE_TOPOLOGIES.path(), "NodeTopology"),
        }
        docs = {d["kind"]: d for d in policy(weight=3, gpus=24)}
        for route, (collection, kind) in routes.items():
            await api.call("DELETE", route, expect=200)
            taken_once(run, collection)
            await api.put(route, docs[kind], expect=409)
            await api.put(route, docs[kind], expect=201)
        assert {o["metadata"]["labels"]["policy"] for o in run.objects("nodetopologies")} == {"w3"}
        # the built-in kinds' status is the cluster's controllers': created without it, never patched
        assert not any(o.get("status") for o in run.objects("resourcequotas", "default"))
        assert not any(o.get("status") for o in run.objects("poddisruptionbudgets", "default"))


async def job_addons(run: Run) -> None:
    """What a job has beside its pods: a Tensorboard (Deployment, Service, Ingress), made, rewritten
    when its config changes and deleted when the annotation goes; a PyTorchJob's
    HorizontalPodAutoscaler likewise (`elasticPolicy.metrics`). Each kind's first create finds the
    name taken (a GET follows)."""
    seed = run.seed
    await seed_cluster(run)
    deployments, ingresses = resource_for("Deployment"), resource_for("Ingress")
    hpas = resource_for("HorizontalPodAutoscaler")
    for res in (deployments, ingresses, hpas):
        taken_once(run, res.path(namespace="default"))
    config = {"logDir": "/logs/a", "ingressSpec": {"host": "tb.example.com"}}
    job = tfjob("board", workers=1, gpus=1)
    job["metadata"]["annotations"] = {"kubedl.io/tensorboard-config": json.dumps(config)}
    elastic = pytorchjob("elastic", gpus=1)
    cpu = {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}
    elastic["spec"]["elasticPolicy"] = {
        "minReplicas": 1,
        "maxReplicas": 2,
        "metrics": [{"type": "Resource", "resource": cpu}],
    }
    async with platform(settings(run.kubeconfig, identity="replica-a")) as p:
        await until(lambda: leading(p), what="replica-a leading")
        await seed.create(TFJOBS, job)
        await seed.create(PYTORCHJOBS, elastic)
        await run.called(
            *(
                (r.group, r.plural, verb)
                for r in (deployments, ingresses, hpas)
                for verb in ("create", "get")  # list and watch: the informers' (audited once a watch ends)
            ),
            timeout=30,
        )
        await until(lambda: seen(p, "Ingress", "default", "board-tensorboard-0"), what="the Ingress cached")
        await until(lambda: seen(p, "HorizontalPodAutoscaler", "default", "elastic"), what="the HPA cached")
        config["logDir"] = "/logs/b"
        changed = {"metadata": {"annotations": {"kubedl.io/tensorboard-config": json.dumps(config)}}}
        await seed.patch(TFJOBS, "default", "board", changed)
        await seed.patch(PYTORCHJOBS, "default", "elastic", {"spec": {"elasticPolicy": {"maxReplicas": 3}}})
        await run.called(
            ("apps", "deployments", "update"),
            ("networking.k8s.io", "ingresses", "update"),
            ("autoscaling", "horizontalpodautoscalers", "update"),
        )
        dropped = {"metadata": {"annotations": {"kubedl.io/tensorboard-config": None}}}
        await seed.patch(TFJOBS, "default", "board", dropped)
        await seed.patch(PYTORCHJOBS, "default", "elastic", {"spec": {"elasticPolicy": {"metrics": None}}})
        await run.called(
            ("apps", "deployments", "delete"),
            ("networking.k8s.io", "ingresses", "delete"),
            ("autoscaling", "horizontalpodautoscalers", "delete"),
        )


async def models_mode(run: Run) -> None:
    """KubeDL's models and dataset cache: a KubeDL TFJob with `spec.modelVersion` and
    `spec.cacheBackend` (Fluid's CRDs installed) gets Fluid's Dataset and AlluxioRuntime, then
    succeeds; its ModelVersion, the Model it names, the namespace's Dockerfile (each name found taken
    once: read after the 409) and the kaniko pod; the ModelVersion's status follows the pod."""
    seed = run.seed
    run.server.install_crds([minimal_crd(resource_for(kind)) for kind in ("Dataset", "AlluxioRuntime")])
    await seed.create(NODES, to_json(make_node("gpu-0", gpus=8)))
    for res in (MODELS, MODEL_VERSIONS, CONFIG_MAPS, resource_for("Dataset"), resource_for("AlluxioRuntime")):
        taken_once(run, res.path(namespace="default"))
    job = tfjob("mnist", api_version=KUBEDL_TFJOBS.api_version, workers=1, gpus=1)
    storage = {"localStorage": {"path": "/models/mnist", "nodeName": "gpu-0"}}
    job["spec"]["modelVersion"] = {"modelName": "mnist", "imageRepo": "hub/mnist", "storage": storage}
    job["spec"]["cacheBackend"] = {
        "mountPath": "/data",
        "dataset": {"dataSources": [{"location": "oss://b/d"}]},
    }
    async with platform(settings(run.kubeconfig, election=False)):
        await seed.create(KUBEDL_TFJOBS, job)
        await until(
            lambda: [p for p in run.pods_of("mnist") if p["spec"].get("nodeName")], what="mnist placed"
        )
        await run.kubelet("mnist", "Running")
        await run.kubelet("mnist", "Succeeded")
        build = await until(
            lambda: [
                p for p in run.objects("pods", "default") if p["metadata"]["name"].startswith("image-build-")
            ],
            what="the image-build pod",
        )
        await seed.patch(
            PODS, "default", build[0]["metadata"]["name"], {"status": {"phase": "Succeeded"}}, sub="status"
        )
        await run.called(
            ("model.kubedl.io", "modelversions", "create"),
            ("model.kubedl.io", "modelversions", "get"),
            ("model.kubedl.io", "modelversions", "update"),
            ("model.kubedl.io", "modelversions/status", "patch"),
            ("model.kubedl.io", "models", "create"),
            ("model.kubedl.io", "models", "get"),
            ("model.kubedl.io", "models/status", "patch"),
            ("", "configmaps", "create"),
            ("", "configmaps", "get"),
            ("data.fluid.io", "datasets", "create"),
            ("data.fluid.io", "datasets", "get"),
            ("data.fluid.io", "alluxioruntimes", "create"),
            ("data.fluid.io", "alluxioruntimes", "get"),
        )
        await until(
            lambda: any(
                (mv.get("status") or {}).get("imageBuildPhase") == "ImageBuildSucceeded"
                for mv in run.objects("modelversions", "default")
            ),
            what="the ModelVersion's build succeeded",
        )


async def crons_mode(run: Run) -> None:
    """KubeDL's Crons: a KubeDL TFJob with `spec.cronPolicy` gets a Cron of its name (the first create
    finds the name taken: a GET follows), updated when the job's policy changes; the Cron's runs are
    jobs it owns (the server checks `crons/finalizers`), and its status is patched."""
    seed = run.seed
    await seed.create(NODES, to_json(make_node("gpu-0", gpus=8)))
    crons = resource_for("Cron")
    taken_once(run, crons.path(namespace="default"))
    job = tfjob("nightly", api_version=KUBEDL_TFJOBS.api_version, workers=1, gpus=1)
    job["spec"]["cronPolicy"] = {"schedule": "@every 1s", "historyLimit": 1}
    async with platform(settings(run.kubeconfig, election=False)):
        await seed.create(KUBEDL_TFJOBS, job)
        group = crons.group
        await run.called((group, "crons", "create"), (group, "crons", "get"), timeout=30)
        policy = {"spec": {"cronPolicy": {"schedule": "@every 2s"}}}
        await seed.patch(KUBEDL_TFJOBS, "default", "nightly", policy)
        await run.called(
            (group, "crons", "update"),
            (group, "crons/status", "patch"),
            (group, "crons/finalizers", "update"),
            timeout=30,
        )


@dataclass(frozen=True)
class Scenario:
    drive: Callable[[Run], Awaitable[None]]
    gang_scheduler: str | None = None  # `gpuyard install --gang-scheduler`: delegate mode's roles


SCENARIOS: dict[str, Scenario] = {
    "gpuyard mode": Scenario(gpuyard_mode),
    "DRA": Scenario(dra_mode),
    "delegate mode": Scenario(delegate_mode, gang_scheduler="volcano"),
    "HTTP API writes": Scenario(api_writes),
    "models": Scenario(models_mode),
    "job add-ons": Scenario(job_addons),
    "crons": Scenario(crons_mode),
}


_AUDITED: dict[str, list[AuditRecord]] = {}


async def gpuyards_calls(tmp: Path) -> dict[str, list[AuditRecord]]:
    """Per scenario, the calls that presented gpuyard's token (the scenarios run once per session)."""
    if not _AUDITED:
        audited: dict[str, list[AuditRecord]] = {}
        for name, scenario in SCENARIOS.items():
            async with serving(tmp / name.replace(" ", "-")) as run:
                await scenario.drive(run)
                audited[name] = [r for r in run.server.audit or [] if r.user == GPUYARD]
                assert audited[name], f"{name}: no call presented gpuyard's token"
        _AUDITED.update(audited)
    return _AUDITED


async def test_the_shipped_rbac_grants_exactly_what_gpuyard_calls(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    denied: dict[str, set[Call]] = {}
    used: set[Call] = set()
    granted: set[Call] = set()
    for name, ours in (await gpuyards_calls(tmp_path_factory.mktemp("rbac"))).items():
        grants = shipped_grants(SCENARIOS[name].gang_scheduler)
        granted |= {family(c) for c in grants.all()}
        if refused := {call_of(r) for r in ours if not grants.allows(r)}:
            denied[name] = refused
        used |= {family(call_of(r)) for r in ours}
    assert not denied, f"calls gpuyard made that the shipped roles do not grant, per scenario: {denied}"
    unused = sorted(granted - used)
    assert not unused, (
        "granted by the shipped roles but never called by gpuyard in any scenario (remove the verb "
        f"from RULES, or exercise it in the scenario of the mode that uses it): {unused}"
    )


KINDS = {(r.group, r.plural): r.kind for r in (*API_RESOURCES, RESOURCE_CLAIMS)}


def part_of(record: AuditRecord) -> Part | None:
    """The part of its object a call writes (None: a read, or the server's own record of an
    owner reference's `finalizers` check)."""
    sub = record.subresource
    if record.verb == "delete" and not sub:
        return "delete"
    if record.verb == "create" and sub in ("", "binding"):
        return "create"
    if record.verb in ("update", "patch") and sub == "status":
        return "status"
    if record.verb in ("update", "patch") and not sub:
        return "update"
    return None


async def test_every_write_gpuyard_makes_is_its_owners(tmp_path_factory: pytest.TempPathFactory) -> None:
    wrong: list[str] = []
    managers: set[str] = set()
    for name, ours in (await gpuyards_calls(tmp_path_factory.mktemp("rbac"))).items():
        for r in ours:
            part = part_of(r)
            if part is None or not 200 <= r.code < 300:
                continue
            kind = KINDS[(r.group, r.resource)]
            where = f"{name}: {r.verb} {r.group}/{r.resource}{'/' + r.subresource if r.subresource else ''}"
            if part == "delete":
                if not any(allowed(i, kind, part, backend="kubernetes") for i in IDENTITIES):
                    wrong.append(f"{where} {r.namespace}/{r.name}: no gpuyard component may")
                continue
            managers.add(r.manager)
            if not allowed(r.manager, kind, part, backend="kubernetes"):
                wrong.append(f"{where} {r.namespace}/{r.name} by {r.manager or '<no fieldManager>'}")
    assert not wrong, "writes the ownership table gives to another writer:\n" + "\n".join(wrong)
    assert set(IDENTITIES) - {"gpuyard-node-agent"} <= managers, managers
