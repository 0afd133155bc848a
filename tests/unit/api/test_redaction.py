"""L4: events and conditions a tenant reads name other teams' jobs only as "a job of another team"."""

from __future__ import annotations

import asyncio

import pytest

from gpuyard.apis.core import Event
from gpuyard.apis.jobspecs import JobCondition
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.scheduling import LABEL_JOB_NAME
from gpuyard.platform.api.app import make_app
from gpuyard.platform.api.auth import Principal, hash_token
from gpuyard.platform.api.redaction import FOREIGN_JOB, NamespaceIndex, Redactor
from gpuyard.state.config import Settings
from gpuyard.state.context import Context

TOKENS = [
    {"sha256": hash_token("root"), "user": "root", "role": "admin"},
    {"sha256": hash_token("alice"), "user": "alice", "role": "user", "namespaces": ["team-a"]},
]
MESSAGE = "reclaimed by quota team-b (min 8) for team-b/big-train: team-a over its runtime; see team-a/small"
JOB = """apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {{name: {name}, namespace: {ns}}}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
          containers: [{{name: pytorch, image: x, resources: {{limits: {{cpu: 1}}}}}}]
"""


@pytest.fixture
async def client(aiohttp_client):
    ctx = Context.for_tests(settings=Settings(server={"tokens": TOKENS}, backend={"data_dir": None}))
    http = await aiohttp_client(make_app(ctx))
    for ns, name in (("team-a", "small"), ("team-b", "big-train")):
        r = await http.post(
            "/api/v1/jobs",
            data=JOB.format(ns=ns, name=name),
            headers={"Authorization": "Bearer root", "Content-Type": "application/yaml"},
        )
        assert r.status == 201
    victim = ctx.store.get("PyTorchJob", "team-a", "small")
    ctx.store.create(
        Event(
            metadata=ObjectMeta(name="small.1", namespace="team-a", labels={LABEL_JOB_NAME: "small"}),
            involved_object={"kind": "PyTorchJob", "name": "small", "uid": victim.metadata.uid},
            reason="Preempted",
            message=MESSAGE,
        )
    )
    victim.status.conditions.append(JobCondition(type="Queuing", reason="Preempted", message=MESSAGE))
    ctx.store.update(victim)
    return http


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_a_tenant_reads_events_without_other_teams_job_names(client):
    body = await (
        await client.get("/api/v1/namespaces/team-a/jobs/small/events", headers=bearer("alice"))
    ).json()
    (event,) = body["items"]
    assert "big-train" not in event["message"]
    assert f"for {FOREIGN_JOB}:" in event["message"]
    assert "see team-a/small" in event["message"]  # its own names stay


async def test_a_tenant_reads_conditions_without_other_teams_job_names(client):
    job = await (await client.get("/api/v1/namespaces/team-a/jobs/small", headers=bearer("alice"))).json()
    assert "big-train" not in str(job)
    listed = await (await client.get("/api/v1/jobs", headers=bearer("alice"))).json()
    assert "big-train" not in str(listed) and FOREIGN_JOB in str(listed)


async def test_an_admin_reads_every_name(client):
    body = await (
        await client.get("/api/v1/namespaces/team-a/jobs/small/events", headers=bearer("root"))
    ).json()
    assert body["items"][0]["message"] == MESSAGE


def test_only_known_foreign_namespaces_are_redacted():
    redactor = Redactor(frozenset({"team-b"}))
    text = "needs nvidia.com/gpu 3/4 free; team-b/x and team-c/y; /api/v1/namespaces/team-b/jobs; (team-b/z)"
    assert redactor.text(text) == (
        f"needs nvidia.com/gpu 3/4 free; {FOREIGN_JOB} and team-c/y; /api/v1/namespaces/team-b/jobs; ({FOREIGN_JOB})"
    )


def test_admins_and_all_namespace_users_get_no_redactor():
    index = NamespaceIndex(Context.for_tests().store)
    admin = Principal(user="r", role="admin", namespaces=frozenset())
    everyone = Principal(user="e", role="viewer", namespaces=frozenset({"*"}))
    assert Redactor.for_principal(index, admin) is None
    assert Redactor.for_principal(index, everyone) is None


async def test_the_namespace_index_follows_the_store():
    ctx = Context.for_tests()
    index = NamespaceIndex(ctx.store)
    ctx.store.create(Event(metadata=ObjectMeta(name="e1", namespace="team-x")))
    assert index.known() == {"team-x"}  # not running: scanned on demand
    task = asyncio.create_task(index.run())
    await asyncio.sleep(0)
    ctx.store.create(Event(metadata=ObjectMeta(name="e2", namespace="team-y")))
    for _ in range(10):
        await asyncio.sleep(0)
    assert index.known() == {"team-x", "team-y"}
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize(
    "text",
    [
        "team-b/x team-b/y.z ateam-b/x Xteam-b/x _team-b/x .team-b/x /team-b/x -team-b/x team-b/ team-b/-x",
        "(team-b/job-1), [team-b/a.b.] team-bb/x team-b/X é team-b/x ét-team-b/x",
        'the list {"message": "for team-b/big: see team-c/small and team-b/"}',
        "",
        "/",
        "team-b/x/y/team-b/z",
    ],
)
def test_the_fast_path_matches_the_reference_pattern(text):
    from gpuyard.platform.api.redaction import _REFERENCE

    foreign = frozenset({"team-b", "team-c"})
    expected = _REFERENCE.sub(lambda m: FOREIGN_JOB if m.group(1) in foreign else m.group(0), text)
    assert Redactor(foreign).text(text) == expected


async def test_a_tenant_watching_events_reads_no_foreign_job_names(client):
    events = await client.get(
        "/api/v1/watch/events?resourceVersion=1", headers=bearer("alice")
    )  # from the start: the fixture's preemption event
    data = ""
    while "Preempted" not in data:
        line = (await asyncio.wait_for(events.content.readline(), 5)).decode()
        if line.startswith("data: "):
            data = line
    events.close()
    assert "big-train" not in data and FOREIGN_JOB in data
