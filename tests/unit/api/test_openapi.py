"""The served OpenAPI document matches the routes: every route documented, nothing extra."""

from __future__ import annotations

from gpuyard.platform.api.app import make_app
from gpuyard.platform.api.openapi import _path_of
from gpuyard.state.context import Context


async def test_document_matches_the_routes(aiohttp_client):
    app = make_app(Context.for_tests())
    routed = {
        (_path_of(r.resource), r.method.lower())
        for r in app.router.routes()
        if r.method != "HEAD"
        and _path_of(r.resource).startswith("/api/")
        and not _path_of(r.resource).endswith("openapi.json")
    }
    undocumented = sorted(
        f"{m.upper()} {p}" for p, m in routed if not hasattr(_handler(app, p, m), "__openapi__")
    )
    assert undocumented == [], f"routes without @operation: {undocumented}"
    client = await aiohttp_client(app)
    doc = await (await client.get("/api/v1/openapi.json")).json()
    assert doc["openapi"].startswith("3.")
    documented = {(p, m) for p, ops in doc["paths"].items() for m in ops}
    assert documented == routed
    for path, ops in doc["paths"].items():
        for op in ops.values():
            names = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert names == set(_vars(path)), path
            assert "401" in op["responses"] and ("200" in op["responses"] or "201" in op["responses"])


def _vars(path: str) -> list[str]:
    import re

    return re.findall(r"\{(\w+)\}", path)


def _handler(app, path, method):
    for r in app.router.routes():
        if _path_of(r.resource) == path and r.method.lower() == method:
            return r.handler
    raise AssertionError(path)
