"""Cron schedules (robfig/cron's ParseStandard, as KubeDL reads them), the due run, and the Cron
document's checks: every problem names its field."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuyard.apis.crons import MAX_CRON_NAME, cron_for_job, cron_job_name, parse_cron
from gpuyard.apis.cronschedules import cron_policy_problems, parse_schedule
from gpuyard.apis.jobs import JobValidationError, parse_job

T0 = datetime(2026, 3, 2, 10, 0, 30, tzinfo=UTC)  # a Monday


@pytest.mark.parametrize(
    ("text", "after", "expected"),
    [
        ("* * * * *", T0, datetime(2026, 3, 2, 10, 1, tzinfo=UTC)),
        ("*/15 * * * *", T0, datetime(2026, 3, 2, 10, 15, tzinfo=UTC)),
        ("0 3 * * MON-FRI", T0, datetime(2026, 3, 3, 3, 0, tzinfo=UTC)),
        ("@hourly", T0, datetime(2026, 3, 2, 11, 0, tzinfo=UTC)),
        ("@daily", T0, datetime(2026, 3, 3, 0, 0, tzinfo=UTC)),
        ("@weekly", T0, datetime(2026, 3, 8, 0, 0, tzinfo=UTC)),
        ("@monthly", T0, datetime(2026, 4, 1, 0, 0, tzinfo=UTC)),
        ("@yearly", T0, datetime(2027, 1, 1, 0, 0, tzinfo=UTC)),
        ("@every 90s", T0, datetime(2026, 3, 2, 10, 2, 0, tzinfo=UTC)),
        ("CRON_TZ=Asia/Shanghai 0 9 * * *", T0, datetime(2026, 3, 3, 1, 0, tzinfo=UTC)),
        ("TZ=Europe/Berlin 30 10 * * *", T0, datetime(2026, 3, 3, 9, 30, tzinfo=UTC)),
    ],
)
def test_next_schedule_time(text: str, after: datetime, expected: datetime) -> None:
    assert parse_schedule(text).next_after(after) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "required"),
        ("* * * *", "has 4 fields"),
        ("0 */5 * * * *", "has 6 fields"),
        ("61 * * * *", "not a valid schedule"),
        ("* * * * FUNDAY", "not a valid schedule"),
        ("0 0 30 2 *", "not a valid schedule"),
        ("@sometimes", "unknown descriptor"),
        ("@every soon", "not a duration"),
        ("@every 0s", "at least 1s"),
        ("CRON_TZ=Mars/Olympus * * * * *", "unknown time zone"),
    ],
)
def test_a_bad_schedule_says_what_is_allowed(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_schedule(text)


def test_the_due_run_is_the_most_recent_missed_one_not_each_of_them() -> None:
    every_minute = parse_schedule("* * * * *")
    since = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
    assert every_minute.latest_due(since=since, now=datetime(2026, 3, 2, 10, 0, 59, tzinfo=UTC)) == (None, 0)
    due, missed = every_minute.latest_due(since=since, now=datetime(2026, 3, 2, 10, 5, 10, tzinfo=UTC))
    assert (due, missed) == (datetime(2026, 3, 2, 10, 5, tzinfo=UTC), 5)
    at = datetime(2026, 3, 2, 10, 7, tzinfo=UTC)
    assert every_minute.latest_due(since=since, now=at)[0] == at  # a run due exactly now is due


def test_policy_problems_name_each_field() -> None:
    found = cron_policy_problems(
        {"schedule": "every day", "concurrencyPolicy": "Sometimes", "historyLimit": -1, "suspend": "maybe"},
        field="spec.cronPolicy",
    )
    fields = {p["field"]: p["reason"] for p in found}
    assert set(fields) == {
        "spec.cronPolicy.schedule",
        "spec.cronPolicy.concurrencyPolicy",
        "spec.cronPolicy.historyLimit",
        "spec.cronPolicy.suspend",
    }
    assert "Allow, Forbid, Replace" in fields["spec.cronPolicy.concurrencyPolicy"]
    assert cron_policy_problems({}, field="spec")[0] == {
        "field": "spec.schedule",
        "reason": cron_policy_problems({}, field="spec")[0]["reason"],
    }
    assert cron_policy_problems({"schedule": "@daily", "concurrencyPolicy": "Forbid"}, field="spec") == []


def _cron(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps.kubedl.io/v1alpha1",
        "kind": "Cron",
        "metadata": {"name": "nightly"},
        "spec": {
            "schedule": "0 2 * * *",
            "template": {
                "apiVersion": "training.kubedl.io/v1alpha1",
                "kind": "TFJob",
                "workload": {
                    "spec": {
                        "tfReplicaSpecs": {
                            "Worker": {
                                "replicas": 1,
                                "template": {"spec": {"containers": [{"name": "tensorflow", "image": "tf"}]}},
                            }
                        }
                    }
                },
            },
            **spec,
        },
    }


def test_a_good_cron_parses_into_the_default_namespace() -> None:
    cron, problems = parse_cron(_cron(concurrencyPolicy="Replace", historyLimit=3))
    assert problems == [] and cron is not None
    assert (cron.metadata.namespace, cron.spec.policy, cron.spec.history_limit) == ("default", "Replace", 3)


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"schedule": "* * *"}, "spec.schedule", "has 3 fields"),
        ({"concurrencyPolicy": "Never"}, "spec.concurrencyPolicy", "allowed: Allow, Forbid, Replace"),
        (
            {"template": {"apiVersion": "apps/v1", "kind": "Deployment", "workload": {}}},
            "spec.template.kind",
            "not a job kind",
        ),
        (
            {"template": {"apiVersion": "kubeflow.org/v1", "kind": "MarsJob", "workload": {}}},
            "spec.template.apiVersion",
            "not an apiVersion of MarsJob",
        ),
        (
            {"template": {"apiVersion": "training.kubedl.io/v1alpha1", "kind": "TFJob"}},
            "spec.template.workload",
            "required",
        ),
        (
            {
                "template": {
                    "apiVersion": "training.kubedl.io/v1alpha1",
                    "kind": "TFJob",
                    "workload": {"spec": {}},
                }
            },
            "spec.template.workload.spec.tfReplicaSpecs",
            "at least one replica type",
        ),
    ],
)
def test_a_bad_cron_names_the_field(change: dict[str, Any], field: str, says: str) -> None:
    cron, problems = parse_cron(_cron(**change), prefix="documents[0].")
    assert cron is None
    reasons = {p["field"]: p["reason"] for p in problems}
    assert says in reasons[f"documents[0].{field}"], problems


def test_a_cron_name_leaves_room_for_the_schedule_time() -> None:
    doc = _cron()
    doc["metadata"]["name"] = "c" * (MAX_CRON_NAME + 1)
    _, problems = parse_cron(doc)
    assert problems[0]["field"] == "metadata.name" and f"at most {MAX_CRON_NAME}" in problems[0]["reason"]
    assert len(cron_job_name("c" * MAX_CRON_NAME, datetime(2286, 1, 1, tzinfo=UTC))) <= 52


def test_a_job_with_a_bad_cron_policy_is_refused_naming_it() -> None:
    doc: dict[str, Any] = _cron()["spec"]["template"]["workload"]
    doc = {"apiVersion": "training.kubedl.io/v1alpha1", "kind": "TFJob", "metadata": {"name": "j"}, **doc}
    doc["spec"] = {**doc["spec"], "cronPolicy": {"schedule": "sometimes"}}
    with pytest.raises(JobValidationError) as info:
        parse_job(doc)
    assert [d["field"] for d in info.value.details] == ["spec.cronPolicy.schedule"]


def test_a_job_with_cron_policy_is_wrapped_as_kubedl_does() -> None:
    doc: dict[str, Any] = _cron()["spec"]["template"]["workload"]
    doc = {
        "apiVersion": "training.kubedl.io/v1alpha1",
        "kind": "TFJob",
        "metadata": {"name": "j", "namespace": "team", "labels": {"app": "x"}},
        **doc,
    }
    doc["spec"] = {**doc["spec"], "cronPolicy": {"schedule": "@hourly", "suspend": True}}
    cron = cron_for_job(parse_job(doc))
    assert cron is not None
    assert (cron.metadata.namespace, cron.metadata.name, cron.spec.schedule, cron.spec.suspend) == (
        "team",
        "j",
        "@hourly",
        True,
    )
    workload = cron.spec.template.workload or {}
    assert "cronPolicy" not in workload["spec"] and "name" not in workload["metadata"]
    assert workload["metadata"]["labels"] == {"app": "x"}
    assert (cron.spec.template.api_version, cron.spec.template.kind) == (
        "training.kubedl.io/v1alpha1",
        "TFJob",
    )


def test_the_shipped_sample_is_a_valid_cron() -> None:
    path = Path(__file__).resolve().parents[3] / "configs" / "jobs" / "crons" / "mnist-nightly-cron.yaml"
    cron, problems = parse_cron(yaml.safe_load(path.read_text()))
    assert problems == [] and cron is not None
    assert (cron.spec.policy, cron.spec.history_limit, cron.spec.template.kind) == ("Forbid", 7, "PyTorchJob")
    assert parse_schedule(cron.spec.schedule).next_after(T0) == datetime(2026, 3, 2, 18, 0, tzinfo=UTC)
