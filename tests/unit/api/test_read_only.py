"""`server.read_only`: the HTTP API serves reads and refuses every write with 403 naming the
setting (after authentication: no token is still 401); nothing is stored."""

from __future__ import annotations

from typing import Any

import yaml

from gpuyard.platform.api import app as app_module
from gpuyard.platform.api.auth import hash_token
from gpuyard.state.config import Settings
from gpuyard.state.context import Context


async def test_a_read_only_api_refuses_writes_and_serves_reads(aiohttp_client: Any) -> None:
    settings = Settings(
        backend={"data_dir": None, "clock": "virtual"},
        server={
            "read_only": True,
            "tokens": [{"sha256": hash_token("admin"), "user": "ops", "role": "admin"}],
        },
    )
    ctx = Context.for_tests(settings=settings)
    client = await aiohttp_client(app_module.make_app(ctx))
    admin = {"Authorization": "Bearer admin"}
    queue = yaml.safe_dump({"kind": "Queue", "spec": {"weight": 1}})
    r = await client.put("/api/v1/queues/team", data=queue)
    assert r.status == 401  # who asks is still checked first
    for method, path in (
        ("PUT", "/api/v1/queues/team"),
        ("POST", "/api/v1/apply"),
        ("POST", "/api/v1/jobs"),
        ("DELETE", "/api/v1/namespaces/default/jobs/x"),
        ("PATCH", "/api/v1/namespaces/default/jobs/x"),
    ):
        r = await client.request(method, path, data=queue, headers=admin)
        body = await r.json()
        assert r.status == 403, (method, path, body)
        assert "server.read_only" in body["error"]["message"]
    assert ctx.store.get("Queue", "", "team") is None
    r = await client.get("/api/v1/queues", headers=admin)
    assert r.status == 200
