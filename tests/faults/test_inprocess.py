"""The fault suite, in process: node loss, GPU failure, crashes, backend write failures, a crashing
reconciler, clock jumps and work-queue back-pressure, on the whole platform (fake cluster,
operator, scheduler) and a virtual clock.

Every test runs with the harness's invariant checks on (after each scheduling cycle and each
time the clock settles: no GPU, CPU, memory or port double-allocated, every gang at its minimum,
owners alive, quota within bounds) and asserts that no job is lost and that each job ends in the
phase its restart policy says.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from gpuyard.apis.jobkinds import KIND_INFO
from gpuyard.apis.scheduling import Reservation
from gpuyard.controllers.reconciling import JobReconciler
from gpuyard.scheduler.core import SchedulerState
from gpuyard.state.clock import VirtualClock
from gpuyard.state.workqueues import WorkQueue
from gpuyard.testing import Cluster
from tests.faults.jobs import gang

pytestmark = pytest.mark.faults

NODES = [("dgx1-v100", 4)]
TERMINAL = ("Succeeded", "Failed")


def _all_jobs(c: Cluster) -> list[str]:
    return sorted(
        f"{j.metadata.namespace}/{j.metadata.name}" for kind in KIND_INFO for j in c.store.list(kind)
    )


def _assert_none_lost(c: Cluster, submitted: Sequence[str]) -> None:
    assert sorted(submitted) == _all_jobs(c), "a job was lost"


def _gpus_held(c: Cluster) -> dict[tuple[str, int], list[str]]:
    held: dict[tuple[str, int], list[str]] = {}
    for res in c.store.list_of(Reservation):
        for g in res.spec.gpus:
            held.setdefault((res.spec.node, g), []).append(res.metadata.name)
    return held


def _no_gpu_twice(c: Cluster) -> None:
    twice = {k: v for k, v in _gpus_held(c).items() if len(v) > 1}
    assert not twice, f"GPUs held twice: {twice}"


async def _settle_all(c: Cluster, names: Sequence[str], *, timeout: float = 7200) -> dict[str, str]:
    await c.until(lambda: all(c.phase(n) in TERMINAL for n in names), timeout=timeout)
    return {n: c.phase(n) for n in names}


async def test_node_lost_while_a_gang_starts_is_placed_again_and_succeeds() -> None:
    async with Cluster.start(nodes=NODES, kubelet={"startDelay": 30}) as c:
        job = await c.submit(gang("g", workers=3, gpus=8, duration="600"))
        await c.advance(1)  # placed, pods created, none running yet (30 s start delay)
        nodes = sorted({r.spec.node for r in c.store.list_of(Reservation)})
        assert len(nodes) == 4  # the whole gang is placed at once
        assert c.pods(job) and all(p.status.phase == "Pending" for p in c.pods(job))
        lost = c.pods(job)[0].spec.node_name or ""
        await c.inject("node-fail", lost)
        _no_gpu_twice(c)
        await c.advance(120)  # the gang needs all 4 nodes: the lost pod waits, Restarting
        assert c.phase(job) == "Restarting"
        await c.inject("node-recover", lost)
        phases = await _settle_all(c, ["default/g"])
        assert phases == {"default/g": "Succeeded"}
        _assert_none_lost(c, ["default/g"])


async def test_a_gpu_failing_mid_run_restarts_the_pod_elsewhere_under_exit_code_policy() -> None:
    async with Cluster.start(nodes=NODES) as c:
        job = await c.submit(gang("g", workers=1, gpus=4, duration="600"))
        await c.run_until(job, "Running")
        await c.advance(100)
        victim = c.pods(job)[0]
        gpus = c.placement(job).pods[0].gpus
        failed = await c.inject("gpu-fail", victim.spec.node_name or "", gpu=gpus[0])
        assert failed >= 1
        await c.advance(5)
        for res in c.store.list_of(Reservation):  # nothing holds the broken GPU any more
            if res.spec.node == victim.spec.node_name:
                assert gpus[0] not in res.spec.gpus
        assert await _settle_all(c, ["default/g"]) == {"default/g": "Succeeded"}
        _assert_none_lost(c, ["default/g"])


@pytest.mark.parametrize(
    ("exit_code", "policy", "phase"),
    [
        (137, "ExitCode", "Succeeded"),  # retryable (SIGKILL): restarted, then runs to its end
        (143, "ExitCode", "Succeeded"),  # retryable (SIGTERM)
        (1, "ExitCode", "Failed"),  # permanent: fails the job
        (139, "ExitCode", "Failed"),  # permanent (SIGSEGV)
        (1, "OnFailure", "Succeeded"),  # any failure restarts
        (137, "Never", "Failed"),  # never restarted
    ],
)
async def test_a_crash_ends_the_job_as_its_restart_policy_says(
    exit_code: int, policy: str, phase: str
) -> None:
    async with Cluster.start(nodes=NODES) as c:
        job = await c.submit(gang("g", workers=1, policy=policy, duration="600"))
        await c.run_until(job, "Running")
        await c.advance(60)
        pod = c.pods(job)[-1]
        await c.inject("pod-crash", f"{pod.metadata.namespace}/{pod.metadata.name}", exit_code=exit_code)
        assert await _settle_all(c, ["default/g"]) == {"default/g": phase}
        _assert_none_lost(c, ["default/g"])
        assert not c.store.list_of(Reservation), "a finished job still holds devices"


async def test_crashes_beyond_the_backoff_limit_fail_the_job() -> None:
    async with Cluster.start(nodes=NODES) as c:
        job = await c.submit(gang("g", workers=0, policy="ExitCode", backoff=2, duration="600"))
        for _ in range(3):
            await c.until(lambda: any(p.status.phase == "Running" for p in c.pods(job)), timeout=600)
            pod = next(p for p in c.pods(job) if p.status.phase == "Running")
            await c.inject("pod-crash", f"default/{pod.metadata.name}", exit_code=137)
        assert await _settle_all(c, ["default/g"]) == {"default/g": "Failed"}


def _jobs(n: int) -> list[dict[str, Any]]:
    return [
        gang(f"j{i}", workers=i % 3, gpus=(8, 4, 2, 1)[i % 4], duration=str(300 + 60 * i)) for i in range(n)
    ]


@pytest.mark.parametrize("mode", ["500", "409", "timeout"])
@pytest.mark.parametrize("every", [5, 7])
async def test_backend_write_failures_at_every_call_site_lose_no_job(mode: Any, every: int) -> None:
    async with Cluster.start(nodes=NODES) as c:
        submitted = [f"default/{(await c.submit(doc)).metadata.name}" for doc in _jobs(10)]
        flaky = c.fail_writes(every=every, mode=mode)
        phases = await _settle_all(c, submitted, timeout=4 * 3600)
        flaky.remove()
        assert flaky.total_failed > 0 and set(flaky.failed) == {"create", "patch_status", "delete"} | (
            set(flaky.failed) & {"update"}
        )
        assert phases == dict.fromkeys(submitted, "Succeeded"), phases
        _assert_none_lost(c, submitted)
        await c.advance(60)
        assert not c.store.list_of(Reservation), "finished jobs still hold devices"
        c.check_invariants(when="after every job finished")


async def test_a_crashing_scheduler_is_restarted_by_its_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduling loop raises out of its cycle: the supervisor logs it, restarts the loop after
    its backoff (virtual time), the loop re-lists the store and places what was waiting."""
    crashes = 0
    step = SchedulerState.step

    def crash_twice(self: SchedulerState, **kwargs: Any) -> Any:
        nonlocal crashes
        if armed and crashes < 2:
            crashes += 1
            raise RuntimeError("injected scheduler crash")
        return step(self, **kwargs)

    armed = False
    monkeypatch.setattr(SchedulerState, "step", crash_twice)
    async with Cluster.start(nodes=NODES) as c:
        first = await c.submit(gang("first", duration="600"))
        await c.run_until(first, "Running")
        armed = True
        second = await c.submit(gang("second", duration="600"))
        await c.run_until(second, "Running", timeout=120)
        assert crashes == 2
        assert await _settle_all(c, ["default/first", "default/second"]) == {
            "default/first": "Succeeded",
            "default/second": "Succeeded",
        }


async def test_a_crashing_reconcile_is_retried_by_its_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's reconcile raises for a while: its runner retries the key with backoff."""
    failures = 0
    reconcile = JobReconciler.reconcile

    async def flaky(self: JobReconciler, key: Any) -> Any:
        nonlocal failures
        if key == ("default", "g") and failures < 5:
            failures += 1
            raise RuntimeError("injected operator crash")
        return await reconcile(self, key)

    monkeypatch.setattr(JobReconciler, "reconcile", flaky)
    async with Cluster.start(nodes=NODES) as c:
        await c.submit(gang("g", duration="300"))
        assert await _settle_all(c, ["default/g"]) == {"default/g": "Succeeded"}
        assert failures == 5
        _assert_none_lost(c, ["default/g"])


async def test_a_clock_jump_of_an_hour_finishes_what_was_due_and_places_what_waits() -> None:
    async with Cluster.start(nodes=[("dgx1-v100", 1)]) as c:
        first = await c.submit(gang("first", workers=0, gpus=8, duration="600"))
        second = await c.submit(gang("second", workers=0, gpus=8, duration="600"))
        await c.run_until(first, "Running")
        assert c.phase(second) == "Queuing"
        await c.advance(3600)  # one jump: every timer due in the hour fires in order
        assert c.phase(first) == "Succeeded" and c.phase(second) == "Succeeded"
        _assert_none_lost(c, ["default/first", "default/second"])


async def test_work_queue_under_back_pressure_keeps_every_key_once() -> None:
    queue = WorkQueue(clock=VirtualClock(), name="back-pressure")
    keys = [("Pod", "ns", f"p{i}") for i in range(100_000)]
    for key in keys:
        queue.add(key)
    for key in keys[:50_000]:  # adding again while queued: de-duplicated
        queue.add(key)
    assert len(queue) == 100_000
    seen: set[tuple[str, str, str]] = set()

    async def worker() -> None:
        while len(seen) < len(keys):
            key = await queue.get()
            assert key not in seen
            seen.add(key)
            if len(seen) % 10_000 == 0:
                await asyncio.sleep(0)
            queue.done(key)

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(4))), timeout=60)
    assert seen == set(keys) and len(queue) == 0
    queue.shut_down()
