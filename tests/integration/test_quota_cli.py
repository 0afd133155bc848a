"""The quota CLI against a live loopback server: `apply -f`, `get quotas` (the tree), `get queues`,
errors as one line with exit 2 (bad input, 4xx) or 1 (server unreachable)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import click
import pytest
import pytest_asyncio
import yaml
from click.testing import CliRunner

from gpuyard.cli.cluster import register as register_cluster
from gpuyard.cli.quotas import register
from gpuyard.state.context import Context
from tests.integration.serving import clean_cli_env, serving
from tests.unit.api.test_dashboard import make_ctx, reservation
from tests.unit.api.test_quotas_api import build_app, quota
from tests.unit.scheduler.helpers import podgroup, role

REPO = Path(__file__).parents[2]
GPU = "nvidia.com/gpu"


@click.group()
def root() -> None:
    """A stand-in for the `gpuyard` root group."""


register_cluster(root)  # `get` exists already: the quota commands merge into it
register(root)


class Live:
    def __init__(self, ctx: Context, url: str) -> None:
        self.ctx = ctx
        self.url = url

    async def cli(self, *args: str, token: str | None = "root", url: str | None = None) -> Any:
        argv = [*args, "--server", url or self.url]
        if token is not None:
            argv += ["--token", token]
        runner = CliRunner()
        return await asyncio.to_thread(runner.invoke, root, argv, catch_exceptions=False)


@pytest_asyncio.fixture
async def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Live]:
    clean_cli_env(monkeypatch, tmp_path)
    ctx = make_ctx()
    try:
        async with serving(build_app(ctx)) as url:
            yield Live(ctx, url)
    finally:
        ctx.store.close()


def set_status(ctx: Context, name: str, **fields: dict[str, int]) -> None:
    obj = next(q for q in ctx.store.list("ElasticQuota") if q.metadata.name == name).clone()
    for key, values in fields.items():
        setattr(obj.status, key, {k: Decimal(v) for k, v in values.items()})
    ctx.store.update(obj)


async def test_apply_demo_then_get_quotas_and_queues(live: Live) -> None:
    r = await live.cli("apply", "-f", str(REPO / "configs" / "quotas" / "demo-teams.yaml"))
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == [
        "queue/team-a created",
        "queue/team-b created",
        "elasticquota/team-a created",
        "elasticquota/team-b created",
    ]
    r = await live.cli("apply", "-f", str(REPO / "configs" / "quotas" / "demo-teams.yaml"))
    assert r.output.count("unchanged") == 4
    set_status(live.ctx, "team-a", runtime={GPU: 40}, used={GPU: 36})
    r = await live.cli("get", "quotas")
    assert r.exit_code == 0, r.output
    lines = [line.split() for line in r.output.splitlines()]
    assert lines[0] == ["NAME", "RESOURCE", "MIN", "MAX", "RUNTIME", "USED"]
    assert lines[1] == ["team-a", GPU, "24", "52", "40", "36"]
    assert lines[2] == ["team-b", GPU, "24", "52", "0", "0"]
    r = await live.cli("get", "queues", token="vic")  # a viewer may read
    assert r.exit_code == 0, r.output
    lines = [line.split() for line in r.output.splitlines()]
    assert lines[0] == ["NAME", "WEIGHT", "STRATEGY", "PENDING", "RUNNING", "SHARE", "SOURCE"]
    assert lines[1] == ["team-a", "1", "BestEffortFIFO", "0", "0", "0.00", "defined"]
    r = await live.cli("get", "queues", "-o", "json")
    assert [q["metadata"]["name"] for q in json.loads(r.output)] == ["team-a", "team-b"]
    r = await live.cli("get", "nodes")  # the cluster's `get` commands are still there
    assert r.exit_code == 0, r.output


async def test_get_quotas_shows_only_what_a_quota_sets_or_uses(live: Live) -> None:
    r = await live.cli("apply", "-f", str(REPO / "configs" / "quotas" / "demo-teams.yaml"))
    assert r.exit_code == 0, r.output
    # the status names every resource of the cluster, most of them 0
    zeros = {res: 0 for res in ("ephemeral-storage", "nvidia.a100", "nvidia.k80", "rdma/hca")}
    full = {**zeros, GPU: 4, "cpu": 44, "nvidia.v100": 4}
    set_status(live.ctx, "team-a", runtime=full, used=full, request=full)
    set_status(live.ctx, "team-b", runtime={**zeros, "nvidia.a100": 8}, used=zeros, request=zeros)
    r = await live.cli("get", "quotas")
    assert r.exit_code == 0, r.output
    assert [line.split() for line in r.output.splitlines()[1:]] == [
        ["team-a", "cpu", "-", "-", "44", "44"],  # min and max not set: no guarantee, no ceiling
        [GPU, "24", "52", "4", "4"],
        ["nvidia.v100", "-", "-", "4", "4"],
        ["team-b", GPU, "24", "52", "0", "0"],
        ["koordinator-default-quota", "-", "-", "-", "-", "-"],  # implicit, nothing charged to it
    ]
    r = await live.cli("get", "quotas", "-o", "wide")  # wide: every resource of spec and status
    rows = [line.split() for line in r.output.splitlines()[1:]]
    team_a = rows[: next(i for i, row in enumerate(rows) if row[0] == "team-b")]
    assert sorted(row[1] if row[0] == "team-a" else row[0] for row in team_a) == sorted(full)
    assert len(rows) - len(team_a) == len(zeros) + 1 + 1  # team-b's rows, the implicit default's
    r = await live.cli("get", "quotas", "-o", "yaml")
    status = {q["metadata"]["name"]: q["status"] for q in yaml.safe_load(r.output)}
    assert set(status["team-a"]["runtime"]) == set(full)


async def test_get_quotas_shows_the_tree_indented(live: Live, tmp_path: Path) -> None:
    docs = [
        quota("team-b", gmin=8, gmax=32, parent="research"),
        quota("research", gmin=16, gmax=32, is_parent=True),
        quota("team-a", gmin=8, gmax=32, parent="research", namespace="team-a"),
        quota("ops", gmin=4, gmax=8),
    ]
    docs[1]["spec"]["min"]["cpu"] = "64"
    path = tmp_path / "tree.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    r = await live.cli("apply", "-f", str(path))
    assert r.exit_code == 0, r.output
    r = await live.cli("get", "quotas", "-o", "wide")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].split() == [
        "NAME",
        "RESOURCE",
        "MIN",
        "MAX",
        "RUNTIME",
        "USED",
        "REQUEST",
        "NAMESPACE",
        "COVERS",
    ]
    first = [line.split()[0] for line in lines[1:] if not line.startswith(" " * 6)]
    assert first == ["ops", "research", "team-a", "team-b", "koordinator-default-quota"]
    # research has two resources: cpu on its first row, the GPU row is a continuation
    research = next(i for i, line in enumerate(lines) if line.startswith("research"))
    assert lines[research].split()[1] == "cpu"
    assert lines[research + 1].split()[0] == GPU
    assert next(line for line in lines if line.startswith("  team-a")).split()[:3] == ["team-a", GPU, "8"]
    r = await live.cli("get", "quotas", "-o", "yaml")
    assert {q["metadata"]["name"] for q in yaml.safe_load(r.output)} == {
        "ops",
        "research",
        "team-a",
        "team-b",
        "koordinator-default-quota",  # implicit
    }


async def test_apply_errors_name_the_file_and_exit_2(live: Live, tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(quota("org", gmin=16, gmax=32, is_parent=True)))
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump_all(
            [
                {"kind": "Queue", "metadata": {"name": "q"}},
                quota("child", gmin=20, gmax=32, parent="org"),  # more than org's min
            ]
        )
    )
    r = await live.cli("apply", "-f", str(good), "-f", str(bad))
    assert r.exit_code == 2
    assert f"{bad}: documents[1]: spec.min.{GPU}" in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert live.ctx.store.list("ElasticQuota") == [] and live.ctx.store.list("Queue") == []
    r = await live.cli("apply", "-f", str(tmp_path / "missing.yaml"))
    assert r.exit_code == 2 and "cannot read" in r.output
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: [\n")
    r = await live.cli("apply", "-f", str(broken))
    assert r.exit_code == 2 and "not valid YAML" in r.output
    r = await live.cli("apply", "-f", str(good), token="alice")
    assert r.exit_code == 2 and "admin" in r.output
    r = await live.cli("get", "quotas", token="nobody")
    assert r.exit_code == 2


async def test_unreachable_server_exits_1(live: Live) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = await live.cli("get", "queues", url=f"http://127.0.0.1:{port}")
    assert r.exit_code == 1
    assert "cannot reach" in r.output


async def test_describe_queue(live: Live) -> None:
    r = await live.cli("apply", "-f", str(REPO / "configs" / "quotas" / "demo-teams.yaml"))
    assert r.exit_code == 0, r.output
    r = await live.cli("describe", "queue", "team-a")
    assert r.exit_code == 0, r.output
    assert "Name:        team-a" in r.output and "Strategy:    BestEffortFIFO" in r.output
    assert "Waiting jobs:" in r.output
    assert "team-a/pytorch-simple" in r.output, "make_ctx's job (not yet started) waits in queue team-a"
    r = await live.cli("describe", "queue", "nope")
    assert r.exit_code == 2


async def test_queues_jobs_name_are_shown_as_implicit(live: Live) -> None:
    """No Queue object: the queues of make_ctx's jobs (team-a, team-b, not started) are implicit."""
    r = await live.cli("get", "queues")
    assert r.exit_code == 0, r.output
    lines = [line.split() for line in r.output.splitlines()]
    assert lines == [
        ["NAME", "WEIGHT", "STRATEGY", "PENDING", "RUNNING", "SHARE", "SOURCE"],
        ["team-a", "1", "BestEffortFIFO", "1", "0", "-", "implicit"],
        ["team-b", "1", "BestEffortFIFO", "1", "0", "-", "implicit"],
    ]
    r = await live.cli("describe", "queue", "team-a")
    assert r.exit_code == 0, r.output
    assert "Source:      implicit" in r.output and "Pending:     1" in r.output
    assert "Share:       -" in r.output
    assert "team-a/pytorch-simple" in r.output
    r = await live.cli("describe", "queue", "team-z")
    assert r.exit_code == 2 and "queue team-z not found" in r.output


async def test_the_default_quota_is_listed_once_quotas_are_in_use(live: Live) -> None:
    """The demo teams' quotas cover team-a and team-b; a job of namespace `research` is charged to
    `koordinator-default-quota`, which nobody stored: `get quotas` lists it, implicit, with that
    job's demand and what its Reservation uses, and `-` for the runtime only the scheduler knows."""
    r = await live.cli("get", "quotas")
    assert r.exit_code == 0 and "koordinator-default-quota" not in r.output, "no quota in use yet"
    r = await live.cli("apply", "-f", str(REPO / "configs" / "quotas" / "demo-teams.yaml"))
    assert r.exit_code == 0, r.output
    pg = podgroup("probe", role("Worker", 2, gpus=4), namespace="research")
    pg.status.phase = "Placed"
    live.ctx.store.create(pg)
    live.ctx.store.create(reservation("research", "probe", 0, "a100-0", [0, 1, 2, 3]))
    r = await live.cli("get", "quotas", "-o", "json")
    assert r.exit_code == 0, r.output
    items = {q["metadata"]["name"]: q for q in json.loads(r.output)}
    default = items["koordinator-default-quota"]
    assert default["metadata"]["annotations"] == {"gpuyard.io/implicit": "true"}
    assert not default["status"].get("runtime")
    assert Decimal(default["status"]["request"][GPU]) == 8
    assert Decimal(default["status"]["used"][GPU]) == 4
    r = await live.cli("get", "quotas")
    rows = [line.split() for line in r.output.splitlines()]
    at = next(i for i, row in enumerate(rows) if row[0] == "koordinator-default-quota")
    assert rows[at][1:5] == ["cpu", "-", "-", "-"]  # no min, no max, no runtime
    assert [GPU, "-", "-", "-", "4"] in rows[at + 1 : at + 4]  # cpu, memory, nvidia.com/gpu
