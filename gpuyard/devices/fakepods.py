"""What a simulated kubelet does with a pod: the `fake.gpuyard.io/*` annotations, parsed.

Both simulated kubelets read pods the same way: the fake cluster's (`fakecluster/kubelet.py`,
over the store) and `gpuyard fake-nodes` (`kubecluster/fakenodes/`, over any API server). Per
pod, annotations override the scenario's defaults (`kubelet:` in the scenario file):
`fake.gpuyard.io/start-delay` (time from Pending to Running), `fake.gpuyard.io/duration` (run
time: seconds or a Go-style duration such as `40s` or `1h30m`; `inf` runs forever) and
`fake.gpuyard.io/exit-code`. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuyard.apis.durations import (
    ANNOTATION_DURATION,
    ANNOTATION_EXIT_CODE,
    ANNOTATION_START_DELAY,
    parse_duration,
    parse_pod_duration,
)
from gpuyard.devices.scenarios import KubeletDefaults

__all__ = ["PodScript", "exit_reason", "pod_script"]


@dataclass(frozen=True, slots=True)
class PodScript:
    """How a simulated pod runs: seconds to start, seconds to run (None: forever), exit code."""

    start_delay: float
    duration: float | None
    exit_code: int


def _duration(annotations: Mapping[str, str], key: str, default: float | None) -> float | None:
    """The annotation's duration, or the default when absent or unreadable: submit refuses
    unreadable ones, so only an object written past validation can hold one."""
    raw = annotations.get(key)
    if raw is None:
        return default
    try:
        return parse_pod_duration(raw) if key == ANNOTATION_DURATION else parse_duration(raw)
    except ValueError:
        return default


def pod_script(annotations: Mapping[str, str], defaults: KubeletDefaults) -> PodScript:
    """The pod's script: its annotations over the scenario's kubelet defaults."""
    code_raw = annotations.get(ANNOTATION_EXIT_CODE)
    exit_code = (
        int(code_raw) if code_raw is not None and code_raw.lstrip("-").isdigit() else defaults.exit_code
    )
    return PodScript(
        start_delay=_duration(annotations, ANNOTATION_START_DELAY, defaults.start_delay) or 0.0,
        duration=_duration(annotations, ANNOTATION_DURATION, defaults.duration),
        exit_code=exit_code,
    )


def exit_reason(exit_code: int) -> str:
    """The container's termination reason for an exit code, as the kubelet reports it: 0 is
    `Completed`, 137 (SIGKILL, what the OOM killer sends) `OOMKilled`, any other `Error`."""
    if exit_code == 0:
        return "Completed"
    return "OOMKilled" if exit_code == 137 else "Error"
