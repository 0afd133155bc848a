"""KubeDL's Cron through the whole platform on the virtual clock (operator, cron controller,
scheduler, fake kubelet): a `* * * * *` Cron creates a job within a minute and keeps its history;
Forbid skips a run while one is active, Replace deletes it and starts the new one; suspend stops
new runs; historyLimit trims the history and deletes the finished jobs cut from it; a deadline
ends the runs; a job with `spec.cronPolicy` gets a Cron of its name; a deleted Cron takes its
jobs with it; a Cron is applied through `POST /api/v1/apply`, and a bad schedule is a 422 naming
the field."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import yaml

from gpuyard.apis.core import Event
from gpuyard.apis.crons import LABEL_CRON_NAME, Cron, parse_cron
from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.jobs import parse_job
from gpuyard.state.ownership import USER
from gpuyard.state.writing import identified
from gpuyard.testing import Cluster

NODES = [("dgx-a100", 1)]


def workload(duration: str) -> dict[str, Any]:
    container = {"name": "pytorch", "image": "train", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    return {
        "spec": {
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": 1,
                    "template": {
                        "metadata": {"annotations": {"fake.gpuyard.io/duration": duration}},
                        "spec": {"containers": [container]},
                    },
                }
            }
        }
    }


def cron_doc(name: str, *, duration: str = "10", **policy: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps.kubedl.io/v1alpha1",
        "kind": "Cron",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "schedule": "* * * * *",
            **policy,
            "template": {
                "apiVersion": "training.kubedl.io/v1alpha1",
                "kind": "PyTorchJob",
                "workload": workload(duration),
            },
        },
    }


async def create_cron(c: Cluster, doc: dict[str, Any]) -> Cron:
    cron, problems = parse_cron(doc)
    assert cron is not None, problems
    return await identified(c.writer, USER).create(cron)


def runs(c: Cluster, cron: str) -> list[TrainingJob]:
    out = [j for j in c.store.list("PyTorchJob", namespace="default", selector={LABEL_CRON_NAME: cron})]
    return sorted((j for j in out if isinstance(j, TrainingJob)), key=lambda j: j.metadata.name)


def cron_of(c: Cluster, name: str) -> Cron:
    return c.store.must_get_of(Cron, "default", name)


def reasons(c: Cluster, name: str) -> set[str]:
    return {
        e.reason
        for e in c.store.list_of(Event, namespace="default")
        if e.involved_object.get("kind") == "Cron" and e.involved_object.get("name") == name
    }


async def test_every_minute_creates_a_job_within_a_minute_named_owned_and_kept_in_history() -> None:
    async with Cluster.start(nodes=NODES) as c:
        cron = await create_cron(c, cron_doc("nightly"))
        assert await c.until(lambda: len(runs(c, "nightly")) == 1, timeout=60)
        job = runs(c, "nightly")[0]
        status = cron_of(c, "nightly").status
        assert status.last_schedule_time is not None
        assert job.metadata.name == f"nightly-{int(status.last_schedule_time.timestamp())}"
        assert status.last_schedule_time.second == 0
        owner = job.metadata.owner_references[0]
        assert (owner.kind, owner.name, owner.uid, owner.controller) == (
            "Cron",
            "nightly",
            cron.metadata.uid,
            True,
        )
        assert [r.name for r in cron_of(c, "nightly").status.active] == [job.metadata.name]
        await c.run_until(job, "Succeeded", timeout=120)
        assert await c.until(lambda: not cron_of(c, "nightly").status.active, timeout=5)
        assert await c.until(lambda: len(runs(c, "nightly")) >= 2, timeout=60)
        history = cron_of(c, "nightly").status.history
        assert history[0].object.name == job.metadata.name
        assert history[0].status == "Succeeded" and history[0].finished is not None
        assert history[0].object.kind == "PyTorchJob"
        assert "SuccessfulCreate" in reasons(c, "nightly")


async def test_forbid_skips_while_a_run_is_active_and_replace_replaces_it() -> None:
    async with Cluster.start(nodes=NODES) as c:
        await create_cron(c, cron_doc("forbid", duration="100000", concurrencyPolicy="Forbid"))
        await create_cron(c, cron_doc("replace", duration="100000", concurrencyPolicy="Replace"))
        assert await c.until(lambda: len(runs(c, "forbid")) == 1 and len(runs(c, "replace")) == 1, timeout=60)
        first = runs(c, "replace")[0].metadata.name
        await c.advance(150)  # two more schedule times
        assert len(runs(c, "forbid")) == 1
        assert "AlreadyActive" in reasons(c, "forbid")
        now = runs(c, "replace")
        assert len(now) == 1 and now[0].metadata.name != first
        assert [r.name for r in cron_of(c, "replace").status.active] == [now[0].metadata.name]
        assert first in {h.object.name for h in cron_of(c, "replace").status.history}


async def test_suspend_stops_new_runs_and_resuming_starts_them_again() -> None:
    async with Cluster.start(nodes=NODES) as c:
        await create_cron(c, cron_doc("paused", suspend=True))
        await c.advance(180)
        assert runs(c, "paused") == []
        assert cron_of(c, "paused").status.last_schedule_time is None
        fresh = cron_of(c, "paused").clone()
        fresh.spec.suspend = False
        await identified(c.writer, USER).update(fresh)
        assert await c.until(lambda: len(runs(c, "paused")) == 1, timeout=60)


async def test_history_limit_keeps_the_newest_and_deletes_the_finished_jobs_cut_from_it() -> None:
    async with Cluster.start(nodes=NODES) as c:
        await create_cron(c, cron_doc("short", duration="5", historyLimit=2))
        await c.advance(5 * 60 + 30)
        history = cron_of(c, "short").status.history
        assert len(history) == 2
        assert [h.object.name for h in history] == sorted(h.object.name for h in history)
        kept = {h.object.name for h in history}
        assert {j.metadata.name for j in runs(c, "short")} <= kept
        assert "SuccessfulDelete" in reasons(c, "short")


async def test_no_runs_after_the_deadline() -> None:
    async with Cluster.start(nodes=NODES) as c:
        deadline = c.clock.utcnow() + timedelta(seconds=150)
        await create_cron(c, cron_doc("ending", deadline=deadline.isoformat()))
        await c.advance(10 * 60)
        assert len(runs(c, "ending")) == 2  # the schedule times before the deadline
        assert "Deadline" in reasons(c, "ending")


async def test_a_job_with_cron_policy_gets_a_cron_of_its_name_and_a_deleted_cron_takes_its_jobs() -> None:
    async with Cluster.start(nodes=NODES) as c:
        doc = {
            "apiVersion": "training.kubedl.io/v1alpha1",
            "kind": "PyTorchJob",
            "metadata": {"name": "wrapped", "namespace": "default"},
            **workload("10"),
        }
        doc["spec"]["cronPolicy"] = {"schedule": "@every 2m", "historyLimit": 3}
        await identified(c.writer, USER).create(parse_job(doc))
        assert await c.until(lambda: c.store.get_of(Cron, "default", "wrapped") is not None, timeout=5)
        cron = cron_of(c, "wrapped")
        assert (cron.spec.schedule, cron.spec.history_limit) == ("@every 2m", 3)
        assert cron.spec.template.kind == "PyTorchJob"
        assert "cronPolicy" not in cron.spec.template.workload["spec"]  # type: ignore[index]
        assert await c.until(lambda: len(runs(c, "wrapped")) == 1, timeout=150)
        assert "cronPolicy" not in (runs(c, "wrapped")[0].spec.model_extra or {})
        await identified(c.writer, USER).delete("Cron", "default", "wrapped")
        await identified(c.writer, USER).delete("PyTorchJob", "default", "wrapped")
        assert await c.until(lambda: runs(c, "wrapped") == [], timeout=5)


async def test_apply_accepts_a_cron_and_refuses_a_bad_schedule_naming_the_field() -> None:
    async with Cluster.start(nodes=NODES, serve_http=True) as c:
        async with httpx.AsyncClient(base_url=c.url) as http:
            good = await http.post(
                "/api/v1/apply",
                content=yaml.safe_dump(cron_doc("applied")),
                headers={"Content-Type": "application/yaml"},
            )
            assert good.status_code == 200, good.text
            assert good.json()["applied"][0] == {
                "kind": "Cron",
                "namespace": "default",
                "name": "applied",
                "action": "created",
            }
            bad = cron_doc("broken")
            bad["spec"]["schedule"] = "every day"
            bad["spec"]["concurrencyPolicy"] = "Sometimes"
            refused = await http.post(
                "/api/v1/apply", content=yaml.safe_dump(bad), headers={"Content-Type": "application/yaml"}
            )
            assert refused.status_code == 422, refused.text
            fields = {d["field"]: d["reason"] for d in refused.json()["error"]["details"]}
            assert "minute hour day-of-month month day-of-week" in fields["documents[0].spec.schedule"]
            assert "Allow, Forbid, Replace" in fields["documents[0].spec.concurrencyPolicy"]
        assert c.store.get_of(Cron, "default", "broken") is None
        assert await c.until(lambda: len(runs(c, "applied")) == 1, timeout=60)
