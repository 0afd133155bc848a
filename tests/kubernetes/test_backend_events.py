"""The Event informer (label `job-name`) across a leader change: the new leader's cache holds the
Events the old one wrote about jobs, so

(a) a repeat of the same reason and message is aggregated into the Event on the API server
    (its count goes up) instead of a second Event being created;
(b) the new process's HTTP API (what `gpuyard describe job` reads) shows the job's earlier Events;
(c) a job deleted while the new leader runs takes its earlier Events with it, and so does a job
    deleted while no replica ran (the server's garbage collector took its pods; the operator's
    `controllers/eventcleaning.py`).

And the informer is scoped: Events without the label (the ones written about nodes) never reach
the cache.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp

from gpuyard.apis.core import Event
from gpuyard.apis.jobkinds import TrainingJob, find_job
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.resources import resource_for
from gpuyard.controllers.eventcleaning import orphaned
from gpuyard.kubecluster.client import KubeClient
from gpuyard.kubecluster.informing import Informer
from gpuyard.kubecluster.writing import to_json
from gpuyard.platform.runtime import Platform
from gpuyard.state.clock import RealClock
from gpuyard.state.events import EventRecorder
from gpuyard.state.kinds import register_kinds
from gpuyard.state.ownership import OPERATOR
from gpuyard.state.store import Store
from tests.builders import make_node
from tests.kubernetes.conftest_backend import FakeApiServerView, served
from tests.kubernetes.test_backend_platform import (
    NODES,
    TFJOBS,
    connect,
    eventually,
    job_pods,
    platform,
    play_kubelet,
    pods_collected,
    settings,
    tfjob,
)
from tests.unit.controllers.fakes import load_job

__all__ = ["served"]

EVENTS = resource_for("Event")


def events_of(server: FakeApiServerView, job: str) -> list[dict[str, Any]]:
    return [e for e in server.list("events") if e.get("involvedObject", {}).get("name") == job]


def leads(p: Platform) -> bool:
    return p.backend.leadership is not None and p.backend.leadership.is_leader()


async def run_a_job(client: KubeClient, served: FakeApiServerView, p: Platform, name: str) -> None:
    """Create a one-pod job, let it be placed and run: the operator writes its Events."""
    await client.create(TFJOBS, tfjob(name, workers=1, gpus=1))
    await eventually(
        lambda: any(x["spec"].get("nodeName") for x in job_pods(served, name)), what=f"{name} placed"
    )
    await play_kubelet(client, served, name, phase="Running")
    await eventually(
        lambda: (
            (j := p.store.get("TFJob", "default", name)) is not None
            and isinstance(j, TrainingJob)
            and j.status.phase == "Running"
        ),
        what=f"{name} Running",
    )
    await eventually(lambda: len(events_of(served, name)) >= 2, what=f"{name}'s Events")


async def test_a_new_leader_aggregates_shows_and_deletes_the_earlier_events(
    served: FakeApiServerView,
) -> None:
    client = await connect(served)
    kc = served.kubeconfig
    try:
        await client.create(NODES, to_json(make_node("gpu-0", gpus=8)))
        async with platform(settings(kc, identity="replica-a")) as a:
            await eventually(lambda: leads(a), what="a leads")
            await run_a_job(client, served, a, "mnist")
            # an Event about a node (no job-name label), as the backend writes them
            await client.create(
                EVENTS,
                {
                    "apiVersion": "v1",
                    "kind": "Event",
                    "metadata": {"name": "gpu-0.unmatched", "namespace": "default"},
                    "involvedObject": {"kind": "Node", "name": "gpu-0"},
                    "reason": "UnmatchedDevices",
                    "message": "a GPU of gpu-0 matches no device",
                },
            )
        earlier = {e["metadata"]["name"]: e for e in events_of(served, "mnist")}
        assert earlier
        async with platform(settings(kc, identity="replica-b"), serve_http=True) as b:
            await eventually(lambda: leads(b), what="b leads", timeout=10)
            held = {e.metadata.name for e in b.store.list_of(Event, namespace="default")}
            assert set(earlier) <= held
            assert "gpu-0.unmatched" not in held  # not labelled job-name: not watched
            # (b) the HTTP API (what `gpuyard describe job` prints) shows the earlier Events
            url = f"{b.url}/api/v1/namespaces/default/jobs/mnist/events"
            async with aiohttp.ClientSession() as http, http.get(url) as resp:
                assert resp.status == 200
                shown = {e["metadata"]["name"] for e in (await resp.json())["items"]}
            assert set(earlier) <= shown
            # (a) the operator's repeat of an earlier reason is aggregated on the API server
            first = next(e for e in earlier.values() if e["source"]["component"] == OPERATOR)
            job = b.store.get("TFJob", "default", "mnist")
            assert isinstance(job, TrainingJob)
            await EventRecorder(component=OPERATOR, store=b.store, writer=b.writer).record(
                job,
                reason=first["reason"],
                message=first["message"],
                labels={"job-name": "mnist"},
                at=b.clock.utcnow(),
            )
            same = [
                e
                for e in events_of(served, "mnist")
                if (e["reason"], e["message"]) == (first["reason"], first["message"])
            ]
            assert [e["metadata"]["name"] for e in same] == [first["metadata"]["name"]]
            assert same[0]["count"] == first.get("count", 1) + 1
            reasons = [(e["reason"], e["message"]) for e in events_of(served, "mnist")]
            assert len(reasons) == len(set(reasons)), "no Event is written twice"
            # (c) the job goes while b leads: its Events go too, the node's Event stays
            await client.delete(TFJOBS, "default", "mnist")
            await eventually(lambda: not events_of(served, "mnist"), what="mnist's Events deleted")
            assert served.get("events", "default", "gpu-0.unmatched") is not None
    finally:
        await client.close()


async def test_a_job_deleted_while_no_replica_ran_loses_its_events_to_the_next_leader(
    served: FakeApiServerView,
) -> None:
    client = await connect(served)
    kc = served.kubeconfig
    try:
        await client.create(NODES, to_json(make_node("gpu-0", gpus=8)))
        async with platform(settings(kc, identity="replica-a")) as a:
            await eventually(lambda: leads(a), what="a leads")
            await run_a_job(client, served, a, "gone")
            await run_a_job(client, served, a, "kept")
        kept = {e["metadata"]["name"] for e in events_of(served, "kept")}
        await client.delete(TFJOBS, "default", "gone")  # the garbage collector takes its pods
        await pods_collected(client, served, "gone")
        await eventually(
            lambda: served.get("podgroups", "default", "gone") is None,
            what="its PodGroup collected",
            timeout=60,
        )
        assert events_of(served, "gone"), "Events have no owner: the collector leaves them"
        async with platform(settings(kc, identity="replica-b")) as b:
            await eventually(lambda: leads(b), what="b leads", timeout=10)
            await eventually(lambda: not events_of(served, "gone"), what="gone's Events deleted")
            assert kept <= {e["metadata"]["name"] for e in events_of(served, "kept")}
    finally:
        await client.close()


def event_body(name: str, *, job: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if job is not None:
        meta["labels"] = {"job-name": job}
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": meta,
        "involvedObject": {"kind": "TFJob" if job else "Node", "name": job or "gpu-0"},
        "reason": "Test",
        "message": name,
    }


async def test_the_event_informer_lists_watches_and_forgets_only_labelled_events(
    served: FakeApiServerView,
) -> None:
    client = await connect(served)
    store = Store()
    register_kinds(store)
    for name, labels in (("cached", {}), ("stale", {"job-name": "old"})):
        store.observe(
            Event(metadata=ObjectMeta(name=name, namespace="default", labels=labels, resource_version="1"))
        )
    informer = Informer(
        client=client, resource=EVENTS, cls=Event, store=store, clock=RealClock(), selector="job-name"
    )

    def held() -> set[str]:
        return {e.metadata.name for e in store.list_of(Event)}

    try:
        await client.create(EVENTS, event_body("about-job", job="mnist"))
        await client.create(EVENTS, event_body("about-node", job=None))
        await informer.relist()
        # listed: the labelled one; forgotten: a labelled one the server lacks; kept: an unlabelled
        # one the cache holds (outside the informer's scope, not the list's to judge)
        assert held() == {"about-job", "cached"}
        task = asyncio.create_task(informer.run())
        try:
            await client.create(EVENTS, event_body("later", job="mnist"))
            await client.create(EVENTS, event_body("node-later", job=None))
            await eventually(lambda: "later" in held(), what="a new labelled Event")
            await client.patch(EVENTS, "default", "about-job", {"metadata": {"labels": {"job-name": None}}})
            await eventually(lambda: "about-job" not in held(), what="an Event that lost its label dropped")
            assert "node-later" not in held()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    finally:
        await client.close()


def test_only_events_of_jobs_that_are_gone_are_orphaned() -> None:
    """An Event about a job the cache holds stays; one about a job that is gone (or re-created under
    the same name) is orphaned; the InvalidSpec Event of a job kept out of the cache on purpose (it
    failed validation, or lost its name to the other group's job) stays."""
    store = Store()
    register_kinds(store)
    job = load_job("tf-dist-mnist", namespace="default")
    job.metadata.uid = "uid-live"
    store.create(job)
    live = find_job(store, "default", job.metadata.name)
    assert live is not None

    def event(name: str, *, uid: str, reason: str) -> Event:
        return Event.model_validate(
            {
                "metadata": {"name": name, "namespace": "default", "uid": name, "labels": {"job-name": "x"}},
                "involvedObject": {
                    "apiVersion": job.api_version,
                    "kind": job.kind,
                    "namespace": "default",
                    "name": job.metadata.name,
                    "uid": uid,
                },
                "reason": reason,
                "message": "m",
            }
        )

    store.create(event("about-live", uid=live.metadata.uid, reason="TFJobRunning"))
    store.create(event("about-gone", uid="uid-earlier", reason="TFJobRunning"))
    store.create(event("about-invalid", uid="uid-other-group", reason="InvalidSpec"))
    groups = {job.api_version.split("/")[0]}
    orphans = {e.metadata.name for e in store.list_of(Event) if orphaned(store, e, groups=groups)}
    assert orphans == {"about-gone"}
    assert not any(orphaned(store, e, groups={"training.kubedl.io"}) for e in store.list_of(Event)), (
        "a job group gpuyard does not reconcile is never judged"
    )
