"""The opt-in event-loop diagnosis of `gpuyard serve` (`GPUYARD_SLOW_GC_MS`, `GPUYARD_SLOW_CALLBACK_MS`)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from gpuyard.platform.runtime import Component, _diagnose_loop


@pytest.fixture
def restore_gc_callbacks() -> Iterator[None]:
    before = list(gc.callbacks)
    yield
    gc.callbacks[:] = before


def _cyclic_garbage(n: int) -> None:
    """`n` reference cycles that only a collection frees (no automatic one in between)."""
    gc.disable()
    try:
        for _ in range(n):
            a: list[object] = []
            a.append(a)
    finally:
        gc.enable()


async def test_slow_gc_logs_each_collection_over_the_threshold(
    monkeypatch: pytest.MonkeyPatch, restore_gc_callbacks: None
) -> None:
    monkeypatch.setenv("GPUYARD_SLOW_GC_MS", "0")
    comps: list[Component] = []
    _diagnose_loop(comps)
    with capture_logs() as logs:
        _cyclic_garbage(1_000)
        gc.collect(1)
    slow = [e for e in logs if e["event"] == "gc.slow"]
    assert slow and slow[-1]["generation"] == 1
    assert slow[-1]["collected"] >= 1_000
    assert comps == []  # no profiler asked for


async def test_slow_gc_stays_quiet_under_a_high_threshold(
    monkeypatch: pytest.MonkeyPatch, restore_gc_callbacks: None
) -> None:
    monkeypatch.setenv("GPUYARD_SLOW_GC_MS", "60000")
    _diagnose_loop([])
    with capture_logs() as logs:
        _cyclic_garbage(100)
        gc.collect(0)
    assert not [e for e in logs if e["event"] == "gc.slow"]


async def test_slow_callback_switch_turns_on_debug_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    debug, slow = loop.get_debug(), loop.slow_callback_duration
    monkeypatch.setenv("GPUYARD_SLOW_CALLBACK_MS", "25")
    try:
        _diagnose_loop([])
        assert loop.get_debug() and loop.slow_callback_duration == pytest.approx(0.025)
    finally:
        loop.set_debug(debug)
        loop.slow_callback_duration = slow


@pytest.mark.parametrize("value", ["fast", "-5", "nan"])
async def test_a_bad_threshold_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, restore_gc_callbacks: None, value: str
) -> None:
    monkeypatch.setenv("GPUYARD_SLOW_GC_MS", value)
    with pytest.raises(ValueError, match=r"GPUYARD_SLOW_GC_MS.*milliseconds >= 0"):
        _diagnose_loop([])
