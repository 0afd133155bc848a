"""Job status bookkeeping: conditions as Kubeflow sets them, the derived phase, and Events.

Conditions follow Kubeflow's `setCondition`: a condition of the same type, status and reason is
left alone (only its message refreshed); otherwise the old one is removed and the new one
appended, so the last condition is the current one (what `kubectl get` prints). Making one of
Queuing / Running / Restarting / Suspended / Succeeded / Failed true turns the others of that
set false, and a condition turned false says so in its message ("No longer queuing: TFJob x is
running."), never keeping the text that described it while true; Created stays true. `status.phase` mirrors the current condition for listing.

Events are Kubernetes Events about the job (`involvedObject`), labelled `job-name` so the API
lists them cheaply; a repeat of the same reason and message bumps `count`, as the Kubernetes
event recorder aggregates. They are written through the writer (`record_event`).
"""

from __future__ import annotations

import functools
from datetime import datetime

import structlog

from gpuyard.apis.core import Event
from gpuyard.apis.jobkinds import TrainingJob
from gpuyard.apis.jobspecs import JobCondition, JobStatus
from gpuyard.apis.meta import ObjectMeta
from gpuyard.apis.scheduling import LABEL_JOB_NAME
from gpuyard.state.store import Store
from gpuyard.state.writing import Writer, retry_on_conflict

__all__ = ["EXCLUSIVE", "current_phase", "record_event", "set_condition"]

log = structlog.get_logger(__name__)

EXCLUSIVE = ("Queuing", "Running", "Restarting", "Suspended", "Succeeded", "Failed")
COMPONENT = "gpuyard-job-operator"


def current_phase(status: JobStatus) -> str:
    for c in reversed(status.conditions):
        if c.status == "True" and c.type != "Created":
            return c.type
    return "Created" if status.is_true("Created") else ""


def set_condition(
    status: JobStatus, type_: str, *, reason: str, message: str, now: datetime, true: bool = True
) -> bool:
    """Set a condition (Kubeflow semantics); return whether anything changed."""
    value = "True" if true else "False"
    current = status.condition(type_)
    if current is not None and current.status == value and current.reason == reason:
        if current.message == message:
            return False
        current.message = message
        current.last_update_time = now
        return True
    transition = now if current is None or current.status != value else current.last_transition_time
    conditions = [c for c in status.conditions if c.type != type_]
    if true and type_ in EXCLUSIVE:
        for c in conditions:
            if c.type in EXCLUSIVE and c.status == "True":
                c.status = "False"
                c.message = f"No longer {c.type.lower()}: {message}"  # its old text no longer holds
                c.last_update_time = now
                c.last_transition_time = now
    conditions.append(
        JobCondition(
            type=type_,
            status=value,
            reason=reason,
            message=message,
            last_update_time=now,
            last_transition_time=transition,
        )
    )
    status.conditions = conditions
    status.phase = current_phase(status)
    return True


async def record_event(
    job: TrainingJob,
    *,
    store: Store,
    writer: Writer,
    reason: str,
    message: str,
    now: datetime,
    warning: bool = False,
) -> None:
    """Write (or aggregate into) a Kubernetes-style Event about the job, through `writer`."""
    ns = job.metadata.namespace or "default"
    name = job.metadata.name
    for ev in store.list("Event", namespace=ns, selector={LABEL_JOB_NAME: name}):
        assert isinstance(ev, Event)
        if (
            ev.reason == reason
            and ev.message == message
            and ev.involved_object.get("uid") == job.metadata.uid
        ):
            key = (ns, ev.metadata.name)
            bumped = await retry_on_conflict(
                functools.partial(_bump, key, store=store, writer=writer, now=now)
            )
            if bumped is not None:
                return
    await writer.create(
        Event(
            metadata=ObjectMeta(generate_name=f"{name}.", namespace=ns, labels={LABEL_JOB_NAME: name}),
            involved_object={
                "apiVersion": job.api_version,
                "kind": job.kind,
                "namespace": ns,
                "name": name,
                "uid": job.metadata.uid,
            },
            reason=reason,
            message=message,
            type="Warning" if warning else "Normal",
            count=1,
            first_timestamp=now,
            last_timestamp=now,
            source={"component": COMPONENT},
        )
    )
    log.info(
        "job.event",
        job=f"{ns}/{name}",
        kind=job.kind,
        reason=reason,
        message=message,
        type="Warning" if warning else "Normal",
    )


async def _bump(key: tuple[str, str], *, store: Store, writer: Writer, now: datetime) -> Event:
    """One more occurrence of a recorded Event (NotFound when it went meanwhile)."""
    current = store.must_get("Event", *key)
    assert isinstance(current, Event)
    copy = current.clone()
    copy.count += 1
    copy.last_timestamp = now
    return await writer.update(copy)
