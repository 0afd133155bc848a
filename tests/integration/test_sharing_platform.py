"""GPU sharing end to end: a Platform on the demo cluster and the virtual clock.

Two jobs ask for parts of T4 GPUs (`nvidia.t4: 1` + `gpuyard.io/gpu-milli`, and Koordinator's
`koordinator.sh/gpu-core` + `koordinator.sh/gpu-memory-ratio`); a 4-T4 job comes after them. Every
pod runs with its share in its env, no T4 is over-committed in milli or memory, and no T4 serves
a whole-GPU pod and shares at once.

The jobs go into the store the way the API stores them (`parse_job` + `apply_defaults`): the
API's submit-time capacity check (`validate_gang_request`, in `gpuyard.apis`) does not know the
share resources yet and answers 422 "no node offers gpuyard.io/gpu-milli".
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

from gpuyard.apis.jobs import apply_defaults, load_documents, parse_job
from gpuyard.platform.runtime import Platform
from gpuyard.state.clock import VirtualClock
from gpuyard.state.config import Settings

T4_MIB = 15360  # the t4 preset's memory

JOB = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: NAME, namespace: default}
spec:
  pytorchReplicaSpecs:
    Worker:
      replicas: REPLICAS
      template:
        spec:
          containers:
            - {name: pytorch, image: serve, resources: {limits: {LIMITS}}}
"""


def job(name: str, replicas: int, limits: str) -> str:
    return JOB.replace("NAME", name).replace("REPLICAS", str(replicas)).replace("LIMITS", limits)


async def test_shares_run_with_env_and_never_overcommit() -> None:
    clock = VirtualClock()
    platform = Platform(
        Settings(
            server={"host": "127.0.0.1", "port": 0},
            backend={"cluster": "configs/clusters/demo.yaml", "data_dir": None, "clock": "virtual"},
        ),
        clock=clock,
        serve_http=True,
        drive_clock=False,
    )
    task = asyncio.create_task(platform.run())
    try:
        await asyncio.wait_for(platform.backend.synced.wait(), 5)
        await asyncio.wait_for(platform.serving.wait(), 5)
        store = platform.store
        assert await clock.run_until(
            lambda: store.get("ResourceClass", "", "nvidia.t4") is not None, timeout=60
        )
        for body in (
            job("milli", 3, '"nvidia.t4": 1, "gpuyard.io/gpu-milli": 300'),
            job(
                "koord",
                2,
                '"nvidia.t4": 1, "koordinator.sh/gpu-core": 40, "koordinator.sh/gpu-memory-ratio": 25',
            ),
        ):
            (doc,) = load_documents(body)
            parsed = parse_job(doc)
            apply_defaults(parsed)
            store.create(parsed)

        def pods_running(prefixes: tuple[str, ...], count: int) -> bool:
            pods = [p for p in store.list("Pod", namespace="default") if p.metadata.name.startswith(prefixes)]
            return len(pods) == count and all(p.status.phase == "Running" for p in pods)

        assert await clock.run_until(lambda: pods_running(("milli-", "koord-"), 5), timeout=300)
        pods = {p.metadata.name: p for p in store.list("Pod", namespace="default")}
        for name, milli, mem in [
            ("milli-worker-0", 300, T4_MIB * 3 // 10),
            ("koord-worker-1", 400, T4_MIB // 4),
        ]:
            env = {e.name: e.value for e in pods[name].spec.containers[0].env}
            assert env["GPUYARD_GPU_MILLI"] == str(milli)
            assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(milli // 10)
            assert env["GPUYARD_GPU_MEMORY_LIMIT_MIB"] == str(mem)
            assert env["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")
            assert "," not in env["NVIDIA_VISIBLE_DEVICES"]

        # The T4 node has 4 GPUs and shares hold some of them: a 4-T4 job submitted now waits.
        (doc,) = load_documents(job("whole", 1, '"nvidia.t4": 4'))
        whole = parse_job(doc)
        apply_defaults(whole)
        store.create(whole)
        await clock.run_until(lambda: False, timeout=30)
        reservations = store.list("Reservation", namespace="default")
        milli_on: dict[tuple[str, int], int] = defaultdict(int)
        mem_on: dict[tuple[str, int], int] = defaultdict(int)
        whole_on: set[tuple[str, int]] = set()
        for r in reservations:
            assert r.spec.node.startswith("t4"), r.spec.node
            for g in r.spec.gpus:
                if r.spec.gpu_milli < 1000:
                    milli_on[(r.spec.node, g)] += r.spec.gpu_milli
                    mem_on[(r.spec.node, g)] += r.spec.gpu_memory_mib
                else:
                    whole_on.add((r.spec.node, g))
        assert sum(milli_on.values()) == 3 * 300 + 2 * 400
        assert all(v <= 1000 for v in milli_on.values())
        assert all(v <= T4_MIB for v in mem_on.values())
        assert not whole_on & set(milli_on)
        assert not any(r.spec.pod_group == "whole" for r in reservations)
    finally:
        platform.stop()
        await asyncio.wait_for(task, 10)
