"""`gpuyard describe node NAME` against a live loopback server: the node's labels, annotations,
taints, conditions, capacity and allocatable, what its pods hold, its pods, its events, then the
device topology (or a plain "no GPUs" for a CPU-only node), and the node routes behind it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import pytest
import pytest_asyncio
from click.testing import CliRunner

from gpuyard.apis.core import Event, Taint
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.scheduling import ANNOTATION_DEVICES, LABEL_JOB_NAME
from gpuyard.cli import jobs as job_commands
from gpuyard.cli.common import KUBELET_PICKS_GPUS
from gpuyard.cli.nodes import register
from gpuyard.state.context import Context
from tests.builders import make_node, make_pod
from tests.integration.serving import clean_cli_env, serving
from tests.unit.api.test_dashboard import build_app, make_ctx


@click.group()
def root() -> None:
    """A stand-in for the `gpuyard` root group."""


register(root)
job_commands.register(root)

WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _pod(ns: str, name: str, job: str, node: str, gpus: list[int], *, phase: str = "Running") -> Any:
    pod = make_pod(
        name,
        namespace=ns,
        node=node,
        gpus=len(gpus),
        cpu="4",
        memory="16Gi",
        labels={LABEL_JOB_NAME: job},
        annotations={ANNOTATION_DEVICES: json.dumps({"gpus": gpus, "nics": []})},
    )
    pod.status.phase = phase  # type: ignore[assignment]
    return pod


def _node_event(node: str, reason: str, message: str, *, warning: bool = False) -> Event:
    return Event(
        metadata=ObjectMeta(name=f"{node}.{reason.lower()}", namespace="default"),
        involved_object={"kind": "Node", "name": node, "apiVersion": "v1"},
        reason=reason,
        message=message,
        type="Warning" if warning else "Normal",
        first_timestamp=WHEN,
        last_timestamp=WHEN,
        source={"component": "kubelet"},
    )


class Live:
    def __init__(self, ctx: Context, url: str) -> None:
        self.ctx = ctx
        self.url = url

    async def cli(self, *args: str, token: str = "root") -> Any:
        argv = [*args, "--server", self.url, "--token", token]
        return await asyncio.to_thread(CliRunner().invoke, root, argv, catch_exceptions=False)


@pytest_asyncio.fixture
async def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Live]:
    clean_cli_env(monkeypatch, tmp_path)
    ctx = make_ctx()
    store = ctx.store
    # dgx-0 (a DGX-1 topology): team-a/big holds GPUs 0-7 in two pods, a finished pod holds nothing
    store.create(_pod("team-a", "big-worker-0", "big", "dgx-0", [0, 1, 2, 3]))
    store.create(_pod("team-a", "big-worker-1", "big", "dgx-0", [4, 5, 6, 7]))
    store.create(_pod("team-b", "old-worker-0", "old", "dgx-0", [0], phase="Succeeded"))
    store.create(_pod("team-b", "cpu-worker-0", "cpu", "cpu-0", []))
    store.create(_node_event("dgx-0", "NodeNotReady", "node dgx-0 stopped posting status", warning=True))
    store.create(_node_event("dgx-0", "NodeReady", "node dgx-0 is ready"))
    store.create(_node_event("dgx-1", "NodeReady", "node dgx-1 is ready"))
    taint = Taint(key="gpuyard.io/maintenance", value="true", effect="NoSchedule")
    store.create(make_node("cordoned-0", gpus=0, taints=[taint]))
    store.mutate("Node", "", "cordoned-0", lambda n: setattr(n.spec, "unschedulable", True))
    store.mutate("Node", "", "dgx-0", lambda n: n.metadata.annotations.update({"example.com/rack": "r1"}))
    try:
        async with serving(build_app(ctx)) as url:
            yield Live(ctx, url)
    finally:
        ctx.store.close()


def _section(out: str, title: str) -> list[str]:
    """The lines of one `Title:` section, up to the next unindented line."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    body = []
    for line in lines[start + 1 :]:
        if line and not line.startswith(" "):
            break
        body.append(line)
    return [lines[start], *body]


async def test_describe_gpu_node_shows_everything_kubectl_does_then_the_topology(live: Live) -> None:
    r = await live.cli("describe", "node", "dgx-0")
    assert r.exit_code == 0, r.output
    out = r.output
    assert out.splitlines()[0].split() == ["Name:", "dgx-0"]
    labels = _section(out, "Labels:")
    assert any("gpuyard.io/gpu-model=v100" in line for line in labels), labels
    assert "example.com/rack: r1" in _section(out, "Annotations:")[0]
    assert _section(out, "Taints:")[0].split() == ["Taints:", "<none>"]
    assert "Unschedulable:      false" in out
    conditions = _section(out, "Conditions:")
    assert conditions[1].split()[:2] == ["TYPE", "STATUS"] and conditions[2].split()[:2] == ["Ready", "True"]
    capacity = _section(out, "Capacity:")
    assert "  nvidia.com/gpu:" in "\n".join(capacity) and any(
        line.split() == ["cpu:", "80"] for line in capacity
    )
    assert _section(out, "Allocatable:")[1:] != []
    allocated = {line.split()[0]: line.split()[1:] for line in _section(out, "Allocated resources:")[3:]}
    # two running pods of 4 CPUs / 16Gi / 4 GPUs each; the Succeeded pod holds nothing
    assert allocated["cpu"][:2] == ["8", "(10%)"], allocated
    assert allocated["memory"][:2] == ["32Gi", "(6%)"], allocated
    assert allocated["nvidia.com/gpu"][:2] == ["8", "(100%)"], allocated
    assert "GPUs held: 8 of 8" in out
    assert any(line.split() == ["team-a/big", "0,1,2,3,4,5,6,7"] for line in out.splitlines()), out
    pods = _section(out, "Pods:")
    assert pods[0] == "Pods: (3 in total, 2 non-terminated, at most 110)"
    rows = {line.split()[0]: line.split()[1:] for line in pods[2:]}
    assert rows["team-a/big-worker-0"] == ["team-a/big", "0,1,2,3", "Running"]
    assert rows["team-b/old-worker-0"] == ["team-b/old", "0", "Succeeded"]
    events = _section(out, "Events:")
    assert [line.split()[2] for line in events[2:]] == ["NodeNotReady", "NodeReady"], events
    assert "dgx-1" not in "\n".join(events)
    devices = "\n".join(_section(out, "Devices:"))
    assert "NodeTopology dgx-0" in devices and "Links:" in devices and "team-a/big" in devices

    r = await live.cli("describe", "node", "dgx-0", "-o", "json")
    data = json.loads(r.output)
    assert set(data) == {"node", "pods", "allocated", "events", "topology", "gpusPickedBy"}
    assert data["gpusPickedBy"] == "scheduler" and "picked by the kubelet" not in out
    assert data["allocated"]["gpusByJob"] == {"team-a/big": [0, 1, 2, 3, 4, 5, 6, 7]}
    assert data["allocated"]["requests"]["cpu"] == "8" and data["allocated"]["pods"] == 2
    assert sorted(int(g) for g in data["topology"]["gpus"]) == list(range(8))


async def test_describe_cpu_node_says_it_has_no_gpus(live: Live) -> None:
    r = await live.cli("describe", "node", "cpu-0")
    assert r.exit_code == 0, r.output
    assert _section(r.output, "Devices:")[1].strip() == "This node has no GPUs (CPU only)."
    assert "team-b/cpu-worker-0" in r.output and "Events:\n  <none>" in r.output
    assert "GPUs held" not in r.output
    r = await live.cli("describe", "node", "cordoned-0")
    assert r.exit_code == 0, r.output
    assert "Unschedulable:      true" in r.output
    assert _section(r.output, "Taints:")[0].split() == ["Taints:", "gpuyard.io/maintenance=true:NoSchedule"]
    assert "Pods: (0 in total, 0 non-terminated, at most 110)\n  <none>" in r.output
    r = await live.cli("describe", "node", "cpu-0", "-o", "yaml")
    assert r.exit_code == 0 and "topology: null" in r.output


async def test_describe_gpu_node_without_topology_says_so(live: Live) -> None:
    r = await live.cli("describe", "node", "dgx-1")
    assert r.exit_code == 0, r.output
    assert _section(r.output, "Devices:")[1].strip() == "No device topology reported for its 8 GPU(s)."
    assert [line.split()[2] for line in _section(r.output, "Events:")[2:]] == ["NodeReady"]


async def test_describe_unknown_node_is_one_line_and_exit_2(live: Live) -> None:
    r = await live.cli("describe", "node", "no-such-node")
    assert r.exit_code == 2
    assert r.output.strip() == "error: node no-such-node not found"


async def test_node_pods_and_events_routes(live: Live) -> None:
    from aiohttp import ClientSession

    async with ClientSession(live.url) as http:
        root_auth = {"Authorization": "Bearer root"}
        async with http.get("/api/v1/nodes/dgx-0/pods", headers=root_auth) as resp:
            assert resp.status == 200
            body = await resp.json()
        assert [p["metadata"]["name"] for p in body["items"]] == [
            "big-worker-0",
            "big-worker-1",
            "old-worker-0",
        ]
        assert body["items"][0]["summary"]["requests"] == {
            "cpu": "4",
            "memory": "16Gi",
            "nvidia.com/gpu": "4",
        }
        async with http.get("/api/v1/nodes/nope/pods", headers=root_auth) as resp:
            assert resp.status == 404 and (await resp.json())["error"]["details"][0]["field"] == "name"
        async with http.get("/api/v1/nodes/nope/events", headers=root_auth) as resp:
            assert resp.status == 404
        async with http.get("/api/v1/nodes/dgx-0/events", headers=root_auth) as resp:
            assert [e["reason"] for e in (await resp.json())["items"]] == ["NodeNotReady", "NodeReady"]
        async with http.get("/api/v1/nodes/dgx-0/pods") as resp:
            assert resp.status == 401
        # a tenant sees other namespaces' pods as `other`, still counted in what the node holds
        async with http.get("/api/v1/nodes/dgx-0/pods", headers={"Authorization": "Bearer alice"}) as resp:
            assert resp.status == 200
            tenant = await resp.json()
        names = [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in tenant["items"]]
        assert names == ["team-a/big-worker-0", "team-a/big-worker-1", "other/other"]
        assert tenant["items"][2]["summary"]["job"] == "other" and "env" not in tenant["items"][2]["summary"]
        assert tenant["allocated"] == body["allocated"]
    r = await live.cli("describe", "node", "dgx-0", token="alice")
    assert r.exit_code == 0 and "other/other" in r.output and "team-b" not in r.output, r.output


async def test_count_only_mode_says_the_kubelet_picks_the_gpus(live: Live) -> None:
    """With `backend.kubernetes.gpu_resource: nvidia.com/gpu` the device plugin picks each container's
    GPUs: `describe node` and `describe job` say the indices shown are the scheduler's, not the
    container's (`gpusPickedBy: kubelet` in the node's and the job's pods answers)."""
    backend = live.ctx.settings.backend
    backend.kind = "kubernetes"
    backend.kubernetes.gpu_resource = "nvidia.com/gpu"
    assert backend.gpus_picked_by == "kubelet"
    r = await live.cli("describe", "node", "dgx-0")
    assert r.exit_code == 0, r.output
    allocated = "\n".join(_section(r.output, "Allocated resources:"))
    assert f"{KUBELET_PICKS_GPUS}." in allocated and "GPUs held: 8 of 8" in allocated
    data = json.loads((await live.cli("describe", "node", "dgx-0", "-o", "json")).output)
    assert data["gpusPickedBy"] == "kubelet"

    r = await live.cli("describe", "job", "team-a/pytorch-simple")
    assert r.exit_code == 0, r.output
    pods = _section(r.output, "Pods:")
    assert pods[1] == f"  {KUBELET_PICKS_GPUS}.", pods
    data = json.loads((await live.cli("describe", "job", "team-a/pytorch-simple", "-o", "json")).output)
    assert data["gpusPickedBy"] == "kubelet"

    backend.kubernetes.gpu_resource = "auto"  # the scheduler's GPUs are the container's again
    r = await live.cli("describe", "job", "team-a/pytorch-simple")
    assert KUBELET_PICKS_GPUS not in r.output
