"""Durations, one parser for every place that reads one.

`parse_duration` reads plain seconds (`3600`, `1.5`) and Go-style durations, what a Kubernetes
user writes (`40s`, `5m`, `1h30m`, `1.5h`, `300ms`, and `d` for days). Every duration gpuyard
reads goes through it: the fake kubelet's per-pod annotations (`fake.gpuyard.io/duration`,
`fake.gpuyard.io/start-delay`), a job's `gpuyard.io/expected-duration`, and a scenario's
kubelet defaults. A duration is bounded by :data:`MAX_DURATION` (ten years), so that every
timer set from one fits the clock; `fake.gpuyard.io/duration` also accepts `inf` (run forever).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

__all__ = [
    "ANNOTATION_DURATION",
    "ANNOTATION_EXIT_CODE",
    "ANNOTATION_START_DELAY",
    "MAX_DURATION",
    "duration_annotation_problems",
    "parse_duration",
    "parse_pod_duration",
]

# Per-pod overrides of the simulated kubelet's defaults (durations; `inf` runs forever).
ANNOTATION_DURATION = "fake.gpuyard.io/duration"
ANNOTATION_EXIT_CODE = "fake.gpuyard.io/exit-code"
ANNOTATION_START_DELAY = "fake.gpuyard.io/start-delay"

MAX_DURATION = 10 * 365 * 86400.0
"""The longest duration accepted anywhere (ten years, 315,360,000 seconds)."""

_FOREVER = frozenset({"inf", "+inf", "infinity", "+infinity"})
_DURATION_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
ALLOWED = (
    f"seconds (3600) or Go-style units ms s m h d (40s, 5m, 1h30m, 1.5h, 300ms), "
    f"from 0 to {MAX_DURATION:.0f} seconds (10 years)"
)


def parse_duration(value: str | float | int) -> float:
    """Seconds from `3600`, `90s`, `45m`, `2h`, `1h30m`, `1.5h`, `300ms`, `1d`.

    ValueError for anything else, and for a negative, infinite or NaN value or one longer than
    :data:`MAX_DURATION`."""
    if isinstance(value, bool):
        raise ValueError("expected a duration, got a boolean")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            pos, seconds = 0, 0.0
            for match in _DURATION_RE.finditer(text):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
                pos = match.end()
            if pos != len(text) or not text:
                raise ValueError(f"{value!r} is not a duration; allowed: {ALLOWED}") from None
    else:
        raise ValueError(f"expected a duration, got {type(value).__name__}")
    if math.isnan(seconds) or seconds < 0 or seconds > MAX_DURATION:
        raise ValueError(f"{value!r} is out of range; allowed: {ALLOWED}")
    return seconds


def parse_pod_duration(value: str) -> float | None:
    """A `fake.gpuyard.io/duration` value: seconds, or None for `inf` (runs forever)."""
    if value.strip().lower() in _FOREVER:
        return None
    return parse_duration(value)


def duration_annotation_problems(
    annotations: Mapping[str, object],
    prefix: str,
    keys: tuple[str, ...] = (ANNOTATION_DURATION, ANNOTATION_START_DELAY),
) -> list[dict[str, str]]:
    """`[{field, reason}]` for the duration annotations among `keys` that do not parse or are out
    of range; `fake.gpuyard.io/duration` may also be `inf`."""
    problems: list[dict[str, str]] = []
    for key in keys:
        raw = annotations.get(key)
        if raw is None:
            continue
        try:
            if not isinstance(raw, str):
                raise ValueError(f"{raw!r} is not a string; annotations are strings ({ALLOWED})")
            if key == ANNOTATION_DURATION:
                parse_pod_duration(raw)
            else:
                parse_duration(raw)
        except ValueError as exc:
            problems.append({"field": f"{prefix}.annotations.{key}", "reason": str(exc)})
    return problems
