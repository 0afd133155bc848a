"""Job custom resources that fail validation: a `Failed` condition and a Warning Event, not a loop.

Where it sits: an :class:`~gpuyard.kubecluster.informing.Informer` of a job kind hands every
object that does not validate against its model, or that the job API's validation
(:meth:`InvalidJobs.check`, `gpuyard.apis.jobs.parse_job`) refuses, to :meth:`InvalidJobs.note` (and keeps it out of
the store: the operator never sees it). :meth:`InvalidJobs.run`, a task of the backend, writes back
to the API server, on the leader only:

- a `Failed` condition (reason `InvalidSpec`, the message naming the field and what is wrong, the
  shape the operator writes) through the `status` subresource, with the object's resourceVersion
  as precondition (a fix made meanwhile wins), and `status.phase: Failed`;
- a Warning `core/v1` Event on the job with the same reason and message, through the Event
  recorder (`gpuyard.state.events`: one Event per job, its count bumped by a later report).

These are the one write to a job's status that is not the operator's (`state.ownership`,
`docs/architecture.md`): the object never reaches the store, so the operator never sees it. They
are written as the backend (`BACKEND`, the `fieldManager` of the status patch and the Event's
`source.component`).

A job whose kind, namespace and name are taken by a job of the other group gpuyard reconciles
(KubeDL's `training.kubedl.io` and Kubeflow's `kubeflow.org` both define TFJob, ...; both would own
the same pods) is reported the same way (:meth:`InvalidJobs.clash`): the one created first keeps
the name. When the first leaves, the other is fetched again (:meth:`InvalidJobs.freed`) and, valid
now, is picked up as a new job.

Once per resourceVersion, and no hot loop: the status patch brings the object back (a new
resourceVersion, still invalid), but its status already carries that very condition, so
nothing more is written. A fixed object validates again; :meth:`InvalidJobs.cleared` strips
the `InvalidSpec` condition from what the store receives and removes it on the API server, so the
operator picks the job up as new.

The status patch goes straight through the :class:`~gpuyard.kubecluster.client.KubeClient`: the
object is not in the store, so the store-based write path cannot address it (the Event can be: it
goes through the backend's writer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog
from pydantic import ValidationError

from gpuyard.apis.jobs import INVALID_SPEC, JobValidationError, parse_job
from gpuyard.apis.managers import raw_external_manager
from gpuyard.apis.meta import Resource
from gpuyard.apis.resources import ApiResource, resource_for
from gpuyard.apis.scheduling import LABEL_JOB_NAME
from gpuyard.kubecluster.client import ApiError, Json, KubeClient
from gpuyard.state.backend import BackendError
from gpuyard.state.clock import Clock
from gpuyard.state.events import EventRecorder
from gpuyard.state.ownership import BACKEND
from gpuyard.state.store import Conflict, NotFound
from gpuyard.state.writing import acting_as

__all__ = ["REASON", "InvalidJobs", "problem_text"]

log = structlog.get_logger(__name__)

REASON = INVALID_SPEC
# The job conditions of which at most one is True (the operator's `EXCLUSIVE`).
EXCLUSIVE = ("Queuing", "Running", "Restarting", "Suspended", "Succeeded", "Failed")


def problem_text(exc: ValidationError) -> str:
    """The first problem of a validation error, naming the field: `spec.x.y: what is wrong`."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(object)"
    text = f"{where}: {err['msg'].removeprefix('Value error, ')}"
    if not isinstance(err["input"], dict | list):
        text += f" (got {err['input']!r})"
    more = exc.error_count() - 1
    if more > 0:
        text += f"; and {more} more problem{'s' if more > 1 else ''}"
    return text


def _older(a: Resource, b: Resource) -> bool:
    """`a` was created before `b` (ties: by group name, so every replica decides alike)."""
    far = datetime.max.replace(tzinfo=UTC)
    ta = a.metadata.creation_timestamp or far
    tb = b.metadata.creation_timestamp or far
    if ta.tzinfo is None:
        ta = ta.replace(tzinfo=UTC)
    if tb.tzinfo is None:
        tb = tb.replace(tzinfo=UTC)
    return (ta, a.api_version) < (tb, b.api_version)


def _is_ours(cond: Any) -> bool:
    return isinstance(cond, dict) and cond.get("type") == "Failed" and cond.get("reason") == REASON


def _conditions(raw: Json) -> list[Any]:
    status = raw.get("status")
    conds = status.get("conditions") if isinstance(status, dict) else None
    return list(conds) if isinstance(conds, list) else []


def _iso(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Pending:
    resource: ApiResource
    raw: Json
    message: str  # "" = clear our condition (the object is valid again)


class InvalidJobs:
    """See the module docstring."""

    def __init__(
        self,
        *,
        clock: Clock,
        may_write: Callable[[], str | None],
        client: KubeClient | None = None,
        events: EventRecorder | None = None,
        retry: float = 1.0,
    ) -> None:
        """`events`: the backend's Event recorder (None: no Events, only the condition)."""
        self.client = client
        self.events = events
        self.clock = clock
        self.may_write = may_write
        self.retry = retry
        self._pending: dict[tuple[str, str, str], _Pending] = {}
        self.clashed: dict[tuple[str, str, str], ApiResource] = {}  # (kind, ns, name) -> the loser's
        # called with the loser's resource, namespace and name once the winner is gone (the backend
        # fetches it again through its informer)
        self.revisit: Callable[[ApiResource, str, str], None] | None = None
        self._wake = asyncio.Event()
        self.conditions_written = 0
        self.events_written = 0

    # --- from the informer (synchronous) -------------------------------------------------------

    def check(self, raw: Json) -> str | None:
        """What the job API's validation (`gpuyard.apis.jobs.parse_job`: replica types, semantic
        checks such as `fake.gpuyard.io/*` durations) finds wrong with a job that fits its model."""
        try:
            parse_job(raw)
        except JobValidationError as exc:
            if not exc.details:
                return exc.message
            first = exc.details[0]
            text = f"{first.get('field', '<root>')}: {first.get('reason', exc.message)}"
            more = len(exc.details) - 1
            return text + (f"; and {more} more problem{'s' if more > 1 else ''}" if more > 0 else "")
        return None

    def clash(self, obj: Resource, held: Resource | None) -> tuple[str | None, bool]:
        """Two jobs of one kind, namespace and name in the two groups gpuyard reconciles (KubeDL's
        and Kubeflow's): both would own the same pods, services and PodGroup, so the one created
        first keeps the name and the other fails `InvalidSpec` naming it. Returns the problem of
        `obj` (None: it may be stored) and whether `held`, the one in the store, must leave it
        (then it is reported here instead: `obj` is older)."""
        if held is None or held.api_version == obj.api_version or held.metadata.uid == obj.metadata.uid:
            return None, False
        first, second = (held, obj) if _older(held, obj) else (obj, held)
        meta = second.metadata
        self.clashed[(second.kind, meta.namespace, meta.name)] = resource_for(second.kind, second.api_version)
        group, other = second.api_version.split("/")[0], first.api_version.split("/")[0]
        message = (
            f"metadata.name: {first.kind} {meta.namespace}/{meta.name} of {other} was created first with "
            f"this name; gpuyard reconciles both {other} and {group} (backend.kubernetes.job_groups) "
            "and a job's pods and services are named after it: rename this job, or reconcile one group"
        )
        if second is obj:
            return message, False
        raw = held.model_dump(by_alias=True, exclude_none=True, mode="json")
        self.note(resource_for(held.kind, held.api_version), raw, message)
        return None, True

    def freed(self, kind: str, namespace: str, name: str) -> None:
        """A job left the store: if it had won a name clash, the job that lost is looked at again."""
        loser = self.clashed.pop((kind, namespace, name), None)
        if loser is not None and self.revisit is not None:
            self.revisit(loser, namespace, name)

    def note(self, resource: ApiResource, raw: Json, message: str) -> None:
        """An object of `resource` failed validation: report it unless its status already does
        (or another controller manages it, `runPolicy.managedBy`: its status is not gpuyard's)."""
        if raw_external_manager(raw) is not None:
            return
        if any(_is_ours(c) and c.get("message") == message for c in _conditions(raw)):
            return  # reported already (this is the echo of our own status patch)
        self._queue(resource, raw, message)

    def cleared(self, resource: ApiResource, raw: Json, obj: Resource) -> None:
        """A valid object: if its status still says `InvalidSpec`, drop that from `obj` (what the
        store gets) and from the API server."""
        if not any(_is_ours(c) for c in _conditions(raw)):
            return
        status: Any = getattr(obj, "status", None)
        conditions = getattr(status, "conditions", None)
        if isinstance(conditions, list):
            status.conditions = [c for c in conditions if not (c.type == "Failed" and c.reason == REASON)]
            if getattr(status, "phase", "") == "Failed":
                status.phase = ""
        self._queue(resource, raw, "")

    def _queue(self, resource: ApiResource, raw: Json, message: str) -> None:
        meta = raw.get("metadata") or {}
        key = (resource.api_version, str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        self._pending[key] = _Pending(resource, raw, message)
        self._wake.set()

    # --- the writing task ----------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self.may_write() is not None or self.client is None:
                await self.clock.sleep(self.retry)  # a standby: the leader reports, or we do later
                self._wake.set()
                continue
            for key in list(self._pending):
                item = self._pending.pop(key)
                try:
                    with acting_as(BACKEND):
                        await self._write(self.client, item)
                except (NotFound, Conflict):
                    pass  # gone or changed meanwhile: its next version is noted afresh
                except ApiError as exc:
                    transient = exc.status == 0 or exc.status == 429 or exc.status >= 500
                    log.warning(
                        "job.invalid_report_failed",
                        job=f"{key[1]}/{key[2]}",
                        error=str(exc),
                        retrying=transient,
                    )
                    if transient:  # a refusal (403, 422) would be refused again: given up
                        self._pending.setdefault(key, item)
            if self._pending:
                await self.clock.sleep(self.retry)
                self._wake.set()

    async def _write(self, client: KubeClient, item: _Pending) -> None:
        meta = item.raw.get("metadata") or {}
        ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        now = self.clock.utcnow()
        kept = [c for c in _conditions(item.raw) if not _is_ours(c)]
        status: Json
        if not item.message:
            status = {"conditions": kept, "phase": None}
        else:
            for c in kept:
                if isinstance(c, dict) and c.get("type") in EXCLUSIVE and c.get("status") == "True":
                    c.update(status="False", lastUpdateTime=_iso(now), lastTransitionTime=_iso(now))
            failed = {
                "type": "Failed",
                "status": "True",
                "reason": REASON,
                "message": item.message,
                "lastUpdateTime": _iso(now),
                "lastTransitionTime": _iso(now),
            }
            status = {"conditions": [*kept, failed], "phase": "Failed"}
        body: Json = {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": status}
        await client.patch(item.resource, ns, name, body, sub="status")
        if not item.message:
            log.info("job.invalid_cleared", job=f"{ns}/{name}", kind=item.resource.kind)
            return
        self.conditions_written += 1
        await self._event(item, ns=ns, name=name, now=now)
        log.warning("job.invalid", job=f"{ns}/{name}", kind=item.resource.kind, problem=item.message)

    async def _event(self, item: _Pending, *, ns: str, name: str, now: datetime) -> None:
        if self.events is None:
            return
        meta = item.raw.get("metadata") or {}
        involved = {
            "apiVersion": item.resource.api_version,
            "kind": item.resource.kind,
            "namespace": ns,
            "name": name,
            "uid": str(meta.get("uid") or ""),
            "resourceVersion": str(meta.get("resourceVersion") or ""),
        }
        try:
            await self.events.record(
                involved,
                reason=REASON,
                message=item.message,
                type="Warning",
                labels={LABEL_JOB_NAME: name},
                at=now,
            )
        except (ApiError, BackendError) as exc:  # the condition says it; the Event is a courtesy
            log.warning("job.invalid_event_failed", job=f"{ns}/{name}", error=str(exc))
            return
        self.events_written += 1
