"""Per-token rate limit (server.rate_limit): a token bucket per token, 429 with Retry-After."""

from __future__ import annotations

import pytest

from gpuyard.platform.api.app import make_app
from gpuyard.platform.api.auth import hash_token
from gpuyard.platform.api.ratelimit import MAX_BUCKETS, RateLimiter
from gpuyard.state.config import Settings
from gpuyard.state.context import Context

TOKENS = [
    {"sha256": hash_token("alice"), "user": "alice", "role": "user", "namespaces": ["team-a"]},
    {"sha256": hash_token("bob"), "user": "bob", "role": "user", "namespaces": ["team-b"]},
]


def make(aiohttp_client, *, tokens=TOKENS, exempt_loopback: bool = True):
    limit = {"requests_per_second": 0.5, "burst": 2, "exempt_loopback": exempt_loopback}
    settings = Settings(server={"tokens": tokens, "rate_limit": limit}, backend={"data_dir": None})
    return aiohttp_client(make_app(Context.for_tests(settings=settings)))


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_a_token_beyond_its_burst_gets_429_with_retry_after(aiohttp_client):
    client = await make(aiohttp_client)
    assert [(await client.get("/api/v1/jobs", headers=bearer("alice"))).status for _ in range(2)] == [
        200,
        200,
    ]
    r = await client.get("/api/v1/jobs", headers=bearer("alice"))
    assert r.status == 429
    assert r.headers["Retry-After"] == "2"  # one request refills in 1 / 0.5 s
    body = await r.json()
    assert body["error"]["code"] == 429 and "server.rate_limit" == body["error"]["details"][0]["field"]
    assert (await client.get("/api/v1/jobs", headers=bearer("bob"))).status == 200  # its own bucket
    assert (await client.get("/healthz", headers=bearer("alice"))).status == 200  # probes are exempt


async def test_anonymous_loopback_is_exempt_unless_configured(aiohttp_client):
    client = await make(aiohttp_client, tokens=[])
    assert {(await client.get("/api/v1/jobs")).status for _ in range(5)} == {200}
    client = await make(aiohttp_client, tokens=[], exempt_loopback=False)
    statuses = [(await client.get("/api/v1/jobs")).status for _ in range(3)]
    assert statuses == [200, 200, 429]  # limited by IP


def test_the_bucket_refills_at_the_configured_rate():
    now = [0.0]
    limiter = RateLimiter(rate=2.0, burst=3, now=lambda: now[0])
    assert [limiter.take("k") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("k") == pytest.approx(0.5)
    now[0] = 0.5
    assert limiter.take("k") == 0.0
    now[0] = 100.0
    assert [limiter.take("k") for _ in range(3)] == [0.0, 0.0, 0.0]  # never more than the burst
    assert limiter.take("k") > 0


def test_buckets_stay_bounded():
    now = [0.0]
    limiter = RateLimiter(rate=1.0, burst=1, now=lambda: now[0])
    for i in range(MAX_BUCKETS + 10):
        limiter.take(f"k{i}")
    assert len(limiter) <= MAX_BUCKETS
