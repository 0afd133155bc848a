"""Cron schedules and KubeDL's `cronPolicy`: what a `Cron` (and a job's `spec.cronPolicy`) says about when.

A schedule is read as KubeDL reads it (robfig/cron's `ParseStandard`): five fields (minute, hour,
day of month, month, day of week: `*/5 * * * *`, `0 3 * * 1-5`, names such as `MON` and `JAN`),
or a descriptor (`@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`,
`@hourly`, `@every <duration>`), optionally after `CRON_TZ=<zone>` or `TZ=<zone>` (default UTC).
The five fields are evaluated by croniter. :func:`parse_schedule` refuses anything else with a
reason naming what is allowed; :func:`cron_policy_problems` checks a whole policy, field by field.

Which run is due follows KubeDL's cron controller (`getMostRecentScheduleTime`): the most recent
schedule time after the last scheduled one (or the Cron's creation) that is not later than now;
missed earlier times are not run one by one. Everything here is pure: the controller gives the
times (`controllers/cronrunning.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter  # type: ignore[import-untyped]
from pydantic import Field, ValidationError

from gpuyard.apis.durations import parse_duration
from gpuyard.apis.meta import K8sModel

__all__ = [
    "ALLOWED_SCHEDULES",
    "CONCURRENCY_POLICIES",
    "ConcurrencyPolicy",
    "CronPolicy",
    "Schedule",
    "cron_policy_problems",
    "parse_schedule",
]

ConcurrencyPolicy = Literal["Allow", "Forbid", "Replace"]
CONCURRENCY_POLICIES: tuple[str, ...] = ("Allow", "Forbid", "Replace")
INT32_MAX = 2**31 - 1

_DESCRIPTORS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
ALLOWED_SCHEDULES = (
    "five fields 'minute hour day-of-month month day-of-week' (e.g. '*/5 * * * *', '0 3 * * MON-FRI'), "
    "or @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly, '@every <duration>' "
    "(e.g. '@every 1h30m'), optionally after 'CRON_TZ=<zone> '"
)


class CronPolicy(K8sModel):
    """KubeDL's `CronPolicy` (`spec.cronPolicy` of a job, inlined in a Cron's spec)."""

    schedule: str = Field(description="Cron schedule: five fields or a descriptor (@hourly, @every 1h, ...).")
    concurrency_policy: ConcurrencyPolicy | None = Field(
        default=None,
        description="Allow (default): runs may overlap; Forbid: skip a run while one is active; "
        "Replace: delete the active runs and start the new one.",
    )
    suspend: bool | None = Field(default=None, description="No new runs while true; running ones go on.")
    deadline: datetime | None = Field(default=None, description="No runs are started after this time.")
    history_limit: int | None = Field(
        default=None, ge=0, le=INT32_MAX, description="How many finished runs to keep (status.history)."
    )

    @property
    def policy(self) -> ConcurrencyPolicy:
        return self.concurrency_policy or "Allow"


@dataclass(frozen=True, slots=True)
class Schedule:
    """A parsed schedule: five cron fields or a fixed interval (`@every`), in a time zone."""

    text: str
    fields: str | None  # the five fields (descriptors expanded); None for @every
    every: float | None  # seconds between runs for @every
    zone: tzinfo

    def next_after(self, t: datetime) -> datetime:
        """The first schedule time strictly after `t` (UTC)."""
        if self.every is not None:
            base = t.replace(microsecond=0)
            return (base + timedelta(seconds=self.every)).astimezone(UTC)
        it = croniter(self.fields, t.astimezone(self.zone))
        out: datetime = it.get_next(datetime)
        return _utc(out)

    def latest_due(self, *, since: datetime, now: datetime) -> tuple[datetime | None, int]:
        """(the most recent schedule time in (since, now], how many there are); (None, 0) if none."""
        first = self.next_after(since)
        if first > now:
            return None, 0
        if self.every is not None:
            missed = int((now - first).total_seconds() // self.every)
            return (first + timedelta(seconds=missed * self.every)).astimezone(UTC), missed + 1
        it = croniter(self.fields, (now + timedelta(seconds=1)).astimezone(self.zone))
        latest = _utc(it.get_prev(datetime))
        latest = max(latest, first)
        # count the missed times, for a warning, up to a bound (a wrong clock could make it huge)
        count, t = 1, first
        while count <= 100:
            t = self.next_after(t)
            if t > latest:
                break
            count += 1
        return latest, count


def _utc(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(fold=0)


def parse_schedule(text: Any) -> Schedule:
    """The schedule `text` says; ValueError with a reason naming what is allowed."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"required: {ALLOWED_SCHEDULES}")
    rest = text.strip()
    zone: tzinfo = UTC
    if rest.startswith(("CRON_TZ=", "TZ=")):
        head, _, rest = rest.partition(" ")
        name = head.split("=", 1)[1]
        try:
            zone = ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {name!r}; allowed: an IANA zone such as UTC or Europe/Berlin"
            ) from None
        rest = rest.strip()
    if rest.startswith("@every"):
        value = rest[len("@every") :].strip()
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise ValueError(f"{text!r}: {exc}") from None
        if seconds < 1 or not math.isfinite(seconds):
            raise ValueError(f"{text!r}: @every needs at least 1s")
        return Schedule(text=text, fields=None, every=float(int(seconds)), zone=zone)
    if rest.startswith("@"):
        fields = _DESCRIPTORS.get(rest)
        if fields is None:
            raise ValueError(f"unknown descriptor {rest!r}; allowed: {ALLOWED_SCHEDULES}")
    else:
        fields = " ".join(rest.split())
        if len(fields.split()) != 5:
            raise ValueError(f"{text!r} has {len(fields.split())} fields; allowed: {ALLOWED_SCHEDULES}")
    try:
        schedule = Schedule(text=text, fields=fields, every=None, zone=zone)
        if not croniter.is_valid(fields):
            raise ValueError
        schedule.next_after(datetime(2000, 1, 1, tzinfo=UTC))
    except (ValueError, KeyError, TypeError, ArithmeticError) as exc:
        detail = f" ({exc})" if str(exc) else ""
        raise ValueError(f"{text!r} is not a valid schedule{detail}; allowed: {ALLOWED_SCHEDULES}") from None
    except Exception as exc:  # croniter's own errors (a date that never comes: '0 0 30 2 *')
        raise ValueError(f"{text!r} never matches a date ({exc}); allowed: {ALLOWED_SCHEDULES}") from None
    return schedule


def cron_policy_problems(raw: Any, *, field: str) -> list[dict[str, str]]:
    """422 details (`field`: where the policy is, e.g. `spec.cronPolicy`) for a cron policy."""
    if raw is None:
        return []
    if not isinstance(raw, dict):
        return [{"field": field, "reason": f"expected an object with a schedule, got {type(raw).__name__}"}]
    out: list[dict[str, str]] = []
    try:
        CronPolicy.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            reason = err["msg"]
            if loc == "concurrencyPolicy":
                reason = f"{raw.get('concurrencyPolicy')!r} is not allowed; allowed: {', '.join(CONCURRENCY_POLICIES)}"
            elif loc == "schedule" and err["type"] == "missing":
                reason = f"required: {ALLOWED_SCHEDULES}"
            out.append({"field": f"{field}.{loc}", "reason": reason})
    if "schedule" in raw and not any(p["field"] == f"{field}.schedule" for p in out):
        try:
            parse_schedule(raw["schedule"])
        except ValueError as exc:
            out.append({"field": f"{field}.schedule", "reason": str(exc)})
    return out
