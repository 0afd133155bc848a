"""Leader election on a `coordination.k8s.io/v1` Lease, as client-go's `leaderelection` does it.

Every replica runs a :class:`LeaderElector`. Each `retry_period` it reads the Lease:

* no Lease: create it holding it (a 409 means another replica was first);
* held by another replica whose `renewTime` this replica has seen change within the last
  `leaseDurationSeconds` (measured on this replica's own monotonic clock from when it observed the
  change, so clocks need not agree and a wall-clock jump expires nobody): follow it (`holder`);
* otherwise (expired, released, or its own): write it with this replica's identity and a new
  `renewTime` (a PUT on the resourceVersion read, so of two replicas racing only one wins).

Fencing: `is_leader()` is computed when asked, from the monotonic time at which the last
successful round began, so it turns False `renew_deadline` seconds after that even when the
event loop is too busy to run the renew loop (the Kubernetes writer asks it before every write
and refuses). `renew_deadline` is kept below `leaseDurationSeconds`, and a standby counts the
lease duration from when it saw the renewal, which is after the round began: the old leader is
fenced before a standby may take over. Each round (GET, then PUT or POST) is bounded by
:func:`round_timeout`, at most half the renew deadline and never past the deadline, so a hung
request cannot keep the loop from seeing the loss. A leader past its deadline has lost the
lease: `wait_lost()` returns and the runtime stops this process (as kube-scheduler exits), so
the reconcilers of a replica that may no longer lead never write again. A leader that is stopped releases the Lease (empty holder), so a
standby takes over at its next retry instead of after a whole lease duration. The elector is the
backend's `leadership` (`state.backend.Leadership`).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import structlog

from gpuyard.apis.resources import resource_for
from gpuyard.kubecluster.client import ApiError, Json, KubeClient
from gpuyard.state.clock import Clock, RealClock
from gpuyard.state.config import LeaderElectionConfig
from gpuyard.state.store import AlreadyExists, Conflict, NotFound

__all__ = ["LeaderElector", "default_identity", "round_timeout"]

log = structlog.get_logger(__name__)


def default_identity() -> str:
    """The pod's name where the Deployment sets POD_NAME, else host_pid plus a random suffix."""
    pod = os.environ.get("POD_NAME")
    if pod:
        return pod
    return f"{socket.gethostname()}_{os.getpid()}_{uuid.uuid4().hex[:6]}"


def round_timeout(config: LeaderElectionConfig, *, left: float | None) -> float:
    """How long one round may take: half the renew deadline (a hung request leaves time for
    another try), and for a leader never more than the `left` seconds before its deadline."""
    bound = config.renew_deadline / 2
    return bound if left is None else max(0.0, min(bound, left))


def _micro_time(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """One replica's side of the election; see the module docstring."""

    def __init__(
        self,
        *,
        client: KubeClient | None,
        clock: Clock,
        namespace: str,
        config: LeaderElectionConfig,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        """`monotonic` measures the renew deadline and other holders' expiry: by default
        `time.monotonic` under a real clock (never jumps with the wall clock), the clock's own
        time under a virtual one (which never goes back)."""
        self.client = client
        self.clock = clock
        self.namespace = namespace
        self.config = config
        self.identity = config.identity or default_identity()
        self.resource = resource_for("Lease")
        if monotonic is None:
            monotonic = time.monotonic if isinstance(clock, RealClock) else clock.now
        self.monotonic = monotonic
        self._leading = asyncio.Event()
        self._lost = asyncio.Event()
        self._holder: str | None = None
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0  # monotonic
        self._renewed_at = 0.0  # monotonic: when the last successful round began
        self.transitions = 0

    def _api(self) -> KubeClient:
        if self.client is None:
            raise ApiError("the Kubernetes backend is not connected yet")
        return self.client

    # --- Leadership ----------------------------------------------------------------------------

    def is_leader(self) -> bool:
        """Whether this replica may write now: it holds the lease and its last successful round
        began less than `renew_deadline` ago (computed now, not when the renew loop last ran)."""
        return (
            self._leading.is_set()
            and not self._lost.is_set()
            and self.monotonic() - self._renewed_at < self.config.renew_deadline
        )

    def _overdue(self) -> bool:
        """A leader whose renew deadline has passed."""
        return self._leading.is_set() and self.monotonic() - self._renewed_at >= self.config.renew_deadline

    @property
    def holder(self) -> str | None:
        return self._holder

    async def wait_leading(self) -> None:
        await self._leading.wait()

    async def wait_lost(self) -> None:
        await self._lost.wait()

    # --- the loop ------------------------------------------------------------------------------

    def _lease_body(self, *, previous: Json | None) -> Json:
        now = _micro_time(self.clock.utcnow())
        spec_before = (previous or {}).get("spec") or {}
        ours = spec_before.get("holderIdentity") == self.identity
        transitions = int(spec_before.get("leaseTransitions") or 0)
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.config.lease_duration)),
            "acquireTime": spec_before.get("acquireTime") if ours else now,
            "renewTime": now,
            "leaseTransitions": transitions if ours or previous is None else transitions + 1,
        }
        meta: Json = {"name": self.config.lease_name, "namespace": self.namespace}
        if previous is not None:
            meta["resourceVersion"] = (previous.get("metadata") or {}).get("resourceVersion", "")
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    async def try_acquire_or_renew(self) -> bool:
        """One round: True when this replica holds the lease after it."""
        try:
            current = await self._api().get(self.resource, self.namespace, self.config.lease_name)
        except NotFound:
            try:
                await self._api().create(self.resource, self._lease_body(previous=None))
            except AlreadyExists:
                return False
            self._holder = self.identity
            return True
        spec = current.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, str(spec.get("renewTime") or ""))
        now = self.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or self.config.lease_duration)
        if holder and holder != self.identity and now < self._observed_at + duration:
            self._holder = holder
            return False
        try:
            await self._api().replace(self.resource, self._lease_body(previous=current))
        except Conflict:
            return False
        self._holder = self.identity
        return True

    async def run(self) -> None:
        """Acquire, then renew until the lease is lost or the task is cancelled (it releases)."""
        try:
            while not self._lost.is_set():
                if self._overdue():
                    self._lose()
                    return
                started = self.monotonic()
                left = (
                    self._renewed_at + self.config.renew_deadline - started
                    if self._leading.is_set()
                    else None
                )
                try:
                    async with asyncio.timeout(round_timeout(self.config, left=left)):
                        held = await self.try_acquire_or_renew()
                except TimeoutError:
                    held = False
                    log.warning("leader.round_timeout", identity=self.identity)
                except ApiError as exc:
                    held = False
                    log.warning("leader.error", identity=self.identity, error=str(exc))
                if held:
                    self._renewed_at = started
                    if not self._leading.is_set():
                        self.transitions += 1
                        log.info("leader.acquired", identity=self.identity, lease=self.config.lease_name)
                        self._leading.set()
                elif self._leading.is_set() and (
                    self._holder not in (None, self.identity) or self._overdue()
                ):
                    self._lose()
                    return
                await self.clock.sleep(self.config.retry_period)
        finally:
            if self._leading.is_set() and not self._lost.is_set():
                await self._release()

    def _lose(self) -> None:
        log.error("leader.lost", identity=self.identity, holder=self._holder)
        self._lost.set()

    async def _release(self) -> None:
        """Give the lease up (empty holder) so a standby takes over at once."""
        self._lost.set()
        try:
            async with asyncio.timeout(round_timeout(self.config, left=None)):
                await self._give_up()
        except (ApiError, Conflict, NotFound, TimeoutError) as exc:
            log.warning("leader.release_failed", identity=self.identity, error=str(exc) or "timed out")

    async def _give_up(self) -> None:
        current = await self._api().get(self.resource, self.namespace, self.config.lease_name)
        if (current.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        body = self._lease_body(previous=current)
        body["spec"]["holderIdentity"] = ""
        body["spec"]["leaseDurationSeconds"] = 1
        await self._api().replace(self.resource, body)
        log.info("leader.released", identity=self.identity)
