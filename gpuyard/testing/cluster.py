"""A whole gpuyard platform inside a test: fake cluster, operator, scheduler, virtual clock.

`Cluster.start(...)` (an async context manager) or `await Cluster.launch(...)` builds a
:class:`~gpuyard.platform.runtime.Platform` in memory (no journal, no HTTP listener unless
`serve_http=True`, no network) over a fake cluster from a scenario file or inline node presets,
loads quota / queue / resource-class documents into its store, and runs every component as the
server would. Time stands still until the test moves it: `advance(seconds)` and
`run_until(job, phase, timeout=...)` jump the virtual clock from timer to timer, so an hour of
cluster time takes milliseconds. `stop()` cancels every task the platform started.

Jobs go in through the same validation as `POST /api/v1/jobs` (`submit`); what happened comes
back through `placement`, `explain`, `phase`, `pods`; faults go in through `inject` (the
backend's `faults`). The `assert_*` methods hand over to :mod:`gpuyard.testing.asserting`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from gpuyard.apis.core import Node, Pod
from gpuyard.apis.devicematching import gpu_devices
from gpuyard.apis.devices import NodeTopology
from gpuyard.apis.jobkinds import TrainingJob, find_job
from gpuyard.apis.meta import Resource
from gpuyard.apis.resourceclasses import default_class_name
from gpuyard.apis.scheduling import LABEL_JOB_NAME
from gpuyard.devices.scenarios import Scenario
from gpuyard.platform.runtime import Platform
from gpuyard.state.backend import ClusterBackend, FaultError, FaultInjector
from gpuyard.state.clock import VirtualClock, settle
from gpuyard.state.config import Settings
from gpuyard.state.ownership import USER
from gpuyard.state.store import AlreadyExists, Store
from gpuyard.state.writing import Writer, create_all, identified
from gpuyard.testing.asserting import Assertions
from gpuyard.testing.checking import InvariantWatch, checks_enabled
from gpuyard.testing.flaky import METHODS, FlakyWrites, Mode
from gpuyard.testing.inputs import BadInput, NodeSpec, Source, parse_jobs, parse_policies, scenario_of
from gpuyard.testing.observing import (
    Explanation,
    JobPlacement,
    JobRef,
    explanation_of,
    job_key,
    phase_of,
    placement_of,
)

__all__ = ["FAULTS", "TERMINAL", "Cluster"]

TERMINAL = ("Succeeded", "Failed")
FAULTS = ("node-fail", "node-recover", "gpu-fail", "gpu-recover", "pod-crash")
_START_TIMEOUT = 10.0  # real seconds for the backend to list its nodes


class Cluster:
    """A started in-process platform on the fake cluster; see the module docstring."""

    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        clock = platform.clock
        assert isinstance(clock, VirtualClock), "the harness runs on a VirtualClock"
        self.clock: VirtualClock = clock
        self.checks = Assertions(platform.store)
        self.invariants: InvariantWatch | None = None
        self._task: asyncio.Task[None] | None = None

    # --- life cycle -----------------------------------------------------------------------------

    @classmethod
    async def launch(
        cls,
        scenario: str | Path | Mapping[str, Any] | Scenario | None = None,
        *,
        nodes: Sequence[NodeSpec] | None = None,
        kubelet: Mapping[str, Any] | None = None,
        quotas: Source | Sequence[Source] = (),
        queues: Source | Sequence[Source] = (),
        resource_classes: Source | Sequence[Source] = (),
        settings: Mapping[str, Any] | None = None,
        serve_http: bool = False,
        check_invariants: bool | None = None,
    ) -> Cluster:
        """Validate everything, build the platform, load the policies, start it; raise BadInput.

        `check_invariants` (default: on, unless the test has the `gpuyard_no_invariants` marker):
        check the platform's invariants after every scheduling cycle and whenever the clock has
        run what was due; a violation fails the test (:mod:`gpuyard.testing.checking`).
        """
        parsed = scenario_of(scenario, nodes=nodes, kubelet=kubelet)
        policies = [
            *parse_policies(_sources(resource_classes), what="resource classes"),
            *parse_policies(_sources(quotas), what="quotas"),
            *parse_policies(_sources(queues), what="queues"),
        ]
        base: dict[str, Any] = {
            "server": {"host": "127.0.0.1", "port": 0},
            "backend": {"data_dir": None, "clock": "virtual"},
        }
        for section, values in (settings or {}).items():
            base[section] = {**base.get(section, {}), **dict(values)}
        try:
            built = Settings(**base)
        except ValueError as exc:
            raise BadInput(f"invalid settings: {exc}") from None
        platform = Platform(
            built, scenario=parsed, clock=VirtualClock(), serve_http=serve_http, drive_clock=False
        )
        await _create_policies(identified(platform.writer, USER), policies)
        cluster = cls(platform)
        if checks_enabled() if check_invariants is None else check_invariants:
            cluster.invariants = InvariantWatch(platform)
        await cluster._start()
        return cluster

    @classmethod
    @asynccontextmanager
    async def start(cls, scenario: Any = None, **kwargs: Any) -> AsyncIterator[Cluster]:
        """`async with Cluster.start(nodes=[("dgx1-v100", 2)]) as c:` — stopped on exit."""
        cluster = await cls.launch(scenario, **kwargs)
        try:
            yield cluster
        finally:
            await cluster.stop()

    async def _start(self) -> None:
        self._task = asyncio.create_task(self.platform.run(), name="gpuyard-test-platform")
        synced = asyncio.create_task(self.platform.backend.synced.wait())
        done, _ = await asyncio.wait(
            {synced, self._task}, timeout=_START_TIMEOUT, return_when="FIRST_COMPLETED"
        )
        if synced not in done:
            synced.cancel()
            await asyncio.gather(synced, return_exceptions=True)
            await self.stop()
            raise RuntimeError("the fake cluster did not list its nodes within 10 s")
        if self.platform.serve_http:
            await asyncio.wait_for(self.platform.serving.wait(), _START_TIMEOUT)
        # let the default ResourceClasses (nvidia.<model>) appear before the first submit
        await self.clock.run_until(self._classes_ready, timeout=5.0)

    def _classes_ready(self) -> bool:
        models: set[str] = set()
        for node in self.store.list_of(Node):
            topology = self.store.get_of(NodeTopology, "", node.metadata.name)
            models.update(d.model for d in gpu_devices(node, topology))
        models.discard("")
        return all(self.store.get("ResourceClass", "", default_class_name(m)) is not None for m in models)

    async def stop(self) -> None:
        """Stop every component; no task of the platform is left running. Raises the invariant
        violations seen since the last harness call (InvariantViolation), after stopping."""
        task, self._task = self._task, None
        if task is None:
            return
        self.platform.stop()
        try:
            await asyncio.wait_for(task, _START_TIMEOUT)
        except asyncio.CancelledError:
            if not task.done():
                raise
        if self.invariants is not None:
            self.invariants.raise_new()

    def check_invariants(self, *, when: str = "on request") -> None:
        """Check every invariant now (the settled ones too); InvariantViolation on a new one."""
        __tracebackhide__ = True
        if self.invariants is not None:
            self.invariants.check(when=when)
            self.invariants.raise_new()

    def _checkpoint(self, when: str) -> None:
        __tracebackhide__ = True
        if self.invariants is not None and self._task is not None:
            self.invariants.check(when=when)
            self.invariants.raise_new()

    # --- handles --------------------------------------------------------------------------------

    @property
    def store(self) -> Store:
        return self.platform.store

    @property
    def backend(self) -> ClusterBackend:
        return self.platform.backend

    @property
    def writer(self) -> Writer:
        """The one write path (the backend's), as every component uses it (`submit` and `delete`
        write through it as a user, `identified(writer, USER)`)."""
        return self.platform.writer

    @property
    def url(self) -> str:
        """The HTTP base URL (only with `serve_http=True`)."""
        return self.platform.url

    @property
    def now(self) -> float:
        """Virtual seconds since the cluster started."""
        return self.clock.elapsed

    # --- jobs -----------------------------------------------------------------------------------

    async def submit(self, manifest: Source) -> TrainingJob:
        """Validate and store job documents (a file, YAML text, a dict or a list) like the HTTP API.

        Returns the job (the first one when the manifest holds several; see `submit_all`).
        """
        return (await self.submit_all(manifest))[0]

    async def submit_all(self, manifest: Source) -> list[TrainingJob]:
        jobs = parse_jobs(manifest, store=self.store)
        taken = [
            f"{j.metadata.namespace}/{j.metadata.name}"
            for j in jobs
            if find_job(self.store, j.metadata.namespace, j.metadata.name) is not None
        ]
        names = [(j.metadata.namespace, j.metadata.name) for j in jobs]
        twice = sorted({f"{ns}/{n}" for ns, n in names if names.count((ns, n)) > 1})
        if taken or twice:
            detail = [f"{k} already exists; job names are unique in a namespace" for k in taken]
            detail += [f"{k} is given twice in this submission" for k in twice]
            raise BadInput("job manifest rejected: " + "; ".join(detail))
        created = await create_all(identified(self.writer, USER), jobs)
        await settle()
        self._checkpoint(f"after submitting {len(created)} job(s) at t={self.now:g}s")
        return created

    def problems(self, manifest: Source) -> list[str]:
        """What `submit` would reject in this manifest, one line per problem ([] when valid)."""
        try:
            parse_jobs(manifest, store=self.store)
        except BadInput as exc:
            return [line.strip() for line in str(exc).splitlines()[1:]] or [str(exc)]
        return []

    async def delete(self, job: JobRef) -> None:
        found = self.job(job)
        await identified(self.writer, USER).delete(found.kind, found.metadata.namespace, found.metadata.name)
        await settle()
        self._checkpoint(
            f"after deleting {found.metadata.namespace}/{found.metadata.name} at t={self.now:g}s"
        )

    def job(self, job: JobRef) -> TrainingJob:
        """The job as stored now."""
        ns, name = job_key(job)
        found = find_job(self.store, ns, name)
        if found is None:
            raise AssertionError(f"no job {ns}/{name}; jobs: {', '.join(self._job_names()) or 'none'}")
        return found

    def _job_names(self) -> list[str]:
        from gpuyard.apis.jobkinds import KIND_INFO

        return sorted(
            f"{j.metadata.namespace}/{j.metadata.name}" for kind in KIND_INFO for j in self.store.list(kind)
        )

    def phase(self, job: JobRef) -> str:
        """The job's phase (`Created`, `Queuing`, `Running`, ...), or "" if it does not exist."""
        return phase_of(self.store, job)

    def pods(self, job: JobRef) -> list[Pod]:
        ns, name = job_key(job)
        pods = self.store.list_of(Pod, namespace=ns, selector={LABEL_JOB_NAME: name})
        return sorted(pods, key=lambda p: p.metadata.name)

    def placement(self, job: JobRef) -> JobPlacement:
        """Per pod: node, GPU model, GPU indices, NICs and the link between its GPUs."""
        return placement_of(self.store, job)

    def explain(self, job: JobRef) -> Explanation:
        """The PodGroup's phase, reason and message, and the job's current condition."""
        return explanation_of(self.store, job)

    # --- assertions (gpuyard.testing.asserting) ---------------------------------------------------

    def assert_phase(self, job: JobRef, phase: str) -> None:
        __tracebackhide__ = True
        self.checks.assert_phase(job, phase)

    def assert_on_model(self, job: JobRef, model: str) -> None:
        """Every GPU pod of the job is on a node whose GPU model or product contains `model`."""
        __tracebackhide__ = True
        self.checks.assert_on_model(job, model)

    def assert_nvlink_connected(self, job: JobRef) -> None:
        """On every node, each pair of the job's GPUs there is joined by NVLink (NV#)."""
        __tracebackhide__ = True
        self.checks.assert_nvlink_connected(job)

    def assert_on_one_node(self, job: JobRef) -> None:
        __tracebackhide__ = True
        self.checks.assert_on_one_node(job)

    def assert_pending_because(self, job: JobRef, text: str) -> None:
        """The job holds no placement and the scheduler's reason mentions `text` (case-insensitive)."""
        __tracebackhide__ = True
        self.checks.assert_pending_because(job, text)

    def assert_within_quota(self, quota: str) -> None:
        """What placed jobs use in the quota's namespaces is within its max / hard limits."""
        __tracebackhide__ = True
        self.checks.assert_within_quota(quota)

    # --- time -----------------------------------------------------------------------------------

    async def advance(self, seconds: float) -> None:
        """Move virtual time forward, running everything that becomes due."""
        await self.clock.advance(seconds)
        self._checkpoint(f"after advancing to t={self.now:g}s")

    async def run_until(
        self, job: JobRef, phase: str | Sequence[str], *, timeout: float = 600.0
    ) -> TrainingJob:
        """Run the clock until the job is in `phase` (or one of them); AssertionError otherwise.

        Stops early, and fails, if the job finishes in another phase. `timeout` is virtual seconds.
        """
        __tracebackhide__ = True
        wanted = (phase,) if isinstance(phase, str) else tuple(phase)

        def done() -> bool:
            now = self.phase(job)
            return now in wanted or (now in TERMINAL and not set(wanted) & set(TERMINAL))

        await self.clock.run_until(done, timeout=timeout)
        self._checkpoint(f"at t={self.now:g}s")
        now = self.phase(job)
        if now not in wanted:
            ns, name = job_key(job)
            when = "finished" if now in TERMINAL else f"after {timeout:g} virtual seconds"
            raise AssertionError(
                f"job {ns}/{name} is {now or 'missing'} ({when}), expected {' or '.join(wanted)}\n"
                f"  scheduler: {self.explain(job)}"
            )
        return self.job(job)

    async def until(self, condition: Any, *, timeout: float = 600.0) -> bool:
        """Run the clock until `condition()` holds (returns whether it does)."""
        held = await self.clock.run_until(condition, timeout=timeout)
        self._checkpoint(f"at t={self.now:g}s")
        return held

    # --- faults ---------------------------------------------------------------------------------

    async def inject(
        self,
        fault: str,
        target: str,
        *,
        gpu: int | None = None,
        exit_code: int | None = None,
        reason: str | None = None,
    ) -> int:
        """Inject a fault: `node-fail` / `node-recover` NODE, `gpu-fail` / `gpu-recover` NODE gpu=I,
        `pod-crash` [NS/]POD exit_code=137 (or reason="OOMKilled"). Returns the pods it failed."""
        if fault not in FAULTS:
            raise BadInput(f"inject: unknown fault {fault!r}; allowed: {', '.join(FAULTS)}")
        failed = 0
        if fault == "pod-crash":
            ns, name = job_key(target)
            if self.store.get("Pod", ns, name) is None:
                raise BadInput(f"inject: no pod {ns}/{name}; pods: {', '.join(self._pod_names()) or 'none'}")
            try:
                await self._faults().crash_pod(ns, name, exit_code=exit_code, reason=reason)
            except FaultError as exc:
                raise BadInput(f"inject: {exc}") from None
            failed = 1
        else:
            if self.store.get("Node", "", target) is None:
                nodes = sorted(n.metadata.name for n in self.store.list("Node"))
                raise BadInput(f"inject: no node {target!r}; allowed: {', '.join(nodes)}")
            if fault.startswith("gpu-"):
                count = int(self.store.must_get_of(Node, "", target).status.capacity.get("nvidia.com/gpu", 0))
                if gpu is None or not 0 <= gpu < count:
                    raise BadInput(f"inject: {fault} needs gpu=<index>; allowed: 0..{count - 1} on {target}")
                faults = self._faults()
                if fault == "gpu-fail":
                    failed = await faults.fail_gpu(target, gpu)
                else:
                    await faults.recover_gpu(target, gpu)
            else:
                faults = self._faults()
                if fault == "node-fail":
                    failed = await faults.fail_node(target)
                else:
                    await faults.recover_node(target)
        await settle()
        self._checkpoint(f"after {fault} {target} at t={self.now:g}s")
        return failed

    def fail_writes(
        self,
        *,
        every: int,
        mode: Mode = "500",
        kinds: Sequence[str] | None = None,
        methods: Sequence[str] = METHODS,
    ) -> FlakyWrites:
        """From now on every `every`-th call of each writer method fails (`500`, `409` or a
        `timeout` after the write landed), for every component; `.remove()` ends it."""
        return FlakyWrites(self.writer, every=every, mode=mode, kinds=kinds, methods=methods)

    def _faults(self) -> FaultInjector:
        faults = self.backend.faults
        if faults is None:
            raise BadInput(f"inject: the {self.backend.name} backend cannot inject faults")
        return faults

    def _pod_names(self) -> list[str]:
        return sorted(f"{p.metadata.namespace}/{p.metadata.name}" for p in self.store.list("Pod"))


def _sources(value: Source | Sequence[Source]) -> list[Source]:
    if isinstance(value, (str, Path, Mapping)):
        return [value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, Mapping) for v in value):
        return [list(value)]  # one list of documents
    return list(value)


async def _create_policies(writer: Writer, objects: Sequence[Resource]) -> None:
    for obj in objects:
        try:
            await writer.create(obj)
        except AlreadyExists:
            raise BadInput(f"{obj.KIND} {obj.metadata.name} is given twice") from None
