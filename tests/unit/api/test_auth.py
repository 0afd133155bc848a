"""Tokens and roles: 401 without/with an unknown token, 403 for what a role may not do."""

from __future__ import annotations

import pytest
from aiohttp import web

from gpuyard.platform.api.app import make_app
from gpuyard.platform.api.auth import allowed_namespaces, authorize, hash_token
from gpuyard.state.config import Settings
from gpuyard.state.context import Context

TOKENS = [
    {"sha256": hash_token("root-secret"), "user": "root", "role": "admin"},
    {"sha256": hash_token("alice-secret"), "user": "alice", "role": "user", "namespaces": ["team-a"]},
    {"sha256": hash_token("vic-secret"), "user": "vic", "role": "viewer", "namespaces": ["team-a"]},
]


async def probe(request: web.Request) -> web.Response:
    ns = request.match_info["ns"]
    who = authorize(request, request.match_info["action"], ns)  # type: ignore[arg-type]
    return web.json_response({"user": who.user, "visible": sorted(allowed_namespaces(request) or ["*"])})


@pytest.fixture
async def client(aiohttp_client):
    ctx = Context.for_tests(settings=Settings(server={"tokens": TOKENS}, backend={"data_dir": None}))
    app = make_app(ctx)
    app.router.add_get("/api/v1/probe/{action}/{ns}", probe)
    return await aiohttp_client(app)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_public_paths_need_no_token(client):
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/metrics")).status == 401  # tenant detail: see test_metrics_access.py


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Basic abc"}, bearer("wrong"), {"Authorization": "Bearer "}]
)
async def test_missing_or_unknown_token_is_401(client, headers):
    r = await client.get("/api/v1/nodes", headers=headers)
    assert r.status == 401
    assert (await r.json())["error"]["code"] == 401


@pytest.mark.parametrize(
    ("token", "action", "ns", "status"),
    [
        ("root-secret", "admin", "any", 200),
        ("alice-secret", "write", "team-a", 200),
        ("alice-secret", "write", "team-b", 403),
        ("alice-secret", "admin", "team-a", 403),
        ("vic-secret", "read", "team-a", 200),
        ("vic-secret", "write", "team-a", 403),
        ("vic-secret", "read", "team-b", 403),
    ],
)
async def test_roles(client, token, action, ns, status):
    r = await client.get(f"/api/v1/probe/{action}/{ns}", headers=bearer(token))
    assert r.status == status, await r.text()


async def test_visible_namespaces(client):
    r = await client.get("/api/v1/probe/read/team-a", headers=bearer("alice-secret"))
    assert (await r.json())["visible"] == ["team-a"]
    r = await client.get("/api/v1/probe/read/x", headers=bearer("root-secret"))
    assert (await r.json())["visible"] == ["*"]


def test_token_hash_must_be_hex_sha256():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="sha256"):
        Settings(server={"tokens": [{"sha256": "plaintext", "user": "x"}]})
