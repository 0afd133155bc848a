"""KubeDL-compatible job metrics, kept by the job operator on the injected registry.

The names are KubeDL's (`pkg/metrics` in alibaba/kubedl), so its Grafana panels and alerts work
unchanged:

* `kubedl_jobs_created`, `kubedl_jobs_deleted`, `kubedl_jobs_successful`, `kubedl_jobs_failed`,
  `kubedl_jobs_restarted` — monotonically increasing counts by `kind`, in lower case as KubeDL's
  `NewJobMetrics` writes it (`tfjob`). They are exposed under these exact names (untyped):
  prometheus_client would append `_total` to a counter, which KubeDL's Go client does not.
* `kubedl_jobs_running`, `kubedl_jobs_pending` — gauges by `kind` (lower case too), from the phase
  the operator last wrote for each job (pending = Created or Queuing).
* `kubedl_jobs_first_pod_launch_delay_seconds`, `kubedl_jobs_all_pods_launch_delay_seconds` —
  histograms by `kind` (as written: `TFJob`, as KubeDL's), `name`, `namespace` and `uid`: from the job's creation
  to its first pod Running, and to every pod Running (or done), observed once per job. A job's
  series are removed when the job leaves the store, so they do not pile up over a long run
  (`sum by (le, kind)` gives KubeDL's per-kind view).

The operator calls :class:`JobMetrics` when it applies a pass (`applying.py`); every call is a
dict update, no I/O. One instance exists per registry (`job_metrics(registry)`), so a second
reconciler on the same registry shares the counts instead of failing to register twice.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Iterator
from datetime import datetime

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["COUNTERS", "DELAY_LABELS", "JobMetrics", "job_metrics"]

COUNTERS = ("created", "deleted", "successful", "failed", "restarted")
PENDING = frozenset({"", "Created", "Queuing"})
DELAY_LABELS = ("kind", "name", "namespace", "uid")  # KubeDL's launch-delay histogram labels
DELAY_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)

JobKey = tuple[str, str]  # namespace, name

_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, JobMetrics] = weakref.WeakKeyDictionary()


class _Collector(Collector):
    def __init__(self, owner: JobMetrics) -> None:
        self._owner = owner

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self._owner.families()


class JobMetrics:
    """Counts and gauges by job kind; see the module docstring for the names."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.counts: dict[str, Counter[str]] = {name: Counter() for name in COUNTERS}
        self.phases: dict[JobKey, tuple[str, str]] = {}  # key -> (kind, phase)
        self._first: set[str] = set()  # job uids whose first-pod delay was observed
        self._all: set[str] = set()
        self._series: dict[JobKey, tuple[str, str, str, str]] = {}  # key -> its histograms' labels
        self.first_pod_delay = Histogram(
            "kubedl_jobs_first_pod_launch_delay_seconds",
            "Seconds from a job's creation to its first pod running.",
            list(DELAY_LABELS),
            registry=registry,
            buckets=DELAY_BUCKETS,
        )
        self.all_pods_delay = Histogram(
            "kubedl_jobs_all_pods_launch_delay_seconds",
            "Seconds from a job's creation to all of its pods running.",
            list(DELAY_LABELS),
            registry=registry,
            buckets=DELAY_BUCKETS,
        )
        registry.register(_Collector(self))

    # --- calls from the operator -------------------------------------------------------------

    def created(self, kind: str) -> None:
        self.counts["created"][kind] += 1

    def track(self, key: JobKey, kind: str, phase: str) -> None:
        """The phase the operator just computed for a job (feeds the running/pending gauges)."""
        self.phases[key] = (kind, phase)

    def transition(self, key: JobKey, kind: str, *, was: str, phase: str) -> None:
        self.phases[key] = (kind, phase)
        if phase == was:
            return
        if phase == "Succeeded":
            self.counts["successful"][kind] += 1
        elif phase == "Failed":
            self.counts["failed"][kind] += 1
        elif phase == "Restarting":
            self.counts["restarted"][kind] += 1

    def pods_running(
        self,
        kind: str,
        uid: str,
        *,
        name: str,
        namespace: str,
        created: datetime | None,
        now: datetime,
        all_pods: bool,
    ) -> None:
        """A pod of the job runs (and, with `all_pods`, all of them): observe each delay once."""
        if created is None:
            return
        delay = max(0.0, (now - created).total_seconds())
        labels = (kind, name, namespace, uid)
        self._series[(namespace, name)] = labels
        if uid not in self._first:
            self._first.add(uid)
            self.first_pod_delay.labels(*labels).observe(delay)
        if all_pods and uid not in self._all:
            self._all.add(uid)
            self.all_pods_delay.labels(*labels).observe(delay)

    def deleted(self, key: JobKey, uid: str | None = None) -> None:
        """The job is gone from the store; counted once for a job this process saw."""
        seen = self.phases.pop(key, None)
        if seen is not None:
            self.counts["deleted"][seen[0]] += 1
        if uid:
            self._first.discard(uid)
            self._all.discard(uid)
        labels = self._series.pop(key, None)
        if labels is not None:
            self._first.discard(labels[3])
            self._all.discard(labels[3])
            for histogram in (self.first_pod_delay, self.all_pods_delay):
                try:
                    histogram.remove(*labels)
                except KeyError:
                    pass  # never observed (the all-pods delay of a job that never fully ran)

    # --- scrape --------------------------------------------------------------------------------

    def families(self) -> Iterator[Metric]:
        for name in COUNTERS:
            family = Metric(f"kubedl_jobs_{name}", f"Jobs {name}, by kind (KubeDL name).", "unknown")
            for kind, n in sorted(self.counts[name].items()):
                family.add_sample(f"kubedl_jobs_{name}", {"kind": kind.lower()}, float(n))
            yield family
        running: Counter[str] = Counter()
        pending: Counter[str] = Counter()
        kinds: set[str] = set()
        for kind, phase in self.phases.values():
            kinds.add(kind)
            if phase == "Running":
                running[kind] += 1
            elif phase in PENDING:
                pending[kind] += 1
        for name, counts in (("running", running), ("pending", pending)):
            gauge = GaugeMetricFamily(f"kubedl_jobs_{name}", f"Jobs {name} now, by kind.", labels=["kind"])
            for kind in sorted(kinds):
                gauge.add_metric([kind.lower()], counts[kind])
            yield gauge


def job_metrics(registry: CollectorRegistry) -> JobMetrics:
    """The one :class:`JobMetrics` of `registry`, created on first use."""
    found = _BY_REGISTRY.get(registry)
    if found is None:
        found = JobMetrics(registry)
        _BY_REGISTRY[registry] = found
    return found
