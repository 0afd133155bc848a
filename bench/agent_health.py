"""Node agent benchmark: discovery time per fake shape, XID-to-published latency, Allocate round trip.

Prints JSON: per fake NVML shape (DGX-1, DGX A100, HGX H100) the mean time of one full discovery
(NVML reads, structure, partitions); for two health intervals, the median and worst time from an
injected XID to the NodeTopology with that GPU Unhealthy handed to the sink (the requirement: within
one interval); and the mean gRPC round trip of the kubelet's Allocate against the device plugin.
Usage: `python bench/agent_health.py [--small]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuyard.apis.devices import NodeTopology
from gpuyard.devices.agent.allocating import RESOURCE_GPU, PendingPod
from gpuyard.devices.agent.deviceplugin import DevicePlugin
from gpuyard.devices.agent.fakekubelet import FakeKubelet
from gpuyard.devices.agent.fakenvml import FAKE_SHAPES, FakeNVML
from gpuyard.devices.agent.inventory import Inventory
from gpuyard.devices.agent.running import Agent, AgentTimings, PrintSink

NO_SYS = Path("no-such-sysfs")


def discovery_ms(shape: str, repeats: int) -> float:
    fake = FakeNVML.shaped(shape, node_name="n")
    fake.nvmlInit()
    start = time.perf_counter()
    for _ in range(repeats):
        Inventory(node="n", nvml=fake, sysfs_root=NO_SYS).read()
    return (time.perf_counter() - start) / repeats * 1e3


class _SignallingSink(PrintSink):
    """Sets `changed` on every write, so the latency is measured without polling."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()

    async def put(self, topology: NodeTopology) -> None:
        await super().put(topology)
        self.changed.set()


async def xid_latency_ms(interval: float, trials: int) -> list[float]:
    out = []
    for trial in range(trials):
        fake = FakeNVML.shaped("dgx-a100", node_name="n")
        sink = _SignallingSink()
        agent = Agent(
            Inventory(node="n", nvml=fake, sysfs_root=NO_SYS),
            sink,
            timings=AgentTimings(health_interval_s=interval),
        )
        task = asyncio.create_task(agent.run())
        await sink.changed.wait()
        sink.changed.clear()
        await asyncio.sleep(interval * 0.4)  # inject mid-interval
        start = time.perf_counter()
        fake.inject_xid(trial % 8, 79)
        await sink.changed.wait()
        out.append((time.perf_counter() - start) * 1e3)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
    return out


class _Lookup:
    def __init__(self, pod: PendingPod) -> None:
        self.pod = pod

    async def pending_pods(self, node: str) -> list[PendingPod]:
        return [self.pod]


async def allocate_ms(calls: int) -> float:
    topology = FakeNVML.shaped("dgx-a100", node_name="n").topology
    uuids = [g.uuid for g in topology.spec.gpus]
    pod = PendingPod("default", "p", tuple(uuids[4:8]), (4, 5, 6, 7), ())
    folder = Path(tempfile.mkdtemp(prefix="dp"))
    kubelet = FakeKubelet(folder)
    plugin = DevicePlugin(
        node="n", resource=RESOURCE_GPU, lookup=_Lookup(pod), plugin_dir=folder, poll_s=0.02
    )
    plugin.update(topology)
    await kubelet.start()
    watch = asyncio.create_task(plugin.watch())
    try:
        for _ in range(500):  # registered and streaming within 5 s
            if kubelet.devices.get(RESOURCE_GPU):
                break
            await asyncio.sleep(0.01)
        start = time.perf_counter()
        for _ in range(calls):
            await kubelet.allocate(RESOURCE_GPU, uuids[4:8])
        return (time.perf_counter() - start) / calls * 1e3
    finally:
        watch.cancel()
        try:
            await watch
        except asyncio.CancelledError:
            pass
        await kubelet.stop()
        shutil.rmtree(folder, ignore_errors=True)


async def main(small: bool) -> dict[str, object]:
    repeats, trials, calls = (5, 3, 20) if small else (50, 10, 200)
    figures: dict[str, object] = {
        "discovery_ms": {shape: round(discovery_ms(shape, repeats), 3) for shape in FAKE_SHAPES}
    }
    for interval in (0.1, 1.0):
        lat = await xid_latency_ms(interval, trials)
        figures[f"xid_to_published_ms_interval_{interval}s"] = {
            "median": round(statistics.median(lat), 2),
            "max": round(max(lat), 2),
            "within_one_interval": max(lat) < interval * 1e3,
        }
    figures["allocate_round_trip_ms"] = round(await allocate_ms(calls), 3)
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="CI-sized run")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    print(json.dumps(asyncio.run(main(args.small)), indent=2))
