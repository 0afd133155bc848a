"""One duration parser: plain seconds and Go-style durations, bounded to what the clock holds."""

from __future__ import annotations

import asyncio

import pytest

from gpuyard.apis.durations import MAX_DURATION, parse_duration, parse_pod_duration
from gpuyard.devices.scenarios import KubeletDefaults
from gpuyard.state.clock import VirtualClock


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("40s", 40.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("300ms", 0.3),
        ("3600", 3600.0),
        ("2.5", 2.5),
        ("1d", 86400.0),
    ],
)
def test_seconds_and_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["3e11", "-5", "nan", "inf", "forty", "40x", "", "1h 30m", "1e400"])
def test_unreadable_or_out_of_range(text: str) -> None:
    with pytest.raises(ValueError, match=r"allowed|duration"):
        parse_duration(text)


def test_the_bound_is_ten_years() -> None:
    assert parse_duration(str(MAX_DURATION)) == MAX_DURATION
    with pytest.raises(ValueError, match="315360000 seconds"):
        parse_duration(str(MAX_DURATION + 1))


def test_a_pod_may_run_forever() -> None:
    assert parse_pod_duration("inf") is None
    assert parse_pod_duration("2m") == 120.0


def test_scenario_kubelet_defaults_read_go_durations() -> None:
    defaults = KubeletDefaults.model_validate({"startDelay": "500ms", "duration": "1h"})
    assert defaults.start_delay == 0.5 and defaults.duration == 3600.0
    assert KubeletDefaults.model_validate({"duration": "inf"}).duration is None
    with pytest.raises(ValueError, match="not a duration"):
        KubeletDefaults.model_validate({"duration": "forever-ish"})


async def test_the_virtual_clock_never_moves_past_what_a_datetime_holds() -> None:
    clock = VirtualClock()
    sleeper = asyncio.ensure_future(clock.sleep(3e11))
    await clock.advance(1.0)
    assert clock.next_due() is None  # the far-future timer is never due
    await clock.advance(1e15)
    assert clock.utcnow().year <= 9000
    assert not sleeper.done()
    sleeper.cancel()
