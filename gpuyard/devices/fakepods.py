"""What a simulated kubelet does with a pod: the `fake.gpuyard.io/*` annotations, parsed.

Both simulated kubelets read pods the same way: the fake cluster's (`fakecluster/kubelet.py`,
over the store) and `gpuyard fake-nodes` (`kubecluster/fakenodes/`, over any API server). Per
pod, annotations override the scenario's defaults (`kubelet:` in the scenario file):
`fake.gpuyard.io/start-delay` (time from Pending to Running), `fake.gpuyard.io/duration` (run
time: seconds or a Go-style duration such as `40s` or `1h30m`; `inf` runs forever) and
`fake.gpuyard.io/exit-code`.

A fake container prints nothing of its own, so both kubelets keep the same short log per
container (:func:`container_logs`, what `gpuyard logs` shows): when and where it started, the
distributed-training environment it was given and how it exited, read from the pod's status.
Pure: no clock, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from gpuyard.apis.core import Pod
from gpuyard.apis.durations import (
    ANNOTATION_DURATION,
    ANNOTATION_EXIT_CODE,
    ANNOTATION_START_DELAY,
    parse_duration,
    parse_pod_duration,
)
from gpuyard.devices.scenarios import KubeletDefaults

__all__ = ["LOG_ENV", "PodScript", "container_logs", "exit_reason", "pod_script"]


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


LOG_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PET_NNODES",
    "PET_NODE_RANK",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
)
"""The variables a container's log summarises (in this order), besides TF_CONFIG's task."""
LOG_VALUE_CHARS = 80


def _env_summary(env: dict[str, str]) -> str:
    parts = [f"{k}={env[k][:LOG_VALUE_CHARS]}" for k in LOG_ENV if env.get(k)]
    tf_config = env.get("TF_CONFIG")
    if tf_config:
        try:
            config = json.loads(tf_config)
            task = config.get("task") or {}
            roles = {r: len(a) for r, a in (config.get("cluster") or {}).items()}
            sizes = ",".join(f"{r}:{n}" for r, n in roles.items())
            parts.append(f"TF_CONFIG task={task.get('type')}:{task.get('index')} cluster={sizes}")
        except (ValueError, AttributeError):
            parts.append("TF_CONFIG=(not JSON)")
    rest = len(env) - sum(1 for k in env if k in LOG_ENV or k == "TF_CONFIG")
    if rest > 0:
        parts.append(f"(+{rest} more)")
    return " ".join(parts) if parts else "(no environment)"


def container_logs(pod: Pod) -> dict[str, list[str]]:
    """Each container's log lines (see the module docstring); empty while the pod is Pending."""
    status = pod.status
    started = status.start_time.isoformat() if status.start_time else None
    statuses = {cs.name: cs for cs in status.container_statuses}
    out: dict[str, list[str]] = {}
    for c in pod.spec.containers or []:
        lines: list[str] = []
        cs = statuses.get(c.name)
        if started is not None:
            where = f"node {pod.spec.node_name}" + (f" ({status.pod_ip})" if status.pod_ip else "")
            image = f" image {c.image}" if c.image else ""
            lines.append(f"{started} started container {c.name}{image} on {where}")
            lines.append(f"{started} env: {_env_summary(c.env_dict())}")
        terminated = cs.state.terminated if cs is not None else None
        if terminated:
            when = terminated.get("finishedAt") or "-"
            code = terminated.get("exitCode")
            reason = terminated.get("reason")
            how = f"exited with code {code}" if code is not None else "was stopped"
            lines.append(f"{when} {how}" + (f" ({reason})" if reason else ""))
        elif status.phase in ("Succeeded", "Failed"):
            lines.append(f"- {status.phase.lower()}" + (f": {status.reason}" if status.reason else ""))
        out[c.name] = lines
    return out
