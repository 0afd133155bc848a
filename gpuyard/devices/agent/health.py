"""GPU health on a real node: which NVML events make a GPU unhealthy, and the watcher that reads them.

The rule (the one NVIDIA's device plugin applies): an XID critical error event makes the GPU
unhealthy unless its XID is an application error that leaves the GPU usable (13 graphics engine
exception, 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive cleanup, 68 video
processor exception, 109 context switch timeout — configurable); a double-bit ECC error makes it
unhealthy; NVML_ERROR_GPU_IS_LOST (the GPU fell off the bus) makes it unhealthy; on H100/H200 a GPU
whose NVSwitch fabric registration has not completed cannot use NVLink and is unhealthy. A GPU
never becomes healthy again by itself: the agent restarts (after the node was repaired) or an admin
rewrites the NodeTopology.

:class:`HealthBook` is the pure part (unhealthy GPU -> reason, applied to a NodeTopology);
:class:`EventWatcher` owns the NVML event set and blocks at most one health interval per call, so
the agent runs it in a worker thread and sees an event within one interval. No exception of an NVML
call, of any type, leaves the watcher: it is logged once and health is polled instead. The device in
an event is matched to its GPU by UUID (real handles are ctypes pointers: the event's is not `==` to
the one `nvmlDeviceGetHandleByIndex` gave).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuyard.apis.devices import NodeTopology
from gpuyard.devices.discovery import warn_once

__all__ = [
    "ANNOTATION_UNHEALTHY_REASONS",
    "APPLICATION_XIDS",
    "EventWatcher",
    "HealthBook",
    "HealthEvent",
]

APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
ANNOTATION_UNHEALTHY_REASONS = "gpuyard.io/unhealthy-reasons"
"""NodeTopology annotation: JSON `{gpu index: why}` for the GPUs the agent marked unhealthy."""

_XID = 8  # nvmlEventTypeXidCriticalError
_DBE = 2  # nvmlEventTypeDoubleBitEccError
_GPU_IS_LOST = 15
_TIMEOUT = 10


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """GPU `index` (None: every GPU, NVML could not say which) is unhealthy because of `reason`."""

    index: int | None
    reason: str


@dataclass
class HealthBook:
    """GPU index -> why it is unhealthy. Only grows (see the module doc)."""

    unhealthy: dict[int, str] = field(default_factory=dict)
    ignored_xids: Collection[int] = APPLICATION_XIDS

    def record(self, events: Iterable[HealthEvent], gpu_count: int) -> bool:
        """Record events; True when a GPU became unhealthy that was not before."""
        changed = False
        for event in events:
            targets = range(gpu_count) if event.index is None else (event.index,)
            for index in targets:
                if 0 <= index < gpu_count and index not in self.unhealthy:
                    self.unhealthy[index] = event.reason
                    changed = True
        return changed

    def xid(self, index: int, xid: int) -> HealthEvent | None:
        """The event an XID means, or None for an application XID."""
        if xid in self.ignored_xids:
            return None
        return HealthEvent(index, f"XID {xid}")

    def apply(self, topology: NodeTopology) -> NodeTopology:
        """A copy of `topology` with the recorded GPUs Unhealthy and the reasons annotated."""
        if not self.unhealthy:
            return topology
        out = topology.model_copy(deep=True)
        for gpu in out.spec.gpus:
            if gpu.index in self.unhealthy:
                gpu.health = "Unhealthy"
        # reasons already on the topology (a GPU the inventory kept out: MIG mode) stay
        try:
            kept = json.loads(out.metadata.annotations.get(ANNOTATION_UNHEALTHY_REASONS, "{}"))
        except ValueError:
            kept = {}
        reasons = {str(k): str(v) for k, v in kept.items()} if isinstance(kept, dict) else {}
        reasons.update({str(i): r for i, r in self.unhealthy.items()})
        ordered = dict(sorted(reasons.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else -1))
        out.metadata.annotations[ANNOTATION_UNHEALTHY_REASONS] = json.dumps(ordered, separators=(",", ":"))
        return out


class EventWatcher:
    """XID / double-bit ECC / lost-GPU events of every GPU through one NVML event set.

    Blocking: :meth:`wait` returns within `timeout_s`; call it from a worker thread. GPUs whose
    events cannot be registered (not supported, lost) are reported once and polled by
    :meth:`probe` instead.
    """

    def __init__(self, nvml: Any, gpu_count: int, book: HealthBook) -> None:
        self.nvml = nvml
        self.book = book
        self.handles: dict[int, Any] = {}
        self.uuids: dict[str, int] = {}
        self.event_set: Any = None
        xid = int(getattr(nvml, "nvmlEventTypeXidCriticalError", _XID))
        wanted = xid | int(getattr(nvml, "nvmlEventTypeDoubleBitEccError", _DBE))
        create = getattr(nvml, "nvmlEventSetCreate", None)
        try:
            self.event_set = create() if create is not None else None
        except Exception as exc:
            warn_once("events:create", "NVML events unavailable; health is polled only", error=_describe(exc))
        if self.event_set is None and create is None:
            warn_once("events:missing", "NVML has no event calls in this driver; health is polled only")
        for index in range(gpu_count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except Exception:
                continue
            self.handles[index] = handle
            try:
                self.uuids[_text(nvml.nvmlDeviceGetUUID(handle))] = index
            except Exception:
                pass
            if self.event_set is None:
                continue
            try:
                nvml.nvmlDeviceRegisterEvents(handle, wanted, self.event_set)
            except Exception as exc:  # ECC events are not supported on every board
                try:
                    nvml.nvmlDeviceRegisterEvents(handle, xid, self.event_set)
                except Exception:
                    warn_once(
                        f"events:register:{index}",
                        "GPU events not supported; polled only",
                        gpu=index,
                        error=_describe(exc),
                    )

    def _index_of(self, handle: Any) -> int | None:
        for index, known in self.handles.items():
            if known is handle:
                return index
        try:
            return self.uuids.get(_text(self.nvml.nvmlDeviceGetUUID(handle)))
        except Exception:
            return None

    def wait(self, timeout_s: float) -> list[HealthEvent]:
        """Events seen within `timeout_s` (at most one wait; empty on a quiet interval)."""
        if self.event_set is None:
            return []
        nvml = self.nvml
        try:
            data = nvml.nvmlEventSetWait(self.event_set, max(1, int(timeout_s * 1000)))
        except Exception as exc:
            code = getattr(exc, "value", None)
            if code == int(getattr(nvml, "NVML_ERROR_TIMEOUT", _TIMEOUT)):
                return []
            if code == int(getattr(nvml, "NVML_ERROR_GPU_IS_LOST", _GPU_IS_LOST)):
                return self.probe() or [HealthEvent(None, "GPU is lost (fell off the bus)")]
            warn_once(
                f"events:wait:{type(exc).__name__}:{code}",
                "NVML event wait failed; polling health",
                error=_describe(exc),
            )
            return self.probe()
        try:
            index = self._index_of(data.device)
            if index is None:
                return []
            if int(data.eventType) & int(getattr(nvml, "nvmlEventTypeDoubleBitEccError", _DBE)):
                return [HealthEvent(index, "double-bit ECC error")]
            event = self.book.xid(index, int(data.eventData))
        except Exception as exc:  # an event of a shape we do not know
            warn_once(
                f"events:data:{type(exc).__name__}", "NVML event unreadable; skipped", error=_describe(exc)
            )
            return []
        return [event] if event is not None else []

    def probe(self) -> list[HealthEvent]:
        """Poll every GPU: one that answers NVML_ERROR_GPU_IS_LOST is unhealthy."""
        nvml = self.nvml
        lost = int(getattr(nvml, "NVML_ERROR_GPU_IS_LOST", _GPU_IS_LOST))
        out = []
        for index, handle in self.handles.items():
            try:
                nvml.nvmlDeviceGetUUID(handle)
            except Exception as exc:
                if getattr(exc, "value", None) == lost:
                    out.append(HealthEvent(index, "GPU is lost (fell off the bus)"))
        return out

    def close(self) -> None:
        if self.event_set is not None:
            try:
                self.nvml.nvmlEventSetFree(self.event_set)
            except Exception:
                pass
            self.event_set = None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
