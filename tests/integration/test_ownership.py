"""One writer per object and field, on the fake backend: a whole platform runs a scenario (jobs
submitted, placed and run, one preempted by a more urgent job, a GPU failed under a running pod,
a pod crashed, a job finishing, jobs deleted), the fake API server records every write with the
identity of the component that made it (`StoreWriter.audit`), and each write is checked against
the ownership table (`gpuyard.state.ownership.OWNERSHIP`, which `docs/architecture.md` mirrors).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gpuyard.apis.core import Event, Pod
from gpuyard.apis.scheduling import pod_gpus
from gpuyard.state.ownership import BACKEND, OPERATOR, SCHEDULER, USER, Part, allowed
from gpuyard.state.writing import StoreWriter, WriteRecord
from gpuyard.testing import Cluster

PART: dict[str, Part] = {"create": "create", "update": "update", "patch_status": "status", "delete": "delete"}


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[WriteRecord]]:
    """Every write of the platform's writer, from its first."""
    records: list[WriteRecord] = []
    init = StoreWriter.__init__

    def audited(self: StoreWriter, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.audit = records.append

    monkeypatch.setattr(StoreWriter, "__init__", audited)
    yield records


def job(name: str, *, gpus: int, workers: int, priority: int = 0, seconds: int = 100000) -> str:
    container = {"name": "pytorch", "image": "train", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
    body = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "runPolicy": {"schedulingPolicy": {"priority": priority}},
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": workers,
                    "restartPolicy": "OnFailure",
                    "template": {
                        "metadata": {"annotations": {"fake.gpuyard.io/duration": str(seconds)}},
                        "spec": {"containers": [container]},
                    },
                }
            },
        },
    }
    return yaml.safe_dump(body)


def pod_gpu(pod: Pod) -> int:
    return pod_gpus(pod)[0]


def pods_of(c: Cluster, name: str) -> list[Pod]:
    return [p for p in c.store.list_of(Pod, namespace="default") if p.metadata.labels.get("job-name") == name]


async def test_every_write_is_made_by_the_one_writer_the_table_names(writes: list[WriteRecord]) -> None:
    async with Cluster.start(nodes=[("dgx-a100", 2)]) as c:
        low = await c.submit(job("low", gpus=4, workers=4))  # the whole cluster
        await c.run_until(low, "Running", timeout=300)
        await c.advance(600)
        urgent = await c.submit(job("urgent", gpus=4, workers=1, priority=1000))
        await c.run_until(urgent, "Running", timeout=600)  # low was preempted to make room
        (pod,) = pods_of(c, "urgent")
        assert await c.inject("gpu-fail", pod.spec.node_name or "", gpu=pod_gpu(pod)) == 1
        await c.run_until(urgent, "Running", timeout=600)  # placed again, on healthy GPUs
        short = await c.submit(job("short", gpus=1, workers=1, priority=500, seconds=300))
        await c.run_until(short, "Running", timeout=600)
        (crashed,) = pods_of(c, "short")
        await c.inject("pod-crash", f"default/{crashed.metadata.name}", exit_code=137)
        await c.run_until(short, "Succeeded", timeout=1800)
        events = {e.metadata.name: e for e in c.store.list_of(Event)}
        for name in ("low", "urgent", "short"):
            await c.delete(f"default/{name}")
        await c.advance(30)
        assert not c.store.list_of(Pod) and not c.store.list("Event")

    wrong = [
        r for r in writes if not r.identity or not allowed(r.identity, r.kind, PART[r.verb], backend="fake")
    ]
    assert not wrong, "writes the ownership table gives to another writer:\n" + "\n".join(
        f"  {r.identity or '<no identity>'} {r.verb} {r.kind} {r.namespace}/{r.name} {sorted(r.parts)}"
        for r in wrong[:40]
    )
    assert all("status" not in r.parts for r in writes if r.verb == "update"), "status is a subresource"

    # the scenario went where it should: every component wrote, preemption and failures happened
    who = Counter(r.identity for r in writes)
    assert {OPERATOR, SCHEDULER, BACKEND, USER} <= set(who), who
    reasons = {e.reason for e in events.values()}
    assert {"Preempted", "DeviceUnhealthy", "ExitedWithCode"} <= reasons, reasons
    assert any(r.kind == "Reservation" and r.verb == "delete" for r in writes)

    # an Event is written by the component it names (`source.component`), and no other
    by_event: dict[str, set[str]] = {}
    for r in writes:
        if r.kind == "Event" and r.verb in ("create", "update"):
            by_event.setdefault(r.name, set()).add(r.identity)
    for name, event in events.items():
        assert by_event.get(name) == {event.source["component"]}, (name, by_event.get(name), event.source)
        assert event.reporting_component == event.source["component"]
