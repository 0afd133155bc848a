"""Job status bookkeeping: conditions as Kubeflow sets them, and the derived phase.

Conditions follow Kubeflow's `setCondition`: a condition of the same type, status and reason is
left alone (only its message refreshed); otherwise the old one is removed and the new one
appended, so the last condition is the current one (what `kubectl get` prints). Making one of
Queuing / Running / Restarting / Suspended / Succeeded / Failed true turns the others of that
set false, and a condition turned false says so in its message ("No longer queuing: TFJob x is
running."), never keeping the text that described it while true; Created stays true. `status.phase` mirrors the current condition for listing.

The job's Events are written by the applier through the one Event recorder
(`gpuyard.state.events`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpuyard.apis.jobspecs import JobCondition, JobStatus
from gpuyard.apis.meta import Resource
from gpuyard.state.store import NotFound
from gpuyard.state.writing import Writer

__all__ = ["EXCLUSIVE", "current_phase", "patch_status_as_read", "set_condition"]

EXCLUSIVE = ("Queuing", "Running", "Restarting", "Suspended", "Succeeded", "Failed")


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


async def patch_status_as_read(writer: Writer, obj: Resource, changes: dict[str, Any]) -> None:
    """PATCH `changes` into the object's status at the version it was read at. A Conflict goes to
    the caller (the runner retries the key: the object changed meanwhile); an object gone has
    nothing to write."""
    try:
        await writer.patch_status(
            obj.kind,
            obj.metadata.namespace,
            obj.metadata.name,
            changes,
            resource_version=obj.metadata.resource_version,
        )
    except NotFound:
        pass
