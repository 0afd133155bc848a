"""Dashboard routes, reservations, node topologies, the summary, per-node use and /metrics series."""

from __future__ import annotations

import re
from typing import Any

import pytest
from aiohttp import web

from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.scheduling import LABEL_JOB_NAME, Reservation, ReservationSpec
from gpuyard.devices.presets import get_preset
from gpuyard.platform.api import app as app_module
from gpuyard.platform.api import dashboard
from gpuyard.platform.api.auth import hash_token
from gpuyard.platform.api.middleware_metrics import make_metrics_middleware
from gpuyard.platform.cluster_metrics import cluster_usage, register_cluster_metrics
from gpuyard.state.config import Settings
from gpuyard.state.context import Context
from tests.builders import make_node
from tests.unit.controllers.fakes import load_job

TOKENS = [
    {"sha256": hash_token("root"), "user": "root", "role": "admin"},
    {"sha256": hash_token("alice"), "user": "alice", "role": "user", "namespaces": ["team-a"]},
    {"sha256": hash_token("vic"), "user": "vic", "role": "viewer", "namespaces": ["team-a"]},
]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def reservation(ns: str, job: str, index: int, node: str, gpus: list[int], **extra: Any) -> Reservation:
    return Reservation(
        metadata=ObjectMeta(name=f"{job}-worker-{index}", namespace=ns, labels={LABEL_JOB_NAME: job}),
        spec=ReservationSpec(
            pod_group=job,
            role="Worker",
            index=index,
            node=node,
            gpus=gpus,
            gpu_milli=1000 if gpus else 0,
            requests={"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": str(len(gpus))},
            **extra,
        ),
    )


def make_ctx(*, tokens: bool = True) -> Context:
    settings = Settings(server={"tokens": TOKENS if tokens else []}, backend={"data_dir": None})
    ctx = Context.for_tests(settings=settings)
    store = ctx.store
    store.create(make_node("dgx-0", gpus=8, model="v100", cpu="80"))
    store.create(make_node("dgx-1", gpus=8, model="v100"))
    store.create(make_node("a100-0", gpus=8, model="a100"))
    store.create(make_node("cpu-0", gpus=0))
    store.create(get_preset("dgx1-v100", node_name="dgx-0"))
    # team-a/big holds 4+4 GPUs on dgx-0, team-b/small holds 1 GPU on dgx-1 and a NIC
    store.create(reservation("team-a", "big", 0, "dgx-0", [0, 1, 2, 3]))
    store.create(reservation("team-a", "big", 1, "dgx-0", [4, 5, 6, 7]))
    store.create(reservation("team-b", "small", 0, "dgx-1", [0, 1, 2, 3, 4, 5, 6], nics=["mlx5_0"]))
    store.create(reservation("team-b", "cpu", 0, "cpu-0", []))
    store.create(load_job("pytorch-simple", namespace="team-a"))
    store.create(load_job("tf-dist-mnist", namespace="team-b"))
    return ctx


def build_app(ctx: Context) -> web.Application:
    """The app as `make_app` builds it, plus this module's routes until the lead wires them."""
    app = app_module.make_app(ctx)
    if "gpuyard.platform.api.dashboard" not in app_module.ROUTE_MODULES:
        dashboard.setup(app)
    return app


@pytest.fixture
async def client(aiohttp_client):
    return await aiohttp_client(build_app(make_ctx()))


async def test_index_and_static_files_are_public(client) -> None:
    r = await client.get("/")
    assert r.status == 200
    html = await r.text()
    assert '<script type="module" src="/static/app.js">' in html
    for name in (
        "app.js",
        "api.js",
        "dom.js",
        "overview.js",
        "job.js",
        "logs.js",
        "topology.js",
        "style.css",
    ):
        r = await client.get(f"/static/{name}")
        assert r.status == 200, name
    r = await client.get("/static/app.js")
    assert "javascript" in r.headers["Content-Type"]
    assert (await client.get("/static/nope.js")).status == 404
    assert (await client.get("/static/%2E%2E/__init__.py")).status != 200  # no way out of static/


async def test_favicon_is_an_icon_and_the_page_links_it(client) -> None:
    html = await (await client.get("/")).text()
    links = re.findall(r'<link rel="icon" href="([^"]+)" type="([^"]+)">', html)
    assert links == [("/static/favicon.svg", "image/svg+xml")]
    for path in ("/favicon.ico", links[0][0]):  # what browsers ask for unprompted, and the link
        r = await client.get(path)  # no token: public, like the page itself
        assert r.status == 200, path
        assert r.headers["Content-Type"] == "image/svg+xml", path
        body = await r.text()
        assert body.lstrip().startswith("<svg") and body.rstrip().endswith("</svg>"), path
    assert (await client.head("/favicon.ico")).status == 200


async def test_no_cdn_in_static_files() -> None:
    for path in dashboard.STATIC_DIR.iterdir():
        # an SVG's namespace name is an identifier, never fetched
        text = path.read_text().replace('xmlns="http://www.w3.org/2000/svg"', "")
        assert "http://" not in text and "https://" not in text, path.name


async def test_reservations_list_filters_and_pages(client) -> None:
    r = await client.get("/api/v1/reservations", headers=bearer("root"))
    body = await r.json()
    assert r.status == 200 and len(body["items"]) == 4
    r = await client.get("/api/v1/reservations?node=dgx-0", headers=bearer("root"))
    assert [i["metadata"]["name"] for i in (await r.json())["items"]] == ["big-worker-0", "big-worker-1"]
    r = await client.get("/api/v1/reservations?jobName=small", headers=bearer("root"))
    (item,) = (await r.json())["items"]
    assert item["spec"]["gpus"] == [0, 1, 2, 3, 4, 5, 6] and item["spec"]["nics"] == ["mlx5_0"]
    r = await client.get("/api/v1/reservations?limit=3", headers=bearer("root"))
    first = await r.json()
    assert len(first["items"]) == 3 and first["metadata"]["continue"]
    r = await client.get(
        f"/api/v1/reservations?limit=3&continue={first['metadata']['continue']}", headers=bearer("root")
    )
    assert len((await r.json())["items"]) == 1
    r = await client.get("/api/v1/reservations?continue=garbage!", headers=bearer("root"))
    assert r.status == 400 and (await r.json())["error"]["details"][0]["field"] == "continue"
    r = await client.get("/api/v1/reservations?limit=0", headers=bearer("root"))
    assert r.status == 422


async def test_reservations_by_role(client) -> None:
    assert (await client.get("/api/v1/reservations")).status == 401
    assert (await client.get("/api/v1/reservations", headers=bearer("nope"))).status == 401
    for token in ("alice", "vic"):  # a user and a viewer see their namespace only
        r = await client.get("/api/v1/reservations", headers=bearer(token))
        assert r.status == 200
        assert {i["metadata"]["namespace"] for i in (await r.json())["items"]} == {"team-a"}
        r = await client.get("/api/v1/reservations?namespace=team-b", headers=bearer(token))
        assert r.status == 403


async def test_node_topology(client) -> None:
    r = await client.get("/api/v1/nodetopologies/dgx-0", headers=bearer("vic"))
    body = await r.json()
    assert r.status == 200 and body["kind"] == "NodeTopology" and len(body["spec"]["gpus"]) == 8
    assert body["spec"]["gpus"][0]["nvlinkPeers"]
    r = await client.get("/api/v1/nodetopologies/cpu-0", headers=bearer("vic"))
    assert r.status == 404 and "cpu-0" in (await r.json())["error"]["message"]
    assert (await client.get("/api/v1/nodetopologies/dgx-0")).status == 401


async def test_viewer_cannot_write(client) -> None:
    r = await client.post(
        "/api/v1/jobs", data=b"{}", headers={**bearer("vic"), "Content-Type": "application/json"}
    )
    assert r.status in (403, 422)  # the body is checked first; a valid one is refused below
    job = (load_job("pytorch-simple", namespace="team-a")).to_dict()
    job["metadata"]["name"] = "viewer-try"
    import json

    r = await client.post(
        "/api/v1/jobs", data=json.dumps(job), headers={**bearer("vic"), "Content-Type": "application/json"}
    )
    assert r.status == 403
    r = await client.post(
        "/api/v1/jobs", data=json.dumps(job), headers={**bearer("alice"), "Content-Type": "application/json"}
    )
    assert r.status == 201


async def test_summary(client) -> None:
    r = await client.get("/api/v1/summary", headers=bearer("root"))
    s = await r.json()
    assert r.status == 200
    assert s["gpusByModel"] == {"a100": 8, "v100": 16}
    assert s["gpus"]["v100"] == {
        "total": 16,
        "allocated": 15,
        "free": 1,
        "unhealthy": 0,
        "fragmentation": 1.0,
    }
    assert s["gpus"]["a100"]["free"] == 8 and s["gpus"]["a100"]["fragmentation"] == 0.0
    assert (s["gpusTotal"], s["gpusAllocated"], s["gpusFree"]) == (24, 15, 9)
    # the most common multi-GPU request is 4 (two pods) over 7 (one pod): the lone free v100 is
    # stranded, the 8 free a100s are not: 1 of 9 free GPUs
    assert s["fragmentation"]["referenceGpus"] == 4
    assert s["fragmentation"]["ratio"] == pytest.approx(1 / 9, abs=1e-4)
    assert sum(s["jobsByPhase"].values()) == 2
    assert sum(s["queueDepths"].values()) == 2
    # a tenant counts only the jobs it may see
    r = await client.get("/api/v1/summary", headers=bearer("vic"))
    assert sum((await r.json())["jobsByPhase"].values()) == 1


async def test_node_usage_hides_other_tenants(client) -> None:
    r = await client.get("/api/v1/usage/nodes", headers=bearer("root"))
    rows = {n["name"]: n for n in (await r.json())["items"]}
    assert rows["dgx-0"]["holders"]["0"] == ["team-a/big"] and rows["dgx-0"]["gpusFree"] == 0
    assert rows["dgx-0"]["cpuRequested"] == 8 and rows["dgx-0"]["cpu"] == 80
    assert rows["dgx-1"]["gpusAllocated"] == 7 and rows["dgx-1"]["gpusFree"] == 1
    assert rows["cpu-0"]["gpus"] == 0 and rows["cpu-0"]["cpuRequested"] == 4
    r = await client.get("/api/v1/usage/nodes", headers=bearer("alice"))
    rows = {n["name"]: n for n in (await r.json())["items"]}
    assert rows["dgx-0"]["holders"]["0"] == ["team-a/big"]
    assert rows["dgx-1"]["holders"]["0"] == ["other"]
    r = await client.get(
        "/api/v1/usage/nodes?labelSelector=gpuyard.io/gpu-model=a100", headers=bearer("root")
    )
    assert [n["name"] for n in (await r.json())["items"]] == ["a100-0"]
    r = await client.get("/api/v1/usage/nodes?labelSelector=a%20in", headers=bearer("root"))
    assert r.status == 400
    r = await client.get("/api/v1/nodes?labelSelector=a%20in", headers=bearer("root"))
    assert r.status == 400 and (await r.json())["error"]["details"][0]["field"] == "labelSelector"


async def test_a_bug_behind_a_valid_selector_is_not_reported_as_bad_input(client, monkeypatch) -> None:
    """Only a selector that does not parse is the caller's fault (400); a ValueError from deeper
    down is a server error (500), never "bad input"."""

    def broken(*args: object, **kwargs: object) -> list[object]:
        raise ValueError("a bug in the store")

    monkeypatch.setattr(client.app[app_module.CTX].store, "list", broken)
    r = await client.get("/api/v1/nodes?labelSelector=gpuyard.io/gpu-model=a100", headers=bearer("root"))
    assert r.status == 500


def test_fragmentation_counts_unhealthy_and_not_ready() -> None:
    ctx = make_ctx()
    node = ctx.store.get("Node", "", "a100-0").clone()  # type: ignore[union-attr]
    node.metadata.annotations["gpuyard.io/unhealthy-gpus"] = "0,1,2,3,4"
    ctx.store.update(node)
    usage = cluster_usage(ctx.store)
    a100 = next(n for n in usage.nodes if n.name == "a100-0")
    assert a100.gpus_free == 3 and a100.gpus_unhealthy == 5
    assert a100.to_dict()["unhealthyGpus"] == [0, 1, 2, 3, 4]  # the node grid marks these cells
    # 3 free on a100-0 (< 4) and 1 on dgx-1: everything free is stranded
    assert usage.fragmentation() == 1.0
    empty = Context.for_tests()
    assert cluster_usage(empty.store).fragmentation() == 0.0
    assert cluster_usage(empty.store).reference_request == 2


async def thing(request: web.Request) -> web.Response:
    return web.json_response({})


async def test_metrics_collectors_and_http_histogram(aiohttp_client) -> None:
    ctx = make_ctx(tokens=False)
    register_cluster_metrics(ctx.registry, ctx.store)
    app = web.Application(middlewares=[make_metrics_middleware(ctx.registry)])
    app[app_module.CTX] = ctx
    app.router.add_get("/metrics", app_module.metrics)
    app.router.add_get("/api/v1/things/{name}", thing)
    client = await aiohttp_client(app)
    assert (await client.get("/api/v1/things/a")).status == 200
    assert (await client.get("/api/v1/things/b")).status == 200
    assert (await client.get("/nowhere")).status == 404
    text = await (await client.get("/metrics")).text()
    assert 'gpuyard_gpus_total{model="v100"} 16.0' in text
    assert 'gpuyard_gpus_allocated{model="v100"} 15.0' in text
    assert 'gpuyard_gpu_fragmentation_ratio{model=""}' in text
    assert (
        'gpuyard_http_request_duration_seconds_count{code="200",method="GET",route="/api/v1/things/{name}"} 2.0'
        in text
    )
    assert 'route="unmatched"' in text
