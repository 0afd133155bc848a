"""Test API server benchmark: what `gpuyard fake-apiserver` sustains over HTTP, as clients see it.

Creates N pods through the REST API (32 requests in flight), lists them all and by label, then patches
pods while 3 watch streams follow, and prints JSON: creates/s, list latencies, p50/p99 delay from a
patch's request to a watcher reading its event, and peak RSS. It bounds how large a fake cluster the
Kubernetes backend's tests and `gpuyard fake-nodes` can drive through it.
Usage: `python bench/fake_apiserver.py [--pods N] [--small]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuyard.testing.apiserver import FakeApiServer

IN_FLIGHT = 32
WATCHERS = 3
MERGE = {"Content-Type": "application/merge-patch+json"}


def _pod(i: int) -> dict[str, object]:
    return {
        "metadata": {"name": f"p{i}", "labels": {"app": "bench", "shard": str(i % 10)}},
        "spec": {
            "containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}]
        },
    }


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)


async def run(pods: int, patches: int) -> dict[str, object]:
    async with FakeApiServer() as server, aiohttp.ClientSession() as http:
        base = f"{server.url}/api/v1/namespaces/default/pods"
        gate = asyncio.Semaphore(IN_FLIGHT)

        async def create(i: int) -> None:
            async with gate, http.post(base, json=_pod(i)) as resp:
                assert resp.status == 201, await resp.text()

        start = time.perf_counter()
        await asyncio.gather(*(create(i) for i in range(pods)))
        create_s = time.perf_counter() - start

        start = time.perf_counter()
        async with http.get(base) as resp:
            listed = len((await resp.json())["items"])
        list_ms = (time.perf_counter() - start) * 1000
        start = time.perf_counter()
        async with http.get(f"{base}?labelSelector=shard%3D3") as resp:
            selected = len((await resp.json())["items"])
        select_ms = (time.perf_counter() - start) * 1000

        rv = server.resource_version
        streams = [await http.get(f"{base}?watch=1&resourceVersion={rv}") for _ in range(WATCHERS)]
        delays: list[float] = []
        try:
            for i in range(patches):
                sent = time.perf_counter()
                patch = json.dumps({"metadata": {"labels": {"step": str(i)}}})
                async with http.patch(f"{base}/p{i % pods}", data=patch, headers=MERGE) as resp:
                    assert resp.status == 200
                for stream in streams:
                    await stream.content.readline()
                    delays.append(time.perf_counter() - sent)
        finally:
            for stream in streams:
                stream.close()
        return {
            "benchmark": "fake_apiserver",
            "pods": pods,
            "creates_per_s": round(pods / create_s),
            "list_all_ms": round(list_ms, 1),
            "listed": listed,
            "list_by_label_ms": round(select_ms, 1),
            "selected": selected,
            "watchers": WATCHERS,
            "patches": patches,
            "patch_to_event_ms_p50": _pct(delays, 0.5),
            "patch_to_event_ms_p99": _pct(delays, 0.99),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--small", action="store_true", help="CI size: 300 pods, 100 patches")
    args = parser.parse_args()
    pods, patches = (300, 100) if args.small else (args.pods, 1000)
    print(json.dumps(asyncio.run(run(pods, patches))))


if __name__ == "__main__":
    main()
