"""The docs list what the code has: every metric, every setting, every API route."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

_METRIC = re.compile(r"""(?:Histogram|Gauge|Counter|GaugeMetricFamily)\(\s*["'](gpuyard_\w+)["']""")


def _metric_names() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "gpuyard").rglob("*.py"):
        names.update(_METRIC.findall(path.read_text()))
    return names


def test_every_metric_is_in_operations_doc() -> None:
    names = _metric_names()
    assert "gpuyard_queue_pending_jobs" in names  # the pattern finds scrape-time families too
    doc = (ROOT / "docs" / "operations.md").read_text()
    missing = sorted(n for n in names if f"`{n}" not in doc)
    assert not missing, f"metrics missing from docs/operations.md: {missing}"
    assert "come with the quota engine" not in doc
