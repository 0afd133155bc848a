"""The one Event recorder every component writes its Kubernetes Events with.

In the spirit of client-go's `EventRecorder`: a component makes one :class:`EventRecorder` with
its identity (`gpuyard.state.ownership`) and calls :meth:`EventRecorder.record` with the object
the Event is about (a stored object, or an object reference), a reason, a message and a type
(`Normal` or `Warning`). The recorder

* keeps **one Event per (object, reason)** of that component: the first occurrence creates it
  (`count` 1, `firstTimestamp` = `lastTimestamp` = now), every later one updates it: `count` + 1,
  `lastTimestamp`, the latest message and type (as client-go's aggregation shows repeats: "x3 over
  5m"). The Event's name is derived from the object's name, the component, the object's kind and
  the reason (:func:`event_name`), so a new process, a new leader or a backend that does not cache
  such Events (a create answered 409 brings the stored one back) finds the same Event again. A
  caller may name the Event itself (`name=`, the scheduler's `<podgroup>.<reason>`); an Event of
  that name about an earlier object of the same name (another uid) is taken over, from count 1;
* writes the component's identity as `source.component` and `reportingComponent`, and writes
  through the component's identified writer (`fieldManager`), so the Event's one writer is the
  component that reports it;
* cuts the message to :data:`MAX_MESSAGE` characters (the API server's limit for an Event note).

Events about jobs carry the `job-name` label (`labels=`): the API lists a job's Events by it, the
Kubernetes backend caches only those, and the operator deletes them with the job.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Literal

import structlog

from gpuyard.apis.core import Event
from gpuyard.apis.meta import ObjectMeta, Resource
from gpuyard.state.store import AlreadyExists, Conflict, NotFound, Store
from gpuyard.state.writing import Writer, identified

__all__ = ["MAX_MESSAGE", "EventRecorder", "EventType", "event_name", "reference_to"]

log = structlog.get_logger(__name__)

EventType = Literal["Normal", "Warning"]
MAX_MESSAGE = 1024  # characters; the API server refuses a longer Event note
_ATTEMPTS = 5
_NOT_DNS = re.compile(r"[^a-z0-9.-]+")


def reference_to(obj: Resource) -> dict[str, str]:
    """The `involvedObject` reference to a stored object."""
    meta = obj.metadata
    return {
        "apiVersion": obj.api_version,
        "kind": obj.kind,
        "namespace": meta.namespace,
        "name": meta.name,
        "uid": meta.uid,
    }


def event_name(involved: Mapping[str, str], *, reason: str, component: str) -> str:
    """`<object>.<reason>-<8 hex>`: one name per (object, reason) of one component; the hex tells
    apart components and kinds (a job and its PodGroup share a name)."""
    digest = hashlib.sha256(f"{component}/{involved.get('kind', '')}/{reason}".encode()).hexdigest()[:8]
    suffix = f".{_NOT_DNS.sub('-', reason.lower()).strip('-.') or 'event'}-{digest}"
    return involved.get("name", "object")[: 253 - len(suffix)].rstrip("-.") + suffix


def _bounded(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."


class EventRecorder:
    """Records one component's Events; see the module docstring."""

    def __init__(
        self,
        *,
        component: str,
        store: Store,
        writer: Writer,
        now: Callable[[], datetime] | None = None,
        instance: str | None = None,
    ) -> None:
        """`component`: the identity the Events are reported and written under; `now`: the
        component's clock (else every `record` gives its time, `at=`); `instance`: which replica
        of it (`reportingInstance`), when known."""
        self.component = component
        self.instance = instance
        self.store = store
        self.writer = identified(writer, component)
        self.now = now
        self.recorded = 0

    async def record(
        self,
        involved: Resource | Mapping[str, str],
        *,
        reason: str,
        message: str,
        type: EventType = "Normal",
        labels: Mapping[str, str] | None = None,
        name: str | None = None,
        at: datetime | None = None,
    ) -> Event | None:
        """Create or update the Event about `involved` for `reason` (see the module docstring);
        the Event as written, or None when its name is taken by another component's Event.
        Write errors other than a conflict are the caller's (the write is not retried)."""
        ref = dict(reference_to(involved) if isinstance(involved, Resource) else involved)
        namespace = ref.get("namespace") or "default"
        name = name or event_name(ref, reason=reason, component=self.component)
        if at is None:
            if self.now is None:
                raise ValueError("record: no time given (at=) and the recorder has no clock (now=)")
            at = self.now()
        message = _bounded(message)
        for attempt in range(_ATTEMPTS):
            current = self.store.get_of(Event, namespace, name)
            try:
                if current is None:
                    event = await self.writer.create(
                        self._new(ref, namespace, name, reason, message, type, labels, at)
                    )
                else:
                    mine = current.source.get("component", self.component) == self.component
                    if not mine:
                        log.warning(
                            "event.name_taken",
                            name=f"{namespace}/{name}",
                            by=current.source.get("component"),
                            component=self.component,
                        )
                        return None
                    event = await self.writer.update(self._again(current, ref, message, type, at))
            except (AlreadyExists, Conflict, NotFound):
                if attempt == _ATTEMPTS - 1:
                    raise
                continue  # someone wrote it meanwhile (the answer brought it into the store): again
            self.recorded += 1
            return event
        raise AssertionError("unreachable")

    def _new(
        self,
        ref: dict[str, str],
        namespace: str,
        name: str,
        reason: str,
        message: str,
        type_: EventType,
        labels: Mapping[str, str] | None,
        at: datetime,
    ) -> Event:
        return Event(
            metadata=ObjectMeta(name=name, namespace=namespace, labels=dict(labels or {})),
            involved_object=ref,
            reason=reason,
            message=message,
            type=type_,
            count=1,
            first_timestamp=at,
            last_timestamp=at,
            source={"component": self.component},
            reporting_component=self.component,
            reporting_instance=self.instance,
        )

    def _again(
        self, current: Event, ref: dict[str, str], message: str, type_: EventType, at: datetime
    ) -> Event:
        copy = current.model_copy()  # shallow: every field changed below is replaced, none mutated
        if current.involved_object.get("uid", "") != ref.get("uid", ""):
            # about another object of that name (the earlier one was deleted): it starts again
            copy.involved_object = ref
            copy.count = 1
            copy.first_timestamp = at
        else:
            copy.count += 1
        copy.message = message
        copy.type = type_
        copy.last_timestamp = at
        copy.source = {"component": self.component}
        copy.reporting_component = self.component
        copy.reporting_instance = self.instance
        return copy
