"""Store benchmark: 100,000 object writes with 5 watchers, in memory and with the SQLite journal.

Prints JSON: writes/s, p50/p99 watch delivery delay (from write to a watcher seeing it),
events each watcher saw, journal commits, and peak RSS. Targets: >= 50,000 writes/s in memory,
>= 10,000 writes/s journaled. Usage: `python bench/store_bench.py [--writes N] [--small]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuyard.apis.core import Pod
from gpuyard.state.journal import Journal
from gpuyard.state.kinds import register_kinds
from gpuyard.state.store import Store, tune_gc

WATCHERS = 5
BATCH = 500  # writes between yields to the event loop (a busy writer)


def _pods(count: int) -> list[Pod]:
    base = Pod.model_validate(
        {
            "metadata": {"name": "p", "namespace": "bench", "labels": {"app": "bench", "shard": "0"}},
            "spec": {
                "containers": [
                    {"name": "main", "image": "x", "resources": {"limits": {"cpu": "1", "nvidia.com/gpu": 1}}}
                ]
            },
        }
    )
    return [
        base.model_copy(update={"metadata": base.metadata.model_copy(update={"name": f"p{i}"})})
        for i in range(count)
    ]


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def run(writes: int, journal_dir: Path | None) -> dict[str, object]:
    store = Store(history=max(writes // 2, 50_000))
    register_kinds(store)
    journal = None
    if journal_dir is not None:
        journal = Journal(journal_dir / "bench.db")
        store.attach_journal(journal)
    pods = _pods(writes // 2)
    delays: list[float] = []
    counts = [0] * WATCHERS

    async def watcher(i: int) -> None:
        async for ev in store.watch("Pod", since=store.resource_version):
            counts[i] += 1
            if i == 0:
                delays.append(time.perf_counter() - ev.at)

    tasks = [asyncio.create_task(watcher(i)) for i in range(WATCHERS)]
    await asyncio.sleep(0)
    started = time.perf_counter()
    done = 0
    # half creates, half updates (status changes), as a controller-heavy workload writes
    for pod in pods:
        store.create(pod)
        done += 1
        if done % BATCH == 0:
            await asyncio.sleep(0)
    for pod in pods:
        current = store.get("Pod", "bench", pod.metadata.name)
        store.update(
            current.model_copy(update={"status": current.status.model_copy(update={"phase": "Running"})})
        )
        done += 1
        if done % BATCH == 0:
            await asyncio.sleep(0)
    if journal is not None:
        journal.flush()
    elapsed = time.perf_counter() - started
    await asyncio.sleep(0)
    store.close()
    await asyncio.gather(*tasks)
    result = {
        "writes": done,
        "seconds": round(elapsed, 3),
        "writes_per_s": round(done / elapsed),
        "watchers": WATCHERS,
        "events_per_watcher": counts,
        "watch_delay_p50_ms": round(_percentile(delays, 0.5) * 1000, 3),
        "watch_delay_p99_ms": round(_percentile(delays, 0.99) * 1000, 3),
    }
    if journal is not None:
        result["journal_commits"] = journal.commits
        journal.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=100_000)
    parser.add_argument("--small", action="store_true", help="10,000 writes (CI)")
    args = parser.parse_args()
    writes = 10_000 if args.small else args.writes
    tune_gc()  # as `gpuyard serve` runs
    memory = asyncio.run(run(writes, None))
    with tempfile.TemporaryDirectory() as tmp:
        journaled = asyncio.run(run(writes, Path(tmp)))
    out = {
        "benchmark": "store",
        "in_memory": memory,
        "journaled": journaled,
        "targets": {"in_memory_writes_per_s": 50_000, "journaled_writes_per_s": 10_000},
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
